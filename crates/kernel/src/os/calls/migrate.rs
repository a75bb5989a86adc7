//! Memory migration's sequence (spec 001 "Memory Management"; see
//! [`migrate`](super::super::migrate)): the queues asked to preempt, the move once every
//! answer is in, then the queues resumed.

use abi::port::{KernelError, MemoryDomain};
use abi::{AllocationHandle, HwQueueHandle, ProcessId, Time};

use super::super::Os;
use super::super::migrate::Migration;
use super::super::process::{Pin, QueueLife};
use crate::ddi::Kmd;
use crate::trace::Event;

impl Os {
    /// Moves allocation `a` of process `pid` to `to`, in spec 001's order (see
    /// [`migrate`](super::super::migrate)). Returns at once; the move completes when every
    /// queue of the process has answered its preemption request (at once for queues that can
    /// stop where they stand). Moving to the domain it is in changes nothing.
    pub fn migrate_allocation(
        &mut self,
        pid: ProcessId,
        a: AllocationHandle,
        to: MemoryDomain,
        now: Time,
    ) -> Result<(), KernelError> {
        self.recovery.adapter_alive()?;
        let obj = self.proc(pid)?.allocations.get(a)?;
        if obj.domain == to || self.migrations.moving(a) {
            return Ok(());
        }
        self.cx.trace.push(now, Event::MigrationStarted { allocation: a, to });
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

    /// A queue preempted for a migration answered (or was recovered, or is gone): migrations
    /// with no answer left complete.
    pub(super) fn migration_answered(&mut self, q: HwQueueHandle, now: Time) {
        self.migrations.answered(q);
        self.advance_migrations(now);
    }

    /// Completes every migration whose queues have all answered (a queue that hung or went
    /// away answers nothing and is not waited for).
    pub(super) fn advance_migrations(&mut self, now: Time) {
        let owing = self.recovery.owing();
        for m in self.migrations.take_ready(&owing) {
            self.finish_migration(m, now);
        }
    }

    /// Steps 2 and 3.
    fn finish_migration(&mut self, m: Migration, now: Time) {
        let Ok(obj) = self.proc(m.pid).and_then(|p| p.allocations.get(m.allocation)) else { return };
        let (va, bytes) = (obj.va, obj.bytes);
        // 2. Move, update the page tables, invalidate.
        let moved = self.cx.ddi.migrate_allocation(m.pid, va, bytes, m.to);
        let Ok(obj) = self.proc(m.pid).and_then(|p| p.allocations.get_mut(m.allocation)) else { return };
        match moved {
            Ok(()) => {
                obj.domain = m.to;
                obj.evicted = false;
                self.cx
                    .trace
                    .push(now, Event::Residency { allocation: m.allocation, resident: m.to == MemoryDomain::Local });
            }
            Err(e) => {
                obj.mapping = None;
                let users: Vec<HwQueueHandle> =
                    obj.pins.iter().filter_map(|p| if let Pin::Queue(q) = *p { Some(q) } else { None }).collect();
                self.cx.trace.push(now, Event::MappingLost { allocation: m.allocation, va, error: e.to_string() });
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
