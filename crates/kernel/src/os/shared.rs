//! What every concern of the OS shares ([`Shared`]): the DDI, the trace, the process table,
//! the CPU waits, the outputs for the driver, the timer table and the counters.
//!
//! The concerns own their own state (`Fences`, `Doorbells`, `Power`, `KmScheduler`,
//! `Recovery`, `Migrations`) and take this as an argument: a concern's method changes its own
//! state and the shared parts, never another concern's. What crosses concerns — the interrupt
//! service, a TDR, D3, a connect — is a method of [`super::Os`] that calls the owners in
//! order.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering;

use abi::port::{Invalid, KernelError};
use abi::queue::Access;
use abi::{ContextHandle, HwQueueHandle, ProcessId};

use super::process::{Process, QueueLife, QueueMode, QueueObj};
use super::timers::TimerTable;
use super::waits::{WaitId, Waits};
use crate::ddi::{Kmd, Traced};
use crate::trace::SharedTrace;

/// What the OS asks its driver to do, outside the state machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// A CPU wait completed: wake its thread.
    WaitCompleted(WaitId),
    /// A cross-adapter fence was signalled here: propagate it to the other adapters.
    Propagate(u64),
    /// The kernel-mode scheduler may have new work (a submission, a fence it waits on).
    SchedulerWork,
}

/// Counters the benchmark and demo read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OsStats {
    /// Interrupts serviced.
    pub interrupts: u64,
    /// User interrupts.
    pub user_interrupts: u64,
    /// Queue faults.
    pub faults: u64,
    /// Kernel-mode submissions accepted.
    pub km_submissions: u64,
    /// Doorbell connects.
    pub connects: u64,
    /// F1 entries.
    pub f1_entries: u64,
    /// Doorbells victimized to connect another (limited pool).
    pub victimizations: u64,
    /// `NativeFenceSignaled` interrupts.
    pub fence_interrupts: u64,
    /// Optimized fence interrupts that fell back to scanning every fence (log overrun).
    pub fence_log_fallbacks: u64,
    /// `DxgkDdiUpdateMonitoredValues` calls (each carries a batch).
    pub monitored_updates: u64,
    /// MonitoredValues those calls carried.
    pub monitored_values: u64,
    /// Threads' CPU waits decided (reached, timed out by the kernel, failed), once each.
    pub waits_decided: u64,
}

/// The parts of the OS every concern shares.
pub(super) struct Shared {
    /// The KMD, behind the tracing decorator.
    pub(super) ddi: Traced,
    pub(super) trace: SharedTrace,
    /// Live processes, in id (creation) order: every pass over them — the hang timer's scan,
    /// recovery, D3 and F1 — goes in the same order in every run (a `HashMap`'s order follows
    /// a seed drawn per map, and made the simulator's runs differ: issue 25).
    pub(super) processes: BTreeMap<ProcessId, Process>,
    pub(super) next_pid: u32,
    pub(super) waits: Waits,
    pub(super) outputs: VecDeque<Output>,
    /// Bumped whenever the kernel-mode scheduler may have new work (a submission, a fence it
    /// waits on): its driver sleeps only if this has not changed since it last looked.
    pub(super) km_gen: u64,
    /// Every timer of the OS.
    pub(super) timers: TimerTable,
    pub(super) stats: OsStats,
    /// Rules broken on purpose ([`BrokenTwin`]): none in every real system.
    pub(super) broken: Vec<BrokenTwin>,
}

/// A rule of the spec the kernel breaks on purpose, so that a checker can show it catches the
/// break (the swarm's broken twins, issue 27; `sim::swarm::check::Inject`). Only
/// [`crate::System::break_deliberately`] sets one; nothing else in the kernel knows them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BrokenTwin {
    /// A queue that faulted or hung keeps its doorbell connected (spec 001: its doorbell must
    /// read `DisconnectedAbort`).
    HungQueueKeepsDoorbell,
    /// A CPU wait on a native fence wakes one value early: a fence one below the value waited
    /// for satisfies it (spec 002: a wait is satisfied when CurrentValue reaches its value).
    EarlyFenceWake,
}

