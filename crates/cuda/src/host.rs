//! The host's side of the slot protocol (`device/layout.cuh`): a [`gpu::hw::Hardware`] whose
//! slots are the engine program's, on a GPU or emulated.
//!
//! [`Slots`] owns the shared memory (every slot's command block, status block and event ring,
//! the address-space directory and tables, the native-fence table), turns the firmware's
//! commands into writes of it, and turns what the slots write back into
//! [`gpu::hw::HwEvent`]s. What differs between a GPU and the emulator — where memory comes
//! from, how the program runs, how the host waits for a slot — is a [`Backing`].
//!
//! Invariants:
//! - one command at a time per slot: a command is written only once the slot acknowledged
//!   the previous one ([`Backing::settle`]), so none is overwritten unseen;
//! - a loaded queue's memory (ring, pointers, save area, fence logs) is kept alive by the
//!   slot's [`Keep`] until the slot's answer that it left; every CPU mapping the device may
//!   reach stays registered and mapped while the device lives;
//! - events are taken in each slot's order, and an event about a queue the slot no longer
//!   holds (a load's stray answer) is dropped.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use abi::EngineId;
use abi::EngineKind;
use abi::preempt::Stop;
use abi::queue::FaultRecord;
use gpu::hw::{Hardware, HwCommand, HwError, HwEvent, HwEventKind, QueueImage, QueueRegs, SlotProgress};
use gpu::{AddressSpace, Time, Vmid};
use shm::{DmaArea, Shm};

use crate::layout::{self, Event, FenceSlot, Globals, Mqd, Regs, SlotCtl, SlotStatus, VmDir, VmEntry, at};
use crate::shared::SharedBuf;

/// Where the slots' memory comes from and how their program runs: a GPU or the emulator.
pub trait Backing: Send + 'static {
    /// What it is ("NVIDIA H200", "emulated").
    fn name(&self) -> String;
    /// `bytes` zeroed bytes both the host and the program reach.
    fn shared(&mut self, bytes: usize) -> Result<SharedBuf, HwError>;
    /// `bytes` bytes only the program reaches (its program caches and registers): the
    /// device address.
    fn private(&mut self, bytes: usize) -> Result<u64, HwError>;
    /// Registers a CPU mapping for the program to reach by DMA; the device address of its
    /// first byte.
    fn register(&mut self, area: &DmaArea) -> Result<u64, HwError>;
    /// Starts the program on `slots` slots, reading `globals`.
    fn start(&mut self, globals: &SharedBuf, slots: u32) -> Result<(), HwError>;
    /// Lets the program run (the emulator steps each slot whose flag in `active` is set; a
    /// GPU runs by itself). Returns whether a slot may have more to do now.
    fn run(&mut self, globals: &SharedBuf, active: &[bool]) -> bool;
    /// Runs slot `slot` (the emulator) or waits for it (a GPU) a little, until it has
    /// acknowledged command `seq` (its status's `ack`): `true` if it has, `false` if not yet
    /// (the host drains the slot's events, which may be what it waits for, and asks again); an
    /// error if the program is gone.
    fn settle(&mut self, globals: &SharedBuf, status: &SharedBuf, slot: u32, seq: u64) -> Result<bool, HwError>;
    /// The program's clock now (ns): the GPU's global timer, or the host's monotonic clock.
    fn device_time_ns(&self) -> u64;
    /// How long a slot keeps a queue that consumed everything reported busy before it reports
    /// it idle (ns): a queue a client keeps feeding is not reported idle and busy again for
    /// every command buffer. 0: at once (the deterministic emulator, whose runs must not
    /// depend on the wall clock).
    fn idle_after_ns(&self) -> u64;
    /// Ends the program (the slots stop at their next step).
    fn stop(&mut self, globals: &SharedBuf);
    /// Whether its slots run in the host's polls (deterministic: the firmware reads their
    /// whole status at every step).
    fn stepped(&self) -> bool {
        false
    }
}

/// What keeps a loaded queue's memory alive until its slot says it left.
struct Keep {
    _ring: Arc<Shm>,
    _save: Arc<Shm>,
    _logs: Option<[Arc<Shm>; 2]>,
    _words: Vec<DmaArea>,
}

