//! Every packet of `abi::packet`, executed on the deterministic driver through a user-mode
//! queue (ring + doorbell) and through a kernel-mode queue (each submission a kernel call),
//! with identical results.
//!
//! [`run_both`] builds one command buffer against two fresh systems whose clients allocate the
//! same memory in the same order, so every GPU VA is the same; it asserts that the two
//! streams are word-for-word identical, runs each on its queue, and asserts that the outcome
//! and the whole client buffer are identical. Each test then checks the results themselves.

mod common;

use abi::EngineKind;
use abi::packet::{DataWidth, Header, Opcode, Packet, progress_fence_words};
use abi::queue::FaultKind;
use abi::{DoorbellStatus, QueueState};
use kernel::System;
use kernel::trace::Event;
use std::time::Duration;
use umd::{CommandBuffer, Queue, QueueOptions, SubmissionKind, UmdError};

use common::{Client, T};

const KINDS: [SubmissionKind; 2] = [SubmissionKind::UserMode, SubmissionKind::KernelMode];

/// A fresh sim, a client with its 1 MiB buffer (allocated first, so its VA is the same on
/// every rig), and one queue of the given kind on the compute engine.
struct Rig {
    sys: System,
    c: Client,
    q: Queue,
}

impl Rig {
    fn new(kind: SubmissionKind) -> Rig {
        let sys = common::sim();
        let c = common::client(&sys);
        let q = c.ctx.create_queue(QueueOptions { kind, ..QueueOptions::default() }).expect("queue");
        Rig { sys, c, q }
    }
    /// GPU VA of byte `off` of the client buffer.
    fn va(&self, off: u64) -> u64 {
        self.c.buf.va() + off
    }
    fn bytes(&self, off: u64, n: usize) -> Vec<u8> {
        let mut v = vec![0; n];
        self.c.buf.read(off, &mut v).unwrap();
        v
    }
    fn u32(&self, off: u64) -> u32 {
        self.c.buf.read_u32(off).unwrap()
    }
    fn u64(&self, off: u64) -> u64 {
        self.c.buf.read_u64(off).unwrap()
    }
    fn memory(&self) -> Vec<u8> {
        self.bytes(0, self.c.buf.len() as usize)
    }
    /// Submits and waits (on the sim, the wait steps the world).
    fn run(&mut self, cb: &CommandBuffer) -> (u64, Result<(), UmdError>) {
        let v = self.q.submit(cb).expect("submit");
        (v, self.q.wait(v, T))
    }
}

/// One side of [`run_both`].
struct Outcome {
    rig: Rig,
    value: u64,
    result: Result<(), UmdError>,
}

/// Runs the same command buffer on a user-mode and a kernel-mode queue. `build` may prepare
/// memory and move the clock; it must return the same stream for both rigs.
fn run_both(build: impl Fn(&Rig) -> CommandBuffer) -> [Outcome; 2] {
    let mut um = Rig::new(SubmissionKind::UserMode);
    let mut km = Rig::new(SubmissionKind::KernelMode);
    assert_eq!(um.c.buf.va(), km.c.buf.va(), "both rigs must lay memory out alike");
    let (cb_um, cb_km) = (build(&um), build(&km));
    assert_eq!(cb_um, cb_km, "the same command buffer on both paths");
    let (vu, ru) = um.run(&cb_um);
    let (vk, rk) = km.run(&cb_km);
    assert_eq!(vu, vk, "progress values");
    match (&ru, &rk) {
        (Ok(()), Ok(())) => {
            assert_eq!(um.q.completed(), vu);
            assert_eq!(km.q.completed(), vk);
        }
        (Err(UmdError::QueueLost { .. }), Err(UmdError::QueueLost { .. })) => {
            let (fu, fk) = (um.q.status().unwrap().fault.unwrap(), km.q.status().unwrap().fault.unwrap());
            assert_eq!((&fu.kind, fu.opcode, fu.in_indirect), (&fk.kind, fk.opcode, fk.in_indirect));
        }
        other => panic!("the two paths disagree: {other:?}"),
    }
    assert_eq!(um.sys.now(), km.sys.now(), "same virtual time");
    assert!(um.memory() == km.memory(), "the client buffer differs between the user-mode and kernel-mode paths");
    [Outcome { rig: um, value: vu, result: ru }, Outcome { rig: km, value: vk, result: rk }]
}

