//! # gpu — the virtual device
//!
//! This crate is the hardware: memory and per-process GPU virtual address spaces, the doorbell
//! BAR, and the scheduling firmware with its engines (spec 001 "Theory of Operation": the MES
//! that maps user queues onto hardware queue slots; spec 000's context management processor).
//! It knows nothing of processes, handles or policy: the kernel tells it, through firmware
//! commands, which queues exist, which address space ([`Vmid`]) each runs in and which doorbell
//! each watches.
//!
//! Everything here is a **sans-IO state machine** in the manner of quinn-proto. No thread, no
//! clock: the driver that owns the device calls
//!
//! - [`Gpu::poll_doorbells`] to latch doorbell writes (a cheap scan of the watched BAR words),
//! - [`Gpu::step`] with the current [`Time`] to let engines execute a bounded amount of work,
//! - [`Gpu::handle_timeout`] with the current time for the idle (F1) timer, and
//!   [`Gpu::poll_timeout`] to learn when that is due,
//! - [`Gpu::poll_interrupt`] to drain the interrupt line.
//!
//! The live driver calls these from a firmware thread in real time; the deterministic driver
//! calls them from tests with a virtual clock. Both run exactly this code.
//!
//! The kernel-mode driver drives the firmware by typed commands ([`cmd`]: MES-style, a struct
//! of inputs each, declared once in the firmware command table) through one entry point,
//! [`Gpu::command`], which records each in the firmware log ([`FwEvent::Command`]) before the
//! firmware acts on it. What only reads the device's state stays a method of [`Gpu`].
//!
//! Invariants:
//! - Nothing a client writes can panic the device: packets, pointers and addresses are read
//!   from shared memory, validated, and turned into a [`abi::queue::FaultRecord`] that hangs
//!   only the offending queue.
//! - A queue only runs while it is on the run list, and an engine only runs while in F0.
//! - A queue only ever runs in the address space it was added in: destroying a space faults
//!   the queues still in it at once, before its [`Vmid`] can name another process's space.
//! - Work is never lost across a doorbell unbind or an F1 request: both re-read the queue's
//!   wptr, and F1 is refused while any queue has `rptr != wptr`.
#![forbid(unsafe_code)]

mod attention;
pub mod cmd;
pub mod compute;
mod config;
pub mod cost;
mod error;
mod firmware;
mod fw_table;
pub mod hw;
mod memory;

use std::sync::Arc;

use abi::doorbell::DoorbellModel;
use abi::queue::EngineKind;
use shm::Shm;

pub use abi::power::{EngineState, PowerState};
pub use abi::preempt::{ComputeGranularity, CopyGranularity, PreemptionCaps, StopPoint};
pub use abi::time::Time;
pub use attention::{Attention, AttentionGuard};
pub use config::{ConfigError, GpuConfig};
pub use cost::{CostModel, Timing};
pub use error::GpuError;
pub use firmware::preempt::{EngineReset, RingPosition, Suspension};
pub use firmware::{
    BrokenTwin, CommandRecord, Completion, FenceSignal, FenceSignaled, FenceWaits, FwCounts, FwEvent, FwLogEntry,
    FwQueueId, Interrupt, MemoryRecord, QueueConfig, QueueRecord, Requester, StepReport,
};
pub use memory::{AddressSpace, GpuMapping, Vmid};

/// Which doorbell a queue answers to, as the firmware sees it ([`Gpu::doorbell_of`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BoundDoorbell {
    /// A dedicated BAR word.
    Word {
        /// Its index in the BAR.
        index: u32,
        /// When it was last used (bound, or seen rung): a firmware-wide sequence, larger is
        /// more recent. Victim choice compares it.
        last_used: u64,
    },
    /// Its bit of a global-doorbell bit page.
    Bit {
        /// The BAR page.
        page: u32,
        /// The bit.
        bit: u32,
    },
}

/// The virtual GPU: BAR, address spaces and firmware.
pub struct Gpu {
    bar: abi::doorbell::DoorbellBar,
    vms: Vec<Option<AddressSpace>>,
    fw: firmware::Firmware,
}

