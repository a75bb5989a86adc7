//! Determinism, and kept so (issue 25): the same scenario and seed give the same bytes in every
//! output file, for every example scenario, for the scenario of the report (1,000 closed-loop
//! queues under a 10 ms hang timer) and for a generated stress scenario with every timer on and
//! every event kind; and a sweep of that report's scenario merged from shards equals its local
//! run.
//!
//! Each run goes into a fresh directory and the two directories are compared file by file
//! (summary, queues, trace, plots as SVG and PNG, report). Nothing in them varies legitimately:
//! wall-clock times stay in the `Outcome` and reach no file, and the summary's `version` and
//! `commit` are the build's, fixed when it was compiled.
//! Before the fix, the hang timer's scan visited processes in `HashMap` order (a seed drawn per
//! map), so its preemption requests went out in a different order in each run: the last three
//! tests failed in each of 11 tries.

mod common;

use std::path::{Path, PathBuf};

use common::files;
use sim::{Plan, Scenario, run_to_dir};

/// Asserts that two output directories hold the same files with the same bytes; `what` names
/// the runs. The message names the summaries and tables that differ (the plots and the report
/// differ when they do) and shows the first line where the first of them parts.
fn assert_same_files(a: &Path, b: &Path, what: &str) {
    let (x, y) = (files(a), files(b));
    let names = |v: &[(String, Vec<u8>)]| v.iter().map(|f| f.0.clone()).collect::<Vec<_>>();
    assert_eq!(names(&x), names(&y), "{what}: not the same files");
    let mut differ: Vec<(bool, &str, &[u8], &[u8])> = x
        .iter()
        .zip(&y)
        .filter(|(p, q)| p.1 != q.1)
        .map(|(p, q)| (!p.0.ends_with(".json") && !p.0.ends_with(".csv"), p.0.as_str(), &p.1[..], &q.1[..]))
        .collect();
    differ.sort();
    let Some(&(derived, name, p, q)) = differ.first() else { return };
    let first = if derived {
        format!("{} bytes against {}", p.len(), q.len())
    } else {
        let (p, q) = (String::from_utf8_lossy(p), String::from_utf8_lossy(q));
        let line = p.lines().zip(q.lines()).position(|(l, r)| l != r).unwrap_or(0);
        format!("line {}:\n  {}\n  {}", line + 1, p.lines().nth(line).unwrap_or(""), q.lines().nth(line).unwrap_or(""))
    };
    let tables: Vec<&str> = differ.iter().filter(|d| !d.0).map(|d| d.1).collect();
    panic!("{what}: {} files differ, of them {tables:?}; {name}, {first}", differ.len());
}

/// Runs `plan` with `seed` twice, each into a fresh directory, asserts every output file is
/// byte-identical, and returns the summary.
fn twice(plan: &Plan, seed: u64, what: &str) -> serde_json::Value {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let (_, summary) = run_to_dir(plan, seed, a.path(), &mut |_| {}).unwrap();
    run_to_dir(plan, seed, b.path(), &mut |_| {}).unwrap();
    let out = files(a.path());
    for n in ["summary.json", "queues.csv", "trace.json", "report.html"] {
        assert!(out.iter().any(|f| f.0 == n), "{what}: {n} missing");
    }
    assert_same_files(a.path(), b.path(), what);
    summary
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/sim")
}

#[test]
fn every_example_scenario_gives_the_same_bytes_twice() {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(examples())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    paths.sort();
    let mut ran = Vec::new();
    for path in paths {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&path).unwrap();
        // Sweep files (a `base` key) are not scenarios: each names one of the scenarios run
        // here as its base, and a sweep's own determinism (shards, merge) is the last test's.
        if toml::from_str::<toml::Table>(&text).unwrap().contains_key("base") {
            continue;
        }
        let mut plan = Scenario::parse(&path, &text).unwrap_or_else(|e| panic!("{e}"));
        if name == "ten-million" {
            // 10,000 queues and 10,000,000 submissions take seconds in release and far more in
            // the test profile: the same 10,000 queues here, stopped after 20,000 submissions
            // (the whole scenario runs in `runs.rs`, behind `--ignored`).
            plan.submissions = Some(20_000);
        }
        let s = twice(&plan, plan.seed, &name);
        assert!(s["completions"].as_u64().unwrap() > 0, "{name}: nothing completed: {s:#}");
        ran.push(name);
    }
    // The directory was found and holds the scenarios it is known to hold (a new one runs too).
    for n in ["doorbell-pool", "doorbells", "hung-kernel", "smoke", "ten-million", "trace"] {
        assert!(ran.iter().any(|r| r == n), "{n} was not run: {ran:?}");
    }
}

