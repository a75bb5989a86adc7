//! The kernel-mode submission path: validation, software queues and the scheduler.
//!
//! Spec 000 keeps the traditional path beside user-mode submission: `D3DKMTSubmitCommand`
//! validates a command buffer (the same checks the engine would make, as typed errors before
//! anything runs) and queues it on its context's software queue; the scheduler moves
//! submissions onto the queue's kernel-owned ring, publishes wptr and rings the kernel
//! doorbell (`DxgkDdiSubmitCommand`). A `WAIT` on a native fence is resolved on the CPU (the
//! legacy, CPU-mediated path of spec 002): the submission stays back until the fence passes,
//! and the scheduler registers as a waiter so the fence's interrupt wakes it.
//!
//! **Fence IDs and resubmission** (spec 003, "Allow paging command fence IDs to be
//! reused"). Each buffer moved onto a ring gets a submission fence ID from its engine's
//! counter (`DxgkDdiSubmitCommand`'s `SubmissionFenceId`), and stays in its queue's in-flight
//! list until the engine's rptr passes it. When a kernel-mode queue answers a preemption the
//! OS asked for, the buffers it had not started are taken back out of the hardware queue
//! ([`Kmd::take_back`]) and resubmitted: those of a paging queue (the kernel's own copy work,
//! [`Os::set_paging_queue`]) with the **same** fence IDs, and moved before any other buffer
//! on that engine; every other one with a **new** fence ID. The buffer the queue stopped
//! inside is not resubmitted: it resumes from its saved state (a split DMA buffer), so no
//! packet that writes memory runs twice.
//!
//! Invariants: a submission is at most half the ring, so a write plan always exists; a
//! submission leaves its software queue only when its packets are on the ring and wptr is
//! published — or, should that invariant ever break, the queue is faulted with a typed
//! record rather than stalled. A queue's in-flight buffers are contiguous on its ring, in
//! submission order, ending at its wptr.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use abi::packet::Packet;
use abi::port::{Invalid, KernelError};
use abi::queue::{Access, FaultKind, FaultRecord};
use abi::ring;
use abi::{ContextHandle, EngineId, HwQueueHandle, ProcessId, Time};

use super::fence::FenceWait;
use super::queues::QueueMode;
use super::{Os, SchedulerPass, invalid};
use crate::ddi::Kmd;
use crate::trace::Event;

/// Size of a kernel-mode queue's kernel-owned ring.
pub const KERNEL_RING_BYTES: u64 = 64 * 1024;

/// A validated command buffer on a context's software queue.
pub(super) struct KmSubmission {
    pub(super) queue: HwQueueHandle,
    words: Vec<u32>,
    /// The submission's `WAIT`s on native fences: the scheduler holds it back until they pass.
    waits: Vec<(abi::NativeFenceHandle, u64)>,
    /// The scheduler's registration on those fences while it waits.
    pending: Option<Arc<FenceWait>>,
    /// A paging buffer (the kernel's own copy work): moved before any non-paging buffer on
    /// its engine.
    paging: bool,
    /// The fence ID it keeps (a resubmitted paging buffer); `None`: a new one when it moves.
    fence_id: Option<u64>,
}

/// A kernel-mode buffer on its queue's ring, not yet known complete.
pub(super) struct InFlight {
    /// Its submission fence ID.
    fence_id: u64,
    /// A paging buffer.
    paging: bool,
    /// Where it lies on the ring (byte offsets, like rptr and wptr).
    start: u64,
    end: u64,
    /// Its packets, for a resubmission.
    words: Vec<u32>,
}

/// What one kernel-mode scheduling attempt did.
enum Move {
    Moved,
    NoSpace,
    /// Held back until a fence passes; the fence's interrupt wakes the scheduler.
    FenceWait,
    Empty,
}

