//! What a researcher reads (issue 25): `summary.json` names the build and the resolved cost
//! model, and `warmup_ms` keeps the window's start out of the latency statistics.

use std::path::Path;

use sim::{Scenario, run, run_to_dir};

fn plan(text: &str) -> sim::Plan {
    Scenario::parse(Path::new("test.toml"), text).unwrap_or_else(|e| panic!("{e}"))
}

/// One queue over 1 ms that submits a 150 µs synthetic kernel every 100 µs: work piles up,
/// so each command buffer waits longer than the one before and every latency is distinct.
fn backlog(top: &str) -> sim::Plan {
    plan(&format!(
        "duration_ms = 1\n{top}[[group]]\nname = \"tick\"\n[group.workload]\nkind = \"periodic\"\nperiod_us = 100\n[group.commands]\nsynthetic = {{ us = 150 }}\n"
    ))
}

/// Command buffers submitted before the warm-up's end give no latency sample; the run is
/// otherwise the same (they are submitted and complete as before).
#[test]
fn the_warm_up_is_excluded_from_latency_statistics() {
    let all = run(&backlog(""), 1, &mut |_| {}).unwrap();
    let warm = run(&backlog("warmup_ms = 0.35\n"), 1, &mut |_| {}).unwrap();
    assert_eq!(all.latencies[0].len(), 10);
    // Submitted at 0, 100, 200, 300 µs: inside the 350 µs warm-up.
    assert_eq!(warm.latencies[0], all.latencies[0][4..]);
    assert_eq!((warm.queues[0].submitted, warm.queues[0].completed), (10, 10));
    assert_eq!(warm.end, all.end);
    let p = backlog("warmup_ms = 0.35\n");
    let s = sim::output::summary(&p, &warm);
    assert_eq!(s["warmup_ns"], 350_000);
    assert_eq!(s["latency_by_class"]["tick"]["samples"], 6);
    assert_eq!(s["latency_by_priority"]["normal"]["samples"], 6);
    // The latencies grow, so the warm-up's removal raises the smallest one.
    let min = |o: &sim::Outcome| *o.latencies[0].iter().min().unwrap();
    assert!(min(&warm) > min(&all), "{:?} vs {:?}", warm.latencies[0], all.latencies[0]);
    assert_eq!(sim::output::summary(&backlog(""), &all)["warmup_ns"], 0);
}

/// `version` is the package's, `commit` the build's (`git rev-parse --short HEAD`, or
/// `unknown` outside a repository), and `cost` holds every `[cost]` key after defaults.
#[test]
fn the_summary_names_the_build_and_the_resolved_cost_model() {
    let p = backlog("");
    let o = run(&p, 1, &mut |_| {}).unwrap();
    let s = sim::output::summary(&p, &o);
    assert_eq!(s["version"], env!("CARGO_PKG_VERSION"));
    let commit = s["commit"].as_str().unwrap();
    assert_eq!(commit, sim::output::COMMIT);
    assert!(
        commit == "unknown" || (4..=40).contains(&commit.len()) && commit.chars().all(|c| c.is_ascii_hexdigit()),
        "{commit}"
    );
    // The defaults, as docs/sim.md's table gives them.
    let defaults = serde_json::json!({
        "packet_ns": 50, "bulk_bytes_per_us": 32000, "wave_instruction_ns": 4, "bulk_chunk": 65536,
        "turn_us": 100.0, "doorbell_latency_ns": 0, "interrupt_ns": 0, "kernel_call_ns": 0,
        "restore_cb_ns": 1000, "restore_packet_ns": 2000, "restore_inside_ns": 10000,
    });
    assert_eq!(s["cost"], defaults);
    // Every key the summary names is a scenario key, and a value set there is what the run used.
    let keys: Vec<&String> = s["cost"].as_object().unwrap().keys().collect();
    let top: String = keys.iter().enumerate().map(|(i, k)| format!("cost.{k} = {}\n", 3 + i * 7)).collect();
    let p = backlog(&top);
    let o = run(&p, 1, &mut |_| {}).unwrap();
    let s = sim::output::summary(&p, &o);
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(s["cost"][k.as_str()].as_f64(), Some((3 + i * 7) as f64), "cost.{k}: {}", s["cost"]);
    }
}
