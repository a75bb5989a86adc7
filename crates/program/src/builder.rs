//! [`ProgramBuilder`]: a program from Rust, one method per instruction, with registers typed
//! as [`V`] and [`S`] so they cannot be swapped. Control flow (`if_`/`else_`/`endif`,
//! `loop_`/`break_`/`endloop`) is written as structure and the builder fills in every branch
//! target. Mistakes do not panic: the first one is kept and [`ProgramBuilder::build`] returns
//! it as a [`BuildError`]; a program it builds always passes [`abi::isa::validate`].

use core::fmt;

use abi::isa::{self, Builtin, Form, Inst, Op, ProgramError};

use crate::ProgramBinary;

/// A vector register `v0..v63`: one 32-bit value per lane.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct V(pub u8);

/// A scalar register `s0..s15`: one 64-bit value per wave.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct S(pub u8);

impl fmt::Display for V {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

impl fmt::Display for S {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s{}", self.0)
    }
}

/// A 32-bit immediate, as raw bits. Integers convert as themselves (negative `i32`s as two's
/// complement), `f32`s as their bit pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Imm(pub u32);

impl From<u32> for Imm {
    fn from(x: u32) -> Self {
        Imm(x)
    }
}

impl From<i32> for Imm {
    fn from(x: i32) -> Self {
        Imm(x as u32)
    }
}

impl From<f32> for Imm {
    fn from(x: f32) -> Self {
        Imm(x.to_bits())
    }
}

/// The second operand of a binary op (or the only source of a unary op): a register or an
/// immediate (which sets [`isa::FLAG_IMM`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operand {
    /// A vector register.
    Reg(V),
    /// An immediate.
    Imm(Imm),
}

impl From<V> for Operand {
    fn from(v: V) -> Self {
        Operand::Reg(v)
    }
}

impl From<Imm> for Operand {
    fn from(i: Imm) -> Self {
        Operand::Imm(i)
    }
}

/// Why [`ProgramBuilder::build`] refused a program. `pc` is an instruction index.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// A register index beyond `v63` / `s15`.
    #[error("instruction {pc}: register {register} is out of range (v0..v63, s0..s15)")]
    BadRegister {
        /// Instruction index.
        pc: u32,
        /// The register as written (`v64`, `s16`).
        register: String,
    },
    /// A 64-bit load or store on `v63`: the pair would need `v64`.
    #[error("instruction {pc}: v{index} cannot start a register pair (64-bit access uses v{index} and the next one)")]
    BadPair {
        /// Instruction index.
        pc: u32,
        /// The first register of the pair.
        index: u8,
    },
    /// `else` with no `if` open.
    #[error("instruction {pc}: `else` without an open `if`")]
    ElseWithoutIf {
        /// Instruction index.
        pc: u32,
    },
    /// A second `else` for the same `if`.
    #[error("instruction {pc}: second `else` for the `if` at instruction {if_pc}")]
    SecondElse {
        /// Instruction index.
        pc: u32,
        /// The `if`.
        if_pc: u32,
    },
    /// `endif` with nothing open.
    #[error("instruction {pc}: `endif` without an open `if`")]
    EndIfWithoutIf {
        /// Instruction index.
        pc: u32,
    },
    /// `endloop` with nothing open.
    #[error("instruction {pc}: `endloop` without an open `loop`")]
    EndLoopWithoutLoop {
        /// Instruction index.
        pc: u32,
    },
    /// `break` with no enclosing `loop`.
    #[error("instruction {pc}: `break` outside a `loop`")]
    BreakOutsideLoop {
        /// Instruction index.
        pc: u32,
    },
    /// A closer (or `else`) that does not match the innermost open structure.
    #[error("instruction {pc}: `{closer}` while the `{opener}` at instruction {opener_pc} is still open")]
    Mismatched {
        /// Instruction index of the closer.
        pc: u32,
        /// `else`, `endif` or `endloop`.
        closer: &'static str,
        /// `if` or `loop`.
        opener: &'static str,
        /// Where the innermost open structure starts.
        opener_pc: u32,
    },
    /// An `if` or `loop` never closed.
    #[error("instruction {pc}: `{opener}` is never closed (missing `{closer}`)")]
    Unclosed {
        /// Instruction index of the opener.
        pc: u32,
        /// `if` or `loop`.
        opener: &'static str,
        /// `endif` or `endloop`.
        closer: &'static str,
    },
    /// Nesting deeper than [`isa::MAX_NESTING`].
    #[error("instruction {pc}: control flow nested deeper than {max}", max = isa::MAX_NESTING)]
    TooDeep {
        /// The opener that goes one level too deep.
        pc: u32,
    },
    /// No instructions.
    #[error("the program has no instructions")]
    Empty,
    /// More than [`isa::MAX_INSTRUCTIONS`] instructions.
    #[error("the program is longer than {max} instructions", max = isa::MAX_INSTRUCTIONS)]
    TooLong,
    /// [`isa::validate`] refused the result (a builder bug if it ever happens).
    #[error(transparent)]
    Invalid(#[from] ProgramError),
}

