//! The protocols that could lose a submission or a wake-up, each written once, here.
//!
//! # Doorbell versus disconnect
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
//!
//! # Bit doorbells: rings never overwrite each other
//!
//! The global doorbell (one page for every queue) and the aggregated doorbell are bit pages:
//! a client [`ring`]s by OR-ing its bit in with release ordering, and the firmware
//! [`take_rings`] by swapping a word to zero with acquire ordering, then re-reads the wptr of
//! each queue a bit names. An OR never erases another client's bit, and the acquire/release
//! pair makes the wptr stored before the ring visible to the re-read. `loom_global_doorbell`
//! checks two clients racing the firmware; its twin, where a client stores its bit instead
//! of OR-ing it (last writer wins, the bug class of emulated global doorbells), must fail.
//!
//! # Wake word versus condition: a client process sleeping on the daemon
//!
//! A client process blocked in a wait sleeps on a futex: a 32-bit wake word in a page the
//! daemon writes and the client maps read-only. The daemon makes the client's condition true
//! (a fence passes, the wait's answer is sent), then [`bump_wake_word`]s (release) and wakes
//! the word's sleepers. The client [`read_wake_word`]s (acquire) *before* it checks its
//! condition, and sleeps only while the word still holds what it read (`FUTEX_WAIT` compares
//! under the futex's own lock). So a bump the client's check missed has not happened when it
//! read the word, and either changes the word before the client sleeps (the sleep returns at
//! once) or finds the client asleep and wakes it. `loom_wake_word_never_loses_a_wakeup`
//! checks it with a model futex; its twin, which checks the condition before reading the
//! word, must deadlock.

use crate::doorbell::RingMethod;
use crate::sync::{Bits, Bump32, Load, Load32, Ordering, Store, fence};

/// A client's doorbell: its word, how to ring it, and the aggregated doorbell to ring after
/// it when the device needs one (this engine's word, and the value ORed in).
pub struct Bell<'a, W: ?Sized> {
    /// The queue's doorbell word (dedicated), or its word of the global page.
    pub word: &'a W,
    /// How to ring `word`.
    pub method: RingMethod,
    /// The aggregated doorbell's word for the engine, and the value ORed into it.
    pub aggregated: Option<(&'a W, u64)>,
}

/// Client, spec 000 step 4: ring the doorbell for `wptr` (already published).
#[inline]
pub fn ring<W: Store + Bits + ?Sized>(bell: &Bell<'_, W>, wptr: u64) {
    // Release (both arms): pairs with the firmware's acquire of the doorbell, so a firmware
    // that sees this ring also sees the wptr stored before it (otherwise it could read the old
    // wptr and decide the queue is idle).
    match bell.method {
        RingMethod::WriteWptr => bell.word.store(wptr, Ordering::Release),
        // OR, never store: other queues' bits share the word.
        RingMethod::SetBit { mask } => {
            bell.word.fetch_or(mask, Ordering::Release);
        }
    }
    // Spec 001: "update the doorbell and wptr as normal and then write to the aggregated
    // doorbell as well". Release, for the same reason.
    if let Some((word, mask)) = bell.aggregated {
        word.fetch_or(mask, Ordering::Release);
    }
}

/// Client, spec 000 steps 3–5: publish `wptr`, ring the doorbell, fence, and return the
/// doorbell status word.
#[inline]
pub fn ring_and_read_status<W: Store + Bits + ?Sized, S: Load + ?Sized>(
    wptr_word: &W,
    bell: &Bell<'_, W>,
    status: &S,
    wptr: u64,
) -> u64 {
    // Release: the packets written before are visible to whoever acquires this wptr.
    wptr_word.store(wptr, Ordering::Release);
    ring(bell, wptr);
    // The client half of the Dekker pair: the stores above are ordered before the load below
    // in the single total order of SeqCst fences.
    fence(Ordering::SeqCst);
    status.load(Ordering::Relaxed)
}

