//! The compute ISA, version 1: what a `DISPATCH` runs.
//!
//! A small SIMT instruction set in the manner of real GPU ISAs. A **wave** executes one
//! instruction for all its lanes at once under an **execution mask**; divergent control flow
//! narrows the mask instead of splitting the wave. The device's wave width is a device
//! property (32 by default); programs are written per lane and do not depend on it.
//!
//! ## State
//!
//! | name       | what                                                          |
//! |------------|---------------------------------------------------------------|
//! | `v0..v63`  | vector registers: one 32-bit value per lane (u32, i32 or f32 bits) |
//! | `s0..s15`  | scalar registers: one 64-bit value per wave (addresses, uniforms) |
//! | exec mask  | which lanes execute; narrowed by `IF`/`BREAK`/`EXIT`           |
//!
//! Registers start at 0 at the beginning of every wave.
//!
//! ## Binary format
//!
//! A program binary is a [`ProgramHeader`] (32 bytes) followed by `instructions` 64-bit
//! instruction words, little-endian. An instruction word:
//!
//! | bits   | field | meaning                                                   |
//! |--------|-------|-----------------------------------------------------------|
//! | 0..8   | `op`  | [`Op`]                                                    |
//! | 8..14  | `d`   | destination register (or the stored register for stores)  |
//! | 14..20 | `a`   | first source register                                     |
//! | 20..26 | `b`   | second source register                                    |
//! | 26..32 | `c`   | third source register, or flags: bit 0 = "`b` is `imm`"   |
//! | 32..64 | `imm` | 32-bit immediate: an operand, an offset, a branch target  |
//!
//! ## Instructions
//!
//! Binary ALU ops compute `v[d] = v[a] OP (c & 1 ? imm : v[b])` per active lane. Integer ops
//! wrap. Division follows RISC-V, so it never traps: `x / 0 = u32::MAX` (unsigned) or `-1`
//! (signed), `x % 0 = x`, `i32::MIN / -1 = i32::MIN`, `i32::MIN % -1 = 0`. Shifts use the low 5
//! bits of the amount. Float ops are IEEE-754 binary32 with round-to-nearest-even (Rust's
//! `f32`), `FMIN`/`FMAX` return the non-NaN operand.
//!
//! Memory: the address of lane *i* is `s[a] + v[b][i] + imm` (a 64-bit base, a 32-bit
//! unsigned per-lane offset, a 32-bit unsigned constant offset), like a buffer descriptor and
//! an offset register on real hardware. Accesses must be naturally aligned and inside the
//! process's mappings; otherwise the queue faults with the address, the access and the `pc`.
//! `LD64`/`ST64` use the register pair `v[d]` (low) and `v[d+1]` (high).
//!
//! Control flow is structured, and every branch target is checked when the program is loaded:
//!
//! - `IF a` (imm → its `ELSE` or `ENDIF`): lanes where `v[a] != 0` continue, the others wait
//!   for the `ELSE`. If none continue, the wave jumps to the target.
//! - `ELSE` (imm → its `ENDIF`): the waiting lanes run.
//! - `ENDIF`: the mask from before the `IF` returns (minus lanes that exited).
//! - `LOOP` (imm → its `ENDLOOP`), `ENDLOOP` (imm → its `LOOP`): the body repeats while any
//!   lane is still in the loop.
//! - `BREAK a` (imm → the enclosing `ENDLOOP`): lanes where `v[a] != 0` leave the loop.
//! - `EXIT`: the active lanes finish.
//!
//! Nesting is at most [`MAX_NESTING`] deep. A wave ends when it runs past the last
//! instruction or every lane has exited.
//!
//! Exact rules (what the interpreter does, and what `docs/isa.md` explains with examples):
//!
//! - **Empty mask.** An instruction other than the six structure instructions does nothing
//!   when no lane is active — scalar instructions (`SARG`, `SMOV`, `SADD`) and `EXIT`
//!   included. So a scalar write inside divergent code happens only in waves where some lane
//!   is active there. Vector writes (all of them, `VFROMS` too) change active lanes only.
//! - **Restoring masks.** `ENDIF` (and `ELSE`) restore from the mask saved at the `IF`, minus
//!   lanes that exited and lanes that left an enclosing loop with `BREAK`.
//! - **Jumps.** `IF` jumps to its target when no lane takes it; `ELSE` jumps to its `ENDIF`
//!   when no lane waits for it; a `LOOP` entered with no active lane jumps to its `ENDLOOP`;
//!   `BREAK` jumps to its `ENDLOOP` only when no lane remains in the loop (dropping any inner
//!   `IF` frames). `ENDLOOP`'s field names its `LOOP`; while lanes remain, execution continues
//!   at the instruction after that `LOOP`.
//! - **Addresses** are computed in 64 bits: `s[a] + zero-extend(v[b]) + zero-extend(imm)`,
//!   wrapping at 2^64. `SARG s, k` reads the u64 at `args + 8k` and faults like a load.
//! - **Conversions** f32 → integer truncate toward zero and saturate; NaN becomes 0.
//! - **Encoding.** Every field an instruction's form does not use must be 0
//!   ([`Inst::used_fields`]), so each program has one encoding; [`validate`] refuses others.
//!
//! There are no barriers and no shared memory in version 1: waves and workgroups are
//! independent, so a dispatch can stop between any two instructions and resume exactly.

