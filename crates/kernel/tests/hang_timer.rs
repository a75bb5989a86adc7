//! The hang timer and TDR, side by side (issue 25): a queue whose work never completes is
//! reset whether or not it yields to preemption.
//!
//! TDR (spec 003) catches a queue that does not answer a preemption request within
//! `TdrDelay`. The hang timer (amdgpu's per-queue hang detection, spec 001 "Queue Resets")
//! asks a queue to preempt once its progress fence has stood still for the timeout, or once
//! it has *run* — executed in a hardware slot, not waited for one, been held, or sat blocked in
//! a `WAIT` — for the timeout since the fence last moved. No answer: the TDR path, a per-queue
//! reset with `PreemptTimeout`. An answer after running that long without progress: a
//! per-queue reset with `HangTimeout`, since a kernel that yields at every instruction can
//! still never end. Any other answer: the queue runs on.
//!
//! Each test here runs on the deterministic driver with the default cost model (a turn is
//! 100 µs of device time) and a 10 ms hang timeout, with the simulator's hung kernel: a
//! `SYNTHETIC` packet that occupies its engine for longer than any run. Times asserted are
//! virtual.

mod common;

use std::time::Duration;

use abi::port::LostReason;
use abi::preempt::{ComputeGranularity, PreemptionCaps};
use abi::queue::FaultKind;
use abi::{DoorbellStatus, HwQueueHandle, Priority, QueueState, Time};
use gpu::GpuConfig;
use kernel::trace::{Ddi, Event, TraceEntry};
use kernel::{System, SystemConfig, TdrConfig};
use umd::{CommandBuffer, Queue, UmdError};

/// The hang timeout.
const HANG: Duration = Duration::from_millis(10);

/// The TDR delay: longer than the hang timeout, so the two paths are told apart by time too.
const DELAY: Duration = Duration::from_millis(20);

/// A kernel that never ends (the simulator's `HUNG_NS`).
const NEVER: u64 = u64::MAX / 4;

/// A system whose compute engine preempts at `level`, with `slots` hardware slots and the
/// hang timer at [`HANG`].
fn system(level: ComputeGranularity, slots: u32) -> System {
    let gpu = GpuConfig {
        hw_slots: slots,
        preemption: PreemptionCaps { compute: level, ..PreemptionCaps::default() },
        ..GpuConfig::default()
    };
    let tdr = TdrConfig { delay: DELAY, hang_compute: Some(HANG), hang_copy: Some(HANG), ..TdrConfig::default() };
    common::sim_with(SystemConfig { gpu, tdr, ..SystemConfig::default() })
}

/// Submits a command buffer that runs `ns` of device time; returns its progress value.
fn work(q: &mut Queue, ns: u64) -> u64 {
    let mut cb = CommandBuffer::new();
    cb.synthetic(ns);
    q.submit(&cb).unwrap()
}

/// The trace from entry `from` on.
fn trace_from(sys: &System, from: usize) -> Vec<TraceEntry> {
    sys.trace().0.into_iter().skip(from).collect()
}

/// Where the first entry matching `f` is, and when it happened.
fn first(trace: &[TraceEntry], f: impl Fn(&Event) -> bool) -> Option<(usize, Time)> {
    trace.iter().position(|e| f(&e.event)).map(|i| (i, trace[i].time))
}

/// Whether the trace holds a reset of any kind for queue `h`.
fn reset_of(trace: &[TraceEntry], h: HwQueueHandle) -> bool {
    trace.iter().any(|e| {
        matches!(e.event, Event::Ddi(Ddi::ResetQueue(q)) if q == h)
            || matches!(e.event, Event::HangTimeout { queue, .. } | Event::TdrTimeout { queue, .. } if queue == h)
    })
}

/// A hung kernel beside one neighbour ([`hung_beside_a_neighbour`]), after six timeouts.
struct Beside {
    /// The hung kernel's queue, and the progress value it never reaches.
    hq: Queue,
    never: u64,
    /// The neighbour's queue.
    nq: Queue,
    /// When the hung kernel was submitted.
    start: Time,
    /// The trace from then on.
    trace: Vec<TraceEntry>,
    /// The system and the clients (their processes own the queues): bound by name where the
    /// struct is taken apart, so they live to the end of the test.
    _keep: (System, common::Client, common::Client),
}

