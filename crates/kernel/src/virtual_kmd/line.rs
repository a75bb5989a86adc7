//! The device's interrupt line, and the waker of the device's driver thread.

use std::sync::Arc;
use std::time::Duration;

use abi::Time;
use gpu::{Gpu, Interrupt};
use parking_lot::Mutex;

/// The device's interrupt line: the device's driver moves what the device raised onto it
/// ([`InterruptLine::raise_from`]), and the KMD's ISR takes it off
/// ([`crate::ddi::Kmd::poll_notification`]) once it is delivered. On the live driver delivery is what it
/// is (at once, as far as the line goes); the deterministic driver models it
/// ([`InterruptLine::modelled`]): an interrupt reaches the ISR a fixed delivery time after the
/// device raised it, at its modelled time, and not before the driver moved it.
#[derive(Clone, Default)]
pub struct InterruptLine {
    /// Waiting interrupts, with the time each is delivered at, in delivery order (raise order
    /// among equals).
    waiting: Arc<Mutex<std::collections::VecDeque<(Time, Interrupt)>>>,
    /// The modelled delivery time; `None`: deliver at once.
    delivery: Option<Duration>,
}

impl InterruptLine {
    /// A line that delivers each interrupt `delivery` after the device raised it (the
    /// deterministic driver's cost model).
    pub fn modelled(delivery: Duration) -> InterruptLine {
        InterruptLine { waiting: Default::default(), delivery: Some(delivery) }
    }

    /// Moves every interrupt `gpu` raised onto the line, the driver's clock reading `now`;
    /// returns how many.
    pub fn raise_from(&self, gpu: &mut Gpu, now: Time) -> usize {
        // The common case, a pump with nothing raised, stays off the line's lock.
        let Some(first) = gpu.poll_interrupt_at() else { return 0 };
        let mut line = self.waiting.lock();
        let mut n = 0;
        for (raised, irq) in std::iter::once(first).chain(std::iter::from_fn(|| gpu.poll_interrupt_at())) {
            let at = self.delivery.map_or(Time::ZERO, |d| raised.max(now).plus(d));
            // After every interrupt delivered no later (the common case: at the back).
            let k = line.iter().rposition(|&(t, _)| t <= at).map_or(0, |k| k + 1);
            line.insert(k, (at, irq));
            n += 1;
        }
        n
    }

    /// Whether the line models delivery time (an interrupt may wait on it after it was moved).
    pub fn models_delivery(&self) -> bool {
        self.delivery.is_some()
    }

    /// Whether an interrupt is delivered by `now`.
    pub fn due(&self, now: Time) -> bool {
        self.waiting.lock().front().is_some_and(|&(t, _)| t <= now)
    }

    /// When the next interrupt is delivered, if one waits.
    pub fn next_delivery(&self) -> Option<Time> {
        self.waiting.lock().front().map(|&(t, _)| t)
    }

    pub(super) fn take(&self, now: Time) -> Option<Interrupt> {
        let mut line = self.waiting.lock();
        if line.front().is_some_and(|&(t, _)| t <= now) { line.pop_front().map(|(_, irq)| irq) } else { None }
    }
}

/// Something that wakes the device's driver thread (the live firmware thread parks while
/// every engine is in F1).
pub trait DeviceWaker: Send + Sync {
    /// Wakes it. Must not block.
    fn wake(&self);
}
