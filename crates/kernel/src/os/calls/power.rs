//! Power and lifecycle: engine F-states, device D-states, context suspension, process
//! termination.
//!
//! Spec 000, in its order:
//! - "Engine F-state transitions": an engine asks for F1 when idle
//!   (`DXGK_INTERRUPT_GPU_ENGINE_STATE_CHANGE`); the OS disconnects every doorbell of its
//!   queues, then `DxgkDdiSetPowerComponentFState(F1)`, which the device refuses if work
//!   arrived meanwhile (the doorbells are then reconnected). A connect or a kernel-mode
//!   submission wakes an engine in F1 first.
//! - "Engine D-state transitions": D0 → D3 for an idle device is 1. `DxgkddiSuspendContext`
//!   for every context, 2. every doorbell disconnected, 3. ring allocations evicted from local
//!   memory; then every engine to F1. D3 → D0: residency restored, the connection, then the
//!   contexts resumed.
//! - "Hardware context suspension": suspend and resume on request; doorbells stay connected.
//!   A queue the kernel holds off its engine (its context suspended, or a preemption request
//!   of its own, [`Os::preempt_queue`]) does not keep the engine awake: the engine may enter F1
//!   with the held queue's work kept. So every release wakes the engine first, then puts the
//!   queue back on the run list (`Os::release_queue`).
//! - "Normal and abnormal process termination": normal disconnects every doorbell and
//!   reports what to wait for; abnormal marks the device in error, suspends every context (the
//!   KMD preempts each queue: a request and its answer), then disconnects, and the driver
//!   waits for the answers still owed ([`Os::begin_preemption_wait`]; TDR recovers a queue
//!   that never answers); both end in [`Os::finish_termination`].
//!
//! The device's D-state and the contexts D3 suspended are [`Power`]'s; the doorbells these
//! sequences disconnect are [`Doorbells`](super::super::doorbells::Doorbells)'.

use abi::port::{InUseBy, InUseObject, Invalid, KernelError};
use abi::{ContextHandle, DoorbellStatus, EngineId, EngineState, HwQueueHandle, PowerState};
use abi::{ProcessId, Time};

use super::super::Os;
use super::super::power::{Power, wake_engine};
use super::super::shared::invalid;
use crate::ddi::Kmd;
use crate::trace::Event;

impl Os {
    /// D0 → D3 for an idle device (refused while any queue has work in flight), in the
    /// spec's order (see the module docs). Entering D3 twice is a no-op. A connect (or a
    /// kernel-mode submission) brings the device back to D0.
    pub fn enter_d3(&mut self, now: Time) -> Result<(), KernelError> {
        if self.power.d3 {
            return Ok(());
        }
        // D3 is for an idle device: work in flight would wait for a connect that may never
        // come. Refuse, naming a busy queue.
        for p in self.cx.processes.values() {
            for (h, q) in p.queues.iter() {
                let sw_queued = p.contexts.get(q.context).is_ok_and(|c| c.software_queue.iter().any(|s| s.queue == h));
                if sw_queued || self.cx.ddi.queue_has_work(h) {
                    return Err(KernelError::InUse { object: InUseObject::Adapter, by: InUseBy::WorkInFlight(h) });
                }
            }
        }
        self.cx.trace.push(now, Event::DevicePower { d3: true });
        let pids: Vec<ProcessId> = self.cx.processes.keys().copied().collect();
        // 1. Suspend every context (the ones not already suspended on request; D3's
        // suspension is its own, undone on the way back to D0).
        for &pid in &pids {
            for c in self.proc(pid)?.contexts.handles() {
                if !self.proc(pid)?.contexts.get(c)?.suspended {
                    let queues = self.cx.context_queues(pid, c)?;
                    // (Idle, so every queue answers at once, before its doorbell is
                    // disconnected and its rings evicted: nothing is owed.)
                    let owed = self.cx.ddi.suspend_context(c, &queues, now)?;
                    self.await_suspend(owed, now);
                    self.power.suspended.push((pid, c));
                }
            }
        }
        // 2. Disconnect every doorbell.
        for &pid in &pids {
            for q in self.proc(pid)?.queues.handles() {
                self.doorbells.disconnect(&mut self.cx, pid, q, DoorbellStatus::DisconnectedRetry, now)?;
            }
        }
        // 3. Evict ring allocations from local memory, now that no queue is scheduled.
        Power::evict_rings(&mut self.cx, &pids, now)?;
        // The device powers down: every engine to F1 (nothing is scheduled).
        for e in self.cx.ddi.adapter_info().engines {
            let st = self.cx.ddi.set_power(e.id, PowerState::F1, now)?;
            self.cx.trace.push(now, Event::Power { engine: e.id, state: st });
        }
        self.power.d3 = true;
        Ok(())
    }

