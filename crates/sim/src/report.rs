//! Plots (SVG and PNG) and the self-contained `report.html`.
//!
//! Plots are drawn with `plotters`: the SVG backend writes text as `<text>` elements the
//! browser renders, and the bitmap backend draws text with DejaVu Sans, which the `dejavu`
//! crate bundles, so no system font is needed anywhere. `report.html` is one file: the
//! scenario, the summary table and every plot inlined as SVG (no script, no server, no other
//! file). Everything is drawn from deterministic data, so the files are byte-identical for
//! the same outcome.

use std::path::Path;
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;
use serde_json::Value;

use crate::SimError;
use crate::output::percentile;
use crate::run::Outcome;
use crate::scenario::Plan;

/// One line of a chart.
#[derive(Clone, Debug)]
pub struct Line {
    /// Legend.
    pub name: String,
    /// Points (x, y).
    pub points: Vec<(f64, f64)>,
    /// Drawn thin and pale (a spread, beside the line it belongs to).
    pub faint: bool,
}

/// A chart.
#[derive(Clone, Debug)]
pub struct Chart {
    /// File stem and title.
    pub file: String,
    /// Title.
    pub title: String,
    /// X axis label.
    pub x: String,
    /// Y axis label.
    pub y: String,
    /// Lines.
    pub lines: Vec<Line>,
}

const SIZE: (u32, u32) = (800, 480);

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

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, c: &Chart) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let pts = c.lines.iter().flat_map(|l| l.points.iter());
    let (mut x0, mut x1, mut y1) = (f64::MAX, f64::MIN, 0.0f64);
    for &(x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        (x0, x1) = (0.0, 1.0);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    if y1 <= 0.0 {
        y1 = 1.0;
    }
    let mut chart = ChartBuilder::on(&root)
        .caption(&c.title, ("sans-serif", 17))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(95)
        .build_cartesian_2d(x0..x1, 0.0..y1 * 1.05)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc(c.x.as_str())
        .y_desc(c.y.as_str())
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(|e| e.to_string())?;
    let mut k = 0usize;
    for l in &c.lines {
        let color = Palette99::pick(if l.faint { k.saturating_sub(1) } else { k }).to_rgba();
        if l.faint {
            chart
                .draw_series(LineSeries::new(l.points.iter().copied(), color.mix(0.35).stroke_width(1)))
                .map_err(|e| e.to_string())?;
            continue;
        }
        k += 1;
        chart
            .draw_series(LineSeries::new(l.points.iter().copied(), color.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(l.name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())?;
    Ok(())
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

/// The run's four charts.
pub fn run_charts(plan: &Plan, o: &Outcome) -> Vec<Chart> {
    // Latency CDF per priority.
    let mut by_prio: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
    for (gi, g) in plan.groups.iter().enumerate() {
        by_prio.entry(format!("{:?}", g.priority).to_lowercase()).or_default().extend_from_slice(&o.latencies[gi]);
    }
    let mut cdf = Vec::new();
    for (name, mut v) in by_prio {
        v.sort_unstable();
        // At most 200 points per line: the quantiles.
        let points = (0..=200)
            .map(|k| {
                let p = k as f64 / 2.0;
                (percentile(&v, p.max(0.01)) as f64 / 1e3, p / 100.0)
            })
            .collect();
        cdf.push(Line { name, points, faint: false });
    }
    let ms = |t: u64| t as f64 / 1e6;
    let bucket_s = o.bucket as f64 / 1e9;
    let throughput = vec![Line {
        name: "completions/s".into(),
        points: o.samples.iter().map(|s| (ms(s.t), s.completions as f64 / bucket_s)).collect(),
        faint: false,
    }];
    let occupancy = (0..o.engines.len())
        .map(|e| Line {
            name: format!("{} ({} slots)", o.engines[e], o.slots),
            points: o.samples.iter().map(|s| (ms(s.t), s.slots_held.get(e).copied().unwrap_or(0) as f64)).collect(),
            faint: false,
        })
        .collect();
    let fairness = plan
        .groups
        .iter()
        .enumerate()
        .map(|(gi, g)| Line {
            name: g.name.clone(),
            points: o
                .queues
                .iter()
                .enumerate()
                .filter(|(_, q)| q.group == gi)
                .map(|(i, q)| (i as f64, q.completed_in_window as f64))
                .collect(),
            faint: false,
        })
        .collect();
    vec![
        Chart {
            file: "latency_cdf".into(),
            title: "Latency CDF per priority".into(),
            x: "submit to completion (µs)".into(),
            y: "fraction".into(),
            lines: cdf,
        },
        Chart {
            file: "throughput".into(),
            title: "Throughput over time".into(),
            x: "virtual time (ms)".into(),
            y: "completions per second".into(),
            lines: throughput,
        },
        Chart {
            file: "slot_occupancy".into(),
            title: "Hardware slots held over time".into(),
            x: "virtual time (ms)".into(),
            y: "slots held".into(),
            lines: occupancy,
        },
        Chart {
            file: "fairness".into(),
            title: "Completions per queue (fairness)".into(),
            x: "queue".into(),
            y: "completed in the window".into(),
            lines: fairness,
        },
    ]
}

pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// The rows of a summary table: every scalar, dotted paths for nested objects.
fn flatten(prefix: &str, v: &Value, out: &mut Vec<(String, String)>) {
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
        other => out.push((prefix.to_string(), other.to_string())),
    }
}

/// A self-contained HTML page.
pub fn page(title: &str, sections: &[(String, String)]) -> String {
    let mut h = String::new();
    h.push_str("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">");
    h.push_str(&format!("<title>{}</title>", esc(title)));
    h.push_str(
        "<style>body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse}\
         td,th{border:1px solid #ccc;padding:2px 8px;text-align:left;font-size:13px}\
         pre{background:#f6f6f6;padding:1em;overflow:auto}figure{margin:1em 0}\
         figure svg{max-width:100%;height:auto}</style></head><body>\n",
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
    let mut t = String::from("<table><tr><th>measure</th><th>value</th></tr>\n");
    for (k, v) in rows {
        t.push_str(&format!("<tr><td>{}</td><td>{}</td></tr>\n", esc(k), esc(v)));
    }
    t.push_str("</table>");
    t
}

/// Draws the run's plots into `dir` and writes `dir/report.html`.
pub fn write_run_report(plan: &Plan, o: &Outcome, summary: &Value, dir: &Path) -> Result<(), SimError> {
    let mut figures = String::new();
    for c in run_charts(plan, o) {
        let svg = render(&c, dir)?;
        figures.push_str(&format!("<figure class=\"plot\" id=\"{}\">{svg}</figure>\n", c.file));
    }
    let mut rows = Vec::new();
    flatten("", summary, &mut rows);
    let sections = vec![
        ("Plots".to_string(), figures),
        ("Summary".to_string(), table(&rows)),
        ("Scenario".to_string(), format!("<pre>{}</pre>", esc(&plan.text))),
    ];
    let html = page(&format!("doorbell sim: {} (seed {})", plan.name, o.seed), &sections);
    crate::write(dir, "report.html", html.as_bytes())
}
