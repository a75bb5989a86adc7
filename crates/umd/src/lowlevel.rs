//! The low-level layer: a user-mode queue's pieces, for people writing their own submission
//! loop.
//!
//! [`crate::Queue`] is spec 000's submission loop, finished: progress values, ring space,
//! fence-log entries, reconnects. A UMD prototype often needs the pieces instead — to try
//! another loop, to stop between steps, to watch what the device and the kernel do at each
//! one. [`UserQueue`] is those pieces, each behind a safe, typed view, and `Queue` is built on
//! it (one implementation of each step, not two):
//!
//! - **Create without connecting** ([`UserQueue::create`]): allocates the ring and its
//!   ring-control block (resident before the doorbell, spec 000 "Residency model"), creates the
//!   hardware queue (`D3DKMTCreateHwQueue`) and its doorbell (`D3DKMTCreateDoorbell`). The
//!   doorbell starts disconnected: its CPU page shows the dummy page and its status is
//!   `DisconnectedRetry` until [`UserQueue::connect`] (`D3DKMTConnectDoorbell`).
//! - **The ring** ([`UserQueue::ring`], a [`Ring`]): plan a write of a packet stream at a wptr
//!   (padding so no packet straddles the end), write it, read it back.
//! - **Ring control** ([`UserQueue::control`], [`abi::ring::RingControlView`]): rptr (the
//!   engine writes it), wptr and last-queued (the client writes them;
//!   `HwQueueProgressFenceLastQueuedValueCPUVirtualAddress`).
//! - **The doorbell** ([`UserQueue::doorbell`], a [`Doorbell`]): its CPU page (the page the
//!   kernel rotates between the BAR and the dummy page), its word there, how to ring it
//!   ([`abi::doorbell::RingMethod`]) and the aggregated doorbell when the device needs one.
//! - **Ring it** ([`UserQueue::ring_doorbell`]): spec 000 steps 3 to 5 as one call — publish
//!   wptr (release), ring the doorbell, a SeqCst fence, read the doorbell status — the client
//!   half of the Dekker pair [`abi::protocol::ring_and_read_status`] (model-checked with loom),
//!   so a loop built on it loses no submission to a racing disconnect. Acting on the status
//!   is the loop's business: `Connected` → done; `ConnectedNotify` → [`UserQueue::notify`];
//!   `DisconnectedRetry` → [`UserQueue::connect`] and ring again; `DisconnectedAbort` → the
//!   queue is lost ([`UserQueue::lost`] says why).
//! - **Read its status**: [`UserQueue::doorbell_status`] and [`UserQueue::completed`] from the
//!   kernel page (memory reads), [`UserQueue::status`] (`USERQ QUERY_STATUS`) and
//!   [`UserQueue::physical_doorbell`] (which BAR doorbell it holds now) through the kernel.
//!
//! Invariants: everything is reached through typed views made once at creation (no offsets at
//! call sites); dropping a `UserQueue` destroys its doorbell, then its queue, then frees the
//! ring and ring-control allocations, in that order (field order below). What the loop writes
//! is the caller's: nothing here checks that progress values increase or that the ring has
//! space — the firmware faults a queue whose wptr is bad, with a typed reason.
//!
//! # Example: one submission, by hand
//!
//! ```
//! use std::sync::atomic::Ordering;
//! use abi::DoorbellStatus;
//! use abi::packet::progress_fence_words;
//! use umd::lowlevel::UserQueue;
//! use umd::{CommandBuffer, Device};
//!
//! let sys = kernel::System::sim(Default::default())?;
//! let device = Device::open(sys.open_process()?)?;
//! let ctx = device.create_context(device.engine(abi::EngineKind::Compute)?)?;
//! let out = device.allocate(4096)?;
//! let q = UserQueue::create(&ctx, 4096, abi::Priority::Normal)?;
//! assert_eq!(q.doorbell_status()?, DoorbellStatus::DisconnectedRetry, "created disconnected");
//! q.connect()?;
//!
//! // Packets, then the progress fence 1.
//! let mut cb = CommandBuffer::new();
//! cb.write_u32(out.va(), 0xfeed);
//! let fence = progress_fence_words(1);
//! let wptr = 0;
//! let plan = q.ring().plan(wptr, (cb.words().len() + fence.len()) as u64)?;
//! q.control().last_queued().store(1, Ordering::Release); // tell the OS first
//! q.ring().write(wptr, &plan, &[cb.words(), &fence])?;
//! // Publish wptr, ring, read the status.
//! assert_eq!(q.ring_doorbell(plan.new_wptr)?, DoorbellStatus::Connected);
//!
//! q.wait_progress(1, None)?; // a kernel wait runs the deterministic device
//! assert_eq!(q.completed(), 1);
//! assert_eq!(out.read_u32(0)?, 0xfeed);
//! assert_eq!(q.control().rptr().load(Ordering::Acquire), plan.new_wptr);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The `PROGRESS_FENCE` packet a hand-written loop appends to each command buffer (spec 000
/// step 1), so such a loop needs no `abi` dependency of its own.
pub use abi::packet::progress_fence_words;

