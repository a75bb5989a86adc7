//! Preemption and recovery on the deterministic driver (spec 003): every granularity level
//! stops exactly where its name says and resumes bit-exact; a `WAIT` that does not pass is
//! preemptible; an unanswered request is timed out after `TdrDelay` and recovered by an engine
//! reset in Windows' order, costing only the queue that would not yield; a failed engine reset
//! escalates to an adapter reset; the 6th recovery within `TdrLimitTime` is fatal and the 5th
//! is not; a lost device disconnects its doorbells with `DisconnectedAbort` and the UMD
//! recreates its queue.

mod common;

use std::time::Duration;

use abi::port::KernelPort;
use abi::preempt::{ComputeGranularity, CopyGranularity, PreemptionCaps, StopPoint};
use abi::queue::FaultKind;
use abi::{DoorbellStatus, EngineKind, QueueState};
use gpu::{CostModel, FwEvent, GpuConfig};
use kernel::ddi::{DdiFault, DdiKind, Misbehaviour};
use kernel::trace::{Ddi, Event};
use kernel::{System, SystemConfig, TdrConfig};
use umd::{Buffer, CommandBuffer, Queue, UmdError};

use common::T;

const GROUPS: u32 = 4;
const GROUP: u32 = 64;
const THREADS: usize = (GROUPS * GROUP) as usize;
const ITERS: u32 = 3000;

use program::workloads::rounds_result as expected;

fn config(caps: PreemptionCaps) -> SystemConfig {
    SystemConfig { gpu: GpuConfig { preemption: caps, ..GpuConfig::default() }, ..SystemConfig::default() }
}

fn compute(level: ComputeGranularity) -> SystemConfig {
    config(PreemptionCaps { compute: level, ..PreemptionCaps::default() })
}

/// The answer to request `ticket`: its latency from the trace, running the clock in steps
/// until it comes (or `None` after `limit`).
fn answer(sys: &System, ticket: u64, limit: Duration) -> Option<u64> {
    // The latency comes from the trace, exact whatever the step; the step only bounds the
    // number of looks.
    let step = (limit / 100).max(Duration::from_micros(50));
    let mut waited = Duration::ZERO;
    loop {
        let found = common::events(sys).into_iter().find_map(|e| match e {
            Event::Preempted { ticket: t, latency_ns, .. } if t == ticket => Some(latency_ns),
            _ => None,
        });
        if found.is_some() || waited >= limit {
            return found;
        }
        sys.run_for(step);
        waited += step;
    }
}

/// Where the firmware stopped the queue, from its log (the last save).
fn saved_at(sys: &System) -> Option<StopPoint> {
    sys.with_gpu(|g| g.firmware_log()).into_iter().rev().find_map(|e| match e.event {
        FwEvent::StateSaved { point, .. } => Some(point),
        _ => None,
    })
}

/// A process running `program::workloads::ROUNDS` on a user compute queue, with a flag the command buffer
/// writes after the dispatch.
struct Rounds {
    c: common::Client,
    q: umd::Queue,
    out: Buffer,
    v: u64,
    _kernel: Buffer,
    _args: Buffer,
}

impl Rounds {
    fn start(sys: &System) -> Rounds {
        Rounds::start_at(sys, abi::Priority::Normal)
    }
    fn start_at(sys: &System, priority: abi::Priority) -> Rounds {
        let c = common::client(sys);
        let kernel = c.device.upload(&program::workloads::rounds().to_bytes()).unwrap();
        let out = c.device.allocate(THREADS as u64 * 4).unwrap();
        let args = c.device.upload(&program::workloads::rounds_args(out.va(), ITERS)).unwrap();
        let mut q = c.ctx.create_queue(umd::QueueOptions { priority, ..umd::QueueOptions::user_mode() }).unwrap();
        let mut cb = CommandBuffer::new();
        cb.dispatch(kernel.va(), [GROUPS, 1, 1], [GROUP, 1, 1], args.va()).write_u32(c.buf.va(), 1);
        q.submit(&cb).unwrap();
        // A second command buffer behind it: `DmaBuffer` stops between the two.
        let mut cb = CommandBuffer::new();
        cb.write_u32(c.buf.va() + 4, 2);
        let v = q.submit(&cb).unwrap();
        Rounds { c, q, out, v, _kernel: kernel, _args: args }
    }
    fn pid(&self) -> abi::ProcessId {
        self.c.port.process()
    }
    fn results(&self) -> Vec<u32> {
        (0..THREADS).map(|i| self.out.read_u32(i as u64 * 4).unwrap()).collect()
    }
    /// The first command buffer's flag and the second's.
    fn flags(&self) -> (u32, u32) {
        (self.c.buf.read_u32(0).unwrap(), self.c.buf.read_u32(4).unwrap())
    }
}

/// Each compute level stops where its name says, and the dispatch resumes bit-exact.
#[test]
fn each_compute_level_stops_where_its_name_says_and_resumes_bit_exact() {
    let want = expected(ITERS);
    let mut latencies = Vec::new();
    for level in ComputeGranularity::ALL.into_iter().rev() {
        let sys = common::sim_with(compute(level));
        let r = Rounds::start(&sys);
        // Part-way into the dispatch (it takes about 3 ms of device time in all).
        sys.run_for(Duration::from_micros(300));
        let done_before = r.results().iter().filter(|&&x| x == want).count();
        assert!(done_before < THREADS, "{level}: the dispatch is still running");
        let ticket = sys.preempt_queue(r.pid(), r.q.handle()).unwrap();
        let latency = answer(&sys, ticket, Duration::from_secs(1)).unwrap_or_else(|| panic!("{level}: no answer"));
        let point = saved_at(&sys);
        let threads_done = r.results().iter().filter(|&&x| x == want).count();
        match level {
            ComputeGranularity::Shader => {
                assert_eq!(point, Some(StopPoint::Instruction));
                assert_eq!(latency, 0, "standing at an instruction boundary: answered at once");
            }
            ComputeGranularity::Thread => {
                assert_eq!(point, Some(StopPoint::Wave));
                assert_eq!(threads_done % 32, 0, "whole waves (32 lanes) are done");
            }
            ComputeGranularity::ThreadGroup => {
                assert_eq!(point, Some(StopPoint::Group));
                assert_eq!(threads_done % GROUP as usize, 0, "whole workgroups are done");
            }
            ComputeGranularity::Dispatch => {
                assert_eq!(point, Some(StopPoint::Packet));
                assert_eq!(threads_done, THREADS, "the dispatch finished");
                assert_eq!(r.flags(), (0, 0), "the packet after it has not run");
            }
            ComputeGranularity::DmaBuffer => {
                assert_eq!(point, Some(StopPoint::CommandBuffer));
                assert_eq!(r.flags(), (1, 0), "the whole first command buffer ran, not the second");
            }
            ComputeGranularity::None => {
                assert_eq!(point, None, "nothing to save: it ran dry");
                assert_eq!(r.flags(), (1, 2));
            }
        }
        // Off its slot, off the run list: it stays put.
        let st = r.q.status().unwrap().state;
        assert!(matches!(st, QueueState::Preempted | QueueState::Unmapped), "{level}: {st:?}");
        let frozen = r.results();
        sys.run_for(Duration::from_millis(5));
        assert_eq!(r.results(), frozen, "{level}: a preempted queue does not run");
        // Resumed, it finishes where it stopped: bit-exact.
        sys.resume_queue(r.pid(), r.q.handle()).unwrap();
        r.q.wait(r.v, T).unwrap();
        assert_eq!(r.results(), vec![want; THREADS], "{level}");
        assert_eq!(r.flags(), (1, 2));
        let log = sys.with_gpu(|g| g.firmware_log());
        let requested =
            log.iter().position(|e| matches!(e.event, FwEvent::PreemptRequested { ticket: t, .. } if t == ticket));
        let answered =
            log.iter().position(|e| matches!(e.event, FwEvent::PreemptAnswered { ticket: t, .. } if t == ticket));
        assert!(requested < answered, "{level}: request, then answer");
        if point.is_some() {
            let saved = log.iter().position(|e| matches!(e.event, FwEvent::StateSaved { .. }));
            let restored = log.iter().position(|e| matches!(e.event, FwEvent::Restored { .. }));
            assert!(requested < saved && saved < answered && answered < restored, "{level}: {log:?}");
        }
        latencies.push((level, latency));
    }
    // Finer levels answer no later than coarser ones.
    for w in latencies.windows(2) {
        assert!(w[0].1 <= w[1].1, "{latencies:?}");
    }
}

/// A copy engine stops a large FILL between chunks, or only after the command buffer.
#[test]
fn a_copy_engine_stops_between_chunks_or_after_the_command_buffer() {
    for level in [CopyGranularity::Chunk, CopyGranularity::DmaBuffer] {
        let sys = common::sim_with(config(PreemptionCaps { copy: level, ..PreemptionCaps::default() }));
        let c = common::client(&sys);
        let ctx = c.context(EngineKind::Copy);
        let mut q = ctx.create_queue(umd::QueueOptions::user_mode()).unwrap();
        let big = c.device.allocate(4 << 20).unwrap();
        let mut cb = CommandBuffer::new();
        cb.fill(big.va(), 4 << 20, 0xABCD_1234).write_u32(c.buf.va(), 1);
        let v = q.submit(&cb).unwrap();
        // 4 MiB at 32 GB/s is about 131 µs: stop part-way.
        sys.run_for(Duration::from_micros(20));
        let ticket = sys.preempt_queue(c.port.process(), q.handle()).unwrap();
        answer(&sys, ticket, Duration::from_millis(10)).expect("answered");
        match level {
            CopyGranularity::Chunk => {
                assert_eq!(saved_at(&sys), Some(StopPoint::Chunk));
                assert_ne!(big.read_u32((4 << 20) - 4).unwrap(), 0xABCD_1234, "the fill is part-way");
            }
            _ => {
                assert_eq!(saved_at(&sys), None, "it ran to the end of the command buffer (and dry)");
                assert_eq!(c.buf.read_u32(0).unwrap(), 1);
            }
        }
        sys.resume_queue(c.port.process(), q.handle()).unwrap();
        q.wait(v, T).unwrap();
        for off in (0..4u64 << 20).step_by(4096) {
            assert_eq!(big.read_u32(off).unwrap(), 0xABCD_1234, "{level} at {off}");
        }
    }
}

/// Costs that make an endless kernel burn virtual time fast (see `device_time.rs`), and a
/// short TDR delay.
fn slow(level: ComputeGranularity, tdr: TdrConfig) -> SystemConfig {
    let cost = CostModel {
        wave_instruction: Duration::from_micros(100),
        turn: Duration::from_millis(10),
        ..CostModel::default()
    };
    SystemConfig {
        gpu: GpuConfig {
            cost,
            preemption: PreemptionCaps { compute: level, ..PreemptionCaps::default() },
            ..GpuConfig::default()
        },
        tdr,
        ..SystemConfig::default()
    }
}

/// An endless kernel on a user-mode compute queue of a new process.
fn hog(sys: &System) -> (common::Client, umd::Queue, Buffer) {
    let c = common::client(sys);
    let (q, spin) = c.endless_queue();
    (c, q, spin)
}

