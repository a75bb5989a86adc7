//! Spec 000's global doorbell model, and amdgpu's aggregated doorbell for engines that miss
//! the doorbells of queues without a hardware slot.
//!
//! - Global: one doorbell for every queue; each queue rings its own bit of its process's
//!   page (a page per process, so no process can clear another's rings); nothing is ever
//!   victimized; a bit rung by someone else (another queue, a stale ring of a destroyed queue,
//!   an index naming no queue) only makes the firmware re-read that queue's wptr.
//! - Aggregated: with `misses_unmapped_doorbells`, a ring of an unmapped queue is dropped by
//!   the engine; the UMD's extra ring of the aggregated doorbell makes the firmware poll the
//!   unmapped queues' wptrs, so no submission is lost. Without the option a ring on an
//!   unmapped queue is remembered.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use abi::doorbell::{DoorbellModel, RingMethod};
use abi::packet::progress_fence_words;
use abi::port::{DoorbellInfo, HwQueueInfo, KernelError, KernelPort};
use abi::queue::{PROGRESS_COMPLETED_OFFSET, QueueState};
use abi::ring::WPTR_OFFSET;
use gpu::GpuConfig;
use kernel::SystemConfig;
use umd::CommandBuffer;

const T: Option<Duration> = Some(Duration::from_millis(100));

fn config(model: DoorbellModel, misses: bool, slots: u32) -> SystemConfig {
    SystemConfig {
        gpu: GpuConfig {
            doorbell_model: model,
            misses_unmapped_doorbells: misses,
            hw_slots: slots,
            ..GpuConfig::default()
        },
        ..SystemConfig::default()
    }
}

fn global() -> kernel::System {
    common::sim_with(config(DoorbellModel::Global, false, 8))
}

/// A raw queue: one per [`common::RawProc`] (its ring at offset 0 of the process's ring
/// allocation), with a WRITE_DATA target in its control page.
struct Raw {
    p: common::RawProc,
    q: HwQueueInfo,
    db: DoorbellInfo,
    wptr: u64,
}

/// Where a raw queue's WRITE_DATA lands (inside its control allocation, past the pointers).
const TARGET: u64 = 2048;

impl Raw {
    fn open(sys: &kernel::System) -> Raw {
        let p = common::RawProc::open(sys);
        let q = p.create(p.desc(abi::queue::DOORBELL_INDEX_ANY)).unwrap();
        let db = p.doorbell(q.handle).unwrap();
        p.port.connect_doorbell(q.handle).unwrap();
        Raw { p, q, db, wptr: 0 }
    }

    /// Writes `WRITE_DATA value` and progress fence `fence` into the ring, publishes the
    /// last-queued value and then wptr (spec 000's order), without ringing.
    fn publish(&mut self, value: u32, fence: u64) {
        let mut cb = CommandBuffer::new();
        cb.write_u32(self.p.ctl.va + TARGET, value);
        let mut words = cb.words().to_vec();
        words.extend_from_slice(&progress_fence_words(fence));
        let ring = self.p.port.map_allocation(self.p.ring.handle).unwrap();
        ring.write_u32s(self.wptr, &words).unwrap();
        self.wptr += 4 * words.len() as u64;
        let ctl = self.p.port.map_allocation(self.p.ctl.handle).unwrap();
        ctl.atomic_u64(abi::ring::LAST_QUEUED_OFFSET).unwrap().store(fence, Ordering::Release);
        ctl.atomic_u64(WPTR_OFFSET).unwrap().store(self.wptr, Ordering::Release);
    }

    /// Rings this queue's own doorbell the way the kernel said to.
    fn ring(&self) {
        match self.db.ring {
            RingMethod::WriteWptr => {
                self.db.cpu_page.atomic_u64(self.db.offset).unwrap().store(self.wptr, Ordering::Release)
            }
            RingMethod::SetBit { .. } => ring_as(&self.db, &self.db),
        }
    }

    /// Rings the aggregated doorbell.
    fn ring_aggregated(&self) {
        let a = self.db.aggregated.as_ref().expect("the device has an aggregated doorbell");
        a.page.atomic_u64(a.offset).unwrap().fetch_or(a.mask, Ordering::Release);
    }

    fn completed(&self) -> u64 {
        self.q.kernel_page.load_u64(PROGRESS_COMPLETED_OFFSET, Ordering::Acquire).unwrap()
    }

    fn written(&self) -> u32 {
        self.p.port.map_allocation(self.p.ctl.handle).unwrap().read_u32(TARGET).unwrap()
    }

    fn state(&self) -> QueueState {
        self.p.port.query_queue(self.q.handle).unwrap().state
    }
}

