//! The `.dbk` text assembler (the disassembler is [`crate::disassemble`]).
//!
//! One instruction per line; `;` or `#` starts a comment. Mnemonics are exactly
//! [`Op::mnemonic`] (plus `ld.f32`/`st.f32`, aliases of `ld.u32`/`st.u32`). Operands:
//!
//! | form                  | syntax                                  |
//! |-----------------------|-----------------------------------------|
//! | binary                | `add vD, vA, vB` or `add vD, vA, imm`   |
//! | ternary               | `ffma vD, vA, vB, vC`                   |
//! | unary                 | `mov vD, vA` or `mov vD, imm`           |
//! | builtin               | `builtin vD, %global_id.x`              |
//! | scalar                | `sarg sD, slot`, `smov sD, imm`, `sadd sD, sA, imm`, `vfroms vD, sA` |
//! | load / atomic         | `ld.u32 vD, [sA + vB + off]`, `atom.add.u32 vD, [sA + vB + off], vC` |
//! | store                 | `st.u32 [sA + vB + off], vD`            |
//! | control flow          | `if vA`, `else`, `endif`, `loop`, `break vA`, `endloop`, `exit` |
//!
//! Memory operands always name a vector offset register: ISA v1 has no encoding without one,
//! so `[s2]` is refused (keep a register holding 0 for uniform addresses). The constant offset
//! is optional and unsigned.
//!
//! Immediates: decimal, hex (`0x…`, raw bits) or negative integers, and f32 literals (`1.5`,
//! `-2.0e3`, `inf`) stored as their bits. Integer-typed operands take integers only; f32-typed
//! operands (`fadd`…`fcmp.le`, `cvt.u32.f32`, `cvt.i32.f32`, `fsqrt`) take f32 literals or raw
//! hex bits, never a bare decimal integer (so `fmul v1, v2, 2` is an error rather than a
//! denormal); `mov` takes either.

use core::fmt;

use abi::isa::{Builtin, Form, Op};

use crate::lex::{Tok, Token, lex};
use crate::{BuildError, Imm, Operand, ProgramBinary, ProgramBuilder, S, V};

/// An assembler error: where, and why. Displays as `line:column: reason`. Lines and columns
/// count from 1; columns count characters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AsmError {
    /// Line.
    pub line: usize,
    /// Column.
    pub column: usize,
    /// What is wrong.
    pub reason: String,
}

impl fmt::Display for AsmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.line, self.column, self.reason)
    }
}

impl std::error::Error for AsmError {}

/// Assembles `.dbk` text into a validated program binary.
pub fn assemble(src: &str) -> Result<ProgramBinary, AsmError> {
    assemble_with_lines(src).map(|(k, _)| k)
}

/// Like [`assemble`], also returning the source line of every instruction (index = `pc`), so
/// a fault at an instruction can be reported against the source.
pub fn assemble_with_lines(src: &str) -> Result<(ProgramBinary, Vec<usize>), AsmError> {
    let mut b = ProgramBuilder::new();
    // (line, column) of each instruction's mnemonic.
    let mut at: Vec<(usize, usize)> = Vec::new();
    let mut last_line = 1;
    for (n, text) in src.lines().enumerate() {
        let line = n + 1;
        last_line = line;
        let (toks, end) = lex(text, line)?;
        let Some(first) = toks.first() else { continue };
        let mut c = Cursor { toks: &toks, i: 0, line, end };
        let mnemonic_col = first.col;
        let r = parse_line(&mut c, &mut b);
        match r {
            Ok(()) => at.push((line, mnemonic_col)),
            Err(Failure::Asm(e)) => return Err(e),
            Err(Failure::Build(e)) => return Err(locate(e, &at, (line, mnemonic_col))),
        }
    }
    match b.build() {
        Ok(k) => Ok((k, at.into_iter().map(|(l, _)| l).collect())),
        Err(e) => Err(locate(e, &at, (last_line, 1))),
    }
}

