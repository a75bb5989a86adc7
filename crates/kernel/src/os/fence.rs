//! Native fences in the OS (spec 002): objects and storage, CPU waits and signals, the
//! MonitoredValue protocol, and the interrupt service for `NativeFenceSignaled`.
//!
//! Storage. A fence's **CurrentValue** lives in process memory the GPU reads and writes and
//! the client maps read-only: non-shareable fences of a process are packed into one page at
//! [`FENCE_STRIDE`] (one cache line each), a shareable fence gets a page of its own. `IntraGpu`
//! fences live in local-memory pages that are never CPU-mapped. Its **MonitoredValue** lives in
//! kernel-only memory that the firmware reads through its fence table (registered by
//! `DxgkDdiCreateNativeFence`); user mode has no access at all.
//!
//! Waits. A CPU wait names fences and values, all or any. The OS keeps each fence's waiter
//! list and sets its MonitoredValue to (lowest waited value − 1), or `u64::MAX` with no waiter
//! — through [`abi::protocol::set_monitored_and_resample`], which stores MonitoredValue,
//! fences, and resamples CurrentValue, so a signal racing the registration is either seen by
//! the resample or raises the interrupt (model-checked in `abi/tests/loom.rs`). The interrupt
//! service resamples the fences it names (or all of them, for a `None` list) and wakes what is
//! satisfied. A legacy monitored fence keeps MonitoredValue at 0, so every signal interrupts.
//! [`Os::query_native_fence`] reads both values for tests and tools (spec 002's 41/42 example
//! is watched through it); it is the only way user mode sees MonitoredValue, and it changes
//! nothing.
//!
//! Cross-adapter fences ([`crate::cross`]) have their own system-memory page, shared with
//! every adapter that opens them, and a MonitoredValue pinned at 0. Whenever this adapter sees
//! one signalled — its interrupt, a CPU signal, a device error — the fence goes to the outbox,
//! which leaves the OS as [`Output::Propagate`] for its driver to hand to the cross-adapter
//! layer. A signal
//! another adapter propagates arrives through [`Os::notify_current_value`]. On an adapter
//! without native fences, fences are monitored fences (`LegacyMonitored`): creating another
//! type is refused, and a cross-adapter fence opens as one.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use abi::Time;
use abi::port::{Invalid, KernelError, NativeFenceDesc, NativeFenceInfo, NativeFenceType, WaitMode, WaitOutcome};
use abi::{DeviceHandle, HwQueueHandle, NativeFenceHandle, ProcessId};
use shm::{Prot, Shm, Word};

use super::{Os, Output, WaitId, WaitStart, Waits, invalid};
use crate::ddi::{GpuMapping, Kmd, SignaledFences};
use crate::pool::{Lease, Pool};
use crate::trace::{Ddi, Event};

/// Bytes between two fences' CurrentValues in a shared page (one cache line each).
pub const FENCE_STRIDE: u64 = 64;

/// A CPU wait on several fences.
pub(crate) struct FenceWait {
    conds: Vec<(NativeFenceHandle, u64)>,
    mode: WaitMode,
    pub(crate) wait: WaitId,
    /// Registered by the kernel-mode scheduler for a submission's `WAIT`, not by a thread:
    /// nobody ends it, so its result is not kept.
    pub(crate) scheduler: bool,
}

impl FenceWait {
    /// The kernel-mode scheduler's wait for a held-back submission's fences.
    /// The wait belongs to `pid`, whose submission it holds back: it ends with the process.
    pub(crate) fn for_scheduler(
        waits: &mut Waits,
        pid: ProcessId,
        conds: Vec<(NativeFenceHandle, u64)>,
    ) -> Arc<FenceWait> {
        Arc::new(FenceWait { conds, mode: WaitMode::All, wait: waits.open_for(pid), scheduler: true })
    }
}

/// A page of packed fence values.
pub(crate) struct FencePage {
    kind: NativeFenceType,
    current: Arc<Shm>,
    monitored: Arc<Shm>,
    va: u64,
    /// Its fence slots; a fence holds its slot's lease, so the slot returns when it goes.
    slots: Pool,
    _mapping: GpuMapping,
    /// Its mappings in the GPU system process (`MapToGpuSystemProcess`): the VAs of the
    /// CurrentValue and MonitoredValue pages there.
    sys: Option<SystemMapping>,
}

/// A fence page's two mappings in the GPU system (paging) process, for the CMP.
pub(crate) struct SystemMapping {
    current_va: u64,
    monitored_va: u64,
    _mappings: [GpuMapping; 2],
}

/// A native fence object.
pub(crate) struct FenceObj {
    pub(crate) device: DeviceHandle,
    id: u64,
    kind: NativeFenceType,
    /// The CurrentValue's page and its offset there.
    storage: Arc<Shm>,
    coff: u64,
    pub(crate) va: u64,
    /// CurrentValue and MonitoredValue, checked once at creation.
    value: Word,
    monitored: Word,
    /// Its slot in a packed page; `None` for a fence with a page of its own.
    _slot: Option<Lease>,
    /// Created shareable (opened with global and local handles).
    shared: bool,
    /// Its cross-adapter handle, for a cross-adapter fence.
    cross: Option<u64>,
    waiters: Vec<(u64, Arc<FenceWait>)>,
    /// The GPU mapping of a fence with a page of its own (packed fences share their page's).
    _mapping: Option<GpuMapping>,
    /// Its CurrentValue's and MonitoredValue's VAs in the GPU system process, with the
    /// mappings a fence with pages of its own holds there.
    system: Option<(u64, u64)>,
    _system_mapping: Option<SystemMapping>,
    /// A queue's progress fence: only its engine writes it (no CPU signal, no
    /// AlwaysSignaled write).
    engine_only: bool,
    /// Where CurrentValue and MonitoredValue live (the KMD's
    /// `D3DKMDT_FENCESTORAGESURFACEDATA`; a cross-adapter CurrentValue is always in system
    /// memory).
    storage_domains: (abi::port::MemoryDomain, abi::port::MemoryDomain),
}

