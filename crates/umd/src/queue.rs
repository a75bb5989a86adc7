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
//!    whose engines miss unmapped queues' doorbells, also set the engine's bit in the
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

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use abi::doorbell::RingMethod;
use abi::packet::progress_fence_words;
use abi::port::{CreateDoorbell, HwQueueDesc, KernelError, LostReason, QueueStatus, SubmissionMode, WaitOutcome};
use abi::protocol;
use abi::queue::{KernelPageView, PROGRESS_COMPLETED_OFFSET};
use abi::ring::{self, LAST_QUEUED_OFFSET, RING_CONTROL_BYTES, RPTR_OFFSET, RingControlView, WPTR_OFFSET};
use abi::{DoorbellHandle, DoorbellStatus, EngineId, HwQueueHandle, Priority, QueueDescriptor};
use shm::{ReadWord, Word};

use crate::device::{Buffer, Context, DeviceInner};
use crate::{CommandBuffer, UmdError};

/// Which submission model a queue uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubmissionKind {
    /// User-mode submission: ring + doorbell, no kernel call per submission.
    UserMode,
    /// Kernel-mode submission: every submission is a kernel call.
    KernelMode,
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
}

impl Default for QueueOptions {
    fn default() -> Self {
        QueueOptions { kind: SubmissionKind::UserMode, ring_bytes: 64 * 1024, priority: Priority::Normal }
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
}

struct UserRing {
    ring: Buffer,
    /// Keeps the ring-control allocation alive (and freed after the queue).
    _control: Buffer,
    /// rptr, wptr and last-queued, in the ring-control allocation.
    words: RingControlView,
    ring_bytes: u64,
    doorbell: DoorbellHandle,
    /// Our doorbell word, in the doorbell CPU page the kernel rotates.
    doorbell_word: Word,
    /// How to ring it (a dedicated word takes wptr; the global page takes our bit).
    ring_method: RingMethod,
    /// The aggregated doorbell and our engine's bit, rung after ours when the device needs it.
    aggregated: Option<(Word, u64)>,
    /// Our wptr (we are its only writer).
    wptr: u64,
    /// The last rptr we read: re-read only when the ring looks full, so the submission hot
    /// path does not pull the engine's cache line every time.
    rptr_seen: u64,
    /// (progress value, wptr after it) of submissions not yet known complete.
    outstanding: VecDeque<(u64, u64)>,
}

/// A hardware queue. Destroyed (doorbell first) on drop.
pub struct Queue {
    device: Arc<DeviceInner>,
    handle: HwQueueHandle,
    engine: EngineId,
    /// The queue's kernel page, mapped read-only: completed progress value, doorbell status.
    kernel_page: KernelPageView<ReadWord>,
    kernel_page_va: u64,
    next_progress: u64,
    user: Option<UserRing>,
    scratch: Vec<u32>,
    spin: u32,
    /// The next entry of the wait and signal fence logs: the UMD owns the progression (spec
    /// 002), the engine writes where it is told.
    log_next: [u32; 2],
    /// Doorbell reconnects this queue performed.
    reconnects: u64,
}

impl Queue {
    pub(crate) fn create(ctx: &Context, opts: QueueOptions) -> Result<Queue, UmdError> {
        let dev = ctx.device.clone();
        let port = dev.port.clone();
        match opts.kind {
            SubmissionKind::KernelMode => {
                let info = port.create_hw_queue(
                    ctx.handle,
                    &HwQueueDesc { mode: SubmissionMode::KernelMode, priority: opts.priority },
                )?;
                Queue::from_info(dev, info, None)
            }
            SubmissionKind::UserMode => {
                let device = crate::Device { inner: dev.clone() };
                // The UMD makes the ring and its control block resident before creating the
                // doorbell (spec 000 "Residency model").
                let ring = device.allocate(opts.ring_bytes.max(4096))?;
                let control = device.allocate(RING_CONTROL_BYTES)?;
                let desc = QueueDescriptor {
                    ring_va: ring.va(),
                    ring_bytes: opts.ring_bytes,
                    rptr_va: control.va() + RPTR_OFFSET,
                    wptr_va: control.va() + WPTR_OFFSET,
                    last_queued_va: control.va() + LAST_QUEUED_OFFSET,
                    doorbell_index: abi::queue::DOORBELL_INDEX_ANY,
                    priority: opts.priority as u32,
                };
                let info = port.create_hw_queue(
                    ctx.handle,
                    &HwQueueDesc { mode: SubmissionMode::UserMode(desc), priority: opts.priority },
                )?;
                let handle = info.handle;
                let db = match port.create_doorbell(&CreateDoorbell {
                    queue: handle,
                    ring_buffer: ring.handle(),
                    ring_control: control.handle(),
                }) {
                    Ok(db) => db,
                    Err(e) => {
                        let _ = port.destroy_hw_queue(handle);
                        return Err(e.into());
                    }
                };
                let words = RingControlView::new(control.mapping(), 0);
                let doorbell_word = Word::new(&db.cpu_page, db.offset);
                let aggregated = db.aggregated.map(|a| Word::new(&a.page, a.offset).map(|w| (w, a.mask))).transpose();
                let (words, doorbell_word, aggregated) = match (words, doorbell_word, aggregated) {
                    (Ok(w), Ok(d), Ok(a)) => (w, d, a),
                    (Err(e), ..) | (_, Err(e), _) | (.., Err(e)) => {
                        let _ = port.destroy_doorbell(db.handle);
                        let _ = port.destroy_hw_queue(handle);
                        return Err(e.into());
                    }
                };
                let user = UserRing {
                    ring,
                    _control: control,
                    words,
                    ring_bytes: opts.ring_bytes,
                    doorbell: db.handle,
                    doorbell_word,
                    ring_method: db.ring,
                    aggregated,
                    wptr: 0,
                    rptr_seen: 0,
                    outstanding: VecDeque::new(),
                };
                let q = Queue::from_info(dev, info, Some(user))?;
                port.connect_doorbell(handle)?;
                Ok(q)
            }
        }
    }