impl Os {
    /// Validates a kernel-mode submission; returns its last progress value and its `WAIT`s on
    /// the process's native fences (`fences`: each fence's VA and handle).
    fn validate_packets(
        &self,
        pid: ProcessId,
        words: &[u32],
        last: u64,
        fences: &[(u64, abi::NativeFenceHandle)],
    ) -> Result<(u64, Vec<(abi::NativeFenceHandle, u64)>), KernelError> {
        let mut waits = Vec::new();
        let mut signalled: Vec<(u64, u64)> = Vec::new();
        let packets =
            abi::packet::decode_stream(words).map_err(|(offset, error)| KernelError::BadPacket { offset, error })?;
        let mut progress = last;
        for p in packets {
            // The same checks the engine would make, as typed errors before anything runs.
            let r = |field, va, bytes, align| self.check_access(pid, field, va, bytes, Access::Read, align);
            let w = |field, va, bytes, align| self.check_access(pid, field, va, bytes, Access::Write, align);
            match p {
                Packet::Nop { .. } | Packet::Interrupt { .. } | Packet::Synthetic { .. } => {}
                Packet::WriteData { width, va, .. } => w("WRITE_DATA.va", va, width.bytes(), width.bytes())?,
                Packet::Copy { src, dst, bytes } => {
                    r("COPY.src", src, bytes, 1)?;
                    w("COPY.dst", dst, bytes, 1)?;
                }
                Packet::Fill { dst, bytes, .. } => w("FILL.dst", dst, bytes, 1)?,
                Packet::Timestamp { va } => w("TIMESTAMP.va", va, 8, 8)?,
                Packet::Signal { va, value } => {
                    w("SIGNAL.va", va, 8, 8)?;
                    signalled.push((va, value));
                }
                Packet::Logged { .. } => {
                    return Err(invalid("SIGNAL/WAIT log flag", "set", Invalid::LogFlagOnKernelQueue));
                }
                Packet::SignalFence { va, value } => {
                    signalled.push((va, value));
                    w("SIGNAL.va", va, 8, 8)?;
                    if !fences.iter().any(|&(fva, _)| fva == va) {
                        return Err(invalid("SIGNAL.va", format!("{va:#x}"), Invalid::NotANativeFence));
                    }
                }
                Packet::Wait { va, value } => {
                    r("WAIT.va", va, 8, 8)?;
                    // Held back on the CPU unless this submission signals it first (holding
                    // it would then wait for itself).
                    let covered = signalled.iter().any(|&(sva, sv)| sva == va && sv >= value);
                    if let Some(&(_, h)) = fences.iter().find(|&&(fva, _)| fva == va)
                        && !covered
                    {
                        waits.push((h, value));
                    }
                }
                Packet::IndirectBuffer { va, dwords, vmid: v } => {
                    if v != 0 {
                        return Err(invalid("INDIRECT_BUFFER.vmid", v, Invalid::MustBeZero));
                    }
                    r("INDIRECT_BUFFER.va", va, dwords as u64 * 4, 4)?;
                }
                Packet::Dispatch { program, grid, group, args } => {
                    abi::isa::check_dims(grid, group).map_err(|why| {
                        invalid("DISPATCH.grid/group", format!("{grid:?}/{group:?}"), Invalid::Dims(why))
                    })?;
                    r("DISPATCH.program", program, abi::isa::PROGRAM_HEADER_BYTES, 8)?;
                    r("DISPATCH.args", args, 8, 8)?;
                }
                Packet::ProgressFence { value } => {
                    if value <= progress {
                        return Err(KernelError::NotIncreasing {
                            field: "PROGRESS_FENCE.value",
                            value,
                            last: progress,
                        });
                    }
                    progress = value;
                }
            }
        }
        Ok((progress, waits))
    }

