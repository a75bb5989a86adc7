//! An embedded system: the kernel and the virtual GPU in this process, and the two drivers
//! that run them.
//!
//! One core, two drivers (BRIEF 4.1). Both call the same device pump (`driver::Inner::pump`) — latch doorbells,
//! step the engines, run the idle timer, service interrupts — and the same kernel-mode
//! scheduler; they differ only in who owns time and threads:
//!
//! - **Live** ([`System::live`]): real time from a monotonic clock; a firmware thread pumps in a
//!   busy loop while any engine is in F0 (a real engine's doorbell watcher never sleeps) and
//!   parks while every engine is in F1, until a connect wakes it; a kernel scheduler worker
//!   thread sleeps on a condition variable until a kernel-mode submission arrives. Dropping
//!   the [`System`] stops and joins both.
//! - **Sim** ([`System::sim`]): a virtual clock, and **device time**: every packet, dispatch
//!   slice and copy chunk occupies its engine for a modelled duration ([`gpu::cost`], with
//!   [`gpu::Timing::Modelled`]), and the clock moves from event to event — an engine
//!   finishing its work, a device or kernel timer, a wait's timeout — whichever comes first.
//!   So time passes beside a busy engine: a timed wait returns at its deadline next to an
//!   endless kernel, and a normal termination runs out its budget. Time moves only when a
//!   test says so ([`System::settle`] runs until the engines have no work,
//!   [`System::run_for`] runs every event for a bounded span) or when a blocked wait has
//!   nothing left to do but let time pass. A wait with no timeout that is not decided within
//!   60 s of virtual time is a deadlock: it returns timed out instead of spinning forever.
//!   Nothing runs unless a step (or a blocking wait) runs it, so every interleaving is
//!   reproducible.
//!
//! A client opens a process with [`System::open_process`] and gets a [`ProcessPort`], the
//! [`abi::port::KernelPort`] implementation a `umd::Device` runs on.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use abi::NativeFenceHandle;
use abi::port::{Invalid, KernelError, WaitMode, WaitOutcome};
use abi::{ContextHandle, DeviceHandle, EngineId, HwQueueHandle, PowerState, ProcessId, Time};
use gpu::{Gpu, GpuConfig};
use parking_lot::Mutex;

use crate::ddi::DdiFault;
use crate::os::{Census, Os, OsStats, WaitId, WaitStart};
use crate::trace::{SharedTrace, TraceEntry};
use crate::virtual_kmd::{InterruptLine, VirtualKmd};

mod driver;
mod machine;
mod port;

use driver::{Clock, Driver, Inner, RealClock, SimWorld, ThreadWaker};
pub use machine::Machine;
pub use port::ProcessPort;

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
    /// Which doorbell the pool victimizes when it is full (least recently rung by default;
    /// least recently connected for comparison). Used only with `doorbell_pool`.
    pub victim_policy: crate::virtual_kmd::VictimPolicy,
    /// Timeout detection and recovery (`TdrDelay`, `TdrLimitCount`, `TdrLimitTime`, engine
    /// reset); refused at construction if out of range.
    pub tdr: crate::os::TdrConfig,
    /// The device enters D3 by itself once every engine has been in F1 this long (`None`:
    /// only on request, [`System::enter_d3`]).
    pub d3_idle: Option<Duration>,
    /// The adapter has no native fences (spec 002's iGPU in scenarios 2a and 2b): only
    /// monitored fences (`LegacyMonitored`), and a cross-adapter fence opens as one. It then
    /// takes kernel-mode queues only (`user_queue_mode` must be `KernelOnly`): user-mode
    /// queues cannot wait on monitored fences.
    pub without_native_fences: bool,
    /// The OS has not enabled `DXGK_FEATURE_NATIVE_FENCE` (spec 002): a correct KMD then
    /// advertises no native fences (so, like `without_native_fences`, only kernel-mode queues).
    pub os_disables_native_fences: bool,
    /// A deliberately wrong KMD, for tests: it advertises native fences without asking the
    /// OS, so adapter initialization fails with `FeatureMismatch` when the OS disabled them.
    pub kmd_ignores_feature_query: bool,
    /// The KMD reports `MapToGpuSystemProcess`: every fence is also mapped into the GPU system
    /// process, and its VAs there are passed to `DxgkDdiCreateNativeFence`.
    pub map_fences_to_system_process: bool,
    /// Deterministic driver only: how long an interrupt takes from the device raising it (at
    /// its modelled time) to the kernel's interrupt service routine (the cost model's
    /// interrupt delivery; 0 by default). The live driver's is whatever it takes.
    pub interrupt_delivery: Duration,
    /// The doorbell size the KMD reports (`DXGK_USERMODESUBMISSION_CAPS`), for tests of the
    /// OS's checks; `None`: the device's own (8 bytes).
    pub kmd_doorbell_bytes: Option<u64>,
}

