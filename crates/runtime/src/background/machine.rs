//! The runtime's decisions as a sans-IO state machine: [`WorkQueue`].
//!
//! Everything spec 004 promises about background tasks is decided here, and nothing else
//! happens here: no thread, lock or clock. The driver ([`super::Runtime`]) owns the threads and
//! the callbacks, feeds inputs with the current time, and carries out what comes back. Tests
//! drive it by hand with virtual time.
//!
//! Inputs: [`WorkQueue::handle_queue`] (a task arrives), [`WorkQueue::begin_mode_change`] and
//! [`WorkQueue::finish_mode_change`] (the two ends of `SetBackgroundProcessingMode`, between
//! which the UMD's DDI runs and may queue tasks), [`WorkQueue::handle_finished`] (a task's
//! callback returned or panicked), [`WorkQueue::handle_destroy`] (the device is being
//! destroyed) and [`WorkQueue::handle_timeout`]. Outputs: [`WorkQueue::poll_start`] (which
//! task a free worker runs next, at which [`ThreadClass`]), [`WorkQueue::poll_output`]
//! (cancels to call, threads to raise, commit events to signal) and
//! [`WorkQueue::poll_timeout`].
//!
//! # Invariants
//!
//! - **Exactly once.** Every task admitted by `handle_queue` leaves exactly once: either it is
//!   handed out by `poll_start` (its callback runs; `handle_finished` closes it), or it comes
//!   out as [`Output::Cancel`] (its cancel runs). A task refused at admission is never
//!   admitted: its cancel runs on the caller's thread ([`Admission::Cancel`]). Nothing else
//!   removes a task.
//! - **Order.** Tasks start in the order they were admitted (a FIFO).
//! - **Concurrency.** At most [`Config::max_running`] tasks run at once (two, the spec's
//!   default), or [`Config::boosted_running`] while a high-priority commit is open.
//! - **Disable.** In a disabling mode, admission cancels; tasks admitted before keep their
//!   place and run. During a mode change that commits, admission stays open until the call
//!   returns, so tasks the UMD generates for the commit run before the disable takes effect.
//! - **Commit set.** The set is every task admitted and not yet finished when the call
//!   returns (waiting and running). Its [`Output::CommitDone`] comes once each of them has
//!   finished or been cancelled; at once if the set is empty.
//! - **Progress.** A task admitted more than [`Config::progress_bound`] ago never runs at
//!   [`ThreadClass::Idle`]: it starts at [`ThreadClass::Low`], and one already running idle is
//!   raised to it ([`Output::Raise`]) when the bound passes. So a saturated foreground, which
//!   starves `SCHED_IDLE` threads for ever, delays a task by at most about the bound before it
//!   competes as the lowest normal thread.
//! - **Destruction.** After `handle_destroy`, every waiting task is cancelled, admission
//!   cancels, running tasks finish normally; [`WorkQueue::is_drained`] says when the device may
//!   go.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use super::mode::{Mode, ModeRequest};

/// A task admitted by [`WorkQueue::handle_queue`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId(pub u64);

/// A commit: the set of tasks whose end signals one completion event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CommitId(pub u64);

/// The scheduling class a task's thread runs at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ThreadClass {
    /// `SCHED_IDLE`: runs only on a CPU nothing else wants. The default.
    Idle,
    /// `SCHED_OTHER` at nice 19, the lowest normal priority: the progress guarantee.
    Low,
    /// `SCHED_OTHER` at the process's nice: a high-priority commit.
    Normal,
}

/// The runtime's knobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Tasks running at once by default (spec 004: two).
    pub max_running: usize,
    /// Tasks running at once while a high-priority commit is open.
    pub boosted_running: usize,
    /// How long a task may wait (from admission) before it runs above idle priority.
    pub progress_bound: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config { max_running: 2, boosted_running: 4, progress_bound: Duration::from_millis(100) }
    }
}

/// What [`WorkQueue::handle_queue`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Queued; it will run or be cancelled later.
    Queued(TaskId),
    /// Not queued: the caller calls its cancel now, before returning.
    Cancel(CancelReason),
}

/// Why a task was cancelled instead of run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CancelReason {
    /// Background work is disabled (`DisableBackgroundWork`, `DisableProfilingBySystem`).
    Disabled,
    /// The device is being destroyed.
    Destroyed,
}

