//! Preemption as a request with an answer (spec 003), and the engine and adapter resets of
//! timeout detection and recovery.
//!
//! A request names a queue. The firmware answers when the queue is off its hardware slot with
//! its state saved in the context save area — at once if it holds no slot, has no work, or
//! already stands at a point its engine's granularity allows ([`abi::preempt::Stop`]);
//! otherwise the queue keeps running in its turns until it reaches such a point
//! ([`StopPoint`]: the end of a command buffer, a packet, a workgroup, a wave, an instruction,
//! a chunk of a bulk copy, or a `WAIT` that does not pass yet), and stops there. Requests come
//! from two places:
//!
//! - the kernel ([`Requester::Os`]: a context suspend, D3, memory migration, teardown, timeout
//!   detection): the queue also leaves the run list, as a suspend does, until the kernel
//!   resumes it; the answer is an [`Interrupt::Preempted`] carrying the request's time and the
//!   answer's, so the kernel (and a benchmark) can measure the latency — or, for a context
//!   suspend that finds the queue where it may stop, the suspend's return ([`Suspension`]);
//! - the firmware's own scheduler ([`Requester::Scheduler`]: a higher priority or a spent
//!   quantum wants the slot): the queue goes back to waiting, and the slot changes hands at
//!   the next pass.
//!
//! A queue that never reaches an allowed point (an endless kernel under `DmaBuffer`, any long
//! kernel under `None`) never answers: that is what the kernel's TDR timer is for. Its
//! recovery is [`Firmware::reset_engine`] (per-engine reset: the queues still owing an answer
//! are the guilty ones and hang; every other queue on the engine is taken off its slot with
//! its state saved, and keeps its work) or [`Firmware::reset_adapter`] (every queue's state is
//! lost).
//!
//! Every request, stop, answer, restore and reset is recorded in the firmware log
//! ([`FwEvent`]), in order, so tests assert the sequence; so is every command the kernel
//! sends ([`FwEvent::Command`]), before what it did.
//!
//! Invariant: a queue with a request outstanding ([`Preemption::request`]) is in a hardware slot
//! and has work; every path that takes it off its slot otherwise (remove, suspend, reset,
//! hang) answers or drops the request.

use abi::preempt::Stop;
use abi::queue::{FaultKind, FaultRecord};
use abi::{EngineId, EngineKind, QueueState};
use shm::Word;

use crate::Time;
use crate::error::GpuError;
use crate::memory::AddressSpace;

use super::command_log::CommandRecord;
use super::log::{FwCounts, FwEvent, FwLog, FwLogEntry, Requester};
use super::queue::{FwQueue, FwQueueId};
use super::schedule::{self, sync_waiting};
use super::{Engine, Firmware, Interrupt};
pub use abi::preempt::StopPoint;

use crate::attention::Attention;

/// A queue's preemption state (see the module docs): the request it owes an answer, and
/// where it stopped when it last left a slot with its state saved.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Preemption {
    /// A preemption request it has not answered yet.
    pub(super) request: Option<PreemptRequest>,
    /// Preempted with its state saved at this point; the first turn after logs the restore.
    pub(super) saved: Option<StopPoint>,
}

/// A doorbell an engine watches during its turns for a cut-in ([`Engine::sentinels`]).
pub(super) struct Sentinel {
    /// The BAR word.
    pub(super) word: Word,
    /// Its value when the watch began (the firmware's last latch).
    pub(super) last: u64,
    /// The queue it belongs to.
    pub(super) queue: FwQueueId,
}

/// The most doorbells an engine watches for a cut-in ([`Engine::sentinels`]): past this many
/// queues on the engine, a higher-priority ring is heard at the engine's next step instead.
pub(super) const MAX_SENTINEL_WATCHES: usize = 64;

/// An outstanding request.
#[derive(Clone, Copy, Debug)]
pub(super) struct PreemptRequest {
    pub(super) ticket: u64,
    pub(super) at: Time,
    pub(super) by: Requester,
}

/// Where a queue held for the kernel stands in its ring ([`crate::Gpu::held_position`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingPosition {
    /// The top-level packet it resumes at.
    pub rptr: u64,
    /// The last wptr the firmware accepted.
    pub wptr: u64,
    /// That packet has started (its state is saved): it resumes, never restarts.
    pub started: bool,
}

/// What an engine reset did ([`Firmware::reset_engine`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineReset {
    /// Queues that owed an answer to a kernel request and now hang.
    pub guilty: Vec<FwQueueId>,
    /// Queues taken off their slots with their state saved; they run again when mapped.
    pub preempted: Vec<FwQueueId>,
}

