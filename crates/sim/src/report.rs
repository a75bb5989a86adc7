//! Plots (SVG and PNG) and the self-contained `report.html`.
//!
//! Plots are drawn with `plotters`: the SVG backend writes text as `<text>` elements the
//! browser renders, and the bitmap backend draws text with DejaVu Sans, which the `dejavu`
//! crate bundles, so no system font is needed anywhere. `report.html` is one file: the
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

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde_json::Value;

use crate::SimError;
use crate::output::{busy_shares, percentile};
use crate::run::Outcome;
use crate::scenario::Plan;

/// An RGB colour.
pub type Rgb = (u8, u8, u8);

/// How an axis maps values.
#[derive(Clone, Debug, PartialEq)]
pub enum Scale {
    /// Linear.
    Linear,
    /// Logarithmic (values above 0), ticks at powers of ten.
    Log,
    /// Named categories: value `i` is the `i`-th name.
    Categories(Vec<String>),
}

/// What an axis' values are, for its tick labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// A plain number.
    Plain,
    /// Nanoseconds, labelled `ns`, `µs`, `ms` or `s`.
    Ns,
    /// A share from 0 to 1, labelled as a percentage.
    Percent,
}

/// A box plot's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct BoxStats {
    /// Lower whisker (the lowest value within 1.5 × IQR of the box).
    pub low: f64,
    /// First quartile.
    pub q1: f64,
    /// Median.
    pub median: f64,
    /// Third quartile.
    pub q3: f64,
    /// Upper whisker.
    pub high: f64,
    /// Values drawn as dots: every value of a small set, else the outliers (the most extreme
    /// [`MAX_DOTS`]).
    pub dots: Vec<f64>,
}

/// The most dots one box draws.
pub const MAX_DOTS: usize = 200;

/// A set of values at most this large is drawn dot by dot beside its box.
pub const ALL_DOTS: usize = 64;

impl BoxStats {
    /// The figures of `values` (any order); `None` for none.
    pub fn of(values: &[f64]) -> Option<BoxStats> {
        let mut v: Vec<f64> = values.to_vec();
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            return None;
        }
        let q = |p: f64| {
            let x = p * (v.len() - 1) as f64;
            let (i, f) = (x.floor() as usize, x.fract());
            v[i] + (v[(i + 1).min(v.len() - 1)] - v[i]) * f
        };
        let (q1, median, q3) = (q(0.25), q(0.5), q(0.75));
        let iqr = q3 - q1;
        let (lo_fence, hi_fence) = (q1 - 1.5 * iqr, q3 + 1.5 * iqr);
        let low = v.iter().copied().find(|&x| x >= lo_fence).unwrap_or(q1);
        let high = v.iter().rev().copied().find(|&x| x <= hi_fence).unwrap_or(q3);
        let dots = if v.len() <= ALL_DOTS {
            v.clone()
        } else {
            let mut out: Vec<f64> = v.iter().copied().filter(|&x| x < lo_fence || x > hi_fence).collect();
            // The most extreme first, then back in value order.
            out.sort_by(|a, b| (b - median).abs().total_cmp(&(a - median).abs()).then(a.total_cmp(b)));
            out.truncate(MAX_DOTS);
            out.sort_by(f64::total_cmp);
            out
        };
        Some(BoxStats { low, q1, median, q3, high, dots })
    }
}

/// What a series draws.
#[derive(Clone, Debug)]
pub enum Shape {
    /// A line through the points (x, y).
    Line(Vec<(f64, f64)>),
    /// Points (x, mean, low, high): a dot with an error bar from low to high; joined by a
    /// line when `join` (a numeric axis; never between categories).
    Interval {
        /// The points.
        points: Vec<(f64, f64, f64, f64)>,
        /// Join the means.
        join: bool,
    },
    /// A box plot at x.
    Box {
        /// Where (a category's index).
        x: f64,
        /// Its figures.
        stats: BoxStats,
    },
}

/// One series of a chart.
#[derive(Clone, Debug)]
pub struct Series {
    /// Legend entry (empty: none).
    pub name: String,
    /// Colour.
    pub color: Rgb,
    /// What it draws.
    pub shape: Shape,
}

/// One kind of event on a time plot: a lane of ticks above the data.
#[derive(Clone, Debug)]
pub struct Marks {
    /// The kind (`hang`, `tdr`, …).
    pub kind: String,
    /// Colour.
    pub color: Rgb,
    /// When (x values).
    pub at: Vec<f64>,
}

