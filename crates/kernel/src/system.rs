//! An embedded system: the kernel and the virtual GPU in this process, and the two drivers
//! that run them.
//!
//! One core, two drivers (BRIEF 4.1). Both call the same [`Inner::pump`] — latch doorbells,
//! step the engines, run the idle timer, service interrupts — and the same kernel-mode
//! scheduler; they differ only in who owns time and threads:
//!
//! - **Live** ([`System::live`]): real time from a monotonic clock; a firmware thread pumps in a
//!   busy loop while any engine is in F0 (a real engine's doorbell watcher never sleeps) and
//!   parks while every engine is in F1, until a connect wakes it; a kernel scheduler worker
//!   thread sleeps on a condition variable until a kernel-mode submission arrives. Dropping
//!   the [`System`] stops and joins both.
//! - **Sim** ([`System::sim`]): a virtual clock that moves only when the test says so
//!   ([`System::advance`]) or when a blocked wait has nothing left to do but let time pass.
//!   A wait with no timeout that sees no progress for 60 s of virtual time is a deadlock: it
//!   returns timed out instead of spinning forever.
//!   Nothing runs unless [`System::step`] (or a blocking wait) runs it, so every interleaving
//!   is reproducible.
//!
//! A client opens a process with [`System::open_process`] and gets a [`ProcessPort`], the
//! [`abi::port::KernelPort`] implementation a `umd::Device` runs on.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use abi::NativeFenceHandle;
use abi::port::{
    AdapterInfo, AllocationDesc, AllocationInfo, CreateDoorbell, DoorbellInfo, HwQueueDesc, HwQueueInfo, KernelError,
    KernelPort, QueueStatus, WaitOutcome,
};
use abi::port::{NativeFenceDesc, NativeFenceInfo, WaitMode};
use abi::{AllocationHandle, ContextHandle, DeviceHandle, DoorbellHandle, EngineId, HwQueueHandle, ProcessId};
use gpu::{Gpu, GpuConfig, PowerState, Time};
use parking_lot::Mutex;

use crate::kmd::{DeviceWaker, VirtualKmd};
use crate::os::{Clock, Os, OsStats, WaitStart};
use crate::trace::TraceEntry;

/// Real time since the system started.
pub struct RealClock {
    epoch: Instant,
}

impl Clock for RealClock {
    fn now(&self) -> Time {
        Time(self.epoch.elapsed().as_nanos() as u64)
    }
}

/// A virtual clock that only moves when told.
#[derive(Default)]
pub struct SimClock {
    now: AtomicU64,
}

impl Clock for SimClock {
    fn now(&self) -> Time {
        // Relaxed: the clock is only read and written by the thread driving the simulation.
        Time(self.now.load(Ordering::Relaxed))
    }
}

impl SimClock {
    fn set(&self, t: Time) {
        self.now.fetch_max(t.0, Ordering::Relaxed);
    }
}

/// Configuration of an embedded system.
#[derive(Clone, Debug, Default)]
pub struct SystemConfig {
    /// The device.
    pub gpu: GpuConfig,
    /// Doorbells report `ConnectedNotify` (the UMD then calls `NotifyWorkSubmission`).
    pub notify_on_submit: bool,
    /// Which submission models the device offers (amdgpu's `user_queue`: 0, 1 or 2).
    pub user_queue_mode: abi::port::UserQueueMode,
    /// Dedicated doorbells virtualized over a pool of this many physical doorbells (`None`:
    /// one per queue index in each process's page). Refused with the global doorbell model
    /// (`gpu.doorbell_model`), which has nothing to virtualize.
    pub doorbell_pool: Option<u32>,
    /// The device enters D3 by itself once every engine has been in F1 this long (`None`:
    /// only on request, [`System::enter_d3`]).
    pub d3_idle: Option<Duration>,
    /// The adapter has no native fences (spec 002's iGPU in scenarios 2a and 2b): only
    /// monitored fences (`LegacyMonitored`), and a cross-adapter fence opens as one. It then
    /// takes kernel-mode queues only (`user_queue_mode` must be `KernelOnly`): user-mode
    /// queues cannot wait on monitored fences.
    pub without_native_fences: bool,
}

