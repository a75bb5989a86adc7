//! The specializing compiler: a program plus argument values it may assume → an equivalent
//! program for exactly those values.
//!
//! [`specialize`] parses the validated instruction list into a tree of structured control
//! flow, partially evaluates it, drops dead code and emits a new binary (validated again).
//! The abstract state is, for every register, "this value in every lane that can still read
//! it", or unknown. Registers start at 0 (the ISA zeroes them when a wave starts), a bound
//! argument slot's `sarg` is known, and with a bound shape ([`Dims`]) so are the builtins it
//! decides (`%group_size.*`, `%grid_size.*`, and ids along a dimension of size 1). From
//! there:
//!
//! - **Constant folding.** An ALU instruction whose operands are known becomes `mov vD, imm`
//!   (or `smov`), with the interpreter's exact semantics (wrapping, RISC-V division, IEEE
//!   `f32`); `sarg` of a bound slot becomes `smov` when the value fits 32 bits.
//! - **Constant branches.** An `if` on a known value is replaced by the side that runs; a
//!   `break` on a known zero disappears.
//! - **Constant trip counts.** A loop whose every `break` is decided in each iteration is
//!   unrolled: its body is emitted once per iteration with the loop control gone, until the
//!   iteration that breaks (at most [`Limits::max_unroll`] iterations and
//!   [`Limits::max_instructions`] in all; otherwise the loop stays, its body folded where it
//!   can be).
//! - **Dead code.** A pure instruction (ALU, builtin, scalar move, `sarg`) whose result no
//!   later instruction can read is dropped. Loads, stores and atomics always stay, so a
//!   variant faults exactly where the generic program does.
//!
//! Soundness follows the ISA's rules (`docs/isa.md` §5): per lane, structured SIMT code runs
//! like a sequential program, so vector registers follow ordinary data flow (a write under a
//! mask changes only lanes that run it, which is what a per-lane path says). Scalars belong to
//! the wave and a write under divergence is seen by lanes on the other side, so a scalar
//! written inside an `if` on an unknown value or inside a loop that stays a loop is unknown
//! throughout that structure, and liveness treats `then` as flowing into `else`.

use abi::isa::{self, Builtin, FLAG_IMM, Form, Inst, Op};

use crate::ProgramBinary;

/// A dispatch's shape: the grid (in workgroups) and the workgroup (in threads).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Dims {
    /// Workgroups per dimension.
    pub grid: [u32; 3],
    /// Threads per workgroup per dimension.
    pub group: [u32; 3],
}

/// What a variant assumes: argument values ((slot, value) pairs, sorted by slot, one per
/// slot) and, optionally, the dispatch's shape.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Binding {
    args: Vec<(u32, u64)>,
    dims: Option<Dims>,
}

impl Binding {
    /// A binding of argument values (sorted; a later pair for the same slot wins), any shape.
    pub fn new(pairs: impl IntoIterator<Item = (u32, u64)>) -> Binding {
        let mut v: Vec<(u32, u64)> = Vec::new();
        for (s, x) in pairs {
            match v.iter_mut().find(|p| p.0 == s) {
                Some(p) => p.1 = x,
                None => v.push((s, x)),
            }
        }
        v.sort_unstable();
        Binding { args: v, dims: None }
    }
    /// The same, assuming also the dispatch shape `dims` (or any, with `None`).
    pub fn with_dims(mut self, dims: Option<Dims>) -> Binding {
        self.dims = dims;
        self
    }
    /// The argument pairs.
    pub fn pairs(&self) -> &[(u32, u64)] {
        &self.args
    }
    /// The shape assumed, if any.
    pub fn dims(&self) -> Option<Dims> {
        self.dims
    }
    /// Whether nothing is assumed.
    pub fn is_empty(&self) -> bool {
        self.args.is_empty() && self.dims.is_none()
    }
    /// The value bound to `slot`.
    pub fn get(&self, slot: u32) -> Option<u64> {
        self.args.iter().find(|p| p.0 == slot).map(|p| p.1)
    }
    /// Whether a dispatch with argument values `args` (slot `k` at index `k`) and shape
    /// `dims` satisfies every assumption.
    pub fn matches(&self, args: &[u64], dims: Dims) -> bool {
        self.args.iter().all(|&(s, x)| args.get(s as usize) == Some(&x)) && self.dims.is_none_or(|d| d == dims)
    }
}

