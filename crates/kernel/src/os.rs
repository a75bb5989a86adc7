//! The OS graphics kernel ("dxg"): processes, objects, validation, doorbells, waits, power
//! policy, the interrupt service routine and the kernel-mode scheduler.
//!
//! This is the Dxgkrnl half of spec 000 and the amdgpu USERQ ioctl half of spec 001. It owns
//! every policy decision and calls the device only through the [`Kmd`] DDIs, recording each
//! call in the trace first. The sequences, in the spec's order:
//!
//! - **Connect** (`D3DKMTConnectDoorbell`): if the engine is in F1, F0 transition first; then
//!   `DxgkDdiConnectDoorbell`; then the doorbell CPU page is rotated to the BAR; then the status
//!   word becomes `Connected` (or `ConnectedNotify`).
//! - **Disconnect** (victimization callback, F1 entry, fault): the CPU page is rotated to the
//!   dummy page, the status word becomes `DisconnectedRetry` (or `DisconnectedAbort`), then
//!   `DxgkDdiDisconnectDoorbell`; the firmware re-reads the queue's wptr so no racing ring is
//!   lost.
//! - **Engine idle** (`DXGK_ENGINE_STATE_TRANSITION_TO_F1`): disconnect every doorbell of the
//!   engine's queues, then the F1 transition; the firmware refuses it if work is pending.
//! - **CPU wait**: register the waiter, set the monitored value (lowest waited value − 1)
//!   through the KMD, *then* re-read the completed value and satisfy what already passed; the
//!   ISR does the same scan when a progress interrupt arrives. Both run under the OS lock, and
//!   the firmware compares against the monitored value under the device lock after writing the
//!   completed value, so a wake-up cannot fall between them.
//!
//! Lock order: the OS lock, then the device lock (inside the KMD). The device's driver thread
//! never holds the device lock while it calls the ISR.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use abi::doorbell::{DOORBELL_PAGE_BYTES, DOORBELLS_PER_PAGE};
use abi::handle::{AllocationKind, ContextKind, DeviceKind, DoorbellKind, HwQueueKind, NativeFenceKind};
use abi::packet::Packet;
use abi::port::{
    AdapterInfo, AggregatedDoorbell, AllocationDesc, AllocationInfo, CreateDoorbell, DoorbellInfo, HwQueueDesc,
    HwQueueInfo, KernelError, MemoryDomain, QueueStatus, SubmissionMode, WaitOutcome,
};
use abi::queue::{Access, FaultKind, FaultRecord, QueueDescriptor};
use abi::ring::{self, LAST_QUEUED_OFFSET, RPTR_OFFSET, WPTR_OFFSET};
use abi::{
    AllocationHandle, ContextHandle, DeviceHandle, DoorbellHandle, DoorbellStatus, EngineId, HwQueueHandle, Priority,
    ProcessId, QueueState,
};
use gpu::{FwQueueId, Interrupt, PowerState, QueueConfig, Time, Vmid};
use parking_lot::{Condvar, Mutex};
use shm::{Prot, RotatingPage, Shm};

mod fence;

pub use fence::FENCE_STRIDE;

use crate::kmd::{ConnectStep, Kmd};
use crate::table::Table;
use crate::trace::{Callback, Ddi, Event, PageTarget, Trace, TraceEntry};

/// First GPU VA handed to a process.
const VA_BASE: u64 = 0x1_0000_0000;
/// Largest single allocation.
const MAX_ALLOCATION: u64 = 1 << 30;
/// Size of a kernel-mode queue's kernel-owned ring.
pub const KERNEL_RING_BYTES: u64 = 64 * 1024;

/// What one kernel-mode scheduling attempt did.
enum Move {
    Moved,
    NoSpace,
    /// Held back until a fence passes; the fence's interrupt wakes the scheduler.
    FenceWait,
    Empty,
}

/// A source of device time.
pub trait Clock: Send + Sync {
    /// Now.
    fn now(&self) -> Time;
}

/// A blocked CPU wait: a result slot and a condition variable. What it waits for is kept by
/// whoever registered it (a queue's progress waiters, a fence's waiters).
pub struct Waiter {
    result: Mutex<Option<Result<u64, KernelError>>>,
    cv: Condvar,
}

impl Waiter {
    fn new() -> Arc<Waiter> {
        Arc::new(Waiter { result: Mutex::new(None), cv: Condvar::new() })
    }
    fn complete(&self, r: Result<u64, KernelError>) {
        let mut g = self.result.lock();
        if g.is_none() {
            *g = Some(r);
            self.cv.notify_all();
        }
    }
    /// Whether the wait has ended.
    pub fn is_done(&self) -> bool {
        self.result.lock().is_some()
    }
    /// Blocks the calling thread until done or `deadline` (real time) passes.
    pub fn block_until(&self, deadline: Option<std::time::Instant>) {
        let mut g = self.result.lock();
        while g.is_none() {
            match deadline {
                Some(d) => {
                    if self.cv.wait_until(&mut g, d).timed_out() {
                        return;
                    }
                }
                None => self.cv.wait(&mut g),
            }
        }
    }
    /// The result, if done.
    pub fn take(&self) -> Option<Result<u64, KernelError>> {
        self.result.lock().clone()
    }
}

/// How a wait started.
pub enum WaitStart {
    /// Already decided.
    Done(Result<WaitOutcome, KernelError>),
    /// The caller must block on the waiter, then call [`Os::end_wait`].
    Blocked(Arc<Waiter>),
}

/// A device; `error` once it is lost (its fences then read as always signalled).
#[derive(Default)]
struct DeviceObj {
    error: bool,
}

struct ContextObj {
    device: DeviceHandle,
    engine: EngineId,
    software_queue: VecDeque<KmSubmission>,
    /// Suspended (`DxgkDdiSuspendContext`): its queues are off the run list.
    suspended: bool,
}

struct KmSubmission {
    queue: HwQueueHandle,
    words: Vec<u32>,
    /// The submission's `WAIT`s on native fences: the scheduler holds it back until they pass
    /// (the legacy, CPU-mediated path).
    waits: Vec<(abi::NativeFenceHandle, u64)>,
    /// The scheduler's registration on those fences while it waits.
    pending: Option<Arc<fence::FenceWait>>,
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
}

impl AllocObj {
    fn holds(&self, va: u64, bytes: u64) -> bool {
        va >= self.va && va.checked_add(bytes).is_some_and(|e| e <= self.va + self.bytes)
    }
}

enum QueueMode {
    User { desc: QueueDescriptor },
    Kernel { ring: Arc<Shm>, control: Arc<Shm>, ring_va: u64, control_va: u64, slot: u32, wptr: u64, last_queued: u64 },
}

struct QueueObj {
    context: ContextHandle,
    engine: EngineId,
    fw: FwQueueId,
    kernel_page: Arc<Shm>,
    kernel_page_va: u64,
    mode: QueueMode,
    doorbell: Option<DoorbellHandle>,
    /// CPU waiters on the progress fence: (value, waiter).
    waiters: Vec<(u64, Arc<Waiter>)>,
    fault: Option<FaultRecord>,
    /// The fence logs `[waits, signals]` (user-mode queues).
    logs: Option<[Arc<Shm>; 2]>,
    /// Entries of the signal log the interrupt service has read.
    signal_log_seen: u64,
}

