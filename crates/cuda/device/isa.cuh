// isa.cuh — doorbell's compute ISA interpreter (abi::isa, version 1) for the engine program:
// the semantics of gpu::compute (Program::load, Dispatch::start / run_to / save / restore) for
// a wave width of 32, bit for bit: the same memory, the same faults, the same save-area bytes.
//
// One wave is one warp (on the CPU: a loop over 32 lanes, see common.cuh). The wave's uniform
// state (pc, masks, control-flow stack, scalar registers) is held in locals of isa_run, the
// same in every thread; the vector registers live in memory, v[r * WAVE + lane], each lane
// touching its own words; the program cache is shared (filled by all lanes, then read by all).
// Every lane writes the dispatch (IsaDispatch) and the outputs (*f, *st, *stopped_at), all
// with the same values: each lane may hold its own copy of them (in its local memory) or all
// may share one. Only the save area, memory another actor reads, gets its uniform fields from
// the wave leader alone.
//
// Exactness rules this file keeps (each has a test in crates/cuda/tests/isa_emulated.rs):
// - Memory instructions: every active lane translates its address; the lowest faulting lane
//   f is found by a vote; only the active lanes below f access memory (the Rust interpreter
//   runs lanes in order and stops at the first fault); then lane f's fault is reported.
// - Stores to one address in one instruction: the highest lane wins (lane order).
// - atom.add: per address, one atomic add of the group's sum; each lane gets the old value
//   plus the values of the lower lanes of its group (lane order).
// - An ALU write with every live lane active writes all 32 lanes (lanes past the group's
//   threads too), as gpu::compute's in-place path does; otherwise only the active lanes.
// - Floats: IEEE binary32, round to nearest even, no contraction, no flush to zero; every NaN
//   result is written as the canonical 0x7fffffff (abi::isa::CANONICAL_NAN), as gpu::compute
//   writes it: hosts and GPUs differ in the NaN they produce, and a NaN's bits can become an
//   address. FMIN/FMAX: a NaN operand loses; with equal operands (+0 and -0) the
//   first operand is returned (what x86-64 LLVM's minnum/maxnum lowering does).
//
// Save-area format ("DBCS" version 1, width 32), offsets in bytes (u64 fields are only
// 4-aligned, so they are written and read as two u32 halves):
//   0 magic  4 version  8 kernel  16 grid[3]  28 group[3]  40 args  48 width  52 next_group
//   60 wave flag (0/1); wave: 64 group  72 index  76 pc  80 live  88 exec  96 exited
//   104 depth  108 frames (24 bytes each: kind, outer u64, mask u64, start), then s[16] (u64),
//   then v[64][32] (u32, register-major).
//
// Device addresses: a mapping's device address is its backing region's (page-aligned) address
// plus the mapping's offset, so its alignment is the offset's, and the Rust checks on backing
// offsets are checks on device addresses here: a kernel header whose backing is not 4-aligned,
// and an atom.add whose backing word is not, are OutsideMappings, as in Rust. The GPU also
// needs ld.u64/st.u64/sarg device addresses 8-aligned (the natural alignment the VA already
// has, when each mapping's offset is a multiple of 8), and save areas 4-aligned.

#pragma once

#include "common.cuh"

// =======================================================================================
// Additions to common.cuh (needed here; candidates to move into common.cuh)
// =======================================================================================

/// A per-lane value that must live across LANES loops: on the GPU one register of the lane's
/// thread; on the CPU an array indexed by lane (the loop has one "thread" for all lanes).
#if DB_GPU
#define ISA_LANE_VAR(T, x) T x
#define ISA_AT(x, l) (x)
#else
#define ISA_LANE_VAR(T, x) T x[WAVE]
#define ISA_AT(x, l) ((x)[l])
#endif

/// The lanes whose `key` equals lane `l`'s (wave_match). On the CPU, lane `l` alone: the loop
/// runs lanes in ascending order, which is already the order the grouping reproduces.
#if DB_GPU
DB_FN u32 isa_match(u64 key, u32 l) { (void)l; return wave_match(key); }
/// Lane `src`'s `x`, per thread (`src` may differ between lanes).
DB_FN u32 isa_shfl32(u32 x, u32 src) { return __shfl_sync(ALL_LANES, x, src); }
/// Over the lanes of `grp` (a subset of the uniform mask `doing`): the sum of their `val`
/// (`*sum`) and of those below lane `l` (`*pre`).
DB_FN void isa_group_scan(u32 val, u32 grp, u32 doing, u32 l, u32* pre, u32* sum) {
    u32 p = 0, s = 0;
    for (u32 rem = doing; rem; rem &= rem - 1u) {
        u32 j = lowest_bit(rem);
        u32 x = __shfl_sync(ALL_LANES, val, j);
        if (grp >> j & 1u) {
            s += x;
            if (j < l) p += x;
        }
    }
    *pre = p;
    *sum = s;
}
#else
DB_FN u32 isa_match(u64 key, u32 l) { (void)key; return 1u << l; }
DB_FN u32 isa_shfl32(u32 x, u32 src) { (void)src; return x; }
DB_FN void isa_group_scan(u32 val, u32 grp, u32 doing, u32 l, u32* pre, u32* sum) {
    (void)grp; (void)doing; (void)l;
    *pre = 0;
    *sum = val;
}
#endif

// =======================================================================================
// The ISA (abi::isa)
// =======================================================================================

#define ISA_MAX_INSTRUCTIONS 65536u
#define ISA_VREGS 64u
#define ISA_SREGS 16u
#define ISA_MAX_NESTING 16u
/// gpu::compute::CONTEXT_SAVE_BYTES.
#define ISA_CONTEXT_SAVE_BYTES (24u * 1024u)
/// Frames a wave's stack can hold. A program nests at most ISA_MAX_NESTING deep, but a
/// restored stack (up to ISA_MAX_NESTING frames, each in range yet not matching the program)
/// sits below the program's own frames, as in the Rust interpreter, whose stack is a Vec.
#define ISA_STACK_FRAMES (2u * ISA_MAX_NESTING)
#define ISA_KERNEL_MAGIC 0x314b4244u /* "DBK1" */
#define ISA_VERSION 1u
#define ISA_SAVE_MAGIC 0x53434244u /* "DBCS" */
#define ISA_SAVE_VERSION 1u
/// The NaN every float result that is a NaN is written as.
#define ISA_CANONICAL_NAN 0x7fffffffu

enum IsaOpCode : u32 {
    ISA_OP_NOP = 0x00, ISA_OP_ADD = 0x01, ISA_OP_SUB = 0x02, ISA_OP_MUL = 0x03,
    ISA_OP_MULHI_U = 0x04, ISA_OP_DIV_U = 0x05, ISA_OP_DIV_S = 0x06, ISA_OP_REM_U = 0x07,
    ISA_OP_REM_S = 0x08, ISA_OP_AND = 0x09, ISA_OP_OR = 0x0a, ISA_OP_XOR = 0x0b,
    ISA_OP_SHL = 0x0c, ISA_OP_SHR = 0x0d, ISA_OP_SRA = 0x0e, ISA_OP_MIN_U = 0x0f,
    ISA_OP_MAX_U = 0x10, ISA_OP_MIN_S = 0x11, ISA_OP_MAX_S = 0x12,
    ISA_OP_FADD = 0x20, ISA_OP_FSUB = 0x21, ISA_OP_FMUL = 0x22, ISA_OP_FDIV = 0x23,
    ISA_OP_FMIN = 0x24, ISA_OP_FMAX = 0x25, ISA_OP_FFMA = 0x26,
    ISA_OP_MOV = 0x30, ISA_OP_NOT = 0x31, ISA_OP_CVT_F32_U32 = 0x32, ISA_OP_CVT_F32_I32 = 0x33,
    ISA_OP_CVT_U32_F32 = 0x34, ISA_OP_CVT_I32_F32 = 0x35, ISA_OP_FSQRT = 0x36,
    ISA_OP_CMP_EQ = 0x40, ISA_OP_CMP_NE = 0x41, ISA_OP_CMP_LT_U = 0x42, ISA_OP_CMP_LE_U = 0x43,
    ISA_OP_CMP_LT_S = 0x44, ISA_OP_CMP_LE_S = 0x45, ISA_OP_FCMP_EQ = 0x46, ISA_OP_FCMP_LT = 0x47,
    ISA_OP_FCMP_LE = 0x48, ISA_OP_SEL = 0x49,
    ISA_OP_BUILTIN = 0x50, ISA_OP_SARG = 0x51, ISA_OP_SMOV = 0x52, ISA_OP_SADD = 0x53,
    ISA_OP_VFROMS = 0x54, ISA_OP_VFROMS_HI = 0x55,
    ISA_OP_LD32 = 0x60, ISA_OP_ST32 = 0x61, ISA_OP_LD64 = 0x62, ISA_OP_ST64 = 0x63,
    ISA_OP_ATOM_ADD = 0x64,
    ISA_OP_IF = 0x70, ISA_OP_ELSE = 0x71, ISA_OP_ENDIF = 0x72, ISA_OP_LOOP = 0x73,
    ISA_OP_BREAK = 0x74, ISA_OP_ENDLOOP = 0x75, ISA_OP_EXIT = 0x76,
};

