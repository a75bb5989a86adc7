//! The scheduling firmware and its engines.
//!
//! The firmware keeps a table of queues (amdgpu: the MQDs it was given), a run list per engine,
//! and the doorbells it watches. Its work cycle is the one spec 001 describes: "Writing to the
//! doorbell wakes the firmware and causes it to fetch the wptr and start processing the packets
//! in the queue". Concretely, for each engine in F0:
//!
//! 1. [`Firmware::poll_doorbells`]: a watched BAR word that changed marks its queue *pending*
//!    ([`mark_pending`]).
//! 2. [`Firmware::step`]: each pending queue in a hardware slot, in round-robin order, reads its
//!    wptr (acquire), validates it, then fetches, decodes and executes up to `packet_budget`
//!    packets, publishing rptr (release) as it goes. A queue with nothing left stops being
//!    pending; a queue blocked in a `WAIT` stays pending and is re-checked next round.
//! 3. Interrupts (fault, engine state change, user, progress fence above the monitored value)
//!    queue on the line for [`Firmware::poll_interrupt`].
//!
//! The firmware keeps its own copies of rptr and of the last wptr it validated: a client that
//! scribbles over its rptr word cannot make the engine re-run or skip work, and a wptr that
//! moves backwards, is not dword aligned or runs more than a ring ahead hangs the queue.
//!
//! Doorbell bind and unbind both re-read the queue's wptr: a submission published while the
//! doorbell was disconnected, or whose ring raced the disconnect, is found there. Entering F1
//! is refused while any queue has work. Those two rules are why no submission is lost across a
//! doorbell disconnect or an engine power transition.
//!
//! With more queues than hardware slots, only the slot holders (`hqd`) execute; [`schedule`]
//! decides who holds the slots. It never scans the run list, which may hold thousands of
//! queues: each engine keeps a **waiting set** ([`Engine::waiting`]), ordered like the
//! scheduler's waiting order (kernel queues, then priority, then whoever ran longest ago, then
//! run-list order) and grouped by [`Class`] so a pass looks at one head per class. Its
//! invariant: a queue is in the waiting set exactly when it is on the run list, pending, not
//! hung and not in a slot ([`FwQueue::should_wait`]). Every `pending = true` goes through
//! [`mark_pending`], and every other change of those facts (suspend, resume, remove, map,
//! evict) through [`sync_waiting`], which keep it.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use abi::doorbell::DoorbellModel;
use abi::fence_log::{self, FenceLogEntry, FenceLogOp};
use abi::packet::{DataWidth, Header, LoggedOp, MAX_FIXED_PACKET_DWORDS, Opcode, Packet};
use abi::protocol;
use abi::queue::{Access, FaultKind, FaultRecord};
use abi::{EngineId, EngineKind, EngineState, PowerState, Priority, QueueState};
use shm::{Mapping, Shm, Word};

use crate::compute::{ComputeStats, Dispatch, Progress};
use crate::memory::{AddressSpace, Vmid};
use crate::{GpuConfig, GpuError, Time};

/// A queue in the firmware's table: slot index and generation, so a removed queue's id never
/// names its successor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FwQueueId {
    index: u32,
    generation: u32,
}

impl core::fmt::Display for FwQueueId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "fwq{}.g{}", self.index, self.generation)
    }
}

/// What the kernel gives the firmware to add a queue (the engine-specific MQD).
#[derive(Clone)]
pub struct QueueConfig {
    /// Address space the queue runs in.
    pub vmid: Vmid,
    /// Engine.
    pub engine: EngineId,
    /// Ring GPU VA.
    pub ring_va: u64,
    /// Ring size (validated by the kernel: power of two ≥ 4 KiB).
    pub ring_bytes: u64,
    /// rptr word GPU VA.
    pub rptr_va: u64,
    /// wptr word GPU VA.
    pub wptr_va: u64,
    /// The queue's kernel page; `PROGRESS_FENCE` writes its completed value.
    pub kernel_page: abi::queue::KernelPageView<Word>,
    /// The queue's two fence logs, `[waits, signals]` (`DxgkDdiSetNativeFenceLogBuffer`);
    /// `None` for kernel-mode queues, which log nothing.
    pub fence_logs: Option<[Arc<Shm>; 2]>,
    /// The queue's context save area (kernel-owned, [`crate::compute::CONTEXT_SAVE_BYTES`]):
    /// where an interrupted `DISPATCH` keeps its state between slices.
    pub context_save: Arc<Shm>,
    /// A kernel queue: may select a vmid in `INDIRECT_BUFFER`.
    pub privileged: bool,
    /// Priority.
    pub priority: Priority,
}

/// What the firmware raises on the interrupt line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Interrupt {
    /// A queue faulted and is now hung.
    QueueFault {
        /// The queue.
        queue: FwQueueId,
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
        queue: FwQueueId,
        /// The packet's id.
        id: u32,
    },
    /// `DXGK_INTERRUPT_NATIVE_FENCE_SIGNALED`: native fences were signalled above their
    /// MonitoredValue.
    NativeFenceSignaled(FenceSignaled),
    /// A `PROGRESS_FENCE` wrote a value above the queue's monitored value.
    ProgressFence {
        /// The queue.
        queue: FwQueueId,
        /// The value written.
        value: u64,
    },
}

/// What a `NativeFenceSignaled` interrupt tells the kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FenceSignaled {
    /// These fences (their registered ids) were signalled: the default mode.
    Fences(Vec<u64>),
    /// These queues signalled a fence and logged it: read their signal logs to learn which
    /// (the optimized mode, spec 002 "Optimized native fence signaled interrupt").
    Queues(Vec<FwQueueId>),
    /// No list: scan every fence with a waiter (the spec's NULL array).
    All,
}

/// What one [`Firmware::step`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepReport {
    /// Packets executed (indirect-buffer contents included).
    pub packets: u64,
    /// Queues that still want to run (pending or blocked).
    pub runnable: u32,
    /// Kernel wave-instructions executed.
    pub instructions: u64,
}

/// A region and an offset in it, resolved once when the queue is added.
#[derive(Clone)]
struct Place {
    shm: Arc<Shm>,
    offset: u64,
}

impl Place {
    fn resolve(vm: &AddressSpace, va: u64, bytes: u64, access: Access) -> Result<Place, FaultKind> {
        vm.translate(va, bytes, access)?;
        let m = vm.find(va).ok_or(FaultKind::OutsideMappings { va, bytes, access })?;
        Ok(Place { shm: m.shm.clone(), offset: m.offset + (va - m.va) })
    }

    /// The protocol word at this place (8-aligned, inside the mapping: checked here, once).
    fn word(&self, va: u64, access: Access) -> Result<Word, FaultKind> {
        Word::new(&self.shm, self.offset).map_err(|_| FaultKind::Misaligned { va, align: 8, access })
    }
}

/// An indirect buffer being executed.
#[derive(Clone, Copy, Debug)]
struct IbCursor {
    va: u64,
    dwords: u32,
    pos: u32,
    vmid: Option<Vmid>,
}

struct FwQueue {
    cfg: QueueConfig,
    ring: Place,
    rptr_word: Word,
    wptr_word: Word,
    state: QueueState,
    rptr: u64,
    wptr: u64,
    pending: bool,
    ib: Option<IbCursor>,
    monitored: u64,
    completed: u64,
    doorbell: Option<Binding>,
    fault: Option<FaultRecord>,
    /// When it last got a hardware slot (its quantum runs from here).
    slice_start: Time,
    /// When it last executed.
    last_run: Time,
    /// A `DISPATCH` at rptr is part-way done; its state is in the context save area.
    dispatch_active: bool,
    /// When the engine first saw the logged `WAIT` it is blocked on (the log's observed time).
    wait_observed: Option<Time>,
    /// Blocked in a `WAIT` on a native fence, as of this fence epoch: not re-checked until a
    /// fence changes.
    parked: Option<u64>,
    /// On its engine's run list (not suspended).
    on_run_list: bool,
    /// Its place in run-list order: stamped from [`Engine::next_seq`] each time it joins the
    /// run list, so among waiting queues that ran at the same time the earlier joiner goes
    /// first, as in a stable sort of the run list.
    seq: u64,
    /// In its engine's waiting set ([`Engine::waiting`]), under [`FwQueue::class`] and
    /// [`FwQueue::turn`]. Kept equal to [`FwQueue::should_wait`] by [`sync_waiting`].
    waiting: bool,
}

