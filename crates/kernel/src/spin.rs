//! Taking a lock whose holder is about to let go, without sleeping.
//!
//! On the live driver the firmware thread and a DDI caller pass the device lock back and forth
//! (the caller raises the attention register, and the firmware thread lets go at its next safe
//! point, microseconds later), and the OS lock passes between callers and the firmware
//! thread's interrupt handling. Parking on such a lock costs a futex sleep and a wake-up: tens
//! of microseconds on a small machine, and a migration that lands the woken thread on the
//! firmware thread's core. [`lock_soon`] tries first, spinning for a bounded time, and only
//! then parks, so nothing can wait forever on a spin.

use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};

/// How long [`lock_soon`] spins before it parks.
pub(crate) const SPIN: Duration = Duration::from_micros(50);

/// Locks `m`, spinning on `try_lock` for up to [`SPIN`] before parking.
pub(crate) fn lock_soon<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    if let Some(g) = m.try_lock() {
        return g;
    }
    let deadline = Instant::now() + SPIN;
    loop {
        for _ in 0..64 {
            std::hint::spin_loop();
            if let Some(g) = m.try_lock() {
                return g;
            }
        }
        if Instant::now() >= deadline {
            return m.lock();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_lock_is_taken_and_a_held_one_is_waited_for() {
        let m = std::sync::Arc::new(Mutex::new(0u32));
        *lock_soon(&m) += 1;
        let held = m.lock();
        let m2 = m.clone();
        // The other thread spins, then parks; it gets the lock once it is let go.
        let t = std::thread::spawn(move || {
            *lock_soon(&m2) += 1;
        });
        drop(held);
        t.join().unwrap();
        assert_eq!(*m.lock(), 2);
    }
}
