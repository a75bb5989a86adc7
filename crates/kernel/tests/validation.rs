//! Validation: every refused kernel call returns a typed [`KernelError`] whose message names
//! the bad field (or handle) and its value, and changes nothing else.
//!
//! These tests use the raw port ([`abi::port::KernelPort`]) through [`common::RawProc`], so
//! they can pass what a well-behaved UMD never would.

mod common;

use abi::handle::AnyHandle;
use abi::packet::{DecodeError, Header, Opcode, Packet, progress_fence_words};
use abi::port::{
    AllocationDesc, CreateDoorbell, HandleProblem, InUseBy, InUseObject, Invalid, KernelError, KernelPort,
};
use abi::ring::RingSizeError;
use abi::ring::WPTR_OFFSET;
use abi::{EngineId, HwQueueHandle};

use common::RawProc;

/// Asserts the message names `field` and `value`.
#[track_caller]
fn names(e: &KernelError, field: &str, value: &str) {
    let msg = e.to_string();
    assert!(msg.contains(field), "message {msg:?} does not name the field {field:?}");
    assert!(msg.contains(value), "message {msg:?} does not name the value {value:?}");
}

#[track_caller]
fn invalid(e: KernelError, want_field: &str, want_value: &str) -> Invalid {
    match &e {
        KernelError::InvalidArgument { field, value, reason } => {
            assert_eq!(*field, want_field, "{e}");
            assert_eq!(value, want_value, "{e}");
            names(&e, want_field, want_value);
            reason.clone()
        }
        other => panic!("expected InvalidArgument {{ field: {want_field} }}, got {other:?}"),
    }
}

#[track_caller]
fn outside(e: KernelError, want_field: &str, want_va: u64, want_bytes: u64) {
    match &e {
        KernelError::OutsideMappings { field, va, bytes } => {
            assert_eq!((*field, *va, *bytes), (want_field, want_va, want_bytes), "{e}");
            names(&e, want_field, &format!("{want_va:#x}"));
        }
        other => panic!("expected OutsideMappings {{ field: {want_field} }}, got {other:?}"),
    }
}

#[track_caller]
fn bad_handle(e: KernelError, want: HandleProblem, handle: impl Into<AnyHandle>) {
    let handle = handle.into();
    match &e {
        KernelError::BadHandle { handle: h, problem } => {
            assert_eq!(*problem, want, "{e}");
            assert_eq!(*h, handle);
            names(&e, &handle.to_string(), &want.to_string());
        }
        other => panic!("expected BadHandle({want:?}), got {other:?}"),
    }
}

/// After refused calls, the process still creates a queue and runs work.
fn still_works(p: &RawProc, index: u32) {
    let info = p.create(p.desc(index)).expect("a valid queue after the refusals");
    p.port.destroy_hw_queue(info.handle).unwrap();
}

#[test]
fn ring_size_must_be_a_power_of_two_of_at_least_4k() {
    let sys = common::sim();
    let p = RawProc::open(&sys);
    for (bytes, why) in [
        (6144, RingSizeError::NotPowerOfTwo),
        (4095, RingSizeError::NotPowerOfTwo),
        (0, RingSizeError::NotPowerOfTwo),
        (2048, RingSizeError::TooSmall),
        (32 << 20, RingSizeError::TooLarge),
    ] {
        let e = p.create(abi::QueueDescriptor { ring_bytes: bytes, ..p.desc(0) }).unwrap_err();
        let reason = invalid(e, "ring_bytes", &bytes.to_string());
        assert_eq!(reason, Invalid::RingSize(why), "{bytes}: {reason}");
    }
    still_works(&p, 0);
}

