//! A parsed scenario checked into a [`Plan`], one section at a time: the window (duration,
//! submissions, drain, warm-up, samples), the device, its TDR, the cost model, the system
//! they make, the groups (each with its workload and commands), their dependencies, the
//! events, what the device must hold (client processes, kernel-mode slots) and the output
//! limits.
//!
//! Every check reports through [`Scenario::err`]: the file, the line of the key, the key
//! (dotted, with the group named where there is one), the value and why. The sections run in
//! a fixed order and each stops at its first error, so a scenario with several errors is
//! always refused for the same one.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;

use toml::Spanned;

use super::plan::{Action, Duration, GroupPlan, Load, Plan};
use super::{Dist, EngineName, Event, Group, Scenario, ScenarioError};

/// µs in ns.
fn ns(v: f64) -> u64 {
    (v * 1e3).round() as u64
}

/// ms in ns.
fn ms(v: f64) -> u64 {
    (v * 1e6).round() as u64
}

/// The submission window, checked (ns).
struct Window {
    duration: Option<u64>,
    drain: u64,
    warmup: u64,
}

/// The device's engines, slots, doorbells and preemption, checked.
struct DeviceChoices {
    engines: Vec<abi::EngineKind>,
    slots: u32,
    model: abi::doorbell::DoorbellModel,
    pool: Option<u32>,
    compute: gpu::ComputeGranularity,
    copy: gpu::CopyGranularity,
}

impl Scenario {
    /// Refuses a value: the key at `span`, its value, why.
    pub(super) fn err<T>(
        &self,
        span: Range<usize>,
        key: &str,
        value: impl ToString,
        why: impl ToString,
    ) -> Result<T, ScenarioError> {
        Err(self.source.at(span, key, &value.to_string(), why.to_string()))
    }

    /// A finite number at least 0.
    fn nonneg(&self, s: &Spanned<f64>, key: &str) -> Result<f64, ScenarioError> {
        let v = *s.get_ref();
        if !v.is_finite() || v < 0.0 {
            return self.err(s.span(), key, v, "must be a finite number at least 0");
        }
        Ok(v)
    }

    /// A finite number more than 0.
    fn positive(&self, s: &Spanned<f64>, key: &str) -> Result<f64, ScenarioError> {
        let v = self.nonneg(s, key)?;
        if v <= 0.0 {
            return self.err(s.span(), key, v, "must be more than 0");
        }
        Ok(v)
    }

