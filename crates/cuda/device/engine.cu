// engine.cu — doorbell's hardware queue slots and engines, as a program.
//
// On a GPU this is a persistent kernel: one warp per hardware queue slot (amdgpu's HQD), for
// every engine of the device, each looping in `slot_step` until the host says quit. On the CPU
// (the emulated backend) the host calls `slot_step` for each slot itself. Either way a slot
// does what the virtual engines of crates/gpu do in `firmware/exec.rs`, packet for packet and
// fault for fault:
//
//   1. it takes the host's commands (load a queue, stop it at an allowed point, abort it:
//      layout.cuh), which doorbell's firmware — the MES, on the CPU — issues;
//   2. while loaded, it polls the queue's wptr in the client's memory (spec 001: the write of
//      the doorbell/wptr is what makes the engine fetch), validates it exactly as the
//      firmware's `refresh_wptr` does, and fetches the published ring words in windows;
//   3. it decodes and executes each packet (abi::packet), writing rptr, the progress fence,
//      fence values and fence-log entries itself, and reports what the host must act on as
//      events: idle, busy, blocked, a user interrupt, a signal (the host makes the
//      MonitoredValue check), a fault, a stop.
//
// Nothing here trusts client memory: every address is translated through the queue's address
// space (the directory the host keeps, cached per slot), every packet is checked like
// abi::packet::Packet::decode, and every failure becomes the FaultRecord the CPU engine would
// produce, ending the slot's work on that queue only.
//
// Conventions (common.cuh): uniform code runs on every lane with the same values; a value
// read from memory another actor writes is read once by the leader lane and broadcast
// (`uniform_ld64`), so lanes never disagree about control flow; stores of uniform values are
// made by the leader only; lane-parallel work is inside LANES.

#include "common.cuh"
#include "layout.cuh"
#include "isa.cuh"

// ---------------------------------------------------------------------------------------
// Packets (abi::packet)
// ---------------------------------------------------------------------------------------

enum Opcode : u32 {
    OP_NOP = 0, OP_WRITE_DATA = 1, OP_COPY = 2, OP_FILL = 3, OP_TIMESTAMP = 4, OP_INDIRECT = 5,
    OP_SIGNAL = 6, OP_WAIT = 7, OP_PROGRESS_FENCE = 8, OP_INTERRUPT = 9, OP_DISPATCH = 10,
    OP_SYNTHETIC = 11,
};
#define PACKET_VERSION 1u
#define FLAG_NATIVE_FENCE 1u
#define FLAG_LOG 2u

/// A packet's fixed length in dwords (0: NOP, any length).
DB_FN u32 fixed_dwords(u32 op) {
    switch (op) {
    case OP_WRITE_DATA: case OP_FILL: return 6;
    case OP_COPY: return 7;
    case OP_TIMESTAMP: case OP_PROGRESS_FENCE: case OP_SYNTHETIC: return 3;
    case OP_INDIRECT: case OP_SIGNAL: case OP_WAIT: return 5;
    case OP_INTERRUPT: return 2;
    case OP_DISPATCH: return 11;
    default: return 0;
    }
}

/// Logged operations (abi::packet::LoggedOp).
enum LoggedOp : u32 { LOG_NONE = 0, LOG_SIGNAL = 1, LOG_SIGNAL_FENCE = 2, LOG_WAIT = 3 };

/// A decoded packet (abi::packet::Packet); unused fields are 0.
struct Packet {
    u32 op;
    u32 dwords;
    u32 logop;    // LoggedOp, for a logged SIGNAL/WAIT
    u32 fence;    // a SIGNAL with the native-fence flag
    u64 va;       // WRITE_DATA, TIMESTAMP, SIGNAL, WAIT, INDIRECT; COPY src
    u64 value;    // WRITE_DATA, SIGNAL, WAIT, PROGRESS_FENCE; SYNTHETIC ns; COPY/FILL bytes
    u64 dst;      // COPY, FILL
    u64 args;     // DISPATCH
    u32 width;    // WRITE_DATA: 4 or 8
    u32 u;        // FILL pattern, INTERRUPT id, log position, INDIRECT dwords
    u32 ib_vmid;  // INDIRECT vmid
    u32 grid[3];
    u32 group[3];
};

/// abi::packet::Header::check: the opcode, or false with the DecodeError.
DB_FN bool header_check(u32 h, u32* op_out, Fault* f) {
    u32 version = (h >> 24) & 0xf, op = (h >> 16) & 0xff, flags = h >> 28, len = h & 0xffff;
    if (version != PACKET_VERSION) return fault_decode(f, DE_BAD_VERSION, h, version, 0, 0);
    if (op > OP_SYNTHETIC) return fault_decode(f, DE_UNKNOWN_OPCODE, op, 0, 0, 0);
    u32 allowed = op == OP_SIGNAL ? (FLAG_NATIVE_FENCE | FLAG_LOG) : op == OP_WAIT ? FLAG_LOG : 0;
    if (flags & ~allowed) return fault_decode(f, DE_RESERVED_FLAGS, h, flags, 0, 0);
    if (len == 0) return fault_decode(f, DE_ZERO_LENGTH, 0, 0, op, 0);
    u32 extra = (flags & FLAG_LOG) ? 1 : 0;
    u32 n = fixed_dwords(op);
    if (n != 0 && n + extra != len) return fault_decode(f, DE_BAD_LENGTH, len, n + extra, op, 0);
    *op_out = op;
    return true;
}

/// abi::packet::Packet::decode_fixed: `w` holds the packet's words from its header on.
DB_FN bool decode_fixed(u32 h, u32 op, const u32* w, Packet* p, Fault* f) {
    u32 flags = h >> 28;
    p->op = op; p->dwords = h & 0xffff; p->logop = LOG_NONE; p->fence = 0;
    p->va = p->value = p->dst = p->args = 0; p->width = p->u = p->ib_vmid = 0;
#define U64_AT(i) ((u64)w[i] | ((u64)w[(i) + 1] << 32))
    switch (op) {
    case OP_NOP: break;
    case OP_WRITE_DATA:
        if (w[1] != 4 && w[1] != 8) return fault_decode(f, DE_BAD_FIELD, w[1], 0, op, S_WIDTH);
        p->width = w[1]; p->va = U64_AT(2); p->value = U64_AT(4);
        break;
    case OP_COPY: p->va = U64_AT(1); p->dst = U64_AT(3); p->value = U64_AT(5); break;
    case OP_FILL: p->dst = U64_AT(1); p->value = U64_AT(3); p->u = w[5]; break;
    case OP_TIMESTAMP: p->va = U64_AT(1); break;
    case OP_INDIRECT: p->va = U64_AT(1); p->u = w[3]; p->ib_vmid = w[4]; break;
    case OP_SIGNAL:
    case OP_WAIT:
        p->va = U64_AT(1); p->value = U64_AT(3);
        if (flags & FLAG_LOG) {
            p->logop = op == OP_WAIT ? LOG_WAIT : (flags & FLAG_NATIVE_FENCE) ? LOG_SIGNAL_FENCE : LOG_SIGNAL;
            p->u = w[5];
        } else if (op == OP_SIGNAL) {
            p->fence = (flags & FLAG_NATIVE_FENCE) ? 1 : 0;
        }
        break;
    case OP_PROGRESS_FENCE: p->value = U64_AT(1); break;
    case OP_INTERRUPT: p->u = w[1]; break;
    case OP_SYNTHETIC: p->value = U64_AT(1); break;
    case OP_DISPATCH:
        p->va = U64_AT(1);
        p->grid[0] = w[3]; p->grid[1] = w[4]; p->grid[2] = w[5];
        p->group[0] = w[6]; p->group[1] = w[7]; p->group[2] = w[8];
        p->args = U64_AT(9);
        break;
    }
#undef U64_AT
    return true;
}

// ---------------------------------------------------------------------------------------
// A slot
// ---------------------------------------------------------------------------------------

