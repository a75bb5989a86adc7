//! Profile-guided specialization on a device (the `Sim` driver): variants never change a
//! result, measurement follows the mode, a pipeline destroyed mid-compile is fine, and spec
//! 004's two workflows converge.

use std::sync::Arc;
use std::time::Duration;

use kernel::{System, SystemConfig};
use proptest::prelude::*;
use runtime::background::{CompletionEvent, MeasurementsAction as A, Mode};
use runtime::pgo::samples::{self, Instance, Sample};
use runtime::pgo::{Binding, JobOutcome, Pipeline, Selected};
use runtime::{Device, DeviceOptions};
use umd::{CommandBuffer, Queue, QueueOptions};

const LONG: Duration = Duration::from_secs(60);

struct Rig {
    _sys: System,
    dev: Device,
    q: Queue,
    _ctx: umd::Context,
}

fn rig(developer_mode: bool) -> Rig {
    rig_with(DeviceOptions { developer_mode, thread_priorities: false, ..Default::default() })
}

fn rig_with(opts: DeviceOptions) -> Rig {
    let sys = System::sim(SystemConfig::default()).unwrap();
    let dev = Device::open_with(sys.open_process().unwrap(), opts).unwrap();
    let ctx = dev.create_context(dev.engine(abi::EngineKind::Compute).unwrap()).unwrap();
    let q = ctx.create_queue(QueueOptions::user_mode()).unwrap();
    Rig { _sys: sys, dev, q, _ctx: ctx }
}

fn submit(r: &mut Rig, cb: &CommandBuffer) {
    let v = r.q.submit(cb).unwrap();
    r.q.wait(v, Some(LONG)).unwrap();
}

/// Dispatches `inst` through the pipeline; returns what it selected.
fn via_pipeline(r: &mut Rig, p: &Pipeline, inst: &Instance) -> Selected {
    let mut cb = CommandBuffer::new();
    let s = p.dispatch(&mut cb, inst.grid, inst.group, &inst.args).unwrap();
    submit(r, &cb);
    s
}

/// The binding of a sample's hot values (`n` and its parameters).
fn hot(s: &Sample, n: u32, params: [u32; 2]) -> Binding {
    match s.name {
        "fir" => Binding::new([(2, n as u64), (3, params[0] as u64)]),
        _ => Binding::new([(1, n as u64), (2, params[0] as u64), (3, params[1] as u64)]),
    }
}