use core::fmt;
use core::mem::size_of;

/// ISA version.
pub const ISA_VERSION: u32 = 1;
/// `"DBK1"` little-endian.
pub const PROGRAM_MAGIC: u32 = u32::from_le_bytes(*b"DBK1");
/// Vector registers.
pub const VREGS: usize = 64;
/// Scalar registers.
pub const SREGS: usize = 16;
/// Deepest control-flow nesting.
pub const MAX_NESTING: usize = 16;
/// Longest program.
pub const MAX_INSTRUCTIONS: u32 = 1 << 16;
/// Flag in `c`: the second operand is `imm`.
pub const FLAG_IMM: u8 = 1;
/// The bits every float result that is a NaN is written as (docs/isa.md §4.2). A NaN's bits
/// can reach an address or a comparison, so every engine writes the same one.
pub const CANONICAL_NAN: u32 = 0x7fff_ffff;

/// The header of a program binary.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProgramHeader {
    /// [`PROGRAM_MAGIC`].
    pub magic: u32,
    /// [`ISA_VERSION`].
    pub version: u32,
    /// Instruction words that follow.
    pub instructions: u32,
    /// Reserved, 0.
    pub flags: u32,
    /// Reserved, 0.
    pub reserved: [u32; 4],
}

/// Bytes of [`ProgramHeader`].
pub const PROGRAM_HEADER_BYTES: u64 = size_of::<ProgramHeader>() as u64;
const _: () = assert!(PROGRAM_HEADER_BYTES == 32);

impl ProgramHeader {
    /// A header for `instructions` words.
    pub const fn new(instructions: u32) -> Self {
        ProgramHeader { magic: PROGRAM_MAGIC, version: ISA_VERSION, instructions, flags: 0, reserved: [0; 4] }
    }
    /// Encodes to 8 dwords.
    pub fn to_words(&self) -> [u32; 8] {
        let r = self.reserved;
        [self.magic, self.version, self.instructions, self.flags, r[0], r[1], r[2], r[3]]
    }
    /// Decodes and checks 8 dwords.
    pub fn from_words(w: &[u32; 8]) -> Result<Self, ProgramError> {
        let h = ProgramHeader {
            magic: w[0],
            version: w[1],
            instructions: w[2],
            flags: w[3],
            reserved: [w[4], w[5], w[6], w[7]],
        };
        if h.magic != PROGRAM_MAGIC {
            return Err(ProgramError::at(0, ProgramErrorKind::BadMagic(h.magic)));
        }
        if h.version != ISA_VERSION {
            return Err(ProgramError::at(0, ProgramErrorKind::BadVersion(h.version)));
        }
        if h.instructions == 0 || h.instructions > MAX_INSTRUCTIONS {
            return Err(ProgramError::at(0, ProgramErrorKind::BadLength(h.instructions)));
        }
        if h.flags != 0 || h.reserved != [0; 4] {
            return Err(ProgramError::at(0, ProgramErrorKind::Reserved));
        }
        Ok(h)
    }
}

macro_rules! ops {
    ($($(#[$m:meta])* $name:ident = $code:literal, $mn:literal, $form:ident;)*) => {
        /// Opcodes.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum Op { $($(#[$m])* $name = $code,)* }

        impl Op {
            /// Decodes an opcode byte.
            pub const fn from_u8(v: u8) -> Option<Op> {
                match v { $($code => Some(Op::$name),)* _ => None }
            }
            /// The assembler mnemonic.
            pub const fn mnemonic(self) -> &'static str {
                match self { $(Op::$name => $mn,)* }
            }
            /// The operand form.
            pub const fn form(self) -> Form {
                match self { $(Op::$name => Form::$form,)* }
            }
            /// Every opcode.
            pub const ALL: &'static [Op] = &[$(Op::$name,)*];
        }
    };
}

/// How an instruction uses its fields (what the validator checks and the assembler parses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// No operands.
    None,
    /// `v[d] = f(v[a], v[b] | imm)`.
    Binary,
    /// `v[d] = f(v[a], v[b], v[c])`.
    Ternary,
    /// `v[d] = f(v[a] | imm)` (c bit 0: imm).
    Unary,
    /// `v[d] = builtin imm`.
    Builtin,
    /// `s[d] = arg imm` (64-bit argument slot).
    ScalarArg,
    /// `s[d] = imm` (zero-extended).
    ScalarImm,
    /// `s[d] = s[a] + imm` (imm sign-extended).
    ScalarAdd,
    /// `v[d] = half of s[a]` (low or high per opcode).
    FromScalar,
    /// Load `v[d]` from `s[a] + v[b] + imm`.
    Load,
    /// Store `v[d]` to `s[a] + v[b] + imm`.
    Store,
    /// `v[d] = atomic(s[a] + v[b] + imm, v[c])`.
    Atomic,
    /// A branch on `v[a]` to `imm`.
    CondBranch,
    /// A branch to `imm` (structure instruction).
    Branch,
}

