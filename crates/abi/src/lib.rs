//! # abi — the contract every actor shares
//!
//! This crate is doorbell's "uapi header": the bytes and calls that cross a boundary between
//! the user-mode driver (`umd`), the kernel (`kernel`) and the virtual device (`gpu`). Nothing
//! here has behaviour beyond encoding, decoding and validating; each actor owns its own logic.
//!
//! - [`packet`]: packet encoding version 1, the command stream an engine executes
//!   (spec 001 "a ring buffer ... IP specific packets"; spec 000 "write the command buffer's
//!   address into the ring", our `INDIRECT_BUFFER`).
//! - [`ring`]: the ring buffer control block — rptr, wptr and the last-queued progress value
//!   (spec 000 "HW queue progress fence changes"), each on its own cache line.
//! - [`doorbell`]: the doorbell word and the doorbell status values (spec 000
//!   `D3DDDI_DOORBELL_STATUS_*`), and the doorbell page geometry (spec 001: 4 KiB, 512 × 64-bit).
//! - [`queue`]: the queue descriptor a client passes at creation (amdgpu's MQD in the USERQ
//!   ioctl), queue states, priorities, and the per-queue kernel page that holds the progress
//!   fence and the doorbell status (read-only to user mode).
//! - [`fence_log`]: native fence log buffers, their header and entries.
//! - [`isa`]: the compute ISA, version 1 — kernel binary format, instruction encoding and the
//!   validator every kernel passes before it runs.
//! - [`handle`]: generation-checked typed handles, owned by one process.
//! - [`protocol`] and [`sync`]: the doorbell-versus-disconnect protocol that every actor
//!   runs, written once against a `sync` shim so loom can check it (`--cfg loom`).
//! - [`time`] and [`power`]: device time and engine power states, the vocabulary every state
//!   machine takes as input.
//! - [`preempt`]: preemption granularity levels and the device's preemption caps (spec 003).
//! - [`slab`]: the generation-checked table behind every handle (kernel objects, firmware
//!   queues).
//! - [`port`]: the [`port::KernelPort`] trait — the system-call surface the UMD uses — with its
//!   argument types and its error enum.
//!
//! Invariants: every shared-memory layout is `#[repr(C)]` with `const` size and offset
//! assertions, so a layout change is a compile error rather than a silent ABI break, and is
//! reached through a typed view ([`ring::RingControlView`], [`queue::KernelPageView`],
//! [`doorbell::DoorbellBar`]) whose words are checked once, so no caller handles an offset. Values
//! read from another actor's memory are decoded through checked constructors
//! ([`packet::Packet::decode`], [`doorbell::DoorbellStatus::from_word`],
//! [`queue::QueueState::from_word`]) that never panic.
#![forbid(unsafe_code)]

pub mod doorbell;
pub mod fence_log;
pub mod handle;
pub mod isa;
pub mod packet;
pub mod port;
pub mod power;
pub mod preempt;
pub mod protocol;
pub mod queue;
pub mod ring;
pub mod slab;
pub mod sync;
pub mod time;

/// `&'static str` fields across the daemon socket: the bounded interner of `shm`.
#[cfg(feature = "serde")]
#[doc(hidden)]
pub mod serde_str {
    pub use shm::serde_str::de;
}

pub use doorbell::DoorbellStatus;
pub use handle::{
    AllocationHandle, ContextHandle, DeviceHandle, DoorbellHandle, DoorbellPageHandle, Handle, HwQueueHandle,
    NativeFenceHandle, ProcessId,
};
pub use packet::{Opcode, Packet};
pub use power::{EngineState, PowerState};
pub use queue::{EngineId, EngineKind, Priority, QueueDescriptor, QueueState};
/// `&'static str`, as typed errors spell their field names (see [`shm::StaticStr`]).
pub use shm::StaticStr;
pub use time::Time;
