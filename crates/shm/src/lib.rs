//! Shared memory for the doorbell stack: memfd-backed regions and CPU mappings of them.
//!
//! A real GPU shares memory three ways: the device reads and writes VRAM and system memory by
//! DMA, the kernel driver maps the same pages, and user-mode clients map parts of them (rings,
//! read/write pointers, fence logs, and the doorbell BAR page) into their own address space.
//! This crate models that with Linux memory files:
//!
//! - a [`Shm`] is a region: whole pages of a memfd plus a read-write view of them (the
//!   "device side" view). [`Shm::new`] gives a region a memfd of its own; a [`ShmPool`]
//!   sub-allocates regions from a few large memfds (arenas), a page at a time;
//! - a [`Mapping`] is a bounds-checked window onto a CPU mapping of a file (what a client
//!   gets). [`Mapping::new`] maps a file range; [`Mapping::window`] and [`Shm::map_range`]
//!   cut further windows out of a mapping that exists, with no system call;
//! - a [`RotatingPage`] is one page of address space whose backing can be swapped between
//!   files (the doorbell "CPU VA rotation": a connected doorbell shows the BAR page, a
//!   disconnected one shows a dummy page).
//!
//! [`sched`] holds the one other system call the stack needs unsafely: a thread's scheduling
//! class (`SCHED_IDLE` and nice 19 for the background-processing pool).
//!
//! Everything is addressed by file descriptor and file offset, never by pointer, because the
//! multi-process mode later passes these fds over a Unix socket and the receiver maps them
//! with [`Mapping::new`] exactly as an in-process client does.
//!
//! # Why arenas
//!
//! A memfd per region costs a descriptor and an `mmap` for the region, and another of each for
//! every client mapping of it: about sixteen descriptors and ten mappings per user-mode queue,
//! which puts ten thousand queues past both the descriptor limit and `vm.max_map_count`. A
//! pool's arena costs one descriptor and one read-write `mmap` (plus one read-only descriptor
//! and `mmap`, the first time a read-only view is asked for) however many regions it holds;
//! regions and the client's views of them are windows onto those mappings. The allocator and
//! its invariants (first fit, coalescing, zeroing, growth, limits) are in the `arena` module.
//!
//! # Invariants
//!
//! - A [`Mapping`] holds its `mmap` alive (an `Arc` shared by all windows onto it), which is
//!   unmapped when the last window drops. The `mmap` is whole pages; a window's `len` need not
//!   be.
//! - Every access is bounds-checked against the window's `len` with overflow-free arithmetic
//!   before any pointer is touched; a failed check is an error, never a panic. A window never
//!   reaches past its own range, whatever else its `mmap` holds.
//! - A region's pages return to their arena (zeroed) only when nothing can reach them: the
//!   region, every window onto it and every rotating page showing it hold its lease. So a
//!   stale handle never sees a later allocation's data.
//! - Isolation between owners is by file: whoever holds a descriptor can map all of its file.
//!   Pools are per owner and per protection class, and a read-only view's descriptor is
//!   opened read-only.
//! - Memfds made here are sealed against shrinking and growing, so a page that was inside the
//!   file when it was mapped stays there (no `SIGBUS` from a peer's `ftruncate`).
//!   [`Mapping::new`] checks the file size when it maps; a mapping of a foreign, unsealed
//!   file can still `SIGBUS` if its owner shrinks it, which kills the process but never
//!   corrupts memory.
//! - A [`RotatingPage`]'s address stays mapped from `new` until drop; rotation replaces the
//!   backing with a single `mmap(MAP_FIXED)`, so other threads see the old or the new page.
//!
//! # Why raw pointers and no slices
//!
//! The bytes of a mapping are written concurrently by other actors: the simulated GPU, the
//! kernel, other clients, possibly other processes. That is what DMA looks like from the CPU.
//! A `&[u8]` over such bytes would promise the compiler that they do not change while the
//! reference lives, and a `&mut [u8]` that nobody else can see them; both promises would be
//! false. So this crate never forms references to shared bytes. Bulk data (ring contents,
//! payloads) moves with volatile accesses, aligned `u64` words in the middle and single bytes
//! at the edges, between the mapping and private buffers the caller owns. Protocol words
//! (write pointers, doorbells, fence values) are accessed as atomics, and it is their
//! Release/Acquire ordering that publishes the bulk data, as a device's doorbell write does.
//!
//! A word should be used either as a protocol word (only through [`Mapping::atomic_u64`] and
//! friends) or as data, not both. Rust's memory model does not define a race between a
//! volatile and an atomic access, or between two volatile accesses; like device-driver code,
//! we rely on aligned volatile accesses being single loads and stores and on every bit
//! pattern of an integer being valid, so a misbehaving peer can only produce wrong numbers,
//! which the protocol layers above validate.

#[cfg(target_endian = "big")]
compile_error!("the doorbell shared-memory layout is little-endian; big-endian targets are unsupported");

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::{NonNull, null_mut};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use rustix::mm::{MapFlags, ProtFlags};

mod arena;
pub mod sched;
#[cfg(feature = "serde")]
#[doc(hidden)]
pub mod serde_str;
mod word;

pub use arena::{PoolConfig, PoolStats, ShmPool};
pub use word::{Futex, ReadFutex, ReadWord, Region, Word};

use arena::{Arena, Lease};

/// `&'static str` under another name, for the field names and reasons typed errors carry:
/// serde's derive would borrow a field spelled `&str` from its input (so it could only be
/// deserialized from `'static` bytes); under this name it takes the field's
/// `deserialize_with` instead, which interns the text (`serde_str`). The same type.
pub type StaticStr = &'static str;

/// The page size the whole stack assumes (doorbell pages, mapping granularity).
pub const PAGE_SIZE: usize = 4096;

