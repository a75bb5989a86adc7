//! Pools of numbered resources whose entries return on drop.
//!
//! The kernel hands out doorbell BAR pages to processes and kernel doorbells to kernel-mode
//! queues. A [`Lease`] holds one entry; dropping it resets the entry (a doorbell page is
//! cleared, so its next owner starts with no stale value or bit) and returns it, so no error
//! path, teardown order or early return can leak one. The lowest free entry is handed out
//! first, which keeps traces and tests deterministic.
//!
//! Invariant: an entry is either free or held by exactly one live `Lease`.

use std::collections::BTreeSet;
use std::sync::Arc;

use abi::port::KernelError;
use parking_lot::Mutex;

/// What resets an entry on its way back.
pub(crate) type Reset = Box<dyn Fn(u32) + Send + Sync>;

struct Inner {
    what: &'static str,
    total: usize,
    free: BTreeSet<u32>,
    reset: Option<Reset>,
}

/// A pool of numbered entries.
pub(crate) struct Pool(Arc<Mutex<Inner>>);

impl Pool {
    /// A pool of `entries`, called `what` in errors; `reset` runs on each returned entry.
    pub(crate) fn new(what: &'static str, entries: impl IntoIterator<Item = u32>, reset: Option<Reset>) -> Pool {
        let free: BTreeSet<u32> = entries.into_iter().collect();
        Pool(Arc::new(Mutex::new(Inner { what, total: free.len(), free, reset })))
    }

    /// The lowest free entry.
    pub(crate) fn take(&self) -> Result<Lease, KernelError> {
        let mut g = self.0.lock();
        let index = g
            .free
            .pop_first()
            .ok_or_else(|| KernelError::Exhausted { what: g.what, detail: format!("all {} are in use", g.total) })?;
        Ok(Lease { index, pool: self.0.clone() })
    }

    /// Entries held.
    pub(crate) fn in_use(&self) -> usize {
        let g = self.0.lock();
        g.total - g.free.len()
    }
}

/// One entry of a [`Pool`], returned (and reset) on drop.
pub(crate) struct Lease {
    index: u32,
    pool: Arc<Mutex<Inner>>,
}

impl Lease {
    /// The entry.
    pub(crate) fn index(&self) -> u32 {
        self.index
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut g = self.pool.lock();
        if let Some(reset) = &g.reset {
            reset(self.index);
        }
        g.free.insert(self.index);
    }
}

impl core::fmt::Debug for Lease {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Lease({})", self.index)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[test]
    fn entries_return_on_drop_reset_and_lowest_first() {
        let resets = Arc::new(AtomicU32::new(0));
        let r = resets.clone();
        let pool = Pool::new(
            "things",
            [3, 1, 2],
            Some(Box::new(move |i| {
                r.fetch_add(i, Ordering::Relaxed);
            })),
        );
        let a = pool.take().unwrap();
        let b = pool.take().unwrap();
        assert_eq!((a.index(), b.index()), (1, 2));
        assert_eq!(pool.in_use(), 2);
        drop(a);
        assert_eq!(resets.load(Ordering::Relaxed), 1, "reset ran on the returned entry");
        assert_eq!(pool.take().unwrap().index(), 1, "lowest free first (and that lease drops at once)");
        let c = pool.take().unwrap();
        let d = pool.take().unwrap();
        assert_eq!((c.index(), d.index()), (1, 3));
        let e = pool.take().unwrap_err();
        assert!(matches!(e, KernelError::Exhausted { what: "things", .. }), "{e}");
        drop((b, c, d));
        assert_eq!(pool.in_use(), 0);
    }
}
