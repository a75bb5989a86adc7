//! A client process's kernel port: the [`abi::port::KernelPort`] a `umd::Device` runs on in
//! the embedded mode. Each call is one input of the OS through [`Inner::call_as`].

use std::sync::Arc;
use std::task::Waker;
use std::time::Duration;

use abi::port::{
    AdapterInfo, AllocationDesc, AllocationInfo, CreateDoorbell, DoorbellInfo, HwQueueDesc, HwQueueInfo, KernelError,
    KernelPort, NativeFenceDesc, NativeFenceInfo, QueueStatus, WaitMode, WaitOutcome,
};
use abi::{
    AllocationHandle, ContextHandle, DeviceHandle, DoorbellHandle, EngineId, HwQueueHandle, NativeFenceHandle,
    ProcessId, Time,
};

use super::Termination;
use super::driver::Inner;
use crate::os::{Os, WaitId, WaitStart};

/// One client process's kernel port.
pub struct ProcessPort {
    pub(super) inner: Arc<Inner>,
    pub(super) pid: ProcessId,
}

impl ProcessPort {
    /// One call of this process into the OS.
    fn call<T>(&self, f: impl FnOnce(&mut Os, ProcessId, Time) -> Result<T, KernelError>) -> Result<T, KernelError> {
        self.inner.call_as(self.pid, |os, now| f(os, self.pid, now))
    }

    /// Ends the process now, normally or abnormally. Its queues, doorbells, fences and
    /// memory are destroyed and every pool gets its resources back.
    pub fn terminate(&self, how: Termination) {
        self.inner.terminate(self.pid, how);
    }
}

impl ProcessPort {
    /// [`KernelPort::wait_progress`], and `waker` is woken as soon as the OS decides the wait
    /// (before this thread wakes to end it): how a daemon wakes a client process that sleeps
    /// on a futex of its own instead of on this call's answer.
    pub fn wait_progress_waking(
        &self,
        queue: HwQueueHandle,
        value: u64,
        timeout: Option<Duration>,
        waker: Option<&Waker>,
    ) -> Result<WaitOutcome, KernelError> {
        self.wait_waking(
            |os, pid, now| os.begin_wait(pid, queue, value, now),
            |os, pid, w, now| os.end_wait(pid, queue, w, now),
            timeout,
            waker,
        )
    }

    /// [`KernelPort::wait_native_fences`] with a waker, as [`Self::wait_progress_waking`].
    pub fn wait_native_fences_waking(
        &self,
        fences: &[(NativeFenceHandle, u64)],
        mode: WaitMode,
        timeout: Option<Duration>,
        waker: Option<&Waker>,
    ) -> Result<WaitOutcome, KernelError> {
        self.wait_waking(
            |os, pid, now| os.begin_fence_wait(pid, fences, mode, now),
            |os, pid, w, _| os.end_fence_wait(pid, w),
            timeout,
            waker,
        )
    }

    /// A wait begun by `begin`: decided at once, or blocked until the OS decides it or
    /// `timeout` passes, then ended by `end`. `waker` is registered under the OS lock, so it
    /// is known before anything can decide the wait.
    ///
    /// If the decision woke it (the waker is gone), the sleeper in the other process is
    /// waking now, and it needs a core more than this thread does (its answer is only the
    /// confirmation): it gets the core first. On a two-core machine whose other core runs the
    /// firmware thread, this is the difference between the futex wake-up and a socket round
    /// trip.
    fn wait_waking(
        &self,
        begin: impl FnOnce(&mut Os, ProcessId, Time) -> Result<WaitStart, KernelError>,
        end: impl FnOnce(&mut Os, ProcessId, WaitId, Time) -> Result<WaitOutcome, KernelError>,
        timeout: Option<Duration>,
        waker: Option<&Waker>,
    ) -> Result<WaitOutcome, KernelError> {
        let start = self.call(|os, pid, now| {
            let s = begin(os, pid, now);
            if let (Ok(WaitStart::Blocked(w)), Some(waker)) = (&s, waker) {
                self.inner.set_waker(*w, waker);
            }
            s
        })?;
        match start {
            WaitStart::Done(r) => r,
            WaitStart::Blocked(w) => {
                self.inner.block(w, timeout);
                if self.inner.take_waker(w).is_none() && waker.is_some() {
                    std::thread::yield_now();
                }
                self.inner.call(|os, now| end(os, self.pid, w, now))
            }
        }
    }
}

impl Drop for ProcessPort {
    /// The process exits: a normal termination (it waits for the work already queued).
    fn drop(&mut self) {
        self.inner.terminate(self.pid, Termination::Normal);
    }
}