/// The value of a builtin that the dispatch shape alone decides.
fn builtin_value(b: Builtin, d: Dims) -> Option<u32> {
    Some(match b {
        Builtin::GroupSizeX => d.group[0],
        Builtin::GroupSizeY => d.group[1],
        Builtin::GroupSizeZ => d.group[2],
        Builtin::GridSizeX => d.grid[0],
        Builtin::GridSizeY => d.grid[1],
        Builtin::GridSizeZ => d.grid[2],
        // An id along a dimension of size 1 is 0.
        Builtin::LocalIdX if d.group[0] == 1 => 0,
        Builtin::LocalIdY if d.group[1] == 1 => 0,
        Builtin::LocalIdZ if d.group[2] == 1 => 0,
        Builtin::GroupIdX if d.grid[0] == 1 => 0,
        Builtin::GroupIdY if d.grid[1] == 1 => 0,
        Builtin::GroupIdZ if d.grid[2] == 1 => 0,
        _ => return None,
    })
}

/// How far the compiler may go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Iterations one loop may be unrolled into.
    pub max_unroll: usize,
    /// Instructions in the result.
    pub max_instructions: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_unroll: 256, max_instructions: 8192 }
    }
}

/// Why a specialization failed (the generic program keeps running; nothing is lost).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecializeError {
    /// The result failed validation: a bug in this compiler, reported rather than used.
    #[error("the specialized program is invalid: {0}")]
    Invalid(String),
    /// The result is longer than the ISA allows.
    #[error("the specialized program would have {0} instructions")]
    TooLong(usize),
}

/// A structured program.
#[derive(Clone, Debug, PartialEq)]
enum Node {
    I(Inst),
    If { cond: u8, then: Vec<Node>, els: Option<Vec<Node>> },
    Loop(Vec<Node>),
    Break(u8),
    Exit,
}

fn parse(insts: &[Inst]) -> Vec<Node> {
    fn block(insts: &[Inst], pc: &mut usize) -> Vec<Node> {
        let mut out = Vec::new();
        while *pc < insts.len() {
            let i = insts[*pc];
            match i.op {
                Op::Else | Op::EndIf | Op::EndLoop => return out,
                Op::If => {
                    *pc += 1;
                    let then = block(insts, pc);
                    let els = if insts.get(*pc).map(|i| i.op) == Some(Op::Else) {
                        *pc += 1;
                        Some(block(insts, pc))
                    } else {
                        None
                    };
                    *pc += 1; // endif
                    out.push(Node::If { cond: i.a, then, els });
                }
                Op::Loop => {
                    *pc += 1;
                    let body = block(insts, pc);
                    *pc += 1; // endloop
                    out.push(Node::Loop(body));
                }
                Op::Break => {
                    *pc += 1;
                    out.push(Node::Break(i.a));
                }
                Op::Exit => {
                    *pc += 1;
                    out.push(Node::Exit);
                }
                Op::Nop => *pc += 1,
                _ => {
                    *pc += 1;
                    out.push(Node::I(i));
                }
            }
        }
        out
    }
    let mut pc = 0;
    block(insts, &mut pc)
}

