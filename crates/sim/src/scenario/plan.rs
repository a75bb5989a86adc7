//! The checked form of a scenario, what the runner runs: the [`Plan`], its groups
//! ([`GroupPlan`]) with their workloads ([`Load`]) and durations ([`Duration`]), and its timed
//! events ([`Action`]). Times are in ns, rates per second.
//!
//! Invariant: a [`Plan`] from [`super::Scenario`]'s checks is valid: every index names a
//! group, engine or queue that exists, and every number is in range.

/// A workload, checked.
#[derive(Clone, Debug, PartialEq)]
pub enum Load {
    /// `n` outstanding, `think` ns between a completion and the next submission.
    Closed {
        /// Outstanding command buffers.
        n: u32,
        /// Think time (ns).
        think: u64,
    },
    /// One every `period` ns.
    Periodic(u64),
    /// A Poisson process of `rate` per second.
    Poisson(f64),
    /// `size` at once every `period` ns.
    Bursts {
        /// Command buffers per burst.
        size: u32,
        /// Period (ns).
        period: u64,
    },
    /// Rows (at ns, queue index in the group, synthetic ns), sorted by time.
    Trace(Vec<(u64, u32, u64)>),
}

/// A duration distribution, checked (ns).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Duration {
    /// Always this (rounded to the nanosecond once, here).
    Constant(u64),
    /// Uniform in [lo, hi].
    Uniform(f64, f64),
    /// Exponential with this mean.
    Exponential(f64),
    /// Log-normal with this median and sigma.
    LogNormal(f64, f64),
}

/// A group, checked.
#[derive(Clone, Debug)]
pub struct GroupPlan {
    /// Name.
    pub name: String,
    /// Queues.
    pub count: u32,
    /// Engine index in the device.
    pub engine: usize,
    /// Priority.
    pub priority: abi::Priority,
    /// Kernel-mode path.
    pub kernel_mode: bool,
    /// Queues per process (0: as many as fit).
    pub per_process: u32,
    /// Ring bytes.
    pub ring_bytes: u64,
    /// Workload.
    pub load: Load,
    /// `WRITE_DATA`s.
    pub write_data: u32,
    /// `FILL` bytes.
    pub fill_bytes: u64,
    /// `COPY` bytes.
    pub copy_bytes: u64,
    /// Synthetic dispatch duration.
    pub synthetic: Option<Duration>,
    /// Group index this one waits on.
    pub after: Option<usize>,
    /// Each command buffer signals the queue's native fence.
    pub signal: bool,
    /// A CPU waiter per command buffer.
    pub cpu_waiter: bool,
}

impl GroupPlan {
    /// Queues one client process of this group holds: `queues_per_process`, at most what a
    /// process's doorbell page has for the engine (`doorbells` of them) for user-mode queues,
    /// or 64 kernel-mode queues.
    pub fn queues_per_process(&self, doorbells: u32) -> u32 {
        let fit = self.process_fits(doorbells);
        if self.per_process > 0 { self.per_process.min(fit) } else { fit }
    }

    /// The most queues of this group one process can hold: its doorbell page's share for the
    /// engine (`doorbells`), or 64 kernel-mode queues.
    pub fn process_fits(&self, doorbells: u32) -> u32 {
        if self.kernel_mode { 64 } else { doorbells.max(1) }
    }
}

/// A timed event, checked.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Abnormal termination of the queue's process.
    Kill {
        /// Group.
        group: usize,
        /// Queue.
        queue: u32,
    },
    /// The queue's next command buffer never ends.
    Hang {
        /// Group.
        group: usize,
        /// Queue.
        queue: u32,
    },
    /// D3 requested.
    D3,
    /// The queue's context suspended, resumed after `for_ns` if given.
    Suspend {
        /// Group.
        group: usize,
        /// Queue.
        queue: u32,
        /// Resumed after (ns).
        for_ns: Option<u64>,
    },
}

/// The whole scenario, checked: what [`crate::run`] runs.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Name.
    pub name: String,
    /// Seed.
    pub seed: u64,
    /// Submission window (ns), if bounded by time.
    pub duration: Option<u64>,
    /// Doorbell-to-fetch latency (ns): how long after a client rings the firmware notices.
    pub doorbell_latency: u64,
    /// A kernel call on the control path (ns): how long a client's call takes to return, and
    /// what it does takes effect at its end.
    pub kernel_call: u64,
    /// Total submissions, if bounded by count.
    pub submissions: Option<u64>,
    /// Drain limit (ns).
    pub drain: u64,
    /// Warm-up (ns): command buffers submitted before it give no latency sample.
    pub warmup: u64,
    /// Samples over the run.
    pub samples: u32,
    /// Queues trace.json shows (more when the classes and event targets alone are more).
    pub trace_queues: usize,
    /// The most rows latency.csv holds.
    pub latency_rows: usize,
    /// The system to build.
    pub system: kernel::SystemConfig,
    /// Groups.
    pub groups: Vec<GroupPlan>,
    /// Events (at ns, action), sorted by time.
    pub events: Vec<(u64, Action)>,
    /// The scenario text (for the report).
    pub text: String,
}
