//! Memory the host and the engine program both reach: the one module of the crate (with
//! `driver.rs` and `emulated.rs`) that touches raw memory.
//!
//! A [`SharedBuf`] is a zeroed, page-aligned block with a CPU address and a device address:
//! pinned host memory mapped into the GPU (`cuMemHostAlloc`), or, for the emulated backend,
//! plain host memory whose device address is its CPU address. The engine program reads and
//! writes it concurrently with the host, so, as in the `shm` crate, no reference to its bytes
//! is ever formed: protocol words are reached as atomics ([`SharedBuf::word`]), structs are
//! copied in and out with volatile accesses ([`SharedBuf::put`], [`SharedBuf::get`]), and
//! every access is bounds- and alignment-checked first. Only [`Pod`] types — plain integers
//! and the `#[repr(C)]` structs of [`crate::layout`], for which every bit pattern is valid —
//! cross, so whatever the other side wrote is a value, never undefined behaviour.

use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;

/// A type every bit pattern of which is a valid value, with no padding the host could leak
/// or misread (the layout structs are all multiples of 8 bytes with explicit padding fields).
///
/// # Safety
/// Implementors are `#[repr(C)]` (or primitive), `Copy`, contain no pointers, references,
/// `bool`s or enums, and have no implicit padding.
pub unsafe trait Pod: Copy + Default + 'static {}

// SAFETY: primitives; every bit pattern is valid.
unsafe impl Pod for u64 {}
// SAFETY: as above.
unsafe impl Pod for u32 {}
// SAFETY: #[repr(C)], integer fields only, no implicit padding (layout.rs asserts the sizes).
unsafe impl Pod for crate::layout::Mqd {}
// SAFETY: as above.
unsafe impl Pod for crate::layout::Regs {}
// SAFETY: as above.
unsafe impl Pod for crate::layout::Event {}
// SAFETY: as above.
unsafe impl Pod for crate::layout::Fault {}
// SAFETY: as above.
unsafe impl Pod for crate::layout::VmEntry {}
// SAFETY: as above.
unsafe impl Pod for crate::layout::FenceSlot {}
// SAFETY: as above (Globals has a [u32; 64] array: no padding; layout.rs checks offsets).
unsafe impl Pod for crate::layout::Globals {}
// SAFETY: as above.
unsafe impl Pod for crate::layout::SlotStatus {}
// SAFETY: as above.
unsafe impl Pod for crate::layout::VmDir {}

/// Keeps the allocation behind a [`SharedBuf`] alive (and frees it on drop).
pub(crate) trait Owner: Send + Sync {}
impl<T: Send + Sync> Owner for T {}

/// A block both sides reach. See the module docs.
pub struct SharedBuf {
    host: NonNull<u8>,
    dev: u64,
    len: usize,
    _owner: Box<dyn Owner>,
}

// SAFETY: the buffer's bytes are only reached through atomics and volatile copies (see the
// module docs), which are as valid from any thread as from the allocating one; `_owner`
// is Send + Sync.
unsafe impl Send for SharedBuf {}
// SAFETY: as for Send: `&SharedBuf` hands out only `&AtomicU64` and copies.
unsafe impl Sync for SharedBuf {}

impl core::fmt::Debug for SharedBuf {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "SharedBuf({:#x}, {} bytes)", self.dev, self.len)
    }
}

impl SharedBuf {
    /// Wraps `len` zeroed bytes at `host` (8-aligned), reached by the device at `dev`, kept
    /// alive by `owner`.
    ///
    /// # Safety
    /// `host..host + len` is a live, writable, zeroed allocation that `owner` keeps alive and
    /// frees only when dropped, and nothing else frees or unmaps it meanwhile.
    pub(crate) unsafe fn new(host: NonNull<u8>, dev: u64, len: usize, owner: Box<dyn Owner>) -> SharedBuf {
        debug_assert!(host.as_ptr().addr().is_multiple_of(8));
        SharedBuf { host, dev, len, _owner: owner }
    }

    /// The device address of byte `offset`.
    pub fn dev_at(&self, offset: usize) -> u64 {
        self.dev + offset as u64
    }

    /// The device address of byte 0.
    pub fn dev(&self) -> u64 {
        self.dev
    }

