//! `doorbell bench …`: measurements, each against a floor measured in the same run.
//!
//! `bench submit` measures:
//! - `floor_cacheline_rtt_ns`: one cache line bounced between two threads (a store seen by
//!   the other core and answered): the hardware floor of any cross-core notification;
//! - `um_p50_ns`, `um_p99_ns`: user-mode submission, from just before the UMD's submit call
//!   (which writes the packets, wptr and the doorbell) to the engine starting the first packet
//!   (a `TIMESTAMP`, written with the device clock, which is the same clock) — firmware awake;
//! - `km_p50_ns`, `km_p99_ns`: the same through the kernel-mode path (a kernel call, the
//!   software queue, the scheduler worker, the kernel ring);
//! - `um_cold_p50_ns`: the same with the engine in F1 and the doorbell disconnected: the ring
//!   hits the dummy page, the UMD reads DisconnectedRetry, reconnects (the engine returns to F0
//!   and the firmware thread is unparked), rings again;
//! - `um_throughput_per_s`: tiny command buffers (one `WRITE_DATA` and the progress fence) on
//!   one queue, sustained, until the last one completes.

use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use gpu::{GpuConfig, PowerState};
use umd::{CommandBuffer, QueueOptions};

use crate::measure::{DeviceKind, FloorTable, Rig, cacheline_rtt_ns, latencies, percentiles, progress, rig_with};
use crate::{CliError, num};

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Submission latency (user-mode vs kernel-mode, warm and cold) and throughput, with the
    /// cache-line round trip measured in the same run as the floor.
    Submit(SubmitArgs),
    /// Compute: lane operations per second of an ALU-bound program on one engine thread, with
    /// the default wave width and with a wave width of 1 (what SIMT buys), and the example
    /// programs checked against their CPU references.
    Compute(ComputeArgs),
    /// Native fences: interrupts per signal (no waiter, a waiter, legacy), CPU wake latency
    /// (blocked and spinning), and a queue waiting on another engine's signal (GPU-side and
    /// CPU-mediated), with the cache-line round trip as the floor.
    Fences(FenceArgs),
    /// Oversubscription: N saturated normal-priority user-mode queues and one high-priority
    /// queue over a few hardware slots and a small pool of physical doorbells; loss, Jain
    /// fairness, throughput, victimizations and submit-to-completion p99 per priority.
    Oversubscribe(crate::bench_oversub::OversubArgs),
    /// A noisy neighbour: tiny command buffers of one process on the copy engine, alone and
    /// beside another process's bulk FILLs (the engine slices them and budgets turns by
    /// device time); p50/p99 beside the cache-line floor. `--unsliced` for the engine as it
    /// was before slicing.
    Neighbour(crate::bench_neighbour::NeighbourArgs),
    /// Preemption and recovery: preemption latency at each compute granularity level, a
    /// high-priority queue's start latency with every slot busy, the throughput cost of a
    /// preemption every millisecond, and the time from a TDR timeout to the other queues
    /// running again.
    Preempt(crate::bench_preempt::PreemptArgs),
    /// Profile-guided specialization (spec 004 background processing): generic vs
    /// specialized dispatch time of two sample programs, commit to completion event, and the
    /// foreground submit p99 with background compiles running vs disabled.
    Pgo(crate::bench_pgo::PgoArgs),
    /// The consumer side of `bench submit --daemon`'s peer measurements (run as a child).
    #[command(hide = true)]
    Peer(crate::bench_daemon::PeerArgs),
    /// The simulator at scale: 10,000 user-mode queues over 8 slots, synthetic kernels, in
    /// virtual time; events, submissions and simulated seconds per wall second, beside the
    /// live driver's submissions per second for the same workload scaled down.
    Sim(crate::sim_cmd::BenchSimArgs),
}

#[derive(Args)]
pub struct FenceArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Signals counted per interrupt ratio (1 to 10,000,000).
    #[arg(long, default_value_t = 10_000, value_parser = num::within(1u64, 10_000_000))]
    signals: u64,
    /// Latency samples per measure (1 to 1,000,000; the CPU-wake and CPU-mediated measures
    /// take at most 1,000).
    #[arg(long, default_value_t = 2_000, value_parser = num::within(1u32, 1_000_000))]
    samples: u32,
}

