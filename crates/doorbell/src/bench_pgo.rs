//! `doorbell bench pgo`: what profile-guided specialization (spec 004 background processing)
//! buys, and what the background work costs the foreground.
//!
//! - `kernels`: for each sample kernel of `runtime::pgo::samples` (`fir`, an argument-bound loop;
//!   `iterate`, a loop around a branch on an argument), the device time of one `DISPATCH` —
//!   from a `TIMESTAMP` just before it to one just after, on the device clock — p50 over
//!   `--samples` dispatches, for the generic kernel and for the variant the specializer made
//!   after spec 004's benchmark workflow (prime with `AllowIntrusiveMeasurements` until
//!   `further_measurements_desired` is false); their ratio `speedup`; and
//!   `results_identical`: the two left the same memory, bit for bit, on the same inputs.
//! - `commit_to_event_ns`: p50 from the `CommitResults` call (a pipeline with a partial
//!   histogram, so one compile is queued) to its completion event being signalled.
//! - `foreground_submit_p99_ns`: user-mode submit latency p99 (as `bench submit` measures it,
//!   submit call to the engine starting the packet) while background compiles keep the pool's
//!   two workers busy at the default mode (`SCHED_IDLE`), and `..._disabled` with background
//!   work disabled; `foreground_slowdown` is their ratio. The two conditions alternate in
//!   ten rounds, so drift in a shared machine's load falls on both alike.
//!   The two conditions share `--phase-ms` each; `background_compiles_during` and
//!   `background_tasks_raised` say how much background work actually ran, and how much of it
//!   the progress bound lifted out of `SCHED_IDLE`.
//! - `floor_cacheline_rtt_ns`: the cache-line round trip, measured in the same run.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use abi::EngineKind;
use abi::port::KernelPort;
use clap::Args;
use gpu::GpuConfig;
use kernel::{System, SystemConfig};
use runtime::background::{CompletionEvent, MeasurementsAction as A, Mode};
use runtime::pgo::samples::{self, Instance, Sample};
use runtime::pgo::{Pipeline, Selected};
use runtime::{Device, DeviceOptions};
use umd::{CommandBuffer, Queue, QueueOptions};

use crate::measure::{cacheline_rtt_ns, latencies, percentiles, progress};
use crate::{CliError, num};

#[derive(Args)]
pub struct PgoArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Dispatches timed per program and variant (1 to 100,000).
    #[arg(long, default_value_t = 200, value_parser = num::within(1u32, 100_000))]
    samples: u32,
    /// Elements (threads) per dispatch (1 to 1,048,576).
    #[arg(long, default_value_t = 4096, value_parser = num::within(1u32, 1 << 20))]
    elements: u32,
    /// Foreground submissions timed per condition, at least (1 to 1,000,000).
    #[arg(long, default_value_t = 5_000, value_parser = num::within(1u32, 1_000_000))]
    submits: u32,
    /// Each foreground condition is measured for at least this many milliseconds in all
    /// (1 to 600,000), in ten alternating rounds, so that background tasks starved at
    /// SCHED_IDLE pass the progress bound and are raised.
    #[arg(long, default_value_t = 2_000, value_parser = num::within(1u64, 600_000))]
    phase_ms: u64,
    /// Commits timed for `commit_to_event_ns` (1 to 10,000).
    #[arg(long, default_value_t = 20, value_parser = num::within(1u32, 10_000))]
    commits: u32,
}

const WAIT: Option<Duration> = Some(Duration::from_secs(60));

/// The parameters the bench binds: `fir` with 32 taps; `iterate` with 32 rounds of the
/// affine step (op 0).
const PARAMS: [u32; 2] = [32, 0];

/// Device time of each of `samples` dispatches recorded by `record`, between two TIMESTAMPs.
fn dispatch_times(
    q: &mut Queue,
    stamps: &umd::Buffer,
    samples: u32,
    mut record: impl FnMut(&mut CommandBuffer) -> Result<(), CliError>,
) -> Result<Vec<u64>, CliError> {
    let mut out = Vec::with_capacity(samples as usize);
    let mut cb = CommandBuffer::new();
    for _ in 0..samples {
        cb.clear();
        cb.timestamp(stamps.va());
        record(&mut cb)?;
        cb.timestamp(stamps.va() + 8);
        let v = q.submit(&cb)?;
        q.wait(v, WAIT)?;
        out.push(stamps.read_u64(8)?.saturating_sub(stamps.read_u64(0)?));
    }
    Ok(out)
}

