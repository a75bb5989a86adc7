//! The OS graphics kernel ("dxg") as a sans-IO state machine: processes, objects,
//! validation, doorbells, waits, power policy, the interrupt service routine and the
//! kernel-mode scheduler.
//!
//! This is the Dxgkrnl half of spec 000 and the amdgpu USERQ ioctl half of spec 001. It owns
//! every policy decision and reaches the device only through the DDIs of [`crate::ddi::Kmd`],
//! wrapped in the [`Traced`] decorator that logs each call. Like quinn-proto's `Connection`,
//! [`Os`] has no lock, no thread, no clock and never blocks: every input is a method taking
//! `&mut self` and `now`; what must happen outside it comes out of [`Os::poll_output`] (a CPU
//! wait completed, a cross-adapter fence to propagate, the kernel-mode scheduler has work),
//! and its timers (TDR, the hang timer's scan, the engine watchdog's look, the D3 idle timer:
//! one [`timers::TimerTable`]) come out of [`Os::poll_timeout`] and fire in
//! [`Os::handle_timeout`]. The drivers in [`crate::system`] own the lock, the condition
//! variables, the clock and the blocking; they mark each entry's time with [`Os::at`], so the
//! DDIs an entry calls are logged at its `now`.
//!
//! **State has owners.** [`Os`] is a short list of them, as quinn-proto's `Connection` holds
//! its `StreamsState`: each concern's state is a type of its own, in its own file, whose
//! methods take what every concern shares ([`shared::Shared`]: the DDI, the trace, the
//! process table, the CPU waits, the outputs, the timers) as an argument:
//! - `doorbells` ([`doorbells::Doorbells`]): the BAR, the dummy page, the pools of doorbell
//!   pages and kernel doorbells; connect, disconnect and victimization (spec 000 "Doorbells",
//!   "Victimizing doorbell pseudocode");
//! - `fences`, `fence_waits` and `fence_logs` ([`fences::Fences`]): native fences, their
//!   storage, CPU waits and signals, the MonitoredValue protocol, the fence interrupt, and the
//!   queues' fence logs (spec 002);
//! - `power` ([`power::Power`]): D3 and the D3 idle timer (spec 000 "Engine D-state
//!   transitions");
//! - `km` ([`km::KmScheduler`]): the kernel-mode path's software queues, validation and
//!   scheduler, and resubmission after preemption (spec 003);
//! - `recovery` ([`recovery::Recovery`]): preemption requests in flight, the TDR settings, the
//!   recovery count (spec 003);
//! - `migrate` ([`migrate::Migrations`]): memory migrations waiting for their queues' answers
//!   (spec 001 "Memory Management");
//! - `process` and `waits`: the process table's records, and the CPU waits.
//!
//! What crosses concerns is a method of [`Os`] in `calls/`, one file per seam, calling the
//! owners in the spec's order: `objects` (processes, devices, allocations, contexts), `queues`
//! (creation, destruction, status), `doorbells`, `fences` (fence logs too), `power` (F1, D3,
//! suspension, termination), `submit` (the kernel-mode path), `waits` (CPU waits on progress
//! fences), `isr` (the interrupt service routine), `preempt` (preemption requests and
//! answers), `tdr` (timeout detection and recovery, top to bottom, and device lost), `hang`
//! (amdgpu's hang timer), `watchdog` (the engine watchdog: progress at the TDR cadence),
//! `migrate` and `userq` (`USERQ_SIGNAL`, `USERQ_WAIT`).
//!
//! Imports go one way: `calls/` imports the owners and this module; an owner imports
//! `shared`, `process`, `timers` and `waits` (`fence_waits` and `fence_logs` also `fences`,
//! `doorbells` also `power::wake_engine`), never [`Os`] or `calls/`; the records import only
//! `waits`.
//!
//! Lock order, for the drivers: the OS lock, then the device lock (inside the KMD). The
//! device's driver thread never holds the device lock while it calls into the OS.

use std::sync::Arc;

use abi::port::{AdapterInfo, KernelError, WaitOutcome};
use abi::{EngineId, HwQueueHandle, PowerState, ProcessId, Time};
use shm::Shm;

