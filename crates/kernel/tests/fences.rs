//! Native fences on the deterministic driver: CPU and GPU signals and waits, the conditional
//! interrupt, MonitoredValue programming, IntraGpu and legacy fences, the CPU-mediated
//! kernel-mode wait, and bad input.

mod common;

use std::time::Duration;

use abi::port::{KernelError, NativeFenceType, WaitMode};
use abi::queue::FaultKind;
use kernel::trace::{Ddi, Event};
use umd::{CommandBuffer, UmdError};

const T: Option<Duration> = Some(Duration::from_millis(50));

#[test]
fn cpu_signal_and_read_and_backwards_refused() {
    let sys = common::sim();
    let c = common::client(&sys);
    let f = c.device.create_fence(5, NativeFenceType::Default).unwrap();
    assert_eq!(f.value().unwrap(), 5);
    f.signal(9).unwrap();
    assert_eq!(f.value().unwrap(), 9);
    let e = f.signal(3).unwrap_err();
    assert!(e.to_string().contains("`value` = 3 does not move forward from 9"), "{e}");
    assert_eq!(f.value().unwrap(), 9, "the refused signal changed nothing");
    f.wait(9, T).unwrap();
    assert!(matches!(f.wait(10, T), Err(UmdError::FenceTimeout { fences: 1 })));
}

#[test]
fn a_gpu_signal_interrupts_only_when_a_cpu_waits() {
    let sys = common::sim();
    let c = common::client(&sys);
    let f = c.device.create_fence(0, NativeFenceType::Default).unwrap();
    let mut q = c.user_queue();
    // No waiter: MonitoredValue is u64::MAX, the signal raises no interrupt.
    let mut cb = CommandBuffer::new();
    cb.signal_fence(&f, 1);
    let v = q.submit(&cb).unwrap();
    q.wait(v, T).unwrap();
    assert_eq!(f.value().unwrap(), 1);
    assert_eq!(sys.stats().fence_interrupts, 0);
    // A waiter for 3 sets MonitoredValue to 2; a signal of 2 does not interrupt, 3 does.
    let mut cb = CommandBuffer::new();
    cb.wait(c.buf.va(), 1).signal_fence(&f, 2).signal_fence(&f, 3);
    q.submit(&cb).unwrap();
    // The queue is held by the WAIT until the CPU writes the flag; the fence wait below
    // registers first, then the flag releases the queue from inside the wait (sim steps).
    c.buf.write_u64(0, 1).unwrap();
    f.wait(3, T).unwrap();
    assert_eq!(sys.stats().fence_interrupts, 1, "only the signal above MonitoredValue interrupted");
    let ev: Vec<Event> = common::events_from(&sys, 0);
    assert!(
        ev.contains(&Event::Ddi(Ddi::UpdateMonitoredValues(f.handle(), 2))),
        "MonitoredValue = lowest waited value - 1"
    );
    assert_eq!(
        ev.iter().rev().find_map(|e| match e {
            Event::Ddi(Ddi::UpdateMonitoredValues(h, m)) if *h == f.handle() => Some(*m),
            _ => None,
        }),
        Some(u64::MAX),
        "no waiter left: u64::MAX"
    );
}

#[test]
fn a_gpu_wait_on_a_fence_is_released_by_another_engine_without_the_cpu() {
    let sys = common::sim();
    let c = common::client(&sys);
    let f = c.device.create_fence(0, NativeFenceType::Default).unwrap();
    let copy = c.device.create_context(c.device.engine(abi::EngineKind::Copy).unwrap()).unwrap();
    let mut waiter = c.user_queue();
    let mut signaller = copy.create_queue(umd::QueueOptions::user_mode()).unwrap();
    let mut cb = CommandBuffer::new();
    cb.wait_fence(&f, 7).write_u32(c.buf.va(), 0xaa);
    let wv = waiter.submit(&cb).unwrap();
    sys.settle();
    assert_eq!(c.buf.read_u32(0).unwrap(), 0, "blocked on the fence");
    let mut cb = CommandBuffer::new();
    cb.signal_fence(&f, 7);
    let sv = signaller.submit(&cb).unwrap();
    signaller.wait(sv, T).unwrap();
    waiter.wait(wv, T).unwrap();
    assert_eq!(c.buf.read_u32(0).unwrap(), 0xaa);
    assert_eq!(sys.stats().fence_interrupts, 0, "no CPU waiter, no interrupt");
}

