//! What a system call can refuse: [`KernelError`] and the data its variants carry.
//!
//! Every refusal is data, not text: the field or handle refused, and why ([`Invalid`],
//! [`DeviceRefusal`], [`LostReason`], [`InUseBy`]). `Display` writes the sentence a user
//! reads; the daemon's socket carries the data itself, so a client of the daemon gets the
//! same error the embedded mode returns.

use thiserror::Error;

use super::fence::NativeFenceType;
use crate::handle::{AnyHandle, DeviceHandle, DoorbellHandle, HwQueueHandle, ProcessId};
use crate::packet::DecodeError;
use crate::queue::{EngineKind, FaultRecord, QueueState};

/// Why a handle was refused.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandleProblem {
    /// It belongs to another process.
    Foreign {
        /// Its owner.
        owner: ProcessId,
    },
    /// Its object was destroyed (the slot may hold a newer object).
    Stale,
    /// It never named an object.
    Unknown,
}

impl core::fmt::Display for HandleProblem {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            HandleProblem::Foreign { owner } => write!(f, "belongs to process {owner}"),
            HandleProblem::Stale => f.write_str("was destroyed"),
            HandleProblem::Unknown => f.write_str("does not exist"),
        }
    }
}

/// Why an argument was refused, as data. `Display` is the sentence the error message uses
/// after the field and value (`` `field` = value: <reason> ``).
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Invalid {
    /// An allocation size outside 1 byte ..= `max` bytes.
    Size {
        /// The largest allowed.
        max: u64,
    },
    /// The device has no such engine.
    NoSuchEngine {
        /// How many engines it has.
        engines: usize,
    },
    /// The engine does not offer this (`"user-mode queues"`, `"kernel-mode queues"`).
    Unsupported(#[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))] crate::StaticStr),
    /// An address not aligned as required.
    Misaligned {
        /// The required alignment in bytes.
        align: u64,
    },
    /// An address in a mapping the GPU may only read, where it must write.
    GpuReadOnly,
    /// A ring size the protocol refuses.
    RingSize(crate::ring::RingSizeError),
    /// A priority outside `Priority`.
    PriorityRange,
    /// A doorbell index outside the engine's share of the page.
    OutsideEngineDoorbells {
        /// The engine.
        engine: EngineKind,
        /// Its first index.
        first: u32,
        /// One past its last.
        end: u32,
    },
    /// A doorbell index outside the process's doorbell page.
    OutsideDoorbellPage {
        /// Doorbells in the page.
        doorbells: u32,
    },
    /// Already used by this queue.
    UsedBy(HwQueueHandle),
    /// Every value of a range is in use (what ran out, and the range).
    Exhausted {
        /// The range's first value.
        first: u32,
        /// One past its last.
        end: u32,
    },
    /// The queue already has a doorbell.
    HasDoorbell,
    /// The queue has no doorbell (create one first).
    NoDoorbell,
    /// The allocation does not hold the queue's `what` at `va`.
    DoesNotHold {
        /// What it should hold ("ring", "rptr", ...).
        #[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))]
        what: crate::StaticStr,
        /// Where.
        va: u64,
    },
    /// The context is already suspended.
    AlreadySuspended,
    /// The context is not suspended.
    NotSuspended,
    /// A kernel-mode queue has no fence log.
    NoFenceLog,
    /// The `SIGNAL`/`WAIT` log flag on a kernel-mode submission.
    LogFlagOnKernelQueue,
    /// A `SIGNAL` with the native-fence flag whose address is not a native fence.
    NotANativeFence,
    /// A field that must be zero.
    MustBeZero,
    /// `DISPATCH` dimensions the ISA refuses (the reason).
    Dims(#[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))] crate::StaticStr),
    /// A kernel-mode submission's length outside 1 ..= `max_dwords`.
    SubmissionSize {
        /// The largest allowed.
        max_dwords: u64,
    },
    /// Native fences of this kind need an adapter with native fences.
    NoNativeFences,
    /// A cross-adapter fence must be of this type on this adapter.
    CrossAdapterKind {
        /// The allowed type.
        allowed: NativeFenceType,
    },
    /// The adapter is not part of a multi-adapter machine.
    SingleAdapter,
    /// The global or cross-adapter handle names no fence.
    NoSuchFence,
    /// The fence was not created shareable.
    NotShareable,
    /// The value is reserved (a device in error's AlwaysSignaled).
    Reserved,
    /// A wait must name at least one fence.
    EmptyWait,
    /// An IntraGpu fence has no CPU access.
    NoCpuAccess,
    /// The fence was destroyed while waited on.
    DestroyedWhileWaited,
    /// An adapter without native fences takes kernel-mode queues only.
    NeedsKernelOnly,
    /// The global doorbell model has no dedicated doorbells to pool.
    NothingToPool,
    /// A setting outside the range it may take.
    OutOfRange {
        /// The range it may take.
        #[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))]
        expected: crate::StaticStr,
    },
    /// The device (its kernel-mode driver) refused, with its reason.
    Device(DeviceRefusal),
    /// A progress point past the queue's last-queued value (work not yet submitted).
    BeyondQueued {
        /// The queue's last-queued value.
        last_queued: u64,
    },
    /// An object of another process.
    OtherProcess,
    /// A VA that names none of the doorbell pages a queue of this device may use: the
    /// process's own (0), or one the process allocated on the same device.
    NoDoorbellPage,
    /// Memory of another device of the process: a queue runs only from its own device's
    /// allocations.
    OtherDevice,
}

impl core::fmt::Display for Invalid {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        use Invalid::*;
        match self {
            Size { max } => write!(f, "must be between 1 and {max} bytes"),
            NoSuchEngine { engines } => write!(f, "the device has {engines} engines"),
            Unsupported(what) => write!(f, "does not support {what}"),
            BeyondQueued { last_queued } => write!(f, "is past the queue's last-queued value {last_queued}"),
            OtherProcess => f.write_str("belongs to another process"),
            NoDoorbellPage => {
                f.write_str("names no doorbell page of the process on the queue's device (create_doorbell_page)")
            }
            OtherDevice => f.write_str("lies in an allocation of another device (a queue runs from its own device's)"),
            Misaligned { align } => write!(f, "must be {align}-byte aligned"),
            GpuReadOnly => f.write_str("lies in a mapping the GPU may not write"),
            RingSize(why) => write!(f, "{why}"),
            PriorityRange => f.write_str("must be 0 (low) to 4 (realtime)"),
            OutsideEngineDoorbells { engine, first, end } => {
                write!(f, "lies outside the {engine} engine's doorbell range {first}..{end} of the page")
            }
            OutsideDoorbellPage { doorbells } => {
                write!(f, "lies outside the process's doorbell page (0..{doorbells})")
            }
            UsedBy(q) => write!(f, "already used by {q}"),
            Exhausted { first, end } => write!(f, "all of {first}..{end} are in use"),
            HasDoorbell => f.write_str("already has a doorbell"),
            NoDoorbell => f.write_str("has no doorbell: create one first"),
            DoesNotHold { what, va } => write!(f, "does not hold the queue's {what} at {va:#x}"),
            AlreadySuspended => f.write_str("is already suspended"),
            NotSuspended => f.write_str("is not suspended"),
            NoFenceLog => f.write_str("is a kernel-mode queue: it has no fence log"),
            LogFlagOnKernelQueue => {
                f.write_str("kernel-mode queues have no fence log (their fences are software operations of the kernel)")
            }
            NotANativeFence => f.write_str("carries the native-fence flag but is not a native fence of the process"),
            MustBeZero => f.write_str("must be 0"),
            Dims(why) => f.write_str(why),
            SubmissionSize { max_dwords } => write!(f, "a submission holds 1 to {max_dwords} dwords"),
            NoNativeFences => {
                f.write_str("this adapter has no native fences: create a monitored fence (LegacyMonitored)")
            }
            CrossAdapterKind { allowed } => {
                write!(f, "a cross-adapter fence must be of type {allowed:?} on this adapter")
            }
            SingleAdapter => f.write_str("this adapter is not part of a multi-adapter machine"),
            NoSuchFence => f.write_str("does not name a fence"),
            NotShareable => f.write_str("names a fence that was not created shareable: it cannot be opened"),
            Reserved => f.write_str("is reserved for a device in error (AlwaysSignaled)"),
            EmptyWait => f.write_str("a wait names at least one fence"),
            NoCpuAccess => f.write_str("is an IntraGpu fence: it has no CPU access, so a CPU cannot wait on it"),
            DestroyedWhileWaited => f.write_str("was destroyed while waited on"),
            NeedsKernelOnly => {
                f.write_str("an adapter without native fences takes kernel-mode queues only (KernelOnly)")
            }
            NothingToPool => {
                f.write_str("the device's doorbell model is global: there are no dedicated doorbells to pool")
            }
            OutOfRange { expected } => write!(f, "out of range: must be {expected}"),
            Device(why) => write!(f, "{why}"),
        }
    }
}

/// What a device (its kernel-mode driver) can refuse, as data in the kernel's terms: the
/// driver translates its device's errors into these, so no device type crosses the driver
/// boundary. [`Invalid::Device`] carries one after the field and value it concerns.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceRefusal {
    /// The device does not know the queue (never created there, or destroyed).
    UnknownQueue,
    /// The device has no address space for the process.
    NoAddressSpace,
    /// The device has no such engine.
    NoSuchEngine(u32),
    /// A GPU mapping that overlaps an existing one.
    MappingOverlap {
        /// Address.
        va: u64,
        /// Length.
        bytes: u64,
    },
    /// A GPU mapping outside its backing, or wrapping around the address space.
    BadMapping {
        /// Address.
        va: u64,
        /// Length.
        bytes: u64,
        /// Why.
        #[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))]
        why: crate::StaticStr,
    },
    /// A queue's memory does not resolve in its address space.
    QueueMemory(crate::queue::FaultKind),
    /// The client's wptr word holds an impossible starting value.
    BadStartPointer {
        /// The value found.
        wptr: u64,
    },
    /// A doorbell index outside the BAR.
    BadDoorbell {
        /// The index.
        index: u32,
        /// Doorbells in the BAR.
        count: u32,
    },
    /// The device has no global doorbell (its doorbell model is another).
    NoGlobalDoorbell {
        /// Its model.
        model: crate::doorbell::DoorbellModel,
    },
    /// A global-doorbell bit outside the page.
    NoGlobalDoorbellBit {
        /// The bit.
        bit: u32,
        /// Bits in the page.
        bits: u32,
    },
    /// More engines than an aggregated doorbell word can name.
    TooManyEngines {
        /// Engines configured.
        engines: usize,
        /// The most it can name.
        max: usize,
    },
    /// No pooled doorbell is free and none is connected to victimize.
    NoDoorbellToVictimize,
    /// A victimized doorbell did not return to the pool.
    VictimKeptDoorbell,
    /// Not a native fence of this device.
    NotANativeFence,
    /// A failure injected on purpose by a test (the DDI is the field's value).
    Injected {
        /// Which call of the DDI failed (1-based).
        call: u32,
    },
    /// The queue is not held off its engine for the kernel (never preempted, or hung).
    NotHeld,
    /// A take-back of a kernel ring's work outside what the engine allows.
    BadTakeBack {
        /// The wptr asked for.
        wptr: u64,
        /// The lowest allowed (the packet the queue resumes at, or just past it).
        floor: u64,
        /// The highest allowed (the last wptr the engine accepted).
        accepted: u64,
    },
    /// The device does not support what was asked.
    Unsupported(#[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))] crate::StaticStr),
    /// The hardware the device's engines run on (a GPU) refused or failed.
    Hardware(String),
}

impl core::fmt::Display for DeviceRefusal {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        use DeviceRefusal::*;
        match self {
            UnknownQueue => f.write_str("is not a queue of this device"),
            NoAddressSpace => f.write_str("has no address space on this device"),
            NoSuchEngine(n) => write!(f, "engine {n} does not exist"),
            MappingOverlap { va, bytes } => write!(f, "GPU mapping {va:#x}+{bytes:#x} overlaps an existing mapping"),
            BadMapping { va, bytes, why } => write!(f, "GPU mapping {va:#x}+{bytes:#x}: {why}"),
            QueueMemory(fault) => write!(f, "queue memory: {fault}"),
            BadStartPointer { wptr } => write!(
                f,
                "queue memory: the wptr word holds {wptr:#x}: a new queue needs a dword count below 2^62 (write 0 first)"
            ),
            BadDoorbell { index, count } => write!(f, "doorbell index {index} is outside the BAR ({count} doorbells)"),
            NoGlobalDoorbell { model } => {
                write!(f, "the device's doorbell model is {model}: it has no global doorbell")
            }
            NoGlobalDoorbellBit { bit, bits } => {
                write!(f, "global doorbell bit {bit} is outside the page ({bits} bits)")
            }
            TooManyEngines { engines, max } => {
                write!(f, "{engines} engines: an aggregated doorbell names at most {max}")
            }
            NoDoorbellToVictimize => f.write_str("no doorbell is free and none is connected to victimize"),
            VictimKeptDoorbell => f.write_str("the victim's doorbell did not come back"),
            NotANativeFence => f.write_str("is not a native fence of this device"),
            Injected { call } => write!(f, "failed (injected fault, call {call})"),
            NotHeld => f.write_str("is not held off its engine for the kernel"),
            BadTakeBack { wptr, floor, accepted } => {
                write!(f, "take back to wptr {wptr:#x}: allowed from {floor:#x} to {accepted:#x} on a kernel ring")
            }
            Unsupported(what) => write!(f, "the device does not support {what}"),
            Hardware(what) => write!(f, "the device's hardware: {what}"),
        }
    }
}

