//! `bench preempt`'s throughput run alone, for profilers: two normal-priority queues keep a
//! compute engine busy with long dispatches (instruction-level preemption, eight slots), and
//! every `INTERVAL_US` microseconds one of them is preempted, its answer awaited, and resumed.
//! `cargo run --release -p umd --example profile_preempt -- [INTERVAL_US|none] [SECONDS]`.
//!
//! Prints the engine's wave-instructions per second, and with preemptions what a preemption
//! cost on this thread: the request call, the wait for the answer (polled, as the benchmark
//! does) and the resume call. Run it once with `none` and once with an interval: the ratio of
//! the two rates is `preempt_overhead`; `perf record` on the second shows where the engine's
//! time goes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use abi::EngineKind;
use abi::port::KernelPort;
use abi::preempt::{ComputeGranularity, PreemptionCaps};
use umd::{CommandBuffer, Device, QueueOptions};

const GROUPS: u32 = 16;
const GROUP: u32 = 64;
const ROUNDS: u32 = 400;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let every = match args.next().as_deref() {
        None | Some("none") => None,
        Some(us) => Some(Duration::from_micros(us.parse()?)),
    };
    let seconds: f64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(3.0);
    let gpu = gpu::GpuConfig {
        idle_period: Duration::from_secs(3600),
        preemption: PreemptionCaps { compute: ComputeGranularity::Shader, ..PreemptionCaps::default() },
        ..Default::default()
    };
    let sys = kernel::System::live(kernel::SystemConfig { gpu, ..Default::default() })?;
    let mut lows = Vec::new();
    for _ in 0..2 {
        let port: Arc<dyn KernelPort> = sys.open_process()?;
        let dev = Device::open(port.clone())?;
        let ctx = dev.create_context(dev.engine(EngineKind::Compute)?)?;
        let mut q = ctx.create_queue(QueueOptions::user_mode())?;
        q.set_spin(0);
        let kernel = dev.upload(&umd::workloads::rounds().to_bytes())?;
        let out = dev.allocate((GROUPS * GROUP) as u64 * 4)?;
        let args = dev.upload(&umd::workloads::rounds_args(out.va(), ROUNDS))?;
        let mut cb = CommandBuffer::new();
        for _ in 0..4 {
            cb.dispatch(kernel.va(), [GROUPS, 1, 1], [GROUP, 1, 1], args.va());
        }
        lows.push((port, dev, ctx, q, cb, 0u64, kernel, out, args));
    }
    let instructions = || sys.with_gpu(|g| g.compute_stats().instructions);
    let (i0, start) = (instructions(), Instant::now());
    let (mut next, mut k) = (start, 0usize);
    let mut spent = [Duration::ZERO; 3];
    while start.elapsed().as_secs_f64() < seconds {
        for l in &mut lows {
            while l.5.saturating_sub(l.3.completed()) < 2 {
                l.5 = l.3.submit(&l.4)?;
            }
        }
        if let Some(every) = every
            && Instant::now() >= next
        {
            let l = &lows[k % lows.len()];
            k += 1;
            let t0 = Instant::now();
            let ticket = sys.preempt_queue(l.0.process(), l.3.handle())?;
            let t1 = Instant::now();
            while sys.preempt_answer(ticket).is_none() {
                let pause = Instant::now() + Duration::from_micros(5);
                while Instant::now() < pause {
                    std::hint::spin_loop();
                }
                std::thread::yield_now();
            }
            let t2 = Instant::now();
            sys.resume_queue(l.0.process(), l.3.handle())?;
            spent[0] += t1 - t0;
            spent[1] += t2 - t1;
            spent[2] += t2.elapsed();
            next += every;
        }
        std::thread::yield_now();
    }
    let rate = (instructions() - i0) as f64 / start.elapsed().as_secs_f64();
    println!("{:.0} wave-instructions/s", rate);
    if k > 0 {
        let per = |d: Duration| d.as_nanos() as u64 / k as u64;
        println!(
            "{k} preemptions: request {} ns, answer seen after {} ns, resume {} ns (means)",
            per(spent[0]),
            per(spent[1]),
            per(spent[2])
        );
    }
    let want = umd::workloads::rounds_result(ROUNDS);
    for l in &lows {
        l.3.wait(l.5, Some(Duration::from_secs(60)))?;
        assert!((0..GROUPS * GROUP).all(|i| l.7.read_u32(i as u64 * 4).is_ok_and(|x| x == want)), "results");
    }
    Ok(())
}