/// Errors from creating or accessing shared memory.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ShmError {
    /// A system call failed.
    #[error("memfd_create/ftruncate/mmap failed for {what}: {errno}")]
    Os {
        /// Which operation failed.
        #[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))]
        what: StaticStr,
        /// The error as reported by the OS.
        errno: String,
    },
    /// `[offset, offset + len)` does not lie inside the mapping or file.
    #[error("access out of bounds: offset {offset:#x} + len {len:#x} exceeds size {size:#x}")]
    OutOfBounds {
        /// Start of the access.
        offset: u64,
        /// Length of the access in bytes.
        len: u64,
        /// Size of the mapping or file.
        size: u64,
    },
    /// The offset does not have the required alignment.
    #[error("offset {offset:#x} is not aligned to {align}")]
    Misaligned {
        /// The offending offset.
        offset: u64,
        /// The required alignment in bytes.
        align: u64,
    },
    /// A write or writable view was requested from a read-only mapping.
    #[error("mapping is read-only")]
    ReadOnly,
    /// A [`ShmPool`] would grow past its limit.
    #[error(
        "shared-memory pool {pool:?} is exhausted: {requested:#x} more bytes would pass its limit of {limit:#x} ({reserved:#x} reserved)"
    )]
    Exhausted {
        /// The pool's name.
        pool: String,
        /// The bytes the new arena needed.
        requested: u64,
        /// The bytes the pool's arenas already hold.
        reserved: u64,
        /// The pool's limit.
        limit: u64,
    },
    /// A size is zero or too large.
    #[error("size {size:#x} is invalid: {why}")]
    BadSize {
        /// The offending size.
        size: u64,
        /// Why it is invalid.
        #[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))]
        why: StaticStr,
    },
}

/// Protection of a [`Mapping`].
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prot {
    /// Readable and writable.
    ReadWrite,
    /// Readable only; the CPU faults on stores, so writes are refused up front.
    ReadOnly,
}

fn os(what: &'static str) -> impl FnOnce(rustix::io::Errno) -> ShmError {
    move |errno| ShmError::Os { what, errno: errno.to_string() }
}

fn dup(fd: BorrowedFd<'_>) -> Result<OwnedFd, ShmError> {
    fd.try_clone_to_owned().map_err(|e| ShmError::Os { what: "dup", errno: e.to_string() })
}

fn rw_flags(prot: Prot) -> ProtFlags {
    match prot {
        Prot::ReadWrite => ProtFlags::READ | ProtFlags::WRITE,
        Prot::ReadOnly => ProtFlags::READ,
    }
}

/// `mmap(MAP_SHARED)` of `len` bytes of `fd` at `offset`, at an address the kernel picks.
///
/// # Panics
/// If the system page size is not [`PAGE_SIZE`].
fn mmap_fresh(len: usize, prot: Prot, fd: BorrowedFd<'_>, offset: u64) -> Result<NonNull<u8>, ShmError> {
    let sys = rustix::param::page_size();
    assert_eq!(sys, PAGE_SIZE, "doorbell assumes {PAGE_SIZE}-byte pages, this system has {sys}");
    let (flags, null) = (MapFlags::SHARED, null_mut());
    // SAFETY: without MAP_FIXED the kernel picks unused address space, so the new mapping
    // cannot alias any existing Rust object. Callers check the range lies inside the file.
    let ptr = unsafe { rustix::mm::mmap(null, len, rw_flags(prot), flags, fd, offset) };
    let ptr = ptr.map_err(os("mmap"))?.cast::<u8>();
    Ok(NonNull::new(ptr).expect("mmap without MAP_FIXED never returns null"))
}

fn round_to_pages(size: usize) -> Result<usize, ShmError> {
    let too_large = ShmError::BadSize { size: size as u64, why: "too large" };
    size.checked_next_multiple_of(PAGE_SIZE).filter(|&n| n <= isize::MAX as usize).ok_or(too_large)
}

/// Checks that `[offset, offset + len)` lies inside `size` bytes.
#[inline]
fn in_bounds(offset: u64, len: u64, size: u64) -> Result<(), ShmError> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(ShmError::OutOfBounds { offset, len, size }),
    }
}

/// Checks that `offset` is a multiple of `align`, a power of two.
#[inline]
fn aligned(offset: u64, align: u64) -> Result<(), ShmError> {
    let ok = offset & (align - 1) == 0;
    if ok { Ok(()) } else { Err(ShmError::Misaligned { offset, align }) }
}

/// The private bounce buffer size of [`Mapping::copy`] and [`Mapping::fill_u32`].
const CHUNK: usize = 4096;

/// Splits `len` bytes starting at address `addr` into a byte-wise head (up to the first
/// 8-aligned address), whole aligned `u64` words, and a byte-wise tail. Returns the head
/// length and the end of the words, both relative to `addr`.
fn split(addr: usize, len: usize) -> (usize, usize) {
    let head = (addr.wrapping_neg() % 8).min(len);
    (head, head + (len - head) / 8 * 8)
}

/// Copies `dst.len()` bytes from shared memory at `src` into a private buffer.
///
/// # Safety
/// `src .. src + dst.len()` must be readable memory of a live mapping.
unsafe fn volatile_read(src: *const u8, dst: &mut [u8]) {
    let (head, words_end) = split(src.addr(), dst.len());
    let mut i = 0;
    while i < dst.len() {
        if i >= head && i < words_end {
            // SAFETY: `src + i` is 8-aligned (i - head is a multiple of 8) and
            // `i + 8 <= words_end <= len`, so the word is inside the caller's readable range.
            let w = unsafe { src.add(i).cast::<u64>().read_volatile() };
            dst[i..i + 8].copy_from_slice(&w.to_ne_bytes());
            i += 8;
        } else {
            // SAFETY: `i < len`, inside the caller's readable range.
            dst[i] = unsafe { src.add(i).read_volatile() };
            i += 1;
        }
    }
}

/// Copies a private buffer into shared memory at `dst`.
///
/// # Safety
/// `dst .. dst + src.len()` must be writable memory of a live mapping.
unsafe fn volatile_write(dst: *mut u8, src: &[u8]) {
    let (head, words_end) = split(dst.addr(), src.len());
    let mut i = 0;
    while i < src.len() {
        if i >= head && i < words_end {
            let mut w = [0; 8];
            w.copy_from_slice(&src[i..i + 8]);
            // SAFETY: as in `volatile_read`: aligned and inside the caller's writable range.
            unsafe { dst.add(i).cast::<u64>().write_volatile(u64::from_ne_bytes(w)) };
            i += 8;
        } else {
            // SAFETY: `i < len`, inside the caller's writable range.
            unsafe { dst.add(i).write_volatile(src[i]) };
            i += 1;
        }
    }
}

