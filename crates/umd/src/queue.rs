//! Hardware queues and the submission loop.
//!
//! A user-mode queue owns a ring allocation, a ring-control allocation
//! ([`abi::ring::RingControl`]: rptr, wptr, last-queued), its kernel page (read-only:
//! completed progress value, doorbell status) and its doorbell's CPU page. [`Queue::submit`]
//! is spec 000's submission loop, in its order:
//!
//! 1. Take the next progress-fence value N+1; the command buffer is followed by a
//!    `PROGRESS_FENCE` N+1.
//! 2. Write the last-queued value (`HwQueueProgressFenceLastQueuedValueCPUVirtualAddress`).
//! 3. Write the packets into the ring, then publish wptr with a release store.
//! 4. Ring the doorbell as the kernel said ([`abi::doorbell::RingMethod`]): store the new wptr
//!    into a dedicated doorbell, or set the queue's bit in the global doorbell. On a device
//!    whose engines miss unmapped queues' doorbells, also ring the engine's word of the
//!    aggregated doorbell (spec 001).
//! 5. Read the doorbell status: `Connected` → done; `ConnectedNotify` → `NotifyWorkSubmission`;
//!    `DisconnectedRetry` → connect again and go back to 4; `DisconnectedAbort` → the queue
//!    is lost.
//!
//! Between 4 and 5 sits a SeqCst fence ([`abi::protocol::ring_and_read_status`]). With the
//! kernel's SeqCst status store and the firmware's fenced wptr re-read on every unbind, it
//! makes a Dekker pair, model-checked with loom in `abi/tests/loom.rs`: if a disconnect
//! races the ring, either step 5 sees `DisconnectedRetry` (and reconnects, and the connect
//! re-reads wptr), or the firmware's re-read sees this wptr. No submission is lost.
//!
//! The whole loop is memory writes while the doorbell is connected: no kernel call.
//!
//! Each step is a piece of [`crate::lowlevel::UserQueue`] (creation, the ring's planned
//! writes, ring control, [`UserQueue::ring_doorbell`] for steps 3 to 5); this module adds the
//! loop's state — progress values, the ring's back-pressure, fence-log positions, reconnects.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::Duration;

use abi::packet::progress_fence_words;
use abi::port::{HwQueueDesc, QueueStatus, SubmissionMode, WaitOutcome};
use abi::{DoorbellStatus, EngineId, HwQueueHandle, Priority};

use crate::UmdError;
use crate::command::{CommandBuffer, GpuKick};
use crate::device::{Context, DoorbellChoice};
use crate::fence::NativeFence;
use crate::inner::DeviceInner;
use crate::lowlevel::{HwQueue, UserQueue};

/// Which submission model a queue uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubmissionKind {
    /// User-mode submission: ring + doorbell, no kernel call per submission.
    UserMode,
    /// Kernel-mode submission: every submission is a kernel call.
    KernelMode,
    /// User-mode where the engine supports it, kernel-mode otherwise (spec 001: "UMDs can
    /// query this information via the INFO IOCTL and determine whether to use kernel queues
    /// or user queues for each IP"). The queue's [`Queue::kind`] says which it got.
    Preferred,
}

/// How to create a queue.
#[derive(Clone, Copy, Debug)]
pub struct QueueOptions {
    /// Submission model.
    pub kind: SubmissionKind,
    /// Ring size in bytes (user-mode; a power of two, at least 4 KiB).
    pub ring_bytes: u64,
    /// Priority.
    pub priority: Priority,
    /// A user-mode queue whose doorbell reads `DisconnectedAbort` (the queue faulted, its
    /// device was lost, it was destroyed) falls back to a kernel-mode queue on the same
    /// context instead of failing the submission: spec 000's pseudocode ("destroy this
    /// HWQueue and re-create using traditional kernel mode submission"), the reason the
    /// kernel-mode path is kept beside user-mode submission. The submission that met the
    /// abort runs on the new queue; earlier ones the lost queue had not completed are lost
    /// with it (a wait for one reports the loss). A command buffer with logged fence
    /// operations cannot move (kernel-mode queues have no fence logs) and fails as before.
    pub fallback_to_kernel_mode: bool,
    /// A user-mode queue's doorbell: a page the application allocated and the index it wants
    /// there (spec 001, [`crate::DoorbellPage::doorbell`]). `None`: the kernel picks a free
    /// doorbell in the page it gave the process.
    pub doorbell: Option<DoorbellChoice>,
}