impl FwQueue {
    /// Reads and validates the client's wptr.
    fn refresh_wptr(&mut self) -> Result<(), FaultKind> {
        // Acquire: pairs with the client's release store of wptr, so the packets it covers are
        // visible before we fetch them.
        let new = self.wptr_word.get().load(Ordering::Acquire);
        if new == self.wptr {
            return Ok(());
        }
        if !new.is_multiple_of(4) {
            return Err(FaultKind::WptrMisaligned { wptr: new });
        }
        if new < self.wptr {
            return Err(FaultKind::WptrBackwards { old: self.wptr, new });
        }
        if new - self.rptr > self.cfg.ring_bytes {
            return Err(FaultKind::WptrPastRing { rptr: self.rptr, wptr: new, ring_bytes: self.cfg.ring_bytes });
        }
        self.wptr = new;
        Ok(())
    }

    /// Whether the client published work the engine has not fetched (a cheap acquire read,
    /// for rings of queues without a slot and the aggregated doorbell's poll).
    fn wptr_moved(&self) -> bool {
        // Acquire: pairs with the client's release store of wptr (and the aggregated ring
        // after it), so the packets are visible once we run them.
        self.wptr_word.get().load(Ordering::Acquire) != self.wptr
    }

    /// Raw check for unconsumed work, without validation (used for the no-loss checks).
    fn has_work(&self) -> bool {
        // The firmware half of the Dekker pair (`abi::protocol`): the kernel published the new
        // doorbell status before asking for this check, so either the client saw that status
        // or this re-read sees its wptr.
        let w = abi::protocol::recheck_wptr(&self.wptr_word);
        self.ib.is_some() || w != self.rptr
    }

    /// Whether the queue belongs in its engine's waiting set: on the run list, with work
    /// (pending), not hung, and not in a hardware slot (`Mapped` is exactly "in `hqd`" for a
    /// queue that is not hung).
    fn should_wait(&self) -> bool {
        self.on_run_list && self.pending && !matches!(self.state, QueueState::Mapped | QueueState::Hung)
    }

    /// The scheduling class it waits in.
    fn class(&self) -> Class {
        Class { user: !self.cfg.privileged, priority: std::cmp::Reverse(self.cfg.priority), vmid: self.cfg.vmid }
    }

    /// Its turn within its class. Stable while it waits: `last_run` only changes while it
    /// holds a slot.
    fn turn(&self) -> Turn {
        (self.last_run, self.seq)
    }

    fn publish_rptr(&self) {
        // Release: the client may reuse ring bytes below rptr once it sees it; our reads of
        // them happen before.
        self.rptr_word.get().store(self.rptr, Ordering::Release);
    }
}

/// Largest rptr/wptr the firmware accepts: far enough from `u64::MAX` that pointer
/// arithmetic (a ring's worth of bytes on top) cannot overflow.
const MAX_POINTER: u64 = 1 << 62;

/// What a doorbell word holds after a bind: never a wptr (not dword aligned), so whatever a
/// client rings next — even the value a previous owner of the slot left — is seen as new.
const DOORBELL_UNRUNG: u64 = u64::MAX;

/// Which doorbell a queue answers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Binding {
    /// A dedicated BAR word.
    Word(u32),
    /// Its bit of a global-doorbell bit page.
    Bit {
        /// The BAR page.
        page: u32,
        /// The bit (0..512).
        bit: u32,
    },
}

/// A BAR page of global-doorbell bits (one per process: the page is the unit of protection,
/// so a client can only ever clear bits of its own queues), and which queue each bit names.
struct BitPage {
    /// Its words in the BAR.
    words: Vec<Word>,
    queues: Vec<Option<FwQueueId>>,
    /// Per word, the bits that name a queue.
    bound: [u64; BITS_PER_PAGE as usize / 64],
}

/// Bits in a doorbell page.
const BITS_PER_PAGE: u32 = abi::doorbell::DOORBELLS_PER_PAGE;

struct Watch {
    word: Word,
    queue: FwQueueId,
    last: u64,
}

/// What the scheduler compares two waiting queues by, other than when they last ran: kernel
/// queues first (`user` false), then higher priority, and the address space, which decides
/// between the gang and the process quantum. Queues of one class are interchangeable for
/// eviction: whether a holder can be evicted for a waiter depends only on the waiter's class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Class {
    user: bool,
    priority: std::cmp::Reverse<Priority>,
    vmid: Vmid,
}

/// A waiting queue's turn within its class: whoever ran longest ago first, then run-list order.
type Turn = (Time, u64);

/// An engine's waiting queues (see [`FwQueue::should_wait`]), by class, each class in turn
/// order. Walking the class heads in class order merges them into the scheduler's waiting
/// order `(!privileged, Reverse(priority), last_run, run-list order)`. Empty classes are
/// dropped, so a pass looks at one head per distinct waiting class.
#[derive(Default)]
struct Waiting {
    by_class: std::collections::BTreeMap<Class, std::collections::BTreeMap<Turn, FwQueueId>>,
}

impl Waiting {
    fn insert(&mut self, class: Class, turn: Turn, id: FwQueueId) {
        let old = self.by_class.entry(class).or_default().insert(turn, id);
        debug_assert!(old.is_none(), "{id} waits twice, or two queues share a turn");
    }

    fn remove(&mut self, class: Class, turn: Turn, id: FwQueueId) {
        let Some(queues) = self.by_class.get_mut(&class) else {
            debug_assert!(false, "{id} is not waiting");
            return;
        };
        let old = queues.remove(&turn);
        debug_assert_eq!(old, Some(id), "{id} waits under another turn");
        if queues.is_empty() {
            self.by_class.remove(&class);
        }
    }

    fn is_empty(&self) -> bool {
        self.by_class.is_empty()
    }

    /// The first waiting queue, in waiting order, outside the classes in `skip`.
    fn first(&self, skip: &[Class]) -> Option<(Class, FwQueueId)> {
        let mut best: Option<(Class, Turn, FwQueueId)> = None;
        for (class, queues) in &self.by_class {
            // Classes come in (privilege, priority) order: a head in a later group never
            // precedes one already found.
            if best.is_some_and(|(b, ..)| (b.user, b.priority) != (class.user, class.priority)) {
                break;
            }
            if skip.contains(class) {
                continue;
            }
            let (&turn, &id) = queues.first_key_value().expect("empty classes are dropped");
            if best.is_none_or(|(_, t, _)| turn < t) {
                best = Some((*class, turn, id));
            }
        }
        best.map(|(class, _, id)| (class, id))
    }
}

struct Engine {
    id: EngineId,
    kind: EngineKind,
    power: PowerState,
    f1_requested: bool,
    last_busy: Time,
    /// Every queue the firmware may schedule on this engine (amdgpu's run list).
    run_list: Vec<FwQueueId>,
    /// The queues in hardware slots (HQDs): at most `hw_slots`; only these execute.
    hqd: Vec<FwQueueId>,
    hw_slots: usize,
    watches: Vec<Watch>,
    cursor: usize,
    /// Whether the slot assignment must be recomputed: set by everything that can change who
    /// deserves a slot (a queue added, removed, suspended, resumed, (dis)connected; an
    /// unmapped queue gaining work; a mapped one going idle or hanging; a power change).
    /// Otherwise [`schedule`] only looks again at `resched_at`, when a quantum expires.
    resched: bool,
    /// When the earliest slot holder's quantum runs out, if a queue is waiting.
    resched_at: Option<Time>,
    /// The waiting set: exactly the queues for which [`FwQueue::should_wait`] holds (on the
    /// run list, pending, not hung, not in `hqd`). Maintained by [`sync_waiting`], which every
    /// change of those four facts goes through, so a scheduling pass never scans the run list.
    waiting: Waiting,
    /// The next [`FwQueue::seq`].
    next_seq: u64,
}

struct Slot {
    generation: u32,
    queue: Option<FwQueue>,
}