ops! {
    /// No operation.
    Nop = 0x00, "nop", None;
    /// Add.
    Add = 0x01, "add", Binary;
    /// Subtract.
    Sub = 0x02, "sub", Binary;
    /// Multiply, low 32 bits.
    Mul = 0x03, "mul", Binary;
    /// Multiply, high 32 bits (unsigned).
    MulHiU = 0x04, "mulhi.u", Binary;
    /// Unsigned divide.
    DivU = 0x05, "div.u", Binary;
    /// Signed divide.
    DivS = 0x06, "div.s", Binary;
    /// Unsigned remainder.
    RemU = 0x07, "rem.u", Binary;
    /// Signed remainder.
    RemS = 0x08, "rem.s", Binary;
    /// Bitwise and.
    And = 0x09, "and", Binary;
    /// Bitwise or.
    Or = 0x0a, "or", Binary;
    /// Bitwise xor.
    Xor = 0x0b, "xor", Binary;
    /// Shift left.
    Shl = 0x0c, "shl", Binary;
    /// Logical shift right.
    Shr = 0x0d, "shr", Binary;
    /// Arithmetic shift right.
    Sra = 0x0e, "sra", Binary;
    /// Unsigned minimum.
    MinU = 0x0f, "min.u", Binary;
    /// Unsigned maximum.
    MaxU = 0x10, "max.u", Binary;
    /// Signed minimum.
    MinS = 0x11, "min.s", Binary;
    /// Signed maximum.
    MaxS = 0x12, "max.s", Binary;
    /// f32 add.
    FAdd = 0x20, "fadd", Binary;
    /// f32 subtract.
    FSub = 0x21, "fsub", Binary;
    /// f32 multiply.
    FMul = 0x22, "fmul", Binary;
    /// f32 divide.
    FDiv = 0x23, "fdiv", Binary;
    /// f32 minimum.
    FMin = 0x24, "fmin", Binary;
    /// f32 maximum.
    FMax = 0x25, "fmax", Binary;
    /// f32 fused multiply-add: `v[a] * v[b] + v[c]`.
    FFma = 0x26, "ffma", Ternary;
    /// Move.
    Mov = 0x30, "mov", Unary;
    /// Bitwise not.
    Not = 0x31, "not", Unary;
    /// u32 → f32.
    CvtF32U32 = 0x32, "cvt.f32.u32", Unary;
    /// i32 → f32.
    CvtF32I32 = 0x33, "cvt.f32.i32", Unary;
    /// f32 → u32 (saturating, NaN → 0).
    CvtU32F32 = 0x34, "cvt.u32.f32", Unary;
    /// f32 → i32 (saturating, NaN → 0).
    CvtI32F32 = 0x35, "cvt.i32.f32", Unary;
    /// f32 square root.
    FSqrt = 0x36, "fsqrt", Unary;
    /// Equal → 1 else 0.
    CmpEq = 0x40, "cmp.eq", Binary;
    /// Not equal.
    CmpNe = 0x41, "cmp.ne", Binary;
    /// Unsigned less than.
    CmpLtU = 0x42, "cmp.lt.u", Binary;
    /// Unsigned less or equal.
    CmpLeU = 0x43, "cmp.le.u", Binary;
    /// Signed less than.
    CmpLtS = 0x44, "cmp.lt.s", Binary;
    /// Signed less or equal.
    CmpLeS = 0x45, "cmp.le.s", Binary;
    /// f32 equal.
    FCmpEq = 0x46, "fcmp.eq", Binary;
    /// f32 less than.
    FCmpLt = 0x47, "fcmp.lt", Binary;
    /// f32 less or equal.
    FCmpLe = 0x48, "fcmp.le", Binary;
    /// Select: `v[a] != 0 ? v[b] : v[c]`.
    Sel = 0x49, "sel", Ternary;
    /// A builtin value ([`Builtin`]).
    Builtin = 0x50, "builtin", Builtin;
    /// Load a 64-bit program argument into a scalar register.
    SArg = 0x51, "sarg", ScalarArg;
    /// Scalar immediate.
    SMov = 0x52, "smov", ScalarImm;
    /// Scalar add immediate.
    SAdd = 0x53, "sadd", ScalarAdd;
    /// Low 32 bits of a scalar into every lane.
    VFromS = 0x54, "vfroms", FromScalar;
    /// High 32 bits of a scalar into every lane.
    VFromSHi = 0x55, "vfroms.hi", FromScalar;
    /// Load 32 bits.
    Ld32 = 0x60, "ld.u32", Load;
    /// Store 32 bits.
    St32 = 0x61, "st.u32", Store;
    /// Load 64 bits into a register pair.
    Ld64 = 0x62, "ld.u64", Load;
    /// Store a register pair.
    St64 = 0x63, "st.u64", Store;
    /// Atomic add u32; `v[d]` receives the old value.
    AtomAdd = 0x64, "atom.add.u32", Atomic;
    /// Structured if.
    If = 0x70, "if", CondBranch;
    /// Structured else.
    Else = 0x71, "else", Branch;
    /// End of if.
    EndIf = 0x72, "endif", None;
    /// Loop start.
    Loop = 0x73, "loop", Branch;
    /// Conditional loop exit.
    Break = 0x74, "break", CondBranch;
    /// Loop end.
    EndLoop = 0x75, "endloop", Branch;
    /// Active lanes finish.
    Exit = 0x76, "exit", None;
}

