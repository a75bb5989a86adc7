//! Scenario files: what a simulation runs, parsed from TOML and checked before anything runs.
//!
//! A scenario names the device (engines, hardware slots, doorbell model and pool, aggregated
//! doorbell, quanta, power timers, preemption granularity, TDR), the cost model, groups of
//! queues with their workloads and command-buffer contents, fence dependencies between
//! groups, and timed events. `docs/sim.md` lists every key.
//!
//! The code: this file is the file format (the TOML's sections as serde types, with their
//! defaults) and the parser; `check.rs` checks a parsed scenario section by section into the
//! [`Plan`] of `plan.rs`, the checked form the runner uses.
//!
//! Invariants: a [`Plan`] that [`Scenario::parse`] returned is valid — every number is in
//! range, every engine exists, every dependency names a group and the dependency graph has no
//! cycle, every event names a group and a queue inside it. Anything else is a
//! [`ScenarioError`] naming the file, the line, the key and the value. Unknown keys are
//! refused (a misspelt key must not silently fall back to a default).

mod check;
mod plan;

use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

pub use plan::{Action, Duration, GroupPlan, Load, Plan};

/// Why a scenario was refused: the file, line, key and value, and the reason.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ScenarioError {
    /// A key with a bad value (or an unknown key, or a parse error at a place).
    #[error("{file}:{line}: {key} = {value}: {why}")]
    Invalid {
        /// The scenario file.
        file: String,
        /// 1-based line.
        line: usize,
        /// The key (dotted path where known).
        key: String,
        /// The value as written.
        value: String,
        /// Why it is refused.
        why: String,
    },
    /// The file (or a trace file it names) could not be read.
    #[error("{file}: {why}")]
    Io {
        /// The file.
        file: String,
        /// The OS's error.
        why: String,
    },
}

/// Engine kinds a scenario names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineName {
    /// A compute engine.
    Compute,
    /// A copy engine.
    Copy,
}

/// A scenario file's top level.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// A name for reports (default: the file's stem).
    #[serde(default)]
    pub name: Option<String>,
    /// The default seed (`--seed` overrides it).
    #[serde(default)]
    pub seed: u64,
    /// Virtual time during which clients submit (ms).
    #[serde(default)]
    pub duration_ms: Option<Spanned<f64>>,
    /// Stop submitting after this many submissions in all.
    #[serde(default)]
    pub submissions: Option<Spanned<u64>>,
    /// How long the run waits for outstanding work after submission stops (ms, default 1000).
    #[serde(default = "default_drain")]
    pub drain_ms: Spanned<f64>,
    /// The window's start excluded from latency statistics (ms, default 0): command buffers
    /// submitted before it count as submitted and completed but give no latency sample.
    #[serde(default = "default_warmup")]
    pub warmup_ms: Spanned<f64>,
    /// Throughput and occupancy are sampled this many times over the run (default 200).
    #[serde(default = "default_samples")]
    pub samples: u32,
    /// How many queues trace.json shows (default 32): every class's first queue and every
    /// queue a scenario event names, then queues spread evenly over the rest.
    #[serde(default = "default_trace_queues")]
    pub trace_queues: Spanned<u32>,
    /// The most rows latency.csv holds, one per command buffer that gave a latency sample;
    /// past it, an even sample (default 100,000; 0 writes the header alone).
    #[serde(default = "default_latency_rows")]
    pub latency_rows: Spanned<u64>,
    /// The device.
    #[serde(default)]
    pub device: Device,
    /// The cost model (defaults: `gpu::CostModel::default`).
    #[serde(default)]
    pub cost: Cost,
    /// Groups of queues.
    #[serde(default, rename = "group")]
    pub groups: Vec<Group>,
    /// Timed events.
    #[serde(default, rename = "event")]
    pub events: Vec<Event>,
    /// Where the scenario came from (set by the parser).
    #[serde(skip)]
    pub source: Source,
}

/// The file a scenario was read from, for error messages and relative paths.
#[derive(Clone, Debug, Default)]
pub struct Source {
    /// The path as given.
    pub path: PathBuf,
    /// Its text.
    pub text: String,
}

fn default_drain() -> Spanned<f64> {
    Spanned::new(0..0, 1000.0)
}
fn default_warmup() -> Spanned<f64> {
    Spanned::new(0..0, 0.0)
}
fn default_samples() -> u32 {
    200
}

