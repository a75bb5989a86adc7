//! The disassembler: a binary back to `.dbk` text that [`crate::assemble`] reads back to the
//! same words. Immediates are written so they parse to the same bits (f32 NaNs as raw hex,
//! large integers in hex); branch targets are not written, since they follow from the
//! structure.

use std::fmt::Write as _;

use abi::isa::{Builtin, Form, Inst, Op};

use crate::ProgramBinary;
use crate::asm::float_imm;

/// An integer immediate as text the assembler reads back to the same bits.
pub(crate) fn int_text(x: u32) -> String {
    let s = x as i32;
    if x < 0x1_0000 {
        x.to_string()
    } else if (-0x1_0000..0).contains(&s) {
        s.to_string()
    } else {
        format!("{x:#x}")
    }
}

/// An unsigned immediate (offsets, `smov`) as text.
fn uint_text(x: u32) -> String {
    if x < 0x1_0000 { x.to_string() } else { format!("{x:#x}") }
}

/// An f32 immediate as text the assembler reads back to the same bits (NaNs as raw hex).
pub(crate) fn float_text(bits: u32) -> String {
    let x = f32::from_bits(bits);
    if x.is_nan() {
        format!("{bits:#x}")
    } else if x.is_infinite() {
        if x > 0.0 { "inf".into() } else { "-inf".into() }
    } else {
        // `{:?}` is the shortest text that parses back to the same f32, always with a `.` or
        // an exponent.
        format!("{x:?}")
    }
}

fn operand_text(i: &Inst, reg: u8) -> String {
    if i.uses_imm() { if float_imm(i.op) { float_text(i.imm) } else { int_text(i.imm) } } else { format!("v{reg}") }
}

fn mem_text(i: &Inst) -> String {
    if i.imm == 0 { format!("[s{} + v{}]", i.a, i.b) } else { format!("[s{} + v{} + {}]", i.a, i.b, uint_text(i.imm)) }
}

/// One instruction as assembler text (no branch targets: they follow from the structure).
pub(crate) fn inst_text(i: &Inst) -> String {
    let m = i.op.mnemonic();
    match i.op.form() {
        Form::None | Form::Branch => m.to_string(),
        Form::Binary => format!("{m} v{}, v{}, {}", i.d, i.a, operand_text(i, i.b)),
        Form::Ternary => format!("{m} v{}, v{}, v{}, v{}", i.d, i.a, i.b, i.c),
        Form::Unary => format!("{m} v{}, {}", i.d, operand_text(i, i.a)),
        Form::Builtin => {
            let name = Builtin::from_u32(i.imm).map_or("%invalid", |b| b.name());
            format!("{m} v{}, {name}", i.d)
        }
        Form::ScalarArg => format!("{m} s{}, {}", i.d, i.imm),
        Form::ScalarImm => format!("{m} s{}, {}", i.d, uint_text(i.imm)),
        Form::ScalarAdd => format!("{m} s{}, s{}, {}", i.d, i.a, i.imm as i32),
        Form::FromScalar => format!("{m} v{}, s{}", i.d, i.a),
        Form::Load => format!("{m} v{}, {}", i.d, mem_text(i)),
        Form::Store => format!("{m} {}, v{}", mem_text(i), i.d),
        Form::Atomic => format!("{m} v{}, {}, v{}", i.d, mem_text(i), i.c),
        Form::CondBranch => format!("{m} v{}", i.a),
    }
}

/// A program as `.dbk` text, indented by nesting. [`crate::assemble`] turns it back into the same
/// binary (the assembler does not keep field bits an instruction does not use, and a valid
/// binary built by [`crate::ProgramBuilder`] or [`crate::assemble`] has none).
pub fn disassemble(k: &ProgramBinary) -> String {
    let mut out = String::new();
    let mut depth = 0usize;
    for i in k.decode() {
        if matches!(i.op, Op::Else | Op::EndIf | Op::EndLoop) {
            depth = depth.saturating_sub(1);
        }
        let _ = writeln!(out, "{:indent$}{}", "", inst_text(&i), indent = 4 * depth);
        if matches!(i.op, Op::If | Op::Else | Op::Loop) {
            depth += 1;
        }
    }
    out
}
