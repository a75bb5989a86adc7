//! A reference interpreter for the compute ISA (test code only), and the example programs
//! checked against their CPU references with it.
//!
//! The interpreter is written to be obviously correct, not fast: one wave at a time, one
//! instruction at a time across the wave's lanes under an execution mask and a control-flow
//! stack, exactly as `abi::isa` describes SIMT execution. It is independent of the device's
//! interpreter in `gpu` (it tracks lanes that left a loop by removing them from the saved
//! masks, rather than by consulting per-loop "broken" sets when a mask is restored), so it can
//! serve as an oracle for it.
//!
//! Pinned semantics (see `docs/isa.md`):
//! - an instruction other than `if`/`else`/`endif`/`loop`/`break`/`endloop` does nothing when no
//!   lane is active — scalar instructions included;
//! - the structural jumps (`if`/`else` with no lane to run, `loop` entered with no lane, `break`
//!   when every lane has left) are pure shortcuts: the same program with the jumps disabled
//!   gives the same results (checked below);
//! - `endloop` jumps to the instruction after its `loop`;
//! - memory: `va = s[a] + imm + v[b]` in 64 bits (wrapping); natural alignment is checked first,
//!   then the mapping; lanes access memory in ascending lane order and the first faulting lane
//!   stops the instruction (earlier lanes' accesses have happened);
//! - `sarg` reads the u64 at `args + 8 * slot`, like a load.

use abi::isa::{Builtin, Inst, Op};
use program::examples::{self, arg_f32, arg_u32};
use program::{Operand, ProgramBinary, ProgramBuilder, S, V, assemble};
use proptest::prelude::*;

mod interp {
    use super::*;

    /// A mapped range of "GPU memory".
    pub struct Region {
        pub base: u64,
        pub bytes: Vec<u8>,
    }

