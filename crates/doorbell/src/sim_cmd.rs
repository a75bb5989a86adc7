//! `doorbell sim`: scenarios, sweeps, shard merges and calibration (the `sim` crate's front
//! end), and `doorbell bench sim`.
//!
//! `doorbell sim SCENARIO.toml [--seed N] [--out DIR] [--quiet]` runs one scenario and writes
//! its outputs; `doorbell sim sweep SWEEP.toml --out DIR [--shard I/N]` runs a sweep (or one
//! deterministic slice of it); `doorbell sim merge DIR... --out DIR` joins shards;
//! `doorbell sim calibrate [--out FILE]` measures the live driver and writes a `[cost]`
//! section a scenario can include. A progress bar (indicatif) shows on a terminal unless
//! `--quiet`.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use abi::port::KernelPort;
use abi::{EngineKind, Priority};
use clap::{Args, Subcommand};
use gpu::GpuConfig;
use indicatif::{ProgressBar, ProgressStyle};
use kernel::{System, SystemConfig};
use umd::{CommandBuffer, Device, QueueOptions};

use crate::CliError;

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct SimArgs {
    #[command(subcommand)]
    cmd: Option<SimCommand>,
    /// The scenario file (see docs/sim.md).
    scenario: Option<PathBuf>,
    /// The seed (default: the scenario's `seed`).
    #[arg(long)]
    seed: Option<u64>,
    /// The output directory.
    #[arg(long, default_value = "sim-out")]
    out: PathBuf,
    /// No progress bar, and only the output directory is printed.
    #[arg(long)]
    quiet: bool,
}

#[derive(Subcommand)]
enum SimCommand {
    /// Run a base scenario over axes of values and seeds, in parallel (or one shard of it).
    Sweep {
        /// The sweep file.
        sweep: PathBuf,
        /// The output directory.
        #[arg(long)]
        out: PathBuf,
        /// Run only shard I of N (0-based): runs whose number mod N is I.
        #[arg(long, value_parser = parse_shard)]
        shard: Option<(usize, usize)>,
        /// No progress bar.
        #[arg(long)]
        quiet: bool,
    },
    /// Join shard directories into the outputs one local sweep writes.
    Merge {
        /// Shard directories.
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
        /// Where the merged outputs go.
        #[arg(long)]
        out: PathBuf,
    },
    /// Swarm testing: each seed draws a device, queues with workloads and a fault schedule,
    /// runs them on the deterministic driver, and checks invariants at every instant
    /// (completions exactly once, fences never backwards, liveness, hangs detected, an empty
    /// census at teardown). A violation prints its checker, instant, the queue's history and
    /// the command that replays the seed. Exits 1 on any violation.
    #[command(
        after_help = "Examples:\n  doorbell sim swarm --seeds 2000 --json\n  doorbell sim swarm --seeds 1 --from 417 --print\n  doorbell sim swarm --seeds 20 --inject leak      (a broken twin: must report violations)\n\nTwins (--inject): lost-completions, repeated-completion, backwards-fence, leak, silent-hang-timer, hung-doorbell, early-wake, busy-f1, spurious-interrupts.\nSee docs/swarm.md."
    )]
    Swarm {
        /// Seeds to run.
        #[arg(long, default_value_t = 100)]
        seeds: u64,
        /// The first seed.
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// Start no seed after this many minutes (wall clock); the rest are reported as
        /// skipped.
        #[arg(long)]
        minutes: Option<f64>,
        /// Run with a deliberately broken twin of a checker (test-only faults): the swarm must
        /// catch it.
        #[arg(long, value_parser = parse_inject)]
        inject: Option<sim::swarm::Inject>,
        /// Print one JSON object (seeds, violations, instants_checked, faults_injected, …).
        #[arg(long)]
        json: bool,
        /// Print each seed's drawn scenario and fault schedule before running it.
        #[arg(long)]
        print: bool,
        /// Violations known and not yet fixed (`SEED CHECKER` lines, `#` comments, as in
        /// crates/sim/swarm-known.txt): they are reported but do not fail the run; a listed one
        /// that no longer happens does (take it off the list).
        #[arg(long)]
        known: Option<PathBuf>,
        /// No progress line.
        #[arg(long)]
        quiet: bool,
    },
    /// Measure this machine's live driver and write a `[cost]` section for scenarios.
    Calibrate {
        /// The cost file to write.
        #[arg(long, default_value = "cost.toml")]
        out: PathBuf,
    },
}

