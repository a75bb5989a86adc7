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
    for want in ["Latency per class", "Cost model", " µs</td>", " /s</td>", "<td>commit</td>", "<td>version</td>"] {
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
