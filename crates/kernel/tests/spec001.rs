//! Spec 001 (amdgpu user-mode queues): what the other files did not cover — per-IP support
//! (an engine without user queues, reported per engine by INFO, the UMD choosing per engine).

mod common;

use std::time::Duration;

use abi::EngineKind;
use abi::port::{Invalid, KernelError};
use kernel::SystemConfig;
use umd::{CommandBuffer, QueueOptions, SubmissionKind};

const T: Option<Duration> = Some(Duration::from_millis(50));

fn with_video() -> kernel::System {
    common::sim_with(SystemConfig {
        gpu: gpu::GpuConfig {
            engines: vec![EngineKind::Compute, EngineKind::Copy, EngineKind::Video],
            ..gpu::GpuConfig::default()
        },
        ..SystemConfig::default()
    })
}

/// "A GPU may support user queues for GFX, compute, and SDMA, but not for VCN ... UMDs can
/// query this information via the INFO IOCTL and determine whether to use kernel queues or
/// user queues for each IP."
#[test]
fn engines_differ_in_the_queues_they_take_info_reports_it_and_the_umd_picks_per_engine() {
    let sys = with_video();
    let c = common::client(&sys);
    let info = c.device.info();
    let by_kind = |k| info.engines.iter().find(|e| e.kind == k).copied().unwrap();
    let (compute, copy, video) = (by_kind(EngineKind::Compute), by_kind(EngineKind::Copy), by_kind(EngineKind::Video));
    assert!(compute.user_queues && compute.kernel_queues);
    assert!(copy.user_queues && copy.kernel_queues);
    assert!(!video.user_queues && video.kernel_queues, "the video engine takes kernel queues only");
    // A user-mode queue on the video engine is refused with a typed error naming the engine.
    let vctx = c.context(EngineKind::Video);
    let e = vctx.create_queue(QueueOptions::user_mode()).err().expect("refused");
    assert_eq!(common::umd_refusal(&e), Some(("engine", &Invalid::Unsupported("user-mode queues"))), "{e}");
    // The UMD picks per engine.
    let preferred = QueueOptions { kind: SubmissionKind::Preferred, ..QueueOptions::default() };
    let mut vq = vctx.create_queue(preferred).unwrap();
    let mut cq = c.ctx.create_queue(preferred).unwrap();
    assert_eq!((vq.kind(), cq.kind()), (SubmissionKind::KernelMode, SubmissionKind::UserMode));
    // Both run work.
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va(), 0x7e).fill(c.buf.va() + 64, 64, 3);
    let v = vq.submit(&cb).unwrap();
    vq.wait(v, T).unwrap();
    assert_eq!((c.buf.read_u32(0).unwrap(), c.buf.read_u32(64).unwrap()), (0x7e, 3));
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va() + 4, 0x7f);
    let v = cq.submit(&cb).unwrap();
    cq.wait(v, T).unwrap();
    assert_eq!(c.buf.read_u32(4).unwrap(), 0x7f);
    // With user queues only (amdgpu user_queue=2), the video engine takes no queue at all.
    let only = common::sim_with(SystemConfig {
        gpu: gpu::GpuConfig {
            engines: vec![EngineKind::Compute, EngineKind::Copy, EngineKind::Video],
            ..gpu::GpuConfig::default()
        },
        user_queue_mode: abi::port::UserQueueMode::UserOnly,
        ..SystemConfig::default()
    });
    let oc = common::client(&only);
    let v = oc.device.info().engines.iter().find(|e| e.kind == EngineKind::Video).copied().unwrap();
    assert!(!v.user_queues && !v.kernel_queues);
    let e = oc.context(EngineKind::Video).create_queue(preferred).err().expect("nothing to pick");
    assert!(matches!(e, umd::UmdError::Kernel(KernelError::InvalidArgument { field: "engine", .. })), "{e}");
}

/// "This also allows the GPU to submit work to itself. Applications can set up work graphs of
/// jobs across multiple GPU engines without needing trips through the CPU." One CPU submission
/// starts a graph compute → copy → compute; each queue submits the next from the GPU by
/// writing its wptr and ringing its doorbell (the process's doorbell page, mapped in its own
/// address space). After the first submission the kernel hears nothing.
#[test]
fn a_gpu_only_work_graph_across_compute_and_copy_runs_from_one_cpu_submission() {
    use kernel::trace::Event;
    let sys = common::sim();
    let c = common::client(&sys);
    let copy = c.context(EngineKind::Copy);
    let mut a = c.user_queue(); // compute
    let mut b = copy.create_queue(QueueOptions::user_mode()).unwrap(); // copy
    let mut d = c.user_queue(); // compute again
    let (src, dst) = (c.buf.va(), c.buf.va() + 4096);
    // Last stage first: each stage's kick is in the stage before it.
    let mut last = CommandBuffer::new();
    last.write_u32(c.buf.va() + 8192, 0x600d);
    let kd = d.prepare(&last).unwrap();
    let mut mid = CommandBuffer::new();
    mid.copy(src, dst, 256).kick(&kd);
    let kb = b.prepare(&mid).unwrap();
    // Prepared, not submitted: nothing runs.
    sys.settle();
    assert_eq!((b.completed(), d.completed()), (0, 0));
    let mark = sys.trace().0.len();
    let mut first = CommandBuffer::new();
    first.fill(src, 256, 0x5).kick(&kb);
    a.submit(&first).unwrap(); // the only CPU submission
    sys.settle();
    assert_eq!(c.buf.read_u32(4096 + 252).unwrap(), 0x5, "the copy engine ran, after the compute engine");
    assert_eq!(c.buf.read_u32(8192).unwrap(), 0x600d, "the last stage ran");
    assert_eq!((b.completed(), d.completed()), (kb.value, kd.value));
    let ev = common::events_from(&sys, mark);
    assert!(ev.iter().all(|e| !matches!(e, Event::Ddi(_))), "no DDI after the first submission: {ev:#?}");
    // The queues go on as usual afterwards (the CPU's next wptr covers the prepared work).
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va() + 8196, 1);
    let v = b.submit(&cb).unwrap();
    b.wait(v, T).unwrap();
}

