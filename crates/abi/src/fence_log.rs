//! Native fence log buffers (spec 002 "Native fence log buffer design").
//!
//! The kernel gives every user-mode queue two logs, one for waits and one for signals, that
//! the engine writes and the client cannot touch: 4 KiB each ([`FENCE_LOG_BYTES`],
//! [`FENCE_LOG_ENTRIES`] entries), larger while the OS traces (spec 002: "when tracing is
//! enabled, the OS first increases the size of the log buffer to prevent overruns"). A log's
//! size is its memory's: the header's `num_entries` says it, and the engine and the kernel
//! both derive it from the length of the log they were given ([`entries_in`]).
//!
//! A `SIGNAL` or `WAIT` carrying [`crate::packet::FLAG_LOG`] names the log **position** to
//! write: the UMD owns the progression (spec 002: it "determines the next free entry to write
//! to ... and programs the GPU with this information") as a running count of its logged
//! operations, 0, 1, 2, ..., wrapping at 2^32. The engine writes position `p` at entry
//! `p mod num_entries`. So the UMD need not know the log's size, and the OS can recreate a
//! log of another size under a running queue: the new header starts where the old one
//! stopped ([`init`]), and the positions go on. A position behind the header's, or a whole
//! log or more ahead of it, is refused ([`locate`]); the engine faults the queue.
//!
//! After the fence operation the engine writes, in the spec's order:
//!
//! 1. the fence value (the signal itself, or the wait's release),
//! 2. the log entry, with the GPU timestamps,
//! 3. the header's FirstFreeEntryIndex (and WraparoundCount when it wraps),
//! 4. a barrier,
//! 5. the conditional-interrupt check (signals on native fences).
//!
//! Overrun is allowed: the engine keeps writing and bumps WraparoundCount; a reader that cached
//! the header detects lost entries by comparing totals. Timestamps never go backwards, but an
//! entry may carry a zero timestamp (spec 002 "Empty or repeated log buffer timestamps": an
//! adapter of a linked pair may skip the write); a zero is accepted and does not reset the
//! monotonic check.
//!
//! Layout (little-endian):
//!
//! | offset | header field       | meaning                                              |
//! |--------|--------------------|------------------------------------------------------|
//! | 0      | `first_free`       | FirstFreeEntryIndex (bits 0..32) and WraparoundCount (bits 32..64), one atomic word |
//! | 8      | `log_type`         | [`FenceLogType`]                                     |
//! | 12     | `num_entries`      | [`FENCE_LOG_ENTRIES`]                                |
//! | 16     | reserved (24 bytes)|                                                      |
//!
//! | offset | entry field          | meaning                                         |
//! |--------|----------------------|-------------------------------------------------|
//! | 0      | `fence_value`        | the value signalled or waited for               |
//! | 8      | `fence_handle`       | the kernel's id of the fence (0: not a registered native fence) |
//! | 16     | `operation`          | [`FenceLogOp`]                                  |
//! | 24     | `observed_timestamp` | GPU time the engine first saw the operation     |
//! | 32     | `end_timestamp`      | GPU time it completed (signal written, wait released) |
//! | 40     | reserved             |                                                 |

use core::mem::{offset_of, size_of};
use core::sync::atomic::AtomicU64;

/// Bytes of one log as the spec sizes it ("two dedicated 4-KB log buffers per HWQueue").
pub const FENCE_LOG_BYTES: u64 = 4096;

/// The log header.
#[repr(C)]
pub struct FenceLogHeader {
    /// FirstFreeEntryIndex | WraparoundCount << 32.
    pub first_free: AtomicU64,
    /// [`FenceLogType`].
    pub log_type: u32,
    /// Entries in the log.
    pub num_entries: u32,
    /// Reserved.
    pub reserved: [u64; 3],
}

/// One log entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FenceLogEntry {
    /// Fence value.
    pub fence_value: u64,
    /// The fence's kernel id.
    pub fence_handle: u64,
    /// [`FenceLogOp`].
    pub operation: u32,
    /// Reserved.
    pub reserved0: u32,
    /// When the engine first saw the operation.
    pub observed_timestamp: u64,
    /// When it completed.
    pub end_timestamp: u64,
    /// Reserved.
    pub reserved1: u64,
}

