//! The OS graphics kernel ("dxg") as a sans-IO state machine: processes, objects,
//! validation, doorbells, waits, power policy, the interrupt service routine and the
//! kernel-mode scheduler.
//!
//! This is the Dxgkrnl half of spec 000 and the amdgpu USERQ ioctl half of spec 001. It owns
//! every policy decision and reaches the device only through the DDIs of [`crate::ddi::Kmd`],
//! wrapped in the [`Traced`] decorator that logs each call. Like quinn-proto's `Connection`,
//! [`Os`] has no lock, no thread, no clock and never blocks: every input is a method taking
//! `&mut self` and `now`; what must happen outside it comes out of [`Os::poll_output`] (a CPU
//! wait completed, a cross-adapter fence to propagate, the kernel-mode scheduler has work),
//! and its one timer (the D3 idle timer) comes out of [`Os::poll_timeout`]. The drivers in
//! [`crate::system`] own the lock, the condition variables, the clock and the blocking.
//!
//! The state machine is split along the spec's seams:
//! - `objects`: processes, devices, allocations, contexts (spec 000 "Residency model"), and
//!   each process's memory: pools of memfd arenas by protection class, so an allocation
//!   costs no file descriptor;
//! - `queues`: queue validation, creation and destruction (spec 000 "HwQueue creation";
//!   spec 001 USERQ CREATE/FREE/QUERY_STATUS);
//! - `doorbells`: doorbell pages and objects, connect, disconnect and victimization
//!   (spec 000 "Doorbells", "Victimizing doorbell pseudocode");
//! - `power`: F-states, D-states, context suspension and process termination (spec 000
//!   "Engine F-state transitions", "Engine D-state transitions", "Hardware context
//!   suspension", "Normal and abnormal process termination");
//! - `submit`: the kernel-mode path (validation, software queues, the scheduler);
//! - `waits`: CPU waits on progress fences and the interrupt service routine;
//! - `fence`: native fences (spec 002);
//! - `recovery`: preemption requests, timeout detection and recovery, device lost (spec 003);
//! - `migrate`: memory migration around preempted queues (spec 001 "Memory Management");
//! - `userq`: `USERQ_SIGNAL` and `USERQ_WAIT`, user and kernel queues interoperating
//!   (spec 001 "Special Packets", "USERQ_SIGNAL", "USERQ_WAIT").
//!
//! Lock order, for the drivers: the OS lock, then the device lock (inside the KMD). The
//! device's driver thread never holds the device lock while it calls into the OS.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use abi::handle::{
    AllocationKind, ContextKind, DeviceKind, DoorbellKind, DoorbellPageKind, HwQueueKind, NativeFenceKind,
};
use abi::port::{AdapterInfo, KernelError, MemoryDomain};
use abi::queue::{FaultRecord, QueueDescriptor};
use abi::slab::KeyMap;
use abi::{
    AllocationHandle, ContextHandle, DeviceHandle, DoorbellHandle, EngineId, HwQueueHandle, PowerState, ProcessId,
};
use abi::{QueueState, Time};
use shm::{RotatingPage, Shm};

use crate::ddi::{GpuMapping, Kmd, Traced};
use crate::pool::{Lease, Pool};
use crate::table::Table;
use crate::trace::{SharedTrace, TraceEntry};

mod doorbells;
mod fence;
mod migrate;
mod objects;
mod power;
mod queues;
mod recovery;
mod submit;
mod userq;
mod waits;

pub use fence::FENCE_STRIDE;

/// The GPU system (paging) process: the address space the OS creates for the CMP when the KMD
/// reports `MapToGpuSystemProcess` (client processes are numbered from 1).
pub const SYSTEM_PROCESS: ProcessId = ProcessId(0);
pub use queues::TRACED_FENCE_LOG_BYTES;
pub use recovery::TdrConfig;
pub use submit::KERNEL_RING_BYTES;

