//! Spec 000 (user-mode work submission): the sequences whose order the other test files did not
//! yet assert step by step — normal termination's disconnect before its wait, abnormal
//! termination's device error before its suspension, the KMD's own unbind after the
//! disconnect callback in a victimization, suspension step 4 (a suspended queue's doorbell
//! victimized, the UMD reconnecting, the work running after resume), a kernel-mode submission
//! to a suspended context, and device termination. Each test fails if its order breaks.

mod common;

use std::time::Duration;

use abi::DoorbellStatus;
use abi::port::KernelPort;
use kernel::trace::{Callback, Ddi, Event, PageTarget};
use kernel::{SystemConfig, Termination};
use umd::CommandBuffer;

const T: Option<Duration> = Some(Duration::from_millis(50));

/// Where the first event `want` matches sits in `ev`.
#[track_caller]
fn at(ev: &[Event], want: impl Fn(&Event) -> bool, what: &str) -> usize {
    ev.iter().position(want).unwrap_or_else(|| panic!("{what} missing from the trace: {ev:#?}"))
}

#[test]
fn normal_termination_disconnects_then_waits_then_destroys() {
    let sys = common::sim();
    let c = common::client(&sys);
    let pid = c.port.process();
    let mut q = c.user_queue();
    let mut cb = CommandBuffer::new();
    cb.fill(c.buf.va(), 4096, 9);
    let v = q.submit(&cb).unwrap();
    assert!(q.completed() < v, "not run yet: nothing stepped the simulation");
    let mark = sys.trace().0.len();
    sys.terminate(pid, Termination::Normal);
    let ev = common::events_from(&sys, mark);
    let h = q.handle();
    let disconnect = at(&ev, |e| *e == Event::Ddi(Ddi::DisconnectDoorbell(h)), "step 1 (DisconnectDoorbell)");
    let wait = at(&ev, |e| matches!(e, Event::TerminationWait { queue, .. } if *queue == h), "step 2 (the wait)");
    let done = at(&ev, |e| *e == Event::TerminationWaitDone { queue: h, reached: true }, "the satisfied wait");
    let destroy =
        at(&ev, |e| matches!(e, Event::Ddi(Ddi::DestroyDoorbell(x) | Ddi::DestroyHwQueue(x)) if *x == h), "step 3");
    assert!(disconnect < wait && wait < done && done < destroy, "{ev:#?}");
    // The wait really waited: the work was not complete when it started, and it was at its end.
    let Event::TerminationWait { value, completed, .. } = ev[wait] else { unreachable!() };
    assert_eq!(value, v, "it waits for the last-queued value");
    assert!(completed < v, "the work completes after the disconnect, during the wait");
    assert_eq!(q.completed(), v);
    assert_eq!(c.buf.read_u32(0).unwrap(), 9, "the queued work ran during the wait");
}

#[test]
fn abnormal_termination_marks_the_device_in_error_before_suspending() {
    let sys = common::sim();
    let c = common::client(&sys);
    let pid = c.port.process();
    let q = c.user_queue();
    let mark = sys.trace().0.len();
    sys.terminate(pid, Termination::Abnormal);
    let ev = common::events_from(&sys, mark);
    let device = c.device.handle();
    let error = at(&ev, |e| *e == Event::DeviceError { device }, "step 1 (device in error)");
    let suspend = at(&ev, |e| *e == Event::Ddi(Ddi::SuspendContext(c.ctx.handle())), "step 2 (SuspendContext)");
    let disconnect = at(&ev, |e| *e == Event::Ddi(Ddi::DisconnectDoorbell(q.handle())), "step 3a");
    let destroy = at(&ev, |e| *e == Event::Ddi(Ddi::DestroyHwQueue(q.handle())), "step 3b");
    assert!(error < suspend && suspend < disconnect && disconnect < destroy, "{ev:#?}");
    assert!(!ev.iter().any(|e| matches!(e, Event::TerminationWait { .. })), "abnormal termination does not wait");
}