    /// A sparse address space.
    #[derive(Default)]
    pub struct Memory {
        pub regions: Vec<Region>,
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Access {
        Read,
        Write,
        Atomic,
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Fault {
        pub pc: u32,
        pub va: u64,
        pub access: Access,
        pub misaligned: bool,
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Error {
        Fault(Fault),
        /// The step budget ran out (a program that loops forever).
        StepLimit,
    }

    impl Memory {
        /// Maps `bytes` at `base`.
        pub fn map(&mut self, base: u64, bytes: Vec<u8>) {
            self.regions.push(Region { base, bytes });
        }
        pub fn map_u32s(&mut self, base: u64, v: &[u32]) {
            self.map(base, v.iter().flat_map(|x| x.to_le_bytes()).collect());
        }
        pub fn map_f32s(&mut self, base: u64, v: &[f32]) {
            self.map(base, v.iter().flat_map(|x| x.to_le_bytes()).collect());
        }
        pub fn map_args(&mut self, base: u64, slots: &[u64]) {
            self.map(base, examples::args_to_bytes(slots));
        }
        fn region(&self, base: u64) -> &Region {
            self.regions.iter().find(|r| r.base == base).expect("mapped")
        }
        pub fn u32s(&self, base: u64) -> Vec<u32> {
            self.region(base).bytes.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect()
        }
        pub fn f32s(&self, base: u64) -> Vec<f32> {
            self.u32s(base).into_iter().map(f32::from_bits).collect()
        }

        /// The bytes of `[va, va + len)`, if naturally aligned and inside one region.
        fn slice(&mut self, va: u64, len: u64, pc: u32, access: Access) -> Result<&mut [u8], Error> {
            let fault = |misaligned| Error::Fault(Fault { pc, va, access, misaligned });
            if !va.is_multiple_of(len) {
                return Err(fault(true));
            }
            for r in &mut self.regions {
                if va >= r.base && va - r.base < r.bytes.len() as u64 && r.bytes.len() as u64 - (va - r.base) >= len {
                    let o = (va - r.base) as usize;
                    return Ok(&mut r.bytes[o..o + len as usize]);
                }
            }
            Err(fault(false))
        }
        fn read(&mut self, va: u64, len: u64, pc: u32) -> Result<u64, Error> {
            let s = self.slice(va, len, pc, Access::Read)?;
            let mut b = [0u8; 8];
            b[..s.len()].copy_from_slice(s);
            Ok(u64::from_le_bytes(b))
        }
        fn write(&mut self, va: u64, len: u64, x: u64, pc: u32, access: Access) -> Result<(), Error> {
            let s = self.slice(va, len, pc, access)?;
            let n = s.len();
            s.copy_from_slice(&x.to_le_bytes()[..n]);
            Ok(())
        }
    }

    #[derive(Clone, Copy, Debug)]
    pub struct Dispatch {
        pub grid: [u32; 3],
        pub group: [u32; 3],
        pub args: u64,
        /// Lanes per wave, 1..=64.
        pub width: usize,
        /// Take the structural shortcut jumps (false: run through with an empty mask instead).
        pub jumps: bool,
        /// Total wave-instruction budget.
        pub max_steps: u64,
    }

    impl Dispatch {
        pub fn new(threads: u32, group: u32, args: u64) -> Dispatch {
            Dispatch {
                grid: [threads.div_ceil(group).max(1), 1, 1],
                group: [group, 1, 1],
                args,
                width: 32,
                jumps: true,
                max_steps: 10_000_000,
            }
        }
    }

    #[derive(Clone, Debug)]
    enum Frame {
        /// `saved`: the mask to restore at `endif`; `waiting`: lanes for the `else`.
        If { saved: u64, waiting: u64 },
        /// `saved`: the mask to restore when the loop ends; `start`: the `loop`'s pc;
        /// `broken`: lanes that left it with `break`.
        Loop { saved: u64, start: u32, broken: u64 },
    }

    struct Wave {
        /// Lanes that exist (the last wave of a group may be partial).
        live: u64,
        exited: u64,
        exec: u64,
        pc: u32,
        stack: Vec<Frame>,
        s: [u64; 16],
        /// `v[lane][reg]`.
        v: Vec<[u32; 64]>,
        /// Thread index within the group of lane 0.
        first: u64,
        group_id: [u32; 3],
    }

    fn bit(l: usize) -> u64 {
        1u64 << l
    }

    /// Runs a whole dispatch: groups in order (x fastest), waves in order.
    pub fn run(k: &ProgramBinary, mem: &mut Memory, d: &Dispatch) -> Result<u64, Error> {
        assert!((1..=64).contains(&d.width));
        let prog = k.decode();
        let threads = d.group.iter().map(|&x| x as u64).product::<u64>();
        let mut steps = 0u64;
        for gz in 0..d.grid[2] {
            for gy in 0..d.grid[1] {
                for gx in 0..d.grid[0] {
                    let mut first = 0u64;
                    while first < threads {
                        let n = (threads - first).min(d.width as u64) as usize;
                        let live = if n == 64 { u64::MAX } else { bit(n) - 1 };
                        let mut w = Wave {
                            live,
                            exited: 0,
                            exec: live,
                            pc: 0,
                            stack: Vec::new(),
                            s: [0; 16],
                            v: vec![[0; 64]; d.width],
                            first,
                            group_id: [gx, gy, gz],
                        };
                        run_wave(&prog, &mut w, mem, d, &mut steps)?;
                        first += d.width as u64;
                    }
                }
            }
        }
        Ok(steps)
    }

    fn builtin(w: &Wave, d: &Dispatch, lane: usize, b: Builtin) -> u32 {
        let t = w.first + lane as u64;
        let [sx, sy, _] = d.group.map(|x| x as u64);
        let local = [t % sx, (t / sx) % sy, t / (sx * sy)].map(|x| x as u32);
        match b {
            Builtin::GroupIdX => w.group_id[0],
            Builtin::GroupIdY => w.group_id[1],
            Builtin::GroupIdZ => w.group_id[2],
            Builtin::LocalIdX => local[0],
            Builtin::LocalIdY => local[1],
            Builtin::LocalIdZ => local[2],
            Builtin::GroupSizeX => d.group[0],
            Builtin::GroupSizeY => d.group[1],
            Builtin::GroupSizeZ => d.group[2],
            Builtin::GridSizeX => d.grid[0],
            Builtin::GridSizeY => d.grid[1],
            Builtin::GridSizeZ => d.grid[2],
            Builtin::GlobalIdX => w.group_id[0].wrapping_mul(d.group[0]).wrapping_add(local[0]),
            Builtin::LocalIndex => t as u32,
        }
    }

    fn f(x: u32) -> f32 {
        f32::from_bits(x)
    }

    /// One lane's result of an ALU op.
    pub fn alu(op: Op, a: u32, b: u32, c: u32) -> u32 {
        let (sa, sb) = (a as i32, b as i32);
        match op {
            Op::Add => a.wrapping_add(b),
            Op::Sub => a.wrapping_sub(b),
            Op::Mul => a.wrapping_mul(b),
            Op::MulHiU => ((a as u64 * b as u64) >> 32) as u32,
            Op::DivU => a.checked_div(b).unwrap_or(u32::MAX),
            Op::DivS => {
                if sb == 0 {
                    u32::MAX
                } else if sa == i32::MIN && sb == -1 {
                    i32::MIN as u32
                } else {
                    (sa / sb) as u32
                }
            }
            Op::RemU => a.checked_rem(b).unwrap_or(a),
            Op::RemS => {
                if sb == 0 {
                    a
                } else if sa == i32::MIN && sb == -1 {
                    0
                } else {
                    (sa % sb) as u32
                }
            }
            Op::And => a & b,
            Op::Or => a | b,
            Op::Xor => a ^ b,
            Op::Shl => a << (b & 31),
            Op::Shr => a >> (b & 31),
            Op::Sra => (sa >> (b & 31)) as u32,
            Op::MinU => a.min(b),
            Op::MaxU => a.max(b),
            Op::MinS => sa.min(sb) as u32,
            Op::MaxS => sa.max(sb) as u32,
            Op::FAdd => (f(a) + f(b)).to_bits(),
            Op::FSub => (f(a) - f(b)).to_bits(),
            Op::FMul => (f(a) * f(b)).to_bits(),
            Op::FDiv => (f(a) / f(b)).to_bits(),
            Op::FMin => f(a).min(f(b)).to_bits(),
            Op::FMax => f(a).max(f(b)).to_bits(),
            Op::FFma => f(a).mul_add(f(b), f(c)).to_bits(),
            Op::Mov => a,
            Op::Not => !a,
            Op::CvtF32U32 => (a as f32).to_bits(),
            Op::CvtF32I32 => (sa as f32).to_bits(),
            Op::CvtU32F32 => f(a) as u32,
            Op::CvtI32F32 => f(a) as i32 as u32,
            Op::FSqrt => f(a).sqrt().to_bits(),
            Op::CmpEq => (a == b) as u32,
            Op::CmpNe => (a != b) as u32,
            Op::CmpLtU => (a < b) as u32,
            Op::CmpLeU => (a <= b) as u32,
            Op::CmpLtS => (sa < sb) as u32,
            Op::CmpLeS => (sa <= sb) as u32,
            Op::FCmpEq => (f(a) == f(b)) as u32,
            Op::FCmpLt => (f(a) < f(b)) as u32,
            Op::FCmpLe => (f(a) <= f(b)) as u32,
            Op::Sel => {
                if a != 0 {
                    b
                } else {
                    c
                }
            }
            _ => unreachable!("not an ALU op: {op:?}"),
        }
    }

    fn structural(op: Op) -> bool {
        matches!(op, Op::If | Op::Else | Op::EndIf | Op::Loop | Op::Break | Op::EndLoop)
    }

    fn run_wave(prog: &[Inst], w: &mut Wave, mem: &mut Memory, d: &Dispatch, steps: &mut u64) -> Result<(), Error> {
        use abi::isa::Form;
        let width = d.width;
        loop {
            if w.pc as usize >= prog.len() || w.live & !w.exited == 0 {
                return Ok(());
            }
            *steps += 1;
            if *steps > d.max_steps {
                return Err(Error::StepLimit);
            }
            let i = prog[w.pc as usize];
            let pc = w.pc;
            w.pc += 1;
            if w.exec == 0 && !structural(i.op) {
                continue;
            }
            let lanes: Vec<usize> = (0..width).filter(|&l| w.exec & bit(l) != 0).collect();
            let nonzero =
                |w: &Wave, r: u8| (0..width).filter(|&l| w.v[l][r as usize] != 0).fold(0u64, |m, l| m | bit(l));
            let (d_, a, b, c) = (i.d as usize, i.a as usize, i.b as usize, i.c as usize);
            match i.op.form() {
                Form::Binary => {
                    for &l in &lanes {
                        let y = if i.uses_imm() { i.imm } else { w.v[l][b] };
                        w.v[l][d_] = alu(i.op, w.v[l][a], y, 0);
                    }
                }
                Form::Ternary => {
                    for &l in &lanes {
                        w.v[l][d_] = alu(i.op, w.v[l][a], w.v[l][b], w.v[l][c]);
                    }
                }
                Form::Unary => {
                    for &l in &lanes {
                        let x = if i.uses_imm() { i.imm } else { w.v[l][a] };
                        w.v[l][d_] = alu(i.op, x, 0, 0);
                    }
                }
                Form::Builtin => {
                    let bi = Builtin::from_u32(i.imm).expect("validated");
                    for &l in &lanes {
                        w.v[l][d_] = builtin(w, d, l, bi);
                    }
                }
                Form::ScalarArg => w.s[d_] = mem.read(d.args.wrapping_add(8 * i.imm as u64), 8, pc)?,
                Form::ScalarImm => w.s[d_] = i.imm as u64,
                Form::ScalarAdd => w.s[d_] = w.s[a].wrapping_add(i.imm as i32 as i64 as u64),
                Form::FromScalar => {
                    let x = if i.op == Op::VFromSHi { (w.s[a] >> 32) as u32 } else { w.s[a] as u32 };
                    for &l in &lanes {
                        w.v[l][d_] = x;
                    }
                }
                Form::Load | Form::Store | Form::Atomic => {
                    for &l in &lanes {
                        let va = w.s[a].wrapping_add(i.imm as u64).wrapping_add(w.v[l][b] as u64);
                        match i.op {
                            Op::Ld32 => w.v[l][d_] = mem.read(va, 4, pc)? as u32,
                            Op::Ld64 => {
                                let x = mem.read(va, 8, pc)?;
                                w.v[l][d_] = x as u32;
                                w.v[l][d_ + 1] = (x >> 32) as u32;
                            }
                            Op::St32 => mem.write(va, 4, w.v[l][d_] as u64, pc, Access::Write)?,
                            Op::St64 => {
                                let x = w.v[l][d_] as u64 | (w.v[l][d_ + 1] as u64) << 32;
                                mem.write(va, 8, x, pc, Access::Write)?;
                            }
                            Op::AtomAdd => {
                                // Check writability as an atomic first, then read-modify-write.
                                mem.slice(va, 4, pc, Access::Atomic)?;
                                let old = mem.read(va, 4, pc)? as u32;
                                mem.write(va, 4, old.wrapping_add(w.v[l][c]) as u64, pc, Access::Atomic)?;
                                w.v[l][d_] = old;
                            }
                            _ => unreachable!(),
                        }
                    }
                }
                Form::None => match i.op {
                    Op::Nop => {}
                    Op::Exit => {
                        let x = w.exec;
                        w.exited |= x;
                        for fr in &mut w.stack {
                            match fr {
                                Frame::If { saved, waiting } => {
                                    *saved &= !x;
                                    *waiting &= !x;
                                }
                                Frame::Loop { saved, .. } => *saved &= !x,
                            }
                        }
                        w.exec = 0;
                    }
                    Op::EndIf => {
                        let Some(Frame::If { saved, .. }) = w.stack.pop() else { panic!("validated") };
                        w.exec = saved;
                    }
                    _ => unreachable!(),
                },
                Form::CondBranch if i.op == Op::If => {
                    let cond = w.exec & nonzero(w, i.a);
                    w.stack.push(Frame::If { saved: w.exec, waiting: w.exec & !cond });
                    w.exec = cond;
                    if cond == 0 && d.jumps {
                        w.pc = i.imm; // its ELSE or ENDIF, which then runs
                    }
                }
                Form::CondBranch => {
                    // BREAK
                    let leaving = w.exec & nonzero(w, i.a);
                    w.exec &= !leaving;
                    let pos = w.stack.iter().rposition(|f| matches!(f, Frame::Loop { .. })).expect("validated");
                    for fr in &mut w.stack[pos + 1..] {
                        if let Frame::If { saved, waiting } = fr {
                            *saved &= !leaving;
                            *waiting &= !leaving;
                        }
                    }
                    let Frame::Loop { saved, broken, .. } = &mut w.stack[pos] else { unreachable!() };
                    *broken |= leaving;
                    let remaining = *saved & !*broken & !w.exited;
                    if remaining == 0 && d.jumps {
                        w.stack.truncate(pos + 1);
                        w.exec = 0;
                        w.pc = i.imm; // its ENDLOOP, which then runs
                    }
                }
                Form::Branch => match i.op {
                    Op::Else => {
                        let Some(Frame::If { waiting, .. }) = w.stack.last_mut() else { panic!("validated") };
                        w.exec = *waiting;
                        *waiting = 0;
                        if w.exec == 0 && d.jumps {
                            w.pc = i.imm; // its ENDIF
                        }
                    }
                    Op::Loop => {
                        w.stack.push(Frame::Loop { saved: w.exec, start: pc, broken: 0 });
                        if w.exec == 0 && d.jumps {
                            w.pc = i.imm; // its ENDLOOP
                        }
                    }
                    Op::EndLoop => {
                        let Some(Frame::Loop { saved, start, broken }) = w.stack.last().cloned() else {
                            panic!("validated")
                        };
                        let remaining = saved & !broken & !w.exited;
                        // Self-check: the lanes arriving here are exactly those still in the loop.
                        assert_eq!(w.exec, remaining, "pc {pc}: mask at ENDLOOP");
                        if remaining != 0 {
                            w.pc = start + 1;
                        } else {
                            w.stack.pop();
                            w.exec = saved;
                        }
                    }
                    _ => unreachable!(),
                },
            }
        }
    }
}

use interp::{Dispatch, Error, Fault, Memory};

const ARGS: u64 = 0x1000;
const BUF0: u64 = 0x10_0000;
const BUF1: u64 = 0x20_0000;
const BUF2: u64 = 0x30_0000;

/// Wave widths and group sizes every example is run with.
const SHAPES: &[(usize, u32)] = &[(32, 32), (32, 64), (32, 7), (1, 5), (7, 13), (64, 100), (64, 1)];

fn floats(n: usize, seed: u32) -> Vec<f32> {
    (0..n).map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 2001) as f32 / 100.0 - 10.0).collect()
}

fn words(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32).map(|i| i.wrapping_mul(2246822519).wrapping_add(seed).rotate_left(7)).collect()
}

