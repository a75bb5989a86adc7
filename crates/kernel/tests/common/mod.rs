//! Shared helpers for the kernel's integration tests.
#![allow(dead_code)]

use std::sync::Arc;

use abi::port::KernelPort;
use kernel::{System, SystemConfig};
use umd::{Buffer, Context, Device, Queue, QueueOptions};

/// A deterministic system with default config.
pub fn sim() -> System {
    System::sim(SystemConfig::default()).expect("system")
}

/// A client: device, a context on the compute engine, a 1 MiB buffer.
pub struct Client {
    pub port: Arc<dyn KernelPort>,
    pub device: Device,
    pub ctx: Context,
    pub buf: Buffer,
}

pub fn client(sys: &System) -> Client {
    let port: Arc<dyn KernelPort> = sys.open_process().expect("process");
    let device = Device::open(port.clone()).expect("device");
    let engine = device.engine(abi::EngineKind::Compute).expect("engine");
    let ctx = device.create_context(engine).expect("context");
    let buf = device.allocate(1 << 20).expect("buffer");
    Client { port, device, ctx, buf }
}

impl Client {
    pub fn user_queue(&self) -> Queue {
        self.ctx.create_queue(QueueOptions::user_mode()).expect("user queue")
    }
    pub fn kernel_queue(&self) -> Queue {
        self.ctx.create_queue(QueueOptions::kernel_mode()).expect("kernel queue")
    }
}