/// The usual validation: a process rings only its own queues. Its doorbell page is the only
/// one mapped in its address space, so a write aimed at another process's doorbell VA and
/// wptr VA reaches, at most, its own memory.
#[test]
fn a_process_cannot_ring_another_processs_queue_from_the_gpu() {
    let sys = common::sim();
    let victim = common::client(&sys);
    let attacker = common::client(&sys);
    let mut vq = victim.user_queue();
    let mut work = CommandBuffer::new();
    work.write_u32(victim.buf.va(), 0xbad);
    let k = vq.prepare(&work).unwrap();
    let mut aq = attacker.user_queue();
    let mut cb = CommandBuffer::new();
    cb.kick(&k);
    let _ = aq.submit(&cb);
    sys.settle();
    assert_eq!(victim.buf.read_u32(0).unwrap(), 0, "the victim's prepared work did not run");
    assert_eq!(vq.completed(), 0);
    // Its owner can still start it, from the CPU.
    let v = vq.submit(&CommandBuffer::new()).unwrap();
    vq.wait(v, T).unwrap();
    assert_eq!(victim.buf.read_u32(0).unwrap(), 0xbad);
}

/// Where a GPU store cannot ring a doorbell (bits of the global doorbell, a victimized pool),
/// the kernel gives no GPU VA and the UMD refuses to prepare.
#[test]
fn gpu_submission_is_refused_where_the_doorbell_model_cannot_take_it() {
    for cfg in [
        SystemConfig { doorbell_pool: Some(2), ..SystemConfig::default() },
        SystemConfig {
            gpu: gpu::GpuConfig { doorbell_model: abi::doorbell::DoorbellModel::Global, ..gpu::GpuConfig::default() },
            ..SystemConfig::default()
        },
    ] {
        let sys = common::sim_with(cfg);
        let c = common::client(&sys);
        let mut q = c.user_queue();
        let e = q.prepare(&CommandBuffer::new()).expect_err("refused");
        assert_eq!(common::umd_refusal(&e), Some(("doorbell", &Invalid::Unsupported("doorbells rung from the GPU"))));
    }
    let sys = common::sim();
    let c = common::client(&sys);
    let mut k = c.kernel_queue();
    assert!(k.prepare(&CommandBuffer::new()).is_err(), "a kernel-mode queue has no doorbell to ring");
}

/// `USERQ_SIGNAL`, user → kernel: a kernel-mode queue waits on a fence that the kernel signals
/// once a user-mode queue's work completes. The fence is signalled only after that work, and
/// the kernel-mode queue runs only after the fence.
#[test]
fn userq_signal_lets_a_kernel_queue_wait_for_a_user_queues_work() {
    let sys = common::sim();
    let c = common::client(&sys);
    let f = c.device.create_fence(0, abi::port::NativeFenceType::Default).unwrap();
    let mut uq = c.user_queue();
    let mut kq = c.kernel_queue();
    let gate = c.buf.va() + 0x100;
    let mut work = CommandBuffer::new();
    work.wait(gate, 1).write_u32(c.buf.va(), 0xA1); // held until the test opens the gate
    let v = uq.submit(&work).unwrap();
    uq.userq_signal(v, &[(&f, 7)]).unwrap();
    let mut after = CommandBuffer::new();
    after.wait_fence(&f, 7).write_u32(c.buf.va() + 4, 0xB2);
    let kv = kq.submit(&after).unwrap();
    sys.settle();
    assert_eq!((f.value().unwrap(), c.buf.read_u32(4).unwrap()), (0, 0), "nothing before the user queue's work");
    c.buf.write_u64(0x100, 1).unwrap();
    kq.wait(kv, T).unwrap();
    assert_eq!(f.value().unwrap(), 7);
    assert_eq!((c.buf.read_u32(0).unwrap(), c.buf.read_u32(4).unwrap()), (0xA1, 0xB2));
    assert!(uq.completed() >= v);
    // A point already passed signals at once; one past the last-queued value is refused.
    uq.userq_signal(v, &[(&f, 8)]).unwrap();
    assert_eq!(f.value().unwrap(), 8);
    let e = uq.userq_signal(v + 1, &[(&f, 9)]).unwrap_err();
    assert_eq!(common::umd_refusal(&e), Some(("point", &Invalid::BeyondQueued { last_queued: v })), "{e}");
    // USERQ ioctls are for user queues.
    assert!(matches!(kq.userq_signal(kv, &[(&f, 9)]), Err(umd::UmdError::Kernel(KernelError::WrongQueueMode { .. }))));
}