fn run_saxpy(n: usize, a: f32, width: usize, group: u32, extra: u32) -> (Vec<f32>, Vec<f32>) {
    let k = examples::SAXPY.assemble().unwrap();
    let (x, y) = (floats(n, 1), floats(n, 2));
    let mut m = Memory::default();
    m.map_f32s(BUF0, &x);
    m.map_f32s(BUF1, &y);
    m.map_args(ARGS, &[BUF0, BUF1, arg_f32(a), arg_u32(n as u32)]);
    let mut d = Dispatch::new(n as u32 + extra, group, ARGS);
    d.width = width;
    interp::run(&k, &mut m, &d).unwrap();
    (m.f32s(BUF1), examples::saxpy_ref(a, &x, &y))
}

#[test]
fn saxpy_matches_reference() {
    for &(width, group) in SHAPES {
        for n in [1, 2, 31, 32, 33, 100, 257] {
            for extra in [0, 1, 40] {
                let (got, want) = run_saxpy(n, 1.75, width, group, extra);
                assert_eq!(got, want, "n {n} width {width} group {group} extra {extra}");
            }
        }
    }
}

fn run_reduce(v: &[u32], threads: u32, width: usize, group: u32) -> u32 {
    let k = examples::REDUCE.assemble().unwrap();
    let mut m = Memory::default();
    m.map_u32s(BUF0, if v.is_empty() { &[0] } else { v });
    m.map_u32s(BUF1, &[0]);
    m.map_args(ARGS, &[BUF0, arg_u32(v.len() as u32), BUF1]);
    let mut d = Dispatch::new(threads, group, ARGS);
    d.width = width;
    interp::run(&k, &mut m, &d).unwrap();
    m.u32s(BUF1)[0]
}

