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
//! - [`Traced`] wraps any `Kmd`, records every DDI call in the kernel's trace ([`crate::trace::SharedTrace`]) before making
//!   it, and can fail chosen calls on purpose ([`DdiFault`]) so the OS's error paths are
//!   tested.

use std::sync::Arc;
use std::time::Duration;

use abi::doorbell::RingMethod;
use abi::port::{AdapterInfo, DeviceRefusal, Invalid, KernelError};
use abi::queue::{Access, FaultKind, FaultRecord};
use abi::{ContextHandle, EngineId, EngineState, HwQueueHandle, PowerState, Priority, ProcessId, QueueState, Time};
use shm::{Shm, Word};

use crate::trace::{Ddi, Event, SharedTrace};

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

/// The DDIs that can fail, for fault injection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DdiKind {
    /// [`Kmd::create_address_space`].
    CreateAddressSpace,
    /// [`Kmd::map_gpu`].
    MapGpu,
    /// [`Kmd::create_hw_queue`].
    CreateHwQueue,
    /// [`Kmd::connect_doorbell`].
    ConnectDoorbell,
    /// [`Kmd::connect_kernel_doorbell`].
    ConnectKernelDoorbell,
    /// [`Kmd::submit_command`].
    SubmitCommand,
    /// [`Kmd::take_back`].
    TakeBack,
    /// [`Kmd::create_native_fence`].
    CreateNativeFence,
    /// [`Kmd::reset_engine`] (a failed engine reset escalates to an adapter reset).
    ResetEngine,
    /// [`Kmd::preempt_queue`] (a failed request starts recovery at once).
    PreemptQueue,
    /// [`Kmd::reset_queue`] (a failed per-queue reset escalates to an adapter reset).
    ResetQueue,
    /// [`Kmd::migrate_allocation`] (a failed move leaves the buffer unmapped).
    MigrateAllocation,
    /// [`Kmd::set_native_fence_log_buffer`] (a log that cannot be replaced keeps the old one).
    SetNativeFenceLogBuffer,
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

