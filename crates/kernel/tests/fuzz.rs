//! Property test: random packet streams in one process's queue.
//!
//! Process A's user-mode queue (a 4 KiB ring, so streams wrap often) gets random dwords —
//! uniformly random words mixed with valid packet headers and with halves of addresses inside
//! A's buffer — as raw command buffers through the UMD, or written straight into its ring
//! followed by a wptr store (exact, off by a little, or far off) and a doorbell ring.
//! Meanwhile process B's queue, on the same engine, does checked `WRITE_DATA`/`COPY` work.
//!
//! Properties: the device never panics (the sim runs in the test thread); B's results are
//! always right and B never faults; A's queue is either still Mapped (and then, if only the
//! UMD wrote its ring, everything it submitted completed) or Hung with a fault record, an
//! aborted doorbell and the Hung state word.

mod common;

use abi::packet::{DataWidth, Header, Opcode, Packet};
use abi::{DoorbellStatus, QueueState};
use kernel::trace::Event;
use proptest::prelude::*;
use umd::{CommandBuffer, QueueOptions, UmdError};

use common::{T, TapPort};

/// One dword, resolved against A's buffer address when the case runs.
#[derive(Clone, Debug)]
enum Tok {
    Any(u32),
    /// A version-1 header with this opcode and length (possibly the wrong length).
    Hdr(u8, u16),
    /// A well-formed header for this opcode.
    Valid(u8),
    /// Low half of A's buffer VA + offset.
    VaLo(u32),
    /// High half of A's buffer VA.
    VaHi,
    Small(u8),
    /// A whole well-formed packet: (kind, offset, offset, count, value), addresses inside or
    /// just past A's buffer.
    Packet(u8, u32, u32, u32, u64),
}

#[derive(Clone, Debug)]
enum WptrMove {
    /// Exactly past the words written.
    Exact,
    /// Past the words, then off by this many bytes (possibly not a dword).
    Off(i16),
    /// Anywhere ahead.
    Jump(u32),
}

#[derive(Clone, Debug)]
enum Act {
    /// A raw command buffer through the UMD (which appends its progress fence).
    Raw(Vec<Tok>),
    /// Words straight into the ring at the current wptr word, a wptr store and a ring.
    Direct(Vec<Tok>, WptrMove),
    /// Let the world run a few steps.
    Step(u8),
    /// Checked work on process B's queue.
    Good(u32),
}

/// Opcodes whose headers are generated, minus `WAIT` (7): a random `WAIT` on a mapped
/// address blocks the queue forever, which is legal and neither completed nor hung.
const OPS: [u8; 10] = [0, 1, 2, 3, 4, 5, 6, 8, 9, 10];

fn tok() -> impl Strategy<Value = Tok> {
    prop_oneof![
        2 => any::<u32>().prop_map(Tok::Any),
        2 => (prop::sample::select(OPS.to_vec()), 0u16..12).prop_map(|(o, l)| Tok::Hdr(o, l)),
        3 => prop::sample::select(OPS.to_vec()).prop_map(Tok::Valid),
        6 => packet(),
        2 => (0u32..(1 << 20) + 8192).prop_map(Tok::VaLo),
        2 => Just(Tok::VaHi),
        2 => (0u8..=16).prop_map(Tok::Small),
    ]
}

fn packet() -> impl Strategy<Value = Tok> {
    (0u8..10, 0u32..(1 << 20) + 8192, 0u32..(1 << 20) + 8192, 0u32..8192, any::<u64>())
        .prop_map(|(k, a, b, n, v)| Tok::Packet(k, a, b, n, v))
}

fn act() -> impl Strategy<Value = Act> {
    let mv = prop_oneof![
        4 => Just(WptrMove::Exact),
        1 => (-64i16..64).prop_map(WptrMove::Off),
        1 => any::<u32>().prop_map(WptrMove::Jump),
    ];
    prop_oneof![
        3 => prop::collection::vec(tok(), 1..40).prop_map(Act::Raw),
        2 => prop::collection::vec(packet(), 1..12).prop_map(Act::Raw),
        2 => (prop::collection::vec(tok(), 0..40), mv).prop_map(|(t, m)| Act::Direct(t, m)),
        2 => (1u8..8).prop_map(Act::Step),
        3 => any::<u32>().prop_map(Act::Good),
    ]
}

fn resolve(toks: &[Tok], va: u64) -> Vec<u32> {
    let mut out = Vec::new();
    for t in toks {
        let w = match *t {
            Tok::Any(w) => w,
            Tok::Hdr(op, len) => Header(len as u32 | (op as u32) << 16 | 1 << 24).0,
            Tok::Valid(op) => {
                let op = Opcode::from_u8(op).expect("listed opcode");
                Header::new(op, op.fixed_dwords().unwrap_or(1) as u16).0
            }
            Tok::VaLo(off) => (va + off as u64) as u32,
            Tok::VaHi => (va >> 32) as u32,
            Tok::Small(v) => v as u32,
            Tok::Packet(kind, a, b, n, v) => {
                // Mostly aligned addresses, so that most packets execute.
                let (a, b) = if v & 1 == 0 { (a & !7, b & !7) } else { (a, b) };
                let (a, b, n64) = (va + a as u64, va + b as u64, n as u64 % 4096);
                let p = match kind {
                    0 => Packet::Nop { dwords: (n % 8 + 1) as u16 },
                    1 => Packet::WriteData { width: DataWidth::U32, va: a, value: v },
                    2 => Packet::WriteData { width: DataWidth::U64, va: a, value: v },
                    3 => Packet::Copy { src: a, dst: b, bytes: n64 },
                    4 => Packet::Fill { dst: a, bytes: n64, pattern: v as u32 },
                    5 => Packet::Timestamp { va: a },
                    6 => Packet::Signal { va: a, value: v },
                    7 => Packet::Interrupt { id: v as u32 },
                    8 => Packet::IndirectBuffer { va: a, dwords: n % 64, vmid: 0 },
                    _ => Packet::ProgressFence { value: v % 4 },
                };
                p.encode(&mut out);
                continue;
            }
        };
        out.push(w);
    }
    out
}

