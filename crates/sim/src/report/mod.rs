//! Plots (SVG and PNG) and the self-contained `report.html`.
//!
//! Plots are drawn with `plotters`, with the DejaVu font bundled, so no system font is needed
//! anywhere. `report.html` is one file: the
//! summary tables (figures with their units), every plot inlined as SVG and the scenario (no
//! script, no server, no other file).
//!
//! What a reader can rely on in every plot: a class keeps one colour ([`class_color`], by
//! its group's place in the scenario) and a priority one colour ([`priority_color`], fixed
//! for each priority), engines likewise ([`engine_color`]); legends sit beside the plot, never
//! over the data, in the order of their values (numbers as numbers); latencies are drawn on a
//! log axis whose ticks read `10 µs`, `1 ms`; an axis of names (a sweep of
//! `preemption_compute`, say) is drawn as categories, not as numbers joined by lines; time
//! plots carry the run's events (kill, hang, TDR, reset, preemption, D3 …) as lanes of ticks
//! above the data, the rare ones also as lines through it.
//!
//! Everything is drawn from deterministic data, so the files are byte-identical for the same
//! outcome.
//!
//! The code, by what it draws: `chart.rs` what a plot is (axes, series, event lanes) before it
//! is drawn; `draw.rs` draws one as SVG and PNG; `style.rs` the colours and how numbers read;
//! the run's plots are `latency.rs` (CDFs), `timeseries.rs` (throughput, utilisation, slots
//! held) and `fairness.rs`; `html.rs` the page and its tables. A sweep's plots are drawn in
//! [`crate::sweep`] from the same parts.

mod chart;
mod draw;
mod fairness;
mod html;
mod latency;
mod style;
mod timeseries;

use std::path::Path;

use serde_json::Value;

pub use chart::{ALL_DOTS, BoxStats, Chart, MAX_DOTS, Marks, Rgb, Scale, Series, Shape, Unit};
pub use draw::{nice_ticks, render};
pub(crate) use html::esc;
pub use html::{SPLIT_COLORS, page, table, with_unit};
pub use style::{
    PRIORITY_COLORS, class_color, engine_color, format_ns, num3, ordered_color, priority_color, priority_name,
    thousands,
};

use crate::SimError;
use crate::run::Outcome;
use crate::scenario::Plan;

/// The run's charts: latency CDFs per priority and per class (log axis), throughput, engine
/// utilisation and slots held over time (with the run's events), and fairness per class.
pub fn run_charts(plan: &Plan, o: &Outcome) -> Vec<Chart> {
    let mut charts = Vec::from(latency::cdf_charts(plan, o));
    charts.extend(timeseries::time_charts(plan, o));
    charts.push(fairness::fairness_chart(plan, o));
    charts
}

/// Draws the run's plots into `dir` and writes `dir/report.html`.
pub fn write_run_report(plan: &Plan, o: &Outcome, summary: &Value, dir: &Path) -> Result<(), SimError> {
    let mut figures = String::new();
    for c in run_charts(plan, o) {
        let svg = render(&c, dir)?;
        figures.push_str(&format!("<figure class=\"plot\" id=\"{}\">{svg}</figure>\n", c.file));
    }
    let sections = vec![
        ("Summary".to_string(), html::summary_tables(plan, summary)),
        ("Plots".to_string(), figures),
        ("Run details".to_string(), html::run_tables(summary)),
        ("Scenario".to_string(), format!("<pre>{}</pre>", esc(&plan.text))),
    ];
    let html = page(&format!("doorbell sim: {} (seed {})", plan.name, o.seed), &sections);
    crate::write(dir, "report.html", html.as_bytes())
}
#[cfg(test)]
mod tests {
    use super::draw::{log_ticks, tick_label, unit_label};
    use super::style::{CLASS_COLORS, ORDERED};
    use super::*;

    #[test]
    fn times_read_in_their_unit_and_log_ticks_are_powers_of_ten() {
        assert_eq!(format_ns(850.0), "850 ns");
        assert_eq!(format_ns(12_500.0), "12.5 µs");
        assert_eq!(format_ns(1_000_000.0), "1 ms");
        assert_eq!(format_ns(2.5e9), "2.5 s");
        assert_eq!(unit_label(0.5, Unit::Percent), "50%");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(with_unit("latency_by_class.a.p99_ns", &serde_json::json!(53_000_000)), "53 ms");
        assert_eq!(with_unit("latency_split.queueing_share", &serde_json::json!(0.9512)), "95.1%");
        assert_eq!(with_unit("throughput_per_s", &serde_json::json!(12345.678)), "12,346 /s");
        assert_eq!(with_unit("cost.turn_us", &serde_json::json!(100.0)), "100 µs");
        // Four decades: a tick at each power of ten, labelled in time units.
        let (bold, light) = log_ticks(3.0, 7.0);
        let labels: Vec<String> = bold.iter().map(|&v| tick_label(v, &Scale::Log, Unit::Ns)).collect();
        assert_eq!(labels, ["1 µs", "10 µs", "100 µs", "1 ms", "10 ms"]);
        assert_eq!(light.len(), 4 * 8);
        // A narrow range: 1, 2 and 5 of each decade.
        let (bold, _) = log_ticks(4.0, 5.0);
        let labels: Vec<String> = bold.iter().map(|&v| tick_label(v, &Scale::Log, Unit::Ns)).collect();
        assert_eq!(labels, ["10 µs", "20 µs", "50 µs", "100 µs"]);
        assert_eq!(nice_ticks(0.0, 10.0, 5), [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
    }

    #[test]
    fn a_box_shows_its_quartiles_and_every_dot_of_a_small_set() {
        let b = BoxStats::of(&[1.0, 2.0, 3.0, 4.0, 5.0]).unwrap();
        assert_eq!((b.low, b.q1, b.median, b.q3, b.high), (1.0, 2.0, 3.0, 4.0, 5.0));
        assert_eq!(b.dots.len(), 5);
        // A large set: only the outliers are dots (the one queue that starved, here).
        let mut v = vec![1.0; 1000];
        v[17] = 0.0;
        let b = BoxStats::of(&v).unwrap();
        assert_eq!(b.dots, [0.0]);
        assert_eq!((b.low, b.high), (1.0, 1.0));
        assert!(BoxStats::of(&[]).is_none());
    }

    #[test]
    fn ordered_series_keep_their_colour_order() {
        assert_eq!(ordered_color(0, 3), ORDERED[0]);
        assert_eq!(ordered_color(2, 3), ORDERED[7]);
        for p in PRIORITY_COLORS {
            assert!(!CLASS_COLORS.contains(&p.1), "a class would share {}'s colour", p.0);
        }
    }
}
