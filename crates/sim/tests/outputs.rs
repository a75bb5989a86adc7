//! What a researcher reads (issue 25): `summary.json` names the build and the resolved cost
//! model, `warmup_ms` keeps the window's start out of the latency statistics, and the report
//! draws latencies on a log axis, classes and priorities in fixed colours, fairness per class
//! as a distribution, the run's events on the time plots, and a sweep's axis of names as
//! categories with legends in numeric order.

use std::path::Path;

use sim::report::{class_color, priority_color};
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
    // Throughput and fairness count the completions in [warm-up end, window end), over that
    // window's length; queues.csv's latencies and latency.csv are of the measured ones.
    let ends = |from: u64| all.latency_rows.rows().iter().filter(|r| (from..1_000_000).contains(&r.end)).count() as u64;
    assert_eq!(all.queues[0].completed_in_window, ends(0));
    assert_eq!(warm.queues[0].completed_in_window, ends(350_000));
    assert!(ends(350_000) < ends(0));
    let per_s = ends(350_000) as f64 / 650e-6;
    assert_eq!(s["throughput_per_s"].as_f64().unwrap(), (per_s * 1e4).round() / 1e4);
    assert_eq!(warm.latency_rows.rows(), &all.latency_rows.rows()[4..]);
    let mean = warm.latencies[0].iter().sum::<u64>() / 6;
    let csv = sim::output::queues_csv(&p, &warm);
    let row: Vec<&str> = csv.lines().nth(1).unwrap().split(',').collect();
    assert_eq!((row[7], row[9]), (ends(350_000).to_string().as_str(), mean.to_string().as_str()), "{csv}");
}

