//! The compute engine's SIMT interpreter: runs `DISPATCH` (ISA in [`abi::isa`]).
//!
//! A workgroup of `group` threads is cut into waves of the device's wave width; a wave runs one
//! instruction for all its lanes under an execution mask, the way SIMT hardware does, so the
//! decode cost is paid once per instruction, not once per lane. Registers are kept
//! register-major (`v[r][lane]`), so each instruction is a loop over contiguous lanes that the
//! compiler vectorizes.
//!
//! Execution is resumable at any instruction boundary. [`Dispatch::run`] executes at most a
//! budget of wave-instructions and returns [`Progress::Yield`] when it runs out. The complete
//! state — next workgroup, and the wave in flight with its pc, masks, control-flow stack and
//! registers — serializes with [`Dispatch::save`] into the queue's context save area in GPU
//! memory, and [`Dispatch::restore`] continues from there with bit-identical results. Restore
//! validates everything it reads, since that memory is not trusted.
//!
//! Faults never panic: a memory access outside the process's mappings or misaligned becomes
//! [`FaultKind::ProgramAccess`] with the VA, the access and the instruction index; a malformed
//! binary is refused before the first instruction with [`FaultKind::BadProgram`].

use std::sync::Arc;

use abi::isa::{self, Builtin, CANONICAL_NAN, Inst, MAX_NESTING, Op, ProgramHeader, SREGS, VREGS};
use abi::queue::{Access, FaultKind};
use shm::Shm;

use crate::memory::AddressSpace;

/// Widest wave the device supports (masks are `u64`).
pub const MAX_WAVE: usize = 64;
pub use abi::isa::{MAX_GRID_GROUPS, MAX_GROUP_THREADS, check_dims};

type Lanes = [u32; MAX_WAVE];

/// A validated kernel.
#[derive(Debug)]
pub struct Program {
    insts: Vec<Inst>,
}

impl Program {
    /// Loads and validates the kernel binary at `va`.
    pub fn load(vm: &AddressSpace, va: u64) -> Result<Program, FaultKind> {
        let r = vm.translate(va, isa::PROGRAM_HEADER_BYTES, Access::Read)?;
        let mut hw = [0u32; 8];
        r.shm.read_u32s(r.offset, &mut hw).map_err(|_| outside(va, 32, Access::Read))?;
        let h = ProgramHeader::from_words(&hw).map_err(FaultKind::BadProgram)?;
        let bytes = h.instructions as u64 * 8;
        let body = va + isa::PROGRAM_HEADER_BYTES;
        let r = vm.translate(body, bytes, Access::Read)?;
        let mut raw = vec![0u8; bytes as usize];
        r.shm.read(r.offset, &mut raw).map_err(|_| outside(body, bytes, Access::Read))?;
        let words: Vec<u64> = raw.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
        Ok(Program { insts: isa::validate(&words).map_err(FaultKind::BadProgram)? })
    }

    /// Instructions.
    pub fn len(&self) -> usize {
        self.insts.len()
    }

    /// Whether it is empty (never, once validated).
    pub fn is_empty(&self) -> bool {
        self.insts.is_empty()
    }
}

fn outside(va: u64, bytes: u64, access: Access) -> FaultKind {
    FaultKind::OutsideMappings { va, bytes, access }
}

/// A control-flow frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Frame {
    /// An `IF`: the mask before it, and the lanes waiting for the `ELSE`.
    If { outer: u64, else_lanes: u64 },
    /// A `LOOP`: the mask before it, the body's first instruction, lanes that broke out.
    Loop { outer: u64, start: u32, broken: u64 },
}

/// A wave in flight.
#[derive(Clone)]
struct Wave {
    group: u64,
    index: u32,
    pc: u32,
    live: u64,
    exec: u64,
    exited: u64,
    stack: Vec<Frame>,
    s: [u64; SREGS],
    v: Box<[Lanes; VREGS]>,
}

impl Wave {
    /// Lanes that may not run now: exited, or broken out of an enclosing loop.
    fn off(&self) -> u64 {
        self.stack.iter().fold(self.exited, |m, f| match f {
            Frame::Loop { broken, .. } => m | broken,
            Frame::If { .. } => m,
        })
    }
}