/// abi::isa::Form.
enum IsaForm : u32 {
    ISA_F_NONE, ISA_F_BINARY, ISA_F_TERNARY, ISA_F_UNARY, ISA_F_BUILTIN, ISA_F_SCALAR_ARG,
    ISA_F_SCALAR_IMM, ISA_F_SCALAR_ADD, ISA_F_FROM_SCALAR, ISA_F_LOAD, ISA_F_STORE, ISA_F_ATOMIC,
    ISA_F_COND_BRANCH, ISA_F_BRANCH,
    ISA_F_UNKNOWN = 0xffu,
};

/// The form of opcode `op`, or ISA_F_UNKNOWN.
DB_FN u32 isa_form(u32 op) {
    if (op >= 0x01 && op <= 0x12) return ISA_F_BINARY;
    if (op >= 0x20 && op <= 0x25) return ISA_F_BINARY;
    if (op >= 0x30 && op <= 0x36) return ISA_F_UNARY;
    if (op >= 0x40 && op <= 0x48) return ISA_F_BINARY;
    switch (op) {
    case ISA_OP_NOP: return ISA_F_NONE;
    case ISA_OP_FFMA: return ISA_F_TERNARY;
    case ISA_OP_SEL: return ISA_F_TERNARY;
    case ISA_OP_BUILTIN: return ISA_F_BUILTIN;
    case ISA_OP_SARG: return ISA_F_SCALAR_ARG;
    case ISA_OP_SMOV: return ISA_F_SCALAR_IMM;
    case ISA_OP_SADD: return ISA_F_SCALAR_ADD;
    case ISA_OP_VFROMS: case ISA_OP_VFROMS_HI: return ISA_F_FROM_SCALAR;
    case ISA_OP_LD32: case ISA_OP_LD64: return ISA_F_LOAD;
    case ISA_OP_ST32: case ISA_OP_ST64: return ISA_F_STORE;
    case ISA_OP_ATOM_ADD: return ISA_F_ATOMIC;
    case ISA_OP_IF: case ISA_OP_BREAK: return ISA_F_COND_BRANCH;
    case ISA_OP_ELSE: case ISA_OP_LOOP: case ISA_OP_ENDLOOP: return ISA_F_BRANCH;
    case ISA_OP_ENDIF: case ISA_OP_EXIT: return ISA_F_NONE;
    default: return ISA_F_UNKNOWN;
    }
}

#define ISA_USE_D 1u
#define ISA_USE_A 2u
#define ISA_USE_B 4u
#define ISA_USE_C 8u
#define ISA_USE_IMM 16u

/// abi::isa::Inst::used_fields, as a mask of ISA_USE_*.
DB_FN u32 isa_used_fields(u32 form, u32 c) {
    bool with_imm = c == 1u;
    switch (form) {
    case ISA_F_NONE: return 0;
    case ISA_F_BRANCH: return ISA_USE_IMM;
    case ISA_F_COND_BRANCH: return ISA_USE_A | ISA_USE_IMM;
    case ISA_F_BINARY:
        return with_imm ? (ISA_USE_D | ISA_USE_A | ISA_USE_C | ISA_USE_IMM) : (ISA_USE_D | ISA_USE_A | ISA_USE_B);
    case ISA_F_UNARY: return with_imm ? (ISA_USE_D | ISA_USE_C | ISA_USE_IMM) : (ISA_USE_D | ISA_USE_A);
    case ISA_F_TERNARY: return ISA_USE_D | ISA_USE_A | ISA_USE_B | ISA_USE_C;
    case ISA_F_BUILTIN: case ISA_F_SCALAR_ARG: case ISA_F_SCALAR_IMM: return ISA_USE_D | ISA_USE_IMM;
    case ISA_F_SCALAR_ADD: return ISA_USE_D | ISA_USE_A | ISA_USE_IMM;
    case ISA_F_FROM_SCALAR: return ISA_USE_D | ISA_USE_A;
    case ISA_F_LOAD: case ISA_F_STORE: return ISA_USE_D | ISA_USE_A | ISA_USE_B | ISA_USE_IMM;
    default: return ISA_USE_D | ISA_USE_A | ISA_USE_B | ISA_USE_C | ISA_USE_IMM; // atomic
    }
}

DB_FN bool isa_is_structure(u32 op) { return op >= ISA_OP_IF && op <= ISA_OP_ENDLOOP; }

/// A control-flow frame (gpu::compute::Frame).
struct IsaFrame {
    u32 kind;  // 0 IF, 1 LOOP
    u32 start; // LOOP: the body's first instruction; IF: 0
    u64 outer; // the mask before it
    u64 m;     // IF: lanes waiting for the ELSE; LOOP: lanes that broke out
};

/// A wave in flight.
struct IsaWave {
    u64 group;
    u32 index;
    u32 pc;
    u64 live, exec, exited;
    u32 depth;
    u32 pad;
    IsaFrame stack[ISA_STACK_FRAMES];
    u64 s[ISA_SREGS];
};

/// A dispatch in progress (gpu::compute::Dispatch, width 32).
struct IsaDispatch {
    u64 kernel;
    u32 grid[3];
    u32 group[3];
    u64 args;
    u64 next_group;
    u32 has_wave;
    u32 ninst;
    IsaWave wave;
};

/// What a run reaches: the address space, the validated program (raw words), the register
/// file (v[r * WAVE + lane]).
struct IsaMem {
    VmView vm;
    const u64* prog;
    u32* v;
};

/// gpu::compute::ComputeStats (isa_run adds to it).
struct IsaStats {
    u64 instructions;
    u64 lane_ops;
};

enum IsaResult : u32 { ISA_DONE = 0, ISA_YIELD = 1, ISA_STOPPED = 2, ISA_FAULT = 3 };

// ---------------------------------------------------------------------------------------
// Lane arithmetic (the closures of gpu::compute)
// ---------------------------------------------------------------------------------------

