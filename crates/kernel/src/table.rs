//! Per-process object tables with generation-checked handles.
//!
//! A [`Table`] is the workspace's generation-checked slab ([`abi::slab::Slab`], which the
//! firmware's queue table uses too) owned by one process: a handle to a destroyed object is
//! *stale* even after its entry is reused, and a handle minted for another process is
//! *foreign*. Both are refused with a typed error that names the handle.

use abi::handle::{Handle, HandleKind, ProcessId};
use abi::port::{HandleProblem, KernelError};
use abi::slab::{Key, Miss, Slab};

/// A slab of `T` addressed by `Handle<K>`.
pub(crate) struct Table<K: HandleKind, T> {
    owner: ProcessId,
    slab: Slab<T>,
    _k: core::marker::PhantomData<fn() -> K>,
}

impl<K: HandleKind, T> Table<K, T> {
    pub(crate) fn new(owner: ProcessId) -> Self {
        Table { owner, slab: Slab::new(), _k: core::marker::PhantomData }
    }

    fn handle(&self, key: Key) -> Handle<K> {
        Handle::new(self.owner, key.index(), key.generation())
    }

    /// Inserts a value and mints its handle.
    pub(crate) fn insert(&mut self, value: T) -> Handle<K> {
        let key = self.slab.insert(value);
        self.handle(key)
    }

    /// The slab key of a handle of this process, or why it names nothing here.
    fn key(&self, h: Handle<K>) -> Result<Key, KernelError> {
        if h.owner() != self.owner {
            return Err(KernelError::BadHandle {
                handle: h.into(),
                problem: HandleProblem::Foreign { owner: h.owner() },
            });
        }
        Ok(Key::from_parts(h.index(), h.generation()))
    }

    fn miss(h: Handle<K>) -> impl FnOnce(Miss) -> KernelError {
        move |m| KernelError::BadHandle {
            handle: h.into(),
            problem: match m {
                Miss::Stale => HandleProblem::Stale,
                Miss::Unknown => HandleProblem::Unknown,
            },
        }
    }

    /// The object a handle names.
    pub(crate) fn get(&self, h: Handle<K>) -> Result<&T, KernelError> {
        self.slab.get(self.key(h)?).map_err(Self::miss(h))
    }

    /// The object a handle names, mutably.
    pub(crate) fn get_mut(&mut self, h: Handle<K>) -> Result<&mut T, KernelError> {
        let key = self.key(h)?;
        self.slab.get_mut(key).map_err(Self::miss(h))
    }

    /// Removes the object; its handle becomes stale.
    pub(crate) fn remove(&mut self, h: Handle<K>) -> Result<T, KernelError> {
        let key = self.key(h)?;
        self.slab.remove(key).map_err(Self::miss(h))
    }

    /// Live handles and objects.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (Handle<K>, &T)> {
        self.slab.iter().map(|(k, v)| (self.handle(k), v))
    }

    /// Live handles.
    pub(crate) fn handles(&self) -> Vec<Handle<K>> {
        self.iter().map(|(h, _)| h).collect()
    }

    /// Live objects.
    pub(crate) fn len(&self) -> usize {
        self.slab.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use abi::handle::HwQueueKind;

    #[test]
    fn stale_foreign_and_unknown_handles_are_refused() {
        let mut t: Table<HwQueueKind, &str> = Table::new(ProcessId(1));
        let a = t.insert("a");
        assert_eq!(*t.get(a).unwrap(), "a");
        t.remove(a).unwrap();
        let b = t.insert("b");
        assert_eq!(b.index(), a.index(), "slot reused");
        let e = t.get(a).unwrap_err();
        assert_eq!(e, KernelError::BadHandle { handle: a.into(), problem: HandleProblem::Stale });
        assert!(e.to_string().contains("queue#0.g1@p1"), "{e}");
        let foreign = Handle::<HwQueueKind>::new(ProcessId(2), b.index(), b.generation());
        assert!(matches!(
            t.get(foreign),
            Err(KernelError::BadHandle { problem: HandleProblem::Foreign { owner: ProcessId(2) }, .. })
        ));
        let unknown = Handle::<HwQueueKind>::new(ProcessId(1), 9, 1);
        assert!(matches!(t.get(unknown), Err(KernelError::BadHandle { problem: HandleProblem::Unknown, .. })));
        assert_eq!(t.handles(), vec![b]);
    }
}
