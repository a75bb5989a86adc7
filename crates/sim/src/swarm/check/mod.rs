//! The swarm's checkers: invariants of the whole stack, checked at every instant of a run.
//!
//! [`Checker`] is an [`Observer`]: it sees every completion record the device writes, every
//! command buffer a queue accepts and every instant of the run, and it applies the seed's
//! [`Fault`]s at their instants. Each invariant is a named checker ([`CHECKERS`]):
//!
//! - `exactly-once`: a completion record names a command buffer that was submitted and not
//!   completed before; at the end every command buffer completed, or its queue ended (killed,
//!   lost, refused) and the runner accounted it with the reason.
//! - `monotone-fence`: a queue's completion records rise, and neither its progress fence nor
//!   the native fence its command buffers signal (where one is waited on) goes backwards as
//!   the client reads them.
//! - `cpu-wait`: a CPU wait on a queue's signal fence returns only when its condition holds
//!   (the fence at its value) or with a typed reason (`KernelError`): looked at when its
//!   client begins it (the kernel's resample may decide it at once), at every instant it
//!   lasts, and when its client ends it. (A wait still undecided after its fence passed is
//!   no violation: the waiter wakes on the interrupt, which the client may outrun.)
//! - `liveness`: a live queue with work makes progress within [`LIVENESS_BOUND_NS`] of its
//!   oldest command buffer's submission, of its last progress and of the last fault that could
//!   delay it (a hold, a suspend, a DDI failure, a D3 request, a kill, a hang), unless it is held
//!   or suspended, it is the queue that hung, the kernel ended it, a hung kernel holds its
//!   engine (undetected, or undetectable without a hang timer: `hang-detected` covers the
//!   first; the bound starts again when the hang ends), or it waits (`after`) on a queue that
//!   will never signal again (hung, killed or ended, directly or further up).
//! - `hang-detected`: a queue whose kernel hung, on an engine with a per-queue hang timer,
//!   ends (is reset, lost) within the timer plus the liveness bound of its hung submission,
//!   unless that kernel never starts: its command buffer waits (`after`) for a value that a
//!   stopped upstream queue never signals.
//! - `fault-record`: a queue the kernel hung (a fault, a reset, a hang) reports it: its
//!   `QUERY_STATUS` carries a fault record, and a user-mode queue's doorbell reads
//!   `DisconnectedAbort` (spec 001), so its client learns the loss on its next ring. It looks
//!   whenever the kernel's fault count moves.
//! - `f1-idle`: an engine enters F1 only when every queue on its run list is idle; a queue
//!   held off it (answered preemption, suspended context) keeps the work its client waits
//!   for in its ring (spec 000, "Engine F-state transitions": the rule). It looks, through the device's
//!   read-only queries, at the engines in F1 whenever the kernel's count of F1 entries moves:
//!   clients act only after the look, so work seen then was there when F1 was granted.
//! - `interrupts`: a native-fence signal raises its interrupt exactly when the value written
//!   passes the fence's MonitoredValue (spec 002: none without a waiter whose value is
//!   reached, and never none with one), as the device's record of every signal shows it
//!   ([`gpu::FenceSignal`], [`Observer::fence_signals`]). That the MonitoredValue itself
//!   follows the kernel's waiters is `cpu-wait`'s and `liveness`'s to notice.
//! - `census`: once every client process ended, the kernel holds nothing: no process, queue,
//!   doorbell, allocation, fence, doorbell page, GPU mapping or wait.
//!
//! Each has a deliberately broken twin ([`Inject`]), a fault in the system under test that its
//! checker must catch: completions the device stops writing for one queue, a completion
//! written twice, a progress value written backwards, a process the kernel never frees, a hang
//! timer that does not fire, a hung queue whose doorbell the kernel leaves connected, a CPU
//! wait the kernel wakes one value early, an engine that powers down with work, a device that raises a fence's interrupt on every
//! signal (the last two the device's [`gpu::BrokenTwin`]).
//! `swarm::tests` run each twin until it is caught.
//!
//! Invariant: a checker changes nothing in the run unless a fault of the seed or a twin says
//! so; the first violation of each checker is kept (with the queue's recent history), later
//! ones of the same checker only counted.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write;
use std::sync::Arc;

