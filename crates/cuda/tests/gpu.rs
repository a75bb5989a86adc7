//! The CUDA backend on a real NVIDIA GPU: run by `scripts/gpu-check` on a machine that has one
//! (every test here is ignored otherwise; CI has no GPU). The same checks as
//! `tests/emulated.rs`, on silicon and the live driver.

use std::time::Duration;

use abi::EngineKind;
use kernel::{System, SystemConfig};
use umd::{Device, QueueOptions};

fn gpu_config(slots: u32) -> SystemConfig {
    let mut cfg = SystemConfig::default();
    cfg.gpu.hardware = Some(cuda::nvidia(0).expect("an NVIDIA GPU and its driver"));
    cfg.gpu.hw_slots = slots;
    cfg.gpu.idle_period = Duration::from_secs(3600);
    cfg
}

#[test]
#[ignore = "needs an NVIDIA GPU: run by scripts/gpu-check"]
fn the_four_example_kernels_give_their_cpu_references_results_on_the_gpu() {
    let sys = System::live(gpu_config(8)).unwrap();
    let dev = Device::open(sys.open_process().unwrap()).unwrap();
    let ctx = dev.create_context(dev.engine(EngineKind::Compute).unwrap()).unwrap();
    let mut q = ctx.create_queue(QueueOptions::user_mode()).unwrap();
    for (name, r) in runtime::verify::verify_all(&dev, &mut q, 3000) {
        let v = r.unwrap_or_else(|e| panic!("{name}: {e}"));
        println!("verified {name}: {} elements, {} dispatches", v.elements, v.dispatches);
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run by scripts/gpu-check"]
fn a_random_stream_of_10000_submissions_is_bit_identical_to_the_cpu_engine() {
    let hw = cuda::nvidia(0).unwrap();
    let r = cuda::check::random_stream(hw, cuda::check::Driver::Live, 0x5eed, 10_000).unwrap();
    println!("{r:?}");
    assert_eq!(r.completed, 10_000);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run by scripts/gpu-check"]
fn malformed_streams_fault_on_the_gpu_as_on_the_cpu_engine() {
    let n = cuda::check::bad_streams(cuda::nvidia(0).unwrap(), cuda::check::Driver::Live).unwrap();
    println!("{n} malformed streams faulted as on the CPU engine");
}

#[test]
#[ignore = "needs an NVIDIA GPU: run by scripts/gpu-check"]
fn preemptions_lose_nothing_on_the_gpu() {
    let r = cuda::check::preemptions(cuda::nvidia(0).unwrap()).unwrap();
    println!("{r:?}");
    assert!(r.states_saved > 0);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run by scripts/gpu-check"]
fn a_hung_queue_is_reset_and_a_killed_client_cleaned_up_while_the_neighbour_loses_nothing() {
    let r = cuda::check::recovery(cuda::nvidia(0).unwrap()).unwrap();
    println!("{r:?}");
    assert_eq!(r.neighbour_completed, 8);
    assert!(r.hung_fault.contains("PreemptTimeout"), "{r:?}");
}
