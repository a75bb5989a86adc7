//! Process memory in arenas: what one process's descriptors reach, and what a freed
//! allocation leaves behind (nothing), on the deterministic driver.

mod common;

use std::os::unix::fs::MetadataExt;

use abi::port::{AllocationDesc, KernelError, KernelPort};
use shm::{Mapping, Prot};

/// The size and inode of the file behind a mapping.
fn stat(m: &Mapping) -> (usize, u64) {
    let meta = std::fs::File::from(m.fd().try_clone_to_owned().unwrap()).metadata().unwrap();
    (meta.len() as usize, meta.ino())
}

fn all_zero(m: &Mapping) -> bool {
    let mut buf = vec![0xffu8; m.len()];
    m.read(0, &mut buf).unwrap();
    buf.iter().all(|&b| b == 0)
}

/// The whole file behind a mapping, mapped read-only: everything its descriptor reaches.
fn whole_file(m: &Mapping) -> Mapping {
    Mapping::new(m.fd(), 0, stat(m).0, Prot::ReadOnly).unwrap()
}

fn contains_word(m: &Mapping, word: u32) -> bool {
    let mut words = vec![0u32; m.len() / 4];
    m.read_u32s(0, &mut words).unwrap();
    words.contains(&word)
}

#[test]
fn a_process_descriptors_reach_only_its_own_memory() {
    const SECRET: u32 = 0x5ec7_e75e;
    let sys = common::sim();
    let p1 = common::RawProc::open(&sys);
    let p2 = common::RawProc::open(&sys);
    let secret = p1.port.map_allocation(p1.ring.handle).unwrap();
    secret.fill_u32(0, 4096, SECRET).unwrap();
    let q1 = p1.create(p1.desc(abi::queue::DOORBELL_INDEX_ANY)).unwrap();
    let q2 = p2.create(p2.desc(abi::queue::DOORBELL_INDEX_ANY)).unwrap();
    // The client's view of its allocation: its arena holds its allocations only.
    let mine = p2.port.map_allocation(p2.ring.handle).unwrap();
    assert_eq!(mine.prot(), Prot::ReadWrite);
    assert!(!contains_word(&whole_file(&mine), SECRET));
    let ino = |m: &Mapping| stat(m).1;
    assert_ne!(ino(&mine), ino(&secret));
    // Its kernel page: read-only, in an arena apart from its allocations, and its descriptor
    // cannot be mapped writable (the client could otherwise forge its queue's status).
    let kp = &q2.kernel_page;
    assert_eq!(kp.prot(), Prot::ReadOnly);
    assert_ne!(ino(kp), ino(&mine));
    assert_ne!(ino(kp), ino(&q1.kernel_page));
    assert!(matches!(Mapping::new(kp.fd(), kp.file_offset(), 4096, Prot::ReadWrite), Err(shm::ShmError::Os { .. })));
    assert!(!contains_word(&whole_file(kp), SECRET));
}

#[test]
fn a_freed_allocation_is_reused_only_zeroed_and_only_once_unreachable() {
    let sys = common::sim();
    let p = common::RawProc::open(&sys);
    let alloc = |bytes| p.port.allocate(p.dev, &AllocationDesc::system(bytes)).unwrap();
    let a = alloc(8192);
    let view = p.port.map_allocation(a.handle).unwrap();
    view.fill_u32(0, 8192, 0xa11c_a7ed).unwrap();
    p.port.free(a.handle).unwrap();
    // The client still holds a view of the freed pages: a new allocation must not get them.
    let b = alloc(8192);
    let b_view = p.port.map_allocation(b.handle).unwrap();
    assert_ne!(b_view.file_offset(), view.file_offset());
    assert!(all_zero(&b_view));
    let freed_at = view.file_offset();
    drop(view);
    let c = alloc(8192);
    let c_view = p.port.map_allocation(c.handle).unwrap();
    assert_eq!(c_view.file_offset(), freed_at, "the pages came back once nothing could reach them");
    assert!(all_zero(&c_view), "zeroed before reuse");
    // The freed handle is gone, and so is its GPU mapping (a new one never reuses its VA).
    assert!(matches!(p.port.map_allocation(a.handle), Err(KernelError::BadHandle { .. })));
    assert!(c.va > a.va + 8192 && b.va > a.va + 8192);
}

#[test]
fn an_allocation_a_doorbell_references_is_not_freed_and_keeps_its_pages() {
    let sys = common::sim();
    let p = common::RawProc::open(&sys);
    let q = p.create(p.desc(abi::queue::DOORBELL_INDEX_ANY)).unwrap();
    let _db = p.doorbell(q.handle).unwrap();
    let ring = p.port.map_allocation(p.ring.handle).unwrap();
    ring.write_u32(0, 0x1234).unwrap();
    assert!(matches!(p.port.free(p.ring.handle), Err(KernelError::InUse { .. })));
    let other = p.port.allocate(p.dev, &AllocationDesc::system(4096)).unwrap();
    let other = p.port.map_allocation(other.handle).unwrap();
    assert_ne!(other.file_offset(), ring.file_offset());
    drop(ring);
    let again = p.port.map_allocation(p.ring.handle).unwrap();
    assert_eq!(again.read_u32(0), Ok(0x1234));
}
