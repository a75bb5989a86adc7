//! The firmware's scheduler: who holds the hardware slots (spec 001: "the MES schedules
//! user queues onto hardware queue slots"; MES process and gang quanta).
//!
//! With more queues than hardware slots, only the slot holders (`hqd`) execute; [`schedule`]
//! decides who holds them. It never scans the run list, which may hold thousands of queues:
//! each engine keeps a **waiting set** ([`Waiting`]), ordered like the scheduler's waiting
//! order (kernel queues, then priority, then whoever ran longest ago, then run-list order)
//! and grouped by [`Class`] so a pass looks at one head per class. Its invariant: a queue is
//! in the waiting set exactly when it is on the run list, pending, not hung, not asleep and not
//! in a slot ([`Seat::should_wait`]). Every `pending = true` goes through [`mark_pending`], and
//! every other change of those facts (admit, suspend, resume, remove, map, evict, sleep, wake)
//! through [`sync_waiting`], which keep it. When a holder's quantum will run out against a
//! waiting queue, the pass arms the engine's quantum timer ([`super::power::Timer::Quantum`]). A pass
//! that would read what the last one read, when that one changed nothing, is not taken
//! ([`pass::Settled`]): it would change nothing again.
//!
//! A queue blocked in a `WAIT` that does not pass uses its slot for nothing, and spec 003 makes
//! such a wait preemptible: a blocked holder yields its slot to any waiter, and once off its
//! slot it *sleeps* ([`unseat`]) — out of the waiting set, in [`Engine::asleep`] — until the
//! `WAIT`'s condition holds ([`wake`], from the step's check in [`super::step`]). So a queue
//! that cannot run never holds or takes a slot a queue that can run wants, and a consumer
//! never starves the producer it waits for. Quanta are two-level, as MES's: the gang quantum
//! between queues of one address space runs from when the holder got its slot, the process
//! quantum from when its address space did ([`Seat::process_start`]), so a process rotating
//! its own queues does not restart the slice another process waits out.
//!
//! The scheduler is a sans-IO piece of its own: it sees a queue only through [`Schedulable`]
//! (what it reads, as a [`Seat`], and the few facts it writes), and an engine only through its
//! run list, slots, waiting set and quantum timer; it never fetches, executes or touches
//! shared memory. The unit tests at the end drive it with stand-in queues.

mod pass;
#[cfg(test)]
mod tests;
mod waiting;

pub(super) use pass::{PassScratch, schedule};
pub(super) use waiting::{Class, Turn, Waiting};

use abi::QueueState;
use abi::preempt::{Stop, StopPoint};

use crate::Time;

use super::Engine;
use super::preempt::PreemptRequest;
use super::queue::{FwQueue, FwQueueId};

/// Time slices for queues of equal priority (MES: process and gang quanta).
#[derive(Clone, Copy)]
pub(super) struct Quanta {
    /// Between queues of different processes.
    pub(super) process: std::time::Duration,
    /// Between queues of one process (one address space).
    pub(super) gang: std::time::Duration,
}

/// What the scheduler knows of a queue at one moment.
#[derive(Clone, Copy, Debug)]
pub(super) struct Seat {
    /// The class it waits in.
    pub(super) class: Class,
    /// Its turn within its class (stable while it waits: it only runs while it holds a slot).
    pub(super) turn: Turn,
    /// `Mapped` exactly while it holds a slot (unless it is hung).
    pub(super) state: QueueState,
    /// It has work.
    pub(super) pending: bool,
    /// When it last got a hardware slot (its gang quantum runs from here).
    pub(super) slice_start: Time,
    /// When its address space got the slot it holds (its process quantum runs from here): a
    /// queue that takes the slot from a busy queue of its own address space (gang rotation)
    /// inherits the slot's start, so rotating within a process never restarts the slice
    /// another process's waiting queue is compared with.
    pub(super) process_start: Time,
    /// Its last turn ended in a `WAIT` that did not pass: in a slot, it uses it for nothing.
    pub(super) blocked: bool,
    /// Off its slot, blocked in a `WAIT` whose condition did not hold when last checked: it
    /// sleeps (in [`Engine::asleep`]) instead of waiting for a slot, until the condition holds.
    pub(super) asleep: bool,
    /// On its engine's run list (not suspended).
    pub(super) on_run_list: bool,
    /// In its engine's waiting set.
    pub(super) waiting: bool,
    /// Loaded in a hardware slot ([`super::hardware`]): it leaves only at the slot's answer
    /// to a stop, idle or not.
    pub(super) loaded: bool,
}