/// A chart.
#[derive(Clone, Debug)]
pub struct Chart {
    /// File stem (and the figure's id in the page).
    pub file: String,
    /// Title.
    pub title: String,
    /// X axis label.
    pub x: String,
    /// Y axis label.
    pub y: String,
    /// X scale.
    pub x_scale: Scale,
    /// X values' unit.
    pub x_unit: Unit,
    /// A linear axis' ticks, where they are the values drawn (a sweep's axis values): the
    /// axis is then padded so no point sits on its edge.
    pub x_ticks: Option<Vec<f64>>,
    /// Y values' unit.
    pub y_unit: Unit,
    /// The y axis' top, where fixed (a share's 1, the slots an engine has).
    pub y_top: Option<f64>,
    /// Series, in legend order.
    pub series: Vec<Series>,
    /// Event lanes, in legend order.
    pub marks: Vec<Marks>,
    /// Lines of small print under the legend.
    pub notes: Vec<String>,
}

const SIZE: (u32, u32) = (1000, 500);
/// The legend's column, right of the plot.
const LEGEND_W: u32 = 290;
/// The most characters of a legend line.
const LEGEND_CHARS: usize = 40;
/// An event lane's height, as a share of the data's height.
const LANE: f64 = 0.07;
/// A kind with at most this many events is also drawn as lines through the data.
const RARE: usize = 12;

/// Each priority's colour, in priority order.
pub const PRIORITY_COLORS: [(&str, Rgb); 5] = [
    ("low", (127, 127, 127)),
    ("normal", (31, 119, 180)),
    ("medium", (44, 160, 44)),
    ("high", (255, 127, 14)),
    ("realtime", (214, 39, 40)),
];

/// A priority's colour (by its lower-case name), the same in every plot.
pub fn priority_color(priority: &str) -> Rgb {
    PRIORITY_COLORS.iter().find(|p| p.0 == priority).map_or((0, 0, 0), |p| p.1)
}

/// A priority's place in [`PRIORITY_COLORS`] (lowest first; unknown last).
fn priority_rank(priority: &str) -> usize {
    PRIORITY_COLORS.iter().position(|p| p.0 == priority).unwrap_or(PRIORITY_COLORS.len())
}

/// Class colours: none of them a priority's.
const CLASS_COLORS: [Rgb; 10] = [
    (148, 103, 189),
    (23, 190, 207),
    (140, 86, 75),
    (227, 119, 194),
    (188, 189, 34),
    (57, 59, 121),
    (0, 109, 91),
    (173, 73, 74),
    (140, 109, 49),
    (123, 65, 115),
];

/// A class's colour (by its group's index in the scenario), the same in every plot.
pub fn class_color(group: usize) -> Rgb {
    CLASS_COLORS[group % CLASS_COLORS.len()]
}

/// An engine's colour (by its id).
pub fn engine_color(engine: usize) -> Rgb {
    [(40, 40, 40), (0, 150, 136), (121, 85, 72), (63, 81, 181)][engine % 4]
}

/// Event kinds in the order their lanes are listed, each with its colour.
const MARK_COLORS: [(&str, Rgb); 16] = [
    ("warm-up end", (0, 0, 0)),
    ("window end", (0, 0, 0)),
    ("kill", (178, 24, 43)),
    ("hang", (230, 85, 13)),
    ("tdr", (202, 0, 32)),
    ("reset", (117, 107, 177)),
    ("fault", (255, 0, 255)),
    ("device error", (128, 0, 0)),
    ("device lost", (128, 0, 0)),
    ("adapter lost", (128, 0, 0)),
    ("suspend", (49, 130, 189)),
    ("resume", (107, 174, 214)),
    ("d3 request", (35, 139, 69)),
    ("d3", (116, 196, 118)),
    ("victimized", (140, 81, 10)),
    ("preempted", (150, 150, 150)),
];

/// A sequential palette for ordered series (a sweep's other axes): dark to light.
const ORDERED: [Rgb; 8] = [
    (68, 1, 84),
    (72, 40, 120),
    (62, 74, 137),
    (49, 104, 142),
    (38, 130, 142),
    (31, 158, 137),
    (53, 183, 121),
    (109, 205, 89),
];

/// The colour of series `k` of `n` in order: spread over a dark-to-light palette (viridis).
pub fn ordered_color(k: usize, n: usize) -> Rgb {
    if n <= 1 {
        return ORDERED[3];
    }
    ORDERED[(k * (ORDERED.len() - 1) / (n - 1)).min(ORDERED.len() - 1)]
}

fn rgb(c: Rgb) -> RGBColor {
    RGBColor(c.0, c.1, c.2)
}