/// `USERQ_WAIT`, kernel → user: a user-mode queue waits, on the GPU, for a kernel-mode queue's
/// progress fence (a kernel-queue fence), through the wait points the kernel answered.
#[test]
fn userq_wait_lets_a_user_queue_wait_for_a_kernel_queues_fence() {
    let sys = common::sim();
    let c = common::client(&sys);
    let mut kq = c.kernel_queue();
    let mut uq = c.user_queue();
    let gate = c.buf.va() + 0x100;
    let mut first = CommandBuffer::new();
    first.wait(gate, 1).write_u32(c.buf.va(), 0x11);
    let kv = kq.submit(&first).unwrap();
    let points = uq.userq_wait(&[abi::port::SyncWait::QueueProgress { queue: kq.handle(), value: kv }]).unwrap();
    assert_eq!(points, [abi::port::WaitPoint { va: kq.progress_va(), value: kv }]);
    let mut then = CommandBuffer::new();
    then.wait_points(&points).write_u32(c.buf.va() + 4, 0x22);
    let uv = uq.submit(&then).unwrap();
    sys.settle();
    assert_eq!(c.buf.read_u32(4).unwrap(), 0, "the user queue waits for the kernel queue");
    c.buf.write_u64(0x100, 1).unwrap();
    uq.wait(uv, T).unwrap();
    assert_eq!((c.buf.read_u32(0).unwrap(), c.buf.read_u32(4).unwrap()), (0x11, 0x22));
    // Another process's queue is not a sync object of this one.
    let other = common::client(&sys);
    let oq = other.kernel_queue();
    let e = uq.userq_wait(&[abi::port::SyncWait::QueueProgress { queue: oq.handle(), value: 1 }]).unwrap_err();
    assert_eq!(common::umd_refusal(&e), Some(("queue", &Invalid::OtherProcess)), "{e}");
}

/// Mixed kernel and user queues: user → kernel → user, one chain: a user queue's work
/// signals a fence (`USERQ_SIGNAL`), a kernel queue waits on it and runs, a second user queue
/// waits for the kernel queue's progress (`USERQ_WAIT`) and runs last.
#[test]
fn user_and_kernel_queues_chain_through_userq_signal_and_wait() {
    let sys = common::sim();
    let c = common::client(&sys);
    let f = c.device.create_fence(0, abi::port::NativeFenceType::Default).unwrap();
    let mut u1 = c.user_queue();
    let mut k = c.kernel_queue();
    let copy = c.context(EngineKind::Copy);
    let mut u2 = copy.create_queue(QueueOptions::user_mode()).unwrap();
    let gate = c.buf.va() + 0x100;
    let mut a = CommandBuffer::new();
    a.wait(gate, 1).fill(c.buf.va() + 0x1000, 256, 0x1);
    let v1 = u1.submit(&a).unwrap();
    u1.userq_signal(v1, &[(&f, 1)]).unwrap();
    let mut b = CommandBuffer::new();
    b.wait_fence(&f, 1).copy(c.buf.va() + 0x1000, c.buf.va() + 0x2000, 256);
    let kv = k.submit(&b).unwrap();
    let points = u2.userq_wait(&[abi::port::SyncWait::QueueProgress { queue: k.handle(), value: kv }]).unwrap();
    let mut d = CommandBuffer::new();
    d.wait_points(&points).copy(c.buf.va() + 0x2000, c.buf.va() + 0x3000, 256);
    let v2 = u2.submit(&d).unwrap();
    sys.settle();
    assert_eq!(c.buf.read_u32(0x3000).unwrap(), 0, "nothing before the first user queue's work");
    c.buf.write_u64(0x100, 1).unwrap();
    u2.wait(v2, T).unwrap();
    assert_eq!(c.buf.read_u32(0x3000 + 252).unwrap(), 0x1, "the fill travelled user -> kernel -> user");
    assert_eq!(f.value().unwrap(), 1);
}

/// "The user can also specify the attributes for the user queue (priority, whether the queue
/// is secure for protected content, etc.)": a secure queue on a device without protected
/// content is refused with a typed error, and so are unknown attribute bits.
#[test]
fn a_secure_queue_is_refused_where_the_device_has_no_protected_content() {
    let sys = common::sim();
    let p = common::RawProc::open(&sys);
    let c = common::client(&sys);
    assert!(!c.device.info().secure_queues);
    let secure = abi::QueueDescriptor { flags: abi::queue::QUEUE_FLAG_SECURE, ..p.desc(0) };
    let e = p.create(secure).unwrap_err();
    assert_eq!(common::refusal(&e), Some(("flags", &Invalid::Unsupported("secure (protected-content) queues"))), "{e}");
    let e = p.create(abi::QueueDescriptor { flags: 1 << 7, ..p.desc(0) }).unwrap_err();
    assert_eq!(common::refusal(&e), Some(("flags", &Invalid::MustBeZero)), "{e}");
    let e = p.create(abi::QueueDescriptor { reserved: 1, ..p.desc(0) }).unwrap_err();
    assert_eq!(common::refusal(&e), Some(("reserved", &Invalid::MustBeZero)), "{e}");
    // Nothing was created; a plain queue still is.
    assert_eq!(sys.census().queues, 0);
    p.create(p.desc(0)).unwrap();
}

