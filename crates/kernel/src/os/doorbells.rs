//! Doorbells ([`Doorbells`]): objects, their CPU-VA rotation and status word, connect,
//! disconnect and victimization, and the BAR pages they live in.
//!
//! Spec 000 "Doorbells" and its sequences, in the spec's order:
//! - **Connect** (`D3DKMTConnectDoorbell`): in D3, D0 and residency first (the OS's part,
//!   [`super::Os::connect_doorbell`]); an engine in F1 goes to F0; then
//!   `DxgkDdiConnectDoorbell`; then the doorbell CPU page is rotated to the BAR; then the
//!   status word becomes `Connected` (or `ConnectedNotify`); after D3 the contexts resume.
//! - **Victimization** (spec 000 "Victimizing doorbell pseudocode in KMD"): inside
//!   `DxgkDdiConnectDoorbell`, the KMD calls `DxgkCbDisconnectDoorbell` ([`Victimizer`]),
//!   which rotates the victim's CPU page to the dummy page and publishes
//!   `DisconnectedRetry`; then the KMD disconnects the physical doorbell. Which doorbell is
//!   the victim is the KMD's choice (`virtual_kmd::VictimPolicy`: least recently rung by
//!   default); [`super::Os::query_physical_doorbell`] shows who holds which BAR doorbell.
//! - **Disconnect** (F1 entry, D3, fault, termination): the CPU page is rotated to the dummy
//!   page, the status word becomes `DisconnectedRetry` (or `DisconnectedAbort`), then
//!   `DxgkDdiDisconnectDoorbell`; the firmware re-reads the queue's wptr so no racing ring is
//!   lost.
//! - **Doorbell pages** (spec 001): besides the page the kernel gives every process, a
//!   process may allocate one of its own ([`super::Os::create_doorbell_page`]) and name it in
//!   a queue descriptor with the index it wants there; the queue pins it.
//!
//! Invariant: a doorbell's CPU page shows the BAR exactly while it is `connected`; every
//! status change goes through [`publish_status`] (SeqCst, the Dekker pairing with the
//! client's ring).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use abi::port::{
    AggregatedDoorbell, CreateDoorbell, DoorbellInfo, DoorbellPageInfo, InUseBy, InUseObject, Invalid, KernelError,
    MAX_DOORBELL_PAGES,
};
use abi::{DeviceHandle, DoorbellHandle, DoorbellPageHandle, DoorbellStatus, EngineId, HwQueueHandle, ProcessId, Time};
use shm::{RotatingPage, Shm, Word};

use super::power::wake_engine;
use super::process::{DoorbellObj, DoorbellPageObj, Pin, Process, QueueMode};
use super::shared::{Shared, invalid};
use crate::ddi::{DdiError, DisconnectCallback, Kmd};
use crate::pool::{Pool, Reset};
use crate::trace::{Callback, Ddi, Event, PageTarget, SharedTrace};

/// The doorbells' state: the BAR, the page a disconnected doorbell shows, and the pools of
/// BAR pages (for processes) and kernel doorbells (for kernel-mode queues).
pub(super) struct Doorbells {
    /// The doorbell BAR.
    pub(super) bar: Arc<Shm>,
    /// The page a disconnected doorbell's CPU VA shows.
    pub(super) dummy: Arc<Shm>,
    /// BAR pages for processes (page 0 and the KMD's reserved pages are never handed out).
    pub(super) pages: Pool,
    /// Kernel doorbells (BAR page 0) for kernel-mode queues.
    pub(super) kernel: Pool,
}

