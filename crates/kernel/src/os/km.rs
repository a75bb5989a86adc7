//! The kernel-mode submission path ([`KmScheduler`]): validation, software queues, the
//! scheduler's ring writes, and resubmission after preemption.
//!
//! Spec 000 keeps the traditional path beside user-mode submission: `D3DKMTSubmitCommand`
//! validates a command buffer (the same checks the engine would make, as typed errors before
//! anything runs) and queues it on its context's software queue; the scheduler moves
//! submissions onto the queue's kernel-owned ring, publishes wptr and rings the kernel
//! doorbell (`DxgkDdiSubmitCommand`). A `WAIT` on a native fence is resolved on the CPU (the
//! legacy, CPU-mediated path of spec 002): the submission stays back until the fence passes,
//! and the scheduler registers as a waiter so the fence's interrupt wakes it. A context's
//! queues are streams of their own: each queue's submissions leave in order, and one held back
//! (by its fences, or a full ring) holds back only its queue, not the context's others.
//!
//! **Fence IDs and resubmission** (spec 003, "Allow paging command fence IDs to be
//! reused"). Each buffer moved onto a ring gets a submission fence ID from its engine's
//! counter (`DxgkDdiSubmitCommand`'s `SubmissionFenceId`), and stays in its queue's in-flight
//! list until the engine's rptr passes it. When a kernel-mode queue answers a preemption the
//! OS asked for, the buffers it had not started are taken back out of the hardware queue
//! ([`Kmd::take_back`]) and resubmitted: those of a paging queue (the kernel's own copy work,
//! [`super::Os::set_paging_queue`]) with the **same** fence IDs, and moved before any other buffer
//! on that engine; every other one with a **new** fence ID. The buffer the queue stopped
//! inside is not resubmitted: it resumes from its saved state (a split DMA buffer), so no
//! packet that writes memory runs twice.
//!
//! Invariants: a submission is at most half the ring, so a write plan always exists; a
//! submission leaves its software queue only when its packets are on the ring and wptr is
//! published — or, should that invariant ever break, the queue is faulted with a typed
//! record rather than stalled. A queue's in-flight buffers are contiguous on its ring, in
//! submission order, ending at its wptr.
//!
//! A scheduling pass crosses concerns (a submission in D3 wakes the device, a `WAIT` registers
//! on native fences, a broken ring faults its queue): it is the OS's
//! ([`super::Os::run_scheduler`]); this owns the software queues' count, the fence IDs and
//! the ring writes.

use std::sync::atomic::Ordering;

use abi::packet::Packet;
use abi::port::{Invalid, KernelError};
use abi::queue::{Access, FaultKind, FaultRecord};
use abi::ring;
use abi::slab::KeyMap;
use abi::{ContextHandle, EngineId, HwQueueHandle, ProcessId, Time};

use super::process::{InFlight, KmSubmission, QueueMode};
use super::shared::{Shared, invalid};
use crate::ddi::Kmd;
use crate::trace::Event;

/// Size of a kernel-mode queue's kernel-owned ring.
pub const KERNEL_RING_BYTES: u64 = 64 * 1024;

/// One pass of the kernel-mode scheduler.
#[derive(Clone, Copy, Debug)]
pub struct SchedulerPass {
    /// Submissions were moved onto kernel rings.
    pub moved: bool,
    /// Some waited for ring space (the engine frees it without telling anyone: poll soon).
    pub ring_full: bool,
    /// The work generation seen.
    pub generation: u64,
}

/// The kernel-mode scheduler's state: how many submissions wait on software queues, and each
/// engine's next submission fence ID.
#[derive(Default)]
pub(super) struct KmScheduler {
    /// Submissions on every context's software queue.
    pub(super) queued: usize,
    /// The next submission fence ID per engine for kernel-mode buffers (Windows'
    /// `SubmissionFenceId`).
    fence_ids: KeyMap<EngineId, u64>,
}

