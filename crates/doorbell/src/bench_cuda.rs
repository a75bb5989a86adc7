//! `doorbell bench submit --device cuda` and `bench preempt --device cuda`: doorbell's
//! submission model on a real NVIDIA GPU (the `cuda` crate: the hardware queue slots and
//! engines as a persistent GPU program, driven by the unchanged UMD, kernel and firmware),
//! beside CUDA's own path measured in the same run on the same GPU.
//!
//! `bench submit --device cuda`:
//! - `um_rtt_p50_ns`, `um_rtt_p99_ns`: a user-mode submission of one `WRITE_DATA` (and its
//!   progress fence), from just before the UMD's submit call to the CPU seeing the value the
//!   GPU wrote into host memory: submit to the engine's first packet, seen by the CPU — the
//!   same round trip as CUDA's `launch_rtt`;
//! - `um_throughput_per_s`: tiny command buffers (one `WRITE_DATA` and the progress fence) on
//!   one queue, sustained, until the last completes;
//! - CUDA's path in the same run (`cuda::baseline`): `launch_rtt`, `graph_launch_rtt`,
//!   `launches_per_s`, and the PCIe floor, `pcie_doorbell_rtt` (a persistent GPU thread
//!   echoing a doorbell word in pinned host memory);
//! - the ratios the design is held to: `um_over_launch` (p50 over CUDA's launch p50; bar
//!   ≤ 0.4), `um_over_pcie` (over the PCIe doorbell round trip; bar ≤ 2),
//!   `throughput_over_launches` (bar ≥ 10).
//!
//! `bench preempt --device cuda`:
//! - `high_prio_start_p50_ns`, `_p99_ns`: a high-priority queue's `WRITE_DATA`, submit to
//!   seen by the CPU, while low-priority queues keep every compute slot busy with long
//!   `DISPATCH`es: the firmware evicts one (its dispatch stops at an instruction, its waves
//!   saved to the context save area) and maps the high-priority queue; the low queues'
//!   results are checked afterwards (nothing lost);
//! - `cuda_prio_start_p50_ns`, `_p99_ns`: a highest-priority CUDA stream's kernel beside a
//!   low-priority stream filling every SM with 1 ms blocks, in the same run;
//! - `p99_ratio`: ours over CUDA's (bar ≤ 1/20).
//!
//! `--device emulated` runs the same doorbell measurements on the engine program emulated on
//! the CPU (no CUDA figures): a check of the path on a machine without a GPU, not a figure of
//! one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use abi::port::KernelPort;
use abi::preempt::ComputeGranularity;
use abi::{EngineKind, Priority};
use gpu::hw::HardwareFactory;
use kernel::TdrConfig;
use umd::{Buffer, CommandBuffer, Device, Queue, QueueOptions};

use crate::CliError;
use crate::bench_preempt::{Gap, Spinner, system_on};
use crate::measure::{DeviceKind, percentiles, progress};

/// The hardware factory for `kind`, or the reason there is none.
fn hardware(kind: DeviceKind) -> Result<HardwareFactory, CliError> {
    match kind {
        DeviceKind::Cuda => cuda::nvidia(0).map_err(|e| CliError::Device(e.to_string())),
        DeviceKind::Emulated => Ok(cuda::emulated()),
        DeviceKind::Virtual => Err(CliError::Input("the virtual device has its own benchmark".into())),
    }
}

/// The CUDA driver, for the vendor-path figures (only with a GPU).
fn vendor(kind: DeviceKind) -> Result<Option<cuda::Cuda>, CliError> {
    match kind {
        DeviceKind::Cuda => cuda::Cuda::open(0).map(Some).map_err(|e| CliError::Device(e.to_string())),
        _ => Ok(None),
    }
}

fn device_err(e: cuda::CudaError) -> CliError {
    CliError::Device(e.to_string())
}

/// Spins until the u64 at `offset` of `buf` reads `value`; the time it took from `t0`.
fn seen(buf: &Buffer, offset: u64, value: u64, t0: Instant) -> Result<u64, CliError> {
    let deadline = t0 + Duration::from_secs(10);
    loop {
        if buf.read_u64(offset)? == value {
            return Ok(t0.elapsed().as_nanos() as u64);
        }
        if Instant::now() > deadline {
            return Err(CliError::Check(format!("a WRITE_DATA of {value} never arrived (10 s)")));
        }
        std::hint::spin_loop();
    }
}