/// What a slot keeps between its steps, wave-uniform (each lane holds the same copy: on the
/// GPU in its own local memory, on the CPU in the emulator's heap).
struct SlotState {
    u64 seq_seen;     // the last command sequence acted on
    u64 load_seq;     // the sequence of the CMD_LOAD of the queue loaded (events carry it)
    u64 published_load; // the load whose status was last published with release
    u32 polls;        // polls that found nothing new since it caught up
    u32 run;          // SlotRun
    u32 stop;         // a pending STOP's allowed points (0: none)
    u32 stopping;     // a STOP is pending
    u32 restore;      // the DISPATCH at rptr resumes from the save area
    u32 live;         // a DISPATCH at rptr is live in `d` (and the registers)
    u32 vm_for;       // the vmid whose table is in the cache (+1; 0: none)
    u64 vm_seq;       // its directory seqlock value when cached
    u32 vm_count;     // entries
    u32 vm_remote;    // too large for the cache: searched where it lies
    u64 vm_table;     // ... at this device address
    u64 win_start;    // ring pointer of window[0]
    u32 win_len;      // dwords fetched
    u32 pad;
    u64 events_written;
    u64 events_room;  // events it may still write before it looks at the host's position again
    u32 caught_up;    // it consumed everything published and is polling wptr
    u32 completed_dirty; // `r.completed` moved since it was last stored for the clients
    u64 idle_since;   // when it caught up (global timer), for the idle report's delay
    u64 packets, instructions, lane_ops, bytes;
    u64 steps;
    u64 blocked_va, blocked_value;
    u32 blocked_vmid;
    u32 quit_poll;
    Mqd mqd;
    Regs r;
    IsaDispatch d;
};

/// Memory a slot's lanes share (GPU shared memory; on the CPU, the emulator's heap): the
/// fetch window and the cached page table, filled lane-parallel and then read by all.
struct SlotShared {
    u32 window[FETCH_DWORDS + MAX_FIXED_DWORDS];
    VmEntry vm[VM_CACHE_ENTRIES];
    u64 mqd[sizeof(Mqd) / 8]; // a CMD_LOAD's MQD, read by all lanes at once
};

/// Where a slot's memory is.
struct SlotCtx {
    const Globals* g;
    SlotCtl* ctl;
    SlotStatus* st;
    Event* events;    // SLOT_EVENTS
    SlotShared* sh;
    u64* prog;        // ISA_MAX_INSTRUCTIONS program words
    u32* vregs;       // ISA_VREGS * WAVE
    u32 compute;      // a compute engine's slot
    u64 idle_after;   // Globals.idle_after_ns
};

/// A 64-bit value another actor writes, read once (by the leader) and seen by every lane.
DB_FN u64 uniform_ld64(const u64* p) {
#if DB_GPU
    u64 v = 0;
    if (wave_leader()) v = ld_volatile64(p);
    return wave_bcast64(v, 0);
#else
    return ld_volatile64(p);
#endif
}

/// Two such values read together, both loads in flight at once (one PCIe round trip, and
/// nothing else: a system-scope acquire would add a fence to every look). A caller that finds
/// a value it acts on orders what it reads next with fence_acquire.
DB_FN void uniform_poll(const u64* p, const u64* q, u64* a, u64* b) {
#if DB_GPU
    u64 x = 0, y = 0;
    if (wave_leader()) {
        x = ld_volatile64(p);
        y = ld_volatile64(q);
    }
    *a = wave_bcast64(x, 0);
    *b = wave_bcast64(y, 0);
#else
    *a = ld_volatile64(p);
    *b = ld_volatile64(q);
#endif
}

/// A value another actor publishes with release, read once with acquire and seen by every
/// lane.
DB_FN u64 uniform_acquire64(const u64* p) {
#if DB_GPU
    u64 v = 0;
    if (wave_leader()) v = ld_acquire64(p);
    return wave_bcast64(v, 0);
#else
    return ld_acquire64(p);
#endif
}

/// An acquire fence after relaxed loads: later reads see what was published before them.
DB_FN void fence_acquire() {
#if DB_GPU
    asm volatile("fence.acq_rel.sys;" ::: "memory");
#else
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
#endif
}

/// The global timer as lane 0 read it, in every lane (lanes that read it themselves could
/// disagree by a tick and take different branches).
DB_FN u64 uniform_time_ns() { return wave_bcast64(global_time_ns(), 0); }

DB_FN u64 device_now(const SlotState* S) { return (u64)((i64)uniform_time_ns() + S->mqd.clock_offset); }

/// After lane-parallel writes of a packet (a COPY, a FILL, a kernel's stores): each lane's
/// writes are ordered before what any lane does next (the leader's release of the progress
/// fence, above all), at system scope.
DB_FN void publish_lanes() {
    fence_sys();
    wave_sync();
}

/// Publishes the slot's regs and counters (posted stores; the host reads them at its polls).
DB_FN void publish_status(SlotCtx* c, SlotState* S) {
    if (!wave_leader()) return;
    SlotStatus* st = c->st;
    u64* dst = (u64*)&st->regs;
    const u64* src = (const u64*)&S->r;
    for (u32 i = 0; i < sizeof(Regs) / 8; ++i) st_volatile64(dst + i, src[i]);
    st_volatile32(&st->state, S->run);
    st_volatile64(&st->packets, S->packets);
    st_volatile64(&st->instructions, S->instructions);
    st_volatile64(&st->lane_ops, S->lane_ops);
    st_volatile64(&st->bytes, S->bytes);
    st_volatile64(&st->heartbeat, S->steps);
    // Last, with release the first time after a load: the regs written above describe the
    // queue of this load (a host that sees the new load must not read the old queue's regs).
    // Later publications of the same load need no order (any mix of them describes the same
    // queue), and a system-scope release is a fence the slot would pay at every step.
    if (S->published_load != S->load_seq) {
        st_release64(&st->load, S->load_seq);
        S->published_load = S->load_seq;
    }
}

/// The client's rptr word: it may reuse ring bytes below it once it sees it. No release is
/// needed: every ring word below rptr was loaded and its value used before this store.
DB_FN void publish_rptr(SlotState* S) {
    if (wave_leader()) st_volatile64((u64*)S->mqd.rptr_word, S->r.rptr);
}

/// Appends an event (waits while the ring is full: the host drains it at every poll).
DB_SLOW void emit(SlotCtx* c, SlotState* S, u32 kind, u32 a32, u64 a, u64 b, u64 cc, const Fault* f) {
    u64 at = S->events_written;
    // The host's position is read only when the room known runs out (it drains at every
    // poll, so that is rare): an event costs no round trip of its own.
    while (S->events_room == 0) {
        u64 read = uniform_ld64(&c->ctl->events_read);
        S->events_room = SLOT_EVENTS - (at - read);
    }
    S->events_room--;
    if (wave_leader()) {
        Event* e = &c->events[at % SLOT_EVENTS];
        st_volatile64(&e->load, S->load_seq);
        st_volatile32(&e->kind, kind);
        st_volatile32(&e->a32, a32);
        st_volatile64(&e->a, a);
        st_volatile64(&e->b, b);
        st_volatile64(&e->c, cc);
        if (f) {
            const u64* s = (const u64*)f;
            u64* d = (u64*)&e->fault;
            for (u32 i = 0; i < sizeof(Fault) / 8; ++i) st_volatile64(d + i, s[i]);
        }
        // Release: the payload is visible to a host that acquires the sequence.
        st_release64(&e->seq, at + 1);
        st_volatile64(&c->st->events_written, at + 1);
    }
    S->events_written = at + 1;
}

/// Stores the progress value completed so far for the clients, if it moved: one release for
/// every PROGRESS_FENCE since the last (a release at system scope waits for the queue's
/// earlier writes to reach memory; paying it once per batch of command buffers instead of
/// once per command buffer is most of what tiny command buffers cost). Every way out of a
/// step, and every event, comes after it, so nothing waits on a value not yet stored.
DB_FN void flush_completed(SlotState* S) {
    if (!S->completed_dirty) return;
    S->completed_dirty = 0;
    // Release: the command buffers' writes happen before a waiter's acquire of the value.
    if (wave_leader()) st_release64((u64*)S->mqd.completed_word, S->r.completed);
}

/// Changes the slot's run state, with the event the host follows it by.
DB_FN void set_run(SlotCtx* c, SlotState* S, u32 run) {
    if (S->run == run) return;
    u32 was = S->run;
    S->run = run;
    flush_completed(S);
    publish_rptr(S);
    publish_status(c, S);
    if (run == RUN_IDLE) emit(c, S, EV_IDLE, 0, S->r.rptr, 0, 0, 0);
    else if (run == RUN_BUSY && (was == RUN_IDLE || was == RUN_BLOCKED)) emit(c, S, EV_BUSY, 0, S->r.rptr, 0, 0, 0);
    else if (run == RUN_BLOCKED) emit(c, S, EV_BLOCKED, S->blocked_vmid, S->blocked_va, S->blocked_value, 0, 0);
}

// ---- address spaces ----

