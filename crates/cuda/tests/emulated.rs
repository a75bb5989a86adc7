//! The CUDA backend's engine program, emulated on the CPU, driven by the unchanged UMD, kernel
//! and firmware: what runs on a GPU, tested without one.

use std::time::Duration;

use abi::{EngineKind, Priority};
use cuda::check::Spinner;
use kernel::{System, SystemConfig};
use umd::{CommandBuffer, Device, QueueOptions};

const T: Option<Duration> = Some(Duration::from_secs(5));

fn emulated_config() -> SystemConfig {
    let mut cfg = SystemConfig::default();
    cfg.gpu.hardware = Some(cuda::emulated());
    cfg
}

#[test]
fn the_emulated_build_lays_the_shared_structs_out_as_the_host_does() {
    let sizes = cuda::emulated::Emulated::layout_sizes();
    let want: Vec<u64> = cuda::layout::LAYOUT_SIZES.iter().map(|&(_, s)| s as u64).collect();
    assert_eq!(sizes, want, "{:?}", cuda::layout::LAYOUT_SIZES);
}

#[test]
fn a_submission_runs_on_the_emulated_slots() {
    let sys = System::sim(emulated_config()).unwrap();
    let device = Device::open(sys.open_process().unwrap()).unwrap();
    let ctx = device.create_context(device.engine(EngineKind::Compute).unwrap()).unwrap();
    let out = device.allocate(1 << 16).unwrap();
    let mut q = ctx.create_queue(QueueOptions { priority: Priority::Normal, ..QueueOptions::user_mode() }).unwrap();
    let mut cb = CommandBuffer::new();
    cb.write_u32(out.va(), 0xa1);
    cb.write_u64(out.va() + 8, 0x1122_3344_5566_7788);
    cb.fill(out.va() + 64, 64, 0xdead_beef);
    let v = q.submit(&cb).unwrap();
    q.wait(v, T).unwrap();
    assert_eq!(out.read_u32(0).unwrap(), 0xa1);
    assert_eq!(out.read_u64(8).unwrap(), 0x1122_3344_5566_7788);
    assert_eq!(out.read_u32(64 + 60).unwrap(), 0xdead_beef);
    assert_eq!(sys.with_gpu(|g| g.hardware_name()).as_deref(), Some("emulated (the CUDA engine program on the CPU)"));
}

#[test]
fn a_random_stream_leaves_the_bytes_the_cpu_engine_leaves() {
    let r = cuda::check::random_stream(cuda::emulated(), cuda::check::Driver::Sim, 7, 2000).unwrap();
    assert_eq!(r.completed, 2000);
}

#[test]
fn malformed_streams_fault_as_on_the_cpu_engine() {
    let n = cuda::check::bad_streams(cuda::emulated(), cuda::check::Driver::Sim).unwrap();
    assert!(n >= 20);
}

fn slots_config(slots: u32) -> SystemConfig {
    let mut cfg = emulated_config();
    cfg.gpu.hw_slots = slots;
    cfg
}

#[test]
fn a_high_priority_queue_takes_a_busy_slot_and_the_preempted_dispatch_resumes_exactly() {
    let sys = System::sim(slots_config(2)).unwrap();
    let mut lows: Vec<Spinner> = (0..2).map(|_| Spinner::new(&sys, Priority::Low, 3000).unwrap()).collect();
    for l in &mut lows {
        l.submit(2).unwrap();
    }
    // Let them get going: both slots busy with a dispatch part-way done. (On the
    // deterministic driver the emulated slots run only when the world steps, and hardware
    // work takes no virtual time: a wait would run them to the end.)
    for _ in 0..4 {
        sys.step();
    }
    assert!(sys.with_gpu(|g| g.compute_stats().instructions) > 0);
    assert!(lows.iter().all(|l| l.queue().completed() == 0));
    let dev = Device::open(sys.open_process().unwrap()).unwrap();
    let ctx = dev.create_context(dev.engine(EngineKind::Compute).unwrap()).unwrap();
    let mut hq = ctx.create_queue(QueueOptions { priority: Priority::High, ..QueueOptions::user_mode() }).unwrap();
    let buf = dev.allocate(4096).unwrap();
    let mut cb = CommandBuffer::new();
    cb.write_u32(buf.va(), 0x5eed);
    let v = hq.submit(&cb).unwrap();
    hq.wait(v, T).unwrap();
    assert_eq!(buf.read_u32(0).unwrap(), 0x5eed);
    let log = sys.with_gpu(|g| g.firmware_log());
    let saved =
        log.iter().any(|e| matches!(e.event, gpu::FwEvent::StateSaved { point: gpu::StopPoint::Instruction, .. }));
    assert!(saved, "a low-priority dispatch was stopped at an instruction: {log:?}");
    for l in &lows {
        l.check().unwrap();
    }
    let restored = sys.with_gpu(|g| g.firmware_log()).iter().any(|e| matches!(e.event, gpu::FwEvent::Restored { .. }));
    assert!(restored);
}

