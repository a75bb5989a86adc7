//! The kernel-mode driver boundary.
//!
//! The spec splits the OS graphics kernel (Dxgkrnl) from the IHV's kernel-mode driver through
//! DDIs (spec 000 "DDIs for user-mode work submission"). [`Kmd`] is that boundary: the OS part
//! ([`crate::os`]) owns processes, handles, validation, doorbell objects and policy, and calls
//! these methods for everything device-specific. [`VirtualKmd`] implements them for doorbell's
//! virtual GPU by sending commands to its firmware. A second doorbell model (global doorbells,
//! a different firmware) is a second implementation of this trait, not a fork of the OS.
//!
//! The OS records every call in its trace before making it, so tests can assert the order.

use std::sync::Arc;

use abi::EngineId;
use abi::port::{AdapterInfo, EngineInfo, KernelError};
use abi::queue::{Access, FaultKind};
use gpu::{FwQueueId, Gpu, Interrupt, PowerState, QueueConfig, Time, Vmid};
use parking_lot::Mutex;
use shm::Shm;

/// Something that wakes the device's driver thread (the live firmware thread parks while
/// every engine is in F1).
pub trait DeviceWaker: Send + Sync {
    /// Wakes it. Must not block.
    fn wake(&self);
}

/// The DDIs the OS calls.
pub trait Kmd: Send {
    /// `DxgkDdiQueryAdapterInfo`: engines and doorbell caps.
    fn adapter_info(&self) -> AdapterInfo;
    /// The doorbell BAR (the OS maps pages of it into processes).
    fn doorbell_bar(&self) -> Arc<Shm>;
    /// Creates a GPU address space for a process.
    fn create_vm(&mut self) -> Vmid;
    /// Destroys it.
    fn destroy_vm(&mut self, vmid: Vmid);
    /// Maps memory into a GPU address space.
    fn map_gpu(&mut self, vmid: Vmid, va: u64, bytes: u64, shm: Arc<Shm>, writable: bool) -> Result<(), KernelError>;
    /// Unmaps it.
    fn unmap_gpu(&mut self, vmid: Vmid, va: u64);
    /// Whether the GPU could make `access` to `[va, va+bytes)` in the address space: inside
    /// one mapping, and writable for a write.
    fn vm_access(&self, vmid: Vmid, va: u64, bytes: u64, access: Access) -> Result<(), FaultKind>;
    /// `DxgkDdiCreateHwQueue`: the firmware adds the queue to its run list.
    fn create_hw_queue(&mut self, cfg: QueueConfig) -> Result<FwQueueId, KernelError>;
    /// `DxgkDdiDestroyHwQueue`.
    fn destroy_hw_queue(&mut self, q: FwQueueId);
    /// `DxgkDdiConnectDoorbell`: connect the queue to physical doorbell `slot`. Returns
    /// whether the KMD wants `NotifyWorkSubmission` after each ring.
    fn connect_doorbell(&mut self, q: FwQueueId, slot: u32) -> Result<bool, KernelError>;
    /// `DxgkDdiDisconnectDoorbell`.
    fn disconnect_doorbell(&mut self, q: FwQueueId);
    /// `DxgkDdiNotifyWorkSubmission`.
    fn notify_work_submission(&mut self, q: FwQueueId);
    /// `DxgkDdiUpdateMonitoredValues` for a progress fence.
    fn update_monitored(&mut self, q: FwQueueId, value: u64);
    /// `DxgkDdiSetPowerComponentFState`. Returns the state the engine is in afterwards (the
    /// firmware refuses F1 while work is pending).
    fn set_power(&mut self, engine: EngineId, state: PowerState, now: Time) -> PowerState;
    /// `DxgkDdiCreateNativeFence`: the firmware learns where the fence's CurrentValue and
    /// MonitoredValue live, and the id its interrupts name.
    fn create_native_fence(&mut self, current: (Arc<Shm>, u64), monitored: (Arc<Shm>, u64), id: u64);
    /// `DxgkDdiDestroyNativeFence`.
    fn destroy_native_fence(&mut self, current: (Arc<Shm>, u64));
    /// `DxgkddiSuspendContext`: take the context's queues off the scheduler's list.
    fn suspend_context(&mut self, queues: &[FwQueueId]);
    /// `DxgkddiResumeContext`: put them back.
    fn resume_context(&mut self, queues: &[FwQueueId]);
    /// `DxgkDdiUpdateNativeFenceLogs`: make the queue's pending log writes visible (the
    /// consumer-side barrier the spec moves from the GPU to the CPU).
    fn flush_fence_logs(&mut self, q: FwQueueId);
    /// Current engine power state.
    fn power(&self, engine: EngineId) -> PowerState;
    /// The firmware's view of a queue.
    fn queue_state(&self, q: FwQueueId) -> Option<abi::QueueState>;
}

