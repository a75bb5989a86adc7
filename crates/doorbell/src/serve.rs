//! `doorbell serve` and `doorbell status`: the daemon (crate `daemon`) and its observer.
//!
//! `serve` binds the socket (`--socket`, else `$XDG_RUNTIME_DIR/doorbell/doorbell.sock`, else
//! `/tmp/doorbell-$UID/doorbell.sock`), reads `--config FILE` (TOML; see `daemon::config`),
//! logs with `tracing` (`-v`, `-vv`, or `RUST_LOG`) and stops cleanly on SIGINT or SIGTERM:
//! every client's device is lost, every process ended, the socket removed.
//! `status` asks a running daemon for its adapters, engines, processes and queues.

use std::path::PathBuf;

use clap::Args;

use crate::CliError;

#[derive(Args)]
pub struct ServeArgs {
    /// The socket to listen on.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// A TOML configuration file (engines, slots, doorbell model and pool, quanta, power
    /// timers, user_queue mode, per-process limits). Unknown keys and bad values are refused.
    #[arg(long)]
    config: Option<PathBuf>,
    /// More logging (-v: debug, -vv: trace); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
}

#[derive(Args)]
pub struct StatusArgs {
    /// The daemon's socket (default: $DOORBELL_SOCKET, else the default path).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

pub fn serve(a: ServeArgs) -> Result<(), CliError> {
    init_logging(a.verbose);
    let config = match &a.config {
        Some(f) => daemon::DaemonConfig::load(f).map_err(|e| CliError::Input(e.to_string()))?,
        None => daemon::DaemonConfig::new(),
    };
    let path = a.socket.unwrap_or_else(daemon::default_socket_path);
    let d = daemon::Daemon::bind(&path, config).map_err(|e| CliError::Input(e.to_string()))?;
    let stopper = d.stopper();
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])
        .map_err(|e| CliError::Input(format!("installing signal handlers: {e}")))?;
    let handle = signals.handle();
    let watcher = std::thread::spawn(move || {
        if let Some(sig) = signals.forever().next() {
            tracing::info!(signal = sig, "signal received: stopping");
            stopper.stop();
        }
    });
    let r = d.run().map_err(|e| CliError::Input(e.to_string()));
    handle.close();
    let _ = watcher.join();
    r
}

pub fn status(a: StatusArgs) -> Result<(), CliError> {
    let path = a.socket.unwrap_or_else(wire::client_socket_path);
    let s = umd::remote::daemon_status(&path).map_err(|e| CliError::Input(e.to_string()))?;
    if a.json {
        outln!("{}", serde_json::to_string(&s).map_err(|e| CliError::Input(e.to_string()))?);
        return Ok(());
    }
    outln!(
        "doorbell daemon pid {} on {} (protocol {}, up {} s)",
        s.daemon_pid,
        s.socket,
        s.protocol_version,
        s.uptime_s
    );
    for ad in &s.adapters {
        outln!(
            "adapter {}: doorbells {} ({} objects, {} pages{}), {} connects, {} victimizations, {} faults, {} interrupts, {} recoveries, {} TDR timeouts",
            ad.index,
            ad.doorbell_model,
            ad.doorbells,
            ad.doorbell_pages_used,
            ad.doorbell_pool.map_or(String::new(), |p| format!(", pool of {p}")),
            ad.connects,
            ad.victimizations,
            ad.faults,
            ad.interrupts,
            ad.recoveries,
            ad.tdr_timeouts
        );
        outln!("  {:<6} {:<8} {:<6} {:>10}", "engine", "kind", "power", "slots");
        for e in &ad.engines {
            outln!("  {:<6} {:<8} {:<6} {:>6}/{:<3}", e.id, e.kind, e.power, e.slots_used, e.slots);
        }
    }
    outln!("processes: {}", s.processes.len());
    for p in &s.processes {
        outln!(
            "  p{} (os pid {}, {}): {} allocations, {} bytes, {} queues",
            p.pid,
            p.os_pid,
            p.name,
            p.allocations,
            p.bytes,
            p.queues.len()
        );
        for q in &p.queues {
            outln!(
                "    {:<20} engine {} {:<6} {:<9} {:<8} doorbell {:<5} completed {}{}",
                q.handle,
                q.engine,
                q.mode,
                q.state,
                q.priority,
                q.doorbell.map_or("-".into(), |d| d.to_string()),
                q.completed,
                q.fault.as_ref().map_or(String::new(), |f| format!(" fault: {f}"))
            );
        }
    }
    Ok(())
}
