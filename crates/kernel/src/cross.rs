//! Cross-adapter native fences (spec 002 "Cross-adapter native fences"): the part of the OS
//! that spans adapters.
//!
//! A [`crate::Machine`] hosts several adapters, each with its own OS instance, KMD and GPU.
//! A cross-adapter fence is created on one of them and opened on the others by its
//! cross-adapter handle. This module keeps, per fence:
//!
//! - the one copy of its **CurrentValue**, a system-memory page every adapter maps into the
//!   opening process's GPU address space ("the GPU VA mappings on both GPUs point to the same
//!   CurrentValue physical storage");
//! - which adapters have it open, under which local fence id.
//!
//! Each adapter keeps its own MonitoredValue, pinned at 0, so every signal interrupts there.
//! There is no GPU-to-GPU signal: when an adapter sees the fence signalled (its interrupt, or
//! a CPU signal), its OS instance hands it to `CrossAdapter::propagate`, which tells every
//! other adapter that has it open (`Peer::notify_current_value`). A native-fence adapter
//! then calls `DxgkDdiUpdateCurrentValuesFromCpu` with `NotificationOnly` (its KMD rescans the
//! run list) and wakes its CPU waiters; an adapter without native fences scans its monitored
//! fence waiting lists. The tables in spec 002 list the combinations; `tests/cross_adapter.rs`
//! runs each of them.
//!
//! Locking: an OS instance calls in here under its own lock only for bookkeeping (register,
//! open, close), and this module never calls an adapter while holding its own lock. Signals
//! are propagated after the signalling adapter released its lock, so two adapters signalling
//! each other at once cannot deadlock.

use std::sync::{Arc, Weak};

use abi::port::KernelError;
use abi::slab::KeyMap;
use parking_lot::Mutex;
use shm::Shm;

/// An adapter's index in its machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AdapterId(pub u32);

impl core::fmt::Display for AdapterId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "adapter{}", self.0)
    }
}

/// What the cross-adapter layer did, in order (tests assert the spec's sequences on it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CrossEvent {
    /// A cross-adapter fence was created on `adapter`.
    Created {
        /// The cross-adapter handle.
        fence: u64,
        /// Where.
        adapter: AdapterId,
    },
    /// It was opened on `adapter`.
    Opened {
        /// The cross-adapter handle.
        fence: u64,
        /// Where.
        adapter: AdapterId,
    },
    /// `adapter` saw it signalled (a GPU signal's interrupt, or a CPU signal) and handed it
    /// over for propagation.
    Signaled {
        /// The cross-adapter handle.
        fence: u64,
        /// Where the signal happened.
        from: AdapterId,
    },
    /// The OS propagated the signal to `to`.
    Propagated {
        /// The cross-adapter handle.
        fence: u64,
        /// The adapter told.
        to: AdapterId,
    },
    /// `adapter` closed its instance.
    Closed {
        /// The cross-adapter handle.
        fence: u64,
        /// Where.
        adapter: AdapterId,
    },
}

/// An adapter, as the cross-adapter layer reaches it.
pub(crate) trait Peer: Send + Sync {
    /// Another adapter signalled the fence this adapter knows as `local`: re-read its
    /// CurrentValue, unblock GPU waiters (`NotificationOnly`) and CPU waiters.
    fn notify_current_value(&self, local: u64);
}

struct Fence {
    current: Arc<Shm>,
    offset: u64,
    open: Vec<(AdapterId, u64)>,
}

#[derive(Default)]
struct State {
    peers: Vec<Option<Weak<dyn Peer>>>,
    fences: KeyMap<u64, Fence>,
    next: u64,
    trace: std::collections::VecDeque<CrossEvent>,
    dropped: u64,
}

