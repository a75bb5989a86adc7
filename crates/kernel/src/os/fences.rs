//! Native fences in the OS (spec 002), owned by [`Fences`]: objects and storage, CPU signals,
//! device errors and cross-adapter fences here; CPU waits, the MonitoredValue protocol and the
//! interrupt service for `NativeFenceSignaled` in [`super::fence_waits`].
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
//! [`super::Os::query_native_fence`] reads both values for tests and tools (spec 002's 41/42 example
//! is watched through it); it is the only way user mode sees MonitoredValue, and it changes
//! nothing.
//!
//! Cross-adapter fences ([`crate::cross`]) have their own system-memory page, shared with
//! every adapter that opens them, and a MonitoredValue pinned at 0. Whenever this adapter sees
//! one signalled — its interrupt, a CPU signal, a device error — the fence goes to the outbox,
//! which leaves the OS as [`super::Output::Propagate`] for its driver to hand to the cross-adapter
//! layer. A signal
//! another adapter propagates arrives through [`super::Os::notify_current_value`]. On an adapter
//! without native fences, fences are monitored fences (`LegacyMonitored`): creating another
//! type is refused, and a cross-adapter fence opens as one.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use abi::Time;
use abi::port::{Invalid, KernelError, NativeFenceCaps, NativeFenceDesc, NativeFenceInfo, NativeFenceType};
use abi::{DeviceHandle, HwQueueHandle, NativeFenceHandle, ProcessId};
use shm::{Prot, Shm, Word};

use super::process::{FenceObj, FencePage, FenceWait, SystemMapping};
use super::shared::{Output, Shared, invalid};
use crate::ddi::{GpuMapping, Kmd};
use crate::pool::{Lease, Pool};
use crate::trace::{Ddi, Event};

/// Bytes between two fences' CurrentValues in a shared page (one cache line each).
pub const FENCE_STRIDE: u64 = 64;

/// Bytes of each fence log while the OS traces ([`super::Os::set_fence_log_tracing`]): four
/// times the spec's 4 KiB, 340 entries instead of 84.
pub const TRACED_FENCE_LOG_BYTES: u64 = 4 * abi::fence_log::FENCE_LOG_BYTES;

/// The GPU system (paging) process: the address space the OS creates for the CMP when the KMD
/// reports `MapToGpuSystemProcess` (client processes are numbered from 1).
pub const SYSTEM_PROCESS: ProcessId = ProcessId(0);

/// The native fences' state: ids, the index of every fence's instances, the KMD's caps, and
/// the GPU system process's address space.
pub(super) struct Fences {
    /// The next global fence id.
    pub(super) next_id: u64,
    /// Every local instance of each fence, by global id (one for a private fence; one per
    /// opening process for a shared one).
    pub(super) index: BTreeMap<u64, Vec<(ProcessId, NativeFenceHandle)>>,
    /// The adapter has native fences (otherwise only monitored fences).
    pub(super) native: bool,
    /// The machine's cross-adapter layer and this adapter's id in it, if it has several.
    pub(super) cross: Option<(Arc<crate::cross::CrossAdapter>, crate::cross::AdapterId)>,
    /// The KMD's native fence caps, checked at initialization.
    pub(super) caps: NativeFenceCaps,
    /// Fence-log tracing is on: user-mode queues' logs are larger
    /// ([`super::Os::set_fence_log_tracing`]).
    pub(super) log_tracing: bool,
    /// Bytes between packed fences (the KMD's stride).
    pub(super) stride: u64,
    /// The next free VA of the GPU system process.
    system_next_va: u64,
}

/// Where a new fence's values live ([`Fences::fence_storage_for`]).
struct FenceStorage {
    /// The CurrentValue and MonitoredValue pages.
    current: Arc<Shm>,
    monitored: Arc<Shm>,
    /// The CurrentValue's GPU VA, and its offset in its page.
    va: u64,
    coff: u64,
    /// Its slot in a packed page.
    slot: Option<Lease>,
    /// The GPU mapping of a page of its own.
    mapping: Option<GpuMapping>,
    /// Its VAs in the GPU system process, and the mappings of a page of its own there.
    system: Option<(u64, u64)>,
    own_sys: Option<SystemMapping>,
}