use kernel::{ProcessPort, System};

mod looks;
mod twin;

pub use twin::Inject;

use super::draw::Fault;
use crate::Plan;
use crate::observe::{Observer, Record, WaitLook, World};
use crate::scenario::Action;

/// The checkers' names, in the order they are reported.
pub const CHECKERS: [&str; 9] = [
    "exactly-once",
    "monotone-fence",
    "cpu-wait",
    "liveness",
    "hang-detected",
    "fault-record",
    "f1-idle",
    "interrupts",
    "census",
];

/// A live queue with work progresses within this long (ns) of its oldest command buffer's
/// submission, its last progress and the last fault that could delay it. Longer than any
/// wait the drawn configurations allow: a turn behind every other queue of its engine (at
/// most 32 queues, 10 ms quanta), a TDR (delay ≤ 100 ms, DDI delay ≤ 5 s), a slow reset DDI.
pub const LIVENESS_BOUND_NS: u64 = 8_000_000_000;

/// Entries of a queue's history kept for a violation's report.
const HISTORY: usize = 12;

/// One invariant broken.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Violation {
    /// The seed.
    pub seed: u64,
    /// The checker.
    pub checker: &'static str,
    /// When (ns since the run's start).
    pub instant_ns: u64,
    /// The queue concerned (global index), if one.
    pub queue: Option<usize>,
    /// What was seen.
    pub what: String,
    /// The queue's recent history (time in ns, event), oldest first.
    pub history: Vec<String>,
    /// The command that reproduces it.
    pub repro: String,
}

/// Per queue, what the checkers remember.
#[derive(Default)]
struct Ledger {
    /// Highest progress value accepted, and the highest the device recorded.
    submitted: u64,
    recorded: u64,
    /// The progress fence last read, and the signal fence (the native fence its command
    /// buffers signal, where a queue or a CPU waiter waits on it).
    read: u64,
    signal_read: u64,
    /// When it last progressed (a record, or a submission to an idle queue).
    progressed: u64,
    /// Exempt from liveness until then (held, suspended).
    exempt_until: u64,
    /// A hang event armed its next submission; then that submission's value and time, and
    /// the upstream value its `WAIT` asks for (`after`), if it has one.
    hang_armed: bool,
    hung: Option<(u64, u64)>,
    hung_waits_for: Option<u64>,
    /// Its process was killed by a scenario event.
    killed: bool,
    /// The kernel reset or faulted it (seen by [`Checker::ended_by_kernel`]).
    lost: bool,
    /// The runner reported it ended (noted once).
    ended: bool,
    /// `fault-record` found it hung and looked at its report (once).
    fault_checked: bool,
    history: VecDeque<String>,
}

impl Ledger {
    fn note(&mut self, now: u64, what: String) {
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(format!("{:>12.3} µs  {what}", now as f64 / 1e3));
    }
}

/// A hold in progress: the queue and when it is resumed.
struct Held {
    queue: usize,
    until: u64,
}

/// The checkers of one run, and its fault schedule.
pub struct Checker {
    seed: u64,
    inject: Option<Inject>,
    queues: Vec<Ledger>,
    group_first: Vec<usize>,
    /// Each group's engine (index).
    group_engine: Vec<usize>,
    /// Each group's queues are kernel-mode (no doorbell of their own).
    group_kernel_mode: Vec<bool>,
    /// The kernel's fault count when `fault-record` last looked.
    faults_seen: u64,
    /// The kernel's count of decided CPU waits when `cpu-wait` last looked, and the queues
    /// whose clients wait on the CPU (`cpu_waiter` groups).
    waits_decided_seen: u64,
    waiting_queues: Vec<usize>,
    /// The kernel's count of F1 entries when `f1-idle` last looked, and each engine's queues.
    f1_entries_seen: u64,
    engine_queues: Vec<Vec<usize>>,
    /// Each queue's upstream queue (`after`): the one whose fence its command buffers wait for.
    upstream: Vec<Option<usize>>,
    /// Per engine: a hung kernel holds it (not detected yet, or never: no hang timer).
    hung_engines: Vec<bool>,
    /// Hang timer per engine (ns; 0: off), as the checker expects it.
    hang_ns: Vec<u64>,
    faults: VecDeque<(u64, Fault)>,
    held: Vec<Held>,
    /// The last fault that could delay any queue.
    last_disturbance: u64,
    /// Per checker: the first violation and how many.
    pub(crate) violations: BTreeMap<&'static str, (Violation, u64)>,
    /// Instants checked.
    pub(crate) instants: u64,
    /// Faults applied, per kind.
    pub(crate) applied: BTreeMap<String, u64>,
    /// Twins' state: the queue whose completions stop, a process kept from the kernel.
    lost_queue: Option<usize>,
    repeated: bool,
    backwards: bool,
    leaked: Option<Arc<ProcessPort>>,
    /// The kernel's or the device's broken twin is armed (once, at the first instant).
    twin_armed: bool,
    /// The run's end (the window), for twins that act halfway.
    window: u64,
}

