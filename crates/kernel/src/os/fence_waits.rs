//! Native fences' CPU waits, the MonitoredValue protocol and the interrupt service for
//! `NativeFenceSignaled` (spec 002): the waiting half of [`Fences`] (see
//! [`super::fences`] for the storage, and the protocol's summary).
//!
//! Invariant: a fence's MonitoredValue is always at most (lowest waited value − 1) — every
//! change goes through one `DxgkDdiUpdateMonitoredValues` batch, then a resample — so no
//! signal a waiter waits for passes without an interrupt.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use abi::Time;
use abi::port::{Invalid, KernelError, NativeFenceType, WaitMode, WaitOutcome};
use abi::{HwQueueHandle, NativeFenceHandle, ProcessId};

use super::fences::Fences;
use super::process::{FenceWait, Process};
use super::shared::{BrokenTwin, Shared, invalid};
use super::waits::{WaitId, WaitStart};
use crate::ddi::{Kmd, SignaledFences};
use crate::trace::{Ddi, Event};

impl Fences {
    /// Starts a CPU wait. Returns at once if it is already satisfied.
    pub(super) fn begin_fence_wait(
        &mut self,
        cx: &mut Shared,
        pid: ProcessId,
        conds: &[(NativeFenceHandle, u64)],
        mode: WaitMode,
        now: Time,
    ) -> Result<WaitStart, KernelError> {
        if conds.is_empty() {
            return Err(invalid("fences", 0, Invalid::EmptyWait));
        }
        let p = cx.proc(pid)?;
        for (h, _) in conds {
            let f = p.fences.get(*h)?;
            if p.devices.get(f.device).is_ok_and(|d| d.error) {
                return Err(KernelError::DeviceLost { device: f.device });
            }
            if f.kind == NativeFenceType::IntraGpu {
                return Err(invalid("fences", h, Invalid::NoCpuAccess));
            }
        }
        if let Some(i) = evaluate(p, conds, mode) {
            return Ok(WaitStart::Done(Ok(WaitOutcome::Reached(i))));
        }
        let wait = Arc::new(FenceWait { conds: conds.to_vec(), mode, wait: cx.waits.open_for(pid), scheduler: false });
        self.register_wait(cx, pid, &wait, now)?;
        Ok(WaitStart::Blocked(wait.wait))
    }

    /// Registers `wait` on each of its fences, then settles them (programs MonitoredValue and
    /// resamples, which may complete it at once).
    pub(super) fn register_wait(
        &mut self,
        cx: &mut Shared,
        pid: ProcessId,
        wait: &Arc<FenceWait>,
        now: Time,
    ) -> Result<(), KernelError> {
        let p = cx.proc(pid)?;
        for &(h, value) in &wait.conds {
            p.fences.get_mut(h)?.waiters.push((value, wait.clone()));
        }
        for &(h, _) in &wait.conds {
            self.settle_fence(cx, pid, h, now);
        }
        Ok(())
    }

    /// Deregisters a finished or abandoned wait from every fence it named.
    pub(super) fn forget_wait(&mut self, cx: &mut Shared, pid: ProcessId, wait: &Arc<FenceWait>) {
        let ids = self.unregister_wait(cx, pid, wait);
        // Raising a MonitoredValue cannot lose a wake-up, so no resample is needed here.
        let batch: Vec<(u64, u64)> = ids.into_iter().map(|id| (id, self.monitored_for(cx, id))).collect();
        if !batch.is_empty() {
            self.update_monitored_values(cx, &batch);
        }
    }

    /// Takes `wait` off every fence it named; returns those fences' ids (their MonitoredValue
    /// may now rise).
    pub(super) fn unregister_wait(&mut self, cx: &mut Shared, pid: ProcessId, wait: &Arc<FenceWait>) -> Vec<u64> {
        let Ok(p) = cx.proc(pid) else { return Vec::new() };
        let mut ids = Vec::new();
        for &(h, _) in &wait.conds {
            if let Ok(f) = p.fences.get_mut(h) {
                f.waiters.retain(|(_, w)| w.wait != wait.wait);
                if !ids.contains(&f.id) {
                    ids.push(f.id);
                }
            }
        }
        ids
    }