impl Default for QueueOptions {
    fn default() -> Self {
        QueueOptions {
            kind: SubmissionKind::UserMode,
            ring_bytes: 64 * 1024,
            priority: Priority::Normal,
            fallback_to_kernel_mode: false,
            doorbell: None,
        }
    }
}

impl QueueOptions {
    /// A user-mode queue with defaults.
    pub fn user_mode() -> Self {
        Self::default()
    }
    /// A kernel-mode queue with defaults.
    pub fn kernel_mode() -> Self {
        QueueOptions { kind: SubmissionKind::KernelMode, ..Self::default() }
    }
    /// A user-mode queue that falls back to a kernel-mode one on `DisconnectedAbort`
    /// ([`QueueOptions::fallback_to_kernel_mode`]).
    pub fn user_mode_with_fallback() -> Self {
        QueueOptions { fallback_to_kernel_mode: true, ..Self::default() }
    }
}

/// What a queue needs to fall back to kernel-mode submission: its context and priority.
struct Fallback {
    device: std::sync::Arc<DeviceInner>,
    context: abi::ContextHandle,
    priority: Priority,
}

/// Submissions lost with a user-mode queue that fell back: progress values in
/// `(completed, last]`, and why.
struct Abandoned {
    completed: u64,
    last: u64,
    queue: HwQueueHandle,
    reason: abi::port::LostReason,
}

/// A user-mode queue's pieces ([`UserQueue`]) and the loop's own state.
struct UserRing {
    q: UserQueue,
    /// Our wptr (we are its only writer).
    wptr: u64,
    /// The last rptr we read: re-read only when the ring looks full or `outstanding` is, so
    /// the submission hot path does not pull the engine's cache line every time.
    rptr_seen: u64,
    /// (progress value, wptr after it) of submissions the engine may not have read past yet,
    /// as of `rptr_seen` (pruned when rptr is read, so it holds at most a ring's worth, and it
    /// grows only when what the engine has not read fills it).
    outstanding: VecDeque<(u64, u64)>,
}

impl UserRing {
    /// Reads rptr and forgets the submissions the engine has read past: they can free no
    /// more ring space. Returns rptr.
    fn forget_read(&mut self) -> u64 {
        // Acquire: the engine is done reading bytes below rptr.
        let rptr = self.q.control().rptr().load(Ordering::Acquire);
        self.rptr_seen = rptr;
        while self.outstanding.front().is_some_and(|&(_, end)| end <= rptr) {
            self.outstanding.pop_front();
        }
        rptr
    }
}

/// Which submission model, with its objects.
enum Hw {
    Kernel(HwQueue),
    /// Boxed: the ring's views outweigh a kernel-mode queue several times over.
    User(Box<UserRing>),
}

/// A hardware queue. Destroyed (doorbell first) on drop.
pub struct Queue {
    hw: Hw,
    next_progress: u64,
    scratch: Vec<u32>,
    spin: u32,
    /// The next position in the wait and signal fence logs: the UMD owns the progression
    /// (spec 002) as a running count of its logged operations, and the engine places each
    /// position in the log whatever its size (`abi::fence_log`), so the OS may grow a log
    /// under the queue.
    log_next: [u32; 2],
    /// Log every native fence signal: a user-mode queue on a device whose native fence
    /// signaled interrupt names the queue (`NativeFenceCaps::optimized_interrupt`), where the
    /// OS learns which fences were signalled from the queue's signal log alone.
    log_every_signal: bool,
    /// The log-entry fields of the submission being enqueued (kept for its capacity).
    log_fields: Vec<(usize, abi::fence_log::FenceLogType)>,
    /// Doorbell reconnects this queue performed.
    reconnects: u64,
    /// Set when the queue may fall back to kernel-mode submission (user-mode queues only).
    fallback: Option<Fallback>,
    /// What a fallback left behind.
    abandoned: Option<Abandoned>,
}