#[test]
fn ring_rptr_and_wptr_must_lie_inside_one_mapping() {
    let sys = common::sim();
    let p = RawProc::open(&sys);
    let d = p.desc(0);
    // Unmapped.
    outside(p.create(abi::QueueDescriptor { ring_va: 0x10_0000, ..d }).unwrap_err(), "ring_va", 0x10_0000, 4096);
    // Half inside the ring allocation, half in the guard page after it.
    let half = p.ring.va + 2048;
    outside(p.create(abi::QueueDescriptor { ring_va: half, ..d }).unwrap_err(), "ring_va", half, 4096);
    // Straddling two mappings: the ring allocation and the control allocation after it.
    assert!(p.ctl.va > p.ring.va && p.ctl.va + p.ctl.bytes <= p.ring.va + 16384);
    let e = p.create(abi::QueueDescriptor { ring_bytes: 16384, ..d }).unwrap_err();
    outside(e, "ring_va", p.ring.va, 16384);
    // rptr and wptr outside.
    outside(p.create(abi::QueueDescriptor { rptr_va: 0x2000, ..d }).unwrap_err(), "rptr_va", 0x2000, 8);
    let guard = p.ctl.va + p.ctl.bytes;
    outside(p.create(abi::QueueDescriptor { wptr_va: guard, ..d }).unwrap_err(), "wptr_va", guard, 8);
    let far = u64::MAX - 7;
    outside(p.create(abi::QueueDescriptor { wptr_va: far, ..d }).unwrap_err(), "wptr_va", far, 8);
    still_works(&p, 0);
}

#[test]
fn rptr_and_wptr_must_be_8_byte_aligned() {
    let sys = common::sim();
    let p = RawProc::open(&sys);
    let d = p.desc(0);
    let va = p.ctl.va + 4;
    let r = invalid(p.create(abi::QueueDescriptor { rptr_va: va, ..d }).unwrap_err(), "rptr_va", &format!("{va:#x}"));
    assert_eq!(r, Invalid::Misaligned { align: 8 }, "{r}");
    let va = p.ctl.va + WPTR_OFFSET + 2;
    invalid(p.create(abi::QueueDescriptor { wptr_va: va, ..d }).unwrap_err(), "wptr_va", &format!("{va:#x}"));
    still_works(&p, 0);
}

#[test]
fn doorbell_index_must_be_inside_the_page_and_unused() {
    let sys = common::sim();
    let p = RawProc::open(&sys);
    for index in [512, 513, u32::MAX - 1] {
        let r = invalid(p.create(p.desc(index)).unwrap_err(), "doorbell_index", &index.to_string());
        assert!(matches!(r, Invalid::OutsideDoorbellPage { .. }), "{r}");
    }
    // Engine 0 (compute) owns doorbells 0..256 of the page; 300 belongs to the copy engine.
    let r = invalid(p.create(p.desc(300)).unwrap_err(), "doorbell_index", "300");
    assert_eq!(r, Invalid::OutsideEngineDoorbells { engine: abi::EngineKind::Compute, first: 0, end: 256 }, "{r}");
    let first = p.create(p.desc(255)).unwrap();
    let r = invalid(p.create(p.desc(255)).unwrap_err(), "doorbell_index", "255");
    assert_eq!(r, Invalid::UsedBy(first.handle), "the error names the queue that holds it: {r}");
    // Another process has its own doorbell page: the same index is free there.
    let other = RawProc::open(&sys);
    other.create(other.desc(255)).unwrap();
    // Free again once its queue is gone.
    p.port.destroy_hw_queue(first.handle).unwrap();
    p.create(p.desc(255)).unwrap();
}

#[test]
fn priority_must_be_a_level() {
    let sys = common::sim();
    let p = RawProc::open(&sys);
    let r = invalid(p.create(abi::QueueDescriptor { priority: 5, ..p.desc(0) }).unwrap_err(), "priority", "5");
    assert_eq!(r, Invalid::PriorityRange, "{r}");
}

#[test]
fn engine_must_exist() {
    let sys = common::sim();
    let p = RawProc::open(&sys);
    let n = p.port.adapter_info().engines.len() as u32;
    for id in [n, 7, u32::MAX] {
        let e = p.port.create_context(p.dev, EngineId(id)).unwrap_err();
        invalid(e, "engine", &EngineId(id).to_string());
    }
    assert!(p.port.create_context(p.dev, EngineId(n - 1)).is_ok());
}