fn ok(o: &Outcome) {
    if let Err(e) = &o.result {
        panic!("{:?} queue: {e}", o.rig.q.kind());
    }
    assert_eq!(o.rig.q.completed(), o.value);
    assert_eq!(o.rig.q.status().unwrap().state, QueueState::Mapped);
}

#[test]
fn nop_short_and_long_then_the_stream_continues() {
    let outs = run_both(|r| {
        let mut cb = CommandBuffer::new();
        cb.nop(1).nop(2).nop(4000).write_u32(r.va(0), 0x1234_5678).nop(1).write_u32(r.va(4), 9);
        cb
    });
    for o in &outs {
        ok(o);
        assert_eq!(o.rig.u32(0), 0x1234_5678);
        assert_eq!(o.rig.u32(4), 9);
    }
    // The long NOP really is one packet of 4000 dwords.
    let mut cb = CommandBuffer::new();
    cb.nop(4000);
    assert_eq!(cb.len(), 4000);
    assert_eq!(cb.words()[0], Header::new(Opcode::Nop, 4000).0);
}

#[test]
fn write_data_32_and_64() {
    let outs = run_both(|r| {
        r.c.buf.write(0, &[0xff; 64]).unwrap();
        let mut cb = CommandBuffer::new();
        cb.write_u32(r.va(0), 0xdead_beef)
            .write_u64(r.va(8), 0x0123_4567_89ab_cdef)
            .write_u64(r.va(16), u64::MAX)
            .write_u32(r.va(28), 0)
            // A 32-bit write stores only the low half of the value field.
            .packet(Packet::WriteData { width: DataWidth::U32, va: r.va(32), value: 0xaaaa_bbbb_0000_0001 });
        cb
    });
    for o in &outs {
        ok(o);
        let r = &o.rig;
        assert_eq!(r.u32(0), 0xdead_beef);
        assert_eq!(r.u32(4), 0xffff_ffff, "a 32-bit write touches 4 bytes only");
        assert_eq!(r.u64(8), 0x0123_4567_89ab_cdef);
        assert_eq!(r.u64(16), u64::MAX);
        assert_eq!(r.u32(24), 0xffff_ffff);
        assert_eq!(r.u32(28), 0);
        assert_eq!(r.u32(32), 1);
        assert_eq!(r.u32(36), 0xffff_ffff);
    }
}

/// memmove on a model of the buffer.
fn model_copy(m: &mut [u8], src: usize, dst: usize, n: usize) {
    m.copy_within(src..src + n, dst);
}

#[test]
fn copy_plain_unaligned_overlapping_and_empty() {
    let init: Vec<u8> = (0..0x6000u32).map(|i| (i * 7 + 3) as u8).collect();
    let copies: [(u64, u64, u64); 6] = [
        (0x0000, 0x8000, 256),      // plain
        (0x0103, 0x9001, 7),        // unaligned, odd length
        (0x1000, 0x1010, 100),      // overlapping, dst after src (must copy backwards)
        (0x2010, 0x2000, 100),      // overlapping, dst before src
        (0x3000, 0x3000 + 1, 4097), // overlapping by all but one byte, over a page boundary
        (0x4000, 0xa000, 0),        // zero bytes: nothing changes
    ];
    let outs = run_both(|r| {
        r.c.buf.write(0, &init).unwrap();
        let mut cb = CommandBuffer::new();
        for (s, d, n) in copies {
            cb.copy(r.va(s), r.va(d), n);
        }
        cb
    });
    let mut model = vec![0u8; 0xb000];
    model[..init.len()].copy_from_slice(&init);
    for (s, d, n) in copies {
        model_copy(&mut model, s as usize, d as usize, n as usize);
    }
    for o in &outs {
        ok(o);
        assert!(o.rig.bytes(0, model.len()) == model, "{:?}: COPY results differ from memmove", o.rig.q.kind());
        assert_eq!(o.rig.u64(0xa000), 0, "a 0-byte COPY writes nothing");
    }
}

