//! The process table's records: a process and every object it owns — devices, contexts,
//! allocations, queues, doorbells, doorbell pages, native fences — and its memory.
//!
//! These are data, with the few helpers that read one record: the concerns that act on them
//! are their owners ([`super::fences`], [`super::doorbells`], [`super::km`], …), which reach
//! the table through [`super::shared::Shared`]. Nothing here imports an owner, so every owner
//! can import the records.
//!
//! # Memory
//!
//! A process's memory comes from three pools of memfd arenas ([`ProcessMemory`], built on
//! [`shm::ShmPool`]): its allocations, the kernel pages it may read (queue kernel pages,
//! fence CurrentValue pages), and the pages it must not see (fence logs, MonitoredValue
//! pages, kernel-mode rings). An allocation is a page range of an arena, not a memfd of its
//! own, so a queue costs no descriptor and the client's view of an allocation is a window
//! onto the arena's one mapping. Arenas are never shared between processes or between
//! classes, because a descriptor reaches its whole file.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use abi::handle::{
    AllocationKind, ContextKind, DeviceKind, DoorbellKind, DoorbellPageKind, HwQueueKind, NativeFenceKind,
};
use abi::port::{KernelError, MemoryDomain, NativeFenceType, WaitMode};
use abi::queue::{FaultRecord, QueueDescriptor};
use abi::ring::RingControlView;
use abi::{
    AllocationHandle, ContextHandle, DeviceHandle, DoorbellHandle, EngineId, HwQueueHandle, NativeFenceHandle,
    ProcessId,
};
use abi::{QueueState, Time};
use shm::{PoolConfig, RotatingPage, Shm, ShmPool, Word};

use super::waits::{WaitId, Waits};
use crate::ddi::GpuMapping;
use crate::pool::{Lease, Pool};
use crate::table::Table;

/// A device; `error` once it is lost (its fences then read as always signalled).
#[derive(Default)]
pub(super) struct DeviceObj {
    pub(super) error: bool,
}

pub(super) struct ContextObj {
    pub(super) device: DeviceHandle,
    pub(super) engine: EngineId,
    pub(super) software_queue: VecDeque<KmSubmission>,
    /// Suspended (`DxgkddiSuspendContext`): its queues are off the run list.
    pub(super) suspended: bool,
}

/// Why an allocation cannot be freed: the kernel's references to a queue's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pin {
    /// A queue runs from it (ring, rptr, wptr or last-queued), from creation to destruction.
    Queue(HwQueueHandle),
    /// A doorbell references it (spec 000 "Residency model").
    Doorbell(DoorbellHandle),
}

pub(super) struct AllocObj {
    pub(super) device: DeviceHandle,
    pub(super) shm: Arc<Shm>,
    pub(super) va: u64,
    pub(super) bytes: u64,
    pub(super) pins: Vec<Pin>,
    /// Where it lives.
    pub(super) domain: MemoryDomain,
    /// A local allocation evicted to system memory for D3 (contents preserved).
    pub(super) evicted: bool,
    /// Its GPU mapping (unmapped when the allocation goes); `None` once a failed migration
    /// took it out ([`super::migrate`]).
    pub(super) mapping: Option<GpuMapping>,
}

impl AllocObj {
    pub(super) fn holds(&self, va: u64, bytes: u64) -> bool {
        va >= self.va && va.checked_add(bytes).is_some_and(|e| e <= self.va + self.bytes)
    }
}

pub(super) struct QueueObj {
    pub(super) context: ContextHandle,
    pub(super) engine: EngineId,
    pub(super) kernel_page: abi::queue::KernelPageView<shm::Word>,
    /// The kernel page's GPU mapping.
    pub(super) _kernel_page_mapping: GpuMapping,
    pub(super) mode: QueueMode,
    pub(super) doorbell: Option<DoorbellHandle>,
    /// CPU waiters on the progress fence: (value, wait).
    pub(super) waiters: Vec<(u64, WaitId)>,
    /// Its state as the OS owns it; changed only by [`Shared::set_state`](super::shared::Shared::set_state).
    pub(super) life: QueueLife,
    /// The fence logs `[waits, signals]` (user-mode queues).
    pub(super) logs: Option<[Arc<Shm>; 2]>,
    /// Entries of the signal log the interrupt service has read.
    pub(super) signal_log_seen: u64,
    /// The adapter resets before the queue was created ([`QueueStatus::flags`]'s VRAM_LOST).
    ///
    /// [`QueueStatus::flags`]: abi::port::QueueStatus::flags
    pub(super) adapter_resets: u64,
    /// The hang timer (amdgpu): the completed progress value last seen with work outstanding,
    /// since when it has not moved, and how long the queue had run when it was first seen.
    pub(super) progress_seen: Option<Stall>,
    /// Held off its engine by a caller's preemption request
    /// ([`Os::preempt_queue`](super::Os::preempt_queue)) until
    /// [`Os::resume_queue`](super::Os::resume_queue): no other resume (its context's, the
    /// return to D0, a migration's, the hang timer's) puts it back on the run list.
    pub(super) held: bool,
    /// Pending `USERQ_SIGNAL`s (`calls/userq.rs`).
    pub(super) signal_on: Vec<PendingSignal>,
    /// Its progress fence as a native fence, once opened
    /// ([`Os::open_progress_fence`](super::Os::open_progress_fence)).
    pub(super) progress_fence: Option<abi::NativeFenceHandle>,
}

