//! `doorbell load`: a client process of a running daemon that keeps queues busy, for
//! watching `doorbell top`, trying a configuration's limits, or giving a daemon something to
//! do in a test.
//!
//! It opens `--queues` user-mode queues (on the compute engine, and on the copy engine too
//! with `--engines both`), and each second submits `--rate` command buffers per queue, each
//! `--work-us` of modelled device work and a checked `WRITE_DATA`, paced against the clock.
//! It stops after `--seconds` (0: until SIGINT/SIGTERM or a lost device), waits for its last
//! submissions, checks every queue's last written value and prints one line per queue.

use std::time::{Duration, Instant};

use abi::{EngineKind, Priority};
use clap::{Args, ValueEnum};
use umd::{CommandBuffer, Device, QueueOptions};

use crate::CliError;

#[derive(Clone, Copy, ValueEnum)]
enum Engines {
    Compute,
    Copy,
    Both,
}

#[derive(Clone, Copy, ValueEnum)]
enum Prio {
    Low,
    Normal,
    High,
}

#[derive(Args)]
pub struct LoadArgs {
    /// The daemon's socket (default: $DOORBELL_SOCKET, else the default path).
    #[arg(long)]
    socket: Option<std::path::PathBuf>,
    /// User-mode queues per engine.
    #[arg(long, default_value_t = 2, value_parser = crate::num::within(1u32, 64))]
    queues: u32,
    /// Engines to load.
    #[arg(long, value_enum, default_value_t = Engines::Compute)]
    engines: Engines,
    /// Command buffers per second per queue.
    #[arg(long, default_value_t = 1000, value_parser = crate::num::within(1u32, 1_000_000))]
    rate: u32,
    /// Modelled device work per command buffer, in microseconds (a SYNTHETIC packet).
    #[arg(long, default_value_t = 50, value_parser = crate::num::within(0u64, 1_000_000))]
    work_us: u64,
    /// Queue priority.
    #[arg(long, value_enum, default_value_t = Prio::Normal)]
    priority: Prio,
    /// How long to run; 0 runs until stopped (SIGINT, SIGTERM).
    #[arg(long, default_value_t = 10.0, value_parser = seconds_or_zero)]
    seconds: f64,
}

const T: Option<Duration> = Some(Duration::from_secs(30));

/// `--seconds`: 0 (until stopped) or a duration up to a day.
fn seconds_or_zero(s: &str) -> Result<f64, String> {
    if s.trim().parse::<f64>() == Ok(0.0) { Ok(0.0) } else { crate::num::parse_seconds(s, 86_400.0) }
}

pub fn run(a: LoadArgs) -> Result<(), CliError> {
    let port = match &a.socket {
        Some(p) => wire::client::connect(p)?,
        None => wire::client::connect_default()?,
    };
    let dev = Device::open(port)?;
    let kinds: &[EngineKind] = match a.engines {
        Engines::Compute => &[EngineKind::Compute],
        Engines::Copy => &[EngineKind::Copy],
        Engines::Both => &[EngineKind::Compute, EngineKind::Copy],
    };
    let priority = match a.priority {
        Prio::Low => Priority::Low,
        Prio::Normal => Priority::Normal,
        Prio::High => Priority::High,
    };
    // One word per queue for its last write: at most 2 engines x 64 queues.
    let buf = dev.allocate(4096)?;
    let mut queues = Vec::new();
    // Kept to the end: a context's queues go with it.
    let mut contexts = Vec::new();
    for &kind in kinds {
        let ctx = dev.create_context(dev.engine(kind)?)?;
        for _ in 0..a.queues {
            let mut q = ctx.create_queue(QueueOptions { priority, ..QueueOptions::user_mode() })?;
            q.set_spin(0);
            queues.push((kind, q, 0u64));
        }
        contexts.push(ctx);
    }
    eprintln!(
        "doorbell load: pid {}, {} queues, {} command buffers/s each of {} µs{}",
        std::process::id(),
        queues.len(),
        a.rate,
        a.work_us,
        if a.seconds > 0.0 { format!(", for {} s", a.seconds) } else { ", until stopped".into() }
    );
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).map_err(|e| CliError::Input(format!("signal handler: {e}")))?;
    }
    let period = Duration::from_secs_f64(1.0 / f64::from(a.rate));
    let start = Instant::now();
    let end = (a.seconds > 0.0).then(|| start + Duration::from_secs_f64(a.seconds));
    let mut cb = CommandBuffer::new();
    let mut round = 0u64;
    // Relaxed: a flag the signal handler raises; nothing else rides on it.
    while !stop.load(std::sync::atomic::Ordering::Relaxed) && end.is_none_or(|e| Instant::now() < e) {
        round += 1;
        for (k, (_, q, last)) in queues.iter_mut().enumerate() {
            cb.clear();
            if a.work_us > 0 {
                cb.synthetic(a.work_us * 1000);
            }
            cb.write_u32(buf.va() + 4 * k as u64, round as u32);
            *last = q.submit(&cb)?;
        }
        // Paced against the start, so a slow round does not lower the rate for good.
        let due = start + period.mul_f64(round as f64);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    for (k, (kind, q, last)) in queues.iter().enumerate() {
        q.wait(*last, T)?;
        let got = buf.read_u32(4 * k as u64)?;
        if got != round as u32 {
            return Err(CliError::Check(format!("queue {k}: last write {got}, expected {round}")));
        }
        outln!("queue {k} ({kind}): {} command buffers, all completed", q.completed());
    }
    Ok(())
}
