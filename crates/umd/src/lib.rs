//! # umd — the user-mode driver
//!
//! What an application links. It talks to the kernel only through an
//! [`abi::port::KernelPort`] (the control path) and to the device only through `abi` layouts
//! in shared memory (the data path); it never sees `gpu` or `kernel` internals.
//!
//! - [`Device`]: a device opened on a port, with its memory ([`Buffer`]).
//! - [`Context`]: a hardware context on one engine.
//! - [`Queue`]: a hardware queue, user-mode (ring + doorbell, spec 000 "user-mode work
//!   submission") or kernel-mode (each submission a kernel call, the traditional path).
//! - [`lowlevel::UserQueue`]: the pieces of a user-mode queue (ring, ring control, doorbell
//!   CPU page, kernel page) as typed views, created without connecting, for people writing
//!   their own submission loop; [`Queue`] is built on it.
//! - [`CommandBuffer`]: one typed method per packet of [`abi::packet`].
//! - Compute programs come from crate `program` (the builder, the `.dbk` assembler, the
//!   example programs; `docs/isa.md`): [`Device::upload`] puts a binary's bytes in GPU memory
//!   and [`CommandBuffer::dispatch`] runs it.
//!
//! Background processing (spec 004: the runtime's pool, `SetBackgroundProcessingMode`,
//! profile-guided specialization) is crate `runtime`, built on this one; the driver knows
//! nothing of it.
//!
//! The user-mode submission loop follows spec 000's order exactly; see [`Queue::submit`].
//! Waits check memory first and enter the kernel only when the value has not been reached.
//! The ring never overwrites bytes the engine has not read: a full ring waits for rptr.
//!
//! # Quick start
//!
//! A [`Device`] opens on a [`KernelPort`]: the control path to a kernel. There are three
//! places one comes from, and the rest of the code is the same for all of them. The `abi`
//! types a client names ([`EngineKind`], [`Priority`], [`NativeFenceType`], [`WaitMode`],
//! [`DoorbellStatus`], [`QueueState`], [`KernelError`]) are re-exported here, so a client of
//! a daemon needs only `umd` and `wire`. Runnable versions: `cargo run -p umd --example
//! embedded_live` (and `embedded_sim`, `lowlevel_loop`), in `crates/umd/examples/`, and
//! `cargo run -p wire --example daemon_client`.
//!
//! **Embedded, on the live driver** (crates `umd` and `kernel`): the virtual GPU runs in this
//! process on its own threads, in real time.
//!
//! ```
//! use std::time::Duration;
//! use kernel::{System, SystemConfig};
//! use umd::{CommandBuffer, Device, EngineKind, QueueOptions};
//!
//! let sys = System::live(SystemConfig::default())?;
//! let dev = Device::open(sys.open_process()?)?;
//! let ctx = dev.create_context(dev.engine(EngineKind::Compute)?)?;
//! let buf = dev.allocate(4096)?;
//! let mut q = ctx.create_queue(QueueOptions::user_mode())?;
//! let mut cb = CommandBuffer::new();
//! cb.write_u32(buf.va(), 42).timestamp(buf.va() + 8);
//! let done = q.submit(&cb)?; // memory writes and a doorbell: no kernel call
//! q.wait(done, Some(Duration::from_secs(5)))?;
//! assert_eq!(buf.read_u32(0)?, 42);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! **Embedded, on the deterministic driver** (crates `umd` and `kernel`): the same stack on
//! virtual time, stepped by this thread; a wait advances device time until it is satisfied,
//! so every run is identical. What tests and the simulator use.
//!
//! ```
//! use std::time::Duration;
//! use kernel::{System, SystemConfig};
//! use umd::{CommandBuffer, Device, EngineKind, NativeFenceType, QueueOptions};
//!
//! let sys = System::sim(SystemConfig::default())?;
//! let dev = Device::open(sys.open_process()?)?;
//! let ctx = dev.create_context(dev.engine(EngineKind::Copy)?)?;
//! let fence = dev.create_fence(0, NativeFenceType::Default)?;
//! let mut q = ctx.create_queue(QueueOptions::user_mode())?;
//! let mut cb = CommandBuffer::new();
//! cb.synthetic(50_000).signal_fence(&fence, 1); // 50 µs of device work, then the fence
//! q.submit(&cb)?;
//! fence.wait(1, Some(Duration::from_secs(1)))?;
//! assert!(sys.now().as_nanos() >= 50_000, "device time advanced by the work");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! **A client of a running daemon** (crates `umd` and `wire`): `doorbell serve` hosts the
//! GPU; `wire::client::connect` (or `wire::client::connect_default`: `$DOORBELL_SOCKET`,
//! else the daemon's default path) gives the port over its socket, from the transport's
//! crate, and [`Device::open`] opens a device on it. Rings and waits still go through shared
//! memory; only control calls cross the socket. (Not compiled here, since `umd` does not
//! depend on `wire`; the same code is compiled in `wire::client`'s documentation.)
//!
//! ```ignore
//! use umd::{CommandBuffer, Device, EngineKind, QueueOptions};
//!
//! let dev = Device::open(wire::client::connect(std::path::Path::new("/tmp/doorbell.sock"))?)?;
//! let ctx = dev.create_context(dev.engine(EngineKind::Compute)?)?;
//! let mut q = ctx.create_queue(QueueOptions::user_mode())?;
//! let buf = dev.allocate(4096)?;
//! let done = q.submit(CommandBuffer::new().write_u32(buf.va(), 7))?;
//! q.wait(done, None)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # The idle period, and what a client does after it
//!
//! An engine with no work for its idle period (`gpu::GpuConfig::idle_period`, 20 ms by
//! default; `idle_period_ms` in a daemon's configuration) asks for F1, and the kernel first
//! disconnects every doorbell of the engine's queues (spec 000 "Engine F-state
//! transitions"). The next ring then reads [`DoorbellStatus::DisconnectedRetry`].
//! [`Queue::submit`] handles it: it connects again (one kernel call, which brings the engine
//! back to F0 and re-reads wptr) and rings again, so the first submission after an idle
//! spell costs a kernel call and nothing is lost. A loop written on [`lowlevel::UserQueue`]
//! must do the same: on `DisconnectedRetry` call [`lowlevel::UserQueue::connect`] and ring
//! again; on `DisconnectedAbort` the queue is lost ([`lowlevel::UserQueue::lost`] says why).
#![forbid(unsafe_code)]