/// A `WAIT` that does not pass is preemptible (spec 003); under `None` it is not, and the
/// request times out into a recovery that hangs only that queue.
#[test]
fn a_blocked_wait_is_preemptible_except_under_none_where_it_times_out() {
    for level in [ComputeGranularity::DmaBuffer, ComputeGranularity::None] {
        let tdr = TdrConfig { delay: Duration::from_millis(100), ..TdrConfig::default() };
        let sys = common::sim_with(slow(level, tdr));
        let c = common::client(&sys);
        let mut q = c.user_queue();
        let mut cb = CommandBuffer::new();
        cb.write_u32(c.buf.va() + 8, 5).wait(c.buf.va(), 1).write_u32(c.buf.va() + 4, 9);
        q.submit(&cb).unwrap();
        sys.settle();
        let ticket = sys.preempt_queue(c.port.process(), q.handle()).unwrap();
        let answered = answer(&sys, ticket, Duration::from_millis(300));
        let evs = common::events(&sys);
        if level == ComputeGranularity::None {
            assert_eq!(answered, None);
            assert!(evs.iter().any(|e| matches!(e, Event::TdrTimeout { .. })), "timed out");
            let st = q.status().unwrap();
            assert_eq!(st.state, QueueState::Hung);
            assert!(matches!(st.fault.unwrap().kind, FaultKind::PreemptTimeout { waited_ms } if waited_ms >= 100));
        } else {
            assert!(answered.is_some());
            assert_eq!(saved_at(&sys), Some(StopPoint::Packet), "stopped before the WAIT");
            assert!(!evs.iter().any(|e| matches!(e, Event::TdrTimeout { .. })), "not a hang");
            // Resumed and released, the rest runs: nothing before the WAIT ran twice.
            sys.resume_queue(c.port.process(), q.handle()).unwrap();
            c.buf.write(8, &0u32.to_le_bytes()).unwrap();
            c.buf.write(0, &1u32.to_le_bytes()).unwrap();
            q.finish(T).unwrap();
            assert_eq!(c.buf.read_u32(4).unwrap(), 9);
            assert_eq!(c.buf.read_u32(8).unwrap(), 0, "the write before the WAIT was not re-executed");
        }
    }
}

/// A long kernel that yields is never reset by TDR: its preemption succeeds. (Held off its
/// engine afterwards, it does not run, so the hang timer does not count the time either.)
#[test]
fn a_long_kernel_that_yields_is_preempted_and_never_reset() {
    let sys = common::sim_with(slow(ComputeGranularity::Shader, TdrConfig::default()));
    let (c, q, _spin) = hog(&sys);
    sys.run_for(Duration::from_millis(50));
    let ticket = sys.preempt_queue(c.port.process(), q.handle()).unwrap();
    assert!(answer(&sys, ticket, Duration::from_millis(1)).is_some());
    sys.run_for(Duration::from_secs(3));
    let evs = common::events(&sys);
    assert!(!evs.iter().any(|e| matches!(e, Event::TdrTimeout { .. } | Event::Recovered { .. })));
    assert_ne!(q.status().unwrap().state, QueueState::Hung);
}

/// An endless kernel that cannot be cut (granularity `Dispatch`) ignores the request: after
/// `TdrDelay` the engine is reset in Windows' order, the guilty queue hangs and is reported,
/// and a neighbour on the same engine keeps its work and results.
#[test]
fn an_unanswered_preemption_resets_the_engine_and_costs_only_the_guilty_queue() {
    let sys = common::sim_with(slow(ComputeGranularity::Dispatch, TdrConfig::default()));
    let (c, q, _spin) = hog(&sys);
    // The neighbour: another process on the same compute engine, queued behind.
    let n = common::client(&sys);
    let mut nq = n.user_queue();
    let mut cb = CommandBuffer::new();
    for i in 0..16 {
        cb.write_u32(n.buf.va() + i * 4, i as u32 + 100);
    }
    let nv = nq.submit(&cb).unwrap();
    let fence = c.device.create_fence(0, abi::port::NativeFenceType::Default).unwrap();
    sys.run_for(Duration::from_millis(20));
    let before = common::events(&sys).len();
    let ticket = sys.preempt_queue(c.port.process(), q.handle()).unwrap();
    assert_eq!(answer(&sys, ticket, Duration::from_millis(1900)), None, "no answer before TdrDelay");
    sys.run_for(Duration::from_millis(200));
    let evs = common::events_from(&sys, before);
    let pos = |f: &dyn Fn(&Event) -> bool| evs.iter().position(f).unwrap_or_else(|| panic!("missing in {evs:#?}"));
    let request = pos(&|e| matches!(e, Event::Ddi(Ddi::PreemptQueue(h)) if *h == q.handle()));
    let timeout = pos(&|e| matches!(e, Event::TdrTimeout { queue, .. } if *queue == q.handle()));
    let reset = pos(&|e| matches!(e, Event::Ddi(Ddi::ResetEngine(_))));
    let fault = pos(&|e| matches!(e, Event::QueueFault { queue, .. } if *queue == q.handle()));
    let abort = pos(
        &|e| matches!(e, Event::Status { queue, status: DoorbellStatus::DisconnectedAbort } if *queue == q.handle()),
    );
    let recovered = pos(&|e| matches!(e, Event::Recovered { engine: Some(_), count: 1 }));
    assert!(request < timeout && timeout < reset && reset < fault && fault < abort && abort < recovered);
    assert!(!evs.iter().any(|e| matches!(e, Event::Ddi(Ddi::ResetFromTimeout))), "no adapter reset");
    // The guilty queue: hung, reported, its device's fences AlwaysSignaled.
    let st = q.status().unwrap();
    assert_eq!(st.state, QueueState::Hung);
    assert!(matches!(st.fault.unwrap().kind, FaultKind::PreemptTimeout { waited_ms } if waited_ms >= 2000));
    assert_eq!(q.doorbell_status().unwrap(), DoorbellStatus::DisconnectedAbort);
    assert_eq!(fence.value().unwrap(), abi::port::FENCE_ALWAYS_SIGNALED);
    // The neighbour: all its work, bit-exact.
    nq.wait(nv, T).unwrap();
    for i in 0..16 {
        assert_eq!(n.buf.read_u32(i * 4).unwrap(), i as u32 + 100);
    }
    // And the engine keeps working for it.
    let mut cb = CommandBuffer::new();
    cb.write_u32(n.buf.va() + 1024, 7);
    let v = nq.submit(&cb).unwrap();
    nq.wait(v, T).unwrap();
    assert_eq!(n.buf.read_u32(1024).unwrap(), 7);
}

/// A failed engine reset escalates to an adapter reset: every device is lost.
#[test]
fn a_failed_engine_reset_escalates_to_an_adapter_reset() {
    let sys = common::sim_with(slow(ComputeGranularity::Dispatch, TdrConfig::default()));
    sys.inject_ddi_fault(DdiFault { ddi: DdiKind::ResetEngine, call: 1 });
    let (c, q, _spin) = hog(&sys);
    let n = common::client(&sys);
    let nq = n.user_queue();
    sys.run_for(Duration::from_millis(20));
    sys.preempt_queue(c.port.process(), q.handle()).unwrap();
    sys.run_for(Duration::from_millis(2100));
    let evs = common::events(&sys);
    let pos = |f: &dyn Fn(&Event) -> bool| evs.iter().position(f).unwrap_or_else(|| panic!("missing in {evs:#?}"));
    let reset = pos(&|e| matches!(e, Event::Ddi(Ddi::ResetEngine(_))));
    let adapter = pos(&|e| matches!(e, Event::Ddi(Ddi::ResetFromTimeout)));
    let restart = pos(&|e| matches!(e, Event::Ddi(Ddi::RestartFromTimeout)));
    let lost = pos(&|e| matches!(e, Event::DeviceLost { device } if *device == n.device.handle()));
    assert!(reset < adapter && adapter < restart && restart < lost);
    assert!(evs.iter().any(|e| matches!(e, Event::Recovered { engine: None, .. })));
    // Every queue: stopped and told to recreate itself.
    for queue in [&q, &nq] {
        assert_eq!(queue.doorbell_status().unwrap(), DoorbellStatus::DisconnectedAbort);
        assert_eq!(queue.status().unwrap().state, QueueState::Hung);
    }
}

/// `TdrLimitCount` recoveries within `TdrLimitTime` are survived; one more is fatal: every
/// device is lost and the adapter refuses new work with a typed error.
#[test]
fn the_sixth_recovery_within_the_limit_time_is_fatal_and_the_fifth_is_not() {
    let tdr = TdrConfig { delay: Duration::from_millis(100), ..TdrConfig::default() };
    let sys = common::sim_with(slow(ComputeGranularity::Dispatch, tdr));
    let bystander = common::client(&sys);
    let bq = bystander.user_queue();
    for round in 1..=6u32 {
        let (c, q, _spin) = hog(&sys);
        sys.run_for(Duration::from_millis(20));
        sys.preempt_queue(c.port.process(), q.handle()).unwrap();
        sys.run_for(Duration::from_millis(150));
        let evs = common::events(&sys);
        let count = evs.iter().filter(|e| matches!(e, Event::Recovered { .. })).count() as u32;
        assert_eq!(count, round);
        let fatal = evs.iter().any(|e| matches!(e, Event::AdapterFatal));
        assert_eq!(fatal, round == 6, "round {round}");
        let bystander_state = bq.status().unwrap().state;
        assert_eq!(bystander_state == QueueState::Hung, round == 6, "round {round}: {bystander_state:?}");
    }
    assert_eq!(bq.doorbell_status().unwrap(), DoorbellStatus::DisconnectedAbort);
    let e = sys.open_process().and_then(|p| p.create_device()).unwrap_err();
    assert!(matches!(e, abi::port::KernelError::AdapterLost { recoveries: 6, window_ms: 60_000 }), "{e}");
}

/// Zero or absurd TDR settings are refused with the field named.
#[test]
fn bad_tdr_settings_are_refused_with_the_field_named() {
    let absurd = Duration::from_secs(1 << 20);
    for (cfg, field) in [
        (TdrConfig { delay: Duration::ZERO, ..TdrConfig::default() }, "tdr.delay"),
        (TdrConfig { delay: absurd, ..TdrConfig::default() }, "tdr.delay"),
        (TdrConfig { limit_time: absurd, ..TdrConfig::default() }, "tdr.limit_time"),
        (TdrConfig { limit_time: Duration::ZERO, ..TdrConfig::default() }, "tdr.limit_time"),
        (TdrConfig { limit_count: 0, ..TdrConfig::default() }, "tdr.limit_count"),
        (TdrConfig { limit_count: 1 << 20, ..TdrConfig::default() }, "tdr.limit_count"),
        (TdrConfig { ddi_delay: Duration::ZERO, ..TdrConfig::default() }, "tdr.ddi_delay"),
        (TdrConfig { ddi_delay: absurd, ..TdrConfig::default() }, "tdr.ddi_delay"),
        (TdrConfig { hang_compute: Some(Duration::ZERO), ..TdrConfig::default() }, "tdr.hang_compute"),
        (TdrConfig { hang_copy: Some(absurd), ..TdrConfig::default() }, "tdr.hang_copy"),
    ] {
        let e = System::sim(SystemConfig { tdr: cfg, ..SystemConfig::default() }).err().expect("refused");
        assert_eq!(common::refusal(&e).map(|r| r.0), Some(field), "{e}");
    }
}

