//! Preemption requests, timeout detection and recovery (TDR), and device lost (spec 003; spec
//! 000's device-lost paragraph).
//!
//! **Preemption.** [`Os::preempt_queue`] asks the KMD to take a queue off its slot
//! (`DxgkDdiPreemptCommand`); the engine answers with a `Preempted` interrupt once the queue
//! stopped at a point its granularity allows, state saved. The OS keeps every request it has
//! not heard back from, with the time it asked.
//!
//! **Timeout detection.** Spec 003: the OS "guarantees that preemption requests are sent to the
//! GPU before it initiates a Timeout Detection and Recovery process". So detection is exactly
//! this: a request with no answer after `TdrDelay` ([`TdrConfig::delay`]). A long kernel that
//! yields answers and is never reset by TDR (the hang timer, below, may reset it); a queue
//! blocked in a preemptible `WAIT` answers too, and is reset by neither.
//!
//! **Recovery**, in Windows' order:
//! 1. the OS snapshots, for each queue on the engine, the last submitted and last completed
//!    progress values ("fence IDs");
//! 2. with per-engine reset ([`TdrConfig::engine_reset`]), `DxgkDdiResetEngine`: the KMD
//!    reports the queues that would not yield and the last fence ID it aborted on each; a
//!    report outside `[completed, submitted]` is a driver bug — refused, logged, and recovery
//!    escalates;
//! 3. each guilty queue is hung and reported (doorbell `DisconnectedAbort`, its status, its
//!    device's fences AlwaysSignaled as for a device error); every other queue on the engine
//!    was preempted with its state saved and keeps its work;
//! 4. without engine reset, or when it fails, is refused, or takes longer than `TdrDdiDelay`
//!    ([`TdrConfig::ddi_delay`]; the DDIs are synchronous here, so a reset that returns late
//!    stands for one that never answered, and its report is not used):
//!    `DxgkDdiResetFromTimeout` then `DxgkDdiRestartFromTimeout`, and every device on the
//!    adapter is lost.
//!
//! More than `TdrLimitCount` recoveries within `TdrLimitTime` is fatal: the adapter is stopped
//! (`DxgkDdiResetFromTimeout` with no restart, so nothing published before runs), every device
//! is lost, and the adapter refuses new work with [`KernelError::AdapterLost`].
//!
//! **The hang timer** (amdgpu's per-queue hang detection; [`TdrConfig::hang_compute`],
//! [`TdrConfig::hang_copy`]). TDR above catches only a queue that does not answer a preemption
//! request; a kernel that never ends but yields at every instruction (`Shader` granularity)
//! answers every request and would run forever. Spec 001, "Queue Resets", says what may be
//! done about it: "When a hung queue is detected, it can be reset either via the scheduling
//! firmware or MMIO", and the driver is to "record which queues are hung" for `QUERY_STATUS`; it
//! leaves how a hang is detected open ("e.g., due to failed preemption"). Spec 003 adds the
//! one constraint: preemption requests are sent to the GPU before it initiates a TDR
//! process. So the timer works in two steps, a preemption request first, always:
//!
//! 1. **Suspect.** Every quarter of the timeout the OS looks at each queue with work
//!    outstanding ([`Stall`]). It is a suspect when its completed progress value has not
//!    moved for the timeout of wall time (a queue that waits counts too: blocked in a `WAIT`,
//!    or waiting for a slot), or when it has *run* for the timeout since the value last moved.
//!    "Run" is the device's measure ([`Kmd::queue_run_time`]): time executing its work in a
//!    hardware slot, not time waiting for a slot, held off one, or only re-checking a `WAIT`
//!    that does not pass. A queue the kernel holds (a caller's request, a migration, its
//!    context suspended, D3) is not watched, and its windows start over when it is released.
//!    A suspect is asked to preempt ([`Cause::HangCheck`]).
//! 2. **Decide.** No answer within `TdrDelay`: the TDR path, a per-queue reset with
//!    [`FaultKind::PreemptTimeout`] (traced [`Event::TdrTimeout`]). An answer, with the value
//!    still where it was and the queue having run for the timeout since it last moved: a
//!    per-queue reset with [`FaultKind::HangTimeout`] (traced [`Event::HangTimeout`]) — it
//!    yields, but its work never completes. Any other answer: it was waiting, or shared its
//!    slot, and it is resumed at once; its running window is kept (not restarted), so a hung
//!    queue that runs only part of the time is caught once its running time adds up.
//!
//! Both resets go through the same path: amdgpu's per-queue reset through the scheduling
//! firmware ([`Kmd::reset_queue`]), its report checked against the queue's `[completed,
//! submitted]`, the queue hung and reported (doorbell `DisconnectedAbort`, `QUERY_STATUS` hung
//! and guilty, the fault's kind naming the mechanism), its neighbours untouched, and a
//! recovery counted against `TdrLimitCount`; a failed or refused reset escalates to the
//! adapter. A slow queue whose
//! command buffers each run shorter than the timeout is never reset, however many run in a
//! row; one kernel longer than the timeout is (as amdgpu's job timeout resets one): the
//! timeout is the longest a command buffer may run. On a device that reports no run time
//! (`queue_run_time` is `None`), only the TDR path remains.
//!
//! **Device lost** ([`Os::device_lost`]): the device's fences become AlwaysSignaled and their
//! CPU waits fail with `DeviceLost`; each of its queues is stopped (its context suspended, and
//! a queue that does not stop at once, inside work its engine cannot preempt, reset through
//! the firmware; a reset that fails resets the adapter) and hung, its progress waits fail with `DeviceLost`, and its doorbell is disconnected with
//! `DisconnectedAbort`, which tells the UMD to destroy and recreate queue, doorbell and ring.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use abi::port::KernelError;
use abi::queue::{FaultKind, FaultRecord};
use abi::{DeviceHandle, DoorbellStatus, EngineId, HwQueueHandle, ProcessId, Time};

