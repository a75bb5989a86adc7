//! Preemption granularity: where an engine can stop a queue's work to give its hardware slot to
//! another (spec 003 "GPU preemption"; `D3DKMDT_PREEMPTION_CAPS` with its
//! `D3DKMDT_COMPUTE_PREEMPTION_GRANULARITY` levels).
//!
//! Preemption is a request with an answer: the kernel (or the firmware's own scheduler) asks
//! for a queue to leave its slot, and the engine stops it at the next point its granularity
//! allows, saves its state in the queue's context save area and answers. The finer the level,
//! the sooner the answer; every level resumes bit-exact, and no level ever re-executes a packet
//! that wrote memory.
//!
//! | level | compute engines stop | copy engines stop |
//! |---|---|---|
//! | `None` | only when the queue has no work left | same |
//! | `DmaBuffer` | at the end of a command buffer (after its `PROGRESS_FENCE`) | same |
//! | `Dispatch` | between packets, inside an indirect buffer too | — |
//! | `ThreadGroup` | also between the workgroups of a `DISPATCH` | — |
//! | `Thread` | also between its waves | — |
//! | `Shader` | also between two instructions of a wave | — |
//! | `Chunk` | — | also between the chunks of a large `COPY`/`FILL` |
//!
//! A `WAIT` whose condition does not hold yet is preemptible at every level but `None` (spec
//! 003: a device with hardware waits "must support the ability to preempt a wait instruction
//! before the wait condition is satisfied").

use core::fmt;

/// Where a compute engine can stop (`D3DKMDT_COMPUTE_PREEMPTION_GRANULARITY`), coarsest first.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[repr(u32)]
pub enum ComputeGranularity {
    /// `D3DKMDT_COMPUTE_PREEMPTION_NONE`: a queue leaves its slot only when it runs dry.
    None = 0,
    /// `..._DMA_BUFFER_BOUNDARY`: at the end of a command buffer.
    DmaBuffer = 1,
    /// `..._DISPATCH_BOUNDARY`: between packets.
    Dispatch = 2,
    /// `..._THREAD_GROUP_BOUNDARY`: between workgroups.
    ThreadGroup = 3,
    /// `..._THREAD_BOUNDARY`: between waves (a wave is the engine's unit of threads).
    Thread = 4,
    /// `..._SHADER_BOUNDARY`: between instructions.
    #[default]
    Shader = 5,
}

/// Where a copy engine can stop, coarsest first.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[repr(u32)]
pub enum CopyGranularity {
    /// Only when the queue runs dry.
    None = 0,
    /// At the end of a command buffer.
    DmaBuffer = 1,
    /// Between packets and between the chunks of a large `COPY`/`FILL`.
    #[default]
    Chunk = 2,
}

/// The device's preemption capabilities (`D3DKMDT_PREEMPTION_CAPS`), reported by the INFO
/// query and set per device.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct PreemptionCaps {
    /// Compute engines.
    pub compute: ComputeGranularity,
    /// Copy engines.
    pub copy: CopyGranularity,
}

impl ComputeGranularity {
    /// Every level, coarsest first.
    pub const ALL: [ComputeGranularity; 6] = [
        ComputeGranularity::None,
        ComputeGranularity::DmaBuffer,
        ComputeGranularity::Dispatch,
        ComputeGranularity::ThreadGroup,
        ComputeGranularity::Thread,
        ComputeGranularity::Shader,
    ];

    /// Its name in snake case (`dma_buffer`), as configuration and benchmarks spell it.
    pub const fn name(self) -> &'static str {
        match self {
            ComputeGranularity::None => "none",
            ComputeGranularity::DmaBuffer => "dma_buffer",
            ComputeGranularity::Dispatch => "dispatch",
            ComputeGranularity::ThreadGroup => "thread_group",
            ComputeGranularity::Thread => "thread",
            ComputeGranularity::Shader => "shader",
        }
    }

    /// Parses [`ComputeGranularity::name`].
    pub fn from_name(s: &str) -> Option<ComputeGranularity> {
        Self::ALL.into_iter().find(|g| g.name() == s)
    }
}

impl CopyGranularity {
    /// Every level, coarsest first.
    pub const ALL: [CopyGranularity; 3] = [CopyGranularity::None, CopyGranularity::DmaBuffer, CopyGranularity::Chunk];