/// An open file and its identity `(st_dev, st_ino)`, shared by everything that maps it.
#[derive(Debug)]
pub(crate) struct File {
    pub(crate) fd: OwnedFd,
    /// Which file this is, to detect overlap in [`Mapping::copy`] across mappings.
    id: (u64, u64),
}

impl File {
    fn new(fd: OwnedFd) -> Result<File, ShmError> {
        let st = rustix::fs::fstat(&fd).map_err(os("fstat"))?;
        #[allow(clippy::useless_conversion, reason = "not u64 on every target")]
        let id = (u64::from(st.st_dev), u64::from(st.st_ino));
        Ok(File { fd, id })
    }
}

/// One `mmap(MAP_SHARED)` of `len` bytes (whole pages) of `file` at `file_offset`; unmapped
/// when the last [`Mapping`] window onto it drops.
#[derive(Debug)]
pub(crate) struct Area {
    ptr: NonNull<u8>,
    len: usize,
    prot: Prot,
    file: Arc<File>,
    file_offset: u64,
    /// A device registered these pages for DMA ([`DmaArea::pin`]): it keeps reaching the
    /// physical pages it pinned, so they must stay the file's pages (an arena zeroes freed
    /// pages of a pinned area in place instead of punching a hole, which would give the CPU
    /// fresh pages the device never sees).
    pub(crate) pinned: std::sync::atomic::AtomicBool,
}

// SAFETY: an `Area` owns its mapping; nothing about it is tied to a thread, and it is only
// reached through `Mapping`'s volatile and atomic accesses.
unsafe impl Send for Area {}
// SAFETY: as for `Send`; `Area` itself has no `&self` method touching the bytes.
unsafe impl Sync for Area {}

impl Area {
    /// Maps `len` bytes (a whole number of pages) of `file` at page-aligned `file_offset`; the
    /// caller checked the range lies inside the file.
    pub(crate) fn new(file: Arc<File>, file_offset: u64, len: usize, prot: Prot) -> Result<Arc<Area>, ShmError> {
        let ptr = mmap_fresh(len, prot, file.fd.as_fd(), file_offset)?;
        Ok(Arc::new(Area { ptr, len, prot, file, file_offset, pinned: std::sync::atomic::AtomicBool::new(false) }))
    }
}

/// A whole `mmap` held mapped ([`Mapping::dma_area`]): what a device registers for DMA.
#[derive(Clone, Debug)]
pub struct DmaArea {
    area: Arc<Area>,
}

impl DmaArea {
    /// CPU address of the mapping's first byte.
    pub fn addr(&self) -> usize {
        self.area.ptr.as_ptr().addr()
    }

    /// Its length in bytes (whole pages).
    #[expect(clippy::len_without_is_empty, reason = "a mapping is never empty")]
    pub fn len(&self) -> usize {
        self.area.len
    }

    /// Whether the mapping is writable.
    pub fn prot(&self) -> Prot {
        self.area.prot
    }

    /// Declares that a device now reaches these pages by DMA (its driver pinned them): from
    /// now on pages freed in this mapping are zeroed in place, never replaced, so the device
    /// and the CPU keep seeing the same memory. Call it before the registration.
    pub fn pin(&self) {
        // Release: pairs with the acquire in the arena's release path; a flag, nothing else
        // published with it.
        self.area.pinned.store(true, std::sync::atomic::Ordering::Release);
    }
}

impl Drop for Area {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what `mmap` returned, and no window into the area
        // outlives it (each holds an `Arc<Area>`; atomic views borrow the window).
        let r = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
        debug_assert!(r.is_ok(), "munmap failed: {r:?}");
    }
}

/// A bounds-checked window of `len` bytes onto a CPU mapping (`mmap(MAP_SHARED)`) of a file,
/// starting at a page-aligned file offset.
///
/// Several windows may share one `mmap` (an arena is mapped once and every allocation in it
/// is a window, see [`ShmPool`]); the `mmap` is unmapped when its last window drops, and a
/// window onto an allocation keeps that allocation's pages from being reused while it lives.
/// All accessors take `&self`: the bytes are shared, so mutation through a shared handle is
/// the point.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    prot: Prot,
    file_offset: u64,
    area: Arc<Area>,
    /// The pages this window shows, when they belong to an allocation: held, so they are not
    /// handed to another allocation while this window can reach them.
    lease: Option<Arc<Lease>>,
}

