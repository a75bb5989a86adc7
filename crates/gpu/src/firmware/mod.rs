//! The scheduling firmware and its engines.
//!
//! The firmware keeps a table of queues (amdgpu: the MQDs it was given), a run list per engine,
//! and the doorbells it watches. Its work cycle is the one spec 001 describes: "Writing to the
//! doorbell wakes the firmware and causes it to fetch the wptr and start processing the packets
//! in the queue". Concretely, for each engine in F0:
//!
//! 1. [`Firmware::poll_doorbells`]: a watched BAR word that changed marks its queue *pending*
//!    ([`schedule::mark_pending`]).
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
//! run-list order) and grouped by [`schedule::Class`] so a pass looks at one head per class. Its
//! invariant: a queue is in the waiting set exactly when it is on the run list, pending, not
//! hung, not asleep on a `WAIT` and not in a slot ([`schedule::Seat::should_wait`]). Every `pending = true` goes through
//! [`schedule::mark_pending`], and every other change of those facts (suspend, resume, remove, map,
//! evict) through [`sync_waiting`], which keep it.
//!
//! The firmware is split along the spec's seams: [`doorbells`] (bindings, the global model's
//! bit pages, aggregated pages, latching rings), [`schedule`] (classes, the waiting set,
//! quanta, the slot assignment), [`step`] (the step: passes, turns, cut-ins), [`exec`]
//! (decode, execute, fence logs), [`ring`] (where rings are, the fetch window), [`queue`]
//! (a queue's table entry), [`power`] (F0/F1 and the per-engine timer table that feeds
//! [`Firmware::poll_timeout`]), [`fences`] (the native fence table and epoch), [`log`] (the
//! firmware log), [`preempt`] (requests, answers, resets) and [`hardware`] (slots on real
//! hardware). This module holds the queue table, the engines and the queue commands.
//!
//! **State has owners.** [`Firmware`] composes them, as the kernel's `Os` does: an engine's
//! power is a [`power::Power`] (F0/F1, its F1 request, its idle period), the native fences a
//! [`fences::Fences`] (table, epoch, interrupt mode), the doorbell side a
//! [`doorbells::Doorbells`] (BAR, bit pages, aggregated pages, dormant words, use clock), the
//! firmware log a [`log::FwLog`], the waiting set a [`schedule::Waiting`]. A step borrows what
//! its turns share once ([`step`]'s `Step`), rather than field by field at each turn.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use abi::packet::Opcode;
use abi::preempt::{Stop, StopPoint};
use abi::queue::{Access, FaultKind, FaultRecord};
use abi::slab::Slab;
use abi::{EngineId, EngineKind, EngineState, QueueState};
use shm::Shm;

use crate::Time;
use crate::compute::ComputeStats;
use crate::config::GpuConfig;
use crate::error::GpuError;
use crate::memory::{AddressSpace, Vmid};

mod busy;
mod cb_clock;
mod command_log;
mod doorbells;
mod exec;
mod fences;
mod hardware;
mod log;
mod power;
pub(crate) mod preempt;
mod queue;
mod ring;
mod schedule;
mod step;
mod twin;

pub use command_log::{CommandRecord, MemoryRecord, QueueRecord};
pub use fences::FenceSignal;
pub use fences::FenceWaits;
pub use log::{FwCounts, FwEvent, FwLogEntry, Requester};
pub use queue::{FwQueueId, QueueConfig};
pub use twin::BrokenTwin;

use doorbells::{Doorbells, MAX_POINTER, Watch, find_published_work};
use fences::Fences;
use log::FwLog;
use power::{Power, Timers};
use preempt::Preemption;
use queue::{FwQueue, Ring, SchedState};
use ring::Place;
use schedule::{Quanta, Waiting, join_run_list, sync_waiting};

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

/// Raised interrupts, oldest first, each with the device time it was raised at: with modelled
/// timing, a packet's interrupt carries the packet's modelled time inside its step (the step
/// runs at its start, the engine is busy until its modelled end); an interrupt raised outside
/// a step carries the time of the input that raised it, or [`Time::ZERO`] where none is
/// known (it is delivered when the driver takes it).
type Irqs = std::collections::VecDeque<(Time, Interrupt)>;

