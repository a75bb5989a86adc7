//! The firmware driving hardware slots ([`crate::hw`]): what replaces `exec.rs`'s turns on a
//! device built with a [`Hardware`].
//!
//! The scheduler is unchanged: each step it decides who holds the slots (`hqd`), exactly as
//! for virtual engines. What differs is execution. A virtual engine runs each holder for a
//! turn on the firmware's thread; a hardware slot runs its queue by itself, between and during
//! the firmware's steps. So a step here:
//!
//! 1. polls the hardware and applies what each slot reported ([`HwEventKind`]): a queue went
//!    idle or busy (its `pending`), blocked in a `WAIT` (its slot may go to a waiter), raised a
//!    user interrupt, signalled (spec 002's MonitoredValue check, made here as the engine's
//!    last step), faulted (it hangs), or left its slot (its registers come back; an owed
//!    preemption answer is given: [`preempt::finish`]);
//! 2. reads each loaded queue's progress: rptr, and its completed progress value, which raises
//!    the progress interrupt above the monitored value, and the native-fence interrupt when
//!    the kernel registered the progress word as a fence;
//! 3. runs the scheduling pass, then reconciles the slots with it: a loaded queue that must
//!    leave (evicted, preempted, suspended) is told to stop — a loaded queue never stands
//!    "between turns", so it is never taken off a slot without the hardware's answer — and a
//!    holder not loaded yet is loaded into a free slot.
//!
//! Resets and removals abort a slot and wait for its answer before they return
//! ([`Firmware::hw_quiesce`]), as amdgpu waits for MES: the queue's memory may go right after.

use std::sync::atomic::Ordering;

use abi::preempt::{Stop, StopPoint};
use abi::queue::{Access, FaultKind};
use abi::slab::Slab;
use abi::{EngineId, EngineKind, QueueState};
use shm::Shm;

use crate::Time;
use crate::compute::ComputeStats;
use crate::memory::{AddressSpace, Vmid};

use super::exec::{self};
use super::fences::Fences;
use super::log::{FwEvent, FwLog};
use super::preempt::{self};
use super::queue::{FwQueue, FwQueueId, IbCursor, WaitOn};
use super::schedule::{self, mark_pending, sync_waiting};
use super::step::{self};
use super::{Engine, FenceSignaled, Firmware, Interrupt, Irqs, StepReport};
use crate::hw::{Hardware, HwCommand, HwEvent, HwEventKind, IndirectPosition, QueueImage, QueueRegs};

/// How long a reset or removal waits for a slot's answer before it counts the queue lost.
const QUIESCE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// One hardware slot as the firmware tracks it.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct HwSlot {
    /// The queue loaded in it.
    queue: Option<FwQueueId>,
    /// It was told to stop or abort, and has not answered yet.
    leaving: bool,
}

/// What a slot had executed when the firmware last counted it (its counters only grow).
#[derive(Clone, Copy, Debug, Default)]
struct Counted {
    packets: u64,
    instructions: u64,
    lane_ops: u64,
    bytes: u64,
}

/// The firmware's side of a [`Hardware`].
pub(super) struct HwSide {
    dev: Box<dyn Hardware>,
    /// Per engine, its slots.
    slots: Vec<Vec<HwSlot>>,
    /// The scratch list of a poll.
    events: Vec<HwEvent>,
    /// Per address space, the generation last handed to the hardware.
    pushed: Vec<u64>,
    /// Per engine and slot, what it had executed when last counted.
    counted: Vec<Vec<Counted>>,
    /// Steps taken: a slot's whole status is read every [`STATUS_EVERY`] of them.
    steps: u64,
}

/// Firmware steps between two reads of a slot's whole status (its rptr and counters: a few
/// cache lines the device writes, which cost the firmware's loop a memory access each). The
/// progress value, which raises interrupts, is read at every step.
const STATUS_EVERY: u64 = 16;

impl HwSide {
    /// Attaches `dev` to `engines`, `slots` each.
    pub(super) fn new(
        mut dev: Box<dyn Hardware>,
        engines: &[EngineKind],
        slots: u32,
        wave_width: u32,
    ) -> Result<HwSide, crate::hw::HwError> {
        dev.attach(engines, slots, wave_width)?;
        Ok(HwSide {
            dev,
            slots: engines.iter().map(|_| vec![HwSlot::default(); slots.max(1) as usize]).collect(),
            events: Vec::new(),
            pushed: Vec::new(),
            counted: engines.iter().map(|_| vec![Counted::default(); slots.max(1) as usize]).collect(),
            steps: 0,
        })
    }