impl FenceObj {
    pub(crate) fn current(&self) -> u64 {
        // Acquire: pairs with the signaller's release (engine or kernel), so the signalled
        // work is visible once the value is.
        self.value.get().load(Ordering::Acquire)
    }
}

impl Os {
    /// `D3DKMTCreateNativeFence`: storage (a packed slot, or a page of its own for a
    /// shareable or cross-adapter fence), then `DxgkDdiCreateNativeFence`.
    pub fn create_native_fence(
        &mut self,
        pid: ProcessId,
        device: DeviceHandle,
        desc: &NativeFenceDesc,
        now: Time,
    ) -> Result<NativeFenceInfo, KernelError> {
        self.at(now);
        self.proc(pid)?.devices.get(device)?;
        if !self.native_fences && desc.kind != NativeFenceType::LegacyMonitored {
            return Err(invalid("kind", format!("{:?}", desc.kind), Invalid::NoNativeFences));
        }
        if desc.cross_adapter {
            // Spec 002: "A cross-adapter fence must be created with type DEFAULT" (a monitored
            // fence where there are no native fences).
            let allowed = if self.native_fences { NativeFenceType::Default } else { NativeFenceType::LegacyMonitored };
            if desc.kind != allowed {
                return Err(invalid("kind", format!("{:?}", desc.kind), Invalid::CrossAdapterKind { allowed }));
            }
            if self.cross.is_none() {
                return Err(invalid("cross_adapter", true, Invalid::SingleAdapter));
            }
        }
        // Find or make storage.
        let (current, monitored, va, coff, slot, mapping, system, own_sys) = if desc.shareable || desc.cross_adapter {
            let name = if desc.cross_adapter { "fence-cross-adapter" } else { "fence-shared" };
            let (c, m) = (Shm::new(name, 4096)?, Shm::new("fence-monitored", 4096)?);
            let va = self.proc(pid)?.take_va(4096);
            let mapping = self.ddi.map_gpu(pid, va, 4096, c.clone(), true)?;
            let sys = self.map_into_system_process(&c, &m)?;
            let system = sys.as_ref().map(|s| (s.current_va, s.monitored_va));
            (c, m, va, 0, None, Some(mapping), system, sys)
        } else {
            let p = self.proc(pid)?;
            let found = p
                .fence_pages
                .iter()
                .enumerate()
                .find_map(|(i, pg)| (pg.kind == desc.kind).then(|| pg.slots.take().ok().map(|s| (i, s))).flatten());
            let (i, lease) = match found {
                Some(x) => x,
                None => {
                    // CurrentValue: the client maps it read-only; MonitoredValue: kernel-only.
                    let (c, m) = (p.memory.readable.alloc(4096)?, p.memory.private.alloc(4096)?);
                    let va = p.take_va(4096);
                    let mapping = self.ddi.map_gpu(pid, va, 4096, c.clone(), true)?;
                    let sys = self.map_into_system_process(&c, &m)?;
                    let per_page = (4096 / self.fence_stride) as u32;
                    let p = self.proc(pid)?;
                    p.fence_pages.push(FencePage {
                        kind: desc.kind,
                        current: c,
                        monitored: m,
                        va,
                        slots: Pool::new("fence slots", 0..per_page, None),
                        _mapping: mapping,
                        sys,
                    });
                    let pg = p.fence_pages.last().expect("just pushed");
                    (p.fence_pages.len() - 1, pg.slots.take()?)
                }
            };
            let stride = self.fence_stride;
            let pg = &self.proc(pid)?.fence_pages[i];
            let off = lease.index() as u64 * stride;
            let system = pg.sys.as_ref().map(|s| (s.current_va + off, s.monitored_va + off));
            (pg.current.clone(), pg.monitored.clone(), pg.va + off, off, Some(lease), None, system, None)
        };
        // A legacy monitored fence and a cross-adapter fence always interrupt.
        let always = desc.kind == NativeFenceType::LegacyMonitored || desc.cross_adapter;
        let (value, monitored) = (Word::new(&current, coff)?, Word::new(&monitored, coff)?);
        value.get().store(desc.initial, Ordering::Release);
        monitored.get().store(if always { 0 } else { u64::MAX }, Ordering::Release);
        let id = self.next_fence_id;
        self.next_fence_id += 1;
        // A shared fence: DxgkDdiCreateNativeFence (global), then DxgkDdiOpenNativeFence for
        // the creating process's local handle (spec 002 "Global and local handles").
        // On failure its slot lease (or its own page's mapping) drops, and returns. With
        // MapToGpuSystemProcess the system-process VAs go with it.
        match system {
            Some(sys) => {
                self.ddi.create_native_fence_in_system_process(id, (current.clone(), coff), monitored.clone(), sys)?
            }
            None => self.ddi.create_native_fence(id, (current.clone(), coff), monitored.clone())?,
        }
        let cross = match (&self.cross, desc.cross_adapter) {
            (Some((x, me)), true) => Some(x.create(*me, id, current.clone(), coff)),
            _ => None,
        };
        let storage_domains = self.fence_storage(desc.kind, desc.cross_adapter);
        let handle = self.proc(pid)?.fences.insert(FenceObj {
            device,
            id,
            kind: desc.kind,
            storage: current.clone(),
            coff,
            va,
            value,
            monitored,
            _slot: slot,
            shared: desc.shareable,
            cross,
            waiters: Vec::new(),
            _mapping: mapping,
            system,
            _system_mapping: own_sys,
            engine_only: false,
            storage_domains,
        });
        if desc.shareable
            && let Err(e) = self.ddi.open_native_fence(id, handle)
        {
            // Not half-made: the fence goes again.
            let _ = self.proc(pid)?.fences.remove(handle);
            self.ddi.destroy_native_fence(id);
            return Err(e.into());
        }
        self.fence_index.insert(id, vec![(pid, handle)]);
        let cpu = match desc.kind {
            NativeFenceType::IntraGpu => None,
            _ => Some(current.map_range(0, 4096, Prot::ReadOnly)?),
        };
        Ok(NativeFenceInfo {
            handle,
            va,
            cpu,
            offset: coff,
            global: desc.shareable.then_some(id),
            kind: desc.kind,
            cross_adapter: cross,
        })
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
        self.proc(pid)?.devices.get(device)?;
        let Some((x, me)) = self.cross.clone() else {
            return Err(invalid("handle", handle, Invalid::SingleAdapter));
        };
        let (current, coff) = x.storage(handle)?;
        // This adapter has it already (created here, or opened before): one more local
        // instance of the same fence object, as for a shared fence — the KMD knows it once.
        let existing = self.fence_index.values().find_map(|v| {
            let &(p, h) = v.first()?;
            let f = self.processes.get(&p)?.fences.get(h).ok()?;
            (f.cross == Some(handle)).then_some((p, h))
        });
        if let Some(instance) = existing {
            return self.open_instance(pid, device, instance, now);
        }
        let va = self.proc(pid)?.take_va(4096);
        let mapping = self.ddi.map_gpu(pid, va, 4096, current.clone(), true)?;
        let kind = if self.native_fences { NativeFenceType::Default } else { NativeFenceType::LegacyMonitored };
        let monitored = Word::new(&self.proc(pid)?.memory.private.alloc(4096)?, coff)?;
        monitored.get().store(0, Ordering::Release);
        let id = self.next_fence_id;
        self.next_fence_id += 1;
        self.ddi.create_native_fence(id, (current.clone(), coff), monitored.clone())?;
        let storage_domains = self.fence_storage(kind, true);
        let h = self.proc(pid)?.fences.insert(FenceObj {
            device,
            id,
            kind,
            storage: current.clone(),
            coff,
            va: va + coff,
            value: Word::new(&current, coff)?,
            monitored,
            _slot: None,
            shared: false,
            cross: Some(handle),
            waiters: Vec::new(),
            _mapping: Some(mapping),
            system: None,
            _system_mapping: None,
            engine_only: false,
            storage_domains,
        });
        self.fence_index.insert(id, vec![(pid, h)]);
        x.opened(handle, me, id);
        let cpu = Some(current.map_range(0, 4096, Prot::ReadOnly)?);
        Ok(NativeFenceInfo {
            handle: h,
            va: va + coff,
            cpu,
            offset: coff,
            global: None,
            kind,
            cross_adapter: Some(handle),
        })
    }

