//! Device time.
//!
//! Every state machine in doorbell (the firmware, the engines, the kernel) takes the current
//! time as an argument instead of reading a clock: the live driver passes real time, the
//! deterministic driver a virtual clock. [`Time`] is that argument, and the value a
//! `TIMESTAMP` packet writes.

use std::time::Duration;

/// Device time in nanoseconds since the device was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Time(pub u64);

impl Time {
    /// Zero.
    pub const ZERO: Time = Time(0);
    /// Nanoseconds.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }
    /// `self + d`, saturating.
    #[inline]
    pub fn plus(self, d: Duration) -> Time {
        Time(self.0.saturating_add(d.as_nanos().min(u64::MAX as u128) as u64))
    }
    /// `self - earlier`, saturating at zero.
    #[inline]
    pub fn since(self, earlier: Time) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl core::fmt::Display for Time {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let ns = self.0;
        if ns >= 1_000_000_000 {
            write!(f, "{}.{:06} s", ns / 1_000_000_000, ns % 1_000_000_000 / 1000)
        } else if ns >= 1_000_000 {
            write!(f, "{}.{:03} ms", ns / 1_000_000, ns % 1_000_000 / 1000)
        } else if ns >= 1000 {
            write!(f, "{}.{:03} µs", ns / 1000, ns % 1000)
        } else {
            write!(f, "{ns} ns")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates_and_display_picks_a_unit() {
        assert_eq!(Time(5).plus(Duration::from_nanos(3)), Time(8));
        assert_eq!(Time(u64::MAX - 1).plus(Duration::from_secs(1)), Time(u64::MAX));
        assert_eq!(Time(3).since(Time(5)), Duration::ZERO);
        assert_eq!(Time(1_500).to_string(), "1.500 µs");
        assert_eq!(Time(2_000_000_000).to_string(), "2.000000 s");
    }
}
