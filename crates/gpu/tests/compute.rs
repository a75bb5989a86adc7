//! The SIMT interpreter driven directly: results, divergence, division by zero, faults, and
//! resumption from the context save area at arbitrary instruction boundaries.

use std::sync::Arc;

use abi::isa::{Builtin, FLAG_IMM, Inst, Op, ProgramHeader};
use abi::queue::{Access, FaultKind};
use gpu::AddressSpace;
use gpu::compute::{CONTEXT_SAVE_BYTES, ComputeStats, Dispatch, Progress};
use proptest::prelude::*;
use shm::Shm;

const KERNEL: u64 = 0x1000_0000;
const ARGS: u64 = 0x2000_0000;
const OUT: u64 = 0x3000_0000;
const OUT_BYTES: u64 = 64 * 1024;

fn op(op: Op, d: u8, a: u8, b: u8, c: u8, imm: u32) -> Inst {
    Inst::new(op, d, a, b, c, imm)
}

struct Rig {
    vm: AddressSpace,
    out: Arc<Shm>,
    args: Arc<Shm>,
}

/// A VM with the kernel at KERNEL, an argument buffer (slot 0 = OUT, slot 1 = n) and OUT.
fn rig(prog: &[Inst], n: u64) -> Rig {
    let mut bytes = Vec::new();
    for w in ProgramHeader::new(prog.len() as u32).to_words() {
        bytes.extend_from_slice(&w.to_le_bytes());
    }
    for i in prog {
        bytes.extend_from_slice(&i.encode().to_le_bytes());
    }
    let k = Shm::new("k", bytes.len().max(4096)).unwrap();
    k.write(0, &bytes).unwrap();
    let args = Shm::new("args", 4096).unwrap();
    args.write_u64(0, OUT).unwrap();
    args.write_u64(8, n).unwrap();
    let out = Shm::new("out", OUT_BYTES as usize).unwrap();
    let mut vm = AddressSpace::default();
    vm.map(KERNEL, k.len() as u64, k, 0, false).unwrap();
    vm.map(ARGS, 4096, args.clone(), 0, false).unwrap();
    vm.map(OUT, OUT_BYTES, out.clone(), 0, true).unwrap();
    Rig { vm, out, args }
}

fn out_u32s(r: &Rig, n: usize) -> Vec<u32> {
    (0..n).map(|i| r.out.read_u32(i as u64 * 4).unwrap()).collect()
}

/// `out[gid] = f(gid)` for gid < n, where the body computes v2 from v1 = gid.
fn store_kernel(body: &[Inst]) -> Vec<Inst> {
    let mut p = vec![
        op(Op::SArg, 0, 0, 0, 0, 0),                            // s0 = out
        op(Op::SArg, 1, 0, 0, 0, 1),                            // s1 = n
        op(Op::Builtin, 1, 0, 0, 0, Builtin::GlobalIdX as u32), // v1 = gid
        op(Op::VFromS, 3, 1, 0, 0, 0),                          // v3 = n
        op(Op::CmpLtU, 4, 1, 3, 0, 0),                          // v4 = gid < n
    ];
    let if_at = p.len();
    p.push(op(Op::If, 0, 4, 0, 0, 0));
    p.extend_from_slice(body);
    p.push(op(Op::Shl, 5, 1, 0, FLAG_IMM, 2)); // v5 = gid * 4
    p.push(op(Op::St32, 2, 0, 5, 0, 0)); // out[gid] = v2
    let end = p.len() as u32;
    p.push(op(Op::EndIf, 0, 0, 0, 0, 0));
    p[if_at].imm = end;
    p
}

fn run_all(r: &Rig, grid: u32, group: u32, width: u32) -> Result<ComputeStats, FaultKind> {
    let mut d = Dispatch::start(&r.vm, KERNEL, [grid, 1, 1], [group, 1, 1], ARGS, width)?;
    let mut stats = ComputeStats::default();
    assert_eq!(d.run(&r.vm, u64::MAX, &mut stats)?, Progress::Done);
    Ok(stats)
}

#[test]
fn arithmetic_with_a_bounds_check_and_a_partial_last_wave() {
    // v2 = gid * 3 + 1
    let p = store_kernel(&[op(Op::Mul, 2, 1, 0, FLAG_IMM, 3), op(Op::Add, 2, 2, 0, FLAG_IMM, 1)]);
    for width in [1, 7, 32, 64] {
        let r = rig(&p, 1000);
        // 9 groups of 120 threads overshoot n = 1000; 120 is not a multiple of the width.
        run_all(&r, 9, 120, width).unwrap();
        let out = out_u32s(&r, 1100);
        for (i, &v) in out.iter().enumerate() {
            let want = if i < 1000 { i as u32 * 3 + 1 } else { 0 };
            assert_eq!(v, want, "width {width}, gid {i}");
        }
    }
}