/// How a task's callback ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// It returned.
    Returned,
    /// It panicked; the panic was caught and reported.
    Panicked,
}

/// Something the driver must do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// Call this task's cancel (it will never run).
    Cancel {
        /// The task.
        task: TaskId,
        /// Why.
        reason: CancelReason,
    },
    /// Move the thread running this task to `class`.
    Raise {
        /// The task.
        task: TaskId,
        /// Its new class.
        class: ThreadClass,
    },
    /// Every task of this commit has finished: signal its completion event.
    CommitDone(CommitId),
}

/// A task a free worker should run now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Start {
    /// The task.
    pub task: TaskId,
    /// The class to run it at.
    pub class: ThreadClass,
}

#[derive(Clone, Copy, Debug)]
struct Running {
    queued_at: Instant,
    class: ThreadClass,
}

#[derive(Clone, Debug)]
struct Commit {
    id: CommitId,
    tasks: BTreeSet<TaskId>,
    high: bool,
}

/// Counts, for reports and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Tasks admitted.
    pub queued: u64,
    /// Tasks handed out to run.
    pub started: u64,
    /// Callbacks that returned.
    pub returned: u64,
    /// Callbacks that panicked.
    pub panicked: u64,
    /// Cancels (at admission and later).
    pub cancelled: u64,
    /// Tasks raised by the progress guarantee (at start or while running).
    pub raised: u64,
}

/// The background work queue of one device (see the module documentation).
#[derive(Debug)]
pub struct WorkQueue {
    cfg: Config,
    mode: Mode,
    /// The mode change in progress (between begin and finish).
    call: Option<ModeRequest>,
    waiting: VecDeque<(TaskId, Instant)>,
    running: BTreeMap<TaskId, Running>,
    commits: Vec<Commit>,
    destroying: bool,
    out: VecDeque<Output>,
    next_task: u64,
    next_commit: u64,
    stats: Stats,
}

impl WorkQueue {
    /// An empty queue in [`Mode::Allowed`].
    pub fn new(cfg: Config) -> WorkQueue {
        WorkQueue {
            cfg,
            mode: Mode::Allowed,
            call: None,
            waiting: VecDeque::new(),
            running: BTreeMap::new(),
            commits: Vec::new(),
            destroying: false,
            out: VecDeque::new(),
            next_task: 0,
            next_commit: 0,
            stats: Stats::default(),
        }
    }

    /// Its configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The mode in force.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Counts so far.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Tasks waiting to start.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Tasks running.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Whether the device may go: destruction began, nothing waits or runs, every output
    /// has been taken.
    pub fn is_drained(&self) -> bool {
        self.destroying && self.waiting.is_empty() && self.running.is_empty() && self.out.is_empty()
    }

    /// Whether new tasks are admitted right now.
    fn admitting(&self) -> bool {
        if self.destroying {
            return false;
        }
        match self.call {
            // A commit keeps admission open until the call returns, whatever the new mode.
            Some(req) => !req.mode.disables_work() || req.action.is_commit(),
            None => !self.mode.disables_work(),
        }
    }

    /// A task arrives (`QueueProcessingWorkCb`).
    pub fn handle_queue(&mut self, now: Instant) -> Admission {
        if !self.admitting() {
            self.stats.cancelled += 1;
            let reason = if self.destroying { CancelReason::Destroyed } else { CancelReason::Disabled };
            return Admission::Cancel(reason);
        }
        let id = TaskId(self.next_task);
        self.next_task += 1;
        self.stats.queued += 1;
        self.waiting.push_back((id, now));
        Admission::Queued(id)
    }

    /// `SetBackgroundProcessingMode` begins with a checked request. Until
    /// [`WorkQueue::finish_mode_change`], admission follows the request: open if its mode
    /// allows work or its action commits.
    pub fn begin_mode_change(&mut self, req: ModeRequest) {
        self.call = Some(req);
    }