/// About 7 MB of latency.csv, and a few MB of memory while the run lasts.
fn default_latency_rows() -> Spanned<u64> {
    Spanned::new(0..0, 100_000)
}

fn default_trace_queues() -> Spanned<u32> {
    Spanned::new(0..0, 32)
}

/// `[device]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Device {
    /// Engines, in id order (default `["compute", "copy"]`).
    #[serde(default = "default_engines")]
    pub engines: Vec<EngineName>,
    /// Hardware queue slots per engine (default 8).
    #[serde(default = "default_slots")]
    pub slots: Spanned<u32>,
    /// `"dedicated"` (default) or `"global"`.
    #[serde(default = "default_model")]
    pub doorbell_model: Spanned<String>,
    /// Dedicated doorbells virtualized over this many physical ones.
    #[serde(default)]
    pub doorbell_pool: Option<Spanned<u32>>,
    /// Engines miss unmapped queues' doorbells; clients also ring the aggregated doorbell.
    #[serde(default)]
    pub aggregated_doorbell: bool,
    /// Doorbells report `ConnectedNotify` (every submission also calls the kernel).
    #[serde(default)]
    pub notify_on_submit: bool,
    /// Process quantum (µs, default 10,000).
    #[serde(default = "default_pq")]
    pub process_quantum_us: Spanned<f64>,
    /// Gang quantum (µs, default 1,000).
    #[serde(default = "default_gq")]
    pub gang_quantum_us: Spanned<f64>,
    /// An idle engine asks for F1 after this long (µs, default 20,000).
    #[serde(default = "default_idle")]
    pub idle_period_us: Spanned<f64>,
    /// The device enters D3 by itself after every engine has been in F1 this long (ms).
    #[serde(default)]
    pub d3_idle_ms: Option<Spanned<f64>>,
    /// Compute preemption granularity: none, dma_buffer, dispatch, thread_group, thread,
    /// shader (default).
    #[serde(default = "default_cg")]
    pub preemption_compute: Spanned<String>,
    /// Copy preemption granularity: none, dma_buffer, chunk (default).
    #[serde(default = "default_yg")]
    pub preemption_copy: Spanned<String>,
    /// Timeout detection and recovery.
    #[serde(default)]
    pub tdr: Tdr,
}

fn default_engines() -> Vec<EngineName> {
    vec![EngineName::Compute, EngineName::Copy]
}
fn default_slots() -> Spanned<u32> {
    Spanned::new(0..0, 8)
}
fn default_model() -> Spanned<String> {
    Spanned::new(0..0, "dedicated".into())
}
fn default_pq() -> Spanned<f64> {
    Spanned::new(0..0, 10_000.0)
}
fn default_gq() -> Spanned<f64> {
    Spanned::new(0..0, 1_000.0)
}
fn default_idle() -> Spanned<f64> {
    Spanned::new(0..0, 20_000.0)
}
fn default_cg() -> Spanned<String> {
    Spanned::new(0..0, "shader".into())
}
fn default_yg() -> Spanned<String> {
    Spanned::new(0..0, "chunk".into())
}

impl Default for Device {
    fn default() -> Self {
        toml::from_str("").expect("an empty [device] takes every default")
    }
}

/// `[device.tdr]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tdr {
    /// `TdrDelay` (ms, default 2000).
    #[serde(default = "default_tdr_delay")]
    pub delay_ms: Spanned<f64>,
    /// `TdrLimitCount` (default 5).
    #[serde(default = "default_limit_count")]
    pub limit_count: Spanned<u32>,
    /// `TdrLimitTime` (ms, default 60,000).
    #[serde(default = "default_limit_time")]
    pub limit_time_ms: Spanned<f64>,
    /// Engine reset (default true).
    #[serde(default = "yes")]
    pub engine_reset: bool,
    /// `TdrDdiDelay`: how long a reset DDI may take (ms, default 5000).
    #[serde(default = "default_ddi_delay")]
    pub ddi_delay_ms: Spanned<f64>,
    /// Per-queue hang timer on compute queues (ms, default 2000; 0: off).
    #[serde(default = "default_tdr_delay")]
    pub hang_compute_ms: Spanned<f64>,
    /// The same on copy queues.
    #[serde(default = "default_tdr_delay")]
    pub hang_copy_ms: Spanned<f64>,
}

