//! The advance step, and the world at an instant: the time series' buckets opened up to the
//! clock, the world run (after the device heard the doorbells rung since it last ran), the
//! window's end, progress, and the clock moved to the earliest next event of either side.
//!
//! Invariants: the world runs once per instant before the clients act, and once more after
//! them if they did anything; the clock never moves backwards, and it stops at every event
//! of either side, at every series bucket and at the window's end.

use std::collections::VecDeque;

use abi::Time;
use kernel::System;

use super::events::Events;
use super::outcome::Sample;
use super::state::{Bells, Runner, engine_state};
use crate::observe::Observer;

/// Instants between two looks at the progress (a look costs a division, and the bar moves by
/// hundredths).
const PROGRESS_EVERY: u32 = 64;

/// What [`Runner::advance`] did.
pub(super) enum Advance {
    /// The clock moved to the next event (or nothing will ever happen again, and submission
    /// stopped): the loop goes on.
    Moved,
    /// The run is over.
    Over,
}

impl Runner<'_, '_> {
    /// Opens the series' buckets up to `now`, each with the engines' state at its start.
    #[inline]
    pub(super) fn open_buckets(&mut self, now: u64) {
        if now < self.acc.next_bucket {
            return;
        }
        let (acc, t0) = (&mut self.acc, self.stack.t0);
        let samples_wanted = self.plan.samples as u64;
        while acc.series.last().is_none_or(|s| s.t + acc.bucket <= now) {
            let t = acc.series.last().map_or(t0, |s| s.t + acc.bucket);
            let (slots_held, busy_ns) = engine_state(&self.stack.sys, self.stack.engines.len(), t);
            acc.series.push(Sample { t, completions: 0, slots_held, busy_ns });
            if self.plan.duration.is_none() && acc.series.len() as u64 > 2 * samples_wanted {
                // Merge pairs: the bucket doubles.
                let old = std::mem::take(&mut acc.series);
                acc.series.extend(old.chunks(2).map(|pair| pair[0].clone()));
                acc.counts.double();
                acc.bucket *= 2;
            }
        }
        acc.next_bucket = acc.series.last().map_or(t0, |s| s.t + acc.bucket);
    }

    /// The world at this instant, unless it just ran (after the clients' last events).
    #[inline]
    pub(super) fn run_world_once(&mut self, now: u64) {
        if !self.clock.world_ran {
            run_world(&self.stack.sys, now, &self.clock.events, &mut self.bells);
        }
        self.clock.world_ran = false;
    }

    /// The submission window is half-open, [start, start + duration): at its end nothing more
    /// is submitted, whatever else is due at that instant (a 100 µs period over 1 ms submits
    /// 10 times, not 11).
    #[inline]
    pub(super) fn stop_at_window_end(&mut self, now: u64) {
        if !self.clock.stopped && self.stack.window_end.is_some_and(|w| now >= w) {
            self.clock.stop(now);
        }
    }

    /// Whether the run is over: submission stopped, and the drain ended or nothing is in
    /// flight.
    #[inline]
    pub(super) fn drained(&self, now: u64) -> bool {
        let (clock, clients) = (&self.clock, &self.clients);
        debug_assert_eq!(clients.in_flight == 0, clients.qs.iter().all(|q| q.q.is_none() || q.outstanding.is_empty()));
        clock.stopped && (now >= clock.stop_time.saturating_add(self.plan.drain) || clients.in_flight == 0)
    }

    /// Progress, now and then.
    #[inline]
    pub(super) fn progress(&mut self, now: u64, progress: &mut dyn FnMut(f64)) {
        let clock = &mut self.clock;
        if clock.progress_in > 0 {
            clock.progress_in -= 1;
            return;
        }
        clock.progress_in = PROGRESS_EVERY;
        let t0 = self.stack.t0;
        let frac = match (self.stack.window_end, self.plan.submissions) {
            (Some(w), _) => (now - t0) as f64 / (w - t0).max(1) as f64,
            (None, Some(n)) => self.clients.tally.submitted as f64 / n as f64,
            _ => 0.0,
        }
        .min(1.0);
        if frac - clock.last_progress >= 0.01 {
            clock.last_progress = frac;
            progress(frac);
        }
    }