/// Bytes of the header.
pub const FENCE_LOG_HEADER_BYTES: u64 = size_of::<FenceLogHeader>() as u64;
/// Bytes of an entry.
pub const FENCE_LOG_ENTRY_BYTES: u64 = size_of::<FenceLogEntry>() as u64;
/// Entries in a log of [`FENCE_LOG_BYTES`].
pub const FENCE_LOG_ENTRIES: u32 = entries_in(FENCE_LOG_BYTES);

/// Entries in a log of `bytes` bytes (0 if it cannot hold the header and one entry).
pub const fn entries_in(bytes: u64) -> u32 {
    if bytes < FENCE_LOG_HEADER_BYTES + FENCE_LOG_ENTRY_BYTES {
        return 0;
    }
    let n = (bytes - FENCE_LOG_HEADER_BYTES) / FENCE_LOG_ENTRY_BYTES;
    if n > u32::MAX as u64 { u32::MAX } else { n as u32 }
}

/// Bytes of a log of `entries` entries.
pub const fn log_bytes(entries: u32) -> u64 {
    FENCE_LOG_HEADER_BYTES + entries as u64 * FENCE_LOG_ENTRY_BYTES
}

const _: () = {
    assert!(FENCE_LOG_HEADER_BYTES == 40);
    assert!(offset_of!(FenceLogHeader, log_type) == 8);
    assert!(offset_of!(FenceLogHeader, num_entries) == 12);
    assert!(FENCE_LOG_ENTRY_BYTES == 48);
    assert!(offset_of!(FenceLogEntry, operation) == 16);
    assert!(offset_of!(FenceLogEntry, observed_timestamp) == 24);
    assert!(offset_of!(FenceLogEntry, end_timestamp) == 32);
    assert!(FENCE_LOG_ENTRIES == 84);
};

/// Which log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum FenceLogType {
    /// Waits.
    Wait = 0,
    /// Signals.
    Signal = 1,
}

/// `DXGK_NATIVE_FENCE_LOG_OPERATION`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum FenceLogOp {
    /// A signal executed.
    SignalExecuted = 0,
    /// A wait was satisfied and the queue unblocked.
    WaitUnblocked = 1,
}

impl FenceLogOp {
    /// Decodes an operation word.
    pub const fn from_u32(v: u32) -> Option<FenceLogOp> {
        match v {
            0 => Some(FenceLogOp::SignalExecuted),
            1 => Some(FenceLogOp::WaitUnblocked),
            _ => None,
        }
    }
}

/// Packs FirstFreeEntryIndex and WraparoundCount.
pub const fn pack_first_free(index: u32, wraps: u32) -> u64 {
    index as u64 | (wraps as u64) << 32
}

/// Unpacks (FirstFreeEntryIndex, WraparoundCount).
pub const fn unpack_first_free(w: u64) -> (u32, u32) {
    (w as u32, (w >> 32) as u32)
}

/// Positions written so far in a log of `entries` entries: `wraps * entries + index`.
pub const fn total_written(w: u64, entries: u32) -> u64 {
    let (i, n) = unpack_first_free(w);
    n as u64 * entries as u64 + i as u64
}

/// The header word of a log of `entries` entries whose next free position is `total`.
pub const fn header_at(total: u64, entries: u32) -> u64 {
    let n = if entries == 0 { 1 } else { entries as u64 };
    pack_first_free((total % n) as u32, (total / n) as u32)
}

/// Byte offset of entry `i`.
pub const fn entry_offset(i: u32) -> u64 {
    FENCE_LOG_HEADER_BYTES + i as u64 * FENCE_LOG_ENTRY_BYTES
}

impl FenceLogEntry {
    /// Encodes to 6 u64 words.
    pub const fn to_words(&self) -> [u64; 6] {
        [
            self.fence_value,
            self.fence_handle,
            self.operation as u64 | (self.reserved0 as u64) << 32,
            self.observed_timestamp,
            self.end_timestamp,
            self.reserved1,
        ]
    }
    /// Decodes 6 u64 words.
    pub const fn from_words(w: [u64; 6]) -> FenceLogEntry {
        FenceLogEntry {
            fence_value: w[0],
            fence_handle: w[1],
            operation: w[2] as u32,
            reserved0: (w[2] >> 32) as u32,
            observed_timestamp: w[3],
            end_timestamp: w[4],
            reserved1: w[5],
        }
    }
}