/// One address space's tables: two buffers used in turn (the slot may be reading the other).
#[derive(Default)]
struct VmTables {
    bufs: [Option<SharedBuf>; 2],
    which: usize,
    /// The regions its current mappings are in, alive while the device may reach them.
    keep: Vec<Arc<Shm>>,
    /// Buffers outgrown, kept for a slot that may still be reading them.
    retired: Vec<SharedBuf>,
}

/// The native-fence table (open addressing, linear probing; a seqlock over it).
struct FenceTable {
    buf: SharedBuf,
    cap: usize,
    ids: HashMap<u64, u64>,
    retired: Vec<SharedBuf>,
}

/// The slot engines of one device: see the module docs.
pub struct Slots<B: Backing> {
    b: B,
    globals: SharedBuf,
    ctl: SharedBuf,
    status: SharedBuf,
    events: SharedBuf,
    vm_dir: SharedBuf,
    fences: Option<FenceTable>,
    vms: Vec<VmTables>,
    areas: HashMap<usize, (DmaArea, u64)>,
    engines: Vec<EngineKind>,
    per_engine: u32,
    /// Per slot: the last command written, the load in it (0: none), events taken.
    seq: Vec<u64>,
    load: Vec<u64>,
    taken: Vec<u64>,
    keep: Vec<Option<Keep>>,
    /// Events taken while waiting for a slot (delivered at the next poll).
    pending: Vec<HwEvent>,
}

/// How long the host waits for a slot to take a command before it counts the device lost.
const SETTLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

const CTL: usize = size_of::<SlotCtl>();
const STATUS: usize = size_of::<SlotStatus>();
const EVENT: usize = size_of::<Event>();

fn failed(what: impl ToString) -> HwError {
    HwError::Failed(what.to_string())
}

impl<B: Backing> Slots<B> {
    /// Slot engines on `b` (attached by [`Hardware::attach`]).
    pub fn new(mut b: B) -> Result<Slots<B>, HwError> {
        let page = 4096;
        let globals = b.shared(size_of::<Globals>().next_multiple_of(page))?;
        let ctl = b.shared(page)?;
        let status = b.shared(page)?;
        let events = b.shared(page)?;
        let vm_dir = b.shared(layout::MAX_VMIDS as usize * size_of::<VmDir>())?;
        Ok(Slots {
            b,
            globals,
            ctl,
            status,
            events,
            vm_dir,
            fences: None,
            vms: Vec::new(),
            areas: HashMap::new(),
            engines: Vec::new(),
            per_engine: 0,
            seq: Vec::new(),
            load: Vec::new(),
            taken: Vec::new(),
            keep: Vec::new(),
            pending: Vec::new(),
        })
    }

    /// The backing.
    pub fn backing(&self) -> &B {
        &self.b
    }

    fn index(&self, engine: EngineId, slot: u32) -> Result<usize, HwError> {
        if (engine.0 as usize) < self.engines.len() && slot < self.per_engine {
            Ok((engine.0 * self.per_engine + slot) as usize)
        } else {
            Err(HwError::NoSlot { engine: engine.0, slot })
        }
    }

    /// The device address of CPU address `addr`, which lies in mapping `area`, registering
    /// the mapping the first time. (Mappings are keyed by their CPU address: two live ones
    /// never share one, and `areas` keeps each registered one alive.)
    fn dev_of(&mut self, area: &DmaArea, addr: usize) -> Result<u64, HwError> {
        let base = match self.areas.get(&area.addr()) {
            Some((_, dev)) => *dev,
            None => {
                let dev = self.b.register(area)?;
                self.areas.insert(area.addr(), (area.clone(), dev));
                dev
            }
        };
        Ok(base + (addr - area.addr()) as u64)
    }

    /// The device address of byte `offset` of region `shm`.
    fn dev_of_shm(&mut self, shm: &Shm, offset: u64) -> Result<u64, HwError> {
        let map = shm.map();
        self.dev_of(&map.dma_area(), map.addr() + offset as usize)
    }

