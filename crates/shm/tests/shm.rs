//! Tests of the public `shm` API against plain `Vec<u8>` models.

use std::sync::atomic::Ordering;

use proptest::prelude::*;
use shm::{Mapping, PAGE_SIZE, Prot, RotatingPage, Shm, ShmError};

fn oob(offset: u64, len: u64, size: u64) -> ShmError {
    ShmError::OutOfBounds { offset, len, size }
}

fn mis(offset: u64, align: u64) -> ShmError {
    ShmError::Misaligned { offset, align }
}

#[test]
fn page_size_is_4096() {
    assert_eq!(rustix::param::page_size(), PAGE_SIZE);
}

#[test]
fn new_is_zeroed_rounded_and_rejects_zero() {
    let shm = Shm::new("zero", 5000).unwrap();
    assert_eq!(shm.len(), 2 * PAGE_SIZE);
    let mut buf = vec![0xffu8; shm.len()];
    shm.read(0, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    assert!(matches!(Shm::new("zero", 0), Err(ShmError::BadSize { size: 0, .. })));
    assert!(matches!(Shm::new("huge", usize::MAX), Err(ShmError::BadSize { .. })));
    let other = Shm::new("other", 1).unwrap();
    assert_ne!(shm.id(), other.id());
}

#[test]
fn two_mappings_see_each_other() {
    let shm = Shm::new("two", 3 * PAGE_SIZE).unwrap();
    let m = shm.map_range(PAGE_SIZE as u64, 2 * PAGE_SIZE, Prot::ReadWrite).unwrap();
    assert_eq!((m.file_offset(), m.len(), m.prot()), (PAGE_SIZE as u64, 2 * PAGE_SIZE, Prot::ReadWrite));
    shm.write_u32(PAGE_SIZE as u64 + 8, 0xdead_beef).unwrap();
    assert_eq!(m.read_u32(8).unwrap(), 0xdead_beef);
    m.write(100, b"hello").unwrap();
    let mut got = [0; 5];
    shm.read(PAGE_SIZE as u64 + 100, &mut got).unwrap();
    assert_eq!(&got, b"hello");
    // A mapping made from a borrowed fd (as a receiving process would) sees the same bytes.
    let again = Mapping::new(m.fd(), 0, 16, Prot::ReadOnly).unwrap();
    drop(m);
    assert_eq!(again.read_u32(PAGE_SIZE as u64 + 8).unwrap_err(), oob(0x1008, 4, 16));
    shm.write_u64(0, 7).unwrap();
    assert_eq!(again.read_u64(0).unwrap(), 7);
}

#[test]
fn read_only_mapping() {
    let shm = Shm::new("ro", PAGE_SIZE).unwrap();
    let ro = shm.map_range(0, PAGE_SIZE, Prot::ReadOnly).unwrap();
    assert_eq!(ro.write(0, &[1]), Err(ShmError::ReadOnly));
    assert_eq!(ro.write_u32(0, 1), Err(ShmError::ReadOnly));
    assert_eq!(ro.write_u64(0, 1), Err(ShmError::ReadOnly));
    assert_eq!(ro.write_u32s(0, &[1]), Err(ShmError::ReadOnly));
    assert_eq!(ro.fill_u32(0, 4, 1), Err(ShmError::ReadOnly));
    assert_eq!(Mapping::copy(&shm, 0, &ro, 8, 8), Err(ShmError::ReadOnly));
    assert_eq!(ro.atomic_u64(8).unwrap_err(), ShmError::ReadOnly);
    assert_eq!(ro.atomic_u32(8).unwrap_err(), ShmError::ReadOnly);
    shm.atomic_u64(8).unwrap().store(42, Ordering::Release);
    assert_eq!(ro.load_u64(8, Ordering::Acquire), Ok(42));
    Mapping::copy(&ro, 8, &shm, 16, 8).unwrap();
    assert_eq!(shm.read_u64(16), Ok(42));
}

#[test]
fn bounds_never_panic() {
    let shm = Shm::new("oob", PAGE_SIZE).unwrap();
    let size = PAGE_SIZE as u64;
    let m = shm.map_range(0, 100, Prot::ReadWrite).unwrap();
    assert_eq!(m.len(), 100);
    // The page is mapped, but bounds checks use the requested length.
    assert_eq!(m.read_u32(98), Err(oob(98, 4, 100)));
    assert_eq!(m.read(100, &mut []), Ok(()));
    assert_eq!(m.read(101, &mut []), Err(oob(101, 0, 100)));
    for off in [size - 3, size, u64::MAX, u64::MAX - 7] {
        assert_eq!(shm.read(off, &mut [0; 4]), Err(oob(off, 4, size)));
        assert_eq!(shm.write(off, &[0; 4]), Err(oob(off, 4, size)));
        assert_eq!(shm.read_u32s(off, &mut [0; 1]), Err(oob(off, 4, size)));
        assert_eq!(shm.write_u32s(off, &[0; 1]), Err(oob(off, 4, size)));
        assert_eq!(shm.read_u32(off), Err(oob(off, 4, size)));
        assert_eq!(shm.write_u32(off, 0), Err(oob(off, 4, size)));
        assert_eq!(shm.read_u64(off), Err(oob(off, 8, size)));
        assert_eq!(shm.write_u64(off, 0), Err(oob(off, 8, size)));
        assert_eq!(shm.fill_u32(off, 4, 0), Err(oob(off, 4, size)));
        assert_eq!(shm.atomic_u64(off).unwrap_err(), oob(off, 8, size));
        assert_eq!(shm.atomic_u32(off).unwrap_err(), oob(off, 4, size));
        assert_eq!(shm.load_u64(off, Ordering::Relaxed), Err(oob(off, 8, size)));
        assert_eq!(Mapping::copy(&shm, off, &shm, 0, 4), Err(oob(off, 4, size)));
        assert_eq!(Mapping::copy(&shm, 0, &shm, off, 4), Err(oob(off, 4, size)));
    }
    assert_eq!(shm.fill_u32(1, u64::MAX, 0), Err(oob(1, u64::MAX, size)));
    let e = Err(oob(0, u64::MAX, size));
    assert_eq!(Mapping::copy(&shm, 0, &shm, 0, u64::MAX), e);
    let map = |off, len| shm.map_range(off, len, Prot::ReadOnly).map(|m| m.len());
    assert_eq!(map(0, PAGE_SIZE + 1), Err(oob(0, size + 1, size)));
    assert_eq!(map(size, 1), Err(oob(size, 1, size)));
    assert_eq!(map(u64::MAX - 4095, 4096), Err(oob(u64::MAX - 4095, 4096, size)));
    assert_eq!(map(8, 8), Err(mis(8, size)));
    assert!(matches!(map(0, 0), Err(ShmError::BadSize { size: 0, .. })));
    assert!(matches!(map(0, usize::MAX), Err(ShmError::BadSize { .. })));
}

#[test]
fn alignment_rules() {
    let shm = Shm::new("align", PAGE_SIZE).unwrap();
    assert_eq!(shm.atomic_u64(4).unwrap_err(), mis(4, 8));
    assert_eq!(shm.atomic_u32(2).unwrap_err(), mis(2, 4));
    assert_eq!(shm.load_u64(12, Ordering::Relaxed), Err(mis(12, 8)));
    assert_eq!(shm.read_u32s(2, &mut [0]), Err(mis(2, 4)));
    assert_eq!(shm.write_u32s(6, &[0]), Err(mis(6, 4)));
    // Scalar accessors work at any offset and are little-endian.
    shm.write_u64(3, 0x0807_0605_0403_0201).unwrap();
    shm.write_u32(13, 0x0c0b_0a09).unwrap();
    let mut b = [0; 18];
    shm.read(0, &mut b).unwrap();
    assert_eq!(b, [0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 9, 10, 11, 12, 0]);
    assert_eq!(shm.read_u64(3), Ok(0x0807_0605_0403_0201));
    assert_eq!(shm.read_u32(5), Ok(0x0605_0403));
    shm.write_u32s(20, &[0x0403_0201, 0x0807_0605]).unwrap();
    assert_eq!(shm.read_u64(20), Ok(0x0807_0605_0403_0201));
    let mut w = [0; 2];
    shm.read_u32s(4, &mut w).unwrap();
    assert_eq!(w, [0x0504_0302, 0x0008_0706]);
    let a = shm.atomic_u32(40).unwrap();
    a.fetch_add(5, Ordering::AcqRel);
    assert_eq!(shm.read_u32(40), Ok(5));
}

/// The reference for `fill_u32`: byte `offset + i` gets byte `i % 4` of the pattern.
fn fill_model(model: &mut [u8], offset: usize, len: usize, pattern: u32) {
    for (i, b) in model[offset..offset + len].iter_mut().enumerate() {
        *b = pattern.to_le_bytes()[i % 4];
    }
}

fn contents(m: &Mapping) -> Vec<u8> {
    let mut v = vec![0; m.len()];
    m.read(0, &mut v).unwrap();
    v
}

#[test]
fn fill_partial_words_and_odd_offsets() {
    let shm = Shm::new("fill", PAGE_SIZE).unwrap();
    let mut model = vec![0u8; PAGE_SIZE];
    let mut pattern = 0x1122_3344u32;
    for offset in 0..24 {
        for len in 0..40 {
            pattern = pattern.rotate_left(5) ^ 0x9e37_79b9;
            shm.fill_u32(offset as u64, len as u64, pattern).unwrap();
            fill_model(&mut model, offset, len, pattern);
            assert_eq!(contents(&shm), model, "offset {offset} len {len}");
        }
    }
}

#[test]
fn copy_overlap_both_directions() {
    let shm = Shm::new("copy", 4 * PAGE_SIZE).unwrap();
    let init: Vec<u8> = (0..shm.len()).map(|i| (i * 7 + 3) as u8).collect();
    for (src, dst) in [(0, 3), (3, 0), (5, 13), (13, 5), (8, 16), (16, 8), (1, 1), (0, 5000)] {
        for len in [0, 1, 5, 8, 13, 31, 64, 5000, 9000] {
            shm.write(0, &init).unwrap();
            Mapping::copy(&shm, src, &shm, dst, len).unwrap();
            let mut model = init.clone();
            let (s, d, l) = (src as usize, dst as usize, len as usize);
            model.copy_within(s..s + l, d);
            assert_eq!(contents(&shm), model, "src {src} dst {dst} len {len}");
        }
    }
}

#[test]
fn copy_across_mappings_of_one_file_respects_file_overlap() {
    // `a` covers file pages 0..3 and `b` pages 1..4: the same file bytes at different addresses.
    let shm = Shm::new("alias", 4 * PAGE_SIZE).unwrap();
    let a = shm.map_range(0, 3 * PAGE_SIZE, Prot::ReadWrite).unwrap();
    let b = shm.map_range(PAGE_SIZE as u64, 3 * PAGE_SIZE, Prot::ReadWrite).unwrap();
    let init: Vec<u8> = (0..4 * PAGE_SIZE).map(|i| (i % 251) as u8).collect();
    let p = PAGE_SIZE as u64;
    // File 4090.. -> file 4100.. (forward overlap) and file 4100.. -> file 4090.. (backward),
    // with lengths above the internal chunk size.
    for (src, s_off, dst, d_off, file_s, file_d) in
        [(&a, p - 6, &b, 4, 4090, 4100), (&b, 4, &a, p - 6, 4100, 4090), (&a, 0, &b, 0, 0, 4096)]
    {
        shm.write(0, &init).unwrap();
        Mapping::copy(src, s_off, dst, d_off, 5000).unwrap();
        let mut model = init.clone();
        model.copy_within(file_s..file_s + 5000, file_d);
        assert_eq!(contents(&shm), model);
    }
}

#[test]
fn copy_megabytes() {
    let shm = Shm::new("big", 16 << 20).unwrap();
    shm.fill_u32(0, 8 << 20, 0xa5a5_0001).unwrap();
    let start = std::time::Instant::now();
    Mapping::copy(&shm, 3, &shm, (8 << 20) + 1, (8 << 20) - 3).unwrap();
    assert!(start.elapsed() < std::time::Duration::from_secs(5));
    assert_eq!(shm.read_u32((8 << 20) + 1), Ok(0xa500_01a5));
}

#[test]
fn atomics_publish_data_between_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Mapping>();
    assert_send_sync::<Shm>();
    assert_send_sync::<RotatingPage>();
    let shm = Shm::new("threads", PAGE_SIZE).unwrap();
    let client = shm.map_range(0, PAGE_SIZE, Prot::ReadOnly).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            shm.write(64, &[9; 100]).unwrap();
            shm.atomic_u64(0).unwrap().store(1, Ordering::Release);
        });
        while client.load_u64(0, Ordering::Acquire) != Ok(1) {
            std::hint::spin_loop();
        }
        let mut got = [0; 100];
        client.read(64, &mut got).unwrap();
        assert_eq!(got, [9; 100]);
    });
}

