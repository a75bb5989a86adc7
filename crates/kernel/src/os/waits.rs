//! The CPU waits the OS keeps ([`Waits`]): every wait a thread blocks on — a queue's progress
//! fence, native fences, a teardown's preemption answers — has an id here from when it begins
//! until its thread ends it, and its result once decided.
//!
//! Invariant: a wait's result is decided once ([`Waits::decide`]), and stays here until its
//! thread ends it ([`Waits::take`]) or its process ends ([`Waits::forget_process`]).

use abi::ProcessId;
use abi::port::KernelError;
use abi::slab::KeyMap;

/// A CPU wait the OS keeps: its result stays here until [`Os::end_wait`](super::Os::end_wait) or
/// [`Os::end_fence_wait`](super::Os::end_fence_wait) collects it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WaitId(u64);

/// How a wait started.
#[derive(Debug)]
pub enum WaitStart {
    /// Already decided.
    Done(Result<abi::port::WaitOutcome, KernelError>),
    /// The caller blocks until [`Output::WaitCompleted`](super::Output::WaitCompleted) names
    /// it (or it times out), then ends it.
    Blocked(WaitId),
}

/// The CPU waits the OS keeps, with their results until collected.
///
/// A wait a process's thread began belongs to that process: if the process ends before the
/// thread ends its wait (killed while blocked, say), the wait ends with it
/// ([`Waits::forget_process`]); otherwise a long-lived kernel would keep one entry per such
/// wait forever (found by `doorbell sim swarm`'s census checker).
#[derive(Default)]
pub(super) struct Waits {
    next: u64,
    /// Registered waits; `Some` once decided.
    results: KeyMap<WaitId, Option<Result<u64, KernelError>>>,
    /// The process whose thread waits (none for the kernel's own waits, which end themselves).
    owners: KeyMap<WaitId, ProcessId>,
}

impl Waits {
    /// A wait no process owns.
    pub(super) fn open(&mut self) -> WaitId {
        self.next += 1;
        let id = WaitId(self.next);
        self.results.insert(id, None);
        id
    }
    /// A wait a thread of process `pid` begins.
    pub(super) fn open_for(&mut self, pid: ProcessId) -> WaitId {
        let id = self.open();
        self.owners.insert(id, pid);
        id
    }
    pub(super) fn is_done(&self, id: WaitId) -> bool {
        !matches!(self.results.get(&id), Some(None))
    }
    /// Wait `id`'s result, if decided, left in place for its thread to take.
    pub(super) fn result(&self, id: WaitId) -> Option<&Result<u64, KernelError>> {
        self.results.get(&id)?.as_ref()
    }
    /// Decides wait `id` with `r`, once: `false` if it is not registered or already decided
    /// (a later decision is ignored).
    pub(super) fn decide(&mut self, id: WaitId, r: Result<u64, KernelError>) -> bool {
        match self.results.get_mut(&id) {
            Some(slot @ None) => {
                *slot = Some(r);
                true
            }
            _ => false,
        }
    }
    /// Waits registered and not yet ended (for the census).
    pub(super) fn len(&self) -> usize {
        self.results.len()
    }
    /// Ends wait `id`: its result, if it was decided.
    pub(super) fn take(&mut self, id: WaitId) -> Option<Result<u64, KernelError>> {
        self.owners.remove(&id);
        self.results.remove(&id).flatten()
    }
    /// Ends every wait of process `pid` (it ended).
    pub(super) fn forget_process(&mut self, pid: ProcessId) {
        let results = &mut self.results;
        self.owners.retain(|id, owner| {
            let keep = *owner != pid;
            if !keep {
                results.remove(id);
            }
            keep
        });
    }
}
