//! The kernel's error paths: a DDI that fails part-way through a kernel call leaves nothing
//! behind — no GPU mapping, no pool entry, no orphan queue — and a failure the kernel cannot
//! hand back to a caller faults the queue with a typed record instead of losing work in
//! silence.
//!
//! Failures are injected with [`kernel::ddi::DdiFault`] through the tracing decorator, and
//! leaks are measured with [`kernel::System::census`].

mod common;

use abi::QueueState;
use abi::port::{DeviceRefusal, Invalid, KernelError, KernelPort, NativeFenceDesc, NativeFenceType, QueueStatus};
use abi::queue::FaultKind;
use common::{RawProc, T, sim};
use kernel::ddi::{DdiFault, DdiKind};
use kernel::trace::{Ddi, Event};

fn injected(e: &KernelError, ddi: DdiKind) -> bool {
    matches!(
        e,
        KernelError::InvalidArgument {
            field: "device",
            value,
            reason: Invalid::Device(DeviceRefusal::Injected { call: 1 }),
        } if *value == format!("{ddi:?}")
    )
}

/// Review finding: "if a later mapping fails, the earlier mappings leak". A kernel-mode
/// queue maps its ring, its ring control and its kernel page; fail each in turn.
#[test]
fn a_mapping_that_fails_part_way_through_a_queue_creation_returns_the_earlier_ones() {
    let sys = sim();
    let p = RawProc::open(&sys);
    let before = sys.census();
    assert!(before.gpu_mappings > 0, "the process's allocations are mapped: {before:?}");
    for nth in 1..=3 {
        sys.inject_ddi_fault(DdiFault { ddi: DdiKind::MapGpu, call: nth });
        let e = p.create_kernel().unwrap_err();
        assert!(matches!(e, KernelError::InvalidArgument { field: "device", .. }), "mapping {nth}: {e}");
        assert_eq!(sys.census(), before, "mapping {nth} failed: nothing may stay behind");
    }
    // And the pools still work: the queue is created once nothing fails.
    let q = p.create_kernel().expect("a kernel queue");
    assert_eq!(sys.census().queues, before.queues + 1);
    assert_eq!(sys.census().kernel_doorbells, before.kernel_doorbells + 1);
    p.port.destroy_hw_queue(q.handle).unwrap();
    assert_eq!(sys.census(), before);
}

/// Review finding: "a `?` after the queue is already in the table, the firmware and the index
/// leaves an orphan whose handle the caller never gets". The kernel doorbell's connect is
/// that last step.
#[test]
fn a_failed_kernel_doorbell_connect_destroys_the_queue_it_was_creating() {
    let sys = sim();
    let p = RawProc::open(&sys);
    let before = sys.census();
    let mark = sys.trace().0.len();
    sys.inject_ddi_fault(DdiFault { ddi: DdiKind::ConnectKernelDoorbell, call: 1 });
    let e = p.create_kernel().unwrap_err();
    assert!(injected(&e, DdiKind::ConnectKernelDoorbell), "{e}");
    assert_eq!(sys.census(), before, "no orphan queue, mapping or kernel doorbell");
    // The device had the queue: it was told to destroy it, in order.
    let ddis = common::ddis_from(&sys, mark);
    let created = ddis.iter().position(|d| matches!(d, Ddi::CreateHwQueue(_))).expect("created");
    let connect = ddis.iter().position(|d| matches!(d, Ddi::ConnectDoorbell(_))).expect("connect tried");
    let destroyed = ddis.iter().position(|d| matches!(d, Ddi::DestroyHwQueue(_))).expect("destroyed");
    assert!(created < connect && connect < destroyed, "{ddis:?}");
}

/// The device refusing a queue leaves no table entry and returns everything taken for it.
#[test]
fn a_refused_queue_creation_leaves_nothing_behind() {
    let sys = sim();
    let p = RawProc::open(&sys);
    let before = sys.census();
    for create in [RawProc::create_kernel as fn(&RawProc) -> _, |p: &RawProc| p.create(p.desc(0))] {
        sys.inject_ddi_fault(DdiFault { ddi: DdiKind::CreateHwQueue, call: 1 });
        let e = create(&p).unwrap_err();
        assert!(injected(&e, DdiKind::CreateHwQueue), "{e}");
        assert_eq!(sys.census(), before);
    }
}

/// A native fence the device refuses gives its packed slot back (the next fence reuses it)
/// and leaves no object.
#[test]
fn a_refused_native_fence_returns_its_slot() {
    let sys = sim();
    let p = RawProc::open(&sys);
    let desc = NativeFenceDesc { kind: NativeFenceType::Default, initial: 0, shareable: false, cross_adapter: false };
    let first = p.port.create_native_fence(p.dev, &desc).unwrap();
    let before = sys.census();
    sys.inject_ddi_fault(DdiFault { ddi: DdiKind::CreateNativeFence, call: 1 });
    let e = p.port.create_native_fence(p.dev, &desc).unwrap_err();
    assert!(injected(&e, DdiKind::CreateNativeFence), "{e}");
    assert_eq!(sys.census(), before);
    let second = p.port.create_native_fence(p.dev, &desc).unwrap();
    assert_eq!(second.va, first.va + kernel::os::FENCE_STRIDE, "the refused fence's slot was reused");
}

/// Review finding: "a failed ring write is ignored, then wptr is published and the doorbell
/// rung anyway". The kernel's ring write is now infallible by construction (a typed view over
/// a ring it sized itself); what can still fail is ringing the doorbell. The kernel cannot
/// hand that back to the submitter (the scheduler runs later), so the queue faults with a
/// typed record, its waiter learns why, and nothing else is affected.
#[test]
fn a_doorbell_ring_that_fails_faults_the_queue_with_a_record() {
    let sys = sim();
    let p = RawProc::open(&sys);
    let (km, other) = (p.create_kernel().unwrap().handle, p.create_kernel().unwrap().handle);
    sys.inject_ddi_fault(DdiFault { ddi: DdiKind::SubmitCommand, call: 1 });
    p.port.submit_command(km, &abi::packet::progress_fence_words(1)).unwrap();
    let e = p.port.wait_progress(km, 1, T).unwrap_err();
    assert!(matches!(&e, KernelError::QueueLost { .. }), "{e}");
    let QueueStatus { state, fault, .. } = p.port.query_queue(km).unwrap();
    assert_eq!(state, QueueState::Hung);
    let fault = fault.expect("a fault record");
    assert!(matches!(fault.kind, FaultKind::BadField { field: "kernel doorbell", .. }), "{fault}");
    assert!(sys.trace().0.iter().any(|t| matches!(&t.event, Event::QueueFault { queue, .. } if *queue == km)));
    // The other queue of the same context is untouched.
    p.port.submit_command(other, &abi::packet::progress_fence_words(1)).unwrap();
    assert_eq!(p.port.wait_progress(other, 1, T).unwrap(), abi::port::WaitOutcome::Reached(1));
}

/// A process's end returns every pool entry and mapping it took, whatever it held.
#[test]
fn a_process_end_returns_everything_it_took() {
    let sys = sim();
    let empty = sys.census();
    let c = common::client(&sys);
    let _u = c.user_queue();
    let _k = c.kernel_queue();
    let held = sys.census();
    assert!(held.gpu_mappings > 0 && held.doorbell_pages > 0 && held.kernel_doorbells == 1, "{held:?}");
    drop((_u, _k, c));
    assert_eq!(sys.census(), empty);
}
