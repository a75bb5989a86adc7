//! A property test of cross-adapter fences: random GPU and CPU signals on either adapter,
//! racing random GPU and CPU waits on either adapter (an iGPU with or without native fences,
//! and a dGPU). At the end every wait the fence's value satisfies has passed, on both
//! adapters, and none other has: no propagated signal is lost, none is invented.

mod common;

use abi::EngineKind;
use abi::port::{NativeFenceDesc, NativeFenceType, UserQueueMode, WaitMode, WaitOutcome};
use kernel::{Machine, SystemConfig};
use proptest::prelude::*;
use umd::{CommandBuffer, NativeFence, Queue, QueueOptions};

#[derive(Clone, Debug)]
enum Op {
    /// A queue on this adapter signals the next value.
    SignalGpu(usize, u64),
    /// The CPU signals the next value through this adapter.
    SignalCpu(usize, u64),
    /// A CPU waiter on this adapter waits for (current value + delta).
    WaitCpu(usize, u64),
    /// A queue on this adapter waits for (current value + delta), then writes a marker.
    WaitGpu(usize, u64),
    /// One step of the machine.
    Step,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..2usize, 1..3u64).prop_map(|(a, d)| Op::SignalGpu(a, d)),
        (0..2usize, 1..3u64).prop_map(|(a, d)| Op::SignalCpu(a, d)),
        (0..2usize, 0..4u64).prop_map(|(a, d)| Op::WaitCpu(a, d)),
        (0..2usize, 0..4u64).prop_map(|(a, d)| Op::WaitGpu(a, d)),
        Just(Op::Step),
    ]
}

struct Side {
    c: common::Client,
    /// The signaller's context.
    _ctx: umd::Context,
    fence: NativeFence,
    signaller: Queue,
    waiter: Queue,
    /// (target, marker offset) of each GPU wait, in queue order.
    gpu_waits: Vec<(u64, u64)>,
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]
    #[test]
    fn cross_adapter_waits_pass_exactly_when_the_shared_value_allows(
        ops in prop::collection::vec(op(), 1..50),
        igpu_native in any::<bool>(),
    ) {
        let igpu = if igpu_native {
            SystemConfig::default()
        } else {
            SystemConfig { without_native_fences: true, user_queue_mode: UserQueueMode::KernelOnly, ..SystemConfig::default() }
        };
        let m = Machine::sim(&[igpu, SystemConfig::default()]).unwrap();
        let native = [igpu_native, true];
        let desc = NativeFenceDesc { cross_adapter: true, ..NativeFenceDesc::new(0, NativeFenceType::Default) };
        let clients: Vec<common::Client> =
            (0..2).map(|i| common::client_on(m.adapter(i).open_process().unwrap())).collect();
        let created = clients[1].device.create_fence_with(&desc).unwrap();
        let handle = created.cross_adapter().unwrap();
        let opened = clients[0].device.open_cross_adapter_fence(handle).unwrap();
        let mut sides: Vec<Side> = clients
            .into_iter()
            .zip([opened, created])
            .enumerate()
            .map(|(i, (c, fence))| {
                // Two contexts: kernel-mode submissions of one context go through one software
                // queue, where a held-back wait would hold the signal behind it.
                let opts = if native[i] { QueueOptions::user_mode() } else { QueueOptions::kernel_mode() };
                let ctx = c.context(EngineKind::Compute);
                let signaller = ctx.create_queue(opts).unwrap();
                let waiter = c.ctx.create_queue(opts).unwrap();
                Side { c, _ctx: ctx, fence, signaller, waiter, gpu_waits: Vec::new() }
            })
            .collect();
        let mut value = 0u64;
        let mut cpu_waits = Vec::new();
        for op in ops {
            match op {
                Op::SignalGpu(a, d) => {
                    value += d;
                    let s = &mut sides[a];
                    let mut cb = CommandBuffer::new();
                    cb.signal_fence(&s.fence, value);
                    s.signaller.submit(&cb).unwrap();
                    // Run it now: a later CPU signal must not be overtaken by it.
                    m.settle();
                }
                Op::SignalCpu(a, d) => {
                    value += d;
                    sides[a].fence.signal(value).unwrap();
                }
                Op::WaitCpu(a, d) => {
                    let s = &sides[a];
                    let pid = s.c.port.process();
                    let w = m.adapter(a).begin_fence_wait(pid, &[(s.fence.handle(), value + d)], WaitMode::All).unwrap();
                    cpu_waits.push((a, pid, value + d, w));
                }
                Op::WaitGpu(a, d) => {
                    let s = &mut sides[a];
                    let marker = 4 * (s.gpu_waits.len() as u64 + 1);
                    let mut cb = CommandBuffer::new();
                    cb.wait_fence(&s.fence, value + d).write_u32(s.c.buf.va() + marker, 1);
                    s.waiter.submit(&cb).unwrap();
                    s.gpu_waits.push((value + d, marker));
                }
                Op::Step => {
                    m.adapter(0).step();
                }
            }
        }
        m.settle();
        for s in &sides {
            prop_assert_eq!(s.fence.value().unwrap(), value, "one CurrentValue for both adapters");
        }
        for (a, pid, target, w) in &cpu_waits {
            let passed = match w {
                None => true,
                Some(w) => {
                    let done = w.is_done();
                    let r = m.adapter(*a).end_fence_wait(*pid, w).unwrap();
                    prop_assert_eq!(done, r == WaitOutcome::Reached(0));
                    done
                }
            };
            prop_assert_eq!(passed, *target <= value, "CPU wait on adapter {} for {} (value {})", a, target, value);
        }
        for (a, s) in sides.iter().enumerate() {
            // A queue runs its waits in order: the first one the value does not satisfy
            // blocks it, and everything after.
            let mut open = true;
            for &(target, marker) in &s.gpu_waits {
                open &= target <= value;
                let written = s.c.buf.read_u32(marker).unwrap() == 1;
                prop_assert_eq!(written, open, "GPU wait on adapter {} for {} (value {})", a, target, value);
            }
        }
    }
}