/// Builtin values (`builtin vD, name`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Builtin {
    /// Workgroup id x.
    GroupIdX = 0,
    /// Workgroup id y.
    GroupIdY = 1,
    /// Workgroup id z.
    GroupIdZ = 2,
    /// Local id x.
    LocalIdX = 3,
    /// Local id y.
    LocalIdY = 4,
    /// Local id z.
    LocalIdZ = 5,
    /// Workgroup size x.
    GroupSizeX = 6,
    /// Workgroup size y.
    GroupSizeY = 7,
    /// Workgroup size z.
    GroupSizeZ = 8,
    /// Grid size x (workgroups).
    GridSizeX = 9,
    /// Grid size y.
    GridSizeY = 10,
    /// Grid size z.
    GridSizeZ = 11,
    /// Global id x: `group_id.x * group_size.x + local_id.x`.
    GlobalIdX = 12,
    /// Flat local index: `local.x + size.x * (local.y + size.y * local.z)`.
    LocalIndex = 13,
}

impl Builtin {
    /// Every builtin, in code order.
    pub const ALL: [Builtin; 14] = [
        Builtin::GroupIdX,
        Builtin::GroupIdY,
        Builtin::GroupIdZ,
        Builtin::LocalIdX,
        Builtin::LocalIdY,
        Builtin::LocalIdZ,
        Builtin::GroupSizeX,
        Builtin::GroupSizeY,
        Builtin::GroupSizeZ,
        Builtin::GridSizeX,
        Builtin::GridSizeY,
        Builtin::GridSizeZ,
        Builtin::GlobalIdX,
        Builtin::LocalIndex,
    ];
    /// Decodes a builtin code.
    pub fn from_u32(v: u32) -> Option<Builtin> {
        Builtin::ALL.get(v as usize).copied()
    }
    /// Assembler name (`%group_id.x`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Builtin::GroupIdX => "%group_id.x",
            Builtin::GroupIdY => "%group_id.y",
            Builtin::GroupIdZ => "%group_id.z",
            Builtin::LocalIdX => "%local_id.x",
            Builtin::LocalIdY => "%local_id.y",
            Builtin::LocalIdZ => "%local_id.z",
            Builtin::GroupSizeX => "%group_size.x",
            Builtin::GroupSizeY => "%group_size.y",
            Builtin::GroupSizeZ => "%group_size.z",
            Builtin::GridSizeX => "%grid_size.x",
            Builtin::GridSizeY => "%grid_size.y",
            Builtin::GridSizeZ => "%grid_size.z",
            Builtin::GlobalIdX => "%global_id.x",
            Builtin::LocalIndex => "%local_index",
        }
    }
}

/// One decoded instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Inst {
    /// Opcode.
    pub op: Op,
    /// Destination.
    pub d: u8,
    /// Source a.
    pub a: u8,
    /// Source b.
    pub b: u8,
    /// Source c or flags.
    pub c: u8,
    /// Immediate.
    pub imm: u32,
}