/// Zero or absurd device timers and sizes (the quanta, the idle period, the slots, a turn's
/// budgets, the wave width) are refused with the field named, on both drivers.
#[test]
fn bad_device_settings_are_refused_with_the_field_named() {
    use gpu::GpuConfig;
    let absurd = Duration::from_secs(1 << 20);
    let d = GpuConfig::default;
    for (gpu, field) in [
        (GpuConfig { process_quantum: Duration::ZERO, ..d() }, "process_quantum"),
        (GpuConfig { process_quantum: absurd, ..d() }, "process_quantum"),
        (GpuConfig { gang_quantum: Duration::ZERO, ..d() }, "gang_quantum"),
        (GpuConfig { idle_period: Duration::ZERO, ..d() }, "idle_period"),
        (GpuConfig { idle_period: absurd, ..d() }, "idle_period"),
        (GpuConfig { hw_slots: 0, ..d() }, "hw_slots"),
        (GpuConfig { packet_budget: 0, ..d() }, "packet_budget"),
        (GpuConfig { dispatch_budget: 0, ..d() }, "dispatch_budget"),
        (GpuConfig { wave_width: 0, ..d() }, "wave_width"),
        (GpuConfig { wave_width: 65, ..d() }, "wave_width"),
        (GpuConfig { engines: vec![], ..d() }, "engines"),
    ] {
        let cfg = || SystemConfig { gpu: gpu.clone(), ..SystemConfig::default() };
        let e = System::sim(cfg()).err().expect("refused");
        assert_eq!(common::refusal(&e).map(|r| r.0), Some(field), "{e}");
        let e = System::live(cfg()).err().expect("refused");
        assert_eq!(common::refusal(&e).map(|r| r.0), Some(field), "{e}");
    }
    assert!(System::sim(SystemConfig::default()).is_ok(), "the defaults are in range");
}

/// Device lost (spec 000): doorbells disconnected with `DisconnectedAbort`, queues stopped,
/// waits failed with `DeviceLost`; user mode destroys and recreates queue, doorbell and ring
/// on a new device, and that one works.
#[test]
fn a_lost_device_aborts_its_doorbells_and_the_umd_recreates_its_queue() {
    let sys = common::sim();
    let c = common::client(&sys);
    let mut q = c.user_queue();
    let mut cb = CommandBuffer::new();
    cb.wait(c.buf.va(), 1).write_u32(c.buf.va() + 4, 7);
    let v = q.submit(&cb).unwrap();
    sys.settle();
    let before = common::events(&sys).len();
    sys.mark_device_error(c.port.process(), c.device.handle()).unwrap();
    let evs = common::events_from(&sys, before);
    let lost = evs.iter().position(|e| matches!(e, Event::DeviceLost { .. })).unwrap();
    let suspend = evs.iter().position(|e| matches!(e, Event::Ddi(Ddi::SuspendContext(_)))).unwrap();
    let abort =
        evs.iter().position(|e| matches!(e, Event::Status { status: DoorbellStatus::DisconnectedAbort, .. })).unwrap();
    assert!(lost < suspend && suspend < abort, "{evs:#?}");
    assert_eq!(q.doorbell_status().unwrap(), DoorbellStatus::DisconnectedAbort);
    // A wait on the stopped queue fails: the queue is lost with its device.
    let e = q.wait(v, T).unwrap_err();
    let lost = |e: &UmdError| match e {
        UmdError::QueueLost { reason: abi::port::LostReason::Fault(f), .. } => f.kind == FaultKind::DeviceLost,
        _ => false,
    };
    assert!(lost(&e), "{e:?}");
    // The stopped queue never runs its work, even once the WAIT would pass, and even if its
    // context is resumed.
    c.buf.write(0, &1u32.to_le_bytes()).unwrap();
    sys.resume_context(c.port.process(), c.ctx.handle()).unwrap();
    sys.settle();
    assert_eq!(c.buf.read_u32(4).unwrap(), 0);
    // Recreate: a new device, queue, doorbell and ring.
    drop(q);
    let device = umd::Device::open(c.port.clone()).unwrap();
    let ctx = device.create_context(device.engine(EngineKind::Compute).unwrap()).unwrap();
    let mut q2 = ctx.create_queue(umd::QueueOptions::user_mode()).unwrap();
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va() + 8, 11);
    let v2 = q2.submit(&cb).unwrap();
    q2.wait(v2, T).unwrap();
    assert_eq!(c.buf.read_u32(8).unwrap(), 11);
}

/// The INFO query reports the device's preemption capabilities.
#[test]
fn the_info_query_reports_the_preemption_caps() {
    let caps = PreemptionCaps { compute: ComputeGranularity::ThreadGroup, copy: CopyGranularity::DmaBuffer };
    let sys = common::sim_with(config(caps));
    let port = sys.open_process().unwrap();
    assert_eq!(port.adapter_info().preemption, caps);
    let sys = common::sim();
    assert_eq!(sys.open_process().unwrap().adapter_info().preemption, PreemptionCaps::default());
    assert_eq!(PreemptionCaps::default().compute, ComputeGranularity::Shader);
}

/// A high-priority queue's work starts as soon as the engine can take a slot from a busy
/// low-priority holder: at once (within the engine's current turn) at the finest level, only
/// after the holder's command buffer at `DmaBuffer`.
#[test]
fn a_high_priority_queue_cuts_in_as_soon_as_the_granularity_allows() {
    let mut starts = Vec::new();
    for level in [ComputeGranularity::Shader, ComputeGranularity::DmaBuffer] {
        let mut cfg = compute(level);
        cfg.gpu.hw_slots = 2;
        let sys = common::sim_with(cfg);
        let lows = [Rounds::start_at(&sys, abi::Priority::Low), Rounds::start_at(&sys, abi::Priority::Low)];
        let h = common::client(&sys);
        let mut hq = h
            .ctx
            .create_queue(umd::QueueOptions { priority: abi::Priority::High, ..umd::QueueOptions::user_mode() })
            .unwrap();
        sys.run_for(Duration::from_micros(300));
        let t0 = sys.now().as_nanos();
        let mut cb = CommandBuffer::new();
        cb.timestamp(h.buf.va());
        let v = hq.submit(&cb).unwrap();
        hq.wait(v, T).unwrap();
        let start = h.buf.read_u64(0).unwrap() - t0;
        let turn = CostModel::default().turn.as_nanos() as u64;
        // The firmware's own preemption of a low holder, logged: at the finest level where it
        // stood (mid-dispatch), at `DmaBuffer` at the end of its command buffer.
        let saved: Vec<StopPoint> = sys
            .with_gpu(|g| g.firmware_log())
            .into_iter()
            .filter_map(|e| match e.event {
                FwEvent::StateSaved { point, .. } => Some(point),
                _ => None,
            })
            .collect();
        match level {
            ComputeGranularity::Shader => {
                assert!(start <= turn, "{level}: started after {start} ns");
                assert_eq!(saved.first(), Some(&StopPoint::Instruction), "{saved:?}");
            }
            _ => {
                assert!(start > 4 * turn, "{level}: started after {start} ns");
                assert_eq!(saved.first(), Some(&StopPoint::CommandBuffer), "{saved:?}");
            }
        }
        // The evicted holder resumes and both low queues finish bit-exact.
        for r in &lows {
            r.q.wait(r.v, T).unwrap();
            assert_eq!(r.results(), vec![expected(ITERS); THREADS]);
        }
        starts.push(start);
    }
    assert!(starts[0] < starts[1], "{starts:?}");
}

/// The live driver's two cut-ins, driven by hand: while the kernel holds the device's attention
/// raised (it waits for the device lock), or once a queue that would take a busy holder's slot
/// rings its doorbell, the engine ends its turn at the next check (a few hundred
/// wave-instructions) instead of running out its budget.
#[test]
fn attention_or_a_higher_priority_ring_ends_a_turn_at_the_next_check() {
    let sys = common::sim();
    let (_c, _q, _spin) = hog(&sys);
    let h = common::client(&sys);
    let mut hq = h
        .ctx
        .create_queue(umd::QueueOptions { priority: abi::Priority::High, ..umd::QueueOptions::user_mode() })
        .unwrap();
    sys.run_for(Duration::from_micros(10));
    let mut at = sys.now().as_nanos() + 1_000_000_000;
    // One step of the device, far enough ahead that the engine is free; instructions run.
    let mut step = |attention: bool| {
        at += 1_000_000_000;
        sys.with_gpu(|g| {
            let a = g.attention();
            let _raised = attention.then(|| a.raise());
            let before = g.compute_stats().instructions;
            g.step(abi::Time(at));
            g.compute_stats().instructions - before
        })
    };
    let full = step(false);
    assert_eq!(full, GpuConfig::default().dispatch_budget, "a whole turn's budget");
    let cut = step(true);
    assert!(cut <= 512, "attention: the turn ends at the next check ({cut} instructions)");
    assert_eq!(step(false), full);
    // The high-priority queue rings (its doorbell not latched yet): the turn ends at the next
    // check, and the queue's TIMESTAMP runs at once, in the same step (the firmware latches the
    // ring and takes its scheduling pass again), before the hog's next turn.
    let mut cb = CommandBuffer::new();
    cb.timestamp(h.buf.va());
    hq.submit(&cb).unwrap();
    step(false);
    let ts = h.buf.read_u64(0).unwrap();
    let per = CostModel::default().wave_instruction.as_nanos() as u64;
    assert!(ts >= at && ts - at <= 512 * per, "a sentinel ring: the TIMESTAMP read {ts}, the step began at {at}");
}