/// Turns a builder error into an assembler error at the right line. `here` is the line being
/// assembled (the instruction the builder refused, not yet in `at`).
fn locate(e: BuildError, at: &[(usize, usize)], here: (usize, usize)) -> AsmError {
    let pos = |pc: u32| at.get(pc as usize).copied().unwrap_or(here);
    let line_of = |pc: u32| pos(pc).0;
    let ((line, column), reason) = match e {
        BuildError::BadRegister { pc, register } => {
            (pos(pc), format!("register {register} is out of range (v0..v63, s0..s15)"))
        }
        BuildError::BadPair { pc, index } => {
            (pos(pc), format!("v{index} cannot start a register pair: 64-bit accesses use vN and vN+1"))
        }
        BuildError::ElseWithoutIf { pc } => (pos(pc), "`else` without an open `if`".into()),
        BuildError::SecondElse { pc, if_pc } => {
            (pos(pc), format!("second `else` for the `if` on line {}", line_of(if_pc)))
        }
        BuildError::EndIfWithoutIf { pc } => (pos(pc), "`endif` without an open `if`".into()),
        BuildError::EndLoopWithoutLoop { pc } => (pos(pc), "`endloop` without an open `loop`".into()),
        BuildError::BreakOutsideLoop { pc } => (pos(pc), "`break` outside a `loop`".into()),
        BuildError::Mismatched { pc, closer, opener, opener_pc } => {
            let want = if opener == "loop" { "endloop" } else { "endif" };
            let line = line_of(opener_pc);
            (
                pos(pc),
                format!("`{closer}` while the `{opener}` on line {line} is still open (close it with `{want}` first)"),
            )
        }
        BuildError::Unclosed { pc, opener, closer } => {
            (pos(pc), format!("`{opener}` is never closed: missing `{closer}` before the end of the file"))
        }
        BuildError::TooDeep { pc } => {
            (pos(pc), format!("control flow nested deeper than {} levels", abi::isa::MAX_NESTING))
        }
        BuildError::Empty => ((1, 1), "no instructions: a program needs at least one".into()),
        BuildError::TooLong => (here, format!("more than {} instructions", abi::isa::MAX_INSTRUCTIONS)),
        BuildError::Invalid(k) => (pos(k.pc), format!("invalid program: {k}")),
    };
    AsmError { line, column, reason }
}

// ---- parsing ----

enum Failure {
    Asm(AsmError),
    Build(BuildError),
}

impl From<AsmError> for Failure {
    fn from(e: AsmError) -> Self {
        Failure::Asm(e)
    }
}

impl From<BuildError> for Failure {
    fn from(e: BuildError) -> Self {
        Failure::Build(e)
    }
}

/// How an immediate is typed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ImmKind {
    /// An integer, `-2^31 ..= 2^32 - 1` (negative ones as two's complement).
    Int,
    /// An f32 literal, or raw bits in hex.
    Float,
    /// Either (`mov`).
    Any,
    /// `0 ..= 2^32 - 1`.
    Unsigned,
    /// `-2^31 ..= 2^31 - 1` (sign-extended by the instruction).
    Signed,
}

/// One expected operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Spec {
    V,
    /// The first register of a pair (`ld.u64`/`st.u64`).
    VPair,
    S,
    VOrImm(ImmKind),
    Imm(ImmKind),
    Builtin,
    Mem,
}

impl Spec {
    fn usage(self) -> &'static str {
        match self {
            Spec::V | Spec::VPair => "vN",
            Spec::S => "sN",
            Spec::VOrImm(_) => "vN|imm",
            Spec::Imm(_) => "imm",
            Spec::Builtin => "%builtin",
            Spec::Mem => "[sN + vN + offset]",
        }
    }
}

/// A parsed operand.
#[derive(Clone, Copy, Debug)]
enum Arg {
    V(V),
    S(S),
    Imm(u32),
    Builtin(Builtin),
    Mem(S, V, u32),
}

impl Arg {
    fn v(self) -> V {
        if let Arg::V(v) = self { v } else { V(0) }
    }
    fn s(self) -> S {
        if let Arg::S(s) = self { s } else { S(0) }
    }
    fn imm(self) -> u32 {
        if let Arg::Imm(x) = self { x } else { 0 }
    }
    fn operand(self) -> Operand {
        match self {
            Arg::V(v) => Operand::Reg(v),
            a => Operand::Imm(Imm(a.imm())),
        }
    }
    fn mem(self) -> (S, V, u32) {
        if let Arg::Mem(s, v, o) = self { (s, v, o) } else { (S(0), V(0), 0) }
    }
}

