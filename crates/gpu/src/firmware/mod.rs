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
//!    pending; a queue blocked in a `WAIT` stays pending and is re-checked next round (or,
//!    once it has given its slot up to a waiting queue, sleeps until the `WAIT` passes).
//! 3. Interrupts (fault, engine state change, user, progress fence above the monitored value)
//!    queue on the line for [`Firmware::poll_interrupt`].
//!
//! The firmware keeps its own copies of rptr and of the last wptr it validated: a client that
//! scribbles over its rptr word cannot make the engine re-run or skip work, and a wptr that
//! moves backwards, is not dword aligned or runs more than a ring ahead hangs the queue.
//!
//! Doorbell bind and unbind both re-read the queue's wptr: a submission published while the
//! doorbell was disconnected, or whose ring raced the disconnect, is found there. Entering F1
//! is refused while any queue on the run list has work; a queue the kernel holds off the run
//! list keeps its work through F1, and [`Firmware::resume_queue`] finds it again (the kernel
//! wakes the engine with it). Those rules are why no submission is lost across a doorbell
//! disconnect or an engine power transition.
//!
//! With more queues than hardware slots, only the slot holders (`hqd`) execute; [`schedule`]
//! decides who holds the slots. It never scans the run list, which may hold thousands of
//! queues: each engine keeps a **waiting set** ([`Engine::waiting`]), ordered like the
//! scheduler's waiting order (kernel queues, then priority, then whoever ran longest ago, then
//! run-list order) and grouped by [`Class`] so a pass looks at one head per class. Its
//! invariant: a queue is in the waiting set exactly when it is on the run list, pending, not
//! hung, not asleep on a `WAIT` and not in a slot ([`schedule::Seat::should_wait`]). Every `pending = true` goes through
//! [`mark_pending`], and every other change of those facts (suspend, resume, remove, map,
//! evict) through [`sync_waiting`], which keep it.
//!
//! The firmware is split along the spec's seams: [`doorbells`] (bindings, the global model's
//! bit pages, aggregated pages, latching rings), [`schedule`] (classes, the waiting set,
//! quanta, the slot assignment), [`exec`] (fetch, decode, execute, fence logs, the step).
//! This module holds the queue table, the engines, power, and the per-engine timer table
//! ([`Timers`]) that feeds [`Firmware::poll_timeout`].

use std::sync::Arc;
use std::sync::atomic::Ordering;

use abi::doorbell::DoorbellModel;
use abi::fence_log::{self, FenceLogEntry, FenceLogOp};
use abi::packet::{DataWidth, Header, LoggedOp, MAX_FIXED_PACKET_DWORDS, Opcode, Packet};
use abi::preempt::Stop;
use abi::protocol;
use abi::queue::{Access, FaultKind, FaultRecord};
use abi::slab::{Key, Slab};
use abi::{EngineId, EngineKind, EngineState, PowerState, Priority, QueueState};
use shm::{Mapping, Shm, Word};

use crate::Time;
use crate::compute::{ComputeStats, Dispatch, Progress};
use crate::config::GpuConfig;
use crate::error::GpuError;
use crate::memory::{AddressSpace, Vmid};

mod busy;
mod cb_clock;
mod command_log;
mod doorbells;
mod exec;
mod hardware;
pub(crate) mod preempt;
mod schedule;

pub use command_log::{CommandRecord, MemoryRecord, QueueRecord};
use doorbells::{Binding, BitPage, MAX_POINTER, Watch, find_published_work};
use exec::Place;
use preempt::{FwLog, PreemptRequest, StopPoint};
use schedule::{Quanta, Waiting, join_run_list, mark_pending, sync_waiting};

/// A queue in the firmware's table: its entry and the entry's generation (a key of the
/// workspace's generation-checked slab), so a removed queue's id never names its successor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FwQueueId(Key);

impl FwQueueId {
    /// The id as one number (generation in the high half, entry in the low half), for tools
    /// that key their own tables by it.
    pub fn to_bits(self) -> u64 {
        (self.0.generation() as u64) << 32 | self.0.index() as u64
    }

    /// The id [`FwQueueId::to_bits`] gave (a stale one names nothing; lookups say so).
    pub fn from_bits(bits: u64) -> FwQueueId {
        FwQueueId(Key::from_parts(bits as u32, (bits >> 32) as u32))
    }
}

