//! A system call as data: [`Call`] names the call and carries its arguments, [`Reply`] carries
//! what a successful call answers. A call is a value that can be logged, recorded, replayed
//! and sent to another process; every port answers it through one method,
//! [`KernelPort::call`](crate::port::KernelPort::call).
//!
//! A call borrows its slices ([`Cow`]): the typed methods of `KernelPort` build one without a
//! copy, and a call decoded from the daemon's socket owns them.
//!
//! A reply is generic over how it carries shared memory ([`Memory`]); in-process it is
//! [`Local`]. Which reply answers which call is the call's contract, written once in the
//! typed methods; a reply of another kind is [`KernelError::UnexpectedReply`], never a panic.

use std::borrow::Cow;
use std::time::Duration;

use super::adapter::NativeFenceCaps;
use super::error::KernelError;
use super::fence::{NativeFenceDesc, NativeFenceInfo, NativeFenceValues, SyncWait, WaitMode, WaitOutcome, WaitPoint};
use super::memory::{Local, Memory, Translate};
use super::objects::{
    AggregatedDoorbell, AllocationDesc, AllocationInfo, CreateDoorbell, DoorbellInfo, DoorbellPageInfo, HwQueueDesc,
    HwQueueInfo, PhysicalDoorbell, QueueStatus,
};
use crate::handle::{
    AllocationHandle, ContextHandle, DeviceHandle, DoorbellHandle, DoorbellPageHandle, HwQueueHandle, NativeFenceHandle,
};
use crate::queue::EngineId;

/// One system call of a process, with its arguments: one variant per typed method of
/// [`KernelPort`](crate::port::KernelPort), named as the method is, documented there.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call<'a> {
    /// `native_fence_caps`.
    NativeFenceCaps,
    /// `create_device` (`D3DKMTCreateDevice`).
    CreateDevice,
    /// `destroy_device`.
    DestroyDevice(DeviceHandle),
    /// `allocate`.
    Allocate {
        /// The device.
        device: DeviceHandle,
        /// What to allocate.
        desc: AllocationDesc,
    },
    /// `map_allocation` (`D3DKMTLock2`).
    MapAllocation(AllocationHandle),
    /// `free`.
    Free(AllocationHandle),
    /// `create_context`.
    CreateContext {
        /// The device.
        device: DeviceHandle,
        /// The engine.
        engine: EngineId,
    },
    /// `destroy_context`.
    DestroyContext(ContextHandle),
    /// `create_hw_queue` (`D3DKMTCreateHwQueue`, USERQ CREATE).
    CreateHwQueue {
        /// The context.
        context: ContextHandle,
        /// What to create.
        desc: HwQueueDesc,
    },
    /// `destroy_hw_queue`.
    DestroyHwQueue(HwQueueHandle),
    /// `create_doorbell_page`.
    CreateDoorbellPage(DeviceHandle),
    /// `destroy_doorbell_page`.
    DestroyDoorbellPage(DoorbellPageHandle),
    /// `create_doorbell` (`D3DKMTCreateDoorbell`).
    CreateDoorbell(CreateDoorbell),
    /// `connect_doorbell` (`D3DKMTConnectDoorbell`).
    ConnectDoorbell(HwQueueHandle),
    /// `destroy_doorbell` (`D3DKMTDestroyDoorbell`).
    DestroyDoorbell(DoorbellHandle),
    /// `notify_work_submission` (`D3DKMTNotifyWorkSubmission`).
    NotifyWorkSubmission(DoorbellHandle),
    /// `submit_command` (`D3DKMTSubmitCommand`).
    SubmitCommand {
        /// The kernel-mode queue.
        queue: HwQueueHandle,
        /// The packet stream.
        words: Cow<'a, [u32]>,
    },
    /// `wait_progress`: blocks.
    WaitProgress {
        /// The queue.
        queue: HwQueueHandle,
        /// The progress value.
        value: u64,
        /// How long at most (`None`: forever).
        timeout: Option<Duration>,
    },
    /// `query_queue` (`USERQ QUERY_STATUS`).
    QueryQueue(HwQueueHandle),
    /// `create_native_fence` (`D3DKMTCreateNativeFence`).
    CreateNativeFence {
        /// The device.
        device: DeviceHandle,
        /// What to create.
        desc: NativeFenceDesc,
    },
    /// `open_native_fence`.
    OpenNativeFence {
        /// The device.
        device: DeviceHandle,
        /// The fence's global handle.
        global: u64,
    },
    /// `open_cross_adapter_fence`.
    OpenCrossAdapterFence {
        /// The device.
        device: DeviceHandle,
        /// The fence's cross-adapter handle.
        handle: u64,
    },
    /// `destroy_native_fence`.
    DestroyNativeFence(NativeFenceHandle),
    /// `signal_native_fence` (`D3DKMTSignalSynchronizationObjectFromCpu`).
    SignalNativeFence {
        /// The fence.
        fence: NativeFenceHandle,
        /// The value.
        value: u64,
    },
    /// `wait_native_fences` (`D3DKMTWaitForSynchronizationObjectFromCpu`): blocks.
    WaitNativeFences {
        /// Each fence and the value it must reach.
        fences: Cow<'a, [(NativeFenceHandle, u64)]>,
        /// All of them, or any one.
        mode: WaitMode,
        /// How long at most (`None`: forever).
        timeout: Option<Duration>,
    },
    /// `query_native_fence`.
    QueryNativeFence(NativeFenceHandle),
    /// `query_physical_doorbell`.
    QueryPhysicalDoorbell(HwQueueHandle),
    /// `userq_signal` (amdgpu `USERQ_SIGNAL`).
    UserqSignal {
        /// The user-mode queue.
        queue: HwQueueHandle,
        /// The progress point.
        point: u64,
        /// Each fence and the value it is signalled to.
        fences: Cow<'a, [(NativeFenceHandle, u64)]>,
    },
    /// `userq_wait` (amdgpu `USERQ_WAIT`).
    UserqWait {
        /// The user-mode queue.
        queue: HwQueueHandle,
        /// The sync objects.
        objects: Cow<'a, [SyncWait]>,
    },
    /// `open_progress_fence`.
    OpenProgressFence(HwQueueHandle),
}