    fn from_info(
        device: Arc<DeviceInner>,
        info: abi::port::HwQueueInfo,
        user: Option<UserRing>,
    ) -> Result<Queue, UmdError> {
        let handle = info.handle;
        let kernel_page = match KernelPageView::read_only_in(Arc::new(info.kernel_page)) {
            Ok(k) => k,
            Err(e) => {
                if let Some(u) = &user {
                    let _ = device.port.destroy_doorbell(u.doorbell);
                }
                let _ = device.port.destroy_hw_queue(handle);
                return Err(e.into());
            }
        };
        Ok(Queue {
            device,
            handle,
            engine: info.engine,
            kernel_page,
            kernel_page_va: info.kernel_page_va,
            next_progress: 0,
            user,
            scratch: Vec::new(),
            spin: 2_000,
            log_next: [0; 2],
            reconnects: 0,
        })
    }

    /// The kernel handle.
    pub fn handle(&self) -> HwQueueHandle {
        self.handle
    }
    /// The engine.
    pub fn engine(&self) -> EngineId {
        self.engine
    }
    /// The submission model.
    pub fn kind(&self) -> SubmissionKind {
        if self.user.is_some() { SubmissionKind::UserMode } else { SubmissionKind::KernelMode }
    }
    /// GPU VA of this queue's completed progress value (read-only), for `WAIT` packets on
    /// other queues.
    pub fn progress_va(&self) -> u64 {
        self.kernel_page_va + PROGRESS_COMPLETED_OFFSET
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
        // Acquire: pairs with the engine's release store, so results written before the
        // PROGRESS_FENCE are visible once the value is.
        self.kernel_page.progress_completed().load(Ordering::Acquire)
    }

    /// The doorbell status word.
    pub fn doorbell_status(&self) -> Result<DoorbellStatus, UmdError> {
        // SeqCst: the status word is half of the doorbell-versus-disconnect Dekker pair.
        let w = self.kernel_page.doorbell_status().load(Ordering::SeqCst);
        DoorbellStatus::from_word(w).ok_or(UmdError::Corrupt { field: "doorbell status", value: w })
    }

    /// `USERQ QUERY_STATUS`.
    pub fn status(&self) -> Result<QueueStatus, UmdError> {
        Ok(self.device.port.query_queue(self.handle)?)
    }

    /// Submits a command buffer; returns its progress value. See the module docs for the
    /// order of operations.
    pub fn submit(&mut self, cb: &CommandBuffer) -> Result<u64, UmdError> {
        // 1. The next progress value.
        let value = self.next_progress + 1;
        let fence = progress_fence_words(value);
        if self.user.is_none() {
            self.scratch.clear();
            self.scratch.extend_from_slice(cb.words());
            self.scratch.extend_from_slice(&fence);
            self.device.port.submit_command(self.handle, &self.scratch)?;
            self.next_progress = value;
            return Ok(value);
        }
        // Logged fence operations get their log entries now (into a copy: the command buffer
        // is the caller's and may be submitted again).
        let mut patched = std::mem::take(&mut self.scratch);
        let logged = !cb.log_fields().is_empty();
        // The log positions advance only once the submission is in the ring: a refused one
        // must not leave holes (a reader would see stale entries).
        let mut log_next = self.log_next;
        if logged {
            patched.clear();
            patched.extend_from_slice(cb.words());
            for &(at, log) in cb.log_fields() {
                let next = &mut log_next[log as usize];
                patched[at] = *next;
                *next = (*next + 1) % abi::fence_log::FENCE_LOG_ENTRIES;
            }
        }
        let words: &[u32] = if logged { &patched } else { cb.words() };
        let dwords = words.len() + fence.len();
        let (ring_bytes, wptr) = {
            let u = self.user.as_ref().expect("user-mode");
            (u.ring_bytes, u.wptr)
        };
        let plan = ring::plan_write(wptr, ring_bytes, dwords as u64).ok_or(UmdError::TooLarge {
            dwords,
            ring_bytes,
            max: ring_bytes / 8,
        })?;
        // Back-pressure: never overwrite bytes the engine has not read.
        self.wait_for_ring_space(plan.new_wptr.saturating_sub(ring_bytes))?;
        let u = self.user.as_mut().expect("user-mode");
        // 2. Tell the OS the new last-queued value before the work becomes visible.
        u.words.last_queued().store(value, Ordering::Release);
        // 3. Packets, then wptr (release: the packets are visible before the new wptr).
        ring::write_stream(u.ring.map(), ring_bytes, wptr, &plan, &[words, &fence])?;
        u.wptr = plan.new_wptr;
        u.outstanding.push_back((value, plan.new_wptr));
        self.next_progress = value;
        self.log_next = log_next;
        self.scratch = patched;
        self.ring_and_check()?;
        Ok(value)
    }

