//! The runner: a checked scenario ([`Plan`]) played on the real stack in virtual time.
//!
//! One thread plays every client. It opens processes on a [`kernel::System::sim`], creates
//! devices, contexts and queues through `umd` (user-mode queues ring doorbells, kernel-mode
//! ones call the kernel), and submits command buffers with `umd::Queue::submit`, the spec's
//! submission loop. The firmware, engines and kernel that run the live system run here,
//! stepped by the deterministic driver on its virtual clock.
//!
//! The loop interleaves two event sources in time order: the clients' own (a submission due,
//! a timed event) and the world's (an engine's modelled work ending, a device or kernel
//! timer). At each instant it runs the world until nothing moves ([`System::run_instant`]),
//! reads the completions the device recorded ([`gpu::Gpu::take_completions`]: each
//! `PROGRESS_FENCE` with its modelled end), retires them (latency = end − submit time; a
//! closed loop schedules its next submission at end + think time), then runs the client
//! events due, then moves the clock to the earliest next event of either side.
//!
//! Invariants: everything is ordered by (time, sequence number) and every random draw comes
//! from a per-queue ChaCha stream seeded by (seed, queue index), so the same plan and seed
//! give the same run, byte for byte. A queue never has more command buffers outstanding than
//! its ring holds (open-loop submissions beyond that wait in a client-side backlog, and their
//! latency counts the wait), so a submission never blocks the single client thread.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;

use abi::Time;
use abi::port::{KernelPort, QUEUE_STATUS_HUNG};
use kernel::{ProcessPort, System, Termination};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use umd::{CommandBuffer, Device, NativeFence, Queue, QueueOptions};

use crate::observe::{Observer, QueueView, Record, World};
use crate::scenario::{Action, Duration as Dist, Load, Plan};

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

/// A hung kernel: a synthetic dispatch this long (ns) never ends within any run.
pub const HUNG_NS: u64 = u64::MAX / 4;

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
    /// [`Plan::latency_rows`] an even sample ([`crate::rows`]).
    pub latency_rows: crate::rows::Rows,
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

/// Instants between two looks at the progress (a look costs a division, and the bar moves by
/// hundredths).
const PROGRESS_EVERY: u32 = 64;

/// The most spans trace.json holds, and the most marks.
const TRACE_SPANS: usize = 200_000;
/// The most instant markers a run keeps.
pub const MAX_MARKS: usize = 20_000;

/// The most instants an observed run's teardown runs the world for its last work.
const TEARDOWN_INSTANTS: usize = 10_000;

struct Client {
    port: Arc<ProcessPort>,
    dev: Device,
    ctx: umd::Context,
    scratch: Option<umd::Buffer>,
    alive: bool,
}

struct SimQ {
    group: usize,
    index: u32,
    client: usize,
    q: Option<Queue>,
    outstanding: VecDeque<(u64, u64, u32)>,
    backlog: VecDeque<(u64, Option<u64>)>,
    cap: usize,
    rng: ChaCha8Rng,
    /// The fence this queue signals with each command buffer's progress value (when a
    /// group depends on it), and the upstream fence it waits on (opened in its device).
    signal: Option<NativeFence>,
    upstream: Option<(usize, NativeFence)>,
    /// CPU waits started for this queue's fence signals (value, wait), oldest first.
    waits: VecDeque<(u64, kernel::FenceWaitHandle)>,
    hang_next: bool,
    /// Its client is inside a kernel call until then (ns): it submits nothing before.
    busy_until: u64,
    res: QueueResult,
    traced: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// A submission of queue `q` due (intended time is the key's time); `Some(ns)`: its
    /// synthetic duration (trace rows).
    Submit(usize, Option<u64>),
    /// The next arrival of an open-loop queue.
    Arrival(usize),
    /// Timed event `i`.
    Timed(usize),
    /// Resume the context of queue `q`.
    Resume(usize),
    /// Queue `q`'s client is out of its kernel call: it submits from its backlog again.
    Drain(usize),
    /// Queue `q`'s kernel-mode submission call returns: the oldest command buffer of its
    /// backlog reaches the kernel.
    Enter(usize),
}

/// The clients' events, in (time, order of scheduling) order, each keyed by one number: its
/// time in the high half, its scheduling order in the low half.
///
/// Most events are scheduled in time order (a closed loop's next submission at each
/// completion, and completions come in time order): those go to the back of a queue, and only
/// the others to a heap. The earlier of the two fronts is the next event, so the order is the
/// same as one heap's, at a fraction of its cost.
struct Events {
    /// Events scheduled no earlier than every event already in it, in key order, from
    /// `in_order[head]` on (the ones before `head` are gone).
    in_order: Vec<(u128, Ev)>,
    head: usize,
    heap: BinaryHeap<Reverse<Scheduled>>,
    seq: u64,
    /// The key of the next event (`u128::MAX`: none), the earlier of the two fronts.
    next: u128,
}

impl Default for Events {
    fn default() -> Self {
        Events { in_order: Vec::new(), head: 0, heap: BinaryHeap::new(), seq: 0, next: u128::MAX }
    }
}

/// An event in the heap and its key.
struct Scheduled(u128, Ev);

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.cmp(&other.0)
    }
}

impl Events {
    #[inline(always)]
    fn push(&mut self, t: u64, e: Ev) {
        self.seq += 1;
        let key = (t as u128) << 64 | self.seq as u128;
        if self.in_order.len() == self.head || self.in_order.last().is_some_and(|&(last, _)| last <= key) {
            self.in_order.push((key, e));
        } else {
            self.heap.push(Reverse(Scheduled(key, e)));
        }
        self.next = self.next.min(key);
    }

    /// The time of the next event.
    fn next_time(&self) -> Option<u64> {
        (self.next != u128::MAX).then_some((self.next >> 64) as u64)
    }

    /// The next event, if it is due at `now`.
    fn pop_due(&mut self, now: u64) -> Option<(u64, Ev)> {
        let key = self.next;
        if key == u128::MAX || (key >> 64) as u64 > now {
            return None;
        }
        let e = match self.in_order.get(self.head) {
            Some(&(k, e)) if k == key => {
                self.head += 1;
                if self.head == self.in_order.len() {
                    self.in_order.clear();
                    self.head = 0;
                } else if self.head >= 4096 && 2 * self.head >= self.in_order.len() {
                    // Half of it is gone: move the rest down (each event moves about once).
                    self.in_order.drain(..self.head);
                    self.head = 0;
                }
                Some(e)
            }
            _ => self.heap.pop().map(|Reverse(Scheduled(_, e))| e),
        };
        let a = self.in_order.get(self.head).map_or(u128::MAX, |&(k, _)| k);
        let b = self.heap.peek().map_or(u128::MAX, |Reverse(s)| s.0);
        self.next = a.min(b);
        e.map(|e| ((key >> 64) as u64, e))
    }
}

