//! The kernel port's observation queries, used to watch the spec's examples directly instead
//! of inferring them from the trace:
//!
//! - [`KernelPort::query_native_fence`]: spec 002's MonitoredValue example (CurrentValue and
//!   MonitoredValue at 41, the GPU writes 42 and interrupts, the ISR wakes the waiter for 42
//!   and moves MonitoredValue on), step by step.
//! - [`KernelPort::query_physical_doorbell`]: spec 000's victimization — the victim's
//!   physical doorbell goes to the new queue — and the victim policies of the pooled model
//!   ([`VictimPolicy`]): least recently rung keeps a busy queue's doorbell, least recently
//!   connected takes it.

mod common;

use abi::port::{KernelError, KernelPort, NativeFenceType, NativeFenceValues, PhysicalDoorbell, WaitMode, WaitOutcome};
use abi::{DoorbellStatus, HwQueueHandle};
use kernel::{SystemConfig, VictimPolicy};
use umd::CommandBuffer;

fn values(port: &dyn KernelPort, f: &umd::NativeFence) -> NativeFenceValues {
    port.query_native_fence(f.handle()).expect("fence query")
}

/// Spec 002 "GPU native fence sync object design", its three diagrams in order.
#[test]
fn spec_002s_41_42_example_step_by_step() {
    let sys = common::sim();
    let c = common::client(&sys);
    let port = c.port.as_ref();
    let pid = port.process();
    let f = c.device.create_fence(41, NativeFenceType::Default).unwrap();
    let mut q = c.user_queue();
    // No CPU waiter: MonitoredValue is UINT64_MAX.
    assert_eq!(values(port, &f), NativeFenceValues { current: 41, monitored: u64::MAX });

    // Waiters for 42 and 43: MonitoredValue is the least waited value minus 1. First
    // diagram: CurrentValue and MonitoredValue are both 41.
    let w42 = sys.begin_fence_wait(pid, &[(f.handle(), 42)], WaitMode::All).unwrap().expect("blocks");
    assert_eq!(values(port, &f), NativeFenceValues { current: 41, monitored: 41 });
    let w43 = sys.begin_fence_wait(pid, &[(f.handle(), 43)], WaitMode::All).unwrap().expect("blocks");
    assert_eq!(values(port, &f), NativeFenceValues { current: 41, monitored: 41 }, "42 is still the least");

    // Second diagram: the GPU writes 42, greater than MonitoredValue, and raises the
    // interrupt. Step the device alone (not the OS): the interrupt is raised, not yet serviced.
    let mut cb = CommandBuffer::new();
    cb.signal_fence(&f, 42);
    let v = q.submit(&cb).unwrap();
    let now = sys.now();
    sys.with_gpu(|g| {
        g.poll_doorbells();
        g.step(now);
    });
    assert_eq!(values(port, &f), NativeFenceValues { current: 42, monitored: 41 });
    assert!(!w42.is_done(), "the OS has not serviced the interrupt yet");
    assert_eq!(sys.stats().fence_interrupts, 0);

    // Third diagram: the ISR wakes the waiter for 42 and advances MonitoredValue to the least
    // outstanding waited value minus 1 (43 - 1 = 42).
    sys.settle();
    assert_eq!(sys.stats().fence_interrupts, 1);
    assert!(w42.is_done() && !w43.is_done());
    assert_eq!(values(port, &f), NativeFenceValues { current: 42, monitored: 42 });
    assert_eq!(sys.end_fence_wait(pid, &w42).unwrap(), WaitOutcome::Reached(0));
    q.wait(v, common::T).unwrap();

    // 43 wakes the last waiter: no waiter left, MonitoredValue back to UINT64_MAX, and a
    // later signal raises no interrupt.
    let mut cb = CommandBuffer::new();
    cb.signal_fence(&f, 43);
    q.submit(&cb).unwrap();
    sys.settle();
    assert!(w43.is_done());
    assert_eq!(sys.end_fence_wait(pid, &w43).unwrap(), WaitOutcome::Reached(0));
    assert_eq!(values(port, &f), NativeFenceValues { current: 43, monitored: u64::MAX });
    let mut cb = CommandBuffer::new();
    cb.signal_fence(&f, 44);
    let v = q.submit(&cb).unwrap();
    q.wait(v, common::T).unwrap();
    assert_eq!(values(port, &f), NativeFenceValues { current: 44, monitored: u64::MAX });
    assert_eq!(sys.stats().fence_interrupts, 2, "the signal with no waiter did not interrupt");
}

