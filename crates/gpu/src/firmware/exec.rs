//! Execution: fetch, decode and execute packets, write fence logs (spec 001's packet
//! processing; spec 002's fence log buffers and conditional interrupts).
//!
//! [`super::Firmware::step`] gives each pending slot holder a turn ([`run_queue`]) of up to
//! `packet_budget` packets or its turn's device time, whichever ends first. A queue reads its wptr
//! (acquire), validates it, then fetches, decodes and executes, publishing rptr (release) as
//! it goes. Fetching goes through the turn's [`FetchWindow`], the command processor's fetch
//! buffer: published ring words are read from client memory once, in runs, and every packet
//! is decoded from there. A queue blocked in a `WAIT` stays pending and is re-checked next round (or parks
//! until a fence may have changed).
//!
//! Invariants: the firmware keeps its own copies of rptr and of the last wptr it validated,
//! so a client that scribbles over its rptr word cannot make the engine re-run or skip work;
//! nothing a client writes makes the device panic — every bad packet, address or pointer
//! becomes a typed [`FaultKind`] that hangs only its queue.

use std::sync::atomic::Ordering;

use abi::fence_log::{self, FenceLogEntry, FenceLogOp};
use abi::packet::{DataWidth, LoggedOp, Opcode, Packet};
use abi::preempt::{Stop, StopPoint};
use abi::queue::{Access, FaultKind, FaultRecord};
use abi::{EngineKind, QueueState};
use shm::Mapping;

use crate::Time;
use crate::compute::{ComputeStats, Dispatch, Progress};
use crate::memory::{AddressSpace, Vmid};

use super::fences::{FenceWaits, Fences};
use super::preempt::{self};
use super::queue::{FwQueue, FwQueueId, IbCursor, WaitOn};
use super::ring::{FetchWindow, fetch_indirect};
use super::{FenceSignaled, Interrupt};

/// Outcome of executing one packet.
pub(super) enum Flow {
    /// Done; move past it.
    Next,
    /// Cannot proceed (a `WAIT` on the word at `va` that has not reached `value`); retry next
    /// round.
    Blocked { va: u64, value: u64 },
    /// Made progress but is not done (a sliced `DISPATCH`); continue next round.
    Yield,
    /// Stopped part-way at a boundary for a preemption, its state saved ([`super::preempt`]).
    Stopped(StopPoint),
}

pub(super) struct Env<'a> {
    /// The native fences: looked up by `WAIT`s and signals, their epoch bumped by every
    /// packet this device executes that writes memory.
    pub(super) fences: &'a mut Fences,
    /// Reads the device clock. With real timing, timestamps (`TIMESTAMP`, fence-log entries)
    /// read it when they execute, so they never predate work that was published after the
    /// step began.
    pub(super) clock: &'a dyn Fn() -> Time,
    /// What work costs, and whether the cost occupies the engine ([`crate::cost`]).
    pub(super) cost: &'a crate::cost::CostModel,
    /// `cost.packet` in ns, which every packet is charged.
    pub(super) packet_ns: u64,
    pub(super) timing: crate::cost::Timing,
    /// When the engine's step began.
    pub(super) start: Time,
    /// Modelled device time the engine has spent in this step so far (ns).
    pub(super) elapsed: u64,
    /// `elapsed` at which the current queue's turn ends.
    pub(super) turn_end: u64,
    /// Bytes `COPY`/`FILL` chunks moved in this step (progress that is not a whole packet).
    pub(super) bytes: u64,
    pub(super) kind: EngineKind,
    pub(super) wave_width: u32,
    pub(super) dispatch_budget: u64,
    pub(super) stats: &'a mut ComputeStats,
    pub(super) irqs: &'a mut super::Irqs,
    /// Where this engine may stop a queue for a preemption.
    pub(super) stop: Stop,
    /// The device's attention register ([`crate::Attention`]).
    pub(super) attention: &'a crate::attention::Attention,
    /// The engine's sentinel doorbells ([`super::Engine::sentinels`]).
    pub(super) sentinels: &'a [preempt::Sentinel],
    /// The turn was cut short by [`Env::interrupted`]: the step ends here for this engine.
    pub(super) cut: bool,
    /// With modelled timing, when a client may next ring ([`crate::Gpu::set_horizon`]), if
    /// after the step's start.
    pub(super) horizon: Option<Time>,
    /// Where executed `PROGRESS_FENCE`s are recorded, if anyone asked
    /// ([`crate::Gpu::record_completions`]).
    pub(super) completions: Option<&'a mut Vec<super::Completion>>,
}

