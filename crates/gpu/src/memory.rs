//! GPU virtual address spaces.
//!
//! Each process runs in its own address space, named by a [`Vmid`] (amdgpu's GPUVM; vmid 0 is
//! the kernel's). A space is a sorted list of non-overlapping [`GpuMapping`]s, each a window
//! onto a shared-memory region. Every access an engine makes is translated here, and an access
//! that does not lie inside **one** mapping, or writes a read-only one, is a fault attributed to
//! the queue — never a panic, never a touch of another process's memory.

use std::sync::Arc;

use abi::queue::{Access, FaultKind};
use shm::Shm;

use crate::GpuError;

/// An address-space id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Vmid(pub u32);

/// One mapping: `bytes` bytes at `va`, backed by `shm` from `offset`.
#[derive(Clone)]
pub struct GpuMapping {
    /// First address.
    pub va: u64,
    /// Length.
    pub bytes: u64,
    /// Backing region.
    pub shm: Arc<Shm>,
    /// Offset of `va` in the backing region.
    pub offset: u64,
    /// Whether the GPU may write it.
    pub writable: bool,
}

impl GpuMapping {
    fn end(&self) -> u64 {
        self.va + self.bytes
    }
}

impl core::fmt::Debug for GpuMapping {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "GpuMapping({:#x}+{:#x}, {})", self.va, self.bytes, if self.writable { "rw" } else { "ro" })
    }
}

/// A translated access: the backing region and the offset in it.
#[derive(Clone, Copy)]
pub struct Resolved<'a> {
    /// The region.
    pub shm: &'a Shm,
    /// Offset of the first byte.
    pub offset: u64,
}

/// One GPU virtual address space.
#[derive(Default, Debug)]
pub struct AddressSpace {
    maps: Vec<GpuMapping>,
    /// Bumped by every map and unmap: a device that keeps its own copy of the page table
    /// (hardware slots, [`crate::hw`]) knows it is stale.
    generation: u64,
}

impl AddressSpace {
    /// Maps `bytes` of `shm` from `offset` at `va`.
    pub fn map(&mut self, va: u64, bytes: u64, shm: Arc<Shm>, offset: u64, writable: bool) -> Result<(), GpuError> {
        let bad = |why| GpuError::BadMapping { va, bytes, why };
        if bytes == 0 {
            return Err(bad("empty"));
        }
        let Some(end) = va.checked_add(bytes) else { return Err(bad("wraps the address space")) };
        match offset.checked_add(bytes) {
            Some(e) if e <= shm.len() as u64 => {}
            _ => return Err(bad("runs past its backing memory")),
        }
        let i = self.maps.partition_point(|m| m.va < va);
        let overlaps_prev = i > 0 && self.maps[i - 1].end() > va;
        let overlaps_next = i < self.maps.len() && self.maps[i].va < end;
        if overlaps_prev || overlaps_next {
            return Err(GpuError::Overlap { va, bytes });
        }
        self.maps.insert(i, GpuMapping { va, bytes, shm, offset, writable });
        self.generation += 1;
        Ok(())
    }

    /// Removes the mapping that starts at `va`.
    pub fn unmap(&mut self, va: u64) -> Option<GpuMapping> {
        let i = self.maps.binary_search_by_key(&va, |m| m.va).ok()?;
        self.generation += 1;
        Some(self.maps.remove(i))
    }

    /// Its mappings, sorted by address.
    pub fn mappings(&self) -> &[GpuMapping] {
        &self.maps
    }

    /// How many times it changed (a map or an unmap) since it was created.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The mapping containing `va`.
    pub fn find(&self, va: u64) -> Option<&GpuMapping> {
        let i = self.maps.partition_point(|m| m.va <= va);
        let m = self.maps.get(i.checked_sub(1)?)?;
        (va < m.end()).then_some(m)
    }

    /// Whether `[va, va + bytes)` lies inside one mapping.
    pub fn contains(&self, va: u64, bytes: u64) -> bool {
        self.find(va).is_some_and(|m| va.checked_add(bytes).is_some_and(|e| e <= m.end()))
    }

    /// Number of mappings.
    pub fn len(&self) -> usize {
        self.maps.len()
    }

    /// Whether the space has no mappings.
    pub fn is_empty(&self) -> bool {
        self.maps.is_empty()
    }

    /// Translates an access of `bytes` at `va` (`bytes` may be 0: the address must still be
    /// mapped).
    #[inline]
    pub fn translate(&self, va: u64, bytes: u64, access: Access) -> Result<Resolved<'_>, FaultKind> {
        let outside = || FaultKind::OutsideMappings { va, bytes, access };
        let m = self.find(va).ok_or_else(outside)?;
        match va.checked_add(bytes) {
            Some(e) if e <= m.end() => {}
            _ => return Err(outside()),
        }
        if access == Access::Write && !m.writable {
            return Err(FaultKind::ReadOnly { va, bytes });
        }
        Ok(Resolved { shm: &m.shm, offset: m.offset + (va - m.va) })
    }

    /// Translates an aligned 4- or 8-byte access.
    #[inline]
    pub fn translate_aligned(&self, va: u64, bytes: u64, access: Access) -> Result<Resolved<'_>, FaultKind> {
        if !va.is_multiple_of(bytes) {
            return Err(FaultKind::Misaligned { va, align: bytes, access });
        }
        self.translate(va, bytes, access)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn translate_refuses_everything_outside_one_mapping() {
        let a = Shm::new("a", 8192).unwrap();
        let b = Shm::new("b", 4096).unwrap();
        let mut vm = AddressSpace::default();
        vm.map(0x10000, 8192, a, 0, true).unwrap();
        vm.map(0x12000, 4096, b, 0, false).unwrap();
        assert!(vm.translate(0x10000, 8192, Access::Read).is_ok());
        // Straddles two mappings: not inside one.
        assert!(matches!(vm.translate(0x11ff8, 16, Access::Read), Err(FaultKind::OutsideMappings { .. })));
        assert!(matches!(vm.translate(0xffff, 1, Access::Read), Err(FaultKind::OutsideMappings { .. })));
        assert!(matches!(vm.translate(u64::MAX, 2, Access::Read), Err(FaultKind::OutsideMappings { .. })));
        assert!(matches!(vm.translate(0x12000, 8, Access::Write), Err(FaultKind::ReadOnly { .. })));
        assert!(matches!(vm.translate_aligned(0x10004, 8, Access::Read), Err(FaultKind::Misaligned { .. })));
        let r = vm.translate(0x12010, 4, Access::Read).unwrap();
        assert_eq!(r.offset, 0x10);
    }

    #[test]
    fn map_refuses_overlap_and_overrun() {
        let a = Shm::new("a", 8192).unwrap();
        let mut vm = AddressSpace::default();
        vm.map(0x10000, 4096, a.clone(), 0, true).unwrap();
        assert!(matches!(vm.map(0x10800, 4096, a.clone(), 0, true), Err(GpuError::Overlap { .. })));
        assert!(matches!(vm.map(0xf800, 4096, a.clone(), 0, true), Err(GpuError::Overlap { .. })));
        assert!(matches!(vm.map(0x20000, 4096, a.clone(), 8192, true), Err(GpuError::BadMapping { .. })));
        assert!(matches!(vm.map(u64::MAX - 10, 4096, a.clone(), 0, true), Err(GpuError::BadMapping { .. })));
        vm.map(0x11000, 4096, a, 4096, true).unwrap();
        assert!(vm.unmap(0x10000).is_some());
        assert!(!vm.contains(0x10000, 1));
        assert!(vm.contains(0x11000, 4096));
    }
}