#[test]
fn a_kernel_mode_wait_is_resolved_by_the_scheduler() {
    let sys = common::sim();
    let c = common::client(&sys);
    let f = c.device.create_fence(0, NativeFenceType::Default).unwrap();
    let mut kq = c.kernel_queue();
    let mut cb = CommandBuffer::new();
    cb.wait_fence(&f, 2).write_u32(c.buf.va(), 0xbb);
    let v = kq.submit(&cb).unwrap();
    sys.settle();
    assert_eq!(kq.completed(), 0);
    let st = kq.status().unwrap();
    assert_eq!(st.last_queued, v, "held back in the software queue, not on the ring");
    f.signal(2).unwrap();
    kq.wait(v, T).unwrap();
    assert_eq!(c.buf.read_u32(0).unwrap(), 0xbb);
    // A GPU signal releases it too, through the fence interrupt the scheduler's registration asks for.
    let mut uq = c.user_queue();
    let mut cb = CommandBuffer::new();
    cb.wait_fence(&f, 3).write_u32(c.buf.va() + 4, 0xcc);
    let v = kq.submit(&cb).unwrap();
    sys.settle();
    let before = sys.stats().fence_interrupts;
    let mut cb = CommandBuffer::new();
    cb.signal_fence(&f, 3);
    let uv = uq.submit(&cb).unwrap();
    uq.wait(uv, T).unwrap();
    kq.wait(v, T).unwrap();
    assert_eq!(c.buf.read_u32(4).unwrap(), 0xcc);
    assert!(sys.stats().fence_interrupts > before, "the legacy path needs the interrupt");
}

/// The context's kernel-mode queues are streams of their own: one whose oldest submission is
/// held back by a `WAIT` on a fence holds back only itself. A second kernel-mode queue of the
/// same context runs its work meanwhile, twice, and the waiting queue's submissions then run
/// in their order once the fence passes. (Found by the swarm, seed 1606: a queue waiting on a
/// hung upstream held its context's four other queues back for good.)
#[test]
fn a_kernel_mode_wait_holds_back_only_its_own_queue() {
    let sys = common::sim();
    let c = common::client(&sys);
    let f = c.device.create_fence(0, NativeFenceType::Default).unwrap();
    let mut held = c.kernel_queue();
    let mut other = c.kernel_queue();
    let mut cb = CommandBuffer::new();
    cb.wait_fence(&f, 1).write_u32(c.buf.va(), 0xa1);
    held.submit(&cb).unwrap();
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va(), 0xa2);
    let hv = held.submit(&cb).unwrap();
    for (i, word) in [(1u64, 0xb1u32), (2, 0xb2)] {
        let mut cb = CommandBuffer::new();
        cb.write_u32(c.buf.va() + 4 * i, word);
        let v = other.submit(&cb).unwrap();
        other.wait(v, T).expect("the other queue of the context is not held back");
        assert_eq!(c.buf.read_u32(4 * i).unwrap(), word);
    }
    assert_eq!(held.completed(), 0, "still held back by its fence");
    assert_eq!(c.buf.read_u32(0).unwrap(), 0);
    f.signal(1).unwrap();
    held.wait(hv, T).unwrap();
    assert_eq!(c.buf.read_u32(0).unwrap(), 0xa2, "the held queue's submissions ran in order");
}

