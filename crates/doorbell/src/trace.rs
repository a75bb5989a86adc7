//! `doorbell trace OUT.json`: a fence workload as a GPUView-style timeline.
//!
//! Three user-mode queues on two engines form a pipeline: a producer signals fence `F`, a
//! middle stage waits on `F` and signals `G`, a consumer waits on `G`. Every fence operation is
//! logged. The trace has one track per queue, and for every signal or wait a box from when
//! the UMD queued it (CPU time, recorded at submission — spec 002's "fence queued" event) to
//! when the engine executed it (GPU time, from the queue's fence log). Both clocks are the
//! device clock, so the boxes line up. Fence-log tracing is on, so the logs are the OS's
//! traced size and hold every round. The output is Chrome trace-event JSON, which
//! ui.perfetto.dev and chrome://tracing open.
//!
//! The producer also dispatches a sample kernel through a `runtime::pgo::Pipeline`, measured in
//! `AllowIntrusiveMeasurements`; halfway through, a `CommitResults` has the runtime compile
//! its specialized variant in the background. Every background task's run (spec 004's start
//! and finish events) is a box on a track of its own per pool worker, on the same clock.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use abi::EngineKind;
use abi::fence_log::{FenceLogOp, FenceLogType};
use abi::port::{KernelPort, NativeFenceType};
use clap::Args;
use kernel::{System, SystemConfig};
use runtime::Device;
use runtime::background::TaskSpan;
use serde_json::json;
use umd::{CommandBuffer, NativeFence, Queue, QueueOptions};

use crate::{CliError, num};

/// Arguments of `doorbell trace`.
#[derive(Args)]
pub struct TraceArgs {
    /// Where to write the trace JSON.
    out: PathBuf,
    /// Rounds of the pipeline (each logs a signal or a wait on every queue). At most 320: the
    /// trace turns fence-log tracing on, so each log holds 340 entries and none overruns
    /// before it is read.
    #[arg(long, default_value_t = 20, value_parser = num::within(1u32, 320))]
    rounds: u32,
}

/// One logged operation as the UMD queued it.
struct Queued {
    queue: usize,
    log: FenceLogType,
    name: String,
    at_ns: u64,
}

