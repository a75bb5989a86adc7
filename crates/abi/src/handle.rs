//! Generation-checked typed handles.
//!
//! A handle names one object in one process's object table: `(owner, index, generation)`.
//! The kernel refuses a handle whose owner is another process (a foreign handle), whose slot
//! holds a newer generation (a stale handle: the object was destroyed and the slot reused), or
//! whose slot is empty. The kind parameter makes a queue handle and a doorbell handle different
//! types, so they cannot be swapped by mistake at compile time.

use core::fmt;
use core::hash::{Hash, Hasher};
use core::marker::PhantomData;

/// A process known to the kernel. In the embedded mode a "process" is a kernel-side object the
/// client opens; in the later multi-process mode it is a real OS process.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcessId(pub u32);

impl fmt::Display for ProcessId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "p{}", self.0)
    }
}

/// The kind of object a [`Handle`] names.
pub trait HandleKind: 'static {
    /// Lower-case name used in messages ("queue", "doorbell", ...).
    const NAME: &'static str;
    /// The kind as a value, for a type-erased [`AnyHandle`].
    const TYPE: HandleType;
}

macro_rules! kinds {
    ($($(#[$m:meta])* $kind:ident => $alias:ident, $ty:ident, $name:literal;)*) => {
        /// A handle's kind as a value (what [`AnyHandle`] keeps of the type parameter).
        #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum HandleType {$(
            $(#[$m])*
            $ty,
        )*}
        impl HandleType {
            /// Lower-case name used in messages, as [`HandleKind::NAME`].
            pub const fn name(self) -> &'static str {
                match self {$(HandleType::$ty => $name,)*}
            }
        }
        $(
        $(#[$m])*
        #[derive(Debug)]
        pub enum $kind {}
        impl HandleKind for $kind {
            const NAME: &'static str = $name;
            const TYPE: HandleType = HandleType::$ty;
        }
        $(#[$m])*
        pub type $alias = Handle<$kind>;
        )*
    };
}

kinds! {
    /// A device opened by a process (`D3DKMTCreateDevice`; the amdgpu file description).
    DeviceKind => DeviceHandle, Device, "device";
    /// A hardware context on one engine.
    ContextKind => ContextHandle, Context, "context";
    /// A hardware queue (`HwQueue`; amdgpu user queue).
    HwQueueKind => HwQueueHandle, HwQueue, "queue";
    /// A memory allocation mapped into the process's GPU address space.
    AllocationKind => AllocationHandle, Allocation, "allocation";
    /// A doorbell object of a user-mode queue.
    DoorbellKind => DoorbellHandle, Doorbell, "doorbell";
    /// A native GPU fence (spec 002).
    NativeFenceKind => NativeFenceHandle, NativeFence, "fence";
    /// A doorbell page the application allocated (spec 001; amdgpu's doorbell BO).
    DoorbellPageKind => DoorbellPageHandle, DoorbellPage, "doorbell page";
}

/// A typed, generation-checked handle. Cheap to copy; meaningless outside its owner.
pub struct Handle<K: HandleKind> {
    owner: ProcessId,
    index: u32,
    generation: u32,
    _kind: PhantomData<fn() -> K>,
}

impl<K: HandleKind> Handle<K> {
    /// Builds a handle. Only object tables mint handles; clients receive them from the kernel.
    pub const fn new(owner: ProcessId, index: u32, generation: u32) -> Self {
        Handle { owner, index, generation, _kind: PhantomData }
    }
    /// The process whose table holds the object.
    pub const fn owner(&self) -> ProcessId {
        self.owner
    }
    /// Slot index in the owner's table.
    pub const fn index(&self) -> u32 {
        self.index
    }
    /// Generation of the slot when the handle was minted.
    pub const fn generation(&self) -> u32 {
        self.generation
    }
}

impl<K: HandleKind> Clone for Handle<K> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<K: HandleKind> Copy for Handle<K> {}
impl<K: HandleKind> PartialEq for Handle<K> {
    fn eq(&self, o: &Self) -> bool {
        (self.owner, self.index, self.generation) == (o.owner, o.index, o.generation)
    }
}
impl<K: HandleKind> Eq for Handle<K> {}
/// On the daemon socket a handle is its `(owner, index, generation)`; the receiver's object
/// table checks all three, so a forged one is refused like any foreign or stale handle.
#[cfg(feature = "serde")]
impl<K: HandleKind> serde::Serialize for Handle<K> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        serde::Serialize::serialize(&(self.owner.0, self.index, self.generation), s)
    }
}
#[cfg(feature = "serde")]
impl<'de, K: HandleKind> serde::Deserialize<'de> for Handle<K> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let (owner, index, generation): (u32, u32, u32) = serde::Deserialize::deserialize(d)?;
        Ok(Handle::new(ProcessId(owner), index, generation))
    }
}
impl<K: HandleKind> Hash for Handle<K> {
    fn hash<H: Hasher>(&self, h: &mut H) {
        (self.owner, self.index, self.generation).hash(h)
    }
}
impl<K: HandleKind> fmt::Display for Handle<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&AnyHandle::from(*self), f)
    }
}
impl<K: HandleKind> fmt::Debug for Handle<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A handle of any kind, as data: what an error keeps of the handle it refuses. Built from a
/// typed handle with `From`; `Display` is the typed handle's (`queue#3.g7@p2`).
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AnyHandle {
    /// What it names.
    pub kind: HandleType,
    /// The process whose table holds the object.
    pub owner: ProcessId,
    /// Slot index in the owner's table.
    pub index: u32,
    /// Generation of the slot when the handle was minted.
    pub generation: u32,
}

impl<K: HandleKind> From<Handle<K>> for AnyHandle {
    fn from(h: Handle<K>) -> Self {
        AnyHandle { kind: K::TYPE, owner: h.owner, index: h.index, generation: h.generation }
    }
}

impl<K: HandleKind> PartialEq<Handle<K>> for AnyHandle {
    fn eq(&self, h: &Handle<K>) -> bool {
        *self == AnyHandle::from(*h)
    }
}

impl fmt::Display for AnyHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}.g{}@{}", self.kind.name(), self.index, self.generation, self.owner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_kind_slot_generation_and_owner() {
        let h = HwQueueHandle::new(ProcessId(2), 3, 7);
        assert_eq!(h.to_string(), "queue#3.g7@p2");
        assert_ne!(h, HwQueueHandle::new(ProcessId(2), 3, 8));
        assert_ne!(h, HwQueueHandle::new(ProcessId(1), 3, 7));
    }

    #[test]
    fn an_erased_handle_keeps_kind_owner_slot_and_generation_and_prints_alike() {
        let h = DoorbellHandle::new(ProcessId(4), 1, 2);
        let any = AnyHandle::from(h);
        assert_eq!(any, AnyHandle { kind: HandleType::Doorbell, owner: ProcessId(4), index: 1, generation: 2 });
        assert_eq!(any.to_string(), h.to_string());
        assert_eq!(any, h);
        // Same numbers, another kind: another handle.
        assert_ne!(any, AnyHandle::from(HwQueueHandle::new(ProcessId(4), 1, 2)));
    }
}
