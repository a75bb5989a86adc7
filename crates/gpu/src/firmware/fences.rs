//! Native fences as the firmware knows them (spec 002, `DxgkDdiCreateNativeFence`): the fence
//! table the engines look a signalled or waited-on word up in, and the fence epoch that tells
//! a queue parked on a fence `WAIT` when to look again.
//!
//! Invariant: the epoch moves whenever a native fence may have changed — a packet that
//! writes memory executed on this device, a CPU update or another adapter's signal the kernel
//! announces ([`Firmware::notify_fences`]), a fence registered or destroyed — so a parked
//! queue that re-checks only when it moved never misses a change.

use shm::{Shm, Word};

use super::Firmware;

/// A native fence the firmware knows (`DxgkDdiCreateNativeFence`).
pub(super) struct FenceEntry {
    pub(super) id: u64,
    pub(super) monitored: Word,
    pub(super) waits: FenceWaits,
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
}

impl Fences {
    /// No fences yet.
    pub(super) fn new(optimized: bool) -> Fences {
        Fences { table: FenceTable::default(), epoch: 0, optimized }
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