fn run(acts: Vec<Act>) {
    let sys = common::sim();
    let tap = TapPort::open(&sys);
    let a = common::client_on(tap.clone());
    let b = common::client(&sys);
    let mut qa = a.ctx.create_queue(QueueOptions { ring_bytes: 4096, ..QueueOptions::user_mode() }).unwrap();
    let mut qb = b.user_queue();
    assert_eq!(qa.engine(), qb.engine());
    let t = tap.queue(qa.handle());
    let mut direct = false;
    let mut good = Vec::new();

    for act in acts {
        match act {
            Act::Raw(toks) => {
                let mut cb = CommandBuffer::new();
                cb.raw(&resolve(&toks, a.buf.va()));
                match qa.submit(&cb) {
                    Ok(_) | Err(UmdError::QueueLost { .. }) => {}
                    // Only after the ring was scribbled on by hand can the UMD's own view of
                    // its queue be wrong.
                    Err(UmdError::Corrupt { .. } | UmdError::Timeout { .. }) if direct => {}
                    Err(e) => panic!("submit on the fuzzed queue: {e}"),
                }
            }
            Act::Direct(toks, mv) => {
                direct = true;
                let words = resolve(&toks, a.buf.va());
                let w = t.wptr();
                for (i, word) in words.iter().enumerate() {
                    t.write_ring(w.wrapping_add(4 * i as u64) & !3, &[*word]);
                }
                let end = w.wrapping_add(4 * words.len() as u64);
                let new = match mv {
                    WptrMove::Exact => end,
                    WptrMove::Off(d) => end.wrapping_add_signed(d as i64),
                    WptrMove::Jump(x) => w.wrapping_add(x as u64),
                };
                t.set_wptr(new);
                t.ring_doorbell(new ^ 0x8000_0000_0000_0000);
            }
            Act::Step(n) => {
                for _ in 0..n {
                    sys.step();
                }
            }
            Act::Good(salt) => {
                let k = good.len() as u64;
                let va = b.buf.va() + 64 * k;
                let mut cb = CommandBuffer::new();
                cb.write_u32(va, salt).write_u64(va + 8, !(salt as u64)).copy(va, va + 32, 16);
                good.push((k, salt, qb.submit(&cb).unwrap()));
            }
        }
    }
    sys.settle();

    // B: always right.
    for &(k, salt, v) in &good {
        qb.wait(v, T).unwrap();
        let off = 64 * k;
        assert_eq!(b.buf.read_u32(off).unwrap(), salt);
        assert_eq!(b.buf.read_u64(off + 8).unwrap(), !(salt as u64));
        assert_eq!(b.buf.read_u32(off + 32).unwrap(), salt);
        assert_eq!(b.buf.read_u64(off + 40).unwrap(), !(salt as u64));
    }
    let sb = qb.status().unwrap();
    assert_eq!((sb.state, sb.fault), (QueueState::Mapped, None));
    assert!(qb.doorbell_status().unwrap().is_connected());
    let mut cb = CommandBuffer::new();
    cb.write_u32(b.buf.va() + 0xf_0000, 0xb);
    let v = qb.submit(&cb).unwrap();
    qb.wait(v, T).unwrap();
    assert_eq!(b.buf.read_u32(0xf_0000).unwrap(), 0xb);

    // A: completed, or hung and reported.
    let sa = qa.status().unwrap();
    match sa.state {
        QueueState::Hung => {
            let f = sa.fault.expect("a hung queue has a fault record");
            assert_eq!(qa.doorbell_status().unwrap(), DoorbellStatus::DisconnectedAbort, "{f}");
            assert_eq!(t.state_word(), QueueState::Hung as u64);
        }
        QueueState::Mapped => {
            assert_eq!(sa.fault, None);
            // A healthy queue consumed its whole ring. (Its progress value may still lag: a
            // malformed-but-legal stream, such as a NOP whose length swallows the UMD's own
            // PROGRESS_FENCE, runs without a fault and without advancing it.)
            if !direct {
                assert_eq!(t.rptr(), t.wptr(), "a healthy queue ran everything (completed {})", sa.completed);
            }
        }
        other => panic!("fuzzed queue in state {other:?}"),
    }
    let faults: Vec<_> = common::events(&sys)
        .into_iter()
        .filter_map(|e| match e {
            Event::QueueFault { queue, .. } => Some(queue),
            _ => None,
        })
        .collect();
    assert!(faults.iter().all(|q| *q == qa.handle()), "only A's queue faults: {faults:?}");
    assert!(faults.len() <= 1);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_streams_hang_only_their_own_queue(acts in prop::collection::vec(act(), 1..10)) {
        run(acts);
    }
}