/// Rings `target`'s doorbell through `through`'s CPU page.
fn ring_as(through: &DoorbellInfo, target: &DoorbellInfo) {
    let word = through.cpu_page.atomic_u64(target.offset).unwrap();
    match target.ring {
        RingMethod::WriteWptr => unreachable!("global doorbells set bits"),
        RingMethod::SetBit { mask } => {
            word.fetch_or(mask, Ordering::Release);
        }
    }
}

#[test]
fn the_adapter_reports_its_doorbell_model() {
    let sys = common::sim_with(config(DoorbellModel::Global, true, 8));
    let info = sys.open_process().unwrap().adapter_info();
    assert_eq!(info.doorbell_model, DoorbellModel::Global);
    assert!(info.aggregated_doorbell);
    let info = common::sim().open_process().unwrap().adapter_info();
    assert_eq!(info.doorbell_model, DoorbellModel::Dedicated);
    assert!(!info.aggregated_doorbell);
}

#[test]
fn global_queues_ring_their_own_bit_of_their_process_page_and_nothing_is_victimized() {
    let sys = common::sim_with(config(DoorbellModel::Global, false, 2));
    let a = common::client(&sys);
    let b = common::client(&sys);
    let mut queues: Vec<(usize, umd::Queue)> =
        (0..24).map(|i| (i, if i % 2 == 0 { a.user_queue() } else { b.user_queue() })).collect();
    // Each process's queues show its own page, each at its own bit.
    let tap = common::TapPort::open(&sys);
    let tc = common::client_on(tap.clone());
    let (q1, q2) = (tc.user_queue(), tc.user_queue());
    let (t1, t2) = (tap.queue(q1.handle()), tap.queue(q2.handle()));
    assert_eq!(t1.doorbell_page.current(), t2.doorbell_page.current(), "one page per process");
    assert_ne!((t1.doorbell_offset, t1.ring_method), (t2.doorbell_offset, t2.ring_method), "a bit per queue");
    assert!(matches!(t1.ring_method, RingMethod::SetBit { .. }));
    let other = common::TapPort::open(&sys);
    let oc = common::client_on(other.clone());
    let oq = oc.user_queue();
    assert_ne!(other.queue(oq.handle()).doorbell_page.current(), t1.doorbell_page.current(), "another process's page");
    let mut expect = [0u32; 24];
    for round in 1..=5u32 {
        for (i, q) in queues.iter_mut() {
            let buf = if *i % 2 == 0 { &a.buf } else { &b.buf };
            let mut cb = CommandBuffer::new();
            cb.write_u32(buf.va() + 4 * *i as u64, round);
            q.submit(&cb).unwrap();
            expect[*i] = round;
        }
    }
    for (i, q) in &queues {
        q.finish(T).unwrap();
        let buf = if *i % 2 == 0 { &a.buf } else { &b.buf };
        assert_eq!(buf.read_u32(4 * *i as u64).unwrap(), expect[*i], "queue {i}");
        assert_eq!(q.reconnects(), 0);
    }
    assert_eq!(sys.stats().victimizations, 0);
}

