//! Deterministic simulation at scale (roadmap item 7, issue 14).
//!
//! A scenario file ([`scenario`]) describes a device, groups of queues with their workloads
//! and command-buffer contents, fence dependencies and timed events. [`run::run`] plays it on
//! the real stack — `umd` submission loops, doorbells, the firmware, the engines and the
//! kernel — under the deterministic `Sim` driver, in virtual time, where every packet costs
//! device time (`gpu::cost`; the `SYNTHETIC` packet is a dispatch whose duration is given).
//! [`output`] turns the outcome into `summary.json`, `queues.csv`, `timeseries.csv` and `trace.json`;
//! [`report`] draws the plots and the self-contained `report.html`; [`sweep`] runs a base
//! scenario over axes of values and seeds, in parallel and in shards, and merges shards.
//!
//! Invariants: a run depends only on the scenario and the seed (no wall clock, no hash
//! order, no thread timing reaches an output), so the same pair gives byte-identical files;
//! a bad scenario is refused before anything runs, naming the file, line, key and value.
#![forbid(unsafe_code)]

pub mod observe;
pub mod output;
pub mod report;
pub mod rows;
pub mod run;
pub mod scenario;
pub mod swarm;
pub mod sweep;

use std::path::Path;

pub use run::{Outcome, RunError, run, run_observed};
pub use scenario::{Plan, Scenario, ScenarioError};

/// Any failure of the simulator's commands.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The scenario (or sweep) was refused.
    #[error("{0}")]
    Scenario(#[from] ScenarioError),
    /// The run failed.
    #[error("{0}")]
    Run(#[from] RunError),
    /// Runs of a sweep failed; the finished ones' rows were written.
    #[error(
        "{} of the sweep's runs failed; the {finished} finished runs are in {dir}/runs.csv (failures in {dir}/failures.txt). First: {}",
        failures.len(),
        failures.first().map_or(String::new(), |f| f.to_string())
    )]
    Sweep {
        /// Each failed run, with its id, seed and axis values.
        failures: Vec<RunFailed>,
        /// Runs that finished.
        finished: usize,
        /// Where their rows are.
        dir: String,
    },
    /// An output could not be written.
    #[error("{path}: {why}")]
    Io {
        /// The file.
        path: String,
        /// The OS's error.
        why: String,
    },
}

/// One sweep run that failed: which run, with which seed and axis values, and why.
#[derive(Debug, thiserror::Error)]
#[error("run {run} (seed {seed}, {axes}): {error}")]
pub struct RunFailed {
    /// The run's id (its row in `runs.csv`).
    pub run: usize,
    /// Its seed.
    pub seed: u64,
    /// Its axis values, `key = value, …`.
    pub axes: String,
    /// Why it failed.
    pub error: Box<SimError>,
}

pub(crate) fn write(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), SimError> {
    let p = dir.join(name);
    std::fs::write(&p, bytes).map_err(|e| SimError::Io { path: p.display().to_string(), why: e.to_string() })
}

/// Runs `plan` with `seed` and writes every output into `dir`: `summary.json`,
/// `queues.csv`, `latency.csv`, `timeseries.csv`, `trace.json`, the plots (SVG and PNG) and
/// `report.html`.
pub fn run_to_dir(
    plan: &Plan,
    seed: u64,
    dir: &Path,
    progress: &mut dyn FnMut(f64),
) -> Result<(Outcome, serde_json::Value), SimError> {
    std::fs::create_dir_all(dir).map_err(|e| SimError::Io { path: dir.display().to_string(), why: e.to_string() })?;
    let o = run(plan, seed, progress)?;
    let summary = output::summary(plan, &o);
    write(dir, "summary.json", format!("{:#}\n", summary).as_bytes())?;
    write(dir, "queues.csv", output::queues_csv(plan, &o).as_bytes())?;
    write(dir, "latency.csv", output::latency_csv(plan, &o).as_bytes())?;
    write(dir, "timeseries.csv", output::timeseries_csv(&o).as_bytes())?;
    write(dir, "trace.json", output::trace_json(plan, &o).as_bytes())?;
    report::write_run_report(plan, &o, &summary, dir)?;
    Ok((o, summary))
}
