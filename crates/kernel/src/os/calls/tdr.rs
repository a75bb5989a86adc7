//! Timeout detection and recovery, top to bottom (spec 003; Windows' order; see
//! [`recovery`](super::super::recovery)'s module docs), and device lost.
//!
//! [`Os::recovery_timeout`] is what the TDR and hang-scan timers fire: each request
//! unanswered for `TdrDelay` starts a recovery — [`Os::tdr`] for an engine (a caller's
//! request, a migration's, a suspend's, the engine watchdog's), [`Os::recover_queue`] for the
//! hang timer's check — and then the hang timer scans and the engine watchdog looks. [`Os::tdr`] is the whole sequence in one place: the
//! snapshot, the engine reset, the guilty queues faulted and their devices in error, the
//! innocent queues' restart, or else the adapter reset; then the recovery is counted, and
//! past the limit the adapter is lost for good.

use std::time::Duration;

use abi::port::KernelError;
use abi::queue::{FaultKind, FaultRecord};
use abi::{DeviceHandle, DoorbellStatus, EngineId, HwQueueHandle, ProcessId, Time};

use super::super::Os;
use super::super::process::QueueLife;
use super::super::recovery::{Cause, Pending, TdrConfig};
use super::super::timers::Timer;
use crate::ddi::{DdiKind, Kmd};
use crate::trace::Event;

/// `(process, queue, submitted, completed)`: a queue's last submitted and completed progress
/// values ("fence IDs") when recovery started.
type Snapshot = Vec<(ProcessId, HwQueueHandle, u64, u64)>;

impl Os {
    /// Sets the TDR settings (refused with a typed error naming the field if out of range).
    pub fn set_tdr(&mut self, cfg: TdrConfig) -> Result<(), KernelError> {
        cfg.validate()?;
        self.recovery.set_cfg(cfg, &mut self.cx.timers);
        Ok(())
    }

    /// The TDR, hang-scan and engine-watch timers fired: every request unanswered for
    /// `TdrDelay` starts recovery (a TDR for a caller's request, a watchdog's, one per engine;
    /// a per-queue reset for a hang check); then the hang timer's scan and the engine
    /// watchdog's look, if they are due.
    pub(in crate::os) fn recovery_timeout(&mut self, now: Time) {
        // Requests whose queue is gone or already hung wait for nothing.
        let processes = &self.cx.processes;
        let gone = |p: &Pending| {
            processes
                .get(&p.queue.owner())
                .and_then(|pr| pr.queues.get(p.queue).ok())
                .is_none_or(|q| q.live(p.queue).is_err())
        };
        self.recovery.forget(gone, &mut self.cx.timers);
        // (A migration waits no longer for a queue that went away or hung: see below.)
        let mut engines: Vec<EngineId> = Vec::new();
        for p in self.recovery.overdue(now) {
            match p.cause {
                Cause::HangCheck => {
                    let fault = FaultKind::PreemptTimeout { waited_ms: now.since(p.at).as_millis() as u64 };
                    self.recover_queue(p, fault, Event::TdrTimeout { queue: p.queue, engine: p.engine }, now);
                }
                Cause::Request | Cause::Migration | Cause::Suspend | Cause::Watchdog
                    if !engines.contains(&p.engine) =>
                {
                    engines.push(p.engine);
                    self.tdr(p.engine, p.queue, now);
                }
                Cause::Request | Cause::Migration | Cause::Suspend | Cause::Watchdog => {}
            }
        }
        // Migrations and teardowns whose queues were recovered or went away proceed.
        self.advance_migrations(now);
        self.recovery.settle_waits(&mut self.cx);
        if self.cx.timers.is_due(Timer::HangScan, now) {
            self.hang_scan(now);
        }
        if self.cx.timers.is_due(Timer::EngineWatch, now) {
            self.engine_watch(now);
        }
    }