impl FwQueue {
    /// The packet at rptr is part-way done (an indirect buffer, a dispatch, a bulk copy).
    pub(super) fn has_partial_packet(&self) -> bool {
        self.ring.ib.is_some() || self.dispatch_active || self.bulk_done.is_some()
    }

    /// Where the queue stands between two of its turns: the point it would stop at if it
    /// stopped now (`None`: in the middle of something no level can cut, which never happens
    /// between turns, or with work and no state).
    pub(super) fn standing_point(&self) -> StopPoint {
        if !self.pending && !self.ring.has_work() {
            StopPoint::Idle
        } else if self.dispatch_active {
            StopPoint::Instruction
        } else if self.bulk_done.is_some() {
            StopPoint::Chunk
        } else if self.ring.ib.is_none() && self.at_cb_boundary {
            StopPoint::CommandBuffer
        } else {
            StopPoint::Packet
        }
    }

    /// The kernel's preemption request this queue owes an answer to, if any (an engine reset
    /// hangs a queue that owes one).
    pub(super) fn kernel_request(&self) -> Option<PreemptRequest> {
        self.preempt.request.filter(|r| r.by == Requester::Os)
    }

    /// Whether the engine's rule lets it stop where it stands (a blocked `WAIT` counts as a
    /// packet boundary on every level but `None`). A queue loaded in a hardware slot stands
    /// wherever the slot has taken it: it may never stop "now", only at the slot's answer to
    /// a stop.
    pub(super) fn may_stop_now(&self, stop: Stop) -> bool {
        if self.hw_slot.is_some() {
            return false;
        }
        let point = self.standing_point();
        stop.allows(point) || (self.blocked && stop.allows_blocked_wait() && point == StopPoint::Packet)
    }
}

impl Engine {
    /// The engine's stop rule.
    pub(super) fn stop_rule(kind: EngineKind, caps: abi::preempt::PreemptionCaps) -> Stop {
        match kind {
            EngineKind::Compute => Stop::Compute(caps.compute),
            // A video engine stops like a copy engine: between packets (it runs no dispatches).
            EngineKind::Copy | EngineKind::Video => Stop::Copy(caps.copy),
        }
    }
}

/// Completes the preemption of queue `id` (`q`, on engine `e`) stopped at `point`: off its
/// slot, its state saved; held off the run list for the kernel or back to waiting for the
/// scheduler; the answer logged, and raised on `irqs` for the kernel (`None`: the caller
/// delivers it, as a suspend answered at once does through its return value). Returns the
/// request it answered.
pub(super) fn finish(
    e: &mut Engine,
    q: &mut FwQueue,
    id: FwQueueId,
    point: StopPoint,
    at: Time,
    log: &mut FwLog,
    irqs: Option<&mut super::Irqs>,
) -> Option<PreemptRequest> {
    let req = q.preempt.request.take()?;
    // Off its slot: a dispatch it kept live there goes to the save area.
    q.spill();
    e.hqd.retain(|&h| h != id);
    e.resched = true;
    // Work left is what the client published beyond rptr (a queue that stopped at the end
    // of its last command buffer has none, and nothing to save).
    let work = q.ring.has_work();
    if !work {
        q.pending = false;
    }
    // (Off a slot, it keeps its state: `Preempted` since it last left one with work, or
    // `Unmapped`.)
    if q.state == QueueState::Mapped {
        q.state = if work { QueueState::Preempted } else { QueueState::Unmapped };
    }
    if work && point != StopPoint::Idle {
        log.push(at, FwEvent::StateSaved { queue: id, point });
        q.preempt.saved = Some(point);
    }
    match req.by {
        Requester::Os => schedule::leave_run_list(e, q, id),
        Requester::Scheduler => schedule::unseat(e, q, id),
    }
    log.push(at, FwEvent::PreemptAnswered { queue: id, ticket: req.ticket, requested_at: req.at });
    if req.by == Requester::Os
        && let Some(irqs) = irqs
    {
        irqs.push_back((
            at,
            Interrupt::Preempted { queue: id, ticket: req.ticket, requested_at: req.at, answered_at: at },
        ));
    }
    Some(req)
}

/// A context suspend's preemption of one queue ([`crate::cmd::SuspendQueue`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Suspension {
    /// The request's ticket (in the firmware log, and in the answer).
    pub ticket: u64,
    /// Answered at once (the queue held no slot, or stood where it may stop): the answer is
    /// in the firmware log and no interrupt follows. Otherwise it is owed, as an
    /// [`Interrupt::Preempted`] carrying the ticket.
    pub answered: bool,
}

