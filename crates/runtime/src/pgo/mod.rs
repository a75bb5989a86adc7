//! Profile-guided program specialization: the UMD's use of background processing (spec 004).
//!
//! A [`Pipeline`] is a compute program as the application holds it (D3D12's PSO). Dispatching
//! through it ([`Pipeline::dispatch`]) does three things:
//!
//! 1. **Select.** If a specialized variant exists whose assumptions hold for this dispatch's
//!    argument values, its binary runs; otherwise the generic program does. Arguments are read
//!    from the argument buffer when the dispatch is recorded (they are bound values, like
//!    root constants), so the choice is exact and never depends on GPU work in flight.
//! 2. **Measure**, as the mode allows ([`Profiler`]): in `Allowed` (and
//!    `DisableBackgroundWork`) one dispatch in [`PgoConfig::sample_every`] is recorded,
//!    cheaply; in `AllowIntrusiveMeasurements` every dispatch is; in
//!    `DisableProfilingBySystem` nothing is recorded and nothing new is queued, so timing is not
//!    perturbed (variants already compiled are still selected by the same exact rule, which is
//!    what a tool replaying after a commit wants). A measurement adds to a per-slot
//!    histogram of the values bound (slots that feed a memory base — buffers — are not
//!    measured) and a histogram of dispatch shapes (grid and workgroup).
//! 3. **Act.** Once [`PgoConfig::threshold`] samples are in and some slots (or the shape) hold
//!    one value in at least [`PgoConfig::dominance_percent`] of them, and background work is
//!    not disabled (a task would only be cancelled), a background task is queued on the
//!    runtime ([`crate::background::Runtime::queue_processing_work`]) to compile the variant
//!    for those values ([`specialize::specialize`]: folded arguments, unrolled constant-trip
//!    loops, constant branches and dead code removed). A commit (`CommitResults…`) acts at
//!    once on whatever was measured, scaling partial histograms up to the threshold
//!    ([`Histogram::scaled_to`]), so one pass of a captured frame is enough.
//!
//! **Lifetime** (spec 004's PSO problem). A compile task holds a [`CompileJob`]: the binding,
//! a copy of the generic binary, and a [`Weak`] link to the pipeline's small shared core (its
//! measurements and compiled variants; no GPU memory, no device reference). When it finishes,
//! it upgrades the link: if the pipeline is gone, the result is dropped; otherwise the variant
//! is attached. Destroying a pipeline never waits for a compile, and a task never keeps a
//! pipeline (or the device) alive. Variants are uploaded to GPU memory on the application's
//! thread, at the first dispatch that selects them.
//!
//! **`further_measurements_desired`** ([`Profiler::set_mode`]) is true after
//! `DiscardPrevious`, while a pass found something new, compiles are still pending, or a
//! program measured in the pass is still short of the threshold (not judged yet; a commit
//! judges it at once), and false once a pass that measured dispatches judged every program
//! and found nothing new (steady state).
//!
//! Background work never changes a result: a variant is selected only when every value it
//! assumes is bound, and it computes the same memory bit for bit (differential proptest in
//! `tests/pgo.rs`).

pub mod samples;
pub mod workflow;

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use crate::background::{MeasurementsAction, Mode, Queued, Runtime};
use umd::{Buffer, CommandBuffer, UmdError};

use crate::Device;
use program::ProgramBinary;
use program::specialize;

pub use program::specialize::{Binding, Dims, Limits, SpecializeError};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing here panics while holding a lock; recover the data if something did.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The specializer's knobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PgoConfig {
    /// In the sampled modes, one dispatch in this many is measured.
    pub sample_every: u64,
    /// Samples needed before the specializer acts without a commit.
    pub threshold: u64,
    /// Share of a slot's samples one value must hold for the slot to be bound, in percent.
    pub dominance_percent: u64,
    /// Distinct values a slot's histogram tracks; past that the slot counts as varying.
    pub max_values: usize,
    /// The compiler's limits.
    pub limits: Limits,
}