impl Call<'_> {
    /// The call's name: its typed method's (`"create_device"`), for logs and errors.
    pub fn name(&self) -> &'static str {
        match self {
            Call::NativeFenceCaps => "native_fence_caps",
            Call::CreateDevice => "create_device",
            Call::DestroyDevice(_) => "destroy_device",
            Call::Allocate { .. } => "allocate",
            Call::MapAllocation(_) => "map_allocation",
            Call::Free(_) => "free",
            Call::CreateContext { .. } => "create_context",
            Call::DestroyContext(_) => "destroy_context",
            Call::CreateHwQueue { .. } => "create_hw_queue",
            Call::DestroyHwQueue(_) => "destroy_hw_queue",
            Call::CreateDoorbellPage(_) => "create_doorbell_page",
            Call::DestroyDoorbellPage(_) => "destroy_doorbell_page",
            Call::CreateDoorbell(_) => "create_doorbell",
            Call::ConnectDoorbell(_) => "connect_doorbell",
            Call::DestroyDoorbell(_) => "destroy_doorbell",
            Call::NotifyWorkSubmission(_) => "notify_work_submission",
            Call::SubmitCommand { .. } => "submit_command",
            Call::WaitProgress { .. } => "wait_progress",
            Call::QueryQueue(_) => "query_queue",
            Call::CreateNativeFence { .. } => "create_native_fence",
            Call::OpenNativeFence { .. } => "open_native_fence",
            Call::OpenCrossAdapterFence { .. } => "open_cross_adapter_fence",
            Call::DestroyNativeFence(_) => "destroy_native_fence",
            Call::SignalNativeFence { .. } => "signal_native_fence",
            Call::WaitNativeFences { .. } => "wait_native_fences",
            Call::QueryNativeFence(_) => "query_native_fence",
            Call::QueryPhysicalDoorbell(_) => "query_physical_doorbell",
            Call::UserqSignal { .. } => "userq_signal",
            Call::UserqWait { .. } => "userq_wait",
            Call::OpenProgressFence(_) => "open_progress_fence",
        }
    }

    /// Whether the call may block until the kernel decides it (a CPU wait).
    pub fn is_wait(&self) -> bool {
        matches!(self, Call::WaitProgress { .. } | Call::WaitNativeFences { .. })
    }
}

/// What a successful [`Call`] answers, its shared memory carried as `M` carries it
/// ([`Local`] in-process). Each call has one kind of reply (its typed method unpacks it).
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(
    feature = "serde",
    serde(bound(
        serialize = "M::Mapping: serde::Serialize, M::DoorbellPage: serde::Serialize, \
                     M::AggregatedPage: serde::Serialize, M::Connected: serde::Serialize",
        deserialize = "M::Mapping: serde::Deserialize<'de>, M::DoorbellPage: serde::Deserialize<'de>, \
                       M::AggregatedPage: serde::Deserialize<'de>, M::Connected: serde::Deserialize<'de>"
    ))
)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply<M: Memory = Local> {
    /// Nothing to answer: the destroys, frees, signals and notifications.
    Unit,
    /// `native_fence_caps`.
    NativeFenceCaps(NativeFenceCaps),
    /// `create_device`.
    Device(DeviceHandle),
    /// `allocate`.
    Allocation(AllocationInfo),
    /// `map_allocation`.
    Mapping(M::Mapping),
    /// `create_context`.
    Context(ContextHandle),
    /// `create_hw_queue`.
    HwQueue(HwQueueInfo<M::Mapping>),
    /// `create_doorbell_page`.
    DoorbellPage(DoorbellPageInfo),
    /// `create_doorbell`.
    Doorbell(DoorbellInfo<M::DoorbellPage, M::AggregatedPage>),
    /// `connect_doorbell`.
    Connected(M::Connected),
    /// `wait_progress`, `wait_native_fences`.
    Wait(WaitOutcome),
    /// `query_queue`.
    QueueStatus(QueueStatus),
    /// `create_native_fence`, `open_native_fence`, `open_cross_adapter_fence`,
    /// `open_progress_fence`.
    NativeFence(NativeFenceInfo<M::Mapping>),
    /// `query_native_fence`.
    FenceValues(NativeFenceValues),
    /// `query_physical_doorbell`.
    PhysicalDoorbell(Option<PhysicalDoorbell>),
    /// `userq_wait`.
    WaitPoints(Vec<WaitPoint>),
}