impl Doorbells {
    /// The doorbells of `bar`, less page 0 (the kernel queues' doorbells) and the pages the KMD
    /// keeps for its pool (`reserved`).
    pub(super) fn new(bar: Arc<Shm>, dummy: Arc<Shm>, reserved: std::ops::Range<u32>) -> Doorbells {
        let count = (bar.len() as u64 / abi::doorbell::DOORBELL_PAGE_BYTES) as u32;
        let free = (1..count).filter(|p| !reserved.contains(p));
        // A page goes back cleared: its next owner starts with no stale value or bit (which
        // would at worst make the firmware re-read a wptr).
        let pages = Pool::new("doorbell pages", free, Some(clear_page(bar.clone())));
        let kernel = Pool::new("kernel doorbells", 0..abi::doorbell::DOORBELLS_PER_PAGE, None);
        Doorbells { bar, dummy, pages, kernel }
    }

    /// Allocates a doorbell page for process `pid` on `device` (see
    /// [`super::Os::create_doorbell_page`]).
    pub(super) fn create_page(
        &mut self,
        cx: &mut Shared,
        pid: ProcessId,
        device: DeviceHandle,
    ) -> Result<DoorbellPageInfo, KernelError> {
        let p = cx.proc(pid)?;
        p.devices.get(device)?;
        let held = 1 + p.doorbell_pages.len() as u32;
        if held >= MAX_DOORBELL_PAGES {
            return Err(KernelError::Exhausted {
                what: "doorbell pages",
                detail: format!(
                    "the process holds {held} doorbell pages, its own included; at most {MAX_DOORBELL_PAGES} (1,024 doorbells)"
                ),
            });
        }
        let lease = match p.freed_doorbell_pages.pop() {
            Some(lease) => lease,
            None => self.pages.take()?,
        };
        let va = cx.proc(pid)?.take_va(abi::doorbell::DOORBELL_PAGE_BYTES);
        let gpu = cx.ddi.map_doorbell_page(pid, va, lease.index()).ok();
        let handle = cx.proc(pid)?.doorbell_pages.insert(DoorbellPageObj { device, va, gpu, lease });
        Ok(DoorbellPageInfo { handle, va, doorbells: abi::doorbell::DOORBELLS_PER_PAGE })
    }

    /// Frees a doorbell page (see [`super::Os::destroy_doorbell_page`]).
    pub(super) fn destroy_page(
        &mut self,
        cx: &mut Shared,
        pid: ProcessId,
        page: DoorbellPageHandle,
    ) -> Result<(), KernelError> {
        let p = cx.proc(pid)?;
        let va = p.doorbell_pages.get(page)?.va;
        let user = p.queues.iter().find(|(_, q)| q.user_desc().is_some_and(|d| d.doorbell_page_va == va));
        if let Some((q, _)) = user {
            return Err(KernelError::InUse { object: InUseObject::Handle(page.into()), by: InUseBy::Queue(q) });
        }
        let DoorbellPageObj { gpu, lease, .. } = p.doorbell_pages.remove(page)?;
        drop(gpu);
        clear_bar_page(&self.bar, lease.index());
        cx.proc(pid)?.freed_doorbell_pages.push(lease);
        Ok(())
    }

