//! Hardware queues: validation, creation, destruction and status.
//!
//! Spec 000 "HwQueue creation" (`D3DKMTCreateHwQueue`, then `DxgkDdiCreateHwQueue`) and
//! spec 001's USERQ CREATE, FREE and QUERY_STATUS. Everything a queue descriptor names is
//! validated before the device hears of it: the ring's size and placement, rptr in
//! client-writable memory (or a queue could aim the engine's rptr writes at a protected
//! word), wptr and the last-queued value readable, the doorbell index inside the engine's
//! range and unused. A kernel-mode queue gets a kernel-owned ring, mapped GPU read-only and
//! never CPU-mapped for the client, and a kernel doorbell.
//!
//! Invariants: a queue is in the table exactly when the device has it; every resource a
//! failed creation took (mappings, the kernel doorbell, the table entry, the device's queue)
//! is returned before the error reaches the caller — the mappings and leases by drop, the
//! rest by [`Os::destroy_hw_queue`]. A queue pins every allocation it runs from until it is
//! destroyed. A queue's state has one owner, its `QueueLife` (live, or hung with its fault
//! record), changed only by `Shared::set_state`; the status query reads it, and asks the device
//! only where a live queue runs.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use abi::doorbell::DOORBELLS_PER_PAGE;
use abi::port::{HwQueueDesc, HwQueueInfo, Invalid, KernelError, LostReason, QueueStatus, SubmissionMode};
use abi::queue::{Access, FaultKind, QueueDescriptor};
use abi::ring::{self, RPTR_OFFSET, RingControlView, WPTR_OFFSET};
use abi::{ContextHandle, DoorbellStatus, HwQueueHandle, Priority, ProcessId, QueueState, Time};
use shm::{Prot, Shm};

use abi::fence_log::FenceLogType;

use super::super::Os;
use super::super::km::KERNEL_RING_BYTES;
use super::super::process::{KernelRing, Pin, Process, QueueLife, QueueMode, QueueObj};
use super::super::shared::invalid;
use crate::ddi::{Kmd, QueueCreate};
use crate::trace::Event;

impl Os {
    fn validate_descriptor(
        &self,
        pid: ProcessId,
        d: &QueueDescriptor,
        engine: &abi::port::EngineInfo,
    ) -> Result<Priority, KernelError> {
        ring::check_ring_size(d.ring_bytes).map_err(|r| invalid("ring_bytes", d.ring_bytes, Invalid::RingSize(r)))?;
        self.cx.check_access(pid, "ring_va", d.ring_va, d.ring_bytes, Access::Read, 4)?;
        // The engine writes rptr: it must be client-writable memory, or a queue could aim it
        // at a protected word (another queue's progress fence) and forge it.
        self.cx.check_access(pid, "rptr_va", d.rptr_va, 8, Access::Write, 8)?;
        self.cx.check_access(pid, "wptr_va", d.wptr_va, 8, Access::Read, 8)?;
        self.cx.check_access(pid, "last_queued_va", d.last_queued_va, 8, Access::Read, 8)?;
        let range = engine.doorbell_first..engine.doorbell_first + engine.doorbell_count;
        if d.doorbell_index != abi::queue::DOORBELL_INDEX_ANY
            && d.doorbell_index < DOORBELLS_PER_PAGE
            && !range.contains(&d.doorbell_index)
        {
            return Err(invalid(
                "doorbell_index",
                d.doorbell_index,
                Invalid::OutsideEngineDoorbells { engine: engine.kind, first: range.start, end: range.end },
            ));
        }
        if d.doorbell_index >= DOORBELLS_PER_PAGE && d.doorbell_index != abi::queue::DOORBELL_INDEX_ANY {
            return Err(invalid(
                "doorbell_index",
                d.doorbell_index,
                Invalid::OutsideDoorbellPage { doorbells: DOORBELLS_PER_PAGE },
            ));
        }
        // Attributes (spec 001): unknown bits and the reserved word must be 0; a secure queue
        // only where the device runs protected content.
        if d.flags & !abi::queue::QUEUE_FLAGS_KNOWN != 0 {
            return Err(invalid("flags", format!("{:#x}", d.flags), Invalid::MustBeZero));
        }
        if d.reserved != 0 {
            return Err(invalid("reserved", d.reserved, Invalid::MustBeZero));
        }
        if d.flags & abi::queue::QUEUE_FLAG_SECURE != 0 && !self.cx.ddi.adapter_info().secure_queues {
            return Err(invalid(
                "flags",
                format!("{:#x}", d.flags),
                Invalid::Unsupported("secure (protected-content) queues"),
            ));
        }
        Priority::from_u32(d.priority).ok_or_else(|| invalid("priority", d.priority, Invalid::PriorityRange))
    }