/// A destination that is also a source (`v2 = v2 + v2`), for unary, binary and ternary
/// operations, with every lane active (computed in place) and with some inactive (the last
/// group's lanes past n): each lane reads its sources before its own result lands.
#[test]
fn a_destination_may_be_a_source() {
    let p = store_kernel(&[
        op(Op::Mov, 2, 1, 0, 0, 0),        // v2 = gid
        op(Op::Add, 2, 2, 2, 0, 0),        // v2 = v2 + v2
        op(Op::Mov, 6, 0, 0, FLAG_IMM, 5), // v6 = 5
        op(Op::Sub, 2, 6, 2, 0, 0),        // v2 = v6 - v2
        op(Op::Not, 2, 2, 0, 0, 0),        // v2 = !v2
        op(Op::And, 7, 1, 0, FLAG_IMM, 1), // v7 = gid & 1
        op(Op::Sel, 2, 7, 2, 1, 0),        // v2 = v7 ? v2 : gid
        op(Op::Mul, 2, 2, 0, FLAG_IMM, 3), // v2 = v2 * 3
    ]);
    for width in [1, 7, 32, 64] {
        let r = rig(&p, 1000);
        run_all(&r, 9, 120, width).unwrap();
        for (i, v) in out_u32s(&r, 1080).into_iter().enumerate() {
            let gid = i as u32;
            let odd = !5u32.wrapping_sub(gid.wrapping_mul(2));
            let want = if i >= 1000 { 0 } else { (if gid & 1 == 1 { odd } else { gid }).wrapping_mul(3) };
            assert_eq!(v, want, "width {width}, gid {i}");
        }
    }
}

#[test]
fn divergent_if_else_and_loops_with_per_lane_trip_counts() {
    // if gid odd: v2 = sum_{k<gid%5} (k+1) via a loop with break; else v2 = 1000 + gid
    let body = vec![
        op(Op::And, 6, 1, 0, FLAG_IMM, 1),    // 0 v6 = gid & 1
        op(Op::If, 0, 6, 0, 0, 13),           // 1 -> else at 13
        op(Op::RemU, 7, 1, 0, FLAG_IMM, 5),   // 2 v7 = gid % 5 (trip count)
        op(Op::Mov, 2, 0, 0, FLAG_IMM, 0),    // 3 v2 = 0
        op(Op::Mov, 8, 0, 0, FLAG_IMM, 0),    // 4 v8 = k = 0
        op(Op::Loop, 0, 0, 0, 0, 11),         // 5
        op(Op::CmpLeU, 9, 7, 8, 0, 0),        // 6 v9 = trips <= k
        op(Op::Break, 0, 9, 0, 0, 11),        // 7
        op(Op::Add, 8, 8, 0, FLAG_IMM, 1),    // 8 k += 1
        op(Op::Add, 2, 2, 8, 0, 0),           // 9 v2 += k
        op(Op::Nop, 0, 0, 0, 0, 0),           // 10
        op(Op::EndLoop, 0, 0, 0, 0, 5),       // 11
        op(Op::Nop, 0, 0, 0, 0, 0),           // 12
        op(Op::Else, 0, 0, 0, 0, 15),         // 13
        op(Op::Add, 2, 1, 0, FLAG_IMM, 1000), // 14
        op(Op::EndIf, 0, 0, 0, 0, 0),         // 15
    ];
    // Targets in `body` are relative to the body; shift them by the prologue length.
    let shift = 6u32;
    let body: Vec<Inst> = body
        .into_iter()
        .map(|mut i| {
            if matches!(i.op, Op::If | Op::Else | Op::Loop | Op::Break | Op::EndLoop) {
                i.imm += shift;
            }
            i
        })
        .collect();
    let p = store_kernel(&body);
    abi::isa::validate(&p.iter().map(Inst::encode).collect::<Vec<_>>()).unwrap();
    let r = rig(&p, 200);
    run_all(&r, 4, 64, 32).unwrap();
    for (i, v) in out_u32s(&r, 200).into_iter().enumerate() {
        let i32_ = i as u32;
        let want = if i % 2 == 1 { (1..=i32_ % 5).sum::<u32>() } else { 1000 + i32_ };
        assert_eq!(v, want, "gid {i}");
    }
}