/// The KMD of doorbell's virtual GPU.
pub struct VirtualKmd {
    gpu: Arc<Mutex<Gpu>>,
    waker: Arc<dyn DeviceWaker>,
    notify_on_submit: bool,
    mode: abi::port::UserQueueMode,
}

impl VirtualKmd {
    /// A KMD driving `gpu`; `waker` is called when an engine returns to F0.
    pub fn new(gpu: Arc<Mutex<Gpu>>, waker: Arc<dyn DeviceWaker>) -> Self {
        VirtualKmd { gpu, waker, notify_on_submit: false, mode: abi::port::UserQueueMode::Both }
    }

    /// Which submission models the device offers (amdgpu's `user_queue` parameter).
    pub fn set_user_queue_mode(&mut self, mode: abi::port::UserQueueMode) {
        self.mode = mode;
    }

    /// Makes connected doorbells report `ConnectedNotify`, so the UMD calls
    /// `NotifyWorkSubmission` after each ring (spec: for "specific and infrequent scenarios").
    pub fn set_notify_on_submit(&mut self, on: bool) {
        self.notify_on_submit = on;
    }
}

/// A device refusal, reported against the argument that caused it.
fn gpu_err(field: &'static str, value: impl ToString) -> impl FnOnce(gpu::GpuError) -> KernelError {
    move |e| KernelError::InvalidArgument { field, value: value.to_string(), reason: e.to_string() }
}

impl Kmd for VirtualKmd {
    fn adapter_info(&self) -> AdapterInfo {
        use abi::port::UserQueueMode;
        let g = self.gpu.lock();
        let kinds = g.engines();
        let n = kinds.len().max(1) as u32;
        let per = abi::doorbell::DOORBELLS_PER_PAGE / n;
        AdapterInfo {
            engines: kinds
                .into_iter()
                .enumerate()
                .map(|(i, kind)| EngineInfo {
                    id: EngineId(i as u32),
                    kind,
                    user_queues: self.mode != UserQueueMode::KernelOnly,
                    kernel_queues: self.mode != UserQueueMode::UserOnly,
                    // Each engine owns an equal slice of every doorbell page.
                    doorbell_first: i as u32 * per,
                    doorbell_count: per,
                })
                .collect(),
            doorbell_bytes: abi::doorbell::DOORBELL_BYTES,
            doorbells_per_process: abi::doorbell::DOORBELLS_PER_PAGE,
            user_queue_mode: self.mode,
            queue_metadata: abi::port::QueueMetadataSizes {
                context_save_bytes: gpu::compute::CONTEXT_SAVE_BYTES,
                fence_log_bytes: abi::fence_log::FENCE_LOG_BYTES,
                kernel_page_bytes: abi::queue::QUEUE_KERNEL_PAGE_BYTES,
            },
        }
    }

    fn doorbell_bar(&self) -> Arc<Shm> {
        self.gpu.lock().bar().clone()
    }

    fn create_vm(&mut self) -> Vmid {
        self.gpu.lock().create_vm()
    }

    fn destroy_vm(&mut self, vmid: Vmid) {
        let _ = self.gpu.lock().destroy_vm(vmid);
    }