/// Why a queue can run no more work, as data: the fault record, or what else ended it.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LostReason {
    /// The device faulted it (the record the status query returns).
    Fault(FaultRecord),
    /// It was destroyed (its blocked waiters learn this).
    Destroyed,
    /// Its doorbell was aborted (`DisconnectedAbort`: process termination, device loss)
    /// while the queue was in this state.
    DoorbellAborted(QueueState),
    /// The buffer at `va` holding its ring, rptr, wptr or last-queued word lost its GPU
    /// mapping (a failed migration): the queue reports `InvalidVa` and runs no more work.
    InvalidVa {
        /// The buffer's GPU VA.
        va: u64,
    },
}

impl core::fmt::Display for LostReason {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            LostReason::Fault(r) => write!(f, "{r}"),
            LostReason::Destroyed => f.write_str("destroyed"),
            LostReason::DoorbellAborted(s) => write!(f, "doorbell aborted (queue {s:?})"),
            LostReason::InvalidVa { va } => write!(f, "its ring memory at {va:#x} lost its GPU mapping"),
        }
    }
}

/// What a refused call found still in use ([`KernelError::InUse`]).
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InUseObject {
    /// An object of a process.
    Handle(AnyHandle),
    /// The device (the adapter) as a whole.
    Adapter,
}