#[test]
fn division_by_zero_has_the_documented_results() {
    let p = store_kernel(&[
        op(Op::DivU, 2, 1, 0, FLAG_IMM, 0), // gid / 0 = u32::MAX
        op(Op::RemU, 10, 1, 0, FLAG_IMM, 0),
        op(Op::Add, 2, 2, 10, 0, 0), // + gid % 0 = gid  → MAX + gid (wrapping) = gid - 1
    ]);
    let r = rig(&p, 8);
    run_all(&r, 1, 8, 32).unwrap();
    assert_eq!(out_u32s(&r, 8), (0..8u32).map(|g| g.wrapping_sub(1)).collect::<Vec<_>>());
}

#[test]
fn out_of_mapping_and_misaligned_accesses_fault_with_va_access_and_pc() {
    // Store 4 bytes past the end of OUT for gid 0.
    let p = vec![
        op(Op::SArg, 0, 0, 0, 0, 0),
        op(Op::Mov, 1, 0, 0, FLAG_IMM, OUT_BYTES as u32),
        op(Op::St32, 1, 0, 1, 0, 0),
    ];
    let r = rig(&p, 1);
    let e = run_all(&r, 1, 1, 32).unwrap_err();
    assert_eq!(
        e,
        FaultKind::ProgramAccess {
            pc: 2,
            fault: Box::new(FaultKind::OutsideMappings { va: OUT + OUT_BYTES, bytes: 4, access: Access::Write })
        }
    );
    assert!(e.to_string().contains("program instruction 2"), "{e}");
    let p = vec![op(Op::SArg, 0, 0, 0, 0, 0), op(Op::Ld32, 1, 0, 0, 0, 2)];
    let r = rig(&p, 1);
    assert!(
        matches!(run_all(&r, 1, 1, 32), Err(FaultKind::ProgramAccess { pc: 1, fault }) if matches!(*fault, FaultKind::Misaligned { align: 4, .. }))
    );
}

#[test]
fn bad_binaries_and_dimensions_are_refused_before_running() {
    let r = rig(&[op(Op::Nop, 0, 0, 0, 0, 0)], 0);
    // Corrupt the opcode of instruction 0.
    let k = r.vm.find(KERNEL).unwrap().shm.clone();
    k.write_u32(32, 0xee).unwrap();
    assert!(matches!(Dispatch::start(&r.vm, KERNEL, [1; 3], [1; 3], ARGS, 32), Err(FaultKind::BadProgram(_))));
    let r = rig(&[op(Op::Loop, 0, 0, 0, 0, 99)], 0);
    assert!(matches!(Dispatch::start(&r.vm, KERNEL, [1; 3], [1; 3], ARGS, 32), Err(FaultKind::BadProgram(_))));
    let r = rig(&[op(Op::Nop, 0, 0, 0, 0, 0)], 0);
    assert!(matches!(Dispatch::start(&r.vm, KERNEL, [0, 1, 1], [1; 3], ARGS, 32), Err(FaultKind::BadDispatch { .. })));
    assert!(matches!(
        Dispatch::start(&r.vm, KERNEL, [1; 3], [1025, 1, 1], ARGS, 32),
        Err(FaultKind::BadDispatch { .. })
    ));
    assert!(matches!(
        Dispatch::start(&r.vm, 0xdead_0000, [1; 3], [1; 3], ARGS, 32),
        Err(FaultKind::OutsideMappings { .. })
    ));
}

#[test]
fn an_endless_loop_keeps_yielding_in_bounded_slices() {
    let p = vec![op(Op::Loop, 0, 0, 0, 0, 2), op(Op::Add, 1, 1, 0, FLAG_IMM, 1), op(Op::EndLoop, 0, 0, 0, 0, 0)];
    let r = rig(&p, 0);
    let mut d = Dispatch::start(&r.vm, KERNEL, [1; 3], [32, 1, 1], ARGS, 32).unwrap();
    let mut stats = ComputeStats::default();
    for _ in 0..100 {
        assert_eq!(d.run(&r.vm, 1000, &mut stats).unwrap(), Progress::Yield);
    }
    assert_eq!(stats.instructions, 100_000);
    assert_eq!(stats.lane_ops, 100_000 * 32);
}