/// A CPU wait the OS keeps: its result stays here until [`Os::end_wait`] or
/// [`Os::end_fence_wait`] collects it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WaitId(u64);

/// How a wait started.
#[derive(Debug)]
pub enum WaitStart {
    /// Already decided.
    Done(Result<abi::port::WaitOutcome, KernelError>),
    /// The caller blocks until [`Output::WaitCompleted`] names it (or it times out), then ends
    /// it.
    Blocked(WaitId),
}

/// What the OS asks its driver to do, outside the state machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// A CPU wait completed: wake its thread.
    WaitCompleted(WaitId),
    /// A cross-adapter fence was signalled here: propagate it to the other adapters.
    Propagate(u64),
    /// The kernel-mode scheduler may have new work (a submission, a fence it waits on).
    SchedulerWork,
}

/// One pass of the kernel-mode scheduler.
#[derive(Clone, Copy, Debug)]
pub struct SchedulerPass {
    /// Submissions were moved onto kernel rings.
    pub moved: bool,
    /// Some waited for ring space (the engine frees it without telling anyone: poll soon).
    pub ring_full: bool,
    /// The work generation seen.
    pub generation: u64,
}

/// Counters the benchmark and demo read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OsStats {
    /// Interrupts serviced.
    pub interrupts: u64,
    /// User interrupts.
    pub user_interrupts: u64,
    /// Queue faults.
    pub faults: u64,
    /// Kernel-mode submissions accepted.
    pub km_submissions: u64,
    /// Doorbell connects.
    pub connects: u64,
    /// F1 entries.
    pub f1_entries: u64,
    /// Doorbells victimized to connect another (limited pool).
    pub victimizations: u64,
    /// `NativeFenceSignaled` interrupts.
    pub fence_interrupts: u64,
    /// Optimized fence interrupts that fell back to scanning every fence (log overrun).
    pub fence_log_fallbacks: u64,
    /// `DxgkDdiUpdateMonitoredValues` calls (each carries a batch).
    pub monitored_updates: u64,
    /// MonitoredValues those calls carried.
    pub monitored_values: u64,
}

/// What the kernel holds, for leak checks: every count returns to its start once the objects
/// that took from it are gone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Census {
    /// Live processes.
    pub processes: usize,
    /// Queues of every process.
    pub queues: usize,
    /// Doorbell objects.
    pub doorbells: usize,
    /// Allocations.
    pub allocations: usize,
    /// Native fence instances.
    pub fences: usize,
    /// Doorbell BAR pages handed to processes.
    pub doorbell_pages: usize,
    /// Kernel doorbells held by kernel-mode queues.
    pub kernel_doorbells: usize,
    /// GPU mappings alive on the device.
    pub gpu_mappings: usize,
    /// CPU waits registered and not yet ended.
    pub waits: usize,
}

/// A device; `error` once it is lost (its fences then read as always signalled).
#[derive(Default)]
struct DeviceObj {
    error: bool,
}

struct ContextObj {
    device: DeviceHandle,
    engine: EngineId,
    software_queue: VecDeque<submit::KmSubmission>,
    /// Suspended (`DxgkddiSuspendContext`): its queues are off the run list.
    suspended: bool,
}

/// Why an allocation cannot be freed: the kernel's references to a queue's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pin {
    /// A queue runs from it (ring, rptr, wptr or last-queued), from creation to destruction.
    Queue(HwQueueHandle),
    /// A doorbell references it (spec 000 "Residency model").
    Doorbell(DoorbellHandle),
}

struct AllocObj {
    device: DeviceHandle,
    shm: Arc<Shm>,
    va: u64,
    bytes: u64,
    pins: Vec<Pin>,
    /// Where it lives.
    domain: MemoryDomain,
    /// A local allocation evicted to system memory for D3 (contents preserved).
    evicted: bool,
    /// Its GPU mapping (unmapped when the allocation goes); `None` once a failed migration
    /// took it out ([`migrate`]).
    mapping: Option<GpuMapping>,
}

