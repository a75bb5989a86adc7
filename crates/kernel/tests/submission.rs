//! The user-mode submission loop, the doorbell status transitions and the engine F1/F0
//! sequences, on the deterministic driver.
//!
//! Spec 000 orders a submission: (1) take N+1, the command buffer ends with a progress fence
//! N+1; (2) write the last-queued value; (3) make the command buffer visible (packets, then
//! wptr); (4) ring the doorbell; (5) read the status and act on it. The [`common::TapPort`]
//! wraps the process's real kernel port and snapshots the queue's shared memory at the instant
//! of each `connect_doorbell` and `notify_work_submission` call, so the tests can see which
//! steps had happened by then. The status transitions and the F-state sequences are asserted
//! on the kernel's trace.

mod common;

use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use abi::packet::progress_fence_words;
use abi::port::{KernelError, KernelPort};
use abi::queue::FaultKind;
use abi::{DoorbellStatus, EngineId, EngineKind, QueueState};
use gpu::{EngineState, PowerState};
use kernel::SystemConfig;
use kernel::trace::{Ddi, Event, PageTarget};
use umd::{CommandBuffer, QueueOptions, UmdError};

use common::{Call, T, TapPort, events, find_run, idle_config};

const IDLE: Duration = Duration::from_millis(1);
/// Past one idle period, short of two: the clock runs events in order, so a second idle
/// period after work found at the first would end in F1.
const PAST_IDLE: Duration = Duration::from_micros(1500);

/// Every word of the doorbell BAR.
fn bar_words(sys: &kernel::System) -> Vec<u64> {
    sys.with_gpu(|g| (0..g.doorbell_count() as u64).map(|i| g.bar().load_u64(i * 8, SeqCst).unwrap()).collect())
}

fn connects(calls: &[Call]) -> Vec<common::Snapshot> {
    calls
        .iter()
        .filter_map(|c| match c {
            Call::Connect(_, s) => Some(s.expect("connect after the doorbell exists")),
            _ => None,
        })
        .collect()
}

/// (a) After the engine went to F1 the doorbell is `DisconnectedRetry`; the next submission
/// publishes its work first and reconnects only after ringing.
#[test]
fn disconnected_retry_reconnects_after_the_work_is_published() {
    let sys = common::sim_with(idle_config(IDLE));
    let tap = TapPort::open(&sys);
    let c = common::client_on(tap.clone());
    let mut q = c.user_queue();
    let t = tap.queue(q.handle());
    let engine = q.engine();

    // Creation connected once, with nothing queued.
    let first = connects(&tap.calls());
    assert_eq!(first.len(), 1);
    assert_eq!((first[0].last_queued, first[0].wptr), (0, 0));
    assert_eq!(q.doorbell_status().unwrap(), DoorbellStatus::Connected);

    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va(), 1);
    let n = q.submit(&cb).unwrap();
    q.wait(n, T).unwrap();
    assert_eq!(n, 1);

    sys.advance(PAST_IDLE);
    assert_eq!(sys.power(engine), PowerState::F1);
    assert_eq!(q.doorbell_status().unwrap(), DoorbellStatus::DisconnectedRetry);
    let w_before = t.wptr();
    let reconnects = q.reconnects();
    tap.clear_calls();

    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va() + 4, 2).write_u64(c.buf.va() + 8, 0x0102_0304_0506_0708);
    let v = q.submit(&cb).unwrap();
    assert_eq!(v, n + 1);

    let calls = tap.calls();
    assert!(
        matches!(calls.first(), Some(Call::Connect(h, _)) if *h == q.handle()),
        "first call is the connect: {calls:?}"
    );
    let at = connects(&calls);
    assert_eq!(at.len(), 1, "one reconnect: {calls:?}");
    let s = at[0];
    // Steps 1-3 happened before step 5's reconnect: last-queued is N+1 and wptr covers the
    // new packets and their progress fence.
    assert_eq!(s.last_queued, n + 1, "last-queued was written before the reconnect");
    assert_eq!(s.wptr, t.wptr(), "wptr was published before the reconnect");
    let mut want = cb.words().to_vec();
    want.extend_from_slice(&progress_fence_words(v));
    assert_eq!(s.wptr - w_before, want.len() as u64 * 4);
    assert_eq!(t.read_ring(w_before, want.len()), want, "the ring held the command buffer and its fence");
    // Step 4 happened too, on the dummy page; the engine saw nothing yet.
    assert_eq!(s.doorbell, s.wptr, "the doorbell was rung (on the dummy page) before the reconnect");
    assert_eq!(s.status, DoorbellStatus::DisconnectedRetry as u64);
    assert_eq!(s.rptr, w_before, "the engine had not fetched the new work");

    assert_eq!(q.reconnects(), reconnects + 1);
    assert_eq!(q.doorbell_status().unwrap(), DoorbellStatus::Connected);
    assert_eq!(sys.power(engine), PowerState::F0);
    assert_eq!(t.doorbell_word(), t.wptr(), "after reconnecting, the UMD rang the real doorbell");
    q.wait(v, T).unwrap();
    assert_eq!(c.buf.read_u32(4).unwrap(), 2);
    assert_eq!(c.buf.read_u64(8).unwrap(), 0x0102_0304_0506_0708);
    assert_eq!(t.rptr(), t.wptr());
}

