//! Policy studies: a base scenario swept over axes of values and seeds.
//!
//! A sweep file names a base scenario, axes (any scenario key as a dotted path, each with a
//! list of values; `group.NAME.key` or `group.INDEX.key` reach into a group) and seeds. The
//! combinations are numbered in a fixed order — axes in key order, the last axis fastest,
//! then seeds — and run `k` belongs to shard `k mod N`, so `--shard I/N` is a deterministic
//! slice, and shards on different machines need nothing from each other. Each run is one
//! [`crate::run`] (single-threaded); runs go in parallel on the local cores with rayon.
//!
//! Outputs: `runs.csv` (one row per run: run id, axis values, seed, then every scalar of the
//! run's summary, columns sorted), `sweep.json` (the sweep's text and which runs the
//! directory holds) and, for a complete set, `report.html` with one plot per metric and axis.
//! [`merge`] reads shard directories and writes exactly what one local run writes: both paths
//! go through the same row text and the same [`finish`], so the bytes are identical.
//!
//! Invariants: every run's row depends only on the sweep file and its run id; a merge refuses
//! shards of different sweeps, overlapping shards and incomplete sets, naming what is wrong.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use rayon::prelude::*;
use serde::Deserialize;
use serde_json::{Value as Json, json};

use crate::report::{Chart, Scale, Series, Shape, Unit, esc, ordered_color, page, render, table};
use crate::scenario::{Scenario, ScenarioError, Source};
use crate::{SimError, output};

/// A sweep file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepFile {
    /// The base scenario (relative to the sweep file).
    pub base: toml::Spanned<String>,
    /// Seeds (default `[1]`).
    #[serde(default = "default_seeds")]
    pub seeds: Vec<u64>,
    /// Axes: dotted scenario key → values.
    #[serde(default)]
    pub axes: BTreeMap<String, toml::Spanned<Vec<toml::Value>>>,
    /// Summary fields to plot (default: throughput, fairness, lost and the p99 per priority).
    #[serde(default)]
    pub metrics: Vec<String>,
}

fn default_seeds() -> Vec<u64> {
    vec![1]
}

/// A loaded sweep.
#[derive(Clone, Debug)]
pub struct Sweep {
    /// The sweep file.
    pub path: PathBuf,
    /// Its text.
    pub text: String,
    /// The base scenario's path and text.
    pub base_path: PathBuf,
    /// Base text.
    pub base_text: String,
    /// Parsed base.
    pub base: toml::Table,
    /// Axes in order.
    pub axes: Vec<(String, Vec<toml::Value>)>,
    /// Seeds.
    pub seeds: Vec<u64>,
    /// Metrics to plot.
    pub metrics: Vec<String>,
}

/// One run's row: its id and its cells (column → text).
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// Run id.
    pub id: usize,
    /// Cells.
    pub cells: BTreeMap<String, String>,
}

