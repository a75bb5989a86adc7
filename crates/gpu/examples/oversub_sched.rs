//! The firmware's cost under oversubscription, measured without the kernel: `QUEUES` queues,
//! each given `CBS` command buffers (a `WRITE_DATA` and a `PROGRESS_FENCE`) up front, over
//! `SLOTS` hardware slots, driven deterministically (poll doorbells, step, idle timer,
//! interrupts; the clock advances 1 µs a step) until every packet has run.
//!
//! Queues are spread over address spaces of 256 (one per process, as the kernel's doorbell
//! pages give them), and like the kernel's small doorbell pool only the first 16 have a
//! doorbell: the others' work is found through the wptr re-read of a doorbell unbind. Only
//! the drive loop is timed; the best of `REPS` runs is reported.
//!
//! ```text
//! cargo run --release -p gpu --example oversub_sched -- [QUEUES [CBS [SLOTS [REPS]]]]
//! cargo run --release -p gpu --example oversub_sched -- 1000 4 8 5
//! cargo run --release -p gpu --example oversub_sched -- 8 500 8 5
//! ```

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use abi::packet::{DataWidth, Packet};
use abi::queue::PROGRESS_COMPLETED_OFFSET;
use abi::ring::{self, RING_CONTROL_BYTES, RPTR_OFFSET, WPTR_OFFSET};
use abi::{EngineId, EngineKind, Priority};
use gpu::{Gpu, GpuConfig, QueueConfig, Time, cmd};
use shm::Shm;

const PER_VM: usize = 256;
const DOORBELLS: usize = 16;
const DATA: u64 = 0x10_0000;
const CONTROL: u64 = 0x20_0000;
const RINGS: u64 = 0x1_0000_0000;

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().expect("a number")).collect();
    let arg = |i: usize, d: usize| args.get(i).copied().unwrap_or(d);
    let (queues, cbs, slots, reps) = (arg(0, 1000), arg(1, 4), arg(2, 8), arg(3, 5));
    let mut best = Duration::MAX;
    let mut steps = 0;
    for _ in 0..reps {
        let (t, s) = run(queues, cbs, slots as u32);
        best = best.min(t);
        steps = s;
    }
    let packets = (queues * cbs * 2) as f64;
    println!(
        "{queues} queues x {cbs} command buffers over {slots} slots: best of {reps}: {:.2} ms, {steps} steps, {:.0} command buffers/s",
        best.as_secs_f64() * 1e3,
        packets / 2.0 / best.as_secs_f64()
    );
}

struct Q {
    id: gpu::FwQueueId,
    page: Arc<Shm>,
}

fn run(queues: usize, cbs: usize, slots: u32) -> (Duration, u64) {
    let mut gpu = Gpu::new(GpuConfig {
        engines: vec![EngineKind::Compute],
        doorbell_pages: 1,
        idle_period: Duration::from_secs(3600),
        hw_slots: slots,
        ..GpuConfig::default()
    })
    .unwrap();
    let mut cb = Vec::new();
    Packet::WriteData { width: DataWidth::U32, va: DATA, value: 1 }.encode(&mut cb);
    Packet::ProgressFence { value: 1 }.encode(&mut cb);
    let ring_bytes = ((cbs * cb.len() * 4 * 2) as u64).next_power_of_two().max(4096);
    let mut qs = Vec::with_capacity(queues);
    let mut vm_state = None;
    for i in 0..queues {
        let j = i % PER_VM;
        if j == 0 {
            let vmid = gpu.command(cmd::CreateVm {}).unwrap();
            let data = Shm::new("data", (4 * PER_VM).next_multiple_of(4096)).unwrap();
            let control = Shm::new("control", RING_CONTROL_BYTES as usize * PER_VM).unwrap();
            gpu.command(cmd::Map::whole(vmid, DATA, data, true)).unwrap();
            gpu.command(cmd::Map::whole(vmid, CONTROL, control.clone(), true)).unwrap();
            vm_state = Some((vmid, control));
        }
        let (vmid, control) = vm_state.clone().unwrap();
        let ring = Shm::new("ring", ring_bytes as usize).unwrap();
        let ring_va = RINGS + j as u64 * ring_bytes;
        gpu.command(cmd::Map::whole(vmid, ring_va, ring.clone(), false)).unwrap();
        let page = Shm::new("kernel-page", 4096).unwrap();
        // Touch it now: a first-touch page fault in the timed loop would cost more than the
        // scheduling being measured (a running system's pages are resident).
        page.write_u64(PROGRESS_COMPLETED_OFFSET, 0).unwrap();
        let ctl = RING_CONTROL_BYTES * j as u64;
        let id = gpu
            .command(cmd::AddQueue {
                config: QueueConfig {
                    vmid,
                    engine: EngineId(0),
                    ring_va,
                    ring_bytes,
                    rptr_va: CONTROL + ctl + RPTR_OFFSET,
                    wptr_va: CONTROL + ctl + WPTR_OFFSET,
                    last_queued_va: None,
                    kernel_page: abi::queue::KernelPageView::new(&page).unwrap(),
                    fence_logs: None,
                    context_save: Shm::new("context-save", gpu::compute::CONTEXT_SAVE_BYTES as usize).unwrap(),
                    privileged: false,
                    priority: Priority::Normal,
                },
            })
            .unwrap();
        // Each queue writes its own word; its progress fence counts its command buffers.
        let mut wptr = 0;
        for k in 1..=cbs as u64 {
            let mut words = Vec::new();
            Packet::WriteData { width: DataWidth::U32, va: DATA + 4 * j as u64, value: k }.encode(&mut words);
            Packet::ProgressFence { value: k }.encode(&mut words);
            let plan = ring::plan_write(wptr, ring_bytes, words.len() as u64).unwrap();
            ring::write_stream(&ring, ring_bytes, wptr, &plan, &[&words]).unwrap();
            wptr = plan.new_wptr;
        }
        control.atomic_u64(ctl + WPTR_OFFSET).unwrap().store(wptr, Ordering::Release);
        if i < DOORBELLS {
            gpu.command(cmd::BindDoorbell { queue: id, index: i as u32 }).unwrap();
            gpu.bar().atomic_u64(i as u64 * 8).unwrap().store(wptr, Ordering::Release);
        } else {
            gpu.command(cmd::UnbindDoorbell { queue: id }).unwrap();
        }
        qs.push(Q { id, page });
    }
    let total = (queues * cbs * 2) as u64;
    let mut done = 0;
    let mut steps = 0u64;
    let mut now = 0u64;
    let start = Instant::now();
    while done < total {
        gpu.poll_doorbells();
        let report = gpu.step(Time(now));
        if gpu.poll_timeout().is_some_and(|t| Time(now) >= t) {
            gpu.handle_timeout(Time(now));
        }
        while gpu.poll_interrupt().is_some() {}
        done += report.packets;
        steps += 1;
        now += 1_000;
        assert!(steps < 100_000_000, "no progress");
    }
    let elapsed = start.elapsed();
    for q in &qs {
        assert_eq!(q.page.read_u64(PROGRESS_COMPLETED_OFFSET).unwrap(), cbs as u64, "{}", q.id);
    }
    (elapsed, steps)
}
