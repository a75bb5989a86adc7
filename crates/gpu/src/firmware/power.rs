//! Engine power (spec 001's F0 and F1) and the firmware's timers.
//!
//! An engine in F0 that has had no work for its idle period asks the kernel for F1
//! ([`Interrupt::EngineStateChange`] with `TransitionToF1`); the kernel answers with
//! [`Firmware::enter_f1`], which is refused while any queue on the run list has work (each is
//! marked pending, so none is lost), or with [`Firmware::request_f0`]. A queue the kernel holds
//! off the run list keeps its work through F1. ([`super::BrokenTwin::F1WithWork`] breaks that
//! rule on purpose, for the swarm checker that must catch it.)
//!
//! Every deadline at which an engine acts without an input is a [`Timer`] in the engine's
//! timer table ([`Timers`], quinn-proto's `TimerTable`): the idle timer (here), the quantum
//! timer (the scheduler's) and the busy timer (modelled execution's).
//! [`Firmware::poll_timeout`] is the earliest deadline over every engine, and
//! [`Firmware::handle_timeout`] fires the expired ones, so a driver that sleeps until
//! `poll_timeout` (the deterministic one jumps its clock there) misses none.

use abi::{EngineId, EngineState, PowerState, QueueState};

use crate::Time;
use crate::error::GpuError;
use crate::memory::AddressSpace;

use super::queue::FwQueueId;
use super::schedule::mark_pending;
use super::{Engine, Firmware, Interrupt, StepReport};

/// A firmware timer: every deadline at which an engine acts without an input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Timer {
    /// The engine has been idle for its idle period: ask the kernel for F1.
    Idle,
    /// A slot holder's quantum runs out against a waiting queue: redo the slot assignment.
    Quantum,
    /// With modelled timing: the engine finishes the work of its last step (the modelled
    /// end of its busy period) and may run again.
    Busy,
}

impl Timer {
    const COUNT: usize = 3;
}

/// One engine's timer table (quinn-proto's `TimerTable`): at most one deadline per
/// [`Timer`]. [`Firmware::poll_timeout`] is the earliest deadline over every engine, and
/// [`Firmware::handle_timeout`] fires the expired ones, so a driver that sleeps until
/// `poll_timeout` (the deterministic one jumps its clock there) misses none.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Timers(pub(super) [Option<Time>; Timer::COUNT]);

impl Timers {
    pub(super) fn set(&mut self, timer: Timer, at: Option<Time>) {
        self.0[timer as usize] = at;
    }
    pub(super) fn get(&self, timer: Timer) -> Option<Time> {
        self.0[timer as usize]
    }
    pub(super) fn expired(&self, timer: Timer, now: Time) -> bool {
        self.get(timer).is_some_and(|t| now >= t)
    }
    pub(super) fn earliest(&self) -> Option<Time> {
        self.0.iter().flatten().min().copied()
    }
}

/// An engine's power (spec 001's F0 and F1): its state, whether it asked the kernel for F1,
/// and when it last had work. Its idle timer is [`Timer::Idle`] in the engine's table, armed
/// at [`Power::idle_deadline`] by [`Engine::arm_idle`].
pub(super) struct Power {
    /// F0 (running) or F1 (idle, runs nothing).
    pub(super) state: PowerState,
    /// It asked the kernel for F1 and has no answer yet.
    f1_requested: bool,
    /// When it last had work (its idle period runs from here).
    last_busy: Time,
    /// How long without work before the engine asks for F1.
    idle_period: std::time::Duration,
    /// It counts every queue as idle ([`super::BrokenTwin::F1WithWork`]): false in every real
    /// device.
    pub(super) broken: bool,
}

impl Power {
    /// An engine in F0 that has not asked for F1 and last had work at time zero.
    pub(super) fn new(idle_period: std::time::Duration) -> Power {
        Power { state: PowerState::F0, f1_requested: false, last_busy: Time::ZERO, idle_period, broken: false }
    }

    /// In F0: the engine runs.
    pub(super) fn is_on(&self) -> bool {
        self.state == PowerState::F0
    }

    /// When the idle timer fires: an idle period after the engine last had work, while it is
    /// in F0 and has not asked for F1 yet.
    pub(super) fn idle_deadline(&self) -> Option<Time> {
        (self.state == PowerState::F0 && !self.f1_requested).then(|| self.last_busy.plus(self.idle_period))
    }

    /// The engine had work at `now`: its idle period starts over.
    pub(super) fn busy_at(&mut self, now: Time) {
        self.last_busy = now;
    }

    /// The kernel asked for F0 at `now` (`request_f0`).
    fn wake(&mut self, now: Time) {
        self.state = PowerState::F0;
        self.f1_requested = false;
        self.last_busy = now;
    }

    /// The kernel answered the F1 request at `now`: refused while `busy` (the engine's idle
    /// period starts over), granted otherwise (`true`).
    fn answer_f1(&mut self, now: Time, busy: bool) -> bool {
        self.f1_requested = false;
        let busy = busy && !self.broken;
        if busy {
            self.last_busy = now;
        } else {
            self.state = PowerState::F1;
        }
        !busy
    }

    /// The idle timer fired at `now`: an engine still `busy` starts its idle period over; an
    /// idle one asks for F1 (`true`: the caller raises the request).
    fn idle_expired(&mut self, now: Time, busy: bool) -> bool {
        let busy = busy && !self.broken;
        if busy {
            self.last_busy = now;
        } else {
            self.f1_requested = true;
        }
        !busy
    }
}

