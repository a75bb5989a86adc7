// layout.cuh — the memory the host (doorbell's firmware, on the CPU) and the engine program
// (on the GPU) share: per-slot command and status blocks, per-slot event rings, the address
// space directory and the native-fence table. All of it is pinned host memory the GPU reaches
// over PCIe (on the emulated backend, plain host memory). crates/cuda/src/layout.rs mirrors
// every struct with #[repr(C)] and checks each size and offset at compile time.
//
// The protocol, per hardware queue slot (amdgpu's HQD; the MES on the CPU drives it):
//
//   host:  writes SlotCtl.{cmd, stop, mqd}, then SlotCtl.seq + 1 (release)
//   slot:  sees the new seq (acquire), acts, publishes SlotStatus (regs, state), then
//          SlotStatus.ack = seq (release); a STOP or ABORT is answered by an EV_STOPPED event
//          as well, written when the queue is off the slot.
//   slot:  appends events to its ring: the payload, a system fence, then Event.seq (the
//          event's 1-based position) last; the host reads an event once its seq matches the
//          position it expects, and publishes SlotCtl.events_read so the slot never
//          overwrites an unread event.
//
// Invariants: the host writes only SlotCtl and the tables; the slot writes only SlotStatus,
// its event ring, and the queue's own memory (ring rptr, progress word, fence logs, the
// packets' targets, its context save area). A slot acts on a command exactly once.

#pragma once
#include "common.cuh"

/// Events in one slot's ring.
#define SLOT_EVENTS 1024u
/// Ring dwords the slot fetches at once (its fetch window, 2 KiB: sixteen loads per lane,
/// all in flight together, so a burst of small command buffers costs one PCIe round trip).
#define FETCH_DWORDS 512u
/// Longest fixed-size packet (abi::packet::MAX_FIXED_PACKET_DWORDS).
#define MAX_FIXED_DWORDS 11u
/// Mappings of an address space the slot keeps in its own (fast) memory; a larger space is
/// searched where it lies, more slowly.
#define VM_CACHE_ENTRIES 256u

enum SlotCmd : u32 {
    CMD_NONE = 0,
    /// Load SlotCtl.mqd: the queue runs from where its regs say.
    CMD_LOAD = 1,
    /// Stop the queue at the next point SlotCtl.stop allows, its state saved; answered by
    /// EV_STOPPED.
    CMD_STOP = 2,
    /// Abandon the queue at once, nothing saved (a reset); answered by EV_STOPPED with
    /// a32 = STOPPED_ABORTED.
    CMD_ABORT = 3,
};

/// SlotStatus.state.
enum SlotRun : u32 {
    RUN_EMPTY = 0,
    RUN_BUSY = 1,
    RUN_IDLE = 2,
    RUN_BLOCKED = 3,
};

/// Event kinds.
enum EventKind : u32 {
    /// The queue consumed everything published (a = rptr).
    EV_IDLE = 1,
    /// It found new work, or its WAIT passed (a = rptr).
    EV_BUSY = 2,
    /// A WAIT blocked: a = va, b = value, a32 = vmid.
    EV_BLOCKED = 3,
    /// An INTERRUPT packet: a32 = its id.
    EV_USER = 4,
    /// A SIGNAL executed: a = va, b = value, a32 = vmid, c = the device address written (the
    /// host makes spec 002's MonitoredValue check, after the value was stored).
    EV_SIGNALED = 5,
    /// The queue faulted and left the slot: fault, a = rptr, a32 = opcode + 1 (0: none),
    /// b = in an indirect buffer.
    EV_FAULT = 6,
    /// The queue left the slot for a STOP (a32 = the StopPointCode) or an ABORT
    /// (a32 = STOPPED_ABORTED); its final regs are in SlotStatus.
    EV_STOPPED = 7,
};
#define STOPPED_ABORTED 0xffffffffu

/// SlotCtl.stop: the stop points a CMD_STOP may use (bit per StopPointCode), and whether a
/// WAIT that does not pass may be left (every granularity but None).
#define STOP_AT(sp) (1u << (sp))
#define STOP_BLOCKED_WAIT (1u << 16)

/// Regs.flags.
#define REG_IB 1u           // an indirect buffer is part-way done (ib_*)
#define REG_IB_VMID 2u      // ... in address space ib_vmid (a privileged queue's)
#define REG_DISPATCH 4u     // a DISPATCH is part-way done: its state is in the save area
#define REG_BULK 8u         // a COPY/FILL/SYNTHETIC is part-way done: bulk_done bytes (ns)
#define REG_CB_BOUNDARY 16u // it last completed a PROGRESS_FENCE (or nothing yet)
#define REG_WAIT_OBSERVED 32u // wait_observed holds when a logged WAIT was first seen

