//! Scenario files: what a simulation runs, parsed from TOML and checked before anything runs.
//!
//! A scenario names the device (engines, hardware slots, doorbell model and pool, aggregated
//! doorbell, quanta, power timers, preemption granularity, TDR), the cost model, groups of
//! queues with their workloads and command-buffer contents, fence dependencies between
//! groups, and timed events. `docs/sim.md` lists every key.
//!
//! Invariants: a [`Scenario`] that [`Scenario::parse`] returned is valid — every number is in
//! range, every engine exists, every dependency names a group and the dependency graph has no
//! cycle, every event names a group and a queue inside it. Anything else is a
//! [`ScenarioError`] naming the file, the line, the key and the value. Unknown keys are
//! refused (a misspelt key must not silently fall back to a default).

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

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

// ---------------------------------------------------------------------------------------
// The checked form the runner uses.

/// A workload, checked.
#[derive(Clone, Debug, PartialEq)]
pub enum Load {
    /// `n` outstanding, `think` ns between a completion and the next submission.
    Closed {
        /// Outstanding command buffers.
        n: u32,
        /// Think time (ns).
        think: u64,
    },
    /// One every `period` ns.
    Periodic(u64),
    /// A Poisson process of `rate` per second.
    Poisson(f64),
    /// `size` at once every `period` ns.
    Bursts {
        /// Command buffers per burst.
        size: u32,
        /// Period (ns).
        period: u64,
    },
    /// Rows (at ns, queue index in the group, synthetic ns), sorted by time.
    Trace(Vec<(u64, u32, u64)>),
}

/// A duration distribution, checked (ns).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Duration {
    /// Always this (rounded to the nanosecond once, here).
    Constant(u64),
    /// Uniform in [lo, hi].
    Uniform(f64, f64),
    /// Exponential with this mean.
    Exponential(f64),
    /// Log-normal with this median and sigma.
    LogNormal(f64, f64),
}

/// A group, checked.
#[derive(Clone, Debug)]
pub struct GroupPlan {
    /// Name.
    pub name: String,
    /// Queues.
    pub count: u32,
    /// Engine index in the device.
    pub engine: usize,
    /// Priority.
    pub priority: abi::Priority,
    /// Kernel-mode path.
    pub kernel_mode: bool,
    /// Queues per process (0: as many as fit).
    pub per_process: u32,
    /// Ring bytes.
    pub ring_bytes: u64,
    /// Workload.
    pub load: Load,
    /// `WRITE_DATA`s.
    pub write_data: u32,
    /// `FILL` bytes.
    pub fill_bytes: u64,
    /// `COPY` bytes.
    pub copy_bytes: u64,
    /// Synthetic dispatch duration.
    pub synthetic: Option<Duration>,
    /// Group index this one waits on.
    pub after: Option<usize>,
    /// Each command buffer signals the queue's native fence.
    pub signal: bool,
    /// A CPU waiter per command buffer.
    pub cpu_waiter: bool,
}

impl GroupPlan {
    /// Queues one client process of this group holds: `queues_per_process`, at most what a
    /// process's doorbell page has for the engine (`doorbells` of them) for user-mode queues,
    /// or 64 kernel-mode queues.
    pub fn queues_per_process(&self, doorbells: u32) -> u32 {
        let fit = self.process_fits(doorbells);
        if self.per_process > 0 { self.per_process.min(fit) } else { fit }
    }

    /// The most queues of this group one process can hold: its doorbell page's share for the
    /// engine (`doorbells`), or 64 kernel-mode queues.
    pub fn process_fits(&self, doorbells: u32) -> u32 {
        if self.kernel_mode { 64 } else { doorbells.max(1) }
    }
}

/// A timed event, checked.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Abnormal termination of the queue's process.
    Kill {
        /// Group.
        group: usize,
        /// Queue.
        queue: u32,
    },
    /// The queue's next command buffer never ends.
    Hang {
        /// Group.
        group: usize,
        /// Queue.
        queue: u32,
    },
    /// D3 requested.
    D3,
    /// The queue's context suspended, resumed after `for_ns` if given.
    Suspend {
        /// Group.
        group: usize,
        /// Queue.
        queue: u32,
        /// Resumed after (ns).
        for_ns: Option<u64>,
    },
}

