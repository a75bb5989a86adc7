//! The firmware driven by hand: no kernel, no threads, a manual clock. These tests pin the
//! device-side rules the no-loss argument rests on: a doorbell change marks work, unbind and
//! bind re-read wptr, F1 is refused while work is pending (and granted while the only work is
//! a held queue's, which is kept), the idle timer, and faults that stay in their queue.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use abi::packet::{DecodeError, Packet};
use abi::queue::{FaultKind, PROGRESS_COMPLETED_OFFSET};
use abi::ring::{self, RPTR_OFFSET, WPTR_OFFSET};
use abi::{EngineId, EngineKind, Priority, QueueState};
use gpu::{EngineState, Gpu, GpuConfig, Interrupt, PowerState, QueueConfig, Time, Vmid, cmd};
use shm::Shm;

const RING: u64 = 0x10_0000;
const CONTROL: u64 = 0x20_0000;
const DATA: u64 = 0x30_0000;
const RING_BYTES: u64 = 4096;

struct Rig {
    gpu: Gpu,
    vmid: Vmid,
    ring: Arc<Shm>,
    control: Arc<Shm>,
    data: Arc<Shm>,
    page: Arc<Shm>,
    q: gpu::FwQueueId,
    wptr: u64,
    slot: u32,
}

fn rig() -> Rig {
    rig_with(gpu::Timing::Real)
}

/// [`rig`] with `timing`: `Modelled` for tests whose work takes device time (a `SYNTHETIC`
/// spins for its time on a real clock, and these steps' clock stands still).
fn rig_with(timing: gpu::Timing) -> Rig {
    let mut gpu = Gpu::new(GpuConfig {
        engines: vec![EngineKind::Compute, EngineKind::Copy],
        doorbell_pages: 2,
        idle_period: Duration::from_millis(10),
        packet_budget: 64,
        timing,
        ..GpuConfig::default()
    })
    .unwrap();
    let vmid = gpu.command(cmd::CreateVm {}).unwrap();
    let ring = Shm::new("ring", RING_BYTES as usize).unwrap();
    let control = Shm::new("control", 4096).unwrap();
    let data = Shm::new("data", 4096).unwrap();
    let page = Shm::new("kernel-page", 4096).unwrap();
    gpu.command(cmd::Map::whole(vmid, RING, ring.clone(), true)).unwrap();
    gpu.command(cmd::Map::whole(vmid, CONTROL, control.clone(), true)).unwrap();
    gpu.command(cmd::Map::whole(vmid, DATA, data.clone(), true)).unwrap();
    let q = gpu
        .command(cmd::AddQueue {
            config: QueueConfig {
                vmid,
                engine: EngineId(0),
                ring_va: RING,
                ring_bytes: RING_BYTES,
                rptr_va: CONTROL + RPTR_OFFSET,
                wptr_va: CONTROL + WPTR_OFFSET,
                last_queued_va: None,
                kernel_page: abi::queue::KernelPageView::new(&page).unwrap(),
                context_save: Shm::new("context-save", gpu::compute::CONTEXT_SAVE_BYTES as usize).unwrap(),
                fence_logs: None,
                privileged: false,
                priority: Priority::Normal,
            },
        })
        .unwrap();
    let slot = 512 + 3;
    gpu.command(cmd::BindDoorbell { queue: q, index: slot }).unwrap();
    Rig { gpu, vmid, ring, control, data, page, q, wptr: 0, slot }
}

impl Rig {
    /// Writes packets and publishes wptr, without ringing.
    fn publish(&mut self, packets: &[Packet]) {
        let mut words = Vec::new();
        for p in packets {
            p.encode(&mut words);
        }
        let plan = ring::plan_write(self.wptr, RING_BYTES, words.len() as u64).unwrap();
        ring::write_stream(&self.ring, RING_BYTES, self.wptr, &plan, &[&words]).unwrap();
        self.wptr = plan.new_wptr;
        self.control.atomic_u64(WPTR_OFFSET).unwrap().store(self.wptr, Ordering::Release);
    }
    fn ring_doorbell(&self) {
        self.gpu.bar().atomic_u64(self.slot as u64 * 8).unwrap().store(self.wptr, Ordering::Release);
    }
    fn run(&mut self, now: u64) -> gpu::StepReport {
        self.gpu.poll_doorbells();
        self.gpu.step(Time(now))
    }
    fn data_u64(&self, off: u64) -> u64 {
        self.data.read_u64(off).unwrap()
    }
    fn irqs(&mut self) -> Vec<Interrupt> {
        std::iter::from_fn(|| self.gpu.poll_interrupt()).collect()
    }
}

#[test]
fn nothing_runs_until_the_doorbell_rings_then_everything_up_to_wptr_runs() {
    let mut r = rig();
    r.publish(&[
        Packet::Signal { va: DATA, value: 5 },
        Packet::Timestamp { va: DATA + 8 },
        Packet::ProgressFence { value: 1 },
    ]);
    assert_eq!(r.run(100).packets, 0, "published but not rung: the firmware has not looked");
    r.ring_doorbell();
    assert_eq!(r.run(200).packets, 3);
    assert_eq!(r.data_u64(0), 5);
    assert_eq!(r.data_u64(8), 200, "TIMESTAMP writes the step's device time");
    assert_eq!(r.page.read_u64(PROGRESS_COMPLETED_OFFSET).unwrap(), 1);
    assert_eq!(r.control.read_u64(RPTR_OFFSET).unwrap(), r.wptr, "rptr published");
    assert!(r.irqs().is_empty(), "no waiter: a progress fence raises no interrupt");
}