#[test]
fn a_pool_of_dedicated_doorbells_is_refused_under_the_global_model() {
    let cfg = SystemConfig { doorbell_pool: Some(4), ..config(DoorbellModel::Global, false, 8) };
    match kernel::System::sim(cfg) {
        Err(KernelError::InvalidArgument { field, value, .. }) => {
            assert_eq!((field, value.as_str()), ("doorbell_pool", "4"));
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a pool under the global model was accepted"),
    }
}

/// Sets `target`'s bit through `through`'s doorbell CPU page (the same process page).
fn ring_bit(through: &common::TapQueue, target: &common::TapQueue) {
    let RingMethod::SetBit { mask } = target.ring_method else { panic!("global doorbells set bits") };
    through.doorbell_page.atomic_u64(target.doorbell_offset).unwrap().fetch_or(mask, Ordering::Release);
}

#[test]
fn another_queue_ringing_a_queues_bit_only_makes_the_firmware_reread_its_wptr() {
    let sys = global();
    let tap = common::TapPort::open(&sys);
    let c = common::client_on(tap.clone());
    let (mut qa, mut qb) = (c.user_queue(), c.user_queue());
    let (ta, tb) = (tap.queue(qa.handle()), tap.queue(qb.handle()));
    // B rings A's bit while A has nothing new: nothing happens to A.
    ring_bit(&tb, &ta);
    sys.settle();
    assert_eq!(ta.completed(), 0);
    assert_ne!(qa.status().unwrap().state, QueueState::Hung);
    // Bits naming no queue: ignored.
    for w in [0, 8, 4088] {
        tb.doorbell_page.atomic_u64(w).unwrap().fetch_or(u64::MAX, Ordering::Release);
    }
    sys.settle();
    // Both queues' own work is untouched by all that.
    for (i, q) in [(0u64, &mut qa), (1, &mut qb)] {
        let mut cb = CommandBuffer::new();
        cb.write_u32(c.buf.va() + 4 * i, 7);
        let v = q.submit(&cb).unwrap();
        q.wait(v, T).unwrap();
        assert_eq!(c.buf.read_u32(4 * i).unwrap(), 7);
    }
    assert_eq!(sys.stats().faults, 0);
}

/// The page is the unit of protection: a process that scribbles over its whole doorbell page
/// and its aggregated doorbell cannot erase another process's rings.
#[test]
fn no_process_can_erase_another_process_rings() {
    let mut cfg = config(DoorbellModel::Global, true, 1);
    cfg.gpu.idle_period = Duration::from_secs(3600); // no F1 round trip re-reads wptrs for us
    let sys = common::sim_with(cfg);
    let tap_a = common::TapPort::open(&sys);
    let a = common::client_on(tap_a.clone());
    let tap_b = common::TapPort::open(&sys);
    let b = common::client_on(tap_b.clone());
    let holder = b.user_queue(); // takes the only slot
    let mut qa = a.user_queue(); // has none: its own ring is missed, the aggregated one counts
    sys.settle();
    assert_eq!(holder.status().unwrap().state, QueueState::Mapped);
    let tb = tap_b.queue(holder.handle());
    let mut cb = CommandBuffer::new();
    cb.write_u32(a.buf.va(), 0xa11);
    let v = qa.submit(&cb).unwrap(); // rings A's bit and A's aggregated doorbell
    // B erases everything it can reach before the firmware looks.
    for w in 0..512 {
        tb.doorbell_page.atomic_u64(w * 8).unwrap().store(0, Ordering::Release);
    }
    let agg = tb.aggregated.as_ref().expect("an aggregated doorbell");
    agg.page.atomic_u64(agg.offset).unwrap().store(0, Ordering::Release);
    let ta = tap_a.queue(qa.handle());
    assert_ne!(ta.doorbell_page.current(), tb.doorbell_page.current());
    qa.wait(v, T).unwrap();
    assert_eq!(a.buf.read_u32(0).unwrap(), 0xa11);
}

#[test]
fn a_stale_ring_of_a_destroyed_queue_never_runs_its_work_on_the_new_owner_of_its_bit() {
    let sys = global();
    let mut a = Raw::open(&sys);
    // A publishes work and rings, and is destroyed before the firmware looks.
    a.publish(7, 1);
    a.ring();
    let old = (a.db.offset, a.db.ring);
    a.p.port.destroy_hw_queue(a.q.handle).unwrap();
    // A new queue of the same process takes the same index, so the same bit, over the same
    // ring and control memory: it starts at the current wptr, after the old work.
    let q = a.p.create(a.p.desc(abi::queue::DOORBELL_INDEX_ANY)).unwrap();
    let db = a.p.doorbell(q.handle).unwrap();
    a.p.port.connect_doorbell(q.handle).unwrap();
    assert_eq!((db.offset, db.ring), old, "the bit was reused");
    let mut b = Raw { p: a.p, q, db, wptr: a.wptr };
    sys.settle();
    assert_eq!((b.completed(), b.written()), (0, 0), "the destroyed queue's work never ran");
    assert_ne!(b.state(), QueueState::Hung);
    b.publish(3, 1);
    b.ring();
    sys.settle();
    assert_eq!((b.completed(), b.written()), (1, 3));
}

#[test]
fn kernel_queues_are_never_missed_by_an_engine_that_misses_unmapped_doorbells() {
    // Two slots: a kernel queue may not take the only one from a user queue (spec 001: kernel
    // queues limit the slots left for user queues; see `a_kernel_queue_never_takes_the_last_slot_from_user_queues`).
    let mut cfg = config(DoorbellModel::Dedicated, true, 2);
    cfg.gpu.idle_period = Duration::from_secs(3600);
    let sys = common::sim_with(cfg);
    let c = common::client(&sys);
    // User queues hold both slots, blocked in a WAIT.
    let mut users: Vec<umd::Queue> = (0..2).map(|_| c.user_queue()).collect();
    let mut cb = CommandBuffer::new();
    cb.wait(c.buf.va() + 64, 1);
    for user in &mut users {
        user.submit(&cb).unwrap();
    }
    sys.settle();
    let mut kq = c.kernel_queue();
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va(), 5);
    let v = kq.submit(&cb).unwrap();
    kq.wait(v, T).unwrap();
    assert_eq!(c.buf.read_u32(0).unwrap(), 5);
}