/// How far a [`Dispatch::run`] got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Every workgroup finished.
    Done,
    /// The budget ran out; state must be saved (or kept) and the dispatch resumed.
    Yield,
    /// It reached the boundary [`Dispatch::run_to`] was asked to stop at (a preemption): state
    /// must be saved and the dispatch resumed.
    Stopped(abi::preempt::StopPoint),
}

/// Counters of executed work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ComputeStats {
    /// Wave-instructions executed.
    pub instructions: u64,
    /// Lane operations: the active lanes of every executed instruction.
    pub lane_ops: u64,
}

/// A dispatch in progress.
pub struct Dispatch {
    kernel: u64,
    grid: [u32; 3],
    group: [u32; 3],
    args: u64,
    width: u32,
    program: Arc<Program>,
    next_group: u64,
    wave: Option<Wave>,
}

/// One cached translation, so a run of accesses to the same buffer skips the lookup.
struct Mem<'a> {
    vm: &'a AddressSpace,
    last: Option<(u64, u64, &'a Shm, u64, bool)>,
}

impl<'a> Mem<'a> {
    #[inline]
    fn resolve(&mut self, va: u64, bytes: u64, access: Access) -> Result<(&'a Shm, u64), FaultKind> {
        if !va.is_multiple_of(bytes) {
            return Err(FaultKind::Misaligned { va, align: bytes, access });
        }
        if let Some((start, end, shm, off, writable)) = self.last
            && va >= start
            && va.checked_add(bytes).is_some_and(|e| e <= end)
            && (writable || access == Access::Read)
        {
            return Ok((shm, off + (va - start)));
        }
        self.vm.translate(va, bytes, access)?;
        let m = self.vm.find(va).expect("translated");
        self.last = Some((m.va, m.va + m.bytes, &m.shm, m.offset, m.writable));
        Ok((&m.shm, m.offset + (va - m.va)))
    }
}

impl Dispatch {
    /// Starts a dispatch: validates the dimensions and loads the kernel.
    pub fn start(
        vm: &AddressSpace,
        kernel: u64,
        grid: [u32; 3],
        group: [u32; 3],
        args: u64,
        width: u32,
    ) -> Result<Dispatch, FaultKind> {
        check_dims(grid, group).map_err(|why| FaultKind::BadDispatch { why })?;
        let program = Arc::new(Program::load(vm, kernel)?);
        Ok(Dispatch {
            kernel,
            grid,
            group,
            args,
            width: width.clamp(1, MAX_WAVE as u32),
            program,
            next_group: 0,
            wave: None,
        })
    }

    fn total_groups(&self) -> u64 {
        self.grid.iter().map(|&x| x as u64).product()
    }

    fn group_threads(&self) -> u64 {
        self.group.iter().map(|&x| x as u64).product()
    }

    fn waves_per_group(&self) -> u32 {
        self.group_threads().div_ceil(self.width as u64) as u32
    }

    fn new_wave(&self, group: u64, index: u32) -> Wave {
        let first = index as u64 * self.width as u64;
        let n = (self.group_threads() - first).min(self.width as u64);
        let live = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
        Wave {
            group,
            index,
            pc: 0,
            live,
            exec: live,
            exited: 0,
            stack: Vec::new(),
            s: [0; SREGS],
            v: Box::new([[0; MAX_WAVE]; VREGS]),
        }
    }

    /// Runs at most `budget` wave-instructions.
    pub fn run(&mut self, vm: &AddressSpace, budget: u64, stats: &mut ComputeStats) -> Result<Progress, FaultKind> {
        self.run_to(vm, budget, None, stats)
    }