impl core::fmt::Display for InUseObject {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            InUseObject::Handle(h) => write!(f, "{h}"),
            InUseObject::Adapter => f.write_str("the device"),
        }
    }
}

/// What holds an object in use ([`KernelError::InUse`]).
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InUseBy {
    /// This queue runs from it (its ring, pointers or metadata live there).
    Queue(HwQueueHandle),
    /// This doorbell references it; `queue` is the doorbell's queue.
    Doorbell {
        /// The doorbell.
        doorbell: DoorbellHandle,
        /// Its queue, when the doorbell is still listed.
        queue: Option<HwQueueHandle>,
    },
    /// This queue has work in flight (entering D3 needs an idle device).
    WorkInFlight(HwQueueHandle),
}

impl core::fmt::Display for InUseBy {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            InUseBy::Queue(q) => write!(f, "{q}, which runs from it"),
            InUseBy::Doorbell { queue: Some(q), .. } => write!(f, "the doorbell of {q}"),
            InUseBy::Doorbell { doorbell, queue: None } => write!(f, "{doorbell}"),
            InUseBy::WorkInFlight(q) => {
                write!(f, "{q} of {}, which has work in flight (D3 needs an idle device)", q.owner())
            }
        }
    }
}

#[cfg(test)]
mod error_display_tests {
    use super::*;
    use crate::handle::AllocationHandle;