    /// The call returns: the mode takes effect, and a commit takes its set (every task admitted
    /// and not finished). Returns the commit, if the action was one.
    pub fn finish_mode_change(&mut self) -> Option<CommitId> {
        let req = self.call.take()?;
        self.mode = req.mode;
        if !req.action.is_commit() {
            return None;
        }
        let id = CommitId(self.next_commit);
        self.next_commit += 1;
        let tasks: BTreeSet<TaskId> = self.waiting.iter().map(|w| w.0).chain(self.running.keys().copied()).collect();
        let high = req.action == super::mode::MeasurementsAction::CommitResultsHighPriority;
        if tasks.is_empty() {
            self.out.push_back(Output::CommitDone(id));
            return Some(id);
        }
        if high {
            for (task, r) in self.running.iter_mut() {
                if tasks.contains(task) && r.class < ThreadClass::Normal {
                    r.class = ThreadClass::Normal;
                    self.out.push_back(Output::Raise { task: *task, class: ThreadClass::Normal });
                }
            }
        }
        self.commits.push(Commit { id, tasks, high });
        Some(id)
    }

    fn in_high_commit(&self, task: TaskId) -> bool {
        self.commits.iter().any(|c| c.high && c.tasks.contains(&task))
    }

    /// How many tasks may run at once right now.
    pub fn limit(&self) -> usize {
        if self.commits.iter().any(|c| c.high) { self.cfg.boosted_running } else { self.cfg.max_running }
    }

    /// The next task to run, if a worker is free under the limit: the oldest waiting one, at
    /// [`ThreadClass::Normal`] if a high-priority commit holds it, [`ThreadClass::Low`] if it
    /// waited past the progress bound, else [`ThreadClass::Idle`].
    pub fn poll_start(&mut self, now: Instant) -> Option<Start> {
        if self.running.len() >= self.limit() {
            return None;
        }
        let (task, queued_at) = self.waiting.pop_front()?;
        let class = if self.in_high_commit(task) {
            ThreadClass::Normal
        } else if now.saturating_duration_since(queued_at) >= self.cfg.progress_bound {
            self.stats.raised += 1;
            ThreadClass::Low
        } else {
            ThreadClass::Idle
        };
        self.running.insert(task, Running { queued_at, class });
        self.stats.started += 1;
        Some(Start { task, class })
    }

    /// A task's callback ended. Unknown or already finished tasks are ignored (and reported
    /// as `false`).
    pub fn handle_finished(&mut self, task: TaskId, outcome: Outcome) -> bool {
        if self.running.remove(&task).is_none() {
            return false;
        }
        match outcome {
            Outcome::Returned => self.stats.returned += 1,
            Outcome::Panicked => self.stats.panicked += 1,
        }
        self.resolve(task);
        true
    }

    /// A task left (ran or cancelled): it leaves every commit set, and a set left empty is done.
    fn resolve(&mut self, task: TaskId) {
        let out = &mut self.out;
        self.commits.retain_mut(|c| {
            c.tasks.remove(&task);
            if c.tasks.is_empty() {
                out.push_back(Output::CommitDone(c.id));
                false
            } else {
                true
            }
        });
    }

    /// The device is being destroyed: cancel everything waiting, admit nothing more, let
    /// running tasks finish.
    pub fn handle_destroy(&mut self) {
        self.destroying = true;
        while let Some((task, _)) = self.waiting.pop_front() {
            self.stats.cancelled += 1;
            self.out.push_back(Output::Cancel { task, reason: CancelReason::Destroyed });
            self.resolve(task);
        }
    }

