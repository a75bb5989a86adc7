//! amdgpu's hang timer (see [`recovery`](super::super::recovery)'s module docs): every quarter
//! of the timeout the OS scans the queues with work outstanding, asks a suspect to preempt
//! ([`Cause::HangCheck`]), and decides on its answer ([`Os::handle_preempted`]) — or, with no
//! answer in time, the TDR path resets it (`tdr.rs`).

use std::time::Duration;

use abi::{HwQueueHandle, ProcessId, Time};

use super::super::Os;
use super::super::process::Stall;
use super::super::recovery::Cause;
use crate::ddi::Kmd;

/// A live queue at one look of the hang timer or the engine watchdog.
pub(super) struct Watched {
    pub(super) pid: ProcessId,
    pub(super) q: HwQueueHandle,
    /// Its last submitted progress value.
    pub(super) submitted: u64,
    /// The kernel holds it off its engine ([`Os::held_off`]).
    pub(super) held_off: bool,
}

impl Os {
    /// The hang timer's scan (module docs, step 1): a queue with work outstanding whose
    /// progress fence has not moved for its engine's hang timeout, or that has run that long
    /// since it last moved, is asked to preempt ([`Cause::HangCheck`]). A queue the kernel
    /// holds is not watched while held.
    pub(super) fn hang_scan(&mut self, now: Time) {
        let kinds: Vec<abi::EngineKind> = self.cx.ddi.adapter_info().engines.iter().map(|e| e.kind).collect();
        let cfg = self.recovery.cfg;
        let checking: Vec<HwQueueHandle> = self.recovery.owing();
        let mut suspects = Vec::new();
        let live = self.live_queues();
        let any = !live.is_empty();
        for Watched { pid, q, submitted, held_off } in live {
            let Ok(qo) = self.queue(pid, q) else { continue };
            // A queue the kernel holds off its engine is not watched, and its period
            // starts over once it is released. (One that still owes the hold's answer is
            // running, and TDR times the answer.)
            if held_off {
                qo.progress_seen = None;
                continue;
            }
            let timeout = cfg.hang_timeout(kinds.get(qo.engine.0 as usize).copied());
            let completed = qo.completed();
            let Some(t) = timeout.filter(|_| submitted > completed) else {
                qo.progress_seen = None;
                continue;
            };
            let (engine, seen) = (qo.engine, qo.progress_seen.filter(|s| s.value == completed));
            // Read only for a queue with work outstanding: a device lock each.
            let run = self.cx.ddi.queue_run_time(q);
            let next = match seen {
                None => Stall { value: completed, since: now, ran_at: run },
                Some(s) => {
                    let stalled = now.since(s.since) >= t;
                    let ran_out = s.ran(run).is_some_and(|r| r >= t);
                    if (stalled || ran_out) && !checking.contains(&q) {
                        suspects.push((q, engine));
                        // The wall window starts over; the running window runs on until
                        // the value moves.
                        Stall { since: now, ..s }
                    } else {
                        s
                    }
                }
            };
            if let Ok(qo) = self.queue(pid, q) {
                qo.progress_seen = Some(next);
            }
        }
        for (q, engine) in suspects {
            let _ = self.request_preemption(q, engine, Cause::HangCheck, now);
        }
        self.recovery.next_hang_scan(any, now, &mut self.cx.timers);
    }

    /// Every live queue, with what the hang timer and the engine watchdog read of it first.
    pub(super) fn live_queues(&mut self) -> Vec<Watched> {
        let mut out = Vec::new();
        let pids: Vec<ProcessId> = self.cx.processes.keys().copied().collect();
        for pid in pids {
            for q in self.proc(pid).map(|p| p.queues.handles()).unwrap_or_default() {
                if self.queue(pid, q).is_ok_and(|qo| qo.live(q).is_ok()) {
                    let submitted = self.cx.last_queued(pid, q);
                    let held_off = self.held_off(pid, q);
                    out.push(Watched { pid, q, submitted, held_off });
                }
            }
        }
        out
    }

    /// Whether the kernel holds queue `q` of `pid` off its engine: a request of its own, a
    /// migration, its context suspended, or D3. Such a queue makes no progress because it is
    /// held, not because it hangs or is kept from running, so neither the hang timer nor the
    /// engine watchdog counts it.
    pub(super) fn held_off(&mut self, pid: ProcessId, q: HwQueueHandle) -> bool {
        if self.power.d3 || self.migrations.holds(q) {
            return true;
        }
        let Ok(p) = self.proc(pid) else { return true };
        let Ok(qo) = p.queues.get(q) else { return true };
        qo.held || p.contexts.get(qo.context).is_ok_and(|c| c.suspended)
    }

    /// How long queue `q` has run since its progress value last moved, if that is at least
    /// its engine's hang timeout (and the value has not moved since the hang timer saw it).
    pub(super) fn ran_without_progress(&mut self, q: HwQueueHandle) -> Option<Duration> {
        let run = self.cx.ddi.queue_run_time(q);
        let timeout = self.hang_timeout(q)?;
        let qo = self.queue(q.owner(), q).ok()?;
        let completed = qo.completed();
        let ran = qo.progress_seen.filter(|s| s.value == completed)?.ran(run)?;
        (ran >= timeout).then_some(ran)
    }

    /// Queue `q`'s hang timeout ([`TdrConfig::hang_timeout`] of its engine's kind).
    fn hang_timeout(&mut self, q: HwQueueHandle) -> Option<Duration> {
        let engine = self.queue(q.owner(), q).ok()?.engine;
        let kind = self.cx.ddi.adapter_info().engines.get(engine.0 as usize).map(|e| e.kind);
        self.recovery.cfg.hang_timeout(kind)
    }
}