impl Env<'_> {
    /// The time a native-fence signal executing now is recorded at ([`super::FenceSignal`]):
    /// [`Env::now`] while a tool records signals; otherwise unread, and not worth the live
    /// driver's clock read on every signal.
    pub(super) fn signal_time(&self) -> Time {
        if self.fences.recording() { self.now() } else { Time::ZERO }
    }

    /// Device time now: with modelled timing, the step's start plus what the engine ran so
    /// far in it; with real timing, the clock.
    pub(super) fn now(&self) -> Time {
        match self.timing {
            crate::cost::Timing::Modelled => Time(self.start.0.saturating_add(self.elapsed)),
            crate::cost::Timing::Real => (self.clock)(),
        }
    }

    /// Raises a packet's interrupt: with modelled timing at the packet's end (its modelled
    /// start, [`Env::now`], plus its cost, when a `PROGRESS_FENCE`'s completion is recorded
    /// too); with real timing as it happens, and the clock is not read for it.
    pub(super) fn raise(&mut self, irq: Interrupt) {
        let at = match self.timing {
            crate::cost::Timing::Modelled => self.packet_end(),
            crate::cost::Timing::Real => Time::ZERO,
        };
        self.irqs.push_back((at, irq));
    }

    /// When the packet executing now ends: its modelled start ([`Env::now`]) plus its cost.
    fn packet_end(&self) -> Time {
        Time(self.now().0.saturating_add(self.packet_ns))
    }

    /// Spends `ns` of modelled device time.
    pub(super) fn charge(&mut self, ns: u64) {
        self.elapsed = self.elapsed.saturating_add(ns);
    }

    /// Whether the current queue's turn is over.
    pub(super) fn turn_over(&self) -> bool {
        self.elapsed >= self.turn_end
    }

    /// Device time left in the current queue's turn (ns).
    pub(super) fn turn_left(&self) -> u64 {
        self.turn_end.saturating_sub(self.elapsed)
    }

    /// Whether the turn must end at this safe point: the kernel waits for the device lock
    /// (a preemption request, a reset), or a queue that would take this one's slot rang its
    /// doorbell. Checked between packets, between chunks and every
    /// [`INTERRUPT_CHECK_INSTRUCTIONS`] wave-instructions; sets [`Env::cut`].
    pub(super) fn interrupted(&mut self) -> bool {
        if !self.cut {
            // Acquire is not needed: a changed word only ends the turn; the ring itself is
            // latched (with its acquire) by the next doorbell poll.
            self.cut = self.attention.is_raised()
                || self.sentinels.iter().any(|s| s.word.get().load(Ordering::Relaxed) != s.last)
                || self.horizon_left() == Some(0);
        }
        self.cut
    }

    /// Modelled device time left before the horizon, while a ring could cut into this turn
    /// (the engine has sentinel doorbells): where the deterministic driver stands in for a
    /// client that rings while the turn runs.
    pub(super) fn horizon_left(&self) -> Option<u64> {
        let h = self.horizon.filter(|_| !self.sentinels.is_empty())?;
        Some(h.0.saturating_sub(self.now().0))
    }
}

/// Wave-instructions between two checks of [`Env::interrupted`] inside a `DISPATCH`: about
/// 0.7 µs of interpretation on the development machine (22 ns a wave-instruction at width 32),
/// so a cut-in waits 0.35 µs on average. Each check is a load or two; the slices they cut cost
/// the interpreter about 4% of its speed against unsliced runs (3% at 64, 6% at 16).
pub(super) const INTERRUPT_CHECK_INSTRUCTIONS: u64 = 32;

/// Runs one queue for up to `budget` packets. Returns packets executed.
/// A `WAIT` blocked on the word `r` resolves to: if it is a native fence, the queue parks
/// until a fence changes (spec 002: "the firmware re-checks blocked queues when fences
/// change"); a plain memory word, which anyone may write without telling, is polled.
pub(super) fn park_on_fence(q: &mut FwQueue, r: &crate::memory::Resolved<'_>, env: &Env<'_>) {
    if env.fences.get(&(r.shm.id(), r.offset)).is_some_and(|f| f.waits == FenceWaits::Park) {
        q.parked = Some(env.fences.epoch);
    }
}