impl QueueObj {
    pub(super) fn completed(&self) -> u64 {
        // Acquire: pairs with the engine's release store in PROGRESS_FENCE.
        self.kernel_page.progress_completed().get().load(Ordering::Acquire)
    }
    /// `Ok` while the queue can run work; `QueueLost` with its fault record once it is hung.
    pub(super) fn live(&self, h: HwQueueHandle) -> Result<(), KernelError> {
        match &self.life {
            QueueLife::Live => Ok(()),
            QueueLife::Hung(fault) => {
                Err(KernelError::QueueLost { queue: h, reason: abi::port::LostReason::Fault(fault.clone()) })
            }
            &QueueLife::InvalidVa { va } => {
                Err(KernelError::QueueLost { queue: h, reason: abi::port::LostReason::InvalidVa { va } })
            }
        }
    }
    pub(super) fn user_desc(&self) -> Option<&QueueDescriptor> {
        match &self.mode {
            QueueMode::User { desc, .. } => Some(desc),
            QueueMode::Kernel(_) => None,
        }
    }
}

/// A queue's state as the OS owns it: the one record of its transitions
/// ([`Shared::set_state`](super::shared::Shared::set_state) makes them, and publishes each in
/// the client's state word) and the one source of its status answer ([`QueueLife::status`]).
///
/// The OS derives `Hung` and keeps the fault record that caused it, whoever found the fault
/// (the device's interrupt, or the OS itself, e.g. a doorbell it could not ring). While the
/// queue is live, where it runs (`Mapped`, `Unmapped`, `Preempted`: which queues hold the
/// hardware slots) is the device scheduler's moment-to-moment business, which the device
/// reports on request and never as a transition; the status asks it only then.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum QueueLife {
    /// Created and not faulted.
    Live,
    /// Hung, with the record of why. Final: a hung queue runs no more work.
    Hung(FaultRecord),
    /// Its ring, rptr, wptr or last-queued word lies in a buffer whose GPU mapping went away
    /// (amdgpu's `AMDGPU_USERQ_STATE_INVALID_VA`): it runs no more work; the UMD recreates it.
    InvalidVa {
        /// The start of the buffer that lost its mapping.
        va: u64,
    },
}

impl QueueLife {
    /// The word the client reads in the queue's kernel page.
    pub(super) fn published(&self) -> QueueState {
        match self {
            QueueLife::Live => QueueState::Mapped,
            QueueLife::Hung(_) => QueueState::Hung,
            QueueLife::InvalidVa { .. } => QueueState::InvalidVa,
        }
    }

    /// The status answer: a hung queue's state and record; a live queue's residency, as the
    /// device reports it (`Unmapped` if it reports none).
    pub(super) fn status(&self, residency: impl FnOnce() -> Option<QueueState>) -> (QueueState, Option<FaultRecord>) {
        match self {
            QueueLife::Live => (residency().unwrap_or(QueueState::Unmapped), None),
            QueueLife::Hung(fault) => (QueueState::Hung, Some(fault.clone())),
            QueueLife::InvalidVa { .. } => (QueueState::InvalidVa, None),
        }
    }
}

pub(super) struct DoorbellObj {
    pub(super) queue: HwQueueHandle,
    pub(super) ring_buffer: AllocationHandle,
    pub(super) ring_control: AllocationHandle,
    pub(super) page: Arc<RotatingPage>,
    pub(super) connected: bool,
}