impl Checker {
    /// The checkers for `plan` (drawn from `seed`), applying `faults`, with twin `inject`.
    pub fn new(seed: u64, plan: &Plan, faults: &[(u64, Fault)], inject: Option<Inject>) -> Checker {
        let mut group_first = Vec::new();
        let mut n = 0;
        for g in &plan.groups {
            group_first.push(n);
            n += g.count as usize;
        }
        let upstream = plan
            .groups
            .iter()
            .flat_map(|g| {
                let up = g.after.map(|u| (group_first[u], plan.groups[u].count as usize));
                (0..g.count as usize).map(move |k| up.map(|(first, count)| first + k % count))
            })
            .collect();
        let waiting_queues = plan
            .groups
            .iter()
            .zip(&group_first)
            .filter(|(g, _)| g.cpu_waiter)
            .flat_map(|(g, &first)| first..first + g.count as usize)
            .collect();
        let mut engine_queues = vec![Vec::new(); plan.system.gpu.engines.len()];
        for (g, &first) in plan.groups.iter().zip(&group_first) {
            engine_queues[g.engine].extend(first..first + g.count as usize);
        }
        let tdr = &plan.system.tdr;
        let hang_ns = plan
            .system
            .gpu
            .engines
            .iter()
            .map(|k| match k {
                abi::EngineKind::Copy => tdr.hang_copy.map_or(0, |d| d.as_nanos() as u64),
                _ => tdr.hang_compute.map_or(0, |d| d.as_nanos() as u64),
            })
            .collect();
        Checker {
            seed,
            inject,
            queues: (0..n).map(|_| Ledger::default()).collect(),
            group_first,
            group_engine: plan.groups.iter().map(|g| g.engine).collect(),
            group_kernel_mode: plan.groups.iter().map(|g| g.kernel_mode).collect(),
            faults_seen: 0,
            waits_decided_seen: 0,
            waiting_queues,
            f1_entries_seen: 0,
            engine_queues,
            upstream,
            hung_engines: vec![false; plan.system.gpu.engines.len()],
            hang_ns,
            faults: faults.iter().cloned().collect(),
            held: Vec::new(),
            last_disturbance: 0,
            violations: BTreeMap::new(),
            instants: 0,
            applied: BTreeMap::new(),
            lost_queue: None,
            repeated: false,
            backwards: false,
            leaked: None,
            twin_armed: false,
            window: plan.duration.unwrap_or(0),
        }
    }

    /// The command that reproduces this seed.
    pub fn repro(seed: u64, inject: Option<Inject>) -> String {
        let mut s = format!("doorbell sim swarm --seeds 1 --from {seed}");
        if let Some(i) = inject {
            let _ = write!(s, " --inject {}", i.name());
        }
        s
    }

    fn violate(&mut self, checker: &'static str, now: u64, queue: Option<usize>, what: String) {
        let e = self.violations.entry(checker).or_insert_with(|| {
            let history = queue.map(|q| self.queues[q].history.iter().cloned().collect()).unwrap_or_default();
            let v = Violation {
                seed: self.seed,
                checker,
                instant_ns: now,
                queue,
                what,
                history,
                repro: Self::repro(self.seed, self.inject),
            };
            (v, 0)
        });
        e.1 += 1;
    }

