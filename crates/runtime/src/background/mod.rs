//! The runtime's background processing (spec 004, "D3D12 Background Processing"): a pool of
//! low-priority threads the runtime owns, onto which the UMD queues optimization work, under
//! modes and measurement actions the application controls.
//!
//! In D3D12 the runtime (`d3d12.dll`) owns the threads and the UMD queues work through
//! `QueueProcessingWorkCb`; the application steers with `SetBackgroundProcessingMode`. In
//! doorbell both halves live in crate `runtime`, above the driver (`umd`): this module is the
//! runtime's half, and [`crate::pgo`] is the UMD's use of it (profile-guided specialization).
//!
//! - [`machine::WorkQueue`] decides everything — order, the two-at-a-time limit, modes,
//!   commits and their completion events, disable, destruction, the progress guarantee — as a
//!   sans-IO state machine that tests drive by hand with virtual time.
//! - [`Runtime`] is its threaded driver: a pool started lazily on the first queued task, whose
//!   workers run at `SCHED_IDLE` ([`machine::ThreadClass`], through [`shm::sched`]), plus one
//!   supervisor thread (normal priority, asleep unless a timer is due) that applies the
//!   progress guarantee: a task waiting longer than [`machine::Config::progress_bound`] is
//!   raised to the lowest normal priority (nice 19), since `SCHED_IDLE` threads can starve for
//!   ever under a saturated foreground.
//! - [`Runtime::queue_processing_work`] takes a callback, a cancel and a context; exactly one
//!   of the two is called with the context, whatever happens. A callback that panics is caught
//!   and reported ([`Runtime::panics`]), and its worker carries on.
//! - [`Runtime::shutdown`] (device destruction) cancels every waiting task on the calling
//!   thread, lets running ones finish (no thread is killed), waits for them and joins the
//!   pool. A callback that never returns therefore delays device destruction, and only that.
//! - Every task's start and finish is recorded ([`Runtime::spans`]) for `doorbell trace`,
//!   like the ETW events of spec 004.

pub mod machine;
mod mode;

use std::collections::{HashMap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use machine::{CancelReason, CommitId, Config, TaskId, ThreadClass};
pub use mode::{MeasurementsAction, Mode, ModeError, ModeRequest};

use machine::{Admission, Outcome, Output, WorkQueue};

/// An event the application can wait on: signalled when a commit's tasks have all finished.
/// Cloning shares it. A commit that takes it resets it first, so one event can serve a loop.
#[derive(Clone, Debug, Default)]
pub struct CompletionEvent {
    inner: Arc<(Mutex<bool>, Condvar)>,
}

impl CompletionEvent {
    /// A new, unsignalled event.
    pub fn new() -> CompletionEvent {
        CompletionEvent::default()
    }

    /// Whether it is signalled.
    pub fn is_signalled(&self) -> bool {
        *lock(&self.inner.0)
    }

    /// Waits until it is signalled, or `timeout` passes; returns whether it is signalled.
    pub fn wait(&self, timeout: Duration) -> bool {
        let g = lock(&self.inner.0);
        let (g, _) = self.inner.1.wait_timeout_while(g, timeout, |s| !*s).unwrap_or_else(|e| e.into_inner());
        *g
    }

    pub(crate) fn signal(&self) {
        *lock(&self.inner.0) = true;
        self.inner.1.notify_all();
    }

    pub(crate) fn reset(&self) {
        *lock(&self.inner.0) = false;
    }
}

/// What happened to a queued task, as [`Runtime::queue_processing_work`] returns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Queued {
    /// Queued: its callback or its cancel runs later.
    Accepted(TaskId),
    /// Refused: its cancel has already run, on the calling thread.
    Cancelled(CancelReason),
}

/// One task's run, for the trace: when it started and finished (since the runtime's epoch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskSpan {
    /// The task.
    pub task: TaskId,
    /// Start, in ns since [`Runtime::epoch`].
    pub start_ns: u64,
    /// Finish, in ns since [`Runtime::epoch`].
    pub end_ns: u64,
    /// The class it started at.
    pub class: ThreadClass,
    /// Whether its callback panicked.
    pub panicked: bool,
    /// Which pool worker ran it (0, 1, … in the order they started).
    pub worker: u32,
}

