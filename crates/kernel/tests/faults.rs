//! Faults: a malformed stream, a bad address or a bad pointer hangs only its own queue.
//!
//! Every case builds the same world on the deterministic driver: process A with the queue
//! under test (`qa`) and a second queue (`qa2`) on the same engine, and process B with its own
//! queue (`qb`) on that engine too. `qa2` and `qb` have checked work in flight when the fault
//! happens. Then each case asserts that `qa` is Hung with a fault record of the right kind,
//! its doorbell is `DisconnectedAbort`, waits on it end with `UmdError::QueueLost` (one that
//! was blocked when the fault arrived, and one made after), and that `qa2`, `qb` and a new
//! queue in process A all keep running with correct results.

mod common;

use std::sync::Arc;

use abi::packet::{DataWidth, DecodeError, Header, Opcode, Packet};
use abi::port::AllocationDesc;
use abi::queue::{Access, FaultKind};
use abi::{DoorbellStatus, QueueState};
use kernel::System;
use kernel::trace::Event;
use umd::{Buffer, CommandBuffer, Queue, QueueOptions, UmdError};

use common::{Client, T, TapPort};

struct Env {
    sys: System,
    tap: Arc<TapPort>,
    a: Client,
    b: Client,
    qa: Queue,
    qa2: Queue,
    qb: Queue,
    /// Buffers a case allocated and must keep alive.
    keep: Vec<Buffer>,
}

impl Env {
    fn new(ring_bytes: u64) -> Env {
        let sys = common::sim();
        let tap = TapPort::open(&sys);
        let a = common::client_on(tap.clone());
        let b = common::client(&sys);
        let qa = a.ctx.create_queue(QueueOptions { ring_bytes, ..QueueOptions::user_mode() }).unwrap();
        let qa2 = a.user_queue();
        let qb = b.user_queue();
        assert_eq!((qa.engine(), qb.engine()), (qa2.engine(), qa2.engine()));
        Env { sys, tap, a, b, qa, qa2, qb, keep: Vec::new() }
    }
    fn va(&self, off: u64) -> u64 {
        self.a.buf.va() + off
    }
    fn t(&self) -> Arc<common::TapQueue> {
        self.tap.queue(self.qa.handle())
    }
    /// Submits `words` raw on `qa`; returns the progress value (which must never complete).
    fn raw(&mut self, words: &[u32]) -> u64 {
        let mut cb = CommandBuffer::new();
        cb.raw(words);
        self.qa.submit(&cb).unwrap()
    }
    fn submit(&mut self, cb: &CommandBuffer) -> u64 {
        self.qa.submit(cb).unwrap()
    }
    /// Runs `cb` on `qa` to completion (setting up a case).
    fn run_ok(&mut self, cb: &CommandBuffer) {
        let v = self.qa.submit(cb).unwrap();
        self.qa.wait(v, T).unwrap();
    }
}

/// Checked work: a 32- and a 64-bit write and a copy, at `off` of `buf`.
struct Work {
    off: u64,
    salt: u32,
    value: u64,
}

fn work(q: &mut Queue, buf: &Buffer, off: u64, salt: u32) -> Work {
    let va = buf.va() + off;
    let mut cb = CommandBuffer::new();
    cb.write_u32(va, salt).write_u64(va + 8, salt as u64 * 0x1_0000_0001).copy(va, va + 16, 16);
    Work { off, salt, value: q.submit(&cb).unwrap() }
}

fn check(q: &Queue, buf: &Buffer, w: &Work) {
    q.wait(w.value, T).unwrap_or_else(|e| panic!("{}: {e}", q.handle()));
    let s = w.salt;
    assert_eq!(buf.read_u32(w.off).unwrap(), s);
    assert_eq!(buf.read_u64(w.off + 8).unwrap(), s as u64 * 0x1_0000_0001);
    assert_eq!(buf.read_u32(w.off + 16).unwrap(), s);
    assert_eq!(buf.read_u64(w.off + 24).unwrap(), s as u64 * 0x1_0000_0001);
    assert_eq!(q.status().unwrap().state, QueueState::Mapped);
}

