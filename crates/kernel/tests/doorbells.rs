//! Doorbell virtualization: dedicated doorbells over a limited pool, victimized in spec 000's
//! order (least recently rung by default; `queries.rs` compares the victim policies); nothing
//! submitted is lost, and a recycled doorbell never wakes the wrong queue.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use abi::DoorbellStatus;
use abi::port::KernelPort;
use kernel::SystemConfig;
use kernel::trace::{Callback, Ddi, Event, PageTarget};
use umd::CommandBuffer;

const T: Option<Duration> = Some(Duration::from_millis(50));

fn pooled(n: u32) -> kernel::System {
    common::sim_with(SystemConfig { doorbell_pool: Some(n), ..SystemConfig::default() })
}

/// The spec's example: a single physical doorbell moves from hDoorbell1 to hDoorbell2.
#[test]
fn a_single_physical_doorbell_moves_from_one_queue_to_another_in_the_specs_order() {
    let sys = pooled(1);
    let c = common::client(&sys);
    let q1 = c.user_queue(); // connected: it holds the only physical doorbell
    assert_eq!(q1.doorbell_status().unwrap(), DoorbellStatus::Connected);
    let mark = sys.trace().0.len();
    let q2 = c.user_queue(); // connecting it victimizes q1
    let ev: Vec<Event> = common::events_from(&sys, mark);
    let want = [
        Event::Ddi(Ddi::ConnectDoorbell(q2.handle())),
        Event::Callback(Callback::DisconnectDoorbell(q1.handle())),
        Event::Rotate { queue: q1.handle(), to: PageTarget::Dummy },
        Event::Status { queue: q1.handle(), status: DoorbellStatus::DisconnectedRetry },
        Event::Rotate { queue: q2.handle(), to: PageTarget::Bar },
        Event::Status { queue: q2.handle(), status: DoorbellStatus::Connected },
    ];
    let found: Vec<&Event> = ev.iter().filter(|e| want.contains(e)).collect();
    assert_eq!(found, want.iter().collect::<Vec<_>>(), "{ev:#?}");
    assert_eq!(q1.doorbell_status().unwrap(), DoorbellStatus::DisconnectedRetry);
    assert_eq!(sys.stats().victimizations, 1);
}

#[test]
fn victims_reconnect_and_nothing_is_lost() {
    let sys = pooled(1);
    let c = common::client(&sys);
    let mut q1 = c.user_queue();
    let mut q2 = c.user_queue();
    for round in 0..10u32 {
        for (i, q) in [&mut q1, &mut q2].into_iter().enumerate() {
            let mut cb = CommandBuffer::new();
            cb.write_u32(c.buf.va() + 4 * i as u64, round);
            let v = q.submit(&cb).unwrap();
            q.wait(v, T).unwrap();
            assert_eq!(c.buf.read_u32(4 * i as u64).unwrap(), round);
        }
    }
    assert!(q1.reconnects() >= 9 && q2.reconnects() >= 9);
    assert!(sys.stats().victimizations >= 19);
}

/// A submission rung on the BAR just before its doorbell was victimized is still run: the
/// physical disconnect re-reads wptr.
#[test]
fn a_ring_that_raced_the_victimization_is_not_lost() {
    let sys = pooled(1);
    let c = common::client(&sys);
    let mut q1 = c.user_queue();
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va(), 0x11);
    let v = q1.submit(&cb).unwrap(); // rung, but the engine has not looked yet
    let _q2 = c.user_queue(); // victimizes q1 before any step
    q1.wait(v, T).unwrap();
    assert_eq!(c.buf.read_u32(0).unwrap(), 0x11);
}

/// After the victimization the victim's CPU page shows the dummy page: its late writes never
/// reach the physical doorbell that now belongs to another queue.
#[test]
fn a_victims_late_ring_never_reaches_the_new_owner() {
    let sys = pooled(1);
    let c = common::client(&sys);
    let p = common::RawProc::open(&sys);
    let q1 = p.create(p.desc(0)).unwrap();
    let d1 = p.doorbell(q1.handle).unwrap();
    p.port.connect_doorbell(q1.handle).unwrap();
    let _q2 = c.user_queue(); // another process takes the only physical doorbell
    let bar = sys.with_gpu(|g| g.bar().clone());
    let before: Vec<u64> = (0..bar.len() as u64 / 8).map(|i| bar.read_u64(i * 8).unwrap()).collect();
    d1.cpu_page.atomic_u64(d1.offset).unwrap().store(0x4000, Ordering::Release);
    let after: Vec<u64> = (0..bar.len() as u64 / 8).map(|i| bar.read_u64(i * 8).unwrap()).collect();
    assert_eq!(before, after, "the victim's write went to the dummy page");
}

#[test]
fn many_queues_share_few_doorbells_without_losing_work() {
    let sys = pooled(2);
    let a = common::client(&sys);
    let b = common::client(&sys);
    let mut queues: Vec<(usize, umd::Queue)> =
        (0..6).map(|i| (i, if i % 2 == 0 { a.user_queue() } else { b.user_queue() })).collect();
    let mut expect = [0u32; 6];
    let mut x = 0x2545_f491u32;
    for _ in 0..200 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        let (i, q) = &mut queues[(x % 6) as usize];
        let buf = if *i % 2 == 0 { &a.buf } else { &b.buf };
        expect[*i] += 1;
        let mut cb = CommandBuffer::new();
        cb.write_u32(buf.va() + 4 * *i as u64, expect[*i]);
        q.submit(&cb).unwrap();
    }
    for (i, q) in &queues {
        q.finish(T).unwrap();
        let buf = if *i % 2 == 0 { &a.buf } else { &b.buf };
        assert_eq!(buf.read_u32(4 * *i as u64).unwrap(), expect[*i], "queue {i}");
    }
    assert!(sys.stats().victimizations > 10);
}