    /// Runs at most `budget` wave-instructions, and stops early at the first boundary of kind
    /// `stop` ([`StopPoint::Wave`]: a wave ended; [`StopPoint::Group`]: a workgroup ended —
    /// also a wave boundary) with [`Progress::Stopped`]. Other points are not boundaries
    /// inside a dispatch and never stop it.
    ///
    /// [`StopPoint::Wave`]: abi::preempt::StopPoint::Wave
    /// [`StopPoint::Group`]: abi::preempt::StopPoint::Group
    pub fn run_to(
        &mut self,
        vm: &AddressSpace,
        budget: u64,
        stop: Option<abi::preempt::StopPoint>,
        stats: &mut ComputeStats,
    ) -> Result<Progress, FaultKind> {
        use abi::preempt::StopPoint;
        let mut left = budget;
        let mut mem = Mem { vm, last: None };
        loop {
            let mut wave = match self.wave.take() {
                Some(w) => w,
                None => {
                    if self.next_group >= self.total_groups() {
                        return Ok(Progress::Done);
                    }
                    self.new_wave(self.next_group, 0)
                }
            };
            let finished = self.run_wave(&mut wave, &mut mem, &mut left, stats)?;
            if finished {
                let done = self.wave.is_none() && wave.group + 1 >= self.total_groups();
                if wave.index + 1 < self.waves_per_group() {
                    self.wave = Some(self.new_wave(wave.group, wave.index + 1));
                    if stop == Some(StopPoint::Wave) {
                        return Ok(Progress::Stopped(StopPoint::Wave));
                    }
                } else {
                    self.next_group = wave.group + 1;
                    if !done && matches!(stop, Some(StopPoint::Wave | StopPoint::Group)) {
                        return Ok(Progress::Stopped(StopPoint::Group));
                    }
                }
            } else {
                self.wave = Some(wave);
            }
            if left == 0 {
                return Ok(if self.wave.is_none() && self.next_group >= self.total_groups() {
                    Progress::Done
                } else {
                    Progress::Yield
                });
            }
        }
    }

    fn builtin(&self, w: &Wave, b: Builtin) -> Lanes {
        let g = w.group;
        let gid = [
            g % self.grid[0] as u64,
            (g / self.grid[0] as u64) % self.grid[1] as u64,
            g / (self.grid[0] as u64 * self.grid[1] as u64),
        ];
        let mut out = [0u32; MAX_WAVE];
        for (l, o) in out.iter_mut().enumerate().take(self.width as usize) {
            let t = w.index as u64 * self.width as u64 + l as u64;
            let lid = [
                t % self.group[0] as u64,
                (t / self.group[0] as u64) % self.group[1] as u64,
                t / (self.group[0] as u64 * self.group[1] as u64),
            ];
            *o = match b {
                Builtin::GroupIdX => gid[0] as u32,
                Builtin::GroupIdY => gid[1] as u32,
                Builtin::GroupIdZ => gid[2] as u32,
                Builtin::LocalIdX => lid[0] as u32,
                Builtin::LocalIdY => lid[1] as u32,
                Builtin::LocalIdZ => lid[2] as u32,
                Builtin::GroupSizeX => self.group[0],
                Builtin::GroupSizeY => self.group[1],
                Builtin::GroupSizeZ => self.group[2],
                Builtin::GridSizeX => self.grid[0],
                Builtin::GridSizeY => self.grid[1],
                Builtin::GridSizeZ => self.grid[2],
                Builtin::GlobalIdX => (gid[0] * self.group[0] as u64 + lid[0]) as u32,
                Builtin::LocalIndex => t as u32,
            };
        }
        out
    }

