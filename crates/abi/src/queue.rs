//! Queues: the descriptor a client passes at creation, states, priorities, the kernel page,
//! and fault records.
//!
//! The [`QueueDescriptor`] is the amdgpu MQD as the USERQ ioctl takes it: GPU virtual addresses
//! of the ring, rptr and wptr, the ring size and the doorbell index in the process's doorbell
//! page. The kernel validates it (spec 001 "The kernel driver then validates the MQD") and the
//! firmware keeps its own copy.
//!
//! The [`QueueKernelPage`] is one page per queue that the kernel owns and the client maps
//! read-only, on the CPU and in its GPU address space:
//!
//! | offset | field                | writer                                  |
//! |--------|----------------------|-----------------------------------------|
//! | 0      | `progress_completed` | the engine, by `PROGRESS_FENCE` only    |
//! | 64     | `doorbell_status`    | the kernel ([`crate::DoorbellStatus`])   |
//! | 128    | `queue_state`        | the kernel ([`QueueState`])              |
//!
//! This is amdgpu's "protected fence": memory only privileged clients can write, that user
//! queues can read (spec 001 "Special Packets").

use core::fmt;
use core::mem::{offset_of, size_of};

use crate::ring::CacheLine;

/// Index of an engine of the device.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EngineId(pub u32);

impl fmt::Display for EngineId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "engine{}", self.0)
    }
}

/// What an engine is.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EngineKind {
    /// Compute engine (will also run `DISPATCH`).
    Compute,
    /// Copy (DMA/SDMA) engine.
    Copy,
    /// A video engine (amdgpu VCN): runs the non-compute packets, and takes kernel-mode queues
    /// only — spec 001: "a GPU may support user queues for GFX, compute, and SDMA, but not for
    /// VCN, JPEG, and VPE".
    Video,
}

impl EngineKind {
    /// Whether the hardware can run user-mode queues on this kind of engine (its firmware
    /// hears doorbells from user queues). The KMD reports it per engine in INFO.
    pub const fn supports_user_queues(self) -> bool {
        match self {
            EngineKind::Compute | EngineKind::Copy => true,
            EngineKind::Video => false,
        }
    }
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EngineKind::Compute => "compute",
            EngineKind::Copy => "copy",
            EngineKind::Video => "video",
        })
    }
}

/// Firmware priority levels (amdgpu MES: low, normal, medium, high, realtime = 0..4).
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[repr(u32)]
pub enum Priority {
    /// 0.
    Low = 0,
    /// 1.
    #[default]
    Normal = 1,
    /// 2.
    Medium = 2,
    /// 3.
    High = 3,
    /// 4.
    Realtime = 4,
}

impl Priority {
    /// Decodes a level; `None` above 4.
    pub const fn from_u32(v: u32) -> Option<Priority> {
        Some(match v {
            0 => Priority::Low,
            1 => Priority::Normal,
            2 => Priority::Medium,
            3 => Priority::High,
            4 => Priority::Realtime,
            _ => return None,
        })
    }
}

/// Queue states (`AMDGPU_USERQ_STATE_*`).
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u64)]
pub enum QueueState {
    /// Not on the firmware's run list.
    Unmapped = 0,
    /// On the run list.
    Mapped = 1,
    /// Taken off a hardware slot with its state saved.
    Preempted = 2,
    /// Faulted or hung: it runs no more work.
    Hung = 3,
    /// Its memory is no longer valid.
    InvalidVa = 4,
}

impl QueueState {
    /// Decodes a state word.
    pub const fn from_word(w: u64) -> Option<QueueState> {
        Some(match w {
            0 => QueueState::Unmapped,
            1 => QueueState::Mapped,
            2 => QueueState::Preempted,
            3 => QueueState::Hung,
            4 => QueueState::InvalidVa,
            _ => return None,
        })
    }
}