    /// Whether the kernel ended queue `i` (reset it, faulted it): then it has no more work to
    /// do, and its loss is noted. Asked only when a bound passed (a status query per queue
    /// and instant would slow every run).
    fn ended_by_kernel(&mut self, i: usize, now: u64, v: &crate::observe::QueueView<'_>) -> bool {
        let Some(why) = v.lost() else { return false };
        let l = &mut self.queues[i];
        l.lost = true;
        l.note(now, format!("found lost: {why}"));
        true
    }

    /// Whether queue `i` waits (on the GPU, `after`) for a queue that will never signal again:
    /// one whose kernel hung, whose process was killed, or that the kernel ended — directly or
    /// further up. Its work then waits for ever, as the scenario asked, and liveness does not
    /// apply to it.
    fn upstream_stopped(&self, i: usize) -> bool {
        self.stopped_from(self.upstream[i])
    }

    /// [`Checker::upstream_stopped`], asking the kernel first whether each queue up the chain
    /// ended ([`Checker::look_upstream`]): for a verdict on queue `i` at `now`.
    fn upstream_stopped_now(&mut self, i: usize, now: u64, world: &World<'_>) -> bool {
        self.look_upstream(i, now, world);
        self.upstream_stopped(i)
    }

    /// Asks the kernel whether each queue up queue `i`'s `after` chain that is not known to
    /// have stopped has ended. A reset upstream is otherwise noted only once its own bound
    /// passes ([`Checker::ended_by_kernel`]), which may come after the bound of the queue that
    /// waits on it.
    fn look_upstream(&mut self, i: usize, now: u64, world: &World<'_>) {
        let mut at = self.upstream[i];
        for _ in 0..self.upstream.len() {
            let Some(u) = at else { return };
            let l = &self.queues[u];
            if l.hung.is_none() && !l.killed && !l.lost {
                self.ended_by_kernel(u, now, &world.queue(u));
            }
            at = self.upstream[u];
        }
    }

    /// Whether the hung kernel of queue `i` can never start: its command buffer waits
    /// (`after`) for an upstream value that will never come, the upstream having stopped
    /// below it (as far as the checker knows). Nothing then runs on the engine that a hang
    /// timer could catch.
    fn hang_never_starts(&self, i: usize) -> bool {
        let (Some(u), Some(w)) = (self.upstream[i], self.queues[i].hung_waits_for) else { return false };
        self.queues[u].recorded < w && self.stopped_from(Some(u))
    }

    /// [`Checker::hang_never_starts`], asking the kernel first whether each queue up the
    /// chain ended: for a verdict on queue `i` at `now`.
    fn hang_never_starts_now(&mut self, i: usize, now: u64, world: &World<'_>) -> bool {
        self.look_upstream(i, now, world);
        self.hang_never_starts(i)
    }

    /// Whether queue `at`, or one further up from it, will never signal again.
    fn stopped_from(&self, mut at: Option<usize>) -> bool {
        // A chain is at most as long as the groups (no cycles: the scenario refuses them).
        for _ in 0..self.upstream.len() {
            let Some(u) = at else { return false };
            let l = &self.queues[u];
            if l.hung.is_some() || l.killed || l.lost {
                return true;
            }
            at = self.upstream[u];
        }
        false
    }

    /// A scenario event as the runner applies it: what it exempts and disturbs.
    fn scenario_event_at(&mut self, t: u64, a: &Action, world: &World<'_>) {
        self.last_disturbance = self.last_disturbance.max(t);
        match *a {
            Action::Kill { group, queue } => {
                // Every queue of its process ends with it.
                let pid = world.queue(world.global(group, queue)).process;
                for i in 0..world.queue_count() {
                    if world.queue(i).process == pid {
                        self.queues[i].killed = true;
                    }
                }
            }
            Action::Hang { group, queue } => {
                let i = self.group_first[group] + queue as usize;
                self.queues[i].hang_armed = true;
                self.queues[i].note(t, "hang armed".into());
            }
            Action::D3 => {}
            Action::Suspend { group, queue, for_ns } => {
                // Every queue of the context (its process's queues of that group).
                let pid = world.queue(world.global(group, queue)).process;
                let until = for_ns.map_or(u64::MAX, |d| t + d);
                for i in 0..world.queue_count() {
                    let v = world.queue(i);
                    if v.process == pid && v.group == group {
                        self.queues[i].exempt_until = self.queues[i].exempt_until.max(until);
                        self.queues[i].note(t, "context suspended".into());
                    }
                }
            }
        }
    }