    /// The context save area the application allocated for a queue (spec 001), validated: the
    /// start of one of the process's allocations (the engine saves from offset 0), at least
    /// INFO's `context_save_bytes`, writable by the GPU. `None` when the descriptor leaves it
    /// to the kernel (0).
    fn app_context_save(
        &mut self,
        pid: ProcessId,
        d: &QueueDescriptor,
        _engine: abi::EngineId,
    ) -> Result<Option<Arc<Shm>>, KernelError> {
        if d.context_save_va == 0 {
            return Ok(None);
        }
        let need = self.cx.ddi.adapter_info().queue_metadata.context_save_bytes;
        let va = d.context_save_va;
        self.cx.check_access(pid, "context_save_va", va, need, Access::Write, 4096)?;
        let p = self.proc(pid)?;
        let a = p.allocations.iter().find(|(_, a)| a.va == va).map(|(_, a)| (a.shm.clone(), a.bytes));
        match a {
            Some((shm, bytes)) if bytes >= need => Ok(Some(shm)),
            _ => Err(invalid(
                "context_save_va",
                format!("{va:#x}"),
                Invalid::DoesNotHold { what: "context save area (an allocation's start)", va },
            )),
        }
    }

    /// Spec 001 "Interaction with Kernel Queues": "you are limited by the HQD slots. Kernel
    /// queues are always mapped [...] This limits the available HQD slots for user queues." So
    /// a user-mode queue needs a slot left for user queues (`EngineInfo::user_slots`), and a
    /// kernel-mode queue may not take the last such slot from the engine's user-mode queues:
    /// either way the user-mode queues could never run (found by `doorbell sim swarm`: a
    /// kernel-mode queue on a one-slot engine starved a user-mode one forever).
    fn check_slots_left(&self, einfo: &abi::port::EngineInfo, mode: SubmissionMode) -> Result<(), KernelError> {
        let kernel_held = einfo.hw_slots - einfo.user_slots;
        let refuse = |detail: String| Err(KernelError::Exhausted { what: "hardware slots", detail });
        match mode {
            SubmissionMode::UserMode(_) if einfo.user_slots == 0 => refuse(format!(
                "engine {} ({}): kernel-mode queues, which are always mapped, hold all {} of its hardware slots; none is left for a user-mode queue",
                einfo.id.0, einfo.kind, einfo.hw_slots
            )),
            SubmissionMode::KernelMode if kernel_held + 1 >= einfo.hw_slots => {
                let users = self
                    .cx
                    .processes
                    .values()
                    .flat_map(|p| p.queues.iter())
                    .filter(|(_, q)| q.engine == einfo.id && q.user_desc().is_some())
                    .count();
                if users == 0 {
                    return Ok(());
                }
                refuse(format!(
                    "engine {} ({}): a kernel-mode queue, which is always mapped, would hold the last of its {} hardware slots, and its {users} user-mode queues could never run",
                    einfo.id.0, einfo.kind, einfo.hw_slots
                ))
            }
            _ => Ok(()),
        }
    }

