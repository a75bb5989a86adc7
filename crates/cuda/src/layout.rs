//! The memory the host and the engine program share, as Rust types: a mirror of
//! `device/layout.cuh` and the fault record of `device/common.cuh`, checked field by field at
//! compile time here and against the C++ compiler's own sizes by a test (`db_emu_layout`).
//!
//! These are plain `#[repr(C)]` structs: nothing here touches shared memory. The host reads and
//! writes them in place only through [`crate::shared`], which owns the raw pointers.

use core::mem::{offset_of, size_of};

/// The byte offset of a field in shared memory, named by struct and field, never by a number
/// (rule 5: typed views): `at!(SlotCtl[i].seq)` is field `seq` of element `i` of an array of
/// [`SlotCtl`]; `at!(Globals.quit)` a field of a single struct at offset 0.
macro_rules! at {
    ($t:ident [$i:expr] . $f:ident) => {
        ($i) * core::mem::size_of::<$crate::layout::$t>() + core::mem::offset_of!($crate::layout::$t, $f)
    };
    ($t:ident . $f:ident) => {
        core::mem::offset_of!($crate::layout::$t, $f)
    };
}
pub(crate) use at;

/// Events in one slot's ring.
pub const SLOT_EVENTS: u64 = 1024;
/// Mappings of an address space a slot keeps in its own fast memory.
pub const VM_CACHE_ENTRIES: u32 = 256;
/// The most address spaces the directory holds.
pub const MAX_VMIDS: u32 = 4096;
/// The most slots one device runs (`Globals::engine_kind`).
pub const MAX_SLOTS: u32 = 64;
/// Instructions in a slot's program cache (`ISA_MAX_INSTRUCTIONS`).
pub const ISA_MAX_INSTRUCTIONS: u64 = 65536;
/// Bytes of a slot's private memory: its program cache and register file (`PRIV_BYTES`).
pub const PRIV_BYTES: u64 = ISA_MAX_INSTRUCTIONS * 8 + 64 * 32 * 4;

/// `SlotCmd`.
pub mod cmd {
    /// Load `SlotCtl::mqd`.
    pub const LOAD: u32 = 1;
    /// Stop at an allowed point.
    pub const STOP: u32 = 2;
    /// Abandon at once.
    pub const ABORT: u32 = 3;
}

/// `SlotRun`.
pub mod run {
    /// No queue.
    pub const EMPTY: u32 = 0;
    /// Executing.
    pub const BUSY: u32 = 1;
    /// Consumed everything published.
    pub const IDLE: u32 = 2;
    /// In a `WAIT` that does not pass.
    pub const BLOCKED: u32 = 3;
}

/// `EventKind`.
pub mod ev {
    /// Idle.
    pub const IDLE: u32 = 1;
    /// Busy again.
    pub const BUSY: u32 = 2;
    /// Blocked in a `WAIT`.
    pub const BLOCKED: u32 = 3;
    /// An `INTERRUPT` packet.
    pub const USER: u32 = 4;
    /// A `SIGNAL`.
    pub const SIGNALED: u32 = 5;
    /// A fault.
    pub const FAULT: u32 = 6;
    /// Left the slot.
    pub const STOPPED: u32 = 7;
    /// `Event::a32` of a `STOPPED` for an abort.
    pub const ABORTED: u32 = u32::MAX;
}

/// `SlotCtl::stop` bit of a stop point (`StopPointCode`).
pub const fn stop_at(sp: u32) -> u32 {
    1 << sp
}
/// The stop points (`StopPointCode`) by the firmware's names, in order.
pub const STOP_POINTS: [(abi::preempt::StopPoint, u32); 7] = {
    use abi::preempt::StopPoint as P;
    [
        (P::Idle, sp::IDLE),
        (P::CommandBuffer, sp::COMMAND_BUFFER),
        (P::Packet, sp::PACKET),
        (P::Group, sp::GROUP),
        (P::Wave, sp::WAVE),
        (P::Instruction, sp::INSTRUCTION),
        (P::Chunk, sp::CHUNK),
    ]
};
/// `SlotCtl::stop`: a `WAIT` that does not pass may be left.
pub const STOP_BLOCKED_WAIT: u32 = 1 << 16;

/// `Regs::flags`.
pub mod reg {
    /// An indirect buffer part-way done.
    pub const IB: u32 = 1;
    /// ... in another address space.
    pub const IB_VMID: u32 = 2;
    /// A dispatch part-way done.
    pub const DISPATCH: u32 = 4;
    /// A bulk packet part-way done.
    pub const BULK: u32 = 8;
    /// At a command-buffer boundary.
    pub const CB_BOUNDARY: u32 = 16;
    /// `wait_observed` is set.
    pub const WAIT_OBSERVED: u32 = 32;
}

