//! What `doorbell top` shows, apart from the terminal it shows it on: [`Model`] turns the
//! daemon's successive status answers into rates and busy shares, and [`draw`] lays one frame
//! out with ratatui. Both are pure (no clock, no terminal), so tests render frames into a
//! buffer and read them back.
//!
//! Rates come from two readings on the device clock: an engine's busy share is the growth of
//! its busy time over the growth of device time, a queue's submissions per second the growth
//! of its last-queued value over the same span. The first reading has none ("-").

use std::collections::VecDeque;

use clap::ValueEnum;
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Sparkline, Table};
use wire::DaemonStatus;
use wire::status::{EngineStatus, QueueLine};

/// Busy-share samples kept per engine (the sparkline's length at most).
const HISTORY: usize = 240;
/// Recent events shown.
const EVENTS_SHOWN: usize = 6;

/// How the queue table is ordered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SortKey {
    /// Submissions per second, highest first.
    Rate,
    /// Completed progress values, highest first.
    Completed,
    /// Process, then queue (the daemon's order).
    Process,
    /// Priority, highest first.
    Priority,
    /// Faulted and hung queues first.
    Faults,
}

impl SortKey {
    /// The next key (the `s` key cycles through them).
    pub fn next(self) -> SortKey {
        let all = SortKey::value_variants();
        let i = all.iter().position(|&k| k == self).unwrap_or(0);
        all[(i + 1) % all.len()]
    }

    fn name(self) -> &'static str {
        match self {
            SortKey::Rate => "rate",
            SortKey::Completed => "completed",
            SortKey::Process => "process",
            SortKey::Priority => "priority",
            SortKey::Faults => "faults",
        }
    }
}

/// One queue's row: the daemon's line for it, its process, and its rate.
#[derive(Clone, Debug, PartialEq)]
pub struct QueueRow {
    /// The kernel's process id.
    pub pid: u32,
    /// The OS process id.
    pub os_pid: u32,
    /// The process's name.
    pub name: String,
    /// The queue as the daemon reported it.
    pub q: QueueLine,
    /// Submissions per second since the last reading (`None` on the first).
    pub rate: Option<f64>,
}

impl QueueRow {
    fn troubled(&self) -> bool {
        self.q.fault.is_some() || self.q.state == "Hung"
    }
}

/// The view's state: the latest reading, the one before, the busy history, the sort and the
/// process filter.
pub struct Model {
    status: DaemonStatus,
    prev: Option<DaemonStatus>,
    /// Busy share per engine, percent, oldest first.
    busy: Vec<VecDeque<u64>>,
    /// How the queue table is ordered.
    pub sort: SortKey,
    /// Only this process's queues (the kernel's process id), or all.
    pub filter: Option<u32>,
    /// The refresh interval, shown in the header.
    pub interval: std::time::Duration,
}

impl Model {
    /// A model with no reading yet.
    pub fn new(sort: SortKey, filter: Option<u32>, interval: std::time::Duration) -> Model {
        Model { status: DaemonStatus::default(), prev: None, busy: Vec::new(), sort, filter, interval }
    }

    /// Takes a new reading.
    pub fn update(&mut self, status: DaemonStatus) {
        let old = std::mem::replace(&mut self.status, status);
        let had_reading = !old.adapters.is_empty();
        self.prev = had_reading.then_some(old);
        let engines = self.engines().to_vec();
        self.busy.resize_with(engines.len(), VecDeque::new);
        for (i, e) in engines.iter().enumerate() {
            if let Some(share) = self.busy_share(e) {
                let h = &mut self.busy[i];
                if h.len() == HISTORY {
                    h.pop_front();
                }
                h.push_back((share * 100.0).round() as u64);
            }
        }
    }

    fn engines(&self) -> &[EngineStatus] {
        self.status.adapters.first().map_or(&[], |a| &a.engines)
    }

    /// Device time between the last two readings (s), if there are two.
    fn span_s(&self) -> Option<f64> {
        let now = self.status.adapters.first()?.device_now_ns;
        let then = self.prev.as_ref()?.adapters.first()?.device_now_ns;
        (now > then).then(|| (now - then) as f64 / 1e9)
    }

    /// An engine's busy share (0 to 1) between the last two readings.
    pub fn busy_share(&self, e: &EngineStatus) -> Option<f64> {
        let span = self.span_s()?;
        let before = self.prev.as_ref()?.adapters.first()?.engines.iter().find(|p| p.id == e.id)?;
        Some((e.busy_ns.saturating_sub(before.busy_ns) as f64 / 1e9 / span).clamp(0.0, 1.0))
    }

