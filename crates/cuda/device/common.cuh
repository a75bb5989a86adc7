// common.cuh — what every part of doorbell's GPU engine program shares: integer types, the
// two build targets, the wave's lanes, memory-ordering primitives, fault records and GPU
// virtual address translation.
//
// The engine program (engine.cu, isa.cuh) is written once and built two ways:
//
// - for the GPU, by NVRTC at run time (crates/cuda/src/driver.rs): one warp is one hardware
//   queue slot, each of its 32 threads one lane of a wave;
// - for the CPU, by the host C++ compiler (crates/cuda/build.rs), as the *emulated* backend:
//   one CPU thread runs a slot, and the 32 lanes of a wave are a loop. CI has no GPU; this
//   build is what lets every CPU test exercise the very source the GPU runs.
//
// Rules that keep the two builds equal:
// - Code inside LANES(l) { ... } touches lane l's values only. A value that crosses lanes goes
//   through a collective (wave_or, wave_bcast64, wave_match); on the CPU the loop has already
//   combined every lane, so the collectives are identities or lane picks.
// - Everything outside LANES is wave-uniform: every thread of the warp computes the same
//   thing (and stores the same value), so it may run redundantly.
// - Per-lane state lives in memory indexed [register][lane], never in a thread's locals
//   across a LANES loop, so both builds hold it the same way.
// - No library headers: NVRTC has none. Floating point goes through the _rn intrinsics on
//   the GPU (no contraction, round to nearest even) and explicit code on the CPU.
//
// Invariants: nothing read from client memory is trusted; every address is translated
// through the queue's page table (vm_translate) before it is touched, and a failure becomes a
// Fault record — never a wild access, never a trap.

#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define DB_GPU 1
#define DB_FN __device__ __forceinline__
#define DB_SLOW __device__ __noinline__
#else
#define DB_GPU 0
#define DB_FN static inline
#define DB_SLOW static
#endif

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef int i32;
typedef long long i64;

#define DB_STATIC_ASSERT(c, m) static_assert(c, m)

DB_STATIC_ASSERT(sizeof(u64) == 8 && sizeof(u32) == 4 && sizeof(u16) == 2, "integer widths");

// ---------------------------------------------------------------------------------------
// Lanes
// ---------------------------------------------------------------------------------------

/// Lanes in a wave: a warp.
#define WAVE 32u
/// Every lane of a wave.
#define ALL_LANES 0xffffffffu

#if DB_GPU
DB_FN u32 lane_id() { return threadIdx.x & 31u; }
/// Runs its body for lane `l`: on the GPU, each thread for its own lane, once.
#define LANES(l) for (u32 l = lane_id(), l##_once_ = 1; l##_once_; l##_once_ = 0)
/// The OR of `bits` over the wave (each lane contributes its own bits).
DB_FN u32 wave_or(u32 bits) { return __reduce_or_sync(ALL_LANES, bits); }
/// Lane `from`'s `x`, in every lane.
DB_FN u64 wave_bcast64(u64 x, u32 from) { return __shfl_sync(ALL_LANES, x, from); }
/// The lanes whose `key` equals this lane's.
DB_FN u32 wave_match(u64 key) { return __match_any_sync(ALL_LANES, key); }
/// Waits until every lane of the wave reached this point (their memory effects visible to
/// each other).
DB_FN void wave_sync() { __syncwarp(ALL_LANES); }
#else
#define LANES(l) for (u32 l = 0; l < WAVE; ++l)
DB_FN u32 wave_or(u32 bits) { return bits; }
DB_FN u64 wave_bcast64(u64 x, u32 from) { (void)from; return x; }
DB_FN void wave_sync() {}
#endif

/// Whether this thread writes a wave-uniform value to memory another actor reads (lane 0 on
/// the GPU; the one thread on the CPU): uniform stores happen once, not 32 times over PCIe.
#if DB_GPU
DB_FN bool wave_leader() { return lane_id() == 0; }
#else
DB_FN bool wave_leader() { return true; }
#endif