#[test]
fn a_kernel_preemption_request_is_answered_and_the_queue_resumes_with_nothing_lost() {
    let sys = System::sim(slots_config(2)).unwrap();
    let mut s = Spinner::new(&sys, Priority::Normal, 2000).unwrap();
    s.submit(3).unwrap();
    for k in 0..5 {
        for _ in 0..3 + k {
            sys.step();
        }
        let ticket = sys.preempt_queue(s.pid(), s.queue().handle()).unwrap();
        for _ in 0..4 {
            sys.step();
        }
        assert!(sys.preempt_answer(ticket).is_some(), "request {ticket} answered");
        assert_ne!(s.queue().status().unwrap().state, abi::QueueState::Mapped);
        sys.resume_queue(s.pid(), s.queue().handle()).unwrap();
    }
    s.check().unwrap();
}

/// A live end-to-end test (the firmware thread runs the emulated slots): timeout detection
/// and recovery of a queue that cannot be preempted, and a killed client, beside a neighbour
/// that loses nothing.
#[test]
fn a_hung_queue_is_reset_and_a_killed_client_cleaned_up_while_the_neighbour_loses_nothing() {
    let r = cuda::check::recovery(cuda::emulated()).unwrap();
    assert_eq!(r.neighbour_completed, 8);
    assert!(r.hung_fault.contains("PreemptTimeout"), "{r:?}");
    assert!(r.recoveries >= 1, "{r:?}");
}

/// Live, with the slots on their own thread: commands and answers race as on a GPU.
#[test]
fn malformed_streams_fault_as_on_the_cpu_engine_with_asynchronous_slots() {
    let n = cuda::check::bad_streams(cuda::emulated_threaded(), cuda::check::Driver::Live).unwrap();
    assert!(n >= 20);
}

/// The GPU's preemption check, on asynchronous emulated slots.
#[test]
fn preemptions_lose_nothing_with_asynchronous_slots() {
    let r = cuda::check::preemptions(cuda::emulated_threaded()).unwrap();
    assert!(r.states_saved > 0, "{r:?}");
}

/// The GPU's random stream, on asynchronous emulated slots.
#[test]
fn a_random_stream_is_bit_identical_with_asynchronous_slots() {
    let r = cuda::check::random_stream(cuda::emulated_threaded(), cuda::check::Driver::Live, 11, 2000).unwrap();
    assert_eq!(r.completed, 2000);
}

/// The four example kernels against their CPU references, on both emulated modes.
#[test]
fn the_four_example_kernels_give_their_cpu_references_results() {
    for hw in [cuda::emulated(), cuda::emulated_threaded()] {
        let mut cfg = SystemConfig::default();
        cfg.gpu.hardware = Some(hw);
        let sys = System::live(cfg).unwrap();
        let dev = Device::open(sys.open_process().unwrap()).unwrap();
        let ctx = dev.create_context(dev.engine(EngineKind::Compute).unwrap()).unwrap();
        let mut q = ctx.create_queue(QueueOptions::user_mode()).unwrap();
        for (name, r) in runtime::verify::verify_all(&dev, &mut q, 300) {
            r.unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
}