#[test]
fn reduce_matches_reference() {
    for &(width, group) in SHAPES {
        for n in [0usize, 1, 5, 32, 33, 1000] {
            let v = words(n, 9);
            for threads in [1, 3, 32, 100, n as u32 + 17] {
                assert_eq!(
                    run_reduce(&v, threads, width, group),
                    examples::reduce_ref(&v),
                    "n {n} threads {threads} width {width} group {group}"
                );
            }
        }
    }
    // The sum wraps.
    assert_eq!(run_reduce(&[u32::MAX, 2], 2, 32, 32), 1);
}

fn run_matmul(m_: usize, k_: usize, n_: usize, width: usize, group: u32, extra: u32) -> (Vec<f32>, Vec<f32>) {
    let k = examples::MATMUL.assemble().unwrap();
    let (a, b) = (floats(m_ * k_, 3), floats(k_ * n_, 4));
    let mut m = Memory::default();
    m.map_f32s(BUF0, &a);
    m.map_f32s(BUF1, &b);
    // C starts as NaN so an output the program forgets to write shows up.
    m.map_f32s(BUF2, &vec![f32::NAN; m_ * n_]);
    m.map_args(ARGS, &[BUF0, BUF1, BUF2, arg_u32(m_ as u32), arg_u32(k_ as u32), arg_u32(n_ as u32)]);
    let threads = examples::matmul_threads(m_ as u32, n_ as u32) as u32 + extra;
    let mut d = Dispatch::new(threads, group, ARGS);
    d.width = width;
    interp::run(&k, &mut m, &d).unwrap();
    (m.f32s(BUF2), examples::matmul_ref(m_, k_, n_, &a, &b))
}

