//! What a run writes: `summary.json`, `queues.csv`, `latency.csv`, `timeseries.csv`,
//! `trace.json`.
//!
//! The warm-up (`warmup_ms`) is out of every measured figure: a command buffer submitted in it
//! gives no latency (summary, `queues.csv`'s mean and max, `latency.csv`), and a completion
//! in it counts towards neither throughput nor fairness (`completed_in_window`), whose window
//! is `[warmup, window end)`. Totals (`submissions`, `completions`, `lost`) count everything.
//!
//! Every figure is derived from the [`Outcome`] and the [`Plan`] alone, with integer or
//! fixed-precision formatting and sorted keys, so the same outcome gives the same bytes. The
//! summary also names the build (`version`, and `commit`, embedded when the crate was built:
//! the same for every run of one build). The wall-clock time a run took is the one figure that
//! is not deterministic; it is never written here (the CLI prints it).

use std::fmt::Write as _;

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::run::Outcome;
use crate::scenario::Plan;

/// Percentiles of a sample (nearest rank), in ns.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Jain's fairness index: 1 when all are equal, 1/n when one has everything; `None` where
/// nothing completed (or there is nothing), where fairness is undefined rather than 0.
pub fn jain(xs: &[u64]) -> Option<f64> {
    let n = xs.len() as f64;
    let sum: f64 = xs.iter().map(|&x| x as f64).sum();
    let sq: f64 = xs.iter().map(|&x| (x as f64) * (x as f64)).sum();
    (sq > 0.0).then(|| sum * sum / (n * sq))
}

/// [`jain`] as JSON: rounded, or `null` where undefined.
fn jain_value(xs: &[u64]) -> Value {
    jain(xs).map_or(Value::Null, r4)
}

/// Rounds to 4 decimals (stable text).
fn r4(x: f64) -> Value {
    json!((x * 1e4).round() / 1e4)
}

fn lat_obj(sorted: &[u64]) -> Value {
    json!({
        "samples": sorted.len(),
        "p50_ns": percentile(sorted, 50.0),
        "p90_ns": percentile(sorted, 90.0),
        "p99_ns": percentile(sorted, 99.0),
        "p999_ns": percentile(sorted, 99.9),
        "max_ns": sorted.last().copied().unwrap_or(0),
    })
}

/// The summary's numeric fields a sweep can plot by name (`metrics = [...]`).
pub const METRICS: &[&str] = &[
    "submissions",
    "completions",
    "lost",
    "queues_ended",
    "throughput_per_s",
    "jain_fairness",
    "slot_changes",
    "victimizations",
    "reconnects",
    "connects",
    "interrupts",
    "preemptions",
    "recoveries",
    "faults",
    "events",
    "packets",
];

/// The latency figures of each priority (`latency_by_priority.<priority>.<figure>`), which a
/// sweep's metric names by the figure alone.
pub const LATENCY_METRICS: &[&str] = &["samples", "p50_ns", "p90_ns", "p99_ns", "p999_ns", "max_ns"];

/// The doorbell version this build reports (the workspace's, which the `doorbell` package
/// shares).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit this build was made from (`git rev-parse --short HEAD` at build time, by
/// `build.rs`), or `unknown` where there was no repository.
pub const COMMIT: &str = env!("DOORBELL_COMMIT");

/// The cost model the run used, every `[cost]` key with its value after defaults, in the
/// key's own unit (so it can be pasted back into a scenario).
pub fn cost_model(plan: &Plan) -> Value {
    let ns = |d: std::time::Duration| d.as_nanos() as u64;
    let c = &plan.system.gpu.cost;
    json!({
        "packet_ns": ns(c.packet),
        "bulk_bytes_per_us": c.bulk_bytes_per_us,
        "wave_instruction_ns": ns(c.wave_instruction),
        "bulk_chunk": c.bulk_chunk,
        "turn_us": ns(c.turn) as f64 / 1e3,
        "doorbell_latency_ns": plan.doorbell_latency,
        "interrupt_ns": ns(plan.system.interrupt_delivery),
        "kernel_call_ns": plan.kernel_call,
        "restore_cb_ns": ns(c.restore[0]),
        "restore_packet_ns": ns(c.restore[1]),
        "restore_inside_ns": ns(c.restore[2]),
    })
}

