//! The background runtime (spec 004): the state machine under random interleavings
//! (exactly once), and the threaded pool's guarantees, observed through events and counters,
//! never through timing.

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use runtime::background::machine::{Admission, Config, Outcome, Output, TaskId, ThreadClass, WorkQueue};
use runtime::background::{
    CancelReason, CompletionEvent, MeasurementsAction, Mode, ModeError, ModeRequest, Queued, Runtime,
};

/// Generous: a threaded test waits on an event, and only a broken runtime makes it wait long.
const LONG: Duration = Duration::from_secs(60);

#[derive(Clone, Debug)]
enum Step {
    Queue,
    Start,
    Finish(usize, bool),
    SetMode(u32, u32),
    Timeout(u64),
    Destroy,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => Just(Step::Queue),
        3 => Just(Step::Start),
        3 => (any::<usize>(), any::<bool>()).prop_map(|(i, p)| Step::Finish(i, p)),
        2 => (0u32..4, 0u32..4).prop_map(|(m, a)| Step::SetMode(m, a)),
        1 => (0u64..300).prop_map(Step::Timeout),
        1 => Just(Step::Destroy),
    ]
}

/// What happened to each task, as a driver would see it.
#[derive(Default)]
struct Ledger {
    ran: HashMap<TaskId, u32>,
    cancelled: HashMap<TaskId, u32>,
    refused: u32,
    admitted: Vec<TaskId>,
    running: Vec<TaskId>,
    commits: HashMap<u64, Vec<TaskId>>,
    done_commits: Vec<u64>,
}

