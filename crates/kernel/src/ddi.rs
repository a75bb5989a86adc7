//! The kernel-mode driver boundary, typed in the kernel's own terms.
//!
//! Spec 000 ("DDIs for user-mode work submission") splits the OS graphics kernel (Dxgkrnl)
//! from the IHV's kernel-mode driver. [`Kmd`] is that split: the OS ([`crate::os`]) owns
//! processes, handles, validation, doorbell objects and policy; it calls these DDIs for
//! everything device-specific. Every argument is an OS type — a queue is the OS's
//! [`HwQueueHandle`] (which names its process), an address space is the [`ProcessId`] that
//! owns it, a fence is its global id, and what the device reports comes back as a
//! [`Notification`] — so a second device is a second implementation of this trait, and the
//! OS never names a type of [`gpu`](../gpu/index.html).
//!
//! Invariants:
//! - A DDI that can fail returns `Result<_, DdiError>`, and the OS acts on the failure (rolls
//!   back what it did, or faults the queue): nothing is discarded on either side.
//! - A GPU mapping is an RAII [`GpuMapping`]: dropping it unmaps, so no error path can leak
//!   one.
//! - [`Traced`] wraps any `Kmd`, records every DDI call in the kernel's trace
//!   ([`crate::trace::SharedTrace`]) before making it, and can fail chosen calls on purpose
//!   ([`DdiFault`]) so the OS's error paths are tested.
//! - The DDIs are declared once, in the DDI table (`crate::ddis`): [`Kmd`], `Traced`'s
//!   forwarding, [`DdiKind`] and the trace's [`crate::trace::Ddi`] records are generated from
//!   it, so a DDI added there is traced and can be failed like the others.

use std::sync::Arc;
use std::time::Duration;

use abi::doorbell::RingMethod;
use abi::port::{AdapterInfo, DeviceRefusal, Invalid, KernelError};
use abi::queue::{Access, FaultKind, FaultRecord};
use abi::{ContextHandle, EngineId, EngineState, HwQueueHandle, PowerState, Priority, ProcessId, QueueState, Time};
use shm::{Shm, Word};

use crate::ddis::{Ddi, ddi_table};
use crate::trace::{Event, SharedTrace};

pub use crate::ddis::DdiKind;

/// Why a DDI failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DdiError {
    /// The device refused an argument.
    #[error("`{field}` = {value}: {reason}")]
    Refused {
        /// The argument.
        field: &'static str,
        /// Its value, as text.
        value: String,
        /// The device's reason, in the kernel's terms.
        reason: DeviceRefusal,
    },
    /// The DDI named a queue the KMD does not know.
    #[error("{0} is not a queue of this device")]
    UnknownQueue(HwQueueHandle),
    /// The DDI named an address space the KMD does not know.
    #[error("{0} has no address space on this device")]
    UnknownAddressSpace(ProcessId),
    /// A fault injected by [`Traced`] for a test.
    #[error("{ddi:?} failed (injected fault, call {call})")]
    Injected {
        /// The DDI.
        ddi: DdiKind,
        /// Which call of it (1-based).
        call: u32,
    },
    /// Shared memory failed.
    #[error("shared memory: {0}")]
    Shm(#[from] shm::ShmError),
}

impl From<DdiError> for KernelError {
    fn from(e: DdiError) -> Self {
        match e {
            DdiError::Refused { field, value, reason } => {
                KernelError::InvalidArgument { field, value, reason: Invalid::Device(reason) }
            }
            DdiError::UnknownQueue(q) => KernelError::InvalidArgument {
                field: "queue",
                value: q.to_string(),
                reason: Invalid::Device(DeviceRefusal::UnknownQueue),
            },
            DdiError::UnknownAddressSpace(p) => KernelError::InvalidArgument {
                field: "process",
                value: p.to_string(),
                reason: Invalid::Device(DeviceRefusal::NoAddressSpace),
            },
            DdiError::Injected { ddi, call } => KernelError::InvalidArgument {
                field: "device",
                value: format!("{ddi:?}"),
                reason: Invalid::Device(DeviceRefusal::Injected { call }),
            },
            DdiError::Shm(e) => KernelError::Shm(e),
        }
    }
}

