//! The drivers: what owns the lock, the clock, the threads and the blocking around the sans-IO
//! kernel ([`Os`]) and device ([`Gpu`]).
//!
//! [`Inner::call`] is the one layer between a port and the state machine: it takes the OS
//! lock, reads the clock, runs one input, drains the OS's outputs, releases the lock, and then
//! acts on them — wakes the CPU waiters whose waits completed, propagates cross-adapter
//! signals, wakes the kernel-mode scheduler. [`Inner::pump`] is one turn of the device: latch
//! doorbells, step the engines, fire the device's timers, move its interrupts onto the
//! interrupt line, and enter the OS only when there is something for it (an interrupt, an
//! idle-state change, a timer).
//!
//! Lock order: the OS lock, then the device lock. The pump never holds the device lock while
//! it enters the OS.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use abi::port::KernelError;
use abi::{ProcessId, Time};
use gpu::Gpu;
use parking_lot::{Condvar, Mutex};

use crate::os::{Os, Output, WaitId};
use crate::trace::SharedTrace;
use crate::virtual_kmd::{DeviceWaker, InterruptLine};

/// A source of device time.
pub(crate) trait Clock: Send + Sync {
    /// Now.
    fn now(&self) -> Time;
}

/// Real time since the system started.
pub(crate) struct RealClock {
    pub(crate) epoch: Instant,
}

impl Clock for RealClock {
    fn now(&self) -> Time {
        Time(self.epoch.elapsed().as_nanos() as u64)
    }
}

/// A virtual clock that only moves when told.
#[derive(Default)]
pub(crate) struct SimClock {
    now: AtomicU64,
}

impl Clock for SimClock {
    #[inline]
    fn now(&self) -> Time {
        // Relaxed: the clock is only read and written by the thread driving the simulation.
        Time(self.now.load(Ordering::Relaxed))
    }
}

impl SimClock {
    #[inline]
    pub(crate) fn set(&self, t: Time) {
        self.now.fetch_max(t.0, Ordering::Relaxed);
    }
}

pub(crate) enum Driver {
    Live {
        stop: Arc<AtomicBool>,
        threads: Mutex<Vec<JoinHandle<()>>>,
        fw_thread: Arc<ThreadWaker>,
    },
    Sim {
        world: Arc<SimWorld>,
        /// The world's count of changes ([`SimWorld::changes`]) when this adapter's device last
        /// handed over its completion record ([`super::System::take_completions`]).
        completions_taken: AtomicU64,
        /// The same for its record of fence signals ([`super::System::take_fence_signals`]).
        signals_taken: AtomicU64,
    },
}

/// The deterministic driver's world: one virtual clock and every adapter that shares it (one
/// for a [`super::System`], several for a [`super::Machine`]). A step of the world steps every
/// adapter, so a wait on one adapter sees the signals of the others.
pub(crate) struct SimWorld {
    pub(crate) clock: Arc<SimClock>,
    pub(crate) members: Mutex<Vec<std::sync::Weak<Inner>>>,
    /// Bumped after everything that may change what the world does next: an OS entry, a
    /// step, a tool's access to a device ([`SimWorld::changed`]).
    changes: AtomicU64,
    /// `(changes, until)`: as of that count of changes, every adapter waits for its busy
    /// engines ([`Inner::waits_for_busy_engines`]) until `until`, its next event. While the
    /// count stands, a step before then would do nothing, and the next event is `until`.
    quiet: Mutex<(u64, Time)>,
    /// When a client may next ring ([`SimWorld::set_horizon`]; ns, `u64::MAX`: none). Only a
    /// step reads it, so it is handed to the devices as a step begins, not each time it moves
    /// (a driver stepping event by event moves it at every instant, and steps at few).
    horizon: AtomicU64,
}

impl Default for SimWorld {
    fn default() -> Self {
        SimWorld {
            clock: Default::default(),
            members: Default::default(),
            changes: AtomicU64::new(0),
            quiet: Mutex::new((0, Time::ZERO)),
            horizon: AtomicU64::new(u64::MAX),
        }
    }
}

impl SimWorld {
    /// Something may have changed what the world does next: the quiet period it knew of no
    /// longer holds.
    pub(crate) fn changed(&self) {
        // Release: pairs with the acquire load in `quiet_until`, so a quiet period recorded
        // before this change is seen as stale by whoever sees the change.
        self.changes.fetch_add(1, Ordering::Release);
    }