/// What a reader got from a log since its last read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogRead {
    /// New entries, oldest first.
    pub entries: Vec<FenceLogEntry>,
    /// Entries the engine overwrote before they were read (overrun).
    pub lost: u64,
    /// The header total to pass to the next read.
    pub total: u64,
}

/// Why a log cannot be trusted.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LogError {
    /// The header's index is out of range.
    #[error("fence log header: FirstFreeEntryIndex {index} is not below the log's {entries} entries")]
    BadIndex {
        /// The index.
        index: u32,
        /// Entries in the log.
        entries: u32,
    },
    /// A log position the engine cannot write: behind the header's (the UMD's progression
    /// went backwards) or a whole log or more ahead of it.
    #[error("fence log position {position}: the next free position is {next}, and the log holds {entries} entries")]
    BadPosition {
        /// The position the packet named.
        position: u32,
        /// The header's next free position (its low 32 bits).
        next: u32,
        /// Entries in the log.
        entries: u32,
    },
    /// A log too small to hold one entry.
    #[error("fence log of {bytes} bytes holds no entry")]
    TooSmall {
        /// Its size.
        bytes: u64,
    },
    /// The header went backwards.
    #[error("fence log header went backwards: {total} entries written, {cached} seen before")]
    Backwards {
        /// Now.
        total: u64,
        /// Before.
        cached: u64,
    },
    /// An entry holds an unknown operation.
    #[error("fence log entry {index}: operation {op} is unknown")]
    BadOperation {
        /// Entry.
        index: u32,
        /// Value.
        op: u32,
    },
    /// Timestamps went backwards between entries.
    #[error("fence log entry {index}: end timestamp {ts} is before the previous entry's {prev}")]
    TimeBackwards {
        /// Entry.
        index: u32,
        /// Its timestamp.
        ts: u64,
        /// The previous one.
        prev: u64,
    },
    /// The log memory could not be read.
    #[error("fence log memory: {0}")]
    Memory(#[from] shm::ShmError),
}

/// Entries in `log` (from its length, as the engine sees it).
pub fn capacity(log: &shm::Mapping) -> Result<u32, LogError> {
    match entries_in(log.len() as u64) {
        0 => Err(LogError::TooSmall { bytes: log.len() as u64 }),
        n => Ok(n),
    }
}

/// Reads the entries written since position `cached` (a previous [`LogRead::total`], 0 at
/// first). Call after the KMD's flush (`DxgkDdiUpdateNativeFenceLogs`). Everything is
/// validated: the log is written by another actor.
pub fn read_since(log: &shm::Mapping, cached: u64) -> Result<LogRead, LogError> {
    let cap = capacity(log)?;
    // Acquire: pairs with the engine's release of the index, so the entries are visible.
    let w = log.load_u64(0, core::sync::atomic::Ordering::Acquire)?;
    let (index, _) = unpack_first_free(w);
    if index >= cap {
        return Err(LogError::BadIndex { index, entries: cap });
    }
    let total = total_written(w, cap);
    if total < cached {
        return Err(LogError::Backwards { total, cached });
    }
    let n = cap as u64;
    let new = total - cached;
    let lost = new.saturating_sub(n);
    let mut entries = Vec::with_capacity(new.min(n) as usize);
    let mut prev = 0u64;
    let first = total - new.min(n);
    for t in first..total {
        let i = (t % n) as u32;
        let mut words = [0u64; 6];
        for (k, word) in words.iter_mut().enumerate() {
            *word = log.read_u64(entry_offset(i) + k as u64 * 8)?;
        }
        let e = FenceLogEntry::from_words(words);
        if FenceLogOp::from_u32(e.operation).is_none() {
            return Err(LogError::BadOperation { index: i, op: e.operation });
        }
        // Zero is "empty" (the spec permits it) and is skipped; a real timestamp never goes
        // below the last real one.
        if e.end_timestamp != 0 {
            if e.end_timestamp < prev {
                return Err(LogError::TimeBackwards { index: i, ts: e.end_timestamp, prev });
            }
            prev = e.end_timestamp;
        }
        entries.push(e);
    }
    // The engine may have gone on writing while we read. Position t shares its slot with
    // t + n, so every position up to `after - n` may have been overwritten (and the one at
    // `after - n` may be mid-write now, before the header says so): drop them as lost.
    let after = total_written(log.load_u64(0, core::sync::atomic::Ordering::Acquire)?, cap).max(total);
    let torn = (after + 1).saturating_sub(n).saturating_sub(first).min(entries.len() as u64);
    entries.drain(..torn as usize);
    Ok(LogRead { entries, lost: lost + torn, total })
}