impl AllocObj {
    fn holds(&self, va: u64, bytes: u64) -> bool {
        va >= self.va && va.checked_add(bytes).is_some_and(|e| e <= self.va + self.bytes)
    }
}

struct QueueObj {
    context: ContextHandle,
    engine: EngineId,
    kernel_page: abi::queue::KernelPageView<shm::Word>,
    /// The kernel page's GPU mapping.
    _kernel_page_mapping: GpuMapping,
    mode: queues::QueueMode,
    doorbell: Option<DoorbellHandle>,
    /// CPU waiters on the progress fence: (value, wait).
    waiters: Vec<(u64, WaitId)>,
    /// Its state as the OS owns it; changed only by [`Os::set_state`].
    life: QueueLife,
    /// The fence logs `[waits, signals]` (user-mode queues).
    logs: Option<[Arc<Shm>; 2]>,
    /// Entries of the signal log the interrupt service has read.
    signal_log_seen: u64,
    /// The adapter resets before the queue was created ([`QueueStatus::flags`]'s VRAM_LOST).
    ///
    /// [`QueueStatus::flags`]: abi::port::QueueStatus::flags
    adapter_resets: u64,
    /// The hang timer (amdgpu): the completed progress value last seen with work outstanding,
    /// since when it has not moved, and how long the queue had run when it was first seen.
    progress_seen: Option<recovery::Stall>,
    /// Held off its engine by a caller's preemption request ([`Os::preempt_queue`]) until
    /// [`Os::resume_queue`]: no other resume (its context's, the return to D0, a migration's,
    /// the hang timer's) puts it back on the run list.
    held: bool,
    /// Pending `USERQ_SIGNAL`s ([`userq`]).
    signal_on: Vec<userq::PendingSignal>,
    /// Its progress fence as a native fence, once opened ([`Os::open_progress_fence`]).
    progress_fence: Option<abi::NativeFenceHandle>,
}

impl QueueObj {
    fn completed(&self) -> u64 {
        // Acquire: pairs with the engine's release store in PROGRESS_FENCE.
        self.kernel_page.progress_completed().get().load(Ordering::Acquire)
    }
    /// `Ok` while the queue can run work; `QueueLost` with its fault record once it is hung.
    fn live(&self, h: HwQueueHandle) -> Result<(), KernelError> {
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
    fn user_desc(&self) -> Option<&QueueDescriptor> {
        match &self.mode {
            queues::QueueMode::User { desc, .. } => Some(desc),
            queues::QueueMode::Kernel(_) => None,
        }
    }
}

/// A queue's state as the OS owns it: the one record of its transitions ([`Os::set_state`]
/// makes them, and publishes each in the client's state word) and the one source of its
/// status answer ([`QueueLife::status`]).
///
/// The OS derives `Hung` and keeps the fault record that caused it, whoever found the fault
/// (the device's interrupt, or the OS itself, e.g. a doorbell it could not ring). While the
/// queue is live, where it runs (`Mapped`, `Unmapped`, `Preempted`: which queues hold the
/// hardware slots) is the device scheduler's moment-to-moment business, which the device
/// reports on request and never as a transition; the status asks it only then.
#[derive(Clone, Debug, PartialEq, Eq)]
enum QueueLife {
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
    fn published(&self) -> QueueState {
        match self {
            QueueLife::Live => QueueState::Mapped,
            QueueLife::Hung(_) => QueueState::Hung,
            QueueLife::InvalidVa { .. } => QueueState::InvalidVa,
        }
    }