    /// How many changes the world has seen: only a step records completions, and every step
    /// is one, so a device's completion record cannot have grown while the count stands.
    #[inline]
    pub(crate) fn changes(&self) -> u64 {
        // Acquire: pairs with `changed`.
        self.changes.load(Ordering::Acquire)
    }

    /// The end of the quiet period the world is known to be in at `now` (nothing changed since
    /// it was recorded, and it lasts past `now`), if any.
    #[inline]
    pub(crate) fn quiet_until(&self, now: Time) -> Option<Time> {
        let (at, until) = *self.quiet.lock();
        // Acquire: pairs with `changed`.
        (at == self.changes.load(Ordering::Acquire) && now < until).then_some(until)
    }

    /// Runs `f` on every live adapter of the world, in the order they joined, with the
    /// members' lock released (a step may enter another adapter). One adapter (a
    /// [`super::System`]) is the common case: no list is built for it.
    fn each(&self, mut f: impl FnMut(&Arc<Inner>)) {
        let members = self.members.lock();
        if let [one] = members.as_slice() {
            let one = one.upgrade();
            drop(members);
            if let Some(m) = one {
                f(&m);
            }
            return;
        }
        let all: Vec<Arc<Inner>> = members.iter().filter_map(std::sync::Weak::upgrade).collect();
        drop(members);
        all.iter().for_each(f);
    }

    /// One step of every adapter (each one's device pump, then its kernel scheduler).
    /// Returns whether anything happened anywhere.
    pub(crate) fn step(&self) -> bool {
        self.step_with(true).0
    }

    /// One step of every adapter; `poll`: whether the devices look at their doorbells.
    /// Returns whether anything happened anywhere, and whether a kernel-mode scheduler moved
    /// work (it rings kernel doorbells, which the next step must look at).
    fn step_with(&self, poll: bool) -> (bool, bool) {
        let (mut any, mut km) = (false, false);
        let _changed = Changed(self);
        // Relaxed: the deterministic driver's own state, read and written by the thread
        // driving it.
        let horizon = Some(self.horizon.load(Ordering::Relaxed)).filter(|&t| t != u64::MAX).map(Time);
        self.each(|m| {
            m.gpu.lock().set_horizon(horizon);
            let p = m.pump_with(poll);
            // Relaxed: see `Inner::km_work`. Without kernel-mode submissions a pass moves nothing.
            let moved = m.km_work.load(Ordering::Relaxed) && m.run_scheduler().moved;
            km |= moved;
            any |= p.work || moved;
        });
        (any, km)
    }

    /// Steps until nothing more happens at the current time. Bounded, in case a queue spins
    /// (a `WAIT` that is never satisfied keeps it runnable).
    ///
    /// Only the first step looks at every doorbell: nothing else runs between the steps of
    /// one call (the clients wait for it to return), so the only doorbells that can be rung
    /// meanwhile are the kernel-mode scheduler's, and a step after one that moved kernel-mode
    /// work looks again. With ten thousand dedicated doorbells, the scan was most of the cost
    /// of a step.
    pub(crate) fn settle_now(&self) -> usize {
        self.settle_now_from(true)
    }

    /// [`SimWorld::settle_now`]; `poll`: whether the first step looks at every doorbell (a
    /// caller that just polled the ones its clients rang passes `false`).
    ///
    /// A step without the doorbell scan in a world in which every adapter waits for its busy
    /// engines ([`Inner::waits_for_busy_engines`]) would do nothing, so it is not taken: that
    /// is most instants of a loaded simulation (a client's submission while the engines run
    /// earlier work), and the step after one that started work.
    pub(crate) fn settle_now_from(&self, poll: bool) -> usize {
        let mut poll = poll;
        for n in 0..SETTLE_STEPS {
            if !poll && self.waits_for_busy_engines() {
                return n;
            }
            let (any, km) = self.step_with(poll);
            if !any {
                return n;
            }
            poll = km;
        }
        SETTLE_STEPS
    }

    /// Whether every adapter waits for its busy engines now ([`Inner::waits_for_busy_engines`]).
    /// A yes is remembered with the next event, until something changes.
    fn waits_for_busy_engines(&self) -> bool {
        let now = self.clock.now();
        if self.quiet_until(now).is_some() {
            return true;
        }
        // Acquire: pairs with `changed`; read before looking, so a change made meanwhile
        // makes what is recorded stale.
        let at = self.changes.load(Ordering::Acquire);
        let mut waiting = true;
        self.each(|m| waiting &= m.waits_for_busy_engines(now));
        if waiting && let Some(until) = self.find_next_timer() {
            *self.quiet.lock() = (at, until);
        }
        waiting
    }

