//! A client embedded on the deterministic driver: the same stack on virtual time, stepped by
//! this thread. Every run prints the same device times: what tests and the simulator rely on.
//! A high-priority queue overtakes a busy normal-priority one, and the device clock shows it.
//!
//! `cargo run --release -p umd --example embedded_sim`
//!
//! Crates: `umd` and `kernel`.

use std::time::Duration;

use kernel::{System, SystemConfig};
use umd::{CommandBuffer, Device, EngineKind, Priority, QueueOptions};

const T: Option<Duration> = Some(Duration::from_secs(1));

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let sys = System::sim(SystemConfig::default())?;
    let dev = Device::open(sys.open_process()?)?;
    let ctx = dev.create_context(dev.engine(EngineKind::Compute)?)?;
    let mut bulk = ctx.create_queue(QueueOptions::user_mode())?;
    let mut urgent = ctx.create_queue(QueueOptions { priority: Priority::High, ..QueueOptions::user_mode() })?;
    let stamps = dev.allocate(4096)?;

    // 20 command buffers of 100 µs of device work each on the normal queue…
    let mut last = 0;
    for _ in 0..20 {
        let mut cb = CommandBuffer::new();
        cb.synthetic(100_000);
        last = bulk.submit(&cb)?;
    }
    // Let 250 µs of device time pass: the bulk queue is busy (its third buffer is running)…
    sys.advance(Duration::from_micros(250));
    // …when one urgent timestamp comes.
    let submitted = sys.now().as_nanos();
    let mut cb = CommandBuffer::new();
    cb.timestamp(stamps.va());
    let u = urgent.submit(&cb)?;
    urgent.wait(u, T)?;
    let started = stamps.read_u64(0)?;
    bulk.wait(last, T)?;
    let all_done = sys.now().as_nanos();
    println!("device time at submit: {submitted} ns");
    println!("urgent timestamp ran at {started} ns ({} ns after submit)", started - submitted);
    println!("bulk work done at {all_done} ns (2 ms of work, 1.75 ms of it still queued when the urgent one came)");
    if started - submitted >= 1_000_000 {
        return Err("the high-priority queue waited behind all the bulk work".into());
    }
    println!("embedded (deterministic driver): ok; run it again, the times are the same");
    Ok(())
}