#[test]
fn allocation_size_is_checked() {
    let sys = common::sim();
    let p = RawProc::open(&sys);
    invalid(p.port.allocate(p.dev, &AllocationDesc::system(0)).unwrap_err(), "bytes", "0");
    let big = (1 << 30) + 1;
    invalid(p.port.allocate(p.dev, &AllocationDesc::system(big)).unwrap_err(), "bytes", &big.to_string());
}

#[test]
fn create_doorbell_checks_its_allocations_and_queue() {
    let sys = common::sim();
    let p = RawProc::open(&sys);
    let q = p.create(p.desc(0)).unwrap().handle;
    let swapped = CreateDoorbell { queue: q, ring_buffer: p.ctl.handle, ring_control: p.ring.handle };
    let r = invalid(p.port.create_doorbell(&swapped).unwrap_err(), "ring_buffer", &p.ctl.handle.to_string());
    assert_eq!(r, Invalid::DoesNotHold { what: "ring", va: p.ring.va }, "names the ring address: {r}");
    let wrong_ctl = CreateDoorbell { queue: q, ring_buffer: p.ring.handle, ring_control: p.ring.handle };
    let r = invalid(p.port.create_doorbell(&wrong_ctl).unwrap_err(), "ring_control", &p.ring.handle.to_string());
    assert!(matches!(r, Invalid::DoesNotHold { what: "rptr", .. }), "{r}");
    // Nothing was pinned by the refused calls.
    let spare = p.port.allocate(p.dev, &AllocationDesc::system(4096)).unwrap();
    let with_spare = CreateDoorbell { queue: q, ring_buffer: spare.handle, ring_control: p.ctl.handle };
    invalid(p.port.create_doorbell(&with_spare).unwrap_err(), "ring_buffer", &spare.handle.to_string());
    p.port.free(spare.handle).unwrap();

    p.doorbell(q).unwrap();
    let r = invalid(p.doorbell(q).unwrap_err(), "queue", &q.to_string());
    assert_eq!(r, Invalid::HasDoorbell, "{r}");

    let km = p.create_kernel().unwrap().handle;
    let e = p.doorbell(km).unwrap_err();
    assert!(
        matches!(&e, KernelError::WrongQueueMode { actual: "kernel-mode", expected: "user-mode", queue } if *queue == km),
        "{e}"
    );
    names(&e, &km.to_string(), "kernel-mode");
}

#[test]
fn doorbell_index_any_lets_the_kernel_choose_a_free_one() {
    let sys = common::sim();
    let p = RawProc::open(&sys);
    let ring2 = p.port.allocate(p.dev, &abi::port::AllocationDesc::system(4096)).unwrap();
    let ctl2 = p.port.allocate(p.dev, &abi::port::AllocationDesc::system(4096)).unwrap();
    let taken = p.create(p.desc(0)).unwrap().handle;
    let any = abi::QueueDescriptor {
        ring_va: ring2.va,
        rptr_va: ctl2.va,
        wptr_va: ctl2.va + 64,
        last_queued_va: ctl2.va + abi::ring::LAST_QUEUED_OFFSET,
        ..p.desc(abi::queue::DOORBELL_INDEX_ANY)
    };
    let q = p.create(any).unwrap().handle;
    let db = p
        .port
        .create_doorbell(&abi::port::CreateDoorbell { queue: q, ring_buffer: ring2.handle, ring_control: ctl2.handle })
        .unwrap();
    assert_eq!(db.offset, 8, "index 0 is {taken}'s, so the kernel picked 1");
}