    /// The status answer: a hung queue's state and record; a live queue's residency, as the
    /// device reports it (`Unmapped` if it reports none).
    fn status(&self, residency: impl FnOnce() -> Option<QueueState>) -> (QueueState, Option<FaultRecord>) {
        match self {
            QueueLife::Live => (residency().unwrap_or(QueueState::Unmapped), None),
            QueueLife::Hung(fault) => (QueueState::Hung, Some(fault.clone())),
            QueueLife::InvalidVa { .. } => (QueueState::InvalidVa, None),
        }
    }
}

struct DoorbellObj {
    queue: HwQueueHandle,
    ring_buffer: AllocationHandle,
    ring_control: AllocationHandle,
    page: Arc<RotatingPage>,
    connected: bool,
}

/// A doorbell page the application allocated ([`Os::create_doorbell_page`]).
struct DoorbellPageObj {
    device: DeviceHandle,
    /// Where it is named (and mapped, with `gpu`) in the process's GPU address space.
    va: u64,
    /// Its GPU mapping, where the device allows GPU rings. Before `lease`: unmapped first.
    gpu: Option<GpuMapping>,
    /// The BAR page.
    lease: Lease,
}

/// A process's aggregated doorbell page (spec 001): mapped once for the CPU, and into its
/// GPU address space where the device lets the GPU ring it.
struct AggregatedPage {
    /// Its GPU VA and mapping. Before `lease`: unmapped first.
    gpu: Option<(u64, GpuMapping)>,
    /// The CPU mapping clients ring.
    cpu: Arc<RotatingPage>,
    /// The BAR page.
    lease: Lease,
}

struct Process {
    /// Its doorbell page mapped into its own GPU address space (VA, mapping), where the device
    /// allows queues to ring doorbells from the GPU. First, so it is unmapped before the page
    /// lease returns.
    doorbell_gpu: Option<(u64, GpuMapping)>,
    /// Its doorbell BAR page.
    doorbell_page: Lease,
    /// The doorbell pages it allocated (spec 001).
    doorbell_pages: Table<DoorbellPageKind, DoorbellPageObj>,
    /// BAR pages of doorbell pages it freed, cleared: they stay its own until it ends (a
    /// stale mapping of one can reach only its own queues) and are given back to it first.
    freed_doorbell_pages: Vec<Lease>,
    /// The process's aggregated doorbell page (when the device needs one).
    aggregated: Option<AggregatedPage>,
    next_va: u64,
    devices: Table<DeviceKind, DeviceObj>,
    contexts: Table<ContextKind, ContextObj>,
    queues: Table<HwQueueKind, QueueObj>,
    allocations: Table<AllocationKind, AllocObj>,
    doorbells: Table<DoorbellKind, DoorbellObj>,
    fences: Table<NativeFenceKind, fence::FenceObj>,
    fence_pages: Vec<fence::FencePage>,
    /// Its memory, in pools by protection class.
    memory: objects::ProcessMemory,
}

impl Process {
    fn take_va(&mut self, bytes: u64) -> u64 {
        let va = self.next_va;
        // One unmapped guard page between allocations catches small overruns as faults.
        self.next_va += bytes + 4096;
        va
    }
}

/// The CPU waits the OS keeps, with their results until collected.
///
/// A wait a process's thread began belongs to that process: if the process ends before the
/// thread ends its wait (killed while blocked, say), the wait ends with it
/// ([`Waits::forget_process`]); otherwise a long-lived kernel would keep one entry per such
/// wait forever (found by `doorbell sim swarm`'s census checker).
#[derive(Default)]
pub(crate) struct Waits {
    next: u64,
    /// Registered waits; `Some` once decided.
    results: KeyMap<WaitId, Option<Result<u64, KernelError>>>,
    /// The process whose thread waits (none for the kernel's own waits, which end themselves).
    owners: KeyMap<WaitId, ProcessId>,
}

impl Waits {
    /// A wait no process owns.
    fn open(&mut self) -> WaitId {
        self.next += 1;
        let id = WaitId(self.next);
        self.results.insert(id, None);
        id
    }
    /// A wait a thread of process `pid` begins.
    fn open_for(&mut self, pid: ProcessId) -> WaitId {
        let id = self.open();
        self.owners.insert(id, pid);
        id
    }
    fn is_done(&self, id: WaitId) -> bool {
        !matches!(self.results.get(&id), Some(None))
    }
    /// Ends wait `id`: its result, if it was decided.
    fn take(&mut self, id: WaitId) -> Option<Result<u64, KernelError>> {
        self.owners.remove(&id);
        self.results.remove(&id).flatten()
    }
    /// Ends every wait of process `pid` (it ended).
    fn forget_process(&mut self, pid: ProcessId) {
        let results = &mut self.results;
        self.owners.retain(|id, owner| {
            let keep = *owner != pid;
            if !keep {
                results.remove(id);
            }
            keep
        });
    }
}

/// The OS kernel: a sans-IO state machine over one adapter's KMD.
pub struct Os {
    ddi: Traced,
    trace: SharedTrace,
    bar: Arc<Shm>,
    dummy: Arc<Shm>,
    /// Live processes, in id (creation) order: every pass over them — the hang timer's scan,
    /// recovery, D3 and F1 — goes in the same order in every run (a `HashMap`'s order follows
    /// a seed drawn per map, and made the simulator's runs differ: issue 25).
    processes: BTreeMap<ProcessId, Process>,
    next_pid: u32,
    /// BAR pages for processes (page 0 and the KMD's reserved pages are never handed out).
    doorbell_pages: Pool,
    /// Kernel doorbells (BAR page 0) for kernel-mode queues.
    kernel_doorbells: Pool,
    stats: OsStats,
    km_queued: usize,
    /// The next submission fence ID per engine for kernel-mode buffers (Windows'
    /// `SubmissionFenceId`, [`submit`]).
    km_fence_ids: KeyMap<EngineId, u64>,
    next_fence_id: u64,
    /// Every local instance of each fence, by global id (one for a private fence; one per
    /// opening process for a shared one).
    fence_index: BTreeMap<u64, Vec<(ProcessId, abi::NativeFenceHandle)>>,
    /// The device is in D3 (powered down).
    d3: bool,
    /// Contexts the D3 entry suspended (resumed on the way back to D0).
    power_suspended: Vec<(ProcessId, ContextHandle)>,
    /// The adapter has native fences (otherwise only monitored fences).
    native_fences: bool,
    /// The machine's cross-adapter layer and this adapter's id in it, if it has several.
    cross: Option<(Arc<crate::cross::CrossAdapter>, crate::cross::AdapterId)>,
    /// Bumped whenever the scheduler may have new work (a submission, a fence it waits on):
    /// its driver sleeps only if this has not changed since it last looked.
    km_gen: u64,
    waits: Waits,
    outputs: VecDeque<Output>,
    /// The D3 idle timer: how long every engine must stay in F1 before the device enters D3
    /// (`None`: only on request), and since when they have been.
    d3_idle: Option<std::time::Duration>,
    all_f1_since: Option<Time>,
    /// Preemption requests in flight, TDR settings and the recovery count ([`recovery`]).
    recovery: recovery::Recovery,
    /// Memory migrations waiting for their queues' preemption answers ([`migrate`]).
    migrations: Vec<migrate::Migration>,
    /// The KMD's native fence caps, checked at initialization.
    fence_caps: abi::port::NativeFenceCaps,
    /// Fence-log tracing is on: user-mode queues' logs are larger ([`Os::set_fence_log_tracing`]).
    fence_log_tracing: bool,
    /// Bytes between packed fences (the KMD's stride).
    fence_stride: u64,
    /// The next free VA of the GPU system process.
    system_next_va: u64,
}

fn invalid(field: &'static str, value: impl ToString, reason: abi::port::Invalid) -> KernelError {
    KernelError::InvalidArgument { field, value: value.to_string(), reason }
}

impl Os {
    /// An OS over `kmd`, logging into `trace`, with every OS feature enabled. The KMD is
    /// wrapped in the tracing decorator.
    pub fn new(kmd: Box<dyn Kmd>, trace: SharedTrace) -> Result<Os, KernelError> {
        Self::with_features(kmd, trace, abi::port::OsFeatures::default())
    }