use super::{Os, QueueLife, WaitStart, invalid};
use crate::ddi::{DdiKind, Kmd};
use crate::trace::Event;

/// Timeout detection and recovery settings (Windows' `TdrDelay`, `TdrLimitCount`,
/// `TdrLimitTime` registry values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TdrConfig {
    /// How long a preemption request may go unanswered before recovery starts (`TdrDelay`,
    /// default 2 s).
    pub delay: Duration,
    /// Recoveries allowed within [`TdrConfig::limit_time`] (`TdrLimitCount`, default 5): one
    /// more is fatal for the adapter.
    pub limit_count: u32,
    /// The window recoveries are counted in (`TdrLimitTime`, default 60 s).
    pub limit_time: Duration,
    /// The KMD resets single engines (`DxgkDdiResetEngine`); otherwise every recovery resets
    /// the adapter.
    pub engine_reset: bool,
    /// How long a reset DDI may take (`TdrDdiDelay`, default 5 s): an engine or queue reset
    /// that takes longer is treated as one that never answered, and the adapter is reset.
    pub ddi_delay: Duration,
    /// amdgpu's per-queue hang timer on compute queues (default 2 s; `None`: off; module
    /// docs): a queue with work outstanding whose progress fence has not moved for this long,
    /// or that has run this long since it last moved, is asked to preempt. No answer within
    /// `delay`: a per-queue reset ([`FaultKind::PreemptTimeout`]). An answer after running
    /// this long without progress: a per-queue reset ([`FaultKind::HangTimeout`]). Any other
    /// answer (it was waiting, or shared its slot): it runs on.
    pub hang_compute: Option<Duration>,
    /// The same on copy queues.
    pub hang_copy: Option<Duration>,
}

impl Default for TdrConfig {
    fn default() -> Self {
        TdrConfig {
            delay: Duration::from_secs(2),
            limit_count: 5,
            limit_time: Duration::from_secs(60),
            engine_reset: true,
            ddi_delay: Duration::from_secs(5),
            hang_compute: Some(Duration::from_secs(2)),
            hang_copy: Some(Duration::from_secs(2)),
        }
    }
}

impl TdrConfig {
    /// The longest a TDR setting may be (one hour): past this, timeouts stop meaning
    /// anything. Configuration front ends (the daemon's file, the simulator's scenarios) refuse
    /// longer values under their own key names.
    pub const MAX: Duration = Duration::from_secs(3600);

    /// The most recoveries [`TdrConfig::limit_count`] may allow.
    pub const MAX_LIMIT_COUNT: u32 = 1000;

