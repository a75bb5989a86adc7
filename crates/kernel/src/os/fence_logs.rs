//! Native fence logs (spec 002 "Log buffer mechanism"): each user-mode queue's wait and
//! signal logs, which the engine writes, the client cannot see and the kernel reads — their
//! size ([`Fences::log_bytes`]: larger while the OS traces, "Log buffer overrun is
//! permitted"), and their recreation under a running queue without losing an entry.

use std::sync::Arc;

use abi::fence_log::FenceLogType;
use abi::port::{Invalid, KernelError};
use abi::{HwQueueHandle, ProcessId, Time};
use shm::Shm;

use super::fences::Fences;
use super::shared::{Shared, invalid};
use crate::ddi::Kmd;
use crate::trace::Event;

impl Fences {
    /// A fence log of `kind` in the process's private memory, of the size the OS gives logs
    /// now (`Fences::log_bytes`), whose next free position is `start`.
    pub(super) fn new_fence_log(
        &mut self,
        cx: &mut Shared,
        pid: ProcessId,
        kind: FenceLogType,
        start: u64,
    ) -> Result<Arc<Shm>, KernelError> {
        let bytes = self.log_bytes();
        let log = cx.proc(pid)?.memory.private.alloc(bytes as usize)?;
        abi::fence_log::init(&log, kind, start)?;
        Ok(log)
    }

    /// Turns fence-log tracing on or off. Spec 002 "Log buffer overrun is permitted": "when
    /// tracing is enabled, the OS first increases the size of the log buffer to prevent
    /// overruns in the first place" — so turning it on recreates every user-mode queue's two
    /// logs at [`TRACED_FENCE_LOG_BYTES`](super::fences::TRACED_FENCE_LOG_BYTES)
    /// ([`Fences::recreate_fence_log`]: nothing is lost), and new queues get logs of that
    /// size; turning it off gives them the spec's 4 KiB again.
    /// An overrun that still happens is flagged in the trace ([`Event::FenceLogOverrun`]).
    ///
    /// Every queue's logs are recreated on their own: one that fails (its old log unreadable,
    /// no memory for the new one, the DDI refused) keeps its working logs at the old size and
    /// costs no other queue its new ones; the first failure is returned once all were tried.
    pub(super) fn set_fence_log_tracing(&mut self, cx: &mut Shared, on: bool, now: Time) -> Result<(), KernelError> {
        if self.log_tracing == on {
            return Ok(());
        }
        self.log_tracing = on;
        cx.trace.push(now, Event::FenceLogTracing { on });
        let mut queues: Vec<HwQueueHandle> = cx
            .processes
            .values()
            .flat_map(|p| p.queues.iter().filter(|(_, q)| q.logs.is_some()).map(|(h, _)| h))
            .collect();
        queues.sort_unstable_by_key(|h| (h.owner(), h.index()));
        let mut first_failure = None;
        for q in queues {
            for kind in [FenceLogType::Wait, FenceLogType::Signal] {
                if let Err(e) = self.recreate_fence_log(cx, q.owner(), q, kind, now) {
                    first_failure.get_or_insert(e);
                }
            }
        }
        first_failure.map_or(Ok(()), Err)
    }

    /// Destroys and recreates a user-mode queue's fence log of `kind`, at the size the OS
    /// gives logs now (spec 002: "Dxgkrnl can destroy and recreate a log buffer. Each time it
    /// does, it calls DxgkDdiSetNativeFenceLogBuffer to inform KMD of the new location").
    /// Nothing written is lost, in this order:
    ///
    /// 1. the new log is made, its header starting at the old log's next free position (the
    ///    UMD's positions go on, whatever the new size: `abi::fence_log`);
    /// 2. `DxgkDdiSetNativeFenceLogBuffer`: from its return the engine writes the new log;
    /// 3. the old signal log is flushed (`DxgkDdiUpdateNativeFenceLogs`) and read to its end,
    ///    and the fences it names are settled, as an interrupt's read would;
    /// 4. the old log is dropped, and the new one is read from its start.
    ///
    /// A kernel-mode queue has no logs.
    pub(super) fn recreate_fence_log(
        &mut self,
        cx: &mut Shared,
        pid: ProcessId,
        q: HwQueueHandle,
        kind: FenceLogType,
        now: Time,
    ) -> Result<(), KernelError> {
        let old = cx.queue(pid, q)?.logs.as_ref().map(|l| l[kind as usize].clone());
        let old = old.ok_or_else(|| invalid("queue", q, Invalid::NoFenceLog))?;
        let start =
            abi::fence_log::header_total(&old).map_err(|reason| KernelError::CorruptLog { queue: q, reason })?;
        // 1.
        let log = self.new_fence_log(cx, pid, kind, start)?;
        let entries = abi::fence_log::entries_in(log.len() as u64);
        cx.trace.push(now, Event::FenceLogRecreated { queue: q, kind, entries });
        // 2.
        cx.ddi.set_native_fence_log_buffer(q, kind, log.clone())?;
        // 3. `read_signal_logs` reads the queue's log, which is still the old one.
        if kind == FenceLogType::Signal {
            self.drain_signal_log(cx, q, now);
        }
        // 4.
        let qo = cx.queue(pid, q)?;
        if let Some(logs) = &mut qo.logs {
            logs[kind as usize] = log;
        }
        if kind == FenceLogType::Signal {
            // The new log is read from its start. The live driver's engine may have written
            // the old log past `start` before step 2: step 3 read those positions there, and
            // in the new log they stay empty, the engine's next write landing past them
            // (`abi::fence_log::locate`). Reading on from the old log's end instead would
            // find the new header behind it until then, and scan for nothing.
            qo.signal_log_seen = start;
        }
        Ok(())
    }
}
