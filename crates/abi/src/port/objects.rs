//! What the memory, queue and doorbell calls take and answer: allocations, hardware queues
//! and their status, doorbell pages and doorbells (spec 000 "User-mode work submission
//! APIs", spec 001 "IOCTL Interfaces").
//!
//! A created queue, a created doorbell and a created fence hand out shared memory; their
//! types are generic over its representation ([`Memory`]), in-process ([`Local`], the
//! default) or across the daemon's socket.

use super::memory::{Local, Memory};
use crate::handle::{AllocationHandle, DoorbellHandle, DoorbellPageHandle, HwQueueHandle};
use crate::queue::{EngineId, FaultRecord, Priority, QueueDescriptor, QueueState};

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

/// A created hardware queue. Its kernel page is shared memory, a `P`: in-process a mapping
/// ([`Memory::Mapping`]).
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HwQueueInfo<P = <Local as Memory>::Mapping> {
    /// Its handle.
    pub handle: HwQueueHandle,
    /// Its engine.
    pub engine: EngineId,
    /// The queue's kernel page ([`crate::queue::QueueKernelPage`]), mapped read-only.
    pub kernel_page: P,
    /// Where the kernel page is mapped (read-only) in the process's GPU address space, so
    /// other queues can `WAIT` on this queue's progress.
    pub kernel_page_va: u64,
}

/// A doorbell page the application allocated
/// ([`create_doorbell_page`](crate::port::KernelPort::create_doorbell_page)).
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
    /// ([`EngineInfo::doorbell_first`](crate::port::EngineInfo::doorbell_first)).
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

/// A created doorbell. Its pages are shared memory: its CPU page a `D`, the aggregated
/// doorbell's page an `A` (in-process, rotating pages: [`Memory::DoorbellPage`],
/// [`Memory::AggregatedPage`]).
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, PartialEq, Eq)]
pub struct DoorbellInfo<D = <Local as Memory>::DoorbellPage, A = <Local as Memory>::AggregatedPage> {
    /// Its handle.
    pub handle: DoorbellHandle,
    /// `DoorbellCPUVirtualAddress`: the page the kernel rotates between the BAR and a dummy.
    pub cpu_page: D,
    /// Offset of this queue's doorbell word inside `cpu_page`.
    pub offset: u64,
    /// How to ring that word.
    pub ring: crate::doorbell::RingMethod,
    /// The aggregated doorbell, when the device needs one: the page (never rotated), the
    /// offset of this queue's engine's word in it and the value to OR in.
    pub aggregated: Option<AggregatedDoorbell<A>>,
    /// The doorbell's GPU VA in the process's own address space (spec 001: "the GPU [can]
    /// submit work to itself"): another queue of the process rings it from the GPU by
    /// writing the new wptr there (`WRITE_DATA`), after writing the wptr word, and then the
    /// aggregated doorbell where there is one ([`AggregatedDoorbell::gpu_va`]). `None` where a
    /// plain store from the GPU cannot ring (global doorbell bits, a victimized pool).
    pub gpu_va: Option<u64>,
}

/// Where a client rings the aggregated doorbell (its page a `P`, in-process a rotating page).
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, PartialEq, Eq)]
pub struct AggregatedDoorbell<P = <Local as Memory>::AggregatedPage> {
    /// The process's aggregated doorbell page (the kernel rotates it to a dummy page when the
    /// process ends, so a late write cannot reach the page's next owner).
    pub page: P,
    /// Offset of the engine's word.
    pub offset: u64,
    /// What the CPU ORs into it (any non-zero value rings).
    pub mask: u64,
    /// The word's GPU VA: the kernel maps the page into the process's address space too
    /// (spec 001: "the kernel driver will map a page of aggregated doorbell space into each
    /// GPUVM space"), where a plain store rings it. `None` where the device does not map it.
    pub gpu_va: Option<u64>,
}

impl<D, A> core::fmt::Debug for DoorbellInfo<D, A> {
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

/// The physical doorbell a queue holds
/// ([`query_physical_doorbell`](crate::port::KernelPort::query_physical_doorbell)).
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
