//! Device time on the deterministic driver (`gpu::cost`): work occupies its engine for a
//! modelled duration, the virtual clock moves from event to event, timeouts fire beside a busy
//! engine, large `COPY`/`FILL`s are sliced at chunk boundaries, and a queue's turn is budgeted
//! by device time, so a tiny command buffer is not stuck behind another process's bulk work.

mod common;

use std::time::Duration;

use abi::queue::FaultKind;
use abi::{EngineKind, QueueState, Time};
use gpu::{CostModel, GpuConfig};
use kernel::trace::Ddi;
use kernel::{SystemConfig, Termination};
use umd::{Buffer, CommandBuffer, UmdError};

use common::forever;

/// Costs that make an endless kernel burn virtual time fast (100 µs per wave-instruction, a
/// 10 ms turn: 100 instructions a turn), so that seconds of virtual time take a few hundred
/// turns of real work. The tests are about time passing beside a busy engine, not about the
/// default figures.
fn slow_engines() -> SystemConfig {
    let cost = CostModel {
        wave_instruction: Duration::from_micros(100),
        turn: Duration::from_millis(10),
        ..CostModel::default()
    };
    SystemConfig { gpu: GpuConfig { cost, ..GpuConfig::default() }, ..SystemConfig::default() }
}

/// Starts an endless kernel on a user-mode compute queue of a new process; returns the
/// client, the queue and the progress value that never comes.
fn hog(sys: &kernel::System) -> (common::Client, umd::Queue, u64) {
    let c = common::client(sys);
    let spin = c.device.upload(&forever()).unwrap();
    let args = c.device.upload(&[0u8; 16]).unwrap();
    let mut q = c.user_queue();
    let mut cb = CommandBuffer::new();
    cb.dispatch(spin.va(), [1, 1, 1], [64, 1, 1], args.va());
    let v = q.submit(&cb).unwrap();
    std::mem::forget(spin);
    std::mem::forget(args);
    (c, q, v)
}

/// Another process whose copy queue will only reach its progress value once a `WAIT` on a
/// word nobody writes is satisfied: waits on that value can only time out.
fn blocked_neighbour(sys: &kernel::System) -> (common::Client, umd::Context, umd::Queue, u64) {
    let c = common::client(sys);
    let ctx = c.context(EngineKind::Copy);
    let mut q = ctx.create_queue(umd::QueueOptions::user_mode()).unwrap();
    let mut cb = CommandBuffer::new();
    cb.wait(c.buf.va(), 1);
    let v = q.submit(&cb).unwrap();
    (c, ctx, q, v)
}

#[test]
fn a_timed_wait_returns_at_its_deadline_beside_an_endless_kernel() {
    let sys = common::sim_with(slow_engines());
    let (_h, hog_q, hog_v) = hog(&sys);
    // The 10 ms timeout must fire although the compute engine never idles.
    let (_c, _ctx, q, v) = blocked_neighbour(&sys);
    let start = sys.now();
    let e = q.wait(v, Some(Duration::from_millis(10))).unwrap_err();
    assert!(matches!(e, UmdError::Timeout { .. }), "{e}");
    let waited = sys.now().since(start);
    assert!(waited >= Duration::from_millis(10), "returned at its deadline, not before: {waited:?}");
    assert!(waited < Duration::from_millis(21), "and not much later (one turn): {waited:?}");
    // The endless kernel ran all along, and is still running.
    let instructions = sys.with_gpu(|g| g.compute_stats().instructions);
    assert!(instructions >= 100, "the hog executed meanwhile ({instructions} instructions)");
    assert!(hog_q.completed() < hog_v);
    assert_eq!(hog_q.status().unwrap().state, QueueState::Mapped);
}

#[test]
fn a_wait_with_no_timeout_is_a_deadlock_after_60_s_even_beside_an_endless_kernel() {
    let sys = common::sim_with(slow_engines());
    let (_h, _hog_q, _) = hog(&sys);
    let (_c, _ctx, q, v) = blocked_neighbour(&sys);
    let start = sys.now();
    let e = q.wait(v, None).unwrap_err();
    assert!(matches!(e, UmdError::Timeout { .. }), "{e}");
    let waited = sys.now().since(start);
    assert!((Duration::from_secs(60)..Duration::from_secs(61)).contains(&waited), "{waited:?}");
}

