//! Fault records as the engine program reports them (`Fault` in `device/common.cuh`: a
//! `FaultKind` as numbers) turned back into [`abi::queue::FaultKind`], the same values the CPU
//! engine produces for the same packets.
//!
//! The device names static texts (a field, a reason) by number; [`STRINGS`] is the list, in
//! the order of `enum Str` in common.cuh, which a test checks entry by entry.

use abi::isa::{ProgramError, ProgramErrorKind};
use abi::packet::{DecodeError, Opcode};
use abi::queue::{Access, FaultKind};

use crate::layout::Fault;

/// The texts of `enum Str` (common.cuh), by number.
pub const STRINGS: &[&str] = &[
    "",
    "d",
    "a",
    "b",
    "c",
    "imm",
    "width",
    "log entry",
    "this queue has no fence log",
    "the queue's fence log holds no entry",
    "ELSE without IF",
    "ENDIF without IF",
    "BREAK outside a LOOP",
    "ENDLOOP without LOOP",
    "LOOP without ENDLOOP",
    "IF without ENDIF",
    "every grid dimension must be at least 1",
    "every workgroup dimension must be at least 1",
    "a workgroup holds at most 1024 threads",
    "a grid holds at most 2^40 workgroups",
    "only compute engines run kernels",
    "control-flow stack does not match the program",
    "truncated",
    "save area out of bounds",
    "state larger than the save area",
    "bad magic or version",
    "saved with another wave width",
    "next group beyond the grid",
    "wave outside the grid",
    "wave state out of range",
    "control-flow stack too deep",
    "control-flow frame out of range",
    "unknown control-flow frame",
    "bad wave flag",
    "vmid does not exist",
    "an indirect buffer may not contain another",
    "vmid must be 0 on a user queue",
];

/// A text by number (an unknown number, which only a broken device could send, reads as
/// "(unknown)").
fn text(n: u32) -> &'static str {
    STRINGS.get(n as usize).copied().unwrap_or("(unknown)")
}

fn access(n: u32) -> Access {
    if n == 0 { Access::Read } else { Access::Write }
}

fn opcode_name(n: u32) -> &'static str {
    Opcode::from_u8(n as u8).map_or("(unknown)", Opcode::name)
}

