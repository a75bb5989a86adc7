//! A client embedded on the live driver: the virtual GPU runs in this process, on its own
//! threads, in real time. Two queues (compute and copy) cooperate through a native fence,
//! and the results are checked in memory.
//!
//! `cargo run --release -p umd --example embedded_live`
//!
//! Crates: `umd` (the driver) and `kernel` (which hosts the GPU in this process).

use std::time::{Duration, Instant};

use kernel::{System, SystemConfig};
use umd::{CommandBuffer, Device, EngineKind, NativeFenceType, QueueOptions};

const T: Option<Duration> = Some(Duration::from_secs(10));

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let sys = System::live(SystemConfig::default())?;
    let dev = Device::open(sys.open_process()?)?;
    let compute = dev.create_context(dev.engine(EngineKind::Compute)?)?;
    let copy = dev.create_context(dev.engine(EngineKind::Copy)?)?;
    let mut produce = compute.create_queue(QueueOptions::user_mode())?;
    let mut consume = copy.create_queue(QueueOptions::user_mode())?;
    let src = dev.allocate(1 << 16)?;
    let dst = dev.allocate(1 << 16)?;
    let ready = dev.create_fence(0, NativeFenceType::Default)?;

    let rounds = 1000u32;
    let t0 = Instant::now();
    let mut last = 0;
    for i in 1..=rounds {
        let slot = u64::from(i % 1024) * 4;
        // The copy queue waits for the compute queue's fence, then copies what it wrote.
        let mut cb = CommandBuffer::new();
        cb.wait_fence(&ready, u64::from(i)).copy(src.va() + slot, dst.va() + slot, 4);
        last = consume.submit(&cb)?;
        let mut cb = CommandBuffer::new();
        cb.write_u32(src.va() + slot, i).signal_fence(&ready, u64::from(i));
        produce.submit(&cb)?;
    }
    consume.wait(last, T)?;
    let took = t0.elapsed();
    for i in (rounds - 1023).max(1)..=rounds {
        let got = dst.read_u32(u64::from(i % 1024) * 4)?;
        if got != i {
            return Err(format!("slot {}: copied {got}, expected {i}", i % 1024).into());
        }
    }
    println!(
        "embedded (live driver): {rounds} producer/consumer rounds across two engines through a native fence in {:.1} ms: ok",
        took.as_secs_f64() * 1e3
    );
    Ok(())
}
