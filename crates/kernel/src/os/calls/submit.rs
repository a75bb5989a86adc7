//! The kernel-mode path's calls (spec 000's `D3DKMTSubmitCommand` beside user-mode
//! submission; spec 003's resubmission): validation and software queues are the scheduler's
//! owner's ([`KmScheduler`](super::super::km::KmScheduler)); a scheduling pass is the OS's,
//! because moving a submission crosses concerns — in D3 it wakes the device, a `WAIT` on a
//! native fence registers the scheduler as the fence's waiter (the legacy, CPU-mediated path
//! of spec 002), and a ring that cannot take it faults its queue.

use abi::port::KernelError;
use abi::queue::{FaultKind, FaultRecord};
use abi::{ContextHandle, EngineId, HwQueueHandle, ProcessId, Time};

use super::super::Os;
use super::super::km::{SchedulerPass, Written};
use super::super::power::wake_engine;
use super::super::process::FenceWait;
use crate::ddi::Kmd;

/// What one kernel-mode scheduling attempt did.
enum Move {
    Moved,
    NoSpace,
    /// Held back until a fence passes; the fence's interrupt wakes the scheduler.
    FenceWait,
    Empty,
}

impl Os {
    /// `D3DKMTSubmitCommand`: validates and queues on the context's software queue.
    pub fn submit_command(&mut self, pid: ProcessId, q: HwQueueHandle, words: &[u32]) -> Result<(), KernelError> {
        self.recovery.adapter_alive()?;
        self.km.submit_command(&mut self.cx, pid, q, words)
    }

    /// Makes kernel-mode queue `q` the kernel's paging queue: its buffers are paging buffers
    /// (the copy work of eviction and migration), which a preemption resubmits with their own
    /// fence IDs, first on their engine (spec 003). Only before its first submission.
    pub fn set_paging_queue(&mut self, pid: ProcessId, q: HwQueueHandle) -> Result<(), KernelError> {
        self.km.set_paging_queue(&mut self.cx, pid, q)
    }

    /// Runs the kernel-mode scheduler once: moves software-queue submissions onto kernel
    /// rings, paging buffers first (spec 003: resubmitted paging buffers run "before any
    /// other commands on that engine"). Returns what it did, and the work generation it saw.
    pub fn run_scheduler(&mut self, now: Time) -> SchedulerPass {
        let (mut moved, mut ring_full) = (false, false);
        if self.km.queued > 0 {
            let contexts: Vec<(ProcessId, ContextHandle)> = self
                .cx
                .processes
                .iter()
                .flat_map(|(&pid, p)| p.contexts.handles().into_iter().map(move |c| (pid, c)))
                .collect();
            // Engines where a paging buffer could not move: nothing else moves there yet.
            let mut held: Vec<EngineId> = Vec::new();
            for paging_pass in [true, false] {
                for &(pid, c) in &contexts {
                    // A context's queues are streams of their own: one whose oldest
                    // submission waits on a fence, or finds its ring full, holds back only
                    // itself this pass, and the context's other queues go on.
                    let mut stalled: Vec<HwQueueHandle> = Vec::new();
                    while let Some((queue, engine, paging)) = self.km.head(&self.cx, pid, c, &stalled) {
                        if paging != paging_pass || (!paging && held.contains(&engine)) {
                            break;
                        }
                        match self.move_one(pid, c, queue, now) {
                            Move::Moved => moved = true,
                            Move::NoSpace if paging => {
                                ring_full = true;
                                held.push(engine);
                                break;
                            }
                            Move::NoSpace => {
                                ring_full = true;
                                stalled.push(queue);
                            }
                            // (Empty: its submissions went meanwhile, with its queue.)
                            Move::FenceWait | Move::Empty => stalled.push(queue),
                        }
                    }
                }
            }
        }
        SchedulerPass { moved, ring_full, generation: self.cx.km_gen }
    }

    /// Holds submission `at` of a context's software queue back while its native-fence
    /// `WAIT`s are unmet (registering the scheduler as their waiter); `true` if it may go.
    fn fence_waits_met(&mut self, pid: ProcessId, c: ContextHandle, at: usize, now: Time) -> bool {
        let Some(p) = self.cx.processes.get_mut(&pid) else { return false };
        let Ok(ctx) = p.contexts.get_mut(c) else { return false };
        let Some(sub) = ctx.software_queue.get_mut(at) else { return false };
        if sub.waits.is_empty() {
            return true;
        }
        let unmet: Vec<_> =
            sub.waits.iter().copied().filter(|&(h, v)| p.fences.get(h).is_ok_and(|f| f.current() < v)).collect();
        if !unmet.is_empty() {
            if sub.pending.as_ref().is_none_or(|w| self.cx.waits.is_done(w.wait)) {
                let wait = FenceWait::for_scheduler(&mut self.cx.waits, pid, unmet);
                sub.pending = Some(wait.clone());
                // Cannot fail: every fence in `unmet` was just found in the process's table.
                let _ = self.fences.register_wait(&mut self.cx, pid, &wait, now);
            }
            return false;
        }
        let pending = sub.pending.take();
        sub.waits.clear();
        if let Some(w) = pending {
            self.fences.forget_wait(&mut self.cx, pid, &w);
            // Met before its answer came: nobody will end it.
            self.cx.waits.take(w.wait);
        }
        true
    }

    /// Moves queue `queue`'s oldest submission on its context's software queue onto its
    /// kernel-owned ring: wake the device if it is in D3, wait for its fences, write the
    /// packets and publish wptr, then ring the doorbell on an awake engine.
    fn move_one(&mut self, pid: ProcessId, c: ContextHandle, queue: HwQueueHandle, now: Time) -> Move {
        // A kernel-mode submission in D3 wakes the device too.
        // A context that cannot be resumed stays on the list for the next wake-up.
        if self.power.d3 && self.power.power_up(&mut self.cx, now).is_ok() {
            let _ = self.resume_after_d3(now);
        }
        let Some(p) = self.cx.processes.get(&pid) else { return Move::Empty };
        let Some(at) = p.contexts.get(c).ok().and_then(|ctx| ctx.software_queue.iter().position(|s| s.queue == queue))
        else {
            return Move::Empty;
        };
        // The legacy path: a WAIT on a native fence is resolved here, by the CPU.
        if !self.fence_waits_met(pid, c, at, now) {
            return Move::FenceWait;
        }
        match self.km.write_head(&mut self.cx, pid, c, at) {
            Written::Empty => Move::Empty,
            Written::NoSpace => Move::NoSpace,
            Written::Broken { queue, record } => {
                // A broken invariant of the kernel's own: the queue faults, with the reason.
                self.fault_queue(pid, queue, record, now);
                Move::Moved
            }
            Written::Moved { queue, engine, rptr, wptr, fence_id } => {
                // DxgkDdiSubmitCommand, on an awake engine: the KMD rings the kernel doorbell.
                let rung = wake_engine(&mut self.cx, engine, now)
                    .and_then(|()| Ok(self.cx.ddi.submit_command(queue, wptr, fence_id)?));
                if rung.is_err() {
                    // The wptr is published, but nothing will ring for it: the queue faults, named.
                    let record = FaultRecord {
                        kind: FaultKind::BadField {
                            field: "kernel doorbell",
                            why: "the engine could not be woken or rung",
                        },
                        rptr,
                        opcode: None,
                        in_indirect: false,
                    };
                    self.fault_queue(pid, queue, record, now);
                }
                Move::Moved
            }
        }
    }
}