/// Runs one case: `inject` makes `qa` fault and returns a progress value it will never
/// reach; `want` checks the fault kind.
#[track_caller]
fn case(name: &str, ring_bytes: u64, inject: impl FnOnce(&mut Env) -> u64, want: impl Fn(&FaultKind) -> bool) {
    let mut env = Env::new(ring_bytes);
    let before_a = work(&mut env.qa2, &env.a.buf, 0x8_0000, 0x1111);
    let before_b = work(&mut env.qb, &env.b.buf, 0x8_0000, 0x2222);
    let b_snapshot = {
        let mut v = vec![0; 0x8_0000];
        env.b.buf.read(0, &mut v).unwrap();
        v
    };
    let never = inject(&mut env);
    let qa = &env.qa;
    let h = qa.handle();

    // A wait that blocks when the fault arrives ends with QueueLost.
    let err = qa.wait(never, T).unwrap_err();
    let st = qa.status().unwrap();
    assert_eq!(st.state, QueueState::Hung, "{name}: {st:?}");
    let fault = st.fault.clone().unwrap_or_else(|| panic!("{name}: no fault record"));
    assert!(want(&fault.kind), "{name}: unexpected fault {fault} ({:?})", fault.kind);
    match &err {
        UmdError::QueueLost { queue, reason } => {
            assert_eq!(*queue, h);
            assert_eq!(*reason, abi::port::LostReason::Fault(fault.clone()), "{name}: the wait names the fault");
        }
        other => panic!("{name}: expected QueueLost, got {other:?}"),
    }
    assert!(st.completed < never, "{name}");
    assert_eq!(qa.doorbell_status().unwrap(), DoorbellStatus::DisconnectedAbort, "{name}");
    let t = env.t();
    assert_eq!(t.state_word(), QueueState::Hung as u64, "{name}: the kernel page shows Hung");
    // And so does a wait made afterwards, and a submission.
    assert!(matches!(qa.wait(never, T), Err(UmdError::QueueLost { .. })), "{name}");
    let mut cb = CommandBuffer::new();
    cb.write_u32(env.va(0x7_0000), 1);
    assert!(matches!(env.qa.submit(&cb), Err(UmdError::QueueLost { .. })), "{name}");
    env.sys.settle();
    assert_eq!(env.a.buf.read_u32(0x7_0000).unwrap(), 0, "{name}: a hung queue runs nothing");

    let faults: Vec<_> =
        common::events(&env.sys).into_iter().filter(|e| matches!(e, Event::QueueFault { .. })).collect();
    assert_eq!(faults, [Event::QueueFault { queue: h, fault }], "{name}: exactly one fault, on qa");
    assert_eq!(env.sys.stats().faults, 1, "{name}");

    // Everyone else: the work in flight, and new work.
    check(&env.qa2, &env.a.buf, &before_a);
    check(&env.qb, &env.b.buf, &before_b);
    let mut b_now = vec![0; 0x8_0000];
    env.b.buf.read(0, &mut b_now).unwrap();
    assert!(b_now == b_snapshot, "{name}: process A's fault touched process B's memory");
    let after_a = work(&mut env.qa2, &env.a.buf, 0x9_0000, 0x3333);
    let after_b = work(&mut env.qb, &env.b.buf, 0x9_0000, 0x4444);
    check(&env.qa2, &env.a.buf, &after_a);
    check(&env.qb, &env.b.buf, &after_b);
    assert_eq!(env.qa2.doorbell_status().unwrap(), DoorbellStatus::Connected);
    assert_eq!(env.qb.doorbell_status().unwrap(), DoorbellStatus::Connected);
    let mut fresh = env.a.user_queue();
    let w = work(&mut fresh, &env.a.buf, 0xa_0000, 0x5555);
    check(&fresh, &env.a.buf, &w);
}

const RING: u64 = 64 * 1024;

