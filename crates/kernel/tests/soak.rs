//! A soak property test: random connect/submit/suspend/resume/D3/kill sequences across
//! several processes, on few hardware slots, under both doorbell models (dedicated over a small
//! pool, and global) and with engines that miss unmapped queues' doorbells, lose nothing.
//! (Its short idle period means F1 round trips re-read every wptr, so the UMD's aggregated
//! ring is not what it checks: `doorbell_models.rs` does that, with engines that never idle.)

mod common;

use abi::doorbell::DoorbellModel;
use abi::port::{InUseBy, InUseObject, KernelError};
use std::time::Duration;

use kernel::{SystemConfig, Termination};
use proptest::prelude::*;
use umd::CommandBuffer;

const T: Option<Duration> = Some(Duration::from_millis(200));
const PROCS: usize = 3;
const QUEUES: usize = 3;

#[derive(Clone, Debug)]
enum Op {
    Submit(usize, usize),
    Suspend(usize),
    Resume(usize),
    D3,
    Kill(usize, bool),
    Step(u8),
    Advance(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..PROCS, 0..QUEUES).prop_map(|(p, q)| Op::Submit(p, q)),
        1 => (0..PROCS).prop_map(Op::Suspend),
        1 => (0..PROCS).prop_map(Op::Resume),
        1 => Just(Op::D3),
        1 => (0..PROCS, any::<bool>()).prop_map(|(p, n)| Op::Kill(p, n)),
        2 => (1u8..5).prop_map(Op::Step),
        1 => (1u8..30).prop_map(Op::Advance),
    ]
}

struct Proc {
    c: common::Client,
    queues: Vec<umd::Queue>,
    expect: Vec<u32>,
    suspended: bool,
}

fn open(sys: &kernel::System) -> Proc {
    let c = common::client(sys);
    let queues = (0..QUEUES).map(|_| c.user_queue()).collect();
    Proc { c, queues, expect: vec![0; QUEUES], suspended: false }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]
    #[test]
    fn random_lifecycles_lose_nothing(
        ops in prop::collection::vec(op(), 1..60),
        global in any::<bool>(),
        misses_unmapped in any::<bool>(),
    ) {
        // Both doorbell models (the dedicated one over a pool of 3), with and without engines
        // that miss unmapped queues' doorbells (then the UMD rings the aggregated doorbell).
        let model = if global { DoorbellModel::Global } else { DoorbellModel::Dedicated };
        let sys = common::sim_with(SystemConfig {
            gpu: gpu::GpuConfig {
                hw_slots: 2,
                idle_period: Duration::from_millis(5),
                doorbell_model: model,
                misses_unmapped_doorbells: misses_unmapped,
                ..gpu::GpuConfig::default()
            },
            doorbell_pool: (!global).then_some(3),
            // The D3 idle timer fires inside the run too (Advance steps reach it).
            d3_idle: Some(Duration::from_millis(40)),
            ..SystemConfig::default()
        });
        let mut procs: Vec<Proc> = (0..PROCS).map(|_| open(&sys)).collect();
        for op in ops {
            match op {
                Op::Submit(p, q) => {
                    let pr = &mut procs[p];
                    pr.expect[q] += 1;
                    let mut cb = CommandBuffer::new();
                    cb.write_u32(pr.c.buf.va() + 4 * q as u64, pr.expect[q]);
                    pr.queues[q].submit(&cb).unwrap();
                }
                Op::Suspend(p) => {
                    let pr = &mut procs[p];
                    let r = sys.suspend_context(pr.c.port.process(), pr.c.ctx.handle());
                    prop_assert_eq!(r.is_ok(), !pr.suspended, "suspending twice is refused, once is fine");
                    pr.suspended = true;
                }
                Op::Resume(p) => {
                    let pr = &mut procs[p];
                    let r = sys.resume_context(pr.c.port.process(), pr.c.ctx.handle());
                    prop_assert_eq!(r.is_ok(), pr.suspended, "resuming what is not suspended is refused");
                    pr.suspended = false;
                }
                // Refused while work is in flight (a typed error); otherwise the device sleeps
                // until the next connect.
                Op::D3 => {
                    if let Err(e) = sys.enter_d3() {
                        prop_assert!(
                            matches!(
                                e,
                                KernelError::InUse { object: InUseObject::Adapter, by: InUseBy::WorkInFlight(_) }
                            ),
                            "{}",
                            e
                        );
                    }
                }
                Op::Kill(p, normal) => {
                    let how = if normal { Termination::Normal } else { Termination::Abnormal };
                    let pr = &procs[p];
                    sys.terminate(pr.c.port.process(), how);
                    if normal && !pr.suspended {
                        // A normal exit waited for everything it had queued.
                        for q in &pr.queues {
                            prop_assert_eq!(q.completed(), q.last_submitted());
                        }
                    }
                    procs[p] = open(&sys); // its resources came back: a new process fits
                }
                Op::Step(n) => {
                    for _ in 0..n {
                        sys.step();
                    }
                }
                Op::Advance(ms) => sys.advance(Duration::from_millis(ms as u64)),
            }
        }
        // Everything submitted to a live process runs once its context is resumed.
        for pr in &mut procs {
            if pr.suspended {
                sys.resume_context(pr.c.port.process(), pr.c.ctx.handle()).unwrap();
            }
            for (q, queue) in pr.queues.iter().enumerate() {
                queue.finish(T).unwrap();
                prop_assert_eq!(pr.c.buf.read_u32(4 * q as u64).unwrap(), pr.expect[q]);
            }
        }
    }
}