#[test]
fn fill_odd_length_unaligned_start_keeps_pattern_phase() {
    let pattern = 0x4433_2211u32;
    let outs = run_both(|r| {
        r.c.buf.write(0, &[0xee; 0x3000]).unwrap();
        let mut cb = CommandBuffer::new();
        cb.fill(r.va(0x103), 7, pattern) // unaligned start, odd length
            .fill(r.va(0x200), 4096, 0xa5a5_0f0f) // whole words, over a page boundary
            .fill(r.va(0x2001), 0, 0x1234_5678) // zero bytes
            .fill(r.va(0x2102), 6, 0xddcc_bbaa);
        cb
    });
    for o in &outs {
        ok(o);
        let r = &o.rig;
        // The pattern's byte 0 lands on the first byte filled, whatever its alignment.
        assert_eq!(r.bytes(0x102, 9), [0xee, 0x11, 0x22, 0x33, 0x44, 0x11, 0x22, 0x33, 0xee]);
        let big = r.bytes(0x200, 4096);
        assert!(big.chunks(4).all(|c| c == [0x0f, 0x0f, 0xa5, 0xa5]));
        assert_eq!(r.bytes(0x1200, 1), [0xee]);
        assert_eq!(r.bytes(0x2000, 3), [0xee; 3], "a 0-byte FILL writes nothing");
        assert_eq!(r.bytes(0x2101, 8), [0xee, 0xaa, 0xbb, 0xcc, 0xdd, 0xaa, 0xbb, 0xee]);
    }
}

#[test]
fn timestamp_writes_the_sim_clock_at_execution() {
    let outs = run_both(|r| {
        r.sys.advance(Duration::from_millis(3));
        let mut cb = CommandBuffer::new();
        cb.timestamp(r.va(0)).write_u32(r.va(12), 1).timestamp(r.va(16));
        cb
    });
    for mut o in outs {
        ok(&o);
        let r = &mut o.rig;
        let start = 3_000_000;
        assert_eq!(r.u64(0), start, "TIMESTAMP is the device clock when it executed");
        // Device time: the two packets before the second TIMESTAMP occupy the engine for
        // their modelled cost, and TIMESTAMP reads the time at which its packet starts.
        let packet = gpu::CostModel::default().packet.as_nanos() as u64;
        assert_eq!(r.u64(16), start + 2 * packet, "a step's packets take device time");
        // The wait ended when the progress fence's interrupt reached the kernel: at the end
        // of the fence packet, the fourth (with no interrupt delivery cost).
        assert_eq!(r.sys.now().as_nanos(), start + 4 * packet);
        // Later, past the idle period (the engine goes to F1 and back): still the clock, and
        // monotonic.
        r.sys.advance(Duration::from_millis(25));
        let submitted = r.sys.now().as_nanos();
        assert_eq!(submitted, start + 4 * packet + 25_000_000);
        let mut cb = CommandBuffer::new();
        cb.timestamp(r.va(24));
        let (_, res) = r.run(&cb);
        res.unwrap();
        let later = r.u64(24);
        assert_eq!(later, submitted);
        assert_eq!(r.sys.now().as_nanos(), later + 2 * packet, "the wait ends with the fence packet");
        assert!(later > r.u64(0));
    }
}

/// Encodes a command buffer into the client buffer at `off`; returns its VA and length.
fn place(r: &Rig, off: u64, cb: &CommandBuffer) -> (u64, u32) {
    r.c.buf.map().write_u32s(off, cb.words()).unwrap();
    (r.va(off), cb.len() as u32)
}

