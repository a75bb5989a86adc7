//! The submit benchmark's throughput loop alone (tiny command buffers: one `WRITE_DATA` and
//! the progress fence, back to back on one user-mode queue), for profilers:
//! `cargo run --release -p umd --example profile_submit -- [sim|live|drain] [COUNT]`.
//!
//! - `sim` (the default): the deterministic driver, whose device runs when the client waits
//!   (here, when the ring is full). Every instruction is the client's submit, the firmware's
//!   latch, fetch, decode and execution, or the driver between them, on one thread: what
//!   `valgrind --tool=callgrind` counts per submission.
//! - `live`: the live driver, its firmware thread polling beside this one, as
//!   `doorbell bench submit` runs it; prints the rate (wall clock: indicative only).
//! - `drain`: each side alone, on the live driver: the context is suspended while the client
//!   fills a 16 MiB ring (at most 400,000 submissions: the client's rate with no engine
//!   reading behind it), then resumed, and the engine drains it (the firmware's rate).
use std::time::{Duration, Instant};

use abi::EngineKind;
use umd::{CommandBuffer, Device, QueueOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "sim".into());
    let count: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(1_000_000);
    let gpu = gpu::GpuConfig { idle_period: Duration::from_secs(3600), ..Default::default() };
    let cfg = kernel::SystemConfig { gpu, ..Default::default() };
    let sys = match mode.as_str() {
        "sim" => kernel::System::sim(cfg)?,
        "live" | "drain" => kernel::System::live(cfg)?,
        m => return Err(format!("mode {m}: expected sim, live or drain").into()),
    };
    let port = sys.open_process()?;
    let dev = Device::open(port.clone())?;
    let ctx = dev.create_context(dev.engine(EngineKind::Compute)?)?;
    let buf = dev.allocate(4096)?;
    if mode == "drain" {
        let count = count.min(400_000);
        let mut q = ctx.create_queue(QueueOptions { ring_bytes: 16 << 20, ..QueueOptions::user_mode() })?;
        q.set_spin(u32::MAX);
        let pid = abi::port::KernelPort::process(&*port);
        sys.suspend_context(pid, ctx.handle())?;
        let mut cb = CommandBuffer::new();
        let start = Instant::now();
        for i in 0..count {
            cb.clear();
            cb.write_u32(buf.va(), i as u32);
            q.submit(&cb)?;
        }
        let client = start.elapsed();
        let start = Instant::now();
        sys.resume_context(pid, ctx.handle())?;
        q.finish(Some(Duration::from_secs(60)))?;
        let engine = start.elapsed();
        assert_eq!(buf.read_u32(0)?, (count - 1) as u32, "the last WRITE_DATA is visible");
        let rate = |d: Duration| count as f64 / d.as_secs_f64();
        println!("drain: {count} submissions: client alone {:.0}/s, engine alone {:.0}/s", rate(client), rate(engine));
        return Ok(());
    }
    let mut q = ctx.create_queue(QueueOptions { ring_bytes: 1 << 20, ..QueueOptions::user_mode() })?;
    // Live: spin on memory, as the benchmark does. Deterministic: a spin changes nothing there
    // (the device runs in the kernel wait).
    q.set_spin(if mode == "live" { u32::MAX } else { 0 });
    let mut cb = CommandBuffer::new();
    let start = Instant::now();
    let mut last = 0;
    for i in 0..count {
        cb.clear();
        cb.write_u32(buf.va(), i as u32);
        last = q.submit(&cb)?;
    }
    q.wait(last, Some(Duration::from_secs(60)))?;
    let el = start.elapsed();
    assert_eq!(buf.read_u32(0)?, (count - 1) as u32, "the last WRITE_DATA is visible");
    println!("{mode}: {count} submissions in {:.3} s ({:.0}/s)", el.as_secs_f64(), count as f64 / el.as_secs_f64());
    Ok(())
}