#if DB_GPU
DB_FN float isa_f(u32 x) { return __uint_as_float(x); }
DB_FN u32 isa_bits(float x) { return __float_as_uint(x); }
DB_FN float isa_fadd_(float a, float b) { return __fadd_rn(a, b); }
DB_FN float isa_fsub_(float a, float b) { return __fsub_rn(a, b); }
DB_FN float isa_fmul_(float a, float b) { return __fmul_rn(a, b); }
DB_FN float isa_fdiv_(float a, float b) { return __fdiv_rn(a, b); }
DB_FN float isa_fma_(float a, float b, float c) { return __fmaf_rn(a, b, c); }
DB_FN float isa_fsqrt_(float a) { return __fsqrt_rn(a); }
DB_FN float isa_u2f(u32 x) { return __uint2float_rn(x); }
DB_FN float isa_i2f(i32 x) { return __int2float_rn(x); }
#else
DB_FN float isa_f(u32 x) {
    union { u32 u; float f; } c;
    c.u = x;
    return c.f;
}
DB_FN u32 isa_bits(float x) {
    union { float f; u32 u; } c;
    c.f = x;
    return c.u;
}
// Plain operations: SSE on x86-64 (no x87), and build.rs passes -ffp-contract=off.
DB_FN float isa_fadd_(float a, float b) { return a + b; }
DB_FN float isa_fsub_(float a, float b) { return a - b; }
DB_FN float isa_fmul_(float a, float b) { return a * b; }
DB_FN float isa_fdiv_(float a, float b) { return a / b; }
DB_FN float isa_fma_(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
DB_FN float isa_fsqrt_(float a) { return __builtin_sqrtf(a); }
DB_FN float isa_u2f(u32 x) { return (float)x; }
DB_FN float isa_i2f(i32 x) { return (float)x; }
#endif

DB_FN bool isa_is_nan(u32 x) { return (x & 0x7fffffffu) > 0x7f800000u; }
/// A float result's bits, any NaN as the canonical one.
DB_FN u32 isa_fres(float r) {
    u32 u = isa_bits(r);
    return isa_is_nan(u) ? ISA_CANONICAL_NAN : u;
}
DB_FN u32 isa_fadd(u32 a, u32 b) { return isa_fres(isa_fadd_(isa_f(a), isa_f(b))); }
DB_FN u32 isa_fsub(u32 a, u32 b) { return isa_fres(isa_fsub_(isa_f(a), isa_f(b))); }
DB_FN u32 isa_fmul(u32 a, u32 b) { return isa_fres(isa_fmul_(isa_f(a), isa_f(b))); }
DB_FN u32 isa_fdiv(u32 a, u32 b) { return isa_fres(isa_fdiv_(isa_f(a), isa_f(b))); }
DB_FN u32 isa_ffma(u32 a, u32 b, u32 c) { return isa_fres(isa_fma_(isa_f(a), isa_f(b), isa_f(c))); }
DB_FN u32 isa_fsqrt(u32 a) { return isa_fres(isa_fsqrt_(isa_f(a))); }
/// f32::min: a NaN operand loses; equal operands (+0, -0) give the first.
DB_FN u32 isa_fmin(u32 a, u32 b) {
    if (isa_is_nan(a)) return isa_is_nan(b) ? ISA_CANONICAL_NAN : b;
    if (isa_is_nan(b)) return a;
    return isa_f(b) < isa_f(a) ? b : a;
}
/// f32::max: a NaN operand loses; equal operands (+0, -0) give the first.
DB_FN u32 isa_fmax(u32 a, u32 b) {
    if (isa_is_nan(a)) return isa_is_nan(b) ? ISA_CANONICAL_NAN : b;
    if (isa_is_nan(b)) return a;
    return isa_f(b) > isa_f(a) ? b : a;
}
DB_FN u32 isa_feq(u32 a, u32 b) { return isa_f(a) == isa_f(b) ? 1u : 0u; }
DB_FN u32 isa_flt(u32 a, u32 b) { return isa_f(a) < isa_f(b) ? 1u : 0u; }
DB_FN u32 isa_fle(u32 a, u32 b) { return isa_f(a) <= isa_f(b) ? 1u : 0u; }
/// `f as u32`: truncates toward zero, saturates, NaN → 0.
DB_FN u32 isa_cvt_u32_f32(u32 a) {
    float x = isa_f(a);
    if (isa_is_nan(a) || !(x >= 1.0f)) return 0;
    if (x >= 4294967296.0f) return 0xffffffffu;
    return (u32)x;
}
/// `f as i32`: truncates toward zero, saturates, NaN → 0.
DB_FN u32 isa_cvt_i32_f32(u32 a) {
    float x = isa_f(a);
    if (isa_is_nan(a)) return 0;
    if (x >= 2147483648.0f) return 0x7fffffffu;
    if (x <= -2147483648.0f) return 0x80000000u;
    if (x > -1.0f && x < 1.0f) return 0;
    return (u32)(i32)x;
}
DB_FN u32 isa_mulhi(u32 a, u32 b) { return (u32)(((u64)a * (u64)b) >> 32); }
DB_FN u32 isa_divu(u32 a, u32 b) { return b == 0 ? 0xffffffffu : a / b; }
DB_FN u32 isa_remu(u32 a, u32 b) { return b == 0 ? a : a % b; }
DB_FN u32 isa_divs(u32 a, u32 b) {
    if (b == 0) return 0xffffffffu;
    if (a == 0x80000000u && b == 0xffffffffu) return 0x80000000u;
    return (u32)((i32)a / (i32)b);
}
DB_FN u32 isa_rems(u32 a, u32 b) {
    if (b == 0) return a;
    if (a == 0x80000000u && b == 0xffffffffu) return 0;
    return (u32)((i32)a % (i32)b);
}
DB_FN u32 isa_sra(u32 a, u32 b) {
    u32 s = b & 31u;
    // Arithmetic shift written out (no reliance on signed right shift).
    return (a & 0x80000000u) ? ~(~a >> s) : a >> s;
}
DB_FN u32 isa_lt_s(u32 a, u32 b) { return (i32)a < (i32)b ? 1u : 0u; }
DB_FN u32 isa_le_s(u32 a, u32 b) { return (i32)a <= (i32)b ? 1u : 0u; }

// ---------------------------------------------------------------------------------------
// Memory helpers
// ---------------------------------------------------------------------------------------

/// A u32 at any alignment (a kernel binary may sit at any VA).
DB_FN u32 isa_ld32_any(const u8* p) {
    if (((u64)p & 3u) == 0) return rd32(p);
    const volatile u8* b = (const volatile u8*)p;
    return (u32)b[0] | (u32)b[1] << 8 | (u32)b[2] << 16 | (u32)b[3] << 24;
}
DB_FN u64 isa_ld64_any(const u8* p) {
    if (((u64)p & 7u) == 0) return rd64(p);
    return (u64)isa_ld32_any(p) | (u64)isa_ld32_any(p + 4) << 32;
}
/// The device address of one lane's access (gpu::compute's Mem::resolve: alignment, then the
/// mappings). An atomic also needs its backing word 4-aligned (shm's atomic_u32), else it is
/// outside the mappings, as in Rust; backing regions start on a page, so that is the device
/// address's alignment.
DB_FN u8* isa_translate_lane(const VmView* vm, u64 va, u64 bytes, u32 access, bool atomic, Fault* f) {
    u8* p = vm_translate_aligned(vm, va, bytes, access, f);
    if (p && atomic && ((u64)p & 3u)) {
        fault_outside(f, va, 4, ACCESS_WRITE);
        return 0;
    }
    return p;
}
/// A u64 of the save area (4-aligned), as two halves.
DB_FN u64 isa_rd64h(const u8* p) { return (u64)rd32(p) | (u64)rd32(p + 4) << 32; }
DB_FN void isa_wr64h(u8* p, u64 x) {
    wr32(p, (u32)x);
    wr32(p + 4, (u32)(x >> 32));
}

// ---------------------------------------------------------------------------------------
// Dispatch::start: check_dims, Program::load, validate
// ---------------------------------------------------------------------------------------

/// abi::isa::check_dims; on failure sets BadDispatch.
DB_FN bool isa_check_dims(const u32* grid, const u32* group, Fault* f) {
    if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0) return fault_why(f, FK_BAD_DISPATCH, S_GRID_ZERO);
    if (group[0] == 0 || group[1] == 0 || group[2] == 0) return fault_why(f, FK_BAD_DISPATCH, S_GROUP_ZERO);
    // Two u32 factors never overflow a u64; the third is compared by division (g * x > L
    // exactly when x > L / g, in integers), so no product wraps.
    u64 t = (u64)group[0] * group[1];
    if (t > 1024u || group[2] > 1024u / t) return fault_why(f, FK_BAD_DISPATCH, S_GROUP_TOO_BIG);
    u64 g = (u64)grid[0] * grid[1];
    if (g > (1ull << 40) || grid[2] > (1ull << 40) / g) return fault_why(f, FK_BAD_DISPATCH, S_GRID_TOO_BIG);
    return true;
}