    /// `D3DKMTCreateDoorbell` (see [`super::Os::create_doorbell`]).
    pub(super) fn create(
        &mut self,
        cx: &mut Shared,
        pid: ProcessId,
        args: &CreateDoorbell,
        now: Time,
    ) -> Result<DoorbellInfo, KernelError> {
        let q = args.queue;
        let p = cx.proc(pid)?;
        let qo = p.queues.get(q)?;
        let QueueMode::User { desc, .. } = qo.mode else {
            return Err(KernelError::WrongQueueMode { queue: q, actual: "kernel-mode", expected: "user-mode" });
        };
        if qo.doorbell.is_some() {
            return Err(invalid("queue", q, Invalid::HasDoorbell));
        }
        let ring = p.allocations.get(args.ring_buffer)?;
        if !ring.holds(desc.ring_va, desc.ring_bytes) {
            return Err(invalid(
                "ring_buffer",
                args.ring_buffer,
                Invalid::DoesNotHold { what: "ring", va: desc.ring_va },
            ));
        }
        let control = p.allocations.get(args.ring_control)?;
        for (what, va) in [("rptr", desc.rptr_va), ("wptr", desc.wptr_va), ("last-queued value", desc.last_queued_va)] {
            if !control.holds(va, 8) {
                return Err(invalid("ring_control", args.ring_control, Invalid::DoesNotHold { what, va }));
            }
        }
        let engine = qo.engine;
        let (offset, ring) = cx.ddi.doorbell_ring(desc.doorbell_index);
        // The doorbell, of the size the KMD reported, lies whole in the CPU page.
        let bytes = cx.ddi.adapter_info().doorbell_bytes;
        if !offset.is_multiple_of(bytes) || offset + bytes > shm::PAGE_SIZE as u64 {
            return Err(invalid(
                "doorbell_index",
                desc.doorbell_index,
                Invalid::OutOfRange { expected: "a doorbell of the reported size inside the doorbell page" },
            ));
        }
        let aggregated = match (cx.ddi.aggregated_doorbell(engine), &cx.proc(pid)?.aggregated) {
            (Some((offset, mask)), Some(a)) => Some(AggregatedDoorbell {
                page: a.cpu.clone(),
                offset,
                mask,
                gpu_va: a.gpu.as_ref().map(|(va, _)| va + offset),
            }),
            _ => None,
        };
        let page = Arc::new(RotatingPage::new(&self.dummy, 0)?);
        let p = cx.proc(pid)?;
        let d = p.doorbells.insert(DoorbellObj {
            queue: q,
            ring_buffer: args.ring_buffer,
            ring_control: args.ring_control,
            page: page.clone(),
            connected: false,
        });
        // The kernel's reference on the ring allocations (spec 000 "Residency model").
        p.allocations.get_mut(args.ring_buffer)?.pins.push(Pin::Doorbell(d));
        p.allocations.get_mut(args.ring_control)?.pins.push(Pin::Doorbell(d));
        p.queues.get_mut(q)?.doorbell = Some(d);
        cx.trace.push(now, Event::Ddi(Ddi::CreateDoorbell(q)));
        let page_gpu = cx.proc(pid)?.doorbell_page_at(desc.doorbell_page_va).and_then(|(_, gpu)| gpu);
        let gpu_va = match (ring, page_gpu) {
            (abi::doorbell::RingMethod::WriteWptr, Some(va)) => Some(va + offset),
            _ => None,
        };
        Ok(DoorbellInfo { handle: d, cpu_page: page, offset, ring, aggregated, gpu_va })
    }

    /// Destroys queue `q`'s doorbell: disconnected (`DisconnectedAbort`), then destroyed, and
    /// the kernel's references on the ring allocations dropped.
    pub(super) fn destroy_of(
        &mut self,
        cx: &mut Shared,
        pid: ProcessId,
        q: HwQueueHandle,
        now: Time,
    ) -> Result<(), KernelError> {
        let d = cx.queue(pid, q)?.doorbell.ok_or_else(|| invalid("queue", q, Invalid::NoDoorbell))?;
        self.disconnect(cx, pid, q, DoorbellStatus::DisconnectedAbort, now)?;
        cx.trace.push(now, Event::Ddi(Ddi::DestroyDoorbell(q)));
        let p = cx.proc(pid)?;
        let obj = p.doorbells.remove(d)?;
        for a in [obj.ring_buffer, obj.ring_control] {
            if let Ok(a) = p.allocations.get_mut(a)
                && let Some(i) = a.pins.iter().position(|x| *x == Pin::Doorbell(d))
            {
                a.pins.swap_remove(i);
            }
        }
        p.queues.get_mut(q)?.doorbell = None;
        Ok(())
    }

