//! Property tests of the assembler, the disassembler and the builder: the assembler never
//! panics and always points inside the text; disassembly assembles back to the same binary.

use abi::isa::{self, Builtin, Form, Op};
use program::examples;
use program::{AsmError, Imm, Operand, ProgramBinary, ProgramBuilder, S, V, assemble, disassemble};
use proptest::prelude::*;

/// Checks an assembler result: an error points at a real line and a column at most one past
/// its end; a success round-trips through the disassembler.
fn check(src: &str) -> Result<(), TestCaseError> {
    match assemble(src) {
        Ok(k) => {
            let text = disassemble(&k);
            prop_assert_eq!(assemble(&text).map_err(|e| e.to_string()), Ok(k.clone()), "{}", text);
            prop_assert_eq!(ProgramBinary::from_bytes(&k.to_bytes()), Ok(k));
        }
        Err(AsmError { line, column, reason }) => {
            let lines: Vec<&str> = src.lines().collect();
            prop_assert!(line >= 1 && line <= lines.len().max(1), "line {} of {}", line, lines.len());
            let len = lines.get(line - 1).map_or(0, |l| l.chars().count());
            prop_assert!(column >= 1 && column <= len + 1, "column {} of {}: {}", column, len, reason);
            prop_assert!(!reason.is_empty());
        }
    }
    Ok(())
}

fn vocabulary() -> Vec<String> {
    let mut v: Vec<String> = Op::ALL.iter().map(|o| o.mnemonic().to_string()).collect();
    v.extend(["ld.f32", "st.f32", "ADD", "frob", "add.", ".u32"].map(String::from));
    v.extend(Builtin::ALL.iter().map(|b| b.name().to_string()));
    v.extend(["%nope", "%", "%group_id"].map(String::from));
    for r in [0u64, 1, 2, 15, 16, 62, 63, 64, 99, 4294967296] {
        v.push(format!("v{r}"));
        v.push(format!("s{r}"));
    }
    v.extend(["v", "s", "v-1", "x3", "v01"].map(String::from));
    v.extend(
        [
            "0",
            "1",
            "-1",
            "16",
            "0x10",
            "0xffffffff",
            "0x100000000",
            "4294967295",
            "4294967296",
            "-2147483648",
            "-2147483649",
            "1.5",
            "-2.0e3",
            "1e39",
            "1e-45",
            "inf",
            "nan",
            "-inf",
            "0x",
            "1e",
            "1.2.3",
            "00",
            "1_000",
            "99999999999999999999999999",
        ]
        .map(String::from),
    );
    v.extend(
        [",", ",", ",", "[", "]", "+", "-", "+", ";", "#", "\n", "\n", " ", "\t", "@", "é", "[s2 + v5 + 16]"]
            .map(String::from),
    );
    v
}

fn soup() -> impl Strategy<Value = String> {
    let vocab = vocabulary();
    proptest::collection::vec(proptest::sample::select(vocab), 0..40).prop_map(|toks| {
        let mut s = String::new();
        for t in toks {
            s.push_str(&t);
            if t != "\n" {
                s.push(' ');
            }
        }
        s
    })
}

/// A line of plausible assembly: a real mnemonic with 0..5 operands from the vocabulary.
fn plausible_line() -> impl Strategy<Value = String> {
    let ops: Vec<&'static str> = Op::ALL.iter().map(|o| o.mnemonic()).collect();
    let operand = prop_oneof![
        (0u32..70).prop_map(|r| format!("v{r}")),
        (0u32..20).prop_map(|r| format!("s{r}")),
        any::<i64>().prop_map(|x| x.to_string()),
        any::<u32>().prop_map(|x| format!("{x:#x}")),
        any::<f32>().prop_map(|x| format!("{x:?}")),
        proptest::sample::select(Builtin::ALL.to_vec()).prop_map(|b| b.name().to_string()),
        (0u32..20, 0u32..70, proptest::option::of(any::<u32>())).prop_map(|(s, v, o)| match o {
            Some(o) => format!("[s{s} + v{v} + {o}]"),
            None => format!("[s{s} + v{v}]"),
        }),
    ];
    (proptest::sample::select(ops), proptest::collection::vec(operand, 0..5))
        .prop_map(|(m, args)| format!("{m} {}", args.join(", ")))
}