/// An open IF or LOOP while validating. Of a LOOP's BREAKs only two are kept: the first, and
/// the first whose target differs from the first's (what the Rust pass reports at ENDLOOP is
/// the first BREAK whose target is not that ENDLOOP: one of these two).
struct IsaOpen {
    u32 loop, start, target;
    u32 has_else, else_pc, else_t;
    u32 nbreak, b1_pc, b1_t;
    u32 has_diff, bd_pc, bd_t;
};

/// abi::isa::validate over `n` (1..=ISA_MAX_INSTRUCTIONS) words; sets BadProgram on failure.
DB_SLOW bool isa_validate(const u64* prog, u32 n, Fault* f) {
    IsaOpen open[ISA_MAX_NESTING];
    u32 depth = 0;
    for (u32 pc = 0; pc < n; ++pc) {
        u64 w = prog[pc];
        u32 op = (u32)(w & 0xffu);
        u32 fd = (u32)(w >> 8) & 63u, fa = (u32)(w >> 14) & 63u, fb = (u32)(w >> 20) & 63u;
        u32 fc = (u32)(w >> 26) & 63u, imm = (u32)(w >> 32);
        u32 form = isa_form(op);
        if (form == ISA_F_UNKNOWN) return fault_kernel(f, pc, KE_UNKNOWN_OPCODE, op, 0);
        // check_fields: unused fields are 0 (in the order d, a, b, c, imm), then ranges.
        u32 used = isa_used_fields(form, fc);
        if (!(used & ISA_USE_D) && fd) return fault_kernel(f, pc, KE_UNUSED_FIELD, fd, S_D);
        if (!(used & ISA_USE_A) && fa) return fault_kernel(f, pc, KE_UNUSED_FIELD, fa, S_A);
        if (!(used & ISA_USE_B) && fb) return fault_kernel(f, pc, KE_UNUSED_FIELD, fb, S_B);
        if (!(used & ISA_USE_C) && fc) return fault_kernel(f, pc, KE_UNUSED_FIELD, fc, S_C);
        if (!(used & ISA_USE_IMM) && imm) return fault_kernel(f, pc, KE_UNUSED_FIELD, imm, S_IMM);
        switch (form) {
        case ISA_F_BUILTIN:
            if (imm >= 14u) return fault_kernel(f, pc, KE_BAD_BUILTIN, imm, 0);
            break;
        case ISA_F_SCALAR_ARG: case ISA_F_SCALAR_IMM:
            if (fd >= ISA_SREGS) return fault_kernel(f, pc, KE_BAD_REGISTER, fd, S_D);
            break;
        case ISA_F_SCALAR_ADD:
            if (fd >= ISA_SREGS) return fault_kernel(f, pc, KE_BAD_REGISTER, fd, S_D);
            if (fa >= ISA_SREGS) return fault_kernel(f, pc, KE_BAD_REGISTER, fa, S_A);
            break;
        case ISA_F_FROM_SCALAR:
            if (fa >= ISA_SREGS) return fault_kernel(f, pc, KE_BAD_REGISTER, fa, S_A);
            break;
        case ISA_F_LOAD: case ISA_F_STORE: case ISA_F_ATOMIC: {
            u32 pair = (op == ISA_OP_LD64 || op == ISA_OP_ST64) ? 1u : 0u;
            if (fd >= ISA_VREGS - pair) return fault_kernel(f, pc, KE_BAD_REGISTER, fd, S_D);
            if (fa >= ISA_SREGS) return fault_kernel(f, pc, KE_BAD_REGISTER, fa, S_A);
            break;
        }
        default: break;
        }
        // Structure.
        switch (op) {
        case ISA_OP_IF: case ISA_OP_LOOP: {
            if (depth == ISA_MAX_NESTING) return fault_kernel(f, pc, KE_TOO_DEEP, 0, 0);
            IsaOpen* o = &open[depth++];
            o->loop = op == ISA_OP_LOOP;
            o->start = pc;
            o->target = imm;
            o->has_else = 0; o->else_pc = 0; o->else_t = 0;
            o->nbreak = 0; o->b1_pc = 0; o->b1_t = 0;
            o->has_diff = 0; o->bd_pc = 0; o->bd_t = 0;
            break;
        }
        case ISA_OP_ELSE: {
            if (depth == 0 || open[depth - 1].loop || open[depth - 1].has_else)
                return fault_kernel(f, pc, KE_UNBALANCED, 0, S_ELSE_WITHOUT_IF);
            IsaOpen* o = &open[depth - 1];
            o->has_else = 1; o->else_pc = pc; o->else_t = imm;
            break;
        }
        case ISA_OP_ENDIF: {
            if (depth == 0 || open[depth - 1].loop) return fault_kernel(f, pc, KE_UNBALANCED, 0, S_ENDIF_WITHOUT_IF);
            IsaOpen* o = &open[--depth];
            u32 want = o->has_else ? o->else_pc : pc;
            if (o->target != want) return fault_kernel(f, o->start, KE_BAD_TARGET, o->target, 0);
            if (o->has_else && o->else_t != pc) return fault_kernel(f, o->else_pc, KE_BAD_TARGET, o->else_t, 0);
            break;
        }
        case ISA_OP_BREAK: {
            u32 k = depth;
            while (k > 0 && !open[k - 1].loop) --k;
            if (k == 0) return fault_kernel(f, pc, KE_UNBALANCED, 0, S_BREAK_OUTSIDE_LOOP);
            IsaOpen* o = &open[k - 1];
            if (!o->nbreak) {
                o->nbreak = 1; o->b1_pc = pc; o->b1_t = imm;
            } else if (!o->has_diff && imm != o->b1_t) {
                o->has_diff = 1; o->bd_pc = pc; o->bd_t = imm;
            }
            break;
        }
        case ISA_OP_ENDLOOP: {
            if (depth == 0 || !open[depth - 1].loop) return fault_kernel(f, pc, KE_UNBALANCED, 0, S_ENDLOOP_WITHOUT_LOOP);
            IsaOpen* o = &open[--depth];
            if (o->target != pc) return fault_kernel(f, o->start, KE_BAD_TARGET, o->target, 0);
            if (imm != o->start) return fault_kernel(f, pc, KE_BAD_TARGET, imm, 0);
            if (o->nbreak) {
                if (o->b1_t != pc) return fault_kernel(f, o->b1_pc, KE_BAD_TARGET, o->b1_t, 0);
                if (o->has_diff) return fault_kernel(f, o->bd_pc, KE_BAD_TARGET, o->bd_t, 0);
            }
            break;
        }
        default: break;
        }
    }
    if (depth > 0) {
        const IsaOpen* o = &open[depth - 1];
        return fault_kernel(f, o->start, KE_UNBALANCED, 0, o->loop ? S_LOOP_WITHOUT_ENDLOOP : S_IF_WITHOUT_ENDIF);
    }
    return true;
}

