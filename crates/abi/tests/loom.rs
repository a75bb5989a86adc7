//! Loom model checks of [`abi::protocol`]. Run with
//! `RUSTFLAGS="--cfg loom" cargo test --release loom` from the repository root.
#![cfg(loom)]

use abi::DoorbellStatus;
use abi::protocol::{publish_status, recheck_wptr, ring_and_read_status};
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
    model(|w, d, s, v| ring_and_read_status(w, d, s, v));
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
