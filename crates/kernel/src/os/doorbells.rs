//! Doorbells: objects, their CPU-VA rotation and status word, connect, disconnect and
//! victimization.
//!
//! Spec 000 "Doorbells" and its sequences, in the spec's order:
//! - **Connect** (`D3DKMTConnectDoorbell`): in D3, D0 and residency first; an engine in F1
//!   goes to F0; then `DxgkDdiConnectDoorbell`; then the doorbell CPU page is rotated to the
//!   BAR; then the status word becomes `Connected` (or `ConnectedNotify`); after D3 the
//!   contexts resume.
//! - **Victimization** (spec 000 "Victimizing doorbell pseudocode in KMD"): inside
//!   `DxgkDdiConnectDoorbell`, the KMD calls `DxgkCbDisconnectDoorbell` ([`Victimizer`]),
//!   which rotates the victim's CPU page to the dummy page and publishes
//!   `DisconnectedRetry`; then the KMD disconnects the physical doorbell. Which doorbell is
//!   the victim is the KMD's choice (`virtual_kmd::VictimPolicy`: least recently rung by
//!   default); [`Os::query_physical_doorbell`] shows who holds which BAR doorbell.
//! - **Disconnect** (F1 entry, D3, fault, termination): the CPU page is rotated to the dummy
//!   page, the status word becomes `DisconnectedRetry` (or `DisconnectedAbort`), then
//!   `DxgkDdiDisconnectDoorbell`; the firmware re-reads the queue's wptr so no racing ring is
//!   lost.
//!
//! - **Doorbell pages** (spec 001): besides the page the kernel gives every process, a
//!   process may allocate one of its own ([`Os::create_doorbell_page`]) and name it in a
//!   queue descriptor with the index it wants there; the queue pins it.
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
use abi::{DoorbellHandle, DoorbellPageHandle, DoorbellStatus, HwQueueHandle, ProcessId, Time};
use shm::{RotatingPage, Shm, Word};

use super::queues::QueueMode;
use super::{DoorbellObj, DoorbellPageObj, Os, Pin, Process, invalid};
use crate::ddi::{DdiError, DisconnectCallback, Kmd};
use crate::pool::Reset;
use crate::trace::{Callback, Ddi, Event, PageTarget, SharedTrace};

