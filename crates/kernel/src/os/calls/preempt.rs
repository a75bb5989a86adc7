//! Preemption requests and their answers (spec 003: "a request with an answer"): the OS asks
//! ([`Os::preempt_queue`], a migration, a context suspend, the hang timer's check), keeps every
//! request it has not heard back from in [`Recovery`](super::super::recovery::Recovery) — whose
//! oldest sets the TDR timer — and acts on each answer ([`Os::handle_preempted`]). A request
//! that goes unanswered is the TDR's (`tdr.rs`).

use std::time::Duration;

use abi::port::KernelError;
use abi::queue::FaultKind;
use abi::{EngineId, HwQueueHandle, ProcessId, Time};

use super::super::Os;
use super::super::recovery::{Cause, Pending};
use super::super::waits::{WaitId, WaitStart};
use crate::ddi::Kmd;
use crate::trace::Event;

impl Os {
    /// Asks the engine to preempt queue `q` (see [`recovery`](super::super::recovery)): it
    /// leaves its slot at the next point the granularity allows and stays off the run list
    /// until [`Os::resume_queue`]. Returns the request's ticket. If no answer comes within
    /// `TdrDelay`, recovery starts.
    pub fn preempt_queue(&mut self, pid: ProcessId, q: HwQueueHandle, now: Time) -> Result<u64, KernelError> {
        self.recovery.adapter_alive()?;
        let qo = self.queue(pid, q)?;
        qo.live(q)?;
        let engine = qo.engine;
        let ticket = self.request_preemption(q, engine, Cause::Request, now)?;
        self.queue(pid, q)?.held = true;
        Ok(ticket)
    }

    /// `DxgkDdiPreemptCommand` for queue `q` on `engine`, for `cause`: the request is kept
    /// until its answer comes. A request the KMD could not even make recovers the engine.
    pub(super) fn request_preemption(
        &mut self,
        q: HwQueueHandle,
        engine: EngineId,
        cause: Cause,
        now: Time,
    ) -> Result<u64, KernelError> {
        match self.cx.ddi.preempt_queue(q, now) {
            Ok(ticket) => {
                let p = Pending { queue: q, engine, at: now, cause };
                self.recovery.insert(ticket, p, &mut self.cx.timers);
                Ok(ticket)
            }
            Err(e) => {
                // A request the KMD could not even make: the engine cannot be trusted to answer.
                self.tdr(engine, q, now);
                self.recovery.settle_waits(&mut self.cx);
                Err(e.into())
            }
        }
    }

    /// Takes the preemptions a context suspend made ([`Kmd::suspend_context`]) as requests:
    /// one answered at once is an answer now (traced, as any other); one owed is kept, so
    /// that an answer that never comes starts recovery.
    pub(super) fn await_suspend(&mut self, suspended: Vec<crate::ddi::Suspended>, now: Time) {
        for s in suspended {
            let Ok(engine) = self.queue(s.queue.owner(), s.queue).map(|q| q.engine) else { continue };
            let p = Pending { queue: s.queue, engine, at: now, cause: Cause::Suspend };
            self.recovery.insert(s.ticket, p, &mut self.cx.timers);
            if s.answered {
                self.handle_preempted(s.queue, s.ticket, now, now, now);
            }
        }
    }

    /// Forgets the answers owed by `queues`: they were resumed (the device withdrew its
    /// requests) or are gone.
    pub(super) fn forget_preemptions(&mut self, queues: &[HwQueueHandle]) {
        self.recovery.forget(|p| queues.contains(&p.queue), &mut self.cx.timers);
        self.recovery.settle_waits(&mut self.cx);
    }

    /// Starts a wait for every preemption answer process `pid`'s queues still owe: a
    /// teardown's (spec 000, abnormal termination: "KMD preempts the context and removes it
    /// from its HW run list", and only then are its queues and rings destroyed, so that the
    /// hardware no longer references them). Decided when the last answer comes, or when
    /// recovery takes a queue that would not answer (after `TdrDelay`); done at once if
    /// nothing is owed. The driver blocks on it for at most [`Os::preemption_wait_bound`].
    pub fn begin_preemption_wait(&mut self, pid: ProcessId, _now: Time) -> WaitStart {
        if !self.recovery.owes_for(pid) {
            return WaitStart::Done(Ok(abi::port::WaitOutcome::Reached(0)));
        }
        let id = self.cx.waits.open_for(pid);
        self.recovery.settle_later(pid, id);
        WaitStart::Blocked(id)
    }