/// The firmware state machine. See the module docs.
pub(crate) struct Firmware {
    idle_period: std::time::Duration,
    budget: u32,
    wave_width: u32,
    dispatch_budget: u64,
    compute: ComputeStats,
    fences: FenceTable,
    optimized_interrupts: bool,
    quanta: Quanta,
    engines: Vec<Engine>,
    slots: Vec<Slot>,
    irqs: std::collections::VecDeque<Interrupt>,
    /// Spec 000's doorbell model.
    model: DoorbellModel,
    /// The global model's bit pages, by BAR page.
    bit_pages: std::collections::BTreeMap<u32, BitPage>,
    /// Aggregated doorbell pages being watched (when engines miss unmapped queues' doorbells).
    aggregated: Vec<(u32, Word)>,
    /// The doorbell BAR the engines watch.
    bar: abi::doorbell::DoorbellBar,
    /// Engines drop rings of queues without a hardware slot.
    misses_unmapped: bool,
    /// Bumped whenever a native fence may have changed: a packet that writes memory executed
    /// here, a CPU update or another adapter's signal (`notify_fences`), a fence registered or
    /// destroyed. A queue parked on a fence `WAIT` re-checks only when it moved.
    fence_epoch: u64,
}

/// Outcome of executing one packet.
enum Flow {
    /// Done; move past it.
    Next,
    /// Cannot proceed (a `WAIT`); retry next round.
    Blocked,
    /// Made progress but is not done (a sliced `DISPATCH`); continue next round.
    Yield,
}

/// A native fence the firmware knows (`DxgkDdiCreateNativeFence`).
struct FenceEntry {
    id: u64,
    monitored: Word,
    waits: FenceWaits,
}

/// How a `WAIT` on a native fence waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceWaits {
    /// It parks until a fence may have changed: the device is told of every change it does
    /// not make itself (a native-fence KMD announces CPU updates and other adapters' signals).
    Park,
    /// It polls, as for plain memory: nobody announces changes (a monitored fence on an
    /// adapter without native fences, which its scheduler writes from the CPU).
    Poll,
}

/// Native fences by where their CurrentValue lives: (backing region id, offset). Keyed by
/// the memory rather than a VA, so every mapping of a shared fence finds the same entry.
type FenceTable = std::collections::HashMap<(u64, u64), FenceEntry>;

/// What packet execution needs besides the queue and its address space.
struct Env<'a> {
    fences: &'a FenceTable,
    optimized_interrupts: bool,
    /// Reads the device clock. Timestamps (`TIMESTAMP`, fence-log entries) read it when they
    /// execute, so they never predate work that was published after the step began.
    clock: &'a dyn Fn() -> Time,
    kind: EngineKind,
    wave_width: u32,
    dispatch_budget: u64,
    stats: &'a mut ComputeStats,
    irqs: &'a mut std::collections::VecDeque<Interrupt>,
    /// The fence epoch: bumped by every packet this device executes that writes memory.
    fence_epoch: &'a mut u64,
}

impl Firmware {
    /// A firmware for `cfg`.
    pub(crate) fn new(cfg: &GpuConfig, bar: abi::doorbell::DoorbellBar) -> Firmware {
        let engines = cfg
            .engines
            .iter()
            .enumerate()
            .map(|(i, &kind)| Engine {
                id: EngineId(i as u32),
                kind,
                power: PowerState::F0,
                f1_requested: false,
                last_busy: Time::ZERO,
                run_list: Vec::new(),
                hqd: Vec::new(),
                hw_slots: cfg.hw_slots.max(1) as usize,
                watches: Vec::new(),
                cursor: 0,
                resched: true,
                resched_at: None,
                waiting: Waiting::default(),
                next_seq: 0,
            })
            .collect();
        Firmware {
            idle_period: cfg.idle_period,
            budget: cfg.packet_budget.max(1),
            wave_width: cfg.wave_width.clamp(1, crate::compute::MAX_WAVE as u32),
            dispatch_budget: cfg.dispatch_budget.max(1),
            compute: ComputeStats::default(),
            fences: FenceTable::new(),
            optimized_interrupts: cfg.optimized_fence_interrupts,
            quanta: Quanta { process: cfg.process_quantum, gang: cfg.gang_quantum },
            engines,
            slots: Vec::new(),
            irqs: Default::default(),
            model: cfg.doorbell_model,
            bit_pages: Default::default(),
            aggregated: Vec::new(),
            bar,
            misses_unmapped: cfg.misses_unmapped_doorbells,
            fence_epoch: 0,
        }
    }

    pub(crate) fn engine_kinds(&self) -> Vec<EngineKind> {
        self.engines.iter().map(|e| e.kind).collect()
    }

    fn engine_mut(&mut self, id: EngineId) -> Result<&mut Engine, GpuError> {
        self.engines.get_mut(id.0 as usize).ok_or(GpuError::BadEngine(id.0))
    }

    fn queue(&self, id: FwQueueId) -> Result<&FwQueue, GpuError> {
        match self.slots.get(id.index as usize) {
            Some(Slot { generation, queue: Some(q) }) if *generation == id.generation => Ok(q),
            _ => Err(GpuError::StaleQueue(id)),
        }
    }

    fn queue_mut(&mut self, id: FwQueueId) -> Result<&mut FwQueue, GpuError> {
        match self.slots.get_mut(id.index as usize) {
            Some(Slot { generation, queue: Some(q) }) if *generation == id.generation => Ok(q),
            _ => Err(GpuError::StaleQueue(id)),
        }
    }

    /// A queue and its engine, both mutable (for [`mark_pending`] and [`sync_waiting`]).
    fn engine_and_queue(&mut self, id: FwQueueId) -> Result<(&mut Engine, &mut FwQueue), GpuError> {
        let q = match self.slots.get_mut(id.index as usize) {
            Some(Slot { generation, queue: Some(q) }) if *generation == id.generation => q,
            _ => return Err(GpuError::StaleQueue(id)),
        };
        let engine = q.cfg.engine.0;
        let e = self.engines.get_mut(engine as usize).ok_or(GpuError::BadEngine(engine))?;
        Ok((e, q))
    }

    pub(crate) fn add_queue(&mut self, cfg: QueueConfig, vm: &AddressSpace) -> Result<FwQueueId, GpuError> {
        self.engine_mut(cfg.engine)?;
        let ring = Place::resolve(vm, cfg.ring_va, cfg.ring_bytes, Access::Read).map_err(GpuError::QueueMemory)?;
        // The firmware writes rptr, so a user queue's rptr must lie in memory the client may
        // write: otherwise rptr could be aimed at a protected word (another queue's progress
        // fence) and forge it. A kernel queue's control page is GPU read-only by design.
        let rptr_access = if cfg.privileged { Access::Read } else { Access::Write };
        for (va, what) in [(cfg.rptr_va, Access::Write), (cfg.wptr_va, Access::Read)] {
            if va % 8 != 0 {
                return Err(GpuError::QueueMemory(FaultKind::Misaligned { va, align: 8, access: what }));
            }
        }
        let rptr_word = Place::resolve(vm, cfg.rptr_va, 8, rptr_access)
            .and_then(|p| p.word(cfg.rptr_va, rptr_access))
            .map_err(GpuError::QueueMemory)?;
        let wptr_word = Place::resolve(vm, cfg.wptr_va, 8, Access::Read)
            .and_then(|p| p.word(cfg.wptr_va, Access::Read))
            .map_err(GpuError::QueueMemory)?;
        // The firmware resumes from the client's current pointers: a queue starts idle. The
        // value is client memory: it must be a dword count far from overflow.
        let start = wptr_word.get().load(Ordering::Acquire);
        if !start.is_multiple_of(4) || start > MAX_POINTER {
            return Err(GpuError::BadStartPointer { wptr: start });
        }
        let engine = cfg.engine;
        let q = FwQueue {
            cfg,
            ring,
            rptr_word,
            wptr_word,
            state: QueueState::Unmapped,
            rptr: start,
            wptr: start,
            pending: false,
            ib: None,
            monitored: u64::MAX,
            completed: 0,
            doorbell: None,
            fault: None,
            slice_start: Time::ZERO,
            last_run: Time::ZERO,
            dispatch_active: false,
            wait_observed: None,
            parked: None,
            on_run_list: false,
            seq: 0,
            waiting: false,
        };
        q.publish_rptr();
        let index = match self.slots.iter().position(|s| s.queue.is_none()) {
            Some(i) => i,
            None => {
                self.slots.push(Slot { generation: 0, queue: None });
                self.slots.len() - 1
            }
        };
        let slot = &mut self.slots[index];
        slot.generation = slot.generation.wrapping_add(1);
        slot.queue = Some(q);
        let id = FwQueueId { index: index as u32, generation: slot.generation };
        let (e, q) = self.engine_and_queue(id)?;
        debug_assert_eq!(e.id, engine);
        join_run_list(e, q, id);
        e.resched = true;
        // A free hardware slot maps it at once; otherwise the scheduler will. (It starts idle,
        // so it does not wait either way.)
        if e.hqd.len() < e.hw_slots {
            e.hqd.push(id);
            q.state = QueueState::Mapped;
        }
        sync_waiting(e, q, id);
        Ok(id)
    }