#[test]
fn malformed_headers() {
    let dec = |e: DecodeError| move |k: &FaultKind| *k == FaultKind::BadPacket(e);
    let hdr = |op: Opcode, n| Header::new(op, n).0;
    case(
        "unknown opcode",
        RING,
        |e| e.raw(&[1 | (0x7f << 16) | (1 << 24)]),
        dec(DecodeError::UnknownOpcode { opcode: 0x7f }),
    );
    case(
        "version 2",
        RING,
        |e| e.raw(&[1 | (2 << 24)]),
        |k| matches!(k, FaultKind::BadPacket(DecodeError::BadVersion { version: 2, .. })),
    );
    case(
        "reserved flags",
        RING,
        |e| e.raw(&[hdr(Opcode::Nop, 1) | (1 << 28)]),
        |k| matches!(k, FaultKind::BadPacket(DecodeError::ReservedFlags { flags: 1, .. })),
    );
    case("zero length", RING, |e| e.raw(&[hdr(Opcode::Nop, 0)]), dec(DecodeError::ZeroLength { opcode: "NOP" }));
    case(
        "wrong fixed length",
        RING,
        |e| e.raw(&[hdr(Opcode::Signal, 3), 0, 0]),
        dec(DecodeError::BadLength { opcode: "SIGNAL", len: 3, expected: 5 }),
    );
    case(
        "short DISPATCH",
        RING,
        |e| e.raw(&[hdr(Opcode::Dispatch, 4), 0, 0, 0]),
        dec(DecodeError::BadLength { opcode: "DISPATCH", len: 4, expected: 11 }),
    );
    case(
        "WRITE_DATA width 2",
        RING,
        |e| {
            let va = e.va(0);
            e.raw(&[hdr(Opcode::WriteData, 6), 2, va as u32, (va >> 32) as u32, 1, 0])
        },
        dec(DecodeError::BadField { opcode: "WRITE_DATA", field: "width", value: 2 }),
    );
}

#[test]
fn packet_running_past_the_ring_end() {
    case(
        "past ring end",
        4096,
        |e| {
            // Fill the ring to 16 bytes before its end: 512 + 508 dwords, fences included.
            e.run_ok(CommandBuffer::new().nop(509));
            e.run_ok(CommandBuffer::new().nop(505));
            assert_eq!(e.t().wptr(), 4096 - 16);
            // A NOP header in the last 4 dwords that claims 10.
            let v = e.raw(&[Header::new(Opcode::Nop, 10).0]);
            assert_eq!(e.t().wptr(), 4096, "no padding: the stream fits exactly");
            v
        },
        |k| *k == FaultKind::PastRingEnd { offset: 4096 - 16, dwords: 10, ring_bytes: 4096 },
    );
}

#[test]
fn packet_running_past_wptr() {
    case(
        "past wptr",
        RING,
        |e| e.raw(&[Header::new(Opcode::Nop, 100).0]),
        |k| *k == FaultKind::PastWptr { rptr: 0, dwords: 100, wptr: 16 },
    );
}

