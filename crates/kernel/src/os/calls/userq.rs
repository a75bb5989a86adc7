//! `USERQ_SIGNAL` and `USERQ_WAIT` (spec 001, "In order to support legacy implicit
//! synchronization, as well as mixed user and kernel queues"): how user-mode queues and
//! everything that depends on kernel fences — kernel-mode queues, CPU waiters, other processes
//! — interoperate.
//!
//! - **Signal** ([`Os::userq_signal`]): the caller names a user-mode queue, a progress point
//!   (at most its last-queued value) and native fences with values. The OS keeps the request
//!   on the queue and folds the point into the queue's monitored progress value, so the
//!   engine's `PROGRESS_FENCE` that passes it interrupts; the interrupt service signals each
//!   fence (as `DxgkDdiUpdateCurrentValuesFromCpu` would for a CPU signal), waking CPU waiters
//!   and the kernel-mode scheduler's held-back submissions. A point already reached signals at
//!   once. The progress fence is the privileged one (only the engine writes it), so a bad
//!   actor cannot forge the completion.
//! - **Wait** ([`Os::userq_wait`]): the caller names a user-mode queue and sync objects —
//!   native fences, or queues' progress fences, a kernel-mode queue's included. The OS checks
//!   each belongs to the caller's process and answers where the queue's engine reads it and
//!   the value to wait for; the UMD puts those `WAIT`s in the queue's ring, and the engine
//!   parks the queue on them with no CPU involved.
//!
//! Invariants: a pending signal lives on its queue and goes with it (a queue destroyed or hung
//! before its point signals nothing: its fences' waiters learn of the loss from the queue's
//! status, not from a forged value); the queue's monitored value is always at most
//! (lowest pending point − 1), so no point is passed without an interrupt.

use abi::port::{Invalid, KernelError, SyncWait, WaitPoint};
use abi::{HwQueueHandle, NativeFenceHandle, ProcessId, Time};

use super::super::Os;
use super::super::process::{PendingSignal, QueueMode};
use super::super::shared::invalid;

impl Os {
    /// `USERQ_SIGNAL`: see the module docs.
    pub fn userq_signal(
        &mut self,
        pid: ProcessId,
        q: HwQueueHandle,
        point: u64,
        fences: &[(NativeFenceHandle, u64)],
        now: Time,
    ) -> Result<(), KernelError> {
        let last_queued = self.cx.last_queued(pid, q);
        let p = self.proc(pid)?;
        let qo = p.queues.get(q)?;
        qo.live(q)?;
        if !matches!(qo.mode, QueueMode::User { .. }) {
            return Err(KernelError::WrongQueueMode { queue: q, actual: "kernel-mode", expected: "user-mode" });
        }
        if point > last_queued {
            return Err(invalid("point", point, Invalid::BeyondQueued { last_queued }));
        }
        if fences.is_empty() {
            return Err(invalid("fences", 0, Invalid::EmptyWait));
        }
        for &(h, value) in fences {
            p.fences.get(h)?;
            if value == abi::port::FENCE_ALWAYS_SIGNALED {
                return Err(invalid("value", value, Invalid::Reserved));
            }
        }
        let qo = self.queue(pid, q)?;
        qo.signal_on.push(PendingSignal { point, fences: fences.to_vec() });
        // Program the monitored value for the new point, then resample (a point already
        // passed fires here).
        self.update_monitored(pid, q, now)?;
        Ok(())
    }

    /// `USERQ_WAIT`: see the module docs.
    pub fn userq_wait(
        &mut self,
        pid: ProcessId,
        q: HwQueueHandle,
        objects: &[SyncWait],
        _now: Time,
    ) -> Result<Vec<WaitPoint>, KernelError> {
        let p = self.proc(pid)?;
        let qo = p.queues.get(q)?;
        qo.live(q)?;
        if !matches!(qo.mode, QueueMode::User { .. }) {
            return Err(KernelError::WrongQueueMode { queue: q, actual: "kernel-mode", expected: "user-mode" });
        }
        let mut out = Vec::with_capacity(objects.len());
        for o in objects {
            match *o {
                SyncWait::Fence { fence, value } => {
                    let f = p.fences.get(fence)?;
                    out.push(WaitPoint { va: f.va, value });
                }
                SyncWait::QueueProgress { queue, value } => {
                    if queue.owner() != pid {
                        return Err(invalid("queue", queue, Invalid::OtherProcess));
                    }
                    let other = p.queues.get(queue)?;
                    // The kernel page is mapped read-only in the process's address space: the
                    // engine reads the completed progress value there.
                    let va = other._kernel_page_mapping.va() + abi::queue::PROGRESS_COMPLETED_OFFSET;
                    out.push(WaitPoint { va, value });
                }
            }
        }
        Ok(out)
    }

    /// The progress point of `q`'s earliest pending signal, if any (for its monitored value).
    pub(super) fn lowest_signal_point(&mut self, pid: ProcessId, q: HwQueueHandle) -> Option<u64> {
        self.queue(pid, q).ok()?.signal_on.iter().map(|s| s.point).min()
    }

    /// Fires the pending signals of `q` whose point `done` reached.
    pub(super) fn fire_userq_signals(&mut self, pid: ProcessId, q: HwQueueHandle, done: u64, now: Time) {
        let Ok(qo) = self.queue(pid, q) else { return };
        if qo.signal_on.iter().all(|s| s.point > done) {
            return;
        }
        let (due, rest): (Vec<PendingSignal>, Vec<PendingSignal>) =
            std::mem::take(&mut qo.signal_on).into_iter().partition(|s| s.point <= done);
        qo.signal_on = rest;
        for s in due {
            for (h, value) in s.fences {
                // A fence already past the value (or gone) needs nothing.
                let _ = self.signal_native_fence(pid, h, value, now);
            }
        }
    }
}