/// `Mqd::flags`.
pub mod mqd {
    /// A kernel queue.
    pub const PRIVILEGED: u32 = 1;
    /// A compute engine's queue.
    pub const COMPUTE: u32 = 2;
    /// `last_queued_word` is set.
    pub const LAST_QUEUED: u32 = 4;
}

/// The fence-log word's address bits (`LOG_ADDR_MASK`); the entry count is above them.
pub const LOG_ADDR_MASK: u64 = (1 << 48) - 1;

/// `StopPointCode`, in `abi::preempt::StopPoint`'s order.
pub mod sp {
    /// Idle.
    pub const IDLE: u32 = 0;
    /// A command-buffer boundary.
    pub const COMMAND_BUFFER: u32 = 1;
    /// A packet boundary.
    pub const PACKET: u32 = 2;
    /// A workgroup boundary.
    pub const GROUP: u32 = 3;
    /// A wave boundary.
    pub const WAVE: u32 = 4;
    /// An instruction boundary.
    pub const INSTRUCTION: u32 = 5;
    /// A chunk boundary.
    pub const CHUNK: u32 = 6;
}

/// `Fault` (common.cuh): a `FaultKind` as numbers.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fault {
    /// `FaultKindCode`.
    pub kind: u32,
    /// An access, a `DecodeErrorCode` or a `KernelErrorCode`.
    pub sub: u32,
    /// Fields in declaration order.
    pub a: u64,
    /// ...
    pub b: u64,
    /// ...
    pub c: u64,
    /// An instruction index.
    pub pc: u32,
    /// `ProgramAccess`: the inner access fault's kind.
    pub inner: u32,
    /// A `Str` number (or an opcode number).
    pub s1: u32,
    /// A `Str` number.
    pub s2: u32,
}

/// `Regs`: where a queue stands.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Regs {
    /// rptr.
    pub rptr: u64,
    /// The last validated wptr.
    pub wptr: u64,
    /// The last-queued value read with it.
    pub queued: u64,
    /// The last completed progress value.
    pub completed: u64,
    /// Indirect buffer address.
    pub ib_va: u64,
    /// Its length (dwords).
    pub ib_dwords: u32,
    /// Its position (dwords).
    pub ib_pos: u32,
    /// Its address space.
    pub ib_vmid: u32,
    /// [`reg`] bits.
    pub flags: u32,
    /// Bulk progress.
    pub bulk_done: u64,
    /// When a logged wait was first seen.
    pub wait_observed: u64,
}

/// `Mqd`: a queue as a slot loads it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mqd {
    /// Device address of ring byte 0.
    pub ring: u64,
    /// Its GPU VA.
    pub ring_va: u64,
    /// Its size.
    pub ring_bytes: u64,
    /// Device address of the rptr word.
    pub rptr_word: u64,
    /// ... of the wptr word.
    pub wptr_word: u64,
    /// ... of the last-queued word (0: none).
    pub last_queued_word: u64,
    /// ... of the kernel page's progress word.
    pub completed_word: u64,
    /// ... of the context save area.
    pub save_area: u64,
    /// Its size.
    pub save_bytes: u64,
    /// Device time = global timer + this.
    pub clock_offset: i64,
    /// Address space.
    pub vmid: u32,
    /// [`mqd`] bits.
    pub flags: u32,
    /// Where it stands.
    pub regs: Regs,
}

/// `SlotCtl`: host → slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SlotCtl {
    /// Command sequence.
    pub seq: u64,
    /// [`cmd`].
    pub cmd: u32,
    /// Stop bits.
    pub stop: u32,
    /// Events consumed.
    pub events_read: u64,
    /// Fence logs: address | entries << 48.
    pub fence_log: [u64; 2],
    /// The queue to load.
    pub mqd: Mqd,
}

/// `SlotStatus`: slot → host.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SlotStatus {
    /// The last command handled.
    pub ack: u64,
    /// [`run`].
    pub state: u32,
    /// Padding.
    pub pad: u32,
    /// Where its queue stands.
    pub regs: Regs,
    /// Packets executed.
    pub packets: u64,
    /// Wave-instructions.
    pub instructions: u64,
    /// Lane operations.
    pub lane_ops: u64,
    /// Bytes moved.
    pub bytes: u64,
    /// Events written.
    pub events_written: u64,
    /// Steps taken.
    pub heartbeat: u64,
    /// The load `regs` describe.
    pub load: u64,
}

/// `Event`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Event {
    /// 1-based position, stored last.
    pub seq: u64,
    /// The load it concerns.
    pub load: u64,
    /// [`ev`].
    pub kind: u32,
    /// A small field.
    pub a32: u32,
    /// Fields.
    pub a: u64,
    /// ...
    pub b: u64,
    /// ...
    pub c: u64,
    /// A fault.
    pub fault: Fault,
}