#[test]
fn addresses_outside_the_process_mappings() {
    let unmapped = 0x20_0000u64;
    let w = |va, bytes| FaultKind::OutsideMappings { va, bytes, access: Access::Write };
    let r = |va, bytes| FaultKind::OutsideMappings { va, bytes, access: Access::Read };
    // The guard page just past the client buffer.
    let guard = |e: &Env| e.a.buf.va() + e.a.buf.len();
    case(
        "WRITE_DATA past the buffer end",
        RING,
        |e| {
            let va = guard(e);
            e.submit(CommandBuffer::new().write_u32(va, 1))
        },
        |k| matches!(k, FaultKind::OutsideMappings { bytes: 4, access: Access::Write, .. }),
    );
    case(
        "SIGNAL unmapped",
        RING,
        |e| e.submit(CommandBuffer::new().signal(unmapped, 1)),
        move |k| *k == w(unmapped, 8),
    );
    case("WAIT unmapped", RING, |e| e.submit(CommandBuffer::new().wait(unmapped, 1)), move |k| *k == r(unmapped, 8));
    case(
        "COPY source unmapped",
        RING,
        |e| {
            let dst = e.va(0);
            e.submit(CommandBuffer::new().copy(unmapped, dst, 64))
        },
        move |k| *k == r(unmapped, 64),
    );
    case(
        "COPY running off the buffer",
        RING,
        |e| {
            let (src, dst) = (e.va(0), e.va((1 << 20) - 8));
            e.submit(CommandBuffer::new().copy(src, dst, 64))
        },
        |k| matches!(k, FaultKind::OutsideMappings { bytes: 64, access: Access::Write, .. }),
    );
    case("FILL", RING, |e| e.submit(CommandBuffer::new().fill(unmapped, 3, 0)), move |k| *k == w(unmapped, 3));
    case("TIMESTAMP", RING, |e| e.submit(CommandBuffer::new().timestamp(unmapped)), move |k| *k == w(unmapped, 8));
    case(
        "INDIRECT_BUFFER",
        RING,
        |e| e.submit(CommandBuffer::new().indirect(unmapped, 4)),
        move |k| *k == r(unmapped, 16),
    );
    case(
        "a VA that only process B maps",
        RING,
        |e| {
            // B maps 4 MiB; A's address space ends far below its top.
            let big = e.b.device.allocate(4 << 20).unwrap();
            let va = big.va() + (3 << 20);
            e.keep.push(big);
            e.submit(CommandBuffer::new().write_u64(va, 0xbad))
        },
        |k| matches!(k, FaultKind::OutsideMappings { bytes: 8, access: Access::Write, .. }),
    );
}

#[test]
fn writes_to_read_only_mappings() {
    case(
        "the queue's own progress fence page",
        RING,
        |e| {
            let va = e.qa.progress_va();
            e.submit(CommandBuffer::new().write_u64(va, 999))
        },
        |k| matches!(k, FaultKind::ReadOnly { bytes: 8, .. }),
    );
    case(
        "a GPU-read-only allocation",
        RING,
        |e| {
            let ro = e.a.device.allocate_with(&AllocationDesc { gpu_read_only: true, ..AllocationDesc::system(4096) });
            let ro = ro.unwrap();
            let va = ro.va();
            e.keep.push(ro);
            e.submit(CommandBuffer::new().fill(va, 16, 0xffff_ffff))
        },
        |k| matches!(k, FaultKind::ReadOnly { bytes: 16, .. }),
    );
}

#[test]
fn misaligned_accesses() {
    case(
        "64-bit WRITE_DATA at +4",
        RING,
        |e| {
            let va = e.va(4);
            e.submit(CommandBuffer::new().write_u64(va, 1))
        },
        |k| matches!(k, FaultKind::Misaligned { align: 8, access: Access::Write, .. }),
    );
    case(
        "SIGNAL at +4",
        RING,
        |e| {
            let va = e.va(4);
            e.submit(CommandBuffer::new().signal(va, 1))
        },
        |k| matches!(k, FaultKind::Misaligned { align: 8, .. }),
    );
}

#[test]
fn indirect_buffer_with_a_vmid_on_a_user_queue() {
    case(
        "vmid",
        RING,
        |e| {
            let va = e.va(0);
            e.submit(CommandBuffer::new().packet(Packet::IndirectBuffer { va, dwords: 1, vmid: 1 }))
        },
        |k| matches!(k, FaultKind::BadIndirect { why } if why.contains("vmid")),
    );
}

#[test]
fn progress_fence_above_the_last_queued_value() {
    case(
        "PROGRESS_FENCE above the last-queued value published before it",
        RING,
        |e| {
            // 100 inside a command buffer the UMD queued as 1.
            e.submit(CommandBuffer::new().packet(Packet::ProgressFence { value: 100 }));
            1000
        },
        |k| *k == FaultKind::ProgressBeyondQueued { value: 100, last_queued: 1 },
    );
}