use abi::doorbell::RingMethod;
use abi::port::{
    CreateDoorbell, HwQueueDesc, HwQueueInfo, LostReason, PhysicalDoorbell, QueueStatus, SubmissionMode, WaitOutcome,
};
use abi::protocol;
use abi::queue::{KernelPageView, PROGRESS_COMPLETED_OFFSET};
use abi::ring::{self, LAST_QUEUED_OFFSET, RING_CONTROL_BYTES, RPTR_OFFSET, RingControlView, WPTR_OFFSET, WritePlan};
use abi::{DoorbellHandle, DoorbellStatus, EngineId, HwQueueHandle, Priority, QueueDescriptor};
use shm::{ReadWord, RotatingPage, Word};

use crate::UmdError;
use crate::device::{Buffer, Context};
use crate::inner::DeviceInner;

/// A hardware queue object and its kernel page; destroyed on drop. Shared by both submission
/// models of [`crate::Queue`] and by [`UserQueue`].
pub(crate) struct HwQueue {
    pub(crate) device: Arc<DeviceInner>,
    handle: HwQueueHandle,
    engine: EngineId,
    /// The queue's kernel page, mapped read-only: completed progress value, doorbell status.
    kernel_page: KernelPageView<ReadWord>,
    kernel_page_va: u64,
}

impl HwQueue {
    /// Takes ownership of a created queue (destroying it if its kernel page cannot be viewed).
    pub(crate) fn new(device: Arc<DeviceInner>, info: HwQueueInfo) -> Result<HwQueue, UmdError> {
        match KernelPageView::read_only_in(Arc::new(info.kernel_page)) {
            Ok(kernel_page) => Ok(HwQueue {
                device,
                handle: info.handle,
                engine: info.engine,
                kernel_page,
                kernel_page_va: info.kernel_page_va,
            }),
            Err(e) => {
                let _ = device.port.destroy_hw_queue(info.handle);
                Err(e.into())
            }
        }
    }

    pub(crate) fn handle(&self) -> HwQueueHandle {
        self.handle
    }

    pub(crate) fn engine(&self) -> EngineId {
        self.engine
    }

    pub(crate) fn progress_va(&self) -> u64 {
        self.kernel_page_va + PROGRESS_COMPLETED_OFFSET
    }

    pub(crate) fn kernel_page(&self) -> &KernelPageView<ReadWord> {
        &self.kernel_page
    }

    pub(crate) fn completed(&self) -> u64 {
        // Acquire: pairs with the engine's release store, so results written before the
        // PROGRESS_FENCE are visible once the value is.
        self.kernel_page.progress_completed().load(Ordering::Acquire)
    }

    pub(crate) fn doorbell_status(&self) -> Result<DoorbellStatus, UmdError> {
        // SeqCst: the status word is half of the doorbell-versus-disconnect Dekker pair.
        let w = self.kernel_page.doorbell_status().load(Ordering::SeqCst);
        doorbell_status_of(w)
    }

    pub(crate) fn status(&self) -> Result<QueueStatus, UmdError> {
        Ok(self.device.port.query_queue(self.handle)?)
    }

    /// Why the queue is lost, once its doorbell said `DisconnectedAbort`.
    pub(crate) fn lost(&self) -> UmdError {
        let reason = match self.status() {
            Ok(QueueStatus { fault: Some(f), .. }) => LostReason::Fault(f),
            Ok(s) => LostReason::DoorbellAborted(s.state),
            Err(e) => return e,
        };
        UmdError::QueueLost { queue: self.handle, reason }
    }