#[test]
fn a_normal_termination_beside_its_own_endless_kernel_runs_out_its_budget_then_ends_abnormally() {
    // The hang timer off: it would reset the endless kernel after 2 s of running (it yields,
    // but never completes), and the termination would not wait out its budget.
    let tdr = kernel::TdrConfig { hang_compute: None, ..kernel::TdrConfig::default() };
    let sys = common::sim_with(SystemConfig { tdr, ..slow_engines() });
    let (h, hog_q, _) = hog(&sys);
    let pid = h.port.process();
    let mark = sys.trace().0.len();
    let start = sys.now();
    sys.terminate(pid, Termination::Normal);
    let took = sys.now().since(start);
    // The spec's 5 s budget passed in device time while the kernel ran, then the rest of the
    // termination went the abnormal way (the context suspended), and the queue is gone.
    assert!((Duration::from_secs(5)..Duration::from_secs(6)).contains(&took), "{took:?}");
    let d = common::ddis_from(&sys, mark);
    let suspend = d.iter().position(|x| matches!(x, Ddi::SuspendContext(_))).expect("abnormal after the budget");
    let destroy = d.iter().position(|x| *x == Ddi::DestroyHwQueue(hog_q.handle())).expect("queue destroyed");
    assert!(suspend < destroy, "{d:?}");
}

#[test]
fn run_for_runs_a_bounded_span_of_virtual_time_beside_a_huge_dispatch() {
    let sys = common::sim_with(slow_engines());
    let (_h, hog_q, hog_v) = hog(&sys);
    let start = sys.now();
    sys.run_for(Duration::from_millis(50));
    assert_eq!(sys.now(), start.plus(Duration::from_millis(50)));
    // 50 ms at 100 µs a wave-instruction: 500 wave-instructions (of either wave), give or
    // take the slice that starts at the end.
    let n = sys.with_gpu(|g| g.compute_stats().instructions);
    assert!((500..=600).contains(&n), "{n} wave-instructions in 50 ms");
    assert!(hog_q.completed() < hog_v);
}

#[test]
fn settle_lets_device_time_pass_only_as_far_as_the_work_takes() {
    let sys = common::sim();
    let c = common::client(&sys);
    let q_ctx = c.context(EngineKind::Copy);
    let mut q = q_ctx.create_queue(umd::QueueOptions::user_mode()).unwrap();
    let mut cb = CommandBuffer::new();
    cb.fill(c.buf.va(), 1 << 20, 0x5a5a_5a5a).timestamp(c.buf.va());
    let start = sys.now();
    let v = q.submit(&cb).unwrap();
    sys.settle();
    assert_eq!(q.completed(), v);
    let cost = CostModel::default();
    // The FILL took 1 MiB at 32 GB/s (plus its packet): the TIMESTAMP after it says so.
    let ts = Time(c.buf.read_u64(0).unwrap());
    let fill = Duration::from_nanos(cost.bulk_ns(1 << 20));
    assert!(ts.since(start) >= fill, "timestamp {ts} after a {fill:?} fill from {start}");
    assert!(ts.since(start) < fill + Duration::from_micros(5));
    // Settling stopped when the work was done: the engine's 20 ms idle period was not reached.
    assert!(sys.now().since(start) < Duration::from_millis(1));
    assert_eq!(sys.power(abi::EngineId(1)), abi::PowerState::F0);
}

/// Sixteen bulk FILLs of one process on the copy engine, then one tiny command buffer of
/// another: the tiny one starts within one turn, long before the bulk work is done.
#[test]
fn a_tiny_command_buffer_starts_within_one_turn_behind_another_processes_bulk_fills() {
    const FILL: u64 = 4 << 20;
    let sys = common::sim();
    let a = common::client(&sys);
    let big: Buffer = a.device.allocate(FILL).unwrap();
    let bulk_ctx = a.context(EngineKind::Copy);
    let mut bulk = bulk_ctx.create_queue(umd::QueueOptions::user_mode()).unwrap();
    let mut cb = CommandBuffer::new();
    for i in 0..16 {
        cb.fill(big.va(), FILL, i);
    }
    let bulk_v = bulk.submit(&cb).unwrap();

    let b = common::client(&sys);
    let tiny_ctx = b.context(EngineKind::Copy);
    let mut tiny = tiny_ctx.create_queue(umd::QueueOptions::user_mode()).unwrap();
    let mut cb = CommandBuffer::new();
    cb.timestamp(b.buf.va()).write_u32(b.buf.va() + 8, 1);
    let start = sys.now();
    let v = tiny.submit(&cb).unwrap();
    tiny.wait(v, common::T).unwrap();

    let cost = CostModel::default();
    let started = Time(b.buf.read_u64(0).unwrap()).since(start);
    assert!(started <= cost.turn + Duration::from_micros(1), "the tiny buffer started {started:?} after submission");
    assert!(bulk.completed() < bulk_v, "the bulk work is far from done when the tiny one completes");
    // All sixteen take 64 MiB at 32 GB/s: about 2 ms of device time, twenty turns.
    bulk.wait(bulk_v, common::T).unwrap();
    // (The wait returns when the last slice starts: its effects are visible from then.)
    assert!(sys.now().since(start) >= Duration::from_nanos(cost.bulk_ns(16 * FILL)) - cost.turn);
    assert_eq!(big.read_u32(FILL - 4).unwrap(), 15, "the last FILL ran last, whole");
}

