//! A queue the kernel holds off its engine — preempted by a request ([`System::preempt_queue`]
//! until [`System::resume_queue`]) or suspended with its context — keeps its work, however long
//! the hold and whatever fires meanwhile, and runs it once released (issue 27: a hold longer
//! than the engine's idle period let the engine sleep, and the resumed queue never ran).
//!
//! Spec 000, "Engine F-state transitions": an engine may enter F1 while its only queues are
//! held with their work kept; releasing one brings the engine back to F0 and runs that work.
//! Every timer that can fire during a hold is tried here: the engine's idle timer (F1), the
//! hang timer, TDR, the quantum timer, the D3 idle timer; and a migration, which holds and
//! releases queues of its own.

mod common;

use std::time::Duration;

use abi::preempt::{ComputeGranularity, PreemptionCaps};
use abi::{EngineKind, PowerState, QueueState};
use gpu::GpuConfig;
use kernel::trace::{Ddi, Event};
use kernel::{System, SystemConfig, TdrConfig};
use umd::{CommandBuffer, Queue};

const T: Option<Duration> = Some(Duration::from_millis(50));

/// The engines' default idle period (`GpuConfig::idle_period`).
const IDLE: Duration = Duration::from_millis(20);

/// How the kernel holds a queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hold {
    /// `preempt_queue` … `resume_queue`.
    Request,
    /// `suspend_context` … `resume_context`.
    Suspend,
}

impl Hold {
    fn start(self, sys: &System, c: &common::Client, q: &Queue) {
        let pid = c.port.process();
        match self {
            Hold::Request => {
                sys.preempt_queue(pid, q.handle()).unwrap();
            }
            Hold::Suspend => sys.suspend_context(pid, c.ctx.handle()).unwrap(),
        }
    }
    fn end(self, sys: &System, c: &common::Client, q: &Queue) {
        let pid = c.port.process();
        match self {
            Hold::Request => sys.resume_queue(pid, q.handle()).unwrap(),
            Hold::Suspend => sys.resume_context(pid, c.ctx.handle()).unwrap(),
        }
    }
}

/// Submits a command buffer writing `value` at `offset` of the client's buffer.
fn write(c: &common::Client, q: &mut Queue, offset: u64, value: u32) -> u64 {
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va() + offset, value);
    q.submit(&cb).unwrap()
}

/// The case and its variations: a user-mode or kernel-mode queue, work queued before
/// the hold or during it, held for 5 ms (under the idle period) and for 30 ms (over it: the
/// engine sleeps); a second submission after that much hold (the client reconnects the
/// doorbell F1 took, which wakes the engine, which sleeps again). Nothing runs while held;
/// everything runs once released, and the engine is awake.
#[test]
fn held_work_runs_after_release_however_long_the_hold() {
    for how in [Hold::Request, Hold::Suspend] {
        for kernel_mode in [false, true] {
            for queued_before in [false, true] {
                for hold in [Duration::from_millis(5), Duration::from_millis(30)] {
                    let case = format!("{how:?}, kernel mode {kernel_mode}, queued before {queued_before}, {hold:?}");
                    let sys = common::sim();
                    let c = common::client(&sys);
                    let mut q = if kernel_mode { c.kernel_queue() } else { c.user_queue() };
                    let engine = q.engine();
                    let first = if queued_before {
                        let v = write(&c, &mut q, 0, 0x51);
                        how.start(&sys, &c, &q);
                        v
                    } else {
                        how.start(&sys, &c, &q);
                        write(&c, &mut q, 0, 0x51)
                    };
                    sys.advance(hold);
                    let slept = sys.power(engine) == PowerState::F1;
                    assert_eq!(slept, hold > IDLE, "{case}: the engine sleeps once the hold passes its idle period");
                    let second = write(&c, &mut q, 4, 0x52);
                    sys.advance(hold);
                    assert_eq!(sys.power(engine) == PowerState::F1, slept, "{case}");
                    assert_eq!((c.buf.read_u32(0).unwrap(), c.buf.read_u32(4).unwrap()), (0, 0), "{case}: held");
                    assert_ne!(q.status().unwrap().state, QueueState::Hung, "{case}");
                    how.end(&sys, &c, &q);
                    assert_eq!(sys.power(engine), PowerState::F0, "{case}: the release wakes the engine");
                    q.wait(first, T).unwrap_or_else(|e| panic!("{case}: the first submission was lost: {e}"));
                    q.wait(second, T).unwrap_or_else(|e| panic!("{case}: the second submission was lost: {e}"));
                    assert_eq!((c.buf.read_u32(0).unwrap(), c.buf.read_u32(4).unwrap()), (0x51, 0x52), "{case}");
                }
            }
        }
    }
}