#[test]
fn the_kmd_unbinds_a_victim_only_after_the_disconnect_callback_returns() {
    let sys = common::sim_with(SystemConfig { doorbell_pool: Some(1), ..SystemConfig::default() });
    let c = common::client(&sys);
    let q1 = c.user_queue();
    let mark = sys.trace().0.len();
    let q2 = c.user_queue(); // victimizes q1
    let ev = common::events_from(&sys, mark);
    let want = [
        Event::Ddi(Ddi::ConnectDoorbell(q2.handle())),
        Event::Callback(Callback::DisconnectDoorbell(q1.handle())),
        Event::Rotate { queue: q1.handle(), to: PageTarget::Dummy },
        Event::Status { queue: q1.handle(), status: DoorbellStatus::DisconnectedRetry },
        Event::VictimUnbound { queue: q1.handle() },
        Event::Rotate { queue: q2.handle(), to: PageTarget::Bar },
        Event::Status { queue: q2.handle(), status: DoorbellStatus::Connected },
    ];
    common::find_run(&ev, &want);
}

/// Spec 000 "Suspending a hardware context", step 4: the KMD victimizes the doorbell of a
/// suspended queue; the UMD reconnects (a new doorbell) and goes on submitting; the work runs
/// once the context is resumed.
#[test]
fn a_suspended_queues_doorbell_is_victimized_the_umd_reconnects_and_the_work_runs_after_resume() {
    let sys = common::sim_with(SystemConfig { doorbell_pool: Some(1), ..SystemConfig::default() });
    let c = common::client(&sys);
    let pid = c.port.process();
    let mut q1 = c.user_queue();
    let other = c.context(abi::EngineKind::Compute);
    let mut q2 = other.create_queue(umd::QueueOptions::user_mode()).unwrap(); // takes the doorbell
    assert_eq!(q1.doorbell_status().unwrap(), DoorbellStatus::DisconnectedRetry);
    // Give the doorbell back to q1, then suspend its context.
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va(), 1);
    let v0 = q1.submit(&cb).unwrap();
    q1.wait(v0, T).unwrap();
    let mark = sys.trace().0.len();
    sys.suspend_context(pid, c.ctx.handle()).unwrap();
    // Step 3: still connected, the UMD keeps writing; the GPU does not process it.
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va() + 4, 2);
    let v1 = q1.submit(&cb).unwrap();
    // Step 4: q2's submission victimizes the suspended queue's doorbell.
    let mut cb2 = CommandBuffer::new();
    cb2.write_u32(c.buf.va() + 8, 3);
    let w = q2.submit(&cb2).unwrap();
    q2.wait(w, T).unwrap();
    assert_eq!(q1.doorbell_status().unwrap(), DoorbellStatus::DisconnectedRetry, "victimized while suspended");
    // The UMD is not stalled: it reconnects (taking the doorbell back) and submits more.
    let before = q1.reconnects();
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va() + 12, 4);
    let v2 = q1.submit(&cb).unwrap();
    assert_eq!(q1.reconnects(), before + 1, "the UMD reconnected the suspended queue's doorbell");
    assert_eq!(q1.doorbell_status().unwrap(), DoorbellStatus::Connected);
    sys.settle();
    assert_eq!((c.buf.read_u32(4).unwrap(), c.buf.read_u32(12).unwrap()), (0, 0), "suspended: nothing ran");
    assert!(q1.completed() < v1);
    sys.resume_context(pid, c.ctx.handle()).unwrap();
    q1.wait(v2, T).unwrap();
    assert_eq!((c.buf.read_u32(4).unwrap(), c.buf.read_u32(12).unwrap()), (2, 4), "both ran after resume");
    let ev = common::events_from(&sys, mark);
    let h = q1.handle();
    let suspend = at(&ev, |e| *e == Event::Ddi(Ddi::SuspendContext(c.ctx.handle())), "SuspendContext");
    let victim = at(&ev, |e| *e == Event::Callback(Callback::DisconnectDoorbell(h)), "the victimization");
    let reconnect = ev.iter().rposition(|e| *e == Event::Ddi(Ddi::ConnectDoorbell(h))).expect("reconnect");
    let resume = at(&ev, |e| *e == Event::Ddi(Ddi::ResumeContext(c.ctx.handle())), "ResumeContext");
    assert!(suspend < victim && victim < reconnect && reconnect < resume, "{ev:#?}");
}