fn emit(nodes: &[Node], out: &mut Vec<Inst>, loop_end_fixups: &mut Vec<usize>) {
    for n in nodes {
        match n {
            Node::I(i) => out.push(*i),
            Node::Exit => out.push(Inst::new(Op::Exit, 0, 0, 0, 0, 0)),
            Node::Break(c) => {
                loop_end_fixups.push(out.len());
                out.push(Inst::new(Op::Break, 0, *c, 0, 0, 0));
            }
            Node::If { cond, then, els } => {
                let at = out.len();
                out.push(Inst::new(Op::If, 0, *cond, 0, 0, 0));
                emit(then, out, loop_end_fixups);
                if let Some(e) = els {
                    let el = out.len();
                    out.push(Inst::new(Op::Else, 0, 0, 0, 0, 0));
                    out[at].imm = el as u32;
                    emit(e, out, loop_end_fixups);
                    out[el].imm = out.len() as u32;
                } else {
                    out[at].imm = out.len() as u32;
                }
                out.push(Inst::new(Op::EndIf, 0, 0, 0, 0, 0));
            }
            Node::Loop(body) => {
                let at = out.len();
                out.push(Inst::new(Op::Loop, 0, 0, 0, 0, 0));
                let mut breaks = Vec::new();
                emit(body, out, &mut breaks);
                let end = out.len();
                out.push(Inst::new(Op::EndLoop, 0, 0, 0, 0, at as u32));
                out[at].imm = end as u32;
                for b in breaks {
                    out[b].imm = end as u32;
                }
            }
        }
    }
}

/// Registers an instruction writes: (vector mask, scalar mask).
fn defs(i: &Inst) -> (u64, u16) {
    let v = |r: u8| 1u64 << (r & 63);
    let s = |r: u8| 1u16 << (r & 15);
    match i.op.form() {
        Form::Binary | Form::Ternary | Form::Unary | Form::Builtin | Form::FromScalar | Form::Atomic => (v(i.d), 0),
        Form::Load if i.op == Op::Ld64 => (v(i.d) | v(i.d + 1), 0),
        Form::Load => (v(i.d), 0),
        Form::ScalarArg | Form::ScalarImm | Form::ScalarAdd => (0, s(i.d)),
        Form::Store | Form::None | Form::Branch | Form::CondBranch => (0, 0),
    }
}

/// Registers an instruction reads: (vector mask, scalar mask).
fn uses(i: &Inst) -> (u64, u16) {
    let v = |r: u8| 1u64 << (r & 63);
    let s = |r: u8| 1u16 << (r & 15);
    let imm = i.c == FLAG_IMM;
    match i.op.form() {
        Form::Binary => (v(i.a) | if imm { 0 } else { v(i.b) }, 0),
        Form::Unary => (if imm { 0 } else { v(i.a) }, 0),
        Form::Ternary => (v(i.a) | v(i.b) | v(i.c), 0),
        Form::FromScalar | Form::ScalarAdd => (0, s(i.a)),
        Form::Load => (v(i.b), s(i.a)),
        Form::Store if i.op == Op::St64 => (v(i.b) | v(i.d) | v(i.d + 1), s(i.a)),
        Form::Store => (v(i.b) | v(i.d), s(i.a)),
        Form::Atomic => (v(i.b) | v(i.c), s(i.a)),
        Form::CondBranch => (v(i.a), 0),
        Form::Builtin | Form::ScalarArg | Form::ScalarImm | Form::None | Form::Branch => (0, 0),
    }
}

fn block_defs(nodes: &[Node]) -> (u64, u16) {
    nodes.iter().fold((0, 0), |(v, s), n| {
        let (a, b) = match n {
            Node::I(i) => defs(i),
            Node::If { then, els, .. } => {
                let (a, b) = block_defs(then);
                let (c, d) = els.as_deref().map(block_defs).unwrap_or((0, 0));
                (a | c, b | d)
            }
            Node::Loop(body) => block_defs(body),
            Node::Break(_) | Node::Exit => (0, 0),
        };
        (v | a, s | b)
    })
}

/// What is known: each register's value in every lane that can read it.
#[derive(Clone, Debug, PartialEq)]
struct Known {
    v: [Option<u32>; isa::VREGS],
    s: [Option<u64>; isa::SREGS],
}

impl Known {
    fn start() -> Known {
        Known { v: [Some(0); isa::VREGS], s: [Some(0); isa::SREGS] }
    }
    fn forget(&mut self, (v, s): (u64, u16)) {
        for r in 0..isa::VREGS {
            if v & (1 << r) != 0 {
                self.v[r] = None;
            }
        }
        for r in 0..isa::SREGS {
            if s & (1 << r) != 0 {
                self.s[r] = None;
            }
        }
    }
    fn join(a: Option<Known>, b: Option<Known>) -> Option<Known> {
        match (a, b) {
            (Some(mut a), Some(b)) => {
                for r in 0..isa::VREGS {
                    if a.v[r] != b.v[r] {
                        a.v[r] = None;
                    }
                }
                for r in 0..isa::SREGS {
                    if a.s[r] != b.s[r] {
                        a.s[r] = None;
                    }
                }
                Some(a)
            }
            (a, None) => a,
            (None, b) => b,
        }
    }
}