impl core::fmt::Display for FwQueueId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "fwq{}.g{}", self.0.index(), self.0.generation())
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
    /// GPU VA of the queue's last-queued progress value (spec 000's
    /// `HwQueueProgressFenceLastQueuedValue`), which the firmware reads right after each wptr
    /// it validates: a `PROGRESS_FENCE` above it faults the queue
    /// ([`FaultKind::ProgressBeyondQueued`]). `None`: progress values are only checked to move
    /// forward.
    pub last_queued_va: Option<u64>,
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
    /// A kernel preemption request was answered: the queue is off its hardware slot with its
    /// state saved (spec 003), and off the run list until resumed.
    Preempted {
        /// The queue.
        queue: FwQueueId,
        /// The request's ticket ([`crate::cmd::RequestPreempt`]).
        ticket: u64,
        /// When it was asked for (device time).
        requested_at: Time,
        /// When the queue stopped (device time).
        answered_at: Time,
    },
    /// A `PROGRESS_FENCE` wrote a value above the queue's monitored value.
    ProgressFence {
        /// The queue.
        queue: FwQueueId,
        /// The value written.
        value: u64,
    },
    /// A disconnected queue's BAR doorbell word changed: a ring the CPU cannot have made (its
    /// doorbell CPU VA shows the dummy page), so another queue rang it from the GPU (spec 001
    /// "the GPU [can] submit work to itself"). Nobody watches the word until the kernel
    /// reconnects the doorbell, which it does on this interrupt (and the bind re-reads wptr).
    DisconnectedRing {
        /// The queue.
        queue: FwQueueId,
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

/// What one `Firmware::step` did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepReport {
    /// Packets executed (indirect-buffer contents included).
    pub packets: u64,
    /// Queues that still want to run (pending or blocked).
    pub runnable: u32,
    /// Kernel wave-instructions executed.
    pub instructions: u64,
    /// Bytes moved by `COPY`/`FILL` (a chunk of a large one is progress before its packet
    /// completes).
    pub bytes: u64,
    /// Hardware slots ([`crate::hw`]) executing, or given a command in this step they have not
    /// answered: their engines run by themselves, so a driver that steps until nothing
    /// happens steps again.
    pub hardware: u32,
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
    /// The client's last-queued word ([`QueueConfig::last_queued_va`]).
    last_queued_word: Option<Word>,
    /// Its value as read right after the last wptr the firmware validated: the most a
    /// `PROGRESS_FENCE` in the work that wptr published may write.
    queued: u64,
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
    /// Device time it has spent executing its work in a hardware slot (ns, only grows): the
    /// turns that ran packets, instructions or chunks of its ring. A turn that only re-checked
    /// a `WAIT` that did not pass adds nothing, nor does time off a slot (waiting for one,
    /// preempted, suspended, its engine in F1). The kernel's hang timer reads it
    /// ([`Firmware::queue_run_ns`]) to tell a queue that runs without progress from one that
    /// waits.
    run_ns: u64,
    /// A `DISPATCH` at rptr is part-way done: its state is in `live`, or in the context save
    /// area.
    dispatch_active: bool,
    /// That dispatch's state while the queue holds its hardware slot. As on hardware, a mapped
    /// queue's waves stay on the engine between its turns; they reach the context save area
    /// only when the queue leaves its slot ([`FwQueue::spill`]: an eviction, a preemption, a
    /// reset that spares it). So a turn that ends, or is cut short for a higher-priority
    /// queue, saves and restores nothing.
    live: Option<Box<Dispatch>>,
    /// A `COPY`/`FILL` at rptr is part-way done: this many bytes of it are (a chunk
    /// boundary, [`crate::cost::CostModel::bulk_chunk`]).
    bulk_done: Option<u64>,
    /// When the engine first saw the logged `WAIT` it is blocked on (the log's observed time).
    wait_observed: Option<Time>,
    /// Blocked in a `WAIT` on a native fence, as of this fence epoch: not re-checked until a
    /// fence changes.
    parked: Option<u64>,
    /// On its engine's run list (not suspended).
    on_run_list: bool,
    /// A preemption request it has not answered yet ([`preempt`]).
    preempt: Option<PreemptRequest>,
    /// It last completed a `PROGRESS_FENCE` (or nothing yet): it stands at the end of a
    /// command buffer, where `DmaBuffer` preemption stops.
    at_cb_boundary: bool,
    /// Its last turn ended in a `WAIT` that did not pass.
    blocked: bool,
    /// Its current command buffer's start and execution time, while completions are
    /// recorded.
    cb: cb_clock::CbClock,
    /// The condition of the last `WAIT` it blocked on (what [`exec::wake_sleepers`] checks
    /// while it sleeps off its slot).
    wait_on: Option<WaitOn>,
    /// Off its slot and asleep on that `WAIT` ([`schedule::unseat`]).
    asleep: bool,
    /// When its address space got the slot it holds (the process quantum runs from here;
    /// see [`schedule::Seat::process_start`]).
    process_start: Time,
    /// Preempted with its state saved at this point; the first turn after logs the restore.
    saved: Option<StopPoint>,
    /// Its place in run-list order: stamped from [`Engine::next_seq`] each time it joins the
    /// run list, so among waiting queues that ran at the same time the earlier joiner goes
    /// first, as in a stable sort of the run list.
    seq: u64,
    /// In its engine's waiting set ([`Engine::waiting`]), under its [`schedule::Seat`]'s class
    /// and turn. Kept equal to [`schedule::Seat::should_wait`] by [`sync_waiting`].
    waiting: bool,
    /// Loaded in this hardware slot of its engine ([`hardware`]): its execution state is the
    /// slot's until the slot answers a stop.
    hw_slot: Option<u32>,
}

/// The condition a `WAIT` blocks on: the 64-bit word at `va` of address space `vmid` reaching
/// `value`.
#[derive(Clone, Copy, Debug)]
struct WaitOn {
    vmid: Vmid,
    va: u64,
    value: u64,
    /// The word is a native fence whose changes the device hears of (`FenceWaits::Park`): it
    /// can only have passed if the fence epoch moved.
    park: bool,
}