#[test]
fn matmul_matches_reference() {
    for &(width, group) in SHAPES {
        for (m_, k_, n_) in [(1, 1, 1), (2, 2, 2), (3, 5, 7), (4, 1, 4), (8, 8, 8), (5, 16, 3), (16, 3, 17), (2, 0, 3)]
        {
            for extra in [0, 9] {
                let (got, want) = run_matmul(m_, k_, n_, width, group, extra);
                let same = got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits());
                assert!(
                    same && got.len() == want.len(),
                    "{m_}x{k_}x{n_} width {width} group {group}: {got:?} != {want:?}"
                );
            }
        }
    }
}

/// Runs every pass of the scan, ping-ponging BUF0 and BUF1; returns the final buffer.
fn run_prefix_sum(v: &[u32], width: usize, group: u32, extra: u32) -> Vec<u32> {
    let k = examples::PREFIX_SUM.assemble().unwrap();
    let mut m = Memory::default();
    m.map_u32s(BUF0, v);
    m.map_u32s(BUF1, &vec![0xdead_beef; v.len()]);
    let n = v.len() as u32;
    let (mut src, mut dst) = (BUF0, BUF1);
    for (p, offset) in examples::prefix_sum_offsets(n).into_iter().enumerate() {
        let args = ARGS + 0x100 * p as u64;
        m.map_args(args, &[src, dst, arg_u32(n), arg_u32(offset)]);
        let mut d = Dispatch::new(n + extra, group, args);
        d.width = width;
        interp::run(&k, &mut m, &d).unwrap();
        (src, dst) = (dst, src);
    }
    m.u32s(src)
}

#[test]
fn prefix_sum_matches_reference() {
    for &(width, group) in SHAPES {
        for n in [1usize, 2, 3, 8, 31, 33, 100] {
            for extra in [0, 5] {
                let v = words(n, 5);
                assert_eq!(
                    run_prefix_sum(&v, width, group, extra),
                    examples::prefix_sum_ref(&v),
                    "n {n} width {width} group {group}"
                );
            }
        }
    }
}

// ---- the interpreter's own semantics, on small programs ----