    /// Ends a CPU wait: deregisters it and reports.
    pub(super) fn end_fence_wait(
        &mut self,
        cx: &mut Shared,
        pid: ProcessId,
        id: WaitId,
    ) -> Result<WaitOutcome, KernelError> {
        if let Ok(p) = cx.proc(pid) {
            let found =
                p.fences.iter().find_map(|(_, f)| f.waiters.iter().find(|(_, w)| w.wait == id).map(|(_, w)| w.clone()));
            if let Some(w) = found {
                self.forget_wait(cx, pid, &w);
            }
        }
        match cx.waits.take(id) {
            Some(Ok(i)) => Ok(WaitOutcome::Reached(i)),
            Some(Err(e)) => Err(e),
            None => Ok(WaitOutcome::TimedOut),
        }
    }

    /// Wakes what fence `h`'s CurrentValue satisfies, then programs its MonitoredValue for the
    /// rest and resamples, until nothing changes (`DxgkDdiUpdateMonitoredValues`, then the
    /// OS's resample).
    pub(super) fn settle_fence(&mut self, cx: &mut Shared, pid: ProcessId, h: NativeFenceHandle, now: Time) {
        self.settle_fences(cx, &[(pid, h)], now);
    }

    /// [`Os::settle_fence`](super::Os::settle_fence) for several fences at once: one `DxgkDdiUpdateMonitoredValues`
    /// per round carries every fence's new MonitoredValue (the spec's batch), then each is
    /// resampled.
    pub(super) fn settle_fences(&mut self, cx: &mut Shared, targets: &[(ProcessId, NativeFenceHandle)], now: Time) {
        let mut round: Vec<(ProcessId, NativeFenceHandle)> = Vec::new();
        for t in targets {
            if !round.contains(t) {
                round.push(*t);
            }
        }
        // Only the swarm's broken twin wakes a waiter one value early.
        let early = cx.breaks(BrokenTwin::EarlyFenceWake) as u64;
        while !round.is_empty() {
            // 1. Wake what the CurrentValues satisfy. The fences those waits also named (but
            // this round does not settle) get their raised MonitoredValue in the same batch.
            let mut raised: Vec<u64> = Vec::new();
            for &(pid, h) in &round {
                let Ok(p) = cx.proc(pid) else { continue };
                let Ok(f) = p.fences.get(h) else { continue };
                let done: Vec<(Arc<FenceWait>, u64)> = f
                    .waiters
                    .iter()
                    .filter_map(|(_, w)| evaluate_within(p, &w.conds, w.mode, early).map(|r| (w.clone(), r)))
                    .collect();
                for (w, r) in &done {
                    self.complete_fence_wait(cx, w, Ok(*r));
                    raised.extend(self.unregister_wait(cx, pid, w));
                }
            }
            // 2. One DDI for every MonitoredValue (a shared fence's once).
            let mut items = Vec::new();
            let mut batch: Vec<(u64, u64)> = Vec::new();
            for &(pid, h) in &round {
                let Ok(id) = cx.proc(pid).and_then(|p| p.fences.get(h).map(|f| f.id)) else { continue };
                let m = self.monitored_for(cx, id);
                if !batch.iter().any(|&(i, _)| i == id) {
                    batch.push((id, m));
                }
                items.push((pid, h, m));
            }
            for id in raised {
                if !batch.iter().any(|&(i, _)| i == id) && !self.instances(id).is_empty() {
                    batch.push((id, self.monitored_for(cx, id)));
                }
            }
            if batch.is_empty() {
                return;
            }
            self.update_monitored_values(cx, &batch);
            // 3. Resample. Any signal after the barrier sees the new MonitoredValue and
            // interrupts; a signal before it is in `resampled`. So a waiter this fence's
            // `resampled` value passes gets no interrupt: if its whole wait (other fences too)
            // is now satisfied, wake it in another round; otherwise stop (its other fences'
            // signals will settle it).
            let mut next = Vec::new();
            for (pid, h, m) in items {
                let Ok(p) = cx.proc(pid) else { continue };
                let Ok(f) = p.fences.get(h) else { continue };
                let resampled = abi::protocol::resample(f.value.get());
                let pending = f.waiters.iter().any(|(v, w)| *v <= resampled && evaluate(p, &w.conds, w.mode).is_some());
                cx.trace.push(now, Event::Ddi(Ddi::UpdateMonitoredValues(h, m)));
                if pending {
                    next.push((pid, h));
                }
            }
            round = next;
        }
    }