impl Default for PgoConfig {
    fn default() -> Self {
        PgoConfig { sample_every: 8, threshold: 64, dominance_percent: 90, max_values: 16, limits: Limits::default() }
    }
}

/// One argument slot's value histogram (or, with `T` = [`Dims`], the dispatch shapes').
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Histogram<T = u64> {
    /// (value, count), in the order values were first seen.
    pub counts: Vec<(T, u64)>,
    /// Samples whose value did not fit in the tracked set.
    pub other: u64,
}

impl<T> Default for Histogram<T> {
    fn default() -> Self {
        Histogram { counts: Vec::new(), other: 0 }
    }
}

impl<T: Clone + PartialEq> Histogram<T> {
    /// Records one sample.
    pub fn record(&mut self, value: T, max_values: usize) {
        if let Some(e) = self.counts.iter_mut().find(|e| e.0 == value) {
            e.1 += 1;
        } else if self.counts.len() < max_values {
            self.counts.push((value, 1));
        } else {
            self.other += 1;
        }
    }

    /// Samples recorded.
    pub fn total(&self) -> u64 {
        self.counts.iter().map(|e| e.1).sum::<u64>() + self.other
    }

    /// The same proportions with `target` samples in all (spec 004: a commit scales partial
    /// histograms up "as if the act-now threshold had been reached"). Rounds down, so a value
    /// is never promoted by rounding.
    pub fn scaled_to(&self, target: u64) -> Histogram<T> {
        let total = self.total();
        if total == 0 || total >= target {
            return self.clone();
        }
        let scale = |c: u64| (c as u128 * target as u128 / total as u128) as u64;
        let counts: Vec<(T, u64)> = self.counts.iter().map(|(v, c)| (v.clone(), scale(*c))).collect();
        let other = target - counts.iter().map(|e| e.1).sum::<u64>();
        Histogram { counts, other }
    }

    /// The value holding at least `percent` of at least `threshold` samples.
    pub fn dominant(&self, threshold: u64, percent: u64) -> Option<T> {
        let total = self.total();
        if total < threshold || total == 0 {
            return None;
        }
        let (v, c) = self.counts.iter().max_by_key(|e| e.1)?;
        (c * 100 >= total * percent).then(|| v.clone())
    }

    /// [`Histogram::dominant`], on the histogram scaled up to `threshold` first if `scale`.
    fn decide(&self, cfg: &PgoConfig, scale: bool) -> Option<T> {
        let h = if scale { self.scaled_to(cfg.threshold) } else { self.clone() };
        h.dominant(cfg.threshold, cfg.dominance_percent)
    }
}

/// What a pipeline measured.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Profile {
    /// Dispatches measured.
    pub samples: u64,
    /// Per argument slot (pointer slots stay empty).
    pub slots: Vec<Histogram>,
    /// The dispatch shapes (grid and workgroup).
    pub dims: Histogram<Dims>,
}

impl Profile {
    fn empty(slots: u32) -> Profile {
        Profile { samples: 0, slots: vec![Histogram::default(); slots as usize], dims: Histogram::default() }
    }

    /// The binding the measurements support: every non-pointer slot with a dominant value,
    /// and the shape if one dominates, judged on at least `threshold` samples — or, with
    /// `scale`, on the histograms scaled up to the threshold (a commit).
    pub fn candidate(&self, cfg: &PgoConfig, scale: bool) -> Option<Binding> {
        let args = self.slots.iter().enumerate().filter_map(|(slot, h)| h.decide(cfg, scale).map(|v| (slot as u32, v)));
        let b = Binding::new(args).with_dims(self.dims.decide(cfg, scale));
        (!b.is_empty()).then_some(b)
    }
}

