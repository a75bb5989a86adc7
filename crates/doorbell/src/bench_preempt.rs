//! `doorbell bench preempt`: what preemption costs and buys on the live driver (spec 003).
//!
//! - `preempt_latency_p50_ns_<level>` / `_p99_ns_<level>`: a queue runs command buffers of
//!   four long dispatches (`program::workloads::ROUNDS`) back to back; at a pseudo-random moment the kernel asks the engine
//!   to preempt it, and the latency is from the request to the engine's answer (the queue off
//!   its slot, state saved), on the device clock. One device per compute level:
//!   `dma_buffer`, `dispatch`, `thread_group`, `thread`, `shader`. Each sample then resumes
//!   the queue.
//! - `high_prio_start_p50_ns` / `_p99_ns` (at the finest level) and `..._dma_buffer`: a
//!   high-priority queue's submission of one `TIMESTAMP` until the engine starts it, while
//!   low-priority queues keep every hardware slot busy with long dispatches; beside it
//!   `idle_start_p50_ns`, the same submission on an idle engine (`bench submit`'s `um_p50_ns`,
//!   measured in this run). 50 warm-up samples come first and are dropped.
//! - `preempt_overhead`: the low-priority queues' throughput with a preemption (and resume)
//!   every millisecond, over the same with none (1.0 = free), as wave-instructions the engine
//!   executed per second (a command buffer is milliseconds of work: counting them is too
//!   coarse for a one-second run): five alternating pairs of one-second runs, the median
//!   pair's ratio (`low_prio_cb_per_s` and `low_prio_cb_per_s_preempted` are that pair's
//!   command buffers per second).
//! - `tdr_recover_ns`: a queue runs an endless kernel under `Dispatch` granularity over one
//!   hardware slot, with another process's work queued behind it; the kernel's preemption
//!   request goes unanswered, the TDR timer fires after a short `TdrDelay`, the engine is reset;
//!   from the timer firing (its trace entry) to the other queue's first packet running. Its
//!   results are checked: `others_results_ok`.
//! - `floor_cacheline_rtt_ns`, as in the other benchmarks.

use std::sync::Arc;
use std::time::{Duration, Instant};

use abi::EngineKind;
use abi::Priority;
use abi::port::KernelPort;
use abi::preempt::{ComputeGranularity, PreemptionCaps};
use clap::Args;
use gpu::GpuConfig;
use kernel::trace::Event;
use kernel::{System, SystemConfig, TdrConfig};
use umd::{Buffer, CommandBuffer, Device, Queue, QueueOptions};

use crate::measure::{DeviceKind, cacheline_rtt_ns, latencies, percentiles, progress};
use crate::{CliError, num};

#[derive(Args)]
pub struct PreemptArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Samples per fine level (thread_group, thread, shader) and of the high-priority start
    /// at the finest level, 1 to 100,000; the coarse levels (dispatch, dma_buffer, and the
    /// start at dma_buffer) take at most a fifth of them, at least 20 (each waits for a
    /// dispatch or a command buffer to end).
    #[arg(long, default_value_t = 500, value_parser = num::within(1u32, 100_000))]
    pub(crate) samples: u32,
    /// Loop rounds per thread of the long program (1 to 10,000,000): each dispatch is 16
    /// workgroups of 64 threads.
    #[arg(long, default_value_t = 400, value_parser = num::within(1u32, 10_000_000))]
    pub(crate) rounds: u32,
    /// Where the engines run: `virtual` (the default: every measure above), `cuda` (an NVIDIA
    /// GPU: a high-priority queue's start while low-priority dispatches keep every compute
    /// slot busy, beside a high-priority CUDA stream's kernel next to 1 ms blocks on every SM,
    /// in the same run; an error naming what is missing without a GPU or driver) or
    /// `emulated` (the GPU's engine program on the CPU: a check of that path).
    #[arg(long, value_enum, default_value_t = DeviceKind::Virtual)]
    pub(crate) device: DeviceKind,
}

const GROUPS: u32 = 16;
const GROUP: u32 = 64;
const DISPATCHES_PER_CB: usize = 4;
/// Alternating pairs of throughput runs (without, with preemptions) for `preempt_overhead`.
const PAIRS: usize = 5;
/// Start-latency samples taken and dropped before the measured ones.
const WARM_UP: usize = 50;

use program::workloads::rounds_result as expected;

/// A live system whose compute engine preempts at `level`, with `slots` hardware slots.
fn system(level: ComputeGranularity, slots: u32, tdr: TdrConfig) -> Result<System, CliError> {
    system_on(None, level, slots, tdr)
}