#[test]
fn ring_allocations_cannot_be_freed_while_their_queue_or_doorbell_exists() {
    let sys = common::sim();
    let p = RawProc::open(&sys);
    let q = p.create(p.desc(0)).unwrap().handle;
    let db = p.doorbell(q).unwrap();
    p.port.connect_doorbell(q).unwrap();
    for a in [p.ring.handle, p.ctl.handle] {
        let e = p.port.free(a).unwrap_err();
        match &e {
            KernelError::InUse { object, by } => {
                assert_eq!(*object, InUseObject::Handle(a.into()));
                let (InUseBy::Queue(by) | InUseBy::Doorbell { queue: Some(by), .. }) = *by else {
                    panic!("expected the queue or its doorbell, got {e:?}")
                };
                assert_eq!(by, q, "{e}");
            }
            other => panic!("expected InUse, got {other:?}"),
        }
        names(&e, &a.to_string(), &q.to_string());
    }
    // Still mapped and usable: the mapping outlives the refused free.
    assert!(p.port.map_allocation(p.ring.handle).is_ok());
    p.port.destroy_doorbell(db.handle).unwrap();
    // The queue itself still runs from them.
    assert!(matches!(p.port.free(p.ring.handle), Err(KernelError::InUse { by: InUseBy::Queue(by), .. }) if by == q));
    p.port.destroy_hw_queue(q).unwrap();
    p.port.free(p.ring.handle).unwrap();
    p.port.free(p.ctl.handle).unwrap();
    bad_handle(p.port.free(p.ring.handle).unwrap_err(), HandleProblem::Stale, p.ring.handle);
}

#[test]
fn destroyed_and_foreign_handles_are_refused() {
    let sys = common::sim();
    let p1 = RawProc::open(&sys);
    let p2 = RawProc::open(&sys);
    let pid1 = p1.port.process();
    let info = p1.create(p1.desc(0)).unwrap();
    let q = info.handle;
    let db = p1.doorbell(q).unwrap();
    let foreign = HandleProblem::Foreign { owner: pid1 };

    // Another process can name none of p1's objects.
    bad_handle(p2.port.query_queue(q).unwrap_err(), foreign, q);
    bad_handle(p2.port.connect_doorbell(q).unwrap_err(), foreign, q);
    bad_handle(p2.port.submit_command(q, &progress_fence_words(1)).unwrap_err(), foreign, q);
    bad_handle(p2.port.destroy_hw_queue(q).unwrap_err(), foreign, q);
    bad_handle(p2.port.map_allocation(p1.ring.handle).unwrap_err(), foreign, p1.ring.handle);
    bad_handle(p2.port.free(p1.ctl.handle).unwrap_err(), foreign, p1.ctl.handle);
    bad_handle(p2.port.destroy_doorbell(db.handle).unwrap_err(), foreign, db.handle);
    bad_handle(p2.port.create_context(p1.dev, EngineId(0)).unwrap_err(), foreign, p1.dev);
    bad_handle(p2.port.destroy_context(p1.ctx).unwrap_err(), foreign, p1.ctx);
    let e = p2.port.query_queue(q).unwrap_err();
    assert!(e.to_string().contains(&format!("belongs to process {pid1}")), "{e}");
    // p1's queue is untouched.
    p1.port.connect_doorbell(q).unwrap();
    assert!(p1.port.query_queue(q).is_ok());

    // Destroyed: stale, also after the slot is reused.
    p1.port.destroy_hw_queue(q).unwrap();
    bad_handle(p1.port.query_queue(q).unwrap_err(), HandleProblem::Stale, q);
    bad_handle(p1.port.destroy_doorbell(db.handle).unwrap_err(), HandleProblem::Stale, db.handle);
    let q2 = p1.create(p1.desc(0)).unwrap().handle;
    assert_eq!(q2.index(), q.index(), "the slot was reused");
    let e = p1.port.query_queue(q).unwrap_err();
    bad_handle(e.clone(), HandleProblem::Stale, q);
    assert!(e.to_string().contains("was destroyed"), "{e}");
    assert!(p1.port.query_queue(q2).is_ok());
    p1.port.destroy_context(p1.ctx).unwrap();
    bad_handle(
        p1.port
            .create_hw_queue(
                p1.ctx,
                &abi::port::HwQueueDesc {
                    mode: abi::port::SubmissionMode::KernelMode,
                    priority: abi::Priority::Normal,
                },
            )
            .unwrap_err(),
        HandleProblem::Stale,
        p1.ctx,
    );
    bad_handle(p1.port.query_queue(q2).unwrap_err(), HandleProblem::Stale, q2);

    // Never minted.
    let unknown = HwQueueHandle::new(pid1, 99, 1);
    bad_handle(p1.port.query_queue(unknown).unwrap_err(), HandleProblem::Unknown, unknown);

    // A terminated process is refused as a whole.
    let pid2 = p2.port.process();
    p2.port.terminate(kernel::Termination::Normal);
    let e = p2.port.create_device().unwrap_err();
    assert_eq!(e, KernelError::ProcessTerminated(pid2));
    names(&e, &pid2.to_string(), "terminated");
}