use crate::ddi::{Kmd, Traced};
use crate::trace::{SharedTrace, TraceEntry};

mod calls;
mod doorbells;
mod fence_logs;
mod fence_waits;
mod fences;
mod km;
mod migrate;
mod power;
mod process;
mod recovery;
mod shared;
mod timers;
mod waits;

use doorbells::Doorbells;
use fences::Fences;
use km::KmScheduler;
use migrate::Migrations;
use power::Power;
use process::{Process, QueueObj};
use recovery::Recovery;
use shared::Shared;
use timers::Timer;

pub use fences::{FENCE_STRIDE, SYSTEM_PROCESS, TRACED_FENCE_LOG_BYTES};
pub use km::{KERNEL_RING_BYTES, SchedulerPass};
pub use recovery::TdrConfig;
pub use shared::{BrokenTwin, OsStats, Output};
pub use waits::{WaitId, WaitStart};

/// What the kernel holds, for leak checks: every count returns to its start once the objects
/// that took from it are gone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Census {
    /// Live processes.
    pub processes: usize,
    /// Queues of every process.
    pub queues: usize,
    /// Doorbell objects.
    pub doorbells: usize,
    /// Allocations.
    pub allocations: usize,
    /// Native fence instances.
    pub fences: usize,
    /// Doorbell BAR pages handed to processes.
    pub doorbell_pages: usize,
    /// Kernel doorbells held by kernel-mode queues.
    pub kernel_doorbells: usize,
    /// GPU mappings alive on the device.
    pub gpu_mappings: usize,
    /// CPU waits registered and not yet ended.
    pub waits: usize,
}

/// The OS kernel: a sans-IO state machine over one adapter's KMD — the owners of its
/// concerns, and what they share.
pub struct Os {
    /// The DDI, the trace, the process table, the CPU waits, the outputs, the timers and the
    /// counters.
    cx: Shared,
    /// Doorbell pages, kernel doorbells, the BAR and the dummy page.
    doorbells: Doorbells,
    /// Native fences.
    fences: Fences,
    /// D3 and its idle timer.
    power: Power,
    /// The kernel-mode scheduler's software queues and fence IDs.
    km: KmScheduler,
    /// Preemption requests in flight, TDR settings and the recovery count.
    recovery: Recovery,
    /// Memory migrations waiting for their queues' preemption answers.
    migrations: Migrations,
}

impl Os {
    /// An OS over `kmd`, logging into `trace`, with every OS feature enabled. The KMD is
    /// wrapped in the tracing decorator.
    pub fn new(kmd: Box<dyn Kmd>, trace: SharedTrace) -> Result<Os, KernelError> {
        Self::with_features(kmd, trace, abi::port::OsFeatures::default())
    }