/// A task's two ends and its context; exactly one end is ever called.
trait Pending: Send {
    fn run(self: Box<Self>);
    fn cancel(self: Box<Self>);
}

struct Task<C, F, G> {
    callback: F,
    cancel: G,
    context: C,
}

impl<C: Send, F: FnOnce(C) + Send, G: FnOnce(C) + Send> Pending for Task<C, F, G> {
    fn run(self: Box<Self>) {
        (self.callback)(self.context)
    }
    fn cancel(self: Box<Self>) {
        (self.cancel)(self.context)
    }
}

/// Spans kept for the trace; older ones are dropped.
const SPAN_CAPACITY: usize = 1 << 14;

struct State {
    q: WorkQueue,
    tasks: HashMap<TaskId, Box<dyn Pending>>,
    events: HashMap<CommitId, CompletionEvent>,
    /// Kernel thread id of the worker running each task (for `Raise`).
    running_on: HashMap<TaskId, i32>,
    workers: Vec<JoinHandle<()>>,
    supervisor: Option<JoinHandle<()>>,
    stop: bool,
    spans: VecDeque<TaskSpan>,
    panics: Vec<String>,
    /// Class changes the OS refused (no `CAP_SYS_NICE`).
    refused_raises: u64,
}

struct Shared {
    state: Mutex<State>,
    /// Workers and the supervisor wait here for work, timers or shutdown.
    wake: Condvar,
    /// Shutdown waits here for running tasks.
    drained: Condvar,
    epoch: Instant,
    /// Whether workers change their scheduling class (off in tests that must not need it).
    set_classes: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking callback never holds this lock (callbacks run unlocked), so poisoning
    // can only come from a bug here; the state is still consistent between statements.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The runtime's pool and work queue for one device (see the module documentation).
pub struct Runtime {
    shared: Arc<Shared>,
    /// Serializes mode changes: each is a begin, the UMD's DDI, a finish.
    mode_change: Mutex<()>,
}

impl Runtime {
    /// A runtime whose workers run at the classes the state machine asks for. No thread starts
    /// until the first task is queued.
    pub fn new(cfg: Config) -> Runtime {
        Runtime::build(cfg, true)
    }

    /// A runtime whose workers keep the creating process's scheduling class (for tests and
    /// machines where changing it is not wanted). Decisions are the same.
    pub fn without_priorities(cfg: Config) -> Runtime {
        Runtime::build(cfg, false)
    }

    fn build(cfg: Config, set_classes: bool) -> Runtime {
        let state = State {
            q: WorkQueue::new(cfg),
            tasks: HashMap::new(),
            events: HashMap::new(),
            running_on: HashMap::new(),
            workers: Vec::new(),
            supervisor: None,
            stop: false,
            spans: VecDeque::new(),
            panics: Vec::new(),
            refused_raises: 0,
        };
        Runtime {
            shared: Arc::new(Shared {
                state: Mutex::new(state),
                wake: Condvar::new(),
                drained: Condvar::new(),
                epoch: Instant::now(),
                set_classes,
            }),
            mode_change: Mutex::new(()),
        }
    }

    /// `QueueProcessingWorkCb`: queue `callback(context)` to run on a pool thread the caller
    /// does not choose, in the order received. Callable from any thread. If background work
    /// is disabled (or the device is going), `cancel(context)` runs here, before returning.
    /// Exactly one of `callback` and `cancel` is ever called.
    pub fn queue_processing_work<C, F, G>(&self, callback: F, cancel: G, context: C) -> Queued
    where
        C: Send + 'static,
        F: FnOnce(C) + Send + 'static,
        G: FnOnce(C) + Send + 'static,
    {
        let task: Box<dyn Pending> = Box::new(Task { callback, cancel, context });
        let mut st = lock(&self.shared.state);
        match st.q.handle_queue(Instant::now()) {
            Admission::Queued(id) => {
                st.tasks.insert(id, task);
                ensure_workers(&self.shared, &mut st);
                drop(st);
                self.shared.wake.notify_all();
                Queued::Accepted(id)
            }
            Admission::Cancel(reason) => {
                drop(st);
                task.cancel();
                Queued::Cancelled(reason)
            }
        }
    }