impl Gpu {
    /// Creates a device. Address space 0 is created for the kernel.
    pub fn new(cfg: GpuConfig) -> Result<Gpu, GpuError> {
        let per_page = abi::doorbell::DOORBELLS_PER_PAGE as usize;
        if cfg.misses_unmapped_doorbells && cfg.engines.len() > per_page {
            return Err(GpuError::TooManyEngines { engines: cfg.engines.len(), max: per_page });
        }
        // The kernel's page and at least one process page.
        let pages = cfg.doorbell_pages.max(2);
        let bar = Shm::new("doorbell-bar", pages as usize * abi::doorbell::DOORBELL_PAGE_BYTES as usize)?;
        let bar = abi::doorbell::DoorbellBar::new(bar);
        let mut fw = firmware::Firmware::new(&cfg, bar.clone())?;
        let vms = vec![Some(AddressSpace::default())];
        fw.address_space_changed(Vmid(0), vms[0].as_ref());
        Ok(Gpu { bar, vms, fw })
    }

    /// Spec 000's doorbell model.
    pub fn doorbell_model(&self) -> DoorbellModel {
        self.fw.model()
    }

    /// Whether engines miss doorbells of user queues without a hardware slot (so clients also
    /// ring an aggregated doorbell).
    pub fn misses_unmapped_doorbells(&self) -> bool {
        self.fw.misses_unmapped()
    }

    /// An engine's hardware slots and how many its kernel queues hold: kernel queues are
    /// always mapped, so the rest is what user queues share (amdgpu INFO).
    pub fn slots(&self, engine: abi::EngineId) -> Result<(u32, u32), GpuError> {
        self.fw.kernel_slots(engine)
    }

    /// Whether a logged fence signal's interrupt names the queue
    /// (`OptimizedNativeFenceSignaledInterrupt`).
    pub fn optimized_fence_interrupts(&self) -> bool {
        self.fw.optimized_interrupts()
    }

    /// The doorbell BAR.
    pub fn bar(&self) -> &Arc<Shm> {
        self.bar.shm()
    }

    /// Doorbells in the BAR.
    pub fn doorbell_count(&self) -> u32 {
        self.bar.doorbells()
    }

    /// Engines, in id order.
    pub fn engines(&self) -> Vec<EngineKind> {
        self.fw.engine_kinds()
    }

    /// An address space.
    pub fn vm(&self, vmid: Vmid) -> Result<&AddressSpace, GpuError> {
        self.vms.get(vmid.0 as usize).and_then(Option::as_ref).ok_or(GpuError::BadVmid(vmid.0))
    }