    /// The next process filter (the `p` key): all, then each process in turn.
    pub fn next_filter(&mut self) {
        let pids: Vec<u32> = self.status.processes.iter().map(|p| p.pid).collect();
        self.filter = match self.filter {
            None => pids.first().copied(),
            Some(cur) => pids.iter().position(|&p| p == cur).and_then(|i| pids.get(i + 1).copied()),
        };
    }

    /// The queue rows, filtered and sorted.
    pub fn rows(&self) -> Vec<QueueRow> {
        let span = self.span_s();
        let before = |pid: u32, handle: &str| {
            self.prev
                .as_ref()?
                .processes
                .iter()
                .find(|p| p.pid == pid)?
                .queues
                .iter()
                .find(|q| q.handle == handle)
                .map(|q| q.submitted)
        };
        let mut rows: Vec<QueueRow> = self
            .status
            .processes
            .iter()
            .filter(|p| self.filter.is_none_or(|f| f == p.pid))
            .flat_map(|p| {
                p.queues.iter().map(move |q| QueueRow {
                    pid: p.pid,
                    os_pid: p.os_pid,
                    name: p.name.clone(),
                    q: q.clone(),
                    rate: span.zip(before(p.pid, &q.handle)).map(|(s, b)| q.submitted.saturating_sub(b) as f64 / s),
                })
            })
            .collect();
        let prio = |p: &str| match p {
            "High" => 0,
            "Normal" => 1,
            _ => 2,
        };
        match self.sort {
            SortKey::Rate => rows.sort_by(|a, b| b.rate.unwrap_or(0.0).total_cmp(&a.rate.unwrap_or(0.0))),
            SortKey::Completed => rows.sort_by_key(|r| std::cmp::Reverse(r.q.completed)),
            SortKey::Process => {}
            SortKey::Priority => rows.sort_by_key(|r| prio(&r.q.priority)),
            SortKey::Faults => rows.sort_by_key(|r| !r.troubled()),
        }
        rows
    }

    /// The rows a frame needs to show everything: for `--once`.
    pub fn height(&self) -> u16 {
        let events = self.status.adapters.first().map_or(0, |a| a.events.len().min(EVENTS_SHOWN));
        let queues = self.rows().len().max(1);
        (2 + (self.engines().len() + 2) + (queues + 3) + (events.max(1) + 2) + 1) as u16
    }
}

fn rate_text(r: Option<f64>) -> String {
    match r {
        None => "-".into(),
        Some(r) if r >= 10_000.0 => format!("{:.0}k", r / 1000.0),
        Some(r) => format!("{r:.0}"),
    }
}

fn duration_text(s: u64) -> String {
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min {} s", s / 60, s % 60),
        _ => format!("{} h {} min", s / 3600, s % 3600 / 60),
    }
}

/// Draws one frame of the whole view into `area`.
pub fn draw(f: &mut Frame, m: &Model) {
    let area = f.area();
    let n_engines = m.engines().len() as u16;
    let events = m.status.adapters.first().map_or(0, |a| a.events.len().min(EVENTS_SHOWN)) as u16;
    let [header, engines, queues, recent, footer] = Layout::vertical([
        Constraint::Length(2),
        Constraint::Length(n_engines + 2),
        Constraint::Min(4),
        Constraint::Length(events.max(1) + 2),
        Constraint::Length(1),
    ])
    .areas(area);
    draw_header(f, m, header);
    draw_engines(f, m, engines);
    draw_queues(f, m, queues);
    draw_events(f, m, recent);
    let keys = Line::from(vec![
        Span::styled(" q", Style::new().add_modifier(Modifier::BOLD)),
        Span::raw(" quit  "),
        Span::styled("s", Style::new().add_modifier(Modifier::BOLD)),
        Span::raw(format!(" sort ({})  ", m.sort.name())),
        Span::styled("p", Style::new().add_modifier(Modifier::BOLD)),
        Span::raw(" next process  "),
        Span::styled("a", Style::new().add_modifier(Modifier::BOLD)),
        Span::raw(" all processes  "),
        Span::styled("+/-", Style::new().add_modifier(Modifier::BOLD)),
        Span::raw(format!(" refresh ({:.1} s)", m.interval.as_secs_f64())),
    ]);
    f.render_widget(Paragraph::new(keys).style(Style::new().fg(Color::DarkGray)), footer);
}

