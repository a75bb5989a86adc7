//! Engines whose hardware queue slots are real hardware: the seam between the scheduling
//! firmware and what executes packets.
//!
//! Spec 001 puts a scheduler (the MES: a microcontroller on AMD parts) beside the command
//! processors that fetch and execute packets. In doorbell the scheduler is always the Rust
//! [`Firmware`](crate) — slot mapping, oversubscription, doorbell watching, preemption
//! requests, timers — and by default the engines are too (`firmware/exec.rs`, virtual
//! engines run on the firmware's thread). A device built with a [`Hardware`] instead moves
//! the slots and engines elsewhere (the `cuda` crate: a persistent program on an NVIDIA GPU,
//! or the same program emulated on the CPU). The firmware then drives the hardware the way
//! amdgpu drives MES: with typed commands ([`HwCommand`]: load a queue into a slot, stop it,
//! abort it, here is an address space, here is a native fence) and by reading what the
//! hardware reports ([`HwEvent`]: idle, busy, blocked, a user interrupt, a signal, a fault,
//! a stop with where the queue stood).
//!
//! A loaded queue runs by itself: the slot polls the queue's wptr, fetches, executes, writes
//! rptr, the progress fence, fence values and fence-log entries. Its execution state —
//! [`QueueRegs`], amdgpu's HQD registers — lives in the slot while it is loaded, and comes
//! back to the firmware's queue table (the MQD) when it leaves.
//!
//! Invariants the firmware keeps on its side of the seam:
//! - a queue is loaded in at most one slot, and only while the scheduler maps it;
//! - it leaves a slot only through [`HwCommand::Stop`] or [`HwCommand::Abort`], answered by
//!   [`HwEvent::Stopped`] with its final registers (so nothing it executed is lost, and a
//!   stopped queue resumes exactly where it stood);
//! - the memory a loaded queue reaches stays alive until the slot's answer (the commands
//!   hand the hardware `Arc`s).

use std::sync::Arc;

use abi::preempt::Stop;
use abi::queue::FaultRecord;
use abi::{EngineId, EngineKind};
use shm::{Shm, Word};

use crate::{AddressSpace, FwQueueId, StopPoint, Time, Vmid};

/// Where a queue stands in its ring: the execution state that lives in a hardware slot while
/// the queue is loaded (amdgpu: the HQD registers, saved to the MQD when it leaves).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueRegs {
    /// The next packet's ring pointer.
    pub rptr: u64,
    /// The last wptr the engine validated.
    pub wptr: u64,
    /// The last-queued progress value read with it.
    pub queued: u64,
    /// The last progress value completed.
    pub completed: u64,
    /// An indirect buffer part-way done: its address, length and position (dwords), and the
    /// address space of a privileged queue's buffer in another one.
    pub ib: Option<IndirectPosition>,
    /// A `COPY`, `FILL` or `SYNTHETIC` part-way done: bytes (ns) done.
    pub bulk_done: Option<u64>,
    /// A `DISPATCH` part-way done: its state is in the queue's context save area.
    pub dispatch_active: bool,
    /// It last completed a `PROGRESS_FENCE` (or nothing yet).
    pub at_cb_boundary: bool,
    /// When a logged `WAIT` it is blocked on was first seen.
    pub wait_observed: Option<Time>,
}

/// An indirect buffer part-way done ([`QueueRegs::ib`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndirectPosition {
    /// Its address.
    pub va: u64,
    /// Its length in dwords.
    pub dwords: u32,
    /// The next dword.
    pub pos: u32,
    /// A privileged queue's buffer in another address space.
    pub vmid: Option<Vmid>,
}

/// A queue as a slot loads it (amdgpu's MQD): its memory, and where it stands.
pub struct QueueImage<'a> {
    /// The firmware's name for it.
    pub queue: FwQueueId,
    /// Its address space.
    pub vmid: Vmid,
    /// The ring: its region and the offset of its byte 0 there.
    pub ring: (&'a Arc<Shm>, u64),
    /// The ring's GPU VA.
    pub ring_va: u64,
    /// The ring's size (a power of two).
    pub ring_bytes: u64,
    /// The client's rptr word (the engine writes it).
    pub rptr_word: &'a Word,
    /// The client's wptr word (the engine polls it).
    pub wptr_word: &'a Word,
    /// The client's last-queued progress value, if the queue has one.
    pub last_queued_word: Option<&'a Word>,
    /// The progress word of the queue's kernel page (`PROGRESS_FENCE` writes it).
    pub completed_word: &'a Word,
    /// The queue's fence logs, `[waits, signals]` (`None` for a kernel queue).
    pub fence_logs: Option<&'a [Arc<Shm>; 2]>,
    /// The queue's context save area.
    pub context_save: &'a Arc<Shm>,
    /// A kernel queue (may name another address space in `INDIRECT_BUFFER`).
    pub privileged: bool,
    /// Where it stands.
    pub regs: QueueRegs,
}

