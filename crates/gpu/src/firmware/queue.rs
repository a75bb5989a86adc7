//! A queue as the firmware keeps it (amdgpu: the MQD it was given): its configuration, where
//! it stands in its ring ([`Ring`]: the ring cursor, its protocol words and its pointers as
//! the firmware validated them, owned by execution), and what execution, the scheduler and
//! preemption keep of it between turns.
//!
//! Invariants: the firmware keeps its own copies of rptr and of the last wptr it validated
//! ([`Ring::refresh_wptr`]), so a client that scribbles over its rptr word cannot make the
//! engine re-run or skip work, and a wptr that moves backwards, is not dword aligned or runs
//! more than a ring ahead hangs the queue: `rptr <= wptr <= rptr + ring_bytes`.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use abi::queue::{FaultKind, FaultRecord};
use abi::slab::Key;
use abi::{EngineId, Priority, QueueState};
use shm::{Shm, Word};

use crate::Time;
use crate::compute::Dispatch;
use crate::memory::Vmid;

use super::cb_clock::CbClock;
use super::doorbells::Binding;
use super::preempt::{self, Preemption};
use super::ring::Place;

/// A queue in the firmware's table: its entry and the entry's generation (a key of the
/// workspace's generation-checked slab), so a removed queue's id never names its successor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FwQueueId(pub(super) Key);

impl FwQueueId {
    /// The id as one number (generation in the high half, entry in the low half), for tools
    /// that key their own tables by it.
    pub fn to_bits(self) -> u64 {
        (self.0.generation() as u64) << 32 | self.0.index() as u64
    }

    /// The id [`FwQueueId::to_bits`] gave (a stale one names nothing; lookups say so).
    pub fn from_bits(bits: u64) -> FwQueueId {
        FwQueueId(Key::from_parts(bits as u32, (bits >> 32) as u32))
    }
}

impl core::fmt::Display for FwQueueId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "fwq{}.g{}", self.0.index(), self.0.generation())
    }
}

/// What the kernel gives the firmware to add a queue (the engine-specific MQD).
#[derive(Clone)]
pub struct QueueConfig {
    /// Address space the queue runs in.
    pub vmid: Vmid,
    /// Engine.
    pub engine: EngineId,
    /// Ring GPU VA.
    pub ring_va: u64,
    /// Ring size (validated by the kernel: power of two ≥ 4 KiB).
    pub ring_bytes: u64,
    /// rptr word GPU VA.
    pub rptr_va: u64,
    /// wptr word GPU VA.
    pub wptr_va: u64,
    /// GPU VA of the queue's last-queued progress value (spec 000's
    /// `HwQueueProgressFenceLastQueuedValue`), which the firmware reads right after each wptr
    /// it validates: a `PROGRESS_FENCE` above it faults the queue
    /// ([`FaultKind::ProgressBeyondQueued`]). `None`: progress values are only checked to move
    /// forward.
    pub last_queued_va: Option<u64>,
    /// The queue's kernel page; `PROGRESS_FENCE` writes its completed value.
    pub kernel_page: abi::queue::KernelPageView<Word>,
    /// The queue's two fence logs, `[waits, signals]` (`DxgkDdiSetNativeFenceLogBuffer`);
    /// `None` for kernel-mode queues, which log nothing.
    pub fence_logs: Option<[Arc<Shm>; 2]>,
    /// The queue's context save area (kernel-owned, [`crate::compute::CONTEXT_SAVE_BYTES`]):
    /// where an interrupted `DISPATCH` keeps its state between slices.
    pub context_save: Arc<Shm>,
    /// A kernel queue: may select a vmid in `INDIRECT_BUFFER`.
    pub privileged: bool,
    /// Priority.
    pub priority: Priority,
}

/// An indirect buffer being executed.
#[derive(Clone, Copy, Debug)]
pub(super) struct IbCursor {
    pub(super) va: u64,
    pub(super) dwords: u32,
    pub(super) pos: u32,
    pub(super) vmid: Option<Vmid>,
}

/// Where a queue stands in its ring (amdgpu: the MQD's ring registers): the ring's memory and
/// the protocol words, rptr and wptr as the firmware validated them, the last-queued value
/// read with that wptr, and the indirect buffer being executed. Execution moves it; the
/// doorbell side and the kernel's no-loss checks read it.
pub(super) struct Ring {
    /// The ring's memory.
    pub(super) mem: Place,
    pub(super) rptr_word: Word,
    pub(super) wptr_word: Word,
    /// The client's last-queued word ([`QueueConfig::last_queued_va`]).
    pub(super) last_queued_word: Option<Word>,
    /// Its value as read right after the last wptr the firmware validated: the most a
    /// `PROGRESS_FENCE` in the work that wptr published may write.
    pub(super) queued: u64,
    pub(super) rptr: u64,
    pub(super) wptr: u64,
    pub(super) ib: Option<IbCursor>,
}

