//! The ring buffer and its control block.
//!
//! A user-mode queue's work queue is a ring of `size` bytes (a power of two, at least
//! [`MIN_RING_BYTES`]) plus a control block. Pointers are **monotonic byte counts**, never
//! wrapped: the byte at pointer `p` lives at ring offset `p % size`. So:
//!
//! - the queue is idle when `rptr == wptr`;
//! - the bytes in flight are `wptr - rptr`, never more than `size`;
//! - a doorbell value (the wptr the client rang with) is never repeated, so a stale value can
//!   never look like new work.
//!
//! The control block keeps each writer's words on a cache line of their own: the engine's
//! `rptr` on one, the client's `wptr` and `last_queued` together on the next (the client writes
//! both for every submission and the firmware reads both after every ring, so one line moves
//! between them per submission, not two):
//!
//! | offset | field         | writer                 | readers                                          |
//! |--------|---------------|------------------------|--------------------------------------------------|
//! | 0      | `rptr`        | firmware (release)     | UMD, for ring space                              |
//! | 64     | `wptr`        | UMD (release)          | firmware (acquire)                               |
//! | 72     | `last_queued` | UMD (release)          | firmware, kernel (termination, idle detection)   |
//!
//! `last_queued` is the spec's `HwQueueProgressFenceLastQueuedValueCPUVirtualAddress`
//! (spec 000 "HW queue progress fence changes"). Packets never straddle the end of the ring: a
//! writer that reaches the end pads it with one `NOP` and continues at offset 0.

use core::mem::{offset_of, size_of};
use core::sync::atomic::AtomicU64;

/// Smallest ring (amdgpu: 4 KiB).
pub const MIN_RING_BYTES: u64 = 4096;
/// Largest ring this device accepts (a packet length is 16 bits; 16 MiB is plenty).
pub const MAX_RING_BYTES: u64 = 16 << 20;

/// A 64-bit word alone on its 64-byte cache line, so that words with different writers never
/// share a line (no false sharing between the client and the engine).
#[repr(C, align(64))]
pub struct CacheLine(pub AtomicU64);

const _: () = assert!(size_of::<CacheLine>() == 64);

/// The client's two words, on one cache line of their own: the client writes both for every
/// submission (last-queued, then wptr) and the firmware reads both after every ring, so one
/// line moves between them instead of two.
#[repr(C, align(64))]
pub struct ClientLine {
    /// Write pointer: bytes published by the client.
    pub wptr: AtomicU64,
    /// Last queued progress-fence value.
    pub last_queued: AtomicU64,
}

/// The ring control block in shared memory.
#[repr(C)]
pub struct RingControl {
    /// Read pointer: bytes consumed by the engine.
    pub rptr: CacheLine,
    /// What the client publishes.
    pub client: ClientLine,
}

/// Offset of `rptr` in [`RingControl`].
pub const RPTR_OFFSET: u64 = offset_of!(RingControl, rptr) as u64;
/// Offset of `wptr` in [`RingControl`].
pub const WPTR_OFFSET: u64 = (offset_of!(RingControl, client) + offset_of!(ClientLine, wptr)) as u64;
/// Offset of `last_queued` in [`RingControl`].
pub const LAST_QUEUED_OFFSET: u64 = (offset_of!(RingControl, client) + offset_of!(ClientLine, last_queued)) as u64;
/// Size of [`RingControl`].
pub const RING_CONTROL_BYTES: u64 = size_of::<RingControl>() as u64;

const _: () = {
    assert!(RPTR_OFFSET == 0);
    assert!(WPTR_OFFSET == 64);
    assert!(LAST_QUEUED_OFFSET == 72);
    assert!(RING_CONTROL_BYTES == 128);
};

/// A [`RingControl`] block in shared memory, reached through typed words (checked once, when
/// the view is made: no caller handles an offset). Cheap to clone.
#[derive(Clone, Debug)]
pub struct RingControlView {
    rptr: shm::Word,
    wptr: shm::Word,
    last_queued: shm::Word,
}

impl RingControlView {
    /// The block at byte `base` of `region` (read-write).
    pub fn new(region: impl Into<shm::Region>, base: u64) -> Result<RingControlView, shm::ShmError> {
        let region = region.into();
        let at = |off: u64| shm::Word::new(region.clone(), base.saturating_add(off));
        Ok(RingControlView { rptr: at(RPTR_OFFSET)?, wptr: at(WPTR_OFFSET)?, last_queued: at(LAST_QUEUED_OFFSET)? })
    }
    /// The read pointer (the engine writes it).
    pub fn rptr(&self) -> &AtomicU64 {
        self.rptr.get()
    }
    /// The write pointer (the client writes it).
    pub fn wptr(&self) -> &AtomicU64 {
        self.wptr.get()
    }
    /// The last-queued progress value (the client writes it, the kernel reads it).
    pub fn last_queued(&self) -> &AtomicU64 {
        self.last_queued.get()
    }
    /// The wptr word itself (for the protocols of [`crate::protocol`]).
    pub fn wptr_word(&self) -> &shm::Word {
        &self.wptr
    }
}

/// Why a ring size is refused.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RingSizeError {
    /// Not a power of two.
    #[error("must be a power of two")]
    NotPowerOfTwo,
    /// Below [`MIN_RING_BYTES`].
    #[error("must be at least 4096 bytes")]
    TooSmall,
    /// Above [`MAX_RING_BYTES`].
    #[error("must be at most 16 MiB")]
    TooLarge,
}