    /// The last step of D3 → D0: `DxgkddiResumeContext` for the contexts D3 suspended.
    /// A context the device refuses to resume stays listed, with those after it, for the
    /// next wake-up, and the refusal is returned.
    pub(super) fn resume_after_d3(&mut self, now: Time) -> Result<(), KernelError> {
        let mut pending = std::mem::take(&mut self.power.suspended).into_iter();
        while let Some((pid, c)) = pending.next() {
            let Ok(ctx) = self.proc(pid).and_then(|p| p.contexts.get_mut(c)) else { continue };
            if ctx.suspended {
                continue; // suspended on request meanwhile: it stays suspended
            }
            let engine = ctx.engine;
            if let Err(e) = self.resume_context_queues(pid, c, engine, now) {
                self.power.suspended = std::iter::once((pid, c)).chain(pending).collect();
                return Err(e);
            }
        }
        Ok(())
    }

    /// `DxgkDdiResumeContext`: the context's engine wakes, then its queues return to the run
    /// list (but those held by a request of their own, [`Os::preempt_queue`], which only
    /// [`Os::resume_queue`] releases).
    fn resume_context_queues(
        &mut self,
        pid: ProcessId,
        c: ContextHandle,
        engine: EngineId,
        now: Time,
    ) -> Result<(), KernelError> {
        // A hung queue (faulted, reset, or lost with its device) never runs again.
        let mut queues = self.cx.context_queues(pid, c)?;
        queues.retain(|&q| {
            self.cx.processes.get(&pid).and_then(|p| p.queues.get(q).ok()).is_some_and(|o| o.live(q).is_ok() && !o.held)
        });
        wake_engine(&mut self.cx, engine, now)?;
        self.cx.ddi.resume_context(c, &queues)?;
        // The device withdrew any request a suspend left owed.
        self.forget_preemptions(&queues);
        Ok(())
    }

    /// Puts queue `q` back on its engine's run list (`DxgkddiResumeContext` for that queue),
    /// waking the engine first, unless something else still holds it: a request of its own
    /// ([`Os::preempt_queue`]), a migration in progress, its context's suspension, or D3 (the
    /// return to D0 resumes its context). For every release of a queue the kernel held off its engine: the engine
    /// may have entered F1 meanwhile (the held queue's work, kept, does not keep it awake),
    /// and a queue put back on the run list of an engine in F1 never runs.
    pub(super) fn release_queue(&mut self, pid: ProcessId, q: HwQueueHandle, now: Time) -> Result<(), KernelError> {
        let qo = self.queue(pid, q)?;
        if qo.held || qo.live(q).is_err() {
            return Ok(());
        }
        let (context, engine) = (qo.context, qo.engine);
        if self.migrations.holds(q) {
            return Ok(());
        }
        if self.proc(pid)?.contexts.get(context)?.suspended {
            return Ok(());
        }
        if self.power.d3 {
            self.power.resume_at_d0(pid, context);
            return Ok(());
        }
        wake_engine(&mut self.cx, engine, now)?;
        self.cx.ddi.resume_context(context, &[q])?;
        Ok(())
    }

    /// Suspends a context (spec 000 "Hardware context suspension"): `DxgkddiSuspendContext`,
    /// and the KMD takes its queues off the scheduler's list. Doorbells stay connected and
    /// the client keeps queuing; the work runs after [`Os::resume_context`]. Suspending a
    /// suspended context is refused.
    pub fn suspend_context(&mut self, pid: ProcessId, c: ContextHandle, now: Time) -> Result<(), KernelError> {
        let ctx = self.proc(pid)?.contexts.get_mut(c)?;
        if ctx.suspended {
            return Err(invalid("context", c, Invalid::AlreadySuspended));
        }
        ctx.suspended = true;
        let queues = self.cx.context_queues(pid, c)?;
        let owed = self.cx.ddi.suspend_context(c, &queues, now)?;
        self.await_suspend(owed, now);
        Ok(())
    }

    /// Resumes a context: `DxgkddiResumeContext`, and the KMD puts its queues back on the
    /// scheduler's list (waking the engine first if it is in F1). Resuming a context that is
    /// not suspended is refused.
    pub fn resume_context(&mut self, pid: ProcessId, c: ContextHandle, now: Time) -> Result<(), KernelError> {
        let ctx = self.proc(pid)?.contexts.get_mut(c)?;
        if !ctx.suspended {
            return Err(invalid("context", c, Invalid::NotSuspended));
        }
        ctx.suspended = false;
        let engine = ctx.engine;
        // In D3 its queues stay off the run list: the return to D0 resumes it.
        if self.power.d3 {
            self.power.resume_at_d0(pid, c);
            return Ok(());
        }
        self.resume_context_queues(pid, c, engine, now)
    }

