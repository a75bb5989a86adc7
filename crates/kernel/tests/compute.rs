//! `DISPATCH` end to end on the deterministic driver: both submission paths, engine kinds,
//! fairness against a kernel that never ends, and faults that stay in their queue.

mod common;

use abi::isa::{Builtin, FLAG_IMM, Inst, Op};
use abi::queue::FaultKind;
use abi::{EngineKind, QueueState};
use umd::{Buffer, CommandBuffer, Device, QueueOptions, UmdError};

use common::{binary, forever};

fn op(op: Op, d: u8, a: u8, b: u8, c: u8, imm: u32) -> Inst {
    Inst::new(op, d, a, b, c, imm)
}

/// out[gid] = gid * gid + 7, for gid < n. Args: slot 0 = out, slot 1 = n.
fn squares() -> Vec<u8> {
    binary(&[
        op(Op::SArg, 0, 0, 0, 0, 0),
        op(Op::SArg, 1, 0, 0, 0, 1),
        op(Op::Builtin, 1, 0, 0, 0, Builtin::GlobalIdX as u32),
        op(Op::VFromS, 3, 1, 0, 0, 0),
        op(Op::CmpLtU, 4, 1, 3, 0, 0),
        op(Op::If, 0, 4, 0, 0, 10),
        op(Op::Mul, 2, 1, 1, 0, 0),
        op(Op::Add, 2, 2, 0, FLAG_IMM, 7),
        op(Op::Shl, 5, 1, 0, FLAG_IMM, 2),
        op(Op::St32, 2, 0, 5, 0, 0),
        op(Op::EndIf, 0, 0, 0, 0, 0),
    ])
}

fn args(dev: &Device, slots: &[u64]) -> Buffer {
    let bytes: Vec<u8> = slots.iter().flat_map(|s| s.to_le_bytes()).collect();
    dev.upload(&bytes).unwrap()
}

fn check_squares(out: &Buffer, n: u32) {
    for g in 0..n {
        assert_eq!(out.read_u32(g as u64 * 4).unwrap(), g * g + 7, "gid {g}");
    }
    assert_eq!(out.read_u32(n as u64 * 4).unwrap(), 0, "no write past n");
}

#[test]
fn dispatch_runs_on_both_submission_paths_with_the_same_results() {
    let sys = common::sim();
    let c = common::client(&sys);
    let kernel = c.device.upload(&squares()).unwrap();
    for mut q in [c.user_queue(), c.kernel_queue()] {
        let out = c.device.allocate(64 * 1024).unwrap();
        let a = args(&c.device, &[out.va(), 1000]);
        let mut cb = CommandBuffer::new();
        cb.dispatch(kernel.va(), [8, 1, 1], [128, 1, 1], a.va()).write_u32(out.va() + 60_000, 1);
        let v = q.submit(&cb).unwrap();
        q.wait(v, common::T).unwrap();
        check_squares(&out, 1000);
        assert_eq!(out.read_u32(60_000).unwrap(), 1, "packets after DISPATCH run after it");
    }
    let st = sys.with_gpu(|g| g.compute_stats());
    assert!(st.instructions > 0 && st.lane_ops >= 2 * 1000 * 5);
}

#[test]
fn a_kernel_that_never_ends_does_not_starve_the_engine() {
    let sys = common::sim();
    let c = common::client(&sys);
    let spin = c.device.upload(&forever()).unwrap();
    let kernel = c.device.upload(&squares()).unwrap();
    let a0 = args(&c.device, &[0, 0]);
    let mut hog = c.user_queue();
    let mut cb = CommandBuffer::new();
    cb.dispatch(spin.va(), [1, 1, 1], [64, 1, 1], a0.va());
    let hog_v = hog.submit(&cb).unwrap();
    // Another queue on the same compute engine still gets its work done.
    let mut q = c.user_queue();
    let out = c.device.allocate(4096).unwrap();
    let a = args(&c.device, &[out.va(), 100]);
    let mut cb = CommandBuffer::new();
    cb.dispatch(kernel.va(), [1, 1, 1], [128, 1, 1], a.va());
    let v = q.submit(&cb).unwrap();
    q.wait(v, common::T).unwrap();
    check_squares(&out, 100);
    assert!(hog.completed() < hog_v, "the endless kernel is still running");
    assert_eq!(hog.status().unwrap().state, QueueState::Mapped);
}

#[test]
fn dispatch_faults_stay_in_their_queue() {
    let sys = common::sim();
    let c = common::client(&sys);
    let good = c.device.upload(&squares()).unwrap();
    let mut bad_bin = squares();
    bad_bin[32 + 8 * 5] = 0xee; // unknown opcode at instruction 5
    let bad = c.device.upload(&bad_bin).unwrap();
    let out = c.device.allocate(4096).unwrap();
    let a = args(&c.device, &[out.va(), 10]);
    let oob = args(&c.device, &[0xdead_0000, 10]);
    type Case = (u64, u64, [u32; 3], fn(&FaultKind) -> bool);
    let cases: Vec<Case> = vec![
        (bad.va(), a.va(), [16, 1, 1], |k| matches!(k, FaultKind::BadProgram(e) if e.pc == 5)),
        (good.va(), oob.va(), [16, 1, 1], |k| matches!(k, FaultKind::ProgramAccess { pc: 9, .. })),
        (good.va(), a.va(), [2000, 1, 1], |k| matches!(k, FaultKind::BadDispatch { .. })),
    ];
    for (kernel, args_va, group, expect) in cases {
        let mut q = c.user_queue();
        let mut cb = CommandBuffer::new();
        cb.dispatch(kernel, [1, 1, 1], group, args_va);
        let v = q.submit(&cb).unwrap();
        assert!(matches!(q.wait(v, common::T), Err(UmdError::QueueLost { .. })));
        let st = q.status().unwrap();
        assert_eq!(st.state, QueueState::Hung);
        let f = st.fault.unwrap();
        assert!(expect(&f.kind), "{f}");
    }
    // The engine and other queues go on.
    let mut q = c.user_queue();
    let mut cb = CommandBuffer::new();
    cb.dispatch(good.va(), [1, 1, 1], [16, 1, 1], a.va());
    let v = q.submit(&cb).unwrap();
    q.wait(v, common::T).unwrap();
    check_squares(&out, 10);
}

#[test]
fn only_compute_engines_run_kernels_and_the_kernel_path_validates_dimensions() {
    let sys = common::sim();
    let c = common::client(&sys);
    let kernel = c.device.upload(&squares()).unwrap();
    let a = args(&c.device, &[0, 0]);
    let ctx = c.device.create_context(c.device.engine(EngineKind::Copy).unwrap()).unwrap();
    let mut q = ctx.create_queue(QueueOptions::user_mode()).unwrap();
    let mut cb = CommandBuffer::new();
    cb.dispatch(kernel.va(), [1, 1, 1], [1, 1, 1], a.va());
    let v = q.submit(&cb).unwrap();
    assert!(q.wait(v, common::T).is_err());
    assert!(matches!(q.status().unwrap().fault.unwrap().kind, FaultKind::BadDispatch { .. }));
    let mut kq = c.kernel_queue();
    let mut cb = CommandBuffer::new();
    cb.dispatch(kernel.va(), [1, 0, 1], [1, 1, 1], a.va());
    let e = kq.submit(&cb).unwrap_err();
    assert!(matches!(common::umd_refusal(&e), Some(("DISPATCH.grid/group", abi::port::Invalid::Dims(_)))), "{e}");
}
