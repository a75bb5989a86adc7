//! Loom model checks of [`abi::protocol`]. Run with
//! `RUSTFLAGS="--cfg loom" cargo test --release loom` from the repository root.
#![cfg(loom)]

use abi::DoorbellStatus;
use abi::doorbell::RingMethod;
use abi::protocol::{Bell, publish_status, recheck_wptr, ring_and_read_status, take_rings};
use abi::sync::Ordering;
use loom::sync::Arc;
use loom::sync::atomic::AtomicU64;

const RETRY: u64 = DoorbellStatus::DisconnectedRetry as u64;
const CONNECTED: u64 = DoorbellStatus::Connected as u64;
const WPTR: u64 = 64;

/// The client rings while the kernel disconnects. `client` is the client half under test.
fn model(client: fn(&AtomicU64, &AtomicU64, &AtomicU64, u64) -> u64) {
    loom::model(move || {
        let wptr = Arc::new(AtomicU64::new(0));
        let doorbell = Arc::new(AtomicU64::new(0));
        let status = Arc::new(AtomicU64::new(CONNECTED));
        let t = {
            let (wptr, doorbell, status) = (wptr.clone(), doorbell.clone(), status.clone());
            loom::thread::spawn(move || client(&wptr, &doorbell, &status, WPTR))
        };
        // Kernel: rotate (not modelled: the ring then lands on the dummy page, which is why the
        // firmware may never see the doorbell), publish the status; firmware: unbind re-check.
        publish_status(&*status, RETRY);
        let seen = recheck_wptr(&*wptr);
        let client_saw = t.join().unwrap();
        assert!(
            client_saw == RETRY || seen == WPTR,
            "submission lost: the client read status {client_saw} (connected) and the firmware's re-read saw wptr {seen}"
        );
    });
}

#[test]
fn loom_ring_vs_disconnect_never_loses_a_submission() {
    model(|w, d, s, v| {
        ring_and_read_status(w, &Bell { word: d, method: RingMethod::WriteWptr, aggregated: None }, s, v)
    });
}

/// The same race on the global doorbell, where the ring is an OR of the queue's bit.
#[test]
fn loom_global_ring_vs_disconnect_never_loses_a_submission() {
    model(|w, d, s, v| {
        ring_and_read_status(w, &Bell { word: d, method: RingMethod::SetBit { mask: 1 }, aggregated: None }, s, v)
    });
}

/// Its twin: the bit OR-ed in, but no fence before the status read. Loom must find the loss.
#[test]
#[should_panic(expected = "submission lost")]
fn loom_global_ring_vs_disconnect_without_the_fence_loses_a_submission() {
    model(|w, d, s, v| {
        w.store(v, Ordering::Release);
        abi::sync::Bits::fetch_or(d, 1, Ordering::Release);
        s.load(Ordering::Relaxed)
    });
}

/// The same client with its SeqCst fence removed: loom must find the lost submission.
#[test]
#[should_panic(expected = "submission lost")]
fn loom_ring_vs_disconnect_without_the_fence_loses_a_submission() {
    model(|w, d, s, v| {
        w.store(v, Ordering::Release);
        d.store(v, Ordering::Release);
        s.load(Ordering::Relaxed)
    });
}

use abi::protocol::{set_monitored_and_resample, signal_fence};

/// A CPU waiter for value 1 registers (MonitoredValue 0) while the engine signals 1: the waiter
/// is woken by the interrupt or satisfied by the resample. `engine` is the engine half.
fn fence_model(engine: fn(&AtomicU64, &AtomicU64, u64) -> bool) {
    fence_model_with(engine, |m, c, v| set_monitored_and_resample(m, c, v));
}

/// The same race with the kernel half under test too (`kernel`: store MonitoredValue, then
/// resample CurrentValue).
fn fence_model_with(engine: fn(&AtomicU64, &AtomicU64, u64) -> bool, kernel: fn(&AtomicU64, &AtomicU64, u64) -> u64) {
    loom::model(move || {
        let current = Arc::new(AtomicU64::new(0));
        let monitored = Arc::new(AtomicU64::new(u64::MAX)); // no waiter yet
        let t = {
            let (current, monitored) = (current.clone(), monitored.clone());
            loom::thread::spawn(move || engine(&current, &monitored, 1))
        };
        let resampled = kernel(&monitored, &current, 0);
        let interrupted = t.join().unwrap();
        assert!(
            interrupted || resampled >= 1,
            "wake-up lost: no interrupt, and the resample saw CurrentValue {resampled}"
        );
    });
}