    /// Another adapter signalled cross-adapter fence `id` (this adapter's local id). A
    /// native-fence adapter calls `DxgkDdiUpdateCurrentValuesFromCpu` with `NotificationOnly`
    /// (the KMD rescans its run list, unblocking GPU waiters); either kind then wakes what
    /// the value satisfies (CPU waiters, and the kernel-mode scheduler's monitored-fence
    /// waiting list).
    pub(crate) fn notify_current_value(&mut self, id: u64, now: Time) {
        let instances = self.instances(id);
        let Some(&(_, first)) = instances.first() else { return };
        self.trace.push(now, Event::CrossAdapterNotified { fence: first });
        if self.native_fences {
            self.trace.push(now, Event::Ddi(Ddi::UpdateCurrentValueNotificationOnly(first)));
            self.ddi.notify_current_values();
        }
        for (pid, h) in instances {
            self.settle_fence(pid, h, now);
        }
    }

    /// This adapter saw fence `id` signalled: if it is a cross-adapter fence, queue it for
    /// propagation to the other adapters (after the OS lock is released).
    fn note_signaled(&mut self, id: u64, now: Time) {
        let Some(&(pid, h)) = self.instances(id).first() else { return };
        let Some(x) = self.processes.get(&pid).and_then(|p| p.fences.get(h).ok()).and_then(|f| f.cross) else {
            return;
        };
        if !self.outputs.contains(&Output::Propagate(x)) {
            self.trace.push(now, Event::CrossAdapterSignal { fence: h });
            self.outputs.push_back(Output::Propagate(x));
        }
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
        self.proc(pid)?.devices.get(device)?;
        let &(opid, oh) = self
            .fence_index
            .get(&global)
            .and_then(|v| v.first())
            .ok_or_else(|| invalid("global", global, Invalid::NoSuchFence))?;
        let o = self.proc(opid)?.fences.get(oh)?;
        if !o.shared {
            return Err(invalid("global", global, Invalid::NotShareable));
        }
        self.open_instance(pid, device, (opid, oh), now)
    }

