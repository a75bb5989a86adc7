//! The runner's state, in the parts its steps share: [`Stack`] (the world it set up),
//! [`Clients`] (the client processes and their queues), [`Bells`] (rings on their way to the
//! device), [`Clock`] (the clients' events, the window, progress) and [`Acc`] (the outputs
//! being accumulated).
//!
//! Invariants: `Clients::in_flight` is the number of command buffers outstanding on queues
//! that still exist; a queue's `outstanding` never holds more than its `cap`; once
//! `Clock::stopped`, nothing more is submitted.

use std::collections::VecDeque;
use std::sync::Arc;

use abi::Time;
use abi::port::KernelPort;
use kernel::{ProcessPort, System};
use rand_chacha::ChaCha8Rng;
use umd::{CommandBuffer, Device, NativeFence, Queue};

use super::events::Events;
use super::outcome::{Mark, QueueResult, Sample, Span};
use crate::observe::{Observer, QueueView, Record, WaitLook, World};
use crate::rows::Rows;
use crate::scenario::Plan;

/// A run in progress: the scenario, its parts, and the observer watching it.
pub(super) struct Runner<'p, 'o> {
    pub(super) plan: &'p Plan,
    pub(super) seed: u64,
    pub(super) stack: Stack,
    pub(super) clients: Clients,
    pub(super) bells: Bells,
    pub(super) clock: Clock,
    pub(super) acc: Acc,
    pub(super) observer: Option<&'o mut dyn Observer>,
}

/// The world the runner set up: the system, and how its queues are named on the device.
/// Read-only once built.
pub(super) struct Stack {
    pub(super) sys: System,
    /// Engine names.
    pub(super) engines: Vec<String>,
    /// Each group's first queue (global index).
    pub(super) group_first: Vec<usize>,
    /// Device queue id -> our queue, by the id's table entry (the low half), checked against
    /// the whole id (a stale generation names nothing).
    pub(super) fw_map: Vec<Option<(u64, usize)>>,
    /// Each queue's device queue id.
    pub(super) fw_of: Vec<u64>,
    /// Queues the trace shows.
    pub(super) traced_queues: Vec<usize>,
    /// The clock when the loop began (ns): outputs count from it.
    pub(super) t0: u64,
    /// When submission stops, if the window is bounded by time (ns).
    pub(super) window_end: Option<u64>,
}

/// One client process.
pub(super) struct Client {
    pub(super) port: Arc<ProcessPort>,
    pub(super) dev: Device,
    pub(super) ctx: umd::Context,
    pub(super) scratch: Option<umd::Buffer>,
    pub(super) alive: bool,
}

/// One queue, as its client drives it.
pub(super) struct SimQ {
    pub(super) group: usize,
    pub(super) index: u32,
    pub(super) client: usize,
    pub(super) q: Option<Queue>,
    /// Command buffers submitted and not retired: (progress value, intended submit time,
    /// packets).
    pub(super) outstanding: VecDeque<(u64, u64, u32)>,
    /// Submissions waiting for ring space or for the client: (intended time, synthetic ns).
    pub(super) backlog: VecDeque<(u64, Option<u64>)>,
    /// The most command buffers outstanding at once.
    pub(super) cap: usize,
    pub(super) rng: ChaCha8Rng,
    /// The fence this queue signals with each command buffer's progress value (when a
    /// group depends on it), and the upstream fence it waits on (opened in its device).
    pub(super) signal: Option<NativeFence>,
    pub(super) upstream: Option<(usize, NativeFence)>,
    /// CPU waits started for this queue's fence signals (value, wait), oldest first.
    pub(super) waits: VecDeque<(u64, kernel::FenceWaitHandle)>,
    pub(super) hang_next: bool,
    /// Its client is inside a kernel call until then (ns): it submits nothing before.
    pub(super) busy_until: u64,
    pub(super) res: QueueResult,
    pub(super) traced: bool,
}

/// The clients: their processes and queues, and what they submitted.
pub(super) struct Clients {
    pub(super) procs: Vec<Client>,
    pub(super) qs: Vec<SimQ>,
    /// The command buffer last encoded.
    pub(super) cb: Encoded,
    pub(super) tally: Tally,
    /// Command buffers outstanding on queues that still exist (the drain ends when none are).
    pub(super) in_flight: u64,
}

/// What the clients submitted.
#[derive(Default)]
pub(super) struct Tally {
    /// Command buffers (each rang its doorbell once, or made its kernel call).
    pub(super) submitted: u64,
    /// Fence signals they carry.
    pub(super) fence_signals: u64,
}

impl Tally {
    /// Counts a submission carrying `signals` fence signals; returns whether the scenario's
    /// submission count is reached.
    pub(super) fn count(&mut self, signals: u64, plan: &Plan) -> bool {
        self.submitted += 1;
        self.fence_signals += signals;
        plan.submissions.is_some_and(|n| self.submitted >= n)
    }
}