/// The engine fetches published ring words in runs and decodes from them: a stream longer
/// than a run, packets that straddle a run's end, and a stream that wraps the ring (padded to
/// its end) all run whole, in order, each packet as written.
#[test]
fn long_streams_run_whole_across_fetch_runs_and_the_ring_wrap() {
    let mut r = rig();
    let write =
        |i: u64| Packet::WriteData { width: abi::packet::DataWidth::U32, va: DATA + 4 * (i % 1024), value: 0x1000 + i };
    let run = |r: &mut Rig, packets: std::ops::Range<u64>, now: &mut u64| {
        r.publish(&packets.map(write).collect::<Vec<_>>());
        r.ring_doorbell();
        let mut ran = 0;
        for _ in 0..10 {
            *now += 1_000_000;
            ran += r.run(*now).packets;
        }
        let (rptr, wptr) = (r.control.read_u64(RPTR_OFFSET).unwrap(), r.wptr);
        assert_eq!(rptr, wptr, "all of it ran: {:?}", r.irqs());
        ran
    };
    let mut now = 0;
    // 80 packets of 6 dwords, twice, then 8: 1,008 of the ring's 1,024 dwords.
    assert_eq!(run(&mut r, 0..80, &mut now), 80);
    assert_eq!(run(&mut r, 80..160, &mut now), 80);
    assert_eq!(run(&mut r, 160..168, &mut now), 8);
    // 20 more do not fit before the ring's end: a NOP pads its last 16 dwords, the packets
    // start at 0 (a fetch at the NOP stops at the ring's end).
    assert_eq!(run(&mut r, 168..188, &mut now), 21, "the padding NOP and 20 packets");
    for i in 0..188 {
        assert_eq!(r.data.read_u32(4 * i).unwrap(), 0x1000 + i as u32, "packet {i}");
    }
    assert!(r.irqs().is_empty(), "no fault");
}

#[test]
fn unbind_and_bind_reread_wptr_so_a_ring_lost_to_the_dummy_page_still_runs() {
    let mut r = rig();
    // The client published work, but its ring landed on the dummy page (never on the BAR).
    r.publish(&[Packet::Signal { va: DATA, value: 1 }]);
    r.gpu.command(cmd::UnbindDoorbell { queue: r.q }).unwrap();
    assert_eq!(r.run(10).packets, 1, "unbind's wptr re-read found the work");
    // Disconnected: new work is published; a bind finds it without any ring.
    r.publish(&[Packet::Signal { va: DATA, value: 2 }]);
    assert_eq!(r.run(20).packets, 0);
    r.gpu.command(cmd::BindDoorbell { queue: r.q, index: r.slot }).unwrap();
    assert_eq!(r.run(30).packets, 1);
    assert_eq!(r.data_u64(0), 2);
}

#[test]
fn f1_is_requested_after_the_idle_period_and_refused_while_work_is_pending() {
    let mut r = rig();
    let compute = EngineId(0);
    r.gpu.handle_timeout(Time(5_000_000));
    assert!(r.irqs().is_empty(), "5 ms idle < 10 ms");
    assert_eq!(r.gpu.poll_timeout(), Some(Time(10_000_000)));
    r.gpu.handle_timeout(Time(10_000_000));
    let irqs = r.irqs();
    assert!(irqs.contains(&Interrupt::EngineStateChange { engine: compute, state: EngineState::TransitionToF1 }));
    // Work arrives between the request and the kernel's F1 call: refused.
    r.publish(&[Packet::Signal { va: DATA, value: 9 }]);
    assert!(!r.gpu.command(cmd::EnterF1 { engine: compute, now: Time(10_000_100) }).unwrap());
    assert_eq!(r.gpu.power(compute).unwrap(), PowerState::F0);
    assert_eq!(r.run(10_000_200).packets, 1, "the refused F1 left the work marked to run");
    // Idle again: F1 is granted, and an F1 engine ignores its doorbells.
    assert!(r.gpu.command(cmd::EnterF1 { engine: compute, now: Time(20_000_000) }).unwrap());
    r.publish(&[Packet::Signal { va: DATA, value: 10 }]);
    r.ring_doorbell();
    assert_eq!(r.run(20_000_100).packets, 0);
    r.gpu.command(cmd::RequestF0 { engine: compute, now: Time(20_000_200) }).unwrap();
    r.gpu.command(cmd::BindDoorbell { queue: r.q, index: r.slot }).unwrap();
    assert_eq!(r.run(20_000_300).packets, 1);
    assert_eq!(r.data_u64(0), 10);
}

