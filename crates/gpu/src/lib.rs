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

pub mod compute;
pub mod cost;
mod firmware;
pub mod hw;
mod memory;

use std::sync::Arc;
use std::time::Duration;

use abi::doorbell::DoorbellModel;
use abi::queue::EngineKind;
use shm::Shm;

pub use abi::power::{EngineState, PowerState};
pub use abi::preempt::{ComputeGranularity, CopyGranularity, PreemptionCaps, StopPoint};
pub use abi::time::Time;
pub use cost::{CostModel, Timing};
pub use firmware::preempt::{
    Attention, AttentionGuard, EngineReset, FwCounts, FwEvent, FwLogEntry, Requester, RingPosition, Suspension,
};
pub use firmware::{Completion, FenceSignaled, FenceWaits, FwQueueId, Interrupt, QueueConfig, StepReport};
pub use memory::{AddressSpace, GpuMapping, Vmid};

/// Device configuration.
#[derive(Clone, Debug)]
pub struct GpuConfig {
    /// Engines, in id order.
    pub engines: Vec<EngineKind>,
    /// Pages of the doorbell BAR (512 doorbells each). At least 2 (the kernel's and one
    /// process page).
    pub doorbell_pages: u32,
    /// An engine with no work for this long asks for F1.
    pub idle_period: Duration,
    /// Packets one queue may execute per [`Gpu::step`] before the engine moves on (its turn
    /// is also bounded by device time, [`CostModel::turn`]).
    pub packet_budget: u32,
    /// Lanes per wave on compute engines (1..=64).
    pub wave_width: u32,
    /// Kernel wave-instructions a `DISPATCH` may run per [`Gpu::step`] before the engine
    /// saves its state and moves on.
    pub dispatch_budget: u64,
    /// `OptimizedNativeFenceSignaledInterrupt`: a logged fence signal's interrupt names the
    /// queue (the kernel reads its signal log) instead of the fence.
    pub optimized_fence_interrupts: bool,
    /// Hardware queue slots (HQDs) per engine; more queues than slots are time-sliced.
    pub hw_slots: u32,
    /// Time slice between queues of equal priority in different processes.
    pub process_quantum: Duration,
    /// Time slice between queues of equal priority in one process.
    pub gang_quantum: Duration,
    /// Spec 000's doorbell model. Under `Global` every queue of a process rings its bit of
    /// that process's doorbell page (see [`abi::doorbell`]).
    pub doorbell_model: DoorbellModel,
    /// Engines miss doorbells of user queues that hold no hardware slot (amdgpu: "the engine
    /// firmware may miss the request"). The kernel then gives each process an aggregated
    /// doorbell page, which its clients ring too: two BAR pages per process, so the default
    /// 64 pages host 31 processes instead of 63.
    pub misses_unmapped_doorbells: bool,
    /// What executing work costs in device time ([`cost`]): it budgets each queue's turn,
    /// and with [`Timing::Modelled`] it occupies the engine.
    pub cost: CostModel,
    /// Whether modelled costs occupy the engine (the deterministic driver) or only budget
    /// turns (the live driver, where execution takes real time).
    pub timing: Timing,
    /// Where engines may stop a queue's work for a preemption (`D3DKMDT_PREEMPTION_CAPS`,
    /// spec 003): by default the finest levels, an instruction and a chunk.
    pub preemption: PreemptionCaps,
    /// The hardware the engines' slots are ([`hw`]): `None` for the virtual engines on the
    /// firmware's thread; the `cuda` crate makes one for an NVIDIA GPU, or the same program
    /// emulated on the CPU.
    pub hardware: Option<hw::HardwareFactory>,
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            engines: vec![EngineKind::Compute, EngineKind::Copy],
            doorbell_pages: 64,
            idle_period: Duration::from_millis(20),
            packet_budget: 256,
            wave_width: 32,
            dispatch_budget: 16 * 1024,
            optimized_fence_interrupts: false,
            hw_slots: 8,
            process_quantum: Duration::from_millis(10),
            gang_quantum: Duration::from_millis(1),
            doorbell_model: DoorbellModel::Dedicated,
            misses_unmapped_doorbells: false,
            cost: CostModel::default(),
            timing: Timing::Real,
            preemption: PreemptionCaps::default(),
            hardware: None,
        }
    }
}