/// The command buffer last encoded, and for a plain one (see `submit::submit_one`) its group
/// and synthetic duration.
#[derive(Default)]
pub(super) struct Encoded {
    pub(super) cb: CommandBuffer,
    pub(super) key: Option<(usize, Option<u64>)>,
}

/// Rings on their way to the device.
#[derive(Default)]
pub(super) struct Bells {
    /// Device ids of the queues submitted to since the world last ran (each rang its
    /// doorbell).
    pub(super) rang: Vec<u64>,
    /// Rings the device has not noticed yet: (when it notices, device queue id). The
    /// doorbell-to-fetch latency: the firmware looks at a rung doorbell that long after the
    /// client wrote it.
    pub(super) unheard: VecDeque<(u64, u64)>,
    /// That latency (ns).
    pub(super) latency: u64,
}

/// The loop's state: the clients' events, the submission window, progress.
pub(super) struct Clock {
    pub(super) events: Events,
    /// Submission stopped (at `stop_time`).
    pub(super) stopped: bool,
    pub(super) stop_time: u64,
    /// Whether the world ran at this instant after the clients' last events.
    pub(super) world_ran: bool,
    /// Instants until progress is worked out again.
    pub(super) progress_in: u32,
    pub(super) last_progress: f64,
}

impl Clock {
    /// Submission stops now.
    #[inline]
    pub(super) fn stop(&mut self, now: u64) {
        self.stopped = true;
        self.stop_time = now;
    }
}

/// The outputs being accumulated, and the buffers the loop reuses.
pub(super) struct Acc {
    /// Latencies (ns) per group.
    pub(super) latencies: Vec<Vec<u64>>,
    /// Spans of traced queues.
    pub(super) spans: Vec<Span>,
    pub(super) latency_rows: Rows<Span>,
    pub(super) latency_split: Vec<[u64; 3]>,
    pub(super) marks: Vec<Mark>,
    /// The time series.
    pub(super) series: Vec<Sample>,
    /// Completions per bucket, by completion time.
    pub(super) counts: Buckets,
    /// Bucket width (ns).
    pub(super) bucket: u64,
    /// When the series' next bucket opens.
    pub(super) next_bucket: u64,
    pub(super) packets: u64,
    pub(super) completions_total: u64,
    pub(super) last_completion: u64,
    /// The device's completion records of an instant, and those mapped to our queues.
    pub(super) comps: Vec<gpu::Completion>,
    pub(super) records: Vec<Record>,
    /// CPU waits the clients ended at an instant, for the observer (only while one watches).
    pub(super) wait_ends: Vec<WaitLook>,
    /// The device's native-fence signals of an instant, for the observer
    /// ([`crate::observe::Observer::fence_signals`]; recorded only where there is one).
    pub(super) signals: Vec<gpu::FenceSignal>,
}

/// Completions per bucket of the time series, by completion time (ns since the run's start).
pub(super) struct Buckets {
    width: u64,
    pub(super) counts: Vec<u64>,
    /// The bucket the last completion fell in, and its span `[from, to)`: completions come
    /// nearly in time order, so most land in it without a division.
    last: usize,
    from: u64,
    to: u64,
}

impl Buckets {
    pub(super) fn new(width: u64) -> Buckets {
        Buckets { width, counts: Vec::new(), last: 0, from: 0, to: 0 }
    }

    #[inline]
    pub(super) fn add(&mut self, t: u64) {
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
    pub(super) fn double(&mut self) {
        self.counts = self.counts.chunks(2).map(|pair| pair.iter().sum()).collect();
        self.width *= 2;
        (self.from, self.to) = (0, 0);
    }
}

/// Per engine: slots held now, and busy time up to `t` (a bucket's start, at or before now:
/// the clock jumps only over spans with no engine step, in which the engines run the tail of
/// what their last step started, so busy time up to `t` is exact).
pub(super) fn engine_state(sys: &System, engines: usize, t: u64) -> (Vec<usize>, Vec<u64>) {
    let now = Time(t);
    sys.with_gpu(|g| {
        (0..engines)
            .map(|e| {
                let id = abi::EngineId(e as u32);
                (g.slot_occupancy(id).map_or(0, |s| s.0), g.engine_busy_ns(id, now).unwrap_or(0))
            })
            .unzip()
    })
}

/// `f` with the world as an [`Observer`] sees it.
pub(super) fn with_world<R>(stack: &Stack, clients: &Clients, f: impl FnOnce(&World<'_>) -> R) -> R {
    let view = |i: usize| queue_view(&clients.qs[i], &clients.procs, stack.t0);
    let world = World { sys: &stack.sys, queues: &view, len: clients.qs.len(), group_first: &stack.group_first };
    f(&world)
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
        signal: q.signal.as_ref(),
        waits: &q.waits,
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
