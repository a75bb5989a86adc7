//! The `sync` shim: std atomics normally, loom's under `--cfg loom`.
//!
//! Protocol code ([`crate::protocol`]) calls [`fence`] from here, so that the same functions
//! the UMD, the kernel and the firmware run are the ones loom explores. The words themselves
//! are reached through the [`Load`] and [`Store`] traits, because the real ones live in shared memory as
//! `std` atomics while the model's are loom's.

#[cfg(loom)]
pub use loom::sync::atomic::fence;
pub use std::sync::atomic::Ordering;
#[cfg(not(loom))]
pub use std::sync::atomic::fence;

/// A 64-bit word shared with another actor, that we may read.
pub trait Load {
    /// Atomic load.
    fn load(&self, order: Ordering) -> u64;
}

/// A 64-bit word shared with another actor, that we may write.
pub trait Store {
    /// Atomic store.
    fn store(&self, value: u64, order: Ordering);
}

/// A 64-bit word of bits several actors set and one takes (the global and aggregated
/// doorbells).
pub trait Bits: Load {
    /// Atomic OR; returns the previous value.
    fn fetch_or(&self, bits: u64, order: Ordering) -> u64;
    /// Atomic swap; returns the previous value.
    fn swap(&self, value: u64, order: Ordering) -> u64;
}

/// A 32-bit wake word (a futex) that we may read (and sleep on).
pub trait Load32 {
    /// Atomic load.
    fn load(&self, order: Ordering) -> u32;
}

/// A 32-bit wake word that we bump.
pub trait Bump32 {
    /// Atomic wrapping add; returns the previous value.
    fn fetch_add(&self, value: u32, order: Ordering) -> u32;
}

impl Load32 for std::sync::atomic::AtomicU32 {
    #[inline]
    fn load(&self, order: Ordering) -> u32 {
        std::sync::atomic::AtomicU32::load(self, order)
    }
}

impl Bump32 for std::sync::atomic::AtomicU32 {
    #[inline]
    fn fetch_add(&self, value: u32, order: Ordering) -> u32 {
        std::sync::atomic::AtomicU32::fetch_add(self, value, order)
    }
}

impl Load32 for shm::ReadFutex {
    #[inline]
    fn load(&self, order: Ordering) -> u32 {
        shm::ReadFutex::load(self, order)
    }
}

impl Bump32 for shm::Futex {
    #[inline]
    fn fetch_add(&self, value: u32, order: Ordering) -> u32 {
        self.get().fetch_add(value, order)
    }
}

#[cfg(loom)]
impl Load32 for loom::sync::atomic::AtomicU32 {
    fn load(&self, order: Ordering) -> u32 {
        loom::sync::atomic::AtomicU32::load(self, order)
    }
}

#[cfg(loom)]
impl Bump32 for loom::sync::atomic::AtomicU32 {
    fn fetch_add(&self, value: u32, order: Ordering) -> u32 {
        loom::sync::atomic::AtomicU32::fetch_add(self, value, order)
    }
}

impl Bits for std::sync::atomic::AtomicU64 {
    #[inline]
    fn fetch_or(&self, bits: u64, order: Ordering) -> u64 {
        std::sync::atomic::AtomicU64::fetch_or(self, bits, order)
    }
    #[inline]
    fn swap(&self, value: u64, order: Ordering) -> u64 {
        std::sync::atomic::AtomicU64::swap(self, value, order)
    }
}

impl Load for std::sync::atomic::AtomicU64 {
    #[inline]
    fn load(&self, order: Ordering) -> u64 {
        std::sync::atomic::AtomicU64::load(self, order)
    }
}

impl Store for std::sync::atomic::AtomicU64 {
    #[inline]
    fn store(&self, value: u64, order: Ordering) {
        std::sync::atomic::AtomicU64::store(self, value, order)
    }
}

impl Load for shm::ReadWord {
    #[inline]
    fn load(&self, order: Ordering) -> u64 {
        shm::ReadWord::load(self, order)
    }
}

impl Load for shm::Word {
    #[inline]
    fn load(&self, order: Ordering) -> u64 {
        self.get().load(order)
    }
}

impl Store for shm::Word {
    #[inline]
    fn store(&self, value: u64, order: Ordering) {
        self.get().store(value, order)
    }
}

impl Bits for shm::Word {
    #[inline]
    fn fetch_or(&self, bits: u64, order: Ordering) -> u64 {
        self.get().fetch_or(bits, order)
    }
    #[inline]
    fn swap(&self, value: u64, order: Ordering) -> u64 {
        self.get().swap(value, order)
    }
}

#[cfg(loom)]
impl Load for loom::sync::atomic::AtomicU64 {
    fn load(&self, order: Ordering) -> u64 {
        loom::sync::atomic::AtomicU64::load(self, order)
    }
}

#[cfg(loom)]
impl Bits for loom::sync::atomic::AtomicU64 {
    fn fetch_or(&self, bits: u64, order: Ordering) -> u64 {
        loom::sync::atomic::AtomicU64::fetch_or(self, bits, order)
    }
    fn swap(&self, value: u64, order: Ordering) -> u64 {
        loom::sync::atomic::AtomicU64::swap(self, value, order)
    }
}

#[cfg(loom)]
impl Store for loom::sync::atomic::AtomicU64 {
    fn store(&self, value: u64, order: Ordering) {
        loom::sync::atomic::AtomicU64::store(self, value, order)
    }
}
