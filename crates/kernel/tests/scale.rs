//! Scale: queues do not cost a file descriptor (or an `mmap`) per allocation.
//!
//! Every allocation behind a queue (ring, ring control, kernel page, fence logs, context save)
//! is pages of a few per-process memfd arenas, and the client's views are windows onto the
//! arena's one mapping. This binary holds a single test, because it counts the whole test
//! process's descriptors and mappings (`/proc/self/fd`, `/proc/self/maps`), which tests
//! running beside it in the same process would disturb.

mod common;

use abi::EngineKind;
use umd::{CommandBuffer, QueueOptions};

/// Queues created; with a descriptor per allocation (about 16 per queue) this alone would
/// open thousands.
const QUEUES: usize = 256;

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd").count()
}

fn mmaps() -> usize {
    std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps").lines().count()
}

#[test]
fn hundreds_of_queues_take_a_few_descriptors_and_about_a_mapping_each() {
    let sys = common::sim();
    let (fds_before, maps_before) = (open_fds(), mmaps());
    let mut clients = Vec::new();
    let mut queues = Vec::new();
    while queues.len() < QUEUES {
        let c = common::client(&sys);
        let engine = c.device.engine(EngineKind::Compute).unwrap();
        let per_process = c.device.info().engines.iter().find(|e| e.id == engine).unwrap().doorbell_count as usize;
        for _ in 0..per_process.min(QUEUES - queues.len()) {
            queues.push(c.ctx.create_queue(QueueOptions { ring_bytes: 4096, ..QueueOptions::user_mode() }).unwrap());
        }
        clients.push(c);
    }
    // They work: each writes its own word of its process's buffer.
    let mut cb = CommandBuffer::new();
    let mut done = Vec::new();
    for (i, q) in queues.iter_mut().enumerate() {
        let c = &clients[i * clients.len() / QUEUES];
        cb.clear();
        cb.write_u32(c.buf.va() + 4 * (i as u64 % 1024), i as u32 + 1);
        done.push(q.submit(&cb).unwrap());
    }
    sys.settle();
    for (q, v) in queues.iter().zip(&done) {
        assert!(q.completed() >= *v);
    }
    let (fds, maps) = (open_fds() - fds_before, mmaps() - maps_before);
    // Per process: three arenas (allocations, client-readable, private) and the read-only
    // descriptor of the readable one, twice over at most as arenas double; plus the KMD's
    // context-save arenas. Nothing per queue.
    let fd_bound = 10 * clients.len() + 10;
    assert!(
        fds <= fd_bound,
        "{fds} descriptors opened for {QUEUES} queues in {} processes (bound {fd_bound})",
        clients.len()
    );
    // Per queue: its doorbell's CPU page (a page of address space whose backing rotates).
    // Per arena: a read-write and at most one read-only mapping.
    let map_bound = QUEUES + 2 * fd_bound;
    assert!(maps <= map_bound, "{maps} mappings made for {QUEUES} queues (bound {map_bound})");
}

/// `SystemConfig::max_processes` (what the simulator checks a scenario against before it
/// runs) is the number of processes the kernel really opens before it refuses one, for the
/// doorbell layouts that change it: the default, a small BAR, a doorbell pool, an aggregated
/// doorbell page per process, and both.
#[test]
fn max_processes_is_where_the_kernel_refuses_the_next_process() {
    let base = kernel::SystemConfig::default();
    let small =
        kernel::SystemConfig { gpu: gpu::GpuConfig { doorbell_pages: 6, ..gpu::GpuConfig::default() }, ..base.clone() };
    let pooled = kernel::SystemConfig { doorbell_pool: Some(24), ..base.clone() };
    let aggregated = kernel::SystemConfig {
        gpu: gpu::GpuConfig { misses_unmapped_doorbells: true, ..gpu::GpuConfig::default() },
        ..base.clone()
    };
    let both = kernel::SystemConfig { doorbell_pool: Some(4), ..aggregated.clone() };
    for (name, cfg) in
        [("default", base), ("small", small), ("pooled", pooled), ("aggregated", aggregated), ("both", both)]
    {
        let max = cfg.max_processes();
        let sys = kernel::System::sim(cfg).unwrap();
        let mut open = Vec::new();
        let refused = loop {
            match sys.open_process() {
                Ok(p) => open.push(p),
                Err(e) => break e,
            }
            assert!(open.len() <= 4096, "{name}: no limit");
        };
        assert_eq!(open.len() as u32, max, "{name}: refused with {refused}");
        assert!(refused.to_string().contains("doorbell pages"), "{name}: {refused}");
    }
}
