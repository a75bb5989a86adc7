//! Sweeps: every combination runs, shards are deterministic slices, and merged shards are
//! byte-identical to one local run.

mod common;

use common::files;
use sim::sweep::{Sweep, merge, run_to_dir};

const BASE: &str = r#"
duration_ms = 1
[device]
slots = 2
[[group]]
name = "a"
count = 4
[group.commands]
synthetic = { dist = "exponential", us = 10 }
[[group]]
name = "b"
priority = "high"
[group.workload]
kind = "periodic"
period_us = 100
[group.commands]
synthetic = { us = 3 }
"#;

const SWEEP: &str = r#"
base = "base.toml"
seeds = [1, 2]
[axes]
"device.slots" = [1, 2, 4]
"group.a.count" = [2, 6]
"#;

#[test]
fn merged_shards_are_byte_identical_to_the_local_run() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("base.toml"), BASE).unwrap();
    std::fs::write(d.path().join("sweep.toml"), SWEEP).unwrap();
    let s = Sweep::load(&d.path().join("sweep.toml")).unwrap();
    assert_eq!(s.runs(), 12);
    let local = d.path().join("local");
    let rows = run_to_dir(&s, 0, 1, &local, &|_, _| {}).unwrap();
    assert_eq!(rows.len(), 12);
    // The axis reached into the group by name, and the slot axis changed the device.
    let counts: Vec<_> = rows.iter().map(|r| r.cells["queues"].clone()).collect();
    assert_eq!(counts[..4], ["3", "3", "7", "7"], "{counts:?}");
    let mut shards = Vec::new();
    for i in 0..3 {
        let dir = d.path().join(format!("shard{i}"));
        let rows = run_to_dir(&s, i, 3, &dir, &|_, _| {}).unwrap();
        assert!(rows.iter().all(|r| r.id % 3 == i));
        assert_eq!(rows.len(), 4);
        shards.push(dir);
    }
    let merged = d.path().join("merged");
    assert_eq!(merge(&shards, &merged).unwrap(), 12);
    let (a, b) = (files(&local), files(&merged));
    assert_eq!(a.iter().map(|f| &f.0).collect::<Vec<_>>(), b.iter().map(|f| &f.0).collect::<Vec<_>>());
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        assert!(x == y, "{name} differs between the local run and the merged shards");
    }
    assert!(a.iter().any(|f| f.0 == "report.html") && a.iter().any(|f| f.0.ends_with(".png")));
    // An incomplete set, or a shard given twice, is refused.
    let e = merge(&shards[..2], &d.path().join("m2")).unwrap_err().to_string();
    assert!(e.contains("8 of 12"), "{e}");
    let e = merge(&[shards[0].clone(), shards[0].clone()], &d.path().join("m3")).unwrap_err().to_string();
    assert!(e.contains("twice"), "{e}");
}

#[test]
fn a_bad_axis_value_is_refused_before_anything_runs() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("base.toml"), BASE).unwrap();
    let bad = "base = \"base.toml\"\n[axes]\n\"device.slots\" = [2, -1]\n";
    std::fs::write(d.path().join("sweep.toml"), bad).unwrap();
    let e = Sweep::load(&d.path().join("sweep.toml")).unwrap_err().to_string();
    assert!(e.contains("sweep.toml:3") && e.contains("-1"), "{e}");
    let bad = "base = \"base.toml\"\n[axes]\n\"group.zz.count\" = [2]\n";
    std::fs::write(d.path().join("sweep.toml"), bad).unwrap();
    let e = Sweep::load(&d.path().join("sweep.toml")).unwrap_err().to_string();
    assert!(e.contains("sweep.toml:3") && e.contains("zz"), "{e}");
    let e = Sweep::load(&d.path().join("nope.toml")).unwrap_err().to_string();
    assert!(e.contains("nope.toml"), "{e}");
}

#[test]
fn a_metric_that_names_no_summary_field_is_refused_with_the_choice() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("base.toml"), BASE).unwrap();
    let bad = "base = \"base.toml\"\nmetrics = [\"p99_ns\", \"thruput\"]\n[axes]\n\"device.slots\" = [2]\n";
    std::fs::write(d.path().join("sweep.toml"), bad).unwrap();
    let e = Sweep::load(&d.path().join("sweep.toml")).unwrap_err().to_string();
    assert!(e.contains("sweep.toml:2") && e.contains("thruput") && e.contains("throughput_per_s"), "{e}");
    // Every name it offers is accepted.
    let good = "base = \"base.toml\"\nmetrics = [\"p99_ns\", \"jain_fairness\", \"recoveries\"]\n[axes]\n\"device.slots\" = [2]\n";
    std::fs::write(d.path().join("sweep.toml"), good).unwrap();
    Sweep::load(&d.path().join("sweep.toml")).unwrap();
}

/// A run that fails mid-sweep names its run, seed and axis values; the other runs still go
/// to their end and their rows are kept (a merge would name the missing run).
#[test]
fn a_failing_run_is_named_and_the_finished_runs_are_kept() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("base.toml"), BASE).unwrap();
    // A fill too big for any allocation passes the scenario checks but fails when the run
    // allocates its scratch buffer.
    let text = "base = \"base.toml\"\nseeds = [5]\n[axes]\n\"group.a.commands.fill_bytes\" = [64, 4000000000000]\n";
    std::fs::write(d.path().join("sweep.toml"), text).unwrap();
    let s = Sweep::load(&d.path().join("sweep.toml")).unwrap();
    let out = d.path().join("out");
    let e = run_to_dir(&s, 0, 1, &out, &|_, _| {}).unwrap_err();
    let sim::SimError::Sweep { failures, finished, .. } = &e else { panic!("{e}") };
    assert_eq!((failures.len(), *finished), (1, 1), "{e}");
    assert_eq!((failures[0].run, failures[0].seed), (1, 5));
    assert_eq!(failures[0].axes, "group.a.commands.fill_bytes = 4000000000000");
    let msg = e.to_string();
    assert!(
        msg.contains("run 1 (seed 5, group.a.commands.fill_bytes = 4000000000000)") && msg.contains("bytes"),
        "{msg}"
    );
    let runs = std::fs::read_to_string(out.join("runs.csv")).unwrap();
    assert_eq!(runs.lines().count(), 2, "the header and the finished run: {runs}");
    assert!(std::fs::read_to_string(out.join("failures.txt")).unwrap().starts_with("run 1 (seed 5"));
}