// SAFETY: `Mapping` holds its area alive; nothing about it is tied to a thread. All accesses
// go through volatile or atomic operations on raw pointers, which are as valid from any thread
// as from the creating one (the bytes are designed to be shared concurrently).
unsafe impl Send for Mapping {}
// SAFETY: see `Send`; `&self` methods never hand out references to non-atomic shared bytes.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` starting at `file_offset`, which must be page-aligned.
    ///
    /// `len` must be non-zero and `file_offset + len` must lie inside the file. The mapping
    /// is rounded up to whole pages, but [`len`](Self::len) and all bounds checks use `len`.
    /// Costs one descriptor (a duplicate of `fd`) and one `mmap`; further views of the same
    /// range are cheaper as [`window`](Self::window)s.
    ///
    /// # Panics
    /// If the system page size is not [`PAGE_SIZE`].
    pub fn new(fd: BorrowedFd<'_>, file_offset: u64, len: usize, prot: Prot) -> Result<Mapping, ShmError> {
        if len == 0 {
            return Err(ShmError::BadSize { size: 0, why: "a mapping must not be empty" });
        }
        aligned(file_offset, PAGE_SIZE as u64)?;
        let map_len = round_to_pages(len)?;
        let st = rustix::fs::fstat(fd).map_err(os("fstat"))?;
        in_bounds(file_offset, len as u64, u64::try_from(st.st_size).unwrap_or(0))?;
        let file = Arc::new(File::new(dup(fd)?)?);
        Ok(Mapping::in_area(Area::new(file, file_offset, map_len, prot)?, 0, len, None))
    }

    /// The window of `len` bytes at byte `offset` of `area`; the caller checked the range.
    pub(crate) fn in_area(area: Arc<Area>, offset: usize, len: usize, lease: Option<Arc<Lease>>) -> Mapping {
        debug_assert!(offset + len <= area.len && offset.is_multiple_of(PAGE_SIZE));
        // `offset < area.len`: inside the mapping.
        let ptr = NonNull::new(area.ptr.as_ptr().wrapping_add(offset)).expect("inside a mapping");
        let (prot, file_offset) = (area.prot, area.file_offset + offset as u64);
        Mapping { ptr, len, prot, file_offset, area, lease }
    }

    /// A further view of `len` bytes at page-aligned `offset` of this mapping, with the same
    /// protection, sharing its `mmap` and descriptor (no system call). Bounds-checked; what a
    /// client that mapped a whole arena once hands out for each allocation in it.
    pub fn window(&self, offset: u64, len: usize) -> Result<Mapping, ShmError> {
        if len == 0 {
            return Err(ShmError::BadSize { size: 0, why: "a mapping must not be empty" });
        }
        aligned(offset, PAGE_SIZE as u64)?;
        round_to_pages(len)?;
        in_bounds(offset, len as u64, self.len as u64)?;
        let at = self.ptr.as_ptr().addr() - self.area.ptr.as_ptr().addr() + offset as usize;
        Ok(Mapping::in_area(self.area.clone(), at, len, self.lease.clone()))
    }

    /// The requested length in bytes (not rounded to pages).
    #[expect(clippy::len_without_is_empty, reason = "a mapping is never empty")]
    pub fn len(&self) -> usize {
        self.len
    }

    /// The CPU address of byte 0 of this window, as a number: what a device that reaches this
    /// process's memory by DMA is told (a registration with a GPU driver, a device page
    /// table). Only an address: nothing here dereferences it.
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr().addr()
    }

    /// The whole `mmap` this window is cut from: its CPU address, its length in bytes (whole
    /// pages), and a handle that keeps it mapped while held. A device registers the `mmap`
    /// once (an arena serves many regions) and keeps the handle for as long as the
    /// registration lives, so the pages it may reach by DMA cannot be unmapped under it.
    pub fn dma_area(&self) -> DmaArea {
        DmaArea { area: self.area.clone() }
    }

    /// The protection this mapping was created with.
    pub fn prot(&self) -> Prot {
        self.prot
    }

    /// The mapped file. Shared by every window of one `mmap`; for a read-only view of an
    /// arena it is a read-only descriptor, so it cannot be mapped writable again.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.area.file.fd.as_fd()
    }

    /// The file offset of byte 0 of this mapping.
    pub fn file_offset(&self) -> u64 {
        self.file_offset
    }

    /// Returns a pointer to byte `offset` after checking `[offset, offset + len)` is in bounds.
    #[inline]
    fn at(&self, offset: u64, len: u64) -> Result<*mut u8, ShmError> {
        in_bounds(offset, len, self.len as u64)?;
        // `offset <= self.len`, so this stays inside (or one past) the mapping.
        Ok(self.ptr.as_ptr().wrapping_add(offset as usize))
    }

    #[inline]
    fn writable(&self) -> Result<(), ShmError> {
        match self.prot {
            Prot::ReadWrite => Ok(()),
            Prot::ReadOnly => Err(ShmError::ReadOnly),
        }
    }

    /// Makes the pages holding `[offset, offset + len)` resident now, as pinning does: their
    /// page faults are taken here rather than at their first touch (for a ring, on the
    /// submission path). Contents are unchanged. A kernel too old for it (before Linux 5.14)
    /// makes this a no-op: it is an optimization, not a guarantee.
    pub fn populate(&self, offset: u64, len: u64) -> Result<(), ShmError> {
        in_bounds(offset, len, self.len as u64)?;
        let page = PAGE_SIZE as u64;
        let start = offset / page * page;
        // (In bounds, so no overflow; a mapping's length is whole pages, the min is for one
        // that is not.)
        let end = ((offset + len).div_ceil(page) * page).min(self.len as u64);
        if end <= start {
            return Ok(());
        }
        let p = self.at(start, end - start)?;
        // `[p, p + (end - start))` lies inside this live mapping (`at`), and starts on a page
        // boundary (mappings start on one, and `start` is a multiple of a page).
        populate(p, (end - start) as usize, self.prot)
    }

    /// Copies `dst.len()` bytes at `offset` out of the mapping.
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> Result<(), ShmError> {
        let p = self.at(offset, dst.len() as u64)?;
        // SAFETY: `at` checked the range lies inside this live, readable mapping.
        unsafe { volatile_read(p, dst) };
        Ok(())
    }

    /// Copies `src` into the mapping at `offset`.
    pub fn write(&self, offset: u64, src: &[u8]) -> Result<(), ShmError> {
        self.writable()?;
        let p = self.at(offset, src.len() as u64)?;
        // SAFETY: `at` checked the range lies inside this live mapping, which is writable.
        unsafe { volatile_write(p, src) };
        Ok(())
    }

    /// Reads little-endian `u32`s at a 4-aligned `offset`.
    #[inline]
    pub fn read_u32s(&self, offset: u64, dst: &mut [u32]) -> Result<(), ShmError> {
        let p = self.at(offset, size_of_val(dst) as u64)?.cast::<u32>();
        aligned(offset, 4)?;
        for (i, d) in dst.iter_mut().enumerate() {
            // SAFETY: in bounds (checked by `at`), 4-aligned (page-aligned base, 4-aligned offset).
            *d = unsafe { p.add(i).read_volatile() };
        }
        Ok(())
    }

    /// Writes little-endian `u32`s at a 4-aligned `offset`.
    #[inline]
    pub fn write_u32s(&self, offset: u64, src: &[u32]) -> Result<(), ShmError> {
        self.writable()?;
        let p = self.at(offset, size_of_val(src) as u64)?.cast::<u32>();
        aligned(offset, 4)?;
        for (i, &s) in src.iter().enumerate() {
            // SAFETY: in bounds, 4-aligned, and the mapping is writable.
            unsafe { p.add(i).write_volatile(s) };
        }
        Ok(())
    }

    /// Reads a little-endian `u32` at any offset (one access if 4-aligned). Not atomic: use it
    /// for data, not protocol words.
    #[inline]
    pub fn read_u32(&self, offset: u64) -> Result<u32, ShmError> {
        if offset.is_multiple_of(4) {
            let p = self.at(offset, 4)?;
            // SAFETY: `at` checked the word lies inside this live, readable mapping; it is
            // 4-aligned (page-aligned base, 4-aligned offset).
            return Ok(u32::from_le(unsafe { p.cast::<u32>().read_volatile() }));
        }
        let mut b = [0; 4];
        self.read(offset, &mut b).map(|()| u32::from_le_bytes(b))
    }

    /// Reads a little-endian `u64` at any offset (one access if 8-aligned). Not atomic.
    #[inline]
    pub fn read_u64(&self, offset: u64) -> Result<u64, ShmError> {
        if offset.is_multiple_of(8) {
            let p = self.at(offset, 8)?;
            // SAFETY: as in `read_u32`, for an 8-aligned 8-byte word.
            return Ok(u64::from_le(unsafe { p.cast::<u64>().read_volatile() }));
        }
        let mut b = [0; 8];
        self.read(offset, &mut b).map(|()| u64::from_le_bytes(b))
    }

    /// Writes a little-endian `u32` at any offset (one access if 4-aligned). Not atomic.
    #[inline]
    pub fn write_u32(&self, offset: u64, v: u32) -> Result<(), ShmError> {
        if offset.is_multiple_of(4) {
            self.writable()?;
            let p = self.at(offset, 4)?;
            // SAFETY: `at` checked the word lies inside this live mapping, which is writable;
            // it is 4-aligned (page-aligned base, 4-aligned offset).
            unsafe { p.cast::<u32>().write_volatile(v.to_le()) };
            return Ok(());
        }
        self.write(offset, &v.to_le_bytes())
    }

    /// Writes a little-endian `u64` at any offset (one access if 8-aligned). Not atomic.
    #[inline]
    pub fn write_u64(&self, offset: u64, v: u64) -> Result<(), ShmError> {
        if offset.is_multiple_of(8) {
            self.writable()?;
            let p = self.at(offset, 8)?;
            // SAFETY: as in `write_u32`, for an 8-aligned 8-byte word.
            unsafe { p.cast::<u64>().write_volatile(v.to_le()) };
            return Ok(());
        }
        self.write(offset, &v.to_le_bytes())
    }

    /// Fills the bytes `[offset, offset + len)` with `pattern` repeated little-endian, its
    /// phase starting at `offset`; a partial last word gets the pattern's low bytes.
    pub fn fill_u32(&self, offset: u64, len: u64, pattern: u32) -> Result<(), ShmError> {
        self.writable()?;
        let p = self.at(offset, len)?;
        // Chunks are a multiple of 4 bytes long, so each starts at pattern phase 0.
        let buf: [u8; CHUNK] = std::array::from_fn(|i| pattern.to_le_bytes()[i % 4]);
        for at in (0..len as usize).step_by(CHUNK) {
            let n = CHUNK.min(len as usize - at);
            // SAFETY: `[at, at + n)` is inside `[0, len)`, which `at()` checked; writable.
            unsafe { volatile_write(p.add(at), &buf[..n]) };
        }
        Ok(())
    }

    /// Copy `len` bytes from `src[src_off..]` to `dst[dst_off..]`; src and dst may be the same
    /// mapping or two mappings of the same file, with overlap (memmove semantics).
    pub fn copy(src: &Mapping, src_off: u64, dst: &Mapping, dst_off: u64, len: u64) -> Result<(), ShmError> {
        dst.writable()?;
        let s = src.at(src_off, len)?;
        let d = dst.at(dst_off, len)?;
        // Overlap is a property of file positions, not addresses: two mappings of one file
        // alias at different addresses. Positions are below the file size, so no overflow.
        let (sf, df) = (src.file_offset + src_off, dst.file_offset + dst_off);
        let backward = src.area.file.id == dst.area.file.id && df > sf && df < sf + len;
        // Bounce through a private buffer chunk by chunk. Walking chunks in memmove order
        // means a chunk's writes only clobber source bytes that were already read.
        let mut buf = [0u8; CHUNK];
        let len = len as usize;
        for done in (0..len).step_by(CHUNK) {
            let n = CHUNK.min(len - done);
            let at = if backward { len - done - n } else { done };
            // SAFETY: `[at, at + n)` is inside `[0, len)`, which `at()` checked for both
            // mappings; `dst` is writable. Source and buffer are distinct memory.
            unsafe {
                volatile_read(s.add(at), &mut buf[..n]);
                volatile_write(d.add(at), &buf[..n]);
            }
        }
        Ok(())
    }

    /// An atomic view of an 8-aligned `u64` inside the mapping.
    ///
    /// For read-only mappings this returns [`ShmError::ReadOnly`] (a store would fault); use
    /// [`load_u64`](Self::load_u64) instead.
    #[inline]
    pub fn atomic_u64(&self, offset: u64) -> Result<&AtomicU64, ShmError> {
        let p = self.at(offset, 8)?;
        aligned(offset, 8)?;
        self.writable()?;
        // SAFETY: the word is in bounds, 8-aligned, readable and writable, and stays mapped
        // for the lifetime of `&self`. By this crate's contract (see the crate docs) the word
        // is a protocol word, accessed by all actors only atomically.
        Ok(unsafe { AtomicU64::from_ptr(p.cast()) })
    }

    /// An atomic view of a 4-aligned `u32` inside the mapping; like [`atomic_u64`](Self::atomic_u64).
    pub fn atomic_u32(&self, offset: u64) -> Result<&AtomicU32, ShmError> {
        let p = self.at(offset, 4)?;
        aligned(offset, 4)?;
        self.writable()?;
        // SAFETY: as in `atomic_u64`, for a 4-aligned 4-byte word.
        Ok(unsafe { AtomicU32::from_ptr(p.cast()) })
    }

    /// Atomic load of an 8-aligned `u64`; works on read-only mappings too.
    ///
    /// # Panics
    /// If `order` is `Release` or `AcqRel`, like [`AtomicU64::load`].
    #[inline]
    pub fn load_u64(&self, offset: u64, order: Ordering) -> Result<u64, ShmError> {
        let p = self.at(offset, 8)?;
        aligned(offset, 8)?;
        // SAFETY: in bounds, 8-aligned, readable, mapped for the duration of the call. The
        // std atomic docs allow plain atomic loads of this size on read-only memory; we only
        // load, and the temporary reference does not escape.
        Ok(unsafe { &*p.cast::<AtomicU64>() }.load(order))
    }
}