impl KernelPort for ProcessPort {
    fn process(&self) -> ProcessId {
        self.pid
    }
    fn adapter_info(&self) -> AdapterInfo {
        self.inner.os.lock().adapter_info()
    }
    fn native_fence_caps(&self) -> Result<abi::port::NativeFenceCaps, KernelError> {
        Ok(self.inner.os.lock().native_fence_caps())
    }
    fn create_device(&self) -> Result<DeviceHandle, KernelError> {
        self.inner.call_as(self.pid, |os, _| os.create_device(self.pid))
    }
    fn destroy_device(&self, device: DeviceHandle) -> Result<(), KernelError> {
        self.call(|os, pid, now| os.destroy_device(pid, device, now))
    }
    fn allocate(&self, device: DeviceHandle, desc: &AllocationDesc) -> Result<AllocationInfo, KernelError> {
        self.call(|os, pid, now| os.allocate(pid, device, desc, now))
    }
    fn map_allocation(&self, allocation: AllocationHandle) -> Result<shm::Mapping, KernelError> {
        self.call(|os, pid, _| os.map_allocation(pid, allocation))
    }
    fn free(&self, allocation: AllocationHandle) -> Result<(), KernelError> {
        self.call(|os, pid, _| os.free(pid, allocation))
    }
    fn create_context(&self, device: DeviceHandle, engine: EngineId) -> Result<ContextHandle, KernelError> {
        self.call(|os, pid, _| os.create_context(pid, device, engine))
    }
    fn destroy_context(&self, context: ContextHandle) -> Result<(), KernelError> {
        self.call(|os, pid, now| os.destroy_context(pid, context, now))
    }
    fn create_hw_queue(&self, context: ContextHandle, desc: &HwQueueDesc) -> Result<HwQueueInfo, KernelError> {
        self.call(|os, pid, now| os.create_hw_queue(pid, context, desc, now))
    }
    fn destroy_hw_queue(&self, queue: HwQueueHandle) -> Result<(), KernelError> {
        self.call(|os, pid, now| os.destroy_hw_queue(pid, queue, now))
    }
    fn create_doorbell_page(&self, device: DeviceHandle) -> Result<abi::port::DoorbellPageInfo, KernelError> {
        self.call(|os, pid, now| os.create_doorbell_page(pid, device, now))
    }
    fn destroy_doorbell_page(&self, page: abi::DoorbellPageHandle) -> Result<(), KernelError> {
        self.call(|os, pid, _| os.destroy_doorbell_page(pid, page))
    }
    fn create_doorbell(&self, args: &CreateDoorbell) -> Result<DoorbellInfo, KernelError> {
        self.call(|os, pid, now| os.create_doorbell(pid, args, now))
    }
    fn connect_doorbell(&self, queue: HwQueueHandle) -> Result<(), KernelError> {
        self.call(|os, pid, now| os.connect_doorbell(pid, queue, now))
    }
    fn destroy_doorbell(&self, doorbell: DoorbellHandle) -> Result<(), KernelError> {
        self.call(|os, pid, now| os.destroy_doorbell(pid, doorbell, now))
    }
    fn notify_work_submission(&self, doorbell: DoorbellHandle) -> Result<(), KernelError> {
        self.call(|os, pid, now| os.notify_work_submission(pid, doorbell, now))
    }
    fn submit_command(&self, queue: HwQueueHandle, words: &[u32]) -> Result<(), KernelError> {
        self.call(|os, pid, _| os.submit_command(pid, queue, words))
    }
    fn wait_progress(
        &self,
        queue: HwQueueHandle,
        value: u64,
        timeout: Option<Duration>,
    ) -> Result<WaitOutcome, KernelError> {
        self.wait_progress_waking(queue, value, timeout, None)
    }
    fn query_queue(&self, queue: HwQueueHandle) -> Result<QueueStatus, KernelError> {
        self.call(|os, pid, _| os.query_queue(pid, queue))
    }
    fn create_native_fence(
        &self,
        device: DeviceHandle,
        desc: &NativeFenceDesc,
    ) -> Result<NativeFenceInfo, KernelError> {
        self.call(|os, pid, now| os.create_native_fence(pid, device, desc, now))
    }
    fn open_native_fence(&self, device: DeviceHandle, global: u64) -> Result<NativeFenceInfo, KernelError> {
        self.call(|os, pid, now| os.open_native_fence(pid, device, global, now))
    }
    fn open_cross_adapter_fence(&self, device: DeviceHandle, handle: u64) -> Result<NativeFenceInfo, KernelError> {
        self.call(|os, pid, now| os.open_cross_adapter_fence(pid, device, handle, now))
    }
    fn destroy_native_fence(&self, fence: NativeFenceHandle) -> Result<(), KernelError> {
        self.call(|os, pid, now| os.destroy_native_fence(pid, fence, now))
    }
    fn signal_native_fence(&self, fence: NativeFenceHandle, value: u64) -> Result<(), KernelError> {
        self.call(|os, pid, now| os.signal_native_fence(pid, fence, value, now))
    }
    fn wait_native_fences(
        &self,
        fences: &[(NativeFenceHandle, u64)],
        mode: WaitMode,
        timeout: Option<Duration>,
    ) -> Result<WaitOutcome, KernelError> {
        self.wait_native_fences_waking(fences, mode, timeout, None)
    }
    fn query_native_fence(&self, fence: NativeFenceHandle) -> Result<abi::port::NativeFenceValues, KernelError> {
        self.call(|os, pid, _| os.query_native_fence(pid, fence))
    }
    fn query_physical_doorbell(
        &self,
        queue: HwQueueHandle,
    ) -> Result<Option<abi::port::PhysicalDoorbell>, KernelError> {
        self.call(|os, pid, _| os.query_physical_doorbell(pid, queue))
    }

    fn userq_signal(
        &self,
        queue: HwQueueHandle,
        point: u64,
        fences: &[(abi::NativeFenceHandle, u64)],
    ) -> Result<(), KernelError> {
        self.call(|os, pid, now| os.userq_signal(pid, queue, point, fences, now))
    }

    fn userq_wait(
        &self,
        queue: HwQueueHandle,
        objects: &[abi::port::SyncWait],
    ) -> Result<Vec<abi::port::WaitPoint>, KernelError> {
        self.call(|os, pid, now| os.userq_wait(pid, queue, objects, now))
    }

    fn open_progress_fence(&self, queue: HwQueueHandle) -> Result<abi::port::NativeFenceInfo, KernelError> {
        self.call(|os, pid, now| os.open_progress_fence(pid, queue, now))
    }
}