    /// An address space, mutably (the kernel maps and unmaps). Hardware slots, which keep
    /// their own copy of the page table, are told of the change when the guard drops: before
    /// the kernel's call returns to anyone who could submit work using the new mapping.
    pub(crate) fn vm_mut(&mut self, vmid: Vmid) -> Result<VmMut<'_>, GpuError> {
        let Gpu { vms, fw, .. } = self;
        let vm = vms.get_mut(vmid.0 as usize).and_then(Option::as_mut).ok_or(GpuError::BadVmid(vmid.0))?;
        Ok(VmMut { vmid, vm, fw })
    }

    /// The hardware the engines' slots are, if not virtual ([`hw`]).
    pub fn hardware_name(&self) -> Option<String> {
        self.fw.hardware_name()
    }

    // ---- queries: the firmware's commands are `cmd`'s, through `Gpu::command` ----

    /// Where a queue held off the run list for the kernel (answered preemption, suspended
    /// context) stands in its ring.
    pub fn held_position(&self, id: FwQueueId) -> Result<RingPosition, GpuError> {
        self.fw.held_position(id)
    }

    /// A queue's progress as the engine knows it: the last progress value it completed, and
    /// the last-queued value it read with the last wptr it accepted (the most its accepted
    /// work can complete; 0 for a queue without a last-queued word).
    pub fn queue_progress(&self, id: FwQueueId) -> Result<(u64, u64), GpuError> {
        self.fw.queue_progress(id)
    }

    /// The device time queue `id` has spent executing its work in a hardware slot, in all:
    /// not the time it waited for a slot, was held off one, or only re-checked a `WAIT` that
    /// did not pass. It is counted as [`Gpu::engine_busy_ns`] counts its engine's: the cost
    /// model's charge for each turn, on either timing (a hardware slot's: the time between
    /// steps it was loaded and running). It only grows; the kernel's hang timer takes
    /// differences of it (a queue that ran this long without its progress fence moving is
    /// hung, whether or not it yields to preemption).
    pub fn queue_run_time(&self, id: FwQueueId) -> Result<std::time::Duration, GpuError> {
        self.fw.queue_run_ns(id).map(std::time::Duration::from_nanos)
    }

    /// The firmware log: preemption requests, saves, answers, restores and resets, oldest
    /// first (bounded).
    pub fn firmware_log(&self) -> Vec<FwLogEntry> {
        self.fw.log().cloned().collect()
    }

    /// With modelled timing (the deterministic driver): the device time at which the driver
    /// next lets a client act (`None`: not known). A step's turns end at their first check past
    /// it while a ring could cut into them (an engine with sentinel doorbells), as on the live
    /// driver, where the client rings while the turn runs: so a ring made then is heard one
    /// check later, not after the turn, which runs as one piece. Ignored when it is not after
    /// the step's start.
    pub fn set_horizon(&mut self, at: Option<Time>) {
        self.fw.set_horizon(at)
    }

    /// How many events of each kind the firmware logged since the device started: exact,
    /// where [`Gpu::firmware_log`] keeps only the last 4,096.
    pub fn firmware_counts(&self) -> FwCounts {
        self.fw.log_counts()
    }

    /// The device's attention register: raise it before taking the device lock for a
    /// request that should not wait for engines to finish their turns ([`Attention`]).
    pub fn attention(&self) -> Attention {
        self.fw.attention()
    }

    /// The device's preemption capabilities.
    pub fn preemption(&self) -> PreemptionCaps {
        self.fw.preemption()
    }

    /// Which doorbell queue `id` answers to now (`None`: unbound), and for a BAR word when it
    /// was last bound or rung. Read-only.
    pub fn doorbell_of(&self, id: FwQueueId) -> Result<Option<BoundDoorbell>, GpuError> {
        self.fw.doorbell_of(id)
    }

    /// The queue's state, as the firmware sees it.
    pub fn queue_state(&self, id: FwQueueId) -> Result<abi::QueueState, GpuError> {
        self.fw.queue_state(id)
    }

    /// Whether queue `id` holds one of its engine's hardware slots now (mapped there, its
    /// state loaded or being loaded).
    pub fn queue_in_slot(&self, id: FwQueueId) -> Result<bool, GpuError> {
        self.fw.queue_in_slot(id)
    }

    /// The fault that hung the queue.
    pub fn queue_fault(&self, id: FwQueueId) -> Result<Option<abi::queue::FaultRecord>, GpuError> {
        self.fw.queue_fault(id)
    }

    /// Whether the queue has unconsumed work (`rptr != wptr`).
    pub fn queue_has_work(&self, id: FwQueueId) -> Result<bool, GpuError> {
        self.fw.queue_has_work(id)
    }

    /// Breaks a rule of the spec on purpose from now on: a swarm checker's broken twin
    /// ([`BrokenTwin`]), never a real device's behaviour.
    pub fn break_deliberately(&mut self, b: BrokenTwin) {
        self.fw.break_deliberately(b)
    }

    /// Engine power state.
    pub fn power(&self, engine: abi::EngineId) -> Result<PowerState, GpuError> {
        self.fw.power(engine)
    }

    /// How long `engine` has executed up to `now`, in device nanoseconds: the union of its
    /// steps that ran packets (see `firmware/busy.rs`). Two readings give a busy share.
    pub fn engine_busy_ns(&self, engine: abi::EngineId, now: Time) -> Result<u64, GpuError> {
        self.fw.busy_ns(engine, now)
    }

    /// Whether every engine is in F1 (the firmware thread may sleep).
    pub fn all_asleep(&self) -> bool {
        self.fw.all_asleep()
    }

    // ---- the sans-IO driving interface ----

    /// Latches doorbell writes of F0 engines. Returns whether any doorbell changed.
    pub fn poll_doorbells(&mut self) -> bool {
        self.fw.poll_doorbells()
    }

    /// [`Gpu::poll_doorbells`] limited to the dedicated doorbells of `queues` (and every
    /// global-doorbell page and aggregated doorbell): for a driver that knows which clients
    /// may have rung since the last poll. Returns whether any doorbell changed.
    pub fn poll_doorbells_of(&mut self, queues: impl IntoIterator<Item = FwQueueId>) -> bool {
        self.fw.poll_doorbells_of(queues)
    }

    /// Lets every F0 engine run its pending queues for one round, at time `now` (timestamps
    /// written in this round all read `now`: the deterministic driver's case).
    pub fn step(&mut self, now: Time) -> StepReport {
        self.step_with_clock(&|| now)
    }

    /// [`Gpu::step`] with a live clock: timestamps read it when they execute.
    pub fn step_with_clock(&mut self, clock: &dyn Fn() -> Time) -> StepReport {
        let Gpu { vms, fw, .. } = self;
        fw.step(clock, vms)
    }

    /// Raises idle (TransitionToF1) requests that are due.
    pub fn handle_timeout(&mut self, now: Time) {
        self.fw.handle_timeout(now)
    }

    /// When [`Gpu::handle_timeout`] next has something to do (an engine's modelled busy
    /// period ending included).
    pub fn poll_timeout(&self) -> Option<Time> {
        self.fw.poll_timeout()
    }

    /// With [`Timing::Modelled`]: the earliest time an engine that is running work becomes
    /// free to run more (the modelled end of its last step). `None` when no engine is busy.
    /// A driver that lets time pass only while work remains jumps its clock here.
    pub fn busy_until(&self) -> Option<Time> {
        self.fw.busy_until()
    }

    /// With [`Timing::Modelled`]: whether a [`Gpu::step`] and a [`Gpu::handle_timeout`] at
    /// `now` would do nothing, because every engine in F0 is still busy with the modelled work
    /// of an earlier step, no timer is due and no interrupt is waiting. Rings latched
    /// meanwhile wait for the busy period to end either way; a driver that steps event by
    /// event may then skip the step.
    pub fn waits_for_busy_engines(&self, now: Time) -> bool {
        self.fw.waits_for_busy_engines(now)
    }

    /// Compute work executed so far.
    pub fn compute_stats(&self) -> compute::ComputeStats {
        self.fw.compute_stats()
    }

    /// The next interrupt on the line.
    pub fn poll_interrupt(&mut self) -> Option<Interrupt> {
        self.fw.poll_interrupt().map(|(_, irq)| irq)
    }

    /// [`Gpu::poll_interrupt`] with the device time the interrupt was raised at: with
    /// [`Timing::Modelled`], a packet's modelled time inside its step; for an interrupt raised
    /// outside a step, the time of the input that raised it (or [`Time::ZERO`] where none is
    /// known: deliver it at once).
    pub fn poll_interrupt_at(&mut self) -> Option<(Time, Interrupt)> {
        self.fw.poll_interrupt()
    }

    /// Starts (`true`) or stops recording every `PROGRESS_FENCE` the engines execute, with
    /// its queue, value and end time: how a simulator observes completions without reading
    /// every queue's memory after every step. Off by default.
    pub fn record_completions(&mut self, on: bool) {
        self.fw.completions = on.then(Vec::new);
    }

    /// Queues holding a hardware slot on `engine` now, and how many times a queue was mapped
    /// into one of its slots so far; `None` for an engine that does not exist.
    pub fn slot_occupancy(&self, engine: abi::EngineId) -> Option<(usize, u64)> {
        self.fw.slots(engine)
    }

    /// Moves the completions recorded since the last call into `out` (in execution order).
    pub fn take_completions(&mut self, out: &mut Vec<Completion>) {
        if let Some(c) = self.fw.completions.as_mut()
            && !c.is_empty()
        {
            out.append(c);
        }
    }

    /// Starts (`true`) or stops the record of every native-fence signal the engines execute
    /// ([`FenceSignal`]: its value, the MonitoredValue it was checked against, whether it
    /// raised the interrupt), for a checker of spec 002's conditional interrupt. Off by default.
    pub fn record_fence_signals(&mut self, on: bool) {
        self.fw.record_fence_signals(on)
    }

    /// Moves the fence signals recorded since the last call into `out`, oldest first.
    pub fn take_fence_signals(&mut self, out: &mut Vec<FenceSignal>) {
        self.fw.take_fence_signals(out)
    }
}

/// An address space borrowed mutably from its device ([`Gpu::vm_mut`]): derefs to the
/// [`AddressSpace`]; when it drops, hardware slots that keep a copy of its page table are
/// given the new one.
pub(crate) struct VmMut<'a> {
    vmid: Vmid,
    vm: &'a mut AddressSpace,
    fw: &'a mut firmware::Firmware,
}

impl std::ops::Deref for VmMut<'_> {
    type Target = AddressSpace;
    fn deref(&self) -> &AddressSpace {
        self.vm
    }
}

impl std::ops::DerefMut for VmMut<'_> {
    fn deref_mut(&mut self) -> &mut AddressSpace {
        self.vm
    }
}

impl Drop for VmMut<'_> {
    fn drop(&mut self) {
        self.fw.address_space_changed(self.vmid, Some(self.vm));
    }
}
