//! What the fence calls take and answer (spec 002): native fence types and descriptions, a
//! created fence, CPU waits, `USERQ_WAIT`'s sync objects and wait points, and the two values a
//! fence holds.

use super::memory::{Local, Memory};
use crate::handle::{HwQueueHandle, NativeFenceHandle};

/// The CurrentValue a fence takes when its device is in error (AlwaysSignaled): every wait
/// passes. Reserved: the CPU cannot signal it.
pub const FENCE_ALWAYS_SIGNALED: u64 = u64::MAX;

/// `D3DDDI_NATIVEFENCE_TYPE`: where a native fence's CurrentValue lives.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NativeFenceType {
    /// System memory, readable by the CPU (user mode reads it; only the kernel writes it).
    Default,
    /// Device-local memory with no CPU access: CPU waits and reads are refused.
    IntraGpu,
    /// A legacy monitored fence: system memory, MonitoredValue pinned at 0, so every signal
    /// interrupts (the behaviour native fences improve on; kept for comparison).
    LegacyMonitored,
}

/// What native fence to create.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NativeFenceDesc {
    /// Initial CurrentValue.
    pub initial: u64,
    /// Storage type.
    pub kind: NativeFenceType,
    /// Shareable fences get pages of their own (sharing itself comes with global handles).
    pub shareable: bool,
    /// A cross-adapter fence (spec 002 "Cross-adapter native fences"): its CurrentValue lives
    /// in system memory every adapter maps, its MonitoredValue stays 0 (every signal
    /// interrupts, so the OS can propagate it), and other adapters open it by its
    /// cross-adapter handle. Its type must be `Default` (or `LegacyMonitored`, a monitored
    /// fence, on an adapter without native fences).
    pub cross_adapter: bool,
}

impl NativeFenceDesc {
    /// A fence of `kind` starting at `initial`, neither shareable nor cross-adapter.
    pub const fn new(initial: u64, kind: NativeFenceType) -> Self {
        NativeFenceDesc { initial, kind, shareable: false, cross_adapter: false }
    }
}

/// A created native fence. Its CurrentValue page is shared memory, a `P`: in-process a
/// mapping ([`Memory::Mapping`]).
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NativeFenceInfo<P = <Local as Memory>::Mapping> {
    /// Its handle.
    pub handle: NativeFenceHandle,
    /// GPU VA of its CurrentValue (for `SIGNAL` with the fence flag and `WAIT`).
    pub va: u64,
    /// Read-only CPU mapping of the page holding CurrentValue (`None` for `IntraGpu`).
    pub cpu: Option<P>,
    /// Offset of CurrentValue in `cpu`.
    pub offset: u64,
    /// For a shareable fence, the global handle another process passes to
    /// [`open_native_fence`](crate::port::KernelPort::open_native_fence).
    pub global: Option<u64>,
    /// Its storage type. A cross-adapter fence opened on an adapter without native fences is
    /// a monitored fence there (`LegacyMonitored`).
    pub kind: NativeFenceType,
    /// For a cross-adapter fence, the handle another adapter's device passes to
    /// [`open_cross_adapter_fence`](crate::port::KernelPort::open_cross_adapter_fence).
    pub cross_adapter: Option<u64>,
}

/// How a multi-fence wait is satisfied.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitMode {
    /// Every fence reaches its value.
    All,
    /// Any one does.
    Any,
}

/// How a wait ended.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitOutcome {
    /// The value was reached; carries the completed value seen.
    Reached(u64),
    /// The timeout passed first.
    TimedOut,
}

/// A sync object a user-mode queue waits on through `USERQ_WAIT` (spec 001): a native fence,
/// or a queue's progress fence — a kernel-mode queue's included, which is how user and kernel
/// queues interoperate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum SyncWait {
    /// A native fence reaching `value`.
    Fence {
        /// The fence.
        fence: NativeFenceHandle,
        /// The value.
        value: u64,
    },
    /// A queue's progress fence reaching `value`.
    QueueProgress {
        /// The queue (user- or kernel-mode).
        queue: HwQueueHandle,
        /// The progress value.
        value: u64,
    },
}

/// What `USERQ_WAIT` answers for one sync object: the GPU VA the queue's `WAIT` packet reads
/// and the value it waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct WaitPoint {
    /// GPU VA of the 64-bit value (readable by the queue's engine).
    pub va: u64,
    /// The value to wait for (`WAIT` passes when the word is at least this).
    pub value: u64,
}

/// A native fence's two values
/// ([`query_native_fence`](crate::port::KernelPort::query_native_fence)).
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NativeFenceValues {
    /// CurrentValue: the last value signalled.
    pub current: u64,
    /// MonitoredValue: the lowest value a CPU waits for, minus 1; `u64::MAX` with no waiter;
    /// 0 for a fence whose every signal interrupts (legacy monitored, cross-adapter).
    pub monitored: u64,
}
