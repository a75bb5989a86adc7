//! The firmware's step ([`Firmware::step`]): every engine in F0 takes a scheduling pass, then
//! each pending slot holder its turn, by priority and round-robin among equals, for up to
//! `packet_budget` packets each ([`super::exec::run_queue`]). A turn cut short by a ring on a
//! sentinel doorbell — a queue that would take a busy holder's slot — latches the ring and
//! takes the pass again, so that queue starts at once. Before the pass, the queues asleep on a
//! `WAIT` whose condition now holds wake ([`wake_sleepers`]); after the step, the queues the
//! scheduler evicted spill their live dispatch state.
//!
//! Invariant: a step allocates nothing (its lists are the engine's, kept between steps), and
//! with modelled timing an engine busy with the work of an earlier step starts nothing new
//! before its busy timer fires.

use std::sync::atomic::Ordering;

use abi::preempt::Stop;
use abi::preempt::StopPoint;
use abi::queue::Access;
use abi::slab::Slab;
use abi::{EngineKind, Priority, QueueState};

use crate::Time;
use crate::attention::Attention;
use crate::compute::ComputeStats;
use crate::cost::{CostModel, Timing};
use crate::memory::AddressSpace;

use super::doorbells::{self};
use super::exec::{Env, run_queue};
use super::fences::Fences;
use super::log::FwEvent;
use super::log::FwLog;
use super::power::Timer;
use super::preempt::Sentinel;
use super::preempt::{self};
use super::queue::{FwQueue, FwQueueId};
use super::ring::FetchWindow;
use super::schedule::Quanta;
use super::schedule::{self};
use super::{Completion, Engine, Firmware, Irqs, StepReport};

/// The most scheduling passes an engine takes again in one step for rings heard on its
/// sentinel doorbells ([`Firmware::step`]). A live step gives each busy holder a turn (a
/// hundred microseconds of device time each), so a high-priority client may ring many times
/// within one.
const MAX_CUT_IN_PASSES: u32 = 64;

/// A step's lists of turns on one engine ([`Firmware::step`]), kept by the engine between
/// steps so that a step allocates nothing.
#[derive(Default)]
pub(super) struct Turns {
    /// This pass's slot holders in turn order, each with its priority (read once).
    order: Vec<(std::cmp::Reverse<Priority>, FwQueueId)>,
    /// Holders whose turn in this step is over.
    had_turn: Vec<FwQueueId>,
}

/// One engine's progress through a step ([`Step::engine`]).
struct EngineStep {
    /// Modelled device time the engine has spent in this step so far (ns).
    elapsed: u64,
    /// A slot holder had work: the engine's idle period starts over.
    busy: bool,
    /// Scheduling passes of this step: the first, and one more each time a turn is cut short
    /// by a ring on a sentinel doorbell ([`Step::cut_in`]).
    passes: u32,
    /// The engine's lists of turns, taken from it for the step and given back after.
    turns: Turns,
}

/// What became of a slot holder in a pass ([`Step::take_turn`]).
enum Turn {
    /// Not pending, or not mapped: no turn, and nothing that keeps the engine awake.
    Idle,
    /// It has work, but no turn now: it had its turn in this step, or it is parked on a fence
    /// that has not changed (nothing to re-check).
    Skipped,
    /// It ran. `cut`: the turn was cut short ([`Env::interrupted`]), and the pass ends there;
    /// `answer`: where and when the queue stopped for the preemption it owed, answered after
    /// the pass (answering takes the queue out of `hqd`).
    Ran { cut: bool, answer: Option<(StopPoint, Time)> },
}

/// What a turn's [`Env`] borrows from the device, and the step's settings it copies.
struct TurnParts<'a> {
    fences: &'a mut Fences,
    irqs: &'a mut Irqs,
    compute: &'a mut ComputeStats,
    attention: &'a Attention,
    completions: &'a mut Option<Vec<Completion>>,
    clock: &'a dyn Fn() -> Time,
    cost: &'a CostModel,
    timing: Timing,
    wave_width: u32,
    dispatch_budget: u64,
    /// When the step began.
    now: Time,
    /// What every packet costs, and how long a turn lasts (ns).
    packet_ns: u64,
    turn_ns: u64,
    /// With modelled timing, the horizon, if after the step's start.
    horizon: Option<Time>,
}