    pub(crate) fn wait_progress(&self, value: u64, timeout: Option<Duration>) -> Result<WaitOutcome, UmdError> {
        Ok(self.device.port.wait_progress(self.handle, value, timeout)?)
    }
}

/// The doorbell status a kernel-page word holds; a word that holds none is corrupt. (The
/// error is built only then: an eager `ok_or` built one, and dropped it, on every submission.)
fn doorbell_status_of(word: u64) -> Result<DoorbellStatus, UmdError> {
    match DoorbellStatus::from_word(word) {
        Some(status) => Ok(status),
        None => Err(UmdError::Corrupt { field: "doorbell status", value: word }),
    }
}

impl Drop for HwQueue {
    fn drop(&mut self) {
        let _ = self.device.port.destroy_hw_queue(self.handle);
    }
}

/// A queue's ring: its allocation and size, written through planned streams.
pub struct Ring {
    buffer: Buffer,
    bytes: u64,
}

impl Ring {
    /// GPU VA of the ring.
    pub fn va(&self) -> u64 {
        self.buffer.va()
    }
    /// Its size in bytes (a power of two).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
    /// The allocation behind it.
    pub fn buffer(&self) -> &Buffer {
        &self.buffer
    }
    /// Where `dwords` dwords go if written at `wptr` ([`abi::ring::plan_write`]): `NOP`
    /// padding up to the ring's end when they would straddle it, the packets' offset and the
    /// wptr after them. A stream longer than half the ring is refused
    /// ([`UmdError::TooLarge`]). The caller must wait until `plan.new_wptr - rptr <=
    /// bytes()` before writing, or it overwrites packets the engine has not read.
    pub fn plan(&self, wptr: u64, dwords: u64) -> Result<WritePlan, UmdError> {
        ring::plan_write(wptr, self.bytes, dwords).ok_or_else(|| UmdError::TooLarge {
            dwords: usize::try_from(dwords).unwrap_or(usize::MAX),
            ring_bytes: self.bytes,
            max: self.bytes / 8,
        })
    }
    /// Writes a planned stream: the padding at `wptr`, then `parts` back to back. Publishing
    /// the new wptr is the next step ([`UserQueue::ring_doorbell`]).
    pub fn write(&self, wptr: u64, plan: &WritePlan, parts: &[&[u32]]) -> Result<(), UmdError> {
        Ok(ring::write_stream(self.buffer.map(), self.bytes, wptr, plan, parts)?)
    }
    /// Reads `out.len()` dwords at ring offset `offset` (taken modulo the ring size).
    pub fn read(&self, offset: u64, out: &mut [u32]) -> Result<(), UmdError> {
        Ok(self.buffer.map().read_u32s(offset % self.bytes, out)?)
    }
}

/// A queue's doorbell: its handle, the CPU page the kernel rotates, the queue's word in it
/// and how to ring it. Destroyed on drop.
pub struct Doorbell {
    device: Arc<DeviceInner>,
    handle: DoorbellHandle,
    page: Arc<RotatingPage>,
    word: Word,
    method: RingMethod,
    /// The aggregated doorbell and this queue's engine's word and value, rung after ours when the device
    /// needs it.
    aggregated: Option<(Word, u64)>,
    /// Its GPU VA in the process's address space, where the device lets queues ring it.
    gpu_va: Option<u64>,
    /// The aggregated doorbell word's GPU VA, where the device maps that page.
    aggregated_gpu_va: Option<u64>,
}

impl Doorbell {
    /// The kernel handle.
    pub fn handle(&self) -> DoorbellHandle {
        self.handle
    }
    /// `DoorbellCPUVirtualAddress`: the page the kernel rotates between the BAR (connected) and
    /// a dummy page (disconnected), so a late ring never reaches another queue's doorbell.
    pub fn cpu_page(&self) -> &Arc<RotatingPage> {
        &self.page
    }
    /// This queue's doorbell word in [`Doorbell::cpu_page`].
    pub fn word(&self) -> &Word {
        &self.word
    }
    /// How to ring it: store wptr into a dedicated doorbell, or set the queue's bit of the
    /// global doorbell.
    pub fn method(&self) -> RingMethod {
        self.method
    }
    /// The aggregated doorbell word and this queue's engine's word and value, when the device misses
    /// rings of queues without a hardware slot (spec 001).
    pub fn aggregated(&self) -> Option<(&Word, u64)> {
        self.aggregated.as_ref().map(|(w, mask)| (w, *mask))
    }
    /// Its GPU VA in the process's own address space, where another queue can ring it from
    /// the GPU by writing the new wptr (spec 001); `None` where the device does not allow it.
    pub fn gpu_va(&self) -> Option<u64> {
        self.gpu_va
    }
    /// The aggregated doorbell word's GPU VA (spec 001: the kernel maps the aggregated page
    /// "into each GPUVM space"), where a queue that rings this one from the GPU rings it too;
    /// `None` without an aggregated doorbell or where the device does not map it.
    pub fn aggregated_gpu_va(&self) -> Option<u64> {
        self.aggregated_gpu_va
    }
    /// As [`abi::protocol`]'s ring functions take it.
    fn bell(&self) -> protocol::Bell<'_, Word> {
        protocol::Bell { word: &self.word, method: self.method, aggregated: self.aggregated() }
    }
}

