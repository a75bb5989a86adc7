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
    qa.submit(&held(&a, 0x100, 0x108)).unwrap();
    sys.settle();
    let mut cb = CommandBuffer::new();
    cb.write_u32(b.buf.va(), 0x55);
    let v = qb.submit(&cb).unwrap();
    sys.settle();
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
    // B ran while A — blocked, never idle — still wanted the only slot: A was evicted when its
    // quantum ran out (and, B being idle again, has since got it back).
    assert_eq!(a.buf.read_u32(0x108).unwrap(), 0, "A has not finished");
    assert_ne!(qa.status().unwrap().state, QueueState::Hung);
    a.buf.write_u64(0x100, 1).unwrap();
    qa.finish(T).unwrap();
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
