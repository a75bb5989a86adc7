//! The kernel-mode driver boundary.
//!
//! The spec splits the OS graphics kernel (Dxgkrnl) from the IHV's kernel-mode driver through
//! DDIs (spec 000 "DDIs for user-mode work submission"). [`Kmd`] is that boundary: the OS part
//! ([`crate::os`]) owns processes, handles, validation, doorbell objects and policy, and calls
//! these methods for everything device-specific. [`VirtualKmd`] implements them for doorbell's
//! virtual GPU by sending commands to its firmware. The doorbell model is the KMD's business:
//! [`VirtualKmd`] hands out doorbells per process page, from a victimized pool, or as bits of
//! the device's global doorbell, and the OS runs the same connect, disconnect and
//! victimization sequences over all three. A different device is a second implementation of
//! this trait, not a fork of the OS.
//!
//! The OS records every call in its trace before making it, so tests can assert the order.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use abi::EngineId;
use abi::doorbell::{DoorbellModel, RingMethod};
use abi::port::{AdapterInfo, EngineInfo, KernelError};
use abi::queue::{Access, FaultKind};
use gpu::{FwQueueId, Gpu, Interrupt, PowerState, QueueConfig, Time, Vmid};
use parking_lot::Mutex;
use shm::Shm;

/// What `DxgkDdiConnectDoorbell` answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectStep {
    /// Connected, shown by BAR page `page_offset` at the doorbell's offset.
    Connected {
        /// Byte offset of the BAR page to map at the doorbell's CPU VA.
        page_offset: u64,
        /// The KMD wants `NotifyWorkSubmission` after each ring.
        notify: bool,
    },
    /// No physical doorbell is free: victimize this queue's first.
    Victimize {
        /// The victim.
        victim: FwQueueId,
    },
}

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
    /// `DxgkDdiConnectDoorbell` for a user-mode queue whose doorbell index in the process's
    /// page `process_page` is `index`. Either connects it, or — with a limited pool and no
    /// free physical doorbell — answers which doorbell must be victimized first: the OS then
    /// runs the `DxgkCbDisconnectDoorbell` callback for it, calls
    /// [`Kmd::victimized`], and asks again.
    fn connect_doorbell(&mut self, q: FwQueueId, process_page: u32, index: u32) -> Result<ConnectStep, KernelError>;
    /// The KMD's half of a victimization, after the OS's callback rotated the victim's CPU VA
    /// to the dummy page and published `DisconnectedRetry`: disconnect the physical doorbell.
    fn victimized(&mut self, victim: FwQueueId);
    /// Connects a kernel queue's doorbell (kernel slots in BAR page 0, never virtualized).
    fn connect_kernel_doorbell(&mut self, q: FwQueueId, slot: u32) -> Result<(), KernelError>;
    /// Where a user-mode queue with doorbell index `index` rings inside its doorbell CPU page,
    /// and how.
    fn doorbell_ring(&self, index: u32) -> (u64, RingMethod);
    /// Where queues of `engine` ring their process's aggregated doorbell page, when the
    /// device needs one: the word's offset and the engine's bit.
    fn aggregated_doorbell(&self, engine: EngineId) -> Option<(u64, u64)>;
    /// The device starts watching BAR page `page` as a process's aggregated doorbell.
    fn watch_aggregated_page(&mut self, page: u32);
    /// It stops.
    fn unwatch_aggregated_page(&mut self, page: u32);
    /// BAR pages not for processes (the KMD's physical doorbell pool).
    fn reserved_doorbell_pages(&self) -> std::ops::Range<u32>;
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
    /// `DxgkDdiUpdateCurrentValuesFromCpu`: store a fence's CurrentValue (`current`: its
    /// memory) and have the queues waiting on it re-check.
    fn update_current_value(&mut self, current: (&Shm, u64), value: u64);
    /// `DxgkDdiUpdateCurrentValuesFromCpu` with `NotificationOnly`: a cross-adapter fence's
    /// shared CurrentValue moved on another adapter; rescan the run list so queues waiting on
    /// it re-check.
    fn notify_current_values(&mut self);
    /// `DxgkddiSuspendContext`: take the context's queues off the scheduler's list.
    fn suspend_context(&mut self, queues: &[FwQueueId]);
    /// `DxgkddiResumeContext`: put them back.
    fn resume_context(&mut self, queues: &[FwQueueId]);
    /// `DxgkDdiUpdateNativeFenceLogs`: make the queue's pending log writes visible (the
    /// consumer-side barrier the spec moves from the GPU to the CPU).
    fn flush_fence_logs(&mut self, q: FwQueueId);
    /// Current engine power state.
    fn power(&self, engine: EngineId) -> PowerState;
    /// Whether the queue has work the engine has not finished (`rptr != wptr`, or a dispatch
    /// part-way).
    fn queue_has_work(&self, q: FwQueueId) -> bool;
    /// The firmware's view of a queue.
    fn queue_state(&self, q: FwQueueId) -> Option<abi::QueueState>;
}