/// Program::load: the header through vm, its checks, the body copied into `prog` (each lane a
/// share of the words) and validated. Returns the instruction count, 0 on a fault.
DB_SLOW u32 isa_load(const VmView* vm, u64* prog, u64 kernel, Fault* f) {
    const u8* h = vm_translate(vm, kernel, 32, ACCESS_READ, f);
    if (!h) return 0;
    // The Rust loader reads the header as 4-aligned words of the backing region and refuses
    // (as outside the mappings) a header whose backing offset is not 4-aligned. Backing
    // regions start on a page, so that is the device address's alignment.
    if ((u64)h & 3u) {
        fault_outside(f, kernel, 32, ACCESS_READ);
        return 0;
    }
    u32 hw[8];
    for (u32 i = 0; i < 8; ++i) hw[i] = isa_ld32_any(h + 4 * i);
    u32 n = hw[2];
    bool ok = true;
    if (hw[0] != ISA_KERNEL_MAGIC) ok = fault_kernel(f, 0, KE_BAD_MAGIC, hw[0], 0);
    else if (hw[1] != ISA_VERSION) ok = fault_kernel(f, 0, KE_BAD_VERSION, hw[1], 0);
    else if (n == 0 || n > ISA_MAX_INSTRUCTIONS) ok = fault_kernel(f, 0, KE_BAD_LENGTH, n, 0);
    else if (hw[3] | hw[4] | hw[5] | hw[6] | hw[7]) ok = fault_kernel(f, 0, KE_RESERVED, 0, 0);
    if (!ok) return 0;
    const u8* body = vm_translate(vm, kernel + 32u, (u64)n * 8u, ACCESS_READ, f);
    if (!body) return 0;
    // Copied once, then validated and run from the copy: a client rewriting its binary during
    // the dispatch changes nothing.
    LANES(l) {
        for (u32 j = l; j < n; j += WAVE) prog[j] = isa_ld64_any(body + (u64)j * 8u);
    }
    wave_sync();
    if (!isa_validate(prog, n, f)) return 0;
    return n;
}

/// Dispatch::start (width 32): check_dims, then Program::load through `vm` into `prog`
/// (ISA_MAX_INSTRUCTIONS words). Returns false with *f set on a fault.
DB_SLOW bool isa_start(IsaDispatch* d, const VmView* vm, u64* prog, u64 kernel, const u32* grid, const u32* group,
                       u64 args, Fault* f) {
    if (!isa_check_dims(grid, group, f)) return false;
    u32 n = isa_load(vm, prog, kernel, f);
    if (n == 0) return false;
    d->kernel = kernel;
    for (u32 i = 0; i < 3; ++i) {
        d->grid[i] = grid[i];
        d->group[i] = group[i];
    }
    d->args = args;
    d->next_group = 0;
    d->has_wave = 0;
    d->ninst = n;
    return true;
}

// ---------------------------------------------------------------------------------------
// Dispatch::run_to
// ---------------------------------------------------------------------------------------

/// Threads in a workgroup (at most 1024 once check_dims passed).
DB_FN u64 isa_group_threads(const IsaDispatch* d) { return (u64)d->group[0] * d->group[1] * d->group[2]; }
DB_FN u64 isa_total_groups(const IsaDispatch* d) { return (u64)d->grid[0] * d->grid[1] * d->grid[2]; }
DB_FN u32 isa_waves_per_group(const IsaDispatch* d) { return (u32)((isa_group_threads(d) + WAVE - 1u) / WAVE); }
/// The live mask of wave `index` of a group of `threads` threads.
DB_FN u64 isa_live(u64 threads, u32 index) {
    u64 first = (u64)index * WAVE;
    u64 n = threads - first;
    return n >= WAVE ? (u64)ALL_LANES : (1ull << n) - 1u;
}
/// Registers start at 0 for every new wave.
DB_FN void isa_zero_regs(u32* v) {
    LANES(l) {
        for (u32 r = 0; r < ISA_VREGS; ++r) v[r * WAVE + l] = 0;
    }
}
/// Lanes that left an enclosing loop with BREAK.
DB_FN u64 isa_broken(const IsaFrame* stack, u32 depth) {
    u64 m = 0;
    for (u32 i = 0; i < depth; ++i)
        if (stack[i].kind == 1u) m |= stack[i].m;
    return m;
}