/// A COPY sliced one chunk per turn, overlapping itself forwards (memmove semantics), across
/// many turns: the result is the one an unsliced copy gives.
#[test]
fn a_sliced_overlapping_copy_resumes_at_chunk_boundaries_with_memmove_results() {
    let cost = CostModel { bulk_chunk: 4096, turn: Duration::from_nanos(1), ..CostModel::default() };
    let sys =
        common::sim_with(SystemConfig { gpu: GpuConfig { cost, ..GpuConfig::default() }, ..SystemConfig::default() });
    let c = common::client(&sys);
    let n = 10 * 4096 + 12;
    let data: Vec<u8> = (0..n + 6000).map(|i| (i * 7 % 251) as u8).collect();
    c.buf.write(0, &data).unwrap();
    let q_ctx = c.context(EngineKind::Copy);
    let mut q = q_ctx.create_queue(umd::QueueOptions::user_mode()).unwrap();
    let mut cb = CommandBuffer::new();
    // dst 6000 bytes above src, overlapping: a forward chunk walk would read bytes it wrote.
    cb.copy(c.buf.va(), c.buf.va() + 6000, n as u64);
    let v = q.submit(&cb).unwrap();
    // One chunk (4 KiB at 32 GB/s: 128 ns, plus the packet's 50 ns) a turn: run 200 ns at
    // a time and count.
    let mut turns = 0;
    while q.completed() < v {
        sys.run_for(Duration::from_nanos(200));
        turns += 1;
        assert!(turns < 100, "still copying after {turns} turns");
    }
    assert!(turns >= 10, "one chunk a turn, eleven chunks: {turns} turns");
    let mut want = data.clone();
    want.copy_within(0..n, 6000);
    let mut got = vec![0; n + 6000];
    c.buf.read(0, &mut got).unwrap();
    assert!(got == want, "memmove semantics across chunk boundaries");
}

/// A client's user-mode queue, with its memory mapped a second time to write by hand.
fn tapped_queue(sys: &kernel::System) -> (common::Client, umd::Queue, std::sync::Arc<common::TapQueue>) {
    let tap = common::TapPort::open(sys);
    let c = common::client_on(tap.clone());
    let q = c.user_queue();
    let t = tap.queue(q.handle());
    (c, q, t)
}

/// Publishes a one-dword NOP at the start of the ring (wptr 4), without ringing.
fn publish_nop(t: &common::TapQueue) {
    let mut nop = Vec::new();
    abi::packet::Packet::Nop { dwords: 1 }.encode(&mut nop);
    t.write_ring(0, &nop);
    t.set_wptr(4);
}

/// A wptr of `u64::MAX` rung as the doorbell value (the value a fresh doorbell word holds
/// after a bind) must not be ignored: it faults the queue, with the wptr named.
#[test]
fn a_wptr_of_u64_max_rung_as_the_doorbell_value_faults_the_queue() {
    let sys = common::sim();
    let (_c, q, t) = tapped_queue(&sys);
    t.set_wptr(u64::MAX);
    t.ring_doorbell(u64::MAX);
    sys.settle();
    let st = q.status().unwrap();
    assert_eq!(st.state, QueueState::Hung);
    assert!(matches!(st.fault.map(|f| f.kind), Some(FaultKind::WptrMisaligned { wptr: u64::MAX })));
    // And the engine may go idle: the hung queue holds no work it could run.
    sys.advance(Duration::from_millis(100));
    assert_eq!(sys.power(abi::EngineId(0)), abi::PowerState::F1);
}

