//! The retire step: the completions the device recorded at an instant, mapped to the
//! runner's queues, shown to the observer, and retired — each command buffer's span
//! accounted (latency, its split, the window's counts, the trace, the series), a closed
//! loop's next submission scheduled, CPU waiters woken, a backlog let go.
//!
//! Invariants: a completion record retires every outstanding command buffer of its queue up
//! to its progress value, oldest first, each exactly once; a record that names a queue no
//! longer known (a stale device id) retires nothing.

use abi::port::KernelPort;

use super::events::Ev;
use super::outcome::Span;
use super::state::{Acc, Clients, Clock, Runner, Stack, with_world};
use super::submit::look;
use crate::observe::Record;
use crate::scenario::{Load, Plan};

/// The most spans trace.json holds.
const TRACE_SPANS: usize = 200_000;

impl Runner<'_, '_> {
    /// Reads the device's completions, shows them to the observer, retires them, and shows
    /// the observer the instant.
    #[inline]
    pub(super) fn retire(&mut self, now: u64) {
        let Runner { plan, stack, clients, clock, acc, observer, .. } = self;
        let t0 = stack.t0;
        stack.sys.take_completions(&mut acc.comps);
        for c in acc.comps.drain(..) {
            let bits = c.queue.to_bits();
            let Some(Some((fw, i))) = stack.fw_map.get((bits & 0xffff_ffff) as usize).copied() else { continue };
            if fw == bits {
                acc.records.push(Record {
                    queue: i,
                    value: c.value,
                    at: c.at.0 - t0,
                    started: c.started.0.saturating_sub(t0),
                    execution: c.exec_ns,
                });
            }
        }
        if let Some(o) = observer.as_deref_mut()
            && !acc.records.is_empty()
        {
            o.completions(now - t0, &mut acc.records);
        }
        let mut records = std::mem::take(&mut acc.records);
        let watched = observer.is_some();
        for c in records.drain(..) {
            retire_one(plan, stack, clients, clock, acc, c, watched);
        }
        acc.records = records;
        if let Some(o) = observer.as_deref_mut() {
            stack.sys.take_fence_signals(&mut acc.signals);
            if !acc.signals.is_empty() {
                o.fence_signals(now - t0, &acc.signals);
                acc.signals.clear();
            }
            for look in acc.wait_ends.drain(..) {
                o.cpu_wait(now - t0, &look);
            }
            with_world(stack, clients, |world| o.instant(now - t0, world));
        }
    }
}

/// Retires what completion record `c` ends; with an observer `watched`, the CPU waits it ends
/// are kept for it.
#[inline]
fn retire_one(
    plan: &Plan,
    stack: &Stack,
    clients: &mut Clients,
    clock: &mut Clock,
    acc: &mut Acc,
    c: Record,
    watched: bool,
) {
    let (t0, i) = (stack.t0, c.queue);
    let q = &mut clients.qs[i];
    let at = c.at + t0;
    acc.last_completion = acc.last_completion.max(at);
    // The record's split is its command buffer's (one progress value each).
    let mut split = Some((c.started, c.execution));
    while let Some(&(v, t, np)) = q.outstanding.front() {
        if v > c.value {
            break;
        }
        q.outstanding.pop_front();
        if q.q.is_some() {
            clients.in_flight -= 1;
        }
        let (start, execution) = split.take().unwrap_or((c.at, 0));
        let span = Span::new(i, v, t - t0, start, c.at, execution);
        let lat = span.latency();
        q.res.completed += 1;
        acc.completions_total += 1;
        acc.packets += np as u64;
        // Throughput and fairness count completions in [warm-up end, window end).
        if stack.window_end.is_none_or(|w| at < w) && !stopped_before(clock.stop_time, at) && c.at >= plan.warmup {
            q.res.completed_in_window += 1;
        }
        // warmup_ms: a command buffer submitted in the warm-up gives no latency figure.
        if span.submit >= plan.warmup {
            q.res.measured += 1;
            q.res.latency_sum += lat;
            q.res.latency_max = q.res.latency_max.max(lat);
            acc.latencies[q.group].push(lat);
            let split = &mut acc.latency_split[q.group];
            split[0] += span.queueing();
            split[1] += span.execution;
            split[2] += span.preempted();
            acc.latency_rows.push(span);
        }
        if q.traced && acc.spans.len() < TRACE_SPANS {
            acc.spans.push(span);
        }
        // Its bucket by its own time (it may lie ahead of the clock: the engine ran it from
        // the step's start).
        acc.counts.add(at - t0);
        if let Load::Closed { think, .. } = plan.groups[q.group].load
            && !clock.stopped
        {
            clock.events.push(at + think, Ev::Submit(i, None));
        }
    }
    // CPU waits for what completed end (the waiter wakes and goes away).
    while q.waits.front().is_some_and(|(v, _)| *v <= c.value) {
        let w = q.waits.pop_front().expect("checked");
        let pid = clients.procs[q.client].port.process();
        let r = stack.sys.end_fence_wait(pid, &w.1);
        if watched {
            acc.wait_ends.push(look(i, q, &w, Some(r)));
        }
    }
    // Space freed: a backlog submission goes now (at the completion's time).
    if !q.backlog.is_empty() && q.outstanding.len() < q.cap {
        clock.events.push(at, Ev::Drain(i));
    }
}

fn stopped_before(stop_time: u64, at: u64) -> bool {
    at > stop_time
}