/// The hang timer looks for queues whose progress does not move with work outstanding; a
/// held queue's does not because the kernel holds it. It is not checked while held (no
/// preemption request of the timer's, which would answer at once and resume it: the hold
/// broken), it does not run while held, and it is not taken for hung right after its release.
#[test]
fn the_hang_timer_leaves_a_held_queue_alone() {
    let hang = Duration::from_millis(100);
    let tdr = TdrConfig { delay: Duration::from_millis(50), hang_compute: Some(hang), ..TdrConfig::default() };
    for how in [Hold::Request, Hold::Suspend] {
        let sys = common::sim_with(SystemConfig { tdr, ..SystemConfig::default() });
        let c = common::client(&sys);
        let mut q = c.user_queue();
        how.start(&sys, &c, &q);
        let mark = sys.trace().0.len();
        let v = write(&c, &mut q, 0, 0x51);
        sys.advance(hang * 10);
        let evs = common::events_from(&sys, mark);
        assert!(
            !evs.iter().any(|e| matches!(e, Event::Ddi(Ddi::PreemptQueue(_) | Ddi::ResumeContext(_)))),
            "{how:?}: the hang timer asked a held queue to preempt, or resumed it: {evs:#?}"
        );
        assert_eq!(c.buf.read_u32(0).unwrap(), 0, "{how:?}: still held");
        how.end(&sys, &c, &q);
        q.wait(v, T).unwrap();
        assert_eq!(c.buf.read_u32(0).unwrap(), 0x51, "{how:?}");
        // Released, it starts a fresh hang period: a WAIT nobody releases is checked only a
        // whole timeout after the release.
        let released = sys.now();
        let mark = sys.trace().0.len();
        let mut cb = CommandBuffer::new();
        cb.wait(c.buf.va() + 8, 1);
        q.submit(&cb).unwrap();
        sys.advance(hang / 2);
        let evs = common::events_from(&sys, mark);
        assert!(!evs.iter().any(|e| matches!(e, Event::Ddi(Ddi::PreemptQueue(_)))), "{how:?}: {evs:#?}");
        sys.advance(hang);
        let (trace, _) = sys.trace();
        let check = trace[mark..]
            .iter()
            .find(|e| matches!(e.event, Event::Ddi(Ddi::PreemptQueue(h)) if h == q.handle()))
            .expect("checked once a whole timeout passed");
        assert!(
            check.time.since(released) >= hang,
            "{how:?}: checked {:?} after the release",
            check.time.since(released)
        );
        assert_ne!(q.status().unwrap().state, QueueState::Hung);
    }
}

/// TDR times out requests that go unanswered; a held queue answered its request, so no hold,
/// however long, is taken for a hang.
#[test]
fn a_hold_longer_than_tdr_delay_is_not_a_timeout() {
    let tdr =
        TdrConfig { delay: Duration::from_millis(50), hang_compute: None, hang_copy: None, ..TdrConfig::default() };
    for how in [Hold::Request, Hold::Suspend] {
        let sys = common::sim_with(SystemConfig { tdr, ..SystemConfig::default() });
        let c = common::client(&sys);
        let mut q = c.user_queue();
        how.start(&sys, &c, &q);
        let v = write(&c, &mut q, 0, 0x51);
        sys.advance(Duration::from_millis(500));
        let evs = common::events(&sys);
        assert!(!evs.iter().any(|e| matches!(e, Event::TdrTimeout { .. } | Event::Recovered { .. })), "{how:?}");
        how.end(&sys, &c, &q);
        q.wait(v, T).unwrap();
        assert_eq!(c.buf.read_u32(0).unwrap(), 0x51, "{how:?}");
    }
}

