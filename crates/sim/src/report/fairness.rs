//! The run's fairness plot: per class, a box of each queue's completions over the class's
//! mean (1 = a fair share), with Jain's index in the legend.
//!
//! Invariant: a class in which nothing completed is drawn as a mark at 0, not left out.

use super::chart::{ALL_DOTS, BoxStats, Chart, Scale, Series, Shape, Unit};
use super::style::{class_color, num3, thousands};
use crate::output::jain;
use crate::run::Outcome;
use crate::scenario::Plan;

/// Completions per queue over the class's mean, a box per class.
pub(super) fn fairness_chart(plan: &Plan, o: &Outcome) -> Chart {
    // Fairness: each class's completions per queue over the class's mean (1 = a fair share).
    let mut names = Vec::new();
    let mut fairness = Vec::new();
    for (gi, g) in plan.groups.iter().enumerate() {
        let counts: Vec<u64> = o.queues.iter().filter(|q| q.group == gi).map(|q| q.completed_in_window).collect();
        let mean = counts.iter().sum::<u64>() as f64 / counts.len().max(1) as f64;
        names.push(g.name.clone());
        let color = class_color(gi);
        let jain = jain(&counts).map_or("undefined".to_string(), |j| format!("{j:.3}"));
        let label = format!("{}: {} q, mean {}, Jain {jain}", g.name, thousands(counts.len() as u64), num3(mean));
        let shares: Vec<f64> = counts.iter().map(|&c| c as f64 / mean).collect();
        let stats = if mean > 0.0 { BoxStats::of(&shares) } else { None };
        match stats {
            Some(stats) => fairness.push(Series { name: label, color, shape: Shape::Box { x: gi as f64, stats } }),
            // A mark at 0 where the class's box would be.
            None => fairness.push(Series {
                name: format!("{}: nothing completed", g.name),
                color,
                shape: Shape::Line(vec![(gi as f64 - 0.25, 0.0), (gi as f64 + 0.25, 0.0)]),
            }),
        }
    }
    Chart {
        file: "fairness".into(),
        title: "Fairness per class: completions per queue".into(),
        x: "class".into(),
        y: "completions ÷ class mean (1 = fair share)".into(),
        x_scale: Scale::Categories(names),
        x_unit: Unit::Plain,
        x_ticks: None,
        y_unit: Unit::Plain,
        y_top: None,
        series: fairness,
        marks: Vec::new(),
        notes: vec![
            "box: quartiles; whiskers: 1.5 IQR".into(),
            format!("dots: every queue (classes of ≤ {ALL_DOTS}),"),
            "else the outliers".into(),
        ],
    }
}