/// The KMD of doorbell's virtual GPU.
pub struct VirtualKmd {
    gpu: Arc<Mutex<Gpu>>,
    waker: Arc<dyn DeviceWaker>,
    notify_on_submit: bool,
    mode: abi::port::UserQueueMode,
    doorbells: Doorbells,
    native_fences: bool,
}

/// How the KMD hands out doorbells.
enum Doorbells {
    /// Dedicated: every queue index of a process's page is its own physical doorbell.
    PerProcess,
    /// Dedicated, virtualized over a limited pool.
    Pool(DoorbellPool),
    /// Global: one doorbell for every queue (spec 000: no victimization needed); each queue
    /// rings its bit of its process's page.
    Global,
}

/// The dedicated-doorbell model with a limited pool (spec 000 "Dedicated doorbells"): a few
/// physical doorbells, each at offset 0 of its own BAR page (a CPU VA rotates a whole page),
/// shared by every user-mode queue by victimizing the least recently connected.
struct DoorbellPool {
    first_page: u32,
    owners: Vec<Option<FwQueueId>>,
    /// Connected owners, least recently connected first.
    lru: std::collections::VecDeque<FwQueueId>,
}

impl VirtualKmd {
    /// A KMD driving `gpu`; `waker` is called when an engine returns to F0.
    pub fn new(gpu: Arc<Mutex<Gpu>>, waker: Arc<dyn DeviceWaker>) -> Self {
        let doorbells = match gpu.lock().doorbell_model() {
            DoorbellModel::Global => Doorbells::Global,
            DoorbellModel::Dedicated => Doorbells::PerProcess,
        };
        VirtualKmd {
            gpu,
            waker,
            notify_on_submit: false,
            mode: abi::port::UserQueueMode::Both,
            doorbells,
            native_fences: true,
        }
    }

    /// Virtualizes user-mode doorbells over a pool of `count` physical doorbells, kept in the
    /// last BAR pages. A device with a global doorbell has nothing to
    /// virtualize (spec 000: "This mechanism isn't required if a GPU uses global doorbells"),
    /// so there this does nothing and returns `false`.
    pub fn set_doorbell_pool(&mut self, count: u32) -> bool {
        if let Doorbells::Global = self.doorbells {
            return false;
        }
        let top = self.gpu.lock().doorbell_slots() / abi::doorbell::DOORBELLS_PER_PAGE;
        // Keep page 0 (kernel queues) and at least one process page.
        let count = count.clamp(1, top.saturating_sub(2).max(1));
        self.doorbells = Doorbells::Pool(DoorbellPool {
            first_page: top - count,
            owners: vec![None; count as usize],
            lru: Default::default(),
        });
        true
    }

    fn connected(&self, page: u32) -> ConnectStep {
        ConnectStep::Connected {
            page_offset: page as u64 * abi::doorbell::DOORBELL_PAGE_BYTES,
            notify: self.notify_on_submit,
        }
    }

    /// Frees `q`'s pool doorbell, if it holds one.
    fn release_pool_slot(&mut self, q: FwQueueId) {
        if let Doorbells::Pool(pool) = &mut self.doorbells
            && let Some(j) = pool.owners.iter().position(|o| *o == Some(q))
        {
            pool.owners[j] = None;
            pool.lru.retain(|&x| x != q);
        }
    }

    /// Which submission models the device offers (amdgpu's `user_queue` parameter).
    pub fn set_user_queue_mode(&mut self, mode: abi::port::UserQueueMode) {
        self.mode = mode;
    }