    /// The errors that now carry data print the sentences they printed as text.
    #[test]
    fn data_carrying_errors_read_as_their_text_did() {
        let q = HwQueueHandle::new(ProcessId(2), 1, 3);
        let a = AllocationHandle::new(ProcessId(2), 4, 1);
        let d = DoorbellHandle::new(ProcessId(2), 0, 2);
        let e = KernelError::BadHandle { handle: q.into(), problem: HandleProblem::Stale };
        assert_eq!(e.to_string(), "queue#1.g3@p2: handle was destroyed");
        let e = KernelError::InUse { object: InUseObject::Handle(a.into()), by: InUseBy::Queue(q) };
        assert_eq!(e.to_string(), "allocation#4.g1@p2 is in use by queue#1.g3@p2, which runs from it");
        let e = KernelError::InUse {
            object: InUseObject::Handle(a.into()),
            by: InUseBy::Doorbell { doorbell: d, queue: Some(q) },
        };
        assert_eq!(e.to_string(), "allocation#4.g1@p2 is in use by the doorbell of queue#1.g3@p2");
        let e = KernelError::InUse { object: InUseObject::Adapter, by: InUseBy::WorkInFlight(q) };
        assert_eq!(
            e.to_string(),
            "the device is in use by queue#1.g3@p2 of p2, which has work in flight (D3 needs an idle device)"
        );
        let e = KernelError::InvalidArgument {
            field: "va",
            value: "0x1000+0x2000".into(),
            reason: Invalid::Device(DeviceRefusal::MappingOverlap { va: 0x1000, bytes: 0x2000 }),
        };
        assert_eq!(e.to_string(), "`va` = 0x1000+0x2000: GPU mapping 0x1000+0x2000 overlaps an existing mapping");
    }
}

