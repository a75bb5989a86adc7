//! The device's attention register ([`Attention`]): the driver's hint, raised while it waits for
//! the device lock, that an engine in the middle of a turn should end it at its next safe
//! point.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

/// The device's attention register: the kernel raises it before it takes the device lock
/// for a preemption request or a reset, so that an engine in the middle of a turn ends it at
/// its next safe point (an instruction, a chunk, a packet) and hands the lock over, instead of
/// finishing a turn that may take a hundred microseconds. It is a hint, like an MMIO write
/// that interrupts the command processor: the request itself is made under the lock, and a
/// turn that ends early loses nothing (its state is saved as at any turn end).
#[derive(Clone, Default, Debug)]
pub struct Attention(Arc<AtomicU32>);

impl Attention {
    /// Raises it for as long as the guard lives (several callers may hold it at once).
    pub fn raise(&self) -> AttentionGuard<'_> {
        // Relaxed: a hint; the lock that follows orders everything that matters.
        self.0.fetch_add(1, Ordering::Relaxed);
        AttentionGuard(self)
    }

    /// Whether someone is waiting for the device lock.
    pub fn is_raised(&self) -> bool {
        // Relaxed: see `raise`.
        self.0.load(Ordering::Relaxed) != 0
    }
}

/// Holds the [`Attention`] register raised.
pub struct AttentionGuard<'a>(&'a Attention);

impl Drop for AttentionGuard<'_> {
    fn drop(&mut self) {
        // Relaxed: see `Attention::raise`.
        self.0.0.fetch_sub(1, Ordering::Relaxed);
    }
}
