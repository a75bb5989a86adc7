//! The OS's timer table (quinn-proto's `TimerTable`): at most one deadline per [`Timer`].
//! [`super::Os::poll_timeout`] is the earliest of them, and [`super::Os::handle_timeout`]
//! fires the expired ones, so a driver that sleeps until `poll_timeout` (the deterministic one
//! jumps its clock there) misses none.
//!
//! Each deadline is set by the concern that owns the timer, whenever what it depends on
//! changes: [`Timer::Tdr`] by the preemption requests in flight ([`super::recovery`]),
//! [`Timer::HangScan`] by the hang timer, [`Timer::EngineWatch`] by the engine watchdog,
//! [`Timer::D3Idle`] by the device's idle reports ([`super::power`]).

use abi::Time;

/// The OS's timers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Timer {
    /// The oldest preemption request unanswered for `TdrDelay`: recovery starts (spec 003).
    Tdr,
    /// The hang timer's next scan of the queues with work outstanding (amdgpu).
    HangScan,
    /// The engine watchdog's next look at each engine's progress, every `TdrDelay` (spec 000:
    /// the OS monitors whether an engine is making progress at the TDR cadence).
    EngineWatch,
    /// Every engine has stayed in F1 for the D3 idle period: the device enters D3 (spec 000).
    D3Idle,
}

impl Timer {
    const COUNT: usize = 4;
}

/// At most one deadline per [`Timer`].
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct TimerTable([Option<Time>; Timer::COUNT]);

impl TimerTable {
    /// Sets `timer` to fire at `at` (`None`: stops it).
    pub(super) fn set(&mut self, timer: Timer, at: Option<Time>) {
        self.0[timer as usize] = at;
    }

    /// When `timer` fires, if it runs.
    pub(super) fn get(&self, timer: Timer) -> Option<Time> {
        self.0[timer as usize]
    }

    /// Whether `timer` runs and is due at `now`.
    pub(super) fn is_due(&self, timer: Timer, now: Time) -> bool {
        self.get(timer).is_some_and(|t| now >= t)
    }

    /// The earliest deadline of every timer.
    pub(super) fn next(&self) -> Option<Time> {
        self.0.iter().flatten().copied().min()
    }
}