    /// Ends a [`Os::begin_preemption_wait`]: whether every answer came (or recovery took the
    /// queues that owed one).
    pub fn end_preemption_wait(&mut self, id: WaitId, _now: Time) -> bool {
        self.recovery.stop_settling(id);
        matches!(self.cx.waits.take(id), Some(Ok(_)))
    }

    /// The longest a [`Os::begin_preemption_wait`] can last: an unanswered request is
    /// recovered after `TdrDelay`, by resets that may each take `TdrDdiDelay`.
    pub fn preemption_wait_bound(&self) -> Duration {
        let cfg = &self.recovery.cfg;
        cfg.delay * 2 + cfg.ddi_delay * 2
    }

    /// Asks queue `q` to preempt for a memory migration.
    pub(super) fn preempt_for_migration(
        &mut self,
        pid: ProcessId,
        q: HwQueueHandle,
        now: Time,
    ) -> Result<u64, KernelError> {
        let engine = self.queue(pid, q)?.engine;
        self.request_preemption(q, engine, Cause::Migration, now)
    }

    /// Puts a queue taken off the run list by [`Os::preempt_queue`] back on it
    /// (`DxgkddiResumeContext` for that queue), waking its engine first (`Os::release_queue`).
    pub fn resume_queue(&mut self, pid: ProcessId, q: HwQueueHandle, now: Time) -> Result<(), KernelError> {
        self.recovery.adapter_alive()?;
        let qo = self.queue(pid, q)?;
        qo.live(q)?;
        qo.held = false;
        let context = qo.context;
        if self.proc(pid)?.contexts.get(context)?.suspended {
            // The context's own suspension still holds the queue.
            return Ok(());
        }
        self.recovery.forget_queue(q, &mut self.cx.timers);
        self.release_queue(pid, q, now)
    }

    /// The answer to request `ticket` if it came (and is among the latest kept): its latency,
    /// from the request to the engine's answer (ns).
    pub fn preempt_answer(&self, ticket: u64) -> Option<u64> {
        self.recovery.answer(ticket)
    }

    /// The engine answered a preemption request (`requested` and `answered` are device times;
    /// `now` is when the OS hears of it, and acts).
    pub(super) fn handle_preempted(
        &mut self,
        queue: HwQueueHandle,
        ticket: u64,
        requested: Time,
        answered: Time,
        now: Time,
    ) {
        let Some(p) = self.recovery.take(ticket, &mut self.cx.timers) else {
            // Answered after its queue was recovered, resumed or destroyed: nothing waits.
            return;
        };
        self.recovery.settle_waits(&mut self.cx);
        // The answer first, then what it lets happen.
        let latency_ns = answered.since(requested).as_nanos() as u64;
        self.recovery.record_answer(ticket, latency_ns);
        self.cx.trace.push(answered, Event::Preempted { queue, ticket, latency_ns });
        let checked = matches!(p.cause, Cause::HangCheck | Cause::Watchdog);
        if !checked {
            // Held off its engine: a kernel-mode queue's unstarted buffers are resubmitted.
            self.km.take_back_unstarted(&mut self.cx, queue.owner(), queue, now);
        }
        if p.cause == Cause::Migration {
            self.migration_answered(queue, now);
        }
        if p.cause == Cause::HangCheck {
            // It yielded. Having run for the timeout without progress, it is hung all the
            // same: reset, off its slot now.
            if let Some(ran) = self.ran_without_progress(queue) {
                let ran_ms = ran.as_millis() as u64;
                let fault = FaultKind::HangTimeout { ran_ms };
                self.recover_queue(p, fault, Event::HangTimeout { queue, engine: p.engine, ran_ms }, now);
                return;
            }
        }
        if checked {
            // Waiting, or sharing its slot (a hang check), or at a point where it can let a
            // waiting queue have its slot (the watchdog): not hung. It runs on (unless the
            // kernel took hold of it meanwhile: its context suspended, or a request of its
            // own).
            let _ = self.release_queue(queue.owner(), queue, now);
        }
    }
}
