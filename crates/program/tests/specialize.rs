//! The specializing compiler on small programs: folded arguments and an unrolled constant
//! trip count, constant branches, loads and stores kept, pointer slots, binding matches and a
//! bound shape's builtins.

use abi::isa::Op;
use program::specialize::{Binding, Dims, Limits, argument_slots, specialize};
use program::{ProgramBinary, assemble, disassemble};

fn count(b: &ProgramBinary, op: Op) -> usize {
    b.decode().iter().filter(|i| i.op == op).count()
}

#[test]
fn folds_arguments_and_unrolls_a_constant_trip_loop() {
    let k = assemble(
        "sarg s0, 0\n sarg s1, 1\n vfroms v1, s1\n mov v2, 0\n mov v3, 0\n loop\n cmp.lt.u v4, v2, v1\n \
         cmp.eq v4, v4, 0\n break v4\n builtin v5, %global_id.x\n add v3, v3, v5\n add v2, v2, 1\n endloop\n \
         builtin v6, %global_id.x\n shl v6, v6, 2\n st.u32 [s0 + v6], v3\n",
    )
    .unwrap();
    let s = specialize(&k, &Binding::new([(1, 4)]), Limits::default()).unwrap();
    assert_eq!(count(&s, Op::Loop), 0, "{}", disassemble(&s));
    assert_eq!(count(&s, Op::Break), 0);
    assert_eq!(count(&s, Op::Add), 4, "one add per iteration: {}", disassemble(&s));
    // Unbound: the loop stays.
    let g = specialize(&k, &Binding::default(), Limits::default()).unwrap();
    assert_eq!(count(&g, Op::Loop), 1);
}

#[test]
fn constant_branches_go() {
    let k = assemble(
        "sarg s0, 0\n sarg s1, 1\n vfroms v1, s1\n builtin v2, %global_id.x\n shl v3, v2, 2\n if v1\n \
         mov v4, 7\n else\n mov v4, 9\n endif\n st.u32 [s0 + v3], v4\n",
    )
    .unwrap();
    let s = specialize(&k, &Binding::new([(1, 0)]), Limits::default()).unwrap();
    assert_eq!(count(&s, Op::If), 0);
    let d = disassemble(&s);
    assert!(d.contains("mov v4, 9"), "{d}");
    assert!(!d.contains("mov v4, 7"), "{d}");
}

#[test]
fn loads_and_stores_always_stay() {
    let k = assemble("sarg s0, 0\n mov v1, 0\n ld.u32 v2, [s0 + v1]\n").unwrap();
    let s = specialize(&k, &Binding::new([(0, 64)]), Limits::default()).unwrap();
    assert_eq!(count(&s, Op::Ld32), 1, "a dead load still faults where the generic one would");
}

#[test]
fn pointer_slots_are_found() {
    let k = assemble("sarg s0, 0\n sarg s1, 2\n vfroms v1, s1\n mov v2, 0\n st.u32 [s0 + v2], v1\n").unwrap();
    assert_eq!(argument_slots(&k), (3, vec![0]));
}

#[test]
fn binding_matches_only_its_values() {
    let d = Dims { grid: [4, 1, 1], group: [64, 1, 1] };
    let b = Binding::new([(2, 5), (0, 1), (2, 6)]);
    assert_eq!(b.pairs(), &[(0, 1), (2, 6)]);
    assert!(b.matches(&[1, 99, 6], d));
    assert!(!b.matches(&[1, 99, 5], d));
    assert!(!b.matches(&[1], d));
    let b = b.with_dims(Some(d));
    assert!(b.matches(&[1, 99, 6], d));
    assert!(!b.matches(&[1, 99, 6], Dims { grid: [5, 1, 1], ..d }));
}

#[test]
fn a_bound_shape_folds_the_builtins_it_decides() {
    let k = assemble(
        "sarg s0, 0\n builtin v1, %grid_size.x\n builtin v2, %group_size.x\n mul v3, v1, v2\n \
         builtin v4, %local_id.y\n add v3, v3, v4\n builtin v5, %global_id.x\n shl v5, v5, 2\n st.u32 [s0 + v5], v3\n",
    )
    .unwrap();
    let d = Dims { grid: [3, 1, 1], group: [64, 1, 1] };
    let s = specialize(&k, &Binding::default().with_dims(Some(d)), Limits::default()).unwrap();
    let text = disassemble(&s);
    assert!(text.contains("mov v3, 192"), "{text}");
    assert_eq!(count(&s, Op::Builtin), 1, "only %global_id.x stays: {text}");
}