impl Sweep {
    /// Reads a sweep file and its base scenario; every combination is checked before any
    /// runs (a bad axis value is refused with the sweep file's line).
    pub fn load(path: &Path) -> Result<Sweep, SimError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ScenarioError::Io { file: path.display().to_string(), why: e.to_string() })?;
        let src = Source { path: path.to_path_buf(), text: text.clone() };
        let f: SweepFile = toml::from_str(&text).map_err(|e| {
            let span = e.span().unwrap_or(0..0);
            src.at(span, "sweep", "", e.message().to_string())
        })?;
        let base_path = path.parent().unwrap_or(Path::new(".")).join(f.base.get_ref());
        let base_text = std::fs::read_to_string(&base_path).map_err(|e| ScenarioError::Invalid {
            file: path.display().to_string(),
            line: text[..f.base.span().start].matches('\n').count() + 1,
            key: "base".into(),
            value: f.base.get_ref().clone(),
            why: format!("cannot read {}: {e}", base_path.display()),
        })?;
        // The base must be a valid scenario on its own.
        Scenario::parse(&base_path, &base_text)?;
        let base: toml::Table = toml::from_str(&base_text)
            .map_err(|e| Source { path: base_path.clone(), text: base_text.clone() }.at(0..0, "", "", e.to_string()))?;
        if f.seeds.is_empty() {
            return Err(src.at(0..0, "seeds", "[]", "at least one seed".into()).into());
        }
        let mut axes = Vec::new();
        for (k, v) in &f.axes {
            if v.get_ref().is_empty() {
                return Err(src
                    .at(v.span(), &format!("axes.{k}"), "[]", "an axis needs at least one value".into())
                    .into());
            }
            axes.push((k.clone(), v.get_ref().clone()));
        }
        // A metric that names no summary field would plot nothing: refused now, with the choice.
        if let Some(bad) = f.metrics.iter().find(|m| {
            !crate::output::METRICS.contains(&m.as_str()) && !crate::output::LATENCY_METRICS.contains(&m.as_str())
        }) {
            let choice = [crate::output::METRICS, crate::output::LATENCY_METRICS].concat().join(", ");
            let at = text.find(&format!("\"{bad}\"")).map_or(0, |i| i + 1);
            let why = format!("names no summary field; choose from {choice}");
            return Err(src.at(at..at + bad.len(), "metrics", bad, why).into());
        }
        let metrics = if f.metrics.is_empty() {
            vec!["throughput_per_s".into(), "jain_fairness".into(), "lost".into(), "p99_ns".into()]
        } else {
            f.metrics.clone()
        };
        let s = Sweep { path: path.to_path_buf(), text, base_path, base_text, base, axes, seeds: f.seeds, metrics };
        // Check every combination now: a sweep never fails half-way for a bad value.
        for c in 0..s.combinations() {
            let v = s.scenario_value(c).map_err(|(k, why)| {
                let span = f.axes.get(&k).map_or(0..0, |v| v.span());
                SimError::from(src.at(span, &format!("axes.{k}"), "", why))
            })?;
            Scenario::from_value(&s.path, &s.text, toml::Value::Table(v)).map_err(|e| match e {
                ScenarioError::Invalid { key, value, why, .. } => {
                    let axis = s.axes.iter().find(|(k, _)| key.contains(k.rsplit('.').next().unwrap_or(k)));
                    let span = axis.and_then(|(k, _)| f.axes.get(k)).map_or(0..0, |v| v.span());
                    SimError::from(src.at(span, &key, &value, why))
                }
                other => other.into(),
            })?;
        }
        Ok(s)
    }

    /// Combinations of axis values.
    pub fn combinations(&self) -> usize {
        self.axes.iter().map(|(_, v)| v.len()).product()
    }

    /// Runs in all (combinations × seeds).
    pub fn runs(&self) -> usize {
        self.combinations() * self.seeds.len()
    }

    /// The axis values of combination `c` (last axis fastest).
    fn values(&self, mut c: usize) -> Vec<toml::Value> {
        let mut out = vec![toml::Value::Boolean(false); self.axes.len()];
        for (i, (_, vals)) in self.axes.iter().enumerate().rev() {
            out[i] = vals[c % vals.len()].clone();
            c /= vals.len();
        }
        out
    }

    /// The scenario of combination `c`: the base with the axis values set.
    fn scenario_value(&self, c: usize) -> Result<toml::Table, (String, String)> {
        let mut t = self.base.clone();
        for ((k, _), v) in self.axes.iter().zip(self.values(c)) {
            set_path(&mut t, k, v).map_err(|why| (k.clone(), why))?;
        }
        Ok(t)
    }

    /// Runs the runs of shard `shard` of `shards` (all with 1 of 1) in parallel; calls
    /// `tick(done, total)` as they finish.
    pub fn run_shard(
        &self,
        shard: usize,
        shards: usize,
        tick: &(dyn Fn(usize, usize) + Sync),
    ) -> (Vec<Row>, Vec<crate::RunFailed>) {
        let ids: Vec<usize> = (0..self.runs()).filter(|k| k % shards == shard).collect();
        let done = AtomicUsize::new(0);
        let total = ids.len();
        // Every run goes to its end, so one failure keeps the others' results.
        let results: Vec<Result<Row, crate::RunFailed>> = ids
            .par_iter()
            .map(|&k| {
                let r = self.run_one(k).map_err(|e| self.failed(k, e));
                // Relaxed: a progress count; the rows travel through rayon's join.
                let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                tick(n, total);
                r
            })
            .collect();
        let mut rows = Vec::new();
        let mut failures = Vec::new();
        for r in results {
            match r {
                Ok(row) => rows.push(row),
                Err(f) => failures.push(f),
            }
        }
        (rows, failures)
    }

    /// Names run `k` for an error: its id, seed and axis values.
    fn failed(&self, k: usize, error: SimError) -> crate::RunFailed {
        let c = k / self.seeds.len();
        let axes = self
            .axes
            .iter()
            .zip(self.values(c))
            .map(|((key, _), v)| format!("{key} = {}", value_text(&v)))
            .collect::<Vec<_>>()
            .join(", ");
        crate::RunFailed { run: k, seed: self.seeds[k % self.seeds.len()], axes, error: Box::new(error) }
    }

    /// Runs run `k` and returns its row.
    pub fn run_one(&self, k: usize) -> Result<Row, SimError> {
        let c = k / self.seeds.len();
        let seed = self.seeds[k % self.seeds.len()];
        let v = self.scenario_value(c).map_err(|(key, why)| {
            SimError::from(Source { path: self.path.clone(), text: self.text.clone() }.at(0..0, &key, "", why))
        })?;
        let plan = Scenario::from_value(&self.base_path, &self.base_text, toml::Value::Table(v))?;
        let o = crate::run(&plan, seed, &mut |_| {})?;
        let summary = output::summary(&plan, &o);
        let mut cells = BTreeMap::new();
        for ((k, _), v) in self.axes.iter().zip(self.values(c)) {
            cells.insert(format!("axis:{k}"), value_text(&v));
        }
        cells.insert("seed".into(), seed.to_string());
        let mut flat = Vec::new();
        flatten_numbers("", &summary, &mut flat);
        for (key, val) in flat {
            cells.insert(key, val);
        }
        Ok(Row { id: k, cells })
    }
}