    /// `D3DKMTCreateHwQueue` / USERQ CREATE.
    pub fn create_hw_queue(
        &mut self,
        pid: ProcessId,
        ctx: ContextHandle,
        desc: &HwQueueDesc,
        now: Time,
    ) -> Result<HwQueueInfo, KernelError> {
        self.recovery.adapter_alive()?;
        let engine = self.proc(pid)?.contexts.get(ctx)?.engine;
        let info = self.cx.ddi.adapter_info();
        let einfo = info
            .engines
            .iter()
            .find(|e| e.id == engine)
            .ok_or_else(|| invalid("engine", engine, Invalid::NoSuchEngine { engines: info.engines.len() }))?;
        self.check_slots_left(einfo, desc.mode)?;
        let memory = &self.proc(pid)?.memory;
        let kernel_page_shm = memory.readable.alloc(abi::queue::QUEUE_KERNEL_PAGE_BYTES as usize)?;
        let kernel_page = abi::queue::KernelPageView::new(&kernel_page_shm)?;
        // The UMD's read-only view, made before the device has the queue: a failure from here
        // on would have to undo it.
        let kernel_page_ro = kernel_page_shm.map_range(0, 4096, Prot::ReadOnly)?;
        kernel_page.doorbell_status().get().store(DoorbellStatus::DisconnectedRetry as u64, Ordering::SeqCst);
        // Two fence logs for a user-mode queue (spec 002): the engine writes them, the client
        // cannot see them, the kernel reads them. Kernel-mode queues log nothing.
        let logs = match desc.mode {
            SubmissionMode::UserMode(_) => Some([
                self.fences.new_fence_log(&mut self.cx, pid, FenceLogType::Wait, 0)?,
                self.fences.new_fence_log(&mut self.cx, pid, FenceLogType::Signal, 0)?,
            ]),
            SubmissionMode::KernelMode => None,
        };
        let (mode, create) = match desc.mode {
            SubmissionMode::UserMode(d) => {
                self.user_queue(pid, ctx, einfo, d, desc.priority, &kernel_page_shm, &logs)?
            }
            SubmissionMode::KernelMode => self.kernel_queue(pid, ctx, einfo, desc.priority, &kernel_page_shm)?,
        };
        let kernel_page_va = self.proc(pid)?.take_va(4096);
        let kernel_page_mapping = self.cx.ddi.map_gpu(pid, kernel_page_va, 4096, kernel_page_shm.clone(), false)?;
        let user_mode = matches!(mode, QueueMode::User { .. });
        let kernel_doorbell = match &mode {
            QueueMode::Kernel(k) => Some(k.doorbell.index()),
            QueueMode::User { .. } => None,
        };
        // The table entry first: the device knows the queue by its handle. If the device
        // refuses, the entry (and everything it holds) goes again.
        let adapter_resets = self.recovery.adapter_resets;
        let handle = self.proc(pid)?.queues.insert(QueueObj {
            context: ctx,
            engine,
            kernel_page,
            _kernel_page_mapping: kernel_page_mapping,
            mode,
            doorbell: None,
            waiters: Vec::new(),
            life: QueueLife::Live,
            logs: logs.clone(),
            signal_log_seen: 0,
            adapter_resets,
            progress_seen: None,
            held: false,
            signal_on: Vec::new(),
            progress_fence: None,
        });
        self.recovery.arm_hang_scan(now, &mut self.cx.timers);
        self.recovery.arm_engine_watch(now, &mut self.cx.timers);
        if let Err(e) = self.cx.ddi.create_hw_queue(handle, create) {
            self.proc(pid)?.queues.remove(handle)?;
            return Err(e.into());
        }
        self.cx.set_state(pid, handle, QueueLife::Live);
        self.pin_queue_memory(pid, handle)?;
        self.cx.trace.push(now, Event::QueueCreated { queue: handle, engine, user_mode });
        self.attach_queue(pid, handle, &logs, kernel_doorbell, now)?;
        // The UMD reads its status at every submission: resident now too (a hint, as above).
        let _ = kernel_page_ro.populate(0, 4096);
        Ok(HwQueueInfo { handle, engine, kernel_page: kernel_page_ro, kernel_page_va })
    }