    /// Adapter initialization with the OS's `features`: the KMD queries them, then reports
    /// its caps; the OS fails initialization when the two disagree (spec 002 "Querying native
    /// fence feature enablement in OS": native fences advertised while the OS has not enabled
    /// them; caps that contradict each other).
    pub fn with_features(
        mut kmd: Box<dyn Kmd>,
        trace: SharedTrace,
        features: abi::port::OsFeatures,
    ) -> Result<Os, KernelError> {
        kmd.query_features(&features);
        let caps = kmd.native_fence_caps();
        let native_fences = kmd.adapter_info().native_fences;
        let mismatch = |feature, kmd: &str, os: &str| KernelError::FeatureMismatch {
            feature,
            kmd: kmd.to_string(),
            os: os.to_string(),
        };
        if caps.supported && !features.native_fence {
            return Err(mismatch("DXGK_FEATURE_NATIVE_FENCE", "native fence support", "not enabled the feature"));
        }
        if caps.supported != native_fences {
            return Err(mismatch("NativeGpuFence", "caps that disagree with its adapter info", "one answer"));
        }
        if !caps.supported && (caps.optimized_interrupt || caps.map_to_gpu_system_process) {
            return Err(mismatch("NativeFenceCaps", "native fence caps", "no native fences from this KMD"));
        }
        let stride_ok = |s: u64| s.is_power_of_two() && (8..=4096).contains(&s);
        if caps.supported
            && (!stride_ok(caps.current_value_stride) || caps.monitored_value_stride != caps.current_value_stride)
        {
            return Err(mismatch(
                "current_value_stride",
                &format!("strides {}/{}", caps.current_value_stride, caps.monitored_value_stride),
                "equal power-of-two strides of 8..=4096 bytes",
            ));
        }
        // Spec 000 "DXGKQAITYPE_USERMODESUBMISSION_CAPS": the doorbell size sizes the dummy page
        // a disconnected doorbell's CPU VA shows and the CPU VA rotated onto the BAR. A CPU VA
        // rotates whole pages, so a doorbell must be a power of two that fits one.
        let doorbell_bytes = kmd.adapter_info().doorbell_bytes;
        if !doorbell_bytes.is_power_of_two() || doorbell_bytes > shm::PAGE_SIZE as u64 {
            return Err(KernelError::InvalidArgument {
                field: "doorbell_bytes",
                value: doorbell_bytes.to_string(),
                reason: abi::port::Invalid::OutOfRange { expected: "a power of two of at most one page" },
            });
        }
        let dummy_bytes = doorbell_bytes.div_ceil(shm::PAGE_SIZE as u64) * shm::PAGE_SIZE as u64;
        if caps.map_to_gpu_system_process {
            kmd.create_address_space(SYSTEM_PROCESS)?;
        }
        let bar = kmd.doorbell_bar();
        let reserved = kmd.reserved_doorbell_pages();
        let pages = (bar.len() as u64 / abi::doorbell::DOORBELL_PAGE_BYTES) as u32;
        // Page 0 holds the kernel queues' doorbells; the KMD may keep pages for its pool.
        let free = (1..pages).filter(|p| !reserved.contains(p));
        // A page goes back cleared: its next owner starts with no stale value or bit (which
        // would at worst make the firmware re-read a wptr).
        let doorbell_pages = Pool::new("doorbell pages", free, Some(doorbells::clear_page(bar.clone())));
        let kernel_doorbells = Pool::new("kernel doorbells", 0..abi::doorbell::DOORBELLS_PER_PAGE, None);
        Ok(Os {
            ddi: Traced::new(kmd, trace.clone()),
            trace,
            bar,
            dummy: Shm::new("doorbell-dummy-page", dummy_bytes as usize)?,
            processes: BTreeMap::new(),
            next_pid: 1,
            doorbell_pages,
            kernel_doorbells,
            stats: OsStats::default(),
            km_queued: 0,
            km_fence_ids: KeyMap::default(),
            next_fence_id: 1,
            fence_index: BTreeMap::new(),
            km_gen: 0,
            d3: false,
            power_suspended: Vec::new(),
            native_fences,
            cross: None,
            waits: Waits::default(),
            outputs: VecDeque::new(),
            d3_idle: None,
            all_f1_since: None,
            recovery: recovery::Recovery::default(),
            migrations: Vec::new(),
            fence_caps: caps,
            fence_log_tracing: false,
            fence_stride: if caps.supported { caps.current_value_stride } else { FENCE_STRIDE },
            system_next_va: 1 << 32,
        })
    }