#[test]
fn indirect_buffer_runs_then_returns_to_the_ring() {
    let outs = run_both(|r| {
        let mut ib = CommandBuffer::new();
        ib.write_u32(r.va(0x100), 7).fill(r.va(0x200), 16, 0xabab_abab).nop(3).signal(r.va(0x300), 9);
        let (ib_va, ib_len) = place(r, 0x8000, &ib);
        let mut cb = CommandBuffer::new();
        cb.write_u32(r.va(0x104), 1)
            .indirect(ib_va, ib_len)
            .indirect(ib_va, 0) // an empty indirect buffer is a no-op
            .write_u32(r.va(0x108), 2)
            .indirect(ib_va, ib_len); // and it can run again
        cb
    });
    for o in &outs {
        ok(o);
        let r = &o.rig;
        assert_eq!(r.u32(0x100), 7);
        assert_eq!(r.u32(0x104), 1);
        assert_eq!(r.u32(0x108), 2, "the ring continues after the indirect buffer");
        assert_eq!(r.bytes(0x200, 16), [0xab; 16]);
        assert_eq!(r.u64(0x300), 9);
    }
}

#[test]
fn nested_indirect_buffer_faults_the_queue() {
    let outs = run_both(|r| {
        let mut inner = CommandBuffer::new();
        inner.write_u32(r.va(0x400), 0xbad);
        let (in_va, in_len) = place(r, 0x9000, &inner);
        let mut outer = CommandBuffer::new();
        outer.write_u32(r.va(0x100), 1).indirect(in_va, in_len).write_u32(r.va(0x104), 0xbad);
        let (out_va, out_len) = place(r, 0x8000, &outer);
        let mut cb = CommandBuffer::new();
        cb.write_u32(r.va(0x108), 3).indirect(out_va, out_len).write_u32(r.va(0x10c), 0xbad);
        cb
    });
    for o in &outs {
        let r = &o.rig;
        assert!(matches!(o.result, Err(UmdError::QueueLost { .. })), "{:?}", o.result);
        let st = r.q.status().unwrap();
        assert_eq!(st.state, QueueState::Hung);
        let f = st.fault.expect("fault recorded");
        assert!(matches!(f.kind, FaultKind::BadIndirect { why } if why.contains("may not contain another")), "{f}");
        assert_eq!(f.opcode, Some(Opcode::IndirectBuffer));
        assert!(f.in_indirect);
        assert!(st.completed < o.value);
        // Everything before the nested packet ran; nothing after it did.
        assert_eq!(r.u32(0x108), 3);
        assert_eq!(r.u32(0x100), 1);
        assert_eq!(r.u32(0x400), 0);
        assert_eq!(r.u32(0x104), 0);
        assert_eq!(r.u32(0x10c), 0);
    }
}

#[test]
fn signal_stores_64_bits() {
    let outs = run_both(|r| {
        r.c.buf.write(0, &[0xff; 32]).unwrap();
        let mut cb = CommandBuffer::new();
        cb.signal(r.va(8), 0xfeed_0000_0000_0001).signal(r.va(16), 0).signal(r.va(16), 5);
        cb
    });
    for o in &outs {
        ok(o);
        assert_eq!(o.rig.u64(0), u64::MAX);
        assert_eq!(o.rig.u64(8), 0xfeed_0000_0000_0001);
        assert_eq!(o.rig.u64(16), 5, "the last SIGNAL wins");
        assert_eq!(o.rig.u64(24), u64::MAX);
    }
}

#[test]
fn wait_already_satisfied_passes_through() {
    let outs = run_both(|r| {
        r.c.buf.write_u64(0, 5).unwrap();
        let mut cb = CommandBuffer::new();
        cb.wait(r.va(0), 5).write_u32(r.va(8), 1).wait(r.va(0), 0).write_u32(r.va(12), 2);
        cb
    });
    for o in &outs {
        ok(o);
        assert_eq!((o.rig.u32(8), o.rig.u32(12)), (1, 2));
    }
}