impl Ring {
    /// A ring at `start` (its rptr and wptr), its last-queued value read now.
    pub(super) fn new(
        mem: Place,
        rptr_word: Word,
        wptr_word: Word,
        last_queued_word: Option<Word>,
        start: u64,
    ) -> Ring {
        Ring {
            mem,
            rptr_word,
            wptr_word,
            queued: last_queued_word.as_ref().map_or(0, |w| w.get().load(Ordering::Acquire)),
            last_queued_word,
            rptr: start,
            wptr: start,
            ib: None,
        }
    }

    /// Reads and validates the client's wptr (`ring_bytes`: the ring's size).
    pub(super) fn refresh_wptr(&mut self, ring_bytes: u64) -> Result<(), FaultKind> {
        // Acquire: pairs with the client's release store of wptr, so the packets it covers are
        // visible before we fetch them.
        // The last-queued value is read with it, after it (spec 000: the client stores it
        // before it publishes wptr), so it covers every command buffer up to `new`.
        let (new, queued) = match &self.last_queued_word {
            Some(q) => {
                let (w, v) = abi::protocol::read_wptr_and_last_queued(&self.wptr_word, q);
                (w, Some(v))
            }
            None => (self.wptr_word.get().load(Ordering::Acquire), None),
        };
        if new == self.wptr {
            return Ok(());
        }
        if !new.is_multiple_of(4) {
            return Err(FaultKind::WptrMisaligned { wptr: new });
        }
        if new < self.wptr {
            return Err(FaultKind::WptrBackwards { old: self.wptr, new });
        }
        if new - self.rptr > ring_bytes {
            return Err(FaultKind::WptrPastRing { rptr: self.rptr, wptr: new, ring_bytes });
        }
        self.wptr = new;
        if let Some(v) = queued {
            self.queued = v;
        }
        Ok(())
    }

    /// Whether the client published work the engine has not fetched (a cheap acquire read,
    /// for rings of queues without a slot and the aggregated doorbell's poll).
    pub(super) fn wptr_moved(&self) -> bool {
        // Acquire: pairs with the client's release store of wptr (and the aggregated ring
        // after it), so the packets are visible once we run them.
        self.wptr_word.get().load(Ordering::Acquire) != self.wptr
    }

    /// Raw check for unconsumed work, without validation (used for the no-loss checks).
    pub(super) fn has_work(&self) -> bool {
        // The firmware half of the Dekker pair (`abi::protocol`): the kernel published the new
        // doorbell status before asking for this check, so either the client saw that status
        // or this re-read sees its wptr.
        let w = abi::protocol::recheck_wptr(&self.wptr_word);
        self.ib.is_some() || w != self.rptr
    }

    pub(super) fn publish_rptr(&self) {
        // Release: the client may reuse ring bytes below rptr once it sees it; our reads of
        // them happen before.
        self.rptr_word.get().store(self.rptr, Ordering::Release);
    }
}

/// What the scheduler keeps of a queue between passes (a [`super::schedule::Seat`] is what a
/// pass reads of it, with the queue's state): its place on the run list, when its quanta
/// started and when it last ran, and whether it waits for a slot or sleeps off one. The
/// scheduler's functions write it ([`super::schedule::Schedulable`]); besides, a turn stamps
/// `last_run`, a resume puts a queue blocked in a `WAIT` back to sleep, and a hang ends its
/// sleep.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct SchedState {
    /// When it last got a hardware slot (its quantum runs from here).
    pub(super) slice_start: Time,
    /// When it last executed.
    pub(super) last_run: Time,
    /// On its engine's run list (not suspended).
    pub(super) on_run_list: bool,
    /// Off its slot and asleep on that `WAIT` ([`super::schedule::unseat`]).
    pub(super) asleep: bool,
    /// When its address space got the slot it holds (the process quantum runs from here;
    /// see [`super::schedule::Seat::process_start`]).
    pub(super) process_start: Time,
    /// Its place in run-list order: stamped from [`super::Engine::next_seq`] each time it joins the
    /// run list, so among waiting queues that ran at the same time the earlier joiner goes
    /// first, as in a stable sort of the run list.
    pub(super) seq: u64,
    /// In its engine's waiting set ([`super::Engine::waiting`]), under its [`super::schedule::Seat`]'s class
    /// and turn. Kept equal to [`super::schedule::Seat::should_wait`] by [`super::schedule::sync_waiting`].
    pub(super) waiting: bool,
}