pub(super) fn run_queue(
    q: &mut FwQueue,
    id: FwQueueId,
    vms: &[Option<AddressSpace>],
    budget: u32,
    env: &mut Env<'_>,
    window: &mut FetchWindow,
) -> (u64, Option<StopPoint>) {
    let start_rptr = q.ring.rptr;
    let mut done = 0u64;
    let mut stopped = None;
    // The window is keyed by ring pointer, and another queue's pointers are not this one's.
    window.clear();
    let result = (|| -> Result<(), (FaultKind, Option<Opcode>, bool)> {
        // (Errors here and below are built only when they happen: `ok_or` built one, and
        // dropped it through its drop glue, at every turn.)
        let Some(vm) = vms.get(q.cfg.vmid.0 as usize).and_then(Option::as_ref) else {
            return Err((
                FaultKind::OutsideMappings { va: q.cfg.ring_va, bytes: 0, access: Access::Read },
                None,
                false,
            ));
        };
        // A turn ends after `budget` packets or when its device time is spent, whichever
        // comes first (at least one packet, or one slice of one, always runs).
        while done < budget as u64 && (done == 0 || !(env.turn_over() || env.interrupted())) {
            if q.preempt.request.is_some()
                && let Some(point) = stop_point(q, env.stop)
            {
                stopped = Some(point);
                return Ok(());
            }
            if q.ring.ib.is_some() {
                if indirect_packet(q, id, vm, vms, env, &mut stopped, &mut done)? {
                    return Ok(());
                }
                continue;
            }
            if q.ring.rptr == q.ring.wptr {
                q.ring.refresh_wptr(q.cfg.ring_bytes).map_err(|k| (k, None, false))?;
                if q.ring.rptr == q.ring.wptr {
                    q.pending = false;
                    return Ok(());
                }
            }
            // (Matched rather than `map_err`ed: this is the path of every ring packet, and the
            // conversion copied the whole result, packet and all, at each step.)
            let (packet, n) = match window.fetch(q) {
                Ok(fetched) => fetched,
                Err((kind, op)) => return Err((kind, op, false)),
            };
            let flow = match exec(packet, q, id, vm, env, false) {
                Ok(flow) => flow,
                Err(kind) => return Err((kind, Some(packet.opcode()), false)),
            };
            match flow {
                Flow::Blocked { va, value } => {
                    blocked(q, env, &mut stopped, q.cfg.vmid, va, value);
                    return Ok(());
                }
                Flow::Yield => return Ok(()),
                Flow::Stopped(point) => {
                    stopped = Some(point);
                    return Ok(());
                }
                Flow::Next => {
                    if q.ring.ib.is_none() {
                        q.ring.rptr += n as u64 * 4;
                    }
                    q.blocked = false;
                    // The end of a command buffer: every submission ends with its progress fence.
                    q.at_cb_boundary = matches!(packet, Packet::ProgressFence { .. });
                    done += 1;
                }
            }
        }
        Ok(())
    })();
    if let Err((kind, opcode, in_indirect)) = result {
        let fault = FaultRecord { kind, rptr: q.ring.rptr, opcode, in_indirect };
        self::fault(q, fault.clone());
        // Raised where the queue stopped (a fault costs no packet time).
        let at = if env.timing == crate::cost::Timing::Modelled { env.now() } else { Time::ZERO };
        env.irqs.push_back((at, Interrupt::QueueFault { queue: id, fault }));
    }
    if q.ring.rptr != start_rptr {
        q.ring.publish_rptr();
    }
    (done, stopped)
}

/// The next packet of the indirect buffer queue `q` is in (`vm`: the queue's address space),
/// as [`run_queue`] runs ring packets: `true` when the turn ends here (blocked, yielded or
/// stopped for a preemption). Past the buffer's end, the queue moves past its
/// `INDIRECT_BUFFER` packet instead.
fn indirect_packet(
    q: &mut FwQueue,
    id: FwQueueId,
    vm: &AddressSpace,
    vms: &[Option<AddressSpace>],
    env: &mut Env<'_>,
    stopped: &mut Option<StopPoint>,
    done: &mut u64,
) -> Result<bool, (FaultKind, Option<Opcode>, bool)> {
    let Some(mut ib) = q.ring.ib else { return Ok(false) };
    let ib_vm = match ib.vmid {
        Some(v) => match vms.get(v.0 as usize).and_then(Option::as_ref) {
            Some(vm) => vm,
            None => {
                let why = "vmid does not exist";
                return Err((FaultKind::BadIndirect { why }, Some(Opcode::IndirectBuffer), false));
            }
        },
        None => vm,
    };
    if ib.pos >= ib.dwords {
        q.ring.ib = None;
        q.ring.rptr += Opcode::IndirectBuffer.fixed_dwords().unwrap_or(5) as u64 * 4;
        return Ok(false);
    }
    let (packet, n) = fetch_indirect(ib_vm, &ib).map_err(|k| (k, None, true))?;
    match exec(packet, q, id, ib_vm, env, true).map_err(|k| (k, Some(packet.opcode()), true))? {
        Flow::Blocked { va, value } => {
            let vmid = ib.vmid.unwrap_or(q.cfg.vmid);
            blocked(q, env, stopped, vmid, va, value);
            return Ok(true);
        }
        Flow::Yield => return Ok(true),
        Flow::Stopped(point) => {
            *stopped = Some(point);
            return Ok(true);
        }
        Flow::Next => {
            ib.pos += n as u32;
            q.ring.ib = Some(ib);
            q.blocked = false;
            q.at_cb_boundary = false;
            *done += 1;
        }
    }
    Ok(false)
}