/// Everything a kernel call can refuse. Each message names the field or handle and its value.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum KernelError {
    /// A foreign, stale or unknown handle.
    #[error("{handle}: handle {problem}")]
    BadHandle {
        /// The handle.
        handle: AnyHandle,
        /// What is wrong with it.
        problem: HandleProblem,
    },
    /// An argument outside its domain.
    #[error("`{field}` = {value}: {reason}")]
    InvalidArgument {
        /// Field name.
        #[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))]
        field: crate::StaticStr,
        /// Value as text.
        value: String,
        /// Why, as data.
        reason: Invalid,
    },
    /// A GPU VA range that does not lie inside one mapping of the process.
    #[error("`{field}` = {va:#x} (+{bytes:#x} bytes) does not lie inside one mapping of the process")]
    OutsideMappings {
        /// Field name.
        #[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))]
        field: crate::StaticStr,
        /// Address.
        va: u64,
        /// Length.
        bytes: u64,
    },
    /// An object is still referenced.
    #[error("{object} is in use by {by}")]
    InUse {
        /// The object.
        object: InUseObject,
        /// What references it.
        by: InUseBy,
    },
    /// The queue cannot run work any more.
    #[error("{queue} is lost: {reason}")]
    QueueLost {
        /// The queue.
        queue: HwQueueHandle,
        /// Why.
        reason: LostReason,
    },
    /// A call for the other submission model.
    #[error("{queue} is a {actual} queue; this call needs a {expected} queue")]
    WrongQueueMode {
        /// The queue.
        queue: HwQueueHandle,
        /// What it is.
        #[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))]
        actual: crate::StaticStr,
        /// What the call needs.
        #[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))]
        expected: crate::StaticStr,
    },
    /// A pool ran dry.
    #[error("out of {what} ({detail})")]
    Exhausted {
        /// The pool.
        #[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))]
        what: crate::StaticStr,
        /// Details.
        detail: String,
    },
    /// A kernel-mode submission failed validation.
    #[error("command buffer: packet at dword {offset}: {error}")]
    BadPacket {
        /// Dword offset in the submission.
        offset: usize,
        /// Decode error.
        error: DecodeError,
    },
    /// A progress value that does not move forward.
    #[error("`{field}` = {value} does not move forward from {last}")]
    NotIncreasing {
        /// Field.
        #[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))]
        field: crate::StaticStr,
        /// Value given.
        value: u64,
        /// Last value.
        last: u64,
    },
    /// A fence log that does not decode (overrun is not corruption: it is reported as lost
    /// entries).
    #[error("{queue}: fence log: {reason}")]
    CorruptLog {
        /// The queue.
        queue: HwQueueHandle,
        /// Why.
        reason: crate::fence_log::LogError,
    },
    /// The device is in error (lost): its fences are always signalled and waits on them end
    /// with this error.
    #[error("{device} is lost (in error): its fences read as always signalled")]
    DeviceLost {
        /// The device.
        device: DeviceHandle,
    },
    /// The adapter recovered from timeouts more than `TdrLimitCount` times within
    /// `TdrLimitTime` and is lost for good: every device on it is lost, and it takes no new
    /// work.
    #[error("the adapter is lost: {recoveries} recoveries within {window_ms} ms exceed the TDR limit")]
    AdapterLost {
        /// Recoveries counted in the window.
        recoveries: u32,
        /// The window (`TdrLimitTime`, ms).
        window_ms: u64,
    },
    /// The process was terminated.
    #[error("process {0} has been terminated")]
    ProcessTerminated(ProcessId),
    /// Shared memory failed.
    #[error("shared memory: {0}")]
    Shm(#[from] shm::ShmError),
    /// Adapter initialization failed: the KMD and the OS disagree on a feature (spec 002: "The
    /// OS fails adapter initialization if KMD advertises native fence support when the OS
    /// hasn't enabled the feature").
    #[error("adapter initialization: {feature}: the KMD advertises {kmd}, the OS has {os}")]
    FeatureMismatch {
        /// The feature (or cap).
        #[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))]
        feature: crate::StaticStr,
        /// What the KMD advertised.
        kmd: String,
        /// What the OS enabled (or what the KMD's other caps imply).
        os: String,
    },
    /// A port answered a call with a reply of another call's kind ([`crate::port::Reply`]):
    /// a port that forwards calls to another process (the daemon's client, a recording port)
    /// and got an answer it cannot use. Refused as data, never a panic.
    #[error("the port answered `{call}` with a `{reply}` reply")]
    UnexpectedReply {
        /// The call ([`crate::port::Call::name`]).
        #[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))]
        call: crate::StaticStr,
        /// The reply's kind ([`crate::port::Reply::name`]).
        #[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))]
        reply: crate::StaticStr,
    },
}