    /// Runs the mode change: `begin` checks and opens it, then `ddi` (the UMD's
    /// `SetBackgroundProcessingMode` DDI) runs — it may queue tasks, which are admitted by the
    /// rule of the request — then the mode takes effect and a commit takes its set, whose end
    /// signals `event` (reset first). Returns what `ddi` returned.
    /// Mode changes from several threads are serialized (the DDI runs in one at a time);
    /// `queue_processing_work` stays callable meanwhile, from the DDI too.
    pub fn set_mode<R>(&self, req: ModeRequest, event: Option<&CompletionEvent>, ddi: impl FnOnce() -> R) -> R {
        let _serial = lock(&self.mode_change);
        lock(&self.shared.state).q.begin_mode_change(req);
        let r = ddi();
        let mut st = lock(&self.shared.state);
        if let (Some(commit), Some(e)) = (st.q.finish_mode_change(), event) {
            e.reset();
            st.events.insert(commit, e.clone());
        }
        // An empty commit is done at once; more workers may be allowed now.
        let cancels = drain_outputs(&self.shared, &mut st);
        ensure_workers(&self.shared, &mut st);
        drop(st);
        run_cancels(cancels);
        self.shared.wake.notify_all();
        r
    }

    /// The mode in force.
    pub fn mode(&self) -> Mode {
        lock(&self.shared.state).q.mode()
    }

    /// The state machine's counts.
    pub fn stats(&self) -> machine::Stats {
        lock(&self.shared.state).q.stats()
    }

    /// Threads started so far (workers, not counting the supervisor).
    pub fn threads(&self) -> usize {
        lock(&self.shared.state).workers.len()
    }

    /// Raises the OS refused (the process lacks `CAP_SYS_NICE`).
    pub fn refused_raises(&self) -> u64 {
        lock(&self.shared.state).refused_raises
    }

    /// The reports of callbacks that panicked (the panic's message).
    pub fn panics(&self) -> Vec<String> {
        lock(&self.shared.state).panics.clone()
    }

    /// The instant span times count from.
    pub fn epoch(&self) -> Instant {
        self.shared.epoch
    }

    /// Every task run so far (the most recent 16,384), in finishing order.
    pub fn spans(&self) -> Vec<TaskSpan> {
        lock(&self.shared.state).spans.iter().copied().collect()
    }

