//! A submission loop written by hand on [`umd::lowlevel::UserQueue`], against the embedded
//! deterministic system: packets and a progress fence into the ring, last-queued, wptr, ring,
//! the doorbell status acted on (`DisconnectedRetry` → reconnect, `ConnectedNotify` →
//! notify, `DisconnectedAbort` → lost), and the results checked in memory.

use std::sync::atomic::Ordering;
use std::time::Duration;

use abi::packet::progress_fence_words;
use abi::port::{LostReason, PhysicalDoorbell, QueueStatus};
use abi::{DoorbellStatus, EngineKind, Priority, QueueState};
use kernel::{System, SystemConfig};
use umd::lowlevel::UserQueue;
use umd::{Buffer, CommandBuffer, Context, Device, UmdError};

const T: Option<Duration> = Some(Duration::from_secs(1));
const RING: u64 = 4096;

#[path = "../examples/lowlevel_loop/hand_loop.rs"]
mod hand_loop;

/// The loop under test is the one the `lowlevel_loop` example teaches.
use hand_loop::HandLoop as MyLoop;

fn setup(cfg: SystemConfig) -> (System, Device, Context, Buffer) {
    let sys = System::sim(cfg).unwrap();
    let device = Device::open(sys.open_process().unwrap()).unwrap();
    let ctx = device.create_context(device.engine(EngineKind::Compute).unwrap()).unwrap();
    let out = device.allocate(1 << 16).unwrap();
    (sys, device, ctx, out)
}

#[test]
fn a_hand_written_loop_runs_wraps_and_reconnects_after_victimization() {
    let (sys, _device, ctx, out) = setup(SystemConfig { doorbell_pool: Some(1), ..SystemConfig::default() });
    let q = UserQueue::create(&ctx, RING, Priority::Normal).unwrap();
    // Created, not connected: the dummy page, no physical doorbell.
    assert_eq!(q.doorbell_status().unwrap(), DoorbellStatus::DisconnectedRetry);
    assert_eq!(q.physical_doorbell().unwrap(), None);
    assert_eq!(q.ring().bytes(), RING);
    let mut a = MyLoop::new(q);

    // The first ring finds the doorbell disconnected: the loop connects and rings again.
    let mut cb = CommandBuffer::new();
    cb.write_u32(out.va(), 0xa1);
    let v = a.submit(&cb).unwrap();
    assert_eq!(a.seen, [DoorbellStatus::DisconnectedRetry, DoorbellStatus::Connected]);
    let held = a.q.physical_doorbell().unwrap().expect("connected");
    assert!(matches!(held, PhysicalDoorbell::BarIndex(_)));
    a.q.wait_progress(v, T).unwrap();
    assert_eq!(out.read_u32(0).unwrap(), 0xa1);
    // What the loop wrote is in memory: last-queued, wptr, the packets at ring offset 0; the
    // engine read all of it.
    let c = a.q.control();
    assert_eq!((c.last_queued().load(Ordering::Acquire), c.wptr().load(Ordering::Acquire)), (v, a.wptr));
    assert_eq!(c.rptr().load(Ordering::Acquire), a.wptr);
    let mut ring = vec![0; cb.len()];
    a.q.ring().read(0, &mut ring).unwrap();
    assert_eq!(ring, cb.words());
    assert_eq!(a.q.completed(), v);

    // Another queue takes the only physical doorbell: ours is victimized.
    let b = UserQueue::create(&ctx, RING, Priority::Normal).unwrap();
    b.connect().unwrap();
    assert_eq!(b.physical_doorbell().unwrap(), Some(held));
    assert_eq!(a.q.physical_doorbell().unwrap(), None);
    assert_eq!(a.q.doorbell_status().unwrap(), DoorbellStatus::DisconnectedRetry);
    let mut b = MyLoop::new(b);

    // Both submit, alternately, past the end of the ring several times; every submission
    // takes the doorbell back from the other, and nothing is lost.
    for i in 1..=100u32 {
        for (k, l) in [&mut a, &mut b].into_iter().enumerate() {
            let mut cb = CommandBuffer::new();
            cb.write_u32(out.va() + 4 + 4 * k as u64, i).write_u32(out.va() + 64 + 4 * (i as u64 % 1000), i);
            l.submit(&cb).unwrap();
        }
    }
    for l in [&a, &b] {
        l.q.wait_progress(l.value, T).unwrap();
        assert_eq!(l.q.completed(), l.value);
        assert_eq!(l.q.control().rptr().load(Ordering::Acquire), l.wptr);
        assert!(l.wptr > RING, "the ring wrapped");
        assert_eq!(
            l.q.status().unwrap(),
            QueueStatus {
                state: l.q.status().unwrap().state,
                fault: None,
                completed: l.value,
                last_queued: l.value,
                flags: 0,
                guilty: false
            }
        );
    }
    assert_eq!((out.read_u32(4).unwrap(), out.read_u32(8).unwrap()), (100, 100));
    for i in 1..=100u64 {
        assert_eq!(out.read_u32(64 + 4 * i).unwrap(), i as u32);
    }
    // a: its first connect, then once per round; b: once per round (its first connect was
    // explicit). Every connect but a's first victimized the other.
    assert_eq!((a.reconnects, b.reconnects), (101, 100));
    assert_eq!(sys.stats().victimizations, 1 + 100 + 100);
}