impl Context {
    /// Creates a queue on this context.
    pub fn create_queue(&self, opts: QueueOptions) -> Result<Queue, UmdError> {
        Queue::create(self, opts)
    }
}

impl Queue {
    pub(crate) fn create(ctx: &Context, opts: QueueOptions) -> Result<Queue, UmdError> {
        let kind = match opts.kind {
            SubmissionKind::Preferred => {
                let info = ctx.device.port.adapter_info();
                let e = info.engines.iter().find(|e| e.id == ctx.engine());
                match e {
                    Some(e) if e.user_queues => SubmissionKind::UserMode,
                    Some(e) if e.kernel_queues => SubmissionKind::KernelMode,
                    // Neither: let the kernel say why, with a user-mode request.
                    _ => SubmissionKind::UserMode,
                }
            }
            k => k,
        };
        let hw = match kind {
            SubmissionKind::KernelMode => {
                let info = ctx.device.port.create_hw_queue(
                    ctx.handle,
                    &HwQueueDesc { mode: SubmissionMode::KernelMode, priority: opts.priority },
                )?;
                Hw::Kernel(HwQueue::new(ctx.device.clone(), info)?)
            }
            SubmissionKind::UserMode | SubmissionKind::Preferred => {
                let q = UserQueue::create_with_doorbell(ctx, opts.ring_bytes, opts.priority, opts.doorbell)?;
                q.connect()?;
                Hw::User(Box::new(UserRing { q, wptr: 0, rptr_seen: 0, outstanding: VecDeque::new() }))
            }
        };
        let fallback = (opts.fallback_to_kernel_mode && kind == SubmissionKind::UserMode).then(|| Fallback {
            device: ctx.device.clone(),
            context: ctx.handle,
            priority: opts.priority,
        });
        Ok(Queue {
            hw,
            next_progress: 0,
            scratch: Vec::new(),
            spin: 2_000,
            log_next: [0; 2],
            log_every_signal: kind == SubmissionKind::UserMode && ctx.device.fence_caps.optimized_interrupt,
            log_fields: Vec::new(),
            reconnects: 0,
            fallback,
            abandoned: None,
        })
    }

    /// The queue object (either model).
    fn core(&self) -> &HwQueue {
        match &self.hw {
            Hw::Kernel(h) => h,
            Hw::User(u) => u.q.hw(),
        }
    }

    /// The kernel handle.
    pub fn handle(&self) -> HwQueueHandle {
        self.core().handle()
    }
    /// The engine.
    pub fn engine(&self) -> EngineId {
        self.core().engine()
    }
    /// The submission model.
    pub fn kind(&self) -> SubmissionKind {
        match self.hw {
            Hw::User(_) => SubmissionKind::UserMode,
            Hw::Kernel(_) => SubmissionKind::KernelMode,
        }
    }
    /// GPU VA of this queue's completed progress value (read-only), for `WAIT` packets on
    /// other queues.
    pub fn progress_va(&self) -> u64 {
        self.core().progress_va()
    }
    /// The last progress value handed out.
    pub fn last_submitted(&self) -> u64 {
        self.next_progress
    }
    /// Doorbell reconnects so far.
    pub fn reconnects(&self) -> u64 {
        self.reconnects
    }
    /// How many times a wait spins on memory before blocking in the kernel.
    pub fn set_spin(&mut self, iterations: u32) {
        self.spin = iterations;
    }

    /// The completed progress value, read from memory.
    pub fn completed(&self) -> u64 {
        self.core().completed()
    }

    /// The doorbell status word.
    pub fn doorbell_status(&self) -> Result<DoorbellStatus, UmdError> {
        self.core().doorbell_status()
    }

    /// `USERQ QUERY_STATUS`.
    pub fn status(&self) -> Result<QueueStatus, UmdError> {
        self.core().status()
    }