/// Whether the immediate of a binary or unary op is an f32.
pub(crate) fn float_imm(op: Op) -> bool {
    matches!(
        op,
        Op::FAdd
            | Op::FSub
            | Op::FMul
            | Op::FDiv
            | Op::FMin
            | Op::FMax
            | Op::FCmpEq
            | Op::FCmpLt
            | Op::FCmpLe
            | Op::CvtU32F32
            | Op::CvtI32F32
            | Op::FSqrt
    )
}

fn imm_kind(op: Op) -> ImmKind {
    if op == Op::Mov {
        ImmKind::Any
    } else if float_imm(op) {
        ImmKind::Float
    } else {
        ImmKind::Int
    }
}

/// The operands an instruction takes, in source order.
fn specs(op: Op) -> Vec<Spec> {
    match op.form() {
        Form::None | Form::Branch => vec![],
        Form::Binary => vec![Spec::V, Spec::V, Spec::VOrImm(imm_kind(op))],
        Form::Ternary => vec![Spec::V; 4],
        Form::Unary => vec![Spec::V, Spec::VOrImm(imm_kind(op))],
        Form::Builtin => vec![Spec::V, Spec::Builtin],
        Form::ScalarArg | Form::ScalarImm => vec![Spec::S, Spec::Imm(ImmKind::Unsigned)],
        Form::ScalarAdd => vec![Spec::S, Spec::S, Spec::Imm(ImmKind::Signed)],
        Form::FromScalar => vec![Spec::V, Spec::S],
        Form::Load if op == Op::Ld64 => vec![Spec::VPair, Spec::Mem],
        Form::Load => vec![Spec::V, Spec::Mem],
        Form::Store if op == Op::St64 => vec![Spec::Mem, Spec::VPair],
        Form::Store => vec![Spec::Mem, Spec::V],
        Form::Atomic => vec![Spec::V, Spec::Mem, Spec::V],
        Form::CondBranch => vec![Spec::V],
    }
}

fn usage(mnemonic: &str, specs: &[Spec]) -> String {
    let ops: Vec<&str> = specs.iter().map(|s| s.usage()).collect();
    if ops.is_empty() { format!("`{mnemonic}`") } else { format!("`{mnemonic} {}`", ops.join(", ")) }
}

fn lookup(mnemonic: &str) -> Option<Op> {
    match mnemonic {
        "ld.f32" => Some(Op::Ld32),
        "st.f32" => Some(Op::St32),
        m => Op::ALL.iter().copied().find(|op| op.mnemonic() == m),
    }
}

struct Cursor<'t> {
    toks: &'t [Token],
    i: usize,
    line: usize,
    /// Column just past the end of the line.
    end: usize,
}