/// Every command is in the firmware log, at the time it reached the device, before what it
/// did: the rig's setup (an address space, three mappings, the queue, its doorbell), then a
/// suspend followed by its request and answer, and a refused command (logged: it was sent).
/// The log keeps no memory a command named: the ring's region is recorded by its id.
#[test]
fn every_command_is_in_the_firmware_log_before_what_it_did() {
    use gpu::{CommandRecord as C, FwEvent};
    let mut r = rig();
    let commands = |g: &Gpu| -> Vec<C> {
        g.firmware_log()
            .into_iter()
            .filter_map(|e| match e.event {
                FwEvent::Command(c) => Some(c),
                _ => None,
            })
            .collect()
    };
    let setup = commands(&r.gpu);
    assert!(matches!(setup[0], C::CreateVm {}), "{setup:?}");
    let ring = gpu::MemoryRecord { region: Some(r.ring.id()), offset: 0 };
    let map = C::Map { vmid: r.vmid, va: RING, bytes: RING_BYTES, memory: ring, offset: 0, writable: true };
    assert_eq!(setup[1], map);
    assert!(matches!(setup[2..4], [C::Map { va: CONTROL, .. }, C::Map { va: DATA, .. }]));
    assert!(matches!(setup[4], C::AddQueue { config } if config.vmid == r.vmid && config.ring_va == RING));
    assert_eq!(setup[5], C::BindDoorbell { queue: r.q, index: r.slot });
    assert_eq!(setup.len(), 6);
    assert_eq!(r.gpu.firmware_counts().commands, 6);

    r.gpu.command(cmd::SuspendQueue { queue: r.q, now: Time(1_000) }).unwrap();
    let log = r.gpu.firmware_log();
    let at = log.iter().position(|e| e.event == FwEvent::Command(C::SuspendQueue { queue: r.q })).unwrap();
    assert_eq!(log[at].at, Time(1_000));
    assert!(matches!(log[at + 1].event, FwEvent::PreemptRequested { queue, .. } if queue == r.q));
    assert!(matches!(log.last().unwrap().event, FwEvent::PreemptAnswered { queue, .. } if queue == r.q));

    assert!(r.gpu.command(cmd::BindDoorbell { queue: r.q, index: u32::MAX }).is_err());
    let last = r.gpu.firmware_log().pop().unwrap();
    assert_eq!(last.event, FwEvent::Command(C::BindDoorbell { queue: r.q, index: u32::MAX }));
    assert_eq!(r.gpu.firmware_counts().commands, 8);
}

/// A queue the kernel holds off the run list does not keep its engine awake, and its work is
/// kept through F1 (spec 000: "this work just doesn't get scheduled while the context is
/// suspended"): the idle timer asks for F1, F1 is granted. Put back on the run list, it runs
/// only once the engine is back in F0 — which is why the kernel wakes the engine at every
/// release (issue 27).
#[test]
fn a_held_queue_s_work_is_kept_through_f1_and_runs_once_resumed_and_woken() {
    let mut r = rig();
    let compute = EngineId(0);
    assert!(r.gpu.command(cmd::SuspendQueue { queue: r.q, now: Time(1_000) }).unwrap().answered);
    r.publish(&[Packet::Signal { va: DATA, value: 7 }]);
    r.ring_doorbell();
    assert_eq!(r.run(2_000).packets, 0, "held");
    r.gpu.handle_timeout(Time(10_000_000));
    let irqs = r.irqs();
    assert!(irqs.contains(&Interrupt::EngineStateChange { engine: compute, state: EngineState::TransitionToF1 }));
    r.gpu.command(cmd::UnbindDoorbell { queue: r.q }).unwrap();
    assert!(
        r.gpu.command(cmd::EnterF1 { engine: compute, now: Time(10_000_100) }).unwrap(),
        "held work does not keep the engine awake"
    );
    assert!(r.gpu.queue_has_work(r.q).unwrap(), "and is kept");
    r.gpu.command(cmd::ResumeQueue { queue: r.q }).unwrap();
    assert_eq!(r.run(10_000_200).packets, 0, "an engine in F1 runs nothing, resumed queue or not");
    r.gpu.command(cmd::RequestF0 { engine: compute, now: Time(10_000_300) }).unwrap();
    assert_eq!(r.run(10_000_400).packets, 1, "woken, it runs the kept work without a doorbell");
    assert_eq!(r.data_u64(0), 7);
}

#[test]
fn a_wait_blocks_its_queue_until_the_value_arrives() {
    let mut r = rig();
    r.publish(&[Packet::Wait { va: DATA + 64, value: 3 }, Packet::Signal { va: DATA, value: 1 }]);
    r.ring_doorbell();
    let rep = r.run(1);
    assert_eq!((rep.packets, rep.runnable), (0, 1), "blocked, still runnable");
    r.data.atomic_u64(64).unwrap().store(3, Ordering::Release);
    assert_eq!(r.run(2).packets, 2);
    assert_eq!(r.data_u64(0), 1);
}

