//! Device time: what executing work costs, and whether that cost occupies the engine.
//!
//! Every packet an engine executes, every slice of a `DISPATCH` and every chunk of a
//! `COPY`/`FILL` has a modelled duration ([`CostModel`]). The firmware uses it two ways:
//!
//! - **Turns.** A queue's turn on its engine is budgeted by device time
//!   ([`CostModel::turn`]), not by packet count alone, so a queue full of 256 MiB `FILL`s gets
//!   no longer a turn than one full of `WRITE_DATA`s: large `COPY`/`FILL`s are cut at
//!   [`CostModel::bulk_chunk`] boundaries (resumable, like dispatch slices), and a dispatch
//!   slice runs as many wave-instructions as the turn has time left for. A tiny command
//!   buffer behind another process's bulk copies therefore starts within one turn.
//! - **Occupancy** ([`Timing::Modelled`], the deterministic driver's setting). After a step,
//!   the engine is busy until the step's start plus the modelled cost of what it ran, and
//!   runs nothing more before then; that end is a timer ([`crate::Gpu::busy_until`],
//!   included in [`crate::Gpu::poll_timeout`]), so a driver that jumps its clock from event to
//!   event lets time pass while an engine works and fires timeouts beside a busy engine.
//!   `TIMESTAMP`s and fence-log times read the modelled time at which their packet executes.
//!   A slice's memory effects are visible from the moment the step runs it (the start of its
//!   modelled interval): the model orders events, it does not delay stores.
//!
//! With [`Timing::Real`] (the live driver) real execution takes the time it takes: costs only
//! budget turns, timestamps read the real clock, and no engine waits on the model.
//!
//! The defaults are simple round numbers for a small discrete GPU; the simulator will calibrate
//! them against the live driver and extend the model (doorbell-to-fetch latency, interrupt
//! delivery, kernel calls, slot switches).

use std::time::Duration;

/// What executing work costs in device time. See the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CostModel {
    /// Fetching, decoding and executing one packet (any packet, on top of what its own work
    /// costs). Default 50 ns.
    pub packet: Duration,
    /// Bytes a `COPY` or `FILL` moves per microsecond. Default 32,000 (32 GB/s).
    pub bulk_bytes_per_us: u64,
    /// One wave-instruction of a `DISPATCH` (every lane of the wave at once). Default 4 ns.
    pub wave_instruction: Duration,
    /// A `COPY`/`FILL` larger than this is executed in chunks of this many bytes (a multiple
    /// of 4), each a point where the engine may move to another queue and resume later.
    /// Default 64 KiB.
    pub bulk_chunk: u64,
    /// The device time one queue may run per turn before its engine moves on to the next slot
    /// holder. Default 100 µs.
    pub turn: Duration,
    /// Restoring a queue that was taken off its slot with its state saved (a preemption or an
    /// eviction), charged to its engine when the queue next runs, by where it was stopped:
    /// `[between command buffers, between packets, inside a packet]` — a dispatch's or bulk
    /// copy's saved state costs more to bring back than a ring position. Default 0 (off), so
    /// that other figures stay as they were; the simulator's scenarios set them.
    pub restore: [Duration; 3],
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            packet: Duration::from_nanos(50),
            bulk_bytes_per_us: 32_000,
            wave_instruction: Duration::from_nanos(4),
            bulk_chunk: 64 * 1024,
            turn: Duration::from_micros(100),
            restore: [Duration::ZERO; 3],
        }
    }
}

impl CostModel {
    /// Nanoseconds to move `bytes` bytes (rounded up; at least 1 for a non-empty chunk).
    pub fn bulk_ns(&self, bytes: u64) -> u64 {
        let per_us = self.bulk_bytes_per_us.max(1) as u128;
        (bytes as u128 * 1000).div_ceil(per_us).min(u64::MAX as u128) as u64
    }

    /// Nanoseconds for `n` wave-instructions.
    pub fn instructions_ns(&self, n: u64) -> u64 {
        n.saturating_mul(ns(self.wave_instruction))
    }

    /// Nanoseconds to restore a queue stopped at `point` ([`CostModel::restore`]).
    pub fn restore_ns(&self, point: abi::preempt::StopPoint) -> u64 {
        use abi::preempt::StopPoint as P;
        let i = match point {
            P::Idle | P::CommandBuffer => 0,
            P::Packet => 1,
            P::Group | P::Wave | P::Instruction | P::Chunk => 2,
        };
        ns(self.restore[i])
    }

    /// The chunk size actually used: at least 4 bytes, a multiple of 4 (a `FILL` pattern is a
    /// dword).
    pub fn chunk_bytes(&self) -> u64 {
        (self.bulk_chunk.max(4)) & !3
    }
}

/// Whether modelled costs occupy the engine. See the module docs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Timing {
    /// Real execution takes real time: costs only budget turns (the live driver).
    #[default]
    Real,
    /// An engine is busy until the modelled end of what it ran (the deterministic driver).
    Modelled,
}

/// A duration in whole nanoseconds, saturating.
pub(crate) fn ns(d: Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bulk_cost_rounds_up_and_chunks_are_dword_multiples() {
        let c = CostModel::default();
        assert_eq!(c.bulk_ns(32_000), 1000);
        assert_eq!(c.bulk_ns(1), 1);
        assert_eq!(c.bulk_ns(0), 0);
        assert_eq!(c.instructions_ns(10), 40);
        assert_eq!(CostModel { bulk_chunk: 7, ..c }.chunk_bytes(), 4);
        assert_eq!(CostModel { bulk_chunk: 0, ..c }.chunk_bytes(), 4);
        assert_eq!(c.chunk_bytes(), 65536);
        // Restores cost by where the queue stopped.
        use abi::preempt::StopPoint as P;
        let r = CostModel { restore: [Duration::from_nanos(1), Duration::from_nanos(2), Duration::from_nanos(3)], ..c };
        assert_eq!(c.restore_ns(P::Instruction), 0);
        assert_eq!([P::Idle, P::CommandBuffer, P::Packet].map(|p| r.restore_ns(p)), [1, 1, 2]);
        assert_eq!([P::Group, P::Wave, P::Instruction, P::Chunk].map(|p| r.restore_ns(p)), [3; 4]);
        // A zero bandwidth is taken as 1 byte/µs rather than dividing by zero.
        assert_eq!(CostModel { bulk_bytes_per_us: 0, ..c }.bulk_ns(2), 2000);
    }
}