    /// Takes a queue off its engine's run list (`DxgkDdiSuspendContext`): it stops at a packet
    /// boundary (or a dispatch slice, whose state is already in the save area) and is not
    /// scheduled until resumed. Its doorbell stays connected; rings are remembered.
    pub(crate) fn suspend_queue(&mut self, id: FwQueueId) -> Result<(), GpuError> {
        let (e, q) = self.engine_and_queue(id)?;
        e.run_list.retain(|&q| q != id);
        e.hqd.retain(|&q| q != id);
        e.resched = true;
        q.on_run_list = false;
        if q.state != QueueState::Hung {
            q.state = QueueState::Unmapped;
        }
        // Off the run list: it leaves the waiting set (and stays pending: rings are remembered).
        sync_waiting(e, q, id);
        Ok(())
    }

    /// Puts a suspended queue back on the run list (`DxgkDdiResumeContext`) and looks for the
    /// work queued meanwhile.
    pub(crate) fn resume_queue(&mut self, id: FwQueueId) -> Result<(), GpuError> {
        let (e, q) = self.engine_and_queue(id)?;
        if q.state == QueueState::Hung {
            return Ok(());
        }
        if !q.on_run_list {
            join_run_list(e, q, id);
        }
        e.resched = true;
        // Back on the run list: it waits if it has work, found now or remembered from before.
        find_published_work(e, q, id);
        sync_waiting(e, q, id);
        Ok(())
    }

    pub(crate) fn remove_queue(&mut self, id: FwQueueId) -> Result<u64, GpuError> {
        let (e, q) = self.engine_and_queue(id)?;
        e.run_list.retain(|&q| q != id);
        e.hqd.retain(|&q| q != id);
        e.resched = true;
        e.watches.retain(|w| w.queue != id);
        q.on_run_list = false;
        sync_waiting(e, q, id);
        let binding = q.doorbell.take();
        self.forget_bit(id, binding);
        let q = self.slots[id.index as usize].queue.take().expect("checked above");
        Ok(q.rptr)
    }

    pub(crate) fn bind_doorbell(&mut self, id: FwQueueId, slot: u32) -> Result<(), GpuError> {
        self.queue(id)?;
        let word = self.bar.doorbell(slot)?;
        // Reset the word: a recycled slot must not carry its previous owner's value, which
        // could equal this queue's next wptr and hide a ring. Relaxed: the binding is
        // published to the client by the kernel's status store, which comes after.
        word.get().store(DOORBELL_UNRUNG, Ordering::Relaxed);
        let last = DOORBELL_UNRUNG;
        let (e, q) = self.engine_and_queue(id)?;
        e.watches.retain(|w| w.queue != id);
        e.watches.push(Watch { word, queue: id, last });
        e.resched = true;
        q.doorbell = Some(Binding::Word(slot));
        // Work published while disconnected rang the dummy page: find it through wptr.
        find_published_work(e, q, id);
        Ok(())
    }

    /// Binds queue `id` to bit `bit` of the global-doorbell bit page `page` (its process's).
    pub(crate) fn bind_global_doorbell(&mut self, id: FwQueueId, page: u32, bit: u32) -> Result<(), GpuError> {
        if self.model != DoorbellModel::Global {
            return Err(GpuError::NoGlobalDoorbell { model: self.model });
        }
        if bit >= BITS_PER_PAGE {
            return Err(GpuError::NoGlobalDoorbellBit { bit, bits: BITS_PER_PAGE });
        }
        let old = self.queue(id)?.doorbell;
        self.forget_bit(id, old);
        if !self.bit_pages.contains_key(&page) {
            let words = (0..BITS_PER_PAGE / 64).map(|w| self.bar.page_word(page, w)).collect::<Result<_, _>>()?;
            self.bit_pages.insert(page, BitPage { words, queues: vec![None; BITS_PER_PAGE as usize], bound: [0; 8] });
        }
        let bp = self.bit_pages.get_mut(&page).expect("inserted above");
        // A queue that held the bit before loses it (the OS hands each index out once).
        if let Some(prev) = bp.queues[bit as usize].replace(id)
            && let Ok(q) = self.queue_mut(prev)
        {
            q.doorbell = None;
        }
        let bp = self.bit_pages.get_mut(&page).expect("inserted above");
        bp.bound[bit as usize / 64] |= 1 << (bit % 64);
        // Nothing to reset: a bit a previous owner of this index left set only makes us
        // re-read this queue's wptr once.
        let (e, q) = self.engine_and_queue(id)?;
        e.resched = true;
        q.doorbell = Some(Binding::Bit { page, bit });
        // Work published while disconnected rang the dummy page: find it through wptr.
        find_published_work(e, q, id);
        Ok(())
    }

    /// Drops queue `id`'s bit, if `binding` is one.
    fn forget_bit(&mut self, id: FwQueueId, binding: Option<Binding>) {
        let Some(Binding::Bit { page, bit }) = binding else { return };
        let Some(bp) = self.bit_pages.get_mut(&page) else { return };
        if bp.queues[bit as usize] == Some(id) {
            bp.queues[bit as usize] = None;
            bp.bound[bit as usize / 64] &= !(1 << (bit % 64));
        }
        if bp.bound.iter().all(|&w| w == 0) {
            self.bit_pages.remove(&page);
        }
    }

    /// Starts watching BAR page `page` as an aggregated doorbell (one per process).
    pub(crate) fn watch_aggregated(&mut self, page: u32) -> Result<(), GpuError> {
        if !self.aggregated.iter().any(|&(p, _)| p == page) {
            let word = self.bar.page_word(page, 0)?;
            self.aggregated.push((page, word));
        }
        Ok(())
    }

    /// Stops watching it.
    pub(crate) fn unwatch_aggregated(&mut self, page: u32) {
        self.aggregated.retain(|(p, _)| *p != page);
    }

    pub(crate) fn model(&self) -> DoorbellModel {
        self.model
    }

    pub(crate) fn misses_unmapped(&self) -> bool {
        self.misses_unmapped
    }

    pub(crate) fn unbind_doorbell(&mut self, id: FwQueueId) -> Result<(), GpuError> {
        let binding = self.queue(id)?.doorbell;
        self.forget_bit(id, binding);
        let (e, q) = self.engine_and_queue(id)?;
        e.watches.retain(|w| w.queue != id);
        e.resched = true;
        q.doorbell = None;
        // A ring that raced the disconnect may never be seen on the BAR: re-read wptr.
        find_published_work(e, q, id);
        Ok(())
    }

    pub(crate) fn set_monitored(&mut self, id: FwQueueId, value: u64) -> Result<(), GpuError> {
        self.queue_mut(id)?.monitored = value;
        Ok(())
    }

    pub(crate) fn queue_state(&self, id: FwQueueId) -> Result<QueueState, GpuError> {
        Ok(self.queue(id)?.state)
    }

    pub(crate) fn queue_fault(&self, id: FwQueueId) -> Result<Option<FaultRecord>, GpuError> {
        Ok(self.queue(id)?.fault.clone())
    }

    pub(crate) fn queue_has_work(&self, id: FwQueueId) -> Result<bool, GpuError> {
        Ok(self.queue(id)?.has_work())
    }

    pub(crate) fn power(&self, engine: EngineId) -> Result<PowerState, GpuError> {
        self.engines.get(engine.0 as usize).map(|e| e.power).ok_or(GpuError::BadEngine(engine.0))
    }

    pub(crate) fn request_f0(&mut self, engine: EngineId, now: Time) -> Result<(), GpuError> {
        let e = self.engine_mut(engine)?;
        e.power = PowerState::F0;
        e.f1_requested = false;
        e.last_busy = now;
        e.resched = true;
        Ok(())
    }

