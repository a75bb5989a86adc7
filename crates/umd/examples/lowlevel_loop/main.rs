//! The submission loop written by hand on `umd::lowlevel::UserQueue`, step by step as spec
//! 000 orders it: last-queued, the packets and their progress fence into the ring, wptr, the
//! doorbell, and the doorbell status acted on. Then the engine idles past its idle period, the
//! kernel disconnects the doorbell (F1), and the next ring reads `DisconnectedRetry`: the loop
//! connects again and rings again, and nothing is lost.
//!
//! `cargo run --release -p umd --example lowlevel_loop`
//!
//! The loop itself is in `lowlevel_loop/hand_loop.rs`.
//!
//! Crates: `umd`, `kernel` (the deterministic driver, so the idle period passes at once).

mod hand_loop;

use std::time::Duration;

use hand_loop::HandLoop;
use kernel::{System, SystemConfig};
use umd::lowlevel::UserQueue;
use umd::{CommandBuffer, Device, EngineKind, Priority};

const T: Option<Duration> = Some(Duration::from_secs(1));
/// Submissions before the idle spell: enough to wrap the ring a few times.
const N: u32 = 500;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cfg = SystemConfig::default();
    let idle = cfg.gpu.idle_period;
    let sys = System::sim(cfg)?;
    let dev = Device::open(sys.open_process()?)?;
    let ctx = dev.create_context(dev.engine(EngineKind::Compute)?)?;
    let out = dev.allocate(4096)?;
    let mut l = HandLoop::new(UserQueue::create(&ctx, 4096, Priority::Normal)?);

    // Created, not connected: the first ring reads DisconnectedRetry and connects.
    for i in 0..N {
        let mut cb = CommandBuffer::new();
        cb.write_u32(out.va() + u64::from(i % 64) * 4, i);
        l.submit(&cb)?;
    }
    l.q.wait_progress(l.value, T)?;
    println!(
        "{N} submissions through a 4 KiB ring (wrapped {} times); the first ring read {:?}, then {} reconnect",
        l.wptr / 4096,
        l.seen[0],
        l.reconnects
    );

    // The engine idles past its idle period: F1, and the kernel disconnects the doorbell.
    sys.advance(idle * 3);
    println!("after {} ms idle the doorbell reads {:?}", (idle * 3).as_millis(), l.q.doorbell_status()?);
    let before = l.reconnects;
    let mut cb = CommandBuffer::new();
    cb.write_u32(out.va() + 1024, 0xF1);
    let v = l.submit(&cb)?;
    l.q.wait_progress(v, T)?;
    if l.notifies != 0 || l.reconnects != before + 1 || out.read_u32(1024)? != 0xF1 || l.q.completed() != v {
        return Err(
            format!("after idle: {} reconnects, value {:#x}", l.reconnects - before, out.read_u32(1024)?).into()
        );
    }
    for i in N - 64..N {
        if out.read_u32(u64::from(i % 64) * 4)? != i {
            return Err(format!("slot {} lost its write", i % 64).into());
        }
    }
    println!("the loop reconnected after the idle period and its submission ran: ok");
    Ok(())
}