    /// When [`WorkQueue::handle_timeout`] next has something to do: the earliest moment a
    /// task running idle passes the progress bound.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.running
            .values()
            .filter(|r| r.class == ThreadClass::Idle)
            .map(|r| r.queued_at + self.cfg.progress_bound)
            .min()
    }

    /// Time passed: raise every idle task that has passed the progress bound.
    pub fn handle_timeout(&mut self, now: Instant) {
        for (task, r) in self.running.iter_mut() {
            if r.class == ThreadClass::Idle && now.saturating_duration_since(r.queued_at) >= self.cfg.progress_bound {
                r.class = ThreadClass::Low;
                self.stats.raised += 1;
                self.out.push_back(Output::Raise { task: *task, class: ThreadClass::Low });
            }
        }
    }

    /// The next thing to do.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::super::mode::MeasurementsAction as A;
    use super::*;

    fn req(mode: Mode, action: A) -> ModeRequest {
        ModeRequest::new(mode, action, action.is_commit(), true).unwrap()
    }

    fn set(q: &mut WorkQueue, mode: Mode, action: A) -> Option<CommitId> {
        q.begin_mode_change(req(mode, action));
        q.finish_mode_change()
    }

    fn queued(a: Admission) -> TaskId {
        match a {
            Admission::Queued(t) => t,
            other => panic!("expected Queued, got {other:?}"),
        }
    }

    fn outputs(q: &mut WorkQueue) -> Vec<Output> {
        std::iter::from_fn(|| q.poll_output()).collect()
    }

    #[test]
    fn fifo_two_at_a_time_idle() {
        let t0 = Instant::now();
        let mut q = WorkQueue::new(Config::default());
        let ids: Vec<TaskId> = (0..4).map(|_| queued(q.handle_queue(t0))).collect();
        let a = q.poll_start(t0).unwrap();
        let b = q.poll_start(t0).unwrap();
        assert_eq!((a.task, b.task), (ids[0], ids[1]));
        assert_eq!(a.class, ThreadClass::Idle);
        assert_eq!(q.poll_start(t0), None, "a third task must wait: at most two run");
        assert!(q.handle_finished(ids[1], Outcome::Returned));
        assert_eq!(q.poll_start(t0).unwrap().task, ids[2]);
        assert!(!q.handle_finished(ids[1], Outcome::Returned), "finishing twice is ignored");
    }

    #[test]
    fn disabled_admission_cancels_but_earlier_tasks_run() {
        let t0 = Instant::now();
        let mut q = WorkQueue::new(Config::default());
        let before = queued(q.handle_queue(t0));
        assert_eq!(set(&mut q, Mode::DisableBackgroundWork, A::KeepAll), None);
        assert_eq!(q.handle_queue(t0), Admission::Cancel(CancelReason::Disabled));
        assert_eq!(q.poll_start(t0).map(|s| s.task), Some(before), "submitted before the disable: still runs");
        set(&mut q, Mode::Allowed, A::KeepAll);
        queued(q.handle_queue(t0));
    }

    #[test]
    fn commit_set_is_what_was_queued_when_the_call_returns() {
        let t0 = Instant::now();
        let mut q = WorkQueue::new(Config::default());
        let a = queued(q.handle_queue(t0));
        q.poll_start(t0);
        let b = queued(q.handle_queue(t0));
        q.begin_mode_change(req(Mode::Allowed, A::CommitResults));
        let during = queued(q.handle_queue(t0)); // generated by the UMD for the commit
        let c = q.finish_mode_change().unwrap();
        let after = queued(q.handle_queue(t0)); // not part of it
        assert!(outputs(&mut q).is_empty());
        for t in [a, b] {
            if q.running() < 2 {
                q.poll_start(t0);
            }
            q.handle_finished(t, Outcome::Returned);
            assert!(outputs(&mut q).is_empty(), "the set is not finished yet");
        }
        q.poll_start(t0);
        q.handle_finished(during, Outcome::Panicked);
        assert_eq!(outputs(&mut q), vec![Output::CommitDone(c)], "a panicked task still finishes");
        q.poll_start(t0);
        q.handle_finished(after, Outcome::Returned);
        assert!(outputs(&mut q).is_empty());
    }

    #[test]
    fn empty_commit_is_done_at_once() {
        let mut q = WorkQueue::new(Config::default());
        let c = set(&mut q, Mode::Allowed, A::CommitResults).unwrap();
        assert_eq!(outputs(&mut q), vec![Output::CommitDone(c)]);
    }

    #[test]
    fn disable_with_commit_admits_the_commits_tasks_then_disables() {
        let t0 = Instant::now();
        let mut q = WorkQueue::new(Config::default());
        q.begin_mode_change(req(Mode::DisableProfilingBySystem, A::CommitResultsHighPriority));
        let generated = queued(q.handle_queue(t0));
        let c = q.finish_mode_change().unwrap();
        assert_eq!(q.handle_queue(t0), Admission::Cancel(CancelReason::Disabled), "the disable took effect after");
        let s = q.poll_start(t0).unwrap();
        assert_eq!((s.task, s.class), (generated, ThreadClass::Normal), "a high-priority commit runs above idle");
        q.handle_finished(generated, Outcome::Returned);
        assert_eq!(outputs(&mut q), vec![Output::CommitDone(c)]);
        // Without a commit, a disable applies during the call too.
        q.begin_mode_change(req(Mode::DisableBackgroundWork, A::KeepAll));
        assert_eq!(q.handle_queue(t0), Admission::Cancel(CancelReason::Disabled));
        q.finish_mode_change();
    }

    #[test]
    fn high_priority_commit_runs_more_at_once_until_its_tasks_finish() {
        let t0 = Instant::now();
        let mut q = WorkQueue::new(Config::default());
        let running = queued(q.handle_queue(t0));
        q.poll_start(t0);
        let ids: Vec<TaskId> = (0..5).map(|_| queued(q.handle_queue(t0))).collect();
        let c = set(&mut q, Mode::Allowed, A::CommitResultsHighPriority).unwrap();
        assert_eq!(outputs(&mut q), vec![Output::Raise { task: running, class: ThreadClass::Normal }]);
        let started: Vec<Start> = std::iter::from_fn(|| q.poll_start(t0)).collect();
        assert_eq!(started.len(), 3, "boosted: four at once");
        assert!(started.iter().all(|s| s.class == ThreadClass::Normal));
        for t in std::iter::once(running).chain(ids.iter().copied()) {
            q.handle_finished(t, Outcome::Returned);
            while q.poll_start(t0).is_some() {}
        }
        assert_eq!(outputs(&mut q), vec![Output::CommitDone(c)]);
        assert_eq!(q.limit(), 2, "back to the default once the commit's tasks are done");
        queued(q.handle_queue(t0));
        assert_eq!(q.poll_start(t0).unwrap().class, ThreadClass::Idle);
    }

    #[test]
    fn progress_guarantee_raises_after_the_bound() {
        let t0 = Instant::now();
        let cfg = Config::default();
        let mut q = WorkQueue::new(cfg);
        let ids: Vec<TaskId> = (0..3).map(|_| queued(q.handle_queue(t0))).collect();
        q.poll_start(t0);
        q.poll_start(t0);
        assert_eq!(q.poll_timeout(), Some(t0 + cfg.progress_bound));
        q.handle_timeout(t0 + cfg.progress_bound - Duration::from_nanos(1));
        assert!(outputs(&mut q).is_empty(), "not before the bound");
        // The foreground saturates the CPU: the idle tasks never finish; time passes.
        let late = t0 + cfg.progress_bound;
        q.handle_timeout(late);
        assert_eq!(
            outputs(&mut q),
            vec![
                Output::Raise { task: ids[0], class: ThreadClass::Low },
                Output::Raise { task: ids[1], class: ThreadClass::Low }
            ]
        );
        assert_eq!(q.poll_timeout(), None, "nothing idle is running any more");
        q.handle_finished(ids[0], Outcome::Returned);
        assert_eq!(q.poll_start(late).unwrap().class, ThreadClass::Low, "it waited past the bound: starts low");
        assert_eq!(q.stats().raised, 3);
    }

    #[test]
    fn destroy_cancels_waiting_lets_running_finish() {
        let t0 = Instant::now();
        let mut q = WorkQueue::new(Config::default());
        let ids: Vec<TaskId> = (0..4).map(|_| queued(q.handle_queue(t0))).collect();
        q.poll_start(t0);
        let c = set(&mut q, Mode::Allowed, A::CommitResults).unwrap();
        q.handle_destroy();
        assert_eq!(
            outputs(&mut q),
            vec![
                Output::Cancel { task: ids[1], reason: CancelReason::Destroyed },
                Output::Cancel { task: ids[2], reason: CancelReason::Destroyed },
                Output::Cancel { task: ids[3], reason: CancelReason::Destroyed },
            ]
        );
        assert_eq!(q.handle_queue(t0), Admission::Cancel(CancelReason::Destroyed));
        assert!(!q.is_drained(), "a task is still running");
        assert_eq!(q.poll_start(t0), None);
        q.handle_finished(ids[0], Outcome::Returned);
        assert_eq!(outputs(&mut q), vec![Output::CommitDone(c)]);
        assert!(q.is_drained());
    }
}