impl Cursor<'_> {
    fn peek(&self) -> Option<&Token> {
        self.toks.get(self.i)
    }

    fn next(&mut self) -> Option<Token> {
        let t = self.toks.get(self.i).cloned();
        self.i += 1;
        t
    }

    fn err_at(&self, column: usize, reason: impl Into<String>) -> AsmError {
        AsmError { line: self.line, column, reason: reason.into() }
    }

    /// An error at the next token, or at the end of the line.
    fn err_here(&self, reason: impl Into<String>) -> AsmError {
        let col = self.peek().map_or(self.end, |t| t.col);
        self.err_at(col, reason)
    }

    fn expect(&mut self, want: Tok, what: &str) -> Result<usize, AsmError> {
        match self.next() {
            Some(t) if t.tok == want => Ok(t.col),
            Some(t) => Err(self.err_at(t.col, format!("expected {what}, found `{}`", t.show()))),
            None => Err(self.err_at(self.end, format!("expected {what} before the end of the line"))),
        }
    }

    fn word(&mut self, what: &str) -> Result<(String, usize), AsmError> {
        match self.next() {
            Some(Token { tok: Tok::Word(w), col }) => Ok((w, col)),
            Some(t) => Err(self.err_at(t.col, format!("expected {what}, found `{}`", t.show()))),
            None => Err(self.err_at(self.end, format!("expected {what} before the end of the line"))),
        }
    }

    fn vreg(&mut self) -> Result<V, AsmError> {
        let (w, col) = self.word("a vector register (v0..v63)")?;
        match register(&w) {
            Some(('v', n)) if n < abi::isa::VREGS as u64 => Ok(V(n as u8)),
            Some(('v', _)) => Err(self.err_at(col, format!("register `{w}` is out of range (v0..v63)"))),
            Some(('s', _)) => {
                Err(self.err_at(col, format!("expected a vector register (v0..v63), found scalar `{w}`")))
            }
            _ => Err(self.err_at(col, format!("expected a vector register (v0..v63), found `{w}`"))),
        }
    }

    fn sreg(&mut self) -> Result<S, AsmError> {
        let (w, col) = self.word("a scalar register (s0..s15)")?;
        match register(&w) {
            Some(('s', n)) if n < abi::isa::SREGS as u64 => Ok(S(n as u8)),
            Some(('s', _)) => Err(self.err_at(col, format!("register `{w}` is out of range (s0..s15)"))),
            Some(('v', _)) => {
                Err(self.err_at(col, format!("expected a scalar register (s0..s15), found vector `{w}`")))
            }
            _ => Err(self.err_at(col, format!("expected a scalar register (s0..s15), found `{w}`"))),
        }
    }

    fn builtin(&mut self) -> Result<Builtin, AsmError> {
        let (w, col) = self.word("a builtin (%global_id.x, ...)")?;
        Builtin::ALL.iter().copied().find(|b| b.name() == w).ok_or_else(|| {
            let names: Vec<&str> = Builtin::ALL.iter().map(|b| b.name()).collect();
            self.err_at(col, format!("unknown builtin `{w}`; expected one of {}", names.join(", ")))
        })
    }

    /// An immediate: `[-] number`, `[-] inf`, `nan`.
    fn imm(&mut self, kind: ImmKind, mnemonic: &str) -> Result<u32, AsmError> {
        let start = self.peek().map_or(self.end, |t| t.col);
        let neg = matches!(self.peek(), Some(Token { tok: Tok::Minus, .. }));
        if neg {
            self.i += 1;
        }
        let t = match self.next() {
            Some(t) => t,
            None => return Err(self.err_at(self.end, "expected an immediate before the end of the line")),
        };
        let text = match &t.tok {
            Tok::Num(s) => s.clone(),
            Tok::Word(w) if w == "inf" || w == "nan" => w.clone(),
            _ => return Err(self.err_at(t.col, format!("expected an immediate, found `{}`", t.show()))),
        };
        let shown = if neg { format!("-{text}") } else { text.clone() };
        let err = |reason: String| AsmError { line: self.line, column: start, reason };
        let lower = text.to_ascii_lowercase();
        let is_hex = lower.starts_with("0x");
        let is_float = !is_hex && (lower.contains(['.', 'e']) || lower == "inf" || lower == "nan");
        if is_float {
            if matches!(kind, ImmKind::Int | ImmKind::Unsigned | ImmKind::Signed) {
                return Err(err(format!("`{mnemonic}` takes an integer immediate; `{shown}` is a float")));
            }
            let x: f32 = match lower.as_str() {
                "inf" => f32::INFINITY,
                "nan" => f32::NAN,
                _ => text.parse().map_err(|_| err(format!("`{shown}` is not a valid number")))?,
            };
            if x.is_infinite() && lower != "inf" {
                return Err(err(format!("`{shown}` is out of the f32 range")));
            }
            return Ok(if neg { -x } else { x }.to_bits());
        }
        let digits: String = text.chars().filter(|&c| c != '_').collect();
        let magnitude =
            if is_hex { u64::from_str_radix(&digits[2..], 16) } else { digits.parse::<u64>() }.map_err(|e| match e
                .kind()
            {
                std::num::IntErrorKind::PosOverflow => err(format!("immediate `{shown}` is out of range")),
                _ => err(format!("`{shown}` is not a valid number")),
            })?;
        let value: i128 = if neg { -(magnitude as i128) } else { magnitude as i128 };
        let (lo, hi, range): (i128, i128, &str) = match kind {
            ImmKind::Float if !is_hex => {
                return Err(err(format!(
                    "`{mnemonic}` takes an f32 immediate: write `{shown}.0`, or raw bits in hex (`0x3f800000` is 1.0)"
                )));
            }
            ImmKind::Float => (0, u32::MAX as i128, "raw f32 bits 0x0..=0xffffffff"),
            ImmKind::Int | ImmKind::Any => (i32::MIN as i128, u32::MAX as i128, "-2147483648..=4294967295"),
            ImmKind::Unsigned => (0, u32::MAX as i128, "0..=4294967295"),
            ImmKind::Signed => (i32::MIN as i128, i32::MAX as i128, "-2147483648..=2147483647"),
        };
        if value < lo || value > hi {
            return Err(err(format!("immediate `{shown}` is out of range ({range})")));
        }
        Ok(value as u32)
    }

    /// `[sA + vB]` or `[sA + vB + offset]`.
    fn mem(&mut self, mnemonic: &str) -> Result<(S, V, u32), AsmError> {
        let open = self.expect(Tok::LBracket, "a memory operand `[sN + vN + offset]`")?;
        let s = self.sreg()?;
        let no_v = |c: &Self, col: usize| {
            c.err_at(
                col,
                "a memory operand needs a vector offset register: write `[sN + vN]` or `[sN + vN + offset]` \
                 (ISA v1 has no form without one; use a register holding 0 for a uniform address)",
            )
        };
        match self.peek().map(|t| (&t.tok, t.col)) {
            Some((Tok::RBracket, col)) => return Err(no_v(self, col)),
            Some((Tok::Minus, col)) => return Err(self.err_at(col, "memory offsets are unsigned: use `+`")),
            _ => {}
        }
        self.expect(Tok::Plus, "`+` after the scalar base")?;
        match self.peek() {
            Some(Token { tok: Tok::Num(_), col }) => return Err(no_v(self, *col)),
            Some(Token { tok: Tok::Word(w), col }) if register(w).is_none() => return Err(no_v(self, *col)),
            _ => {}
        }
        let v = self.vreg()?;
        let offset = match self.next() {
            Some(Token { tok: Tok::RBracket, .. }) => return Ok((s, v, 0)),
            Some(Token { tok: Tok::Plus, .. }) => self.imm(ImmKind::Unsigned, mnemonic)?,
            Some(Token { tok: Tok::Minus, col }) => {
                return Err(self.err_at(col, "memory offsets are unsigned: a negative offset cannot be encoded"));
            }
            Some(t) => return Err(self.err_at(t.col, format!("expected `+` or `]`, found `{}`", t.show()))),
            None => return Err(self.err_at(self.end, format!("`[` at column {open} is never closed"))),
        };
        match self.next() {
            Some(Token { tok: Tok::RBracket, .. }) => Ok((s, v, offset)),
            Some(t) => Err(self.err_at(t.col, format!("expected `]`, found `{}`", t.show()))),
            None => Err(self.err_at(self.end, format!("`[` at column {open} is never closed"))),
        }
    }

    fn operand(&mut self, spec: Spec, mnemonic: &str) -> Result<Arg, AsmError> {
        Ok(match spec {
            Spec::V | Spec::VPair => {
                let col = self.peek().map_or(self.end, |t| t.col);
                let v = self.vreg()?;
                if spec == Spec::VPair && v.0 as usize >= abi::isa::VREGS - 1 {
                    return Err(
                        self.err_at(col, format!("{v} cannot start a register pair: `{mnemonic}` uses vN and vN+1"))
                    );
                }
                Arg::V(v)
            }
            Spec::S => Arg::S(self.sreg()?),
            Spec::VOrImm(kind) => match self.peek() {
                Some(Token { tok: Tok::Word(w), .. }) if register(w).is_some() => Arg::V(self.vreg()?),
                Some(Token { tok: Tok::Word(w), col }) if w != "inf" && w != "nan" => {
                    return Err(self.err_at(*col, format!("expected a vector register or an immediate, found `{w}`")));
                }
                _ => Arg::Imm(self.imm(kind, mnemonic)?),
            },
            Spec::Imm(kind) => Arg::Imm(self.imm(kind, mnemonic)?),
            Spec::Builtin => Arg::Builtin(self.builtin()?),
            Spec::Mem => {
                let (s, v, o) = self.mem(mnemonic)?;
                Arg::Mem(s, v, o)
            }
        })
    }
}