/// A queue the OS asks the KMD to create (`DxgkDdiCreateHwQueue`; amdgpu's MQD inputs).
#[derive(Clone)]
pub struct QueueCreate {
    /// The owning process (its address space runs the queue).
    pub process: ProcessId,
    /// The context it belongs to.
    pub context: ContextHandle,
    /// Engine.
    pub engine: EngineId,
    /// Ring GPU VA and size (validated by the OS).
    pub ring_va: u64,
    /// Ring size.
    pub ring_bytes: u64,
    /// rptr word GPU VA.
    pub rptr_va: u64,
    /// wptr word GPU VA.
    pub wptr_va: u64,
    /// The last-queued progress value's GPU VA: the device bounds every `PROGRESS_FENCE` by
    /// it (spec 000 has the UMD publish it before the work it covers).
    pub last_queued_va: u64,
    /// The queue's kernel page (progress fence, doorbell status, queue state).
    pub kernel_page: Arc<Shm>,
    /// The fence logs `[waits, signals]` of a user-mode queue
    /// (`DxgkDdiSetNativeFenceLogBuffer`, passed with the queue on this device).
    pub fence_logs: Option<[Arc<Shm>; 2]>,
    /// A kernel-mode queue (may select an address space in `INDIRECT_BUFFER`).
    pub privileged: bool,
    /// The context save area the application allocated (validated by the OS); `None`: the
    /// KMD allocates its own.
    pub context_save: Option<Arc<Shm>>,
    /// Priority.
    pub priority: Priority,
}

/// What `DxgkDdiConnectDoorbell` answered: the doorbell is connected, shown by BAR page
/// `page_offset` at the doorbell's offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectStep {
    /// Byte offset of the BAR page to map at the doorbell's CPU VA.
    pub page_offset: u64,
    /// The KMD wants `NotifyWorkSubmission` after each ring.
    pub notify: bool,
}

/// `DxgkCbDisconnectDoorbell`: the OS's side of a victimization, which the KMD calls from
/// inside [`Kmd::connect_doorbell`] when no physical doorbell is free (spec 000 "Victimizing
/// doorbell pseudocode in KMD"). The OS rotates the victim's doorbell CPU VA to the dummy
/// page and publishes `DisconnectedRetry`; when it returns, the KMD disconnects the victim's
/// physical doorbell and hands it to the new queue.
pub trait DisconnectCallback {
    /// Disconnects `victim`'s doorbell on the OS's side.
    fn disconnect_doorbell(&mut self, victim: HwQueueHandle) -> Result<(), DdiError>;
    /// The KMD tells the OS it has unbound `victim`'s physical doorbell, after
    /// [`DisconnectCallback::disconnect_doorbell`] returned (for the trace: tests assert the
    /// order). The default does nothing.
    fn victim_unbound(&mut self, _victim: HwQueueHandle) {}
}

/// What a `NativeFenceSignaled` notification names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SignaledFences {
    /// These fences (global ids) were signalled.
    Fences(Vec<u64>),
    /// These queues signalled fences and logged them: read their signal logs.
    Queues(Vec<HwQueueHandle>),
    /// No list: scan every fence with a waiter (the spec's NULL array) — native and legacy
    /// monitored fences alike, as with `EvaluateLegacyMonitoredFences` set (hardware that
    /// cannot tell the two interrupts apart).
    All,
    /// The spec's NULL array without `EvaluateLegacyMonitoredFences`: scan every *native*
    /// fence waiter, not the legacy monitored fences' ("By default ... Dxgkrnl only scans all
    /// pending native fence waiters and doesn't scan legacy monitored fence waiters").
    AllNative,
    /// The optimized interrupt with a NULL queue: the GPU could not tell which queue
    /// signalled, so rescan the signal logs of every queue on this engine.
    EngineLogs(EngineId),
}

/// An interrupt, as the KMD reports it to the OS (`DxgkCbNotifyInterrupt`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notification {
    /// A queue faulted and is hung.
    QueueFault {
        /// The queue.
        queue: HwQueueHandle,
        /// What happened.
        fault: FaultRecord,
    },
    /// `DXGK_INTERRUPT_GPU_ENGINE_STATE_CHANGE`.
    EngineStateChange {
        /// The engine.
        engine: EngineId,
        /// The transition.
        state: EngineState,
    },
    /// An `INTERRUPT` packet.
    User {
        /// The queue.
        queue: HwQueueHandle,
        /// The packet's id.
        id: u32,
    },
    /// `DXGK_INTERRUPT_NATIVE_FENCE_SIGNALED`.
    NativeFenceSignaled(SignaledFences),
    /// A progress fence passed the queue's monitored value.
    ProgressFence {
        /// The queue.
        queue: HwQueueHandle,
    },
    /// `DXGK_INTERRUPT_DMA_PREEMPTED`: a preemption request was answered; the queue is off its
    /// slot with its state saved.
    Preempted {
        /// The queue.
        queue: HwQueueHandle,
        /// The request's ticket ([`Kmd::preempt_queue`]).
        ticket: u64,
        /// When it was asked for (device time).
        requested_at: Time,
        /// When the queue stopped (device time).
        answered_at: Time,
    },
    /// A disconnected queue's doorbell was rung from the GPU (another queue of its process
    /// wrote it through the doorbell page mapped in the process's address space): the OS
    /// reconnects it, as the UMD would after reading `DisconnectedRetry`.
    DisconnectedRing {
        /// The queue.
        queue: HwQueueHandle,
    },
}