    /// Runs one wave until it ends or the budget runs out. Returns whether it ended.
    fn run_wave(
        &self,
        w: &mut Wave,
        mem: &mut Mem<'_>,
        left: &mut u64,
        stats: &mut ComputeStats,
    ) -> Result<bool, FaultKind> {
        let prog = &self.program.insts;
        let width = self.width as usize;
        let full = w.live;
        while *left > 0 {
            if w.pc as usize >= prog.len() || w.live & !w.exited == 0 {
                return Ok(true);
            }
            let i = prog[w.pc as usize];
            let pc = w.pc;
            w.pc += 1;
            *left -= 1;
            stats.instructions += 1;
            let exec = w.exec;
            if exec == 0 && !matches!(i.op, Op::If | Op::Else | Op::EndIf | Op::Loop | Op::Break | Op::EndLoop) {
                continue;
            }
            stats.lane_ops += exec.count_ones() as u64;
            let fault = |f: FaultKind| FaultKind::ProgramAccess { pc, fault: Box::new(f) };
            match i.op {
                Op::Nop => {}
                Op::Add => bin(w, &i, width, full, u32::wrapping_add),
                Op::Sub => bin(w, &i, width, full, u32::wrapping_sub),
                Op::Mul => bin(w, &i, width, full, u32::wrapping_mul),
                Op::MulHiU => bin(w, &i, width, full, |a, b| ((a as u64 * b as u64) >> 32) as u32),
                Op::DivU => bin(w, &i, width, full, |a, b| a.checked_div(b).unwrap_or(u32::MAX)),
                Op::DivS => bin(w, &i, width, full, |a, b| {
                    let (a, b) = (a as i32, b as i32);
                    if b == 0 { u32::MAX } else { a.wrapping_div(b) as u32 }
                }),
                Op::RemU => bin(w, &i, width, full, |a, b| a.checked_rem(b).unwrap_or(a)),
                Op::RemS => bin(w, &i, width, full, |a, b| {
                    let (a, b) = (a as i32, b as i32);
                    if b == 0 { a as u32 } else { a.wrapping_rem(b) as u32 }
                }),
                Op::And => bin(w, &i, width, full, |a, b| a & b),
                Op::Or => bin(w, &i, width, full, |a, b| a | b),
                Op::Xor => bin(w, &i, width, full, |a, b| a ^ b),
                Op::Shl => bin(w, &i, width, full, |a, b| a << (b & 31)),
                Op::Shr => bin(w, &i, width, full, |a, b| a >> (b & 31)),
                Op::Sra => bin(w, &i, width, full, |a, b| ((a as i32) >> (b & 31)) as u32),
                Op::MinU => bin(w, &i, width, full, u32::min),
                Op::MaxU => bin(w, &i, width, full, u32::max),
                Op::MinS => bin(w, &i, width, full, |a, b| (a as i32).min(b as i32) as u32),
                Op::MaxS => bin(w, &i, width, full, |a, b| (a as i32).max(b as i32) as u32),
                Op::FAdd => bin(w, &i, width, full, |a, b| fres(f(a) + f(b))),
                Op::FSub => bin(w, &i, width, full, |a, b| fres(f(a) - f(b))),
                Op::FMul => bin(w, &i, width, full, |a, b| fres(f(a) * f(b))),
                Op::FDiv => bin(w, &i, width, full, |a, b| fres(f(a) / f(b))),
                Op::FMin => bin(w, &i, width, full, |a, b| fres(f(a).min(f(b)))),
                Op::FMax => bin(w, &i, width, full, |a, b| fres(f(a).max(f(b)))),
                Op::CmpEq => bin(w, &i, width, full, |a, b| (a == b) as u32),
                Op::CmpNe => bin(w, &i, width, full, |a, b| (a != b) as u32),
                Op::CmpLtU => bin(w, &i, width, full, |a, b| (a < b) as u32),
                Op::CmpLeU => bin(w, &i, width, full, |a, b| (a <= b) as u32),
                Op::CmpLtS => bin(w, &i, width, full, |a, b| ((a as i32) < (b as i32)) as u32),
                Op::CmpLeS => bin(w, &i, width, full, |a, b| ((a as i32) <= (b as i32)) as u32),
                Op::FCmpEq => bin(w, &i, width, full, |a, b| (f(a) == f(b)) as u32),
                Op::FCmpLt => bin(w, &i, width, full, |a, b| (f(a) < f(b)) as u32),
                Op::FCmpLe => bin(w, &i, width, full, |a, b| (f(a) <= f(b)) as u32),
                Op::FFma => tern(w, &i, width, full, |a, b, c| fres(f(a).mul_add(f(b), f(c)))),
                Op::Sel => tern(w, &i, width, full, |a, b, c| if a != 0 { b } else { c }),
                Op::Mov => un(w, &i, width, full, |a| a),
                Op::Not => un(w, &i, width, full, |a| !a),
                Op::CvtF32U32 => un(w, &i, width, full, |a| (a as f32).to_bits()),
                Op::CvtF32I32 => un(w, &i, width, full, |a| (a as i32 as f32).to_bits()),
                Op::CvtU32F32 => un(w, &i, width, full, |a| f(a) as u32),
                Op::CvtI32F32 => un(w, &i, width, full, |a| f(a) as i32 as u32),
                Op::FSqrt => un(w, &i, width, full, |a| fres(f(a).sqrt())),
                Op::Builtin => {
                    let b = Builtin::from_u32(i.imm).expect("validated");
                    let r = self.builtin(w, b);
                    write(w, i.d, &r, width, full);
                }
                Op::SArg => {
                    let va = self.args.wrapping_add(i.imm as u64 * 8);
                    let (shm, off) = mem.resolve(va, 8, Access::Read).map_err(fault)?;
                    w.s[i.d as usize] = shm.read_u64(off).map_err(|_| fault(outside(va, 8, Access::Read)))?;
                }
                Op::SMov => w.s[i.d as usize] = i.imm as u64,
                Op::SAdd => w.s[i.d as usize] = w.s[i.a as usize].wrapping_add(i.imm as i32 as i64 as u64),
                Op::VFromS => {
                    let r = [w.s[i.a as usize] as u32; MAX_WAVE];
                    write(w, i.d, &r, width, full);
                }
                Op::VFromSHi => {
                    let r = [(w.s[i.a as usize] >> 32) as u32; MAX_WAVE];
                    write(w, i.d, &r, width, full);
                }
                Op::Ld32 | Op::Ld64 | Op::St32 | Op::St64 | Op::AtomAdd => {
                    self.memory(w, &i, mem, width).map_err(fault)?
                }
                Op::If => {
                    let cond = mask_of(&w.v[i.a as usize], width) & exec;
                    w.stack.push(Frame::If { outer: exec, else_lanes: exec & !cond });
                    w.exec = cond;
                    if cond == 0 {
                        w.pc = i.imm;
                    }
                }
                Op::Else => {
                    let off = w.off();
                    let Some(Frame::If { else_lanes, .. }) = w.stack.last_mut() else { return Err(mismatch()) };
                    w.exec = *else_lanes & !off;
                    *else_lanes = 0;
                    if w.exec == 0 {
                        w.pc = i.imm;
                    }
                }
                Op::EndIf => {
                    let Some(Frame::If { outer, .. }) = w.stack.pop() else { return Err(mismatch()) };
                    w.exec = outer & !w.off();
                }
                Op::Loop => {
                    w.stack.push(Frame::Loop { outer: exec, start: w.pc, broken: 0 });
                    if exec == 0 {
                        w.pc = i.imm;
                    }
                }
                Op::Break => {
                    let leaving = mask_of(&w.v[i.a as usize], width) & exec;
                    w.exec &= !leaving;
                    let Some(pos) = w.stack.iter().rposition(|f| matches!(f, Frame::Loop { .. })) else {
                        return Err(mismatch());
                    };
                    if let Frame::Loop { broken, .. } = &mut w.stack[pos] {
                        *broken |= leaving;
                    }
                    // Every lane has left the loop: skip to its end, dropping inner frames.
                    let Frame::Loop { outer, .. } = w.stack[pos] else { unreachable!() };
                    if outer & !w.off() == 0 {
                        w.stack.truncate(pos + 1);
                        w.exec = 0;
                        w.pc = i.imm;
                    }
                }
                Op::EndLoop => {
                    let Some(&Frame::Loop { outer, start, .. }) = w.stack.last() else { return Err(mismatch()) };
                    let still = outer & !w.off();
                    if still != 0 {
                        w.exec = still;
                        w.pc = start;
                    } else {
                        w.stack.pop();
                        w.exec = outer & !w.off();
                    }
                }
                Op::Exit => {
                    w.exited |= exec;
                    w.exec = 0;
                }
            }
        }
        Ok(w.pc as usize >= prog.len() || w.live & !w.exited == 0)
    }