#[test]
fn rotating_page() {
    let bar = Shm::new("bar", 2 * PAGE_SIZE).unwrap();
    let dummy = Shm::new("dummy", PAGE_SIZE).unwrap();
    let p = PAGE_SIZE as u64;
    let page = RotatingPage::new(&bar, p).unwrap();
    assert_eq!(page.current(), (bar.id(), p));
    let bell = page.atomic_u64(16).unwrap();
    bell.store(1, Ordering::Release);
    page.rotate_to(&dummy, 0).unwrap();
    assert_eq!(page.current(), (dummy.id(), 0));
    assert_eq!(bell.load(Ordering::Acquire), 0, "the dummy page shows through");
    bell.store(2, Ordering::Release);
    assert_eq!(bar.load_u64(p + 16, Ordering::Acquire), Ok(1));
    assert_eq!(dummy.load_u64(16, Ordering::Acquire), Ok(2));
    page.rotate_to(&bar, p).unwrap();
    assert_eq!(bell.load(Ordering::Acquire), 1);
    // Bad targets leave the page where it was.
    assert_eq!(page.rotate_to(&dummy, p).unwrap_err(), oob(p, p, p));
    assert_eq!(page.rotate_to(&bar, 8).unwrap_err(), mis(8, p));
    assert_eq!(page.rotate_to(&bar, u64::MAX).unwrap_err(), oob(u64::MAX, p, 2 * p));
    assert!(RotatingPage::new(&dummy, p).is_err());
    assert_eq!(page.current(), (bar.id(), p));
    assert_eq!(page.atomic_u64(4092).unwrap_err(), oob(4092, 8, p));
    assert_eq!(page.atomic_u64(12).unwrap_err(), mis(12, 8));
    assert_eq!(page.atomic_u64(u64::MAX).unwrap_err(), oob(u64::MAX, 8, p));
}