/// amdgpu's hang timer: a queue whose progress has not moved for its timeout is asked to
/// preempt. A queue blocked in a preemptible `WAIT` answers, runs on and is never reset; an
/// endless kernel that cannot be cut does not answer and gets a per-queue reset, in order,
/// reported by `QUERY_STATUS` as hung and guilty, while its device's other queue runs on.
/// The client recreates the queue; the reset one's handle is refused once destroyed.
#[test]
fn the_hang_timer_resets_only_a_queue_that_will_not_yield() {
    let tdr = TdrConfig {
        delay: Duration::from_millis(100),
        hang_compute: Some(Duration::from_millis(400)),
        hang_copy: Some(Duration::from_millis(400)),
        ..TdrConfig::default()
    };
    let sys = common::sim_with(slow(ComputeGranularity::Dispatch, tdr));
    // A queue blocked on a flag nobody sets yet: preemptible, so not hung.
    let w = common::client(&sys);
    let mut wq = w.user_queue();
    let mut cb = CommandBuffer::new();
    cb.wait(w.buf.va(), 1).write_u32(w.buf.va() + 4, 5);
    let wv = wq.submit(&cb).unwrap();
    // An endless kernel beside it, and a second queue of the hog's own device.
    let (c, q, _spin) = hog(&sys);
    let mut q2 = c.user_queue();
    sys.run_for(Duration::from_secs(2));
    let evs = common::events(&sys);
    let pos = |f: &dyn Fn(&Event) -> bool| evs.iter().position(f).unwrap_or_else(|| panic!("missing in {evs:#?}"));
    let check = pos(&|e| matches!(e, Event::Ddi(Ddi::PreemptQueue(h)) if *h == q.handle()));
    let timeout = pos(&|e| matches!(e, Event::TdrTimeout { queue, .. } if *queue == q.handle()));
    let reset = pos(&|e| matches!(e, Event::Ddi(Ddi::ResetQueue(h)) if *h == q.handle()));
    let fault = pos(&|e| matches!(e, Event::QueueFault { queue, .. } if *queue == q.handle()));
    assert!(check < timeout && timeout < reset && reset < fault);
    assert!(!evs.iter().any(|e| matches!(e, Event::Ddi(Ddi::ResetEngine(_) | Ddi::ResetFromTimeout))));
    assert!(sys.with_gpu(|g| g.firmware_log()).iter().any(|e| matches!(e.event, FwEvent::QueueReset { .. })));
    // The waiting queue was checked too, answered, and was not reset.
    assert!(evs.iter().any(|e| matches!(e, Event::Ddi(Ddi::PreemptQueue(h)) if *h == wq.handle())));
    assert!(!evs.iter().any(|e| matches!(e, Event::TdrTimeout { queue, .. } if *queue == wq.handle())));
    let st = q.status().unwrap();
    assert_eq!(st.state, QueueState::Hung);
    assert_eq!(st.flags, abi::port::QUEUE_STATUS_HUNG);
    assert!(st.guilty);
    let ws = wq.status().unwrap();
    assert_eq!((ws.flags, ws.guilty), (0, false));
    // Released, the waiting queue finishes its work.
    w.buf.write(0, &1u32.to_le_bytes()).unwrap();
    wq.wait(wv, T).unwrap();
    assert_eq!(w.buf.read_u32(4).unwrap(), 5);
    // The hog's device is not lost: its other queue works, and a recreated queue works.
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va() + 8, 3);
    let v = q2.submit(&cb).unwrap();
    q2.wait(v, T).unwrap();
    let old = q.handle();
    drop(q);
    let mut q3 = c.user_queue();
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va() + 12, 4);
    let v = q3.submit(&cb).unwrap();
    q3.wait(v, T).unwrap();
    assert_eq!((c.buf.read_u32(8).unwrap(), c.buf.read_u32(12).unwrap()), (3, 4));
    let e = c.port.query_queue(old).unwrap_err();
    assert!(matches!(e, abi::port::KernelError::BadHandle { .. }), "{e}");
}

/// A failed per-queue reset escalates to an adapter reset, which does not preserve local
/// memory: queues created before it report VRAM lost (and innocent), local allocations read
/// zero.
#[test]
fn a_failed_queue_reset_escalates_and_the_adapter_reset_loses_vram() {
    let tdr = TdrConfig {
        delay: Duration::from_millis(100),
        hang_compute: Some(Duration::from_millis(400)),
        ..TdrConfig::default()
    };
    let sys = common::sim_with(slow(ComputeGranularity::Dispatch, tdr));
    sys.inject_ddi_fault(DdiFault { ddi: DdiKind::ResetQueue, call: 1 });
    let n = common::client(&sys);
    let nq = n.user_queue();
    let vram = n
        .device
        .allocate_with(&abi::port::AllocationDesc {
            domain: abi::port::MemoryDomain::Local,
            ..abi::port::AllocationDesc::system(4096)
        })
        .unwrap();
    vram.write(0, &7u32.to_le_bytes()).unwrap();
    let (_c, q, _spin) = hog(&sys);
    sys.run_for(Duration::from_secs(2));
    let evs = common::events(&sys);
    let reset = evs.iter().position(|e| matches!(e, Event::Ddi(Ddi::ResetQueue(_)))).unwrap();
    let adapter = evs.iter().position(|e| matches!(e, Event::Ddi(Ddi::ResetFromTimeout))).unwrap();
    assert!(reset < adapter);
    let st = nq.status().unwrap();
    assert_eq!(st.flags, abi::port::QUEUE_STATUS_HUNG | abi::port::QUEUE_STATUS_VRAM_LOST);
    assert!(!st.guilty, "lost with the adapter, not its own doing");
    assert_eq!(q.status().unwrap().state, QueueState::Hung);
    assert_eq!(vram.read_u32(0).unwrap(), 0, "local memory did not survive the adapter reset");
}

/// Memory migration in spec 001's order: every queue of the process preempted, then the move
/// with its page-table update, then the queues resumed. Work submitted while the migration
/// waits for a long dispatch runs after it, and nothing is lost.
#[test]
fn a_migration_preempts_moves_and_resumes_and_racing_work_runs_after() {
    let sys = common::sim_with(compute(ComputeGranularity::Dispatch));
    let r = Rounds::start(&sys);
    let copy_ctx = r.c.context(EngineKind::Copy);
    let mut cq = copy_ctx.create_queue(umd::QueueOptions::user_mode()).unwrap();
    sys.run_for(Duration::from_micros(300));
    let before = common::events(&sys).len();
    let buf = r.c.buf.handle();
    sys.migrate_allocation(r.pid(), buf, abi::port::MemoryDomain::Local).unwrap();
    // The dispatch has not finished: the move waits for it.
    let evs = common::events_from(&sys, before);
    assert!(evs.iter().any(|e| matches!(e, Event::MigrationStarted { .. })));
    assert!(!evs.iter().any(|e| matches!(e, Event::Ddi(Ddi::MigrateAllocation { .. }))));
    // Work racing the migration: queued, not run.
    let mut cb = CommandBuffer::new();
    cb.timestamp(r.c.buf.va() + 64).write_u32(r.c.buf.va() + 72, 9);
    let cv = cq.submit(&cb).unwrap();
    sys.run_for(Duration::from_micros(10));
    assert_eq!(r.c.buf.read_u32(72).unwrap(), 0, "not while the migration waits");
    cq.wait(cv, T).unwrap();
    r.q.wait(r.v, T).unwrap();
    assert_eq!(r.results(), vec![expected(ITERS); THREADS]);
    assert_eq!(r.flags(), (1, 2));
    assert_eq!(r.c.buf.read_u32(72).unwrap(), 9);
    let evs = common::events_from(&sys, before);
    let pos = |f: &dyn Fn(&Event) -> bool| evs.iter().position(f).unwrap_or_else(|| panic!("missing in {evs:#?}"));
    let started = pos(&|e| matches!(e, Event::MigrationStarted { .. }));
    let last_preempt = evs.iter().rposition(|e| matches!(e, Event::Ddi(Ddi::PreemptQueue(_)))).unwrap();
    let last_answer = evs.iter().rposition(|e| matches!(e, Event::Preempted { .. })).unwrap();
    let moved =
        pos(&|e| matches!(e, Event::Ddi(Ddi::MigrateAllocation { domain: abi::port::MemoryDomain::Local, .. })));
    let resident = pos(&|e| matches!(e, Event::Residency { resident: true, .. }));
    let resumed = pos(&|e| matches!(e, Event::Ddi(Ddi::ResumeContext(_))));
    assert!(started < last_preempt && last_preempt < last_answer && last_answer < moved, "{evs:#?}");
    assert!(moved < resident && resident < resumed);
    assert_eq!(evs.iter().filter(|e| matches!(e, Event::Ddi(Ddi::PreemptQueue(_)))).count(), 2, "both queues");
    // The racing work ran after the move (its TIMESTAMP is after the migration's answer).
    let (trace, _) = sys.trace();
    let moved_at = trace.iter().find(|e| matches!(e.event, Event::Ddi(Ddi::MigrateAllocation { .. }))).unwrap().time;
    assert!(r.c.buf.read_u64(64).unwrap() >= moved_at.as_nanos());
}

/// A queue that will not yield to a migration is reset (TDR), reported, and the migration
/// completes without it.
#[test]
fn a_queue_that_will_not_yield_to_a_migration_is_reset_and_the_migration_completes() {
    let sys =
        common::sim_with(slow(ComputeGranularity::Dispatch, TdrConfig { hang_compute: None, ..TdrConfig::default() }));
    let (c, q, _spin) = hog(&sys);
    sys.run_for(Duration::from_millis(20));
    sys.migrate_allocation(c.port.process(), c.buf.handle(), abi::port::MemoryDomain::Local).unwrap();
    sys.run_for(Duration::from_millis(2100));
    let evs = common::events(&sys);
    let reset = evs.iter().position(|e| matches!(e, Event::Ddi(Ddi::ResetEngine(_)))).expect("engine reset");
    let moved = evs.iter().position(|e| matches!(e, Event::Ddi(Ddi::MigrateAllocation { .. }))).expect("moved");
    assert!(reset < moved);
    assert_eq!(q.status().unwrap().state, QueueState::Hung);
}

/// The fence IDs `DxgkDdiSubmitCommand` gave each kernel-mode buffer of `q`, in order.
fn fence_ids(ev: &[Event], q: abi::HwQueueHandle) -> Vec<u64> {
    ev.iter()
        .filter_map(|e| match e {
            Event::Ddi(Ddi::SubmitCommand { queue, fence_id }) if *queue == q => Some(*fence_id),
            _ => None,
        })
        .collect()
}

/// Preempts kernel-mode queue `q` and lets the OS act on the answer; returns the events
/// from the request on, and what the OS took back (paging fence IDs, other fence IDs).
/// What the OS took back from a preempted kernel-mode queue: (paging fence IDs, other IDs).
type TakenBack = Option<(Vec<u64>, Vec<u64>)>;

fn preempt_and_take_back(sys: &System, q: abi::HwQueueHandle) -> (Vec<Event>, TakenBack) {
    let mark = common::events(sys).len();
    let ticket = sys.preempt_queue(q.owner(), q).unwrap();
    assert!(answer(sys, ticket, Duration::from_millis(10)).is_some());
    sys.run_for(Duration::from_micros(200));
    let ev = common::events_from(sys, mark);
    let taken = ev.iter().find_map(|e| match e {
        Event::Unsubmitted { paging, other, .. } => Some((paging.clone(), other.clone())),
        _ => None,
    });
    (ev, taken)
}