/// What a client passes to create a user-mode queue.
#[repr(C)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueDescriptor {
    /// GPU VA of the ring.
    pub ring_va: u64,
    /// Ring size in bytes: a power of two, at least 4 KiB.
    pub ring_bytes: u64,
    /// GPU VA of the rptr word (8-byte aligned).
    pub rptr_va: u64,
    /// GPU VA of the wptr word (8-byte aligned).
    pub wptr_va: u64,
    /// GPU VA of the last-queued progress value (8-byte aligned), which the client writes
    /// before each submission and the kernel reads (spec 000
    /// `HwQueueProgressFenceLastQueuedValueCPUVirtualAddress`).
    pub last_queued_va: u64,
    /// Doorbell index in the doorbell page (0..512, inside the engine's range of it), or
    /// [`DOORBELL_INDEX_ANY`] to let the kernel pick a free one.
    pub doorbell_index: u32,
    /// [`Priority`] level.
    pub priority: u32,
    /// Attributes (spec 001: "whether the queue is secure for protected content, etc."):
    /// [`QUEUE_FLAG_SECURE`]; every other bit must be 0.
    pub flags: u32,
    /// Must be 0.
    pub reserved: u32,
    /// GPU VA of a context save area the application allocated (spec 001: "it allocates the
    /// necessary buffers for the queue (ring buffer, wptr and rptr, context save areas,
    /// etc.)"): the start of one of its allocations, GPU-writable, at least INFO's
    /// `context_save_bytes`. 0: the kernel allocates one of its own.
    pub context_save_va: u64,
    /// GPU VA of a doorbell page the application allocated (spec 001: "They would also
    /// allocate a doorbell page for the doorbells used by the user queues",
    /// [`crate::port::KernelPort::create_doorbell_page`]), which `doorbell_index` indexes.
    /// 0: the page the kernel gave the process.
    pub doorbell_page_va: u64,
}

/// `doorbell_index` value asking the kernel to choose a free doorbell in the process's page.
pub const DOORBELL_INDEX_ANY: u32 = u32::MAX;

/// [`QueueDescriptor::flags`]: a secure (protected-content) queue (amdgpu
/// `AMDGPU_USERQ_CREATE_FLAGS_QUEUE_SECURE`). Accepted only on a device that reports
/// [`crate::port::AdapterInfo::secure_queues`].
pub const QUEUE_FLAG_SECURE: u32 = 1 << 0;
/// Every flag this ABI defines.
pub const QUEUE_FLAGS_KNOWN: u32 = QUEUE_FLAG_SECURE;

// 72 bytes and no implicit padding: the u32 fields come in pairs (`reserved` pairs `flags`,
// checked zero, room for one more attribute), so every u64 is 8-aligned. The descriptor is a
// creation-time argument, never on the submission path: its size costs nothing there.
const _: () = {
    assert!(size_of::<QueueDescriptor>() == 72);
    assert!(offset_of!(QueueDescriptor, context_save_va) == 56);
    assert!(offset_of!(QueueDescriptor, doorbell_page_va) == 64);
    assert!(offset_of!(QueueDescriptor, last_queued_va) == 32);
    assert!(offset_of!(QueueDescriptor, doorbell_index) == 40);
    assert!(offset_of!(QueueDescriptor, flags) == 48);
};

/// The per-queue page the kernel owns and the client maps read-only.
#[repr(C)]
pub struct QueueKernelPage {
    /// Highest progress-fence value the engine has completed.
    pub progress_completed: CacheLine,
    /// The doorbell status word.
    pub doorbell_status: CacheLine,
    /// The queue state word.
    pub queue_state: CacheLine,
}

/// Offset of `progress_completed`.
pub const PROGRESS_COMPLETED_OFFSET: u64 = offset_of!(QueueKernelPage, progress_completed) as u64;
/// Offset of `doorbell_status`.
pub const DOORBELL_STATUS_OFFSET: u64 = offset_of!(QueueKernelPage, doorbell_status) as u64;
/// Offset of `queue_state`.
pub const QUEUE_STATE_OFFSET: u64 = offset_of!(QueueKernelPage, queue_state) as u64;
/// Bytes the kernel reserves per queue for the page.
pub const QUEUE_KERNEL_PAGE_BYTES: u64 = 4096;

const _: () = {
    assert!(PROGRESS_COMPLETED_OFFSET == 0);
    assert!(DOORBELL_STATUS_OFFSET == 64);
    assert!(QUEUE_STATE_OFFSET == 128);
    assert!(size_of::<QueueKernelPage>() as u64 <= QUEUE_KERNEL_PAGE_BYTES);
};

/// A queue's kernel page ([`QueueKernelPage`]) reached through typed words, checked once.
/// `W` is [`shm::Word`] for the device and the kernel, which write it, and [`shm::ReadWord`]
/// for the client, which maps it read-only.
#[derive(Clone, Debug)]
pub struct KernelPageView<W> {
    progress_completed: W,
    doorbell_status: W,
    queue_state: W,
}

impl KernelPageView<shm::Word> {
    /// The page at offset 0 of `region` (read-write).
    pub fn new(region: impl Into<shm::Region>) -> Result<Self, shm::ShmError> {
        let region = region.into();
        Ok(KernelPageView {
            progress_completed: shm::Word::new(region.clone(), PROGRESS_COMPLETED_OFFSET)?,
            doorbell_status: shm::Word::new(region.clone(), DOORBELL_STATUS_OFFSET)?,
            queue_state: shm::Word::new(region, QUEUE_STATE_OFFSET)?,
        })
    }
    /// A read-only view of the same page.
    pub fn read_only(&self) -> KernelPageView<shm::ReadWord> {
        KernelPageView {
            progress_completed: self.progress_completed.read_only(),
            doorbell_status: self.doorbell_status.read_only(),
            queue_state: self.queue_state.read_only(),
        }
    }
}