fn parse_inject(s: &str) -> Result<sim::swarm::Inject, String> {
    s.parse()
}

fn parse_shard(s: &str) -> Result<(usize, usize), String> {
    let (i, n) = s.split_once('/').ok_or_else(|| format!("--shard {s}: expected I/N, for example 0/4"))?;
    let i: usize = i.parse().map_err(|_| format!("--shard {s}: I is not a number"))?;
    let n: usize = n.parse().map_err(|_| format!("--shard {s}: N is not a number"))?;
    if n == 0 || i >= n {
        return Err(format!("--shard {s}: needs 0 <= I < N"));
    }
    Ok((i, n))
}

impl From<sim::SimError> for CliError {
    fn from(e: sim::SimError) -> Self {
        CliError::Input(e.to_string())
    }
}

fn bar(len: u64, quiet: bool) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let b = ProgressBar::new(len);
    b.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    b
}

pub fn run(a: SimArgs) -> Result<(), CliError> {
    match a.cmd {
        Some(SimCommand::Sweep { sweep, out, shard, quiet }) => {
            let s = sim::sweep::Sweep::load(&sweep)?;
            let (i, n) = shard.unwrap_or((0, 1));
            let total = (0..s.runs()).filter(|k| k % n == i).count();
            let pb = bar(total as u64, quiet);
            let t = Instant::now();
            let rows = sim::sweep::run_to_dir(&s, i, n, &out, &|done, _| pb.set_position(done as u64))?;
            pb.finish_and_clear();
            if !quiet {
                outln!(
                    "{} runs (shard {i}/{n} of {}) in {:.1} s -> {}",
                    rows.len(),
                    s.runs(),
                    t.elapsed().as_secs_f64(),
                    out.display()
                );
            }
            Ok(())
        }
        Some(SimCommand::Merge { dirs, out }) => {
            let n = sim::sweep::merge(&dirs, &out)?;
            outln!("merged {n} runs from {} shards -> {}", dirs.len(), out.display());
            Ok(())
        }
        Some(SimCommand::Calibrate { out }) => calibrate(&out),
        Some(SimCommand::Swarm { seeds, from, minutes, inject, json, print, known, quiet }) => {
            let known = match known {
                Some(path) => {
                    let text = std::fs::read_to_string(&path)
                        .map_err(|e| CliError::Input(format!("--known {}: {e}", path.display())))?;
                    sim::swarm::Known::parse(&path.display().to_string(), &text).map_err(CliError::Input)?
                }
                None => sim::swarm::Known::default(),
            };
            swarm(sim::swarm::Options { seeds, from, minutes, inject }, &known, json, print, quiet)
        }
        None => {
            let Some(path) = a.scenario else {
                return Err(CliError::Input("doorbell sim: give a scenario file (or sweep, merge, calibrate)".into()));
            };
            let plan = sim::Scenario::load(&path).map_err(sim::SimError::from)?;
            let seed = a.seed.unwrap_or(plan.seed);
            let pb = bar(1000, a.quiet);
            let (o, summary) = sim::run_to_dir(&plan, seed, &a.out, &mut |f| pb.set_position((f * 1000.0) as u64))?;
            pb.finish_and_clear();
            if a.quiet {
                outln!("{}", a.out.display());
            } else {
                outln!(
                    "{} (seed {seed}): {} queues, {} submissions, {} completions, {} lost, {:.3} ms of virtual time in {:.2} s",
                    plan.name,
                    o.queues.len(),
                    summary["submissions"],
                    summary["completions"],
                    summary["lost"],
                    o.end as f64 / 1e6,
                    o.wall_seconds
                );
                outln!("outputs: {} (report.html, summary.json, queues.csv, trace.json, plots)", a.out.display());
            }
            Ok(())
        }
    }
}