/// How a block ended, for the code after it in the same structure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flow {
    /// Falls through.
    Normal,
    /// Every active lane left the innermost loop (the rest of the body is dead).
    Broke,
    /// Every active lane exited.
    Exited,
}

/// Where a block sits with respect to the innermost loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ctx {
    /// Not in a loop, or in a loop that stays a loop: `break`s are emitted.
    Residual,
    /// In an iteration of a loop being unrolled, where every lane runs the same path.
    Unroll,
    /// In an iteration being unrolled, inside an `if` on an unknown value: a `break` here
    /// must be a known zero, or the unrolling is given up.
    UnrollDivergent,
}

/// Unrolling gave up.
struct Undecided;

/// Evaluates an ALU instruction on known operands, exactly as the device does.
fn eval(op: Op, a: u32, b: u32, c: u32) -> Option<u32> {
    let f = f32::from_bits;
    let (ai, bi) = (a as i32, b as i32);
    Some(match op {
        Op::Add => a.wrapping_add(b),
        Op::Sub => a.wrapping_sub(b),
        Op::Mul => a.wrapping_mul(b),
        Op::MulHiU => ((a as u64 * b as u64) >> 32) as u32,
        Op::DivU => a.checked_div(b).unwrap_or(u32::MAX),
        Op::DivS => {
            if bi == 0 {
                u32::MAX
            } else {
                ai.wrapping_div(bi) as u32
            }
        }
        Op::RemU => a.checked_rem(b).unwrap_or(a),
        Op::RemS => {
            if bi == 0 {
                a
            } else {
                ai.wrapping_rem(bi) as u32
            }
        }
        Op::And => a & b,
        Op::Or => a | b,
        Op::Xor => a ^ b,
        Op::Shl => a << (b & 31),
        Op::Shr => a >> (b & 31),
        Op::Sra => (ai >> (b & 31)) as u32,
        Op::MinU => a.min(b),
        Op::MaxU => a.max(b),
        Op::MinS => ai.min(bi) as u32,
        Op::MaxS => ai.max(bi) as u32,
        Op::FAdd => (f(a) + f(b)).to_bits(),
        Op::FSub => (f(a) - f(b)).to_bits(),
        Op::FMul => (f(a) * f(b)).to_bits(),
        Op::FDiv => (f(a) / f(b)).to_bits(),
        Op::CmpEq => (a == b) as u32,
        Op::CmpNe => (a != b) as u32,
        Op::CmpLtU => (a < b) as u32,
        Op::CmpLeU => (a <= b) as u32,
        Op::CmpLtS => (ai < bi) as u32,
        Op::CmpLeS => (ai <= bi) as u32,
        Op::FCmpEq => (f(a) == f(b)) as u32,
        Op::FCmpLt => (f(a) < f(b)) as u32,
        Op::FCmpLe => (f(a) <= f(b)) as u32,
        Op::FFma => f(a).mul_add(f(b), f(c)).to_bits(),
        Op::Sel => {
            if a != 0 {
                b
            } else {
                c
            }
        }
        Op::Mov => a,
        Op::Not => !a,
        Op::CvtF32U32 => (a as f32).to_bits(),
        Op::CvtF32I32 => (ai as f32).to_bits(),
        Op::CvtU32F32 => f(a) as u32,
        Op::CvtI32F32 => f(a) as i32 as u32,
        Op::FSqrt => f(a).sqrt().to_bits(),
        // fmin/fmax: the ISA leaves the sign of a zero result open; the device's choice is
        // not ours to guess, so they are never folded.
        _ => return None,
    })
}