/// A queue's run time (the kernel's hang timer reads it) counts the device time of the turns
/// that executed its work, and nothing while it sits blocked in a `WAIT`, however many steps
/// pass: 300 µs of `SYNTHETIC` in 100 µs turns, plus the command processor's 50 ns for each
/// packet it ran.
#[test]
fn run_time_counts_executed_turns_not_a_blocked_wait() {
    let mut r = rig_with(gpu::Timing::Modelled);
    r.publish(&[
        Packet::Synthetic { ns: 300_000 },
        Packet::Wait { va: DATA + 64, value: 3 },
        Packet::Signal { va: DATA, value: 1 },
    ]);
    assert_eq!(r.gpu.queue_run_time(r.q).unwrap(), Duration::ZERO);
    r.ring_doorbell();
    let mut now = 1;
    let mut step = |r: &mut Rig| {
        r.run(now);
        now += 1_000_000;
    };
    for _ in 0..4 {
        step(&mut r);
    }
    let ran = r.gpu.queue_run_time(r.q).unwrap();
    assert_eq!(ran, Duration::from_nanos(300_000 + 3 * 50), "three slices of the SYNTHETIC");
    for _ in 0..10 {
        step(&mut r);
    }
    assert_eq!(r.gpu.queue_run_time(r.q).unwrap(), ran, "blocked in the WAIT: not running");
    r.data.atomic_u64(64).unwrap().store(3, Ordering::Release);
    step(&mut r);
    assert_eq!(r.data_u64(0), 1);
    assert_eq!(r.gpu.queue_run_time(r.q).unwrap(), ran + Duration::from_nanos(2 * 50), "the WAIT and the SIGNAL");
}

/// A `WAIT` on a native fence parks until a fence may have changed (spec 002: "the firmware
/// re-checks blocked queues when fences change"): a value stored behind the firmware's back
/// (as another adapter does with a cross-adapter fence) is seen only after `notify_fences`
/// (the KMD's `NotificationOnly`). A plain memory `WAIT` is polled
/// (`a_wait_blocks_its_queue_until_the_value_arrives`); a signal the engines execute counts
/// as a change (the kernel's cross-engine fence tests).
#[test]
fn a_wait_on_a_native_fence_parks_until_a_fence_changes() {
    let mut r = rig();
    let monitored = Shm::new("monitored", 4096).unwrap();
    monitored.atomic_u64(0).unwrap().store(u64::MAX, Ordering::Release);
    r.gpu
        .command(cmd::RegisterFence {
            current: (r.data.clone(), 128),
            monitored: shm::Word::new(&monitored, 0).unwrap(),
            id: 7,
            waits: gpu::FenceWaits::Park,
        })
        .unwrap();
    r.publish(&[Packet::Wait { va: DATA + 128, value: 2 }, Packet::Signal { va: DATA, value: 1 }]);
    r.ring_doorbell();
    assert_eq!(r.run(1).packets, 0);
    // Stored from elsewhere: not seen, however long the engine runs.
    r.data.atomic_u64(128).unwrap().store(2, Ordering::Release);
    for t in 2..10 {
        assert_eq!(r.run(t).packets, 0, "parked: no re-check without a fence change");
    }
    r.gpu.command(cmd::NotifyFences {}).unwrap();
    assert_eq!(r.run(10).packets, 2, "the notification made it re-check");
    assert_eq!(r.data_u64(0), 1);
}

#[test]
fn faults_hang_only_the_queue_with_a_record() {
    type Case = (Vec<u32>, fn(&FaultKind) -> bool);
    let cases: Vec<Case> = vec![
        (vec![1 | (0x7f << 16) | (1 << 24)], |k| {
            matches!(k, FaultKind::BadPacket(DecodeError::UnknownOpcode { opcode: 0x7f }))
        }),
        (
            {
                let mut w = Vec::new();
                Packet::WriteData { width: abi::packet::DataWidth::U64, va: 0xdead_0000, value: 1 }.encode(&mut w);
                w
            },
            |k| matches!(k, FaultKind::OutsideMappings { va: 0xdead_0000, .. }),
        ),
    ];
    for (words, expect) in cases {
        let mut r = rig();
        let plan = ring::plan_write(0, RING_BYTES, words.len() as u64).unwrap();
        ring::write_stream(&r.ring, RING_BYTES, 0, &plan, &[&words]).unwrap();
        r.wptr = plan.new_wptr;
        r.control.atomic_u64(WPTR_OFFSET).unwrap().store(r.wptr, Ordering::Release);
        r.ring_doorbell();
        r.run(1);
        assert_eq!(r.gpu.queue_state(r.q).unwrap(), QueueState::Hung);
        let fault = r.gpu.queue_fault(r.q).unwrap().expect("fault recorded");
        assert!(expect(&fault.kind), "{fault}");
        assert!(matches!(r.irqs().as_slice(), [Interrupt::QueueFault { .. }]));
    }
}

