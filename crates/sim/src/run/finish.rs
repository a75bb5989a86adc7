//! The finish step: the series' last counts, each queue's lost work and reconnects, the
//! kernel's notable events beside the scenario's, the counters, a quick teardown (with an
//! observer, the world run out of work and the census taken), and the [`Outcome`].
//!
//! Invariants: the run ends when its last event did (the clock, or a completion's modelled
//! end); marks are in time order and at most [`MAX_MARKS`]; every client process ends
//! abnormally, so teardown waits for nothing.

use abi::Time;
use kernel::Termination;

use super::advance::run_world;
use super::events::Events;
use super::outcome::{MAX_MARKS, Mark, Outcome};
use super::state::{Bells, Runner};
use crate::observe::lost_reason;

/// The most instants an observed run's teardown runs the world for its last work.
const TEARDOWN_INSTANTS: usize = 10_000;

impl Runner<'_, '_> {
    /// Ends the run: what it measured (wall-clock figures left at 0 for the caller).
    pub(super) fn finish(mut self) -> Outcome {
        let t0 = self.stack.t0;
        self.close_series();
        // The run ends when the last event did: the clock, or a completion's modelled end.
        let end = self.stack.sys.now().0.max(self.acc.last_completion);
        let engines = self.stack.engines.len();
        let busy_end_ns = self.stack.sys.with_gpu(|g| {
            (0..engines).map(|e| g.engine_busy_ns(abi::EngineId(e as u32), Time(end)).unwrap_or(0)).collect()
        });
        self.settle_queues();
        self.kernel_marks();
        let Runner { plan, seed, stack, mut clients, clock, acc, observer, .. } = self;
        let sys = &stack.sys;
        let stats = sys.stats();
        let fw = sys.with_gpu(|g| g.firmware_counts());
        let (preemptions, recoveries) = (fw.preempts_answered, fw.recoveries());
        let slot_changes: u64 =
            sys.with_gpu(|g| (0..engines).map(|e| g.slot_occupancy(abi::EngineId(e as u32)).map_or(0, |s| s.1)).sum());
        let reconnect_rings: u64 = clients.qs.iter().map(|q| q.res.reconnects).sum();
        let events = clients.tally.submitted
            + reconnect_rings
            + acc.packets
            + slot_changes
            + stats.interrupts
            + clients.tally.fence_signals
            + acc.completions_total;
        // Tear down quickly: abnormal termination skips waiting for anything.
        let mut queues_out = Vec::with_capacity(clients.qs.len());
        for q in clients.qs.iter_mut() {
            q.waits.clear();
            q.q = None;
            q.signal = None;
            q.upstream = None;
            queues_out.push(std::mem::take(&mut q.res));
        }
        for c in clients.procs.iter() {
            if c.alive {
                c.port.terminate(Termination::Abnormal);
            }
        }
        drop(std::mem::take(&mut clients.procs));
        if let Some(o) = observer {
            // Abnormal termination may leave the device work to finish (a queue's removal
            // answered): run the world until it has none, then look at what the kernel holds.
            for _ in 0..TEARDOWN_INSTANTS {
                run_world(sys, sys.now().0, &Events::default(), &mut Bells::default());
                match sys.next_event() {
                    Some(t) => sys.advance_to(Time(t.0.max(sys.now().0 + 1))),
                    None => break,
                }
            }
            o.teardown(sys.now().0 - t0, sys);
        }
        let window_end = stack.window_end.unwrap_or(if clock.stop_time == u64::MAX { end } else { clock.stop_time });
        Outcome {
            name: plan.name.clone(),
            seed,
            queues: queues_out,
            latencies: acc.latencies,
            latency_rows: acc.latency_rows,
            latency_split: acc.latency_split,
            window_end: window_end - t0,
            end: end - t0,
            samples: acc.series,
            bucket: acc.bucket,
            slots: plan.system.gpu.hw_slots,
            engines: stack.engines,
            interrupts: stats.interrupts,
            victimizations: stats.victimizations,
            connects: stats.connects,
            preemptions,
            recoveries,
            faults: stats.faults,
            events,
            packets: acc.packets,
            slot_changes,
            spans: acc.spans,
            traced_queues: stack.traced_queues,
            busy_end_ns,
            marks: acc.marks,
            wall_seconds: 0.0,
            setup_seconds: 0.0,
            run_seconds: 0.0,
        }
    }

    /// The series' completions from the buckets; those past the last sample (the drain's
    /// tail) go to the last bucket.
    fn close_series(&mut self) {
        let (acc, t0) = (&mut self.acc, self.stack.t0);
        let counts = std::mem::take(&mut acc.counts.counts);
        for (i, s) in acc.series.iter_mut().enumerate() {
            s.completions = counts.get(i).copied().unwrap_or(0);
        }
        if let Some(s) = acc.series.last_mut() {
            s.completions += counts.iter().skip(series_len_before(&counts, s.t, t0, acc.bucket)).sum::<u64>();
        }
    }

    /// Lost work: whatever is still outstanding; and each queue's reconnects.
    fn settle_queues(&mut self) {
        for q in self.clients.qs.iter_mut() {
            if !q.outstanding.is_empty() && q.res.ended.is_none() {
                // A queue the kernel reset (a hang, a fault) is lost, and says why; any other
                // queue's work just did not finish in the drain.
                q.res.ended = Some(match q.q.as_ref().and_then(lost_reason) {
                    Some(why) => format!("lost: {why}"),
                    None => "work outstanding at the end of the drain".into(),
                });
            }
            if let Some(queue) = &q.q {
                q.res.reconnects = queue.reconnects();
            }
        }
    }

    /// The kernel's notable events (within its trace window), beside the scenario's, in time
    /// order.
    fn kernel_marks(&mut self) {
        let t0 = self.stack.t0;
        let marks = &mut self.acc.marks;
        let (trace, _) = self.stack.sys.trace();
        for e in trace.iter().filter(|e| e.time.0 >= t0) {
            if let Some(n) = e.event.notable() {
                marks.push(Mark { t: e.time.0 - t0, kind: n.name(), queue: None, text: e.event.to_string() });
            }
        }
        marks.sort_by_key(|m| m.t);
        marks.truncate(MAX_MARKS);
    }
}

/// The index of the first bucket after the one starting at `t`.
fn series_len_before(_counts: &[u64], t: u64, t0: u64, bucket: u64) -> usize {
    ((t - t0) / bucket) as usize + 1
}