/// Submits a hung kernel on a compute engine with `slots` slots preempting at `level`, beside a
/// neighbour that runs 500 µs command buffers one after another for six timeouts.
fn hung_beside_a_neighbour(level: ComputeGranularity, slots: u32) -> Beside {
    let sys = system(level, slots);
    let n = common::client(&sys);
    let mut nq = n.user_queue();
    let hc = common::client(&sys);
    let mut hq = hc.user_queue();
    let mark = sys.trace().0.len();
    let start = sys.now();
    let never = work(&mut hq, NEVER);
    while sys.now().since(start) < HANG * 6 {
        let v = work(&mut nq, 500_000);
        nq.wait(v, common::T).unwrap();
    }
    let trace = trace_from(&sys, mark);
    Beside { hq, never, nq, start, trace, _keep: (sys, n, hc) }
}

/// Checks that queue `q` was reset by the hang timer after running at least [`HANG`]: hung,
/// guilty, the fault named `HangTimeout`, its doorbell `DisconnectedAbort`, a wait on its
/// work and a new submission refused with `QueueLost` naming that fault. Returns how long it
/// ran (ms) as the fault reports it.
fn assert_hang_reset(q: &mut Queue, never: u64) -> u64 {
    let st = q.status().unwrap();
    assert_eq!(st.state, QueueState::Hung, "{st:?}");
    assert!(st.guilty, "{st:?}");
    assert_eq!(st.flags, abi::port::QUEUE_STATUS_HUNG);
    let fault = st.fault.clone().expect("a fault record");
    let FaultKind::HangTimeout { ran_ms } = fault.kind else { panic!("not the hang timer's reset: {fault}") };
    assert!(ran_ms >= HANG.as_millis() as u64, "reset after running {ran_ms} ms");
    assert_eq!(q.doorbell_status().unwrap(), DoorbellStatus::DisconnectedAbort);
    match q.wait(never, common::T) {
        Err(UmdError::QueueLost { reason, .. }) => assert_eq!(reason, LostReason::Fault(fault.clone())),
        other => panic!("expected QueueLost, got {other:?}"),
    }
    assert!(matches!(q.submit(&CommandBuffer::new()), Err(UmdError::QueueLost { .. })));
    ran_ms
}

/// (a) A hung kernel at `Shader` granularity answers every preemption request at once, so TDR
/// never fires; the hang timer resets it all the same: a check (a preemption request, spec
/// 003's order), the answer, the hang timeout, the per-queue reset, the fault, in that order,
/// once it has run for the timeout. Its three neighbours on the same engine keep it busy too
/// (the engine executes one turn at a time, round-robin, so the hung kernel runs a quarter of
/// the time or more); they complete throughout, before and after, and are not touched.
#[test]
fn a_hung_kernel_that_yields_is_reset_by_the_hang_timer_and_its_neighbours_run_on() {
    let sys = system(ComputeGranularity::Shader, 4);
    let mut innocents: Vec<(common::Client, Queue)> = (0..3)
        .map(|_| {
            let c = common::client(&sys);
            let q = c.user_queue();
            (c, q)
        })
        .collect();
    let hc = common::client(&sys);
    let mut hq = hc.user_queue();
    let h = hq.handle();
    let mark = sys.trace().0.len();
    let fw_recoveries = sys.with_gpu(|g| g.firmware_counts().recoveries());
    let start = sys.now();
    let never = work(&mut hq, NEVER);
    // Rounds of 200 µs command buffers on every innocent queue, for ten timeouts.
    let mut rounds = 0;
    while sys.now().since(start) < HANG * 10 {
        let vs: Vec<u64> = innocents.iter_mut().map(|(_, q)| work(q, 200_000)).collect();
        for ((_, q), v) in innocents.iter_mut().zip(vs) {
            q.wait(v, common::T).unwrap_or_else(|e| panic!("round {rounds}: an innocent queue: {e}"));
        }
        rounds += 1;
    }
    assert!(rounds >= 100, "{rounds} rounds of the innocent queues in ten timeouts");
    let trace = trace_from(&sys, mark);
    let (check, _) = first(&trace, |e| matches!(e, Event::Ddi(Ddi::PreemptQueue(q)) if *q == h)).expect("a check");
    let (answer, _) = first(&trace, |e| matches!(e, Event::Preempted { queue, .. } if *queue == h)).expect("answered");
    let (timeout, at) =
        first(&trace, |e| matches!(e, Event::HangTimeout { queue, .. } if *queue == h)).expect("timeout");
    let (reset, _) = first(&trace, |e| matches!(e, Event::Ddi(Ddi::ResetQueue(q)) if *q == h)).expect("reset");
    let (fault, _) = first(&trace, |e| matches!(e, Event::QueueFault { queue, .. } if *queue == h)).expect("fault");
    assert!(check < answer && answer < timeout && timeout < reset && reset < fault, "{trace:#?}");
    let after = at.since(start);
    assert!(after >= HANG && after <= HANG * 4 + HANG / 2, "reset {after:?} after the hang began");
    assert!(!trace.iter().any(|e| matches!(e.event, Event::TdrTimeout { .. })), "no TDR: it answered");
    assert!(!trace.iter().any(|e| matches!(e.event, Event::Ddi(Ddi::ResetEngine(_) | Ddi::ResetFromTimeout))));
    assert!(sys.with_gpu(|g| g.firmware_counts().recoveries()) > fw_recoveries, "a recovery counted");
    assert_hang_reset(&mut hq, never);
    for (c, q) in &innocents {
        assert!(!reset_of(&trace, q.handle()), "an innocent queue was reset");
        let st = q.status().unwrap();
        assert_ne!(st.state, QueueState::Hung);
        assert!(!st.guilty);
        assert_eq!(c.buf.read_u32(0).unwrap(), 0, "nothing of theirs written by the reset");
    }
}