impl SystemConfig {
    /// How many client processes this system can hold at once: each takes a doorbell page of
    /// its own (two with an aggregated doorbell, spec 001), page 0 is the kernel queues', and
    /// a doorbell pool's pages are the KMD's. A process past it is refused with
    /// `KernelError::Exhausted` naming the doorbell pages; tools (the simulator) check a
    /// scenario against it before anything runs.
    pub fn max_processes(&self) -> u32 {
        let pages = self.gpu.doorbell_pages;
        let pool = match (self.doorbell_pool, self.gpu.doorbell_model) {
            // As `VirtualKmd::set_doorbell_pool` keeps them: page 0 and one process page stay.
            (Some(n), abi::doorbell::DoorbellModel::Dedicated) => n.clamp(1, pages.saturating_sub(2).max(1)),
            _ => 0,
        };
        let per_process = 1 + u32::from(self.gpu.misses_unmapped_doorbells);
        pages.saturating_sub(1 + pool) / per_process
    }
}

/// How a process ends (spec 000 "Normal and abnormal process termination").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Termination {
    /// Disconnect each doorbell, wait for each queue's last-queued progress value, then
    /// destroy. Waits that do not finish within 5 s of device time in all (the spec's DDI
    /// budget) turn the rest into an abnormal termination.
    Normal,
    /// Mark the device in error, suspend every context (the KMD preempts its queues),
    /// disconnect, wait for the preemption answers still owed (TDR recovers a queue that never
    /// answers), then destroy.
    Abnormal,
}

/// How long a normal termination waits for a process's queued work.
const TERMINATION_BUDGET: Duration = Duration::from_secs(5);

impl Inner {
    fn terminate(&self, pid: ProcessId, how: Termination) {
        if how == Termination::Normal {
            let Ok(queues) = self.call_as(pid, |os, now| os.begin_normal_termination(pid, now)) else { return };
            // One budget for all the waits, on the device clock (real or virtual).
            let deadline = self.clock.now().plus(TERMINATION_BUDGET);
            for (q, value) in queues {
                let left = deadline.since(self.clock.now());
                let reached = match self.call_as(pid, |os, now| os.begin_wait(pid, q, value, now)) {
                    Ok(WaitStart::Done(r)) => matches!(r, Ok(WaitOutcome::Reached(_))),
                    Ok(WaitStart::Blocked(w)) => {
                        self.block(w, Some(left));
                        matches!(self.call(|os, now| os.end_wait(pid, q, w, now)), Ok(WaitOutcome::Reached(_)))
                    }
                    Err(_) => false,
                };
                self.call(|os, now| os.termination_wait_done(q, reached, now));
                if !reached {
                    // Hung, lost, or out of time: end it abnormally.
                    self.end_abnormally(pid);
                    break;
                }
            }
        } else {
            self.end_abnormally(pid);
        }
        self.call(|os, now| os.finish_termination(pid, now));
    }

