//! The emulated backing: the engine program (`device/engine.cu`), compiled for the CPU by
//! `build.rs`, run by the host itself.
//!
//! Each slot is stepped in the caller's thread when the firmware polls ([`Backing::run`]):
//! deterministic, no thread of its own, nothing that spins. Its "pinned" memory is ordinary
//! page-aligned host memory, and a device address is a CPU address, so the program reaches
//! the clients' shared memory directly — as a GPU does through its registration.
//!
//! This is how CI, which has no GPU, runs the very source a GPU runs: every packet, fault,
//! stop and save of the CUDA backend is tested here first.
//!
//! [`Emulated::threaded`] runs the slots on a thread of their own instead, continuously, as a
//! GPU runs them: the host's commands and the slots' answers then race as they do on
//! silicon (a slot takes a command some time after it was written; its status lags), which
//! the deterministic mode cannot show. The thread yields whenever no slot has work, and stops
//! when the backing drops.

use std::ffi::c_void;
use std::sync::atomic::Ordering;

use gpu::hw::HwError;
use shm::DmaArea;

use crate::host::Backing;
use crate::layout::{self, Globals};
use crate::shared::{HostAlloc, SharedBuf};

// The engine program's CPU entry points (engine.cu, `#if !DB_GPU`).
unsafe extern "C" {
    fn db_emu_slot_bytes() -> u64;
    fn db_emu_priv_bytes() -> u64;
    fn db_emu_slot_init(mem: *mut c_void);
    fn db_emu_slot_run(g: *const Globals, slot: u32, mem: *mut c_void, steps: u32) -> u32;
    fn db_emu_layout(out: *mut u64, n: u32) -> u32;
    fn db_host_time_ns() -> u64;
}

/// How long a slot on a GPU (and a threaded emulated one) keeps a caught-up queue reported
/// busy: a client submitting back to back within it costs no idle and busy reports.
pub const IDLE_AFTER_NS: u64 = 20_000;

/// The threaded mode's delay before each slot step (about a PCIe round trip).
const STEP_LATENCY: std::time::Duration = std::time::Duration::from_micros(2);

/// Steps each active slot takes per poll (a step runs up to 256 packets, or one slice of a
/// long one).
const STEPS_PER_POLL: u32 = 4;

/// The emulated backing. See the module docs.
pub struct Emulated {
    /// Per slot: the program's state for it (SlotState and SlotShared).
    slots: Vec<HostAlloc>,
    /// The slots' private memory.
    private: Vec<HostAlloc>,
    /// The mappings registered (held, so they stay mapped while the program may reach them).
    areas: Vec<DmaArea>,
    /// Run the slots on a thread of their own ([`Emulated::threaded`]).
    threaded: bool,
    /// That thread, and its stop flag.
    thread: Option<(std::thread::JoinHandle<()>, std::sync::Arc<std::sync::atomic::AtomicBool>)>,
}

/// What the slots' thread is handed: addresses only the backing's own allocations back, which
/// outlive the thread (the backing joins it before it frees them).
struct SlotsOnThread {
    globals: usize,
    slots: Vec<usize>,
    status: usize,
    ctl: usize,
}

impl Emulated {
    /// An emulated backing whose slots run when the host polls (deterministic).
    pub fn new() -> Emulated {
        Emulated { slots: Vec::new(), private: Vec::new(), areas: Vec::new(), threaded: false, thread: None }
    }

    /// An emulated backing whose slots run on a thread of their own, as a GPU's do.
    pub fn threaded() -> Emulated {
        let mut e = Emulated::new();
        e.threaded = true;
        e
    }

    /// The sizes the C++ compiler gave the layout structs (see [`layout::LAYOUT_SIZES`]).
    pub fn layout_sizes() -> Vec<u64> {
        let mut out = vec![0u64; layout::LAYOUT_SIZES.len()];
        // SAFETY: `out` has room for `len` u64s; the callee writes at most that many.
        let n = unsafe { db_emu_layout(out.as_mut_ptr(), out.len() as u32) };
        out.truncate(n as usize);
        out
    }

    fn run_slot(&mut self, globals: &SharedBuf, slot: u32, steps: u32) -> bool {
        let Some(mem) = self.slots.get(slot as usize) else { return false };
        // SAFETY: `globals` holds a Globals whose addresses name memory this backing handed
        // out (shared buffers, private memory) or registered (held in `areas`), all alive;
        // `mem` is this slot's state, db_emu_slot_bytes long, initialized by `start`. The
        // program reaches nothing else: every client address goes through the page tables
        // the host built from registered mappings.
        unsafe { db_emu_slot_run(globals.host_addr() as *const Globals, slot, mem.ptr().as_ptr().cast(), steps) != 0 }
    }
}

impl Default for Emulated {
    fn default() -> Self {
        Emulated::new()
    }
}

impl Backing for Emulated {
    fn name(&self) -> String {
        "emulated (the CUDA engine program on the CPU)".into()
    }

    fn shared(&mut self, bytes: usize) -> Result<SharedBuf, HwError> {
        Ok(HostAlloc::shared(bytes))
    }

    fn private(&mut self, bytes: usize) -> Result<u64, HwError> {
        // SAFETY: a query of a constant.
        let want = unsafe { db_emu_priv_bytes() };
        if want != layout::PRIV_BYTES {
            return Err(HwError::Failed(format!(
                "the program's private memory per slot is {want} bytes, the host's layout says {}",
                layout::PRIV_BYTES
            )));
        }
        let a = HostAlloc::new(bytes);
        let dev = a.ptr().as_ptr().addr() as u64;
        self.private.push(a);
        Ok(dev)
    }