/// The quantum timer hands the slot between waiting queues; a held queue is not one of them,
/// even with its work queued and two endless neighbours trading the engine's only slot at
/// every quantum all through the hold.
#[test]
fn quantum_expiries_do_not_map_a_held_queue() {
    let gpu = GpuConfig { hw_slots: 1, process_quantum: Duration::from_micros(100), ..GpuConfig::default() };
    let sys = common::sim_with(SystemConfig { gpu, ..SystemConfig::default() });
    let hogs: Vec<_> = (0..2)
        .map(|_| {
            let h = common::client(&sys);
            let (q, spin) = h.endless_queue();
            (h, q, spin)
        })
        .collect();
    let c = common::client(&sys);
    let mut q = c.user_queue();
    let engine = q.engine();
    Hold::Request.start(&sys, &c, &q);
    let v = write(&c, &mut q, 0, 0x51);
    let maps = || sys.with_gpu(|g| g.slot_occupancy(engine)).unwrap().1;
    let before = maps();
    sys.advance(Duration::from_millis(30));
    assert!(maps() - before >= 100, "the neighbours traded the slot at every quantum: {}", maps() - before);
    assert_eq!(c.buf.read_u32(0).unwrap(), 0, "held through every quantum");
    Hold::Request.end(&sys, &c, &q);
    q.wait(v, T).unwrap();
    assert_eq!(c.buf.read_u32(0).unwrap(), 0x51);
    drop(hogs);
}

/// The D3 idle timer: a held queue with work keeps the device out of D3; a held queue without
/// work lets it in, stays held when another client's work brings the device back (D0 resumes
/// the contexts D3 suspended, not the kernel's own holds), and a release during D3 leaves the
/// device asleep until work wakes it.
#[test]
fn the_d3_idle_timer_keeps_held_work_and_holds() {
    let cfg = || SystemConfig { d3_idle: Some(Duration::from_millis(100)), ..SystemConfig::default() };
    for how in [Hold::Request, Hold::Suspend] {
        // With work: no D3.
        let sys = common::sim_with(cfg());
        let c = common::client(&sys);
        let mut q = c.user_queue();
        how.start(&sys, &c, &q);
        let v = write(&c, &mut q, 0, 0x51);
        sys.advance(Duration::from_millis(500));
        assert!(!sys.in_d3(), "{how:?}: held work keeps the device out of D3");
        how.end(&sys, &c, &q);
        q.wait(v, T).unwrap();
        assert_eq!(c.buf.read_u32(0).unwrap(), 0x51);

        // Without work: D3, then another client's work wakes the device; the hold stands.
        let sys = common::sim_with(cfg());
        let c = common::client(&sys);
        let mut q = c.user_queue();
        let other = common::client(&sys);
        let mut oq = other.user_queue();
        how.start(&sys, &c, &q);
        sys.advance(Duration::from_millis(500));
        assert!(sys.in_d3(), "{how:?}: idle, held or not");
        let ov = write(&other, &mut oq, 0, 7);
        oq.wait(ov, T).unwrap();
        assert!(!sys.in_d3());
        let v = write(&c, &mut q, 0, 0x51);
        sys.advance(Duration::from_millis(5));
        assert_eq!(c.buf.read_u32(0).unwrap(), 0, "{how:?}: still held after D0");
        how.end(&sys, &c, &q);
        q.wait(v, T).unwrap();
        assert_eq!(c.buf.read_u32(0).unwrap(), 0x51);

        // Released during D3: the device stays in D3 until work wakes it, then runs it.
        let sys = common::sim_with(cfg());
        let c = common::client(&sys);
        let mut q = c.user_queue();
        how.start(&sys, &c, &q);
        sys.advance(Duration::from_millis(500));
        assert!(sys.in_d3());
        how.end(&sys, &c, &q);
        sys.advance(Duration::from_millis(5));
        assert!(sys.in_d3(), "{how:?}: a release wakes nothing in D3");
        let v = write(&c, &mut q, 0, 0x52);
        q.wait(v, T).unwrap();
        assert_eq!(c.buf.read_u32(0).unwrap(), 0x52);
    }
}

