//! Regressions for bugs `doorbell sim swarm` found (issue 27), one test each; each fails
//! without its fix. (The kernel queue that took a one-slot engine's last slot from a user queue
//! is `spec001::a_kernel_queue_never_takes_the_last_slot_from_user_queues`.)

mod common;

use abi::port::KernelPort;
use abi::port::{NativeFenceType, WaitMode};
use abi::preempt::{ComputeGranularity, PreemptionCaps};
use gpu::GpuConfig;
use kernel::{SystemConfig, TdrConfig, Termination};

/// A system whose compute engines stop for preemption at `compute`, with TDR settings `tdr`.
fn compute_preemption(compute: ComputeGranularity, tdr: TdrConfig) -> SystemConfig {
    SystemConfig {
        gpu: GpuConfig { preemption: PreemptionCaps { compute, ..PreemptionCaps::default() }, ..GpuConfig::default() },
        tdr,
        ..SystemConfig::default()
    }
}

/// A process killed while a thread of it was blocked in a CPU fence wait takes the wait with
/// it: the kernel's census counts none afterwards. Before the fix
/// the waits' entries stayed forever (the census checker's "holds N waits").
#[test]
fn a_process_killed_in_its_waits_leaves_no_wait_behind() {
    let sys = common::sim();
    let base = sys.census();
    let port = sys.open_process().unwrap();
    let pid = port.process();
    let c = common::client_on(port.clone());
    let fence = c.device.create_fence(0, NativeFenceType::Default).unwrap();
    let fence_wait = sys.begin_fence_wait(pid, &[(fence.handle(), 5)], WaitMode::All).unwrap();
    assert!(fence_wait.is_some(), "the fence is at 0: the wait blocks");
    assert_eq!(sys.census().waits, base.waits + 1);
    // The process dies; its thread never ends its wait.
    port.terminate(Termination::Abnormal);
    drop((fence_wait, fence, c));
    let after = sys.census();
    assert_eq!(after.waits, base.waits, "no wait outlives its process");
    assert_eq!(after.processes, base.processes);
}

/// A submission whose doorbell was disconnected (the device went to D3) and whose reconnect
/// fails is published, not refused: `submit` says so with the command buffer's progress value
/// (`UmdError::NotRung`), and the work runs once the queue rings again (`Queue::ring`). Before the fix the error
/// read as a refused submission whose work then ran anyway (the swarm's exactly-once checker:
/// "completion of a command buffer never submitted").
#[test]
fn a_failed_reconnect_after_publishing_reports_the_published_value_and_the_work_runs() {
    let sys = common::sim();
    let c = common::client(&sys);
    let mut q = c.user_queue();
    let mut cb = umd::CommandBuffer::new();
    cb.write_u32(c.buf.va(), 1);
    q.finish(common::T).unwrap();
    sys.enter_d3().unwrap();
    assert_eq!(q.doorbell_status().unwrap(), abi::DoorbellStatus::DisconnectedRetry);
    sys.inject_ddi_fault(kernel::ddi::DdiFault { ddi: kernel::ddi::DdiKind::ConnectDoorbell, call: 1 });
    let value = match q.submit(&cb) {
        Err(umd::UmdError::NotRung { value, .. }) => value,
        other => panic!("expected NotRung, got {other:?}"),
    };
    assert_eq!(value, 1);
    assert_eq!(q.last_submitted(), 1, "the value is taken");
    q.ring().unwrap();
    assert_eq!(q.reconnects(), 1);
    q.wait(value, common::T).unwrap();
    assert_eq!(c.buf.read_u32(0).unwrap(), 1);
    // The next submission goes on from there.
    cb.clear();
    cb.write_u32(c.buf.va(), 2);
    assert_eq!(q.submit(&cb).unwrap(), 2);
}