impl TurnParts<'_> {
    fn modelled(&self) -> bool {
        self.timing == Timing::Modelled
    }

    /// The execution environment of a turn on an engine of `kind` that stops queues at `stop`
    /// and watches `sentinels`, starting `elapsed` into the step.
    fn env<'b>(&'b mut self, kind: EngineKind, stop: Stop, sentinels: &'b [Sentinel], elapsed: u64) -> Env<'b> {
        Env {
            fences: &mut *self.fences,
            clock: self.clock,
            cost: self.cost,
            packet_ns: self.packet_ns,
            timing: self.timing,
            start: self.now,
            elapsed,
            turn_end: elapsed.saturating_add(self.turn_ns),
            bytes: 0,
            kind,
            wave_width: self.wave_width,
            dispatch_budget: self.dispatch_budget,
            stats: &mut *self.compute,
            irqs: &mut *self.irqs,
            stop,
            attention: self.attention,
            sentinels,
            cut: false,
            horizon: self.horizon,
            completions: self.completions.as_mut(),
        }
    }
}

/// What the engines' steps share: the device's state, borrowed from the [`Firmware`] once per
/// step ([`Firmware::split_for_step`]), and the step's settings.
struct Step<'a> {
    /// The queue table.
    queues: &'a mut Slab<FwQueue>,
    /// What each turn's execution borrows.
    turn: TurnParts<'a>,
    /// The firmware log (restores, answers, the scheduler's evictions).
    log: &'a mut FwLog,
    /// The doorbells' use clock ([`doorbells::latch_sentinels`]).
    use_seq: &'a mut u64,
    /// Engines drop rings of queues without a hardware slot.
    misses_unmapped: bool,
    quanta: Quanta,
    /// Packets a turn runs at most.
    budget: u32,
    vms: &'a [Option<AddressSpace>],
    /// The command processor's fetch buffer, emptied at each turn (see `run_queue`).
    window: FetchWindow,
}

impl Firmware {
    /// Runs every engine in F0 for one step (see the module docs).
    pub(crate) fn step(&mut self, clock: &dyn Fn() -> Time, vms: &[Option<AddressSpace>]) -> StepReport {
        if self.hw.is_some() {
            return self.step_hardware(clock, vms);
        }
        let now = clock();
        self.last_step = now;
        let mut report = StepReport::default();
        let (engines, mut step) = self.split_for_step(clock, vms, now);
        for e in engines.iter_mut().filter(|e| e.power.is_on()) {
            step.engine(e, &mut report);
        }
        report
    }

    /// The engines, and what their steps share ([`Step`]).
    fn split_for_step<'a>(
        &'a mut self,
        clock: &'a dyn Fn() -> Time,
        vms: &'a [Option<AddressSpace>],
        now: Time,
    ) -> (&'a mut Vec<Engine>, Step<'a>) {
        let modelled = self.timing == Timing::Modelled;
        let turn = TurnParts {
            fences: &mut self.fences,
            irqs: &mut self.irqs,
            compute: &mut self.compute,
            attention: &self.attention,
            completions: &mut self.completions,
            clock,
            cost: &self.cost,
            timing: self.timing,
            wave_width: self.wave_width,
            dispatch_budget: self.dispatch_budget,
            now,
            packet_ns: crate::cost::ns(self.cost.packet),
            turn_ns: crate::cost::ns(self.cost.turn),
            horizon: self.horizon.filter(|&h| modelled && h > now),
        };
        let step = Step {
            queues: &mut self.queues,
            turn,
            log: &mut self.log,
            use_seq: &mut self.doorbells.use_seq,
            misses_unmapped: self.doorbells.misses_unmapped,
            quanta: self.quanta,
            budget: self.budget,
            vms,
            window: FetchWindow::new(),
        };
        (&mut self.engines, step)
    }
}