/// What the firmware tells the hardware.
pub enum HwCommand<'a> {
    /// Load a queue into a free slot of `engine`: it runs from where its registers say until
    /// it is told to stop.
    Load {
        /// The engine.
        engine: EngineId,
        /// The slot (below the engine's slot count).
        slot: u32,
        /// The queue.
        queue: QueueImage<'a>,
        /// Device time now (for timestamps the hardware writes).
        now: Time,
    },
    /// Stop the slot's queue at the next point `rule` allows, its state saved; answered by
    /// [`HwEvent::Stopped`].
    Stop {
        /// The engine.
        engine: EngineId,
        /// The slot.
        slot: u32,
        /// Where it may stop: the engine's granularity ([`Stop::allows`],
        /// [`Stop::allows_blocked_wait`]).
        rule: Stop,
    },
    /// Abandon the slot's queue at once, nothing saved (a reset, a removal); answered by
    /// [`HwEvent::Stopped`] with no point.
    Abort {
        /// The engine.
        engine: EngineId,
        /// The slot.
        slot: u32,
    },
    /// Address space `vmid` changed (a mapping added or removed): its table, or `None` once it
    /// is destroyed.
    AddressSpace {
        /// The space.
        vmid: Vmid,
        /// Its mappings.
        vm: Option<&'a AddressSpace>,
    },
    /// A native fence was registered (`Some(id)`) or unregistered (`None`): its CurrentValue
    /// is at `offset` of `region`.
    NativeFence {
        /// Where CurrentValue lives.
        region: &'a Shm,
        /// Its offset there.
        offset: u64,
        /// Its id, while registered.
        id: Option<u64>,
    },
    /// A loaded queue's fence log `index` (0 waits, 1 signals) was replaced.
    FenceLog {
        /// The engine.
        engine: EngineId,
        /// The slot.
        slot: u32,
        /// Which log.
        index: usize,
        /// The new log.
        log: &'a Arc<Shm>,
    },
}

/// What the hardware reports, per slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HwEventKind {
    /// The queue consumed everything published: it waits for more by itself.
    Idle,
    /// It found new work, or its `WAIT` passed.
    Busy,
    /// Its `WAIT` on the word at `va` of `vmid` did not pass.
    Blocked {
        /// The address space.
        vmid: Vmid,
        /// The word.
        va: u64,
        /// The value waited for.
        value: u64,
    },
    /// An `INTERRUPT` packet.
    User {
        /// Its id.
        id: u32,
    },
    /// A `SIGNAL` stored `value` at `va` of `vmid` (the firmware makes spec 002's
    /// MonitoredValue check).
    Signaled {
        /// The address space.
        vmid: Vmid,
        /// The word.
        va: u64,
        /// The value.
        value: u64,
    },
    /// The queue faulted and left the slot.
    Fault {
        /// The fault.
        record: FaultRecord,
        /// Its final registers.
        regs: QueueRegs,
    },
    /// The queue left the slot for a stop (`point`: where it stood) or an abort (`None`).
    Stopped {
        /// Where it stopped.
        point: Option<StopPoint>,
        /// Its final registers.
        regs: QueueRegs,
    },
}

/// One report of one slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HwEvent {
    /// The engine.
    pub engine: EngineId,
    /// The slot.
    pub slot: u32,
    /// What happened.
    pub kind: HwEventKind,
}

/// A slot's state as the hardware last published it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotProgress {
    /// The registers of the queue last loaded (rptr, completed...), once the slot has
    /// published any: `None` while what it shows is still about the queue before (a slot
    /// takes a load some time after it is given).
    pub regs: Option<QueueRegs>,
    /// Packets the slot executed since the hardware started.
    pub packets: u64,
    /// Wave-instructions it executed.
    pub instructions: u64,
    /// Active lanes of those.
    pub lane_ops: u64,
    /// Bytes moved by `COPY`/`FILL`.
    pub bytes: u64,
}

/// What the hardware refused or could not do.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HwError {
    /// Something the hardware cannot express (named).
    #[error("the hardware cannot do this: {0}")]
    Unsupported(String),
    /// The device failed (a driver call, a lost GPU).
    #[error("the hardware failed: {0}")]
    Failed(String),
    /// A slot out of range.
    #[error("engine {engine} has no slot {slot}")]
    NoSlot {
        /// The engine.
        engine: u32,
        /// The slot.
        slot: u32,
    },
}

/// The hardware an engine's slots are. See the module docs.
pub trait Hardware: Send {
    /// What it is, for messages ("NVIDIA H200 (CUDA)", "emulated").
    fn name(&self) -> String;

    /// Prepares `slots` hardware queue slots for each engine (kinds in id order), with waves
    /// of `wave_width` lanes. Called once, before any command.
    fn attach(&mut self, engines: &[EngineKind], slots: u32, wave_width: u32) -> Result<(), HwError>;

    /// Carries out one command.
    fn command(&mut self, cmd: HwCommand<'_>) -> Result<(), HwError>;

    /// Lets the hardware run (an emulator executes here; a GPU runs by itself) and moves what
    /// its slots reported since the last call into `out`, in each slot's order. Returns whether
    /// any slot may have more to do right now (a driver that steps in a loop steps again).
    fn poll(&mut self, now: Time, out: &mut Vec<HwEvent>) -> bool;

    /// A slot's state as last published (no command, no wait; a few cache lines the device
    /// writes).
    fn progress(&self, engine: EngineId, slot: u32) -> SlotProgress;

    /// Whether the firmware should read every slot's whole status at every step (an emulator
    /// in the firmware's own thread, where reads cost nothing and runs must not depend on how
    /// often they happen); otherwise it reads the progress value every step and the rest now
    /// and then.
    fn status_every_step(&self) -> bool {
        false
    }
}

/// A [`Hardware`] a device configuration carries ([`crate::GpuConfig::hardware`]): built once
/// per device by `make`.
#[derive(Clone)]
pub struct HardwareFactory {
    /// What it builds (for messages).
    pub name: String,
    /// Builds one.
    pub make: Arc<dyn Fn() -> Result<Box<dyn Hardware>, HwError> + Send + Sync>,
}

impl core::fmt::Debug for HardwareFactory {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "HardwareFactory({})", self.name)
    }
}