struct KernelResult {
    name: &'static str,
    generic_ns: u64,
    specialized_ns: u64,
    identical: bool,
    instructions: (usize, usize),
}

fn run_once(q: &mut Queue, va: u64, inst: &Instance) -> Result<(), CliError> {
    let mut cb = CommandBuffer::new();
    cb.dispatch(va, inst.grid, inst.group, inst.args.va());
    let v = q.submit(&cb)?;
    q.wait(v, WAIT)?;
    Ok(())
}

fn kernel(dev: &Device, q: &mut Queue, s: &Sample, a: &PgoArgs) -> Result<KernelResult, CliError> {
    let params = PARAMS;
    let bin = s.program();
    let generic = dev.upload(&bin.to_bytes())?;
    let stamps = dev.allocate(4096)?;
    let inst = s.instance(dev, a.elements, params, 1)?;
    // Generic, dispatched directly (no pipeline, so nothing is measured or compiled).
    run_once(q, generic.va(), &inst)?;
    let (generic_ns, _) = percentiles(dispatch_times(q, &stamps, a.samples, |cb| {
        cb.dispatch(generic.va(), inst.grid, inst.group, inst.args.va());
        Ok(())
    })?);
    // Spec 004's benchmark workflow: prime until no further measurements are desired.
    let p = Pipeline::new(dev, &bin)?;
    let primed = runtime::pgo::workflow::prime(dev, 10_000, || -> Result<(), CliError> {
        let mut cb = CommandBuffer::new();
        for _ in 0..8 {
            p.dispatch(&mut cb, inst.grid, inst.group, &inst.args)?;
        }
        let v = q.submit(&cb)?;
        q.wait(v, WAIT)?;
        Ok(())
    })?;
    if !primed.steady {
        return Err(CliError::Check(format!("{}: the specializer never reached a steady state", s.name)));
    }
    dev.set_background_processing_mode(Mode::Allowed, A::KeepAll, None, None)?;
    let mut selected = Selected::Generic;
    let (specialized_ns, _) = percentiles(dispatch_times(q, &stamps, a.samples, |cb| {
        selected = p.dispatch(cb, inst.grid, inst.group, &inst.args)?;
        Ok(())
    })?);
    let Selected::Specialized(binding) = selected else {
        return Err(CliError::Check(format!("{}: no variant was selected after priming", s.name)));
    };
    // Results: the same inputs through each, memory compared bit for bit.
    let x = s.instance(dev, a.elements, params, 7)?;
    let y = s.instance(dev, a.elements, params, 7)?;
    run_once(q, generic.va(), &x)?;
    let mut cb = CommandBuffer::new();
    p.dispatch(&mut cb, y.grid, y.group, &y.args)?;
    let v = q.submit(&cb)?;
    q.wait(v, WAIT)?;
    let identical = x.memory()? == y.memory()?;
    let spec_len = p.variant(&binding).map_or(0, |b| b.len());
    Ok(KernelResult { name: s.name, generic_ns, specialized_ns, identical, instructions: (bin.len(), spec_len) })
}

/// p50 from a commit to its event, each with a fresh pipeline holding a partial histogram.
fn commit_to_event(dev: &Device, q: &mut Queue, commits: u32, elements: u32) -> Result<u64, CliError> {
    let mut out = Vec::new();
    let ev = CompletionEvent::new();
    for i in 0..commits {
        let p = Pipeline::new(dev, &samples::FIR.program())?;
        let inst = samples::FIR.instance(dev, elements.min(256), [4 + i % 60, 0], 3)?;
        let mut cb = CommandBuffer::new();
        p.dispatch(&mut cb, inst.grid, inst.group, &inst.args)?;
        let v = q.submit(&cb)?;
        q.wait(v, WAIT)?;
        let t0 = Instant::now();
        dev.set_background_processing_mode(Mode::Allowed, A::CommitResults, Some(&ev), None)?;
        if !ev.wait(Duration::from_secs(60)) {
            return Err(CliError::Check("a commit's completion event was not signalled within 60 s".into()));
        }
        out.push(t0.elapsed().as_nanos() as u64);
        if p.variants().is_empty() {
            return Err(CliError::Check("a commit queued no compile".into()));
        }
    }
    Ok(percentiles(out).0)
}