/// The report's scenario, scaled down: 1,000 closed-loop queues (in processes of 100, so the
/// order of processes has many ways to go wrong), a high-priority group submitting in bursts,
/// one queue that hangs, and amdgpu's hang timer at 10 ms. 30 ms, so the timer scans several
/// times while queues wait for their turn past 10 ms.
const REPORTED: &str = r#"
name = "issue-25"
seed = 1
duration_ms = 30
drain_ms = 5

[device]
engines = ["compute"]
slots = 8

[device.tdr]
hang_compute_ms = 10

[[group]]
name = "clients"
count = 1000
queues_per_process = 100
[group.workload]
outstanding = 2
[group.commands]
synthetic = { dist = "exponential", us = 20 }

[[group]]
name = "urgent"
count = 4
priority = "high"
[group.workload]
kind = "bursts"
burst_size = 8
burst_period_us = 2000
[group.commands]
synthetic = { us = 10 }

[[group]]
name = "victim"
[group.commands]
synthetic = { us = 50 }

[[event]]
at_ms = 1
action = "hang"
group = "victim"
"#;

#[test]
fn a_thousand_queues_under_a_hang_timer_give_the_same_bytes_twice() {
    let plan = Scenario::parse(Path::new("issue-25.toml"), REPORTED).unwrap_or_else(|e| panic!("{e}"));
    let s = twice(&plan, 1, "issue-25");
    // The hang timer did act: queues waiting past 10 ms were asked to preempt.
    assert!(s["preemptions"].as_u64().unwrap() > 100, "{s:#}");
    assert_eq!(s["queues"], 1005);
}

/// The stress scenario's trace: each of `count` queues submits a short kernel at the start of
/// each of three phases 5 ms apart, so that the device is idle between them (D3 needs an idle
/// device).
fn stress_trace(count: u32) -> String {
    let mut s = String::from("at_us,queue,synthetic_us\n");
    for phase in [0, 5000, 10_000] {
        for q in 0..count {
            s += &format!("{},{q},{}\n", phase + q % 7, 1 + q % 5);
        }
    }
    s
}

/// 1,000 queues in processes of 100 through 24 physical doorbells (victimization) on a compute
/// and a copy engine, every timer on and short: the hang timer on both engines, TDR with its
/// DDI delay and limit window, the process and gang quanta, idle (F1) and D3 idle periods, and
/// the cost model's doorbell latency, interrupt delivery and kernel calls. Every workload kind
/// (trace, bursts, closed, periodic) and path (user, kernel), `WRITE_DATA`, `FILL`, `COPY`, a
/// GPU dependency with fence signals and a CPU waiter. Events: a D3 request while busy
/// (refused) and one in the idle gap after the first phase (entered; the D3 idle timer enters
/// it by itself in the second gap), a context suspended and resumed, a process killed, and in
/// the last phase a hung kernel that cannot be preempted at `dma_buffer` granularity, which
/// TDR resets.
const STRESS: &str = r#"
name = "stress"
seed = 3
duration_ms = 12
drain_ms = 8

[device]
engines = ["compute", "copy"]
slots = 8
doorbell_pool = 24
process_quantum_us = 500
gang_quantum_us = 100
idle_period_us = 100
d3_idle_ms = 0.5
preemption_compute = "dma_buffer"

[device.tdr]
delay_ms = 0.5
limit_count = 1000
limit_time_ms = 1
ddi_delay_ms = 1
hang_compute_ms = 0.4
hang_copy_ms = 0.4

[cost]
turn_us = 20
doorbell_latency_ns = 200
interrupt_ns = 500
kernel_call_ns = 300