    /// A TDR: `queue`'s preemption request on `engine` went unanswered for `TdrDelay` (or
    /// could not even be made). In Windows' order:
    /// 1. the snapshot of each queue's submitted and completed progress values on the engine;
    /// 2. `DxgkDdiResetEngine`, where the KMD resets single engines, its report trusted only if
    ///    it came within `TdrDdiDelay` and each guilty queue's aborted fence ID lies in what
    ///    that queue submitted and had not completed;
    /// 3. each guilty queue (the ones that would not yield) hangs and is reported, its
    ///    request answered by the reset;
    /// 4. its device is lost ([`Os::device_lost`]): its fences AlwaysSignaled, its CPU waiters
    ///    failed, its other queues stopped and reported lost with it;
    /// 5. the innocent queues (of the other devices) restart;
    /// 6. without engine reset, or when it failed or was not trusted: the adapter reset;
    /// 7. the recovery counts against `TdrLimitCount`.
    pub(super) fn tdr(&mut self, engine: EngineId, queue: HwQueueHandle, now: Time) {
        self.cx.trace.push(now, Event::TdrTimeout { queue, engine });
        // 1.
        let snapshot = self.progress_snapshot(Some(engine));
        // 2.
        let guilty = if self.recovery.cfg.engine_reset { self.reset_engine(engine, &snapshot, now) } else { None };
        let Some(guilty) = guilty else {
            // 6.
            self.reset_adapter(now);
            self.count_recovery(None, now);
            return;
        };
        for (pid, q) in guilty {
            // 3. Its request is answered by the reset.
            let waited = self.recovery.request_of(q).map_or(0, |p| now.since(p.at).as_millis());
            self.recovery.forget_queue(q, &mut self.cx.timers);
            let fault = FaultRecord {
                kind: FaultKind::PreemptTimeout { waited_ms: waited as u64 },
                rptr: 0,
                opcode: None,
                in_indirect: false,
            };
            self.fault_queue(pid, q, fault, now);
            // 4. Its device is lost, as Windows puts the guilty device in error: its fences
            // AlwaysSignaled, its CPU waiters failed, and its other queues stopped, for a
            // queue of it that ran on would signal its fences back down from u64::MAX.
            if let Some(device) = self.device_of(pid, q) {
                let _ = self.device_lost(pid, device, now);
            }
        }
        // 5. The innocent queues restart. The reset took each one off its slot with its
        // state saved, and left it on its engine's run list with its work: the engine's
        // scheduling pass after the reset maps it again (the device's part of
        // `DxgkDdiResetEngine`). The OS holds none of them (a queue it holds off its engine
        // is off the run list, never in a slot), so it has nothing to release and sends no
        // `DxgkddiResumeContext`: an innocent queue runs on as it was.
        // 7.
        self.count_recovery(Some(engine), now);
    }

    /// Step 2 of [`Os::tdr`]: `DxgkDdiResetEngine` and the check of its report. Returns the
    /// guilty queues (with their processes), or `None` if the reset failed, took longer than
    /// `TdrDdiDelay`, or reported a fence ID outside what a guilty queue had outstanding (a
    /// driver bug, never trusted): the adapter is reset then.
    fn reset_engine(
        &mut self,
        engine: EngineId,
        snapshot: &Snapshot,
        now: Time,
    ) -> Option<Vec<(ProcessId, HwQueueHandle)>> {
        let outcome = self.cx.ddi.reset_engine(engine, now).ok()?;
        if self.ddi_too_slow(DdiKind::ResetEngine, outcome.took, now) {
            return None;
        }
        // Every guilty queue's last aborted fence ID lies in what it submitted and had not
        // completed; anything else is a driver bug, never trusted.
        for &(q, aborted) in &outcome.guilty {
            let (submitted, completed) = snapshot.iter().find(|s| s.1 == q).map_or((0, u64::MAX), |s| (s.2, s.3));
            if !(completed <= aborted && aborted <= submitted) {
                self.driver_bug(q, aborted, completed, submitted, now);
                return None;
            }
        }
        Some(outcome.guilty.iter().filter_map(|&(q, _)| snapshot.iter().find(|s| s.1 == q).map(|s| (s.0, q))).collect())
    }