#[test]
fn waits_on_many_fences_all_or_any() {
    let sys = common::sim();
    let c = common::client(&sys);
    let a = c.device.create_fence(0, NativeFenceType::Default).unwrap();
    let b = c.device.create_fence(0, NativeFenceType::Default).unwrap();
    b.signal(4).unwrap();
    assert_eq!(c.device.wait_fences(&[(&a, 1), (&b, 4)], WaitMode::Any, T).unwrap(), 1);
    assert!(c.device.wait_fences(&[(&a, 1), (&b, 4)], WaitMode::All, T).is_err());
    // The GPU signals `a` while the CPU waits for both.
    let mut q = c.user_queue();
    let mut cb = CommandBuffer::new();
    cb.wait(c.buf.va(), 1).signal_fence(&a, 1);
    q.submit(&cb).unwrap();
    c.buf.write_u64(0, 1).unwrap();
    assert_eq!(c.device.wait_fences(&[(&a, 1), (&b, 4)], WaitMode::All, T).unwrap(), 0);
}

#[test]
fn intra_gpu_fences_have_no_cpu_access_but_work_on_the_gpu() {
    let sys = common::sim();
    let c = common::client(&sys);
    let f = c.device.create_fence(0, NativeFenceType::IntraGpu).unwrap();
    assert!(matches!(f.value(), Err(UmdError::NoCpuAccess { .. })));
    let e = c.port.wait_native_fences(&[(f.handle(), 1)], WaitMode::All, T).unwrap_err();
    assert!(
        matches!(&e, KernelError::InvalidArgument { field: "fences", reason, .. } if *reason == abi::port::Invalid::NoCpuAccess),
        "{e}"
    );
    let mut q = c.user_queue();
    let mut cb = CommandBuffer::new();
    cb.signal_fence(&f, 1).wait_fence(&f, 1).write_u32(c.buf.va(), 1);
    let v = q.submit(&cb).unwrap();
    q.wait(v, T).unwrap();
    assert_eq!(c.buf.read_u32(0).unwrap(), 1);
}

#[test]
fn a_legacy_monitored_fence_interrupts_on_every_signal() {
    let sys = common::sim();
    let c = common::client(&sys);
    let f = c.device.create_fence(0, NativeFenceType::LegacyMonitored).unwrap();
    let mut q = c.user_queue();
    let mut cb = CommandBuffer::new();
    for v in 1..=5 {
        cb.signal_fence(&f, v);
    }
    let v = q.submit(&cb).unwrap();
    q.wait(v, T).unwrap();
    assert_eq!(sys.stats().fence_interrupts, 5);
}

#[test]
fn bad_fence_input_is_refused_and_harms_nothing() {
    let sys = common::sim();
    let a = common::client(&sys);
    let b = common::client(&sys);
    let f = a.device.create_fence(0, NativeFenceType::Default).unwrap();
    // Another process's fence.
    let e = b.port.signal_native_fence(f.handle(), 1).unwrap_err();
    assert!(matches!(e, KernelError::BadHandle { .. }), "{e}");
    let e = b.port.wait_native_fences(&[(f.handle(), 1)], WaitMode::All, T).unwrap_err();
    assert!(matches!(e, KernelError::BadHandle { .. }), "{e}");
    // A destroyed one.
    let h = f.handle();
    drop(f);
    assert!(matches!(a.port.signal_native_fence(h, 1), Err(KernelError::BadHandle { .. })));
    // A fence signal to memory that is not a fence: user mode faults the queue, kernel mode refuses.
    let mut q = a.user_queue();
    let mut cb = CommandBuffer::new();
    cb.packet(abi::Packet::SignalFence { va: a.buf.va(), value: 1 });
    let v = q.submit(&cb).unwrap();
    assert!(q.wait(v, T).is_err());
    assert!(matches!(q.status().unwrap().fault.unwrap().kind, FaultKind::NotAFence { .. }));
    let mut kq = a.kernel_queue();
    let e = kq.submit(&cb).unwrap_err();
    assert_eq!(common::umd_refusal(&e), Some(("SIGNAL.va", &abi::port::Invalid::NotANativeFence)), "{e}");
    // User code cannot write CurrentValue from the CPU: its mapping is read-only, and the
    // shared-memory layer refuses a writable view of it with a typed error.
    let info = a.port.create_native_fence(
        a.device.port().create_device().unwrap(),
        &abi::port::NativeFenceDesc::new(0, NativeFenceType::Default),
    );
    let info = info.unwrap();
    let cpu = info.cpu.as_ref().unwrap();
    assert_eq!(cpu.prot(), shm::Prot::ReadOnly);
    assert!(matches!(cpu.atomic_u64(info.offset), Err(shm::ShmError::ReadOnly)));
    assert!(matches!(cpu.write_u64(info.offset, 1), Err(shm::ShmError::ReadOnly)));
    assert_eq!(cpu.load_u64(info.offset, std::sync::atomic::Ordering::Acquire).unwrap(), 0);
}