    /// The hang timeout of a queue on an engine of `kind`: `hang_copy` on copy and video
    /// engines, `hang_compute` otherwise.
    fn hang_timeout(&self, kind: Option<abi::EngineKind>) -> Option<Duration> {
        match kind {
            Some(abi::EngineKind::Copy | abi::EngineKind::Video) => self.hang_copy,
            _ => self.hang_compute,
        }
    }

    /// Refuses zero or absurd settings, naming the field and the value.
    pub fn validate(&self) -> Result<(), KernelError> {
        use abi::port::Invalid::OutOfRange;
        let range = |field: &'static str, d: Duration| {
            if d.is_zero() || d > Self::MAX {
                Err(invalid(field, format!("{d:?}"), OutOfRange { expected: "between 1 ns and 1 hour" }))
            } else {
                Ok(())
            }
        };
        range("tdr.delay", self.delay)?;
        range("tdr.limit_time", self.limit_time)?;
        range("tdr.ddi_delay", self.ddi_delay)?;
        if let Some(d) = self.hang_compute {
            range("tdr.hang_compute", d)?;
        }
        if let Some(d) = self.hang_copy {
            range("tdr.hang_copy", d)?;
        }
        if self.limit_count == 0 || self.limit_count > Self::MAX_LIMIT_COUNT {
            return Err(invalid("tdr.limit_count", self.limit_count, OutOfRange { expected: "between 1 and 1000" }));
        }
        Ok(())
    }
}

/// How many answers [`Os::preempt_answer`] remembers.
const ANSWERS_KEPT: usize = 4096;

/// A preemption request the OS has not heard back from.
#[derive(Clone, Copy, Debug)]
struct Pending {
    queue: HwQueueHandle,
    engine: EngineId,
    at: Time,
    /// Why it was asked for.
    cause: Cause,
}

/// Why the OS asked for a preemption.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cause {
    /// A caller of [`Os::preempt_queue`]: the queue stays off the run list until resumed; no
    /// answer in time means an engine reset.
    Request,
    /// The hang timer's check: no answer in time means a per-queue reset
    /// ([`FaultKind::PreemptTimeout`]); an answer from a queue that ran the timeout without
    /// progress too ([`FaultKind::HangTimeout`]); any other answer resumes the queue at once.
    HangCheck,
    /// A memory migration ([`super::migrate`]): the last answer lets it proceed, and it
    /// resumes the queue; no answer in time means an engine reset, as for a request.
    Migration,
    /// A context suspend (`DxgkddiSuspendContext`) that found the queue where its engine may
    /// not stop it: it leaves at its next allowed point; no answer in time means an engine
    /// reset, as for a request.
    Suspend,
}

/// What the hang timer knows of a queue with work outstanding (module docs): its completed
/// progress value, since when it has not moved (the wall window, restarted by each check the
/// queue answered), and how long the queue had run when the value was first seen (the
/// running window's start, kept until the value moves).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Stall {
    value: u64,
    since: Time,
    /// [`Kmd::queue_run_time`] when `value` was first seen (`None`: the device does not say).
    ran_at: Option<Duration>,
}

impl Stall {
    /// How long the queue has run since its progress value last moved, given its run time
    /// now.
    fn ran(&self, run: Option<Duration>) -> Option<Duration> {
        Some(run?.saturating_sub(self.ran_at?))
    }
}

/// The OS's recovery state.
#[derive(Default)]
pub(crate) struct Recovery {
    pub(crate) cfg: TdrConfig,
    /// Requests not answered yet, by ticket.
    pending: BTreeMap<u64, Pending>,
    /// When recent recoveries happened (within `limit_time`).
    recent: VecDeque<Time>,
    /// Set once the recovery limit was exceeded: the adapter is lost for good.
    fatal: Option<KernelError>,
    /// Answers heard.
    pub(crate) answered: u64,
    /// The latest answers: (ticket, latency in ns), at most [`ANSWERS_KEPT`].
    answers: VecDeque<(u64, u64)>,
    /// Recoveries done.
    pub(crate) recoveries: u64,
    /// Adapter resets so far (a queue created before the last one reports VRAM lost).
    pub(crate) adapter_resets: u64,
    /// When the hang timer next scans the queues (`None`: no queue to watch, or off).
    hang_scan_at: Option<Time>,
    /// Teardowns waiting for every answer their process's queues owe
    /// ([`Os::begin_preemption_wait`]).
    pub(super) settling: Vec<(ProcessId, super::WaitId)>,
}