impl Fences {
    /// The fences of an adapter with (or without) native fences and the KMD's `caps`.
    pub(super) fn new(native: bool, caps: NativeFenceCaps) -> Fences {
        Fences {
            next_id: 1,
            index: BTreeMap::new(),
            native,
            cross: None,
            caps,
            log_tracing: false,
            stride: if caps.supported { caps.current_value_stride } else { FENCE_STRIDE },
            system_next_va: 1 << 32,
        }
    }

    /// Bytes of the fence logs the OS gives a user-mode queue: the spec's 4 KiB
    /// ([`abi::fence_log::FENCE_LOG_BYTES`]), or [`TRACED_FENCE_LOG_BYTES`] while it traces.
    pub(super) fn log_bytes(&self) -> u64 {
        if self.log_tracing { TRACED_FENCE_LOG_BYTES } else { abi::fence_log::FENCE_LOG_BYTES }
    }

    /// A range of the GPU system process's address space (a guard page after it).
    fn take_system_va(&mut self, bytes: u64) -> u64 {
        let va = self.system_next_va;
        self.system_next_va += bytes + 4096;
        va
    }

    /// `D3DKMTCreateNativeFence`: storage (a packed slot, or a page of its own for a
    /// shareable or cross-adapter fence), then `DxgkDdiCreateNativeFence`.
    pub(super) fn create_native_fence(
        &mut self,
        cx: &mut Shared,
        pid: ProcessId,
        device: DeviceHandle,
        desc: &NativeFenceDesc,
    ) -> Result<NativeFenceInfo, KernelError> {
        cx.proc(pid)?.devices.get(device)?;
        if !self.native && desc.kind != NativeFenceType::LegacyMonitored {
            return Err(invalid("kind", format!("{:?}", desc.kind), Invalid::NoNativeFences));
        }
        if desc.cross_adapter {
            // Spec 002: "A cross-adapter fence must be created with type DEFAULT" (a monitored
            // fence where there are no native fences).
            let allowed = if self.native { NativeFenceType::Default } else { NativeFenceType::LegacyMonitored };
            if desc.kind != allowed {
                return Err(invalid("kind", format!("{:?}", desc.kind), Invalid::CrossAdapterKind { allowed }));
            }
            if self.cross.is_none() {
                return Err(invalid("cross_adapter", true, Invalid::SingleAdapter));
            }
        }
        let FenceStorage { current, monitored, va, coff, slot, mapping, system, own_sys } =
            self.fence_storage_for(cx, pid, desc)?;
        // A legacy monitored fence and a cross-adapter fence always interrupt.
        let always = desc.kind == NativeFenceType::LegacyMonitored || desc.cross_adapter;
        let (value, monitored) = (Word::new(&current, coff)?, Word::new(&monitored, coff)?);
        value.get().store(desc.initial, Ordering::Release);
        monitored.get().store(if always { 0 } else { u64::MAX }, Ordering::Release);
        let id = self.next_id;
        self.next_id += 1;
        // A shared fence: DxgkDdiCreateNativeFence (global), then DxgkDdiOpenNativeFence for
        // the creating process's local handle (spec 002 "Global and local handles").
        // On failure its slot lease (or its own page's mapping) drops, and returns. With
        // MapToGpuSystemProcess the system-process VAs go with it.
        match system {
            Some(sys) => {
                cx.ddi.create_native_fence_in_system_process(id, (current.clone(), coff), monitored.clone(), sys)?
            }
            None => cx.ddi.create_native_fence(id, (current.clone(), coff), monitored.clone())?,
        }
        let cross = match (&self.cross, desc.cross_adapter) {
            (Some((x, me)), true) => Some(x.create(*me, id, current.clone(), coff)),
            _ => None,
        };
        let storage_domains = self.fence_storage(cx, desc.kind, desc.cross_adapter);
        let handle = cx.proc(pid)?.fences.insert(FenceObj {
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
            opened: false,
            cross,
            waiters: Vec::new(),
            _mapping: mapping,
            system,
            _system_mapping: own_sys,
            engine_only: false,
            storage_domains,
        });
        if desc.shareable
            && let Err(e) = cx.ddi.open_native_fence(id, handle)
        {
            // Not half-made: the fence goes again.
            let _ = cx.proc(pid)?.fences.remove(handle);
            cx.ddi.destroy_native_fence(id);
            return Err(e.into());
        }
        self.index.insert(id, vec![(pid, handle)]);
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

    /// A new fence's storage: a page of its own for a shareable or cross-adapter fence, else a
    /// slot in one of the process's packed pages of its kind (a new page when all are full).
    fn fence_storage_for(
        &mut self,
        cx: &mut Shared,
        pid: ProcessId,
        desc: &NativeFenceDesc,
    ) -> Result<FenceStorage, KernelError> {
        Ok(if desc.shareable || desc.cross_adapter {
            let name = if desc.cross_adapter { "fence-cross-adapter" } else { "fence-shared" };
            let (c, m) = (Shm::new(name, 4096)?, Shm::new("fence-monitored", 4096)?);
            let va = cx.proc(pid)?.take_va(4096);
            let mapping = cx.ddi.map_gpu(pid, va, 4096, c.clone(), true)?;
            let sys = self.map_into_system_process(cx, &c, &m)?;
            let system = sys.as_ref().map(|s| (s.current_va, s.monitored_va));
            FenceStorage {
                current: c,
                monitored: m,
                va,
                coff: 0,
                slot: None,
                mapping: Some(mapping),
                system,
                own_sys: sys,
            }
        } else {
            let p = cx.proc(pid)?;
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
                    let mapping = cx.ddi.map_gpu(pid, va, 4096, c.clone(), true)?;
                    let sys = self.map_into_system_process(cx, &c, &m)?;
                    let per_page = (4096 / self.stride) as u32;
                    let p = cx.proc(pid)?;
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
            let stride = self.stride;
            let pg = &cx.proc(pid)?.fence_pages[i];
            let off = lease.index() as u64 * stride;
            let system = pg.sys.as_ref().map(|s| (s.current_va + off, s.monitored_va + off));
            FenceStorage {
                current: pg.current.clone(),
                monitored: pg.monitored.clone(),
                va: pg.va + off,
                coff: off,
                slot: Some(lease),
                mapping: None,
                system,
                own_sys: None,
            }
        })
    }

    /// Opens a cross-adapter fence another adapter created: its CurrentValue page mapped into
    /// this process's GPU address space, a MonitoredValue of this adapter's own pinned at 0,
    /// the KMD told (`DxgkDdiCreateNativeFence`). Without native fences here, it is a
    /// monitored fence (spec 002: "opened as a regular MonitoredFence on GPU2").
    pub(super) fn open_cross_adapter_fence(
        &mut self,
        cx: &mut Shared,
        pid: ProcessId,
        device: DeviceHandle,
        handle: u64,
        now: Time,
    ) -> Result<NativeFenceInfo, KernelError> {
        cx.proc(pid)?.devices.get(device)?;
        let Some((x, me)) = self.cross.clone() else {
            return Err(invalid("handle", handle, Invalid::SingleAdapter));
        };
        let (current, coff) = x.storage(handle)?;
        // This adapter has it already (created here, or opened before): one more local
        // instance of the same fence object, as for a shared fence — the KMD knows it once.
        let existing = self.index.values().find_map(|v| {
            let &(p, h) = v.first()?;
            let f = cx.processes.get(&p)?.fences.get(h).ok()?;
            (f.cross == Some(handle)).then_some((p, h))
        });
        if let Some(instance) = existing {
            return self.open_instance(cx, pid, device, instance, now);
        }
        let va = cx.proc(pid)?.take_va(4096);
        let mapping = cx.ddi.map_gpu(pid, va, 4096, current.clone(), true)?;
        let kind = if self.native { NativeFenceType::Default } else { NativeFenceType::LegacyMonitored };
        let monitored = Word::new(&cx.proc(pid)?.memory.private.alloc(4096)?, coff)?;
        monitored.get().store(0, Ordering::Release);
        let id = self.next_id;
        self.next_id += 1;
        cx.ddi.create_native_fence(id, (current.clone(), coff), monitored.clone())?;
        let storage_domains = self.fence_storage(cx, kind, true);
        let h = cx.proc(pid)?.fences.insert(FenceObj {
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
            opened: true,
            cross: Some(handle),
            waiters: Vec::new(),
            _mapping: Some(mapping),
            system: None,
            _system_mapping: None,
            engine_only: false,
            storage_domains,
        });
        self.index.insert(id, vec![(pid, h)]);
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
    pub(super) fn notify_current_value(&mut self, cx: &mut Shared, id: u64, now: Time) {
        let instances = self.instances(id);
        let Some(&(_, first)) = instances.first() else { return };
        cx.trace.push(now, Event::CrossAdapterNotified { fence: first });
        if self.native {
            cx.trace.push(now, Event::Ddi(Ddi::UpdateCurrentValueNotificationOnly(first)));
            cx.ddi.notify_current_values();
        }
        for (pid, h) in instances {
            self.settle_fence(cx, pid, h, now);
        }
    }

    /// This adapter saw fence `id` signalled: if it is a cross-adapter fence, queue it for
    /// propagation to the other adapters (after the OS lock is released).
    pub(super) fn note_signaled(&mut self, cx: &mut Shared, id: u64, now: Time) {
        let Some(&(pid, h)) = self.instances(id).first() else { return };
        let Some(x) = cx.processes.get(&pid).and_then(|p| p.fences.get(h).ok()).and_then(|f| f.cross) else {
            return;
        };
        if !cx.outputs.contains(&Output::Propagate(x)) {
            cx.trace.push(now, Event::CrossAdapterSignal { fence: h });
            cx.outputs.push_back(Output::Propagate(x));
        }
    }

    /// Opens a shared fence in another process: the same storage, mapped at a VA of this
    /// process, under a local handle of its own (`DxgkDdiOpenNativeFence`).
    pub(super) fn open_native_fence(
        &mut self,
        cx: &mut Shared,
        pid: ProcessId,
        device: DeviceHandle,
        global: u64,
        now: Time,
    ) -> Result<NativeFenceInfo, KernelError> {
        cx.proc(pid)?.devices.get(device)?;
        let &(opid, oh) = self
            .index
            .get(&global)
            .and_then(|v| v.first())
            .ok_or_else(|| invalid("global", global, Invalid::NoSuchFence))?;
        let o = cx.proc(opid)?.fences.get(oh)?;
        if !o.shared {
            return Err(invalid("global", global, Invalid::NotShareable));
        }
        self.open_instance(cx, pid, device, (opid, oh), now)
    }

    /// Another local instance, in process `pid`, of the fence that instance `(opid, oh)`
    /// belongs to: the same storage mapped at a VA of its own, under a local handle of its own
    /// (`DxgkDdiOpenNativeFence`). A cross-adapter fence stays one: every instance propagates.
    pub(super) fn open_instance(
        &mut self,
        cx: &mut Shared,
        pid: ProcessId,
        device: DeviceHandle,
        (opid, oh): (ProcessId, NativeFenceHandle),
        _now: Time,
    ) -> Result<NativeFenceInfo, KernelError> {
        let o = cx.proc(opid)?.fences.get(oh)?;
        let (id, kind, current, coff, value, monitored, cross, storage_domains) =
            (o.id, o.kind, o.storage.clone(), o.coff, o.value.clone(), o.monitored.clone(), o.cross, o.storage_domains);
        let va = cx.proc(pid)?.take_va(4096);
        let mapping = cx.ddi.map_gpu(pid, va, 4096, current.clone(), true)?;
        let handle = cx.proc(pid)?.fences.insert(FenceObj {
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
            opened: true,
            cross,
            waiters: Vec::new(),
            _mapping: Some(mapping),
            system: None,
            _system_mapping: None,
            engine_only: false,
            storage_domains,
        });
        if let Err(e) = cx.ddi.open_native_fence(id, handle) {
            let _ = cx.proc(pid)?.fences.remove(handle);
            return Err(e.into());
        }
        self.index.entry(id).or_default().push((pid, handle));
        let cpu = match kind {
            NativeFenceType::IntraGpu => None,
            _ => Some(current.map_range(0, 4096, Prot::ReadOnly)?),
        };
        Ok(NativeFenceInfo { handle, va: va + coff, cpu, offset: coff, global: Some(id), kind, cross_adapter: cross })
    }

    /// Closes a process's local handle; the global fence goes with its last one.
    pub(super) fn destroy_native_fence(
        &mut self,
        cx: &mut Shared,
        pid: ProcessId,
        h: NativeFenceHandle,
    ) -> Result<(), KernelError> {
        let f = cx.proc(pid)?.fences.remove(h)?;
        // Close this process's local handle; destroy the global fence with its last one.
        let left = match self.index.get_mut(&f.id) {
            Some(v) => {
                v.retain(|&(p, x)| (p, x) != (pid, h));
                v.len()
            }
            None => 0,
        };
        if f.shared {
            cx.ddi.close_native_fence(h);
        }
        if left == 0 {
            cx.ddi.destroy_native_fence(f.id);
            self.index.remove(&f.id);
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
            self.complete_fence_wait(cx, w, Err(lost.clone()));
            self.forget_wait(cx, pid, w);
        }
        // Its slot goes back to its page (or its own page is unmapped) as `f` drops.
        let id = f.id;
        drop(f);
        // The closed instance's waiters are gone: the shared MonitoredValue may rise.
        if left > 0 {
            self.program_monitored(cx, id);
        }
        Ok(())
    }

    /// Signals a native fence from the CPU (`DxgkDdiUpdateCurrentValuesFromCpu`).
    pub(super) fn signal_native_fence(
        &mut self,
        cx: &mut Shared,
        pid: ProcessId,
        h: NativeFenceHandle,
        value: u64,
        now: Time,
    ) -> Result<(), KernelError> {
        if value == abi::port::FENCE_ALWAYS_SIGNALED {
            return Err(invalid("value", value, Invalid::Reserved));
        }
        let f = cx.proc(pid)?.fences.get(h)?;
        if f.engine_only {
            return Err(invalid("fence", h, Invalid::Unsupported("CPU signals of a queue's progress fence")));
        }
        let cur = f.current();
        if value < cur {
            return Err(KernelError::NotIncreasing { field: "value", value, last: cur });
        }
        let (word, id) = (f.value.clone(), f.id);
        if self.native {
            // `DxgkDdiUpdateCurrentValuesFromCpu`: the KMD stores it and the firmware's
            // parked waiters re-check.
            cx.trace.push(now, Event::Ddi(Ddi::UpdateCurrentValueFromCpu(h, value)));
            cx.ddi.update_current_value(id, value)?;
        } else {
            // Without native fences the scheduler writes the monitored fence itself; its GPU
            // waits are its own (kernel-mode queues only). Release: what the CPU did before
            // is visible to whoever acquires the value.
            word.get().store(value, Ordering::Release);
        }
        // Every process that has the fence open sees the signal; so does every adapter.
        for (p, x) in self.instances(id) {
            self.settle_fence(cx, p, x, now);
        }
        self.note_signaled(cx, id, now);
        Ok(())
    }

    /// With `MapToGpuSystemProcess`, maps a fence page's CurrentValue and MonitoredValue into
    /// the GPU system process (spec 002 "GPU VA mappings in paging process address space for
    /// CMP use"); `None` without the cap.
    pub(super) fn map_into_system_process(
        &mut self,
        cx: &mut Shared,
        current: &Arc<Shm>,
        monitored: &Arc<Shm>,
    ) -> Result<Option<SystemMapping>, KernelError> {
        if !self.caps.map_to_gpu_system_process {
            return Ok(None);
        }
        let (cva, mva) = (self.take_system_va(4096), self.take_system_va(4096));
        let c = cx.ddi.map_gpu(SYSTEM_PROCESS, cva, 4096, current.clone(), true)?;
        // The CMP reads MonitoredValue; only the KMD writes it.
        let m = cx.ddi.map_gpu(SYSTEM_PROCESS, mva, 4096, monitored.clone(), false)?;
        Ok(Some(SystemMapping { current_va: cva, monitored_va: mva, _mappings: [c, m] }))
    }

    /// Where fence `kind`'s values live: the KMD's segments (spec 002 "DDI to support
    /// placement of native fence values in local memory"), except that a cross-adapter
    /// fence's CurrentValue is always in system memory (spec 002: "Current value for cross
    /// adapter fences is always in system memory").
    pub(super) fn fence_storage(
        &self,
        cx: &Shared,
        kind: NativeFenceType,
        cross_adapter: bool,
    ) -> (abi::port::MemoryDomain, abi::port::MemoryDomain) {
        let (current, monitored) = cx.ddi.native_fence_storage(kind);
        (if cross_adapter { abi::port::MemoryDomain::System } else { current }, monitored)
    }

    /// A device in error: its blocked CPU waiters end with `DeviceLost`, and every fence it
    /// created becomes AlwaysSignaled (CurrentValue = `u64::MAX`, so GPU waits pass); one it
    /// opened from another device keeps its creator's value.
    pub(super) fn mark_device_error(
        &mut self,
        cx: &mut Shared,
        pid: ProcessId,
        device: DeviceHandle,
        now: Time,
    ) -> Result<(), KernelError> {
        cx.proc(pid)?.devices.get_mut(device)?.error = true;
        cx.trace.push(now, Event::DeviceError { device });
        let lost = KernelError::DeviceLost { device };
        let p = cx.proc(pid)?;
        // Every CPU wait on the device's fences ends with DeviceLost, first: a wait the
        // AlwaysSignaled value below satisfied would otherwise report its value reached.
        let waits: Vec<Arc<FenceWait>> = p
            .fences
            .iter()
            .filter(|(_, f)| f.device == device)
            .flat_map(|(_, f)| f.waiters.iter().map(|(_, w)| w.clone()))
            .collect();
        for w in &waits {
            self.complete_fence_wait(cx, w, Err(lost.clone()));
            self.forget_wait(cx, pid, w);
        }
        // AlwaysSignaled goes only into the fences the device itself signals: a queue's
        // progress fence is the engine's to write, and a fence the device opened is its
        // creator's, whose queues still signal it and whose waiters still wait on it (a
        // consumer that dies must not complete its producer's fence, nor see it fall back).
        let p = cx.proc(pid)?;
        let mine: Vec<NativeFenceHandle> = p
            .fences
            .iter()
            .filter(|(_, f)| f.device == device && !f.engine_only && !f.opened)
            .map(|(h, _)| h)
            .collect();
        for &h in &mine {
            let id = cx.proc(pid)?.fences.get(h)?.id;
            cx.trace.push(now, Event::Ddi(Ddi::UpdateCurrentValueFromCpu(h, abi::port::FENCE_ALWAYS_SIGNALED)));
            cx.ddi.update_current_value(id, abi::port::FENCE_ALWAYS_SIGNALED)?;
            // The other adapters' waiters see the shared value pass too.
            self.note_signaled(cx, id, now);
        }
        Ok(())
    }

    /// The queue's progress fence as a native fence (spec 002 "Indicating a native progress
    /// fence for hardware queues"): the kernel page's completed value, registered with the KMD
    /// (`DxgkDdiCreateNativeFence`) so the engine's `PROGRESS_FENCE` signals it with the native
    /// protocol. Opening it again answers the same fence.
    pub(super) fn open_progress_fence(
        &mut self,
        cx: &mut Shared,
        pid: ProcessId,
        q: HwQueueHandle,
    ) -> Result<NativeFenceInfo, KernelError> {
        if !self.native {
            return Err(invalid("queue", q, Invalid::NoNativeFences));
        }
        let p = cx.proc(pid)?;
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
                let id = self.next_id;
                self.next_id += 1;
                cx.ddi.create_native_fence(id, (storage.clone(), coff), monitored.clone())?;
                let value = Word::new(&storage, coff)?;
                let p = cx.proc(pid)?;
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
                    opened: false,
                    cross: None,
                    waiters: Vec::new(),
                    _mapping: None,
                    system: None,
                    _system_mapping: None,
                    engine_only: true,
                    storage_domains: (abi::port::MemoryDomain::System, abi::port::MemoryDomain::System),
                });
                p.queues.get_mut(q)?.progress_fence = Some(h);
                self.index.insert(id, vec![(pid, h)]);
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

    /// Every local instance of fence `id`.
    pub(super) fn instances(&self, id: u64) -> Vec<(ProcessId, NativeFenceHandle)> {
        self.index.get(&id).cloned().unwrap_or_default()
    }
}