impl QueueObj {
    fn completed(&self) -> u64 {
        // Acquire: pairs with the engine's release store in PROGRESS_FENCE.
        self.kernel_page.load_u64(abi::queue::PROGRESS_COMPLETED_OFFSET, Ordering::Acquire).unwrap_or(0)
    }
    fn set_state_word(&self, s: QueueState) {
        if let Ok(w) = self.kernel_page.atomic_u64(abi::queue::QUEUE_STATE_OFFSET) {
            w.store(s as u64, Ordering::Release);
        }
    }
    fn lost(&self, h: HwQueueHandle) -> KernelError {
        KernelError::QueueLost {
            queue: h.to_string(),
            reason: self.fault.as_ref().map_or_else(|| "hung".into(), |f| f.to_string()),
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

struct Process {
    vmid: Vmid,
    doorbell_page: u32,
    /// The process's aggregated doorbell page, mapped once (when the device needs one).
    aggregated: Option<(u32, Arc<RotatingPage>)>,
    next_va: u64,
    devices: Table<DeviceKind, DeviceObj>,
    contexts: Table<ContextKind, ContextObj>,
    queues: Table<HwQueueKind, QueueObj>,
    allocations: Table<AllocationKind, AllocObj>,
    doorbells: Table<DoorbellKind, DoorbellObj>,
    fences: Table<NativeFenceKind, fence::FenceObj>,
    fence_pages: Vec<fence::FencePage>,
}

impl Process {
    fn take_va(&mut self, bytes: u64) -> u64 {
        let va = self.next_va;
        // One unmapped guard page between allocations catches small overruns as faults.
        self.next_va += bytes + 4096;
        va
    }
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
}

struct OsState {
    kmd: Box<dyn Kmd>,
    bar: Arc<Shm>,
    dummy: Arc<Shm>,
    processes: HashMap<ProcessId, Process>,
    next_pid: u32,
    doorbell_pages: Vec<bool>,
    kernel_slots: Vec<u32>,
    fw_index: HashMap<FwQueueId, (ProcessId, HwQueueHandle)>,
    trace: Trace,
    stats: OsStats,
    km_queued: usize,
    next_fence_id: u64,
    /// Every local instance of each fence, by global id (one for a private fence; one per
    /// opening process for a shared one).
    fence_index: HashMap<u64, Vec<(ProcessId, abi::NativeFenceHandle)>>,
    /// A kernel-mode submission's fence wait completed: wake the scheduler.
    km_kick: bool,
    /// The device is in D3 (powered down).
    d3: bool,
    /// Contexts the D3 entry suspended (resumed on the way back to D0).
    power_suspended: Vec<(ProcessId, ContextHandle)>,
    /// The adapter has native fences (otherwise only monitored fences).
    native_fences: bool,
    /// The machine's cross-adapter layer and this adapter's id in it, if it has several.
    cross: Option<(Arc<crate::cross::CrossAdapter>, crate::cross::AdapterId)>,
    /// Cross-adapter fences signalled here, to propagate once the lock is released.
    cross_outbox: Vec<u64>,
    /// Bumped whenever the scheduler may have new work (a submission, a fence it waits on):
    /// it sleeps only if this has not changed since it last looked, so no wake-up is lost.
    km_gen: u64,
}

/// The OS kernel. All methods take `&self`; state is behind one lock.
pub struct Os {
    state: Mutex<OsState>,
    clock: Arc<dyn Clock>,
    km_work: Condvar,
    /// The D3 idle timer: how long every engine must stay in F1 before the device enters D3
    /// (`None`: only on request), and since when they have been.
    d3_idle: Option<std::time::Duration>,
    all_f1_since: Mutex<Option<Time>>,
}

fn invalid(field: &'static str, value: impl ToString, reason: impl Into<String>) -> KernelError {
    KernelError::InvalidArgument { field, value: value.to_string(), reason: reason.into() }
}

impl Os {
    /// An OS over `kmd`.
    pub fn new(kmd: Box<dyn Kmd>, clock: Arc<dyn Clock>) -> Result<Os, KernelError> {
        let bar = kmd.doorbell_bar();
        let native_fences = kmd.adapter_info().native_fences;
        let pages = (bar.len() as u64 / DOORBELL_PAGE_BYTES) as usize;
        let mut doorbell_pages = vec![false; pages];
        // Page 0 holds the kernel queues' doorbells; the KMD may keep pages for its pool.
        if let Some(p) = doorbell_pages.first_mut() {
            *p = true;
        }
        for i in kmd.reserved_doorbell_pages() {
            if let Some(p) = doorbell_pages.get_mut(i as usize) {
                *p = true;
            }
        }
        let state = OsState {
            kmd,
            bar,
            dummy: Shm::new("doorbell-dummy-page", 4096)?,
            processes: HashMap::new(),
            next_pid: 1,
            doorbell_pages,
            kernel_slots: (0..DOORBELLS_PER_PAGE).rev().collect(),
            fw_index: HashMap::new(),
            trace: Trace::default(),
            stats: OsStats::default(),
            km_queued: 0,
            next_fence_id: 1,
            fence_index: HashMap::new(),
            km_kick: false,
            km_gen: 0,
            d3: false,
            power_suspended: Vec::new(),
            native_fences,
            cross: None,
            cross_outbox: Vec::new(),
        };
        Ok(Os {
            state: Mutex::new(state),
            clock,
            km_work: Condvar::new(),
            d3_idle: None,
            all_f1_since: Mutex::new(None),
        })
    }

    /// Enters D3 by itself once every engine has stayed in F1 for `period` (spec 000: D0 to
    /// D3 "after a longer idle period"); `None` leaves D3 to [`Os::enter_d3`] alone.
    pub fn set_d3_idle(&mut self, period: Option<std::time::Duration>) {
        self.d3_idle = period;
    }

    /// The D3 idle timer, driven from outside like the firmware's: `all_f1` says whether every
    /// engine is in F1 at `now`. Once they have all been for the idle period, the device
    /// enters D3; if work is queued meanwhile D3 is refused (see [`Os::enter_d3`]) and the
    /// timer starts over.
    pub fn handle_idle(&self, all_f1: bool, now: Time) {
        let Some(period) = self.d3_idle else { return };
        let mut since = self.all_f1_since.lock();
        if !all_f1 {
            *since = None;
            return;
        }
        let start = *since.get_or_insert(now);
        if now.since(start) < period {
            return;
        }
        *since = None;
        drop(since);
        let mut s = self.state.lock();
        if !s.d3 {
            let _ = s.enter_d3(now);
        }
    }

    /// When [`Os::handle_idle`] next has something to do, if the engines are all in F1.
    pub fn poll_idle_timeout(&self) -> Option<Time> {
        let period = self.d3_idle?;
        self.all_f1_since.lock().map(|t| t.plus(period))
    }

    /// Device time now.
    pub fn now(&self) -> Time {
        self.clock.now()
    }

    /// The trace so far and how many entries were dropped.
    pub fn trace(&self) -> (Vec<TraceEntry>, u64) {
        self.state.lock().trace.snapshot()
    }

    /// Counters.
    pub fn stats(&self) -> OsStats {
        self.state.lock().stats
    }

    /// Adapter capabilities.
    pub fn adapter_info(&self) -> AdapterInfo {
        self.state.lock().kmd.adapter_info()
    }

    /// Creates a process: a GPU address space and a doorbell page.
    pub fn create_process(&self) -> Result<ProcessId, KernelError> {
        let mut s = self.state.lock();
        let page = s.take_doorbell_page()?;
        // Spec 001: "the kernel driver will map a page of aggregated doorbell space into each
        // GPUVM space" — a page of its own, so no process can clear another's rings.
        let aggregated = if s.kmd.adapter_info().aggregated_doorbell {
            let mapped =
                s.take_doorbell_page().and_then(|a| match RotatingPage::new(&s.bar, a as u64 * DOORBELL_PAGE_BYTES) {
                    Ok(map) => Ok((a, Arc::new(map))),
                    Err(e) => {
                        s.release_doorbell_page(a);
                        Err(e.into())
                    }
                });
            match mapped {
                Ok((a, map)) => {
                    s.kmd.watch_aggregated_page(a);
                    Some((a, map))
                }
                Err(e) => {
                    s.release_doorbell_page(page);
                    return Err(e);
                }
            }
        } else {
            None
        };
        let pid = ProcessId(s.next_pid);
        s.next_pid += 1;
        let vmid = s.kmd.create_vm();
        s.processes.insert(
            pid,
            Process {
                vmid,
                doorbell_page: page,
                aggregated,
                next_va: VA_BASE,
                devices: Table::new(pid),
                contexts: Table::new(pid),
                queues: Table::new(pid),
                allocations: Table::new(pid),
                doorbells: Table::new(pid),
                fences: Table::new(pid),
                fence_pages: Vec::new(),
            },
        );
        Ok(pid)
    }

    /// Suspends a context (spec 000 "Hardware context suspension"): `DxgkddiSuspendContext`,
    /// and the KMD takes its queues off the scheduler's list. Doorbells stay connected and
    /// the client keeps queuing; the work runs after [`Os::resume_context`]. Suspending a
    /// suspended context is refused.
    pub fn suspend_context(&self, pid: ProcessId, c: ContextHandle) -> Result<(), KernelError> {
        self.with(pid, |s, now| s.suspend_context(pid, c, now))
    }

    /// Resumes a context: `DxgkddiResumeContext`, and the KMD puts its queues back on the
    /// scheduler's list (waking the engine first if it is in F1). Resuming a context that is
    /// not suspended is refused.
    pub fn resume_context(&self, pid: ProcessId, c: ContextHandle) -> Result<(), KernelError> {
        self.with(pid, |s, now| {
            let ctx = s.proc(pid)?.contexts.get_mut(c)?;
            if !ctx.suspended {
                return Err(invalid("context", c, "is not suspended"));
            }
            ctx.suspended = false;
            let engine = ctx.engine;
            // In D3 its queues stay off the run list: the return to D0 resumes it.
            if s.d3 {
                if !s.power_suspended.contains(&(pid, c)) {
                    s.power_suspended.push((pid, c));
                }
                return Ok(());
            }
            s.resume_context_queues(pid, c, engine, now)
        })
    }

    /// D0 → D3 (spec 000 "Engine D-state transitions") for an idle device (refused while any
    /// queue has work in flight), in order: 1. `DxgkddiSuspendContext`
    /// for every context; 2. disconnect every doorbell (status `DisconnectedRetry`); 3. evict
    /// the ring allocations from local memory (contents preserved). Then every engine powers
    /// down. Entering D3 twice is a no-op. A connect (or a kernel-mode submission) brings the
    /// device back to D0.
    pub fn enter_d3(&self) -> Result<(), KernelError> {
        let mut s = self.state.lock();
        let now = self.now();
        s.enter_d3(now)
    }

    /// Whether the device is in D3.
    pub fn in_d3(&self) -> bool {
        self.state.lock().d3
    }

    /// Normal termination, first part (spec 000 "Normal and abnormal process termination"):
    /// for each queue, `DxgkDdiDisconnectDoorbell`. Returns each queue and the last-queued
    /// progress value to wait for before [`Os::finish_termination`]. Ring memory stays
    /// resident meanwhile.
    pub fn begin_normal_termination(&self, pid: ProcessId) -> Result<Vec<(HwQueueHandle, u64)>, KernelError> {
        self.with(pid, |s, now| {
            // The exiting process's queued work must be able to finish: wake a device in D3.
            if s.power_up(now)? {
                s.resume_after_d3(now)?;
            }
            let mut out = Vec::new();
            for q in s.proc(pid)?.queues.handles() {
                s.disconnect(pid, q, DoorbellStatus::DisconnectedAbort, now)?;
                out.push((q, s.last_queued(pid, q)));
            }
            Ok(out)
        })
    }

    /// Abnormal termination, first part: the device is marked in error, then for each
    /// context `DxgkddiSuspendContext` (the KMD preempts it off the run list), then for each
    /// queue `DxgkDdiDisconnectDoorbell`. [`Os::finish_termination`] destroys, without waiting.
    pub fn begin_abnormal_termination(&self, pid: ProcessId) -> Result<(), KernelError> {
        self.with(pid, |s, now| {
            for d in s.proc(pid)?.devices.handles() {
                s.mark_device_error(pid, d, now)?;
            }
            for c in s.proc(pid)?.contexts.handles() {
                if !s.proc(pid)?.contexts.get(c)?.suspended {
                    s.suspend_context(pid, c, now)?;
                }
            }
            for q in s.proc(pid)?.queues.handles() {
                s.disconnect(pid, q, DoorbellStatus::DisconnectedAbort, now)?;
            }
            Ok(())
        })
    }

    /// Ends a process: every queue is destroyed (doorbell disconnected first), then its
    /// memory, address space and doorbell page are returned. Ending it twice is a no-op.
    pub fn finish_termination(&self, pid: ProcessId) {
        let mut s = self.state.lock();
        let now = self.now();
        let Some(p) = s.processes.get(&pid) else { return };
        let (queues, fences) = (p.queues.handles(), p.fences.handles());
        for q in queues {
            let _ = s.destroy_queue(pid, q, now);
        }
        for f in fences {
            let _ = s.destroy_native_fence(pid, f, now);
        }
        if let Some(p) = s.processes.remove(&pid) {
            s.kmd.destroy_vm(p.vmid);
            s.release_doorbell_page(p.doorbell_page);
            if let Some((a, map)) = p.aggregated {
                // Like its doorbells: a late write from the ended process lands on the dummy
                // page, never on the page's next owner.
                let _ = map.rotate_to(&s.dummy, 0);
                s.kmd.unwatch_aggregated_page(a);
                s.release_doorbell_page(a);
            }
        }
        drop(s);
        self.after_signals();
    }

    fn with<T>(
        &self,
        pid: ProcessId,
        f: impl FnOnce(&mut OsState, Time) -> Result<T, KernelError>,
    ) -> Result<T, KernelError> {
        let (r, signalled) = {
            let mut s = self.state.lock();
            if !s.processes.contains_key(&pid) {
                return Err(KernelError::ProcessTerminated(pid));
            }
            let now = self.now();
            let r = f(&mut s, now);
            (r, s.km_kick || !s.cross_outbox.is_empty())
        };
        // Whatever the call passed — a fence the scheduler waits on, a cross-adapter fence —
        // is acted on now, with the lock released.
        if signalled {
            self.after_signals();
        }
        r
    }

    /// `D3DKMTCreateDevice`.
    pub fn create_device(&self, pid: ProcessId) -> Result<DeviceHandle, KernelError> {
        self.with(pid, |s, _| Ok(s.proc(pid)?.devices.insert(DeviceObj::default())))
    }

    /// `D3DKMTDestroyDevice`: its contexts (and their queues), then its allocations.
    pub fn destroy_device(&self, pid: ProcessId, device: DeviceHandle) -> Result<(), KernelError> {
        self.with(pid, |s, now| {
            let p = s.proc(pid)?;
            p.devices.get(device)?;
            let contexts: Vec<_> = p.contexts.iter().filter(|(_, c)| c.device == device).map(|(h, _)| h).collect();
            for c in contexts {
                s.destroy_context(pid, c, now)?;
            }
            let p = s.proc(pid)?;
            let fences: Vec<_> = p.fences.iter().filter(|(_, f)| f.device == device).map(|(h, _)| h).collect();
            for f in fences {
                s.destroy_native_fence(pid, f, now)?;
            }
            let p = s.proc(pid)?;
            let allocs: Vec<_> = p.allocations.iter().filter(|(_, a)| a.device == device).map(|(h, _)| h).collect();
            for a in allocs {
                s.free(pid, a)?;
            }
            s.proc(pid)?.devices.remove(device)?;
            Ok(())
        })
    }

    /// Allocates and maps memory.
    pub fn allocate(
        &self,
        pid: ProcessId,
        device: DeviceHandle,
        desc: &AllocationDesc,
    ) -> Result<AllocationInfo, KernelError> {
        self.with(pid, |s, _| {
            if desc.bytes == 0 || desc.bytes > MAX_ALLOCATION {
                return Err(invalid("bytes", desc.bytes, "must be between 1 and 1 GiB"));
            }
            let bytes = desc.bytes.div_ceil(4096) * 4096;
            let p = s.proc(pid)?;
            p.devices.get(device)?;
            let name = match desc.domain {
                MemoryDomain::System => "alloc-system",
                MemoryDomain::Local => "alloc-local",
            };
            let shm = Shm::new(name, bytes as usize)?;
            let va = p.take_va(bytes);
            let vmid = p.vmid;
            s.kmd.map_gpu(vmid, va, bytes, shm.clone(), !desc.gpu_read_only)?;
            let handle = s.proc(pid)?.allocations.insert(AllocObj {
                device,
                shm,
                va,
                bytes,
                pins: Vec::new(),
                domain: desc.domain,
                evicted: false,
            });
            Ok(AllocationInfo { handle, va, bytes })
        })
    }

    /// Maps an allocation for the CPU.
    pub fn map_allocation(&self, pid: ProcessId, a: AllocationHandle) -> Result<shm::Mapping, KernelError> {
        self.with(pid, |s, _| {
            let a = s.proc(pid)?.allocations.get(a)?;
            Ok(a.shm.map_range(0, a.bytes as usize, Prot::ReadWrite)?)
        })
    }

    /// Frees an allocation; refused while a doorbell holds a reference.
    pub fn free(&self, pid: ProcessId, a: AllocationHandle) -> Result<(), KernelError> {
        self.with(pid, |s, _| s.free(pid, a))
    }

    /// Creates a context on an engine.
    pub fn create_context(
        &self,
        pid: ProcessId,
        device: DeviceHandle,
        engine: EngineId,
    ) -> Result<ContextHandle, KernelError> {
        self.with(pid, |s, _| {
            let engines = s.kmd.adapter_info().engines;
            if !engines.iter().any(|e| e.id == engine) {
                return Err(invalid("engine", engine, format!("the device has {} engines", engines.len())));
            }
            let p = s.proc(pid)?;
            p.devices.get(device)?;
            Ok(p.contexts.insert(ContextObj { device, engine, software_queue: VecDeque::new(), suspended: false }))
        })
    }

    /// Destroys a context and its queues.
    pub fn destroy_context(&self, pid: ProcessId, c: ContextHandle) -> Result<(), KernelError> {
        self.with(pid, |s, now| s.destroy_context(pid, c, now))
    }

    /// `D3DKMTCreateHwQueue` / USERQ CREATE.
    pub fn create_hw_queue(
        &self,
        pid: ProcessId,
        ctx: ContextHandle,
        desc: &HwQueueDesc,
    ) -> Result<HwQueueInfo, KernelError> {
        self.with(pid, |s, now| s.create_hw_queue(pid, ctx, desc, now))
    }

    /// Destroys a queue: doorbell disconnected and destroyed, then the firmware queue.
    pub fn destroy_hw_queue(&self, pid: ProcessId, q: HwQueueHandle) -> Result<(), KernelError> {
        self.with(pid, |s, now| s.destroy_queue(pid, q, now))
    }

    /// `D3DKMTCreateDoorbell`.
    pub fn create_doorbell(&self, pid: ProcessId, args: &CreateDoorbell) -> Result<DoorbellInfo, KernelError> {
        self.with(pid, |s, now| s.create_doorbell(pid, args, now))
    }

    /// `D3DKMTConnectDoorbell`.
    pub fn connect_doorbell(&self, pid: ProcessId, q: HwQueueHandle) -> Result<(), KernelError> {
        self.with(pid, |s, now| s.connect(pid, q, now))
    }

    /// `D3DKMTDestroyDoorbell`.
    pub fn destroy_doorbell(&self, pid: ProcessId, d: DoorbellHandle) -> Result<(), KernelError> {
        self.with(pid, |s, now| {
            let q = s.proc(pid)?.doorbells.get(d)?.queue;
            s.destroy_doorbell(pid, q, now)
        })
    }

    /// `D3DKMTNotifyWorkSubmission`.
    pub fn notify_work_submission(&self, pid: ProcessId, d: DoorbellHandle) -> Result<(), KernelError> {
        self.with(pid, |s, now| {
            let p = s.proc(pid)?;
            let qh = p.doorbells.get(d)?.queue;
            let fw = p.queues.get(qh)?.fw;
            s.trace.push(now, Event::Ddi(Ddi::NotifyWorkSubmission(qh)));
            s.kmd.notify_work_submission(fw);
            Ok(())
        })
    }

    /// `D3DKMTSubmitCommand`: validates and queues on the context's software queue.
    pub fn submit_command(&self, pid: ProcessId, q: HwQueueHandle, words: &[u32]) -> Result<(), KernelError> {
        self.with(pid, |s, _| {
            s.submit_command(pid, q, words)?;
            s.km_gen += 1;
            Ok(())
        })?;
        self.km_work.notify_one();
        Ok(())
    }

    /// Starts a CPU wait on a queue's progress fence.
    pub fn begin_wait(&self, pid: ProcessId, q: HwQueueHandle, value: u64) -> WaitStart {
        match self.with(pid, |s, now| s.begin_wait(pid, q, value, now)) {
            Ok(w) => w,
            Err(e) => WaitStart::Done(Err(e)),
        }
    }

    /// Ends a wait (whether or not it completed): deregisters the waiter and reports.
    pub fn end_wait(&self, pid: ProcessId, q: HwQueueHandle, w: &Arc<Waiter>) -> Result<WaitOutcome, KernelError> {
        let mut s = self.state.lock();
        let now = self.now();
        if let Some(qo) = s.processes.get_mut(&pid).and_then(|p| p.queues.get_mut(q).ok()) {
            qo.waiters.retain(|(_, x)| !Arc::ptr_eq(x, w));
            let fw = qo.fw;
            let _ = s.update_monitored(pid, q, fw, now);
        }
        match w.take() {
            Some(Ok(v)) => Ok(WaitOutcome::Reached(v)),
            Some(Err(e)) => Err(e),
            None => Ok(WaitOutcome::TimedOut),
        }
    }

    /// `USERQ QUERY_STATUS`.
    pub fn query_queue(&self, pid: ProcessId, q: HwQueueHandle) -> Result<QueueStatus, KernelError> {
        self.with(pid, |s, _| {
            let fw = s.proc(pid)?.queues.get(q)?.fw;
            let fw_state = s.kmd.queue_state(fw);
            let last_queued = s.last_queued(pid, q);
            let p = s.proc(pid)?;
            let qo = p.queues.get(q)?;
            let state = if qo.fault.is_some() { QueueState::Hung } else { fw_state.unwrap_or(QueueState::Unmapped) };
            Ok(QueueStatus { state, fault: qo.fault.clone(), completed: qo.completed(), last_queued })
        })
    }

    /// The interrupt service routine.
    pub fn handle_interrupt(&self, irq: Interrupt) {
        let mut s = self.state.lock();
        let now = self.now();
        s.stats.interrupts += 1;
        s.service(irq, now);
        drop(s);
        self.after_signals();
    }

    /// After anything that may have passed fences: wake the kernel-mode scheduler if a fence
    /// it waits on passed, then — with the lock released — propagate the cross-adapter fences
    /// signalled here to the other adapters.
    fn after_signals(&self) {
        let (out, cross) = {
            let mut s = self.state.lock();
            self.kick_if_needed(&mut s);
            (std::mem::take(&mut s.cross_outbox), s.cross.clone())
        };
        if let Some((x, me)) = cross {
            for fence in out {
                x.propagate(fence, me);
            }
        }
    }

    /// Joins this adapter to a machine's cross-adapter layer as `me`.
    pub(crate) fn attach_cross(&self, x: Arc<crate::cross::CrossAdapter>, me: crate::cross::AdapterId) {
        self.state.lock().cross = Some((x, me));
    }

    /// Another adapter signalled the cross-adapter fence this adapter knows as `local` (see
    /// [`crate::cross`]).
    pub(crate) fn notify_current_value(&self, local: u64) {
        {
            let mut s = self.state.lock();
            let now = self.now();
            s.notify_current_value(local, now);
        }
        self.after_signals();
    }

    /// Opens a cross-adapter fence created on another adapter.
    pub fn open_cross_adapter_fence(
        &self,
        pid: ProcessId,
        device: DeviceHandle,
        handle: u64,
    ) -> Result<abi::port::NativeFenceInfo, KernelError> {
        self.with(pid, |s, now| s.open_cross_adapter_fence(pid, device, handle, now))
    }

    /// Wakes the scheduler if a fence it waited on passed.
    fn kick_if_needed(&self, s: &mut OsState) {
        if std::mem::take(&mut s.km_kick) {
            s.km_gen += 1;
            self.km_work.notify_all();
        }
    }

    /// `D3DKMTCreateNativeFence`.
    pub fn create_native_fence(
        &self,
        pid: ProcessId,
        device: DeviceHandle,
        desc: &abi::port::NativeFenceDesc,
    ) -> Result<abi::port::NativeFenceInfo, KernelError> {
        self.with(pid, |s, now| s.create_native_fence(pid, device, desc, now))
    }

    /// Marks a device in error (TDR, abnormal termination): every fence it owns becomes
    /// AlwaysSignaled, so GPU and CPU waits pass, and CPU waits report
    /// [`KernelError::DeviceLost`]. Idempotent.
    pub fn mark_device_error(&self, pid: ProcessId, device: DeviceHandle) -> Result<(), KernelError> {
        self.with(pid, |s, now| s.mark_device_error(pid, device, now))
    }

    /// Opens a shared native fence by its global handle.
    pub fn open_native_fence(
        &self,
        pid: ProcessId,
        device: DeviceHandle,
        global: u64,
    ) -> Result<abi::port::NativeFenceInfo, KernelError> {
        self.with(pid, |s, now| s.open_native_fence(pid, device, global, now))
    }

    /// Destroys a native fence.
    pub fn destroy_native_fence(&self, pid: ProcessId, f: abi::NativeFenceHandle) -> Result<(), KernelError> {
        self.with(pid, |s, now| s.destroy_native_fence(pid, f, now))
    }

    /// Signals a native fence from the CPU.
    pub fn signal_native_fence(
        &self,
        pid: ProcessId,
        f: abi::NativeFenceHandle,
        value: u64,
    ) -> Result<(), KernelError> {
        self.with(pid, |s, now| s.signal_native_fence(pid, f, value, now))
    }

    /// Starts a CPU wait on native fences.
    pub fn begin_fence_wait(
        &self,
        pid: ProcessId,
        conds: &[(abi::NativeFenceHandle, u64)],
        mode: abi::port::WaitMode,
    ) -> WaitStart {
        match self.with(pid, |s, now| s.begin_fence_wait(pid, conds, mode, now)) {
            Ok(w) => w,
            Err(e) => WaitStart::Done(Err(e)),
        }
    }

    /// Ends a CPU wait on native fences.
    pub fn end_fence_wait(&self, pid: ProcessId, w: &Arc<Waiter>) -> Result<WaitOutcome, KernelError> {
        self.state.lock().end_fence_wait(pid, w)
    }

    /// Runs the kernel-mode scheduler once: moves software-queue submissions onto kernel
    /// rings. Returns what it did, and the work generation it saw (for
    /// [`Os::wait_for_km_work`]).
    pub fn run_scheduler(&self) -> SchedulerPass {
        let mut s = self.state.lock();
        let now = self.now();
        let (moved, ring_full) = s.run_scheduler(now);
        SchedulerPass { moved, ring_full, generation: s.km_gen }
    }

    /// Whether submissions wait on software queues.
    pub fn has_km_work(&self) -> bool {
        self.state.lock().km_queued > 0
    }

    /// Blocks the scheduler worker until there may be new work — a submission, or a fence a
    /// held-back submission waits on — or `timeout` passes. Returns at once if the work
    /// generation moved since `seen` (so a wake-up between the pass and this call is kept).
    pub fn wait_for_km_work(&self, seen: u64, timeout: std::time::Duration) {
        let mut s = self.state.lock();
        if s.km_gen == seen {
            self.km_work.wait_for(&mut s, timeout);
        }
    }

    /// Wakes the scheduler worker (shutdown).
    pub fn kick_scheduler(&self) {
        self.km_work.notify_all();
    }

    /// Reads a queue's fence log: the entries written after `since` entries (a previous
    /// [`abi::fence_log::LogRead::total`], 0 at first), after the KMD's flush
    /// (`DxgkDdiUpdateNativeFenceLogs`). For tools (the timeline) and tests; the client has no
    /// access to its logs.
    pub fn read_fence_log(
        &self,
        pid: ProcessId,
        q: HwQueueHandle,
        kind: abi::fence_log::FenceLogType,
        since: u64,
    ) -> Result<abi::fence_log::LogRead, KernelError> {
        self.with(pid, |s, now| {
            let qo = s.queue(pid, q)?;
            let (fw, logs) = (qo.fw, qo.logs.clone());
            let logs = logs.ok_or_else(|| invalid("queue", q, "is a kernel-mode queue: it has no fence log"))?;
            s.trace.push(now, Event::Ddi(Ddi::UpdateNativeFenceLogs(q)));
            s.kmd.flush_fence_logs(fw);
            abi::fence_log::read_since(&logs[kind as usize], since)
                .map_err(|e| KernelError::CorruptLog { queue: q.to_string(), reason: e.to_string() })
        })
    }

    /// Engine power states.
    pub fn power(&self, engine: EngineId) -> PowerState {
        self.state.lock().kmd.power(engine)
    }
}

impl OsState {
    /// A free page of the doorbell BAR for a process.
    fn take_doorbell_page(&mut self) -> Result<u32, KernelError> {
        let page = self.doorbell_pages.iter().position(|used| !used).ok_or_else(|| KernelError::Exhausted {
            what: "doorbell pages",
            detail: format!("all {} pages of the doorbell BAR are in use", self.doorbell_pages.len()),
        })?;
        self.doorbell_pages[page] = true;
        Ok(page as u32)
    }

    /// Gives a process's doorbell page back, cleared: its next owner starts with no stale
    /// value or bit (which would at worst make the firmware re-read a wptr).
    fn release_doorbell_page(&mut self, page: u32) {
        for w in 0..DOORBELLS_PER_PAGE as u64 {
            if let Ok(word) = self.bar.atomic_u64(page as u64 * DOORBELL_PAGE_BYTES + w * 8) {
                // Relaxed: the page has no user left; the next owner's mapping is created after.
                word.store(0, Ordering::Relaxed);
            }
        }
        if let Some(p) = self.doorbell_pages.get_mut(page as usize) {
            *p = false;
        }
    }

    fn proc(&mut self, pid: ProcessId) -> Result<&mut Process, KernelError> {
        self.processes.get_mut(&pid).ok_or(KernelError::ProcessTerminated(pid))
    }

    fn queue(&mut self, pid: ProcessId, q: HwQueueHandle) -> Result<&mut QueueObj, KernelError> {
        self.proc(pid)?.queues.get_mut(q)
    }

    fn enter_d3(&mut self, now: Time) -> Result<(), KernelError> {
        if self.d3 {
            return Ok(());
        }
        // D3 is for an idle device: work in flight would wait for a connect that may never
        // come. Refuse, naming a busy queue.
        for (&pid, p) in &self.processes {
            for (h, q) in p.queues.iter() {
                let sw_queued = p.contexts.get(q.context).is_ok_and(|c| c.software_queue.iter().any(|s| s.queue == h));
                if sw_queued || self.kmd.queue_has_work(q.fw) {
                    return Err(KernelError::InUse {
                        handle: "the device".into(),
                        by: format!("{h} of {pid}, which has work in flight (D3 needs an idle device)"),
                    });
                }
            }
        }
        self.trace.push(now, Event::DevicePower { d3: true });
        let pids: Vec<ProcessId> = self.processes.keys().copied().collect();
        // 1. Suspend every context (the ones not already suspended on request; D3's
        // suspension is its own, undone on the way back to D0).
        for &pid in &pids {
            for c in self.proc(pid)?.contexts.handles() {
                if !self.proc(pid)?.contexts.get(c)?.suspended {
                    let fws = self.context_queues(pid, c)?;
                    self.trace.push(now, Event::Ddi(Ddi::SuspendContext(c)));
                    self.kmd.suspend_context(&fws);
                    self.power_suspended.push((pid, c));
                }
            }
        }
        // 2. Disconnect every doorbell.
        for &pid in &pids {
            for q in self.proc(pid)?.queues.handles() {
                self.disconnect(pid, q, DoorbellStatus::DisconnectedRetry, now)?;
            }
        }
        // 3. Evict ring allocations from local memory, now that no queue is scheduled.
        for &pid in &pids {
            let p = self.proc(pid)?;
            let rings: Vec<AllocationHandle> = p
                .allocations
                .iter()
                .filter(|(_, a)| a.domain == MemoryDomain::Local && !a.pins.is_empty())
                .map(|(h, _)| h)
                .collect();
            for a in rings {
                let obj = self.proc(pid)?.allocations.get_mut(a)?;
                obj.evicted = true;
                obj.domain = MemoryDomain::System;
                self.trace.push(now, Event::Residency { allocation: a, resident: false });
            }
        }
        // The device powers down: every engine to F1 (nothing is scheduled).
        for e in self.kmd.adapter_info().engines {
            self.trace.push(now, Event::Ddi(Ddi::SetPowerState(e.id, PowerState::F1)));
            let st = self.kmd.set_power(e.id, PowerState::F1, now);
            self.trace.push(now, Event::Power { engine: e.id, state: st });
        }
        self.d3 = true;
        Ok(())
    }

    /// The first half of D3 → D0: the D0 transition, then residency restored. The contexts
    /// are resumed by [`OsState::resume_after_d3`], after the doorbell connection (the spec's
    /// order).
    fn power_up(&mut self, now: Time) -> Result<bool, KernelError> {
        if !self.d3 {
            return Ok(false);
        }
        self.d3 = false;
        self.trace.push(now, Event::DevicePower { d3: false });
        let pids: Vec<ProcessId> = self.processes.keys().copied().collect();
        for pid in pids {
            let evicted: Vec<AllocationHandle> =
                self.proc(pid)?.allocations.iter().filter(|(_, a)| a.evicted).map(|(h, _)| h).collect();
            for a in evicted {
                let obj = self.proc(pid)?.allocations.get_mut(a)?;
                obj.evicted = false;
                obj.domain = MemoryDomain::Local;
                self.trace.push(now, Event::Residency { allocation: a, resident: true });
            }
        }
        Ok(true)
    }

    /// The last step of D3 → D0: `DxgkddiResumeContext` for the contexts D3 suspended.
    fn resume_after_d3(&mut self, now: Time) -> Result<(), KernelError> {
        for (pid, c) in std::mem::take(&mut self.power_suspended) {
            let Ok(ctx) = self.proc(pid).and_then(|p| p.contexts.get_mut(c)) else { continue };
            if ctx.suspended {
                continue; // suspended on request meanwhile: it stays suspended
            }
            let engine = ctx.engine;
            self.resume_context_queues(pid, c, engine, now)?;
        }
        Ok(())
    }

    /// The firmware queues of a context.
    fn context_queues(&mut self, pid: ProcessId, c: ContextHandle) -> Result<Vec<FwQueueId>, KernelError> {
        Ok(self.proc(pid)?.queues.iter().filter(|(_, q)| q.context == c).map(|(_, q)| q.fw).collect())
    }

    /// An engine in F1 goes back to F0 (spec 000 "Engine F-state transitions"), logged as the
    /// DDI call and the state the engine reached.
    fn wake_engine(&mut self, engine: EngineId, now: Time) {
        if self.kmd.power(engine) == PowerState::F1 {
            self.trace.push(now, Event::Ddi(Ddi::SetPowerState(engine, PowerState::F0)));
            let st = self.kmd.set_power(engine, PowerState::F0, now);
            self.trace.push(now, Event::Power { engine, state: st });
        }
    }

    /// `DxgkDdiResumeContext`: the context's engine wakes, then its queues return to the run
    /// list.
    fn resume_context_queues(
        &mut self,
        pid: ProcessId,
        c: ContextHandle,
        engine: EngineId,
        now: Time,
    ) -> Result<(), KernelError> {
        let fws = self.context_queues(pid, c)?;
        self.wake_engine(engine, now);
        self.trace.push(now, Event::Ddi(Ddi::ResumeContext(c)));
        self.kmd.resume_context(&fws);
        Ok(())
    }

    fn suspend_context(&mut self, pid: ProcessId, c: ContextHandle, now: Time) -> Result<(), KernelError> {
        let ctx = self.proc(pid)?.contexts.get_mut(c)?;
        if ctx.suspended {
            return Err(invalid("context", c, "is already suspended"));
        }
        ctx.suspended = true;
        let fws: Vec<FwQueueId> =
            self.proc(pid)?.queues.iter().filter(|(_, q)| q.context == c).map(|(_, q)| q.fw).collect();
        self.trace.push(now, Event::Ddi(Ddi::SuspendContext(c)));
        self.kmd.suspend_context(&fws);
        Ok(())
    }

    /// A queue's last-queued progress value: the kernel's own for a kernel-mode queue, the
    /// client's word for a user-mode one (reported, never trusted).
    fn last_queued(&mut self, pid: ProcessId, q: HwQueueHandle) -> u64 {
        let Ok(p) = self.proc(pid) else { return 0 };
        let Ok(qo) = p.queues.get(q) else { return 0 };
        match &qo.mode {
            QueueMode::Kernel { last_queued, .. } => *last_queued,
            QueueMode::User { desc } => p
                .allocations
                .iter()
                .find(|(_, a)| a.holds(desc.last_queued_va, 8))
                // Acquire: pairs with the UMD's release store of the value.
                .and_then(|(_, a)| a.shm.load_u64(desc.last_queued_va - a.va, Ordering::Acquire).ok())
                .unwrap_or(0),
        }
    }

    fn free(&mut self, pid: ProcessId, a: AllocationHandle) -> Result<(), KernelError> {
        let p = self.proc(pid)?;
        let obj = p.allocations.get(a)?;
        if let Some(pin) = obj.pins.first() {
            let by = match *pin {
                Pin::Queue(q) => format!("{q}, which runs from it"),
                Pin::Doorbell(d) => {
                    p.doorbells.get(d).map(|d| format!("the doorbell of {}", d.queue)).unwrap_or_else(|_| d.to_string())
                }
            };
            return Err(KernelError::InUse { handle: a.to_string(), by });
        }
        let (vmid, va) = (p.vmid, obj.va);
        p.allocations.remove(a)?;
        self.kmd.unmap_gpu(vmid, va);
        Ok(())
    }

    fn destroy_context(&mut self, pid: ProcessId, c: ContextHandle, now: Time) -> Result<(), KernelError> {
        let p = self.proc(pid)?;
        p.contexts.get(c)?;
        let queues: Vec<_> = p.queues.iter().filter(|(_, q)| q.context == c).map(|(h, _)| h).collect();
        for q in queues {
            self.destroy_queue(pid, q, now)?;
        }
        let ctx = self.proc(pid)?.contexts.remove(c)?;
        self.km_queued -= ctx.software_queue.len();
        Ok(())
    }

    /// Checks that the GPU could make `access` to `[va, va+bytes)`: aligned to `align`, inside
    /// one mapping of the process, writable for a write. Errors name `field` and the value.
    fn check_access(
        &self,
        vmid: Vmid,
        field: &'static str,
        va: u64,
        bytes: u64,
        access: Access,
        align: u64,
    ) -> Result<(), KernelError> {
        if !va.is_multiple_of(align) {
            return Err(invalid(field, format!("{va:#x}"), format!("must be {align}-byte aligned")));
        }
        match self.kmd.vm_access(vmid, va, bytes, access) {
            Ok(()) => Ok(()),
            Err(FaultKind::ReadOnly { .. }) => {
                Err(invalid(field, format!("{va:#x}"), "lies in a mapping the GPU may not write"))
            }
            Err(_) => Err(KernelError::OutsideMappings { field, va, bytes }),
        }
    }

    fn validate_descriptor(
        &self,
        vmid: Vmid,
        d: &QueueDescriptor,
        engine: &abi::port::EngineInfo,
    ) -> Result<Priority, KernelError> {
        ring::check_ring_size(d.ring_bytes).map_err(|r| invalid("ring_bytes", d.ring_bytes, r))?;
        self.check_access(vmid, "ring_va", d.ring_va, d.ring_bytes, Access::Read, 4)?;
        // The engine writes rptr: it must be client-writable memory, or a queue could aim it
        // at a protected word (another queue's progress fence) and forge it.
        self.check_access(vmid, "rptr_va", d.rptr_va, 8, Access::Write, 8)?;
        self.check_access(vmid, "wptr_va", d.wptr_va, 8, Access::Read, 8)?;
        self.check_access(vmid, "last_queued_va", d.last_queued_va, 8, Access::Read, 8)?;
        let range = engine.doorbell_first..engine.doorbell_first + engine.doorbell_count;
        if d.doorbell_index != abi::queue::DOORBELL_INDEX_ANY
            && d.doorbell_index < DOORBELLS_PER_PAGE
            && !range.contains(&d.doorbell_index)
        {
            return Err(invalid(
                "doorbell_index",
                d.doorbell_index,
                format!(
                    "lies outside the {} engine's doorbell range {}..{} of the page",
                    engine.kind, range.start, range.end
                ),
            ));
        }
        if d.doorbell_index >= DOORBELLS_PER_PAGE && d.doorbell_index != abi::queue::DOORBELL_INDEX_ANY {
            return Err(invalid(
                "doorbell_index",
                d.doorbell_index,
                format!("lies outside the process's doorbell page (0..{DOORBELLS_PER_PAGE})"),
            ));
        }
        Priority::from_u32(d.priority).ok_or_else(|| invalid("priority", d.priority, "must be 0 (low) to 4 (realtime)"))
    }

    fn create_hw_queue(
        &mut self,
        pid: ProcessId,
        ctx: ContextHandle,
        desc: &HwQueueDesc,
        now: Time,
    ) -> Result<HwQueueInfo, KernelError> {
        let engine = self.proc(pid)?.contexts.get(ctx)?.engine;
        let info = self.kmd.adapter_info();
        let einfo =
            info.engines.iter().find(|e| e.id == engine).ok_or_else(|| invalid("engine", engine, "does not exist"))?;
        let vmid = self.proc(pid)?.vmid;
        let kernel_page = Shm::new("queue-kernel-page", abi::queue::QUEUE_KERNEL_PAGE_BYTES as usize)?;
        kernel_page
            .atomic_u64(abi::queue::DOORBELL_STATUS_OFFSET)?
            .store(DoorbellStatus::DisconnectedRetry as u64, Ordering::SeqCst);
        let kernel_page_va = self.proc(pid)?.take_va(4096);
        // Kernel-owned, never mapped for the client (like the MQD): where an interrupted
        // DISPATCH keeps its state between slices.
        let context_save = Shm::new("queue-context-save", gpu::compute::CONTEXT_SAVE_BYTES as usize)?;
        // Two fence logs for a user-mode queue (spec 002): the engine writes them, the client
        // cannot see them, the kernel reads them. Kernel-mode queues log nothing.
        let logs = match desc.mode {
            SubmissionMode::UserMode(_) => {
                let (w, sg) = (Shm::new("fence-log-waits", 4096)?, Shm::new("fence-log-signals", 4096)?);
                abi::fence_log::init(&w, abi::fence_log::FenceLogType::Wait)?;
                abi::fence_log::init(&sg, abi::fence_log::FenceLogType::Signal)?;
                Some([w, sg])
            }
            SubmissionMode::KernelMode => None,
        };
        let (mode, cfg) = match desc.mode {
            SubmissionMode::UserMode(d) => {
                if !einfo.user_queues {
                    return Err(invalid("engine", engine, "does not support user-mode queues"));
                }
                self.validate_descriptor(vmid, &d, einfo)?;
                let mut d = d;
                let owner_of = |p: &Process, index: u32| {
                    p.queues.iter().find_map(|(h, q)| match &q.mode {
                        QueueMode::User { desc: o } if o.doorbell_index == index => Some(h),
                        _ => None,
                    })
                };
                let p = self.proc(pid)?;
                if d.doorbell_index == abi::queue::DOORBELL_INDEX_ANY {
                    let range = einfo.doorbell_first..einfo.doorbell_first + einfo.doorbell_count;
                    d.doorbell_index =
                        range.clone().find(|&i| owner_of(p, i).is_none()).ok_or_else(|| KernelError::Exhausted {
                            what: "doorbells",
                            detail: format!(
                                "all doorbells {}..{} of the {} engine's range are in use",
                                range.start, range.end, einfo.kind
                            ),
                        })?;
                } else if let Some(other) = owner_of(p, d.doorbell_index) {
                    return Err(invalid("doorbell_index", d.doorbell_index, format!("already used by {other}")));
                }
                let cfg = QueueConfig {
                    vmid,
                    engine,
                    ring_va: d.ring_va,
                    ring_bytes: d.ring_bytes,
                    rptr_va: d.rptr_va,
                    wptr_va: d.wptr_va,
                    kernel_page: abi::queue::KernelPageView::new(&kernel_page)?,
                    context_save: context_save.clone(),
                    fence_logs: logs.clone(),
                    privileged: false,
                    priority: desc.priority,
                };
                (QueueMode::User { desc: d }, cfg)
            }
            SubmissionMode::KernelMode => {
                if !einfo.kernel_queues {
                    return Err(invalid("engine", engine, "does not support kernel-mode queues"));
                }
                let slot = *self.kernel_slots.last().ok_or_else(|| KernelError::Exhausted {
                    what: "kernel doorbells",
                    detail: format!("{DOORBELLS_PER_PAGE} kernel-mode queues exist"),
                })?;
                let ring = Shm::new("kernel-ring", KERNEL_RING_BYTES as usize)?;
                let control = Shm::new("kernel-ring-control", 4096)?;
                let p = self.proc(pid)?;
                let ring_va = p.take_va(KERNEL_RING_BYTES);
                let control_va = p.take_va(4096);
                // Kernel-owned: mapped GPU read-only, never CPU-mapped for the client.
                self.kmd.map_gpu(vmid, ring_va, KERNEL_RING_BYTES, ring.clone(), false)?;
                self.kmd.map_gpu(vmid, control_va, 4096, control.clone(), false)?;
                let cfg = QueueConfig {
                    vmid,
                    engine,
                    ring_va,
                    ring_bytes: KERNEL_RING_BYTES,
                    rptr_va: control_va + RPTR_OFFSET,
                    wptr_va: control_va + WPTR_OFFSET,
                    kernel_page: abi::queue::KernelPageView::new(&kernel_page)?,
                    context_save: context_save.clone(),
                    fence_logs: None,
                    privileged: true,
                    priority: desc.priority,
                };
                (QueueMode::Kernel { ring, control, ring_va, control_va, slot, wptr: 0, last_queued: 0 }, cfg)
            }
        };
        self.kmd.map_gpu(vmid, kernel_page_va, 4096, kernel_page.clone(), false)?;
        let user_mode = matches!(mode, QueueMode::User { .. });
        self.trace.push(now, Event::Ddi(Ddi::CreateHwQueue(ctx)));
        let fw = match self.kmd.create_hw_queue(cfg) {
            Ok(fw) => fw,
            Err(e) => {
                self.kmd.unmap_gpu(vmid, kernel_page_va);
                if let QueueMode::Kernel { ring_va, control_va, .. } = mode {
                    self.kmd.unmap_gpu(vmid, ring_va);
                    self.kmd.unmap_gpu(vmid, control_va);
                }
                return Err(e);
            }
        };
        let obj = QueueObj {
            context: ctx,
            engine,
            fw,
            kernel_page: kernel_page.clone(),
            kernel_page_va,
            mode,
            doorbell: None,
            waiters: Vec::new(),
            fault: None,
            logs: logs.clone(),
            signal_log_seen: 0,
        };
        obj.set_state_word(QueueState::Mapped);
        let p = self.proc(pid)?;
        let handle = p.queues.insert(obj);
        // The kernel's reference on every allocation the queue runs from, until it is
        // destroyed: the engine reads and writes them.
        if let QueueMode::User { desc } = p.queues.get(handle)?.mode {
            let words =
                [(desc.ring_va, desc.ring_bytes), (desc.rptr_va, 8), (desc.wptr_va, 8), (desc.last_queued_va, 8)];
            for h in p.allocations.handles() {
                let a = p.allocations.get_mut(h)?;
                if words.iter().any(|&(va, n)| a.holds(va, n)) {
                    a.pins.push(Pin::Queue(handle));
                }
            }
        }
        self.trace.push(now, Event::QueueCreated { queue: handle, engine, user_mode });
        if logs.is_some() {
            // Passed to the firmware with the queue (`DxgkDdiSetNativeFenceLogBuffer`, once
            // for waits and once for signals).
            self.trace.push(now, Event::Ddi(Ddi::SetNativeFenceLogBuffer(handle)));
        }
        self.fw_index.insert(fw, (pid, handle));
        if let QueueMode::Kernel { slot, .. } = self.queue(pid, handle)?.mode {
            self.kernel_slots.pop();
            self.trace.push(now, Event::Ddi(Ddi::ConnectDoorbell(handle)));
            self.kmd.connect_kernel_doorbell(fw, slot)?;
        }
        Ok(HwQueueInfo { handle, engine, kernel_page: kernel_page.map_range(0, 4096, Prot::ReadOnly)?, kernel_page_va })
    }

    fn destroy_queue(&mut self, pid: ProcessId, q: HwQueueHandle, now: Time) -> Result<(), KernelError> {
        if self.queue(pid, q)?.doorbell.is_some() {
            self.destroy_doorbell(pid, q, now)?;
        }
        let p = self.proc(pid)?;
        let vmid = p.vmid;
        let obj = p.queues.remove(q)?;
        for h in p.allocations.handles() {
            if let Ok(a) = p.allocations.get_mut(h) {
                a.pins.retain(|&pin| pin != Pin::Queue(q));
            }
        }
        if let Ok(ctx) = p.contexts.get_mut(obj.context) {
            let before = ctx.software_queue.len();
            ctx.software_queue.retain(|s| s.queue != q);
            self.km_queued -= before - ctx.software_queue.len();
        }
        self.trace.push(now, Event::Ddi(Ddi::DestroyHwQueue(q)));
        self.kmd.destroy_hw_queue(obj.fw);
        self.fw_index.remove(&obj.fw);
        self.kmd.unmap_gpu(vmid, obj.kernel_page_va);
        if let QueueMode::Kernel { ring_va, control_va, slot, .. } = obj.mode {
            self.kmd.unmap_gpu(vmid, ring_va);
            self.kmd.unmap_gpu(vmid, control_va);
            self.kernel_slots.push(slot);
        }
        for (_, w) in &obj.waiters {
            w.complete(Err(KernelError::QueueLost { queue: q.to_string(), reason: "destroyed".into() }));
        }
        Ok(())
    }

    fn create_doorbell(
        &mut self,
        pid: ProcessId,
        args: &CreateDoorbell,
        now: Time,
    ) -> Result<DoorbellInfo, KernelError> {
        let q = args.queue;
        let p = self.proc(pid)?;
        let qo = p.queues.get(q)?;
        let QueueMode::User { desc } = qo.mode else {
            return Err(KernelError::WrongQueueMode {
                queue: q.to_string(),
                actual: "kernel-mode",
                expected: "user-mode",
            });
        };
        if qo.doorbell.is_some() {
            return Err(invalid("queue", q, "already has a doorbell"));
        }
        let ring = p.allocations.get(args.ring_buffer)?;
        if !ring.holds(desc.ring_va, desc.ring_bytes) {
            return Err(invalid(
                "ring_buffer",
                args.ring_buffer,
                format!("does not hold the queue's ring at {:#x}", desc.ring_va),
            ));
        }
        let control = p.allocations.get(args.ring_control)?;
        for (what, va) in [("rptr", desc.rptr_va), ("wptr", desc.wptr_va), ("last-queued value", desc.last_queued_va)] {
            if !control.holds(va, 8) {
                return Err(invalid(
                    "ring_control",
                    args.ring_control,
                    format!("does not hold the queue's {what} at {va:#x}"),
                ));
            }
        }
        let engine = qo.engine;
        let (offset, ring) = self.kmd.doorbell_ring(desc.doorbell_index);
        let aggregated = match (self.kmd.aggregated_doorbell(engine), &self.proc(pid)?.aggregated) {
            (Some((offset, mask)), Some((_, page))) => Some(AggregatedDoorbell { page: page.clone(), offset, mask }),
            _ => None,
        };
        let page = Arc::new(RotatingPage::new(&self.dummy, 0)?);
        let p = self.proc(pid)?;
        let d = p.doorbells.insert(DoorbellObj {
            queue: q,
            ring_buffer: args.ring_buffer,
            ring_control: args.ring_control,
            page: page.clone(),
            connected: false,
        });
        // The kernel's reference on the ring allocations (spec 000 "Residency model").
        p.allocations.get_mut(args.ring_buffer)?.pins.push(Pin::Doorbell(d));
        p.allocations.get_mut(args.ring_control)?.pins.push(Pin::Doorbell(d));
        p.queues.get_mut(q)?.doorbell = Some(d);
        self.trace.push(now, Event::Ddi(Ddi::CreateDoorbell(q)));
        Ok(DoorbellInfo { handle: d, cpu_page: page, offset, ring, aggregated })
    }

    fn destroy_doorbell(&mut self, pid: ProcessId, q: HwQueueHandle, now: Time) -> Result<(), KernelError> {
        let d = self.queue(pid, q)?.doorbell.ok_or_else(|| invalid("queue", q, "has no doorbell"))?;
        self.disconnect(pid, q, DoorbellStatus::DisconnectedAbort, now)?;
        self.trace.push(now, Event::Ddi(Ddi::DestroyDoorbell(q)));
        let p = self.proc(pid)?;
        let obj = p.doorbells.remove(d)?;
        for a in [obj.ring_buffer, obj.ring_control] {
            if let Ok(a) = p.allocations.get_mut(a)
                && let Some(i) = a.pins.iter().position(|x| *x == Pin::Doorbell(d))
            {
                a.pins.swap_remove(i);
            }
        }
        p.queues.get_mut(q)?.doorbell = None;
        Ok(())
    }

    fn write_status(&mut self, q: HwQueueHandle, qo_page: &Shm, status: DoorbellStatus, now: Time) {
        // SeqCst: the Dekker pairing with the client's `store wptr; fence(SeqCst); load status`
        // (see `umd::queue`): either the client sees this status, or the firmware's wptr
        // re-read (after this store) sees the client's wptr.
        if let Ok(w) = qo_page.atomic_u64(abi::queue::DOORBELL_STATUS_OFFSET) {
            abi::protocol::publish_status(w, status as u64);
        }
        self.trace.push(now, Event::Status { queue: q, status });
    }

    fn connect(&mut self, pid: ProcessId, q: HwQueueHandle, now: Time) -> Result<(), KernelError> {
        let qo = self.queue(pid, q)?;
        if qo.fault.is_some() {
            return Err(qo.lost(q));
        }
        let QueueMode::User { desc } = qo.mode else {
            return Err(KernelError::WrongQueueMode {
                queue: q.to_string(),
                actual: "kernel-mode",
                expected: "user-mode",
            });
        };
        let (engine, fw, kernel_page) = (qo.engine, qo.fw, qo.kernel_page.clone());
        let d = qo.doorbell.ok_or_else(|| invalid("queue", q, "has no doorbell: create one first"))?;
        let p = self.proc(pid)?;
        let process_page = p.doorbell_page;
        let dobj = p.doorbells.get(d)?;
        if dobj.connected {
            return Ok(());
        }
        let page = dobj.page.clone();
        // 0. A connect in D3 wakes the device: D0, then residency (spec 000 "Engine D-state
        // transitions"); the contexts resume after the connection, below.
        let woke = self.power_up(now)?;
        // 1. An engine in F1 goes back to F0 first (spec 000 "Engine F-state transitions").
        self.wake_engine(engine, now);
        // 2. DxgkDdiConnectDoorbell: the KMD binds a physical doorbell — after victimizing
        // one, when the pool is full (spec 000 "Victimizing doorbell pseudocode in KMD").
        self.trace.push(now, Event::Ddi(Ddi::ConnectDoorbell(q)));
        let (page_offset, notify) = loop {
            match self.kmd.connect_doorbell(fw, process_page, desc.doorbell_index)? {
                ConnectStep::Connected { page_offset, notify, .. } => break (page_offset, notify),
                ConnectStep::Victimize { victim } => self.victimize(victim, now)?,
            }
        };
        // 3. Dxgkrnl maps the physical doorbell at the doorbell's CPU VA.
        page.rotate_to(&self.bar, page_offset)?;
        self.trace.push(now, Event::Rotate { queue: q, to: PageTarget::Bar });
        // 4. Dxgkrnl updates the status to connected.
        let status = if notify { DoorbellStatus::ConnectedNotify } else { DoorbellStatus::Connected };
        self.write_status(q, &kernel_page, status, now);
        self.proc(pid)?.doorbells.get_mut(d)?.connected = true;
        self.stats.connects += 1;
        // 5. After D3: resume every context.
        if woke {
            self.resume_after_d3(now)?;
        }
        Ok(())
    }

    /// The OS's side of a victimization: `DxgkCbDisconnectDoorbell(victim)` rotates the
    /// victim's CPU VA to the dummy page and publishes `DisconnectedRetry`; then control goes
    /// back to the KMD, which disconnects the physical doorbell.
    fn victimize(&mut self, victim: FwQueueId, now: Time) -> Result<(), KernelError> {
        let &(pid, q) = self.fw_index.get(&victim).ok_or_else(|| invalid("victim", victim, "is not a queue"))?;
        let qo = self.queue(pid, q)?;
        let (d, kernel_page) = (qo.doorbell, qo.kernel_page.clone());
        self.trace.push(now, Event::Callback(Callback::DisconnectDoorbell(q)));
        if let Some(d) = d {
            let dobj = self.proc(pid)?.doorbells.get_mut(d)?;
            dobj.connected = false;
            let page = dobj.page.clone();
            page.rotate_to(&self.dummy, 0)?;
            self.trace.push(now, Event::Rotate { queue: q, to: PageTarget::Dummy });
        }
        self.write_status(q, &kernel_page, DoorbellStatus::DisconnectedRetry, now);
        self.kmd.victimized(victim);
        self.stats.victimizations += 1;
        Ok(())
    }

    /// Disconnects a queue's doorbell (`DxgkCbDisconnectDoorbell` then the DDI). With
    /// `DisconnectedAbort` the status is written even if it was not connected.
    fn disconnect(
        &mut self,
        pid: ProcessId,
        q: HwQueueHandle,
        status: DoorbellStatus,
        now: Time,
    ) -> Result<(), KernelError> {
        let qo = self.queue(pid, q)?;
        let (fw, kernel_page) = (qo.fw, qo.kernel_page.clone());
        let Some(d) = qo.doorbell else {
            if status == DoorbellStatus::DisconnectedAbort {
                self.write_status(q, &kernel_page, status, now);
            }
            return Ok(());
        };
        let dobj = self.proc(pid)?.doorbells.get_mut(d)?;
        let was = std::mem::replace(&mut dobj.connected, false);
        let page = dobj.page.clone();
        if was {
            // 1. Rotate the client's doorbell CPU VA to the dummy page.
            page.rotate_to(&self.dummy, 0)?;
            self.trace.push(now, Event::Rotate { queue: q, to: PageTarget::Dummy });
        }
        // 2. Publish the status.
        if was || status == DoorbellStatus::DisconnectedAbort {
            self.write_status(q, &kernel_page, status, now);
        }
        if was {
            // 3. The KMD disconnects the physical doorbell; the firmware re-reads wptr.
            self.trace.push(now, Event::Ddi(Ddi::DisconnectDoorbell(q)));
            self.kmd.disconnect_doorbell(fw);
        }
        Ok(())
    }

    /// Validates a kernel-mode submission; returns its last progress value and its `WAIT`s on
    /// the process's native fences (`fences`: each fence's VA and handle).
    fn validate_packets(
        &self,
        vmid: Vmid,
        words: &[u32],
        last: u64,
        fences: &[(u64, abi::NativeFenceHandle)],
    ) -> Result<(u64, Vec<(abi::NativeFenceHandle, u64)>), KernelError> {
        let mut waits = Vec::new();
        let mut signalled: Vec<(u64, u64)> = Vec::new();
        let packets =
            abi::packet::decode_stream(words).map_err(|(offset, error)| KernelError::BadPacket { offset, error })?;
        let mut progress = last;
        for p in packets {
            // The same checks the engine would make, as typed errors before anything runs.
            let r = |field, va, bytes, align| self.check_access(vmid, field, va, bytes, Access::Read, align);
            let w = |field, va, bytes, align| self.check_access(vmid, field, va, bytes, Access::Write, align);
            match p {
                Packet::Nop { .. } | Packet::Interrupt { .. } => {}
                Packet::WriteData { width, va, .. } => w("WRITE_DATA.va", va, width.bytes(), width.bytes())?,
                Packet::Copy { src, dst, bytes } => {
                    r("COPY.src", src, bytes, 1)?;
                    w("COPY.dst", dst, bytes, 1)?;
                }
                Packet::Fill { dst, bytes, .. } => w("FILL.dst", dst, bytes, 1)?,
                Packet::Timestamp { va } => w("TIMESTAMP.va", va, 8, 8)?,
                Packet::Signal { va, value } => {
                    w("SIGNAL.va", va, 8, 8)?;
                    signalled.push((va, value));
                }
                Packet::Logged { .. } => {
                    return Err(invalid(
                        "SIGNAL/WAIT log flag",
                        "set",
                        "kernel-mode queues have no fence log (their fences are software operations of the kernel)",
                    ));
                }
                Packet::SignalFence { va, value } => {
                    signalled.push((va, value));
                    w("SIGNAL.va", va, 8, 8)?;
                    if !fences.iter().any(|&(fva, _)| fva == va) {
                        return Err(invalid(
                            "SIGNAL.va",
                            format!("{va:#x}"),
                            "carries the native-fence flag but is not a native fence of the process",
                        ));
                    }
                }
                Packet::Wait { va, value } => {
                    r("WAIT.va", va, 8, 8)?;
                    // Held back on the CPU unless this submission signals it first (holding
                    // it would then wait for itself).
                    let covered = signalled.iter().any(|&(sva, sv)| sva == va && sv >= value);
                    if let Some(&(_, h)) = fences.iter().find(|&&(fva, _)| fva == va)
                        && !covered
                    {
                        waits.push((h, value));
                    }
                }
                Packet::IndirectBuffer { va, dwords, vmid: v } => {
                    if v != 0 {
                        return Err(invalid("INDIRECT_BUFFER.vmid", v, "must be 0"));
                    }
                    r("INDIRECT_BUFFER.va", va, dwords as u64 * 4, 4)?;
                }
                Packet::Dispatch { kernel, grid, group, args } => {
                    gpu::compute::check_dims(grid, group)
                        .map_err(|why| invalid("DISPATCH.grid/group", format!("{grid:?}/{group:?}"), why))?;
                    r("DISPATCH.kernel", kernel, abi::isa::KERNEL_HEADER_BYTES, 8)?;
                    r("DISPATCH.args", args, 8, 8)?;
                }
                Packet::ProgressFence { value } => {
                    if value <= progress {
                        return Err(KernelError::NotIncreasing {
                            field: "PROGRESS_FENCE.value",
                            value,
                            last: progress,
                        });
                    }
                    progress = value;
                }
            }
        }
        Ok((progress, waits))
    }

    fn submit_command(&mut self, pid: ProcessId, q: HwQueueHandle, words: &[u32]) -> Result<(), KernelError> {
        let p = self.proc(pid)?;
        let vmid = p.vmid;
        let qo = p.queues.get(q)?;
        if qo.fault.is_some() {
            return Err(qo.lost(q));
        }
        let (ctx, last) = match qo.mode {
            QueueMode::Kernel { last_queued, .. } => (qo.context, last_queued),
            QueueMode::User { .. } => {
                return Err(KernelError::WrongQueueMode {
                    queue: q.to_string(),
                    actual: "user-mode",
                    expected: "kernel-mode",
                });
            }
        };
        if words.is_empty() || words.len() as u64 * 4 > KERNEL_RING_BYTES / 2 {
            return Err(invalid(
                "words",
                words.len(),
                format!("a submission holds 1 to {} dwords", KERNEL_RING_BYTES / 8),
            ));
        }
        let fences: Vec<(u64, abi::NativeFenceHandle)> =
            self.proc(pid)?.fences.iter().map(|(h, f)| (f.va, h)).collect();
        let (progress, waits) = self.validate_packets(vmid, words, last, &fences)?;
        let p = self.proc(pid)?;
        if let QueueMode::Kernel { last_queued, control, .. } = &mut p.queues.get_mut(q)?.mode {
            *last_queued = progress;
            if let Ok(w) = control.atomic_u64(LAST_QUEUED_OFFSET) {
                w.store(progress, Ordering::Release);
            }
        }
        p.contexts.get_mut(ctx)?.software_queue.push_back(KmSubmission {
            queue: q,
            words: words.to_vec(),
            waits,
            pending: None,
        });
        self.km_queued += 1;
        self.stats.km_submissions += 1;
        Ok(())
    }

    fn run_scheduler(&mut self, now: Time) -> (bool, bool) {
        if self.km_queued == 0 {
            return (false, false);
        }
        let (mut moved, mut blocked) = (false, false);
        let contexts: Vec<(ProcessId, ContextHandle)> = self
            .processes
            .iter()
            .flat_map(|(&pid, p)| p.contexts.handles().into_iter().map(move |c| (pid, c)))
            .collect();
        for (pid, c) in contexts {
            loop {
                match self.move_one(pid, c, now) {
                    Move::Moved => moved = true,
                    Move::NoSpace => {
                        blocked = true;
                        break;
                    }
                    Move::FenceWait | Move::Empty => break,
                }
            }
        }
        (moved, blocked)
    }

    /// Moves the head of a context's software queue onto its queue's kernel-owned ring:
    /// wake the engine if it is in F1, write the packets, publish wptr, ring the doorbell.
    fn move_one(&mut self, pid: ProcessId, c: ContextHandle, now: Time) -> Move {
        // A kernel-mode submission in D3 wakes the device too.
        if self.d3 && self.power_up(now).is_ok() {
            let _ = self.resume_after_d3(now);
        }
        let Some(p) = self.processes.get_mut(&pid) else { return Move::Empty };
        let Ok(ctx) = p.contexts.get_mut(c) else { return Move::Empty };
        let Some(sub) = ctx.software_queue.front_mut() else { return Move::Empty };
        // The legacy path: a WAIT on a native fence is resolved here, by the CPU. The
        // submission stays back until the fence passes; the scheduler registers as a waiter so
        // the fence's signal interrupts and the ISR wakes it.
        if !sub.waits.is_empty() {
            let unmet: Vec<_> =
                sub.waits.iter().copied().filter(|&(h, v)| p.fences.get(h).is_ok_and(|f| f.current() < v)).collect();
            if !unmet.is_empty() {
                if sub.pending.as_ref().is_none_or(|w| w.waiter.is_done()) {
                    let wait = fence::FenceWait::for_scheduler(unmet);
                    sub.pending = Some(wait.clone());
                    let _ = self.register_wait(pid, &wait, now);
                }
                return Move::FenceWait;
            }
            if let Some(w) = sub.pending.take() {
                self.forget_wait(pid, &w);
            }
            let Some(p) = self.processes.get_mut(&pid) else { return Move::Empty };
            let Ok(ctx) = p.contexts.get_mut(c) else { return Move::Empty };
            let Some(sub) = ctx.software_queue.front_mut() else { return Move::Empty };
            sub.waits.clear();
        }
        let Some(p) = self.processes.get_mut(&pid) else { return Move::Empty };
        let Ok(ctx) = p.contexts.get_mut(c) else { return Move::Empty };
        let Some(sub) = ctx.software_queue.front() else { return Move::Empty };
        let Ok(qo) = p.queues.get_mut(sub.queue) else { return Move::Empty };
        let engine = qo.engine;
        let QueueMode::Kernel { ring, control, slot, wptr, .. } = &mut qo.mode else { return Move::Empty };
        // Acquire: the engine has finished reading the ring bytes below rptr.
        let rptr = control.load_u64(RPTR_OFFSET, Ordering::Acquire).unwrap_or(*wptr);
        // `submit_command` bounded the length to half the ring, so a plan always exists.
        let Some(plan) = ring::plan_write(*wptr, KERNEL_RING_BYTES, sub.words.len() as u64) else { return Move::Empty };
        // rptr is the engine's (kernel-owned memory); saturating all the same.
        if plan.new_wptr.saturating_sub(rptr) > KERNEL_RING_BYTES {
            return Move::NoSpace;
        }
        let qh = sub.queue;
        let _ = ring::write_stream(ring, KERNEL_RING_BYTES, *wptr, &plan, &[&sub.words]);
        *wptr = plan.new_wptr;
        let (control, slot) = (control.clone(), *slot);
        ctx.software_queue.pop_front();
        self.km_queued -= 1;
        self.wake_engine(engine, now);
        self.trace.push(now, Event::Ddi(Ddi::SubmitCommand(qh)));
        // Release: the packets are visible before the firmware acquires wptr.
        if let Ok(w) = control.atomic_u64(WPTR_OFFSET) {
            w.store(plan.new_wptr, Ordering::Release);
        }
        if let Ok(d) = self.bar.atomic_u64(slot as u64 * 8) {
            d.store(plan.new_wptr, Ordering::Release);
        }
        Move::Moved
    }

    fn begin_wait(
        &mut self,
        pid: ProcessId,
        q: HwQueueHandle,
        value: u64,
        now: Time,
    ) -> Result<WaitStart, KernelError> {
        let qo = self.queue(pid, q)?;
        let done = qo.completed();
        if done >= value {
            return Ok(WaitStart::Done(Ok(WaitOutcome::Reached(done))));
        }
        if qo.fault.is_some() {
            return Err(qo.lost(q));
        }
        let w = Waiter::new();
        qo.waiters.push((value, w.clone()));
        let fw = qo.fw;
        // Set the monitored value, then re-read the completed value (the spec's
        // update-then-resample), satisfying what already passed.
        self.update_monitored(pid, q, fw, now)?;
        Ok(WaitStart::Blocked(w))
    }

    /// Wakes satisfied waiters, then programs the monitored value for the rest.
    fn update_monitored(
        &mut self,
        pid: ProcessId,
        q: HwQueueHandle,
        fw: FwQueueId,
        now: Time,
    ) -> Result<(), KernelError> {
        loop {
            let qo = self.queue(pid, q)?;
            let done = qo.completed();
            qo.waiters.retain(|(value, w)| {
                let hit = *value <= done;
                if hit {
                    w.complete(Ok(done));
                }
                !hit
            });
            let monitored = qo.waiters.iter().map(|(value, _)| value - 1).min().unwrap_or(u64::MAX);
            self.trace.push(now, Event::Ddi(Ddi::UpdateMonitoredValue(q, monitored)));
            self.kmd.update_monitored(fw, monitored);
            // Resample after publishing: a PROGRESS_FENCE that ran before the new monitored
            // value was visible raised no interrupt, so it must be caught here.
            if self.queue(pid, q)?.completed() == done {
                return Ok(());
            }
        }
    }

    fn service(&mut self, irq: Interrupt, now: Time) {
        match irq {
            Interrupt::QueueFault { queue, fault } => {
                let Some(&(pid, q)) = self.fw_index.get(&queue) else { return };
                self.stats.faults += 1;
                self.trace.push(now, Event::QueueFault { queue: q, fault: fault.clone() });
                let Ok(qo) = self.queue(pid, q) else { return };
                qo.fault = Some(fault);
                qo.set_state_word(QueueState::Hung);
                let err = qo.lost(q);
                for (_, w) in qo.waiters.drain(..) {
                    w.complete(Err(err.clone()));
                }
                let _ = self.disconnect(pid, q, DoorbellStatus::DisconnectedAbort, now);
            }
            Interrupt::EngineStateChange { engine, state } => {
                self.trace.push(now, Event::EngineRequest { engine, state });
                // Disconnect every doorbell of this engine's queues, then power down.
                let mut targets = Vec::new();
                for (&pid, p) in &self.processes {
                    for (h, q) in p.queues.iter() {
                        if q.engine == engine
                            && q.doorbell.is_some_and(|d| p.doorbells.get(d).is_ok_and(|d| d.connected))
                        {
                            targets.push((pid, h));
                        }
                    }
                }
                for &(pid, q) in &targets {
                    let _ = self.disconnect(pid, q, DoorbellStatus::DisconnectedRetry, now);
                }
                self.trace.push(now, Event::Ddi(Ddi::SetPowerState(engine, PowerState::F1)));
                match self.kmd.set_power(engine, PowerState::F1, now) {
                    PowerState::F1 => {
                        self.stats.f1_entries += 1;
                        self.trace.push(now, Event::Power { engine, state: PowerState::F1 })
                    }
                    PowerState::F0 => {
                        // Work arrived: the engine stays awake, so give its queues their
                        // doorbells back rather than make each pay a reconnect.
                        self.trace.push(now, Event::F1Refused { engine });
                        for (pid, q) in targets {
                            let _ = self.connect(pid, q, now);
                        }
                    }
                }
            }
            Interrupt::User { queue, id } => {
                self.stats.user_interrupts += 1;
                if let Some(&(_, q)) = self.fw_index.get(&queue) {
                    self.trace.push(now, Event::UserInterrupt { queue: q, id });
                }
            }
            Interrupt::NativeFenceSignaled(what) => self.service_fences(what, now),
            Interrupt::ProgressFence { queue, .. } => {
                if let Some(&(pid, q)) = self.fw_index.get(&queue) {
                    let _ = self.update_monitored(pid, q, queue, now);
                }
            }
        }
    }
}