/// A client that publishes a last-queued value covering both fences, then writes them out of
/// order: the second goes backwards.
#[test]
fn progress_fence_going_backwards() {
    let sys = common::sim();
    let tap = common::TapPort::open(&sys);
    let c = common::client_on(tap.clone());
    let q = c.user_queue();
    let t = tap.queue(q.handle());
    let mut cb = CommandBuffer::new();
    cb.packet(Packet::ProgressFence { value: 100 }).packet(Packet::ProgressFence { value: 1 });
    t.write_ring(0, cb.words());
    t.set_last_queued(100);
    t.set_wptr(cb.len() as u64 * 4);
    t.ring_doorbell(cb.len() as u64 * 4);
    sys.settle();
    let st = q.status().unwrap();
    assert_eq!(st.state, QueueState::Hung);
    assert_eq!(st.fault.unwrap().kind, FaultKind::ProgressBackwards { completed: 100, value: 1 });
}

#[test]
fn wptr_moving_backwards() {
    case(
        "wptr backwards",
        RING,
        |e| {
            e.run_ok(CommandBuffer::new().write_u32(e.va(0), 1).nop(3));
            let t = e.t();
            let w = t.wptr();
            t.set_wptr(w - 4);
            t.ring_doorbell(w + 1);
            e.qa.last_submitted() + 1
        },
        |k| matches!(k, FaultKind::WptrBackwards { old, new } if *new == *old - 4),
    );
}

#[test]
fn wptr_jumping_more_than_a_ring() {
    case(
        "wptr past the ring",
        4096,
        |e| {
            e.run_ok(CommandBuffer::new().write_u32(e.va(0), 1));
            let t = e.t();
            let r = t.rptr();
            assert_eq!(r, t.wptr());
            t.set_wptr(r + 4096 + 4);
            t.ring_doorbell(r + 4096 + 4);
            e.qa.last_submitted() + 1
        },
        |k| matches!(k, FaultKind::WptrPastRing { rptr, wptr, ring_bytes: 4096 } if *wptr == *rptr + 4100),
    );
}

#[test]
fn wptr_not_dword_aligned() {
    case(
        "wptr misaligned",
        RING,
        |e| {
            let t = e.t();
            t.set_wptr(2);
            t.ring_doorbell(2);
            e.qa.last_submitted() + 1
        },
        |k| *k == FaultKind::WptrMisaligned { wptr: 2 },
    );
}

/// A kernel-mode queue faults the same way: only itself.
#[test]
fn kernel_mode_queue_fault_is_contained() {
    let sys = common::sim();
    let a = common::client(&sys);
    let b = common::client(&sys);
    let mut km = a.kernel_queue();
    let mut qa2 = a.user_queue();
    let mut qb = b.kernel_queue();
    let wa = work(&mut qa2, &a.buf, 0x1000, 7);
    let wb = work(&mut qb, &b.buf, 0x1000, 8);
    // A write the kernel can see is bad is refused at submission, with nothing run.
    let mut cb = CommandBuffer::new();
    cb.write_u32(a.buf.va(), 1).write_u64(km.progress_va(), 999).write_u32(a.buf.va() + 4, 2);
    let e = km.submit(&cb).unwrap_err();
    assert_eq!(common::umd_refusal(&e), Some(("WRITE_DATA.va", &abi::port::Invalid::GpuReadOnly)), "{e}");
    // A fault only the engine can find (a kernel binary with a bad header) hangs the queue.
    let junk = a.device.upload(&[0u8; 64]).unwrap();
    let mut cb = CommandBuffer::new();
    cb.write_u32(a.buf.va(), 1).dispatch(junk.va(), [1, 1, 1], [1, 1, 1], junk.va()).write_u32(a.buf.va() + 4, 2);
    let v = km.submit(&cb).unwrap();
    let err = km.wait(v, T).unwrap_err();
    assert!(matches!(err, UmdError::QueueLost { .. }), "{err}");
    let st = km.status().unwrap();
    assert_eq!(st.state, QueueState::Hung);
    assert!(matches!(st.fault.unwrap().kind, FaultKind::BadProgram(_)));
    assert_eq!(km.completed(), 0, "the progress page was not written");
    assert_eq!((a.buf.read_u32(0).unwrap(), a.buf.read_u32(4).unwrap()), (1, 0));
    let e = a.port.submit_command(km.handle(), &abi::packet::progress_fence_words(2)).unwrap_err();
    assert!(matches!(e, abi::port::KernelError::QueueLost { .. }), "{e}");
    check(&qa2, &a.buf, &wa);
    check(&qb, &b.buf, &wb);
    let wb2 = work(&mut qb, &b.buf, 0x2000, 9);
    check(&qb, &b.buf, &wb2);
}

