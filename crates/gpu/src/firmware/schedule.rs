//! The firmware's scheduler: who holds the hardware slots (spec 001: "the MES schedules
//! user queues onto hardware queue slots"; MES process and gang quanta).
//!
//! With more queues than hardware slots, only the slot holders (`hqd`) execute; [`schedule`]
//! decides who holds them. It never scans the run list, which may hold thousands of queues:
//! each engine keeps a **waiting set** ([`Waiting`]), ordered like the scheduler's waiting
//! order (kernel queues, then priority, then whoever ran longest ago, then run-list order)
//! and grouped by [`Class`] so a pass looks at one head per class. Its invariant: a queue is
//! in the waiting set exactly when it is on the run list, pending, not hung and not in a slot
//! ([`FwQueue::should_wait`]). Every `pending = true` goes through [`mark_pending`], and every
//! other change of those facts (suspend, resume, remove, map, evict) through
//! [`sync_waiting`], which keep it. When a holder's quantum will run out against a waiting
//! queue, the pass arms the engine's quantum timer ([`super::Timer::Quantum`]).

use super::*;

/// What the scheduler compares two waiting queues by, other than when they last ran: kernel
/// queues first (`user` false), then higher priority, and the address space, which decides
/// between the gang and the process quantum. Queues of one class are interchangeable for
/// eviction: whether a holder can be evicted for a waiter depends only on the waiter's class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Class {
    pub(super) user: bool,
    pub(super) priority: std::cmp::Reverse<Priority>,
    pub(super) vmid: Vmid,
}

/// A waiting queue's turn within its class: whoever ran longest ago first, then run-list order.
pub(super) type Turn = (Time, u64);

/// An engine's waiting queues (see [`FwQueue::should_wait`]), by class, each class in turn
/// order. Walking the class heads in class order merges them into the scheduler's waiting
/// order `(!privileged, Reverse(priority), last_run, run-list order)`. Empty classes are
/// dropped, so a pass looks at one head per distinct waiting class.
#[derive(Default)]
pub(super) struct Waiting {
    pub(super) by_class: std::collections::BTreeMap<Class, std::collections::BTreeMap<Turn, FwQueueId>>,
}

impl Waiting {
    pub(super) fn insert(&mut self, class: Class, turn: Turn, id: FwQueueId) {
        let old = self.by_class.entry(class).or_default().insert(turn, id);
        debug_assert!(old.is_none(), "{id} waits twice, or two queues share a turn");
    }

