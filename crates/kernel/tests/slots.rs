//! Hardware slots and oversubscription: more queues than slots are mapped by priority and
//! time-sliced by quantum; realtime evicts at once; kernel queues keep their slots; nothing
//! is lost.

mod common;

use std::time::Duration;

use abi::{Priority, QueueState};
use kernel::SystemConfig;
use umd::{CommandBuffer, QueueOptions};

const T: Option<Duration> = Some(Duration::from_millis(100));

fn slotted(n: u32) -> kernel::System {
    common::sim_with(SystemConfig {
        gpu: gpu::GpuConfig { hw_slots: n, ..gpu::GpuConfig::default() },
        ..SystemConfig::default()
    })
}

fn queue(c: &common::Client, priority: Priority) -> umd::Queue {
    c.ctx.create_queue(QueueOptions { priority, ..QueueOptions::user_mode() }).unwrap()
}

/// A command buffer that holds its queue (and its slot) until the CPU writes `flag`.
fn held(c: &common::Client, flag: u64, then: u64) -> CommandBuffer {
    let mut cb = CommandBuffer::new();
    cb.wait(c.buf.va() + flag, 1).write_u32(c.buf.va() + then, 1);
    cb
}

#[test]
fn more_queues_than_slots_all_finish() {
    let sys = slotted(2);
    let c = common::client(&sys);
    let mut qs: Vec<umd::Queue> = (0..6).map(|_| queue(&c, Priority::Normal)).collect();
    let mut vs = Vec::new();
    for (i, q) in qs.iter_mut().enumerate() {
        let mut cb = CommandBuffer::new();
        for k in 0..50u32 {
            cb.write_u32(c.buf.va() + 4 * i as u64, k);
        }
        vs.push(q.submit(&cb).unwrap());
    }
    for (q, v) in qs.iter().zip(vs) {
        q.wait(v, T).unwrap();
    }
    for i in 0..6 {
        assert_eq!(c.buf.read_u32(4 * i).unwrap(), 49);
    }
    let mapped = qs.iter().filter(|q| q.status().unwrap().state == QueueState::Mapped).count();
    assert!(mapped <= 2, "at most two hold slots: {mapped}");
}

#[test]
fn a_higher_priority_queue_evicts_a_lower_one_at_once() {
    let sys = slotted(1);
    let c = common::client(&sys);
    let mut low = queue(&c, Priority::Normal);
    let mut hi = queue(&c, Priority::Realtime);
    low.submit(&held(&c, 0x100, 0x108)).unwrap(); // holds the only slot, blocked
    sys.settle();
    assert_eq!(low.status().unwrap().state, QueueState::Mapped);
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va(), 0x77);
    let v = hi.submit(&cb).unwrap();
    sys.step(); // one round: the realtime queue takes the slot and runs
    assert_eq!(hi.completed(), v, "ran in the same round, without waiting for a quantum");
    assert_eq!(low.status().unwrap().state, QueueState::Preempted, "evicted with work left");
    // The low queue gets its slot back and finishes once released.
    c.buf.write_u64(0x100, 1).unwrap();
    low.finish(T).unwrap();
    assert_eq!(c.buf.read_u32(0x108).unwrap(), 1);
}

#[test]
fn equal_priorities_share_a_slot_by_quantum() {
    let sys = slotted(1);
    let a = common::client(&sys);
    let b = common::client(&sys);
    let mut qa = queue(&a, Priority::Normal);
    let mut qb = queue(&b, Priority::Normal);
    // A busy kernel of ten process quanta (a queue blocked in a WAIT would give its slot up
    // at once: see below).
    let mut cb = CommandBuffer::new();
    cb.synthetic(100_000_000).write_u32(a.buf.va() + 0x108, 1);
    let va = qa.submit(&cb).unwrap();
    sys.run_for(Duration::from_micros(100));
    let mut cb = CommandBuffer::new();
    cb.write_u32(b.buf.va(), 0x55);
    let v = qb.submit(&cb).unwrap();
    sys.run_for(Duration::from_millis(1));
    assert_eq!(qb.completed(), 0, "within A's quantum, B waits");
    assert_eq!(qb.status().unwrap().state, QueueState::Unmapped);
    // No hand-advanced clock: the quantum expiry is a device timer, so the blocked wait's
    // clock jumps to it, and not past it.
    let before = sys.now();
    qb.wait(v, T).unwrap();
    let quantum = gpu::GpuConfig::default().process_quantum;
    // Its two packets (the write and the progress fence) end after their modelled cost, when
    // the fence's interrupt reaches the kernel.
    let work = 2 * gpu::CostModel::default().packet;
    let waited = sys.now().since(before);
    assert!(waited <= quantum + work, "served at A's quantum expiry, {waited:?} later");
    assert_eq!(b.buf.read_u32(0).unwrap(), 0x55);
    // B ran while A — busy, never idle — still wanted the only slot: A was evicted when its
    // quantum ran out (and, B being idle again, has since got it back).
    assert_eq!(a.buf.read_u32(0x108).unwrap(), 0, "A has not finished");
    assert_ne!(qa.status().unwrap().state, QueueState::Hung);
    qa.wait(va, Some(Duration::from_millis(200))).unwrap();
    assert_eq!(a.buf.read_u32(0x108).unwrap(), 1);
}