/// Where a queue stands (gpu::hw::QueueRegs): loaded with the queue, published as it runs,
/// final once it left the slot.
struct Regs {
    u64 rptr;
    u64 wptr;      // the last wptr the engine validated
    u64 queued;    // the last-queued value read with it
    u64 completed; // the last progress value completed
    u64 ib_va;
    u32 ib_dwords;
    u32 ib_pos;
    u32 ib_vmid;
    u32 flags;
    u64 bulk_done;
    u64 wait_observed;
};
DB_STATIC_ASSERT(sizeof(Regs) == 72, "Regs layout");

/// Mqd.flags.
#define MQD_PRIVILEGED 1u
#define MQD_COMPUTE 2u     // a compute engine's queue (DISPATCH allowed)
#define MQD_LAST_QUEUED 4u // last_queued_word is set

/// A queue as a slot loads it (amdgpu's MQD): its memory as device addresses, and its regs.
struct Mqd {
    u64 ring;             // device address of ring byte 0
    u64 ring_va;          // its GPU VA (for fault records)
    u64 ring_bytes;
    u64 rptr_word;
    u64 wptr_word;
    u64 last_queued_word; // 0 unless MQD_LAST_QUEUED
    u64 completed_word;   // the kernel page's progress word
    u64 save_area;        // the context save area
    u64 save_bytes;
    i64 clock_offset;     // device time (ns) = global timer + clock_offset
    u32 vmid;
    u32 flags;
    Regs regs;
};
DB_STATIC_ASSERT(sizeof(Mqd) == 160, "Mqd layout");

/// Host → slot.
struct SlotCtl {
    u64 seq;         // bumped for each command, stored last (release)
    u32 cmd;         // SlotCmd
    u32 stop;        // STOP_AT bits for CMD_STOP
    u64 events_read; // events the host has consumed
    // The queue's fence logs, [waits, signals]: each the device address of the log (page
    // aligned, below 2^48) | its entry count << 48, 0 for none. One word each, so the kernel
    // replacing a log (DxgkDdiSetNativeFenceLogBuffer) is one store the slot sees whole; it
    // is read at each logged operation.
    u64 fence_log[2];
    Mqd mqd;
};
DB_STATIC_ASSERT(sizeof(SlotCtl) == 24 + 16 + 160, "SlotCtl layout");
#define LOG_ADDR_MASK ((1ull << 48) - 1)

/// Slot → host.
struct SlotStatus {
    u64 ack;   // the last command seq handled
    u32 state; // SlotRun
    u32 pad;
    Regs regs;
    u64 packets;       // executed since the engine started (indirect-buffer contents too)
    u64 instructions;  // wave-instructions
    u64 lane_ops;
    u64 bytes;         // moved by COPY/FILL
    u64 events_written;
    u64 heartbeat;     // bumped by every step of the slot (a GPU that stopped is visible)
    u64 load;          // the CMD_LOAD whose queue `regs` describe, stored last (release): the
                       // host takes regs as its queue's only when this is its load
};
DB_STATIC_ASSERT(sizeof(SlotStatus) == 16 + 72 + 56, "SlotStatus layout");

/// One event (see EventKind).
struct Event {
    u64 seq;  // its 1-based position in the slot's event stream, stored last
    u64 load; // the seq of the CMD_LOAD whose queue it is about (the host drops strays)
    u32 kind;
    u32 a32;
    u64 a, b, c;
    Fault fault;
};
DB_STATIC_ASSERT(sizeof(Event) == 48 + 48, "Event layout");

/// An address space's entry in the directory: a seqlock (odd while the host rewrites it)
/// over the device address of its mapping table and its length.
struct VmDir {
    u64 seq;
    u64 table; // device address of count VmEntry, sorted by va
    u32 count;
    u32 pad;
};
DB_STATIC_ASSERT(sizeof(VmDir) == 24, "VmDir layout");

/// A registered native fence: the device address of its CurrentValue, and its id.
struct FenceSlot {
    u64 key; // 0: empty
    u64 id;
};

/// What every slot of the device reads.
struct Globals {
    u64 quit;        // the host sets it to end the persistent program
    u64 vm_dir;      // device address of vm_count VmDir
    u32 vm_count;
    u32 fence_mask;  // fence table capacity - 1 (a power of two)
    u64 fence_table; // device address of fence_mask + 1 FenceSlot (open addressing, linear probe)
    u64 fence_seq;   // seqlock over the fence table (odd while the host rewrites it)
    u64 slots;       // slot blocks in total
    u64 ctl;         // device address of `slots` SlotCtl
    u64 status;      // ... SlotStatus
    u64 events;      // ... SLOT_EVENTS Event each
    u64 priv;        // device address of the slots' private memory (see engine.cu)
    u64 priv_bytes;  // per slot
    u32 engine_kind[64]; // per slot: 1 compute, 0 otherwise
    u64 idle_after_ns;   // how long a caught-up queue stays reported busy (engine.cu)
};