fn default_tdr_delay() -> Spanned<f64> {
    Spanned::new(0..0, 2000.0)
}
fn default_ddi_delay() -> Spanned<f64> {
    Spanned::new(0..0, 5000.0)
}
fn default_limit_count() -> Spanned<u32> {
    Spanned::new(0..0, 5)
}
fn default_limit_time() -> Spanned<f64> {
    Spanned::new(0..0, 60_000.0)
}
fn yes() -> bool {
    true
}

impl Default for Tdr {
    fn default() -> Self {
        toml::from_str("").expect("an empty [device.tdr] takes every default")
    }
}

/// `[cost]`: the device-time model (see `gpu::cost`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cost {
    /// Any packet (ns, default 50).
    #[serde(default = "c_packet")]
    pub packet_ns: Spanned<f64>,
    /// `COPY`/`FILL` bandwidth (bytes per µs, default 32,000).
    #[serde(default = "c_bw")]
    pub bulk_bytes_per_us: Spanned<f64>,
    /// One wave-instruction (ns, default 4).
    #[serde(default = "c_wave")]
    pub wave_instruction_ns: Spanned<f64>,
    /// Bulk chunk (bytes, default 65,536).
    #[serde(default = "c_chunk")]
    pub bulk_chunk: Spanned<f64>,
    /// One queue's turn (µs, default 100).
    #[serde(default = "c_turn")]
    pub turn_us: Spanned<f64>,
    /// Doorbell-to-fetch latency: the firmware notices a ring this long after the client
    /// wrote it (ns, default 0).
    #[serde(default = "c_zero")]
    pub doorbell_latency_ns: Spanned<f64>,
    /// Interrupt delivery: an interrupt reaches the kernel this long after the device raised
    /// it (ns, default 0).
    #[serde(default = "c_zero")]
    pub interrupt_ns: Spanned<f64>,
    /// A kernel call on the control path: a client's call returns (and takes effect) this
    /// long after it entered the kernel (ns, default 0).
    #[serde(default = "c_zero")]
    pub kernel_call_ns: Spanned<f64>,
    /// Restoring a queue preempted or evicted between command buffers (ns, default 1000).
    #[serde(default = "c_r0")]
    pub restore_cb_ns: Spanned<f64>,
    /// ... between packets (ns, default 2000).
    #[serde(default = "c_r1")]
    pub restore_packet_ns: Spanned<f64>,
    /// ... inside a packet: a dispatch's or bulk copy's saved state (ns, default 10,000).
    #[serde(default = "c_r2")]
    pub restore_inside_ns: Spanned<f64>,
}

fn c_zero() -> Spanned<f64> {
    Spanned::new(0..0, 0.0)
}
fn c_r0() -> Spanned<f64> {
    Spanned::new(0..0, 1000.0)
}
fn c_r1() -> Spanned<f64> {
    Spanned::new(0..0, 2000.0)
}
fn c_r2() -> Spanned<f64> {
    Spanned::new(0..0, 10_000.0)
}

fn c_packet() -> Spanned<f64> {
    Spanned::new(0..0, 50.0)
}
fn c_bw() -> Spanned<f64> {
    Spanned::new(0..0, 32_000.0)
}
fn c_wave() -> Spanned<f64> {
    Spanned::new(0..0, 4.0)
}
fn c_chunk() -> Spanned<f64> {
    Spanned::new(0..0, 65_536.0)
}
fn c_turn() -> Spanned<f64> {
    Spanned::new(0..0, 100.0)
}

impl Default for Cost {
    fn default() -> Self {
        toml::from_str("").expect("an empty [cost] takes every default")
    }
}

/// `[[group]]`: `count` queues alike.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Group {
    /// Its name (the queue class in reports).
    pub name: Spanned<String>,
    /// How many queues (default 1).
    #[serde(default = "one")]
    pub count: Spanned<u32>,
    /// The engine kind (default compute).
    #[serde(default = "default_engine")]
    pub engine: Spanned<String>,
    /// low, normal (default), medium, high, realtime.
    #[serde(default = "default_priority")]
    pub priority: Spanned<String>,
    /// `"user"` (default) or `"kernel"`.
    #[serde(default = "default_path")]
    pub path: Spanned<String>,
    /// Queues per client process (default: as many as its doorbell page gives the engine).
    #[serde(default)]
    pub queues_per_process: Option<Spanned<u32>>,
    /// Ring bytes (a power of two, at least 4096; default 4096).
    #[serde(default = "default_ring")]
    pub ring_bytes: Spanned<u64>,
    /// How it submits.
    #[serde(default)]
    pub workload: Workload,
    /// What each command buffer holds.
    #[serde(default)]
    pub commands: Commands,
    /// Each command buffer first waits (a GPU `WAIT` on a native fence) for the latest
    /// command buffer that queue `i mod count` of this group had submitted.
    #[serde(default)]
    pub after: Option<Spanned<String>>,
}