    fn map_gpu(&mut self, vmid: Vmid, va: u64, bytes: u64, shm: Arc<Shm>, writable: bool) -> Result<(), KernelError> {
        self.gpu
            .lock()
            .vm_mut(vmid)
            .and_then(|vm| vm.map(va, bytes, shm, 0, writable))
            .map_err(gpu_err("va", format!("{va:#x}+{bytes:#x}")))
    }

    fn unmap_gpu(&mut self, vmid: Vmid, va: u64) {
        if let Ok(vm) = self.gpu.lock().vm_mut(vmid) {
            vm.unmap(va);
        }
    }

    fn vm_access(&self, vmid: Vmid, va: u64, bytes: u64, access: Access) -> Result<(), FaultKind> {
        let g = self.gpu.lock();
        let vm = g.vm(vmid).map_err(|_| FaultKind::OutsideMappings { va, bytes, access })?;
        vm.translate(va, bytes, access).map(|_| ())
    }

    fn create_hw_queue(&mut self, cfg: QueueConfig) -> Result<FwQueueId, KernelError> {
        let ring = cfg.ring_va;
        self.gpu.lock().add_queue(cfg).map_err(gpu_err("queue memory", format!("ring at {ring:#x}")))
    }

    fn destroy_hw_queue(&mut self, q: FwQueueId) {
        let _ = self.gpu.lock().remove_queue(q);
    }

    fn connect_doorbell(&mut self, q: FwQueueId, slot: u32) -> Result<bool, KernelError> {
        self.gpu.lock().bind_doorbell(q, slot).map_err(gpu_err("doorbell slot", slot))?;
        Ok(self.notify_on_submit)
    }

    fn disconnect_doorbell(&mut self, q: FwQueueId) {
        let _ = self.gpu.lock().unbind_doorbell(q);
    }

    fn notify_work_submission(&mut self, _q: FwQueueId) {
        // The virtual firmware needs no help to see a ring; a real KMD might kick a scheduler.
        self.waker.wake();
    }

    fn update_monitored(&mut self, q: FwQueueId, value: u64) {
        let _ = self.gpu.lock().set_monitored(q, value);
    }

    fn set_power(&mut self, engine: EngineId, state: PowerState, now: Time) -> PowerState {
        let mut g = self.gpu.lock();
        match state {
            PowerState::F0 => {
                let _ = g.request_f0(engine, now);
                drop(g);
                self.waker.wake();
                PowerState::F0
            }
            PowerState::F1 => match g.enter_f1(engine, now) {
                Ok(true) => PowerState::F1,
                _ => PowerState::F0,
            },
        }
    }

    fn create_native_fence(&mut self, current: (Arc<Shm>, u64), monitored: (Arc<Shm>, u64), id: u64) {
        self.gpu.lock().register_native_fence((&current.0, current.1), monitored, id);
    }

    fn destroy_native_fence(&mut self, current: (Arc<Shm>, u64)) {
        self.gpu.lock().unregister_native_fence((&current.0, current.1));
    }

    fn suspend_context(&mut self, queues: &[FwQueueId]) {
        let mut g = self.gpu.lock();
        for &q in queues {
            let _ = g.suspend_queue(q);
        }
    }

    fn resume_context(&mut self, queues: &[FwQueueId]) {
        let mut g = self.gpu.lock();
        for &q in queues {
            let _ = g.resume_queue(q);
        }
        drop(g);
        self.waker.wake();
    }

    fn flush_fence_logs(&mut self, _q: FwQueueId) {
        // The virtual engine's log writes are complete when its step returns; taking the
        // device lock orders them before the OS's reads, and the fence makes it explicit.
        let _g = self.gpu.lock();
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }

    fn power(&self, engine: EngineId) -> PowerState {
        self.gpu.lock().power(engine).unwrap_or(PowerState::F0)
    }

    fn queue_state(&self, q: FwQueueId) -> Option<abi::QueueState> {
        self.gpu.lock().queue_state(q).ok()
    }
}

/// Interrupts the device raised, in order, as the ISR receives them.
pub type InterruptBatch = Vec<Interrupt>;
