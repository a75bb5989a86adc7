//! What the adapter reports to user mode: its engines, its doorbell geometry, the
//! submission models it offers, its preemption caps (`DxgkDdiQueryAdapterInfo`, amdgpu INFO),
//! and the native fence caps the OS accepted at adapter initialization (spec 002).

use crate::queue::{EngineId, EngineKind};

/// One engine as the adapter reports it (amdgpu INFO: which IPs take user and kernel queues).
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineInfo {
    /// Its id.
    pub id: EngineId,
    /// Its kind.
    pub kind: EngineKind,
    /// Whether it supports user-mode queues (`UserModeSubmissionSupported`).
    pub user_queues: bool,
    /// Whether it supports kernel-mode queues.
    pub kernel_queues: bool,
    /// First doorbell of this engine's range in every doorbell page (spec 001: each 4 KiB page
    /// reserves a range per IP; a queue's doorbell must lie in its engine's range).
    pub doorbell_first: u32,
    /// Doorbells in the range.
    pub doorbell_count: u32,
    /// Its hardware queue slots (HQDs).
    pub hw_slots: u32,
    /// The slots left for user queues: kernel queues are always mapped and hold theirs
    /// statically (spec 001 "Interaction with Kernel Queues").
    pub user_slots: u32,
}

/// `amdgpu_user_queue`: which submission models the device offers.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum UserQueueMode {
    /// 0: kernel queues only; user-mode queues are refused.
    KernelOnly = 0,
    /// 1: both (the default).
    #[default]
    Both = 1,
    /// 2: user-mode queues only; kernel-mode submission is refused.
    UserOnly = 2,
}

/// Sizes of what the kernel allocates per queue (amdgpu INFO: the metadata a queue needs).
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueMetadataSizes {
    /// The context save area (an interrupted `DISPATCH`'s state).
    pub context_save_bytes: u64,
    /// One fence log; a user-mode queue has two (waits, signals).
    pub fence_log_bytes: u64,
    /// The kernel page (progress fence, doorbell status, queue state).
    pub kernel_page_bytes: u64,
}

/// What the adapter reports.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterInfo {
    /// Engines.
    pub engines: Vec<EngineInfo>,
    /// `DXGK_USERMODESUBMISSION_CAPS`: bytes of one doorbell.
    pub doorbell_bytes: u64,
    /// Doorbells in the process's doorbell page.
    pub doorbells_per_process: u32,
    /// Spec 000's doorbell model.
    pub doorbell_model: crate::doorbell::DoorbellModel,
    /// Engines miss doorbells of queues not in a hardware slot, so clients also ring the
    /// aggregated doorbell (amdgpu).
    pub aggregated_doorbell: bool,
    /// Which submission models the device offers.
    pub user_queue_mode: UserQueueMode,
    /// The adapter supports native fences. Without them, fences are monitored fences
    /// (`LegacyMonitored`) waited on through kernel-mode queues.
    pub native_fences: bool,
    /// Per-queue metadata sizes.
    pub queue_metadata: QueueMetadataSizes,
    /// `D3DKMDT_PREEMPTION_CAPS`: where the engines can stop a queue's work (spec 003).
    pub preemption: crate::preempt::PreemptionCaps,
    /// The device runs secure (protected-content) queues ([`crate::queue::QUEUE_FLAG_SECURE`]).
    pub secure_queues: bool,
}

/// `DXGK_NATIVE_FENCE_CAPS` with the related `DXGK_VIDSCHCAPS` bits: what the KMD reports
/// about native fences (spec 002 "Native fence capabilities"), checked by the OS at adapter
/// initialization and answered to user mode by [`KernelPort::native_fence_caps`](crate::port::KernelPort::native_fence_caps).
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NativeFenceCaps {
    /// `DXGK_VIDSCHCAPS::NativeGpuFence`: native fences are supported (advertised only when
    /// the OS enabled `DXGK_FEATURE_NATIVE_FENCE`).
    pub supported: bool,
    /// `DXGK_VIDSCHCAPS::OptimizedNativeFenceSignaledInterrupt`: a logged signal's interrupt
    /// names the queue, and the OS reads its log.
    pub optimized_interrupt: bool,
    /// `DXGK_NATIVE_FENCE_CAPS::MapToGpuSystemProcess`: the OS also maps each fence's
    /// CurrentValue and MonitoredValue into the GPU system (paging) process, for the CMP.
    pub map_to_gpu_system_process: bool,
    /// Bytes between two non-shareable fences' CurrentValues in a packed page.
    pub current_value_stride: u64,
    /// Bytes between their MonitoredValues.
    pub monitored_value_stride: u64,
}

/// The OS's answer to the KMD's `IsFeatureEnabled` queries (`DXGKCB_FEATURE_NATIVEFENCE_CAPS_1`
/// and friends), given to the KMD during adapter initialization.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OsFeatures {
    /// `DXGK_FEATURE_NATIVE_FENCE` is enabled.
    pub native_fence: bool,
}

impl Default for OsFeatures {
    fn default() -> Self {
        OsFeatures { native_fence: true }
    }
}