impl Inst {
    /// An instruction with all fields.
    pub const fn new(op: Op, d: u8, a: u8, b: u8, c: u8, imm: u32) -> Inst {
        Inst { op, d, a, b, c, imm }
    }
    /// Whether the second operand of a binary or unary form is the immediate.
    pub const fn uses_imm(&self) -> bool {
        self.c == FLAG_IMM
    }
    /// Encodes to a 64-bit word.
    pub const fn encode(&self) -> u64 {
        (self.op as u64)
            | ((self.d as u64 & 63) << 8)
            | ((self.a as u64 & 63) << 14)
            | ((self.b as u64 & 63) << 20)
            | ((self.c as u64 & 63) << 26)
            | ((self.imm as u64) << 32)
    }
    /// Which of `d`, `a`, `b`, `c`, `imm` this instruction's form reads (for binary and unary
    /// forms, `c` is the immediate flag: with it set, `imm` replaces `b` or `a`).
    pub const fn used_fields(&self) -> [bool; 5] {
        let with_imm = self.c == FLAG_IMM;
        match self.op.form() {
            Form::None => [false, false, false, false, false],
            Form::Branch => [false, false, false, false, true],
            Form::CondBranch => [false, true, false, false, true],
            Form::Binary if with_imm => [true, true, false, true, true],
            Form::Binary => [true, true, true, false, false],
            Form::Unary if with_imm => [true, false, false, true, true],
            Form::Unary => [true, true, false, false, false],
            Form::Ternary => [true, true, true, true, false],
            Form::Builtin | Form::ScalarArg | Form::ScalarImm => [true, false, false, false, true],
            Form::ScalarAdd => [true, true, false, false, true],
            Form::FromScalar => [true, true, false, false, false],
            Form::Load | Form::Store => [true, true, true, false, true],
            Form::Atomic => [true, true, true, true, true],
        }
    }

    /// The same instruction with every unused field zeroed (the one encoding [`validate`]
    /// accepts). A `c` other than 0 or [`FLAG_IMM`] on a binary or unary form counts as 0.
    pub const fn canonical(mut self) -> Inst {
        if matches!(self.op.form(), Form::Binary | Form::Unary) && self.c != FLAG_IMM {
            self.c = 0;
        }
        let [d, a, b, c, imm] = self.used_fields();
        if !d {
            self.d = 0;
        }
        if !a {
            self.a = 0;
        }
        if !b {
            self.b = 0;
        }
        if !c {
            self.c = 0;
        }
        if !imm {
            self.imm = 0;
        }
        self
    }

    /// Decodes a 64-bit word (the opcode must be known; fields are not range-checked here:
    /// see [`validate`]).
    pub fn decode(w: u64, pc: u32) -> Result<Inst, ProgramError> {
        let op = Op::from_u8(w as u8).ok_or(ProgramError::at(pc, ProgramErrorKind::UnknownOpcode(w as u8)))?;
        Ok(Inst {
            op,
            d: ((w >> 8) & 63) as u8,
            a: ((w >> 14) & 63) as u8,
            b: ((w >> 20) & 63) as u8,
            c: ((w >> 26) & 63) as u8,
            imm: (w >> 32) as u32,
        })
    }
}

/// Why a program binary is refused.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgramErrorKind {
    /// Wrong magic.
    BadMagic(u32),
    /// Wrong ISA version.
    BadVersion(u32),
    /// Zero or too many instructions.
    BadLength(u32),
    /// Reserved header fields set.
    Reserved,
    /// Unknown opcode byte.
    UnknownOpcode(u8),
    /// A register index out of range (field name, index).
    BadRegister(#[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))] crate::StaticStr, u8),
    /// A builtin code out of range.
    BadBuiltin(u32),
    /// A branch target outside the program or not its matching instruction.
    BadTarget(u32),
    /// Unbalanced structure (an `ENDIF` without `IF`, an unterminated `LOOP`, ...).
    Unbalanced(#[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))] crate::StaticStr),
    /// Nesting deeper than [`MAX_NESTING`].
    TooDeep,
    /// A field the instruction's form does not use is not 0 (field name, value).
    UnusedField(#[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))] crate::StaticStr, u32),
}

/// A refused program, with the instruction index.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProgramError {
    /// Instruction index (0 for header errors).
    pub pc: u32,
    /// What is wrong.
    pub kind: ProgramErrorKind,
}

impl ProgramError {
    /// An error at `pc`.
    pub const fn at(pc: u32, kind: ProgramErrorKind) -> Self {
        ProgramError { pc, kind }
    }
}

impl fmt::Display for ProgramError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "program instruction {}: ", self.pc)?;
        match self.kind {
            ProgramErrorKind::BadMagic(m) => write!(f, "header magic {m:#010x}, expected \"DBK1\""),
            ProgramErrorKind::BadVersion(v) => write!(f, "ISA version {v}, expected {ISA_VERSION}"),
            ProgramErrorKind::BadLength(n) => write!(f, "{n} instructions, expected 1 to {MAX_INSTRUCTIONS}"),
            ProgramErrorKind::Reserved => f.write_str("reserved header fields are not 0"),
            ProgramErrorKind::UnknownOpcode(o) => write!(f, "unknown opcode {o:#04x}"),
            ProgramErrorKind::BadRegister(field, r) => write!(f, "register field `{field}` = {r} is out of range"),
            ProgramErrorKind::BadBuiltin(b) => write!(f, "unknown builtin {b}"),
            ProgramErrorKind::BadTarget(t) => {
                write!(f, "branch target {t} is outside the program or not the matching instruction")
            }
            ProgramErrorKind::Unbalanced(what) => write!(f, "unbalanced control flow: {what}"),
            ProgramErrorKind::TooDeep => write!(f, "control flow nested deeper than {MAX_NESTING}"),
            ProgramErrorKind::UnusedField(field, v) => {
                write!(f, "field `{field}` = {v} is unused by this instruction and must be 0")
            }
        }
    }
}