/// The `FaultKind` a device fault record stands for. A record that names no variant this
/// crate knows (a broken device) becomes a `BadField` saying so, never a panic.
pub fn decode(f: &Fault) -> FaultKind {
    let unknown = FaultKind::BadField { field: "device fault record", why: "names a fault this host does not know" };
    match f.kind {
        1 => FaultKind::BadPacket(match f.sub {
            1 => DecodeError::Truncated { need: f.a as usize, have: f.b as usize },
            2 => DecodeError::BadVersion { header: f.a as u32, version: f.b as u32 },
            3 => DecodeError::ReservedFlags { header: f.a as u32, flags: f.b as u32 },
            4 => DecodeError::UnknownOpcode { opcode: f.a as u8 },
            5 => DecodeError::ZeroLength { opcode: opcode_name(f.s1) },
            6 => DecodeError::BadLength { opcode: opcode_name(f.s1), len: f.a as usize, expected: f.b as usize },
            7 => DecodeError::BadField { opcode: opcode_name(f.s1), field: text(f.s2), value: f.a },
            _ => return unknown,
        }),
        2 => FaultKind::PastRingEnd { offset: f.a, dwords: f.b, ring_bytes: f.c },
        3 => FaultKind::PastWptr { rptr: f.a, dwords: f.b, wptr: f.c },
        4 => FaultKind::OutsideMappings { va: f.a, bytes: f.b, access: access(f.sub) },
        5 => FaultKind::ReadOnly { va: f.a, bytes: f.b },
        6 => FaultKind::Misaligned { va: f.a, align: f.b, access: access(f.sub) },
        7 => FaultKind::WptrBackwards { old: f.a, new: f.b },
        8 => FaultKind::WptrPastRing { rptr: f.a, wptr: f.b, ring_bytes: f.c },
        9 => FaultKind::WptrMisaligned { wptr: f.a },
        10 => FaultKind::BadField { field: text(f.s1), why: text(f.s2) },
        11 => FaultKind::NotAFence { va: f.a },
        12 => FaultKind::ProgressBackwards { completed: f.a, value: f.b },
        13 => FaultKind::ProgressBeyondQueued { value: f.a, last_queued: f.b },
        17 => {
            let kind = match f.sub {
                1 => ProgramErrorKind::BadMagic(f.a as u32),
                2 => ProgramErrorKind::BadVersion(f.a as u32),
                3 => ProgramErrorKind::BadLength(f.a as u32),
                4 => ProgramErrorKind::Reserved,
                5 => ProgramErrorKind::UnknownOpcode(f.a as u8),
                6 => ProgramErrorKind::BadRegister(text(f.s1), f.a as u8),
                7 => ProgramErrorKind::BadBuiltin(f.a as u32),
                8 => ProgramErrorKind::BadTarget(f.a as u32),
                9 => ProgramErrorKind::Unbalanced(text(f.s1)),
                10 => ProgramErrorKind::TooDeep,
                11 => ProgramErrorKind::UnusedField(text(f.s1), f.a as u32),
                _ => return unknown,
            };
            FaultKind::BadProgram(ProgramError { pc: f.pc, kind })
        }
        18 => FaultKind::BadDispatch { why: text(f.s1) },
        19 => {
            let inner = Fault { kind: f.inner, inner: 0, ..*f };
            let fault = match f.inner {
                4..=6 => decode(&inner),
                _ => return unknown,
            };
            FaultKind::ProgramAccess { pc: f.pc, fault: Box::new(fault) }
        }
        20 => FaultKind::BadSaveArea { why: text(f.s1) },
        21 => FaultKind::BadIndirect { why: text(f.s1) },
        22 => FaultKind::BadLogPosition { position: f.a as u32, next: f.b as u32, entries: f.c as u32 },
        _ => unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `S_*` of common.cuh, in order, with the text its comment quotes.
    fn device_strings() -> Vec<(String, String)> {
        let src = include_str!("../device/common.cuh");
        let body = &src[src.find("enum Str : u32 {").expect("enum Str")..];
        let body = &body[..body.find("S_COUNT").expect("S_COUNT")];
        body.lines()
            .filter_map(|l| {
                let l = l.trim();
                let name = l.strip_prefix("S_")?.split([',', ' ', '=']).next()?.to_string();
                let quoted = l.split("//").nth(1)?.trim();
                Some((name, quoted.trim_matches('"').to_string()))
            })
            .collect()
    }

    #[test]
    fn the_device_string_list_matches_ours_entry_by_entry() {
        let dev = device_strings();
        assert_eq!(dev.len(), STRINGS.len(), "common.cuh has {} strings, fault.rs {}", dev.len(), STRINGS.len());
        for (k, ((name, quoted), ours)) in dev.iter().zip(STRINGS).enumerate() {
            assert_eq!(quoted, ours, "string {k} (S_{name})");
        }
    }

    #[test]
    fn records_decode_to_the_cpu_engines_fault_kinds() {
        let f = Fault { kind: 4, sub: 1, a: 0x1000, b: 8, ..Default::default() };
        assert_eq!(decode(&f), FaultKind::OutsideMappings { va: 0x1000, bytes: 8, access: Access::Write });
        let f = Fault { kind: 1, sub: 7, a: 3, s1: 1, s2: 6, ..Default::default() };
        assert_eq!(
            decode(&f),
            FaultKind::BadPacket(DecodeError::BadField { opcode: "WRITE_DATA", field: "width", value: 3 })
        );
        let f = Fault { kind: 19, inner: 6, pc: 7, a: 0x1002, b: 4, sub: 0, ..Default::default() };
        assert_eq!(
            decode(&f),
            FaultKind::ProgramAccess {
                pc: 7,
                fault: Box::new(FaultKind::Misaligned { va: 0x1002, align: 4, access: Access::Read })
            }
        );
        let f = Fault { kind: 17, sub: 9, pc: 3, s1: 12, ..Default::default() };
        assert_eq!(
            decode(&f),
            FaultKind::BadProgram(ProgramError { pc: 3, kind: ProgramErrorKind::Unbalanced("BREAK outside a LOOP") })
        );
        // A record no variant matches is a typed fault, not a panic.
        assert!(matches!(decode(&Fault { kind: 99, ..Default::default() }), FaultKind::BadField { .. }));
        assert!(matches!(decode(&Fault { kind: 19, inner: 1, ..Default::default() }), FaultKind::BadField { .. }));
    }
}