/// `v12` → `('v', 12)`, `s3` → `('s', 3)`; anything else → `None`. Huge indices saturate (and
/// are then out of range).
fn register(w: &str) -> Option<(char, u64)> {
    let mut cs = w.chars();
    let file = cs.next().filter(|&c| c == 'v' || c == 's')?;
    let digits = cs.as_str();
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    Some((file, digits.parse().unwrap_or(u64::MAX)))
}

fn parse_line(c: &mut Cursor<'_>, b: &mut ProgramBuilder) -> Result<(), Failure> {
    let (mnemonic, col) = match c.next() {
        Some(Token { tok: Tok::Word(w), col }) => (w, col),
        Some(t) => return Err(c.err_at(t.col, format!("expected a mnemonic, found `{}`", t.show())).into()),
        None => return Ok(()),
    };
    let op = match lookup(&mnemonic) {
        Some(op) => op,
        None => {
            let lower = mnemonic.to_ascii_lowercase();
            let hint = if lower != mnemonic && lookup(&lower).is_some() {
                format!(" (mnemonics are lowercase: `{lower}`)")
            } else {
                String::new()
            };
            return Err(c.err_at(col, format!("unknown mnemonic `{mnemonic}`{hint}")).into());
        }
    };
    let specs = specs(op);
    let mut args = Vec::with_capacity(specs.len());
    for (k, &spec) in specs.iter().enumerate() {
        if k > 0 {
            match c.peek() {
                Some(Token { tok: Tok::Comma, .. }) => c.i += 1,
                Some(t) => {
                    let t = t.clone();
                    return Err(c
                        .err_at(t.col, format!("expected `,` before operand {}, found `{}`", k + 1, t.show()))
                        .into());
                }
                None => {
                    return Err(c
                        .err_here(format!(
                            "too few operands: {} takes {}, found {k}",
                            usage(&mnemonic, &specs),
                            specs.len()
                        ))
                        .into());
                }
            }
        } else if c.peek().is_none() {
            return Err(c
                .err_here(format!("missing operands: {} takes {}", usage(&mnemonic, &specs), specs.len()))
                .into());
        }
        args.push(c.operand(spec, &mnemonic)?);
    }
    if let Some(t) = c.peek() {
        let t = t.clone();
        let reason = if t.tok == Tok::Comma || specs.is_empty() {
            let n = specs.len();
            format!("too many operands: {} takes {n}", usage(&mnemonic, &specs))
        } else {
            format!("unexpected `{}` after the operands", t.show())
        };
        return Err(c.err_at(t.col, reason).into());
    }
    emit(b, op, &args).map_err(Failure::Build)
}