    /// The KMD's native fence caps (`DXGK_NATIVE_FENCE_CAPS`), as checked at initialization.
    pub fn native_fence_caps(&self) -> abi::port::NativeFenceCaps {
        self.fence_caps
    }

    /// A range of the GPU system process's address space (a guard page after it).
    fn take_system_va(&mut self, bytes: u64) -> u64 {
        let va = self.system_next_va;
        self.system_next_va += bytes + 4096;
        va
    }

    /// Enters D3 by itself once every engine has stayed in F1 for `period` (spec 000: D0 to
    /// D3 "after a longer idle period"); `None` leaves D3 to [`Os::enter_d3`] alone.
    pub fn set_d3_idle(&mut self, period: Option<std::time::Duration>) {
        self.d3_idle = period;
    }

    /// Arms a DDI fault (see [`crate::ddi::Traced`]).
    pub fn inject_ddi_fault(&mut self, fault: crate::ddi::DdiFault) {
        self.ddi.inject(fault);
    }

    /// Arms a misbehaviour of the next call of `ddi` (see [`crate::ddi::Misbehaviour`]).
    pub fn inject_misbehaviour(&mut self, ddi: crate::ddi::DdiKind, m: crate::ddi::Misbehaviour) {
        self.ddi.inject_misbehaviour(ddi, m);
    }