#[derive(Args)]
pub struct ComputeArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Loop iterations per thread of the ALU program at the default wave width, 1 to 4294967295
    /// (the scalar run uses a twentieth, at least 1: it is that much slower).
    #[arg(long, default_value_t = 20_000, value_parser = num::within(1u32, u32::MAX))]
    iterations: u32,
    /// Workgroups of 256 threads in the ALU kernel's grid, 1 to 4294967295.
    #[arg(long, default_value_t = 16, value_parser = num::within(1u32, u32::MAX))]
    groups: u32,
}

#[derive(Args)]
pub struct SubmitArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Latency samples per warm path (1 to 10,000,000; the kernel-mode path takes at most
    /// 5,000).
    #[arg(long, default_value_t = 20_000, value_parser = num::within(1u32, 10_000_000))]
    samples: u32,
    /// Latency samples from F1, 1 to 100,000 (each waits for the engine to go idle).
    #[arg(long, default_value_t = 200, value_parser = num::within(1u32, 100_000))]
    cold_samples: u32,
    /// Command buffers in the throughput run (1 to 1,000,000,000).
    #[arg(long, default_value_t = 2_000_000, value_parser = num::within(1u64, 1_000_000_000))]
    throughput_count: u64,
    /// Submit from this process to a daemon it starts (`doorbell serve`), and measure the
    /// embedded figure and the two-process peers (shared-memory ring, Unix socket, futex,
    /// io_uring with SQPOLL) in the same run.
    #[arg(long)]
    daemon: bool,
    /// Where the engines run: `virtual` (CPU threads, the default), `cuda` (an NVIDIA GPU:
    /// the round trip from submit to the CPU seeing the engine's write, tiny command buffers
    /// per second, and CUDA's own launch path and the PCIe doorbell floor measured in the same
    /// run; exits with an error naming what is missing when no GPU or driver is found), or
    /// `emulated` (the GPU's engine program emulated on the CPU: a check of that path, not a
    /// GPU figure).
    #[arg(long, value_enum, default_value_t = DeviceKind::Virtual)]
    device: DeviceKind,
}

pub fn run(cmd: BenchCommand) -> Result<(), CliError> {
    match cmd {
        BenchCommand::Submit(a) => submit(a),
        BenchCommand::Compute(a) => compute(a),
        BenchCommand::Fences(a) => crate::bench_fences::run(a.json, a.signals, a.samples as usize),
        BenchCommand::Oversubscribe(a) => crate::bench_oversub::run(a),
        BenchCommand::Neighbour(a) => crate::bench_neighbour::run(a),
        BenchCommand::Preempt(a) if a.device != DeviceKind::Virtual => {
            crate::bench_cuda::preempt(a.device, a.json, a.samples, a.rounds)
        }
        BenchCommand::Preempt(a) => crate::bench_preempt::run(a),
        BenchCommand::Pgo(a) => crate::bench_pgo::run(a),
        BenchCommand::Peer(a) => crate::bench_daemon::peer(a),
        BenchCommand::Sim(a) => crate::sim_cmd::bench_sim(a),
    }
}

/// A [`Rig`] whose engines go idle after `idle`.
fn rig(idle: Duration) -> Result<Rig, CliError> {
    rig_with(GpuConfig { idle_period: idle, ..GpuConfig::default() })
}