fn drain(q: &mut WorkQueue, l: &mut Ledger) {
    while let Some(o) = q.poll_output() {
        match o {
            Output::Cancel { task, .. } => *l.cancelled.entry(task).or_default() += 1,
            Output::CommitDone(c) => l.done_commits.push(c.0),
            Output::Raise { task, .. } => assert!(l.running.contains(&task), "raised a task that is not running"),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Every admitted task is run or cancelled exactly once; commits complete exactly when
    /// their tasks have all left; at most the limit run at once; start order is FIFO.
    #[test]
    fn exactly_once_under_random_interleavings(steps in prop::collection::vec(step(), 1..80)) {
        let t0 = Instant::now();
        let cfg = Config::default();
        let mut q = WorkQueue::new(cfg);
        let mut l = Ledger::default();
        let mut now = t0;
        let mut last_started: Option<TaskId> = None;
        for s in steps {
            match s {
                Step::Queue => match q.handle_queue(now) {
                    Admission::Queued(t) => l.admitted.push(t),
                    Admission::Cancel(_) => l.refused += 1,
                },
                Step::Start => {
                    if let Some(st) = q.poll_start(now) {
                        prop_assert!(last_started.is_none_or(|p| p < st.task), "FIFO");
                        last_started = Some(st.task);
                        l.running.push(st.task);
                        prop_assert!(l.running.len() <= q.limit());
                    }
                }
                Step::Finish(i, panicked) => {
                    if !l.running.is_empty() {
                        let t = l.running.remove(i % l.running.len());
                        *l.ran.entry(t).or_default() += 1;
                        let outcome = if panicked { Outcome::Panicked } else { Outcome::Returned };
                        prop_assert!(q.handle_finished(t, outcome));
                    }
                }
                Step::SetMode(m, a) => {
                    if let Ok(req) = ModeRequest::from_raw(m, a, false, true) {
                        q.begin_mode_change(req);
                        if let Some(c) = q.finish_mode_change() {
                            let mut set: Vec<TaskId> = l.admitted.iter().copied()
                                .filter(|t| !l.ran.contains_key(t) && !l.cancelled.contains_key(t)).collect();
                            set.sort();
                            l.commits.insert(c.0, set);
                        }
                    }
                }
                Step::Timeout(ms) => {
                    now += Duration::from_millis(ms);
                    q.handle_timeout(now);
                }
                Step::Destroy => q.handle_destroy(),
            }
            drain(&mut q, &mut l);
            // A commit is done exactly when none of its tasks is left.
            for (c, set) in &l.commits {
                let left = set.iter().any(|t| !l.ran.contains_key(t) && !l.cancelled.contains_key(t));
                let done = l.done_commits.iter().filter(|d| *d == c).count();
                prop_assert_eq!(done, usize::from(!left), "commit {} with tasks left: {}", c, left);
            }
        }
        // Destruction: cancel the rest, let running ones finish.
        q.handle_destroy();
        drain(&mut q, &mut l);
        for t in std::mem::take(&mut l.running) {
            *l.ran.entry(t).or_default() += 1;
            q.handle_finished(t, Outcome::Returned);
        }
        drain(&mut q, &mut l);
        prop_assert!(q.is_drained());
        for t in &l.admitted {
            let r = l.ran.get(t).copied().unwrap_or(0);
            let c = l.cancelled.get(t).copied().unwrap_or(0);
            prop_assert_eq!(r + c, 1, "task {:?}: ran {} times, cancelled {} times", t, r, c);
        }
        let s = q.stats();
        prop_assert_eq!(s.queued, l.admitted.len() as u64);
        prop_assert_eq!(s.cancelled, l.refused as u64 + l.cancelled.len() as u64);
        for c in l.commits.keys() {
            prop_assert_eq!(l.done_commits.iter().filter(|d| *d == c).count(), 1);
        }
    }
}

/// A task that runs only when the test says so (a gate), and tells when it starts.
fn gated(rt: &Runtime, log: &Arc<Mutex<Vec<String>>>, name: &str) -> (mpsc::Sender<()>, mpsc::Receiver<()>) {
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (started_tx, started_rx) = mpsc::channel::<()>();
    let (l1, l2) = (log.clone(), log.clone());
    let (n1, n2) = (name.to_string(), name.to_string());
    let q = rt.queue_processing_work(
        move |rx: mpsc::Receiver<()>| {
            let _ = started_tx.send(());
            let _ = rx.recv_timeout(LONG);
            l1.lock().unwrap().push(format!("ran {n1}"));
        },
        move |_| l2.lock().unwrap().push(format!("cancelled {n2}")),
        go_rx,
    );
    assert!(matches!(q, Queued::Accepted(_)));
    (go_tx, started_rx)
}

/// Runs `destroy` on another thread while two gated tasks run: it must cancel `cancels`
/// queued tasks at once yet wait for the running ones (released through `gates` only after
/// the cancels are seen). Returns the sorted log.
fn destroy_while_two_run(
    destroy: impl FnOnce() + Send + 'static,
    log: &Arc<Mutex<Vec<String>>>,
    gates: [mpsc::Sender<()>; 2],
    cancels: usize,
) -> Vec<String> {
    let (done_tx, done_rx) = mpsc::channel();
    let destroyer = std::thread::spawn(move || {
        destroy();
        done_tx.send(()).unwrap();
    });
    let deadline = Instant::now() + LONG;
    while log.lock().unwrap().iter().filter(|l| l.starts_with("cancelled")).count() < cancels {
        assert!(Instant::now() < deadline, "the queued tasks were not cancelled");
        std::thread::yield_now();
    }
    assert!(done_rx.try_recv().is_err(), "destruction must wait for running tasks");
    for g in gates {
        g.send(()).unwrap();
    }
    done_rx.recv_timeout(LONG).unwrap();
    destroyer.join().unwrap();
    let mut log = log.lock().unwrap().clone();
    log.sort();
    log
}

#[test]
fn pool_starts_lazily_runs_two_at_a_time_in_order() {
    let rt = Runtime::without_priorities(Config::default());
    assert_eq!(rt.threads(), 0, "no thread before the first task");
    let log = Arc::new(Mutex::new(Vec::new()));
    let (g1, s1) = gated(&rt, &log, "a");
    let (g2, s2) = gated(&rt, &log, "b");
    let (g3, s3) = gated(&rt, &log, "c");
    s1.recv_timeout(LONG).unwrap();
    s2.recv_timeout(LONG).unwrap();
    assert!(s3.try_recv().is_err(), "a third task must not start while two run");
    assert_eq!(rt.stats().started, 2);
    g1.send(()).unwrap();
    s3.recv_timeout(LONG).unwrap();
    g2.send(()).unwrap();
    g3.send(()).unwrap();
    rt.shutdown();
    let log = log.lock().unwrap();
    assert_eq!(log.len(), 3);
    assert_eq!(log[0], "ran a");
    assert!(rt.threads() <= 2);
}

#[test]
fn disabled_queue_cancels_on_the_calling_thread() {
    let rt = Runtime::without_priorities(Config::default());
    rt.set_mode(
        ModeRequest::new(Mode::DisableBackgroundWork, MeasurementsAction::KeepAll, false, true).unwrap(),
        None,
        || (),
    );
    let me = std::thread::current().id();
    let on = Arc::new(Mutex::new(None));
    let on2 = on.clone();
    let q = rt.queue_processing_work(
        |_| panic!("must not run"),
        move |_| *on2.lock().unwrap() = Some(std::thread::current().id()),
        (),
    );
    assert_eq!(q, Queued::Cancelled(CancelReason::Disabled));
    assert_eq!(*on.lock().unwrap(), Some(me), "cancel ran on the caller's thread, before returning");
    assert_eq!(rt.threads(), 0);
}

#[test]
fn commit_signals_its_event_after_its_tasks_and_a_disable_after_commit_runs_generated_tasks() {
    let rt = Runtime::without_priorities(Config::default());
    let log = Arc::new(Mutex::new(Vec::new()));
    let (g1, s1) = gated(&rt, &log, "before");
    s1.recv_timeout(LONG).unwrap();
    let ev = CompletionEvent::new();
    let req = ModeRequest::new(Mode::DisableBackgroundWork, MeasurementsAction::CommitResults, true, true).unwrap();
    let log2 = log.clone();
    // The DDI generates a task during the call: it is admitted and part of the commit.
    let generated = rt.set_mode(req, Some(&ev), || {
        let l = log2.clone();
        rt.queue_processing_work(move |_| l.lock().unwrap().push("ran generated".into()), |_| {}, ())
    });
    assert!(matches!(generated, Queued::Accepted(_)));
    // After the call, the disable is in force.
    let after = rt.queue_processing_work(|_| {}, |_| {}, ());
    assert_eq!(after, Queued::Cancelled(CancelReason::Disabled));
    assert!(!ev.is_signalled(), "a task of the commit is still running");
    g1.send(()).unwrap();
    assert!(ev.wait(LONG), "the commit's event is signalled once its tasks are done");
    let log = log.lock().unwrap();
    assert!(log.contains(&"ran before".to_string()) && log.contains(&"ran generated".to_string()), "{log:?}");
}

#[test]
fn a_panicking_callback_is_reported_and_the_pool_survives() {
    let rt = Runtime::without_priorities(Config::default());
    rt.queue_processing_work(|_| panic!("compiler bug"), |_| {}, ());
    let (tx, rx) = mpsc::channel();
    rt.queue_processing_work(move |_| tx.send(7).unwrap(), |_| {}, ());
    assert_eq!(rx.recv_timeout(LONG), Ok(7));
    let ev = CompletionEvent::new();
    rt.set_mode(
        ModeRequest::new(Mode::Allowed, MeasurementsAction::CommitResults, true, false).unwrap(),
        Some(&ev),
        || (),
    );
    assert!(ev.wait(LONG));
    assert_eq!(rt.stats().panicked, 1);
    let p = rt.panics();
    assert_eq!(p.len(), 1);
    assert!(p[0].contains("compiler bug"), "{p:?}");
    assert!(rt.spans().iter().any(|s| s.panicked));
}

#[test]
fn destruction_lets_running_finish_cancels_queued_and_waits() {
    let rt = Arc::new(Runtime::without_priorities(Config::default()));
    let log = Arc::new(Mutex::new(Vec::new()));
    let (g1, s1) = gated(&rt, &log, "a");
    let (g2, s2) = gated(&rt, &log, "b");
    let (_g3, _s3) = gated(&rt, &log, "c");
    let (_g4, _s4) = gated(&rt, &log, "d");
    s1.recv_timeout(LONG).unwrap();
    s2.recv_timeout(LONG).unwrap();
    let rt2 = rt.clone();
    let log = destroy_while_two_run(move || rt2.shutdown(), &log, [g1, g2], 2);
    assert_eq!(log, vec!["cancelled c", "cancelled d", "ran a", "ran b"]);
    // After destruction, queuing cancels.
    assert_eq!(rt.queue_processing_work(|_| {}, |_| {}, ()), Queued::Cancelled(CancelReason::Destroyed));
}

/// Whether a task queued on `rt` finds its thread at `SCHED_IDLE`.
fn runs_idle(rt: &Runtime) -> bool {
    let (tx, rx) = mpsc::channel();
    rt.queue_processing_work(
        move |_| {
            let tid = shm::sched::current_tid();
            tx.send(shm::sched::thread_policy(tid).map(shm::sched::is_idle_policy)).unwrap();
        },
        |_| {},
        (),
    );
    rx.recv_timeout(LONG).unwrap().unwrap()
}

#[test]
fn workers_run_at_sched_idle_by_default() {
    let rt = Runtime::new(Config::default());
    assert!(runs_idle(&rt), "a background task runs at SCHED_IDLE");
    rt.shutdown();
    assert_eq!(rt.spans()[0].class, ThreadClass::Idle);
}

#[test]
fn device_mode_refusals_name_the_field_and_change_nothing() {
    let sys = kernel::System::sim(kernel::SystemConfig::default()).unwrap();
    let retail = runtime::Device::open(sys.open_process().unwrap()).unwrap();
    assert!(retail.feature_support().background_processing_supported);
    let ev = CompletionEvent::new();
    assert_eq!(
        retail.set_background_processing_mode(Mode::DisableBackgroundWork, MeasurementsAction::KeepAll, None, None),
        Err(ModeError::ModeNeedsDeveloperMode { mode: Mode::DisableBackgroundWork })
    );
    assert_eq!(
        retail.set_background_processing_mode(
            Mode::Allowed,
            MeasurementsAction::CommitResultsHighPriority,
            Some(&ev),
            None
        ),
        Err(ModeError::ActionNeedsDeveloperMode { action: MeasurementsAction::CommitResultsHighPriority })
    );
    assert_eq!(
        retail.set_background_processing_mode(Mode::Allowed, MeasurementsAction::KeepAll, Some(&ev), None),
        Err(ModeError::EventWithoutCommit { action: MeasurementsAction::KeepAll })
    );
    assert_eq!(retail.set_background_processing_mode_raw(9, 0, None, None), Err(ModeError::BadMode { value: 9 }));
    assert_eq!(retail.set_background_processing_mode_raw(0, 5, None, None), Err(ModeError::BadAction { value: 5 }));
    assert_eq!(retail.background().mode(), Mode::Allowed, "nothing changed");
    // Allowed everywhere.
    retail
        .set_background_processing_mode(
            Mode::AllowIntrusiveMeasurements,
            MeasurementsAction::DiscardPrevious,
            None,
            None,
        )
        .unwrap();
    retail.set_background_processing_mode(Mode::Allowed, MeasurementsAction::CommitResults, Some(&ev), None).unwrap();
    assert!(ev.wait(LONG));
    // A UMD without the feature: a benign no-op that reports no further measurements.
    let plain = runtime::Device::open_with(
        sys.open_process().unwrap(),
        runtime::DeviceOptions { background_processing: false, ..Default::default() },
    )
    .unwrap();
    assert!(!plain.feature_support().background_processing_supported);
    let mut further = true;
    plain
        .set_background_processing_mode(
            Mode::AllowIntrusiveMeasurements,
            MeasurementsAction::KeepAll,
            None,
            Some(&mut further),
        )
        .unwrap();
    assert!(!further);
}

#[test]
fn a_task_past_the_progress_bound_runs_at_the_lowest_normal_priority() {
    // A bound of zero: every task has waited "too long" by the time it starts.
    let rt = Runtime::new(Config { progress_bound: Duration::ZERO, ..Config::default() });
    let idle = runs_idle(&rt);
    rt.shutdown();
    assert_eq!(rt.spans()[0].class, ThreadClass::Low);
    // The thread left SCHED_IDLE, unless the OS refused (no CAP_SYS_NICE), which is counted.
    assert!(!idle || rt.refused_raises() > 0);
}

#[test]
fn dropping_the_device_runs_or_cancels_every_task_before_it_goes() {
    let sys = kernel::System::sim(kernel::SystemConfig::default()).unwrap();
    let dev = runtime::Device::open(sys.open_process().unwrap()).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let (g1, s1) = gated(dev.background(), &log, "a");
    let (g2, s2) = gated(dev.background(), &log, "b");
    let (_g3, _s3) = gated(dev.background(), &log, "c");
    s1.recv_timeout(LONG).unwrap();
    s2.recv_timeout(LONG).unwrap();
    let log = destroy_while_two_run(move || drop(dev), &log, [g1, g2], 1);
    assert_eq!(log, vec!["cancelled c", "ran a", "ran b"]);
}

#[derive(Clone, Debug)]
enum Op {
    Queue,
    Panic,
    Mode(u32, u32),
    Commit(bool),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => Just(Op::Queue),
        1 => Just(Op::Panic),
        2 => (0u32..4, 0u32..4).prop_map(|(m, a)| Op::Mode(m, a)),
        1 => any::<bool>().prop_map(Op::Commit),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// The threaded runtime: whatever the interleaving its threads produce, every task's
    /// callback or cancel is called exactly once by the time shutdown returns, and every
    /// commit's event is signalled.
    #[test]
    fn threaded_runtime_calls_exactly_one_end_per_task(ops in prop::collection::vec(op(), 1..40)) {
        let rt = Runtime::without_priorities(Config::default());
        let calls: Arc<Mutex<Vec<u32>>> = Arc::new(Mutex::new(Vec::new()));
        let mut events = Vec::new();
        for o in ops {
            match o {
                Op::Queue | Op::Panic => {
                    let i = { let mut c = calls.lock().unwrap(); c.push(0); c.len() - 1 };
                    let (c1, c2) = (calls.clone(), calls.clone());
                    let panics = matches!(o, Op::Panic);
                    rt.queue_processing_work(
                        move |i: usize| {
                            c1.lock().unwrap()[i] += 1;
                            if panics {
                                panic!("task {i} panics on purpose");
                            }
                        },
                        move |i: usize| c2.lock().unwrap()[i] += 1,
                        i,
                    );
                }
                Op::Mode(m, a) => {
                    if let Ok(req) = ModeRequest::from_raw(m, a, false, true) {
                        rt.set_mode(req, None, || ());
                    }
                }
                Op::Commit(high) => {
                    let action = if high { MeasurementsAction::CommitResultsHighPriority } else { MeasurementsAction::CommitResults };
                    let ev = CompletionEvent::new();
                    rt.set_mode(ModeRequest::new(Mode::Allowed, action, true, true).unwrap(), Some(&ev), || ());
                    events.push(ev);
                }
            }
        }
        rt.shutdown();
        let calls = calls.lock().unwrap();
        prop_assert!(calls.iter().all(|&n| n == 1), "{:?}", calls);
        for e in &events {
            prop_assert!(e.is_signalled());
        }
    }
}

#[test]
fn queue_and_mode_changes_from_many_threads_at_once() {
    let rt = Arc::new(Runtime::without_priorities(Config::default()));
    let calls = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (rt, calls) = (rt.clone(), calls.clone());
            std::thread::spawn(move || {
                let mut accepted = 0u64;
                for i in 0..50 {
                    let (c1, c2) = (calls.clone(), calls.clone());
                    let q = rt.queue_processing_work(
                        move |_| {
                            c1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        },
                        move |_| {
                            c2.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        },
                        (),
                    );
                    accepted += u64::from(matches!(q, Queued::Accepted(_)));
                    let ev = CompletionEvent::new();
                    let mode = if (t + i) % 3 == 0 { Mode::DisableBackgroundWork } else { Mode::Allowed };
                    rt.set_mode(
                        ModeRequest::new(mode, MeasurementsAction::CommitResults, true, true).unwrap(),
                        Some(&ev),
                        || (),
                    );
                    assert!(ev.wait(LONG), "every commit completes");
                }
                accepted
            })
        })
        .collect();
    let accepted: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    rt.shutdown();
    assert_eq!(calls.load(std::sync::atomic::Ordering::Relaxed), 200, "one end per task");
    assert_eq!(rt.stats().queued, accepted);
}