#[test]
fn connected_notify_asks_the_loop_to_notify() {
    let (_sys, _device, ctx, out) = setup(SystemConfig { notify_on_submit: true, ..SystemConfig::default() });
    let q = UserQueue::create(&ctx, RING, Priority::High).unwrap();
    q.connect().unwrap();
    assert_eq!(q.doorbell_status().unwrap(), DoorbellStatus::ConnectedNotify);
    let mut l = MyLoop::new(q);
    for i in 0..3u32 {
        let mut cb = CommandBuffer::new();
        cb.write_u32(out.va() + 4 * u64::from(i), i + 1);
        let v = l.submit(&cb).unwrap();
        l.q.wait_progress(v, T).unwrap();
    }
    assert_eq!((l.notifies, l.reconnects), (3, 0));
    assert_eq!([out.read_u32(0).unwrap(), out.read_u32(4).unwrap(), out.read_u32(8).unwrap()], [1, 2, 3]);
}

#[test]
fn a_faulted_queue_aborts_its_doorbell_and_the_loop_reports_the_fault() {
    let (_sys, _device, ctx, out) = setup(SystemConfig::default());
    let q = UserQueue::create(&ctx, RING, Priority::Normal).unwrap();
    q.connect().unwrap();
    let mut l = MyLoop::new(q);
    let mut cb = CommandBuffer::new();
    cb.write_u32(0xdead_0000, 1); // outside every mapping
    let v = l.submit(&cb).unwrap();
    let e = l.q.wait_progress(v, T).unwrap_err();
    assert!(matches!(e, UmdError::QueueLost { .. }), "{e}");
    assert_eq!(l.q.doorbell_status().unwrap(), DoorbellStatus::DisconnectedAbort);
    let mut cb = CommandBuffer::new();
    cb.write_u32(out.va(), 1);
    match l.submit(&cb).unwrap_err() {
        UmdError::QueueLost { queue, reason: LostReason::Fault(f) } => {
            assert_eq!(queue, l.q.handle());
            assert_eq!(Some(f), l.q.status().unwrap().fault);
        }
        other => panic!("expected a fault, got {other:?}"),
    }
    assert_eq!(l.seen.last(), Some(&DoorbellStatus::DisconnectedAbort));
    assert_eq!(l.q.status().unwrap().state, QueueState::Hung);
    assert_eq!(out.read_u32(0).unwrap(), 0, "nothing after the fault ran");
}