    /// `D3DKMTConnectDoorbell`, for a caller that reads [`Queue::doorbell_status`] itself and
    /// reconnects ahead of its next submission (a C driver's loop, a UMD that wakes the
    /// engine early): what to do after `DisconnectedRetry`. [`Queue::submit`] reconnects by
    /// itself when it meets that status, so no caller has to. A connected doorbell stays as
    /// it is. Each call counts in [`Queue::reconnects`]. Refused for a kernel-mode queue, which has no
    /// doorbell.
    pub fn reconnect(&mut self) -> Result<(), UmdError> {
        let Hw::User(u) = &self.hw else {
            return Err(UmdError::Kernel(abi::port::KernelError::WrongQueueMode {
                queue: self.handle(),
                actual: "kernel-mode",
                expected: "user-mode",
            }));
        };
        u.q.connect()?;
        self.reconnects += 1;
        Ok(())
    }

    /// Rings the doorbell again with the wptr already published, reconnecting it first if it
    /// is disconnected: steps 4 and 5 of the submission loop alone. What to do after
    /// [`UmdError::NotRung`] (a submission published while its doorbell's reconnect failed):
    /// the engine hears of the work, and a wait for its value can end. A kernel-mode queue has
    /// no doorbell: nothing to do.
    pub fn ring(&mut self) -> Result<(), UmdError> {
        match self.hw {
            Hw::User(_) => self.ring_and_check(),
            Hw::Kernel(_) => Ok(()),
        }
    }

    /// Submits a command buffer; returns its progress value. See the module docs for the
    /// order of operations.
    ///
    /// A fault of this very submission may be reported here rather than by the wait for it:
    /// when the doorbell was disconnected (the engine idled into F1, say), the reconnect's
    /// wptr re-read hands the work to the engine, which may run it and fault before the ring
    /// that follows, and that ring then reads `DisconnectedAbort` ([`UmdError::QueueLost`]
    /// with this queue's fault record). The work was published either way.
    pub fn submit(&mut self, cb: &CommandBuffer) -> Result<u64, UmdError> {
        if let Hw::Kernel(h) = &self.hw {
            // 1. The next progress value; the kernel call carries the rest.
            let value = self.next_progress + 1;
            self.scratch.clear();
            self.scratch.extend_from_slice(cb.words());
            self.scratch.extend_from_slice(&progress_fence_words(value));
            h.device.port.submit_command(h.handle(), &self.scratch)?;
            self.next_progress = value;
            return Ok(value);
        }
        let value = self.enqueue(cb)?;
        match self.ring_and_check() {
            Err(UmdError::QueueLost { queue, reason }) if self.fallback.is_some() && cb.log_fields().is_empty() => {
                self.fall_back(cb, value, queue, reason)?;
                Ok(value)
            }
            r => r.map(|()| value),
        }
    }

    /// Prepares a command buffer for the GPU to submit (spec 001: "the GPU [can] submit work
    /// to itself"): steps 1 to 3 of the submission loop — progress value, last-queued value,
    /// packets in the ring — but wptr is not published and the doorbell is not rung. The
    /// returned [`GpuKick`] is what another queue of this process writes from the GPU
    /// ([`CommandBuffer::kick`]): the wptr word, then the doorbell. Refused for a kernel-mode
    /// queue, and where the device does not let the GPU ring doorbells
    /// ([`abi::port::DoorbellInfo::gpu_va`]).
    ///
    /// A later CPU submission on this queue publishes a wptr that covers this work too (it is
    /// in the ring before it), so it never runs out of order.
    pub fn prepare(&mut self, cb: &CommandBuffer) -> Result<GpuKick, UmdError> {
        let Hw::User(u) = &self.hw else {
            return Err(UmdError::Kernel(abi::port::KernelError::WrongQueueMode {
                queue: self.handle(),
                actual: "kernel-mode",
                expected: "user-mode",
            }));
        };
        let Some(doorbell_va) = u.q.doorbell().gpu_va() else {
            return Err(UmdError::Kernel(abi::port::KernelError::InvalidArgument {
                field: "doorbell",
                value: u.q.doorbell().handle().to_string(),
                reason: abi::port::Invalid::Unsupported("doorbells rung from the GPU"),
            }));
        };
        let doorbell = u.q.doorbell();
        let aggregated_va = match (doorbell.aggregated(), doorbell.aggregated_gpu_va()) {
            (None, _) => None,
            (Some(_), Some(va)) => Some(va),
            (Some(_), None) => {
                return Err(UmdError::Kernel(abi::port::KernelError::InvalidArgument {
                    field: "doorbell",
                    value: doorbell.handle().to_string(),
                    reason: abi::port::Invalid::Unsupported("aggregated doorbells rung from the GPU"),
                }));
            }
        };
        let wptr_va = u.q.control_va() + abi::ring::WPTR_OFFSET;
        let value = self.enqueue(cb)?;
        Ok(GpuKick { wptr_va, doorbell_va, aggregated_va, wptr: self.user().wptr, value })
    }

