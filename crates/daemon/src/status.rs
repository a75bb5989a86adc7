//! `doorbell status`: what the daemon holds, collected from the kernel's counters and each
//! client's ledger (queue states come from the kernel's status query, as a client sees them).

use std::sync::Arc;

use abi::QueueState;
use abi::port::KernelPort;
use wire::status::{AdapterStatus, EngineStatus, EventLine, ProcessStatus, QueueLine, RECENT_EVENTS};
use wire::{DaemonStatus, PROTOCOL_VERSION};

use crate::Shared;

/// The recoveries and the timeouts behind them, in the kernel's trace window.
#[derive(Debug, Default, PartialEq, Eq)]
struct Trouble {
    recoveries: u64,
    tdr_timeouts: u64,
    hang_timeouts: u64,
}

impl Trouble {
    fn count(trace: &[kernel::trace::TraceEntry]) -> Trouble {
        use kernel::trace::Event;
        let mut t = Trouble::default();
        for e in trace {
            match e.event {
                Event::Recovered { .. } => t.recoveries += 1,
                Event::TdrTimeout { .. } => t.tdr_timeouts += 1,
                Event::HangTimeout { .. } => t.hang_timeouts += 1,
                _ => {}
            }
        }
        t
    }
}

pub(crate) fn collect(shared: &Arc<Shared>) -> DaemonStatus {
    let sys = &shared.sys;
    let census = sys.census();
    let stats = sys.stats();
    let (trace, trace_dropped) = sys.trace();
    let trouble = Trouble::count(&trace);
    let mut events: Vec<EventLine> = trace
        .iter()
        .rev()
        .filter_map(|e| {
            e.event.notable().filter(|n| n.is_trouble()).map(|n| EventLine {
                time_ns: e.time.as_nanos(),
                kind: n.name().into(),
                text: e.event.to_string(),
            })
        })
        .take(RECENT_EVENTS)
        .collect();
    events.reverse();
    let now = sys.now();
    let clients: Vec<_> = shared.clients.lock().values().cloned().collect();
    let mut processes = Vec::new();
    let mut mapped = std::collections::HashMap::<u32, u32>::new();
    for c in &clients {
        let ledger = c.ledger.lock();
        let mut queues = Vec::new();
        for (q, meta) in &ledger.queues {
            let st = c.port.query_queue(*q).ok();
            let state = st.as_ref().map(|s| s.state);
            if state == Some(QueueState::Mapped) {
                *mapped.entry(meta.engine.0).or_default() += 1;
            }
            queues.push(QueueLine {
                handle: q.to_string(),
                engine: meta.engine.0,
                mode: if meta.user_mode { "user" } else { "kernel" }.into(),
                state: state.map_or("gone".into(), |s| format!("{s:?}")),
                priority: format!("{:?}", meta.priority),
                doorbell: meta.doorbell,
                completed: st.as_ref().map_or(0, |s| s.completed),
                submitted: st.as_ref().map_or(0, |s| s.last_queued),
                fault: st.and_then(|s| s.fault).map(|f| f.to_string()),
            });
        }
        queues.sort_by(|a, b| a.handle.cmp(&b.handle));
        processes.push(ProcessStatus {
            pid: c.pid.0,
            os_pid: c.os_pid,
            name: c.name.clone(),
            allocations: ledger.allocations.len() as u32,
            bytes: ledger.bytes(),
            queues,
        });
    }
    processes.sort_by_key(|p| p.pid);
    let cfg = &shared.config.system;
    let engines = cfg
        .gpu
        .engines
        .iter()
        .enumerate()
        .map(|(i, kind)| EngineStatus {
            id: i as u32,
            kind: kind.to_string(),
            power: format!("{:?}", sys.power(abi::EngineId(i as u32))),
            slots: cfg.gpu.hw_slots,
            slots_used: mapped.get(&(i as u32)).copied().unwrap_or(0).min(cfg.gpu.hw_slots),
            busy_ns: sys.with_gpu(|g| g.engine_busy_ns(abi::EngineId(i as u32), now)).unwrap_or(0),
        })
        .collect();
    DaemonStatus {
        daemon_pid: std::process::id(),
        socket: shared.socket.display().to_string(),
        uptime_s: shared.started.elapsed().as_secs(),
        protocol_version: PROTOCOL_VERSION,
        adapters: vec![AdapterStatus {
            index: 0,
            doorbell_model: cfg.gpu.doorbell_model.to_string(),
            doorbell_pool: cfg.doorbell_pool,
            doorbell_pages_used: census.doorbell_pages as u64,
            exported_doorbell_pages: shared.exports.lock().len() as u64,
            doorbells: census.doorbells as u64,
            connects: stats.connects,
            victimizations: stats.victimizations,
            faults: stats.faults,
            interrupts: stats.interrupts,
            recoveries: trouble.recoveries,
            tdr_timeouts: trouble.tdr_timeouts,
            hang_timeouts: trouble.hang_timeouts,
            trace_dropped,
            engines,
            firmware_thread_calls: shared.sys.firmware_thread_calls(),
            device_now_ns: now.as_nanos(),
            events,
        }],
        processes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use abi::{EngineId, HwQueueHandle, ProcessId, Time};
    use kernel::trace::{Event, TraceEntry};

    #[test]
    fn recoveries_tdr_and_hang_timeouts_are_counted_apart() {
        let queue = HwQueueHandle::new(ProcessId(1), 0, 1);
        let engine = EngineId(0);
        let at = |event| TraceEntry { time: Time(0), event };
        let trace = vec![
            at(Event::HangTimeout { queue, engine, ran_ms: 10 }),
            at(Event::Recovered { engine: Some(engine), count: 1 }),
            at(Event::TdrTimeout { queue, engine }),
            at(Event::HangTimeout { queue, engine, ran_ms: 12 }),
            at(Event::Recovered { engine: None, count: 2 }),
            at(Event::Recovered { engine: Some(engine), count: 3 }),
        ];
        assert_eq!(Trouble::count(&trace), Trouble { recoveries: 3, tdr_timeouts: 1, hang_timeouts: 2 });
        assert_eq!(Trouble::count(&[]), Trouble::default());
    }
}