/// "Kernel queues are always mapped so any work that goes into kernel queues will take
/// priority. This limits the available HQD slots for user queues." A kernel queue holds a slot
/// from creation, idle or not, taking it from a user queue if it must; INFO reports the slots
/// left for user queues.
#[test]
fn kernel_queues_are_always_mapped_and_info_reports_the_slots_left_for_user_queues() {
    let sys = common::sim_with(SystemConfig {
        gpu: gpu::GpuConfig { hw_slots: 2, ..gpu::GpuConfig::default() },
        ..SystemConfig::default()
    });
    let c = common::client(&sys);
    let compute = c.ctx.engine();
    let slots = |_: &kernel::System| {
        let info = c.port.adapter_info();
        let e = info.engines.iter().find(|e| e.id == compute).copied().unwrap();
        (e.hw_slots, e.user_slots)
    };
    assert_eq!(slots(&sys), (2, 2));
    // Two busy user queues hold both slots.
    let gate = c.buf.va() + 0x100;
    let mut users: Vec<umd::Queue> = (0..2).map(|_| c.user_queue()).collect();
    for (i, q) in users.iter_mut().enumerate() {
        let mut cb = CommandBuffer::new();
        cb.wait(gate, 1).write_u32(c.buf.va() + 4 * i as u64, 1);
        q.submit(&cb).unwrap();
    }
    sys.settle();
    assert!(users.iter().all(|q| q.status().unwrap().state == abi::QueueState::Mapped));
    // A kernel queue with no work takes a slot at once, from a user queue.
    let kq = c.kernel_queue();
    sys.settle();
    assert_eq!(kq.status().unwrap().state, abi::QueueState::Mapped, "mapped with no work");
    assert_eq!(slots(&sys), (2, 1), "one slot left for user queues");
    let mapped = users.iter().filter(|q| q.status().unwrap().state == abi::QueueState::Mapped).count();
    assert_eq!(mapped, 1, "a user queue gave its slot up");
    // Idle, it keeps it while the user queues take turns on the other; all the work runs.
    c.buf.write_u64(0x100, 1).unwrap();
    for q in &users {
        q.finish(T).unwrap();
        assert_eq!(kq.status().unwrap().state, abi::QueueState::Mapped);
    }
    assert_eq!((c.buf.read_u32(0).unwrap(), c.buf.read_u32(4).unwrap()), (1, 1));
    drop(kq);
    sys.settle();
    assert_eq!(slots(&sys), (2, 2), "the slot comes back with the kernel queue");
}

/// Submits `cb` and its progress fence 1 on raw process `p`'s empty ring, and rings `db`
/// with the new wptr: the submission loop by hand. Returns the ring-control view.
fn raw_submit(p: &common::RawProc, db: &abi::port::DoorbellInfo, cb: &CommandBuffer) -> shm::Mapping {
    use abi::port::KernelPort;
    let mut words = cb.words().to_vec();
    words.extend_from_slice(&abi::packet::progress_fence_words(1));
    let ring = p.port.map_allocation(p.ring.handle).unwrap();
    let ctl = p.port.map_allocation(p.ctl.handle).unwrap();
    ring.write_u32s(0, &words).unwrap();
    ctl.write_u64(abi::ring::LAST_QUEUED_OFFSET, 1).unwrap();
    let wptr = words.len() as u64 * 4;
    ctl.write_u64(abi::ring::WPTR_OFFSET, wptr).unwrap();
    shm::Word::new(&db.cpu_page, db.offset).unwrap().get().store(wptr, std::sync::atomic::Ordering::Release);
    ctl
}

/// A user-mode queue of a new raw process over an application-allocated context save area,
/// running a dispatch that never ends: the process, the queue, the area and a view of it.
fn endless_dispatch_over_an_app_save_area(
    sys: &kernel::System,
) -> (common::RawProc, abi::port::HwQueueInfo, abi::port::AllocationInfo, shm::Mapping) {
    use abi::port::{AllocationDesc, KernelPort};
    let p = common::RawProc::open(sys);
    let need = p.port.adapter_info().queue_metadata.context_save_bytes;
    let csa = p.port.allocate(p.dev, &AllocationDesc::system(need)).unwrap();
    let q = p.create(abi::QueueDescriptor { context_save_va: csa.va, ..p.desc(0) }).unwrap();
    let db = p.doorbell(q.handle).unwrap();
    p.port.connect_doorbell(q.handle).unwrap();
    let kernel = p.port.allocate(p.dev, &AllocationDesc::system(4096)).unwrap();
    p.port.map_allocation(kernel.handle).unwrap().write(0, &common::forever()).unwrap();
    let mut cb = CommandBuffer::new();
    cb.dispatch(kernel.va, [1, 1, 1], [32, 1, 1], kernel.va);
    raw_submit(&p, &db, &cb);
    let saved = p.port.map_allocation(csa.handle).unwrap();
    (p, q, csa, saved)
}

/// Whether any byte of a save area is written.
fn written(saved: &shm::Mapping) -> bool {
    let mut bytes = vec![0u8; saved.len()];
    saved.read(0, &mut bytes).unwrap();
    bytes.iter().any(|&b| b != 0)
}

/// "When an application wants to create a user queue, it allocates the necessary buffers for
/// the queue (ring buffer, wptr and rptr, context save areas, etc.)": a context save area the
/// application allocated is validated, pinned while its queue lives, and is where the engine
/// saves an interrupted dispatch.
#[test]
fn an_application_allocated_context_save_area_is_validated_and_used() {
    use abi::port::{AllocationDesc, KernelPort};
    let sys = common::sim();
    let p = common::RawProc::open(&sys);
    let need = p.port.adapter_info().queue_metadata.context_save_bytes;
    let small = p.port.allocate(p.dev, &AllocationDesc::system(4096)).unwrap();
    let csa = p.port.allocate(p.dev, &AllocationDesc::system(need)).unwrap();
    // Too small, not an allocation's start, outside every mapping: refused, naming the field.
    for va in [small.va, csa.va + 4096, 0x7000_0000] {
        let e = p.create(abi::QueueDescriptor { context_save_va: va, ..p.desc(0) }).unwrap_err();
        assert!(
            matches!(
                &e,
                KernelError::InvalidArgument { field: "context_save_va", .. }
                    | KernelError::OutsideMappings { field: "context_save_va", .. }
            ),
            "{va:#x}: {e}"
        );
    }
    // A dispatch that never ends runs in turns, its state kept in its hardware slot; when the
    // queue is preempted, the state goes to the application's save area.
    let (p, q, csa, saved) = endless_dispatch_over_an_app_save_area(&sys);
    assert!(!written(&saved));
    assert!(p.port.free(csa.handle).is_err(), "pinned while the queue lives");
    sys.run_for(Duration::from_millis(1));
    assert!(!written(&saved), "in its slot, the state stays on the engine");
    sys.preempt_queue(p.port.process(), q.handle).unwrap();
    sys.run_for(Duration::from_micros(100));
    assert!(written(&saved), "the engine saved the dispatch's state in the application's area");
    p.port.destroy_hw_queue(q.handle).unwrap();
    p.port.free(csa.handle).expect("free once its queue is gone");
}

