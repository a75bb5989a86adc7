// isa_check.cpp — extern "C" entry points through which CPU tests drive the ISA interpreter
// (isa.cuh) of the emulated build: crates/cuda/tests/isa_emulated.rs runs the same dispatches
// through these and through gpu::compute, and compares memory, faults and save-area bytes.
//
// A handle holds one dispatch with its own program cache and register file, and a copy of the
// address space's mappings (VmEntry, dev = a host address).
#include <stdlib.h>
#include <string.h>

#include "isa.cuh"

struct IsaCheck {
    VmEntry* maps;
    IsaMem mem;
    IsaDispatch d;
};

extern "C" IsaCheck* db_isa_check_new(const VmEntry* maps, u32 count) {
    IsaCheck* h = (IsaCheck*)calloc(1, sizeof(IsaCheck));
    if (!h) return 0;
    h->maps = (VmEntry*)calloc(count ? count : 1, sizeof(VmEntry));
    u64* prog = (u64*)calloc(ISA_MAX_INSTRUCTIONS, sizeof(u64));
    h->mem.v = (u32*)calloc(ISA_VREGS * WAVE, sizeof(u32));
    if (!h->maps || !prog || !h->mem.v) {
        free(h->maps);
        free(prog);
        free(h->mem.v);
        free(h);
        return 0;
    }
    if (count) memcpy(h->maps, maps, count * sizeof(VmEntry));
    h->mem.vm.e = h->maps;
    h->mem.vm.count = count;
    h->mem.vm.vmid = 1;
    h->mem.prog = prog;
    return h;
}

extern "C" void db_isa_check_free(IsaCheck* h) {
    if (!h) return;
    free(h->maps);
    free((void*)h->mem.prog);
    free(h->mem.v);
    free(h);
}

/// Overwrites the dispatch, the program cache and the register file with garbage: what a
/// restore must not depend on.
extern "C" void db_isa_check_wipe(IsaCheck* h, u32 pattern) {
    memset(&h->d, (int)(pattern & 0xff), sizeof(h->d));
    u32* v = h->mem.v;
    for (u32 i = 0; i < ISA_VREGS * WAVE; ++i) v[i] = pattern ^ (i * 0x9e3779b9u);
    u64* prog = (u64*)h->mem.prog;
    for (u32 i = 0; i < ISA_MAX_INSTRUCTIONS; ++i) prog[i] = 0xffffffffffffffffull ^ i;
}

/// isa_start; 1 on success, 0 with *f set.
extern "C" u32 db_isa_check_start(IsaCheck* h, u64 kernel, const u32* grid, const u32* group, u64 args, Fault* f) {
    fault_clear(f);
    return isa_start(&h->d, &h->mem.vm, (u64*)h->mem.prog, kernel, grid, group, args, f) ? 1u : 0u;
}

/// isa_run (an IsaResult); stats are added to *st.
extern "C" u32 db_isa_check_run(IsaCheck* h, u64 budget, u32 stop, u32* stopped_at, IsaStats* st, Fault* f) {
    fault_clear(f);
    *stopped_at = 0;
    return isa_run(&h->d, &h->mem, budget, stop, stopped_at, st, f);
}

/// isa_save into area[0..bytes); 1 on success, 0 with *f set.
extern "C" u32 db_isa_check_save(IsaCheck* h, u8* area, u64 bytes, Fault* f) {
    fault_clear(f);
    return isa_save(&h->d, h->mem.v, area, bytes, f) ? 1u : 0u;
}

/// Wipes the handle's state, then isa_restore from area[0..bytes); 1 on success, 0 with *f
/// set.
extern "C" u32 db_isa_check_restore(IsaCheck* h, const u8* area, u64 bytes, Fault* f) {
    fault_clear(f);
    db_isa_check_wipe(h, 0xa5a5a5a5u);
    return isa_restore(&h->d, &h->mem.vm, (u64*)h->mem.prog, h->mem.v, area, bytes, f) ? 1u : 0u;
}

/// isa_validate over words[0..n); 1 if valid, 0 with *f set.
extern "C" u32 db_isa_check_validate(const u64* words, u32 n, Fault* f) {
    fault_clear(f);
    if (n == 0 || n > ISA_MAX_INSTRUCTIONS) return fault_kernel(f, 0, KE_BAD_LENGTH, n, 0) ? 1u : 0u;
    return isa_validate(words, n, f) ? 1u : 0u;
}

/// The register file, v[r * 32 + lane] (ISA_VREGS * 32 words).
extern "C" void db_isa_check_regs(const IsaCheck* h, u32* out) {
    memcpy(out, h->mem.v, ISA_VREGS * WAVE * sizeof(u32));
}

/// sizeof(IsaDispatch), sizeof(Fault): the test checks its mirror of Fault.
extern "C" u64 db_isa_check_sizes(u64* fault_bytes) {
    *fault_bytes = sizeof(Fault);
    return sizeof(IsaDispatch);
}
