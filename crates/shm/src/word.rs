//! Protocol words: one 64-bit word of shared memory, checked once and kept alive.
//!
//! Every protocol between the actors (a wptr, a doorbell, a fence value, a status word) is a
//! `u64` in shared memory that one actor writes and others read. Addressing such a word as
//! "(mapping, offset)" at every access scatters two failure modes over every call site: an
//! offset that is out of bounds or misaligned, and a mapping that is read-only. A [`Word`]
//! or [`ReadWord`] checks both once, when it is made, keeps its region alive (an `Arc`), and
//! from then on reaches the word with no check and no error: `word.get().load(..)`.
//!
//! - [`Word`]: a word the holder may write (its region is mapped read-write).
//! - [`ReadWord`]: a word the holder may only read (a client's read-only kernel page, say).
//! - [`Futex`] and [`ReadFutex`]: a 32-bit wake word across processes (a shared futex): the
//!   writer bumps it and wakes its sleepers, a reader sleeps on it. The protocol around them
//!   (read the word, then the condition, then sleep on what was read) is
//!   `abi::protocol::read_wake_word`'s.
//!
//! Typed layouts (`abi::ring::RingControlView`, `abi::queue::KernelPageView`, ...) are built
//! from these, so no caller handles a raw offset.

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::{Mapping, Prot, RotatingPage, Shm, ShmError, aligned, in_bounds};

/// Shared memory a word can live in, held alive by the word. Cheap to clone (an `Arc`).
#[derive(Clone, Debug)]
pub enum Region {
    /// A region's own read-write mapping (the device and the kernel hold these).
    Shm(Arc<Shm>),
    /// A further mapping of a file (what a client gets for its allocations and kernel pages).
    Mapping(Arc<Mapping>),
    /// A doorbell CPU page, whose backing the kernel rotates; the address stays mapped.
    Rotating(Arc<RotatingPage>),
}

impl From<Arc<Shm>> for Region {
    fn from(s: Arc<Shm>) -> Self {
        Region::Shm(s)
    }
}
impl From<&Arc<Shm>> for Region {
    fn from(s: &Arc<Shm>) -> Self {
        Region::Shm(s.clone())
    }
}
impl From<Arc<Mapping>> for Region {
    fn from(m: Arc<Mapping>) -> Self {
        Region::Mapping(m)
    }
}
impl From<&Arc<Mapping>> for Region {
    fn from(m: &Arc<Mapping>) -> Self {
        Region::Mapping(m.clone())
    }
}
impl From<Arc<RotatingPage>> for Region {
    fn from(p: Arc<RotatingPage>) -> Self {
        Region::Rotating(p)
    }
}
impl From<&Arc<RotatingPage>> for Region {
    fn from(p: &Arc<RotatingPage>) -> Self {
        Region::Rotating(p.clone())
    }
}

impl Region {
    /// The address of the 8-aligned word at `offset`, after checking it lies inside the region;
    /// and whether the region may be written.
    fn word_ptr(&self, offset: u64) -> Result<(NonNull<AtomicU64>, bool), ShmError> {
        self.ptr_of(offset, 8).map(|(p, w)| (p.cast(), w))
    }

    /// The address of the `size`-aligned `size`-byte word at `offset`, checked as above.
    fn ptr_of(&self, offset: u64, size: u64) -> Result<(NonNull<u8>, bool), ShmError> {
        aligned(offset, size)?;
        let (base, len, writable) = match self {
            Region::Shm(s) => (s.map.ptr, s.map.len, true),
            Region::Mapping(m) => (m.ptr, m.len, m.prot == Prot::ReadWrite),
            Region::Rotating(p) => (p.ptr, crate::PAGE_SIZE, true),
        };
        in_bounds(offset, size, len as u64)?;
        // SAFETY: `offset + size <= len`, so the result stays inside the mapping; the mapping
        // is page-aligned and `offset` `size`-aligned, so the word is `size`-aligned.
        let ptr = unsafe { base.add(offset as usize) };
        Ok((ptr, writable))
    }
}

/// A 64-bit protocol word its holder may read and write. See the module docs.
#[derive(Clone, Debug)]
pub struct Word {
    ptr: NonNull<AtomicU64>,
    region: Region,
    offset: u64,
}

// SAFETY: the word is only ever accessed atomically, from any thread, and the region it points
// into is kept alive by `region` (an `Arc`), which is itself Send + Sync.
unsafe impl Send for Word {}
// SAFETY: as for `Send`: `&Word` only hands out `&AtomicU64`.
unsafe impl Sync for Word {}

impl Word {
    /// The word at `offset` of `region`, which must be mapped read-write.
    pub fn new(region: impl Into<Region>, offset: u64) -> Result<Word, ShmError> {
        let region = region.into();
        let (ptr, writable) = region.word_ptr(offset)?;
        if !writable {
            return Err(ShmError::ReadOnly);
        }
        Ok(Word { ptr, region, offset })
    }

    /// The word.
    #[inline]
    pub fn get(&self) -> &AtomicU64 {
        // SAFETY: `new` checked the word is in bounds, 8-aligned and writable; `region` keeps
        // the mapping alive (a rotating page stays mapped read-write across rotations). By the
        // crate's contract a protocol word is accessed by every actor only atomically.
        unsafe { self.ptr.as_ref() }
    }

    /// The region it lives in.
    pub fn region(&self) -> &Region {
        &self.region
    }

