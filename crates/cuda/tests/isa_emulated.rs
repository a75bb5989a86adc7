//! The CUDA backend's ISA interpreter (`device/isa.cuh`), in its emulated (CPU) build, against
//! the Rust reference `gpu::compute` at wave width 32.
//!
//! Every test runs the same dispatch twice, on two copies of the same memory: once through
//! `gpu::compute::Dispatch` (the reference) and once through the C++ interpreter (the
//! `db_isa_check_*` entry points of `device/isa_check.cpp`), in lockstep, slice by slice with the
//! same budgets and stop points, and compares after every slice: the progress (done, yield,
//! stopped and where, fault), the fault itself field for field, the instruction and lane-op
//! counters, and — where the plan saves — the context save area byte for byte. A save is
//! followed by a restore (each side from its own bytes, or each from the other's), after the
//! C++ side's dispatch state, program cache and registers were overwritten with garbage. At
//! the end, every byte of every region is compared.
//!
//! NaN: both write every NaN result as the canonical 0x7fffffff (`abi::isa::CANONICAL_NAN`), so
//! memory is compared word for word, NaNs included; `nan_results_are_canonical` checks the
//! canonical NaN on both sides and `a_nan_used_as_an_address_faults_alike` the case that
//! showed the need (the host's 0xffc00000 and the canonical NaN name different addresses).
//! Random kernels still pass most float results through a NaN filter (`fcmp.eq` + `sel`) so
//! that later arithmetic sees ordinary numbers.

use std::collections::BTreeSet;
use std::sync::Arc;

use abi::isa::{CANONICAL_NAN, FLAG_IMM, Form, Inst, Op, ProgramError, ProgramErrorKind, ProgramHeader};
use abi::preempt::StopPoint;
use abi::queue::FaultKind;
use cuda::fault::decode;
use cuda::layout::{Fault, VmEntry};
use gpu::AddressSpace;
use gpu::compute::{CONTEXT_SAVE_BYTES, ComputeStats, Dispatch, Progress};
use proptest::prelude::*;
use shm::Shm;

// ---------------------------------------------------------------------------------------
// The C++ side
// ---------------------------------------------------------------------------------------

mod ffi {
    use cuda::layout::{Fault, VmEntry};

    /// `IsaStats` of isa.cuh.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct Stats {
        pub instructions: u64,
        pub lane_ops: u64,
    }

    /// An `IsaCheck` of isa_check.cpp.
    #[repr(C)]
    pub struct Handle {
        _opaque: [u8; 0],
    }

    unsafe extern "C" {
        pub fn db_isa_check_new(maps: *const VmEntry, count: u32) -> *mut Handle;
        pub fn db_isa_check_free(h: *mut Handle);
        pub fn db_isa_check_start(
            h: *mut Handle,
            kernel: u64,
            grid: *const u32,
            group: *const u32,
            args: u64,
            f: *mut Fault,
        ) -> u32;
        pub fn db_isa_check_run(
            h: *mut Handle,
            budget: u64,
            stop: u32,
            stopped_at: *mut u32,
            st: *mut Stats,
            f: *mut Fault,
        ) -> u32;
        pub fn db_isa_check_save(h: *mut Handle, area: *mut u8, bytes: u64, f: *mut Fault) -> u32;
        pub fn db_isa_check_restore(h: *mut Handle, area: *const u8, bytes: u64, f: *mut Fault) -> u32;
        pub fn db_isa_check_validate(words: *const u64, n: u32, f: *mut Fault) -> u32;
        pub fn db_isa_check_sizes(fault_bytes: *mut u64) -> u64;
    }
}

fn stop_code(stop: Option<StopPoint>) -> u32 {
    match stop {
        None => 0,
        Some(StopPoint::Group) => 3,
        Some(StopPoint::Wave) => 4,
        Some(other) => panic!("{other:?} is not a stop inside a dispatch"),
    }
}

/// One dispatch on the C++ interpreter.
struct Emu {
    h: *mut ffi::Handle,
    stats: ffi::Stats,
}

impl Emu {
    fn new(maps: &[VmEntry]) -> Emu {
        // SAFETY: `maps` is a valid array of `maps.len()` entries; the handle copies it.
        let h = unsafe { ffi::db_isa_check_new(maps.as_ptr(), maps.len() as u32) };
        assert!(!h.is_null());
        Emu { h, stats: ffi::Stats::default() }
    }

    /// isa_start: 1 or 0, and the fault record.
    fn start_raw(&mut self, kernel: u64, grid: [u32; 3], group: [u32; 3], args: u64) -> (u32, Fault) {
        let mut f = Fault::default();
        // SAFETY: a live handle; the arrays hold 3 elements.
        let ok = unsafe { ffi::db_isa_check_start(self.h, kernel, grid.as_ptr(), group.as_ptr(), args, &mut f) };
        (ok, f)
    }

    fn start(&mut self, kernel: u64, grid: [u32; 3], group: [u32; 3], args: u64) -> Result<(), FaultKind> {
        match self.start_raw(kernel, grid, group, args) {
            (1, _) => Ok(()),
            (_, f) => Err(decode(&f)),
        }
    }

    /// isa_run: the IsaResult, the stop point, the fault record.
    fn run_raw(&mut self, budget: u64, stop: Option<StopPoint>) -> (u32, u32, Fault) {
        let (mut f, mut at) = (Fault::default(), 0u32);
        // SAFETY: a live handle, valid out-pointers.
        let r = unsafe { ffi::db_isa_check_run(self.h, budget, stop_code(stop), &mut at, &mut self.stats, &mut f) };
        (r, at, f)
    }

    fn run(&mut self, budget: u64, stop: Option<StopPoint>) -> Result<Progress, FaultKind> {
        match self.run_raw(budget, stop) {
            (0, _, _) => Ok(Progress::Done),
            (1, _, _) => Ok(Progress::Yield),
            (2, 3, _) => Ok(Progress::Stopped(StopPoint::Group)),
            (2, 4, _) => Ok(Progress::Stopped(StopPoint::Wave)),
            (3, _, f) => Err(decode(&f)),
            (r, at, _) => panic!("isa_run returned {r}, stopped at {at}"),
        }
    }

    /// isa_save into a zeroed area of `bytes` bytes: 1 or 0, the fault record, the area.
    fn save_raw(&self, bytes: u64) -> (u32, Fault, Vec<u8>) {
        let mut area = vec![0u32; (bytes as usize).div_ceil(4)];
        let mut f = Fault::default();
        // SAFETY: `area` holds at least `bytes` bytes, 4-aligned.
        let ok = unsafe { ffi::db_isa_check_save(self.h, area.as_mut_ptr().cast(), bytes, &mut f) };
        let mut out: Vec<u8> = area.iter().flat_map(|w| w.to_le_bytes()).collect();
        out.truncate(bytes as usize);
        (ok, f, out)
    }

    fn save(&self, bytes: u64) -> Result<Vec<u8>, FaultKind> {
        match self.save_raw(bytes) {
            (1, _, area) => Ok(area),
            (_, f, _) => Err(decode(&f)),
        }
    }

    /// Wipes the state, then isa_restore from `area`: 1 or 0, and the fault record.
    fn restore_raw(&mut self, area: &[u8]) -> (u32, Fault) {
        let mut words = vec![0u32; area.len().div_ceil(4)];
        for (i, b) in area.iter().enumerate() {
            words[i / 4] |= (*b as u32) << (8 * (i % 4));
        }
        let mut f = Fault::default();
        // SAFETY: `words` holds `area.len()` bytes, 4-aligned.
        let ok = unsafe { ffi::db_isa_check_restore(self.h, words.as_ptr().cast(), area.len() as u64, &mut f) };
        (ok, f)
    }

    fn restore(&mut self, area: &[u8]) -> Result<(), FaultKind> {
        match self.restore_raw(area) {
            (1, _) => Ok(()),
            (_, f) => Err(decode(&f)),
        }
    }
}

impl Drop for Emu {
    fn drop(&mut self) {
        // SAFETY: the handle came from db_isa_check_new and is freed once.
        unsafe { ffi::db_isa_check_free(self.h) }
    }
}