    fn memory(&self, w: &mut Wave, i: &Inst, mem: &mut Mem<'_>, width: usize) -> Result<(), FaultKind> {
        let base = w.s[i.a as usize].wrapping_add(i.imm as u64);
        let exec = w.exec;
        for l in 0..width {
            if exec >> l & 1 == 0 {
                continue;
            }
            let va = base.wrapping_add(w.v[i.b as usize][l] as u64);
            match i.op {
                Op::Ld32 => {
                    let (shm, off) = mem.resolve(va, 4, Access::Read)?;
                    w.v[i.d as usize][l] = shm.read_u32(off).map_err(|_| outside(va, 4, Access::Read))?;
                }
                Op::Ld64 => {
                    let (shm, off) = mem.resolve(va, 8, Access::Read)?;
                    let x = shm.read_u64(off).map_err(|_| outside(va, 8, Access::Read))?;
                    w.v[i.d as usize][l] = x as u32;
                    w.v[i.d as usize + 1][l] = (x >> 32) as u32;
                }
                Op::St32 => {
                    let (shm, off) = mem.resolve(va, 4, Access::Write)?;
                    shm.write_u32(off, w.v[i.d as usize][l]).map_err(|_| outside(va, 4, Access::Write))?;
                }
                Op::St64 => {
                    let (shm, off) = mem.resolve(va, 8, Access::Write)?;
                    let x = w.v[i.d as usize][l] as u64 | (w.v[i.d as usize + 1][l] as u64) << 32;
                    shm.write_u64(off, x).map_err(|_| outside(va, 8, Access::Write))?;
                }
                Op::AtomAdd => {
                    let (shm, off) = mem.resolve(va, 4, Access::Write)?;
                    let a = shm.atomic_u32(off).map_err(|_| outside(va, 4, Access::Write))?;
                    // Relaxed: an atomic add's result is exact whatever the ordering; the
                    // kernel's results are published by the queue's release of its fence.
                    w.v[i.d as usize][l] = a.fetch_add(w.v[i.c as usize][l], std::sync::atomic::Ordering::Relaxed);
                }
                _ => unreachable!("memory() only gets memory ops"),
            }
        }
        Ok(())
    }
}

