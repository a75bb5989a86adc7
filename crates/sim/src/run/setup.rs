//! The setup step: the system, the client processes and their queues built from the plan,
//! group by group; fence dependencies, ring capacities and the queues the trace shows; then
//! the clients' first events.
//!
//! Invariants: queues are numbered in group order (group `g`'s first is `group_first[g]`);
//! each queue's random stream is seeded by (seed, its number), so what one queue draws never
//! depends on another's.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

use abi::port::KernelPort;
use kernel::System;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use umd::{Device, NativeFence, QueueOptions};

use super::events::{Ev, Events};
use super::outcome::{QueueResult, RunError};
use super::state::{Acc, Bells, Buckets, Client, Clients, Clock, Runner, SimQ, Stack};
use super::submit::exp_ns;
use crate::observe::Observer;
use crate::scenario::{Action, GroupPlan, Load, Plan};

/// The clients as built, before the loop's clock starts.
struct Built {
    clients: Clients,
    group_first: Vec<usize>,
    fw_map: Vec<Option<(u64, usize)>>,
}

impl<'p, 'o> Runner<'p, 'o> {
    /// Builds the system, the client processes and their queues, their fences, and the
    /// trace's sample of queues. Nothing is scheduled yet ([`Runner::start`]).
    pub(super) fn setup(plan: &'p Plan, seed: u64, observer: Option<&'o mut dyn Observer>) -> Result<Self, RunError> {
        let sys = System::sim(plan.system.clone())?;
        let observed = observer.is_some();
        sys.with_gpu(|g| {
            g.record_completions(true);
            g.record_fence_signals(observed);
        });
        let engines: Vec<String> = plan.system.gpu.engines.iter().map(|e| format!("{e:?}").to_lowercase()).collect();
        let Built { mut clients, group_first, fw_map } = build_queues(&sys, plan, seed)?;
        connect_dependencies(plan, &mut clients, &group_first)?;
        own_signals(plan, &mut clients, &group_first)?;
        set_capacities(plan, &mut clients.qs);
        let traced_queues = trace_sample(plan, &group_first, &mut clients.qs);
        let t0 = sys.now().0;
        let mut fw_of = vec![0u64; clients.qs.len()];
        for &(fw, i) in fw_map.iter().flatten() {
            fw_of[i] = fw;
        }
        let stack = Stack {
            sys,
            engines,
            group_first,
            fw_map,
            fw_of,
            traced_queues,
            t0,
            window_end: plan.duration.map(|d| t0 + d),
        };
        let clock = Clock {
            events: Events::default(),
            stopped: false,
            stop_time: u64::MAX,
            world_ran: false,
            progress_in: 0,
            last_progress: 0.0,
        };
        // Time series buckets: fixed width when the window is known, otherwise doubling.
        let bucket = match plan.duration {
            Some(d) => (d / plan.samples as u64).max(1),
            None => 1_000_000,
        };
        let acc = Acc {
            latencies: vec![Vec::new(); plan.groups.len()],
            spans: Vec::new(),
            latency_rows: crate::rows::Rows::new(plan.latency_rows),
            latency_split: vec![[0u64; 3]; plan.groups.len()],
            marks: Vec::new(),
            series: Vec::new(),
            counts: Buckets::new(bucket),
            bucket,
            next_bucket: t0,
            packets: 0,
            completions_total: 0,
            last_completion: 0,
            comps: Vec::new(),
            records: Vec::new(),
            wait_ends: Vec::new(),
            signals: Vec::new(),
        };
        let bells = Bells { latency: plan.doorbell_latency, ..Bells::default() };
        Ok(Runner { plan, seed, stack, clients, bells, clock, acc, observer })
    }

