//! CPU waits on progress fences (spec 000's wait on a queue's progress fence; spec 001's "the
//! kernel driver ... wakes the waiting thread" through the monitored value): register the
//! waiter, set the monitored value (lowest waited value − 1) through
//! `DxgkDdiUpdateMonitoredValues`, *then* re-read the completed value and satisfy what already
//! passed. The interrupt service (`isr.rs`) does the same scan when a progress interrupt
//! arrives. The firmware compares against the monitored value after writing the completed
//! value, so a wake-up cannot fall between them (the same protocol as native fences,
//! model-checked in `abi/tests/loom.rs`).
//!
//! Invariant: a wait's result is decided once, and stays in the OS until its thread ends it.

use abi::port::{KernelError, WaitOutcome};
use abi::{HwQueueHandle, ProcessId, Time};

use super::super::Os;
use super::super::waits::{WaitId, WaitStart};
use crate::ddi::Kmd;

impl Os {
    /// Starts a CPU wait on a queue's progress fence.
    pub fn begin_wait(
        &mut self,
        pid: ProcessId,
        q: HwQueueHandle,
        value: u64,
        now: Time,
    ) -> Result<WaitStart, KernelError> {
        let qo = self.queue(pid, q)?;
        let done = qo.completed();
        if done >= value {
            return Ok(WaitStart::Done(Ok(WaitOutcome::Reached(done))));
        }
        qo.live(q)?;
        let id = self.cx.waits.open_for(pid);
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
        if let Ok(qo) = self.queue(pid, q) {
            qo.waiters.retain(|&(_, w)| w != id);
            // A raised monitored value: nothing can be missed, but report a refusal.
            self.update_monitored(pid, q, now)?;
        }
        match self.cx.waits.take(id) {
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
                self.cx.complete_wait(w, Ok(done));
            }
            self.cx.ddi.update_monitored(q, monitored)?;
            // Resample after publishing: a PROGRESS_FENCE that ran before the new monitored
            // value was visible raised no interrupt, so it must be caught here.
            if self.queue(pid, q)?.completed() == done {
                return Ok(());
            }
        }
    }
}
