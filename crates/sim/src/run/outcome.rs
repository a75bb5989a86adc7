//! What a run measured: the [`Outcome`] and its parts (per queue, the time series, the
//! command buffers' spans, the instant markers), and why a run can fail ([`RunError`]).
//!
//! Plain data: the runner's steps fill it in, [`crate::output`] and [`crate::report`] read it.

use crate::rows::Rows;

/// Why a run failed (the scenario was valid, but the stack refused something).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The kernel refused (system construction, process, etc.).
    #[error("kernel: {0}")]
    Kernel(#[from] abi::port::KernelError),
    /// The UMD refused.
    #[error("umd: {0}")]
    Umd(#[from] umd::UmdError),
    /// Something the runner checks.
    #[error("{0}")]
    Check(String),
}

/// What happened to one queue.
#[derive(Clone, Debug, Default)]
pub struct QueueResult {
    /// Its group.
    pub group: usize,
    /// Its index in the group.
    pub index: u32,
    /// Command buffers submitted.
    pub submitted: u64,
    /// Completed.
    pub completed: u64,
    /// Completed inside the submission window.
    pub completed_in_window: u64,
    /// Doorbell reconnects.
    pub reconnects: u64,
    /// Completed command buffers submitted after the warm-up (those that gave a latency
    /// sample).
    pub measured: u64,
    /// Their latency sum (ns).
    pub latency_sum: u64,
    /// Their max latency (ns).
    pub latency_max: u64,
    /// Lost: the queue ended (killed, hung, lost) with work outstanding.
    pub ended: Option<String>,
}

/// A sample of the time series.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    /// Bucket start (ns).
    pub t: u64,
    /// Completions in the bucket.
    pub completions: u64,
    /// Per engine: slots held at the bucket's start.
    pub slots_held: Vec<usize>,
    /// Per engine: device time spent executing so far, at the bucket's start (ns;
    /// `gpu::Gpu::engine_busy_ns`). The next sample's (or [`Outcome::busy_end_ns`]) minus this
    /// is the bucket's busy time.
    pub busy_ns: Vec<u64>,
}

/// One completed command buffer's life (a trace.json slice, a latency.csv row), in ns since
/// the run's start. Its latency, `end - submit`, splits into queueing (until its first packet
/// executed), execution (device time its packets executed) and preempted time (the rest after
/// its start, when it was not executing: switched out, preempted, blocked part-way); see
/// `gpu`'s `firmware/cb_clock.rs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// The queue (global index).
    pub queue: usize,
    /// Its number on its queue (the progress value it ends with: 1, 2, …).
    pub cb: u64,
    /// Submitted (the client's submission instant; in a backlog, its arrival).
    pub submit: u64,
    /// Its first packet executed.
    pub start: u64,
    /// Completed (its `PROGRESS_FENCE` ended).
    pub end: u64,
    /// Device time its packets executed.
    pub execution: u64,
}

impl Span {
    /// The span of command buffer `cb` of `queue`, from the device's times, clamped so that
    /// `submit <= start <= end` and `execution <= end - start` (a device time never lies
    /// outside its command buffer's life; the clamp keeps a slip from underflowing).
    pub fn new(queue: usize, cb: u64, submit: u64, start: u64, end: u64, execution: u64) -> Span {
        let end = end.max(submit);
        let start = start.clamp(submit, end);
        Span { queue, cb, submit, start, end, execution: execution.min(end - start) }
    }

    /// Submission to completion.
    pub fn latency(&self) -> u64 {
        self.end - self.submit
    }

    /// Submission to its first packet: waiting in a backlog, for the doorbell to be heard, for
    /// a slot and a turn, in a `WAIT` at its head, behind its queue's earlier work.
    pub fn queueing(&self) -> u64 {
        self.start - self.submit
    }

    /// After its start, the time it was not executing.
    pub fn preempted(&self) -> u64 {
        self.end - self.start - self.execution
    }
}

/// Something that happened at an instant (for trace.json's markers): a scenario event
/// (`kill`, `hang`, `d3 request`, `suspend`, `resume`) or a notable kernel event
/// (`kernel::trace::Notable`: fault, TDR, reset, victimization, preemption, D3, losses).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mark {
    /// When (ns since the run's start).
    pub t: u64,
    /// What kind.
    pub kind: &'static str,
    /// The queue it concerns (global index), where known.
    pub queue: Option<usize>,
    /// The event in words.
    pub text: String,
}

/// Everything a run measured.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Plan name.
    pub name: String,
    /// Seed used.
    pub seed: u64,
    /// Per queue.
    pub queues: Vec<QueueResult>,
    /// Latencies (ns) per group, of command buffers submitted after the warm-up.
    pub latencies: Vec<Vec<u64>>,
    /// Those command buffers, in completion order (latency.csv): every one, or past
    /// [`crate::scenario::Plan::latency_rows`] an even sample ([`crate::rows`]).
    pub latency_rows: Rows<Span>,
    /// Per group, their latencies' split summed, every one counted: queueing, execution and
    /// preempted time (ns).
    pub latency_split: Vec<[u64; 3]>,
    /// Virtual time submission stopped (ns).
    pub window_end: u64,
    /// Virtual time the run ended (ns).
    pub end: u64,
    /// Time series, at `bucket` ns.
    pub samples: Vec<Sample>,
    /// Bucket width (ns).
    pub bucket: u64,
    /// Slots per engine.
    pub slots: u32,
    /// Engine names.
    pub engines: Vec<String>,
    /// Kernel counters.
    pub interrupts: u64,
    /// Victimizations.
    pub victimizations: u64,
    /// Connects.
    pub connects: u64,
    /// Preemption requests answered (the firmware's counts).
    pub preemptions: u64,
    /// Recoveries (queue, engine and adapter resets).
    pub recoveries: u64,
    /// Queue faults seen by the kernel.
    pub faults: u64,
    /// Events (doorbell rings, packets executed, slot changes, interrupts, fence signals,
    /// completions).
    pub events: u64,
    /// Packets executed in completed command buffers.
    pub packets: u64,
    /// Slot changes.
    pub slot_changes: u64,
    /// Sampled spans for the trace.
    pub spans: Vec<Span>,
    /// Queues the trace shows.
    pub traced_queues: Vec<usize>,
    /// Per engine: device time spent executing, at the run's end (ns).
    pub busy_end_ns: Vec<u64>,
    /// Scenario and notable kernel events, in time order (the kernel's within its trace
    /// window; at most [`MAX_MARKS`]).
    pub marks: Vec<Mark>,
    /// Wall-clock seconds the run took (not part of any deterministic output).
    pub wall_seconds: f64,
    /// Of which building the system, processes and queues.
    pub setup_seconds: f64,
    /// Of which the event loop (from the first submission to the end of the drain).
    pub run_seconds: f64,
}

/// The most instant markers a run keeps.
pub const MAX_MARKS: usize = 20_000;