/// Queue `q`'s engine faulted on its work (`fault` says where): it hangs, its partial work
/// dropped, until the kernel resets it. The caller raises the interrupt.
pub(super) fn fault(q: &mut FwQueue, fault: FaultRecord) {
    q.cb.clear();
    q.state = QueueState::Hung;
    q.pending = false;
    q.dispatch_active = false;
    q.live = None;
    q.bulk_done = None;
    q.fault = Some(fault);
}

/// Where queue `q`, asked to leave its slot, stands now, if its engine may stop it there: a
/// packet part-way done stops, or not, inside its execution (a dispatch at an instruction, a
/// bulk copy at a chunk); otherwise it stands between packets, at the end of a command buffer
/// or inside one.
fn stop_point(q: &FwQueue, stop: Stop) -> Option<StopPoint> {
    let point = if q.dispatch_active {
        StopPoint::Instruction
    } else if q.bulk_done.is_some() {
        StopPoint::Chunk
    } else if q.ring.ib.is_none() && q.at_cb_boundary {
        StopPoint::CommandBuffer
    } else {
        StopPoint::Packet
    };
    stop.allows(point).then_some(point)
}

/// A `WAIT` on the word at `va` of `vmid` that has not reached `value`: the queue stays
/// blocked (and remembers on what, should it sleep off its slot), and a preemption asked of it
/// stops it here if the engine can preempt a wait (spec 003, "signal on submit").
fn blocked(q: &mut FwQueue, env: &Env<'_>, stopped: &mut Option<StopPoint>, vmid: Vmid, va: u64, value: u64) {
    q.blocked = true;
    // (`park_on_fence` just decided whether it parks.)
    q.wait_on = Some(WaitOn { vmid, va, value, park: q.parked.is_some() });
    if q.preempt.request.is_some() && env.stop.allows_blocked_wait() {
        *stopped = Some(StopPoint::Packet);
    }
}

/// What a native fence signal's interrupt names (spec 002 "Optimized native fence signaled
/// interrupt"): with the optimized interrupt, the queue that ran it — "instead of filling out
/// an array of fence handles that got signaled, the GPU should only mention the KMD handle of
/// the HWQueue" — and the kernel reads that queue's signal log (a signal the UMD did not log
/// is not there: the kernel falls back to a scan). A queue without logs (kernel-mode), and a
/// device without the optimization, name the fence.
fn signaled(q: &FwQueue, id: FwQueueId, fence: u64, env: &Env<'_>) -> FenceSignaled {
    if env.fences.optimized && q.cfg.fence_logs.is_some() {
        FenceSignaled::Queues(vec![id])
    } else {
        FenceSignaled::Fences(vec![fence])
    }
}

pub(super) fn outside(va: u64, bytes: u64) -> FaultKind {
    FaultKind::OutsideMappings { va, bytes, access: Access::Read }
}

/// Executes one packet, then charges the command processor's share of it (after: a
/// `TIMESTAMP` reads the time at which its packet starts). A resumed slice pays it again: the
/// engine re-reads the packet to continue it; a `WAIT` still blocked pays nothing.
pub(super) fn exec(
    p: Packet,
    q: &mut FwQueue,
    id: FwQueueId,
    vm: &AddressSpace,
    env: &mut Env<'_>,
    in_indirect: bool,
) -> Result<Flow, FaultKind> {
    let before = env.elapsed;
    let flow = exec_packet(p, q, id, vm, env, in_indirect);
    // A WAIT that stays blocked costs nothing: it is re-checked at the next event, and it
    // must not keep its engine busy (and the deterministic clock crawling) while it waits.
    if !matches!(flow, Ok(Flow::Blocked { .. })) {
        env.charge(env.packet_ns);
        if env.completions.is_some() {
            record(p, &flow, q, id, env, before);
        }
    }
    flow
}

