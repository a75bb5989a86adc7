//! The HTML of the reports: a self-contained page ([`page`]), tables of figures with their
//! units ([`table`], [`with_unit`]), and the run report's summary and details tables.
//!
//! Everything is escaped ([`esc`]) where it enters the page; the page has no script and
//! names no other file.

use serde_json::Value;

use super::chart::Rgb;
use super::style::{class_color, format_ns, num3, priority_color, priority_name, priority_rank, thousands};
use crate::scenario::Plan;

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
pub(super) fn summary_tables(plan: &Plan, summary: &Value) -> String {
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
pub(super) fn run_tables(summary: &Value) -> String {
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