/// Round trips of `samples` one-packet submissions on `q`: submit to the CPU seeing the
/// packet's write. `before` runs ahead of each (a gap, a top-up of other queues). With
/// `done`, also submit to the CPU seeing the progress value (the command buffer complete).
fn round_trips(
    q: &mut Queue,
    buf: &Buffer,
    samples: usize,
    base: u64,
    mut done: Option<&mut Vec<u64>>,
    mut before: impl FnMut() -> Result<(), CliError>,
) -> Result<Vec<u64>, CliError> {
    let slots = buf.len() / 8;
    let mut out = Vec::with_capacity(samples);
    let mut cb = CommandBuffer::new();
    for i in 0..samples as u64 {
        before()?;
        let slot = (i % slots) * 8;
        let value = base + i + 1;
        cb.clear();
        cb.write_u64(buf.va() + slot, value);
        let t0 = Instant::now();
        let v = q.submit(&cb)?;
        out.push(seen(buf, slot, value, t0)?);
        q.wait(v, Some(Duration::from_secs(10)))?;
        if let Some(d) = done.as_deref_mut() {
            d.push(t0.elapsed().as_nanos() as u64);
        }
    }
    Ok(out)
}

/// Packets per second of one command buffer of `n` copies of what `add` appends, on `q`.
fn packets_per_s(q: &mut Queue, n: usize, mut add: impl FnMut(&mut CommandBuffer, usize)) -> Result<f64, CliError> {
    let mut cb = CommandBuffer::new();
    for i in 0..n {
        add(&mut cb, i);
    }
    let t0 = Instant::now();
    let v = q.submit(&cb)?;
    q.wait(v, Some(Duration::from_secs(60)))?;
    Ok(n as f64 / t0.elapsed().as_secs_f64())
}

/// Tiny command buffers (one WRITE_DATA each) per second on a queue of `ctx`: `count` of them
/// back to back until the last completes, its write checked.
fn tiny_per_s(dev: &Device, ctx: &umd::Context, count: u64) -> Result<f64, CliError> {
    let tbuf = dev.allocate(4096)?;
    let mut tq = ctx.create_queue(QueueOptions { ring_bytes: 1 << 20, ..QueueOptions::user_mode() })?;
    tq.set_spin(u32::MAX);
    let mut cb = CommandBuffer::new();
    let start = Instant::now();
    let mut last = 0;
    for i in 0..count {
        cb.clear();
        cb.write_u32(tbuf.va(), i as u32);
        last = tq.submit(&cb)?;
    }
    tq.wait(last, Some(Duration::from_secs(120)))?;
    let el = start.elapsed();
    if tbuf.read_u32(0)? != (count - 1) as u32 {
        return Err(CliError::Check("throughput run: the last WRITE_DATA is not visible".into()));
    }
    Ok(count as f64 / el.as_secs_f64())
}