/// Faults in two processes at once: each hangs its own queue only.
#[test]
fn two_faulting_processes_do_not_disturb_a_third() {
    let sys = common::sim();
    let (a, b, c) = (common::client(&sys), common::client(&sys), common::client(&sys));
    let (mut qa, mut qb, mut qc) = (a.user_queue(), b.user_queue(), c.user_queue());
    let wc = work(&mut qc, &c.buf, 0, 0xc);
    let mut cb = CommandBuffer::new();
    cb.raw(&[0xdead_beef]);
    let va = qa.submit(&cb).unwrap();
    let mut cb = CommandBuffer::new();
    cb.packet(Packet::WriteData { width: DataWidth::U32, va: 0x10, value: 1 });
    let vb = qb.submit(&cb).unwrap();
    let wc2 = work(&mut qc, &c.buf, 0x100, 0xcc);
    sys.settle();
    assert!(matches!(qa.wait(va, T), Err(UmdError::QueueLost { .. })));
    assert!(matches!(qb.wait(vb, T), Err(UmdError::QueueLost { .. })));
    assert!(matches!(qa.status().unwrap().fault.unwrap().kind, FaultKind::BadPacket(DecodeError::BadVersion { .. })));
    assert!(matches!(qb.status().unwrap().fault.unwrap().kind, FaultKind::OutsideMappings { va: 0x10, .. }));
    check(&qc, &c.buf, &wc);
    check(&qc, &c.buf, &wc2);
    assert_eq!(sys.stats().faults, 2);
}

/// A command buffer whose own `PROGRESS_FENCE` claims a value far ahead (inside an indirect
/// buffer or not) would make every submission look complete while the ring is still full.
/// The device refuses it: no progress value may pass the last-queued value the UMD published
/// before the work (spec 000's order), so the queue hangs at once, the completed value does
/// not move, and the submissions that need ring space report the loss instead of spinning.
#[test]
fn lying_progress_fence_does_not_hang_the_ring_space_wait() {
    let sys = common::sim();
    let c = common::client(&sys);
    let mut q = c.ctx.create_queue(QueueOptions { ring_bytes: 4096, ..QueueOptions::user_mode() }).unwrap();
    let mut cb = CommandBuffer::new();
    cb.packet(Packet::ProgressFence { value: 1 << 40 });
    q.submit(&cb).unwrap();
    let mut cb = CommandBuffer::new();
    cb.nop(200);
    let results: Vec<_> = (0..10).map(|_| q.submit(&cb)).collect();
    assert!(results[..4].iter().all(Result::is_ok), "the first ones fit: {results:?}");
    assert!(
        results.iter().any(
            |r| matches!(r, Err(UmdError::QueueLost { reason: abi::port::LostReason::Fault(f), .. }) if matches!(f.kind, abi::queue::FaultKind::ProgressBeyondQueued { .. }))
        ),
        "{results:?}"
    );
    assert!(results.iter().all(|r| matches!(r, Ok(_) | Err(UmdError::QueueLost { .. }))), "{results:?}");
    let st = q.status().unwrap();
    assert_eq!(st.state, QueueState::Hung);
    // (The UMD queued a few more before the device first ran: last-queued is theirs.)
    let kind = st.fault.unwrap().kind;
    assert!(
        matches!(kind, FaultKind::ProgressBeyondQueued { value, last_queued } if value == 1 << 40 && (1..=10).contains(&last_queued)),
        "{kind:?}"
    );
    assert_eq!(st.completed, 0, "the lie never reached the completed value");
}