/// The same, its slots on `hardware` when given (`bench … --device cuda|emulated`).
pub(crate) fn system_on(
    hardware: Option<gpu::hw::HardwareFactory>,
    level: ComputeGranularity,
    slots: u32,
    tdr: TdrConfig,
) -> Result<System, CliError> {
    let gpu = GpuConfig {
        hardware,
        idle_period: Duration::from_secs(3600),
        hw_slots: slots,
        preemption: PreemptionCaps { compute: level, ..PreemptionCaps::default() },
        ..GpuConfig::default()
    };
    Ok(System::live(SystemConfig { gpu, tdr, ..Default::default() })?)
}

/// A process keeping a queue busy with command buffers of long dispatches (here, and in
/// `bench preempt --device cuda`).
pub(crate) struct Spinner {
    port: Arc<dyn KernelPort>,
    _dev: Device,
    _ctx: umd::Context,
    q: Queue,
    out: Buffer,
    cb: CommandBuffer,
    rounds: u32,
    groups: u32,
    last: u64,
    _kernel: Buffer,
    _args: Buffer,
}

impl Spinner {
    fn new(sys: &System, priority: Priority, rounds: u32) -> Result<Spinner, CliError> {
        Spinner::shaped(sys, priority, rounds, GROUPS, DISPATCHES_PER_CB)
    }

    /// A spinner whose command buffers hold `dispatches` dispatches of `groups` workgroups
    /// of 64 threads, each thread running `rounds` rounds.
    pub(crate) fn shaped(
        sys: &System,
        priority: Priority,
        rounds: u32,
        groups: u32,
        dispatches: usize,
    ) -> Result<Spinner, CliError> {
        let port: Arc<dyn KernelPort> = sys.open_process()?;
        let dev = Device::open(port.clone())?;
        let ctx = dev.create_context(dev.engine(EngineKind::Compute)?)?;
        let mut q = ctx.create_queue(QueueOptions { priority, ..QueueOptions::user_mode() })?;
        q.set_spin(0);
        let kernel = dev.upload(&program::workloads::rounds().to_bytes())?;
        let out = dev.allocate((groups * GROUP) as u64 * 4)?;
        let args = dev.upload(&program::workloads::rounds_args(out.va(), rounds))?;
        let mut cb = CommandBuffer::new();
        for _ in 0..dispatches {
            cb.dispatch(kernel.va(), [groups, 1, 1], [GROUP, 1, 1], args.va());
        }
        Ok(Spinner { port, _dev: dev, _ctx: ctx, q, out, cb, rounds, groups, last: 0, _kernel: kernel, _args: args })
    }

    /// Keeps two command buffers outstanding.
    pub(crate) fn top_up(&mut self) -> Result<(), CliError> {
        while self.last.saturating_sub(self.q.completed()) < 2 {
            self.last = self.q.submit(&self.cb)?;
        }
        Ok(())
    }

    /// Command buffers completed.
    fn completed(&self) -> u64 {
        self.q.completed()
    }

    /// Waits for everything submitted and checks the results.
    pub(crate) fn finish(&self) -> Result<bool, CliError> {
        self.q.wait(self.last, Some(Duration::from_secs(120)))?;
        let want = expected(self.rounds);
        Ok((0..self.groups * GROUP).all(|i| self.out.read_u32(i as u64 * 4).is_ok_and(|x| x == want)))
    }
}

/// Pseudo-random spins (xorshift; the same sequence every run).
pub(crate) struct Gap(pub(crate) u64);

impl Gap {
    /// Spins for up to `max`.
    fn spin(&mut self, max: Duration) {
        self.spin_between(Duration::ZERO, max);
    }

    /// Spins for `min` plus up to `spread`.
    pub(crate) fn spin_between(&mut self, min: Duration, spread: Duration) {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        let until = Instant::now() + min + Duration::from_nanos(self.0 % spread.as_nanos().max(1) as u64);
        while Instant::now() < until {
            std::hint::spin_loop();
        }
    }
}

/// Waits for the answer to `ticket` (its latency, ns, on the device clock: how often this
/// looks does not change it).
fn await_answer(sys: &System, ticket: u64) -> Result<u64, CliError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(ns) = sys.preempt_answer(ticket) {
            return Ok(ns);
        }
        if Instant::now() > deadline {
            return Err(CliError::Check(format!("preemption request {ticket} unanswered after 10 s")));
        }
        // Looking takes the kernel's lock, which the firmware thread needs to deliver the
        // answer: a tight loop here would slow the very thing it waits for (and the engine's
        // other work). A few microseconds between looks leave the lock free.
        let pause = Instant::now() + Duration::from_micros(5);
        while Instant::now() < pause {
            std::hint::spin_loop();
        }
        std::thread::yield_now();
    }
}