/// The header's total (positions written since creation), for a reader that must
/// resynchronize, or the OS recreating the log.
pub fn header_total(log: &shm::Mapping) -> Result<u64, LogError> {
    let entries = capacity(log)?;
    Ok(total_written(log.load_u64(0, core::sync::atomic::Ordering::Acquire)?, entries))
}

/// The memory a log lives in, as the engine writes it: plain entry words, and the header's
/// atomic word. [`append_to`] is written against it so a test can record the order of the
/// writes (`abi::fence_log` tests: value, entry, index, then the interrupt check).
pub trait LogMemory {
    /// Entries the log holds.
    fn entries(&self) -> u32;
    /// Its size in bytes (what an error about it reports).
    fn bytes(&self) -> u64;
    /// A plain store of an entry word at byte `offset`.
    fn write_word(&self, offset: u64, value: u64);
    /// The header word (FirstFreeEntryIndex and WraparoundCount).
    fn header(&self) -> Option<&AtomicU64>;
}

impl LogMemory for shm::Mapping {
    fn entries(&self) -> u32 {
        entries_in(self.len() as u64)
    }
    fn bytes(&self) -> u64 {
        self.len() as u64
    }
    fn write_word(&self, offset: u64, value: u64) {
        let _ = self.write_u64(offset, value);
    }
    fn header(&self) -> Option<&AtomicU64> {
        self.atomic_u64(0).ok()
    }
}

/// Where the engine writes a log position ([`locate`]): the entry, and the header word that
/// follows the write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    /// The entry.
    pub entry: u32,
    /// The header after the write: FirstFreeEntryIndex past the entry, WraparoundCount + 1
    /// when it wraps.
    pub header: u64,
}

/// Where position `position` of the UMD's progression goes in `log`: at or past the header's
/// next free position, by less than a whole log. The engine checks it before the fence
/// operation, so a refused position changes nothing. Positions are 32-bit and wrap; the
/// header's count is extended by the distance between them (sound for any log of fewer
/// than 2^31 entries: one behind the header is then never taken for one ahead).
///
/// A position ahead of the header is taken, the entries between left as they are: the OS
/// starts a recreated log where it read the old one's header, and the engine may have gone
/// on writing the old log before the switch, so the UMD's next position can be past the new
/// log's start. (A reader sees those entries empty, or stale from an earlier lap: they name
/// no fence, or one the log named before.)
pub fn locate<L: LogMemory + ?Sized>(log: &L, position: u32) -> Result<Slot, LogError> {
    let entries = log.entries();
    let too_small = || LogError::TooSmall { bytes: log.bytes() };
    let h = log.header().ok_or_else(too_small)?;
    if entries == 0 {
        return Err(too_small());
    }
    // Relaxed: the engine is the header's only writer once the log is its own (the kernel's
    // `init` reached it through SetNativeFenceLogBuffer, under the device lock).
    let total = total_written(h.load(core::sync::atomic::Ordering::Relaxed), entries);
    let ahead = position.wrapping_sub(total as u32);
    if ahead >= entries {
        return Err(LogError::BadPosition { position, next: total as u32, entries });
    }
    let at = total + ahead as u64;
    Ok(Slot { entry: (at % entries as u64) as u32, header: header_at(at + 1, entries) })
}

/// The engine's write (spec 002 "Order of operations", steps 2 and 3): the entry at `slot`,
/// then the header moved past it. The caller issues the barrier.
pub fn append(log: &shm::Mapping, slot: Slot, e: FenceLogEntry) {
    append_to(log, slot, e)
}