fn params(s: &Sample, a: u32, b: u32) -> [u32; 2] {
    match s.name {
        "fir" => [a % 40, 0],
        _ => [a % 24, b % 3],
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Generic and specialized kernels leave bit-identical memory, for bound values that match
    /// the variant (it runs) and values that do not (the generic kernel runs).
    #[test]
    fn variants_never_change_results(
        which in 0usize..2, n in 1u32..200, a in any::<u32>(), b in any::<u32>(),
        same in any::<bool>(), a2 in any::<u32>(), b2 in any::<u32>(), seed in any::<u64>(),
    ) {
        let s = samples::ALL[which];
        let mut r = rig(false);
        let bound = params(&s, a, b);
        let used = if same { bound } else { params(&s, a2, b2) };
        let kernel = s.program();
        let p = Pipeline::new(&r.dev, &kernel).unwrap();
        prop_assert_eq!(p.compile_job(hot(&s, n, bound)).run(), JobOutcome::Attached);
        // Specialized where it matches.
        let spec = s.instance(&r.dev, n, used, seed).unwrap();
        let selected = via_pipeline(&mut r, &p, &spec);
        prop_assert_eq!(selected == Selected::Specialized(hot(&s, n, bound)), used == bound);
        // The generic kernel on the same inputs.
        let gen_inst = s.instance(&r.dev, n, used, seed).unwrap();
        let generic = r.dev.upload(&kernel.to_bytes()).unwrap();
        let mut cb = CommandBuffer::new();
        cb.dispatch(generic.va(), gen_inst.grid, gen_inst.group, gen_inst.args.va());
        submit(&mut r, &cb);
        prop_assert_eq!(spec.memory().unwrap(), gen_inst.memory().unwrap());
    }
}

#[test]
fn variants_are_shorter_where_it_pays() {
    for s in samples::ALL {
        let k = s.program();
        let v = program::specialize::specialize(&k, &hot(&s, 64, [16, 0]), Default::default()).unwrap();
        let loops = v.decode().iter().filter(|i| i.op == abi::isa::Op::Loop).count();
        assert_eq!(loops, 0, "{}: the argument-bound loop is unrolled:\n{}", s.name, program::disassemble(&v));
        assert_eq!(v.decode().iter().filter(|i| i.op == abi::isa::Op::Break).count(), 0);
    }
    // iterate with op 0: each round is one ffma, and the branch on op is gone.
    let v = program::specialize::specialize(
        &samples::ITERATE.program(),
        &hot(&samples::ITERATE, 64, [16, 0]),
        Default::default(),
    )
    .unwrap();
    let d = v.decode();
    assert_eq!(d.iter().filter(|i| i.op == abi::isa::Op::FFma).count(), 16);
    assert_eq!(d.iter().filter(|i| i.op == abi::isa::Op::FMul).count(), 0);
}

#[test]
fn a_pipeline_destroyed_mid_compile_drops_the_result() {
    let r = rig(false);
    let p = Pipeline::new(&r.dev, &samples::FIR.program()).unwrap();
    let job = p.compile_job(hot(&samples::FIR, 64, [8, 0]));
    let result = job.compile();
    assert!(result.is_ok());
    drop(p); // the application destroys the kernel while the task is between compile and attach
    assert_eq!(job.attach(result), JobOutcome::Dropped);
    assert_eq!(r.dev.pgo().stats().dropped, 1);
    assert_eq!(r.dev.pgo().stats().attached, 0);
}

#[test]
fn a_pipeline_destroyed_while_its_compile_is_queued() {
    let mut r = rig(false);
    // Hold both workers, so the compile waits in the queue.
    let (go, rx) = std::sync::mpsc::channel::<()>();
    let rx = Arc::new(std::sync::Mutex::new(rx));
    for _ in 0..2 {
        let rx = rx.clone();
        let _ = r.dev.background().queue_processing_work(
            move |_| {
                let _ = rx.lock().unwrap().recv_timeout(LONG);
            },
            |_| {},
            (),
        );
    }
    r.dev.set_background_processing_mode(Mode::AllowIntrusiveMeasurements, A::KeepAll, None, None).unwrap();
    let p = Pipeline::new(&r.dev, &samples::FIR.program()).unwrap();
    let inst = samples::FIR.instance(&r.dev, 64, [8, 0], 1).unwrap();
    for _ in 0..r.dev.pgo().config().threshold {
        via_pipeline(&mut r, &p, &inst);
    }
    assert_eq!(r.dev.pgo().stats().queued, 1, "the threshold was reached: a compile is queued");
    drop(p);
    go.send(()).unwrap();
    go.send(()).unwrap();
    let ev = CompletionEvent::new();
    r.dev.set_background_processing_mode(Mode::Allowed, A::CommitResults, Some(&ev), None).unwrap();
    assert!(ev.wait(LONG));
    assert_eq!(r.dev.pgo().stats().dropped, 1, "the compile ran and found its pipeline gone");
}

#[test]
fn measurement_follows_the_mode() {
    let mut r = rig(true);
    let p = Pipeline::new(&r.dev, &samples::FIR.program()).unwrap();
    let inst = samples::FIR.instance(&r.dev, 32, [4, 0], 1).unwrap();
    let every = r.dev.pgo().config().sample_every;
    let measured = |r: &Rig| r.dev.pgo().stats().measured;
    // Allowed: sampled.
    for _ in 0..4 * every {
        via_pipeline(&mut r, &p, &inst);
    }
    assert_eq!(measured(&r), 4);
    // Intrusive: every dispatch.
    r.dev.set_background_processing_mode(Mode::AllowIntrusiveMeasurements, A::KeepAll, None, None).unwrap();
    for _ in 0..10 {
        via_pipeline(&mut r, &p, &inst);
    }
    assert_eq!(measured(&r), 14);
    assert_eq!(p.profile().slots[3].counts, vec![(4, 14)], "taps histogram");
    assert_eq!(
        p.profile().dims.counts,
        vec![(runtime::pgo::Dims { grid: inst.grid, group: inst.group }, 14)],
        "shapes"
    );
    assert!(p.profile().slots[0].counts.is_empty(), "buffer slots are not measured");
    // DisableProfilingBySystem: nothing.
    r.dev.set_background_processing_mode(Mode::DisableProfilingBySystem, A::KeepAll, None, None).unwrap();
    for _ in 0..200 {
        via_pipeline(&mut r, &p, &inst);
    }
    assert_eq!(measured(&r), 14);
    assert_eq!(r.dev.pgo().stats().queued, 0, "no compile queued without a commit");
    // DiscardPrevious forgets.
    r.dev.set_background_processing_mode(Mode::Allowed, A::DiscardPrevious, None, None).unwrap();
    assert_eq!(p.profile().samples, 0);
}

#[test]
fn a_commit_scales_a_partial_histogram_and_signals_when_compiled() {
    let mut r = rig(false);
    let p = Pipeline::new(&r.dev, &samples::ITERATE.program()).unwrap();
    let inst = samples::ITERATE.instance(&r.dev, 100, [12, 0], 3).unwrap();
    for _ in 0..3 {
        assert_eq!(via_pipeline(&mut r, &p, &inst), Selected::Generic);
    }
    assert!(p.profile().samples < r.dev.pgo().config().threshold, "far below the act-now threshold");
    assert!(p.variants().is_empty());
    let ev = CompletionEvent::new();
    let mut further = false;
    r.dev.set_background_processing_mode(Mode::Allowed, A::CommitResults, Some(&ev), Some(&mut further)).unwrap();
    assert!(further, "a compile was queued: measure again with it in place");
    assert!(ev.wait(LONG));
    let dims = runtime::pgo::Dims { grid: inst.grid, group: inst.group };
    assert_eq!(
        p.variants(),
        vec![hot(&samples::ITERATE, 100, [12, 0]).with_dims(Some(dims))],
        "the values and the shape"
    );
    assert!(matches!(via_pipeline(&mut r, &p, &inst), Selected::Specialized(_)));
}

#[test]
fn workflow_benchmark_primes_until_no_further_measurements_are_desired() {
    let mut r = rig(false);
    let fir = Pipeline::new(&r.dev, &samples::FIR.program()).unwrap();
    let it = Pipeline::new(&r.dev, &samples::ITERATE.program()).unwrap();
    let a = samples::FIR.instance(&r.dev, 128, [16, 0], 5).unwrap();
    let b = samples::ITERATE.instance(&r.dev, 128, [20, 1], 6).unwrap();
    r.dev.set_background_processing_mode(Mode::AllowIntrusiveMeasurements, A::DiscardPrevious, None, None).unwrap();
    let mut further = true;
    let mut passes = 0;
    while further {
        passes += 1;
        assert!(passes < 10_000, "the specializer never reached a steady state");
        // RenderFlythroughOfScene.
        for _ in 0..70 {
            via_pipeline(&mut r, &fir, &a);
            via_pipeline(&mut r, &it, &b);
        }
        r.dev
            .set_background_processing_mode(Mode::AllowIntrusiveMeasurements, A::KeepAll, None, Some(&mut further))
            .unwrap();
    }
    assert!(passes >= 2, "the first pass finds something, a later one confirms the steady state");
    // RunTheRealBenchmark: the variants run.
    assert!(matches!(via_pipeline(&mut r, &fir, &a), Selected::Specialized(_)));
    assert!(matches!(via_pipeline(&mut r, &it, &b), Selected::Specialized(_)));
}

#[test]
fn workflow_analysis_tool_trains_commits_high_priority_and_replays() {
    let mut r = rig(true);
    let p = Pipeline::new(&r.dev, &samples::FIR.program()).unwrap();
    let frame = samples::FIR.instance(&r.dev, 96, [24, 0], 9).unwrap();
    let handle = CompletionEvent::new();
    let mut want_more = true;
    let mut tries = 0;
    while want_more && tries < 8 {
        let action = if tries == 0 { A::DiscardPrevious } else { A::KeepAll };
        r.dev.set_background_processing_mode(Mode::AllowIntrusiveMeasurements, action, None, None).unwrap();
        // PlayBackCapturedFrame: a single frame, far fewer dispatches than the threshold.
        for _ in 0..3 {
            via_pipeline(&mut r, &p, &frame);
        }
        r.dev
            .set_background_processing_mode(
                Mode::DisableProfilingBySystem,
                A::CommitResultsHighPriority,
                Some(&handle),
                Some(&mut want_more),
            )
            .unwrap();
        assert!(handle.wait(LONG));
        tries += 1;
    }
    assert_eq!(tries, 2, "one pass to commit, one to find nothing new");
    assert!(!want_more);
    // The A/B replay: the committed variant runs, and nothing is measured.
    let before = r.dev.pgo().stats().measured;
    assert!(matches!(via_pipeline(&mut r, &p, &frame), Selected::Specialized(_)));
    assert_eq!(r.dev.pgo().stats().measured, before);
    // The disable took effect after the commit: a new task is cancelled.
    assert!(matches!(
        r.dev.background().queue_processing_work(|_| {}, |_| {}, ()),
        runtime::background::Queued::Cancelled(runtime::background::CancelReason::Disabled)
    ));
}

#[test]
fn further_measurements_are_desired_while_a_kernel_is_short_of_the_threshold() {
    let mut r = rig(false);
    let p = Pipeline::new(&r.dev, &samples::FIR.program()).unwrap();
    let inst = samples::FIR.instance(&r.dev, 32, [6, 0], 2).unwrap();
    r.dev.set_background_processing_mode(Mode::AllowIntrusiveMeasurements, A::DiscardPrevious, None, None).unwrap();
    let threshold = r.dev.pgo().config().threshold;
    let mut further = false;
    // Passes of 8 dispatches: not judged until the threshold is reached.
    for pass in 1..=threshold / 8 - 1 {
        for _ in 0..8 {
            via_pipeline(&mut r, &p, &inst);
        }
        r.dev
            .set_background_processing_mode(Mode::AllowIntrusiveMeasurements, A::KeepAll, None, Some(&mut further))
            .unwrap();
        assert!(further, "pass {pass}: only {} of {threshold} samples", 8 * pass);
        assert_eq!(r.dev.pgo().stats().queued, 0);
    }
    for _ in 0..8 {
        via_pipeline(&mut r, &p, &inst);
    }
    assert_eq!(r.dev.pgo().stats().queued, 1, "the threshold is reached: the compile is queued");
    // A pass with nothing measured does not change the answer.
    r.dev
        .set_background_processing_mode(Mode::AllowIntrusiveMeasurements, A::KeepAll, None, Some(&mut further))
        .unwrap();
    assert!(further);
}

#[test]
fn a_umd_without_the_feature_measures_nothing() {
    let mut r =
        rig_with(DeviceOptions { background_processing: false, thread_priorities: false, ..Default::default() });
    r.dev.set_background_processing_mode(Mode::AllowIntrusiveMeasurements, A::KeepAll, None, None).unwrap();
    let p = Pipeline::new(&r.dev, &samples::FIR.program()).unwrap();
    let inst = samples::FIR.instance(&r.dev, 32, [4, 0], 1).unwrap();
    for _ in 0..100 {
        assert_eq!(via_pipeline(&mut r, &p, &inst), Selected::Generic);
    }
    assert_eq!(r.dev.pgo().stats(), runtime::pgo::PgoStats::default());
    assert_eq!(r.dev.background().threads(), 0, "no pool was ever started");
}