/// A kernel with loops, divergence, atomics and 64-bit memory: out[gid] = mix(gid); counter += gid.
fn busy_kernel() -> Vec<Inst> {
    let body = vec![
        op(Op::RemU, 7, 1, 0, FLAG_IMM, 7),            // 0 trips
        op(Op::Mov, 2, 1, 0, 0, 0),                    // 1 v2 = gid
        op(Op::Loop, 0, 0, 0, 0, 8),                   // 2
        op(Op::CmpEq, 9, 7, 0, FLAG_IMM, 0),           // 3
        op(Op::Break, 0, 9, 0, 0, 8),                  // 4
        op(Op::Mul, 2, 2, 0, FLAG_IMM, 2_654_435_761), // 5
        op(Op::Sub, 7, 7, 0, FLAG_IMM, 1),             // 6
        op(Op::Xor, 2, 2, 7, 0, 0),                    // 7 (falls into ENDLOOP below)
        op(Op::EndLoop, 0, 0, 0, 0, 2),                // 8
        op(Op::Mov, 11, 0, 0, FLAG_IMM, 0),            // 9 v11 = 0 offset
        op(Op::AtomAdd, 12, 0, 11, 1, 0x8000),         // 10 counter at out+0x8000 += gid
    ];
    let shift = 6u32;
    let body: Vec<Inst> = body
        .into_iter()
        .map(|mut i| {
            if matches!(i.op, Op::Loop | Op::Break | Op::EndLoop) {
                i.imm += shift;
            }
            i
        })
        .collect();
    store_kernel(&body)
}

/// Runs `busy_kernel` to completion, stopping every `slices[k]` instructions (cycled), saving
/// to and restoring from a context save area each time. Returns the output bytes.
fn run_sliced(slices: &[u64], width: u32) -> Vec<u8> {
    let p = busy_kernel();
    let r = rig(&p, 300);
    let save = Shm::new("save", CONTEXT_SAVE_BYTES as usize).unwrap();
    let mut stats = ComputeStats::default();
    let mut d = Dispatch::start(&r.vm, KERNEL, [5, 1, 1], [64, 1, 1], ARGS, width).unwrap();
    let mut k = 0;
    loop {
        let budget = slices[k % slices.len()].max(1);
        k += 1;
        match d.run(&r.vm, budget, &mut stats).unwrap() {
            Progress::Done => break,
            Progress::Yield | Progress::Stopped(_) => {
                d.save(&save, 0).unwrap();
                d = Dispatch::restore(&r.vm, &save, 0, width).unwrap();
            }
        }
        assert!(k < 1_000_000);
    }
    let mut out = vec![0u8; 0x8004];
    r.out.read(0, &mut out).unwrap();
    let _ = &r.args;
    out
}

#[test]
fn the_busy_kernel_is_right_and_atomics_add_up() {
    let out = run_sliced(&[u64::MAX], 32);
    let counter = u32::from_le_bytes(out[0x8000..0x8004].try_into().unwrap());
    assert_eq!(counter, (0..300u32).sum::<u32>());
    for gid in 0..300u32 {
        let mut v = gid;
        let mut t = gid % 7;
        while t != 0 {
            v = v.wrapping_mul(2_654_435_761);
            t -= 1;
            v ^= t;
        }
        let got = u32::from_le_bytes(out[gid as usize * 4..gid as usize * 4 + 4].try_into().unwrap());
        assert_eq!(got, v, "gid {gid}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    /// Stopping at random instruction boundaries (through a save and a restore each time)
    /// gives bit-identical output.
    #[test]
    fn resuming_at_random_points_is_bit_identical(slices in prop::collection::vec(1u64..400, 1..8), width in prop::sample::select(vec![1u32, 8, 32, 64])) {
        let whole = run_sliced(&[u64::MAX], width);
        prop_assert_eq!(run_sliced(&slices, width), whole);
    }

    /// A corrupt save area is refused with a typed fault, never a panic.
    #[test]
    fn corrupt_save_areas_never_panic(offset in 0u64..4096, byte in any::<u8>()) {
        let p = busy_kernel();
        let r = rig(&p, 300);
        let save = Shm::new("save", CONTEXT_SAVE_BYTES as usize).unwrap();
        let mut d = Dispatch::start(&r.vm, KERNEL, [5, 1, 1], [64, 1, 1], ARGS, 32).unwrap();
        let mut stats = ComputeStats::default();
        d.run(&r.vm, 37, &mut stats).unwrap();
        d.save(&save, 0).unwrap();
        save.write(offset, &[byte]).unwrap();
        if let Ok(mut d) = Dispatch::restore(&r.vm, &save, 0, 32) {
            let _ = d.run(&r.vm, 100_000, &mut stats);
        }
    }
}

#[test]
fn huge_dimensions_are_refused_without_overflow() {
    for (grid, group) in [([1; 3], [u32::MAX; 3]), ([u32::MAX; 3], [1; 3]), ([u32::MAX, u32::MAX, 1], [1024, 1, 1])] {
        assert!(gpu::compute::check_dims(grid, group).is_err(), "{grid:?} {group:?}");
    }
    assert!(gpu::compute::check_dims([1 << 20, 1 << 20, 1], [1024, 1, 1]).is_ok());
}