static NEXT_SHM_ID: AtomicU64 = AtomicU64::new(1);

/// A shared region: whole pages of a memfd plus a read-write view of all of them (the "device
/// side" view). Zero-filled; the size is rounded up to whole pages. Derefs to that
/// [`Mapping`], so `shm.read_u32(..)` works.
///
/// Made by [`Shm::new`] (a memfd of its own) or [`ShmPool::alloc`] (pages of one of the
/// pool's arenas). Either way offsets are relative to the region; the pages return to their
/// arena, zeroed, when the last holder (this value, its [`Mapping`] windows, a
/// [`RotatingPage`] showing it) drops.
#[derive(Debug)]
pub struct Shm {
    id: u64,
    map: Mapping,
}

impl Shm {
    /// Creates a region of `size` bytes (rounded up to pages) in a memfd of its own (sealed
    /// against resizing); `name` shows in `/proc/*/maps`. Costs one descriptor and one `mmap`;
    /// many small regions should come from a [`ShmPool`] instead.
    pub fn new(name: &str, size: usize) -> Result<Arc<Shm>, ShmError> {
        if size == 0 {
            return Err(ShmError::BadSize { size: 0, why: "a region must not be empty" });
        }
        let len = round_to_pages(size)?;
        let arena = Arena::new(name, len)?;
        let lease = arena.lease(len).expect("a new arena has room for its own size");
        Ok(Shm::from_lease(lease))
    }