impl Seat {
    /// Whether the queue belongs in its engine's waiting set: on the run list, with work
    /// (pending) — or a kernel queue, which is always mapped (spec 001: "Kernel queues are
    /// always mapped so any work that goes into kernel queues will take priority") — not hung,
    /// not asleep on a `WAIT`, and not in a hardware slot (`Mapped` is exactly "in `hqd`" for a
    /// queue that is not hung).
    ///
    /// Where kernel queues outnumber the slots (`kernel_fit` false: an engine with no
    /// user-mode queues, since the kernel keeps a slot for those), they cannot all be mapped,
    /// and an idle one waits no more than a user queue does: it would only hold a slot that a
    /// kernel queue with work waits for.
    pub(super) fn should_wait(&self, kernel_fit: bool) -> bool {
        self.on_run_list
            && (self.pending || (!self.class.user && kernel_fit))
            && !self.asleep
            && !matches!(self.state, QueueState::Mapped | QueueState::Hung)
    }
}

/// A queue as the scheduler reads and writes it: the firmware's queue, or a test's stand-in.
pub(super) trait Schedulable {
    /// What the scheduler knows of it now.
    fn seat(&self) -> Seat;
    /// Its state (the scheduler maps, preempts and unmaps).
    fn set_state(&mut self, state: QueueState);
    /// It has work (only [`mark_pending`] sets it).
    fn set_pending(&mut self);
    /// It got a slot at `now`: its gang quantum starts, and its process quantum at
    /// `process_start` (`now`, or the slot's start in its address space).
    fn set_slice_start(&mut self, now: Time, process_start: Time);
    /// It sleeps off its slot on a `WAIT` (or no longer does).
    fn set_asleep(&mut self, asleep: bool);
    /// Whether it is in its engine's waiting set (only [`sync_waiting`] sets it).
    fn set_waiting(&mut self, waiting: bool);
    /// It joined its engine's run list (or left it, `seq` `None`); `seq` is its place in
    /// run-list order.
    fn set_run_list(&mut self, seq: Option<u64>);
    /// Whether it can leave its slot where it stands, under the engine's stop rule
    /// ([`super::preempt`]).
    fn may_stop_now(&self, stop: Stop) -> bool;
    /// Asks it to leave its slot at its next allowed point (the scheduler's own preemption
    /// request); returns whether this is a new request.
    fn request_stop(&mut self, now: Time) -> bool;
    /// It leaves its slot where it stands, with work left: its state is saved there (a
    /// dispatch's, by the end of the step: [`Engine::unspilled`]); returns the point.
    fn saved_at_eviction(&mut self) -> StopPoint;
}

impl Schedulable for FwQueue {
    fn seat(&self) -> Seat {
        Seat {
            class: Class {
                user: !self.cfg.privileged,
                priority: std::cmp::Reverse(self.cfg.priority),
                vmid: self.cfg.vmid,
            },
            turn: (self.sched.last_run, self.sched.seq),
            state: self.state,
            pending: self.pending,
            slice_start: self.sched.slice_start,
            process_start: self.sched.process_start,
            blocked: self.blocked,
            asleep: self.sched.asleep,
            on_run_list: self.sched.on_run_list,
            waiting: self.sched.waiting,
            loaded: self.hw_slot.is_some(),
        }
    }
    fn set_state(&mut self, state: QueueState) {
        self.state = state;
    }
    fn set_pending(&mut self) {
        self.pending = true;
    }
    fn set_slice_start(&mut self, now: Time, process_start: Time) {
        self.sched.slice_start = now;
        self.sched.process_start = process_start;
    }
    fn set_asleep(&mut self, asleep: bool) {
        self.sched.asleep = asleep;
    }
    fn set_waiting(&mut self, waiting: bool) {
        self.sched.waiting = waiting;
    }
    fn set_run_list(&mut self, seq: Option<u64>) {
        self.sched.on_run_list = seq.is_some();
        if let Some(seq) = seq {
            self.sched.seq = seq;
        }
    }
    fn may_stop_now(&self, stop: Stop) -> bool {
        FwQueue::may_stop_now(self, stop)
    }
    fn saved_at_eviction(&mut self) -> StopPoint {
        let point = self.standing_point();
        self.preempt.saved = Some(point);
        point
    }
    fn request_stop(&mut self, now: Time) -> bool {
        if self.preempt.request.is_some() {
            return false;
        }
        self.preempt.request = Some(PreemptRequest { ticket: 0, at: now, by: super::Requester::Scheduler });
        true
    }
}

/// Puts queue `id` at the end of `e`'s run list, stamped with its turn among equals.
pub(super) fn join_run_list<Q: Schedulable>(e: &mut Engine, q: &mut Q, id: FwQueueId) {
    e.run_list.push(id);
    e.kernel_queues += !q.seat().class.user as usize;
    q.set_run_list(Some(e.next_seq));
    e.next_seq += 1;
}