/// The preemption `DxgkddiSuspendContext` made of one of the context's queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Suspended {
    /// The queue.
    pub queue: HwQueueHandle,
    /// The request's ticket.
    pub ticket: u64,
    /// Answered at once (the queue stood where it may stop, or held no slot); otherwise the
    /// answer is owed, as a [`Notification::Preempted`] with the ticket.
    pub answered: bool,
}

/// What an engine reset did (`DxgkDdiResetEngine`'s output).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineResetOutcome {
    /// The queues that would not yield, now hung, each with the last progress value
    /// ("fence ID") the engine had accepted from it: the last one the reset aborted.
    pub guilty: Vec<(HwQueueHandle, u64)>,
    /// Queues taken off their slots with their state saved; they keep their work.
    pub preempted: Vec<HwQueueHandle>,
    /// How long the reset took, as the KMD measured it: the OS escalates a reset that took
    /// longer than `TdrDdiDelay` as one that never answered.
    pub took: std::time::Duration,
}

/// What a per-queue reset did ([`Kmd::reset_queue`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueResetOutcome {
    /// The last progress value ("fence ID") the engine had accepted from the queue: the last
    /// one the reset aborted.
    pub aborted: u64,
    /// How long the reset took, as the KMD measured it.
    pub took: std::time::Duration,
}

/// A KMD misbehaving on purpose, for tests of what the OS refuses to trust
/// ([`Traced::inject_misbehaviour`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Misbehaviour {
    /// A reset reports an aborted fence ID far outside what the queue submitted.
    BogusFenceId,
    /// A reset takes this much longer than it did (a DDI that does not answer in time).
    Slow(std::time::Duration),
}

/// A GPU mapping; dropping it unmaps (the release the KMD supplied runs once).
pub struct GpuMapping {
    va: u64,
    release: Option<Box<dyn FnOnce() + Send>>,
}

impl GpuMapping {
    /// A mapping at `va` that `release` unmaps.
    pub fn new(va: u64, release: impl FnOnce() + Send + 'static) -> Self {
        GpuMapping { va, release: Some(Box::new(release)) }
    }
    /// Its GPU VA.
    pub fn va(&self) -> u64 {
        self.va
    }
}

impl Drop for GpuMapping {
    fn drop(&mut self) {
        if let Some(r) = self.release.take() {
            r();
        }
    }
}

impl core::fmt::Debug for GpuMapping {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "GpuMapping({:#x})", self.va)
    }
}

// The trait, from the table.
ddi_table!(kmd);

/// Where a queue held off its engine stands in its ring ([`Kmd::held_position`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldPosition {
    /// The top-level packet it resumes at (ring bytes).
    pub rptr: u64,
    /// The last wptr the engine accepted.
    pub wptr: u64,
    /// The packet at `rptr` has started and resumes from saved state.
    pub started: bool,
}

/// A fault to inject: fail call number `call` (1-based, counted from when it was armed) of
/// DDI `ddi`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DdiFault {
    /// The DDI.
    pub ddi: DdiKind,
    /// Which call fails.
    pub call: u32,
}

/// The tracing decorator: every DDI is logged in the kernel's trace (at the time of the OS
/// entry that makes it) before it is forwarded, and armed faults fail chosen calls.
pub struct Traced {
    inner: Box<dyn Kmd>,
    trace: SharedTrace,
    now: Time,
    faults: Vec<(DdiFault, u32)>,
    /// Misbehaviours armed for the next call of a DDI.
    misbehaviours: Vec<(DdiKind, Misbehaviour)>,
    /// Notifications a test injects (delivered before the device's).
    injected: std::collections::VecDeque<Notification>,
    /// The device's next `NativeFenceSignaled` notifications to drop (a test's collapsed
    /// interrupts).
    drop_fence_signals: u32,
}

/// How far outside the submitted range [`Misbehaviour::BogusFenceId`] reports.
const BOGUS_FENCE_OFFSET: u64 = 1 << 40;