/// A doorbell page the application allocated ([`Os::create_doorbell_page`](super::Os::create_doorbell_page)).
pub(super) struct DoorbellPageObj {
    pub(super) device: DeviceHandle,
    /// Where it is named (and mapped, with `gpu`) in the process's GPU address space.
    pub(super) va: u64,
    /// Its GPU mapping, where the device allows GPU rings. Before `lease`: unmapped first.
    pub(super) gpu: Option<GpuMapping>,
    /// The BAR page.
    pub(super) lease: Lease,
}

/// A process's aggregated doorbell page (spec 001): mapped once for the CPU, and into its
/// GPU address space where the device lets the GPU ring it.
pub(super) struct AggregatedPage {
    /// Its GPU VA and mapping. Before `lease`: unmapped first.
    pub(super) gpu: Option<(u64, GpuMapping)>,
    /// The CPU mapping clients ring.
    pub(super) cpu: Arc<RotatingPage>,
    /// The BAR page.
    pub(super) lease: Lease,
}

pub(super) struct Process {
    /// Its doorbell page mapped into its own GPU address space (VA, mapping), where the device
    /// allows queues to ring doorbells from the GPU. First, so it is unmapped before the page
    /// lease returns.
    pub(super) doorbell_gpu: Option<(u64, GpuMapping)>,
    /// Its doorbell BAR page.
    pub(super) doorbell_page: Lease,
    /// The doorbell pages it allocated (spec 001).
    pub(super) doorbell_pages: Table<DoorbellPageKind, DoorbellPageObj>,
    /// BAR pages of doorbell pages it freed, cleared: they stay its own until it ends (a
    /// stale mapping of one can reach only its own queues) and are given back to it first.
    pub(super) freed_doorbell_pages: Vec<Lease>,
    /// The process's aggregated doorbell page (when the device needs one).
    pub(super) aggregated: Option<AggregatedPage>,
    pub(super) next_va: u64,
    pub(super) devices: Table<DeviceKind, DeviceObj>,
    pub(super) contexts: Table<ContextKind, ContextObj>,
    pub(super) queues: Table<HwQueueKind, QueueObj>,
    pub(super) allocations: Table<AllocationKind, AllocObj>,
    pub(super) doorbells: Table<DoorbellKind, DoorbellObj>,
    pub(super) fences: Table<NativeFenceKind, FenceObj>,
    pub(super) fence_pages: Vec<FencePage>,
    /// Its memory, in pools by protection class.
    pub(super) memory: ProcessMemory,
}

impl Process {
    pub(super) fn take_va(&mut self, bytes: u64) -> u64 {
        let va = self.next_va;
        // One unmapped guard page between allocations catches small overruns as faults.
        self.next_va += bytes + 4096;
        va
    }
}
/// How a queue is fed.
pub(super) enum QueueMode {
    /// By its client, through its ring and doorbell.
    User {
        /// The validated descriptor (doorbell index resolved).
        desc: QueueDescriptor,
        /// The client's last-queued word, when it lies in one of the process's allocations
        /// (the queue pins it); reported, never trusted.
        last_queued: Option<shm::ReadWord>,
    },
    /// By the kernel-mode scheduler.
    Kernel(KernelRing),
}

/// A kernel-mode queue's kernel-owned ring.
pub(super) struct KernelRing {
    pub(super) ring: Arc<Shm>,
    pub(super) control: RingControlView,
    /// Its kernel doorbell.
    pub(super) doorbell: Lease,
    /// The kernel's own wptr and last-queued progress value.
    pub(super) wptr: u64,
    pub(super) last_queued: u64,
    /// The kernel's own paging queue: every buffer on it is a paging buffer (spec 003's
    /// resubmission rule keeps their fence IDs and runs them first).
    pub(super) paging: bool,
    /// Buffers on the ring not yet known complete, oldest first ([`super::km`]).
    pub(super) inflight: VecDeque<InFlight>,
    pub(super) _mappings: [GpuMapping; 2],
}
/// A validated command buffer on a context's software queue.
pub(super) struct KmSubmission {
    pub(super) queue: HwQueueHandle,
    pub(super) words: Vec<u32>,
    /// The submission's `WAIT`s on native fences: the scheduler holds it back until they pass.
    pub(super) waits: Vec<(abi::NativeFenceHandle, u64)>,
    /// The scheduler's registration on those fences while it waits.
    pub(super) pending: Option<Arc<FenceWait>>,
    /// A paging buffer (the kernel's own copy work): moved before any non-paging buffer on
    /// its engine.
    pub(super) paging: bool,
    /// The fence ID it keeps (a resubmitted paging buffer); `None`: a new one when it moves.
    pub(super) fence_id: Option<u64>,
}

