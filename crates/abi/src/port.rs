//! The kernel port: the system-call surface a user-mode driver uses.
//!
//! [`KernelPort`] is the UMD's only way into the kernel (the control path). One port belongs to
//! one process: every handle it mints carries that process's id, and every call checks it. In
//! the embedded mode the kernel implements the trait directly; the later multi-process mode
//! implements it over a Unix socket, passing shared memory as file descriptors — which is why
//! every mapping handed out here is an fd-backed [`shm::Mapping`].
//!
//! The calls mirror WDDM's `D3DKMT*` entry points and amdgpu's USERQ ioctl (spec 000 "User-mode
//! work submission APIs"; spec 001 "IOCTL Interfaces"). The data path — writing packets, wptr
//! and the doorbell — never appears here.
//!
//! Two queries exist to observe the protocols rather than take part in them:
//! [`KernelPort::query_native_fence`] (a fence's CurrentValue and MonitoredValue, spec 002)
//! and [`KernelPort::query_physical_doorbell`] (which BAR doorbell a queue holds now, spec 000
//! victimization).

use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;

use crate::handle::{
    AllocationHandle, AnyHandle, ContextHandle, DeviceHandle, DoorbellHandle, DoorbellPageHandle, HwQueueHandle,
    NativeFenceHandle, ProcessId,
};
use crate::packet::DecodeError;
use crate::queue::{EngineId, EngineKind, FaultRecord, Priority, QueueDescriptor, QueueState};

/// Where an allocation lives.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryDomain {
    /// System memory (CPU-visible).
    System,
    /// Device-local memory ("VRAM").
    Local,
}

/// What to allocate.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocationDesc {
    /// Size in bytes (rounded up to 4 KiB pages).
    pub bytes: u64,
    /// Domain.
    pub domain: MemoryDomain,
    /// Whether the GPU may only read it.
    pub gpu_read_only: bool,
}

impl AllocationDesc {
    /// A read-write allocation in system memory.
    pub const fn system(bytes: u64) -> Self {
        AllocationDesc { bytes, domain: MemoryDomain::System, gpu_read_only: false }
    }
}

/// A created allocation.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocationInfo {
    /// Its handle.
    pub handle: AllocationHandle,
    /// Where it is mapped in the process's GPU address space.
    pub va: u64,
    /// Its size (whole pages).
    pub bytes: u64,
}

/// One engine as the adapter reports it (amdgpu INFO: which IPs take user and kernel queues).
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineInfo {
    /// Its id.
    pub id: EngineId,
    /// Its kind.
    pub kind: EngineKind,
    /// Whether it supports user-mode queues (`UserModeSubmissionSupported`).
    pub user_queues: bool,
    /// Whether it supports kernel-mode queues.
    pub kernel_queues: bool,
    /// First doorbell of this engine's range in every doorbell page (spec 001: each 4 KiB page
    /// reserves a range per IP; a queue's doorbell must lie in its engine's range).
    pub doorbell_first: u32,
    /// Doorbells in the range.
    pub doorbell_count: u32,
    /// Its hardware queue slots (HQDs).
    pub hw_slots: u32,
    /// The slots left for user queues: kernel queues are always mapped and hold theirs
    /// statically (spec 001 "Interaction with Kernel Queues").
    pub user_slots: u32,
}

/// `amdgpu_user_queue`: which submission models the device offers.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum UserQueueMode {
    /// 0: kernel queues only; user-mode queues are refused.
    KernelOnly = 0,
    /// 1: both (the default).
    #[default]
    Both = 1,
    /// 2: user-mode queues only; kernel-mode submission is refused.
    UserOnly = 2,
}

/// Sizes of what the kernel allocates per queue (amdgpu INFO: the metadata a queue needs).
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueMetadataSizes {
    /// The context save area (an interrupted `DISPATCH`'s state).
    pub context_save_bytes: u64,
    /// One fence log; a user-mode queue has two (waits, signals).
    pub fence_log_bytes: u64,
    /// The kernel page (progress fence, doorbell status, queue state).
    pub kernel_page_bytes: u64,
}

/// What the adapter reports.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterInfo {
    /// Engines.
    pub engines: Vec<EngineInfo>,
    /// `DXGK_USERMODESUBMISSION_CAPS`: bytes of one doorbell.
    pub doorbell_bytes: u64,
    /// Doorbells in the process's doorbell page.
    pub doorbells_per_process: u32,
    /// Spec 000's doorbell model.
    pub doorbell_model: crate::doorbell::DoorbellModel,
    /// Engines miss doorbells of queues not in a hardware slot, so clients also ring the
    /// aggregated doorbell (amdgpu).
    pub aggregated_doorbell: bool,
    /// Which submission models the device offers.
    pub user_queue_mode: UserQueueMode,
    /// The adapter supports native fences. Without them, fences are monitored fences
    /// (`LegacyMonitored`) waited on through kernel-mode queues.
    pub native_fences: bool,
    /// Per-queue metadata sizes.
    pub queue_metadata: QueueMetadataSizes,
    /// `D3DKMDT_PREEMPTION_CAPS`: where the engines can stop a queue's work (spec 003).
    pub preemption: crate::preempt::PreemptionCaps,
    /// The device runs secure (protected-content) queues ([`crate::queue::QUEUE_FLAG_SECURE`]).
    pub secure_queues: bool,
}

/// How a hardware queue takes work.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubmissionMode {
    /// `UserModeSubmission`: the client writes the ring and rings a doorbell.
    UserMode(QueueDescriptor),
    /// The traditional path: each submission is a kernel call.
    KernelMode,
}

/// What to create.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HwQueueDesc {
    /// Submission model.
    pub mode: SubmissionMode,
    /// Priority (user-mode queues carry it in the descriptor too; this one wins).
    pub priority: Priority,
}

/// A created hardware queue.
#[derive(Debug)]
pub struct HwQueueInfo {
    /// Its handle.
    pub handle: HwQueueHandle,
    /// Its engine.
    pub engine: EngineId,
    /// The queue's kernel page ([`crate::queue::QueueKernelPage`]), mapped read-only.
    pub kernel_page: shm::Mapping,
    /// Where the kernel page is mapped (read-only) in the process's GPU address space, so
    /// other queues can `WAIT` on this queue's progress.
    pub kernel_page_va: u64,
}