/// latency.csv lists every command buffer that gave a latency sample, each row's split
/// summing to its latency; past `latency_rows` of them, an even sample of the whole run, which
/// the summary describes. The summary's split is of every command buffer, per class too.
#[test]
fn latency_csv_lists_every_command_buffer_or_an_even_sample_past_latency_rows() {
    let d = tempfile::tempdir().unwrap();
    let (all, summary) = run_to_dir(&plan(EVENTS), 1, d.path(), &mut |_| {}).unwrap();
    let samples: usize = all.latencies.iter().map(Vec::len).sum();
    let rows = latency_rows(&read(d.path(), "latency.csv"));
    assert_eq!(rows.len(), samples);
    assert_eq!((summary["latency_rows_stride"].as_u64(), summary["latency_rows_omitted"].as_u64()), (Some(1), Some(0)));
    for r in &rows {
        assert_eq!(r[6] + r[7] + r[8], r[5], "{r:?}");
        assert_eq!(r[4] - r[2], r[5], "{r:?}");
        assert!(r[2] >= 1_000_000 && r[3] >= r[2], "{r:?}");
    }
    let mut by_group: Vec<Vec<u64>> = vec![Vec::new(); 3];
    for r in all.latency_rows.rows() {
        by_group[all.queues[r.queue].group].push(r.latency());
    }
    assert_eq!(by_group, all.latencies);
    // The split per class adds up to the whole run's, and to the rows' own.
    let sum = |k: usize| rows.iter().map(|r| r[k]).sum::<u64>();
    for (k, col) in [("queueing_ns", 6), ("execution_ns", 7), ("preempted_ns", 8)] {
        let classes: u64 = ["bulk", "rare", "urgent"]
            .iter()
            .map(|c| summary["latency_by_class"][c]["latency_split"][k].as_u64().unwrap())
            .sum();
        assert_eq!(Some(classes), summary["latency_split"][k].as_u64(), "{k}");
        assert_eq!(classes, sum(col), "{k}");
    }
    // Bounded: every stride-th of the same command buffers, from the run's start to its end;
    // the summary's split still counts them all.
    let (_, small) = run_to_dir(&plan(&format!("latency_rows = 5\n{EVENTS}")), 1, d.path(), &mut |_| {}).unwrap();
    let sampled = latency_rows(&read(d.path(), "latency.csv"));
    let stride = small["latency_rows_stride"].as_u64().unwrap();
    assert!(stride > 1 && stride.is_power_of_two());
    assert!((3..=5).contains(&sampled.len()), "{}", sampled.len());
    let every: Vec<[u64; 9]> = rows.iter().step_by(stride as usize).copied().collect();
    assert_eq!(sampled, every);
    assert!(sampled.last().unwrap()[4] > rows[rows.len() / 2][4], "the sample reaches the run's second half");
    assert_eq!(small["latency_rows"], sampled.len());
    assert_eq!(small["latency_rows_omitted"].as_u64(), Some((samples - sampled.len()) as u64));
    assert_eq!(small["latency_split"], summary["latency_split"]);
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

/// The colour a chart gives `c`, as plotters' SVG writes it.
fn hex(c: (u8, u8, u8)) -> String {
    format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
}

/// Two classes of one priority and one high-priority class, a hung queue and a kill.
const EVENTS: &str = r#"
duration_ms = 4
warmup_ms = 1
[device]
slots = 4
[device.tdr]
hang_compute_ms = 1
[[group]]
name = "bulk"
count = 12
[group.workload]
outstanding = 2
[group.commands]
synthetic = { dist = "exponential", us = 20 }
[[group]]
name = "rare"
count = 2
[group.commands]
synthetic = { us = 10 }
[[group]]
name = "urgent"
priority = "high"
[group.workload]
kind = "periodic"
period_us = 200
[group.commands]
synthetic = { us = 5 }
[[event]]
at_ms = 1
action = "hang"
group = "bulk"
queue = 3
[[event]]
at_ms = 2
action = "kill"
group = "rare"
queue = 1
"#;

/// The text elements of an SVG, trimmed, in document order.
fn texts(svg: &str) -> Vec<String> {
    svg.split("<text")
        .skip(1)
        .filter_map(|t| Some(t.split_once('>')?.1.split_once("</text>")?.0.trim().to_string()))
        .collect()
}

/// Where `t` first is among `svg`'s texts.
fn text_at(svg: &str, t: &str) -> Option<usize> {
    texts(svg).iter().position(|x| x == t)
}

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn the_report_reads_at_a_glance() {
    let d = tempfile::tempdir().unwrap();
    let p = plan(EVENTS);
    let (_, summary) = run_to_dir(&p, 1, d.path(), &mut |_| {}).unwrap();
    assert_eq!(summary["warmup_ns"], 1_000_000);
    // Latency CDFs on a log axis: ticks at powers of ten, in time units.
    for f in ["latency_cdf.svg", "latency_cdf_class.svg"] {
        let svg = read(d.path(), f);
        let decades = ["1 µs", "10 µs", "100 µs", "1 ms", "10 ms"].iter().filter(|t| text_at(&svg, t).is_some());
        assert!(decades.count() >= 2, "{f}: no log-axis ticks");
        assert!(svg.contains("log scale"), "{f}");
    }
    // One colour per class in every plot that shows classes, one per priority.
    let class_cdf = read(d.path(), "latency_cdf_class.svg");
    let fairness = read(d.path(), "fairness.svg");
    for (gi, name) in ["bulk", "rare", "urgent"].iter().enumerate() {
        let c = hex(class_color(gi));
        assert!(class_cdf.contains(&c) && fairness.contains(&c), "{name}: {c} not in both");
        assert!(text_at(&fairness, name).is_some(), "fairness: no category {name}");
    }
    let prio = read(d.path(), "latency_cdf.svg");
    for p in ["normal", "high"] {
        assert!(prio.contains(&hex(priority_color(p))), "{p}");
    }
    assert!(!prio.contains(&hex(class_color(0))), "a class colour in the priority plot");
    // Events on every time plot, with their counts; engine utilisation over time.
    for f in ["throughput.svg", "utilisation.svg", "slot_occupancy.svg"] {
        let svg = read(d.path(), f);
        for kind in ["hang (1)", "kill (1)", "warm-up end (1)"] {
            assert!(svg.contains(kind), "{f}: no {kind} marker");
        }
    }
    assert!(text_at(&read(d.path(), "utilisation.svg"), "100%").is_some());
    // The summary in units: latencies in µs or ms, rates per second, the build named.
    let html = read(d.path(), "report.html");
    for want in [
        "Latency per class",
        "Cost model",
        " µs</td>",
        " /s</td>",
        "<td>commit</td>",
        "<td>version</td>",
        "queueing / execution / preempted",
        "class=\"split\"",
    ] {
        assert!(html.contains(want), "report.html lacks {want:?}");
    }
    assert!(!html.contains(&format!("<td>{}</td>", summary["latency_by_class"]["bulk"]["p50_ns"])), "raw ns");
    assert_eq!(html.matches("<figure class=\"plot\"").count(), 6);
}

#[test]
fn a_sweep_draws_names_as_categories_and_legends_in_numeric_order() {
    let d = tempfile::tempdir().unwrap();
    let base = "duration_ms = 1\n[device]\nslots = 2\n[[group]]\nname = \"a\"\ncount = 4\n[group.commands]\nsynthetic = { us = 10 }\n";
    std::fs::write(d.path().join("base.toml"), base).unwrap();
    let sweep = "base = \"base.toml\"\nseeds = [1, 2]\nmetrics = [\"p99_ns\"]\n[axes]\n\"device.preemption_compute\" = [\"shader\", \"none\"]\n\"device.slots\" = [16, 4, 8]\n";
    std::fs::write(d.path().join("sweep.toml"), sweep).unwrap();
    let s = sim::sweep::Sweep::load(&d.path().join("sweep.toml")).unwrap();
    let out = d.path().join("out");
    sim::sweep::run_to_dir(&s, 0, 1, &out, &|_, _| {}).unwrap();
    let svg = read(&out, "latency_by_priority_normal_p99_ns_vs_device_preemption_compute.svg");
    // The categories are tick labels, in the sweep file's order.
    let (a, b) = (text_at(&svg, "shader").expect("shader tick"), text_at(&svg, "none").expect("none tick"));
    assert!(a < b);
    // The legend: 4, 8, 16 (not 16, 4, 8 nor "16" < "4"), outside the plot (right of it).
    let at = |v: &str| text_at(&svg, &format!("device.slots={v}")).unwrap_or_else(|| panic!("legend {v}"));
    assert!(at("4") < at("8") && at("8") < at("16"));
    // Means over seeds with their interval: the note says so.
    assert!(svg.contains("95% interval"), "no interval note");
    // Categories are never joined by a line: the numeric axis' chart joins its means.
    let numeric = read(&out, "latency_by_priority_normal_p99_ns_vs_device_slots.svg");
    let lines = |s: &str| s.matches("<polyline").count();
    assert!(lines(&numeric) > lines(&svg), "{} vs {}", lines(&numeric), lines(&svg));
    // The interval is Student's: [1, 2, 3] has mean 2 and half-width t(2) / sqrt(3).
    let (m, lo, hi) = sim::sweep::mean_interval(&[1.0, 2.0, 3.0]);
    assert_eq!(m, 2.0);
    assert!((hi - m - 4.303 / 3f64.sqrt()).abs() < 1e-9 && (m - lo - (hi - m)).abs() < 1e-12);
    assert_eq!(sim::sweep::mean_interval(&[5.0]), (5.0, 5.0, 5.0));
}

/// The rows of `latency.csv`, parsed: (queue, cb, submit, start, end, latency, queueing,
/// execution, preempted), checking the header.
fn latency_rows(csv: &str) -> Vec<[u64; 9]> {
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("queue,group,cb,submit_ns,start_ns,end_ns,latency_ns,queueing_ns,execution_ns,preempted_ns")
    );
    lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            assert_eq!(f.len(), 10, "{l}");
            let n = |i: usize| f[i].parse::<u64>().unwrap_or_else(|e| panic!("{l}: field {i}: {e}"));
            [n(0), n(2), n(3), n(4), n(5), n(6), n(7), n(8), n(9)]
        })
        .collect()
}