    /// Runs until no engine has work left: steps, and while an engine is busy with modelled
    /// work, moves the clock to the next event (that engine finishing, or any timer before
    /// it). Time passes only as far as the work takes; an idle system's timers (the F1 idle
    /// period, D3) are not reached. Bounded, for a queue that never finishes (an endless
    /// kernel): use [`SimWorld::run_until`] beside one.
    pub(crate) fn settle(&self) {
        for _ in 0..SETTLE_STEPS {
            self.settle_now();
            // While an engine works, time passes to the next event: its busy period ending,
            // or any timer before that (the earliest timer is never later than the busy end).
            let Some(next) = self.next_busy().and(self.next_timer()) else { return };
            self.jump_to(next);
        }
    }

    /// Runs every event in time order until the clock reaches `target`, then settles at
    /// `target`: engines execute, timers fire and time moves from one to the next, whatever
    /// runs (an endless kernel included). The bounded "run for this long" of tests.
    pub(crate) fn run_until(&self, target: Time) {
        // Control returns to the caller at `target`, where it may ring: turns that could be
        // cut by a ring end there ([`gpu::Gpu::set_horizon`]).
        self.set_horizon(Some(target));
        loop {
            self.settle_now();
            match self.next_timer() {
                Some(t) if t <= target && self.clock.now() < target => self.jump_to(t),
                _ => break,
            }
        }
        self.clock.set(target);
        self.settle_now();
    }

    /// Tells every adapter's device when a client may next ring ([`gpu::Gpu::set_horizon`]),
    /// as of its next step.
    #[inline]
    pub(crate) fn set_horizon(&self, at: Option<Time>) {
        // Relaxed: see `step_with`.
        self.horizon.store(at.map_or(u64::MAX, |t| t.0), Ordering::Relaxed);
    }

    /// Moves the clock to `t`, and always forward: a timer that is due but was not handled
    /// (nothing entered its state machine) must not stall the loop.
    fn jump_to(&self, t: Time) {
        self.clock.set(t.max(Time(self.clock.now().0 + 1)));
    }

    /// The earliest timer of any adapter (the device's, the OS's), an engine's busy period
    /// ending included.
    #[inline]
    pub(crate) fn next_timer(&self) -> Option<Time> {
        self.quiet_until(self.clock.now()).or_else(|| self.find_next_timer())
    }

    /// [`SimWorld::next_timer`], asked of every adapter.
    fn find_next_timer(&self) -> Option<Time> {
        let mut next: Option<Time> = None;
        self.each(|m| {
            // The OS's timer as of its last entry: only an entry changes it.
            // Relaxed: see `Inner::os_deadline`.
            let os = Some(m.os_deadline.load(Ordering::Relaxed)).filter(|&t| t != u64::MAX).map(Time);
            for t in [m.gpu.lock().poll_timeout(), os, m.line.next_delivery()].into_iter().flatten() {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        });
        next
    }

    /// The earliest end of an engine's modelled busy period on any adapter.
    fn next_busy(&self) -> Option<Time> {
        let mut next: Option<Time> = None;
        self.each(|m| {
            if let Some(t) = m.gpu.lock().busy_until() {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        });
        next
    }
}

/// Marks the world changed when dropped (at the end of a step, however it ends).
struct Changed<'a>(&'a SimWorld);

impl Drop for Changed<'_> {
    fn drop(&mut self) {
        self.0.changed();
    }
}

/// The most steps [`SimWorld`] takes at one time before it gives up on settling (a queue
/// spinning on a `WAIT`, an endless kernel).
const SETTLE_STEPS: usize = 100_000;

/// The most virtual time a [`Inner::block`] with no timeout waits on the deterministic driver:
/// longer means nothing in the system will satisfy it (a deadlock, or an endless kernel), and
/// it returns timed out instead of spinning forever.
const DEADLOCK_HORIZON: Duration = Duration::from_secs(60);

/// Unparks the firmware thread.
#[derive(Default)]
pub(crate) struct ThreadWaker {
    pub(crate) thread: Mutex<Option<std::thread::Thread>>,
}

impl DeviceWaker for ThreadWaker {
    fn wake(&self) {
        if let Some(t) = self.thread.lock().as_ref() {
            t.unpark();
        }
    }
}