#[test]
fn wptr_backwards_past_the_ring_or_misaligned_faults() {
    for (bad, expect) in [(RING_BYTES + 8, "more than the ring"), (2, "not dword aligned")] {
        let mut r = rig();
        r.control.atomic_u64(WPTR_OFFSET).unwrap().store(bad, Ordering::Release);
        r.ring_doorbell();
        r.gpu.bar().atomic_u64(r.slot as u64 * 8).unwrap().store(bad, Ordering::Release);
        r.run(1);
        let f = r.gpu.queue_fault(r.q).unwrap().expect("fault");
        assert!(f.to_string().contains(expect), "{f}");
    }
    let mut r = rig();
    r.publish(&[Packet::Nop { dwords: 4 }]);
    r.ring_doorbell();
    r.run(1);
    r.control.atomic_u64(WPTR_OFFSET).unwrap().store(4, Ordering::Release);
    r.gpu.bar().atomic_u64(r.slot as u64 * 8).unwrap().store(99, Ordering::Release);
    r.run(2);
    let f = r.gpu.queue_fault(r.q).unwrap().expect("fault");
    assert!(matches!(f.kind, FaultKind::WptrBackwards { old: 16, new: 4 }), "{f}");
}

#[test]
fn a_stale_queue_id_is_refused_after_removal() {
    let mut r = rig();
    let rptr = r.gpu.command(cmd::RemoveQueue { queue: r.q }).unwrap();
    assert_eq!(rptr, 0);
    assert!(matches!(r.gpu.queue_state(r.q), Err(gpu::GpuError::StaleQueue(_))));
    assert!(r.gpu.command(cmd::BindDoorbell { queue: r.q, index: r.slot }).is_err());
    let _ = r.vmid;
}

/// An address space destroyed under a queue that still has work: its vmid goes to the next
/// space created (another process's, with its own memory at the same addresses). The queue
/// faults when its space goes, not at its next access: run then, it would write the new
/// space's memory.
#[test]
fn a_queue_whose_address_space_is_destroyed_never_runs_in_the_space_that_reuses_its_vmid() {
    let mut r = rig();
    r.publish(&[Packet::Signal { va: DATA, value: 0xbad }, Packet::ProgressFence { value: 1 }]);
    r.gpu.command(cmd::DestroyVm { vmid: r.vmid }).unwrap();
    match r.irqs().as_slice() {
        [Interrupt::QueueFault { queue, fault }] => {
            assert_eq!(*queue, r.q);
            assert!(matches!(fault.kind, FaultKind::OutsideMappings { va: RING, .. }), "{fault}");
        }
        other => panic!("expected the queue's fault, got {other:?}"),
    }
    assert_eq!(r.gpu.queue_state(r.q), Ok(QueueState::Hung));
    // Another process's space, given the same vmid, with memory of its own at DATA.
    let vmid = r.gpu.command(cmd::CreateVm {}).unwrap();
    assert_eq!(vmid, r.vmid, "the vmid is reused");
    let other = Shm::new("other-process", 4096).unwrap();
    r.gpu.command(cmd::Map::whole(vmid, DATA, other.clone(), true)).unwrap();
    r.ring_doorbell();
    for now in 1..4 {
        r.run(now * 1_000_000);
    }
    assert_eq!(other.read_u64(0).unwrap(), 0, "nothing reached the other process's memory");
    assert_eq!(r.data_u64(0), 0);
    assert_eq!(r.control.read_u64(RPTR_OFFSET).unwrap(), 0, "the queue ran nothing");
    assert!(r.irqs().is_empty());
}

/// Many queues in one address space over few hardware slots: each has its own ring, control
/// block, doorbell (BAR slot = its index) and data word (`DATA + 8 * index`).
struct Many {
    gpu: Gpu,
    vmid: Vmid,
    control: Arc<Shm>,
    data: Arc<Shm>,
    queues: Vec<ManyQueue>,
}

struct ManyQueue {
    id: gpu::FwQueueId,
    ring: Arc<Shm>,
    wptr: u64,
}

const MANY_RINGS: u64 = 0x1000_0000;
const MANY_CONTROL_BYTES: u64 = ring::RING_CONTROL_BYTES;

fn many(n: usize, hw_slots: u32, packet_budget: u32) -> Many {
    let mut gpu = Gpu::new(GpuConfig {
        engines: vec![EngineKind::Compute],
        doorbell_pages: 1,
        idle_period: Duration::from_secs(3600),
        packet_budget,
        hw_slots,
        ..GpuConfig::default()
    })
    .unwrap();
    let vmid = gpu.command(cmd::CreateVm {}).unwrap();
    let control = Shm::new("control", (MANY_CONTROL_BYTES as usize * (n + 1)).next_multiple_of(4096)).unwrap();
    let data = Shm::new("data", (8 * (n + 1)).next_multiple_of(4096)).unwrap();
    gpu.command(cmd::Map::whole(vmid, CONTROL, control.clone(), true)).unwrap();
    gpu.command(cmd::Map::whole(vmid, DATA, data.clone(), true)).unwrap();
    let mut m = Many { gpu, vmid, control, data, queues: Vec::new() };
    for _ in 0..n {
        m.add();
    }
    m
}