/// Runs `plan` with `seed`; `progress(done_fraction)` is called now and then.
pub fn run(plan: &Plan, seed: u64, progress: &mut dyn FnMut(f64)) -> Result<Outcome, RunError> {
    run_observed(plan, seed, progress, None)
}

/// [`run`], watched by `observer` (see [`crate::observe`]): its hooks see every completion
/// record, submission and instant, and the census at teardown.
pub fn run_observed(
    plan: &Plan,
    seed: u64,
    progress: &mut dyn FnMut(f64),
    mut observer: Option<&mut dyn Observer>,
) -> Result<Outcome, RunError> {
    let wall = std::time::Instant::now();
    let sys = System::sim(plan.system.clone())?;
    sys.with_gpu(|g| g.record_completions(true));
    let engines: Vec<String> = plan.system.gpu.engines.iter().map(|e| format!("{e:?}").to_lowercase()).collect();

    // Build clients and queues, group by group.
    let mut clients: Vec<Client> = Vec::new();
    let mut qs: Vec<SimQ> = Vec::new();
    let mut group_first = Vec::new();
    // Device queue id -> our queue, by the id's table entry (the low half), checked against
    // the whole id (a stale generation names nothing).
    let mut fw_map: Vec<Option<(u64, usize)>> = Vec::new();
    for (gi, g) in plan.groups.iter().enumerate() {
        group_first.push(qs.len());
        let mut left = g.count;
        let mut index = 0u32;
        while left > 0 {
            let port = sys.open_process()?;
            let kport: Arc<dyn KernelPort> = port.clone();
            let dev = Device::open(kport)?;
            let engine = dev.info().engines.get(g.engine).map(|e| (e.id, e.doorbell_count)).ok_or_else(|| {
                RunError::Check(format!("group {}: engine {} missing from the adapter", g.name, g.engine))
            })?;
            let n = g.queues_per_process(engine.1).min(left);
            let ctx = dev.create_context(engine.0)?;
            let scratch_bytes = 8 * n as u64 + g.fill_bytes + 2 * g.copy_bytes;
            let scratch = if g.write_data > 0 || g.fill_bytes > 0 || g.copy_bytes > 0 {
                Some(dev.allocate(scratch_bytes.next_multiple_of(4096))?)
            } else {
                None
            };
            let client = clients.len();
            clients.push(Client { port, dev, ctx, scratch, alive: true });
            for _ in 0..n {
                let opts = QueueOptions {
                    kind: if g.kernel_mode { umd::SubmissionKind::KernelMode } else { umd::SubmissionKind::UserMode },
                    ring_bytes: g.ring_bytes,
                    priority: g.priority,
                    ..QueueOptions::default()
                };
                let mut q = clients[client].ctx.create_queue(opts)?;
                q.set_spin(0);
                let id = qs.len();
                let pid = clients[client].port.process();
                let fw = sys
                    .device_queue_id(pid, q.handle())?
                    .ok_or_else(|| RunError::Check("the KMD names no device queue".into()))?;
                let slot = (fw & 0xffff_ffff) as usize;
                if fw_map.len() <= slot {
                    fw_map.resize(slot + 1, None);
                }
                fw_map[slot] = Some((fw, id));
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                rng.set_stream(id as u64);
                qs.push(SimQ {
                    group: gi,
                    index,
                    client,
                    q: Some(q),
                    outstanding: VecDeque::new(),
                    backlog: VecDeque::new(),
                    cap: 1,
                    rng,
                    signal: None,
                    upstream: None,
                    waits: VecDeque::new(),
                    hang_next: false,
                    busy_until: 0,
                    res: QueueResult { group: gi, index, ..Default::default() },
                    traced: false,
                });
                index += 1;
            }
            left -= n;
        }
    }
    // Fence dependencies: the upstream queue signals a shareable fence; the downstream one
    // opens it in its own device.
    for (gi, g) in plan.groups.iter().enumerate() {
        let Some(up) = g.after else { continue };
        for k in 0..g.count as usize {
            let me = group_first[gi] + k;
            let them = group_first[up] + k % plan.groups[up].count as usize;
            if qs[them].signal.is_none() {
                let desc = abi::port::NativeFenceDesc {
                    shareable: true,
                    ..abi::port::NativeFenceDesc::new(0, abi::port::NativeFenceType::Default)
                };
                let f = clients[qs[them].client].dev.create_fence_with(&desc)?;
                qs[them].signal = Some(f);
            }
            let global = qs[them]
                .signal
                .as_ref()
                .and_then(NativeFence::global)
                .ok_or_else(|| RunError::Check("a shareable fence has no global handle".into()))?;
            let opened = clients[qs[me].client].dev.open_fence(global)?;
            qs[me].upstream = Some((them, opened));
        }
    }
    // Groups that signal their own fences (and perhaps wait for them on the CPU).
    for (gi, g) in plan.groups.iter().enumerate() {
        if !g.signal {
            continue;
        }
        for k in 0..g.count as usize {
            let me = group_first[gi] + k;
            if qs[me].signal.is_none() {
                let f = clients[qs[me].client].dev.create_fence(0, abi::port::NativeFenceType::Default)?;
                qs[me].signal = Some(f);
            }
        }
    }
    // Ring capacity: outstanding command buffers a ring holds with room to spare (packets
    // never straddle the end, so up to one command buffer's worth is padding).
    for q in qs.iter_mut() {
        let g = &plan.groups[q.group];
        let dwords = cb_dwords(g, q.signal.is_some(), q.upstream.is_some());
        q.cap = ((g.ring_bytes / 4) as usize / dwords).saturating_sub(2).max(1);
        if let Load::Closed { n, .. } = g.load {
            q.cap = q.cap.min(n as usize);
        }
    }
    // Trace sampling: every class's first queue and every queue a scenario event names (the
    // hung, killed and suspended ones), then queues spread evenly over all, up to
    // `trace_queues` in all.
    let mut traced = std::collections::BTreeSet::new();
    traced.extend(group_first.iter().copied().filter(|&i| i < qs.len()));
    for (_, a) in &plan.events {
        if let Action::Kill { group, queue } | Action::Hang { group, queue } | Action::Suspend { group, queue, .. } = *a
        {
            traced.insert(group_first[group] + queue as usize);
        }
    }
    let stride = qs.len().div_ceil(plan.trace_queues.max(1)).max(1);
    for i in (0..qs.len()).step_by(stride) {
        if traced.len() >= plan.trace_queues.max(traced.len()) {
            break;
        }
        traced.insert(i);
    }
    let traced_queues: Vec<usize> = traced.into_iter().collect();
    for &i in &traced_queues {
        qs[i].traced = true;
    }

    let setup_seconds = wall.elapsed().as_secs_f64();
    let run_start = std::time::Instant::now();
    let t0 = sys.now().0;
    let window_end = plan.duration.map(|d| t0 + d);
    let mut heap = Events::default();
    let push = |heap: &mut Events, t: u64, e: Ev| heap.push(t, e);
    for (i, q) in qs.iter_mut().enumerate() {
        let g = &plan.groups[q.group];
        match &g.load {
            Load::Closed { n, .. } => {
                for _ in 0..*n {
                    push(&mut heap, t0, Ev::Submit(i, None));
                }
            }
            Load::Periodic(p) => {
                // Phases spread over one period, so the queues do not all ring at once.
                let phase = p * q.index as u64 / g.count as u64;
                push(&mut heap, t0 + phase, Ev::Arrival(i));
            }
            Load::Poisson(rate) => {
                let dt = exp_ns(&mut q.rng, 1e9 / rate);
                push(&mut heap, t0 + dt, Ev::Arrival(i));
            }
            Load::Bursts { period, .. } => {
                let phase = period * q.index as u64 / g.count as u64;
                push(&mut heap, t0 + phase, Ev::Arrival(i));
            }
            Load::Trace(rows) => {
                for &(at, qi, size) in rows {
                    if qi == q.index {
                        push(&mut heap, t0 + at, Ev::Submit(i, Some(size)));
                    }
                }
            }
        }
    }
    for (k, (at, _)) in plan.events.iter().enumerate() {
        push(&mut heap, t0 + at, Ev::Timed(k));
    }

    // Time series buckets: fixed width when the window is known, otherwise doubling.
    let samples_wanted = plan.samples as u64;
    let mut bucket = match plan.duration {
        Some(d) => (d / samples_wanted).max(1),
        None => 1_000_000,
    };
    let mut series: Vec<Sample> = Vec::new();
    // Completions per bucket, by completion time.
    let mut counts = Buckets::new(bucket);
    // Per engine: slots held now, and busy time up to `t` (a bucket's start, at or before
    // now: the clock jumps only over spans with no engine step, in which the engines run the
    // tail of what their last step started, so busy time up to `t` is exact).
    let engine_state = |sys: &System, t: u64| -> (Vec<usize>, Vec<u64>) {
        let now = Time(t);
        sys.with_gpu(|g| {
            (0..engines.len())
                .map(|e| {
                    let id = abi::EngineId(e as u32);
                    (g.slot_occupancy(id).map_or(0, |s| s.0), g.engine_busy_ns(id, now).unwrap_or(0))
                })
                .unzip()
        })
    };

    let mut latencies: Vec<Vec<u64>> = vec![Vec::new(); plan.groups.len()];
    let mut spans = Vec::new();
    let mut latency_rows = crate::rows::Rows::new(plan.latency_rows);
    let mut latency_split = vec![[0u64; 3]; plan.groups.len()];
    let mut marks: Vec<Mark> = Vec::new();
    let mut comps = Vec::new();
    let mut records: Vec<Record> = Vec::new();
    let mut cb = Encoded::default();
    let mut tally = Tally::default();
    // Command buffers outstanding on queues that still exist (the drain ends when none are).
    let mut in_flight = 0u64;
    let mut stopped = false;
    let mut stop_time = u64::MAX;
    let mut packets = 0u64;
    let mut completions_total = 0u64;
    let mut last_completion = 0u64;
    // Device ids of the queues submitted to since the world last ran (each rang its doorbell).
    let mut rang_since: Vec<u64> = Vec::new();
    // Rings the device has not noticed yet: (when it notices, order, device queue id). The
    // doorbell-to-fetch latency: the firmware looks at a rung doorbell that long after the
    // client wrote it.
    let mut unheard: VecDeque<(u64, u64)> = VecDeque::new();
    let latency = plan.doorbell_latency;
    let fw_of: Vec<u64> = {
        let mut v = vec![0u64; qs.len()];
        for &(fw, i) in fw_map.iter().flatten() {
            v[i] = fw;
        }
        v
    };
    let mut last_progress = 0.0f64;
    // Instants until progress is worked out again.
    let mut progress_in = 0u32;
    // Whether the world ran at this instant after the clients' last events (see below).
    let mut world_ran = false;
    // When the series' next bucket opens.
    let mut next_bucket = t0;
    'instants: loop {
        let mut now = sys.now().0;
        // Series: open buckets up to now.
        if now >= next_bucket {
            while series.last().is_none_or(|s| s.t + bucket <= now) {
                let t = series.last().map_or(t0, |s| s.t + bucket);
                let (slots_held, busy_ns) = engine_state(&sys, t);
                series.push(Sample { t, completions: 0, slots_held, busy_ns });
                if plan.duration.is_none() && series.len() as u64 > 2 * samples_wanted {
                    // Merge pairs: the bucket doubles.
                    let old = std::mem::take(&mut series);
                    series.extend(old.chunks(2).map(|pair| pair[0].clone()));
                    counts.double();
                    bucket *= 2;
                }
            }
            next_bucket = series.last().map_or(t0, |s| s.t + bucket);
        }
        // The world at this instant (unless it just ran, after the clients' last events).
        if !world_ran {
            run_world(&sys, now, &heap, &mut unheard, &mut rang_since);
        }
        world_ran = false;
        // Completions recorded by the device.
        sys.take_completions(&mut comps);
        for c in comps.drain(..) {
            let bits = c.queue.to_bits();
            let Some(Some((fw, i))) = fw_map.get((bits & 0xffff_ffff) as usize).copied() else { continue };
            if fw == bits {
                records.push(Record {
                    queue: i,
                    value: c.value,
                    at: c.at.0 - t0,
                    started: c.started.0.saturating_sub(t0),
                    execution: c.exec_ns,
                });
            }
        }
        if let Some(o) = observer.as_deref_mut()
            && !records.is_empty()
        {
            o.completions(now - t0, &mut records);
        }
        for c in records.drain(..) {
            let i = c.queue;
            let q = &mut qs[i];
            let at = c.at + t0;
            last_completion = last_completion.max(at);
            // The record's split is its command buffer's (one progress value each).
            let mut split = Some((c.started, c.execution));
            while let Some(&(v, t, np)) = q.outstanding.front() {
                if v > c.value {
                    break;
                }
                q.outstanding.pop_front();
                if q.q.is_some() {
                    in_flight -= 1;
                }
                let (start, execution) = split.take().unwrap_or((c.at, 0));
                let span = Span::new(i, v, t - t0, start, c.at, execution);
                let lat = span.latency();
                q.res.completed += 1;
                completions_total += 1;
                packets += np as u64;
                // Throughput and fairness count completions in [warm-up end, window end).
                if window_end.is_none_or(|w| at < w) && !stopped_before(stop_time, at) && c.at >= plan.warmup {
                    q.res.completed_in_window += 1;
                }
                // warmup_ms: a command buffer submitted in the warm-up gives no latency figure.
                if span.submit >= plan.warmup {
                    q.res.measured += 1;
                    q.res.latency_sum += lat;
                    q.res.latency_max = q.res.latency_max.max(lat);
                    latencies[q.group].push(lat);
                    let split = &mut latency_split[q.group];
                    split[0] += span.queueing();
                    split[1] += span.execution;
                    split[2] += span.preempted();
                    latency_rows.push(span);
                }
                if q.traced && spans.len() < TRACE_SPANS {
                    spans.push(span);
                }
                // Its bucket by its own time (it may lie ahead of the clock: the engine ran it
                // from the step's start).
                counts.add(at - t0);
                if let Load::Closed { think, .. } = plan.groups[q.group].load
                    && !stopped
                {
                    push(&mut heap, at + think, Ev::Submit(i, None));
                }
            }
            // CPU waits for what completed end (the waiter wakes and goes away).
            while q.waits.front().is_some_and(|(v, _)| *v <= c.value) {
                let (_, w) = q.waits.pop_front().expect("checked");
                let pid = clients[q.client].port.process();
                let _ = sys.end_fence_wait(pid, &w);
            }
            // Space freed: a backlog submission goes now (at the completion's time).
            if !q.backlog.is_empty() && q.outstanding.len() < q.cap {
                push(&mut heap, at, Ev::Drain(i));
            }
        }
        if let Some(o) = observer.as_deref_mut() {
            let view = |i: usize| queue_view(&qs[i], &clients, t0);
            let world = World { sys: &sys, queues: &view, len: qs.len(), group_first: &group_first };
            o.instant(now - t0, &world);
        }
        // The submission window is half-open, [start, start + duration): at its end nothing
        // more is submitted, whatever else is due at that instant (a 100 µs period over 1 ms
        // submits 10 times, not 11).
        if !stopped && window_end.is_some_and(|w| now >= w) {
            stopped = true;
            stop_time = now;
        }
        // Client events due now (the instant took no time), and the instants that follow
        // while only the clients act.
        loop {
            let mut ran = false;
            while let Some((t, ev)) = heap.pop_due(now) {
                ran = true;
                match ev {
                    Ev::Arrival(i) => {
                        if stopped {
                            continue;
                        }
                        let g = &plan.groups[qs[i].group];
                        let (n, next) = match &g.load {
                            Load::Periodic(p) => (1, t + p),
                            Load::Poisson(rate) => (1, t + exp_ns(&mut qs[i].rng, 1e9 / rate).max(1)),
                            Load::Bursts { size, period } => (*size, t + period),
                            _ => (0, u64::MAX),
                        };
                        for _ in 0..n {
                            qs[i].backlog.push_back((t, None));
                        }
                        push(&mut heap, next, Ev::Arrival(i));
                        push(&mut heap, t, Ev::Drain(i));
                    }
                    Ev::Submit(_, _) | Ev::Drain(_) => {
                        if stopped {
                            continue;
                        }
                        // A submission due joins the backlog's end: it goes now if the backlog is
                        // empty and the ring has room (usually), without passing through it.
                        let (i, mut due) = match ev {
                            Ev::Submit(i, size) => {
                                let closed = matches!(plan.groups[qs[i].group].load, Load::Closed { .. });
                                (i, (closed || size.is_some()).then_some((t, size)))
                            }
                            Ev::Drain(i) => (i, None),
                            _ => unreachable!("matched above"),
                        };
                        // A client inside a kernel call acts when the call returns (one retry is
                        // scheduled per call); a kernel-mode submission is a kernel call, which lands
                        // when the call returns.
                        let in_call = qs[i].busy_until > now;
                        let kernel_mode = plan.kernel_call > 0 && plan.groups[qs[i].group].kernel_mode;
                        if (in_call || kernel_mode || !qs[i].backlog.is_empty())
                            && let Some(d) = due.take()
                        {
                            qs[i].backlog.push_back(d);
                        }
                        if in_call {
                            continue;
                        }
                        if kernel_mode {
                            if qs[i].outstanding.len() < qs[i].cap && !qs[i].backlog.is_empty() {
                                qs[i].busy_until = now + plan.kernel_call;
                                push(&mut heap, now + plan.kernel_call, Ev::Enter(i));
                            }
                            continue;
                        }
                        // Submit from the backlog while the ring has room and the client is free.
                        while qs[i].outstanding.len() < qs[i].cap && !stopped && qs[i].busy_until <= now {
                            let Some((intended, size)) = due.take().or_else(|| qs[i].backlog.pop_front()) else {
                                break;
                            };
                            // Its kernel calls take time (when they do): a reconnect before the
                            // ring (which is heard after it), the notification after.
                            let call = plan.kernel_call;
                            let reconnects = if call > 0 { qs[i].q.as_ref().map_or(0, Queue::reconnects) } else { 0 };
                            let r = submit_one(plan, &mut qs, &clients, i, intended, size, &mut cb);
                            let mut ring_at = now;
                            qs[i].busy_until = now;
                            if call > 0 {
                                let reconnected = qs[i].q.as_ref().map_or(0, Queue::reconnects) - reconnects;
                                let notified = plan.system.notify_on_submit && r.is_some();
                                ring_at += reconnected * call;
                                qs[i].busy_until = ring_at + notified as u64 * call;
                            }
                            ring(&mut rang_since, &mut unheard, now, ring_at + latency, fw_of[i]);
                            let Some(signals) = r else { break };
                            if let Some(o) = observer.as_deref_mut() {
                                o.submitted(i, qs[i].outstanding.back().map_or(0, |c| c.0), now - t0);
                            }
                            if accepted(&sys, &clients, &mut qs[i], plan, &mut tally, &mut in_flight, signals)? {
                                stopped = true;
                                stop_time = now;
                            }
                        }
                        // Not submitted (the ring is full): it heads the backlog.
                        if let Some(d) = due {
                            qs[i].backlog.push_back(d);
                        }
                        if qs[i].busy_until > now {
                            push(&mut heap, qs[i].busy_until, Ev::Drain(i));
                        }
                    }
                    Ev::Enter(i) => {
                        if stopped || qs[i].outstanding.len() >= qs[i].cap {
                            continue;
                        }
                        let Some((intended, size)) = qs[i].backlog.pop_front() else { continue };
                        let r = submit_one(plan, &mut qs, &clients, i, intended, size, &mut cb);
                        ring(&mut rang_since, &mut unheard, now, now + latency, fw_of[i]);
                        let Some(signals) = r else { continue };
                        if let Some(o) = observer.as_deref_mut() {
                            o.submitted(i, qs[i].outstanding.back().map_or(0, |c| c.0), now - t0);
                        }
                        if accepted(&sys, &clients, &mut qs[i], plan, &mut tally, &mut in_flight, signals)? {
                            stopped = true;
                            stop_time = now;
                        }
                        if !stopped && !qs[i].backlog.is_empty() && qs[i].outstanding.len() < qs[i].cap {
                            // The next command buffer is the next call.
                            qs[i].busy_until = now + plan.kernel_call;
                            push(&mut heap, now + plan.kernel_call, Ev::Enter(i));
                        }
                    }
                    Ev::Timed(k) => {
                        if marks.len() < MAX_MARKS {
                            marks.push(scenario_mark(plan, &group_first, k, t - t0));
                        }
                        if let Some(o) = observer.as_deref_mut() {
                            let view = |i: usize| queue_view(&qs[i], &clients, t0);
                            let world = World { sys: &sys, queues: &view, len: qs.len(), group_first: &group_first };
                            o.scenario_event(t - t0, &plan.events[k].1, &world);
                        }
                        apply_event(
                            &sys,
                            plan,
                            &mut qs,
                            &mut clients,
                            &group_first,
                            k,
                            t,
                            &mut in_flight,
                            &mut |t, e| push(&mut heap, t, e),
                        )?
                    }
                    Ev::Resume(i) => {
                        if marks.len() < MAX_MARKS {
                            marks.push(Mark {
                                t: t - t0,
                                kind: "resume",
                                queue: Some(i),
                                text: "context resumed".into(),
                            });
                        }
                        let c = &clients[qs[i].client];
                        if c.alive {
                            let _ = sys.resume_context(c.port.process(), c.ctx.handle());
                        }
                    }
                }
            }
            if ran {
                // The world runs again at this instant, after what the clients did. Unless it
                // steps, that is all (no completion, no new event), and time moves on: the
                // usual instant of a loaded run is a ring latched while the engines run
                // earlier work.
                if run_world(&sys, now, &heap, &mut unheard, &mut rang_since) > 0 {
                    world_ran = true;
                    continue 'instants;
                }
                // The world waits for its busy engines (a quiet period). Until that ends, and
                // while nothing else of the runner's is due (a series bucket, the window's
                // end, a ring heard later), the next instant is the clients' next event, and
                // the world has nothing to do at it before they act: straight to it.
                if let Some(quiet) = sys.quiet_until()
                    && !stopped
                    && let Some(t) = heap.next_time()
                    && t < quiet.0
                    && t < next_bucket
                    && window_end.is_none_or(|w| t < w)
                    && unheard.front().is_none_or(|&(u, _)| u > t)
                {
                    sys.advance_to(Time(t));
                    now = t;
                    continue;
                }
            }
            break;
        }
        // Stop submitting at the end of the window.
        if !stopped && window_end.is_some_and(|w| now >= w) {
            stopped = true;
            stop_time = now;
        }
        debug_assert_eq!(in_flight == 0, qs.iter().all(|q| q.q.is_none() || q.outstanding.is_empty()));
        if stopped && (now >= stop_time.saturating_add(plan.drain) || in_flight == 0) {
            break;
        }
        // Progress, now and then.
        if progress_in > 0 {
            progress_in -= 1;
        } else {
            progress_in = PROGRESS_EVERY;
            let frac = match (window_end, plan.submissions) {
                (Some(w), _) => (now - t0) as f64 / (w - t0).max(1) as f64,
                (None, Some(n)) => tally.submitted as f64 / n as f64,
                _ => 0.0,
            }
            .min(1.0);
            if frac - last_progress >= 0.01 {
                last_progress = frac;
                progress(frac);
            }
        }
        // Next event of either side.
        let mut next = sys.next_event().map_or(u64::MAX, |t| t.0);
        if let Some(t) = heap.next_time() {
            next = next.min(t);
        }
        if let Some(&(t, _)) = unheard.front() {
            next = next.min(t);
        }
        if let Some(t) = observer.as_deref().and_then(Observer::wake_at) {
            next = next.min(t.saturating_add(t0).max(now + 1));
        }
        if let Some(w) = window_end
            && !stopped
        {
            next = next.min(w);
        }
        if stopped {
            next = next.min(stop_time.saturating_add(plan.drain));
        }
        if next == u64::MAX {
            if stopped {
                break;
            }
            // Nothing will ever happen again (every queue ended).
            stopped = true;
            stop_time = now;
            continue;
        }
        sys.advance_to(Time(next.max(now + 1)));
    }
    progress(1.0);
    let run_seconds = run_start.elapsed().as_secs_f64();
    let counts = counts.counts;
    for (i, s) in series.iter_mut().enumerate() {
        s.completions = counts.get(i).copied().unwrap_or(0);
    }
    // Completions past the last sample (the drain's tail) go to the last bucket.
    if let Some(s) = series.last_mut() {
        s.completions += counts.iter().skip(series_len_before(&counts, s.t, t0, bucket)).sum::<u64>();
    }
    // The run ends when the last event did: the clock, or a completion's modelled end.
    let end = sys.now().0.max(last_completion);
    let busy_end_ns = sys.with_gpu(|g| {
        (0..engines.len()).map(|e| g.engine_busy_ns(abi::EngineId(e as u32), Time(end)).unwrap_or(0)).collect()
    });
    // Lost work: whatever is still outstanding.
    for q in qs.iter_mut() {
        if !q.outstanding.is_empty() && q.res.ended.is_none() {
            // A queue the kernel reset (a hang, a fault) is lost, and says why; any other
            // queue's work just did not finish in the drain.
            q.res.ended = Some(match q.q.as_ref().and_then(lost_reason) {
                Some(why) => format!("lost: {why}"),
                None => "work outstanding at the end of the drain".into(),
            });
        }
        if let Some(queue) = &q.q {
            q.res.reconnects = queue.reconnects();
        }
    }
    // The kernel's notable events (within its trace window), beside the scenario's.
    let (trace, _) = sys.trace();
    for e in trace.iter().filter(|e| e.time.0 >= t0) {
        if let Some(n) = e.event.notable() {
            marks.push(Mark { t: e.time.0 - t0, kind: n.name(), queue: None, text: e.event.to_string() });
        }
    }
    marks.sort_by_key(|m| m.t);
    marks.truncate(MAX_MARKS);
    let stats = sys.stats();
    let fw = sys.with_gpu(|g| g.firmware_counts());
    let (preemptions, recoveries) = (fw.preempts_answered, fw.recoveries());
    let slot_changes: u64 = sys
        .with_gpu(|g| (0..engines.len()).map(|e| g.slot_occupancy(abi::EngineId(e as u32)).map_or(0, |s| s.1)).sum());
    let reconnect_rings: u64 = qs.iter().map(|q| q.res.reconnects).sum();
    let events = tally.submitted
        + reconnect_rings
        + packets
        + slot_changes
        + stats.interrupts
        + tally.fence_signals
        + completions_total;
    // Tear down quickly: abnormal termination skips waiting for anything.
    let mut queues_out = Vec::with_capacity(qs.len());
    for q in qs.iter_mut() {
        q.waits.clear();
        q.q = None;
        q.signal = None;
        q.upstream = None;
        queues_out.push(std::mem::take(&mut q.res));
    }
    for c in clients.iter() {
        if c.alive {
            c.port.terminate(Termination::Abnormal);
        }
    }
    drop(clients);
    if let Some(o) = observer {
        // Abnormal termination may leave the device work to finish (a queue's removal
        // answered): run the world until it has none, then look at what the kernel holds.
        for _ in 0..TEARDOWN_INSTANTS {
            run_world(&sys, sys.now().0, &Events::default(), &mut VecDeque::new(), &mut Vec::new());
            match sys.next_event() {
                Some(t) => sys.advance_to(Time(t.0.max(sys.now().0 + 1))),
                None => break,
            }
        }
        o.teardown(sys.now().0 - t0, &sys);
    }
    Ok(Outcome {
        name: plan.name.clone(),
        seed,
        queues: queues_out,
        latencies,
        latency_rows,
        latency_split,
        window_end: window_end.unwrap_or(if stop_time == u64::MAX { end } else { stop_time }) - t0,
        end: end - t0,
        samples: series,
        bucket,
        slots: plan.system.gpu.hw_slots,
        engines,
        interrupts: stats.interrupts,
        victimizations: stats.victimizations,
        connects: stats.connects,
        preemptions,
        recoveries,
        faults: stats.faults,
        events,
        packets,
        slot_changes,
        spans,
        traced_queues,
        busy_end_ns,
        marks,
        wall_seconds: wall.elapsed().as_secs_f64(),
        setup_seconds,
        run_seconds,
    })
}