/// Spec 003's resubmission rules for kernel-mode buffers a preemption took out of the
/// hardware queue: paging buffers come back with the **same** fence IDs and move before any
/// other buffer on the engine; the others come back with **new** fence IDs. Nothing runs
/// twice and nothing is lost.
#[test]
fn preempted_kernel_buffers_are_resubmitted_paging_first_with_their_fence_ids() {
    let sys = common::sim();
    let c = common::client(&sys);
    let pid = c.port.process();
    let mut other = c.kernel_queue();
    // The paging queue on a second context: without the rule, the first context's buffers
    // would move first.
    let paging_ctx = c.context(EngineKind::Compute);
    let mut paging = paging_ctx.create_queue(umd::QueueOptions::kernel_mode()).unwrap();
    sys.set_paging_queue(pid, paging.handle()).unwrap();
    let flag = c.buf.va() + 0x1000;
    for i in 0..3u32 {
        let mut cb = CommandBuffer::new();
        cb.wait(flag, 1).write_u32(c.buf.va() + 4 * i as u64, 100 + i);
        other.submit(&cb).unwrap();
    }
    for i in 0..2u32 {
        let mut cb = CommandBuffer::new();
        cb.wait(flag, 1).write_u32(c.buf.va() + 0x100 + 4 * i as u64, 200 + i);
        paging.submit(&cb).unwrap();
    }
    sys.run_for(Duration::from_micros(200));
    let ev = common::events(&sys);
    let (first_paging, first_other) = (fence_ids(&ev, paging.handle()), fence_ids(&ev, other.handle()));
    assert_eq!(first_paging.len(), 2, "{ev:?}");
    assert_eq!(first_other.len(), 3, "{ev:?}");
    // Both block in their first buffer's WAIT, which is preemptible: nothing has started.
    let mark = ev.len();
    let t_other = sys.preempt_queue(pid, other.handle()).unwrap();
    let t_paging = sys.preempt_queue(pid, paging.handle()).unwrap();
    assert!(answer(&sys, t_other, Duration::from_millis(10)).is_some());
    assert!(answer(&sys, t_paging, Duration::from_millis(10)).is_some());
    sys.run_for(Duration::from_micros(200));
    let ev = common::events_from(&sys, mark);
    // Each answer, then its take-back, then the buffers it took back.
    let taken = |q: abi::HwQueueHandle| {
        ev.iter()
            .find_map(|e| match e {
                Event::Unsubmitted { queue, paging, other } if *queue == q => Some((paging.clone(), other.clone())),
                _ => None,
            })
            .unwrap_or_else(|| panic!("{q} not taken back: {ev:?}"))
    };
    assert_eq!(taken(paging.handle()), (first_paging.clone(), vec![]));
    assert_eq!(taken(other.handle()), (vec![], first_other.clone()));
    for q in [paging.handle(), other.handle()] {
        let at = |want: &dyn Fn(&Event) -> bool| ev.iter().position(want).unwrap();
        let answered = at(&|e| matches!(e, Event::Preempted { queue, .. } if *queue == q));
        let take = at(&|e| matches!(e, Event::Ddi(Ddi::TakeBack { queue, .. }) if *queue == q));
        let listed = at(&|e| matches!(e, Event::Unsubmitted { queue, .. } if *queue == q));
        let resubmitted = at(&|e| matches!(e, Event::Ddi(Ddi::SubmitCommand { queue, .. }) if *queue == q));
        assert!(answered < take && take < listed && listed < resubmitted, "{q}: {ev:?}");
    }
    // Paging: the same fence IDs. The others: new ones, above every ID given before.
    assert_eq!(fence_ids(&ev, paging.handle()), first_paging);
    let again = fence_ids(&ev, other.handle());
    assert_eq!(again.len(), 3);
    let highest = *first_paging.iter().chain(&first_other).max().unwrap();
    assert!(again.iter().all(|&id| id > highest), "{again:?} after {first_other:?}");
    assert!(again.windows(2).all(|w| w[0] < w[1]));
    // Paging buffers move before any other buffer on the engine.
    let last_paging =
        ev.iter().rposition(|e| matches!(e, Event::Ddi(Ddi::SubmitCommand { queue, .. }) if *queue == paging.handle()));
    let first_non_paging =
        ev.iter().position(|e| matches!(e, Event::Ddi(Ddi::SubmitCommand { queue, .. }) if *queue == other.handle()));
    assert!(last_paging < first_non_paging, "{ev:?}");
    // Held queues run nothing until resumed; then everything runs once.
    assert_eq!(c.buf.read_u32(0).unwrap(), 0);
    c.buf.write_u64(0x1000, 1).unwrap();
    sys.resume_queue(pid, paging.handle()).unwrap();
    sys.resume_queue(pid, other.handle()).unwrap();
    other.finish(T).unwrap();
    paging.finish(T).unwrap();
    for i in 0..3u32 {
        assert_eq!(c.buf.read_u32(4 * i as u64).unwrap(), 100 + i);
    }
    for i in 0..2u32 {
        assert_eq!(c.buf.read_u32(0x100 + 4 * i as u64).unwrap(), 200 + i);
    }
    assert_eq!((other.completed(), paging.completed()), (3, 2));
}

/// A kernel-mode buffer preempted in the middle (a split DMA buffer) is not resubmitted: it
/// resumes from its saved state, so its packets that already wrote memory never run again;
/// only the buffers after it are taken back.
#[test]
fn a_kernel_buffer_preempted_inside_resumes_and_only_later_ones_are_resubmitted() {
    let sys = common::sim_with(compute(ComputeGranularity::Dispatch));
    let c = common::client(&sys);
    let pid = c.port.process();
    let mut q = c.kernel_queue();
    let (a, b, flag) = (c.buf.va(), c.buf.va() + 0x100, c.buf.va() + 0x1000);
    c.buf.write_u64(0, 7).unwrap();
    // Copy a to b, then overwrite a, then wait: run twice, b would end up 0xffffffff.
    let mut first = CommandBuffer::new();
    first.copy(a, b, 8).fill(a, 8, 0xffff_ffff).wait(flag, 1);
    q.submit(&first).unwrap();
    for i in 0..2u32 {
        let mut cb = CommandBuffer::new();
        cb.write_u32(c.buf.va() + 0x200 + 4 * i as u64, 300 + i);
        q.submit(&cb).unwrap();
    }
    sys.run_for(Duration::from_micros(200));
    let before = fence_ids(&common::events(&sys), q.handle());
    assert_eq!(before.len(), 3);
    let (ev, taken) = preempt_and_take_back(&sys, q.handle());
    assert_eq!(taken, Some((vec![], before[1..].to_vec())), "{ev:?}");
    assert_eq!(fence_ids(&ev, q.handle()).len(), 2);
    c.buf.write_u64(0x1000, 1).unwrap();
    sys.resume_queue(pid, q.handle()).unwrap();
    q.finish(T).unwrap();
    assert_eq!(c.buf.read_u64(0x100).unwrap(), 7, "the copy ran once, before the fill");
    assert_eq!(c.buf.read_u64(0).unwrap(), u64::MAX);
    assert_eq!((c.buf.read_u32(0x200).unwrap(), c.buf.read_u32(0x204).unwrap()), (300, 301));
    assert_eq!(q.completed(), 3);
}

/// A paging queue is chosen before its first submission, and only among kernel-mode queues.
#[test]
fn a_paging_queue_is_chosen_before_its_first_submission() {
    let sys = common::sim();
    let c = common::client(&sys);
    let pid = c.port.process();
    let user = c.user_queue();
    let e = sys.set_paging_queue(pid, user.handle()).unwrap_err();
    assert!(matches!(e, abi::port::KernelError::WrongQueueMode { .. }), "{e}");
    let mut km = c.kernel_queue();
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va(), 1);
    km.submit(&cb).unwrap();
    km.finish(T).unwrap();
    let e = sys.set_paging_queue(pid, km.handle()).unwrap_err();
    assert_eq!(common::refusal(&e).map(|r| r.0), Some("queue"), "{e}");
}

/// A buffer stopped inside its first packet (a bulk `FILL` at a chunk boundary) has started
/// though the engine stands at the buffer's first byte: it resumes from the saved chunk and
/// is not resubmitted; the buffer after it is.
#[test]
fn a_kernel_buffer_stopped_inside_its_first_packet_is_not_resubmitted() {
    let sys = common::sim();
    let c = common::client(&sys);
    let pid = c.port.process();
    let ctx = c.context(EngineKind::Copy);
    let mut q = ctx.create_queue(umd::QueueOptions::kernel_mode()).unwrap();
    const BIG: u64 = 4 << 20;
    let big = c.device.allocate(BIG).unwrap();
    let mut first = CommandBuffer::new();
    first.fill(big.va(), BIG, 0xabab_abab).write_u32(c.buf.va(), 1);
    q.submit(&first).unwrap();
    let mut second = CommandBuffer::new();
    second.write_u32(c.buf.va() + 4, 2);
    q.submit(&second).unwrap();
    // Part-way through the fill (4 MiB at the default 32 GB/s is about 130 µs).
    sys.run_for(Duration::from_micros(30));
    let ids = fence_ids(&common::events(&sys), q.handle());
    assert_eq!(ids.len(), 2);
    let (ev, taken) = preempt_and_take_back(&sys, q.handle());
    assert_eq!(saved_at(&sys), Some(StopPoint::Chunk));
    assert_eq!(taken, Some((vec![], vec![ids[1]])), "{ev:?}");
    assert!(!ev.iter().any(|e| matches!(e, Event::DriverBug { .. })), "{ev:?}");
    sys.resume_queue(pid, q.handle()).unwrap();
    q.finish(T).unwrap();
    let mut bytes = vec![0u8; BIG as usize];
    big.read(0, &mut bytes).unwrap();
    assert!(bytes.iter().all(|&b| b == 0xab));
    assert_eq!((c.buf.read_u32(0).unwrap(), c.buf.read_u32(4).unwrap()), (1, 2));
    assert_eq!(q.completed(), 2);
}

/// An engine reset whose report a test corrupts or delays, and what the OS makes of it:
/// the events after the timeout.
struct ResetRun {
    evs: Vec<Event>,
    q: umd::Queue,
    nq: umd::Queue,
    _keep: (System, common::Client, Buffer, common::Client),
}

fn engine_reset_that(m: Option<Misbehaviour>) -> ResetRun {
    let sys = common::sim_with(slow(ComputeGranularity::Dispatch, TdrConfig::default()));
    if let Some(m) = m {
        sys.inject_misbehaviour(DdiKind::ResetEngine, m);
    }
    let (c, q, _spin) = hog(&sys);
    let n = common::client(&sys);
    let nq = n.user_queue();
    sys.run_for(Duration::from_millis(20));
    let before = common::events(&sys).len();
    sys.preempt_queue(c.port.process(), q.handle()).unwrap();
    sys.run_for(Duration::from_millis(2100));
    let evs = common::events_from(&sys, before);
    ResetRun { evs, q, nq, _keep: (sys, c, _spin, n) }
}

/// A reset that reports an aborted fence ID outside what the queue submitted is a driver bug
/// (spec 003's TDR, Windows' refusal of a bad `DxgkDdiResetEngine` report): refused loudly
/// in the trace, never trusted, and recovery escalates to the adapter.
#[test]
fn a_bogus_fence_id_from_an_engine_reset_is_refused_and_the_adapter_is_reset() {
    let ResetRun { evs, q, nq, _keep } = engine_reset_that(Some(Misbehaviour::BogusFenceId));
    let pos = |f: &dyn Fn(&Event) -> bool| evs.iter().position(f).unwrap_or_else(|| panic!("missing in {evs:#?}"));
    let reset = pos(&|e| matches!(e, Event::Ddi(Ddi::ResetEngine(_))));
    let bug = pos(&|e| matches!(e, Event::DriverBug { what } if what.contains(&q.handle().to_string())));
    let adapter = pos(&|e| matches!(e, Event::Ddi(Ddi::ResetFromTimeout)));
    assert!(reset < bug && bug < adapter, "{evs:#?}");
    assert!(evs.iter().any(|e| matches!(e, Event::Recovered { engine: None, .. })));
    // Nothing was decided from the report: every queue is lost with the adapter.
    assert_eq!(nq.doorbell_status().unwrap(), DoorbellStatus::DisconnectedAbort);
    assert_eq!(q.status().unwrap().state, QueueState::Hung);
}