/// Counts of the specializer's work.
#[derive(Debug, Default)]
pub struct PgoCounters {
    /// Dispatches measured.
    pub measured: AtomicU64,
    /// Compile tasks queued (accepted by the runtime).
    pub queued: AtomicU64,
    /// Variants compiled and attached to a live pipeline.
    pub attached: AtomicU64,
    /// Results dropped because their pipeline was destroyed meanwhile.
    pub dropped: AtomicU64,
    /// Compile tasks cancelled by the runtime.
    pub cancelled: AtomicU64,
    /// Compiles that failed (the generic program stays).
    pub failed: AtomicU64,
    /// Dispatches that ran a specialized variant.
    pub specialized_dispatches: AtomicU64,
}

/// A snapshot of [`PgoCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PgoStats {
    /// Dispatches measured.
    pub measured: u64,
    /// Compile tasks queued.
    pub queued: u64,
    /// Variants attached.
    pub attached: u64,
    /// Results dropped (pipeline gone).
    pub dropped: u64,
    /// Compile tasks cancelled.
    pub cancelled: u64,
    /// Compiles failed.
    pub failed: u64,
    /// Dispatches that ran a variant.
    pub specialized_dispatches: u64,
}

/// The part of a pipeline a compile task may reach: measurements and compiled variants, no
/// GPU memory and no device reference.
struct Core {
    binary: ProgramBinary,
    slots: u32,
    pointers: Vec<u32>,
    profile: Mutex<Profile>,
    /// Compiled variants (not yet uploaded ones included).
    variants: Mutex<Vec<(Binding, ProgramBinary)>>,
    /// Bindings whose compile is queued or running.
    pending: Mutex<Vec<Binding>>,
    dispatches: AtomicU64,
    /// Dispatches measured since the last mode change.
    pass_samples: AtomicU64,
}

impl Core {
    /// Whether `b` is already compiled, being compiled, or covered by a variant.
    fn covered(&self, b: &Binding) -> bool {
        lock(&self.variants).iter().any(|v| &v.0 == b) || lock(&self.pending).iter().any(|p| p == b)
    }
}

#[derive(Debug, Default)]
struct PassState {
    /// Dispatches measured since the last mode change.
    samples: u64,
    /// Whether something new was found (a compile queued) since the last mode change.
    found: bool,
    /// Whether a measured pass found nothing new (and nothing was discarded since).
    steady: bool,
}

/// The device's specializer: the mode as the UMD last heard it, the live pipelines, and the
/// steady-state bookkeeping behind `further_measurements_desired`.
pub struct Profiler {
    cfg: PgoConfig,
    mode: AtomicU8,
    pipelines: Mutex<Vec<Weak<Core>>>,
    pass: Mutex<PassState>,
    counters: Arc<PgoCounters>,
}

impl Profiler {
    /// A profiler with the default configuration, in `Allowed` mode.
    pub fn new() -> Profiler {
        Profiler::with_config(PgoConfig::default())
    }

    /// A profiler with a configuration.
    pub fn with_config(cfg: PgoConfig) -> Profiler {
        Profiler {
            cfg,
            mode: AtomicU8::new(Mode::Allowed as u8),
            pipelines: Mutex::new(Vec::new()),
            pass: Mutex::new(PassState::default()),
            counters: Arc::new(PgoCounters::default()),
        }
    }

    /// Its configuration.
    pub fn config(&self) -> &PgoConfig {
        &self.cfg
    }

    /// The mode the UMD was last told.
    pub fn mode(&self) -> Mode {
        // Relaxed: a mode is a hint read once per dispatch; spec 004 does not synchronize mode
        // changes with work, and the value is always one of the four.
        Mode::try_from(self.mode.load(Ordering::Relaxed) as u32).unwrap_or_default()
    }

    /// Counts so far.
    pub fn stats(&self) -> PgoStats {
        let c = &self.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PgoStats {
            measured: g(&c.measured),
            queued: g(&c.queued),
            attached: g(&c.attached),
            dropped: g(&c.dropped),
            cancelled: g(&c.cancelled),
            failed: g(&c.failed),
            specialized_dispatches: g(&c.specialized_dispatches),
        }
    }

