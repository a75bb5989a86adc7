//! A scheduling pass ([`schedule`]): who holds an engine's hardware slots now. It walks the
//! waiting set's class heads in waiting order, maps waiters into free slots, evicts the
//! holders a waiter may take a slot from ([`Holder::eviction_rank`]: a higher priority, a spent
//! quantum, a holder blocked in a `WAIT`), and arms the quantum timer for the next time a
//! holder's quantum runs out against a waiter. A pass that would read what the last one read,
//! when that one changed nothing, is skipped ([`Settled`]).

use abi::slab::Slab;
use abi::{Priority, QueueState};

use crate::Time;
use crate::memory::Vmid;

use super::{Class, Quanta, Schedulable, Seat, Waiting, sync_waiting, unseat};
use crate::firmware::Engine;
use crate::firmware::log::{FwEvent, FwLog, Requester};
use crate::firmware::power::Timer;
use crate::firmware::queue::FwQueueId;

/// A slot holder as a scheduling pass sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(in crate::firmware) struct Holder {
    pub(super) id: FwQueueId,
    /// Mapped in this pass, or asked in it to stop for a waiter: not a victim in it.
    pub(super) placed: bool,
    pub(super) pending: bool,
    /// Blocked in a `WAIT` that does not pass.
    pub(super) blocked: bool,
    pub(super) privileged: bool,
    pub(super) prio: Priority,
    pub(super) vm: Vmid,
    /// Its gang quantum runs from here (when it got the slot).
    pub(super) slice_start: Time,
    /// Its process quantum runs from here (when its address space got the slot).
    pub(super) process_start: Time,
}

impl Holder {
    fn of(id: FwQueueId, seat: &Seat, placed: bool) -> Holder {
        Holder {
            id,
            placed,
            pending: seat.pending,
            blocked: seat.blocked,
            privileged: !seat.class.user,
            prio: seat.class.priority.0,
            vm: seat.class.vmid,
            slice_start: seat.slice_start,
            process_start: seat.process_start,
        }
    }

    /// Whether this holder gives its slot to a waiter of `class` (`same_space`: of its own
    /// address space) at `now`, and how readily (the lowest rank goes first): an idle one, then
    /// one blocked in a `WAIT` (where `blocked_yields`: its engine may stop a wait), then one of
    /// lower priority (lowest first), then one of equal priority past its quantum
    /// (longest-running first). Within one address space the gang quantum applies, from when
    /// this queue got the slot; between two, the process quantum, from when its address space
    /// did (gang rotation does not restart it). A kernel queue takes its slot from any user
    /// queue; a kernel queue keeps its own from every user queue.
    fn eviction_rank(
        &self,
        class: Class,
        same_space: bool,
        now: Time,
        quanta: Quanta,
        blocked_yields: bool,
    ) -> Option<(u8, Priority, Time)> {
        let (w_priv, w_prio) = (!class.user, class.priority.0);
        if self.privileged && !w_priv {
            return None;
        }
        if w_priv && !self.privileged {
            return Some((0, self.prio, self.slice_start));
        }
        let (quantum, start) =
            if same_space { (quanta.gang, self.slice_start) } else { (quanta.process, self.process_start) };
        let rank = if !self.pending {
            0
        } else if self.blocked && blocked_yields {
            1
        } else if self.prio < w_prio {
            2
        } else if self.prio == w_prio && now.since(start) >= quantum {
            3
        } else {
            return None;
        };
        Some((rank, self.prio, start))
    }
}