impl Firmware {
    /// Asks for queue `id` to leave its slot (see the module docs); returns the request's
    /// ticket, which the answer ([`Interrupt::Preempted`]) carries. `requested_at` is when the
    /// kernel asked, `now` when the request reached the firmware: a queue that can stop where
    /// it stands is answered at `now`.
    pub(crate) fn request_preempt(&mut self, id: FwQueueId, requested_at: Time, now: Time) -> Result<u64, GpuError> {
        let caps = self.preemption;
        self.next_ticket += 1;
        let ticket = self.next_ticket;
        let Firmware { engines, queues, log, irqs, .. } = self;
        let q = queues.get_mut(id.0).map_err(|_| GpuError::StaleQueue(id))?;
        let e = engines.get_mut(q.cfg.engine.0 as usize).ok_or(GpuError::BadEngine(q.cfg.engine.0))?;
        log.push(requested_at, FwEvent::PreemptRequested { queue: id, ticket, by: Requester::Os });
        let stop = Engine::stop_rule(e.kind, caps);
        let in_slot = e.hqd.contains(&id) && q.state == QueueState::Mapped;
        // An earlier request of the scheduler is taken over: the kernel's is the stronger.
        q.preempt.request = Some(PreemptRequest { ticket, at: requested_at, by: Requester::Os });
        if !in_slot || q.may_stop_now(stop) {
            // (Without a slot it stands where it last stopped, its state already saved.)
            let point = q.standing_point();
            finish(e, q, id, point, now, log, Some(irqs));
        }
        Ok(ticket)
    }

    /// Resets engine `engine` (per-engine reset, `DxgkDdiResetEngine`): the queues that owe an
    /// answer to a kernel request hang with [`FaultKind::PreemptTimeout`]; every other queue in
    /// a slot is taken off it with its state saved (it stands between two turns, where its
    /// state always is), and runs again when the scheduler maps it.
    pub(crate) fn reset_engine(
        &mut self,
        engine: EngineId,
        now: Time,
        vms: &[Option<AddressSpace>],
    ) -> Result<EngineReset, GpuError> {
        // Hardware slots first: the guilty are abandoned where they stand, the rest stopped
        // with their state saved, before the queue table below decides what they become.
        let loaded = self.loaded_on(engine);
        if !loaded.is_empty() {
            let (abort, stop): (Vec<_>, Vec<_>) =
                loaded.into_iter().partition(|id| self.queues.get(id.0).is_ok_and(|q| q.kernel_request().is_some()));
            self.hw_quiesce(&abort, true, now, vms);
            self.hw_quiesce(&stop, false, now, vms);
        }
        let Firmware { engines, queues, log, .. } = self;
        let e = engines.get_mut(engine.0 as usize).ok_or(GpuError::BadEngine(engine.0))?;
        let mut out = EngineReset::default();
        for id in std::mem::take(&mut e.hqd) {
            let Ok(q) = queues.get_mut(id.0) else { continue };
            let owed = q.kernel_request();
            q.preempt.request = None;
            match owed {
                Some(req) => {
                    let waited_ms = now.since(req.at).as_millis() as u64;
                    hang(q, FaultKind::PreemptTimeout { waited_ms });
                    out.guilty.push(id);
                }
                _ if q.state == QueueState::Hung => {}
                _ => {
                    let work = q.pending || q.ring.has_work();
                    q.state = if work { QueueState::Preempted } else { QueueState::Unmapped };
                    if work {
                        q.spill();
                        q.preempt.saved = Some(q.standing_point());
                        out.preempted.push(id);
                    }
                }
            }
            schedule::unseat(e, q, id);
        }
        e.resched = true;
        log.push(now, FwEvent::EngineReset { engine, guilty: out.guilty.clone() });
        Ok(out)
    }

    /// Where a queue held off the run list for the kernel stands in its ring: the packet it
    /// resumes at (`rptr`), whether that packet has started (an indirect buffer part-way
    /// through, a dispatch or bulk copy with saved state), and the last wptr accepted.
    pub(crate) fn held_position(&self, id: FwQueueId) -> Result<RingPosition, GpuError> {
        let q = self.queue(id)?;
        if q.sched.on_run_list || q.preempt.request.is_some() || q.state == QueueState::Hung {
            return Err(GpuError::NotHeld(id));
        }
        Ok(RingPosition { rptr: q.ring.rptr, wptr: q.ring.wptr, started: q.has_partial_packet() })
    }