enum Driver {
    Live { stop: Arc<AtomicBool>, threads: Mutex<Vec<JoinHandle<()>>>, fw_thread: Arc<ThreadWaker> },
    Sim { world: Arc<SimWorld> },
}

/// The deterministic driver's world: one virtual clock and every adapter that shares it (one
/// for a [`System`], several for a [`Machine`]). A step of the world steps every adapter, so a
/// wait on one adapter sees the signals of the others.
#[derive(Default)]
pub(crate) struct SimWorld {
    clock: Arc<SimClock>,
    members: Mutex<Vec<std::sync::Weak<Inner>>>,
}

impl SimWorld {
    fn members(&self) -> Vec<Arc<Inner>> {
        self.members.lock().iter().filter_map(std::sync::Weak::upgrade).collect()
    }

    /// One step of every adapter (each one's device pump, then its kernel scheduler).
    /// Returns whether anything happened anywhere.
    fn step(&self) -> bool {
        let mut any = false;
        for m in self.members() {
            let p = m.pump();
            any |= p.work || m.os.run_scheduler().moved;
        }
        any
    }

    /// Steps until nothing happens without time passing. Bounded, in case a queue spins (a
    /// `WAIT` that is never satisfied keeps it runnable).
    fn settle(&self) {
        for _ in 0..100_000 {
            if !self.step() {
                return;
            }
        }
    }

    /// The earliest timer of any adapter (engine idle, D3 idle).
    fn next_timer(&self) -> Option<Time> {
        self.members().iter().flat_map(|m| [m.gpu.lock().poll_timeout(), m.os.poll_idle_timeout()]).flatten().min()
    }
}

/// Unparks the firmware thread.
#[derive(Default)]
struct ThreadWaker {
    thread: Mutex<Option<std::thread::Thread>>,
}

impl DeviceWaker for ThreadWaker {
    fn wake(&self) {
        if let Some(t) = self.thread.lock().as_ref() {
            t.unpark();
        }
    }
}

struct Inner {
    os: Os,
    gpu: Arc<Mutex<Gpu>>,
    clock: Arc<dyn Clock>,
    driver: Driver,
}

/// What one pump did.
#[derive(Clone, Copy, Debug, Default)]
struct Pump {
    work: bool,
    asleep: bool,
}

impl Inner {
    /// One turn of the device: latch doorbells, step engines, idle timer, interrupts.
    fn pump(&self) -> Pump {
        let mut irqs = Vec::new();
        let (report, asleep) = {
            let mut g = self.gpu.lock();
            let rang = g.poll_doorbells();
            // Timestamps read the clock as they execute (after the doorbell was latched).
            let clock = || self.clock.now();
            let report = g.step_with_clock(&clock);
            // The idle timer, only when due.
            let now = self.clock.now();
            if g.poll_timeout().is_some_and(|t| now >= t) {
                g.handle_timeout(now);
            }
            while let Some(i) = g.poll_interrupt() {
                irqs.push(i);
            }
            let _ = rang;
            (report, g.all_asleep())
        };
        // Progress only: a queue blocked in a WAIT re-checks every pump but moves nothing.
        let work = report.packets > 0 || report.instructions > 0 || !irqs.is_empty();
        for i in irqs {
            self.os.handle_interrupt(i);
        }
        self.os.handle_idle(asleep, self.clock.now());
        Pump { work, asleep }
    }