/// A kernel-mode buffer on its queue's ring, not yet known complete.
pub(super) struct InFlight {
    /// Its submission fence ID.
    pub(super) fence_id: u64,
    /// A paging buffer.
    pub(super) paging: bool,
    /// Where it lies on the ring (byte offsets, like rptr and wptr).
    pub(super) start: u64,
    pub(super) end: u64,
    /// Its packets, for a resubmission.
    pub(super) words: Vec<u32>,
}
/// What the hang timer knows of a queue with work outstanding (module docs): its completed
/// progress value, since when it has not moved (the wall window, restarted by each check the
/// queue answered), and how long the queue had run when the value was first seen (the
/// running window's start, kept until the value moves).
#[derive(Clone, Copy, Debug)]
pub(super) struct Stall {
    pub(super) value: u64,
    pub(super) since: Time,
    /// [`Kmd::queue_run_time`] when `value` was first seen (`None`: the device does not say).
    pub(super) ran_at: Option<Duration>,
}

impl Stall {
    /// How long the queue has run since its progress value last moved, given its run time
    /// now.
    pub(super) fn ran(&self, run: Option<Duration>) -> Option<Duration> {
        Some(run?.saturating_sub(self.ran_at?))
    }
}
/// A pending `USERQ_SIGNAL`: when the queue's progress reaches `point`, signal `fences`.
pub(super) struct PendingSignal {
    pub(super) point: u64,
    pub(super) fences: Vec<(NativeFenceHandle, u64)>,
}
/// A CPU wait on several fences.
pub(super) struct FenceWait {
    pub(super) conds: Vec<(NativeFenceHandle, u64)>,
    pub(super) mode: WaitMode,
    pub(crate) wait: WaitId,
    /// Registered by the kernel-mode scheduler for a submission's `WAIT`, not by a thread:
    /// nobody ends it, so its result is not kept.
    pub(crate) scheduler: bool,
}

impl FenceWait {
    /// The kernel-mode scheduler's wait for a held-back submission's fences.
    /// The wait belongs to `pid`, whose submission it holds back: it ends with the process.
    pub(super) fn for_scheduler(
        waits: &mut Waits,
        pid: ProcessId,
        conds: Vec<(NativeFenceHandle, u64)>,
    ) -> Arc<FenceWait> {
        Arc::new(FenceWait { conds, mode: WaitMode::All, wait: waits.open_for(pid), scheduler: true })
    }
}

/// A page of packed fence values.
pub(super) struct FencePage {
    pub(super) kind: NativeFenceType,
    pub(super) current: Arc<Shm>,
    pub(super) monitored: Arc<Shm>,
    pub(super) va: u64,
    /// Its fence slots; a fence holds its slot's lease, so the slot returns when it goes.
    pub(super) slots: Pool,
    pub(super) _mapping: GpuMapping,
    /// Its mappings in the GPU system process (`MapToGpuSystemProcess`): the VAs of the
    /// CurrentValue and MonitoredValue pages there.
    pub(super) sys: Option<SystemMapping>,
}

/// A fence page's two mappings in the GPU system (paging) process, for the CMP.
pub(super) struct SystemMapping {
    pub(super) current_va: u64,
    pub(super) monitored_va: u64,
    pub(super) _mappings: [GpuMapping; 2],
}

/// A native fence object.
pub(super) struct FenceObj {
    pub(crate) device: DeviceHandle,
    pub(super) id: u64,
    pub(super) kind: NativeFenceType,
    /// The CurrentValue's page and its offset there.
    pub(super) storage: Arc<Shm>,
    pub(super) coff: u64,
    pub(crate) va: u64,
    /// CurrentValue and MonitoredValue, checked once at creation.
    pub(super) value: Word,
    pub(super) monitored: Word,
    /// Its slot in a packed page; `None` for a fence with a page of its own.
    pub(super) _slot: Option<Lease>,
    /// Created shareable (opened with global and local handles).
    pub(super) shared: bool,
    /// Opened from another instance (a shared fence's global handle, a cross-adapter fence
    /// another adapter created): the value is the creator's to signal, so this instance's
    /// device error leaves it alone.
    pub(super) opened: bool,
    /// Its cross-adapter handle, for a cross-adapter fence.
    pub(super) cross: Option<u64>,
    pub(super) waiters: Vec<(u64, Arc<FenceWait>)>,
    /// The GPU mapping of a fence with a page of its own (packed fences share their page's).
    pub(super) _mapping: Option<GpuMapping>,
    /// Its CurrentValue's and MonitoredValue's VAs in the GPU system process, with the
    /// mappings a fence with pages of its own holds there.
    pub(super) system: Option<(u64, u64)>,
    pub(super) _system_mapping: Option<SystemMapping>,
    /// A queue's progress fence: only its engine writes it (no CPU signal, no
    /// AlwaysSignaled write).
    pub(super) engine_only: bool,
    /// Where CurrentValue and MonitoredValue live (the KMD's
    /// `D3DKMDT_FENCESTORAGESURFACEDATA`; a cross-adapter CurrentValue is always in system
    /// memory).
    pub(super) storage_domains: (abi::port::MemoryDomain, abi::port::MemoryDomain),
}

