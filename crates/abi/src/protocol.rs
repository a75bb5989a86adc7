//! The doorbell-versus-disconnect protocol, in one place.
//!
//! A submission must never be lost when the kernel disconnects a doorbell at the same moment
//! the client rings it (engine idle, victimization, power-down). The client's ring may land on
//! the dummy page and so never reach the firmware. Two rules close the gap, a Dekker pair:
//!
//! - the **client** ([`ring_and_read_status`]) publishes wptr, rings, issues a SeqCst fence,
//!   then reads the doorbell status;
//! - the **kernel** ([`publish_status`]) stores the disconnected status, and only then does the
//!   **firmware** ([`recheck_wptr`]) — on unbind or before entering F1 — issue a SeqCst fence
//!   and re-read the client's wptr.
//!
//! Each side stores, fences, then loads what the other stored, so at least one sees the other:
//! either the client reads `DisconnectedRetry` and reconnects (and the connect re-reads wptr),
//! or the firmware's re-read finds the new wptr and runs the work. `umd`, `kernel` and `gpu`
//! call these functions; the loom test `loom_ring_vs_disconnect` explores every interleaving of
//! them, and its twin with the client's fence removed must fail.

use crate::sync::{Load, Ordering, Store, fence};

/// Client, spec 000 steps 3–5: publish `wptr`, ring the doorbell with it, fence, and return
/// the doorbell status word.
#[inline]
pub fn ring_and_read_status<W: Store + ?Sized, S: Load + ?Sized>(
    wptr_word: &W,
    doorbell: &W,
    status: &S,
    wptr: u64,
) -> u64 {
    // Release: the packets written before are visible to whoever acquires this wptr.
    wptr_word.store(wptr, Ordering::Release);
    // Release: pairs with the firmware's acquire load of the doorbell, so a firmware that sees
    // this ring also sees the wptr stored above (otherwise it could read the old wptr and
    // decide the queue is idle).
    doorbell.store(wptr, Ordering::Release);
    // The client half of the Dekker pair: the stores above are ordered before the load below
    // in the single total order of SeqCst fences.
    fence(Ordering::SeqCst);
    status.load(Ordering::Relaxed)
}

/// Kernel: publish a new doorbell status (before the firmware's [`recheck_wptr`]).
#[inline]
pub fn publish_status<W: Store + ?Sized>(status: &W, value: u64) {
    // SeqCst, and the fence in `recheck_wptr` that follows it, form the kernel half.
    status.store(value, Ordering::SeqCst);
}

/// Firmware: re-read the client's wptr after the kernel published a disconnect.
#[inline]
pub fn recheck_wptr<W: Load + ?Sized>(wptr_word: &W) -> u64 {
    fence(Ordering::SeqCst);
    // Acquire: pairs with the client's release store, so the packets are visible.
    wptr_word.load(Ordering::Acquire)
}