#[test]
fn loom_fence_signal_vs_new_waiter_never_loses_a_wakeup() {
    fence_model(|c, m, v| signal_fence(c, m, v, || {}));
}

/// The engine half without its barrier: loom must find the lost wake-up.
#[test]
#[should_panic(expected = "wake-up lost")]
fn loom_fence_signal_without_the_barrier_loses_a_wakeup() {
    fence_model(|c, m, v| {
        c.store(v, Ordering::Release);
        v > m.load(Ordering::Relaxed)
    });
}

/// Two queues ring the global doorbell (bits 0 and 1 of one word) while the firmware takes
/// rings; it takes once more after both rang. Every ring must be seen, and seeing a queue's
/// bit must mean seeing the wptr that queue published before ringing. `ring` is the client's
/// ring under test.
fn global_model(ring: fn(&AtomicU64, u64)) {
    loom::model(move || {
        let bell = Arc::new(AtomicU64::new(0));
        let wptrs = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let clients: Vec<_> = (0..2)
            .map(|i| {
                let (bell, wptrs) = (bell.clone(), wptrs.clone());
                loom::thread::spawn(move || {
                    wptrs[i].store(WPTR, Ordering::Release);
                    ring(&bell, 1 << i);
                })
            })
            .collect();
        let mut seen = 0;
        let mut check = |bits: u64| {
            for i in 0..2 {
                if bits & (1 << i) != 0 {
                    let w = wptrs[i].load(Ordering::Acquire);
                    assert_eq!(w, WPTR, "ring lost: queue {i}'s bit was taken but its wptr read {w}");
                    seen |= 1 << i;
                }
            }
        };
        check(take_rings(&*bell));
        for c in clients {
            c.join().unwrap();
        }
        check(take_rings(&*bell));
        assert_eq!(seen, 0b11, "ring lost: the firmware saw only bits {seen:#b}");
    });
}

#[test]
fn loom_global_doorbell_never_loses_a_ring() {
    global_model(|bell, mask| {
        abi::protocol::ring(&Bell { word: bell, method: RingMethod::SetBit { mask }, aggregated: None }, WPTR)
    });
}

/// A client that stores its bit instead of OR-ing it (last writer wins): loom must find the
/// other queue's ring erased.
#[test]
#[should_panic(expected = "ring lost")]
fn loom_global_doorbell_with_a_store_loses_a_ring() {
    global_model(|bell, mask| bell.store(mask, Ordering::Release));
}

/// The kernel half without its barrier (spec 002: `DxgkDdiUpdateMonitoredValues` "must
/// guarantee that, after it returns, the CurrentValue read by any processor core was written
/// by the GPU CMP after having observed the new MonitoredValue"): MonitoredValue stored, then
/// CurrentValue resampled with no fence between. Loom must find the lost wake-up.
#[test]
#[should_panic(expected = "wake-up lost")]
fn loom_fence_new_waiter_without_the_kernel_barrier_loses_a_wakeup() {
    fence_model_with(
        |c, m, v| signal_fence(c, m, v, || {}),
        |m, c, v| {
            m.store(v, Ordering::Relaxed);
            c.load(Ordering::Acquire)
        },
    );
}

use abi::protocol::{announce_last_queued, read_wptr_and_last_queued};

/// The client queues command buffer 1 (last-queued 1, then wptr) while the firmware reads
/// wptr and last-queued. A firmware that sees the new wptr must see a last-queued value that
/// covers it (spec 000: the queued value is updated "right before the new submission is made
/// visible to the GPU"). `client` is the client half under test.
fn last_queued_model(client: fn(&AtomicU64, &AtomicU64)) {
    loom::model(move || {
        let wptr = Arc::new(AtomicU64::new(0));
        let last_queued = Arc::new(AtomicU64::new(0));
        let t = {
            let (wptr, last_queued) = (wptr.clone(), last_queued.clone());
            loom::thread::spawn(move || client(&wptr, &last_queued))
        };
        let (w, q) = read_wptr_and_last_queued(&*wptr, &*last_queued);
        assert!(w == 0 || q >= 1, "last-queued {q} does not cover wptr {w}: the OS would think the queue idle");
        t.join().unwrap();
    });
}