    /// The region over `lease`'s pages.
    pub(crate) fn from_lease(lease: Lease) -> Arc<Shm> {
        let (area, offset, len) = (lease.arena().rw().clone(), lease.offset(), lease.len());
        let map = Mapping::in_area(area, offset, len, Some(Arc::new(lease)));
        Arc::new(Shm { id: NEXT_SHM_ID.fetch_add(1, Ordering::Relaxed), map })
    }

    fn lease(&self) -> &Arc<Lease> {
        self.map.lease.as_ref().expect("a region's view always holds its lease")
    }

    /// A process-unique identity of this region.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Size in bytes (a whole number of pages).
    #[expect(clippy::len_without_is_empty, reason = "a region is never empty")]
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// The memfd the region lives in (its own, or its arena's: see
    /// [`file_offset`](Self::file_offset)).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.map.fd()
    }

    /// Where byte 0 of the region is in [`fd`](Self::fd) (0 for a [`Shm::new`] region).
    pub fn file_offset(&self) -> u64 {
        self.map.file_offset()
    }

    /// The whole-region read-write mapping.
    pub fn map(&self) -> &Mapping {
        &self.map
    }

    /// A view of `len` bytes at page-aligned `offset` of the region (what a client gets). It
    /// shares the arena's one `mmap` for its protection (made once, on the first read-only
    /// view), so it costs no descriptor and no `mmap` of its own. A read-only view's
    /// [`Mapping::fd`] is a read-only descriptor. The view keeps the region's pages from
    /// being reused until it drops.
    pub fn map_range(&self, offset: u64, len: usize, prot: Prot) -> Result<Mapping, ShmError> {
        if len == 0 {
            return Err(ShmError::BadSize { size: 0, why: "a mapping must not be empty" });
        }
        aligned(offset, PAGE_SIZE as u64)?;
        round_to_pages(len)?;
        in_bounds(offset, len as u64, self.len() as u64)?;
        let lease = self.lease();
        let area = match prot {
            Prot::ReadWrite => lease.arena().rw().clone(),
            Prot::ReadOnly => lease.arena().ro()?,
        };
        Ok(Mapping::in_area(area, lease.offset() + offset as usize, len, Some(lease.clone())))
    }
}

impl std::ops::Deref for Shm {
    type Target = Mapping;
    fn deref(&self) -> &Mapping {
        &self.map
    }
}

/// One page of a region's read-write mapping showing a page of another region instead
/// ([`Shm::alias_page`]); the page shows its own backing again when this drops.
///
/// What the daemon uses to hand a client one doorbell page without handing it the whole
/// BAR file: the BAR page the firmware reads is replaced, in the daemon's address space, by
/// a page of a memfd of its own, whose descriptor the client gets. Undoing it cuts the client
/// off: its later writes land in a file nothing reads.
#[derive(Debug)]
pub struct PageAlias {
    target: Arc<Shm>,
    page_offset: u64,
    source: Arc<Shm>,
}

impl PageAlias {
    /// The region whose page now shows through.
    pub fn source(&self) -> &Arc<Shm> {
        &self.source
    }

    /// The aliased page's offset in the target region.
    pub fn page_offset(&self) -> u64 {
        self.page_offset
    }

    fn map(&self, page: &Shm, page_offset: u64) -> Result<(), ShmError> {
        let b = Backing::of(page, page_offset)?;
        let addr = self.target.map.ptr.as_ptr().wrapping_add(self.page_offset as usize);
        let flags = MapFlags::SHARED | MapFlags::FIXED;
        // SAFETY: `addr` is a whole page inside the target region's read-write mapping
        // (checked in `alias_page`), which the `Arc<Shm>` held here keeps mapped. MAP_FIXED
        // replaces that page only, read-write before and after, so every reference into the
        // region stays valid; only the memory behind the page changes, which the crate's
        // contract (shared bytes are only reached atomically or volatilely) allows.
        let r = unsafe {
            rustix::mm::mmap(addr.cast(), PAGE_SIZE, rw_flags(Prot::ReadWrite), flags, b.fd(), b.file_offset())
        };
        r.map(|_| ()).map_err(os("mmap(MAP_FIXED) alias"))
    }
}

impl Drop for PageAlias {
    fn drop(&mut self) {
        let (target, offset) = (self.target.clone(), self.page_offset);
        if self.map(&target, offset).is_err() {
            // The page may be unmapped now, under live references: do not go on.
            std::process::abort();
        }
    }
}