/// Each command buffer's latency splits into queueing (until its first packet executes),
/// execution (what its packets cost) and preempted time, by hand: alone on the engine it
/// queues only behind its own queue's earlier work and the doorbell's latency, and is never
/// switched out.
#[test]
fn latency_splits_into_hand_computed_queueing_execution_and_preempted_time() {
    // Two outstanding, a 2 µs think time (the cost model's test): the first runs at once,
    // the second queues behind it (10,100), the third is submitted at 12,100 and queues until
    // 20,200. Each executes its 10 µs kernel, its packet (50) and its fence (50).
    let p = plan(
        "submissions = 3\n[cost]\ndoorbell_latency_ns = 300\n[[group]]\nname = \"q\"\n[group.workload]\noutstanding = 2\nthink_us = 2\n[group.commands]\nsynthetic = { us = 10 }\n",
    );
    let d = tempfile::tempdir().unwrap();
    let (_, summary) = run_to_dir(&p, 1, d.path(), &mut |_| {}).unwrap();
    let rows = latency_rows(&read(d.path(), "latency.csv"));
    // (queue, cb, submit, start, end, latency, queueing, execution, preempted)
    assert_eq!(
        rows,
        vec![
            [0, 1, 0, 300, 10_400, 10_400, 300, 10_100, 0],
            [0, 2, 0, 10_400, 20_500, 20_500, 10_400, 10_100, 0],
            [0, 3, 12_400, 20_500, 30_600, 18_200, 8_100, 10_100, 0],
        ]
    );
    let split = &summary["latency_split"];
    assert_eq!((split["queueing_ns"].as_u64(), split["execution_ns"].as_u64()), (Some(18_800), Some(30_300)));
    assert_eq!((summary["latency_rows"].as_u64(), summary["latency_rows_omitted"].as_u64()), (Some(3), Some(0)));
}