#[test]
fn a_legacy_monitored_fence_reads_monitored_zero_and_foreign_handles_are_refused() {
    let sys = common::sim();
    let c = common::client(&sys);
    let f = c.device.create_fence(3, NativeFenceType::LegacyMonitored).unwrap();
    assert_eq!(values(c.port.as_ref(), &f), NativeFenceValues { current: 3, monitored: 0 });
    let other = common::client(&sys);
    let e = other.port.query_native_fence(f.handle()).unwrap_err();
    assert!(matches!(e, KernelError::BadHandle { .. }), "{e}");
    let q = c.user_queue();
    let e = other.port.query_physical_doorbell(q.handle()).unwrap_err();
    assert!(matches!(e, KernelError::BadHandle { .. }), "{e}");
}

fn pooled(n: u32, policy: VictimPolicy) -> kernel::System {
    common::sim_with(SystemConfig { doorbell_pool: Some(n), victim_policy: policy, ..SystemConfig::default() })
}

fn physical(c: &common::Client, q: HwQueueHandle) -> Option<PhysicalDoorbell> {
    c.port.query_physical_doorbell(q).expect("doorbell query")
}

/// Spec 000's victimization example: the only physical doorbell moves from hDoorbell1 to
/// hDoorbell2.
#[test]
fn the_victims_physical_doorbell_goes_to_the_new_queue() {
    let sys = pooled(1, VictimPolicy::default());
    let c = common::client(&sys);
    let q1 = c.user_queue();
    let held = physical(&c, q1.handle()).expect("q1 is connected");
    assert!(matches!(held, PhysicalDoorbell::BarIndex(_)), "{held:?}");
    let q2 = c.user_queue();
    assert_eq!(physical(&c, q1.handle()), None, "q1 was victimized");
    assert_eq!(physical(&c, q2.handle()), Some(held), "q2 holds q1's physical doorbell");
    assert_eq!(q1.doorbell_status().unwrap(), DoorbellStatus::DisconnectedRetry);
    // The victim reconnects on its next submission and takes the doorbell back.
    let mut q1 = q1;
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va(), 7);
    let v = q1.submit(&cb).unwrap();
    q1.wait(v, common::T).unwrap();
    assert_eq!(c.buf.read_u32(0).unwrap(), 7);
    assert_eq!((physical(&c, q1.handle()), physical(&c, q2.handle())), (Some(held), None));
}

/// Two queues hold a pool of two: `busy` connected first but rings afterwards, `idle` connected
/// second and never rings. A third queue connects; returns (busy's, idle's, new's) doorbells
/// before and after, and busy's reconnects on its next submission.
fn busy_and_idle(policy: VictimPolicy) -> ([Option<PhysicalDoorbell>; 2], [Option<PhysicalDoorbell>; 3], u64) {
    let sys = pooled(2, policy);
    let c = common::client(&sys);
    let mut busy = c.user_queue();
    let idle = c.user_queue();
    for i in 0..3u32 {
        let mut cb = CommandBuffer::new();
        cb.write_u32(c.buf.va(), i);
        let v = busy.submit(&cb).unwrap();
        busy.wait(v, common::T).unwrap();
    }
    let before = [physical(&c, busy.handle()), physical(&c, idle.handle())];
    let new = c.user_queue();
    let after = [physical(&c, busy.handle()), physical(&c, idle.handle()), physical(&c, new.handle())];
    assert_eq!(sys.stats().victimizations, 1);
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va(), 0xb);
    let v = busy.submit(&cb).unwrap();
    busy.wait(v, common::T).unwrap();
    assert_eq!(c.buf.read_u32(0).unwrap(), 0xb);
    (before, after, busy.reconnects())
}

#[test]
fn least_recently_rung_keeps_a_busy_queues_doorbell_and_victimizes_the_idle_one() {
    let ([busy, idle], after, reconnects) = busy_and_idle(VictimPolicy::LeastRecentlyRung);
    assert!(busy.is_some() && idle.is_some() && busy != idle, "{busy:?} {idle:?}");
    assert_eq!(after, [busy, None, idle], "the idle queue's doorbell went to the new queue");
    assert_eq!(reconnects, 0, "the busy queue never reconnected");
}

#[test]
fn least_recently_connected_victimizes_the_busy_queue_connected_first() {
    let ([busy, idle], after, reconnects) = busy_and_idle(VictimPolicy::LeastRecentlyConnected);
    assert!(busy.is_some() && idle.is_some() && busy != idle, "{busy:?} {idle:?}");
    assert_eq!(after, [None, idle, busy], "the busy queue's doorbell went to the new queue");
    assert_eq!(reconnects, 1, "the busy queue paid the reconnect");
}