    /// What a connect needs, checked: the queue's engine, doorbell, BAR page and index; `None`
    /// when it is connected already.
    pub(super) fn connect_target(
        &self,
        cx: &mut Shared,
        pid: ProcessId,
        q: HwQueueHandle,
    ) -> Result<Option<ConnectTarget>, KernelError> {
        let qo = cx.queue(pid, q)?;
        qo.live(q)?;
        let QueueMode::User { desc, .. } = qo.mode else {
            return Err(KernelError::WrongQueueMode { queue: q, actual: "kernel-mode", expected: "user-mode" });
        };
        let engine = qo.engine;
        let d = qo.doorbell.ok_or_else(|| invalid("queue", q, Invalid::NoDoorbell))?;
        let p = cx.proc(pid)?;
        // The page the descriptor named (validated at creation; the queue pins it).
        let (process_page, _) = p.doorbell_page_at(desc.doorbell_page_va).ok_or_else(|| {
            invalid("doorbell_page_va", format!("{:#x}", desc.doorbell_page_va), Invalid::NoDoorbellPage)
        })?;
        let dobj = p.doorbells.get(d)?;
        if dobj.connected {
            return Ok(None);
        }
        Ok(Some(ConnectTarget {
            engine,
            doorbell: d,
            page: dobj.page.clone(),
            process_page,
            index: desc.doorbell_index,
        }))
    }

    /// Steps 1 to 4 of a connect, the device awake: the engine woken, `DxgkDdiConnectDoorbell`
    /// (victimizing through `DxgkCbDisconnectDoorbell` when the pool is full), the CPU VA
    /// rotated onto the BAR, the status connected.
    pub(super) fn connect_awake(
        &mut self,
        cx: &mut Shared,
        pid: ProcessId,
        q: HwQueueHandle,
        t: ConnectTarget,
        now: Time,
    ) -> Result<(), KernelError> {
        // 1. An engine in F1 goes back to F0 first (spec 000 "Engine F-state transitions").
        wake_engine(cx, t.engine, now)?;
        // 2. DxgkDdiConnectDoorbell: the KMD binds a physical doorbell — after victimizing
        // one through DxgkCbDisconnectDoorbell when the pool is full.
        let mut victimizer = Victimizer {
            processes: &mut cx.processes,
            dummy: &self.dummy,
            trace: &cx.trace,
            victimizations: &mut cx.stats.victimizations,
            now,
        };
        let step = cx.ddi.connect_doorbell(q, t.process_page, t.index, &mut victimizer)?;
        // 3. Dxgkrnl maps the physical doorbell at the doorbell's CPU VA.
        t.page.rotate_to(&self.bar, step.page_offset)?;
        cx.trace.push(now, Event::Rotate { queue: q, to: PageTarget::Bar });
        // 4. Dxgkrnl updates the status to connected.
        let status = if step.notify { DoorbellStatus::ConnectedNotify } else { DoorbellStatus::Connected };
        write_status(cx, pid, q, status, now);
        cx.proc(pid)?.doorbells.get_mut(t.doorbell)?.connected = true;
        cx.stats.connects += 1;
        Ok(())
    }

    /// Disconnects a queue's doorbell (`DxgkCbDisconnectDoorbell` then the DDI). With
    /// `DisconnectedAbort` the status is written even if it was not connected.
    pub(super) fn disconnect(
        &self,
        cx: &mut Shared,
        pid: ProcessId,
        q: HwQueueHandle,
        status: DoorbellStatus,
        now: Time,
    ) -> Result<(), KernelError> {
        let Some(d) = cx.queue(pid, q)?.doorbell else {
            if status == DoorbellStatus::DisconnectedAbort {
                write_status(cx, pid, q, status, now);
            }
            return Ok(());
        };
        let dobj = cx.proc(pid)?.doorbells.get_mut(d)?;
        let was = std::mem::replace(&mut dobj.connected, false);
        let page = dobj.page.clone();
        if was {
            // 1. Rotate the client's doorbell CPU VA to the dummy page.
            page.rotate_to(&self.dummy, 0)?;
            cx.trace.push(now, Event::Rotate { queue: q, to: PageTarget::Dummy });
        }
        // 2. Publish the status.
        if was || status == DoorbellStatus::DisconnectedAbort {
            write_status(cx, pid, q, status, now);
        }
        if was {
            // 3. The KMD disconnects the physical doorbell; the firmware re-reads wptr.
            cx.ddi.disconnect_doorbell(q)?;
        }
        Ok(())
    }
}

