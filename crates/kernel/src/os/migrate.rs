//! Memory migration (spec 001 "Memory Management"): "If there is a memory event that requires
//! buffer migration, the kernel driver will preempt the user queues, migrate buffers to where
//! they need to be, update the GPUVM page tables and invalidate the TLB, and then resume the
//! user queues."
//!
//! [`super::Os::migrate_allocation`] runs that order as a small state machine, because preemption is a
//! request with an answer:
//! 1. every live queue of the owning process is asked to preempt (each maps the buffer: one
//!    address space per process), `Cause::Migration` — a queue already off
//!    its slot answers at once;
//! 2. once every answer is in (or a queue that would not answer was reset by TDR and hung), the
//!    KMD moves the buffer and updates the page tables with a TLB invalidation
//!    ([`Kmd::migrate_allocation`]);
//! 3. every queue that was preempted for it is resumed, its engine woken first (unless its
//!    context is suspended or a request of the kernel's caller holds it:
//!    `Os::release_queue`).
//!
//! Work a client submits meanwhile is not lost: its queue is off the run list, its doorbell
//! stays connected and its rings are remembered, so the work runs after step 3. Freeing or
//! unmapping an allocation a queue uses is refused, as always.
//!
//! A move that fails leaves the OS unable to trust the buffer's page-table entries: it takes
//! the mapping out, and every queue whose ring, rptr, wptr or last-queued word lies in the
//! buffer reports `InvalidVa` (amdgpu's `AMDGPU_USERQ_STATE_INVALID_VA`) and is not
//! resumed; its waits and submissions end with `QueueLost`, its doorbell is disconnected with
//! `DisconnectedAbort`, and the UMD recreates it on new memory. Other queues of the process
//! resume.
//!
//! The migrations in progress are [`Migrations`]'; the sequence is the OS's
//! (`calls/migrate.rs`).

use abi::port::MemoryDomain;
use abi::{AllocationHandle, HwQueueHandle, ProcessId};

/// A migration waiting for its queues' answers.
pub(super) struct Migration {
    pub(super) pid: ProcessId,
    pub(super) allocation: AllocationHandle,
    pub(super) to: MemoryDomain,
    /// Queues preempted for it (resumed at the end).
    pub(super) queues: Vec<HwQueueHandle>,
    /// Those whose answer has not come yet (each once, in `queues`' order).
    pub(super) waiting: Vec<HwQueueHandle>,
}

/// The memory migrations in progress, in the order they started.
#[derive(Default)]
pub(super) struct Migrations {
    list: Vec<Migration>,
}

impl Migrations {
    /// Whether allocation `a` is being migrated.
    pub(super) fn moving(&self, a: AllocationHandle) -> bool {
        self.list.iter().any(|m| m.allocation == a)
    }

    /// A migration starts.
    pub(super) fn push(&mut self, m: Migration) {
        self.list.push(m);
    }

    /// Whether a migration in progress holds queue `q` off its engine (preempted for it and
    /// not resumed yet).
    pub(super) fn holds(&self, q: HwQueueHandle) -> bool {
        self.list.iter().any(|m| m.queues.contains(&q))
    }

    /// Queue `q` answered (or was recovered, or is gone): no migration waits for it.
    pub(super) fn answered(&mut self, q: HwQueueHandle) {
        for m in &mut self.list {
            m.waiting.retain(|&w| w != q);
        }
    }

    /// The migrations that wait for no answer any more (only `owing` queues still owe one),
    /// taken out in order.
    pub(super) fn take_ready(&mut self, owing: &[HwQueueHandle]) -> Vec<Migration> {
        for m in &mut self.list {
            m.waiting.retain(|q| owing.contains(q));
        }
        let (done, rest): (Vec<Migration>, Vec<Migration>) =
            std::mem::take(&mut self.list).into_iter().partition(|m| m.waiting.is_empty());
        self.list = rest;
        done
    }
}