/// Mutates a source at character granularity.
fn mutate(src: &str, edits: &[(usize, u8, char)]) -> String {
    let mut cs: Vec<char> = src.chars().collect();
    for &(pos, kind, c) in edits {
        if cs.is_empty() {
            cs.push(c);
            continue;
        }
        let p = pos % cs.len();
        match kind % 3 {
            0 => {
                cs.remove(p);
            }
            1 => cs.insert(p, c),
            _ => cs[p] = c,
        }
    }
    cs.into_iter().collect()
}

// ---- random valid builder programs ----

#[derive(Clone, Debug)]
enum Item {
    Op(u8, u8, u8, u8, u8, u32, bool),
    Open(bool, u8),
    Else,
    Close,
    Break(u8),
}

fn item() -> impl Strategy<Value = Item> {
    let imm = prop_oneof![0u32..20, any::<u32>(), any::<f32>().prop_map(f32::to_bits)];
    prop_oneof![
        8 => (0..Op::ALL.len() as u8, 0u8..64, 0u8..64, 0u8..64, 0u8..64, imm, any::<bool>())
            .prop_map(|(o, d, a, b, c, i, f)| Item::Op(o, d, a, b, c, i, f)),
        1 => (any::<bool>(), 0u8..64).prop_map(|(l, c)| Item::Open(l, c)),
        1 => Just(Item::Else),
        1 => Just(Item::Close),
        1 => (0u8..64).prop_map(Item::Break),
    ]
}

