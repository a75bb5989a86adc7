//! What the device refuses ([`GpuError`]): a command naming a queue, address space, engine or
//! doorbell that does not exist, memory that does not resolve, a hardware failure. The kernel's
//! KMD translates each into the kernel's own terms; no `gpu` type crosses the DDI boundary.

use abi::doorbell::DoorbellModel;

#[cfg(doc)]
use crate::compute;
use crate::{FwQueueId, hw};

/// What a device command can refuse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GpuError {
    /// A queue id whose table entry is empty or reused.
    #[error("firmware queue {0} is stale or unknown")]
    StaleQueue(FwQueueId),
    /// An unknown address space.
    #[error("vmid {0} does not exist")]
    BadVmid(u32),
    /// An unknown engine.
    #[error("engine {0} does not exist")]
    BadEngine(u32),
    /// A mapping that overlaps another.
    #[error("GPU mapping {va:#x}+{bytes:#x} overlaps an existing mapping")]
    Overlap {
        /// Address.
        va: u64,
        /// Length.
        bytes: u64,
    },
    /// A mapping request outside its backing.
    #[error("GPU mapping {va:#x}+{bytes:#x}: {why}")]
    BadMapping {
        /// Address.
        va: u64,
        /// Length.
        bytes: u64,
        /// Why.
        why: &'static str,
    },
    /// A queue's memory does not resolve.
    #[error("queue memory: {0}")]
    QueueMemory(abi::queue::FaultKind),
    /// The client's wptr word holds an impossible starting value.
    #[error("queue memory: the wptr word holds {wptr:#x}: a new queue needs a dword count below 2^62 (write 0 first)")]
    BadStartPointer {
        /// The value found.
        wptr: u64,
    },
    /// A context save area smaller than the largest state a dispatch saves.
    #[error("queue memory: the context save area holds {bytes} bytes; a queue needs {need}")]
    SaveAreaTooSmall {
        /// Its size.
        bytes: u64,
        /// What a queue needs ([`compute::CONTEXT_SAVE_BYTES`]).
        need: u64,
    },
    /// A global-doorbell bit outside the page.
    #[error("global doorbell bit {bit} is outside the page ({bits} bits)")]
    NoGlobalDoorbellBit {
        /// The bit.
        bit: u32,
        /// Bits in the page.
        bits: u32,
    },
    /// More engines than an aggregated doorbell page has words.
    #[error("{engines} engines: an aggregated doorbell names at most {max}")]
    TooManyEngines {
        /// Engines configured.
        engines: usize,
        /// The most it can name.
        max: usize,
    },
    /// The device has no global doorbell (its model is dedicated).
    #[error("the device's doorbell model is {model}: it has no global doorbell")]
    NoGlobalDoorbell {
        /// The model.
        model: DoorbellModel,
    },
    /// A doorbell index outside the BAR.
    #[error("doorbell index {index} is outside the BAR ({count} doorbells)")]
    BadDoorbell {
        /// The index.
        index: u32,
        /// Doorbells in the BAR.
        count: u32,
    },
    /// Shared memory failed.
    #[error("shared memory: {0}")]
    Shm(#[from] shm::ShmError),
    /// The hardware the engines run on refused or failed ([`hw`]).
    #[error("hardware: {0}")]
    Hardware(#[from] hw::HwError),
    /// The queue is not held off the run list for the kernel (or it hung).
    #[error("firmware queue {0} is not held for the kernel")]
    NotHeld(FwQueueId),
    /// A take-back below the packet the queue resumes at, above what was accepted, or on a
    /// ring the kernel does not own.
    #[error(
        "take back to wptr {wptr:#x}: allowed from {floor:#x} to {accepted:#x} on a kernel-owned ring (privileged: {privileged})"
    )]
    BadTakeBack {
        /// The wptr asked for.
        wptr: u64,
        /// The lowest allowed.
        floor: u64,
        /// The highest (the last accepted).
        accepted: u64,
        /// Whether the ring is kernel-owned.
        privileged: bool,
    },
}
