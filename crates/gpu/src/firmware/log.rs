//! The firmware log: every preemption request, stop, answer, restore and reset, and every
//! command the kernel sends ([`FwEvent::Command`], before what it did), in order, so tests
//! assert the sequence ([`crate::Gpu::firmware_log`]). The log is bounded ([`LOG_ENTRIES`]:
//! the oldest entries go first); [`FwCounts`] counts every event it ever held.
//!
//! The scheduler, preemption, execution and the hardware side all write it; it reads nothing
//! of theirs.

use abi::EngineId;
use abi::preempt::StopPoint;

use crate::Time;

use super::command_log::CommandRecord;
use super::queue::FwQueueId;

/// Who asked for a preemption.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requester {
    /// The kernel (`DxgkDdiPreemptCommand`, MES `SUSPEND`): the queue is held off the run
    /// list until resumed, and the answer is an interrupt.
    Os,
    /// The firmware's scheduler: the queue goes back to waiting for a slot.
    Scheduler,
}

/// One entry of the firmware log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FwEvent {
    /// A preemption was asked for.
    PreemptRequested {
        /// The queue.
        queue: FwQueueId,
        /// The request's ticket (0 for the scheduler's own).
        ticket: u64,
        /// Who asked.
        by: Requester,
    },
    /// The queue stopped at `point`, its state in the context save area.
    StateSaved {
        /// The queue.
        queue: FwQueueId,
        /// Where it stopped.
        point: StopPoint,
    },
    /// The request was answered: the queue is off its slot.
    PreemptAnswered {
        /// The queue.
        queue: FwQueueId,
        /// The request's ticket.
        ticket: u64,
        /// When it was asked for.
        requested_at: Time,
    },
    /// A preempted queue runs again from its saved state.
    Restored {
        /// The queue.
        queue: FwQueueId,
        /// Where it had stopped.
        point: StopPoint,
    },
    /// An engine was reset; these queues would not yield and now hang.
    EngineReset {
        /// The engine.
        engine: EngineId,
        /// The guilty queues.
        guilty: Vec<FwQueueId>,
    },
    /// One queue was reset (amdgpu's per-queue reset through the scheduling firmware): it
    /// hangs; no other queue is touched.
    QueueReset {
        /// The queue.
        queue: FwQueueId,
    },
    /// The adapter was reset: every queue's state is lost.
    AdapterReset,
    /// The kernel sent a command ([`crate::Gpu::command`]); what it did follows it.
    Command(CommandRecord),
    /// The kernel took back the work of a held kernel queue that had not started: its
    /// accepted wptr dropped from `from` to `to` ([`super::Firmware::take_back`]).
    TakenBack {
        /// The queue.
        queue: FwQueueId,
        /// The accepted wptr before.
        from: u64,
        /// And after.
        to: u64,
    },
}

/// A timed [`FwEvent`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FwLogEntry {
    /// Device time.
    pub at: Time,
    /// What happened.
    pub event: FwEvent,
}

/// The most entries the firmware log keeps (the oldest go first).
pub(super) const LOG_ENTRIES: usize = 4096;

/// How many events of each kind the firmware has logged since the device started, however
/// many the bounded log still holds ([`crate::Gpu::firmware_counts`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FwCounts {
    /// [`FwEvent::PreemptRequested`].
    pub preempts_requested: u64,
    /// [`FwEvent::StateSaved`].
    pub states_saved: u64,
    /// [`FwEvent::PreemptAnswered`].
    pub preempts_answered: u64,
    /// [`FwEvent::Restored`].
    pub restored: u64,
    /// [`FwEvent::EngineReset`].
    pub engine_resets: u64,
    /// [`FwEvent::QueueReset`].
    pub queue_resets: u64,
    /// [`FwEvent::AdapterReset`].
    pub adapter_resets: u64,
    /// [`FwEvent::TakenBack`].
    pub taken_back: u64,
    /// [`FwEvent::Command`].
    pub commands: u64,
}

impl FwCounts {
    /// Resets of any scope: queue, engine and adapter.
    pub fn recoveries(&self) -> u64 {
        self.queue_resets + self.engine_resets + self.adapter_resets
    }

    fn count(&mut self, event: &FwEvent) {
        let n = match event {
            FwEvent::PreemptRequested { .. } => &mut self.preempts_requested,
            FwEvent::StateSaved { .. } => &mut self.states_saved,
            FwEvent::PreemptAnswered { .. } => &mut self.preempts_answered,
            FwEvent::Restored { .. } => &mut self.restored,
            FwEvent::EngineReset { .. } => &mut self.engine_resets,
            FwEvent::QueueReset { .. } => &mut self.queue_resets,
            FwEvent::AdapterReset => &mut self.adapter_resets,
            FwEvent::TakenBack { .. } => &mut self.taken_back,
            FwEvent::Command(_) => &mut self.commands,
        };
        *n += 1;
    }
}

/// The firmware log: bounded, oldest first, with exact counts of everything it ever held.
#[derive(Default)]
pub(super) struct FwLog {
    pub(super) entries: std::collections::VecDeque<FwLogEntry>,
    pub(super) counts: FwCounts,
}

impl FwLog {
    pub(super) fn push(&mut self, at: Time, event: FwEvent) {
        self.counts.count(&event);
        if self.entries.len() == LOG_ENTRIES {
            self.entries.pop_front();
        }
        self.entries.push_back(FwLogEntry { at, event });
    }
}