/// The scheduler's own eviction saves the state too: a higher-priority queue of another
/// process takes the only slot, and by the end of that step (after the queue that took the
/// slot ran) the evicted dispatch's state is in its save area.
#[test]
fn an_evicted_dispatch_is_in_its_save_area_by_the_end_of_the_step() {
    let sys = common::sim_with(kernel::SystemConfig {
        gpu: gpu::GpuConfig { hw_slots: 1, ..gpu::GpuConfig::default() },
        ..kernel::SystemConfig::default()
    });
    let (p, q, _csa, saved) = endless_dispatch_over_an_app_save_area(&sys);
    sys.run_for(Duration::from_millis(1));
    assert!(!written(&saved));
    let h = common::high_priority_write(&sys);
    assert_eq!(h.buf.read_u32(0).unwrap(), 1, "the high-priority queue took the slot and ran");
    assert!(written(&saved), "the evicted dispatch's state is in its area");
    // (Destroyed here: a normal termination would wait out its budget for the endless kernel.)
    abi::port::KernelPort::destroy_hw_queue(&*p.port, q.handle).unwrap();
}

/// A GPU ring on a queue whose engine went to F1 (its doorbell disconnected, nobody watching
/// the word) is still heard: the firmware sees the disconnected word change and the kernel
/// reconnects the doorbell — waking the engine — as the UMD would on `DisconnectedRetry`.
#[test]
fn a_gpu_ring_on_a_queue_whose_engine_is_in_f1_wakes_it() {
    use kernel::trace::{Ddi, Event};
    let idle = Duration::from_millis(2);
    let sys = common::sim_with(common::idle_config(idle));
    let c = common::client(&sys);
    let copy = c.context(EngineKind::Copy);
    let mut a = c.user_queue();
    let mut b = copy.create_queue(QueueOptions::user_mode()).unwrap();
    let mut work = CommandBuffer::new();
    work.write_u32(c.buf.va() + 64, 0xF1);
    let kb = b.prepare(&work).unwrap();
    sys.run_for(idle * 5);
    assert_eq!(sys.power(copy.engine()), gpu::PowerState::F1, "the copy engine is asleep");
    assert_eq!(b.doorbell_status().unwrap(), abi::DoorbellStatus::DisconnectedRetry);
    let mark = sys.trace().0.len();
    let mut cb = CommandBuffer::new();
    cb.kick(&kb);
    a.submit(&cb).unwrap();
    b.wait(kb.value, T).unwrap();
    assert_eq!(c.buf.read_u32(64).unwrap(), 0xF1);
    let ev = common::events_from(&sys, mark);
    let rang = ev.iter().position(|e| *e == Event::DisconnectedRing { queue: b.handle() }).expect("heard");
    let connect = ev.iter().position(|e| *e == Event::Ddi(Ddi::ConnectDoorbell(b.handle()))).expect("reconnected");
    assert!(rang < connect, "{ev:#?}");
    assert_eq!(b.doorbell_status().unwrap(), abi::DoorbellStatus::Connected);
}