    fn block(&self, waiter: &crate::os::Waiter, timeout: Option<Duration>) {
        match &self.driver {
            Driver::Live { .. } => waiter.block_until(timeout.map(|t| Instant::now() + t)),
            Driver::Sim { world } => {
                let clock = &world.clock;
                // With no timeout, give up once virtual time has moved this far without any
                // progress: nothing in the system can satisfy the wait (a deadlock).
                const DEADLOCK_HORIZON: Duration = Duration::from_secs(60);
                let deadline = timeout.map(|t| clock.now().plus(t));
                let mut stalled_since = clock.now();
                loop {
                    if waiter.is_done() {
                        return;
                    }
                    if world.step() {
                        stalled_since = clock.now();
                        continue;
                    }
                    if deadline.is_none() && clock.now().since(stalled_since) >= DEADLOCK_HORIZON {
                        return;
                    }
                    // Nothing moves without time: jump to the next timer or the deadline.
                    let horizon = stalled_since.plus(DEADLOCK_HORIZON);
                    let next =
                        [world.next_timer(), deadline, Some(horizon)].into_iter().flatten().min().unwrap_or(horizon);
                    if deadline.is_some_and(|d| clock.now() >= d) {
                        return;
                    }
                    clock.set(next.max(Time(clock.now().0 + 1)));
                }
            }
        }
    }
}

/// How a process ends (spec 000 "Normal and abnormal process termination").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Termination {
    /// Disconnect each doorbell, wait for each queue's last-queued progress value, then
    /// destroy. A wait that does not finish within 5 s (the spec's DDI budget) turns the rest
    /// into an abnormal termination.
    Normal,
    /// Mark the device in error, suspend every context, disconnect, destroy without waiting.
    Abnormal,
}

/// How long a normal termination waits for a process's queued work.
const TERMINATION_BUDGET: Duration = Duration::from_secs(5);

impl Inner {
    fn terminate(&self, pid: ProcessId, how: Termination) {
        if how == Termination::Normal {
            let Ok(queues) = self.os.begin_normal_termination(pid) else { return };
            let deadline = Instant::now() + TERMINATION_BUDGET;
            for (q, value) in queues {
                let left = deadline.saturating_duration_since(Instant::now());
                let reached = match self.os.begin_wait(pid, q, value) {
                    WaitStart::Done(r) => matches!(r, Ok(WaitOutcome::Reached(_))),
                    WaitStart::Blocked(w) => {
                        self.block(&w, Some(if self.is_sim() { TERMINATION_BUDGET } else { left }));
                        matches!(self.os.end_wait(pid, q, &w), Ok(WaitOutcome::Reached(_)))
                    }
                };
                if !reached {
                    // Hung, lost, or out of time: end it abnormally.
                    let _ = self.os.begin_abnormal_termination(pid);
                    break;
                }
            }
        } else {
            let _ = self.os.begin_abnormal_termination(pid);
        }
        self.os.finish_termination(pid);
    }

    fn is_sim(&self) -> bool {
        matches!(self.driver, Driver::Sim { .. })
    }
}

/// An embedded system. Cheap to clone.
#[derive(Clone)]
pub struct System {
    inner: Arc<Inner>,
}

impl System {
    fn build(
        cfg: SystemConfig,
        clock: Arc<dyn Clock>,
        waker: Arc<dyn DeviceWaker>,
        driver: Driver,
    ) -> Result<System, KernelError> {
        if cfg.without_native_fences && cfg.user_queue_mode != abi::port::UserQueueMode::KernelOnly {
            // Spec 002: "user-mode queues can't support monitored fences".
            return Err(KernelError::InvalidArgument {
                field: "user_queue_mode",
                value: format!("{:?}", cfg.user_queue_mode),
                reason: "an adapter without native fences takes kernel-mode queues only (KernelOnly)".into(),
            });
        }
        let gpu = Gpu::new(cfg.gpu).map_err(|e| KernelError::InvalidArgument {
            field: "gpu",
            value: String::new(),
            reason: e.to_string(),
        })?;
        let gpu = Arc::new(Mutex::new(gpu));
        let mut kmd = VirtualKmd::new(gpu.clone(), waker);
        kmd.set_notify_on_submit(cfg.notify_on_submit);
        kmd.set_user_queue_mode(cfg.user_queue_mode);
        kmd.set_native_fences(!cfg.without_native_fences);
        if let Some(n) = cfg.doorbell_pool
            && !kmd.set_doorbell_pool(n)
        {
            return Err(KernelError::InvalidArgument {
                field: "doorbell_pool",
                value: n.to_string(),
                reason: "the device's doorbell model is global: there are no dedicated doorbells to pool".into(),
            });
        }
        let mut os = Os::new(Box::new(kmd), clock.clone())?;
        os.set_d3_idle(cfg.d3_idle);
        Ok(System { inner: Arc::new(Inner { os, gpu, clock, driver }) })
    }