/// Spec 003: a `WAIT` that does not pass is preemptible. A consumer blocked on its producer
/// gives the producer its slot, even at a higher priority, sleeps off the slot until the
/// producer's signal lets its `WAIT` pass, then takes the slot back (its priority counts again)
/// and resumes at the `WAIT`, running nothing twice. Before, the blocked consumer kept the only
/// slot and the lower-priority producer never got one: neither finished. Checked for a `WAIT`
/// on plain memory (re-checked at every step) and on a native fence (re-checked when a fence
/// may have changed).
#[test]
fn a_consumer_blocked_on_its_producer_gives_it_the_slot() {
    for fence in [false, true] {
        let sys = slotted(1);
        let c = common::client(&sys);
        let mut consumer = queue(&c, Priority::High);
        let mut producer = queue(&c, Priority::Normal);
        let native = c.device.create_fence(0, abi::port::NativeFenceType::Default).unwrap();
        let flag = c.buf.va() + 0x100;
        let mut cb = CommandBuffer::new();
        cb.write_u32(c.buf.va() + 0x10, 1);
        if fence {
            cb.wait_fence(&native, 1)
        } else {
            cb.wait(flag, 1)
        };
        cb.write_u32(c.buf.va() + 0x18, 1);
        let cv = consumer.submit(&cb).unwrap();
        sys.settle();
        assert_eq!(consumer.status().unwrap().state, QueueState::Mapped, "{fence}: it holds the only slot");
        assert_eq!(c.buf.read_u32(0x10).unwrap(), 1, "{fence}: it ran up to its WAIT");
        // Cleared by the CPU: were the consumer restarted rather than resumed, it would be 1.
        c.buf.write(0x10, &0u32.to_le_bytes()).unwrap();
        let mut cb = CommandBuffer::new();
        cb.synthetic(50_000).write_u32(c.buf.va() + 0x20, 1);
        if fence {
            cb.signal_fence(&native, 1)
        } else {
            cb.write_u64(flag, 1)
        };
        let pv = producer.submit(&cb).unwrap();
        producer.wait(pv, T).unwrap();
        consumer.wait(cv, T).unwrap();
        assert_eq!(c.buf.read_u32(0x18).unwrap(), 1, "{fence}");
        // The firmware log: the consumer stopped at its WAIT, the producer ran, then the
        // consumer was restored at the WAIT.
        let log = sys.with_gpu(|g| g.firmware_log());
        let saved = log
            .iter()
            .position(|e| matches!(e.event, gpu::FwEvent::StateSaved { point: abi::preempt::StopPoint::Packet, .. }))
            .unwrap_or_else(|| panic!("{fence}: {log:?}"));
        let gpu::FwEvent::StateSaved { queue: consumer_id, .. } = log[saved].event else { unreachable!() };
        let requested = log.iter().position(|e| {
            matches!(e.event, gpu::FwEvent::PreemptRequested { queue, by: gpu::Requester::Scheduler, .. } if queue == consumer_id)
        });
        let restored = log.iter().position(
            |e| matches!(e.event, gpu::FwEvent::Restored { queue, point: abi::preempt::StopPoint::Packet } if queue == consumer_id),
        );
        assert!(requested < Some(saved) && Some(saved) < restored, "{fence}: {log:?}");
        assert_eq!(c.buf.read_u32(0x10).unwrap(), 0, "{fence}: nothing before the WAIT ran twice");
    }
}

#[test]
fn kernel_queues_keep_their_slots() {
    let sys = slotted(2);
    let c = common::client(&sys);
    let kq = c.kernel_queue(); // mapped first, never evicted for a user queue
    let mut qs: Vec<umd::Queue> = (0..3).map(|_| queue(&c, Priority::Realtime)).collect();
    for (i, q) in qs.iter_mut().enumerate() {
        let mut cb = CommandBuffer::new();
        cb.write_u32(c.buf.va() + 4 * i as u64, 9);
        q.submit(&cb).unwrap();
    }
    for q in &qs {
        q.finish(T).unwrap();
        assert!(kq.status().unwrap().state == QueueState::Mapped, "the kernel queue kept its slot");
    }
    assert_eq!((0..3).map(|i| c.buf.read_u32(4 * i).unwrap()).collect::<Vec<_>>(), [9, 9, 9]);
}