impl FwQueue {
    /// Reads and validates the client's wptr.
    fn refresh_wptr(&mut self) -> Result<(), FaultKind> {
        // Acquire: pairs with the client's release store of wptr, so the packets it covers are
        // visible before we fetch them.
        // The last-queued value is read with it, after it (spec 000: the client stores it
        // before it publishes wptr), so it covers every command buffer up to `new`.
        let (new, queued) = match &self.last_queued_word {
            Some(q) => {
                let (w, v) = abi::protocol::read_wptr_and_last_queued(&self.wptr_word, q);
                (w, Some(v))
            }
            None => (self.wptr_word.get().load(Ordering::Acquire), None),
        };
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
        if let Some(v) = queued {
            self.queued = v;
        }
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

    /// Writes the state of a dispatch kept live in the queue's slot to its context save area:
    /// the queue is leaving its slot. Cannot fail for a queue [`Firmware::add_queue`] accepted
    /// (its save area holds [`crate::compute::CONTEXT_SAVE_BYTES`], the most any state takes);
    /// should it, the queue hangs with the fault and its dispatch is lost.
    fn spill(&mut self) {
        if let Some(d) = self.live.take()
            && let Err(kind) = d.save(&self.cfg.context_save, 0)
        {
            preempt::hang(self, kind);
        }
    }

    fn publish_rptr(&self) {
        // Release: the client may reuse ring bytes below rptr once it sees it; our reads of
        // them happen before.
        self.rptr_word.get().store(self.rptr, Ordering::Release);
    }
}

/// Raised interrupts, oldest first, each with the device time it was raised at: with modelled
/// timing, a packet's interrupt carries the packet's modelled time inside its step (the step
/// runs at its start, the engine is busy until its modelled end); an interrupt raised outside
/// a step carries the time of the input that raised it, or [`Time::ZERO`] where none is
/// known (it is delivered when the driver takes it).
type Irqs = std::collections::VecDeque<(Time, Interrupt)>;

/// A firmware timer: every deadline at which an engine acts without an input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Timer {
    /// The engine has been idle for its idle period: ask the kernel for F1.
    Idle,
    /// A slot holder's quantum runs out against a waiting queue: redo the slot assignment.
    Quantum,
    /// With modelled timing: the engine finishes the work of its last step (the modelled
    /// end of its busy period) and may run again.
    Busy,
}

impl Timer {
    const COUNT: usize = 3;
}

/// One engine's timer table (quinn-proto's `TimerTable`): at most one deadline per
/// [`Timer`]. [`Firmware::poll_timeout`] is the earliest deadline over every engine, and
/// [`Firmware::handle_timeout`] fires the expired ones, so a driver that sleeps until
/// `poll_timeout` (the deterministic one jumps its clock there) misses none.
#[derive(Clone, Copy, Debug, Default)]
struct Timers([Option<Time>; Timer::COUNT]);

impl Timers {
    fn set(&mut self, timer: Timer, at: Option<Time>) {
        self.0[timer as usize] = at;
    }
    fn get(&self, timer: Timer) -> Option<Time> {
        self.0[timer as usize]
    }
    fn expired(&self, timer: Timer, now: Time) -> bool {
        self.get(timer).is_some_and(|t| now >= t)
    }
    fn earliest(&self) -> Option<Time> {
        self.0.iter().flatten().min().copied()
    }
}

struct Engine {
    id: EngineId,
    kind: EngineKind,
    power: PowerState,
    f1_requested: bool,
    last_busy: Time,
    /// How long it has executed (`busy.rs`).
    busy: busy::BusyTime,
    /// How long without work before the engine asks for F1.
    idle_period: std::time::Duration,
    /// Its timers (the idle timer, the quantum timer).
    timers: Timers,
    /// Every queue the firmware may schedule on this engine (amdgpu's run list).
    run_list: Vec<FwQueueId>,
    /// How many of `run_list` are kernel queues (kept by [`schedule::join_run_list`] and
    /// [`schedule::leave_run_list`]), so INFO's slot split does not count them on every ask.
    kernel_queues: usize,
    /// Whether every kernel queue of the run list fits the slots (`kernel_queues <=
    /// hw_slots`), as the waiting set was last kept by: then an idle kernel queue waits for a
    /// slot too (always mapped, spec 001), otherwise only one with work does
    /// ([`schedule::Seat::should_wait`]; [`schedule::schedule`] re-keeps the set when it
    /// changes).
    kernel_fit: bool,
    /// The queues in hardware slots (HQDs): at most `hw_slots`; only these execute.
    hqd: Vec<FwQueueId>,
    hw_slots: usize,
    /// The watched dedicated doorbells, in bind order (`None`: a removed one, until the list
    /// is compacted; see `doorbells::forget_watch`).
    watches: Vec<Option<Watch>>,
    /// Where each queue's watch is in `watches`.
    watch_at: abi::slab::KeyMap<FwQueueId, usize>,
    cursor: usize,
    /// Whether the slot assignment must be recomputed: set by everything that can change who
    /// deserves a slot (a queue added, removed, suspended, resumed, (dis)connected; an
    /// unmapped queue gaining work; a mapped one going idle or hanging; a power change).
    /// Otherwise [`schedule`] only looks again when the quantum timer fires.
    resched: bool,
    /// The waiting set: exactly the queues for which [`schedule::Seat::should_wait`] holds (on the
    /// run list, pending, not hung, not in `hqd`). Maintained by [`sync_waiting`], which every
    /// change of those four facts goes through, so a scheduling pass never scans the run list.
    waiting: Waiting,
    /// The next [`FwQueue::seq`].
    next_seq: u64,
    /// Where it may stop a queue's work ([`preempt`]).
    stop: Stop,
    /// The doorbells of queues that would take a slot from a holder if they rang (higher
    /// priority than the lowest holder, not in a slot), with the value last seen: a turn in
    /// progress checks them at its safe points and ends early when one changes, so that queue
    /// is mapped and runs at once. Rebuilt by each scheduling pass; empty past
    /// [`preempt::MAX_SENTINEL_WATCHES`] watched doorbells.
    sentinels: Vec<preempt::Sentinel>,
    /// Queues mapped into a hardware slot so far (slot changes, for the simulator's counts).
    slot_maps: u64,
    /// Queues asleep off their slots on a `WAIT` that did not pass ([`schedule::unseat`]),
    /// checked at each step until it does ([`exec::wake_sleepers`]). An entry whose queue no
    /// longer sleeps (suspended, removed, hung) is dropped at the next check.
    asleep: Vec<FwQueueId>,
    /// The fence epoch at the last check of `asleep`.
    asleep_epoch: u64,
    /// Queues the scheduler evicted in this step, whose dispatch state may still be live
    /// ([`FwQueue::live`]): written to their save areas at the end of the step
    /// ([`exec::spill_evicted`]), so that the queue that took the slot starts first. Nobody can
    /// look at a save area during a step (the kernel waits for the device lock), and a queue
    /// mapped again in the same step simply keeps its state.
    unspilled: Vec<FwQueueId>,
    /// A scheduling pass's working lists, kept between passes ([`schedule::PassScratch`]).
    pass: schedule::PassScratch,
    /// A step's lists of turns, kept between steps ([`exec::Turns`]).
    turns: exec::Turns,
}