impl Recovery {
    /// When the oldest unanswered request times out.
    pub(crate) fn poll_timeout(&self) -> Option<Time> {
        let tdr = self.pending.values().map(|p| p.at).min().map(|t| t.plus(self.cfg.delay));
        [tdr, self.hang_scan_at].into_iter().flatten().min()
    }

    /// How often the hang timer scans: a quarter of its shortest timeout, so a hang is noticed
    /// within 1.25 timeouts.
    fn hang_period(&self) -> Option<Duration> {
        [self.cfg.hang_compute, self.cfg.hang_copy].into_iter().flatten().min().map(|d| d / 4)
    }

    /// Starts the hang timer's scans if they are not running (a queue was created).
    pub(crate) fn arm_hang_scan(&mut self, now: Time) {
        if self.hang_scan_at.is_none() {
            self.hang_scan_at = self.hang_period().map(|p| now.plus(p));
        }
    }
}

impl Os {
    /// Sets the TDR settings (refused with a typed error naming the field if out of range).
    pub fn set_tdr(&mut self, cfg: TdrConfig) -> Result<(), KernelError> {
        cfg.validate()?;
        self.recovery.cfg = cfg;
        self.recovery.hang_scan_at = None;
        Ok(())
    }

    /// `Ok` unless the adapter is lost for good.
    pub(crate) fn adapter_alive(&self) -> Result<(), KernelError> {
        self.recovery.fatal.clone().map_or(Ok(()), Err)
    }

    /// Asks the engine to preempt queue `q` (see the module docs): it leaves its slot at the
    /// next point the granularity allows and stays off the run list until
    /// [`Os::resume_queue`]. Returns the request's ticket. If no answer comes within
    /// `TdrDelay`, recovery starts.
    pub fn preempt_queue(&mut self, pid: ProcessId, q: HwQueueHandle, now: Time) -> Result<u64, KernelError> {
        self.at(now);
        self.adapter_alive()?;
        let qo = self.queue(pid, q)?;
        qo.live(q)?;
        let engine = qo.engine;
        let ticket = self.request_preemption(q, engine, Cause::Request, now)?;
        self.queue(pid, q)?.held = true;
        Ok(ticket)
    }