    /// The hardware's name.
    pub(super) fn name(&self) -> String {
        self.dev.name()
    }

    /// Hands the hardware address space `vmid` (`None`: gone) unless it has it at this
    /// generation already.
    fn push_space(&mut self, vmid: Vmid, vm: Option<&AddressSpace>) {
        let generation = vm.map_or(u64::MAX, AddressSpace::generation);
        let at = vmid.0 as usize;
        if self.pushed.len() <= at {
            // u64::MAX, "gone": a space that never existed is nothing to tell.
            self.pushed.resize(at + 1, u64::MAX);
        }
        if self.pushed[at] != generation && self.dev.command(HwCommand::AddressSpace { vmid, vm }).is_ok() {
            self.pushed[at] = generation;
        }
    }

    /// Counts what slot `k` of engine `e` executed since it was last counted.
    fn count(
        &mut self,
        e: usize,
        k: usize,
        p: &crate::hw::SlotProgress,
        report: &mut StepReport,
        compute: &mut ComputeStats,
    ) {
        let c = &mut self.counted[e][k];
        let packets = p.packets.saturating_sub(c.packets);
        let instructions = p.instructions.saturating_sub(c.instructions);
        report.packets += packets;
        report.instructions += instructions;
        compute.instructions += instructions;
        compute.lane_ops += p.lane_ops.saturating_sub(c.lane_ops);
        report.bytes += p.bytes.saturating_sub(c.bytes);
        *c = Counted { packets: p.packets, instructions: p.instructions, lane_ops: p.lane_ops, bytes: p.bytes };
    }
}

impl QueueRegs {
    /// The registers of `q` as the firmware holds them (the MQD).
    fn of(q: &FwQueue) -> QueueRegs {
        QueueRegs {
            rptr: q.ring.rptr,
            wptr: q.ring.wptr,
            queued: q.ring.queued,
            completed: q.completed,
            ib: q.ring.ib.map(|ib| IndirectPosition { va: ib.va, dwords: ib.dwords, pos: ib.pos, vmid: ib.vmid }),
            bulk_done: q.bulk_done,
            dispatch_active: q.dispatch_active,
            at_cb_boundary: q.at_cb_boundary,
            wait_observed: q.wait_observed,
        }
    }
}

impl FwQueue {
    /// Off its slot (a stop's answer, or a fault): the registers the slot returned are the
    /// queue's again, and what it completed last is taken.
    fn leave_slot(&mut self, id: FwQueueId, r: &QueueRegs, irqs: &mut Irqs, fences: &Fences) {
        self.hw_slot = None;
        self.take_regs(r);
        take_completed(self, id, r.completed, irqs, fences);
    }

    /// Takes back the registers a slot returned.
    fn take_regs(&mut self, r: &QueueRegs) {
        self.ring.rptr = r.rptr;
        self.ring.wptr = r.wptr;
        self.ring.queued = r.queued;
        self.ring.ib = r.ib.map(|ib| IbCursor { va: ib.va, dwords: ib.dwords, pos: ib.pos, vmid: ib.vmid });
        self.bulk_done = r.bulk_done;
        self.dispatch_active = r.dispatch_active;
        self.at_cb_boundary = r.at_cb_boundary;
        self.wait_observed = r.wait_observed;
        self.live = None;
    }

    /// The image a slot loads.
    fn image(&self, id: FwQueueId) -> QueueImage<'_> {
        QueueImage {
            queue: id,
            vmid: self.cfg.vmid,
            ring: (&self.ring.mem.shm, self.ring.mem.offset),
            ring_va: self.cfg.ring_va,
            ring_bytes: self.cfg.ring_bytes,
            rptr_word: &self.ring.rptr_word,
            wptr_word: &self.ring.wptr_word,
            last_queued_word: self.ring.last_queued_word.as_ref(),
            completed_word: self.cfg.kernel_page.progress_completed(),
            fence_logs: self.cfg.fence_logs.as_ref(),
            context_save: &self.cfg.context_save,
            privileged: self.cfg.privileged,
            regs: QueueRegs::of(self),
        }
    }
}