    pub(crate) fn enter_f1(&mut self, engine: EngineId, now: Time) -> Result<bool, GpuError> {
        let Firmware { engines, slots, .. } = self;
        let e = engines.get_mut(engine.0 as usize).ok_or(GpuError::BadEngine(engine.0))?;
        let mut busy = false;
        // A scan of the whole run list, but a rare one (the kernel's answer to an idle request).
        for k in 0..e.run_list.len() {
            let id = e.run_list[k];
            let q = live_queue(slots, id).ok_or(GpuError::StaleQueue(id))?;
            if q.state != QueueState::Hung && (q.pending || q.has_work()) {
                mark_pending(e, q, id);
                busy = true;
            }
        }
        e.f1_requested = false;
        e.resched = true;
        if busy {
            e.last_busy = now;
        } else {
            e.power = PowerState::F1;
        }
        Ok(!busy)
    }

    pub(crate) fn all_asleep(&self) -> bool {
        self.engines.iter().all(|e| e.power == PowerState::F1)
    }

    pub(crate) fn poll_doorbells(&mut self) -> bool {
        let misses = self.misses_unmapped;
        let mut rang = false;
        // Dedicated doorbells: a watched word that changed.
        for e in self.engines.iter_mut().filter(|e| e.power == PowerState::F0) {
            for k in 0..e.watches.len() {
                let w = &mut e.watches[k];
                // Acquire: pairs with the client's release store of the doorbell, so the wptr it
                // stored before ringing is visible to the wptr load that follows. (With a
                // relaxed load the firmware could see the ring yet read the old wptr, and
                // conclude the queue is idle.)
                let v = w.word.get().load(Ordering::Acquire);
                if v != w.last {
                    w.last = v;
                    let id = w.queue;
                    if let Some(q) = live_queue(&mut self.slots, id) {
                        rang |= latch_ring(e, q, id, misses);
                    }
                }
            }
        }
        // Global-doorbell bit pages: each set bit names a queue of that page's process. A bit
        // of a queue whose engine is in F1 goes back (the engine is not watching); a bit that
        // names no queue is dropped. Either way a bit only ever makes the firmware re-read one
        // queue's wptr.
        let Firmware { bit_pages, slots, engines, .. } = self;
        for bp in bit_pages.values() {
            for (w, &bound) in bp.bound.iter().enumerate() {
                if bound == 0 {
                    continue;
                }
                let word = &bp.words[w];
                let mut bits = protocol::take_rings(word);
                let mut back = 0;
                while bits != 0 {
                    let b = bits.trailing_zeros();
                    bits &= bits - 1;
                    let Some(id) = bp.queues[w * 64 + b as usize] else { continue };
                    let Some(q) = live_queue(slots, id) else { continue };
                    let e = &mut engines[q.cfg.engine.0 as usize];
                    if e.power == PowerState::F0 {
                        rang |= latch_ring(e, q, id, misses);
                    } else {
                        back |= 1 << b;
                    }
                }
                if back != 0 {
                    // Release, as a client's ring: the wptr stays visible to whoever takes it.
                    word.get().fetch_or(back, Ordering::Release);
                }
            }
        }
        // Aggregated doorbells (one page per process): bit `e` says some queue of engine `e`
        // rang, perhaps one without a slot whose own ring was missed. Poll the wptrs of that
        // engine's queues; bits of engines in F1 go back.
        let Firmware { aggregated, engines, slots, .. } = self;
        for (_, word) in aggregated.iter() {
            let bits = protocol::take_rings(word);
            if bits == 0 {
                continue;
            }
            let mut back = 0;
            for e in engines.iter_mut().filter(|e| bits & (1 << e.id.0) != 0) {
                if e.power != PowerState::F0 {
                    back |= 1 << e.id.0;
                    continue;
                }
                for k in 0..e.run_list.len() {
                    let id = e.run_list[k];
                    let Some(q) = live_queue(slots, id) else { continue };
                    if !q.pending && q.state != QueueState::Hung && q.wptr_moved() {
                        mark_pending(e, q, id);
                        rang = true;
                    }
                }
            }
            if back != 0 {
                word.get().fetch_or(back, Ordering::Release);
            }
        }
        rang
    }

    pub(crate) fn step(&mut self, clock: &dyn Fn() -> Time, vms: &[Option<AddressSpace>]) -> StepReport {
        let now = clock();
        let mut report = StepReport::default();
        let Firmware {
            engines,
            slots,
            irqs,
            budget,
            wave_width,
            dispatch_budget,
            compute,
            fences,
            optimized_interrupts,
            quanta,
            fence_epoch,
            ..
        } = self;
        for e in engines.iter_mut().filter(|e| e.power == PowerState::F0) {
            schedule(e, slots, now, *quanta);
            let n = e.hqd.len();
            let mut busy = false;
            for k in 0..n {
                let id = e.hqd[(e.cursor + k) % n];
                let Some(q) = slots[id.index as usize].queue.as_mut() else { continue };
                if !q.pending || q.state != QueueState::Mapped {
                    continue;
                }
                busy = true;
                // Parked on a fence that has not changed: nothing to re-check. (It still has
                // work, so the engine stays awake, as for any queue blocked in a WAIT.)
                if q.parked == Some(*fence_epoch) {
                    continue;
                }
                q.parked = None;
                q.last_run = now;
                let before = compute.instructions;
                let mut env = Env {
                    fences,
                    optimized_interrupts: *optimized_interrupts,
                    clock,
                    kind: e.kind,
                    wave_width: *wave_width,
                    dispatch_budget: *dispatch_budget,
                    stats: compute,
                    irqs,
                    fence_epoch,
                };
                report.packets += run_queue(q, id, vms, *budget, &mut env);
                report.instructions += compute.instructions - before;
                if q.pending && q.state == QueueState::Mapped {
                    report.runnable += 1;
                } else {
                    // Idle or hung: its slot may go to a waiting queue.
                    e.resched = true;
                }
            }
            if n > 0 {
                e.cursor = (e.cursor + 1) % n;
            }
            if busy {
                e.last_busy = now;
            }
        }
        report
    }

    pub(crate) fn handle_timeout(&mut self, now: Time) {
        for e in self.engines.iter_mut() {
            if e.power != PowerState::F0 || e.f1_requested {
                continue;
            }
            let busy_queue = |id: &FwQueueId| {
                self.slots[id.index as usize].queue.as_ref().is_some_and(|q| q.pending && q.state != QueueState::Hung)
            };
            // A busy queue on the run list is either in a slot or in the waiting set (pending,
            // not hung, not in a slot): no scan of the run list.
            let busy = e.hqd.iter().any(busy_queue) || !e.waiting.is_empty();
            if busy {
                e.last_busy = now;
            } else if now.since(e.last_busy) >= self.idle_period {
                e.f1_requested = true;
                self.irqs.push_back(Interrupt::EngineStateChange { engine: e.id, state: EngineState::TransitionToF1 });
            }
        }
    }

    pub(crate) fn poll_timeout(&self) -> Option<Time> {
        self.engines
            .iter()
            .filter(|e| e.power == PowerState::F0 && !e.f1_requested)
            .map(|e| e.last_busy.plus(self.idle_period))
            .min()
    }

    pub(crate) fn poll_interrupt(&mut self) -> Option<Interrupt> {
        self.irqs.pop_front()
    }

    pub(crate) fn compute_stats(&self) -> ComputeStats {
        self.compute
    }

    pub(crate) fn register_fence(&mut self, current: (&Shm, u64), monitored: Word, id: u64, waits: FenceWaits) {
        self.fence_epoch += 1;
        self.fences.insert((current.0.id(), current.1), FenceEntry { id, monitored, waits });
    }

    pub(crate) fn unregister_fence(&mut self, current: (&Shm, u64)) {
        // A queue parked on it re-checks (and faults, if the memory went with it).
        self.fence_epoch += 1;
        self.fences.remove(&(current.0.id(), current.1));
    }

    /// Native fences may have changed behind the engines' back (a CPU update, another
    /// adapter's signal): every parked queue re-checks.
    pub(crate) fn notify_fences(&mut self) {
        self.fence_epoch += 1;
    }
}

