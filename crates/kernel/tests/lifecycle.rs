//! Context suspend/resume and process termination, in spec 000's order, on the deterministic
//! driver.

mod common;

use std::time::Duration;

use abi::port::{InUseBy, InUseObject, KernelError, NativeFenceType};
use abi::{DoorbellStatus, QueueState};
use kernel::trace::{Ddi, Event};
use kernel::{SystemConfig, Termination};
use umd::CommandBuffer;

const T: Option<Duration> = Some(Duration::from_millis(50));

#[test]
fn a_suspended_context_keeps_its_doorbells_and_runs_the_queued_work_after_resume() {
    let sys = common::sim();
    let c = common::client(&sys);
    let pid = c.port.process();
    let mut q = c.user_queue();
    sys.suspend_context(pid, c.ctx.handle()).unwrap();
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va(), 0x51);
    let v = q.submit(&cb).unwrap();
    sys.settle();
    assert_eq!(c.buf.read_u32(0).unwrap(), 0, "suspended: the GPU does not process it");
    assert_eq!(q.doorbell_status().unwrap(), DoorbellStatus::Connected, "the doorbell stays connected");
    assert_eq!(q.status().unwrap().state, QueueState::Unmapped);
    let e = sys.suspend_context(pid, c.ctx.handle()).unwrap_err();
    assert_eq!(common::refusal(&e), Some(("context", &abi::port::Invalid::AlreadySuspended)), "{e}");
    sys.resume_context(pid, c.ctx.handle()).unwrap();
    q.wait(v, T).unwrap();
    assert_eq!(c.buf.read_u32(0).unwrap(), 0x51);
    let e = sys.resume_context(pid, c.ctx.handle()).unwrap_err();
    assert_eq!(common::refusal(&e), Some(("context", &abi::port::Invalid::NotSuspended)), "{e}");
}

#[test]
fn normal_termination_disconnects_waits_for_the_queued_work_then_destroys() {
    let sys = common::sim();
    let c = common::client(&sys);
    let pid = c.port.process();
    let mut uq = c.user_queue();
    let mut kq = c.kernel_queue();
    let mut cb = CommandBuffer::new();
    cb.fill(c.buf.va(), 4096, 7);
    let (uv, kv) = (uq.submit(&cb).unwrap(), kq.submit(&cb).unwrap());
    // Not run yet: nothing stepped the simulation.
    assert!(uq.completed() < uv && kq.completed() < kv);
    let mark = sys.trace().0.len();
    sys.terminate(pid, Termination::Normal);
    // The work queued before the exit completed before anything was destroyed.
    assert_eq!((uq.completed(), kq.completed()), (uv, kv));
    let d = common::ddis_from(&sys, mark);
    let first_destroy = d.iter().position(|x| matches!(x, Ddi::DestroyDoorbell(_) | Ddi::DestroyHwQueue(_))).unwrap();
    assert!(d[..first_destroy].contains(&Ddi::DisconnectDoorbell(uq.handle())), "disconnect before any destroy: {d:?}");
    assert!(!d.iter().any(|x| matches!(x, Ddi::SuspendContext(_))), "no suspension on a normal exit");
    assert!(d.contains(&Ddi::DestroyHwQueue(uq.handle())) && d.contains(&Ddi::DestroyHwQueue(kq.handle())));
    assert!(matches!(c.port.create_device(), Err(KernelError::ProcessTerminated(_))));
    sys.terminate(pid, Termination::Normal); // twice: a no-op
}