/// While completions are recorded: the packet `p` of queue `id` executed from `before` (the
/// turn's device time) to now, which its command buffer's clock counts; a `PROGRESS_FENCE`
/// ends the command buffer, and its completion is recorded at the packet's end.
fn record(p: Packet, flow: &Result<Flow, FaultKind>, q: &mut FwQueue, id: FwQueueId, env: &mut Env<'_>, before: u64) {
    if flow.is_err() {
        return;
    }
    let start = match env.timing {
        crate::cost::Timing::Modelled => Time(env.start.0.saturating_add(before)),
        crate::cost::Timing::Real => (env.clock)(),
    };
    q.cb.ran(start, env.elapsed - before);
    if let Packet::ProgressFence { value } = p {
        let (started, exec_ns) = q.cb.end();
        let at = env.now();
        if let Some(c) = env.completions.as_deref_mut() {
            c.push(super::Completion { queue: id, value, at, started, exec_ns });
        }
    }
}

/// Executes one packet (see [`exec`]).
fn exec_packet(
    p: Packet,
    q: &mut FwQueue,
    id: FwQueueId,
    vm: &AddressSpace,
    env: &mut Env<'_>,
    in_indirect: bool,
) -> Result<Flow, FaultKind> {
    let wfault = |va: u64, bytes: u64| FaultKind::OutsideMappings { va, bytes, access: Access::Write };
    // Whatever memory a packet writes may be a fence some queue is parked on — a signal, or a
    // misdirected WRITE_DATA — so every writing packet counts as a fence change. That costs an
    // increment, and parking can never lose a wake-up to this device's own writes: only writes
    // from outside (the CPU, another adapter) need the KMD's notification.
    if !matches!(
        p,
        Packet::Nop { .. }
            | Packet::Wait { .. }
            | Packet::Interrupt { .. }
            | Packet::IndirectBuffer { .. }
            | Packet::Synthetic { .. }
    ) {
        env.fences.changed();
    }
    match p {
        Packet::Nop { .. } => {}
        Packet::WriteData { width, va, value } => {
            let r = vm.translate_aligned(va, width.bytes(), Access::Write)?;
            let res = match width {
                DataWidth::U32 => r.shm.write_u32(r.offset, value as u32),
                DataWidth::U64 => r.shm.write_u64(r.offset, value),
            };
            res.map_err(|_| wfault(va, width.bytes()))?;
        }
        Packet::Copy { src, dst, bytes } => {
            let s = vm.translate(src, bytes, Access::Read)?;
            let d = vm.translate(dst, bytes, Access::Write)?;
            // Overlap is a property of the backing memory: walk the chunks in memmove order,
            // so a chunk's writes only clobber source bytes an earlier chunk already read.
            let backward = s.shm.id() == d.shm.id() && d.offset > s.offset && d.offset < s.offset + bytes;
            return bulk(q, env, bytes, backward, |at, n| {
                Mapping::copy(s.shm, s.offset + at, d.shm, d.offset + at, n).map_err(|_| wfault(dst + at, n))
            });
        }
        Packet::Fill { dst, bytes, pattern } => {
            let d = vm.translate(dst, bytes, Access::Write)?;
            return bulk(q, env, bytes, false, |at, n| {
                d.shm.fill_u32(d.offset + at, n, pattern).map_err(|_| wfault(dst + at, n))
            });
        }
        Packet::Timestamp { va } => {
            let r = vm.translate_aligned(va, 8, Access::Write)?;
            r.shm.write_u64(r.offset, env.now().as_nanos()).map_err(|_| wfault(va, 8))?;
        }
        Packet::IndirectBuffer { va, dwords, vmid } => {
            if in_indirect {
                return Err(FaultKind::BadIndirect { why: "an indirect buffer may not contain another" });
            }
            let vmid = match (vmid, q.cfg.privileged) {
                (0, _) => None,
                (v, true) => Some(Vmid(v)),
                (_, false) => return Err(FaultKind::BadIndirect { why: "vmid must be 0 on a user queue" }),
            };
            if vmid.is_none() {
                vm.translate(va, dwords as u64 * 4, Access::Read)?;
            }
            q.ring.ib = Some(IbCursor { va, dwords, pos: 0, vmid });
        }
        Packet::Signal { va, value } => {
            let r = vm.translate_aligned(va, 8, Access::Write)?;
            let word = r.shm.atomic_u64(r.offset).map_err(|_| wfault(va, 8))?;
            let at = env.signal_time();
            // A plain SIGNAL that lands on a native fence still owes its CPU waiters the
            // interrupt check: a fence is a fence whatever the packet's flags say.
            match env.fences.signal(&(r.shm.id(), r.offset), word, value, at, || {}) {
                Some((fence, true)) => env.raise(Interrupt::NativeFenceSignaled(signaled(q, id, fence, env))),
                Some((_, false)) => {}
                // Release: everything the queue wrote before the signal is visible to whoever
                // acquires the new value.
                None => word.store(value, Ordering::Release),
            }
        }
        Packet::SignalFence { va, value } => {
            let r = vm.translate_aligned(va, 8, Access::Write)?;
            let key = (r.shm.id(), r.offset);
            if env.fences.get(&key).is_none() {
                return Err(FaultKind::NotAFence { va });
            }
            let current = r.shm.atomic_u64(r.offset).map_err(|_| wfault(va, 8))?;
            let at = env.signal_time();
            // Store CurrentValue, barrier, read MonitoredValue (spec 002, `abi::protocol`).
            if let Some((fence, true)) = env.fences.signal(&key, current, value, at, || {}) {
                env.raise(Interrupt::NativeFenceSignaled(signaled(q, id, fence, env)));
            }
        }
        Packet::Logged { op, va, value, position } => return exec_logged(q, id, vm, env, op, va, value, position),
        Packet::Wait { va, value } => {
            let r = vm.translate_aligned(va, 8, Access::Read)?;
            // Acquire: pairs with the signaller's release store.
            let v = r.shm.load_u64(r.offset, Ordering::Acquire).map_err(|_| outside(va, 8))?;
            if v < value {
                park_on_fence(q, &r, env);
                return Ok(Flow::Blocked { va, value });
            }
        }
        Packet::ProgressFence { value } => progress_fence(q, id, env, value)?,
        Packet::Interrupt { id: user } => env.raise(Interrupt::User { queue: id, id: user }),
        Packet::Synthetic { ns } => return synthetic(q, env, ns),
        Packet::Dispatch { program, grid, group, args } => {
            return exec_dispatch(q, vm, env, program, grid, group, args);
        }
    }
    Ok(Flow::Next)
}