impl Step<'_> {
    /// One engine's step: its sleepers checked, then scheduling passes and turns, one pass more
    /// for each cut-in, then the evicted queues' spills and the engine's timers.
    fn engine(&mut self, e: &mut Engine, report: &mut StepReport) {
        let now = self.turn.now;
        // Still executing the work of an earlier step (modelled timing): nothing new
        // starts before the busy period ends.
        if self.turn.modelled() && e.timers.get(Timer::Busy).is_some_and(|t| now < t) {
            return;
        }
        wake_sleepers(e, self.queues, self.vms, self.turn.fences.epoch);
        // Holders whose turn in this step is over (a pass after a cut-in gives the others
        // theirs, and a queue that rang again another). The engine's lists, kept between
        // steps: a step allocates nothing.
        let mut es = EngineStep { elapsed: 0, busy: false, passes: 0, turns: std::mem::take(&mut e.turns) };
        es.turns.had_turn.clear();
        loop {
            let at = self.pass_time(es.passes, es.elapsed);
            es.passes += 1;
            let cut = self.pass(e, &mut es, at, report);
            if !(cut && es.passes <= MAX_CUT_IN_PASSES && self.cut_in(e, &mut es.turns.had_turn)) {
                break;
            }
        }
        e.turns = es.turns;
        spill_evicted(e, self.queues);
        if es.busy {
            e.busy_at(now);
        }
        if self.turn.modelled() && es.elapsed > 0 {
            // The engine is busy until the modelled end of what it just ran.
            e.timers.set(Timer::Busy, Some(Time(now.0.saturating_add(es.elapsed))));
        }
    }

    /// The device time of a pass: a pass after a cut-in starts where the cut turn ended.
    fn pass_time(&self, passes: u32, elapsed: u64) -> Time {
        match passes {
            0 => self.turn.now,
            _ if self.turn.modelled() => Time(self.turn.now.0.saturating_add(elapsed)),
            _ => (self.turn.clock)(),
        }
    }

    /// One scheduling pass at `at` and the turns of the slot holders it leaves, until one is
    /// cut short (`true`: the caller may take the pass again, [`Step::cut_in`]).
    fn pass(&mut self, e: &mut Engine, es: &mut EngineStep, at: Time, report: &mut StepReport) -> bool {
        schedule::schedule(e, self.queues, at, self.quanta, self.log);
        watch_sentinels(e, self.queues);
        let mut answered = Vec::new();
        let n = e.hqd.len();
        self.turn_order(e, &mut es.turns);
        let mut cut = false;
        for k in 0..es.turns.order.len() {
            if cut {
                break;
            }
            let id = es.turns.order[k].1;
            if k > 0 {
                // A queue that went idle in an earlier turn of this step (a high-priority
                // queue that just finished) is watched from now on: its next ring must
                // cut the turns still to come, not wait for the step to end.
                watch_sentinels(e, self.queues);
            }
            match self.take_turn(e, id, at, es, report) {
                Turn::Idle => {}
                Turn::Skipped => es.busy = true,
                Turn::Ran { cut: c, answer } => {
                    es.busy = true;
                    cut = c;
                    if let Some((point, at)) = answer {
                        answered.push((id, point, at));
                    }
                }
            }
        }
        if n > 0 && es.passes == 1 {
            e.cursor = (e.cursor + 1) % n;
        }
        for (id, point, at) in answered {
            if let Ok(q) = self.queues.get_mut(id.0) {
                preempt::finish(e, q, id, point, at, self.log, Some(&mut *self.turn.irqs));
            }
        }
        cut
    }

    /// Slot holders take their turns by priority, round-robin among equals: a queue that just
    /// cut in runs first. (Each holder's priority is read once; the sort is stable.)
    fn turn_order(&self, e: &Engine, turns: &mut Turns) {
        let n = e.hqd.len();
        turns.order.clear();
        let (later, from_cursor) = e.hqd.split_at(e.cursor.checked_rem(n).unwrap_or(0));
        turns.order.extend(
            from_cursor
                .iter()
                .chain(later)
                .map(|&id| (std::cmp::Reverse(self.queues.get(id.0).map_or(Priority::Low, |q| q.cfg.priority)), id)),
        );
        turns.order.sort_by_key(|&(priority, _)| priority);
    }

    /// Slot holder `id`'s turn in the pass at `at`, if it has one: its restore, its packets
    /// ([`run_queue`]), and what the turn tells the engine's busy time, the queue's run time,
    /// the report and the next pass.
    fn take_turn(
        &mut self,
        e: &mut Engine,
        id: FwQueueId,
        at: Time,
        es: &mut EngineStep,
        report: &mut StepReport,
    ) -> Turn {
        let Ok(q) = self.queues.get_mut(id.0) else { return Turn::Idle };
        if !q.pending || q.state != QueueState::Mapped {
            return Turn::Idle;
        }
        if es.turns.had_turn.contains(&id) {
            return Turn::Skipped;
        }
        // Parked on a fence that has not changed: nothing to re-check. (It still has
        // work, so the engine stays awake, as for any queue blocked in a WAIT.)
        if q.parked == Some(self.turn.fences.epoch) && q.preempt.request.is_none() {
            return Turn::Skipped;
        }
        q.parked = None;
        q.sched.last_run = at;
        // The device time charged before this turn (its restore is part of it).
        let charged_before = es.elapsed;
        let restored = q.preempt.saved.is_some();
        if let Some(point) = q.preempt.saved.take() {
            self.log.push(Time(self.turn.now.0.saturating_add(es.elapsed)), FwEvent::Restored { queue: id, point });
            // Bringing its state back occupies the engine before the queue runs.
            es.elapsed = es.elapsed.saturating_add(self.turn.cost.restore_ns(point));
        }
        let before = self.turn.compute.instructions;
        let mut env = self.turn.env(e.kind, e.stop, &e.sentinels, es.elapsed);
        // Blocked before this turn, in this slot: a queue just given its slot back
        // that blocks again on the same `WAIT` has just blocked here all the same.
        let was_blocked = q.blocked && !restored;
        let (packets, stopped) = run_queue(q, id, self.vms, self.budget, &mut env, &mut self.window);
        report.packets += packets;
        let stopped_at = env.now();
        let (ended, cut, bytes) = (env.elapsed, env.cut, env.bytes);
        // The engine was busy for what the turn charged, ending where it stopped:
        // with modelled timing exactly the turn; with real timing (engines share
        // the firmware thread) its own work, not the other engines' before it.
        let charged = ended.saturating_sub(charged_before);
        if packets > 0 || charged > 0 {
            e.busy.record(Time(stopped_at.0.saturating_sub(charged)), stopped_at);
        }
        // The queue ran for what the turn charged, unless the turn only re-checked
        // a `WAIT` that still does not pass: waiting is not running (the hang
        // timer's measure, `FwQueue::run_ns`).
        if packets > 0 || !q.blocked {
            q.run_ns = q.run_ns.saturating_add(charged);
        }
        es.elapsed = ended;
        if !cut {
            es.turns.had_turn.push(id);
        }
        // A preemption is answered once the queue stopped at an allowed point, ran
        // dry or hung.
        if q.preempt.request.is_some() && (stopped.is_some() || !q.pending || q.state != QueueState::Mapped) {
            return Turn::Ran { cut, answer: Some((stopped.unwrap_or(StopPoint::Idle), stopped_at)) };
        }
        report.bytes += bytes;
        report.instructions += self.turn.compute.instructions - before;
        if q.pending && q.state == QueueState::Mapped {
            report.runnable += 1;
            // It has just blocked in a WAIT (or blocks again, just back in a slot):
            // its slot may go to a waiting queue (`schedule`), so the next pass must
            // not wait for a quantum. (Before, a queue evicted while blocked, woken
            // and mapped again, held the slot to its quantum's end: realtime queues
            // waiting on a high-priority one took turns in the only slot, and it
            // never ran; the swarm's seed 408.)
            if q.blocked && (packets > 0 || !was_blocked) {
                e.resched = true;
            }
        } else {
            // Idle or hung: its slot may go to a waiting queue.
            e.resched = true;
        }
        Turn::Ran { cut, answer: None }
    }

    /// The in-step cut-in: a turn cut short by a ring on a sentinel doorbell — a queue that
    /// would take a busy holder's slot — rather than by the kernel's attention (which wants
    /// the device lock). The ring is latched here and the scheduling pass taken again
    /// (`true`), so that queue starts now, not after the rest of the step, the driver's work
    /// between steps and the next doorbell poll (as a hardware scheduler reacts to the
    /// doorbell write itself). The holders whose turn is over in this step wait for the next;
    /// the queues that rang get a new turn. Bounded by the caller ([`MAX_CUT_IN_PASSES`]), so
    /// a client ringing without pause cannot hold the step.
    fn cut_in(&mut self, e: &mut Engine, had_turn: &mut Vec<FwQueueId>) -> bool {
        !self.turn.attention.is_raised()
            && doorbells::latch_sentinels(e, self.queues, self.use_seq, self.misses_unmapped, had_turn)
    }
}