impl Traced {
    /// Wraps `inner`, logging into `trace` (which the OS shares).
    pub fn new(inner: Box<dyn Kmd>, trace: SharedTrace) -> Self {
        Traced {
            inner,
            trace,
            now: Time::ZERO,
            faults: Vec::new(),
            misbehaviours: Vec::new(),
            injected: std::collections::VecDeque::new(),
            drop_fence_signals: 0,
        }
    }
    /// Makes the next call of `ddi` (a reset: [`DdiKind::ResetEngine`] or
    /// [`DdiKind::ResetQueue`]) misbehave as `m`.
    pub fn inject_misbehaviour(&mut self, ddi: DdiKind, m: Misbehaviour) {
        self.misbehaviours.push((ddi, m));
    }
    /// Takes the misbehaviour armed for this call of `ddi`, if any.
    fn misbehaviour(&mut self, ddi: DdiKind) -> Option<Misbehaviour> {
        let at = self.misbehaviours.iter().position(|&(d, _)| d == ddi)?;
        Some(self.misbehaviours.remove(at).1)
    }
    /// Test hook: delivers `n` to the OS's next interrupt service, as if the KMD raised it.
    pub fn inject_notification(&mut self, n: Notification) {
        self.injected.push_back(n);
    }
    /// Test hook: the device's next `count` `NativeFenceSignaled` notifications are lost (as
    /// when interrupts are collapsed), so a test can follow with the NULL forms.
    pub fn drop_fence_signals(&mut self, count: u32) {
        self.drop_fence_signals += count;
    }
    /// The time DDI entries are logged at (the current OS entry's `now`).
    pub(crate) fn at(&mut self, now: Time) {
        self.now = now;
    }
    /// Arms a fault.
    pub fn inject(&mut self, fault: DdiFault) {
        self.faults.push((fault, 0));
    }
    fn log(&mut self, ddi: Ddi) {
        self.trace.push(self.now, Event::Ddi(ddi));
    }
    /// Counts a call of `ddi`; fails it if a fault is armed for this call.
    fn gate(&mut self, ddi: DdiKind) -> Result<(), DdiError> {
        let mut hit = None;
        for (f, seen) in &mut self.faults {
            if f.ddi == ddi {
                *seen += 1;
                if *seen == f.call {
                    hit = Some(f.call);
                }
            }
        }
        match hit {
            Some(call) => Err(DdiError::Injected { ddi, call }),
            None => Ok(()),
        }
    }
    /// The device's notifications, after those a test injected, less those a test drops.
    fn poll_with_injections(&mut self) -> Option<Notification> {
        if let Some(n) = self.injected.pop_front() {
            return Some(n);
        }
        loop {
            let n = self.inner.poll_notification()?;
            if self.drop_fence_signals > 0 && matches!(n, Notification::NativeFenceSignaled(_)) {
                self.drop_fence_signals -= 1;
                continue;
            }
            return Some(n);
        }
    }
    /// A reset's outcome, falsified as the misbehaviour armed for its DDI says (if the reset
    /// answered at all).
    fn misbehave<T: Falsifiable>(&mut self, out: Result<T, DdiError>) -> Result<T, DdiError> {
        let mut out = out?;
        if let Some(m) = self.misbehaviour(T::DDI) {
            out.falsify(m);
        }
        Ok(out)
    }
}

/// A reset's outcome that a [`Misbehaviour`] falsifies.
trait Falsifiable {
    /// The DDI that answers it.
    const DDI: DdiKind;
    /// Applies `m`.
    fn falsify(&mut self, m: Misbehaviour);
}

impl Falsifiable for EngineResetOutcome {
    const DDI: DdiKind = DdiKind::ResetEngine;
    fn falsify(&mut self, m: Misbehaviour) {
        match m {
            Misbehaviour::BogusFenceId => self.guilty.iter_mut().for_each(|g| g.1 += BOGUS_FENCE_OFFSET),
            Misbehaviour::Slow(d) => self.took += d,
        }
    }
}

impl Falsifiable for QueueResetOutcome {
    const DDI: DdiKind = DdiKind::ResetQueue;
    fn falsify(&mut self, m: Misbehaviour) {
        match m {
            Misbehaviour::BogusFenceId => self.aborted += BOGUS_FENCE_OFFSET,
            Misbehaviour::Slow(d) => self.took += d,
        }
    }
}

/// A default DDI's refusal: the device does not support `what`.
fn unsupported(field: &'static str, value: &str, what: &'static str) -> DdiError {
    DdiError::Refused { field, value: value.into(), reason: DeviceRefusal::Unsupported(what) }
}

// `Traced` forwards every DDI, recording and gating as the table says.
ddi_table!(traced);
