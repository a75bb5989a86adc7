//! A client process's kernel port: the [`abi::port::KernelPort`] a `umd::Device` runs on in
//! the embedded mode, and what the daemon hands each decoded call to. It implements the one
//! method a port has, [`KernelPort::call`]: one dispatch of an [`abi::port::Call`] onto the
//! OS, each call one input of the OS through [`Inner::call_as`], its answer an
//! [`abi::port::Reply`] with its shared memory mapped in this process ([`abi::port::Local`]).
//! [`ProcessPort::call_waking`] is the same dispatch with a waker for blocking waits.

use std::sync::Arc;
use std::task::Waker;
use std::time::Duration;

use abi::port::{AdapterInfo, Call, KernelError, KernelPort, Reply, WaitMode, WaitOutcome};
use abi::{HwQueueHandle, NativeFenceHandle, ProcessId, Time};

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
    fn os<T>(&self, f: impl FnOnce(&mut Os, ProcessId, Time) -> Result<T, KernelError>) -> Result<T, KernelError> {
        self.inner.call_as(self.pid, |os, now| f(os, self.pid, now))
    }

    /// Ends the process now, normally or abnormally. Its queues, doorbells, fences and
    /// memory are destroyed and every pool gets its resources back.
    pub fn terminate(&self, how: Termination) {
        self.inner.terminate(self.pid, how);
    }
}

impl ProcessPort {
    /// [`KernelPort::call`], and for a blocking wait ([`Call::is_wait`]) `waker` is woken as
    /// soon as the OS decides it (before this thread wakes to end it): how a daemon wakes a
    /// client process that sleeps on a futex of its own instead of on the call's answer.
    pub fn call_waking(&self, call: &Call<'_>, waker: Option<&Waker>) -> Result<Reply, KernelError> {
        let unit = |()| Reply::Unit;
        match *call {
            Call::NativeFenceCaps => Ok(Reply::NativeFenceCaps(self.inner.os.lock().native_fence_caps())),
            Call::CreateDevice => self.os(|os, pid, _| os.create_device(pid)).map(Reply::Device),
            Call::DestroyDevice(d) => self.os(|os, pid, now| os.destroy_device(pid, d, now)).map(unit),
            Call::Allocate { device, desc } => {
                self.os(|os, pid, now| os.allocate(pid, device, &desc, now)).map(Reply::Allocation)
            }
            Call::MapAllocation(a) => self.os(|os, pid, _| os.map_allocation(pid, a)).map(Reply::Mapping),
            Call::Free(a) => self.os(|os, pid, _| os.free(pid, a)).map(unit),
            Call::CreateContext { device, engine } => {
                self.os(|os, pid, _| os.create_context(pid, device, engine)).map(Reply::Context)
            }
            Call::DestroyContext(c) => self.os(|os, pid, now| os.destroy_context(pid, c, now)).map(unit),
            Call::CreateHwQueue { context, desc } => {
                self.os(|os, pid, now| os.create_hw_queue(pid, context, &desc, now)).map(Reply::HwQueue)
            }
            Call::DestroyHwQueue(q) => self.os(|os, pid, now| os.destroy_hw_queue(pid, q, now)).map(unit),
            Call::CreateDoorbellPage(d) => {
                self.os(|os, pid, now| os.create_doorbell_page(pid, d, now)).map(Reply::DoorbellPage)
            }
            Call::DestroyDoorbellPage(p) => self.os(|os, pid, _| os.destroy_doorbell_page(pid, p)).map(unit),
            Call::CreateDoorbell(args) => {
                self.os(|os, pid, now| os.create_doorbell(pid, &args, now)).map(Reply::Doorbell)
            }
            Call::ConnectDoorbell(q) => self.os(|os, pid, now| os.connect_doorbell(pid, q, now)).map(Reply::Connected),
            Call::DestroyDoorbell(d) => self.os(|os, pid, now| os.destroy_doorbell(pid, d, now)).map(unit),
            Call::NotifyWorkSubmission(d) => self.os(|os, pid, now| os.notify_work_submission(pid, d, now)).map(unit),
            Call::SubmitCommand { queue, ref words } => {
                self.os(|os, pid, _| os.submit_command(pid, queue, words)).map(unit)
            }
            Call::WaitProgress { queue, value, timeout } => {
                self.wait_progress_waking(queue, value, timeout, waker).map(Reply::Wait)
            }
            Call::QueryQueue(q) => self.os(|os, pid, _| os.query_queue(pid, q)).map(Reply::QueueStatus),
            Call::CreateNativeFence { device, desc } => {
                self.os(|os, pid, now| os.create_native_fence(pid, device, &desc, now)).map(Reply::NativeFence)
            }
            Call::OpenNativeFence { device, global } => {
                self.os(|os, pid, now| os.open_native_fence(pid, device, global, now)).map(Reply::NativeFence)
            }
            Call::OpenCrossAdapterFence { device, handle } => {
                self.os(|os, pid, now| os.open_cross_adapter_fence(pid, device, handle, now)).map(Reply::NativeFence)
            }
            Call::DestroyNativeFence(f) => self.os(|os, pid, now| os.destroy_native_fence(pid, f, now)).map(unit),
            Call::SignalNativeFence { fence, value } => {
                self.os(|os, pid, now| os.signal_native_fence(pid, fence, value, now)).map(unit)
            }
            Call::WaitNativeFences { ref fences, mode, timeout } => {
                self.wait_native_fences_waking(fences, mode, timeout, waker).map(Reply::Wait)
            }
            Call::QueryNativeFence(f) => self.os(|os, pid, _| os.query_native_fence(pid, f)).map(Reply::FenceValues),
            Call::QueryPhysicalDoorbell(q) => {
                self.os(|os, pid, _| os.query_physical_doorbell(pid, q)).map(Reply::PhysicalDoorbell)
            }
            Call::UserqSignal { queue, point, ref fences } => {
                self.os(|os, pid, now| os.userq_signal(pid, queue, point, fences, now)).map(unit)
            }
            Call::UserqWait { queue, ref objects } => {
                self.os(|os, pid, now| os.userq_wait(pid, queue, objects, now)).map(Reply::WaitPoints)
            }
            Call::OpenProgressFence(q) => {
                self.os(|os, pid, now| os.open_progress_fence(pid, q, now)).map(Reply::NativeFence)
            }
        }
    }

    /// A progress wait, `waker` woken as soon as the OS decides it.
    fn wait_progress_waking(
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

    /// A native fence wait, `waker` woken as soon as the OS decides it.
    fn wait_native_fences_waking(
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
        let start = self.os(|os, pid, now| {
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
    fn call(&self, call: &Call<'_>) -> Result<Reply, KernelError> {
        self.call_waking(call, None)
    }
}