    /// Device destruction: cancel every waiting task (on this thread), let running tasks
    /// finish, wait for them, stop and join the pool. Idempotent.
    ///
    /// Called from one of this runtime's own tasks (a task that dropped the last handle to
    /// its device), it waits for every task but that one, which finishes when it returns.
    pub fn shutdown(&self) {
        let own = WORKER_OF.with(|w| w.get()) == Arc::as_ptr(&self.shared) as usize;
        let mut st = lock(&self.shared.state);
        st.q.handle_destroy();
        loop {
            let cancels = drain_outputs(&self.shared, &mut st);
            if !cancels.is_empty() {
                drop(st);
                run_cancels(cancels);
                st = lock(&self.shared.state);
                continue;
            }
            if st.q.is_drained() || (own && st.q.waiting() == 0 && st.q.running() == 1) {
                break;
            }
            st = self.shared.drained.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.stop = true;
        let workers = std::mem::take(&mut st.workers);
        let supervisor = st.supervisor.take();
        drop(st);
        self.shared.wake.notify_all();
        let me = std::thread::current().id();
        for h in workers.into_iter().chain(supervisor) {
            if h.thread().id() != me {
                let _ = h.join();
            }
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Starts the supervisor, and workers until there is one for each task that may run now
/// (running plus waiting, up to the limit). Workers live until shutdown.
fn ensure_workers(shared: &Arc<Shared>, st: &mut State) {
    if st.supervisor.is_none() {
        let s = shared.clone();
        st.supervisor = Some(std::thread::spawn(move || supervise(s)));
    }
    let wanted = st.q.limit().min(st.q.running() + st.q.waiting());
    while st.workers.len() < wanted {
        let s = shared.clone();
        let index = st.workers.len() as u32;
        st.workers.push(std::thread::spawn(move || work(s, index)));
    }
}

/// Carries out the state machine's outputs that need no thread of their own; returns the
/// cancels to call (outside the lock).
fn drain_outputs(shared: &Shared, st: &mut State) -> Vec<Box<dyn Pending>> {
    let mut cancels = Vec::new();
    while let Some(o) = st.q.poll_output() {
        match o {
            Output::Cancel { task, .. } => cancels.extend(st.tasks.remove(&task)),
            Output::CommitDone(c) => {
                if let Some(e) = st.events.remove(&c) {
                    e.signal();
                }
            }
            Output::Raise { task, class } => {
                if let Some(&tid) = st.running_on.get(&task)
                    && shared.set_classes
                    && shm::sched::set_thread_class(tid, sched_class(class)).is_err()
                {
                    st.refused_raises += 1;
                }
            }
        }
    }
    cancels
}

fn run_cancels(cancels: Vec<Box<dyn Pending>>) {
    for c in cancels {
        // A cancel that panics must not stop the others from being called.
        let _ = catch_unwind(AssertUnwindSafe(|| c.cancel()));
    }
}

fn sched_class(c: ThreadClass) -> shm::sched::SchedClass {
    match c {
        ThreadClass::Idle => shm::sched::SchedClass::Idle,
        ThreadClass::Low => shm::sched::SchedClass::Low,
        ThreadClass::Normal => shm::sched::SchedClass::Normal,
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic payload".to_string())
}

thread_local! {
    /// The runtime whose pool this thread belongs to (its `Shared`'s address; 0 for none).
    static WORKER_OF: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A worker: take the next task the state machine hands out, run it at its class, report.
fn work(shared: Arc<Shared>, index: u32) {
    WORKER_OF.with(|w| w.set(Arc::as_ptr(&shared) as usize));
    let tid = shm::sched::current_tid();
    let mut class: Option<ThreadClass> = None;
    let mut st = lock(&shared.state);
    loop {
        let now = Instant::now();
        if let Some(start) = st.q.poll_start(now) {
            let task = st.tasks.remove(&start.task);
            st.running_on.insert(start.task, tid);
            drop(st);
            if shared.set_classes && class != Some(start.class) {
                let ok = shm::sched::set_thread_class(tid, sched_class(start.class)).is_ok();
                class = Some(start.class);
                if !ok {
                    lock(&shared.state).refused_raises += 1;
                }
            }
            let begun = Instant::now();
            let result = task.map(|t| catch_unwind(AssertUnwindSafe(|| t.run())));
            let ended = Instant::now();
            st = lock(&shared.state);
            st.running_on.remove(&start.task);
            let panicked = matches!(result, Some(Err(_)));
            if let Some(Err(p)) = &result {
                let msg = format!("background task {} panicked: {}", start.task.0, panic_message(p.as_ref()));
                st.panics.push(msg);
            }
            st.q.handle_finished(start.task, if panicked { Outcome::Panicked } else { Outcome::Returned });
            if st.spans.len() >= SPAN_CAPACITY {
                st.spans.pop_front();
            }
            let ns = |t: Instant| t.saturating_duration_since(shared.epoch).as_nanos() as u64;
            st.spans.push_back(TaskSpan {
                task: start.task,
                start_ns: ns(begun),
                end_ns: ns(ended),
                class: start.class,
                panicked,
                worker: index,
            });
            let cancels = drain_outputs(&shared, &mut st);
            if !cancels.is_empty() {
                drop(st);
                run_cancels(cancels);
                st = lock(&shared.state);
            }
            shared.drained.notify_all();
            shared.wake.notify_all();
            continue;
        }
        if st.stop {
            return;
        }
        st = shared.wake.wait(st).unwrap_or_else(|e| e.into_inner());
    }
}

/// The supervisor: at normal priority, asleep until the state machine's next timer, then
/// applies the progress guarantee (raises starved idle tasks).
fn supervise(shared: Arc<Shared>) {
    let mut st = lock(&shared.state);
    loop {
        if st.stop {
            return;
        }
        let now = Instant::now();
        st.q.handle_timeout(now);
        let cancels = drain_outputs(&shared, &mut st);
        if !cancels.is_empty() {
            drop(st);
            run_cancels(cancels);
            st = lock(&shared.state);
            continue;
        }
        st = match st.q.poll_timeout() {
            Some(t) => {
                let d = t.saturating_duration_since(now).max(Duration::from_micros(100));
                shared.wake.wait_timeout(st, d).unwrap_or_else(|e| e.into_inner()).0
            }
            None => shared.wake.wait(st).unwrap_or_else(|e| e.into_inner()),
        };
    }
}