    /// Faults due by `now`, applied; holds that end by `now`, resumed.
    fn apply_faults(&mut self, now: u64, world: &World<'_>) {
        let sys = world.system();
        let mut k = 0;
        while k < self.held.len() {
            if self.held[k].until <= now {
                let h = self.held.swap_remove(k);
                let v = world.queue(h.queue);
                if let Some(handle) = v.handle {
                    // Refused only if the queue went away meanwhile: nothing to resume.
                    let _ = sys.resume_queue(v.process, handle);
                }
                self.queues[h.queue].note(now, "resumed from the hold".into());
                self.last_disturbance = now;
            } else {
                k += 1;
            }
        }
        while self.faults.front().is_some_and(|(t, _)| *t <= now) {
            let (_, f) = self.faults.pop_front().expect("checked");
            self.last_disturbance = now;
            match &f {
                Fault::Ddi { ddi, call } => sys.inject_ddi_fault(kernel::ddi::DdiFault { ddi: *ddi, call: *call }),
                Fault::Misbehave { ddi, how } => sys.inject_misbehaviour(*ddi, *how),
                Fault::Hold { queue, hold_ns } => {
                    let v = world.queue(*queue);
                    let Some(handle) = v.handle else { continue };
                    if !v.live || sys.preempt_queue(v.process, handle).is_err() {
                        continue;
                    }
                    let until = now + hold_ns;
                    self.held.push(Held { queue: *queue, until });
                    let l = &mut self.queues[*queue];
                    l.exempt_until = l.exempt_until.max(until);
                    l.note(now, format!("held by a preemption request for {} µs", hold_ns / 1000));
                }
            }
            *self.applied.entry(f.kind()).or_default() += 1;
        }
    }
}

impl Observer for Checker {
    fn scenario_event(&mut self, now: u64, action: &Action, world: &World<'_>) {
        self.scenario_event_at(now, action, world);
    }

    fn cpu_wait(&mut self, now: u64, look: &WaitLook) {
        self.check_wait(now, look);
    }

    fn fence_signals(&mut self, now: u64, signals: &[gpu::FenceSignal]) {
        // `interrupts`: spec 002's conditional interrupt, signal by signal. The value passes
        // the MonitoredValue (the least value a CPU waiter waits for, less one; u64::MAX with
        // none) exactly when some waiter's value is reached: then the interrupt is owed (a
        // waiter would sleep through its value otherwise), and without it none is due.
        for s in signals {
            let due = s.value > s.monitored;
            if s.raised == due {
                continue;
            }
            let what = if s.raised {
                format!(
                    "fence {}: the signal of {} at {} ns raised an interrupt with MonitoredValue {} (no waiter's value reached)",
                    s.fence, s.value, s.at.0, s.monitored
                )
            } else {
                format!(
                    "fence {}: the signal of {} at {} ns passed MonitoredValue {} and raised no interrupt (a waiter's wake-up lost)",
                    s.fence, s.value, s.at.0, s.monitored
                )
            };
            self.violate("interrupts", now, None, what);
        }
    }

