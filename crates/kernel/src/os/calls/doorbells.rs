//! The doorbell calls (spec 000 "Doorbells"; spec 001's doorbell pages): each runs the
//! doorbells' owner ([`Doorbells`](super::super::doorbells::Doorbells)), and a connect wakes a
//! device in D3 around it.

use abi::port::{CreateDoorbell, DoorbellInfo, DoorbellPageInfo, KernelError};
use abi::{DoorbellHandle, DoorbellPageHandle, HwQueueHandle, ProcessId, Time};

use super::super::Os;
use crate::ddi::Kmd;

impl Os {
    /// Allocates a doorbell page for process `pid` on `device`
    /// ([`abi::port::KernelPort::create_doorbell_page`], spec 001): a BAR page of its own
    /// (one it freed before, else a free one), named by a GPU VA and mapped there where the
    /// device lets the GPU ring doorbells, as the process's first page is.
    pub fn create_doorbell_page(
        &mut self,
        pid: ProcessId,
        device: abi::DeviceHandle,
        _now: Time,
    ) -> Result<DoorbellPageInfo, KernelError> {
        self.recovery.adapter_alive()?;
        self.doorbells.create_page(&mut self.cx, pid, device)
    }

    /// Frees a doorbell page ([`abi::port::KernelPort::destroy_doorbell_page`]); refused while
    /// a queue uses it. Its GPU mapping goes; the BAR page, cleared, stays the process's
    /// until it ends (a daemon client's mapping of it cannot be revoked, so it must never
    /// show another process's doorbells), and the process's next page takes it first.
    pub fn destroy_doorbell_page(&mut self, pid: ProcessId, page: DoorbellPageHandle) -> Result<(), KernelError> {
        self.doorbells.destroy_page(&mut self.cx, pid, page)
    }

    /// The physical doorbell the device has queue `q` bound to now
    /// ([`abi::port::KernelPort::query_physical_doorbell`]); `None` while it is disconnected.
    pub fn query_physical_doorbell(
        &mut self,
        pid: ProcessId,
        q: HwQueueHandle,
    ) -> Result<Option<abi::port::PhysicalDoorbell>, KernelError> {
        self.queue(pid, q)?;
        Ok(self.cx.ddi.physical_doorbell(q))
    }

    /// The device's own number for queue `q` ([`crate::ddi::Kmd::device_queue_id`]), for
    /// tools that observe the device directly.
    pub fn device_queue_id(&mut self, pid: ProcessId, q: HwQueueHandle) -> Result<Option<u64>, KernelError> {
        self.queue(pid, q)?;
        Ok(self.cx.ddi.device_queue_id(q))
    }

    /// `D3DKMTCreateDoorbell`: the doorbell starts disconnected, its CPU page on the dummy
    /// page; the kernel takes its references on the ring allocations.
    pub fn create_doorbell(
        &mut self,
        pid: ProcessId,
        args: &CreateDoorbell,
        now: Time,
    ) -> Result<DoorbellInfo, KernelError> {
        self.doorbells.create(&mut self.cx, pid, args, now)
    }

    /// `D3DKMTDestroyDoorbell`.
    pub fn destroy_doorbell(&mut self, pid: ProcessId, d: DoorbellHandle, now: Time) -> Result<(), KernelError> {
        let q = self.proc(pid)?.doorbells.get(d)?.queue;
        self.doorbells.destroy_of(&mut self.cx, pid, q, now)
    }

    /// `D3DKMTConnectDoorbell`, in the spec's order (see
    /// [`doorbells`](super::super::doorbells)).
    pub fn connect_doorbell(&mut self, pid: ProcessId, q: HwQueueHandle, now: Time) -> Result<(), KernelError> {
        self.recovery.adapter_alive()?;
        let Some(target) = self.doorbells.connect_target(&mut self.cx, pid, q)? else { return Ok(()) };
        // 0. A connect in D3 wakes the device: D0, then residency (spec 000 "Engine D-state
        // transitions"); the contexts resume after the connection, below.
        let woke = self.power.power_up(&mut self.cx, now)?;
        let connected = self.doorbells.connect_awake(&mut self.cx, pid, q, target, now);
        // 5. After D3: resume every context — after a failed connection too: the device is in
        // D0 now, and no later connect would resume them (found by `doorbell sim swarm`:
        // a failed reconnect out of D3 left every context suspended and the work never ran).
        if woke {
            self.resume_after_d3(now)?;
        }
        connected
    }

    /// `D3DKMTNotifyWorkSubmission`.
    pub fn notify_work_submission(&mut self, pid: ProcessId, d: DoorbellHandle, _now: Time) -> Result<(), KernelError> {
        let q = self.proc(pid)?.doorbells.get(d)?.queue;
        self.cx.ddi.notify_work_submission(q)?;
        Ok(())
    }
}
