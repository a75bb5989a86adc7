//! Tests of `ShmPool`, the page-granular allocator over memfd arenas: allocation, pages
//! returned and zeroed on drop, growth and exhaustion, and what a holder of one pool's
//! descriptor can and cannot reach.

use std::sync::atomic::Ordering;

use shm::{Mapping, PAGE_SIZE, PoolConfig, PoolStats, Prot, RotatingPage, Shm, ShmError, ShmPool};

const P: usize = PAGE_SIZE;

fn pool(first_pages: usize, max_pages: usize, limit_pages: usize) -> ShmPool {
    let limit = if limit_pages == usize::MAX { usize::MAX } else { limit_pages * P };
    ShmPool::new("test", PoolConfig { first_arena: first_pages * P, max_arena: max_pages * P, limit })
}

fn all_zero(m: &Mapping) -> bool {
    let mut buf = vec![0xffu8; m.len()];
    m.read(0, &mut buf).unwrap();
    buf.iter().all(|&b| b == 0)
}

#[test]
fn allocations_share_an_arena_without_overlapping() {
    let pool = pool(16, 16, usize::MAX);
    let a = pool.alloc(1).unwrap();
    let b = pool.alloc(2 * P + 1).unwrap();
    let c = pool.alloc(P).unwrap();
    assert_eq!((a.len(), b.len(), c.len()), (P, 3 * P, P));
    assert_eq!(pool.stats(), PoolStats { arenas: 1, reserved: 16 * P, used: 5 * P });
    // One memfd, disjoint page ranges in it.
    let fstat = |s: &Shm| rustix::fs::fstat(s.fd()).unwrap().st_ino;
    assert_eq!(fstat(&a), fstat(&b));
    let mut ranges: Vec<_> = [&a, &b, &c].iter().map(|s| (s.file_offset(), s.len() as u64)).collect();
    ranges.sort();
    assert!(ranges.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0), "{ranges:?}");
    // Each is its own region: offsets are relative, bounds are its own.
    a.fill_u32(0, P as u64, 0xaaaa_aaaa).unwrap();
    c.fill_u32(0, P as u64, 0xcccc_cccc).unwrap();
    assert!(all_zero(b.map()));
    assert_eq!(a.read_u32(P as u64 - 4), Ok(0xaaaa_aaaa));
    assert_eq!(a.read_u32(P as u64), Err(ShmError::OutOfBounds { offset: P as u64, len: 4, size: P as u64 }));
    assert!(a.map_range(0, 2 * P, Prot::ReadWrite).is_err());
    assert_ne!(a.id(), c.id());
    assert!(matches!(pool.alloc(0), Err(ShmError::BadSize { size: 0, .. })));
}

#[test]
fn a_dropped_region_returns_its_pages_zeroed() {
    let pool = pool(4, 4, usize::MAX);
    let a = pool.alloc(2 * P).unwrap();
    let at = a.file_offset();
    a.fill_u32(0, 2 * P as u64, 0x5ec7_e75e).unwrap();
    drop(a);
    assert_eq!(pool.stats().used, 0);
    let again = pool.alloc(2 * P).unwrap();
    assert_eq!(again.file_offset(), at, "first fit reuses the freed range");
    assert!(all_zero(again.map()), "the previous allocation's data must not show through");
    // Through a fresh mapping of the memfd too (what another mapper of the arena sees).
    let raw = Mapping::new(again.fd(), at, 2 * P, Prot::ReadOnly).unwrap();
    assert!(all_zero(&raw));
}

#[test]
fn freed_neighbours_coalesce() {
    let pool = pool(3, 3, 3);
    let (a, b, c) = (pool.alloc(P).unwrap(), pool.alloc(P).unwrap(), pool.alloc(P).unwrap());
    let first = a.file_offset().min(b.file_offset());
    drop(b);
    drop(a);
    // Only two adjacent free pages can hold it: the pool is at its limit.
    let two = pool.alloc(2 * P).unwrap();
    assert_eq!(two.file_offset(), first);
    drop((c, two));
    assert_eq!(pool.alloc(3 * P).unwrap().len(), 3 * P);
    assert_eq!(pool.stats().arenas, 1);
}

#[test]
fn a_window_keeps_its_pages_until_it_drops() {
    let pool = pool(4, 4, usize::MAX);
    let a = pool.alloc(P).unwrap();
    let at = a.file_offset();
    let client = a.map_range(0, P, Prot::ReadWrite).unwrap();
    drop(a);
    // The client can still reach the page, so it must not be anyone else's yet.
    let b = pool.alloc(P).unwrap();
    assert_ne!(b.file_offset(), at);
    client.write_u64(0, 7).unwrap();
    assert!(all_zero(b.map()));
    assert_eq!(pool.stats().used, 2 * P);
    drop(client);
    assert_eq!(pool.stats().used, P);
    let c = pool.alloc(P).unwrap();
    assert_eq!(c.file_offset(), at);
    assert_eq!(c.read_u64(0), Ok(0), "zeroed after the last holder let go");
}

