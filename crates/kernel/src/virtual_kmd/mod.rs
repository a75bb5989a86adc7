//! [`VirtualKmd`]: the kernel-mode driver of doorbell's virtual GPU.
//!
//! It implements the DDIs of [`crate::ddi::Kmd`] by commanding the device's firmware
//! ([`gpu::Gpu`]), and translates between the OS's names and the device's: an OS queue handle
//! to a firmware queue id, a process to its VMID, an interrupt to a [`Notification`]. The
//! doorbell model is its business (spec 000 "Doorbell models"): it hands out doorbells per
//! process page, from a victimized pool (dedicated doorbells over a limited pool, a victim
//! disconnected through the OS's `DxgkCbDisconnectDoorbell`), or as bits of the device's
//! global doorbell, and the OS runs the same sequences over all three.
//!
//! Victim choice (spec 000: "disconnect the doorbell of an older or least recently used
//! hardware queue") is a [`VictimPolicy`]. The default, [`VictimPolicy::LeastRecentlyRung`],
//! takes the doorbell whose last use — its connect, or the last ring the firmware latched on it
//! — is oldest, so a busy queue keeps its doorbell and an idle one pays the reconnect. The
//! firmware records each BAR word's last use as it latches rings ([`gpu::Gpu::doorbell_of`]);
//! the KMD reads those records only when it must pick a victim, so the client's data path
//! (wptr store, doorbell store) gains no kernel call. [`VictimPolicy::LeastRecentlyConnected`]
//! takes the doorbell connected longest ago however busy its queue is: the simpler rule, kept
//! for comparison.
//!
//! Invariants: every device refusal reaches the OS as a [`DdiError`] naming the argument, its
//! reason translated from the device's error into the kernel's [`DeviceRefusal`]; the
//! translation maps hold exactly the queues, address spaces and fences that exist on the
//! device; the device lock is taken inside each DDI and never held across a callback into the
//! OS. Queues' context save areas are page ranges of one pool of memfd arenas
//! ([`shm::ShmPool`]) rather than a memfd each: kernel-owned pages that no client and no GPU
//! address space maps, so one pool serves every process.
//!
//! Its parts: `line.rs` (the interrupt line and the driver thread's waker), `doorbells.rs`
//! (the three doorbell models, the pool and its victim choice), `device.rs` (the device lock
//! a DDI holds, and the translation of device refusals); the DDIs themselves are here.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use abi::doorbell::{DoorbellModel, RingMethod};
use abi::port::{AdapterInfo, DeviceRefusal, EngineInfo};
use abi::queue::{Access, FaultKind};
use abi::slab::KeyMap;
use abi::{ContextHandle, EngineId, HwQueueHandle, PowerState, ProcessId, QueueState, Time};
use gpu::{FenceSignaled, FwQueueId, Gpu, Interrupt, QueueConfig, Vmid, cmd};
use parking_lot::Mutex;
use shm::{PoolConfig, Shm, ShmPool, Word};

use crate::ddi::{
    ConnectStep, DdiError, DisconnectCallback, GpuMapping, Kmd, Notification, QueueCreate, SignaledFences,
};

mod device;
mod doorbells;
mod line;

pub(crate) use device::refused;
use device::{Device, lock_device};
use doorbells::Doorbells;
pub use doorbells::VictimPolicy;
pub use line::{DeviceWaker, InterruptLine};

