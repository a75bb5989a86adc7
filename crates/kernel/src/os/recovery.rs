//! Preemption requests, timeout detection and recovery (TDR), and device lost (spec 003; spec
//! 000's device-lost paragraph): the state is [`Recovery`]'s (the requests in flight, the
//! settings, the recovery count and the adapter's fate); the sequences are the OS's — a TDR
//! reads top to bottom in `calls/tdr.rs`, the hang timer in `calls/hang.rs`, requests and
//! answers in `calls/preempt.rs`.
//!
//! **Preemption.** [`super::Os::preempt_queue`] asks the KMD to take a queue off its slot
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
//! 3. each guilty queue is hung and reported (doorbell `DisconnectedAbort`, its status), and
//!    its device is lost whole, as Windows puts it in error (its fences AlwaysSignaled, its
//!    other queues stopped and hung with `DeviceLost`: one left running would signal those
//!    fences back down); every other device's queue on the engine was preempted with its
//!    state saved and keeps its work;
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
//! **The engine watchdog** (spec 000: "Dxgkrnl monitors whether a GPU engine is making
//! progress using TDR timeout cadence"). The two mechanisms above start from a request: the
//! OS's own, or the hang timer's, which may be off. Without either, a queue that holds a
//! hardware slot inside work its engine cannot preempt (a `WAIT` under `none` granularity,
//! say) while the queue it waits for waits for that slot would stall the engine for good, and
//! the firmware's own quantum cannot take the slot back. So every `TdrDelay` the OS looks at
//! each engine: one whose queues' completed progress values have not moved since the last
//! look, while a queue with work that the kernel does not hold waits for a slot, is stalled,
//! and each queue with work in its slots is asked to preempt ([`Cause::Watchdog`]). An answer
//! lets it run on at once (it is released, as after a hang check); no answer within
//! `TdrDelay` is a TDR of the engine, as for any request. An engine that is busy without
//! contention (one long kernel, nobody waiting) is never asked: only a queue that keeps
//! another from running is.
//!
//! **Device lost** ([`super::Os::device_lost`]): the device's fences become AlwaysSignaled and their
//! CPU waits fail with `DeviceLost`; each of its queues is stopped (its context suspended, and
//! a queue that does not stop at once, inside work its engine cannot preempt, reset through
//! the firmware; a reset that fails resets the adapter) and hung, its progress waits fail with
//! `DeviceLost`, and its doorbell is disconnected with `DisconnectedAbort`, which tells the UMD
//! to destroy and recreate queue, doorbell and ring.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use abi::port::KernelError;
use abi::{EngineId, HwQueueHandle, ProcessId, Time};

use super::shared::{Shared, invalid};
use super::timers::{Timer, TimerTable};
use super::waits::WaitId;

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
    pub(super) fn hang_timeout(&self, kind: Option<abi::EngineKind>) -> Option<Duration> {
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

/// How many answers [`super::Os::preempt_answer`] remembers.
const ANSWERS_KEPT: usize = 4096;

/// A preemption request the OS has not heard back from.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pending {
    pub(super) queue: HwQueueHandle,
    pub(super) engine: EngineId,
    pub(super) at: Time,
    /// Why it was asked for.
    pub(super) cause: Cause,
}

/// Why the OS asked for a preemption.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Cause {
    /// A caller of [`super::Os::preempt_queue`]: the queue stays off the run list until resumed; no
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
    /// The engine watchdog: the queue holds a slot of an engine that made no progress for a
    /// `TdrDelay` while another queue waited for a slot. An answer resumes it at once; no
    /// answer in time means an engine reset, as for a request.
    Watchdog,
}

