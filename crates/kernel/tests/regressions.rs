//! Regressions for bugs a review found: each test failed before its fix.

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use abi::port::{CreateDoorbell, DeviceRefusal, Invalid, KernelError, KernelPort};
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
        matches!(&e, KernelError::InvalidArgument { field: "rptr_va", reason, .. } if *reason == abi::port::Invalid::GpuReadOnly),
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
    assert!(
        matches!(
            &e,
            KernelError::InvalidArgument {
                reason: Invalid::Device(DeviceRefusal::BadStartPointer { wptr: 0xFFFF_FFFF_FFFF_FFF0 }),
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("wptr word holds 0xfffffffffffffff0"), "{e}");
    ctl.atomic_u64(abi::ring::WPTR_OFFSET).unwrap().store(6, Ordering::Release);
    assert!(p.create(p.desc(0)).is_err(), "not a dword count");
    ctl.atomic_u64(abi::ring::WPTR_OFFSET).unwrap().store(0, Ordering::Release);
    p.create(p.desc(0)).unwrap();
}

/// A recycled doorbell must not carry its previous owner's value: the new owner's first
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

    let ev: Vec<Event> = common::events_from(&sys, 0);
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

mod review2 {
    //! Regressions from the second review (compute, fences, fence logs).

    use super::common;
    use abi::packet::{LoggedOp, Packet};
    use abi::port::NativeFenceType;
    use std::time::Duration;
    use umd::CommandBuffer;

    const T: Option<Duration> = Some(Duration::from_millis(50));

    /// With the optimized interrupt every fence signal of a user-mode queue names the queue,
    /// so a signal the client did not log leaves nothing new in the log: the optimized
    /// interrupt must not miss the waiter — a log that shows no new signal means "scan
    /// everything". (Once the log was made to skip an entry; now the engine places every
    /// position, and a client naming the same position twice only faults its own queue.)
    #[test]
    fn a_log_that_does_not_advance_falls_back_to_a_scan() {
        let sys = common::optimized();
        let c = common::client(&sys);
        let f = c.device.create_fence(0, NativeFenceType::Default).unwrap();
        let mut q = c.user_queue();
        let mut cb = CommandBuffer::new();
        // Raw: the UMD would log it on this device (it asks the caps).
        cb.wait(c.buf.va(), 1).packet(Packet::SignalFence { va: f.va(), value: 1 });
        q.submit(&cb).unwrap();
        c.buf.write_u64(0, 1).unwrap();
        f.wait(1, T).unwrap();
        assert_eq!(sys.stats().fence_log_fallbacks, 1);
        // The log shows a new signal, but not the one that raised the interrupt (g has no
        // waiter; f's signal is not logged): still a scan, and f's waiter is woken.
        let g = c.device.create_fence(0, NativeFenceType::Default).unwrap();
        let mut cb = CommandBuffer::new();
        cb.wait(c.buf.va(), 2).packet(Packet::SignalFence { va: f.va(), value: 2 }).signal_fence_logged(&g, 1);
        q.submit(&cb).unwrap();
        let pid = c.port.process();
        let w = sys.begin_fence_wait(pid, &[(f.handle(), 2)], abi::port::WaitMode::All).unwrap().expect("blocked");
        c.buf.write_u64(0, 2).unwrap();
        f.wait(2, T).unwrap();
        g.wait(1, T).unwrap();
        assert!(w.is_done(), "the waiter is not missed");
        assert_eq!(sys.stats().fence_log_fallbacks, 2);
        sys.end_fence_wait(pid, &w).unwrap();
        // The same log position twice: the second is refused, and only this queue faults.
        for v in 3..=4 {
            let mut cb = CommandBuffer::new();
            cb.packet(Packet::Logged { op: LoggedOp::SignalFence, va: f.va(), value: v, position: 5 });
            let _ = q.submit(&cb);
        }
        assert!(f.wait(4, T).is_err());
        assert_eq!(f.value().unwrap(), 3);
        let fault = q.status().unwrap().fault.expect("faulted");
        assert!(fault.to_string().contains("log entry"), "{fault}");
        // Typed, naming the position, the log's next one and its size.
        let want = abi::queue::FaultKind::BadLogPosition { position: 5, next: 6, entries: 84 };
        assert_eq!(fault.kind, want, "{fault}");
        let mut other = c.user_queue();
        let mut cb = CommandBuffer::new();
        cb.signal_fence(&f, 4);
        let v = other.submit(&cb).unwrap();
        other.wait(v, T).unwrap();
        assert_eq!(f.value().unwrap(), 4, "the other queue runs");
    }

    /// A kernel-mode submission that signals a fence and then waits for it must not wait for
    /// itself.
    #[test]
    fn a_kernel_mode_submission_may_wait_for_its_own_signal() {
        let sys = common::sim();
        let c = common::client(&sys);
        let f = c.device.create_fence(0, NativeFenceType::Default).unwrap();
        let mut kq = c.kernel_queue();
        let mut cb = CommandBuffer::new();
        cb.signal_fence(&f, 1).wait_fence(&f, 1).write_u32(c.buf.va(), 9);
        let v = kq.submit(&cb).unwrap();
        kq.wait(v, T).unwrap();
        assert_eq!(c.buf.read_u32(0).unwrap(), 9);
    }

    /// A plain SIGNAL (no fence flag) that lands on a native fence still interrupts for a waiter.
    #[test]
    fn a_plain_signal_on_a_fence_still_wakes_its_cpu_waiter() {
        let sys = common::sim();
        let c = common::client(&sys);
        let f = c.device.create_fence(0, NativeFenceType::Default).unwrap();
        let mut q = c.user_queue();
        let mut cb = CommandBuffer::new();
        cb.wait(c.buf.va(), 1).signal(f.va(), 1);
        q.submit(&cb).unwrap();
        c.buf.write_u64(0, 1).unwrap();
        f.wait(1, T).unwrap();
        assert_eq!(sys.stats().fence_interrupts, 1);
    }

    /// Address arithmetic near the top of the address space and absurd grids are faults or
    /// typed errors, never debug-build overflow panics.
    #[test]
    fn overflowing_addresses_and_grids_fault_instead_of_panicking() {
        use abi::isa::{FLAG_IMM, Inst, Op, ProgramHeader};
        let sys = common::sim();
        let c = common::client(&sys);
        let p = [
            Inst::new(Op::SArg, 0, 0, 0, 0, 0), // fills the translation cache
            Inst::new(Op::SAdd, 1, 1, 0, 0, (-4i32) as u32),
            Inst::new(Op::Mov, 0, 0, 0, FLAG_IMM, 0),
            Inst::new(Op::Ld32, 1, 1, 0, 0, 0),
        ];
        let mut bytes: Vec<u8> =
            ProgramHeader::new(p.len() as u32).to_words().iter().flat_map(|w| w.to_le_bytes()).collect();
        bytes.extend(p.iter().flat_map(|i| i.encode().to_le_bytes()));
        let kernel = c.device.upload(&bytes).unwrap();
        let args = c.device.upload(&c.buf.va().to_le_bytes()).unwrap();
        let mut q = c.user_queue();
        let mut cb = CommandBuffer::new();
        cb.dispatch(kernel.va(), [1, 1, 1], [1, 1, 1], args.va());
        let v = q.submit(&cb).unwrap();
        assert!(q.wait(v, T).is_err());
        assert!(matches!(q.status().unwrap().fault.unwrap().kind, abi::queue::FaultKind::ProgramAccess { pc: 3, .. }));
        let mut q = c.user_queue();
        let mut cb = CommandBuffer::new();
        cb.dispatch(kernel.va(), [u32::MAX; 3], [1, 1, 1], args.va());
        let v = q.submit(&cb).unwrap();
        assert!(q.wait(v, T).is_err());
        assert!(matches!(q.status().unwrap().fault.unwrap().kind, abi::queue::FaultKind::BadDispatch { .. }));
        let e = c.kernel_queue().submit(&cb).unwrap_err();
        assert!(e.to_string().contains("2^40"), "{e}");
    }

    /// A refused submission does not consume fence-log entries.
    #[test]
    fn a_refused_submission_leaves_no_hole_in_the_log() {
        let sys = common::sim();
        let c = common::client(&sys);
        let f = c.device.create_fence(0, NativeFenceType::Default).unwrap();
        let mut q =
            c.ctx.create_queue(umd::QueueOptions { ring_bytes: 4096, ..umd::QueueOptions::user_mode() }).unwrap();
        let mut big = CommandBuffer::new();
        big.signal_fence_logged(&f, 1).nop(1000);
        assert!(q.submit(&big).is_err(), "too large for a 4 KiB ring");
        let mut cb = CommandBuffer::new();
        cb.signal_fence_logged(&f, 1);
        let v = q.submit(&cb).unwrap();
        q.wait(v, T).unwrap();
        let r = sys.read_fence_log(c.port.process(), q.handle(), abi::fence_log::FenceLogType::Signal, 0).unwrap();
        assert_eq!((r.total, r.entries.len()), (1, 1));
    }
}