    /// Step 3's wptr publication, then steps 4 and 5: ring, read the status, act on it.
    fn ring_and_check(&mut self) -> Result<(), UmdError> {
        loop {
            let u = self.user.as_ref().expect("user-mode");
            // Publish wptr, ring the doorbell with it, fence, read the status: the client half
            // of the Dekker pair (module docs), shared with the loom model.
            let bell = protocol::Bell {
                word: &u.doorbell_word,
                method: u.ring_method,
                aggregated: u.aggregated.as_ref().map(|(w, mask)| (w, *mask)),
            };
            let word =
                protocol::ring_and_read_status(u.words.wptr_word(), &bell, self.kernel_page.doorbell_status(), u.wptr);
            let status =
                DoorbellStatus::from_word(word).ok_or(UmdError::Corrupt { field: "doorbell status", value: word })?;
            match status {
                DoorbellStatus::Connected => return Ok(()),
                DoorbellStatus::ConnectedNotify => {
                    self.device.port.notify_work_submission(u.doorbell)?;
                    return Ok(());
                }
                DoorbellStatus::DisconnectedRetry => {
                    self.reconnects += 1;
                    match self.device.port.connect_doorbell(self.handle) {
                        Ok(()) => continue,
                        Err(KernelError::QueueLost { queue, reason }) => {
                            return Err(UmdError::QueueLost { queue, reason });
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
                DoorbellStatus::DisconnectedAbort => return Err(self.lost()),
            }
        }
    }

    fn lost(&self) -> UmdError {
        let reason = match self.status() {
            Ok(QueueStatus { fault: Some(f), .. }) => LostReason::Fault(f),
            Ok(s) => LostReason::DoorbellAborted(s.state),
            Err(e) => return e,
        };
        UmdError::QueueLost { queue: self.handle, reason }
    }

    fn wait_for_ring_space(&mut self, need_rptr: u64) -> Result<(), UmdError> {
        loop {
            let u = self.user.as_mut().expect("user-mode");
            if u.rptr_seen >= need_rptr || need_rptr > u.wptr {
                return Ok(());
            }
            // Acquire: the engine is done reading bytes below rptr.
            let rptr = u.words.rptr().load(Ordering::Acquire);
            u.rptr_seen = rptr;
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
                let u = self.user.as_ref().expect("user-mode");
                if u.words.rptr().load(Ordering::Acquire) >= need_rptr {
                    break;
                }
                std::hint::spin_loop();
            }
            let u = self.user.as_mut().expect("user-mode");
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
            return Err(self.lost());
        }
        let completed = self.completed();
        if completed > self.next_progress {
            return Err(UmdError::Corrupt { field: "progress fence", value: completed });
        }
        self.device.port.wait_progress(self.handle, completed + 1, Some(Duration::from_micros(100)))?;
        Ok(())
    }

    /// Waits until the progress value reaches `value`: memory first, a short spin, then a
    /// blocking kernel wait.
    pub fn wait(&self, value: u64, timeout: Option<Duration>) -> Result<(), UmdError> {
        for _ in 0..=self.spin {
            if self.completed() >= value {
                return Ok(());
            }
            std::hint::spin_loop();
        }
        match self.device.port.wait_progress(self.handle, value, timeout)? {
            WaitOutcome::Reached(_) => Ok(()),
            WaitOutcome::TimedOut => {
                Err(UmdError::Timeout { queue: self.handle.to_string(), value, completed: self.completed() })
            }
        }
    }

    /// Waits for everything submitted so far.
    pub fn finish(&self, timeout: Option<Duration>) -> Result<(), UmdError> {
        self.wait(self.next_progress, timeout)
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        let port = &self.device.port;
        if let Some(u) = &self.user {
            let _ = port.destroy_doorbell(u.doorbell);
        }
        let _ = port.destroy_hw_queue(self.handle);
        // `user` (ring and control buffers) drops after this, freeing them now that the
        // doorbell's reference is gone.
    }
}