/// The page table of address space `vmid`, current as of now: the slot's cached copy, checked
/// against the directory's seqlock (one read), refilled when the host changed it. A table
/// larger than the cache is searched where it lies. False if the vmid has no table.
DB_SLOW bool vm_of(SlotCtx* c, SlotState* S, u32 vmid, VmView* out) {
    const Globals* g = c->g;
    if (vmid >= g->vm_count) return false;
    const VmDir* dir = (const VmDir*)g->vm_dir + vmid;
    for (;;) {
        u64 seq = uniform_ld64(&dir->seq);
        if (seq & 1) continue; // the host is rewriting it
        fence_acquire();
        if (S->vm_for == vmid + 1 && S->vm_seq == seq) break;
        u64 table = uniform_ld64(&dir->table);
        u32 count = (u32)uniform_ld64((const u64*)&dir->count);
        if (table == 0) {
            S->vm_for = 0;
            return false;
        }
        if (count <= VM_CACHE_ENTRIES) {
            const VmEntry* src = (const VmEntry*)table;
            wave_sync(); // every lane is done translating through the old copy
            LANES(l) {
                for (u32 i = l; i < count; i += WAVE) {
                    c->sh->vm[i].va = ld_volatile64(&src[i].va);
                    c->sh->vm[i].bytes = ld_volatile64(&src[i].bytes);
                    c->sh->vm[i].dev = ld_volatile64(&src[i].dev);
                    c->sh->vm[i].flags = ld_volatile64(&src[i].flags);
                }
            }
            wave_sync();
            S->vm_remote = 0;
        } else {
            S->vm_remote = 1;
        }
        fence_acquire();
        if (uniform_ld64(&dir->seq) != seq) continue; // torn: the host changed it meanwhile
        S->vm_for = vmid + 1;
        S->vm_seq = seq;
        S->vm_table = table;
        S->vm_count = count;
        break;
    }
    out->e = S->vm_remote ? (const VmEntry*)S->vm_table : c->sh->vm;
    out->count = S->vm_count;
    out->vmid = vmid;
    return true;
}

/// Another address space's table (a privileged indirect buffer's), searched where it lies.
DB_SLOW bool vm_remote(SlotCtx* c, u32 vmid, VmView* out) {
    const Globals* g = c->g;
    if (vmid >= g->vm_count) return false;
    const VmDir* dir = (const VmDir*)g->vm_dir + vmid;
    u64 table = uniform_ld64(&dir->table);
    if (table == 0) return false;
    out->e = (const VmEntry*)table;
    out->count = (u32)uniform_ld64((const u64*)&dir->count);
    out->vmid = vmid;
    return true;
}

// ---- native fences ----

/// The id of the native fence whose CurrentValue is at device address `key` (0: none).
DB_SLOW u64 fence_id(SlotCtx* c, u64 key) {
    const Globals* g = c->g;
    for (;;) {
        u64 seq = uniform_ld64(&g->fence_seq);
        if (seq & 1) continue;
        fence_acquire();
        // (Read as the words the host stores: the table moves when it grows.)
        const FenceSlot* t = (const FenceSlot*)uniform_ld64(&g->fence_table);
        u64 id = 0;
        u32 mask = (u32)(uniform_ld64((const u64*)&g->vm_count) >> 32);
        u64 h = (key >> 3) * 0x9e3779b97f4a7c15ull;
        for (u32 i = 0; i <= mask; ++i) {
            const FenceSlot* s = &t[((u32)(h >> 40) + i) & mask];
            u64 k = uniform_ld64(&s->key);
            if (k == 0) break;
            if (k == key) { id = uniform_ld64(&s->id); break; }
        }
        fence_acquire();
        if (uniform_ld64(&g->fence_seq) == seq) return id;
    }
}

// ---- the ring ----

/// FwQueue::refresh_wptr with the wptr value `w` just read: validates it and takes it.
DB_FN bool take_wptr(SlotState* S, u64 w, Fault* f) {
    if (w == S->r.wptr) return true;
    if (w % 4 != 0) return fault_set(f, FK_WPTR_MISALIGNED, w, 0, 0);
    if (w < S->r.wptr) return fault_set(f, FK_WPTR_BACKWARDS, S->r.wptr, w, 0);
    if (w - S->r.rptr > S->mqd.ring_bytes) return fault_set(f, FK_WPTR_PAST_RING, S->r.rptr, w, S->mqd.ring_bytes);
    S->r.wptr = w;
    return true;
}

/// Fills the window from rptr: published words up to wptr and the ring's end, at most
/// FETCH_DWORDS, each lane fetching its share. With `refill` (a new wptr was just taken), the
/// leader reads, in the same round trip, the last-queued value that wptr covers (spec 000:
/// read after the wptr) and its address space's directory entry (a mapping the kernel made
/// before the client published that wptr must be in the page table the packets use): one
/// PCIe round trip for everything a new submission needs.
DB_SLOW void fetch_window(SlotCtx* c, SlotState* S, bool refill) {
    u64 ring_bytes = S->mqd.ring_bytes;
    u64 off = S->r.rptr & (ring_bytes - 1);
    u64 avail = S->r.wptr - S->r.rptr;
    if (avail > ring_bytes - off) avail = ring_bytes - off;
    u32 n = (u32)(avail / 4 < FETCH_DWORDS ? avail / 4 : FETCH_DWORDS);
    const u32* src = (const u32*)(S->mqd.ring + off);
    const VmDir* dir = (const VmDir*)c->g->vm_dir + S->mqd.vmid;
    wave_sync(); // every lane is done decoding from the old window
    u64 queued = 0, dseq = 0;
    if (refill && wave_leader()) {
        if (S->mqd.flags & MQD_LAST_QUEUED) queued = ld_volatile64((const u64*)S->mqd.last_queued_word);
        dseq = ld_volatile64(&dir->seq);
    }
    LANES(l) {
        // All of a lane's loads are issued before any is used: they are in flight together.
        u32 w[FETCH_DWORDS / WAVE];
#if DB_GPU
#pragma unroll
#endif
        for (u32 k = 0; k < FETCH_DWORDS / WAVE; ++k) {
            u32 i = l + k * WAVE;
            w[k] = i < n ? ld_volatile32(src + i) : 0;
        }
#if DB_GPU
#pragma unroll
#endif
        for (u32 k = 0; k < FETCH_DWORDS / WAVE; ++k) {
            u32 i = l + k * WAVE;
            if (i < n) c->sh->window[i] = w[k];
        }
    }
    wave_sync();
    S->win_start = S->r.rptr;
    S->win_len = n;
    if (refill) {
        if (S->mqd.flags & MQD_LAST_QUEUED) S->r.queued = wave_bcast64(queued, 0);
        dseq = wave_bcast64(dseq, 0);
        if (dseq != S->vm_seq || S->vm_for != S->mqd.vmid + 1) {
            VmView vm;
            vm_of(c, S, S->mqd.vmid, &vm); // the table changed: read it again (rare)
        }
    }
}

/// Where rptr is in the window, fetching if fewer than `need` words from it are there.
DB_FN u32 window_at(SlotCtx* c, SlotState* S, u32 need) {
    u64 at = (S->r.rptr - S->win_start) / 4;
    if (S->r.rptr >= S->win_start && at + need <= S->win_len) return (u32)at;
    fetch_window(c, S, false);
    return 0;
}

/// FetchWindow::fetch: the packet at rptr (below wptr). `op_known` is set once the header
/// checked (a fault then names the opcode).
DB_FN bool fetch_ring(SlotCtx* c, SlotState* S, Packet* p, u32* op_known, Fault* f) {
    u32 at = window_at(c, S, 1);
    u32 h = c->sh->window[at];
    u32 op;
    if (!header_check(h, &op, f)) return false;
    *op_known = op + 1;
    u64 ring_bytes = S->mqd.ring_bytes;
    u64 off = S->r.rptr & (ring_bytes - 1);
    u32 n = h & 0xffff;
    u64 bytes = (u64)n * 4;
    if (off + bytes > ring_bytes) return fault_set(f, FK_PAST_RING_END, off, n, ring_bytes);
    u64 end = S->r.rptr + bytes;
    if (end < S->r.rptr || end > S->r.wptr) return fault_set(f, FK_PAST_WPTR, S->r.rptr, n, S->r.wptr);
    if (op == OP_NOP) {
        decode_fixed(h, op, &c->sh->window[at], p, f);
        return true;
    }
    if (at + n > S->win_len) at = window_at(c, S, n);
    return decode_fixed(h, op, &c->sh->window[at], p, f);
}