    /// Normal termination, first part: for each queue, `DxgkDdiDisconnectDoorbell`. Returns
    /// each queue and the last-queued progress value to wait for before
    /// [`Os::finish_termination`]. Ring memory stays resident meanwhile.
    pub fn begin_normal_termination(
        &mut self,
        pid: ProcessId,
        now: Time,
    ) -> Result<Vec<(HwQueueHandle, u64)>, KernelError> {
        // The exiting process's queued work must be able to finish: wake a device in D3.
        if self.power.power_up(&mut self.cx, now)? {
            self.resume_after_d3(now)?;
        }
        let mut out = Vec::new();
        for q in self.proc(pid)?.queues.handles() {
            // 1. DxgkDdiDisconnectDoorbell.
            self.doorbells.disconnect(&mut self.cx, pid, q, DoorbellStatus::DisconnectedAbort, now)?;
            // 2. Then the wait for the last-queued value (the driver blocks on it).
            let value = self.cx.last_queued(pid, q);
            let completed = self.queue(pid, q)?.completed();
            self.cx.trace.push(now, Event::TerminationWait { queue: q, value, completed });
            out.push((q, value));
        }
        Ok(out)
    }

    /// Normal termination: the wait for queue `q`'s last-queued value ended (`reached`, or
    /// not: the termination then turns abnormal). Logged for the spec's order.
    pub fn termination_wait_done(&mut self, q: HwQueueHandle, reached: bool, now: Time) {
        self.cx.trace.push(now, Event::TerminationWaitDone { queue: q, reached });
    }

    /// Abnormal termination, first part: the device is marked in error, then for each
    /// context `DxgkddiSuspendContext` (the KMD preempts it off the run list), then for each
    /// queue `DxgkDdiDisconnectDoorbell`. [`Os::finish_termination`] destroys, without waiting.
    pub fn begin_abnormal_termination(&mut self, pid: ProcessId, now: Time) -> Result<(), KernelError> {
        for d in self.proc(pid)?.devices.handles() {
            self.mark_device_error(pid, d, now)?;
        }
        for c in self.proc(pid)?.contexts.handles() {
            if !self.proc(pid)?.contexts.get(c)?.suspended {
                self.suspend_context(pid, c, now)?;
            }
        }
        for q in self.proc(pid)?.queues.handles() {
            self.doorbells.disconnect(&mut self.cx, pid, q, DoorbellStatus::DisconnectedAbort, now)?;
        }
        Ok(())
    }

    /// `DXGK_INTERRUPT_GPU_ENGINE_STATE_CHANGE`: an idle engine asks for F1. Every doorbell
    /// of its queues is disconnected, then the F1 transition; if the device refuses (work
    /// arrived), the doorbells are reconnected rather than make each queue pay a reconnect.
    pub(super) fn handle_engine_state_change(&mut self, engine: EngineId, state: EngineState, now: Time) {
        self.cx.trace.push(now, Event::EngineRequest { engine, state });
        let mut targets = Vec::new();
        for (&pid, p) in &self.cx.processes {
            for (h, q) in p.queues.iter() {
                if q.engine == engine && q.doorbell.is_some_and(|d| p.doorbells.get(d).is_ok_and(|d| d.connected)) {
                    targets.push((pid, h));
                }
            }
        }
        for &(pid, q) in &targets {
            // A queue that cannot be disconnected keeps its doorbell; the device then
            // refuses F1 if it has work, which is safe.
            let _ = self.doorbells.disconnect(&mut self.cx, pid, q, DoorbellStatus::DisconnectedRetry, now);
        }
        match self.cx.ddi.set_power(engine, PowerState::F1, now) {
            Ok(PowerState::F1) => {
                self.cx.stats.f1_entries += 1;
                self.cx.trace.push(now, Event::Power { engine, state: PowerState::F1 })
            }
            Ok(PowerState::F0) | Err(_) => {
                // Work arrived (or the device would not power down): the engine stays awake,
                // so give its queues their doorbells back.
                self.cx.trace.push(now, Event::F1Refused { engine });
                for (pid, q) in targets {
                    let _ = self.connect_doorbell(pid, q, now);
                }
            }
        }
    }
}