fn one() -> Spanned<u32> {
    Spanned::new(0..0, 1)
}
fn default_engine() -> Spanned<String> {
    Spanned::new(0..0, "compute".into())
}
fn default_priority() -> Spanned<String> {
    Spanned::new(0..0, "normal".into())
}
fn default_path() -> Spanned<String> {
    Spanned::new(0..0, "user".into())
}
fn default_ring() -> Spanned<u64> {
    Spanned::new(0..0, 4096)
}

/// `[group.workload]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// closed (default), periodic, poisson, bursts, trace.
    #[serde(default = "default_kind")]
    pub kind: Spanned<String>,
    /// Closed loop: command buffers kept outstanding (default 1).
    #[serde(default = "one")]
    pub outstanding: Spanned<u32>,
    /// Closed loop: time between a completion and the next submission (µs, default 0).
    #[serde(default = "zero")]
    pub think_us: Spanned<f64>,
    /// Periodic: the period (µs).
    #[serde(default)]
    pub period_us: Option<Spanned<f64>>,
    /// Poisson: submissions per second per queue.
    #[serde(default)]
    pub rate_per_s: Option<Spanned<f64>>,
    /// Bursts: command buffers per burst.
    #[serde(default)]
    pub burst_size: Option<Spanned<u32>>,
    /// Bursts: time between bursts (µs).
    #[serde(default)]
    pub burst_period_us: Option<Spanned<f64>>,
    /// Trace: a CSV file (relative to the scenario) with rows `at_us,queue,synthetic_us`.
    #[serde(default)]
    pub file: Option<Spanned<String>>,
    /// A CPU thread waits for every command buffer's fence signal (needs
    /// `commands.signal = true`): the native fence then interrupts for each.
    #[serde(default = "no")]
    pub cpu_waiter: Spanned<bool>,
}

fn default_kind() -> Spanned<String> {
    Spanned::new(0..0, "closed".into())
}
fn no() -> Spanned<bool> {
    Spanned::new(0..0, false)
}
fn zero_u64() -> Spanned<u64> {
    Spanned::new(0..0, 0)
}
fn zero_u32() -> Spanned<u32> {
    Spanned::new(0..0, 0)
}
fn zero() -> Spanned<f64> {
    Spanned::new(0..0, 0.0)
}

impl Default for Workload {
    fn default() -> Self {
        toml::from_str("").expect("an empty workload takes every default")
    }
}

/// `[group.commands]`: the packets of each command buffer (in this order: the dependency
/// `WAIT`, `write_data` `WRITE_DATA`s, a `FILL`, a `COPY`, the synthetic dispatch, the
/// dependency `SIGNAL`; then the UMD's `PROGRESS_FENCE`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Commands {
    /// `WRITE_DATA` packets (default 0).
    #[serde(default)]
    pub write_data: u32,
    /// Bytes of one `FILL` (0: none).
    #[serde(default = "zero_u64")]
    pub fill_bytes: Spanned<u64>,
    /// Bytes of one `COPY` (0: none).
    #[serde(default = "zero_u64")]
    pub copy_bytes: Spanned<u64>,
    /// The synthetic dispatch's duration.
    #[serde(default)]
    pub synthetic: Option<Dist>,
    /// Each command buffer ends by signalling the queue's own native fence with its progress
    /// value (an interrupt only when a CPU waits for it: spec 002's suppression).
    #[serde(default)]
    pub signal: bool,
}

impl Default for Commands {
    fn default() -> Self {
        toml::from_str("").expect("empty commands take every default")
    }
}

