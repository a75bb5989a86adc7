//! The native fence calls (spec 002): each runs the fences' owner
//! ([`Fences`](super::super::fences::Fences)).

use abi::Time;
use abi::port::{KernelError, NativeFenceDesc, NativeFenceInfo, WaitMode, WaitOutcome};
use abi::{DeviceHandle, HwQueueHandle, NativeFenceHandle, ProcessId};

use super::super::Os;
use super::super::fences::SYSTEM_PROCESS;
use super::super::waits::{WaitId, WaitStart};
use crate::ddi::Kmd;

impl Os {
    /// `D3DKMTCreateNativeFence`: storage (a packed slot, or a page of its own for a
    /// shareable or cross-adapter fence), then `DxgkDdiCreateNativeFence`.
    pub fn create_native_fence(
        &mut self,
        pid: ProcessId,
        device: DeviceHandle,
        desc: &NativeFenceDesc,
        _now: Time,
    ) -> Result<NativeFenceInfo, KernelError> {
        self.fences.create_native_fence(&mut self.cx, pid, device, desc)
    }

    /// Opens a cross-adapter fence another adapter created: its CurrentValue page mapped into
    /// this process's GPU address space, a MonitoredValue of this adapter's own pinned at 0,
    /// the KMD told (`DxgkDdiCreateNativeFence`). Without native fences here, it is a
    /// monitored fence (spec 002: "opened as a regular MonitoredFence on GPU2").
    pub fn open_cross_adapter_fence(
        &mut self,
        pid: ProcessId,
        device: DeviceHandle,
        handle: u64,
        now: Time,
    ) -> Result<NativeFenceInfo, KernelError> {
        self.fences.open_cross_adapter_fence(&mut self.cx, pid, device, handle, now)
    }

    /// Another adapter signalled cross-adapter fence `id` (this adapter's local id): see
    /// [`crate::cross`].
    pub(crate) fn notify_current_value(&mut self, id: u64, now: Time) {
        self.fences.notify_current_value(&mut self.cx, id, now)
    }

    /// Opens a shared fence in another process: the same storage, mapped at a VA of this
    /// process, under a local handle of its own (`DxgkDdiOpenNativeFence`).
    pub fn open_native_fence(
        &mut self,
        pid: ProcessId,
        device: DeviceHandle,
        global: u64,
        now: Time,
    ) -> Result<NativeFenceInfo, KernelError> {
        self.fences.open_native_fence(&mut self.cx, pid, device, global, now)
    }

    /// Closes a process's local handle; the global fence goes with its last one.
    pub fn destroy_native_fence(
        &mut self,
        pid: ProcessId,
        h: NativeFenceHandle,
        _now: Time,
    ) -> Result<(), KernelError> {
        self.fences.destroy_native_fence(&mut self.cx, pid, h)
    }

    /// The fence's CurrentValue and MonitoredValue, as they are now
    /// ([`abi::port::KernelPort::query_native_fence`]): a read of both words, nothing more, so
    /// a test can watch the MonitoredValue protocol step by step (spec 002's 41/42 example).
    pub fn query_native_fence(
        &mut self,
        pid: ProcessId,
        h: NativeFenceHandle,
    ) -> Result<abi::port::NativeFenceValues, KernelError> {
        let f = self.proc(pid)?.fences.get(h)?;
        // Acquire, as every read of MonitoredValue's writer (the OS itself, under its lock).
        Ok(abi::port::NativeFenceValues {
            current: f.current(),
            monitored: f.monitored.get().load(std::sync::atomic::Ordering::Acquire),
        })
    }

    /// Signals a native fence from the CPU (`DxgkDdiUpdateCurrentValuesFromCpu`).
    pub fn signal_native_fence(
        &mut self,
        pid: ProcessId,
        h: NativeFenceHandle,
        value: u64,
        now: Time,
    ) -> Result<(), KernelError> {
        self.fences.signal_native_fence(&mut self.cx, pid, h, value, now)
    }

    /// Where a fence's CurrentValue and MonitoredValue live.
    pub fn native_fence_storage(
        &mut self,
        pid: ProcessId,
        h: NativeFenceHandle,
    ) -> Result<(abi::port::MemoryDomain, abi::port::MemoryDomain), KernelError> {
        Ok(self.proc(pid)?.fences.get(h)?.storage_domains)
    }

    /// A fence's CurrentValue and MonitoredValue VAs in the GPU system process, when the KMD
    /// asked for them (`MapToGpuSystemProcess`).
    pub fn native_fence_system_vas(
        &mut self,
        pid: ProcessId,
        h: NativeFenceHandle,
    ) -> Result<Option<(u64, u64)>, KernelError> {
        Ok(self.proc(pid)?.fences.get(h)?.system)
    }

    /// Reads a word through the GPU system process's address space, as the CMP would (tests
    /// and tools).
    pub fn read_system_process_u64(&self, va: u64) -> Option<u64> {
        self.cx.ddi.read_gpu_u64(SYSTEM_PROCESS, va)
    }

    /// Starts a CPU wait. Returns at once if it is already satisfied.
    pub fn begin_fence_wait(
        &mut self,
        pid: ProcessId,
        conds: &[(NativeFenceHandle, u64)],
        mode: WaitMode,
        now: Time,
    ) -> Result<WaitStart, KernelError> {
        self.fences.begin_fence_wait(&mut self.cx, pid, conds, mode, now)
    }

    /// Ends a CPU wait: deregisters it and reports.
    pub fn end_fence_wait(&mut self, pid: ProcessId, id: WaitId) -> Result<WaitOutcome, KernelError> {
        self.fences.end_fence_wait(&mut self.cx, pid, id)
    }

    /// A device in error: every fence it owns becomes AlwaysSignaled (CurrentValue =
    /// `u64::MAX`, so GPU waits pass), and its blocked CPU waiters end with `DeviceLost`.
    pub fn mark_device_error(&mut self, pid: ProcessId, device: DeviceHandle, now: Time) -> Result<(), KernelError> {
        self.fences.mark_device_error(&mut self.cx, pid, device, now)
    }

    /// The queue's progress fence as a native fence (spec 002 "Indicating a native progress
    /// fence for hardware queues"): the kernel page's completed value, registered with the KMD
    /// (`DxgkDdiCreateNativeFence`) so the engine's `PROGRESS_FENCE` signals it with the native
    /// protocol. Opening it again answers the same fence.
    pub fn open_progress_fence(
        &mut self,
        pid: ProcessId,
        q: HwQueueHandle,
        _now: Time,
    ) -> Result<NativeFenceInfo, KernelError> {
        self.fences.open_progress_fence(&mut self.cx, pid, q)
    }
}