    /// `D3DKMTSubmitCommand`: validates and queues on the context's software queue.
    pub fn submit_command(&mut self, pid: ProcessId, q: HwQueueHandle, words: &[u32]) -> Result<(), KernelError> {
        self.adapter_alive()?;
        let p = self.proc(pid)?;
        let qo = p.queues.get(q)?;
        qo.live(q)?;
        let (ctx, last, paging) = match &qo.mode {
            QueueMode::Kernel(k) => (qo.context, k.last_queued, k.paging),
            QueueMode::User { .. } => {
                return Err(KernelError::WrongQueueMode { queue: q, actual: "user-mode", expected: "kernel-mode" });
            }
        };
        if words.is_empty() || words.len() as u64 * 4 > KERNEL_RING_BYTES / 2 {
            return Err(invalid("words", words.len(), Invalid::SubmissionSize { max_dwords: KERNEL_RING_BYTES / 8 }));
        }
        let fences: Vec<(u64, abi::NativeFenceHandle)> = p.fences.iter().map(|(h, f)| (f.va, h)).collect();
        let (progress, waits) = self.validate_packets(pid, words, last, &fences)?;
        let p = self.proc(pid)?;
        if let QueueMode::Kernel(k) = &mut p.queues.get_mut(q)?.mode {
            k.last_queued = progress;
            k.control.last_queued().store(progress, Ordering::Release);
        }
        p.contexts.get_mut(ctx)?.software_queue.push_back(KmSubmission {
            queue: q,
            words: words.to_vec(),
            waits,
            pending: None,
            paging,
            fence_id: None,
        });
        self.km_queued += 1;
        self.stats.km_submissions += 1;
        self.kick_scheduler();
        Ok(())
    }

    /// Makes kernel-mode queue `q` the kernel's paging queue: its buffers are paging buffers
    /// (the copy work of eviction and migration), which a preemption resubmits with their own
    /// fence IDs, first on their engine (spec 003). Only before its first submission.
    pub fn set_paging_queue(&mut self, pid: ProcessId, q: HwQueueHandle) -> Result<(), KernelError> {
        let p = self.proc(pid)?;
        let qo = p.queues.get_mut(q)?;
        qo.live(q)?;
        match &mut qo.mode {
            QueueMode::Kernel(k) if k.wptr == 0 && k.inflight.is_empty() => {
                k.paging = true;
                Ok(())
            }
            QueueMode::Kernel(_) => {
                Err(invalid("queue", q, Invalid::Unsupported("a paging queue is chosen before its first submission")))
            }
            QueueMode::User { .. } => {
                Err(KernelError::WrongQueueMode { queue: q, actual: "user-mode", expected: "kernel-mode" })
            }
        }
    }

    /// Runs the kernel-mode scheduler once: moves software-queue submissions onto kernel
    /// rings, paging buffers first (spec 003: resubmitted paging buffers run "before any
    /// other commands on that engine"). Returns what it did, and the work generation it saw.
    pub fn run_scheduler(&mut self, now: Time) -> SchedulerPass {
        self.at(now);
        let (mut moved, mut ring_full) = (false, false);
        if self.km_queued > 0 {
            let contexts: Vec<(ProcessId, ContextHandle)> = self
                .processes
                .iter()
                .flat_map(|(&pid, p)| p.contexts.handles().into_iter().map(move |c| (pid, c)))
                .collect();
            // Engines where a paging buffer could not move: nothing else moves there yet.
            let mut held: Vec<EngineId> = Vec::new();
            for paging_pass in [true, false] {
                for &(pid, c) in &contexts {
                    while let Some((engine, paging)) = self.head(pid, c) {
                        if paging != paging_pass || (!paging && held.contains(&engine)) {
                            break;
                        }
                        match self.move_one(pid, c, now) {
                            Move::Moved => moved = true,
                            Move::NoSpace => {
                                ring_full = true;
                                if paging {
                                    held.push(engine);
                                }
                                break;
                            }
                            Move::FenceWait | Move::Empty => break,
                        }
                    }
                }
            }
        }
        SchedulerPass { moved, ring_full, generation: self.km_gen }
    }

    /// The engine of the submission at the head of a context's software queue, and whether
    /// it is a paging buffer.
    fn head(&self, pid: ProcessId, c: ContextHandle) -> Option<(EngineId, bool)> {
        let p = self.processes.get(&pid)?;
        let sub = p.contexts.get(c).ok()?.software_queue.front()?;
        Some((p.queues.get(sub.queue).ok()?.engine, sub.paging))
    }