impl Shm {
    /// Makes the page at `page_offset` of this region show page 0 of `source` (its contents
    /// copied there first), until the returned guard drops. `source` must be a read-write
    /// region of at least one page. The caller keeps one alias per page at a time.
    pub fn alias_page(self: &Arc<Self>, page_offset: u64, source: Arc<Shm>) -> Result<PageAlias, ShmError> {
        check_page(self, page_offset)?;
        check_page(&source, 0)?;
        let mut buf = [0u8; PAGE_SIZE];
        self.read(page_offset, &mut buf)?;
        source.write(0, &buf)?;
        let alias = PageAlias { target: self.clone(), page_offset, source };
        // On failure the guard drops and maps the page's own backing back (or aborts).
        alias.map(&alias.source, 0)?;
        Ok(alias)
    }
}

/// Checks that `[page_offset, page_offset + PAGE_SIZE)` is a whole page of `shm`.
fn check_page(shm: &Shm, page_offset: u64) -> Result<(), ShmError> {
    in_bounds(page_offset, PAGE_SIZE as u64, shm.len() as u64)?;
    aligned(page_offset, PAGE_SIZE as u64)
}

/// What a [`RotatingPage`] shows: a page of a region, whose pages it holds, or a page of a
/// file received as a descriptor (a client of the daemon), whose file it holds.
#[derive(Debug)]
struct Backing {
    keep: Keep,
    id: u64,
    page_offset: u64,
}

/// What keeps a [`Backing`]'s page alive.
#[derive(Debug)]
enum Keep {
    /// A region's pages.
    Lease(Arc<Lease>),
    /// A file, at this page-aligned offset.
    File(Arc<File>, u64),
}

impl Backing {
    fn of(shm: &Shm, page_offset: u64) -> Result<Backing, ShmError> {
        check_page(shm, page_offset)?;
        Ok(Backing { keep: Keep::Lease(shm.lease().clone()), id: shm.id(), page_offset })
    }

    /// The page at `file_offset` of the file `fd` (checked to lie inside it); its id is 0.
    fn of_fd(fd: BorrowedFd<'_>, file_offset: u64) -> Result<Backing, ShmError> {
        aligned(file_offset, PAGE_SIZE as u64)?;
        let st = rustix::fs::fstat(fd).map_err(os("fstat"))?;
        in_bounds(file_offset, PAGE_SIZE as u64, u64::try_from(st.st_size).unwrap_or(0))?;
        let file = Arc::new(File::new(dup(fd)?)?);
        Ok(Backing { keep: Keep::File(file, file_offset), id: 0, page_offset: file_offset })
    }

    fn fd(&self) -> BorrowedFd<'_> {
        match &self.keep {
            Keep::Lease(lease) => lease.arena().fd(),
            Keep::File(file, _) => file.fd.as_fd(),
        }
    }

    /// The page's offset in its file.
    fn file_offset(&self) -> u64 {
        match &self.keep {
            Keep::Lease(lease) => lease.offset() as u64 + self.page_offset,
            Keep::File(_, offset) => *offset,
        }
    }
}

/// One page of CPU virtual address whose backing can be swapped atomically between pages of
/// different regions: the doorbell "CPU VA rotation". Connected, it shows a doorbell BAR
/// page; disconnected, it shows a dummy page where writes have no effect.
///
/// References from [`atomic_u64`](Self::atomic_u64) stay valid across rotations: the address
/// stays mapped, only the backing page changes. Unmapped on drop.
#[derive(Debug)]
pub struct RotatingPage {
    ptr: NonNull<u8>,
    backing: Mutex<Backing>,
}

// SAFETY: as for `Mapping`: the page is owned by this value and only accessed atomically.
unsafe impl Send for RotatingPage {}
// SAFETY: as for `Mapping`; rotation is serialized by the mutex and is atomic for readers.
unsafe impl Sync for RotatingPage {}

impl RotatingPage {
    /// Maps the page at page-aligned `page_offset` of `initial`.
    pub fn new(initial: &Shm, page_offset: u64) -> Result<RotatingPage, ShmError> {
        let b = Backing::of(initial, page_offset)?;
        let ptr = mmap_fresh(PAGE_SIZE, Prot::ReadWrite, b.fd(), b.file_offset())?;
        // Resident from the start, and after every rotation: a doorbell write is a store,
        // never a page fault. (A hint: a page left unpopulated faults in at its first write.)
        let _ = populate(ptr.as_ptr(), PAGE_SIZE, Prot::ReadWrite);
        Ok(RotatingPage { ptr, backing: Mutex::new(b) })
    }

    /// Replaces the backing with the page at `page_offset` of `target`, in one
    /// `mmap(MAP_FIXED)`. Concurrent accessors see either the old or the new page; callers
    /// that need an access to land on a particular page must synchronize with the rotation.
    pub fn rotate_to(&self, target: &Shm, page_offset: u64) -> Result<(), ShmError> {
        self.rotate(Backing::of(target, page_offset)?)
    }

    /// Like [`rotate_to`](Self::rotate_to), to the page at page-aligned `file_offset` of the
    /// file `fd` (a descriptor received from the daemon); [`current`](Self::current) then
    /// reports id 0 and that offset. The page is mapped read-write, so `fd` must be.
    pub fn rotate_to_fd(&self, fd: BorrowedFd<'_>, file_offset: u64) -> Result<(), ShmError> {
        self.rotate(Backing::of_fd(fd, file_offset)?)
    }

    fn rotate(&self, new: Backing) -> Result<(), ShmError> {
        let mut backing = self.backing.lock().unwrap_or_else(PoisonError::into_inner);
        let remap = |b: &Backing| {
            let (addr, flags) = (self.ptr.as_ptr().cast(), MapFlags::SHARED | MapFlags::FIXED);
            // SAFETY: `addr` is the page this value mapped in `new` and still owns, so
            // MAP_FIXED replaces nothing else. Outstanding `&AtomicU64`s into it stay valid:
            // the address is mapped read-write before and after, only the backing changes.
            unsafe { rustix::mm::mmap(addr, PAGE_SIZE, rw_flags(Prot::ReadWrite), flags, b.fd(), b.file_offset()) }
        };
        if let Err(e) = remap(&new) {
            // A failed MAP_FIXED may leave the page unmapped while atomic views into it are
            // alive: put the old page back, or abort rather than let them dangle.
            if remap(&backing).is_err() {
                std::process::abort();
            }
            return Err(os("mmap(MAP_FIXED)")(e));
        }
        *backing = new;
        let _ = populate(self.ptr.as_ptr(), PAGE_SIZE, Prot::ReadWrite);
        Ok(())
    }