    /// Whether slot `i` has not acknowledged the last command written to it yet.
    fn owes_ack(&self, i: usize) -> bool {
        // Acquire: pairs with the slot's release of its acknowledgement.
        self.status.word(at!(SlotStatus[i].ack)).load(Ordering::Acquire) < self.seq[i]
    }

    /// Waits until slot `i` took the last command written to it: its block may be rewritten.
    fn ready(&mut self, i: usize) -> Result<(), HwError> {
        if self.owes_ack(i) {
            self.settle(i, self.seq[i])?;
        }
        Ok(())
    }

    /// Writes a command to slot `i`, once the slot took the last one.
    fn send(&mut self, i: usize, cmd: u32, stop: u32) -> Result<u64, HwError> {
        self.ready(i)?;
        // cmd and stop share one 8-byte word (the slot reads it whole).
        self.ctl.word(at!(SlotCtl[i].cmd)).store(cmd as u64 | (stop as u64) << 32, Ordering::Relaxed);
        let seq = self.seq[i] + 1;
        // Release: the command word and the MQD written before are visible to a slot that
        // acquires the new sequence.
        self.ctl.word(at!(SlotCtl[i].seq)).store(seq, Ordering::Release);
        self.seq[i] = seq;
        Ok(seq)
    }

    /// Waits until slot `i` acknowledged command `seq`, taking its events meanwhile (a slot
    /// whose event ring is full waits for the host before it can look at a command).
    fn settle(&mut self, i: usize, seq: u64) -> Result<(), HwError> {
        let deadline = std::time::Instant::now() + SETTLE_TIMEOUT;
        loop {
            self.take_events(i);
            if self.b.settle(&self.globals, &self.status, i as u32, seq)? {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                return Err(failed(format!("slot {i} did not take command {seq} within {SETTLE_TIMEOUT:?}")));
            }
        }
    }

    /// Moves slot `i`'s new events to `pending`.
    fn take_events(&mut self, i: usize) {
        let written = self.status.word(at!(SlotStatus[i].events_written)).load(Ordering::Acquire);
        let engine = EngineId(i as u32 / self.per_engine);
        let slot = i as u32 % self.per_engine;
        while self.taken[i] < written {
            let n = self.taken[i];
            let k = i * layout::SLOT_EVENTS as usize + (n % layout::SLOT_EVENTS) as usize;
            // Acquire: pairs with the slot's release of the event's sequence, stored last.
            if self.events.word(at!(Event[k].seq)).load(Ordering::Acquire) != n + 1 {
                break; // not complete yet (the slot writes the count after the event)
            }
            let e: Event = self.events.get(k * EVENT);
            self.taken[i] = n + 1;
            if e.load != self.load[i] {
                continue; // about a queue this slot no longer holds
            }
            if let Some(kind) = self.event_kind(i, &e) {
                if matches!(kind, HwEventKind::Stopped { .. } | HwEventKind::Fault { .. }) {
                    self.load[i] = 0;
                    self.keep[i] = None;
                }
                self.pending.push(HwEvent { engine, slot, kind });
            }
        }
        // Release: the host is done reading the events below; the slot may write there.
        self.ctl.word(at!(SlotCtl[i].events_read)).store(self.taken[i], Ordering::Release);
    }

    fn regs_of(&self, i: usize) -> QueueRegs {
        let st: SlotStatus = self.status.get(i * STATUS);
        regs_from(&st.regs)
    }