/// Completions per bucket of the time series, by completion time (ns since the run's start).
struct Buckets {
    width: u64,
    counts: Vec<u64>,
    /// The bucket the last completion fell in, and its span `[from, to)`: completions come
    /// nearly in time order, so most land in it without a division.
    last: usize,
    from: u64,
    to: u64,
}

impl Buckets {
    fn new(width: u64) -> Buckets {
        Buckets { width, counts: Vec::new(), last: 0, from: 0, to: 0 }
    }

    fn add(&mut self, t: u64) {
        if !(self.from..self.to).contains(&t) {
            self.last = (t / self.width) as usize;
            self.from = self.last as u64 * self.width;
            self.to = self.from + self.width;
            if self.counts.len() <= self.last {
                self.counts.resize(self.last + 1, 0);
            }
        }
        self.counts[self.last] += 1;
    }

    /// The buckets double in width: each pair merges.
    fn double(&mut self) {
        self.counts = self.counts.chunks(2).map(|pair| pair.iter().sum()).collect();
        self.width *= 2;
        (self.from, self.to) = (0, 0);
    }
}

/// The index of the first bucket after the one starting at `t`.
fn series_len_before(_counts: &[u64], t: u64, t0: u64, bucket: u64) -> usize {
    ((t - t0) / bucket) as usize + 1
}