/// "They would also allocate a doorbell page for the doorbells used by the user queues. The
/// application would then populate the MQD ... with the GPU virtual addresses and doorbell
/// index they want to use. ... The kernel driver then validates the MQD": a doorbell page the
/// application allocated is named in the descriptor with the index it wants; the kernel
/// checks that the page is the process's, the index lies in it and in the engine's range, and
/// no other queue has it; the queue pins the page and rings the doorbell it chose.
#[test]
fn an_application_allocated_doorbell_page_is_validated_pinned_and_rung() {
    use abi::port::{InUseBy, KernelPort, PhysicalDoorbell};
    let sys = common::sim();
    let start = sys.census();
    let p = common::RawProc::open(&sys);
    let engine = p.port.adapter_info().engines[0];
    let (first, end) = (engine.doorbell_first, engine.doorbell_first + engine.doorbell_count);
    let page = p.port.create_doorbell_page(p.dev).unwrap();
    assert_eq!(page.doorbells, 512);
    let index = first + 3;
    let on_page = |index| abi::QueueDescriptor { doorbell_page_va: page.va, ..p.desc(index) };
    // Not one of the process's doorbell pages (an allocation; another process's page; any VA).
    // (VAs are per process: another process's page is named in its own address space, and
    // the same number in this one names whatever this process has there.)
    let other = common::RawProc::open(&sys);
    other.port.allocate(other.dev, &abi::port::AllocationDesc::system(4096)).unwrap();
    let foreign = other.port.create_doorbell_page(other.dev).unwrap();
    assert_ne!(foreign.va, page.va);
    for va in [p.ring.va, foreign.va, 0x7000_0000] {
        let e = p.create(abi::QueueDescriptor { doorbell_page_va: va, ..p.desc(index) }).unwrap_err();
        assert_eq!(common::refusal(&e), Some(("doorbell_page_va", &Invalid::NoDoorbellPage)), "{va:#x}: {e}");
        assert!(e.to_string().contains(&format!("{va:#x}")), "names the value: {e}");
    }
    assert!(matches!(p.port.destroy_doorbell_page(foreign.handle), Err(KernelError::BadHandle { .. })));
    // Outside the engine's range of the page, outside the page.
    let e = p.create(on_page(end)).unwrap_err();
    assert!(matches!(common::refusal(&e), Some(("doorbell_index", Invalid::OutsideEngineDoorbells { .. }))), "{e}");
    let e = p.create(on_page(512)).unwrap_err();
    assert!(matches!(common::refusal(&e), Some(("doorbell_index", Invalid::OutsideDoorbellPage { .. }))), "{e}");
    // Taken: by a queue on the same page only.
    let q = p.create(on_page(index)).unwrap().handle;
    let e = p.create(on_page(index)).unwrap_err();
    assert_eq!(common::refusal(&e), Some(("doorbell_index", &Invalid::UsedBy(q))), "{e}");
    let same_index_own_page = p.create(p.desc(index)).expect("another page, another doorbell").handle;
    // Pinned while its queue lives.
    let e = p.port.destroy_doorbell_page(page.handle).unwrap_err();
    assert!(matches!(e, KernelError::InUse { by: InUseBy::Queue(by), .. } if by == q), "{e}");
    // The queue rings the doorbell it chose: that index of that page.
    let db = p.doorbell(q).unwrap();
    let gpu = db.gpu_va.expect("the page is mapped for GPU rings");
    assert!((page.va..page.va + 4096).contains(&gpu) && gpu - page.va == index as u64 * 8, "{gpu:#x}");
    p.port.connect_doorbell(q).unwrap();
    let _ = p.doorbell(same_index_own_page).unwrap();
    p.port.connect_doorbell(same_index_own_page).unwrap();
    let (Some(PhysicalDoorbell::BarIndex(a)), Some(PhysicalDoorbell::BarIndex(b))) =
        (p.port.query_physical_doorbell(q).unwrap(), p.port.query_physical_doorbell(same_index_own_page).unwrap())
    else {
        panic!("dedicated doorbells")
    };
    assert_eq!((a % 512, b % 512), (index, index));
    assert_ne!(a / 512, b / 512, "two pages");
    p.port.destroy_hw_queue(same_index_own_page).unwrap();
    let mut cb = CommandBuffer::new();
    cb.write_u32(p.ctl.va + 1024, 0xd00b);
    let ctl = raw_submit(&p, &db, &cb);
    sys.settle();
    assert_eq!(ctl.read_u32(1024).unwrap(), 0xd00b, "the doorbell of the application's page was heard");
    // One page of its own besides the kernel's: 1,024 doorbells.
    let e = p.port.create_doorbell_page(p.dev).unwrap_err();
    assert!(matches!(e, KernelError::Exhausted { what: "doorbell pages", .. }), "{e}");
    p.port.destroy_hw_queue(q).unwrap();
    p.port.destroy_doorbell_page(page.handle).expect("free once its queue is gone");
    // The process may allocate one again; its device's destruction frees it.
    let again = p.port.create_doorbell_page(p.dev).unwrap();
    p.port.destroy_device(p.dev).unwrap();
    assert!(matches!(p.port.destroy_doorbell_page(again.handle), Err(KernelError::BadHandle { .. })));
    drop((p, other));
    sys.settle();
    assert_eq!(sys.census(), start, "every page back once the processes end");
}

/// The UMD side: a queue takes a doorbell of a page the application allocated
/// (`QueueOptions::doorbell`), submits through it, and is rung from the GPU through it.
#[test]
fn the_umd_creates_queues_on_its_own_doorbell_page() {
    let sys = common::sim();
    let c = common::client(&sys);
    let page = c.device.create_doorbell_page().unwrap();
    let first = c.device.info().engines[0].doorbell_first;
    let opts = QueueOptions { doorbell: Some(page.doorbell(first + 7)), ..QueueOptions::user_mode() };
    let mut q = c.ctx.create_queue(opts).unwrap();
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va(), 1);
    let v = q.submit(&cb).unwrap();
    q.wait(v, T).unwrap();
    assert_eq!(c.buf.read_u32(0).unwrap(), 1);
    match c.ctx.create_queue(opts) {
        Err(e) => assert!(e.to_string().contains("already used by"), "{e}"),
        Ok(_) => panic!("the same doorbell twice"),
    }
    // Rung from the GPU, through the page's mapping in the process's address space.
    let mut kicked = CommandBuffer::new();
    kicked.write_u32(c.buf.va() + 4, 2);
    let k = q.prepare(&kicked).unwrap();
    let mut other = c.user_queue();
    let mut cb = CommandBuffer::new();
    cb.kick(&k);
    other.submit(&cb).unwrap();
    sys.settle();
    assert_eq!((c.buf.read_u32(4).unwrap(), q.completed()), (2, k.value));
}

/// The application's doorbell page under each doorbell model: a queue on it is heard with
/// global doorbell bits, over a victimized pool, and with the aggregated doorbell.
#[test]
fn an_application_doorbell_page_works_under_every_doorbell_model() {
    use abi::doorbell::DoorbellModel;
    let gpu = |model, misses| gpu::GpuConfig {
        doorbell_model: model,
        misses_unmapped_doorbells: misses,
        hw_slots: 2,
        ..gpu::GpuConfig::default()
    };
    let configs = [
        SystemConfig { gpu: gpu(DoorbellModel::Global, false), ..SystemConfig::default() },
        SystemConfig { gpu: gpu(DoorbellModel::Dedicated, false), doorbell_pool: Some(2), ..SystemConfig::default() },
        SystemConfig { gpu: gpu(DoorbellModel::Dedicated, true), ..SystemConfig::default() },
    ];
    for cfg in configs {
        let what = format!(
            "{:?} pool {:?} aggregated {}",
            cfg.gpu.doorbell_model, cfg.doorbell_pool, cfg.gpu.misses_unmapped_doorbells
        );
        let sys = common::sim_with(cfg);
        let c = common::client(&sys);
        let page = c.device.create_doorbell_page().unwrap();
        let first = c.device.info().engines[0].doorbell_first;
        // More queues than slots and pool doorbells: some are unmapped, some victimized.
        let mut qs: Vec<_> = (0..4)
            .map(|i| {
                let opts = QueueOptions { doorbell: Some(page.doorbell(first + i)), ..QueueOptions::user_mode() };
                c.ctx.create_queue(opts).unwrap()
            })
            .collect();
        for round in 0..2u32 {
            for (i, q) in qs.iter_mut().enumerate() {
                let mut cb = CommandBuffer::new();
                cb.write_u32(c.buf.va() + i as u64 * 4, round + 1);
                let v = q.submit(&cb).unwrap();
                q.wait(v, T).unwrap_or_else(|e| panic!("{what}: queue {i}: {e}"));
            }
        }
        for i in 0..4 {
            assert_eq!(c.buf.read_u32(i * 4).unwrap(), 2, "{what}");
        }
    }
}