    fn live(&self) -> Vec<Arc<Core>> {
        let mut list = lock(&self.pipelines);
        list.retain(|w| w.strong_count() > 0);
        list.iter().filter_map(Weak::upgrade).collect()
    }

    /// The UMD's `SetBackgroundProcessingMode` DDI: records the mode, acts on the
    /// measurements as `action` says (queuing compiles on `rt` for a commit), and returns
    /// `further_measurements_desired`.
    pub fn set_mode(&self, rt: &Runtime, mode: Mode, action: MeasurementsAction) -> bool {
        self.mode.store(mode as u8, Ordering::Relaxed);
        let cores = self.live();
        let mut found = false;
        match action {
            MeasurementsAction::DiscardPrevious => {
                for c in &cores {
                    *lock(&c.profile) = Profile::empty(c.slots);
                }
            }
            MeasurementsAction::CommitResults | MeasurementsAction::CommitResultsHighPriority => {
                for c in &cores {
                    let cand = lock(&c.profile).candidate(&self.cfg, true);
                    if let Some(b) = cand {
                        found |= self.queue_compile(rt, c, b);
                    }
                }
            }
            MeasurementsAction::KeepAll => {}
        }
        let pending = cores.iter().any(|c| !lock(&c.pending).is_empty());
        // A program measured in this pass but still short of the threshold has not been judged
        // (a commit judges it, scaling up).
        let gathering = !action.is_commit()
            && cores.iter().any(|c| {
                c.pass_samples.swap(0, Ordering::Relaxed) > 0 && lock(&c.profile).samples < self.cfg.threshold
            });
        if action.is_commit() {
            for c in &cores {
                c.pass_samples.store(0, Ordering::Relaxed);
            }
        }
        let mut pass = lock(&self.pass);
        // DiscardPrevious starts over; something new found, compiles still pending, or
        // measurements still short of the threshold ask for another pass; a measured pass
        // that judged everything and found nothing new is steady.
        let further = if action == MeasurementsAction::DiscardPrevious || pass.found || found || pending || gathering {
            pass.steady = false;
            true
        } else if pass.samples > 0 {
            pass.steady = true;
            false
        } else {
            !pass.steady
        };
        pass.samples = 0;
        pass.found = false;
        further
    }

    /// Queues the compile of `binding` for `core` unless it is covered; returns whether a
    /// task was queued.
    fn queue_compile(&self, rt: &Runtime, core: &Arc<Core>, binding: Binding) -> bool {
        if core.covered(&binding) {
            return false;
        }
        lock(&core.pending).push(binding.clone());
        let job = CompileJob {
            link: Arc::downgrade(core),
            binding,
            binary: core.binary.clone(),
            limits: self.cfg.limits,
            counters: self.counters.clone(),
        };
        match rt.queue_processing_work(
            |j: CompileJob| {
                j.run();
            },
            |j: CompileJob| j.cancel(),
            job,
        ) {
            Queued::Accepted(_) => {
                self.counters.queued.fetch_add(1, Ordering::Relaxed);
                lock(&self.pass).found = true;
                true
            }
            // The cancel already ran (and un-pended the binding).
            Queued::Cancelled(_) => false,
        }
    }
}

impl Default for Profiler {
    fn default() -> Self {
        Profiler::new()
    }
}

/// What a [`CompileJob`] did with its result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobOutcome {
    /// The variant is attached to its pipeline.
    Attached,
    /// The pipeline was destroyed meanwhile: the result was dropped.
    Dropped,
    /// The compiler refused (the generic program stays).
    Failed(SpecializeError),
}

/// A background compile: everything the task holds (see the module documentation).
pub struct CompileJob {
    link: Weak<Core>,
    binding: Binding,
    binary: ProgramBinary,
    limits: Limits,
    counters: Arc<PgoCounters>,
}