/// A doorbell page the application allocated ([`KernelPort::create_doorbell_page`]).
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DoorbellPageInfo {
    /// Its handle.
    pub handle: DoorbellPageHandle,
    /// Its GPU VA in the process's address space: what [`QueueDescriptor::doorbell_page_va`]
    /// names. Where the device lets the GPU ring doorbells the page is mapped there (a queue's
    /// [`DoorbellInfo::gpu_va`] lies in it); elsewhere the range is reserved, as a name.
    pub va: u64,
    /// Doorbells in the page; each engine has its range of them, as in every page
    /// ([`EngineInfo::doorbell_first`]).
    pub doorbells: u32,
}

/// `D3DKMT_CREATE_DOORBELL`.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CreateDoorbell {
    /// The user-mode queue.
    pub queue: HwQueueHandle,
    /// The allocation holding the ring.
    pub ring_buffer: AllocationHandle,
    /// The allocation holding rptr and wptr.
    pub ring_control: AllocationHandle,
}

/// A created doorbell.
pub struct DoorbellInfo {
    /// Its handle.
    pub handle: DoorbellHandle,
    /// `DoorbellCPUVirtualAddress`: the page the kernel rotates between the BAR and a dummy.
    pub cpu_page: Arc<shm::RotatingPage>,
    /// Offset of this queue's doorbell word inside `cpu_page`.
    pub offset: u64,
    /// How to ring that word.
    pub ring: crate::doorbell::RingMethod,
    /// The aggregated doorbell, when the device needs one: the page (never rotated), the
    /// offset of this queue's engine's word in it and the value to OR in.
    pub aggregated: Option<AggregatedDoorbell>,
    /// The doorbell's GPU VA in the process's own address space (spec 001: "the GPU [can]
    /// submit work to itself"): another queue of the process rings it from the GPU by
    /// writing the new wptr there (`WRITE_DATA`), after writing the wptr word, and then the
    /// aggregated doorbell where there is one ([`AggregatedDoorbell::gpu_va`]). `None` where a
    /// plain store from the GPU cannot ring (global doorbell bits, a victimized pool).
    pub gpu_va: Option<u64>,
}

/// Where a client rings the aggregated doorbell.
#[derive(Clone)]
pub struct AggregatedDoorbell {
    /// The process's aggregated doorbell page (the kernel rotates it to a dummy page when the
    /// process ends, so a late write cannot reach the page's next owner).
    pub page: Arc<shm::RotatingPage>,
    /// Offset of the engine's word.
    pub offset: u64,
    /// What the CPU ORs into it (any non-zero value rings).
    pub mask: u64,
    /// The word's GPU VA: the kernel maps the page into the process's address space too
    /// (spec 001: "the kernel driver will map a page of aggregated doorbell space into each
    /// GPUVM space"), where a plain store rings it. `None` where the device does not map it.
    pub gpu_va: Option<u64>,
}

impl core::fmt::Debug for DoorbellInfo {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DoorbellInfo")
            .field("handle", &self.handle)
            .field("offset", &self.offset)
            .field("ring", &self.ring)
            .field("aggregated", &self.aggregated.is_some())
            .finish()
    }
}

/// Doorbell pages a process may hold, the one the kernel gives it at creation included: two,
/// 1,024 doorbells (amdgpu allows a process 8 KiB of doorbells).
pub const MAX_DOORBELL_PAGES: u32 = 2;

/// The CurrentValue a fence takes when its device is in error (AlwaysSignaled): every wait
/// passes. Reserved: the CPU cannot signal it.
pub const FENCE_ALWAYS_SIGNALED: u64 = u64::MAX;

/// `D3DDDI_NATIVEFENCE_TYPE`: where a native fence's CurrentValue lives.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NativeFenceType {
    /// System memory, readable by the CPU (user mode reads it; only the kernel writes it).
    Default,
    /// Device-local memory with no CPU access: CPU waits and reads are refused.
    IntraGpu,
    /// A legacy monitored fence: system memory, MonitoredValue pinned at 0, so every signal
    /// interrupts (the behaviour native fences improve on; kept for comparison).
    LegacyMonitored,
}

/// What native fence to create.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NativeFenceDesc {
    /// Initial CurrentValue.
    pub initial: u64,
    /// Storage type.
    pub kind: NativeFenceType,
    /// Shareable fences get pages of their own (sharing itself comes with global handles).
    pub shareable: bool,
    /// A cross-adapter fence (spec 002 "Cross-adapter native fences"): its CurrentValue lives
    /// in system memory every adapter maps, its MonitoredValue stays 0 (every signal
    /// interrupts, so the OS can propagate it), and other adapters open it by its
    /// cross-adapter handle. Its type must be `Default` (or `LegacyMonitored`, a monitored
    /// fence, on an adapter without native fences).
    pub cross_adapter: bool,
}

impl NativeFenceDesc {
    /// A fence of `kind` starting at `initial`, neither shareable nor cross-adapter.
    pub const fn new(initial: u64, kind: NativeFenceType) -> Self {
        NativeFenceDesc { initial, kind, shareable: false, cross_adapter: false }
    }
}

/// A created native fence.
#[derive(Debug)]
pub struct NativeFenceInfo {
    /// Its handle.
    pub handle: NativeFenceHandle,
    /// GPU VA of its CurrentValue (for `SIGNAL` with the fence flag and `WAIT`).
    pub va: u64,
    /// Read-only CPU mapping of the page holding CurrentValue (`None` for `IntraGpu`).
    pub cpu: Option<shm::Mapping>,
    /// Offset of CurrentValue in `cpu`.
    pub offset: u64,
    /// For a shareable fence, the global handle another process passes to
    /// [`KernelPort::open_native_fence`].
    pub global: Option<u64>,
    /// Its storage type. A cross-adapter fence opened on an adapter without native fences is
    /// a monitored fence there (`LegacyMonitored`).
    pub kind: NativeFenceType,
    /// For a cross-adapter fence, the handle another adapter's device passes to
    /// [`KernelPort::open_cross_adapter_fence`].
    pub cross_adapter: Option<u64>,
}