    /// A user-mode queue's mode and creation arguments: its descriptor validated, its doorbell
    /// page and memory the queue's device's, its doorbell index resolved and unused.
    #[allow(clippy::too_many_arguments)]
    fn user_queue(
        &mut self,
        pid: ProcessId,
        ctx: ContextHandle,
        einfo: &abi::port::EngineInfo,
        d: QueueDescriptor,
        priority: Priority,
        kernel_page: &Arc<Shm>,
        logs: &Option<[Arc<Shm>; 2]>,
    ) -> Result<(QueueMode, QueueCreate), KernelError> {
        let engine = einfo.id;
        if !einfo.user_queues {
            return Err(invalid("engine", engine, Invalid::Unsupported("user-mode queues")));
        }
        self.validate_descriptor(pid, &d, einfo)?;
        let mut d = d;
        let p = self.proc(pid)?;
        // The doorbell page: the process's own (0), or one it allocated on this
        // queue's device. Not another device's: that device's destruction frees its
        // pages, and a queue of this one must not pin one of them.
        let device = p.contexts.get(ctx)?.device;
        let page = d.doorbell_page_va;
        if page != 0 && !p.doorbell_pages.iter().any(|(_, pg)| pg.va == page && pg.device == device) {
            return Err(invalid("doorbell_page_va", format!("{page:#x}"), Invalid::NoDoorbellPage));
        }
        // Its memory, likewise: the device's own allocations, which outlive its queues
        // (another device's destruction would free them under the queue, and fail on
        // the queue's pin after it had destroyed that device's contexts).
        for (field, va, bytes) in queue_memory(&d) {
            if p.allocations.iter().any(|(_, a)| a.device != device && a.holds(va, bytes)) {
                return Err(invalid(field, format!("{va:#x}"), Invalid::OtherDevice));
            }
        }
        // The doorbells in that page of the queues that exist (a hung one keeps its own).
        let in_page = |p: &Process| {
            p.queues
                .iter()
                .filter_map(move |(h, q)| {
                    q.user_desc().filter(|o| o.doorbell_page_va == page).map(|o| (h, o.doorbell_index))
                })
                .collect::<Vec<_>>()
        };
        if d.doorbell_index == abi::queue::DOORBELL_INDEX_ANY {
            let range = einfo.doorbell_first..einfo.doorbell_first + einfo.doorbell_count;
            // The indices in use, gathered once (not one scan of the queues per index).
            let used: std::collections::BTreeSet<u32> = in_page(p).into_iter().map(|(_, i)| i).collect();
            d.doorbell_index = range.clone().find(|i| !used.contains(i)).ok_or_else(|| KernelError::Exhausted {
                what: "doorbells",
                detail: format!(
                    "all doorbells {}..{} of the {} engine's range are in use",
                    range.start, range.end, einfo.kind
                ),
            })?;
        } else if let Some((other, _)) = in_page(p).into_iter().find(|&(_, i)| i == d.doorbell_index) {
            return Err(invalid("doorbell_index", d.doorbell_index, Invalid::UsedBy(other)));
        }
        let create = QueueCreate {
            process: pid,
            context: ctx,
            engine,
            ring_va: d.ring_va,
            ring_bytes: d.ring_bytes,
            rptr_va: d.rptr_va,
            wptr_va: d.wptr_va,
            last_queued_va: d.last_queued_va,
            kernel_page: kernel_page.clone(),
            fence_logs: logs.clone(),
            privileged: false,
            priority,
            context_save: self.app_context_save(pid, &d, einfo.id)?,
        };
        let last_queued = self.proc(pid)?.allocations.iter().find_map(|(_, a)| {
            a.holds(d.last_queued_va, 8).then(|| shm::ReadWord::new(&a.shm, d.last_queued_va - a.va).ok()).flatten()
        });
        Ok((QueueMode::User { desc: d, last_queued }, create))
    }