/// The firmware state machine. See the module docs.
pub(crate) struct Firmware {
    budget: u32,
    /// What work costs in device time (turn budgets, bulk chunks, occupancy).
    cost: crate::cost::CostModel,
    /// Whether those costs occupy the engine.
    timing: crate::cost::Timing,
    wave_width: u32,
    dispatch_budget: u64,
    compute: ComputeStats,
    fences: FenceTable,
    optimized_interrupts: bool,
    quanta: Quanta,
    engines: Vec<Engine>,
    /// The queue table (amdgpu: the MQDs the firmware was given).
    queues: Slab<FwQueue>,
    /// Interrupts raised and not yet taken, each with the device time it was raised at
    /// ([`Irqs`]).
    irqs: Irqs,
    /// Spec 000's doorbell model.
    model: DoorbellModel,
    /// The global model's bit pages, by BAR page.
    bit_pages: std::collections::BTreeMap<u32, BitPage>,
    /// Aggregated doorbell pages being watched (when engines miss unmapped queues' doorbells).
    aggregated: Vec<(u32, Vec<Word>)>,
    /// The doorbell BAR the engines watch.
    bar: abi::doorbell::DoorbellBar,
    /// Engines drop rings of queues without a hardware slot.
    misses_unmapped: bool,
    /// Bumped whenever a native fence may have changed: a packet that writes memory executed
    /// here, a CPU update or another adapter's signal (`notify_fences`), a fence registered or
    /// destroyed. A queue parked on a fence `WAIT` re-checks only when it moved.
    fence_epoch: u64,
    /// Bumped at every doorbell bind and every ring seen on a watched BAR word: the clock of
    /// each doorbell's `last_used` (`doorbells::Watch`).
    use_seq: u64,
    /// BAR doorbell words of queues the kernel disconnected (unbound), still theirs until
    /// another binding takes the word: a change is a ring from the GPU, raised as
    /// [`Interrupt::DisconnectedRing`] (`doorbells::Dormant`).
    dormant: Vec<doorbells::Dormant>,
    /// Where engines may stop work for a preemption (`D3DKMDT_PREEMPTION_CAPS`).
    preemption: abi::preempt::PreemptionCaps,
    /// The last preemption ticket handed out.
    next_ticket: u64,
    /// Requests, answers, saves, restores and resets, in order ([`preempt::FwEvent`]).
    log: FwLog,
    /// Raised by the kernel while it waits for the device lock ([`crate::attention::Attention`]).
    attention: crate::attention::Attention,
    /// With modelled timing: when the driver next lets a client act ([`crate::Gpu::set_horizon`]).
    horizon: Option<Time>,
    /// Every `PROGRESS_FENCE` executed, with its modelled end, when a tool asked for them
    /// ([`crate::Gpu::record_completions`]; the simulator's observation point).
    pub(crate) completions: Option<Vec<Completion>>,
    /// The hardware the engines' slots are, when they are not virtual ([`hardware`]).
    hw: Option<hardware::HwSide>,
    /// The device time of the last step (what a command with no time of its own is stamped
    /// with).
    last_step: Time,
}

impl Firmware {
    /// Queues holding a hardware slot on `engine` now, and queues mapped into one so far.
    pub(crate) fn slots(&self, engine: EngineId) -> Option<(usize, u64)> {
        self.engines.get(engine.0 as usize).map(|e| (e.hqd.len(), e.slot_maps))
    }
}

/// A `PROGRESS_FENCE` the engine executed: which queue, the value it wrote, the device time at
/// which the packet ended (its modelled end with [`crate::Timing::Modelled`]), and how its
/// command buffer ran: when its first packet executed and for how long its packets executed
/// (`cb_clock.rs`). All device times, so with modelled timing the latency split is exact.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The queue.
    pub queue: FwQueueId,
    /// The progress value written.
    pub value: u64,
    /// When the packet ended.
    pub at: Time,
    /// When the command buffer it ends began executing (its first packet; a `WAIT` at its
    /// head starts it when it passes). At most `at`.
    pub started: Time,
    /// Device time its packets executed, between `started` and `at` (ns); the rest of that
    /// span it was off the engine (switched out, preempted, blocked in a `WAIT` part-way).
    pub exec_ns: u64,
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
/// Its keys are the kernel's own (a region id and an offset it registered): [`abi::slab::KeyHasher`].
type FenceTable = abi::slab::KeyMap<(u64, u64), FenceEntry>;