#[test]
fn a_high_priority_commit_runs_more_at_once_above_idle() {
    let rt = Runtime::without_priorities(Config::default());
    let log = Arc::new(Mutex::new(Vec::new()));
    let gates: Vec<_> = ["a", "b", "c", "d"].iter().map(|n| gated(&rt, &log, n)).collect();
    gates[0].1.recv_timeout(LONG).unwrap();
    gates[1].1.recv_timeout(LONG).unwrap();
    assert!(gates[2].1.try_recv().is_err(), "two at a time by default");
    let ev = CompletionEvent::new();
    let req = ModeRequest::new(Mode::Allowed, MeasurementsAction::CommitResultsHighPriority, true, true).unwrap();
    rt.set_mode(req, Some(&ev), || ());
    // Four at once now: the two waiting tasks start while the first two still run.
    gates[2].1.recv_timeout(LONG).unwrap();
    gates[3].1.recv_timeout(LONG).unwrap();
    for (g, _) in &gates {
        g.send(()).unwrap();
    }
    assert!(ev.wait(LONG));
    rt.shutdown();
    let spans = rt.spans();
    let class_of = |t: u64| spans.iter().find(|s| s.task.0 == t).unwrap().class;
    assert_eq!(class_of(2), ThreadClass::Normal);
    assert_eq!(class_of(3), ThreadClass::Normal);
    assert_eq!(rt.stats().started, 4);
}