/// An operation on mapping `a` (the whole 3-page region, `false`) or `b` (file pages 1..3,
/// `true`). Offsets may run past the end so that errors are exercised too.
#[derive(Debug, Clone)]
enum Op {
    Write(bool, u64, Vec<u8>),
    Fill(bool, u64, u64, u32),
    Copy(bool, u64, bool, u64, u64),
}

fn op() -> impl Strategy<Value = Op> {
    let (b, off) = (any::<bool>, || 0..3 * PAGE_SIZE as u64 + 16);
    let bytes = prop::collection::vec(any::<u8>(), 0..300);
    prop_oneof![
        (b(), off(), bytes).prop_map(|(b, o, v)| Op::Write(b, o, v)),
        (b(), off(), 0..600u64, any::<u32>()).prop_map(|(b, o, l, p)| Op::Fill(b, o, l, p)),
        (b(), off(), b(), off(), 0..9000u64).prop_map(|(sb, s, db, d, l)| Op::Copy(sb, s, db, d, l)),
    ]
}

proptest! {
    #[test]
    fn ops_match_vec_model(ops in prop::collection::vec(op(), 1..12)) {
        let shm = Shm::new("prop", 3 * PAGE_SIZE).unwrap();
        let b = shm.map_range(PAGE_SIZE as u64, 2 * PAGE_SIZE, Prot::ReadWrite).unwrap();
        let pick = |is_b: bool| if is_b { (&b, PAGE_SIZE) } else { (shm.map(), 0) };
        let mut model = vec![0u8; 3 * PAGE_SIZE];
        for op in ops {
            match op {
                Op::Write(b, off, bytes) => {
                    let (m, base) = pick(b);
                    let ok = m.write(off, &bytes).is_ok();
                    prop_assert_eq!(ok, off as usize + bytes.len() <= m.len());
                    if ok {
                        let at = base + off as usize;
                        model[at..at + bytes.len()].copy_from_slice(&bytes);
                    }
                }
                Op::Fill(b, off, len, pattern) => {
                    let (m, base) = pick(b);
                    let ok = m.fill_u32(off, len, pattern).is_ok();
                    prop_assert_eq!(ok, (off + len) as usize <= m.len());
                    if ok {
                        fill_model(&mut model, base + off as usize, len as usize, pattern);
                    }
                }
                Op::Copy(src_b, src, dst_b, dst, len) => {
                    let ((sm, sbase), (dm, dbase)) = (pick(src_b), pick(dst_b));
                    let ok = Mapping::copy(sm, src, dm, dst, len).is_ok();
                    let fits = (src + len) as usize <= sm.len() && (dst + len) as usize <= dm.len();
                    prop_assert_eq!(ok, fits);
                    if ok {
                        let s = sbase + src as usize;
                        model.copy_within(s..s + len as usize, dbase + dst as usize);
                    }
                }
            }
        }
        prop_assert_eq!(contents(&shm), model);
    }
}