    /// This queue's progress fence as a native fence (spec 002 "Indicating a native progress
    /// fence for hardware queues"): wait on it with the native fence calls, or from another
    /// queue's `WAIT`. The engine alone signals it; it goes with the queue.
    pub fn progress_fence(&self) -> Result<NativeFence, UmdError> {
        NativeFence::progress_of(self.core().device.clone(), self.handle())
    }

    /// amdgpu `USERQ_SIGNAL`: once this queue completes its work up to progress value
    /// `point` (at most [`Queue::last_submitted`]), the kernel signals each fence to its value.
    pub fn userq_signal(&self, point: u64, fences: &[(&NativeFence, u64)]) -> Result<(), UmdError> {
        let list: Vec<_> = fences.iter().map(|(f, v)| (f.handle(), *v)).collect();
        Ok(self.core().device.port.userq_signal(self.handle(), point, &list)?)
    }

    /// amdgpu `USERQ_WAIT`: the kernel validates the sync objects this queue should wait on
    /// and answers where and for what its `WAIT`s read ([`CommandBuffer::wait_points`]).
    pub fn userq_wait(&self, objects: &[abi::port::SyncWait]) -> Result<Vec<abi::port::WaitPoint>, UmdError> {
        Ok(self.core().device.port.userq_wait(self.handle(), objects)?)
    }

    /// Steps 1 to 3 for a user-mode queue (not the wptr store): progress value, log entries,
    /// ring space, last-queued, packets.
    fn enqueue(&mut self, cb: &CommandBuffer) -> Result<u64, UmdError> {
        // 1. The next progress value.
        let value = self.next_progress + 1;
        let fence = progress_fence_words(value);
        // Logged fence operations get their log positions now (into a copy: the command
        // buffer is the caller's and may be submitted again). The positions advance only once
        // the submission is in the ring: a refused one must not leave holes (a reader would
        // see stale entries). A buffer with nothing to log costs one test of each kind.
        let mut patched = Vec::new();
        let mut log_next = self.log_next;
        let words: &[u32] = if self.log_every_signal && cb.has_fence_signals() {
            // Where the interrupt names the queue, every native fence signal is logged (see
            // `log_every_signal`).
            patched = std::mem::take(&mut self.scratch);
            let mut fields = std::mem::take(&mut self.log_fields);
            cb.with_signals_logged(&mut patched, &mut fields);
            place_log_positions(&mut patched, &fields, &mut log_next);
            self.log_fields = fields;
            &patched
        } else if !cb.log_fields().is_empty() {
            patched = std::mem::take(&mut self.scratch);
            patched.clear();
            patched.extend_from_slice(cb.words());
            place_log_positions(&mut patched, cb.log_fields(), &mut log_next);
            &patched
        } else {
            cb.words()
        };
        let dwords = words.len() + fence.len();
        let (ring_bytes, wptr, plan) = {
            let u = self.user();
            (u.q.ring().bytes(), u.wptr, u.q.ring().plan(u.wptr, dwords as u64)?)
        };
        // Back-pressure: never overwrite bytes the engine has not read.
        self.wait_for_ring_space(plan.new_wptr.saturating_sub(ring_bytes))?;
        let Hw::User(u) = &mut self.hw else { unreachable!("user-mode") };
        // 2. Tell the OS the new last-queued value before the work becomes visible.
        abi::protocol::announce_last_queued(u.q.control().last_queued(), value);
        // 3. Packets (wptr is published by the ring, or by the GPU's kick).
        u.q.ring().write(wptr, &plan, &[words, &fence])?;
        u.wptr = plan.new_wptr;
        // A full list would grow: first forget what the engine has read past, so that it
        // holds about the work in flight, not every submission since the ring last filled.
        if u.outstanding.len() == u.outstanding.capacity() {
            u.forget_read();
        }
        u.outstanding.push_back((value, plan.new_wptr));
        self.next_progress = value;
        self.log_next = log_next;
        if patched.capacity() > 0 {
            self.scratch = patched;
        }
        Ok(value)
    }