    fn event_kind(&self, i: usize, e: &Event) -> Option<HwEventKind> {
        Some(match e.kind {
            layout::ev::IDLE => HwEventKind::Idle,
            layout::ev::BUSY => HwEventKind::Busy,
            layout::ev::BLOCKED => HwEventKind::Blocked { vmid: Vmid(e.a32), va: e.a, value: e.b },
            layout::ev::USER => HwEventKind::User { id: e.a32 },
            layout::ev::SIGNALED => HwEventKind::Signaled { vmid: Vmid(e.a32), va: e.a, value: e.b },
            layout::ev::FAULT => HwEventKind::Fault {
                record: FaultRecord {
                    kind: crate::fault::decode(&e.fault),
                    rptr: e.a,
                    opcode: e.a32.checked_sub(1).and_then(|op| abi::packet::Opcode::from_u8(op as u8)),
                    in_indirect: e.b != 0,
                },
                regs: self.regs_of(i),
            },
            layout::ev::STOPPED if e.fault.kind != 0 => HwEventKind::Fault {
                // The state could not be saved (the save area is checked at queue creation).
                record: FaultRecord {
                    kind: crate::fault::decode(&e.fault),
                    rptr: e.a,
                    opcode: None,
                    in_indirect: false,
                },
                regs: self.regs_of(i),
            },
            layout::ev::STOPPED => {
                // An abort's answer (ev::ABORTED) names no point.
                let point = layout::STOP_POINTS.iter().find(|&&(_, sp)| sp == e.a32).map(|&(p, _)| p);
                HwEventKind::Stopped { point, regs: self.regs_of(i) }
            }
            _ => return None,
        })
    }

    /// Builds the MQD of `q` and writes it into slot `i`'s command block.
    fn write_load(&mut self, i: usize, q: &QueueImage<'_>, compute: bool, now: Time) -> Result<(), HwError> {
        let word = |s: &mut Self, w: &shm::Word| -> Result<u64, HwError> {
            let (addr, area) = w.dma().ok_or_else(|| failed("a queue word in a doorbell page"))?;
            s.dev_of(&area, addr)
        };
        let ring = self.dev_of_shm(q.ring.0, q.ring.1)?;
        let rptr_word = word(self, q.rptr_word)?;
        let wptr_word = word(self, q.wptr_word)?;
        let last_queued_word = match q.last_queued_word {
            Some(w) => word(self, w)?,
            None => 0,
        };
        let completed_word = word(self, q.completed_word)?;
        let save_area = self.dev_of_shm(q.context_save, 0)?;
        let mut logs = [0u64; 2];
        if let Some(l) = q.fence_logs {
            for (k, log) in l.iter().enumerate() {
                logs[k] = self.log_word(log)?;
            }
        }
        let mut flags = 0;
        if q.privileged {
            flags |= layout::mqd::PRIVILEGED;
        }
        if compute {
            flags |= layout::mqd::COMPUTE;
        }
        if q.last_queued_word.is_some() {
            flags |= layout::mqd::LAST_QUEUED;
        }
        let mqd = Mqd {
            ring,
            ring_va: q.ring_va,
            ring_bytes: q.ring_bytes,
            rptr_word,
            wptr_word,
            last_queued_word,
            completed_word,
            save_area,
            save_bytes: q.context_save.len() as u64,
            clock_offset: now.0 as i64 - self.b.device_time_ns() as i64,
            vmid: q.vmid.0,
            flags,
            regs: regs_to(&q.regs),
        };
        for (k, log) in logs.iter().enumerate() {
            self.ctl.put(at!(SlotCtl[i].fence_log) + 8 * k, log);
        }
        self.ctl.put(at!(SlotCtl[i].mqd), &mqd);
        let mut words = Vec::new();
        for w in
            [Some(q.rptr_word), Some(q.wptr_word), q.last_queued_word, Some(q.completed_word)].into_iter().flatten()
        {
            if let Some((_, area)) = w.dma() {
                words.push(area);
            }
        }
        self.keep[i] = Some(Keep {
            _ring: q.ring.0.clone(),
            _save: q.context_save.clone(),
            _logs: q.fence_logs.cloned(),
            _words: words,
        });
        Ok(())
    }

    /// A fence log as the slot reads it: its device address | its entry count << 48.
    fn log_word(&mut self, log: &Arc<Shm>) -> Result<u64, HwError> {
        let entries = abi::fence_log::entries_in(log.len() as u64);
        if entries > 0xffff {
            return Err(HwError::Unsupported(format!("a fence log of {entries} entries (at most 65535)")));
        }
        let dev = self.dev_of_shm(log, 0)?;
        if dev > layout::LOG_ADDR_MASK {
            return Err(HwError::Unsupported(format!("a fence log at device address {dev:#x} (below 2^48)")));
        }
        Ok(dev | (entries as u64) << 48)
    }