/// Writes the live dispatch state of the queues evicted in this step to their save areas
/// ([`Engine::unspilled`]), unless a later pass of the step mapped them again.
fn spill_evicted(e: &mut Engine, queues: &mut Slab<FwQueue>) {
    for id in e.unspilled.drain(..) {
        if let Ok(q) = queues.get_mut(id.0)
            && q.state != QueueState::Mapped
        {
            q.spill();
        }
    }
}

/// Wakes the queues of `e` asleep on a `WAIT` whose condition now holds
/// ([`schedule::wake`]: they wait for a slot again), and drops the entries of queues that no
/// longer sleep. A queue waiting on a native fence whose changes the device hears of is only
/// re-checked when the fence epoch moved since the last check; one waiting on plain memory,
/// which anyone may write without telling, at every step (one load each). A condition that can
/// no longer be read (its memory unmapped) wakes the queue, which faults when it runs.
pub(super) fn wake_sleepers(e: &mut Engine, queues: &mut Slab<FwQueue>, vms: &[Option<AddressSpace>], epoch: u64) {
    if e.asleep.is_empty() {
        return;
    }
    let moved = std::mem::replace(&mut e.asleep_epoch, epoch) != epoch;
    let mut k = 0;
    while k < e.asleep.len() {
        let id = e.asleep[k];
        let Some(q) = queues.get_mut(id.0).ok().filter(|q| q.sched.asleep) else {
            e.asleep.swap_remove(k);
            continue;
        };
        let passes = match q.wait_on {
            Some(w) if w.park && !moved => false,
            Some(w) => vms
                .get(w.vmid.0 as usize)
                .and_then(Option::as_ref)
                .and_then(|vm| vm.translate_aligned(w.va, 8, Access::Read).ok())
                // Acquire: pairs with the signaller's release store, as the WAIT's own read.
                .and_then(|r| r.shm.load_u64(r.offset, Ordering::Acquire).ok())
                .is_none_or(|v| v >= w.value),
            None => true,
        };
        if passes {
            e.asleep.swap_remove(k);
            q.parked = None;
            schedule::wake(e, q, id);
        } else {
            k += 1;
        }
    }
}

