//! The kernel port: the system-call surface a user-mode driver uses.
//!
//! [`KernelPort`] is the UMD's only way into the kernel (the control path). One port belongs to
//! one process: every handle it mints carries that process's id, and every call checks it.
//!
//! The calls mirror WDDM's `D3DKMT*` entry points and amdgpu's USERQ ioctl (spec 000 "User-mode
//! work submission APIs"; spec 001 "IOCTL Interfaces"). The data path — writing packets, wptr
//! and the doorbell — never appears here.
//!
//! ## One boundary, as data
//!
//! A system call is a value: a [`Call`] names the call and carries its arguments, and a
//! [`Reply`] carries its answer (or a typed [`KernelError`]). A port implements one method,
//! [`KernelPort::call`]; the typed methods every caller uses (`create_device`,
//! `notify_work_submission`, ...) are written once, here, as default bodies that build the
//! call and unpack its reply. A reply of another kind than its call's is
//! [`KernelError::UnexpectedReply`], never a panic: the answering side may be another process.
//!
//! Three ports forward calls: the kernel's own (`kernel::ProcessPort`, one dispatch onto the
//! OS: the embedded mode), the daemon's client (`wire::client::RemotePort`, which sends the
//! call over a Unix socket and the daemon hands it to its `ProcessPort`), and recording ports
//! in tests, which log a call and pass it on. A port also answers two things that are not
//! calls, fixed when it was opened: [`KernelPort::process`] and [`KernelPort::adapter_info`].
//!
//! ## What is not plain data
//!
//! - **Shared memory.** Replies that hand out memory (an allocation's mapping, a queue's kernel
//!   page, a fence's CurrentValue page, a doorbell's pages) are generic over its
//!   representation ([`memory`]): in-process ([`Local`], the default) they carry fd-backed
//!   [`shm::Mapping`]s and [`shm::RotatingPage`]s; the daemon's socket carries the same reply
//!   with each of them replaced by the index of a descriptor passed beside the frame
//!   (`SCM_RIGHTS`), and each end translates with a [`Translate`]. A call never carries memory.
//! - **Blocking waits.** [`Call::WaitProgress`] and [`Call::WaitNativeFences`] are calls like
//!   any other, answered when the kernel decides them ([`Call::is_wait`]). A port may end
//!   one sooner from memory it maps (the daemon's client does, on a wake word), or have the
//!   kernel wake a sleeper of its own as soon as it decides (the daemon does, through
//!   `ProcessPort::call_waking`); neither changes the call or its reply.
//!
//! Two queries exist to observe the protocols rather than take part in them:
//! [`KernelPort::query_native_fence`] (a fence's CurrentValue and MonitoredValue, spec 002)
//! and [`KernelPort::query_physical_doorbell`] (which BAR doorbell a queue holds now, spec 000
//! victimization).
//!
//! Modules: [`call`] (the call and its reply), [`memory`] (shared memory in replies), and the
//! argument and answer types by concern — adapter, objects (memory, queues, doorbells),
//! fences, errors — re-exported here.

use std::borrow::Cow;
use std::time::Duration;

use crate::handle::{
    AllocationHandle, ContextHandle, DeviceHandle, DoorbellHandle, DoorbellPageHandle, HwQueueHandle,
    NativeFenceHandle, ProcessId,
};
use crate::queue::EngineId;

mod adapter;
pub mod call;
mod error;
mod fence;
pub mod memory;
mod objects;

pub use adapter::*;
pub use call::{Call, Reply};
pub use error::*;
pub use fence::*;
pub use memory::{Local, Memory, Translate};
pub use objects::*;

/// Makes `$call` on `$port` and unpacks the reply `$pat` into `$out`; a reply of another kind
/// is [`KernelError::UnexpectedReply`].
macro_rules! ask {
    ($port:expr, $call:expr, $pat:pat => $out:expr) => {{
        let call = $call;
        match $port.call(&call)? {
            $pat => Ok($out),
            other => Err(other.unexpected(&call)),
        }
    }};
}