/// While connected, a submission is memory writes only: no kernel call at all.
#[test]
fn connected_submission_makes_no_kernel_call() {
    let sys = common::sim();
    let tap = TapPort::open(&sys);
    let c = common::client_on(tap.clone());
    let mut q = c.user_queue();
    tap.clear_calls();
    let mut last = 0;
    for i in 0..10u32 {
        let mut cb = CommandBuffer::new();
        cb.write_u32(c.buf.va() + 4 * i as u64, i + 100);
        last = q.submit(&cb).unwrap();
    }
    assert_eq!(tap.calls(), [], "the data path entered the kernel");
    sys.settle();
    assert_eq!(q.completed(), last);
    for i in 0..10u32 {
        assert_eq!(c.buf.read_u32(4 * i as u64).unwrap(), i + 100);
    }
}

/// (b) `ConnectedNotify`: the UMD calls `NotifyWorkSubmission` after each ring, and at that
/// instant the doorbell word already holds the new wptr.
#[test]
fn connected_notify_calls_notify_after_each_ring() {
    let sys = common::sim_with(SystemConfig { notify_on_submit: true, ..SystemConfig::default() });
    let tap = TapPort::open(&sys);
    let c = common::client_on(tap.clone());
    let mut q = c.user_queue();
    let t = tap.queue(q.handle());
    assert_eq!(q.doorbell_status().unwrap(), DoorbellStatus::ConnectedNotify);
    for i in 1..=3u64 {
        tap.clear_calls();
        let mut cb = CommandBuffer::new();
        cb.write_u64(c.buf.va() + 8 * i, i * 11);
        let v = q.submit(&cb).unwrap();
        assert_eq!(v, i);
        let calls = tap.calls();
        let [Call::Notify(h, s)] = calls.as_slice() else { panic!("exactly one notify per submission: {calls:?}") };
        assert_eq!(*h, q.handle());
        assert_eq!(s.doorbell, s.wptr, "the doorbell was rung with wptr before the notify");
        assert_eq!(s.wptr, t.wptr());
        assert_eq!(s.last_queued, i);
        assert_eq!(s.status, DoorbellStatus::ConnectedNotify as u64);
    }
    let notifies = events(&sys).iter().filter(|e| **e == Event::Ddi(Ddi::NotifyWorkSubmission(q.handle()))).count();
    assert_eq!(notifies, 3);
    q.finish(T).unwrap();
    for i in 1..=3u64 {
        assert_eq!(c.buf.read_u64(8 * i).unwrap(), i * 11);
    }
}