/// A new queue joins `e`'s run list; a free hardware slot maps it at once, otherwise the
/// scheduler will. (It starts idle, so it does not wait either way.)
pub(super) fn admit<Q: Schedulable>(e: &mut Engine, q: &mut Q, id: FwQueueId) {
    join_run_list(e, q, id);
    e.resched = true;
    if e.hqd.len() < e.hw_slots {
        e.hqd.push(id);
        e.slot_maps += 1;
        q.set_state(QueueState::Mapped);
    }
    sync_waiting(e, q, id);
}

/// Takes queue `id` off `e`'s run list and out of its slot (suspended or removed): it leaves
/// the waiting set, and no pass maps it until it joins again. Its state and `pending` stay
/// (rings are remembered).
pub(super) fn leave_run_list<Q: Schedulable>(e: &mut Engine, q: &mut Q, id: FwQueueId) {
    let seat = q.seat();
    if seat.on_run_list {
        e.run_list.retain(|&q| q != id);
        e.kernel_queues -= !seat.class.user as usize;
    }
    e.hqd.retain(|&q| q != id);
    e.resched = true;
    q.set_run_list(None);
    // (Its entry in `asleep`, if any, is dropped at the next wake-up check.)
    q.set_asleep(false);
    sync_waiting(e, q, id);
}

/// Queue `id` (`q`) has just left its slot on `e` with work left (evicted by a pass, stopped
/// for the scheduler's request, taken off by an engine reset). If its last turn ended in a
/// `WAIT` that did not pass, it sleeps: it is kept out of the waiting set, so it takes no slot
/// from a queue that can use one, until [`wake`] finds the condition holds (panthor keeps
/// groups blocked on a sync object off its runnable lists the same way, until a sync update
/// unblocks them). Otherwise it waits for a slot again.
pub(super) fn unseat<Q: Schedulable>(e: &mut Engine, q: &mut Q, id: FwQueueId) {
    let seat = q.seat();
    if seat.blocked && seat.pending && seat.on_run_list && seat.state != QueueState::Hung {
        q.set_asleep(true);
        e.asleep.push(id);
    }
    sync_waiting(e, q, id);
}

/// The `WAIT` sleeping queue `id` (`q`) is blocked on may pass now: it waits for a slot again
/// (in its old turn: it has waited since it last ran), and a pass looks at once.
pub(super) fn wake<Q: Schedulable>(e: &mut Engine, q: &mut Q, id: FwQueueId) {
    q.set_asleep(false);
    e.resched = true;
    sync_waiting(e, q, id);
}

/// Marks queue `id` (`q`, on engine `e`) as having work: the one way `pending` becomes true.
///
/// Every discovery of work goes through here — a doorbell ring ([`super::Firmware::poll_doorbells`]),
/// the wptr re-reads of a doorbell bind or unbind, a context resume, a refused F1 — so that the
/// waiting set stays exact: a queue that is on the run list but not in a hardware slot (and not
/// hung) joins [`Engine::waiting`] here, and an unmapped queue that gains work asks for a
/// scheduling pass (`resched`), since it may deserve a slot. A mapped queue just runs on its
/// next turn. Marking a queue that is already pending changes nothing. O(log n).
///
/// The caller has checked whatever makes the work real (a changed doorbell word, `has_work`);
/// a hung queue may be marked (a ring on a hung queue's doorbell) but never waits.
#[inline]
pub(super) fn mark_pending<Q: Schedulable>(e: &mut Engine, q: &mut Q, id: FwQueueId) {
    // An unmapped queue that gains work may deserve a slot.
    let mut seat = q.seat();
    e.resched |= !seat.pending && seat.state != QueueState::Mapped;
    q.set_pending();
    seat.pending = true;
    sync_seat(e, q, id, &seat);
}

/// Puts `q` in `e`'s waiting set or takes it out, so that it is there exactly when
/// [`Seat::should_wait`] holds. Called after every change of what that depends on (the run
/// list, `pending`, the state): [`mark_pending`], suspend, resume, remove, and the scheduler
/// when it maps or evicts. (`pending` only turns false, and a queue only hangs, while it holds
/// a slot, where it is not waiting either way.) O(log n).
pub(super) fn sync_waiting<Q: Schedulable>(e: &mut Engine, q: &mut Q, id: FwQueueId) {
    sync_seat(e, q, id, &q.seat());
}

/// [`sync_waiting`] for a caller that has `q`'s seat as it stands.
#[inline]
fn sync_seat<Q: Schedulable>(e: &mut Engine, q: &mut Q, id: FwQueueId, seat: &Seat) {
    let want = seat.should_wait(e.kernel_fit);
    match (seat.waiting, want) {
        (false, true) => e.waiting.insert(seat.class, seat.turn, id),
        (true, false) => e.waiting.remove(seat.class, seat.turn, id),
        _ => {}
    }
    q.set_waiting(want);
}