    /// Rewrites address space `vmid`'s table (seqlock: the directory entry is odd while it
    /// changes, and a slot that read it meanwhile reads again).
    fn write_vm(&mut self, vmid: Vmid, vm: Option<&AddressSpace>) -> Result<(), HwError> {
        let k = vmid.0 as usize;
        if k >= layout::MAX_VMIDS as usize {
            return Err(HwError::Unsupported(format!("address space {k} (at most {})", layout::MAX_VMIDS)));
        }
        if self.vms.len() <= k {
            self.vms.resize_with(k + 1, VmTables::default);
        }
        let mut entries = Vec::new();
        let mut keep = Vec::new();
        if let Some(vm) = vm {
            for m in vm.mappings() {
                let dev = self.dev_of_shm(&m.shm, m.offset)?;
                entries.push(VmEntry {
                    va: m.va,
                    bytes: m.bytes,
                    dev,
                    flags: if m.writable { layout::VM_WRITABLE } else { 0 },
                });
                keep.push(m.shm.clone());
            }
        }
        let bytes = (entries.len().max(1) * size_of::<VmEntry>()).next_multiple_of(4096);
        let t = &mut self.vms[k];
        let next = 1 - t.which;
        if t.bufs[next].as_ref().is_none_or(|b| b.len() < bytes) {
            let fresh = self.b.shared(bytes * 2)?;
            let t = &mut self.vms[k];
            if let Some(old) = t.bufs[next].replace(fresh) {
                t.retired.push(old);
            }
        }
        let t = &mut self.vms[k];
        let buf = t.bufs[next].as_ref().expect("allocated above");
        let seq = self.vm_dir.word(at!(VmDir[k].seq));
        let s = seq.load(Ordering::Relaxed);
        // Odd: the entry is being rewritten. SeqCst orders it before the writes below for a
        // slot that reads the table after it (the slot re-reads the word after copying).
        seq.store(s + 1, Ordering::SeqCst);
        for (n, e) in entries.iter().enumerate() {
            buf.put(n * size_of::<VmEntry>(), e);
        }
        let table = if vm.is_some() { buf.dev() } else { 0 };
        self.vm_dir.word(at!(VmDir[k].table)).store(table, Ordering::Relaxed);
        // `count`, and the padding after it (one word).
        self.vm_dir.word(at!(VmDir[k].count)).store(entries.len() as u64, Ordering::Relaxed);
        // Release: the table and its pointer are visible to a slot that acquires the even
        // value.
        seq.store(s + 2, Ordering::Release);
        t.which = next;
        t.keep = keep;
        Ok(())
    }

    /// Registers (`Some(id)`) or removes a native fence whose CurrentValue is at `key`.
    fn write_fence(&mut self, key: u64, id: Option<u64>) -> Result<(), HwError> {
        let Some(f) = self.fences.as_mut() else { return Ok(()) };
        match id {
            Some(id) => {
                f.ids.insert(key, id);
            }
            None => {
                f.ids.remove(&key);
            }
        }
        let need = (f.ids.len() * 2).next_power_of_two().max(1024);
        if need > f.cap {
            let fresh = self.b.shared(need * size_of::<FenceSlot>())?;
            let f = self.fences.as_mut().expect("present");
            let old = std::mem::replace(&mut f.buf, fresh);
            f.retired.push(old);
            f.cap = need;
        }
        let f = self.fences.as_ref().expect("present");
        // The whole table is rebuilt under the seqlock (fences come and go rarely: with a
        // process's setup and teardown).
        let seq = self.globals.word(at!(Globals.fence_seq));
        let s = seq.load(Ordering::Relaxed);
        seq.store(s + 1, Ordering::SeqCst);
        f.buf.zero(0, f.cap * size_of::<FenceSlot>());
        let mask = f.cap - 1;
        for (&k, &v) in &f.ids {
            let mut at = layout::fence_hash(k) as usize & mask;
            while f.buf.get::<u64>(at * size_of::<FenceSlot>()) != 0 {
                at = (at + 1) & mask;
            }
            f.buf.put(at * size_of::<FenceSlot>(), &FenceSlot { key: k, id: v });
        }
        self.globals.word(at!(Globals.fence_table)).store(f.buf.dev(), Ordering::Relaxed);
        // `vm_count` and `fence_mask` share one word.
        self.globals
            .word(at!(Globals.vm_count))
            .store(layout::MAX_VMIDS as u64 | (mask as u64) << 32, Ordering::Relaxed);
        // Release: the table is visible to a slot that acquires the even value.
        seq.store(s + 2, Ordering::Release);
        Ok(())
    }
}