    /// Spec 000's `cleanup_fallback`: the user-mode queue is destroyed and a kernel-mode
    /// queue created on the same context; the submission `value` (which met the abort) is
    /// submitted there.
    fn fall_back(
        &mut self,
        cb: &CommandBuffer,
        value: u64,
        queue: HwQueueHandle,
        reason: abi::port::LostReason,
    ) -> Result<(), UmdError> {
        let f = self.fallback.take().expect("checked by the caller");
        let completed = self.completed();
        // Destroy first (its doorbell goes with it), then re-create: the spec's order. The
        // user-mode objects' own drops below then find nothing left to destroy.
        let _ = f.device.port.destroy_hw_queue(queue);
        let info = f
            .device
            .port
            .create_hw_queue(f.context, &HwQueueDesc { mode: SubmissionMode::KernelMode, priority: f.priority })?;
        self.hw = Hw::Kernel(HwQueue::new(f.device.clone(), info)?);
        self.abandoned = Some(Abandoned { completed, last: value - 1, queue, reason });
        let Hw::Kernel(h) = &self.hw else { unreachable!("just set") };
        self.scratch.clear();
        self.scratch.extend_from_slice(cb.words());
        self.scratch.extend_from_slice(&progress_fence_words(value));
        h.device.port.submit_command(h.handle(), &self.scratch)?;
        Ok(())
    }

    /// The user-mode queue's state (callers have checked the model).
    fn user(&self) -> &UserRing {
        match &self.hw {
            Hw::User(u) => u,
            Hw::Kernel(_) => unreachable!("user-mode"),
        }
    }

    /// Step 3's wptr publication, then steps 4 and 5: ring, read the status, act on it.
    fn ring_and_check(&mut self) -> Result<(), UmdError> {
        loop {
            let u = self.user();
            // Publish wptr, ring the doorbell with it, fence, read the status: the client half
            // of the Dekker pair (module docs), shared with the loom model.
            match u.q.ring_doorbell(u.wptr)? {
                DoorbellStatus::Connected => return Ok(()),
                DoorbellStatus::ConnectedNotify => return u.q.notify(),
                DoorbellStatus::DisconnectedRetry => {
                    // The work is published: a failed reconnect must not read as a refused
                    // submission (its value is taken, and the work runs once reconnected).
                    if let Err(e) = u.q.connect() {
                        return Err(not_rung(u.q.handle(), self.next_progress, e));
                    }
                    self.reconnects += 1;
                }
                DoorbellStatus::DisconnectedAbort => return Err(u.q.lost()),
            }
        }
    }

    fn wait_for_ring_space(&mut self, need_rptr: u64) -> Result<(), UmdError> {
        loop {
            let Hw::User(u) = &mut self.hw else { unreachable!("user-mode") };
            if u.rptr_seen >= need_rptr || need_rptr > u.wptr {
                return Ok(());
            }
            let rptr = u.forget_read();
            if rptr >= need_rptr {
                return Ok(());
            }
            // Wait for the oldest submission whose end frees enough space.
            while u.outstanding.front().is_some_and(|&(_, end)| end < need_rptr) {
                u.outstanding.pop_front();
            }
            let Some(&(value, _)) = u.outstanding.front() else {
                // Every submission reports complete, yet rptr is short of `need_rptr`.
                self.yield_to_device()?;
                continue;
            };
            self.wait(value, None)?;
            // The engine publishes rptr at the end of the step that wrote the fence.
            for _ in 0..100_000 {
                if self.user().q.control().rptr().load(Ordering::Acquire) >= need_rptr {
                    break;
                }
                std::hint::spin_loop();
            }
            let Hw::User(u) = &mut self.hw else { unreachable!("user-mode") };
            u.outstanding.pop_front();
        }
    }

