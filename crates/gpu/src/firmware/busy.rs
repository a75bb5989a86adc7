//! How long each engine has spent executing: the figure behind a busy share
//! (`doorbell top`'s sparkline, a utilisation plot).
//!
//! Each queue's turn that ran something charges device time (its packets' costs, a
//! `SYNTHETIC` slice, a restore); the engine was busy for that long, ending where the turn
//! stopped. With modelled timing that is exactly the turn. With real timing (the live driver,
//! whose engines share the firmware thread) it is the engine's own work, not the time the
//! thread spent on the other engines before it. [`BusyTime`] keeps the union of those
//! intervals, so overlapping ones count once. A turn that only found its queue blocked in a
//! `WAIT` charges nothing: the engine is awake but executes nothing.
//!
//! Invariant: `busy_ns` is the length of the union of the recorded intervals, all of which end
//! at or before `until`; [`BusyTime::at`] never reports time after the instant asked about.

use abi::Time;

/// One engine's busy time, the union of the intervals it executed in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct BusyTime {
    busy_ns: u64,
    /// The end of the latest recorded interval.
    until: Time,
}

impl BusyTime {
    /// Records that the engine executed over `[start, end)`.
    pub(crate) fn record(&mut self, start: Time, end: Time) {
        let from = start.max(self.until);
        if end > from {
            self.busy_ns = self.busy_ns.saturating_add(end.0 - from.0);
            self.until = end;
        }
    }

    /// Busy nanoseconds up to `now` (a modelled interval that ends later counts only up to
    /// `now`).
    pub(crate) fn at(&self, now: Time) -> u64 {
        self.busy_ns.saturating_sub(self.until.0.saturating_sub(now.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_intervals_count_once_and_the_future_not_at_all() {
        let mut b = BusyTime::default();
        b.record(Time(100), Time(200));
        b.record(Time(150), Time(250)); // overlaps: 50 more
        b.record(Time(300), Time(300)); // empty
        b.record(Time(400), Time(1_000));
        assert_eq!(b.at(Time(1_000)), 100 + 50 + 600);
        assert_eq!(b.at(Time(500)), 750 - 500, "a modelled run ending at 1,000 counts up to 500");
        assert_eq!(b.at(Time(2_000)), 750);
        b.record(Time(900), Time(950)); // inside what is already counted
        assert_eq!(b.at(Time(2_000)), 750);
    }
}