fn ddis(sys: &kernel::System) -> Vec<Ddi> {
    sys.trace()
        .0
        .into_iter()
        .filter_map(|e| match e.event {
            Event::Ddi(
                d @ (Ddi::CreateNativeFence(_)
                | Ddi::OpenNativeFence(_)
                | Ddi::CloseNativeFence(_)
                | Ddi::DestroyNativeFence(_)),
            ) => Some(d),
            _ => None,
        })
        .collect()
}

#[test]
fn a_shared_fence_works_across_processes_and_closes_in_the_specs_order() {
    let sys = common::sim();
    let a = common::client(&sys);
    let b = common::client(&sys);
    let fa = a
        .device
        .create_fence_with(&abi::port::NativeFenceDesc {
            shareable: true,
            ..abi::port::NativeFenceDesc::new(0, NativeFenceType::Default)
        })
        .unwrap();
    let g = fa.global().expect("a shareable fence has a global handle");
    let fb = b.device.open_fence(g).unwrap();
    assert_ne!(fa.handle(), fb.handle(), "each process has its own local handle");
    assert_eq!(
        ddis(&sys),
        [Ddi::CreateNativeFence(g), Ddi::OpenNativeFence(fa.handle()), Ddi::OpenNativeFence(fb.handle())]
    );
    // B's GPU signals; A's GPU waits on it and A's CPU waits on it.
    let mut qa = a.user_queue();
    let mut cb = CommandBuffer::new();
    cb.wait_fence(&fa, 2).write_u32(a.buf.va(), 0x5a);
    let va = qa.submit(&cb).unwrap();
    let mut qb = b.user_queue();
    let mut cb = CommandBuffer::new();
    cb.wait(b.buf.va(), 1).signal_fence(&fb, 2);
    qb.submit(&cb).unwrap();
    b.buf.write_u64(0, 1).unwrap();
    fa.wait(2, T).unwrap(); // registered in A, woken by B's signal: the interrupt reaches every instance
    qa.wait(va, T).unwrap();
    assert_eq!((fa.value().unwrap(), fb.value().unwrap(), a.buf.read_u32(0).unwrap()), (2, 2, 0x5a));
    assert!(sys.stats().fence_interrupts >= 1);
    // Close A's instance: the global fence lives on for B.
    let (ha, hb) = (fa.handle(), fb.handle());
    drop(fa);
    assert_eq!(ddis(&sys)[3..], [Ddi::CloseNativeFence(ha)]);
    fb.signal(3).unwrap();
    assert_eq!(fb.value().unwrap(), 3);
    drop(fb);
    assert_eq!(ddis(&sys)[3..], [Ddi::CloseNativeFence(ha), Ddi::CloseNativeFence(hb), Ddi::DestroyNativeFence(g)]);
    assert!(b.device.open_fence(g).is_err(), "the global handle is gone with its last reference");
}

#[test]
fn only_shared_fences_can_be_opened() {
    let sys = common::sim();
    let a = common::client(&sys);
    let b = common::client(&sys);
    let private = a.device.create_fence(0, NativeFenceType::Default).unwrap();
    assert_eq!(private.global(), None);
    // Guess the private fence's global id: it exists, but was not shared.
    let id = match ddis(&sys)[..] {
        [Ddi::CreateNativeFence(id)] => id,
        ref d => panic!("{d:?}"),
    };
    let e = b.port.open_native_fence(b.device.port().create_device().unwrap(), id).unwrap_err();
    assert!(
        matches!(&e, KernelError::InvalidArgument { field: "global", reason, .. } if *reason == abi::port::Invalid::NotShareable),
        "{e}"
    );
    let e = b.port.open_native_fence(b.device.port().create_device().unwrap(), 999_999).unwrap_err();
    assert!(
        matches!(&e, KernelError::InvalidArgument { field: "global", reason, .. } if *reason == abi::port::Invalid::NoSuchFence),
        "{e}"
    );
}