#[test]
fn kernel_mode_submissions_are_validated() {
    let sys = common::sim();
    let p = RawProc::open(&sys);
    let km = p.create_kernel().unwrap().handle;
    let submit = |w: &[u32]| p.port.submit_command(km, w);
    let enc = |ps: &[Packet]| {
        let mut w = Vec::new();
        for pk in ps {
            pk.encode(&mut w);
        }
        w
    };

    // Malformed packets, with the dword offset of the bad one.
    let mut w = enc(&[Packet::Nop { dwords: 2 }]);
    w.push(0xffff_ffff);
    let e = submit(&w).unwrap_err();
    assert!(matches!(e, KernelError::BadPacket { offset: 2, error: DecodeError::BadVersion { .. } }), "{e}");
    names(&e, "dword 2", "version 15");
    let mut w = enc(&[Packet::Nop { dwords: 1 }]);
    w.extend_from_slice(&[Header::new(Opcode::WriteData, 6).0, 4, 0]);
    let e = submit(&w).unwrap_err();
    assert_eq!(e, KernelError::BadPacket { offset: 1, error: DecodeError::Truncated { need: 6, have: 3 } });
    let e = submit(&[1 | (0x7f << 16) | (1 << 24)]).unwrap_err();
    assert_eq!(e, KernelError::BadPacket { offset: 0, error: DecodeError::UnknownOpcode { opcode: 0x7f } });
    names(&e, "dword 0", "unknown opcode 127");

    // Addresses outside the process's mappings.
    let (ok_va, bad) = (p.ring.va, 0x20_0000u64);
    let cases: [(Packet, &str, u64, u64); 7] = [
        (Packet::WriteData { width: abi::packet::DataWidth::U32, va: bad, value: 1 }, "WRITE_DATA.va", bad, 4),
        (Packet::Copy { src: bad, dst: ok_va, bytes: 16 }, "COPY.src", bad, 16),
        (Packet::Copy { src: ok_va, dst: ok_va + 4090, bytes: 16 }, "COPY.dst", ok_va + 4090, 16),
        (Packet::Fill { dst: bad, bytes: 3, pattern: 0 }, "FILL.dst", bad, 3),
        (Packet::Timestamp { va: bad }, "TIMESTAMP.va", bad, 8),
        (Packet::Signal { va: bad, value: 1 }, "SIGNAL.va", bad, 8),
        (Packet::IndirectBuffer { va: ok_va, dwords: 2000, vmid: 0 }, "INDIRECT_BUFFER.va", ok_va, 8000),
    ];
    for (pk, field, va, bytes) in cases {
        outside(submit(&enc(&[Packet::Nop { dwords: 1 }, pk])).unwrap_err(), field, va, bytes);
    }
    outside(submit(&enc(&[Packet::Wait { va: bad, value: 1 }])).unwrap_err(), "WAIT.va", bad, 8);
    let e = submit(&enc(&[Packet::IndirectBuffer { va: ok_va, dwords: 1, vmid: 3 }])).unwrap_err();
    invalid(e, "INDIRECT_BUFFER.vmid", "3");

    // Progress values must increase, within a submission and across submissions.
    submit(&progress_fence_words(5)).unwrap();
    let e = submit(&progress_fence_words(5)).unwrap_err();
    assert_eq!(e, KernelError::NotIncreasing { field: "PROGRESS_FENCE.value", value: 5, last: 5 });
    names(&e, "PROGRESS_FENCE.value", "5");
    let e = submit(&enc(&[Packet::ProgressFence { value: 7 }, Packet::ProgressFence { value: 6 }])).unwrap_err();
    assert_eq!(e, KernelError::NotIncreasing { field: "PROGRESS_FENCE.value", value: 6, last: 7 });

    // Length.
    invalid(submit(&[]).unwrap_err(), "words", "0");
    let huge = vec![Header::new(Opcode::Nop, 1).0; 9000];
    invalid(submit(&huge).unwrap_err(), "words", "9000");

    // None of it was queued or changed the queue: a valid submission continues from 5.
    assert_eq!(sys.stats().km_submissions, 1);
    let st = p.port.query_queue(km).unwrap();
    assert_eq!(st.last_queued, 5);
    submit(&progress_fence_words(6)).unwrap();
    sys.settle();
    assert_eq!(p.port.query_queue(km).unwrap().completed, 6);
}