/// The whole scenario, checked: what [`crate::run`] runs.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Name.
    pub name: String,
    /// Seed.
    pub seed: u64,
    /// Submission window (ns), if bounded by time.
    pub duration: Option<u64>,
    /// Doorbell-to-fetch latency (ns): how long after a client rings the firmware notices.
    pub doorbell_latency: u64,
    /// A kernel call on the control path (ns): how long a client's call takes to return, and
    /// what it does takes effect at its end.
    pub kernel_call: u64,
    /// Total submissions, if bounded by count.
    pub submissions: Option<u64>,
    /// Drain limit (ns).
    pub drain: u64,
    /// Warm-up (ns): command buffers submitted before it give no latency sample.
    pub warmup: u64,
    /// Samples over the run.
    pub samples: u32,
    /// Queues trace.json shows (more when the classes and event targets alone are more).
    pub trace_queues: usize,
    /// The most rows latency.csv holds.
    pub latency_rows: usize,
    /// The system to build.
    pub system: kernel::SystemConfig,
    /// Groups.
    pub groups: Vec<GroupPlan>,
    /// Events (at ns, action), sorted by time.
    pub events: Vec<(u64, Action)>,
    /// The scenario text (for the report).
    pub text: String,
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

    fn err<T>(
        &self,
        span: Range<usize>,
        key: &str,
        value: impl ToString,
        why: impl ToString,
    ) -> Result<T, ScenarioError> {
        Err(self.source.at(span, key, &value.to_string(), why.to_string()))
    }

    fn check(self) -> Result<Plan, ScenarioError> {
        let ns = |v: f64| (v * 1e3).round() as u64;
        let ms = |v: f64| (v * 1e6).round() as u64;
        let nonneg = |s: &Spanned<f64>, key: &str| -> Result<f64, ScenarioError> {
            let v = *s.get_ref();
            if !v.is_finite() || v < 0.0 {
                return self.err(s.span(), key, v, "must be a finite number at least 0");
            }
            Ok(v)
        };
        let positive = |s: &Spanned<f64>, key: &str| -> Result<f64, ScenarioError> {
            let v = nonneg(s, key)?;
            if v <= 0.0 {
                return self.err(s.span(), key, v, "must be more than 0");
            }
            Ok(v)
        };
        let duration = match &self.duration_ms {
            Some(d) => Some(ms(positive(d, "duration_ms")?)),
            None => None,
        };
        if let Some(n) = &self.submissions
            && *n.get_ref() == 0
        {
            return self.err(n.span(), "submissions", 0, "must be at least 1");
        }
        if duration.is_none() && self.submissions.is_none() {
            return self.err(0..0, "duration_ms", "(missing)", "give duration_ms or submissions (or both)");
        }
        let drain = ms(nonneg(&self.drain_ms, "drain_ms")?);
        let warmup = ms(nonneg(&self.warmup_ms, "warmup_ms")?);
        if let Some(d) = duration
            && warmup >= d
        {
            let why =
                format!("must be less than duration_ms ({}): the warm-up would exclude every latency", d as f64 / 1e6);
            return self.err(self.warmup_ms.span(), "warmup_ms", self.warmup_ms.get_ref(), why);
        }
        if self.samples == 0 || self.samples > 100_000 {
            return self.err(self.key_span("samples"), "samples", self.samples, "must be 1..=100000");
        }
        // Device.
        let d = &self.device;
        if d.engines.is_empty() {
            return self.err(self.key_span("engines"), "device.engines", "[]", "needs at least one engine");
        }
        if d.engines.len() > 16 {
            return self.err(self.key_span("engines"), "device.engines", d.engines.len(), "at most 16 engines");
        }
        let slots = *d.slots.get_ref();
        if slots == 0 || slots > 64 {
            return self.err(d.slots.span(), "device.slots", slots, "must be 1..=64");
        }
        let model = match d.doorbell_model.get_ref().as_str() {
            "dedicated" => abi::doorbell::DoorbellModel::Dedicated,
            "global" => abi::doorbell::DoorbellModel::Global,
            other => {
                return self.err(d.doorbell_model.span(), "device.doorbell_model", other, "dedicated or global");
            }
        };
        let pool = match &d.doorbell_pool {
            Some(p) if *p.get_ref() == 0 => return self.err(p.span(), "device.doorbell_pool", 0, "must be at least 1"),
            Some(p) if model == abi::doorbell::DoorbellModel::Global => {
                return self.err(p.span(), "device.doorbell_pool", p.get_ref(), "the global model has no pool");
            }
            Some(p) => Some(*p.get_ref()),
            None => None,
        };
        let compute = match d.preemption_compute.get_ref().as_str() {
            "none" => gpu::ComputeGranularity::None,
            "dma_buffer" => gpu::ComputeGranularity::DmaBuffer,
            "dispatch" => gpu::ComputeGranularity::Dispatch,
            "thread_group" => gpu::ComputeGranularity::ThreadGroup,
            "thread" => gpu::ComputeGranularity::Thread,
            "shader" => gpu::ComputeGranularity::Shader,
            other => {
                return self.err(
                    d.preemption_compute.span(),
                    "device.preemption_compute",
                    other,
                    "none, dma_buffer, dispatch, thread_group, thread or shader",
                );
            }
        };
        let copy = match d.preemption_copy.get_ref().as_str() {
            "none" => gpu::CopyGranularity::None,
            "dma_buffer" => gpu::CopyGranularity::DmaBuffer,
            "chunk" => gpu::CopyGranularity::Chunk,
            other => {
                return self.err(
                    d.preemption_copy.span(),
                    "device.preemption_copy",
                    other,
                    "none, dma_buffer or chunk",
                );
            }
        };
        let t = &d.tdr;
        // A TDR timeout: more than 0, at most the kernel's bound.
        let max_ms = kernel::TdrConfig::MAX.as_millis() as f64;
        let tdr_ms = |s: &Spanned<f64>, key: &str| -> Result<std::time::Duration, ScenarioError> {
            let v = positive(s, key)?;
            if v > max_ms {
                return self.err(s.span(), key, v, format!("must be at most {max_ms} (one hour)"));
            }
            Ok(std::time::Duration::from_nanos(ms(v)))
        };
        let hang = |s: &Spanned<f64>, key: &str| -> Result<Option<std::time::Duration>, ScenarioError> {
            if nonneg(s, key)? == 0.0 { Ok(None) } else { tdr_ms(s, key).map(Some) }
        };
        let tdr = kernel::TdrConfig {
            delay: tdr_ms(&t.delay_ms, "device.tdr.delay_ms")?,
            limit_count: match *t.limit_count.get_ref() {
                n @ 1..=kernel::TdrConfig::MAX_LIMIT_COUNT => n,
                n => {
                    let why = format!("must be from 1 to {}", kernel::TdrConfig::MAX_LIMIT_COUNT);
                    return self.err(t.limit_count.span(), "device.tdr.limit_count", n, why);
                }
            },
            limit_time: tdr_ms(&t.limit_time_ms, "device.tdr.limit_time_ms")?,
            engine_reset: t.engine_reset,
            ddi_delay: tdr_ms(&t.ddi_delay_ms, "device.tdr.ddi_delay_ms")?,
            hang_compute: hang(&t.hang_compute_ms, "device.tdr.hang_compute_ms")?,
            hang_copy: hang(&t.hang_copy_ms, "device.tdr.hang_copy_ms")?,
        };
        let c = &self.cost;
        let bulk_chunk = positive(&c.bulk_chunk, "cost.bulk_chunk")?;
        let cost = gpu::CostModel {
            packet: std::time::Duration::from_nanos(nonneg(&c.packet_ns, "cost.packet_ns")?.round() as u64),
            bulk_bytes_per_us: positive(&c.bulk_bytes_per_us, "cost.bulk_bytes_per_us")?.round().max(1.0) as u64,
            wave_instruction: std::time::Duration::from_nanos(
                nonneg(&c.wave_instruction_ns, "cost.wave_instruction_ns")?.round() as u64,
            ),
            bulk_chunk: bulk_chunk as u64,
            turn: std::time::Duration::from_nanos(ns(positive(&c.turn_us, "cost.turn_us")?)),
            restore: [
                std::time::Duration::from_nanos(nonneg(&c.restore_cb_ns, "cost.restore_cb_ns")?.round() as u64),
                std::time::Duration::from_nanos(nonneg(&c.restore_packet_ns, "cost.restore_packet_ns")?.round() as u64),
                std::time::Duration::from_nanos(nonneg(&c.restore_inside_ns, "cost.restore_inside_ns")?.round() as u64),
            ],
        };
        let engines: Vec<abi::EngineKind> = d
            .engines
            .iter()
            .map(|e| match e {
                EngineName::Compute => abi::EngineKind::Compute,
                EngineName::Copy => abi::EngineKind::Copy,
            })
            .collect();
        let gpu = gpu::GpuConfig {
            engines: engines.clone(),
            hw_slots: slots,
            doorbell_model: model,
            misses_unmapped_doorbells: d.aggregated_doorbell,
            process_quantum: std::time::Duration::from_nanos(ns(positive(
                &d.process_quantum_us,
                "device.process_quantum_us",
            )?)),
            gang_quantum: std::time::Duration::from_nanos(ns(positive(&d.gang_quantum_us, "device.gang_quantum_us")?)),
            idle_period: std::time::Duration::from_nanos(ns(positive(&d.idle_period_us, "device.idle_period_us")?)),
            cost,
            preemption: gpu::PreemptionCaps { compute, copy },
            ..gpu::GpuConfig::default()
        };
        let d3_idle = match &d.d3_idle_ms {
            Some(v) => Some(std::time::Duration::from_nanos(ms(positive(v, "device.d3_idle_ms")?))),
            None => None,
        };
        let system = kernel::SystemConfig {
            gpu,
            notify_on_submit: d.notify_on_submit,
            doorbell_pool: pool,
            tdr,
            d3_idle,
            interrupt_delivery: std::time::Duration::from_nanos(
                nonneg(&c.interrupt_ns, "cost.interrupt_ns")?.round() as u64
            ),
            ..Default::default()
        };

        // Groups.
        if self.groups.is_empty() {
            return self.err(0..0, "group", "(none)", "a scenario needs at least one [[group]]");
        }
        let mut names: BTreeMap<String, usize> = BTreeMap::new();
        for (i, g) in self.groups.iter().enumerate() {
            if names.insert(g.name.get_ref().clone(), i).is_some() {
                return self.err(g.name.span(), "group.name", g.name.get_ref(), "two groups have this name");
            }
        }
        let mut groups = Vec::new();
        for g in &self.groups {
            let key = |k: &str| format!("group.{k} (group \"{}\")", g.name.get_ref());
            let count = *g.count.get_ref();
            if count == 0 || count > 1_000_000 {
                return self.err(g.count.span(), &key("count"), count, "must be 1..=1000000");
            }
            let want = match g.engine.get_ref().as_str() {
                "compute" => abi::EngineKind::Compute,
                "copy" => abi::EngineKind::Copy,
                other => return self.err(g.engine.span(), &key("engine"), other, "compute or copy"),
            };
            let Some(engine) = engines.iter().position(|&e| e == want) else {
                return self.err(
                    g.engine.span(),
                    &key("engine"),
                    g.engine.get_ref(),
                    format!("the device has no such engine (device.engines = {:?})", d.engines),
                );
            };
            let priority = match g.priority.get_ref().as_str() {
                "low" => abi::Priority::Low,
                "normal" => abi::Priority::Normal,
                "medium" => abi::Priority::Medium,
                "high" => abi::Priority::High,
                "realtime" => abi::Priority::Realtime,
                other => {
                    return self.err(
                        g.priority.span(),
                        &key("priority"),
                        other,
                        "low, normal, medium, high or realtime",
                    );
                }
            };
            let kernel_mode = match g.path.get_ref().as_str() {
                "user" => false,
                "kernel" => true,
                other => return self.err(g.path.span(), &key("path"), other, "user or kernel"),
            };
            let per_process = match &g.queues_per_process {
                Some(p) if *p.get_ref() == 0 => {
                    return self.err(p.span(), &key("queues_per_process"), 0, "must be at least 1");
                }
                Some(p) => *p.get_ref(),
                None => 0,
            };
            let ring = *g.ring_bytes.get_ref();
            if ring < 4096 || !ring.is_power_of_two() || ring > 1 << 24 {
                return self.err(g.ring_bytes.span(), &key("ring_bytes"), ring, "a power of two, 4096..=16 MiB");
            }
            let w = &g.workload;
            let need = |o: &Option<Spanned<f64>>, k: &str| -> Result<f64, ScenarioError> {
                match o {
                    Some(v) => positive(v, &key(&format!("workload.{k}"))),
                    None => self.err(
                        w.kind.span(),
                        &key(&format!("workload.{k}")),
                        "(missing)",
                        format!("a {} workload needs {k}", w.kind.get_ref()),
                    ),
                }
            };
            let load = match w.kind.get_ref().as_str() {
                "closed" => {
                    let n = *w.outstanding.get_ref();
                    if n == 0 || n > 4096 {
                        return self.err(w.outstanding.span(), &key("workload.outstanding"), n, "must be 1..=4096");
                    }
                    Load::Closed { n, think: ns(nonneg(&w.think_us, &key("workload.think_us"))?) }
                }
                "periodic" => Load::Periodic(ns(need(&w.period_us, "period_us")?).max(1)),
                "poisson" => Load::Poisson(need(&w.rate_per_s, "rate_per_s")?),
                "bursts" => {
                    let size = match &w.burst_size {
                        Some(s) if *s.get_ref() > 0 => *s.get_ref(),
                        Some(s) => return self.err(s.span(), &key("workload.burst_size"), 0, "must be at least 1"),
                        None => {
                            return self.err(w.kind.span(), &key("workload.burst_size"), "(missing)", "bursts need it");
                        }
                    };
                    Load::Bursts { size, period: ns(need(&w.burst_period_us, "burst_period_us")?).max(1) }
                }
                "trace" => {
                    let Some(f) = &w.file else {
                        return self.err(w.kind.span(), &key("workload.file"), "(missing)", "a trace needs a file");
                    };
                    Load::Trace(self.read_trace(f, count, &key("workload.file"))?)
                }
                other => {
                    return self.err(
                        w.kind.span(),
                        &key("workload.kind"),
                        other,
                        "closed, periodic, poisson, bursts or trace",
                    );
                }
            };
            let cm = &g.commands;
            let synthetic = match &cm.synthetic {
                Some(dist) => Some(self.dist(dist, &key("commands.synthetic"))?),
                None => None,
            };
            let after = match &g.after {
                Some(a) => match names.get(a.get_ref()) {
                    Some(&j) => Some(j),
                    None => return self.err(a.span(), &key("after"), a.get_ref(), "no group has this name"),
                },
                None => None,
            };
            if *w.cpu_waiter.get_ref() && !cm.signal {
                return self.err(
                    w.cpu_waiter.span(),
                    &key("workload.cpu_waiter"),
                    true,
                    "a CPU waiter needs a fence to wait for: set commands.signal = true",
                );
            }
            if (*cm.fill_bytes.get_ref() | *cm.copy_bytes.get_ref()) % 4 != 0 {
                return self.err(cm.fill_bytes.span(), &key("commands.fill_bytes/copy_bytes"), "", "multiples of 4");
            }
            groups.push(GroupPlan {
                name: g.name.get_ref().clone(),
                count,
                engine,
                priority,
                kernel_mode,
                per_process,
                ring_bytes: ring,
                load,
                write_data: cm.write_data.min(64),
                fill_bytes: *cm.fill_bytes.get_ref(),
                copy_bytes: *cm.copy_bytes.get_ref(),
                synthetic,
                after,
                signal: cm.signal,
                cpu_waiter: *w.cpu_waiter.get_ref(),
            });
        }
        // Dependency cycles (each group has at most one upstream: follow the chain).
        for (i, g) in groups.iter().enumerate() {
            let mut seen = vec![false; groups.len()];
            let mut at = Some(i);
            while let Some(j) = at {
                if seen[j] {
                    let a = self.groups[i].after.as_ref().expect("a cycle passes through an `after`");
                    return self.err(
                        a.span(),
                        &format!("group.after (group \"{}\")", g.name),
                        a.get_ref(),
                        "the dependencies form a cycle",
                    );
                }
                seen[j] = true;
                at = groups[j].after;
            }
        }
        // Events.
        let mut events = Vec::new();
        for e in &self.events {
            let at = ms(nonneg(&e.at_ms, "event.at_ms")?);
            let target = || -> Result<(usize, u32), ScenarioError> {
                let Some(gname) = &e.group else {
                    return self.err(e.action.span(), "event.group", "(missing)", "this action names a group");
                };
                let Some(&gi) = names.get(gname.get_ref()) else {
                    return self.err(gname.span(), "event.group", gname.get_ref(), "no group has this name");
                };
                let q = *e.queue.get_ref();
                if q >= groups[gi].count {
                    return self.err(
                        e.queue.span(),
                        "event.queue",
                        q,
                        format!("group has {} queues", groups[gi].count),
                    );
                }
                Ok((gi, q))
            };
            let action = match e.action.get_ref().as_str() {
                "kill" => {
                    let (group, queue) = target()?;
                    Action::Kill { group, queue }
                }
                "hang" => {
                    let (group, queue) = target()?;
                    Action::Hang { group, queue }
                }
                "d3" => Action::D3,
                "suspend" => {
                    let (group, queue) = target()?;
                    let for_ns = match &e.for_ms {
                        Some(f) => Some(ms(positive(f, "event.for_ms")?)),
                        None => None,
                    };
                    Action::Suspend { group, queue, for_ns }
                }
                other => return self.err(e.action.span(), "event.action", other, "kill, hang, d3 or suspend"),
            };
            events.push((at, action));
        }
        events.sort_by_key(|(t, _)| *t);
        let name = self.name.clone().unwrap_or_else(|| {
            self.source.path.file_stem().map_or("scenario".into(), |s| s.to_string_lossy().into_owned())
        });
        // The processes the groups need must fit the device's doorbell pages: refused now, at
        // the group that passes the limit, not as a kernel error once the run has started.
        let doorbells = abi::doorbell::DOORBELLS_PER_PAGE / system.gpu.engines.len().max(1) as u32;
        let max = system.max_processes();
        let mut processes = 0u32;
        for (g, raw) in groups.iter().zip(&self.groups) {
            let per = g.queues_per_process(doorbells);
            processes = processes.saturating_add(g.count.div_ceil(per));
            if processes > max {
                let key = format!("group.queues_per_process (group \"{}\")", g.name);
                let why = format!(
                    "the groups so far need {processes} client processes ({} queues at {per} per process here) but \
                     the device holds {max} (one doorbell page each); raise queues_per_process (at most {} per \
                     process on this engine) or lower count",
                    g.count,
                    g.process_fits(doorbells),
                );
                return match &raw.queues_per_process {
                    Some(p) => self.err(p.span(), &key, *p.get_ref(), why),
                    None => self.err(raw.count.span(), &key, "(as many as fit)", why),
                };
            }
        }
        // Kernel-mode queues are always mapped and hold a hardware slot each (spec 001
        // "Interaction with Kernel Queues"): beside user-mode queues they may hold all but one
        // of an engine's slots, or the kernel refuses the queue that passes the limit.
        let slots = system.gpu.hw_slots;
        for e in 0..system.gpu.engines.len() {
            let on = |km: bool| groups.iter().filter(|g| g.engine == e && g.kernel_mode == km).map(|g| g.count).sum();
            let (kernel, user): (u32, u32) = (on(true), on(false));
            if user > 0 && kernel >= slots {
                let (g, raw) = groups
                    .iter()
                    .zip(&self.groups)
                    .find(|(g, _)| g.engine == e && g.kernel_mode)
                    .expect("kernel-mode queues were counted");
                let why = format!(
                    "the engine's {kernel} kernel-mode queues are always mapped (spec 001) and would hold all {slots} \
                     hardware slots, so its {user} user-mode queues could never run; beside user-mode queues at most \
                     {} kernel-mode queues fit (raise device.slots, or lower their count)",
                    slots - 1
                );
                return self.err(raw.path.span(), &format!("group.path (group \"{}\")", g.name), "kernel", why);
            }
        }
        let trace_queues = *self.trace_queues.get_ref();
        if trace_queues > 10_000 {
            return self.err(self.trace_queues.span(), "trace_queues", trace_queues, "at most 10000");
        }
        let trace_queues = trace_queues as usize;
        let latency_rows = *self.latency_rows.get_ref();
        if latency_rows > 100_000_000 {
            let why = "at most 100000000 (about 7 GB of latency.csv)";
            return self.err(self.latency_rows.span(), "latency_rows", latency_rows, why);
        }
        let latency_rows = latency_rows as usize;
        let doorbell_latency = nonneg(&self.cost.doorbell_latency_ns, "cost.doorbell_latency_ns")?.round() as u64;
        let kernel_call = nonneg(&self.cost.kernel_call_ns, "cost.kernel_call_ns")?.round() as u64;
        Ok(Plan {
            name,
            seed: self.seed,
            duration,
            doorbell_latency,
            kernel_call,
            submissions: self.submissions.as_ref().map(|s| *s.get_ref()),
            drain,
            warmup,
            samples: self.samples,
            trace_queues,
            latency_rows,
            system,
            groups,
            events,
            text: self.source.text.clone(),
        })
    }

    fn dist(&self, d: &Dist, key: &str) -> Result<Duration, ScenarioError> {
        let get = |o: &Option<Spanned<f64>>, k: &str| -> Result<f64, ScenarioError> {
            match o {
                Some(v) => {
                    let x = *v.get_ref();
                    if !x.is_finite() || x < 0.0 {
                        return self.err(v.span(), &format!("{key}.{k}"), x, "must be a finite number at least 0");
                    }
                    Ok(x * 1e3)
                }
                None => self.err(
                    d.dist.span(),
                    &format!("{key}.{k}"),
                    "(missing)",
                    format!("{} needs it", d.dist.get_ref()),
                ),
            }
        };
        Ok(match d.dist.get_ref().as_str() {
            "constant" => Duration::Constant(get(&d.us, "us")?.round() as u64),
            "exponential" => Duration::Exponential(get(&d.us, "us")?),
            "uniform" => {
                let (lo, hi) = (get(&d.min_us, "min_us")?, get(&d.max_us, "max_us")?);
                if hi < lo {
                    let m = d.max_us.as_ref().expect("read above");
                    return self.err(m.span(), &format!("{key}.max_us"), hi / 1e3, "below min_us");
                }
                Duration::Uniform(lo, hi)
            }
            "lognormal" => {
                let sigma = match &d.sigma {
                    Some(s) if s.get_ref().is_finite() && *s.get_ref() >= 0.0 => *s.get_ref(),
                    Some(s) => return self.err(s.span(), &format!("{key}.sigma"), s.get_ref(), "must be at least 0"),
                    None => 0.5,
                };
                Duration::LogNormal(get(&d.us, "us")?, sigma)
            }
            other => {
                return self.err(
                    d.dist.span(),
                    &format!("{key}.dist"),
                    other,
                    "constant, uniform, exponential or lognormal",
                );
            }
        })
    }

    fn read_trace(&self, f: &Spanned<String>, count: u32, key: &str) -> Result<Vec<(u64, u32, u64)>, ScenarioError> {
        let base = self.source.path.parent().unwrap_or(Path::new("."));
        let path = base.join(f.get_ref());
        let text = std::fs::read_to_string(&path)
            .map_err(|e| ScenarioError::Io { file: path.display().to_string(), why: e.to_string() })?;
        let mut rows = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') || (n == 0 && line.starts_with("at_us")) {
                continue;
            }
            let bad = |why: &str| ScenarioError::Invalid {
                file: path.display().to_string(),
                line: n + 1,
                key: key.to_string(),
                value: line.to_string(),
                why: why.to_string(),
            };
            let cols: Vec<&str> = line.split(',').map(str::trim).collect();
            if cols.len() != 3 {
                return Err(bad("a row is at_us,queue,synthetic_us"));
            }
            let at: f64 = cols[0].parse().map_err(|_| bad("at_us is not a number"))?;
            let q: u32 = cols[1].parse().map_err(|_| bad("queue is not a non-negative integer"))?;
            let size: f64 = cols[2].parse().map_err(|_| bad("synthetic_us is not a number"))?;
            if !at.is_finite() || at < 0.0 || !size.is_finite() || size < 0.0 {
                return Err(bad("times must be finite and at least 0"));
            }
            if q >= count {
                return Err(bad(&format!("queue {q} is outside the group ({count} queues)")));
            }
            rows.push(((at * 1e3).round() as u64, q, (size * 1e3).round() as u64));
        }
        rows.sort_by_key(|r| (r.0, r.1));
        Ok(rows)
    }

    /// The span of the first `key =` in the file (for keys read without a span).
    fn key_span(&self, key: &str) -> Range<usize> {
        let t = &self.source.text;
        let mut off = 0;
        for line in t.split_inclusive('\n') {
            let l = line.trim_start();
            if l.starts_with(key) && l[key.len()..].trim_start().starts_with('=') {
                return off..off + line.len();
            }
            off += line.len();
        }
        0..0
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