    /// Called when every submission reports complete but rptr has not freed the space: the
    /// engine has not published rptr yet, or the progress values were not the UMD's own (a
    /// raw `PROGRESS_FENCE` in a command buffer). Spinning on rptr here could last forever: a
    /// queue that hung in the meantime never frees space, and on the deterministic driver
    /// nothing runs unless a kernel wait runs it. So: a lost queue is reported, a progress
    /// value this queue never submitted is refused as corrupt, and otherwise the device gets
    /// time through a short kernel wait on the next value.
    fn yield_to_device(&self) -> Result<(), UmdError> {
        if self.doorbell_status()? == DoorbellStatus::DisconnectedAbort {
            return Err(self.core().lost());
        }
        let completed = self.completed();
        if completed > self.next_progress {
            return Err(UmdError::Corrupt { field: "progress fence", value: completed });
        }
        self.core().wait_progress(completed + 1, Some(Duration::from_micros(100)))?;
        Ok(())
    }

    /// Waits until the progress value reaches `value`: memory first, a short spin, then a
    /// blocking kernel wait.
    pub fn wait(&self, value: u64, timeout: Option<Duration>) -> Result<(), UmdError> {
        if let Some(a) = &self.abandoned
            && value > a.completed
            && value <= a.last
        {
            // Lost with the user-mode queue this one fell back from.
            return Err(UmdError::QueueLost { queue: a.queue, reason: a.reason.clone() });
        }
        for _ in 0..=self.spin {
            if self.completed() >= value {
                return Ok(());
            }
            std::hint::spin_loop();
        }
        match self.core().wait_progress(value, timeout)? {
            WaitOutcome::Reached(_) => Ok(()),
            WaitOutcome::TimedOut => {
                Err(UmdError::Timeout { queue: self.handle().to_string(), value, completed: self.completed() })
            }
        }
    }

    /// Waits for everything submitted so far.
    pub fn finish(&self, timeout: Option<Duration>) -> Result<(), UmdError> {
        self.wait(self.next_progress, timeout)
    }
}

/// Fills in the log positions of a submission's logged fence operations (`fields`: the dword
/// index of each position field, and its log), from the queue's running counts `next`.
fn place_log_positions(words: &mut [u32], fields: &[(usize, abi::fence_log::FenceLogType)], next: &mut [u32; 2]) {
    for &(at, log) in fields {
        let n = &mut next[log as usize];
        words[at] = *n;
        *n = n.wrapping_add(1);
    }
}

/// [`UmdError::NotRung`], off the hot path.
#[cold]
#[inline(never)]
fn not_rung(queue: HwQueueHandle, value: u64, source: UmdError) -> UmdError {
    UmdError::NotRung { queue, value, source: Box::new(source) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A queue whose engine keeps up (here: the deterministic device settles after every few
    /// submissions, so each look at rptr finds it past what the submission needs) remembers
    /// at most a ring's worth of submissions, however many it makes.
    #[test]
    fn a_queue_the_engine_keeps_up_with_remembers_at_most_a_ring_of_submissions() {
        let sys = kernel::System::sim(Default::default()).unwrap();
        let device = crate::Device::open(sys.open_process().unwrap()).unwrap();
        let ctx = device.create_context(device.engine(abi::EngineKind::Compute).unwrap()).unwrap();
        let out = device.allocate(4096).unwrap();
        let ring_bytes = 4096;
        let mut q = ctx.create_queue(QueueOptions { ring_bytes, ..QueueOptions::user_mode() }).unwrap();
        let mut cb = CommandBuffer::new();
        cb.write_u32(out.va(), 7);
        // One submission: the packet and its progress fence.
        let bytes = ((cb.len() + progress_fence_words(0).len()) * 4) as u64;
        let mut most = 0;
        for i in 0..2_000 {
            q.submit(&cb).unwrap();
            if i % 16 == 15 {
                sys.settle();
            }
            most = most.max(q.user().outstanding.len());
        }
        q.finish(None).unwrap();
        assert_eq!(q.completed(), 2_000);
        assert!(
            most as u64 <= ring_bytes / bytes + 1,
            "{most} submissions remembered, a ring holds {}",
            ring_bytes / bytes
        );
    }
}