    /// Another local instance, in process `pid`, of the fence that instance `(opid, oh)`
    /// belongs to: the same storage mapped at a VA of its own, under a local handle of its own
    /// (`DxgkDdiOpenNativeFence`). A cross-adapter fence stays one: every instance propagates.
    fn open_instance(
        &mut self,
        pid: ProcessId,
        device: DeviceHandle,
        (opid, oh): (ProcessId, NativeFenceHandle),
        _now: Time,
    ) -> Result<NativeFenceInfo, KernelError> {
        let o = self.proc(opid)?.fences.get(oh)?;
        let (id, kind, current, coff, value, monitored, cross, storage_domains) =
            (o.id, o.kind, o.storage.clone(), o.coff, o.value.clone(), o.monitored.clone(), o.cross, o.storage_domains);
        let va = self.proc(pid)?.take_va(4096);
        let mapping = self.ddi.map_gpu(pid, va, 4096, current.clone(), true)?;
        let handle = self.proc(pid)?.fences.insert(FenceObj {
            device,
            id,
            kind,
            storage: current.clone(),
            coff,
            va: va + coff,
            value,
            monitored,
            _slot: None,
            shared: true,
            cross,
            waiters: Vec::new(),
            _mapping: Some(mapping),
            system: None,
            _system_mapping: None,
            engine_only: false,
            storage_domains,
        });
        if let Err(e) = self.ddi.open_native_fence(id, handle) {
            let _ = self.proc(pid)?.fences.remove(handle);
            return Err(e.into());
        }
        self.fence_index.entry(id).or_default().push((pid, handle));
        let cpu = match kind {
            NativeFenceType::IntraGpu => None,
            _ => Some(current.map_range(0, 4096, Prot::ReadOnly)?),
        };
        Ok(NativeFenceInfo { handle, va: va + coff, cpu, offset: coff, global: Some(id), kind, cross_adapter: cross })
    }

    /// Closes a process's local handle; the global fence goes with its last one.
    pub fn destroy_native_fence(&mut self, pid: ProcessId, h: NativeFenceHandle, now: Time) -> Result<(), KernelError> {
        self.at(now);
        let f = self.proc(pid)?.fences.remove(h)?;
        // Close this process's local handle; destroy the global fence with its last one.
        let left = match self.fence_index.get_mut(&f.id) {
            Some(v) => {
                v.retain(|&(p, x)| (p, x) != (pid, h));
                v.len()
            }
            None => 0,
        };
        if f.shared {
            self.ddi.close_native_fence(h);
        }
        if left == 0 {
            self.ddi.destroy_native_fence(f.id);
            self.fence_index.remove(&f.id);
            if let (Some(handle), Some((x, me))) = (f.cross, &self.cross) {
                x.closed(handle, *me, f.id);
            }
        }
        let lost = KernelError::InvalidArgument {
            field: "fence",
            value: h.to_string(),
            reason: Invalid::DestroyedWhileWaited,
        };
        for (_, w) in &f.waiters {
            self.complete_fence_wait(w, Err(lost.clone()));
            self.forget_wait(pid, w);
        }
        // Its slot goes back to its page (or its own page is unmapped) as `f` drops.
        let id = f.id;
        drop(f);
        // The closed instance's waiters are gone: the shared MonitoredValue may rise.
        if left > 0 {
            self.program_monitored(id);
        }
        Ok(())
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
        Ok(abi::port::NativeFenceValues { current: f.current(), monitored: f.monitored.get().load(Ordering::Acquire) })
    }

    /// Signals a native fence from the CPU (`DxgkDdiUpdateCurrentValuesFromCpu`).
    pub fn signal_native_fence(
        &mut self,
        pid: ProcessId,
        h: NativeFenceHandle,
        value: u64,
        now: Time,
    ) -> Result<(), KernelError> {
        if value == abi::port::FENCE_ALWAYS_SIGNALED {
            return Err(invalid("value", value, Invalid::Reserved));
        }
        let f = self.proc(pid)?.fences.get(h)?;
        if f.engine_only {
            return Err(invalid("fence", h, Invalid::Unsupported("CPU signals of a queue's progress fence")));
        }
        let cur = f.current();
        if value < cur {
            return Err(KernelError::NotIncreasing { field: "value", value, last: cur });
        }
        let (word, id) = (f.value.clone(), f.id);
        if self.native_fences {
            // `DxgkDdiUpdateCurrentValuesFromCpu`: the KMD stores it and the firmware's
            // parked waiters re-check.
            self.trace.push(now, Event::Ddi(Ddi::UpdateCurrentValueFromCpu(h, value)));
            self.ddi.update_current_value(id, value)?;
        } else {
            // Without native fences the scheduler writes the monitored fence itself; its GPU
            // waits are its own (kernel-mode queues only). Release: what the CPU did before
            // is visible to whoever acquires the value.
            word.get().store(value, Ordering::Release);
        }
        // Every process that has the fence open sees the signal; so does every adapter.
        for (p, x) in self.instances(id) {
            self.settle_fence(p, x, now);
        }
        self.note_signaled(id, now);
        Ok(())
    }

    /// With `MapToGpuSystemProcess`, maps a fence page's CurrentValue and MonitoredValue into
    /// the GPU system process (spec 002 "GPU VA mappings in paging process address space for
    /// CMP use"); `None` without the cap.
    fn map_into_system_process(
        &mut self,
        current: &Arc<Shm>,
        monitored: &Arc<Shm>,
    ) -> Result<Option<SystemMapping>, KernelError> {
        if !self.fence_caps.map_to_gpu_system_process {
            return Ok(None);
        }
        let (cva, mva) = (self.take_system_va(4096), self.take_system_va(4096));
        let c = self.ddi.map_gpu(super::SYSTEM_PROCESS, cva, 4096, current.clone(), true)?;
        // The CMP reads MonitoredValue; only the KMD writes it.
        let m = self.ddi.map_gpu(super::SYSTEM_PROCESS, mva, 4096, monitored.clone(), false)?;
        Ok(Some(SystemMapping { current_va: cva, monitored_va: mva, _mappings: [c, m] }))
    }