    /// Test hook: the KMD "raises" `n` (see [`crate::ddi::Traced::inject_notification`]); the
    /// next interrupt service delivers it.
    pub fn inject_notification(&mut self, n: crate::ddi::Notification) {
        self.ddi.inject_notification(n);
    }

    /// Test hook: the device's next `count` native-fence interrupts are lost (collapsed).
    pub fn drop_fence_signals(&mut self, count: u32) {
        self.ddi.drop_fence_signals(count);
    }

    /// Marks the start of an input at `now`: DDI calls it makes are logged at this time.
    pub fn at(&mut self, now: Time) -> &mut Self {
        self.ddi.at(now);
        self
    }

    /// The next thing for the driver to do, if any.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    /// When [`Os::handle_timeout`] next has something to do.
    pub fn poll_timeout(&self) -> Option<Time> {
        [self.d3_deadline(), self.recovery.poll_timeout()].into_iter().flatten().min()
    }

    /// When the D3 idle timer fires: the idle period after every engine entered F1.
    fn d3_deadline(&self) -> Option<Time> {
        self.d3_idle.and_then(|period| self.all_f1_since.map(|t| t.plus(period)))
    }

    /// The device reports whether every engine is in F1 at `now` (its pump calls this): the
    /// D3 idle timer runs while they all are.
    pub fn handle_device_idle(&mut self, all_f1: bool, now: Time) {
        if !all_f1 {
            self.all_f1_since = None;
        } else if self.d3_idle.is_some() && self.all_f1_since.is_none() {
            self.all_f1_since = Some(now);
        }
    }

    /// Fires what is due: once every engine has been in F1 for the idle period, the device
    /// enters D3; if work is queued meanwhile D3 is refused (see [`Os::enter_d3`]) and the
    /// timer starts over.
    pub fn handle_timeout(&mut self, now: Time) {
        // A preemption request unanswered for TdrDelay (spec 003), or the hang timer's scan.
        if self.recovery.poll_timeout().is_some_and(|t| now >= t) {
            self.handle_recovery_timeout(now);
        }
        if self.d3_deadline().is_none_or(|t| now < t) {
            return;
        }
        self.all_f1_since = None;
        self.at(now);
        if !self.d3 {
            // Refused while work is in flight: the timer simply starts over.
            let _ = self.enter_d3(now);
        }
    }