/// A queue connected after the last ring counts as used at its connect: it is not victimized
/// before it has had a chance to ring (ties and never-rung doorbells fall back to connect
/// order).
#[test]
fn least_recently_rung_counts_a_connect_as_a_use() {
    let sys = pooled(2, VictimPolicy::LeastRecentlyRung);
    let c = common::client(&sys);
    let mut a = c.user_queue();
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va(), 1);
    let v = a.submit(&cb).unwrap();
    a.wait(v, common::T).unwrap();
    let b = c.user_queue(); // connected after a's last ring
    let held = physical(&c, a.handle());
    let n = c.user_queue();
    assert_eq!(physical(&c, a.handle()), None, "a rang before b connected: a is the older use");
    assert!(physical(&c, b.handle()).is_some());
    assert_eq!(physical(&c, n.handle()), held);
}

#[test]
fn dedicated_and_global_models_report_their_doorbells() {
    let sys = common::sim();
    let c = common::client(&sys);
    let q = c.user_queue();
    let Some(PhysicalDoorbell::BarIndex(index)) = physical(&c, q.handle()) else { panic!("a BAR doorbell") };
    assert!(index >= abi::doorbell::DOORBELLS_PER_PAGE, "a process page, not the kernel's: {index}");
    // A kernel-mode queue reports the kernel doorbell the KMD rings for it (page 0).
    let k = c.kernel_queue();
    let Some(PhysicalDoorbell::BarIndex(kindex)) = physical(&c, k.handle()) else { panic!("a kernel doorbell") };
    assert!(kindex < abi::doorbell::DOORBELLS_PER_PAGE, "{kindex}");
    let g = common::sim_with(SystemConfig {
        gpu: gpu::GpuConfig { doorbell_model: abi::doorbell::DoorbellModel::Global, ..Default::default() },
        ..SystemConfig::default()
    });
    let gc = common::client(&g);
    let gq = gc.user_queue();
    assert!(
        matches!(physical(&gc, gq.handle()), Some(PhysicalDoorbell::Bit { .. })),
        "{:?}",
        physical(&gc, gq.handle())
    );
}

/// A busy queue beside queues that submit now and then, over a pool smaller than the queues:
/// (the busy queue's reconnects, everyone's reconnects, victimizations).
fn mixed_workload(policy: VictimPolicy) -> (u64, u64, u64) {
    let sys = pooled(3, policy);
    let c = common::client(&sys);
    // The busy queue connects last (creating a queue connects it: a use).
    let mut others: Vec<umd::Queue> = (0..5).map(|_| c.user_queue()).collect();
    let mut busy = c.user_queue();
    for round in 0..40u32 {
        let mut cb = CommandBuffer::new();
        cb.write_u32(c.buf.va(), round);
        busy.submit(&cb).unwrap();
        let i = round as usize % others.len();
        let mut cb = CommandBuffer::new();
        cb.write_u32(c.buf.va() + 4 + 4 * i as u64, round);
        let v = others[i].submit(&cb).unwrap();
        others[i].wait(v, common::T).unwrap();
    }
    busy.finish(common::T).unwrap();
    assert_eq!(c.buf.read_u32(0).unwrap(), 39);
    let all = busy.reconnects() + others.iter().map(|q| q.reconnects()).sum::<u64>();
    (busy.reconnects(), all, sys.stats().victimizations)
}

/// The comparison the simulator will make at scale, in miniature: least recently rung spares
/// the busy queue every reconnect; least recently connected makes it pay its share.
#[test]
fn a_busy_queue_beside_occasional_ones_pays_no_reconnect_under_least_recently_rung() {
    let rung = mixed_workload(VictimPolicy::LeastRecentlyRung);
    let connected = mixed_workload(VictimPolicy::LeastRecentlyConnected);
    println!("(busy reconnects, all reconnects, victimizations): rung {rung:?}, connected {connected:?}");
    assert_eq!(rung.0, 0, "{rung:?}");
    assert!(connected.0 > 0, "{connected:?}");
    assert!(rung.1 <= connected.1, "{rung:?} {connected:?}");
}

/// An engine entering F1 disconnects its doorbells: the queue holds no physical doorbell until
/// its next submission reconnects it.
#[test]
fn an_engine_in_f1_leaves_its_queues_without_a_physical_doorbell() {
    let idle = std::time::Duration::from_millis(10);
    let sys = common::sim_with(common::idle_config(idle));
    let c = common::client(&sys);
    let mut q = c.user_queue();
    let held = physical(&c, q.handle());
    assert!(held.is_some());
    sys.advance(idle * 3);
    assert_eq!(sys.power(q.engine()), abi::PowerState::F1);
    assert_eq!(physical(&c, q.handle()), None);
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va(), 5);
    let v = q.submit(&cb).unwrap();
    q.wait(v, common::T).unwrap();
    assert_eq!(physical(&c, q.handle()), held, "reconnected to the same dedicated doorbell");
}