/// The same for a per-queue reset (the hang timer's path).
#[test]
fn a_bogus_fence_id_from_a_queue_reset_is_refused_and_the_adapter_is_reset() {
    let tdr = TdrConfig {
        delay: Duration::from_millis(100),
        hang_compute: Some(Duration::from_millis(400)),
        ..TdrConfig::default()
    };
    let sys = common::sim_with(slow(ComputeGranularity::Dispatch, tdr));
    sys.inject_misbehaviour(DdiKind::ResetQueue, Misbehaviour::BogusFenceId);
    let (_c, q, _spin) = hog(&sys);
    sys.run_for(Duration::from_secs(2));
    let evs = common::events(&sys);
    let pos = |f: &dyn Fn(&Event) -> bool| evs.iter().position(f).unwrap_or_else(|| panic!("missing in {evs:#?}"));
    let reset = pos(&|e| matches!(e, Event::Ddi(Ddi::ResetQueue(_))));
    let bug = pos(&|e| matches!(e, Event::DriverBug { .. }));
    let adapter = pos(&|e| matches!(e, Event::Ddi(Ddi::ResetFromTimeout)));
    assert!(reset < bug && bug < adapter, "{evs:#?}");
    assert_eq!(q.status().unwrap().state, QueueState::Hung);
}

/// A reset DDI that answers after `TdrDdiDelay` (5 s) is treated as one that never
/// answered: recovery escalates to the adapter. One that answers within it is used.
#[test]
fn a_reset_slower_than_tdr_ddi_delay_escalates_to_the_adapter() {
    let ResetRun { evs, _keep, .. } = engine_reset_that(Some(Misbehaviour::Slow(Duration::from_secs(6))));
    let pos = |f: &dyn Fn(&Event) -> bool| evs.iter().position(f).unwrap_or_else(|| panic!("missing in {evs:#?}"));
    let reset = pos(&|e| matches!(e, Event::Ddi(Ddi::ResetEngine(_))));
    let late = pos(&|e| matches!(e, Event::DdiTimeout { ddi: DdiKind::ResetEngine, took_ms: 6000 }));
    let adapter = pos(&|e| matches!(e, Event::Ddi(Ddi::ResetFromTimeout)));
    assert!(reset < late && late < adapter, "{evs:#?}");

    let ResetRun { evs, q, nq, _keep } = engine_reset_that(Some(Misbehaviour::Slow(Duration::from_secs(4))));
    assert!(!evs.iter().any(|e| matches!(e, Event::DdiTimeout { .. } | Event::Ddi(Ddi::ResetFromTimeout))), "{evs:#?}");
    assert!(evs.iter().any(|e| matches!(e, Event::Recovered { engine: Some(_), .. })));
    assert_eq!(q.status().unwrap().state, QueueState::Hung);
    assert_ne!(nq.doorbell_status().unwrap(), DoorbellStatus::DisconnectedAbort, "the neighbour is untouched");
}

/// A migration whose move fails takes the buffer's mapping out: a queue whose ring lies in
/// it reports `InvalidVa` (amdgpu's `AMDGPU_USERQ_STATE_INVALID_VA`), its doorbell is aborted
/// and it is not resumed; a queue of the same process whose ring lies elsewhere resumes and
/// runs.
#[test]
fn a_failed_migration_leaves_the_queues_in_the_buffer_invalid_va_and_the_others_running() {
    let sys = common::sim();
    let p = common::RawProc::open(&sys);
    let pid = p.port.process();
    let uq = p.create(p.desc(abi::queue::DOORBELL_INDEX_ANY)).unwrap().handle;
    p.doorbell(uq).unwrap();
    let kq = p.create_kernel().unwrap().handle;
    sys.inject_ddi_fault(DdiFault { ddi: DdiKind::MigrateAllocation, call: 1 });
    let before = common::events(&sys).len();
    sys.migrate_allocation(pid, p.ring.handle, abi::port::MemoryDomain::Local).unwrap();
    sys.run_for(Duration::from_micros(100));
    let evs = common::events_from(&sys, before);
    let pos = |f: &dyn Fn(&Event) -> bool| evs.iter().position(f).unwrap_or_else(|| panic!("missing in {evs:#?}"));
    let moved = pos(&|e| matches!(e, Event::Ddi(Ddi::MigrateAllocation { .. })));
    let lost = pos(&|e| matches!(e, Event::MappingLost { allocation, .. } if *allocation == p.ring.handle));
    let abort =
        pos(&|e| matches!(e, Event::Status { queue, status: DoorbellStatus::DisconnectedAbort } if *queue == uq));
    assert!(moved < lost && lost < abort, "{evs:#?}");
    assert!(!evs.iter().any(|e| matches!(e, Event::Residency { .. })), "nothing moved");
    let st = p.port.query_queue(uq).unwrap();
    assert_eq!((st.state, st.fault, st.guilty), (QueueState::InvalidVa, None, false));
    // The kernel-mode queue (its ring is the kernel's own) runs on.
    p.port.submit_command(kq, &abi::packet::progress_fence_words(1)).unwrap();
    sys.run_for(Duration::from_micros(100));
    assert_eq!(p.port.query_queue(kq).unwrap().completed, 1);
    let e = p.port.submit_command(uq, &abi::packet::progress_fence_words(1)).unwrap_err();
    let va = p.ring.va;
    assert!(
        matches!(e, abi::port::KernelError::QueueLost { reason: abi::port::LostReason::InvalidVa { va: v }, .. } if v == va),
        "{e}"
    );
}

/// A context suspend (`DxgkddiSuspendContext`: "KMD preempts the context") respects the
/// engine's granularity: under `DmaBuffer` a queue in the middle of a command buffer runs it
/// to its end, then leaves, and the next one waits for the resume; under `Shader` it leaves
/// at once, part-way through the dispatch. Either way it resumes bit-exact.
#[test]
fn a_context_suspend_stops_each_queue_where_its_granularity_allows() {
    let want = expected(ITERS);
    for level in [ComputeGranularity::DmaBuffer, ComputeGranularity::Shader] {
        let sys = common::sim_with(compute(level));
        let r = Rounds::start(&sys);
        sys.run_for(Duration::from_micros(300));
        assert!(r.results().iter().filter(|&&x| x == want).count() < THREADS, "still running");
        let before = common::events(&sys).len();
        sys.suspend_context(r.pid(), r.c.ctx.handle()).unwrap();
        sys.run_for(Duration::from_millis(10));
        let done = r.results().iter().filter(|&&x| x == want).count();
        match level {
            ComputeGranularity::DmaBuffer => {
                assert_eq!(r.flags(), (1, 0), "the command buffer ran to its end, not the next");
                // The answer it owed came, and was traced.
                let evs = common::events_from(&sys, before);
                assert!(evs.iter().any(|e| matches!(e, Event::Preempted { queue, .. } if *queue == r.q.handle())));
            }
            _ => {
                assert!(done < THREADS, "it left part-way through the dispatch");
                assert_eq!(r.flags(), (0, 0));
            }
        }
        let frozen = r.results();
        sys.run_for(Duration::from_millis(5));
        assert_eq!(r.results(), frozen, "{level}: a suspended context runs nothing");
        sys.resume_context(r.pid(), r.c.ctx.handle()).unwrap();
        r.q.wait(r.v, T).unwrap();
        assert_eq!(r.results(), vec![want; THREADS], "{level}");
        assert_eq!(r.flags(), (1, 2));
    }
}

/// A suspend owed an answer that never comes (an endless kernel under `DmaBuffer`) is timed
/// out like any preemption request: after `TdrDelay` the engine is reset and only that queue
/// hangs.
#[test]
fn a_suspend_that_is_never_answered_is_recovered_by_tdr() {
    let sys =
        common::sim_with(slow(ComputeGranularity::DmaBuffer, TdrConfig { hang_compute: None, ..TdrConfig::default() }));
    let (c, q, _spin) = hog(&sys);
    sys.run_for(Duration::from_millis(20));
    sys.suspend_context(c.port.process(), c.ctx.handle()).unwrap();
    sys.run_for(Duration::from_millis(1900));
    assert!(!common::events(&sys).iter().any(|e| matches!(e, Event::TdrTimeout { .. })), "not before TdrDelay");
    sys.run_for(Duration::from_millis(200));
    let evs = common::events(&sys);
    let timeout = evs.iter().position(|e| matches!(e, Event::TdrTimeout { queue, .. } if *queue == q.handle()));
    let reset = evs.iter().position(|e| matches!(e, Event::Ddi(Ddi::ResetEngine(_))));
    assert!(timeout.is_some() && timeout < reset, "{evs:#?}");
    assert_eq!(q.status().unwrap().state, QueueState::Hung);
}

/// The device's own id for queue `q` of process `pid` (its firmware log names queues so).
fn fw_id(sys: &System, pid: abi::ProcessId, q: abi::HwQueueHandle) -> gpu::FwQueueId {
    gpu::FwQueueId::from_bits(sys.device_queue_id(pid, q).unwrap().expect("the queue is on the device"))
}

/// Asserts that the firmware log holds a preemption of `queue` asked by `by` and answered —
/// request, then (if `saved`) its state saved, then the answer — and returns the positions of
/// the request and the answer, and the ticket.
fn asked_and_answered(
    log: &[gpu::FwLogEntry],
    queue: gpu::FwQueueId,
    by: gpu::Requester,
    saved: bool,
) -> (usize, usize, u64) {
    let request = log
        .iter()
        .position(|e| matches!(e.event, FwEvent::PreemptRequested { queue: q, by: b, .. } if q == queue && b == by))
        .unwrap_or_else(|| panic!("no request of {queue} by {by:?} in {log:#?}"));
    let FwEvent::PreemptRequested { ticket, .. } = log[request].event else { unreachable!() };
    let answer = request
        + log[request..]
            .iter()
            .position(|e| matches!(e.event, FwEvent::PreemptAnswered { queue: q, ticket: t, .. } if q == queue && t == ticket))
            .unwrap_or_else(|| panic!("request of {queue} (ticket {ticket}) never answered: {log:#?}"));
    let save =
        log[request..answer].iter().any(|e| matches!(e.event, FwEvent::StateSaved { queue: q, .. } if q == queue));
    assert_eq!(save, saved, "{queue}: state saved between request and answer? {log:#?}");
    (request, answer, ticket)
}

/// The kernel trace's answer to ticket `ticket` on queue `q`, after position `after`.
fn traced_answer(evs: &[Event], q: abi::HwQueueHandle, ticket: u64, after: usize) -> usize {
    evs.iter()
        .position(|e| matches!(e, Event::Preempted { queue, ticket: t, .. } if *queue == q && *t == ticket))
        .filter(|&p| p > after)
        .unwrap_or_else(|| panic!("no traced answer to {ticket} on {q} after {after}: {evs:#?}"))
}