    /// The trace so far and how many entries were dropped.
    pub fn trace(&self) -> (Vec<TraceEntry>, u64) {
        self.trace.snapshot()
    }

    /// Counters.
    pub fn stats(&self) -> OsStats {
        self.stats
    }

    /// What the kernel holds (for leak checks).
    pub fn census(&self) -> Census {
        let mut c = Census {
            processes: self.processes.len(),
            doorbell_pages: self.doorbell_pages.in_use(),
            kernel_doorbells: self.kernel_doorbells.in_use(),
            gpu_mappings: self.ddi.live_mappings(),
            waits: self.waits.results.len(),
            ..Census::default()
        };
        for p in self.processes.values() {
            c.queues += p.queues.len();
            c.doorbells += p.doorbells.len();
            c.allocations += p.allocations.len();
            c.fences += p.fences.len();
        }
        c
    }

    /// Adapter capabilities.
    pub fn adapter_info(&self) -> AdapterInfo {
        self.ddi.adapter_info()
    }

    /// Engine power states.
    pub fn power(&self, engine: EngineId) -> PowerState {
        self.ddi.power(engine)
    }

    /// Whether the device is in D3.
    pub fn in_d3(&self) -> bool {
        self.d3
    }

    /// Whether `pid` is a live process.
    pub fn has_process(&self, pid: ProcessId) -> bool {
        self.processes.contains_key(&pid)
    }

    /// Whether a wait has been decided.
    pub fn wait_done(&self, id: WaitId) -> bool {
        self.waits.is_done(id)
    }

    /// Whether submissions wait on software queues.
    pub fn has_km_work(&self) -> bool {
        self.km_queued > 0
    }

    /// The kernel-mode scheduler's work generation (see [`SchedulerPass::generation`]).
    pub fn km_generation(&self) -> u64 {
        self.km_gen
    }

    /// Joins this adapter to a machine's cross-adapter layer as `me`.
    pub(crate) fn attach_cross(&mut self, x: Arc<crate::cross::CrossAdapter>, me: crate::cross::AdapterId) {
        self.cross = Some((x, me));
    }

    fn proc(&mut self, pid: ProcessId) -> Result<&mut Process, KernelError> {
        self.processes.get_mut(&pid).ok_or(KernelError::ProcessTerminated(pid))
    }

    fn queue(&mut self, pid: ProcessId, q: HwQueueHandle) -> Result<&mut QueueObj, KernelError> {
        self.proc(pid)?.queues.get_mut(q)
    }

    /// Decides wait `id` (once; later decisions are ignored) and tells the driver.
    fn complete_wait(&mut self, id: WaitId, r: Result<u64, KernelError>) {
        if let Some(slot @ None) = self.waits.results.get_mut(&id) {
            *slot = Some(r);
            self.outputs.push_back(Output::WaitCompleted(id));
        }
    }

    /// Tells the driver the scheduler may have new work.
    fn kick_scheduler(&mut self) {
        self.km_gen += 1;
        if !self.outputs.contains(&Output::SchedulerWork) {
            self.outputs.push_back(Output::SchedulerWork);
        }
    }

    /// Moves a queue to `life` and publishes it in its state word (what the client reads) —
    /// the one place a queue's state changes on the kernel's side.
    fn set_state(&mut self, pid: ProcessId, q: HwQueueHandle, life: QueueLife) {
        if let Ok(qo) = self.queue(pid, q) {
            let word = life.published();
            qo.life = life;
            // Release: the fault record (or the mapping) is in place before the client sees
            // the state.
            qo.kernel_page.queue_state().get().store(word as u64, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use abi::queue::FaultKind;

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