impl KernelPageView<shm::ReadWord> {
    /// The page at offset 0 of `region` (read-only or read-write).
    pub fn read_only_in(region: impl Into<shm::Region>) -> Result<Self, shm::ShmError> {
        let region = region.into();
        Ok(KernelPageView {
            progress_completed: shm::ReadWord::new(region.clone(), PROGRESS_COMPLETED_OFFSET)?,
            doorbell_status: shm::ReadWord::new(region.clone(), DOORBELL_STATUS_OFFSET)?,
            queue_state: shm::ReadWord::new(region, QUEUE_STATE_OFFSET)?,
        })
    }
}

impl<W> KernelPageView<W> {
    /// The highest completed progress value (the engine writes it, by `PROGRESS_FENCE` only).
    pub fn progress_completed(&self) -> &W {
        &self.progress_completed
    }
    /// The doorbell status word (the kernel writes it: [`crate::DoorbellStatus`]).
    pub fn doorbell_status(&self) -> &W {
        &self.doorbell_status
    }
    /// The queue state word (the kernel writes it: [`QueueState`]).
    pub fn queue_state(&self) -> &W {
        &self.queue_state
    }
}

/// How a GPU memory access was meant.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// Read.
    Read,
    /// Write.
    Write,
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Access::Read => "read",
            Access::Write => "write",
        })
    }
}