/// Sets a dotted path in a TOML table; `group.NAME` / `group.INDEX` select an array element.
fn set_path(t: &mut toml::Table, path: &str, v: toml::Value) -> Result<(), String> {
    let parts: Vec<&str> = path.split('.').collect();
    let mut cur: &mut toml::Table = t;
    let mut i = 0;
    while i + 1 < parts.len() {
        let p = parts[i];
        let entry = cur.entry(p.to_string()).or_insert_with(|| toml::Value::Table(Default::default()));
        match entry {
            toml::Value::Table(next) => {
                cur = next;
                i += 1;
            }
            toml::Value::Array(items) => {
                let sel = parts.get(i + 1).ok_or_else(|| format!("{p} is a list: name an element"))?;
                let idx = match sel.parse::<usize>() {
                    Ok(n) => n,
                    Err(_) => items
                        .iter()
                        .position(|x| x.get("name").and_then(toml::Value::as_str) == Some(sel))
                        .ok_or_else(|| format!("no {p} is named {sel}"))?,
                };
                let item = items.get_mut(idx).ok_or_else(|| format!("{p} has no element {idx}"))?;
                cur = item.as_table_mut().ok_or_else(|| format!("{p}.{sel} is not a table"))?;
                i += 2;
                if i >= parts.len() {
                    return Err("the path ends at a list element: name a key in it".into());
                }
            }
            _ => return Err(format!("{p} is not a table")),
        }
    }
    let last = parts.last().ok_or("empty path")?;
    cur.insert(last.to_string(), v);
    Ok(())
}