    /// `DxgkDdiUpdateMonitoredValues` for a batch. Should the KMD refuse it (it never does for
    /// fences it registered), the OS stores the values itself with the same barrier, so no
    /// wake-up can be lost.
    pub(super) fn update_monitored_values(&mut self, cx: &mut Shared, batch: &[(u64, u64)]) {
        cx.stats.monitored_updates += 1;
        cx.stats.monitored_values += batch.len() as u64;
        if cx.ddi.update_monitored_values(batch).is_ok() {
            return;
        }
        for &(id, m) in batch {
            if let Some(&(pid, h)) = self.instances(id).first()
                && let Some(f) = cx.processes.get(&pid).and_then(|p| p.fences.get(h).ok())
            {
                abi::protocol::store_monitored(f.monitored.get(), m);
            }
        }
        abi::protocol::monitored_barrier();
    }

    /// `NativeFenceSignaled`: settle the named fences; for named queues (the optimized mode),
    /// flush and read their signal logs to learn which fences; with no list, or when a log was
    /// overrun or is corrupt, settle every fence with a waiter (the fallback scan).
    pub(super) fn service_fences(&mut self, cx: &mut Shared, what: SignaledFences, now: Time) {
        cx.stats.fence_interrupts += 1;
        let targets: Vec<(ProcessId, NativeFenceHandle)> = match what {
            SignaledFences::Fences(ids) => ids.iter().flat_map(|&id| self.instances(id)).collect(),
            SignaledFences::Queues(queues) => self.fences_in_logs(cx, &queues, true, now),
            SignaledFences::EngineLogs(engine) => {
                // A NULL queue: rescan the signal logs of every queue on this engine.
                let queues: Vec<HwQueueHandle> = cx
                    .processes
                    .values()
                    .flat_map(|p| p.queues.iter().filter(|(_, q)| q.engine == engine && q.logs.is_some()))
                    .map(|(h, _)| h)
                    .collect();
                self.fences_in_logs(cx, &queues, false, now)
            }
            SignaledFences::All => self.fences_with_waiters(cx),
            SignaledFences::AllNative => {
                let all = self.fences_with_waiters(cx);
                all.into_iter()
                    .filter(|&(pid, h)| {
                        cx.processes
                            .get(&pid)
                            .and_then(|p| p.fences.get(h).ok())
                            .is_some_and(|f| f.kind != NativeFenceType::LegacyMonitored)
                    })
                    .collect()
            }
        };
        self.settle_signaled(cx, targets, now);
    }

    /// Settles `targets` and notes each as signalled.
    pub(super) fn settle_signaled(&mut self, cx: &mut Shared, targets: Vec<(ProcessId, NativeFenceHandle)>, now: Time) {
        self.settle_fences(cx, &targets, now);
        for (pid, h) in targets {
            if let Ok(id) = cx.proc(pid).and_then(|p| p.fences.get(h).map(|f| f.id)) {
                self.note_signaled(cx, id, now);
            }
        }
    }

