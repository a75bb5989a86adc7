//! `trace.json` is valid for Perfetto (slices on one track never overlap without nesting),
//! carries arguments, and shows what a researcher looks for: every class, the queues that
//! scenario events name (the hung one), and instant markers for those events and the
//! kernel's notable ones (TDR, reset).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

fn trace_of(example: &str) -> Value {
    let plan = sim::Scenario::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/sim").join(example))
        .unwrap_or_else(|e| panic!("{e}"));
    let o = sim::run(&plan, plan.seed, &mut |_| {}).unwrap();
    serde_json::from_str(&sim::output::trace_json(&plan, &o)).unwrap()
}

/// Per track, slices sorted by start must each end before the next starts, or contain it
/// entirely (nesting). Times are read as Perfetto's importer reads them: microseconds
/// rounded to whole nanoseconds. Returns the number of slices checked.
fn check_nesting(v: &Value) -> usize {
    let ns = |x: &Value| (x.as_f64().unwrap() * 1e3).round() as i64;
    let mut tracks: BTreeMap<(u64, u64), Vec<(i64, i64)>> = BTreeMap::new();
    for e in v["traceEvents"].as_array().unwrap() {
        if e["ph"] == "X" {
            let ts = ns(&e["ts"]);
            tracks
                .entry((e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap()))
                .or_default()
                .push((ts, ts + ns(&e["dur"])));
        }
    }
    let mut n = 0;
    for (track, mut slices) in tracks {
        slices.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        let mut open: Vec<i64> = Vec::new(); // ends of the enclosing slices
        for (start, end) in slices {
            while open.last().is_some_and(|&e| e <= start) {
                open.pop();
            }
            if let Some(&outer) = open.last() {
                assert!(
                    end <= outer,
                    "track {track:?}: [{start}, {end}) overlaps a slice ending at {outer} without nesting"
                );
            }
            open.push(end);
            n += 1;
        }
    }
    n
}

fn track_names(v: &Value) -> Vec<String> {
    v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .map(|e| e["args"]["name"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn smoke_trace_nests_on_every_track_and_shows_every_class_with_arguments() {
    let v = trace_of("smoke.toml");
    assert!(check_nesting(&v) > 100);
    let names = track_names(&v);
    assert!(names.iter().any(|n| n.starts_with("normal[0] #1")), "outstanding 2: a second track: {names:?}");
    assert!(names.iter().any(|n| n.starts_with("high[0] #0")), "the one high-priority queue is traced: {names:?}");
    let slices: Vec<&Value> = v["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "X").collect();
    for k in ["queue", "class", "priority", "cb", "latency_ns", "queueing_ns", "execution_ns", "preempted_ns"] {
        assert!(!slices[0]["args"][k].is_null(), "{k} missing: {}", slices[0]);
    }
    // Every slice's latency is its duration, and splits into queueing, execution and
    // preempted time; some command buffers of this scenario were switched out part-way.
    let arg = |e: &Value, k: &str| e["args"][k].as_u64().unwrap_or_else(|| panic!("{k}: {e}"));
    for e in &slices {
        let split = arg(e, "queueing_ns") + arg(e, "execution_ns") + arg(e, "preempted_ns");
        assert_eq!(split, arg(e, "latency_ns"), "{e}");
        assert_eq!((e["dur"].as_f64().unwrap() * 1e3).round() as u64, arg(e, "latency_ns"), "{e}");
    }
    assert!(slices.iter().any(|e| arg(e, "preempted_ns") > 0));
}

#[test]
fn the_hung_queue_is_traced_with_its_hang_and_the_reset_marked() {
    let v = trace_of("hung-kernel.toml");
    check_nesting(&v);
    let names = track_names(&v);
    assert!(names.iter().any(|n| n.starts_with("victim[0]")), "{names:?}");
    let kinds: Vec<&str> = v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "i")
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    for k in ["hang", "tdr", "reset"] {
        assert!(kinds.contains(&k), "no {k} marker in {kinds:?}");
    }
    // The hang is on the hung queue's own track.
    let hang = v["traceEvents"].as_array().unwrap().iter().find(|e| e["name"] == "hang").unwrap();
    assert_eq!(hang["s"], "t");
}