/// A lost device stops its queues even where the engine cannot preempt them: under
/// `ComputeGranularity::None` a queue leaves its slot only when it runs dry, so the context
/// suspension of a device lost is not answered while work is queued, and the kernel resets the
/// queue instead (`DxgkDdiResetQueue` with `DeviceLost`). Nothing published before the loss runs
/// after it: the client, told `DisconnectedAbort`, counts that work lost. Before the fix the
/// queue ran its whole ring after the loss (the swarm's exactly-once checker, seed 117: the
/// adapter's fatal recovery lost every device while a queue drained a long backlog).
#[test]
fn a_lost_device_runs_nothing_more_even_where_its_engine_cannot_preempt() {
    use kernel::trace::{Ddi, Event};
    use std::time::Duration;

    let sys = common::sim_with(compute_preemption(ComputeGranularity::None, TdrConfig::default()));
    let c = common::client(&sys);
    let mut q = c.user_queue();
    let mut long = umd::CommandBuffer::new();
    long.synthetic(5_000_000);
    q.submit(&long).unwrap();
    let mut late = umd::CommandBuffer::new();
    late.write_u32(c.buf.va(), 0xbad);
    q.submit(&late).unwrap();
    sys.run_for(Duration::from_millis(1));
    assert_eq!(q.completed(), 0, "the long command buffer is running");
    let before = common::events(&sys).len();
    sys.mark_device_error(c.port.process(), c.device.handle()).unwrap();
    sys.run_for(Duration::from_millis(50));
    assert_eq!(c.buf.read_u32(0).unwrap(), 0, "the command buffer published before the loss never ran");
    assert_eq!(q.completed(), 0);
    assert_eq!(q.doorbell_status().unwrap(), abi::DoorbellStatus::DisconnectedAbort);
    assert_eq!(q.status().unwrap().state, abi::QueueState::Hung);
    // The suspension first (the spec's stop), then the reset for the queue that did not stop.
    let evs = common::events_from(&sys, before);
    let suspend = evs.iter().position(|e| matches!(e, Event::Ddi(Ddi::SuspendContext(_))));
    let reset = evs.iter().position(|e| matches!(e, Event::Ddi(Ddi::ResetQueue(h)) if *h == q.handle()));
    assert!(suspend.is_some() && suspend < reset, "{evs:#?}");
    assert!(!evs.iter().any(|e| matches!(e, Event::Ddi(Ddi::ResetFromTimeout))), "no adapter reset: {evs:#?}");
}

/// Realtime queues blocked in a `WAIT` on a high-priority queue's signal let it have the
/// engine's only slot, even while the hang timer checks them (a preemption request and a
/// resume each time: they make no progress), and then run. A guard beside the swarm's seeds
/// 408 and 1519 (`sim`'s `seeds_that_found_bugs_pass_now`), which starved the queue they waited
/// for: the check's resume made each sleeping queue a waiter for a slot again, and a queue
/// given its slot back that blocked on the same `WAIT` held it to its quantum's end. (This
/// smaller world passed before the fix too: the seeds need more going on at once.)
#[test]
fn realtime_queues_blocked_on_a_lower_priority_queue_let_it_run_through_hang_checks() {
    use abi::Priority;
    use std::time::Duration;

    let cfg = SystemConfig {
        gpu: GpuConfig {
            hw_slots: 1,
            preemption: PreemptionCaps { compute: ComputeGranularity::Thread, ..PreemptionCaps::default() },
            ..GpuConfig::default()
        },
        tdr: TdrConfig { hang_compute: Some(Duration::from_millis(3)), ..TdrConfig::default() },
        ..SystemConfig::default()
    };
    let sys = common::sim_with(cfg);
    let c = common::client(&sys);
    let opts = |priority| umd::QueueOptions { priority, ..umd::QueueOptions::user_mode() };
    let mut waiters: Vec<umd::Queue> = (0..8).map(|_| c.ctx.create_queue(opts(Priority::Realtime)).unwrap()).collect();
    let fence = c.device.create_fence(0, abi::port::NativeFenceType::Default).unwrap();
    for (k, q) in waiters.iter_mut().enumerate() {
        let mut cb = umd::CommandBuffer::new();
        cb.wait_fence(&fence, 1).write_u32(c.buf.va() + 4 * k as u64, 1);
        q.submit(&cb).unwrap();
    }
    // Long enough for several of the hang timer's checks of the blocked queues.
    sys.run_for(Duration::from_millis(40));
    let checks = common::events(&sys)
        .iter()
        .filter(|e| matches!(e, kernel::trace::Event::Ddi(kernel::trace::Ddi::PreemptQueue(_))))
        .count();
    assert!(checks >= 8, "the hang timer checked the blocked queues ({checks} requests)");
    let mut high = c.ctx.create_queue(opts(Priority::High)).unwrap();
    let mut cb = umd::CommandBuffer::new();
    cb.signal_fence(&fence, 1);
    let v = high.submit(&cb).unwrap();
    high.wait(v, Some(Duration::from_millis(20))).expect("the high-priority queue gets the slot");
    for (k, q) in waiters.iter_mut().enumerate() {
        q.wait(1, common::T).unwrap();
        assert_eq!(c.buf.read_u32(4 * k as u64).unwrap(), 1);
    }
}