    /// The fence instances the signal logs of `queues` name ([`Os::read_signal_logs`](super::Os::read_signal_logs)), or
    /// every fence with a waiter when the logs cannot be trusted (the fallback scan).
    pub(super) fn fences_in_logs(
        &mut self,
        cx: &mut Shared,
        queues: &[HwQueueHandle],
        each_names_one: bool,
        now: Time,
    ) -> Vec<(ProcessId, NativeFenceHandle)> {
        match self.read_signal_logs(cx, queues, each_names_one, now) {
            Some(ids) => ids.iter().flat_map(|&id| self.instances(id)).collect(),
            None => {
                cx.stats.fence_log_fallbacks += 1;
                self.fences_with_waiters(cx)
            }
        }
    }

    /// Reads queue `q`'s signal log to its end (after the KMD's flush) and settles the fences
    /// it names: what [`Os::recreate_fence_log`](super::Os::recreate_fence_log) does with the
    /// old log, so a signal written there and not yet read is not lost with it.
    pub(super) fn drain_signal_log(&mut self, cx: &mut Shared, q: HwQueueHandle, now: Time) {
        let targets = self.fences_in_logs(cx, &[q], false, now);
        self.settle_signaled(cx, targets, now);
    }

    /// Flushes (`DxgkDdiUpdateNativeFenceLogs`) and reads the signal logs of `queues`; returns
    /// the fence ids they name, or `None` when the kernel must scan every fence instead.
    ///
    /// The log is written where the client says (it chooses the positions), so the kernel
    /// trusts it only to narrow the search: anything it cannot account for — a queue gone, no
    /// log, a corrupt or overrun log, or (with `each_names_one`, an interrupt that named the
    /// queue) a log with no new entry that explains the interrupt ([`Fences::explains`]) — falls
    /// back to the scan. An overrun is also flagged in the trace ([`Event::FenceLogOverrun`],
    /// spec 002: "the OS can emit a flag in the trace to notify a user that events were lost").
    pub(super) fn read_signal_logs(
        &mut self,
        cx: &mut Shared,
        queues: &[HwQueueHandle],
        each_names_one: bool,
        now: Time,
    ) -> Option<Vec<u64>> {
        let mut ids = Vec::new();
        let mut scan_all = false;
        for &q in queues {
            let pid = q.owner();
            let Ok(qo) = cx.queue(pid, q) else {
                scan_all = true;
                continue;
            };
            let (logs, seen) = (qo.logs.clone(), qo.signal_log_seen);
            let Some(logs) = logs else {
                scan_all = true;
                continue;
            };
            cx.ddi.flush_fence_logs(q);
            let log = &logs[abi::fence_log::FenceLogType::Signal as usize];
            match abi::fence_log::read_since(log, seen) {
                Ok(r) => {
                    if let Ok(qo) = cx.queue(pid, q) {
                        qo.signal_log_seen = r.total;
                    }
                    let named: Vec<u64> = r.entries.iter().map(|e| e.fence_handle).filter(|&h| h != 0).collect();
                    if r.lost > 0 {
                        cx.trace.push(now, Event::FenceLogOverrun { queue: q, lost: r.lost });
                        scan_all = true;
                    }
                    // The interrupt named this queue because one of its signals passed a
                    // MonitoredValue. If no new entry did, the log does not explain it (a
                    // signal the client did not log): scan.
                    if each_names_one && !r.entries.iter().any(|e| self.explains(cx, e)) {
                        scan_all = true;
                    }
                    ids.extend(named);
                }
                Err(_) => {
                    scan_all = true;
                    // Start over from wherever the header is now.
                    let total = abi::fence_log::header_total(log).unwrap_or(seen);
                    if let Ok(qo) = cx.queue(pid, q) {
                        qo.signal_log_seen = total;
                    }
                }
            }
        }
        // (A NULL-queue rescan whose logs show nothing new settles nothing: the GPU names the
        // engine only for logged signals.)
        if scan_all {
            return None;
        }
        ids.sort_unstable();
        ids.dedup();
        Some(ids)
    }