/// A duration distribution (µs).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Dist {
    /// constant (default), uniform, exponential, lognormal.
    #[serde(default = "default_dist")]
    pub dist: Spanned<String>,
    /// constant: the value; exponential: the mean; lognormal: the median.
    #[serde(default)]
    pub us: Option<Spanned<f64>>,
    /// uniform: the low end.
    #[serde(default)]
    pub min_us: Option<Spanned<f64>>,
    /// uniform: the high end.
    #[serde(default)]
    pub max_us: Option<Spanned<f64>>,
    /// lognormal: sigma of the underlying normal (default 0.5).
    #[serde(default)]
    pub sigma: Option<Spanned<f64>>,
}

fn default_dist() -> Spanned<String> {
    Spanned::new(0..0, "constant".into())
}

/// `[[event]]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Event {
    /// When (ms of virtual time).
    pub at_ms: Spanned<f64>,
    /// kill (the queue's process ends abnormally), hang (the queue's next command buffer is
    /// a kernel that never ends), d3 (the device is asked into D3), suspend (the queue's
    /// context is suspended, and resumed after `for_ms` if given).
    pub action: Spanned<String>,
    /// The group (not for d3).
    #[serde(default)]
    pub group: Option<Spanned<String>>,
    /// The queue's index in its group (default 0).
    #[serde(default = "zero_u32")]
    pub queue: Spanned<u32>,
    /// suspend: how long until the context is resumed (ms).
    #[serde(default)]
    pub for_ms: Option<Spanned<f64>>,
}

impl Scenario {
    /// Reads and checks a scenario file.
    pub fn load(path: &Path) -> Result<Plan, ScenarioError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ScenarioError::Io { file: path.display().to_string(), why: e.to_string() })?;
        Self::parse(path, &text)
    }

    /// Parses and checks scenario `text` (from `path`, for messages and relative files).
    pub fn parse(path: &Path, text: &str) -> Result<Plan, ScenarioError> {
        let src = Source { path: path.to_path_buf(), text: text.to_string() };
        let mut s: Scenario = toml::from_str(text).map_err(|e| src.toml_error(&e))?;
        s.source = src;
        s.check()
    }

    /// Parses a scenario already in TOML value form (a sweep's combination), reporting
    /// errors against `path` and `text` (the sweep file).
    pub fn from_value(path: &Path, text: &str, v: toml::Value) -> Result<Plan, ScenarioError> {
        let src = Source { path: path.to_path_buf(), text: text.to_string() };
        let rendered = toml::to_string(&v).map_err(|e| src.at(0..0, "scenario", "", e.to_string()))?;
        let mut s: Scenario = toml::from_str(&rendered).map_err(|e| {
            let inner = Source { path: path.to_path_buf(), text: rendered.clone() };
            inner.toml_error(&e)
        })?;
        s.source = Source { path: path.to_path_buf(), text: rendered };
        s.check()
    }
}

impl Source {
    /// An error at byte span `span`.
    pub fn at(&self, span: Range<usize>, key: &str, value: &str, why: String) -> ScenarioError {
        let line = self.text[..span.start.min(self.text.len())].matches('\n').count() + 1;
        let value = if value.is_empty() {
            self.text.get(span.clone()).unwrap_or("").trim().to_string()
        } else {
            value.to_string()
        };
        ScenarioError::Invalid { file: self.path.display().to_string(), line, key: key.to_string(), value, why }
    }

    /// A TOML or serde error: the key is the unknown field, or the key on the value's line.
    fn toml_error(&self, e: &toml::de::Error) -> ScenarioError {
        let span = e.span().unwrap_or(0..0);
        let msg = e.message().to_string();
        let at = self.text.get(span.clone()).unwrap_or("").trim().to_string();
        let line_start = self.text[..span.start.min(self.text.len())].rfind('\n').map_or(0, |i| i + 1);
        let line_text = self.text[line_start..].lines().next().unwrap_or("");
        let (key, value) = if let Some(rest) = msg.strip_prefix("unknown field `") {
            let k = rest.split('`').next().unwrap_or("").to_string();
            let v = line_text.split_once('=').map_or(String::new(), |(_, v)| v.trim().to_string());
            (k, v)
        } else {
            let k = line_text.split_once('=').map_or(line_text.trim(), |(k, _)| k.trim()).to_string();
            (k, at)
        };
        let why = msg.lines().next().unwrap_or("").to_string();
        let line = self.text[..span.start.min(self.text.len())].matches('\n').count() + 1;
        ScenarioError::Invalid { file: self.path.display().to_string(), line, key, value, why }
    }
}