fn regs_to(r: &QueueRegs) -> Regs {
    let mut flags = 0;
    let mut out = Regs { rptr: r.rptr, wptr: r.wptr, queued: r.queued, completed: r.completed, ..Default::default() };
    if let Some(ib) = r.ib {
        flags |= layout::reg::IB;
        out.ib_va = ib.va;
        out.ib_dwords = ib.dwords;
        out.ib_pos = ib.pos;
        if let Some(v) = ib.vmid {
            flags |= layout::reg::IB_VMID;
            out.ib_vmid = v.0;
        }
    }
    if let Some(done) = r.bulk_done {
        flags |= layout::reg::BULK;
        out.bulk_done = done;
    }
    if r.dispatch_active {
        flags |= layout::reg::DISPATCH;
    }
    if r.at_cb_boundary {
        flags |= layout::reg::CB_BOUNDARY;
    }
    if let Some(t) = r.wait_observed {
        flags |= layout::reg::WAIT_OBSERVED;
        out.wait_observed = t.0;
    }
    out.flags = flags;
    out
}

fn regs_from(r: &Regs) -> QueueRegs {
    let f = r.flags;
    QueueRegs {
        rptr: r.rptr,
        wptr: r.wptr,
        queued: r.queued,
        completed: r.completed,
        ib: (f & layout::reg::IB != 0).then(|| gpu::hw::IndirectPosition {
            va: r.ib_va,
            dwords: r.ib_dwords,
            pos: r.ib_pos,
            vmid: (f & layout::reg::IB_VMID != 0).then_some(Vmid(r.ib_vmid)),
        }),
        bulk_done: (f & layout::reg::BULK != 0).then_some(r.bulk_done),
        dispatch_active: f & layout::reg::DISPATCH != 0,
        at_cb_boundary: f & layout::reg::CB_BOUNDARY != 0,
        wait_observed: (f & layout::reg::WAIT_OBSERVED != 0).then_some(Time(r.wait_observed)),
    }
}

/// The `SlotCtl::stop` bits of a stop rule.
fn stop_bits(rule: Stop) -> u32 {
    let mut bits = 0;
    for (p, sp) in layout::STOP_POINTS {
        if rule.allows(p) {
            bits |= layout::stop_at(sp);
        }
    }
    if rule.allows_blocked_wait() {
        bits |= layout::STOP_BLOCKED_WAIT;
    }
    bits
}

impl<B: Backing> Hardware for Slots<B> {
    fn name(&self) -> String {
        self.b.name()
    }

    fn attach(&mut self, engines: &[EngineKind], slots: u32, wave_width: u32) -> Result<(), HwError> {
        if wave_width != 32 {
            return Err(HwError::Unsupported(format!("waves of {wave_width} lanes: a GPU wave is a 32-lane warp")));
        }
        let total = engines.len() as u32 * slots;
        if total == 0 || total > layout::MAX_SLOTS {
            return Err(HwError::Unsupported(format!(
                "{total} hardware slots ({} engines of {slots}): between 1 and {}",
                engines.len(),
                layout::MAX_SLOTS
            )));
        }
        let n = total as usize;
        self.engines = engines.to_vec();
        self.per_engine = slots;
        self.ctl = self.b.shared(n * CTL)?;
        self.status = self.b.shared(n * STATUS)?;
        self.events = self.b.shared(n * layout::SLOT_EVENTS as usize * EVENT)?;
        let private = self.b.private(n * layout::PRIV_BYTES as usize)?;
        let fence_cap = 1024;
        let fence_buf = self.b.shared(fence_cap * size_of::<FenceSlot>())?;
        let mut engine_kind = [0u32; layout::MAX_SLOTS as usize];
        for (e, kind) in engines.iter().enumerate() {
            for s in 0..slots as usize {
                engine_kind[e * slots as usize + s] = (*kind == EngineKind::Compute) as u32;
            }
        }
        let g = Globals {
            quit: 0,
            vm_dir: self.vm_dir.dev(),
            vm_count: layout::MAX_VMIDS,
            fence_mask: (fence_cap - 1) as u32,
            fence_table: fence_buf.dev(),
            fence_seq: 0,
            slots: total as u64,
            ctl: self.ctl.dev(),
            status: self.status.dev(),
            events: self.events.dev(),
            private,
            private_bytes: layout::PRIV_BYTES,
            engine_kind,
            idle_after_ns: self.b.idle_after_ns(),
        };
        self.globals.put(0, &g);
        self.fences = Some(FenceTable { buf: fence_buf, cap: fence_cap, ids: HashMap::new(), retired: Vec::new() });
        self.seq = vec![0; n];
        self.load = vec![0; n];
        self.taken = vec![0; n];
        self.keep = (0..n).map(|_| None).collect();
        self.b.start(&self.globals, total)
    }