    /// Schedules the clients' first events at the clock's start: every closed loop's first
    /// submissions, every open loop's first arrival, every trace row, every timed event.
    pub(super) fn start(&mut self) {
        let (plan, t0, events) = (self.plan, self.stack.t0, &mut self.clock.events);
        for (i, q) in self.clients.qs.iter_mut().enumerate() {
            let g = &plan.groups[q.group];
            match &g.load {
                Load::Closed { n, .. } => {
                    for _ in 0..*n {
                        events.push(t0, Ev::Submit(i, None));
                    }
                }
                Load::Periodic(p) => {
                    // Phases spread over one period, so the queues do not all ring at once.
                    let phase = p * q.index as u64 / g.count as u64;
                    events.push(t0 + phase, Ev::Arrival(i));
                }
                Load::Poisson(rate) => {
                    let dt = exp_ns(&mut q.rng, 1e9 / rate);
                    events.push(t0 + dt, Ev::Arrival(i));
                }
                Load::Bursts { period, .. } => {
                    let phase = period * q.index as u64 / g.count as u64;
                    events.push(t0 + phase, Ev::Arrival(i));
                }
                Load::Trace(rows) => {
                    for &(at, qi, size) in rows {
                        if qi == q.index {
                            events.push(t0 + at, Ev::Submit(i, Some(size)));
                        }
                    }
                }
            }
        }
        for (k, (at, _)) in plan.events.iter().enumerate() {
            events.push(t0 + at, Ev::Timed(k));
        }
    }
}

/// Client processes and their queues, group by group: as many queues per process as the
/// group allows.
fn build_queues(sys: &System, plan: &Plan, seed: u64) -> Result<Built, RunError> {
    let mut procs: Vec<Client> = Vec::new();
    let mut qs: Vec<SimQ> = Vec::new();
    let mut group_first = Vec::new();
    let mut fw_map: Vec<Option<(u64, usize)>> = Vec::new();
    for (gi, g) in plan.groups.iter().enumerate() {
        group_first.push(qs.len());
        let mut left = g.count;
        let mut index = 0u32;
        while left > 0 {
            let port = sys.open_process()?;
            let kport: Arc<dyn KernelPort> = port.clone();
            let dev = Device::open(kport)?;
            let engine = dev.info().engines.get(g.engine).map(|e| (e.id, e.doorbell_count)).ok_or_else(|| {
                RunError::Check(format!("group {}: engine {} missing from the adapter", g.name, g.engine))
            })?;
            let n = g.queues_per_process(engine.1).min(left);
            let ctx = dev.create_context(engine.0)?;
            let scratch_bytes = 8 * n as u64 + g.fill_bytes + 2 * g.copy_bytes;
            let scratch = if g.write_data > 0 || g.fill_bytes > 0 || g.copy_bytes > 0 {
                Some(dev.allocate(scratch_bytes.next_multiple_of(4096))?)
            } else {
                None
            };
            let client = procs.len();
            procs.push(Client { port, dev, ctx, scratch, alive: true });
            for _ in 0..n {
                let q = new_queue(sys, g, &procs[client], &mut fw_map, qs.len())?;
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                rng.set_stream(qs.len() as u64);
                qs.push(SimQ {
                    group: gi,
                    index,
                    client,
                    q: Some(q),
                    outstanding: VecDeque::new(),
                    backlog: VecDeque::new(),
                    cap: 1,
                    rng,
                    signal: None,
                    upstream: None,
                    waits: VecDeque::new(),
                    hang_next: false,
                    busy_until: 0,
                    res: QueueResult { group: gi, index, ..Default::default() },
                    traced: false,
                });
                index += 1;
            }
            left -= n;
        }
    }
    let clients = Clients { procs, qs, cb: Default::default(), tally: Default::default(), in_flight: 0 };
    Ok(Built { clients, group_first, fw_map })
}

/// Queue `id` of group `g` in `client`'s context, entered in `fw_map` by its device queue id.
fn new_queue(
    sys: &System,
    g: &GroupPlan,
    client: &Client,
    fw_map: &mut Vec<Option<(u64, usize)>>,
    id: usize,
) -> Result<umd::Queue, RunError> {
    let opts = QueueOptions {
        kind: if g.kernel_mode { umd::SubmissionKind::KernelMode } else { umd::SubmissionKind::UserMode },
        ring_bytes: g.ring_bytes,
        priority: g.priority,
        ..QueueOptions::default()
    };
    let mut q = client.ctx.create_queue(opts)?;
    q.set_spin(0);
    let pid = client.port.process();
    let fw =
        sys.device_queue_id(pid, q.handle())?.ok_or_else(|| RunError::Check("the KMD names no device queue".into()))?;
    let slot = (fw & 0xffff_ffff) as usize;
    if fw_map.len() <= slot {
        fw_map.resize(slot + 1, None);
    }
    fw_map[slot] = Some((fw, id));
    Ok(q)
}