/// A control-flow stack that does not match the program. A validated program never produces
/// one; only a restored (corrupt) save area can.
fn mismatch() -> FaultKind {
    FaultKind::BadSaveArea { why: "control-flow stack does not match the program" }
}

#[inline(always)]
fn f(x: u32) -> f32 {
    f32::from_bits(x)
}

/// A float result's bits, any NaN written as [`CANONICAL_NAN`]: hosts differ in the NaN
/// they produce (x86-64 gives 0xffc00000 for `0.0 / 0.0`), and a result's bits can become an
/// address, so the reference and every backend must agree on them.
fn fres(r: f32) -> u32 {
    if r.is_nan() { CANONICAL_NAN } else { r.to_bits() }
}

/// Lanes whose value is non-zero, as a mask.
#[inline]
fn mask_of(v: &Lanes, width: usize) -> u64 {
    v[..width].iter().enumerate().fold(0, |m, (l, &x)| m | (((x != 0) as u64) << l))
}

/// Writes `r` into `v[d]` for the active lanes.
#[inline(always)]
fn write(w: &mut Wave, d: u8, r: &Lanes, width: usize, full: u64) {
    let dst = &mut w.v[d as usize];
    if w.exec == full {
        dst[..width].copy_from_slice(&r[..width]);
    } else {
        let exec = w.exec;
        for l in 0..width {
            if exec >> l & 1 != 0 {
                dst[l] = r[l];
            }
        }
    }
}

// (Indexed: the destination row may be a source row, so no iterator can hold both.)
#[allow(clippy::needless_range_loop)]
#[inline(always)]
fn bin(w: &mut Wave, i: &Inst, width: usize, full: u64, op: impl Fn(u32, u32) -> u32) {
    if w.exec == full {
        // Every lane active: in place, lane by lane (a lane reads only its own lane, so the
        // destination may be a source), with no row in between to copy.
        let (a, b, d, width) = (i.a as usize, i.b as usize, i.d as usize, width.min(MAX_WAVE));
        let v = &mut *w.v;
        if i.uses_imm() {
            for l in 0..width {
                v[d][l] = op(v[a][l], i.imm);
            }
        } else {
            for l in 0..width {
                v[d][l] = op(v[a][l], v[b][l]);
            }
        }
        return;
    }
    let mut r = [0u32; MAX_WAVE];
    let a = &w.v[i.a as usize];
    if i.uses_imm() {
        for l in 0..width {
            r[l] = op(a[l], i.imm);
        }
    } else {
        let b = &w.v[i.b as usize];
        for l in 0..width {
            r[l] = op(a[l], b[l]);
        }
    }
    write(w, i.d, &r, width, full);
}

// (Indexed: the destination row may be a source row, so no iterator can hold both.)
#[allow(clippy::needless_range_loop)]
#[inline(always)]
fn tern(w: &mut Wave, i: &Inst, width: usize, full: u64, op: impl Fn(u32, u32, u32) -> u32) {
    if w.exec == full {
        // In place, as in `bin`.
        let (a, b, c, d, width) = (i.a as usize, i.b as usize, i.c as usize, i.d as usize, width.min(MAX_WAVE));
        let v = &mut *w.v;
        for l in 0..width {
            v[d][l] = op(v[a][l], v[b][l], v[c][l]);
        }
        return;
    }
    let mut r = [0u32; MAX_WAVE];
    let (a, b, c) = (&w.v[i.a as usize], &w.v[i.b as usize], &w.v[i.c as usize]);
    for l in 0..width {
        r[l] = op(a[l], b[l], c[l]);
    }
    write(w, i.d, &r, width, full);
}