    /// Adapter initialization with the OS's `features`: the KMD queries them, then reports
    /// its caps; the OS fails initialization when the two disagree (spec 002 "Querying native
    /// fence feature enablement in OS": native fences advertised while the OS has not enabled
    /// them; caps that contradict each other).
    pub fn with_features(
        mut kmd: Box<dyn Kmd>,
        trace: SharedTrace,
        features: abi::port::OsFeatures,
    ) -> Result<Os, KernelError> {
        kmd.query_features(&features);
        let caps = kmd.native_fence_caps();
        let native_fences = kmd.adapter_info().native_fences;
        let mismatch = |feature, kmd: &str, os: &str| KernelError::FeatureMismatch {
            feature,
            kmd: kmd.to_string(),
            os: os.to_string(),
        };
        if caps.supported && !features.native_fence {
            return Err(mismatch("DXGK_FEATURE_NATIVE_FENCE", "native fence support", "not enabled the feature"));
        }
        if caps.supported != native_fences {
            return Err(mismatch("NativeGpuFence", "caps that disagree with its adapter info", "one answer"));
        }
        if !caps.supported && (caps.optimized_interrupt || caps.map_to_gpu_system_process) {
            return Err(mismatch("NativeFenceCaps", "native fence caps", "no native fences from this KMD"));
        }
        let stride_ok = |s: u64| s.is_power_of_two() && (8..=4096).contains(&s);
        if caps.supported
            && (!stride_ok(caps.current_value_stride) || caps.monitored_value_stride != caps.current_value_stride)
        {
            return Err(mismatch(
                "current_value_stride",
                &format!("strides {}/{}", caps.current_value_stride, caps.monitored_value_stride),
                "equal power-of-two strides of 8..=4096 bytes",
            ));
        }
        // Spec 000 "DXGKQAITYPE_USERMODESUBMISSION_CAPS": the doorbell size sizes the dummy page
        // a disconnected doorbell's CPU VA shows and the CPU VA rotated onto the BAR. A CPU VA
        // rotates whole pages, so a doorbell must be a power of two that fits one.
        let doorbell_bytes = kmd.adapter_info().doorbell_bytes;
        if !doorbell_bytes.is_power_of_two() || doorbell_bytes > shm::PAGE_SIZE as u64 {
            return Err(KernelError::InvalidArgument {
                field: "doorbell_bytes",
                value: doorbell_bytes.to_string(),
                reason: abi::port::Invalid::OutOfRange { expected: "a power of two of at most one page" },
            });
        }
        let dummy_bytes = doorbell_bytes.div_ceil(shm::PAGE_SIZE as u64) * shm::PAGE_SIZE as u64;
        if caps.map_to_gpu_system_process {
            kmd.create_address_space(SYSTEM_PROCESS)?;
        }
        let bar = kmd.doorbell_bar();
        let reserved = kmd.reserved_doorbell_pages();
        let dummy = Shm::new("doorbell-dummy-page", dummy_bytes as usize)?;
        Ok(Os {
            doorbells: Doorbells::new(bar, dummy, reserved),
            fences: Fences::new(native_fences, caps),
            cx: Shared::new(Traced::new(kmd, trace.clone()), trace),
            power: Power::default(),
            km: KmScheduler::default(),
            recovery: Recovery::default(),
            migrations: Migrations::default(),
        })
    }

    /// The KMD's native fence caps (`DXGK_NATIVE_FENCE_CAPS`), as checked at initialization.
    pub fn native_fence_caps(&self) -> abi::port::NativeFenceCaps {
        self.fences.caps
    }

    /// Enters D3 by itself once every engine has stayed in F1 for `period` (spec 000: D0 to
    /// D3 "after a longer idle period"); `None` leaves D3 to [`Os::enter_d3`] alone.
    pub fn set_d3_idle(&mut self, period: Option<std::time::Duration>) {
        self.power.set_d3_idle(period, &mut self.cx.timers);
    }

    /// Breaks rule `b` on purpose from now on (a swarm checker's broken twin).
    pub fn break_deliberately(&mut self, b: BrokenTwin) {
        self.cx.broken.push(b);
    }

    /// Arms a DDI fault (see [`crate::ddi::Traced`]).
    pub fn inject_ddi_fault(&mut self, fault: crate::ddi::DdiFault) {
        self.cx.ddi.inject(fault);
    }

    /// Arms a misbehaviour of the next call of `ddi` (see [`crate::ddi::Misbehaviour`]).
    pub fn inject_misbehaviour(&mut self, ddi: crate::ddi::DdiKind, m: crate::ddi::Misbehaviour) {
        self.cx.ddi.inject_misbehaviour(ddi, m);
    }

    /// Test hook: the KMD "raises" `n` (see [`crate::ddi::Traced::inject_notification`]); the
    /// next interrupt service delivers it.
    pub fn inject_notification(&mut self, n: crate::ddi::Notification) {
        self.cx.ddi.inject_notification(n);
    }

    /// Test hook: the device's next `count` native-fence interrupts are lost (collapsed).
    pub fn drop_fence_signals(&mut self, count: u32) {
        self.cx.ddi.drop_fence_signals(count);
    }

    /// Marks the start of an input at `now`: DDI calls it makes are logged at this time. The
    /// driver calls it on entering the OS (`Inner::call`), before the input, which takes the
    /// same `now`.
    pub fn at(&mut self, now: Time) -> &mut Self {
        self.cx.ddi.at(now);
        self
    }