/// How a multi-fence wait is satisfied.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitMode {
    /// Every fence reaches its value.
    All,
    /// Any one does.
    Any,
}

/// How a wait ended.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitOutcome {
    /// The value was reached; carries the completed value seen.
    Reached(u64),
    /// The timeout passed first.
    TimedOut,
}

/// `USERQ QUERY_STATUS`.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueStatus {
    /// State.
    pub state: QueueState,
    /// The fault that hung the queue, if any.
    pub fault: Option<FaultRecord>,
    /// Highest completed progress value.
    pub completed: u64,
    /// Last queued progress value.
    pub last_queued: u64,
    /// `AMDGPU_USERQ_QUERY_STATUS_FLAGS_*`: [`QUEUE_STATUS_HUNG`], [`QUEUE_STATUS_VRAM_LOST`].
    pub flags: u32,
    /// The queue caused its own hang (a fault, or it would not yield and was reset), rather
    /// than being lost with its device or adapter.
    pub guilty: bool,
}

/// [`QueueStatus::flags`]: the queue is hung (reset or faulted); it runs no more work.
pub const QUEUE_STATUS_HUNG: u32 = 1 << 0;
/// [`QueueStatus::flags`]: the adapter was reset since the queue was created and the contents
/// of local (VRAM) memory did not survive; user mode must re-upload what it kept there.
pub const QUEUE_STATUS_VRAM_LOST: u32 = 1 << 1;

/// Why a handle was refused.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandleProblem {
    /// It belongs to another process.
    Foreign {
        /// Its owner.
        owner: ProcessId,
    },
    /// Its object was destroyed (the slot may hold a newer object).
    Stale,
    /// It never named an object.
    Unknown,
}

impl core::fmt::Display for HandleProblem {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            HandleProblem::Foreign { owner } => write!(f, "belongs to process {owner}"),
            HandleProblem::Stale => f.write_str("was destroyed"),
            HandleProblem::Unknown => f.write_str("does not exist"),
        }
    }
}