/// `VmEntry`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VmEntry {
    /// GPU VA.
    pub va: u64,
    /// Length.
    pub bytes: u64,
    /// Device address.
    pub dev: u64,
    /// `VM_WRITABLE`.
    pub flags: u64,
}
/// `VmEntry::flags`: the GPU may write it.
pub const VM_WRITABLE: u64 = 1;

/// `VmDir`: one address space's entry in the directory (a seqlock).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct VmDir {
    /// Odd while rewritten.
    pub seq: u64,
    /// Device address of its table.
    pub table: u64,
    /// Entries.
    pub count: u32,
    /// Padding.
    pub pad: u32,
}

/// `FenceSlot`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FenceSlot {
    /// Device address of CurrentValue (0: empty).
    pub key: u64,
    /// The fence's id.
    pub id: u64,
}

/// Where fence `key` is looked for first in a table of `mask + 1` slots (the same function as
/// `fence_id` in engine.cu).
pub fn fence_hash(key: u64) -> u32 {
    ((key >> 3).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as u32
}

/// `Globals`: what every slot reads.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Globals {
    /// Set to end the program.
    pub quit: u64,
    /// Device address of the directory.
    pub vm_dir: u64,
    /// Its entries.
    pub vm_count: u32,
    /// Fence table capacity - 1.
    pub fence_mask: u32,
    /// Device address of the fence table.
    pub fence_table: u64,
    /// Its seqlock.
    pub fence_seq: u64,
    /// Slots in all.
    pub slots: u64,
    /// Device address of the `SlotCtl` array.
    pub ctl: u64,
    /// ... of the `SlotStatus` array.
    pub status: u64,
    /// ... of the event rings.
    pub events: u64,
    /// ... of the slots' private memory.
    pub private: u64,
    /// Bytes of private memory per slot.
    pub private_bytes: u64,
    /// Per slot: 1 for a compute engine's.
    pub engine_kind: [u32; MAX_SLOTS as usize],
    /// How long a caught-up queue stays reported busy before its slot reports it idle.
    pub idle_after_ns: u64,
}

impl Default for Globals {
    fn default() -> Self {
        Globals {
            quit: 0,
            vm_dir: 0,
            vm_count: 0,
            fence_mask: 0,
            fence_table: 0,
            fence_seq: 0,
            slots: 0,
            ctl: 0,
            status: 0,
            events: 0,
            private: 0,
            private_bytes: 0,
            engine_kind: [0; MAX_SLOTS as usize],
            idle_after_ns: 0,
        }
    }
}

const _: () = {
    assert!(size_of::<Fault>() == 48);
    assert!(offset_of!(Fault, pc) == 32 && offset_of!(Fault, s2) == 44);
    assert!(size_of::<Regs>() == 72);
    assert!(
        offset_of!(Regs, ib_dwords) == 40 && offset_of!(Regs, flags) == 52 && offset_of!(Regs, wait_observed) == 64
    );
    assert!(size_of::<Mqd>() == 160);
    assert!(offset_of!(Mqd, vmid) == 80 && offset_of!(Mqd, regs) == 88);
    assert!(size_of::<SlotCtl>() == 24 + 16 + 160);
    assert!(offset_of!(SlotCtl, cmd) == 8 && offset_of!(SlotCtl, fence_log) == 24 && offset_of!(SlotCtl, mqd) == 40);
    assert!(size_of::<SlotStatus>() == 16 + 72 + 56);
    assert!(offset_of!(SlotStatus, load) == 136);
    assert!(offset_of!(SlotStatus, regs) == 16 && offset_of!(SlotStatus, events_written) == 120);
    assert!(size_of::<Event>() == 96);
    assert!(offset_of!(Event, kind) == 16 && offset_of!(Event, fault) == 48);
    assert!(size_of::<VmEntry>() == 32);
    assert!(size_of::<VmDir>() == 24);
    assert!(size_of::<FenceSlot>() == 16);
    assert!(offset_of!(Globals, fence_table) == 24 && offset_of!(Globals, engine_kind) == 88);
    assert!(offset_of!(Globals, idle_after_ns) == 344);
};

/// The sizes the C++ compiler gave the same structs, in this order (the emulated build's
/// `db_emu_layout` fills them; a test compares).
pub const LAYOUT_SIZES: [(&str, usize); 10] = [
    ("Fault", size_of::<Fault>()),
    ("Regs", size_of::<Regs>()),
    ("Mqd", size_of::<Mqd>()),
    ("SlotCtl", size_of::<SlotCtl>()),
    ("SlotStatus", size_of::<SlotStatus>()),
    ("Event", size_of::<Event>()),
    ("VmEntry", size_of::<VmEntry>()),
    ("VmDir", size_of::<VmDir>()),
    ("FenceSlot", size_of::<FenceSlot>()),
    ("Globals", size_of::<Globals>()),
];