/// A migration holds every queue of its process until the slowest has answered; one that
/// answered at once waits that long off its engine, which may sleep meanwhile. When the
/// migration resumes it, its engine wakes and its work runs. A queue the kernel already held
/// by a request stays held through the migration.
#[test]
fn a_migration_longer_than_the_idle_period_wakes_the_engines_it_resumes() {
    // A `WAIT` is not preemptible under `None`: the compute queue answers only once it passes.
    let gpu = GpuConfig {
        preemption: PreemptionCaps { compute: ComputeGranularity::None, ..PreemptionCaps::default() },
        ..GpuConfig::default()
    };
    let sys = common::sim_with(SystemConfig { gpu, ..SystemConfig::default() });
    let c = common::client(&sys);
    let pid = c.port.process();
    let mut slow = c.user_queue();
    let mut cb = CommandBuffer::new();
    cb.wait(c.buf.va() + 64, 1);
    let sv = slow.submit(&cb).unwrap();
    let copy = c.context(EngineKind::Copy);
    let mut cq = copy.create_queue(umd::QueueOptions::user_mode()).unwrap();
    let held = c.user_queue();
    sys.settle();
    sys.preempt_queue(pid, held.handle()).unwrap();
    sys.migrate_allocation(pid, c.buf.handle(), abi::port::MemoryDomain::Local).unwrap();
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va() + 4, 0x52);
    let cv = cq.submit(&cb).unwrap();
    sys.advance(Duration::from_millis(30));
    assert_eq!(sys.power(cq.engine()), PowerState::F1, "the copy engine slept while the migration waited");
    assert_eq!(c.buf.read_u32(4).unwrap(), 0, "held by the migration");
    // The WAIT passes: the compute queue answers, the migration completes and resumes.
    c.buf.write(64, &1u32.to_le_bytes()).unwrap();
    slow.wait(sv, T).unwrap();
    cq.wait(cv, T).unwrap();
    assert_eq!(c.buf.read_u32(4).unwrap(), 0x52);
    // The queue held by its own request is still held.
    let mut held = held;
    let hv = write(&c, &mut held, 8, 0x53);
    sys.advance(Duration::from_millis(5));
    assert_eq!(c.buf.read_u32(8).unwrap(), 0, "the migration released a queue it did not hold");
    sys.resume_queue(pid, held.handle()).unwrap();
    held.wait(hv, T).unwrap();
    assert_eq!(c.buf.read_u32(8).unwrap(), 0x53);
}

/// The hang timer during a migration: a queue that answered the migration's request at once
/// waits off its engine, work queued, for the slowest queue of its process. It is held by the
/// migration, not hung: the timer leaves it alone (a check would be answered at once and
/// resume it, to run on memory being moved), and it runs once the migration resumes it.
#[test]
fn the_hang_timer_leaves_a_queue_held_by_a_migration_alone() {
    let hang = Duration::from_millis(100);
    let gpu = GpuConfig {
        preemption: PreemptionCaps { compute: ComputeGranularity::None, ..PreemptionCaps::default() },
        ..GpuConfig::default()
    };
    let tdr = TdrConfig { hang_compute: Some(hang), hang_copy: Some(hang), ..TdrConfig::default() };
    let sys = common::sim_with(SystemConfig { gpu, tdr, ..SystemConfig::default() });
    let c = common::client(&sys);
    let pid = c.port.process();
    let mut slow = c.user_queue();
    let mut cb = CommandBuffer::new();
    cb.wait(c.buf.va() + 64, 1);
    let sv = slow.submit(&cb).unwrap();
    let copy = c.context(EngineKind::Copy);
    let mut cq = copy.create_queue(umd::QueueOptions::user_mode()).unwrap();
    sys.settle();
    sys.migrate_allocation(pid, c.buf.handle(), abi::port::MemoryDomain::Local).unwrap();
    let mark = sys.trace().0.len();
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va() + 4, 0x52);
    let cv = cq.submit(&cb).unwrap();
    sys.advance(hang * 5);
    let evs = common::events_from(&sys, mark);
    assert!(
        !evs.iter().any(|e| matches!(e, Event::Ddi(Ddi::PreemptQueue(h)) if *h == cq.handle())),
        "the hang timer checked a queue the migration holds: {evs:#?}"
    );
    assert_eq!(c.buf.read_u32(4).unwrap(), 0, "held by the migration");
    c.buf.write(64, &1u32.to_le_bytes()).unwrap();
    slow.wait(sv, T).unwrap();
    cq.wait(cv, T).unwrap();
    assert_eq!(c.buf.read_u32(4).unwrap(), 0x52);
}
