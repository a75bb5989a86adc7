//! `doorbell demo`'s background-processing step (spec 004): a developer-mode process runs the
//! spec's two workflows on the live system — a benchmark priming the specializer until no
//! further measurements are desired, and an analysis tool training on one captured frame,
//! locking down with `DisableProfilingBySystem` + `CommitResultsHighPriority`, waiting on
//! the completion event and replaying — and checks that the variants run and change no
//! result.

use std::time::Duration;

use abi::EngineKind;
use kernel::System;
use runtime::background::CompletionEvent;
use runtime::pgo::samples::{self, Instance, Sample};
use runtime::pgo::{Pipeline, Selected, workflow};
use runtime::{Device, DeviceOptions};
use umd::{CommandBuffer, Queue, QueueOptions};

use crate::CliError;

const WAIT: Option<Duration> = Some(Duration::from_secs(10));

fn dispatch(q: &mut Queue, p: &Pipeline, inst: &Instance, times: u32) -> Result<Selected, CliError> {
    let mut cb = CommandBuffer::new();
    let mut sel = Selected::Generic;
    for _ in 0..times {
        sel = p.dispatch(&mut cb, inst.grid, inst.group, &inst.args)?;
    }
    let v = q.submit(&cb)?;
    q.wait(v, WAIT)?;
    Ok(sel)
}

/// Runs `s` through the pipeline and through its generic kernel on equal inputs; whether the
/// memory is identical.
fn identical(
    dev: &Device,
    q: &mut Queue,
    p: &Pipeline,
    s: &Sample,
    n: u32,
    params: [u32; 2],
) -> Result<bool, CliError> {
    let x = s.instance(dev, n, params, 11)?;
    let y = s.instance(dev, n, params, 11)?;
    if !matches!(dispatch(q, p, &x, 1)?, Selected::Specialized(_)) {
        return Err(CliError::Check(format!("{}: the variant was not selected", s.name)));
    }
    let generic = dev.upload(&p.program().to_bytes())?;
    let mut cb = CommandBuffer::new();
    cb.dispatch(generic.va(), y.grid, y.group, y.args.va());
    let v = q.submit(&cb)?;
    q.wait(v, WAIT)?;
    Ok(x.memory()? == y.memory()?)
}

/// The step: what to say, and how many results it checked.
pub fn run(sys: &System) -> Result<(Vec<String>, u32), CliError> {
    let mut say = vec!["\n== background processing (spec 004): profile-guided specialization ==".to_string()];
    let dev = Device::open_with(sys.open_process()?, DeviceOptions { developer_mode: true, ..Default::default() })?;
    let ctx = dev.create_context(dev.engine(EngineKind::Compute)?)?;
    let mut q = ctx.create_queue(QueueOptions::user_mode())?;
    say.push(format!(
        "process {} opened in developer mode; BackgroundProcessingSupported = {}",
        dev.port().process(),
        dev.feature_support().background_processing_supported
    ));

    // Workflow 1: a benchmark primes the optimization state, then runs for real.
    let fir = Pipeline::new(&dev, &samples::FIR.program())?;
    let scene = samples::FIR.instance(&dev, 512, [24, 0], 1)?;
    let primed = workflow::prime(&dev, 1_000, || dispatch(&mut q, &fir, &scene, 16).map(|_| ()))?;
    if !primed.steady {
        return Err(CliError::Check("the benchmark workflow did not converge in 1000 passes".into()));
    }
    let same = identical(&dev, &mut q, &fir, &samples::FIR, 512, [24, 0])?;
    let b = fir.variants().first().cloned().unwrap_or_default();
    say.push(format!(
        "benchmark: AllowIntrusiveMeasurements until FurtherMeasurementsDesired = false: {} pass(es); \
         fir (taps = 24) specialized for slots {:?}{}: {} -> {} instructions; results identical: {same}",
        primed.passes,
        b.pairs(),
        b.dims().map(|d| format!(" and grid {:?} x group {:?}", d.grid, d.group)).unwrap_or_default(),
        fir.program().len(),
        fir.variant(&b).map_or(0, |v| v.len())
    ));
    if !same {
        return Err(CliError::Check("fir: the variant changed a result".into()));
    }

    // Workflow 2: an analysis tool trains on one captured frame and locks everything down.
    let it = Pipeline::new(&dev, &samples::ITERATE.program())?;
    let frame = samples::ITERATE.instance(&dev, 512, [20, 0], 2)?;
    let handle = CompletionEvent::new();
    let locked = workflow::train_and_lock(&dev, 8, &handle, Duration::from_secs(10), || {
        dispatch(&mut q, &it, &frame, 2).map(|_| ())
    })?;
    if !locked.steady {
        return Err(CliError::Check("the analysis-tool workflow did not converge in 8 passes".into()));
    }
    let measured = dev.pgo().stats().measured;
    let same = identical(&dev, &mut q, &it, &samples::ITERATE, 512, [20, 0])?;
    if dev.pgo().stats().measured != measured {
        return Err(CliError::Check("DisableProfilingBySystem measured a dispatch".into()));
    }
    say.push(format!(
        "analysis tool: DisableProfilingBySystem + CommitResultsHighPriority, waited on the event: {} pass(es) \
         of a 2-dispatch frame (histograms scaled up); the replay runs iterate's variant, measures nothing, \
         results identical: {same}",
        locked.passes
    ));
    if !same {
        return Err(CliError::Check("iterate: the variant changed a result".into()));
    }
    let st = dev.background().stats();
    say.push(format!(
        "runtime: {} task(s) queued, {} ran, {} cancelled, {} panicked, on {} pool thread(s)",
        st.queued,
        st.returned + st.panicked,
        st.cancelled,
        st.panicked,
        dev.background().threads()
    ));
    Ok((say, 2))
}
