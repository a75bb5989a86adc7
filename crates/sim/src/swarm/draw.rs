//! What one seed of the swarm runs: a scenario and a fault schedule, drawn from the seed.
//!
//! The scenario is drawn as scenario-file text and goes through the same parser and checks
//! as a researcher's file ([`crate::Scenario::parse`]), so a drawn configuration is one a
//! user could write, and `doorbell sim swarm --seeds 1 --from S --print` shows it. It draws
//! the device (engines, slots, doorbell model and pool, the aggregated doorbell, notify on
//! submit, quanta, idle period, D3 timer, preemption granularities), the TDR settings (delay,
//! limits, engine reset, DDI delay, per-queue hang timers), the costs (doorbell latency,
//! interrupt delivery, kernel call, turn), groups of queues with workloads and command
//! buffers (fences between groups, CPU waiters), and the scenario's own events (kills,
//! hangs, D3 requests, context suspends with their resumes).
//!
//! The faults no scenario file can state are drawn beside it as [`Fault`]s, applied by the
//! checker at their instant: a DDI call made to fail, a reset DDI that answers with a bogus
//! fence ID or late, and a queue held by a preemption request for a while (the kernel's
//! `preempt_queue`, then `resume_queue`).
//!
//! Invariants: the same seed draws the same text and schedule (one ChaCha stream); every
//! fault happens inside the submission window; a drawn scenario that the checks refuse (a
//! process limit, say) is drawn again from the same stream, and the number of redraws is
//! kept.

use std::fmt::Write;
use std::path::Path;

use kernel::ddi::{DdiKind, Misbehaviour};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::Plan;

/// A fault the scenario format cannot state, applied at its instant.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// The `call`th next call of `ddi` fails.
    Ddi {
        /// The DDI.
        ddi: DdiKind,
        /// Which of its next calls (1: the next).
        call: u32,
    },
    /// The next call of a reset DDI misbehaves.
    Misbehave {
        /// The reset DDI.
        ddi: DdiKind,
        /// How.
        how: Misbehaviour,
    },
    /// The kernel holds queue `queue` (global index) by a preemption request for `hold_ns`,
    /// then resumes it.
    Hold {
        /// The queue.
        queue: usize,
        /// How long (ns).
        hold_ns: u64,
    },
}

impl Fault {
    /// Its kind, for the counts (`ddi-reset-engine`, `slow-reset-queue`, `hold`, …).
    pub fn kind(&self) -> String {
        match self {
            Fault::Ddi { ddi, .. } => format!("ddi-{}", kebab(ddi)),
            Fault::Misbehave { ddi, how: Misbehaviour::BogusFenceId } => format!("bogus-fence-id-{}", kebab(ddi)),
            Fault::Misbehave { ddi, how: Misbehaviour::Slow(_) } => format!("slow-{}", kebab(ddi)),
            Fault::Hold { .. } => "hold".into(),
        }
    }
}

/// `ResetEngine` → `reset-engine`.
fn kebab(d: &DdiKind) -> String {
    let mut s = String::new();
    for (i, c) in format!("{d:?}").chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            s.push('-');
        }
        s.push(c.to_ascii_lowercase());
    }
    s
}

/// One seed's draw.
pub struct Draw {
    /// The scenario text.
    pub text: String,
    /// The checked scenario.
    pub plan: Plan,
    /// Faults beside it: (ns since the run's start, fault), in time order.
    pub faults: Vec<(u64, Fault)>,
    /// Drawn scenarios the checks refused before this one.
    pub redraws: u32,
}

/// The most redraws before a seed gives up (the checks refuse only rare combinations).
const MAX_REDRAWS: u32 = 64;

/// Draws seed `seed`'s scenario and faults.
pub fn draw(seed: u64) -> Result<Draw, crate::ScenarioError> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut redraws = 0;
    loop {
        let (text, holds) = scenario_text(seed, &mut rng);
        match crate::Scenario::parse(Path::new(&format!("swarm-{seed}.toml")), &text) {
            Ok(plan) => {
                let faults = faults(&mut rng, &plan, holds);
                return Ok(Draw { text, plan, faults, redraws });
            }
            Err(e) if redraws >= MAX_REDRAWS => return Err(e),
            Err(_) => redraws += 1,
        }
    }
}

fn pick<'a, T>(rng: &mut ChaCha8Rng, xs: &'a [T]) -> &'a T {
    &xs[rng.random_range(0..xs.len())]
}