    pub(super) fn remove(&mut self, class: Class, turn: Turn, id: FwQueueId) {
        let Some(queues) = self.by_class.get_mut(&class) else {
            debug_assert!(false, "{id} is not waiting");
            return;
        };
        let old = queues.remove(&turn);
        debug_assert_eq!(old, Some(id), "{id} waits under another turn");
        if queues.is_empty() {
            self.by_class.remove(&class);
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.by_class.is_empty()
    }

    /// The first waiting queue, in waiting order, outside the classes in `skip`.
    pub(super) fn first(&self, skip: &[Class]) -> Option<(Class, FwQueueId)> {
        let mut best: Option<(Class, Turn, FwQueueId)> = None;
        for (class, queues) in &self.by_class {
            // Classes come in (privilege, priority) order: a head in a later group never
            // precedes one already found.
            if best.is_some_and(|(b, ..)| (b.user, b.priority) != (class.user, class.priority)) {
                break;
            }
            if skip.contains(class) {
                continue;
            }
            let (&turn, &id) = queues.first_key_value().expect("empty classes are dropped");
            if best.is_none_or(|(_, t, _)| turn < t) {
                best = Some((*class, turn, id));
            }
        }
        best.map(|(class, _, id)| (class, id))
    }
}

/// Time slices for queues of equal priority (MES: process and gang quanta).
#[derive(Clone, Copy)]
pub(super) struct Quanta {
    /// Between queues of different processes.
    pub(super) process: std::time::Duration,
    /// Between queues of one process (one address space).
    pub(super) gang: std::time::Duration,
}

/// Puts queue `id` at the end of `e`'s run list, stamped with its turn among equals.
pub(super) fn join_run_list(e: &mut Engine, q: &mut FwQueue, id: FwQueueId) {
    e.run_list.push(id);
    q.on_run_list = true;
    q.seq = e.next_seq;
    e.next_seq += 1;
}

/// Marks queue `id` (`q`, on engine `e`) as having work: the one way `pending` becomes true.
///
/// Every discovery of work goes through here — a doorbell ring ([`Firmware::poll_doorbells`]),
/// the wptr re-reads of a doorbell bind or unbind, a context resume, a refused F1 — so that the
/// waiting set stays exact: a queue that is on the run list but not in a hardware slot (and not
/// hung) joins [`Engine::waiting`] here, and an unmapped queue that gains work asks for a
/// scheduling pass (`resched`), since it may deserve a slot. A mapped queue just runs on its
/// next turn. Marking a queue that is already pending changes nothing. O(log n).
///
/// The caller has checked whatever makes the work real (a changed doorbell word, `has_work`);
/// a hung queue may be marked (a ring on a hung queue's doorbell) but never waits.
pub(super) fn mark_pending(e: &mut Engine, q: &mut FwQueue, id: FwQueueId) {
    // An unmapped queue that gains work may deserve a slot.
    e.resched |= !q.pending && q.state != QueueState::Mapped;
    q.pending = true;
    sync_waiting(e, q, id);
}

/// Puts `q` in `e`'s waiting set or takes it out, so that it is there exactly when
/// [`FwQueue::should_wait`] holds. Called after every change of what that depends on (the run
/// list, `pending`, the state): [`mark_pending`], suspend, resume, remove, and the scheduler
/// when it maps or evicts. (`pending` only turns false, and a queue only hangs, while it holds
/// a slot, where it is not waiting either way.) O(log n).
pub(super) fn sync_waiting(e: &mut Engine, q: &mut FwQueue, id: FwQueueId) {
    let want = q.should_wait();
    match (q.waiting, want) {
        (false, true) => e.waiting.insert(q.class(), q.turn(), id),
        (true, false) => e.waiting.remove(q.class(), q.turn(), id),
        _ => {}
    }
    q.waiting = want;
}

/// Chooses which queues hold this engine's hardware slots (spec 001 "the scheduling firmware
/// dynamically maps and unmaps queues based on priority and time quanta"). Every queue on
/// the run list with work wants a slot; in order of priority (kernel queues first, then the
/// highest level, then the longest-waiting), each takes a free slot, or evicts a holder:
/// an idle one first, else one of lower priority (so a realtime queue evicts at once), else
/// one of equal priority that has used up its quantum. An evicted queue with work left is
/// `Preempted` — stopped at a packet boundary or a dispatch slice, state saved — and rings
/// on an unmapped queue are remembered: it runs when it gets a slot back.
///
/// The waiting queues come from [`Engine::waiting`], never from a scan of the run list. Whether
/// a holder can be evicted for a waiter depends only on the waiter's [`Class`], and within a
/// pass the set of holders evictable for a class only shrinks (a queue mapped in this pass is
/// never evicted in it): so once one queue of a class finds no victim, the rest of its class
/// is skipped. A pass therefore takes O((slots + classes) × (slots + classes)) plus O(log n)
/// per queue it maps, however long the run list.
///
/// One difference from the plain "walk every waiting queue" formulation: with a quantum of
/// zero, a queue mapped in this pass could there be evicted again later in the same pass by
/// another waiter of its priority; here it keeps its slot until the next pass. With a non-zero
/// quantum (the default, and every test) the two are the same.
pub(super) fn schedule(e: &mut Engine, queues: &mut Slab<FwQueue>, now: Time, quanta: Quanta) {
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
    e.timers.set(Timer::Quantum, None);
    let get = |queues: &Slab<FwQueue>, id: FwQueueId| {
        queues.get(id.0).ok().map(|q| (q.state, q.pending, q.cfg.privileged, q.cfg.priority, q.cfg.vmid, q.slice_start))
    };
    e.hqd.retain(|&id| get(queues, id).is_some_and(|(st, ..)| st == QueueState::Mapped));
    if e.waiting.is_empty() {
        return;
    }
    // Classes of waiting queues no holder can make room for.
    let mut unplaced: Vec<Class> = Vec::new();
    // Mapped in this pass: not victims in it.
    let mut placed: Vec<FwQueueId> = Vec::new();
    // Evicted with work left: they wait again, but only from the next pass on.
    let mut evicted: Vec<FwQueueId> = Vec::new();
    // Kernel queues first, then priority, then whoever ran longest ago (then run-list order).
    while let Some((class, w)) = e.waiting.first(&unplaced) {
        let (w_priv, w_prio, w_vm) = (!class.user, class.priority.0, class.vmid);
        if e.hqd.len() >= e.hw_slots {
            // Pick a holder to evict: idle first, then lower priority (lowest first), then an
            // equal-priority one past its quantum (longest-running first). Kernel queues keep
            // their slots.
            let victim = e
                .hqd
                .iter()
                .copied()
                .filter(|id| !placed.contains(id))
                .filter_map(|id| {
                    let (_, pending, privileged, prio, vm, start) = get(queues, id)?;
                    if privileged && !w_priv {
                        return None;
                    }
                    let quantum = if vm == w_vm { quanta.gang } else { quanta.process };
                    let rank = if !pending {
                        0
                    } else if prio < w_prio {
                        1
                    } else if prio == w_prio && now.since(start) >= quantum {
                        2
                    } else {
                        return None;
                    };
                    Some((rank, prio, start, id))
                })
                .min_by_key(|&(rank, prio, start, _)| (rank, prio, start));
            let Some((_, _, _, v)) = victim else {
                unplaced.push(class);
                continue;
            };
            e.hqd.retain(|&id| id != v);
            if let Ok(q) = queues.get_mut(v.0) {
                q.state = if q.pending { QueueState::Preempted } else { QueueState::Unmapped };
                if q.pending {
                    evicted.push(v);
                }
            }
        }
        e.hqd.push(w);
        placed.push(w);
        let q = queues.get_mut(w.0).expect("a waiting queue exists");
        q.state = QueueState::Mapped;
        q.slice_start = now;
        sync_waiting(e, q, w);
    }
    for v in evicted {
        if let Ok(q) = queues.get_mut(v.0) {
            sync_waiting(e, q, v);
        }
    }
    // Look again when the first holder's quantum runs out against a class still waiting (it
    // lies ahead: a holder past its quantum would have been evicted above).
    let quantum_end = e
        .hqd
        .iter()
        .filter_map(|&id| get(queues, id))
        .flat_map(|(_, pending, privileged, prio, vm, start)| {
            unplaced.iter().filter_map(move |w| {
                let (w_priv, w_prio, w_vm) = (!w.user, w.priority.0, w.vmid);
                let contends = pending && prio == w_prio && (w_priv || !privileged);
                contends.then(|| start.plus(if vm == w_vm { quanta.gang } else { quanta.process }))
            })
        })
        .min();
    e.timers.set(Timer::Quantum, quantum_end);
}