    /// A deterministic system on a virtual clock starting at 0.
    pub fn sim(cfg: SystemConfig) -> Result<System, KernelError> {
        Self::sim_in(cfg, Arc::new(SimWorld::default()))
    }

    /// A deterministic system joining `world` (its clock, and its steps).
    fn sim_in(cfg: SystemConfig, world: Arc<SimWorld>) -> Result<System, KernelError> {
        let sys = Self::build(
            cfg,
            world.clock.clone(),
            Arc::new(ThreadWaker::default()),
            Driver::Sim { world: world.clone() },
        )?;
        world.members.lock().push(Arc::downgrade(&sys.inner));
        Ok(sys)
    }

    /// A live system: starts the firmware thread and the kernel scheduler worker.
    pub fn live(cfg: SystemConfig) -> Result<System, KernelError> {
        let clock: Arc<dyn Clock> = Arc::new(RealClock { epoch: Instant::now() });
        let waker = Arc::new(ThreadWaker::default());
        let stop = Arc::new(AtomicBool::new(false));
        let sys = Self::build(
            cfg,
            clock,
            waker.clone(),
            Driver::Live { stop: stop.clone(), threads: Mutex::new(Vec::new()), fw_thread: waker.clone() },
        )?;
        let spawn = |name: &str, body: fn(std::sync::Weak<Inner>, Arc<AtomicBool>)| {
            let (inner, stop) = (Arc::downgrade(&sys.inner), stop.clone());
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || body(inner, stop))
                .map_err(|e| KernelError::Exhausted { what: "threads", detail: e.to_string() })
        };
        let fw = spawn("doorbell-firmware", firmware_thread)?;
        *waker.thread.lock() = Some(fw.thread().clone());
        let worker = spawn("doorbell-km-scheduler", scheduler_thread)?;
        if let Driver::Live { threads, .. } = &sys.inner.driver {
            threads.lock().extend([fw, worker]);
        }
        Ok(sys)
    }

    /// Opens a client process and returns its kernel port.
    pub fn open_process(&self) -> Result<Arc<ProcessPort>, KernelError> {
        let pid = self.inner.os.create_process()?;
        Ok(Arc::new(ProcessPort { inner: self.inner.clone(), pid }))
    }

    /// Device time now.
    pub fn now(&self) -> Time {
        self.inner.clock.now()
    }

    /// The kernel's trace and how many entries were dropped.
    pub fn trace(&self) -> (Vec<TraceEntry>, u64) {
        self.inner.os.trace()
    }

    /// Kernel counters.
    pub fn stats(&self) -> OsStats {
        self.inner.os.stats()
    }

    /// An engine's power state.
    pub fn power(&self, engine: EngineId) -> PowerState {
        self.inner.os.power(engine)
    }

    /// Whether this is the deterministic driver.
    pub fn is_sim(&self) -> bool {
        matches!(self.inner.driver, Driver::Sim { .. })
    }

    /// Sim: one step of the world (device pump, then the kernel scheduler). Returns whether
    /// anything happened. On a live system it does nothing and returns `false`.
    pub fn step(&self) -> bool {
        match &self.inner.driver {
            Driver::Sim { world } => world.step(),
            Driver::Live { .. } => false,
        }
    }

    /// Sim: steps until nothing more happens at the current time.
    pub fn settle(&self) {
        if let Driver::Sim { world } = &self.inner.driver {
            world.settle();
        }
    }

    /// Sim: moves the virtual clock forward by `d`, then settles.
    pub fn advance(&self, d: Duration) {
        if let Driver::Sim { world } = &self.inner.driver {
            world.clock.set(world.clock.now().plus(d));
            world.settle();
        }
    }

    /// Starts a CPU wait on native fences without blocking (for tools and tests that drive
    /// several actors from one thread): `None` if it is already satisfied, otherwise the
    /// waiter to poll ([`crate::os::Waiter::is_done`]) and to hand to
    /// [`System::end_fence_wait`].
    pub fn begin_fence_wait(
        &self,
        pid: ProcessId,
        fences: &[(NativeFenceHandle, u64)],
        mode: WaitMode,
    ) -> Result<Option<Arc<crate::os::Waiter>>, KernelError> {
        match self.inner.os.begin_fence_wait(pid, fences, mode) {
            WaitStart::Done(r) => r.map(|_| None),
            WaitStart::Blocked(w) => Ok(Some(w)),
        }
    }

    /// Ends a wait [`System::begin_fence_wait`] started: deregisters it and reports.
    pub fn end_fence_wait(&self, pid: ProcessId, w: &Arc<crate::os::Waiter>) -> Result<WaitOutcome, KernelError> {
        self.inner.os.end_fence_wait(pid, w)
    }

    /// Reads a user-mode queue's fence log (entries written after `since`); see
    /// [`crate::os::Os::read_fence_log`]. For tools and tests: clients cannot read their logs.
    pub fn read_fence_log(
        &self,
        pid: ProcessId,
        queue: HwQueueHandle,
        kind: abi::fence_log::FenceLogType,
        since: u64,
    ) -> Result<abi::fence_log::LogRead, KernelError> {
        self.inner.os.read_fence_log(pid, queue, kind, since)
    }

    /// Puts the device in D3 (see [`crate::os::Os::enter_d3`]).
    pub fn enter_d3(&self) -> Result<(), KernelError> {
        self.inner.os.enter_d3()
    }

    /// Whether the device is in D3.
    pub fn in_d3(&self) -> bool {
        self.inner.os.in_d3()
    }

    /// Suspends a context (see [`crate::os::Os::suspend_context`]).
    pub fn suspend_context(&self, pid: ProcessId, context: ContextHandle) -> Result<(), KernelError> {
        self.inner.os.suspend_context(pid, context)
    }

    /// Resumes a context (see [`crate::os::Os::resume_context`]).
    pub fn resume_context(&self, pid: ProcessId, context: ContextHandle) -> Result<(), KernelError> {
        self.inner.os.resume_context(pid, context)
    }

    /// Ends a process, normally or abnormally. Ending one twice is a no-op.
    pub fn terminate(&self, pid: ProcessId, how: Termination) {
        self.inner.terminate(pid, how)
    }

    /// Marks a process's device in error (see [`crate::os::Os::mark_device_error`]); the
    /// lifecycle and recovery work (abnormal termination, TDR) will call it.
    pub fn mark_device_error(&self, pid: ProcessId, device: DeviceHandle) -> Result<(), KernelError> {
        self.inner.os.mark_device_error(pid, device)
    }

    /// Direct access to the device, for tests and tools that inspect it.
    pub fn with_gpu<T>(&self, f: impl FnOnce(&mut Gpu) -> T) -> T {
        f(&mut self.inner.gpu.lock())
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Driver::Live { stop, threads, fw_thread } = &self.driver {
            stop.store(true, Ordering::Release);
            fw_thread.wake();
            self.os.kick_scheduler();
            let me = std::thread::current().id();
            for t in threads.lock().drain(..) {
                if t.thread().id() != me {
                    let _ = t.join();
                }
            }
        }
    }
}