/// `doorbell sim swarm`.
fn swarm(
    o: sim::swarm::Options,
    known: &sim::swarm::Known,
    json: bool,
    print: bool,
    quiet: bool,
) -> Result<(), CliError> {
    use std::sync::atomic::{AtomicU64, Ordering};
    if print {
        for k in 0..o.seeds {
            let seed = o.from.wrapping_add(k);
            match sim::swarm::draw::draw(seed) {
                Ok(d) => outln!("# seed {seed}\n{}", sim::swarm::draw::describe(&d)),
                Err(e) => outln!("# seed {seed}: nothing drawn passed the checks: {e}"),
            }
        }
    }
    let pb = bar(o.seeds, quiet || json);
    // Relaxed: a count for the progress bar; the results travel through rayon's join.
    let (done, bad) = (AtomicU64::new(0), AtomicU64::new(0));
    let report = sim::swarm::swarm(&o, &|r| {
        let n = done.fetch_add(1, Ordering::Relaxed) + 1;
        let b = bad.fetch_add(!r.violations.is_empty() as u64, Ordering::Relaxed) + !r.violations.is_empty() as u64;
        pb.set_position(n);
        pb.set_message(format!("{b} failing"));
    });
    pb.finish_and_clear();
    let violations: Vec<_> = report.violations().collect();
    let verdict = report.verdict(known);
    if json {
        outln!("{:#}", report.json(&o, &verdict));
    } else {
        for v in &violations {
            if verdict.known.iter().any(|k| std::ptr::eq(*k, *v)) {
                outln!("seed {} · {} (known, listed in --known)", v.seed, v.checker);
                continue;
            }
            outln!(
                "seed {} · {} at {:.3} ms{}",
                v.seed,
                v.checker,
                v.instant_ns as f64 / 1e6,
                v.queue.map_or(String::new(), |q| format!(" · queue {q}"))
            );
            outln!("  {}", v.what);
            for h in &v.history {
                outln!("    {h}");
            }
            outln!("  reproduce: {}", v.repro);
        }
        let faults: Vec<String> = report.faults().iter().map(|(k, n)| format!("{k} {n}")).collect();
        outln!(
            "{} seeds ({}–{}){}: {} violations ({} known), {} instants checked, {} queues, {:.1} s of virtual time in {:.1} s",
            report.seeds.len(),
            o.from,
            o.from.wrapping_add(report.seeds.len().saturating_sub(1) as u64),
            if report.skipped > 0 { format!(", {} skipped (--minutes)", report.skipped) } else { String::new() },
            violations.len(),
            verdict.known.len(),
            report.instants(),
            report.seeds.iter().map(|s| s.queues).sum::<usize>(),
            report.seeds.iter().map(|s| s.virtual_ns).sum::<u64>() as f64 / 1e9,
            report.wall_seconds
        );
        outln!("faults injected: {}", if faults.is_empty() { "none".into() } else { faults.join(", ") });
        for (seed, checker) in &verdict.fixed {
            outln!("seed {seed} · {checker}: listed as known but passed: fixed? take it off the --known list");
        }
    }
    if verdict.passed() {
        Ok(())
    } else {
        Err(CliError::Check(format!(
            "{} new violations ({} known) in {} seeds{}",
            verdict.new.len(),
            verdict.known.len(),
            report.seeds.len(),
            if verdict.fixed.is_empty() {
                String::new()
            } else {
                format!("; {} known ones fixed", verdict.fixed.len())
            }
        )))
    }
}

// ---------------------------------------------------------------------------------------
// bench sim

#[derive(Args)]
pub struct BenchSimArgs {
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// User-mode queues.
    #[arg(long, default_value_t = 10_000, value_parser = crate::num::within(1u32, 1_000_000))]
    queues: u32,
    /// Virtual milliseconds to simulate.
    #[arg(long, default_value_t = 1000.0)]
    ms: f64,
    /// Wall seconds of the live run.
    #[arg(long, default_value_t = 1.0)]
    live_seconds: f64,
}

/// The fixed scenario: `queues` user-mode queues on one compute engine with 8 slots, each a
/// closed loop of 2 outstanding command buffers holding a 2 µs synthetic kernel.
pub fn bench_scenario(queues: u32, ms: f64) -> String {
    format!(
        r#"name = "bench-sim"
duration_ms = {ms}
drain_ms = 0
[device]
engines = ["compute"]
slots = 8
[[group]]
name = "q"
count = {queues}
[group.workload]
outstanding = 2
[group.commands]
synthetic = {{ us = 2 }}
"#
    )
}