/// What writing the head of a software queue onto its ring did ([`KmScheduler::write_head`]).
pub(super) enum Written {
    /// On the ring, wptr published: the KMD is to ring the kernel doorbell for `wptr`.
    Moved { queue: HwQueueHandle, engine: EngineId, rptr: u64, wptr: u64, fence_id: u64 },
    /// The ring has no room for it yet.
    NoSpace,
    /// A broken invariant of the kernel's own: nothing published; the queue is to fault with
    /// `record`.
    Broken { queue: HwQueueHandle, record: FaultRecord },
    /// Nothing to move.
    Empty,
}

impl KmScheduler {
    /// Validates a kernel-mode submission; returns its last progress value and its `WAIT`s on
    /// the process's native fences (`fences`: each fence's VA and handle).
    pub(super) fn validate_packets(
        &self,
        cx: &Shared,
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
            let r = |field, va, bytes, align| cx.check_access(pid, field, va, bytes, Access::Read, align);
            let w = |field, va, bytes, align| cx.check_access(pid, field, va, bytes, Access::Write, align);
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
    pub(super) fn submit_command(
        &mut self,
        cx: &mut Shared,
        pid: ProcessId,
        q: HwQueueHandle,
        words: &[u32],
    ) -> Result<(), KernelError> {
        let p = cx.proc(pid)?;
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
        let (progress, waits) = self.validate_packets(cx, pid, words, last, &fences)?;
        let p = cx.proc(pid)?;
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
        self.queued += 1;
        cx.stats.km_submissions += 1;
        cx.kick_scheduler();
        Ok(())
    }

    /// Makes kernel-mode queue `q` the kernel's paging queue: its buffers are paging buffers
    /// (the copy work of eviction and migration), which a preemption resubmits with their own
    /// fence IDs, first on their engine (spec 003). Only before its first submission.
    pub(super) fn set_paging_queue(
        &mut self,
        cx: &mut Shared,
        pid: ProcessId,
        q: HwQueueHandle,
    ) -> Result<(), KernelError> {
        let p = cx.proc(pid)?;
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

    /// The next submission of a context's software queue whose queue is not `stalled`: its
    /// queue and engine, and whether it is a paging buffer. Each queue's submissions leave in
    /// order; a queue held back (its oldest waits on a fence, its ring is full) holds back
    /// only its own.
    pub(super) fn head(
        &self,
        cx: &Shared,
        pid: ProcessId,
        c: ContextHandle,
        stalled: &[HwQueueHandle],
    ) -> Option<(HwQueueHandle, EngineId, bool)> {
        let p = cx.processes.get(&pid)?;
        let sub = p.contexts.get(c).ok()?.software_queue.iter().find(|s| !stalled.contains(&s.queue))?;
        Some((sub.queue, p.queues.get(sub.queue).ok()?.engine, sub.paging))
    }

    /// A kernel-mode queue answered a preemption the OS holds it for: the buffers it had not
    /// started leave its hardware queue and are resubmitted, paging ones with their fence
    /// IDs, the others with new ones (spec 003). The buffer it stopped inside stays: it
    /// resumes from its saved state.
    pub(super) fn take_back_unstarted(&mut self, cx: &mut Shared, pid: ProcessId, q: HwQueueHandle, now: Time) {
        // User-mode queues keep their rings: nothing to ask the device.
        if !cx.queue(pid, q).is_ok_and(|qo| matches!(qo.mode, QueueMode::Kernel(_))) {
            return;
        }
        let Ok(pos) = cx.ddi.held_position(q) else { return };
        let Some(p) = cx.processes.get_mut(&pid) else { return };
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
        if let Err(e) = cx.ddi.take_back(q, to, now) {
            // The engine keeps them: they run where they are, with the fence IDs they have.
            k.control.wptr().store(k.wptr, Ordering::Release);
            cx.trace.push(now, Event::DriverBug { what: format!("take back of {q} to {to:#x} refused: {e}") });
            return;
        }
        k.wptr = to;
        let taken: Vec<InFlight> = k.inflight.drain(first..).collect();
        let ids = |paging: bool| taken.iter().filter(|f| f.paging == paging).map(|f| f.fence_id).collect();
        cx.trace.push(now, Event::Unsubmitted { queue: q, paging: ids(true), other: ids(false) });
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
            self.queued += 1;
        }
        cx.kick_scheduler();
    }

    /// Drops queue `q`'s pending kernel-mode submissions from its context's software queue
    /// (a hung queue can never run them).
    pub(super) fn drop_km_submissions(
        &mut self,
        cx: &mut Shared,
        pid: ProcessId,
        context: abi::ContextHandle,
        q: HwQueueHandle,
    ) {
        if let Ok(ctx) = cx.proc(pid).and_then(|p| p.contexts.get_mut(context)) {
            let before = ctx.software_queue.len();
            ctx.software_queue.retain(|s| s.queue != q);
            self.queued -= before - ctx.software_queue.len();
        }
    }

    /// Writes submission `at` of context `c`'s software queue (its queue's oldest, see
    /// [`KmScheduler::head`]) onto its queue's kernel-owned ring and publishes wptr; the submission leaves the software queue for the queue's in-flight
    /// list, with a fence ID (its own, for a resubmitted paging buffer).
    pub(super) fn write_head(&mut self, cx: &mut Shared, pid: ProcessId, c: ContextHandle, at: usize) -> Written {
        let Some(p) = cx.processes.get_mut(&pid) else { return Written::Empty };
        let Ok(ctx) = p.contexts.get_mut(c) else { return Written::Empty };
        let Some(sub) = ctx.software_queue.get(at) else { return Written::Empty };
        let queue = sub.queue;
        let Ok(qo) = p.queues.get_mut(queue) else { return Written::Empty };
        let engine = qo.engine;
        let QueueMode::Kernel(k) = &mut qo.mode else { return Written::Empty };
        // Acquire: the engine has finished reading the ring bytes below rptr.
        let rptr = k.control.rptr().load(Ordering::Acquire);
        while k.inflight.front().is_some_and(|f| f.end <= rptr) {
            k.inflight.pop_front();
        }
        let written = match ring::plan_write(k.wptr, KERNEL_RING_BYTES, sub.words.len() as u64) {
            // rptr is the engine's (kernel-owned memory); saturating all the same.
            Some(plan) if plan.new_wptr.saturating_sub(rptr) > KERNEL_RING_BYTES => return Written::NoSpace,
            Some(plan) => ring::write_stream(&k.ring, KERNEL_RING_BYTES, k.wptr, &plan, &[&sub.words])
                .map(|()| plan.new_wptr)
                .map_err(|_| "the kernel ring rejected a write inside its bounds"),
            None => Err("a submission of at most half the ring found no write plan"),
        };
        let wptr = match written {
            Ok(w) => w,
            Err(why) => {
                // Never publish what was not written, and never stall the context behind it.
                let record = FaultRecord {
                    kind: FaultKind::BadField { field: "kernel ring", why },
                    rptr,
                    opcode: None,
                    in_indirect: false,
                };
                return Written::Broken { queue, record };
            }
        };
        let start = k.wptr;
        k.wptr = wptr;
        // Release: the packets are visible before the firmware acquires wptr.
        k.control.wptr().store(wptr, Ordering::Release);
        let Some(sub) = ctx.software_queue.remove(at) else { return Written::Empty };
        self.queued -= 1;
        let fence_id = sub.fence_id.unwrap_or_else(|| {
            let next = self.fence_ids.entry(engine).or_insert(1);
            *next += 1;
            *next - 1
        });
        k.inflight.push_back(InFlight { fence_id, paging: sub.paging, start, end: wptr, words: sub.words });
        Written::Moved { queue, engine, rptr, wptr, fence_id }
    }
}