fn firmware_thread(inner: std::sync::Weak<Inner>, stop: Arc<AtomicBool>) {
    let mut idle_spins = 0u32;
    // Acquire: pairs with the release store in `Drop for Inner`.
    while !stop.load(Ordering::Acquire) {
        let Some(sys) = inner.upgrade() else { return };
        let p = sys.pump();
        drop(sys);
        if p.asleep {
            // Every engine is in F1: sleep until a connect wakes us (an unpark that comes
            // first makes this return at once, so the wake-up cannot be lost).
            std::thread::park_timeout(Duration::from_millis(100));
            idle_spins = 0;
        } else if p.work {
            idle_spins = 0;
        } else {
            idle_spins = idle_spins.saturating_add(1);
            if idle_spins.is_multiple_of(64) {
                // Let the other threads of a 2-core machine in now and then.
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

fn scheduler_thread(inner: std::sync::Weak<Inner>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Acquire) {
        let Some(sys) = inner.upgrade() else { return };
        let pass = sys.os.run_scheduler();
        if !pass.moved {
            // Ring space frees without a notification: poll soon. Otherwise sleep until new
            // work (a submission, or a fence a held-back submission waits on).
            let timeout = if pass.ring_full { Duration::from_micros(50) } else { Duration::from_millis(50) };
            sys.os.wait_for_km_work(pass.generation, timeout);
        }
    }
}

/// One client process's kernel port.
pub struct ProcessPort {
    inner: Arc<Inner>,
    pid: ProcessId,
}

impl ProcessPort {
    /// Ends the process now, normally or abnormally. Its queues, doorbells, fences and
    /// memory are destroyed and every pool gets its resources back.
    pub fn terminate(&self, how: Termination) {
        self.inner.terminate(self.pid, how);
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
        self.inner.os.adapter_info()
    }
    fn create_device(&self) -> Result<DeviceHandle, KernelError> {
        self.inner.os.create_device(self.pid)
    }
    fn destroy_device(&self, device: DeviceHandle) -> Result<(), KernelError> {
        self.inner.os.destroy_device(self.pid, device)
    }
    fn allocate(&self, device: DeviceHandle, desc: &AllocationDesc) -> Result<AllocationInfo, KernelError> {
        self.inner.os.allocate(self.pid, device, desc)
    }
    fn map_allocation(&self, allocation: AllocationHandle) -> Result<shm::Mapping, KernelError> {
        self.inner.os.map_allocation(self.pid, allocation)
    }
    fn free(&self, allocation: AllocationHandle) -> Result<(), KernelError> {
        self.inner.os.free(self.pid, allocation)
    }
    fn create_context(&self, device: DeviceHandle, engine: EngineId) -> Result<ContextHandle, KernelError> {
        self.inner.os.create_context(self.pid, device, engine)
    }
    fn destroy_context(&self, context: ContextHandle) -> Result<(), KernelError> {
        self.inner.os.destroy_context(self.pid, context)
    }
    fn create_hw_queue(&self, context: ContextHandle, desc: &HwQueueDesc) -> Result<HwQueueInfo, KernelError> {
        self.inner.os.create_hw_queue(self.pid, context, desc)
    }
    fn destroy_hw_queue(&self, queue: HwQueueHandle) -> Result<(), KernelError> {
        self.inner.os.destroy_hw_queue(self.pid, queue)
    }
    fn create_doorbell(&self, args: &CreateDoorbell) -> Result<DoorbellInfo, KernelError> {
        self.inner.os.create_doorbell(self.pid, args)
    }
    fn connect_doorbell(&self, queue: HwQueueHandle) -> Result<(), KernelError> {
        self.inner.os.connect_doorbell(self.pid, queue)
    }
    fn destroy_doorbell(&self, doorbell: DoorbellHandle) -> Result<(), KernelError> {
        self.inner.os.destroy_doorbell(self.pid, doorbell)
    }
    fn notify_work_submission(&self, doorbell: DoorbellHandle) -> Result<(), KernelError> {
        self.inner.os.notify_work_submission(self.pid, doorbell)
    }
    fn submit_command(&self, queue: HwQueueHandle, words: &[u32]) -> Result<(), KernelError> {
        self.inner.os.submit_command(self.pid, queue, words)
    }
    fn wait_progress(
        &self,
        queue: HwQueueHandle,
        value: u64,
        timeout: Option<Duration>,
    ) -> Result<WaitOutcome, KernelError> {
        match self.inner.os.begin_wait(self.pid, queue, value) {
            WaitStart::Done(r) => r,
            WaitStart::Blocked(w) => {
                self.inner.block(&w, timeout);
                self.inner.os.end_wait(self.pid, queue, &w)
            }
        }
    }
    fn query_queue(&self, queue: HwQueueHandle) -> Result<QueueStatus, KernelError> {
        self.inner.os.query_queue(self.pid, queue)
    }
    fn create_native_fence(
        &self,
        device: DeviceHandle,
        desc: &NativeFenceDesc,
    ) -> Result<NativeFenceInfo, KernelError> {
        self.inner.os.create_native_fence(self.pid, device, desc)
    }
    fn open_native_fence(&self, device: DeviceHandle, global: u64) -> Result<NativeFenceInfo, KernelError> {
        self.inner.os.open_native_fence(self.pid, device, global)
    }
    fn open_cross_adapter_fence(&self, device: DeviceHandle, handle: u64) -> Result<NativeFenceInfo, KernelError> {
        self.inner.os.open_cross_adapter_fence(self.pid, device, handle)
    }
    fn destroy_native_fence(&self, fence: NativeFenceHandle) -> Result<(), KernelError> {
        self.inner.os.destroy_native_fence(self.pid, fence)
    }
    fn signal_native_fence(&self, fence: NativeFenceHandle, value: u64) -> Result<(), KernelError> {
        self.inner.os.signal_native_fence(self.pid, fence, value)
    }
    fn wait_native_fences(
        &self,
        fences: &[(NativeFenceHandle, u64)],
        mode: WaitMode,
        timeout: Option<Duration>,
    ) -> Result<WaitOutcome, KernelError> {
        match self.inner.os.begin_fence_wait(self.pid, fences, mode) {
            WaitStart::Done(r) => r,
            WaitStart::Blocked(w) => {
                self.inner.block(&w, timeout);
                self.inner.os.end_fence_wait(self.pid, &w)
            }
        }
    }
}

impl crate::cross::Peer for Inner {
    fn notify_current_value(&self, local: u64) {
        self.os.notify_current_value(local);
    }
}

/// Several adapters in one kernel (spec 002 "Cross-adapter native fences"), say an iGPU and
/// a dGPU: each is a [`System`] (its own OS instance, KMD, GPU and driver), joined by the
/// cross-adapter fence layer ([`crate::cross`]). The deterministic machine runs every adapter
/// on one virtual clock, and a step (or a blocked wait) steps them all.
pub struct Machine {
    adapters: Vec<System>,
    cross: Arc<crate::cross::CrossAdapter>,
}

impl Machine {
    /// A deterministic machine with one adapter per config.
    pub fn sim(cfgs: &[SystemConfig]) -> Result<Machine, KernelError> {
        let world = Arc::new(SimWorld::default());
        Self::join(cfgs.iter().map(|c| System::sim_in(c.clone(), world.clone())).collect::<Result<_, _>>()?)
    }

    /// A live machine: each adapter with its own threads.
    pub fn live(cfgs: &[SystemConfig]) -> Result<Machine, KernelError> {
        Self::join(cfgs.iter().map(|c| System::live(c.clone())).collect::<Result<_, _>>()?)
    }

    fn join(adapters: Vec<System>) -> Result<Machine, KernelError> {
        let cross = Arc::new(crate::cross::CrossAdapter::default());
        for (i, a) in adapters.iter().enumerate() {
            let me = crate::cross::AdapterId(i as u32);
            let weak = Arc::downgrade(&a.inner);
            cross.attach(me, weak);
            a.inner.os.attach_cross(cross.clone(), me);
        }
        Ok(Machine { adapters, cross })
    }

    /// Adapter `i` (in config order).
    pub fn adapter(&self, i: usize) -> &System {
        &self.adapters[i]
    }

    /// The adapters.
    pub fn adapters(&self) -> &[System] {
        &self.adapters
    }

    /// Sim: steps every adapter until nothing more happens at the current time.
    pub fn settle(&self) {
        if let Some(a) = self.adapters.first() {
            a.settle();
        }
    }

    /// What the cross-adapter layer did, in order (bounded like [`System::trace`]), and how
    /// many older events were dropped.
    pub fn cross_trace(&self) -> (Vec<crate::cross::CrossEvent>, u64) {
        self.cross.trace()
    }
}