    /// The next thing for the driver to do, if any.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.cx.outputs.pop_front()
    }

    /// When [`Os::handle_timeout`] next has something to do: the earliest timer.
    pub fn poll_timeout(&self) -> Option<Time> {
        self.cx.timers.next()
    }

    /// The device reports whether every engine is in F1 at `now` (its pump calls this): the
    /// D3 idle timer runs while they all are.
    pub fn handle_device_idle(&mut self, all_f1: bool, now: Time) {
        self.power.handle_device_idle(all_f1, now, &mut self.cx.timers);
    }

    /// Fires what is due, timer by timer: a preemption request unanswered for `TdrDelay`
    /// (spec 003), the hang timer's scan or the engine watchdog's look starts recovery's pass
    /// ([`Os::recovery_timeout`]); once every engine has been in F1 for the idle period, the device enters D3 — if work
    /// is queued meanwhile D3 is refused (see [`Os::enter_d3`]) and the idle timer starts
    /// over.
    pub fn handle_timeout(&mut self, now: Time) {
        let timers = self.cx.timers;
        if [Timer::Tdr, Timer::HangScan, Timer::EngineWatch].iter().any(|&t| timers.is_due(t, now)) {
            self.recovery_timeout(now);
        }
        if self.cx.timers.is_due(Timer::D3Idle, now) {
            self.power.idle_timer_fired(&mut self.cx.timers);
            if !self.power.d3 {
                // Refused while work is in flight: the timer simply starts over.
                let _ = self.enter_d3(now);
            }
        }
    }

    /// The trace so far and how many entries were dropped.
    pub fn trace(&self) -> (Vec<TraceEntry>, u64) {
        self.cx.trace.snapshot()
    }

    /// Counters.
    pub fn stats(&self) -> OsStats {
        self.cx.stats
    }

    /// What the kernel holds (for leak checks).
    pub fn census(&self) -> Census {
        let mut c = Census {
            processes: self.cx.processes.len(),
            doorbell_pages: self.doorbells.pages.in_use(),
            kernel_doorbells: self.doorbells.kernel.in_use(),
            gpu_mappings: self.cx.ddi.live_mappings(),
            waits: self.cx.waits.len(),
            ..Census::default()
        };
        for p in self.cx.processes.values() {
            c.queues += p.queues.len();
            c.doorbells += p.doorbells.len();
            c.allocations += p.allocations.len();
            c.fences += p.fences.len();
        }
        c
    }

    /// Adapter capabilities.
    pub fn adapter_info(&self) -> AdapterInfo {
        self.cx.ddi.adapter_info()
    }

    /// Engine power states.
    pub fn power(&self, engine: EngineId) -> PowerState {
        self.cx.ddi.power(engine)
    }

    /// Whether the device is in D3.
    pub fn in_d3(&self) -> bool {
        self.power.d3
    }

    /// Whether `pid` is a live process.
    pub fn has_process(&self, pid: ProcessId) -> bool {
        self.cx.processes.contains_key(&pid)
    }

    /// Whether a wait has been decided.
    pub fn wait_done(&self, id: WaitId) -> bool {
        self.cx.waits.is_done(id)
    }

    /// A fence wait's result once decided, without ending the wait (for checkers: the thread
    /// collects it with [`Os::end_fence_wait`]).
    pub fn fence_wait_result(&self, id: WaitId) -> Option<Result<WaitOutcome, KernelError>> {
        self.cx.waits.result(id).map(|r| r.clone().map(WaitOutcome::Reached))
    }

    /// Whether submissions wait on software queues.
    pub fn has_km_work(&self) -> bool {
        self.km.queued > 0
    }

    /// The kernel-mode scheduler's work generation (see [`SchedulerPass::generation`]).
    pub fn km_generation(&self) -> u64 {
        self.cx.km_gen
    }

    /// Joins this adapter to a machine's cross-adapter layer as `me`.
    pub(crate) fn attach_cross(&mut self, x: Arc<crate::cross::CrossAdapter>, me: crate::cross::AdapterId) {
        self.fences.cross = Some((x, me));
    }

    fn proc(&mut self, pid: ProcessId) -> Result<&mut Process, KernelError> {
        self.cx.proc(pid)
    }

    fn queue(&mut self, pid: ProcessId, q: HwQueueHandle) -> Result<&mut QueueObj, KernelError> {
        self.cx.queue(pid, q)
    }
}