    /// The hang timer's per-queue reset (amdgpu; [`recovery`](super::super::recovery)'s
    /// module docs, step 2), traced as `event`: its check went unanswered
    /// ([`FaultKind::PreemptTimeout`]), or was answered by a queue that ran its timeout
    /// without progress ([`FaultKind::HangTimeout`]). The queue hangs with `kind`; a failed
    /// or refused reset escalates to an adapter reset.
    pub(super) fn recover_queue(&mut self, p: Pending, kind: FaultKind, event: Event, now: Time) {
        self.recovery.forget_queue(p.queue, &mut self.cx.timers);
        self.cx.trace.push(now, event);
        let pid = p.queue.owner();
        let submitted = self.cx.last_queued(pid, p.queue);
        let completed = self.queue(pid, p.queue).map_or(0, |q| q.completed());
        let done = match self.cx.ddi.reset_queue(p.queue, kind.clone(), now) {
            Ok(out) if self.ddi_too_slow(DdiKind::ResetQueue, out.took, now) => false,
            Ok(crate::ddi::QueueResetOutcome { aborted, .. }) if completed <= aborted && aborted <= submitted => {
                let fault = FaultRecord { kind, rptr: 0, opcode: None, in_indirect: false };
                self.fault_queue(pid, p.queue, fault, now);
                true
            }
            Ok(crate::ddi::QueueResetOutcome { aborted, .. }) => {
                self.driver_bug(p.queue, aborted, completed, submitted, now);
                false
            }
            Err(_) => false,
        };
        if !done {
            self.reset_adapter(now);
        }
        self.count_recovery(done.then_some(p.engine), now);
    }

    /// A reset DDI that took longer than `TdrDdiDelay` counts as one that never answered:
    /// its report is not used, and recovery escalates to the adapter.
    fn ddi_too_slow(&mut self, ddi: DdiKind, took: Duration, now: Time) -> bool {
        if took <= self.recovery.cfg.ddi_delay {
            return false;
        }
        self.cx.trace.push(now, Event::DdiTimeout { ddi, took_ms: took.as_millis() as u64 });
        true
    }

    fn driver_bug(&mut self, q: HwQueueHandle, aborted: u64, completed: u64, submitted: u64, now: Time) {
        let what = format!("reset reported fence ID {aborted} aborted on {q}, outside [{completed}, {submitted}]");
        self.cx.trace.push(now, Event::DriverBug { what });
    }

    /// The snapshot of every queue (on `engine`, if given).
    fn progress_snapshot(&mut self, engine: Option<EngineId>) -> Snapshot {
        let mut out = Vec::new();
        let pids: Vec<ProcessId> = self.cx.processes.keys().copied().collect();
        for pid in pids {
            let Ok(p) = self.proc(pid) else { continue };
            let queues: Vec<(HwQueueHandle, u64)> = p
                .queues
                .iter()
                .filter(|(_, q)| engine.is_none_or(|e| q.engine == e))
                .map(|(h, q)| (h, q.completed()))
                .collect();
            for (h, completed) in queues {
                let submitted = self.cx.last_queued(pid, h);
                out.push((pid, h, submitted, completed));
            }
        }
        out
    }

    /// The adapter reset (`DxgkDdiResetFromTimeout`, then `DxgkDdiRestartFromTimeout`): every
    /// queue's state is lost, every device with it.
    fn reset_adapter(&mut self, now: Time) {
        let _ = self.cx.ddi.reset_from_timeout(now);
        self.recovery.adapter_resets += 1;
        // The reset does not preserve local memory (VRAM lost): its contents are gone, and
        // every queue created before reports it.
        for p in self.cx.processes.values() {
            for (_, a) in p.allocations.iter() {
                if a.domain == abi::port::MemoryDomain::Local {
                    let _ = a.shm.fill_u32(0, a.shm.len() as u64 & !3, 0);
                }
            }
        }
        let _ = self.cx.ddi.restart_from_timeout();
        self.recovery.forget(|_| true, &mut self.cx.timers);
        self.lose_every_device(now);
    }

    fn lose_every_device(&mut self, now: Time) {
        let pids: Vec<ProcessId> = self.cx.processes.keys().copied().collect();
        for pid in pids {
            let devices = self.proc(pid).map(|p| p.devices.handles()).unwrap_or_default();
            for d in devices {
                let _ = self.device_lost(pid, d, now);
            }
        }
    }