fn fonts() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The bundled font answers for every family name plotters asks for.
        for family in ["sans-serif", "serif", "monospace"] {
            let _ = plotters::style::register_font(family, FontStyle::Normal, dejavu::sans::regular());
            let _ = plotters::style::register_font(family, FontStyle::Bold, dejavu::sans::bold());
        }
    });
}

/// `x` with at most 3 significant digits, trailing zeros dropped (`1`, `2.5`, `12.3`, `450`).
pub fn num3(x: f64) -> String {
    let a = x.abs();
    let s = if a >= 100.0 || a == 0.0 {
        format!("{x:.0}")
    } else if a >= 10.0 {
        format!("{x:.1}")
    } else if a >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    };
    if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s }
}

/// Nanoseconds in the unit that reads best: `850 ns`, `12.5 µs`, `4.2 ms`, `1.5 s`.
pub fn format_ns(ns: f64) -> String {
    let a = ns.abs();
    if a < 1e3 {
        format!("{} ns", num3(ns))
    } else if a < 1e6 {
        format!("{} µs", num3(ns / 1e3))
    } else if a < 1e9 {
        format!("{} ms", num3(ns / 1e6))
    } else {
        format!("{} s", num3(ns / 1e9))
    }
}

/// A whole number with thousands separators (`1,234,567`).
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// About `n` round ticks from `lo` to `hi` (steps of 1, 2 or 5 times a power of ten).
pub fn nice_ticks(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    if hi <= lo || !lo.is_finite() || !hi.is_finite() {
        return vec![lo];
    }
    let raw = (hi - lo) / n.max(1) as f64;
    let p = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * p).find(|s| raw <= *s).unwrap_or(10.0 * p);
    let first = (lo / step).ceil() as i64;
    let last = (hi / step + 1e-9).floor() as i64;
    (first..=last).map(|k| k as f64 * step).collect()
}

/// Ticks of a log axis over log10 values `lo..hi`: each power of ten, with 2 and 5 between
/// them over a narrow range; and the light lines (2 to 9 of each decade).
fn log_ticks(lo: f64, hi: f64) -> (Vec<f64>, Vec<f64>) {
    let (a, b) = (lo.floor() as i32, hi.ceil() as i32);
    let mut bold = Vec::new();
    let mut light = Vec::new();
    for d in a..=b {
        for m in 1..10 {
            let v = (m as f64).log10() + d as f64;
            if v < lo - 1e-9 || v > hi + 1e-9 {
                continue;
            }
            if m == 1 || (b - a <= 2 && (m == 2 || m == 5)) {
                bold.push(v);
            } else {
                light.push(v);
            }
        }
    }
    (bold, light)
}

fn tick_label(v: f64, scale: &Scale, unit: Unit) -> String {
    match scale {
        Scale::Categories(names) => {
            let i = v.round();
            if (v - i).abs() > 1e-6 || i < 0.0 {
                return String::new();
            }
            names.get(i as usize).cloned().unwrap_or_default()
        }
        Scale::Log => unit_label(10f64.powf(v), unit),
        Scale::Linear => unit_label(v, unit),
    }
}

fn unit_label(v: f64, unit: Unit) -> String {
    match unit {
        Unit::Plain if v.fract() == 0.0 && v.abs() >= 1e4 && v.abs() < 1e15 => {
            format!("{}{}", if v < 0.0 { "-" } else { "" }, thousands(v.abs() as u64))
        }
        Unit::Plain => num3(v),
        Unit::Ns if v == 0.0 => "0".into(),
        Unit::Ns => format_ns(v),
        Unit::Percent => format!("{}%", num3(v * 100.0)),
    }
}

/// Where x values go on the axis (log10 on a log axis).
fn xmap(scale: &Scale, x: f64) -> f64 {
    match scale {
        Scale::Log => x.max(1e-9).log10(),
        _ => x,
    }
}

/// A linear axis with the ticks given (bold: labelled lines; light: faint lines).
struct Ticks {
    range: std::ops::Range<f64>,
    bold: Vec<f64>,
    light: Vec<f64>,
}

impl Ranged for Ticks {
    type FormatOption = plotters::coord::ranged1d::DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let (lo, hi) = (self.range.start, self.range.end);
        let f = if hi > lo { (v - lo) / (hi - lo) } else { 0.0 };
        limit.0 + (f * (limit.1 - limit.0) as f64).round() as i32
    }

    fn key_points<H: plotters::coord::ranged1d::KeyPointHint>(&self, hint: H) -> Vec<f64> {
        if hint.weight().allow_light_points() { self.light.clone() } else { self.bold.clone() }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.range.clone()
    }
}

type Err = String;