/// fetch_indirect: the next packet of the indirect buffer (S->r.ib_*), in address space `vm`.
DB_FN bool fetch_ib(SlotState* S, const VmView* vm, Packet* p, Fault* f) {
    u64 va = S->r.ib_va + (u64)S->r.ib_pos * 4;
    const u8* hp = vm_translate(vm, va, 4, ACCESS_READ, f);
    if (!hp) return false;
    u32 hv;
#if DB_GPU
    u32 x = 0;
    if (wave_leader()) x = rd32(hp);
    hv = __shfl_sync(ALL_LANES, x, 0);
#else
    hv = rd32(hp);
#endif
    u32 op;
    if (!header_check(hv, &op, f)) return false;
    u32 n = hv & 0xffff;
    u32 have = S->r.ib_dwords - S->r.ib_pos;
    if (n > have) return fault_decode(f, DE_TRUNCATED, n, have, 0, 0);
    const u8* body = vm_translate(vm, va, (u64)n * 4, ACCESS_READ, f);
    if (!body) return false;
    u32 w[MAX_FIXED_DWORDS];
    w[0] = hv;
    u32 m = n < MAX_FIXED_DWORDS ? n : MAX_FIXED_DWORDS;
    if (op == OP_NOP) m = 1;
#if DB_GPU
    // Lane i reads word i: the body in one round trip, then every lane has every word.
    u32 mine = (lane_id() >= 1 && lane_id() < m) ? rd32(body + 4 * lane_id()) : 0;
    for (u32 i = 1; i < MAX_FIXED_DWORDS; ++i) w[i] = __shfl_sync(ALL_LANES, mine, i);
    for (u32 i = m; i < MAX_FIXED_DWORDS; ++i) w[i] = 0;
#else
    for (u32 i = 1; i < m; ++i) w[i] = rd32(body + 4 * i);
    for (u32 i = m; i < MAX_FIXED_DWORDS; ++i) w[i] = 0;
#endif
    return decode_fixed(hv, op, w, p, f);
}

// ---------------------------------------------------------------------------------------
// Execution
// ---------------------------------------------------------------------------------------

/// How a packet ended (firmware/exec.rs's Flow).
enum Flow : u32 { FLOW_NEXT = 0, FLOW_BLOCKED = 1, FLOW_YIELD = 2, FLOW_STOPPED = 3, FLOW_FAULT = 4 };

/// Bytes a COPY/FILL moves between two looks at the host's commands.
#define BULK_CHUNK (64u * 1024u)
/// Wave-instructions a DISPATCH runs between two looks at the host's commands (a look is a
/// PCIe round trip on the GPU, where interpreting is slower than on the CPU: a preemption
/// request waits for at most one slice).
#if DB_GPU
#define DISPATCH_SLICE 16u
#else
#define DISPATCH_SLICE 512u
#endif
/// Nanoseconds a SYNTHETIC spins between two looks.
#define SYNTHETIC_SLICE_NS 2000u
/// Slices (of a dispatch, a bulk packet, a synthetic one) a long packet runs before it
/// yields its step: the slot publishes its status, and on the CPU the host gets its thread
/// back (it cannot send a command while the emulated slot runs). On the GPU a step checks
/// for commands between slices anyway, so it yields rarely.
#if DB_GPU
#define YIELD_SLICES 64u
#else
#define YIELD_SLICES 1u
#endif

/// Whether a STOP is pending that allows `sp` (a look at the host's command word first, so a
/// long packet hears it).
DB_SLOW bool stop_wanted(SlotCtx* c, SlotState* S, u32 sp);

/// Copies `n` bytes from `s` to `d` where the ranges may overlap (memmove), lane-parallel.
/// Each pass moves at most the distance between them, in the direction that reads every
/// source byte before it is overwritten.
DB_SLOW void move_bytes(u8* d, const u8* s, u64 n) {
    if (n == 0 || d == s) return;
    u64 dist = d > s ? (u64)(d - s) : (u64)(s - d);
    bool backward = d > s && d < s + n;
    u64 piece = WAVE * 16;
    if (dist < piece && dist < n) piece = dist;
    for (u64 done = 0; done < n;) {
        u64 k = n - done < piece ? n - done : piece;
        u64 at = backward ? n - done - k : done;
        // Read the piece, then write it: no lane writes a byte another lane still has to read.
        u8 buf[16];
        u32 per = (u32)((k + WAVE - 1) / WAVE);
        LANES(l) {
            for (u32 j = 0; j < per && j < 16; ++j) {
                u64 i = (u64)l * per + j;
                if (i < k) buf[j] = *(const volatile u8*)(s + at + i);
            }
        }
        wave_sync();
#if !DB_GPU
        // (On the CPU the lanes ran one after another: redo the piece through a buffer.)
        u8 tmp[WAVE * 16];
        for (u64 i = 0; i < k; ++i) tmp[i] = *(const volatile u8*)(s + at + i);
        for (u64 i = 0; i < k; ++i) *(volatile u8*)(d + at + i) = tmp[i];
        (void)buf;
#else
        LANES(l) {
            for (u32 j = 0; j < per && j < 16; ++j) {
                u64 i = (u64)l * per + j;
                if (i < k) st_volatile8(d + at + i, buf[j]);
            }
        }
        publish_lanes();
#endif
        done += k;
    }
}

/// Fills `n` bytes at `d` with `pattern`, byte i of the fill taking pattern byte (i % 4)
/// (the phase counts from `phase`, the fill's offset so far).
DB_FN void fill_bytes(u8* d, u64 n, u32 pattern, u64 phase) {
    LANES(l) {
        for (u64 i = l; i < n; i += WAVE) {
            u32 k = (u32)((phase + i) & 3);
            st_volatile8(d + i, (u8)(pattern >> (8 * k)));
        }
    }
    publish_lanes();
}

/// After slice `slices` of long work (a COPY, FILL or SYNTHETIC), `done` of `total`
/// finished: whether it pauses here, for a STOP that allows a chunk boundary or at the end of
/// its turn, with its progress saved in regs.bulk_done (firmware/exec.rs, the same order).
DB_FN u32 bulk_pause(SlotCtx* c, SlotState* S, u64 done, u64 total, u32 slices) {
    if (done >= total) return FLOW_NEXT;
    u32 flow = stop_wanted(c, S, SP_CHUNK) ? FLOW_STOPPED : slices % YIELD_SLICES == 0 ? FLOW_YIELD : FLOW_NEXT;
    if (flow != FLOW_NEXT) {
        S->r.flags |= REG_BULK;
        S->r.bulk_done = done;
    }
    return flow;
}

/// firmware/exec.rs `bulk`: a COPY (src set) or FILL of `total` bytes from where an earlier
/// run left it (regs.bulk_done), in chunks, stopping at a chunk boundary for a STOP that
/// allows it.
DB_SLOW u32 bulk(SlotCtx* c, SlotState* S, u8* dst, const u8* src, u64 total, bool backward, u32 pattern) {
    u64 done = (S->r.flags & REG_BULK) ? S->r.bulk_done : 0;
    if (done > total) done = total;
    S->r.flags &= ~REG_BULK;
    for (u32 slices = 1; done < total; ++slices) {
        u64 n = total - done < BULK_CHUNK ? total - done : BULK_CHUNK;
        u64 at = backward ? total - done - n : done;
        if (src) move_bytes(dst + at, src + at, n);
        else fill_bytes(dst + at, n, pattern, at);
        S->bytes += n;
        done += n;
        u32 flow = bulk_pause(c, S, done, total, slices);
        if (flow != FLOW_NEXT) return flow;
    }
    return FLOW_NEXT;
}

/// firmware/exec.rs `synthetic`: occupies the engine for `total` ns of device time (its
/// progress in bulk_done), stopping at a chunk boundary for a STOP that allows it.
DB_SLOW u32 synthetic(SlotCtx* c, SlotState* S, u64 total) {
    u64 done = (S->r.flags & REG_BULK) ? S->r.bulk_done : 0;
    if (done > total) done = total;
    S->r.flags &= ~REG_BULK;
    for (u32 slices = 1; done < total; ++slices) {
        u64 n = total - done < SYNTHETIC_SLICE_NS ? total - done : SYNTHETIC_SLICE_NS;
        u64 until = uniform_time_ns() + n;
        while (uniform_time_ns() < until) {
        }
        done += n;
        u32 flow = bulk_pause(c, S, done, total, slices);
        if (flow != FLOW_NEXT) return flow;
    }
    return FLOW_NEXT;
}