/// The OS's recovery state: the preemption requests in flight (which set [`Timer::Tdr`]),
/// the TDR settings, the recoveries counted against the limit, the answers heard, and
/// whether the adapter is lost for good.
#[derive(Default)]
pub(super) struct Recovery {
    pub(super) cfg: TdrConfig,
    /// Requests not answered yet, by ticket.
    pending: BTreeMap<u64, Pending>,
    /// When recent recoveries happened (within `limit_time`).
    recent: VecDeque<Time>,
    /// Set once the recovery limit was exceeded: the adapter is lost for good.
    fatal: Option<KernelError>,
    /// Answers heard.
    answered: u64,
    /// The latest answers: (ticket, latency in ns), at most [`ANSWERS_KEPT`].
    answers: VecDeque<(u64, u64)>,
    /// Recoveries done.
    recoveries: u64,
    /// Adapter resets so far (a queue created before the last one reports VRAM lost).
    pub(super) adapter_resets: u64,
    /// Teardowns waiting for every answer their process's queues owe
    /// ([`super::Os::begin_preemption_wait`]).
    settling: Vec<(ProcessId, WaitId)>,
    /// The engine watchdog's last look: for each engine that had a queue with work the kernel
    /// does not hold then, the sum of its queues' completed progress values.
    pub(super) watched: BTreeMap<EngineId, u64>,
}

impl Recovery {
    /// Takes new settings: the hang timer's scans and the engine watchdog's looks stop until a
    /// queue is created, and the requests in flight time out after the new `TdrDelay`.
    pub(super) fn set_cfg(&mut self, cfg: TdrConfig, timers: &mut TimerTable) {
        self.cfg = cfg;
        timers.set(Timer::HangScan, None);
        timers.set(Timer::EngineWatch, None);
        self.watched.clear();
        self.rearm(timers);
    }

    /// `Ok` unless the adapter is lost for good.
    pub(super) fn adapter_alive(&self) -> Result<(), KernelError> {
        self.fatal.clone().map_or(Ok(()), Err)
    }

    /// [`Timer::Tdr`]: `TdrDelay` after the oldest request in flight.
    fn rearm(&self, timers: &mut TimerTable) {
        let oldest = self.pending.values().map(|p| p.at).min();
        timers.set(Timer::Tdr, oldest.map(|t| t.plus(self.cfg.delay)));
    }

    /// Request `ticket` is in flight.
    pub(super) fn insert(&mut self, ticket: u64, p: Pending, timers: &mut TimerTable) {
        self.pending.insert(ticket, p);
        self.rearm(timers);
    }

    /// Request `ticket`, answered: no longer in flight.
    pub(super) fn take(&mut self, ticket: u64, timers: &mut TimerTable) -> Option<Pending> {
        let p = self.pending.remove(&ticket);
        self.rearm(timers);
        p
    }

    /// Forgets every request of queue `q` (recovered, resumed or gone): no answer is awaited.
    pub(super) fn forget_queue(&mut self, q: HwQueueHandle, timers: &mut TimerTable) {
        self.forget(|p| p.queue == q, timers);
    }

    /// Forgets every request that `gone` says waits for nothing.
    pub(super) fn forget(&mut self, gone: impl Fn(&Pending) -> bool, timers: &mut TimerTable) {
        self.pending.retain(|_, p| !gone(p));
        self.rearm(timers);
    }

    /// Whether queue `q` owes an answer.
    pub(super) fn owes(&self, q: HwQueueHandle) -> bool {
        self.pending.values().any(|p| p.queue == q)
    }

    /// The request queue `q` owes an answer to, if any.
    pub(super) fn request_of(&self, q: HwQueueHandle) -> Option<&Pending> {
        self.pending.values().find(|p| p.queue == q)
    }

    /// The queues that owe an answer.
    pub(super) fn owing(&self) -> Vec<HwQueueHandle> {
        self.pending.values().map(|p| p.queue).collect()
    }

    /// The requests unanswered for `TdrDelay` at `now`.
    pub(super) fn overdue(&self, now: Time) -> Vec<Pending> {
        let delay = self.cfg.delay;
        self.pending.values().filter(|p| now >= p.at.plus(delay)).copied().collect()
    }

    /// Records an answer heard, with its latency: the last [`ANSWERS_KEPT`] are kept.
    pub(super) fn record_answer(&mut self, ticket: u64, latency_ns: u64) {
        self.answered += 1;
        if self.answers.len() == ANSWERS_KEPT {
            self.answers.pop_front();
        }
        self.answers.push_back((ticket, latency_ns));
    }