impl Many {
    /// Adds a queue with its doorbell bound; returns its index.
    fn add(&mut self) -> usize {
        self.add_at(Priority::Normal)
    }
    /// [`Many::add`] at `priority`.
    fn add_at(&mut self, priority: Priority) -> usize {
        let i = self.queues.len();
        let ring = Shm::new("ring", RING_BYTES as usize).unwrap();
        let ring_va = MANY_RINGS + i as u64 * RING_BYTES;
        self.gpu.command(cmd::Map::whole(self.vmid, ring_va, ring.clone(), false)).unwrap();
        let ctl = CONTROL + i as u64 * MANY_CONTROL_BYTES;
        let id = self
            .gpu
            .command(cmd::AddQueue {
                config: QueueConfig {
                    vmid: self.vmid,
                    engine: EngineId(0),
                    ring_va,
                    ring_bytes: RING_BYTES,
                    rptr_va: ctl + RPTR_OFFSET,
                    wptr_va: ctl + WPTR_OFFSET,
                    last_queued_va: None,
                    kernel_page: abi::queue::KernelPageView::new(Shm::new("kernel-page", 4096).unwrap()).unwrap(),
                    context_save: Shm::new("context-save", gpu::compute::CONTEXT_SAVE_BYTES as usize).unwrap(),
                    fence_logs: None,
                    privileged: false,
                    priority,
                },
            })
            .unwrap();
        self.gpu.command(cmd::BindDoorbell { queue: id, index: i as u32 }).unwrap();
        self.queues.push(ManyQueue { id, ring, wptr: 0 });
        i
    }
    /// Publishes packets on queue `i` and rings its doorbell.
    fn submit(&mut self, i: usize, packets: &[Packet]) {
        let q = &mut self.queues[i];
        let mut words = Vec::new();
        for p in packets {
            p.encode(&mut words);
        }
        let plan = ring::plan_write(q.wptr, RING_BYTES, words.len() as u64).unwrap();
        ring::write_stream(&q.ring, RING_BYTES, q.wptr, &plan, &[&words]).unwrap();
        q.wptr = plan.new_wptr;
        let ctl = i as u64 * MANY_CONTROL_BYTES;
        self.control.atomic_u64(ctl + WPTR_OFFSET).unwrap().store(q.wptr, Ordering::Release);
        self.gpu.bar().atomic_u64(i as u64 * 8).unwrap().store(q.wptr, Ordering::Release);
    }
    fn word(&self, i: usize) -> u64 {
        self.data.read_u64(8 * i as u64).unwrap()
    }
    fn write(i: usize, value: u64) -> Packet {
        Packet::WriteData { width: abi::packet::DataWidth::U64, va: DATA + 8 * i as u64, value }
    }
    fn run(&mut self, now: u64) -> gpu::StepReport {
        self.gpu.poll_doorbells();
        self.gpu.step(Time(now))
    }
}

#[test]
fn many_queues_over_two_slots_are_served_round_robin() {
    // 200 saturated queues of one process over 2 slots, one packet a step: each holder is
    // evicted when its (gang) quantum runs out, and the waiting queue that ran longest ago
    // takes its slot. So service goes in rounds: no queue runs its k-th packet before every
    // queue has run k - 1.
    const N: usize = 200;
    const PACKETS: u64 = 3;
    let mut m = many(N, 2, 1);
    for i in 0..N {
        let packets: Vec<Packet> = (1..=PACKETS).map(|k| Many::write(i, k)).collect();
        m.submit(i, &packets);
    }
    let gang = GpuConfig::default().gang_quantum.as_nanos() as u64;
    let mut served = [0u64; N];
    let mut order = Vec::new();
    let mut now = gang; // not 0: a queue that ran at 0 must not look as if it never ran
    while order.len() < N * PACKETS as usize {
        assert!(now < gang * 10 * (N as u64 * PACKETS), "stalled: {} services", order.len());
        let rep = m.run(now);
        assert!(rep.packets <= 2, "two slots, one packet each: {rep:?}");
        for (i, s) in served.iter_mut().enumerate() {
            let w = m.word(i);
            if w != *s {
                assert_eq!(w, *s + 1, "queue {i} ran one packet");
                *s = w;
                order.push((i, w));
            }
        }
        let min = served.iter().min().copied().unwrap();
        for &(i, k) in &order[order.len().saturating_sub(rep.packets as usize)..] {
            assert!(min + 1 >= k, "queue {i} ran its packet {k} while another has run only {min}");
        }
        now += gang;
    }
    assert!(served.iter().all(|&s| s == PACKETS));
    for q in &m.queues {
        assert_ne!(m.gpu.queue_state(q.id).unwrap(), QueueState::Hung);
    }
}