    /// A kernel-mode queue's mode and creation arguments: a kernel-owned ring and control
    /// page, mapped GPU read-only and never CPU-mapped for the client, and a kernel doorbell.
    fn kernel_queue(
        &mut self,
        pid: ProcessId,
        ctx: ContextHandle,
        einfo: &abi::port::EngineInfo,
        priority: Priority,
        kernel_page: &Arc<Shm>,
    ) -> Result<(QueueMode, QueueCreate), KernelError> {
        let engine = einfo.id;
        if !einfo.kernel_queues {
            return Err(invalid("engine", engine, Invalid::Unsupported("kernel-mode queues")));
        }
        let doorbell = self.doorbells.kernel.take()?;
        let p = self.proc(pid)?;
        let ring = p.memory.private.alloc(KERNEL_RING_BYTES as usize)?;
        let control_shm = p.memory.private.alloc(4096)?;
        let ring_va = p.take_va(KERNEL_RING_BYTES);
        let control_va = p.take_va(4096);
        // Kernel-owned: mapped GPU read-only, never CPU-mapped for the client. A failed
        // mapping drops the ones before it (and the doorbell lease).
        let ring_map = self.cx.ddi.map_gpu(pid, ring_va, KERNEL_RING_BYTES, ring.clone(), false)?;
        let control_map = self.cx.ddi.map_gpu(pid, control_va, 4096, control_shm.clone(), false)?;
        let create = QueueCreate {
            process: pid,
            context: ctx,
            engine,
            ring_va,
            ring_bytes: KERNEL_RING_BYTES,
            rptr_va: control_va + RPTR_OFFSET,
            wptr_va: control_va + WPTR_OFFSET,
            last_queued_va: control_va + abi::ring::LAST_QUEUED_OFFSET,
            kernel_page: kernel_page.clone(),
            fence_logs: None,
            privileged: true,
            priority,
            context_save: None,
        };
        let kr = KernelRing {
            ring,
            control: RingControlView::new(&control_shm, 0)?,
            doorbell,
            wptr: 0,
            last_queued: 0,
            paging: false,
            inflight: Default::default(),
            _mappings: [ring_map, control_map],
        };
        Ok((QueueMode::Kernel(kr), create))
    }

    /// The kernel's reference on every allocation a new user-mode queue runs from, until it is
    /// destroyed: the engine reads and writes them. Pinned memory is resident: the pages of
    /// the ring and its pointers are populated now, so that neither the UMD's first
    /// submissions nor the engine's first fetches take page faults (the save area is left to
    /// its first preemption: most queues never write it).
    fn pin_queue_memory(&mut self, pid: ProcessId, handle: HwQueueHandle) -> Result<(), KernelError> {
        let p = self.proc(pid)?;
        if let Some(desc) = p.queues.get(handle)?.user_desc().copied() {
            let words = queue_memory(&desc);
            for h in p.allocations.handles() {
                let a = p.allocations.get_mut(h)?;
                if words.iter().any(|&(_, va, n)| a.holds(va, n)) {
                    a.pins.push(Pin::Queue(handle));
                }
                for &(_, va, n) in words.iter().filter(|w| w.0 != "context_save_va" && a.holds(w.1, w.2)) {
                    // (A hint: a page it could not populate faults in later, as it would.)
                    let _ = a.shm.populate(va - a.va, n);
                }
            }
        }
        Ok(())
    }

    /// The last steps of a queue's creation: `DxgkDdiSetNativeFenceLogBuffer` for its fence
    /// logs, or the connection of a kernel-mode queue's kernel doorbell. A device that refuses
    /// leaves no queue behind: the queue goes, with everything it took.
    fn attach_queue(
        &mut self,
        pid: ProcessId,
        handle: HwQueueHandle,
        logs: &Option<[Arc<Shm>; 2]>,
        kernel_doorbell: Option<u32>,
        now: Time,
    ) -> Result<(), KernelError> {
        if let Some([w, sg]) = logs {
            // `DxgkDdiSetNativeFenceLogBuffer`, once for waits and once for signals (spec 002
            // "Log buffer mechanism"). A device that refuses leaves no queue behind.
            for (kind, log) in [(FenceLogType::Wait, w), (FenceLogType::Signal, sg)] {
                if let Err(e) = self.cx.ddi.set_native_fence_log_buffer(handle, kind, log.clone()) {
                    self.destroy_hw_queue(pid, handle, now)?;
                    return Err(e.into());
                }
            }
        }
        if let Some(index) = kernel_doorbell
            && let Err(e) = self.cx.ddi.connect_kernel_doorbell(handle, index)
        {
            // Not an orphan: the queue goes, with everything it took.
            self.destroy_hw_queue(pid, handle, now)?;
            return Err(e.into());
        }
        Ok(())
    }

