//! CPU waits on progress fences, and the interrupt service routine.
//!
//! Spec 000's wait on a queue's progress fence, and spec 001's "the kernel driver ... wakes
//! the waiting thread" through the monitored value: register the waiter, set the monitored
//! value (lowest waited value − 1) through `DxgkDdiUpdateMonitoredValues`, *then* re-read
//! the completed value and satisfy what already passed. The ISR does the same scan when a
//! progress interrupt arrives. The firmware compares against the monitored value after
//! writing the completed value, so a wake-up cannot fall between them (the same protocol as
//! native fences, model-checked in `abi/tests/loom.rs`).
//!
//! The ISR ([`Os::handle_interrupts`]) drains the KMD's notifications: a queue fault marks
//! the queue hung, ends its waiters and disconnects its doorbell; an engine's idle request
//! runs the F1 sequence ([`super::power`]); native fence signals go to [`super::fence`].
//!
//! Invariant: a wait's result is decided once, and stays in the OS until its thread ends it.

use abi::port::{KernelError, WaitOutcome};
use abi::queue::FaultRecord;
use abi::{DoorbellStatus, HwQueueHandle, ProcessId, Time};

use super::{Os, QueueLife, WaitId, WaitStart, invalid};
use crate::ddi::{Kmd, Notification};
use crate::trace::Event;

impl Os {
    /// Starts a CPU wait on a queue's progress fence.
    pub fn begin_wait(
        &mut self,
        pid: ProcessId,
        q: HwQueueHandle,
        value: u64,
        now: Time,
    ) -> Result<WaitStart, KernelError> {
        self.at(now);
        let qo = self.queue(pid, q)?;
        let done = qo.completed();
        if done >= value {
            return Ok(WaitStart::Done(Ok(WaitOutcome::Reached(done))));
        }
        qo.live(q)?;
        let id = self.waits.open_for(pid);
        self.queue(pid, q)?.waiters.push((value, id));
        // Set the monitored value, then re-read the completed value (the spec's
        // update-then-resample), satisfying what already passed.
        self.update_monitored(pid, q, now)?;
        Ok(WaitStart::Blocked(id))
    }

    /// Ends a progress wait (whether or not it completed): deregisters it and reports.
    pub fn end_wait(
        &mut self,
        pid: ProcessId,
        q: HwQueueHandle,
        id: WaitId,
        now: Time,
    ) -> Result<WaitOutcome, KernelError> {
        self.at(now);
        if let Ok(qo) = self.queue(pid, q) {
            qo.waiters.retain(|&(_, w)| w != id);
            // A raised monitored value: nothing can be missed, but report a refusal.
            self.update_monitored(pid, q, now)?;
        }
        match self.waits.take(id) {
            Some(Ok(v)) => Ok(WaitOutcome::Reached(v)),
            Some(Err(e)) => Err(e),
            None => Ok(WaitOutcome::TimedOut),
        }
    }

    /// Wakes satisfied waiters (and fires `USERQ_SIGNAL`s whose point passed), then programs
    /// the monitored value for the rest and resamples.
    pub(super) fn update_monitored(&mut self, pid: ProcessId, q: HwQueueHandle, now: Time) -> Result<(), KernelError> {
        loop {
            let done = self.queue(pid, q)?.completed();
            self.fire_userq_signals(pid, q, done, now);
            let signal_point = self.lowest_signal_point(pid, q);
            let qo = self.queue(pid, q)?;
            let mut hit = Vec::new();
            qo.waiters.retain(|&(value, w)| {
                let passed = value <= done;
                if passed {
                    hit.push(w);
                }
                !passed
            });
            let monitored = qo
                .waiters
                .iter()
                .map(|(value, _)| value - 1)
                .chain(signal_point.map(|p| p.saturating_sub(1)))
                .min()
                .unwrap_or(u64::MAX);
            for w in hit {
                self.complete_wait(w, Ok(done));
            }
            self.ddi.update_monitored(q, monitored)?;
            // Resample after publishing: a PROGRESS_FENCE that ran before the new monitored
            // value was visible raised no interrupt, so it must be caught here.
            if self.queue(pid, q)?.completed() == done {
                return Ok(());
            }
        }
    }

    /// The interrupt service routine: services every notification the KMD has.
    pub fn handle_interrupts(&mut self, now: Time) -> usize {
        self.at(now);
        let mut n = 0;
        while let Some(irq) = self.ddi.poll_notification() {
            n += 1;
            self.stats.interrupts += 1;
            self.service(irq, now);
        }
        n
    }