/// What the process filter shows, for the queue table's title.
fn filter_text(m: &Model) -> String {
    match m.filter {
        None => "all processes".to_owned(),
        Some(pid) => match m.status.processes.iter().find(|p| p.pid == pid) {
            Some(p) => format!("p{pid} ({})", short_name(&p.name)),
            None => format!("p{pid} (gone)"),
        },
    }
}

fn draw_header(f: &mut Frame, m: &Model, area: Rect) {
    let s = &m.status;
    let mut lines = vec![Line::from(vec![
        Span::styled("doorbell top", Style::new().add_modifier(Modifier::BOLD)),
        Span::raw(format!(
            "  daemon pid {} on {}, up {}, protocol {}, {}",
            s.daemon_pid,
            s.socket,
            duration_text(s.uptime_s),
            s.protocol_version,
            wire::counted(s.processes.len() as u64, "client process", "client processes"),
        )),
    ])];
    if let Some(a) = s.adapters.first() {
        lines.push(Line::raw(format!(
            "adapter {}: doorbells {} ({} in use{}), {}, {}, {}, {}, {}, {}",
            a.index,
            a.doorbell_model,
            a.doorbells,
            a.doorbell_pool.map_or(String::new(), |p| format!(", pool of {p}")),
            wire::counted(a.connects, "connect", "connects"),
            wire::counted(a.victimizations, "victimization", "victimizations"),
            wire::counted(a.faults, "fault", "faults"),
            wire::counted(a.recoveries, "recovery", "recoveries"),
            wire::counted(a.tdr_timeouts, "TDR timeout", "TDR timeouts"),
            wire::counted(a.hang_timeouts, "hang timeout", "hang timeouts"),
        )));
    }
    f.render_widget(Paragraph::new(lines), area);
}

fn draw_engines(f: &mut Frame, m: &Model, area: Rect) {
    let block = Block::new().borders(Borders::ALL).title(" engines: power, slots held, busy share over time ");
    let inner = block.inner(area);
    f.render_widget(block, area);
    for (i, e) in m.engines().iter().enumerate() {
        let row = Rect { y: inner.y + i as u16, height: 1, ..inner };
        if row.y >= inner.bottom() {
            break;
        }
        let [text, spark] = Layout::horizontal([Constraint::Length(44), Constraint::Min(1)]).areas(row);
        let share = m.busy_share(e);
        let power = if e.power == "F0" { Style::new().fg(Color::Green) } else { Style::new().fg(Color::DarkGray) };
        let line = Line::from(vec![
            Span::raw(format!("{:>2} {:<8}", e.id, e.kind)),
            Span::styled(format!("{:<3}", e.power), power),
            Span::raw(format!(" slots {:>3}/{:<3}", e.slots_used, e.slots)),
            Span::raw(format!(" busy {:>4}  ", share.map_or("-".into(), |s| format!("{:.0}%", s * 100.0)))),
        ]);
        f.render_widget(Paragraph::new(line), text);
        let history = m.busy.get(i).map(|h| {
            let take = (spark.width as usize).min(h.len());
            h.iter().skip(h.len() - take).copied().collect::<Vec<u64>>()
        });
        let data = history.unwrap_or_default();
        f.render_widget(Sparkline::default().data(&data).max(100).style(Style::new().fg(Color::Cyan)), spark);
    }
}