    /// Where fence `kind`'s values live: the KMD's segments (spec 002 "DDI to support
    /// placement of native fence values in local memory"), except that a cross-adapter
    /// fence's CurrentValue is always in system memory (spec 002: "Current value for cross
    /// adapter fences is always in system memory").
    fn fence_storage(
        &self,
        kind: NativeFenceType,
        cross_adapter: bool,
    ) -> (abi::port::MemoryDomain, abi::port::MemoryDomain) {
        let (current, monitored) = self.ddi.native_fence_storage(kind);
        (if cross_adapter { abi::port::MemoryDomain::System } else { current }, monitored)
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
        self.ddi.read_gpu_u64(super::SYSTEM_PROCESS, va)
    }

    /// Starts a CPU wait. Returns at once if it is already satisfied.
    pub fn begin_fence_wait(
        &mut self,
        pid: ProcessId,
        conds: &[(NativeFenceHandle, u64)],
        mode: WaitMode,
        now: Time,
    ) -> Result<WaitStart, KernelError> {
        if conds.is_empty() {
            return Err(invalid("fences", 0, Invalid::EmptyWait));
        }
        let p = self.proc(pid)?;
        for (h, _) in conds {
            let f = p.fences.get(*h)?;
            if p.devices.get(f.device).is_ok_and(|d| d.error) {
                return Err(KernelError::DeviceLost { device: f.device });
            }
            if f.kind == NativeFenceType::IntraGpu {
                return Err(invalid("fences", h, Invalid::NoCpuAccess));
            }
        }
        if let Some(i) = evaluate(p, conds, mode) {
            return Ok(WaitStart::Done(Ok(WaitOutcome::Reached(i))));
        }
        let wait =
            Arc::new(FenceWait { conds: conds.to_vec(), mode, wait: self.waits.open_for(pid), scheduler: false });
        self.register_wait(pid, &wait, now)?;
        Ok(WaitStart::Blocked(wait.wait))
    }

    /// A device in error: every fence it owns becomes AlwaysSignaled (CurrentValue =
    /// `u64::MAX`, so GPU waits pass), and its blocked CPU waiters end with `DeviceLost`.
    pub fn mark_device_error(&mut self, pid: ProcessId, device: DeviceHandle, now: Time) -> Result<(), KernelError> {
        self.at(now);
        self.proc(pid)?.devices.get_mut(device)?.error = true;
        self.trace.push(now, Event::DeviceError { device });
        let lost = KernelError::DeviceLost { device };
        let p = self.proc(pid)?;
        // A queue's progress fence is the engine's to write; its waiters end below.
        let mine: Vec<NativeFenceHandle> =
            p.fences.iter().filter(|(_, f)| f.device == device && !f.engine_only).map(|(h, _)| h).collect();
        let progress: Vec<Arc<FenceWait>> = p
            .fences
            .iter()
            .filter(|(_, f)| f.device == device && f.engine_only)
            .flat_map(|(_, f)| f.waiters.iter().map(|(_, w)| w.clone()))
            .collect();
        let mut waits = Vec::new();
        for &h in &mine {
            let f = self.proc(pid)?.fences.get(h)?;
            waits.extend(f.waiters.iter().map(|(_, w)| w.clone()));
            let id = f.id;
            self.trace.push(now, Event::Ddi(Ddi::UpdateCurrentValueFromCpu(h, abi::port::FENCE_ALWAYS_SIGNALED)));
            self.ddi.update_current_value(id, abi::port::FENCE_ALWAYS_SIGNALED)?;
            // The other adapters' waiters see the shared value pass too.
            self.note_signaled(id, now);
        }
        for w in waits.into_iter().chain(progress) {
            self.complete_fence_wait(&w, Err(lost.clone()));
            self.forget_wait(pid, &w);
        }
        Ok(())
    }

    /// The queue's progress fence as a native fence (spec 002 "Indicating a native progress
    /// fence for hardware queues"): the kernel page's completed value, registered with the KMD
    /// (`DxgkDdiCreateNativeFence`) so the engine's `PROGRESS_FENCE` signals it with the native
    /// protocol. Opening it again answers the same fence.
    pub fn open_progress_fence(
        &mut self,
        pid: ProcessId,
        q: HwQueueHandle,
        now: Time,
    ) -> Result<NativeFenceInfo, KernelError> {
        self.at(now);
        if !self.native_fences {
            return Err(invalid("queue", q, Invalid::NoNativeFences));
        }
        let p = self.proc(pid)?;
        let qo = p.queues.get(q)?;
        qo.live(q)?;
        let device = p.contexts.get(qo.context)?.device;
        let word = qo.kernel_page.progress_completed();
        let shm::Region::Shm(storage) = word.region() else {
            return Err(invalid("queue", q, Invalid::Unsupported("a progress fence outside kernel memory")));
        };
        let (storage, coff) = (storage.clone(), word.offset());
        let va = qo._kernel_page_mapping.va() + coff;
        let existing = qo.progress_fence.filter(|&h| p.fences.get(h).is_ok());
        let h = match existing {
            Some(h) => h,
            None => {
                let monitored = Word::new(&p.memory.private.alloc(4096)?, 0)?;
                monitored.get().store(u64::MAX, Ordering::Release);
                let id = self.next_fence_id;
                self.next_fence_id += 1;
                self.ddi.create_native_fence(id, (storage.clone(), coff), monitored.clone())?;
                let value = Word::new(&storage, coff)?;
                let p = self.proc(pid)?;
                let h = p.fences.insert(FenceObj {
                    device,
                    id,
                    kind: NativeFenceType::Default,
                    storage: storage.clone(),
                    coff,
                    va,
                    value,
                    monitored,
                    _slot: None,
                    shared: false,
                    cross: None,
                    waiters: Vec::new(),
                    _mapping: None,
                    system: None,
                    _system_mapping: None,
                    engine_only: true,
                    storage_domains: (abi::port::MemoryDomain::System, abi::port::MemoryDomain::System),
                });
                p.queues.get_mut(q)?.progress_fence = Some(h);
                self.fence_index.insert(id, vec![(pid, h)]);
                h
            }
        };
        let cpu = Some(storage.map_range(0, 4096, Prot::ReadOnly)?);
        Ok(NativeFenceInfo {
            handle: h,
            va,
            cpu,
            offset: coff,
            global: None,
            kind: NativeFenceType::Default,
            cross_adapter: None,
        })
    }