    /// Abnormal termination's first part: the device marked in error, every context
    /// suspended (the KMD preempts its queues), every doorbell disconnected; then the wait for
    /// the preemption answers still owed, so that nothing is destroyed while the hardware may
    /// still run it. A queue that never answers is recovered by TDR meanwhile, which ends the
    /// wait too.
    fn end_abnormally(&self, pid: ProcessId) {
        let _ = self.call_as(pid, |os, now| os.begin_abnormal_termination(pid, now));
        let (start, bound) = self.call(|os, now| (os.begin_preemption_wait(pid, now), os.preemption_wait_bound()));
        if let WaitStart::Blocked(w) = start {
            self.block(w, Some(bound));
            self.call(|os, now| os.end_preemption_wait(w, now));
        }
    }
}

/// A CPU wait on native fences started without blocking ([`System::begin_fence_wait`]).
pub struct FenceWaitHandle {
    id: WaitId,
    inner: Arc<Inner>,
}

impl FenceWaitHandle {
    /// Whether the wait has been decided.
    pub fn is_done(&self) -> bool {
        self.inner.os.lock().wait_done(self.id)
    }

    /// The wait's result once decided (`None` before), left for [`System::end_fence_wait`]
    /// to collect: what a checker reads to tell when the kernel woke the waiter.
    pub fn result(&self) -> Option<Result<WaitOutcome, KernelError>> {
        self.inner.os.lock().fence_wait_result(self.id)
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
        waker: Arc<ThreadWaker>,
        driver: Driver,
    ) -> Result<System, KernelError> {
        cfg.gpu.validate().map_err(|e| KernelError::InvalidArgument {
            field: e.field,
            value: e.value,
            reason: abi::port::Invalid::OutOfRange { expected: e.expected },
        })?;
        let gpu = Gpu::new(cfg.gpu).map_err(crate::virtual_kmd::refused("gpu", ""))?;
        let gpu = Arc::new(Mutex::new(gpu));
        let line = match driver {
            Driver::Sim { .. } => InterruptLine::modelled(cfg.interrupt_delivery),
            Driver::Live { .. } => InterruptLine::default(),
        };
        let mut kmd = VirtualKmd::new(gpu.clone(), waker, line.clone());
        kmd.set_notify_on_submit(cfg.notify_on_submit);
        let device_clock = clock.clone();
        kmd.set_clock(Arc::new(move || device_clock.now()));
        kmd.set_user_queue_mode(cfg.user_queue_mode);
        kmd.set_native_fences(!cfg.without_native_fences);
        kmd.set_ignores_feature_query(cfg.kmd_ignores_feature_query);
        kmd.set_map_to_system_process(cfg.map_fences_to_system_process);
        if let Some(b) = cfg.kmd_doorbell_bytes {
            kmd.set_reported_doorbell_bytes(b);
        }
        if let Some(n) = cfg.doorbell_pool
            && !kmd.set_doorbell_pool(n, cfg.victim_policy)
        {
            return Err(KernelError::InvalidArgument {
                field: "doorbell_pool",
                value: n.to_string(),
                reason: Invalid::NothingToPool,
            });
        }
        let trace = SharedTrace::default();
        let features = abi::port::OsFeatures { native_fence: !cfg.os_disables_native_fences };
        let mut os = Os::with_features(Box::new(kmd), trace.clone(), features)?;
        if !os.adapter_info().native_fences && cfg.user_queue_mode != abi::port::UserQueueMode::KernelOnly {
            // Spec 002: "user-mode queues can't support monitored fences".
            return Err(KernelError::InvalidArgument {
                field: "user_queue_mode",
                value: format!("{:?}", cfg.user_queue_mode),
                reason: Invalid::NeedsKernelOnly,
            });
        }
        os.set_d3_idle(cfg.d3_idle);
        os.set_tdr(cfg.tdr)?;
        Ok(System { inner: Arc::new(Inner::new(os, trace, gpu, line, clock, driver)) })
    }

    /// A deterministic system on a virtual clock starting at 0, with device time
    /// (`cfg.gpu.timing` is set to [`gpu::Timing::Modelled`]; `cfg.gpu.cost` sets the costs).
    pub fn sim(cfg: SystemConfig) -> Result<System, KernelError> {
        Self::sim_in(cfg, Arc::new(SimWorld::default()))
    }