/// Issue 27, deterministically: a submission that faults may be reported lost by its own
/// submission loop, not only by the wait for it. The loop finds its doorbell disconnected
/// (the engine idled into F1) and connects; the connect re-reads wptr and hands the work to
/// the engine, which (the live firmware thread needs no invitation: here settling the device stands for
/// it) runs it and faults before the loop rings again; that ring reads `DisconnectedAbort`,
/// and the loss carries the queue's own record. The fault is charged to that queue of that
/// process only: another process's queue, created after it, runs its own work.
#[test]
fn a_fault_run_by_the_reconnect_is_reported_by_the_next_ring_and_charged_to_its_own_queue() {
    let idle = Duration::from_millis(2);
    let cfg = SystemConfig {
        gpu: gpu::GpuConfig { idle_period: idle, ..gpu::GpuConfig::default() },
        ..SystemConfig::default()
    };
    let sys = System::sim(cfg).unwrap();
    let a = Device::open(sys.open_process().unwrap()).unwrap();
    let b = Device::open(sys.open_process().unwrap()).unwrap();
    let a_buf = a.allocate(4096).unwrap();
    a_buf.write(0, &0x1234u32.to_le_bytes()).unwrap();
    let bctx = b.create_context(b.engine(EngineKind::Compute).unwrap()).unwrap();
    let bq = UserQueue::create(&bctx, RING, Priority::Normal).unwrap();
    bq.connect().unwrap();
    // The engine idles into F1: the OS disconnects its doorbells.
    sys.run_for(idle * 10);
    assert_eq!(bq.doorbell_status().unwrap(), DoorbellStatus::DisconnectedRetry);
    // B's submission: an address mapped nowhere in B (A's buffer's, plus 2^40).
    let stray = a_buf.va() + (1 << 40);
    let mut cb = CommandBuffer::new();
    cb.write_u32(stray, 0xbad);
    let fence = progress_fence_words(1);
    let plan = bq.ring().plan(0, (cb.len() + fence.len()) as u64).unwrap();
    abi::protocol::announce_last_queued(bq.control().last_queued(), 1);
    bq.ring().write(0, &plan, &[cb.words(), &fence]).unwrap();
    assert_eq!(bq.ring_doorbell(plan.new_wptr).unwrap(), DoorbellStatus::DisconnectedRetry);
    bq.connect().unwrap();
    // The engine runs what the connect found, and faults, before the loop rings again.
    sys.settle();
    assert_eq!(bq.ring_doorbell(plan.new_wptr).unwrap(), DoorbellStatus::DisconnectedAbort);
    match bq.lost() {
        UmdError::QueueLost { queue, reason: LostReason::Fault(f) } => {
            assert_eq!(queue, bq.handle());
            assert!(
                matches!(f.kind, abi::queue::FaultKind::OutsideMappings { va, access: abi::queue::Access::Write, .. } if va == stray),
                "{f}"
            );
        }
        other => panic!("expected B's fault, got {other:?}"),
    }
    // A's queue, created after: untouched by B's fault, runs A's work.
    let actx = a.create_context(a.engine(EngineKind::Compute).unwrap()).unwrap();
    let mut aq = MyLoop::new(UserQueue::create(&actx, RING, Priority::Normal).unwrap());
    let mut cb = CommandBuffer::new();
    cb.write_u32(a_buf.va(), 0x5678);
    let v = aq.submit(&cb).unwrap();
    aq.q.wait_progress(v, T).unwrap();
    assert_eq!(a_buf.read_u32(0).unwrap(), 0x5678);
    assert_eq!(aq.q.status().unwrap().fault, None);
    assert_eq!(sys.stats().faults, 1);
}

/// Work published while the doorbell is disconnected runs once it connects: the kernel
/// re-reads wptr on connect, so a loop may publish first and connect after.
#[test]
fn work_published_before_the_first_connect_runs_on_connect() {
    let (_sys, _device, ctx, out) = setup(SystemConfig::default());
    let q = UserQueue::create(&ctx, RING, Priority::Normal).unwrap();
    let mut cb = CommandBuffer::new();
    cb.write_u32(out.va(), 0x77);
    let fence = progress_fence_words(1);
    let plan = q.ring().plan(0, (cb.len() + fence.len()) as u64).unwrap();
    q.control().last_queued().store(1, Ordering::Release);
    q.ring().write(0, &plan, &[cb.words(), &fence]).unwrap();
    // Rung on the dummy page: nobody hears it.
    assert_eq!(q.ring_doorbell(plan.new_wptr).unwrap(), DoorbellStatus::DisconnectedRetry);
    assert_eq!(q.doorbell().word().get().load(Ordering::Acquire), plan.new_wptr, "the dummy page took the ring");
    assert_eq!(q.completed(), 0);
    q.connect().unwrap();
    q.wait_progress(1, T).unwrap();
    assert_eq!(out.read_u32(0).unwrap(), 0x77);
    assert_eq!(q.doorbell().method(), abi::doorbell::RingMethod::WriteWptr);
}