/// Time slices for queues of equal priority (MES: process and gang quanta).
#[derive(Clone, Copy)]
struct Quanta {
    /// Between queues of different processes.
    process: std::time::Duration,
    /// Between queues of one process (one address space).
    gang: std::time::Duration,
}

/// The queue `id` names, if it still exists.
fn live_queue(slots: &mut [Slot], id: FwQueueId) -> Option<&mut FwQueue> {
    match slots.get_mut(id.index as usize) {
        Some(Slot { generation, queue: Some(q) }) if *generation == id.generation => Some(q),
        _ => None,
    }
}

/// Puts queue `id` at the end of `e`'s run list, stamped with its turn among equals.
fn join_run_list(e: &mut Engine, q: &mut FwQueue, id: FwQueueId) {
    e.run_list.push(id);
    q.on_run_list = true;
    q.seq = e.next_seq;
    e.next_seq += 1;
}

/// Re-reads `q`'s wptr (the fenced re-check of `abi::protocol`) and marks it pending if the
/// client published work no ring announced: what a doorbell bind or unbind and a resume do,
/// so that nothing published while disconnected or suspended is lost.
fn find_published_work(e: &mut Engine, q: &mut FwQueue, id: FwQueueId) {
    if q.state != QueueState::Hung && q.has_work() {
        mark_pending(e, q, id);
    }
}

/// A doorbell ring for `q` reached the engine: [`mark_pending`], unless the engine misses
/// doorbells of user queues without a hardware slot and `q` is one (the aggregated doorbell
/// will tell). Returns whether the ring was latched.
fn latch_ring(e: &mut Engine, q: &mut FwQueue, id: FwQueueId, misses_unmapped: bool) -> bool {
    // Kernel queues are the KMD's own and always heard (it rings no aggregated doorbell).
    if misses_unmapped && q.state != QueueState::Mapped && !q.cfg.privileged {
        return false;
    }
    // A ring of an idle queue without a slot that published nothing new (a spurious or
    // foreign ring) must not win it a slot: it would only evict a holder to run nothing.
    if q.state != QueueState::Mapped && !q.pending && !q.wptr_moved() {
        return false;
    }
    mark_pending(e, q, id);
    true
}

/// Marks queue `id` (`q`, on engine `e`) as having work: the one way `pending` becomes true.
///
/// Every discovery of work goes through here — a doorbell ring ([`Firmware::poll_doorbells`]),
/// the wptr re-reads of a doorbell bind or unbind, a context resume, a refused F1 — so that the
/// waiting set stays exact: a queue that is on the run list but not in a hardware slot (and not
/// hung) joins [`Engine::waiting`] here, and an unmapped queue that gains work asks for a
/// scheduling pass (`resched`), since it may deserve a slot. A mapped queue just runs on its
/// next turn. Marking a queue that is already pending changes nothing. O(log n).
///
/// The caller has checked whatever makes the work real (a changed doorbell word, `has_work`);
/// a hung queue may be marked (a ring on a hung queue's doorbell) but never waits.
fn mark_pending(e: &mut Engine, q: &mut FwQueue, id: FwQueueId) {
    // An unmapped queue that gains work may deserve a slot.
    e.resched |= !q.pending && q.state != QueueState::Mapped;
    q.pending = true;
    sync_waiting(e, q, id);
}

/// Puts `q` in `e`'s waiting set or takes it out, so that it is there exactly when
/// [`FwQueue::should_wait`] holds. Called after every change of what that depends on (the run
/// list, `pending`, the state): [`mark_pending`], suspend, resume, remove, and the scheduler
/// when it maps or evicts. (`pending` only turns false, and a queue only hangs, while it holds
/// a slot, where it is not waiting either way.) O(log n).
fn sync_waiting(e: &mut Engine, q: &mut FwQueue, id: FwQueueId) {
    let want = q.should_wait();
    match (q.waiting, want) {
        (false, true) => e.waiting.insert(q.class(), q.turn(), id),
        (true, false) => e.waiting.remove(q.class(), q.turn(), id),
        _ => {}
    }
    q.waiting = want;
}

/// Chooses which queues hold this engine's hardware slots (spec 001 "the scheduling firmware
/// dynamically maps and unmaps queues based on priority and time quanta"). Every queue on
/// the run list with work wants a slot; in order of priority (kernel queues first, then the
/// highest level, then the longest-waiting), each takes a free slot, or evicts a holder:
/// an idle one first, else one of lower priority (so a realtime queue evicts at once), else
/// one of equal priority that has used up its quantum. An evicted queue with work left is
/// `Preempted` — stopped at a packet boundary or a dispatch slice, state saved — and rings
/// on an unmapped queue are remembered: it runs when it gets a slot back.
///
/// The waiting queues come from [`Engine::waiting`], never from a scan of the run list. Whether
/// a holder can be evicted for a waiter depends only on the waiter's [`Class`], and within a
/// pass the set of holders evictable for a class only shrinks (a queue mapped in this pass is
/// never evicted in it): so once one queue of a class finds no victim, the rest of its class
/// is skipped. A pass therefore takes O((slots + classes) × (slots + classes)) plus O(log n)
/// per queue it maps, however long the run list.
///
/// One difference from the plain "walk every waiting queue" formulation: with a quantum of
/// zero, a queue mapped in this pass could there be evicted again later in the same pass by
/// another waiter of its priority; here it keeps its slot until the next pass. With a non-zero
/// quantum (the default, and every test) the two are the same.
fn schedule(e: &mut Engine, slots: &mut [Slot], now: Time, quanta: Quanta) {
    // Every queue holds a slot (the common case: no oversubscription): nothing can wait. A
    // hung queue may linger in `hqd`; the run loop skips it.
    if e.hqd.len() == e.run_list.len() {
        return;
    }
    // Nothing changed and no quantum ran out: the assignment stands.
    if !e.resched && e.resched_at.is_none_or(|t| now < t) {
        return;
    }
    e.resched = false;
    e.resched_at = None;
    let get = |slots: &[Slot], id: FwQueueId| {
        slots[id.index as usize]
            .queue
            .as_ref()
            .filter(|_| slots[id.index as usize].generation == id.generation)
            .map(|q| (q.state, q.pending, q.cfg.privileged, q.cfg.priority, q.cfg.vmid, q.slice_start))
    };
    e.hqd.retain(|&id| get(slots, id).is_some_and(|(st, ..)| st == QueueState::Mapped));
    if e.waiting.is_empty() {
        return;
    }
    // Classes of waiting queues no holder can make room for.
    let mut unplaced: Vec<Class> = Vec::new();
    // Mapped in this pass: not victims in it.
    let mut placed: Vec<FwQueueId> = Vec::new();
    // Evicted with work left: they wait again, but only from the next pass on.
    let mut evicted: Vec<FwQueueId> = Vec::new();
    // Kernel queues first, then priority, then whoever ran longest ago (then run-list order).
    while let Some((class, w)) = e.waiting.first(&unplaced) {
        let (w_priv, w_prio, w_vm) = (!class.user, class.priority.0, class.vmid);
        if e.hqd.len() >= e.hw_slots {
            // Pick a holder to evict: idle first, then lower priority (lowest first), then an
            // equal-priority one past its quantum (longest-running first). Kernel queues keep
            // their slots.
            let victim = e
                .hqd
                .iter()
                .copied()
                .filter(|id| !placed.contains(id))
                .filter_map(|id| {
                    let (_, pending, privileged, prio, vm, start) = get(slots, id)?;
                    if privileged && !w_priv {
                        return None;
                    }
                    let quantum = if vm == w_vm { quanta.gang } else { quanta.process };
                    let rank = if !pending {
                        0
                    } else if prio < w_prio {
                        1
                    } else if prio == w_prio && now.since(start) >= quantum {
                        2
                    } else {
                        return None;
                    };
                    Some((rank, prio, start, id))
                })
                .min_by_key(|&(rank, prio, start, _)| (rank, prio, start));
            let Some((_, _, _, v)) = victim else {
                unplaced.push(class);
                continue;
            };
            e.hqd.retain(|&id| id != v);
            if let Some(q) = slots[v.index as usize].queue.as_mut() {
                q.state = if q.pending { QueueState::Preempted } else { QueueState::Unmapped };
                if q.pending {
                    evicted.push(v);
                }
            }
        }
        e.hqd.push(w);
        placed.push(w);
        let q = slots[w.index as usize].queue.as_mut().expect("a waiting queue exists");
        q.state = QueueState::Mapped;
        q.slice_start = now;
        sync_waiting(e, q, w);
    }
    for v in evicted {
        if let Some(q) = slots[v.index as usize].queue.as_mut() {
            sync_waiting(e, q, v);
        }
    }
    // Look again when the first holder's quantum runs out against a class still waiting (it
    // lies ahead: a holder past its quantum would have been evicted above).
    e.resched_at = e
        .hqd
        .iter()
        .filter_map(|&id| get(slots, id))
        .flat_map(|(_, pending, privileged, prio, vm, start)| {
            unplaced.iter().filter_map(move |w| {
                let (w_priv, w_prio, w_vm) = (!w.user, w.priority.0, w.vmid);
                let contends = pending && prio == w_prio && (w_priv || !privileged);
                contends.then(|| start.plus(if vm == w_vm { quanta.gang } else { quanta.process }))
            })
        })
        .min();
}