impl Firmware {
    /// [`Firmware::step`] on a device whose slots are hardware.
    pub(super) fn step_hardware(&mut self, clock: &dyn Fn() -> Time, vms: &[Option<AddressSpace>]) -> StepReport {
        let now = clock();
        let since_last = now.0.saturating_sub(self.last_step.0);
        self.last_step = now;
        let mut report = StepReport::default();
        let Some(hw) = self.hw.as_mut() else { return report };
        // A slot runs its queue by itself between steps: a queue loaded, with work and not
        // blocked in a `WAIT` as of the last step ran all the time since (`FwQueue::run_ns`).
        for id in hw.slots.iter().flatten().filter_map(|s| s.queue) {
            if let Ok(q) = self.queues.get_mut(id.0)
                && q.pending
                && !q.blocked
                && q.state == QueueState::Mapped
            {
                q.run_ns = q.run_ns.saturating_add(since_last);
            }
        }
        // Address spaces the hardware has not seen as they are (a vm_mut the hardware was not
        // told of cannot happen: its guard tells it; this catches spaces created since).
        for (k, vm) in vms.iter().enumerate() {
            hw.push_space(Vmid(k as u32), vm.as_ref());
        }
        let mut events = std::mem::take(&mut hw.events);
        let more = hw.dev.poll(now, &mut events);
        for ev in events.drain(..) {
            self.apply_event(ev, now, vms);
        }
        self.read_progress(&mut report, false);
        let Firmware { engines, queues, quanta, log, fences, hw, .. } = self;
        let Some(hw) = hw.as_mut() else { return report };
        hw.events = events;
        for e in engines.iter_mut() {
            let slots = &mut hw.slots[e.id.0 as usize];
            if e.power.is_on() {
                step::wake_sleepers(e, queues, vms, fences.epoch);
                schedule::schedule(e, queues, now, *quanta, log);
                let stop = e.stop;
                report.hardware += reconcile(e, slots, queues, hw.dev.as_mut(), log, now, stop);
            }
            report.hardware += slots.iter().filter(|s| s.leaving).count() as u32;
            let busy = slots
                .iter()
                .filter_map(|s| s.queue)
                .filter(|id| queues.get(id.0).is_ok_and(|q| q.pending && q.state != QueueState::Hung))
                .count() as u32;
            report.runnable += busy;
            if busy > 0 || !e.waiting.is_empty() {
                e.busy_at(now);
            }
        }
        report.hardware += more as u32;
        report
    }