    /// The CPU address of byte 0 (what the emulated engine is handed).
    pub fn host_addr(&self) -> usize {
        self.host.as_ptr().addr()
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes (never: buffers are made with at least one page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The pointer to `size` bytes at `offset`, `align`-aligned: checked, never out of bounds.
    fn at(&self, offset: usize, size: usize, align: usize) -> *mut u8 {
        let end = offset.checked_add(size);
        assert!(
            end.is_some_and(|e| e <= self.len) && offset.is_multiple_of(align),
            "shared buffer access {offset}+{size} (align {align}) outside {} bytes",
            self.len
        );
        // SAFETY: `offset + size <= len`: inside the allocation.
        unsafe { self.host.as_ptr().add(offset) }
    }

    /// The 64-bit protocol word at `offset` (8-aligned), for atomic access.
    pub fn word(&self, offset: usize) -> &AtomicU64 {
        let p = self.at(offset, 8, 8);
        // SAFETY: in bounds and 8-aligned (checked); the allocation lives as long as `self`;
        // the word is only ever accessed atomically by the host, and by the device with
        // single aligned 8-byte accesses (a protocol word in layout.cuh).
        unsafe { &*p.cast::<AtomicU64>() }
    }

    /// Copies `v` to `offset` with volatile stores (8-aligned).
    pub fn put<T: Pod>(&self, offset: usize, v: &T) {
        let size = size_of::<T>();
        let p = self.at(offset, size, align_of::<T>().max(4));
        let src = (v as *const T).cast::<u32>();
        for i in 0..size / 4 {
            // SAFETY: `p + 4i` and `src + 4i` are inside their objects (size is a multiple of
            // 4 for every Pod here: layout.rs asserts the sizes), both 4-aligned.
            unsafe { p.cast::<u32>().add(i).write_volatile(src.add(i).read()) };
        }
    }

    /// Reads a `T` at `offset` with volatile loads (whatever the other side wrote is a valid
    /// `T`: [`Pod`]).
    pub fn get<T: Pod>(&self, offset: usize) -> T {
        let size = size_of::<T>();
        let p = self.at(offset, size, align_of::<T>().max(4));
        let mut v = T::default();
        let dst = (&mut v as *mut T).cast::<u32>();
        for i in 0..size / 4 {
            // SAFETY: as in `put`; `dst` points into `v`, a Pod, so any bits are valid.
            unsafe { dst.add(i).write(p.cast::<u32>().add(i).read_volatile()) };
        }
        v
    }

    /// Zeroes `len` bytes at `offset`.
    pub fn zero(&self, offset: usize, len: usize) {
        let p = self.at(offset, len, 1);
        for i in 0..len {
            // SAFETY: inside the checked range.
            unsafe { p.add(i).write_volatile(0) };
        }
    }
}

/// Page-aligned, zeroed host memory (the emulated backend's "pinned" memory and the slots'
/// private memory).
pub(crate) struct HostAlloc {
    ptr: NonNull<u8>,
    layout: std::alloc::Layout,
}

// SAFETY: the allocation is owned; its bytes are reached through SharedBuf's discipline.
unsafe impl Send for HostAlloc {}
// SAFETY: as above.
unsafe impl Sync for HostAlloc {}

impl HostAlloc {
    /// `len` zeroed bytes (at least one page), page-aligned.
    pub(crate) fn new(len: usize) -> HostAlloc {
        let layout = std::alloc::Layout::from_size_align(len.max(4096).next_multiple_of(4096), 4096)
            .expect("a page-aligned layout of a sane size");
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        HostAlloc { ptr, layout }
    }

    /// Its address.
    pub(crate) fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Its size.
    pub(crate) fn len(&self) -> usize {
        self.layout.size()
    }

    /// A [`SharedBuf`] over a new allocation of `len` bytes whose device address is its CPU
    /// address (the emulated backend).
    pub(crate) fn shared(len: usize) -> SharedBuf {
        let a = HostAlloc::new(len);
        let (ptr, len) = (a.ptr(), a.len());
        // SAFETY: `a` is a live zeroed allocation of `len` bytes, owned by the buffer.
        unsafe { SharedBuf::new(ptr, ptr.as_ptr().addr() as u64, len, Box::new(a)) }
    }
}

impl Drop for HostAlloc {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `new`, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}