/// Why the firmware faulted a queue.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FaultKind {
    /// A packet could not be decoded.
    #[error("bad packet: {0}")]
    BadPacket(#[from] crate::packet::DecodeError),
    /// A packet's length runs past the end of the ring (packets never wrap).
    #[error("packet of {dwords} dwords at ring offset {offset:#x} runs past the ring end ({ring_bytes:#x})")]
    PastRingEnd {
        /// Ring offset of the header.
        offset: u64,
        /// Length from the header.
        dwords: u64,
        /// Ring size.
        ring_bytes: u64,
    },
    /// A packet's length runs past the published wptr.
    #[error("packet of {dwords} dwords at rptr {rptr:#x} runs past wptr {wptr:#x}")]
    PastWptr {
        /// rptr of the header.
        rptr: u64,
        /// Its length.
        dwords: u64,
        /// The published wptr.
        wptr: u64,
    },
    /// An access outside the process's mappings.
    #[error("{access} of {bytes} bytes at va {va:#x} is outside the process's mappings")]
    OutsideMappings {
        /// Address.
        va: u64,
        /// Length.
        bytes: u64,
        /// Kind.
        access: Access,
    },
    /// A write to a read-only mapping.
    #[error("write of {bytes} bytes at va {va:#x} hits a read-only mapping")]
    ReadOnly {
        /// Address.
        va: u64,
        /// Length.
        bytes: u64,
    },
    /// A misaligned access where alignment is required.
    #[error("{access} at va {va:#x} is not aligned to {align}")]
    Misaligned {
        /// Address.
        va: u64,
        /// Required alignment.
        align: u64,
        /// Kind.
        access: Access,
    },
    /// wptr went backwards.
    #[error("wptr moved backwards from {old:#x} to {new:#x}")]
    WptrBackwards {
        /// Previous wptr.
        old: u64,
        /// New wptr.
        new: u64,
    },
    /// wptr is more than a ring ahead of rptr.
    #[error("wptr {wptr:#x} is more than the ring size {ring_bytes:#x} ahead of rptr {rptr:#x}")]
    WptrPastRing {
        /// rptr.
        rptr: u64,
        /// wptr.
        wptr: u64,
        /// Ring size.
        ring_bytes: u64,
    },
    /// wptr is not a whole number of dwords.
    #[error("wptr {wptr:#x} is not dword aligned")]
    WptrMisaligned {
        /// wptr.
        wptr: u64,
    },
    /// A packet field this queue cannot honour.
    #[error("`{field}`: {why}")]
    BadField {
        /// The field.
        #[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))]
        field: crate::StaticStr,
        /// Why.
        #[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))]
        why: crate::StaticStr,
    },
    /// A fence `SIGNAL` whose address is not a native fence's CurrentValue.
    #[error("SIGNAL with the native-fence flag at va {va:#x}, which is not a native fence")]
    NotAFence {
        /// Address.
        va: u64,
    },
    /// A `PROGRESS_FENCE` value below the completed one.
    #[error("PROGRESS_FENCE value {value} is below the completed value {completed}")]
    ProgressBackwards {
        /// Completed value.
        completed: u64,
        /// Value in the packet.
        value: u64,
    },
    /// A `PROGRESS_FENCE` value above the queue's last-queued value as the firmware read it
    /// right after the wptr that published the packet. Spec 000 orders the submission so
    /// that the last-queued value covers every command buffer before it becomes visible, so
    /// no honest progress value is ever above it; one that is would tell the OS work is done
    /// that was never queued.
    #[error("PROGRESS_FENCE value {value} is above the last-queued value {last_queued} published before it")]
    ProgressBeyondQueued {
        /// Value in the packet.
        value: u64,
        /// The last-queued value read after the wptr that covers the packet.
        last_queued: u64,
    },
    /// The queue did not answer a preemption request in time and its engine was reset
    /// (timeout detection and recovery, spec 003): it was the one that would not yield.
    #[error("reset: the queue did not yield its engine within {waited_ms} ms of a preemption request")]
    PreemptTimeout {
        /// How long the request waited before recovery started (ms).
        waited_ms: u64,
    },
    /// The hang timer's per-queue reset (amdgpu's hang detection, spec 001 "Queue Resets"):
    /// the queue ran — executed its work in a hardware slot, not waiting for a slot, held, or
    /// blocked in a `WAIT` — for the timer's limit without its progress fence moving. It
    /// answered the preemption request sent first (spec 003), or [`FaultKind::PreemptTimeout`]
    /// would say so: a kernel that yields can still hang.
    #[error("reset: the queue ran {ran_ms} ms without completing a command buffer (hang timer)")]
    HangTimeout {
        /// How long it ran without progress (ms of device time executing).
        ran_ms: u64,
    },
    /// The queue's device was lost (a device error, an adapter reset, the adapter's
    /// recovery limit): the queue stopped, and user mode must destroy and recreate it with its
    /// doorbell and ring (spec 000).
    #[error("the queue's device was lost")]
    DeviceLost,
    /// The whole adapter was reset (`DxgkDdiResetFromTimeout`): the queue's state is lost,
    /// whatever it was running.
    #[error("reset: the adapter was reset and the queue's state is lost")]
    AdapterReset,
    /// A program binary refused at dispatch (bad header, unknown opcode, bad register, branch
    /// outside the program, unbalanced control flow).
    #[error("DISPATCH: invalid program: {0}")]
    BadProgram(crate::isa::ProgramError),
    /// Grid or workgroup dimensions out of range.
    #[error("DISPATCH: {why}")]
    BadDispatch {
        /// Why.
        #[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))]
        why: crate::StaticStr,
    },
    /// A program instruction's memory access faulted.
    #[error("program instruction {pc}: {fault}")]
    ProgramAccess {
        /// Instruction index.
        pc: u32,
        /// The access fault (VA, length, access kind).
        fault: Box<FaultKind>,
    },
    /// The saved state of an interrupted dispatch does not decode.
    #[error("context save area: {why}")]
    BadSaveArea {
        /// Why.
        #[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))]
        why: crate::StaticStr,
    },
    /// An indirect buffer inside an indirect buffer, or one on a bad vmid.
    #[error("INDIRECT_BUFFER: {why}")]
    BadIndirect {
        /// Reason.
        #[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))]
        why: crate::StaticStr,
    },
    /// A logged `SIGNAL`/`WAIT` named a log position the engine cannot place
    /// ([`crate::fence_log::locate`]): behind the log's next free position (the UMD's
    /// progression went backwards), or a whole log or more ahead of it.
    #[error(
        "log entry position {position}: the log's next free position is {next} and it holds {entries} entries (a position must lie in {next}..{next}+{entries})"
    )]
    BadLogPosition {
        /// The position the packet named.
        position: u32,
        /// The log's next free position (its low 32 bits).
        next: u32,
        /// Entries in the log.
        entries: u32,
    },
}

/// A fault as the firmware recorded it.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultRecord {
    /// What went wrong.
    pub kind: FaultKind,
    /// rptr of the packet (or wptr check) that faulted.
    pub rptr: u64,
    /// The packet's opcode, when one was decoded.
    pub opcode: Option<crate::packet::Opcode>,
    /// Whether the packet was inside an indirect buffer.
    pub in_indirect: bool,
}

impl fmt::Display for FaultRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (at rptr {:#x}", self.kind, self.rptr)?;
        if let Some(op) = self.opcode {
            write!(f, ", {}", op.name())?;
        }
        if self.in_indirect {
            f.write_str(", in indirect buffer")?;
        }
        f.write_str(")")
    }
}