/// (c) `DisconnectedAbort`: after a fault, a submission returns `QueueLost` naming the fault;
/// the trace shows the abort sequence.
#[test]
fn disconnected_abort_returns_queue_lost_naming_the_fault() {
    let sys = common::sim();
    let c = common::client(&sys);
    let mut q = c.user_queue();
    let h = q.handle();
    let mut cb = CommandBuffer::new();
    cb.raw(&[1 | (0x7f << 16) | (1 << 24)]); // unknown opcode 0x7f
    let v = q.submit(&cb).unwrap();
    let err = q.wait(v, T).unwrap_err();
    assert!(matches!(&err, UmdError::QueueLost { reason, .. } if unknown_opcode_127(reason)), "{err}");
    assert_eq!(q.doorbell_status().unwrap(), DoorbellStatus::DisconnectedAbort);

    let ev = events(&sys);
    let fault = ev
        .iter()
        .find_map(|e| match e {
            Event::QueueFault { queue, fault } if *queue == h => Some(fault.clone()),
            _ => None,
        })
        .expect("fault in the trace");
    find_run(
        &ev,
        &[
            Event::QueueFault { queue: h, fault },
            Event::Rotate { queue: h, to: PageTarget::Dummy },
            Event::Status { queue: h, status: DoorbellStatus::DisconnectedAbort },
            Event::Ddi(Ddi::DisconnectDoorbell(h)),
        ],
    );

    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va(), 1);
    match q.submit(&cb) {
        Err(UmdError::QueueLost { queue, reason }) => {
            assert_eq!(queue, h);
            assert!(unknown_opcode_127(&reason), "{reason}");
        }
        other => panic!("expected QueueLost, got {other:?}"),
    }
    let e = c.port.connect_doorbell(h).unwrap_err();
    assert!(matches!(&e, KernelError::QueueLost { queue, .. } if *queue == h), "{e}");
    sys.settle();
    assert_eq!(c.buf.read_u32(0).unwrap(), 0, "nothing runs on an aborted queue");
}

/// A new queue's doorbell is `DisconnectedRetry` on the dummy page; connect is
/// `DxgkDdiConnectDoorbell`, the rotation to the BAR, then the status `Connected`.
#[test]
fn creation_leaves_retry_and_connect_is_ddi_rotate_status() {
    let sys = common::sim();
    let p = common::RawProc::open(&sys);
    let info = p.create(p.desc(0)).unwrap();
    let q = info.handle;
    let db = p.doorbell(q).unwrap();
    let status = |m: &shm::Mapping| m.load_u64(abi::queue::DOORBELL_STATUS_OFFSET, SeqCst).unwrap();
    assert_eq!(status(&info.kernel_page), DoorbellStatus::DisconnectedRetry as u64);
    let bar = sys.with_gpu(|g| g.bar().id());
    assert_ne!(db.cpu_page.current().0, bar, "a new doorbell shows the dummy page");
    let ev = events(&sys);
    find_run(
        &ev,
        &[
            Event::Ddi(Ddi::CreateHwQueue(p.ctx)),
            Event::QueueCreated { queue: q, engine: EngineId(0), user_mode: true },
        ],
    );
    assert!(ev.contains(&Event::Ddi(Ddi::CreateDoorbell(q))));
    assert!(!ev.iter().any(|e| matches!(e, Event::Status { .. } | Event::Rotate { .. })));
    // A ring before connecting lands on the dummy page: the BAR does not change.
    let bar_before = bar_words(&sys);
    db.cpu_page.atomic_u64(db.offset).unwrap().store(0x40, SeqCst);
    assert!(bar_words(&sys) == bar_before, "a disconnected doorbell's write has no effect");

    let mark = ev.len();
    p.port.connect_doorbell(q).unwrap();
    let ev = events(&sys);
    assert_eq!(
        &ev[mark..],
        [
            Event::Ddi(Ddi::ConnectDoorbell(q)),
            Event::Rotate { queue: q, to: PageTarget::Bar },
            Event::Status { queue: q, status: DoorbellStatus::Connected },
        ]
    );
    assert_eq!(status(&info.kernel_page), DoorbellStatus::Connected as u64);
    assert_eq!(db.cpu_page.current().0, bar, "a connected doorbell shows the BAR page");
    // Now a ring lands in exactly one BAR word.
    let before = bar_words(&sys);
    db.cpu_page.atomic_u64(db.offset).unwrap().store(0x80, SeqCst);
    let after = bar_words(&sys);
    let changed: Vec<_> = (0..after.len()).filter(|&i| after[i] != before[i]).collect();
    assert_eq!(changed.len(), 1, "{changed:?}");
    assert_eq!(after[changed[0]], 0x80);
    assert_eq!(changed[0] % 512, 0, "doorbell index 0 of the process's page");
    // Connecting a connected doorbell changes nothing.
    p.port.connect_doorbell(q).unwrap();
    assert_eq!(events(&sys).len(), ev.len());
}