impl GpuConfig {
    /// The longest a device timer (the idle period, a quantum) may be: one hour.
    pub const MAX_PERIOD: Duration = Duration::from_secs(3600);

    /// Refuses settings of zero or past their bounds, naming the field and the value: a
    /// device with no hardware slot, a turn of no packets or wave-instructions, a wave of no
    /// lanes or more than [`compute::MAX_WAVE`], a zero or hour-plus quantum or idle period.
    /// The kernel's `System` calls it before it builds a device (the firmware itself only
    /// clamps, for the tests and tools that build one directly).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |field, value: String, expected| Err(ConfigError { field, value, expected });
        let period = |field, d: Duration| {
            if d.is_zero() || d > Self::MAX_PERIOD {
                bad(field, format!("{d:?}"), "between 1 ns and 1 hour")
            } else {
                Ok(())
            }
        };
        period("idle_period", self.idle_period)?;
        period("process_quantum", self.process_quantum)?;
        period("gang_quantum", self.gang_quantum)?;
        if self.engines.is_empty() {
            return bad("engines", "[]".into(), "at least one engine");
        }
        if self.hw_slots == 0 {
            return bad("hw_slots", "0".into(), "at least 1");
        }
        if self.packet_budget == 0 {
            return bad("packet_budget", "0".into(), "at least 1");
        }
        if self.dispatch_budget == 0 {
            return bad("dispatch_budget", "0".into(), "at least 1");
        }
        if self.wave_width == 0 || self.wave_width as usize > compute::MAX_WAVE {
            return bad("wave_width", self.wave_width.to_string(), "between 1 and 64");
        }
        Ok(())
    }
}

/// A device setting out of its range ([`GpuConfig::validate`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("device configuration: {field} = {value} is out of range (expected {expected})")]
pub struct ConfigError {
    /// The [`GpuConfig`] field.
    pub field: &'static str,
    /// The value given.
    pub value: String,
    /// The range it must be in.
    pub expected: &'static str,
}

