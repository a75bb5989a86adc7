//! A client of a running daemon (`doorbell serve`): the GPU lives in the daemon's process;
//! this one maps its queues' rings and doorbells and submits with memory writes, crossing
//! the socket only for control calls. Checks its results and prints the daemon's view of it.
//!
//! ```text
//! doorbell serve --socket /tmp/db.sock &
//! cargo run --release -p wire --example daemon_client -- /tmp/db.sock
//! ```
//!
//! Without an argument it uses `$DOORBELL_SOCKET`, else the daemon's default path.
//! Crates: `wire` (the daemon's client: `wire::client`, the port) and `umd` (the driver on it).

use std::time::Duration;

use umd::{CommandBuffer, Device, EngineKind, NativeFenceType, QueueOptions};

const T: Option<Duration> = Some(Duration::from_secs(10));

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args_os().nth(1).map(std::path::PathBuf::from);
    let port = match &path {
        Some(p) => wire::client::connect(p)?,
        None => wire::client::connect_default()?,
    };
    let dev = Device::open(port)?;
    let ctx = dev.create_context(dev.engine(EngineKind::Compute)?)?;
    let mut user = ctx.create_queue(QueueOptions::user_mode())?;
    let mut kernel = ctx.create_queue(QueueOptions::kernel_mode())?;
    let buf = dev.allocate(1 << 16)?;
    let fence = dev.create_fence(0, NativeFenceType::Default)?;

    let n = 2000u32;
    let mut last = 0;
    for i in 1..=n {
        let mut cb = CommandBuffer::new();
        cb.write_u32(buf.va() + u64::from(i % 256) * 4, i);
        last = user.submit(&cb)?;
    }
    // The kernel-mode queue waits for the user-mode queue's fence signal.
    let mut cb = CommandBuffer::new();
    cb.wait_fence(&fence, 1).write_u32(buf.va() + 4096, 0xD00B);
    let k = kernel.submit(&cb)?;
    let mut cb = CommandBuffer::new();
    cb.signal_fence(&fence, 1);
    user.submit(&cb)?;
    user.wait(last, T)?;
    kernel.wait(k, T)?;
    fence.wait(1, T)?;
    for i in n - 255..=n {
        let got = buf.read_u32(u64::from(i % 256) * 4)?;
        if got != i {
            return Err(format!("slot {}: {got}, expected {i}", i % 256).into());
        }
    }
    if buf.read_u32(4096)? != 0xD00B {
        return Err("the kernel-mode queue did not run after the fence".into());
    }
    println!("daemon client: {n} user-mode submissions and a fence-ordered kernel-mode one: ok");
    Ok(())
}