/// abi::fence_log::locate for the log word `log` (address | entries << 48): the entry index
/// and the header after the write, or a fault.
DB_FN bool log_locate(SlotCtx* c, u64 log, u32 position, u32* entry, u64* header, Fault* f) {
    u32 entries = (u32)(log >> 48);
    u8* base = (u8*)(log & LOG_ADDR_MASK);
    if (entries == 0) {
        fault_why(f, FK_BAD_FIELD, S_LOG_ENTRY);
        f->s2 = S_LOG_HOLDS_NO_ENTRY;
        return false;
    }
    u64 h = uniform_ld64((const u64*)base);
    u64 total = (h >> 32) * (u64)entries + (u32)h;
    u32 ahead = position - (u32)total;
    if (ahead >= entries) return fault_set(f, FK_BAD_LOG_POSITION, position, (u32)total, entries);
    u64 at = total + ahead;
    *entry = (u32)(at % entries);
    u64 next = at + 1;
    *header = (next % entries) | ((next / entries) << 32);
    (void)c;
    return true;
}

/// abi::fence_log::append_to: the entry's words, then the header (release).
DB_FN void log_append(u64 log, u32 entry, u64 header, u64 value, u64 handle, u32 op, u64 observed, u64 end) {
    if (!wave_leader()) return;
    u8* base = (u8*)(log & LOG_ADDR_MASK);
    u64* e = (u64*)(base + 40 + (u64)entry * 48);
    st_volatile64(e + 0, value);
    st_volatile64(e + 1, handle);
    st_volatile64(e + 2, op);
    st_volatile64(e + 3, observed);
    st_volatile64(e + 4, end);
    st_volatile64(e + 5, 0);
    st_release64((u64*)base, header);
}

/// exec_logged: a SIGNAL or WAIT with a fence-log entry, in spec 002's order.
DB_SLOW u32 exec_logged(SlotCtx* c, SlotState* S, const VmView* vm, const Packet* p, Fault* f) {
    u32 li = p->logop == LOG_WAIT ? 0 : 1;
    u64 l0 = uniform_ld64(&c->ctl->fence_log[0]), l1 = uniform_ld64(&c->ctl->fence_log[1]);
    if (l0 == 0 && l1 == 0) {
        fault_why(f, FK_BAD_FIELD, S_LOG_ENTRY);
        f->s2 = S_NO_FENCE_LOG;
        return FLOW_FAULT;
    }
    u64 log = li ? l1 : l0;
    u32 entry;
    u64 header;
    if (!log_locate(c, log, p->u, &entry, &header, f)) return FLOW_FAULT;
    Fault ignore;
    const u8* fr = vm_translate_aligned(vm, p->va, 8, ACCESS_READ, &ignore);
    u64 handle = fr ? fence_id(c, (u64)fr) : 0;
    if (p->logop == LOG_WAIT) {
        u8* r = vm_translate_aligned(vm, p->va, 8, ACCESS_READ, f);
        if (!r) return FLOW_FAULT;
        u64 now = device_now(S);
        if (!(S->r.flags & REG_WAIT_OBSERVED)) {
            S->r.flags |= REG_WAIT_OBSERVED;
            S->r.wait_observed = now;
        }
        u64 v = uniform_ld64((const u64*)r);
        fence_acquire();
        if (v < p->value) {
            S->blocked_va = p->va;
            S->blocked_value = p->value;
            return FLOW_BLOCKED;
        }
        u64 observed = S->r.wait_observed;
        S->r.flags &= ~REG_WAIT_OBSERVED;
        S->r.wait_observed = 0;
        log_append(log, entry, header, p->value, handle, 1 /*WaitUnblocked*/, observed, now);
        fence_sys();
        return FLOW_NEXT;
    }
    u8* w = vm_translate_aligned(vm, p->va, 8, ACCESS_WRITE, f);
    if (!w) return FLOW_FAULT;
    u64 now = device_now(S);
    if (p->logop == LOG_SIGNAL_FENCE && handle == 0) {
        fault_set(f, FK_NOT_A_FENCE, p->va, 0, 0);
        return FLOW_FAULT;
    }
    // 1. the value (release); 2. the entry; 3. the index; 4. the barrier; 5. the host's check.
    if (wave_leader()) st_release64((u64*)w, p->value);
    log_append(log, entry, header, p->value, handle, 0 /*SignalExecuted*/, now, now);
    flush_completed(S);
    fence_sys();
    emit(c, S, EV_SIGNALED, vm->vmid, p->va, p->value, (u64)w, 0);
    return FLOW_NEXT;
}

/// exec_dispatch: (a slice of) a DISPATCH.
DB_SLOW u32 exec_dispatch(SlotCtx* c, SlotState* S, const VmView* vm, const Packet* p, u32* stopped, Fault* f) {
    if (!c->compute) {
        fault_why(f, FK_BAD_DISPATCH, S_ONLY_COMPUTE);
        return FLOW_FAULT;
    }
    if (!S->live) {
        bool ok = S->restore
            ? isa_restore(&S->d, vm, c->prog, c->vregs, (const u8*)S->mqd.save_area, S->mqd.save_bytes, f)
            : isa_start(&S->d, vm, c->prog, p->va, p->grid, p->group, p->args, f);
        S->restore = 0;
        if (!ok) return FLOW_FAULT;
        S->live = 1;
        S->r.flags |= REG_DISPATCH;
    }
    IsaMem m;
    m.vm = *vm;
    m.prog = c->prog;
    m.v = c->vregs;
    for (u32 slices = 1;; ++slices) {
        wave_sync();
        // Asked to stop: at the finest boundary inside a dispatch the engine allows (an
        // instruction boundary is taken between slices, by the caller's stop check).
        u32 inside = 0;
        if (S->stopping) {
            if (S->stop & STOP_AT(SP_INSTRUCTION)) {
                *stopped = SP_INSTRUCTION;
                return FLOW_STOPPED;
            }
            inside = (S->stop & STOP_AT(SP_WAVE)) ? (u32)SP_WAVE : (S->stop & STOP_AT(SP_GROUP)) ? (u32)SP_GROUP : 0u;
        }
        IsaStats st;
        st.instructions = 0;
        st.lane_ops = 0;
        u32 at = 0;
        u32 r = isa_run(&S->d, &m, DISPATCH_SLICE, inside, &at, &st, f);
        S->instructions += st.instructions;
        S->lane_ops += st.lane_ops;
        if (r == ISA_FAULT) {
            publish_lanes();
            S->live = 0;
            return FLOW_FAULT;
        }
        if (r == ISA_DONE) {
            publish_lanes(); // the kernel's stores, before the progress fence that follows
            S->live = 0;
            S->r.flags &= ~REG_DISPATCH;
            return FLOW_NEXT;
        }
        if (r == ISA_STOPPED) {
            *stopped = at;
            return FLOW_STOPPED;
        }
        // A slice ran out: look for a command (an abort ends it here; a STOP that allows an
        // instruction boundary takes it now; one that allows only wave or group boundaries
        // is honoured by the next slices).
        bool wanted = stop_wanted(c, S, SP_INSTRUCTION);
        if (S->run == RUN_EMPTY) return FLOW_YIELD;
        if (wanted) {
            *stopped = SP_INSTRUCTION;
            return FLOW_STOPPED;
        }
        // Its state stays live in the slot; the packet is taken up again at the next step.
        if (slices % YIELD_SLICES == 0) return FLOW_YIELD;
    }
}