    /// Moves the clock to the next event of either side: the world's, the clients', a ring
    /// heard, the observer's wake-up, the window's end, the drain's end.
    #[inline]
    pub(super) fn advance(&mut self, now: u64) -> Advance {
        let (stack, clock) = (&self.stack, &mut self.clock);
        let mut next = stack.sys.next_event().map_or(u64::MAX, |t| t.0);
        if let Some(t) = clock.events.next_time() {
            next = next.min(t);
        }
        if let Some(&(t, _)) = self.bells.unheard.front() {
            next = next.min(t);
        }
        if let Some(t) = self.observer.as_deref().and_then(Observer::wake_at) {
            next = next.min(t.saturating_add(stack.t0).max(now + 1));
        }
        if let Some(w) = stack.window_end
            && !clock.stopped
        {
            next = next.min(w);
        }
        if clock.stopped {
            next = next.min(clock.stop_time.saturating_add(self.plan.drain));
        }
        if next == u64::MAX {
            if clock.stopped {
                return Advance::Over;
            }
            // Nothing will ever happen again (every queue ended).
            clock.stop(now);
            return Advance::Moved;
        }
        stack.sys.advance_to(Time(next.max(now + 1)));
        Advance::Moved
    }

    /// While the world waits for its busy engines (a quiet period), and nothing else of the
    /// runner's is due before (a series bucket, the window's end, a ring heard later), the
    /// next instant is the clients' next event, and the world has nothing to do at it before
    /// they act: the time of that event, to go straight to.
    #[inline]
    pub(super) fn quiet_skip(&self) -> Option<u64> {
        let quiet = self.stack.sys.quiet_until()?;
        if self.clock.stopped {
            return None;
        }
        let t = self.clock.events.next_time()?;
        (t < quiet.0
            && t < self.acc.next_bucket
            && self.stack.window_end.is_none_or(|w| t < w)
            && self.bells.unheard.front().is_none_or(|&(u, _)| u > t))
        .then_some(t)
    }
}

/// A ring made at `now` that the device hears at `at`: heard now (no doorbell latency, no
/// kernel call before it), it joins the rings the world looks at before time moves on;
/// otherwise it waits its turn in `unheard`. (While the clients act at an instant, nothing
/// heard by then waits in `unheard`: the world took those before the clients acted.)
#[inline]
pub(super) fn ring(bells: &mut Bells, now: u64, at: u64, queue: u64) {
    debug_assert!(bells.unheard.front().is_none_or(|&(t, _)| t > now), "a ring heard earlier still waits");
    if at <= now {
        bells.rang.push(queue);
    } else {
        heard_in_order(&mut bells.unheard, at, queue);
    }
}

/// Runs the world at `now` ([`System::run_instant_after`]) after the device looked at the
/// doorbells it hears by then (the queues submitted to since it last looked: only those can
/// have rung), with the step horizon at the next moment a client acts (a ring heard, a client
/// event): a turn that a ring could cut into ends there, as it would on the live driver.
/// Returns the steps that did something.
#[inline(always)]
pub(super) fn run_world(sys: &System, now: u64, events: &Events, bells: &mut Bells) -> usize {
    while let Some(&(t, queue)) = bells.unheard.front()
        && t <= now
    {
        bells.rang.push(queue);
        bells.unheard.pop_front();
    }
    let next_ring = bells.unheard.front().map_or(u64::MAX, |&(t, _)| t);
    let next_client = events.next_time().map_or(next_ring, |t| t.min(next_ring));
    sys.set_step_horizon((next_client != u64::MAX).then_some(abi::Time(next_client)));
    let steps = sys.run_instant_after(&bells.rang);
    bells.rang.clear();
    steps
}

/// Queues a ring the device notices at `at`, after every ring it notices no later (rings of
/// one latency arrive in the order they were made; a ring after a reconnect call comes later).
fn heard_in_order(unheard: &mut VecDeque<(u64, u64)>, at: u64, queue: u64) {
    if unheard.back().is_none_or(|&(t, _)| t <= at) {
        unheard.push_back((at, queue));
    } else {
        let k = unheard.iter().rposition(|&(t, _)| t <= at).map_or(0, |k| k + 1);
        unheard.insert(k, (at, queue));
    }
}