/// Runs one queue for up to `budget` packets. Returns packets executed.
/// A `WAIT` blocked on the word `r` resolves to: if it is a native fence, the queue parks
/// until a fence changes (spec 002: "the firmware re-checks blocked queues when fences
/// change"); a plain memory word, which anyone may write without telling, is polled.
fn park_on_fence(q: &mut FwQueue, r: &crate::memory::Resolved<'_>, env: &Env<'_>) {
    if env.fences.get(&(r.shm.id(), r.offset)).is_some_and(|f| f.waits == FenceWaits::Park) {
        q.parked = Some(*env.fence_epoch);
    }
}

fn run_queue(q: &mut FwQueue, id: FwQueueId, vms: &[Option<AddressSpace>], budget: u32, env: &mut Env<'_>) -> u64 {
    let start_rptr = q.rptr;
    let mut done = 0u64;
    let result = (|| -> Result<(), (FaultKind, Option<Opcode>, bool)> {
        let vm = vms.get(q.cfg.vmid.0 as usize).and_then(Option::as_ref).ok_or((
            FaultKind::OutsideMappings { va: q.cfg.ring_va, bytes: 0, access: Access::Read },
            None,
            false,
        ))?;
        while done < budget as u64 {
            if let Some(mut ib) = q.ib {
                let ib_vm = match ib.vmid {
                    Some(v) => vms.get(v.0 as usize).and_then(Option::as_ref).ok_or((
                        FaultKind::BadIndirect { why: "vmid does not exist" },
                        Some(Opcode::IndirectBuffer),
                        false,
                    ))?,
                    None => vm,
                };
                if ib.pos >= ib.dwords {
                    q.ib = None;
                    q.rptr += Opcode::IndirectBuffer.fixed_dwords().unwrap_or(5) as u64 * 4;
                    continue;
                }
                let (packet, n) = fetch_indirect(ib_vm, &ib).map_err(|k| (k, None, true))?;
                match exec(packet, q, id, ib_vm, env, true).map_err(|k| (k, Some(packet.opcode()), true))? {
                    Flow::Blocked | Flow::Yield => return Ok(()),
                    Flow::Next => {
                        ib.pos += n as u32;
                        q.ib = Some(ib);
                        done += 1;
                    }
                }
                continue;
            }
            if q.rptr == q.wptr {
                q.refresh_wptr().map_err(|k| (k, None, false))?;
                if q.rptr == q.wptr {
                    q.pending = false;
                    return Ok(());
                }
            }
            let (packet, n) = fetch_ring(q).map_err(|(k, op)| (k, op, false))?;
            match exec(packet, q, id, vm, env, false).map_err(|k| (k, Some(packet.opcode()), false))? {
                Flow::Blocked | Flow::Yield => return Ok(()),
                Flow::Next => {
                    if q.ib.is_none() {
                        q.rptr += n as u64 * 4;
                    }
                    done += 1;
                }
            }
        }
        Ok(())
    })();
    if let Err((kind, opcode, in_indirect)) = result {
        let fault = FaultRecord { kind, rptr: q.rptr, opcode, in_indirect };
        q.state = QueueState::Hung;
        q.pending = false;
        q.dispatch_active = false;
        q.fault = Some(fault.clone());
        env.irqs.push_back(Interrupt::QueueFault { queue: id, fault });
    }
    if q.rptr != start_rptr {
        q.publish_rptr();
    }
    done
}

/// Fetches and decodes the packet at rptr.
fn fetch_ring(q: &FwQueue) -> Result<(Packet, usize), (FaultKind, Option<Opcode>)> {
    let ring_bytes = q.cfg.ring_bytes;
    let off = q.rptr & (ring_bytes - 1);
    let ring: &Mapping = &q.ring.shm;
    let base = q.ring.offset;
    let header = Header(ring.read_u32(base + off).map_err(|_| (outside(q.cfg.ring_va + off, 4), None))?);
    let op = header.check().map_err(|e| (FaultKind::BadPacket(e), None))?;
    let n = header.dwords() as u64;
    if off + n * 4 > ring_bytes {
        return Err((FaultKind::PastRingEnd { offset: off, dwords: n, ring_bytes }, Some(op)));
    }
    if q.rptr.checked_add(n * 4).is_none_or(|end| end > q.wptr) {
        return Err((FaultKind::PastWptr { rptr: q.rptr, dwords: n, wptr: q.wptr }, Some(op)));
    }
    decode_at(ring, base + off, header, op).map_err(|k| (k, Some(op)))
}

/// Fetches and decodes the next packet of an indirect buffer.
fn fetch_indirect(vm: &AddressSpace, ib: &IbCursor) -> Result<(Packet, usize), FaultKind> {
    let va = ib.va + ib.pos as u64 * 4;
    let r = vm.translate(va, 4, Access::Read)?;
    let header = Header(r.shm.read_u32(r.offset).map_err(|_| outside(va, 4))?);
    let op = header.check().map_err(FaultKind::BadPacket)?;
    let n = header.dwords();
    let have = (ib.dwords - ib.pos) as usize;
    if n > have {
        return Err(FaultKind::BadPacket(abi::packet::DecodeError::Truncated { need: n, have }));
    }
    let r = vm.translate(va, n as u64 * 4, Access::Read)?;
    decode_at(r.shm, r.offset, header, op)
}

/// Decodes a packet whose checked header is at `offset` of `m`.
fn decode_at(m: &Mapping, offset: u64, header: Header, op: Opcode) -> Result<(Packet, usize), FaultKind> {
    let n = header.dwords();
    if op == Opcode::Nop {
        return Ok((Packet::Nop { dwords: n as u16 }, n));
    }
    // Fixed-size packets are at most MAX_FIXED_PACKET_DWORDS long (checked by `Header::check`).
    let mut buf = [0u32; MAX_FIXED_PACKET_DWORDS];
    let words = &mut buf[..n.min(MAX_FIXED_PACKET_DWORDS)];
    m.read_u32s(offset, words).map_err(|_| outside(offset, n as u64 * 4))?;
    Packet::decode(words).map_err(FaultKind::BadPacket)
}

fn outside(va: u64, bytes: u64) -> FaultKind {
    FaultKind::OutsideMappings { va, bytes, access: Access::Read }
}