/// "In the event that one of these options is not available, the kernel driver will map a
/// page of aggregated doorbell space into each GPUVM space. The UMD will then update the
/// doorbell and wptr as normal and then write to the aggregated doorbell as well." On an
/// engine that misses rings of queues without a slot, a queue that submits to another from
/// the GPU rings the aggregated doorbell too, through the page's mapping in the process's
/// address space: the target, unmapped when it is rung, still runs.
#[test]
fn a_gpu_ring_of_an_unmapped_queue_rings_the_aggregated_doorbell_mapped_in_the_process() {
    let mut cfg = SystemConfig {
        gpu: gpu::GpuConfig { misses_unmapped_doorbells: true, hw_slots: 1, ..gpu::GpuConfig::default() },
        ..SystemConfig::default()
    };
    // Engines never idle inside the test: no F1 round trip (whose reconnect re-reads every
    // wptr) can find the work; only the aggregated doorbell can.
    cfg.gpu.idle_period = Duration::from_secs(3600);
    let sys = common::sim_with(cfg);
    let c = common::client(&sys);
    let mut kicker = c.user_queue();
    let mut target = c.user_queue();
    let mut work = CommandBuffer::new();
    work.write_u32(c.buf.va(), 0xa99);
    let k = target.prepare(&work).unwrap();
    let agg = k.aggregated_va.expect("the aggregated page is mapped in the process's GPU address space");
    assert_ne!(agg, k.doorbell_va);
    // The kicker holds the only slot while it rings: the target has none.
    let mut cb = CommandBuffer::new();
    cb.kick(&k);
    let v = kicker.submit(&cb).unwrap();
    kicker.wait(v, T).unwrap();
    sys.settle();
    assert_eq!(
        (c.buf.read_u32(0).unwrap(), target.completed()),
        (0xa99, k.value),
        "heard through the aggregated doorbell"
    );
}

/// A device's destruction frees its doorbell pages, so a queue may name only a page of its
/// own device: one of another device of the same process is refused (naming the VA), and
/// that device's destruction is never held up by a queue it does not own.
#[test]
fn a_queue_takes_a_doorbell_page_of_its_own_device_only() {
    use abi::port::KernelPort;
    let sys = common::sim();
    let p = common::RawProc::open(&sys);
    let other = p.port.create_device().unwrap();
    let page = p.port.create_doorbell_page(other).unwrap();
    let first = p.port.adapter_info().engines[0].doorbell_first;
    let e = p.create(abi::QueueDescriptor { doorbell_page_va: page.va, ..p.desc(first + 1) }).unwrap_err();
    assert_eq!(common::refusal(&e), Some(("doorbell_page_va", &Invalid::NoDoorbellPage)), "{e}");
    assert!(e.to_string().contains(&format!("{:#x}", page.va)), "names the value: {e}");
    p.port.destroy_device(other).expect("no queue of another device pins its page");
    assert!(matches!(p.port.destroy_doorbell_page(page.handle), Err(KernelError::BadHandle { .. })));
    // The page went with its device: the process may allocate one again, on its own device.
    let mine = p.port.create_doorbell_page(p.dev).unwrap();
    p.create(abi::QueueDescriptor { doorbell_page_va: mine.va, ..p.desc(first + 1) }).expect("its own device's page");
}

/// A device's destruction frees its allocations too, so a queue runs only from its own
/// device's memory: a ring, rptr/wptr/last-queued word or context save area in an allocation
/// of another device of the same process is refused naming the field and the VA, and that
/// device's destruction then goes through whole (it used to fail on the queue's pin after it
/// had destroyed its contexts).
#[test]
fn a_queue_runs_only_from_its_own_devices_memory() {
    use abi::port::KernelPort;
    let sys = common::sim();
    let p = common::RawProc::open(&sys);
    let other = p.port.create_device().unwrap();
    let foreign = p.port.allocate(other, &abi::port::AllocationDesc::system(4096)).unwrap();
    let first = p.port.adapter_info().engines[0].doorbell_first;
    let base = p.desc(first);
    let cases = [
        ("ring_va", abi::QueueDescriptor { ring_va: foreign.va, ..base }),
        ("rptr_va", abi::QueueDescriptor { rptr_va: foreign.va + abi::ring::RPTR_OFFSET, ..base }),
        ("wptr_va", abi::QueueDescriptor { wptr_va: foreign.va + abi::ring::WPTR_OFFSET, ..base }),
        ("last_queued_va", abi::QueueDescriptor { last_queued_va: foreign.va + abi::ring::LAST_QUEUED_OFFSET, ..base }),
    ];
    for (field, desc) in cases {
        let e = p.create(desc).unwrap_err();
        assert_eq!(common::refusal(&e), Some((field, &Invalid::OtherDevice)), "{field}: {e}");
        assert!(e.to_string().contains("0x"), "names the value: {e}");
    }
    let csa_bytes = p.port.adapter_info().queue_metadata.context_save_bytes;
    let csa = p.port.allocate(other, &abi::port::AllocationDesc::system(csa_bytes)).unwrap();
    let e = p.create(abi::QueueDescriptor { context_save_va: csa.va, ..base }).unwrap_err();
    assert_eq!(common::refusal(&e), Some(("context_save_va", &Invalid::OtherDevice)), "{e}");
    // Nothing of the other device is pinned: it goes whole, and the process's own queue works.
    p.port.destroy_device(other).expect("no queue of another device pins its memory");
    assert!(matches!(p.port.destroy_device(other), Err(KernelError::BadHandle { .. })));
    p.create(base).expect("its own device's memory");
}