fn e2s<E: std::fmt::Display>(e: E) -> Err {
    e.to_string()
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, c: &Chart) -> Result<(), Err>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(e2s)?;
    let (plot, legend) = root.split_horizontally(SIZE.0 - LEGEND_W);
    // X extent.
    let mut xs: Vec<f64> = Vec::new();
    let mut ys: Vec<f64> = Vec::new();
    for s in &c.series {
        match &s.shape {
            Shape::Line(p) => {
                xs.extend(p.iter().map(|p| p.0));
                ys.extend(p.iter().map(|p| p.1));
            }
            Shape::Interval { points, .. } => {
                xs.extend(points.iter().map(|p| p.0));
                ys.extend(points.iter().flat_map(|p| [p.1, p.2, p.3]));
            }
            Shape::Box { x, stats } => {
                xs.push(*x);
                ys.extend([stats.low, stats.high]);
                ys.extend(stats.dots.iter().copied());
            }
        }
    }
    xs.extend(c.marks.iter().flat_map(|m| m.at.iter().copied()));
    let xs: Vec<f64> = xs.into_iter().filter(|x| x.is_finite()).map(|x| xmap(&c.x_scale, x)).collect();
    let (mut x0, mut x1) = xs.iter().fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
    let (bold, light) = match &c.x_scale {
        Scale::Categories(names) => {
            (x0, x1) = (-0.5, names.len().max(1) as f64 - 0.5);
            ((0..names.len()).map(|i| i as f64).collect(), Vec::new())
        }
        Scale::Log => {
            if x0 > x1 {
                (x0, x1) = (0.0, 1.0);
            }
            (x0, x1) = (x0.floor(), x1.ceil().max(x0.floor() + 1.0));
            log_ticks(x0, x1)
        }
        Scale::Linear => {
            if x0 > x1 {
                (x0, x1) = (0.0, 1.0);
            }
            if x1 <= x0 {
                (x0, x1) = (x0 - 0.5, x0 + 0.5);
            }
            match &c.x_ticks {
                Some(t) => {
                    let pad = (x1 - x0) * 0.06;
                    (x0, x1) = (x0 - pad, x1 + pad);
                    (t.clone(), Vec::new())
                }
                None => (nice_ticks(x0, x1, 8), Vec::new()),
            }
        }
    };
    // Y extent: the data from 0 (or the fixed top), then a lane per event kind above it.
    let ymax_data = ys.iter().copied().filter(|y| y.is_finite()).fold(0.0f64, f64::max);
    // The ticks reach the data's top (or the fixed one), the axis a little past it, so a
    // line along the top stays clear of the frame.
    let tick_top = match c.y_top {
        Some(t) => t.max(ymax_data),
        None if ymax_data > 0.0 => ymax_data,
        None => 1.0,
    };
    let ymax = tick_top * 1.04;
    let mut ymin = ys.iter().copied().filter(|y| y.is_finite()).fold(0.0f64, f64::min);
    if matches!(c.x_scale, Scale::Categories(_)) && ymin == 0.0 {
        // Room below 0, so a category's mark at 0 stays off the axis.
        ymin = -0.04 * tick_top;
    }
    let lanes = c.marks.len() as f64;
    let ytop = ymax + (ymax - ymin) * LANE * lanes;
    let yticks: Vec<f64> = nice_ticks(ymin, tick_top, 6);
    let mut chart = ChartBuilder::on(&plot)
        .caption(&c.title, ("sans-serif", 17))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(80)
        .build_cartesian_2d(
            Ticks { range: x0..x1, bold, light },
            Ticks { range: ymin..ytop, bold: yticks, light: Vec::new() },
        )
        .map_err(e2s)?;
    let xfmt = |v: &f64| tick_label(*v, &c.x_scale, c.x_unit);
    let yfmt = |v: &f64| unit_label(*v, c.y_unit);
    chart
        .configure_mesh()
        .x_desc(c.x.as_str())
        .y_desc(c.y.as_str())
        .label_style(("sans-serif", 13))
        .x_label_formatter(&xfmt)
        .y_label_formatter(&yfmt)
        .light_line_style(RGBColor(238, 238, 238))
        .bold_line_style(RGBColor(215, 215, 215))
        .draw()
        .map_err(e2s)?;
    // Event lanes above the data, rare events also as lines through it.
    let span = ymax - ymin;
    for (i, m) in c.marks.iter().enumerate() {
        let lane = (c.marks.len() - 1 - i) as f64;
        let (lo, hi) = (ymax + span * LANE * (lane + 0.15), ymax + span * LANE * (lane + 0.85));
        let color = rgb(m.color);
        // One tick per pixel column is all a screen shows.
        let px = (x1 - x0) / (SIZE.0 - LEGEND_W) as f64;
        let mut cols: Vec<f64> = m.at.iter().map(|&x| ((xmap(&c.x_scale, x) - x0) / px).round() * px + x0).collect();
        cols.dedup();
        chart
            .draw_series(cols.iter().map(|&x| PathElement::new(vec![(x, lo), (x, hi)], color.stroke_width(1))))
            .map_err(e2s)?;
        // The lane's name left of it, where the y axis has no ticks.
        let (px, py) = chart.backend_coord(&(x0, (lo + hi) / 2.0));
        let style = ("sans-serif", 11).into_font().color(&color).pos(Pos::new(HPos::Right, VPos::Center));
        plot.draw(&Text::new(m.kind.clone(), (px - 6, py), style)).map_err(e2s)?;
        if m.at.len() <= RARE {
            chart
                .draw_series(
                    cols.iter().map(|&x| PathElement::new(vec![(x, ymin), (x, ymax)], color.mix(0.55).stroke_width(1))),
                )
                .map_err(e2s)?;
        }
    }
    for s in &c.series {
        let color = rgb(s.color);
        match &s.shape {
            Shape::Line(p) => {
                chart
                    .draw_series(LineSeries::new(
                        p.iter().map(|&(x, y)| (xmap(&c.x_scale, x), y)),
                        color.stroke_width(2),
                    ))
                    .map_err(e2s)?;
            }
            Shape::Interval { points, join } => {
                let cap = match c.x_scale {
                    Scale::Categories(_) => 0.05,
                    _ => (x1 - x0) * 0.008,
                };
                if *join {
                    chart
                        .draw_series(LineSeries::new(
                            points.iter().map(|p| (xmap(&c.x_scale, p.0), p.1)),
                            color.stroke_width(2),
                        ))
                        .map_err(e2s)?;
                }
                for &(x, mean, lo, hi) in points {
                    let x = xmap(&c.x_scale, x);
                    let style = color.stroke_width(2);
                    chart
                        .draw_series([
                            PathElement::new(vec![(x, lo), (x, hi)], style),
                            PathElement::new(vec![(x - cap, lo), (x + cap, lo)], style),
                            PathElement::new(vec![(x - cap, hi), (x + cap, hi)], style),
                        ])
                        .map_err(e2s)?;
                    chart.draw_series([Circle::new((x, mean), 4, color.filled())]).map_err(e2s)?;
                }
            }
            Shape::Box { x, stats } => {
                let (x, w) = (*x, 0.25);
                let b = stats;
                chart
                    .draw_series([
                        Rectangle::new([(x - w, b.q1), (x + w, b.q3)], color.mix(0.25).filled()),
                        Rectangle::new([(x - w, b.q1), (x + w, b.q3)], color.stroke_width(2)),
                    ])
                    .map_err(e2s)?;
                let style = color.stroke_width(2);
                chart
                    .draw_series([
                        PathElement::new(vec![(x - w, b.median), (x + w, b.median)], color.stroke_width(3)),
                        PathElement::new(vec![(x, b.q3), (x, b.high)], style),
                        PathElement::new(vec![(x, b.q1), (x, b.low)], style),
                        PathElement::new(vec![(x - w / 2.0, b.high), (x + w / 2.0, b.high)], style),
                        PathElement::new(vec![(x - w / 2.0, b.low), (x + w / 2.0, b.low)], style),
                    ])
                    .map_err(e2s)?;
                // Dots beside the box, spread deterministically so equal values stay visible.
                chart
                    .draw_series(b.dots.iter().enumerate().map(|(i, &y)| {
                        let jitter = ((i as f64 * 0.618_034).fract() - 0.5) * 0.16;
                        Circle::new((x + w + 0.12 + jitter, y), 2, color.mix(0.8).filled())
                    }))
                    .map_err(e2s)?;
            }
        }
    }
    draw_legend(&legend, c)?;
    root.present().map_err(e2s)?;
    Ok(())
}