/// The scenario's text, and how many holds to draw beside it.
fn scenario_text(seed: u64, r: &mut ChaCha8Rng) -> (String, u32) {
    let mut t = String::new();
    let duration_ms = r.random_range(2..=20u32);
    w(&mut t, format!("name = \"swarm-{seed}\"\nseed = {seed}\nduration_ms = {duration_ms}\ndrain_ms = 20000"));
    w(&mut t, "samples = 20\ntrace_queues = 0\n\n[device]".into());
    let copy = device_text(&mut t, r);
    let groups = r.random_range(1..=4usize);
    let counts: Vec<u32> = (0..groups).map(|g| group_text(&mut t, r, g, copy)).collect();
    events_text(&mut t, r, duration_ms, &counts);
    let holds = r.random_range(0..=3u32);
    (t, holds)
}

/// A line of the scenario.
fn w(t: &mut String, s: String) {
    t.push_str(&s);
    t.push('\n');
}

/// `[device]`, `[device.tdr]` and `[cost]`; returns whether the device has a copy engine.
fn device_text(t: &mut String, r: &mut ChaCha8Rng) -> bool {
    let copy = r.random_bool(0.4);
    w(t, format!("engines = {}", if copy { "[\"compute\", \"copy\"]" } else { "[\"compute\"]" }));
    w(t, format!("slots = {}", r.random_range(1..=8u32)));
    if r.random_bool(0.2) {
        w(t, "doorbell_model = \"global\"".into());
    } else if r.random_bool(0.35) {
        w(t, format!("doorbell_pool = {}", r.random_range(1..=6u32)));
    }
    if r.random_bool(0.15) {
        w(t, "aggregated_doorbell = true".into());
    }
    if r.random_bool(0.15) {
        w(t, "notify_on_submit = true".into());
    }
    w(t, format!("process_quantum_us = {}", pick(r, &[200, 1000, 5000, 10000])));
    w(t, format!("gang_quantum_us = {}", pick(r, &[50, 200, 1000])));
    w(t, format!("idle_period_us = {}", pick(r, &[20, 100, 500, 2000, 20000])));
    if r.random_bool(0.3) {
        w(t, format!("d3_idle_ms = {}", pick(r, &[1, 2, 5])));
    }
    let compute = ["none", "dma_buffer", "dispatch", "thread_group", "thread", "shader"];
    w(t, format!("preemption_compute = \"{}\"", pick(r, &compute)));
    w(t, format!("preemption_copy = \"{}\"", pick(r, &["none", "dma_buffer", "chunk"])));
    w(t, "\n[device.tdr]".into());
    w(t, format!("delay_ms = {}", pick(r, &[2, 5, 20, 100])));
    w(t, format!("limit_count = {}", pick(r, &[1, 3, 5, 100])));
    w(t, format!("limit_time_ms = {}", pick(r, &[10, 1000, 60000])));
    w(t, format!("engine_reset = {}", r.random_bool(0.7)));
    w(t, format!("ddi_delay_ms = {}", pick(r, &[1, 10, 5000])));
    w(t, format!("hang_compute_ms = {}", pick(r, &[0, 3, 10, 50])));
    w(t, format!("hang_copy_ms = {}", pick(r, &[0, 3, 10, 50])));
    w(t, "\n[cost]".into());
    w(t, format!("doorbell_latency_ns = {}", pick(r, &[0, 0, 300, 2000])));
    w(t, format!("interrupt_ns = {}", pick(r, &[0, 0, 1000, 5000])));
    w(t, format!("kernel_call_ns = {}", pick(r, &[0, 0, 1500, 10000])));
    w(t, format!("turn_us = {}", pick(r, &[20, 100, 400])));

    copy
}