/// Submit latencies, in batches, until at least `n` samples and `d` have passed.
fn phase(sys: &System, q: &mut Queue, buf: &umd::Buffer, n: u32, d: Duration) -> Result<Vec<u64>, CliError> {
    let start = Instant::now();
    let mut out = Vec::new();
    while out.len() < n as usize || start.elapsed() < d {
        out.extend(latencies(sys, q, buf, 1000, || Ok(()))?);
    }
    Ok(out)
}

/// Keeps the pool's workers busy with compiles of the sample programs while `feeding`, until
/// `stop`.
fn feeder(
    dev: Device,
    stop: Arc<AtomicBool>,
    feeding: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let kernels: Vec<_> = samples::ALL.iter().map(|s| s.program()).collect();
        let mut i = 0u64;
        while !stop.load(Ordering::Relaxed) {
            // Keep about four tasks queued; each compiles a variant (a few hundred µs).
            let s = dev.background().stats();
            if feeding.load(Ordering::Relaxed) && s.queued.saturating_sub(s.returned + s.panicked + s.cancelled) < 4 {
                let k = kernels[(i % 2) as usize].clone();
                let d = done.clone();
                let taps = 8 + (i % 56);
                let _ = dev.background().queue_processing_work(
                    move |_| {
                        for t in 0..8 {
                            let b = runtime::pgo::Binding::new([(2, 4096), (3, taps + t)]);
                            let _ = program::specialize::specialize(&k, &b, Default::default());
                        }
                        d.fetch_add(1, Ordering::Relaxed);
                    },
                    |_| {},
                    (),
                );
                i += 1;
            } else {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    })
}

/// The human-readable table of the kernels' generic and specialized dispatches.
fn print_kernels(kernels: &[KernelResult]) {
    outln!(
        "{:<10} {:>14} {:>16} {:>8} {:>10} {:>12}",
        "kernel",
        "generic p50",
        "specialized p50",
        "speedup",
        "identical",
        "instructions"
    );
    for k in kernels {
        outln!(
            "{:<10} {:>11} ns {:>13} ns {:>8.2} {:>10} {:>5} -> {}",
            k.name,
            k.generic_ns,
            k.specialized_ns,
            k.generic_ns as f64 / k.specialized_ns.max(1) as f64,
            k.identical,
            k.instructions.0,
            k.instructions.1
        );
    }
}