/// Executes a `SIGNAL` or `WAIT` with a fence-log entry ([`Packet::Logged`]): the operation,
/// then the entry, in spec 002's order.
/// A `PROGRESS_FENCE` writing `value`: checked against the queue's completed and last-queued
/// values, written into its kernel page (as a native fence, if the kernel registered it as
/// one), and the progress interrupt raised above the monitored value.
fn progress_fence(q: &mut FwQueue, id: FwQueueId, env: &mut Env<'_>, value: u64) -> Result<(), FaultKind> {
    if value < q.completed {
        return Err(FaultKind::ProgressBackwards { completed: q.completed, value });
    }
    if q.ring.last_queued_word.is_some() && value > q.ring.queued {
        return Err(FaultKind::ProgressBeyondQueued { value, last_queued: q.ring.queued });
    }
    let word = q.cfg.kernel_page.progress_completed();
    // A progress fence the kernel registered as a native fence (spec 002 "Indicating a
    // native progress fence for hardware queues") is signalled as one: value, barrier,
    // MonitoredValue, conditional interrupt.
    let key = match word.region() {
        shm::Region::Shm(s) => Some((s.id(), word.offset())),
        _ => None,
    };
    let at = env.signal_time();
    match key.and_then(|k| env.fences.signal(&k, word.get(), value, at, || {})) {
        Some((fence, true)) => env.raise(Interrupt::NativeFenceSignaled(FenceSignaled::Fences(vec![fence]))),
        Some((_, false)) => {}
        // Release: the command buffer's writes happen-before a waiter's acquire of the
        // value.
        None => word.get().store(value, Ordering::Release),
    }
    q.completed = value;
    // (Its completion is recorded once its cost is charged: [`record`].)
    if value > q.monitored {
        env.raise(Interrupt::ProgressFence { queue: id, value });
    }
    Ok(())
}