/// A freed doorbell page's BAR page stays its process's until the process ends (a daemon
/// client's mapping of it cannot be revoked): another process opened or allocating a page
/// afterwards never gets it, and the process's own next page does.
#[test]
fn a_freed_doorbell_page_stays_its_process_until_it_ends() {
    use abi::port::{KernelPort, PhysicalDoorbell};
    let sys = common::sim();
    let first = |p: &common::RawProc| p.port.adapter_info().engines[0].doorbell_first;
    // The BAR page of a queue's doorbell on page `va` (0: the process's own).
    let bar_page = |p: &common::RawProc, va: u64| {
        let q = p.create(abi::QueueDescriptor { doorbell_page_va: va, ..p.desc(first(p)) }).unwrap().handle;
        p.doorbell(q).unwrap();
        p.port.connect_doorbell(q).unwrap();
        let Some(PhysicalDoorbell::BarIndex(i)) = p.port.query_physical_doorbell(q).unwrap() else {
            panic!("a dedicated doorbell")
        };
        p.port.destroy_hw_queue(q).unwrap();
        i / abi::doorbell::DOORBELLS_PER_PAGE
    };
    let a = common::RawProc::open(&sys);
    let page = a.port.create_doorbell_page(a.dev).unwrap();
    let freed = bar_page(&a, page.va);
    a.port.destroy_doorbell_page(page.handle).unwrap();
    let b = common::RawProc::open(&sys);
    let b_page = b.port.create_doorbell_page(b.dev).unwrap();
    let b_pages = [bar_page(&b, 0), bar_page(&b, b_page.va)];
    assert!(!b_pages.contains(&freed), "BAR page {freed} went to another process: {b_pages:?}");
    // Held while freed: the process's own page and the freed one.
    let held = sys.census().doorbell_pages;
    let again = a.port.create_doorbell_page(a.dev).unwrap();
    assert_eq!(sys.census().doorbell_pages, held, "no new BAR page: the freed one");
    assert_eq!(bar_page(&a, again.va), freed, "the process's next page takes it back");
    // Once the process ends, both its BAR pages go back to the pool.
    drop(a);
    sys.settle();
    assert_eq!(sys.census().doorbell_pages, held - 2);
}

/// "You are limited by the HQD slots. Kernel queues are always mapped [...] This limits the
/// available HQD slots for user queues." A kernel queue that would hold an engine's last slot
/// while user queues exist there is refused, and so is a user queue on an engine whose slots
/// kernel queues all hold: either way the user queues could never run. (`doorbell sim swarm`
/// found a kernel-mode queue on a one-slot engine starving a user-mode queue forever.)
#[test]
fn a_kernel_queue_never_takes_the_last_slot_from_user_queues() {
    let one_slot = || {
        common::sim_with(SystemConfig {
            gpu: gpu::GpuConfig { hw_slots: 1, ..gpu::GpuConfig::default() },
            ..SystemConfig::default()
        })
    };
    let is_slots = |e: &umd::UmdError| matches!(e, umd::UmdError::Kernel(abi::port::KernelError::Exhausted { what, .. }) if &**what == "hardware slots");
    // A user queue first: the kernel queue is refused, naming the engine's slots.
    let sys = one_slot();
    let c = common::client(&sys);
    let mut user = c.user_queue();
    let e = c.ctx.create_queue(umd::QueueOptions::kernel_mode()).err().expect("refused");
    assert!(is_slots(&e), "{e}");
    assert!(e.to_string().contains("last of its 1 hardware slots"), "{e}");
    // The user queue runs as before.
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va(), 7);
    let v = user.submit(&cb).unwrap();
    user.wait(v, T).unwrap();
    assert_eq!(c.buf.read_u32(0).unwrap(), 7);
    // A kernel queue first: the user queue is refused; the kernel queue runs.
    let sys = one_slot();
    let c = common::client(&sys);
    let mut kq = c.kernel_queue();
    let e = c.ctx.create_queue(umd::QueueOptions::user_mode()).err().expect("refused");
    assert!(is_slots(&e), "{e}");
    assert!(e.to_string().contains("none is left for a user-mode queue"), "{e}");
    let v = kq.submit(&cb).unwrap();
    kq.wait(v, T).unwrap();
    assert_eq!(c.buf.read_u32(0).unwrap(), 7);
    // With two slots, one kernel queue beside user queues is fine; a second is refused.
    let sys = common::sim_with(SystemConfig {
        gpu: gpu::GpuConfig { hw_slots: 2, ..gpu::GpuConfig::default() },
        ..SystemConfig::default()
    });
    let c = common::client(&sys);
    let _user = c.user_queue();
    let _kq = c.kernel_queue();
    let e = c.ctx.create_queue(umd::QueueOptions::kernel_mode()).err().expect("refused");
    assert!(is_slots(&e), "{e}");
}