/// Idle → TransitionToF1 → each doorbell of that engine disconnected (rotate, status, DDI) →
/// F1; the next submission → F0 → connect → work completes.
#[test]
fn idle_f1_then_submit_f0_in_the_spec_order() {
    let sys = common::sim_with(idle_config(IDLE));
    let c = common::client(&sys);
    let copy_ctx = c.context(EngineKind::Copy);
    let mut q1 = c.user_queue();
    let q2 = c.user_queue();
    let q3 = copy_ctx.create_queue(QueueOptions::user_mode()).unwrap();
    let (e0, e1) = (q1.engine(), q3.engine());
    let (h1, h2, h3) = (q1.handle(), q2.handle(), q3.handle());
    let mark = events(&sys).len();

    sys.advance(PAST_IDLE);
    let ev = events(&sys)[mark..].to_vec();
    let retry = DoorbellStatus::DisconnectedRetry;
    let off = |h| {
        [
            Event::Rotate { queue: h, to: PageTarget::Dummy },
            Event::Status { queue: h, status: retry },
            Event::Ddi(Ddi::DisconnectDoorbell(h)),
        ]
    };
    let mut want0 = vec![Event::EngineRequest { engine: e0, state: EngineState::TransitionToF1 }];
    want0.extend(off(h1));
    want0.extend(off(h2));
    want0.extend([
        Event::Ddi(Ddi::SetPowerState(e0, PowerState::F1)),
        Event::Power { engine: e0, state: PowerState::F1 },
    ]);
    find_run(&ev, &want0);
    let mut want1 = vec![Event::EngineRequest { engine: e1, state: EngineState::TransitionToF1 }];
    want1.extend(off(h3));
    want1.extend([
        Event::Ddi(Ddi::SetPowerState(e1, PowerState::F1)),
        Event::Power { engine: e1, state: PowerState::F1 },
    ]);
    find_run(&ev, &want1);
    assert_eq!(ev.len(), want0.len() + want1.len(), "nothing else happened: {ev:#?}");
    assert_eq!((sys.power(e0), sys.power(e1)), (PowerState::F1, PowerState::F1));
    assert_eq!(sys.stats().f1_entries, 2);
    for q in [&q1, &q2, &q3] {
        assert_eq!(q.doorbell_status().unwrap(), retry);
    }

    let mark = events(&sys).len();
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va(), 0xf0);
    let v = q1.submit(&cb).unwrap();
    let ev = events(&sys)[mark..].to_vec();
    assert_eq!(
        ev,
        [
            Event::Ddi(Ddi::SetPowerState(e0, PowerState::F0)),
            Event::Power { engine: e0, state: PowerState::F0 },
            Event::Ddi(Ddi::ConnectDoorbell(h1)),
            Event::Rotate { queue: h1, to: PageTarget::Bar },
            Event::Status { queue: h1, status: DoorbellStatus::Connected },
        ]
    );
    assert_eq!(q1.reconnects(), 1);
    q1.wait(v, T).unwrap();
    assert_eq!(c.buf.read_u32(0).unwrap(), 0xf0);
    // Only what was asked for woke up.
    assert_eq!(q2.doorbell_status().unwrap(), retry);
    assert_eq!(q3.doorbell_status().unwrap(), retry);
    assert_eq!(sys.power(e1), PowerState::F1);
    assert_eq!(sys.stats().connects, 3 + 1);
}

