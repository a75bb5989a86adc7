//! The run's latency plots: a CDF of submit-to-completion latency per priority and per class,
//! on a log axis.
//!
//! Invariant: a class or priority with no sample keeps its legend entry ("no samples").

use std::collections::BTreeMap;

use super::chart::{Chart, Scale, Series, Shape, Unit};
use super::style::{class_color, format_ns, priority_color, priority_name, priority_rank, thousands};
use crate::output::percentile;
use crate::run::Outcome;
use crate::scenario::Plan;

/// The latency CDFs, per priority (lowest first) and per class.
pub(super) fn cdf_charts(plan: &Plan, o: &Outcome) -> [Chart; 2] {
    let warm = if plan.warmup > 0 {
        vec![format!("command buffers submitted in the first {} excluded", format_ns(plan.warmup as f64))]
    } else {
        Vec::new()
    };
    // Latency CDF per priority, lowest priority first.
    let mut by_prio: BTreeMap<(usize, String), Vec<u64>> = BTreeMap::new();
    for (gi, g) in plan.groups.iter().enumerate() {
        let p = priority_name(g.priority);
        by_prio.entry((priority_rank(&p), p)).or_default().extend_from_slice(&o.latencies[gi]);
    }
    let mut prio_cdf = Vec::new();
    for ((_, name), mut v) in by_prio {
        v.sort_unstable();
        prio_cdf.push(Series {
            name: cdf_name(&name, v.len()),
            color: priority_color(&name),
            shape: Shape::Line(cdf_points(&v)),
        });
    }
    let mut class_cdf = Vec::new();
    for (gi, g) in plan.groups.iter().enumerate() {
        let mut v = o.latencies[gi].clone();
        v.sort_unstable();
        class_cdf.push(Series {
            name: cdf_name(&format!("{} ({})", g.name, priority_name(g.priority)), v.len()),
            color: class_color(gi),
            shape: Shape::Line(cdf_points(&v)),
        });
    }
    let cdf = |file: &str, title: &str, series: Vec<Series>| Chart {
        file: file.into(),
        title: title.into(),
        x: "submit to completion (log scale)".into(),
        y: "fraction of command buffers".into(),
        x_scale: Scale::Log,
        x_unit: Unit::Ns,
        x_ticks: None,
        y_unit: Unit::Percent,
        y_top: Some(1.0),
        series,
        marks: Vec::new(),
        notes: warm.clone(),
    };
    [
        cdf("latency_cdf", "Latency CDF per priority", prio_cdf),
        cdf("latency_cdf_class", "Latency CDF per class", class_cdf),
    ]
}

/// A CDF's legend entry: its name and samples (a class with none stays in the legend).
fn cdf_name(name: &str, samples: usize) -> String {
    match samples {
        0 => format!("{name}: no samples"),
        1 => format!("{name}: 1 sample"),
        n => format!("{name}: {} samples", thousands(n as u64)),
    }
}

/// A CDF of `v` (sorted, ns) as points (latency, fraction): 200 quantiles and the tail.
fn cdf_points(v: &[u64]) -> Vec<(f64, f64)> {
    let mut ps: Vec<f64> = (1..=198).map(|k| k as f64 / 2.0).collect();
    ps.extend([99.5, 99.9, 99.99, 100.0]);
    if v.is_empty() {
        return Vec::new();
    }
    let mut pts = vec![(v[0].max(1) as f64, 0.0)];
    pts.extend(ps.iter().map(|&p| (percentile(v, p).max(1) as f64, p / 100.0)));
    pts
}