impl Drop for Doorbell {
    fn drop(&mut self) {
        let _ = self.device.port.destroy_doorbell(self.handle);
    }
}

/// The ring-control allocation and its typed view.
struct Control {
    view: RingControlView,
    _buffer: Buffer,
}

/// A user-mode queue's pieces: ring, ring control, doorbell, kernel page. See the module docs.
pub struct UserQueue {
    // Drop order is field order: the doorbell, then the queue, then the memory they used.
    doorbell: Doorbell,
    hw: HwQueue,
    ring: Ring,
    control: Control,
}

impl UserQueue {
    /// Creates a user-mode queue on `ctx` with a ring of `ring_bytes` (a power of two, 4 KiB
    /// to 16 MiB) and its doorbell, **not connected**: call [`UserQueue::connect`] before the
    /// first ring (a ring before it reaches the dummy page, and the status says
    /// `DisconnectedRetry`). The kernel picks the doorbell index.
    pub fn create(ctx: &Context, ring_bytes: u64, priority: Priority) -> Result<UserQueue, UmdError> {
        Self::create_with_doorbell(ctx, ring_bytes, priority, None)
    }

    /// [`UserQueue::create`] with the doorbell the application chose: an index in a doorbell
    /// page it allocated ([`crate::Device::create_doorbell_page`], spec 001), passed in the
    /// queue descriptor. `None`: as `create`.
    pub fn create_with_doorbell(
        ctx: &Context,
        ring_bytes: u64,
        priority: Priority,
        doorbell: Option<crate::DoorbellChoice>,
    ) -> Result<UserQueue, UmdError> {
        let device = crate::Device { inner: ctx.device.clone() };
        let port = &ctx.device.port;
        // Resident before the doorbell is created (spec 000 "Residency model").
        let ring = device.allocate(ring_bytes.max(ring::MIN_RING_BYTES))?;
        let control = device.allocate(RING_CONTROL_BYTES)?;
        let desc = QueueDescriptor {
            ring_va: ring.va(),
            ring_bytes,
            rptr_va: control.va() + RPTR_OFFSET,
            wptr_va: control.va() + WPTR_OFFSET,
            last_queued_va: control.va() + LAST_QUEUED_OFFSET,
            doorbell_index: doorbell.map_or(abi::queue::DOORBELL_INDEX_ANY, |d| d.index),
            priority: priority as u32,
            flags: 0,
            reserved: 0,
            context_save_va: 0,
            doorbell_page_va: doorbell.map_or(0, |d| d.page_va),
        };
        let info = port.create_hw_queue(ctx.handle, &HwQueueDesc { mode: SubmissionMode::UserMode(desc), priority })?;
        let hw = HwQueue::new(ctx.device.clone(), info)?;
        let db = port.create_doorbell(&CreateDoorbell {
            queue: hw.handle(),
            ring_buffer: ring.handle(),
            ring_control: control.handle(),
        })?;
        // Owned at once, so an error below destroys it (then `hw` destroys the queue).
        let handle = db.handle;
        let word = Word::new(&db.cpu_page, db.offset);
        let aggregated_gpu_va = db.aggregated.as_ref().and_then(|a| a.gpu_va);
        let aggregated = db.aggregated.map(|a| Word::new(&a.page, a.offset).map(|w| (w, a.mask))).transpose();
        let (word, aggregated) = match (word, aggregated) {
            (Ok(w), Ok(a)) => (w, a),
            (Err(e), _) | (_, Err(e)) => {
                let _ = port.destroy_doorbell(handle);
                return Err(e.into());
            }
        };
        let doorbell = Doorbell {
            device: ctx.device.clone(),
            handle,
            page: db.cpu_page,
            word,
            method: db.ring,
            aggregated,
            gpu_va: db.gpu_va,
            aggregated_gpu_va,
        };
        let view = RingControlView::new(control.mapping(), 0)?;
        Ok(UserQueue {
            doorbell,
            hw,
            ring: Ring { buffer: ring, bytes: ring_bytes },
            control: Control { view, _buffer: control },
        })
    }