    fn completions(&mut self, now: u64, records: &mut Vec<Record>) {
        // The twins that break the device's records.
        match self.inject {
            Some(Inject::LostCompletions) if now >= self.window / 2 => {
                let lost = *self.lost_queue.get_or_insert(records[0].queue);
                records.retain(|r| r.queue != lost);
            }
            Some(Inject::RepeatedCompletion) if !self.repeated => {
                self.repeated = true;
                let r = records[0];
                records.insert(1, r);
            }
            Some(Inject::BackwardsFence) if !self.backwards => {
                if let Some(k) = records.iter().position(|r| r.value >= 2) {
                    self.backwards = true;
                    let r = Record { value: records[k].value - 1, ..records[k] };
                    records.insert(k + 1, r);
                }
            }
            _ => {}
        }
        for r in records.iter() {
            let l = &mut self.queues[r.queue];
            l.note(r.at, format!("completion {}", r.value));
            let (recorded, submitted) = (l.recorded, l.submitted);
            if r.value < recorded {
                let what = format!("queue {}: completion {} after completion {recorded}", r.queue, r.value);
                self.violate("monotone-fence", now, Some(r.queue), what);
            } else if r.value == recorded {
                let what = format!("queue {}: command buffer {} completed twice", r.queue, r.value);
                self.violate("exactly-once", now, Some(r.queue), what);
            } else if r.value > submitted {
                let what = format!(
                    "queue {}: completion {} of a command buffer never submitted (last {submitted})",
                    r.queue, r.value
                );
                self.violate("exactly-once", now, Some(r.queue), what);
            }
            let l = &mut self.queues[r.queue];
            if r.value > l.recorded {
                l.recorded = r.value;
                l.progressed = l.progressed.max(now);
            }
        }
    }

    fn submitted(&mut self, queue: usize, value: u64, now: u64) {
        let l = &mut self.queues[queue];
        if l.submitted == l.recorded {
            // An idle queue's wait starts now.
            l.progressed = now;
        }
        l.submitted = value;
        l.note(now, format!("submitted {value}"));
        if l.hang_armed {
            l.hang_armed = false;
            l.hung = Some((value, now));
            l.note(now, format!("command buffer {value} holds the hung kernel"));
            // Its `WAIT` asks for the upstream's last accepted value (the runner encodes it so).
            let waits_for = self.upstream[queue].map(|u| self.queues[u].submitted);
            self.queues[queue].hung_waits_for = waits_for;
        }
    }

    fn instant(&mut self, now: u64, world: &World<'_>) {
        self.instants += 1;
        let stats = world.system().stats();
        // Before this instant's faults (a resume among them): the engines as the run left them.
        self.check_f1(now, world, &stats);
        self.apply_faults(now, world);
        if self.inject == Some(Inject::Leak) && self.leaked.is_none() {
            self.leaked = world.system().open_process().ok();
        }
        if let Some(twin) = self.inject
            && !self.twin_armed
        {
            self.twin_armed = true;
            if let Some(b) = twin.kernel_twin() {
                world.system().break_deliberately(b);
            }
            if let Some(b) = twin.gpu_twin() {
                world.system().with_gpu(|g| g.break_deliberately(b));
            }
        }
        self.check_fault_records(now, world, &stats);
        self.check_held_waits(now, world, &stats);
        // Engines a hung kernel still holds: their other queues may wait behind it for as long
        // as it is not detected (hang-detected reports that, where a timer should detect it).
        let mut hung_engines = vec![false; self.hang_ns.len()];
        for i in 0..world.queue_count() {
            let l = &self.queues[i];
            if let Some((value, _)) = l.hung
                && l.recorded < value
                && !l.lost
                && world.queue(i).live
                && !self.hang_never_starts(i)
            {
                hung_engines[self.group_engine[world.queue(i).group]] = true;
            }
        }
        if hung_engines != self.hung_engines {
            // A hang ended (reset, killed): the queues behind it start their wait again.
            self.last_disturbance = now;
            self.hung_engines = hung_engines;
        }
        for i in 0..world.queue_count() {
            let v = world.queue(i);
            if let Some(read) = v.completed {
                let l = &mut self.queues[i];
                if read < l.read && v.live {
                    let what = format!("queue {i}: progress fence read {read} after {}", l.read);
                    self.violate("monotone-fence", now, Some(i), what);
                }
                let l = &mut self.queues[i];
                l.read = l.read.max(read);
            }
            if let (Some(signal), true) = (v.signal, v.live)
                && let Ok(value) = signal.value()
            {
                let l = &mut self.queues[i];
                if value < l.signal_read {
                    let what = format!("queue {i}: its signal fence read {value} after {}", l.signal_read);
                    l.note(now, format!("signal fence {value}"));
                    self.violate("monotone-fence", now, Some(i), what);
                }
                let l = &mut self.queues[i];
                l.signal_read = l.signal_read.max(value);
            }
            let l = &self.queues[i];
            if let Some(why) = v.ended {
                if !l.ended {
                    let l = &mut self.queues[i];
                    l.ended = true;
                    l.note(now, format!("ended: {why}"));
                }
                continue;
            }
            if !v.live {
                continue;
            }
            if l.lost {
                continue;
            }
            let engine = self.group_engine[v.group];
            if let Some((value, at)) = l.hung
                && l.recorded < value
                && self.hang_ns.get(engine).is_some_and(|&h| h > 0)
            {
                let limit = at + self.hang_ns[engine] + LIVENESS_BOUND_NS;
                if now > limit && !self.hang_never_starts_now(i, now, world) && !self.ended_by_kernel(i, now, &v) {
                    let what = format!(
                        "queue {i}: its kernel hung at {:.3} ms and the {} ms hang timer never ended it",
                        at as f64 / 1e6,
                        self.hang_ns[engine] / 1_000_000
                    );
                    self.violate("hang-detected", now, Some(i), what);
                }
                continue;
            }
            if l.hung.is_some() {
                continue;
            }
            if let Some((value, submitted)) = v.oldest_outstanding {
                let since = submitted.max(l.progressed).max(l.exempt_until).max(self.last_disturbance);
                let progressed = l.progressed;
                if l.exempt_until != u64::MAX
                    && !self.hung_engines[engine]
                    && now > since.saturating_add(LIVENESS_BOUND_NS)
                    && !self.upstream_stopped_now(i, now, world)
                    && !self.ended_by_kernel(i, now, &v)
                {
                    let what = format!(
                        "queue {i}: command buffer {value} outstanding since {:.3} ms, no progress since {:.3} ms",
                        submitted as f64 / 1e6,
                        progressed as f64 / 1e6
                    );
                    self.violate("liveness", now, Some(i), what);
                }
            }
        }
    }

