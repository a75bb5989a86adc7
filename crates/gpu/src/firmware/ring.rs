//! Ring fetching: where a queue's ring and protocol words are ([`Place`], resolved once when
//! the queue is added), and the command processor's fetch buffer ([`FetchWindow`]): published
//! ring words are read from client memory once, in runs, and every packet is decoded from
//! there; indirect buffers are decoded from their mapping ([`fetch_indirect`]).
//!
//! Invariant: only published words are fetched (below the wptr the firmware validated), never
//! past the ring's end; a packet that does not decode is a typed [`FaultKind`].

use std::sync::Arc;

use abi::packet::{Header, MAX_FIXED_PACKET_DWORDS, Opcode, Packet};
use abi::queue::{Access, FaultKind};
use shm::{Mapping, Shm, Word};

use crate::memory::AddressSpace;

use super::exec::outside;
use super::queue::{FwQueue, IbCursor};

/// A region and an offset in it, resolved once when the queue is added.
#[derive(Clone)]
pub(super) struct Place {
    pub(super) shm: Arc<Shm>,
    pub(super) offset: u64,
}

impl Place {
    pub(super) fn resolve(vm: &AddressSpace, va: u64, bytes: u64, access: Access) -> Result<Place, FaultKind> {
        vm.translate(va, bytes, access)?;
        let m = vm.find(va).ok_or(FaultKind::OutsideMappings { va, bytes, access })?;
        Ok(Place { shm: m.shm.clone(), offset: m.offset + (va - m.va) })
    }

    /// The protocol word at `va` (a queue's rptr, wptr or last-queued value): 8-aligned and
    /// inside one mapping the queue may reach with `access`, checked here, once.
    pub(super) fn word_at(vm: &AddressSpace, va: u64, access: Access) -> Result<Word, FaultKind> {
        let misaligned = FaultKind::Misaligned { va, align: 8, access };
        if !va.is_multiple_of(8) {
            return Err(misaligned);
        }
        let p = Place::resolve(vm, va, 8, access)?;
        Word::new(&p.shm, p.offset).map_err(|_| misaligned)
    }
}

/// Dwords the command processor fetches from a ring at once ([`FetchWindow`]): 256 bytes, four
/// cache lines.
const FETCH_DWORDS: usize = 64;

/// The command processor's fetch buffer for one turn of one queue: published ring words, read
/// from client memory once, in runs of up to [`FETCH_DWORDS`], and decoded from here, so a
/// packet costs no access to the ring of its own. Keyed by ring pointer: pointers are
/// monotonic byte counts that never repeat, so a word fetched for a pointer stays that
/// pointer's word for the turn. Only published words are fetched (below the wptr the firmware
/// validated), never past the ring's end.
pub(super) struct FetchWindow {
    /// The words, and room after them for the longest fixed packet, so that every fixed
    /// packet in the window is decoded from one fixed-size view.
    words: [u32; FETCH_DWORDS + MAX_FIXED_PACKET_DWORDS],
    /// Ring pointer of `words[0]`.
    start: u64,
    /// Words fetched.
    len: usize,
}

impl FetchWindow {
    /// An empty window: the first packet fetches.
    pub(super) fn new() -> FetchWindow {
        FetchWindow { words: [0; FETCH_DWORDS + MAX_FIXED_PACKET_DWORDS], start: 0, len: 0 }
    }

    /// Empties the window, for another queue's turn (its words stay, unread).
    pub(super) fn clear(&mut self) {
        self.len = 0;
    }

    /// Where `q`'s rptr is in the window, fetching from rptr on if it is not there, or if
    /// fewer than `need` words from it are.
    fn at(&mut self, q: &FwQueue, need: usize) -> Result<usize, (FaultKind, Option<Opcode>)> {
        let at = q.ring.rptr.wrapping_sub(self.start) / 4;
        if q.ring.rptr >= self.start && at + need as u64 <= self.len as u64 {
            return Ok(at as usize);
        }
        let ring_bytes = q.cfg.ring_bytes;
        let off = q.ring.rptr & (ring_bytes - 1);
        // Published words from rptr on, up to wptr and the ring's end (rptr < wptr here).
        let n = ((q.ring.wptr - q.ring.rptr).min(ring_bytes - off) / 4).min(FETCH_DWORDS as u64) as usize;
        q.ring
            .mem
            .shm
            .read_u32s(q.ring.mem.offset + off, &mut self.words[..n])
            .map_err(|_| (outside(q.cfg.ring_va + off, n as u64 * 4), None))?;
        self.start = q.ring.rptr;
        self.len = n;
        Ok(0)
    }