/// The summary object.
pub fn summary(plan: &Plan, o: &Outcome) -> Value {
    let submitted: u64 = o.queues.iter().map(|q| q.submitted).sum();
    let completed: u64 = o.queues.iter().map(|q| q.completed).sum();
    let in_window: u64 = o.queues.iter().map(|q| q.completed_in_window).sum();
    let reconnects: u64 = o.queues.iter().map(|q| q.reconnects).sum();
    // Throughput's window: from the warm-up's end to the submission window's.
    let window_s = o.window_end.saturating_sub(plan.warmup).max(1) as f64 / 1e9;
    let mut per_class = Map::new();
    let mut per_prio: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
    for (gi, g) in plan.groups.iter().enumerate() {
        let mut l = o.latencies[gi].clone();
        l.sort_unstable();
        let fair: Vec<u64> = o.queues.iter().filter(|q| q.group == gi).map(|q| q.completed_in_window).collect();
        let mut obj = lat_obj(&l);
        obj["queues"] = json!(g.count);
        obj["jain_fairness"] = jain_value(&fair);
        obj["completed"] = json!(o.queues.iter().filter(|q| q.group == gi).map(|q| q.completed).sum::<u64>());
        obj["latency_split"] = latency_split(o.latency_split.get(gi).into_iter());
        per_class.insert(g.name.clone(), obj);
        per_prio.entry(format!("{:?}", g.priority).to_lowercase()).or_default().extend_from_slice(&o.latencies[gi]);
    }
    let mut prio = Map::new();
    for (k, mut v) in per_prio {
        v.sort_unstable();
        prio.insert(k, lat_obj(&v));
    }
    let all: Vec<u64> = o.queues.iter().map(|q| q.completed_in_window).collect();
    let occupancy: Vec<Value> = (0..o.engines.len())
        .map(|e| {
            let n = o.samples.len().max(1) as f64;
            let mean = o.samples.iter().map(|s| s.slots_held.get(e).copied().unwrap_or(0) as f64).sum::<f64>() / n;
            json!({ "engine": o.engines[e], "mean_slots_held": r4(mean), "slots": o.slots })
        })
        .collect();
    json!({
        "version": VERSION,
        "commit": COMMIT,
        "cost": cost_model(plan),
        "warmup_ns": plan.warmup,
        "scenario": plan.name,
        "seed": o.seed,
        "queues": o.queues.len(),
        "window_ns": o.window_end,
        "end_ns": o.end,
        "submissions": submitted,
        "completions": completed,
        "lost": submitted - completed,
        "queues_ended": o.queues.iter().filter(|q| q.ended.is_some()).count(),
        "throughput_per_s": r4(in_window as f64 / window_s),
        "latency_by_priority": Value::Object(prio),
        "latency_by_class": Value::Object(per_class),
        "latency_split": latency_split(o.latency_split.iter()),
        "latency_rows": o.latency_rows.rows().len(),
        "latency_rows_stride": o.latency_rows.stride(),
        "latency_rows_omitted": o.latency_rows.omitted(),
        "jain_fairness": jain_value(&all),
        "slot_occupancy": occupancy,
        "slot_changes": o.slot_changes,
        "victimizations": o.victimizations,
        "reconnects": reconnects,
        "connects": o.connects,
        "interrupts": o.interrupts,
        "preemptions": o.preemptions,
        "recoveries": o.recoveries,
        "faults": o.faults,
        "events": o.events,
        "packets": o.packets,
    })
}

/// How the latency of the command buffers of `groups` (their summed `Outcome::latency_split`)
/// divides, in total (ns), and as shares of their summed latency: queueing, execution,
/// preempted.
fn latency_split<'a>(groups: impl Iterator<Item = &'a [u64; 3]>) -> Value {
    let [queueing, execution, preempted] = groups.fold([0u64; 3], |a, g| [a[0] + g[0], a[1] + g[1], a[2] + g[2]]);
    let total = (queueing + execution + preempted).max(1) as f64;
    json!({
        "queueing_ns": queueing,
        "execution_ns": execution,
        "preempted_ns": preempted,
        "queueing_share": r4(queueing as f64 / total),
        "execution_share": r4(execution as f64 / total),
        "preempted_share": r4(preempted as f64 / total),
    })
}