    /// Destroys a queue: doorbell disconnected and destroyed, then the device's queue, then
    /// the kernel's references; its CPU waiters end with `QueueLost`.
    pub fn destroy_hw_queue(&mut self, pid: ProcessId, q: HwQueueHandle, now: Time) -> Result<(), KernelError> {
        // Its progress fence goes with it (waiters learn the fence was destroyed).
        if let Some(f) = self.queue(pid, q)?.progress_fence.take() {
            let _ = self.destroy_native_fence(pid, f, now);
        }
        if self.queue(pid, q)?.doorbell.is_some() {
            self.doorbells.destroy_of(&mut self.cx, pid, q, now)?;
        }
        self.cx.ddi.destroy_hw_queue(q)?;
        let p = self.proc(pid)?;
        // Dropping it unmaps its kernel page (and a kernel ring) and returns its kernel
        // doorbell.
        let obj = p.queues.remove(q)?;
        for h in p.allocations.handles() {
            if let Ok(a) = p.allocations.get_mut(h) {
                a.pins.retain(|&pin| pin != Pin::Queue(q));
            }
        }
        self.km.drop_km_submissions(&mut self.cx, pid, obj.context, q);
        for &(_, w) in &obj.waiters {
            self.cx.complete_wait(w, Err(KernelError::QueueLost { queue: q, reason: LostReason::Destroyed }));
        }
        Ok(())
    }

    /// `USERQ QUERY_STATUS`: the queue's state from its one record (see `QueueLife`).
    pub fn query_queue(&mut self, pid: ProcessId, q: HwQueueHandle) -> Result<QueueStatus, KernelError> {
        let last_queued = self.cx.last_queued(pid, q);
        let p = self.cx.processes.get(&pid).ok_or(KernelError::ProcessTerminated(pid))?;
        let qo = p.queues.get(q)?;
        let ddi = &self.cx.ddi;
        let (state, fault) = qo.life.status(|| ddi.queue_state(q));
        let hung = if state == QueueState::Hung { abi::port::QUEUE_STATUS_HUNG } else { 0 };
        let vram_lost =
            if self.recovery.adapter_resets > qo.adapter_resets { abi::port::QUEUE_STATUS_VRAM_LOST } else { 0 };
        // Lost with its device or adapter is not the queue's own doing.
        let guilty = fault.as_ref().is_some_and(|f| !matches!(f.kind, FaultKind::DeviceLost | FaultKind::AdapterReset));
        Ok(QueueStatus { state, fault, completed: qo.completed(), last_queued, flags: hung | vram_lost, guilty })
    }
}

/// The memory a user-mode queue runs from, each with its descriptor field: the ring, rptr,
/// wptr, last-queued word and the context save area (the ring's place again when the kernel
/// provides the save area). The kernel pins every allocation that holds one of them.
fn queue_memory(d: &QueueDescriptor) -> [(&'static str, u64, u64); 5] {
    let csa =
        if d.context_save_va != 0 { ("context_save_va", d.context_save_va, 1) } else { ("ring_va", d.ring_va, 1) };
    [
        ("ring_va", d.ring_va, d.ring_bytes),
        ("rptr_va", d.rptr_va, 8),
        ("wptr_va", d.wptr_va, 8),
        ("last_queued_va", d.last_queued_va, 8),
        csa,
    ]
}