    /// Applies one slot's report.
    fn apply_event(&mut self, ev: HwEvent, now: Time, vms: &[Option<AddressSpace>]) {
        let optimized = self.fences.optimized;
        let Firmware { engines, queues, irqs, log, fences, hw, compute, .. } = self;
        let Some(hw) = hw.as_mut() else { return };
        if hw.slots.get(ev.engine.0 as usize).and_then(|s| s.get(ev.slot as usize)).is_none() {
            return;
        }
        if matches!(ev.kind, HwEventKind::Stopped { .. } | HwEventKind::Fault { .. }) {
            // Its last work is counted now: an empty slot is not read.
            let p = hw.dev.progress(ev.engine, ev.slot);
            let mut report = StepReport::default();
            hw.count(ev.engine.0 as usize, ev.slot as usize, &p, &mut report, compute);
        }
        let slot = &mut hw.slots[ev.engine.0 as usize][ev.slot as usize];
        let Some(id) = slot.queue else { return };
        let Some(e) = engines.get_mut(ev.engine.0 as usize) else { return };
        let Ok(q) = queues.get_mut(id.0) else {
            // Removed meanwhile: only its slot's answer matters.
            if matches!(ev.kind, HwEventKind::Stopped { .. } | HwEventKind::Fault { .. }) {
                *slot = HwSlot::default();
            }
            return;
        };
        match ev.kind {
            HwEventKind::Idle => {
                q.blocked = false;
                if let Some(r) = hw.dev.progress(ev.engine, ev.slot).regs {
                    q.ring.rptr = r.rptr.max(q.ring.rptr);
                }
                if q.pending && !q.ring.has_work() {
                    q.pending = false;
                    e.resched = true;
                    sync_waiting(e, q, id);
                }
            }
            HwEventKind::Busy => {
                q.blocked = false;
                q.wait_on = None;
                mark_pending(e, q, id);
            }
            HwEventKind::Blocked { vmid, va, value } => {
                q.blocked = true;
                q.wait_on = Some(WaitOn { vmid, va, value, park: false });
                e.resched = true;
                mark_pending(e, q, id);
            }
            HwEventKind::User { id: user } => irqs.push_back((Time::ZERO, Interrupt::User { queue: id, id: user })),
            HwEventKind::Signaled { vmid, va, value } => {
                // The device wrote memory another queue may wait on.
                fences.changed();
                let fence = vms
                    .get(vmid.0 as usize)
                    .and_then(Option::as_ref)
                    .and_then(|vm| vm.translate_aligned(va, 8, Access::Read).ok())
                    .and_then(|r| fences.get(&(r.shm.id(), r.offset)));
                if let Some(f) = fence {
                    // Spec 002's last step, on the engine's behalf: the value was stored (and
                    // logged) before the event was written; barrier, then the MonitoredValue.
                    std::sync::atomic::fence(Ordering::SeqCst);
                    if value > f.monitored.get().load(Ordering::Relaxed) {
                        let which = if optimized && q.cfg.fence_logs.is_some() {
                            FenceSignaled::Queues(vec![id])
                        } else {
                            FenceSignaled::Fences(vec![f.id])
                        };
                        irqs.push_back((Time::ZERO, Interrupt::NativeFenceSignaled(which)));
                    }
                }
            }
            HwEventKind::Fault { record, regs } => {
                *slot = HwSlot::default();
                q.leave_slot(id, &regs, irqs, fences);
                exec::fault(q, record.clone());
                irqs.push_back((Time::ZERO, Interrupt::QueueFault { queue: id, fault: record }));
                e.resched = true;
                // A preemption it owed is answered: it stopped (hung).
                if q.preempt.request.is_some() {
                    preempt::finish(e, q, id, StopPoint::Idle, now, log, Some(&mut *irqs));
                }
                sync_waiting(e, q, id);
            }
            HwEventKind::Stopped { point, regs } => {
                *slot = HwSlot::default();
                q.leave_slot(id, &regs, irqs, fences);
                if let Some(point) = point
                    && q.preempt.request.is_some()
                {
                    preempt::finish(e, q, id, point, now, log, Some(&mut *irqs));
                } else if q.state != QueueState::Hung && q.ring.has_work() {
                    // Off its slot with work (powering down, a request withdrawn): it is
                    // loaded again when its engine runs and it holds a slot.
                    mark_pending(e, q, id);
                }
                e.resched = true;
            }
        }
    }

    /// Reads each loaded queue's progress: rptr, the validated wptr, and its completed value
    /// (with the interrupts that raises); and counts what the slots executed. Only slots with a
    /// queue are read (each read is a few cache lines the device writes): an empty slot
    /// executes nothing, and a queue's last work is counted when it leaves
    /// ([`HwSide::count`]).
    pub(super) fn read_progress(&mut self, report: &mut StepReport, whole: bool) {
        let Firmware { queues, irqs, fences, hw, compute, .. } = self;
        let Some(hw) = hw.as_mut() else { return };
        hw.steps += 1;
        let whole = whole || hw.steps.is_multiple_of(STATUS_EVERY) || hw.dev.status_every_step();
        for e in 0..hw.slots.len() {
            for k in 0..hw.slots[e].len() {
                let Some(id) = hw.slots[e][k].queue else { continue };
                let Ok(q) = queues.get_mut(id.0) else { continue };
                if q.state == QueueState::Hung {
                    continue;
                }
                let regs = if whole {
                    let p = hw.dev.progress(EngineId(e as u32), k as u32);
                    hw.count(e, k, &p, report, compute);
                    p.regs
                } else {
                    None
                };
                // The progress value from the queue's kernel page, which the engine writes as
                // it completes command buffers (the client may only read it): the interrupts it
                // raises do not wait for the slot to publish its status.
                // Acquire: pairs with the engine's release of the value.
                let done = q.cfg.kernel_page.progress_completed().get().load(Ordering::Acquire);
                take_completed(q, id, done, irqs, fences);
                let Some(regs) = regs else { continue };
                q.ring.rptr = q.ring.rptr.max(regs.rptr);
                q.ring.wptr = q.ring.wptr.max(regs.wptr);
                q.ring.queued = q.ring.queued.max(regs.queued);
            }
        }
    }