/// Runs `src` over `threads` threads (one group), with `out` (`per` u32s per thread, as
/// `[s0 + 4 * (gid * per + k)]`) mapped at BUF0 and args `[BUF0, extra...]`.
fn run_src(src: &str, threads: u32, per: usize, width: usize, extra: &[u64]) -> Result<Vec<u32>, Error> {
    let k = assemble(src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    let mut m = Memory::default();
    m.map_u32s(BUF0, &vec![0; threads as usize * per]);
    let mut slots = vec![BUF0];
    slots.extend_from_slice(extra);
    m.map_args(ARGS, &slots);
    let mut d = Dispatch::new(threads, threads, ARGS);
    d.width = width;
    interp::run(&k, &mut m, &d)?;
    Ok(m.u32s(BUF0))
}

/// Prologue: `s0` = out, `v0` = gid, `v63` = byte offset of this thread's first slot (`per`
/// slots per thread).
fn prologue(per: u32) -> String {
    format!("sarg s0, 0\nbuiltin v0, %global_id.x\nmul v63, v0, {}\n", per * 4)
}

#[test]
fn divergent_if_else() {
    // Even lanes take the `if`, odd lanes the `else`; both write their slot.
    let src = prologue(1)
        + "and v1, v0, 1\ncmp.eq v2, v1, 0\n\
           if v2\n  mov v3, 100\nelse\n  mov v3, 200\nendif\nadd v3, v3, v0\nst.u32 [s0 + v63], v3\n";
    for width in [1, 4, 32] {
        let out = run_src(&src, 10, 1, width, &[]).unwrap();
        let want: Vec<u32> = (0..10).map(|i| if i % 2 == 0 { 100 + i } else { 200 + i }).collect();
        assert_eq!(out, want, "width {width}");
    }
}

#[test]
fn loops_with_per_lane_trip_counts_break_and_exit() {
    // Lane i counts to i (break), but lane 3 exits inside the loop and never stores.
    let src = prologue(1)
        + "mov v1, 0\n\
           loop\n  cmp.le.u v2, v0, v1\n  break v2\n  cmp.eq v4, v0, 3\n  if v4\n    cmp.eq v5, v1, 1\n    \
           if v5\n      exit\n    endif\n  endif\n  add v1, v1, 1\nendloop\n\
           add v1, v1, 1000\nst.u32 [s0 + v63], v1\n";
    for width in [1, 3, 8, 64] {
        let out = run_src(&src, 8, 1, width, &[]).unwrap();
        let want: Vec<u32> = (0..8).map(|i| if i == 3 { 0 } else { 1000 + i }).collect();
        assert_eq!(out, want, "width {width}");
    }
}

#[test]
fn break_inside_if_with_else_lanes_waiting() {
    // In every iteration lanes < 2 break inside the `if`; the others wait for the `else` and
    // must still run it. Lanes 0, 1: one increment, then break (the `mov` after the break runs
    // for no lane). Lanes 2, 3: +11 per iteration until v1 >= 30: 33.
    let src = prologue(1)
        + "mov v1, 0\nmov v5, 30\nloop\n  add v1, v1, 1\n  cmp.lt.u v2, v0, 2\n  if v2\n    break v2\n    mov v1, 999\n  \
           else\n    add v1, v1, 10\n  endif\n  cmp.le.u v3, v5, v1\n  break v3\nendloop\n\
           st.u32 [s0 + v63], v1\n";
    for width in [1, 2, 32] {
        let out = run_src(&src, 4, 1, width, &[]).unwrap();
        assert_eq!(out, vec![1, 1, 33, 33], "width {width}");
    }
}

#[test]
fn division_shift_conversion_and_atomics_results() {
    let src = "sarg s0, 0\nsarg s1, 1\nbuiltin v0, %global_id.x\nmul v63, v0, 48\n\
           mov v1, 7\nmov v2, 0\nmov v3, 0x80000000\nmov v4, -1\n\
           div.u v10, v1, v2\ndiv.s v11, v1, v2\nrem.u v12, v1, v2\nrem.s v13, v3, v4\ndiv.s v14, v3, v4\n\
           shl v15, v1, 33\nsra v16, v3, 31\ncvt.u32.f32 v17, -1.0\ncvt.i32.f32 v18, 3.0e10\ncvt.u32.f32 v19, nan\n\
           fmin v20, v1, nan\nmov v21, 0\natom.add.u32 v21, [s1 + v21], v1\n\
           st.u32 [s0 + v63], v10\nst.u32 [s0 + v63 + 4], v11\nst.u32 [s0 + v63 + 8], v12\nst.u32 [s0 + v63 + 12], v13\n\
           st.u32 [s0 + v63 + 16], v14\nst.u32 [s0 + v63 + 20], v15\nst.u32 [s0 + v63 + 24], v16\n\
           st.u32 [s0 + v63 + 28], v17\nst.u32 [s0 + v63 + 32], v18\nst.u32 [s0 + v63 + 36], v19\n\
           st.u32 [s0 + v63 + 40], v20\nst.u32 [s0 + v63 + 44], v21\n";
    let k = assemble(src).unwrap();
    let mut m = Memory::default();
    m.map_u32s(BUF0, &[0; 24]);
    m.map_u32s(BUF1, &[5]);
    m.map_args(ARGS, &[BUF0, BUF1]);
    interp::run(&k, &mut m, &Dispatch::new(2, 2, ARGS)).unwrap();
    let out = m.u32s(BUF0);
    // x/0 = MAX, x/0 (signed) = -1, x%0 = x, MIN%-1 = 0, MIN/-1 = MIN, shifts mod 32, sra,
    // saturating conversions with NaN -> 0, fmin of a NaN = the other, atomics return the old value.
    let lane0 = [u32::MAX, u32::MAX, 7, 0, 0x8000_0000, 14, u32::MAX, 0, i32::MAX as u32, 0, 7, 5];
    assert_eq!(&out[..12], &lane0);
    // Lane 1's atomic sees lane 0's add.
    assert_eq!(out[12 + 11], 12);
    assert_eq!(m.u32s(BUF1), vec![19]);
}

#[test]
fn scalar_instructions_do_nothing_when_no_lane_is_active() {
    // Lane 0 alone takes the `if`: with a wide wave the `smov` runs (lane 0 is active), and
    // every lane then sees s2 = 5; with width 1, only lane 0's wave runs it.
    let src = prologue(1) + "cmp.eq v1, v0, 0\nif v1\n  smov s2, 5\nendif\nvfroms v2, s2\nst.u32 [s0 + v63], v2\n";
    assert_eq!(run_src(&src, 3, 1, 32, &[]).unwrap(), vec![5, 5, 5]);
    assert_eq!(run_src(&src, 3, 1, 1, &[]).unwrap(), vec![5, 0, 0]);
    // No lane takes it: the scalar instruction does not run, with or without the jump.
    let src = src.replace("cmp.eq v1, v0, 0", "cmp.eq v1, v0, 99");
    assert_eq!(run_src(&src, 3, 1, 32, &[]).unwrap(), vec![0, 0, 0]);
    // Reached with an empty mask and no jump: lane 0 breaks, lanes 1 and 2 are still in the
    // loop (so the wave does not skip to `endloop`), and the `smov` runs for no lane.
    let src = prologue(1)
        + "cmp.eq v1, v0, 0\nmov v3, 1\nloop\n  if v1\n    break v1\n    smov s2, 5\n  endif\n  break v3\nendloop\n\
           vfroms v2, s2\nst.u32 [s0 + v63], v2\n";
    for width in [1, 32] {
        assert_eq!(run_src(&src, 3, 1, width, &[]).unwrap(), vec![0, 0, 0], "width {width}");
    }
}

#[test]
fn faults_carry_va_access_and_pc() {
    let src = prologue(1) + "mov v1, 4096\nst.u32 [s0 + v1 + 0x100000], v0\n";
    let e = run_src(&src, 2, 1, 32, &[]).unwrap_err();
    assert_eq!(
        e,
        Error::Fault(Fault { pc: 4, va: BUF0 + 4096 + 0x10_0000, access: interp::Access::Write, misaligned: false })
    );
    let src = prologue(1) + "ld.u32 v1, [s0 + v0 + 2]\n";
    let e = run_src(&src, 2, 1, 32, &[]).unwrap_err();
    assert_eq!(e, Error::Fault(Fault { pc: 3, va: BUF0 + 2, access: interp::Access::Read, misaligned: true }));
    // An argument slot outside the argument buffer.
    let e = run_src("sarg s1, 9\n", 1, 1, 32, &[]).unwrap_err();
    assert!(matches!(e, Error::Fault(Fault { pc: 0, access: interp::Access::Read, .. })));
    // A program that never ends runs out of steps.
    let e = run_src("mov v1, 0\nloop\nbreak v1\nendloop\n", 1, 1, 32, &[]).unwrap_err();
    assert_eq!(e, Error::StepLimit);
}

// ---- random programs: width independence, jumps are shortcuts, disassembly round trip ----

/// A random program step.
#[derive(Clone, Debug)]
enum Step {
    Bin(u8, u8, u8, u8, Option<u32>),
    Tern(bool, u8, u8, u8, u8),
    Un(u8, u8, u8, Option<u32>),
    Builtin(u8, u8),
    Load(u8, u8),
    Store(u8, u8),
    Atomic(u8),
    If(u8),
    Else,
    EndIf,
    Loop,
    Break(u8),
    EndLoop,
    Exit(u8),
}

const BINARY_OPS: &[Op] = &[
    Op::Add,
    Op::Sub,
    Op::Mul,
    Op::MulHiU,
    Op::DivU,
    Op::DivS,
    Op::RemU,
    Op::RemS,
    Op::And,
    Op::Or,
    Op::Xor,
    Op::Shl,
    Op::Shr,
    Op::Sra,
    Op::MinU,
    Op::MaxU,
    Op::MinS,
    Op::MaxS,
    Op::FAdd,
    Op::FSub,
    Op::FMul,
    Op::FDiv,
    Op::FMin,
    Op::FMax,
    Op::CmpEq,
    Op::CmpNe,
    Op::CmpLtU,
    Op::CmpLeU,
    Op::CmpLtS,
    Op::CmpLeS,
    Op::FCmpEq,
    Op::FCmpLt,
    Op::FCmpLe,
];
const UNARY_OPS: &[Op] = &[Op::Mov, Op::Not, Op::CvtF32U32, Op::CvtF32I32, Op::CvtU32F32, Op::CvtI32F32, Op::FSqrt];

fn step() -> impl Strategy<Value = Step> {
    let r = || 0u8..12;
    let imm = || proptest::option::of(prop_oneof![0u32..40, any::<u32>()]);
    prop_oneof![
        6 => (0..BINARY_OPS.len() as u8, r(), r(), r(), imm()).prop_map(|(o, d, a, b, i)| Step::Bin(o, d, a, b, i)),
        1 => (any::<bool>(), r(), r(), r(), r()).prop_map(|(f, d, a, b, c)| Step::Tern(f, d, a, b, c)),
        2 => (0..UNARY_OPS.len() as u8, r(), r(), imm()).prop_map(|(o, d, a, i)| Step::Un(o, d, a, i)),
        1 => (r(), 0..Builtin::ALL.len() as u8).prop_map(|(d, b)| Step::Builtin(d, b)),
        1 => (r(), r()).prop_map(|(d, a)| Step::Load(d, a)),
        1 => (r(), r()).prop_map(|(a, v)| Step::Store(a, v)),
        1 => r().prop_map(Step::Atomic),
        2 => r().prop_map(Step::If),
        1 => Just(Step::Else),
        2 => Just(Step::EndIf),
        1 => Just(Step::Loop),
        2 => r().prop_map(Step::Break),
        2 => Just(Step::EndLoop),
        1 => r().prop_map(Step::Exit),
    ]
}

/// Private area per thread: 32 u32 at `s1 + gid * 128`, the first 16 scratch, then the dump
/// of v0..v11; shared counter at `s2`; a read-only
/// table of 16 u32 at `s3`. Registers v0..v11 are random; v48.. are loop counters; v60..v62
/// address temporaries; v63 = this thread's scratch offset.
fn build_program(steps: &[Step]) -> ProgramBuilder {
    let mut b = ProgramBuilder::new();
    b.sarg(S(1), 1).sarg(S(2), 2).sarg(S(3), 3);
    b.builtin(V(0), Builtin::GlobalIdX).shl_imm(V(63), V(0), 7).mov_imm(V(62), 0);
    // (is_loop, has_else)
    let mut open: Vec<(bool, bool)> = Vec::new();
    let loops = |open: &Vec<(bool, bool)>| open.iter().filter(|o| o.0).count();
    for s in steps {
        match *s {
            Step::Bin(o, d, a, x, i) => {
                let y = i.map_or(Operand::Reg(V(x)), |i| Operand::Imm(i.into()));
                b.binary(BINARY_OPS[o as usize], V(d), V(a), y);
            }
            Step::Tern(fma, d, a, x, c) => {
                if fma {
                    b.ffma(V(d), V(a), V(x), V(c))
                } else {
                    b.sel(V(d), V(a), V(x), V(c))
                };
            }
            Step::Un(o, d, a, i) => {
                let y = i.map_or(Operand::Reg(V(a)), |i| Operand::Imm(i.into()));
                b.unary(UNARY_OPS[o as usize], V(d), y);
            }
            Step::Builtin(d, x) => {
                b.builtin(V(d), Builtin::ALL[x as usize]);
            }
            Step::Load(d, a) => {
                // Half the time from the shared table, half from the private scratch.
                b.and_imm(V(60), V(a), 15).shl_imm(V(60), V(60), 2);
                if a % 2 == 0 {
                    b.ld_u32(V(d), S(3), V(60), 0);
                } else {
                    b.add(V(60), V(60), V(63)).ld_u32(V(d), S(1), V(60), 0);
                }
            }
            Step::Store(a, v) => {
                b.and_imm(V(60), V(a), 15).shl_imm(V(60), V(60), 2).add(V(60), V(60), V(63));
                b.st_u32(S(1), V(60), 0, V(v));
            }
            Step::Atomic(v) => {
                b.atom_add(V(61), S(2), V(62), 0, V(v));
            }
            Step::If(c) if open.len() < 6 => {
                b.if_(V(c));
                open.push((false, false));
            }
            Step::Else if matches!(open.last(), Some((false, false))) => {
                b.else_();
                open.last_mut().unwrap().1 = true;
            }
            Step::EndIf if matches!(open.last(), Some((false, _))) => {
                b.endif();
                open.pop();
            }
            Step::Loop if open.len() < 6 && loops(&open) < 3 => {
                // Every loop ends after at most 4 iterations, whatever the random breaks do.
                let counter = V(48 + loops(&open) as u8);
                b.mov_imm(counter, 0).loop_();
                b.add_imm(counter, counter, 1).cmp_eq_imm(V(59), counter, 5).break_(V(59));
                open.push((true, false));
            }
            Step::Break(c) if loops(&open) > 0 => {
                b.break_(V(c));
            }
            Step::EndLoop if matches!(open.last(), Some((true, _))) => {
                b.endloop();
                open.pop();
            }
            Step::Exit(c) => {
                // Exit only the lanes where v[c] is odd, so some lanes usually survive.
                b.and_imm(V(58), V(c), 1).if_(V(58)).exit().endif();
            }
            _ => {}
        }
    }
    while let Some((is_loop, _)) = open.pop() {
        if is_loop {
            b.endloop()
        } else {
            b.endif()
        };
    }
    // Dump v0..v11 into the private scratch (after whatever the program stored there).
    for r in 0..12u8 {
        b.st_u32(S(1), V(63), 64 + 4 * r as u32, V(r));
    }
    b
}

/// Runs a program over `threads` threads in groups of `group`; returns (scratch, counter).
fn run_program(k: &ProgramBinary, threads: u32, group: u32, width: usize, jumps: bool) -> (Vec<u32>, u32) {
    run_program_with(k, threads, group, width, jumps, &[])
}

/// [`run_program`] with argument slots 4.. set to `extra`.
fn run_program_with(
    k: &ProgramBinary,
    threads: u32,
    group: u32,
    width: usize,
    jumps: bool,
    extra: &[u64],
) -> (Vec<u32>, u32) {
    let mut m = Memory::default();
    let groups = threads.div_ceil(group);
    m.map_u32s(BUF0, &vec![0; (groups * group) as usize * 32]);
    m.map_u32s(BUF1, &[0]);
    m.map_u32s(BUF2, &(0..16).map(|i| i * 0x0101_0101 + 3).collect::<Vec<_>>());
    let args: Vec<u64> = [0, BUF0, BUF1, BUF2].into_iter().chain(extra.iter().copied()).collect();
    m.map_args(ARGS, &args);
    let mut d = Dispatch::new(threads, group, ARGS);
    d.width = width;
    d.jumps = jumps;
    let r = interp::run(k, &mut m, &d);
    assert_eq!(r.err(), None);
    (m.u32s(BUF0), m.u32s(BUF1)[0])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Per-lane results do not depend on the wave width, and the structural jumps are pure
    /// shortcuts. (Scalar instructions appear only at the top level here: inside divergent
    /// control flow they are, by design, per wave.)
    #[test]
    fn random_programs_are_width_independent(steps in proptest::collection::vec(step(), 0..60), threads in 1u32..70, group in 1u32..40) {
        let k = build_program(&steps).build().unwrap();
        prop_assert_eq!(assemble(&program::disassemble(&k)).unwrap(), k.clone());
        let base = run_program(&k, threads, group, 1, true);
        for (width, jumps) in [(32, true), (32, false), (5, true), (64, true), (1, false)] {
            let got = run_program(&k, threads, group, width, jumps);
            prop_assert_eq!(&got, &base, "width {} jumps {}", width, jumps);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The specializer (program::specialize) against this oracle: a random program that reads two bound
    /// u32 arguments (slots 4 and 5, into v1 and v2 and a loop bound) computes the same memory
    /// generic and specialized for those values and its dispatch shape, at several wave
    /// widths.
    #[test]
    fn specialized_random_programs_match(
        steps in proptest::collection::vec(step(), 0..60), threads in 1u32..70, group in 1u32..40,
        x in prop_oneof![0u64..8, any::<u32>().prop_map(u64::from)], y in 0u64..6,
    ) {
        let body = program::disassemble(&build_program(&steps).build().unwrap());
        // Bound values feed registers, and a loop whose trip count is slot 5.
        let src = format!(
            "sarg s4, 4\nsarg s5, 5\nvfroms v1, s4\nvfroms v2, s5\nmov v40, 0\nloop\ncmp.lt.u v41, v40, v2\n\
             cmp.eq v41, v41, 0\nbreak v41\nadd v3, v3, v1\nadd v40, v40, 1\nendloop\n{body}"
        );
        let k = assemble(&src).unwrap();
        // The shape too: the builtins it decides fold.
        let dims = program::specialize::Dims { grid: [threads.div_ceil(group), 1, 1], group: [group, 1, 1] };
        let b = program::specialize::Binding::new([(4, x), (5, y)]).with_dims(Some(dims));
        let s = program::specialize::specialize(&k, &b, Default::default()).unwrap();
        for width in [32, 5] {
            let want = run_program_with(&k, threads, group, width, true, &[x, y]);
            let got = run_program_with(&s, threads, group, width, true, &[x, y]);
            prop_assert_eq!(&got, &want, "width {}\n{}", width, program::disassemble(&s));
        }
    }
}