    /// The queue's kernel handle.
    pub fn handle(&self) -> HwQueueHandle {
        self.hw.handle()
    }
    pub(crate) fn hw(&self) -> &HwQueue {
        &self.hw
    }
    /// Its engine.
    pub fn engine(&self) -> EngineId {
        self.hw.engine()
    }
    /// The ring.
    pub fn ring(&self) -> &Ring {
        &self.ring
    }
    /// Ring control: rptr (the engine's), wptr and last-queued (the client's).
    pub fn control(&self) -> &RingControlView {
        &self.control.view
    }
    /// GPU VA of the ring-control block (rptr, wptr and last-queued at their offsets).
    pub fn control_va(&self) -> u64 {
        self.control._buffer.va()
    }
    /// The doorbell: CPU page, word, ring method.
    pub fn doorbell(&self) -> &Doorbell {
        &self.doorbell
    }
    /// The queue's kernel page, mapped read-only: completed progress value, doorbell status,
    /// queue state.
    pub fn kernel_page(&self) -> &KernelPageView<ReadWord> {
        self.hw.kernel_page()
    }
    /// GPU VA of the completed progress value (read-only), for `WAIT` packets on other queues.
    pub fn progress_va(&self) -> u64 {
        self.hw.progress_va()
    }

    /// `D3DKMTConnectDoorbell`: connects the doorbell (after creation, and after a
    /// `DisconnectedRetry`). The kernel re-reads wptr when it connects, so work published
    /// while disconnected runs.
    pub fn connect(&self) -> Result<(), UmdError> {
        Ok(self.hw.device.port.connect_doorbell(self.hw.handle())?)
    }

    /// `D3DKMTNotifyWorkSubmission`, for a `ConnectedNotify` status.
    pub fn notify(&self) -> Result<(), UmdError> {
        Ok(self.hw.device.port.notify_work_submission(self.doorbell.handle)?)
    }

    /// Spec 000 steps 3 to 5: publishes `wptr` (release: the packets written before are
    /// visible first), rings the doorbell, fences (SeqCst) and returns the doorbell status.
    /// See the module docs for what each status asks of the caller.
    pub fn ring_doorbell(&self, wptr: u64) -> Result<DoorbellStatus, UmdError> {
        let word = protocol::ring_and_read_status(
            self.control.view.wptr_word(),
            &self.doorbell.bell(),
            self.hw.kernel_page().doorbell_status(),
            wptr,
        );
        doorbell_status_of(word)
    }

    /// The doorbell status word, read from the kernel page (SeqCst).
    pub fn doorbell_status(&self) -> Result<DoorbellStatus, UmdError> {
        self.hw.doorbell_status()
    }
    /// The completed progress value, read from the kernel page (acquire).
    pub fn completed(&self) -> u64 {
        self.hw.completed()
    }
    /// `USERQ QUERY_STATUS`: state, fault, completed and last-queued values.
    pub fn status(&self) -> Result<QueueStatus, UmdError> {
        self.hw.status()
    }
    /// The physical doorbell the queue holds now (`None` while disconnected).
    pub fn physical_doorbell(&self) -> Result<Option<PhysicalDoorbell>, UmdError> {
        Ok(self.hw.device.port.query_physical_doorbell(self.hw.handle())?)
    }
    /// A blocking kernel wait for the progress value (no memory spin first).
    pub fn wait_progress(&self, value: u64, timeout: Option<Duration>) -> Result<WaitOutcome, UmdError> {
        self.hw.wait_progress(value, timeout)
    }
    /// The error for a lost queue (after `DisconnectedAbort`): its fault record, or the state
    /// its doorbell was aborted in.
    pub fn lost(&self) -> UmdError {
        self.hw.lost()
    }
}