/// (b) A slow queue that keeps progressing is never reset: command buffers of 6 ms each (under
/// the 10 ms timeout), thirty in a row on each of two queues sharing one slot. Each completes
/// about every 12 ms of wall time, past the timeout, so the timer checks them; each answers
/// having run less than the timeout since its fence last moved, and runs on.
#[test]
fn a_slow_queue_that_progresses_is_never_reset() {
    let sys = system(ComputeGranularity::Shader, 1);
    let clients: Vec<common::Client> = (0..2).map(|_| common::client(&sys)).collect();
    let mut qs: Vec<Queue> = clients.iter().map(|c| c.user_queue()).collect();
    let mark = sys.trace().0.len();
    let start = sys.now();
    let last: Vec<u64> = qs.iter_mut().map(|q| (0..30).map(|_| work(q, 6_000_000)).last().unwrap()).collect();
    for (q, v) in qs.iter().zip(last) {
        q.wait(v, Some(Duration::from_secs(5))).unwrap();
    }
    let took = sys.now().since(start);
    assert!(took >= Duration::from_millis(360), "sixty 6 ms buffers on one slot took {took:?}");
    let trace = trace_from(&sys, mark);
    for q in &qs {
        assert!(!reset_of(&trace, q.handle()), "{trace:#?}");
        assert_ne!(q.status().unwrap().state, QueueState::Hung);
    }
    assert!(
        trace.iter().any(|e| matches!(e.event, Event::Ddi(Ddi::PreemptQueue(_)))),
        "sharing the slot, the queues stood still past the timeout and were checked"
    );
}

/// (c) Time not running is not counted: a queue held off its engine by the kernel
/// (`preempt_queue`) for ten timeouts with a hung kernel queued is not reset while held; once
/// resumed it runs, and is reset one timeout of running later. And a low-priority queue whose
/// slot a high-priority one takes for three timeouts is checked (its fence stood still), answers
/// having run less than the timeout, is not reset, and completes.
#[test]
fn time_held_or_preempted_is_not_counted() {
    // Held by the kernel.
    let sys = system(ComputeGranularity::Shader, 2);
    let c = common::client(&sys);
    let mut q = c.user_queue();
    let h = q.handle();
    let pid = c.port.process();
    sys.preempt_queue(pid, h).unwrap();
    let mark = sys.trace().0.len();
    let never = work(&mut q, NEVER);
    sys.advance(HANG * 10);
    assert!(!reset_of(&trace_from(&sys, mark), h), "reset while held");
    assert_ne!(q.status().unwrap().state, QueueState::Hung);
    sys.resume_queue(pid, h).unwrap();
    let resumed = sys.now();
    sys.advance(HANG * 3);
    let trace = trace_from(&sys, mark);
    let (_, at) = first(&trace, |e| matches!(e, Event::HangTimeout { queue, .. } if *queue == h)).expect("reset");
    assert!(at.since(resumed) >= HANG, "reset {:?} after its release", at.since(resumed));
    assert_hang_reset(&mut q, never);

    // Preempted by a higher-priority queue on the only slot.
    let sys = system(ComputeGranularity::Shader, 1);
    let low = common::client(&sys);
    let mut lq = low.user_queue();
    let lv = work(&mut lq, 8_000_000);
    sys.advance(Duration::from_millis(2));
    let high = common::client(&sys);
    let mut hq = high
        .ctx
        .create_queue(umd::QueueOptions { priority: Priority::High, ..umd::QueueOptions::user_mode() })
        .unwrap();
    let mark = sys.trace().0.len();
    let hv = (0..30).map(|_| work(&mut hq, 1_000_000)).last().unwrap();
    hq.wait(hv, common::T).unwrap();
    lq.wait(lv, common::T).unwrap();
    let trace = trace_from(&sys, mark);
    assert!(!reset_of(&trace, lq.handle()), "{trace:#?}");
    assert!(
        trace.iter().any(|e| matches!(e.event, Event::Ddi(Ddi::PreemptQueue(x)) if x == lq.handle())),
        "its fence stood still past the timeout: checked"
    );
    assert_ne!(lq.status().unwrap().state, QueueState::Hung);
}

