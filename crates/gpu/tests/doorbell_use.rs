//! What the firmware tells the KMD about a queue's doorbell ([`Gpu::doorbell_of`]): which BAR
//! word or global-doorbell bit it answers to, and for a BAR word when it was last used — bound,
//! or seen rung — so the KMD can victimize the least recently rung doorbell without a kernel
//! call on the client's data path.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use abi::doorbell::DoorbellModel;
use abi::ring::{RPTR_OFFSET, WPTR_OFFSET};
use abi::{EngineId, EngineKind, Priority};
use gpu::{BoundDoorbell, FwQueueId, Gpu, GpuConfig, QueueConfig, cmd};
use shm::Shm;

fn device(model: DoorbellModel) -> Gpu {
    Gpu::new(GpuConfig {
        engines: vec![EngineKind::Compute, EngineKind::Copy],
        doorbell_pages: 4,
        doorbell_model: model,
        ..GpuConfig::default()
    })
    .unwrap()
}

/// An idle queue on `engine` (a ring and control block of its own in a fresh address space).
fn queue(gpu: &mut Gpu, engine: u32) -> FwQueueId {
    let vmid = gpu.command(cmd::CreateVm {}).unwrap();
    let (ring, control): (Arc<Shm>, Arc<Shm>) = (Shm::new("ring", 4096).unwrap(), Shm::new("control", 4096).unwrap());
    gpu.command(cmd::Map::whole(vmid, 0x10_0000, ring, true)).unwrap();
    gpu.command(cmd::Map::whole(vmid, 0x20_0000, control, true)).unwrap();
    gpu.command(cmd::AddQueue {
        config: QueueConfig {
            vmid,
            engine: EngineId(engine),
            ring_va: 0x10_0000,
            ring_bytes: 4096,
            rptr_va: 0x20_0000 + RPTR_OFFSET,
            wptr_va: 0x20_0000 + WPTR_OFFSET,
            last_queued_va: None,
            kernel_page: abi::queue::KernelPageView::new(Shm::new("kernel-page", 4096).unwrap()).unwrap(),
            context_save: Shm::new("context-save", gpu::compute::CONTEXT_SAVE_BYTES as usize).unwrap(),
            fence_logs: None,
            privileged: false,
            priority: Priority::Normal,
        },
    })
    .unwrap()
}

fn last_used(gpu: &Gpu, q: FwQueueId) -> u64 {
    match gpu.doorbell_of(q).unwrap() {
        Some(BoundDoorbell::Word { last_used, .. }) => last_used,
        other => panic!("not bound to a BAR word: {other:?}"),
    }
}

/// Rings BAR word `index` with `value` (a change of the word: a bind resets it to the
/// queue's wptr, 0 here).
fn ring(gpu: &Gpu, index: u32, value: u64) {
    gpu.bar().atomic_u64(index as u64 * 8).unwrap().store(value, Ordering::Release);
}

#[test]
fn binds_and_rings_advance_a_doorbells_last_use_across_engines() {
    let mut gpu = device(DoorbellModel::Dedicated);
    let (a, b) = (queue(&mut gpu, 0), queue(&mut gpu, 1));
    assert_eq!(gpu.doorbell_of(a).unwrap(), None, "not bound yet");
    gpu.command(cmd::BindDoorbell { queue: a, index: 600 }).unwrap();
    gpu.command(cmd::BindDoorbell { queue: b, index: 700 }).unwrap();
    assert!(matches!(gpu.doorbell_of(a).unwrap(), Some(BoundDoorbell::Word { index: 600, .. })));
    assert!(last_used(&gpu, b) > last_used(&gpu, a), "bound later: used later");

    // a rings (on another engine than b): now a is the more recent.
    ring(&gpu, 600, 4);
    gpu.poll_doorbells();
    let after_ring = last_used(&gpu, a);
    assert!(after_ring > last_used(&gpu, b));
    // No new value, no ring: nothing moves.
    gpu.poll_doorbells();
    assert_eq!(last_used(&gpu, a), after_ring);
    // b rings: b is the more recent again.
    ring(&gpu, 700, 4);
    gpu.poll_doorbells();
    assert!(last_used(&gpu, b) > last_used(&gpu, a));

    // Unbound: no doorbell. Bound again: a use.
    gpu.command(cmd::UnbindDoorbell { queue: a }).unwrap();
    assert_eq!(gpu.doorbell_of(a).unwrap(), None);
    gpu.command(cmd::BindDoorbell { queue: a, index: 601 }).unwrap();
    assert!(last_used(&gpu, a) > last_used(&gpu, b));
}

#[test]
fn a_global_doorbell_binding_reports_its_bit() {
    let mut gpu = device(DoorbellModel::Global);
    let q = queue(&mut gpu, 0);
    gpu.command(cmd::BindGlobalDoorbell { queue: q, page: 2, bit: 17 }).unwrap();
    assert_eq!(gpu.doorbell_of(q).unwrap(), Some(BoundDoorbell::Bit { page: 2, bit: 17 }));
}