#[test]
fn abnormal_termination_errors_the_device_suspends_disconnects_and_destroys_without_waiting() {
    let sys = common::sim();
    let c = common::client(&sys);
    let pid = c.port.process();
    let f = c.device.create_fence(0, NativeFenceType::Default).unwrap();
    let mut q = c.user_queue();
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va(), 0xdead);
    let v = q.submit(&cb).unwrap();
    let mark = sys.trace().0.len();
    sys.terminate(pid, Termination::Abnormal);
    assert!(q.completed() < v, "nothing waited for the queued work");
    assert_eq!(f.value().unwrap(), abi::port::FENCE_ALWAYS_SIGNALED, "the device in error signals every fence");
    let d = common::ddis_from(&sys, mark);
    let pos = |want: &Ddi| d.iter().position(|x| x == want).unwrap_or_else(|| panic!("{want:?} missing: {d:?}"));
    let (suspend, disconnect, destroy) = (
        pos(&Ddi::SuspendContext(c.ctx.handle())),
        pos(&Ddi::DisconnectDoorbell(q.handle())),
        pos(&Ddi::DestroyHwQueue(q.handle())),
    );
    assert!(suspend < disconnect && disconnect < destroy, "{d:?}");
}

#[test]
fn a_normal_termination_that_cannot_finish_ends_abnormally() {
    let sys = common::sim();
    let c = common::client(&sys);
    let pid = c.port.process();
    let mut q = c.user_queue();
    let mut cb = CommandBuffer::new();
    cb.wait(c.buf.va(), 1); // never satisfied
    q.submit(&cb).unwrap();
    let mark = sys.trace().0.len();
    sys.terminate(pid, Termination::Normal);
    let d = common::ddis_from(&sys, mark);
    assert!(d.contains(&Ddi::SuspendContext(c.ctx.handle())), "fell back to the abnormal path: {d:?}");
    assert!(d.contains(&Ddi::DestroyHwQueue(q.handle())));
}

#[test]
fn termination_returns_every_resource_and_leaves_other_processes_alone() {
    // One doorbell page for processes (page 0 is the kernel's): a second process can only
    // open once the first has given its page back.
    let sys = common::sim_with(SystemConfig {
        gpu: gpu::GpuConfig { doorbell_pages: 2, ..gpu::GpuConfig::default() },
        ..SystemConfig::default()
    });
    for how in [Termination::Normal, Termination::Abnormal] {
        let a = common::client(&sys);
        assert!(matches!(sys.open_process(), Err(KernelError::Exhausted { .. })), "the only page is taken");
        let mut qa = a.user_queue();
        let mut ka = a.kernel_queue();
        let f = a.device.create_fence(0, NativeFenceType::Default).unwrap();
        let mut cb = CommandBuffer::new();
        cb.write_u32(a.buf.va(), 1).signal_fence(&f, 1);
        let (v1, v2) = (qa.submit(&cb).unwrap(), ka.submit(&cb).unwrap());
        qa.wait(v1, T).unwrap();
        ka.wait(v2, T).unwrap();
        sys.terminate(a.port.process(), how);
        // The doorbell page, kernel doorbells and address space came back: a new
        // process opens and works.
        let b = common::client(&sys);
        let mut qb = b.user_queue();
        let mut kb = b.kernel_queue();
        let mut cb = CommandBuffer::new();
        cb.write_u32(b.buf.va(), 2);
        let (v1, v2) = (qb.submit(&cb).unwrap(), kb.submit(&cb).unwrap());
        qb.wait(v1, T).unwrap();
        kb.wait(v2, T).unwrap();
        assert_eq!(b.buf.read_u32(0).unwrap(), 2);
        sys.terminate(b.port.process(), Termination::Normal);
    }
}