    /// Reports the adapter without native fences (spec 002's iGPU in scenarios 2a and 2b): the
    /// OS then keeps monitored fences only.
    pub fn set_native_fences(&mut self, on: bool) {
        self.native_fences = on;
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
            doorbell_model: match self.doorbells {
                Doorbells::Global => DoorbellModel::Global,
                _ => DoorbellModel::Dedicated,
            },
            aggregated_doorbell: g.misses_unmapped_doorbells(),
            native_fences: self.native_fences,
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

    fn connect_doorbell(&mut self, q: FwQueueId, process_page: u32, index: u32) -> Result<ConnectStep, KernelError> {
        let per_page = abi::doorbell::DOORBELLS_PER_PAGE;
        let page = match &mut self.doorbells {
            Doorbells::Global => {
                // Every queue shares the one doorbell: nothing to victimize.
                self.gpu
                    .lock()
                    .bind_global_doorbell(q, process_page, index)
                    .map_err(gpu_err("doorbell index", index))?;
                process_page
            }
            Doorbells::PerProcess => {
                let slot = process_page * per_page + index;
                self.gpu.lock().bind_doorbell(q, slot).map_err(gpu_err("doorbell slot", slot))?;
                process_page
            }
            Doorbells::Pool(pool) => {
                let Some(j) = pool.owners.iter().position(Option::is_none) else {
                    // Victimize the least recently connected doorbell.
                    let victim = *pool.lru.front().expect("a full pool has connected owners");
                    return Ok(ConnectStep::Victimize { victim });
                };
                let page = pool.first_page + j as u32;
                let slot = page * per_page;
                self.gpu.lock().bind_doorbell(q, slot).map_err(gpu_err("doorbell slot", slot))?;
                pool.owners[j] = Some(q);
                pool.lru.push_back(q);
                page
            }
        };
        Ok(self.connected(page))
    }

    fn victimized(&mut self, victim: FwQueueId) {
        // The OS has rotated the victim's CPU VA away and published DisconnectedRetry: now the
        // physical disconnect (the firmware re-reads the victim's wptr so nothing is lost).
        let _ = self.gpu.lock().unbind_doorbell(victim);
        self.release_pool_slot(victim);
    }

    fn connect_kernel_doorbell(&mut self, q: FwQueueId, slot: u32) -> Result<(), KernelError> {
        self.gpu.lock().bind_doorbell(q, slot).map_err(gpu_err("doorbell slot", slot))
    }

    fn doorbell_ring(&self, index: u32) -> (u64, RingMethod) {
        match self.doorbells {
            Doorbells::PerProcess => (index as u64 * abi::doorbell::DOORBELL_BYTES, RingMethod::WriteWptr),
            // Each pool doorbell is at offset 0 of its own page (a CPU VA rotates a page).
            Doorbells::Pool(_) => (0, RingMethod::WriteWptr),
            Doorbells::Global => RingMethod::bit(index),
        }
    }

    fn aggregated_doorbell(&self, engine: EngineId) -> Option<(u64, u64)> {
        if !self.gpu.lock().misses_unmapped_doorbells() {
            return None;
        }
        match RingMethod::bit(engine.0) {
            (offset, RingMethod::SetBit { mask }) => Some((offset, mask)),
            (_, RingMethod::WriteWptr) => None,
        }
    }

    fn watch_aggregated_page(&mut self, page: u32) {
        let _ = self.gpu.lock().watch_aggregated_doorbell(page);
    }

    fn unwatch_aggregated_page(&mut self, page: u32) {
        self.gpu.lock().unwatch_aggregated_doorbell(page);
    }

    fn reserved_doorbell_pages(&self) -> std::ops::Range<u32> {
        match &self.doorbells {
            Doorbells::Pool(p) => p.first_page..p.first_page + p.owners.len() as u32,
            _ => 0..0,
        }
    }

    fn disconnect_doorbell(&mut self, q: FwQueueId) {
        let _ = self.gpu.lock().unbind_doorbell(q);
        self.release_pool_slot(q);
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
        // Without native fences nobody announces a change this device does not make itself
        // (the scheduler writes monitored fences from the CPU): its waits must poll.
        let waits = if self.native_fences { gpu::FenceWaits::Park } else { gpu::FenceWaits::Poll };
        if let Ok(monitored) = shm::Word::new(&monitored.0, monitored.1) {
            self.gpu.lock().register_native_fence((&current.0, current.1), monitored, id, waits);
        }
    }

    fn update_current_value(&mut self, current: (&Shm, u64), value: u64) {
        if let Ok(w) = current.0.atomic_u64(current.1) {
            // Release: what the CPU did before the signal is visible to whoever acquires the
            // value (GPU waits included).
            w.store(value, Ordering::Release);
        }
        self.notify_current_values();
    }

    fn notify_current_values(&mut self) {
        // The firmware re-checks the queues parked on fence WAITs; wake its thread to do it.
        self.gpu.lock().notify_fences();
        self.waker.wake();
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

    fn queue_has_work(&self, q: FwQueueId) -> bool {
        self.gpu.lock().queue_has_work(q).unwrap_or(false)
    }

    fn queue_state(&self, q: FwQueueId) -> Option<abi::QueueState> {
        self.gpu.lock().queue_state(q).ok()
    }
}

/// Interrupts the device raised, in order, as the ISR receives them.
pub type InterruptBatch = Vec<Interrupt>;