/// Queue A (compute, user- or kernel-mode) WAITs on a semaphore that queue B (copy engine,
/// user-mode) SIGNALs later. Nothing after A's WAIT may run before B's signal, and the
/// hand-off needs no CPU interrupt.
#[test]
fn wait_on_another_engines_signal_resumes_without_the_cpu() {
    for kind in KINDS {
        let sys = common::sim();
        let c = common::client(&sys);
        let copy_ctx = c.context(EngineKind::Copy);
        assert_ne!(copy_ctx.engine(), c.ctx.engine());
        let mut a = c.ctx.create_queue(QueueOptions { kind, ..QueueOptions::default() }).unwrap();
        let mut b = copy_ctx.create_queue(QueueOptions::user_mode()).unwrap();
        let va = |off| c.buf.va() + off;
        let (sem, data, out, flag) = (0u64, 0x10u64, 0x20u64, 0x30u64);

        let mut cb = CommandBuffer::new();
        cb.wait(va(sem), 1).copy(va(data), va(out), 8).write_u32(va(flag), 1);
        let va_a = a.submit(&cb).unwrap();
        for _ in 0..64 {
            sys.step();
        }
        assert_eq!(c.buf.read_u32(flag).unwrap(), 0, "{kind:?}: A ran past its WAIT before the signal");
        assert_eq!(c.buf.read_u64(out).unwrap(), 0);
        assert!(a.completed() < va_a);
        assert_eq!(a.status().unwrap().state, QueueState::Mapped, "a blocked queue is not a faulted one");

        let mut cb = CommandBuffer::new();
        cb.write_u64(va(data), 0x0b0b_0b0b_0b0b).signal(va(sem), 1);
        let va_b = b.submit(&cb).unwrap();
        sys.settle();
        assert_eq!(b.completed(), va_b);
        assert_eq!(a.completed(), va_a, "{kind:?}: A resumed after B's signal");
        assert_eq!(c.buf.read_u64(out).unwrap(), 0x0b0b_0b0b_0b0b, "A's COPY saw B's data: it ran after the signal");
        assert_eq!(c.buf.read_u32(flag).unwrap(), 1);
        let st = sys.stats();
        assert_eq!(st.interrupts, 0, "{kind:?}: the engine-to-engine wait needed no CPU interrupt: {st:?}");
        a.wait(va_a, T).unwrap();
        b.wait(va_b, T).unwrap();
    }
}

#[test]
fn progress_fence_is_appended_and_completes_in_order() {
    for kind in KINDS {
        let sys = common::sim();
        let tap = common::TapPort::open(&sys);
        let c = common::client_on(tap.clone());
        let mut q = c.ctx.create_queue(QueueOptions { kind, ..QueueOptions::default() }).unwrap();
        let empty = CommandBuffer::new();
        let mut cb = CommandBuffer::new();
        cb.write_u32(c.buf.va(), 1);
        let vals = [q.submit(&empty).unwrap(), q.submit(&cb).unwrap(), q.submit(&empty).unwrap()];
        assert_eq!(vals, [1, 2, 3], "{kind:?}: progress values are 1, 2, 3");
        assert_eq!(q.last_submitted(), 3);
        assert_eq!(q.completed(), 0, "{kind:?}: nothing runs on the sim until it is stepped");
        if kind == SubmissionKind::UserMode {
            // The UMD ended each command buffer with PROGRESS_FENCE N+1: the last 3 dwords
            // before wptr are the fence for 3.
            let t = tap.queue(q.handle());
            let w = t.wptr();
            assert_eq!(t.read_ring(w - 12, 3), progress_fence_words(3));
            assert_eq!(t.last_queued(), 3);
        }
        sys.settle();
        assert_eq!(q.completed(), 3, "{kind:?}");
        assert_eq!(c.buf.read_u32(0).unwrap(), 1);
        let st = q.status().unwrap();
        assert_eq!((st.completed, st.last_queued, st.state), (3, 3, QueueState::Mapped), "{kind:?}: {st:?}");
        q.finish(T).unwrap();
    }
}