/// What [`Doorbells::connect_awake`] connects.
pub(super) struct ConnectTarget {
    engine: EngineId,
    doorbell: DoorbellHandle,
    page: Arc<RotatingPage>,
    /// The BAR page the descriptor named, and the doorbell's index there.
    process_page: u32,
    index: u32,
}

/// What a returned doorbell page goes back as: cleared, so its next owner starts with no
/// stale value or bit.
fn clear_page(bar: Arc<Shm>) -> Reset {
    Box::new(move |page| clear_bar_page(&bar, page))
}

/// Zeroes BAR page `page`.
fn clear_bar_page(bar: &Shm, page: u32) {
    let base = page as u64 * abi::doorbell::DOORBELL_PAGE_BYTES;
    for w in 0..abi::doorbell::DOORBELLS_PER_PAGE as u64 {
        if let Ok(word) = bar.atomic_u64(base + w * 8) {
            // Relaxed: the page has no user left; its next user's mapping is created after.
            word.store(0, Ordering::Relaxed);
        }
    }
}

/// Publishes queue `q`'s doorbell status, if the queue is there.
fn write_status(cx: &Shared, pid: ProcessId, q: HwQueueHandle, status: DoorbellStatus, now: Time) {
    if let Some(qo) = cx.processes.get(&pid).and_then(|p| p.queues.get(q).ok()) {
        publish_status(&cx.trace, q, &qo.kernel_page, status, now);
    }
}

/// Publishes a queue's doorbell status and logs it.
fn publish_status(
    trace: &SharedTrace,
    q: HwQueueHandle,
    page: &abi::queue::KernelPageView<Word>,
    status: DoorbellStatus,
    now: Time,
) {
    // SeqCst: the Dekker pairing with the client's `store wptr; fence(SeqCst); load status`
    // (see `umd::queue`): either the client sees this status, or the firmware's wptr re-read
    // (after this store) sees the client's wptr.
    abi::protocol::publish_status(page.doorbell_status().get(), status as u64);
    trace.push(now, Event::Status { queue: q, status });
}

/// `DxgkCbDisconnectDoorbell`, as the OS answers it during a victimization.
struct Victimizer<'a> {
    processes: &'a mut BTreeMap<ProcessId, Process>,
    dummy: &'a Arc<Shm>,
    trace: &'a SharedTrace,
    victimizations: &'a mut u64,
    now: Time,
}

impl DisconnectCallback for Victimizer<'_> {
    fn disconnect_doorbell(&mut self, victim: HwQueueHandle) -> Result<(), DdiError> {
        let now = self.now;
        let p = self.processes.get_mut(&victim.owner()).ok_or(DdiError::UnknownQueue(victim))?;
        let qo = p.queues.get(victim).map_err(|_| DdiError::UnknownQueue(victim))?;
        self.trace.push(now, Event::Callback(Callback::DisconnectDoorbell(victim)));
        if let Some(d) = qo.doorbell
            && let Ok(dobj) = p.doorbells.get_mut(d)
        {
            dobj.connected = false;
            dobj.page.rotate_to(self.dummy, 0)?;
            self.trace.push(now, Event::Rotate { queue: victim, to: PageTarget::Dummy });
        }
        publish_status(self.trace, victim, &qo.kernel_page, DoorbellStatus::DisconnectedRetry, now);
        *self.victimizations += 1;
        Ok(())
    }
    fn victim_unbound(&mut self, victim: HwQueueHandle) {
        self.trace.push(self.now, Event::VictimUnbound { queue: victim });
    }
}