fn stopped_before(stop_time: u64, at: u64) -> bool {
    at > stop_time
}

/// What the clients submitted.
#[derive(Default)]
struct Tally {
    /// Command buffers (each rang its doorbell once, or made its kernel call).
    submitted: u64,
    /// Fence signals they carry.
    fence_signals: u64,
}

impl Tally {
    /// Counts a submission carrying `signals` fence signals; returns whether the scenario's
    /// submission count is reached.
    fn count(&mut self, signals: u64, plan: &Plan) -> bool {
        self.submitted += 1;
        self.fence_signals += signals;
        plan.submissions.is_some_and(|n| self.submitted >= n)
    }
}

/// After a submission the ring took on `q` ([`submit_one`]), with `signals` fence signals: a
/// CPU waiter starts waiting for the signal of what was submitted, it is in flight, and the
/// tally counts it. Returns whether the tally ends the run.
#[inline(always)]
fn accepted(
    sys: &System,
    clients: &[Client],
    q: &mut SimQ,
    plan: &Plan,
    tally: &mut Tally,
    in_flight: &mut u64,
    signals: u64,
) -> Result<bool, RunError> {
    if plan.groups[q.group].cpu_waiter {
        begin_wait(sys, clients, q)?;
    }
    *in_flight += 1;
    Ok(tally.count(signals, plan))
}