/// Work published (packets + wptr + a ring on the dummy page) while the doorbell is
/// disconnected is found by the next connect, which re-reads wptr: it is not lost.
#[test]
fn work_published_while_disconnected_is_not_lost() {
    let sys = common::sim_with(idle_config(IDLE));
    let tap = TapPort::open(&sys);
    let c = common::client_on(tap.clone());
    let q = c.user_queue();
    let t = tap.queue(q.handle());
    sys.advance(PAST_IDLE);
    assert_eq!(t.status(), DoorbellStatus::DisconnectedRetry);

    // A client publishes work by hand, and rings: the ring lands on the dummy page.
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va(), 0x1057).packet(abi::Packet::ProgressFence { value: 1 });
    let w = t.wptr();
    t.write_ring(w, cb.words());
    t.set_last_queued(1);
    t.set_wptr(w + cb.len() as u64 * 4);
    t.ring_doorbell(t.wptr());
    sys.settle();
    sys.advance(Duration::from_millis(50));
    assert_eq!(c.buf.read_u32(0).unwrap(), 0, "a disconnected doorbell's ring reaches nobody");
    assert_eq!(t.rptr(), w);

    // The connect (which the UMD's retry loop makes) re-reads wptr and finds it.
    c.port.connect_doorbell(q.handle()).unwrap();
    sys.settle();
    assert_eq!(c.buf.read_u32(0).unwrap(), 0x1057);
    assert_eq!(t.completed(), 1);
    assert_eq!(t.rptr(), t.wptr());
}

/// The firmware refuses F1 while a queue has work that its doorbell never announced (a ring
/// racing the idle timer): the kernel's disconnect re-reads wptr, the F1 request fails, and
/// the work runs.
#[test]
fn firmware_refuses_f1_while_a_queue_has_work() {
    let sys = common::sim_with(idle_config(IDLE));
    let tap = TapPort::open(&sys);
    let c = common::client_on(tap.clone());
    let q = c.user_queue();
    let (h, e) = (q.handle(), q.engine());
    let t = tap.queue(h);

    // Published, not yet rung.
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va(), 0xf1).packet(abi::Packet::ProgressFence { value: 1 });
    t.write_ring(0, cb.words());
    t.set_last_queued(1);
    t.set_wptr(cb.len() as u64 * 4);
    let mark = events(&sys).len();
    sys.advance(PAST_IDLE);
    let ev = events(&sys)[mark..].to_vec();
    find_run(
        &ev,
        &[
            Event::EngineRequest { engine: e, state: EngineState::TransitionToF1 },
            Event::Rotate { queue: h, to: PageTarget::Dummy },
            Event::Status { queue: h, status: DoorbellStatus::DisconnectedRetry },
            Event::Ddi(Ddi::DisconnectDoorbell(h)),
            Event::Ddi(Ddi::SetPowerState(e, PowerState::F1)),
            Event::F1Refused { engine: e },
        ],
    );
    assert!(!ev.contains(&Event::Power { engine: e, state: PowerState::F1 }));
    assert_eq!(sys.power(e), PowerState::F0);
    let copy = c.device.engine(EngineKind::Copy).unwrap();
    assert_eq!((sys.power(copy), sys.stats().f1_entries), (PowerState::F1, 1), "only the idle copy engine is in F1");
    assert_eq!(c.buf.read_u32(0).unwrap(), 0xf1, "the work ran");
    assert_eq!(t.completed(), 1);

    // The same rule, asked of the device directly.
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va() + 4, 0xf2).packet(abi::Packet::ProgressFence { value: 2 });
    let w = t.wptr();
    t.write_ring(w, cb.words());
    t.set_last_queued(2);
    t.set_wptr(w + cb.len() as u64 * 4);
    let now = sys.now();
    assert!(!sys.with_gpu(|g| g.command(gpu::cmd::EnterF1 { engine: e, now })).unwrap(), "F1 with work pending");
    assert_eq!(sys.with_gpu(|g| g.power(e)).unwrap(), PowerState::F0);
    sys.settle();
    assert_eq!(c.buf.read_u32(4).unwrap(), 0xf2);
    assert!(sys.with_gpu(|g| g.command(gpu::cmd::EnterF1 { engine: e, now })).unwrap(), "F1 once idle");
    sys.with_gpu(|g| g.command(gpu::cmd::RequestF0 { engine: e, now })).unwrap();
}