/// Builds a valid program from arbitrary items, skipping structure that would not balance.
fn build(items: &[Item]) -> ProgramBinary {
    let mut b = ProgramBuilder::new();
    let mut open: Vec<(bool, bool)> = Vec::new();
    for it in items {
        match *it {
            Item::Op(o, d, a, x, c, imm, use_imm) => {
                let op = Op::ALL[o as usize];
                let (vd, va, vb, vc) = (V(d), V(a), V(x), V(c));
                let (sd, sa) = (S(d % 16), S(a % 16));
                let src = if use_imm { Operand::Imm(Imm(imm)) } else { Operand::Reg(vb) };
                match op.form() {
                    Form::Binary => {
                        b.binary(op, vd, va, src);
                    }
                    Form::Unary => {
                        b.unary(op, vd, src);
                    }
                    Form::Ternary if op == Op::FFma => {
                        b.ffma(vd, va, vb, vc);
                    }
                    Form::Ternary => {
                        b.sel(vd, va, vb, vc);
                    }
                    Form::Builtin => {
                        b.builtin(vd, Builtin::ALL[imm as usize % Builtin::ALL.len()]);
                    }
                    Form::ScalarArg => {
                        b.sarg(sd, imm);
                    }
                    Form::ScalarImm => {
                        b.smov(sd, imm);
                    }
                    Form::ScalarAdd => {
                        b.sadd(sd, sa, imm as i32);
                    }
                    Form::FromScalar if op == Op::VFromS => {
                        b.vfroms(vd, sa);
                    }
                    Form::FromScalar => {
                        b.vfroms_hi(vd, sa);
                    }
                    Form::Load if op == Op::Ld64 => {
                        b.ld_u64(V(d % 63), sa, vb, imm);
                    }
                    Form::Load => {
                        b.ld_u32(vd, sa, vb, imm);
                    }
                    Form::Store if op == Op::St64 => {
                        b.st_u64(sa, vb, imm, V(d % 63));
                    }
                    Form::Store => {
                        b.st_u32(sa, vb, imm, vd);
                    }
                    Form::Atomic => {
                        b.atom_add(vd, sa, vb, imm, vc);
                    }
                    Form::None if op == Op::Nop => {
                        b.nop();
                    }
                    Form::None if op == Op::Exit => {
                        b.exit();
                    }
                    // Structure comes from the other items.
                    Form::None | Form::Branch | Form::CondBranch => {}
                }
            }
            Item::Open(is_loop, c) if open.len() < isa::MAX_NESTING => {
                if is_loop {
                    b.loop_()
                } else {
                    b.if_(V(c))
                };
                open.push((is_loop, false));
            }
            Item::Else if matches!(open.last(), Some((false, false))) => {
                b.else_();
                open.last_mut().unwrap().1 = true;
            }
            Item::Close if !open.is_empty() => {
                if open.pop().unwrap().0 {
                    b.endloop()
                } else {
                    b.endif()
                };
            }
            Item::Break(c) if open.iter().any(|o| o.0) => {
                b.break_(V(c));
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
    if b.is_empty() {
        b.nop();
    }
    b.build().unwrap_or_else(|e| panic!("{e}"))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn random_strings_never_panic(s in any::<String>()) {
        check(&s)?;
    }

    #[test]
    fn ascii_noise_never_panics(s in "[ -~\t\n]{0,200}") {
        check(&s)?;
    }

    #[test]
    fn token_soup_never_panics(s in soup()) {
        check(&s)?;
    }

    #[test]
    fn plausible_lines_never_panic(lines in proptest::collection::vec(plausible_line(), 1..8)) {
        check(&lines.join("\n"))?;
    }

    #[test]
    fn mutated_examples_never_panic(
        which in 0usize..4,
        edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<char>()), 1..6),
    ) {
        check(&mutate(examples::ALL[which].source, &edits))?;
    }

    #[test]
    fn builder_programs_round_trip(items in proptest::collection::vec(item(), 0..80)) {
        let k = build(&items);
        let text = disassemble(&k);
        prop_assert_eq!(assemble(&text).map_err(|e| e.to_string()), Ok(k.clone()), "{}", text);
        prop_assert_eq!(ProgramBinary::from_bytes(&k.to_bytes()), Ok(k.clone()));
        prop_assert_eq!(ProgramBinary::from_words(k.instructions().to_vec()), Ok(k));
    }
}

#[test]
fn every_mnemonic_and_builtin_is_accepted() {
    for &op in Op::ALL {
        let operands = match op.form() {
            Form::None | Form::Branch => "",
            Form::Binary => " v1, v2, v3",
            Form::Ternary => " v1, v2, v3, v4",
            Form::Unary => " v1, v2",
            Form::Builtin => " v1, %local_index",
            Form::ScalarArg | Form::ScalarImm => " s1, 2",
            Form::ScalarAdd => " s1, s2, -3",
            Form::FromScalar => " v1, s2",
            Form::Load => " v1, [s2 + v3 + 4]",
            Form::Store => " [s2 + v3 + 4], v1",
            Form::Atomic => " v1, [s2 + v3 + 4], v5",
            Form::CondBranch => " v1",
        };
        let line = format!("{}{operands}", op.mnemonic());
        let src = match op {
            Op::Else => "if v1\nelse\nendif".to_string(),
            Op::EndIf => "if v1\nendif".to_string(),
            Op::If => format!("{line}\nendif"),
            Op::Loop => "loop\nendloop".to_string(),
            Op::EndLoop => "loop\nendloop".to_string(),
            Op::Break => format!("loop\n{line}\nendloop"),
            _ => line.clone(),
        };
        let k = assemble(&src).unwrap_or_else(|e| panic!("{src}: {e}"));
        assert!(k.decode().iter().any(|i| i.op == op), "{src}");
        assert_eq!(assemble(&disassemble(&k)).unwrap(), k);
    }
    for b in Builtin::ALL {
        let k = assemble(&format!("builtin v7, {}", b.name())).unwrap();
        assert_eq!(k.decode()[0].imm, b as u32);
    }
}

#[test]
fn disassembly_is_readable() {
    let k = examples::PREFIX_SUM.assemble().unwrap();
    let text = disassemble(&k);
    assert!(text.contains("if v3\n    shl v4, v0, 2\n"), "{text}");
    assert!(text.contains("ld.u32 v5, [s0 + v4]"), "{text}");
    assert!(text.contains("st.u32 [s1 + v4], v5"), "{text}");
    let k = examples::MATMUL.assemble().unwrap();
    let text = disassemble(&k);
    assert!(text.contains("mov v20, 0\n"), "{text}");
    assert!(text.contains("st.u32 [s2 + v30 + 4], v21"), "{text}");
}