/// A ring made at `now` that the device hears at `at`: heard now (no doorbell latency, no
/// kernel call before it), it joins the rings the world looks at before time moves on;
/// otherwise it waits its turn in `unheard`. (While the clients act at an instant, nothing
/// heard by then waits in `unheard`: the world took those before the clients acted.)
#[inline]
fn ring(rang: &mut Vec<u64>, unheard: &mut VecDeque<(u64, u64)>, now: u64, at: u64, queue: u64) {
    debug_assert!(unheard.front().is_none_or(|&(t, _)| t > now), "a ring heard earlier still waits");
    if at <= now {
        rang.push(queue);
    } else {
        heard_in_order(unheard, at, queue);
    }
}

/// Runs the world at `now` ([`System::run_instant_after`]) after the device looked at the
/// doorbells it hears by then (the queues submitted to since it last looked: only those can
/// have rung), with the step horizon at the next moment a client acts (a ring heard, a client
/// event): a turn that a ring could cut into ends there, as it would on the live driver.
/// Returns the steps that did something.
#[inline(always)]
fn run_world(
    sys: &System,
    now: u64,
    events: &Events,
    unheard: &mut VecDeque<(u64, u64)>,
    rang: &mut Vec<u64>,
) -> usize {
    while let Some(&(t, queue)) = unheard.front()
        && t <= now
    {
        rang.push(queue);
        unheard.pop_front();
    }
    let next_ring = unheard.front().map_or(u64::MAX, |&(t, _)| t);
    let next_client = events.next_time().map_or(next_ring, |t| t.min(next_ring));
    sys.set_step_horizon((next_client != u64::MAX).then_some(abi::Time(next_client)));
    let steps = sys.run_instant_after(rang);
    rang.clear();
    steps
}