/// Rebuilds `e`'s sentinel doorbells ([`Engine::sentinels`]) for this step: the watched
/// doorbells of idle queues with a higher priority than the lowest busy slot holder. Skipped
/// (no sentinels) on an engine with more than [`preempt::MAX_SENTINEL_WATCHES`] doorbells.
#[inline]
fn watch_sentinels(e: &mut Engine, queues: &Slab<FwQueue>) {
    e.sentinels.clear();
    if e.watch_at.len() > preempt::MAX_SENTINEL_WATCHES {
        return;
    }
    watch_sentinels_of(e, queues);
}

/// [`watch_sentinels`] on an engine with few enough doorbells.
fn watch_sentinels_of(e: &mut Engine, queues: &Slab<FwQueue>) {
    let busy = |id: &FwQueueId| queues.get(id.0).ok().filter(|q| q.pending && q.state == QueueState::Mapped);
    let Some(lowest) = e.hqd.iter().filter_map(busy).map(|q| q.cfg.priority).min() else { return };
    for w in e.watches.iter().flatten() {
        if queues.get(w.queue.0).is_ok_and(|q| !q.pending && q.cfg.priority > lowest && q.state != QueueState::Hung) {
            e.sentinels.push(preempt::Sentinel { word: w.word.clone(), last: w.last, queue: w.queue });
        }
    }
}