/// The DDIs the OS calls.
pub trait Kmd: Send {
    /// `DxgkDdiQueryAdapterInfo`: engines and doorbell caps.
    fn adapter_info(&self) -> AdapterInfo;
    /// The doorbell BAR (the OS maps pages of it into processes).
    fn doorbell_bar(&self) -> Arc<Shm>;
    /// Creates the GPU address space of a process.
    fn create_address_space(&mut self, process: ProcessId) -> Result<(), DdiError>;
    /// Destroys it (with whatever is still mapped).
    fn destroy_address_space(&mut self, process: ProcessId) -> Result<(), DdiError>;
    /// Maps `shm` at `va` in a process's address space, until the mapping is dropped.
    fn map_gpu(
        &mut self,
        process: ProcessId,
        va: u64,
        bytes: u64,
        shm: Arc<Shm>,
        writable: bool,
    ) -> Result<GpuMapping, DdiError>;
    /// Whether the GPU could make `access` to `[va, va+bytes)`: inside one mapping, and
    /// writable for a write.
    fn vm_access(&self, process: ProcessId, va: u64, bytes: u64, access: Access) -> Result<(), FaultKind>;
    /// `DxgkDdiCreateHwQueue`: the device adds the queue to its run list. The KMD allocates
    /// what is its own business (the context save area).
    fn create_hw_queue(&mut self, queue: HwQueueHandle, desc: QueueCreate) -> Result<(), DdiError>;
    /// `DxgkDdiDestroyHwQueue`.
    fn destroy_hw_queue(&mut self, queue: HwQueueHandle) -> Result<(), DdiError>;
    /// `DxgkDdiConnectDoorbell` for a user-mode queue whose doorbell index in the process's
    /// page `process_page` is `index`. With a limited pool and no free physical doorbell, the
    /// KMD first victimizes one through `callback`.
    fn connect_doorbell(
        &mut self,
        queue: HwQueueHandle,
        process_page: u32,
        index: u32,
        callback: &mut dyn DisconnectCallback,
    ) -> Result<ConnectStep, DdiError>;
    /// Connects a kernel-mode queue's doorbell (kernel doorbell `index` of BAR page 0).
    fn connect_kernel_doorbell(&mut self, queue: HwQueueHandle, index: u32) -> Result<(), DdiError>;
    /// `DxgkDdiSubmitCommand`: the kernel-mode queue's wptr was published as `wptr`; ring its
    /// doorbell.
    fn submit_command(&mut self, queue: HwQueueHandle, wptr: u64, fence_id: u64) -> Result<(), DdiError>;
    /// Where a user-mode queue with doorbell index `index` rings inside its doorbell CPU page,
    /// and how.
    fn doorbell_ring(&self, index: u32) -> (u64, RingMethod);
    /// Where queues of `engine` ring their process's aggregated doorbell page, when the
    /// device needs one: the engine's word's offset, and what the CPU ORs into it.
    fn aggregated_doorbell(&self, engine: EngineId) -> Option<(u64, u64)>;
    /// The device starts watching BAR page `page` as a process's aggregated doorbell.
    fn watch_aggregated_page(&mut self, page: u32) -> Result<(), DdiError>;
    /// It stops.
    fn unwatch_aggregated_page(&mut self, page: u32);
    /// BAR pages not for processes (the KMD's physical doorbell pool).
    fn reserved_doorbell_pages(&self) -> std::ops::Range<u32>;
    /// `DxgkDdiDisconnectDoorbell`.
    fn disconnect_doorbell(&mut self, queue: HwQueueHandle) -> Result<(), DdiError>;
    /// `DxgkDdiNotifyWorkSubmission`.
    fn notify_work_submission(&mut self, queue: HwQueueHandle) -> Result<(), DdiError>;
    /// `DxgkDdiUpdateMonitoredValues` for a queue's progress fence.
    fn update_monitored(&mut self, queue: HwQueueHandle, value: u64) -> Result<(), DdiError>;
    /// `DxgkDdiSetPowerComponentFState`. Returns the state the engine is in afterwards (the
    /// device refuses F1 while work is pending).
    fn set_power(&mut self, engine: EngineId, state: PowerState, now: Time) -> Result<PowerState, DdiError>;
    /// `DxgkDdiCreateNativeFence`: where the fence's CurrentValue and MonitoredValue live,
    /// and the id its notifications name.
    fn create_native_fence(&mut self, id: u64, current: (Arc<Shm>, u64), monitored: Word) -> Result<(), DdiError>;
    /// `DxgkDdiDestroyNativeFence`.
    fn destroy_native_fence(&mut self, id: u64);
    /// `DxgkDdiUpdateCurrentValuesFromCpu`: store a fence's CurrentValue and have the queues
    /// waiting on it re-check.
    fn update_current_value(&mut self, id: u64, value: u64) -> Result<(), DdiError>;
    /// `DxgkDdiUpdateCurrentValuesFromCpu` with `NotificationOnly`: a shared CurrentValue
    /// moved on another adapter; queues waiting on fences re-check.
    fn notify_current_values(&mut self);
    /// `DxgkddiSuspendContext`: take the context's queues off the scheduler's list ("KMD
    /// preempts the context"), each queue by a preemption request: one that holds no slot or
    /// may stop where it stands is answered at once; one that may not (its engine's
    /// preemption granularity) runs on to the next point it may, and its answer is owed, as a
    /// [`Notification::Preempted`], which the OS times out like any other request.
    fn suspend_context(
        &mut self,
        context: ContextHandle,
        queues: &[HwQueueHandle],
        now: Time,
    ) -> Result<Vec<Suspended>, DdiError>;
    /// `DxgkddiResumeContext`: put them back.
    fn resume_context(&mut self, context: ContextHandle, queues: &[HwQueueHandle]) -> Result<(), DdiError>;
    /// `DxgkDdiUpdateNativeFenceLogs`: make the queue's pending log writes visible.
    fn flush_fence_logs(&mut self, queue: HwQueueHandle);
    /// The next interrupt the device raised, translated (the ISR drains these).
    fn poll_notification(&mut self) -> Option<Notification>;
    /// Current engine power state.
    fn power(&self, engine: EngineId) -> PowerState;
    /// Whether the queue has work the engine has not finished.
    fn queue_has_work(&self, queue: HwQueueHandle) -> bool;
    /// The device's view of a queue.
    fn queue_state(&self, queue: HwQueueHandle) -> Option<QueueState>;
    /// GPU mappings alive on the device (for leak checks).
    fn live_mappings(&self) -> usize;
    /// The physical doorbell the device has the queue bound to now (read-only, for the OS's
    /// doorbell query).
    fn physical_doorbell(&self, queue: HwQueueHandle) -> Option<abi::port::PhysicalDoorbell>;
    /// `DxgkDdiPreemptCommand` (amdgpu MES `SUSPEND`): asks the engine to take `queue` off its
    /// slot at the next point its preemption granularity allows, state saved, and to keep it
    /// off the run list until resumed. Returns the request's ticket; the answer is a
    /// [`Notification::Preempted`] (raised at once when the queue can stop where it stands).
    fn preempt_queue(&mut self, queue: HwQueueHandle, now: Time) -> Result<u64, DdiError>;
    /// `DxgkDdiResetEngine`: resets one engine. The queues that owe an answer to a preemption
    /// request hang; every other queue there keeps its work.
    fn reset_engine(&mut self, engine: EngineId, now: Time) -> Result<EngineResetOutcome, DdiError>;
    /// amdgpu's per-queue reset (through the scheduling firmware): `queue` hangs with `why`
    /// (the OS's reason: a preemption it would not answer, or the hang timer), its neighbours
    /// are not touched. Returns the last progress value ("fence ID") the reset aborted.
    fn reset_queue(&mut self, queue: HwQueueHandle, why: FaultKind, now: Time) -> Result<QueueResetOutcome, DdiError>;
    /// The device time `queue` has spent executing its work in a hardware slot, in all (it
    /// only grows): not the time it waited for a slot, was held off one, or only re-checked a
    /// `WAIT` that did not pass. The OS's hang timer takes differences of it. `None`: the
    /// device does not say, and the hang timer catches only a queue that does not answer its
    /// preemption request.
    fn queue_run_time(&self, _queue: HwQueueHandle) -> Option<Duration> {
        None
    }
    /// Moves the allocation at `[va, va + bytes)` of `process` to `domain`, updates the GPU
    /// page tables and invalidates the TLB (spec 001 migration, step 2; Windows' paging
    /// operation). The caller has preempted every queue of the process.
    fn migrate_allocation(
        &mut self,
        process: ProcessId,
        va: u64,
        bytes: u64,
        domain: abi::port::MemoryDomain,
    ) -> Result<(), DdiError>;
    /// `DxgkDdiResetFromTimeout`: resets the adapter; every queue's state is lost. Returns the
    /// queues that hung.
    fn reset_from_timeout(&mut self, now: Time) -> Result<Vec<HwQueueHandle>, DdiError>;
    /// `DxgkDdiRestartFromTimeout`: the adapter runs again after a reset.
    fn restart_from_timeout(&mut self) -> Result<(), DdiError>;
    /// Where a kernel-mode queue held off its engine (an answered preemption) stands in its
    /// ring: what the preemption interrupt's last completed and preempted fence IDs tell the
    /// OS on Windows.
    fn held_position(&self, queue: HwQueueHandle) -> Result<HeldPosition, DdiError>;
    /// Drops a held kernel-mode queue's unstarted work from its hardware queue, down to
    /// `wptr` (spec 003: the OS resubmits the commands a preemption took out of the hardware
    /// queue).
    fn take_back(&mut self, queue: HwQueueHandle, wptr: u64, now: Time) -> Result<(), DdiError>;
    /// `DxgkDdiOpenNativeFence`: process-local handle `local` to the fence with global id `id`
    /// (the creator's own local handle too, for a shared fence). The default keeps nothing.
    fn open_native_fence(&mut self, _id: u64, _local: abi::NativeFenceHandle) -> Result<(), DdiError> {
        Ok(())
    }
    /// `DxgkDdiCloseNativeFence`: the local handle is gone (the global fence may live on).
    fn close_native_fence(&mut self, _local: abi::NativeFenceHandle) {}
    /// `DxgkDdiSetNativeFenceLogBuffer`: the queue's log of `kind` is now `log` (set at queue
    /// creation, and again each time the OS recreates a log).
    fn set_native_fence_log_buffer(
        &mut self,
        _queue: HwQueueHandle,
        _kind: abi::fence_log::FenceLogType,
        _log: Arc<Shm>,
    ) -> Result<(), DdiError> {
        Err(DdiError::Refused {
            field: "log",
            value: "fence log buffer".into(),
            reason: DeviceRefusal::Unsupported("native fence logs"),
        })
    }
    /// `DxgkDdiUpdateMonitoredValues`: a batch of `(fence id, MonitoredValue)`; on return every
    /// CurrentValue a core reads was written by the device after it observed the new values
    /// (`abi::protocol::monitored_barrier`), so the OS resamples.
    fn update_monitored_values(&mut self, _batch: &[(u64, u64)]) -> Result<(), DdiError> {
        Err(DdiError::Refused {
            field: "fences",
            value: "update monitored values".into(),
            reason: DeviceRefusal::Unsupported("native fences"),
        })
    }
    /// Adapter initialization: the KMD queries the OS's features (`IsFeatureEnabled`,
    /// `QueryFeatureInterface`) before it advertises caps. The default ignores them.
    fn query_features(&mut self, _os: &abi::port::OsFeatures) {}
    /// `DXGK_NATIVE_FENCE_CAPS` (with the `DXGK_VIDSCHCAPS` bits). The default: supported as
    /// [`AdapterInfo::native_fences`] says, one cache line per fence, nothing optional.
    fn native_fence_caps(&self) -> abi::port::NativeFenceCaps {
        abi::port::NativeFenceCaps {
            supported: self.adapter_info().native_fences,
            optimized_interrupt: false,
            map_to_gpu_system_process: false,
            current_value_stride: 64,
            monitored_value_stride: 64,
        }
    }
    /// `DxgkDdiCreateNativeFence` with `CurrentValueSystemProcessGpuVa` and
    /// `MonitoredValueSystemProcessGpuVa` (`system`), for a KMD with `MapToGpuSystemProcess`.
    /// The default ignores the VAs.
    fn create_native_fence_in_system_process(
        &mut self,
        id: u64,
        current: (Arc<Shm>, u64),
        monitored: Word,
        _system: (u64, u64),
    ) -> Result<(), DdiError> {
        self.create_native_fence(id, current, monitored)
    }
    /// Reads a 64-bit word through `process`'s GPU address space (the system process
    /// included), as the device would: for tests and tools. `None` where the device could not.
    fn read_gpu_u64(&self, _process: ProcessId, _va: u64) -> Option<u64> {
        None
    }
    /// `D3DKMDT_FENCESTORAGESURFACEDATA` (spec 002 "DDI to support placement of native fence
    /// values in local memory"): the memory segments a fence of `kind` keeps its CurrentValue
    /// and MonitoredValue in. The default: system memory for both.
    fn native_fence_storage(
        &self,
        _kind: abi::port::NativeFenceType,
    ) -> (abi::port::MemoryDomain, abi::port::MemoryDomain) {
        (abi::port::MemoryDomain::System, abi::port::MemoryDomain::System)
    }
    /// Maps the process's doorbell BAR page `page` into its own GPU address space at `va`, so
    /// its queues can ring each other's doorbells from the GPU (spec 001). Refused where a
    /// GPU store cannot ring a doorbell (the default).
    fn map_doorbell_page(&mut self, _process: ProcessId, _va: u64, _page: u32) -> Result<GpuMapping, DdiError> {
        Err(DdiError::Refused {
            field: "page",
            value: "doorbell page".into(),
            reason: DeviceRefusal::Unsupported("doorbells rung from the GPU"),
        })
    }
    /// Maps the process's aggregated doorbell page (BAR page `page`) into its own GPU address
    /// space at `va` (spec 001: "the kernel driver will map a page of aggregated doorbell space
    /// into each GPUVM space"), so a queue that submits to another from the GPU rings it as
    /// the CPU would. Refused where a GPU store cannot ring it (the default).
    fn map_aggregated_page(&mut self, _process: ProcessId, _va: u64, _page: u32) -> Result<GpuMapping, DdiError> {
        Err(DdiError::Refused {
            field: "page",
            value: "aggregated doorbell page".into(),
            reason: DeviceRefusal::Unsupported("aggregated doorbells rung from the GPU"),
        })
    }
    /// The device's own number for `queue` (the virtual GPU's firmware queue id), for tools
    /// that observe the device directly (the simulator); `None` if the KMD has none.
    fn device_queue_id(&self, _queue: HwQueueHandle) -> Option<u64> {
        None
    }
}

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
}