    fn teardown(&mut self, now: u64, sys: &System) {
        let c = sys.census();
        let left: Vec<String> = [
            ("processes", c.processes),
            ("queues", c.queues),
            ("doorbells", c.doorbells),
            ("allocations", c.allocations),
            ("fences", c.fences),
            ("doorbell pages", c.doorbell_pages),
            ("kernel doorbells", c.kernel_doorbells),
            ("GPU mappings", c.gpu_mappings),
            ("waits", c.waits),
        ]
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(what, n)| format!("{n} {what}"))
        .collect();
        if !left.is_empty() {
            self.violate(
                "census",
                now,
                None,
                format!("after every process ended the kernel holds {}", left.join(", ")),
            );
        }
        self.leaked = None;
    }

    fn wake_at(&self) -> Option<u64> {
        let hold = self.held.iter().map(|h| h.until).min();
        let fault = self.faults.front().map(|f| f.0);
        [hold, fault].into_iter().flatten().min()
    }
}

impl Checker {
    /// At the run's end: every command buffer completed, or its queue ended with a reason
    /// (`exactly-once`); `outcome` is the runner's account.
    pub fn finish(&mut self, outcome: &crate::Outcome) {
        for (i, q) in outcome.queues.iter().enumerate() {
            let l = &self.queues[i];
            let lost = q.submitted - q.completed;
            let hung_target = l.hung.is_some();
            let reason = q.ended.as_deref().unwrap_or("");
            let waits_forever = self.upstream_stopped(i) || self.hung_engines[self.group_engine[q.group]];
            if lost > 0
                && (q.ended.is_none() || reason.starts_with("work outstanding"))
                && !hung_target
                && !l.lost
                && !waits_forever
            {
                let what = format!(
                    "queue {i}: {lost} of {} command buffers never completed and the queue did not end ({})",
                    q.submitted,
                    if reason.is_empty() { "no reason" } else { reason }
                );
                self.violate("exactly-once", outcome.end, Some(i), what);
            }
        }
    }
}