fn value_text(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Every numeric scalar of the summary, dotted (strings and arrays of objects included by
/// index).
fn flatten_numbers(prefix: &str, v: &Json, out: &mut Vec<(String, String)>) {
    match v {
        Json::Object(m) => {
            for (k, x) in m {
                let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                flatten_numbers(&key, x, out);
            }
        }
        Json::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                flatten_numbers(&format!("{prefix}.{i}"), x, out);
            }
        }
        Json::Number(n) => out.push((prefix.to_string(), n.to_string())),
        _ => {}
    }
}

fn csv_cell(s: &str) -> String {
    if s.contains([',', '"', '\n']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s.to_string() }
}

/// The CSV text of rows: `run` first, then every column in sorted order.
pub fn rows_csv(rows: &[Row]) -> String {
    let cols: BTreeSet<&String> = rows.iter().flat_map(|r| r.cells.keys()).collect();
    let mut s = String::from("run");
    for c in &cols {
        s.push(',');
        s.push_str(&csv_cell(c));
    }
    s.push('\n');
    for r in rows {
        s.push_str(&r.id.to_string());
        for c in &cols {
            s.push(',');
            s.push_str(&csv_cell(r.cells.get(*c).map_or("", String::as_str)));
        }
        s.push('\n');
    }
    s
}

/// Parses [`rows_csv`]'s text back.
pub fn parse_rows(text: &str, file: &str) -> Result<Vec<Row>, SimError> {
    let bad = |line: usize, why: &str| SimError::Io { path: format!("{file}:{line}"), why: why.to_string() };
    let mut lines = text.lines().enumerate();
    let (_, head) = lines.next().ok_or_else(|| bad(1, "empty runs.csv"))?;
    let cols = split_csv(head);
    if cols.first().map(String::as_str) != Some("run") {
        return Err(bad(1, "the first column must be `run`"));
    }
    let mut rows = Vec::new();
    for (n, line) in lines {
        let cells = split_csv(line);
        if cells.len() != cols.len() {
            return Err(bad(n + 1, "a row has a different number of cells than the header"));
        }
        let id = cells[0].parse().map_err(|_| bad(n + 1, "the run id is not a number"))?;
        let map = cols[1..]
            .iter()
            .zip(&cells[1..])
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        rows.push(Row { id, cells: map });
    }
    Ok(rows)
}

fn split_csv(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => out.push(std::mem::take(&mut cur)),
            (c, _) => cur.push(c),
        }
    }
    out.push(cur);
    out
}

/// `sweep.json`: what a directory holds.
fn meta(s: &Sweep, shard: usize, shards: usize) -> Json {
    json!({
        "sweep": s.path.display().to_string(),
        "sweep_text": s.text,
        "base_text": s.base_text,
        "runs": s.runs(),
        "shard": shard,
        "shards": shards,
        "axes": s.axes.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(),
        "metrics": s.metrics,
    })
}

/// Runs shard `shard`/`shards` of `s` and writes its outputs into `dir` (a complete set —
/// one shard of one — also gets the report).
pub fn run_to_dir(
    s: &Sweep,
    shard: usize,
    shards: usize,
    dir: &Path,
    tick: &(dyn Fn(usize, usize) + Sync),
) -> Result<Vec<Row>, SimError> {
    std::fs::create_dir_all(dir).map_err(|e| SimError::Io { path: dir.display().to_string(), why: e.to_string() })?;
    let (rows, failures) = s.run_shard(shard, shards, tick);
    // Through the text, exactly as a merge reads it back.
    let text = rows_csv(&rows);
    if !failures.is_empty() {
        // The finished runs are kept (a merge reports the missing ones), the failures listed.
        crate::write(dir, "runs.csv", text.as_bytes())?;
        let list: String = failures.iter().map(|f| format!("{f}\n")).collect();
        crate::write(dir, "failures.txt", list.as_bytes())?;
        return Err(SimError::Sweep { failures, finished: rows.len(), dir: dir.display().to_string() });
    }
    let rows = parse_rows(&text, "runs.csv")?;
    let m = meta(s, shard, shards);
    if shards == 1 {
        finish(&m, &rows, dir)?;
    } else {
        crate::write(dir, "runs.csv", text.as_bytes())?;
        crate::write(dir, "sweep.json", format!("{m:#}\n").as_bytes())?;
    }
    Ok(rows)
}

