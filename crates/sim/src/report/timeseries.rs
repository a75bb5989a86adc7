//! The run's plots over virtual time: throughput, engine utilisation and hardware slots held,
//! each with the run's events (kill, hang, TDR, reset, preemption, D3 …) as lanes of ticks
//! above the data.
//!
//! Invariant: every time plot carries the same lanes, in [`MARK_COLORS`]' order.

use std::collections::BTreeMap;

use super::chart::{Chart, Marks, Scale, Series, Shape, Unit};
use super::style::{MARK_COLORS, engine_color};
use crate::output::busy_shares;
use crate::run::Outcome;
use crate::scenario::Plan;

/// Throughput, utilisation and slot occupancy over time.
pub(super) fn time_charts(plan: &Plan, o: &Outcome) -> [Chart; 3] {
    let t0 = o.samples.first().map_or(0, |s| s.t);
    let ms = |t: u64| (t - t0) as f64 / 1e6;
    let bucket_s = o.bucket.max(1) as f64 / 1e9;
    let throughput = vec![Series {
        name: "all queues".into(),
        color: (60, 60, 60),
        shape: Shape::Line(o.samples.iter().map(|s| (ms(s.t), s.completions as f64 / bucket_s)).collect()),
    }];
    let shares = busy_shares(o);
    let utilisation = (0..o.engines.len())
        .map(|e| Series {
            name: format!("engine {e}: {}", o.engines[e]),
            color: engine_color(e),
            shape: Shape::Line(shares.iter().map(|(t, _, s)| (*t as f64 / 1e6, s[e])).collect()),
        })
        .collect();
    let occupancy = (0..o.engines.len())
        .map(|e| Series {
            name: format!("engine {e}: {} ({} slots)", o.engines[e], o.slots),
            color: engine_color(e),
            shape: Shape::Line(
                o.samples.iter().map(|s| (ms(s.t), s.slots_held.get(e).copied().unwrap_or(0) as f64)).collect(),
            ),
        })
        .collect();
    let marks = run_marks(plan, o);
    let time = |file: &str, title: &str, y: &str, y_unit: Unit, y_top: Option<f64>, series: Vec<Series>| Chart {
        file: file.into(),
        title: title.into(),
        x: "virtual time (ms)".into(),
        y: y.into(),
        x_scale: Scale::Linear,
        x_unit: Unit::Plain,
        x_ticks: None,
        y_unit,
        y_top,
        series,
        marks: marks.clone(),
        notes: Vec::new(),
    };
    [
        time("throughput", "Throughput over time", "completions per second", Unit::Plain, None, throughput),
        time(
            "utilisation",
            "Engine utilisation over time",
            "busy share of each bucket",
            Unit::Percent,
            Some(1.0),
            utilisation,
        ),
        time(
            "slot_occupancy",
            "Hardware slots held over time",
            "slots held",
            Unit::Plain,
            Some(o.slots as f64),
            occupancy,
        ),
    ]
}

/// The event lanes of a run: each kind of mark, in [`MARK_COLORS`]' order (others after, by
/// name), at ms; and the warm-up's end where there is one.
fn run_marks(plan: &Plan, o: &Outcome) -> Vec<Marks> {
    let mut by_kind: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for m in &o.marks {
        by_kind.entry(m.kind).or_default().push(m.t as f64 / 1e6);
    }
    if plan.warmup > 0 {
        by_kind.insert("warm-up end", vec![plan.warmup as f64 / 1e6]);
    }
    if let Some(d) = plan.duration {
        by_kind.insert("window end", vec![d as f64 / 1e6]);
    }
    let rank = |k: &str| MARK_COLORS.iter().position(|m| m.0 == k).unwrap_or(MARK_COLORS.len());
    let mut kinds: Vec<(&str, Vec<f64>)> = by_kind.into_iter().collect();
    kinds.sort_by(|a, b| rank(a.0).cmp(&rank(b.0)).then(a.0.cmp(b.0)));
    kinds
        .into_iter()
        .map(|(kind, at)| Marks {
            kind: kind.to_string(),
            color: MARK_COLORS.iter().find(|m| m.0 == kind).map_or((90, 90, 90), |m| m.1),
            at,
        })
        .collect()
}