/// The KMD of doorbell's virtual GPU.
pub struct VirtualKmd {
    gpu: Arc<Mutex<Gpu>>,
    /// The device's attention register, raised while a preemption or reset waits for the
    /// device lock (engines end their turns early; see [`gpu::Attention`]).
    attention: gpu::Attention,
    /// The device clock ([`VirtualKmd::set_clock`]).
    clock: Option<Arc<dyn Fn() -> Time + Send + Sync>>,
    waker: Arc<dyn DeviceWaker>,
    line: InterruptLine,
    notify_on_submit: bool,
    mode: abi::port::UserQueueMode,
    doorbells: Doorbells,
    native_fences: bool,
    /// Each process's address space.
    vms: KeyMap<ProcessId, Vmid>,
    /// The OS's queues and their firmware ids, both ways.
    queues: KeyMap<HwQueueHandle, FwQueueId>,
    by_fw: KeyMap<FwQueueId, HwQueueHandle>,
    /// Kernel-mode queues' doorbell BAR words (`DxgkDdiSubmitCommand` rings them).
    kernel_doorbells: KeyMap<HwQueueHandle, Word>,
    /// Native fences' CurrentValue, by global id.
    fences: KeyMap<u64, (Arc<Shm>, u64)>,
    /// Native fences' MonitoredValue, by global id (`DxgkDdiUpdateMonitoredValues` stores it).
    monitored: KeyMap<u64, Word>,
    /// The OS's features, as queried at initialization.
    os_features: abi::port::OsFeatures,
    /// A deliberately wrong KMD (for tests): advertises native fences whatever the OS enabled.
    ignores_feature_query: bool,
    /// `DXGK_USERMODESUBMISSION_CAPS`: the doorbell size it reports.
    doorbell_bytes: u64,
    /// `MapToGpuSystemProcess`: the CMP reaches fences through the system process's VAs.
    map_to_system_process: bool,
    /// Each fence's system-process VAs (CurrentValue, MonitoredValue), when mapped there.
    system_vas: KeyMap<u64, (u64, u64)>,
    /// GPU mappings alive (each [`GpuMapping`] decrements on drop).
    mappings: Arc<std::sync::atomic::AtomicUsize>,
    /// Queues' context save areas: kernel-owned pages no client and no GPU address space ever
    /// maps, so one pool serves every process.
    context_saves: ShmPool,
}

impl VirtualKmd {
    /// A KMD driving `gpu`, whose interrupts arrive on `line`; `waker` is called when an
    /// engine returns to F0.
    pub fn new(gpu: Arc<Mutex<Gpu>>, waker: Arc<dyn DeviceWaker>, line: InterruptLine) -> Self {
        let (doorbells, attention) = {
            let g = gpu.lock();
            let doorbells = match g.doorbell_model() {
                DoorbellModel::Global => Doorbells::Global,
                DoorbellModel::Dedicated => Doorbells::PerProcess,
            };
            (doorbells, g.attention())
        };
        VirtualKmd {
            gpu,
            attention,
            clock: None,
            waker,
            line,
            notify_on_submit: false,
            mode: abi::port::UserQueueMode::Both,
            doorbells,
            native_fences: true,
            vms: KeyMap::default(),
            queues: KeyMap::default(),
            by_fw: KeyMap::default(),
            kernel_doorbells: KeyMap::default(),
            fences: KeyMap::default(),
            monitored: KeyMap::default(),
            os_features: abi::port::OsFeatures::default(),
            ignores_feature_query: false,
            doorbell_bytes: abi::doorbell::DOORBELL_BYTES,
            map_to_system_process: false,
            system_vas: KeyMap::default(),
            mappings: Default::default(),
            context_saves: ShmPool::new("queue-context-save", PoolConfig::default()),
        }
    }

