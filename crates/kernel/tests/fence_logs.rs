//! Fence log buffers on the deterministic driver: what the engine writes and in what order,
//! the optimized interrupt that names the queue, overrun and its fallback, and bad input.

mod common;

use std::time::Duration;

use abi::fence_log::{FenceLogOp, FenceLogType};
use abi::port::{KernelError, NativeFenceType};
use kernel::trace::{Ddi, Event};
use umd::CommandBuffer;

const T: Option<Duration> = Some(Duration::from_millis(50));

#[test]
fn signal_and_wait_logs_hold_values_handles_and_monotonic_timestamps() {
    let sys = common::sim();
    let c = common::client(&sys);
    let pid = c.port.process();
    let f = c.device.create_fence(0, NativeFenceType::Default).unwrap();
    let mut q = c.user_queue();
    let mut cb = CommandBuffer::new();
    cb.signal_fence_logged(&f, 1).signal_fence_logged(&f, 2);
    let v = q.submit(&cb).unwrap();
    q.wait(v, T).unwrap();
    sys.advance(Duration::from_micros(5));
    let mut cb = CommandBuffer::new();
    cb.signal_fence_logged(&f, 3);
    let v = q.submit(&cb).unwrap();
    q.wait(v, T).unwrap();
    let log = sys.read_fence_log(pid, q.handle(), FenceLogType::Signal, 0).unwrap();
    assert_eq!((log.entries.len(), log.lost, log.total), (3, 0, 3));
    let handles: Vec<u64> = log.entries.iter().map(|e| e.fence_handle).collect();
    assert!(handles.iter().all(|&h| h != 0 && h == handles[0]), "the fence's kernel id: {handles:?}");
    assert_eq!(log.entries.iter().map(|e| e.fence_value).collect::<Vec<_>>(), [1, 2, 3]);
    assert!(log.entries.iter().all(|e| e.operation == FenceLogOp::SignalExecuted as u32));
    assert!(log.entries.windows(2).all(|w| w[0].end_timestamp <= w[1].end_timestamp));
    assert!(log.entries[2].end_timestamp > log.entries[1].end_timestamp, "time advanced between them");
    // A logged wait: observed when the engine first saw it, ended when released.
    let mut cb = CommandBuffer::new();
    cb.wait_fence_logged(&f, 4);
    let v = q.submit(&cb).unwrap();
    sys.settle();
    let seen_at = sys.now().as_nanos();
    sys.advance(Duration::from_micros(7));
    f.signal(4).unwrap();
    q.wait(v, T).unwrap();
    let w = sys.read_fence_log(pid, q.handle(), FenceLogType::Wait, 0).unwrap();
    assert_eq!(w.entries.len(), 1);
    let e = w.entries[0];
    assert_eq!((e.fence_value, e.operation), (4, FenceLogOp::WaitUnblocked as u32));
    assert!(e.observed_timestamp <= seen_at && e.end_timestamp >= seen_at + 7_000, "{e:?}");
    // Reads continue from where they left off.
    assert_eq!(sys.read_fence_log(pid, q.handle(), FenceLogType::Signal, log.total).unwrap().entries.len(), 0);
}

/// In the optimized mode the interrupt names the queue, and the kernel learns which fence from
/// the signal log (after flushing it). The entry is written before the engine's barrier and
/// interrupt check by construction: `abi::protocol::signal_fence` runs the log write between
/// the value store and the barrier (spec 002 "Order of operations").
#[test]
fn optimized_interrupts_are_serviced_from_the_log() {
    let sys = common::optimized();
    let c = common::client(&sys);
    let f = c.device.create_fence(0, NativeFenceType::Default).unwrap();
    let mut q = c.user_queue();
    let mut cb = CommandBuffer::new();
    cb.wait(c.buf.va(), 1).signal_fence_logged(&f, 1);
    q.submit(&cb).unwrap();
    c.buf.write_u64(0, 1).unwrap();
    f.wait(1, T).unwrap();
    let st = sys.stats();
    assert_eq!((st.fence_interrupts, st.fence_log_fallbacks), (1, 0));
    let ev: Vec<Event> = common::events_from(&sys, 0);
    assert!(ev.contains(&Event::Ddi(Ddi::UpdateNativeFenceLogs(q.handle()))), "the log was flushed before it was read");
}

/// More entries than the log holds between two reads: the kernel detects the overrun and
/// falls back to scanning every fence, so the waiter is still woken.
#[test]
fn an_overrun_log_falls_back_to_scanning_every_fence() {
    let sys = common::optimized();
    let c = common::client(&sys);
    let pid = c.port.process();
    let a = c.device.create_fence(0, NativeFenceType::Default).unwrap();
    let b = c.device.create_fence(0, NativeFenceType::Default).unwrap();
    let mut q = c.user_queue();
    let mut cb = CommandBuffer::new();
    cb.wait(c.buf.va(), 1);
    for v in 1..=90 {
        cb.signal_fence_logged(&a, v); // no waiter: no interrupt, nobody reads the log
    }
    cb.signal_fence_logged(&b, 1);
    q.submit(&cb).unwrap();
    c.buf.write_u64(0, 1).unwrap();
    b.wait(1, T).unwrap();
    assert_eq!(sys.stats().fence_log_fallbacks, 1);
    let r = sys.read_fence_log(pid, q.handle(), FenceLogType::Signal, 0).unwrap();
    // 91 written, 84 slots: 7 overwritten, and the oldest remaining one shares its slot with
    // the next write, so a reader cannot trust it either.
    assert_eq!((r.entries.len(), r.lost, r.total), (83, 8, 91));
}

#[test]
fn logs_are_for_user_mode_queues_and_entries_must_be_in_range() {
    let sys = common::sim();
    let c = common::client(&sys);
    let f = c.device.create_fence(0, NativeFenceType::Default).unwrap();
    let mut kq = c.kernel_queue();
    let mut cb = CommandBuffer::new();
    cb.signal_fence_logged(&f, 1);
    let e = kq.submit(&cb).unwrap_err();
    assert_eq!(
        common::umd_refusal(&e),
        Some(("SIGNAL/WAIT log flag", &abi::port::Invalid::LogFlagOnKernelQueue)),
        "{e}"
    );
    let e = sys.read_fence_log(c.port.process(), kq.handle(), FenceLogType::Signal, 0).unwrap_err();
    assert!(matches!(e, KernelError::InvalidArgument { .. }), "{e}");
    // A raw logged SIGNAL naming entry 84 is malformed: only its queue faults.
    let mut q = c.user_queue();
    let hdr = abi::packet::Header::new(abi::Opcode::Signal, 6).with_flags(abi::packet::FLAG_LOG);
    let mut cb = CommandBuffer::new();
    cb.raw(&[hdr.0, f.va() as u32, (f.va() >> 32) as u32, 1, 0, 84]);
    let v = q.submit(&cb).unwrap();
    assert!(q.wait(v, T).is_err());
    let fault = q.status().unwrap().fault.unwrap();
    assert!(fault.to_string().contains("log entry"), "{fault}");
}