    /// Its byte offset in the region.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The word's CPU address, and the `mmap` it lies in for a device that reaches it by DMA
    /// (`None` for a doorbell page the kernel rotates: no device reads those by DMA).
    pub fn dma(&self) -> Option<(usize, crate::DmaArea)> {
        let area = match &self.region {
            Region::Shm(s) => s.map().dma_area(),
            Region::Mapping(m) => m.dma_area(),
            Region::Rotating(_) => return None,
        };
        Some((self.ptr.as_ptr().addr(), area))
    }

    /// A read-only handle on the same word.
    pub fn read_only(&self) -> ReadWord {
        ReadWord { ptr: self.ptr, region: self.region.clone(), offset: self.offset }
    }
}

/// A 64-bit protocol word its holder may only read. See the module docs.
#[derive(Clone, Debug)]
pub struct ReadWord {
    ptr: NonNull<AtomicU64>,
    region: Region,
    offset: u64,
}

// SAFETY: as for `Word`; only atomic loads are ever made through it.
unsafe impl Send for ReadWord {}
// SAFETY: as for `Send`.
unsafe impl Sync for ReadWord {}

impl ReadWord {
    /// The word at `offset` of `region` (read-only or read-write).
    pub fn new(region: impl Into<Region>, offset: u64) -> Result<ReadWord, ShmError> {
        let region = region.into();
        let (ptr, _) = region.word_ptr(offset)?;
        Ok(ReadWord { ptr, region, offset })
    }

    /// An atomic load.
    ///
    /// # Panics
    /// If `order` is `Release` or `AcqRel`, like [`AtomicU64::load`].
    #[inline]
    pub fn load(&self, order: Ordering) -> u64 {
        // SAFETY: `new` checked the word is in bounds and 8-aligned, and `region` keeps it
        // mapped. The mapping may be read-only: an atomic load of a lock-free 8-byte word does
        // not write, which std documents as allowed on read-only memory. The reference does
        // not escape this call.
        unsafe { self.ptr.as_ref() }.load(order)
    }

    /// The region it lives in.
    pub fn region(&self) -> &Region {
        &self.region
    }

    /// Its byte offset in the region.
    pub fn offset(&self) -> u64 {
        self.offset
    }
}

/// A 32-bit wake word its holder writes: bumped, then its sleepers woken (`FUTEX_WAKE`,
/// shared: the sleepers are in other processes). See the module docs.
#[derive(Clone, Debug)]
pub struct Futex {
    ptr: NonNull<AtomicU32>,
    _region: Region,
}

// SAFETY: as for `Word`: only atomic operations and futex calls on a word kept mapped.
unsafe impl Send for Futex {}
// SAFETY: as for `Send`.
unsafe impl Sync for Futex {}

impl Futex {
    /// The 4-aligned word at `offset` of `region`, which must be mapped read-write.
    pub fn new(region: impl Into<Region>, offset: u64) -> Result<Futex, ShmError> {
        let region = region.into();
        let (ptr, writable) = region.ptr_of(offset, 4)?;
        if !writable {
            return Err(ShmError::ReadOnly);
        }
        Ok(Futex { ptr: ptr.cast(), _region: region })
    }

    /// The word.
    #[inline]
    pub fn get(&self) -> &AtomicU32 {
        // SAFETY: `new` checked the word is in bounds, 4-aligned and writable; the region is
        // kept alive by `_region`; every actor reaches it only atomically.
        unsafe { self.ptr.as_ref() }
    }

    /// Wakes every thread, in any process, sleeping on the word. Returns how many woke.
    pub fn wake_all(&self) -> usize {
        // Shared (no FUTEX_PRIVATE_FLAG): the sleepers map the same file in other processes.
        rustix::thread::futex::wake(self.get(), rustix::thread::futex::Flags::empty(), i32::MAX as u32).unwrap_or(0)
    }
}

/// A 32-bit wake word its holder may only read and sleep on (the mapping may be read-only:
/// `FUTEX_WAIT` only reads). See the module docs.
#[derive(Clone, Debug)]
pub struct ReadFutex {
    ptr: NonNull<AtomicU32>,
    _region: Region,
}

// SAFETY: as for `ReadWord`.
unsafe impl Send for ReadFutex {}
// SAFETY: as for `Send`.
unsafe impl Sync for ReadFutex {}

impl ReadFutex {
    /// The 4-aligned word at `offset` of `region` (read-only or read-write).
    pub fn new(region: impl Into<Region>, offset: u64) -> Result<ReadFutex, ShmError> {
        let region = region.into();
        let (ptr, _) = region.ptr_of(offset, 4)?;
        Ok(ReadFutex { ptr: ptr.cast(), _region: region })
    }

    /// An atomic load.
    #[inline]
    pub fn load(&self, order: Ordering) -> u32 {
        // SAFETY: as in `ReadWord::load`: in bounds, aligned, kept mapped; an atomic load of a
        // lock-free word does not write, so a read-only mapping is fine.
        unsafe { self.ptr.as_ref() }.load(order)
    }

    /// Sleeps while the word still holds `seen`, for at most `timeout`: returns at once if it
    /// does not, when woken, on a signal, or at the timeout (the caller re-checks whatever it
    /// waits for in every case).
    pub fn wait(&self, seen: u32, timeout: Duration) {
        let ts = rustix::thread::futex::Timespec {
            tv_sec: timeout.as_secs().min(i64::MAX as u64) as i64,
            tv_nsec: i64::from(timeout.subsec_nanos()),
        };
        // SAFETY: as in `load`; the kernel only reads the word.
        let word = unsafe { self.ptr.as_ref() };
        // Shared, as in `Futex::wake_all`. Every outcome (woken, EAGAIN, ETIMEDOUT, EINTR)
        // means "look again".
        let _ = rustix::thread::futex::wait(word, rustix::thread::futex::Flags::empty(), seen, Some(&ts));
    }
}