/// `latency.csv`: one row per command buffer submitted after the warm-up, in completion
/// order (past `latency_rows` of them, every `latency_rows_stride`-th: [`crate::rows`]; the
/// summary counts those left out): its queue and class,
/// its number on the queue, when it was submitted, started and ended (ns since the run's
/// start), its latency, and the latency's split into queueing, execution and preempted time
/// ([`crate::run::Span`]), which sum to it.
pub fn latency_csv(plan: &Plan, o: &Outcome) -> String {
    let rows = o.latency_rows.rows();
    let mut s = String::with_capacity(64 + 72 * rows.len());
    s.push_str("queue,group,cb,submit_ns,start_ns,end_ns,latency_ns,queueing_ns,execution_ns,preempted_ns\n");
    for r in rows {
        let g = &plan.groups[o.queues[r.queue].group];
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{},{},{},{}",
            r.queue,
            g.name,
            r.cb,
            r.submit,
            r.start,
            r.end,
            r.latency(),
            r.queueing(),
            r.execution,
            r.preempted()
        );
    }
    s
}

/// `queues.csv`: one row per queue; its mean and max latency are of the command buffers it
/// submitted after the warm-up, `completed_in_window` its completions in the measured window.
pub fn queues_csv(plan: &Plan, o: &Outcome) -> String {
    let mut s = String::from(
        "queue,group,index,engine,priority,submitted,completed,completed_in_window,lost,mean_latency_ns,max_latency_ns,reconnects,ended\n",
    );
    for (i, q) in o.queues.iter().enumerate() {
        let g = &plan.groups[q.group];
        let mean = q.latency_sum.checked_div(q.measured).unwrap_or(0);
        let _ = writeln!(
            s,
            "{i},{},{},{},{},{},{},{},{},{mean},{},{},{}",
            g.name,
            q.index,
            o.engines.get(g.engine).map_or("?", String::as_str),
            format!("{:?}", g.priority).to_lowercase(),
            q.submitted,
            q.completed,
            q.completed_in_window,
            q.submitted - q.completed,
            q.latency_max,
            q.reconnects,
            q.ended.as_deref().unwrap_or("").replace(',', ";"),
        );
    }
    s
}

/// `timeseries.csv`: one row per bucket of the time series: its start (ns since the run's
/// start), its width, completions in it, and per engine the hardware slots held at its start
/// and its busy share (device time the engine spent executing in the bucket over the
/// bucket's width, 0 to 1; `gpu::Gpu::engine_busy_ns`).
pub fn timeseries_csv(o: &Outcome) -> String {
    let mut s = String::from("t_ns,width_ns,completions");
    for e in &o.engines {
        let _ = write!(s, ",slots_held:{e}");
    }
    for e in &o.engines {
        let _ = write!(s, ",busy_share:{e}");
    }
    s.push('\n');
    for ((t, width, shares), x) in busy_shares(o).iter().zip(&o.samples) {
        let _ = write!(s, "{t},{width},{}", x.completions);
        for held in &x.slots_held {
            let _ = write!(s, ",{held}");
        }
        for share in shares {
            let _ = write!(s, ",{share:.4}");
        }
        s.push('\n');
    }
    s
}

/// Each bucket of the time series: its start (ns since the run's start), its width, and per
/// engine its busy share (device time the engine spent executing in the bucket over the
/// bucket's width, 0 to 1; the last bucket ends at the run's end).
pub fn busy_shares(o: &Outcome) -> Vec<(u64, u64, Vec<f64>)> {
    let t0 = o.samples.first().map_or(0, |x| x.t);
    let mut out = Vec::with_capacity(o.samples.len());
    for (i, x) in o.samples.iter().enumerate() {
        let (next_t, next_busy) = match o.samples.get(i + 1) {
            Some(n) => (n.t, &n.busy_ns),
            None => ((o.end + t0).max(x.t), &o.busy_end_ns),
        };
        let width = next_t.saturating_sub(x.t);
        let shares = x
            .busy_ns
            .iter()
            .enumerate()
            .map(|(e, busy)| {
                let d = next_busy.get(e).copied().unwrap_or(*busy).saturating_sub(*busy);
                if width == 0 { 0.0 } else { (d as f64 / width as f64).min(1.0) }
            })
            .collect();
        out.push((x.t - t0, width, shares));
    }
    out
}