#[test]
fn a_rotating_page_keeps_its_backing_page() {
    let pool = pool(4, 4, usize::MAX);
    let a = pool.alloc(P).unwrap();
    let at = a.file_offset();
    let page = RotatingPage::new(&a, 0).unwrap();
    drop(a);
    let b = pool.alloc(P).unwrap();
    assert_ne!(b.file_offset(), at);
    page.atomic_u64(0).unwrap().store(9, Ordering::Release);
    assert_eq!(b.load_u64(0, Ordering::Acquire), Ok(0));
    // Rotating away lets the page go.
    page.rotate_to(&b, 0).unwrap();
    assert_eq!(pool.alloc(P).unwrap().file_offset(), at);
}

#[test]
fn the_pool_grows_by_doubling_arenas_then_fails_typed() {
    let pool = pool(2, 4, 10);
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(pool.alloc(P).unwrap());
    }
    assert_eq!(pool.stats(), PoolStats { arenas: 1, reserved: 2 * P, used: 2 * P });
    held.push(pool.alloc(P).unwrap());
    assert_eq!(
        pool.stats(),
        PoolStats { arenas: 2, reserved: 6 * P, used: 3 * P },
        "the second arena is twice the first"
    );
    for _ in 0..3 {
        held.push(pool.alloc(P).unwrap());
    }
    assert_eq!(pool.stats().arenas, 2);
    // Doubling would want 4 more pages (capped at max_arena), the limit leaves exactly 4.
    held.push(pool.alloc(P).unwrap());
    assert_eq!(pool.stats(), PoolStats { arenas: 3, reserved: 10 * P, used: 7 * P });
    // A request larger than an arena would need an arena of its own, past the limit.
    let e = pool.alloc(5 * P).unwrap_err();
    assert_eq!(
        e,
        ShmError::Exhausted {
            pool: "test".into(),
            requested: 5 * P as u64,
            reserved: 10 * P as u64,
            limit: 10 * P as u64
        }
    );
    for _ in 0..3 {
        held.push(pool.alloc(P).unwrap());
    }
    assert!(matches!(pool.alloc(P), Err(ShmError::Exhausted { .. })));
    // Freeing makes room again without a new arena.
    held.pop();
    assert!(pool.alloc(P).is_ok());
    assert_eq!(pool.stats().arenas, 3);
}

#[test]
fn an_allocation_larger_than_an_arena_gets_its_own() {
    let pool = pool(2, 4, usize::MAX);
    let big = pool.alloc(9 * P).unwrap();
    assert_eq!(big.len(), 9 * P);
    assert_eq!(pool.stats(), PoolStats { arenas: 1, reserved: 9 * P, used: 9 * P });
}

#[test]
fn read_only_views_are_read_only_all_the_way_down() {
    let pool = pool(4, 4, usize::MAX);
    let page = pool.alloc(P).unwrap();
    page.write_u64(8, 42).unwrap();
    let ro = page.map_range(0, P, Prot::ReadOnly).unwrap();
    assert_eq!(ro.read_u64(8), Ok(42));
    assert_eq!(ro.write_u64(8, 1), Err(ShmError::ReadOnly));
    assert_eq!(ro.atomic_u64(8).unwrap_err(), ShmError::ReadOnly);
    // Its descriptor is opened read-only: it cannot be mapped writable again.
    let again = Mapping::new(ro.fd(), ro.file_offset(), P, Prot::ReadWrite);
    assert!(matches!(again, Err(ShmError::Os { what: "mmap", .. })), "{again:?}");
    let ro_again = Mapping::new(ro.fd(), ro.file_offset(), P, Prot::ReadOnly).unwrap();
    assert_eq!(ro_again.read_u64(8), Ok(42));
}

#[test]
fn windows_are_bounds_checked_views_of_one_mapping() {
    let shm = Shm::new("w", 4 * P).unwrap();
    let whole = shm.map_range(0, 4 * P, Prot::ReadWrite).unwrap();
    let w = whole.window(P as u64, 2 * P).unwrap();
    assert_eq!((w.file_offset(), w.len(), w.prot()), (P as u64, 2 * P, Prot::ReadWrite));
    w.write_u32(4, 0xfeed).unwrap();
    assert_eq!(shm.read_u32(P as u64 + 4), Ok(0xfeed));
    let size = 2 * P as u64;
    assert_eq!(w.read_u32(size), Err(ShmError::OutOfBounds { offset: size, len: 4, size }));
    let oob = |offset, len| ShmError::OutOfBounds { offset, len, size: 4 * P as u64 };
    assert_eq!(whole.window(3 * P as u64, 2 * P).unwrap_err(), oob(3 * P as u64, 2 * P as u64));
    assert_eq!(whole.window(u64::MAX - 4095, P).unwrap_err(), oob(u64::MAX - 4095, P as u64));
    assert_eq!(whole.window(8, P).unwrap_err(), ShmError::Misaligned { offset: 8, align: P as u64 });
    assert!(matches!(whole.window(0, 0), Err(ShmError::BadSize { size: 0, .. })));
    // A window of a read-only mapping is read-only.
    let ro = shm.map_range(0, 4 * P, Prot::ReadOnly).unwrap().window(P as u64, P).unwrap();
    assert_eq!(ro.write_u32(0, 1), Err(ShmError::ReadOnly));
    assert_eq!(ro.read_u32(4), Ok(0xfeed));
    // A window outlives the mapping it was cut from.
    drop(whole);
    assert_eq!(w.read_u32(4), Ok(0xfeed));
}