    /// Aborts (`abort`) or stops (with every point allowed) the slots of `targets` and waits
    /// for their answers, applying them: for a reset or a removal, which must not return while
    /// the hardware may still run the queue. A slot that does not answer in time counts as
    /// lost: its queue hangs with [`FaultKind::DeviceLost`].
    pub(super) fn hw_quiesce(&mut self, targets: &[FwQueueId], abort: bool, now: Time, vms: &[Option<AddressSpace>]) {
        let Firmware { queues, engines, hw, .. } = self;
        let Some(hw) = hw.as_mut() else { return };
        let mut waiting = Vec::new();
        for &id in targets {
            let Ok(q) = queues.get(id.0) else { continue };
            let Some(slot) = q.hw_slot else { continue };
            let engine = q.cfg.engine;
            let Some(s) = hw.slots.get_mut(engine.0 as usize).and_then(|s| s.get_mut(slot as usize)) else { continue };
            let cmd = if abort {
                HwCommand::Abort { engine, slot }
            } else {
                let kind = engines.get(engine.0 as usize).map_or(EngineKind::Compute, |e| e.kind);
                // Every point allowed: a reset takes the queue wherever it stands.
                let finest = abi::preempt::PreemptionCaps {
                    compute: abi::preempt::ComputeGranularity::Shader,
                    copy: abi::preempt::CopyGranularity::Chunk,
                };
                HwCommand::Stop { engine, slot, rule: Engine::stop_rule(kind, finest) }
            };
            if hw.dev.command(cmd).is_ok() {
                s.leaving = true;
                waiting.push((engine, slot));
            }
        }
        let deadline = std::time::Instant::now() + QUIESCE_TIMEOUT;
        // Every event polled meanwhile is applied below, in the order it came (earlier events
        // of a slot before its answer).
        let mut events = Vec::new();
        while !waiting.is_empty() && std::time::Instant::now() < deadline {
            let seen = events.len();
            hw.dev.poll(now, &mut events);
            for ev in &events[seen..] {
                if matches!(ev.kind, HwEventKind::Stopped { .. } | HwEventKind::Fault { .. }) {
                    waiting.retain(|&(e, s)| (e, s) != (ev.engine, ev.slot));
                }
            }
            std::hint::spin_loop();
        }
        let lost = waiting;
        for ev in events {
            self.apply_event(ev, now, vms);
        }
        // A slot that never answered: the hardware is gone; its queue is lost with it.
        let Firmware { queues, hw, .. } = self;
        let Some(hw) = hw.as_mut() else { return };
        for (engine, slot) in lost {
            let s = &mut hw.slots[engine.0 as usize][slot as usize];
            if let Some(id) = s.queue.take()
                && let Ok(q) = queues.get_mut(id.0)
            {
                q.hw_slot = None;
                preempt::hang(q, FaultKind::DeviceLost);
            }
            s.leaving = false;
        }
    }

    /// Tells the hardware that address space `vmid` changed (a mapping added or removed), or
    /// is gone (`None`), before the kernel's call returns to anyone who could submit work
    /// using it.
    pub(crate) fn address_space_changed(&mut self, vmid: Vmid, vm: Option<&AddressSpace>) {
        if let Some(hw) = self.hw.as_mut() {
            hw.push_space(vmid, vm);
        }
    }

    /// Tells the hardware of a native fence registered (`Some(id)`) or gone (`None`).
    pub(super) fn hw_fence(&mut self, region: &Shm, offset: u64, id: Option<u64>) {
        if let Some(hw) = self.hw.as_mut() {
            let _ = hw.dev.command(HwCommand::NativeFence { region, offset, id });
        }
    }

    /// Tells the hardware that a loaded queue's fence log was replaced.
    pub(super) fn hw_fence_log(&mut self, id: FwQueueId, index: usize) {
        let Firmware { queues, hw, .. } = self;
        let (Some(hw), Ok(q)) = (hw.as_mut(), queues.get(id.0)) else { return };
        if let (Some(slot), Some(logs)) = (q.hw_slot, q.cfg.fence_logs.as_ref()) {
            let _ = hw.dev.command(HwCommand::FenceLog { engine: q.cfg.engine, slot, index, log: &logs[index] });
        }
    }