[[group]]
name = "many"
count = 1000
queues_per_process = 100
[group.workload]
kind = "trace"
file = "stress.csv"

[[group]]
name = "urgent"
priority = "high"
[group.workload]
kind = "bursts"
burst_size = 4
burst_period_us = 5000
[group.commands]
synthetic = { us = 2 }

[[group]]
name = "slow"
priority = "low"
[group.workload]
outstanding = 1
think_us = 4900
[group.commands]
synthetic = { us = 30 }

[[group]]
name = "km"
path = "kernel"
[group.workload]
kind = "periodic"
period_us = 5000
[group.commands]
write_data = 2
synthetic = { us = 4 }

[[group]]
name = "copies"
engine = "copy"
[group.workload]
kind = "periodic"
period_us = 5000
[group.commands]
fill_bytes = 262144
copy_bytes = 65536
signal = true

[[group]]
name = "waiter"
after = "copies"
[group.workload]
kind = "periodic"
period_us = 5000
cpu_waiter = true
[group.commands]
synthetic = { us = 3 }
signal = true

[[group]]
name = "victim"
[group.workload]
kind = "periodic"
period_us = 5000
[group.commands]
synthetic = { us = 5 }

[[group]]
name = "doomed"
[group.workload]
kind = "periodic"
period_us = 5000
[group.commands]
synthetic = { us = 5 }

[[group]]
name = "sleepy"
[group.workload]
kind = "periodic"
period_us = 5000
[group.commands]
synthetic = { us = 5 }

[[event]]
at_ms = 0.3
action = "d3"

[[event]]
at_ms = 1.0
action = "suspend"
group = "sleepy"
for_ms = 0.5

[[event]]
at_ms = 1.2
action = "kill"
group = "doomed"

[[event]]
at_ms = 4.5
action = "d3"

[[event]]
at_ms = 10.3
action = "hang"
group = "victim"
"#;

#[test]
fn a_stress_scenario_with_every_timer_and_event_gives_the_same_bytes_twice() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("stress.csv"), stress_trace(1000)).unwrap();
    let plan = Scenario::parse(&d.path().join("stress.toml"), STRESS).unwrap_or_else(|e| panic!("{e}"));
    let s = twice(&plan, plan.seed, "stress");
    let n = |k: &str| s[k].as_u64().unwrap_or_else(|| panic!("{k} missing: {s:#}"));
    // It did what it says: doorbells victimized, hang-timer preemptions, one TDR recovery with
    // its fault, the killed and the hung queue ended with their work lost, everything else
    // completed (every trace row of every phase), and CPU waits interrupted.
    assert!(n("victimizations") > 1000, "{s:#}");
    assert!(n("preemptions") > 1000, "{s:#}");
    assert_eq!((n("recoveries"), n("faults")), (1, 1), "{s:#}");
    assert_eq!(n("queues_ended"), 2, "{s:#}");
    assert!(n("lost") >= 2, "{s:#}");
    assert_eq!(s["latency_by_class"]["many"]["completed"], 3000, "{s:#}");
    assert!(n("interrupts") > 0, "{s:#}");
}

#[test]
fn a_sweep_under_a_hang_timer_merged_from_shards_equals_the_local_run() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("base.toml"), REPORTED).unwrap();
    let sweep = "base = \"base.toml\"\nseeds = [1, 2]\n[axes]\n\"device.slots\" = [4, 8]\n";
    std::fs::write(d.path().join("sweep.toml"), sweep).unwrap();
    let s = sim::sweep::Sweep::load(&d.path().join("sweep.toml")).unwrap();
    assert_eq!(s.runs(), 4);
    let local = d.path().join("local");
    sim::sweep::run_to_dir(&s, 0, 1, &local, &|_, _| {}).unwrap();
    let shards: Vec<PathBuf> = (0..2)
        .map(|i| {
            let dir = d.path().join(format!("shard{i}"));
            sim::sweep::run_to_dir(&s, i, 2, &dir, &|_, _| {}).unwrap();
            dir
        })
        .collect();
    let merged = d.path().join("merged");
    assert_eq!(sim::sweep::merge(&shards, &merged).unwrap(), 4);
    assert_same_files(&local, &merged, "the local sweep against the merged shards");
}