    /// Takes back the work a held kernel queue has not started: its accepted wptr drops to
    /// `wptr` (spec 003: after a preemption the scheduler resubmits the commands that were
    /// preempted in the hardware queue). Only for privileged (kernel-owned) rings, and only
    /// down to the packet it resumes at — past it when that packet has started, since a
    /// started packet resumes from its saved state and is never fetched again. The kernel
    /// stores the same value in the ring's wptr word first.
    pub(crate) fn take_back(&mut self, id: FwQueueId, wptr: u64, now: Time) -> Result<(), GpuError> {
        let pos = self.held_position(id)?;
        let Firmware { queues, log, .. } = self;
        let q = queues.get_mut(id.0).map_err(|_| GpuError::StaleQueue(id))?;
        let floor = if pos.started { pos.rptr + 4 } else { pos.rptr };
        if !q.cfg.privileged || !wptr.is_multiple_of(4) || wptr < floor || wptr > pos.wptr {
            return Err(GpuError::BadTakeBack { wptr, floor, accepted: pos.wptr, privileged: q.cfg.privileged });
        }
        q.ring.wptr = wptr;
        q.pending = q.ring.has_work();
        log.push(now, FwEvent::TakenBack { queue: id, from: pos.wptr, to: wptr });
        Ok(())
    }

    /// Resets one queue (amdgpu: the per-queue reset through the scheduling firmware): it
    /// leaves its slot and the run list and hangs with `why`, the kernel's reason
    /// ([`FaultKind::PreemptTimeout`]: it would not yield to a preemption request;
    /// [`FaultKind::HangTimeout`]: it ran without progress for the hang timer's limit); its
    /// neighbours are not touched. Returns the last progress value the engine accepted from
    /// it (the last "fence ID" the reset aborted).
    pub(crate) fn reset_queue(
        &mut self,
        id: FwQueueId,
        why: FaultKind,
        now: Time,
        vms: &[Option<AddressSpace>],
    ) -> Result<u64, GpuError> {
        self.hw_quiesce(&[id], true, now, vms);
        let Firmware { engines, queues, log, .. } = self;
        let q = queues.get_mut(id.0).map_err(|_| GpuError::StaleQueue(id))?;
        let e = engines.get_mut(q.cfg.engine.0 as usize).ok_or(GpuError::BadEngine(q.cfg.engine.0))?;
        q.preempt.request = None;
        hang(q, why);
        e.hqd.retain(|&h| h != id);
        e.resched = true;
        sync_waiting(e, q, id);
        log.push(now, FwEvent::QueueReset { queue: id });
        Ok(q.ring.queued)
    }

    /// Resets the adapter (`DxgkDdiResetFromTimeout`): every queue's state is lost; each one
    /// hangs with [`FaultKind::AdapterReset`] and leaves its slot.
    pub(crate) fn reset_adapter(&mut self, now: Time, vms: &[Option<AddressSpace>]) -> Vec<FwQueueId> {
        let loaded = self.loaded();
        self.hw_quiesce(&loaded, true, now, vms);
        let Firmware { engines, queues, log, .. } = self;
        let mut lost = Vec::new();
        for e in engines.iter_mut() {
            e.hqd.clear();
            e.resched = true;
            for k in 0..e.run_list.len() {
                let id = e.run_list[k];
                let Ok(q) = queues.get_mut(id.0) else { continue };
                q.preempt.request = None;
                if q.state != QueueState::Hung {
                    hang(q, FaultKind::AdapterReset);
                    lost.push(id);
                }
                sync_waiting(e, q, id);
            }
        }
        log.push(now, FwEvent::AdapterReset);
        lost
    }

    /// The attention register.
    pub(crate) fn attention(&self) -> Attention {
        self.attention.clone()
    }

    /// The device's preemption capabilities.
    pub(crate) fn preemption(&self) -> abi::preempt::PreemptionCaps {
        self.preemption
    }

    /// The firmware log, oldest first (at most [`super::log::LOG_ENTRIES`]).
    pub(crate) fn log(&self) -> impl Iterator<Item = &FwLogEntry> {
        self.log.entries.iter()
    }

    pub(crate) fn log_counts(&self) -> FwCounts {
        self.log.counts
    }

    /// Records a command the kernel sent, before the firmware acts on it.
    pub(crate) fn log_command(&mut self, at: Time, command: CommandRecord) {
        self.log.push(at, FwEvent::Command(command));
    }
}

/// Hangs `q` with `kind` (a reset, not a fault it raised: no interrupt; the kernel that asked
/// for the reset reports it).
pub(super) fn hang(q: &mut FwQueue, kind: FaultKind) {
    q.cb.clear();
    q.state = QueueState::Hung;
    q.pending = false;
    q.dispatch_active = false;
    q.live = None;
    q.bulk_done = None;
    q.ring.ib = None;
    q.blocked = false;
    q.sched.asleep = false;
    q.fault = Some(FaultRecord { kind, rptr: q.ring.rptr, opcode: None, in_indirect: false });
}