/// Dispatch::run_to: at most `budget` wave-instructions; `stop` is 0, SP_WAVE or SP_GROUP
/// (any other value: no stop). Adds to *st. On ISA_STOPPED, *stopped_at is SP_WAVE or
/// SP_GROUP; on ISA_FAULT, *f is set (and the wave is dropped, as in Rust).
DB_SLOW u32 isa_run(IsaDispatch* d, IsaMem* m, u64 budget, u32 stop, u32* stopped_at, IsaStats* st, Fault* f) {
    const VmView* vm = &m->vm;
    const u64* prog = m->prog;
    u32* v = m->v;
    const u64 total = isa_total_groups(d);
    const u64 threads = isa_group_threads(d);
    const u32 wpg = isa_waves_per_group(d);
    const u32 ninst = d->ninst;
    const u64 args = d->args;
    const u64 grid0 = d->grid[0], grid1 = d->grid[1];
    const u64 group0 = d->group[0], group1 = d->group[1];
    const u64 grid2 = d->grid[2], group2 = d->group[2];
    u64 next_group = d->next_group;
    u32 has = d->has_wave;
    u64 left = budget, n_inst = 0, n_lane = 0;
    u32 result = ISA_DONE, sp = 0;

    // The wave, in locals.
    u64 group = 0, live = 0, exec = 0, exited = 0, brk = 0;
    u32 index = 0, pc = 0, depth = 0;
    IsaFrame stack[ISA_STACK_FRAMES];
    u64 s[ISA_SREGS];
    if (has) {
        const IsaWave* w = &d->wave;
        group = w->group; index = w->index; pc = w->pc;
        live = w->live; exec = w->exec; exited = w->exited;
        depth = w->depth;
        for (u32 i = 0; i < depth; ++i) stack[i] = w->stack[i];
        for (u32 i = 0; i < ISA_SREGS; ++i) s[i] = w->s[i];
    }

    for (;;) {
        if (!has) {
            if (next_group >= total) { result = ISA_DONE; break; }
            group = next_group; index = 0; pc = 0;
            live = exec = isa_live(threads, 0); exited = 0; depth = 0;
            for (u32 i = 0; i < ISA_SREGS; ++i) s[i] = 0;
            isa_zero_regs(v);
            has = 1;
        }
        brk = isa_broken(stack, depth);
        // run_wave
        while (left > 0 && pc < ninst && (live & ~exited) != 0) {
            const u64 w = prog[pc];
            const u32 ipc = pc;
            ++pc;
            --left;
            ++n_inst;
            const u32 op = (u32)(w & 0xffu);
            if (exec == 0 && !isa_is_structure(op)) continue;
            n_lane += popc64(exec);
            const u32 rd = (u32)(w >> 8) & 63u, ra = (u32)(w >> 14) & 63u, rb = (u32)(w >> 20) & 63u;
            const u32 rc = (u32)(w >> 26) & 63u, imm = (u32)(w >> 32);
            const bool useimm = rc == 1u;
            // Lanes a vector write reaches: all 32 when every live lane runs (Rust's in-place
            // path writes the whole row), else the active ones.
            const u32 wm = exec == live ? ALL_LANES : (u32)exec;
            u32* const pd = v + rd * WAVE;
            const u32* const pa = v + ra * WAVE;
            const u32* const pb = v + rb * WAVE;
            const u32* const pc3 = v + rc * WAVE;

#define ISA_BIN(EXPR)                                                                         \
    LANES(l) {                                                                                \
        if (wm >> l & 1u) {                                                                   \
            const u32 x = pa[l];                                                              \
            const u32 y = useimm ? imm : pb[l];                                               \
            (void)x; (void)y;                                                                 \
            pd[l] = (EXPR);                                                                   \
        }                                                                                     \
    }                                                                                         \
    break;
#define ISA_UN(EXPR)                                                                          \
    LANES(l) {                                                                                \
        if (wm >> l & 1u) {                                                                   \
            const u32 x = useimm ? imm : pa[l];                                               \
            pd[l] = (EXPR);                                                                   \
        }                                                                                     \
    }                                                                                         \
    break;
#define ISA_TERN(EXPR)                                                                        \
    LANES(l) {                                                                                \
        if (wm >> l & 1u) {                                                                   \
            const u32 x = pa[l], y = pb[l], z = pc3[l];                                       \
            (void)x; (void)y; (void)z;                                                        \
            pd[l] = (EXPR);                                                                   \
        }                                                                                     \
    }                                                                                         \
    break;
#define ISA_MISMATCH()                                                                        \
    {                                                                                         \
        fault_why(f, FK_BAD_SAVE_AREA, S_STACK_MISMATCH);                                     \
        goto fault;                                                                           \
    }

            switch (op) {
            case ISA_OP_NOP: break;
            case ISA_OP_ADD: ISA_BIN(x + y)
            case ISA_OP_SUB: ISA_BIN(x - y)
            case ISA_OP_MUL: ISA_BIN(x * y)
            case ISA_OP_MULHI_U: ISA_BIN(isa_mulhi(x, y))
            case ISA_OP_DIV_U: ISA_BIN(isa_divu(x, y))
            case ISA_OP_DIV_S: ISA_BIN(isa_divs(x, y))
            case ISA_OP_REM_U: ISA_BIN(isa_remu(x, y))
            case ISA_OP_REM_S: ISA_BIN(isa_rems(x, y))
            case ISA_OP_AND: ISA_BIN(x & y)
            case ISA_OP_OR: ISA_BIN(x | y)
            case ISA_OP_XOR: ISA_BIN(x ^ y)
            case ISA_OP_SHL: ISA_BIN(x << (y & 31u))
            case ISA_OP_SHR: ISA_BIN(x >> (y & 31u))
            case ISA_OP_SRA: ISA_BIN(isa_sra(x, y))
            case ISA_OP_MIN_U: ISA_BIN(x < y ? x : y)
            case ISA_OP_MAX_U: ISA_BIN(x > y ? x : y)
            case ISA_OP_MIN_S: ISA_BIN(isa_lt_s(y, x) ? y : x)
            case ISA_OP_MAX_S: ISA_BIN(isa_lt_s(x, y) ? y : x)
            case ISA_OP_FADD: ISA_BIN(isa_fadd(x, y))
            case ISA_OP_FSUB: ISA_BIN(isa_fsub(x, y))
            case ISA_OP_FMUL: ISA_BIN(isa_fmul(x, y))
            case ISA_OP_FDIV: ISA_BIN(isa_fdiv(x, y))
            case ISA_OP_FMIN: ISA_BIN(isa_fmin(x, y))
            case ISA_OP_FMAX: ISA_BIN(isa_fmax(x, y))
            case ISA_OP_FFMA: ISA_TERN(isa_ffma(x, y, z))
            case ISA_OP_MOV: ISA_UN(x)
            case ISA_OP_NOT: ISA_UN(~x)
            case ISA_OP_CVT_F32_U32: ISA_UN(isa_bits(isa_u2f(x)))
            case ISA_OP_CVT_F32_I32: ISA_UN(isa_bits(isa_i2f((i32)x)))
            case ISA_OP_CVT_U32_F32: ISA_UN(isa_cvt_u32_f32(x))
            case ISA_OP_CVT_I32_F32: ISA_UN(isa_cvt_i32_f32(x))
            case ISA_OP_FSQRT: ISA_UN(isa_fsqrt(x))
            case ISA_OP_CMP_EQ: ISA_BIN(x == y ? 1u : 0u)
            case ISA_OP_CMP_NE: ISA_BIN(x != y ? 1u : 0u)
            case ISA_OP_CMP_LT_U: ISA_BIN(x < y ? 1u : 0u)
            case ISA_OP_CMP_LE_U: ISA_BIN(x <= y ? 1u : 0u)
            case ISA_OP_CMP_LT_S: ISA_BIN(isa_lt_s(x, y))
            case ISA_OP_CMP_LE_S: ISA_BIN(isa_le_s(x, y))
            case ISA_OP_FCMP_EQ: ISA_BIN(isa_feq(x, y))
            case ISA_OP_FCMP_LT: ISA_BIN(isa_flt(x, y))
            case ISA_OP_FCMP_LE: ISA_BIN(isa_fle(x, y))
            case ISA_OP_SEL: ISA_TERN(x != 0 ? y : z)
            case ISA_OP_BUILTIN: {
                const u64 gid0 = group % grid0, gid1 = (group / grid0) % grid1, gid2 = group / (grid0 * grid1);
                u32 uni = 0;
                switch (imm) {
                case 0: uni = (u32)gid0; break;
                case 1: uni = (u32)gid1; break;
                case 2: uni = (u32)gid2; break;
                case 6: uni = (u32)group0; break;
                case 7: uni = (u32)group1; break;
                case 8: uni = (u32)group2; break;
                case 9: uni = (u32)grid0; break;
                case 10: uni = (u32)grid1; break;
                case 11: uni = (u32)grid2; break;
                default: break;
                }
                LANES(l) {
                    if (wm >> l & 1u) {
                        const u64 t = (u64)index * WAVE + l;
                        u32 r = uni;
                        switch (imm) {
                        case 3: r = (u32)(t % group0); break;
                        case 4: r = (u32)((t / group0) % group1); break;
                        case 5: r = (u32)(t / (group0 * group1)); break;
                        case 12: r = (u32)(gid0 * group0 + t % group0); break;
                        case 13: r = (u32)t; break;
                        default: break;
                        }
                        pd[l] = r;
                    }
                }
                break;
            }
            case ISA_OP_SARG: {
                const u8* p = vm_translate_aligned(vm, args + (u64)imm * 8u, 8, ACCESS_READ, f);
                if (!p) {
                    fault_in_kernel(f, ipc);
                    goto fault;
                }
                s[rd] = rd64(p);
                break;
            }
            case ISA_OP_SMOV: s[rd] = imm; break;
            case ISA_OP_SADD: s[rd] = s[ra] + (u64)(i64)(i32)imm; break;
            case ISA_OP_VFROMS: case ISA_OP_VFROMS_HI: {
                const u32 x = op == ISA_OP_VFROMS ? (u32)s[ra] : (u32)(s[ra] >> 32);
                LANES(l) {
                    if (wm >> l & 1u) pd[l] = x;
                }
                break;
            }
            case ISA_OP_LD32: case ISA_OP_LD64: case ISA_OP_ST32: case ISA_OP_ST64: case ISA_OP_ATOM_ADD: {
                const u64 bytes = (op == ISA_OP_LD64 || op == ISA_OP_ST64) ? 8u : 4u;
                const u32 access = (op == ISA_OP_LD32 || op == ISA_OP_LD64) ? ACCESS_READ : ACCESS_WRITE;
                const u64 base = s[ra] + (u64)imm;
                const u32 ex = (u32)exec;
                // 1. Every active lane translates; the lowest faulting lane bounds the lanes
                //    that access memory (lane order, as in Rust).
                ISA_LANE_VAR(u8*, ptr);
                ISA_LANE_VAR(u64, vaddr);
                u32 fbits = 0;
                LANES(l) {
                    u8* p = 0;
                    const u64 va = base + (u64)pb[l];
                    if (ex >> l & 1u) {
                        Fault lf;
                        p = isa_translate_lane(vm, va, bytes, access, op == ISA_OP_ATOM_ADD, &lf);
                        if (!p) fbits |= 1u << l;
                    }
                    ISA_AT(ptr, l) = p;
                    ISA_AT(vaddr, l) = va;
                }
                fbits = wave_or(fbits);
                const u32 first = fbits ? lowest_bit(fbits) : WAVE;
                const u32 doing = ex & (first == WAVE ? ALL_LANES : (1u << first) - 1u);
                // 2. The accesses of the lanes below it.
                switch (op) {
                case ISA_OP_LD32:
                    LANES(l) {
                        if (doing >> l & 1u) pd[l] = rd32(ISA_AT(ptr, l));
                    }
                    break;
                case ISA_OP_LD64:
                    LANES(l) {
                        if (doing >> l & 1u) {
                            const u64 x = rd64(ISA_AT(ptr, l));
                            pd[l] = (u32)x;
                            pd[WAVE + l] = (u32)(x >> 32);
                        }
                    }
                    break;
                case ISA_OP_ST32: case ISA_OP_ST64:
                    // Of the lanes storing to one address, the highest wins.
                    LANES(l) {
                        u8* p = ISA_AT(ptr, l);
                        const u32 grp = isa_match((u64)p, l) & doing;
                        if ((doing >> l & 1u) && (grp >> l) == 1u) {
                            if (op == ISA_OP_ST32) wr32(p, pd[l]);
                            else wr64(p, (u64)pd[l] | (u64)pd[WAVE + l] << 32);
                        }
                    }
                    break;
                default: // ISA_OP_ATOM_ADD
                    // One atomic per address; each lane gets the running value in lane order.
                    LANES(l) {
                        u8* p = ISA_AT(ptr, l);
                        const u32 val = pc3[l];
                        const u32 grp = isa_match((u64)p, l) & doing;
                        u32 pre, sum;
                        isa_group_scan(val, grp, doing, l, &pre, &sum);
                        const u32 leader = grp ? lowest_bit(grp) : l;
                        u32 old = 0;
                        if ((doing >> l & 1u) && leader == l) old = atomic_add32((u32*)p, sum);
                        old = isa_shfl32(old, leader);
                        if (doing >> l & 1u) pd[l] = old + pre;
                    }
                    break;
                }
                // 3. The first faulting lane's fault.
                if (first != WAVE) {
                    u64 va = 0;
                    LANES(l) {
                        if (l == first) va = ISA_AT(vaddr, l);
                    }
                    va = wave_bcast64(va, first);
                    isa_translate_lane(vm, va, bytes, access, op == ISA_OP_ATOM_ADD, f);
                    fault_in_kernel(f, ipc);
                    goto fault;
                }
                break;
            }
            case ISA_OP_IF: {
                u32 cm = 0;
                LANES(l) {
                    if (pa[l] != 0) cm |= 1u << l;
                }
                const u64 cond = (u64)wave_or(cm) & exec;
                if (depth == ISA_STACK_FRAMES) ISA_MISMATCH();
                IsaFrame* fr = &stack[depth++];
                fr->kind = 0; fr->start = 0; fr->outer = exec; fr->m = exec & ~cond;
                exec = cond;
                if (cond == 0) pc = imm;
                break;
            }
            case ISA_OP_ELSE: {
                if (depth == 0 || stack[depth - 1].kind != 0) ISA_MISMATCH();
                IsaFrame* fr = &stack[depth - 1];
                exec = fr->m & ~(exited | brk);
                fr->m = 0;
                if (exec == 0) pc = imm;
                break;
            }
            case ISA_OP_ENDIF:
                if (depth == 0 || stack[depth - 1].kind != 0) ISA_MISMATCH();
                --depth;
                exec = stack[depth].outer & ~(exited | brk);
                break;
            case ISA_OP_LOOP: {
                if (depth == ISA_STACK_FRAMES) ISA_MISMATCH();
                IsaFrame* fr = &stack[depth++];
                fr->kind = 1; fr->start = pc; fr->outer = exec; fr->m = 0;
                if (exec == 0) pc = imm;
                break;
            }
            case ISA_OP_BREAK: {
                u32 cm = 0;
                LANES(l) {
                    if (pa[l] != 0) cm |= 1u << l;
                }
                const u64 leaving = (u64)wave_or(cm) & exec;
                exec &= ~leaving;
                u32 k = depth;
                while (k > 0 && stack[k - 1].kind != 1u) --k;
                if (k == 0) ISA_MISMATCH();
                stack[k - 1].m |= leaving;
                brk |= leaving;
                // Every lane has left the loop: skip to its end, dropping inner frames.
                if ((stack[k - 1].outer & ~(exited | brk)) == 0) {
                    depth = k;
                    exec = 0;
                    pc = imm;
                }
                break;
            }
            case ISA_OP_ENDLOOP: {
                if (depth == 0 || stack[depth - 1].kind != 1u) ISA_MISMATCH();
                const IsaFrame* fr = &stack[depth - 1];
                const u64 still = fr->outer & ~(exited | brk);
                if (still != 0) {
                    exec = still;
                    pc = fr->start;
                } else {
                    --depth;
                    brk = isa_broken(stack, depth);
                    exec = stack[depth].outer & ~(exited | brk);
                }
                break;
            }
            case ISA_OP_EXIT:
                exited |= exec;
                exec = 0;
                break;
            default: break; // validated: unreachable
            }
#undef ISA_BIN
#undef ISA_UN
#undef ISA_TERN
#undef ISA_MISMATCH
        }
        if (pc >= ninst || (live & ~exited) == 0) {
            // The wave ended.
            has = 0;
            const bool done = group + 1 >= total;
            if (index + 1 < wpg) {
                index += 1;
                pc = 0;
                live = exec = isa_live(threads, index); exited = 0; depth = 0;
                for (u32 i = 0; i < ISA_SREGS; ++i) s[i] = 0;
                isa_zero_regs(v);
                has = 1;
                if (stop == SP_WAVE) { sp = SP_WAVE; result = ISA_STOPPED; break; }
            } else {
                next_group = group + 1;
                if (!done && (stop == SP_WAVE || stop == SP_GROUP)) { sp = SP_GROUP; result = ISA_STOPPED; break; }
            }
        }
        if (left == 0) {
            result = (!has && next_group >= total) ? ISA_DONE : ISA_YIELD;
            break;
        }
    }
    goto out;
fault:
    has = 0; // the wave is dropped, as Rust's run_to drops it
    result = ISA_FAULT;
out: {
    d->next_group = next_group;
    d->has_wave = has;
    IsaWave* w = &d->wave;
    w->group = group; w->index = index; w->pc = pc;
    w->live = live; w->exec = exec; w->exited = exited;
    w->depth = depth; w->pad = 0;
    for (u32 i = 0; i < depth; ++i) w->stack[i] = stack[i];
    for (u32 i = 0; i < ISA_SREGS; ++i) w->s[i] = s[i];
    st->instructions += n_inst;
    st->lane_ops += n_lane;
    if (result == ISA_STOPPED) *stopped_at = sp;
    return result;
}
}