fn draw_queues(f: &mut Frame, m: &Model, area: Rect) {
    let rows = m.rows();
    let header = Row::new(
        [
            "PROCESS",
            "OS PID",
            "QUEUE",
            "ENG",
            "MODE",
            "STATE",
            "PRIORITY",
            "DOORBELL",
            "SUBMIT/S",
            "COMPLETED",
            "FAULT",
        ]
        .map(|h| Cell::from(h).style(Style::new().add_modifier(Modifier::BOLD))),
    );
    let body = rows.iter().map(|r| {
        let state = if r.troubled() { Style::new().fg(Color::Red) } else { Style::new() };
        Row::new(vec![
            Cell::from(format!("p{} {}", r.pid, short_name(&r.name))),
            Cell::from(r.os_pid.to_string()),
            Cell::from(r.q.handle.clone()),
            Cell::from(r.q.engine.to_string()),
            Cell::from(r.q.mode.clone()),
            Cell::from(r.q.state.clone()).style(state),
            Cell::from(r.q.priority.clone()),
            Cell::from(r.q.doorbell.map_or("-".into(), |d| d.to_string())),
            Cell::from(rate_text(r.rate)),
            Cell::from(r.q.completed.to_string()),
            Cell::from(r.q.fault.clone().unwrap_or_else(|| "-".into())).style(state),
        ])
    });
    let widths = [
        Constraint::Length(18),
        Constraint::Length(8),
        Constraint::Length(20),
        Constraint::Length(3),
        Constraint::Length(6),
        Constraint::Length(9),
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Length(9),
        Constraint::Length(10),
        Constraint::Min(5),
    ];
    let title = format!(" queues ({}) of {}, sorted by {} ", rows.len(), filter_text(m), m.sort.name());
    let table = Table::new(body, widths).header(header).block(Block::new().borders(Borders::ALL).title(title));
    f.render_widget(table, area);
}

/// The last path component of a process name (clients name themselves by their program).
fn short_name(name: &str) -> String {
    let base = name.rsplit('/').next().unwrap_or(name);
    base.chars().take(12).collect()
}

fn draw_events(f: &mut Frame, m: &Model, area: Rect) {
    let a = m.status.adapters.first();
    let events = a.map_or(&[][..], |a| &a.events[..]);
    let now = a.map_or(0, |a| a.device_now_ns);
    let lines: Vec<Line> = if events.is_empty() {
        vec![Line::styled("none", Style::new().fg(Color::DarkGray))]
    } else {
        events[events.len().saturating_sub(EVENTS_SHOWN)..]
            .iter()
            .map(|e| {
                let ago = now.saturating_sub(e.time_ns) / 1_000_000_000;
                Line::from(vec![
                    Span::raw(format!("{:>9} ago  ", duration_text(ago))),
                    Span::styled(format!("{:<12}", e.kind), Style::new().fg(Color::Red)),
                    Span::raw(e.text.clone()),
                ])
            })
            .collect()
    };
    let block = Block::new().borders(Borders::ALL).title(" recent faults, timeouts, recoveries, victimizations ");
    f.render_widget(Paragraph::new(lines).block(block), area);
}