/// `bench submit --device cuda|emulated`.
pub(crate) fn submit(kind: DeviceKind, json: bool, samples: u32, throughput_count: u64) -> Result<(), CliError> {
    let hw = hardware(kind)?;
    let vendor = vendor(kind)?;
    let cuda_path = match &vendor {
        Some(c) => {
            progress(json, "CUDA's path: launch and graph-launch round trips, launches per second, PCIe doorbell");
            Some(
                cuda::baseline::measure_cuda_path(c, samples as usize, cuda::baseline::DEFAULT_WARMUP)
                    .map_err(device_err)?,
            )
        }
        None => None,
    };
    progress(json, &format!("doorbell on {}: user-mode round trip", hw.name));
    let sys = system_on(Some(hw.clone()), ComputeGranularity::Shader, 8, TdrConfig::default())?;
    let port: Arc<dyn KernelPort> = sys.open_process()?;
    let dev = Device::open(port)?;
    let ctx = dev.create_context(dev.engine(EngineKind::Compute)?)?;
    let buf = dev.allocate(1 << 16)?;
    let mut q = ctx.create_queue(QueueOptions::user_mode())?;
    q.set_spin(u32::MAX);
    round_trips(&mut q, &buf, 1000, 0, None, || Ok(()))?; // warm-up: pages, caches, the slot loaded
    let mut done = Vec::new();
    let (p50, p99) = percentiles(round_trips(&mut q, &buf, samples as usize, 1 << 32, Some(&mut done), || Ok(()))?);
    let (done_p50, _) = percentiles(done);

    progress(json, "what one slot executes: NOPs, WRITE_DATAs, wave-instructions per second");
    let mut big = ctx.create_queue(QueueOptions { ring_bytes: 1 << 20, ..QueueOptions::user_mode() })?;
    big.set_spin(u32::MAX);
    let nops = packets_per_s(&mut big, 16_384, |cb, _| {
        cb.nop(1);
    })?;
    let writes = packets_per_s(&mut big, 4_096, |cb, i| {
        cb.write_u32(buf.va() + (i as u64 % 1024) * 4, i as u32);
    })?;
    let kernel = dev.upload(&program::workloads::rounds().to_bytes())?;
    let kout = dev.allocate(256 * 4)?;
    let kargs = dev.upload(&program::workloads::rounds_args(kout.va(), 2000))?;
    let mut kcb = CommandBuffer::new();
    kcb.dispatch(kernel.va(), [4, 1, 1], [64, 1, 1], kargs.va());
    let before = sys.with_gpu(|g| g.compute_stats().instructions);
    let t0 = Instant::now();
    let kv = big.submit(&kcb)?;
    big.wait(kv, Some(Duration::from_secs(60)))?;
    let wave_instructions =
        (sys.with_gpu(|g| g.compute_stats().instructions) - before) as f64 / t0.elapsed().as_secs_f64();
    if kout.read_u32(0)? != program::workloads::rounds_result(2000) {
        return Err(CliError::Check("the rounds kernel's result is wrong".into()));
    }
    drop((big, kernel, kout, kargs));

    progress(json, "tiny command buffers on one queue");
    let throughput = tiny_per_s(&dev, &ctx, throughput_count)?;
    let device = sys.with_gpu(|g| g.hardware_name()).unwrap_or_default();
    drop((q, buf, ctx, dev, sys));

    if json {
        let mut o = serde_json::json!({
            "device": device,
            "um_rtt_p50_ns": p50,
            "um_rtt_p99_ns": p99,
            "um_done_p50_ns": done_p50,
            "nop_packets_per_s": nops.round() as u64,
            "write_packets_per_s": writes.round() as u64,
            "wave_instructions_per_s": wave_instructions.round() as u64,
            "um_throughput_per_s": throughput.round() as u64,
            "samples": samples,
            "throughput_count": throughput_count,
        });
        if let Some(c) = &cuda_path {
            let m = o.as_object_mut().expect("an object");
            let ratio = |a: f64, b: f64| (a / b.max(1.0) * 1000.0).round() / 1000.0;
            m.insert("cuda".into(), serde_json::from_str(&c.to_json()).unwrap_or(serde_json::Value::Null));
            m.insert("um_over_launch".into(), ratio(p50 as f64, c.launch_rtt.p50_ns as f64).into());
            m.insert("um_over_graph_launch".into(), ratio(p50 as f64, c.graph_launch_rtt.p50_ns as f64).into());
            m.insert("um_over_pcie".into(), ratio(p50 as f64, c.pcie_doorbell_rtt.p50_ns as f64).into());
            m.insert("throughput_over_launches".into(), ratio(throughput, c.launches_per_s).into());
        }
        outln!("{o}");
    } else {
        outln!("doorbell bench submit --device ({device}; {samples} samples, {throughput_count} command buffers)");
        outln!("{:<52} {:>22}", "measure", "value");
        outln!("{:<52} {:>19} ns", "user-mode round trip p50 (submit -> CPU sees write)", p50);
        outln!("{:<52} {:>19} ns", "user-mode round trip p99", p99);
        outln!("{:<52} {:>19} ns", "submit -> progress value seen p50", done_p50);
        outln!("{:<52} {:>19.0} /s", "NOP packets, one slot", nops);
        outln!("{:<52} {:>19.0} /s", "WRITE_DATA packets, one slot", writes);
        outln!("{:<52} {:>19.0} /s", "wave-instructions, one slot", wave_instructions);
        outln!("{:<52} {:>19.0} /s", "tiny command buffers, one queue", throughput);
        if let Some(c) = &cuda_path {
            for (label, value) in c.rows() {
                outln!("{:<52} {:>22}", format!("CUDA: {label}"), value);
            }
            outln!(
                "{:<52} {:>22.3}",
                "user-mode p50 / CUDA launch p50 (bar <= 0.4)",
                p50 as f64 / c.launch_rtt.p50_ns.max(1) as f64
            );
            outln!(
                "{:<52} {:>22.3}",
                "user-mode p50 / PCIe doorbell p50 (bar <= 2)",
                p50 as f64 / c.pcie_doorbell_rtt.p50_ns.max(1) as f64
            );
            outln!(
                "{:<52} {:>22.1}",
                "throughput / CUDA launches per s (bar >= 10)",
                throughput / c.launches_per_s.max(1.0)
            );
        }
    }
    Ok(())
}

