//! Processes and the objects they own: devices, allocations, contexts.
//!
//! Spec 000's object model (`D3DKMTCreateDevice`, allocations, hardware contexts) and its
//! "Residency model": an allocation that a queue runs from or a doorbell references is pinned
//! and cannot be freed. A process gets a GPU address space and a doorbell BAR page (and an
//! aggregated doorbell page where the device needs one, spec 001) when it is created; every
//! one of them is a lease or RAII mapping, so they return when the process ends, whatever
//! the order.
//!
//! # Memory
//!
//! A process's memory is its [`ProcessMemory`]: pools of memfd arenas by protection class
//! (the records' module, `process.rs`, says why). Freeing follows the residency rule:
//! `free` is refused while a queue or doorbell references the allocation; once it succeeds
//! the GPU mapping is gone, and the pages return to the arena, zeroed, when the last CPU
//! view the client still holds drops (until then nothing else can be given them).

use std::collections::VecDeque;
use std::sync::Arc;

use abi::port::{AllocationDesc, AllocationInfo, InUseBy, InUseObject, Invalid, KernelError};
use abi::{AllocationHandle, ContextHandle, DeviceHandle, EngineId, ProcessId, Time};
use shm::{Prot, RotatingPage};

use super::super::Os;
use super::super::process::{AggregatedPage, AllocObj, ContextObj, DeviceObj, Pin, Process, ProcessMemory};
use super::super::shared::invalid;
use crate::ddi::Kmd;
use crate::table::Table;

/// First GPU VA handed to a process.
const VA_BASE: u64 = 0x1_0000_0000;
/// Largest single allocation.
const MAX_ALLOCATION: u64 = 1 << 30;

impl Os {
    /// Creates a process: a GPU address space and a doorbell page.
    pub fn create_process(&mut self, _now: Time) -> Result<ProcessId, KernelError> {
        let page = self.doorbells.pages.take()?;
        // Spec 001: "the kernel driver will map a page of aggregated doorbell space into each
        // GPUVM space" — a page of its own, so no process can clear another's rings.
        let aggregated = if self.cx.ddi.adapter_info().aggregated_doorbell {
            let lease = self.doorbells.pages.take()?;
            let map = Arc::new(RotatingPage::new(
                &self.doorbells.bar,
                lease.index() as u64 * abi::doorbell::DOORBELL_PAGE_BYTES,
            )?);
            self.cx.ddi.watch_aggregated_page(lease.index())?;
            Some(AggregatedPage { gpu: None, cpu: map, lease })
        } else {
            None
        };
        let pid = ProcessId(self.cx.next_pid);
        let memory = ProcessMemory::new(pid);
        if let Err(e) = self.cx.ddi.create_address_space(pid) {
            if let Some(a) = &aggregated {
                self.cx.ddi.unwatch_aggregated_page(a.lease.index());
            }
            return Err(e.into());
        }
        self.cx.next_pid += 1;
        self.cx.processes.insert(
            pid,
            Process {
                doorbell_gpu: None,
                doorbell_page: page,
                doorbell_pages: Table::new(pid),
                freed_doorbell_pages: Vec::new(),
                aggregated,
                next_va: VA_BASE,
                devices: Table::new(pid),
                contexts: Table::new(pid),
                queues: Table::new(pid),
                allocations: Table::new(pid),
                doorbells: Table::new(pid),
                fences: Table::new(pid),
                fence_pages: Vec::new(),
                memory,
            },
        );
        // Spec 001: queues may ring each other from the GPU. The process's own doorbell page,
        // and only it, is mapped into its address space (where the device allows it), so a
        // queue can ring only its own process's queues.
        let (index, va) = {
            let p = self.proc(pid)?;
            (p.doorbell_page.index(), p.take_va(abi::doorbell::DOORBELL_PAGE_BYTES))
        };
        if let Ok(m) = self.cx.ddi.map_doorbell_page(pid, va, index) {
            self.proc(pid)?.doorbell_gpu = Some((va, m));
        }
        // The aggregated page too ("into each GPUVM space"): a queue that submits to another
        // from the GPU rings it as the CPU would.
        let p = self.proc(pid)?;
        if let Some(index) = p.aggregated.as_ref().map(|a| a.lease.index()) {
            let va = p.take_va(abi::doorbell::DOORBELL_PAGE_BYTES);
            if let Ok(m) = self.cx.ddi.map_aggregated_page(pid, va, index)
                && let Some(a) = &mut self.proc(pid)?.aggregated
            {
                a.gpu = Some((va, m));
            }
        }
        Ok(pid)
    }

    /// `D3DKMTCreateDevice`.
    pub fn create_device(&mut self, pid: ProcessId) -> Result<DeviceHandle, KernelError> {
        self.recovery.adapter_alive()?;
        Ok(self.proc(pid)?.devices.insert(DeviceObj::default()))
    }

    /// `D3DKMTDestroyDevice`: its contexts (and their queues), then its doorbell pages, then
    /// its fences, then its allocations.
    pub fn destroy_device(&mut self, pid: ProcessId, device: DeviceHandle, now: Time) -> Result<(), KernelError> {
        let p = self.proc(pid)?;
        p.devices.get(device)?;
        let contexts: Vec<_> = p.contexts.iter().filter(|(_, c)| c.device == device).map(|(h, _)| h).collect();
        for c in contexts {
            self.destroy_context(pid, c, now)?;
        }
        let p = self.proc(pid)?;
        let pages: Vec<_> = p.doorbell_pages.iter().filter(|(_, d)| d.device == device).map(|(h, _)| h).collect();
        for d in pages {
            self.destroy_doorbell_page(pid, d)?;
        }
        let p = self.proc(pid)?;
        let fences: Vec<_> = p.fences.iter().filter(|(_, f)| f.device == device).map(|(h, _)| h).collect();
        for f in fences {
            self.destroy_native_fence(pid, f, now)?;
        }
        let p = self.proc(pid)?;
        let allocs: Vec<_> = p.allocations.iter().filter(|(_, a)| a.device == device).map(|(h, _)| h).collect();
        for a in allocs {
            self.free(pid, a)?;
        }
        self.proc(pid)?.devices.remove(device)?;
        Ok(())
    }