/// Group `g` (`g0`, `g1`, …): its queues, workload and commands; returns its queue count.
fn group_text(t: &mut String, r: &mut ChaCha8Rng, g: usize, copy: bool) -> u32 {
    let count = r.random_range(1..=8u32);
    let engine = if copy && r.random_bool(0.3) { "copy" } else { "compute" };
    w(t, format!("\n[[group]]\nname = \"g{g}\"\ncount = {count}\nengine = \"{engine}\""));
    w(t, format!("priority = \"{}\"", pick(r, &["low", "normal", "normal", "high", "realtime"])));
    if r.random_bool(0.25) {
        w(t, "path = \"kernel\"".into());
    }
    if r.random_bool(0.5) {
        w(t, format!("queues_per_process = {}", r.random_range(1..=3u32)));
    }
    w(t, format!("ring_bytes = {}", pick(r, &[4096, 8192, 65536])));
    // A dependency on an earlier group that signals (no cycles by construction).
    let after = (g > 0 && r.random_bool(0.2)).then(|| r.random_range(0..g));
    if let Some(a) = after {
        w(t, format!("after = \"g{a}\""));
    }
    let signal = r.random_bool(0.3);
    w(t, "[group.workload]".into());
    match r.random_range(0..4u32) {
        0 | 1 => {
            w(t, format!("kind = \"closed\"\noutstanding = {}", pick(r, &[1, 2, 4])));
            w(t, format!("think_us = {}", pick(r, &[0, 5, 50])));
        }
        2 => w(t, format!("kind = \"periodic\"\nperiod_us = {}", pick(r, &[50, 200, 1000]))),
        _ => w(t, format!("kind = \"bursts\"\nburst_size = {}\nburst_period_us = {}", r.random_range(1..=6u32), 500)),
    }
    if signal && r.random_bool(0.5) {
        w(t, "cpu_waiter = true".into());
    }
    w(t, "[group.commands]".into());
    if r.random_bool(0.3) {
        w(t, format!("write_data = {}", r.random_range(1..=3u32)));
    }
    if engine == "copy" || r.random_bool(0.2) {
        w(t, format!("fill_bytes = {}", pick(r, &[256, 65536, 262144])));
    }
    if r.random_bool(0.2) {
        w(t, format!("copy_bytes = {}", pick(r, &[256, 131072])));
    }
    if signal {
        w(t, "signal = true".into());
    }
    if engine == "compute" || r.random_bool(0.5) {
        let (lo, hi) = *pick(r, &[(1, 20), (10, 200), (100, 1500)]);
        w(t, format!("synthetic = {{ dist = \"uniform\", min_us = {lo}, max_us = {hi} }}"));
    }
    count
}

/// Events inside the window, strictly before its end, on queues of the groups (`counts`
/// queues each).
fn events_text(t: &mut String, r: &mut ChaCha8Rng, duration_ms: u32, counts: &[u32]) {
    let groups = counts.len();
    let events = r.random_range(0..=5u32);
    for _ in 0..events {
        let at = r.random_range(0.0..duration_ms as f64 * 0.9);
        let g = r.random_range(0..groups);
        let q = r.random_range(0..counts[g]);
        let target = format!("group = \"g{g}\"\nqueue = {q}");
        match r.random_range(0..4u32) {
            0 => w(t, format!("\n[[event]]\nat_ms = {at:.3}\naction = \"kill\"\n{target}")),
            1 => w(t, format!("\n[[event]]\nat_ms = {at:.3}\naction = \"hang\"\n{target}")),
            2 => w(t, format!("\n[[event]]\nat_ms = {at:.3}\naction = \"d3\"")),
            _ => {
                let for_ms = pick(r, &[0.05, 0.5, 3.0, 30.0]);
                w(t, format!("\n[[event]]\nat_ms = {at:.3}\naction = \"suspend\"\n{target}\nfor_ms = {for_ms}"))
            }
        }
    }
}

/// The faults beside the scenario, inside its window, in time order.
fn faults(r: &mut ChaCha8Rng, plan: &Plan, holds: u32) -> Vec<(u64, Fault)> {
    let window = plan.duration.unwrap_or(1_000_000);
    let queues: usize = plan.groups.iter().map(|g| g.count as usize).sum();
    let mut out = Vec::new();
    for _ in 0..holds {
        let hold_ns = *pick(r, &[10_000u64, 500_000, 5_000_000, 40_000_000]);
        out.push((r.random_range(0..window), Fault::Hold { queue: r.random_range(0..queues), hold_ns }));
    }
    let ddis = [
        DdiKind::PreemptQueue,
        DdiKind::ResetEngine,
        DdiKind::ResetQueue,
        DdiKind::ConnectDoorbell,
        DdiKind::SubmitCommand,
        DdiKind::TakeBack,
    ];
    for _ in 0..r.random_range(0..=2u32) {
        let ddi = *pick(r, &ddis);
        out.push((r.random_range(0..window), Fault::Ddi { ddi, call: r.random_range(1..=3u32) }));
    }
    if r.random_bool(0.3) {
        let ddi = *pick(r, &[DdiKind::ResetEngine, DdiKind::ResetQueue]);
        let how = if r.random_bool(0.5) {
            Misbehaviour::BogusFenceId
        } else {
            Misbehaviour::Slow(std::time::Duration::from_millis(*pick(r, &[2u64, 20, 200])))
        };
        out.push((r.random_range(0..window), Fault::Misbehave { ddi, how }));
    }
    out.sort_by_key(|f| f.0);
    out
}

/// The scenario text with the faults beside it as comments (for `--print`).
pub fn describe(d: &Draw) -> String {
    let mut s = d.text.clone();
    if !d.faults.is_empty() {
        s.push_str("\n# Faults the swarm applies beside the scenario (not scenario keys):\n");
        for (at, f) in &d.faults {
            let _ = writeln!(s, "#   at {:.3} ms: {f:?}", *at as f64 / 1e6);
        }
    }
    s
}
