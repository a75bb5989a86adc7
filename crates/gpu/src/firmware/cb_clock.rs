//! When the command buffer at a queue's read pointer began executing, and how much device
//! time it has executed since: what a recorded completion ([`super::Completion`]) splits its
//! command buffer's latency with.
//!
//! A command buffer is the work between two `PROGRESS_FENCE`s of one queue (every submission
//! ends with its own). It starts when its first packet executes: a `WAIT` at its head that
//! blocks starts nothing until it passes, so time blocked there is time before the start. It
//! executes for the device time its packets charged (each packet's command-processor share, a
//! `SYNTHETIC` or `DISPATCH` slice). The rest of the time between its start and its end it was
//! not executing: switched out for another slot's turn, preempted (the restore of its saved
//! state included), waiting for a slot again, or blocked in a `WAIT` part-way.
//!
//! Kept only while completions are recorded (the simulator's observation point): the live
//! path neither reads the clock for it nor writes it.
//!
//! Invariant: `started` is `None` exactly when no packet of the current command buffer has
//! executed, and then `exec_ns` is 0.

use abi::Time;

/// One queue's current command buffer: its start and execution time so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct CbClock {
    started: Option<Time>,
    exec_ns: u64,
}

impl CbClock {
    /// A packet of the command buffer executed from `start`, charging `ns` of device time.
    pub(super) fn ran(&mut self, start: Time, ns: u64) {
        self.started.get_or_insert(start);
        self.exec_ns = self.exec_ns.saturating_add(ns);
    }

    /// The command buffer ended with the packet that [`CbClock::ran`] last: its start and its
    /// execution time. The clock starts over for the next command buffer.
    pub(super) fn end(&mut self) -> (Time, u64) {
        let started = self.started.take().unwrap_or_default();
        (started, std::mem::take(&mut self.exec_ns))
    }

    /// The queue's partial work is gone (it faulted or was hung by a reset).
    pub(super) fn clear(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_buffer_starts_at_its_first_packet_and_sums_what_its_packets_charged() {
        let mut c = CbClock::default();
        c.ran(Time(100), 10);
        c.ran(Time(500), 30);
        c.ran(Time(900), 5);
        assert_eq!(c.end(), (Time(100), 45));
        // The next starts over.
        c.ran(Time(1_000), 5);
        assert_eq!(c.end(), (Time(1_000), 5));
        c.ran(Time(2_000), 7);
        c.clear();
        assert_eq!(c, CbClock::default());
    }
}