/// exec_packet: executes one packet in address space `vm`.
DB_SLOW u32 exec_packet(SlotCtx* c, SlotState* S, const VmView* vm, const Packet* p, bool in_ib, u32* stopped, Fault* f) {
    switch (p->op) {
    case OP_NOP: return FLOW_NEXT;
    case OP_WRITE_DATA: {
        u8* w = vm_translate_aligned(vm, p->va, p->width, ACCESS_WRITE, f);
        if (!w) return FLOW_FAULT;
        if (wave_leader()) {
            if (p->width == 4) wr32(w, (u32)p->value);
            else wr64(w, p->value);
        }
        return FLOW_NEXT;
    }
    case OP_COPY: {
        const u8* s = vm_translate(vm, p->va, p->value, ACCESS_READ, f);
        if (!s) return FLOW_FAULT;
        u8* d = vm_translate(vm, p->dst, p->value, ACCESS_WRITE, f);
        if (!d) return FLOW_FAULT;
        bool backward = d > s && d < s + p->value;
        u32 flow = bulk(c, S, d, s, p->value, backward, 0);
        if (flow == FLOW_STOPPED) *stopped = SP_CHUNK;
        return flow;
    }
    case OP_FILL: {
        u8* d = vm_translate(vm, p->dst, p->value, ACCESS_WRITE, f);
        if (!d) return FLOW_FAULT;
        u32 flow = bulk(c, S, d, 0, p->value, false, p->u);
        if (flow == FLOW_STOPPED) *stopped = SP_CHUNK;
        return flow;
    }
    case OP_TIMESTAMP: {
        u8* w = vm_translate_aligned(vm, p->va, 8, ACCESS_WRITE, f);
        if (!w) return FLOW_FAULT;
        u64 now = device_now(S);
        if (wave_leader()) wr64(w, now);
        return FLOW_NEXT;
    }
    case OP_INDIRECT: {
        if (in_ib) {
            fault_why(f, FK_BAD_INDIRECT, S_NESTED_INDIRECT);
            return FLOW_FAULT;
        }
        bool privileged = (S->mqd.flags & MQD_PRIVILEGED) != 0;
        if (p->ib_vmid != 0 && !privileged) {
            fault_why(f, FK_BAD_INDIRECT, S_USER_VMID);
            return FLOW_FAULT;
        }
        if (p->ib_vmid == 0 && !vm_translate(vm, p->va, (u64)p->u * 4, ACCESS_READ, f)) return FLOW_FAULT;
        S->r.flags |= REG_IB;
        if (p->ib_vmid != 0) S->r.flags |= REG_IB_VMID;
        else S->r.flags &= ~REG_IB_VMID;
        S->r.ib_va = p->va;
        S->r.ib_dwords = p->u;
        S->r.ib_pos = 0;
        S->r.ib_vmid = p->ib_vmid;
        return FLOW_NEXT;
    }
    case OP_SIGNAL:
    case OP_WAIT:
        if (p->logop != LOG_NONE) return exec_logged(c, S, vm, p, f);
        if (p->op == OP_WAIT) {
            const u8* r = vm_translate_aligned(vm, p->va, 8, ACCESS_READ, f);
            if (!r) return FLOW_FAULT;
            u64 v = uniform_ld64((const u64*)r);
            fence_acquire(); // pairs with the signaller's release
            if (v < p->value) {
                S->blocked_va = p->va;
                S->blocked_value = p->value;
                return FLOW_BLOCKED;
            }
            return FLOW_NEXT;
        } else {
            u8* w = vm_translate_aligned(vm, p->va, 8, ACCESS_WRITE, f);
            if (!w) return FLOW_FAULT;
            if (p->fence && fence_id(c, (u64)w) == 0) {
                fault_set(f, FK_NOT_A_FENCE, p->va, 0, 0);
                return FLOW_FAULT;
            }
            // Release: the queue's writes before the signal are visible to whoever acquires
            // the value; then the barrier, and the host's MonitoredValue check (EV_SIGNALED).
            if (wave_leader()) st_release64((u64*)w, p->value);
            flush_completed(S);
            fence_sys();
            emit(c, S, EV_SIGNALED, vm->vmid, p->va, p->value, (u64)w, 0);
            return FLOW_NEXT;
        }
    case OP_PROGRESS_FENCE: {
        if (p->value < S->r.completed) {
            fault_set(f, FK_PROGRESS_BACKWARDS, S->r.completed, p->value, 0);
            return FLOW_FAULT;
        }
        if ((S->mqd.flags & MQD_LAST_QUEUED) && p->value > S->r.queued) {
            fault_set(f, FK_PROGRESS_BEYOND_QUEUED, p->value, S->r.queued, 0);
            return FLOW_FAULT;
        }
        // Stored (with one release for the batch) when the step ends or anything is reported:
        // flush_completed.
        S->r.completed = p->value;
        S->completed_dirty = 1;
        return FLOW_NEXT;
    }
    case OP_INTERRUPT:
        flush_completed(S);
        emit(c, S, EV_USER, p->u, 0, 0, 0, 0);
        return FLOW_NEXT;
    case OP_SYNTHETIC: {
        u32 flow = synthetic(c, S, p->value);
        if (flow == FLOW_STOPPED) *stopped = SP_CHUNK;
        return flow;
    }
    case OP_DISPATCH:
        return exec_dispatch(c, S, vm, p, stopped, f);
    }
    return FLOW_NEXT;
}

// ---------------------------------------------------------------------------------------
// Commands, stops, faults
// ---------------------------------------------------------------------------------------

DB_FN void ack(SlotCtx* c, SlotState* S) {
    if (wave_leader()) st_release64(&c->st->ack, S->seq_seen);
}

/// The queue is off the slot: what it completed and where it stands are published, the slot
/// is empty, and all of it is visible before the event that says so (which the caller emits).
DB_SLOW void vacate(SlotCtx* c, SlotState* S) {
    S->live = 0;
    S->restore = 0;
    S->stopping = 0;
    S->caught_up = 0;
    flush_completed(S);
    publish_rptr(S);
    S->run = RUN_EMPTY;
    publish_status(c, S);
    fence_sys();
}

/// The queue leaves the slot, stopped at `sp` (its state saved) or aborted.
DB_SLOW void leave(SlotCtx* c, SlotState* S, u32 sp) {
    Fault f;
    fault_clear(&f);
    if (sp != STOPPED_ABORTED && S->live) {
        // Its dispatch's state goes to the context save area (it resumes, never restarts).
        if (!isa_save(&S->d, c->vregs, (u8*)S->mqd.save_area, S->mqd.save_bytes, &f)) {
            // The save area is checked at queue creation; should it fail, the state is lost
            // (the host hangs the queue on the fault it reads here).
            S->r.flags &= ~REG_DISPATCH;
        }
    }
    S->stop = 0;
    vacate(c, S);
    emit(c, S, EV_STOPPED, sp, S->r.rptr, 0, 0, f.kind ? &f : 0);
    ack(c, S);
}

/// The queue faulted: it leaves the slot, and the host hangs it.
DB_SLOW void faulted(SlotCtx* c, SlotState* S, Fault* f, u32 op_known, bool in_ib) {
    vacate(c, S);
    emit(c, S, EV_FAULT, op_known, S->r.rptr, in_ib ? 1 : 0, 0, f);
    ack(c, S);
}

/// Takes a new command, if the host wrote one (`seq`, read by the caller).
DB_SLOW void command(SlotCtx* c, SlotState* S, u64 seq) {
    fence_acquire();
    S->seq_seen = seq;
    // cmd and stop share one 8-byte word: one read.
    u64 word = uniform_ld64((const u64*)&c->ctl->cmd);
    u32 cmd = (u32)word, stop = (u32)(word >> 32);
    if (cmd == CMD_LOAD) {
        // Each lane reads one word of the MQD: one PCIe round trip for all twenty.
        const u64* src = (const u64*)&c->ctl->mqd;
        const u32 words = sizeof(Mqd) / 8;
        wave_sync();
        LANES(l) {
            if (l < words) c->sh->mqd[l] = ld_volatile64(src + l);
        }
        wave_sync();
        u64* dst = (u64*)&S->mqd;
        for (u32 i = 0; i < words; ++i) dst[i] = c->sh->mqd[i];
        S->r = S->mqd.regs;
        S->load_seq = seq;
        S->live = 0;
        S->restore = (S->r.flags & REG_DISPATCH) ? 1 : 0;
        S->stopping = 0;
        S->stop = 0;
        S->win_len = 0;
        S->caught_up = 0;
        S->completed_dirty = 0;
        S->idle_since = 0;
        S->run = RUN_BUSY;
        // Its address space's table, as of now (checked again at every new wptr).
        VmView vm;
        vm_of(c, S, S->mqd.vmid, &vm);
        publish_status(c, S);
        ack(c, S);
    } else if (cmd == CMD_STOP) {
        // Acked at once (so an ABORT may follow it); answered by EV_STOPPED when the queue
        // leaves, or at once if there is none.
        if (S->run == RUN_EMPTY) {
            emit(c, S, EV_STOPPED, STOPPED_ABORTED, 0, 0, 0, 0);
            ack(c, S);
            return;
        }
        S->stopping = 1;
        S->stop = stop;
        ack(c, S);
    } else if (cmd == CMD_ABORT) {
        if (S->run == RUN_EMPTY) {
            emit(c, S, EV_STOPPED, STOPPED_ABORTED, 0, 0, 0, 0);
            ack(c, S);
            return;
        }
        leave(c, S, STOPPED_ABORTED);
    } else {
        ack(c, S);
    }
}

DB_SLOW bool stop_wanted(SlotCtx* c, SlotState* S, u32 sp) {
    u64 seq = uniform_ld64(&c->ctl->seq);
    if (seq != S->seq_seen) command(c, S, seq);
    if (S->run == RUN_EMPTY) return true; // aborted: stop whatever it was doing
    return S->stopping && (S->stop & STOP_AT(sp));
}

