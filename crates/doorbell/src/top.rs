//! `doorbell top`: a live view of a running daemon in the style of `nvtop`: engines (power
//! state, slots held, busy share over time as a sparkline), client processes and their queues
//! (state, priority, doorbell, submissions per second, completed, faults), and recent faults,
//! timeouts, recoveries and victimizations. The daemon's `status` answer is read every
//! `--interval`; the view itself is `top_view`.
//!
//! Keys: `q` (or Esc, Ctrl-C) quits, `s` cycles the sort, `p` shows the next process only,
//! `a` all processes again, `+`/`-` change the refresh interval. `--once` prints one frame as
//! text (two readings `--interval` apart, so rates are there) and exits, for scripts.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};

use crate::CliError;
use crate::top_view::{Model, SortKey, draw, render_text};

#[derive(Args)]
pub struct TopArgs {
    /// The daemon's socket (default: $DOORBELL_SOCKET, else the default path).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Seconds between readings (0.1 to 60).
    #[arg(long, default_value_t = 1.0, value_parser = |s: &str| crate::num::parse_seconds(s, 60.0))]
    interval: f64,
    /// How queues are ordered (the `s` key cycles).
    #[arg(long, value_enum, default_value_t = SortKey::Rate)]
    sort: SortKey,
    /// Show only this process's queues: its kernel process id (`p3` or `3`, as `status`
    /// prints it) or a part of its name.
    #[arg(long)]
    process: Option<String>,
    /// Print one frame as text and exit (for scripts).
    #[arg(long)]
    once: bool,
    /// With --once: the frame's width in columns.
    #[arg(long, default_value_t = 140, value_parser = crate::num::within(60u16, 1000))]
    width: u16,
}

fn read(path: &std::path::Path) -> Result<wire::DaemonStatus, CliError> {
    wire::client::daemon_status(path)
        .map_err(|e| CliError::Input(format!("no daemon answers at {}: {e}", path.display())))
}

/// The process `--process` names, in the reading `s`.
fn resolve_process(s: &wire::DaemonStatus, which: &str) -> Result<u32, CliError> {
    let id = which.strip_prefix('p').unwrap_or(which);
    if let Ok(pid) = id.parse::<u32>() {
        return Ok(pid);
    }
    let found: Vec<_> = s.processes.iter().filter(|p| p.name.contains(which)).collect();
    match found.as_slice() {
        [p] => Ok(p.pid),
        [] => Err(CliError::Input(format!("--process {which}: no client process has that id or name"))),
        many => Err(CliError::Input(format!(
            "--process {which}: {} processes match ({}); give its id",
            many.len(),
            many.iter().map(|p| format!("p{} {}", p.pid, p.name)).collect::<Vec<_>>().join(", ")
        ))),
    }
}

pub fn run(a: TopArgs) -> Result<(), CliError> {
    if a.interval < 0.1 {
        return Err(CliError::Input(format!("--interval {}: at least 0.1 s", a.interval)));
    }
    let path = a.socket.clone().unwrap_or_else(wire::client::socket_path);
    let mut interval = Duration::from_secs_f64(a.interval);
    let first = read(&path)?;
    let filter = a.process.as_deref().map(|w| resolve_process(&first, w)).transpose()?;
    let mut model = Model::new(a.sort, filter, interval);
    model.update(first);
    if a.once {
        std::thread::sleep(interval);
        model.update(read(&path)?);
        let lines = render_text(&model, a.width, model.height()).map_err(CliError::Input)?;
        for l in lines {
            outln!("{l}");
        }
        return Ok(());
    }
    let mut terminal = ratatui::try_init().map_err(|e| CliError::Input(format!("the terminal: {e}")))?;
    let result = (|| -> Result<(), CliError> {
        let mut next = Instant::now() + interval;
        loop {
            terminal.draw(|f| draw(f, &model)).map_err(|e| CliError::Input(format!("drawing: {e}")))?;
            let wait = next.saturating_duration_since(Instant::now());
            if event::poll(wait).map_err(|e| CliError::Input(e.to_string()))? {
                if let Event::Key(k) = event::read().map_err(|e| CliError::Input(e.to_string()))? {
                    if k.kind != KeyEventKind::Press {
                        continue;
                    }
                    match k.code {
                        KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                        KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => return Ok(()),
                        KeyCode::Char('s') => model.sort = model.sort.next(),
                        KeyCode::Char('p') => model.next_filter(),
                        KeyCode::Char('a') => model.filter = None,
                        KeyCode::Char('+') => interval = (interval * 2).min(Duration::from_secs(60)),
                        KeyCode::Char('-') => interval = (interval / 2).max(Duration::from_millis(100)),
                        _ => {}
                    }
                    model.interval = interval;
                }
                continue;
            }
            model.update(read(&path)?);
            next = Instant::now() + interval;
        }
    })();
    ratatui::restore();
    result
}