/// Joins shard directories into `out`: the same files one local run writes.
pub fn merge(dirs: &[PathBuf], out: &Path) -> Result<usize, SimError> {
    let io = |p: &Path, e: std::io::Error| SimError::Io { path: p.display().to_string(), why: e.to_string() };
    let mut first: Option<Json> = None;
    let mut rows: Vec<Row> = Vec::new();
    let mut seen_shards = BTreeSet::new();
    for d in dirs {
        let mp = d.join("sweep.json");
        let m: Json = serde_json::from_str(&std::fs::read_to_string(&mp).map_err(|e| io(&mp, e))?)
            .map_err(|e| SimError::Io { path: mp.display().to_string(), why: e.to_string() })?;
        if let Some(f) = &first {
            for k in ["sweep_text", "base_text", "runs", "shards"] {
                if f[k] != m[k] {
                    return Err(SimError::Io {
                        path: mp.display().to_string(),
                        why: format!("{k} differs from {}'s: shards of different sweeps", dirs[0].display()),
                    });
                }
            }
        }
        if !seen_shards.insert(m["shard"].as_u64().unwrap_or(u64::MAX)) {
            return Err(SimError::Io {
                path: mp.display().to_string(),
                why: format!("shard {} given twice", m["shard"]),
            });
        }
        let rp = d.join("runs.csv");
        let text = std::fs::read_to_string(&rp).map_err(|e| io(&rp, e))?;
        rows.extend(parse_rows(&text, &rp.display().to_string())?);
        first.get_or_insert(m);
    }
    let m = first.ok_or_else(|| SimError::Io { path: "merge".into(), why: "no directories given".into() })?;
    rows.sort_by_key(|r| r.id);
    let runs = m["runs"].as_u64().unwrap_or(0) as usize;
    let ids: Vec<usize> = rows.iter().map(|r| r.id).collect();
    if ids != (0..runs).collect::<Vec<_>>() {
        let missing: Vec<usize> = (0..runs).filter(|k| !ids.contains(k)).take(10).collect();
        return Err(SimError::Io {
            path: out.display().to_string(),
            why: format!(
                "the shards hold {} of {runs} runs (missing: {missing:?}; duplicates are refused too)",
                ids.len()
            ),
        });
    }
    let mut whole = m.clone();
    whole["shard"] = json!(0);
    whole["shards"] = json!(1);
    std::fs::create_dir_all(out).map_err(|e| io(out, e))?;
    finish(&whole, &rows, out)?;
    Ok(rows.len())
}