pub fn bench_sim(a: BenchSimArgs) -> Result<(), CliError> {
    if !(a.ms > 0.0 && a.ms <= 10_000.0 && a.live_seconds > 0.0 && a.live_seconds <= 600.0) {
        return Err(CliError::Input("--ms must be in (0, 10000], --live-seconds in (0, 600]".into()));
    }
    let plan = sim::Scenario::parse(std::path::Path::new("bench-sim.toml"), &bench_scenario(a.queues, a.ms))
        .map_err(sim::SimError::from)?;
    if !a.json {
        eprintln!("simulating {} queues for {} ms of virtual time", a.queues, a.ms);
    }
    let o = sim::run(&plan, 1, &mut |_| {}).map_err(sim::SimError::from)?;
    // Rates are over the event loop; building 10,000 queues is reported apart.
    let wall = o.run_seconds.max(1e-9);
    let submissions: u64 = o.queues.iter().map(|q| q.submitted).sum();
    let completions: u64 = o.queues.iter().map(|q| q.completed).sum();
    if !a.json {
        eprintln!("live run: the same workload scaled down to 64 queues for {} s", a.live_seconds);
    }
    let live = live_rate(64, a.live_seconds)?;
    let o = serde_json::json!({
        "queues": a.queues,
        "slots": 8,
        "virtual_ms": a.ms,
        "setup_s": (o.setup_seconds * 1e3).round() / 1e3,
        "wall_s": (wall * 1e3).round() / 1e3,
        "events": o.events,
        "events_per_s": (o.events as f64 / wall).round() as u64,
        "submissions": submissions,
        "completions": completions,
        "submissions_per_s": (submissions as f64 / wall).round() as u64,
        "sim_seconds_per_wall_second": ((o.end as f64 / 1e9) / wall * 1e6).round() / 1e6,
        "live_queues": 64,
        "live_submissions_per_s": live.round() as u64,
    });
    if a.json {
        outln!("{o}");
    } else {
        outln!("{o:#}");
    }
    Ok(())
}

/// Submissions per second the live driver completes for `queues` closed-loop user-mode
/// queues (2 outstanding each, a 2 µs synthetic kernel) over `seconds`.
fn live_rate(queues: u32, seconds: f64) -> Result<f64, CliError> {
    let gpu =
        GpuConfig { engines: vec![EngineKind::Compute], idle_period: Duration::from_secs(3600), ..Default::default() };
    let sys = System::live(SystemConfig { gpu, ..Default::default() })?;
    let port: Arc<dyn KernelPort> = sys.open_process()?;
    let dev = Device::open(port)?;
    let engine = dev.engine(EngineKind::Compute)?;
    let ctx = dev.create_context(engine)?;
    let mut qs = Vec::new();
    for _ in 0..queues {
        let mut q = ctx.create_queue(QueueOptions {
            ring_bytes: 4096,
            priority: Priority::Normal,
            ..QueueOptions::user_mode()
        })?;
        q.set_spin(0);
        qs.push((q, std::collections::VecDeque::new()));
    }
    let mut cb = CommandBuffer::new();
    cb.synthetic(2_000);
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(seconds);
    let mut completed = 0u64;
    while Instant::now() < end {
        for (q, out) in qs.iter_mut() {
            let done = q.completed();
            while out.front().is_some_and(|&v| v <= done) {
                out.pop_front();
                completed += 1;
            }
            while out.len() < 2 {
                out.push_back(q.submit(&cb)?);
            }
        }
    }
    let rate = completed as f64 / start.elapsed().as_secs_f64();
    for (q, _) in &qs {
        q.finish(Some(Duration::from_secs(30)))?;
    }
    Ok(rate)
}

// ---------------------------------------------------------------------------------------
// calibrate