/// Firmware: take the rings latched in a bit word (zero when there are none). Each set bit
/// names a queue (or engine) whose wptr must be re-read.
#[inline]
pub fn take_rings<W: Bits + ?Sized>(word: &W) -> u64 {
    // Relaxed: a cheap look first, so an idle word costs a read, not a write that would take
    // the cache line from the clients.
    if word.load(Ordering::Relaxed) == 0 {
        return 0;
    }
    // Acquire: pairs with the clients' release ORs, so each named queue's wptr stored before
    // its ring is visible to the re-read that follows.
    word.swap(0, Ordering::Acquire)
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

// # CurrentValue versus MonitoredValue (spec 002 "Synchronization issues")
//
// A native fence's CPU waiter must not miss the interrupt for a signal that races its
// registration. The engine signals by storing CurrentValue, then (after a barrier) reading
// MonitoredValue and interrupting if CurrentValue > MonitoredValue. The kernel registers a
// waiter by storing MonitoredValue, then (after a barrier) resampling CurrentValue and
// satisfying what already passed. Another Dekker pair: at least one side sees the other's
// store, so the waiter is either woken by the interrupt or satisfied by the resample.
// `abi/tests/loom.rs` checks it, with a twin whose barrier is removed.

/// Engine: store a native fence's CurrentValue, run `log` (the fence-log entry and index, when
/// the signal is logged: spec 002 orders them after the value and before the barrier), then
/// decide the conditional interrupt. Returns whether to interrupt (`value > MonitoredValue`).
#[inline]
pub fn signal_fence<W: Store + ?Sized, M: Load + ?Sized>(
    current: &W,
    monitored: &M,
    value: u64,
    log: impl FnOnce(),
) -> bool {
    // Release: the work before the signal is visible to whoever acquires the value.
    current.store(value, Ordering::Release);
    log();
    // Spec step 2 from the engine's side: the store is ordered before the read below.
    fence(Ordering::SeqCst);
    value > monitored.load(Ordering::Relaxed)
}

/// Kernel (`DxgkDdiUpdateMonitoredValues`, then the resample): store a new MonitoredValue,
/// barrier, read CurrentValue. The caller satisfies every waiter the returned value passes.
#[inline]
pub fn set_monitored_and_resample<W: Store + ?Sized, C: Load + ?Sized>(monitored: &W, current: &C, value: u64) -> u64 {
    store_monitored(monitored, value);
    monitored_barrier();
    resample(current)
}

/// KMD (`DxgkDdiUpdateMonitoredValues`, one value of a batch): store a MonitoredValue. The
/// batch ends with one [`monitored_barrier`].
#[inline]
pub fn store_monitored<W: Store + ?Sized>(monitored: &W, value: u64) {
    // Relaxed: the barrier that ends the batch orders it before the OS's resample.
    monitored.store(value, Ordering::Relaxed);
}

/// KMD, at the end of `DxgkDdiUpdateMonitoredValues`: the barrier after which "the
/// CurrentValue read by any processor core was written by the GPU CMP after having observed
/// the new MonitoredValue" (spec 002).
#[inline]
pub fn monitored_barrier() {
    fence(Ordering::SeqCst);
}

/// OS, on return from `DxgkDdiUpdateMonitoredValues`: resample CurrentValue.
#[inline]
pub fn resample<C: Load + ?Sized>(current: &C) -> u64 {
    // Acquire: pairs with the signaller's release, so the signalled work is visible.
    current.load(Ordering::Acquire)
}

// # Last-queued value before wptr (spec 000 "HW queue progress fence changes")
//
// The kernel learns that a queue has pending work from its last-queued progress value, and
// the device bounds every `PROGRESS_FENCE` by it, so the value must be visible no later than
// the work it covers: "the UMD needs to update the queued progress fence value just before
// appending a new command buffer to the ring buffer and making it visible to the GPU". The
// client stores it with release *before* it publishes wptr (also release); the firmware
// acquires wptr *before* it reads the value. A firmware that sees the new wptr therefore sees
// a last-queued value covering it. `loom_last_queued_is_visible_before_wptr` checks it, and
// its twin, where the client publishes wptr first, must fail.

/// Client, spec 000 step 3 ("Inform the OS of the newly queued value"): store the new
/// last-queued progress value, before the command buffer is made visible through wptr.
#[inline]
pub fn announce_last_queued<W: Store + ?Sized>(last_queued: &W, value: u64) {
    // Release: ordered before the wptr release store that follows, so whoever acquires that
    // wptr sees this value (or a later one).
    last_queued.store(value, Ordering::Release);
}

/// Firmware: read the client's wptr, then the last-queued value that must cover it. Returns
/// `(wptr, last_queued)`.
#[inline]
pub fn read_wptr_and_last_queued<W: Load + ?Sized, Q: Load + ?Sized>(wptr: &W, last_queued: &Q) -> (u64, u64) {
    // Acquire: pairs with the client's release store of wptr, so the packets and the
    // last-queued value stored before it are visible.
    let w = wptr.load(Ordering::Acquire);
    // Acquire, after the wptr's acquire: pairs with `announce_last_queued`.
    (w, last_queued.load(Ordering::Acquire))
}

// # Wake word (see the module docs)

/// Client, before sleeping on a wake word: read the word, then run `check` (the condition it
/// waits for). `Ok` with what `check` found, or `Err(seen)`: sleep while the word holds `seen`.
#[inline]
pub fn read_wake_word<W: Load32 + ?Sized, T>(word: &W, check: impl FnOnce() -> Option<T>) -> Result<T, u32> {
    // Acquire: pairs with the waker's release bump, so whatever it made true before a bump
    // this load sees is visible to `check`.
    let seen = word.load(Ordering::Acquire);
    check().ok_or(seen)
}

/// Waker (the daemon), after making a sleeper's condition true and before waking the word's
/// sleepers: bump the word.
#[inline]
pub fn bump_wake_word<W: Bump32 + ?Sized>(word: &W) {
    // Release: what was made true before the bump is visible to a client that reads the bumped
    // value. Wrapping: only a change matters.
    word.fetch_add(1, Ordering::Release);
}