impl Engine {
    /// An engine in F0 with `hw_slots` hardware slots (at least one), an empty run list, and
    /// its idle timer armed.
    fn new(id: EngineId, kind: EngineKind, hw_slots: u32, idle_period: std::time::Duration, stop: Stop) -> Engine {
        Engine {
            id,
            kind,
            power: PowerState::F0,
            f1_requested: false,
            last_busy: Time::ZERO,
            busy: busy::BusyTime::default(),
            idle_period,
            timers: Timers([Some(Time::ZERO.plus(idle_period)), None, None]),
            run_list: Vec::new(),
            kernel_queues: 0,
            kernel_fit: true,
            hqd: Vec::new(),
            hw_slots: hw_slots.max(1) as usize,
            watches: Vec::new(),
            watch_at: Default::default(),
            cursor: 0,
            resched: true,
            waiting: Waiting::default(),
            next_seq: 0,
            stop,
            sentinels: Vec::new(),
            slot_maps: 0,
            asleep: Vec::new(),
            asleep_epoch: u64::MAX,
            unspilled: Vec::new(),
            pass: Default::default(),
            turns: Default::default(),
        }
    }

    /// Re-arms the idle timer from `last_busy`: it runs while the engine is in F0 and has
    /// not asked for F1 yet.
    fn arm_idle(&mut self) {
        let at = (self.power == PowerState::F0 && !self.f1_requested).then(|| self.last_busy.plus(self.idle_period));
        self.timers.set(Timer::Idle, at);
    }
}

impl Firmware {
    /// A firmware for `cfg`, its slots on `cfg.hardware` when it names one.
    pub(crate) fn new(cfg: &GpuConfig, bar: abi::doorbell::DoorbellBar) -> Result<Firmware, crate::hw::HwError> {
        let hw = match &cfg.hardware {
            Some(factory) => {
                Some(hardware::HwSide::new((factory.make)()?, &cfg.engines, cfg.hw_slots, cfg.wave_width)?)
            }
            None => None,
        };
        let engines = cfg
            .engines
            .iter()
            .enumerate()
            .map(|(i, &kind)| {
                let stop = Engine::stop_rule(kind, cfg.preemption);
                Engine::new(EngineId(i as u32), kind, cfg.hw_slots, cfg.idle_period, stop)
            })
            .collect();
        Ok(Firmware {
            budget: cfg.packet_budget.max(1),
            cost: cfg.cost,
            timing: cfg.timing,
            wave_width: cfg.wave_width.clamp(1, crate::compute::MAX_WAVE as u32),
            dispatch_budget: cfg.dispatch_budget.max(1),
            compute: ComputeStats::default(),
            fences: FenceTable::default(),
            optimized_interrupts: cfg.optimized_fence_interrupts,
            quanta: Quanta { process: cfg.process_quantum, gang: cfg.gang_quantum },
            engines,
            queues: Slab::new(),
            irqs: Default::default(),
            model: cfg.doorbell_model,
            bit_pages: Default::default(),
            aggregated: Vec::new(),
            bar,
            misses_unmapped: cfg.misses_unmapped_doorbells,
            fence_epoch: 0,
            use_seq: 0,
            dormant: Vec::new(),
            preemption: cfg.preemption,
            next_ticket: 0,
            log: FwLog::default(),
            attention: crate::attention::Attention::default(),
            horizon: None,
            completions: None,
            hw,
            last_step: Time::ZERO,
        })
    }

    pub(crate) fn engine_kinds(&self) -> Vec<EngineKind> {
        self.engines.iter().map(|e| e.kind).collect()
    }

    fn engine_mut(&mut self, id: EngineId) -> Result<&mut Engine, GpuError> {
        self.engines.get_mut(id.0 as usize).ok_or(GpuError::BadEngine(id.0))
    }

    fn queue(&self, id: FwQueueId) -> Result<&FwQueue, GpuError> {
        self.queues.get(id.0).map_err(|_| GpuError::StaleQueue(id))
    }

    fn queue_mut(&mut self, id: FwQueueId) -> Result<&mut FwQueue, GpuError> {
        self.queues.get_mut(id.0).map_err(|_| GpuError::StaleQueue(id))
    }