#[test]
fn interrupt_reaches_the_kernel_with_its_id() {
    let outs = run_both(|r| {
        let mut cb = CommandBuffer::new();
        cb.interrupt(42).write_u32(r.va(0), 1).interrupt(7);
        cb
    });
    for o in &outs {
        ok(o);
        let r = &o.rig;
        assert_eq!(r.sys.stats().user_interrupts, 2);
        let ids: Vec<u32> = common::events(&r.sys)
            .into_iter()
            .filter_map(|e| match e {
                Event::UserInterrupt { queue, id } if queue == r.q.handle() => Some(id),
                _ => None,
            })
            .collect();
        assert_eq!(ids, [42, 7], "{:?}", r.q.kind());
    }
}

/// One stream with every opcode, on both paths.
#[test]
fn every_packet_in_one_stream() {
    let outs = run_both(|r| {
        r.sys.advance(Duration::from_millis(1));
        r.c.buf.write_u64(0x40, 11).unwrap();
        r.c.buf.write(0x100, b"doorbell").unwrap();
        let mut ib = CommandBuffer::new();
        ib.write_u64(r.va(0x60), 0x1b);
        let (ib_va, ib_len) = place(r, 0x8000, &ib);
        let mut cb = CommandBuffer::new();
        cb.nop(5)
            .write_u32(r.va(0), 0x3232)
            .write_u64(r.va(8), 0x6464_6464_6464)
            .copy(r.va(0x100), r.va(0x110), 8)
            .fill(r.va(0x120), 5, 0x0403_0201)
            .timestamp(r.va(0x18))
            .indirect(ib_va, ib_len)
            .signal(r.va(0x20), 0x5151)
            .wait(r.va(0x40), 11)
            .interrupt(1);
        cb
    });
    for o in &outs {
        ok(o);
        let r = &o.rig;
        assert_eq!(r.u32(0), 0x3232);
        assert_eq!(r.u64(8), 0x6464_6464_6464);
        assert_eq!(&r.bytes(0x110, 8), b"doorbell");
        assert_eq!(r.bytes(0x120, 6), [1, 2, 3, 4, 1, 0]);
        // Five packets before the TIMESTAMP, two of them moving bytes (device time).
        let cost = gpu::CostModel::default();
        assert_eq!(r.u64(0x18), 1_000_000 + 5 * cost.packet.as_nanos() as u64 + cost.bulk_ns(8) + cost.bulk_ns(5));
        assert_eq!(r.u64(0x60), 0x1b);
        assert_eq!(r.u64(0x20), 0x5151);
        assert_eq!(r.sys.stats().user_interrupts, 1);
        if r.q.kind() == SubmissionKind::UserMode {
            assert_eq!(r.q.doorbell_status().unwrap(), DoorbellStatus::Connected);
        }
    }
}

/// A WAIT that nothing satisfies: the CPU's wait on that queue times out in virtual time
/// (the blocked queue is not progress), and a later store from the CPU releases it.
#[test]
fn unsatisfied_wait_times_out_then_a_cpu_store_releases_it() {
    for kind in KINDS {
        let mut r = Rig::new(kind);
        let mut cb = CommandBuffer::new();
        cb.wait(r.va(0), 1).write_u32(r.va(8), 0x77);
        let v = r.q.submit(&cb).unwrap();
        let t0 = r.sys.now();
        match r.q.wait(v, Some(Duration::from_millis(5))) {
            Err(UmdError::Timeout { value, completed, .. }) => assert_eq!((value, completed), (v, 0), "{kind:?}"),
            other => panic!("{kind:?}: expected a timeout, got {other:?}"),
        }
        assert!(r.sys.now().since(t0) >= Duration::from_millis(5), "{kind:?}: the timeout is virtual time");
        assert_eq!(r.u32(8), 0);
        assert_eq!(r.q.status().unwrap().state, QueueState::Mapped);
        r.c.buf.write_u64(0, 1).unwrap();
        r.q.wait(v, T).unwrap();
        assert_eq!(r.u32(8), 0x77, "{kind:?}");
    }
}