fn emit(b: &mut ProgramBuilder, op: Op, a: &[Arg]) -> Result<(), BuildError> {
    let arg = |k: usize| a.get(k).copied().unwrap_or(Arg::Imm(0));
    match op.form() {
        Form::None if op == Op::EndIf => b.try_endif(),
        Form::None => b.try_simple(op),
        Form::Branch => match op {
            Op::Else => b.try_else(),
            Op::Loop => b.try_loop(),
            _ => b.try_endloop(),
        },
        Form::CondBranch if op == Op::If => b.try_if(arg(0).v()),
        Form::CondBranch => b.try_break(arg(0).v()),
        Form::Binary => b.try_binary(op, arg(0).v(), arg(1).v(), arg(2).operand()),
        Form::Ternary => b.try_ternary(op, arg(0).v(), arg(1).v(), arg(2).v(), arg(3).v()),
        Form::Unary => b.try_unary(op, arg(0).v(), arg(1).operand()),
        Form::Builtin => match arg(1) {
            Arg::Builtin(x) => b.try_builtin(arg(0).v(), x),
            _ => b.try_builtin(arg(0).v(), Builtin::GroupIdX),
        },
        Form::ScalarArg | Form::ScalarImm => b.try_scalar(op, arg(0).s(), S(0), arg(1).imm()),
        Form::ScalarAdd => b.try_scalar(op, arg(0).s(), arg(1).s(), arg(2).imm()),
        Form::FromScalar => b.try_from_scalar(op, arg(0).v(), arg(1).s()),
        Form::Load => {
            let (s, v, o) = arg(1).mem();
            b.try_memory(op, arg(0).v(), s, v, o, V(0))
        }
        Form::Store => {
            let (s, v, o) = arg(0).mem();
            b.try_memory(op, arg(1).v(), s, v, o, V(0))
        }
        Form::Atomic => {
            let (s, v, o) = arg(1).mem();
            b.try_memory(op, arg(0).v(), s, v, o, arg(2).v())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disasm::{float_text, int_text};
    use crate::disassemble;
    use abi::isa::Inst;

    fn err(src: &str) -> AsmError {
        assemble(src).expect_err(src)
    }

    fn at(src: &str, line: usize, column: usize, needle: &str) {
        let e = err(src);
        assert_eq!((e.line, e.column), (line, column), "{src:?}: {e}");
        assert!(e.reason.contains(needle), "{src:?}: {e} (wanted {needle:?})");
    }

    #[test]
    fn assembles_every_form() {
        let src = "\
            ; a comment\n\
            # another\n\
            builtin v0, %global_id.x\n\
            sarg s0, 3         ; slot 3\n\
            smov s1, 0x1000\n\
            sadd s2, s1, -8\n\
            vfroms v1, s0\n\
            vfroms.hi v2, s0\n\
            add v3, v0, v1\n\
            add v3, v0, -1\n\
            fmul v4, v3, 1.5\n\
            fadd v4, v4, -2.0e3\n\
            ffma v5, v4, v4, v4\n\
            sel v6, v0, v1, v2\n\
            mov v7, 1.0\n\
            mov v7, 0xffffffff\n\
            not v8, v7\n\
            ld.u32 v9, [s0 + v3 + 16]\n\
            ld.f32 v9, [s0 + v3]\n\
            ld.u64 v10, [s0 + v3 + 0x8]\n\
            st.u32 [s0 + v3], v9\n\
            st.f32 [s0 + v3 + 4], v9\n\
            st.u64 [s0 + v3], v10\n\
            atom.add.u32 v12, [s0 + v3], v1\n\
            if v1\n\
              loop\n\
                break v2\n\
              endloop\n\
            else\n\
              exit\n\
            endif\n\
            nop";
        let k = assemble(src).unwrap();
        assert_eq!(k.len(), 30);
        let i = k.decode();
        assert_eq!(i[1], Inst::new(Op::SArg, 0, 0, 0, 0, 3));
        assert_eq!(i[3], Inst::new(Op::SAdd, 2, 1, 0, 0, -8i32 as u32));
        assert_eq!(i[7], Inst::new(Op::Add, 3, 0, 0, 1, u32::MAX));
        assert_eq!(i[8], Inst::new(Op::FMul, 4, 3, 0, 1, 1.5f32.to_bits()));
        assert_eq!(i[9].imm, (-2000.0f32).to_bits());
        assert_eq!(i[15], Inst::new(Op::Ld32, 9, 0, 3, 0, 16));
        assert_eq!(i[16], Inst::new(Op::Ld32, 9, 0, 3, 0, 0));
        assert_eq!(i[19], Inst::new(Op::St32, 9, 0, 3, 0, 4));
        assert_eq!(i[21], Inst::new(Op::AtomAdd, 12, 0, 3, 1, 0));
        assert_eq!(assemble(&disassemble(&k)).unwrap(), k);
        let (_, lines) = assemble_with_lines(src).unwrap();
        assert_eq!(lines[0], 3);
        assert_eq!(lines.len(), 30);
    }

    #[test]
    fn errors_have_line_column_and_reason() {
        at("nop\n  frob v1, v2", 2, 3, "unknown mnemonic `frob`");
        at("ADD v1, v2, v3", 1, 1, "mnemonics are lowercase: `add`");
        at("add v1, v2", 1, 11, "too few operands: `add vN, vN, vN|imm` takes 3, found 2");
        at("add v1, v2, v3, v4", 1, 15, "too many operands");
        at("exit v1", 1, 6, "too many operands: `exit` takes 0");
        at("add", 1, 4, "missing operands");
        at("add v1 v2, v3", 1, 8, "expected `,` before operand 2");
        at("add v64, v2, v3", 1, 5, "register `v64` is out of range");
        at("add v1, s2, v3", 1, 9, "found scalar `s2`");
        at("sarg v1, 0", 1, 6, "found vector `v1`");
        at("sarg s16, 0", 1, 6, "out of range (s0..s15)");
        at("add v1, v2, 4294967296", 1, 13, "out of range");
        at("add v1, v2, -2147483649", 1, 13, "out of range");
        at("add v1, v2, 99999999999999999999999", 1, 13, "out of range");
        at("sadd s1, s1, 0x80000000", 1, 14, "out of range");
        at("smov s1, -1", 1, 10, "out of range");
        at("add v1, v2, 1.5", 1, 13, "integer immediate");
        at("fadd v1, v2, 2", 1, 14, "write `2.0`");
        at("fadd v1, v2, 1e39", 1, 14, "out of the f32 range");
        at("fadd v1, v2, 1.5.2", 1, 14, "not a valid number");
        at("builtin v1, %warp_id", 1, 13, "unknown builtin `%warp_id`");
        at("ld.u32 v1, [s2]", 1, 15, "needs a vector offset register");
        at("ld.u32 v1, [s2 + 16]", 1, 18, "needs a vector offset register");
        at("ld.u32 v1, [s2 + v3 - 4]", 1, 21, "unsigned");
        at("ld.u32 v1, [s2 + v3 + 4", 1, 24, "never closed");
        at("ld.u64 v63, [s2 + v3]", 1, 8, "register pair");
        at("st.u32 v1, [s2 + v3]", 1, 8, "expected a memory operand");
        at("add v1, v2, v3 @", 1, 16, "unexpected character `@`");
        at("add v1, v2, v3 v4", 1, 16, "unexpected `v4`");
        at("nop\nelse", 2, 1, "`else` without an open `if`");
        at("endif", 1, 1, "`endif` without an open `if`");
        at("  endloop", 1, 3, "`endloop` without an open `loop`");
        at("if v1\n break v1\nendif", 2, 2, "`break` outside a `loop`");
        at("loop\nif v1\nendloop", 3, 1, "`endloop` while the `if` on line 2 is still open");
        at("if v1\nelse\nelse\nendif", 3, 1, "second `else` for the `if` on line 1");
        at("nop\n\nloop ; open\nnop\n", 3, 1, "`loop` is never closed: missing `endloop`");
        at("; only a comment\n", 1, 1, "no instructions");
        at("", 1, 1, "no instructions");
        let deep = "loop\n".repeat(17) + &"endloop\n".repeat(17);
        at(&deep, 17, 1, "nested deeper than 16");
        assert_eq!(err("frob").to_string(), "1:1: unknown mnemonic `frob`");
        let huge = format!("nop\n  {}", "q".repeat(1 << 20));
        let e = err(&huge).to_string();
        assert_eq!(
            e,
            format!(
                "2:3: `{}…` (1048576 characters) is too long: no mnemonic, register, builtin or number is longer than 64",
                "q".repeat(32)
            )
        );
        let e = err(&format!("mov v1, {}", "9".repeat(100))).to_string();
        assert!(e.starts_with("1:9: `99999") && e.contains("(100 characters)"), "{e}");
    }

    #[test]
    fn float_and_hex_immediates() {
        let one = |src: &str| assemble(src).unwrap().decode()[0].imm;
        assert_eq!(one("fadd v1, v2, 0x3f800000"), 1.0f32.to_bits());
        assert_eq!(one("fadd v1, v2, -0.0"), (-0.0f32).to_bits());
        assert_eq!(one("fadd v1, v2, -inf"), f32::NEG_INFINITY.to_bits());
        assert_eq!(one("fmax v1, v2, 1e-45"), 1);
        assert_eq!(one("mov v1, -1.0"), (-1.0f32).to_bits());
        assert_eq!(one("mov v1, -2147483648"), 0x8000_0000);
        assert_eq!(one("shl v1, v2, 0x1F"), 31);
        assert_eq!(one("mov v1, 0xffff_ffff"), u32::MAX);
        assert!(f32::from_bits(one("fsqrt v1, nan")).is_nan());
        for bits in [0u32, 1, 0x8000_0001, 0x7f80_0000, 0xff80_0000, 0x7fc0_0001, 0x3f80_0000, 0x7f7f_ffff] {
            let t = float_text(bits);
            assert_eq!(one(&format!("fadd v1, v2, {t}")), bits, "{t}");
        }
        for x in [0u32, 65535, 65536, u32::MAX, 0x8000_0000, 0xffff_0000, 0xfffe_ffff] {
            assert_eq!(one(&format!("add v1, v2, {}", int_text(x))), x);
        }
    }
}