impl Engine {
    /// Re-arms the idle timer at [`Power::idle_deadline`].
    pub(super) fn arm_idle(&mut self) {
        self.timers.set(Timer::Idle, self.power.idle_deadline());
    }

    /// The engine had work at `now`: its idle timer starts over.
    pub(super) fn busy_at(&mut self, now: Time) {
        self.power.busy_at(now);
        self.arm_idle();
    }
}

impl Firmware {
    pub(crate) fn power(&self, engine: EngineId) -> Result<PowerState, GpuError> {
        self.engines.get(engine.0 as usize).map(|e| e.power.state).ok_or(GpuError::BadEngine(engine.0))
    }

    pub(crate) fn busy_ns(&self, engine: EngineId, now: Time) -> Result<u64, GpuError> {
        self.engines.get(engine.0 as usize).map(|e| e.busy.at(now)).ok_or(GpuError::BadEngine(engine.0))
    }

    pub(crate) fn request_f0(&mut self, engine: EngineId, now: Time) -> Result<(), GpuError> {
        let e = self.engine_mut(engine)?;
        e.power.wake(now);
        e.resched = true;
        e.arm_idle();
        Ok(())
    }

    pub(crate) fn enter_f1(
        &mut self,
        engine: EngineId,
        now: Time,
        vms: &[Option<AddressSpace>],
    ) -> Result<bool, GpuError> {
        // Hardware slots: where their queues stand now (they run between steps), and off the
        // slots if the engine powers down (below).
        let loaded = self.loaded_on(engine);
        if !loaded.is_empty() {
            let mut report = StepReport::default();
            self.read_progress(&mut report, true);
        }
        let Firmware { engines, queues, .. } = self;
        let e = engines.get_mut(engine.0 as usize).ok_or(GpuError::BadEngine(engine.0))?;
        let mut busy = false;
        // A scan of the whole run list, but a rare one (the kernel's answer to an idle request).
        for k in 0..e.run_list.len() {
            let id = e.run_list[k];
            let q = queues.get_mut(id.0).map_err(|_| GpuError::StaleQueue(id))?;
            if q.state != QueueState::Hung && (q.pending || q.ring.has_work()) {
                mark_pending(e, q, id);
                busy = true;
            }
        }
        let granted = e.power.answer_f1(now, busy);
        e.resched = true;
        e.arm_idle();
        if granted && !loaded.is_empty() {
            // An engine in F1 runs nothing: its slots are emptied (idle, they answer at once).
            self.hw_quiesce(&loaded, false, now, vms);
        }
        Ok(granted)
    }

    pub(crate) fn all_asleep(&self) -> bool {
        self.engines.iter().all(|e| e.power.state == PowerState::F1)
    }

    /// Fires every expired timer of every engine.
    pub(crate) fn handle_timeout(&mut self, now: Time) {
        let Firmware { engines, queues, irqs, .. } = self;
        for e in engines.iter_mut() {
            if e.timers.expired(Timer::Busy, now) {
                // The modelled work is done: the engine may run again (its step checks).
                e.timers.set(Timer::Busy, None);
            }
            if e.timers.expired(Timer::Quantum, now) {
                // The slot assignment looks again at the engine's next step.
                e.timers.set(Timer::Quantum, None);
                e.resched = true;
            }
            if e.timers.expired(Timer::Idle, now) {
                let busy_queue =
                    |id: &FwQueueId| queues.get(id.0).is_ok_and(|q| q.pending && q.state != QueueState::Hung);
                // A busy queue on the run list is in a slot, in the waiting set (pending, not
                // hung, not in a slot) or asleep on a WAIT: no scan of the run list.
                let asleep = e.asleep.iter().any(|id| queues.get(id.0).is_ok_and(|q| q.sched.asleep));
                let busy = e.hqd.iter().any(busy_queue) || !e.waiting.is_empty() || asleep;
                if e.power.idle_expired(now, busy) {
                    // Raised now: the driver takes it at its own time.
                    let irq = Interrupt::EngineStateChange { engine: e.id, state: EngineState::TransitionToF1 };
                    irqs.push_back((Time::ZERO, irq));
                }
                e.arm_idle();
            }
        }
    }

    /// The earliest timer of any engine.
    pub(crate) fn poll_timeout(&self) -> Option<Time> {
        self.engines.iter().filter_map(|e| e.timers.earliest()).min()
    }

    /// Whether the device has nothing to do at `now` but wait for its engines' modelled work
    /// to end: timing is modelled, no interrupt waits to be raised, no timer is due, and every
    /// engine in F0 (one at least) is busy with the work of an earlier step, which [`Self::step`]
    /// skips. A step and a timer check at `now` would then change nothing.
    pub(crate) fn waits_for_busy_engines(&self, now: Time) -> bool {
        self.timing == crate::cost::Timing::Modelled
            && self.irqs.is_empty()
            && self.poll_timeout().is_some_and(|t| now < t)
            && self.engines.iter().any(|e| e.power.is_on())
            && self.engines.iter().all(|e| !e.power.is_on() || e.timers.get(Timer::Busy).is_some_and(|t| now < t))
    }

    /// The earliest modelled end of an engine's busy period.
    pub(crate) fn busy_until(&self) -> Option<Time> {
        self.engines.iter().filter_map(|e| e.timers.get(Timer::Busy)).min()
    }
}