impl Shared {
    pub(super) fn new(ddi: Traced, trace: SharedTrace) -> Shared {
        Shared {
            ddi,
            trace,
            processes: BTreeMap::new(),
            next_pid: 1,
            waits: Waits::default(),
            outputs: VecDeque::new(),
            km_gen: 0,
            timers: TimerTable::default(),
            stats: OsStats::default(),
            broken: Vec::new(),
        }
    }

    /// Whether rule `b` is broken on purpose ([`BrokenTwin`]).
    pub(super) fn breaks(&self, b: BrokenTwin) -> bool {
        self.broken.contains(&b)
    }

    /// Process `pid`, if it lives.
    pub(super) fn proc(&mut self, pid: ProcessId) -> Result<&mut Process, KernelError> {
        self.processes.get_mut(&pid).ok_or(KernelError::ProcessTerminated(pid))
    }

    /// Queue `q` of process `pid`.
    pub(super) fn queue(&mut self, pid: ProcessId, q: HwQueueHandle) -> Result<&mut QueueObj, KernelError> {
        self.proc(pid)?.queues.get_mut(q)
    }

    /// The queues of context `c` of `pid`.
    pub(super) fn context_queues(
        &mut self,
        pid: ProcessId,
        c: ContextHandle,
    ) -> Result<Vec<HwQueueHandle>, KernelError> {
        Ok(self.proc(pid)?.queues.iter().filter(|(_, q)| q.context == c).map(|(h, _)| h).collect())
    }

    /// Decides wait `id` (once; later decisions are ignored) and tells the driver.
    pub(super) fn complete_wait(&mut self, id: WaitId, r: Result<u64, KernelError>) {
        if self.waits.decide(id, r) {
            self.stats.waits_decided += 1;
            self.outputs.push_back(Output::WaitCompleted(id));
        }
    }

    /// Tells the driver the kernel-mode scheduler may have new work.
    pub(super) fn kick_scheduler(&mut self) {
        self.km_gen += 1;
        if !self.outputs.contains(&Output::SchedulerWork) {
            self.outputs.push_back(Output::SchedulerWork);
        }
    }

    /// Moves a queue to `life` and publishes it in its state word (what the client reads) —
    /// the one place a queue's state changes on the kernel's side.
    pub(super) fn set_state(&mut self, pid: ProcessId, q: HwQueueHandle, life: QueueLife) {
        if let Ok(qo) = self.queue(pid, q) {
            let word = life.published();
            qo.life = life;
            // Release: the fault record (or the mapping) is in place before the client sees
            // the state.
            qo.kernel_page.queue_state().get().store(word as u64, Ordering::Release);
        }
    }

    /// A queue's last-queued progress value: the kernel's own for a kernel-mode queue, the
    /// client's word for a user-mode one (reported, never trusted).
    pub(super) fn last_queued(&mut self, pid: ProcessId, q: HwQueueHandle) -> u64 {
        let Ok(p) = self.proc(pid) else { return 0 };
        let Ok(qo) = p.queues.get(q) else { return 0 };
        match &qo.mode {
            QueueMode::Kernel(k) => k.last_queued,
            // Acquire: pairs with the UMD's release store of the value.
            QueueMode::User { last_queued, .. } => last_queued.as_ref().map_or(0, |w| w.load(Ordering::Acquire)),
        }
    }

    /// Checks that the GPU could make `access` to `[va, va+bytes)`: aligned to `align`, inside
    /// one mapping of the process, writable for a write. Errors name `field` and the value.
    pub(super) fn check_access(
        &self,
        pid: ProcessId,
        field: &'static str,
        va: u64,
        bytes: u64,
        access: Access,
        align: u64,
    ) -> Result<(), KernelError> {
        if !va.is_multiple_of(align) {
            return Err(invalid(field, format!("{va:#x}"), Invalid::Misaligned { align }));
        }
        match self.ddi.vm_access(pid, va, bytes, access) {
            Ok(()) => Ok(()),
            Err(abi::queue::FaultKind::ReadOnly { .. }) => {
                Err(invalid(field, format!("{va:#x}"), Invalid::GpuReadOnly))
            }
            Err(_) => Err(KernelError::OutsideMappings { field, va, bytes }),
        }
    }
}

/// A typed refusal naming the field and its value.
pub(super) fn invalid(field: &'static str, value: impl ToString, reason: Invalid) -> KernelError {
    KernelError::InvalidArgument { field, value: value.to_string(), reason }
}