    /// Fetches and decodes the packet at `q`'s rptr (which is below its wptr): its header,
    /// checked, then the rest of it.
    pub(super) fn fetch(&mut self, q: &FwQueue) -> Result<(Packet, usize), (FaultKind, Option<Opcode>)> {
        let at = self.at(q, 1)?;
        let header = Header(self.words[at]);
        let op = header.check().map_err(|e| (FaultKind::BadPacket(e), None))?;
        let ring_bytes = q.cfg.ring_bytes;
        let off = q.ring.rptr & (ring_bytes - 1);
        let n = header.dwords();
        let bytes = n as u64 * 4;
        if off + bytes > ring_bytes {
            return Err((FaultKind::PastRingEnd { offset: off, dwords: n as u64, ring_bytes }, Some(op)));
        }
        if q.ring.rptr.checked_add(bytes).is_none_or(|end| end > q.ring.wptr) {
            return Err((FaultKind::PastWptr { rptr: q.ring.rptr, dwords: n as u64, wptr: q.ring.wptr }, Some(op)));
        }
        if op == Opcode::Nop {
            return Ok((Packet::Nop { dwords: n as u16 }, n));
        }
        // A fixed packet: at most MAX_FIXED_PACKET_DWORDS (`Header::check`), all published
        // (checked above). If it runs past the window, the window moves to it. The header is
        // not decoded again: the device decodes the header it checked.
        let at = if at + n <= self.len { at } else { self.at(q, n)? };
        let w = self.words[at..].first_chunk().expect("the window has room for a fixed packet after any word");
        Packet::decode_fixed(header, op, w).map_err(|e| (FaultKind::BadPacket(e), Some(op)))
    }
}

/// Fetches and decodes the next packet of an indirect buffer.
pub(super) fn fetch_indirect(vm: &AddressSpace, ib: &IbCursor) -> Result<(Packet, usize), FaultKind> {
    let va = ib.va + ib.pos as u64 * 4;
    let r = vm.translate(va, 4, Access::Read)?;
    let header = Header(r.shm.read_u32(r.offset).map_err(|_| outside(va, 4))?);
    let op = header.check().map_err(FaultKind::BadPacket)?;
    let n = header.dwords();
    let have = (ib.dwords - ib.pos) as usize;
    if n > have {
        return Err(FaultKind::BadPacket(abi::packet::DecodeError::Truncated { need: n, have }));
    }
    let r = vm.translate(va, n as u64 * 4, Access::Read)?;
    read_body(r.shm, r.offset, header, op)
}

/// Reads the rest of the packet whose header, read and checked already, is at `offset` of
/// `m`, and decodes it. The header is not read again: the device decodes what it checked,
/// whatever shared memory holds by now.
pub(super) fn read_body(m: &Mapping, offset: u64, header: Header, op: Opcode) -> Result<(Packet, usize), FaultKind> {
    let n = header.dwords();
    if op == Opcode::Nop {
        return Ok((Packet::Nop { dwords: n as u16 }, n));
    }
    // Fixed-size packets are at most MAX_FIXED_PACKET_DWORDS long (checked by `Header::check`).
    let mut buf = [0u32; MAX_FIXED_PACKET_DWORDS];
    let body = &mut buf[1..n.min(MAX_FIXED_PACKET_DWORDS)];
    m.read_u32s(offset + 4, body).map_err(|_| outside(offset, n as u64 * 4))?;
    Packet::decode_fixed(header, op, &buf).map_err(FaultKind::BadPacket)
}