    /// The device lock, for a DDI. The attention register is raised first
    /// ([`gpu::Attention`]): the firmware thread ends its turn at its next safe point and
    /// keeps off the lock until the guard drops, so a DDI waits for a check (microseconds),
    /// not for a whole step, and the firmware thread, which only ever tries the lock, never
    /// sleeps on it.
    fn device(&self) -> Device<'_> {
        lock_device(&self.gpu, &self.attention)
    }

    /// Maps BAR page `page` into `process`'s address space at `va`, writable.
    fn map_bar_page(&self, process: ProcessId, va: u64, page: u32) -> Result<GpuMapping, DdiError> {
        let vmid = self.vmid(process)?;
        let bar = self.device().bar().clone();
        let offset = page as u64 * abi::doorbell::DOORBELL_PAGE_BYTES;
        self.map_into(vmid, va, abi::doorbell::DOORBELL_PAGE_BYTES, (bar, offset), true)
            .map_err(refused("va", format!("{va:#x}")))
    }

    /// Maps `bytes` of `backing` (a region and its offset) at `va` in address space `vmid`;
    /// the returned mapping unmaps it when dropped (unless the address space is gone already:
    /// process teardown destroys it whole, and the mapping with it).
    fn map_into(
        &self,
        vmid: Vmid,
        va: u64,
        bytes: u64,
        backing: (Arc<Shm>, u64),
        writable: bool,
    ) -> Result<GpuMapping, gpu::GpuError> {
        let (memory, offset) = backing;
        self.device().command(cmd::Map { vmid, va, bytes, memory, offset, writable })?;
        let (gpu, live) = (self.gpu.clone(), self.mappings.clone());
        // Relaxed: a statistic; the mapping itself is ordered by the device lock.
        live.fetch_add(1, Ordering::Relaxed);
        Ok(GpuMapping::new(va, move || {
            // (An address space already gone took the mapping with it.)
            let _ = gpu.lock().command(cmd::Unmap { vmid, va });
            live.fetch_sub(1, Ordering::Relaxed);
        }))
    }

    /// The device's clock (the live one), or the OS's `now` on the deterministic driver,
    /// where a DDI takes no time.
    fn device_now(&self, now: Time) -> Time {
        self.clock.as_ref().map_or(now, |c| c())
    }

    fn fw(&self, q: HwQueueHandle) -> Result<FwQueueId, DdiError> {
        self.queues.get(&q).copied().ok_or(DdiError::UnknownQueue(q))
    }

    fn vmid(&self, p: ProcessId) -> Result<Vmid, DdiError> {
        self.vms.get(&p).copied().ok_or(DdiError::UnknownAddressSpace(p))
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

    /// Reports `MapToGpuSystemProcess` (the OS then maps every fence into the system process
    /// and passes those VAs at creation).
    pub fn set_map_to_system_process(&mut self, on: bool) {
        self.map_to_system_process = on;
    }

    /// Reports `bytes` as the doorbell size in `DXGK_USERMODESUBMISSION_CAPS` (for tests of the
    /// OS's checks; the device's doorbells stay 64-bit).
    pub fn set_reported_doorbell_bytes(&mut self, bytes: u64) {
        self.doorbell_bytes = bytes;
    }

    /// Makes this a deliberately wrong KMD (for tests): it advertises native fences whatever
    /// the OS enabled, so the OS must fail adapter initialization.
    pub fn set_ignores_feature_query(&mut self, on: bool) {
        self.ignores_feature_query = on;
    }

    /// The device clock, read when a request reaches the device after waiting for its lock
    /// (without one, requests arrive at the time the OS made them).
    pub fn set_clock(&mut self, clock: Arc<dyn Fn() -> Time + Send + Sync>) {
        self.clock = Some(clock);
    }

    /// Makes connected doorbells report `ConnectedNotify`, so the UMD calls
    /// `NotifyWorkSubmission` after each ring (spec: for "specific and infrequent scenarios").
    pub fn set_notify_on_submit(&mut self, on: bool) {
        self.notify_on_submit = on;
    }
}

