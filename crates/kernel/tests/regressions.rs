//! Regressions for bugs a review found: each test failed before its fix.

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use abi::port::{CreateDoorbell, KernelError, KernelPort};
use kernel::trace::{Ddi, Event};
use umd::{CommandBuffer, Device};

/// A queue's rptr aimed at another queue's protected progress page would let the firmware
/// forge that queue's completed value. rptr must be client-writable memory.
#[test]
fn rptr_cannot_point_at_a_protected_page() {
    let sys = common::sim();
    let p = common::RawProc::open(&sys);
    let victim = p.create(p.desc(0)).unwrap();
    let d = abi::QueueDescriptor { rptr_va: victim.kernel_page_va, ..p.desc(1) };
    let e = p.create(d).unwrap_err();
    assert!(
        matches!(&e, KernelError::InvalidArgument { field: "rptr_va", reason, .. } if reason.contains("may not write")),
        "{e}"
    );
}

/// A wptr word holding a value near `u64::MAX` at creation would overflow the firmware's
/// pointer arithmetic. It is refused.
#[test]
fn an_impossible_starting_wptr_is_refused() {
    let sys = common::sim();
    let p = common::RawProc::open(&sys);
    let ctl = p.port.map_allocation(p.ctl.handle).unwrap();
    ctl.atomic_u64(abi::ring::WPTR_OFFSET).unwrap().store(0xFFFF_FFFF_FFFF_FFF0, Ordering::Release);
    let e = p.create(p.desc(0)).unwrap_err();
    assert!(e.to_string().contains("wptr word holds 0xfffffffffffffff0"), "{e}");
    ctl.atomic_u64(abi::ring::WPTR_OFFSET).unwrap().store(6, Ordering::Release);
    assert!(p.create(p.desc(0)).is_err(), "not a dword count");
    ctl.atomic_u64(abi::ring::WPTR_OFFSET).unwrap().store(0, Ordering::Release);
    p.create(p.desc(0)).unwrap();
}

/// A recycled doorbell slot must not carry its previous owner's value: the new owner's first
/// ring may write exactly that value.
#[test]
fn a_recycled_doorbell_slot_never_hides_a_ring() {
    let sys = common::sim();
    let c = common::client(&sys);
    let mut cb = CommandBuffer::new();
    cb.nop(1);
    let mut first = c.kernel_queue();
    let v = first.submit(&cb).unwrap();
    first.wait(v, common::T).unwrap();
    drop(first);
    // Same slot, same first wptr (one NOP + fence), and no virtual time passes.
    let mut second = c.kernel_queue();
    second.submit(&cb).unwrap();
    sys.settle();
    assert_eq!(second.completed(), 1, "completed without waiting for the idle timer");
}

/// Doorbell indices are unique per process, not per device: two devices on one port each get
/// their own.
#[test]
fn two_devices_on_one_process_both_get_doorbells() {
    let sys = common::sim();
    let port: Arc<dyn KernelPort> = sys.open_process().unwrap();
    let mut results = Vec::new();
    let devs: Vec<Device> = (0..2).map(|_| Device::open(port.clone()).unwrap()).collect();
    for d in &devs {
        let ctx = d.create_context(d.engine(abi::EngineKind::Compute).unwrap()).unwrap();
        let buf = d.allocate(4096).unwrap();
        let mut q = ctx.create_queue(umd::QueueOptions::user_mode()).unwrap();
        let mut cb = CommandBuffer::new();
        cb.write_u32(buf.va(), 5);
        let v = q.submit(&cb).unwrap();
        q.wait(v, common::T).unwrap();
        results.push(buf.read_u32(0).unwrap());
        std::mem::forget((q, ctx, buf)); // keep the doorbell taken while the next device asks
    }
    assert_eq!(results, [5, 5]);
}

/// When work arrives after the firmware asked for F1 but before the kernel's F1 call, F1 is
/// refused; the doorbells the kernel disconnected on the way are connected again.
#[test]
fn a_refused_f1_reconnects_the_doorbells() {
    let sys = common::sim();
    let p = common::RawProc::open(&sys);
    let q = p.create(p.desc(0)).unwrap();
    let db = p
        .port
        .create_doorbell(&CreateDoorbell { queue: q.handle, ring_buffer: p.ring.handle, ring_control: p.ctl.handle })
        .unwrap();
    p.port.connect_doorbell(q.handle).unwrap();
    // Publish a NOP with wptr but do not ring: the queue has work the engine has not seen.
    let ring = p.port.map_allocation(p.ring.handle).unwrap();
    ring.write_u32(0, abi::packet::Header::new(abi::packet::Opcode::Nop, 1).0).unwrap();
    let ctl = p.port.map_allocation(p.ctl.handle).unwrap();
    ctl.atomic_u64(abi::ring::WPTR_OFFSET).unwrap().store(4, Ordering::Release);
    // The idle timer fires (the engine never saw the work), the kernel disconnects, and the
    // firmware refuses F1 because wptr != rptr.
    sys.with_gpu(|g| g.handle_timeout(gpu::Time(u64::MAX / 2)));
    sys.step(); // the pump delivers the interrupt to the kernel

    let ev: Vec<Event> = sys.trace().0.into_iter().map(|e| e.event).collect();
    let refused = ev.iter().position(|e| matches!(e, Event::F1Refused { .. })).expect("F1 refused");
    assert!(
        ev[refused..].contains(&Event::Ddi(Ddi::ConnectDoorbell(q.handle))),
        "reconnected after the refusal: {:?}",
        &ev[refused..]
    );
    let status = q.kernel_page.load_u64(abi::queue::DOORBELL_STATUS_OFFSET, Ordering::SeqCst).unwrap();
    assert_eq!(status, abi::DoorbellStatus::Connected as u64);
    let _ = db;
}