struct Engine {
    id: EngineId,
    kind: EngineKind,
    /// Its power state and idle period ([`power`]).
    power: Power,
    /// How long it has executed (`busy.rs`).
    busy: busy::BusyTime,
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
    /// checked at each step until it does ([`step::wake_sleepers`]). An entry whose queue no
    /// longer sleeps (suspended, removed, hung) is dropped at the next check.
    asleep: Vec<FwQueueId>,
    /// The fence epoch at the last check of `asleep`.
    asleep_epoch: u64,
    /// Queues the scheduler evicted in this step, whose dispatch state may still be live
    /// ([`FwQueue::live`]): written to their save areas at the end of the step
    /// (`step.rs`'s `spill_evicted`), so that the queue that took the slot starts first. Nobody can
    /// look at a save area during a step (the kernel waits for the device lock), and a queue
    /// mapped again in the same step simply keeps its state.
    unspilled: Vec<FwQueueId>,
    /// A scheduling pass's working lists, kept between passes ([`schedule::PassScratch`]).
    pass: schedule::PassScratch,
    /// A step's lists of turns, kept between steps ([`step::Turns`]).
    turns: step::Turns,
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
    /// The native fences ([`fences`]).
    fences: Fences,
    quanta: Quanta,
    engines: Vec<Engine>,
    /// The queue table (amdgpu: the MQDs the firmware was given).
    queues: Slab<FwQueue>,
    /// Interrupts raised and not yet taken, each with the device time it was raised at
    /// ([`Irqs`]).
    irqs: Irqs,
    /// The doorbell BAR, its model, and the firmware's doorbell state beside the engines'
    /// watches ([`doorbells`]).
    doorbells: Doorbells,
    /// Where engines may stop work for a preemption (`D3DKMDT_PREEMPTION_CAPS`).
    preemption: abi::preempt::PreemptionCaps,
    /// The last preemption ticket handed out.
    next_ticket: u64,
    /// Requests, answers, saves, restores and resets, in order ([`FwEvent`]).
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

impl Engine {
    /// An engine in F0 with `hw_slots` hardware slots (at least one), an empty run list, and
    /// its idle timer armed.
    fn new(id: EngineId, kind: EngineKind, hw_slots: u32, idle_period: std::time::Duration, stop: Stop) -> Engine {
        Engine {
            id,
            kind,
            power: Power::new(idle_period),
            busy: busy::BusyTime::default(),
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
            fences: Fences::new(cfg.optimized_fence_interrupts),
            quanta: Quanta { process: cfg.process_quantum, gang: cfg.gang_quantum },
            engines,
            queues: Slab::new(),
            irqs: Default::default(),
            doorbells: Doorbells::new(bar, cfg.doorbell_model, cfg.misses_unmapped_doorbells),
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

    /// A queue and its engine, both mutable (for [`schedule::mark_pending`] and [`sync_waiting`]).
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
            ring: Ring::new(ring, rptr_word, wptr_word, last_queued_word, start),
            state: QueueState::Unmapped,
            pending: false,
            monitored: u64::MAX,
            completed: 0,
            doorbell: None,
            fault: None,
            sched: SchedState::default(),
            run_ns: 0,
            dispatch_active: false,
            live: None,
            bulk_done: None,
            wait_observed: None,
            parked: None,
            preempt: Preemption::default(),
            at_cb_boundary: true,
            blocked: false,
            cb: cb_clock::CbClock::default(),
            wait_on: None,
            hw_slot: None,
        };
        q.ring.publish_rptr();
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
            let ticket = match q.preempt.request {
                Some(r) if r.by == Requester::Os => r.ticket,
                _ => {
                    *next_ticket += 1;
                    let ticket = *next_ticket;
                    log.push(now, FwEvent::PreemptRequested { queue: id, ticket, by: Requester::Os });
                    q.preempt.request = Some(preempt::PreemptRequest { ticket, at: now, by: Requester::Os });
                    ticket
                }
            };
            return Ok(preempt::Suspension { ticket, answered: false });
        }
        // A request still owed an answer gets it: the queue stops here (and leaves its slot).
        if q.preempt.request.is_some() {
            let point = q.standing_point();
            preempt::finish(e, q, id, point, now, log, Some(&mut *irqs));
            in_slot = false;
        }
        // The suspend's own request, answered here.
        *next_ticket += 1;
        let ticket = *next_ticket;
        log.push(now, FwEvent::PreemptRequested { queue: id, ticket, by: Requester::Os });
        q.preempt.request = Some(preempt::PreemptRequest { ticket, at: now, by: Requester::Os });
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
        q.preempt.request = None;
        if !q.sched.on_run_list {
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
            q.sched.asleep = true;
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
        self.doorbells.dormant.retain(|d| d.queue != id);
        let (e, q) = self.engine_and_queue(id)?;
        doorbells::forget_watch(e, id);
        schedule::leave_run_list(e, q, id);
        let binding = q.doorbell.take();
        self.forget_bit(id, binding);
        let q = self.queues.remove(id.0).map_err(|_| GpuError::StaleQueue(id))?;
        Ok(q.ring.rptr)
    }

    /// Address space `vmid` was destroyed: every queue that runs in it, and every kernel queue
    /// part-way through an indirect buffer in it, faults now, as it would at its next access
    /// — and must, before the next address space made is given the same `vmid`: a queue
    /// left to fault "later" would then run in another process's space. Each is taken off
    /// its hardware slot first, hangs (a preemption it owed is answered) and raises
    /// [`Interrupt::QueueFault`], with the record its next turn would have made.
    pub(crate) fn address_space_destroyed(&mut self, vmid: Vmid, now: Time, vms: &[Option<AddressSpace>]) {
        let in_space = |q: &FwQueue| q.cfg.vmid == vmid || q.ring.ib.is_some_and(|ib| ib.vmid == Some(vmid));
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
            let fault = FaultRecord { kind, rptr: q.ring.rptr, opcode, in_indirect };
            q.fault = Some(fault.clone());
            if q.preempt.request.is_some() {
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
        Ok((q.completed, q.ring.queued))
    }

    /// Queue `id`'s executed device time ([`FwQueue::run_ns`]).
    pub(crate) fn queue_run_ns(&self, id: FwQueueId) -> Result<u64, GpuError> {
        Ok(self.queue(id)?.run_ns)
    }

    pub(crate) fn queue_has_work(&self, id: FwQueueId) -> Result<bool, GpuError> {
        Ok(self.queue(id)?.ring.has_work())
    }

    pub(crate) fn poll_interrupt(&mut self) -> Option<(Time, Interrupt)> {
        self.irqs.pop_front()
    }

    pub(crate) fn compute_stats(&self) -> ComputeStats {
        self.compute
    }

    pub(crate) fn set_horizon(&mut self, at: Option<Time>) {
        self.horizon = at;
    }

    /// The device time of the last step.
    pub(crate) fn last_step(&self) -> Time {
        self.last_step
    }
}
