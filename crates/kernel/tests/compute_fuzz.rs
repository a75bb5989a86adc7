//! Random kernels and random dispatch sizes: the device never panics, a bad kernel only hangs
//! its own queue, and another process's checked work stays right.

mod common;

use abi::isa::{FLAG_IMM, Inst, Op, ProgramHeader, SREGS};
use proptest::prelude::*;
use umd::CommandBuffer;

fn binary(words: &[u64], claimed: Option<u32>) -> Vec<u8> {
    let mut bytes = Vec::new();
    for w in ProgramHeader::new(claimed.unwrap_or(words.len() as u32)).to_words() {
        bytes.extend_from_slice(&w.to_le_bytes());
    }
    for w in words {
        bytes.extend_from_slice(&w.to_le_bytes());
    }
    bytes
}

/// Straight-line instructions with random operands, plus a well-formed IF or LOOP now and
/// then, so that many programs pass validation and run (and fault) for real.
fn program() -> impl Strategy<Value = Vec<u64>> {
    let straight = (0usize..Op::ALL.len(), any::<u8>(), any::<u8>(), any::<u8>(), any::<bool>(), any::<u32>())
        .prop_filter_map("straight-line op", |(k, d, a, b, imm_flag, imm)| {
            let op = Op::ALL[k];
            if matches!(op, Op::If | Op::Else | Op::EndIf | Op::Loop | Op::Break | Op::EndLoop) {
                return None;
            }
            let c = if imm_flag { FLAG_IMM } else { b % 64 };
            let (d, a) = match op.form() {
                abi::isa::Form::ScalarArg | abi::isa::Form::ScalarImm | abi::isa::Form::ScalarAdd => {
                    (d % SREGS as u8, a % SREGS as u8)
                }
                abi::isa::Form::Load | abi::isa::Form::Store | abi::isa::Form::Atomic => (d % 62, a % SREGS as u8),
                abi::isa::Form::FromScalar => (d % 64, a % SREGS as u8),
                abi::isa::Form::Builtin => (d % 64, a),
                _ => (d % 64, a % 64),
            };
            let imm = if op == Op::Builtin { imm % 14 } else { imm };
            Some(vec![Inst::new(op, d, a, b % 64, c, imm).canonical().encode()])
        });
    let block = prop::collection::vec(straight, 1..6).prop_map(|v| v.concat());
    prop::collection::vec((block, 0u8..4), 1..6).prop_map(|parts| {
        let mut out: Vec<u64> = Vec::new();
        for (body, wrap) in parts {
            let start = out.len() as u32;
            match wrap {
                // IF v0 ... ENDIF
                1 => {
                    out.push(Inst::new(Op::If, 0, 0, 0, 0, start + 1 + body.len() as u32).encode());
                    out.extend(&body);
                    out.push(Inst::new(Op::EndIf, 0, 0, 0, 0, 0).encode());
                }
                // LOOP; BREAK v1; body; ENDLOOP — may spin forever: that is allowed
                2 => {
                    let end = start + 2 + body.len() as u32;
                    out.push(Inst::new(Op::Loop, 0, 0, 0, 0, end).encode());
                    out.push(Inst::new(Op::Break, 0, 1, 0, 0, end).encode());
                    out.extend(&body);
                    out.push(Inst::new(Op::EndLoop, 0, 0, 0, 0, start).encode());
                }
                _ => out.extend(&body),
            }
        }
        out
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn random_kernels_fault_or_finish_and_never_harm_others(
        words in prop_oneof![4 => program(), 1 => prop::collection::vec(any::<u64>(), 1..24)],
        claimed in prop_oneof![9 => Just(None), 1 => (0u32..70_000).prop_map(Some)],
        grid in prop_oneof![9 => prop::array::uniform3(1u32..3), 1 => prop::array::uniform3(0u32..4)],
        group in prop_oneof![9 => (1u32..100).prop_map(|x| [x, 1, 1]), 1 => prop::array::uniform3(0u32..40)],
        args in prop::collection::vec(any::<u64>(), 0..4),
    ) {
        // Small slices keep endless kernels cheap to step past.
        let sys = common::sim_with(kernel::SystemConfig {
            gpu: gpu::GpuConfig { dispatch_budget: 512, ..gpu::GpuConfig::default() },
            ..kernel::SystemConfig::default()
        });
        let victim = common::client(&sys);
        let other = common::client(&sys);
        // The random kernel: its argument slots may hold real addresses or garbage.
        let scratch = victim.device.allocate(1 << 16).unwrap();
        let mut slots = vec![scratch.va(), 4096];
        slots.extend(args);
        let argbuf = victim.device.upload(&slots.iter().flat_map(|s| s.to_le_bytes()).collect::<Vec<_>>()).unwrap();
        let kernel = victim.device.upload(&binary(&words, claimed)).unwrap();
        let mut vq = victim.user_queue();
        let mut cb = CommandBuffer::new();
        cb.dispatch(kernel.va(), grid, group, argbuf.va()).write_u32(scratch.va(), 0xfeed);
        let vv = vq.submit(&cb).unwrap();
        // Checked work in another process, on the same engine.
        let mut oq = other.user_queue();
        for round in 0..3u32 {
            let mut cb = CommandBuffer::new();
            cb.write_u32(other.buf.va() + round as u64 * 4, 0x600d_0000 + round).fill(other.buf.va() + 0x100, 64, round);
            let v = oq.submit(&cb).unwrap();
            oq.wait(v, common::T).unwrap();
            prop_assert_eq!(other.buf.read_u32(round as u64 * 4).unwrap(), 0x600d_0000 + round);
            prop_assert_eq!(other.buf.read_u32(0x13c).unwrap(), round);
        }
        // The random queue ended one of three ways; none of them is a panic.
        for _ in 0..64 {
            sys.step();
        }
        let st = vq.status().unwrap();
        match st.state {
            abi::QueueState::Hung => prop_assert!(st.fault.is_some()),
            abi::QueueState::Mapped => {
                // Finished (then the trailing WRITE_DATA ran) or still looping.
                if vq.completed() >= vv {
                    prop_assert_eq!(scratch.read_u32(0).unwrap(), 0xfeed);
                }
            }
            s => prop_assert!(false, "unexpected state {:?}", s),
        }
    }
}