/// A 4 KiB ring and far more work than fits: the UMD waits for rptr and never overwrites
/// packets the engine has not read.
#[test]
fn ring_full_back_pressure_user_mode() {
    let sys = common::sim();
    let tap = TapPort::open(&sys);
    let c = common::client_on(tap.clone());
    let mut q = c.ctx.create_queue(QueueOptions { ring_bytes: 4096, ..QueueOptions::user_mode() }).unwrap();
    let t = tap.queue(q.handle());
    tap.clear_calls();
    let n = 400u32;
    let mut last = 0;
    for i in 0..n {
        let mut cb = CommandBuffer::new();
        // Varying lengths, so the ring end is padded at varying offsets.
        cb.write_u32(c.buf.va() + 4 * i as u64, i ^ 0x5a5a_0000).nop((i % 29) as u16 + 1);
        last = q.submit(&cb).unwrap();
        let (r, w) = (t.rptr(), t.wptr());
        assert!(w - r <= 4096, "submission {i}: {} bytes in flight in a 4096-byte ring", w - r);
        assert!(t.last_queued() == last);
    }
    assert!(t.wptr() > 6 * 4096, "the ring wrapped many times");
    assert!(tap.calls().iter().any(|c| matches!(c, Call::Wait(..))), "the UMD had to wait for ring space");
    q.finish(T).unwrap();
    assert_eq!(q.completed(), last);
    assert_eq!(q.status().unwrap().state, QueueState::Mapped);
    for i in 0..n {
        assert_eq!(c.buf.read_u32(4 * i as u64).unwrap(), i ^ 0x5a5a_0000, "result {i}");
    }
}

/// The kernel-mode path: far more than its 64 KiB ring in software-queue submissions.
#[test]
fn ring_full_back_pressure_kernel_mode() {
    let sys = common::sim();
    let c = common::client(&sys);
    let mut q = c.kernel_queue();
    let n = 600u32;
    for i in 0..n {
        let mut cb = CommandBuffer::new();
        cb.write_u32(c.buf.va() + 4 * i as u64, !i).nop(100);
        q.submit(&cb).unwrap();
    }
    assert!(n as u64 * 110 * 4 > 2 * kernel::os::KERNEL_RING_BYTES);
    q.finish(T).unwrap();
    assert_eq!(q.completed(), n as u64);
    for i in 0..n {
        assert_eq!(c.buf.read_u32(4 * i as u64).unwrap(), !i, "result {i}");
    }
}

/// Destroying a queue disconnects its doorbell (abort) before destroying it.
#[test]
fn queue_drop_disconnects_then_destroys() {
    let sys = common::sim();
    let c = common::client(&sys);
    let q = c.user_queue();
    let h = q.handle();
    let mark = events(&sys).len();
    drop(q);
    let ev = events(&sys)[mark..].to_vec();
    assert_eq!(
        ev,
        [
            Event::Rotate { queue: h, to: PageTarget::Dummy },
            Event::Status { queue: h, status: DoorbellStatus::DisconnectedAbort },
            Event::Ddi(Ddi::DisconnectDoorbell(h)),
            Event::Ddi(Ddi::DestroyDoorbell(h)),
            Event::Ddi(Ddi::DestroyHwQueue(h)),
        ]
    );
    let e = c.port.query_queue(h).unwrap_err();
    assert!(matches!(e, KernelError::BadHandle { .. }), "{e}");
}

/// A fault's kind reaches the UMD through the status query.
#[test]
fn status_query_reports_state_fault_and_progress() {
    let sys = common::sim();
    let c = common::client(&sys);
    let mut q = c.user_queue();
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va(), 1);
    let v = q.submit(&cb).unwrap();
    q.wait(v, T).unwrap();
    let st = q.status().unwrap();
    assert_eq!((st.state, st.fault.clone(), st.completed, st.last_queued), (QueueState::Mapped, None, 1, 1));
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va() + 2, 1); // misaligned 32-bit store
    let v = q.submit(&cb).unwrap();
    assert!(q.wait(v, T).is_err());
    let st = q.status().unwrap();
    assert_eq!(st.state, QueueState::Hung);
    assert_eq!((st.completed, st.last_queued), (1, 2));
    let f = st.fault.unwrap();
    assert!(matches!(f.kind, FaultKind::Misaligned { align: 4, .. }), "{f}");
}

/// A queue lost to the fault of an unknown opcode 127, as data.
fn unknown_opcode_127(reason: &abi::port::LostReason) -> bool {
    use abi::packet::DecodeError;
    matches!(reason, abi::port::LostReason::Fault(f)
        if f.kind == abi::queue::FaultKind::BadPacket(DecodeError::UnknownOpcode { opcode: 127 }))
}