/// Measures the live driver with device timestamps around known work and writes a `[cost]`
/// section: the per-packet cost (1,000 `WRITE_DATA`s), the bulk bandwidth (a 16 MiB `FILL`),
/// the cost of one wave-instruction (an ALU-bound kernel, by the device's instruction count),
/// interrupt delivery (from a `TIMESTAMP` just before a fence `SIGNAL` to the CPU thread that
/// waited for it running again) and a kernel call on the control path (a CPU signal of a
/// native fence, 1,000 in a row).
fn calibrate(out: &std::path::Path) -> Result<(), CliError> {
    let sys = System::live(SystemConfig::default())?;
    let port: Arc<dyn KernelPort> = sys.open_process()?;
    let dev = Device::open(port)?;
    let engine = dev.engine(EngineKind::Compute)?;
    let ctx = dev.create_context(engine)?;
    let mut q = ctx.create_queue(QueueOptions::user_mode())?;
    let buf = dev.allocate(16 << 20)?;
    let ts = dev.allocate(4096)?;
    let timed = |q: &mut umd::Queue, body: &dyn Fn(&mut CommandBuffer)| -> Result<u64, CliError> {
        let mut cb = CommandBuffer::new();
        cb.timestamp(ts.va());
        body(&mut cb);
        cb.timestamp(ts.va() + 8);
        let v = q.submit(&cb)?;
        q.wait(v, Some(Duration::from_secs(30)))?;
        let (a, b) = (ts.read_u64(0)?, ts.read_u64(8)?);
        Ok(b.saturating_sub(a))
    };
    let best = |q: &mut umd::Queue, body: &dyn Fn(&mut CommandBuffer)| -> Result<u64, CliError> {
        let mut m = u64::MAX;
        for _ in 0..5 {
            m = m.min(timed(q, body)?);
        }
        Ok(m)
    };
    let packets = 1000u64;
    let packet_ns = best(&mut q, &|cb| {
        for i in 0..packets {
            cb.write_u32(buf.va() + 4 * i, i as u32);
        }
    })? as f64
        / packets as f64;
    let fill_ns = best(&mut q, &|cb| {
        cb.fill(buf.va(), 16 << 20, 0x1234_5678);
    })?;
    let bulk_bytes_per_us = (16u64 << 20) as f64 / (fill_ns.max(1) as f64 / 1e3);
    // The `rounds` kernel (about five wave-instructions a round): the device counts the
    // wave-instructions it ran.
    let kernel = dev.upload(&program::workloads::rounds().to_bytes())?;
    let out_buf = dev.allocate(4 * 1024)?;
    let args = dev.upload(&program::workloads::rounds_args(out_buf.va(), 2_000))?;
    let mut wave_ns = f64::MAX;
    let mut waves = 0;
    for _ in 0..5 {
        let before = sys.with_gpu(|g| g.compute_stats().instructions);
        let ns = timed(&mut q, &|cb| {
            cb.dispatch(kernel.va(), [4, 1, 1], [256, 1, 1], args.va());
        })?;
        waves = sys.with_gpu(|g| g.compute_stats().instructions) - before;
        wave_ns = wave_ns.min(ns as f64 / waves.max(1) as f64);
    }
    // Interrupt delivery: after 200 µs of work (the CPU thread is blocked in its wait by then),
    // the device stamps the time and signals a fence the thread waits on (its MonitoredValue
    // makes the signal interrupt); the thread notes when it runs again.
    let mut fence = dev.create_fence(0, abi::port::NativeFenceType::Default)?;
    fence.set_spin(0);
    let mut interrupt_ns = u64::MAX;
    for v in 1..=20u64 {
        let mut cb = CommandBuffer::new();
        cb.synthetic(200_000).timestamp(ts.va()).signal_fence(&fence, v);
        q.submit(&cb)?;
        fence.wait(v, Some(Duration::from_secs(30)))?;
        let woke = sys.now().as_nanos();
        interrupt_ns = interrupt_ns.min(woke.saturating_sub(ts.read_u64(0)?));
    }
    // A kernel call: signalling a native fence from the CPU (1,000 in a row, best of 5).
    let calls = 1000u64;
    let mut call_ns = f64::MAX;
    for round in 0..5u64 {
        let t = Instant::now();
        for k in 0..calls {
            fence.signal(100 + round * calls + k)?;
        }
        call_ns = call_ns.min(t.elapsed().as_nanos() as f64 / calls as f64);
    }
    let text = format!(
        "# Measured by `doorbell sim calibrate` on this machine's live driver (minimum of 5 runs).\n\
         # Include it in a scenario as its [cost] section.\n\
         [cost]\n\
         packet_ns = {packet_ns:.1}\n\
         bulk_bytes_per_us = {bulk_bytes_per_us:.0}\n\
         wave_instruction_ns = {wave_ns:.3}\n\
         interrupt_ns = {interrupt_ns}\n\
         kernel_call_ns = {call_ns:.0}\n\
         # from {packets} WRITE_DATA packets, a 16 MiB FILL, {waves} wave-instructions, 20 fence\n\
         # signals a CPU thread waited for, and {calls} CPU signals of a fence\n"
    );
    std::fs::write(out, &text).map_err(|e| CliError::Input(format!("{}: {e}", out.display())))?;
    out!("{text}");
    Ok(())
}