#[test]
fn d3_entry_and_exit_follow_the_specs_order_and_lose_nothing() {
    use abi::port::{AllocationDesc, CreateDoorbell, KernelPort, MemoryDomain};
    let sys = common::sim();
    let c = common::client(&sys);
    // A queue whose ring lives in local memory: D3 evicts it.
    let p = common::RawProc::open(&sys);
    let local = |bytes| AllocationDesc { bytes, domain: MemoryDomain::Local, gpu_read_only: false };
    let ring = p.port.allocate(p.dev, &local(4096)).unwrap();
    let ctl = p.port.allocate(p.dev, &local(4096)).unwrap();
    let desc = abi::QueueDescriptor {
        ring_va: ring.va,
        rptr_va: ctl.va,
        wptr_va: ctl.va + 64,
        last_queued_va: ctl.va + abi::ring::LAST_QUEUED_OFFSET,
        ..p.desc(abi::queue::DOORBELL_INDEX_ANY)
    };
    let lq = p.create(desc).unwrap().handle;
    p.port.create_doorbell(&CreateDoorbell { queue: lq, ring_buffer: ring.handle, ring_control: ctl.handle }).unwrap();
    p.port.connect_doorbell(lq).unwrap();
    let mut q = c.user_queue();
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va(), 0xd0);
    let v = q.submit(&cb).unwrap();
    q.wait(v, T).unwrap();

    let mark = sys.trace().0.len();
    sys.enter_d3().unwrap();
    assert!(sys.in_d3());
    let ev = common::events_from(&sys, mark);
    let first = |f: &dyn Fn(&Event) -> bool| ev.iter().position(f).unwrap_or_else(|| panic!("{ev:#?}"));
    let suspend = first(&|e| matches!(e, Event::Ddi(Ddi::SuspendContext(_))));
    let disconnect = first(&|e| matches!(e, Event::Ddi(Ddi::DisconnectDoorbell(_))));
    let evict = first(&|e| matches!(e, Event::Residency { resident: false, .. }));
    let last_suspend = ev.iter().rposition(|e| matches!(e, Event::Ddi(Ddi::SuspendContext(_)))).unwrap();
    let last_disconnect = ev.iter().rposition(|e| matches!(e, Event::Ddi(Ddi::DisconnectDoorbell(_)))).unwrap();
    assert!(suspend < disconnect && last_suspend < disconnect, "1. every context suspended first");
    assert!(last_disconnect < evict, "2. then every doorbell disconnected, 3. then eviction");
    assert!(ev.contains(&Event::Residency { allocation: ring.handle, resident: false }));
    assert!(
        !ev.iter().any(|e| matches!(e, Event::Residency { allocation, .. } if *allocation == c.buf.handle())),
        "only ring allocations"
    );
    assert_eq!(q.doorbell_status().unwrap(), DoorbellStatus::DisconnectedRetry);

    // A submission in D3: the UMD sees the doorbell disconnected and connects, which wakes the
    // device: D0, residency, the doorbell connection, then the contexts resume.
    let mark = sys.trace().0.len();
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va() + 4, 0xd1);
    let v = q.submit(&cb).unwrap();
    q.wait(v, T).unwrap();
    assert!(!sys.in_d3());
    assert_eq!(
        (c.buf.read_u32(0).unwrap(), c.buf.read_u32(4).unwrap()),
        (0xd0, 0xd1),
        "memory preserved, new work ran"
    );
    let ev = common::events_from(&sys, mark);
    let first = |f: &dyn Fn(&Event) -> bool| ev.iter().position(f).unwrap_or_else(|| panic!("{ev:#?}"));
    let d0 = first(&|e| matches!(e, Event::DevicePower { d3: false }));
    let resident = first(&|e| matches!(e, Event::Residency { resident: true, .. }));
    let connect = first(&|e| *e == Event::Ddi(Ddi::ConnectDoorbell(q.handle())));
    let resume = first(&|e| matches!(e, Event::Ddi(Ddi::ResumeContext(_))));
    assert!(d0 < resident && resident < connect && connect < resume, "{ev:#?}");
    // Every context D3 suspended is resumed, including the local-ring queue's.
    let resumed = ev.iter().filter(|e| matches!(e, Event::Ddi(Ddi::ResumeContext(_)))).count();
    assert_eq!(resumed, 2);
}

