//! The builder and the binary: branch targets it resolves, the structure errors it reports
//! (first one wins), the length limit, and the byte form's round trip and refusals.

use abi::isa::{self, ProgramError, ProgramErrorKind};
use program::{BuildError, ProgramBinary, ProgramBuilder, S, V};

#[test]
fn targets_are_resolved() {
    let mut b = ProgramBuilder::new();
    b.if_(V(1)).nop().else_().nop().endif();
    b.loop_().break_(V(2)).if_(V(3)).break_(V(4)).endif().endloop().exit();
    let k = b.build().unwrap();
    let i = k.decode();
    assert_eq!(i[0].imm, 2); // if -> else
    assert_eq!(i[2].imm, 4); // else -> endif
    assert_eq!(i[5].imm, 10); // loop -> endloop
    assert_eq!(i[6].imm, 10); // break -> endloop
    assert_eq!(i[7].imm, 9); // inner if -> endif
    assert_eq!(i[8].imm, 10); // break inside if -> endloop
    assert_eq!(i[10].imm, 5); // endloop -> loop
}

#[test]
fn structure_errors_are_reported() {
    let err = |f: &dyn Fn(&mut ProgramBuilder)| {
        let mut b = ProgramBuilder::new();
        f(&mut b);
        b.build().unwrap_err()
    };
    assert_eq!(
        err(&|b| {
            b.else_();
        }),
        BuildError::ElseWithoutIf { pc: 0 }
    );
    assert_eq!(
        err(&|b| {
            b.nop().endif();
        }),
        BuildError::EndIfWithoutIf { pc: 1 }
    );
    assert_eq!(
        err(&|b| {
            b.endloop();
        }),
        BuildError::EndLoopWithoutLoop { pc: 0 }
    );
    assert_eq!(
        err(&|b| {
            b.if_(V(0)).break_(V(0));
        }),
        BuildError::BreakOutsideLoop { pc: 1 }
    );
    assert_eq!(
        err(&|b| {
            b.if_(V(0)).else_().else_();
        }),
        BuildError::SecondElse { pc: 2, if_pc: 0 }
    );
    assert_eq!(
        err(&|b| {
            b.loop_().endif();
        }),
        BuildError::Mismatched { pc: 1, closer: "endif", opener: "loop", opener_pc: 0 }
    );
    assert_eq!(
        err(&|b| {
            b.if_(V(0)).loop_().else_();
        }),
        BuildError::Mismatched { pc: 2, closer: "else", opener: "loop", opener_pc: 1 }
    );
    assert_eq!(
        err(&|b| {
            b.if_(V(0)).endloop();
        }),
        BuildError::Mismatched { pc: 1, closer: "endloop", opener: "if", opener_pc: 0 }
    );
    assert_eq!(
        err(&|b| {
            b.loop_().if_(V(0));
        }),
        BuildError::Unclosed { pc: 1, opener: "if", closer: "endif" }
    );
    assert_eq!(err(&|_| ()), BuildError::Empty);
    assert_eq!(
        err(&|b| {
            b.add(V(64), V(0), V(0));
        }),
        BuildError::BadRegister { pc: 0, register: "v64".into() }
    );
    assert_eq!(
        err(&|b| {
            b.nop().sarg(S(16), 0);
        }),
        BuildError::BadRegister { pc: 1, register: "s16".into() }
    );
    assert_eq!(
        err(&|b| {
            b.ld_u64(V(63), S(0), V(0), 0);
        }),
        BuildError::BadPair { pc: 0, index: 63 }
    );
    let deep = err(&|b| {
        for _ in 0..=isa::MAX_NESTING {
            b.loop_();
        }
    });
    assert_eq!(deep, BuildError::TooDeep { pc: isa::MAX_NESTING as u32 });
    // The first error wins.
    assert_eq!(
        err(&|b| {
            b.endif().else_();
        }),
        BuildError::EndIfWithoutIf { pc: 0 }
    );
    assert!(
        BuildError::Mismatched { pc: 1, closer: "endif", opener: "loop", opener_pc: 0 }
            .to_string()
            .contains("`endif` while the `loop` at instruction 0 is still open")
    );
}

#[test]
fn too_long() {
    let mut b = ProgramBuilder::new();
    for _ in 0..isa::MAX_INSTRUCTIONS {
        b.nop();
    }
    assert!(b.build().is_ok());
    b.nop();
    assert_eq!(b.build(), Err(BuildError::TooLong));
    assert_eq!(b.len(), isa::MAX_INSTRUCTIONS as usize);
}

#[test]
fn bytes_round_trip_and_refusals() {
    let mut b = ProgramBuilder::new();
    b.mov_imm(V(1), 7).add_imm(V(2), V(1), -1).fmul_imm(V(3), V(2), 0.5).exit();
    let k = b.build().unwrap();
    let bytes = k.to_bytes();
    assert_eq!(bytes.len() as u64, k.byte_len());
    assert_eq!(&bytes[..4], b"DBK1");
    assert_eq!(ProgramBinary::from_bytes(&bytes), Ok(k.clone()));
    let len_err = |n| Err(ProgramError::at(0, ProgramErrorKind::BadLength(n)));
    assert_eq!(ProgramBinary::from_bytes(&bytes[..bytes.len() - 1]), len_err(4));
    let mut long = bytes.clone();
    long.push(0);
    assert_eq!(ProgramBinary::from_bytes(&long), len_err(4));
    assert!(matches!(
        ProgramBinary::from_bytes(&bytes[..3]),
        Err(ProgramError { kind: ProgramErrorKind::BadMagic(_), .. })
    ));
    assert!(ProgramBinary::from_bytes(&[]).is_err());
    let mut bad = bytes.clone();
    bad[32] = 0xff; // unknown opcode
    assert_eq!(ProgramBinary::from_bytes(&bad), Err(ProgramError::at(0, ProgramErrorKind::UnknownOpcode(0xff))));
    assert_eq!(ProgramBinary::from_words(k.instructions().to_vec()), Ok(k));
}