impl BuildError {
    /// The instruction the error is about, if any.
    pub fn pc(&self) -> Option<u32> {
        match *self {
            BuildError::BadRegister { pc, .. }
            | BuildError::BadPair { pc, .. }
            | BuildError::ElseWithoutIf { pc }
            | BuildError::SecondElse { pc, .. }
            | BuildError::EndIfWithoutIf { pc }
            | BuildError::EndLoopWithoutLoop { pc }
            | BuildError::BreakOutsideLoop { pc }
            | BuildError::Mismatched { pc, .. }
            | BuildError::Unclosed { pc, .. }
            | BuildError::TooDeep { pc } => Some(pc),
            BuildError::Invalid(e) => Some(e.pc),
            BuildError::Empty | BuildError::TooLong => None,
        }
    }
}

/// An open `if` or `loop`.
#[derive(Clone, Debug)]
struct Open {
    is_loop: bool,
    pc: u32,
    else_pc: Option<u32>,
    breaks: Vec<u32>,
}

impl Open {
    fn name(&self) -> &'static str {
        if self.is_loop { "loop" } else { "if" }
    }
}

/// Builds a program instruction by instruction.
///
/// Methods append one instruction and return `&mut Self`, so calls chain. Mistakes (a register
/// out of range, an `endif` with no `if`, ...) do not panic: the first one is kept and
/// [`ProgramBuilder::build`] returns it.
///
/// ```
/// use abi::isa::Builtin;
/// use program::{ProgramBuilder, S, V};
///
/// // out[i] = i * 2 for i < n; args: slot 0 = out, slot 1 = n.
/// let mut b = ProgramBuilder::new();
/// b.sarg(S(0), 0).sarg(S(1), 1).vfroms(V(1), S(1));
/// b.builtin(V(0), Builtin::GlobalIdX).cmp_lt_u(V(2), V(0), V(1));
/// b.if_(V(2));
/// b.shl_imm(V(3), V(0), 2).mul_imm(V(4), V(0), 2).st_u32(S(0), V(3), 0, V(4));
/// b.endif();
/// let program = b.build().unwrap();
/// assert_eq!(program.len(), 10);
/// ```
#[derive(Clone, Debug, Default)]
pub struct ProgramBuilder {
    words: Vec<u64>,
    open: Vec<Open>,
    error: Option<BuildError>,
}