/// Why an argument was refused, as data. `Display` is the sentence the error message uses
/// after the field and value (`` `field` = value: <reason> ``).
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Invalid {
    /// An allocation size outside 1 byte ..= `max` bytes.
    Size {
        /// The largest allowed.
        max: u64,
    },
    /// The device has no such engine.
    NoSuchEngine {
        /// How many engines it has.
        engines: usize,
    },
    /// The engine does not offer this (`"user-mode queues"`, `"kernel-mode queues"`).
    Unsupported(#[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))] crate::StaticStr),
    /// An address not aligned as required.
    Misaligned {
        /// The required alignment in bytes.
        align: u64,
    },
    /// An address in a mapping the GPU may only read, where it must write.
    GpuReadOnly,
    /// A ring size the protocol refuses.
    RingSize(crate::ring::RingSizeError),
    /// A priority outside `Priority`.
    PriorityRange,
    /// A doorbell index outside the engine's share of the page.
    OutsideEngineDoorbells {
        /// The engine.
        engine: EngineKind,
        /// Its first index.
        first: u32,
        /// One past its last.
        end: u32,
    },
    /// A doorbell index outside the process's doorbell page.
    OutsideDoorbellPage {
        /// Doorbells in the page.
        doorbells: u32,
    },
    /// Already used by this queue.
    UsedBy(HwQueueHandle),
    /// Every value of a range is in use (what ran out, and the range).
    Exhausted {
        /// The range's first value.
        first: u32,
        /// One past its last.
        end: u32,
    },
    /// The queue already has a doorbell.
    HasDoorbell,
    /// The queue has no doorbell (create one first).
    NoDoorbell,
    /// The allocation does not hold the queue's `what` at `va`.
    DoesNotHold {
        /// What it should hold ("ring", "rptr", ...).
        #[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))]
        what: crate::StaticStr,
        /// Where.
        va: u64,
    },
    /// The context is already suspended.
    AlreadySuspended,
    /// The context is not suspended.
    NotSuspended,
    /// A kernel-mode queue has no fence log.
    NoFenceLog,
    /// The `SIGNAL`/`WAIT` log flag on a kernel-mode submission.
    LogFlagOnKernelQueue,
    /// A `SIGNAL` with the native-fence flag whose address is not a native fence.
    NotANativeFence,
    /// A field that must be zero.
    MustBeZero,
    /// `DISPATCH` dimensions the ISA refuses (the reason).
    Dims(#[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))] crate::StaticStr),
    /// A kernel-mode submission's length outside 1 ..= `max_dwords`.
    SubmissionSize {
        /// The largest allowed.
        max_dwords: u64,
    },
    /// Native fences of this kind need an adapter with native fences.
    NoNativeFences,
    /// A cross-adapter fence must be of this type on this adapter.
    CrossAdapterKind {
        /// The allowed type.
        allowed: NativeFenceType,
    },
    /// The adapter is not part of a multi-adapter machine.
    SingleAdapter,
    /// The global or cross-adapter handle names no fence.
    NoSuchFence,
    /// The fence was not created shareable.
    NotShareable,
    /// The value is reserved (a device in error's AlwaysSignaled).
    Reserved,
    /// A wait must name at least one fence.
    EmptyWait,
    /// An IntraGpu fence has no CPU access.
    NoCpuAccess,
    /// The fence was destroyed while waited on.
    DestroyedWhileWaited,
    /// An adapter without native fences takes kernel-mode queues only.
    NeedsKernelOnly,
    /// The global doorbell model has no dedicated doorbells to pool.
    NothingToPool,
    /// A setting outside the range it may take.
    OutOfRange {
        /// The range it may take.
        #[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))]
        expected: crate::StaticStr,
    },
    /// The device (its kernel-mode driver) refused, with its reason.
    Device(DeviceRefusal),
    /// A progress point past the queue's last-queued value (work not yet submitted).
    BeyondQueued {
        /// The queue's last-queued value.
        last_queued: u64,
    },
    /// An object of another process.
    OtherProcess,
    /// A VA that names none of the doorbell pages a queue of this device may use: the
    /// process's own (0), or one the process allocated on the same device.
    NoDoorbellPage,
    /// Memory of another device of the process: a queue runs only from its own device's
    /// allocations.
    OtherDevice,
}

impl core::fmt::Display for Invalid {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        use Invalid::*;
        match self {
            Size { max } => write!(f, "must be between 1 and {max} bytes"),
            NoSuchEngine { engines } => write!(f, "the device has {engines} engines"),
            Unsupported(what) => write!(f, "does not support {what}"),
            BeyondQueued { last_queued } => write!(f, "is past the queue's last-queued value {last_queued}"),
            OtherProcess => f.write_str("belongs to another process"),
            NoDoorbellPage => {
                f.write_str("names no doorbell page of the process on the queue's device (create_doorbell_page)")
            }
            OtherDevice => f.write_str("lies in an allocation of another device (a queue runs from its own device's)"),
            Misaligned { align } => write!(f, "must be {align}-byte aligned"),
            GpuReadOnly => f.write_str("lies in a mapping the GPU may not write"),
            RingSize(why) => write!(f, "{why}"),
            PriorityRange => f.write_str("must be 0 (low) to 4 (realtime)"),
            OutsideEngineDoorbells { engine, first, end } => {
                write!(f, "lies outside the {engine} engine's doorbell range {first}..{end} of the page")
            }
            OutsideDoorbellPage { doorbells } => {
                write!(f, "lies outside the process's doorbell page (0..{doorbells})")
            }
            UsedBy(q) => write!(f, "already used by {q}"),
            Exhausted { first, end } => write!(f, "all of {first}..{end} are in use"),
            HasDoorbell => f.write_str("already has a doorbell"),
            NoDoorbell => f.write_str("has no doorbell: create one first"),
            DoesNotHold { what, va } => write!(f, "does not hold the queue's {what} at {va:#x}"),
            AlreadySuspended => f.write_str("is already suspended"),
            NotSuspended => f.write_str("is not suspended"),
            NoFenceLog => f.write_str("is a kernel-mode queue: it has no fence log"),
            LogFlagOnKernelQueue => {
                f.write_str("kernel-mode queues have no fence log (their fences are software operations of the kernel)")
            }
            NotANativeFence => f.write_str("carries the native-fence flag but is not a native fence of the process"),
            MustBeZero => f.write_str("must be 0"),
            Dims(why) => f.write_str(why),
            SubmissionSize { max_dwords } => write!(f, "a submission holds 1 to {max_dwords} dwords"),
            NoNativeFences => {
                f.write_str("this adapter has no native fences: create a monitored fence (LegacyMonitored)")
            }
            CrossAdapterKind { allowed } => {
                write!(f, "a cross-adapter fence must be of type {allowed:?} on this adapter")
            }
            SingleAdapter => f.write_str("this adapter is not part of a multi-adapter machine"),
            NoSuchFence => f.write_str("does not name a fence"),
            NotShareable => f.write_str("names a fence that was not created shareable: it cannot be opened"),
            Reserved => f.write_str("is reserved for a device in error (AlwaysSignaled)"),
            EmptyWait => f.write_str("a wait names at least one fence"),
            NoCpuAccess => f.write_str("is an IntraGpu fence: it has no CPU access, so a CPU cannot wait on it"),
            DestroyedWhileWaited => f.write_str("was destroyed while waited on"),
            NeedsKernelOnly => {
                f.write_str("an adapter without native fences takes kernel-mode queues only (KernelOnly)")
            }
            NothingToPool => {
                f.write_str("the device's doorbell model is global: there are no dedicated doorbells to pool")
            }
            OutOfRange { expected } => write!(f, "out of range: must be {expected}"),
            Device(why) => write!(f, "{why}"),
        }
    }
}

/// What a device (its kernel-mode driver) can refuse, as data in the kernel's terms: the
/// driver translates its device's errors into these, so no device type crosses the driver
/// boundary. [`Invalid::Device`] carries one after the field and value it concerns.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceRefusal {
    /// The device does not know the queue (never created there, or destroyed).
    UnknownQueue,
    /// The device has no address space for the process.
    NoAddressSpace,
    /// The device has no such engine.
    NoSuchEngine(u32),
    /// A GPU mapping that overlaps an existing one.
    MappingOverlap {
        /// Address.
        va: u64,
        /// Length.
        bytes: u64,
    },
    /// A GPU mapping outside its backing, or wrapping around the address space.
    BadMapping {
        /// Address.
        va: u64,
        /// Length.
        bytes: u64,
        /// Why.
        #[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))]
        why: crate::StaticStr,
    },
    /// A queue's memory does not resolve in its address space.
    QueueMemory(crate::queue::FaultKind),
    /// The client's wptr word holds an impossible starting value.
    BadStartPointer {
        /// The value found.
        wptr: u64,
    },
    /// A doorbell index outside the BAR.
    BadDoorbell {
        /// The index.
        index: u32,
        /// Doorbells in the BAR.
        count: u32,
    },
    /// The device has no global doorbell (its doorbell model is another).
    NoGlobalDoorbell {
        /// Its model.
        model: crate::doorbell::DoorbellModel,
    },
    /// A global-doorbell bit outside the page.
    NoGlobalDoorbellBit {
        /// The bit.
        bit: u32,
        /// Bits in the page.
        bits: u32,
    },
    /// More engines than an aggregated doorbell word can name.
    TooManyEngines {
        /// Engines configured.
        engines: usize,
        /// The most it can name.
        max: usize,
    },
    /// No pooled doorbell is free and none is connected to victimize.
    NoDoorbellToVictimize,
    /// A victimized doorbell did not return to the pool.
    VictimKeptDoorbell,
    /// Not a native fence of this device.
    NotANativeFence,
    /// A failure injected on purpose by a test (the DDI is the field's value).
    Injected {
        /// Which call of the DDI failed (1-based).
        call: u32,
    },
    /// The queue is not held off its engine for the kernel (never preempted, or hung).
    NotHeld,
    /// A take-back of a kernel ring's work outside what the engine allows.
    BadTakeBack {
        /// The wptr asked for.
        wptr: u64,
        /// The lowest allowed (the packet the queue resumes at, or just past it).
        floor: u64,
        /// The highest allowed (the last wptr the engine accepted).
        accepted: u64,
    },
    /// The device does not support what was asked.
    Unsupported(#[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))] crate::StaticStr),
    /// The hardware the device's engines run on (a GPU) refused or failed.
    Hardware(String),
}

impl core::fmt::Display for DeviceRefusal {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        use DeviceRefusal::*;
        match self {
            UnknownQueue => f.write_str("is not a queue of this device"),
            NoAddressSpace => f.write_str("has no address space on this device"),
            NoSuchEngine(n) => write!(f, "engine {n} does not exist"),
            MappingOverlap { va, bytes } => write!(f, "GPU mapping {va:#x}+{bytes:#x} overlaps an existing mapping"),
            BadMapping { va, bytes, why } => write!(f, "GPU mapping {va:#x}+{bytes:#x}: {why}"),
            QueueMemory(fault) => write!(f, "queue memory: {fault}"),
            BadStartPointer { wptr } => write!(
                f,
                "queue memory: the wptr word holds {wptr:#x}: a new queue needs a dword count below 2^62 (write 0 first)"
            ),
            BadDoorbell { index, count } => write!(f, "doorbell index {index} is outside the BAR ({count} doorbells)"),
            NoGlobalDoorbell { model } => {
                write!(f, "the device's doorbell model is {model}: it has no global doorbell")
            }
            NoGlobalDoorbellBit { bit, bits } => {
                write!(f, "global doorbell bit {bit} is outside the page ({bits} bits)")
            }
            TooManyEngines { engines, max } => {
                write!(f, "{engines} engines: an aggregated doorbell names at most {max}")
            }
            NoDoorbellToVictimize => f.write_str("no doorbell is free and none is connected to victimize"),
            VictimKeptDoorbell => f.write_str("the victim's doorbell did not come back"),
            NotANativeFence => f.write_str("is not a native fence of this device"),
            Injected { call } => write!(f, "failed (injected fault, call {call})"),
            NotHeld => f.write_str("is not held off its engine for the kernel"),
            BadTakeBack { wptr, floor, accepted } => {
                write!(f, "take back to wptr {wptr:#x}: allowed from {floor:#x} to {accepted:#x} on a kernel ring")
            }
            Unsupported(what) => write!(f, "the device does not support {what}"),
            Hardware(what) => write!(f, "the device's hardware: {what}"),
        }
    }
}