/// Checks a ring size.
pub fn check_ring_size(bytes: u64) -> Result<(), RingSizeError> {
    if !bytes.is_power_of_two() {
        Err(RingSizeError::NotPowerOfTwo)
    } else if bytes < MIN_RING_BYTES {
        Err(RingSizeError::TooSmall)
    } else if bytes > MAX_RING_BYTES {
        Err(RingSizeError::TooLarge)
    } else {
        Ok(())
    }
}

/// Where a writer puts `dwords` dwords of packets at `wptr` in a ring of `ring_bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WritePlan {
    /// Dwords of `NOP` padding first (0, or the rest of the ring up to its end).
    pub pad_dwords: u64,
    /// Ring offset of the packets (after padding).
    pub offset: u64,
    /// wptr after padding and packets.
    pub new_wptr: u64,
}

/// Plans a write of `dwords` dwords so that no packet straddles the end of the ring: when they
/// do not fit before the end, the rest of the ring is padded with one `NOP`. Returns `None`
/// for a stream longer than half the ring: with padding it could need more than the whole
/// ring, and then it would never fit; and for a ring whose size is not a power of two
/// ([`check_ring_size`]).
///
/// The caller must still wait until `new_wptr - rptr <= ring_bytes` before writing.
pub fn plan_write(wptr: u64, ring_bytes: u64, dwords: u64) -> Option<WritePlan> {
    let bytes = dwords.checked_mul(4)?;
    if !ring_bytes.is_power_of_two() || bytes > ring_bytes / 2 {
        return None;
    }
    // A mask, not a division: this runs on every submission.
    let off = wptr & (ring_bytes - 1);
    let to_end = ring_bytes - off;
    // Padded to the end, the packets start at offset 0.
    let (pad, offset) = if bytes > to_end { (to_end, 0) } else { (0, off) };
    Some(WritePlan { pad_dwords: pad / 4, offset, new_wptr: wptr + pad + bytes })
}

/// Writes a planned stream into a ring mapping: the `NOP` padding (if any) at `wptr`, then
/// `parts` back to back at `plan.offset`. Publishing the new wptr is the caller's next step.
pub fn write_stream(
    ring: &shm::Mapping,
    ring_bytes: u64,
    wptr: u64,
    plan: &WritePlan,
    parts: &[&[u32]],
) -> Result<(), shm::ShmError> {
    // The padding is one NOP, or several when it is longer than a packet can be. (The
    // division is only paid when there is padding: once per trip around the ring.)
    let mut left = plan.pad_dwords;
    let mut at = if left > 0 { wptr % ring_bytes } else { 0 };
    while left > 0 {
        let n = left.min(crate::packet::MAX_PACKET_DWORDS as u64);
        ring.write_u32(at, crate::packet::Header::new(crate::packet::Opcode::Nop, n as u16).0)?;
        at += n * 4;
        left -= n;
    }
    let mut at = plan.offset;
    for part in parts {
        ring.write_u32s(at, part)?;
        at += part.len() as u64 * 4;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_plans_pad_to_the_ring_end() {
        assert_eq!(plan_write(0, 4096, 6), Some(WritePlan { pad_dwords: 0, offset: 0, new_wptr: 24 }));
        // 8 bytes left before the end: pad 2 dwords, start at 0.
        assert_eq!(plan_write(4088, 4096, 6), Some(WritePlan { pad_dwords: 2, offset: 0, new_wptr: 4096 + 24 }));
        // Exactly fits.
        assert_eq!(plan_write(4096 + 4072, 4096, 6), Some(WritePlan { pad_dwords: 0, offset: 4072, new_wptr: 8192 }));
        assert_eq!(plan_write(0, 4096, 513), None);
        // Not a power of two: refused (the kernel never accepts such a ring).
        assert_eq!(plan_write(0, 3 * 4096, 6), None);
        assert!(plan_write(4092, 4096, 512).is_some_and(|p| p.new_wptr - 4092 <= 4096));
        // A big ring: the padding needs more than one NOP.
        let big = 1 << 20;
        let p = plan_write(16, big, 20).unwrap();
        assert_eq!(p.offset, 16);
        let p = plan_write(big - 4 * 100_000, big, 100_001).unwrap();
        assert_eq!((p.pad_dwords, p.offset), (100_000, 0));
    }

    #[test]
    fn long_padding_is_written_as_several_nops() {
        let ring = shm::Shm::new("ring", 1 << 20).unwrap();
        let wptr = (1 << 20) - 4 * 100_000;
        let stream = vec![7u32; 100_001];
        let plan = plan_write(wptr, 1 << 20, stream.len() as u64).unwrap();
        write_stream(&ring, 1 << 20, wptr, &plan, &[&stream]).unwrap();
        let mut words = vec![0u32; 100_000];
        ring.read_u32s(wptr, &mut words).unwrap();
        let packets = crate::packet::decode_stream(&words).unwrap();
        assert_eq!(packets.len(), 2);
        assert!(packets.iter().all(|p| matches!(p, crate::packet::Packet::Nop { .. })));
        assert_eq!(ring.read_u32(0).unwrap(), 7);
    }

    #[test]
    fn ring_sizes() {
        assert!(check_ring_size(4096).is_ok());
        assert!(check_ring_size(1 << 20).is_ok());
        assert_eq!(check_ring_size(4095), Err(RingSizeError::NotPowerOfTwo));
        assert_eq!(check_ring_size(2048), Err(RingSizeError::TooSmall));
        assert_eq!(check_ring_size(0), Err(RingSizeError::NotPowerOfTwo));
        assert_eq!(check_ring_size(32 << 20), Err(RingSizeError::TooLarge));
    }
}