impl FenceObj {
    pub(super) fn current(&self) -> u64 {
        // Acquire: pairs with the signaller's release (engine or kernel), so the signalled
        // work is visible once the value is.
        self.value.get().load(Ordering::Acquire)
    }
}
/// A process's memory: three pools of memfd arenas ([`ShmPool`]), one per protection class.
///
/// Whoever holds one descriptor of an arena can map all of it, so an arena holds one
/// process's pages of one class only: no process ever shares an arena with another, and no
/// client-writable allocation shares one with a page the client may only read or must not
/// see. Pages shared between processes (shareable and cross-adapter fences) are not here:
/// they get a memfd of their own.
pub(super) struct ProcessMemory {
    /// Its allocations (`D3DKMTCreateAllocation`): the client maps them read-write.
    pub(super) client: ShmPool,
    /// Kernel-written pages the client maps read-only: queue kernel pages, the
    /// CurrentValue pages of its packed fences.
    pub(super) readable: ShmPool,
    /// Pages the client never maps: fence logs, MonitoredValue pages, kernel-mode rings and
    /// their control pages.
    pub(super) private: ShmPool,
}

impl ProcessMemory {
    pub(super) fn new(pid: ProcessId) -> ProcessMemory {
        let pool = |class| ShmPool::new(&format!("{pid}-{class}"), PoolConfig::default());
        ProcessMemory { client: pool("allocations"), readable: pool("readable"), private: pool("private") }
    }
}
impl Process {
    /// The doorbell page a queue descriptor names by `va` (0: the page the kernel gave the
    /// process): its BAR page, and its GPU VA where the device maps it for GPU rings. `None`
    /// if `va` names none of the process's pages.
    pub(super) fn doorbell_page_at(&self, va: u64) -> Option<(u32, Option<u64>)> {
        if va == 0 {
            return Some((self.doorbell_page.index(), self.doorbell_gpu.as_ref().map(|(va, _)| *va)));
        }
        let (_, d) = self.doorbell_pages.iter().find(|(_, d)| d.va == va)?;
        Some((d.lease.index(), d.gpu.as_ref().map(|_| d.va)))
    }
}

#[cfg(test)]
mod tests {
    use abi::QueueState;
    use abi::queue::{FaultKind, FaultRecord};

    use super::QueueLife;

    #[test]
    fn a_hung_queue_answers_from_its_record_and_a_live_one_from_the_device() {
        let fault = FaultRecord {
            kind: FaultKind::WptrBackwards { old: 8, new: 4 },
            rptr: 8,
            opcode: None,
            in_indirect: false,
        };
        // Hung: the record answers, whatever the device would say (it is not asked).
        let hung = QueueLife::Hung(fault.clone());
        assert_eq!(
            hung.status(|| panic!("a hung queue's status does not ask the device")),
            (QueueState::Hung, Some(fault))
        );
        assert_eq!(hung.published(), QueueState::Hung);
        // Live: where it runs is the device's answer.
        assert_eq!(QueueLife::Live.status(|| Some(QueueState::Preempted)), (QueueState::Preempted, None));
        assert_eq!(QueueLife::Live.status(|| None), (QueueState::Unmapped, None));
        assert_eq!(QueueLife::Live.published(), QueueState::Mapped);
        // A queue whose memory lost its mapping answers InvalidVa without asking the device.
        let lost = QueueLife::InvalidVa { va: 0x1000 };
        assert_eq!(lost.status(|| unreachable!("not asked")), (QueueState::InvalidVa, None));
        assert_eq!(lost.published(), QueueState::InvalidVa);
    }
}