/// Queues a ring the device notices at `at`, after every ring it notices no later (rings of
/// one latency arrive in the order they were made; a ring after a reconnect call comes later).
fn heard_in_order(unheard: &mut VecDeque<(u64, u64)>, at: u64, queue: u64) {
    if unheard.back().is_none_or(|&(t, _)| t <= at) {
        unheard.push_back((at, queue));
    } else {
        let k = unheard.iter().rposition(|&(t, _)| t <= at).map_or(0, |k| k + 1);
        unheard.insert(k, (at, queue));
    }
}

/// Dwords of one command buffer of group `g` (the progress fence included).
fn cb_dwords(g: &crate::scenario::GroupPlan, signals: bool, waits: bool) -> usize {
    let mut n = 3; // PROGRESS_FENCE
    n += 6 * g.write_data as usize;
    n += if g.fill_bytes > 0 { 6 } else { 0 };
    n += if g.copy_bytes > 0 { 7 } else { 0 };
    n += if g.synthetic.is_some() { 3 } else { 0 };
    n += if signals { 5 } else { 0 };
    n += if waits { 5 } else { 0 };
    // A hang replaces nothing but adds a SYNTHETIC.
    n + 3
}

/// The command buffer last encoded, and for a plain one (see [`submit_one`]) its group and
/// synthetic duration.
#[derive(Default)]
struct Encoded {
    cb: CommandBuffer,
    key: Option<(usize, Option<u64>)>,
}