/// Why a queue can run no more work, as data: the fault record, or what else ended it.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LostReason {
    /// The device faulted it (the record the status query returns).
    Fault(FaultRecord),
    /// It was destroyed (its blocked waiters learn this).
    Destroyed,
    /// Its doorbell was aborted (`DisconnectedAbort`: process termination, device loss)
    /// while the queue was in this state.
    DoorbellAborted(QueueState),
    /// The buffer at `va` holding its ring, rptr, wptr or last-queued word lost its GPU
    /// mapping (a failed migration): the queue reports `InvalidVa` and runs no more work.
    InvalidVa {
        /// The buffer's GPU VA.
        va: u64,
    },
}

impl core::fmt::Display for LostReason {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            LostReason::Fault(r) => write!(f, "{r}"),
            LostReason::Destroyed => f.write_str("destroyed"),
            LostReason::DoorbellAborted(s) => write!(f, "doorbell aborted (queue {s:?})"),
            LostReason::InvalidVa { va } => write!(f, "its ring memory at {va:#x} lost its GPU mapping"),
        }
    }
}

/// What a refused call found still in use ([`KernelError::InUse`]).
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InUseObject {
    /// An object of a process.
    Handle(AnyHandle),
    /// The device (the adapter) as a whole.
    Adapter,
}

impl core::fmt::Display for InUseObject {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            InUseObject::Handle(h) => write!(f, "{h}"),
            InUseObject::Adapter => f.write_str("the device"),
        }
    }
}

/// What holds an object in use ([`KernelError::InUse`]).
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InUseBy {
    /// This queue runs from it (its ring, pointers or metadata live there).
    Queue(HwQueueHandle),
    /// This doorbell references it; `queue` is the doorbell's queue.
    Doorbell {
        /// The doorbell.
        doorbell: DoorbellHandle,
        /// Its queue, when the doorbell is still listed.
        queue: Option<HwQueueHandle>,
    },
    /// This queue has work in flight (entering D3 needs an idle device).
    WorkInFlight(HwQueueHandle),
}

impl core::fmt::Display for InUseBy {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            InUseBy::Queue(q) => write!(f, "{q}, which runs from it"),
            InUseBy::Doorbell { queue: Some(q), .. } => write!(f, "the doorbell of {q}"),
            InUseBy::Doorbell { doorbell, queue: None } => write!(f, "{doorbell}"),
            InUseBy::WorkInFlight(q) => {
                write!(f, "{q} of {}, which has work in flight (D3 needs an idle device)", q.owner())
            }
        }
    }
}

#[cfg(test)]
mod error_display_tests {
    use super::*;

