//! The native fence calls (spec 002), fence logs included: each runs the fences' owner
//! ([`Fences`](super::super::fences::Fences)).

use abi::Time;
use abi::fence_log::FenceLogType;
use abi::port::{KernelError, NativeFenceDesc, NativeFenceInfo, WaitMode, WaitOutcome};
use abi::{DeviceHandle, HwQueueHandle, NativeFenceHandle, ProcessId};

use super::super::Os;
use super::super::fences::SYSTEM_PROCESS;
use super::super::shared::invalid;
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

    /// A device in error: its blocked CPU waiters end with `DeviceLost`, and every fence it
    /// created becomes AlwaysSignaled (CurrentValue = `u64::MAX`, so GPU waits pass); one it
    /// opened keeps its creator's value.
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

    /// Turns fence-log tracing on or off. Spec 002 "Log buffer overrun is permitted": "when
    /// tracing is enabled, the OS first increases the size of the log buffer to prevent
    /// overruns in the first place" — so turning it on recreates every user-mode queue's two
    /// logs at [`TRACED_FENCE_LOG_BYTES`] ([`Os::recreate_fence_log`]: nothing is lost), and
    /// new queues get logs of that size; turning it off gives them the spec's 4 KiB again.
    /// An overrun that still happens is flagged in the trace ([`Event::FenceLogOverrun`]).
    ///
    /// Every queue's logs are recreated on their own: one that fails (its old log unreadable,
    /// no memory for the new one, the DDI refused) keeps its working logs at the old size and
    /// costs no other queue its new ones; the first failure is returned once all were tried.
    pub fn set_fence_log_tracing(&mut self, on: bool, now: Time) -> Result<(), KernelError> {
        self.fences.set_fence_log_tracing(&mut self.cx, on, now)
    }

    /// Destroys and recreates a user-mode queue's fence log of `kind`, at the size the OS
    /// gives logs now (spec 002: "Dxgkrnl can destroy and recreate a log buffer. Each time it
    /// does, it calls DxgkDdiSetNativeFenceLogBuffer to inform KMD of the new location").
    /// Nothing written is lost, in this order:
    ///
    /// 1. the new log is made, its header starting at the old log's next free position (the
    ///    UMD's positions go on, whatever the new size: `abi::fence_log`);
    /// 2. `DxgkDdiSetNativeFenceLogBuffer`: from its return the engine writes the new log;
    /// 3. the old signal log is flushed (`DxgkDdiUpdateNativeFenceLogs`) and read to its end,
    ///    and the fences it names are settled, as an interrupt's read would;
    /// 4. the old log is dropped, and the new one is read from its start.
    ///
    /// A kernel-mode queue has no logs.
    pub fn recreate_fence_log(
        &mut self,
        pid: ProcessId,
        q: HwQueueHandle,
        kind: FenceLogType,
        now: Time,
    ) -> Result<(), KernelError> {
        self.fences.recreate_fence_log(&mut self.cx, pid, q, kind, now)
    }

    /// Reads a queue's fence log: the entries written after `since` entries (a previous
    /// [`abi::fence_log::LogRead::total`], 0 at first), after the KMD's flush
    /// (`DxgkDdiUpdateNativeFenceLogs`). For tools (the timeline) and tests; the client has no
    /// access to its logs.
    pub fn read_fence_log(
        &mut self,
        pid: ProcessId,
        q: HwQueueHandle,
        kind: abi::fence_log::FenceLogType,
        since: u64,
        _now: Time,
    ) -> Result<abi::fence_log::LogRead, KernelError> {
        let logs = self.queue(pid, q)?.logs.clone();
        let logs = logs.ok_or_else(|| invalid("queue", q, abi::port::Invalid::NoFenceLog))?;
        self.cx.ddi.flush_fence_logs(q);
        abi::fence_log::read_since(&logs[kind as usize], since)
            .map_err(|reason| KernelError::CorruptLog { queue: q, reason })
    }
}