impl State {
    /// Logs an event; past [`crate::trace::TRACE_CAPACITY`] entries the oldest go (counted),
    /// since every signal of a cross-adapter fence adds two.
    fn log(&mut self, e: CrossEvent) {
        if self.trace.len() == crate::trace::TRACE_CAPACITY {
            self.trace.pop_front();
            self.dropped += 1;
        }
        self.trace.push_back(e);
    }
}

/// The machine's cross-adapter fence table. See the module docs.
#[derive(Default)]
pub struct CrossAdapter {
    state: Mutex<State>,
}

impl CrossAdapter {
    /// Makes `peer` reachable as `adapter`.
    pub(crate) fn attach(&self, adapter: AdapterId, peer: Weak<dyn Peer>) {
        let mut s = self.state.lock();
        let i = adapter.0 as usize;
        if s.peers.len() <= i {
            s.peers.resize_with(i + 1, || None);
        }
        s.peers[i] = Some(peer);
    }

    /// Registers a new cross-adapter fence, created on `adapter` as local fence `local`, whose
    /// CurrentValue is at `offset` in `current`. Returns its cross-adapter handle.
    pub(crate) fn create(&self, adapter: AdapterId, local: u64, current: Arc<Shm>, offset: u64) -> u64 {
        let mut s = self.state.lock();
        s.next += 1;
        let fence = s.next;
        s.fences.insert(fence, Fence { current, offset, open: vec![(adapter, local)] });
        s.log(CrossEvent::Created { fence, adapter });
        fence
    }

    /// The storage of fence `handle`, for an adapter about to open it.
    pub(crate) fn storage(&self, handle: u64) -> Result<(Arc<Shm>, u64), KernelError> {
        let s = self.state.lock();
        let f = s.fences.get(&handle).ok_or_else(|| KernelError::InvalidArgument {
            field: "handle",
            value: handle.to_string(),
            reason: abi::port::Invalid::NoSuchFence,
        })?;
        Ok((f.current.clone(), f.offset))
    }

    /// Records that `adapter` opened fence `handle` as local fence `local`.
    pub(crate) fn opened(&self, handle: u64, adapter: AdapterId, local: u64) {
        let mut s = self.state.lock();
        if let Some(f) = s.fences.get_mut(&handle) {
            f.open.push((adapter, local));
            s.log(CrossEvent::Opened { fence: handle, adapter });
        }
    }

    /// Records that `adapter` closed its instance `local`; the fence goes with its last one.
    pub(crate) fn closed(&self, handle: u64, adapter: AdapterId, local: u64) {
        let mut s = self.state.lock();
        let Some(f) = s.fences.get_mut(&handle) else { return };
        f.open.retain(|&x| x != (adapter, local));
        if f.open.is_empty() {
            s.fences.remove(&handle);
        }
        s.log(CrossEvent::Closed { fence: handle, adapter });
    }

    /// `from` saw fence `handle` signalled: tell every other adapter that has it open. Called
    /// with no adapter's lock held.
    pub(crate) fn propagate(&self, handle: u64, from: AdapterId) {
        let targets: Vec<(AdapterId, u64, Arc<dyn Peer>)> = {
            let mut s = self.state.lock();
            s.log(CrossEvent::Signaled { fence: handle, from });
            let Some(f) = s.fences.get(&handle) else { return };
            let open = f.open.clone();
            let mut out = Vec::new();
            for (adapter, local) in open {
                if adapter == from {
                    continue;
                }
                let peer = s.peers.get(adapter.0 as usize).and_then(|p| p.as_ref()).and_then(Weak::upgrade);
                if let Some(peer) = peer {
                    s.log(CrossEvent::Propagated { fence: handle, to: adapter });
                    out.push((adapter, local, peer));
                }
            }
            out
        };
        for (_, local, peer) in targets {
            peer.notify_current_value(local);
        }
    }

    /// The events kept, in order, and how many older ones were dropped.
    pub fn trace(&self) -> (Vec<CrossEvent>, u64) {
        let s = self.state.lock();
        (s.trace.iter().cloned().collect(), s.dropped)
    }
}