// ---------------------------------------------------------------------------------------
// Dispatch::save / Dispatch::restore
// ---------------------------------------------------------------------------------------

#define ISA_SAVE_HEADER_BYTES 64u
#define ISA_SAVE_WAVE_BYTES 44u
#define ISA_SAVE_FRAME_BYTES 24u

/// Bytes isa_save writes for `d`.
DB_FN u64 isa_save_bytes(const IsaDispatch* d) {
    if (!d->has_wave) return ISA_SAVE_HEADER_BYTES;
    return ISA_SAVE_HEADER_BYTES + ISA_SAVE_WAVE_BYTES + (u64)d->wave.depth * ISA_SAVE_FRAME_BYTES + ISA_SREGS * 8u +
           ISA_VREGS * WAVE * 4u;
}

/// Dispatch::save into area[0..area_bytes) (4-aligned): the Rust bytes for width 32. Uniform
/// fields are written by the wave leader; each lane writes its own register words.
DB_SLOW bool isa_save(const IsaDispatch* d, const u32* v, u8* area, u64 area_bytes, Fault* f) {
    const u64 bytes = isa_save_bytes(d);
    if (bytes > ISA_CONTEXT_SAVE_BYTES) return fault_why(f, FK_BAD_SAVE_AREA, S_STATE_TOO_LARGE);
    if (bytes > area_bytes) return fault_why(f, FK_BAD_SAVE_AREA, S_SAVE_OUT_OF_BOUNDS);
    const IsaWave* w = &d->wave;
    const u32 depth = d->has_wave ? w->depth : 0;
    if (wave_leader()) {
        wr32(area + 0, ISA_SAVE_MAGIC);
        wr32(area + 4, ISA_SAVE_VERSION);
        isa_wr64h(area + 8, d->kernel);
        for (u32 i = 0; i < 3; ++i) {
            wr32(area + 16 + 4 * i, d->grid[i]);
            wr32(area + 28 + 4 * i, d->group[i]);
        }
        isa_wr64h(area + 40, d->args);
        wr32(area + 48, WAVE);
        isa_wr64h(area + 52, d->next_group);
        wr32(area + 60, d->has_wave ? 1u : 0u);
        if (d->has_wave) {
            isa_wr64h(area + 64, w->group);
            wr32(area + 72, w->index);
            wr32(area + 76, w->pc);
            isa_wr64h(area + 80, w->live);
            isa_wr64h(area + 88, w->exec);
            isa_wr64h(area + 96, w->exited);
            wr32(area + 104, depth);
            u8* p = area + 108;
            for (u32 i = 0; i < depth; ++i, p += ISA_SAVE_FRAME_BYTES) {
                const IsaFrame* fr = &w->stack[i];
                wr32(p, fr->kind);
                isa_wr64h(p + 4, fr->outer);
                isa_wr64h(p + 12, fr->m);
                wr32(p + 20, fr->kind == 1u ? fr->start : 0u);
            }
            for (u32 i = 0; i < ISA_SREGS; ++i) isa_wr64h(p + 8 * i, w->s[i]);
        }
    }
    if (d->has_wave) {
        u8* regs = area + 108 + depth * ISA_SAVE_FRAME_BYTES + ISA_SREGS * 8u;
        LANES(l) {
            for (u32 r = 0; r < ISA_VREGS; ++r) wr32(regs + (r * WAVE + l) * 4u, v[r * WAVE + l]);
        }
    }
    return true;
}