pub fn run(a: TraceArgs) -> Result<(), CliError> {
    let sys = System::live(SystemConfig::default())?;
    // Spec 002: "when tracing is enabled, the OS first increases the size of the log buffer".
    sys.set_fence_log_tracing(true)?;
    let port: Arc<dyn KernelPort> = sys.open_process()?;
    let pid = port.process();
    let dev = Device::open(port)?;
    let compute = dev.create_context(dev.engine(EngineKind::Compute)?)?;
    let copy = dev.create_context(dev.engine(EngineKind::Copy)?)?;
    let f = dev.create_fence(0, NativeFenceType::Default)?;
    let g = dev.create_fence(0, NativeFenceType::Default)?;
    let buf = dev.allocate(1 << 20)?;
    let mut queues: Vec<(String, Queue)> = vec![
        ("producer (compute)".into(), compute.create_queue(QueueOptions::user_mode())?),
        ("middle (copy)".into(), copy.create_queue(QueueOptions::user_mode())?),
        ("consumer (compute)".into(), compute.create_queue(QueueOptions::user_mode())?),
    ];
    let mut queued: Vec<Queued> = Vec::new();
    let mut last = [0u64; 3];
    // Background work: a kernel measured on every dispatch, committed halfway.
    let pipeline = runtime::pgo::Pipeline::new(&dev, &runtime::pgo::samples::FIR.program())?;
    let fir = runtime::pgo::samples::FIR.instance(&dev, 256, [16, 0], 1)?;
    dev.set_background_processing_mode(
        runtime::background::Mode::AllowIntrusiveMeasurements,
        runtime::background::MeasurementsAction::DiscardPrevious,
        None,
        None,
    )?;
    let committed = runtime::background::CompletionEvent::new();
    let note = |queued: &mut Vec<Queued>, queue: usize, log, name: String| {
        queued.push(Queued { queue, log, name, at_ns: sys.now().as_nanos() });
    };
    for r in 1..=a.rounds as u64 {
        // Producer: some copying, then signal F = r.
        let mut cb = CommandBuffer::new();
        pipeline.dispatch(&mut cb, fir.grid, fir.group, &fir.args)?;
        if r == (a.rounds as u64).div_ceil(2) {
            dev.set_background_processing_mode(
                runtime::background::Mode::Allowed,
                runtime::background::MeasurementsAction::CommitResults,
                Some(&committed),
                None,
            )?;
        }
        cb.fill(buf.va(), 64 * 1024, r as u32).signal_fence_logged(&f, r);
        note(&mut queued, 0, FenceLogType::Signal, format!("signal F={r}"));
        last[0] = queues[0].1.submit(&cb)?;
        // Middle: wait F = r, copy, signal G = r.
        let mut cb = CommandBuffer::new();
        cb.wait_fence_logged(&f, r).copy(buf.va(), buf.va() + (512 << 10), 64 * 1024).signal_fence_logged(&g, r);
        note(&mut queued, 1, FenceLogType::Wait, format!("wait F={r}"));
        note(&mut queued, 1, FenceLogType::Signal, format!("signal G={r}"));
        last[1] = queues[1].1.submit(&cb)?;
        // Consumer: wait G = r.
        let mut cb = CommandBuffer::new();
        cb.wait_fence_logged(&g, r).write_u32(buf.va() + (1 << 20) - 4, r as u32);
        note(&mut queued, 2, FenceLogType::Wait, format!("wait G={r}"));
        last[2] = queues[2].1.submit(&cb)?;
        std::thread::sleep(Duration::from_micros(200));
    }
    for (i, (_, q)) in queues.iter_mut().enumerate() {
        q.wait(last[i], Some(Duration::from_secs(30)))?;
    }
    check_done(&f, &g, a.rounds as u64)?;
    if !committed.wait(Duration::from_secs(30)) {
        return Err(CliError::Check("the background compile's commit did not complete".into()));
    }
    // The runtime's clock (an Instant epoch) against the device clock, read back to back.
    let rt = dev.background();
    let offset = sys.now().as_nanos() as i128 - rt.epoch().elapsed().as_nanos() as i128;
    let spans = rt.spans();

    // Match queued operations with log entries, per queue and log, in order.
    let mut events = Vec::new();
    for (i, (name, q)) in queues.iter().enumerate() {
        events.push(json!({"ph": "M", "name": "thread_name", "pid": 1, "tid": i, "args": {"name": format!("{name} {}", q.handle())}}));
        for log in [FenceLogType::Signal, FenceLogType::Wait] {
            let read = sys.read_fence_log(pid, q.handle(), log, 0)?;
            let ours: Vec<&Queued> = queued.iter().filter(|e| e.queue == i && e.log == log).collect();
            for (op, e) in ours.iter().zip(&read.entries) {
                let signal = e.operation == FenceLogOp::SignalExecuted as u32;
                let end = e.end_timestamp;
                events.push(json!({
                    "ph": "X",
                    "name": op.name,
                    "cat": if signal { "signal" } else { "wait" },
                    "cname": if signal { "bad" } else { "terrible" },
                    "pid": 1,
                    "tid": i,
                    "ts": op.at_ns as f64 / 1000.0,
                    "dur": end.saturating_sub(op.at_ns) as f64 / 1000.0,
                    "args": {
                        "fence": e.fence_handle,
                        "value": e.fence_value,
                        "queued_ns": op.at_ns,
                        "observed_gpu_ns": e.observed_timestamp,
                        "end_gpu_ns": end,
                    },
                }));
            }
        }
    }
    background_events(&mut events, &spans, offset);
    events.push(json!({"ph": "M", "name": "process_name", "pid": 1, "args": {"name": format!("doorbell {pid}")}}));
    let boxes = events.iter().filter(|e| e["ph"] == "X" && e["cat"] != "background").count();
    let doc = json!({"traceEvents": events, "displayTimeUnit": "ns"});
    std::fs::write(&a.out, serde_json::to_string_pretty(&doc).map_err(|e| CliError::Input(e.to_string()))?)
        .map_err(|e| CliError::Input(format!("cannot write {}: {e}", a.out.display())))?;
    outln!(
        "wrote {}: {} queues, {boxes} signal/wait boxes over {} rounds, {} background task(s); open it in ui.perfetto.dev",
        a.out.display(),
        queues.len(),
        a.rounds,
        spans.len()
    );
    Ok(())
}

/// The background tasks' runs as trace events: a track per pool worker (tid 100 + worker)
/// and a box per run, moved onto the device clock by `offset` (ns, device minus runtime).
fn background_events(events: &mut Vec<serde_json::Value>, spans: &[TaskSpan], offset: i128) {
    let mut workers: Vec<u32> = spans.iter().map(|s| s.worker).collect();
    workers.sort_unstable();
    workers.dedup();
    for w in &workers {
        let name = format!("background worker {w} (runtime pool)");
        events.push(json!({"ph": "M", "name": "thread_name", "pid": 1, "tid": 100 + w, "args": {"name": name}}));
    }
    for s in spans {
        let at = |ns: u64| (ns as i128 + offset).max(0) as f64 / 1000.0;
        events.push(json!({
            "ph": "X",
            "name": format!("background task {}", s.task.0),
            "cat": "background",
            "pid": 1,
            "tid": 100 + s.worker,
            "ts": at(s.start_ns),
            "dur": (s.end_ns - s.start_ns) as f64 / 1000.0,
            "args": {"task": s.task.0, "class": format!("{:?}", s.class), "panicked": s.panicked},
        }));
    }
}

fn check_done(f: &NativeFence, g: &NativeFence, rounds: u64) -> Result<(), CliError> {
    if f.value()? != rounds || g.value()? != rounds {
        return Err(CliError::Check("the pipeline did not reach its last round".into()));
    }
    Ok(())
}
