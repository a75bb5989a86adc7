//! The runner: a checked scenario ([`Plan`]) played on the real stack in virtual time.
//!
//! One thread plays every client. It opens processes on a [`kernel::System::sim`], creates
//! devices, contexts and queues through `umd` (user-mode queues ring doorbells, kernel-mode
//! ones call the kernel), and submits command buffers with `umd::Queue::submit`, the spec's
//! submission loop. The firmware, engines and kernel that run the live system run here,
//! stepped by the deterministic driver on its virtual clock.
//!
//! The loop interleaves two event sources in time order: the clients' own (a submission due,
//! a timed event) and the world's (an engine's modelled work ending, a device or kernel
//! timer). At each instant it runs the world until nothing moves ([`kernel::System::run_instant`]),
//! reads the completions the device recorded ([`gpu::Gpu::take_completions`]: each
//! `PROGRESS_FENCE` with its modelled end), retires them (latency = end − submit time; a
//! closed loop schedules its next submission at end + think time), then runs the client
//! events due, then moves the clock to the earliest next event of either side.
//!
//! The code: [`run_observed`] is the loop, over a `Runner` (`state.rs`) whose state is in a
//! few parts — the world it set up, the clients and their queues, the rings on their way, the
//! clock, the outputs being accumulated — and whose steps are a file each: `setup.rs` (build
//! the system, processes and queues; the first events), `advance.rs` (the series' buckets,
//! the world at an instant, the window, the clock's next move), `retire.rs` (completions read
//! and accounted), `submit.rs` (the clients' submissions), `apply.rs` (a scenario event
//! applied) and `finish.rs` (the outputs, and teardown). `events.rs` is the clients' event
//! queue; `outcome.rs` what a run measured.
//!
//! Invariants: everything is ordered by (time, sequence number) and every random draw comes
//! from a per-queue ChaCha stream seeded by (seed, queue index), so the same plan and seed
//! give the same run, byte for byte. A queue never has more command buffers outstanding than
//! its ring holds (open-loop submissions beyond that wait in a client-side backlog, and their
//! latency counts the wait), so a submission never blocks the single client thread.

mod advance;
mod apply;
mod events;
mod finish;
mod outcome;
mod retire;
mod setup;
mod state;
mod submit;

use abi::Time;

pub use outcome::{MAX_MARKS, Mark, Outcome, QueueResult, RunError, Sample, Span};
pub use submit::HUNG_NS;

use advance::{Advance, run_world};
use events::Ev;
use state::Runner;

use crate::observe::Observer;
use crate::scenario::{Load, Plan};

/// Runs `plan` with `seed`; `progress(done_fraction)` is called now and then.
pub fn run(plan: &Plan, seed: u64, progress: &mut dyn FnMut(f64)) -> Result<Outcome, RunError> {
    run_observed(plan, seed, progress, None)
}

/// [`run`], watched by `observer` (see [`crate::observe`]): its hooks see every completion
/// record, submission and instant, and the census at teardown.
pub fn run_observed(
    plan: &Plan,
    seed: u64,
    progress: &mut dyn FnMut(f64),
    observer: Option<&mut dyn Observer>,
) -> Result<Outcome, RunError> {
    let wall = std::time::Instant::now();
    let mut r = Runner::setup(plan, seed, observer)?;
    let setup_seconds = wall.elapsed().as_secs_f64();
    let run_start = std::time::Instant::now();
    r.start();
    loop {
        let now = r.stack.sys.now().0;
        r.open_buckets(now);
        r.run_world_once(now);
        r.retire(now);
        r.stop_at_window_end(now);
        // The clients' events; when the world stepped after them, the instant starts over.
        let Some(now) = r.act(now)? else { continue };
        // Stop submitting at the end of the window.
        r.stop_at_window_end(now);
        if r.drained(now) {
            break;
        }
        r.progress(now, progress);
        if let Advance::Over = r.advance(now) {
            break;
        }
    }
    progress(1.0);
    let run_seconds = run_start.elapsed().as_secs_f64();
    let mut o = r.finish();
    o.wall_seconds = wall.elapsed().as_secs_f64();
    o.setup_seconds = setup_seconds;
    o.run_seconds = run_seconds;
    Ok(o)
}

impl Runner<'_, '_> {
    /// The clients' events due at `now` (the instant took no time), and the instants that
    /// follow while only the clients act. Returns the instant it ended at, or `None` when the
    /// world stepped after the clients acted (the loop runs this instant again from the top).
    #[inline]
    fn act(&mut self, mut now: u64) -> Result<Option<u64>, RunError> {
        loop {
            let mut ran = false;
            while let Some((t, ev)) = self.clock.events.pop_due(now) {
                ran = true;
                self.client_event(t, ev, now)?;
            }
            if ran {
                // The world runs again at this instant, after what the clients did. Unless it
                // steps, that is all (no completion, no new event), and time moves on: the
                // usual instant of a loaded run is a ring latched while the engines run
                // earlier work.
                if run_world(&self.stack.sys, now, &self.clock.events, &mut self.bells) > 0 {
                    self.clock.world_ran = true;
                    return Ok(None);
                }
                // The world waits for its busy engines: straight to the clients' next event.
                if let Some(t) = self.quiet_skip() {
                    self.stack.sys.advance_to(Time(t));
                    now = t;
                    continue;
                }
            }
            return Ok(Some(now));
        }
    }

    /// Client event `ev`, due at `t`, run at `now`.
    #[inline]
    fn client_event(&mut self, t: u64, ev: Ev, now: u64) -> Result<(), RunError> {
        match ev {
            Ev::Arrival(i) => self.arrival(i, t),
            Ev::Submit(i, size) => {
                let closed = matches!(self.plan.groups[self.clients.qs[i].group].load, Load::Closed { .. });
                self.submit_due(i, (closed || size.is_some()).then_some((t, size)), now)?;
            }
            Ev::Drain(i) => self.submit_due(i, None, now)?,
            Ev::Enter(i) => self.enter(i, now)?,
            Ev::Timed(k) => self.timed(k, t)?,
            Ev::Resume(i) => self.resume(i, t),
        }
        Ok(())
    }
}