    /// Counts a recovery; past the limit, the adapter is lost for good.
    fn count_recovery(&mut self, engine: Option<EngineId>, now: Time) {
        let count = self.recovery.count(now);
        self.cx.trace.push(now, Event::Recovered { engine, count });
        if self.recovery.check_limit(count, &mut self.cx.timers) {
            self.cx.trace.push(now, Event::AdapterFatal);
            // Lost for good, the adapter is stopped (`DxgkDdiResetFromTimeout`, with no
            // restart) before its devices are lost: a context suspension only asks, and a
            // queue inside a kernel its engine cannot preempt would go on running what was
            // published before the loss, which its client was told is lost.
            let _ = self.cx.ddi.reset_from_timeout(now);
            self.lose_every_device(now);
        }
    }

    /// A lost device's queue that still runs is reset through the scheduling firmware
    /// ([`Kmd::reset_queue`], [`FaultKind::DeviceLost`]), which takes it off its slot now and
    /// answers what it owed. A reset that fails or answers too late escalates to the adapter,
    /// as the hang timer's does, and counts as a recovery.
    fn stop_lost_queue(&mut self, q: HwQueueHandle, now: Time) {
        let stopped = match self.cx.ddi.reset_queue(q, FaultKind::DeviceLost, now) {
            Ok(out) => !self.ddi_too_slow(DdiKind::ResetQueue, out.took, now),
            Err(_) => false,
        };
        if stopped {
            self.recovery.forget_queue(q, &mut self.cx.timers);
        } else {
            self.reset_adapter(now);
            self.count_recovery(None, now);
        }
    }

    fn device_of(&mut self, pid: ProcessId, q: HwQueueHandle) -> Option<DeviceHandle> {
        let context = self.queue(pid, q).ok()?.context;
        Some(self.proc(pid).ok()?.contexts.get(context).ok()?.device)
    }

    /// Device lost (spec 000: "In the event of any device-lost scenarios ... Dxgkrnl
    /// disconnects the doorbell and marks the status as D3DDDI_DOORBELL_STATUS_DISCONNECTED_ABORT.
    /// User mode is responsible for destroying the HWQueue, doorbell, ring buffer, and for
    /// re-creating them"): see [`recovery`](super::super::recovery)'s module docs. Idempotent.
    pub fn device_lost(&mut self, pid: ProcessId, device: DeviceHandle, now: Time) -> Result<(), KernelError> {
        let already = self.proc(pid)?.devices.get(device)?.error;
        if !already {
            self.cx.trace.push(now, Event::DeviceLost { device });
        }
        // Fences AlwaysSignaled, their CPU waits failed with DeviceLost.
        self.mark_device_error(pid, device, now)?;
        let lost = KernelError::DeviceLost { device };
        let contexts: Vec<_> =
            self.proc(pid)?.contexts.iter().filter(|(_, c)| c.device == device).map(|(h, _)| h).collect();
        for c in contexts {
            // Its queues stop running: the context is suspended, and a queue that did not
            // stop at once (inside work its engine cannot preempt), or all of them if the
            // suspension failed, is reset.
            let suspended = self.proc(pid)?.contexts.get(c)?.suspended || self.suspend_context(pid, c, now).is_ok();
            for q in self.cx.context_queues(pid, c)? {
                if self.queue(pid, q)?.live(q).is_err() {
                    continue;
                }
                if !suspended || self.recovery.owes(q) {
                    self.stop_lost_queue(q, now);
                }
                let fault = FaultRecord { kind: FaultKind::DeviceLost, rptr: 0, opcode: None, in_indirect: false };
                self.cx.set_state(pid, q, QueueLife::Hung(fault));
                let waiters = std::mem::take(&mut self.queue(pid, q)?.waiters);
                for (_, w) in waiters {
                    self.cx.complete_wait(w, Err(lost.clone()));
                }
                self.km.drop_km_submissions(&mut self.cx, pid, c, q);
                let _ = self.doorbells.disconnect(&mut self.cx, pid, q, DoorbellStatus::DisconnectedAbort, now);
            }
        }
        Ok(())
    }
}