    /// The errors that now carry data print the sentences they printed as text.
    #[test]
    fn data_carrying_errors_read_as_their_text_did() {
        let q = HwQueueHandle::new(ProcessId(2), 1, 3);
        let a = AllocationHandle::new(ProcessId(2), 4, 1);
        let d = DoorbellHandle::new(ProcessId(2), 0, 2);
        let e = KernelError::BadHandle { handle: q.into(), problem: HandleProblem::Stale };
        assert_eq!(e.to_string(), "queue#1.g3@p2: handle was destroyed");
        let e = KernelError::InUse { object: InUseObject::Handle(a.into()), by: InUseBy::Queue(q) };
        assert_eq!(e.to_string(), "allocation#4.g1@p2 is in use by queue#1.g3@p2, which runs from it");
        let e = KernelError::InUse {
            object: InUseObject::Handle(a.into()),
            by: InUseBy::Doorbell { doorbell: d, queue: Some(q) },
        };
        assert_eq!(e.to_string(), "allocation#4.g1@p2 is in use by the doorbell of queue#1.g3@p2");
        let e = KernelError::InUse { object: InUseObject::Adapter, by: InUseBy::WorkInFlight(q) };
        assert_eq!(
            e.to_string(),
            "the device is in use by queue#1.g3@p2 of p2, which has work in flight (D3 needs an idle device)"
        );
        let e = KernelError::InvalidArgument {
            field: "va",
            value: "0x1000+0x2000".into(),
            reason: Invalid::Device(DeviceRefusal::MappingOverlap { va: 0x1000, bytes: 0x2000 }),
        };
        assert_eq!(e.to_string(), "`va` = 0x1000+0x2000: GPU mapping 0x1000+0x2000 overlaps an existing mapping");
    }
}

/// Everything a kernel call can refuse. Each message names the field or handle and its value.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum KernelError {
    /// A foreign, stale or unknown handle.
    #[error("{handle}: handle {problem}")]
    BadHandle {
        /// The handle.
        handle: AnyHandle,
        /// What is wrong with it.
        problem: HandleProblem,
    },
    /// An argument outside its domain.
    #[error("`{field}` = {value}: {reason}")]
    InvalidArgument {
        /// Field name.
        #[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))]
        field: crate::StaticStr,
        /// Value as text.
        value: String,
        /// Why, as data.
        reason: Invalid,
    },
    /// A GPU VA range that does not lie inside one mapping of the process.
    #[error("`{field}` = {va:#x} (+{bytes:#x} bytes) does not lie inside one mapping of the process")]
    OutsideMappings {
        /// Field name.
        #[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))]
        field: crate::StaticStr,
        /// Address.
        va: u64,
        /// Length.
        bytes: u64,
    },
    /// An object is still referenced.
    #[error("{object} is in use by {by}")]
    InUse {
        /// The object.
        object: InUseObject,
        /// What references it.
        by: InUseBy,
    },
    /// The queue cannot run work any more.
    #[error("{queue} is lost: {reason}")]
    QueueLost {
        /// The queue.
        queue: HwQueueHandle,
        /// Why.
        reason: LostReason,
    },
    /// A call for the other submission model.
    #[error("{queue} is a {actual} queue; this call needs a {expected} queue")]
    WrongQueueMode {
        /// The queue.
        queue: HwQueueHandle,
        /// What it is.
        #[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))]
        actual: crate::StaticStr,
        /// What the call needs.
        #[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))]
        expected: crate::StaticStr,
    },
    /// A pool ran dry.
    #[error("out of {what} ({detail})")]
    Exhausted {
        /// The pool.
        #[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))]
        what: crate::StaticStr,
        /// Details.
        detail: String,
    },
    /// A kernel-mode submission failed validation.
    #[error("command buffer: packet at dword {offset}: {error}")]
    BadPacket {
        /// Dword offset in the submission.
        offset: usize,
        /// Decode error.
        error: DecodeError,
    },
    /// A progress value that does not move forward.
    #[error("`{field}` = {value} does not move forward from {last}")]
    NotIncreasing {
        /// Field.
        #[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))]
        field: crate::StaticStr,
        /// Value given.
        value: u64,
        /// Last value.
        last: u64,
    },
    /// A fence log that does not decode (overrun is not corruption: it is reported as lost
    /// entries).
    #[error("{queue}: fence log: {reason}")]
    CorruptLog {
        /// The queue.
        queue: HwQueueHandle,
        /// Why.
        reason: crate::fence_log::LogError,
    },
    /// The device is in error (lost): its fences are always signalled and waits on them end
    /// with this error.
    #[error("{device} is lost (in error): its fences read as always signalled")]
    DeviceLost {
        /// The device.
        device: DeviceHandle,
    },
    /// The adapter recovered from timeouts more than `TdrLimitCount` times within
    /// `TdrLimitTime` and is lost for good: every device on it is lost, and it takes no new
    /// work.
    #[error("the adapter is lost: {recoveries} recoveries within {window_ms} ms exceed the TDR limit")]
    AdapterLost {
        /// Recoveries counted in the window.
        recoveries: u32,
        /// The window (`TdrLimitTime`, ms).
        window_ms: u64,
    },
    /// The process was terminated.
    #[error("process {0} has been terminated")]
    ProcessTerminated(ProcessId),
    /// Shared memory failed.
    #[error("shared memory: {0}")]
    Shm(#[from] shm::ShmError),
    /// Adapter initialization failed: the KMD and the OS disagree on a feature (spec 002: "The
    /// OS fails adapter initialization if KMD advertises native fence support when the OS
    /// hasn't enabled the feature").
    #[error("adapter initialization: {feature}: the KMD advertises {kmd}, the OS has {os}")]
    FeatureMismatch {
        /// The feature (or cap).
        #[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))]
        feature: crate::StaticStr,
        /// What the KMD advertised.
        kmd: String,
        /// What the OS enabled (or what the KMD's other caps imply).
        os: String,
    },
}

/// `DXGK_NATIVE_FENCE_CAPS` with the related `DXGK_VIDSCHCAPS` bits: what the KMD reports
/// about native fences (spec 002 "Native fence capabilities"), checked by the OS at adapter
/// initialization and answered to user mode by [`KernelPort::native_fence_caps`].
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NativeFenceCaps {
    /// `DXGK_VIDSCHCAPS::NativeGpuFence`: native fences are supported (advertised only when
    /// the OS enabled `DXGK_FEATURE_NATIVE_FENCE`).
    pub supported: bool,
    /// `DXGK_VIDSCHCAPS::OptimizedNativeFenceSignaledInterrupt`: a logged signal's interrupt
    /// names the queue, and the OS reads its log.
    pub optimized_interrupt: bool,
    /// `DXGK_NATIVE_FENCE_CAPS::MapToGpuSystemProcess`: the OS also maps each fence's
    /// CurrentValue and MonitoredValue into the GPU system (paging) process, for the CMP.
    pub map_to_gpu_system_process: bool,
    /// Bytes between two non-shareable fences' CurrentValues in a packed page.
    pub current_value_stride: u64,
    /// Bytes between their MonitoredValues.
    pub monitored_value_stride: u64,
}