impl Kmd for VirtualKmd {
    fn adapter_info(&self) -> AdapterInfo {
        use abi::port::UserQueueMode;
        let g = self.device();
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
                    // Per IP (spec 001): the mode allows them and the engine supports them.
                    user_queues: self.mode != UserQueueMode::KernelOnly && kind.supports_user_queues(),
                    kernel_queues: self.mode != UserQueueMode::UserOnly,
                    // Each engine owns an equal slice of every doorbell page.
                    doorbell_first: i as u32 * per,
                    doorbell_count: per,
                    hw_slots: g.slots(EngineId(i as u32)).map_or(0, |s| s.0),
                    user_slots: g.slots(EngineId(i as u32)).map_or(0, |(all, kernel)| all - kernel),
                })
                .collect(),
            doorbell_bytes: self.doorbell_bytes,
            doorbells_per_process: abi::doorbell::DOORBELLS_PER_PAGE,
            doorbell_model: match self.doorbells {
                Doorbells::Global => DoorbellModel::Global,
                _ => DoorbellModel::Dedicated,
            },
            aggregated_doorbell: g.misses_unmapped_doorbells(),
            // Advertised only if the OS enabled the feature (spec 002: "KMD's implementation
            // must query whether the OS has enabled DXGK_FEATURE_NATIVE_FENCE before
            // advertising native fence support").
            native_fences: self.native_fences && (self.os_features.native_fence || self.ignores_feature_query),
            user_queue_mode: self.mode,
            queue_metadata: abi::port::QueueMetadataSizes {
                context_save_bytes: gpu::compute::CONTEXT_SAVE_BYTES,
                fence_log_bytes: abi::fence_log::FENCE_LOG_BYTES,
                kernel_page_bytes: abi::queue::QUEUE_KERNEL_PAGE_BYTES,
            },
            preemption: g.preemption(),
            // The virtual device has no protected-content mode.
            secure_queues: false,
        }
    }

    fn doorbell_bar(&self) -> Arc<Shm> {
        self.device().bar().clone()
    }

    fn create_address_space(&mut self, process: ProcessId) -> Result<(), DdiError> {
        let vmid = self.device().command(cmd::CreateVm {}).map_err(refused("process", process))?;
        self.vms.insert(process, vmid);
        Ok(())
    }

    fn destroy_address_space(&mut self, process: ProcessId) -> Result<(), DdiError> {
        let vmid = self.vms.remove(&process).ok_or(DdiError::UnknownAddressSpace(process))?;
        self.device().command(cmd::DestroyVm { vmid }).map_err(refused("process", process))
    }

    fn map_gpu(
        &mut self,
        process: ProcessId,
        va: u64,
        bytes: u64,
        shm: Arc<Shm>,
        writable: bool,
    ) -> Result<GpuMapping, DdiError> {
        let vmid = self.vmid(process)?;
        self.map_into(vmid, va, bytes, (shm, 0), writable).map_err(refused("va", format!("{va:#x}+{bytes:#x}")))
    }

    fn vm_access(&self, process: ProcessId, va: u64, bytes: u64, access: Access) -> Result<(), FaultKind> {
        let outside = FaultKind::OutsideMappings { va, bytes, access };
        let vmid = self.vmid(process).map_err(|_| outside.clone())?;
        let g = self.device();
        let vm = g.vm(vmid).map_err(|_| outside)?;
        vm.translate(va, bytes, access).map(|_| ())
    }

    fn create_hw_queue(&mut self, queue: HwQueueHandle, desc: QueueCreate) -> Result<(), DdiError> {
        let vmid = self.vmid(desc.process)?;
        // Kernel-owned, never mapped for the client (like the MQD): where an interrupted
        // DISPATCH keeps its state between slices.
        let context_save = match desc.context_save.clone() {
            Some(app) => app,
            None => self.context_saves.alloc(gpu::compute::CONTEXT_SAVE_BYTES as usize)?,
        };
        let cfg = QueueConfig {
            vmid,
            engine: desc.engine,
            ring_va: desc.ring_va,
            ring_bytes: desc.ring_bytes,
            rptr_va: desc.rptr_va,
            wptr_va: desc.wptr_va,
            last_queued_va: Some(desc.last_queued_va),
            kernel_page: abi::queue::KernelPageView::new(&desc.kernel_page)?,
            fence_logs: desc.fence_logs,
            context_save,
            privileged: desc.privileged,
            priority: desc.priority,
        };
        let ring = desc.ring_va;
        let fw = self
            .device()
            .command(cmd::AddQueue { config: cfg })
            .map_err(refused("queue memory", format!("ring at {ring:#x}")))?;
        self.queues.insert(queue, fw);
        self.by_fw.insert(fw, queue);
        Ok(())
    }

    fn destroy_hw_queue(&mut self, queue: HwQueueHandle) -> Result<(), DdiError> {
        let fw = self.fw(queue)?;
        self.release_pool_doorbell(queue);
        self.kernel_doorbells.remove(&queue);
        self.queues.remove(&queue);
        self.by_fw.remove(&fw);
        self.device().command(cmd::RemoveQueue { queue: fw }).map(|_| ()).map_err(refused("queue", queue))
    }

    fn connect_doorbell(
        &mut self,
        queue: HwQueueHandle,
        process_page: u32,
        index: u32,
        callback: &mut dyn DisconnectCallback,
    ) -> Result<ConnectStep, DdiError> {
        self.connect_user_doorbell(queue, process_page, index, callback)
    }

    fn connect_kernel_doorbell(&mut self, queue: HwQueueHandle, index: u32) -> Result<(), DdiError> {
        let fw = self.fw(queue)?;
        let mut g = self.device();
        let word = Word::new(g.bar(), index as u64 * abi::doorbell::DOORBELL_BYTES)?;
        g.command(cmd::BindDoorbell { queue: fw, index }).map_err(refused("kernel doorbell", index))?;
        drop(g);
        self.kernel_doorbells.insert(queue, word);
        Ok(())
    }

    fn submit_command(&mut self, queue: HwQueueHandle, wptr: u64, _fence_id: u64) -> Result<(), DdiError> {
        let word = self.kernel_doorbells.get(&queue).ok_or(DdiError::UnknownQueue(queue))?;
        // Release: the packets and the published wptr are visible before the firmware
        // latches the ring.
        word.get().store(wptr, Ordering::Release);
        Ok(())
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
        if !self.device().misses_unmapped_doorbells() {
            return None;
        }
        // Word `engine` of the page (the firmware takes any non-zero value as a ring).
        Some((engine.0 as u64 * abi::doorbell::DOORBELL_BYTES, 1))
    }

    fn watch_aggregated_page(&mut self, page: u32) -> Result<(), DdiError> {
        self.device().command(cmd::WatchAggregatedDoorbell { page }).map_err(refused("aggregated doorbell page", page))
    }

    fn unwatch_aggregated_page(&mut self, page: u32) {
        // (Unwatching refuses nothing.)
        let _ = self.device().command(cmd::UnwatchAggregatedDoorbell { page });
    }

    fn reserved_doorbell_pages(&self) -> std::ops::Range<u32> {
        match &self.doorbells {
            Doorbells::Pool(p) => p.first_page..p.first_page + p.count,
            _ => 0..0,
        }
    }

    fn disconnect_doorbell(&mut self, queue: HwQueueHandle) -> Result<(), DdiError> {
        self.unbind(queue)
    }

    fn notify_work_submission(&mut self, queue: HwQueueHandle) -> Result<(), DdiError> {
        self.fw(queue)?;
        // The virtual firmware needs no help to see a ring; a real KMD might kick a scheduler.
        self.waker.wake();
        Ok(())
    }

    fn update_monitored(&mut self, queue: HwQueueHandle, value: u64) -> Result<(), DdiError> {
        let fw = self.fw(queue)?;
        self.device().command(cmd::SetMonitored { queue: fw, value }).map_err(refused("queue", queue))
    }

    fn set_power(&mut self, engine: EngineId, state: PowerState, now: Time) -> Result<PowerState, DdiError> {
        let mut g = self.device();
        match state {
            PowerState::F0 => {
                g.command(cmd::RequestF0 { engine, now }).map_err(refused("engine", engine))?;
                drop(g);
                self.waker.wake();
                Ok(PowerState::F0)
            }
            PowerState::F1 => match g.command(cmd::EnterF1 { engine, now }).map_err(refused("engine", engine))? {
                true => Ok(PowerState::F1),
                false => Ok(PowerState::F0),
            },
        }
    }

    fn create_native_fence(&mut self, id: u64, current: (Arc<Shm>, u64), monitored: Word) -> Result<(), DdiError> {
        // Without native fences nobody announces a change this device does not make itself
        // (the scheduler writes monitored fences from the CPU): its waits must poll.
        let waits = if self.native_fences { gpu::FenceWaits::Park } else { gpu::FenceWaits::Poll };
        // Checked here, once: `update_current_value` stores through it.
        Word::new(&current.0, current.1)?;
        let register = cmd::RegisterFence { id, current: current.clone(), monitored: monitored.clone(), waits };
        // (Registering refuses nothing.)
        let _ = self.device().command(register);
        self.fences.insert(id, current);
        self.monitored.insert(id, monitored);
        Ok(())
    }

    fn destroy_native_fence(&mut self, id: u64) {
        self.monitored.remove(&id);
        self.system_vas.remove(&id);
        if let Some((shm, offset)) = self.fences.remove(&id) {
            let _ = self.device().command(cmd::UnregisterFence { current: (shm, offset) });
        }
    }

    fn update_current_value(&mut self, id: u64, value: u64) -> Result<(), DdiError> {
        let (shm, offset) = self.fences.get(&id).ok_or(DdiError::Refused {
            field: "fence",
            value: id.to_string(),
            reason: DeviceRefusal::NotANativeFence,
        })?;
        // Release: what the CPU did before the signal is visible to whoever acquires the
        // value (GPU waits included).
        shm.atomic_u64(*offset)?.store(value, Ordering::Release);
        self.notify_current_values();
        Ok(())
    }

    fn notify_current_values(&mut self) {
        // The firmware re-checks the queues parked on fence WAITs; wake its thread to do it.
        let _ = self.device().command(cmd::NotifyFences {});
        self.waker.wake();
    }

    fn suspend_context(
        &mut self,
        _context: ContextHandle,
        queues: &[HwQueueHandle],
        now: Time,
    ) -> Result<Vec<crate::ddi::Suspended>, DdiError> {
        let fws = queues.iter().map(|&q| self.fw(q)).collect::<Result<Vec<_>, _>>()?;
        let mut g = self.device();
        let mut out = Vec::with_capacity(queues.len());
        for (fw, &queue) in fws.into_iter().zip(queues) {
            let s = g.command(cmd::SuspendQueue { queue: fw, now }).map_err(refused("queue", queue))?;
            out.push(crate::ddi::Suspended { queue, ticket: s.ticket, answered: s.answered });
        }
        drop(g);
        // A sleeping firmware thread must see the requests (and raise the answers owed).
        self.waker.wake();
        Ok(out)
    }

    fn resume_context(&mut self, _context: ContextHandle, queues: &[HwQueueHandle]) -> Result<(), DdiError> {
        let fws = queues.iter().map(|&q| self.fw(q)).collect::<Result<Vec<_>, _>>()?;
        let mut g = self.device();
        for (fw, q) in fws.into_iter().zip(queues) {
            g.command(cmd::ResumeQueue { queue: fw }).map_err(refused("queue", q))?;
        }
        drop(g);
        self.waker.wake();
        Ok(())
    }

    fn flush_fence_logs(&mut self, _queue: HwQueueHandle) {
        // The virtual engine's log writes are complete when its step returns; taking the
        // device lock orders them before the OS's reads, and the fence makes it explicit.
        let _g = self.device();
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    fn poll_notification(&mut self) -> Option<Notification> {
        loop {
            let irq = self.line.take(self.device_now(Time::ZERO))?;
            let q = |fw: FwQueueId| self.by_fw.get(&fw).copied();
            // An interrupt about a queue destroyed meanwhile names nobody: dropped.
            let n = match irq {
                Interrupt::QueueFault { queue, fault } => {
                    q(queue).map(|queue| Notification::QueueFault { queue, fault })
                }
                Interrupt::EngineStateChange { engine, state } => {
                    Some(Notification::EngineStateChange { engine, state })
                }
                Interrupt::User { queue, id } => q(queue).map(|queue| Notification::User { queue, id }),
                Interrupt::ProgressFence { queue, .. } => q(queue).map(|queue| Notification::ProgressFence { queue }),
                Interrupt::Preempted { queue, ticket, requested_at, answered_at } => {
                    q(queue).map(|queue| Notification::Preempted { queue, ticket, requested_at, answered_at })
                }
                Interrupt::NativeFenceSignaled(what) => Some(Notification::NativeFenceSignaled(match what {
                    FenceSignaled::Fences(ids) => SignaledFences::Fences(ids),
                    FenceSignaled::Queues(fws) => SignaledFences::Queues(fws.into_iter().filter_map(q).collect()),
                    FenceSignaled::All => SignaledFences::All,
                })),
                Interrupt::DisconnectedRing { queue } => q(queue).map(|queue| Notification::DisconnectedRing { queue }),
            };
            if n.is_some() {
                return n;
            }
        }
    }

    fn power(&self, engine: EngineId) -> PowerState {
        self.device().power(engine).unwrap_or(PowerState::F0)
    }

    fn queue_has_work(&self, queue: HwQueueHandle) -> bool {
        self.fw(queue).is_ok_and(|fw| self.device().queue_has_work(fw).unwrap_or(false))
    }

    fn queue_run_time(&self, queue: HwQueueHandle) -> Option<Duration> {
        self.device().queue_run_time(self.fw(queue).ok()?).ok()
    }

    fn queue_in_slot(&self, queue: HwQueueHandle) -> bool {
        self.fw(queue).is_ok_and(|fw| self.device().queue_in_slot(fw).unwrap_or(false))
    }

    fn queue_state(&self, queue: HwQueueHandle) -> Option<QueueState> {
        self.device().queue_state(self.fw(queue).ok()?).ok()
    }

    fn live_mappings(&self) -> usize {
        self.mappings.load(Ordering::Relaxed)
    }

    fn preempt_queue(&mut self, queue: HwQueueHandle, now: Time) -> Result<u64, DdiError> {
        let fw = self.fw(queue)?;
        // Engines end their turns at the next safe point and hand the lock over.
        let mut g = self.device();
        // The device's clock when the request reaches it (after the lock hand-over).
        let arrived = self.clock.as_ref().map_or(now, |c| c());
        let request = cmd::RequestPreempt { queue: fw, requested_at: now, now: arrived };
        let ticket = g.command(request).map_err(refused("queue", &queue))?;
        drop(g);
        // A sleeping firmware thread must see the request (and raise its answer).
        self.waker.wake();
        Ok(ticket)
    }

    fn reset_engine(&mut self, engine: EngineId, now: Time) -> Result<crate::ddi::EngineResetOutcome, DdiError> {
        let started = self.device_now(now);
        let mut g = self.device();
        let r = g.command(cmd::ResetEngine { engine, now }).map_err(refused("engine", &engine))?;
        let h = |fw: &FwQueueId| self.by_fw.get(fw).copied();
        // The last fence ID each guilty queue's reset aborted: the last progress value the
        // engine accepted from it.
        let guilty = r.guilty.iter().filter_map(|fw| Some((h(fw)?, g.queue_progress(*fw).ok()?.1))).collect();
        let preempted = r.preempted.iter().filter_map(h).collect();
        drop(g);
        self.waker.wake();
        let took = self.device_now(now).since(started);
        Ok(crate::ddi::EngineResetOutcome { guilty, preempted, took })
    }

    fn reset_queue(
        &mut self,
        queue: HwQueueHandle,
        why: FaultKind,
        now: Time,
    ) -> Result<crate::ddi::QueueResetOutcome, DdiError> {
        let fw = self.fw(queue)?;
        let started = self.device_now(now);
        let aborted =
            self.device().command(cmd::ResetQueue { queue: fw, why, now }).map_err(refused("queue", &queue))?;
        self.waker.wake();
        Ok(crate::ddi::QueueResetOutcome { aborted, took: self.device_now(now).since(started) })
    }

    fn migrate_allocation(
        &mut self,
        process: ProcessId,
        va: u64,
        _bytes: u64,
        _domain: abi::port::MemoryDomain,
    ) -> Result<(), DdiError> {
        // The virtual device's local and system memory are the same host memory, so the move
        // copies nothing; what is real is the page-table update: the mapping is taken out and
        // put back (no engine runs the process meanwhile), and no translation outlives it (the
        // engines cache none across turns), which is the TLB invalidation.
        let vmid = self.vmid(process)?;
        self.device().command(cmd::Remap { vmid, va }).map_err(|e| match e {
            gpu::GpuError::BadVmid(_) => refused("process", process)(e),
            e => refused("va", format!("{va:#x}"))(e),
        })
    }

    fn reset_from_timeout(&mut self, now: Time) -> Result<Vec<HwQueueHandle>, DdiError> {
        // (An adapter reset refuses nothing.)
        let lost = self.device().command(cmd::ResetAdapter { now }).unwrap_or_default();
        Ok(lost.iter().filter_map(|fw| self.by_fw.get(fw).copied()).collect())
    }

    fn restart_from_timeout(&mut self) -> Result<(), DdiError> {
        self.waker.wake();
        Ok(())
    }

    fn held_position(&self, queue: HwQueueHandle) -> Result<crate::ddi::HeldPosition, DdiError> {
        let p = self.device().held_position(self.fw(queue)?).map_err(refused("queue", &queue))?;
        Ok(crate::ddi::HeldPosition { rptr: p.rptr, wptr: p.wptr, started: p.started })
    }

    fn take_back(&mut self, queue: HwQueueHandle, wptr: u64, now: Time) -> Result<(), DdiError> {
        let fw = self.fw(queue)?;
        self.device().command(cmd::TakeBack { queue: fw, wptr, now }).map_err(refused("wptr", format!("{wptr:#x}")))?;
        // The kernel doorbell holds the last wptr rung: the next ring must differ from it.
        if let Some(word) = self.kernel_doorbells.get(&queue) {
            // Release: ordered after the firmware's new wptr, as any ring.
            word.get().store(wptr, Ordering::Release);
        }
        Ok(())
    }

    fn physical_doorbell(&self, queue: HwQueueHandle) -> Option<abi::port::PhysicalDoorbell> {
        use abi::port::PhysicalDoorbell;
        match self.device().doorbell_of(self.fw(queue).ok()?).ok()?? {
            gpu::BoundDoorbell::Word { index, .. } => Some(PhysicalDoorbell::BarIndex(index)),
            gpu::BoundDoorbell::Bit { page, bit } => Some(PhysicalDoorbell::Bit { page, bit }),
        }
    }

    fn device_queue_id(&self, queue: HwQueueHandle) -> Option<u64> {
        self.fw(queue).ok().map(|id| id.to_bits())
    }

    fn set_native_fence_log_buffer(
        &mut self,
        queue: HwQueueHandle,
        kind: abi::fence_log::FenceLogType,
        log: Arc<Shm>,
    ) -> Result<(), DdiError> {
        let fw = self.fw(queue)?;
        let index = kind as usize;
        if self.device().command(cmd::SetFenceLog { queue: fw, index, log }).map_err(refused("queue", queue))? {
            Ok(())
        } else {
            Err(DdiError::Refused {
                field: "queue",
                value: queue.to_string(),
                reason: DeviceRefusal::Unsupported("fence logs on a kernel-mode queue"),
            })
        }
    }

    fn query_features(&mut self, os: &abi::port::OsFeatures) {
        self.os_features = *os;
    }

    fn native_fence_caps(&self) -> abi::port::NativeFenceCaps {
        let supported = self.adapter_info().native_fences;
        let optimized = self.device().optimized_fence_interrupts();
        abi::port::NativeFenceCaps {
            supported,
            optimized_interrupt: supported && optimized,
            map_to_gpu_system_process: supported && self.map_to_system_process,
            current_value_stride: crate::os::FENCE_STRIDE,
            monitored_value_stride: crate::os::FENCE_STRIDE,
        }
    }

    fn create_native_fence_in_system_process(
        &mut self,
        id: u64,
        current: (Arc<Shm>, u64),
        monitored: Word,
        system: (u64, u64),
    ) -> Result<(), DdiError> {
        // The CMP's view: both VAs must resolve in the system process.
        for (field, va) in
            [("CurrentValueSystemProcessGpuVa", system.0), ("MonitoredValueSystemProcessGpuVa", system.1)]
        {
            self.vm_access(crate::os::SYSTEM_PROCESS, va, 8, Access::Read).map_err(|f| DdiError::Refused {
                field,
                value: format!("{va:#x}"),
                reason: DeviceRefusal::QueueMemory(f),
            })?;
        }
        self.create_native_fence(id, current, monitored)?;
        self.system_vas.insert(id, system);
        Ok(())
    }

    fn native_fence_storage(
        &self,
        kind: abi::port::NativeFenceType,
    ) -> (abi::port::MemoryDomain, abi::port::MemoryDomain) {
        use abi::port::MemoryDomain::{Local, System};
        match kind {
            // An IntraGpu fence is the GPU's own: both values in local memory.
            abi::port::NativeFenceType::IntraGpu => (Local, Local),
            _ => (System, System),
        }
    }

    fn map_doorbell_page(&mut self, process: ProcessId, va: u64, page: u32) -> Result<GpuMapping, DdiError> {
        // A store rings only a dedicated doorbell of the process's own page, watched as it is:
        // not a bit page (the GPU cannot OR), not a pool (the page is not the queue's).
        if !matches!(self.doorbells, Doorbells::PerProcess) {
            return Err(DdiError::Refused {
                field: "page",
                value: page.to_string(),
                reason: DeviceRefusal::Unsupported("doorbells rung from the GPU with this doorbell model"),
            });
        }
        self.map_bar_page(process, va, page)
    }

    fn map_aggregated_page(&mut self, process: ProcessId, va: u64, page: u32) -> Result<GpuMapping, DdiError> {
        // A word per engine: a plain store from the GPU rings it (`aggregated_doorbell`).
        self.map_bar_page(process, va, page)
    }

    fn read_gpu_u64(&self, process: ProcessId, va: u64) -> Option<u64> {
        let vmid = self.vmid(process).ok()?;
        let g = self.device();
        let r = g.vm(vmid).ok()?.translate_aligned(va, 8, Access::Read).ok()?;
        // Acquire: as the device's own reads of fence words.
        r.shm.load_u64(r.offset, Ordering::Acquire).ok()
    }

    fn update_monitored_values(&mut self, batch: &[(u64, u64)]) -> Result<(), DdiError> {
        // Every id first: a batch is applied whole or not at all.
        let words = batch
            .iter()
            .map(|&(id, v)| {
                self.monitored.get(&id).map(|w| (w, v)).ok_or(DdiError::Refused {
                    field: "fence",
                    value: id.to_string(),
                    reason: DeviceRefusal::NotANativeFence,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        for (w, v) in words {
            abi::protocol::store_monitored(w, v);
        }
        // One barrier for the batch: the device's later signals compare against these values.
        abi::protocol::monitored_barrier();
        Ok(())
    }
}