    /// Whether signal-log entry `e` accounts for an interrupt that named its queue: the value
    /// it logs is past its fence's MonitoredValue. A waiter that wants at most that value is
    /// then still unsettled, so the logged signal found it and raised an interrupt of its own
    /// (a waiter added after the signal is settled at once and never lowers MonitoredValue
    /// below a value already reached). The fence's live value would not do: another queue may
    /// have taken it past MonitoredValue, and a log naming the fence at a value nobody waits
    /// for would then hide an unlogged signal of another fence — whose waiter would sleep on.
    /// Each entry that explains an interrupt has one of its own, so an interrupt the log
    /// cannot account for always ends in a scan.
    pub(super) fn explains(&self, cx: &Shared, e: &abi::fence_log::FenceLogEntry) -> bool {
        let f = self.instances(e.fence_handle).first().and_then(|&(pid, h)| cx.processes.get(&pid)?.fences.get(h).ok());
        // Acquire: as every read of the two words (`abi::protocol`).
        f.is_some_and(|f| e.fence_value > f.monitored.get().load(Ordering::Acquire))
    }

    /// Decides a fence wait: a thread's result is kept until it ends the wait; the
    /// scheduler's is not (nobody ends it), and the scheduler is told to look again.
    pub(super) fn complete_fence_wait(&mut self, cx: &mut Shared, w: &FenceWait, r: Result<u64, KernelError>) {
        if w.scheduler {
            cx.waits.take(w.wait);
            cx.kick_scheduler();
        } else {
            cx.complete_wait(w.wait, r);
        }
    }

    /// The MonitoredValue fence `id` should have: the lowest value any process's waiter waits
    /// for, minus 1; `u64::MAX` with no waiter; 0 for a legacy monitored fence. Shared fences
    /// have one MonitoredValue, so every instance's waiters count.
    pub(super) fn monitored_for(&self, cx: &Shared, id: u64) -> u64 {
        let mut m = u64::MAX;
        for (pid, h) in self.instances(id) {
            let Some(f) = cx.processes.get(&pid).and_then(|p| p.fences.get(h).ok()) else { continue };
            if f.kind == NativeFenceType::LegacyMonitored || f.cross.is_some() {
                return 0;
            }
            m = m.min(f.waiters.iter().map(|(v, _)| v.saturating_sub(1)).min().unwrap_or(u64::MAX));
        }
        m
    }

    /// Stores fence `id`'s MonitoredValue (a raise needs no resample).
    pub(super) fn program_monitored(&mut self, cx: &mut Shared, id: u64) {
        if self.instances(id).is_empty() {
            return;
        }
        let m = self.monitored_for(cx, id);
        self.update_monitored_values(cx, &[(id, m)]);
    }

    /// What the fallback scan settles: every fence with a waiter here, and every
    /// cross-adapter fence (its waiters may be on another adapter).
    pub(super) fn fences_with_waiters(&self, cx: &Shared) -> Vec<(ProcessId, NativeFenceHandle)> {
        cx.processes
            .iter()
            .flat_map(|(&pid, p)| {
                p.fences.iter().filter(|(_, f)| !f.waiters.is_empty() || f.cross.is_some()).map(move |(h, _)| (pid, h))
            })
            .collect()
    }
}

/// Whether a wait is satisfied: for `Any`, the index of a reached fence; for `All`, 0.
fn evaluate(p: &Process, conds: &[(NativeFenceHandle, u64)], mode: WaitMode) -> Option<u64> {
    evaluate_within(p, conds, mode, 0)
}

/// [`evaluate`], with a fence `early` below its value counting as reached (0 but in the
/// broken twin [`BrokenTwin::EarlyFenceWake`]).
fn evaluate_within(p: &Process, conds: &[(NativeFenceHandle, u64)], mode: WaitMode, early: u64) -> Option<u64> {
    let reached =
        |&(h, v): &(NativeFenceHandle, u64)| p.fences.get(h).is_ok_and(|f| f.current().saturating_add(early) >= v);
    match mode {
        WaitMode::Any => conds.iter().position(reached).map(|i| i as u64),
        WaitMode::All => conds.iter().all(reached).then_some(0),
    }
}