macro_rules! binary_methods {
    ($($(#[$m:meta])* $name:ident, $name_imm:ident, $op:ident, $imm_ty:ty;)*) => {
        $(
            $(#[$m])*
            #[doc = concat!("\n\n`", stringify!($name), " d, a, b`: `v[d] = v[a] OP v[b]`.")]
            pub fn $name(&mut self, d: V, a: V, b: V) -> &mut Self {
                self.binary(Op::$op, d, a, Operand::Reg(b))
            }
            $(#[$m])*
            #[doc = "\n\nWith an immediate second operand."]
            pub fn $name_imm(&mut self, d: V, a: V, imm: $imm_ty) -> &mut Self {
                self.binary(Op::$op, d, a, Operand::Imm(imm.into()))
            }
        )*
    };
}

macro_rules! unary_methods {
    ($($(#[$m:meta])* $name:ident, $name_imm:ident, $op:ident, $imm_ty:ty;)*) => {
        $(
            $(#[$m])*
            pub fn $name(&mut self, d: V, a: V) -> &mut Self {
                self.unary(Op::$op, d, Operand::Reg(a))
            }
            $(#[$m])*
            #[doc = "\n\nOf an immediate."]
            pub fn $name_imm(&mut self, d: V, imm: $imm_ty) -> &mut Self {
                self.unary(Op::$op, d, Operand::Imm(imm.into()))
            }
        )*
    };
}

impl ProgramBuilder {
    /// An empty program.
    pub fn new() -> Self {
        Self::default()
    }

    /// Instructions so far; also the index the next instruction gets.
    pub fn len(&self) -> usize {
        self.words.len()
    }

    /// Whether no instruction has been added.
    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    /// The first error so far, if any.
    pub fn error(&self) -> Option<&BuildError> {
        self.error.as_ref()
    }

    /// Open `if`s and `loop`s.
    pub fn depth(&self) -> usize {
        self.open.len()
    }

    /// Checks the structure and validates the program.
    pub fn build(&self) -> Result<ProgramBinary, BuildError> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        if let Some(o) = self.open.last() {
            let closer = if o.is_loop { "endloop" } else { "endif" };
            return Err(BuildError::Unclosed { pc: o.pc, opener: o.name(), closer });
        }
        if self.words.is_empty() {
            return Err(BuildError::Empty);
        }
        Ok(ProgramBinary::from_words(self.words.clone())?)
    }

    // ---- internals: every public method goes through these ----

    fn record(&mut self, r: Result<(), BuildError>) -> &mut Self {
        if let Err(e) = r
            && self.error.is_none()
        {
            self.error = Some(e);
        }
        self
    }

    fn pc(&self) -> u32 {
        self.words.len() as u32
    }

    fn vreg(&self, r: V) -> Result<u8, BuildError> {
        if (r.0 as usize) < isa::VREGS {
            Ok(r.0)
        } else {
            Err(BuildError::BadRegister { pc: self.pc(), register: r.to_string() })
        }
    }

    fn vpair(&self, r: V) -> Result<u8, BuildError> {
        let i = self.vreg(r)?;
        if (i as usize) < isa::VREGS - 1 { Ok(i) } else { Err(BuildError::BadPair { pc: self.pc(), index: i }) }
    }

    fn sreg(&self, r: S) -> Result<u8, BuildError> {
        if (r.0 as usize) < isa::SREGS {
            Ok(r.0)
        } else {
            Err(BuildError::BadRegister { pc: self.pc(), register: r.to_string() })
        }
    }

    fn emit(&mut self, i: Inst) -> Result<u32, BuildError> {
        let pc = self.pc();
        if pc >= isa::MAX_INSTRUCTIONS {
            return Err(BuildError::TooLong);
        }
        self.words.push(i.encode());
        Ok(pc)
    }

    fn patch_imm(&mut self, pc: u32, imm: u32) {
        let w = &mut self.words[pc as usize];
        *w = (*w & 0xffff_ffff) | ((imm as u64) << 32);
    }

    pub(crate) fn try_binary(&mut self, op: Op, d: V, a: V, b: Operand) -> Result<(), BuildError> {
        debug_assert_eq!(op.form(), Form::Binary);
        let (d, a) = (self.vreg(d)?, self.vreg(a)?);
        let i = match b {
            Operand::Reg(b) => Inst::new(op, d, a, self.vreg(b)?, 0, 0),
            Operand::Imm(Imm(x)) => Inst::new(op, d, a, 0, isa::FLAG_IMM, x),
        };
        self.emit(i).map(drop)
    }

    pub(crate) fn try_ternary(&mut self, op: Op, d: V, a: V, b: V, c: V) -> Result<(), BuildError> {
        debug_assert_eq!(op.form(), Form::Ternary);
        let i = Inst::new(op, self.vreg(d)?, self.vreg(a)?, self.vreg(b)?, self.vreg(c)?, 0);
        self.emit(i).map(drop)
    }

    pub(crate) fn try_unary(&mut self, op: Op, d: V, a: Operand) -> Result<(), BuildError> {
        debug_assert_eq!(op.form(), Form::Unary);
        let d = self.vreg(d)?;
        let i = match a {
            Operand::Reg(a) => Inst::new(op, d, self.vreg(a)?, 0, 0, 0),
            Operand::Imm(Imm(x)) => Inst::new(op, d, 0, 0, isa::FLAG_IMM, x),
        };
        self.emit(i).map(drop)
    }

    pub(crate) fn try_builtin(&mut self, d: V, b: Builtin) -> Result<(), BuildError> {
        let i = Inst::new(Op::Builtin, self.vreg(d)?, 0, 0, 0, b as u32);
        self.emit(i).map(drop)
    }

    pub(crate) fn try_scalar(&mut self, op: Op, d: S, a: S, imm: u32) -> Result<(), BuildError> {
        let d = self.sreg(d)?;
        let a = if op.form() == Form::ScalarAdd { self.sreg(a)? } else { 0 };
        self.emit(Inst::new(op, d, a, 0, 0, imm)).map(drop)
    }

    pub(crate) fn try_from_scalar(&mut self, op: Op, d: V, a: S) -> Result<(), BuildError> {
        let i = Inst::new(op, self.vreg(d)?, self.sreg(a)?, 0, 0, 0);
        self.emit(i).map(drop)
    }

    /// A load, store or atomic: `reg` is the destination (loads, atomics) or the value
    /// (stores); `value` is the atomic's operand.
    pub(crate) fn try_memory(
        &mut self,
        op: Op,
        reg: V,
        base: S,
        index: V,
        offset: u32,
        value: V,
    ) -> Result<(), BuildError> {
        let r = if matches!(op, Op::Ld64 | Op::St64) { self.vpair(reg)? } else { self.vreg(reg)? };
        let (a, b) = (self.sreg(base)?, self.vreg(index)?);
        let c = if op == Op::AtomAdd { self.vreg(value)? } else { 0 };
        self.emit(Inst::new(op, r, a, b, c, offset)).map(drop)
    }

    pub(crate) fn try_simple(&mut self, op: Op) -> Result<(), BuildError> {
        debug_assert!(matches!(op, Op::Nop | Op::Exit));
        self.emit(Inst::new(op, 0, 0, 0, 0, 0)).map(drop)
    }

    fn push_open(&mut self, is_loop: bool, pc: u32) -> Result<(), BuildError> {
        self.open.push(Open { is_loop, pc, else_pc: None, breaks: Vec::new() });
        if self.open.len() > isa::MAX_NESTING {
            return Err(BuildError::TooDeep { pc });
        }
        Ok(())
    }

    pub(crate) fn try_if(&mut self, cond: V) -> Result<(), BuildError> {
        let a = self.vreg(cond)?;
        let pc = self.emit(Inst::new(Op::If, 0, a, 0, 0, 0))?;
        self.push_open(false, pc)
    }

    pub(crate) fn try_else(&mut self) -> Result<(), BuildError> {
        let pc = self.pc();
        match self.open.last() {
            None => return Err(BuildError::ElseWithoutIf { pc }),
            Some(o) if o.is_loop => {
                return Err(BuildError::Mismatched { pc, closer: "else", opener: "loop", opener_pc: o.pc });
            }
            Some(o) if o.else_pc.is_some() => return Err(BuildError::SecondElse { pc, if_pc: o.pc }),
            Some(_) => {}
        }
        self.emit(Inst::new(Op::Else, 0, 0, 0, 0, 0))?;
        let o = self.open.last_mut().expect("checked above");
        o.else_pc = Some(pc);
        let if_pc = o.pc;
        self.patch_imm(if_pc, pc);
        Ok(())
    }

    pub(crate) fn try_endif(&mut self) -> Result<(), BuildError> {
        let pc = self.pc();
        match self.open.last() {
            None => return Err(BuildError::EndIfWithoutIf { pc }),
            Some(o) if o.is_loop => {
                return Err(BuildError::Mismatched { pc, closer: "endif", opener: "loop", opener_pc: o.pc });
            }
            Some(_) => {}
        }
        self.emit(Inst::new(Op::EndIf, 0, 0, 0, 0, 0))?;
        let o = self.open.pop().expect("checked above");
        match o.else_pc {
            Some(e) => self.patch_imm(e, pc),
            None => self.patch_imm(o.pc, pc),
        }
        Ok(())
    }

    pub(crate) fn try_loop(&mut self) -> Result<(), BuildError> {
        let pc = self.emit(Inst::new(Op::Loop, 0, 0, 0, 0, 0))?;
        self.push_open(true, pc)
    }

    pub(crate) fn try_break(&mut self, cond: V) -> Result<(), BuildError> {
        let pc = self.pc();
        let a = self.vreg(cond)?;
        if !self.open.iter().any(|o| o.is_loop) {
            return Err(BuildError::BreakOutsideLoop { pc });
        }
        self.emit(Inst::new(Op::Break, 0, a, 0, 0, 0))?;
        let l = self.open.iter_mut().rev().find(|o| o.is_loop).expect("checked above");
        l.breaks.push(pc);
        Ok(())
    }

    pub(crate) fn try_endloop(&mut self) -> Result<(), BuildError> {
        let pc = self.pc();
        let start = match self.open.last() {
            None => return Err(BuildError::EndLoopWithoutLoop { pc }),
            Some(o) if !o.is_loop => {
                return Err(BuildError::Mismatched { pc, closer: "endloop", opener: "if", opener_pc: o.pc });
            }
            Some(o) => o.pc,
        };
        self.emit(Inst::new(Op::EndLoop, 0, 0, 0, 0, start))?;
        let o = self.open.pop().expect("checked above");
        self.patch_imm(o.pc, pc);
        for b in o.breaks {
            self.patch_imm(b, pc);
        }
        Ok(())
    }

    // ---- the public API, by family ----

    /// Any binary ALU op ([`Form::Binary`]): `v[d] = v[a] OP b`.
    ///
    /// # Panics
    /// In debug builds, if `op` is not a binary op.
    pub fn binary(&mut self, op: Op, d: V, a: V, b: Operand) -> &mut Self {
        let r = self.try_binary(op, d, a, b);
        self.record(r)
    }

    /// Any unary op ([`Form::Unary`]): `v[d] = OP a`.
    ///
    /// # Panics
    /// In debug builds, if `op` is not a unary op.
    pub fn unary(&mut self, op: Op, d: V, a: Operand) -> &mut Self {
        let r = self.try_unary(op, d, a);
        self.record(r)
    }

    binary_methods! {
        /// Add (wrapping).
        add, add_imm, Add, impl Into<Imm>;
        /// Subtract (wrapping).
        sub, sub_imm, Sub, impl Into<Imm>;
        /// Multiply, low 32 bits.
        mul, mul_imm, Mul, impl Into<Imm>;
        /// Multiply, high 32 bits (unsigned).
        mulhi_u, mulhi_u_imm, MulHiU, impl Into<Imm>;
        /// Unsigned divide (`x / 0 = u32::MAX`).
        div_u, div_u_imm, DivU, impl Into<Imm>;
        /// Signed divide (`x / 0 = -1`, `i32::MIN / -1 = i32::MIN`).
        div_s, div_s_imm, DivS, impl Into<Imm>;
        /// Unsigned remainder (`x % 0 = x`).
        rem_u, rem_u_imm, RemU, impl Into<Imm>;
        /// Signed remainder (`x % 0 = x`, `i32::MIN % -1 = 0`).
        rem_s, rem_s_imm, RemS, impl Into<Imm>;
        /// Bitwise and.
        and, and_imm, And, impl Into<Imm>;
        /// Bitwise or.
        or, or_imm, Or, impl Into<Imm>;
        /// Bitwise xor.
        xor, xor_imm, Xor, impl Into<Imm>;
        /// Shift left by the low 5 bits of the amount.
        shl, shl_imm, Shl, impl Into<Imm>;
        /// Logical shift right by the low 5 bits of the amount.
        shr, shr_imm, Shr, impl Into<Imm>;
        /// Arithmetic shift right by the low 5 bits of the amount.
        sra, sra_imm, Sra, impl Into<Imm>;
        /// Unsigned minimum.
        min_u, min_u_imm, MinU, impl Into<Imm>;
        /// Unsigned maximum.
        max_u, max_u_imm, MaxU, impl Into<Imm>;
        /// Signed minimum.
        min_s, min_s_imm, MinS, impl Into<Imm>;
        /// Signed maximum.
        max_s, max_s_imm, MaxS, impl Into<Imm>;
        /// f32 add.
        fadd, fadd_imm, FAdd, f32;
        /// f32 subtract.
        fsub, fsub_imm, FSub, f32;
        /// f32 multiply.
        fmul, fmul_imm, FMul, f32;
        /// f32 divide.
        fdiv, fdiv_imm, FDiv, f32;
        /// f32 minimum (the non-NaN operand).
        fmin, fmin_imm, FMin, f32;
        /// f32 maximum (the non-NaN operand).
        fmax, fmax_imm, FMax, f32;
        /// Equal: 1 or 0.
        cmp_eq, cmp_eq_imm, CmpEq, impl Into<Imm>;
        /// Not equal: 1 or 0.
        cmp_ne, cmp_ne_imm, CmpNe, impl Into<Imm>;
        /// Unsigned less than: 1 or 0.
        cmp_lt_u, cmp_lt_u_imm, CmpLtU, impl Into<Imm>;
        /// Unsigned less or equal: 1 or 0.
        cmp_le_u, cmp_le_u_imm, CmpLeU, impl Into<Imm>;
        /// Signed less than: 1 or 0.
        cmp_lt_s, cmp_lt_s_imm, CmpLtS, impl Into<Imm>;
        /// Signed less or equal: 1 or 0.
        cmp_le_s, cmp_le_s_imm, CmpLeS, impl Into<Imm>;
        /// f32 equal: 1 or 0 (0 if either is NaN).
        fcmp_eq, fcmp_eq_imm, FCmpEq, f32;
        /// f32 less than: 1 or 0.
        fcmp_lt, fcmp_lt_imm, FCmpLt, f32;
        /// f32 less or equal: 1 or 0.
        fcmp_le, fcmp_le_imm, FCmpLe, f32;
    }

    unary_methods! {
        /// Move: `v[d] = a`.
        mov, mov_imm, Mov, impl Into<Imm>;
        /// Bitwise not.
        not, not_imm, Not, impl Into<Imm>;
        /// u32 → f32 (rounded to nearest).
        cvt_f32_u32, cvt_f32_u32_imm, CvtF32U32, impl Into<Imm>;
        /// i32 → f32 (rounded to nearest).
        cvt_f32_i32, cvt_f32_i32_imm, CvtF32I32, impl Into<Imm>;
        /// f32 → u32, truncating toward zero, saturating, NaN → 0.
        cvt_u32_f32, cvt_u32_f32_imm, CvtU32F32, f32;
        /// f32 → i32, truncating toward zero, saturating, NaN → 0.
        cvt_i32_f32, cvt_i32_f32_imm, CvtI32F32, f32;
        /// f32 square root.
        fsqrt, fsqrt_imm, FSqrt, f32;
    }

    /// Fused multiply-add: `v[d] = v[a] * v[b] + v[c]`, rounded once.
    pub fn ffma(&mut self, d: V, a: V, b: V, c: V) -> &mut Self {
        let r = self.try_ternary(Op::FFma, d, a, b, c);
        self.record(r)
    }

    /// Select: `v[d] = v[cond] != 0 ? v[t] : v[f]`.
    pub fn sel(&mut self, d: V, cond: V, t: V, f: V) -> &mut Self {
        let r = self.try_ternary(Op::Sel, d, cond, t, f);
        self.record(r)
    }

    /// A builtin value (ids and sizes).
    pub fn builtin(&mut self, d: V, b: Builtin) -> &mut Self {
        let r = self.try_builtin(d, b);
        self.record(r)
    }

    /// `s[d]` = 64-bit argument slot `slot` (at argument-buffer VA + 8 × `slot`).
    pub fn sarg(&mut self, d: S, slot: u32) -> &mut Self {
        let r = self.try_scalar(Op::SArg, d, S(0), slot);
        self.record(r)
    }

    /// `s[d] = imm` (zero-extended).
    pub fn smov(&mut self, d: S, imm: u32) -> &mut Self {
        let r = self.try_scalar(Op::SMov, d, S(0), imm);
        self.record(r)
    }

    /// `s[d] = s[a] + imm` (sign-extended, wrapping).
    pub fn sadd(&mut self, d: S, a: S, imm: i32) -> &mut Self {
        let r = self.try_scalar(Op::SAdd, d, a, imm as u32);
        self.record(r)
    }

    /// `v[d]` = low 32 bits of `s[a]`, in every active lane.
    pub fn vfroms(&mut self, d: V, a: S) -> &mut Self {
        let r = self.try_from_scalar(Op::VFromS, d, a);
        self.record(r)
    }

    /// `v[d]` = high 32 bits of `s[a]`, in every active lane.
    pub fn vfroms_hi(&mut self, d: V, a: S) -> &mut Self {
        let r = self.try_from_scalar(Op::VFromSHi, d, a);
        self.record(r)
    }

    /// `v[d]` = u32 at `s[base] + v[index] + offset`.
    pub fn ld_u32(&mut self, d: V, base: S, index: V, offset: u32) -> &mut Self {
        let r = self.try_memory(Op::Ld32, d, base, index, offset, V(0));
        self.record(r)
    }

    /// Same as [`ProgramBuilder::ld_u32`]: an f32 is 32 bits.
    pub fn ld_f32(&mut self, d: V, base: S, index: V, offset: u32) -> &mut Self {
        self.ld_u32(d, base, index, offset)
    }

    /// `v[d]` (low half) and `v[d+1]` (high half) = u64 at `s[base] + v[index] + offset`.
    pub fn ld_u64(&mut self, d: V, base: S, index: V, offset: u32) -> &mut Self {
        let r = self.try_memory(Op::Ld64, d, base, index, offset, V(0));
        self.record(r)
    }

    /// Stores `v[value]` as u32 at `s[base] + v[index] + offset`.
    pub fn st_u32(&mut self, base: S, index: V, offset: u32, value: V) -> &mut Self {
        let r = self.try_memory(Op::St32, value, base, index, offset, V(0));
        self.record(r)
    }

    /// Same as [`ProgramBuilder::st_u32`].
    pub fn st_f32(&mut self, base: S, index: V, offset: u32, value: V) -> &mut Self {
        self.st_u32(base, index, offset, value)
    }

    /// Stores the pair `v[value]` (low), `v[value+1]` (high) as u64 at
    /// `s[base] + v[index] + offset`.
    pub fn st_u64(&mut self, base: S, index: V, offset: u32, value: V) -> &mut Self {
        let r = self.try_memory(Op::St64, value, base, index, offset, V(0));
        self.record(r)
    }

    /// Atomically adds `v[value]` to the u32 at `s[base] + v[index] + offset`; `v[d]` receives
    /// the old value.
    pub fn atom_add(&mut self, d: V, base: S, index: V, offset: u32, value: V) -> &mut Self {
        let r = self.try_memory(Op::AtomAdd, d, base, index, offset, value);
        self.record(r)
    }

    /// `if v[cond] != 0`: opens a region closed by [`ProgramBuilder::endif`].
    pub fn if_(&mut self, cond: V) -> &mut Self {
        let r = self.try_if(cond);
        self.record(r)
    }

    /// `else` of the innermost open `if`.
    pub fn else_(&mut self) -> &mut Self {
        let r = self.try_else();
        self.record(r)
    }

    /// Closes the innermost open `if`.
    pub fn endif(&mut self) -> &mut Self {
        let r = self.try_endif();
        self.record(r)
    }

    /// Opens a loop closed by [`ProgramBuilder::endloop`]; it repeats while any lane is in it.
    pub fn loop_(&mut self) -> &mut Self {
        let r = self.try_loop();
        self.record(r)
    }

    /// Lanes where `v[cond] != 0` leave the innermost enclosing loop.
    pub fn break_(&mut self, cond: V) -> &mut Self {
        let r = self.try_break(cond);
        self.record(r)
    }

    /// Closes the innermost open loop.
    pub fn endloop(&mut self) -> &mut Self {
        let r = self.try_endloop();
        self.record(r)
    }

    /// The active lanes finish.
    pub fn exit(&mut self) -> &mut Self {
        let r = self.try_simple(Op::Exit);
        self.record(r)
    }

    /// No operation.
    pub fn nop(&mut self) -> &mut Self {
        let r = self.try_simple(Op::Nop);
        self.record(r)
    }
}
