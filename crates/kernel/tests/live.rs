//! Live end-to-end tests: real threads and real time. They wait on events (a progress value,
//! an engine state) with generous timeouts and never sleep-and-hope.

use std::sync::Arc;
use std::time::{Duration, Instant};

use abi::port::KernelPort;
use abi::{EngineKind, QueueState};
use gpu::{GpuConfig, PowerState};
use kernel::{System, SystemConfig};
use umd::{CommandBuffer, Device, QueueOptions};

const WAIT: Option<Duration> = Some(Duration::from_secs(20));

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn live_user_and_kernel_mode_paths_give_the_same_results_and_survive_f1() {
    let sys = System::live(SystemConfig {
        gpu: GpuConfig { idle_period: Duration::from_millis(2), ..GpuConfig::default() },
        ..SystemConfig::default()
    })
    .unwrap();
    let port: Arc<dyn KernelPort> = sys.open_process().unwrap();
    let dev = Device::open(port).unwrap();
    let engine = dev.engine(EngineKind::Compute).unwrap();
    let ctx = dev.create_context(engine).unwrap();
    let buf = dev.allocate(1 << 16).unwrap();
    let mut uq = ctx.create_queue(QueueOptions::user_mode()).unwrap();
    let mut kq = ctx.create_queue(QueueOptions::kernel_mode()).unwrap();

    for (q, base) in [(&mut uq, 0u64), (&mut kq, 0x1000)] {
        let mut cb = CommandBuffer::new();
        cb.fill(buf.va() + base, 64, 0x0101_0101)
            .write_u64(buf.va() + base + 64, 0xfeed)
            .signal(buf.va() + base + 72, 3);
        let v = q.submit(&cb).unwrap();
        q.wait(v, WAIT).unwrap();
        let mut out = [0u8; 64];
        buf.read(base, &mut out).unwrap();
        assert_eq!(out, [1u8; 64]);
        assert_eq!(buf.read_u64(base + 64).unwrap(), 0xfeed);
        assert_eq!(buf.read_u64(base + 72).unwrap(), 3);
    }

    // Idle: F1, doorbell disconnected; the next submission reconnects and runs.
    wait_for("F1", || sys.power(engine) == PowerState::F1);
    assert_eq!(uq.doorbell_status().unwrap(), abi::DoorbellStatus::DisconnectedRetry);
    let mut cb = CommandBuffer::new();
    cb.write_u32(buf.va() + 0x2000, 77);
    let before = uq.reconnects();
    let v = uq.submit(&cb).unwrap();
    uq.wait(v, WAIT).unwrap();
    assert_eq!(buf.read_u32(0x2000).unwrap(), 77);
    assert!(uq.reconnects() > before);

    // The kernel-mode path wakes the engine by itself too.
    wait_for("F1 again", || sys.power(engine) == PowerState::F1);
    let v = kq.submit(&cb).unwrap();
    kq.wait(v, WAIT).unwrap();
    assert_eq!(uq.status().unwrap().state, QueueState::Mapped);
}

#[test]
fn live_many_small_submissions_all_complete_in_order() {
    let sys = System::live(SystemConfig::default()).unwrap();
    let port: Arc<dyn KernelPort> = sys.open_process().unwrap();
    let dev = Device::open(port).unwrap();
    let ctx = dev.create_context(dev.engine(EngineKind::Copy).unwrap()).unwrap();
    let buf = dev.allocate(4096).unwrap();
    // A 4 KiB ring forces wrap-around and ring-full back-pressure many times over.
    let mut q = ctx.create_queue(QueueOptions { ring_bytes: 4096, ..QueueOptions::user_mode() }).unwrap();
    let mut cb = CommandBuffer::new();
    let mut last = 0;
    for i in 0..20_000u32 {
        cb.clear();
        cb.write_u32(buf.va() + (i % 512) as u64 * 4, i);
        last = q.submit(&cb).unwrap();
    }
    q.wait(last, WAIT).unwrap();
    for slot in 0..512u32 {
        // The last i < 20_000 with i % 512 == slot.
        let expect = (0..20_000u32).rev().find(|i| i % 512 == slot).unwrap();
        assert_eq!(buf.read_u32(slot as u64 * 4).unwrap(), expect, "slot {slot}");
    }
    drop(sys);
}

#[test]
fn live_native_fence_wakes_a_blocked_cpu_waiter_and_a_waiting_queue() {
    let sys = System::live(SystemConfig::default()).unwrap();
    let port: Arc<dyn KernelPort> = sys.open_process().unwrap();
    let dev = Device::open(port).unwrap();
    let compute = dev.create_context(dev.engine(EngineKind::Compute).unwrap()).unwrap();
    let copy = dev.create_context(dev.engine(EngineKind::Copy).unwrap()).unwrap();
    let buf = dev.allocate(4096).unwrap();
    let mut f = dev.create_fence(0, abi::port::NativeFenceType::Default).unwrap();
    f.set_spin(0); // block in the kernel
    let mut waiter = compute.create_queue(QueueOptions::user_mode()).unwrap();
    let mut signaller = copy.create_queue(QueueOptions::user_mode()).unwrap();
    for i in 1..=50u64 {
        let mut cb = CommandBuffer::new();
        cb.wait_fence(&f, i).write_u64(buf.va(), i);
        let wv = waiter.submit(&cb).unwrap();
        let mut cb = CommandBuffer::new();
        cb.signal_fence(&f, i);
        signaller.submit(&cb).unwrap();
        f.wait(i, WAIT).unwrap();
        waiter.wait(wv, WAIT).unwrap();
        assert_eq!(buf.read_u64(0).unwrap(), i);
    }
}