fn emu_validate(words: &[u64]) -> Result<(), ProgramError> {
    let mut f = Fault::default();
    // SAFETY: `words` is a valid array of its length.
    let ok = unsafe { ffi::db_isa_check_validate(words.as_ptr(), words.len() as u32, &mut f) };
    if ok == 1 {
        return Ok(());
    }
    match decode(&f) {
        FaultKind::BadProgram(e) => Err(e),
        other => panic!("validate faulted with {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------
// Memory: the same regions twice
// ---------------------------------------------------------------------------------------

/// A region of "GPU memory": `init` mapped at `va`, from `offset` of its backing region.
#[derive(Clone, Debug)]
struct Region {
    va: u64,
    offset: u64,
    writable: bool,
    init: Vec<u8>,
}

fn region(va: u64, writable: bool, init: Vec<u8>) -> Region {
    Region { va, offset: 0, writable, init }
}

fn words_le(w: &[u32]) -> Vec<u8> {
    w.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn u64s_le(w: &[u64]) -> Vec<u8> {
    w.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The regions, twice: the reference's address space and the C++ side's mappings.
struct Pair {
    regions: Vec<Region>,
    ref_shms: Vec<Arc<Shm>>,
    emu_shms: Vec<Arc<Shm>>,
    vm: AddressSpace,
    maps: Vec<VmEntry>,
}

impl Pair {
    fn new(regions: Vec<Region>) -> Pair {
        let mut vm = AddressSpace::default();
        let (mut ref_shms, mut emu_shms, mut maps) = (Vec::new(), Vec::new(), Vec::new());
        for r in &regions {
            let size = (r.offset as usize + r.init.len()).max(1);
            let a = Shm::new("isa-ref", size).expect("shm");
            let b = Shm::new("isa-emu", size).expect("shm");
            a.write(r.offset, &r.init).expect("init");
            b.write(r.offset, &r.init).expect("init");
            vm.map(r.va, r.init.len() as u64, a.clone(), r.offset, r.writable).expect("map");
            maps.push(VmEntry {
                va: r.va,
                bytes: r.init.len() as u64,
                dev: b.addr() as u64 + r.offset,
                flags: r.writable as u64,
            });
            ref_shms.push(a);
            emu_shms.push(b);
        }
        maps.sort_by_key(|m| m.va);
        Pair { regions, ref_shms, emu_shms, vm, maps }
    }

    fn read(shm: &Shm, r: &Region) -> Vec<u8> {
        let mut b = vec![0u8; r.init.len()];
        shm.read(r.offset, &mut b).expect("read");
        b
    }

    /// Region `i` as the reference and the C++ side left it.
    fn both(&self, i: usize) -> (Vec<u8>, Vec<u8>) {
        let r = &self.regions[i];
        (Self::read(&self.ref_shms[i], r), Self::read(&self.emu_shms[i], r))
    }

    fn compare_memory(&self) -> Result<(), String> {
        for i in 0..self.regions.len() {
            let (a, b) = self.both(i);
            same_bytes(&a, &b).map_err(|e| format!("region {:#x}: {e}", self.regions[i].va))?;
        }
        Ok(())
    }
}

fn is_nan(w: u32) -> bool {
    w & 0x7fff_ffff > 0x7f80_0000
}

/// Equal, word for word (NaNs too: both sides write the canonical one).
fn same_bytes(reference: &[u8], emu: &[u8]) -> Result<(), String> {
    if reference.len() != emu.len() {
        return Err(format!("lengths {} and {}", reference.len(), emu.len()));
    }
    for (i, (a, b)) in reference.chunks(4).zip(emu.chunks(4)).enumerate() {
        if a == b {
            continue;
        }
        if a.len() == 4 {
            let (x, y) = (u32::from_le_bytes(a.try_into().unwrap()), u32::from_le_bytes(b.try_into().unwrap()));
            return Err(format!("word at byte {}: reference {x:#010x}, emulated {y:#010x}", i * 4));
        }
        return Err(format!("bytes at {}: reference {a:?}, emulated {b:?}", i * 4));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Lockstep runs
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Save {
    No,
    /// Each side saves and restores its own bytes.
    Own,
    /// Each side restores from the other side's bytes.
    Cross,
}

#[derive(Clone, Copy, Debug)]
struct Slice {
    budget: u64,
    stop: Option<StopPoint>,
    save: Save,
}

#[derive(Clone, Copy, Debug)]
struct Launch {
    kernel: u64,
    grid: [u32; 3],
    group: [u32; 3],
    args: u64,
}

#[derive(Clone, Debug, PartialEq)]
enum End {
    Done,
    Fault(FaultKind),
    /// The instruction cap ran out (a restored state may loop forever).
    Capped,
}

struct Run {
    end: End,
    stats: ComputeStats,
    saves: u32,
}

/// Both sides at one point of a run.
struct Both {
    reference: Dispatch,
    emu: Emu,
    stats: ComputeStats,
    saves: u32,
}

impl Both {
    /// One slice on both sides; `Ok(Some(end))` when the dispatch ended.
    fn slice(&mut self, p: &Pair, s: &Slice) -> Result<Option<End>, String> {
        let r = self.reference.run_to(&p.vm, s.budget, s.stop, &mut self.stats);
        let e = self.emu.run(s.budget, s.stop);
        if r != e {
            return Err(format!("slice {s:?}: reference {r:?}, emulated {e:?}"));
        }
        let (ri, ei) = (self.stats.instructions, self.emu.stats.instructions);
        let (rl, el) = (self.stats.lane_ops, self.emu.stats.lane_ops);
        if (ri, rl) != (ei, el) {
            return Err(format!("stats: reference {ri} instructions {rl} lane ops, emulated {ei} and {el}"));
        }
        match r {
            Ok(Progress::Done) => return Ok(Some(End::Done)),
            Err(f) => return Ok(Some(End::Fault(f))),
            Ok(_) => {}
        }
        if s.save != Save::No {
            return self.save_restore(p, s.save == Save::Cross);
        }
        Ok(None)
    }

    /// Saves both sides, compares the bytes, restores both. Both refusing the state alike ends
    /// the run (a restored stack that grew past 16 frames saves, but does not restore).
    fn save_restore(&mut self, p: &Pair, cross: bool) -> Result<Option<End>, String> {
        let (rbytes, ebytes) = self.save_both()?;
        self.saves += 1;
        let (for_ref, for_emu) = if cross { (&ebytes, &rbytes) } else { (&rbytes, &ebytes) };
        let area = area_with(for_ref, 0);
        let r = Dispatch::restore(&p.vm, &area, 0, 32);
        let e = self.emu.restore(for_emu);
        match (r, e) {
            (Ok(d), Ok(())) => {
                self.reference = d;
                Ok(None)
            }
            (Err(a), Err(b)) if a == b => Ok(Some(End::Fault(a))),
            (r, e) => Err(format!("restore: reference {:?}, emulated {e:?}", r.err())),
        }
    }

    /// Both save areas (CONTEXT_SAVE_BYTES each), compared.
    fn save_both(&self) -> Result<(Vec<u8>, Vec<u8>), String> {
        let area = Shm::new("isa-save", CONTEXT_SAVE_BYTES as usize).expect("shm");
        self.reference.save(&area, 0).map_err(|f| format!("reference save: {f:?}"))?;
        let mut rbytes = vec![0u8; CONTEXT_SAVE_BYTES as usize];
        area.read(0, &mut rbytes).expect("read");
        let ebytes = self.emu.save(CONTEXT_SAVE_BYTES).map_err(|f| format!("emulated save: {f:?}"))?;
        same_bytes(&rbytes, &ebytes).map_err(|e| format!("save areas differ: {e}"))?;
        Ok((rbytes, ebytes))
    }
}

/// A save area holding `bytes` at `offset`, its end exactly at the end of the region when
/// `offset` is chosen so (what a truncated area looks like to the reference).
fn area_with(bytes: &[u8], offset: u64) -> Arc<Shm> {
    let area = Shm::new("isa-area", (offset as usize + bytes.len()).max(CONTEXT_SAVE_BYTES as usize)).expect("shm");
    area.write(offset, bytes).expect("write");
    area
}

/// Starts both sides; `Err(fault)` when both refuse the dispatch alike.
fn start_both(p: &Pair, l: &Launch) -> Result<Result<Both, FaultKind>, String> {
    let r = Dispatch::start(&p.vm, l.kernel, l.grid, l.group, l.args, 32);
    let mut emu = Emu::new(&p.maps);
    let e = emu.start(l.kernel, l.grid, l.group, l.args);
    match (r, e) {
        (Ok(d), Ok(())) => Ok(Ok(Both { reference: d, emu, stats: ComputeStats::default(), saves: 0 })),
        (Err(a), Err(b)) if a == b => Ok(Err(a)),
        (r, e) => Err(format!("start: reference {:?}, emulated {e:?}", r.err())),
    }
}

/// Runs both sides through `plan`, then to the end in slices of `finish` (at most `cap`
/// instructions in all), comparing everything on the way and the memory at the end.
fn lockstep(p: &Pair, l: &Launch, plan: &[Slice], cap: u64) -> Result<Run, String> {
    let mut b = match start_both(p, l)? {
        Ok(b) => b,
        Err(f) => return Ok(Run { end: End::Fault(f), stats: ComputeStats::default(), saves: 0 }),
    };
    let end = finish(&mut b, p, plan, cap)?;
    p.compare_memory()?;
    Ok(Run { end, stats: b.stats, saves: b.saves })
}

fn finish(b: &mut Both, p: &Pair, plan: &[Slice], cap: u64) -> Result<End, String> {
    for s in plan {
        if let Some(end) = b.slice(p, s)? {
            return Ok(end);
        }
    }
    let chunk = Slice { budget: 100_000, stop: None, save: Save::No };
    while b.stats.instructions < cap {
        if let Some(end) = b.slice(p, &chunk)? {
            return Ok(end);
        }
    }
    // Capped: the states must still agree.
    b.save_both()?;
    Ok(End::Capped)
}

// ---------------------------------------------------------------------------------------
// Assembling kernels
// ---------------------------------------------------------------------------------------

fn w(op: Op, d: u32, a: u32, b: u32, c: u32, imm: u32) -> u64 {
    Inst::new(op, d as u8, a as u8, b as u8, c as u8, imm).encode()
}

/// A kernel binary's bytes (header + words).
fn kernel_bytes(words: &[u64]) -> Vec<u8> {
    let mut out = words_le(&ProgramHeader::new(words.len() as u32).to_words());
    out.extend(u64s_le(words));
    out
}

/// A small assembler with structured control flow (targets patched at the closing
/// instruction).
#[derive(Default)]
struct Asm {
    words: Vec<u64>,
    /// Open loops: their BREAKs.
    loops: Vec<Vec<usize>>,
}

impl Asm {
    fn pc(&self) -> u32 {
        self.words.len() as u32
    }
    fn op(&mut self, op: Op, d: u32, a: u32, b: u32, c: u32, imm: u32) -> &mut Self {
        self.words.push(w(op, d, a, b, c, imm));
        self
    }
    fn bin(&mut self, op: Op, d: u32, a: u32, b: u32) -> &mut Self {
        self.op(op, d, a, b, 0, 0)
    }
    fn bini(&mut self, op: Op, d: u32, a: u32, imm: u32) -> &mut Self {
        self.op(op, d, a, 0, FLAG_IMM as u32, imm)
    }
    fn un(&mut self, op: Op, d: u32, a: u32) -> &mut Self {
        self.op(op, d, a, 0, 0, 0)
    }
    fn uni(&mut self, op: Op, d: u32, imm: u32) -> &mut Self {
        self.op(op, d, 0, 0, FLAG_IMM as u32, imm)
    }
    fn patch(&mut self, at: usize, target: u32) {
        self.words[at] = (self.words[at] & 0xffff_ffff) | ((target as u64) << 32);
    }
    fn if_(&mut self, cond: u32) -> usize {
        self.op(Op::If, 0, cond, 0, 0, 0);
        self.words.len() - 1
    }
    fn else_(&mut self, if_at: usize) -> usize {
        let pc = self.pc();
        self.patch(if_at, pc);
        self.op(Op::Else, 0, 0, 0, 0, 0);
        self.words.len() - 1
    }
    fn endif(&mut self, if_at: usize, else_at: Option<usize>) {
        let pc = self.pc();
        match else_at {
            Some(e) => self.patch(e, pc),
            None => self.patch(if_at, pc),
        }
        self.op(Op::EndIf, 0, 0, 0, 0, 0);
    }
    fn loop_(&mut self) -> usize {
        self.op(Op::Loop, 0, 0, 0, 0, 0);
        self.loops.push(Vec::new());
        self.words.len() - 1
    }
    fn break_(&mut self, cond: u32) {
        self.op(Op::Break, 0, cond, 0, 0, 0);
        let at = self.words.len() - 1;
        self.loops.last_mut().expect("inside a loop").push(at);
    }
    fn endloop(&mut self, loop_at: usize) {
        let pc = self.pc();
        self.patch(loop_at, pc);
        for b in self.loops.pop().expect("open loop") {
            self.patch(b, pc);
        }
        self.op(Op::EndLoop, 0, 0, 0, 0, loop_at as u32);
    }
}

// ---------------------------------------------------------------------------------------
// Random kernels
// ---------------------------------------------------------------------------------------

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
}

// Register plan of the random kernels.
const DATA: u32 = 16; // v0..v15: data
const V_OFF: u32 = 16; // an address offset
const V_OFF2: u32 = 17; // a fault-injection delta
const V_LANE: u32 = 18; // the lane in the wave
const V_LIDX: u32 = 20; // %local_index
const V_GID: u32 = 21; // %global_id.x
const V_CNT: u32 = 24; // loop counters, one per loop depth
const V_FCMP: u32 = 40; // NaN filter: fcmp result
const V_KNAN: u32 = 41; // NaN filter: the replacement
const V_FT: u32 = 42; // NaN filter: the raw float result
const V_COND: u32 = 43; // conditions
const V_DUMP: u32 = 44; // dump offset

// Memory plan.
const A_VA: u64 = 0x1_0000; // 8 KiB, read-write
const B_VA: u64 = 0x2_0000; // 8 KiB, read-only
const D_VA: u64 = 0x3_0000; // 16 KiB, read-write: the register dump
const ARGS_VA: u64 = 0x4_0000; // 8 slots
const K_VA: u64 = 0x5_0000; // the kernel
const AB_BYTES: usize = 8192;

/// The binary ops whose result is a float.
const FLOAT_BIN: &[Op] = &[Op::FAdd, Op::FSub, Op::FMul, Op::FDiv, Op::FMin, Op::FMax];
/// Every other binary op (integer results and compare flags), from the ISA's own table: a new
/// one is tested without an edit here.
static INT_BIN: std::sync::LazyLock<Vec<Op>> = std::sync::LazyLock::new(|| {
    Op::ALL.iter().copied().filter(|o| o.form() == Form::Binary && !FLOAT_BIN.contains(o)).collect()
});
const INT_UN: &[Op] = &[Op::Mov, Op::Not, Op::CvtF32U32, Op::CvtF32I32, Op::CvtU32F32, Op::CvtI32F32];

/// Values that find edge cases: signs, powers of two, float specials and conversion limits.
const SPECIAL: &[u32] = &[
    0,
    1,
    2,
    3,
    5,
    31,
    32,
    33,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0xffff_fffe,
    0x3f80_0000,
    0xbf80_0000,
    0x3f00_0000,
    0xbf00_0000,
    0x7f80_0000,
    0xff80_0000,
    0x7f7f_ffff,
    0x0000_0001,
    0x8000_0001,
    0x007f_ffff,
    0x0080_0000,
    0x4f80_0000,
    0x4f7f_ffff,
    0x4f00_0000,
    0xcf00_0000,
    0xcf00_0001,
    0x4b80_0001,
    0x7fc0_0000,
    0xffc0_0001,
];

impl Rng {
    fn value(&mut self) -> u32 {
        match self.below(4) {
            0 => self.pick(SPECIAL),
            1 => self.below(16) as u32,
            2 => ((self.next() as i32 % 2000) as f32 / 8.0).to_bits(),
            _ => self.next() as u32,
        }
    }
    fn data(&mut self) -> u32 {
        self.below(DATA as u64) as u32
    }
    fn src(&mut self) -> u32 {
        if self.chance(15) { self.pick(&[V_LANE, V_LIDX, V_GID]) } else { self.data() }
    }
}

/// Generator state for one kernel.
struct Gen {
    rng: Rng,
    asm: Asm,
    /// Instructions still allowed.
    room: i64,
    /// Whether this kernel may fault on purpose (at most one site).
    fault_site: bool,
}

impl Gen {
    fn block(&mut self, depth: u32, loops: u32) {
        let n = 1 + self.rng.below(6);
        for _ in 0..n {
            if self.room <= 0 {
                return;
            }
            self.stmt(depth, loops);
        }
    }

    fn stmt(&mut self, depth: u32, loops: u32) {
        let before = self.asm.words.len();
        let roll = self.rng.below(100);
        let r = &mut self.rng;
        let a = &mut self.asm;
        match roll {
            0..=19 => {
                let (op, d, x) = (r.pick(&INT_BIN), r.data(), r.src());
                if r.chance(40) {
                    let imm = r.value();
                    a.bini(op, d, x, imm);
                } else {
                    let y = r.src();
                    a.bin(op, d, x, y);
                }
            }
            20..=25 => {
                let (op, d) = (r.pick(INT_UN), r.data());
                if r.chance(30) {
                    let imm = r.value();
                    a.uni(op, d, imm);
                } else {
                    let x = r.src();
                    a.un(op, d, x);
                }
            }
            26..=35 => {
                // A float result, through the NaN filter.
                let d = r.data();
                match r.below(8) {
                    0 => {
                        let (x, y, z) = (r.src(), r.src(), r.src());
                        a.op(Op::FFma, V_FT, x, y, z, 0);
                    }
                    1 => {
                        if r.chance(30) {
                            let imm = r.value();
                            a.uni(Op::FSqrt, V_FT, imm);
                        } else {
                            let x = r.src();
                            a.un(Op::FSqrt, V_FT, x);
                        }
                    }
                    _ => {
                        let (op, x) = (r.pick(FLOAT_BIN), r.src());
                        if r.chance(30) {
                            let imm = r.value();
                            a.bini(op, V_FT, x, imm);
                        } else {
                            let y = r.src();
                            a.bin(op, V_FT, x, y);
                        }
                    }
                }
                a.bin(Op::FCmpEq, V_FCMP, V_FT, V_FT).op(Op::Sel, d, V_FCMP, V_FT, V_KNAN, 0);
            }
            36..=38 => {
                let (d, x, y, z) = (r.data(), r.src(), r.src(), r.src());
                a.op(Op::Sel, d, x, y, z, 0);
            }
            39..=41 => {
                let (d, b) = (r.data(), r.below(14) as u32);
                a.op(Op::Builtin, d, 0, 0, 0, b);
            }
            42..=47 => {
                let s = 3 + r.below(13) as u32;
                match r.below(5) {
                    0 => {
                        let imm = r.value();
                        a.op(Op::SMov, s, 0, 0, 0, imm);
                    }
                    1 => {
                        let (x, imm) = (r.below(16) as u32, r.value());
                        a.op(Op::SAdd, s, x, 0, 0, imm);
                    }
                    2 => {
                        let slot = r.below(8) as u32;
                        a.op(Op::SArg, s, 0, 0, 0, slot);
                    }
                    3 => {
                        let (d, x) = (r.data(), r.below(16) as u32);
                        a.op(Op::VFromS, d, x, 0, 0, 0);
                    }
                    _ => {
                        let (d, x) = (r.data(), r.below(16) as u32);
                        a.op(Op::VFromSHi, d, x, 0, 0, 0);
                    }
                }
            }
            48..=69 => {
                let fault = self.fault_site && self.rng.chance(25);
                if fault {
                    self.fault_site = false;
                }
                self.memory(fault);
            }
            70..=79 if depth < 6 => {
                self.cond();
                let at = self.asm.if_(V_COND);
                self.block(depth + 1, loops);
                let e = if self.rng.chance(40) {
                    let e = self.asm.else_(at);
                    self.block(depth + 1, loops);
                    Some(e)
                } else {
                    None
                };
                self.asm.endif(at, e);
            }
            80..=86 if loops < 3 && depth < 6 => {
                let cnt = V_CNT + loops;
                if self.rng.chance(50) {
                    let t = self.rng.below(4) as u32;
                    self.asm.uni(Op::Mov, cnt, t);
                } else {
                    self.asm.bini(Op::And, cnt, V_LANE, 3);
                }
                let at = self.asm.loop_();
                self.asm.bini(Op::CmpEq, V_COND, cnt, 0);
                self.asm.break_(V_COND);
                self.asm.bini(Op::Sub, cnt, cnt, 1);
                self.block(depth + 1, loops + 1);
                self.asm.endloop(at);
            }
            87..=91 if loops > 0 => {
                self.cond();
                self.asm.break_(V_COND);
            }
            92..=93 => {
                self.cond();
                let at = self.asm.if_(V_COND);
                self.asm.op(Op::Exit, 0, 0, 0, 0, 0);
                self.asm.endif(at, None);
            }
            94 if depth > 0 && self.rng.chance(20) => {
                self.asm.op(Op::Exit, 0, 0, 0, 0, 0);
            }
            95 if self.fault_site && self.rng.chance(30) => {
                // SARG past the argument buffer.
                self.fault_site = false;
                self.asm.op(Op::SArg, 3, 0, 0, 0, 8 + self.rng.below(4) as u32);
            }
            _ => {
                self.asm.op(Op::Nop, 0, 0, 0, 0, 0);
            }
        }
        self.room -= (self.asm.words.len() - before) as i64;
    }

    /// A condition in V_COND.
    fn cond(&mut self) {
        let r = &mut self.rng;
        let a = &mut self.asm;
        match r.below(6) {
            0 => {
                let k = r.below(34) as u32;
                a.bini(Op::CmpLtU, V_COND, V_LANE, k);
            }
            1 => {
                let x = r.data();
                a.bini(Op::And, V_COND, x, 1);
            }
            2 => {
                let x = r.data();
                a.un(Op::Mov, V_COND, x);
            }
            3 => {
                let k = r.below(32) as u32;
                a.bini(Op::CmpEq, V_COND, V_LANE, k);
            }
            4 => {
                let imm = r.below(2) as u32;
                a.uni(Op::Mov, V_COND, imm);
            }
            _ => {
                let (x, y) = (r.data(), r.data());
                a.bin(Op::CmpLtS, V_COND, x, y);
            }
        }
    }

    fn memory(&mut self, fault: bool) {
        let r = &mut self.rng;
        let a = &mut self.asm;
        let op = r.pick(&[Op::Ld32, Op::Ld64, Op::St32, Op::St64, Op::AtomAdd]);
        let wide = matches!(op, Op::Ld64 | Op::St64);
        let mask = r.pick(&[0, 1, 3, 31, if wide { 511 } else { 1023 }]);
        let dr = r.data();
        let src = r.pick(&[V_LANE, V_LIDX, dr]);
        a.bini(Op::And, V_OFF, src, mask).bini(Op::Shl, V_OFF, V_OFF, if wide { 3 } else { 2 });
        let imm = r.below(if wide { 512 } else { 1024 }) as u32 * if wide { 8 } else { 4 };
        let mut base = if matches!(op, Op::Ld32 | Op::Ld64) { r.below(2) as u32 } else { 0 };
        if fault {
            match r.below(4) {
                0 | 1 => {
                    // One lane faults: misaligned, unmapped, or (from A) into read-only B.
                    let k = r.below(32) as u32;
                    let bad = r.pick(&[1, 2, 4, 0x10_0000, 0x1_0000, 0xffff_0000]);
                    a.bini(Op::CmpEq, V_OFF2, V_LANE, k).bini(Op::Mul, V_OFF2, V_OFF2, bad).bin(
                        Op::Add,
                        V_OFF,
                        V_OFF,
                        V_OFF2,
                    );
                }
                2 => base = 1,
                _ => base = 3 + r.below(13) as u32,
            }
        }
        let (d, c) = (if wide { r.below(DATA as u64 - 1) as u32 } else { r.data() }, r.data());
        match op {
            Op::AtomAdd => a.op(op, d, base, V_OFF, c, imm),
            _ => a.op(op, d, base, V_OFF, 0, imm),
        };
    }
}

/// A random kernel: prologue (argument pointers, lane ids, data registers loaded from B),
/// random structured body, epilogue (the data registers dumped to D).
fn random_kernel(seed: u64, size: i64) -> Vec<u64> {
    let mut g = Gen { rng: Rng(seed), asm: Asm::default(), room: size, fault_site: false };
    g.fault_site = g.rng.chance(35);
    let a = &mut g.asm;
    a.op(Op::SArg, 0, 0, 0, 0, 0).op(Op::SArg, 1, 0, 0, 0, 1).op(Op::SArg, 2, 0, 0, 0, 2);
    a.op(Op::Builtin, V_LIDX, 0, 0, 0, 13).bini(Op::And, V_LANE, V_LIDX, 31).op(Op::Builtin, V_GID, 0, 0, 0, 12);
    let knan = g.rng.pick(&[0x3f80_0000u32, 0, 0x8000_0000, 0xc2c8_0000]);
    let a = &mut g.asm;
    a.uni(Op::Mov, V_KNAN, knan);
    a.bini(Op::And, V_OFF, V_LIDX, 511).bini(Op::Shl, V_OFF, V_OFF, 2);
    for r in 0..DATA {
        a.op(Op::Ld32, r, 1, V_OFF, 0, r * 128);
    }
    g.block(0, 0);
    while g.room > 0 {
        g.block(0, 0);
    }
    let a = &mut g.asm;
    a.bini(Op::And, V_DUMP, V_GID, 255).bini(Op::Shl, V_DUMP, V_DUMP, 6);
    for r in 0..DATA {
        a.op(Op::St32, r, 2, V_DUMP, 0, r * 4);
    }
    g.asm.words
}

fn random_values(rng: &mut Rng, n: usize) -> Vec<u32> {
    (0..n).map(|_| rng.value()).collect()
}

/// The memory of a random kernel: A, B (random), D (zero), the arguments, the kernel.
fn random_world(seed: u64, words: &[u64]) -> Vec<Region> {
    let mut rng = Rng(seed ^ 0x5eed);
    let slots = [A_VA, B_VA, D_VA, A_VA + 4096, rng.next(), rng.below(1 << 20), 0, u64::MAX];
    let mut a = region(A_VA, true, words_le(&random_values(&mut rng, AB_BYTES / 4)));
    // Backing offsets, so device addresses are not the VA's image (8-aligned: see isa.cuh).
    a.offset = 8 * rng.below(64);
    vec![
        a,
        region(B_VA, false, words_le(&random_values(&mut rng, AB_BYTES / 4))),
        region(D_VA, true, vec![0; 16384]),
        region(ARGS_VA, false, u64s_le(&slots)),
        region(K_VA, false, kernel_bytes(words)),
    ]
}

fn random_launch(rng: &mut Rng) -> Launch {
    let grid = [1 + rng.below(3) as u32, 1 + rng.below(2) as u32, 1 + rng.below(2) as u32];
    let group = [rng.pick(&[1, 5, 31, 32, 33, 64, 70]), 1 + rng.below(2) as u32, 1 + rng.below(2) as u32];
    Launch { kernel: K_VA, grid, group, args: ARGS_VA }
}

fn random_plan(rng: &mut Rng) -> Vec<Slice> {
    let n = rng.below(7) as usize;
    (0..n)
        .map(|_| {
            let budget = match rng.below(10) {
                0 => 0,
                1..=4 => 1 + rng.below(10),
                5..=8 => rng.below(400),
                _ => 5000,
            };
            let stop = match rng.below(5) {
                0 => Some(StopPoint::Wave),
                1 => Some(StopPoint::Group),
                _ => None,
            };
            let save = match rng.below(10) {
                0..=3 => Save::No,
                4..=7 => Save::Own,
                _ => Save::Cross,
            };
            Slice { budget, stop, save }
        })
        .collect()
}

fn disasm(words: &[u64]) -> String {
    words
        .iter()
        .enumerate()
        .map(|(pc, &x)| match Inst::decode(x, pc as u32) {
            Ok(i) => format!("{pc:4}: {:?} d{} a{} b{} c{} imm {:#x}\n", i.op, i.d, i.a, i.b, i.c, i.imm),
            Err(_) => format!("{pc:4}: {x:#018x}\n"),
        })
        .collect()
}

/// A dispatch to run both ways: its memory, launch and slices.
#[derive(Clone, Debug)]
struct Case {
    regions: Vec<Region>,
    launch: Launch,
    plan: Vec<Slice>,
}

impl Case {
    fn new(regions: Vec<Region>, launch: Launch) -> Case {
        Case { regions, launch, plan: Vec::new() }
    }

    /// Runs both ways on fresh memory; returns the memory too.
    fn run(&self, cap: u64) -> Result<(Run, Pair), String> {
        let p = Pair::new(self.regions.clone());
        let run = lockstep(&p, &self.launch, &self.plan, cap)?;
        Ok((run, p))
    }
}

/// One workgroup of `threads` threads running the kernel at K_VA with its arguments at ARGS_VA.
fn launch1(threads: u32) -> Launch {
    Launch { kernel: K_VA, grid: [1, 1, 1], group: [threads, 1, 1], args: ARGS_VA }
}

/// A random kernel of `seed` with its memory, launch and slices.
fn random_case(seed: u64, size: i64) -> (Case, Vec<u64>) {
    let words = random_kernel(seed, size);
    let mut rng = Rng(seed ^ 0x1a0c);
    let launch = random_launch(&mut rng);
    let plan = random_plan(&mut rng);
    (Case { regions: random_world(seed, &words), launch, plan }, words)
}

/// Runs a random kernel of `seed` both ways.
fn check_random(seed: u64, size: i64) -> Result<Run, String> {
    let (case, words) = random_case(seed, size);
    abi::isa::validate(&words).map_err(|e| format!("generator made an invalid kernel: {e}"))?;
    case.run(5_000_000)
        .map(|(run, _)| run)
        .map_err(|e| format!("{e}\nlaunch {:?}\nplan {:?}\n{}", case.launch, case.plan, disasm(&words)))
}

// ---------------------------------------------------------------------------------------
// Tests: layout and basics
// ---------------------------------------------------------------------------------------

#[test]
fn fault_record_layout_matches() {
    let mut fb = 0u64;
    // SAFETY: a valid out-pointer.
    let d = unsafe { ffi::db_isa_check_sizes(&mut fb) };
    assert_eq!(fb, size_of::<Fault>() as u64);
    assert!(d > 0);
}

/// A kernel of every ALU operation on a table of 32 operand pairs, one per lane (division by 0,
/// `i32::MIN / -1`, shifts by 32 and more, signed and unsigned comparisons, conversions at
/// their limits, denormals), each result stored in a row of A; and per row, whether it is a
/// float result.
fn alu_edge_case() -> (Case, Vec<bool>) {
    let pairs: Vec<(u32, u32)> = vec![
        (7, 0),
        (0, 0),
        (0x8000_0000, 0xffff_ffff),
        (0x8000_0000, 1),
        (0xffff_ffff, 0xffff_ffff),
        (100, 7),
        (0xffff_ff9c, 7),
        (100, 0xffff_fff9),
        (1, 31),
        (1, 32),
        (0x8000_0000, 33),
        (0xffff_ffff, 0x8000_001f),
        (0x7f7f_ffff, 0x7f7f_ffff),
        (0x0000_0001, 0x3f00_0000),
        (0x0080_0000, 0x3f00_0000),
        (0x007f_ffff, 0x0000_0001),
        (0x3f80_0000, 0x8000_0000),
        (0x4f80_0000, 0xcf00_0000),
        (0x4f7f_ffff, 0xcf00_0001),
        (0xbf7f_ffff, 0x3f7f_ffff),
        (0x7f80_0000, 0xff80_0000),
        (0x4b80_0001, 0x3400_0000),
        (0x3eaa_aaab, 0x4040_0000),
        (0x0000_0000, 0x8000_0000),
        (0x8000_0000, 0x0000_0000),
        (0x4000_0000, 0x4000_0000),
        (u32::MAX / 3, 0x5555_5556),
        (123_456_789, 987_654_321),
        (0x00ff_ffff, 0x0080_0001),
        (0x3f80_0001, 0x3f7f_ffff),
        (0xc000_0000, 0x3f80_0000),
        (0x1234_5678, 0x9abc_def0),
    ];
    assert_eq!(pairs.len(), 32);
    let mut ops: Vec<(Op, bool)> = INT_BIN.iter().map(|&o| (o, true)).collect();
    ops.extend(FLOAT_BIN.iter().map(|&o| (o, true)));
    ops.extend(INT_UN.iter().map(|&o| (o, false)));
    ops.push((Op::FSqrt, false));
    let mut a = Asm::default();
    a.op(Op::SArg, 0, 0, 0, 0, 0).op(Op::SArg, 1, 0, 0, 0, 1);
    a.op(Op::Builtin, 20, 0, 0, 0, 13).bini(Op::Shl, 20, 20, 2);
    a.op(Op::Ld32, 1, 1, 20, 0, 0).op(Op::Ld32, 2, 1, 20, 0, 128).op(Op::Ld32, 3, 1, 20, 0, 256);
    let mut out = 0u32;
    let mut float_rows = Vec::new();
    for &(op, binary) in &ops {
        let float = FLOAT_BIN.contains(&op) || op == Op::FSqrt;
        if binary {
            a.bin(op, 4, 1, 2);
        } else {
            a.un(op, 4, 1);
        }
        a.op(Op::St32, 4, 0, 20, 0, out);
        out += 128;
        float_rows.push(float);
        if binary {
            // With the operands swapped, and with the immediate.
            a.bin(op, 4, 2, 1).op(Op::St32, 4, 0, 20, 0, out);
            out += 128;
            a.bini(op, 4, 1, 0x8000_0001).op(Op::St32, 4, 0, 20, 0, out);
            out += 128;
            float_rows.extend([float, float]);
        }
    }
    a.op(Op::FFma, 4, 1, 2, 3, 0).op(Op::St32, 4, 0, 20, 0, out);
    out += 128;
    a.op(Op::Sel, 4, 3, 1, 2, 0).op(Op::St32, 4, 0, 20, 0, out);
    out += 128;
    float_rows.extend([true, false]);
    let mut input: Vec<u32> = pairs.iter().map(|p| p.0).collect();
    input.extend(pairs.iter().map(|p| p.1));
    input.extend((0..32usize).map(|i| [0, 1, 0x8000_0000, 0x7f80_0000][i % 4]));
    let regions = vec![
        region(A_VA, true, vec![0; out as usize]),
        region(B_VA, false, words_le(&input)),
        region(ARGS_VA, false, u64s_le(&[A_VA, B_VA])),
        region(K_VA, false, kernel_bytes(&a.words)),
    ];
    (Case::new(regions, launch1(32)), float_rows)
}

/// The ALU table: equal to the reference word for word; where a float result is a NaN, both
/// write the canonical one.
#[test]
fn alu_edge_cases_match() {
    let (case, float_rows) = alu_edge_case();
    let (run, p) = case.run(1 << 20).unwrap();
    assert_eq!(run.end, End::Done);
    let (r, e) = p.both(0);
    let mut nans = 0;
    for (i, (x, y)) in r.chunks(4).zip(e.chunks(4)).enumerate() {
        let (x, y) = (u32::from_le_bytes(x.try_into().unwrap()), u32::from_le_bytes(y.try_into().unwrap()));
        assert_eq!(x, y, "word {i} (row {}, lane {})", i / 32, i % 32);
        if float_rows[i / 32] && is_nan(x) {
            assert_eq!(x, CANONICAL_NAN, "word {i}: a NaN result is canonical");
            nans += 1;
        }
    }
    assert!(nans > 0, "the table reaches NaN results");
}

/// Float operations that give NaNs (from infinities, zeros, and NaN operands with payloads),
/// each result stored in a row of A; and the number of rows.
fn nan_case() -> (Case, usize) {
    let cases: &[(Op, u32, u32)] = &[
        (Op::FAdd, 0x7f80_0000, 0xff80_0000),
        (Op::FSub, 0x7f80_0000, 0x7f80_0000),
        (Op::FMul, 0, 0x7f80_0000),
        (Op::FDiv, 0, 0),
        (Op::FDiv, 0x7f80_0000, 0xff80_0000),
        (Op::FAdd, 0x7fc1_2345, 0x3f80_0000),
        (Op::FMul, 0xffa0_0001, 0x3f80_0000),
        (Op::FSub, 0x3f80_0000, 0x7f80_0001),
        (Op::FMin, 0x7fc0_0001, 0xffc0_0002),
        (Op::FMax, 0xff80_0001, 0x7fff_fffe),
        (Op::FSqrt, 0xbf80_0000, 0),
        (Op::FSqrt, 0xffc0_1234, 0),
        (Op::FFma, 0, 0x7f80_0000),
        (Op::FFma, 0x3f80_0000, 0x7fa0_0000),
    ];
    let mut a = Asm::default();
    a.op(Op::SArg, 0, 0, 0, 0, 0);
    for (k, &(op, x, y)) in cases.iter().enumerate() {
        a.uni(Op::Mov, 1, x).uni(Op::Mov, 2, y).uni(Op::Mov, 3, 0x3f80_0000);
        match op {
            Op::FSqrt => a.un(op, 4, 1),
            Op::FFma => a.op(op, 4, 1, 2, 3, 0),
            _ => a.bin(op, 4, 1, 2),
        };
        a.op(Op::Builtin, 5, 0, 0, 0, 13).bini(Op::Shl, 5, 5, 2).op(Op::St32, 4, 0, 5, 0, 128 * k as u32);
    }
    let regions = vec![
        region(A_VA, true, vec![0; 128 * cases.len()]),
        region(ARGS_VA, false, u64s_le(&[A_VA])),
        region(K_VA, false, kernel_bytes(&a.words)),
    ];
    (Case::new(regions, launch1(32)), cases.len())
}

/// Every float operation that can give a NaN writes 0x7fffffff, whatever its inputs' payloads,
/// in the reference and in the interpreter.
#[test]
fn nan_results_are_canonical() {
    let (case, n) = nan_case();
    let (run, p) = case.run(1 << 20).unwrap();
    assert_eq!(run.end, End::Done);
    let (r, e) = p.both(0);
    assert_eq!(r.len(), 128 * n);
    for (k, (x, y)) in r.chunks(128).zip(e.chunks(128)).enumerate() {
        for (x, y) in x.chunks(4).zip(y.chunks(4)) {
            let (x, y) = (u32::from_le_bytes(x.try_into().unwrap()), u32::from_le_bytes(y.try_into().unwrap()));
            assert_eq!(x, CANONICAL_NAN, "case {k}: the reference");
            assert_eq!(y, CANONICAL_NAN, "case {k}: the interpreter");
        }
    }
}

/// `0.0 / 0.0` used as a load's offset: both sides fault on the same address, the canonical
/// NaN's (0x7fffffff + 0x80, misaligned). With the host's NaN (0xffc00000 on x86-64) the
/// reference once faulted elsewhere, found by `refused_kernels_fault_alike`.
#[test]
fn a_nan_used_as_an_address_faults_alike() {
    let mut a = Asm::default();
    a.op(Op::SMov, 1, 0, 0, 0, 0);
    a.uni(Op::Mov, 1, 0).uni(Op::Mov, 2, 0).bin(Op::FDiv, 4, 1, 2);
    a.op(Op::Ld32, 6, 1, 4, 0, 0x80);
    let regions = vec![region(A_VA, true, vec![0; 128]), region(K_VA, false, kernel_bytes(&a.words))];
    let (run, _) = Case::new(regions, launch1(8)).run(1 << 20).unwrap();
    match run.end {
        End::Fault(FaultKind::ProgramAccess { fault, .. }) => {
            assert!(matches!(*fault, FaultKind::Misaligned { va: 0x8000_007f, .. }), "{fault:?}")
        }
        other => panic!("{other:?}"),
    }
}

/// FMIN/FMAX operands: signed zeros both ways, NaNs on either side.
const FMIN_PAIRS: &[(u32, u32)] = &[
    (0, 0x8000_0000),
    (0x8000_0000, 0),
    (0, 0),
    (0x8000_0000, 0x8000_0000),
    (0x7fc0_0000, 0x8000_0000),
    (0x8000_0000, 0x7fc0_0000),
    (0xffc0_0001, 0x3f80_0000),
    (0x3f80_0000, 0x7f80_0001),
    (0x7f80_0000, 0x7fc0_0000),
    (0xff80_0000, 0x7f80_0000),
];

/// FMIN and FMAX of FMIN_PAIRS (register and immediate forms), each result in a row of A.
/// `masked`: inside an IF that lanes 20 and up skip (the reference's masked path); else every
/// live lane is active (its in-place path).
fn fmin_case(masked: bool, threads: u32) -> Case {
    let mut a = Asm::default();
    a.op(Op::SArg, 0, 0, 0, 0, 0).op(Op::Builtin, 5, 0, 0, 0, 13).bini(Op::Shl, 5, 5, 2);
    a.op(Op::Builtin, 6, 0, 0, 0, 13).bini(Op::CmpLtU, 6, 6, if masked { 20 } else { 1000 });
    let at = a.if_(6);
    let mut out = 0;
    for &(x, y) in FMIN_PAIRS {
        for op in [Op::FMin, Op::FMax] {
            a.uni(Op::Mov, 1, x).uni(Op::Mov, 2, y).bin(op, 3, 1, 2).op(Op::St32, 3, 0, 5, 0, out);
            out += 128;
            a.bini(op, 3, 1, y).op(Op::St32, 3, 0, 5, 0, out);
            out += 128;
        }
    }
    a.endif(at, None);
    let regions = vec![
        region(A_VA, true, vec![0; out as usize]),
        region(ARGS_VA, false, u64s_le(&[A_VA])),
        region(K_VA, false, kernel_bytes(&a.words)),
    ];
    Case::new(regions, launch1(threads))
}

/// FMIN/FMAX of +0 and -0 in both orders, and with a NaN on either side: the reference's
/// choice (the first operand of equal zeros, on x86-64), bit for bit.
#[test]
fn fmin_fmax_signed_zeros_and_nan_operands() {
    for masked in [false, true] {
        for threads in [32, 7] {
            let (run, p) = fmin_case(masked, threads).run(1 << 20).unwrap();
            assert_eq!(run.end, End::Done);
            let (r, e) = p.both(0);
            let word = |b: &[u8], k: usize| u32::from_le_bytes(b[k * 128..k * 128 + 4].try_into().unwrap());
            let got: Vec<u32> = (0..8).map(|k| word(&r, k)).collect();
            eprintln!("reference fmin/fmax on signed zeros (masked {masked}, {threads} threads): {got:x?}");
            assert_eq!(r, e, "exact, sign of zero included");
            // The first operand of equal zeros: what the emulated build does.
            assert_eq!((word(&e, 0), word(&e, 2)), (0, 0), "min/max(+0, -0)");
            assert_eq!((word(&e, 4), word(&e, 6)), (0x8000_0000, 0x8000_0000), "min/max(-0, +0)");
        }
    }
}

/// Every builtin stored per thread, on 3-D grids and workgroups with several waves per group
/// (and lanes past the group's threads, whose registers the in-place path writes too), run in
/// slices with saves.
fn builtins_cases() -> Vec<Case> {
    let mut a = Asm::default();
    a.op(Op::SArg, 0, 0, 0, 0, 0);
    a.op(Op::Builtin, 40, 0, 0, 0, 13);
    // Flat thread id across the grid: group linear index * threads + local index.
    a.op(Op::Builtin, 41, 0, 0, 0, 0).op(Op::Builtin, 42, 0, 0, 0, 1).op(Op::Builtin, 43, 0, 0, 0, 2);
    a.op(Op::Builtin, 44, 0, 0, 0, 9).op(Op::Builtin, 45, 0, 0, 0, 10);
    a.bin(Op::Mul, 43, 43, 45).bin(Op::Add, 43, 43, 42).bin(Op::Mul, 43, 43, 44).bin(Op::Add, 43, 43, 41);
    a.op(Op::Builtin, 46, 0, 0, 0, 6).op(Op::Builtin, 47, 0, 0, 0, 7).op(Op::Builtin, 48, 0, 0, 0, 8);
    a.bin(Op::Mul, 46, 46, 47).bin(Op::Mul, 46, 46, 48).bin(Op::Mul, 43, 43, 46).bin(Op::Add, 43, 43, 40);
    a.bini(Op::Mul, 43, 43, 14 * 4);
    for b in 0..14u32 {
        a.op(Op::Builtin, 1, 0, 0, 0, b).op(Op::St32, 1, 0, 43, 0, 4 * b);
    }
    let plan =
        vec![Slice { budget: 17, stop: None, save: Save::Own }, Slice { budget: 40, stop: None, save: Save::Cross }];
    [([2, 3, 2], [5, 3, 2]), ([1, 1, 1], [70, 1, 1]), ([3, 1, 2], [1, 33, 2])]
        .into_iter()
        .map(|(grid, group)| {
            let threads: u32 = grid.iter().product::<u32>() * group.iter().product::<u32>();
            let regions = vec![
                region(A_VA, true, vec![0; threads as usize * 14 * 4]),
                region(ARGS_VA, false, u64s_le(&[A_VA])),
                region(K_VA, false, kernel_bytes(&a.words)),
            ];
            Case { regions, launch: Launch { kernel: K_VA, grid, group, args: ARGS_VA }, plan: plan.clone() }
        })
        .collect()
}

#[test]
fn builtins_match() {
    for c in builtins_cases() {
        assert_eq!(c.run(1 << 20).unwrap().0.end, End::Done);
    }
}

// ---------------------------------------------------------------------------------------
// Tests: memory instructions
// ---------------------------------------------------------------------------------------

/// Memory of the lane-order tests: A (rw, 4 KiB), B (ro, 4 KiB), the arguments, the kernel.
fn lane_world(words: &[u64]) -> Vec<Region> {
    let mut rng = Rng(7);
    vec![
        region(A_VA, true, words_le(&random_values(&mut rng, 1024))),
        region(B_VA, false, words_le(&random_values(&mut rng, 1024))),
        region(ARGS_VA, false, u64s_le(&[A_VA, B_VA])),
        region(K_VA, false, kernel_bytes(words)),
    ]
}

/// Lane `k` of a memory instruction `op` (at pc 10) faults, its offset moved by `bad`
/// (misaligned, unmapped, or from A into read-only B); every third lane is inactive.
fn lane_fault_case(op: Op, bad: u32, k: u32) -> Case {
    let wide = matches!(op, Op::Ld64 | Op::St64);
    let mut a = Asm::default();
    a.op(Op::SArg, 0, 0, 0, 0, 0).op(Op::Builtin, 1, 0, 0, 0, 13);
    a.bini(Op::Shl, 2, 1, if wide { 3 } else { 2 });
    a.bini(Op::CmpEq, 3, 1, k).bini(Op::Mul, 3, 3, bad).bin(Op::Add, 2, 2, 3);
    a.bini(Op::Add, 4, 1, 1000).bini(Op::Add, 5, 1, 2000);
    a.bini(Op::RemU, 6, 1, 3);
    let at = a.if_(6);
    match op {
        Op::AtomAdd => a.op(op, 7, 0, 2, 4, 0),
        _ => a.op(op, 4, 0, 2, 0, 0),
    };
    a.endif(at, None);
    Case::new(lane_world(&a.words), launch1(32))
}

/// (op, bad, k) of the lane-fault cases.
fn lane_fault_params() -> Vec<(Op, u32, u32)> {
    let mut out = Vec::new();
    for op in [Op::Ld32, Op::Ld64, Op::St32, Op::St64, Op::AtomAdd] {
        let wide = matches!(op, Op::Ld64 | Op::St64);
        let bads: &[u32] =
            if matches!(op, Op::Ld32 | Op::Ld64) { &[2, 4, 0x10_0000] } else { &[2, 4, 0x10_0000, 0x1_0000] };
        for &bad in bads {
            if bad == 4 && !wide {
                continue;
            }
            for k in [0u32, 1, 5, 30, 31] {
                out.push((op, bad, k));
            }
        }
    }
    out
}

/// For every lane `k` and every memory instruction: lane `k` faults (misaligned, unmapped, or a
/// store to read-only memory), the lanes below it have accessed memory, the lanes above have
/// not (the memory comparison), and the fault names lane k's address and the instruction.
#[test]
fn the_lowest_faulting_lane_stops_the_instruction() {
    let mut checked = 0;
    for (op, bad, k) in lane_fault_params() {
        let wide = matches!(op, Op::Ld64 | Op::St64);
        let (run, _) =
            lane_fault_case(op, bad, k).run(1 << 20).unwrap_or_else(|e| panic!("{op:?} bad {bad:#x} lane {k}: {e}"));
        if k % 3 == 0 {
            assert_eq!(run.end, End::Done, "lane {k} is inactive");
            continue;
        }
        let va = A_VA + ((k as u64) << if wide { 3 } else { 2 }) + bad as u64;
        match run.end {
            End::Fault(FaultKind::ProgramAccess { pc: 10, fault }) => {
                let got = match *fault {
                    FaultKind::Misaligned { va, .. }
                    | FaultKind::OutsideMappings { va, .. }
                    | FaultKind::ReadOnly { va, .. } => va,
                    other => panic!("{other:?}"),
                };
                assert_eq!(got, va);
            }
            other => panic!("{op:?} bad {bad:#x} lane {k}: {other:?}"),
        }
        checked += 1;
    }
    assert!(checked > 40);
}

/// Lanes storing (or atomically adding) to one address or a few: the lane index masked with
/// `mask` picks the address; with `partial`, only the odd lanes run it.
fn collision_case(mask: u32, op: Op, partial: bool, group: u32) -> Case {
    let wide = op == Op::St64;
    let mut a = Asm::default();
    a.op(Op::SArg, 0, 0, 0, 0, 0).op(Op::Builtin, 1, 0, 0, 0, 13);
    a.bini(Op::And, 2, 1, mask).bini(Op::Shl, 2, 2, if wide { 3 } else { 2 });
    a.bini(Op::Mul, 4, 1, 0x0101_0101).bini(Op::Add, 5, 1, 77).bini(Op::Add, 6, 1, 1);
    a.uni(Op::Mov, 7, 1);
    if partial {
        a.bini(Op::And, 7, 1, 1);
    }
    let at = a.if_(7);
    match op {
        Op::AtomAdd => a.op(op, 8, 0, 2, 6, 64),
        _ => a.op(op, 4, 0, 2, 0, 64),
    };
    a.endif(at, None);
    // The atomic's results, per lane.
    a.bini(Op::Shl, 9, 1, 2).op(Op::St32, 8, 0, 9, 0, 1024);
    let mut c = Case::new(lane_world(&a.words), launch1(group));
    c.launch.grid = [2, 1, 1];
    c
}

fn collision_cases() -> Vec<Case> {
    let mut out = Vec::new();
    for mask in [0u32, 3, 7, 31] {
        for op in [Op::St32, Op::St64, Op::AtomAdd] {
            for partial in [false, true] {
                for group in [32, 19] {
                    out.push(collision_case(mask, op, partial, group));
                }
            }
        }
    }
    out
}

/// 32 lanes add lane + 1 to one word holding 100; each lane's result is stored.
fn running_sum_case() -> Case {
    let mut a = Asm::default();
    a.op(Op::SArg, 0, 0, 0, 0, 0).op(Op::Builtin, 1, 0, 0, 0, 13).bini(Op::Add, 6, 1, 1);
    a.uni(Op::Mov, 2, 0).op(Op::AtomAdd, 8, 0, 2, 6, 0);
    a.bini(Op::Shl, 9, 1, 2).op(Op::St32, 8, 0, 9, 0, 1024);
    let mut init = vec![0u8; 4096];
    init[..4].copy_from_slice(&100u32.to_le_bytes());
    let regions = vec![
        region(A_VA, true, init),
        region(ARGS_VA, false, u64s_le(&[A_VA])),
        region(K_VA, false, kernel_bytes(&a.words)),
    ];
    Case::new(regions, launch1(32))
}

/// All lanes (or every other lane) store to one address, or to a few: the highest lane wins;
/// atomic adds to colliding addresses return the running values in lane order.
#[test]
fn colliding_stores_and_atomics_follow_lane_order() {
    for c in collision_cases() {
        assert_eq!(c.run(1 << 20).unwrap().0.end, End::Done);
    }
    // The rule itself, on the C++ side's memory.
    let (run, p) = running_sum_case().run(1 << 20).unwrap();
    assert_eq!(run.end, End::Done);
    let (_, e) = p.both(0);
    let word = |i: usize| u32::from_le_bytes(e[i * 4..i * 4 + 4].try_into().unwrap());
    assert_eq!(word(0), 100 + 32 * 33 / 2);
    for l in 0..32u32 {
        assert_eq!(word(256 + l as usize), 100 + l * (l + 1) / 2, "lane {l}");
    }
}

/// SARG: misaligned argument buffers, slots past the mapping, 64-bit bases that wrap.
#[test]
fn scalar_argument_faults_and_wrapping_addresses() {
    let mut a = Asm::default();
    a.op(Op::SArg, 0, 0, 0, 0, 0).op(Op::SArg, 1, 0, 0, 0, 1).op(Op::SAdd, 2, 1, 0, 0, 0x8000_0000);
    a.op(Op::Builtin, 3, 0, 0, 0, 13).bini(Op::Shl, 3, 3, 2).op(Op::Ld32, 4, 0, 3, 0, 0xffff_fffc);
    a.op(Op::St32, 4, 2, 3, 0, 0x8000_0000).op(Op::SArg, 5, 0, 0, 0, 2);
    for args in [ARGS_VA, ARGS_VA + 4, ARGS_VA + 8, ARGS_VA + 16, ARGS_VA - 8] {
        // Slot 0: A - 0xfffffffc (wraps below 0; with the load's imm, A again), slot 1: A + 256
        // (SADD subtracts 2^31, the store's imm adds it back).
        let slots = [A_VA.wrapping_sub(0xffff_fffc), A_VA + 256, 0];
        let p = Pair::new(vec![
            region(A_VA, true, vec![1; 4096]),
            region(ARGS_VA, false, u64s_le(&slots)),
            region(K_VA, false, kernel_bytes(&a.words)),
        ]);
        let l = Launch { kernel: K_VA, grid: [1, 1, 1], group: [32, 1, 1], args };
        let run = lockstep(&p, &l, &[], 1 << 20).unwrap();
        match args {
            ARGS_VA => assert_eq!(run.end, End::Done),
            _ => assert!(matches!(run.end, End::Fault(FaultKind::ProgramAccess { .. })), "{:?}", run.end),
        }
    }
}

/// Instructions with no active lane: nothing happens (scalar ones and EXIT included), but they
/// count; structure instructions still run.
#[test]
fn an_empty_mask_does_nothing_but_counts() {
    let mut a = Asm::default();
    a.op(Op::SArg, 0, 0, 0, 0, 0).op(Op::Builtin, 1, 0, 0, 0, 13).bini(Op::And, 9, 1, 1).uni(Op::Mov, 10, 1);
    let lp = a.loop_();
    let i = a.if_(9);
    a.break_(9);
    // The odd lanes have broken out, the even ones wait outside the IF: the rest of the IF's
    // body runs with no lane.
    a.op(Op::SMov, 3, 0, 0, 0, 99).op(Op::SArg, 4, 0, 0, 0, 1000).uni(Op::Mov, 2, 5).op(Op::Exit, 0, 0, 0, 0, 0);
    a.op(Op::St32, 2, 3, 1, 0, 0);
    a.endif(i, None);
    a.break_(10);
    a.endloop(lp);
    a.op(Op::VFromS, 2, 3, 0, 0, 0).bini(Op::Shl, 1, 1, 2).op(Op::St32, 2, 0, 1, 0, 0);
    let p = Pair::new(vec![
        region(A_VA, true, vec![0; 4096]),
        region(ARGS_VA, false, u64s_le(&[A_VA])),
        region(K_VA, false, kernel_bytes(&a.words)),
    ]);
    let l = Launch { kernel: K_VA, grid: [1, 1, 1], group: [32, 1, 1], args: ARGS_VA };
    let run = lockstep(&p, &l, &[], 1 << 20).unwrap();
    assert_eq!(run.end, End::Done);
    let (_, e) = p.both(0);
    assert!(e[..128].iter().all(|&b| b == 0), "s3 stayed 0: the SMOV had no lane");
}

// ---------------------------------------------------------------------------------------
// Tests: random kernels
// ---------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, failure_persistence: None, ..ProptestConfig::default() })]

    /// Random structured kernels (every ALU operation, if/else/loop/break/exit, loads, stores
    /// and atomics with colliding addresses, faults at a random lane) on random grids, run in
    /// random slices with stops, saves and restores: everything equal.
    #[test]
    fn random_kernels_match(seed in any::<u64>(), size in 10i64..250) {
        if let Err(e) = check_random(seed, size) {
            prop_assert!(false, "seed {seed:#x} size {size}: {e}");
        }
    }
}

/// Many small seeds, quickly: the outcomes seen cover completion, faults of each kind, and
/// saves.
#[test]
fn random_kernels_cover_their_outcomes() {
    let mut kinds = BTreeSet::new();
    let (mut saves, mut done, mut insts, mut lane_ops) = (0, 0, 0, 0);
    for seed in 0..120u64 {
        let run = check_random(seed, 60).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        saves += run.saves;
        insts += run.stats.instructions;
        lane_ops += run.stats.lane_ops;
        match run.end {
            End::Done => done += 1,
            End::Fault(FaultKind::ProgramAccess { fault, .. }) => {
                kinds.insert(format!("{:?}", std::mem::discriminant(&*fault)));
            }
            other => panic!("seed {seed}: {other:?}"),
        }
    }
    eprintln!("{done} of 120 completed, {saves} saves, {insts} instructions, {lane_ops} lane ops, faults {kinds:?}");
    assert!(done > 40, "{done} completed");
    assert!(saves > 50, "{saves} saves");
    assert_eq!(kinds.len(), 3, "misaligned, outside, read-only: {kinds:?}");
}

// ---------------------------------------------------------------------------------------
// Tests: the example kernels
// ---------------------------------------------------------------------------------------

fn floats(rng: &mut Rng, n: usize) -> Vec<u32> {
    (0..n).map(|_| ((rng.next() as i32 % 20000) as f32 / 1000.0).to_bits()).collect()
}

/// The example kernels (program::examples) on random inputs, with several slice plans and two
/// workgroup sizes.
fn example_cases() -> Vec<(&'static str, Case)> {
    let mut rng = Rng(42);
    let (x_va, y_va, z_va) = (0x10_0000u64, 0x20_0000u64, 0x30_0000u64);
    let plans: Vec<Vec<Slice>> = vec![
        vec![],
        vec![Slice { budget: 3, stop: None, save: Save::Own }; 40],
        vec![
            Slice { budget: 1000, stop: Some(StopPoint::Wave), save: Save::Cross },
            Slice { budget: 1000, stop: Some(StopPoint::Group), save: Save::Own },
            Slice { budget: 0, stop: None, save: Save::Cross },
            Slice { budget: 77, stop: None, save: Save::Cross },
        ],
    ];
    let mut out = Vec::new();
    for ex in program::examples::ALL {
        let words = ex.assemble().expect("assembles").instructions().to_vec();
        let (mut regions, slots, threads): (Vec<Region>, Vec<u64>, u32) = match ex.name {
            "saxpy" => {
                let n = 100;
                (
                    vec![
                        region(x_va, false, words_le(&floats(&mut rng, n))),
                        region(y_va, true, words_le(&floats(&mut rng, n))),
                    ],
                    vec![x_va, y_va, 1.5f32.to_bits() as u64, n as u64],
                    128,
                )
            }
            "reduce" => {
                let n = 300;
                (
                    vec![region(x_va, false, words_le(&random_values(&mut rng, n))), region(y_va, true, vec![0; 4])],
                    vec![x_va, n as u64, y_va],
                    96,
                )
            }
            "matmul" => {
                let (m, k, n) = (5usize, 7usize, 6usize);
                (
                    vec![
                        region(x_va, false, words_le(&floats(&mut rng, m * k))),
                        region(y_va, false, words_le(&floats(&mut rng, k * n))),
                        region(z_va, true, vec![0; 4 * m * n]),
                    ],
                    vec![x_va, y_va, z_va, m as u64, k as u64, n as u64],
                    40,
                )
            }
            "prefix_sum" => {
                let n = 70;
                (
                    vec![
                        region(x_va, false, words_le(&random_values(&mut rng, n))),
                        region(y_va, true, vec![0; 4 * n]),
                    ],
                    vec![x_va, y_va, n as u64, 4],
                    96,
                )
            }
            other => panic!("unknown example {other}"),
        };
        regions.push(region(ARGS_VA, false, u64s_le(&slots)));
        regions.push(region(K_VA, false, kernel_bytes(&words)));
        for plan in &plans {
            for group in [32u32, 24] {
                let launch =
                    Launch { kernel: K_VA, grid: [threads.div_ceil(group), 1, 1], group: [group, 1, 1], args: ARGS_VA };
                out.push((ex.name, Case { regions: regions.clone(), launch, plan: plan.clone() }));
            }
        }
    }
    out
}

#[test]
fn example_kernels_match() {
    for (name, c) in example_cases() {
        let (run, _) = c.run(1 << 24).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(run.end, End::Done, "{name}");
    }
}

// ---------------------------------------------------------------------------------------
// Tests: refused kernels and dispatches
// ---------------------------------------------------------------------------------------

const STRUCTURE: &[Op] = &[Op::If, Op::Else, Op::EndIf, Op::Loop, Op::Break, Op::EndLoop, Op::Exit];

/// A random word: mostly structure instructions with nearby targets, some other opcodes, some
/// unknown bytes, fields mostly 0.
fn soup_word(rng: &mut Rng, n: u32) -> u64 {
    let op = match rng.below(20) {
        0..=11 => rng.pick(STRUCTURE) as u64,
        12..=17 => rng.pick(abi::isa::Op::ALL) as u64,
        _ => rng.below(256),
    };
    fn field(rng: &mut Rng) -> u64 {
        if rng.chance(70) {
            return 0;
        }
        let any = rng.below(64);
        rng.pick(&[1, 2, 15, 16, 62, 63, any])
    }
    let (d, a, b) = (field(rng), field(rng), field(rng));
    let c = if rng.chance(50) { rng.below(2) } else { field(rng) };
    let imm = match rng.below(6) {
        0 => 0,
        1..=3 => rng.below(n as u64 + 2),
        4 => rng.below(16),
        _ => rng.next() & 0xffff_ffff,
    };
    op | d << 8 | a << 14 | b << 20 | c << 26 | imm << 32
}

fn soup(rng: &mut Rng) -> Vec<u64> {
    if rng.chance(10) {
        // Deep nesting.
        let depth = 14 + rng.below(5) as u32;
        let mut a = Asm::default();
        let mut open = Vec::new();
        for _ in 0..depth {
            if rng.chance(50) {
                open.push((true, a.loop_()));
            } else {
                open.push((false, a.if_(1)));
            }
        }
        while let Some((is_loop, at)) = open.pop() {
            if is_loop { a.endloop(at) } else { a.endif(at, None) }
        }
        return a.words;
    }
    let n = 1 + rng.below(24) as u32;
    (0..n).map(|_| soup_word(rng, n)).collect()
}

/// A valid kernel with one word changed a little (a target moved, an opcode swapped, a field
/// set).
fn mutant(rng: &mut Rng) -> Vec<u64> {
    let mut words = random_kernel(rng.next(), 20 + rng.below(40) as i64);
    let at = rng.below(words.len() as u64) as usize;
    let x = words[at];
    words[at] = match rng.below(5) {
        0 => x.wrapping_add(rng.pick(&[1u64, 2, 0xffff_ffff]) << 32),
        1 => (x & !0xff) | rng.pick(STRUCTURE) as u64,
        2 => x ^ (1 << (8 + rng.below(56))),
        3 => (x & 0xffff_ffff) | (rng.below(words.len() as u64 + 1) << 32),
        _ => soup_word(rng, words.len() as u32),
    };
    words
}

/// Validation reports the first error of the Rust single pass, error for error.
#[test]
fn validation_matches_error_for_error() {
    let mut rng = Rng(99);
    let mut kinds = BTreeSet::new();
    let mut unbalanced = BTreeSet::new();
    for i in 0..40_000 {
        let words = if i % 4 == 3 { mutant(&mut rng) } else { soup(&mut rng) };
        let want = abi::isa::validate(&words).map(|_| ());
        let got = emu_validate(&words);
        assert_eq!(got, want, "{}", disasm(&words));
        if let Err(e) = want {
            kinds.insert(format!("{:?}", std::mem::discriminant(&e.kind)));
            if let ProgramErrorKind::Unbalanced(what) = e.kind {
                unbalanced.insert(what);
            }
        }
    }
    // Every kind validate can report (the header kinds come from the loader: see below).
    assert_eq!(kinds.len(), 7, "{kinds:?}");
    assert_eq!(unbalanced.len(), 6, "{unbalanced:?}");
    // Lengths.
    assert_eq!(emu_validate(&[]), abi::isa::validate(&[]).map(|_| ()));
    let long = vec![0u64; 65537];
    assert_eq!(emu_validate(&long), abi::isa::validate(&long).map(|_| ()));
    let max = vec![0u64; 65536];
    assert_eq!(emu_validate(&max), Ok(()));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]

    /// Refused kernels through the loader of both sides: the same fault.
    #[test]
    fn refused_kernels_fault_alike(seed in any::<u64>()) {
        let mut rng = Rng(seed);
        let words = if rng.chance(50) { soup(&mut rng) } else { mutant(&mut rng) };
        let p = Pair::new(vec![region(A_VA, true, vec![0; 4096]), region(K_VA, false, kernel_bytes(&words))]);
        let l = Launch { kernel: K_VA, grid: [1, 1, 1], group: [8, 1, 1], args: A_VA };
        if let Err(e) = lockstep(&p, &l, &[], 100_000) {
            prop_assert!(false, "{e}\n{}", disasm(&words));
        }
    }
}

/// Header faults, a kernel outside its mapping or across its end, a kernel at an odd VA
/// (allowed: the header is not an aligned access), and every BadDispatch.
#[test]
fn loader_and_dispatch_faults_match() {
    let body = vec![w(Op::Nop, 0, 0, 0, 0, 0), w(Op::Exit, 0, 0, 0, 0, 0)];
    let good = kernel_bytes(&body);
    let mut headers: Vec<Vec<u8>> = Vec::new();
    for (word, value) in [(0, 0x12345678u32), (1, 2), (2, 0), (2, 65537), (2, 3), (3, 1), (4, 1), (7, 0x8000_0000)] {
        let mut k = good.clone();
        k[word * 4..word * 4 + 4].copy_from_slice(&value.to_le_bytes());
        headers.push(k);
    }
    let mut seen = BTreeSet::new();
    for k in &headers {
        let p = Pair::new(vec![region(K_VA, false, k.clone()), region(A_VA, true, vec![0; 64])]);
        let l = Launch { kernel: K_VA, grid: [1, 1, 1], group: [1, 1, 1], args: A_VA };
        match lockstep(&p, &l, &[], 1000).unwrap().end {
            End::Fault(f) => seen.insert(format!("{f:?}")),
            other => panic!("{other:?}"),
        };
    }
    assert_eq!(seen.len(), 6, "{seen:?}");
    // Placement.
    for (kernel, offset) in [(K_VA, 0u64), (K_VA + 3, 3), (K_VA + 5, 5), (K_VA - 8, 0), (K_VA + 4096, 0), (K_VA + 8, 8)]
    {
        let mut init = vec![0u8; offset as usize];
        init.extend(&good);
        let p = Pair::new(vec![region(K_VA, false, init), region(A_VA, true, vec![0; 64])]);
        let l = Launch { kernel, grid: [1, 1, 1], group: [1, 1, 1], args: A_VA };
        lockstep(&p, &l, &[], 1000).unwrap_or_else(|e| panic!("kernel {kernel:#x}: {e}"));
    }
    // A body running past its mapping.
    let mut cut = good.clone();
    cut.truncate(good.len() - 4);
    let p = Pair::new(vec![region(K_VA, false, cut), region(A_VA, true, vec![0; 64])]);
    let l = Launch { kernel: K_VA, grid: [1, 1, 1], group: [1, 1, 1], args: A_VA };
    assert!(matches!(lockstep(&p, &l, &[], 1000).unwrap().end, End::Fault(FaultKind::OutsideMappings { .. })));
    // Dimensions.
    let p = Pair::new(vec![region(K_VA, false, good.clone()), region(A_VA, true, vec![0; 64])]);
    let dims: &[([u32; 3], [u32; 3])] = &[
        ([0, 1, 1], [1, 1, 1]),
        ([1, 1, 0], [0, 1, 1]),
        ([1, 1, 1], [1, 0, 1]),
        ([1, 1, 1], [1025, 1, 1]),
        ([1, 1, 1], [32, 32, 2]),
        ([1, 1, 1], [u32::MAX, u32::MAX, u32::MAX]),
        ([1, 1, 1], [32, 32, 1]),
        ([1 << 20, 1 << 20, 1], [1, 1, 1]),
        ([1 << 20, 1 << 20, 2], [1, 1, 1]),
        ([u32::MAX, u32::MAX, u32::MAX], [1, 1, 1]),
        ([u32::MAX, 2, 1], [1, 1, 1]),
        // 2^40 groups exactly; and products that wrap a u64 if multiplied out.
        ([1 << 20, 1 << 20, 1], [1, 1, 1]),
        ([1 << 20, 1 << 20, 1 << 24], [1, 1, 1]),
        ([1 << 20, 1 << 20, 1 << 31], [1, 1, 1]),
        ([1, 1, 1], [1024, 1, 1 << 31]),
        ([1, 1, 1], [2, 1 << 31, 1 << 31]),
    ];
    for &(grid, group) in dims {
        let l = Launch { kernel: K_VA, grid, group, args: A_VA };
        match start_both(&p, &l).unwrap() {
            Ok(_) => assert!(grid.iter().map(|&x| x as u128).product::<u128>() <= 1 << 40),
            Err(f) => assert!(matches!(f, FaultKind::BadDispatch { .. }), "{f:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Tests: save areas
// ---------------------------------------------------------------------------------------

/// A dispatch stopped mid-wave inside nested control flow, with its save bytes (equal on both
/// sides).
fn stopped_state(seed: u64) -> Option<(Pair, Launch, Vec<u8>)> {
    let mut rng = Rng(seed);
    let mut a = Asm::default();
    a.op(Op::SArg, 0, 0, 0, 0, 0).op(Op::Builtin, 1, 0, 0, 0, 13).bini(Op::And, 2, 1, 3).bini(Op::Add, 2, 2, 1);
    let l1 = a.loop_();
    a.bini(Op::CmpEq, 3, 2, 0);
    a.break_(3);
    a.bini(Op::Sub, 2, 2, 1).bini(Op::And, 4, 1, 1);
    let i1 = a.if_(4);
    a.bini(Op::Add, 5, 5, 3).bini(Op::And, 6, 1, 2);
    let i2 = a.if_(6);
    a.bini(Op::Add, 5, 5, 7);
    let e2 = a.else_(i2);
    a.bini(Op::Xor, 5, 5, 1);
    a.endif(i2, Some(e2));
    a.endif(i1, None);
    a.bini(Op::Shl, 7, 1, 2).op(Op::AtomAdd, 8, 0, 7, 5, 0);
    a.endloop(l1);
    a.bini(Op::Shl, 7, 1, 2).op(Op::St32, 5, 0, 7, 0, 512);
    let words = a.words;
    let p = Pair::new(vec![
        region(A_VA, true, vec![0; 4096]),
        region(ARGS_VA, false, u64s_le(&[A_VA])),
        region(K_VA, false, kernel_bytes(&words)),
    ]);
    let l = Launch { kernel: K_VA, grid: [2, 1, 1], group: [40, 1, 1], args: ARGS_VA };
    let mut b = start_both(&p, &l).unwrap().ok()?;
    let budget = 1 + rng.below(150);
    b.slice(&p, &Slice { budget, stop: None, save: Save::No }).unwrap();
    let (rbytes, _) = b.save_both().unwrap();
    Some((p, l, rbytes))
}

/// Restores `bytes` (area of `len` bytes) on both sides; when both accept it, runs both on
/// (capped: a corrupt but accepted state may loop) and compares.
fn restore_both(p: &Pair, bytes: &[u8], len: usize) -> Result<Result<End, FaultKind>, String> {
    let mut shown = bytes.to_vec();
    shown.resize(len, 0);
    // The reference reads from `offset` up to the end of its region: put the area at the end.
    let region_len = CONTEXT_SAVE_BYTES as usize + 4096;
    let offset = (region_len - len) as u64;
    let area = Shm::new("isa-area", region_len).expect("shm");
    area.write(offset, &shown).expect("write");
    let r = Dispatch::restore(&p.vm, &area, offset, 32);
    let mut emu = Emu::new(&p.maps);
    let e = emu.restore(&shown);
    match (r, e) {
        (Ok(d), Ok(())) => {
            let mut b = Both { reference: d, emu, stats: ComputeStats::default(), saves: 0 };
            let plan = [Slice { budget: 50, stop: None, save: Save::Own }];
            let end = finish(&mut b, p, &plan, 20_000)?;
            p.compare_memory()?;
            Ok(Ok(end))
        }
        (Err(a), Err(b)) if a == b => Ok(Err(a)),
        (r, e) => Err(format!("restore: reference {:?}, emulated {e:?}", r.err())),
    }
}

fn put32(b: &mut [u8], at: usize, x: u32) {
    b[at..at + 4].copy_from_slice(&x.to_le_bytes());
}
fn put64(b: &mut [u8], at: usize, x: u64) {
    b[at..at + 8].copy_from_slice(&x.to_le_bytes());
}
fn get32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

/// Every BadSaveArea reason (but "truncated", which no width-32 state reaches: the largest
/// is far below CONTEXT_SAVE_BYTES), each produced on purpose and refused alike.
#[test]
fn corrupt_save_areas_are_refused_alike() {
    let (p, _l, good) = (0..50)
        .find_map(|s| stopped_state(s).filter(|(_, _, b)| get32(b, 60) == 1 && get32(b, 104) >= 2))
        .expect("a state with a stack");
    let depth = get32(&good, 104) as usize;
    let len = 108 + 24 * depth + 128 + 64 * 32 * 4;
    let why = |r: Result<End, FaultKind>, want: &str| match r {
        Err(FaultKind::BadSaveArea { why }) => why,
        other => panic!("{want}: {other:?}"),
    };
    let case = |f: &dyn Fn(&mut Vec<u8>), want: &str| {
        let mut b = good[..len].to_vec();
        f(&mut b);
        let r = restore_both(&p, &b, b.len()).unwrap();
        assert_eq!(why(r, want), want);
    };
    case(&|b| put32(b, 0, 0), "bad magic or version");
    case(&|b| put32(b, 4, 2), "bad magic or version");
    case(&|b| put32(b, 48, 64), "saved with another wave width");
    case(&|b| put64(b, 52, 3), "next group beyond the grid");
    case(&|b| put32(b, 60, 2), "bad wave flag");
    case(&|b| put64(b, 64, 2), "wave outside the grid");
    case(&|b| put32(b, 72, 2), "wave outside the grid");
    case(&|b| put32(b, 76, 10_000), "wave state out of range");
    case(&|b| b[80] ^= 1, "wave state out of range");
    case(&|b| put64(b, 88, 1 << 40), "wave state out of range");
    case(&|b| put64(b, 96, 1 << 33), "wave state out of range");
    case(&|b| put32(b, 104, 17), "control-flow stack too deep");
    case(&|b| put64(b, 112, 1 << 50), "control-flow frame out of range");
    case(&|b| put64(b, 120, 1 << 50), "control-flow frame out of range");
    case(&|b| put32(b, 128, 10_000), "control-flow frame out of range");
    case(&|b| put32(b, 108, 2), "unknown control-flow frame");
    case(&|b| b.truncate(100), "save area out of bounds");
    // Refused by the loader and the dimension check instead.
    let mut b = good[..len].to_vec();
    put64(&mut b, 8, 0x9999_0000);
    assert!(matches!(restore_both(&p, &b, len).unwrap(), Err(FaultKind::OutsideMappings { .. })));
    put64(&mut b, 8, A_VA);
    assert!(matches!(restore_both(&p, &b, len).unwrap(), Err(FaultKind::BadProgram(_))));
    let mut b = good[..len].to_vec();
    put32(&mut b, 16, 0);
    assert!(matches!(restore_both(&p, &b, len).unwrap(), Err(FaultKind::BadDispatch { .. })));
    // Cut at every length: out of bounds at each field, or (at full length) accepted.
    let cuts = (0..=300).chain((300..len).step_by(61)).chain([len - 1, len]);
    for cut in cuts {
        let r = restore_both(&p, &good[..cut], cut).unwrap_or_else(|e| panic!("cut {cut}: {e}"));
        assert_eq!(r.is_ok(), cut == len, "cut {cut}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

    /// Random corruption of the uniform part of a save area (fields set to edge values, bits
    /// flipped, frames rewritten): refused alike, or accepted alike and then run alike —
    /// control-flow stacks that do not match the program included.
    #[test]
    fn corrupt_save_areas_restore_alike(seed in any::<u64>(), edits in proptest::collection::vec((any::<u64>(), any::<u64>()), 1..4)) {
        let Some((p, _l, good)) = stopped_state(seed) else { return Ok(()) };
        let has_wave = get32(&good, 60) == 1;
        let depth = if has_wave { get32(&good, 104) as usize } else { 0 };
        let len = if has_wave { 108 + 24 * depth + 128 + 8192 } else { 64 };
        let uniform = if has_wave { 108 + 24 * depth + 128 } else { 64 };
        let mut b = good[..len].to_vec();
        for (at, v) in edits {
            let mut rng = Rng(v);
            let at = (at % uniform as u64) as usize & !3;
            match rng.below(6) {
                0 => b[at] ^= 1 << rng.below(8),
                1 => put32(&mut b, at, rng.pick(&[0, 1, 2, 3, 16, 17, 31, 32, 33, 64, u32::MAX])),
                2 if at + 8 <= len => put64(&mut b, at, rng.pick(&[0, 1, 3, 0xff, 0xffff_ffff, 1 << 32, u64::MAX])),
                3 if depth > 0 => {
                    // Rewrite a frame: kind, masks within live, start within the program.
                    let f = 108 + 24 * rng.below(depth as u64) as usize;
                    let live = u64::from_le_bytes(b[80..88].try_into().unwrap());
                    put32(&mut b, f, rng.below(2) as u32);
                    put64(&mut b, f + 4, live & rng.next());
                    put64(&mut b, f + 12, live & rng.next());
                    put32(&mut b, f + 20, rng.below(40) as u32);
                }
                4 if has_wave => {
                    // Another pc, or deeper/shallower stacks with the registers shifted.
                    put32(&mut b, 76, rng.below(40) as u32);
                }
                _ => b[at] = rng.next() as u8,
            }
        }
        if let Err(e) = restore_both(&p, &b, b.len()) {
            prop_assert!(false, "{e}");
        }
    }
}

/// Restored stacks that do not match the program: the runtime's "stack does not match"
/// faults, and a restored stack of 16 frames under a program that pushes 16 more.
#[test]
fn mismatched_stacks_run_alike() {
    // 16 nested LOOPs, each left at once by every lane.
    let mut a = Asm::default();
    a.uni(Op::Mov, 1, 1);
    let mut open = Vec::new();
    for _ in 0..16 {
        open.push(a.loop_());
        a.uni(Op::Mov, 2, 0);
    }
    a.break_(1);
    while let Some(at) = open.pop() {
        a.endloop(at);
        if !open.is_empty() {
            a.break_(1);
        }
    }
    a.op(Op::Exit, 0, 0, 0, 0, 0);
    // Reached only from a restored pc: a loop, an IF.
    let lp = a.loop_();
    a.break_(1);
    a.endloop(lp);
    let i = a.if_(1);
    a.endif(i, None);
    let words = a.words;
    let n = words.len() as u32;
    let p = Pair::new(vec![region(A_VA, true, vec![0; 64]), region(K_VA, false, kernel_bytes(&words))]);
    let l = Launch { kernel: K_VA, grid: [1, 1, 1], group: [32, 1, 1], args: A_VA };
    let b = start_both(&p, &l).unwrap().unwrap();
    let (good, _) = b.save_both().unwrap();
    let (mut c, mut ends) = (0, BTreeSet::new());
    for kinds in [[0u32; 16], [1; 16]] {
        for pc in [0, 1, 5, n - 5, n - 4, n - 3, n - 1, n] {
            for depth in [1usize, 5, 16] {
                // A fresh dispatch has no wave: build one.
                let mut s = good[..64].to_vec();
                put32(&mut s, 60, 1);
                s.extend(0u64.to_le_bytes());
                s.extend(0u32.to_le_bytes());
                s.extend(pc.to_le_bytes());
                s.extend(u64::from(u32::MAX).to_le_bytes());
                s.extend(u64::from(u32::MAX).to_le_bytes());
                s.extend(0u64.to_le_bytes());
                s.extend((depth as u32).to_le_bytes());
                for (i, &k) in kinds.iter().enumerate().take(depth) {
                    s.extend(k.to_le_bytes());
                    s.extend(u64::from(u32::MAX).to_le_bytes());
                    s.extend(0u64.to_le_bytes());
                    s.extend(((i as u32 * 7) % (n + 1)).to_le_bytes());
                }
                s.resize(s.len() + 128 + 8192, 0);
                let r = restore_both(&p, &s, s.len()).unwrap_or_else(|e| panic!("pc {pc} depth {depth}: {e}"));
                ends.insert(format!("{:?}", r.expect("accepted")));
                c += 1;
            }
        }
    }
    assert_eq!(c, 48);
    // Among the outcomes: the runtime's mismatch fault, a stack grown past 16 frames that saves
    // but does not restore, and runs to completion.
    let mismatch = End::Fault(FaultKind::BadSaveArea { why: "control-flow stack does not match the program" });
    let too_deep = End::Fault(FaultKind::BadSaveArea { why: "control-flow stack too deep" });
    for want in [mismatch, too_deep, End::Done] {
        assert!(ends.contains(&format!("{want:?}")), "{want:?} not in {ends:?}");
    }
}

// ---------------------------------------------------------------------------------------
// Check vectors for the GPU build
// ---------------------------------------------------------------------------------------

/// A little-endian writer.
#[derive(Default)]
struct Out(Vec<u8>);

impl Out {
    fn u32(&mut self, x: u32) {
        self.0.extend(x.to_le_bytes());
    }
    fn u64(&mut self, x: u64) {
        self.0.extend(x.to_le_bytes());
    }
    /// A length, the bytes, then zeros to a multiple of 4.
    fn bytes(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.0.extend(b);
        while !self.0.len().is_multiple_of(4) {
            self.0.push(0);
        }
    }
    fn fault(&mut self, f: &Fault) {
        for x in [f.kind, f.sub] {
            self.u32(x);
        }
        for x in [f.a, f.b, f.c] {
            self.u64(x);
        }
        for x in [f.pc, f.inner, f.s1, f.s2] {
            self.u32(x);
        }
    }
}

/// Bytes a save area's state takes (width 32).
fn save_len(area: &[u8]) -> usize {
    if get32(area, 60) == 1 { 108 + 24 * get32(area, 104) as usize + 128 + 64 * 32 * 4 } else { 64 }
}

/// Writes `c` and what the emulated build does with it — the run `finish` makes: the plan's
/// slices (a save, then a restore of the saved bytes, where the slice saves), then slices of
/// 100000 while fewer than `cap` instructions ran — and the memory at the end.
fn record(out: &mut Out, c: &Case, cap: u64) {
    out.u32(c.regions.len() as u32);
    for r in &c.regions {
        out.u64(r.va);
        out.u64(r.offset);
        out.u32(r.writable as u32);
        out.bytes(&r.init);
    }
    let l = &c.launch;
    out.u64(l.kernel);
    for x in l.grid.into_iter().chain(l.group) {
        out.u32(x);
    }
    out.u64(l.args);
    out.u32(c.plan.len() as u32);
    for s in &c.plan {
        out.u64(s.budget);
        out.u32(stop_code(s.stop));
        out.u32((s.save != Save::No) as u32);
    }
    out.u64(cap);
    let p = Pair::new(c.regions.clone());
    let mut emu = Emu::new(&p.maps);
    let (ok, f) = emu.start_raw(l.kernel, l.grid, l.group, l.args);
    out.u32(ok);
    out.fault(&f);
    let step = |emu: &mut Emu, out: &mut Out, budget: u64, stop: Option<StopPoint>| {
        let (r, at, f) = emu.run_raw(budget, stop);
        out.u32(r);
        out.u32(at);
        out.fault(&f);
        out.u64(emu.stats.instructions);
        out.u64(emu.stats.lane_ops);
        r == 0 || r == 3
    };
    if ok == 1 {
        let mut ended = false;
        for s in &c.plan {
            if step(&mut emu, out, s.budget, s.stop) {
                ended = true;
                break;
            }
            if s.save != Save::No {
                let (ok, f, area) = emu.save_raw(CONTEXT_SAVE_BYTES);
                out.u32(ok);
                out.fault(&f);
                out.bytes(&area[..save_len(&area)]);
                let (ok, f) = emu.restore_raw(&area);
                out.u32(ok);
                out.fault(&f);
                if ok != 1 {
                    ended = true;
                    break;
                }
            }
        }
        while !ended && emu.stats.instructions < cap {
            ended = step(&mut emu, out, 100_000, None);
        }
    }
    for i in 0..c.regions.len() {
        out.bytes(&p.both(i).1);
    }
}

/// Writes check vectors for the GPU build of isa.cuh to the file DB_ISA_GPU_CASES names: the
/// cases above (the emulated build's results are the reference's: every case also passes the
/// lockstep comparison here), for a harness that replays them on a GPU and compares bit for
/// bit. Without DB_ISA_GPU_CASES, does nothing.
#[test]
#[ignore = "writes check vectors for a GPU run: DB_ISA_GPU_CASES=<file>"]
fn write_gpu_check_vectors() {
    let Some(path) = std::env::var_os("DB_ISA_GPU_CASES") else { return };
    let mut cases = vec![alu_edge_case().0, nan_case().0, running_sum_case()];
    for masked in [false, true] {
        for threads in [32, 7] {
            cases.push(fmin_case(masked, threads));
        }
    }
    cases.extend(builtins_cases());
    cases.extend(lane_fault_params().into_iter().map(|(op, bad, k)| lane_fault_case(op, bad, k)));
    cases.extend(collision_cases());
    cases.extend(example_cases().into_iter().map(|(_, c)| c));
    // Refused dimensions (start faults), one of them a product that wraps a u64.
    let dims: [([u32; 3], [u32; 3]); 4] = [
        ([0, 1, 1], [1, 1, 1]),
        ([1, 1, 1], [1025, 1, 1]),
        ([1 << 20, 1 << 20, 1 << 24], [1, 1, 1]),
        ([1, 1, 1], [2, 1 << 31, 1 << 31]),
    ];
    for (grid, group) in dims {
        let mut c = nan_case().0;
        c.launch.grid = grid;
        c.launch.group = group;
        cases.push(c);
    }
    let n: u64 = std::env::var("DB_ISA_GPU_RANDOM").ok().and_then(|x| x.parse().ok()).unwrap_or(300);
    for seed in 0..n {
        cases.push(random_case(seed, 10 + (seed * 7) as i64 % 130).0);
    }
    let mut out = Out::default();
    out.u32(0x5550_4749);
    out.u32(1);
    out.u32(cases.len() as u32);
    for c in &cases {
        c.run(5_000_000).map(|_| ()).unwrap();
        record(&mut out, c, 5_000_000);
    }
    std::fs::write(path, &out.0).unwrap();
}