/// The case a user met: a `PROGRESS_FENCE` inside an indirect buffer moved the queue's
/// progress value to 2^40. It is bounded like one in the ring, and the fault says where.
#[test]
fn a_progress_fence_inside_an_indirect_buffer_cannot_pass_the_last_queued_value() {
    let sys = common::sim();
    let c = common::client(&sys);
    let mut q = c.user_queue();
    let mut ib = CommandBuffer::new();
    ib.packet(Packet::ProgressFence { value: 1 << 40 });
    let words: Vec<u8> = ib.words().iter().flat_map(|w| w.to_le_bytes()).collect();
    c.buf.write(0, &words).unwrap();
    let mut cb = CommandBuffer::new();
    cb.indirect(c.buf.va(), ib.len() as u32);
    let v = q.submit(&cb).unwrap();
    assert!(q.wait(v, common::T).is_err());
    let st = q.status().unwrap();
    assert_eq!(st.state, QueueState::Hung);
    assert_eq!(st.completed, 0);
    let f = st.fault.unwrap();
    assert_eq!(f.kind, FaultKind::ProgressBeyondQueued { value: 1 << 40, last_queued: v });
    assert!(f.in_indirect);
}

/// Issue 27's first suspect, pinned: a fault the device raised for a queue that is destroyed
/// before the interrupt reaches the kernel names nobody, even once another process's queue
/// has taken the firmware table entry the destroyed queue had (same entry, next generation).
/// The interrupt is dropped: the new queue is not hung, runs its work, and no fault is
/// counted or traced for anyone.
#[test]
fn a_late_fault_of_a_destroyed_queue_is_not_charged_to_the_queue_that_reuses_its_entry() {
    let sys = common::sim_with(kernel::SystemConfig {
        interrupt_delivery: std::time::Duration::from_millis(1),
        ..kernel::SystemConfig::default()
    });
    let (a, b) = (common::client(&sys), common::client(&sys));
    let a_pid = a.port.process();
    let b_pid = b.port.process();
    let mut qb = b.user_queue();
    let mut cb = CommandBuffer::new();
    cb.write_u32(a.buf.va() + (1 << 40), 0xbad);
    qb.submit(&cb).unwrap();
    // The device runs it and faults; the interrupt is on its way (not delivered yet).
    sys.run_instant();
    let old = sys.device_queue_id(b_pid, qb.handle()).unwrap().expect("on the device");
    let old_fw = gpu::FwQueueId::from_bits(old);
    assert_eq!(sys.with_gpu(|g| g.queue_state(old_fw)), Ok(QueueState::Hung), "the device faulted it");
    assert_eq!(sys.stats().faults, 0, "the kernel has not heard of it yet");
    drop(qb);
    // A's queue takes the entry B's queue had, one generation on.
    let mut qa = a.user_queue();
    let new = sys.device_queue_id(a_pid, qa.handle()).unwrap().expect("on the device");
    assert_eq!(new as u32, old as u32, "the same firmware table entry");
    assert_ne!(new, old, "a later generation");
    // The late interrupt is delivered while A's queue runs A's work.
    cb.clear();
    cb.write_u32(a.buf.va(), 0x5678);
    let v = qa.submit(&cb).unwrap();
    qa.wait(v, T).unwrap();
    sys.run_for(std::time::Duration::from_millis(5));
    assert_eq!(a.buf.read_u32(0).unwrap(), 0x5678);
    let st = qa.status().unwrap();
    assert_eq!((st.state, st.fault), (QueueState::Mapped, None));
    assert_eq!(qa.doorbell_status().unwrap(), DoorbellStatus::Connected);
    assert_eq!(sys.stats().faults, 0);
    assert!(!common::events(&sys).iter().any(|e| matches!(e, Event::QueueFault { .. })));
}