#[test]
fn loom_last_queued_is_visible_before_wptr() {
    last_queued_model(|w, q| {
        announce_last_queued(q, 1);
        w.store(WPTR, Ordering::Release);
    });
}

/// Its twin: wptr published before the last-queued value. Loom must find the firmware seeing
/// work the OS does not know is queued.
#[test]
#[should_panic(expected = "does not cover")]
fn loom_wptr_before_last_queued_is_caught() {
    last_queued_model(|w, q| {
        w.store(WPTR, Ordering::Release);
        announce_last_queued(q, 1);
    });
}

use abi::protocol::{bump_wake_word, read_wake_word};
use loom::sync::Mutex;
use loom::sync::atomic::AtomicU32;

/// A model of a shared futex. `FUTEX_WAIT` compares the word with what the sleeper read under
/// the futex's lock and sleeps only if they are equal; `FUTEX_WAKE` takes the same lock and
/// wakes every sleeper (the kernel's hash-bucket lock and its barriers). Sleeping is recorded
/// rather than done (loom cannot unwind out of a real deadlock): `(asleep, woken)`. A sleeper
/// never woken is a lost wake-up; with no timeout it would sleep forever.
struct ModelFutex {
    word: AtomicU32,
    sleep: Mutex<(bool, bool)>,
}

impl ModelFutex {
    /// `FUTEX_WAIT(seen)`: whether the caller went to sleep (else: the word changed, look again).
    fn wait(&self, seen: u32) -> bool {
        let mut s = self.sleep.lock().unwrap();
        if self.word.load(Ordering::SeqCst) == seen {
            s.0 = true;
        }
        s.0
    }
    fn wake_all(&self) {
        let mut s = self.sleep.lock().unwrap();
        if s.0 {
            s.1 = true;
        }
    }
}

/// A client process sleeps until a fence reaches 1 while the daemon signals it, bumps the
/// wake word and wakes the word's sleepers. `turn` is the client's "read the word, check the
/// fence" step under test (`Err(seen)`: sleep on `seen`).
fn wake_word_model(turn: fn(&AtomicU32, &AtomicU64) -> Result<(), u32>) {
    loom::model(move || {
        let futex = Arc::new(ModelFutex { word: AtomicU32::new(0), sleep: Mutex::new((false, false)) });
        let fence = Arc::new(AtomicU64::new(0));
        let daemon = {
            let (futex, fence) = (futex.clone(), fence.clone());
            loom::thread::spawn(move || {
                fence.store(1, Ordering::Release);
                bump_wake_word(&futex.word);
                futex.wake_all();
            })
        };
        // At most two turns: the word changes once.
        while let Err(seen) = turn(&futex.word, &fence) {
            if futex.wait(seen) {
                break;
            }
        }
        daemon.join().unwrap();
        let (asleep, woken) = *futex.sleep.lock().unwrap();
        assert!(!asleep || woken, "wake-up lost: the client sleeps on the wake word and nobody will wake it");
    });
}

#[test]
fn loom_wake_word_never_loses_a_wakeup() {
    wake_word_model(|word, fence| read_wake_word(word, || (fence.load(Ordering::Acquire) >= 1).then_some(())));
}

/// Its twin: the fence checked before the word is read. A signal, bump and wake between the
/// two leave the client asleep on the bumped value: loom must find the lost wake-up.
#[test]
#[should_panic(expected = "wake-up lost")]
fn loom_wake_word_read_after_the_check_loses_a_wakeup() {
    wake_word_model(|word, fence| {
        let done = fence.load(Ordering::Acquire) >= 1;
        let seen = word.load(Ordering::Acquire);
        if done { Ok(()) } else { Err(seen) }
    });
}

/// Its other twin: the word read relaxed. The client can read the bumped value yet not see
/// the fence the daemon stored before bumping, and sleep on a value nobody will change again.
#[test]
#[should_panic(expected = "wake-up lost")]
fn loom_wake_word_read_relaxed_loses_a_wakeup() {
    wake_word_model(|word, fence| {
        let seen = word.load(Ordering::Relaxed);
        if fence.load(Ordering::Acquire) >= 1 { Ok(()) } else { Err(seen) }
    });
}