pub fn run(a: PgoArgs) -> Result<(), CliError> {
    let json = a.json;
    progress(json, "measuring the floor: cache-line round trip between two threads");
    let floor = cacheline_rtt_ns();
    let gpu = GpuConfig { idle_period: Duration::from_secs(3600), ..GpuConfig::default() };
    let sys = System::live(SystemConfig { gpu, ..Default::default() })?;
    let port: Arc<dyn KernelPort> = sys.open_process()?;
    let dev = Device::open_with(port, DeviceOptions { developer_mode: true, ..Default::default() })?;
    let ctx = dev.create_context(dev.engine(EngineKind::Compute)?)?;
    let mut q = ctx.create_queue(QueueOptions::user_mode())?;
    q.set_spin(u32::MAX);

    let mut kernels = Vec::new();
    for s in samples::ALL {
        progress(json, &format!("{}: generic, priming, specialized", s.name));
        kernels.push(kernel(&dev, &mut q, &s, &a)?);
    }
    progress(json, "commit to completion event");
    let commit_ns = commit_to_event(&dev, &mut q, a.commits, a.elements)?;

    progress(json, "foreground submit latency, background compiling (default mode) and disabled, alternating");
    let buf = dev.allocate(1 << 16)?;
    latencies(&sys, &mut q, &buf, 500, || Ok(()))?; // warm-up
    let stop = Arc::new(AtomicBool::new(false));
    let feeding = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let f = feeder(dev.clone(), stop.clone(), feeding.clone(), done.clone());
    // Alternate the two conditions, so drift in the machine's load (shared, noisy) falls on
    // both alike.
    let rounds = 10u32;
    let slice = Duration::from_millis(a.phase_ms) / rounds;
    let per = a.submits.div_ceil(rounds);
    let (mut with, mut without) = (Vec::new(), Vec::new());
    let ev = CompletionEvent::new();
    for _ in 0..rounds {
        dev.set_background_processing_mode(Mode::Allowed, A::KeepAll, None, None)?;
        feeding.store(true, Ordering::Relaxed);
        let started = dev.background().stats().started;
        let deadline = Instant::now() + Duration::from_secs(10);
        while dev.background().stats().started < started + 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        with.extend(phase(&sys, &mut q, &buf, per, slice)?);
        // Disable: what was queued finishes first (the commit's event), then nothing runs.
        feeding.store(false, Ordering::Relaxed);
        dev.set_background_processing_mode(Mode::DisableBackgroundWork, A::CommitResults, Some(&ev), None)?;
        if !ev.wait(Duration::from_secs(120)) {
            return Err(CliError::Check("background work did not drain within 120 s".into()));
        }
        without.extend(phase(&sys, &mut q, &buf, per, slice)?);
    }
    stop.store(true, Ordering::Relaxed);
    let _ = f.join();
    let compiles_during = done.load(Ordering::Relaxed);
    let raised = dev.background().stats().raised;
    let (with_p50, with_bg) = percentiles(with);
    let (without_p50, without_bg) = percentiles(without);
    let slowdown = with_bg as f64 / without_bg.max(1) as f64;
    let floor_ns = floor.round() as u64;

    if json {
        let ks: Vec<_> = kernels
            .iter()
            .map(|k| {
                serde_json::json!({
                    "name": k.name,
                    "generic_dispatch_ns": k.generic_ns,
                    "specialized_dispatch_ns": k.specialized_ns,
                    "speedup": k.generic_ns as f64 / k.specialized_ns.max(1) as f64,
                    "results_identical": k.identical,
                    "generic_instructions": k.instructions.0,
                    "specialized_instructions": k.instructions.1,
                })
            })
            .collect();
        let o = serde_json::json!({
            "kernels": ks,
            "commit_to_event_ns": commit_ns,
            "foreground_submit_p99_ns": with_bg,
            "foreground_submit_p99_ns_disabled": without_bg,
            "foreground_slowdown": slowdown,
            "foreground_submit_p50_ns": with_p50,
            "foreground_submit_p50_ns_disabled": without_p50,
            "background_compiles_during": compiles_during,
            "background_tasks_raised": raised,
            "floor_cacheline_rtt_ns": floor_ns,
            "elements": a.elements,
            "samples": a.samples,
            "submits": a.submits,
        });
        outln!("{o}");
    } else {
        outln!(
            "doorbell bench pgo ({} elements, {} dispatches per variant, at least {} submits per condition)",
            a.elements,
            a.samples,
            a.submits
        );
        print_kernels(&kernels);
        outln!("{:<44} {:>9} ns", "commit -> completion event (p50)", commit_ns);
        outln!("{:<44} {:>9} ns", "foreground submit p99, background compiling", with_bg);
        outln!("{:<44} {:>9} ns", "foreground submit p99, background disabled", without_bg);
        outln!("{:<44} {:>9.3}", "foreground slowdown (p99 ratio)", slowdown);
        outln!("{:<44} {:>6} ns / {} ns", "foreground submit p50, compiling / disabled", with_p50, without_p50);
        outln!("{:<44} {:>9}", "background compiles meanwhile", compiles_during);
        outln!("{:<44} {:>9}", "tasks raised by the progress bound", raised);
        outln!("{:<44} {:>9} ns", "floor: cache-line round trip", floor_ns);
    }
    Ok(())
}