mod command;
mod device;
mod fence;
mod inner;
pub mod lowlevel;
mod queue;

pub use command::{CommandBuffer, GpuKick};
pub use device::{Buffer, Context, Device, DoorbellChoice, DoorbellPage};
pub use fence::NativeFence;
pub use queue::{Queue, QueueOptions, SubmissionKind};

pub use abi::port::{KernelError, KernelPort, NativeFenceType, WaitMode};
pub use abi::{DoorbellStatus, EngineKind, Priority, QueueState};

/// What the user-mode driver can report.
#[derive(Debug, thiserror::Error)]
pub enum UmdError {
    /// A kernel call failed.
    #[error(transparent)]
    Kernel(KernelError),
    /// The queue can run no more work (doorbell `DisconnectedAbort`, a fault, or device loss).
    #[error("{queue} is lost: {reason}; destroy it and create a new one (or fall back to kernel-mode submission)")]
    QueueLost {
        /// The queue.
        queue: abi::HwQueueHandle,
        /// Why, as data (a fault record, destruction, an aborted doorbell).
        reason: abi::port::LostReason,
    },
    /// A command buffer longer than half the ring.
    #[error("command buffer of {dwords} dwords does not fit a ring of {ring_bytes} bytes (at most {max} dwords)")]
    TooLarge {
        /// Its length, with the progress fence.
        dwords: usize,
        /// Ring size.
        ring_bytes: u64,
        /// The limit.
        max: u64,
    },
    /// A wait timed out.
    #[error("timed out waiting for progress value {value} on {queue} (completed: {completed})")]
    Timeout {
        /// The queue.
        queue: String,
        /// Value waited for.
        value: u64,
        /// Value completed when the wait gave up.
        completed: u64,
    },
    /// A CPU read or wait on an `IntraGpu` fence, which has no CPU access.
    #[error("{fence} is an IntraGpu fence: it has no CPU access (wait on it from the GPU)")]
    NoCpuAccess {
        /// The fence.
        fence: String,
    },
    /// A fence wait timed out.
    #[error("timed out waiting on {fences} fence(s)")]
    FenceTimeout {
        /// How many fences the wait named.
        fences: usize,
    },
    /// A value read from shared memory that the kernel never writes.
    #[error("{field} holds {value:#x}, which is not a valid value")]
    Corrupt {
        /// The word.
        field: &'static str,
        /// What it held.
        value: u64,
    },
    /// An engine that does not exist or lacks the requested submission model.
    #[error("no {what}")]
    NoEngine {
        /// What was asked for.
        what: String,
    },
    /// Shared memory access failed (an offset outside a buffer).
    #[error("shared memory: {0}")]
    Shm(#[from] shm::ShmError),
    /// The command buffer is in the ring and published (it has its progress value), but its
    /// doorbell was disconnected and reconnecting it failed: the engine was not told. It is
    /// not lost: it runs once the doorbell is connected and rung again — [`Queue::ring`], or
    /// the next submission, which does both — or when the kernel binds the queue's doorbell
    /// anew. Wait for `value` only after one of those. (Found by `doorbell sim swarm`: a
    /// failed reconnect used to look like a refused submission whose work then ran anyway.)
    #[error(
        "command buffer {value} on {queue} is published but not rung: reconnecting its doorbell failed ({source}); call Queue::ring, or submit again, before waiting for it"
    )]
    NotRung {
        /// The queue.
        queue: abi::HwQueueHandle,
        /// The command buffer's progress value.
        value: u64,
        /// Why the reconnect failed.
        source: Box<UmdError>,
    },
}

impl From<KernelError> for UmdError {
    /// A lost queue is reported the same way whether the kernel or the doorbell status said so.
    fn from(e: KernelError) -> Self {
        match e {
            KernelError::QueueLost { queue, reason } => UmdError::QueueLost { queue, reason },
            e => UmdError::Kernel(e),
        }
    }
}
