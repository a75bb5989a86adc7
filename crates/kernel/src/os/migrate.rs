//! Memory migration (spec 001 "Memory Management"): "If there is a memory event that requires
//! buffer migration, the kernel driver will preempt the user queues, migrate buffers to where
//! they need to be, update the GPUVM page tables and invalidate the TLB, and then resume the
//! user queues."
//!
//! [`Os::migrate_allocation`] runs that order as a small state machine, because preemption is a
//! request with an answer:
//! 1. every live queue of the owning process is asked to preempt (each maps the buffer: one
//!    address space per process), [`Cause::Migration`](super::recovery) — a queue already off
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

use abi::port::{KernelError, MemoryDomain};
use abi::{AllocationHandle, HwQueueHandle, ProcessId, Time};

use super::{Os, Pin, QueueLife};
use crate::ddi::Kmd;
use crate::trace::Event;

/// A migration waiting for its queues' answers.
pub(crate) struct Migration {
    pid: ProcessId,
    allocation: AllocationHandle,
    to: MemoryDomain,
    /// Queues preempted for it (resumed at the end).
    queues: Vec<HwQueueHandle>,
    /// Those whose answer has not come yet (each once, in `queues`' order).
    waiting: Vec<HwQueueHandle>,
}

impl Os {
    /// Moves allocation `a` of process `pid` to `to`, in spec 001's order (module docs).
    /// Returns at once; the move completes when every queue of the process has answered its
    /// preemption request (at once for queues that can stop where they stand). Moving to the
    /// domain it is in changes nothing.
    pub fn migrate_allocation(
        &mut self,
        pid: ProcessId,
        a: AllocationHandle,
        to: MemoryDomain,
        now: Time,
    ) -> Result<(), KernelError> {
        self.at(now);
        self.adapter_alive()?;
        let obj = self.proc(pid)?.allocations.get(a)?;
        if obj.domain == to || self.migrations.iter().any(|m| m.allocation == a) {
            return Ok(());
        }
        self.trace.push(now, Event::MigrationStarted { allocation: a, to });
        let queues: Vec<HwQueueHandle> =
            self.proc(pid)?.queues.iter().filter(|(h, q)| q.live(*h).is_ok()).map(|(h, _)| h).collect();
        let mut waiting = Vec::new();
        for &q in &queues {
            if self.preempt_for_migration(pid, q, now).is_ok() {
                waiting.push(q);
            }
        }
        self.migrations.push(Migration { pid, allocation: a, to, queues, waiting });
        self.advance_migrations(now);
        Ok(())
    }

    /// Whether a migration in progress holds queue `q` off its engine (preempted for it and
    /// not resumed yet).
    pub(super) fn migration_holds(&self, q: HwQueueHandle) -> bool {
        self.migrations.iter().any(|m| m.queues.contains(&q))
    }

    /// A queue preempted for a migration answered (or was recovered, or is gone): migrations
    /// with no answer left complete.
    pub(super) fn migration_answered(&mut self, q: HwQueueHandle, now: Time) {
        for m in &mut self.migrations {
            m.waiting.retain(|&w| w != q);
        }
        self.advance_migrations(now);
    }

    /// Completes every migration whose queues have all answered (a queue that hung or went
    /// away answers nothing and is not waited for).
    pub(super) fn advance_migrations(&mut self, now: Time) {
        let pending = self.pending_preemptions();
        for m in &mut self.migrations {
            m.waiting.retain(|q| pending.contains(q));
        }
        let (done, rest): (Vec<Migration>, Vec<Migration>) =
            std::mem::take(&mut self.migrations).into_iter().partition(|m| m.waiting.is_empty());
        self.migrations = rest;
        for m in done {
            self.finish_migration(m, now);
        }
    }

    /// Steps 2 and 3.
    fn finish_migration(&mut self, m: Migration, now: Time) {
        self.at(now);
        let Ok(obj) = self.proc(m.pid).and_then(|p| p.allocations.get(m.allocation)) else { return };
        let (va, bytes) = (obj.va, obj.bytes);
        // 2. Move, update the page tables, invalidate.
        let moved = self.ddi.migrate_allocation(m.pid, va, bytes, m.to);
        let Ok(obj) = self.proc(m.pid).and_then(|p| p.allocations.get_mut(m.allocation)) else { return };
        match moved {
            Ok(()) => {
                obj.domain = m.to;
                obj.evicted = false;
                self.trace
                    .push(now, Event::Residency { allocation: m.allocation, resident: m.to == MemoryDomain::Local });
            }
            Err(e) => {
                obj.mapping = None;
                let users: Vec<HwQueueHandle> =
                    obj.pins.iter().filter_map(|p| if let Pin::Queue(q) = *p { Some(q) } else { None }).collect();
                self.trace.push(now, Event::MappingLost { allocation: m.allocation, va, error: e.to_string() });
                for q in users {
                    self.end_queue(m.pid, q, QueueLife::InvalidVa { va }, now);
                }
            }
        }
        // 3. Resume the queues it preempted (their engines may have slept meanwhile; a queue
        // held before, by its context or a request of its own, stays held).
        for q in m.queues {
            let _ = self.release_queue(m.pid, q, now);
        }
    }
}