/// The legend: a column right of the plot, entries in the chart's order, then the event
/// lanes (top to bottom), then the notes.
fn draw_legend<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, c: &Chart) -> Result<(), Err>
where
    DB::ErrorType: 'static,
{
    let font = ("sans-serif", 12).into_font();
    let short = |s: &str, n: usize| {
        if s.chars().count() <= n { s.to_string() } else { format!("{}…", s.chars().take(n - 1).collect::<String>()) }
    };
    let mut y = 44;
    let step = 17;
    let text = |area: &DrawingArea<DB, Shift>, s: &str, x: i32, y: i32, color: RGBColor| {
        area.draw(&Text::new(s.to_string(), (x, y - 7), font.color(&color))).map_err(e2s)
    };
    for s in c.series.iter().filter(|s| !s.name.is_empty()) {
        if y > SIZE.1 as i32 - 20 {
            break;
        }
        let color = rgb(s.color);
        match s.shape {
            Shape::Box { .. } => area.draw(&Rectangle::new([(4, y - 5), (22, y + 5)], color.mix(0.4).filled())),
            Shape::Interval { .. } => area.draw(&Circle::new((13, y), 4, color.filled())),
            Shape::Line(_) => area.draw(&PathElement::new(vec![(4, y), (22, y)], color.stroke_width(3))),
        }
        .map_err(e2s)?;
        text(area, &short(&s.name, LEGEND_CHARS), 28, y, BLACK)?;
        y += step;
    }
    if !c.marks.is_empty() {
        y += 6;
        text(area, "events (lanes above the data):", 4, y, RGBColor(80, 80, 80))?;
        y += step;
        for m in &c.marks {
            let color = rgb(m.color);
            area.draw(&PathElement::new(vec![(13, y - 6), (13, y + 6)], color.stroke_width(2))).map_err(e2s)?;
            text(area, &short(&format!("{} ({})", m.kind, thousands(m.at.len() as u64)), LEGEND_CHARS), 28, y, BLACK)?;
            y += step;
        }
    }
    y += 6;
    for n in c.notes.iter().flat_map(|n| wrap(n, LEGEND_CHARS + 4)) {
        text(area, &n, 4, y, RGBColor(100, 100, 100))?;
        y += step - 2;
    }
    Ok(())
}