#[test]
fn a_device_in_error_signals_every_fence_stops_its_queues_and_waits_report_it() {
    let sys = common::sim();
    let c = common::client(&sys);
    let f = c.device.create_fence(0, NativeFenceType::Default).unwrap();
    // A GPU queue waits on the fence; a CPU waiter would too.
    let mut q = c.user_queue();
    let mut cb = CommandBuffer::new();
    cb.wait_fence(&f, 100).write_u32(c.buf.va(), 7);
    let v = q.submit(&cb).unwrap();
    sys.settle();
    assert_eq!(c.buf.read_u32(0).unwrap(), 0);
    sys.mark_device_error(c.port.process(), c.device.handle()).unwrap();
    // AlwaysSignaled (so other devices' GPU waits on it pass), but the lost device's own
    // queue is stopped (spec 000 device lost): its work never runs, and waiting on it fails.
    assert_eq!(f.value().unwrap(), abi::port::FENCE_ALWAYS_SIGNALED);
    assert!(matches!(q.wait(v, T), Err(umd::UmdError::QueueLost { .. })));
    sys.settle();
    assert_eq!(c.buf.read_u32(0).unwrap(), 0);
    // ... and CPU waits end at once, reporting the error.
    let e = f.wait(5, T).unwrap_err();
    assert!(e.to_string().contains("is lost"), "{e}");
    let e = c.port.wait_native_fences(&[(f.handle(), 5)], WaitMode::All, None).unwrap_err();
    assert!(matches!(e, KernelError::DeviceLost { .. }), "{e}");
    // The reserved value cannot be signalled by the CPU.
    let g = c.device.create_fence(0, NativeFenceType::Default).unwrap();
    let e = g.signal(u64::MAX).unwrap_err();
    assert_eq!(common::umd_refusal(&e), Some(("value", &abi::port::Invalid::Reserved)), "{e}");
}

/// The device's record of fence signals (`Gpu::record_fence_signals`, the swarm's
/// `interrupts` checker) shows spec 002's conditional interrupt signal by signal: with no
/// waiter the MonitoredValue is `u64::MAX` and nothing is raised; with a CPU waiter for 3 it
/// is 2, so a signal of 2 raises nothing and a signal of 3 raises the interrupt.
#[test]
fn the_device_records_each_fence_signal_with_the_monitored_value_it_checked() {
    let sys = common::sim();
    sys.with_gpu(|g| g.record_fence_signals(true));
    let c = common::client(&sys);
    let f = c.device.create_fence(0, NativeFenceType::Default).unwrap();
    let mut q = c.user_queue();
    let mut signals = Vec::new();
    let mut signal = |value: u64| {
        let mut cb = CommandBuffer::new();
        cb.signal_fence(&f, value);
        let v = q.submit(&cb).unwrap();
        q.wait(v, T).unwrap();
        signals.clear();
        sys.take_fence_signals(&mut signals);
        signals.iter().map(|s| (s.value, s.monitored, s.raised)).collect::<Vec<_>>()
    };
    assert_eq!(signal(1), [(1, u64::MAX, false)], "no waiter: nothing is due");
    let wait = sys.begin_fence_wait(c.port.process(), &[(f.handle(), 3)], WaitMode::All).unwrap().expect("it blocks");
    assert_eq!(signal(2), [(2, 2, false)], "below the waiter's value");
    assert_eq!(signal(3), [(3, 2, true)], "the waiter's value reached: the interrupt");
    assert!(matches!(sys.end_fence_wait(c.port.process(), &wait), Ok(abi::port::WaitOutcome::Reached(_))));
}