    /// Whether a device's slots are hardware, and which.
    pub(crate) fn hardware_name(&self) -> Option<String> {
        self.hw.as_ref().map(HwSide::name)
    }

    /// The queues loaded in slots of `engine` (for a reset or powering down).
    pub(super) fn loaded_on(&self, engine: EngineId) -> Vec<FwQueueId> {
        self.hw
            .as_ref()
            .and_then(|hw| hw.slots.get(engine.0 as usize))
            .map(|s| s.iter().filter_map(|s| s.queue).collect())
            .unwrap_or_default()
    }

    /// Every loaded queue.
    pub(super) fn loaded(&self) -> Vec<FwQueueId> {
        self.hw.as_ref().map(|hw| hw.slots.iter().flatten().filter_map(|s| s.queue).collect()).unwrap_or_default()
    }
}

/// A loaded queue completed progress value `value`: above the monitored value it raises the
/// progress interrupt, and when the kernel registered the progress word as a native fence, the
/// fence's conditional interrupt (spec 002 "native progress fence"). One interrupt for what
/// completed since the last look: the hardware's completions are coalesced, as an EOP
/// interrupt's are.
fn take_completed(q: &mut FwQueue, id: FwQueueId, value: u64, irqs: &mut Irqs, fences: &Fences) {
    if value <= q.completed {
        return;
    }
    q.completed = value;
    let word = q.cfg.kernel_page.progress_completed();
    if let shm::Region::Shm(s) = word.region()
        && let Some(f) = fences.get(&(s.id(), word.offset()))
    {
        std::sync::atomic::fence(Ordering::SeqCst);
        if value > f.monitored.get().load(Ordering::Relaxed) {
            irqs.push_back((Time::ZERO, Interrupt::NativeFenceSignaled(FenceSignaled::Fences(vec![f.id]))));
        }
    }
    if value > q.monitored {
        irqs.push_back((Time::ZERO, Interrupt::ProgressFence { queue: id, value }));
    }
}

/// Brings `e`'s slots in line with its scheduling: a loaded queue that must leave is told to
/// stop (or, hung or gone, to abort); a holder not loaded yet goes into a free slot. Returns
/// the commands it gave.
fn reconcile(
    e: &mut Engine,
    slots: &mut [HwSlot],
    queues: &mut Slab<FwQueue>,
    dev: &mut dyn Hardware,
    log: &mut FwLog,
    now: Time,
    stop: Stop,
) -> u32 {
    let mut sent = 0;
    for (k, s) in slots.iter_mut().enumerate() {
        let Some(id) = s.queue else { continue };
        if s.leaving {
            continue;
        }
        let cmd = match queues.get(id.0) {
            Ok(q) if q.state == QueueState::Hung => HwCommand::Abort { engine: e.id, slot: k as u32 },
            Ok(q) if q.preempt.request.is_some() || q.state != QueueState::Mapped || !e.hqd.contains(&id) => {
                HwCommand::Stop { engine: e.id, slot: k as u32, rule: stop }
            }
            Ok(_) => continue,
            Err(_) => HwCommand::Abort { engine: e.id, slot: k as u32 },
        };
        if dev.command(cmd).is_ok() {
            s.leaving = true;
            sent += 1;
        }
    }
    for h in 0..e.hqd.len() {
        let id = e.hqd[h];
        let Ok(q) = queues.get_mut(id.0) else { continue };
        if q.hw_slot.is_some() || q.state != QueueState::Mapped || q.preempt.request.is_some() {
            continue;
        }
        let Some(k) = slots.iter().position(|s| s.queue.is_none()) else { break };
        if let Some(point) = q.preempt.saved.take() {
            log.push(now, FwEvent::Restored { queue: id, point });
        }
        q.sched.last_run = now;
        if dev.command(HwCommand::Load { engine: e.id, slot: k as u32, queue: q.image(id), now }).is_ok() {
            slots[k] = HwSlot { queue: Some(id), leaving: false };
            q.hw_slot = Some(k as u32);
            sent += 1;
        }
    }
    sent
}