    /// Registers `wait` on each of its fences, then settles them (programs MonitoredValue and
    /// resamples, which may complete it at once).
    pub(crate) fn register_wait(
        &mut self,
        pid: ProcessId,
        wait: &Arc<FenceWait>,
        now: Time,
    ) -> Result<(), KernelError> {
        let p = self.proc(pid)?;
        for &(h, value) in &wait.conds {
            p.fences.get_mut(h)?.waiters.push((value, wait.clone()));
        }
        for &(h, _) in &wait.conds {
            self.settle_fence(pid, h, now);
        }
        Ok(())
    }

    /// Deregisters a finished or abandoned wait from every fence it named.
    pub(crate) fn forget_wait(&mut self, pid: ProcessId, wait: &Arc<FenceWait>) {
        let ids = self.unregister_wait(pid, wait);
        // Raising a MonitoredValue cannot lose a wake-up, so no resample is needed here.
        let batch: Vec<(u64, u64)> = ids.into_iter().map(|id| (id, self.monitored_for(id))).collect();
        if !batch.is_empty() {
            self.update_monitored_values(&batch);
        }
    }

    /// Takes `wait` off every fence it named; returns those fences' ids (their MonitoredValue
    /// may now rise).
    fn unregister_wait(&mut self, pid: ProcessId, wait: &Arc<FenceWait>) -> Vec<u64> {
        let Ok(p) = self.proc(pid) else { return Vec::new() };
        let mut ids = Vec::new();
        for &(h, _) in &wait.conds {
            if let Ok(f) = p.fences.get_mut(h) {
                f.waiters.retain(|(_, w)| w.wait != wait.wait);
                if !ids.contains(&f.id) {
                    ids.push(f.id);
                }
            }
        }
        ids
    }

    /// Ends a CPU wait: deregisters it and reports.
    pub fn end_fence_wait(&mut self, pid: ProcessId, id: WaitId) -> Result<WaitOutcome, KernelError> {
        if let Ok(p) = self.proc(pid) {
            let found =
                p.fences.iter().find_map(|(_, f)| f.waiters.iter().find(|(_, w)| w.wait == id).map(|(_, w)| w.clone()));
            if let Some(w) = found {
                self.forget_wait(pid, &w);
            }
        }
        match self.waits.take(id) {
            Some(Ok(i)) => Ok(WaitOutcome::Reached(i)),
            Some(Err(e)) => Err(e),
            None => Ok(WaitOutcome::TimedOut),
        }
    }

    /// Wakes what fence `h`'s CurrentValue satisfies, then programs its MonitoredValue for the
    /// rest and resamples, until nothing changes (`DxgkDdiUpdateMonitoredValues`, then the
    /// OS's resample).
    pub(crate) fn settle_fence(&mut self, pid: ProcessId, h: NativeFenceHandle, now: Time) {
        self.settle_fences(&[(pid, h)], now);
    }

    /// [`Os::settle_fence`] for several fences at once: one `DxgkDdiUpdateMonitoredValues`
    /// per round carries every fence's new MonitoredValue (the spec's batch), then each is
    /// resampled.
    pub(crate) fn settle_fences(&mut self, targets: &[(ProcessId, NativeFenceHandle)], now: Time) {
        let mut round: Vec<(ProcessId, NativeFenceHandle)> = Vec::new();
        for t in targets {
            if !round.contains(t) {
                round.push(*t);
            }
        }
        while !round.is_empty() {
            // 1. Wake what the CurrentValues satisfy. The fences those waits also named (but
            // this round does not settle) get their raised MonitoredValue in the same batch.
            let mut raised: Vec<u64> = Vec::new();
            for &(pid, h) in &round {
                let Ok(p) = self.proc(pid) else { continue };
                let Ok(f) = p.fences.get(h) else { continue };
                let done: Vec<(Arc<FenceWait>, u64)> = f
                    .waiters
                    .iter()
                    .filter_map(|(_, w)| evaluate(p, &w.conds, w.mode).map(|r| (w.clone(), r)))
                    .collect();
                for (w, r) in &done {
                    self.complete_fence_wait(w, Ok(*r));
                    raised.extend(self.unregister_wait(pid, w));
                }
            }
            // 2. One DDI for every MonitoredValue (a shared fence's once).
            let mut items = Vec::new();
            let mut batch: Vec<(u64, u64)> = Vec::new();
            for &(pid, h) in &round {
                let Ok(id) = self.proc(pid).and_then(|p| p.fences.get(h).map(|f| f.id)) else { continue };
                let m = self.monitored_for(id);
                if !batch.iter().any(|&(i, _)| i == id) {
                    batch.push((id, m));
                }
                items.push((pid, h, m));
            }
            for id in raised {
                if !batch.iter().any(|&(i, _)| i == id) && !self.instances(id).is_empty() {
                    batch.push((id, self.monitored_for(id)));
                }
            }
            if batch.is_empty() {
                return;
            }
            self.update_monitored_values(&batch);
            // 3. Resample. Any signal after the barrier sees the new MonitoredValue and
            // interrupts; a signal before it is in `resampled`. So a waiter this fence's
            // `resampled` value passes gets no interrupt: if its whole wait (other fences too)
            // is now satisfied, wake it in another round; otherwise stop (its other fences'
            // signals will settle it).
            let mut next = Vec::new();
            for (pid, h, m) in items {
                let Ok(p) = self.proc(pid) else { continue };
                let Ok(f) = p.fences.get(h) else { continue };
                let resampled = abi::protocol::resample(f.value.get());
                let pending = f.waiters.iter().any(|(v, w)| *v <= resampled && evaluate(p, &w.conds, w.mode).is_some());
                self.trace.push(now, Event::Ddi(Ddi::UpdateMonitoredValues(h, m)));
                if pending {
                    next.push((pid, h));
                }
            }
            round = next;
        }
    }