#[expect(clippy::too_many_arguments, reason = "the packet's four fields beside the usual four")]
fn exec_logged(
    q: &mut FwQueue,
    id: FwQueueId,
    vm: &AddressSpace,
    env: &mut Env<'_>,
    op: LoggedOp,
    va: u64,
    value: u64,
    position: u32,
) -> Result<Flow, FaultKind> {
    let wfault = |va: u64, bytes: u64| FaultKind::OutsideMappings { va, bytes, access: Access::Write };
    let Some(logs) = q.cfg.fence_logs.clone() else {
        return Err(FaultKind::BadField { field: "log entry", why: "this queue has no fence log" });
    };
    // Where the position goes, checked before the operation: a refused one changes
    // nothing but its queue's state.
    let log = &logs[if op == LoggedOp::Wait { 0 } else { 1 }];
    let slot = fence_log::locate::<shm::Mapping>(log, position).map_err(|e| match e {
        fence_log::LogError::BadPosition { position, next, entries } => {
            FaultKind::BadLogPosition { position, next, entries }
        }
        _ => FaultKind::BadField { field: "log entry", why: "the queue's fence log holds no entry" },
    })?;
    let key = vm.translate_aligned(va, 8, Access::Read).ok().map(|r| (r.shm.id(), r.offset));
    let fence = key.and_then(|k| env.fences.get(&k));
    let handle = fence.map_or(0, |f| f.id);
    let is_fence = fence.is_some();
    match op {
        LoggedOp::Wait => {
            let r = vm.translate_aligned(va, 8, Access::Read)?;
            let now = env.now();
            let observed = *q.wait_observed.get_or_insert(now);
            // Acquire: pairs with the signaller's release store.
            if r.shm.load_u64(r.offset, Ordering::Acquire).map_err(|_| outside(va, 8))? < value {
                park_on_fence(q, &r, env);
                return Ok(Flow::Blocked { va, value });
            }
            q.wait_observed = None;
            // 1. the wait released; 2. the entry; 3. the index; 4. the barrier.
            fence_log::append(
                log,
                slot,
                FenceLogEntry {
                    fence_value: value,
                    fence_handle: handle,
                    operation: FenceLogOp::WaitUnblocked as u32,
                    observed_timestamp: observed.as_nanos(),
                    end_timestamp: now.as_nanos(),
                    ..Default::default()
                },
            );
            std::sync::atomic::fence(Ordering::SeqCst);
        }
        LoggedOp::Signal | LoggedOp::SignalFence => {
            let r = vm.translate_aligned(va, 8, Access::Write)?;
            let current = r.shm.atomic_u64(r.offset).map_err(|_| wfault(va, 8))?;
            let now = env.now();
            let entry_of = |h| FenceLogEntry {
                fence_value: value,
                fence_handle: h,
                operation: FenceLogOp::SignalExecuted as u32,
                observed_timestamp: now.as_nanos(),
                end_timestamp: now.as_nanos(),
                ..Default::default()
            };
            if op == LoggedOp::Signal && !is_fence {
                current.store(value, Ordering::Release);
                fence_log::append(log, slot, entry_of(handle));
                std::sync::atomic::fence(Ordering::SeqCst);
            } else {
                // A fence signal (flagged, or a plain one landing on a fence).
                let Some(key) = key.filter(|_| is_fence) else { return Err(FaultKind::NotAFence { va }) };
                // 1. value; 2. entry; 3. index — inside the protocol, before its barrier
                // (4) and the interrupt check (5): spec 002 "Order of operations".
                let signal =
                    env.fences.signal(&key, current, value, now, || fence_log::append(log, slot, entry_of(handle)));
                if let Some((fence, true)) = signal {
                    env.raise(Interrupt::NativeFenceSignaled(signaled(q, id, fence, env)));
                }
            }
        }
    }
    Ok(Flow::Next)
}