/// A process that opened another's shared fence and then lost its device (killed, say)
/// leaves the fence to its creator: its own waiters end with `DeviceLost`, but the value is
/// the creator's. Before the fix the consumer's device error wrote AlwaysSignaled into the
/// shared value, so the producer's CPU waiter woke as if its value were reached, and the
/// producer's next GPU signal took the fence from `u64::MAX` back down (first seen by the
/// swarm's `cpu-wait`: "a CPU wait for fence value 79 returned with the fence at 9"; on the
/// current draw seed 56, `monotone-fence`: "its signal fence read 1 after 18446744073709551615").
#[test]
fn a_consumer_that_loses_its_device_leaves_its_producers_shared_fence_alone() {
    let sys = common::sim();
    let producer = common::client(&sys);
    let consumer = common::client(&sys);
    let desc =
        abi::port::NativeFenceDesc { shareable: true, ..abi::port::NativeFenceDesc::new(0, NativeFenceType::Default) };
    let made = producer.device.create_fence_with(&desc).unwrap();
    let opened = consumer.device.open_fence(made.global().expect("shareable")).unwrap();
    made.signal(1).unwrap();
    let (p, c) = (producer.port.process(), consumer.port.process());
    let producer_wait = sys.begin_fence_wait(p, &[(made.handle(), 2)], WaitMode::All).unwrap().expect("blocks at 1");
    let consumer_wait = sys.begin_fence_wait(c, &[(opened.handle(), 2)], WaitMode::All).unwrap().expect("blocks at 1");
    sys.mark_device_error(c, consumer.device.handle()).unwrap();
    assert!(
        matches!(consumer_wait.result(), Some(Err(abi::port::KernelError::DeviceLost { .. }))),
        "the consumer's waiter learns its device is lost: {:?}",
        consumer_wait.result()
    );
    assert_eq!(made.value().unwrap(), 1, "the shared value is still the producer's");
    assert!(producer_wait.result().is_none(), "the producer's waiter still waits");
    // The producer goes on signalling, and its waiter wakes at its value.
    let mut q = producer.user_queue();
    let mut cb = umd::CommandBuffer::new();
    cb.signal_fence(&made, 2);
    let v = q.submit(&cb).unwrap();
    q.wait(v, common::T).unwrap();
    assert_eq!(made.value().unwrap(), 2);
    assert_eq!(sys.end_fence_wait(p, &producer_wait), Ok(abi::port::WaitOutcome::Reached(0)));
    assert!(sys.end_fence_wait(c, &consumer_wait).is_err());
}

/// A TDR takes the guilty queue's whole device with it: the device's fences go AlwaysSignaled
/// (`u64::MAX`), so a queue of that device left running would signal them back down. Before
/// the fix its other queues ran on after the reset (the swarm's seed 19, `monotone-fence`: "its
/// signal fence read 65 after 18446744073709551615"); now they are lost with the device, and
/// another process's queue on the same engine runs on.
#[test]
fn a_tdr_loses_the_guilty_queue_s_whole_device_so_its_fences_never_fall_back() {
    use abi::port::{FENCE_ALWAYS_SIGNALED, NativeFenceType};
    use abi::queue::FaultKind;
    use std::time::Duration;
    use umd::CommandBuffer;

    let tdr = TdrConfig { delay: Duration::from_millis(100), ..TdrConfig::default() };
    let sys = common::sim_with(compute_preemption(ComputeGranularity::Dispatch, tdr));
    let c = common::client(&sys);
    // The guilty queue: an endless kernel that cannot be cut.
    let (hog, _spin) = c.endless_queue();
    // Its sibling on the same device: signals 1, then waits on memory before signalling 2.
    let fence = c.device.create_fence(0, NativeFenceType::Default).unwrap();
    let mut sibling = c.user_queue();
    let mut cb = CommandBuffer::new();
    cb.signal_fence(&fence, 1).wait(c.buf.va() + 256, 1).signal_fence(&fence, 2);
    sibling.submit(&cb).unwrap();
    // Another process on the same engine.
    let n = common::client(&sys);
    let mut other = n.user_queue();
    sys.run_for(Duration::from_millis(20));
    assert_eq!(fence.value().unwrap(), 1, "the sibling ran up to its WAIT");
    sys.preempt_queue(c.port.process(), hog.handle()).unwrap();
    sys.run_for(Duration::from_millis(300));
    assert_eq!(hog.status().unwrap().state, abi::QueueState::Hung, "the TDR hung the guilty queue");
    assert_eq!(fence.value().unwrap(), FENCE_ALWAYS_SIGNALED, "its device's fences are AlwaysSignaled");
    // The sibling's WAIT would pass now: nothing of the lost device may run it.
    c.buf.write_u64(256, 1).unwrap();
    sys.run_for(Duration::from_millis(50));
    assert_eq!(fence.value().unwrap(), FENCE_ALWAYS_SIGNALED, "no queue of the lost device signals it back down");
    let st = sibling.status().unwrap();
    assert_eq!(st.state, abi::QueueState::Hung);
    assert!(matches!(st.fault.as_ref().map(|f| &f.kind), Some(FaultKind::DeviceLost)), "{st:?}");
    // Another process's queue keeps the engine.
    let mut cb = CommandBuffer::new();
    cb.write_u32(n.buf.va(), 7);
    let v = other.submit(&cb).unwrap();
    other.wait(v, common::T).unwrap();
    assert_eq!(n.buf.read_u32(0).unwrap(), 7);
}