/// Chooses which queues hold this engine's hardware slots (spec 001 "the scheduling firmware
/// dynamically maps and unmaps queues based on priority and time quanta"). Every queue on
/// the run list with work wants a slot; in order of priority (kernel queues first, then the
/// highest level, then the longest-waiting), each takes a free slot, or evicts a holder:
/// an idle one first, else one blocked in a `WAIT` (where its engine can stop a wait), else
/// one of lower priority (so a realtime queue evicts at once), else one of equal priority
/// that has used up its quantum (gang or process: see the module docs). An evicted queue with
/// work left is `Preempted` — stopped at a packet boundary or a dispatch slice, state saved —
/// and rings on an unmapped queue are remembered: it runs when it gets a slot back (a blocked
/// one sleeps until its `WAIT` passes first).
///
/// The waiting queues come from [`Engine::waiting`], never from a scan of the run list. Whether
/// a holder can be evicted for a waiter depends only on the waiter's [`Class`], and within a
/// pass the set of holders evictable for a class only shrinks (a queue mapped in this pass is
/// never evicted in it): so once one queue of a class finds no victim, the rest of its class
/// is skipped. A pass walks the class heads once, in order, so it takes
/// O(classes × slots) plus O(log n) per queue it maps, however long the run list.
///
/// One difference from the plain "walk every waiting queue" formulation: with a quantum of
/// zero, a queue mapped in this pass could there be evicted again later in the same pass by
/// another waiter of its priority; here it keeps its slot until the next pass. With a non-zero
/// quantum (the default, and every test) the two are the same.
pub(in crate::firmware) fn schedule<Q: Schedulable>(
    e: &mut Engine,
    queues: &mut Slab<Q>,
    now: Time,
    quanta: Quanta,
    log: &mut FwLog,
) {
    refit_kernel_queues(e, queues);
    // Every queue holds a slot (the common case: no oversubscription): nothing can wait. A
    // hung queue may linger in `hqd`; the run loop skips it.
    if e.hqd.len() == e.run_list.len() {
        return;
    }
    // Nothing changed and no quantum ran out: the assignment stands.
    if !e.resched && e.timers.get(Timer::Quantum).is_none_or(|t| now < t) {
        return;
    }
    e.resched = false;
    // The last pass changed nothing, and nothing it read has changed since: this one would
    // change nothing either (the usual pass of a loaded engine: a holder ran dry, which asks
    // for one, and rang again before it came).
    if e.pass.settled.is_some_and(|s| s.holds(e, queues, now)) {
        return;
    }
    e.timers.set(Timer::Quantum, None);
    // The pass's lists live with the engine between passes (a pass allocates nothing).
    let mut scratch = std::mem::take(&mut e.pass);
    let changed = pass(e, queues, now, quanta, log, &mut scratch);
    scratch.settled =
        (!changed).then(|| Settled { waiting: e.waiting.version, quantum_timer: e.timers.get(Timer::Quantum) });
    e.pass = scratch;
}

/// Whether the engine's kernel queues all fit its slots changed since the waiting set was
/// kept by it (a kernel queue joined or left the run list): the set is kept again, by a walk
/// of the run list (rare: it takes a kernel queue more than the slots, or one fewer, on an
/// engine without user-mode queues), and a pass looks.
fn refit_kernel_queues<Q: Schedulable>(e: &mut Engine, queues: &mut Slab<Q>) {
    let fit = e.kernel_queues <= e.hw_slots;
    if fit == e.kernel_fit {
        return;
    }
    e.kernel_fit = fit;
    e.resched = true;
    for k in 0..e.run_list.len() {
        let id = e.run_list[k];
        if let Ok(q) = queues.get_mut(id.0) {
            sync_waiting(e, q, id);
        }
    }
}

/// What a pass that changed nothing (mapped, evicted and asked nothing of anyone) read, beside
/// its holders ([`PassScratch::holders`], left as it read them): a pass is a function of the
/// holders' seats, the waiting set, the engine's constants and the time, and the time enters
/// only through quanta running out, which its quantum timer marks. So while the holders' seats
/// (in slot order), the waiting set and the timer are as that pass left them, and the timer
/// has not expired, another pass would change nothing again and arm the same timer: it is
/// not taken.
#[derive(Clone, Copy)]
pub(in crate::firmware) struct Settled {
    /// [`Waiting::version`] as the pass read it.
    pub(super) waiting: u64,
    /// The quantum timer it armed.
    pub(super) quantum_timer: Option<Time>,
}

impl Settled {
    /// Whether a pass at `now` would read what the settled one did, the time aside, before the
    /// timer it armed: the same holders with the same seats in the same slot order, every one
    /// still mapped, the same waiting set.
    pub(super) fn holds<Q: Schedulable>(&self, e: &Engine, queues: &Slab<Q>, now: Time) -> bool {
        let holders = &e.pass.holders;
        self.waiting == e.waiting.version
            && e.timers.get(Timer::Quantum) == self.quantum_timer
            && self.quantum_timer.is_none_or(|t| now < t)
            && e.hqd.len() == holders.len()
            && e.hqd.iter().zip(holders).all(|(&id, h)| {
                queues.get(id.0).is_ok_and(|q| {
                    let seat = q.seat();
                    seat.state == QueueState::Mapped && Holder::of(id, &seat, false) == *h
                })
            })
    }
}

