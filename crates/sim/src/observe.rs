//! Watching a run from inside: the hook the swarm's checkers and fault schedules use.
//!
//! [`crate::run::run_observed`] calls an [`Observer`] at seven points of the runner's loop
//! (`run::run` passes none, and pays one branch per instant for it):
//!
//! - [`Observer::completions`]: the device's completion records of an instant, each mapped to
//!   the runner's queue index, before the runner retires anything with them. A checker reads
//!   them as the device wrote them; a deliberately broken twin may alter them (drop one,
//!   repeat one), which is what a device that loses or repeats a completion looks like to
//!   everything above it.
//! - [`Observer::fence_signals`]: every native-fence signal the device executed in the
//!   instant ([`gpu::FenceSignal`]: the value, the MonitoredValue it was checked against,
//!   whether it raised the interrupt), recorded only for a run with an observer.
//! - [`Observer::submitted`]: a command buffer the queue accepted, with its progress value.
//! - [`Observer::cpu_wait`]: a CPU wait on a queue's signal fence, as its client began it and
//!   as it ended it, with the kernel's result and the fence's value at that moment.
//! - [`Observer::scenario_event`]: a scenario event (kill, hang, D3, suspend) as it is applied.
//! - [`Observer::instant`]: once per instant of the loop, after the world ran and the
//!   completions were retired, with a read-only [`World`] (every queue's state as its client
//!   sees it, the kernel through [`World::system`]), and the chance to act on the system
//!   (inject a DDI fault) before the clients' events of that instant run.
//! - [`Observer::teardown`]: after every client process ended and the world ran out of work:
//!   what the kernel still holds ([`kernel::System::census`]).
//!
//! Invariant: an observer that changes nothing (every checker) leaves the run byte-identical
//! to `run::run`'s; the world it sees is the one the outputs describe.

use std::collections::VecDeque;

use abi::port::{KernelError, QUEUE_STATUS_HUNG, WaitOutcome};
use abi::{HwQueueHandle, ProcessId};
use kernel::{FenceWaitHandle, System};

/// A completion record of the device, mapped to the runner's queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    /// The queue (global index, groups in scenario order).
    pub queue: usize,
    /// The progress value the device wrote.
    pub value: u64,
    /// The modelled end of the `PROGRESS_FENCE` packet (ns since the run's start).
    pub at: u64,
    /// When the command buffer it ends began executing (ns since the run's start).
    pub started: u64,
    /// Device time its packets executed (ns).
    pub execution: u64,
}

/// A CPU wait looked at ([`Observer::cpu_wait`]).
#[derive(Clone, Debug)]
pub struct WaitLook {
    /// The queue whose fence it waits on (global index).
    pub queue: usize,
    /// The fence value it waits for.
    pub value: u64,
    /// The fence's CurrentValue at the look (`None`: it could not be read).
    pub fence: Option<u64>,
    /// The kernel's result by then; `None` while it still waits.
    pub result: Option<Result<WaitOutcome, KernelError>>,
    /// The client ended it (otherwise it just began it).
    pub ended: bool,
}