impl CompileJob {
    /// The binding it compiles for.
    pub fn binding(&self) -> &Binding {
        &self.binding
    }

    /// The compile itself (touches nothing shared).
    pub fn compile(&self) -> Result<ProgramBinary, SpecializeError> {
        specialize::specialize(&self.binary, &self.binding, self.limits)
    }

    /// Hands a result back: attached if the pipeline is alive, dropped if not.
    pub fn attach(self, result: Result<ProgramBinary, SpecializeError>) -> JobOutcome {
        let Some(core) = self.link.upgrade() else {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            return JobOutcome::Dropped;
        };
        lock(&core.pending).retain(|b| b != &self.binding);
        match result {
            Ok(bin) => {
                lock(&core.variants).push((self.binding, bin));
                self.counters.attached.fetch_add(1, Ordering::Relaxed);
                JobOutcome::Attached
            }
            Err(e) => {
                self.counters.failed.fetch_add(1, Ordering::Relaxed);
                JobOutcome::Failed(e)
            }
        }
    }

    /// The task's callback: compile, then attach or drop.
    pub fn run(self) -> JobOutcome {
        let r = self.compile();
        self.attach(r)
    }

    /// The task's cancel: the binding is no longer pending (a later pass may queue it again).
    pub fn cancel(self) {
        self.counters.cancelled.fetch_add(1, Ordering::Relaxed);
        if let Some(core) = self.link.upgrade() {
            lock(&core.pending).retain(|b| b != &self.binding);
        }
    }
}

/// Which binary a dispatch ran.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selected {
    /// The generic program.
    Generic,
    /// The variant for this binding.
    Specialized(Binding),
}

/// A compute program with profile-guided variants (D3D12's PSO; see the module
/// documentation). Dropping it drops its variants; compiles in flight drop their results.
pub struct Pipeline {
    device: Device,
    core: Arc<Core>,
    generic: Buffer,
    /// Variants in GPU memory.
    uploaded: Mutex<Vec<(Binding, Buffer)>>,
}

impl Pipeline {
    /// Uploads `program` and registers it with the device's specializer.
    pub fn new(device: &Device, program: &ProgramBinary) -> Result<Pipeline, UmdError> {
        let generic = device.upload(&program.to_bytes())?;
        let (slots, pointers) = specialize::argument_slots(program);
        let core = Arc::new(Core {
            binary: program.clone(),
            slots,
            pointers,
            profile: Mutex::new(Profile::empty(slots)),
            variants: Mutex::new(Vec::new()),
            pending: Mutex::new(Vec::new()),
            dispatches: AtomicU64::new(0),
            pass_samples: AtomicU64::new(0),
        });
        lock(&device.pgo().pipelines).push(Arc::downgrade(&core));
        Ok(Pipeline { device: device.clone(), core, generic, uploaded: Mutex::new(Vec::new()) })
    }

    /// The generic program.
    pub fn program(&self) -> &ProgramBinary {
        &self.core.binary
    }

    /// Argument slots the program reads.
    pub fn slots(&self) -> u32 {
        self.core.slots
    }

    /// A copy of what it measured.
    pub fn profile(&self) -> Profile {
        lock(&self.core.profile).clone()
    }

    /// The bindings of its compiled variants.
    pub fn variants(&self) -> Vec<Binding> {
        lock(&self.core.variants).iter().map(|v| v.0.clone()).collect()
    }

    /// A compiled variant's binary.
    pub fn variant(&self, b: &Binding) -> Option<ProgramBinary> {
        lock(&self.core.variants).iter().find(|v| &v.0 == b).map(|v| v.1.clone())
    }

    /// The job a background compile of `binding` would run, without queuing it (for tests and
    /// tools that drive compiles by hand).
    pub fn compile_job(&self, binding: Binding) -> CompileJob {
        let p = self.device.pgo();
        CompileJob {
            link: Arc::downgrade(&self.core),
            binding,
            binary: self.core.binary.clone(),
            limits: p.cfg.limits,
            counters: p.counters.clone(),
        }
    }