/// Every doorbell value other than the word's current one is a ring, whatever it is; a ring
/// that does not change the word (the wptr the firmware already has) is no ring, and the work
/// it should have announced is found by the idle check before the engine may enter F1.
#[test]
fn any_doorbell_value_that_changes_the_word_is_heard_after_a_bind() {
    for ring in [u64::MAX, 4, 8, 1 << 62] {
        let sys = common::sim();
        let (_c, _q, t) = tapped_queue(&sys);
        publish_nop(&t);
        t.ring_doorbell(ring);
        sys.settle();
        assert_eq!(t.rptr(), 4, "a ring of {ring:#x} ran the published work");
    }
}

#[test]
fn a_ring_that_does_not_change_the_word_is_found_by_the_idle_check() {
    let sys = common::sim();
    let (_c, q, t) = tapped_queue(&sys);
    publish_nop(&t);
    // The word holds the wptr the firmware validated at the bind (0): writing it again is no
    // ring.
    assert_eq!(t.doorbell_word(), 0);
    t.ring_doorbell(0);
    sys.settle();
    assert_eq!(t.rptr(), 0, "not heard");
    // The engine's idle period ends; its F1 request finds the published work and runs it.
    sys.advance(Duration::from_millis(25));
    assert_eq!(t.rptr(), 4);
    assert_eq!(q.status().unwrap().state, QueueState::Mapped);
}

/// Interrupt delivery (`SystemConfig::interrupt_delivery`, the cost model's `interrupt_ns`): a
/// CPU wait on a native fence ends when the fence's interrupt reaches the kernel, the delivery
/// time after the device raised it at the end of the signal packet. One user-mode queue runs a
/// 10 µs `SYNTHETIC` (10,000 ns, then the packet's 50 ns) and a fence `SIGNAL` (50 ns): the
/// interrupt is raised at 10,100 ns, and reaches the kernel at 13,100 ns with a 3 µs delivery
/// time, at 10,100 ns with none.
#[test]
fn a_cpu_wait_ends_when_the_interrupt_is_delivered() {
    for (delivery, ends) in [(0, 10_100), (3_000, 13_100)] {
        let sys = common::sim_with(SystemConfig {
            interrupt_delivery: Duration::from_nanos(delivery),
            ..SystemConfig::default()
        });
        let c = common::client(&sys);
        let fence = c.device.create_fence(0, abi::port::NativeFenceType::Default).unwrap();
        let mut q = c.user_queue();
        let mut cb = CommandBuffer::new();
        cb.synthetic(10_000).signal_fence(&fence, 1);
        q.submit(&cb).unwrap();
        let start = sys.now().as_nanos();
        fence.wait(1, Some(Duration::from_millis(1))).unwrap();
        assert_eq!(sys.now().as_nanos() - start, ends, "delivery {delivery} ns");
    }
}

/// An engine's busy time (`Gpu::engine_busy_ns`, what `doorbell top`'s busy share reads)
/// counts the device time it executed, once, and nothing while it waits or idles; the other
/// engine stays at 0.
#[test]
fn engine_busy_time_counts_execution_once_and_not_idle_time() {
    let sys = common::sim_with(SystemConfig::default());
    let c = common::client(&sys);
    let (compute, copy) = (abi::EngineId(0), abi::EngineId(1));
    let busy = |e| {
        let now = sys.now();
        sys.with_gpu(|g| g.engine_busy_ns(e, now)).unwrap()
    };
    let mut q = c.user_queue();
    let mut cb = CommandBuffer::new();
    cb.synthetic(100_000);
    let mut last = 0;
    for _ in 0..3 {
        last = q.submit(&cb).unwrap();
    }
    q.wait(last, Some(Duration::from_secs(1))).unwrap();
    let after_work = busy(compute);
    // 300 µs of synthetic work plus each packet's own cost, and no more than a few µs of it.
    assert!((300_000..310_000).contains(&after_work), "{after_work}");
    sys.advance(Duration::from_millis(5));
    assert_eq!(busy(compute), after_work, "idle time is not busy time");
    assert_eq!(busy(copy), 0);
    assert!(sys.with_gpu(|g| g.engine_busy_ns(abi::EngineId(9), Time::ZERO)).is_err());
}