/// Reads a save area field by field (gpu::compute's Reader): past ISA_CONTEXT_SAVE_BYTES is
/// "truncated", past the area "save area out of bounds".
struct IsaReader {
    const u8* a;
    u64 at;
    u64 n;
};
DB_FN bool isa_span(IsaReader* r, u64 bytes, u64* at, Fault* f) {
    if (r->at + bytes > ISA_CONTEXT_SAVE_BYTES) return fault_why(f, FK_BAD_SAVE_AREA, S_TRUNCATED);
    *at = r->at;
    r->at += bytes;
    if (*at + bytes > r->n) return fault_why(f, FK_BAD_SAVE_AREA, S_SAVE_OUT_OF_BOUNDS);
    return true;
}
DB_FN bool isa_take32(IsaReader* r, u32* x, Fault* f) {
    u64 at;
    if (!isa_span(r, 4, &at, f)) return false;
    *x = rd32(r->a + at);
    return true;
}
DB_FN bool isa_take64(IsaReader* r, u64* x, Fault* f) {
    u64 at;
    if (!isa_span(r, 8, &at, f)) return false;
    *x = isa_rd64h(r->a + at);
    return true;
}

/// Dispatch::restore (width 32) from area[0..area_bytes) (4-aligned): validates every field as
/// the Rust code does, in its order, and loads the program again from `vm` into `prog`.
DB_SLOW bool isa_restore(IsaDispatch* d, const VmView* vm, u64* prog, u32* v, const u8* area, u64 area_bytes,
                         Fault* f) {
    IsaReader r = {area, 0, area_bytes};
    u32 x;
    if (!isa_take32(&r, &x, f)) return false;
    if (x != ISA_SAVE_MAGIC) return fault_why(f, FK_BAD_SAVE_AREA, S_BAD_MAGIC_OR_VERSION);
    if (!isa_take32(&r, &x, f)) return false;
    if (x != ISA_SAVE_VERSION) return fault_why(f, FK_BAD_SAVE_AREA, S_BAD_MAGIC_OR_VERSION);
    u64 kernel, args;
    u32 dims[6];
    if (!isa_take64(&r, &kernel, f)) return false;
    for (u32 i = 0; i < 6; ++i)
        if (!isa_take32(&r, &dims[i], f)) return false;
    if (!isa_take64(&r, &args, f)) return false;
    if (!isa_take32(&r, &x, f)) return false;
    if (x != WAVE) return fault_why(f, FK_BAD_SAVE_AREA, S_OTHER_WAVE_WIDTH);
    if (!isa_start(d, vm, prog, kernel, dims, dims + 3, args, f)) return false;
    const u64 total = isa_total_groups(d);
    u64 next_group;
    if (!isa_take64(&r, &next_group, f)) return false;
    if (next_group > total) return fault_why(f, FK_BAD_SAVE_AREA, S_NEXT_GROUP_BEYOND);
    u32 flag;
    if (!isa_take32(&r, &flag, f)) return false;
    if (flag == 0) {
        d->next_group = next_group;
        return true;
    }
    if (flag != 1) return fault_why(f, FK_BAD_SAVE_AREA, S_BAD_WAVE_FLAG);
    u64 group;
    u32 index;
    if (!isa_take64(&r, &group, f)) return false;
    if (!isa_take32(&r, &index, f)) return false;
    if (group >= total || index >= isa_waves_per_group(d)) return fault_why(f, FK_BAD_SAVE_AREA, S_WAVE_OUTSIDE_GRID);
    const u64 want_live = isa_live(isa_group_threads(d), index);
    u32 pc;
    u64 live, exec, exited;
    if (!isa_take32(&r, &pc, f)) return false;
    if (!isa_take64(&r, &live, f) || !isa_take64(&r, &exec, f) || !isa_take64(&r, &exited, f)) return false;
    if (live != want_live || (exec & ~live) || (exited & ~live) || pc > d->ninst)
        return fault_why(f, FK_BAD_SAVE_AREA, S_WAVE_STATE_RANGE);
    u32 depth;
    if (!isa_take32(&r, &depth, f)) return false;
    if (depth > ISA_MAX_NESTING) return fault_why(f, FK_BAD_SAVE_AREA, S_STACK_TOO_DEEP);
    IsaWave* w = &d->wave;
    for (u32 i = 0; i < depth; ++i) {
        u32 kind, start;
        u64 outer, mm;
        if (!isa_take32(&r, &kind, f) || !isa_take64(&r, &outer, f) || !isa_take64(&r, &mm, f) ||
            !isa_take32(&r, &start, f))
            return false;
        if ((outer & ~live) || (mm & ~live) || start > d->ninst) return fault_why(f, FK_BAD_SAVE_AREA, S_FRAME_RANGE);
        if (kind > 1u) return fault_why(f, FK_BAD_SAVE_AREA, S_UNKNOWN_FRAME);
        w->stack[i].kind = kind;
        w->stack[i].start = kind == 1u ? start : 0u;
        w->stack[i].outer = outer;
        w->stack[i].m = mm;
    }
    for (u32 i = 0; i < ISA_SREGS; ++i) {
        u64 sv;
        if (!isa_take64(&r, &sv, f)) return false;
        w->s[i] = sv;
    }
    for (u32 reg = 0; reg < ISA_VREGS; ++reg) {
        u64 at;
        if (!isa_span(&r, WAVE * 4u, &at, f)) return false;
        LANES(l) { v[reg * WAVE + l] = rd32(area + at + 4u * l); }
    }
    d->next_group = next_group;
    d->has_wave = 1;
    w->group = group; w->index = index; w->pc = pc;
    w->live = live; w->exec = exec; w->exited = exited;
    w->depth = depth; w->pad = 0;
    return true;
}