/// A scheduling pass's working lists, kept by its engine so that a pass allocates nothing.
#[derive(Default)]
pub(in crate::firmware) struct PassScratch {
    /// The slot holders, read once (after a pass that changed nothing, as it read them).
    pub(super) holders: Vec<Holder>,
    /// The last pass changed nothing, and read this ([`Settled`]).
    pub(super) settled: Option<Settled>,
    /// Queues evicted with work left.
    pub(super) evicted: Vec<FwQueueId>,
    /// Which classes contend with each kind of holder (see [`pass`]).
    pub(super) asked: Vec<(HolderKind, (bool, bool))>,
}

/// What decides which waiting classes contend with a holder: its priority, privilege and
/// address space.
type HolderKind = (Priority, bool, Vmid);

/// [`schedule`]'s pass, once it is decided there is one. Returns whether it changed anything
/// other than the quantum timer: a holder gone from `hqd`, a queue mapped, evicted or asked
/// to stop.
fn pass<Q: Schedulable>(
    e: &mut Engine,
    queues: &mut Slab<Q>,
    now: Time,
    quanta: Quanta,
    log: &mut FwLog,
    scratch: &mut PassScratch,
) -> bool {
    let PassScratch { holders, evicted, asked, .. } = scratch;
    evicted.clear();
    asked.clear();
    let mut changed = read_holders(e, queues, holders);
    // A holder blocked in a `WAIT` that does not pass uses its slot for nothing, and may be
    // stopped there at every granularity but `None` (spec 003): it yields to any waiter.
    let blocked_yields = e.stop.allows_blocked_wait();
    if e.waiting.is_empty() {
        return changed;
    }
    // Kernel queues first, then priority, then whoever ran longest ago (then run-list order):
    // one walk over the class heads ([`Waiting::next_head`]). A class no holder can make room
    // for is left behind the walk, so the rest of it is skipped; when no holder would make
    // room for any class of its (privilege, priority), the walk jumps past them all. Queues
    // mapped in this pass (`placed`) are not victims in it; queues evicted with work left wait
    // again, but only from the next pass on.
    let mut walked = None;
    while let Some((key, class, w)) = e.waiting.next_head(walked) {
        walked = Some(key);
        // When its address space got this slot: now, unless it takes the slot from a busy
        // queue of its own address space (gang rotation), whose start it keeps.
        let mut process_start = now;
        if e.hqd.len() >= e.hw_slots {
            // Pick a holder to evict: idle first, then lower priority (lowest first), then an
            // equal-priority one past its quantum (longest-running first; the first of equals).
            // Kernel queues keep their slots.
            let rank = |h: &Holder, same_space| h.eviction_rank(class, same_space, now, quanta, blocked_yields);
            let mut victim: Option<((u8, Priority, Time), usize)> = None;
            for (k, h) in holders.iter().enumerate().filter(|(_, h)| !h.placed) {
                if let Some(r) = rank(h, h.vm == class.vmid)
                    && victim.is_none_or(|(best, _)| r < best)
                {
                    victim = Some((r, k));
                }
            }
            let Some((_, k)) = victim else {
                // Whether a holder gives way depends on the waiter's address space only
                // through "its own or another": if neither would take any holder's slot, no
                // class of this (privilege, priority) will. (The waiter's own relation to each
                // holder was just asked.)
                if holders.iter().filter(|h| !h.placed).all(|h| rank(h, h.vm != class.vmid).is_none()) {
                    walked = Some(Waiting::last_of_group(class));
                }
                continue;
            };
            let v = holders[k].id;
            changed = true;
            // A busy victim leaves its slot only at a point its engine's granularity allows:
            // if it stands elsewhere, it is asked to stop, and the slot changes hands at the
            // pass after it did ([`super::preempt`]). Meanwhile its class waits.
            // (A queue loaded in a hardware slot is asked even when idle: the slot may have
            // found work since the firmware last looked, and only its answer says.)
            if let Ok(q) = queues.get_mut(v.0)
                && (q.seat().pending || q.seat().loaded)
                && !q.may_stop_now(e.stop)
            {
                if q.request_stop(now) {
                    log.push(now, FwEvent::PreemptRequested { queue: v, ticket: 0, by: Requester::Scheduler });
                }
                holders[k].placed = true;
                continue;
            }
            e.hqd.retain(|&id| id != v);
            holders.remove(k);
            if let Ok(q) = queues.get_mut(v.0) {
                let seat = q.seat();
                let (pending, vm, start) = (seat.pending, seat.class.vmid, seat.process_start);
                if pending && vm == class.vmid {
                    process_start = start;
                }
                q.set_state(if pending { QueueState::Preempted } else { QueueState::Unmapped });
                if pending {
                    // Stopped where it stands (an allowed point): request, save and answer at once.
                    let point = q.saved_at_eviction();
                    // A dispatch it kept live in the slot goes to the save area at the end of
                    // the step, after the turn the slot was taken for.
                    e.unspilled.push(v);
                    log.push(now, FwEvent::PreemptRequested { queue: v, ticket: 0, by: Requester::Scheduler });
                    log.push(now, FwEvent::StateSaved { queue: v, point });
                    log.push(now, FwEvent::PreemptAnswered { queue: v, ticket: 0, requested_at: now });
                    evicted.push(v);
                }
            }
        }
        e.hqd.push(w);
        e.slot_maps += 1;
        changed = true;
        let q = queues.get_mut(w.0).expect("a waiting queue exists");
        q.set_state(QueueState::Mapped);
        q.set_slice_start(now, process_start);
        sync_waiting(e, q, w);
        holders.push(Holder::of(w, &q.seat(), true));
    }
    for &v in evicted.iter() {
        if let Ok(q) = queues.get_mut(v.0) {
            unseat(e, q, v);
        }
    }
    arm_quantum_timer(e, holders, asked, quanta);
    changed
}