struct Eval<'a> {
    binding: &'a Binding,
    limits: Limits,
    /// Instructions emitted so far in the current unrolling attempt (a size guard).
    budget: usize,
    /// What was known at the `break` that ended the iteration being unrolled.
    broke: Option<Known>,
}

fn mov_imm(d: u8, x: u32) -> Inst {
    Inst::new(Op::Mov, d, 0, 0, FLAG_IMM, x)
}

impl Eval<'_> {
    /// One straight-line instruction: fold it or keep it, and update what is known.
    fn inst(&mut self, i: Inst, k: &mut Known, out: &mut Vec<Node>) {
        let imm = i.c == FLAG_IMM;
        let folded: Option<Inst> = match i.op.form() {
            Form::Binary => {
                let b = if imm { Some(i.imm) } else { k.v[i.b as usize] };
                match (k.v[i.a as usize], b) {
                    (Some(a), Some(b)) => eval(i.op, a, b, 0).map(|x| mov_imm(i.d, x)),
                    _ => None,
                }
            }
            Form::Unary => {
                let a = if imm { Some(i.imm) } else { k.v[i.a as usize] };
                a.and_then(|a| eval(i.op, a, 0, 0)).map(|x| mov_imm(i.d, x))
            }
            Form::Ternary => match (k.v[i.a as usize], k.v[i.b as usize], k.v[i.c as usize]) {
                (Some(a), Some(b), Some(c)) => eval(i.op, a, b, c).map(|x| mov_imm(i.d, x)),
                // A select on a known condition is a move of the side it picks.
                (Some(a), _, _) if i.op == Op::Sel => {
                    let src = if a != 0 { i.b } else { i.c };
                    Some(Inst::new(Op::Mov, i.d, src, 0, 0, 0))
                }
                _ => None,
            },
            Form::FromScalar => k.s[i.a as usize].map(|s| {
                let x = if i.op == Op::VFromSHi { (s >> 32) as u32 } else { s as u32 };
                mov_imm(i.d, x)
            }),
            Form::Builtin => self
                .binding
                .dims
                .and_then(|d| Builtin::from_u32(i.imm).and_then(|b| builtin_value(b, d)))
                .map(|x| mov_imm(i.d, x)),
            Form::ScalarArg => match self.binding.get(i.imm) {
                Some(x) if x <= u32::MAX as u64 => Some(Inst::new(Op::SMov, i.d, 0, 0, 0, x as u32)),
                _ => None,
            },
            Form::ScalarAdd => k.s[i.a as usize].and_then(|s| {
                let x = s.wrapping_add(i.imm as i32 as i64 as u64);
                (x <= u32::MAX as u64).then(|| Inst::new(Op::SMov, i.d, 0, 0, 0, x as u32))
            }),
            _ => None,
        };
        // What is known afterwards.
        let (vd, sd) = defs(&i);
        let result = folded.unwrap_or(i);
        match result.op.form() {
            Form::Unary if result.op == Op::Mov && result.c == FLAG_IMM => k.v[i.d as usize] = Some(result.imm),
            Form::Unary if result.op == Op::Mov => k.v[i.d as usize] = k.v[result.a as usize],
            Form::ScalarImm => k.s[i.d as usize] = Some(result.imm as u64),
            Form::ScalarArg => k.s[i.d as usize] = self.binding.get(i.imm),
            _ => k.forget((vd, sd)),
        }
        self.budget += 1;
        out.push(Node::I(result));
    }

    /// A block; what is known flows through `k` (`None` afterwards: no lane gets past).
    fn block(
        &mut self,
        nodes: &[Node],
        k: &mut Option<Known>,
        out: &mut Vec<Node>,
        ctx: Ctx,
    ) -> Result<Flow, Undecided> {
        for n in nodes {
            // No lane gets here: the rest of the block is dead.
            let Some(kk) = k.as_mut() else { return Ok(Flow::Exited) };
            match n {
                Node::I(i) => self.inst(*i, kk, out),
                Node::Exit => {
                    out.push(Node::Exit);
                    *k = None;
                    return Ok(Flow::Exited);
                }
                Node::Break(c) => match (kk.v[*c as usize], ctx) {
                    (Some(0), _) => {}
                    (Some(_), Ctx::Unroll) => {
                        self.broke = k.take();
                        return Ok(Flow::Broke);
                    }
                    (_, Ctx::Unroll | Ctx::UnrollDivergent) => return Err(Undecided),
                    (Some(_), Ctx::Residual) => {
                        out.push(Node::Break(*c));
                        *k = None;
                        return Ok(Flow::Broke);
                    }
                    (None, Ctx::Residual) => out.push(Node::Break(*c)),
                },
                Node::If { cond, then, els } => match kk.v[*cond as usize] {
                    Some(x) => {
                        let side: &[Node] = if x != 0 { then } else { els.as_deref().unwrap_or(&[]) };
                        let f = self.block(side, k, out, ctx)?;
                        if f != Flow::Normal {
                            return Ok(f);
                        }
                    }
                    None => {
                        // Scalars written on either side are unknown on both (SIMT runs
                        // `then` before `else`, and a wave-wide write crosses over).
                        let (_, sw) = block_defs(then);
                        let (_, sw2) = els.as_deref().map(block_defs).unwrap_or((0, 0));
                        kk.forget((0, sw | sw2));
                        let inner = if ctx == Ctx::Residual { Ctx::Residual } else { Ctx::UnrollDivergent };
                        let mut kt = Some(kk.clone());
                        let mut ke = Some(kk.clone());
                        let mut t = Vec::new();
                        let mut e = Vec::new();
                        self.block(then, &mut kt, &mut t, inner)?;
                        if let Some(els) = els {
                            self.block(els, &mut ke, &mut e, inner)?;
                        }
                        self.budget += 3;
                        out.push(Node::If { cond: *cond, then: t, els: els.as_ref().map(|_| e) });
                        *k = Known::join(kt, ke);
                    }
                },
                Node::Loop(body) => self.r#loop(body, k, out)?,
            }
        }
        Ok(Flow::Normal)
    }

    fn r#loop(&mut self, body: &[Node], k: &mut Option<Known>, out: &mut Vec<Node>) -> Result<(), Undecided> {
        // Try to unroll: run iterations while every break is decided.
        let saved_budget = self.budget;
        let mut trial_k = k.clone();
        let mut trial = Vec::new();
        for _ in 0..self.limits.max_unroll {
            match self.block(body, &mut trial_k, &mut trial, Ctx::Unroll) {
                Ok(Flow::Broke) => {
                    // Every lane left at the same `break`: what was known there goes on.
                    out.extend(trial);
                    *k = self.broke.take();
                    return Ok(());
                }
                Ok(Flow::Exited) => {
                    out.extend(trial);
                    *k = None;
                    return Ok(());
                }
                Ok(Flow::Normal) if self.budget > self.limits.max_instructions => break,
                Ok(Flow::Normal) => {}
                Err(Undecided) => break,
            }
        }
        // Keep the loop; inside it, whatever the body writes is unknown.
        self.budget = saved_budget;
        let Some(kk) = k.as_mut() else { return Ok(()) };
        kk.forget(block_defs(body));
        let mut inner_k = Some(kk.clone());
        let mut inner = Vec::new();
        self.block(body, &mut inner_k, &mut inner, Ctx::Residual)?;
        self.budget += 2;
        out.push(Node::Loop(inner));
        Ok(())
    }
}