impl std::error::Error for ProgramError {}

/// Decodes and validates a whole program: opcodes, register ranges, builtins, and the
/// structure of every branch (each target is exactly its matching instruction; nesting is
/// balanced and at most [`MAX_NESTING`] deep). A program that passes can be executed without
/// any further check on its control flow.
pub fn validate(words: &[u64]) -> Result<Vec<Inst>, ProgramError> {
    let n = words.len() as u32;
    if n == 0 || n > MAX_INSTRUCTIONS {
        return Err(ProgramError::at(0, ProgramErrorKind::BadLength(n)));
    }
    /// An open `IF` or `LOOP`.
    struct Open {
        op: Op,
        start: u32,
        target: u32,
        else_at: Option<(u32, u32)>,
        breaks: Vec<(u32, u32)>,
    }
    let mut out = Vec::with_capacity(words.len());
    let mut open: Vec<Open> = Vec::new();
    for (pc, &w) in words.iter().enumerate() {
        let pc = pc as u32;
        let i = Inst::decode(w, pc)?;
        check_fields(&i, pc)?;
        let err = |kind| ProgramError::at(pc, kind);
        match i.op {
            Op::If | Op::Loop => {
                open.push(Open { op: i.op, start: pc, target: i.imm, else_at: None, breaks: Vec::new() });
                if open.len() > MAX_NESTING {
                    return Err(err(ProgramErrorKind::TooDeep));
                }
            }
            Op::Else => match open.last_mut() {
                Some(o) if o.op == Op::If && o.else_at.is_none() => o.else_at = Some((pc, i.imm)),
                _ => return Err(err(ProgramErrorKind::Unbalanced("ELSE without IF"))),
            },
            Op::EndIf => match open.pop() {
                Some(o) if o.op == Op::If => {
                    // IF jumps to its own ELSE, or to this ENDIF; ELSE jumps to this ENDIF.
                    let want = o.else_at.map_or(pc, |(e, _)| e);
                    if o.target != want {
                        return Err(ProgramError::at(o.start, ProgramErrorKind::BadTarget(o.target)));
                    }
                    if let Some((e, t)) = o.else_at.filter(|&(_, t)| t != pc) {
                        return Err(ProgramError::at(e, ProgramErrorKind::BadTarget(t)));
                    }
                }
                _ => return Err(err(ProgramErrorKind::Unbalanced("ENDIF without IF"))),
            },
            Op::Break => match open.iter_mut().rev().find(|o| o.op == Op::Loop) {
                Some(l) => l.breaks.push((pc, i.imm)),
                None => return Err(err(ProgramErrorKind::Unbalanced("BREAK outside a LOOP"))),
            },
            Op::EndLoop => match open.pop() {
                Some(o) if o.op == Op::Loop => {
                    if o.target != pc {
                        return Err(ProgramError::at(o.start, ProgramErrorKind::BadTarget(o.target)));
                    }
                    if i.imm != o.start {
                        return Err(err(ProgramErrorKind::BadTarget(i.imm)));
                    }
                    if let Some(&(b, t)) = o.breaks.iter().find(|&&(_, t)| t != pc) {
                        return Err(ProgramError::at(b, ProgramErrorKind::BadTarget(t)));
                    }
                }
                _ => return Err(err(ProgramErrorKind::Unbalanced("ENDLOOP without LOOP"))),
            },
            _ => {}
        }
        out.push(i);
    }
    if let Some(o) = open.last() {
        let what = if o.op == Op::Loop { "LOOP without ENDLOOP" } else { "IF without ENDIF" };
        return Err(ProgramError::at(o.start, ProgramErrorKind::Unbalanced(what)));
    }
    Ok(out)
}