impl<M: Memory> Reply<M> {
    /// The reply's kind (`"device"`), for errors.
    pub fn name(&self) -> &'static str {
        match self {
            Reply::Unit => "unit",
            Reply::NativeFenceCaps(_) => "native fence caps",
            Reply::Device(_) => "device",
            Reply::Allocation(_) => "allocation",
            Reply::Mapping(_) => "mapping",
            Reply::Context(_) => "context",
            Reply::HwQueue(_) => "hardware queue",
            Reply::DoorbellPage(_) => "doorbell page",
            Reply::Doorbell(_) => "doorbell",
            Reply::Connected(_) => "connected",
            Reply::Wait(_) => "wait",
            Reply::QueueStatus(_) => "queue status",
            Reply::NativeFence(_) => "native fence",
            Reply::FenceValues(_) => "fence values",
            Reply::PhysicalDoorbell(_) => "physical doorbell",
            Reply::WaitPoints(_) => "wait points",
        }
    }

    /// The same reply with its shared memory carried as `N` carries it; plain data is kept.
    /// An aggregated doorbell page the translation cannot carry
    /// ([`Translate::aggregated_page`] answers `None`) is left out of the doorbell.
    pub fn translate<N: Memory, T: Translate<M, N>>(self, t: &mut T) -> Result<Reply<N>, T::Error> {
        Ok(match self {
            Reply::Mapping(m) => Reply::Mapping(t.mapping(m)?),
            Reply::HwQueue(HwQueueInfo { handle, engine, kernel_page, kernel_page_va }) => {
                Reply::HwQueue(HwQueueInfo { handle, engine, kernel_page: t.mapping(kernel_page)?, kernel_page_va })
            }
            Reply::Doorbell(DoorbellInfo { handle, cpu_page, offset, ring, aggregated, gpu_va }) => {
                let cpu_page = t.doorbell_page(cpu_page)?;
                let aggregated = match aggregated {
                    Some(AggregatedDoorbell { page, offset, mask, gpu_va }) => {
                        t.aggregated_page(page)?.map(|page| AggregatedDoorbell { page, offset, mask, gpu_va })
                    }
                    None => None,
                };
                Reply::Doorbell(DoorbellInfo { handle, cpu_page, offset, ring, aggregated, gpu_va })
            }
            Reply::Connected(c) => Reply::Connected(t.connected(c)?),
            Reply::NativeFence(NativeFenceInfo { handle, va, cpu, offset, global, kind, cross_adapter }) => {
                let cpu = match cpu {
                    Some(m) => Some(t.mapping(m)?),
                    None => None,
                };
                Reply::NativeFence(NativeFenceInfo { handle, va, cpu, offset, global, kind, cross_adapter })
            }
            Reply::Unit => Reply::Unit,
            Reply::NativeFenceCaps(c) => Reply::NativeFenceCaps(c),
            Reply::Device(d) => Reply::Device(d),
            Reply::Allocation(a) => Reply::Allocation(a),
            Reply::Context(c) => Reply::Context(c),
            Reply::DoorbellPage(p) => Reply::DoorbellPage(p),
            Reply::Wait(w) => Reply::Wait(w),
            Reply::QueueStatus(s) => Reply::QueueStatus(s),
            Reply::FenceValues(v) => Reply::FenceValues(v),
            Reply::PhysicalDoorbell(p) => Reply::PhysicalDoorbell(p),
            Reply::WaitPoints(p) => Reply::WaitPoints(p),
        })
    }

    /// The refusal of this reply as the answer to `call`: it is of another kind.
    pub fn unexpected(&self, call: &Call<'_>) -> KernelError {
        KernelError::UnexpectedReply { call: call.name(), reply: self.name() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handle::ProcessId;

    #[test]
    fn calls_name_their_methods() {
        let q = HwQueueHandle::new(ProcessId(1), 2, 3);
        let words = [1, 2, 3];
        let call = Call::SubmitCommand { queue: q, words: Cow::Borrowed(&words) };
        assert_eq!(call, Call::SubmitCommand { queue: q, words: Cow::Owned(words.to_vec()) });
        assert_eq!(call.name(), "submit_command");
        assert!(!call.is_wait());
        assert!(Call::WaitProgress { queue: q, value: 1, timeout: None }.is_wait());
    }

    #[test]
    fn a_reply_of_another_kind_names_both() {
        let e = Reply::<Local>::Unit.unexpected(&Call::CreateDevice);
        assert_eq!(e, KernelError::UnexpectedReply { call: "create_device", reply: "unit" });
        assert_eq!(e.to_string(), "the port answered `create_device` with a `unit` reply");
    }
}