    /// A deterministic system joining `world` (its clock, and its steps).
    fn sim_in(mut cfg: SystemConfig, world: Arc<SimWorld>) -> Result<System, KernelError> {
        cfg.gpu.timing = gpu::Timing::Modelled;
        let sys = Self::build(
            cfg,
            world.clock.clone(),
            Arc::new(ThreadWaker::default()),
            Driver::Sim {
                world: world.clone(),
                completions_taken: AtomicU64::new(u64::MAX),
                signals_taken: AtomicU64::new(u64::MAX),
            },
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
        let fw = spawn("doorbell-firmware", driver::firmware_thread)?;
        *waker.thread.lock() = Some(fw.thread().clone());
        let worker = spawn("doorbell-km-scheduler", driver::scheduler_thread)?;
        if let Driver::Live { threads, .. } = &sys.inner.driver {
            threads.lock().extend([fw, worker]);
        }
        Ok(sys)
    }

    /// Opens a client process and returns its kernel port.
    pub fn open_process(&self) -> Result<Arc<ProcessPort>, KernelError> {
        let pid = self.inner.call(|os, now| os.create_process(now))?;
        Ok(Arc::new(ProcessPort { inner: self.inner.clone(), pid }))
    }

    /// Device time now.
    #[inline]
    pub fn now(&self) -> Time {
        match &self.inner.driver {
            Driver::Sim { world, .. } => world.clock.now(),
            Driver::Live { .. } => self.inner.clock.now(),
        }
    }

    /// The kernel's trace and how many entries were dropped.
    pub fn trace(&self) -> (Vec<TraceEntry>, u64) {
        self.inner.trace.snapshot()
    }

    /// The system calls the live firmware thread made on purpose: yields while idle, parks
    /// while every engine is in F1 (0 on the deterministic driver).
    pub fn firmware_thread_calls(&self) -> u64 {
        // Relaxed: a statistic.
        self.inner.fw_calls.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Kernel counters.
    pub fn stats(&self) -> OsStats {
        self.inner.os.lock().stats()
    }

    /// What the kernel holds: processes, objects, pool entries, GPU mappings, waits (for leak
    /// checks).
    pub fn census(&self) -> Census {
        self.inner.os.lock().census()
    }

    /// Breaks a rule of the spec on purpose from now on ([`crate::os::BrokenTwin`]): for the
    /// swarm's broken twins, which show that a checker catches the break.
    pub fn break_deliberately(&self, b: crate::os::BrokenTwin) {
        self.inner.os.lock().break_deliberately(b);
    }

    /// Fails a chosen DDI call on purpose (see [`crate::ddi::Traced`]), to test the kernel's
    /// error paths.
    pub fn inject_ddi_fault(&self, fault: DdiFault) {
        self.inner.os.lock().inject_ddi_fault(fault);
    }

    /// Makes the next call of a reset DDI misbehave (a bogus fence ID, a late answer), to
    /// test that the OS does not trust it.
    pub fn inject_misbehaviour(&self, ddi: crate::ddi::DdiKind, m: crate::ddi::Misbehaviour) {
        self.inner.os.lock().inject_misbehaviour(ddi, m);
    }

    /// An engine's power state.
    pub fn power(&self, engine: EngineId) -> PowerState {
        self.inner.os.lock().power(engine)
    }

    /// Whether this is the deterministic driver.
    pub fn is_sim(&self) -> bool {
        self.inner.is_sim()
    }

    /// Sim: one step of the world (device pump, then the kernel scheduler). Returns whether
    /// anything happened. On a live system it does nothing and returns `false`.
    pub fn step(&self) -> bool {
        match &self.inner.driver {
            Driver::Sim { world, .. } => world.step(),
            Driver::Live { .. } => false,
        }
    }

    /// Sim: runs until no engine has work left, letting device time pass only as far as the
    /// work takes (timers due before then fire in order; an idle system's timers are not
    /// reached). Bounded: beside an endless kernel use [`System::run_for`].
    pub fn settle(&self) {
        if let Driver::Sim { world, .. } = &self.inner.driver {
            world.settle();
        }
    }

    /// Sim: runs every event — engines finishing work, device and kernel timers — in time
    /// order for `d` of virtual time, whatever runs meanwhile (an endless kernel included),
    /// then settles at the end. On a live system it does nothing.
    pub fn run_for(&self, d: Duration) {
        if let Driver::Sim { world, .. } = &self.inner.driver {
            world.run_until(world.clock.now().plus(d));
        }
    }

    /// Sim: lets `d` of virtual time pass, running everything due meanwhile in order; the same
    /// as [`System::run_for`].
    pub fn advance(&self, d: Duration) {
        self.run_for(d)
    }

    /// Starts a CPU wait on native fences without blocking (for tools and tests that drive
    /// several actors from one thread): `None` if it is already satisfied, otherwise a handle
    /// to poll ([`FenceWaitHandle::is_done`]) and to hand to [`System::end_fence_wait`].
    pub fn begin_fence_wait(
        &self,
        pid: ProcessId,
        fences: &[(NativeFenceHandle, u64)],
        mode: WaitMode,
    ) -> Result<Option<FenceWaitHandle>, KernelError> {
        match self.inner.call_as(pid, |os, now| os.begin_fence_wait(pid, fences, mode, now))? {
            WaitStart::Done(r) => r.map(|_| None),
            WaitStart::Blocked(id) => Ok(Some(FenceWaitHandle { id, inner: self.inner.clone() })),
        }
    }

    /// Ends a wait [`System::begin_fence_wait`] started: deregisters it and reports.
    pub fn end_fence_wait(&self, pid: ProcessId, w: &FenceWaitHandle) -> Result<WaitOutcome, KernelError> {
        self.inner.call(|os, _| os.end_fence_wait(pid, w.id))
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
        self.inner.call_as(pid, |os, now| os.read_fence_log(pid, queue, kind, since, now))
    }

    /// The KMD's native fence caps, as the OS checked them at initialization.
    pub fn native_fence_caps(&self) -> abi::port::NativeFenceCaps {
        self.inner.os.lock().native_fence_caps()
    }

    /// A fence's CurrentValue and MonitoredValue VAs in the GPU system process (with
    /// `MapToGpuSystemProcess`).
    pub fn native_fence_system_vas(
        &self,
        pid: ProcessId,
        fence: NativeFenceHandle,
    ) -> Result<Option<(u64, u64)>, KernelError> {
        self.inner.os.lock().native_fence_system_vas(pid, fence)
    }

    /// Where a fence's CurrentValue and MonitoredValue live (the KMD's
    /// `D3DKMDT_FENCESTORAGESURFACEDATA`).
    pub fn native_fence_storage(
        &self,
        pid: ProcessId,
        fence: NativeFenceHandle,
    ) -> Result<(abi::port::MemoryDomain, abi::port::MemoryDomain), KernelError> {
        self.inner.os.lock().native_fence_storage(pid, fence)
    }

    /// Reads a word through the GPU system process's address space, as the CMP would.
    pub fn read_system_process_u64(&self, va: u64) -> Option<u64> {
        self.inner.os.lock().read_system_process_u64(va)
    }

    /// Recreates a queue's fence log (see [`crate::os::Os::recreate_fence_log`]).
    pub fn recreate_fence_log(
        &self,
        pid: ProcessId,
        queue: HwQueueHandle,
        kind: abi::fence_log::FenceLogType,
    ) -> Result<(), KernelError> {
        self.inner.call_as(pid, |os, now| os.recreate_fence_log(pid, queue, kind, now))
    }

    /// Turns fence-log tracing on or off (see [`crate::os::Os::set_fence_log_tracing`]): while
    /// it is on, every user-mode queue's logs are larger, so a tool reading them (`doorbell
    /// trace`) loses no event to an overrun.
    pub fn set_fence_log_tracing(&self, on: bool) -> Result<(), KernelError> {
        self.inner.call(|os, now| os.set_fence_log_tracing(on, now))
    }

    /// Test hook: the KMD raises notification `n` (as `DxgkCbNotifyInterrupt` would) and the
    /// OS services it at once — for interrupt forms the virtual device never raises by itself
    /// (a NULL fence array, a NULL queue in the optimized mode).
    pub fn inject_notification(&self, n: crate::ddi::Notification) {
        self.inner.call(|os, now| {
            os.inject_notification(n);
            os.handle_interrupts(now);
        });
    }

    /// Test hook: the device's next `count` native-fence interrupts are lost, as when the
    /// hardware collapses several into one the OS must recover from a NULL form.
    pub fn drop_fence_signals(&self, count: u32) {
        self.inner.os.lock().drop_fence_signals(count);
    }

    /// Puts the device in D3 (see [`crate::os::Os::enter_d3`]).
    pub fn enter_d3(&self) -> Result<(), KernelError> {
        self.inner.call(|os, now| os.enter_d3(now))
    }

    /// Whether the device is in D3.
    pub fn in_d3(&self) -> bool {
        self.inner.os.lock().in_d3()
    }

    /// Suspends a context (see [`crate::os::Os::suspend_context`]).
    pub fn suspend_context(&self, pid: ProcessId, context: ContextHandle) -> Result<(), KernelError> {
        self.inner.call_as(pid, |os, now| os.suspend_context(pid, context, now))
    }

    /// Resumes a context (see [`crate::os::Os::resume_context`]).
    pub fn resume_context(&self, pid: ProcessId, context: ContextHandle) -> Result<(), KernelError> {
        self.inner.call_as(pid, |os, now| os.resume_context(pid, context, now))
    }

    /// Ends a process, normally or abnormally. Ending one twice is a no-op.
    pub fn terminate(&self, pid: ProcessId, how: Termination) {
        self.inner.terminate(pid, how)
    }

    /// A process's device is lost (a device error): see [`crate::os::Os::device_lost`] — its
    /// fences AlwaysSignaled, its queues stopped and hung, its doorbells disconnected with
    /// `DisconnectedAbort`, its CPU waits failed with `DeviceLost`.
    pub fn mark_device_error(&self, pid: ProcessId, device: DeviceHandle) -> Result<(), KernelError> {
        self.inner.call_as(pid, |os, now| os.device_lost(pid, device, now))
    }

    /// Asks the engine to preempt queue `q` of process `pid` (see
    /// [`crate::os::Os::preempt_queue`]): the queue leaves its hardware slot at the next point
    /// its engine's preemption granularity allows, and stays off the run list until
    /// [`System::resume_queue`]. Returns the request's ticket; an unanswered request starts
    /// timeout detection and recovery after `TdrDelay`.
    pub fn preempt_queue(&self, pid: ProcessId, q: abi::HwQueueHandle) -> Result<u64, KernelError> {
        self.inner.call_as(pid, |os, now| os.preempt_queue(pid, q, now))
    }

    /// Makes kernel-mode queue `q` of process `pid` a paging queue, whose buffers stand for
    /// the kernel's own copy work (eviction, migration): a preemption resubmits them with
    /// their fence IDs, before any other buffer on their engine (spec 003). Only before the
    /// queue's first submission.
    pub fn set_paging_queue(&self, pid: ProcessId, q: abi::HwQueueHandle) -> Result<(), KernelError> {
        self.inner.call_as(pid, |os, _| os.set_paging_queue(pid, q))
    }

    /// The answer to preemption request `ticket`, once it came: its latency from the request
    /// to the engine's answer on the device clock (ns). Kept for the last 4096 answers.
    pub fn preempt_answer(&self, ticket: u64) -> Option<u64> {
        self.inner.os.lock().preempt_answer(ticket)
    }

    /// Moves an allocation of process `pid` to another memory domain in spec 001's order:
    /// its process's queues preempted, the move with a page-table update, the queues resumed
    /// (see [`crate::os::Os::migrate_allocation`]). Returns at once; the move completes when
    /// every queue has answered.
    pub fn migrate_allocation(
        &self,
        pid: ProcessId,
        allocation: abi::AllocationHandle,
        to: abi::port::MemoryDomain,
    ) -> Result<(), KernelError> {
        self.inner.call_as(pid, |os, now| os.migrate_allocation(pid, allocation, to, now))
    }

    /// Puts a queue preempted by [`System::preempt_queue`] back on the run list.
    pub fn resume_queue(&self, pid: ProcessId, q: abi::HwQueueHandle) -> Result<(), KernelError> {
        self.inner.call_as(pid, |os, now| os.resume_queue(pid, q, now))
    }

    /// A look at the device that changes nothing (a checker's query): unlike
    /// [`System::with_gpu`], it leaves the deterministic driver's knowledge of what the world
    /// does next alone.
    pub fn inspect_gpu<T>(&self, f: impl FnOnce(&Gpu) -> T) -> T {
        f(&self.inner.gpu.lock())
    }

    /// Direct access to the device, for tests and tools that inspect it.
    pub fn with_gpu<T>(&self, f: impl FnOnce(&mut Gpu) -> T) -> T {
        let r = f(&mut self.inner.gpu.lock());
        if let Driver::Sim { world, .. } = &self.inner.driver {
            world.changed();
        }
        r
    }

    /// Moves the completions the device recorded since the last call into `out`
    /// ([`Gpu::take_completions`]; [`Gpu::record_completions`] turns the recording on). Unlike
    /// a [`System::with_gpu`] that could do it, it tells the deterministic driver that nothing
    /// the device does next changed. On the deterministic driver, a call with no step since
    /// the last (nothing changed in the world) finds nothing new and leaves the device alone.
    #[inline]
    pub fn take_completions(&self, out: &mut Vec<gpu::Completion>) {
        if let Driver::Sim { world, completions_taken, .. } = &self.inner.driver
            && !Self::changed_since(world, completions_taken)
        {
            return;
        }
        self.take_recorded(out);
    }

    /// Moves the native-fence signals the device recorded since the last call into `out`
    /// ([`Gpu::take_fence_signals`]; [`Gpu::record_fence_signals`] turns the recording on), as
    /// [`System::take_completions`] moves completions: without telling the deterministic
    /// driver anything changed, and without a look at the device while nothing did.
    #[inline]
    pub fn take_fence_signals(&self, out: &mut Vec<gpu::FenceSignal>) {
        if let Driver::Sim { world, signals_taken, .. } = &self.inner.driver
            && !Self::changed_since(world, signals_taken)
        {
            return;
        }
        self.inner.gpu.lock().take_fence_signals(out);
    }

    /// Whether the world changed since `taken` was last set, which this sets.
    #[inline]
    fn changed_since(world: &SimWorld, taken: &AtomicU64) -> bool {
        // Relaxed: the deterministic driver's own state (one thread drives it).
        let changes = world.changes();
        if taken.load(Ordering::Relaxed) == changes {
            return false;
        }
        taken.store(changes, Ordering::Relaxed);
        true
    }

    /// [`System::take_completions`] from the device.
    fn take_recorded(&self, out: &mut Vec<gpu::Completion>) {
        self.inner.gpu.lock().take_completions(out);
    }

    /// The device's own number for queue `q` of process `pid` (see
    /// [`crate::ddi::Kmd::device_queue_id`]; the virtual GPU's [`gpu::FwQueueId::to_bits`]),
    /// so a tool reading [`gpu::Gpu::take_completions`] can tell whose they are.
    pub fn device_queue_id(&self, pid: ProcessId, q: HwQueueHandle) -> Result<Option<u64>, KernelError> {
        self.inner.call_as(pid, |os, _| os.device_queue_id(pid, q))
    }

    /// Sim: steps the world until nothing more happens at the current instant (no time
    /// passes). Returns the number of steps that did something. Live: does nothing.
    pub fn run_instant(&self) -> usize {
        match &self.inner.driver {
            Driver::Sim { world, .. } => world.settle_now(),
            Driver::Live { .. } => 0,
        }
    }

    /// Sim: [`System::run_instant`] for a driver that knows which queues its clients may have
    /// rung since the last step (`rang`: [`System::device_queue_id`]s of this adapter): the
    /// device looks at those queues' doorbells only, instead of every doorbell it watches
    /// (later steps of the instant look at all of them again only after the kernel-mode
    /// scheduler rang one of its own). A queue left out of `rang` is heard at the next full
    /// poll, so only a caller that runs every client itself may use it. Live: does nothing.
    #[inline]
    pub fn run_instant_after(&self, rang: &[u64]) -> usize {
        match &self.inner.driver {
            Driver::Sim { world, .. } => {
                // No client rang, in a quiet period: nothing to look at, nothing to step. (The
                // shared doorbell pages are looked at with the next ring, or when the period
                // ends: a ring latched anywhere in it waits for its end all the same.)
                if rang.is_empty() && world.quiet_until(world.clock.now()).is_some() {
                    return 0;
                }
                self.latch_and_settle(world, rang)
            }
            Driver::Live { .. } => 0,
        }
    }

    /// [`System::run_instant_after`] past its first question.
    fn latch_and_settle(&self, world: &SimWorld, rang: &[u64]) -> usize {
        // Latching a ring raises nothing and sets no timer: a world that waited for its busy
        // engines still does (the rings wait for the busy period's end).
        let mut g = self.inner.gpu.lock();
        g.poll_doorbells_of(rang.iter().map(|&b| gpu::FwQueueId::from_bits(b)));
        let now = world.clock.now();
        debug_assert!(
            world.quiet_until(now).is_none() || g.waits_for_busy_engines(now),
            "a latched ring ended a quiet period"
        );
        drop(g);
        // Still quiet (the usual case: a ring while the engines run earlier work): no step.
        if world.quiet_until(now).is_some() {
            return 0;
        }
        world.settle_now_from(false)
    }

    /// Sim: the end of the quiet period the world is known to be in now, if it is in one:
    /// every adapter waits for its busy engines (see [`System::run_instant_after`]), so until
    /// then, and as long as nothing enters the kernel, a step would change nothing and a
    /// latched ring keeps it so. Live: `None`.
    #[inline]
    pub fn quiet_until(&self) -> Option<Time> {
        match &self.inner.driver {
            Driver::Sim { world, .. } => world.quiet_until(world.clock.now()),
            Driver::Live { .. } => None,
        }
    }

    /// Sim: the time of the next event any adapter of the world waits for (an engine's
    /// modelled work ending, a device or kernel timer), if any. Live: `None`.
    #[inline]
    pub fn next_event(&self) -> Option<Time> {
        match &self.inner.driver {
            Driver::Sim { world, .. } => world.next_timer(),
            Driver::Live { .. } => None,
        }
    }

    /// Sim: tells the device when a client will next act (ring a doorbell), for a driver that
    /// steps event by event and knows its next event ([`gpu::Gpu::set_horizon`]): an engine's
    /// turns that a ring could cut into end at their first check past it, as on the live
    /// driver, instead of running as one piece past the ring. [`System::run_for`] sets its own
    /// target. Live: does nothing.
    #[inline]
    pub fn set_step_horizon(&self, at: Option<Time>) {
        if let Driver::Sim { world, .. } = &self.inner.driver {
            world.set_horizon(at);
        }
    }

    /// Sim: moves the virtual clock forward to `t` without running anything (a driver that
    /// steps event by event: [`System::next_event`], then [`System::run_instant`]). The clock
    /// never goes back: an earlier `t` leaves it where it is. Live: does nothing.
    #[inline]
    pub fn advance_to(&self, t: Time) {
        if let Driver::Sim { world, .. } = &self.inner.driver {
            world.clock.set(t);
        }
    }
}