    /// Its name in snake case.
    pub const fn name(self) -> &'static str {
        match self {
            CopyGranularity::None => "none",
            CopyGranularity::DmaBuffer => "dma_buffer",
            CopyGranularity::Chunk => "chunk",
        }
    }

    /// Parses [`CopyGranularity::name`].
    pub fn from_name(s: &str) -> Option<CopyGranularity> {
        Self::ALL.into_iter().find(|g| g.name() == s)
    }
}

impl fmt::Display for ComputeGranularity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for CopyGranularity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a queue's execution stands, as far as stopping it goes: the points an engine may
/// stop at, finest last. The firmware asks [`Stop::allows`] at each point it reaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopPoint {
    /// The queue has no work left.
    Idle,
    /// Right after a `PROGRESS_FENCE`: the end of a command buffer.
    CommandBuffer,
    /// Between two packets (or before a `WAIT` that does not pass yet).
    Packet,
    /// Between two workgroups of a `DISPATCH`.
    Group,
    /// Between two waves of a workgroup.
    Wave,
    /// Between two instructions of a wave.
    Instruction,
    /// Between two chunks of a `COPY`/`FILL`.
    Chunk,
}

/// The stop rule of one engine: its kind's granularity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// A compute engine.
    Compute(ComputeGranularity),
    /// A copy engine.
    Copy(CopyGranularity),
}

impl Stop {
    /// Whether the engine may stop at `p`.
    pub fn allows(self, p: StopPoint) -> bool {
        use ComputeGranularity as C;
        use StopPoint as P;
        match (self, p) {
            (_, P::Idle) => true,
            (Stop::Compute(g), P::CommandBuffer) => g >= C::DmaBuffer,
            (Stop::Compute(g), P::Packet) => g >= C::Dispatch,
            (Stop::Compute(g), P::Group) => g >= C::ThreadGroup,
            (Stop::Compute(g), P::Wave) => g >= C::Thread,
            (Stop::Compute(g), P::Instruction) => g >= C::Shader,
            // A compute engine's bulk copies stop where its finest levels stop a dispatch.
            (Stop::Compute(g), P::Chunk) => g >= C::ThreadGroup,
            (Stop::Copy(g), P::CommandBuffer) => g >= CopyGranularity::DmaBuffer,
            (Stop::Copy(g), P::Packet | P::Chunk) => g >= CopyGranularity::Chunk,
            (Stop::Copy(_), P::Group | P::Wave | P::Instruction) => false,
        }
    }

    /// Whether a `WAIT` that does not pass yet may be preempted (every level but `None`).
    pub fn allows_blocked_wait(self) -> bool {
        !matches!(self, Stop::Compute(ComputeGranularity::None) | Stop::Copy(CopyGranularity::None))
    }

    /// The finest point inside a `DISPATCH` the engine stops at, if any.
    pub fn in_dispatch(self) -> Option<StopPoint> {
        [StopPoint::Instruction, StopPoint::Wave, StopPoint::Group].into_iter().find(|&p| self.allows(p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_level_allows_exactly_its_points_and_the_coarser_ones() {
        use StopPoint as P;
        let points = [P::CommandBuffer, P::Packet, P::Group, P::Wave, P::Instruction];
        for (i, g) in ComputeGranularity::ALL.into_iter().enumerate() {
            for (j, p) in points.into_iter().enumerate() {
                // Level i (None = 0) allows the first i points.
                assert_eq!(Stop::Compute(g).allows(p), j < i, "{g} at {p:?}");
            }
            assert!(Stop::Compute(g).allows(P::Idle));
        }
        assert!(!Stop::Copy(CopyGranularity::DmaBuffer).allows(P::Chunk));
        assert!(Stop::Copy(CopyGranularity::Chunk).allows(P::Chunk));
        assert!(!Stop::Copy(CopyGranularity::None).allows(P::CommandBuffer));
        assert!(!Stop::Copy(CopyGranularity::Chunk).allows(P::Instruction));
        assert_eq!(Stop::Compute(ComputeGranularity::Thread).in_dispatch(), Some(P::Wave));
        assert_eq!(Stop::Compute(ComputeGranularity::Dispatch).in_dispatch(), None);
        assert!(!Stop::Compute(ComputeGranularity::None).allows_blocked_wait());
        assert!(Stop::Compute(ComputeGranularity::DmaBuffer).allows_blocked_wait());
    }

    #[test]
    fn names_round_trip() {
        for g in ComputeGranularity::ALL {
            assert_eq!(ComputeGranularity::from_name(g.name()), Some(g));
        }
        for g in CopyGranularity::ALL {
            assert_eq!(CopyGranularity::from_name(g.name()), Some(g));
        }
        assert_eq!(ComputeGranularity::from_name("instruction"), None);
    }
}