impl Kmd for Traced {
    fn adapter_info(&self) -> AdapterInfo {
        self.inner.adapter_info()
    }
    fn doorbell_bar(&self) -> Arc<Shm> {
        self.inner.doorbell_bar()
    }
    fn create_address_space(&mut self, process: ProcessId) -> Result<(), DdiError> {
        self.gate(DdiKind::CreateAddressSpace)?;
        self.inner.create_address_space(process)
    }
    fn destroy_address_space(&mut self, process: ProcessId) -> Result<(), DdiError> {
        self.inner.destroy_address_space(process)
    }
    fn map_gpu(
        &mut self,
        process: ProcessId,
        va: u64,
        bytes: u64,
        shm: Arc<Shm>,
        writable: bool,
    ) -> Result<GpuMapping, DdiError> {
        self.gate(DdiKind::MapGpu)?;
        self.inner.map_gpu(process, va, bytes, shm, writable)
    }
    fn vm_access(&self, process: ProcessId, va: u64, bytes: u64, access: Access) -> Result<(), FaultKind> {
        self.inner.vm_access(process, va, bytes, access)
    }
    fn create_hw_queue(&mut self, queue: HwQueueHandle, desc: QueueCreate) -> Result<(), DdiError> {
        self.log(Ddi::CreateHwQueue(desc.context));
        self.gate(DdiKind::CreateHwQueue)?;
        self.inner.create_hw_queue(queue, desc)
    }
    fn destroy_hw_queue(&mut self, queue: HwQueueHandle) -> Result<(), DdiError> {
        self.log(Ddi::DestroyHwQueue(queue));
        self.inner.destroy_hw_queue(queue)
    }
    fn connect_doorbell(
        &mut self,
        queue: HwQueueHandle,
        process_page: u32,
        index: u32,
        callback: &mut dyn DisconnectCallback,
    ) -> Result<ConnectStep, DdiError> {
        self.log(Ddi::ConnectDoorbell(queue));
        self.gate(DdiKind::ConnectDoorbell)?;
        self.inner.connect_doorbell(queue, process_page, index, callback)
    }
    fn connect_kernel_doorbell(&mut self, queue: HwQueueHandle, index: u32) -> Result<(), DdiError> {
        self.log(Ddi::ConnectDoorbell(queue));
        self.gate(DdiKind::ConnectKernelDoorbell)?;
        self.inner.connect_kernel_doorbell(queue, index)
    }
    fn submit_command(&mut self, queue: HwQueueHandle, wptr: u64, fence_id: u64) -> Result<(), DdiError> {
        self.log(Ddi::SubmitCommand { queue, fence_id });
        self.gate(DdiKind::SubmitCommand)?;
        self.inner.submit_command(queue, wptr, fence_id)
    }
    fn doorbell_ring(&self, index: u32) -> (u64, RingMethod) {
        self.inner.doorbell_ring(index)
    }
    fn aggregated_doorbell(&self, engine: EngineId) -> Option<(u64, u64)> {
        self.inner.aggregated_doorbell(engine)
    }
    fn watch_aggregated_page(&mut self, page: u32) -> Result<(), DdiError> {
        self.inner.watch_aggregated_page(page)
    }
    fn unwatch_aggregated_page(&mut self, page: u32) {
        self.inner.unwatch_aggregated_page(page)
    }
    fn reserved_doorbell_pages(&self) -> std::ops::Range<u32> {
        self.inner.reserved_doorbell_pages()
    }
    fn disconnect_doorbell(&mut self, queue: HwQueueHandle) -> Result<(), DdiError> {
        self.log(Ddi::DisconnectDoorbell(queue));
        self.inner.disconnect_doorbell(queue)
    }
    fn notify_work_submission(&mut self, queue: HwQueueHandle) -> Result<(), DdiError> {
        self.log(Ddi::NotifyWorkSubmission(queue));
        self.inner.notify_work_submission(queue)
    }
    fn update_monitored(&mut self, queue: HwQueueHandle, value: u64) -> Result<(), DdiError> {
        self.log(Ddi::UpdateMonitoredValue(queue, value));
        self.inner.update_monitored(queue, value)
    }
    fn set_power(&mut self, engine: EngineId, state: PowerState, now: Time) -> Result<PowerState, DdiError> {
        self.log(Ddi::SetPowerState(engine, state));
        self.inner.set_power(engine, state, now)
    }
    fn create_native_fence(&mut self, id: u64, current: (Arc<Shm>, u64), monitored: Word) -> Result<(), DdiError> {
        self.log(Ddi::CreateNativeFence(id));
        self.gate(DdiKind::CreateNativeFence)?;
        self.inner.create_native_fence(id, current, monitored)
    }
    fn destroy_native_fence(&mut self, id: u64) {
        self.log(Ddi::DestroyNativeFence(id));
        self.inner.destroy_native_fence(id)
    }
    fn update_current_value(&mut self, id: u64, value: u64) -> Result<(), DdiError> {
        // Logged by the OS, which knows the fence's local handle.
        self.inner.update_current_value(id, value)
    }
    fn notify_current_values(&mut self) {
        self.inner.notify_current_values()
    }
    fn suspend_context(
        &mut self,
        context: ContextHandle,
        queues: &[HwQueueHandle],
        now: Time,
    ) -> Result<Vec<Suspended>, DdiError> {
        self.log(Ddi::SuspendContext(context));
        self.inner.suspend_context(context, queues, now)
    }
    fn resume_context(&mut self, context: ContextHandle, queues: &[HwQueueHandle]) -> Result<(), DdiError> {
        self.log(Ddi::ResumeContext(context));
        self.inner.resume_context(context, queues)
    }
    fn flush_fence_logs(&mut self, queue: HwQueueHandle) {
        self.log(Ddi::UpdateNativeFenceLogs(queue));
        self.inner.flush_fence_logs(queue)
    }
    fn poll_notification(&mut self) -> Option<Notification> {
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
    fn power(&self, engine: EngineId) -> PowerState {
        self.inner.power(engine)
    }
    fn queue_has_work(&self, queue: HwQueueHandle) -> bool {
        self.inner.queue_has_work(queue)
    }
    fn queue_run_time(&self, queue: HwQueueHandle) -> Option<Duration> {
        self.inner.queue_run_time(queue)
    }
    fn queue_state(&self, queue: HwQueueHandle) -> Option<QueueState> {
        self.inner.queue_state(queue)
    }
    fn live_mappings(&self) -> usize {
        self.inner.live_mappings()
    }
    fn physical_doorbell(&self, queue: HwQueueHandle) -> Option<abi::port::PhysicalDoorbell> {
        self.inner.physical_doorbell(queue)
    }
    fn preempt_queue(&mut self, queue: HwQueueHandle, now: Time) -> Result<u64, DdiError> {
        self.log(Ddi::PreemptQueue(queue));
        self.gate(DdiKind::PreemptQueue)?;
        self.inner.preempt_queue(queue, now)
    }
    fn reset_engine(&mut self, engine: EngineId, now: Time) -> Result<EngineResetOutcome, DdiError> {
        self.log(Ddi::ResetEngine(engine));
        self.gate(DdiKind::ResetEngine)?;
        let mut out = self.inner.reset_engine(engine, now)?;
        match self.misbehaviour(DdiKind::ResetEngine) {
            Some(Misbehaviour::BogusFenceId) => out.guilty.iter_mut().for_each(|g| g.1 += BOGUS_FENCE_OFFSET),
            Some(Misbehaviour::Slow(d)) => out.took += d,
            None => {}
        }
        Ok(out)
    }
    fn reset_queue(&mut self, queue: HwQueueHandle, why: FaultKind, now: Time) -> Result<QueueResetOutcome, DdiError> {
        self.log(Ddi::ResetQueue(queue));
        self.gate(DdiKind::ResetQueue)?;
        let mut out = self.inner.reset_queue(queue, why, now)?;
        match self.misbehaviour(DdiKind::ResetQueue) {
            Some(Misbehaviour::BogusFenceId) => out.aborted += BOGUS_FENCE_OFFSET,
            Some(Misbehaviour::Slow(d)) => out.took += d,
            None => {}
        }
        Ok(out)
    }
    fn migrate_allocation(
        &mut self,
        process: ProcessId,
        va: u64,
        bytes: u64,
        domain: abi::port::MemoryDomain,
    ) -> Result<(), DdiError> {
        self.log(Ddi::MigrateAllocation { va, domain });
        self.gate(DdiKind::MigrateAllocation)?;
        self.inner.migrate_allocation(process, va, bytes, domain)
    }
    fn reset_from_timeout(&mut self, now: Time) -> Result<Vec<HwQueueHandle>, DdiError> {
        self.log(Ddi::ResetFromTimeout);
        self.inner.reset_from_timeout(now)
    }
    fn restart_from_timeout(&mut self) -> Result<(), DdiError> {
        self.log(Ddi::RestartFromTimeout);
        self.inner.restart_from_timeout()
    }
    fn native_fence_storage(
        &self,
        kind: abi::port::NativeFenceType,
    ) -> (abi::port::MemoryDomain, abi::port::MemoryDomain) {
        self.inner.native_fence_storage(kind)
    }
    fn device_queue_id(&self, queue: HwQueueHandle) -> Option<u64> {
        self.inner.device_queue_id(queue)
    }
    fn held_position(&self, queue: HwQueueHandle) -> Result<HeldPosition, DdiError> {
        self.inner.held_position(queue)
    }
    fn take_back(&mut self, queue: HwQueueHandle, wptr: u64, now: Time) -> Result<(), DdiError> {
        self.log(Ddi::TakeBack { queue, wptr });
        self.gate(DdiKind::TakeBack)?;
        self.inner.take_back(queue, wptr, now)
    }
    fn open_native_fence(&mut self, id: u64, local: abi::NativeFenceHandle) -> Result<(), DdiError> {
        self.log(Ddi::OpenNativeFence(local));
        self.inner.open_native_fence(id, local)
    }
    fn close_native_fence(&mut self, local: abi::NativeFenceHandle) {
        self.log(Ddi::CloseNativeFence(local));
        self.inner.close_native_fence(local)
    }
    fn set_native_fence_log_buffer(
        &mut self,
        queue: HwQueueHandle,
        kind: abi::fence_log::FenceLogType,
        log: Arc<Shm>,
    ) -> Result<(), DdiError> {
        self.log(Ddi::SetNativeFenceLogBuffer(queue));
        self.gate(DdiKind::SetNativeFenceLogBuffer)?;
        self.inner.set_native_fence_log_buffer(queue, kind, log)
    }
    fn update_monitored_values(&mut self, batch: &[(u64, u64)]) -> Result<(), DdiError> {
        // Logged by the OS, which knows each fence's local handle.
        self.inner.update_monitored_values(batch)
    }
    fn query_features(&mut self, os: &abi::port::OsFeatures) {
        self.inner.query_features(os)
    }
    fn native_fence_caps(&self) -> abi::port::NativeFenceCaps {
        self.inner.native_fence_caps()
    }
    fn create_native_fence_in_system_process(
        &mut self,
        id: u64,
        current: (Arc<Shm>, u64),
        monitored: Word,
        system: (u64, u64),
    ) -> Result<(), DdiError> {
        self.log(Ddi::CreateNativeFence(id));
        self.gate(DdiKind::CreateNativeFence)?;
        self.inner.create_native_fence_in_system_process(id, current, monitored, system)
    }
    fn read_gpu_u64(&self, process: ProcessId, va: u64) -> Option<u64> {
        self.inner.read_gpu_u64(process, va)
    }
    fn map_doorbell_page(&mut self, process: ProcessId, va: u64, page: u32) -> Result<GpuMapping, DdiError> {
        self.inner.map_doorbell_page(process, va, page)
    }
    fn map_aggregated_page(&mut self, process: ProcessId, va: u64, page: u32) -> Result<GpuMapping, DdiError> {
        self.inner.map_aggregated_page(process, va, page)
    }
}