/// Two live adapters, each with its own firmware thread: the dGPU's queue signals a
/// cross-adapter fence, which wakes a CPU thread blocked on the iGPU and releases an iGPU
/// queue waiting on it. The propagation runs on the dGPU's firmware thread, after its OS lock
/// is released.
#[test]
fn live_cross_adapter_signal_wakes_the_other_adapters_waiters() {
    let m = kernel::Machine::live(&[SystemConfig::default(), SystemConfig::default()]).unwrap();
    let open = |i: usize| {
        let port: Arc<dyn KernelPort> = m.adapter(i).open_process().unwrap();
        let dev = Device::open(port).unwrap();
        let ctx = dev.create_context(dev.engine(EngineKind::Compute).unwrap()).unwrap();
        (dev, ctx)
    };
    let (idev, ictx) = open(0);
    let (ddev, dctx) = open(1);
    let desc = abi::port::NativeFenceDesc {
        cross_adapter: true,
        ..abi::port::NativeFenceDesc::new(0, abi::port::NativeFenceType::Default)
    };
    let df = ddev.create_fence_with(&desc).unwrap();
    let mut ifence = idev.open_cross_adapter_fence(df.cross_adapter().unwrap()).unwrap();
    ifence.set_spin(0); // block in the kernel, so the wake-up is the propagated one
    let buf = idev.allocate(4096).unwrap();
    let mut iq = ictx.create_queue(QueueOptions::user_mode()).unwrap();
    let mut cb = CommandBuffer::new();
    cb.wait_fence(&ifence, 1).write_u32(buf.va(), 0xc0de);
    let v = iq.submit(&cb).unwrap();
    let waiter = std::thread::spawn(move || {
        ifence.wait(1, WAIT).unwrap();
        ifence
    });
    let mut dq = dctx.create_queue(QueueOptions::user_mode()).unwrap();
    let mut cb = CommandBuffer::new();
    cb.signal_fence(&df, 1);
    dq.submit(&cb).unwrap();
    let ifence = waiter.join().unwrap();
    assert_eq!(ifence.value().unwrap(), 1);
    iq.wait(v, WAIT).unwrap();
    assert_eq!(buf.read_u32(0).unwrap(), 0xc0de);
}

/// Timeout detection and recovery on the live driver, with small timeouts: an endless kernel
/// that cannot be cut (granularity `Dispatch`) ignores a preemption request; after `TdrDelay`
/// the engine is reset, the kernel's queue is hung, and another process's queue on the same
/// engine finishes its work with the right results. Nothing is killed and nothing hangs.
#[test]
fn live_tdr_resets_the_engine_and_the_other_queues_finish() {
    use abi::preempt::{ComputeGranularity, PreemptionCaps};
    let sys = System::live(SystemConfig {
        gpu: GpuConfig {
            idle_period: Duration::from_secs(3600),
            preemption: PreemptionCaps { compute: ComputeGranularity::Dispatch, ..PreemptionCaps::default() },
            ..GpuConfig::default()
        },
        tdr: kernel::TdrConfig { delay: Duration::from_millis(20), hang_compute: None, ..Default::default() },
        ..SystemConfig::default()
    })
    .unwrap();
    let open = || {
        let port: Arc<dyn KernelPort> = sys.open_process().unwrap();
        let dev = Device::open(port.clone()).unwrap();
        let ctx = dev.create_context(dev.engine(EngineKind::Compute).unwrap()).unwrap();
        (port, dev, ctx)
    };
    let (hport, hdev, hctx) = open();
    let mut hog = hctx.create_queue(QueueOptions::user_mode()).unwrap();
    let spin = hdev.upload(&program::workloads::forever().to_bytes()).unwrap();
    let mut cb = CommandBuffer::new();
    cb.dispatch(spin.va(), [1, 1, 1], [64, 1, 1], spin.va());
    hog.submit(&cb).unwrap();
    let (_oport, odev, octx) = open();
    let mut other = octx.create_queue(QueueOptions::user_mode()).unwrap();
    let buf = odev.allocate(4096).unwrap();
    let mut cb = CommandBuffer::new();
    for i in 0..32u64 {
        cb.write_u32(buf.va() + i * 4, i as u32 * 3);
    }
    // Once the endless kernel runs (a queue that has not started yet stops at once).
    wait_for("the endless kernel to run", || sys.with_gpu(|g| g.compute_stats().instructions) > 0);
    sys.preempt_queue(hport.process(), hog.handle()).unwrap();
    let v = other.submit(&cb).unwrap();
    other.wait(v, WAIT).unwrap();
    for i in 0..32u64 {
        assert_eq!(buf.read_u32(i * 4).unwrap(), i as u32 * 3);
    }
    wait_for("the hog to be reset", || hog.status().map(|s| s.state == QueueState::Hung).unwrap_or(false));
    let (trace, _) = sys.trace();
    assert!(trace.iter().any(|e| matches!(e.event, kernel::trace::Event::Ddi(kernel::trace::Ddi::ResetEngine(_)))));
    assert_eq!(hog.doorbell_status().unwrap(), abi::DoorbellStatus::DisconnectedAbort);
}