    fn service(&mut self, irq: Notification, now: Time) {
        match irq {
            Notification::QueueFault { queue, fault } => self.fault_queue(queue.owner(), queue, fault, now),
            Notification::EngineStateChange { engine, state } => self.handle_engine_state_change(engine, state, now),
            Notification::User { queue, id } => {
                self.stats.user_interrupts += 1;
                self.trace.push(now, Event::UserInterrupt { queue, id });
            }
            Notification::NativeFenceSignaled(what) => self.service_fences(what, now),
            Notification::ProgressFence { queue } => {
                // The queue may be gone (destroyed after the engine raised it): nothing to do.
                let _ = self.update_monitored(queue.owner(), queue, now);
            }
            Notification::Preempted { queue, ticket, requested_at, answered_at } => {
                self.handle_preempted(queue, ticket, requested_at, answered_at, now)
            }
            Notification::DisconnectedRing { queue } => {
                // What the UMD's loop does on `DisconnectedRetry`, done for the GPU that rang:
                // connect (waking its engine from F1); the bind re-reads wptr and finds the
                // work. A queue gone, hung or suspended-in-D3 refuses, which is its answer.
                self.trace.push(now, Event::DisconnectedRing { queue });
                let _ = self.connect_doorbell(queue.owner(), queue, now);
            }
        }
    }

    /// A queue faulted: it is hung from now on. Its waiters end with `QueueLost`, its
    /// pending kernel-mode submissions are dropped (they can never run), and its doorbell is
    /// disconnected with `DisconnectedAbort`.
    pub(super) fn fault_queue(&mut self, pid: ProcessId, q: HwQueueHandle, fault: FaultRecord, now: Time) {
        if self.queue(pid, q).is_err() {
            return;
        }
        self.stats.faults += 1;
        self.trace.push(now, Event::QueueFault { queue: q, fault: fault.clone() });
        self.end_queue(pid, q, QueueLife::Hung(fault), now);
    }

    /// Ends queue `q` with `life` (hung, or its memory's mapping lost): its waiters end with
    /// `QueueLost`, its pending kernel-mode submissions are dropped, and its doorbell is
    /// disconnected with `DisconnectedAbort`.
    pub(super) fn end_queue(&mut self, pid: ProcessId, q: HwQueueHandle, life: QueueLife, now: Time) {
        self.set_state(pid, q, life);
        let Ok(qo) = self.queue(pid, q) else { return };
        let Err(err) = qo.live(q) else { return };
        let (waiters, context) = (std::mem::take(&mut qo.waiters), qo.context);
        for (_, w) in waiters {
            self.complete_wait(w, Err(err.clone()));
        }
        self.drop_km_submissions(pid, context, q);
        // The queue is hung either way; a doorbell that cannot be disconnected stays bound
        // to a queue the firmware no longer runs.
        let _ = self.disconnect(pid, q, DoorbellStatus::DisconnectedAbort, now);
    }

    /// Drops queue `q`'s pending kernel-mode submissions from its context's software queue
    /// (a hung queue can never run them).
    pub(super) fn drop_km_submissions(&mut self, pid: ProcessId, context: abi::ContextHandle, q: HwQueueHandle) {
        if let Ok(ctx) = self.proc(pid).and_then(|p| p.contexts.get_mut(context)) {
            let before = ctx.software_queue.len();
            ctx.software_queue.retain(|s| s.queue != q);
            self.km_queued -= before - ctx.software_queue.len();
        }
    }

    /// Reads a queue's fence log: the entries written after `since` entries (a previous
    /// [`abi::fence_log::LogRead::total`], 0 at first), after the KMD's flush
    /// (`DxgkDdiUpdateNativeFenceLogs`). For tools (the timeline) and tests; the client has no
    /// access to its logs.
    pub fn read_fence_log(
        &mut self,
        pid: ProcessId,
        q: HwQueueHandle,
        kind: abi::fence_log::FenceLogType,
        since: u64,
        now: Time,
    ) -> Result<abi::fence_log::LogRead, KernelError> {
        self.at(now);
        let logs = self.queue(pid, q)?.logs.clone();
        let logs = logs.ok_or_else(|| invalid("queue", q, abi::port::Invalid::NoFenceLog))?;
        self.ddi.flush_fence_logs(q);
        abi::fence_log::read_since(&logs[kind as usize], since)
            .map_err(|reason| KernelError::CorruptLog { queue: q, reason })
    }
}