/// A hung kernel that shares its only slot with a busy neighbour runs about half the time.
/// The first check (its fence stood still for the timeout) finds it has run less than that,
/// and it runs on; its running time is kept, not restarted, and a later check resets it once
/// it adds up to the timeout.
#[test]
fn a_hung_kernel_sharing_its_slot_is_reset_once_its_running_time_adds_up() {
    let Beside { mut hq, mut nq, never, start, trace, _keep } = hung_beside_a_neighbour(ComputeGranularity::Shader, 1);
    let h = hq.handle();
    let (_, at) = first(&trace, |e| matches!(e, Event::HangTimeout { queue, .. } if *queue == h)).expect("reset");
    let checks =
        trace.iter().filter(|e| matches!(e.event, Event::Ddi(Ddi::PreemptQueue(q)) if q == h) && e.time < at).count();
    assert!(checks >= 2, "{checks} checks: the first found too little running time");
    let ran = assert_hang_reset(&mut hq, never);
    let wall = at.since(start);
    assert!(wall > HANG + HANG / 4, "reset {wall:?} after the hang began: later than a queue running all along");
    assert!(Duration::from_millis(ran) < wall, "ran {ran} ms of {wall:?}: part of the time");
    assert!(!reset_of(&trace, nq.handle()));
    let v = work(&mut nq, 500_000);
    nq.wait(v, common::T).unwrap();
}

/// (d) TDR still catches a queue that does not answer: at `DmaBuffer` granularity a hung kernel
/// cannot stop before its command buffer ends. The hang timer's check goes unanswered for
/// `TdrDelay`, and the queue gets a per-queue reset named `PreemptTimeout` (no `HangTimeout`),
/// while its neighbour runs on.
#[test]
fn a_hung_kernel_that_does_not_yield_is_reset_by_tdr() {
    let Beside { hq, nq, never, trace, _keep, .. } = hung_beside_a_neighbour(ComputeGranularity::DmaBuffer, 2);
    let h = hq.handle();
    let (check, asked) = first(&trace, |e| matches!(e, Event::Ddi(Ddi::PreemptQueue(q)) if *q == h)).expect("a check");
    let (timeout, at) = first(&trace, |e| matches!(e, Event::TdrTimeout { queue, .. } if *queue == h)).expect("TDR");
    let (reset, _) = first(&trace, |e| matches!(e, Event::Ddi(Ddi::ResetQueue(q)) if *q == h)).expect("reset");
    assert!(check < timeout && timeout < reset);
    assert!(at.since(asked) >= DELAY, "TDR after {:?}", at.since(asked));
    assert!(!trace.iter().any(|e| matches!(e.event, Event::HangTimeout { .. })));
    assert!(!trace.iter().any(|e| matches!(e.event, Event::Preempted { queue, .. } if queue == h)), "no answer");
    let st = hq.status().unwrap();
    assert_eq!(st.state, QueueState::Hung);
    assert!(st.guilty);
    let fault = st.fault.expect("a fault record");
    assert!(matches!(fault.kind, FaultKind::PreemptTimeout { waited_ms } if waited_ms >= DELAY.as_millis() as u64));
    assert_eq!(hq.doorbell_status().unwrap(), DoorbellStatus::DisconnectedAbort);
    assert!(matches!(hq.wait(never, common::T), Err(UmdError::QueueLost { .. })));
    assert!(!reset_of(&trace, nq.handle()));
    assert_ne!(nq.status().unwrap().state, QueueState::Hung);
}