// (Indexed: the destination row may be a source row, so no iterator can hold both.)
#[allow(clippy::needless_range_loop)]
#[inline(always)]
fn un(w: &mut Wave, i: &Inst, width: usize, full: u64, op: impl Fn(u32) -> u32) {
    if w.exec == full {
        // In place, as in `bin`.
        let (a, d, width) = (i.a as usize, i.d as usize, width.min(MAX_WAVE));
        let v = &mut *w.v;
        if i.uses_imm() {
            v[d][..width].fill(op(i.imm));
        } else {
            for l in 0..width {
                v[d][l] = op(v[a][l]);
            }
        }
        return;
    }
    let mut r = [0u32; MAX_WAVE];
    if i.uses_imm() {
        let x = op(i.imm);
        r[..width].fill(x);
    } else {
        let a = &w.v[i.a as usize];
        for l in 0..width {
            r[l] = op(a[l]);
        }
    }
    write(w, i.d, &r, width, full);
}

// ---- the context save area ----

const SAVE_MAGIC: u32 = u32::from_le_bytes(*b"DBCS");
const SAVE_VERSION: u32 = 1;
/// Bytes a context save area needs for the widest wave.
pub const CONTEXT_SAVE_BYTES: u64 = 24 * 1024;

/// The most [`Dispatch::save`] writes: the header (magic, version, kernel, grid and group,
/// args, width, next group, wave flag), then a wave (group, index, pc, three masks, stack
/// depth) with the deepest control-flow stack, its scalar registers and the widest wave's
/// vector registers.
const MAX_SAVE_BYTES: usize = (4 + 4 + 8 + 24 + 8 + 4 + 8 + 4)
    + (8 + 4 + 4 + 8 * 3 + 4)
    + MAX_NESTING * (4 + 8 + 8 + 4)
    + SREGS * 8
    + VREGS * MAX_WAVE * 4;
const _: () = assert!(MAX_SAVE_BYTES as u64 <= CONTEXT_SAVE_BYTES, "every state fits a save area");

struct Writer(Vec<u8>);
impl Writer {
    fn u32(&mut self, x: u32) {
        self.0.extend_from_slice(&x.to_le_bytes());
    }
    fn u64(&mut self, x: u64) {
        self.0.extend_from_slice(&x.to_le_bytes());
    }
    /// A run of `u32`s, converted in bulk (a wave's registers: thousands of them).
    fn u32s(&mut self, xs: &[u32]) {
        let at = self.0.len();
        self.0.resize(at + xs.len() * 4, 0);
        for (c, x) in self.0[at..].chunks_exact_mut(4).zip(xs) {
            c.copy_from_slice(&x.to_le_bytes());
        }
    }
}

/// Reads a save area in place, field by field (only the bytes the state takes, not the whole
/// area), refusing to read past [`CONTEXT_SAVE_BYTES`].
struct Reader<'a> {
    area: &'a Shm,
    at: u64,
    end: u64,
}
impl Reader<'_> {
    fn span(&mut self, bytes: u64) -> Result<u64, FaultKind> {
        if self.at + bytes > self.end {
            return Err(FaultKind::BadSaveArea { why: "truncated" });
        }
        let at = self.at;
        self.at += bytes;
        Ok(at)
    }
    fn take<const N: usize>(&mut self) -> Result<[u8; N], FaultKind> {
        let at = self.span(N as u64)?;
        let mut b = [0u8; N];
        self.area.read(at, &mut b).map_err(|_| FaultKind::BadSaveArea { why: "save area out of bounds" })?;
        Ok(b)
    }
    fn u32(&mut self) -> Result<u32, FaultKind> {
        self.take::<4>().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Result<u64, FaultKind> {
        self.take::<8>().map(u64::from_le_bytes)
    }
    /// A run of `u32`s, read in bulk.
    fn u32s(&mut self, dst: &mut [u32]) -> Result<(), FaultKind> {
        let at = self.span(dst.len() as u64 * 4)?;
        self.area.read_u32s(at, dst).map_err(|_| FaultKind::BadSaveArea { why: "save area out of bounds" })
    }
}