/// Preemption latencies at `level`: `samples` requests against a busy queue.
fn preempt_latencies(level: ComputeGranularity, samples: usize, rounds: u32) -> Result<Vec<u64>, CliError> {
    let sys = system(level, 8, TdrConfig::default())?;
    let mut s = Spinner::new(&sys, Priority::Normal, rounds)?;
    let pid = s.port.process();
    let mut gap = Gap(0x9e37_79b9_7f4a_7c15);
    let mut out = Vec::with_capacity(samples);
    for _ in 0..samples {
        s.top_up()?;
        // Back in its slot and running (a queue without a slot is answered at once, which is
        // not what is measured), then a pseudo-random moment into its work.
        let deadline = Instant::now() + Duration::from_secs(10);
        while s.q.status()?.state != abi::QueueState::Mapped {
            if Instant::now() > deadline {
                return Err(CliError::Check(format!("{level}: the resumed queue was never mapped again")));
            }
            std::thread::yield_now();
        }
        gap.spin(Duration::from_micros(300));
        let ticket = sys.preempt_queue(pid, s.q.handle())?;
        out.push(await_answer(&sys, ticket)?);
        sys.resume_queue(pid, s.q.handle())?;
    }
    if !s.finish()? {
        return Err(CliError::Check(format!("{level}: a preempted dispatch resumed with wrong results")));
    }
    Ok(out)
}

/// Start latencies of a high-priority queue's `TIMESTAMP`s while eight low-priority queues
/// keep the engine's eight slots busy.
fn high_prio_start(level: ComputeGranularity, samples: usize, rounds: u32) -> Result<Vec<u64>, CliError> {
    let sys = system(level, 8, TdrConfig::default())?;
    let mut lows = (0..8).map(|_| Spinner::new(&sys, Priority::Low, rounds)).collect::<Result<Vec<_>, _>>()?;
    let port: Arc<dyn KernelPort> = sys.open_process()?;
    let dev = Device::open(port)?;
    let ctx = dev.create_context(dev.engine(EngineKind::Compute)?)?;
    let mut hq = ctx.create_queue(QueueOptions { priority: Priority::High, ..QueueOptions::user_mode() })?;
    hq.set_spin(u32::MAX);
    let buf = dev.allocate(1 << 16)?;
    let mut gap = Gap(0x2545_f491_4f6c_dd1d);
    let mut top_up = |gap: &mut Gap| -> Result<(), CliError> {
        for l in &mut lows {
            l.top_up()?;
        }
        gap.spin(Duration::from_micros(200));
        Ok(())
    };
    top_up(&mut gap)?;
    std::thread::sleep(Duration::from_millis(5));
    // Warm-up, as in `bench submit`: the first passes over a fresh ring and timestamp buffer
    // touch new pages.
    latencies(&sys, &mut hq, &buf, WARM_UP, || top_up(&mut gap))?;
    let out = latencies(&sys, &mut hq, &buf, samples, || top_up(&mut gap))?;
    for l in &lows {
        if !l.finish()? {
            return Err(CliError::Check("a low-priority queue's results are wrong".into()));
        }
    }
    Ok(out)
}

/// Low-priority throughput over `window` with a preemption and resume of each busy queue every
/// `every` (`None`: never): command buffers completed per second, and wave-instructions the
/// engine executed per second (the finer measure: a command buffer is milliseconds of work).
fn throughput(every: Option<Duration>, window: Duration, rounds: u32) -> Result<(f64, f64), CliError> {
    let sys = system(ComputeGranularity::Shader, 8, TdrConfig::default())?;
    let mut lows = (0..2).map(|_| Spinner::new(&sys, Priority::Normal, rounds)).collect::<Result<Vec<_>, _>>()?;
    for l in &mut lows {
        l.top_up()?;
    }
    let before: u64 = lows.iter().map(Spinner::completed).sum();
    let instructions = || sys.with_gpu(|g| g.compute_stats().instructions);
    let i0 = instructions();
    let start = Instant::now();
    let mut next = start;
    let mut k = 0usize;
    while start.elapsed() < window {
        for l in &mut lows {
            l.top_up()?;
        }
        if let Some(every) = every
            && Instant::now() >= next
        {
            let l = &lows[k % lows.len()];
            k += 1;
            let ticket = sys.preempt_queue(l.port.process(), l.q.handle())?;
            await_answer(&sys, ticket)?;
            sys.resume_queue(l.port.process(), l.q.handle())?;
            next += every;
        }
        std::thread::yield_now();
    }
    let done: u64 = lows.iter().map(Spinner::completed).sum::<u64>() - before;
    let executed = instructions() - i0;
    let el = start.elapsed();
    for l in &lows {
        if !l.finish()? {
            return Err(CliError::Check("throughput run: wrong results after preemptions".into()));
        }
    }
    Ok((done as f64 / el.as_secs_f64(), executed as f64 / el.as_secs_f64()))
}