/// `bench preempt --device cuda|emulated`.
pub(crate) fn preempt(kind: DeviceKind, json: bool, samples: u32, rounds: u32) -> Result<(), CliError> {
    let hw = hardware(kind)?;
    let vendor = vendor(kind)?;
    let cuda_prio = match &vendor {
        Some(c) => {
            progress(json, "CUDA: a high-priority stream's kernel beside 1 ms blocks on every SM");
            Some(
                cuda::baseline::measure_priority_under_load(c, cuda::baseline::DEFAULT_BLOCK_NS, samples as usize)
                    .map_err(device_err)?,
            )
        }
        None => None,
    };
    progress(json, &format!("doorbell on {}: a high-priority queue with every compute slot busy", hw.name));
    const SLOTS: u32 = 8;
    let sys = system_on(Some(hw), ComputeGranularity::Shader, SLOTS, TdrConfig::default())?;
    let mut lows =
        (0..SLOTS).map(|_| Spinner::shaped(&sys, Priority::Low, rounds, 4, 1)).collect::<Result<Vec<_>, _>>()?;
    let dev = Device::open(sys.open_process()?)?;
    let ctx = dev.create_context(dev.engine(EngineKind::Compute)?)?;
    let mut hq = ctx.create_queue(QueueOptions { priority: Priority::High, ..QueueOptions::user_mode() })?;
    hq.set_spin(u32::MAX);
    let buf = dev.allocate(1 << 16)?;
    let mut gap = Gap(0x2545_f491_4f6c_dd1d);
    let mut before = || -> Result<(), CliError> {
        for l in &mut lows {
            l.top_up()?;
        }
        // A gap of 100 to 500 µs, as CUDA's probe has.
        gap.spin_between(Duration::from_micros(100), Duration::from_micros(400));
        Ok(())
    };
    round_trips(&mut hq, &buf, 50, 0, None, &mut before)?; // warm-up
    let (p50, p99) = percentiles(round_trips(&mut hq, &buf, samples as usize, 1 << 32, None, &mut before)?);
    let busy = sys.with_gpu(|g| g.slot_occupancy(abi::EngineId(0)).map_or(0, |(held, _)| held));
    let saved = sys.with_gpu(|g| g.firmware_counts().states_saved);
    let mut ok = true;
    for l in &lows {
        ok &= l.finish()?;
    }
    if !ok {
        return Err(CliError::Check("a low-priority queue's results are wrong after its preemptions".into()));
    }
    let device = sys.with_gpu(|g| g.hardware_name()).unwrap_or_default();
    if json {
        let mut o = serde_json::json!({
            "device": device,
            "high_prio_start_p50_ns": p50,
            "high_prio_start_p99_ns": p99,
            "slots": SLOTS,
            "slots_held_at_end": busy,
            "states_saved": saved,
            "low_results_ok": ok,
            "samples": samples,
            "rounds": rounds,
        });
        if let Some(c) = &cuda_prio {
            let m = o.as_object_mut().expect("an object");
            m.insert("cuda_prio_start_p50_ns".into(), c.p50_ns.into());
            m.insert("cuda_prio_start_p99_ns".into(), c.p99_ns.into());
            m.insert("p99_ratio".into(), ((p99 as f64 / c.p99_ns.max(1) as f64 * 10_000.0).round() / 10_000.0).into());
        }
        outln!("{o}");
    } else {
        outln!("doorbell bench preempt --device ({device}; {samples} samples)");
        outln!("{:<56} {:>14}", "measure", "value");
        outln!("{:<56} {:>11} ns", "high-priority start p50 (every slot busy)", p50);
        outln!("{:<56} {:>11} ns", "high-priority start p99", p99);
        outln!("{:<56} {:>14}", "states saved (dispatches stopped at an instruction)", saved);
        if let Some(c) = &cuda_prio {
            outln!("{:<56} {:>11} ns", "CUDA high-priority stream start p50 (1 ms blocks)", c.p50_ns);
            outln!("{:<56} {:>11} ns", "CUDA high-priority stream start p99", c.p99_ns);
            outln!("{:<56} {:>14.4}", "ours p99 / CUDA p99 (bar <= 0.05)", p99 as f64 / c.p99_ns.max(1) as f64);
        }
    }
    Ok(())
}
