//! `doorbell serve` and `doorbell status`: the daemon (crate `daemon`) and its observer.
//!
//! `serve` binds the socket (`--socket`, else `$XDG_RUNTIME_DIR/doorbell/doorbell.sock`, else
//! `/tmp/doorbell-$UID/doorbell.sock`), reads `--config FILE` (TOML; see `daemon::config`;
//! `-` reads standard input), logs with `tracing` (`-v`, `-vv`, or `RUST_LOG`; colours only
//! on a terminal and never with `NO_COLOR`) and stops cleanly on SIGINT or SIGTERM: every
//! client's device is lost, every process ended, the socket and its lock file removed. It
//! replaces only a stale socket at the path; anything else there is refused and left alone
//! (`daemon::socket`).
//! `status` asks a running daemon for its adapters, engines, processes and queues.

use std::path::PathBuf;

use clap::Args;

use wire::counted;

use crate::CliError;

#[derive(Args)]
pub struct ServeArgs {
    /// The socket to listen on [default: $XDG_RUNTIME_DIR/doorbell/doorbell.sock, else
    /// /tmp/doorbell-$UID/doorbell.sock]. At most 107 bytes. Only a stale socket there (one
    /// nobody listens on) is replaced; a file, directory or link there is refused and kept.
    #[arg(long, verbatim_doc_comment)]
    socket: Option<PathBuf>,
    /// A TOML configuration file (engines, slots, doorbell model and pool, quanta, power
    /// timers, user_queue mode, per-process limits), or `-` for standard input. Unknown keys
    /// and bad values are refused.
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
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour_on_stderr())
        .with_writer(std::io::stderr)
        .try_init();
}

/// Colours only for a person at a terminal, and never when `NO_COLOR` is set (no-color.org:
/// set and not empty).
fn colour_on_stderr() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

fn load_config(path: &std::path::Path) -> Result<daemon::DaemonConfig, CliError> {
    let r = if path.as_os_str() == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .map_err(|e| CliError::Input(format!("reading the configuration from standard input: {e}")))?;
        daemon::DaemonConfig::parse(std::path::Path::new("<standard input>"), &text)
    } else {
        daemon::DaemonConfig::load(path)
    };
    r.map_err(|e| CliError::Input(e.to_string()))
}

pub fn serve(a: ServeArgs) -> Result<(), CliError> {
    init_logging(a.verbose);
    let path = a.socket.unwrap_or_else(daemon::default_socket_path);
    // Refused before the configuration is read: nothing at the path is touched.
    daemon::check_socket_path(&path).map_err(|e| CliError::Input(e.to_string()))?;
    let config = match &a.config {
        Some(f) => load_config(f)?,
        None => daemon::DaemonConfig::new(),
    };
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
    let path = a.socket.unwrap_or_else(wire::client::socket_path);
    let s = wire::client::daemon_status(&path).map_err(|e| CliError::Input(e.to_string()))?;
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
            "adapter {}: doorbells {} ({}, {}{}), {}, {}, {}, {}, {}, {}, {}",
            ad.index,
            ad.doorbell_model,
            counted(ad.doorbells, "object", "objects"),
            counted(ad.doorbell_pages_used, "page", "pages"),
            ad.doorbell_pool.map_or(String::new(), |p| format!(", pool of {p}")),
            counted(ad.connects, "connect", "connects"),
            counted(ad.victimizations, "victimization", "victimizations"),
            counted(ad.faults, "fault", "faults"),
            counted(ad.interrupts, "interrupt", "interrupts"),
            counted(ad.recoveries, "recovery", "recoveries"),
            counted(ad.tdr_timeouts, "TDR timeout", "TDR timeouts"),
            counted(ad.hang_timeouts, "hang timeout", "hang timeouts")
        );
        outln!("  {:<6} {:<8} {:<6} {:>10}", "engine", "kind", "power", "slots");
        for e in &ad.engines {
            outln!("  {:<6} {:<8} {:<6} {:>6}/{:<3}", e.id, e.kind, e.power, e.slots_used, e.slots);
        }
    }
    outln!("processes: {}", s.processes.len());
    for p in &s.processes {
        outln!(
            "  p{} (os pid {}, {}): {}, {}, {}",
            p.pid,
            p.os_pid,
            p.name,
            counted(p.allocations.into(), "allocation", "allocations"),
            counted(p.bytes, "byte", "bytes"),
            counted(p.queues.len() as u64, "queue", "queues")
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