/// Checks the fields of one instruction against its form: registers in range, builtins
/// known, and every field the form does not use equal to 0 (so each program has exactly one
/// encoding, and later ISA versions can give those bits a meaning).
fn check_fields(i: &Inst, pc: u32) -> Result<(), ProgramError> {
    let reg = |field: &'static str, r: u8, limit: usize| {
        if (r as usize) < limit { Ok(()) } else { Err(ProgramError::at(pc, ProgramErrorKind::BadRegister(field, r))) }
    };
    let zero = |field: &'static str, v: u32| {
        if v == 0 { Ok(()) } else { Err(ProgramError::at(pc, ProgramErrorKind::UnusedField(field, v))) }
    };
    let [d, a, b, c, imm] = i.used_fields();
    for (used, field, v) in
        [(d, "d", i.d as u32), (a, "a", i.a as u32), (b, "b", i.b as u32), (c, "c", i.c as u32), (imm, "imm", i.imm)]
    {
        if !used {
            zero(field, v)?;
        }
    }
    let (vd, sd) = (VREGS, SREGS);
    match i.op.form() {
        Form::None | Form::Branch | Form::Binary | Form::Unary | Form::Ternary | Form::CondBranch => {
            // 6-bit vector register fields cannot exceed v63.
        }
        Form::Builtin => {
            Builtin::from_u32(i.imm).ok_or(ProgramError::at(pc, ProgramErrorKind::BadBuiltin(i.imm)))?;
        }
        Form::ScalarArg | Form::ScalarImm => reg("d", i.d, sd)?,
        Form::ScalarAdd => {
            reg("d", i.d, sd)?;
            reg("a", i.a, sd)?;
        }
        Form::FromScalar => reg("a", i.a, sd)?,
        Form::Load | Form::Store | Form::Atomic => {
            let pair = matches!(i.op, Op::Ld64 | Op::St64) as usize;
            reg("d", i.d, vd - pair)?;
            reg("a", i.a, sd)?;
        }
    }
    Ok(())
}

/// Most threads in one workgroup.
pub const MAX_GROUP_THREADS: u64 = 1024;
/// Most workgroups in one grid.
pub const MAX_GRID_GROUPS: u64 = 1 << 40;