/// Reads the slot holders into `holders`, once: a hung one lingering in `hqd` leaves it here
/// (`true`: one did).
fn read_holders<Q: Schedulable>(e: &mut Engine, queues: &Slab<Q>, holders: &mut Vec<Holder>) -> bool {
    holders.clear();
    let slots = e.hqd.len();
    e.hqd.retain(|&id| {
        let Ok(q) = queues.get(id.0) else { return false };
        let seat = q.seat();
        let mapped = seat.state == QueueState::Mapped;
        if mapped {
            holders.push(Holder::of(id, &seat, false));
        }
        mapped
    });
    e.hqd.len() != slots
}

/// Arms the quantum timer after a pass: when the first busy holder's quantum runs out against
/// a class still waiting, if one does. (`asked`: the pass's answers per kind of holder.)
fn arm_quantum_timer(e: &mut Engine, holders: &[Holder], asked: &mut Vec<(HolderKind, (bool, bool))>, quanta: Quanta) {
    // Look again when the first holder's quantum runs out against a class still waiting (it
    // lies ahead: a holder past its quantum would have been evicted above). The classes still
    // waiting are the ones the walk left behind and those of the queues evicted in this pass:
    // without the latter, two busy queues over one slot would swap once and then never again.
    let waiting = &e.waiting;
    // For a holder, the classes that contend are those of its priority (a privileged holder
    // only against privileged waiters); a waiter of its own address space ends its gang
    // quantum, any other its process quantum: one lookup for its own class, and the rest of
    // its (privilege, priority) group is a count.
    let contenders = |prio: Priority, privileged: bool, vm: Vmid| {
        let (mut gang, mut process) = (false, false);
        for user in [false, true] {
            let own = Class { user, priority: std::cmp::Reverse(prio), vmid: vm };
            let classes = waiting.classes_in_group(own);
            if (user && privileged) || classes == 0 {
                continue;
            }
            let mine = waiting.by_class.contains_key(&own);
            gang |= mine;
            process |= classes > mine as u32;
        }
        (gang, process)
    };
    // Holders mostly share their priority and address space: ask once per kind of holder.
    let mut quantum_end: Option<Time> = None;
    for h in holders.iter().filter(|h| h.pending) {
        let kind = (h.prio, h.privileged, h.vm);
        let (gang, process) = match asked.iter().find(|(k, _)| *k == kind) {
            Some(&(_, answer)) => answer,
            None => {
                let answer = contenders(h.prio, h.privileged, h.vm);
                asked.push((kind, answer));
                answer
            }
        };
        let ends =
            [gang.then(|| h.slice_start.plus(quanta.gang)), process.then(|| h.process_start.plus(quanta.process))];
        for t in ends.into_iter().flatten() {
            quantum_end = Some(quantum_end.map_or(t, |q| q.min(t)));
        }
    }
    e.timers.set(Timer::Quantum, quantum_end);
}