/// The OS's answer to the KMD's `IsFeatureEnabled` queries (`DXGKCB_FEATURE_NATIVEFENCE_CAPS_1`
/// and friends), given to the KMD during adapter initialization.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OsFeatures {
    /// `DXGK_FEATURE_NATIVE_FENCE` is enabled.
    pub native_fence: bool,
}

impl Default for OsFeatures {
    fn default() -> Self {
        OsFeatures { native_fence: true }
    }
}

/// The system-call surface of the kernel, for one process.
///
/// Every method is a "kernel call": it may take locks and block. The UMD keeps them off its
/// submission hot path except where the spec puts them there (connect after a disconnect,
/// `NotifyWorkSubmission` on `ConnectedNotify`, blocking waits).
pub trait KernelPort: Send + Sync {
    /// The calling process.
    fn process(&self) -> ProcessId;
    /// Adapter capabilities (`DxgkDdiQueryAdapterInfo`, amdgpu INFO).
    fn adapter_info(&self) -> AdapterInfo;
    /// The native fence caps the adapter's KMD reported and the OS accepted
    /// ([`NativeFenceCaps`]: packing stride, the optimized signaled interrupt,
    /// `MapToGpuSystemProcess`). The UMD reads them once when it opens a device: with the
    /// optimized interrupt, the OS learns of a user-mode queue's signals from its signal log,
    /// so the UMD logs every one (`umd::Queue::submit`).
    fn native_fence_caps(&self) -> Result<NativeFenceCaps, KernelError>;
    /// `D3DKMTCreateDevice`.
    fn create_device(&self) -> Result<DeviceHandle, KernelError>;
    /// `D3DKMTDestroyDevice`: destroys everything the device owns, in the spec's order.
    fn destroy_device(&self, device: DeviceHandle) -> Result<(), KernelError>;
    /// Allocates memory and maps it into the process's GPU address space.
    fn allocate(&self, device: DeviceHandle, desc: &AllocationDesc) -> Result<AllocationInfo, KernelError>;
    /// Maps an allocation into the caller's CPU address space (`D3DKMTLock2`).
    fn map_allocation(&self, allocation: AllocationHandle) -> Result<shm::Mapping, KernelError>;
    /// Frees an allocation. Refused while a doorbell references it.
    fn free(&self, allocation: AllocationHandle) -> Result<(), KernelError>;
    /// Creates a hardware context on an engine.
    fn create_context(&self, device: DeviceHandle, engine: EngineId) -> Result<ContextHandle, KernelError>;
    /// Destroys a context and its queues.
    fn destroy_context(&self, context: ContextHandle) -> Result<(), KernelError>;
    /// `D3DKMTCreateHwQueue` / USERQ CREATE: validates and creates a queue.
    fn create_hw_queue(&self, context: ContextHandle, desc: &HwQueueDesc) -> Result<HwQueueInfo, KernelError>;
    /// Destroys a queue: its doorbell is disconnected and destroyed, then the firmware drops
    /// the queue at once — work not yet executed is discarded (wait for the queue's progress
    /// fence first to keep it). The spec's normal and abnormal process-termination sequences
    /// come with the lifecycle work (roadmap item 4).
    fn destroy_hw_queue(&self, queue: HwQueueHandle) -> Result<(), KernelError>;
    /// Allocates a doorbell page for the process's user-mode queues (spec 001: "They would
    /// also allocate a doorbell page for the doorbells used by the user queues"; amdgpu's
    /// doorbell BO). A queue uses it by naming it in [`QueueDescriptor::doorbell_page_va`],
    /// with the doorbell index it wants there. A process holds at most
    /// [`MAX_DOORBELL_PAGES`] pages, the one the kernel gave it included.
    fn create_doorbell_page(&self, device: DeviceHandle) -> Result<DoorbellPageInfo, KernelError>;
    /// Frees a doorbell page; refused while a queue uses it. The page stays the process's
    /// (cleared) until it ends, so no stale mapping of it reaches another process.
    fn destroy_doorbell_page(&self, page: DoorbellPageHandle) -> Result<(), KernelError>;
    /// `D3DKMTCreateDoorbell`: the doorbell starts disconnected, its CPU page on the dummy page.
    fn create_doorbell(&self, args: &CreateDoorbell) -> Result<DoorbellInfo, KernelError>;
    /// `D3DKMTConnectDoorbell`: wakes the engine if needed and connects.
    fn connect_doorbell(&self, queue: HwQueueHandle) -> Result<(), KernelError>;
    /// `D3DKMTDestroyDoorbell`.
    fn destroy_doorbell(&self, doorbell: DoorbellHandle) -> Result<(), KernelError>;
    /// `D3DKMTNotifyWorkSubmission`.
    fn notify_work_submission(&self, doorbell: DoorbellHandle) -> Result<(), KernelError>;
    /// `D3DKMTSubmitCommand`: the kernel-mode path. `words` is a packet stream; its
    /// `PROGRESS_FENCE` values must increase.
    fn submit_command(&self, queue: HwQueueHandle, words: &[u32]) -> Result<(), KernelError>;
    /// Blocks until the queue's progress fence reaches `value`, or the timeout passes. A hung
    /// queue ends the wait with [`KernelError::QueueLost`].
    fn wait_progress(
        &self,
        queue: HwQueueHandle,
        value: u64,
        timeout: Option<Duration>,
    ) -> Result<WaitOutcome, KernelError>;
    /// `USERQ QUERY_STATUS`.
    fn query_queue(&self, queue: HwQueueHandle) -> Result<QueueStatus, KernelError>;
    /// `D3DKMTCreateNativeFence`.
    fn create_native_fence(&self, device: DeviceHandle, desc: &NativeFenceDesc)
    -> Result<NativeFenceInfo, KernelError>;
    /// Opens a fence another process shared, by its global handle; this process gets its own
    /// local handle. A fence that was not created shareable cannot be opened.
    fn open_native_fence(&self, device: DeviceHandle, global: u64) -> Result<NativeFenceInfo, KernelError>;
    /// Opens a cross-adapter fence created on another adapter (spec 002): the same
    /// CurrentValue storage, mapped on this adapter. On an adapter without native fences it
    /// opens as a monitored fence.
    fn open_cross_adapter_fence(&self, device: DeviceHandle, handle: u64) -> Result<NativeFenceInfo, KernelError>;
    /// Destroys (closes) a native fence; its waiters in this process end with an error. A
    /// shared fence lives on while another process has it open.
    fn destroy_native_fence(&self, fence: NativeFenceHandle) -> Result<(), KernelError>;
    /// `D3DKMTSignalSynchronizationObjectFromCpu`: sets CurrentValue. A value below the current
    /// one is refused.
    fn signal_native_fence(&self, fence: NativeFenceHandle, value: u64) -> Result<(), KernelError>;
    /// `D3DKMTWaitForSynchronizationObjectFromCpu`: blocks until the fences reach their values
    /// (all, or any), or the timeout passes. `Reached(i)` carries, for [`WaitMode::Any`], the
    /// index of a fence that was reached (0 for [`WaitMode::All`]).
    fn wait_native_fences(
        &self,
        fences: &[(NativeFenceHandle, u64)],
        mode: WaitMode,
        timeout: Option<Duration>,
    ) -> Result<WaitOutcome, KernelError>;
    /// Reads a native fence's CurrentValue and MonitoredValue (spec 002), for tests and tools
    /// that observe the MonitoredValue protocol. A diagnostic query: user mode has no other
    /// access to MonitoredValue, and nothing here changes either value.
    fn query_native_fence(&self, fence: NativeFenceHandle) -> Result<NativeFenceValues, KernelError>;
    /// Which physical doorbell a queue holds now (spec 000 "Doorbells"): `None` while its
    /// doorbell is disconnected (never connected, victimized, its engine in F1) or it has none.
    /// A kernel-mode queue reports the kernel's doorbell the KMD rings for it. For tests and
    /// tools that observe victimization.
    fn query_physical_doorbell(&self, queue: HwQueueHandle) -> Result<Option<PhysicalDoorbell>, KernelError>;
    /// amdgpu `USERQ_SIGNAL` (spec 001): once user-mode queue `queue` completes its work up to
    /// progress value `point`, the kernel signals each fence to its value — so a kernel-mode
    /// queue, a CPU waiter or another process can depend on a user queue's work. `point` may
    /// not pass the queue's last-queued value. The default refuses (a port without it).
    fn userq_signal(
        &self,
        queue: HwQueueHandle,
        point: u64,
        fences: &[(NativeFenceHandle, u64)],
    ) -> Result<(), KernelError> {
        let _ = (point, fences);
        Err(KernelError::InvalidArgument {
            field: "queue",
            value: queue.to_string(),
            reason: Invalid::Unsupported("USERQ_SIGNAL"),
        })
    }
    /// amdgpu `USERQ_WAIT` (spec 001): validates the sync objects user-mode queue `queue`
    /// should wait on and answers, for each, the GPU VA and value its `WAIT` packet uses
    /// (`umd::CommandBuffer::wait_points`). Kernel-mode queues' progress fences are sync objects
    /// too. The default refuses.
    fn userq_wait(&self, queue: HwQueueHandle, objects: &[SyncWait]) -> Result<Vec<WaitPoint>, KernelError> {
        let _ = objects;
        Err(KernelError::InvalidArgument {
            field: "queue",
            value: queue.to_string(),
            reason: Invalid::Unsupported("USERQ_WAIT"),
        })
    }
    /// The queue's progress fence as a native fence (spec 002 "Indicating a native progress
    /// fence for hardware queues"): CPU waits on it are native fence waits (MonitoredValue, a
    /// conditional interrupt), GPU waits park on it. Only the engine writes it: a CPU signal
    /// is refused. It goes with its queue. The default refuses.
    fn open_progress_fence(&self, queue: HwQueueHandle) -> Result<NativeFenceInfo, KernelError> {
        Err(KernelError::InvalidArgument {
            field: "queue",
            value: queue.to_string(),
            reason: Invalid::Unsupported("native progress fences"),
        })
    }
}