#[test]
fn a_too_large_stream_is_refused_with_the_ring_size() {
    let (_sys, _device, ctx, _out) = setup(SystemConfig::default());
    let q = UserQueue::create(&ctx, RING, Priority::Normal).unwrap();
    match q.ring().plan(0, RING / 4).unwrap_err() {
        UmdError::TooLarge { dwords, ring_bytes, max } => assert_eq!((dwords, ring_bytes, max), (1024, RING, 512)),
        other => panic!("{other:?}"),
    }
}

/// Creation refused at each of its steps — a ring size the kernel refuses, each GPU mapping
/// (ring, ring control, kernel page), the device's queue creation — leaves nothing behind;
/// dropping a created queue returns everything.
#[test]
fn a_failed_create_leaves_nothing_behind_and_drop_returns_everything() {
    use abi::port::{Invalid, KernelError};
    use kernel::ddi::{DdiFault, DdiKind};
    let (sys, _device, ctx, _out) = setup(SystemConfig::default());
    let before = sys.census();
    match UserQueue::create(&ctx, 3000, Priority::Normal) {
        Err(UmdError::Kernel(KernelError::InvalidArgument { reason: Invalid::RingSize(why), .. })) => {
            assert_eq!(why, abi::ring::RingSizeError::NotPowerOfTwo)
        }
        Err(other) => panic!("{other:?}"),
        Ok(_) => panic!("a 3000-byte ring was accepted"),
    }
    assert_eq!(sys.census(), before);
    let faults = (1..=3).map(|call| DdiFault { ddi: DdiKind::MapGpu, call });
    for fault in faults.chain([DdiFault { ddi: DdiKind::CreateHwQueue, call: 1 }]) {
        sys.inject_ddi_fault(fault);
        let e = UserQueue::create(&ctx, RING, Priority::Normal).err().expect("the injected fault refuses it");
        assert!(matches!(e, UmdError::Kernel(KernelError::InvalidArgument { field: "device", .. })), "{e}");
        assert_eq!(sys.census(), before, "{fault:?}: nothing may stay behind");
    }
    let q = UserQueue::create(&ctx, RING, Priority::Normal).unwrap();
    q.connect().unwrap();
    let during = sys.census();
    assert_eq!((during.queues, during.doorbells), (before.queues + 1, before.doorbells + 1));
    assert_eq!(during.allocations, before.allocations + 2, "ring and ring control");
    drop(q);
    assert_eq!(sys.census(), before);
}

#[test]
fn queue_reconnect_takes_the_doorbell_back_after_victimization_and_is_refused_for_kernel_mode() {
    let (_sys, _device, ctx, out) = setup(SystemConfig { doorbell_pool: Some(1), ..SystemConfig::default() });
    let mut a = ctx.create_queue(umd::QueueOptions::user_mode()).unwrap();
    let b = ctx.create_queue(umd::QueueOptions::user_mode()).unwrap();
    // b's connect took the only physical doorbell from a.
    assert_eq!(a.doorbell_status().unwrap(), DoorbellStatus::DisconnectedRetry);
    assert_eq!(b.doorbell_status().unwrap(), DoorbellStatus::Connected);
    a.reconnect().unwrap();
    assert_eq!(a.doorbell_status().unwrap(), DoorbellStatus::Connected);
    assert_eq!(b.doorbell_status().unwrap(), DoorbellStatus::DisconnectedRetry);
    assert_eq!(a.reconnects(), 1);
    // Connected already: the submission needs no reconnect of its own.
    let mut cb = CommandBuffer::new();
    cb.write_u32(out.va(), 0x5a);
    let v = a.submit(&cb).unwrap();
    a.wait(v, T).unwrap();
    assert_eq!((out.read_u32(0).unwrap(), a.reconnects()), (0x5a, 1));

    let mut k = ctx.create_queue(umd::QueueOptions::kernel_mode()).unwrap();
    let e = k.reconnect().unwrap_err();
    assert!(
        matches!(e, UmdError::Kernel(abi::port::KernelError::WrongQueueMode { queue, .. }) if queue == k.handle()),
        "{e}"
    );
    assert_eq!(k.reconnects(), 0);
}