/// Liveness: (vector mask, scalar mask).
type Live = (u64, u16);

fn union(a: Live, b: Live) -> Live {
    (a.0 | b.0, a.1 | b.1)
}

/// Whether dropping an instruction whose results are dead changes nothing else.
fn pure(i: &Inst) -> bool {
    !matches!(i.op.form(), Form::Load | Form::Store | Form::Atomic | Form::None | Form::Branch | Form::CondBranch)
}

/// Backward liveness over a block; with `remove`, drops dead pure instructions. `exit_live`
/// is what is live after the innermost loop (where a `break` goes).
fn live_block(nodes: &mut Vec<Node>, mut live: Live, exit_live: Live, remove: bool) -> Live {
    let mut i = nodes.len();
    while i > 0 {
        i -= 1;
        match &mut nodes[i] {
            Node::I(inst) => {
                let (dv, ds) = defs(inst);
                if pure(inst) && dv & live.0 == 0 && ds & live.1 == 0 {
                    if remove {
                        nodes.remove(i);
                    }
                    continue;
                }
                let (uv, us) = uses(inst);
                live = ((live.0 & !dv) | uv, (live.1 & !ds) | us);
            }
            Node::Break(c) => live = union(union(live, exit_live), (1 << *c, 0)),
            Node::Exit => {}
            Node::If { cond, then, els } => {
                let else_in = match els {
                    Some(e) => live_block(e, live, exit_live, remove),
                    None => live,
                };
                // `then` runs before `else` in SIMT: what `else` reads may come from `then`.
                let then_in = live_block(then, union(live, else_in), exit_live, remove);
                live = union(union(then_in, else_in), (1 << *cond, 0));
            }
            Node::Loop(body) => {
                // Fixed point: the body's live-out is what is live after the loop (lanes that
                // end) plus its own live-in (the next iteration).
                let after = live;
                let mut head = after;
                loop {
                    let mut probe = body.clone();
                    let next = union(live_block(&mut probe, union(head, after), after, false), head);
                    if next == head {
                        break;
                    }
                    head = next;
                }
                live = union(live_block(body, union(head, after), after, remove), head);
            }
        }
    }
    live
}

