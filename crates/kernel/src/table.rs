//! Per-process object tables with generation-checked handles.
//!
//! A [`Table`] is a slab: each slot has a generation that increments when its object is
//! removed, so a handle to a destroyed object is *stale* even after the slot is reused, and a
//! handle minted for another process is *foreign*. Both are refused with a typed error that
//! names the handle.

use abi::handle::{Handle, HandleKind, ProcessId};
use abi::port::{HandleProblem, KernelError};

struct Slot<T> {
    generation: u32,
    value: Option<T>,
}

/// A slab of `T` addressed by `Handle<K>`.
pub(crate) struct Table<K: HandleKind, T> {
    owner: ProcessId,
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    _k: core::marker::PhantomData<fn() -> K>,
}

impl<K: HandleKind, T> Table<K, T> {
    pub(crate) fn new(owner: ProcessId) -> Self {
        Table { owner, slots: Vec::new(), free: Vec::new(), _k: core::marker::PhantomData }
    }

    /// Inserts a value and mints its handle.
    pub(crate) fn insert(&mut self, value: T) -> Handle<K> {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot { generation: 0, value: None });
                self.slots.len() as u32 - 1
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.generation = slot.generation.wrapping_add(1);
        slot.value = Some(value);
        Handle::new(self.owner, index, slot.generation)
    }

    fn check(&self, h: Handle<K>) -> Result<usize, KernelError> {
        let bad = |problem| KernelError::BadHandle { handle: h.to_string(), problem };
        if h.owner() != self.owner {
            return Err(bad(HandleProblem::Foreign { owner: h.owner() }));
        }
        match self.slots.get(h.index() as usize) {
            Some(s) if s.generation == h.generation() && s.value.is_some() => Ok(h.index() as usize),
            Some(s) if s.generation >= h.generation() && h.generation() != 0 => Err(bad(HandleProblem::Stale)),
            _ => Err(bad(HandleProblem::Unknown)),
        }
    }

    /// The object a handle names.
    pub(crate) fn get(&self, h: Handle<K>) -> Result<&T, KernelError> {
        let i = self.check(h)?;
        Ok(self.slots[i].value.as_ref().expect("checked"))
    }

    /// The object a handle names, mutably.
    pub(crate) fn get_mut(&mut self, h: Handle<K>) -> Result<&mut T, KernelError> {
        let i = self.check(h)?;
        Ok(self.slots[i].value.as_mut().expect("checked"))
    }

    /// Removes the object; its handle becomes stale.
    pub(crate) fn remove(&mut self, h: Handle<K>) -> Result<T, KernelError> {
        let i = self.check(h)?;
        self.free.push(i as u32);
        Ok(self.slots[i].value.take().expect("checked"))
    }

    /// Live handles and objects.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (Handle<K>, &T)> {
        let owner = self.owner;
        self.slots
            .iter()
            .enumerate()
            .filter_map(move |(i, s)| s.value.as_ref().map(|v| (Handle::new(owner, i as u32, s.generation), v)))
    }

    /// Live handles.
    pub(crate) fn handles(&self) -> Vec<Handle<K>> {
        self.iter().map(|(h, _)| h).collect()
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
        assert!(matches!(e, KernelError::BadHandle { problem: HandleProblem::Stale, .. }), "{e}");
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