/// `s` in lines of at most `width` characters, broken between words.
fn wrap(s: &str, width: usize) -> Vec<String> {
    let mut lines = vec![String::new()];
    for w in s.split_whitespace() {
        let last = lines.last_mut().expect("one line at least");
        if !last.is_empty() && last.chars().count() + 1 + w.chars().count() > width {
            lines.push(w.to_string());
        } else {
            if !last.is_empty() {
                last.push(' ');
            }
            last.push_str(w);
        }
    }
    lines
}

/// Draws `c` as `DIR/FILE.svg` and `DIR/FILE.png`; returns the SVG text.
pub fn render(c: &Chart, dir: &Path) -> Result<String, SimError> {
    fonts();
    let io = |p: &Path, why: String| SimError::Io { path: p.display().to_string(), why };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        draw(root, c).map_err(|e| io(&dir.join(format!("{}.svg", c.file)), e))?;
    }
    crate::write(dir, &format!("{}.svg", c.file), svg.as_bytes())?;
    let png = dir.join(format!("{}.png", c.file));
    {
        let root = BitMapBackend::new(&png, SIZE).into_drawing_area();
        draw(root, c).map_err(|e| io(&png, e))?;
    }
    Ok(svg)
}

/// A priority's lower-case name.
pub fn priority_name(p: abi::Priority) -> String {
    format!("{p:?}").to_lowercase()
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

/// The run's charts: latency CDFs per priority and per class (log axis), throughput, engine
/// utilisation and slots held over time (with the run's events), and fairness per class.
pub fn run_charts(plan: &Plan, o: &Outcome) -> Vec<Chart> {
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
    // Fairness: each class's completions per queue over the class's mean (1 = a fair share).
    let mut names = Vec::new();
    let mut fairness = Vec::new();
    for (gi, g) in plan.groups.iter().enumerate() {
        let counts: Vec<u64> = o.queues.iter().filter(|q| q.group == gi).map(|q| q.completed_in_window).collect();
        let mean = counts.iter().sum::<u64>() as f64 / counts.len().max(1) as f64;
        names.push(g.name.clone());
        let color = class_color(gi);
        let jain = crate::output::jain(&counts).map_or("undefined".to_string(), |j| format!("{j:.3}"));
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
    vec![
        cdf("latency_cdf", "Latency CDF per priority", prio_cdf),
        cdf("latency_cdf_class", "Latency CDF per class", class_cdf),
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
        },
    ]
}

pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// The rows of a summary table: every scalar, dotted paths for nested objects.
fn flatten(prefix: &str, v: &Value, out: &mut Vec<(String, Value)>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                flatten(&key, x, out);
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                flatten(&format!("{prefix}[{i}]"), x, out);
            }
        }
        other => out.push((prefix.to_string(), other.clone())),
    }
}