/// What watches a run. Every method has an empty default.
pub trait Observer {
    /// The device's completion records of the instant `now` (ns since the run's start), in
    /// the order it wrote them.
    fn completions(&mut self, now: u64, records: &mut Vec<Record>) {
        let _ = (now, records);
    }
    /// The native-fence signals the device executed by the instant `now`, oldest first.
    fn fence_signals(&mut self, now: u64, signals: &[gpu::FenceSignal]) {
        let _ = (now, signals);
    }
    /// Queue `queue` accepted a command buffer at `now` whose progress value is `value`.
    fn submitted(&mut self, queue: usize, value: u64, now: u64) {
        let _ = (queue, value, now);
    }
    /// A CPU wait of a queue's client on the fence its command buffers signal, as the client
    /// began it and as it ended it (once it saw the command buffer complete). While it lasts,
    /// [`QueueView::waits`] shows it at every instant.
    fn cpu_wait(&mut self, now: u64, look: &WaitLook) {
        let _ = (now, look);
    }
    /// A scenario event, just before the runner applies it (the world as it was).
    fn scenario_event(&mut self, now: u64, action: &crate::scenario::Action, world: &World<'_>) {
        let _ = (now, action, world);
    }
    /// An instant of the run: the world after it ran and its completions were retired.
    fn instant(&mut self, now: u64, world: &World<'_>) {
        let _ = (now, world);
    }
    /// The run ended, every client process ended, and the world ran out of work.
    fn teardown(&mut self, now: u64, sys: &System) {
        let _ = (now, sys);
    }
    /// When the observer next wants an instant (ns since the run's start): the runner's clock
    /// stops there even if nothing else happens then.
    fn wake_at(&self) -> Option<u64> {
        None
    }
}

/// One queue as its client sees it.
#[derive(Clone)]
pub struct QueueView<'a> {
    /// Its group (scenario order).
    pub group: usize,
    /// Its index in the group.
    pub index: u32,
    /// Its client process.
    pub process: ProcessId,
    /// The queue exists and its process lives.
    pub live: bool,
    /// Why it ended, if it did (killed, lost, refused a submission).
    pub ended: Option<&'a str>,
    /// The progress value read from memory (its fence), while the queue exists.
    pub completed: Option<u64>,
    /// The progress value of its last accepted command buffer.
    pub last_submitted: u64,
    /// The oldest command buffer not yet retired: (progress value, intended submit time in
    /// ns since the run's start).
    pub oldest_outstanding: Option<(u64, u64)>,
    /// Command buffers not retired.
    pub outstanding: usize,
    /// Its handle in its process, while the queue exists.
    pub handle: Option<HwQueueHandle>,
    /// The queue itself, while it exists (for queries: `status`, `doorbell_status`; read only when needed).
    pub queue: Option<&'a umd::Queue>,
    /// The fence its command buffers signal (when a group waits on it or a CPU waiter does).
    pub signal: Option<&'a umd::NativeFence>,
    /// The CPU waits its client holds on that fence: (value, wait), oldest first.
    pub waits: &'a VecDeque<(u64, FenceWaitHandle)>,
}

impl QueueView<'_> {
    /// Whether the kernel reset or faulted it (`USERQ QUERY_STATUS` reports it hung): it runs
    /// no more work, and what it had outstanding is lost.
    pub fn lost(&self) -> Option<String> {
        lost_reason(self.queue?)
    }
}

/// Why the kernel reset or faulted queue `q`, if it did (`USERQ QUERY_STATUS` reports it
/// hung: it runs no more work, and what it had outstanding is lost).
pub(crate) fn lost_reason(q: &umd::Queue) -> Option<String> {
    let s = q.status().ok()?;
    (s.flags & QUEUE_STATUS_HUNG != 0)
        .then(|| s.fault.map_or_else(|| "lost with its device".into(), |f| f.kind.to_string()))
}

/// The run at an instant, read-only (see [`Observer::instant`]).
pub struct World<'a> {
    pub(crate) sys: &'a System,
    pub(crate) queues: &'a dyn Fn(usize) -> QueueView<'a>,
    pub(crate) len: usize,
    pub(crate) group_first: &'a [usize],
}

impl<'a> World<'a> {
    /// The kernel and device.
    pub fn system(&self) -> &'a System {
        self.sys
    }
    /// Queues in all.
    pub fn queue_count(&self) -> usize {
        self.len
    }
    /// Queue `i` (global index).
    pub fn queue(&self, i: usize) -> QueueView<'a> {
        (self.queues)(i)
    }
    /// The global index of queue `index` of group `group`.
    pub fn global(&self, group: usize, index: u32) -> usize {
        self.group_first[group] + index as usize
    }
}