/// "UMD can call D3DKMTSubmitCommand with a suspended context. Dxgkrnl enqueues this new
/// command to the HwQueue but it just doesn't get scheduled until a later time."
#[test]
fn a_kernel_mode_submission_to_a_suspended_context_is_queued_and_runs_after_resume() {
    let sys = common::sim();
    let c = common::client(&sys);
    let pid = c.port.process();
    let mut q = c.kernel_queue();
    sys.suspend_context(pid, c.ctx.handle()).unwrap();
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va(), 0x77);
    let v = q.submit(&cb).expect("accepted while suspended");
    sys.settle();
    sys.advance(Duration::from_millis(5));
    sys.settle();
    assert_eq!(c.buf.read_u32(0).unwrap(), 0, "not scheduled while suspended");
    assert!(q.completed() < v);
    sys.resume_context(pid, c.ctx.handle()).unwrap();
    q.wait(v, T).unwrap();
    assert_eq!(c.buf.read_u32(0).unwrap(), 0x77);
}

/// "The only scenario in which Dxgkrnl destroys ring buffer allocations is during device
/// termination. Dxgkrnl destroys all HWQueues, doorbells, and ring buffer allocations
/// associated with the device."
#[test]
fn destroying_a_device_destroys_its_queues_doorbells_and_ring_allocations() {
    let sys = common::sim();
    let base = sys.census();
    let p = common::RawProc::open(&sys);
    let q = p.create(p.desc(0)).unwrap();
    let d = p.doorbell(q.handle).unwrap();
    p.port.connect_doorbell(q.handle).unwrap();
    let k = p.create_kernel().unwrap();
    // While the doorbell lives, its ring allocations cannot be freed by the client.
    assert!(p.port.free(p.ring.handle).is_err() && p.port.free(p.ctl.handle).is_err());
    let during = sys.census();
    assert_eq!((during.queues, during.doorbells), (base.queues + 2, base.doorbells + 1));
    let mark = sys.trace().0.len();
    p.port.destroy_device(p.dev).unwrap();
    let ev = common::events_from(&sys, mark);
    let destroy_db = at(&ev, |e| *e == Event::Ddi(Ddi::DestroyDoorbell(q.handle)), "DestroyDoorbell");
    let destroy_q = at(&ev, |e| *e == Event::Ddi(Ddi::DestroyHwQueue(q.handle)), "DestroyHwQueue");
    at(&ev, |e| *e == Event::Ddi(Ddi::DestroyHwQueue(k.handle)), "the kernel-mode queue's DestroyHwQueue");
    assert!(destroy_db < destroy_q, "{ev:#?}");
    let after = sys.census();
    assert_eq!((after.queues, after.doorbells, after.allocations), (base.queues, base.doorbells, base.allocations));
    // The ring allocations are gone with it: their handles are stale.
    assert!(p.port.map_allocation(p.ring.handle).is_err() && p.port.map_allocation(p.ctl.handle).is_err());
    assert!(p.port.destroy_doorbell(d.handle).is_err());
    // Every mapping of the device is gone; the process keeps its doorbell page's mapping.
    assert_eq!(sys.census().gpu_mappings, base.gpu_mappings + 1, "every mapping of the device is gone");
}