/// Checks a `DISPATCH`'s grid and workgroup dimensions against the limits every device of
/// this ISA honours: each at least 1, at most [`MAX_GROUP_THREADS`] threads per workgroup and
/// [`MAX_GRID_GROUPS`] workgroups. The kernel checks it on the kernel-mode path, the device
/// at dispatch.
pub fn check_dims(grid: [u32; 3], group: [u32; 3]) -> Result<(), &'static str> {
    if grid.contains(&0) {
        return Err("every grid dimension must be at least 1");
    }
    if group.contains(&0) {
        return Err("every workgroup dimension must be at least 1");
    }
    // Checked: three u32 dimensions can multiply past u64 (client input, never a panic).
    let threads = group.iter().try_fold(1u64, |acc, &x| acc.checked_mul(x as u64));
    if threads.is_none_or(|t| t > MAX_GROUP_THREADS) {
        return Err("a workgroup holds at most 1024 threads");
    }
    // Three u32 dimensions can multiply past u64; a grid of 2^40 workgroups is already far
    // beyond anything a dispatch can run.
    let groups = grid.iter().try_fold(1u64, |acc, &x| acc.checked_mul(x as u64));
    if groups.is_none_or(|g| g > MAX_GRID_GROUPS) {
        return Err("a grid holds at most 2^40 workgroups");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn i(op: Op, d: u8, a: u8, b: u8, c: u8, imm: u32) -> u64 {
        Inst::new(op, d, a, b, c, imm).encode()
    }

    #[test]
    fn encode_decode_round_trips_every_opcode() {
        for &op in Op::ALL {
            let inst = Inst::new(op, 5, 6, 7, FLAG_IMM, 0xdead_beef);
            assert_eq!(Inst::decode(inst.encode(), 0).unwrap(), inst);
            assert_eq!(Op::from_u8(op as u8), Some(op));
        }
        assert_eq!(Inst::decode(0xff, 3), Err(ProgramError::at(3, ProgramErrorKind::UnknownOpcode(0xff))));
    }

    #[test]
    fn structured_control_flow_validates() {
        // 0 if v1 -> 2 ; 1 nop ; 2 else -> 4 ; 3 nop ; 4 endif ; 5 loop -> 9 ; 6 break v2 -> 9
        // 7 if v3 -> 8 ; 8 endif ; 9 endloop -> 5
        let p = [
            i(Op::If, 0, 1, 0, 0, 2),
            i(Op::Nop, 0, 0, 0, 0, 0),
            i(Op::Else, 0, 0, 0, 0, 4),
            i(Op::Nop, 0, 0, 0, 0, 0),
            i(Op::EndIf, 0, 0, 0, 0, 0),
            i(Op::Loop, 0, 0, 0, 0, 9),
            i(Op::Break, 0, 2, 0, 0, 9),
            i(Op::If, 0, 3, 0, 0, 8),
            i(Op::EndIf, 0, 0, 0, 0, 0),
            i(Op::EndLoop, 0, 0, 0, 0, 5),
        ];
        assert_eq!(validate(&p).unwrap().len(), 10);
        // IF pointing at the inner ENDIF instead of its own ELSE.
        let mut bad = p;
        bad[0] = i(Op::If, 0, 1, 0, 0, 4);
        assert_eq!(validate(&bad), Err(ProgramError::at(0, ProgramErrorKind::BadTarget(4))));
        // BREAK to the wrong place.
        let mut bad = p;
        bad[6] = i(Op::Break, 0, 2, 0, 0, 8);
        assert_eq!(validate(&bad), Err(ProgramError::at(6, ProgramErrorKind::BadTarget(8))));
        // Branch outside the program.
        let mut bad = p;
        bad[5] = i(Op::Loop, 0, 0, 0, 0, 1000);
        assert_eq!(validate(&bad), Err(ProgramError::at(5, ProgramErrorKind::BadTarget(1000))));
        // Unterminated loop.
        let unterminated = [i(Op::Loop, 0, 0, 0, 0, 1), i(Op::Nop, 0, 0, 0, 0, 0)];
        assert_eq!(
            validate(&unterminated),
            Err(ProgramError::at(0, ProgramErrorKind::Unbalanced("LOOP without ENDLOOP")))
        );
        assert!(matches!(
            validate(&[i(Op::EndIf, 0, 0, 0, 0, 0)]),
            Err(ProgramError { kind: ProgramErrorKind::Unbalanced(_), .. })
        ));
    }

    #[test]
    fn register_and_builtin_fields_are_checked() {
        assert_eq!(
            validate(&[i(Op::SArg, 16, 0, 0, 0, 0)]),
            Err(ProgramError::at(0, ProgramErrorKind::BadRegister("d", 16)))
        );
        assert_eq!(
            validate(&[i(Op::Ld64, 63, 0, 0, 0, 0)]),
            Err(ProgramError::at(0, ProgramErrorKind::BadRegister("d", 63)))
        );
        assert_eq!(
            validate(&[i(Op::Builtin, 0, 0, 0, 0, 99)]),
            Err(ProgramError::at(0, ProgramErrorKind::BadBuiltin(99)))
        );
        // With the immediate flag, `b` is unused and must be 0; without it, `imm` must be 0.
        assert!(validate(&[i(Op::Add, 0, 0, 0, FLAG_IMM, 5)]).is_ok());
        assert_eq!(
            validate(&[i(Op::Add, 0, 0, 63, FLAG_IMM, 5)]),
            Err(ProgramError::at(0, ProgramErrorKind::UnusedField("b", 63)))
        );
        assert_eq!(
            validate(&[i(Op::Add, 0, 0, 1, 0, 5)]),
            Err(ProgramError::at(0, ProgramErrorKind::UnusedField("imm", 5)))
        );
        assert_eq!(
            validate(&[i(Op::Ld32, 0, 0, 0, 2, 0)]),
            Err(ProgramError::at(0, ProgramErrorKind::UnusedField("c", 2)))
        );
        let deep: Vec<u64> = (0..=MAX_NESTING as u32).map(|k| i(Op::Loop, 0, 0, 0, 0, 1000 + k)).collect();
        assert_eq!(validate(&deep), Err(ProgramError::at(MAX_NESTING as u32, ProgramErrorKind::TooDeep)));
    }

    #[test]
    fn header_checks() {
        let h = ProgramHeader::new(3);
        assert_eq!(ProgramHeader::from_words(&h.to_words()), Ok(h));
        let mut w = h.to_words();
        w[0] = 0;
        assert!(matches!(ProgramHeader::from_words(&w), Err(ProgramError { kind: ProgramErrorKind::BadMagic(0), .. })));
        let mut w = h.to_words();
        w[2] = 0;
        assert!(ProgramHeader::from_words(&w).is_err());
    }
}