/// The system-call surface of the kernel, for one process.
///
/// A port implements [`process`](Self::process), [`adapter_info`](Self::adapter_info) and
/// [`call`](Self::call); the typed methods are the calls' contract (which reply answers
/// which call) and are not overridden. Every call is a "kernel call": it may take locks and
/// block. The UMD keeps them off its submission hot path except where the spec puts them
/// there (connect after a disconnect, `NotifyWorkSubmission` on `ConnectedNotify`, blocking
/// waits).
pub trait KernelPort: Send + Sync {
    /// The calling process.
    fn process(&self) -> ProcessId;
    /// Adapter capabilities (`DxgkDdiQueryAdapterInfo`, amdgpu INFO), as the port was opened
    /// on them.
    fn adapter_info(&self) -> AdapterInfo;
    /// One system call of this process, answered with its reply or the kernel's refusal.
    fn call(&self, call: &Call<'_>) -> Result<Reply, KernelError>;

    /// The native fence caps the adapter's KMD reported and the OS accepted
    /// ([`NativeFenceCaps`]: packing stride, the optimized signaled interrupt,
    /// `MapToGpuSystemProcess`). The UMD reads them once when it opens a device: with the
    /// optimized interrupt, the OS learns of a user-mode queue's signals from its signal log,
    /// so the UMD logs every one (`umd::Queue::submit`).
    fn native_fence_caps(&self) -> Result<NativeFenceCaps, KernelError> {
        ask!(self, Call::NativeFenceCaps, Reply::NativeFenceCaps(c) => c)
    }
    /// `D3DKMTCreateDevice`.
    fn create_device(&self) -> Result<DeviceHandle, KernelError> {
        ask!(self, Call::CreateDevice, Reply::Device(d) => d)
    }
    /// `D3DKMTDestroyDevice`: destroys everything the device owns, in the spec's order.
    fn destroy_device(&self, device: DeviceHandle) -> Result<(), KernelError> {
        ask!(self, Call::DestroyDevice(device), Reply::Unit => ())
    }
    /// Allocates memory and maps it into the process's GPU address space.
    fn allocate(&self, device: DeviceHandle, desc: &AllocationDesc) -> Result<AllocationInfo, KernelError> {
        ask!(self, Call::Allocate { device, desc: *desc }, Reply::Allocation(a) => a)
    }
    /// Maps an allocation into the caller's CPU address space (`D3DKMTLock2`).
    fn map_allocation(&self, allocation: AllocationHandle) -> Result<shm::Mapping, KernelError> {
        ask!(self, Call::MapAllocation(allocation), Reply::Mapping(m) => m)
    }
    /// Frees an allocation. Refused while a doorbell references it.
    fn free(&self, allocation: AllocationHandle) -> Result<(), KernelError> {
        ask!(self, Call::Free(allocation), Reply::Unit => ())
    }
    /// Creates a hardware context on an engine.
    fn create_context(&self, device: DeviceHandle, engine: EngineId) -> Result<ContextHandle, KernelError> {
        ask!(self, Call::CreateContext { device, engine }, Reply::Context(c) => c)
    }
    /// Destroys a context and its queues.
    fn destroy_context(&self, context: ContextHandle) -> Result<(), KernelError> {
        ask!(self, Call::DestroyContext(context), Reply::Unit => ())
    }
    /// `D3DKMTCreateHwQueue` / USERQ CREATE: validates and creates a queue.
    fn create_hw_queue(&self, context: ContextHandle, desc: &HwQueueDesc) -> Result<HwQueueInfo, KernelError> {
        ask!(self, Call::CreateHwQueue { context, desc: *desc }, Reply::HwQueue(q) => q)
    }
    /// Destroys a queue: its doorbell is disconnected and destroyed, then the firmware drops
    /// the queue at once — work not yet executed is discarded (wait for the queue's progress
    /// fence first to keep it). The spec's normal and abnormal process-termination sequences
    /// come with the lifecycle work (roadmap item 4).
    fn destroy_hw_queue(&self, queue: HwQueueHandle) -> Result<(), KernelError> {
        ask!(self, Call::DestroyHwQueue(queue), Reply::Unit => ())
    }
    /// Allocates a doorbell page for the process's user-mode queues (spec 001: "They would
    /// also allocate a doorbell page for the doorbells used by the user queues"; amdgpu's
    /// doorbell BO). A queue uses it by naming it in [`crate::QueueDescriptor::doorbell_page_va`],
    /// with the doorbell index it wants there. A process holds at most
    /// [`MAX_DOORBELL_PAGES`] pages, the one the kernel gave it included.
    fn create_doorbell_page(&self, device: DeviceHandle) -> Result<DoorbellPageInfo, KernelError> {
        ask!(self, Call::CreateDoorbellPage(device), Reply::DoorbellPage(p) => p)
    }
    /// Frees a doorbell page; refused while a queue uses it. The page stays the process's
    /// (cleared) until it ends, so no stale mapping of it reaches another process.
    fn destroy_doorbell_page(&self, page: DoorbellPageHandle) -> Result<(), KernelError> {
        ask!(self, Call::DestroyDoorbellPage(page), Reply::Unit => ())
    }
    /// `D3DKMTCreateDoorbell`: the doorbell starts disconnected, its CPU page on the dummy page.
    fn create_doorbell(&self, args: &CreateDoorbell) -> Result<DoorbellInfo, KernelError> {
        ask!(self, Call::CreateDoorbell(*args), Reply::Doorbell(d) => d)
    }
    /// `D3DKMTConnectDoorbell`: wakes the engine if needed and connects.
    fn connect_doorbell(&self, queue: HwQueueHandle) -> Result<(), KernelError> {
        ask!(self, Call::ConnectDoorbell(queue), Reply::Connected(()) => ())
    }
    /// `D3DKMTDestroyDoorbell`.
    fn destroy_doorbell(&self, doorbell: DoorbellHandle) -> Result<(), KernelError> {
        ask!(self, Call::DestroyDoorbell(doorbell), Reply::Unit => ())
    }
    /// `D3DKMTNotifyWorkSubmission`.
    fn notify_work_submission(&self, doorbell: DoorbellHandle) -> Result<(), KernelError> {
        ask!(self, Call::NotifyWorkSubmission(doorbell), Reply::Unit => ())
    }
    /// `D3DKMTSubmitCommand`: the kernel-mode path. `words` is a packet stream; its
    /// `PROGRESS_FENCE` values must increase.
    fn submit_command(&self, queue: HwQueueHandle, words: &[u32]) -> Result<(), KernelError> {
        ask!(self, Call::SubmitCommand { queue, words: Cow::Borrowed(words) }, Reply::Unit => ())
    }
    /// Blocks until the queue's progress fence reaches `value`, or the timeout passes. A hung
    /// queue ends the wait with [`KernelError::QueueLost`].
    fn wait_progress(
        &self,
        queue: HwQueueHandle,
        value: u64,
        timeout: Option<Duration>,
    ) -> Result<WaitOutcome, KernelError> {
        ask!(self, Call::WaitProgress { queue, value, timeout }, Reply::Wait(w) => w)
    }
    /// `USERQ QUERY_STATUS`.
    fn query_queue(&self, queue: HwQueueHandle) -> Result<QueueStatus, KernelError> {
        ask!(self, Call::QueryQueue(queue), Reply::QueueStatus(s) => s)
    }
    /// `D3DKMTCreateNativeFence`.
    fn create_native_fence(
        &self,
        device: DeviceHandle,
        desc: &NativeFenceDesc,
    ) -> Result<NativeFenceInfo, KernelError> {
        ask!(self, Call::CreateNativeFence { device, desc: *desc }, Reply::NativeFence(f) => f)
    }
    /// Opens a fence another process shared, by its global handle; this process gets its own
    /// local handle. A fence that was not created shareable cannot be opened.
    fn open_native_fence(&self, device: DeviceHandle, global: u64) -> Result<NativeFenceInfo, KernelError> {
        ask!(self, Call::OpenNativeFence { device, global }, Reply::NativeFence(f) => f)
    }
    /// Opens a cross-adapter fence created on another adapter (spec 002): the same
    /// CurrentValue storage, mapped on this adapter. On an adapter without native fences it
    /// opens as a monitored fence.
    fn open_cross_adapter_fence(&self, device: DeviceHandle, handle: u64) -> Result<NativeFenceInfo, KernelError> {
        ask!(self, Call::OpenCrossAdapterFence { device, handle }, Reply::NativeFence(f) => f)
    }
    /// Destroys (closes) a native fence; its waiters in this process end with an error. A
    /// shared fence lives on while another process has it open.
    fn destroy_native_fence(&self, fence: NativeFenceHandle) -> Result<(), KernelError> {
        ask!(self, Call::DestroyNativeFence(fence), Reply::Unit => ())
    }
    /// `D3DKMTSignalSynchronizationObjectFromCpu`: sets CurrentValue. A value below the current
    /// one is refused.
    fn signal_native_fence(&self, fence: NativeFenceHandle, value: u64) -> Result<(), KernelError> {
        ask!(self, Call::SignalNativeFence { fence, value }, Reply::Unit => ())
    }
    /// `D3DKMTWaitForSynchronizationObjectFromCpu`: blocks until the fences reach their values
    /// (all, or any), or the timeout passes. `Reached(i)` carries, for [`WaitMode::Any`], the
    /// index of a fence that was reached (0 for [`WaitMode::All`]).
    fn wait_native_fences(
        &self,
        fences: &[(NativeFenceHandle, u64)],
        mode: WaitMode,
        timeout: Option<Duration>,
    ) -> Result<WaitOutcome, KernelError> {
        ask!(self, Call::WaitNativeFences { fences: Cow::Borrowed(fences), mode, timeout }, Reply::Wait(w) => w)
    }
    /// Reads a native fence's CurrentValue and MonitoredValue (spec 002), for tests and tools
    /// that observe the MonitoredValue protocol. A diagnostic query: user mode has no other
    /// access to MonitoredValue, and nothing here changes either value.
    fn query_native_fence(&self, fence: NativeFenceHandle) -> Result<NativeFenceValues, KernelError> {
        ask!(self, Call::QueryNativeFence(fence), Reply::FenceValues(v) => v)
    }
    /// Which physical doorbell a queue holds now (spec 000 "Doorbells"): `None` while its
    /// doorbell is disconnected (never connected, victimized, its engine in F1) or it has none.
    /// A kernel-mode queue reports the kernel's doorbell the KMD rings for it. For tests and
    /// tools that observe victimization.
    fn query_physical_doorbell(&self, queue: HwQueueHandle) -> Result<Option<PhysicalDoorbell>, KernelError> {
        ask!(self, Call::QueryPhysicalDoorbell(queue), Reply::PhysicalDoorbell(p) => p)
    }
    /// amdgpu `USERQ_SIGNAL` (spec 001): once user-mode queue `queue` completes its work up to
    /// progress value `point`, the kernel signals each fence to its value — so a kernel-mode
    /// queue, a CPU waiter or another process can depend on a user queue's work. `point` may
    /// not pass the queue's last-queued value.
    fn userq_signal(
        &self,
        queue: HwQueueHandle,
        point: u64,
        fences: &[(NativeFenceHandle, u64)],
    ) -> Result<(), KernelError> {
        ask!(self, Call::UserqSignal { queue, point, fences: Cow::Borrowed(fences) }, Reply::Unit => ())
    }
    /// amdgpu `USERQ_WAIT` (spec 001): validates the sync objects user-mode queue `queue`
    /// should wait on and answers, for each, the GPU VA and value its `WAIT` packet uses
    /// (`umd::CommandBuffer::wait_points`). Kernel-mode queues' progress fences are sync objects
    /// too.
    fn userq_wait(&self, queue: HwQueueHandle, objects: &[SyncWait]) -> Result<Vec<WaitPoint>, KernelError> {
        ask!(self, Call::UserqWait { queue, objects: Cow::Borrowed(objects) }, Reply::WaitPoints(p) => p)
    }
    /// The queue's progress fence as a native fence (spec 002 "Indicating a native progress
    /// fence for hardware queues"): CPU waits on it are native fence waits (MonitoredValue, a
    /// conditional interrupt), GPU waits park on it. Only the engine writes it: a CPU signal
    /// is refused. It goes with its queue.
    fn open_progress_fence(&self, queue: HwQueueHandle) -> Result<NativeFenceInfo, KernelError> {
        ask!(self, Call::OpenProgressFence(queue), Reply::NativeFence(f) => f)
    }
}