/// Two processes' pools: one process's descriptor, mapped whole, never shows the other's data.
#[test]
fn pools_do_not_share_memory() {
    let (p1, p2) = (pool(4, 4, usize::MAX), pool(4, 4, usize::MAX));
    let secret = p1.alloc(P).unwrap();
    secret.fill_u32(0, P as u64, 0x5ec7_e75e).unwrap();
    let mine = p2.alloc(P).unwrap();
    let fstat = |s: &Shm| rustix::fs::fstat(s.fd()).unwrap();
    let st = fstat(&mine);
    assert_ne!(st.st_ino, fstat(&secret).st_ino);
    let all = Mapping::new(mine.fd(), 0, st.st_size as usize, Prot::ReadOnly).unwrap();
    assert!(all_zero(&all));
}

/// An allocation or a free of the `i`-th live region (modulo how many there are).
#[derive(Debug, Clone)]
enum Op {
    Alloc(usize),
    Free(usize),
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![(1usize..6).prop_map(Op::Alloc), (0usize..64).prop_map(Op::Free)]
}

proptest::proptest! {
    /// Any sequence of allocations and frees: live regions never overlap, every new region
    /// reads zero although its pages may have held another's data, and the pool's count of
    /// used bytes is the sum of the live regions.
    #[test]
    fn live_regions_are_disjoint_and_new_ones_zeroed(ops in proptest::collection::vec(op(), 1..60)) {
        let pool = pool(4, 16, 64);
        let mut live: Vec<std::sync::Arc<Shm>> = Vec::new();
        let ino = |s: &Shm| rustix::fs::fstat(s.fd()).unwrap().st_ino;
        for op in ops {
            match op {
                Op::Alloc(pages) => match pool.alloc(pages * P) {
                    Ok(s) => {
                        proptest::prop_assert!(all_zero(s.map()));
                        for l in &live {
                            let disjoint = ino(l) != ino(&s)
                                || l.file_offset() + l.len() as u64 <= s.file_offset()
                                || s.file_offset() + s.len() as u64 <= l.file_offset();
                            proptest::prop_assert!(disjoint);
                        }
                        s.fill_u32(0, s.len() as u64, 0xdead_beef).unwrap();
                        live.push(s);
                    }
                    Err(e) => proptest::prop_assert!(matches!(e, ShmError::Exhausted { .. }), "{e}"),
                },
                Op::Free(i) if !live.is_empty() => {
                    live.swap_remove(i % live.len());
                }
                Op::Free(_) => {}
            }
            let used: usize = live.iter().map(|s| s.len()).sum();
            proptest::prop_assert_eq!(pool.stats().used, used);
            proptest::prop_assert!(pool.stats().reserved <= 64 * P);
        }
    }
}

#[test]
fn an_arena_a_device_pinned_zeroes_freed_pages_in_place() {
    // A device that registered the arena for DMA keeps the physical pages it pinned: a hole
    // punched in the file would give the CPU fresh pages the device never sees (it would go
    // on reading the old data). Observable as the file's allocated blocks: a hole frees them,
    // zeroing in place keeps them.
    for pinned in [false, true] {
        let pool = pool(4, 4, usize::MAX);
        let keep = pool.alloc(P).unwrap(); // keeps the arena (and its descriptor) alive
        let a = pool.alloc(2 * P).unwrap();
        if pinned {
            a.map().dma_area().pin();
        }
        a.fill_u32(0, 2 * P as u64, 0x5ec7_e75e).unwrap();
        let blocks = |s: &Shm| rustix::fs::fstat(s.fd()).unwrap().st_blocks;
        let before = blocks(&keep);
        drop(a);
        let after = blocks(&keep);
        if pinned {
            assert_eq!(after, before, "a pinned arena's pages stay the file's");
        } else {
            assert!(after < before, "an unpinned arena gives freed pages back ({before} -> {after} blocks)");
        }
        let again = pool.alloc(2 * P).unwrap();
        assert!(all_zero(again.map()), "pinned: {pinned}");
    }
}