#[test]
fn a_waiting_queue_that_is_suspended_or_removed_is_never_mapped() {
    let mut m = many(5, 2, 64);
    let (a, b, w, x, y) = (0, 1, 2, 3, 4);
    // A and B hold both slots, and block on a flag (not idle: they give their slots up to
    // waiting queues and sleep until the flag is set).
    let flag = DATA + 0x800;
    m.submit(a, &[Packet::Wait { va: flag, value: 1 }, Many::write(a, 1)]);
    m.submit(b, &[Packet::Wait { va: flag, value: 1 }, Many::write(b, 1)]);
    // W, X and Y wait for a slot.
    for i in [w, x, y] {
        m.submit(i, &[Many::write(i, 7)]);
    }
    let t0 = 1_000;
    m.run(t0);
    for i in [w, x, y] {
        assert_eq!(m.gpu.queue_state(m.queues[i].id).unwrap(), QueueState::Unmapped, "queue {i} waits");
    }
    m.gpu.command(cmd::SuspendQueue { queue: m.queues[w].id, now: Time(t0) }).unwrap();
    m.gpu.command(cmd::RemoveQueue { queue: m.queues[x].id }).unwrap();
    // A new queue takes X's firmware slot (a fresh generation): it has no work, so X's place in
    // the waiting order must not map it.
    let z = m.add();
    let (wid, zid) = (m.queues[w].id, m.queues[z].id);
    // Y gets a slot, the flag releases A and B: W and Z stay off the slots.
    let mut now = t0;
    for step in 0..200u64 {
        now += 500_000;
        if step == 50 {
            m.data.atomic_u64(0x800).unwrap().store(1, Ordering::Release);
        }
        m.run(now);
        assert_eq!(m.gpu.queue_state(wid).unwrap(), QueueState::Unmapped, "suspended W at step {step}");
        assert_ne!(m.gpu.queue_state(zid).unwrap(), QueueState::Mapped, "idle Z at step {step}");
    }
    assert_eq!((m.word(a), m.word(b), m.word(y)), (1, 1, 7), "the others ran");
    assert_eq!(m.word(w), 0, "suspended W never ran");
    assert_eq!(m.word(x), 0, "removed X never ran");
    // Resumed, W's remembered work runs.
    m.gpu.command(cmd::ResumeQueue { queue: wid }).unwrap();
    m.run(now + 1);
    assert_eq!(m.word(w), 7);
}

/// Every firmware timer feeds `poll_timeout`, the quantum included: a driver that sleeps (or,
/// deterministically, jumps its clock) to `poll_timeout` lands on the moment a slot holder's
/// quantum runs out against a waiting queue, and the waiting queue then gets the slot.
#[test]
fn poll_timeout_reports_the_quantum_expiry_and_handling_it_rotates_the_slot() {
    let mut m = many(2, 1, 4);
    let (a, b) = (0, 1);
    // A holds the only slot, busy (a long run of packets, four a step; a queue blocked in a
    // WAIT would give the slot up at once); B waits with work.
    let mut work = busy();
    work.push(Many::write(a, 1));
    m.submit(a, &work);
    let t0 = 1_000;
    m.run(t0);
    m.submit(b, &[Many::write(b, 7)]);
    m.run(t0 + 1);
    assert_eq!(m.word(b), 0, "B waits for the slot");
    let gang = GpuConfig::default().gang_quantum.as_nanos() as u64;
    // The idle period is an hour: the only timer this close is A's quantum (which started
    // when A took the slot, no later than t0).
    let next = m.gpu.poll_timeout().expect("a timer");
    assert!(next.0 > t0 + 1 && next.0 <= t0 + gang, "the quantum expiry is a timer: {next:?}");
    // Fire it at that moment, as a driver does, and B runs.
    let at = m.gpu.poll_timeout().unwrap();
    m.gpu.handle_timeout(at);
    m.run(at.0);
    assert_eq!(m.word(b), 7, "B got the slot when A's quantum ran out");
    assert_eq!(m.word(a), 0, "A has not finished");
}

/// Work that keeps a queue busy for 100 steps of four packets: 400 one-dword NOPs (a write
/// may take at most half the ring).
fn busy() -> Vec<Packet> {
    (0..400).map(|_| Packet::Nop { dwords: 1 }).collect()
}

/// Two busy queues of one process over one slot keep alternating by the gang quantum: after
/// the first swap the evicted queue still waits, so the new holder's quantum is a timer too.
/// (Before, the quantum timer was armed only against queues left unplaced in a pass, so the
/// pair swapped once and the second holder kept the slot for as long as it had work.)
#[test]
fn two_busy_queues_over_one_slot_keep_alternating() {
    let mut m = many(2, 1, 4);
    for i in 0..2 {
        m.submit(i, &busy());
    }
    m.run(0);
    let gang = GpuConfig::default().gang_quantum.as_nanos() as u64;
    let holder = |m: &Many| {
        let mapped: Vec<usize> =
            (0..2).filter(|&i| m.gpu.queue_state(m.queues[i].id).unwrap() == QueueState::Mapped).collect();
        assert_eq!(mapped.len(), 1, "one slot, one holder");
        mapped[0]
    };
    let first = holder(&m);
    let mut seen = vec![first];
    for round in 0..4 {
        let at = m.gpu.poll_timeout().unwrap_or_else(|| panic!("round {round}: no timer while a queue waits"));
        assert!(at.0 <= (round + 1) * gang, "round {round}: the quantum expiry is the next timer: {at:?}");
        m.gpu.handle_timeout(at);
        m.run(at.0);
        seen.push(holder(&m));
    }
    let other = 1 - first;
    assert_eq!(seen, vec![first, other, first, other, first]);
}

/// The cut-in rig: over three slots, a high-priority queue with one write queued and two low
/// ones with 400 NOPs each (`budget` packets a turn), their rings latched; and the
/// high-priority client's handles, to ring again from inside a step (a live client rings while
/// the firmware runs other queues' turns).
struct CutIn {
    m: Many,
    hp: usize,
    l1: usize,
    l2: usize,
    client: HpClient,
}