#[test]
fn d3_is_refused_while_work_is_in_flight_and_keeps_an_explicit_suspension() {
    let sys = common::sim();
    let c = common::client(&sys);
    let pid = c.port.process();
    let mut q = c.user_queue();
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va(), 0x31);
    let v = q.submit(&cb).unwrap();
    // Nothing stepped the simulation: the work is queued, so the device is not idle.
    let mark = sys.trace().0.len();
    let e = sys.enter_d3().unwrap_err();
    assert_eq!(e, KernelError::InUse { object: InUseObject::Adapter, by: InUseBy::WorkInFlight(q.handle()) }, "{e}");
    assert!(e.to_string().contains("work in flight"), "{e}");
    assert!(!sys.in_d3());
    assert!(
        common::ddis_from(&sys, mark).is_empty(),
        "a refused D3 costs nothing: {:?}",
        common::ddis_from(&sys, mark)
    );
    q.wait(v, T).unwrap();
    assert_eq!(c.buf.read_u32(0).unwrap(), 0x31);

    // Idle now. A context the caller suspended stays suspended through D3 and D0.
    sys.suspend_context(pid, c.ctx.handle()).unwrap();
    sys.enter_d3().unwrap();
    let e = sys.resume_context(pid, c.ctx.handle());
    assert!(e.is_ok(), "resuming during D3 is deferred to D0 exit: {e:?}");
    sys.suspend_context(pid, c.ctx.handle()).unwrap();
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va() + 4, 0x32);
    let v = q.submit(&cb).unwrap(); // wakes the device
    sys.settle();
    assert!(!sys.in_d3());
    assert_eq!(c.buf.read_u32(4).unwrap(), 0, "still suspended by its owner after D0");
    sys.resume_context(pid, c.ctx.handle()).unwrap();
    q.wait(v, T).unwrap();
    assert_eq!(c.buf.read_u32(4).unwrap(), 0x32);
}

#[test]
fn the_d3_idle_timer_enters_d3_after_the_engines_idle_that_long_unless_work_is_queued() {
    let sys = common::sim_with(SystemConfig { d3_idle: Some(Duration::from_secs(1)), ..Default::default() });
    let c = common::client(&sys);
    let pid = c.port.process();
    let mut q = c.user_queue();
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va(), 1);
    let v = q.submit(&cb).unwrap();
    q.wait(v, T).unwrap();

    // The engines reach F1 after their 20 ms idle period; D3 waits a whole second more.
    sys.advance(Duration::from_millis(50));
    let f1_at = sys.now();
    assert!(!sys.in_d3());
    sys.advance(Duration::from_millis(900));
    assert!(!sys.in_d3(), "not yet: {:?} since F1", sys.now().since(f1_at));
    let mark = sys.trace().0.len();
    sys.advance(Duration::from_millis(200));
    assert!(sys.in_d3(), "a second after F1");
    assert!(common::events_from(&sys, mark).contains(&Event::DevicePower { d3: true }));

    // A submission wakes it, as in the request case.
    cb.clear();
    cb.write_u32(c.buf.va(), 2);
    let v = q.submit(&cb).unwrap();
    q.wait(v, T).unwrap();
    assert!(!sys.in_d3());
    assert_eq!(c.buf.read_u32(0).unwrap(), 2);

    // Work queued on a suspended context keeps the device out of D3: the engines sleep, the
    // timer fires, D3 is refused, nothing is lost.
    sys.suspend_context(pid, c.ctx.handle()).unwrap();
    cb.clear();
    cb.write_u32(c.buf.va(), 3);
    let v = q.submit(&cb).unwrap();
    sys.advance(Duration::from_millis(50));
    sys.advance(Duration::from_secs(3));
    assert!(!sys.in_d3(), "queued work: no D3");
    sys.resume_context(pid, c.ctx.handle()).unwrap();
    q.wait(v, T).unwrap();
    assert_eq!(c.buf.read_u32(0).unwrap(), 3);
}
