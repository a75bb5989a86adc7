//! The broken twins: for each checker, a deliberate fault of the system under test that it
//! must catch (issue 27: "a checker that never fires is not a checker").
//!
//! A twin breaks the device's records as the runner hands them to the checkers
//! (`lost-completions`, `repeated-completion`, `backwards-fence`), keeps a process from the
//! kernel (`leak`), runs the system without what the checker expects (`silent-hang-timer`), or
//! arms a rule the kernel ([`kernel::os::BrokenTwin`]) or the device ([`gpu::BrokenTwin`])
//! breaks on purpose from the run's first instant. Nothing in a run without `--inject` knows
//! them; `swarm::tests::every_twin_is_caught_by_its_checker` runs each until it is caught, on a
//! seed where its checker passes without it.

/// A deliberately broken twin: a fault of the system under test that a checker must catch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Inject {
    /// The device stops writing one queue's completions halfway through the window
    /// (`liveness`, `exactly-once`).
    LostCompletions,
    /// The device writes one completion twice (`exactly-once`).
    RepeatedCompletion,
    /// The device writes one progress value lower than the one before (`monotone-fence`).
    BackwardsFence,
    /// The kernel never frees one process (`census`).
    Leak,
    /// The per-queue hang timer does not fire: the system runs with it off while the checker
    /// expects it (`hang-detected`).
    SilentHangTimer,
    /// The kernel leaves a hung queue's doorbell connected (`fault-record`).
    HungDoorbell,
    /// The kernel wakes a CPU wait one fence value early (`cpu-wait`).
    EarlyWake,
    /// An engine enters F1 with work on its run list (a queue asleep on a `WAIT`): the
    /// device's [`gpu::BrokenTwin::F1WithWork`] (`f1-idle`).
    BusyF1,
    /// Every native-fence signal raises its interrupt, waiter or not: the device's
    /// [`gpu::BrokenTwin::SpuriousFenceInterrupts`] (`interrupts`).
    SpuriousInterrupts,
}

impl Inject {
    /// Every twin.
    pub const ALL: &'static [Inject] = &[
        Inject::LostCompletions,
        Inject::RepeatedCompletion,
        Inject::BackwardsFence,
        Inject::Leak,
        Inject::SilentHangTimer,
        Inject::HungDoorbell,
        Inject::EarlyWake,
        Inject::BusyF1,
        Inject::SpuriousInterrupts,
    ];
    /// The checker that must catch it.
    pub fn caught_by(self) -> &'static str {
        match self {
            Inject::LostCompletions => "liveness",
            Inject::RepeatedCompletion => "exactly-once",
            Inject::BackwardsFence => "monotone-fence",
            Inject::Leak => "census",
            Inject::SilentHangTimer => "hang-detected",
            Inject::HungDoorbell => "fault-record",
            Inject::EarlyWake => "cpu-wait",
            Inject::BusyF1 => "f1-idle",
            Inject::SpuriousInterrupts => "interrupts",
        }
    }
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Inject::LostCompletions => "lost-completions",
            Inject::RepeatedCompletion => "repeated-completion",
            Inject::BackwardsFence => "backwards-fence",
            Inject::Leak => "leak",
            Inject::SilentHangTimer => "silent-hang-timer",
            Inject::HungDoorbell => "hung-doorbell",
            Inject::EarlyWake => "early-wake",
            Inject::BusyF1 => "busy-f1",
            Inject::SpuriousInterrupts => "spurious-interrupts",
        }
    }
    /// The rule the kernel breaks for it, if the twin is the kernel's.
    pub(super) fn kernel_twin(self) -> Option<kernel::os::BrokenTwin> {
        match self {
            Inject::HungDoorbell => Some(kernel::os::BrokenTwin::HungQueueKeepsDoorbell),
            Inject::EarlyWake => Some(kernel::os::BrokenTwin::EarlyFenceWake),
            _ => None,
        }
    }
    /// The rule the device breaks for it, if the twin is the device's.
    pub(super) fn gpu_twin(self) -> Option<gpu::BrokenTwin> {
        match self {
            Inject::BusyF1 => Some(gpu::BrokenTwin::F1WithWork),
            Inject::SpuriousInterrupts => Some(gpu::BrokenTwin::SpuriousFenceInterrupts),
            _ => None,
        }
    }
}