/// Executes one packet.
fn exec(
    p: Packet,
    q: &mut FwQueue,
    id: FwQueueId,
    vm: &AddressSpace,
    env: &mut Env<'_>,
    in_indirect: bool,
) -> Result<Flow, FaultKind> {
    let wfault = |va: u64, bytes: u64| FaultKind::OutsideMappings { va, bytes, access: Access::Write };
    // Whatever memory a packet writes may be a fence some queue is parked on — a signal, or a
    // misdirected WRITE_DATA — so every writing packet counts as a fence change. That costs an
    // increment, and parking can never lose a wake-up to this device's own writes: only writes
    // from outside (the CPU, another adapter) need the KMD's notification.
    if !matches!(p, Packet::Nop { .. } | Packet::Wait { .. } | Packet::Interrupt { .. } | Packet::IndirectBuffer { .. })
    {
        *env.fence_epoch += 1;
    }
    match p {
        Packet::Nop { .. } => {}
        Packet::WriteData { width, va, value } => {
            let r = vm.translate_aligned(va, width.bytes(), Access::Write)?;
            let res = match width {
                DataWidth::U32 => r.shm.write_u32(r.offset, value as u32),
                DataWidth::U64 => r.shm.write_u64(r.offset, value),
            };
            res.map_err(|_| wfault(va, width.bytes()))?;
        }
        Packet::Copy { src, dst, bytes } => {
            let s = vm.translate(src, bytes, Access::Read)?;
            let d = vm.translate(dst, bytes, Access::Write)?;
            Mapping::copy(s.shm, s.offset, d.shm, d.offset, bytes).map_err(|_| wfault(dst, bytes))?;
        }
        Packet::Fill { dst, bytes, pattern } => {
            let d = vm.translate(dst, bytes, Access::Write)?;
            d.shm.fill_u32(d.offset, bytes, pattern).map_err(|_| wfault(dst, bytes))?;
        }
        Packet::Timestamp { va } => {
            let r = vm.translate_aligned(va, 8, Access::Write)?;
            r.shm.write_u64(r.offset, (env.clock)().as_nanos()).map_err(|_| wfault(va, 8))?;
        }
        Packet::IndirectBuffer { va, dwords, vmid } => {
            if in_indirect {
                return Err(FaultKind::BadIndirect { why: "an indirect buffer may not contain another" });
            }
            let vmid = match (vmid, q.cfg.privileged) {
                (0, _) => None,
                (v, true) => Some(Vmid(v)),
                (_, false) => return Err(FaultKind::BadIndirect { why: "vmid must be 0 on a user queue" }),
            };
            if vmid.is_none() {
                vm.translate(va, dwords as u64 * 4, Access::Read)?;
            }
            q.ib = Some(IbCursor { va, dwords, pos: 0, vmid });
        }
        Packet::Signal { va, value } => {
            let r = vm.translate_aligned(va, 8, Access::Write)?;
            let word = r.shm.atomic_u64(r.offset).map_err(|_| wfault(va, 8))?;
            match env.fences.get(&(r.shm.id(), r.offset)) {
                // A plain SIGNAL that lands on a native fence still owes its CPU waiters the
                // interrupt check: a fence is a fence whatever the packet's flags say.
                Some(f) => {
                    let monitored = &f.monitored;
                    if abi::protocol::signal_fence(word, monitored, value, || {}) {
                        env.irqs.push_back(Interrupt::NativeFenceSignaled(FenceSignaled::Fences(vec![f.id])));
                    }
                }
                // Release: everything the queue wrote before the signal is visible to whoever
                // acquires the new value.
                None => word.store(value, Ordering::Release),
            }
        }
        Packet::SignalFence { va, value } => {
            let r = vm.translate_aligned(va, 8, Access::Write)?;
            let f = env.fences.get(&(r.shm.id(), r.offset)).ok_or(FaultKind::NotAFence { va })?;
            let current = r.shm.atomic_u64(r.offset).map_err(|_| wfault(va, 8))?;
            let monitored = &f.monitored;
            // Store CurrentValue, barrier, read MonitoredValue (spec 002, `abi::protocol`).
            if abi::protocol::signal_fence(current, monitored, value, || {}) {
                env.irqs.push_back(Interrupt::NativeFenceSignaled(FenceSignaled::Fences(vec![f.id])));
            }
        }
        Packet::Logged { op, va, value, entry } => {
            let logs = q
                .cfg
                .fence_logs
                .clone()
                .ok_or(FaultKind::BadField { field: "log entry", why: "this queue has no fence log" })?;
            let fence =
                vm.translate_aligned(va, 8, Access::Read).ok().and_then(|r| env.fences.get(&(r.shm.id(), r.offset)));
            let handle = fence.map_or(0, |f| f.id);
            match op {
                LoggedOp::Wait => {
                    let r = vm.translate_aligned(va, 8, Access::Read)?;
                    let now = (env.clock)();
                    let observed = *q.wait_observed.get_or_insert(now);
                    // Acquire: pairs with the signaller's release store.
                    if r.shm.load_u64(r.offset, Ordering::Acquire).map_err(|_| outside(va, 8))? < value {
                        park_on_fence(q, &r, env);
                        return Ok(Flow::Blocked);
                    }
                    q.wait_observed = None;
                    // 1. the wait released; 2. the entry; 3. the index; 4. the barrier.
                    fence_log::append(
                        &logs[0],
                        entry,
                        FenceLogEntry {
                            fence_value: value,
                            fence_handle: handle,
                            operation: FenceLogOp::WaitUnblocked as u32,
                            observed_timestamp: observed.as_nanos(),
                            end_timestamp: now.as_nanos(),
                            ..Default::default()
                        },
                    );
                    std::sync::atomic::fence(Ordering::SeqCst);
                }
                LoggedOp::Signal | LoggedOp::SignalFence => {
                    let r = vm.translate_aligned(va, 8, Access::Write)?;
                    let current = r.shm.atomic_u64(r.offset).map_err(|_| wfault(va, 8))?;
                    let now = (env.clock)();
                    let entry_of = |h| FenceLogEntry {
                        fence_value: value,
                        fence_handle: h,
                        operation: FenceLogOp::SignalExecuted as u32,
                        observed_timestamp: now.as_nanos(),
                        end_timestamp: now.as_nanos(),
                        ..Default::default()
                    };
                    if op == LoggedOp::Signal && fence.is_none() {
                        current.store(value, Ordering::Release);
                        fence_log::append(&logs[1], entry, entry_of(handle));
                        std::sync::atomic::fence(Ordering::SeqCst);
                    } else {
                        // A fence signal (flagged, or a plain one landing on a fence).
                        let f = fence.ok_or(FaultKind::NotAFence { va })?;
                        let monitored = &f.monitored;
                        // 1. value; 2. entry; 3. index — inside the protocol, before its barrier
                        // (4) and the interrupt check (5): spec 002 "Order of operations".
                        let interrupt = abi::protocol::signal_fence(current, monitored, value, || {
                            fence_log::append(&logs[1], entry, entry_of(f.id))
                        });
                        if interrupt {
                            // Optimized: name the queue; the kernel reads its signal log.
                            let what = if env.optimized_interrupts {
                                FenceSignaled::Queues(vec![id])
                            } else {
                                FenceSignaled::Fences(vec![f.id])
                            };
                            env.irqs.push_back(Interrupt::NativeFenceSignaled(what));
                        }
                    }
                }
            }
        }
        Packet::Wait { va, value } => {
            let r = vm.translate_aligned(va, 8, Access::Read)?;
            // Acquire: pairs with the signaller's release store.
            let v = r.shm.load_u64(r.offset, Ordering::Acquire).map_err(|_| outside(va, 8))?;
            if v < value {
                park_on_fence(q, &r, env);
                return Ok(Flow::Blocked);
            }
        }
        Packet::ProgressFence { value } => {
            if value < q.completed {
                return Err(FaultKind::ProgressBackwards { completed: q.completed, value });
            }
            let word = q.cfg.kernel_page.progress_completed().get();
            // Release: the command buffer's writes happen-before a waiter's acquire of the value.
            word.store(value, Ordering::Release);
            q.completed = value;
            if value > q.monitored {
                env.irqs.push_back(Interrupt::ProgressFence { queue: id, value });
            }
        }
        Packet::Interrupt { id: user } => env.irqs.push_back(Interrupt::User { queue: id, id: user }),
        Packet::Dispatch { kernel, grid, group, args } => {
            if env.kind != EngineKind::Compute {
                return Err(FaultKind::BadDispatch { why: "only compute engines run kernels" });
            }
            let save = &q.cfg.context_save;
            // A dispatch part-way done resumes from its saved state; the packet in the ring
            // (client memory) is not read again.
            let mut d = if q.dispatch_active {
                Dispatch::restore(vm, save, 0, env.wave_width)?
            } else {
                Dispatch::start(vm, kernel, grid, group, args, env.wave_width)?
            };
            match d.run(vm, env.dispatch_budget, env.stats)? {
                Progress::Done => q.dispatch_active = false,
                Progress::Yield => {
                    d.save(save, 0)?;
                    q.dispatch_active = true;
                    return Ok(Flow::Yield);
                }
            }
        }
    }
    Ok(Flow::Next)
}