    /// An atomic view of the 8-aligned `u64` at `offset` (< [`PAGE_SIZE`]) of the page.
    pub fn atomic_u64(&self, offset: u64) -> Result<&AtomicU64, ShmError> {
        in_bounds(offset, 8, PAGE_SIZE as u64)?;
        aligned(offset, 8)?;
        // SAFETY: in bounds of the page, 8-aligned, and the address stays mapped read-write
        // until `self` is dropped (rotation swaps the backing, never unmaps).
        Ok(unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(offset as usize).cast()) })
    }

    /// The current backing: ([`Shm::id`], page offset).
    pub fn current(&self) -> (u64, u64) {
        let b = self.backing.lock().unwrap_or_else(PoisonError::into_inner);
        (b.id, b.page_offset)
    }
}

impl Drop for RotatingPage {
    fn drop(&mut self) {
        // SAFETY: this page was mapped in `new`, and no view into it outlives `self`.
        let r = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), PAGE_SIZE) };
        debug_assert!(r.is_ok(), "munmap failed: {r:?}");
    }
}

/// Populates `len` bytes of pages from page-aligned `p`, a range of a live mapping with
/// protection `prot` (see [`Mapping::populate`]); a kernel without `MADV_POPULATE_*` makes it a
/// no-op.
fn populate(p: *mut u8, len: usize, prot: Prot) -> Result<(), ShmError> {
    let advice = match prot {
        Prot::ReadWrite => rustix::mm::Advice::LinuxPopulateWrite,
        Prot::ReadOnly => rustix::mm::Advice::LinuxPopulateRead,
    };
    // SAFETY: the callers pass a page-aligned range of a mapping they keep alive; populating
    // changes no byte of it (nor any mapping), it only takes the page faults now.
    match unsafe { rustix::mm::madvise(p.cast(), len, advice) } {
        Ok(()) | Err(rustix::io::Errno::INVAL) => Ok(()),
        Err(e) => Err(os("madvise(MADV_POPULATE)")(e)),
    }
}

#[cfg(test)]
mod alias_tests {
    use super::*;

    /// Populating keeps every byte (of a read-write and of a read-only view, the latter
    /// written through the former), refuses a range past the mapping, and a doorbell page
    /// populated at each rotation still shows the page it rotated to.
    #[test]
    fn populating_changes_no_byte() {
        let shm = Shm::new("populate", 4 * PAGE_SIZE).unwrap();
        shm.write_u64(PAGE_SIZE as u64 + 16, 0x1234).unwrap();
        shm.populate(PAGE_SIZE as u64 + 8, 2 * PAGE_SIZE as u64).unwrap();
        assert_eq!(shm.read_u64(PAGE_SIZE as u64 + 16).unwrap(), 0x1234);
        assert_eq!(shm.read_u64(3 * PAGE_SIZE as u64).unwrap(), 0, "a fresh page stays zero");
        let ro = shm.map_range(0, 4 * PAGE_SIZE, Prot::ReadOnly).unwrap();
        ro.populate(0, 4 * PAGE_SIZE as u64).unwrap();
        assert_eq!(ro.read_u64(PAGE_SIZE as u64 + 16).unwrap(), 0x1234);
        assert!(matches!(shm.populate(5 * PAGE_SIZE as u64, 8), Err(ShmError::OutOfBounds { .. })));
        let (a, b) = (Shm::new("a", PAGE_SIZE).unwrap(), Shm::new("b", PAGE_SIZE).unwrap());
        b.write_u64(8, 5).unwrap();
        let page = RotatingPage::new(&a, 0).unwrap();
        page.rotate_to(&b, 0).unwrap();
        assert_eq!(page.atomic_u64(8).unwrap().load(Ordering::Relaxed), 5);
    }

    /// A page alias shows the source page through the target's mapping (words written either
    /// way meet), and dropping it shows the target's own page again, untouched meanwhile.
    #[test]
    fn alias_page_shows_source_until_dropped() {
        let bar = Shm::new("bar", 2 * PAGE_SIZE).unwrap();
        bar.write_u64(PAGE_SIZE as u64 + 8, 7).unwrap();
        let page = Shm::new("page", PAGE_SIZE).unwrap();
        let alias = bar.alias_page(PAGE_SIZE as u64, page.clone()).unwrap();
        assert_eq!(page.read_u64(8).unwrap(), 7, "contents copied to the source first");
        page.write_u64(16, 9).unwrap();
        assert_eq!(bar.read_u64(PAGE_SIZE as u64 + 16).unwrap(), 9);
        bar.write_u64(PAGE_SIZE as u64 + 24, 11).unwrap();
        assert_eq!(page.read_u64(24).unwrap(), 11);
        drop(alias);
        assert_eq!(bar.read_u64(PAGE_SIZE as u64 + 16).unwrap(), 0, "own page again");
        page.write_u64(32, 5).unwrap();
        assert_eq!(bar.read_u64(PAGE_SIZE as u64 + 32).unwrap(), 0, "the source is cut off");
        assert!(bar.alias_page(3 * PAGE_SIZE as u64, page).is_err());
    }

    /// A rotating page can show a page of a file known only by its descriptor.
    #[test]
    fn rotating_page_over_a_descriptor() {
        let dummy = Shm::new("dummy", PAGE_SIZE).unwrap();
        let file = Shm::new("file", 2 * PAGE_SIZE).unwrap();
        let page = RotatingPage::new(&dummy, 0).unwrap();
        page.rotate_to_fd(file.fd(), PAGE_SIZE as u64).unwrap();
        page.atomic_u64(8).unwrap().store(3, Ordering::Relaxed);
        assert_eq!(file.read_u64(PAGE_SIZE as u64 + 8).unwrap(), 3);
        assert_eq!(page.current(), (0, PAGE_SIZE as u64));
        assert!(page.rotate_to_fd(file.fd(), 2 * PAGE_SIZE as u64).is_err(), "outside the file");
        page.rotate_to(&dummy, 0).unwrap();
        assert_eq!(page.atomic_u64(8).unwrap().load(Ordering::Relaxed), 0);
    }
}