    /// `DxgkDdiUpdateMonitoredValues` for a batch. Should the KMD refuse it (it never does for
    /// fences it registered), the OS stores the values itself with the same barrier, so no
    /// wake-up can be lost.
    fn update_monitored_values(&mut self, batch: &[(u64, u64)]) {
        self.stats.monitored_updates += 1;
        self.stats.monitored_values += batch.len() as u64;
        if self.ddi.update_monitored_values(batch).is_ok() {
            return;
        }
        for &(id, m) in batch {
            if let Some(&(pid, h)) = self.instances(id).first()
                && let Some(f) = self.processes.get(&pid).and_then(|p| p.fences.get(h).ok())
            {
                abi::protocol::store_monitored(f.monitored.get(), m);
            }
        }
        abi::protocol::monitored_barrier();
    }

    /// `NativeFenceSignaled`: settle the named fences; for named queues (the optimized mode),
    /// flush and read their signal logs to learn which fences; with no list, or when a log was
    /// overrun or is corrupt, settle every fence with a waiter (the fallback scan).
    pub(crate) fn service_fences(&mut self, what: SignaledFences, now: Time) {
        self.stats.fence_interrupts += 1;
        let targets: Vec<(ProcessId, NativeFenceHandle)> = match what {
            SignaledFences::Fences(ids) => ids.iter().flat_map(|&id| self.instances(id)).collect(),
            SignaledFences::Queues(queues) => self.fences_in_logs(&queues, true, now),
            SignaledFences::EngineLogs(engine) => {
                // A NULL queue: rescan the signal logs of every queue on this engine.
                let queues: Vec<HwQueueHandle> = self
                    .processes
                    .values()
                    .flat_map(|p| p.queues.iter().filter(|(_, q)| q.engine == engine && q.logs.is_some()))
                    .map(|(h, _)| h)
                    .collect();
                self.fences_in_logs(&queues, false, now)
            }
            SignaledFences::All => self.fences_with_waiters(),
            SignaledFences::AllNative => {
                let all = self.fences_with_waiters();
                all.into_iter()
                    .filter(|&(pid, h)| {
                        self.processes
                            .get(&pid)
                            .and_then(|p| p.fences.get(h).ok())
                            .is_some_and(|f| f.kind != NativeFenceType::LegacyMonitored)
                    })
                    .collect()
            }
        };
        self.settle_signaled(targets, now);
    }

    /// Settles `targets` and notes each as signalled.
    fn settle_signaled(&mut self, targets: Vec<(ProcessId, NativeFenceHandle)>, now: Time) {
        self.settle_fences(&targets, now);
        for (pid, h) in targets {
            if let Ok(id) = self.proc(pid).and_then(|p| p.fences.get(h).map(|f| f.id)) {
                self.note_signaled(id, now);
            }
        }
    }

    /// The fence instances the signal logs of `queues` name ([`Os::read_signal_logs`]), or
    /// every fence with a waiter when the logs cannot be trusted (the fallback scan).
    fn fences_in_logs(
        &mut self,
        queues: &[HwQueueHandle],
        each_names_one: bool,
        now: Time,
    ) -> Vec<(ProcessId, NativeFenceHandle)> {
        match self.read_signal_logs(queues, each_names_one, now) {
            Some(ids) => ids.iter().flat_map(|&id| self.instances(id)).collect(),
            None => {
                self.stats.fence_log_fallbacks += 1;
                self.fences_with_waiters()
            }
        }
    }

    /// Reads queue `q`'s signal log to its end (after the KMD's flush) and settles the fences
    /// it names: what [`Os::recreate_fence_log`] does with the old log, so a signal written
    /// there and not yet read is not lost with it.
    pub(super) fn drain_signal_log(&mut self, q: HwQueueHandle, now: Time) {
        let targets = self.fences_in_logs(&[q], false, now);
        self.settle_signaled(targets, now);
    }