/// One adapter: its kernel, its device, and the driver around them.
pub(crate) struct Inner {
    pub(crate) os: Mutex<Os>,
    pub(crate) trace: SharedTrace,
    pub(crate) gpu: Arc<Mutex<Gpu>>,
    pub(crate) line: InterruptLine,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) driver: Driver,
    /// Signalled when CPU waits complete (the waiting threads re-check under the OS lock).
    waits_cv: Condvar,
    /// Wakers of waits whose waiter is not (only) blocked on `waits_cv`: a daemon's client
    /// process sleeping on a futex of its own ([`super::ProcessPort::call_waking`]).
    /// Registered under the OS lock when the wait blocks, so no decision can precede it; woken
    /// (and removed) by whichever thread acts on the decision.
    wakers: Mutex<abi::slab::KeyMap<WaitId, std::task::Waker>>,
    /// Signalled when the kernel-mode scheduler may have work.
    km_cv: Condvar,
    /// Whether the device last reported every engine in F1 (the OS hears only changes).
    was_asleep: AtomicBool,
    /// The machine's cross-adapter layer, for the OS's `Propagate` outputs.
    pub(crate) cross: Mutex<Option<(Arc<crate::cross::CrossAdapter>, crate::cross::AdapterId)>>,
    /// The OS's next timer ([`Os::poll_timeout`], ns; `u64::MAX`: none), refreshed after every
    /// OS entry (nothing else changes it), so that a pump beside a busy engine enters the OS
    /// when a timer (the TDR timer) is due, and the deterministic driver finds the next
    /// event, without taking the OS lock to find out.
    os_deadline: AtomicU64,
    /// Whether kernel-mode submissions wait on software queues ([`Os::has_km_work`]), refreshed
    /// with `os_deadline`: without them a kernel-mode scheduler pass moves nothing.
    km_work: AtomicBool,
    /// The device's attention register: while the kernel waits for the device lock, the pump
    /// stays off it.
    attention: gpu::Attention,
    /// The system calls the live firmware thread made on purpose: a yield now and then while
    /// idle, a park while every engine is in F1. Its only ones: the data path (latching a
    /// doorbell, executing, writing fences) makes none, which the daemon's tests check
    /// against the kernel's own count of the thread's calls.
    pub(crate) fw_calls: Arc<AtomicU64>,
}

/// What one pump did.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Pump {
    pub(crate) work: bool,
    pub(crate) asleep: bool,
}