/// Two queues sharing one engine's two slots take 100 µs turns: each 250 µs kernel executes
/// for exactly its cost, and the time the other's turns took is its preempted time.
#[test]
fn time_another_queue_runs_is_preempted_time() {
    let p = plan(
        "submissions = 2\n[device]\nslots = 2\n[[group]]\nname = \"q\"\ncount = 2\n[group.commands]\nsynthetic = { us = 250 }\n",
    );
    let o = run(&p, 1, &mut |_| {}).unwrap();
    let r = o.latency_rows.rows();
    assert_eq!(r.len(), 2);
    for s in r {
        // 250,000 in three slices, each paying its packet (50), and the fence (50).
        assert_eq!(s.execution, 250_200, "{s:?}");
        assert_eq!(s.queueing() + s.execution + s.preempted(), s.latency());
    }
    // Together they kept the engine busy from 0 to the last end, one at a time: what one
    // waited after its start is what the other executed meanwhile.
    let (first, second) = if r[0].start <= r[1].start { (r[0], r[1]) } else { (r[1], r[0]) };
    assert_eq!(first.start, 0);
    assert_eq!(second.queueing(), 100_050, "the first's first turn: {second:?}");
    assert_eq!(r.iter().map(|s| s.end).max(), Some(500_400));
    // The engine was never idle and ran one at a time.
    assert_eq!(first.execution + second.execution, second.end);
    // The first was switched out while the second executed, up to the first's end; the
    // second after its start while the first executed.
    assert_eq!(first.preempted(), second.execution - (second.end - first.end), "{r:?}");
    assert_eq!(second.preempted(), first.execution - second.queueing(), "{r:?}");
    assert!(first.preempted() > 0 && second.preempted() > 0, "{r:?}");
}