/// [`append`] over any [`LogMemory`]: the entry's words, then the header.
pub fn append_to<L: LogMemory + ?Sized>(log: &L, slot: Slot, e: FenceLogEntry) {
    let base = entry_offset(slot.entry);
    for (k, w) in e.to_words().iter().enumerate() {
        log.write_word(base + k as u64 * 8, *w);
    }
    if let Some(h) = log.header() {
        // Release: the entry's words are visible to a reader that acquires the new index.
        h.store(slot.header, core::sync::atomic::Ordering::Release);
    }
}

/// Writes a fresh header for a log of `kind`, sized by its memory, whose next free position
/// is `start` (0 for a new queue; where the old log stopped when the OS recreates one, so the
/// UMD's positions go on).
pub fn init(log: &shm::Mapping, kind: FenceLogType, start: u64) -> Result<(), shm::ShmError> {
    let entries = capacity(log)
        .map_err(|_| shm::ShmError::BadSize { size: log.len() as u64, why: "a fence log holds no entry" })?;
    log.write_u32(8, kind as u32)?;
    log.write_u32(12, entries)?;
    // Release: the type and size are visible with the position.
    log.atomic_u64(0)?.store(header_at(start, entries), core::sync::atomic::Ordering::Release);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_packing_and_totals() {
        let w = pack_first_free(83, 2);
        assert_eq!(unpack_first_free(w), (83, 2));
        assert_eq!(total_written(w, 84), 2 * 84 + 83);
        assert_eq!(header_at(2 * 84 + 83, 84), w);
        assert_eq!((entries_in(4096), entries_in(log_bytes(340)), entries_in(40)), (84, 340, 0));
        assert_eq!(entry_offset(0), 40);
        assert_eq!(entry_offset(83) + 48, 4072);
        let e =
            FenceLogEntry { fence_value: 7, fence_handle: 3, operation: 1, end_timestamp: 99, ..Default::default() };
        assert_eq!(FenceLogEntry::from_words(e.to_words()), e);
    }

    fn put(log: &shm::Mapping, i: u32, ts: u64, next: u64) {
        let e = FenceLogEntry { fence_value: ts, end_timestamp: ts, ..Default::default() };
        for (k, w) in e.to_words().iter().enumerate() {
            log.write_u64(entry_offset(i) + k as u64 * 8, *w).unwrap();
        }
        log.write_u64(0, next).unwrap();
    }

    #[test]
    fn zero_timestamps_are_accepted_but_real_ones_never_go_backwards() {
        let shm = shm::Shm::new("log", 4096).unwrap();
        init(&shm, FenceLogType::Signal, 0).unwrap();
        put(&shm, 0, 10, pack_first_free(1, 0));
        put(&shm, 1, 0, pack_first_free(2, 0)); // an empty timestamp (a skipped write)
        put(&shm, 2, 10, pack_first_free(3, 0)); // repeated
        put(&shm, 3, 12, pack_first_free(4, 0));
        let r = read_since(&shm, 0).unwrap();
        assert_eq!(r.entries.iter().map(|e| e.end_timestamp).collect::<Vec<_>>(), [10, 0, 10, 12]);
        // After a zero, a real timestamp below the last real one is still refused.
        put(&shm, 4, 0, pack_first_free(5, 0));
        put(&shm, 5, 11, pack_first_free(6, 0));
        assert!(matches!(read_since(&shm, 0), Err(LogError::TimeBackwards { index: 5, ts: 11, prev: 12 })));
    }

    /// Spec 002 "Order of operations on GPU when signaling or unblocking a fence": 1. the fence
    /// value, 2. the log entry, 3. FirstFreeEntryIndex, then (after the barrier) the interrupt
    /// check — exactly how the engine composes `protocol::signal_fence` with [`append_to`].
    #[test]
    fn a_logged_signal_writes_value_then_entry_then_index_then_checks_for_the_interrupt() {
        use crate::sync::{Load, Ordering as O, Store};
        use std::cell::RefCell;
        #[derive(Debug, PartialEq, Clone, Copy)]
        enum W {
            Value,
            Entry,
            Index,
            InterruptCheck,
        }
        struct Rec<'a>(&'a RefCell<Vec<W>>, W, AtomicU64);
        impl Store for Rec<'_> {
            fn store(&self, v: u64, o: O) {
                self.0.borrow_mut().push(self.1);
                self.2.store(v, o);
            }
        }
        impl Load for Rec<'_> {
            fn load(&self, o: O) -> u64 {
                self.0.borrow_mut().push(self.1);
                self.2.load(o)
            }
        }
        struct Log<'a>(&'a RefCell<Vec<W>>, AtomicU64);
        impl LogMemory for Log<'_> {
            fn entries(&self) -> u32 {
                FENCE_LOG_ENTRIES
            }
            fn bytes(&self) -> u64 {
                log_bytes(FENCE_LOG_ENTRIES)
            }
            fn write_word(&self, _: u64, _: u64) {
                self.0.borrow_mut().push(W::Entry);
            }
            fn header(&self) -> Option<&AtomicU64> {
                // The header's own load is the engine's read of its index; the store follows.
                self.0.borrow_mut().push(W::Index);
                Some(&self.1)
            }
        }
        let seen = RefCell::new(Vec::new());
        let current = Rec(&seen, W::Value, AtomicU64::new(0));
        let monitored = Rec(&seen, W::InterruptCheck, AtomicU64::new(4));
        let log = Log(&seen, AtomicU64::new(0));
        // The engine places the position before the operation (a read); the writes follow.
        let slot = locate(&log, 0).unwrap();
        seen.borrow_mut().clear();
        let e = FenceLogEntry { fence_value: 5, end_timestamp: 1, ..Default::default() };
        let interrupt = crate::protocol::signal_fence(&current, &monitored, 5, || append_to(&log, slot, e));
        assert!(interrupt, "5 > MonitoredValue 4");
        assert_eq!(unpack_first_free(log.1.load(O::Relaxed)), (1, 0), "the index moved past the entry");
        let mut order = seen.borrow().clone();
        order.dedup();
        assert_eq!(order, [W::Value, W::Entry, W::Index, W::InterruptCheck]);
    }

    #[test]
    fn reads_new_entries_detects_overrun_and_refuses_corrupt_logs() {
        let shm = shm::Shm::new("log", 4096).unwrap();
        init(&shm, FenceLogType::Signal, 0).unwrap();
        put(&shm, 0, 10, pack_first_free(1, 0));
        put(&shm, 1, 20, pack_first_free(2, 0));
        let r = read_since(&shm, 0).unwrap();
        assert_eq!((r.entries.len(), r.lost, r.total), (2, 0, 2));
        assert_eq!(read_since(&shm, 2).unwrap().entries.len(), 0);
        // 100 more entries: 16 overwritten before anyone read them.
        for t in 2..102u64 {
            let i = (t % 84) as u32;
            let next = t + 1;
            put(&shm, i, 100 + t, pack_first_free((next % 84) as u32, (next / 84) as u32));
        }
        let r = read_since(&shm, 2).unwrap();
        // 84 entries are in the log, but the oldest shares its slot with the next write, which
        // may be under way: it counts as lost.
        assert_eq!((r.entries.len(), r.lost, r.total), (83, 17, 102));
        assert_eq!(r.entries.first().unwrap().end_timestamp, 100 + 19);
        // Corruption: an index out of range, a header going backwards, time going backwards.
        shm.write_u64(0, pack_first_free(90, 0)).unwrap();
        assert!(matches!(read_since(&shm, 0), Err(LogError::BadIndex { index: 90, entries: 84 })));
        shm.write_u64(0, pack_first_free(1, 0)).unwrap();
        assert!(matches!(read_since(&shm, 5), Err(LogError::Backwards { .. })));
        put(&shm, 1, 5, pack_first_free(2, 0));
        assert!(matches!(read_since(&shm, 0), Err(LogError::TimeBackwards { index: 1, .. })));
    }

    /// The UMD's positions go on whatever the log's size: a log recreated larger starts where
    /// the old one stopped, and the engine places each position in it.
    #[test]
    fn positions_continue_across_a_recreated_log_of_another_size() {
        let small = shm::Shm::new("log", 4096).unwrap();
        init(&small, FenceLogType::Signal, 0).unwrap();
        let e = |v| FenceLogEntry { fence_value: v, end_timestamp: v, ..Default::default() };
        for p in 0..100u32 {
            append(&small, locate::<shm::Mapping>(&small, p).unwrap(), e(p as u64 + 1));
        }
        assert_eq!(header_total(&small).unwrap(), 100);
        assert_eq!(unpack_first_free(small.load_u64(0, core::sync::atomic::Ordering::Relaxed).unwrap()), (16, 1));
        // Recreated with 340 entries, starting at position 100.
        let big = shm::Shm::new("log", log_bytes(340) as usize).unwrap();
        init(&big, FenceLogType::Signal, 100).unwrap();
        assert_eq!((capacity(&big).unwrap(), big.read_u32(12).unwrap()), (340, 340), "num_entries in the header");
        assert_eq!(header_total(&big).unwrap(), 100);
        for p in 100..300u32 {
            append(&big, locate::<shm::Mapping>(&big, p).unwrap(), e(p as u64 + 1));
        }
        let r = read_since(&big, 100).unwrap();
        assert_eq!((r.entries.len(), r.lost, r.total), (200, 0, 300), "nothing lost: the log is large enough");
        assert_eq!(r.entries[0].fence_value, 101);
        // Behind the header, or a whole log ahead: refused, and nothing written.
        assert_eq!(
            locate::<shm::Mapping>(&big, 299),
            Err(LogError::BadPosition { position: 299, next: 300, entries: 340 })
        );
        assert!(locate::<shm::Mapping>(&big, 300 + 340).is_err());
        assert_eq!(locate::<shm::Mapping>(&big, 300 + 339).unwrap().entry, (300 + 339) % 340);
        assert_eq!(header_total(&big).unwrap(), 300);
    }

    /// The OS reads the old log's header to start the new one there, and the engine writes
    /// two more positions in the old log before the switch: the new log takes the UMD's next
    /// position past its start, and a reader from the start sees the two as empty entries
    /// (they are in the old log, which the OS drains).
    #[test]
    fn a_recreated_log_takes_a_position_past_its_start() {
        let old = shm::Shm::new("log", 4096).unwrap();
        init(&old, FenceLogType::Signal, 0).unwrap();
        let e = |v| FenceLogEntry { fence_value: v, fence_handle: 9, end_timestamp: v, ..Default::default() };
        for p in 0..3u32 {
            append(&old, locate::<shm::Mapping>(&old, p).unwrap(), e(p as u64 + 1));
        }
        let start = header_total(&old).unwrap();
        for p in 3..5u32 {
            append(&old, locate::<shm::Mapping>(&old, p).unwrap(), e(p as u64 + 1));
        }
        let new = shm::Shm::new("log", log_bytes(340) as usize).unwrap();
        init(&new, FenceLogType::Signal, start).unwrap();
        append(&new, locate::<shm::Mapping>(&new, 5).unwrap(), e(6));
        let r = read_since(&new, start).unwrap();
        assert_eq!((r.total, r.lost), (6, 0));
        let named: Vec<(u64, u64)> = r.entries.iter().map(|e| (e.fence_handle, e.fence_value)).collect();
        assert_eq!(named, [(0, 0), (0, 0), (9, 6)], "positions 3 and 4 are empty in the new log");
        let r = read_since(&old, start).unwrap();
        assert_eq!(r.entries.iter().map(|e| e.fence_value).collect::<Vec<_>>(), [4, 5], "the old log holds them");
    }

    /// Positions are 32-bit and wrap; the header's count goes on.
    #[test]
    fn positions_wrap_at_two_to_the_32() {
        let log = shm::Shm::new("log", 4096).unwrap();
        let start = u32::MAX as u64 - 1;
        init(&log, FenceLogType::Wait, start).unwrap();
        for p in [u32::MAX - 1, u32::MAX, 0, 1] {
            append(&log, locate::<shm::Mapping>(&log, p).unwrap(), FenceLogEntry::default());
        }
        assert_eq!(header_total(&log).unwrap(), start + 4);
    }

    /// A log too small for one entry is refused, and the error gives its real size.
    #[test]
    fn a_log_too_small_for_an_entry_says_how_big_it_is() {
        let shm = shm::Shm::new("log", 4096).unwrap();
        let tiny = shm::Mapping::new(shm.fd(), 0, 8, shm::Prot::ReadWrite).unwrap();
        assert_eq!(locate(&tiny, 0), Err(LogError::TooSmall { bytes: 8 }));
        assert!(matches!(capacity(&tiny), Err(LogError::TooSmall { bytes: 8 })));
    }
}