/// firmware/exec.rs `stop_point`: where the queue stands between packets, if the pending
/// STOP allows stopping there.
DB_FN bool stop_here(const SlotState* S, u32* sp) {
    u32 point = S->live ? SP_INSTRUCTION
        : (S->r.flags & REG_BULK) ? SP_CHUNK
        : (!(S->r.flags & REG_IB) && (S->r.flags & REG_CB_BOUNDARY)) ? SP_COMMAND_BUFFER
        : SP_PACKET;
    *sp = point;
    return (S->stop & STOP_AT(point)) != 0;
}

// ---------------------------------------------------------------------------------------
// The step
// ---------------------------------------------------------------------------------------

/// Packets a step executes before it looks at the host's commands again.
#define STEP_PACKETS 256u
/// Busy steps between two publications of the slot's status (a power of two; each costs a
/// system-scope release on the GPU; the emulator, which has no such cost, publishes each).
#if DB_GPU
#define STATUS_EVERY 16u
#else
#define STATUS_EVERY 1u
#endif

/// Whether a queue that consumed everything has been caught up long enough to be reported
/// idle (EV_IDLE): a client submitting back to back catches the slot in between, and an idle
/// report and a busy one per command buffer would cost more than the work. The host sets
/// the delay (Globals.idle_after_ns): 0 for the deterministic emulator, which reports at
/// once.
DB_FN bool idle_long_enough(const SlotCtx* c, const SlotState* S) {
    return c->idle_after == 0 || uniform_time_ns() - S->idle_since >= c->idle_after;
}

/// The fast path of a step: the packets tiny command buffers are made of (`NOP`,
/// `WRITE_DATA`, `PROGRESS_FENCE`), executed straight from the fetch window with the queue's
/// pointers in registers. Everything it does is exactly what exec_packet does for them; it
/// stops, executing nothing of it, at the first packet that is anything else, is not wholly
/// in the window, or would fault, and the general path takes that packet (and reports the
/// fault exactly as the CPU engine does). On the GPU a step's state lives in local memory,
/// where every field touched costs a dependent load: this loop touches none.
/// Returns the packets executed.
DB_FN u32 fast_packets(SlotCtx* c, SlotState* S, const VmView* vm, u32 budget) {
    // The lanes run this loop together (a leader-only store before may have left them apart:
    // apart, each lane would run every packet in turn, 32 times the work).
    wave_sync();
    u64 rptr = S->r.rptr;
    const u64 wptr = S->r.wptr, wstart = S->win_start, ring_bytes = S->mqd.ring_bytes;
    const u32 wlen = S->win_len;
    u64 completed = S->r.completed;
    const u64 queued = S->r.queued;
    const bool bound = (S->mqd.flags & MQD_LAST_QUEUED) != 0;
    bool cb = (S->r.flags & REG_CB_BOUNDARY) != 0, dirty = false;
    const u32* win = c->sh->window;
    // The mapping the last WRITE_DATA hit: the next usually hits it too (no search).
    u64 hit_va = 1, hit_end = 0, hit_dev = 0;
    u32 n = 0;
    while (n < budget && rptr != wptr && rptr >= wstart) {
        u64 at = (rptr - wstart) / 4;
        if (at >= wlen) break;
        u32 h = win[at];
        if ((h >> 24) != PACKET_VERSION) break; // another version, or flags: the general path
        u32 op = (h >> 16) & 0xff, len = h & 0xffff;
        u64 bytes = (u64)len * 4;
        if (len == 0 || (rptr & (ring_bytes - 1)) + bytes > ring_bytes || rptr + bytes > wptr) break;
        if (op == OP_NOP) {
        } else if (op == OP_WRITE_DATA && len == 6 && at + 6 <= wlen) {
            u32 width = win[at + 1];
            u64 va = (u64)win[at + 2] | (u64)win[at + 3] << 32;
            u64 value = (u64)win[at + 4] | (u64)win[at + 5] << 32;
            if (width != 4 && width != 8) break;
            u8* w;
            if (va % width == 0 && va >= hit_va && va + width <= hit_end && va + width > va) {
                w = (u8*)(hit_dev + (va - hit_va));
            } else {
                Fault ignore;
                w = vm_translate_aligned(vm, va, width, ACCESS_WRITE, &ignore);
                if (!w) break;
                // Remember the (writable) mapping it lies in.
                u32 lo = 0, hi = vm->count;
                while (lo < hi) {
                    u32 mid = lo + (hi - lo) / 2;
                    if (vm->e[mid].va <= va) lo = mid + 1; else hi = mid;
                }
                const VmEntry* m = &vm->e[lo - 1];
                hit_va = m->va;
                hit_end = m->va + m->bytes;
                hit_dev = m->dev;
            }
            if (wave_leader()) {
                if (width == 4) wr32(w, (u32)value);
                else wr64(w, value);
            }
        } else if (op == OP_PROGRESS_FENCE && len == 3 && at + 3 <= wlen) {
            u64 value = (u64)win[at + 1] | (u64)win[at + 2] << 32;
            if (value < completed || (bound && value > queued)) break;
            completed = value;
            dirty = true;
        } else {
            break;
        }
        cb = op == OP_PROGRESS_FENCE;
        rptr += bytes;
        ++n;
    }
    if (n) {
        S->r.rptr = rptr;
        S->r.completed = completed;
        S->completed_dirty |= dirty;
        if (cb) S->r.flags |= REG_CB_BOUNDARY;
        else S->r.flags &= ~REG_CB_BOUNDARY;
        S->packets += n;
        // The batch's progress is stored for the clients now, before the slot looks for
        // more (a round trip): one release per batch.
        flush_completed(S);
    }
    return n;
}

/// The queue's address space as the slot last read it (`vm_of` keeps it current: at each
/// load and each new wptr).
DB_FN bool vm_cached(SlotCtx* c, SlotState* S, VmView* out) {
    if (S->vm_for != S->mqd.vmid + 1) return vm_of(c, S, S->mqd.vmid, out);
    out->e = S->vm_remote ? (const VmEntry*)S->vm_table : c->sh->vm;
    out->count = S->vm_count;
    out->vmid = S->mqd.vmid;
    return true;
}