/// Fence dependencies: the upstream queue signals a shareable fence; the downstream one opens
/// it in its own device.
fn connect_dependencies(plan: &Plan, clients: &mut Clients, group_first: &[usize]) -> Result<(), RunError> {
    let Clients { procs, qs, .. } = clients;
    for (gi, g) in plan.groups.iter().enumerate() {
        let Some(up) = g.after else { continue };
        for k in 0..g.count as usize {
            let me = group_first[gi] + k;
            let them = group_first[up] + k % plan.groups[up].count as usize;
            if qs[them].signal.is_none() {
                let desc = abi::port::NativeFenceDesc {
                    shareable: true,
                    ..abi::port::NativeFenceDesc::new(0, abi::port::NativeFenceType::Default)
                };
                let f = procs[qs[them].client].dev.create_fence_with(&desc)?;
                qs[them].signal = Some(f);
            }
            let global = qs[them]
                .signal
                .as_ref()
                .and_then(NativeFence::global)
                .ok_or_else(|| RunError::Check("a shareable fence has no global handle".into()))?;
            let opened = procs[qs[me].client].dev.open_fence(global)?;
            qs[me].upstream = Some((them, opened));
        }
    }
    Ok(())
}

/// Groups that signal their own fences (and perhaps wait for them on the CPU).
fn own_signals(plan: &Plan, clients: &mut Clients, group_first: &[usize]) -> Result<(), RunError> {
    let Clients { procs, qs, .. } = clients;
    for (gi, g) in plan.groups.iter().enumerate() {
        if !g.signal {
            continue;
        }
        for k in 0..g.count as usize {
            let me = group_first[gi] + k;
            if qs[me].signal.is_none() {
                let f = procs[qs[me].client].dev.create_fence(0, abi::port::NativeFenceType::Default)?;
                qs[me].signal = Some(f);
            }
        }
    }
    Ok(())
}

/// Ring capacity: outstanding command buffers a ring holds with room to spare (packets never
/// straddle the end, so up to one command buffer's worth is padding).
fn set_capacities(plan: &Plan, qs: &mut [SimQ]) {
    for q in qs.iter_mut() {
        let g = &plan.groups[q.group];
        let dwords = cb_dwords(g, q.signal.is_some(), q.upstream.is_some());
        q.cap = ((g.ring_bytes / 4) as usize / dwords).saturating_sub(2).max(1);
        if let Load::Closed { n, .. } = g.load {
            q.cap = q.cap.min(n as usize);
        }
    }
}

/// Dwords of one command buffer of group `g` (the progress fence included).
fn cb_dwords(g: &GroupPlan, signals: bool, waits: bool) -> usize {
    let mut n = 3; // PROGRESS_FENCE
    n += 6 * g.write_data as usize;
    n += if g.fill_bytes > 0 { 6 } else { 0 };
    n += if g.copy_bytes > 0 { 7 } else { 0 };
    n += if g.synthetic.is_some() { 3 } else { 0 };
    n += if signals { 5 } else { 0 };
    n += if waits { 5 } else { 0 };
    // A hang replaces nothing but adds a SYNTHETIC.
    n + 3
}

/// Trace sampling: every class's first queue and every queue a scenario event names (the
/// hung, killed and suspended ones), then queues spread evenly over all, up to
/// `trace_queues` in all. Marks them traced; returns them in order.
fn trace_sample(plan: &Plan, group_first: &[usize], qs: &mut [SimQ]) -> Vec<usize> {
    let mut traced = BTreeSet::new();
    traced.extend(group_first.iter().copied().filter(|&i| i < qs.len()));
    for (_, a) in &plan.events {
        if let Action::Kill { group, queue } | Action::Hang { group, queue } | Action::Suspend { group, queue, .. } = *a
        {
            traced.insert(group_first[group] + queue as usize);
        }
    }
    let stride = qs.len().div_ceil(plan.trace_queues.max(1)).max(1);
    for i in (0..qs.len()).step_by(stride) {
        if traced.len() >= plan.trace_queues.max(traced.len()) {
            break;
        }
        traced.insert(i);
    }
    let traced_queues: Vec<usize> = traced.into_iter().collect();
    for &i in &traced_queues {
        qs[i].traced = true;
    }
    traced_queues
}