/// Renders one frame as plain text lines (trailing blanks trimmed): `--once` and the tests.
pub fn render_text(m: &Model, width: u16, height: u16) -> Result<Vec<String>, String> {
    let backend = ratatui::backend::TestBackend::new(width, height);
    let mut terminal = ratatui::Terminal::new(backend).map_err(|e| e.to_string())?;
    terminal.draw(|f| draw(f, m)).map_err(|e| e.to_string())?;
    let buf = terminal.backend().buffer();
    Ok((0..height)
        .map(|y| {
            let line: String = (0..width).map(|x| buf[(x, y)].symbol()).collect();
            line.trim_end().to_owned()
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::status::{AdapterStatus, EventLine, ProcessStatus};

    fn reading(now_ns: u64, busy: [u64; 2], submitted: [u64; 2], fault: bool) -> DaemonStatus {
        let engine = |id: u32, kind: &str, busy_ns| EngineStatus {
            id,
            kind: kind.into(),
            power: "F0".into(),
            slots: 8,
            slots_used: 1,
            busy_ns,
        };
        let queue = |h: &str, engine, submitted, priority: &str| QueueLine {
            handle: h.into(),
            engine,
            mode: "user".into(),
            state: "Mapped".into(),
            priority: priority.into(),
            doorbell: Some(3),
            completed: submitted,
            submitted,
            fault: None,
        };
        let mut loaded = queue("queue#1:1", 0, submitted[1], "Normal");
        if fault {
            loaded.state = "Hung".into();
            loaded.fault = Some("page fault at 0x10".into());
        }
        DaemonStatus {
            daemon_pid: 42,
            socket: "/tmp/d.sock".into(),
            uptime_s: 75,
            protocol_version: wire::PROTOCOL_VERSION,
            adapters: vec![AdapterStatus {
                engines: vec![engine(0, "compute", busy[0]), engine(1, "copy", busy[1])],
                device_now_ns: now_ns,
                events: fault
                    .then(|| EventLine {
                        time_ns: now_ns.saturating_sub(2_000_000_000),
                        kind: "fault".into(),
                        text: "queue fault".into(),
                    })
                    .into_iter()
                    .collect(),
                ..AdapterStatus::default()
            }],
            processes: vec![
                ProcessStatus {
                    pid: 1,
                    os_pid: 1001,
                    name: "/usr/bin/idle".into(),
                    queues: vec![queue("queue#0:1", 1, submitted[0], "High")],
                    ..ProcessStatus::default()
                },
                ProcessStatus {
                    pid: 2,
                    os_pid: 1002,
                    name: "load".into(),
                    queues: vec![loaded],
                    ..ProcessStatus::default()
                },
            ],
        }
    }

    #[test]
    fn rates_and_busy_shares_come_from_two_readings() {
        let mut m = Model::new(SortKey::Rate, None, std::time::Duration::from_secs(1));
        m.update(reading(1_000_000_000, [0, 0], [10, 100], false));
        assert!(m.rows().iter().all(|r| r.rate.is_none()), "one reading: no rate");
        assert_eq!(m.busy_share(&m.engines()[0].clone()), None);
        // Half a second later: compute busy 250 ms of it, the loaded queue 500 more.
        m.update(reading(1_500_000_000, [250_000_000, 0], [10, 600], false));
        let rows = m.rows();
        assert_eq!(rows[0].q.handle, "queue#1:1", "sorted by rate");
        assert_eq!(rows[0].rate, Some(1000.0));
        assert_eq!(rows[1].rate, Some(0.0));
        let e = m.engines()[0].clone();
        assert_eq!(m.busy_share(&e), Some(0.5));
        assert_eq!(m.busy[0].back(), Some(&50));
        assert_eq!(m.busy[1].back(), Some(&0));
    }

    #[test]
    fn sorting_and_the_process_filter() {
        let mut m = Model::new(SortKey::Process, None, std::time::Duration::from_secs(1));
        m.update(reading(1_000_000_000, [0, 0], [10, 5], true));
        assert_eq!(m.rows().iter().map(|r| r.pid).collect::<Vec<_>>(), [1, 2]);
        m.sort = SortKey::Faults;
        assert_eq!(m.rows()[0].pid, 2, "the faulted queue first");
        m.sort = SortKey::Completed;
        assert_eq!(m.rows()[0].q.completed, 10);
        m.sort = SortKey::Priority;
        assert_eq!(m.rows()[0].q.priority, "High");
        m.next_filter();
        assert_eq!(m.filter, Some(1));
        assert_eq!(m.rows().len(), 1);
        m.next_filter();
        assert_eq!((m.filter, m.rows()[0].pid), (Some(2), 2));
        m.next_filter();
        assert_eq!((m.filter, m.rows().len()), (None, 2), "past the last process: all again");
        assert_eq!(SortKey::Faults.next(), SortKey::Rate);
    }

    #[test]
    fn a_frame_shows_engines_queues_and_events() {
        let mut m = Model::new(SortKey::Rate, None, std::time::Duration::from_secs(1));
        m.update(reading(1_000_000_000, [0, 0], [10, 100], true));
        m.update(reading(2_000_000_000, [900_000_000, 0], [10, 300], true));
        let lines = render_text(&m, 140, m.height()).unwrap();
        let text = lines.join("\n");
        let find =
            |needle: &str| lines.iter().find(|l| l.contains(needle)).unwrap_or_else(|| panic!("{needle}:\n{text}"));
        assert!(find("daemon pid 42").contains("up 1 min 15 s"), "{text}");
        assert!(find(" compute ").contains("busy  90%"), "{text}");
        assert!(find(" copy ").contains("busy   0%"), "{text}");
        let q = find("queue#1:1");
        assert!(q.contains("p2 load") && q.contains("1002") && q.contains("Hung") && q.contains("200"), "{q}");
        assert!(find("page fault at 0x10").contains("Hung"));
        assert!(find("queue fault").contains("2 s ago"), "{text}");
        assert!(find("q quit").contains("sort (rate)"));
        assert!(find("queues (2) of all processes, sorted by rate").starts_with('┌'));
        m.next_filter();
        let lines = render_text(&m, 140, m.height()).unwrap();
        assert!(lines.iter().any(|l| l.contains("queues (1) of p1 (idle), sorted by rate")), "{lines:#?}");
        assert_eq!(lines.len(), m.height() as usize);
        assert!(!lines.last().unwrap().is_empty(), "everything fits: the footer is on the last line");
    }
}
