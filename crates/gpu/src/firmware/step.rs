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

use abi::preempt::StopPoint;
use abi::queue::Access;
use abi::slab::Slab;
use abi::{Priority, QueueState};

use crate::Time;
use crate::memory::AddressSpace;

use super::doorbells::{self};
use super::exec::{Env, run_queue};
use super::log::FwEvent;
use super::power::Timer;
use super::preempt::{self};
use super::queue::{FwQueue, FwQueueId};
use super::ring::FetchWindow;
use super::schedule::{self};
use super::{Engine, Firmware, StepReport};

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

impl Firmware {
    pub(crate) fn step(&mut self, clock: &dyn Fn() -> Time, vms: &[Option<AddressSpace>]) -> StepReport {
        if self.hw.is_some() {
            return self.step_hardware(clock, vms);
        }
        let now = clock();
        self.last_step = now;
        let mut report = StepReport::default();
        let Firmware {
            engines,
            queues,
            irqs,
            budget,
            wave_width,
            dispatch_budget,
            compute,
            fences,
            quanta,
            cost,
            timing,
            log,
            attention,
            completions,
            use_seq,
            misses_unmapped,
            horizon,
            ..
        } = self;
        let modelled = *timing == crate::cost::Timing::Modelled;
        // What every packet costs, and how long a turn lasts (ns).
        let (packet_ns, turn_ns) = (crate::cost::ns(cost.packet), crate::cost::ns(cost.turn));
        // The command processor's fetch buffer, emptied at each turn (see `run_queue`).
        let mut window = FetchWindow::new();
        for e in engines.iter_mut().filter(|e| e.power.is_on()) {
            // Still executing the work of an earlier step (modelled timing): nothing new
            // starts before the busy period ends.
            if modelled && e.timers.get(Timer::Busy).is_some_and(|t| now < t) {
                continue;
            }
            wake_sleepers(e, queues, vms, fences.epoch);
            let mut elapsed = 0u64;
            let mut busy = false;
            // Scheduling passes of this step: the first, and one more each time a turn is cut
            // short by a ring on a sentinel doorbell (below).
            let mut passes = 0;
            // Holders whose turn in this step is over (a pass after a cut-in gives the others
            // theirs, and a queue that rang again another). The engine's lists, kept between
            // steps: a step allocates nothing.
            let mut turns = std::mem::take(&mut e.turns);
            turns.had_turn.clear();
            loop {
                // The device time of this pass: a pass after a cut-in starts where the cut turn
                // ended.
                let at = match passes {
                    0 => now,
                    _ if modelled => Time(now.0.saturating_add(elapsed)),
                    _ => clock(),
                };
                passes += 1;
                schedule::schedule(e, queues, at, *quanta, log);
                watch_sentinels(e, queues);
                let mut answered = Vec::new();
                let n = e.hqd.len();
                // Slot holders take their turns by priority, round-robin among equals: a queue
                // that just cut in runs first. (Each holder's priority is read once; the sort
                // is stable.)
                turns.order.clear();
                let (later, from_cursor) = e.hqd.split_at(e.cursor.checked_rem(n).unwrap_or(0));
                turns.order.extend(
                    from_cursor
                        .iter()
                        .chain(later)
                        .map(|&id| (std::cmp::Reverse(queues.get(id.0).map_or(Priority::Low, |q| q.cfg.priority)), id)),
                );
                turns.order.sort_by_key(|&(priority, _)| priority);
                let mut cut = false;
                for k in 0..turns.order.len() {
                    if cut {
                        break;
                    }
                    let id = turns.order[k].1;
                    if k > 0 {
                        // A queue that went idle in an earlier turn of this step (a high-priority
                        // queue that just finished) is watched from now on: its next ring must
                        // cut the turns still to come, not wait for the step to end.
                        watch_sentinels(e, queues);
                    }
                    let Ok(q) = queues.get_mut(id.0) else { continue };
                    if !q.pending || q.state != QueueState::Mapped {
                        continue;
                    }
                    busy = true;
                    if turns.had_turn.contains(&id) {
                        continue;
                    }
                    // Parked on a fence that has not changed: nothing to re-check. (It still has
                    // work, so the engine stays awake, as for any queue blocked in a WAIT.)
                    if q.parked == Some(fences.epoch) && q.preempt.is_none() {
                        continue;
                    }
                    q.parked = None;
                    q.last_run = at;
                    // The device time charged before this turn (its restore is part of it).
                    let charged_before = elapsed;
                    let restored = q.saved.is_some();
                    if let Some(point) = q.saved.take() {
                        log.push(Time(now.0.saturating_add(elapsed)), FwEvent::Restored { queue: id, point });
                        // Bringing its state back occupies the engine before the queue runs.
                        elapsed = elapsed.saturating_add(cost.restore_ns(point));
                    }
                    let before = compute.instructions;
                    let mut env = Env {
                        fences,
                        clock,
                        cost,
                        packet_ns,
                        timing: *timing,
                        start: now,
                        elapsed,
                        turn_end: elapsed.saturating_add(turn_ns),
                        bytes: 0,
                        kind: e.kind,
                        wave_width: *wave_width,
                        dispatch_budget: *dispatch_budget,
                        stats: compute,
                        irqs,
                        stop: e.stop,
                        attention,
                        sentinels: &e.sentinels,
                        cut: false,
                        horizon: horizon.filter(|&h| modelled && h > now),
                        completions: completions.as_mut(),
                    };
                    // Blocked before this turn, in this slot: a queue just given its slot back
                    // that blocks again on the same `WAIT` has just blocked here all the same.
                    let was_blocked = q.blocked && !restored;
                    let (packets, stopped) = run_queue(q, id, vms, *budget, &mut env, &mut window);
                    report.packets += packets;
                    let stopped_at = env.now();
                    // The engine was busy for what the turn charged, ending where it stopped:
                    // with modelled timing exactly the turn; with real timing (engines share
                    // the firmware thread) its own work, not the other engines' before it.
                    let charged = env.elapsed.saturating_sub(charged_before);
                    if packets > 0 || charged > 0 {
                        e.busy.record(Time(stopped_at.0.saturating_sub(charged)), stopped_at);
                    }
                    // The queue ran for what the turn charged, unless the turn only re-checked
                    // a `WAIT` that still does not pass: waiting is not running (the hang
                    // timer's measure, `FwQueue::run_ns`).
                    if packets > 0 || !q.blocked {
                        q.run_ns = q.run_ns.saturating_add(charged);
                    }
                    elapsed = env.elapsed;
                    cut = env.cut;
                    if !cut {
                        turns.had_turn.push(id);
                    }
                    // A preemption is answered once the queue stopped at an allowed point, ran
                    // dry or hung.
                    // (Answered after the round: answering takes the queue out of `hqd`.)
                    if q.preempt.is_some() && (stopped.is_some() || !q.pending || q.state != QueueState::Mapped) {
                        answered.push((id, stopped.unwrap_or(StopPoint::Idle), stopped_at));
                        continue;
                    }
                    report.bytes += env.bytes;
                    report.instructions += compute.instructions - before;
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
                }
                if n > 0 && passes == 1 {
                    e.cursor = (e.cursor + 1) % n;
                }
                for (id, point, at) in answered {
                    if let Ok(q) = queues.get_mut(id.0) {
                        preempt::finish(e, q, id, point, at, log, Some(&mut *irqs));
                    }
                }
                // A turn cut short by a ring on a sentinel doorbell — a queue that would take a
                // busy holder's slot — rather than by the kernel's attention (which wants the
                // device lock): the ring is latched here and the scheduling pass taken again,
                // so that queue starts now, not after the rest of the step, the driver's work
                // between steps and the next doorbell poll (as a hardware scheduler reacts to
                // the doorbell write itself). The holders whose turn is over in this step wait
                // for the next; the queues that rang get a new turn. Bounded, so a client
                // ringing without pause cannot hold the step.
                if !(cut
                    && passes <= MAX_CUT_IN_PASSES
                    && !attention.is_raised()
                    && doorbells::latch_sentinels(e, queues, use_seq, *misses_unmapped, &mut turns.had_turn))
                {
                    break;
                }
            }
            e.turns = turns;
            spill_evicted(e, queues);
            if busy {
                e.busy_at(now);
            }
            if modelled && elapsed > 0 {
                // The engine is busy until the modelled end of what it just ran.
                e.timers.set(Timer::Busy, Some(Time(now.0.saturating_add(elapsed))));
            }
        }
        report
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
        let Some(q) = queues.get_mut(id.0).ok().filter(|q| q.asleep) else {
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