DB_FN u32 popc64(u64 x) {
#if DB_GPU
    return (u32)__popcll(x);
#else
    return (u32)__builtin_popcountll(x);
#endif
}

/// Index of the lowest set bit of a non-zero mask.
DB_FN u32 lowest_bit(u32 x) {
#if DB_GPU
    return (u32)(__ffs((int)x) - 1);
#else
    return (u32)__builtin_ctz(x);
#endif
}

// ---------------------------------------------------------------------------------------
// Memory ordering (the GPU speaks to the CPU through pinned host memory over PCIe)
// ---------------------------------------------------------------------------------------

/// A load another actor may change at any time (a CPU store, another slot's).
DB_FN u64 ld_volatile64(const u64* p) { return *(const volatile u64*)p; }
DB_FN u32 ld_volatile32(const u32* p) { return *(const volatile u32*)p; }
#if DB_GPU
// Stores to memory another actor reads are write-through (st.global.wt): a plain store to a
// host-memory line L2 does not hold first reads the line over PCIe (write-allocate, a round
// trip per store) and then sits in L2 until evicted or fenced; written through, it leaves at
// once and costs the warp nothing. Every pointer these take is a global address (host
// memory registered with the GPU, or GPU memory).
DB_FN void st_volatile64(u64* p, u64 v) { asm volatile("st.global.wt.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory"); }
DB_FN void st_volatile32(u32* p, u32 v) { asm volatile("st.global.wt.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory"); }
DB_FN void st_volatile8(u8* p, u8 v) {
    asm volatile("st.global.wt.u8 [%0], %1;" ::"l"(p), "h"((unsigned short)v) : "memory");
}
#else
DB_FN void st_volatile64(u64* p, u64 v) { *(volatile u64*)p = v; }
DB_FN void st_volatile32(u32* p, u32 v) { *(volatile u32*)p = v; }
DB_FN void st_volatile8(u8* p, u8 v) { *(volatile u8*)p = v; }
#endif

/// Acquire at system scope: loads after it see whatever the writer published before its
/// release of this word (the client's wptr, the host's command sequence).
DB_FN u64 ld_acquire64(const u64* p) {
#if DB_GPU
    u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
#else
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}

/// Release at system scope: everything written before it is visible to whoever acquires the
/// value (the slot's status, rptr, a fence value).
DB_FN void st_release64(u64* p, u64 v) {
#if DB_GPU
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#else
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
#endif
}