impl Inner {
    pub(crate) fn new(
        os: Os,
        trace: SharedTrace,
        gpu: Arc<Mutex<Gpu>>,
        line: InterruptLine,
        clock: Arc<dyn Clock>,
        driver: Driver,
    ) -> Inner {
        let attention = gpu.lock().attention();
        let os_deadline = AtomicU64::new(os.poll_timeout().map_or(u64::MAX, |t| t.0));
        let km_work = AtomicBool::new(os.has_km_work());
        Inner {
            os: Mutex::new(os),
            trace,
            gpu,
            line,
            clock,
            driver,
            waits_cv: Condvar::new(),
            wakers: Mutex::new(abi::slab::KeyMap::default()),
            km_cv: Condvar::new(),
            was_asleep: AtomicBool::new(false),
            cross: Mutex::new(None),
            os_deadline,
            km_work,
            attention,
            fw_calls: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Runs one input of the OS at the current time, then acts on what it asked for.
    pub(crate) fn call<T>(&self, f: impl FnOnce(&mut Os, Time) -> T) -> T {
        let mut outputs = Vec::new();
        let r = {
            let mut os = crate::spin::lock_soon(&self.os);
            let now = self.clock.now();
            os.at(now);
            let r = f(&mut os, now);
            while let Some(o) = os.poll_output() {
                outputs.push(o);
            }
            // Relaxed: hints for the pump and the deterministic driver; the timer and the
            // software queues themselves are handled under the OS lock.
            self.os_deadline.store(os.poll_timeout().map_or(u64::MAX, |t| t.0), Ordering::Relaxed);
            self.km_work.store(os.has_km_work(), Ordering::Relaxed);
            r
        };
        if let Driver::Sim { world, .. } = &self.driver {
            world.changed();
        }
        self.act(outputs);
        r
    }

    /// [`Inner::call`] for a process's call: refused once the process has ended.
    pub(crate) fn call_as<T>(
        &self,
        pid: ProcessId,
        f: impl FnOnce(&mut Os, Time) -> Result<T, KernelError>,
    ) -> Result<T, KernelError> {
        self.call(|os, now| if os.has_process(pid) { f(os, now) } else { Err(KernelError::ProcessTerminated(pid)) })
    }

    /// Acts on the OS's outputs, with its lock released.
    fn act(&self, outputs: Vec<Output>) {
        let mut woke = false;
        for o in outputs {
            match o {
                Output::WaitCompleted(id) => {
                    // The waiter's own waker first: it sleeps in another process, and this
                    // is the shortest path to it (the blocked thread below wakes anyway, to
                    // end the wait and answer).
                    if let Some(w) = self.take_waker(id) {
                        w.wake();
                    }
                    if !woke {
                        woke = true;
                        self.waits_cv.notify_all();
                    }
                }
                Output::SchedulerWork => {
                    self.km_cv.notify_all();
                }
                Output::Propagate(fence) => {
                    let cross = self.cross.lock().clone();
                    if let Some((x, me)) = cross {
                        x.propagate(fence, me);
                    }
                }
            }
        }
    }

    /// One turn of the device: latch doorbells, step engines, timers, interrupts.
    pub(crate) fn pump(&self) -> Pump {
        self.pump_with(true)
    }

    /// [`Inner::pump`]; `poll`: whether the device looks at its doorbells first (the
    /// deterministic driver skips it when no client can have rung since the last look).
    pub(crate) fn pump_with(&self, poll: bool) -> Pump {
        // The kernel waits for the device lock (a preemption request, a reset): let it have it.
        if self.attention.is_raised() {
            std::hint::spin_loop();
            return Pump { work: true, asleep: false };
        }
        let (report, asleep, raised) = {
            // Only tried: a holder is a DDI (which raised the attention and is about to be
            // done) or a tool; parking on the lock would cost a wake-up, tens of microseconds
            // of the engines' time on every DDI.
            let Some(mut g) = self.gpu.try_lock() else {
                std::hint::spin_loop();
                return Pump { work: true, asleep: false };
            };
            if poll {
                g.poll_doorbells();
            }
            // Timestamps read the clock as they execute (after the doorbell was latched).
            let clock = || self.clock.now();
            let report = g.step_with_clock(&clock);
            let now = self.clock.now();
            if g.poll_timeout().is_some_and(|t| now >= t) {
                g.handle_timeout(now);
            }
            let raised = self.line.raise_from(&mut g, now);
            (report, g.all_asleep(), raised)
        };
        // The OS hears of an idle-state change, and while the device sleeps its D3 timer
        // runs; otherwise only interrupts bring the pump into the OS (a busy engine's pump
        // stays off the OS lock).
        let changed = self.was_asleep.swap(asleep, Ordering::Relaxed) != asleep;
        // Relaxed: see `os_deadline`.
        let os_due = self.clock.now().0 >= self.os_deadline.load(Ordering::Relaxed);
        // (The OS drains what is delivered each time it is entered, so on a line that delivers
        // at once nothing waits on it unless this pump raised it; a modelled line is asked.)
        let delivered = raised > 0 || (self.line.models_delivery() && self.line.due(self.clock.now()));
        let mut serviced = 0;
        if delivered || changed || asleep || os_due {
            serviced = self.call(|os, now| {
                let n = os.handle_interrupts(now);
                os.handle_device_idle(asleep, now);
                os.handle_timeout(now);
                n
            });
        }
        // Progress only: a queue blocked in a WAIT re-checks every pump but moves nothing. An
        // interrupt raised, or serviced (a modelled line delivers it later), is progress.
        let work = report.packets > 0
            || report.instructions > 0
            || report.bytes > 0
            || report.hardware > 0
            || raised > 0
            || serviced > 0;
        Pump { work, asleep }
    }

    /// Deterministic driver: whether a step of this adapter at `now` would do nothing — the
    /// device waits for its busy engines ([`Gpu::waits_for_busy_engines`]), no OS timer is due,
    /// the OS was not told the device sleeps, and no kernel-mode submission waits for the
    /// scheduler — exactly the conditions under which [`Inner::pump_with`] without a doorbell
    /// scan and [`Inner::run_scheduler`] change nothing.
    fn waits_for_busy_engines(&self, now: Time) -> bool {
        // Relaxed: the deterministic driver's own hints (see the fields).
        !self.attention.is_raised()
            && !self.line.due(now)
            && !self.was_asleep.load(Ordering::Relaxed)
            && now.0 < self.os_deadline.load(Ordering::Relaxed)
            && !self.km_work.load(Ordering::Relaxed)
            && self.gpu.try_lock().is_some_and(|g| g.waits_for_busy_engines(now))
    }

    /// One pass of the kernel-mode scheduler.
    pub(crate) fn run_scheduler(&self) -> crate::os::SchedulerPass {
        self.call(|os, now| os.run_scheduler(now))
    }

    /// Blocks the scheduler worker until there may be new work or `timeout` passes; returns at
    /// once if the work generation moved since `seen` (so no wake-up is lost).
    pub(crate) fn wait_for_km_work(&self, seen: u64, timeout: Duration) {
        let mut os = self.os.lock();
        if os.km_generation() == seen {
            self.km_cv.wait_for(&mut os, timeout);
        }
    }

    /// Registers `waker` for wait `id`: woken when the OS decides the wait. Call under the OS
    /// lock, in the call that began the wait (so the decision cannot come first).
    pub(crate) fn set_waker(&self, id: WaitId, waker: &std::task::Waker) {
        self.wakers.lock().insert(id, waker.clone());
    }

    /// Removes wait `id`'s waker, if it has one still.
    pub(crate) fn take_waker(&self, id: WaitId) -> Option<std::task::Waker> {
        let mut w = self.wakers.lock();
        if w.is_empty() { None } else { w.remove(&id) }
    }

    /// Blocks until wait `id` is decided or `timeout` passes.
    pub(crate) fn block(&self, id: WaitId, timeout: Option<Duration>) {
        match &self.driver {
            Driver::Live { .. } => {
                let deadline = timeout.map(|t| Instant::now() + t);
                let mut os = self.os.lock();
                while !os.wait_done(id) {
                    match deadline {
                        Some(d) => {
                            if self.waits_cv.wait_until(&mut os, d).timed_out() {
                                return;
                            }
                        }
                        None => self.waits_cv.wait(&mut os),
                    }
                }
            }
            Driver::Sim { world, .. } => {
                let clock = &world.clock;
                // With no timeout, give up after the deadlock horizon: nothing in the system
                // will satisfy the wait. Busy engines do not hold the horizon off: an endless
                // kernel beside a wait that nothing signals is still a deadlock for the wait.
                let deadline = clock.now().plus(timeout.unwrap_or(DEADLOCK_HORIZON));
                loop {
                    if self.os.lock().wait_done(id) {
                        return;
                    }
                    if world.step() {
                        continue;
                    }
                    if clock.now() >= deadline {
                        return;
                    }
                    // Nothing moves at this instant: jump to the next event (an engine's
                    // modelled work ending, a timer) or the deadline.
                    world.jump_to(world.next_timer().map_or(deadline, |t| t.min(deadline)));
                }
            }
        }
    }

    pub(crate) fn is_sim(&self) -> bool {
        matches!(self.driver, Driver::Sim { .. })
    }

    /// Stops and joins the live threads.
    pub(crate) fn stop(&self) {
        if let Driver::Live { stop, threads, fw_thread } = &self.driver {
            // Release: pairs with the threads' acquire loads.
            stop.store(true, Ordering::Release);
            fw_thread.wake();
            self.km_cv.notify_all();
            let me = std::thread::current().id();
            for t in threads.lock().drain(..) {
                if t.thread().id() != me {
                    let _ = t.join();
                }
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop();
    }
}

impl crate::cross::Peer for Inner {
    fn notify_current_value(&self, local: u64) {
        self.call(|os, now| os.notify_current_value(local, now));
    }
}

pub(crate) fn firmware_thread(inner: std::sync::Weak<Inner>, stop: Arc<AtomicBool>) {
    let mut idle_spins = 0u32;
    let Some(calls) = inner.upgrade().map(|s| s.fw_calls.clone()) else { return };
    // Relaxed: a statistic.
    let count_call = || calls.fetch_add(1, Ordering::Relaxed);
    // Acquire: pairs with the release store in `Inner::stop`.
    while !stop.load(Ordering::Acquire) {
        let Some(sys) = inner.upgrade() else { return };
        let p = sys.pump();
        drop(sys);
        if p.asleep {
            count_call();
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
                count_call();
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

pub(crate) fn scheduler_thread(inner: std::sync::Weak<Inner>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Acquire) {
        let Some(sys) = inner.upgrade() else { return };
        let pass = sys.run_scheduler();
        if !pass.moved {
            // Ring space frees without a notification: poll soon. Otherwise sleep until new
            // work (a submission, or a fence a held-back submission waits on).
            let timeout = if pass.ring_full { Duration::from_micros(50) } else { Duration::from_millis(50) };
            sys.wait_for_km_work(pass.generation, timeout);
        }
    }
}