/// Spec 000's pseudocode: on `DisconnectedAbort`, "destroy this HWQueue and re-create using
/// traditional kernel mode submission". With `fallback_to_kernel_mode`, the submission that
/// met the abort runs on a kernel-mode queue of the same context; without it, it fails.
#[test]
fn a_queue_that_falls_back_to_kernel_mode_on_disconnected_abort_runs_the_submission_there() {
    for fallback in [true, false] {
        let sys = common::sim();
        let c = common::client(&sys);
        let opts = umd::QueueOptions { fallback_to_kernel_mode: fallback, ..umd::QueueOptions::user_mode() };
        let mut q = c.ctx.create_queue(opts).unwrap();
        let user = q.handle();
        let mut bad = CommandBuffer::new();
        bad.write_u32(0xdead_0000, 1); // outside every mapping: the queue faults
        let lost = q.submit(&bad).unwrap();
        sys.settle();
        assert_eq!(q.doorbell_status().unwrap(), DoorbellStatus::DisconnectedAbort);
        let mark = sys.trace().0.len();
        let mut cb = CommandBuffer::new();
        cb.write_u32(c.buf.va(), 0x5a);
        let r = q.submit(&cb);
        if !fallback {
            assert!(matches!(r, Err(umd::UmdError::QueueLost { queue, .. }) if queue == user), "{r:?}");
            continue;
        }
        let v = r.expect("fell back");
        assert_eq!(q.kind(), umd::SubmissionKind::KernelMode);
        assert_ne!(q.handle(), user);
        q.wait(v, T).unwrap();
        assert_eq!(c.buf.read_u32(0).unwrap(), 0x5a, "the submission ran on the kernel-mode queue");
        // The user-mode queue was destroyed, then the kernel-mode queue created on the same
        // context, and the work went through the kernel-mode path.
        let ev = common::events_from(&sys, mark);
        let destroyed = at(&ev, |e| *e == Event::Ddi(Ddi::DestroyHwQueue(user)), "the user-mode queue destroyed");
        let created = at(
            &ev,
            |e| matches!(e, Event::QueueCreated { queue, user_mode: false, .. } if *queue == q.handle()),
            "the kernel-mode queue",
        );
        let submitted = at(
            &ev,
            |e| matches!(e, Event::Ddi(Ddi::SubmitCommand { queue, .. }) if *queue == q.handle()),
            "SubmitCommand",
        );
        assert!(destroyed < created && created < submitted, "{ev:#?}");
        assert!(ev.contains(&Event::Ddi(Ddi::CreateHwQueue(c.ctx.handle()))), "on the same context");
        // The faulting submission was lost with the user-mode queue: a wait for it says so.
        assert!(matches!(q.wait(lost, T), Err(umd::UmdError::QueueLost { queue, .. }) if queue == user));
        // And the queue goes on, on the kernel-mode path.
        let v2 = q.submit(&cb).unwrap();
        q.finish(T).unwrap();
        assert!(q.completed() >= v2);
    }
}

/// Spec 000 "DXGKQAITYPE_USERMODESUBMISSION_CAPS": the doorbell size the KMD reports sizes the
/// dummy page and the CPU mapping; a size the OS cannot map (not a power of two, or larger
/// than the page a CPU VA rotates) fails adapter initialization with a typed error.
#[test]
fn the_doorbell_size_comes_from_the_kmds_caps() {
    use abi::port::KernelError;
    for bad in [0u64, 12, 8192] {
        match kernel::System::sim(SystemConfig { kmd_doorbell_bytes: Some(bad), ..SystemConfig::default() }) {
            Err(KernelError::InvalidArgument { field: "doorbell_bytes", value, .. }) => {
                assert_eq!(value, bad.to_string())
            }
            Err(e) => panic!("{bad}: wrong error {e}"),
            Ok(_) => panic!("{bad}: accepted"),
        }
    }
    // The OS places each doorbell by the reported size, not a constant: with 16-byte
    // doorbells, a KMD that puts one at an 8-byte offset is refused (naming the index), and
    // one at a 16-byte offset works.
    let sys = common::sim_with(SystemConfig { kmd_doorbell_bytes: Some(16), ..SystemConfig::default() });
    let p = common::RawProc::open(&sys);
    let first = abi::port::KernelPort::adapter_info(&*p.port).engines[0].doorbell_first;
    let (even, odd) = if first.is_multiple_of(2) { (first, first + 1) } else { (first + 1, first) };
    let q = p.create(p.desc(odd)).unwrap();
    let e = p.doorbell(q.handle).unwrap_err();
    assert!(
        matches!(&e, KernelError::InvalidArgument { field: "doorbell_index", value, .. } if *value == odd.to_string()),
        "{e}"
    );
    let q = p.create(p.desc(even)).unwrap();
    p.doorbell(q.handle).expect("a 16-byte doorbell at a 16-byte offset");
    // A reported size the page holds works end to end (and INFO reports it).
    let sys = common::sim_with(SystemConfig { kmd_doorbell_bytes: Some(8), ..SystemConfig::default() });
    let c = common::client(&sys);
    assert_eq!(c.device.info().doorbell_bytes, 8);
    let mut q = c.user_queue();
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va(), 3);
    let v = q.submit(&cb).unwrap();
    q.wait(v, T).unwrap();
}