/// One step of a slot: takes the host's command, if any; then, with a queue loaded, runs it
/// (firmware/exec.rs `run_queue`) for up to STEP_PACKETS packets or one slice of a long one.
DB_SLOW void slot_step(SlotCtx* c, SlotState* S) {
    wave_sync(); // the lanes converged: the step's uniform code runs once for all of them
    S->steps++;
    u64 seq, w = 0;
    bool polled = false;
    if (S->caught_up) {
        // Waiting for work: the command word and the client's wptr, read together (one PCIe
        // round trip a look), and nothing else until one of them moves.
        uniform_poll(&c->ctl->seq, (const u64*)S->mqd.wptr_word, &seq, &w);
        polled = true;
        if (seq == S->seq_seen && w == S->r.wptr) {
            // (The clock is looked at every 64 polls: a poll is a round trip, the report is
            // not urgent, and a poll that does nothing else answers a new wptr soonest.)
            if (S->run == RUN_BUSY && (++S->polls & 63) == 0 && idle_long_enough(c, S)) {
                set_run(c, S, RUN_IDLE);
            }
            if ((S->steps & 1023) == 0 && wave_leader()) st_volatile64(&c->st->heartbeat, S->steps);
            return;
        }
    } else {
        seq = uniform_ld64(&c->ctl->seq);
    }
    if (seq != S->seq_seen) {
        command(c, S, seq);
        polled = false;
    }
    if (S->run == RUN_EMPTY) {
        if ((S->steps & 1023) == 0 && wave_leader()) st_volatile64(&c->st->heartbeat, S->steps);
        return;
    }
    Fault f;
    fault_clear(&f);
    VmView vm;
    if (!vm_cached(c, S, &vm)) {
        fault_outside(&f, S->mqd.ring_va, 0, ACCESS_READ);
        faulted(c, S, &f, 0, false);
        return;
    }
    u64 start_rptr = S->r.rptr;
    bool blocked = false;
    for (u32 done = 0; done < STEP_PACKETS; ++done) {
        u32 sp;
        if (S->stopping && stop_here(S, &sp)) {
            leave(c, S, sp);
            return;
        }
        // The next packet: from the indirect buffer being run, or from the ring.
        const bool in_ib = S->r.flags & REG_IB;
        VmView ibvm = vm;
        Packet p;
        if (in_ib) {
            if ((S->r.flags & REG_IB_VMID) && !vm_remote(c, S->r.ib_vmid, &ibvm)) {
                fault_why(&f, FK_BAD_INDIRECT, S_VMID_MISSING);
                faulted(c, S, &f, OP_INDIRECT + 1, false);
                return;
            }
            if (S->r.ib_pos >= S->r.ib_dwords) {
                S->r.flags &= ~(REG_IB | REG_IB_VMID);
                S->r.rptr += 5 * 4;
                continue;
            }
            if (!fetch_ib(S, &ibvm, &p, &f)) {
                faulted(c, S, &f, 0, true);
                return;
            }
        } else {
            if (S->r.rptr == S->r.wptr) {
                // Acquire (this load, or the fence after the poll's when it found a new
                // wptr): the packets the new wptr covers are visible to the fetch that
                // follows.
                if (!polled) {
                    w = uniform_acquire64((const u64*)S->mqd.wptr_word);
                } else if (w != S->r.wptr) {
                    fence_acquire();
                }
                polled = false;
                if (!take_wptr(S, w, &f)) {
                    faulted(c, S, &f, 0, false);
                    return;
                }
                if (S->r.rptr == S->r.wptr) {
                    if (S->stopping) {
                        leave(c, S, SP_IDLE);
                        return;
                    }
                    // Caught up: what it completed is stored for the clients now, and it polls.
                    flush_completed(S);
                    if (!S->caught_up) {
                        S->caught_up = 1;
                        S->idle_since = c->idle_after ? uniform_time_ns() : 0;
                    }
                    if (c->idle_after == 0) set_run(c, S, RUN_IDLE);
                    break;
                }
                // New work: its first words, its last-queued value and the page table's
                // state, in one round trip.
                S->caught_up = 0;
                fetch_window(c, S, true);
                if (!vm_cached(c, S, &vm)) {
                    fault_outside(&f, S->mqd.ring_va, 0, ACCESS_READ);
                    faulted(c, S, &f, 0, false);
                    return;
                }
            }
            if (!S->stopping) {
                u32 k = fast_packets(c, S, &vm, STEP_PACKETS - done);
                if (k) {
                    done += k - 1;
                    if (S->run != RUN_BUSY) set_run(c, S, RUN_BUSY);
                    continue;
                }
            }
            u32 op_known = 0;
            if (!fetch_ring(c, S, &p, &op_known, &f)) {
                faulted(c, S, &f, op_known, false);
                return;
            }
        }
        // Run it, in the address space it was fetched from.
        const VmView* xvm = in_ib ? &ibvm : &vm;
        u32 stopped = 0;
        u32 flow = exec_packet(c, S, xvm, &p, in_ib, &stopped, &f);
        if (S->run == RUN_EMPTY) return; // aborted inside a long packet
        if (flow == FLOW_FAULT) {
            faulted(c, S, &f, p.op + 1, in_ib);
            return;
        }
        if (flow == FLOW_BLOCKED) {
            S->blocked_vmid = xvm->vmid;
            blocked = true;
            break;
        }
        if (flow == FLOW_STOPPED) {
            leave(c, S, stopped);
            return;
        }
        if (flow == FLOW_YIELD) break;
        // Past it. A ring's INDIRECT leaves rptr on itself until its buffer is done (above);
        // a PROGRESS_FENCE from the ring ends a command buffer.
        if (in_ib) S->r.ib_pos += p.dwords;
        else if (!(S->r.flags & REG_IB)) S->r.rptr += (u64)p.dwords * 4;
        if (!in_ib && p.op == OP_PROGRESS_FENCE) S->r.flags |= REG_CB_BOUNDARY;
        else S->r.flags &= ~REG_CB_BOUNDARY;
        S->packets++;
        if (S->run != RUN_BUSY) set_run(c, S, RUN_BUSY);
    }
    flush_completed(S);
    // Blocked in a WAIT: tell the host (once); a STOP that allows it takes the queue here.
    if (blocked) {
        if (S->stopping && (S->stop & STOP_BLOCKED_WAIT)) {
            leave(c, S, SP_PACKET);
            return;
        }
        set_run(c, S, RUN_BLOCKED);
    }
    if (S->r.rptr != start_rptr) publish_rptr(S);
    // The status (rptr and counters for the host; the progress value it reads from the
    // queue's kernel page) every so many steps, and at every change of state (set_run): each
    // of its stores to host memory costs the slot time a new submission would wait for.
    if ((S->steps & (STATUS_EVERY - 1)) == 0) publish_status(c, S);
}

// ---------------------------------------------------------------------------------------
// Entry points
// ---------------------------------------------------------------------------------------

/// Bytes of a slot's private memory in Globals.priv: its program cache and register file.
#define PRIV_PROG_BYTES ((u64)ISA_MAX_INSTRUCTIONS * 8)
#define PRIV_VREG_BYTES ((u64)ISA_VREGS * WAVE * 4)
#define PRIV_BYTES (PRIV_PROG_BYTES + PRIV_VREG_BYTES)

DB_FN void slot_ctx(const Globals* g, u32 slot, SlotShared* sh, SlotCtx* c) {
    c->g = g;
    c->ctl = (SlotCtl*)g->ctl + slot;
    c->st = (SlotStatus*)g->status + slot;
    c->events = (Event*)g->events + (u64)slot * SLOT_EVENTS;
    c->sh = sh;
    u8* priv = (u8*)g->priv + (u64)slot * g->priv_bytes;
    c->prog = (u64*)priv;
    c->vregs = (u32*)(priv + PRIV_PROG_BYTES);
    c->compute = slot < 64 ? g->engine_kind[slot] : 0;
    c->idle_after = g->idle_after_ns;
}

DB_FN void slot_init(SlotState* S) {
    u8* b = (u8*)S;
    for (u64 i = 0; i < sizeof(SlotState); ++i) b[i] = 0;
}

#if DB_GPU
/// Writes the GPU's global timer to `out` (the host calibrates its clock against it).
extern "C" __global__ void engine_clock(u64* out) {
    st_volatile64(out, global_time_ns());
    fence_sys();
}

/// The persistent program: block b (32 threads) is hardware slot b, until the host sets quit.
extern "C" __global__ void __launch_bounds__(32) engine_main(const Globals* g) {
    __shared__ SlotShared sh;
    SlotState S;
    slot_init(&S);
    SlotCtx c;
    slot_ctx(g, blockIdx.x, &sh, &c);
    for (;;) {
        slot_step(&c, &S);
        if (++S.quit_poll == 256) {
            S.quit_poll = 0;
            if (uniform_ld64(&g->quit)) break;
        }
    }
}
#else
extern "C" {
/// The sizes of the layout structs as this compiler laid them out, in
/// crates/cuda/src/layout.rs's LAYOUT_SIZES order; returns how many it wrote.
u32 db_emu_layout(u64* out, u32 n) {
    const u64 sizes[] = {sizeof(Fault), sizeof(Regs), sizeof(Mqd), sizeof(SlotCtl), sizeof(SlotStatus),
                         sizeof(Event), sizeof(VmEntry), sizeof(VmDir), sizeof(FenceSlot), sizeof(Globals)};
    u32 k = 0;
    for (; k < n && k < sizeof(sizes) / sizeof(sizes[0]); ++k) out[k] = sizes[k];
    return k;
}
/// Bytes of the state the emulator keeps per slot (SlotState + SlotShared).
u64 db_emu_slot_bytes(void) { return sizeof(SlotState) + sizeof(SlotShared); }
/// Bytes of a slot's private memory (program cache and registers).
u64 db_emu_priv_bytes(void) { return PRIV_BYTES; }
/// Resets a slot's emulator state (`mem`: db_emu_slot_bytes bytes, 16-aligned).
void db_emu_slot_init(void* mem) {
    slot_init((SlotState*)mem);
}
/// Runs `steps` steps of slot `slot`; returns whether it is executing afterwards (it has more
/// to do now; a queue blocked in a WAIT or idle has not).
u32 db_emu_slot_run(const Globals* g, u32 slot, void* mem, u32 steps) {
    SlotState* S = (SlotState*)mem;
    SlotShared* sh = (SlotShared*)((u8*)mem + sizeof(SlotState));
    SlotCtx c;
    slot_ctx(g, slot, sh, &c);
    for (u32 i = 0; i < steps; ++i) {
        // A step emits at most one event per packet and a few more: run one only while the
        // ring has room for all of them (on the CPU nobody drains it during the step).
        if (S->events_written - ld_volatile64(&c.ctl->events_read) > SLOT_EVENTS - STEP_PACKETS - 16) break;
        slot_step(&c, S);
        if (S->run == RUN_EMPTY || S->run == RUN_IDLE) break;
    }
    return S->run == RUN_BUSY;
}
}
#endif