    /// Records a `DISPATCH` of this program into `cb`: reads the bound argument values from
    /// `args` (slot `k` at byte `8k`), selects a matching variant or the generic program,
    /// measures as the mode allows and may queue a compile. Returns what it selected.
    pub fn dispatch(
        &self,
        cb: &mut CommandBuffer,
        grid: [u32; 3],
        group: [u32; 3],
        args: &Buffer,
    ) -> Result<Selected, UmdError> {
        let values: Vec<u64> = (0..self.core.slots as u64).map(|k| args.read_u64(8 * k)).collect::<Result<_, _>>()?;
        let dims = Dims { grid, group };
        let (va, selected) = self.select(&values, dims);
        self.measure(&values, dims);
        cb.dispatch(va, grid, group, args.va());
        Ok(selected)
    }

    /// The program VA for these values: an uploaded variant that matches, else a compiled one
    /// (uploaded now), else the generic program.
    fn select(&self, values: &[u64], dims: Dims) -> (u64, Selected) {
        let counters = &self.device.pgo().counters;
        let mut up = lock(&self.uploaded);
        if let Some((b, buf)) = up.iter().find(|(b, _)| b.matches(values, dims)) {
            counters.specialized_dispatches.fetch_add(1, Ordering::Relaxed);
            return (buf.va(), Selected::Specialized(b.clone()));
        }
        let fresh = lock(&self.core.variants).iter().find(|(b, _)| b.matches(values, dims)).cloned();
        if let Some((b, bin)) = fresh {
            // If GPU memory for the variant cannot be had, the generic program runs: background
            // work never makes a dispatch fail. The next dispatch tries again.
            if let Ok(buf) = self.device.upload(&bin.to_bytes()) {
                let va = buf.va();
                up.push((b.clone(), buf));
                counters.specialized_dispatches.fetch_add(1, Ordering::Relaxed);
                return (va, Selected::Specialized(b));
            }
        }
        (self.generic.va(), Selected::Generic)
    }

    /// Measures one dispatch as the mode allows; queues a compile once a binding is supported.
    fn measure(&self, values: &[u64], dims: Dims) {
        // A UMD without the feature does no PGO at all.
        if !self.device.options().background_processing {
            return;
        }
        let p = self.device.pgo();
        let n = self.core.dispatches.fetch_add(1, Ordering::Relaxed);
        let take = match p.mode() {
            Mode::AllowIntrusiveMeasurements => true,
            Mode::Allowed | Mode::DisableBackgroundWork => n.is_multiple_of(p.cfg.sample_every.max(1)),
            Mode::DisableProfilingBySystem => false,
        };
        if !take {
            return;
        }
        p.counters.measured.fetch_add(1, Ordering::Relaxed);
        self.core.pass_samples.fetch_add(1, Ordering::Relaxed);
        lock(&p.pass).samples += 1;
        let cand = {
            let mut prof = lock(&self.core.profile);
            prof.samples += 1;
            prof.dims.record(dims, p.cfg.max_values);
            for (slot, h) in prof.slots.iter_mut().enumerate() {
                if !self.core.pointers.contains(&(slot as u32)) {
                    h.record(values[slot], p.cfg.max_values);
                }
            }
            prof.candidate(&p.cfg, false)
        };
        // While background work is disabled a task would only be cancelled: the UMD skips it
        // (spec 004 allows either); a commit acts on the measurements later.
        if let Some(b) = cand.filter(|_| !p.mode().disables_work()) {
            // A variant already covering these values means nothing new was found.
            if !lock(&self.core.variants)
                .iter()
                .any(|(vb, _)| vb.matches(values, dims) && vb.pairs().len() >= b.pairs().len())
            {
                p.queue_compile(self.device.background(), &self.core, b);
            }
        }
    }
}