/// Submits one command buffer on queue `i`; returns the fence signals it carries, or `None`
/// if nothing was submitted: the queue is gone, or it refused the submission, which ends it
/// (lost, its process killed: its backlog goes).
fn submit_one(
    plan: &Plan,
    qs: &mut [SimQ],
    clients: &[Client],
    i: usize,
    intended: u64,
    size: Option<u64>,
    encoded: &mut Encoded,
) -> Option<u64> {
    match encode_and_submit(plan, qs, clients, i, intended, size, encoded) {
        Ok(r) => r,
        Err(e) => {
            let q = &mut qs[i];
            q.res.ended.get_or_insert_with(|| e.to_string());
            q.backlog.clear();
            None
        }
    }
}

/// [`submit_one`] until the queue refuses.
#[inline]
fn encode_and_submit(
    plan: &Plan,
    qs: &mut [SimQ],
    clients: &[Client],
    i: usize,
    intended: u64,
    size: Option<u64>,
    encoded: &mut Encoded,
) -> Result<Option<u64>, umd::UmdError> {
    let g = &plan.groups[qs[i].group];
    if qs[i].q.is_none() || !clients[qs[i].client].alive {
        return Ok(None);
    }
    let dur = match (size, g.synthetic) {
        (Some(ns), _) => Some(ns),
        (None, Some(d)) => Some(sample(&mut qs[i].rng, d)),
        (None, None) => None,
    };
    // A command buffer that names nothing of its queue (no scratch memory, fences or hang)
    // is the same for every queue of its group with the same synthetic duration: the last
    // one encoded is submitted again.
    let plain = g.write_data == 0
        && g.fill_bytes == 0
        && g.copy_bytes == 0
        && qs[i].upstream.is_none()
        && qs[i].signal.is_none()
        && !qs[i].hang_next;
    let key = plain.then_some((qs[i].group, dur));
    if key.is_some() && encoded.key == key {
        let np = 1 + dur.is_some() as u32;
        let q = qs[i].q.as_mut().expect("checked above");
        let v = published(q.submit(&encoded.cb), q, &mut qs[i].res.ended)?;
        qs[i].outstanding.push_back((v, intended, np));
        qs[i].res.submitted += 1;
        return Ok(Some(0));
    }
    encoded.key = None;
    let cb = &mut encoded.cb;
    cb.clear();
    let mut np = 1u32; // the progress fence
    if let Some((them, f)) = &qs[i].upstream {
        let v = qs[*them].q.as_ref().map_or(0, Queue::last_submitted);
        if v > 0 {
            cb.wait_fence(f, v);
            np += 1;
        }
    }
    if let Some(buf) = &clients[qs[i].client].scratch {
        let slot = buf.va() + 8 * (qs[i].index as u64 % (buf.len() / 8).max(1));
        for k in 0..g.write_data {
            cb.write_u32(slot, k.wrapping_add(qs[i].res.submitted as u32));
            np += 1;
        }
        let base = buf.va() + (buf.len() - g.fill_bytes - 2 * g.copy_bytes) / 8 * 8;
        let base = base.min(buf.va() + buf.len());
        if g.fill_bytes > 0 {
            cb.fill(base, g.fill_bytes, 0x5a5a_5a5a);
            np += 1;
        }
        if g.copy_bytes > 0 {
            let src = base + g.fill_bytes;
            cb.copy(src, src + g.copy_bytes, g.copy_bytes);
            np += 1;
        }
    }
    if let Some(ns) = dur {
        cb.synthetic(ns);
        np += 1;
    }
    if qs[i].hang_next {
        qs[i].hang_next = false;
        cb.synthetic(HUNG_NS);
        np += 1;
    }
    let mut signals = 0;
    let next_value = qs[i].q.as_ref().map_or(0, Queue::last_submitted) + 1;
    if let Some(f) = &qs[i].signal {
        cb.signal_fence(f, next_value);
        np += 1;
        signals += 1;
    }
    let q = qs[i].q.as_mut().expect("checked above");
    let v = published(q.submit(cb), q, &mut qs[i].res.ended)?;
    encoded.key = key;
    debug_assert_eq!(v, next_value);
    qs[i].outstanding.push_back((v, intended, np));
    qs[i].res.submitted += 1;
    Ok(Some(signals))
}

/// A submission's result, where a command buffer published but not rung
/// ([`umd::UmdError::NotRung`]: its doorbell's reconnect failed) counts as submitted — it runs
/// once the doorbell is connected and rung — and the client rings again at once
/// ([`Queue::ring`], which reconnects); should that fail too, `ended` says so (the published
/// work is still accounted, and the next submission tries again).
#[inline(always)]
fn published(r: Result<u64, umd::UmdError>, q: &mut Queue, ended: &mut Option<String>) -> Result<u64, umd::UmdError> {
    match r {
        Ok(v) => Ok(v),
        Err(e) => published_not_rung(e, q, ended),
    }
}

/// [`published`]'s error path, off the hot one.
#[cold]
#[inline(never)]
fn published_not_rung(e: umd::UmdError, q: &mut Queue, ended: &mut Option<String>) -> Result<u64, umd::UmdError> {
    let umd::UmdError::NotRung { value, .. } = e else { return Err(e) };
    if let Err(e) = q.ring() {
        ended.get_or_insert_with(|| format!("doorbell not reconnected after command buffer {value}: {e}"));
    }
    Ok(value)
}

