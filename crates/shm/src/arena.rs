//! Arenas: a few large memfds, sub-allocated a page at a time.
//!
//! A memfd per allocation costs a descriptor and an `mmap` per allocation, and a user-mode
//! queue needs about eight allocations (ring, ring control, kernel page, two fence logs,
//! context save, ...): ten thousand queues would need more descriptors than a process may
//! hold and a good part of `vm.max_map_count`. An [`ShmPool`] instead makes a few large
//! memfds (arenas), maps each once read-write (and once read-only, the first time a
//! read-only view is asked for), and hands out page ranges of them as [`Shm`]s: a window onto
//! the arena's mapping, no system call, no descriptor.
//!
//! # Invariants
//!
//! - An arena's free list and its leases partition its pages: a page is in exactly one lease
//!   or in the free list. First fit, freed ranges coalesce with their neighbours.
//! - A [`Lease`] returns its pages when it drops, and it drops only when nothing can reach
//!   them: the [`Shm`], each [`crate::Mapping`] window onto it, each
//!   [`crate::RotatingPage`] showing one of its pages and the GPU mappings (which hold the
//!   `Arc<Shm>`) all hold it. So a range is never reachable through a stale handle once it
//!   belongs to another allocation.
//! - Pages are zeroed on their way back (`fallocate(PUNCH_HOLE)`, which also gives the
//!   memory back to the system), so an allocation never sees a previous one's data. An arena
//!   a device registered for DMA (`DmaArea::pin`) is zeroed in place instead: the device
//!   keeps the physical pages it pinned, and a hole would hand the CPU fresh ones it never
//!   sees.
//! - An arena's size is fixed (sealed against shrinking and growing), so a page that was
//!   inside it when it was mapped stays there. A pool grows by adding arenas, each up to
//!   twice the last (from [`PoolConfig::first_arena`] to [`PoolConfig::max_arena`]); an
//!   allocation larger than `max_arena` gets an arena of its own size. Past
//!   [`PoolConfig::limit`] bytes of arenas, allocation fails with [`ShmError::Exhausted`].
//! - Isolation is by arena: whoever holds an arena's descriptor can map all of it. So pages
//!   of different owners (processes) or of different protection (what a client may write,
//!   what it may only read, what it must not see) belong in different pools; a pool never
//!   mixes them. A read-only view's descriptor is opened read-only, so it cannot be mapped
//!   writable.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use rustix::fs::{FallocateFlags, MemfdFlags, OFlags, SealFlags};

use crate::{Area, File, PAGE_SIZE, Prot, Shm, ShmError, os, round_to_pages, volatile_write};

/// One memfd, mapped read-write once (read-only once, on demand), and the free page ranges in it.
#[derive(Debug)]
pub(crate) struct Arena {
    rw: Arc<Area>,
    ro: Mutex<Option<Arc<Area>>>,
    /// Free ranges: start byte -> length in bytes, both page multiples.
    free: Mutex<BTreeMap<usize, usize>>,
    /// Bytes in leases. Relaxed everywhere: a statistic ([`ShmPool::stats`]); the free
    /// list's lock is what orders allocation and release.
    used: AtomicUsize,
}

impl Arena {
    /// A zero-filled arena of `len` bytes (a page multiple), all free.
    pub(crate) fn new(name: &str, len: usize) -> Result<Arc<Arena>, ShmError> {
        let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
            .map_err(os("memfd_create"))?;
        rustix::fs::ftruncate(&fd, len as u64).map_err(os("ftruncate"))?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL).map_err(os("seal"))?;
        let rw = Area::new(Arc::new(File::new(fd)?), 0, len, Prot::ReadWrite)?;
        Ok(Arc::new(Arena {
            rw,
            ro: Mutex::new(None),
            free: Mutex::new(BTreeMap::from([(0, len)])),
            used: AtomicUsize::new(0),
        }))
    }

    fn len(&self) -> usize {
        self.rw.len
    }

    /// The memfd (read-write).
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.rw.file.fd.as_fd()
    }

    /// The read-write mapping of the whole arena.
    pub(crate) fn rw(&self) -> &Arc<Area> {
        &self.rw
    }

    /// The read-only mapping of the whole arena, through a read-only descriptor; made the
    /// first time it is asked for.
    pub(crate) fn ro(&self) -> Result<Arc<Area>, ShmError> {
        let mut ro = self.ro.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(a) = &*ro {
            return Ok(a.clone());
        }
        // Reopening the memfd through /proc gives a descriptor with the access mode asked
        // for; a dup would share the read-write one.
        let path = format!("/proc/self/fd/{}", self.fd().as_raw_fd());
        let fd = rustix::fs::open(path.as_str(), OFlags::RDONLY | OFlags::CLOEXEC, rustix::fs::Mode::empty())
            .map_err(os("reopen read-only"))?;
        let a = Area::new(Arc::new(File::new(fd)?), 0, self.len(), Prot::ReadOnly)?;
        *ro = Some(a.clone());
        Ok(a)
    }

    /// Leases `len` bytes (a page multiple) from the first free range that holds them.
    pub(crate) fn lease(self: &Arc<Self>, len: usize) -> Option<Lease> {
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        let (&start, &have) = free.iter().find(|&(_, &l)| l >= len)?;
        free.remove(&start);
        if have > len {
            free.insert(start + len, have - len);
        }
        self.used.fetch_add(len, Ordering::Relaxed);
        Some(Lease { arena: self.clone(), offset: start, len })
    }

    /// Zeroes `[offset, offset + len)` and returns it to the free list.
    fn release(&self, offset: usize, len: usize) {
        let punch = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
        // A device pinned these pages (DmaArea::pin): a hole would give the CPU new pages
        // while the device keeps the old ones, so they are zeroed in place.
        // Acquire: pairs with `pin`'s release.
        let pinned = self.rw.pinned.load(Ordering::Acquire);
        if pinned || rustix::fs::fallocate(self.fd(), punch, offset as u64, len as u64).is_err() {
            // Not expected of a memfd; zero the pages by hand rather than leak their data.
            let zeros = [0u8; PAGE_SIZE];
            for at in (offset..offset + len).step_by(PAGE_SIZE) {
                // SAFETY: `[at, at + PAGE_SIZE)` lies inside the lease, inside this arena's
                // live read-write mapping; nothing else holds the lease any more.
                unsafe { volatile_write(self.rw.ptr.as_ptr().add(at), &zeros) };
            }
        }
        self.used.fetch_sub(len, Ordering::Relaxed);
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        let (mut start, mut len) = (offset, len);
        if let Some((&p, &pl)) = free.range(..start).next_back()
            && p + pl == start
        {
            free.remove(&p);
            (start, len) = (p, pl + len);
        }
        if let Some(nl) = free.remove(&(start + len)) {
            len += nl;
        }
        free.insert(start, len);
    }
}