/// `trace.json`: Chrome/Perfetto trace events.
///
/// - Each traced queue's command buffers are slices from submission to completion, with
///   their queue, class, priority, number on the queue, latency and its split (queueing,
///   execution, preempted; [`crate::run::Span`]) as arguments. A queue with
///   several command buffers outstanding gets one track per outstanding position (`#0`,
///   `#1`, …), so slices on one track never overlap: the format requires slices on a track to
///   nest, and a queue's command buffers overlap without nesting.
/// - Scenario events (kill, hang, suspend, resume, D3 request) and the kernel's notable ones
///   (fault, TDR, reset, victimization, preemption, D3, losses) are instant events: on the
///   queue's first track where the queue is traced, otherwise global.
/// - A counter track per engine: hardware slots held.
pub fn trace_json(plan: &Plan, o: &Outcome) -> String {
    let mut ev = Vec::new();
    ev.push(json!({"name": "process_name", "ph": "M", "pid": 1, "args": {"name": format!("sim: {}", plan.name)}}));
    // (queue, lane) -> tid, in order of first use; each queue's lanes' latest ends.
    let mut tids: BTreeMap<(usize, usize), usize> = BTreeMap::new();
    let mut ends: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
    let tid = |tids: &mut BTreeMap<(usize, usize), usize>, q: usize, lane: usize| {
        let next = tids.len() + 1;
        *tids.entry((q, lane)).or_insert(next)
    };
    let label = |q: usize| {
        let r = &o.queues[q];
        let g = &plan.groups[r.group];
        (format!("{}[{}]", g.name, r.index), g.name.clone(), format!("{:?}", g.priority).to_lowercase())
    };
    let mut slices = Vec::with_capacity(o.spans.len());
    // Spans come in completion order; a queue completes in submission order, so each queue's
    // spans arrive sorted by start and by end, and the first lane free at a start is right.
    for s in &o.spans {
        let lanes = ends.entry(s.queue).or_default();
        let lane = match lanes.iter().position(|&end| end <= s.submit) {
            Some(l) => l,
            None => {
                lanes.push(0);
                lanes.len() - 1
            }
        };
        lanes[lane] = s.end;
        let (_, class, priority) = label(s.queue);
        slices.push(json!({
            "name": "cb", "ph": "X", "pid": 1, "tid": tid(&mut tids, s.queue, lane),
            "ts": s.submit as f64 / 1e3, "dur": (s.end - s.submit) as f64 / 1e3,
            "args": {
                "queue": s.queue, "class": class, "priority": priority, "cb": s.cb, "latency_ns": s.latency(),
                "queueing_ns": s.queueing(), "execution_ns": s.execution, "preempted_ns": s.preempted(),
            },
        }));
    }
    let traced: std::collections::BTreeSet<usize> = o.traced_queues.iter().copied().collect();
    let mut instants = Vec::with_capacity(o.marks.len());
    for m in &o.marks {
        let mut e = json!({
            "name": m.kind, "ph": "i", "pid": 1, "ts": m.t as f64 / 1e3, "args": {"what": m.text},
        });
        match m.queue.filter(|q| traced.contains(q)) {
            Some(q) => {
                e["s"] = json!("t");
                e["tid"] = json!(tid(&mut tids, q, 0));
            }
            None => e["s"] = json!("g"),
        }
        instants.push(e);
    }
    // Every traced queue has its first track, even with nothing completed (a hung queue).
    for &q in &o.traced_queues {
        tid(&mut tids, q, 0);
    }
    for (&(q, lane), &t) in &tids {
        let (name, _, _) = label(q);
        ev.push(
            json!({"name": "thread_name", "ph": "M", "pid": 1, "tid": t, "args": {"name": format!("{name} #{lane}")}}),
        );
        ev.push(json!({"name": "thread_sort_index", "ph": "M", "pid": 1, "tid": t, "args": {"sort_index": q * 4096 + lane}}));
    }
    ev.extend(slices);
    ev.extend(instants);
    for s in &o.samples {
        for (e, held) in s.slots_held.iter().enumerate() {
            ev.push(json!({
                "name": format!("slots held: {}", o.engines[e]), "ph": "C", "pid": 1,
                "ts": s.t as f64 / 1e3, "args": {"held": held},
            }));
        }
    }
    let v = json!({ "traceEvents": ev, "displayTimeUnit": "ns" });
    v.to_string()
}

#[cfg(test)]
mod tests {
    use super::jain;

    #[test]
    fn jain_is_one_when_equal_one_over_n_when_one_has_all_and_undefined_when_none_completed() {
        assert_eq!(jain(&[5, 5, 5, 5]), Some(1.0));
        assert_eq!(jain(&[8, 0, 0, 0]), Some(0.25));
        let j = jain(&[1, 2, 3]).unwrap();
        assert!((j - 36.0 / 42.0).abs() < 1e-12, "{j}");
        assert_eq!(jain(&[0, 0]), None, "nothing completed: undefined, not 0");
        assert_eq!(jain(&[]), None);
    }
}