/// The marker of scenario event `k`, applied at `t`.
fn scenario_mark(plan: &Plan, group_first: &[usize], k: usize, t: u64) -> Mark {
    let at = |group: usize, queue: u32| Some(group_first[group] + queue as usize);
    let name = |group: usize, queue: u32| format!("{}[{queue}]", plan.groups[group].name);
    match plan.events[k].1 {
        Action::Kill { group, queue } => {
            Mark { t, kind: "kill", queue: at(group, queue), text: format!("{}'s process killed", name(group, queue)) }
        }
        Action::Hang { group, queue } => Mark {
            t,
            kind: "hang",
            queue: at(group, queue),
            text: format!("{}'s next kernel never ends", name(group, queue)),
        },
        Action::D3 => Mark { t, kind: "d3 request", queue: None, text: "D3 requested".into() },
        Action::Suspend { group, queue, .. } => Mark {
            t,
            kind: "suspend",
            queue: at(group, queue),
            text: format!("{}'s context suspended", name(group, queue)),
        },
    }
}

#[allow(clippy::too_many_arguments)]
fn apply_event(
    sys: &System,
    plan: &Plan,
    qs: &mut [SimQ],
    clients: &mut [Client],
    group_first: &[usize],
    k: usize,
    t: u64,
    in_flight: &mut u64,
    push: &mut dyn FnMut(u64, Ev),
) -> Result<(), RunError> {
    match plan.events[k].1 {
        Action::Kill { group, queue } => {
            let i = group_first[group] + queue as usize;
            let c = qs[i].client;
            if clients[c].alive {
                clients[c].alive = false;
                clients[c].port.terminate(Termination::Abnormal);
                for q in qs.iter_mut().filter(|q| q.client == c) {
                    if !q.outstanding.is_empty() || !q.backlog.is_empty() {
                        q.res.ended.get_or_insert_with(|| "process killed".into());
                    }
                    if q.q.take().is_some() {
                        *in_flight -= q.outstanding.len() as u64;
                    }
                    q.backlog.clear();
                }
            }
        }
        Action::Hang { group, queue } => {
            let i = group_first[group] + queue as usize;
            qs[i].hang_next = true;
            // The hung kernel goes out with the queue's next submission; a queue that
            // submits only on completion gets one now.
            push(t, Ev::Submit(i, Some(0)));
        }
        Action::D3 => {
            // Refused when work is outstanding (the kernel says why): the run goes on.
            let _ = sys.enter_d3();
        }
        Action::Suspend { group, queue, for_ns } => {
            let i = group_first[group] + queue as usize;
            let c = &clients[qs[i].client];
            if c.alive {
                // A context already suspended by an earlier event stays so, until that event's
                // resume (a scenario may overlap two suspends of one context).
                match sys.suspend_context(c.port.process(), c.ctx.handle()) {
                    Err(abi::port::KernelError::InvalidArgument {
                        reason: abi::port::Invalid::AlreadySuspended,
                        ..
                    }) => return Ok(()),
                    r => r?,
                }
                if let Some(d) = for_ns {
                    push(t + d, Ev::Resume(i));
                }
            }
        }
    }
    Ok(())
}

/// Why the kernel reset or faulted queue `q`, if it did (`USERQ QUERY_STATUS` reports it
/// hung: it runs no more work, and what it had outstanding is lost).
pub(crate) fn lost_reason(q: &Queue) -> Option<String> {
    let s = q.status().ok()?;
    (s.flags & QUEUE_STATUS_HUNG != 0)
        .then(|| s.fault.map_or_else(|| "lost with its device".into(), |f| f.kind.to_string()))
}

/// Queue `q` as its client sees it (for an [`Observer`]).
fn queue_view<'a>(q: &'a SimQ, clients: &[Client], t0: u64) -> QueueView<'a> {
    let client = &clients[q.client];
    QueueView {
        group: q.group,
        index: q.index,
        process: client.port.process(),
        live: q.q.is_some() && client.alive,
        ended: q.res.ended.as_deref(),
        completed: q.q.as_ref().map(Queue::completed),
        last_submitted: q.q.as_ref().map_or(0, Queue::last_submitted),
        oldest_outstanding: q.outstanding.front().map(|&(v, t, _)| (v, t - t0)),
        outstanding: q.outstanding.len(),
        handle: q.q.as_ref().map(Queue::handle),
        queue: q.q.as_ref(),
    }
}

/// Starts a CPU wait for the fence signal of queue `q`'s last command buffer (none if the
/// signal already happened, or its device is lost).
fn begin_wait(sys: &System, clients: &[Client], q: &mut SimQ) -> Result<(), RunError> {
    let (Some(f), Some(queue)) = (&q.signal, &q.q) else { return Ok(()) };
    let v = queue.last_submitted();
    let pid = clients[q.client].port.process();
    match sys.begin_fence_wait(pid, &[(f.handle(), v)], abi::port::WaitMode::All) {
        Ok(Some(w)) => q.waits.push_back((v, w)),
        Ok(None) => {}
        // A device in error (an adapter reset lost it): its fences read as signalled, so the
        // waiter has nothing to wait for, and the run goes on.
        Err(abi::port::KernelError::DeviceLost { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

/// An exponential draw with this mean (ns).
fn exp_ns(rng: &mut ChaCha8Rng, mean: f64) -> u64 {
    let u: f64 = rng.random::<f64>();
    (-(1.0 - u).ln() * mean).round() as u64
}

/// A duration draw (ns).
fn sample(rng: &mut ChaCha8Rng, d: Dist) -> u64 {
    match d {
        Dist::Constant(v) => v,
        Dist::Uniform(lo, hi) => (lo + (hi - lo) * rng.random::<f64>()).round() as u64,
        Dist::Exponential(mean) => exp_ns(rng, mean),
        Dist::LogNormal(median, sigma) => {
            // Box-Muller for one standard normal.
            let u1: f64 = 1.0 - rng.random::<f64>();
            let u2: f64 = rng.random::<f64>();
            let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
            (median * (sigma * z).exp()).round().min(1e15) as u64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Buckets;

    /// The cached bucket gives what a division per completion gave, in and out of time order
    /// and across a doubling.
    #[test]
    fn buckets_count_as_a_division_would() {
        let times = [5, 9, 10, 31, 12, 0, 99, 40, 41, 10, 11];
        let mut b = Buckets::new(10);
        let mut want = vec![0u64; 10];
        for &t in &times {
            b.add(t);
            want[(t / 10) as usize] += 1;
        }
        assert_eq!(b.counts, want);
        b.double();
        let mut want: Vec<u64> = want.chunks(2).map(|p| p.iter().sum()).collect();
        for t in [19, 20, 150, 39] {
            b.add(t);
            let i = (t / 20) as usize;
            if want.len() <= i {
                want.resize(i + 1, 0);
            }
            want[i] += 1;
        }
        assert_eq!(b.counts, want);
    }
}