fn submit(a: SubmitArgs) -> Result<(), CliError> {
    if a.device != DeviceKind::Virtual {
        if a.daemon {
            return Err(CliError::Input("--daemon measures the virtual device; drop it or --device".into()));
        }
        return crate::bench_cuda::submit(a.device, a.json, a.samples, a.throughput_count);
    }
    if a.daemon {
        let (json, samples, throughput_count) = (a.json, a.samples, a.throughput_count);
        return crate::bench_daemon::submit(crate::bench_daemon::DaemonSubmitArgs { json, samples, throughput_count });
    }
    let json = a.json;
    progress(json, "measuring the floor: cache-line round trip between two threads");
    let floor = cacheline_rtt_ns();

    progress(json, "user-mode and kernel-mode latency, firmware awake");
    let r = rig(Duration::from_secs(3600))?;
    let buf = r.dev.allocate(1 << 20)?;
    let mut uq = r.ctx.create_queue(QueueOptions::user_mode())?;
    uq.set_spin(u32::MAX); // spin on memory: the thread waiting is not what is measured
    latencies(&r.sys, &mut uq, &buf, 1000, || Ok(()))?; // warm-up
    let (um_p50, um_p99) = percentiles(latencies(&r.sys, &mut uq, &buf, a.samples as usize, || Ok(()))?);
    let mut kq = r.ctx.create_queue(QueueOptions::kernel_mode())?;
    kq.set_spin(0); // block in the kernel so the scheduler worker gets a core
    latencies(&r.sys, &mut kq, &buf, 200, || Ok(()))?;
    let (km_p50, km_p99) = percentiles(latencies(&r.sys, &mut kq, &buf, a.samples.min(5_000) as usize, || Ok(()))?);

    progress(json, "user-mode throughput, tiny command buffers on one queue");
    let tbuf = r.dev.allocate(4096)?;
    let mut tq = r.ctx.create_queue(QueueOptions { ring_bytes: 1 << 20, ..QueueOptions::user_mode() })?;
    tq.set_spin(u32::MAX);
    let mut cb = CommandBuffer::new();
    let start = Instant::now();
    let mut last = 0;
    for i in 0..a.throughput_count {
        cb.clear();
        cb.write_u32(tbuf.va(), i as u32);
        last = tq.submit(&cb)?;
    }
    tq.wait(last, Some(Duration::from_secs(60)))?;
    let el = start.elapsed();
    if tbuf.read_u32(0)? != (a.throughput_count - 1) as u32 {
        return Err(CliError::Check("throughput run: last WRITE_DATA not visible".into()));
    }
    let throughput = a.throughput_count as f64 / el.as_secs_f64();
    drop((uq, kq, tq, buf, tbuf, r));

    progress(json, "cold user-mode latency: engine in F1, doorbell disconnected");
    let r = rig(Duration::from_millis(1))?;
    let buf = r.dev.allocate(1 << 16)?;
    let mut cq = r.ctx.create_queue(QueueOptions::user_mode())?;
    cq.set_spin(u32::MAX);
    let engine = cq.engine();
    let sys = r.sys.clone();
    let reconnects_before = cq.reconnects();
    let cold = latencies(&r.sys, &mut cq, &buf, a.cold_samples as usize, || {
        let deadline = Instant::now() + Duration::from_secs(5);
        while sys.power(engine) != PowerState::F1 {
            if Instant::now() > deadline {
                return Err(CliError::Check("engine did not reach F1".into()));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(())
    })?;
    if cq.reconnects() - reconnects_before < a.cold_samples as u64 {
        return Err(CliError::Check("cold samples did not all reconnect".into()));
    }
    let (cold_p50, _) = percentiles(cold);

    let floor_ns = floor.round() as u64;
    if json {
        let o = serde_json::json!({
            "um_p50_ns": um_p50,
            "um_p99_ns": um_p99,
            "km_p50_ns": km_p50,
            "km_p99_ns": km_p99,
            "um_cold_p50_ns": cold_p50,
            "um_throughput_per_s": throughput.round() as u64,
            "floor_cacheline_rtt_ns": floor_ns,
            "samples": a.samples,
            "cold_samples": a.cold_samples,
            "throughput_count": a.throughput_count,
        });
        outln!("{o}");
    } else {
        outln!(
            "doorbell bench submit ({} warm samples, {} cold, {} command buffers)",
            a.samples,
            a.cold_samples,
            a.throughput_count
        );
        let t = FloorTable::new(34, floor);
        t.ns("user-mode p50 (ring -> engine)", um_p50);
        t.ns("user-mode p99", um_p99);
        t.ns("kernel-mode p50", km_p50);
        t.ns("kernel-mode p99", km_p99);
        t.ns("user-mode cold p50 (from F1)", cold_p50);
        outln!("{:<34} {:>9.0} /s", "user-mode throughput", throughput);
        outln!("kernel-mode p50 / user-mode p50 = {:.1}", km_p50 as f64 / um_p50.max(1) as f64);
    }
    Ok(())
}

/// The ALU-bound program: each thread loops `iterations` (argument slot 0) times over seven
/// integer and float operations plus the loop's own four.
fn alu_kernel() -> Vec<u8> {
    use abi::isa::{Builtin, FLAG_IMM, Inst, Op, ProgramHeader};
    let p = [
        Inst::new(Op::SArg, 0, 0, 0, 0, 0),
        Inst::new(Op::VFromS, 2, 0, 0, 0, 0),
        Inst::new(Op::Builtin, 1, 0, 0, 0, Builtin::GlobalIdX as u32),
        Inst::new(Op::Loop, 0, 0, 0, 0, 14),
        Inst::new(Op::CmpEq, 3, 2, 0, FLAG_IMM, 0),
        Inst::new(Op::Break, 0, 3, 0, 0, 14),
        Inst::new(Op::Sub, 2, 2, 0, FLAG_IMM, 1),
        Inst::new(Op::Mul, 4, 1, 0, FLAG_IMM, 3),
        Inst::new(Op::Add, 5, 4, 1, 0, 0),
        Inst::new(Op::Xor, 6, 5, 4, 0, 0),
        Inst::new(Op::FMul, 7, 6, 6, 0, 0),
        Inst::new(Op::FAdd, 8, 7, 5, 0, 0),
        Inst::new(Op::Add, 1, 1, 8, 0, 0),
        Inst::new(Op::Shr, 9, 1, 0, FLAG_IMM, 3),
        Inst::new(Op::EndLoop, 0, 0, 0, 0, 3),
    ];
    let mut bytes = Vec::new();
    for w in ProgramHeader::new(p.len() as u32).to_words() {
        bytes.extend_from_slice(&w.to_le_bytes());
    }
    for i in &p {
        bytes.extend_from_slice(&i.encode().to_le_bytes());
    }
    bytes
}

/// Lane operations per second of the ALU program on a live system with `width`-lane waves.
fn lane_ops_per_s(width: u32, groups: u32, iterations: u32) -> Result<f64, CliError> {
    let Rig { sys, dev, ctx, .. } =
        rig_with(GpuConfig { wave_width: width, idle_period: Duration::from_secs(3600), ..GpuConfig::default() })?;
    let mut q = ctx.create_queue(QueueOptions::user_mode())?;
    let kernel = dev.upload(&alu_kernel())?;
    let args = dev.upload(&(iterations as u64).to_le_bytes())?;
    let mut cb = CommandBuffer::new();
    cb.dispatch(kernel.va(), [groups, 1, 1], [256, 1, 1], args.va());
    let before = sys.with_gpu(|g| g.compute_stats());
    let start = Instant::now();
    let v = q.submit(&cb)?;
    q.wait(v, Some(Duration::from_secs(600)))?;
    let el = start.elapsed().as_secs_f64();
    let after = sys.with_gpu(|g| g.compute_stats());
    let ops = after.lane_ops - before.lane_ops;
    let expect = groups as u64 * 256 * (iterations as u64 * 11 + 6);
    if ops < expect {
        return Err(CliError::Check(format!("ALU kernel ran {ops} lane operations, expected at least {expect}")));
    }
    Ok(ops as f64 / el)
}

fn compute(a: ComputeArgs) -> Result<(), CliError> {
    let json = a.json;
    progress(json, "ALU-bound kernel, default wave width (32 lanes)");
    let simt = lane_ops_per_s(GpuConfig::default().wave_width, a.groups, a.iterations)?;
    progress(json, "the same kernel with a wave width of 1");
    let scalar = lane_ops_per_s(1, a.groups, (a.iterations / 20).max(1))?;
    progress(json, "example kernels against their CPU references");
    let (verified, total) = crate::examples::verify_all_live()?;
    if json {
        let o = serde_json::json!({
            "lane_ops_per_s": simt.round() as u64,
            "scalar_ops_per_s": scalar.round() as u64,
            "simt_speedup": (simt / scalar * 10.0).round() / 10.0,
            "kernels_verified": verified,
            "kernels_total": total,
            "wave_width": GpuConfig::default().wave_width,
        });
        outln!("{o}");
    } else {
        outln!("doorbell bench compute ({} groups x 256 threads, {} iterations)", a.groups, a.iterations);
        outln!("{:<40} {:>16}", "measure", "value");
        outln!("{:<40} {:>14.0} /s", "lane ops, 32-lane waves", simt);
        outln!("{:<40} {:>14.0} /s", "lane ops, 1-lane waves (scalar)", scalar);
        outln!("{:<40} {:>15.1}x", "what SIMT buys", simt / scalar);
        outln!("{:<40} {:>13}/{}", "example kernels verified", verified, total);
    }
    Ok(())
}