    fn request_preemption(
        &mut self,
        q: HwQueueHandle,
        engine: EngineId,
        cause: Cause,
        now: Time,
    ) -> Result<u64, KernelError> {
        match self.ddi.preempt_queue(q, now) {
            Ok(ticket) => {
                self.recovery.pending.insert(ticket, Pending { queue: q, engine, at: now, cause });
                Ok(ticket)
            }
            Err(e) => {
                // A request the KMD could not even make: the engine cannot be trusted to answer.
                self.recover(engine, q, now);
                self.settle_preemption_waits();
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
            self.recovery.pending.insert(s.ticket, Pending { queue: s.queue, engine, at: now, cause: Cause::Suspend });
            if s.answered {
                self.handle_preempted(s.queue, s.ticket, now, now, now);
            }
        }
    }

    /// Forgets the answers owed by `queues`: they were resumed (the device withdrew its
    /// requests) or are gone.
    pub(super) fn forget_preemptions(&mut self, queues: &[HwQueueHandle]) {
        self.recovery.pending.retain(|_, p| !queues.contains(&p.queue));
        self.settle_preemption_waits();
    }

    /// Starts a wait for every preemption answer process `pid`'s queues still owe: a
    /// teardown's (spec 000, abnormal termination: "KMD preempts the context and removes it
    /// from its HW run list", and only then are its queues and rings destroyed, so that the
    /// hardware no longer references them). Decided when the last answer comes, or when
    /// recovery takes a queue that would not answer (after `TdrDelay`); done at once if
    /// nothing is owed. The driver blocks on it for at most [`Os::preemption_wait_bound`].
    pub fn begin_preemption_wait(&mut self, pid: ProcessId, now: Time) -> WaitStart {
        self.at(now);
        if !self.owes_preemptions(pid) {
            return WaitStart::Done(Ok(abi::port::WaitOutcome::Reached(0)));
        }
        let id = self.waits.open_for(pid);
        self.recovery.settling.push((pid, id));
        WaitStart::Blocked(id)
    }

    /// Ends a [`Os::begin_preemption_wait`]: whether every answer came (or recovery took the
    /// queues that owed one).
    pub fn end_preemption_wait(&mut self, id: super::WaitId, now: Time) -> bool {
        self.at(now);
        self.recovery.settling.retain(|&(_, w)| w != id);
        matches!(self.waits.take(id), Some(Ok(_)))
    }

    /// The longest a [`Os::begin_preemption_wait`] can last: an unanswered request is
    /// recovered after `TdrDelay`, by resets that may each take `TdrDdiDelay`.
    pub fn preemption_wait_bound(&self) -> Duration {
        let cfg = &self.recovery.cfg;
        cfg.delay * 2 + cfg.ddi_delay * 2
    }

    /// Whether some preemption request of `pid`'s queues is still owed an answer.
    fn owes_preemptions(&self, pid: ProcessId) -> bool {
        self.recovery.pending.values().any(|p| p.queue.owner() == pid)
    }

    /// Decides the teardown waits whose process owes no answer any more.
    fn settle_preemption_waits(&mut self) {
        if self.recovery.settling.is_empty() {
            return;
        }
        let settled: Vec<super::WaitId> =
            self.recovery.settling.iter().filter(|&&(pid, _)| !self.owes_preemptions(pid)).map(|&(_, w)| w).collect();
        self.recovery.settling.retain(|(_, w)| !settled.contains(w));
        for w in settled {
            self.complete_wait(w, Ok(0));
        }
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

    /// The queues with a preemption request not answered yet.
    pub(super) fn pending_preemptions(&self) -> Vec<HwQueueHandle> {
        self.recovery.pending.values().map(|p| p.queue).collect()
    }

    /// Puts a queue taken off the run list by [`Os::preempt_queue`] back on it
    /// (`DxgkddiResumeContext` for that queue), waking its engine first (`Os::release_queue`).
    pub fn resume_queue(&mut self, pid: ProcessId, q: HwQueueHandle, now: Time) -> Result<(), KernelError> {
        self.at(now);
        self.adapter_alive()?;
        let qo = self.queue(pid, q)?;
        qo.live(q)?;
        qo.held = false;
        let context = qo.context;
        if self.proc(pid)?.contexts.get(context)?.suspended {
            // The context's own suspension still holds the queue.
            return Ok(());
        }
        self.recovery.pending.retain(|_, p| p.queue != q);
        self.release_queue(pid, q, now)
    }

    /// The answer to request `ticket` if it came (and is among the latest
    /// [`ANSWERS_KEPT`]): its latency, from the request to the engine's answer (ns).
    pub fn preempt_answer(&self, ticket: u64) -> Option<u64> {
        self.recovery.answers.iter().rev().find(|a| a.0 == ticket).map(|a| a.1)
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
        let Some(p) = self.recovery.pending.remove(&ticket) else {
            // Answered after its queue was recovered, resumed or destroyed: nothing waits.
            return;
        };
        self.settle_preemption_waits();
        // The answer first, then what it lets happen.
        self.recovery.answered += 1;
        let latency_ns = answered.since(requested).as_nanos() as u64;
        if self.recovery.answers.len() == ANSWERS_KEPT {
            self.recovery.answers.pop_front();
        }
        self.recovery.answers.push_back((ticket, latency_ns));
        self.trace.push(answered, Event::Preempted { queue, ticket, latency_ns });
        if p.cause != Cause::HangCheck {
            // Held off its engine: a kernel-mode queue's unstarted buffers are resubmitted.
            self.take_back_unstarted(queue.owner(), queue, now);
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
            // Waiting, or sharing its slot: not hung. It runs on (unless the kernel took hold
            // of it meanwhile: its context suspended, or a request of its own).
            let _ = self.release_queue(queue.owner(), queue, now);
        }
    }

    /// How long queue `q` has run since its progress value last moved, if that is at least
    /// its engine's hang timeout (and the value has not moved since the hang timer saw it).
    fn ran_without_progress(&mut self, q: HwQueueHandle) -> Option<Duration> {
        let run = self.ddi.queue_run_time(q);
        let timeout = self.hang_timeout(q)?;
        let qo = self.queue(q.owner(), q).ok()?;
        let completed = qo.completed();
        let ran = qo.progress_seen.filter(|s| s.value == completed)?.ran(run)?;
        (ran >= timeout).then_some(ran)
    }

    /// Queue `q`'s hang timeout ([`TdrConfig::hang_timeout`] of its engine's kind).
    fn hang_timeout(&mut self, q: HwQueueHandle) -> Option<Duration> {
        let engine = self.queue(q.owner(), q).ok()?.engine;
        let kind = self.ddi.adapter_info().engines.get(engine.0 as usize).map(|e| e.kind);
        self.recovery.cfg.hang_timeout(kind)
    }

    /// Fires what is due: every request unanswered for `TdrDelay` starts recovery (an engine
    /// reset for a caller's request, one per engine; a per-queue reset for a hang check);
    /// then the hang timer's scan.
    pub(super) fn handle_recovery_timeout(&mut self, now: Time) {
        let delay = self.recovery.cfg.delay;
        // Requests whose queue is gone or already hung wait for nothing.
        let gone: Vec<u64> = self
            .recovery
            .pending
            .iter()
            .filter(|(_, p)| {
                self.processes
                    .get(&p.queue.owner())
                    .and_then(|pr| pr.queues.get(p.queue).ok())
                    .is_none_or(|q| q.live(p.queue).is_err())
            })
            .map(|(&t, _)| t)
            .collect();
        for t in gone {
            self.recovery.pending.remove(&t);
        }
        // (A migration waits no longer for a queue that went away or hung: see below.)
        let due: Vec<Pending> = self.recovery.pending.values().filter(|p| now >= p.at.plus(delay)).copied().collect();
        let mut engines: Vec<EngineId> = Vec::new();
        for p in due {
            match p.cause {
                Cause::HangCheck => {
                    let fault = FaultKind::PreemptTimeout { waited_ms: now.since(p.at).as_millis() as u64 };
                    self.recover_queue(p, fault, Event::TdrTimeout { queue: p.queue, engine: p.engine }, now);
                }
                Cause::Request | Cause::Migration | Cause::Suspend if !engines.contains(&p.engine) => {
                    engines.push(p.engine);
                    self.recover(p.engine, p.queue, now);
                }
                Cause::Request | Cause::Migration | Cause::Suspend => {}
            }
        }
        // Migrations and teardowns whose queues were recovered or went away proceed.
        self.advance_migrations(now);
        self.settle_preemption_waits();
        if self.recovery.hang_scan_at.is_some_and(|t| now >= t) {
            self.hang_scan(now);
        }
    }

    /// The hang timer's scan (module docs, step 1): a queue with work outstanding whose
    /// progress fence has not moved for its engine's hang timeout, or that has run that long
    /// since it last moved, is asked to preempt ([`Cause::HangCheck`]). A queue the kernel
    /// holds is not watched while held.
    fn hang_scan(&mut self, now: Time) {
        let kinds: Vec<abi::EngineKind> = self.ddi.adapter_info().engines.iter().map(|e| e.kind).collect();
        let cfg = self.recovery.cfg;
        let checking: Vec<HwQueueHandle> = self.recovery.pending.values().map(|p| p.queue).collect();
        let mut suspects = Vec::new();
        let mut any = false;
        let d3 = self.d3;
        let pids: Vec<ProcessId> = self.processes.keys().copied().collect();
        for pid in pids {
            let handles = self.proc(pid).map(|p| p.queues.handles()).unwrap_or_default();
            let suspended: Vec<abi::ContextHandle> = self
                .proc(pid)
                .map(|p| p.contexts.iter().filter(|(_, c)| c.suspended).map(|(h, _)| h).collect())
                .unwrap_or_default();
            for q in handles {
                let submitted = self.last_queued(pid, q);
                let migrating = self.migration_holds(q);
                let Ok(qo) = self.queue(pid, q) else { continue };
                if qo.live(q).is_err() {
                    continue;
                }
                any = true;
                // A queue the kernel holds off its engine (a request, a migration, its context
                // suspended, D3) makes no progress because it is held, not because it hangs:
                // it is not watched, and its period starts over once it is released. (One
                // that still owes the hold's answer is running, and TDR times the answer.)
                if d3 || migrating || qo.held || suspended.contains(&qo.context) {
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
                let run = self.ddi.queue_run_time(q);
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
        }
        for (q, engine) in suspects {
            let _ = self.request_preemption(q, engine, Cause::HangCheck, now);
        }
        self.recovery.hang_scan_at = if any { self.recovery.hang_period().map(|p| now.plus(p)) } else { None };
    }

    /// The hang timer's per-queue reset (amdgpu; module docs, step 2), traced as `event`: its
    /// check went unanswered ([`FaultKind::PreemptTimeout`]), or was answered by a queue that
    /// ran its timeout without progress ([`FaultKind::HangTimeout`]). The queue hangs with
    /// `kind`; a failed or refused reset escalates to an adapter reset.
    fn recover_queue(&mut self, p: Pending, kind: FaultKind, event: Event, now: Time) {
        self.at(now);
        self.recovery.pending.retain(|_, x| x.queue != p.queue);
        self.trace.push(now, event);
        let pid = p.queue.owner();
        let submitted = self.last_queued(pid, p.queue);
        let completed = self.queue(pid, p.queue).map_or(0, |q| q.completed());
        let done = match self.ddi.reset_queue(p.queue, kind.clone(), now) {
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
        self.trace.push(now, Event::DdiTimeout { ddi, took_ms: took.as_millis() as u64 });
        true
    }

    fn driver_bug(&mut self, q: HwQueueHandle, aborted: u64, completed: u64, submitted: u64, now: Time) {
        let what = format!("reset reported fence ID {aborted} aborted on {q}, outside [{completed}, {submitted}]");
        self.trace.push(now, Event::DriverBug { what });
    }

    /// Recovers `engine`, on which `queue`'s preemption went unanswered (module docs).
    fn recover(&mut self, engine: EngineId, queue: HwQueueHandle, now: Time) {
        self.at(now);
        self.trace.push(now, Event::TdrTimeout { queue, engine });
        // 1. The fence IDs (progress values) each queue on the engine submitted and completed.
        let snapshot = self.progress_snapshot(Some(engine));
        let engine_done = self.recovery.cfg.engine_reset && self.reset_engine(engine, &snapshot, now);
        if !engine_done {
            self.reset_adapter(now);
        }
        self.count_recovery(engine_done.then_some(engine), now);
    }

    /// `[(process, queue, submitted, completed)]` for every queue (on `engine`, if given).
    fn progress_snapshot(&mut self, engine: Option<EngineId>) -> Vec<(ProcessId, HwQueueHandle, u64, u64)> {
        let mut out = Vec::new();
        let pids: Vec<ProcessId> = self.processes.keys().copied().collect();
        for pid in pids {
            let Ok(p) = self.proc(pid) else { continue };
            let queues: Vec<(HwQueueHandle, u64)> = p
                .queues
                .iter()
                .filter(|(_, q)| engine.is_none_or(|e| q.engine == e))
                .map(|(h, q)| (h, q.completed()))
                .collect();
            for (h, completed) in queues {
                let submitted = self.last_queued(pid, h);
                out.push((pid, h, submitted, completed));
            }
        }
        out
    }

    /// 2–3: the engine reset. Returns `false` if it failed or its report was refused (the
    /// caller then resets the adapter).
    fn reset_engine(&mut self, engine: EngineId, snapshot: &[(ProcessId, HwQueueHandle, u64, u64)], now: Time) -> bool {
        let Ok(outcome) = self.ddi.reset_engine(engine, now) else { return false };
        if self.ddi_too_slow(DdiKind::ResetEngine, outcome.took, now) {
            return false;
        }
        // Every guilty queue's last aborted fence ID lies in what it submitted and had not
        // completed; anything else is a driver bug, never trusted.
        for &(q, aborted) in &outcome.guilty {
            let (submitted, completed) = snapshot.iter().find(|s| s.1 == q).map_or((0, u64::MAX), |s| (s.2, s.3));
            if !(completed <= aborted && aborted <= submitted) {
                self.driver_bug(q, aborted, completed, submitted, now);
                return false;
            }
        }
        for (q, _) in outcome.guilty {
            let Some(&(pid, ..)) = snapshot.iter().find(|s| s.1 == q) else { continue };
            let waited =
                self.recovery.pending.values().find(|p| p.queue == q).map_or(0, |p| now.since(p.at).as_millis());
            self.recovery.pending.retain(|_, p| p.queue != q);
            let fault = FaultRecord {
                kind: FaultKind::PreemptTimeout { waited_ms: waited as u64 },
                rptr: 0,
                opcode: None,
                in_indirect: false,
            };
            self.fault_queue(pid, q, fault, now);
            if let Some(device) = self.device_of(pid, q) {
                let _ = self.mark_device_error(pid, device, now);
            }
        }
        true
    }

    /// 4: the adapter reset: every queue's state is lost, every device with it.
    fn reset_adapter(&mut self, now: Time) {
        let _ = self.ddi.reset_from_timeout(now);
        self.recovery.adapter_resets += 1;
        // The reset does not preserve local memory (VRAM lost): its contents are gone, and
        // every queue created before reports it.
        for p in self.processes.values() {
            for (_, a) in p.allocations.iter() {
                if a.domain == abi::port::MemoryDomain::Local {
                    let _ = a.shm.fill_u32(0, a.shm.len() as u64 & !3, 0);
                }
            }
        }
        let _ = self.ddi.restart_from_timeout();
        self.recovery.pending.clear();
        self.lose_every_device(now);
    }

    fn lose_every_device(&mut self, now: Time) {
        let pids: Vec<ProcessId> = self.processes.keys().copied().collect();
        for pid in pids {
            let devices = self.proc(pid).map(|p| p.devices.handles()).unwrap_or_default();
            for d in devices {
                let _ = self.device_lost(pid, d, now);
            }
        }
    }

    /// Counts a recovery; past the limit, the adapter is lost for good.
    fn count_recovery(&mut self, engine: Option<EngineId>, now: Time) {
        let window = self.recovery.cfg.limit_time;
        let r = &mut self.recovery;
        r.recoveries += 1;
        r.recent.push_back(now);
        while r.recent.front().is_some_and(|&t| now.since(t) >= window) {
            r.recent.pop_front();
        }
        let count = r.recent.len() as u32;
        self.trace.push(now, Event::Recovered { engine, count });
        if count > self.recovery.cfg.limit_count && self.recovery.fatal.is_none() {
            self.trace.push(now, Event::AdapterFatal);
            self.recovery.fatal =
                Some(KernelError::AdapterLost { recoveries: count, window_ms: window.as_millis() as u64 });
            self.recovery.pending.clear();
            // Lost for good, the adapter is stopped (`DxgkDdiResetFromTimeout`, with no
            // restart) before its devices are lost: a context suspension only asks, and a
            // queue inside a kernel its engine cannot preempt would go on running what was
            // published before the loss, which its client was told is lost.
            let _ = self.ddi.reset_from_timeout(now);
            self.lose_every_device(now);
        }
    }

    /// A lost device's queue that still runs is reset through the scheduling firmware
    /// ([`Kmd::reset_queue`], [`FaultKind::DeviceLost`]), which takes it off its slot now and
    /// answers what it owed. A reset that fails or answers too late escalates to the adapter,
    /// as the hang timer's does, and counts as a recovery.
    fn stop_lost_queue(&mut self, q: HwQueueHandle, now: Time) {
        let stopped = match self.ddi.reset_queue(q, FaultKind::DeviceLost, now) {
            Ok(out) => !self.ddi_too_slow(DdiKind::ResetQueue, out.took, now),
            Err(_) => false,
        };
        if stopped {
            self.recovery.pending.retain(|_, p| p.queue != q);
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
    /// re-creating them"): see the module docs. Idempotent.
    pub fn device_lost(&mut self, pid: ProcessId, device: DeviceHandle, now: Time) -> Result<(), KernelError> {
        self.at(now);
        let already = self.proc(pid)?.devices.get(device)?.error;
        if !already {
            self.trace.push(now, Event::DeviceLost { device });
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
            for q in self.context_queues(pid, c)? {
                if self.queue(pid, q)?.live(q).is_err() {
                    continue;
                }
                if !suspended || self.recovery.pending.values().any(|p| p.queue == q) {
                    self.stop_lost_queue(q, now);
                }
                let fault = FaultRecord { kind: FaultKind::DeviceLost, rptr: 0, opcode: None, in_indirect: false };
                self.set_state(pid, q, QueueLife::Hung(fault));
                let waiters = std::mem::take(&mut self.queue(pid, q)?.waiters);
                for (_, w) in waiters {
                    self.complete_wait(w, Err(lost.clone()));
                }
                self.drop_km_submissions(pid, c, q);
                let _ = self.disconnect(pid, q, DoorbellStatus::DisconnectedAbort, now);
            }
        }
        Ok(())
    }
}