/// What a returned doorbell page goes back as: cleared, so its next owner starts with no
/// stale value or bit.
pub(super) fn clear_page(bar: Arc<Shm>) -> Reset {
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

impl Process {
    /// The doorbell page a queue descriptor names by `va` (0: the page the kernel gave the
    /// process): its BAR page, and its GPU VA where the device maps it for GPU rings. `None`
    /// if `va` names none of the process's pages.
    pub(super) fn doorbell_page_at(&self, va: u64) -> Option<(u32, Option<u64>)> {
        if va == 0 {
            return Some((self.doorbell_page.index(), self.doorbell_gpu.as_ref().map(|(va, _)| *va)));
        }
        let (_, d) = self.doorbell_pages.iter().find(|(_, d)| d.va == va)?;
        Some((d.lease.index(), d.gpu.as_ref().map(|_| d.va)))
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

impl Os {
    /// Allocates a doorbell page for process `pid` on `device`
    /// ([`abi::port::KernelPort::create_doorbell_page`], spec 001): a BAR page of its own
    /// (one it freed before, else a free one), named by a GPU VA and mapped there where the
    /// device lets the GPU ring doorbells, as the process's first page is.
    pub fn create_doorbell_page(
        &mut self,
        pid: ProcessId,
        device: abi::DeviceHandle,
        now: Time,
    ) -> Result<DoorbellPageInfo, KernelError> {
        self.at(now);
        self.adapter_alive()?;
        let p = self.proc(pid)?;
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
            None => self.doorbell_pages.take()?,
        };
        let va = self.proc(pid)?.take_va(abi::doorbell::DOORBELL_PAGE_BYTES);
        let gpu = self.ddi.map_doorbell_page(pid, va, lease.index()).ok();
        let handle = self.proc(pid)?.doorbell_pages.insert(DoorbellPageObj { device, va, gpu, lease });
        Ok(DoorbellPageInfo { handle, va, doorbells: abi::doorbell::DOORBELLS_PER_PAGE })
    }

    /// Frees a doorbell page ([`abi::port::KernelPort::destroy_doorbell_page`]); refused while
    /// a queue uses it. Its GPU mapping goes; the BAR page, cleared, stays the process's
    /// until it ends (a daemon client's mapping of it cannot be revoked, so it must never
    /// show another process's doorbells), and the process's next page takes it first.
    pub fn destroy_doorbell_page(&mut self, pid: ProcessId, page: DoorbellPageHandle) -> Result<(), KernelError> {
        let p = self.proc(pid)?;
        let va = p.doorbell_pages.get(page)?.va;
        let user = p.queues.iter().find(|(_, q)| q.user_desc().is_some_and(|d| d.doorbell_page_va == va));
        if let Some((q, _)) = user {
            return Err(KernelError::InUse { object: InUseObject::Handle(page.into()), by: InUseBy::Queue(q) });
        }
        let DoorbellPageObj { gpu, lease, .. } = p.doorbell_pages.remove(page)?;
        drop(gpu);
        clear_bar_page(&self.bar, lease.index());
        self.proc(pid)?.freed_doorbell_pages.push(lease);
        Ok(())
    }

    /// The physical doorbell the device has queue `q` bound to now
    /// ([`abi::port::KernelPort::query_physical_doorbell`]); `None` while it is disconnected.
    pub fn query_physical_doorbell(
        &mut self,
        pid: ProcessId,
        q: HwQueueHandle,
    ) -> Result<Option<abi::port::PhysicalDoorbell>, KernelError> {
        self.queue(pid, q)?;
        Ok(self.ddi.physical_doorbell(q))
    }

    /// The device's own number for queue `q` ([`crate::ddi::Kmd::device_queue_id`]), for
    /// tools that observe the device directly.
    pub fn device_queue_id(&mut self, pid: ProcessId, q: HwQueueHandle) -> Result<Option<u64>, KernelError> {
        self.queue(pid, q)?;
        Ok(self.ddi.device_queue_id(q))
    }

    /// `D3DKMTCreateDoorbell`: the doorbell starts disconnected, its CPU page on the dummy
    /// page; the kernel takes its references on the ring allocations.
    pub fn create_doorbell(
        &mut self,
        pid: ProcessId,
        args: &CreateDoorbell,
        now: Time,
    ) -> Result<DoorbellInfo, KernelError> {
        self.at(now);
        let q = args.queue;
        let p = self.proc(pid)?;
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
        let (offset, ring) = self.ddi.doorbell_ring(desc.doorbell_index);
        // The doorbell, of the size the KMD reported, lies whole in the CPU page.
        let bytes = self.ddi.adapter_info().doorbell_bytes;
        if !offset.is_multiple_of(bytes) || offset + bytes > shm::PAGE_SIZE as u64 {
            return Err(invalid(
                "doorbell_index",
                desc.doorbell_index,
                Invalid::OutOfRange { expected: "a doorbell of the reported size inside the doorbell page" },
            ));
        }
        let aggregated = match (self.ddi.aggregated_doorbell(engine), &self.proc(pid)?.aggregated) {
            (Some((offset, mask)), Some(a)) => Some(AggregatedDoorbell {
                page: a.cpu.clone(),
                offset,
                mask,
                gpu_va: a.gpu.as_ref().map(|(va, _)| va + offset),
            }),
            _ => None,
        };
        let page = Arc::new(RotatingPage::new(&self.dummy, 0)?);
        let p = self.proc(pid)?;
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
        self.trace.push(now, Event::Ddi(Ddi::CreateDoorbell(q)));
        let page_gpu = self.proc(pid)?.doorbell_page_at(desc.doorbell_page_va).and_then(|(_, gpu)| gpu);
        let gpu_va = match (ring, page_gpu) {
            (abi::doorbell::RingMethod::WriteWptr, Some(va)) => Some(va + offset),
            _ => None,
        };
        Ok(DoorbellInfo { handle: d, cpu_page: page, offset, ring, aggregated, gpu_va })
    }

    /// `D3DKMTDestroyDoorbell`.
    pub fn destroy_doorbell(&mut self, pid: ProcessId, d: DoorbellHandle, now: Time) -> Result<(), KernelError> {
        let q = self.proc(pid)?.doorbells.get(d)?.queue;
        self.destroy_doorbell_of(pid, q, now)
    }

    /// Destroys queue `q`'s doorbell: disconnected (`DisconnectedAbort`), then destroyed, and
    /// the kernel's references on the ring allocations dropped.
    pub(super) fn destroy_doorbell_of(
        &mut self,
        pid: ProcessId,
        q: HwQueueHandle,
        now: Time,
    ) -> Result<(), KernelError> {
        self.at(now);
        let d = self.queue(pid, q)?.doorbell.ok_or_else(|| invalid("queue", q, Invalid::NoDoorbell))?;
        self.disconnect(pid, q, DoorbellStatus::DisconnectedAbort, now)?;
        self.trace.push(now, Event::Ddi(Ddi::DestroyDoorbell(q)));
        let p = self.proc(pid)?;
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

    fn write_status(&mut self, pid: ProcessId, q: HwQueueHandle, status: DoorbellStatus, now: Time) {
        if let Ok(qo) = self.processes.get(&pid).ok_or(()).and_then(|p| p.queues.get(q).map_err(|_| ())) {
            publish_status(&self.trace, q, &qo.kernel_page, status, now);
        }
    }

    /// `D3DKMTConnectDoorbell`, in the spec's order (see the module docs).
    pub fn connect_doorbell(&mut self, pid: ProcessId, q: HwQueueHandle, now: Time) -> Result<(), KernelError> {
        self.at(now);
        self.adapter_alive()?;
        let qo = self.queue(pid, q)?;
        qo.live(q)?;
        let QueueMode::User { desc, .. } = qo.mode else {
            return Err(KernelError::WrongQueueMode { queue: q, actual: "kernel-mode", expected: "user-mode" });
        };
        let engine = qo.engine;
        let d = qo.doorbell.ok_or_else(|| invalid("queue", q, Invalid::NoDoorbell))?;
        let p = self.proc(pid)?;
        // The page the descriptor named (validated at creation; the queue pins it).
        let (process_page, _) = p.doorbell_page_at(desc.doorbell_page_va).ok_or_else(|| {
            invalid("doorbell_page_va", format!("{:#x}", desc.doorbell_page_va), Invalid::NoDoorbellPage)
        })?;
        let dobj = p.doorbells.get(d)?;
        if dobj.connected {
            return Ok(());
        }
        let page = dobj.page.clone();
        // 0. A connect in D3 wakes the device: D0, then residency (spec 000 "Engine D-state
        // transitions"); the contexts resume after the connection, below.
        let woke = self.power_up(now)?;
        let connected = self.connect_awake(pid, q, engine, d, page, process_page, desc.doorbell_index, now);
        // 5. After D3: resume every context — after a failed connection too: the device is in
        // D0 now, and no later connect would resume them (found by `doorbell sim swarm`:
        // a failed reconnect out of D3 left every context suspended and the work never ran).
        if woke {
            self.resume_after_d3(now)?;
        }
        connected
    }

    /// Steps 1 to 4 of [`Os::connect_doorbell`], the device awake.
    #[allow(clippy::too_many_arguments)]
    fn connect_awake(
        &mut self,
        pid: ProcessId,
        q: HwQueueHandle,
        engine: abi::EngineId,
        d: DoorbellHandle,
        page: Arc<RotatingPage>,
        process_page: u32,
        index: u32,
        now: Time,
    ) -> Result<(), KernelError> {
        // 1. An engine in F1 goes back to F0 first (spec 000 "Engine F-state transitions").
        self.wake_engine(engine, now)?;
        // 2. DxgkDdiConnectDoorbell: the KMD binds a physical doorbell — after victimizing
        // one through DxgkCbDisconnectDoorbell when the pool is full.
        let mut victimizer = Victimizer {
            processes: &mut self.processes,
            dummy: &self.dummy,
            trace: &self.trace,
            victimizations: &mut self.stats.victimizations,
            now,
        };
        let step = self.ddi.connect_doorbell(q, process_page, index, &mut victimizer)?;
        // 3. Dxgkrnl maps the physical doorbell at the doorbell's CPU VA.
        page.rotate_to(&self.bar, step.page_offset)?;
        self.trace.push(now, Event::Rotate { queue: q, to: PageTarget::Bar });
        // 4. Dxgkrnl updates the status to connected.
        let status = if step.notify { DoorbellStatus::ConnectedNotify } else { DoorbellStatus::Connected };
        self.write_status(pid, q, status, now);
        self.proc(pid)?.doorbells.get_mut(d)?.connected = true;
        self.stats.connects += 1;
        Ok(())
    }

    /// Disconnects a queue's doorbell (`DxgkCbDisconnectDoorbell` then the DDI). With
    /// `DisconnectedAbort` the status is written even if it was not connected.
    pub(super) fn disconnect(
        &mut self,
        pid: ProcessId,
        q: HwQueueHandle,
        status: DoorbellStatus,
        now: Time,
    ) -> Result<(), KernelError> {
        let Some(d) = self.queue(pid, q)?.doorbell else {
            if status == DoorbellStatus::DisconnectedAbort {
                self.write_status(pid, q, status, now);
            }
            return Ok(());
        };
        let dobj = self.proc(pid)?.doorbells.get_mut(d)?;
        let was = std::mem::replace(&mut dobj.connected, false);
        let page = dobj.page.clone();
        if was {
            // 1. Rotate the client's doorbell CPU VA to the dummy page.
            page.rotate_to(&self.dummy, 0)?;
            self.trace.push(now, Event::Rotate { queue: q, to: PageTarget::Dummy });
        }
        // 2. Publish the status.
        if was || status == DoorbellStatus::DisconnectedAbort {
            self.write_status(pid, q, status, now);
        }
        if was {
            // 3. The KMD disconnects the physical doorbell; the firmware re-reads wptr.
            self.ddi.disconnect_doorbell(q)?;
        }
        Ok(())
    }

    /// `D3DKMTNotifyWorkSubmission`.
    pub fn notify_work_submission(&mut self, pid: ProcessId, d: DoorbellHandle, now: Time) -> Result<(), KernelError> {
        self.at(now);
        let q = self.proc(pid)?.doorbells.get(d)?.queue;
        self.ddi.notify_work_submission(q)?;
        Ok(())
    }
}