/// Timeout detection and recovery on the live driver: see the module docs. Returns the
/// recovery time (ns) and whether the other queue's results are right.
fn tdr_recover() -> Result<(u64, bool), CliError> {
    let tdr = TdrConfig { delay: Duration::from_millis(50), ..TdrConfig::default() };
    let sys = system(ComputeGranularity::Dispatch, 1, tdr)?;
    // The hog: an endless kernel.
    let port: Arc<dyn KernelPort> = sys.open_process()?;
    let dev = Device::open(port.clone())?;
    let ctx = dev.create_context(dev.engine(EngineKind::Compute)?)?;
    let mut hog = ctx.create_queue(QueueOptions::user_mode())?;
    let spin = dev.upload(&program::workloads::forever().to_bytes())?;
    let mut cb = CommandBuffer::new();
    cb.dispatch(spin.va(), [1, 1, 1], [64, 1, 1], spin.va());
    hog.submit(&cb)?;
    // Once it runs (a queue that has not started stops at once, and that is not a hang).
    let deadline = Instant::now() + Duration::from_secs(10);
    while sys.with_gpu(|g| g.compute_stats().instructions) == 0 {
        if Instant::now() > deadline {
            return Err(CliError::Check("the endless kernel never started".into()));
        }
        std::thread::yield_now();
    }
    // The other process: its work waits behind the hog for the one slot.
    let oport: Arc<dyn KernelPort> = sys.open_process()?;
    let odev = Device::open(oport)?;
    let octx = odev.create_context(odev.engine(EngineKind::Compute)?)?;
    let mut other = octx.create_queue(QueueOptions::user_mode())?;
    other.set_spin(0);
    let obuf = odev.allocate(1 << 16)?;
    let mut cb = CommandBuffer::new();
    cb.timestamp(obuf.va());
    for i in 0..64u64 {
        cb.write_u32(obuf.va() + 64 + i * 4, i as u32 + 1);
    }
    let v = other.submit(&cb)?;
    let ticket = sys.preempt_queue(port.process(), hog.handle())?;
    other.wait(v, Some(Duration::from_secs(30)))?;
    if sys.preempt_answer(ticket).is_some() {
        return Err(CliError::Check("the endless kernel answered a Dispatch-level preemption".into()));
    }
    let fired = sys
        .trace()
        .0
        .into_iter()
        .find(|e| matches!(e.event, Event::TdrTimeout { .. }))
        .ok_or_else(|| CliError::Check("no TDR timeout in the trace".into()))?
        .time;
    let started = obuf.read_u64(0)?;
    let ok = (0..64u64).all(|i| obuf.read_u32(64 + i * 4).is_ok_and(|x| x == i as u32 + 1));
    let hung = hog.status()?.state == abi::QueueState::Hung;
    Ok((started.saturating_sub(fired.as_nanos()), ok && hung))
}

