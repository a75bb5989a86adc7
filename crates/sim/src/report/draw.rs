//! Drawing a [`Chart`] with `plotters`, as SVG and PNG: its axes (linear, log, categories)
//! and ticks, its event lanes above the data, its series, its legend beside the plot.
//!
//! The SVG backend writes text as `<text>` elements the browser renders, and the bitmap
//! backend draws text with DejaVu Sans, which the `dejavu` crate bundles, so no system font
//! is needed anywhere.

use std::path::Path;
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::chart::{BoxStats, Chart, Rgb, Scale, Series, Shape, Unit};
use super::style::{format_ns, num3, thousands};
use crate::SimError;

const SIZE: (u32, u32) = (1000, 500);
/// The legend's column, right of the plot.
const LEGEND_W: u32 = 290;
/// The most characters of a legend line.
const LEGEND_CHARS: usize = 40;
/// An event lane's height, as a share of the data's height.
const LANE: f64 = 0.07;
/// A kind with at most this many events is also drawn as lines through the data.
const RARE: usize = 12;

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
pub(super) fn log_ticks(lo: f64, hi: f64) -> (Vec<f64>, Vec<f64>) {
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

pub(super) fn tick_label(v: f64, scale: &Scale, unit: Unit) -> String {
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

pub(super) fn unit_label(v: f64, unit: Unit) -> String {
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

/// A chart's axes: the x range with its ticks (bold: labelled lines; light: faint lines), the
/// data's y range, the top tick and the axis' top (above the event lanes).
struct Frame {
    x0: f64,
    x1: f64,
    bold: Vec<f64>,
    light: Vec<f64>,
    ymin: f64,
    ymax: f64,
    tick_top: f64,
    ytop: f64,
}

/// The x and y ranges the data sit in.
#[derive(Clone, Copy)]
struct Bounds {
    x0: f64,
    x1: f64,
    ymin: f64,
    ymax: f64,
}

/// The plot's coordinates.
type Plot<'a, DB> = ChartContext<'a, DB, Cartesian2d<Ticks, Ticks>>;

/// The axes of `c`: its data's extent, the scale's ticks, a lane per event kind above.
fn frame(c: &Chart) -> Frame {
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
    Frame { x0, x1, bold, light, ymin, ymax, tick_top, ytop }
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, c: &Chart) -> Result<(), Err>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(e2s)?;
    let (plot, legend) = root.split_horizontally(SIZE.0 - LEGEND_W);
    let Frame { x0, x1, bold, light, ymin, ymax, tick_top, ytop } = frame(c);
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
    let b = Bounds { x0, x1, ymin, ymax };
    draw_lanes(&mut chart, &plot, c, b)?;
    for s in &c.series {
        draw_series(&mut chart, c, s, b)?;
    }
    draw_legend(&legend, c)?;
    root.present().map_err(e2s)?;
    Ok(())
}

/// Event lanes above the data, rare events also as lines through it.
fn draw_lanes<DB: DrawingBackend>(
    chart: &mut Plot<'_, DB>,
    plot: &DrawingArea<DB, Shift>,
    c: &Chart,
    b: Bounds,
) -> Result<(), Err>
where
    DB::ErrorType: 'static,
{
    let Bounds { x0, x1, ymin, ymax } = b;
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
    Ok(())
}

/// One series: a line, dots with error bars, or a box with its whiskers and dots.
fn draw_series<DB: DrawingBackend>(chart: &mut Plot<'_, DB>, c: &Chart, s: &Series, b: Bounds) -> Result<(), Err>
where
    DB::ErrorType: 'static,
{
    let Bounds { x0, x1, .. } = b;
    let color = rgb(s.color);
    match &s.shape {
        Shape::Line(p) => {
            chart
                .draw_series(LineSeries::new(p.iter().map(|&(x, y)| (xmap(&c.x_scale, x), y)), color.stroke_width(2)))
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
        Shape::Box { x, stats } => draw_box(chart, color, *x, stats)?,
    }
    Ok(())
}

/// A box plot at `x`: the box from q1 to q3 with the median, whiskers, and dots beside it.
fn draw_box<DB: DrawingBackend>(chart: &mut Plot<'_, DB>, color: RGBColor, x: f64, b: &BoxStats) -> Result<(), Err>
where
    DB::ErrorType: 'static,
{
    let w = 0.25;
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