impl Dispatch {
    /// Serializes the dispatch into `area` at `offset` (the queue's context save area).
    pub fn save(&self, area: &Shm, offset: u64) -> Result<(), FaultKind> {
        let regs = self.wave.as_ref().map_or(0, |w| w.stack.len() * 24 + SREGS * 8 + VREGS * self.width as usize * 4);
        let mut o = Writer(Vec::with_capacity(128 + regs));
        o.u32(SAVE_MAGIC);
        o.u32(SAVE_VERSION);
        o.u64(self.kernel);
        for x in self.grid.iter().chain(&self.group) {
            o.u32(*x);
        }
        o.u64(self.args);
        o.u32(self.width);
        o.u64(self.next_group);
        match &self.wave {
            None => o.u32(0),
            Some(w) => {
                o.u32(1);
                o.u64(w.group);
                o.u32(w.index);
                o.u32(w.pc);
                o.u64(w.live);
                o.u64(w.exec);
                o.u64(w.exited);
                o.u32(w.stack.len() as u32);
                for fr in &w.stack {
                    match *fr {
                        Frame::If { outer, else_lanes } => {
                            o.u32(0);
                            o.u64(outer);
                            o.u64(else_lanes);
                            o.u32(0);
                        }
                        Frame::Loop { outer, start, broken } => {
                            o.u32(1);
                            o.u64(outer);
                            o.u64(broken);
                            o.u32(start);
                        }
                    }
                }
                for s in w.s {
                    o.u64(s);
                }
                for r in w.v.iter() {
                    o.u32s(&r[..self.width as usize]);
                }
            }
        }
        if o.0.len() as u64 > CONTEXT_SAVE_BYTES {
            return Err(FaultKind::BadSaveArea { why: "state larger than the save area" });
        }
        area.write(offset, &o.0).map_err(|_| FaultKind::BadSaveArea { why: "save area out of bounds" })
    }

    /// Rebuilds a dispatch from a context save area, validating every field; the kernel is
    /// loaded and validated again from `vm`.
    pub fn restore(vm: &AddressSpace, area: &Shm, offset: u64, width: u32) -> Result<Dispatch, FaultKind> {
        let bad = |why| FaultKind::BadSaveArea { why };
        let mut r = Reader { area, at: offset, end: offset.saturating_add(CONTEXT_SAVE_BYTES) };
        if r.u32()? != SAVE_MAGIC || r.u32()? != SAVE_VERSION {
            return Err(bad("bad magic or version"));
        }
        let kernel = r.u64()?;
        let mut dims = [0u32; 6];
        for d in &mut dims {
            *d = r.u32()?;
        }
        let args = r.u64()?;
        if r.u32()? != width.clamp(1, MAX_WAVE as u32) {
            return Err(bad("saved with another wave width"));
        }
        let mut d = Dispatch::start(vm, kernel, [dims[0], dims[1], dims[2]], [dims[3], dims[4], dims[5]], args, width)?;
        d.next_group = r.u64()?;
        if d.next_group > d.total_groups() {
            return Err(bad("next group beyond the grid"));
        }
        match r.u32()? {
            0 => {}
            1 => {
                let group = r.u64()?;
                let index = r.u32()?;
                if group >= d.total_groups() || index >= d.waves_per_group() {
                    return Err(bad("wave outside the grid"));
                }
                let mut w = d.new_wave(group, index);
                w.pc = r.u32()?;
                let (live, exec, exited) = (r.u64()?, r.u64()?, r.u64()?);
                if live != w.live || exec & !live != 0 || exited & !live != 0 || w.pc as usize > d.program.len() {
                    return Err(bad("wave state out of range"));
                }
                (w.exec, w.exited) = (exec, exited);
                let depth = r.u32()? as usize;
                if depth > MAX_NESTING {
                    return Err(bad("control-flow stack too deep"));
                }
                for _ in 0..depth {
                    let (kind, outer, m, start) = (r.u32()?, r.u64()?, r.u64()?, r.u32()?);
                    if outer & !live != 0 || m & !live != 0 || start as usize > d.program.len() {
                        return Err(bad("control-flow frame out of range"));
                    }
                    w.stack.push(match kind {
                        0 => Frame::If { outer, else_lanes: m },
                        1 => Frame::Loop { outer, start, broken: m },
                        _ => return Err(bad("unknown control-flow frame")),
                    });
                }
                for s in &mut w.s {
                    *s = r.u64()?;
                }
                for reg in w.v.iter_mut() {
                    r.u32s(&mut reg[..d.width as usize])?;
                }
                d.wave = Some(w);
            }
            _ => return Err(bad("bad wave flag")),
        }
        Ok(d)
    }
}