    /// A kernel-mode queue answered a preemption the OS holds it for: the buffers it had not
    /// started leave its hardware queue and are resubmitted, paging ones with their fence
    /// IDs, the others with new ones (spec 003). The buffer it stopped inside stays: it
    /// resumes from its saved state.
    pub(super) fn take_back_unstarted(&mut self, pid: ProcessId, q: HwQueueHandle, now: Time) {
        // User-mode queues keep their rings: nothing to ask the device.
        if !self.queue(pid, q).is_ok_and(|qo| matches!(qo.mode, QueueMode::Kernel(_))) {
            return;
        }
        let Ok(pos) = self.ddi.held_position(q) else { return };
        let Some(p) = self.processes.get_mut(&pid) else { return };
        let Ok(qo) = p.queues.get_mut(q) else { return };
        let context = qo.context;
        let QueueMode::Kernel(k) = &mut qo.mode else { return };
        // Finished buffers first (the engine is past them).
        while k.inflight.front().is_some_and(|f| f.end <= pos.rptr) {
            k.inflight.pop_front();
        }
        let unstarted = |f: &InFlight| f.start > pos.rptr || (f.start == pos.rptr && !pos.started);
        let Some(first) = k.inflight.iter().position(unstarted) else { return };
        let to = k.inflight[first].start;
        // The ring's wptr word first (kernel-owned), then the engine: it never sees a word
        // above what it accepted.
        // Release: as any wptr publication.
        k.control.wptr().store(to, Ordering::Release);
        if let Err(e) = self.ddi.take_back(q, to, now) {
            // The engine keeps them: they run where they are, with the fence IDs they have.
            k.control.wptr().store(k.wptr, Ordering::Release);
            self.trace.push(now, Event::DriverBug { what: format!("take back of {q} to {to:#x} refused: {e}") });
            return;
        }
        k.wptr = to;
        let taken: Vec<InFlight> = k.inflight.drain(first..).collect();
        let ids = |paging: bool| taken.iter().filter(|f| f.paging == paging).map(|f| f.fence_id).collect();
        self.trace.push(now, Event::Unsubmitted { queue: q, paging: ids(true), other: ids(false) });
        let Ok(ctx) = p.contexts.get_mut(context) else { return };
        for f in taken.into_iter().rev() {
            ctx.software_queue.push_front(KmSubmission {
                queue: q,
                words: f.words,
                waits: Vec::new(),
                pending: None,
                paging: f.paging,
                // Paging buffers keep their fence IDs; the others get new ones.
                fence_id: f.paging.then_some(f.fence_id),
            });
            self.km_queued += 1;
        }
        self.kick_scheduler();
    }

    /// Holds the head of a context's software queue back while its native-fence `WAIT`s are
    /// unmet (registering the scheduler as their waiter); `true` if it may go.
    fn fence_waits_met(&mut self, pid: ProcessId, c: ContextHandle, now: Time) -> bool {
        let Some(p) = self.processes.get_mut(&pid) else { return false };
        let Ok(ctx) = p.contexts.get_mut(c) else { return false };
        let Some(sub) = ctx.software_queue.front_mut() else { return false };
        if sub.waits.is_empty() {
            return true;
        }
        let unmet: Vec<_> =
            sub.waits.iter().copied().filter(|&(h, v)| p.fences.get(h).is_ok_and(|f| f.current() < v)).collect();
        if !unmet.is_empty() {
            if sub.pending.as_ref().is_none_or(|w| self.waits.is_done(w.wait)) {
                let wait = FenceWait::for_scheduler(&mut self.waits, pid, unmet);
                sub.pending = Some(wait.clone());
                // Cannot fail: every fence in `unmet` was just found in the process's table.
                let _ = self.register_wait(pid, &wait, now);
            }
            return false;
        }
        let pending = sub.pending.take();
        sub.waits.clear();
        if let Some(w) = pending {
            self.forget_wait(pid, &w);
            // Met before its answer came: nobody will end it.
            self.waits.take(w.wait);
        }
        true
    }