/// `bench preempt` on the virtual device (`bench::run` sends `--device cuda|emulated` to
/// `bench_cuda::preempt`).
pub fn run(a: PreemptArgs) -> Result<(), CliError> {
    let json = a.json;
    let fine = a.samples as usize;
    let coarse = (fine / 5).max(20).min(fine);
    progress(json, "measuring the floor: cache-line round trip between two threads");
    let floor = cacheline_rtt_ns();

    progress(json, "idle start latency (bench submit's um_p50)");
    let idle_p50 = {
        let sys = system(ComputeGranularity::Shader, 8, TdrConfig::default())?;
        let port: Arc<dyn KernelPort> = sys.open_process()?;
        let dev = Device::open(port)?;
        let ctx = dev.create_context(dev.engine(EngineKind::Compute)?)?;
        let mut q = ctx.create_queue(QueueOptions::user_mode())?;
        q.set_spin(u32::MAX);
        let buf = dev.allocate(1 << 16)?;
        latencies(&sys, &mut q, &buf, 500, || Ok(()))?;
        percentiles(latencies(&sys, &mut q, &buf, fine.max(1000), || Ok(()))?).0
    };

    let levels = [
        ComputeGranularity::DmaBuffer,
        ComputeGranularity::Dispatch,
        ComputeGranularity::ThreadGroup,
        ComputeGranularity::Thread,
        ComputeGranularity::Shader,
    ];
    let mut lat = serde_json::Map::new();
    let mut rows = Vec::new();
    for level in levels {
        progress(json, &format!("preemption latency at {level}"));
        let n = if level <= ComputeGranularity::Dispatch { coarse } else { fine };
        let (p50, p99) = percentiles(preempt_latencies(level, n, a.rounds)?);
        lat.insert(format!("preempt_latency_p50_ns_{}", level.name()), p50.into());
        lat.insert(format!("preempt_latency_p99_ns_{}", level.name()), p99.into());
        rows.push((level, p50, p99));
    }

    progress(json, "high-priority start latency, every slot busy, finest level");
    let (hp50, hp99) = percentiles(high_prio_start(ComputeGranularity::Shader, fine, a.rounds)?);
    progress(json, "high-priority start latency, every slot busy, dma_buffer level");
    let (hd50, hd99) = percentiles(high_prio_start(ComputeGranularity::DmaBuffer, coarse, a.rounds)?);

    progress(json, "low-priority throughput without and with a preemption every millisecond");
    // Alternating pairs of runs, so that a slow stretch of the machine does not land on one
    // side only; the overhead is the median pair's ratio, the throughputs the medians.
    let window = Duration::from_secs(1);
    let mut pairs = Vec::new();
    for _ in 0..PAIRS {
        let (base, base_i) = throughput(None, window, a.rounds)?;
        let (with, with_i) = throughput(Some(Duration::from_millis(1)), window, a.rounds)?;
        pairs.push((with_i / base_i.max(f64::MIN_POSITIVE), base, with));
    }
    pairs.sort_by(|x, y| x.0.total_cmp(&y.0));
    let (overhead, base, with) = pairs[PAIRS / 2];

    progress(json, "timeout detection and recovery");
    let (tdr_ns, others_ok) = tdr_recover()?;

    let floor_ns = floor.round() as u64;
    if json {
        let mut o = lat;
        o.insert("high_prio_start_p50_ns".into(), hp50.into());
        o.insert("high_prio_start_p99_ns".into(), hp99.into());
        o.insert("high_prio_start_p50_ns_dma_buffer".into(), hd50.into());
        o.insert("high_prio_start_p99_ns_dma_buffer".into(), hd99.into());
        o.insert("idle_start_p50_ns".into(), idle_p50.into());
        o.insert("preempt_overhead".into(), ((overhead * 1000.0).round() / 1000.0).into());
        o.insert("low_prio_cb_per_s".into(), (base.round() as u64).into());
        o.insert("low_prio_cb_per_s_preempted".into(), (with.round() as u64).into());
        o.insert("tdr_recover_ns".into(), tdr_ns.into());
        o.insert("others_results_ok".into(), others_ok.into());
        o.insert("floor_cacheline_rtt_ns".into(), floor_ns.into());
        o.insert("samples".into(), a.samples.into());
        o.insert("rounds".into(), a.rounds.into());
        outln!("{}", serde_json::Value::Object(o));
    } else {
        outln!(
            "doorbell bench preempt ({} samples at fine levels, {coarse} at coarse ones; {} rounds a thread)",
            a.samples,
            a.rounds
        );
        let t = crate::measure::FloorTable::new(46, floor);
        for (level, p50, p99) in rows {
            t.ns(&format!("preempt latency p50, {level}"), p50);
            t.ns(&format!("preempt latency p99, {level}"), p99);
        }
        t.ns("idle start p50", idle_p50);
        t.ns("high-priority start p50, slots busy (shader)", hp50);
        t.ns("high-priority start p99, slots busy (shader)", hp99);
        t.ns("high-priority start p50 (dma_buffer)", hd50);
        t.ns("high-priority start p99 (dma_buffer)", hd99);
        outln!("{:<46} {:>12.3}", "throughput with 1 preemption/ms vs none", overhead);
        outln!("{:<46} {:>9} ns", "TDR: timeout to the others running again", tdr_ns);
        outln!("{:<46} {:>12}", "others' results after the reset", if others_ok { "ok" } else { "WRONG" });
    }
    Ok(())
}
