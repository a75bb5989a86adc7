//! The interrupt service routine ([`Os::handle_interrupts`]): drains the KMD's notifications
//! and hands each to the concern that owns it — a progress fence re-runs the queue's progress
//! waits (`waits.rs`), a native fence signal goes to the fences
//! ([`Fences`](super::super::fences::Fences)), an engine's idle request runs the F1 sequence
//! (`power.rs`), a preemption answer goes to `preempt.rs`, a queue fault marks the queue hung
//! (its waiters end, its pending kernel-mode submissions are dropped, its doorbell is
//! disconnected), a disconnected ring reconnects.

use abi::queue::FaultRecord;
use abi::{DoorbellStatus, HwQueueHandle, ProcessId, Time};

use super::super::Os;
use super::super::process::QueueLife;
use super::super::shared::BrokenTwin;
use crate::ddi::{Kmd, Notification};
use crate::trace::Event;

impl Os {
    /// The interrupt service routine: services every notification the KMD has.
    pub fn handle_interrupts(&mut self, now: Time) -> usize {
        let mut n = 0;
        while let Some(irq) = self.cx.ddi.poll_notification() {
            n += 1;
            self.cx.stats.interrupts += 1;
            self.service(irq, now);
        }
        n
    }

    fn service(&mut self, irq: Notification, now: Time) {
        match irq {
            Notification::QueueFault { queue, fault } => self.fault_queue(queue.owner(), queue, fault, now),
            Notification::EngineStateChange { engine, state } => self.handle_engine_state_change(engine, state, now),
            Notification::User { queue, id } => {
                self.cx.stats.user_interrupts += 1;
                self.cx.trace.push(now, Event::UserInterrupt { queue, id });
            }
            Notification::NativeFenceSignaled(what) => self.fences.service_fences(&mut self.cx, what, now),
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
                self.cx.trace.push(now, Event::DisconnectedRing { queue });
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
        self.cx.stats.faults += 1;
        self.cx.trace.push(now, Event::QueueFault { queue: q, fault: fault.clone() });
        self.end_queue(pid, q, QueueLife::Hung(fault), now);
    }

    /// Ends queue `q` with `life` (hung, or its memory's mapping lost): its waiters end with
    /// `QueueLost`, its pending kernel-mode submissions are dropped, and its doorbell is
    /// disconnected with `DisconnectedAbort`.
    pub(super) fn end_queue(&mut self, pid: ProcessId, q: HwQueueHandle, life: QueueLife, now: Time) {
        self.cx.set_state(pid, q, life);
        let Ok(qo) = self.queue(pid, q) else { return };
        let Err(err) = qo.live(q) else { return };
        let (waiters, context) = (std::mem::take(&mut qo.waiters), qo.context);
        for (_, w) in waiters {
            self.cx.complete_wait(w, Err(err.clone()));
        }
        self.km.drop_km_submissions(&mut self.cx, pid, context, q);
        if self.cx.breaks(BrokenTwin::HungQueueKeepsDoorbell) {
            return;
        }
        // The queue is hung either way; a doorbell that cannot be disconnected stays bound
        // to a queue the firmware no longer runs.
        let _ = self.doorbells.disconnect(&mut self.cx, pid, q, DoorbellStatus::DisconnectedAbort, now);
    }
}