    fn register(&mut self, area: &DmaArea) -> Result<u64, HwError> {
        // (Nothing is pinned here, but the emulator keeps the GPU's rules.)
        area.pin();
        self.areas.push(area.clone());
        Ok(area.addr() as u64)
    }

    fn start(&mut self, globals: &SharedBuf, slots: u32) -> Result<(), HwError> {
        // SAFETY: a query of a constant.
        let bytes = unsafe { db_emu_slot_bytes() } as usize;
        self.slots = (0..slots)
            .map(|_| {
                let a = HostAlloc::new(bytes);
                // SAFETY: `a` is a fresh allocation of at least `bytes` bytes, page-aligned.
                unsafe { db_emu_slot_init(a.ptr().as_ptr().cast()) };
                a
            })
            .collect();
        if self.threaded {
            // (The emulator's device addresses are CPU addresses.)
            let g: Globals = globals.get(0);
            self.spawn(globals, g.status as usize, g.ctl as usize)?;
        }
        Ok(())
    }

    fn run(&mut self, globals: &SharedBuf, active: &[bool]) -> bool {
        if self.threaded {
            return false; // the slots' thread runs them
        }
        let mut more = false;
        for (k, &on) in active.iter().enumerate() {
            if on {
                more |= self.run_slot(globals, k as u32, STEPS_PER_POLL);
            }
        }
        more
    }

    fn settle(&mut self, globals: &SharedBuf, status: &SharedBuf, slot: u32, seq: u64) -> Result<bool, HwError> {
        let ack = status.word(layout::at!(SlotStatus[slot as usize].ack));
        // A command is taken at the top of the slot's next step (unless its event ring is
        // too full to run one: the host then drains it and asks again).
        // Acquire: pairs with the slot's release of its acknowledgement.
        if ack.load(Ordering::Acquire) < seq {
            if self.threaded {
                std::thread::yield_now();
            } else {
                self.run_slot(globals, slot, 1);
            }
        }
        Ok(ack.load(Ordering::Acquire) >= seq)
    }

    fn device_time_ns(&self) -> u64 {
        // SAFETY: reads CLOCK_MONOTONIC.
        unsafe { db_host_time_ns() }
    }

    fn stepped(&self) -> bool {
        !self.threaded
    }

    fn idle_after_ns(&self) -> u64 {
        // Threaded, it races like a GPU, and reports idle as late; stepped, at once.
        if self.threaded { IDLE_AFTER_NS } else { 0 }
    }

    fn stop(&mut self, _globals: &SharedBuf) {
        if let Some((t, stop)) = self.thread.take() {
            // Release: nothing to publish; the thread polls it.
            stop.store(true, Ordering::Release);
            let _ = t.join();
        }
    }
}

impl Drop for Emulated {
    fn drop(&mut self) {
        if let Some((t, stop)) = self.thread.take() {
            stop.store(true, Ordering::Release);
            let _ = t.join();
        }
    }
}

impl Emulated {
    /// Starts the slots' thread (threaded mode): it steps every slot with a queue or a
    /// command, and yields when none had anything to do.
    fn spawn(&mut self, globals: &SharedBuf, status: usize, ctl: usize) -> Result<(), HwError> {
        let on = SlotsOnThread {
            globals: globals.host_addr(),
            slots: self.slots.iter().map(|s| s.ptr().as_ptr().addr()).collect(),
            status,
            ctl,
        };
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let t = std::thread::Builder::new()
            .name("doorbell-emulated-gpu".into())
            .spawn(move || {
                let on = on;
                // Acquire: pairs with `stop`'s release.
                while !flag.load(Ordering::Acquire) {
                    let mut any = false;
                    for (k, &mem) in on.slots.iter().enumerate() {
                        let st = on.status + k * size_of::<layout::SlotStatus>();
                        let c = on.ctl + k * size_of::<layout::SlotCtl>();
                        // SAFETY: `st` and `c` are the status and command blocks of slot k in
                        // shared buffers the backing's owner keeps alive until after it joins
                        // this thread; both words are 8-aligned protocol words, read atomically.
                        let (state, ack, seq) = unsafe {
                            (
                                (*((st + 8) as *const std::sync::atomic::AtomicU32)).load(Ordering::Acquire),
                                (*(st as *const std::sync::atomic::AtomicU64)).load(Ordering::Acquire),
                                (*(c as *const std::sync::atomic::AtomicU64)).load(Ordering::Acquire),
                            )
                        };
                        if state == layout::run::EMPTY && ack >= seq {
                            continue;
                        }
                        any |= state == layout::run::BUSY || ack < seq;
                        // A GPU slot sees the host's writes a PCIe round trip late, and the host
                        // its: each step here starts a few microseconds after the last, so the
                        // races that latency opens are open here too.
                        let until = std::time::Instant::now() + STEP_LATENCY;
                        while std::time::Instant::now() < until {
                            std::hint::spin_loop();
                        }
                        // SAFETY: as in `run_slot`; this thread is the only one that runs the
                        // slots in threaded mode.
                        unsafe { db_emu_slot_run(on.globals as *const Globals, k as u32, mem as *mut c_void, 1) };
                    }
                    if !any {
                        std::thread::yield_now();
                    }
                }
            })
            .map_err(|e| HwError::Failed(format!("the emulated GPU's thread: {e}")))?;
        self.thread = Some((t, stop));
        Ok(())
    }
}