/// Issue 11: every cause of a preemption — a higher priority, a spent quantum, a context
/// suspend, D3, a memory migration (and teardown, below) — goes through a request and an
/// answer, in the firmware log in that order (with the state saved between them when the
/// queue leaves a slot with work), and for the kernel's causes also in the kernel trace after
/// the DDI that asked. (Before, a suspend — and so D3 and teardown — that found the queue where
/// it could stop took it off at once, with nothing in either log.)
#[test]
fn every_preemption_cause_is_a_request_then_an_answer_in_the_log() {
    use gpu::Requester::{Os, Scheduler};
    let one_slot = |level| {
        let mut cfg = compute(level);
        cfg.gpu.hw_slots = 1;
        common::sim_with(cfg)
    };

    // A higher priority: the low holder is stopped mid-dispatch, and restored afterwards.
    let sys = one_slot(ComputeGranularity::Shader);
    let low = Rounds::start_at(&sys, abi::Priority::Low);
    sys.run_for(Duration::from_micros(300));
    common::high_priority_write(&sys);
    low.q.wait(low.v, T).unwrap();
    let log = sys.with_gpu(|g| g.firmware_log());
    let id = fw_id(&sys, low.pid(), low.q.handle());
    let (_, answer, _) = asked_and_answered(&log, id, Scheduler, true);
    assert!(log[answer..].iter().any(|e| matches!(e.event, FwEvent::Restored { queue, .. } if queue == id)));

    // A spent quantum: two processes' long kernels over one slot.
    let sys = one_slot(ComputeGranularity::Shader);
    let (a, b) = (common::client(&sys), common::client(&sys));
    let (mut qa, mut qb) = (a.user_queue(), b.user_queue());
    for q in [&mut qa, &mut qb] {
        let mut cb = CommandBuffer::new();
        cb.synthetic(30_000_000);
        q.submit(&cb).unwrap();
    }
    sys.run_for(Duration::from_millis(15));
    let log = sys.with_gpu(|g| g.firmware_log());
    asked_and_answered(&log, fw_id(&sys, a.port.process(), qa.handle()), Scheduler, true);

    // A context suspend: stopped at an instruction, answered at once, traced after the DDI.
    let sys = common::sim_with(compute(ComputeGranularity::Shader));
    let r = Rounds::start(&sys);
    sys.run_for(Duration::from_micros(300));
    let before = common::events(&sys).len();
    sys.suspend_context(r.pid(), r.c.ctx.handle()).unwrap();
    let log = sys.with_gpu(|g| g.firmware_log());
    let (request, _, ticket) = asked_and_answered(&log, fw_id(&sys, r.pid(), r.q.handle()), Os, true);
    assert!(matches!(log[request + 1].event, FwEvent::StateSaved { point: StopPoint::Instruction, .. }));
    let evs = common::events_from(&sys, before);
    let suspend = evs.iter().position(|e| matches!(e, Event::Ddi(Ddi::SuspendContext(_)))).unwrap();
    traced_answer(&evs, r.q.handle(), ticket, suspend);

    // D3 (an idle device): every queue is asked and answers, nothing to save, before its
    // doorbell is disconnected.
    let sys = common::sim();
    let c = common::client(&sys);
    let q = c.user_queue();
    let before = common::events(&sys).len();
    sys.enter_d3().unwrap();
    let log = sys.with_gpu(|g| g.firmware_log());
    let (_, _, ticket) = asked_and_answered(&log, fw_id(&sys, c.port.process(), q.handle()), Os, false);
    let evs = common::events_from(&sys, before);
    let d3 = evs.iter().position(|e| matches!(e, Event::DevicePower { d3: true })).unwrap();
    let suspend = evs.iter().position(|e| matches!(e, Event::Ddi(Ddi::SuspendContext(_)))).unwrap();
    let answer = traced_answer(&evs, q.handle(), ticket, suspend);
    let retry = evs
        .iter()
        .position(
            |e| matches!(e, Event::Status { queue, status: DoorbellStatus::DisconnectedRetry } if *queue == q.handle()),
        )
        .unwrap();
    assert!(d3 < suspend && answer < retry, "{evs:#?}");

    // A memory migration: asked, answered once the dispatch ends (`Dispatch`), then moved.
    let sys = common::sim_with(compute(ComputeGranularity::Dispatch));
    let r = Rounds::start(&sys);
    sys.run_for(Duration::from_micros(300));
    let before = common::events(&sys).len();
    sys.migrate_allocation(r.pid(), r.c.buf.handle(), abi::port::MemoryDomain::Local).unwrap();
    r.q.wait(r.v, T).unwrap();
    let log = sys.with_gpu(|g| g.firmware_log());
    let (_, _, ticket) = asked_and_answered(&log, fw_id(&sys, r.pid(), r.q.handle()), Os, true);
    let evs = common::events_from(&sys, before);
    let asked = evs.iter().position(|e| matches!(e, Event::Ddi(Ddi::PreemptQueue(h)) if *h == r.q.handle())).unwrap();
    let answer = traced_answer(&evs, r.q.handle(), ticket, asked);
    let moved = evs.iter().position(|e| matches!(e, Event::Ddi(Ddi::MigrateAllocation { .. }))).unwrap();
    assert!(answer < moved, "{evs:#?}");
}

/// Process teardown (spec 000 abnormal termination: "KMD preempts the context and removes it
/// from its HW run list", then the queues are destroyed) goes through the request and its
/// answer: nothing is destroyed while the hardware may still run it. A queue that runs to the
/// end of its command buffer first (`DmaBuffer`) is destroyed after its answer; one that never
/// answers (an endless kernel under `Dispatch`) is recovered by TDR first, in Windows' order,
/// and its neighbour on the engine keeps running. (Before, teardown destroyed the queues right
/// after the suspend, answers still owed.)
#[test]
fn teardown_waits_for_each_queue_s_answer_or_its_recovery_before_destroying_it() {
    // Answered at the end of the command buffer.
    let sys = common::sim_with(compute(ComputeGranularity::DmaBuffer));
    let r = Rounds::start(&sys);
    sys.run_for(Duration::from_micros(300));
    let (pid, qh) = (r.pid(), r.q.handle());
    let id = fw_id(&sys, pid, qh);
    let before = common::events(&sys).len();
    sys.terminate(pid, kernel::Termination::Abnormal);
    let evs = common::events_from(&sys, before);
    let pos = |f: &dyn Fn(&Event) -> bool| evs.iter().position(f).unwrap_or_else(|| panic!("missing in {evs:#?}"));
    let suspend = pos(&|e| matches!(e, Event::Ddi(Ddi::SuspendContext(_))));
    let answer = pos(&|e| matches!(e, Event::Preempted { queue, .. } if *queue == qh));
    let destroy = pos(&|e| matches!(e, Event::Ddi(Ddi::DestroyHwQueue(h)) if *h == qh));
    assert!(suspend < answer && answer < destroy, "{evs:#?}");
    let log = sys.with_gpu(|g| g.firmware_log());
    asked_and_answered(&log, id, gpu::Requester::Os, true);
    assert!(!evs.iter().any(|e| matches!(e, Event::TdrTimeout { .. })), "it answered: no recovery");

    // Never answered: TDR first, then the destroy; the neighbour runs on.
    let sys =
        common::sim_with(slow(ComputeGranularity::Dispatch, TdrConfig { hang_compute: None, ..TdrConfig::default() }));
    let n = common::client(&sys);
    let mut nq = n.user_queue();
    let (c, q, _spin) = hog(&sys);
    sys.run_for(Duration::from_millis(20));
    let (pid, qh) = (c.port.process(), q.handle());
    let before = common::events(&sys).len();
    let t0 = sys.now();
    sys.terminate(pid, kernel::Termination::Abnormal);
    let evs = common::events_from(&sys, before);
    let pos = |f: &dyn Fn(&Event) -> bool| evs.iter().position(f).unwrap_or_else(|| panic!("missing in {evs:#?}"));
    let suspend = pos(&|e| matches!(e, Event::Ddi(Ddi::SuspendContext(_))));
    let timeout = pos(&|e| matches!(e, Event::TdrTimeout { queue, .. } if *queue == qh));
    let reset = pos(&|e| matches!(e, Event::Ddi(Ddi::ResetEngine(_))));
    let destroy = pos(&|e| matches!(e, Event::Ddi(Ddi::DestroyHwQueue(h)) if *h == qh));
    assert!(suspend < timeout && timeout < reset && reset < destroy, "{evs:#?}");
    assert!(sys.now().since(t0) >= TdrConfig::default().delay, "the teardown waited out TdrDelay");
    let mut cb = CommandBuffer::new();
    cb.write_u32(n.buf.va(), 5);
    let v = nq.submit(&cb).unwrap();
    nq.wait(v, T).unwrap();
    assert_eq!(n.buf.read_u32(0).unwrap(), 5);
}

/// A one-slot compute engine preempting at `level`, with `tdr`, whose only queue is blocked in
/// a `WAIT` on its client's buffer word 0 (then writes 1 to word 1): the system, the client,
/// the queue and the progress value of that command buffer.
fn blocked_in_a_wait(level: ComputeGranularity, tdr: TdrConfig) -> (System, common::Client, Queue, u64) {
    let mut cfg = slow(level, tdr);
    cfg.gpu.hw_slots = 1;
    let sys = common::sim_with(cfg);
    let w = common::client(&sys);
    let mut wq = w.user_queue();
    let mut cb = CommandBuffer::new();
    cb.wait(w.buf.va(), 1).write_u32(w.buf.va() + 4, 1);
    let wv = wq.submit(&cb).unwrap();
    (sys, w, wq, wv)
}

/// Issue 11's bad inputs: a `WAIT` that never passes costs its own queue and nothing else.
/// Where a wait is preemptible it is not a hang: its queue gives the only slot to a neighbour at
/// once (not at the end of a quantum), answers the hang timer's check and is never reset. Under
/// `None` it cannot be preempted: the check goes unanswered, the queue alone is reset (Hung,
/// reported, guilty), and the neighbour then runs. (The hang timeout is shorter than
/// `TdrDelay` here, so the hang timer asks before the engine watchdog would: the watchdog's
/// own test is the next one.)
#[test]
fn a_wait_that_never_passes_costs_only_its_own_queue() {
    for level in [ComputeGranularity::Shader, ComputeGranularity::None] {
        let hang = Duration::from_millis(50);
        let tdr = TdrConfig { delay: Duration::from_millis(100), hang_compute: Some(hang), ..TdrConfig::default() };
        let (sys, w, wq, wv) = blocked_in_a_wait(level, tdr);
        sys.settle();
        let n = common::client(&sys);
        let mut nq = n.user_queue();
        let mut cb = CommandBuffer::new();
        cb.write_u32(n.buf.va(), 7);
        let t0 = sys.now();
        let nv = nq.submit(&cb).unwrap();
        nq.wait(nv, Some(Duration::from_secs(5))).unwrap();
        let waited = sys.now().since(t0);
        sys.run_for(Duration::from_secs(1));
        let evs = common::events(&sys);
        let reset = evs.iter().any(|e| matches!(e, Event::Ddi(Ddi::ResetQueue(h)) if *h == wq.handle()));
        let st = wq.status().unwrap();
        if level == ComputeGranularity::None {
            assert!(waited >= tdr.delay, "{level}: behind the blocked queue until its reset, {waited:?}");
            assert!(reset, "{level}");
            assert_eq!(st.state, QueueState::Hung);
            assert!(st.guilty && st.flags == abi::port::QUEUE_STATUS_HUNG);
            assert!(matches!(st.fault.unwrap().kind, FaultKind::PreemptTimeout { .. }));
        } else {
            assert!(waited < GpuConfig::default().gang_quantum, "{level}: served at once, after {waited:?}");
            assert!(!reset, "{level}: a preemptible WAIT is not a hang");
            assert_ne!(st.state, QueueState::Hung);
            assert!(evs.iter().any(|e| matches!(e, Event::Preempted { queue, .. } if *queue == wq.handle())));
            // Released, it finishes.
            w.buf.write(0, &1u32.to_le_bytes()).unwrap();
            wq.wait(wv, T).unwrap();
            assert_eq!(w.buf.read_u32(4).unwrap(), 1);
        }
        assert_eq!(n.buf.read_u32(0).unwrap(), 7);
        assert_ne!(nq.status().unwrap().state, QueueState::Hung, "{level}: the neighbour pays nothing");
    }
}