/// What a device command can refuse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GpuError {
    /// A queue id whose table entry is empty or reused.
    #[error("firmware queue {0} is stale or unknown")]
    StaleQueue(FwQueueId),
    /// An unknown address space.
    #[error("vmid {0} does not exist")]
    BadVmid(u32),
    /// An unknown engine.
    #[error("engine {0} does not exist")]
    BadEngine(u32),
    /// A mapping that overlaps another.
    #[error("GPU mapping {va:#x}+{bytes:#x} overlaps an existing mapping")]
    Overlap {
        /// Address.
        va: u64,
        /// Length.
        bytes: u64,
    },
    /// A mapping request outside its backing.
    #[error("GPU mapping {va:#x}+{bytes:#x}: {why}")]
    BadMapping {
        /// Address.
        va: u64,
        /// Length.
        bytes: u64,
        /// Why.
        why: &'static str,
    },
    /// A queue's memory does not resolve.
    #[error("queue memory: {0}")]
    QueueMemory(abi::queue::FaultKind),
    /// The client's wptr word holds an impossible starting value.
    #[error("queue memory: the wptr word holds {wptr:#x}: a new queue needs a dword count below 2^62 (write 0 first)")]
    BadStartPointer {
        /// The value found.
        wptr: u64,
    },
    /// A context save area smaller than the largest state a dispatch saves.
    #[error("queue memory: the context save area holds {bytes} bytes; a queue needs {need}")]
    SaveAreaTooSmall {
        /// Its size.
        bytes: u64,
        /// What a queue needs ([`compute::CONTEXT_SAVE_BYTES`]).
        need: u64,
    },
    /// A global-doorbell bit outside the page.
    #[error("global doorbell bit {bit} is outside the page ({bits} bits)")]
    NoGlobalDoorbellBit {
        /// The bit.
        bit: u32,
        /// Bits in the page.
        bits: u32,
    },
    /// More engines than an aggregated doorbell page has words.
    #[error("{engines} engines: an aggregated doorbell names at most {max}")]
    TooManyEngines {
        /// Engines configured.
        engines: usize,
        /// The most it can name.
        max: usize,
    },
    /// The device has no global doorbell (its model is dedicated).
    #[error("the device's doorbell model is {model}: it has no global doorbell")]
    NoGlobalDoorbell {
        /// The model.
        model: DoorbellModel,
    },
    /// A doorbell index outside the BAR.
    #[error("doorbell index {index} is outside the BAR ({count} doorbells)")]
    BadDoorbell {
        /// The index.
        index: u32,
        /// Doorbells in the BAR.
        count: u32,
    },
    /// Shared memory failed.
    #[error("shared memory: {0}")]
    Shm(#[from] shm::ShmError),
    /// The hardware the engines run on refused or failed ([`hw`]).
    #[error("hardware: {0}")]
    Hardware(#[from] hw::HwError),
    /// The queue is not held off the run list for the kernel (or it hung).
    #[error("firmware queue {0} is not held for the kernel")]
    NotHeld(FwQueueId),
    /// A take-back below the packet the queue resumes at, above what was accepted, or on a
    /// ring the kernel does not own.
    #[error(
        "take back to wptr {wptr:#x}: allowed from {floor:#x} to {accepted:#x} on a kernel-owned ring (privileged: {privileged})"
    )]
    BadTakeBack {
        /// The wptr asked for.
        wptr: u64,
        /// The lowest allowed.
        floor: u64,
        /// The highest (the last accepted).
        accepted: u64,
        /// Whether the ring is kernel-owned.
        privileged: bool,
    },
}

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

    /// Creates an empty address space.
    pub fn create_vm(&mut self) -> Vmid {
        if let Some(i) = self.vms.iter().position(Option::is_none) {
            self.vms[i] = Some(AddressSpace::default());
            return Vmid(i as u32);
        }
        self.vms.push(Some(AddressSpace::default()));
        Vmid(self.vms.len() as u32 - 1)
    }

    /// Destroys an address space. Queues still using it fault at once (each raises
    /// [`Interrupt::QueueFault`]): its `vmid` goes to the next address space created, and a
    /// queue left to fault at its next access would run there, in another process's memory.
    pub fn destroy_vm(&mut self, vmid: Vmid) -> Result<(), GpuError> {
        match self.vms.get_mut(vmid.0 as usize) {
            Some(entry @ Some(_)) if vmid.0 != 0 => {
                *entry = None;
                let now = self.fw.last_step();
                let Gpu { vms, fw, .. } = self;
                fw.address_space_destroyed(vmid, now, vms);
                fw.address_space_changed(vmid, None);
                Ok(())
            }
            _ => Err(GpuError::BadVmid(vmid.0)),
        }
    }

    /// An address space.
    pub fn vm(&self, vmid: Vmid) -> Result<&AddressSpace, GpuError> {
        self.vms.get(vmid.0 as usize).and_then(Option::as_ref).ok_or(GpuError::BadVmid(vmid.0))
    }

    /// An address space, mutably (the kernel maps and unmaps). Hardware slots, which keep
    /// their own copy of the page table, are told of the change when the guard drops: before
    /// the kernel's call returns to anyone who could submit work using the new mapping.
    pub fn vm_mut(&mut self, vmid: Vmid) -> Result<VmMut<'_>, GpuError> {
        let Gpu { vms, fw, .. } = self;
        let vm = vms.get_mut(vmid.0 as usize).and_then(Option::as_mut).ok_or(GpuError::BadVmid(vmid.0))?;
        Ok(VmMut { vmid, vm, fw })
    }

    /// The hardware the engines' slots are, if not virtual ([`hw`]).
    pub fn hardware_name(&self) -> Option<String> {
        self.fw.hardware_name()
    }

    // ---- firmware commands (the KMD's interface; amdgpu's MES API) ----

    /// Adds a queue to the firmware and its engine's run list.
    pub fn add_queue(&mut self, cfg: QueueConfig) -> Result<FwQueueId, GpuError> {
        let Gpu { vms, fw, .. } = self;
        let vm = vms.get(cfg.vmid.0 as usize).and_then(Option::as_ref).ok_or(GpuError::BadVmid(cfg.vmid.0))?;
        fw.add_queue(cfg, vm)
    }

    /// Removes a queue (it must not be running: the firmware stops it at a packet boundary).
    /// Returns its final rptr.
    pub fn remove_queue(&mut self, id: FwQueueId) -> Result<u64, GpuError> {
        let Gpu { vms, fw, .. } = self;
        let now = fw.last_step();
        fw.remove_queue(id, now, vms)
    }

    /// Takes a queue off the run list (context suspend) as a kernel preemption request,
    /// respecting the engine's preemption granularity: answered at once (in the returned
    /// [`Suspension`] and the firmware log) if it holds no slot or may stop where it stands;
    /// otherwise at the next point it may, by an [`Interrupt::Preempted`] with the ticket.
    pub fn suspend_queue(&mut self, id: FwQueueId, now: Time) -> Result<Suspension, GpuError> {
        self.fw.suspend_queue(id, now)
    }

    /// Asks the firmware to preempt queue `id` (spec 003; MES `SUSPEND`): it leaves its slot
    /// at the next point its engine's granularity allows, its state saved, and stays off the
    /// run list until [`Gpu::resume_queue`]. The answer is an [`Interrupt::Preempted`] with
    /// the returned ticket — raised at once when the queue can stop where it stands, never
    /// when it cannot stop (that is for the kernel's TDR timer).
    ///
    /// `requested_at` is when the kernel asked; `now` when the request reaches the device
    /// (the kernel may have waited for the device lock in between).
    pub fn request_preempt(&mut self, id: FwQueueId, requested_at: Time, now: Time) -> Result<u64, GpuError> {
        self.fw.request_preempt(id, requested_at, now)
    }

    /// Resets `engine` (`DxgkDdiResetEngine`): queues owing an answer to a preemption request
    /// hang; every other one leaves its slot with its state saved and keeps its work.
    pub fn reset_engine(&mut self, engine: abi::EngineId, now: Time) -> Result<EngineReset, GpuError> {
        let Gpu { vms, fw, .. } = self;
        fw.reset_engine(engine, now, vms)
    }

    /// Resets one queue (amdgpu's per-queue reset): it hangs with `why` (the kernel's reason:
    /// a preemption it would not answer, or the hang timer), nothing else is touched.
    /// Returns the last progress value the engine accepted from it.
    pub fn reset_queue(&mut self, id: FwQueueId, why: abi::queue::FaultKind, now: Time) -> Result<u64, GpuError> {
        let Gpu { vms, fw, .. } = self;
        fw.reset_queue(id, why, now, vms)
    }

    /// Where a queue held off the run list for the kernel (answered preemption, suspended
    /// context) stands in its ring.
    pub fn held_position(&self, id: FwQueueId) -> Result<RingPosition, GpuError> {
        self.fw.held_position(id)
    }

    /// Takes back the unstarted work of a held kernel-owned ring: its accepted wptr drops to
    /// `wptr`, no lower than the packet it resumes at (spec 003's resubmission after
    /// preemption). The kernel stores `wptr` in the ring's wptr word first.
    pub fn take_back(&mut self, id: FwQueueId, wptr: u64, now: Time) -> Result<(), GpuError> {
        self.fw.take_back(id, wptr, now)
    }

    /// Resets the whole adapter (`DxgkDdiResetFromTimeout`): every queue hangs, its state
    /// lost. Returns the queues that hung.
    pub fn reset_adapter(&mut self, now: Time) -> Vec<FwQueueId> {
        let Gpu { vms, fw, .. } = self;
        fw.reset_adapter(now, vms)
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

    /// Puts a suspended queue back on the run list (context resume).
    pub fn resume_queue(&mut self, id: FwQueueId) -> Result<(), GpuError> {
        self.fw.resume_queue(id)
    }

    /// Makes the firmware watch doorbell `index` of the BAR for `id`, then checks the queue's
    /// wptr for work published while it was not watched.
    pub fn bind_doorbell(&mut self, id: FwQueueId, index: u32) -> Result<(), GpuError> {
        let count = self.doorbell_count();
        if index >= count {
            return Err(GpuError::BadDoorbell { index, count });
        }
        self.fw.bind_doorbell(id, index)
    }

    /// Connects a queue to the global doorbell, as bit `bit` of BAR page `page` (its
    /// process's doorbell page): from now on a ring of that bit makes the firmware re-read its
    /// wptr. Work published while it was disconnected is found at once.
    pub fn bind_global_doorbell(&mut self, id: FwQueueId, page: u32, bit: u32) -> Result<(), GpuError> {
        let pages = self.bar.pages();
        if page >= pages {
            return Err(GpuError::BadDoorbell {
                index: page.saturating_mul(abi::doorbell::DOORBELLS_PER_PAGE),
                count: self.doorbell_count(),
            });
        }
        self.fw.bind_global_doorbell(id, page, bit)
    }

    /// Watches BAR page `page` as a process's aggregated doorbell: engine `e` rings word `e`
    /// (any store), and the firmware then polls the wptrs of that engine's queues.
    pub fn watch_aggregated_doorbell(&mut self, page: u32) -> Result<(), GpuError> {
        self.fw.watch_aggregated(page)
    }

    /// Stops watching an aggregated doorbell page.
    pub fn unwatch_aggregated_doorbell(&mut self, page: u32) {
        self.fw.unwatch_aggregated(page)
    }

    /// Which doorbell queue `id` answers to now (`None`: unbound), and for a BAR word when it
    /// was last bound or rung. Read-only.
    pub fn doorbell_of(&self, id: FwQueueId) -> Result<Option<BoundDoorbell>, GpuError> {
        self.fw.doorbell_of(id)
    }

    /// Stops watching the queue's doorbell, then checks its wptr one last time so a ring that
    /// raced the unbind is not lost.
    pub fn unbind_doorbell(&mut self, id: FwQueueId) -> Result<(), GpuError> {
        self.fw.unbind_doorbell(id)
    }

    /// `DxgkDdiSetNativeFenceLogBuffer` on the device: the queue's fence log `index` (0 waits,
    /// 1 signals) is now `log`; later logged operations write there. `false` if the queue has
    /// no fence logs.
    pub fn set_fence_log(&mut self, id: FwQueueId, index: usize, log: Arc<Shm>) -> Result<bool, GpuError> {
        self.fw.set_fence_log(id, index, log)
    }

    /// Sets the progress value above which a `PROGRESS_FENCE` raises an interrupt
    /// (`u64::MAX`: none).
    pub fn set_monitored(&mut self, id: FwQueueId, value: u64) -> Result<(), GpuError> {
        self.fw.set_monitored(id, value)
    }

    /// The queue's state, as the firmware sees it.
    pub fn queue_state(&self, id: FwQueueId) -> Result<abi::QueueState, GpuError> {
        self.fw.queue_state(id)
    }

    /// The fault that hung the queue.
    pub fn queue_fault(&self, id: FwQueueId) -> Result<Option<abi::queue::FaultRecord>, GpuError> {
        self.fw.queue_fault(id)
    }

    /// Whether the queue has unconsumed work (`rptr != wptr`).
    pub fn queue_has_work(&self, id: FwQueueId) -> Result<bool, GpuError> {
        self.fw.queue_has_work(id)
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

    /// Wakes an engine to F0.
    pub fn request_f0(&mut self, engine: abi::EngineId, now: Time) -> Result<(), GpuError> {
        self.fw.request_f0(engine, now)
    }

    /// Puts an idle engine in F1. Refused (returns `false`, engine stays F0) if any queue on
    /// its run list still has work: the kernel must reconnect their doorbells. A queue held off
    /// the run list ([`Gpu::suspend_queue`], [`Gpu::request_preempt`]) does not count: its work
    /// is kept, and runs once it is resumed *and* the engine is back in F0
    /// ([`Gpu::request_f0`]), so the kernel wakes the engine when it resumes a queue.
    pub fn enter_f1(&mut self, engine: abi::EngineId, now: Time) -> Result<bool, GpuError> {
        let Gpu { vms, fw, .. } = self;
        fw.enter_f1(engine, now, vms)
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

    /// `DxgkDdiCreateNativeFence`: a `SIGNAL` with the fence flag that lands on `current`
    /// (a region and offset) compares against the MonitoredValue at `monitored` and raises
    /// [`Interrupt::NativeFenceSignaled`] with `id`.
    pub fn register_native_fence(&mut self, current: (&Shm, u64), monitored: shm::Word, id: u64, waits: FenceWaits) {
        self.fw.register_fence(current, monitored, id, waits)
    }

    /// `DxgkDdiDestroyNativeFence`.
    pub fn unregister_native_fence(&mut self, current: (&Shm, u64)) {
        self.fw.unregister_fence(current)
    }

    /// Native fences changed without the engines executing a signal (a CPU update, another
    /// adapter's signal): queues parked in a fence `WAIT` re-check. The firmware re-checks
    /// them only when a fence may have changed.
    pub fn notify_fences(&mut self) {
        self.fw.notify_fences()
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
}

/// An address space borrowed mutably from its device ([`Gpu::vm_mut`]): derefs to the
/// [`AddressSpace`]; when it drops, hardware slots that keep a copy of its page table are
/// given the new one.
pub struct VmMut<'a> {
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