#[test]
fn calls_for_the_other_submission_model_are_refused() {
    let sys = common::sim();
    let p = RawProc::open(&sys);
    let km = p.create_kernel().unwrap().handle;
    let e = p.port.connect_doorbell(km).unwrap_err();
    assert_eq!(e, KernelError::WrongQueueMode { queue: km, actual: "kernel-mode", expected: "user-mode" });
    names(&e, &km.to_string(), "kernel-mode queue");
    let um = p.create(p.desc(0)).unwrap().handle;
    let e = p.port.submit_command(um, &progress_fence_words(1)).unwrap_err();
    assert_eq!(e, KernelError::WrongQueueMode { queue: um, actual: "user-mode", expected: "kernel-mode" });
    names(&e, &um.to_string(), "needs a kernel-mode queue");
    // A user-mode queue without a doorbell cannot connect.
    let r = invalid(p.port.connect_doorbell(um).unwrap_err(), "queue", &um.to_string());
    assert_eq!(r, Invalid::NoDoorbell, "{r}");
}

#[test]
fn user_queue_modes_refuse_the_missing_model_and_info_reports_it() {
    use abi::port::UserQueueMode;
    for mode in [UserQueueMode::KernelOnly, UserQueueMode::Both, UserQueueMode::UserOnly] {
        let sys = common::sim_with(kernel::SystemConfig { user_queue_mode: mode, ..kernel::SystemConfig::default() });
        let p = RawProc::open(&sys);
        let info = p.port.adapter_info();
        assert_eq!(info.user_queue_mode, mode);
        assert!(info.engines.iter().all(|e| e.user_queues == (mode != UserQueueMode::KernelOnly)));
        assert!(info.engines.iter().all(|e| e.kernel_queues == (mode != UserQueueMode::UserOnly)));
        let user = p.create(p.desc(0));
        let kernel = p.create_kernel();
        match mode {
            UserQueueMode::KernelOnly => {
                let r = invalid(user.unwrap_err(), "engine", "engine0");
                assert_eq!(r, Invalid::Unsupported("user-mode queues"), "{r}");
                kernel.unwrap();
            }
            UserQueueMode::Both => {
                user.unwrap();
                kernel.unwrap();
            }
            UserQueueMode::UserOnly => {
                user.unwrap();
                let r = invalid(kernel.unwrap_err(), "engine", "engine0");
                assert_eq!(r, Invalid::Unsupported("kernel-mode queues"), "{r}");
            }
        }
    }
}

#[test]
fn info_reports_doorbell_ranges_and_queue_metadata_sizes() {
    let sys = common::sim();
    let info = RawProc::open(&sys).port.adapter_info();
    let ranges: Vec<(u32, u32)> = info.engines.iter().map(|e| (e.doorbell_first, e.doorbell_count)).collect();
    assert_eq!(ranges, [(0, 256), (256, 256)], "each engine owns a slice of every doorbell page");
    assert_eq!(info.queue_metadata.context_save_bytes, gpu::compute::CONTEXT_SAVE_BYTES);
    assert_eq!(info.queue_metadata.fence_log_bytes, 4096);
    assert_eq!(info.queue_metadata.kernel_page_bytes, 4096);
}