/// A summary value with its unit, by its key's suffix: `_ns` and `_us` as times in the unit
/// that reads best, `_per_s` as a rate, `_share` as a percentage, bytes as bytes; whole
/// numbers with separators.
pub fn with_unit(key: &str, v: &Value) -> String {
    let Some(x) = v.as_f64() else {
        return match v {
            Value::String(s) => s.clone(),
            Value::Null => "undefined".into(),
            other => other.to_string(),
        };
    };
    let leaf = key.rsplit('.').next().unwrap_or(key);
    let plain = |x: f64| if x.fract() == 0.0 && x.abs() < 1e15 { thousands(x.abs() as u64) } else { num3(x) };
    if leaf == "bulk_bytes_per_us" {
        format!("{} bytes/µs", plain(x))
    } else if leaf == "bulk_chunk" {
        format!("{} bytes", plain(x))
    } else if leaf.ends_with("_ns") {
        format_ns(x)
    } else if leaf.ends_with("_us") {
        format_ns(x * 1e3)
    } else if leaf.ends_with("_share") {
        format!("{:.1}%", x * 100.0)
    } else if leaf.ends_with("_per_s") {
        format!("{} /s", plain(x.round()))
    } else {
        plain(x)
    }
}

/// A self-contained HTML page.
pub fn page(title: &str, sections: &[(String, String)]) -> String {
    let mut h = String::new();
    h.push_str("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">");
    h.push_str(&format!("<title>{}</title>", esc(title)));
    h.push_str(
        "<style>body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;margin:0.5em 0 1em}\
         td,th{border:1px solid #ccc;padding:2px 8px;text-align:left;font-size:13px}td.n{text-align:right}\
         th{background:#f3f3f3}caption{text-align:left;font-weight:bold;padding:4px 0}\
         pre{background:#f6f6f6;padding:1em;overflow:auto}figure{margin:1em 0}\
         figure svg{max-width:100%;height:auto}.sw{display:inline-block;width:10px;height:10px;margin-right:5px}\
         .row{display:flex;gap:2em;align-items:flex-start;flex-wrap:wrap}\
         .split{display:inline-flex;width:120px;height:10px;margin-left:6px;vertical-align:middle;background:#eee}</style></head><body>\n",
    );
    h.push_str(&format!("<h1>{}</h1>\n", esc(title)));
    for (head, body) in sections {
        h.push_str(&format!("<h2>{}</h2>\n{body}\n", esc(head)));
    }
    h.push_str("</body></html>\n");
    h
}

/// A table of (key, value) rows.
pub fn table(rows: &[(String, String)]) -> String {
    grid("", &["measure", "value"], &rows.iter().map(|(k, v)| vec![esc(k), esc(v)]).collect::<Vec<_>>())
}

/// A table with a caption, a header row and rows of cells (HTML already escaped).
fn grid(caption: &str, head: &[&str], rows: &[Vec<String>]) -> String {
    let mut t = String::from("<table>");
    if !caption.is_empty() {
        t.push_str(&format!("<caption>{}</caption>", esc(caption)));
    }
    t.push_str("<tr>");
    for h in head {
        t.push_str(&format!("<th>{}</th>", esc(h)));
    }
    t.push_str("</tr>\n");
    for r in rows {
        t.push_str("<tr>");
        for (i, cell) in r.iter().enumerate() {
            t.push_str(if i == 0 { "<td>" } else { "<td class=\"n\">" });
            t.push_str(cell);
            t.push_str("</td>");
        }
        t.push_str("</tr>\n");
    }
    t.push_str("</table>");
    t
}

/// The colours of a latency split's parts: queueing, execution, preempted.
pub const SPLIT_COLORS: [Rgb; 3] = [(0xbb, 0xbb, 0xbb), (0x2c, 0xa0, 0x2c), (0xd6, 0x27, 0x28)];

/// A latency split (`latency_split` of the summary) as a bar of its three shares in
/// [`SPLIT_COLORS`] after the shares in words (the bars line up in a right-aligned column).
fn split_bar(split: &Value) -> String {
    let keys = ["queueing_share", "execution_share", "preempted_share"];
    let mut h = esc(&keys.map(|k| with_unit(k, &split[k])).join(" / "));
    h.push_str("<span class=\"split\">");
    for (k, c) in keys.iter().zip(SPLIT_COLORS) {
        let share = split[k].as_f64().unwrap_or(0.0).clamp(0.0, 1.0);
        h.push_str(&format!(
            "<span style=\"width:{:.1}%;background:#{:02x}{:02x}{:02x}\"></span>",
            share * 100.0,
            c.0,
            c.1,
            c.2
        ));
    }
    h.push_str("</span>");
    h
}

fn swatch(c: Rgb) -> String {
    format!("<span class=\"sw\" style=\"background:#{:02x}{:02x}{:02x}\"></span>", c.0, c.1, c.2)
}

/// Latency per priority and per class as tables with units.
fn summary_tables(plan: &Plan, summary: &Value) -> String {
    let lat = ["p50_ns", "p90_ns", "p99_ns", "p999_ns", "max_ns"];
    let lat_head = ["p50", "p90", "p99", "p99.9", "max"];
    // A class with no sample has no latency (not 0 ns).
    let cells = |o: &Value| -> Vec<String> {
        let none = o["samples"].as_u64() == Some(0);
        lat.iter().map(|k| if none { "—".to_string() } else { esc(&with_unit(k, &o[k])) }).collect()
    };
    let mut prio_rows = Vec::new();
    if let Some(m) = summary["latency_by_priority"].as_object() {
        let mut ps: Vec<(&String, &Value)> = m.iter().collect();
        ps.sort_by_key(|p| priority_rank(p.0));
        for (p, o) in ps {
            let mut r =
                vec![format!("{}{}", swatch(priority_color(p)), esc(p)), esc(&with_unit("samples", &o["samples"]))];
            r.extend(cells(o));
            prio_rows.push(r);
        }
    }
    let mut class_rows = Vec::new();
    for (gi, g) in plan.groups.iter().enumerate() {
        let o = &summary["latency_by_class"][&g.name];
        let mut r = vec![
            format!("{}{}", swatch(class_color(gi)), esc(&g.name)),
            esc(&priority_name(g.priority)),
            esc(&with_unit("queues", &o["queues"])),
            esc(&with_unit("completed", &o["completed"])),
            esc(&with_unit("samples", &o["samples"])),
        ];
        r.extend(cells(o));
        r.push(esc(&with_unit("jain_fairness", &o["jain_fairness"])));
        r.push(split_bar(&o["latency_split"]));
        class_rows.push(r);
    }
    let mut h = String::new();
    let warm = summary["warmup_ns"].as_u64().unwrap_or(0);
    let samples_note = if warm > 0 {
        format!(" (command buffers submitted after the {} warm-up)", format_ns(warm as f64))
    } else {
        String::new()
    };
    let mut head = vec!["priority", "samples"];
    head.extend(lat_head);
    h.push_str(&grid(&format!("Latency per priority, submit to completion{samples_note}"), &head, &prio_rows));
    let mut head = vec!["class", "priority", "queues", "completed", "samples"];
    head.extend(lat_head);
    head.push("Jain fairness");
    head.push("latency: queueing / execution / preempted");
    h.push_str(&grid(&format!("Latency per class{samples_note}"), &head, &class_rows));
    h
}

/// The rest of the summary: the run's figures and the cost model side by side, then the whole
/// `summary.json`.
fn run_tables(summary: &Value) -> String {
    let mut run = Vec::new();
    let mut cost = Vec::new();
    let mut rows = Vec::new();
    flatten("", summary, &mut rows);
    for (k, v) in &rows {
        if k.starts_with("latency_by_") {
            continue;
        }
        match k.strip_prefix("cost.") {
            Some(c) => cost.push(vec![esc(c), esc(&with_unit(k, v))]),
            None => run.push(vec![esc(k), esc(&with_unit(k, v))]),
        }
    }
    format!(
        "<div class=\"row\">{}{}</div><details><summary>summary.json</summary><pre>{}</pre></details>",
        grid("Run", &["measure", "value"], &run),
        grid("Cost model (after defaults)", &["[cost] key", "value"], &cost),
        esc(&format!("{summary:#}"))
    )
}

/// Draws the run's plots into `dir` and writes `dir/report.html`.
pub fn write_run_report(plan: &Plan, o: &Outcome, summary: &Value, dir: &Path) -> Result<(), SimError> {
    let mut figures = String::new();
    for c in run_charts(plan, o) {
        let svg = render(&c, dir)?;
        figures.push_str(&format!("<figure class=\"plot\" id=\"{}\">{svg}</figure>\n", c.file));
    }
    let sections = vec![
        ("Summary".to_string(), summary_tables(plan, summary)),
        ("Plots".to_string(), figures),
        ("Run details".to_string(), run_tables(summary)),
        ("Scenario".to_string(), format!("<pre>{}</pre>", esc(&plan.text))),
    ];
    let html = page(&format!("doorbell sim: {} (seed {})", plan.name, o.seed), &sections);
    crate::write(dir, "report.html", html.as_bytes())
}

#[cfg(test)]
mod tests {
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
