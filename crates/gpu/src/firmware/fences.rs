//! Native fences as the firmware knows them (spec 002, `DxgkDdiCreateNativeFence`): the fence
//! table the engines look a signalled or waited-on word up in, and the fence epoch that tells
//! a queue parked on a fence `WAIT` when to look again.
//!
//! Every signal of a native fence goes through [`Fences::signal`] (spec 002's store, barrier
//! and MonitoredValue check, [`abi::protocol::signal_fence`]), which a tool may have witness
//! each one ([`FenceSignal`], [`crate::Gpu::record_fence_signals`]): the value, the
//! MonitoredValue it was checked against, and whether the interrupt was raised.
//!
//! Invariant: the epoch moves whenever a native fence may have changed — a packet that
//! writes memory executed on this device, a CPU update or another adapter's signal the kernel
//! announces ([`Firmware::notify_fences`]), a fence registered or destroyed — so a parked
//! queue that re-checks only when it moved never misses a change.

use std::sync::atomic::Ordering;

use shm::{Shm, Word};

use super::Firmware;
use crate::Time;

/// A native fence the firmware knows (`DxgkDdiCreateNativeFence`).
pub(super) struct FenceEntry {
    pub(super) id: u64,
    pub(super) monitored: Word,
    pub(super) waits: FenceWaits,
}

/// One signal of a native fence as the device executed it, while a tool records them
/// ([`crate::Gpu::record_fence_signals`]; the swarm's `interrupts` checker): spec 002 raises
/// the fence's interrupt exactly when the value written passes the MonitoredValue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FenceSignal {
    /// The fence (the kernel's id, as in [`crate::Interrupt::NativeFenceSignaled`]).
    pub fence: u64,
    /// The value written to CurrentValue.
    pub value: u64,
    /// The MonitoredValue read after the signal's barrier (read again for the record: on the
    /// deterministic driver nothing changes it in between).
    pub monitored: u64,
    /// Whether the device raised the interrupt.
    pub raised: bool,
    /// When the signal executed (device time).
    pub at: Time,
}

/// How a `WAIT` on a native fence waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceWaits {
    /// It parks until a fence may have changed: the device is told of every change it does
    /// not make itself (a native-fence KMD announces CPU updates and other adapters' signals).
    Park,
    /// It polls, as for plain memory: nobody announces changes (a monitored fence on an
    /// adapter without native fences, which its scheduler writes from the CPU).
    Poll,
}

/// Native fences by where their CurrentValue lives: (backing region id, offset). Keyed by
/// the memory rather than a VA, so every mapping of a shared fence finds the same entry.
/// Its keys are the kernel's own (a region id and an offset it registered): [`abi::slab::KeyHasher`].
pub(super) type FenceTable = abi::slab::KeyMap<(u64, u64), FenceEntry>;

/// The device's native fences: the table, the epoch, and how a signal's interrupt names its
/// fences.
pub(super) struct Fences {
    /// Every native fence the kernel registered.
    table: FenceTable,
    /// Bumped whenever a native fence may have changed (see the module docs). A queue parked
    /// on a fence `WAIT` re-checks only when it moved.
    pub(super) epoch: u64,
    /// Spec 002's optimized fence-signaled interrupt: a logged signal names its queue, not
    /// its fence.
    pub(super) optimized: bool,
    /// Every signal, while a tool records them ([`FenceSignal`]).
    pub(super) signals: Option<Vec<FenceSignal>>,
    /// Raises the interrupt on every signal ([`super::BrokenTwin::SpuriousFenceInterrupts`]):
    /// false on every real device.
    pub(super) always_raise: bool,
}

impl Fences {
    /// No fences yet.
    pub(super) fn new(optimized: bool) -> Fences {
        Fences { table: FenceTable::default(), epoch: 0, optimized, signals: None, always_raise: false }
    }

    /// Whether a tool records every signal ([`crate::Gpu::record_fence_signals`]).
    pub(super) fn recording(&self) -> bool {
        self.signals.is_some()
    }

    /// Signals the native fence whose CurrentValue is `current` (at `key`) with `value`:
    /// spec 002's store, `log` (a fence-log entry goes between the store and the barrier), the
    /// barrier and the MonitoredValue check ([`abi::protocol::signal_fence`]). Returns the
    /// fence's id and whether its interrupt is raised; `None`, with nothing written, where no
    /// native fence lives at `key`.
    pub(super) fn signal(
        &mut self,
        key: &(u64, u64),
        current: &std::sync::atomic::AtomicU64,
        value: u64,
        at: Time,
        log: impl FnOnce(),
    ) -> Option<(u64, bool)> {
        let Fences { table, signals, always_raise, .. } = self;
        let f = table.get(key)?;
        let raised = abi::protocol::signal_fence(current, &f.monitored, value, log) || *always_raise;
        if let Some(s) = signals {
            // Relaxed: a record of what the check read, on the one thread that drives the device.
            let monitored = f.monitored.get().load(Ordering::Relaxed);
            s.push(FenceSignal { fence: f.id, value, monitored, raised, at });
        }
        Some((f.id, raised))
    }

    /// The native fence whose CurrentValue is the word at `key`: (backing region id, offset).
    pub(super) fn get(&self, key: &(u64, u64)) -> Option<&FenceEntry> {
        self.table.get(key)
    }

    /// A native fence may have changed: every parked queue re-checks.
    pub(super) fn changed(&mut self) {
        self.epoch += 1;
    }
}

impl Firmware {
    pub(crate) fn optimized_interrupts(&self) -> bool {
        self.fences.optimized
    }

    pub(crate) fn register_fence(&mut self, current: (&Shm, u64), monitored: Word, id: u64, waits: FenceWaits) {
        self.fences.changed();
        self.fences.table.insert((current.0.id(), current.1), FenceEntry { id, monitored, waits });
        self.hw_fence(current.0, current.1, Some(id));
    }

    pub(crate) fn unregister_fence(&mut self, current: (&Shm, u64)) {
        // A queue parked on it re-checks (and faults, if the memory went with it).
        self.fences.changed();
        self.fences.table.remove(&(current.0.id(), current.1));
        self.hw_fence(current.0, current.1, None);
    }

    /// Native fences may have changed behind the engines' back (a CPU update, another
    /// adapter's signal): every parked queue re-checks.
    pub(crate) fn notify_fences(&mut self) {
        self.fences.changed();
    }
}