/// Whole pages `[offset, offset + len)` of an arena, returned (zeroed) on drop.
#[derive(Debug)]
pub(crate) struct Lease {
    arena: Arc<Arena>,
    offset: usize,
    len: usize,
}

impl Lease {
    pub(crate) fn arena(&self) -> &Arc<Arena> {
        &self.arena
    }
    /// Byte offset in the arena.
    pub(crate) fn offset(&self) -> usize {
        self.offset
    }
    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // The last holder of a region made by `Shm::new`: its memfd closes right after.
        if Arc::strong_count(&self.arena) > 1 {
            self.arena.release(self.offset, self.len);
        }
    }
}

/// How a [`ShmPool`] grows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// Size of the first arena in bytes (rounded up to pages).
    pub first_arena: usize,
    /// Largest arena in bytes; each new arena is twice the last, up to this. A larger
    /// allocation gets an arena of exactly its size.
    pub max_arena: usize,
    /// Most bytes the pool's arenas may hold together; past it, [`ShmError::Exhausted`].
    pub limit: usize,
}

impl Default for PoolConfig {
    /// 1 MiB, doubling to 64 MiB, no limit. Arenas cost address space, not memory: pages
    /// are backed when first touched and given back when freed.
    fn default() -> Self {
        PoolConfig { first_arena: 1 << 20, max_arena: 64 << 20, limit: usize::MAX }
    }
}

/// What a [`ShmPool`] holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolStats {
    /// Arenas (memfds).
    pub arenas: usize,
    /// Bytes of all arenas together.
    pub reserved: usize,
    /// Bytes allocated.
    pub used: usize,
}

/// A page-granular allocator of [`Shm`] regions from a few large memfd arenas. See the
/// module docs for the invariants; in short: one descriptor and one `mmap` per arena, not per
/// region, pages zeroed on their way back, and everything in one pool visible to whoever
/// holds one of its descriptors (so one pool per owner and protection class).
#[derive(Debug)]
pub struct ShmPool {
    name: String,
    config: PoolConfig,
    arenas: Mutex<Vec<Arc<Arena>>>,
}

impl ShmPool {
    /// An empty pool; `name` names its memfds in `/proc/*/maps`. Arenas are made on demand.
    /// Arena sizes are rounded up to whole pages (at least one).
    pub fn new(name: &str, config: PoolConfig) -> ShmPool {
        let pages = |n: usize| round_to_pages(n.max(PAGE_SIZE)).unwrap_or(isize::MAX as usize / PAGE_SIZE * PAGE_SIZE);
        let first = pages(config.first_arena);
        let config = PoolConfig { first_arena: first, max_arena: pages(config.max_arena).max(first), ..config };
        ShmPool { name: name.to_owned(), config, arenas: Mutex::new(Vec::new()) }
    }

    /// A zero-filled region of `size` bytes (rounded up to pages) from the first arena with
    /// room, or from a new arena.
    pub fn alloc(&self, size: usize) -> Result<Arc<Shm>, ShmError> {
        if size == 0 {
            return Err(ShmError::BadSize { size: 0, why: "a region must not be empty" });
        }
        let len = round_to_pages(size)?;
        let mut arenas = self.arenas.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(lease) = arenas.iter().find_map(|a| a.lease(len)) {
            return Ok(Shm::from_lease(lease));
        }
        let reserved: usize = arenas.iter().map(|a| a.len()).sum();
        let room = self.config.limit.saturating_sub(reserved);
        let grown = arenas.iter().fold(self.config.first_arena, |s, _| s.saturating_mul(2));
        // The next size in the doubling, or less if the limit is near; never less than `len`.
        let size = grown.min(self.config.max_arena).min(room).max(len);
        if size > room {
            let (requested, reserved, limit) = (len as u64, reserved as u64, self.config.limit as u64);
            return Err(ShmError::Exhausted { pool: self.name.clone(), requested, reserved, limit });
        }
        let arena = Arena::new(&self.name, size)?;
        let lease = arena.lease(len).expect("a new arena is at least as large as the request");
        arenas.push(arena);
        Ok(Shm::from_lease(lease))
    }

    /// Arenas, their bytes and the bytes allocated from them.
    pub fn stats(&self) -> PoolStats {
        let arenas = self.arenas.lock().unwrap_or_else(PoisonError::into_inner);
        PoolStats {
            arenas: arenas.len(),
            reserved: arenas.iter().map(|a| a.len()).sum(),
            used: arenas.iter().map(|a| a.used.load(Ordering::Relaxed)).sum(),
        }
    }
}