    /// The answer to request `ticket`, if it is among the latest kept: its latency (ns).
    pub(super) fn answer(&self, ticket: u64) -> Option<u64> {
        self.answers.iter().rev().find(|a| a.0 == ticket).map(|a| a.1)
    }

    /// Counts a recovery at `now`: how many fall within `TdrLimitTime`, this one included.
    pub(super) fn count(&mut self, now: Time) -> u32 {
        let window = self.cfg.limit_time;
        self.recoveries += 1;
        self.recent.push_back(now);
        while self.recent.front().is_some_and(|&t| now.since(t) >= window) {
            self.recent.pop_front();
        }
        self.recent.len() as u32
    }

    /// Past the limit, once: the adapter is lost for good, and every request is forgotten.
    /// Returns whether this recovery made it fatal.
    pub(super) fn check_limit(&mut self, count: u32, timers: &mut TimerTable) -> bool {
        if count <= self.cfg.limit_count || self.fatal.is_some() {
            return false;
        }
        let window_ms = self.cfg.limit_time.as_millis() as u64;
        self.fatal = Some(KernelError::AdapterLost { recoveries: count, window_ms });
        self.forget(|_| true, timers);
        true
    }

    /// A teardown of `pid` waits (`id`) for every answer its queues owe.
    pub(super) fn settle_later(&mut self, pid: ProcessId, id: WaitId) {
        self.settling.push((pid, id));
    }

    /// The teardown wait `id` ended.
    pub(super) fn stop_settling(&mut self, id: WaitId) {
        self.settling.retain(|&(_, w)| w != id);
    }

    /// Process `pid` ended: its teardown waits went with it.
    pub(super) fn forget_process(&mut self, pid: ProcessId) {
        self.settling.retain(|&(owner, _)| owner != pid);
    }

    /// Whether some request of `pid`'s queues is still owed an answer.
    pub(super) fn owes_for(&self, pid: ProcessId) -> bool {
        self.pending.values().any(|p| p.queue.owner() == pid)
    }

    /// Decides the teardown waits whose process owes no answer any more.
    pub(super) fn settle_waits(&mut self, cx: &mut Shared) {
        if self.settling.is_empty() {
            return;
        }
        let settled: Vec<WaitId> =
            self.settling.iter().filter(|&&(pid, _)| !self.owes_for(pid)).map(|&(_, w)| w).collect();
        self.settling.retain(|(_, w)| !settled.contains(w));
        for w in settled {
            cx.complete_wait(w, Ok(0));
        }
    }

    /// How often the hang timer scans: a quarter of its shortest timeout, so a hang is noticed
    /// within 1.25 timeouts.
    fn hang_period(&self) -> Option<Duration> {
        [self.cfg.hang_compute, self.cfg.hang_copy].into_iter().flatten().min().map(|d| d / 4)
    }

    /// Starts the hang timer's scans if they are not running (a queue was created).
    pub(super) fn arm_hang_scan(&self, now: Time, timers: &mut TimerTable) {
        if timers.get(Timer::HangScan).is_none() {
            timers.set(Timer::HangScan, self.hang_period().map(|p| now.plus(p)));
        }
    }

    /// After a scan at `now`: the next one a period later while there is a queue to watch
    /// (`any`), none otherwise.
    pub(super) fn next_hang_scan(&self, any: bool, now: Time, timers: &mut TimerTable) {
        timers.set(Timer::HangScan, if any { self.hang_period().map(|p| now.plus(p)) } else { None });
    }

    /// Starts the engine watchdog's looks if they are not running (a queue was created).
    pub(super) fn arm_engine_watch(&self, now: Time, timers: &mut TimerTable) {
        if timers.get(Timer::EngineWatch).is_none() {
            timers.set(Timer::EngineWatch, Some(now.plus(self.cfg.delay)));
        }
    }

    /// After a look at `now`: the next one `TdrDelay` later while there is a queue to watch
    /// (`any`), none otherwise.
    pub(super) fn next_engine_watch(&self, any: bool, now: Time, timers: &mut TimerTable) {
        timers.set(Timer::EngineWatch, any.then(|| now.plus(self.cfg.delay)));
    }
}