#[test]
fn global_doorbells_disconnect_and_reconnect_through_d3_without_losing_work() {
    let sys = global();
    let c = common::client(&sys);
    let mut q = c.user_queue();
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va(), 1);
    q.finish(T).unwrap();
    sys.enter_d3().unwrap();
    assert_eq!(q.doorbell_status().unwrap(), abi::DoorbellStatus::DisconnectedRetry);
    let v = q.submit(&cb).unwrap(); // rings the dummy page, reconnects, wakes the device
    q.wait(v, T).unwrap();
    assert_eq!(c.buf.read_u32(0).unwrap(), 1);
    assert!(!sys.in_d3());
    assert_eq!(q.reconnects(), 1);
}

/// One slot: `holder` takes it, `waiter` has none.
fn one_slot(model: DoorbellModel, misses: bool) -> (kernel::System, Raw, Raw) {
    let sys = common::sim_with(config(model, misses, 1));
    let holder = Raw::open(&sys);
    let waiter = Raw::open(&sys);
    sys.settle();
    assert_eq!(holder.state(), QueueState::Mapped);
    assert_eq!(waiter.state(), QueueState::Unmapped);
    (sys, holder, waiter)
}

#[test]
fn an_engine_that_misses_unmapped_doorbells_drops_the_ring_and_the_aggregated_doorbell_recovers_it() {
    for model in [DoorbellModel::Dedicated, DoorbellModel::Global] {
        let (sys, _holder, mut waiter) = one_slot(model, true);
        assert!(waiter.db.aggregated.is_some(), "{model}: the kernel hands out the aggregated doorbell");
        waiter.publish(5, 1);
        waiter.ring();
        for _ in 0..10 {
            sys.step();
        }
        assert_eq!(waiter.completed(), 0, "{model}: the unmapped queue's ring was missed");
        assert_eq!(waiter.state(), QueueState::Unmapped);
        waiter.ring_aggregated();
        sys.settle();
        assert_eq!((waiter.completed(), waiter.written()), (1, 5), "{model}: the aggregated ring found it");
    }
}

#[test]
fn without_the_option_a_ring_on_an_unmapped_queue_is_remembered() {
    for model in [DoorbellModel::Dedicated, DoorbellModel::Global] {
        let (sys, _holder, mut waiter) = one_slot(model, false);
        assert!(waiter.db.aggregated.is_none(), "{model}: no aggregated doorbell is needed");
        waiter.publish(5, 1);
        waiter.ring();
        sys.settle();
        assert_eq!((waiter.completed(), waiter.written()), (1, 5), "{model}");
    }
}

#[test]
fn the_umd_rings_the_aggregated_doorbell_so_oversubscribed_queues_lose_nothing() {
    for model in [DoorbellModel::Dedicated, DoorbellModel::Global] {
        // Engines never idle inside the test, so no F1 round trip (whose reconnect re-reads
        // every wptr) can hide a missed ring: only the aggregated doorbell can find the work.
        let mut cfg = config(model, true, 2);
        cfg.gpu.idle_period = Duration::from_secs(3600);
        let sys = common::sim_with(cfg);
        let c = common::client(&sys);
        let mut queues: Vec<umd::Queue> = (0..12).map(|_| c.user_queue()).collect();
        for round in 1..=4u32 {
            for (i, q) in queues.iter_mut().enumerate() {
                let mut cb = CommandBuffer::new();
                cb.write_u32(c.buf.va() + 4 * i as u64, round);
                q.submit(&cb).unwrap();
            }
        }
        for (i, q) in queues.iter().enumerate() {
            q.finish(T).unwrap();
            assert_eq!(c.buf.read_u32(4 * i as u64).unwrap(), 4, "{model}: queue {i}");
        }
    }
}

/// An ended process's aggregated doorbell is rotated to the dummy page, like its doorbells:
/// a late write cannot reach the page, which goes to the next process.
#[test]
fn an_ended_processs_aggregated_doorbell_writes_reach_nothing() {
    let sys = common::sim_with(config(DoorbellModel::Dedicated, true, 2));
    let p = common::RawProc::open(&sys);
    let q = p.create(p.desc(abi::queue::DOORBELL_INDEX_ANY)).unwrap();
    let db = p.doorbell(q.handle).unwrap();
    let agg = db.aggregated.clone().expect("an aggregated doorbell");
    p.port.terminate(kernel::Termination::Normal);
    let bar = sys.with_gpu(|g| g.bar().clone());
    let before: Vec<u64> = (0..bar.len() as u64 / 8).map(|i| bar.read_u64(i * 8).unwrap()).collect();
    agg.page.atomic_u64(agg.offset).unwrap().store(u64::MAX, Ordering::Release);
    let after: Vec<u64> = (0..bar.len() as u64 / 8).map(|i| bar.read_u64(i * 8).unwrap()).collect();
    assert_eq!(before, after, "the write went to the dummy page");
}
