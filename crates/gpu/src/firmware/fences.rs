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

impl Firmware {
    pub(crate) fn optimized_interrupts(&self) -> bool {
        self.optimized_interrupts
    }

    pub(crate) fn register_fence(&mut self, current: (&Shm, u64), monitored: Word, id: u64, waits: FenceWaits) {
        self.fence_epoch += 1;
        self.fences.insert((current.0.id(), current.1), FenceEntry { id, monitored, waits });
        self.hw_fence(current.0, current.1, Some(id));
    }

    pub(crate) fn unregister_fence(&mut self, current: (&Shm, u64)) {
        // A queue parked on it re-checks (and faults, if the memory went with it).
        self.fence_epoch += 1;
        self.fences.remove(&(current.0.id(), current.1));
        self.hw_fence(current.0, current.1, None);
    }

    /// Native fences may have changed behind the engines' back (a CPU update, another
    /// adapter's signal): every parked queue re-checks.
    pub(crate) fn notify_fences(&mut self) {
        self.fence_epoch += 1;
    }
}