/// A sync object a user-mode queue waits on through `USERQ_WAIT` (spec 001): a native fence,
/// or a queue's progress fence — a kernel-mode queue's included, which is how user and kernel
/// queues interoperate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum SyncWait {
    /// A native fence reaching `value`.
    Fence {
        /// The fence.
        fence: NativeFenceHandle,
        /// The value.
        value: u64,
    },
    /// A queue's progress fence reaching `value`.
    QueueProgress {
        /// The queue (user- or kernel-mode).
        queue: HwQueueHandle,
        /// The progress value.
        value: u64,
    },
}

/// What `USERQ_WAIT` answers for one sync object: the GPU VA the queue's `WAIT` packet reads
/// and the value it waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct WaitPoint {
    /// GPU VA of the 64-bit value (readable by the queue's engine).
    pub va: u64,
    /// The value to wait for (`WAIT` passes when the word is at least this).
    pub value: u64,
}

/// A native fence's two values ([`KernelPort::query_native_fence`]).
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NativeFenceValues {
    /// CurrentValue: the last value signalled.
    pub current: u64,
    /// MonitoredValue: the lowest value a CPU waits for, minus 1; `u64::MAX` with no waiter;
    /// 0 for a fence whose every signal interrupts (legacy monitored, cross-adapter).
    pub monitored: u64,
}

/// The physical doorbell a queue holds ([`KernelPort::query_physical_doorbell`]).
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PhysicalDoorbell {
    /// A dedicated doorbell: a word of the doorbell BAR.
    BarIndex(u32),
    /// The global doorbell model: a bit of a BAR page of doorbell bits.
    Bit {
        /// The BAR page.
        page: u32,
        /// The bit.
        bit: u32,
    },
}