    /// A queue and its engine, both mutable (for [`mark_pending`] and [`sync_waiting`]).
    fn engine_and_queue(&mut self, id: FwQueueId) -> Result<(&mut Engine, &mut FwQueue), GpuError> {
        let q = self.queues.get_mut(id.0).map_err(|_| GpuError::StaleQueue(id))?;
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
        let word = |va, access| Place::word_at(vm, va, access).map_err(GpuError::QueueMemory);
        let rptr_word = word(cfg.rptr_va, rptr_access)?;
        let wptr_word = word(cfg.wptr_va, Access::Read)?;
        let last_queued_word = cfg.last_queued_va.map(|va| word(va, Access::Read)).transpose()?;
        // Every dispatch state fits a save area this large (see `FwQueue::spill`).
        let save = cfg.context_save.len() as u64;
        if save < crate::compute::CONTEXT_SAVE_BYTES {
            return Err(GpuError::SaveAreaTooSmall { bytes: save, need: crate::compute::CONTEXT_SAVE_BYTES });
        }
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
            queued: last_queued_word.as_ref().map_or(0, |w| w.get().load(Ordering::Acquire)),
            last_queued_word,
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
            run_ns: 0,
            dispatch_active: false,
            live: None,
            bulk_done: None,
            wait_observed: None,
            parked: None,
            on_run_list: false,
            preempt: None,
            at_cb_boundary: true,
            blocked: false,
            cb: cb_clock::CbClock::default(),
            wait_on: None,
            asleep: false,
            process_start: Time::ZERO,
            saved: None,
            seq: 0,
            waiting: false,
            hw_slot: None,
        };
        q.publish_rptr();
        let id = FwQueueId(self.queues.insert(q));
        let (e, q) = self.engine_and_queue(id)?;
        debug_assert_eq!(e.id, engine);
        schedule::admit(e, q, id);
        Ok(id)
    }

    /// Takes a queue off its engine's run list (`DxgkDdiSuspendContext`: "KMD preempts the
    /// context and removes it from its HW run list"), as a kernel preemption request with its
    /// answer, respecting the engine's granularity. A queue without a slot, or standing where
    /// its engine may stop it, is answered at once: request, save (if it leaves a slot with
    /// work) and answer go to the firmware log, and the answer is this return (no interrupt).
    /// One in a slot that may not stop where it stands keeps running to the next point it may,
    /// and leaves then: its answer is owed, as an [`Interrupt::Preempted`]. Its doorbell stays
    /// connected; rings are remembered.
    pub(crate) fn suspend_queue(&mut self, id: FwQueueId, now: Time) -> Result<preempt::Suspension, GpuError> {
        let caps = self.preemption;
        let Firmware { engines, queues, log, irqs, next_ticket, .. } = self;
        let q = queues.get_mut(id.0).map_err(|_| GpuError::StaleQueue(id))?;
        let e = engines.get_mut(q.cfg.engine.0 as usize).ok_or(GpuError::BadEngine(q.cfg.engine.0))?;
        let mut in_slot = e.hqd.contains(&id) && q.state == QueueState::Mapped;
        if in_slot && !q.may_stop_now(Engine::stop_rule(e.kind, caps)) {
            // It runs on to an allowed point; a request the kernel made already stands.
            let ticket = match q.preempt {
                Some(r) if r.by == preempt::Requester::Os => r.ticket,
                _ => {
                    *next_ticket += 1;
                    let ticket = *next_ticket;
                    log.push(now, preempt::FwEvent::PreemptRequested { queue: id, ticket, by: preempt::Requester::Os });
                    q.preempt = Some(preempt::PreemptRequest { ticket, at: now, by: preempt::Requester::Os });
                    ticket
                }
            };
            return Ok(preempt::Suspension { ticket, answered: false });
        }
        // A request still owed an answer gets it: the queue stops here (and leaves its slot).
        if q.preempt.is_some() {
            let point = q.standing_point();
            preempt::finish(e, q, id, point, now, log, Some(&mut *irqs));
            in_slot = false;
        }
        // The suspend's own request, answered here.
        *next_ticket += 1;
        let ticket = *next_ticket;
        log.push(now, preempt::FwEvent::PreemptRequested { queue: id, ticket, by: preempt::Requester::Os });
        q.preempt = Some(preempt::PreemptRequest { ticket, at: now, by: preempt::Requester::Os });
        // Off a slot, it stands where it last stopped, its state already saved.
        let point = if in_slot { q.standing_point() } else { StopPoint::Idle };
        preempt::finish(e, q, id, point, now, log, None);
        Ok(preempt::Suspension { ticket, answered: true })
    }

    /// Puts a suspended queue back on the run list (`DxgkDdiResumeContext`) and looks for the
    /// work queued meanwhile.
    pub(crate) fn resume_queue(&mut self, id: FwQueueId) -> Result<(), GpuError> {
        let (e, q) = self.engine_and_queue(id)?;
        if q.state == QueueState::Hung {
            return Ok(());
        }
        // A request not answered yet is withdrawn: the kernel wants it running.
        q.preempt = None;
        if !q.on_run_list {
            join_run_list(e, q, id);
        }
        e.resched = true;
        // Back on the run list: it waits if it has work, found now or remembered from before;
        // one that left blocked in a `WAIT` sleeps on it again (as [`schedule::unseat`] has it) until the
        // step's check finds it may pass. (A preemption request takes a sleeping queue off the
        // run list, which ends its sleep: without this, the hang timer's checks, which preempt
        // and resume every queue that makes no progress, turned blocked realtime queues into
        // waiters that took the only slot in turns from the queue they waited for: the swarm's
        // seed 408.)
        find_published_work(e, q, id);
        if q.blocked && q.pending && !matches!(q.state, QueueState::Mapped | QueueState::Hung) {
            // Its condition may have changed while it was off the run list, where no check
            // looked at it: the next check reads it whatever the fences did since.
            if let Some(w) = q.wait_on.as_mut() {
                w.park = false;
            }
            q.parked = None;
            q.asleep = true;
            // (Its entry may still be there: a leave drops it only at the next check.)
            if !e.asleep.contains(&id) {
                e.asleep.push(id);
            }
        }
        sync_waiting(e, q, id);
        Ok(())
    }

    pub(crate) fn remove_queue(
        &mut self,
        id: FwQueueId,
        now: Time,
        vms: &[Option<AddressSpace>],
    ) -> Result<u64, GpuError> {
        // Loaded in a hardware slot: abandoned there first (the queue's memory may go next).
        self.hw_quiesce(&[id], true, now, vms);
        self.dormant.retain(|d| d.queue != id);
        let (e, q) = self.engine_and_queue(id)?;
        doorbells::forget_watch(e, id);
        schedule::leave_run_list(e, q, id);
        let binding = q.doorbell.take();
        self.forget_bit(id, binding);
        let q = self.queues.remove(id.0).map_err(|_| GpuError::StaleQueue(id))?;
        Ok(q.rptr)
    }

    /// Address space `vmid` was destroyed: every queue that runs in it, and every kernel queue
    /// part-way through an indirect buffer in it, faults now, as it would at its next access
    /// — and must, before the next address space made is given the same `vmid`: a queue
    /// left to fault "later" would then run in another process's space. Each is taken off
    /// its hardware slot first, hangs (a preemption it owed is answered) and raises
    /// [`Interrupt::QueueFault`], with the record its next turn would have made.
    pub(crate) fn address_space_destroyed(&mut self, vmid: Vmid, now: Time, vms: &[Option<AddressSpace>]) {
        let in_space = |q: &FwQueue| q.cfg.vmid == vmid || q.ib.is_some_and(|ib| ib.vmid == Some(vmid));
        let doomed: Vec<FwQueueId> = self
            .queues
            .iter()
            .filter(|(_, q)| q.state != QueueState::Hung && in_space(q))
            .map(|(k, _)| FwQueueId(k))
            .collect();
        if doomed.is_empty() {
            return;
        }
        self.hw_quiesce(&doomed, true, now, vms);
        let Firmware { engines, queues, irqs, log, .. } = self;
        for id in doomed {
            let Ok(q) = queues.get_mut(id.0) else { continue };
            let Some(e) = engines.get_mut(q.cfg.engine.0 as usize) else { continue };
            if q.state == QueueState::Hung {
                // Lost with its slot while quiesced: hung and reported already.
                continue;
            }
            let (kind, opcode, in_indirect) = if q.cfg.vmid == vmid {
                (FaultKind::OutsideMappings { va: q.cfg.ring_va, bytes: 0, access: Access::Read }, None, false)
            } else {
                (FaultKind::BadIndirect { why: "vmid does not exist" }, Some(Opcode::IndirectBuffer), true)
            };
            preempt::hang(q, kind.clone());
            let fault = FaultRecord { kind, rptr: q.rptr, opcode, in_indirect };
            q.fault = Some(fault.clone());
            if q.preempt.is_some() {
                preempt::finish(e, q, id, StopPoint::Idle, now, log, Some(&mut *irqs));
            }
            e.resched = true;
            sync_waiting(e, q, id);
            irqs.push_back((Time::ZERO, Interrupt::QueueFault { queue: id, fault }));
        }
    }

    /// An engine's hardware slots, and how many its kernel queues hold (always mapped).
    pub(crate) fn kernel_slots(&self, engine: EngineId) -> Result<(u32, u32), GpuError> {
        let e = self.engines.get(engine.0 as usize).ok_or(GpuError::BadEngine(engine.0))?;
        Ok((e.hw_slots as u32, e.kernel_queues.min(e.hw_slots) as u32))
    }

    pub(crate) fn optimized_interrupts(&self) -> bool {
        self.optimized_interrupts
    }

    /// Replaces the queue's fence log `index` (0 waits, 1 signals); `false` if the queue has
    /// no fence logs (a kernel-mode queue).
    pub(crate) fn set_fence_log(&mut self, id: FwQueueId, index: usize, log: Arc<Shm>) -> Result<bool, GpuError> {
        let q = self.queue_mut(id)?;
        match (&mut q.cfg.fence_logs, index) {
            (Some(logs), 0 | 1) => {
                logs[index] = log;
                self.hw_fence_log(id, index);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    pub(crate) fn set_monitored(&mut self, id: FwQueueId, value: u64) -> Result<(), GpuError> {
        self.queue_mut(id)?.monitored = value;
        Ok(())
    }

    pub(crate) fn queue_state(&self, id: FwQueueId) -> Result<QueueState, GpuError> {
        Ok(self.queue(id)?.state)
    }

    pub(crate) fn queue_in_slot(&self, id: FwQueueId) -> Result<bool, GpuError> {
        let q = self.queue(id)?;
        let seated = self.engines.get(q.cfg.engine.0 as usize).is_some_and(|e| e.hqd.contains(&id));
        Ok(seated && q.state == QueueState::Mapped)
    }

    pub(crate) fn queue_fault(&self, id: FwQueueId) -> Result<Option<FaultRecord>, GpuError> {
        Ok(self.queue(id)?.fault.clone())
    }

    pub(crate) fn queue_progress(&self, id: FwQueueId) -> Result<(u64, u64), GpuError> {
        let q = self.queue(id)?;
        Ok((q.completed, q.queued))
    }

    /// Queue `id`'s executed device time ([`FwQueue::run_ns`]).
    pub(crate) fn queue_run_ns(&self, id: FwQueueId) -> Result<u64, GpuError> {
        Ok(self.queue(id)?.run_ns)
    }

    pub(crate) fn queue_has_work(&self, id: FwQueueId) -> Result<bool, GpuError> {
        Ok(self.queue(id)?.has_work())
    }

    pub(crate) fn power(&self, engine: EngineId) -> Result<PowerState, GpuError> {
        self.engines.get(engine.0 as usize).map(|e| e.power).ok_or(GpuError::BadEngine(engine.0))
    }

    pub(crate) fn busy_ns(&self, engine: EngineId, now: Time) -> Result<u64, GpuError> {
        self.engines.get(engine.0 as usize).map(|e| e.busy.at(now)).ok_or(GpuError::BadEngine(engine.0))
    }

    pub(crate) fn request_f0(&mut self, engine: EngineId, now: Time) -> Result<(), GpuError> {
        let e = self.engine_mut(engine)?;
        e.power = PowerState::F0;
        e.f1_requested = false;
        e.last_busy = now;
        e.resched = true;
        e.arm_idle();
        Ok(())
    }

    pub(crate) fn enter_f1(
        &mut self,
        engine: EngineId,
        now: Time,
        vms: &[Option<AddressSpace>],
    ) -> Result<bool, GpuError> {
        // Hardware slots: where their queues stand now (they run between steps), and off the
        // slots if the engine powers down (below).
        let loaded = self.loaded_on(engine);
        if !loaded.is_empty() {
            let mut report = StepReport::default();
            self.read_progress(&mut report, true);
        }
        let Firmware { engines, queues, .. } = self;
        let e = engines.get_mut(engine.0 as usize).ok_or(GpuError::BadEngine(engine.0))?;
        let mut busy = false;
        // A scan of the whole run list, but a rare one (the kernel's answer to an idle request).
        for k in 0..e.run_list.len() {
            let id = e.run_list[k];
            let q = queues.get_mut(id.0).map_err(|_| GpuError::StaleQueue(id))?;
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
        e.arm_idle();
        if !busy && !loaded.is_empty() {
            // An engine in F1 runs nothing: its slots are emptied (idle, they answer at once).
            self.hw_quiesce(&loaded, false, now, vms);
        }
        Ok(!busy)
    }

    pub(crate) fn all_asleep(&self) -> bool {
        self.engines.iter().all(|e| e.power == PowerState::F1)
    }

    /// Fires every expired timer of every engine.
    pub(crate) fn handle_timeout(&mut self, now: Time) {
        let Firmware { engines, queues, irqs, .. } = self;
        for e in engines.iter_mut() {
            if e.timers.expired(Timer::Busy, now) {
                // The modelled work is done: the engine may run again (its step checks).
                e.timers.set(Timer::Busy, None);
            }
            if e.timers.expired(Timer::Quantum, now) {
                // The slot assignment looks again at the engine's next step.
                e.timers.set(Timer::Quantum, None);
                e.resched = true;
            }
            if e.timers.expired(Timer::Idle, now) {
                let busy_queue =
                    |id: &FwQueueId| queues.get(id.0).is_ok_and(|q| q.pending && q.state != QueueState::Hung);
                // A busy queue on the run list is in a slot, in the waiting set (pending, not
                // hung, not in a slot) or asleep on a WAIT: no scan of the run list.
                let asleep = e.asleep.iter().any(|id| queues.get(id.0).is_ok_and(|q| q.asleep));
                if e.hqd.iter().any(busy_queue) || !e.waiting.is_empty() || asleep {
                    e.last_busy = now;
                } else {
                    e.f1_requested = true;
                    // Raised now: the driver takes it at its own time.
                    let irq = Interrupt::EngineStateChange { engine: e.id, state: EngineState::TransitionToF1 };
                    irqs.push_back((Time::ZERO, irq));
                }
                e.arm_idle();
            }
        }
    }

    /// The earliest timer of any engine.
    pub(crate) fn poll_timeout(&self) -> Option<Time> {
        self.engines.iter().filter_map(|e| e.timers.earliest()).min()
    }

    /// Whether the device has nothing to do at `now` but wait for its engines' modelled work
    /// to end: timing is modelled, no interrupt waits to be raised, no timer is due, and every
    /// engine in F0 (one at least) is busy with the work of an earlier step, which [`Self::step`]
    /// skips. A step and a timer check at `now` would then change nothing.
    pub(crate) fn waits_for_busy_engines(&self, now: Time) -> bool {
        self.timing == crate::cost::Timing::Modelled
            && self.irqs.is_empty()
            && self.poll_timeout().is_some_and(|t| now < t)
            && self.engines.iter().any(|e| e.power == PowerState::F0)
            && self
                .engines
                .iter()
                .all(|e| e.power != PowerState::F0 || e.timers.get(Timer::Busy).is_some_and(|t| now < t))
    }

    /// The earliest modelled end of an engine's busy period.
    pub(crate) fn busy_until(&self) -> Option<Time> {
        self.engines.iter().filter_map(|e| e.timers.get(Timer::Busy)).min()
    }

    pub(crate) fn poll_interrupt(&mut self) -> Option<(Time, Interrupt)> {
        self.irqs.pop_front()
    }

    pub(crate) fn compute_stats(&self) -> ComputeStats {
        self.compute
    }

    pub(crate) fn register_fence(&mut self, current: (&Shm, u64), monitored: Word, id: u64, waits: FenceWaits) {
        self.fence_epoch += 1;
        self.fences.insert((current.0.id(), current.1), FenceEntry { id, monitored, waits });
        self.hw_fence(current.0, current.1, Some(id));
    }

    pub(crate) fn unregister_fence(&mut self, current: (&Shm, u64)) {
        // A queue parked on it re-checks (and faults, if the memory went with it).
        self.fence_epoch += 1;
        self.fences.remove(&(current.0.id(), current.1));
        self.hw_fence(current.0, current.1, None);
    }

    /// Native fences may have changed behind the engines' back (a CPU update, another
    /// adapter's signal): every parked queue re-checks.
    pub(crate) fn notify_fences(&mut self) {
        self.fence_epoch += 1;
    }

    pub(crate) fn set_horizon(&mut self, at: Option<Time>) {
        self.horizon = at;
    }

    /// The device time of the last step.
    pub(crate) fn last_step(&self) -> Time {
        self.last_step
    }
}