/// Executes (a slice of) a `DISPATCH`.
fn exec_dispatch(
    q: &mut FwQueue,
    vm: &AddressSpace,
    env: &mut Env<'_>,
    program: u64,
    grid: [u32; 3],
    group: [u32; 3],
    args: u64,
) -> Result<Flow, FaultKind> {
    if env.kind != EngineKind::Compute {
        return Err(FaultKind::BadDispatch { why: "only compute engines run kernels" });
    }
    // A dispatch part-way done resumes from its state — still live in the slot, or
    // saved in the context save area when the queue left its slot since; the packet in
    // the ring (client memory) is not read again.
    let live = q.live.take();
    let save = &q.cfg.context_save;
    let mut d = match live {
        Some(d) => d,
        None if q.dispatch_active => Box::new(Dispatch::restore(vm, save, 0, env.wave_width)?),
        None => Box::new(Dispatch::start(vm, program, grid, group, args, env.wave_width)?),
    };
    // A slice runs as many wave-instructions as the turn has time for (at least one),
    // and at most the dispatch budget.
    let per = crate::cost::ns(env.cost.wave_instruction).max(1);
    let budget = env.dispatch_budget.min(env.turn_left() / per).max(1);
    let before = env.stats.instructions;
    // Asked to leave the slot: run to the next boundary the engine can stop at inside a
    // dispatch (an instruction boundary was taken before the packet; `Dispatch` and
    // coarser levels let the dispatch finish).
    let stop_at = q.preempt.request.and(env.stop.in_dispatch());
    // In sub-slices, so the turn can end at the next check if it is interrupted.
    let mut left = budget;
    let progress = loop {
        let slice = left.min(INTERRUPT_CHECK_INSTRUCTIONS);
        let p = d.run_to(vm, slice, stop_at, env.stats);
        left -= slice;
        if !matches!(p, Ok(Progress::Yield)) || left == 0 || env.interrupted() {
            break p;
        }
    };
    env.charge(env.cost.instructions_ns(env.stats.instructions - before));
    match progress? {
        Progress::Done => q.dispatch_active = false,
        Progress::Yield => {
            // Its state stays in the slot until the queue leaves it.
            q.live = Some(d);
            q.dispatch_active = true;
            return Ok(Flow::Yield);
        }
        Progress::Stopped(point) => {
            d.save(save, 0)?;
            q.dispatch_active = true;
            return Ok(Flow::Stopped(point));
        }
    }
    Ok(Flow::Next)
}

/// Runs a `SYNTHETIC` packet of `total` ns of device time from where an earlier turn left it
/// (kept, like a bulk copy's offset, in `bulk_done`): as much as the turn has time for (at
/// least 1 ns), then it yields, or stops for a preemption where the engine stops a bulk
/// copy's chunks. It reads and writes no memory. With modelled timing the slice is charged;
/// with real timing (the live driver) the engine also spins for it.
fn synthetic(q: &mut FwQueue, env: &mut Env<'_>, total: u64) -> Result<Flow, FaultKind> {
    let mut done = q.bulk_done.take().unwrap_or(0).min(total);
    // At most up to the horizon, where a ring may cut in (it is checked after the slice).
    let n = env.turn_left().min(env.horizon_left().unwrap_or(u64::MAX)).max(1).min(total - done);
    if env.timing == crate::cost::Timing::Real {
        // The live driver: the engine is really busy for the slice (a kernel that takes time).
        let until = (env.clock)().plus(std::time::Duration::from_nanos(n));
        while (env.clock)() < until {
            std::hint::spin_loop();
        }
    }
    env.charge(n);
    done += n;
    if done < total {
        q.bulk_done = Some(done);
        if q.preempt.request.is_some() && env.stop.allows(StopPoint::Chunk) {
            return Ok(Flow::Stopped(StopPoint::Chunk));
        }
        // A slice ends the turn: a check, so a ring (or the horizon) met meanwhile cuts the
        // step's remaining turns too.
        env.interrupted();
        return Ok(Flow::Yield);
    }
    Ok(Flow::Next)
}

/// Runs a `COPY`/`FILL` of `total` bytes in chunks ([`crate::cost::CostModel::chunk_bytes`]),
/// from where an earlier turn left it, until it is done or the turn's device time is spent.
/// `op(at, n)` moves bytes `[at, at + n)` of the packet. Unfinished, the queue keeps its place
/// (`bulk_done`) and yields: the packet is resumed at that chunk boundary, never restarted, so
/// nothing it already wrote is written again.
fn bulk(
    q: &mut FwQueue,
    env: &mut Env<'_>,
    total: u64,
    backward: bool,
    mut op: impl FnMut(u64, u64) -> Result<(), FaultKind>,
) -> Result<Flow, FaultKind> {
    let chunk = env.cost.chunk_bytes();
    let mut done = q.bulk_done.take().unwrap_or(0).min(total);
    while done < total {
        let n = chunk.min(total - done);
        let at = if backward { total - done - n } else { done };
        op(at, n)?;
        env.charge(env.cost.bulk_ns(n));
        env.bytes += n;
        done += n;
        if done < total && q.preempt.request.is_some() && env.stop.allows(StopPoint::Chunk) {
            q.bulk_done = Some(done);
            return Ok(Flow::Stopped(StopPoint::Chunk));
        }
        if done < total && (env.turn_over() || env.interrupted()) {
            q.bulk_done = Some(done);
            return Ok(Flow::Yield);
        }
    }
    Ok(Flow::Next)
}