    /// Flushes (`DxgkDdiUpdateNativeFenceLogs`) and reads the signal logs of `queues`; returns
    /// the fence ids they name, or `None` when the kernel must scan every fence instead.
    ///
    /// The log is written where the client says (it chooses the positions), so the kernel
    /// trusts it only to narrow the search: anything it cannot account for — a queue gone, no
    /// log, a corrupt or overrun log, or (with `each_names_one`, an interrupt that named the
    /// queue) a log with no new entry that explains the interrupt ([`Os::explains`]) — falls
    /// back to the scan. An overrun is also flagged in the trace ([`Event::FenceLogOverrun`], spec 002: "the OS can emit a flag in
    /// the trace to notify a user that events were lost").
    fn read_signal_logs(&mut self, queues: &[HwQueueHandle], each_names_one: bool, now: Time) -> Option<Vec<u64>> {
        let mut ids = Vec::new();
        let mut scan_all = false;
        for &q in queues {
            let pid = q.owner();
            let Ok(qo) = self.queue(pid, q) else {
                scan_all = true;
                continue;
            };
            let (logs, seen) = (qo.logs.clone(), qo.signal_log_seen);
            let Some(logs) = logs else {
                scan_all = true;
                continue;
            };
            self.ddi.flush_fence_logs(q);
            let log = &logs[abi::fence_log::FenceLogType::Signal as usize];
            match abi::fence_log::read_since(log, seen) {
                Ok(r) => {
                    if let Ok(qo) = self.queue(pid, q) {
                        qo.signal_log_seen = r.total;
                    }
                    let named: Vec<u64> = r.entries.iter().map(|e| e.fence_handle).filter(|&h| h != 0).collect();
                    if r.lost > 0 {
                        self.trace.push(now, Event::FenceLogOverrun { queue: q, lost: r.lost });
                        scan_all = true;
                    }
                    // The interrupt named this queue because one of its signals passed a
                    // MonitoredValue. If no new entry did, the log does not explain it (a
                    // signal the client did not log): scan.
                    if each_names_one && !r.entries.iter().any(|e| self.explains(e)) {
                        scan_all = true;
                    }
                    ids.extend(named);
                }
                Err(_) => {
                    scan_all = true;
                    // Start over from wherever the header is now.
                    let total = abi::fence_log::header_total(log).unwrap_or(seen);
                    if let Ok(qo) = self.queue(pid, q) {
                        qo.signal_log_seen = total;
                    }
                }
            }
        }
        // (A NULL-queue rescan whose logs show nothing new settles nothing: the GPU names the
        // engine only for logged signals.)
        if scan_all {
            return None;
        }
        ids.sort_unstable();
        ids.dedup();
        Some(ids)
    }

    /// Whether signal-log entry `e` accounts for an interrupt that named its queue: the value
    /// it logs is past its fence's MonitoredValue. A waiter that wants at most that value is
    /// then still unsettled, so the logged signal found it and raised an interrupt of its own
    /// (a waiter added after the signal is settled at once and never lowers MonitoredValue
    /// below a value already reached). The fence's live value would not do: another queue may
    /// have taken it past MonitoredValue, and a log naming the fence at a value nobody waits
    /// for would then hide an unlogged signal of another fence — whose waiter would sleep on.
    /// Each entry that explains an interrupt has one of its own, so an interrupt the log
    /// cannot account for always ends in a scan.
    fn explains(&self, e: &abi::fence_log::FenceLogEntry) -> bool {
        let f =
            self.instances(e.fence_handle).first().and_then(|&(pid, h)| self.processes.get(&pid)?.fences.get(h).ok());
        // Acquire: as every read of the two words (`abi::protocol`).
        f.is_some_and(|f| e.fence_value > f.monitored.get().load(Ordering::Acquire))
    }

    /// Decides a fence wait: a thread's result is kept until it ends the wait; the
    /// scheduler's is not (nobody ends it), and the scheduler is told to look again.
    fn complete_fence_wait(&mut self, w: &FenceWait, r: Result<u64, KernelError>) {
        if w.scheduler {
            self.waits.take(w.wait);
            self.kick_scheduler();
        } else {
            self.complete_wait(w.wait, r);
        }
    }

    /// Every local instance of fence `id`.
    fn instances(&self, id: u64) -> Vec<(ProcessId, NativeFenceHandle)> {
        self.fence_index.get(&id).cloned().unwrap_or_default()
    }

    /// The MonitoredValue fence `id` should have: the lowest value any process's waiter waits
    /// for, minus 1; `u64::MAX` with no waiter; 0 for a legacy monitored fence. Shared fences
    /// have one MonitoredValue, so every instance's waiters count.
    fn monitored_for(&self, id: u64) -> u64 {
        let mut m = u64::MAX;
        for (pid, h) in self.instances(id) {
            let Some(f) = self.processes.get(&pid).and_then(|p| p.fences.get(h).ok()) else { continue };
            if f.kind == NativeFenceType::LegacyMonitored || f.cross.is_some() {
                return 0;
            }
            m = m.min(f.waiters.iter().map(|(v, _)| v.saturating_sub(1)).min().unwrap_or(u64::MAX));
        }
        m
    }

    /// Stores fence `id`'s MonitoredValue (a raise needs no resample).
    fn program_monitored(&mut self, id: u64) {
        if self.instances(id).is_empty() {
            return;
        }
        let m = self.monitored_for(id);
        self.update_monitored_values(&[(id, m)]);
    }

    /// What the fallback scan settles: every fence with a waiter here, and every
    /// cross-adapter fence (its waiters may be on another adapter).
    fn fences_with_waiters(&self) -> Vec<(ProcessId, NativeFenceHandle)> {
        self.processes
            .iter()
            .flat_map(|(&pid, p)| {
                p.fences.iter().filter(|(_, f)| !f.waiters.is_empty() || f.cross.is_some()).map(move |(h, _)| (pid, h))
            })
            .collect()
    }
}

/// Whether a wait is satisfied: for `Any`, the index of a reached fence; for `All`, 0.
fn evaluate(p: &super::Process, conds: &[(NativeFenceHandle, u64)], mode: WaitMode) -> Option<u64> {
    let reached = |&(h, v): &(NativeFenceHandle, u64)| p.fences.get(h).is_ok_and(|f| f.current() >= v);
    match mode {
        WaitMode::Any => conds.iter().position(reached).map(|i| i as u64),
        WaitMode::All => conds.iter().all(reached).then_some(0),
    }
}