/// A queue in the firmware's table (see the module docs).
pub(super) struct FwQueue {
    pub(super) cfg: QueueConfig,
    /// Where it stands in its ring ([`Ring`]).
    pub(super) ring: Ring,
    pub(super) state: QueueState,
    pub(super) pending: bool,
    pub(super) monitored: u64,
    pub(super) completed: u64,
    pub(super) doorbell: Option<Binding>,
    pub(super) fault: Option<FaultRecord>,
    /// What the scheduler keeps of it ([`SchedState`]).
    pub(super) sched: SchedState,
    /// Device time it has spent executing its work in a hardware slot (ns, only grows): the
    /// turns that ran packets, instructions or chunks of its ring. A turn that only re-checked
    /// a `WAIT` that did not pass adds nothing, nor does time off a slot (waiting for one,
    /// preempted, suspended, its engine in F1). The kernel's hang timer reads it
    /// ([`super::Firmware::queue_run_ns`]) to tell a queue that runs without progress from one that
    /// waits.
    pub(super) run_ns: u64,
    /// A `DISPATCH` at rptr is part-way done: its state is in `live`, or in the context save
    /// area.
    pub(super) dispatch_active: bool,
    /// That dispatch's state while the queue holds its hardware slot. As on hardware, a mapped
    /// queue's waves stay on the engine between its turns; they reach the context save area
    /// only when the queue leaves its slot ([`FwQueue::spill`]: an eviction, a preemption, a
    /// reset that spares it). So a turn that ends, or is cut short for a higher-priority
    /// queue, saves and restores nothing.
    pub(super) live: Option<Box<Dispatch>>,
    /// A `COPY`/`FILL` at rptr is part-way done: this many bytes of it are (a chunk
    /// boundary, [`crate::cost::CostModel::bulk_chunk`]).
    pub(super) bulk_done: Option<u64>,
    /// When the engine first saw the logged `WAIT` it is blocked on (the log's observed time).
    pub(super) wait_observed: Option<Time>,
    /// Blocked in a `WAIT` on a native fence, as of this fence epoch: not re-checked until a
    /// fence changes.
    pub(super) parked: Option<u64>,
    /// Its preemption state: the request it owes an answer, where its state was saved
    /// ([`Preemption`]).
    pub(super) preempt: Preemption,
    /// It last completed a `PROGRESS_FENCE` (or nothing yet): it stands at the end of a
    /// command buffer, where `DmaBuffer` preemption stops.
    pub(super) at_cb_boundary: bool,
    /// Its last turn ended in a `WAIT` that did not pass.
    pub(super) blocked: bool,
    /// Its current command buffer's start and execution time, while completions are
    /// recorded.
    pub(super) cb: CbClock,
    /// The condition of the last `WAIT` it blocked on (what [`super::step::wake_sleepers`] checks
    /// while it sleeps off its slot).
    pub(super) wait_on: Option<WaitOn>,
    /// Loaded in this hardware slot of its engine ([`super::hardware`]): its execution state is the
    /// slot's until the slot answers a stop.
    pub(super) hw_slot: Option<u32>,
}

/// The condition a `WAIT` blocks on: the 64-bit word at `va` of address space `vmid` reaching
/// `value`.
#[derive(Clone, Copy, Debug)]
pub(super) struct WaitOn {
    pub(super) vmid: Vmid,
    pub(super) va: u64,
    pub(super) value: u64,
    /// The word is a native fence whose changes the device hears of (`FenceWaits::Park`): it
    /// can only have passed if the fence epoch moved.
    pub(super) park: bool,
}

impl FwQueue {
    /// Writes the state of a dispatch kept live in the queue's slot to its context save area:
    /// the queue is leaving its slot. Cannot fail for a queue [`super::Firmware::add_queue`] accepted
    /// (its save area holds [`crate::compute::CONTEXT_SAVE_BYTES`], the most any state takes);
    /// should it, the queue hangs with the fault and its dispatch is lost.
    pub(super) fn spill(&mut self) {
        if let Some(d) = self.live.take()
            && let Err(kind) = d.save(&self.cfg.context_save, 0)
        {
            preempt::hang(self, kind);
        }
    }
}