/// Writes a complete set's `runs.csv`, `sweep.json`, plots and `report.html`.
pub fn finish(m: &Json, rows: &[Row], dir: &Path) -> Result<(), SimError> {
    let mut m = m.clone();
    m["shard"] = json!(0);
    m["shards"] = json!(1);
    crate::write(dir, "runs.csv", rows_csv(rows).as_bytes())?;
    crate::write(dir, "sweep.json", format!("{m:#}\n").as_bytes())?;
    let axes: Vec<String> =
        m["axes"].as_array().into_iter().flatten().filter_map(|a| a.as_str().map(String::from)).collect();
    let wanted: Vec<String> =
        m["metrics"].as_array().into_iter().flatten().filter_map(|a| a.as_str().map(String::from)).collect();
    // A metric names a summary field, or a suffix of one (`p99_ns` matches every priority's).
    let cols: BTreeSet<&String> = rows.iter().flat_map(|r| r.cells.keys()).collect();
    let metrics: Vec<String> = wanted
        .iter()
        .flat_map(|w| {
            cols.iter()
                .filter(|c| {
                    !c.starts_with("axis:")
                        && (c.as_str() == w.as_str()
                            || (c.ends_with(&format!(".{w}")) && c.starts_with("latency_by_priority")))
                })
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    let mut figures = String::new();
    for metric in &metrics {
        for axis in &axes {
            let c = chart(rows, &axes, axis, metric);
            let svg = render(&c, dir)?;
            figures.push_str(&format!("<figure class=\"plot\" id=\"{}\">{svg}</figure>\n", c.file));
        }
    }
    // The runs table: axes, seed and the metrics.
    let mut t = String::from("<table><tr><th>run</th>");
    for a in &axes {
        t.push_str(&format!("<th>{}</th>", esc(a)));
    }
    t.push_str("<th>seed</th>");
    for mtr in &metrics {
        t.push_str(&format!("<th>{}</th>", esc(mtr)));
    }
    t.push_str("</tr>\n");
    for r in rows {
        t.push_str(&format!("<tr><td>{}</td>", r.id));
        for a in &axes {
            t.push_str(&format!("<td>{}</td>", esc(r.cells.get(&format!("axis:{a}")).map_or("", String::as_str))));
        }
        t.push_str(&format!("<td>{}</td>", esc(r.cells.get("seed").map_or("", String::as_str))));
        for mtr in &metrics {
            t.push_str(&format!("<td>{}</td>", esc(r.cells.get(mtr).map_or("", String::as_str))));
        }
        t.push_str("</tr>\n");
    }
    t.push_str("</table>");
    let about = vec![
        ("runs".to_string(), rows.len().to_string()),
        ("axes".to_string(), axes.join(", ")),
        ("sweep file".to_string(), m["sweep"].as_str().unwrap_or("").to_string()),
    ];
    let sections = vec![
        ("Sweep".to_string(), table(&about)),
        ("Plots".to_string(), figures),
        ("Runs".to_string(), t),
        ("Sweep file".to_string(), format!("<pre>{}</pre>", esc(m["sweep_text"].as_str().unwrap_or("")))),
        ("Base scenario".to_string(), format!("<pre>{}</pre>", esc(m["base_text"].as_str().unwrap_or("")))),
    ];
    crate::write(dir, "report.html", page("doorbell sim sweep", &sections).as_bytes())
}

/// Student's t at 97.5 % for `df` degrees of freedom (a two-sided 95 % interval); 1.96 past 30.
fn t975(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
    ];
    if df == 0 { 0.0 } else { T.get(df - 1).copied().unwrap_or(1.96) }
}

/// The mean of `ys` and its 95 % interval (Student's t over the seeds; none for one seed).
pub fn mean_interval(ys: &[f64]) -> (f64, f64, f64) {
    let n = ys.len() as f64;
    let mean = ys.iter().sum::<f64>() / n;
    if ys.len() < 2 {
        return (mean, mean, mean);
    }
    let var = ys.iter().map(|y| (y - mean) * (y - mean)).sum::<f64>() / (n - 1.0);
    let half = t975(ys.len() - 1) * (var / n).sqrt();
    (mean, mean - half, mean + half)
}

/// Compares two axis values: as numbers where both are, else by their place in `order`.
fn value_order(a: &str, b: &str, order: &[String]) -> std::cmp::Ordering {
    match (a.parse::<f64>(), b.parse::<f64>()) {
        (Ok(x), Ok(y)) => x.total_cmp(&y),
        _ => {
            let at = |v: &str| order.iter().position(|o| o == v).unwrap_or(usize::MAX);
            at(a).cmp(&at(b)).then(a.cmp(b))
        }
    }
}

/// The most series one sweep chart draws.
const MAX_SERIES: usize = 8;

/// `metric` against `axis`: one series per combination of the other axes (legend in the order
/// of their values, numbers as numbers), each point the mean over seeds with its 95 %
/// interval. A numeric axis is a number line and its means are joined; an axis of names is
/// drawn as categories, each series' points side by side, never joined.
fn chart(rows: &[Row], axes: &[String], axis: &str, metric: &str) -> Chart {
    let key = format!("axis:{axis}");
    // Each axis' values in first-seen order (run order follows the sweep file's order).
    let mut seen: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for a in axes {
        let k = format!("axis:{a}");
        let vals = seen.entry(a.as_str()).or_default();
        for r in rows {
            if let Some(v) = r.cells.get(&k)
                && !vals.contains(v)
            {
                vals.push(v.clone());
            }
        }
    }
    let values = seen.get(axis).cloned().unwrap_or_default();
    let numeric = values.iter().all(|v| v.parse::<f64>().is_ok());
    let x_of = |v: &str| {
        if numeric { v.parse::<f64>().unwrap_or(0.0) } else { values.iter().position(|x| x == v).unwrap_or(0) as f64 }
    };
    let others: Vec<&String> = axes.iter().filter(|a| a.as_str() != axis).collect();
    // (other axes' values) -> x value -> samples over seeds
    let mut groups: BTreeMap<Vec<String>, BTreeMap<String, Vec<f64>>> = BTreeMap::new();
    for r in rows {
        let Some(v) = r.cells.get(&key) else { continue };
        let Some(y) = r.cells.get(metric).and_then(|y| y.parse::<f64>().ok()) else { continue };
        let label = others.iter().map(|a| r.cells.get(&format!("axis:{a}")).cloned().unwrap_or_default()).collect();
        groups.entry(label).or_default().entry(v.clone()).or_default().push(y);
    }
    let mut groups: Vec<_> = groups.into_iter().collect();
    groups.sort_by(|a, b| {
        a.0.iter()
            .zip(&b.0)
            .zip(&others)
            .map(|((x, y), ax)| value_order(x, y, seen.get(ax.as_str()).map_or(&[][..], Vec::as_slice)))
            .find(|o| o.is_ne())
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    let shown = groups.len().min(MAX_SERIES);
    let xs: Vec<f64> = values.iter().map(|v| x_of(v)).collect();
    let span = xs.iter().copied().fold(f64::MIN, f64::max) - xs.iter().copied().fold(f64::MAX, f64::min);
    let seeds = rows.iter().filter_map(|r| r.cells.get("seed")).collect::<BTreeSet<_>>().len();
    let mut series = Vec::new();
    for (k, (label, by_x)) in groups.iter().take(shown).enumerate() {
        // Side by side at each value, so the intervals do not hide each other.
        let width = if numeric { span * 0.04 } else { 0.4 };
        let shift = (k as f64 - (shown as f64 - 1.0) / 2.0) * width / shown as f64;
        let mut points: Vec<(f64, f64, f64, f64)> = by_x
            .iter()
            .map(|(v, ys)| {
                let (mean, lo, hi) = mean_interval(ys);
                (x_of(v) + shift, mean, lo, hi)
            })
            .collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let name = if label.is_empty() {
            metric.to_string()
        } else {
            others.iter().zip(label).map(|(a, v)| format!("{a}={v}")).collect::<Vec<_>>().join(", ")
        };
        series.push(Series { name, color: ordered_color(k, shown), shape: Shape::Interval { points, join: numeric } });
    }
    let mut notes = vec![format!("dot: mean over {seeds} seed{}", if seeds == 1 { "" } else { "s" })];
    if seeds > 1 {
        notes.push("bar: its 95% interval (Student's t)".into());
    }
    if groups.len() > shown {
        notes.push(format!("the first {shown} of {} series", groups.len()));
    }
    let safe = |s: &str| s.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect::<String>();
    Chart {
        file: format!("{}_vs_{}", safe(metric), safe(axis)),
        title: format!("{metric} vs {axis}"),
        x: axis.to_string(),
        y: metric.to_string(),
        x_scale: if numeric { Scale::Linear } else { Scale::Categories(values.clone()) },
        x_unit: Unit::Plain,
        x_ticks: numeric.then_some(xs),
        y_unit: if metric.ends_with("_ns") { Unit::Ns } else { Unit::Plain },
        y_top: None,
        series,
        marks: Vec::new(),
        notes,
    }
}