/// The high-priority client of [`CutIn`].
struct HpClient {
    hp: usize,
    data: Arc<Shm>,
    bar: Arc<Shm>,
    control: Arc<Shm>,
    ring: Arc<Shm>,
    wptr: std::cell::Cell<u64>,
}

impl HpClient {
    /// Publishes a write of `value` and rings.
    fn write(&self, value: u64) {
        let mut words = Vec::new();
        Many::write(self.hp, value).encode(&mut words);
        let plan = ring::plan_write(self.wptr.get(), RING_BYTES, words.len() as u64).unwrap();
        ring::write_stream(&self.ring, RING_BYTES, self.wptr.get(), &plan, &[&words]).unwrap();
        self.wptr.set(plan.new_wptr);
        let ctl = self.hp as u64 * MANY_CONTROL_BYTES;
        self.control.atomic_u64(ctl + WPTR_OFFSET).unwrap().store(plan.new_wptr, Ordering::Release);
        self.bar.atomic_u64(self.hp as u64 * 8).unwrap().store(plan.new_wptr, Ordering::Release);
    }
    /// The last value its writes stored.
    fn seen(&self) -> u64 {
        self.data.read_u64(8 * self.hp as u64).unwrap()
    }
    /// Queue `i`'s published rptr.
    fn rptr(&self, i: usize) -> u64 {
        self.control.read_u64(i as u64 * MANY_CONTROL_BYTES + RPTR_OFFSET).unwrap()
    }
}

fn cut_in(budget: u32) -> CutIn {
    let mut m = many(0, 3, budget);
    let hp = m.add_at(Priority::High);
    let (l1, l2) = (m.add_at(Priority::Low), m.add_at(Priority::Low));
    let nops: Vec<Packet> = (0..400).map(|_| Packet::Nop { dwords: 0 }).collect();
    m.submit(l1, &nops);
    m.submit(l2, &nops);
    m.submit(hp, &[Many::write(hp, 1)]);
    m.gpu.poll_doorbells();
    let client = HpClient {
        hp,
        data: m.data.clone(),
        bar: m.gpu.bar().clone(),
        control: m.control.clone(),
        ring: m.queues[hp].ring.clone(),
        wptr: std::cell::Cell::new(m.queues[hp].wptr),
    };
    CutIn { m, hp, l1, l2, client }
}

/// A higher-priority queue that goes idle during a step and rings again before the step ends
/// cuts the turn in progress at its next check (its doorbell becomes a sentinel as soon as it
/// is idle, not at the next step), and the firmware latches the ring and runs its new work at
/// once, in the same step: the cut-in costs one check, not the other holders' turns, nor the
/// wait for the next step.
#[test]
fn a_queue_that_goes_idle_mid_step_and_rings_again_cuts_in_within_the_step() {
    let CutIn { mut m, hp, l1, l2, client } = cut_in(256);
    // The low queues' published rptrs when the second write is first seen.
    let lows_at_second = std::cell::Cell::new(None);
    let clock = || {
        if lows_at_second.get().is_none() && client.seen() == 2 {
            lows_at_second.set(Some((client.rptr(l1), client.rptr(l2))));
        }
        // The second ring as soon as the first write landed.
        if client.seen() == 1 && client.wptr.get() == m.queues[hp].wptr {
            client.write(2);
        }
        Time(1_000)
    };
    let report = m.gpu.step_with_clock(&clock);
    // The high-priority queue's first write, one packet of the low queue whose turn came next
    // (cut at its first check), then the second write; only then the low queues' turns.
    assert_eq!(m.word(hp), 2, "the second write ran in the same step");
    assert_eq!(lows_at_second.get(), Some((4, 0)), "after one NOP of the first low queue, none of the second");
    assert!(report.packets > 3, "the low queues ran their turns after it: {report:?}");
}

/// A cut-in's new scheduling pass gives a turn to the queue that rang and to the holders still
/// owed one in this step, not a second one to a holder whose turn is over: here a high-priority
/// queue rings twice from inside one step (after its first and its second write); the first
/// low queue, whose turn ended between the two, does not run again in the step.
#[test]
fn a_cut_in_pass_gives_no_second_turn_to_a_holder_whose_turn_is_over() {
    let CutIn { mut m, hp, l1, l2, client } = cut_in(128);
    let rung = std::cell::Cell::new(1u64);
    let clock = || {
        let seen = client.seen();
        // The second write once the first ran; the third once the first low queue's turn
        // after the first cut-in is over.
        if seen == rung.get() && (seen == 1 || (seen == 2 && client.rptr(l1) > 4)) {
            rung.set(seen + 1);
            client.write(seen + 1);
        }
        Time(1_000)
    };
    m.gpu.step_with_clock(&clock);
    assert_eq!(m.word(hp), 3, "both rings were served in the step");
    // Each low queue: one NOP before its cut, then one turn of 128.
    assert_eq!((client.rptr(l1), client.rptr(l2)), (4 + 128 * 4, 4 + 128 * 4));
}