/// Drops `if`s left with nothing inside (they have no effect).
fn prune(nodes: &mut Vec<Node>) {
    for n in nodes.iter_mut() {
        match n {
            Node::If { then, els, .. } => {
                prune(then);
                if let Some(e) = els {
                    prune(e);
                    if e.is_empty() {
                        *els = None;
                    }
                }
            }
            Node::Loop(b) => prune(b),
            _ => {}
        }
    }
    nodes.retain(|n| !matches!(n, Node::If { then, els: None, .. } if then.is_empty()));
}

/// Compiles the variant of `program` for argument values `binding` (see the module
/// documentation). The result runs exactly like `program` on any dispatch whose arguments match
/// the binding, with fewer instructions.
pub fn specialize(
    program: &ProgramBinary,
    binding: &Binding,
    limits: Limits,
) -> Result<ProgramBinary, SpecializeError> {
    let tree = parse(&program.decode());
    let mut ev = Eval { binding, limits, budget: 0, broke: None };
    let mut k = Some(Known::start());
    let mut out = Vec::new();
    // Top level is residual: no loop is open, so no break can be reached.
    let _ = ev.block(&tree, &mut k, &mut out, Ctx::Residual);
    live_block(&mut out, (0, 0), (0, 0), true);
    prune(&mut out);
    let mut insts = Vec::new();
    emit(&out, &mut insts, &mut Vec::new());
    if insts.is_empty() {
        // A program that does nothing observable: one `nop` keeps it a valid binary.
        insts.push(Inst::new(Op::Nop, 0, 0, 0, 0, 0));
    }
    if insts.len() > limits.max_instructions.min(isa::MAX_INSTRUCTIONS as usize) {
        return Err(SpecializeError::TooLong(insts.len()));
    }
    let words = insts.iter().map(|i| i.canonical().encode()).collect();
    ProgramBinary::from_words(words).map_err(|e| SpecializeError::Invalid(e.to_string()))
}

/// The argument slots a program reads with `sarg` (the highest plus one), and which of them
/// feed a memory base (buffers, not worth binding).
pub fn argument_slots(program: &ProgramBinary) -> (u32, Vec<u32>) {
    let insts = program.decode();
    let mut n = 0;
    let mut base_scalars = 0u16;
    for i in &insts {
        if matches!(i.op.form(), Form::Load | Form::Store | Form::Atomic) {
            base_scalars |= 1 << (i.a & 15);
        }
    }
    let mut pointers = Vec::new();
    for i in &insts {
        if i.op == Op::SArg {
            n = n.max(i.imm.saturating_add(1));
            if base_scalars & (1 << (i.d & 15)) != 0 && !pointers.contains(&i.imm) {
                pointers.push(i.imm);
            }
        }
    }
    (n, pointers)
}