    /// Allocates memory and maps it into the process's GPU address space.
    pub fn allocate(
        &mut self,
        pid: ProcessId,
        device: DeviceHandle,
        desc: &AllocationDesc,
        _now: Time,
    ) -> Result<AllocationInfo, KernelError> {
        if desc.bytes == 0 || desc.bytes > MAX_ALLOCATION {
            return Err(invalid("bytes", desc.bytes, Invalid::Size { max: MAX_ALLOCATION }));
        }
        let bytes = desc.bytes.div_ceil(4096) * 4096;
        let p = self.proc(pid)?;
        p.devices.get(device)?;
        let shm = p.memory.client.alloc(bytes as usize)?;
        let va = p.take_va(bytes);
        let mapping = self.cx.ddi.map_gpu(pid, va, bytes, shm.clone(), !desc.gpu_read_only)?;
        let handle = self.proc(pid)?.allocations.insert(AllocObj {
            device,
            shm,
            va,
            bytes,
            pins: Vec::new(),
            domain: desc.domain,
            evicted: false,
            mapping: Some(mapping),
        });
        Ok(AllocationInfo { handle, va, bytes })
    }

    /// Maps an allocation for the CPU.
    pub fn map_allocation(&mut self, pid: ProcessId, a: AllocationHandle) -> Result<shm::Mapping, KernelError> {
        let a = self.proc(pid)?.allocations.get(a)?;
        Ok(a.shm.map_range(0, a.bytes as usize, Prot::ReadWrite)?)
    }

    /// Frees an allocation; refused while a queue or a doorbell holds a reference.
    pub fn free(&mut self, pid: ProcessId, a: AllocationHandle) -> Result<(), KernelError> {
        let p = self.proc(pid)?;
        let obj = p.allocations.get(a)?;
        if let Some(pin) = obj.pins.first() {
            let by = match *pin {
                Pin::Queue(q) => InUseBy::Queue(q),
                Pin::Doorbell(d) => InUseBy::Doorbell { doorbell: d, queue: p.doorbells.get(d).ok().map(|d| d.queue) },
            };
            return Err(KernelError::InUse { object: InUseObject::Handle(a.into()), by });
        }
        // Dropping it unmaps it.
        p.allocations.remove(a)?;
        Ok(())
    }

    /// Creates a context on an engine.
    pub fn create_context(
        &mut self,
        pid: ProcessId,
        device: DeviceHandle,
        engine: EngineId,
    ) -> Result<ContextHandle, KernelError> {
        let engines = self.cx.ddi.adapter_info().engines;
        if !engines.iter().any(|e| e.id == engine) {
            return Err(invalid("engine", engine, Invalid::NoSuchEngine { engines: engines.len() }));
        }
        let p = self.proc(pid)?;
        p.devices.get(device)?;
        Ok(p.contexts.insert(ContextObj { device, engine, software_queue: VecDeque::new(), suspended: false }))
    }

    /// Destroys a context and its queues.
    pub fn destroy_context(&mut self, pid: ProcessId, c: ContextHandle, now: Time) -> Result<(), KernelError> {
        let p = self.proc(pid)?;
        p.contexts.get(c)?;
        let queues: Vec<_> = p.queues.iter().filter(|(_, q)| q.context == c).map(|(h, _)| h).collect();
        for q in queues {
            self.destroy_hw_queue(pid, q, now)?;
        }
        let ctx = self.proc(pid)?.contexts.remove(c)?;
        self.km.queued -= ctx.software_queue.len();
        Ok(())
    }

    /// Ends a process: every queue is destroyed (doorbell disconnected first), then its
    /// fences; then its memory, address space and doorbell pages are returned. Ending it
    /// twice is a no-op.
    pub fn finish_termination(&mut self, pid: ProcessId, now: Time) {
        let Some(p) = self.cx.processes.get(&pid) else { return };
        let (queues, fences) = (p.queues.handles(), p.fences.handles());
        for q in queues {
            // Teardown goes on past a failure: whatever is left goes with the process.
            let _ = self.destroy_hw_queue(pid, q, now);
        }
        for f in fences {
            let _ = self.destroy_native_fence(pid, f, now);
        }
        let Some(p) = self.cx.processes.remove(&pid) else { return };
        // Waits its threads never ended (a thread killed while blocked).
        self.cx.waits.forget_process(pid);
        self.recovery.forget_process(pid);
        if let Some(a) = &p.aggregated {
            // Like its doorbells: a late write from the ended process lands on the dummy page,
            // never on the page's next owner. (Should the remap fail, the page is still
            // cleared on its way back, and the ended process has no thread left to write.)
            let _ = a.cpu.rotate_to(&self.doorbells.dummy, 0);
            self.cx.ddi.unwatch_aggregated_page(a.lease.index());
        }
        // The allocations' and fence pages' mappings go first (dropped with the process),
        // then the address space; the page leases return cleared.
        drop(p);
        // It can only fail for an address space the KMD never made: nothing to undo.
        let _ = self.cx.ddi.destroy_address_space(pid);
    }
}