    fn command(&mut self, cmd: HwCommand<'_>) -> Result<(), HwError> {
        match cmd {
            HwCommand::Load { engine, slot, queue, now } => {
                let i = self.index(engine, slot)?;
                // The slot must have taken the last command before its block is rewritten.
                self.ready(i)?;
                let compute = self.engines[engine.0 as usize] == EngineKind::Compute;
                self.write_load(i, &queue, compute, now)?;
                let seq = self.send(i, layout::cmd::LOAD, 0)?;
                self.load[i] = seq;
                Ok(())
            }
            HwCommand::Stop { engine, slot, rule } => {
                let i = self.index(engine, slot)?;
                self.send(i, layout::cmd::STOP, stop_bits(rule)).map(drop)
            }
            HwCommand::Abort { engine, slot } => {
                let i = self.index(engine, slot)?;
                self.send(i, layout::cmd::ABORT, 0).map(drop)
            }
            HwCommand::AddressSpace { vmid, vm } => self.write_vm(vmid, vm),
            HwCommand::NativeFence { region, offset, id } => {
                let key = self.dev_of_shm(region, offset)?;
                self.write_fence(key, id)
            }
            HwCommand::FenceLog { engine, slot, index, log } => {
                let i = self.index(engine, slot)?;
                let w = self.log_word(log)?;
                if let Some(k) = self.keep[i].as_mut()
                    && let Some(logs) = k._logs.as_mut()
                    && index < 2
                {
                    logs[index] = log.clone();
                }
                // One word: the slot sees the old log or the new one, never half of each.
                self.ctl.word(at!(SlotCtl[i].fence_log) + 8 * index.min(1)).store(w, Ordering::Release);
                Ok(())
            }
        }
    }

    fn poll(&mut self, _now: Time, out: &mut Vec<HwEvent>) -> bool {
        let n = self.seq.len();
        let active: Vec<bool> = (0..n).map(|i| self.load[i] != 0 || self.owes_ack(i)).collect();
        let more = self.b.run(&self.globals, &active);
        // Only slots with a queue or a command can have news (each look reads lines the
        // device writes).
        for (i, &on) in active.iter().enumerate() {
            if on {
                self.take_events(i);
            }
        }
        out.append(&mut self.pending);
        more
    }

    fn status_every_step(&self) -> bool {
        self.b.stepped()
    }

    fn progress(&self, engine: EngineId, slot: u32) -> SlotProgress {
        let Ok(i) = self.index(engine, slot) else { return SlotProgress::default() };
        // Acquire, first: pairs with the slot's release of `load`, stored after the regs.
        let load = self.status.word(at!(SlotStatus[i].load)).load(Ordering::Acquire);
        let st: SlotStatus = self.status.get(i * STATUS);
        SlotProgress {
            regs: (load == self.load[i] && load != 0).then(|| regs_from(&st.regs)),
            packets: st.packets,
            instructions: st.instructions,
            lane_ops: st.lane_ops,
            bytes: st.bytes,
        }
    }
}

impl<B: Backing> Drop for Slots<B> {
    fn drop(&mut self) {
        self.b.stop(&self.globals);
    }
}
