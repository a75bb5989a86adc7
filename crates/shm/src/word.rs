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
//!
//! Typed layouts (`abi::ring::RingControlView`, `abi::queue::KernelPageView`, ...) are built
//! from these, so no caller handles a raw offset.

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

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
        aligned(offset, 8)?;
        let (base, len, writable) = match self {
            Region::Shm(s) => (s.map.ptr, s.map.len, true),
            Region::Mapping(m) => (m.ptr, m.len, m.prot == Prot::ReadWrite),
            Region::Rotating(p) => (p.ptr, crate::PAGE_SIZE, true),
        };
        in_bounds(offset, 8, len as u64)?;
        // SAFETY: `offset + 8 <= len`, so the result stays inside the mapping; the mapping is
        // page-aligned and `offset` 8-aligned, so the word is 8-aligned.
        let ptr = unsafe { base.add(offset as usize) };
        Ok((ptr.cast(), writable))
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