/// A sequentially consistent fence at system scope (spec 002's barrier between a fence
/// value and its MonitoredValue check).
DB_FN void fence_sys() {
#if DB_GPU
    __threadfence_system();
#else
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

/// Atomic add on a 32-bit word; returns the old value. (On mapped host memory a GPU atomic is
/// atomic among GPU threads, not against the CPU: doorbell's ISA atomics are the engine's.)
DB_FN u32 atomic_add32(u32* p, u32 v) {
#if DB_GPU
    return atomicAdd(p, v);
#else
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
#endif
}

/// The device clock in ns (the GPU's global timer; on the CPU, CLOCK_MONOTONIC).
#if DB_GPU
DB_FN u64 global_time_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
#else
extern "C" u64 db_host_time_ns(void);
DB_FN u64 global_time_ns() { return db_host_time_ns(); }
#endif

// ---------------------------------------------------------------------------------------
// Stop points (abi::preempt::StopPoint, in its order)
// ---------------------------------------------------------------------------------------

enum StopPointCode : u32 {
    SP_IDLE = 0,
    SP_COMMAND_BUFFER = 1,
    SP_PACKET = 2,
    SP_GROUP = 3,
    SP_WAVE = 4,
    SP_INSTRUCTION = 5,
    SP_CHUNK = 6,
};

// ---------------------------------------------------------------------------------------
// Static strings
// ---------------------------------------------------------------------------------------

// The static texts a fault record names (a field, a reason), by number. The host turns the
// number back into the text (crates/cuda/src/fault.rs, whose test checks this list against
// its own, entry by entry, by the quoted text after each name).
enum Str : u32 {
    S_NONE = 0,  // ""
    S_D,         // "d"
    S_A,         // "a"
    S_B,         // "b"
    S_C,         // "c"
    S_IMM,       // "imm"
    S_WIDTH,     // "width"
    S_LOG_ENTRY, // "log entry"
    S_NO_FENCE_LOG,       // "this queue has no fence log"
    S_LOG_HOLDS_NO_ENTRY, // "the queue's fence log holds no entry"
    S_ELSE_WITHOUT_IF,    // "ELSE without IF"
    S_ENDIF_WITHOUT_IF,   // "ENDIF without IF"
    S_BREAK_OUTSIDE_LOOP, // "BREAK outside a LOOP"
    S_ENDLOOP_WITHOUT_LOOP, // "ENDLOOP without LOOP"
    S_LOOP_WITHOUT_ENDLOOP, // "LOOP without ENDLOOP"
    S_IF_WITHOUT_ENDIF,     // "IF without ENDIF"
    S_GRID_ZERO,            // "every grid dimension must be at least 1"
    S_GROUP_ZERO,           // "every workgroup dimension must be at least 1"
    S_GROUP_TOO_BIG,        // "a workgroup holds at most 1024 threads"
    S_GRID_TOO_BIG,         // "a grid holds at most 2^40 workgroups"
    S_ONLY_COMPUTE,         // "only compute engines run kernels"
    S_STACK_MISMATCH,       // "control-flow stack does not match the program"
    S_TRUNCATED,            // "truncated"
    S_SAVE_OUT_OF_BOUNDS,   // "save area out of bounds"
    S_STATE_TOO_LARGE,      // "state larger than the save area"
    S_BAD_MAGIC_OR_VERSION, // "bad magic or version"
    S_OTHER_WAVE_WIDTH,     // "saved with another wave width"
    S_NEXT_GROUP_BEYOND,    // "next group beyond the grid"
    S_WAVE_OUTSIDE_GRID,    // "wave outside the grid"
    S_WAVE_STATE_RANGE,     // "wave state out of range"
    S_STACK_TOO_DEEP,       // "control-flow stack too deep"
    S_FRAME_RANGE,          // "control-flow frame out of range"
    S_UNKNOWN_FRAME,        // "unknown control-flow frame"
    S_BAD_WAVE_FLAG,        // "bad wave flag"
    S_VMID_MISSING,         // "vmid does not exist"
    S_NESTED_INDIRECT,      // "an indirect buffer may not contain another"
    S_USER_VMID,            // "vmid must be 0 on a user queue"
    S_COUNT
};

// ---------------------------------------------------------------------------------------
// Fault records (abi::queue::FaultKind, as numbers)
// ---------------------------------------------------------------------------------------

/// abi::queue::Access.
#define ACCESS_READ 0u
#define ACCESS_WRITE 1u

/// FaultKind variants. Fields go to a, b, c in the variant's declaration order; `sub` holds an
/// Access, a DecodeError or a ProgramErrorKind; `s1`, `s2` hold Str numbers (or, for a
/// DecodeError that names an opcode, the opcode number in s1).
enum FaultKindCode : u32 {
    FK_NONE = 0,
    FK_BAD_PACKET = 1,            // sub: DE_*
    FK_PAST_RING_END = 2,         // a offset, b dwords, c ring_bytes
    FK_PAST_WPTR = 3,             // a rptr, b dwords, c wptr
    FK_OUTSIDE_MAPPINGS = 4,      // a va, b bytes, sub access
    FK_READ_ONLY = 5,             // a va, b bytes
    FK_MISALIGNED = 6,            // a va, b align, sub access
    FK_WPTR_BACKWARDS = 7,        // a old, b new
    FK_WPTR_PAST_RING = 8,        // a rptr, b wptr, c ring_bytes
    FK_WPTR_MISALIGNED = 9,       // a wptr
    FK_BAD_FIELD = 10,            // s1 field, s2 why
    FK_NOT_A_FENCE = 11,          // a va
    FK_PROGRESS_BACKWARDS = 12,   // a completed, b value
    FK_PROGRESS_BEYOND_QUEUED = 13, // a value, b last_queued
    FK_BAD_KERNEL = 17,           // pc, sub KE_*, a value, s1 text
    FK_BAD_DISPATCH = 18,         // s1 why
    FK_KERNEL_ACCESS = 19,        // pc; inner: FK_OUTSIDE_MAPPINGS / FK_READ_ONLY / FK_MISALIGNED
    FK_BAD_SAVE_AREA = 20,        // s1 why
    FK_BAD_INDIRECT = 21,         // s1 why
    FK_BAD_LOG_POSITION = 22,     // a position, b next, c entries
};

/// abi::packet::DecodeError variants.
enum DecodeErrorCode : u32 {
    DE_TRUNCATED = 1,       // a need, b have
    DE_BAD_VERSION = 2,     // a header, b version
    DE_RESERVED_FLAGS = 3,  // a header, b flags
    DE_UNKNOWN_OPCODE = 4,  // a opcode
    DE_ZERO_LENGTH = 5,     // s1 opcode number
    DE_BAD_LENGTH = 6,      // s1 opcode number, a len, b expected
    DE_BAD_FIELD = 7,       // s1 opcode number, s2 field, a value
};

/// abi::isa::ProgramErrorKind variants.
enum KernelErrorCode : u32 {
    KE_BAD_MAGIC = 1,      // a magic
    KE_BAD_VERSION = 2,    // a version
    KE_BAD_LENGTH = 3,     // a count
    KE_RESERVED = 4,
    KE_UNKNOWN_OPCODE = 5, // a opcode byte
    KE_BAD_REGISTER = 6,   // s1 field, a register
    KE_BAD_BUILTIN = 7,    // a builtin
    KE_BAD_TARGET = 8,     // a target
    KE_UNBALANCED = 9,     // s1 what
    KE_TOO_DEEP = 10,
    KE_UNUSED_FIELD = 11,  // s1 field, a value
};

/// A fault, as the device reports it (40 bytes; crates/cuda/src/layout.rs mirrors it).
struct Fault {
    u32 kind;  // FaultKindCode
    u32 sub;   // Access, DecodeErrorCode or KernelErrorCode
    u64 a, b, c;
    u32 pc;    // BadProgram: the error's instruction; ProgramAccess: the faulting instruction
    u32 inner; // ProgramAccess: the inner access fault's kind (its fields in a, b, sub)
    u32 s1, s2;
};
DB_STATIC_ASSERT(sizeof(Fault) == 48, "Fault layout");

DB_FN void fault_clear(Fault* f) {
    f->kind = FK_NONE; f->sub = 0; f->a = f->b = f->c = 0; f->pc = 0; f->inner = 0; f->s1 = f->s2 = 0;
}

DB_FN bool fault_set(Fault* f, u32 kind, u64 a, u64 b, u64 c) {
    fault_clear(f);
    f->kind = kind; f->a = a; f->b = b; f->c = c;
    return false;
}

DB_FN bool fault_outside(Fault* f, u64 va, u64 bytes, u32 access) {
    fault_set(f, FK_OUTSIDE_MAPPINGS, va, bytes, 0);
    f->sub = access;
    return false;
}

DB_FN bool fault_why(Fault* f, u32 kind, u32 why) {
    fault_clear(f);
    f->kind = kind; f->s1 = why;
    return false;
}

DB_FN bool fault_decode(Fault* f, u32 code, u64 a, u64 b, u32 s1, u32 s2) {
    fault_clear(f);
    f->kind = FK_BAD_PACKET; f->sub = code; f->a = a; f->b = b; f->s1 = s1; f->s2 = s2;
    return false;
}

DB_FN bool fault_kernel(Fault* f, u32 pc, u32 code, u64 a, u32 s1) {
    fault_clear(f);
    f->kind = FK_BAD_KERNEL; f->pc = pc; f->sub = code; f->a = a; f->s1 = s1;
    return false;
}

/// Wraps an access fault `f` of instruction `pc` into a ProgramAccess.
DB_FN void fault_in_kernel(Fault* f, u32 pc) {
    f->inner = f->kind;
    f->kind = FK_KERNEL_ACCESS;
    f->pc = pc;
}

// ---------------------------------------------------------------------------------------
// GPU virtual address translation (gpu::memory::AddressSpace)
// ---------------------------------------------------------------------------------------

/// One mapping of an address space: `bytes` bytes at `va`, reached at `dev` (a device
/// address: registered host memory, or GPU memory).
struct VmEntry {
    u64 va;
    u64 bytes;
    u64 dev;
    u64 flags; // VM_WRITABLE
};
DB_STATIC_ASSERT(sizeof(VmEntry) == 32, "VmEntry layout");
#define VM_WRITABLE 1ull

/// An address space as the engine reads it: its mappings sorted by `va`, non-overlapping.
struct VmView {
    const VmEntry* e;
    u32 count;
    u32 vmid;
};

/// gpu::memory::AddressSpace::translate: the device address of `[va, va + bytes)`, which must
/// lie inside one mapping, writable for a write. `bytes` may be 0 (the address must still be
/// mapped). On failure returns 0 with `f` set (OutsideMappings or ReadOnly).
DB_FN u8* vm_translate(const VmView* vm, u64 va, u64 bytes, u32 access, Fault* f) {
    // The last mapping whose start is at or below va (a partition point, as the host's).
    u32 lo = 0, hi = vm->count;
    while (lo < hi) {
        u32 mid = lo + (hi - lo) / 2;
        if (vm->e[mid].va <= va) lo = mid + 1; else hi = mid;
    }
    if (lo == 0) { fault_outside(f, va, bytes, access); return 0; }
    const VmEntry* m = &vm->e[lo - 1];
    u64 end = m->va + m->bytes;
    if (!(va < end)) { fault_outside(f, va, bytes, access); return 0; }
    u64 e = va + bytes;
    if (e < va || e > end) { fault_outside(f, va, bytes, access); return 0; }
    if (access == ACCESS_WRITE && !(m->flags & VM_WRITABLE)) {
        fault_set(f, FK_READ_ONLY, va, bytes, 0);
        return 0;
    }
    return (u8*)(m->dev + (va - m->va));
}

/// gpu::memory::AddressSpace::translate_aligned: a naturally aligned 4- or 8-byte access.
DB_FN u8* vm_translate_aligned(const VmView* vm, u64 va, u64 bytes, u32 access, Fault* f) {
    if (va % bytes != 0) {
        fault_set(f, FK_MISALIGNED, va, bytes, 0);
        f->sub = access;
        return 0;
    }
    return vm_translate(vm, va, bytes, access, f);
}

// ---------------------------------------------------------------------------------------
// Little-endian helpers for bytes in memory another actor writes
// ---------------------------------------------------------------------------------------

DB_FN u32 rd32(const u8* p) { return ld_volatile32((const u32*)p); }
DB_FN u64 rd64(const u8* p) { return ld_volatile64((const u64*)p); }
DB_FN void wr32(u8* p, u32 v) { st_volatile32((u32*)p, v); }
DB_FN void wr64(u8* p, u64 v) { st_volatile64((u64*)p, v); }