    /// Checks every section, in order, into the plan the runner runs.
    pub(super) fn check(self) -> Result<Plan, ScenarioError> {
        let Window { duration, drain, warmup } = self.window()?;
        let device = self.device_choices()?;
        let tdr = self.tdr()?;
        let cost = self.costs()?;
        let system = self.system(device, tdr, cost)?;
        let (names, groups) = self.groups(&system.gpu.engines)?;
        self.cycles(&groups)?;
        let events = self.events(&names, &groups)?;
        let name = self.name.clone().unwrap_or_else(|| {
            self.source.path.file_stem().map_or("scenario".into(), |s| s.to_string_lossy().into_owned())
        });
        self.processes_fit(&system, &groups)?;
        self.kernel_slots_fit(&system, &groups)?;
        let (trace_queues, latency_rows) = self.output_limits()?;
        let doorbell_latency = self.nonneg(&self.cost.doorbell_latency_ns, "cost.doorbell_latency_ns")?.round() as u64;
        let kernel_call = self.nonneg(&self.cost.kernel_call_ns, "cost.kernel_call_ns")?.round() as u64;
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

    /// The top level's window: `duration_ms` or `submissions` (or both), `drain_ms`,
    /// `warmup_ms` (inside the window), `samples`.
    fn window(&self) -> Result<Window, ScenarioError> {
        let duration = match &self.duration_ms {
            Some(d) => Some(ms(self.positive(d, "duration_ms")?)),
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
        let drain = ms(self.nonneg(&self.drain_ms, "drain_ms")?);
        let warmup = ms(self.nonneg(&self.warmup_ms, "warmup_ms")?);
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
        Ok(Window { duration, drain, warmup })
    }

    /// `[device]`: engines, slots, the doorbell model and pool, preemption granularities.
    fn device_choices(&self) -> Result<DeviceChoices, ScenarioError> {
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
        let engines = d
            .engines
            .iter()
            .map(|e| match e {
                EngineName::Compute => abi::EngineKind::Compute,
                EngineName::Copy => abi::EngineKind::Copy,
            })
            .collect();
        Ok(DeviceChoices { engines, slots, model, pool, compute, copy })
    }

    /// `[device.tdr]`: each timeout more than 0 and at most the kernel's bound; a hang timer
    /// of 0 is off.
    fn tdr(&self) -> Result<kernel::TdrConfig, ScenarioError> {
        let t = &self.device.tdr;
        // A TDR timeout: more than 0, at most the kernel's bound.
        let max_ms = kernel::TdrConfig::MAX.as_millis() as f64;
        let tdr_ms = |s: &Spanned<f64>, key: &str| -> Result<std::time::Duration, ScenarioError> {
            let v = self.positive(s, key)?;
            if v > max_ms {
                return self.err(s.span(), key, v, format!("must be at most {max_ms} (one hour)"));
            }
            Ok(std::time::Duration::from_nanos(ms(v)))
        };
        let hang = |s: &Spanned<f64>, key: &str| -> Result<Option<std::time::Duration>, ScenarioError> {
            if self.nonneg(s, key)? == 0.0 { Ok(None) } else { tdr_ms(s, key).map(Some) }
        };
        Ok(kernel::TdrConfig {
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
        })
    }

    /// `[cost]`: the device-time model.
    fn costs(&self) -> Result<gpu::CostModel, ScenarioError> {
        let c = &self.cost;
        let nanos = |s: &Spanned<f64>, key: &str| -> Result<std::time::Duration, ScenarioError> {
            Ok(std::time::Duration::from_nanos(self.nonneg(s, key)?.round() as u64))
        };
        let bulk_chunk = self.positive(&c.bulk_chunk, "cost.bulk_chunk")?;
        Ok(gpu::CostModel {
            packet: nanos(&c.packet_ns, "cost.packet_ns")?,
            bulk_bytes_per_us: self.positive(&c.bulk_bytes_per_us, "cost.bulk_bytes_per_us")?.round().max(1.0) as u64,
            wave_instruction: nanos(&c.wave_instruction_ns, "cost.wave_instruction_ns")?,
            bulk_chunk: bulk_chunk as u64,
            turn: std::time::Duration::from_nanos(ns(self.positive(&c.turn_us, "cost.turn_us")?)),
            restore: [
                nanos(&c.restore_cb_ns, "cost.restore_cb_ns")?,
                nanos(&c.restore_packet_ns, "cost.restore_packet_ns")?,
                nanos(&c.restore_inside_ns, "cost.restore_inside_ns")?,
            ],
        })
    }

    /// The system the device's choices, its timers (quanta, idle period, D3), TDR, the cost
    /// model and interrupt delivery make.
    fn system(
        &self,
        device: DeviceChoices,
        tdr: kernel::TdrConfig,
        cost: gpu::CostModel,
    ) -> Result<kernel::SystemConfig, ScenarioError> {
        let d = &self.device;
        let quantum = |s: &Spanned<f64>, key: &str| -> Result<std::time::Duration, ScenarioError> {
            Ok(std::time::Duration::from_nanos(ns(self.positive(s, key)?)))
        };
        let gpu = gpu::GpuConfig {
            engines: device.engines,
            hw_slots: device.slots,
            doorbell_model: device.model,
            misses_unmapped_doorbells: d.aggregated_doorbell,
            process_quantum: quantum(&d.process_quantum_us, "device.process_quantum_us")?,
            gang_quantum: quantum(&d.gang_quantum_us, "device.gang_quantum_us")?,
            idle_period: quantum(&d.idle_period_us, "device.idle_period_us")?,
            cost,
            preemption: gpu::PreemptionCaps { compute: device.compute, copy: device.copy },
            ..gpu::GpuConfig::default()
        };
        let d3_idle = match &d.d3_idle_ms {
            Some(v) => Some(std::time::Duration::from_nanos(ms(self.positive(v, "device.d3_idle_ms")?))),
            None => None,
        };
        Ok(kernel::SystemConfig {
            gpu,
            notify_on_submit: d.notify_on_submit,
            doorbell_pool: device.pool,
            tdr,
            d3_idle,
            interrupt_delivery: std::time::Duration::from_nanos(
                self.nonneg(&self.cost.interrupt_ns, "cost.interrupt_ns")?.round() as u64,
            ),
            ..Default::default()
        })
    }

    /// `[[group]]`s: at least one, names unique, each checked ([`Scenario::group`]). Returns
    /// the names' indices and the groups.
    fn groups(&self, engines: &[abi::EngineKind]) -> Result<(BTreeMap<String, usize>, Vec<GroupPlan>), ScenarioError> {
        if self.groups.is_empty() {
            return self.err(0..0, "group", "(none)", "a scenario needs at least one [[group]]");
        }
        let mut names: BTreeMap<String, usize> = BTreeMap::new();
        for (i, g) in self.groups.iter().enumerate() {
            if names.insert(g.name.get_ref().clone(), i).is_some() {
                return self.err(g.name.span(), "group.name", g.name.get_ref(), "two groups have this name");
            }
        }
        let groups = self.groups.iter().map(|g| self.group(g, &names, engines)).collect::<Result<_, _>>()?;
        Ok((names, groups))
    }

    /// One group: count, engine, priority, path, queues per process, ring, workload,
    /// commands, dependency.
    fn group(
        &self,
        g: &Group,
        names: &BTreeMap<String, usize>,
        engines: &[abi::EngineKind],
    ) -> Result<GroupPlan, ScenarioError> {
        let key = |k: &str| group_key(g, k);
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
                format!("the device has no such engine (device.engines = {:?})", self.device.engines),
            );
        };
        let priority = match g.priority.get_ref().as_str() {
            "low" => abi::Priority::Low,
            "normal" => abi::Priority::Normal,
            "medium" => abi::Priority::Medium,
            "high" => abi::Priority::High,
            "realtime" => abi::Priority::Realtime,
            other => {
                return self.err(g.priority.span(), &key("priority"), other, "low, normal, medium, high or realtime");
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
        let load = self.workload(g, count)?;
        let (w, cm) = (&g.workload, &g.commands);
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
        Ok(GroupPlan {
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
        })
    }

    /// `[group.workload]` of group `g` (of `count` queues): its kind and what the kind needs.
    fn workload(&self, g: &Group, count: u32) -> Result<Load, ScenarioError> {
        let key = |k: &str| group_key(g, k);
        let w = &g.workload;
        let need = |o: &Option<Spanned<f64>>, k: &str| -> Result<f64, ScenarioError> {
            match o {
                Some(v) => self.positive(v, &key(&format!("workload.{k}"))),
                None => self.err(
                    w.kind.span(),
                    &key(&format!("workload.{k}")),
                    "(missing)",
                    format!("a {} workload needs {k}", w.kind.get_ref()),
                ),
            }
        };
        Ok(match w.kind.get_ref().as_str() {
            "closed" => {
                let n = *w.outstanding.get_ref();
                if n == 0 || n > 4096 {
                    return self.err(w.outstanding.span(), &key("workload.outstanding"), n, "must be 1..=4096");
                }
                Load::Closed { n, think: ns(self.nonneg(&w.think_us, &key("workload.think_us"))?) }
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
        })
    }

    /// Dependency cycles (each group has at most one upstream: follow the chain).
    fn cycles(&self, groups: &[GroupPlan]) -> Result<(), ScenarioError> {
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
        Ok(())
    }

    /// `[[event]]`s, sorted by time.
    fn events(
        &self,
        names: &BTreeMap<String, usize>,
        groups: &[GroupPlan],
    ) -> Result<Vec<(u64, Action)>, ScenarioError> {
        let mut events = Vec::new();
        for e in &self.events {
            let at = ms(self.nonneg(&e.at_ms, "event.at_ms")?);
            events.push((at, self.event(e, names, groups)?));
        }
        events.sort_by_key(|(t, _)| *t);
        Ok(events)
    }

    /// One event's action, with the queue it names.
    fn event(&self, e: &Event, names: &BTreeMap<String, usize>, groups: &[GroupPlan]) -> Result<Action, ScenarioError> {
        let target = || -> Result<(usize, u32), ScenarioError> {
            let Some(gname) = &e.group else {
                return self.err(e.action.span(), "event.group", "(missing)", "this action names a group");
            };
            let Some(&gi) = names.get(gname.get_ref()) else {
                return self.err(gname.span(), "event.group", gname.get_ref(), "no group has this name");
            };
            let q = *e.queue.get_ref();
            if q >= groups[gi].count {
                return self.err(e.queue.span(), "event.queue", q, format!("group has {} queues", groups[gi].count));
            }
            Ok((gi, q))
        };
        Ok(match e.action.get_ref().as_str() {
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
                    Some(f) => Some(ms(self.positive(f, "event.for_ms")?)),
                    None => None,
                };
                Action::Suspend { group, queue, for_ns }
            }
            other => return self.err(e.action.span(), "event.action", other, "kill, hang, d3 or suspend"),
        })
    }

    /// The processes the groups need must fit the device's doorbell pages: refused now, at
    /// the group that passes the limit, not as a kernel error once the run has started.
    fn processes_fit(&self, system: &kernel::SystemConfig, groups: &[GroupPlan]) -> Result<(), ScenarioError> {
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
        Ok(())
    }

    /// Kernel-mode queues are always mapped and hold a hardware slot each (spec 001
    /// "Interaction with Kernel Queues"): beside user-mode queues they may hold all but one of
    /// an engine's slots, or the kernel refuses the queue that passes the limit.
    fn kernel_slots_fit(&self, system: &kernel::SystemConfig, groups: &[GroupPlan]) -> Result<(), ScenarioError> {
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
        Ok(())
    }

    /// `trace_queues` and `latency_rows`.
    fn output_limits(&self) -> Result<(usize, usize), ScenarioError> {
        let trace_queues = *self.trace_queues.get_ref();
        if trace_queues > 10_000 {
            return self.err(self.trace_queues.span(), "trace_queues", trace_queues, "at most 10000");
        }
        let latency_rows = *self.latency_rows.get_ref();
        if latency_rows > 100_000_000 {
            let why = "at most 100000000 (about 7 GB of latency.csv)";
            return self.err(self.latency_rows.span(), "latency_rows", latency_rows, why);
        }
        Ok((trace_queues as usize, latency_rows as usize))
    }

    /// A duration distribution at `key`, in ns.
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

    /// The rows of trace file `f` (relative to the scenario) for a group of `count` queues.
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

/// Key `k` of group `g`, for messages: `group.K (group "NAME")`.
fn group_key(g: &Group, k: &str) -> String {
    format!("group.{k} (group \"{}\")", g.name.get_ref())
}