    /// Moves the head of a context's software queue onto its queue's kernel-owned ring:
    /// wake the engine if it is in F1, write the packets, publish wptr, ring the doorbell.
    fn move_one(&mut self, pid: ProcessId, c: ContextHandle, now: Time) -> Move {
        // A kernel-mode submission in D3 wakes the device too.
        // A context that cannot be resumed stays on the list for the next wake-up.
        if self.d3 && self.power_up(now).is_ok() {
            let _ = self.resume_after_d3(now);
        }
        let Some(p) = self.processes.get(&pid) else { return Move::Empty };
        if p.contexts.get(c).map_or(true, |ctx| ctx.software_queue.is_empty()) {
            return Move::Empty;
        }
        // The legacy path: a WAIT on a native fence is resolved here, by the CPU.
        if !self.fence_waits_met(pid, c, now) {
            return Move::FenceWait;
        }
        let Some(p) = self.processes.get_mut(&pid) else { return Move::Empty };
        let Ok(ctx) = p.contexts.get_mut(c) else { return Move::Empty };
        let Some(sub) = ctx.software_queue.front() else { return Move::Empty };
        let qh = sub.queue;
        let Ok(qo) = p.queues.get_mut(qh) else { return Move::Empty };
        let engine = qo.engine;
        let QueueMode::Kernel(k) = &mut qo.mode else { return Move::Empty };
        // Acquire: the engine has finished reading the ring bytes below rptr.
        let rptr = k.control.rptr().load(Ordering::Acquire);
        while k.inflight.front().is_some_and(|f| f.end <= rptr) {
            k.inflight.pop_front();
        }
        let written = match ring::plan_write(k.wptr, KERNEL_RING_BYTES, sub.words.len() as u64) {
            // rptr is the engine's (kernel-owned memory); saturating all the same.
            Some(plan) if plan.new_wptr.saturating_sub(rptr) > KERNEL_RING_BYTES => return Move::NoSpace,
            Some(plan) => ring::write_stream(&k.ring, KERNEL_RING_BYTES, k.wptr, &plan, &[&sub.words])
                .map(|()| plan.new_wptr)
                .map_err(|_| "the kernel ring rejected a write inside its bounds"),
            None => Err("a submission of at most half the ring found no write plan"),
        };
        let new_wptr = match written {
            Ok(w) => w,
            Err(why) => {
                // A broken invariant of the kernel's own: never publish what was not written,
                // and never stall the context behind it. The queue faults, with the reason.
                let record = FaultRecord {
                    kind: FaultKind::BadField { field: "kernel ring", why },
                    rptr,
                    opcode: None,
                    in_indirect: false,
                };
                self.fault_queue(pid, qh, record, now);
                return Move::Moved;
            }
        };
        let start = k.wptr;
        k.wptr = new_wptr;
        // Release: the packets are visible before the firmware acquires wptr.
        k.control.wptr().store(new_wptr, Ordering::Release);
        let Some(sub) = ctx.software_queue.pop_front() else { return Move::Empty };
        self.km_queued -= 1;
        let fence_id = sub.fence_id.unwrap_or_else(|| {
            let next = self.km_fence_ids.entry(engine).or_insert(1);
            *next += 1;
            *next - 1
        });
        k.inflight.push_back(InFlight { fence_id, paging: sub.paging, start, end: new_wptr, words: sub.words });
        // DxgkDdiSubmitCommand, on an awake engine: the KMD rings the kernel doorbell.
        let rung = self.wake_engine(engine, now).and_then(|()| Ok(self.ddi.submit_command(qh, new_wptr, fence_id)?));
        if rung.is_err() {
            // The wptr is published, but nothing will ring for it: the queue faults, named.
            let record = FaultRecord {
                kind: FaultKind::BadField { field: "kernel doorbell", why: "the engine could not be woken or rung" },
                rptr,
                opcode: None,
                in_indirect: false,
            };
            self.fault_queue(pid, qh, record, now);
        }
        Move::Moved
    }
}