#[test]
fn a_task_that_drops_the_last_handle_to_its_runtime_does_not_deadlock() {
    let rt = Arc::new(Runtime::without_priorities(Config::default()));
    let log = Arc::new(Mutex::new(Vec::new()));
    // A second task waits behind a gate: the shutdown run by the first must cancel or run it.
    let (main_dropped_tx, main_dropped_rx) = mpsc::channel::<()>();
    let (finished_tx, finished_rx) = mpsc::channel::<()>();
    let mine = rt.clone();
    rt.queue_processing_work(
        move |r: Arc<Runtime>| {
            main_dropped_rx.recv_timeout(LONG).unwrap();
            drop(r); // the last handle: shutdown runs here, on the pool's own thread
            finished_tx.send(()).unwrap();
        },
        |_| panic!("the first task runs"),
        mine,
    );
    let (l1, l2) = (log.clone(), log.clone());
    rt.queue_processing_work(
        move |_| l1.lock().unwrap().push("ran"),
        move |_| l2.lock().unwrap().push("cancelled"),
        (),
    );
    drop(rt);
    main_dropped_tx.send(()).unwrap();
    finished_rx.recv_timeout(LONG).expect("shutdown from inside a task must not wait for that task");
    let log = log.lock().unwrap();
    assert_eq!(log.len(), 1, "the other task ran or was cancelled exactly once: {log:?}");
}