/// The engine watchdog (spec 000: the OS monitors whether an engine makes progress at the TDR
/// cadence), with the hang timer off: a queue blocked in a `WAIT` its engine cannot preempt
/// (`None`) holds the only slot while a neighbour waits for it. Without the watchdog nothing
/// would ever ask it to leave (the firmware's quantum cannot stop it, and no request is in
/// flight), and the neighbour would wait for good. With it, the first look after a `TdrDelay`
/// without progress finds the engine stalled and asks the slot holder to preempt; the request
/// goes unanswered, so TDR resets the engine: the blocked queue alone is hung and guilty, the
/// neighbour runs and pays nothing.
#[test]
fn a_slot_held_in_a_wait_that_cannot_be_preempted_is_taken_back_by_the_engine_watchdog() {
    let tdr = TdrConfig { delay: Duration::from_millis(100), hang_compute: None, ..TdrConfig::default() };
    let (sys, _w, wq, _) = blocked_in_a_wait(ComputeGranularity::None, tdr);
    sys.settle();
    let n = common::client(&sys);
    let mut nq = n.user_queue();
    let before = common::events(&sys).len();
    let mut cb = CommandBuffer::new();
    cb.write_u32(n.buf.va(), 7);
    let t0 = sys.now();
    let nv = nq.submit(&cb).unwrap();
    nq.wait(nv, Some(Duration::from_secs(5))).expect("the neighbour runs once the watchdog took the slot back");
    let waited = sys.now().since(t0);
    // A look records the engine's progress, the next finds it unmoved, and the request it
    // sends goes unanswered for a TdrDelay: between one and three delays in all.
    assert!(waited >= tdr.delay && waited <= tdr.delay * 3 + Duration::from_millis(50), "{waited:?}");
    let evs = common::events_from(&sys, before);
    let pos = |f: &dyn Fn(&Event) -> bool| evs.iter().position(f).unwrap_or_else(|| panic!("missing in {evs:#?}"));
    let stalled = pos(&|e| matches!(e, Event::EngineStalled { holders: 1, waiting: 1, .. }));
    let timeout = pos(&|e| matches!(e, Event::TdrTimeout { queue, .. } if *queue == wq.handle()));
    let reset = pos(&|e| matches!(e, Event::Ddi(Ddi::ResetEngine(_))));
    assert!(stalled < timeout && timeout < reset, "{evs:#?}");
    assert!(!evs.iter().any(|e| matches!(e, Event::Ddi(Ddi::ResetQueue(_)))), "the hang timer is off");
    let st = wq.status().unwrap();
    assert_eq!(st.state, QueueState::Hung);
    assert!(
        st.guilty && matches!(st.fault.as_ref().map(|f| &f.kind), Some(FaultKind::PreemptTimeout { .. })),
        "{st:?}"
    );
    assert_eq!(n.buf.read_u32(0).unwrap(), 7);
    let st = nq.status().unwrap();
    assert!(st.state != QueueState::Hung && !st.guilty, "the neighbour pays nothing: {st:?}");
}

/// The engine watchdog asks only a queue that keeps another from running: alone on its engine,
/// a queue blocked in a `WAIT` it cannot leave (`None`, the hang timer off) for ten `TdrDelay`s
/// is never asked to preempt, never reset, and finishes once its fence passes.
#[test]
fn the_engine_watchdog_leaves_a_stalled_engine_alone_when_nobody_waits_for_its_slot() {
    let tdr = TdrConfig { delay: Duration::from_millis(100), hang_compute: None, ..TdrConfig::default() };
    let (sys, w, wq, wv) = blocked_in_a_wait(ComputeGranularity::None, tdr);
    sys.run_for(tdr.delay * 10);
    let evs = common::events(&sys);
    assert!(
        !evs.iter()
            .any(|e| matches!(e, Event::EngineStalled { .. } | Event::TdrTimeout { .. } | Event::Preempted { .. })),
        "{evs:#?}"
    );
    w.buf.write(0, &1u32.to_le_bytes()).unwrap();
    wq.wait(wv, T).unwrap();
    assert_eq!(w.buf.read_u32(4).unwrap(), 1);
    assert_ne!(wq.status().unwrap().state, QueueState::Hung);
}

/// Issue 11's bad inputs: an endless chain of indirect buffers — an indirect buffer that calls
/// itself — costs its own queue only. The firmware refuses an indirect buffer inside another
/// (no chain is longer than one), so the queue hangs at once and is reported; a neighbour on the
/// same engine keeps bit-exact results; the reset queue's handle is refused (its submissions
/// with `QueueLost`, then, destroyed, with `BadHandle`); the client recreates it and it works.
#[test]
fn an_endless_chain_of_indirect_buffers_costs_only_its_own_queue() {
    let sys = common::sim();
    let r = Rounds::start(&sys);
    let c = common::client(&sys);
    let mut q = c.user_queue();
    let ib = c.device.allocate(4096).unwrap();
    let mut chain = CommandBuffer::new();
    chain.write_u32(c.buf.va(), 1).indirect(ib.va(), 0);
    let dwords = chain.len() as u32;
    chain.clear();
    chain.write_u32(c.buf.va(), 1).indirect(ib.va(), dwords);
    let bytes: Vec<u8> = chain.words().iter().flat_map(|w| w.to_le_bytes()).collect();
    ib.write(0, &bytes).unwrap();
    let mut cb = CommandBuffer::new();
    cb.indirect(ib.va(), dwords).write_u32(c.buf.va() + 4, 2);
    let v = q.submit(&cb).unwrap();
    let e = q.wait(v, T).unwrap_err();
    assert!(matches!(e, UmdError::QueueLost { .. }), "{e:?}");
    let st = q.status().unwrap();
    assert_eq!(st.state, QueueState::Hung);
    assert!(st.guilty);
    assert!(matches!(st.fault.unwrap().kind, FaultKind::BadIndirect { .. }));
    assert_eq!((c.buf.read_u32(0).unwrap(), c.buf.read_u32(4).unwrap()), (1, 0), "one link ran, then the fault");
    // The neighbour: bit-exact.
    r.q.wait(r.v, T).unwrap();
    assert_eq!(r.results(), vec![expected(ITERS); THREADS]);
    assert_eq!(r.flags(), (1, 2));
    // The reset queue's handle is refused; a recreated queue works.
    let mut again = CommandBuffer::new();
    again.write_u32(c.buf.va() + 8, 3);
    assert!(matches!(q.submit(&again), Err(UmdError::QueueLost { .. })));
    let old = q.handle();
    drop(q);
    assert!(matches!(c.port.query_queue(old).unwrap_err(), abi::port::KernelError::BadHandle { .. }));
    let mut q2 = c.user_queue();
    let v = q2.submit(&again).unwrap();
    q2.wait(v, T).unwrap();
    assert_eq!(c.buf.read_u32(8).unwrap(), 3);
}

/// Without per-engine reset (`TdrConfig::engine_reset` off), a timed-out request resets the
/// adapter directly (`DxgkDdiResetFromTimeout`, then `DxgkDdiRestartFromTimeout`): no engine
/// reset is tried, and every device is lost.
#[test]
fn without_engine_reset_a_timeout_resets_the_adapter() {
    let tdr = TdrConfig { engine_reset: false, hang_compute: None, ..TdrConfig::default() };
    let sys = common::sim_with(slow(ComputeGranularity::Dispatch, tdr));
    let n = common::client(&sys);
    let nq = n.user_queue();
    let (c, q, _spin) = hog(&sys);
    sys.run_for(Duration::from_millis(20));
    let before = common::events(&sys).len();
    sys.preempt_queue(c.port.process(), q.handle()).unwrap();
    sys.run_for(Duration::from_millis(2100));
    let evs = common::events_from(&sys, before);
    let pos = |f: &dyn Fn(&Event) -> bool| evs.iter().position(f).unwrap_or_else(|| panic!("missing in {evs:#?}"));
    let timeout = pos(&|e| matches!(e, Event::TdrTimeout { queue, .. } if *queue == q.handle()));
    let adapter = pos(&|e| matches!(e, Event::Ddi(Ddi::ResetFromTimeout)));
    let restart = pos(&|e| matches!(e, Event::Ddi(Ddi::RestartFromTimeout)));
    let lost = pos(&|e| matches!(e, Event::DeviceLost { device } if *device == n.device.handle()));
    let recovered = pos(&|e| matches!(e, Event::Recovered { engine: None, count: 1 }));
    assert!(timeout < adapter && adapter < restart && restart < lost && lost < recovered, "{evs:#?}");
    assert!(!evs.iter().any(|e| matches!(e, Event::Ddi(Ddi::ResetEngine(_)))), "no engine reset tried");
    for queue in [&q, &nq] {
        assert_eq!(queue.doorbell_status().unwrap(), DoorbellStatus::DisconnectedAbort);
        assert_eq!(queue.status().unwrap().state, QueueState::Hung);
    }
}

/// The deterministic driver steps its engines between the clients' actions, each step in one
/// piece. A ring still cuts into a turn in progress, as on the live driver: the driver tells
/// the device when control returns to a client (`System::run_for`'s target; the simulator's
/// next event, `System::set_step_horizon`), and while a ring could cut in (an idle queue of
/// a higher priority than a busy holder watches its doorbell) the engine's turn ends at its
/// first check past that point. Here a low-priority queue runs a long SYNTHETIC kernel in
/// 10 ms turns; a high-priority queue's TIMESTAMP submitted 2.5 ms in starts within a
/// microsecond (before: when the 10 ms turn ended). A queue of the holder's own priority
/// could not cut in, and waits for the turn's end as before.
#[test]
fn on_the_deterministic_driver_a_ring_cuts_into_a_turn_in_progress() {
    for priority in [abi::Priority::High, abi::Priority::Low] {
        let sys = common::sim_with(slow(
            ComputeGranularity::Shader,
            TdrConfig { hang_compute: None, ..TdrConfig::default() },
        ));
        let turn = Duration::from_millis(10); // `slow`'s turn
        let lo = common::client(&sys);
        let mut lq = lo
            .ctx
            .create_queue(umd::QueueOptions { priority: abi::Priority::Low, ..umd::QueueOptions::user_mode() })
            .unwrap();
        let h = common::client(&sys);
        let mut hq = h.ctx.create_queue(umd::QueueOptions { priority, ..umd::QueueOptions::user_mode() }).unwrap();
        let mut cb = CommandBuffer::new();
        cb.synthetic(1_000_000_000);
        lq.submit(&cb).unwrap();
        sys.run_for(Duration::from_micros(2500));
        let t0 = sys.now().as_nanos();
        let mut cb = CommandBuffer::new();
        cb.timestamp(h.buf.va());
        let v = hq.submit(&cb).unwrap();
        hq.wait(v, T).unwrap();
        let waited = h.buf.read_u64(0).unwrap() - t0;
        if priority == abi::Priority::High {
            assert!(waited <= 1_000, "{priority:?}: started {waited} ns after its ring");
        } else {
            assert!(waited >= (turn - Duration::from_micros(2500)).as_nanos() as u64, "{priority:?}: {waited} ns");
        }
    }
}
