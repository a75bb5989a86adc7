//! GPU `WAIT`s on fences never miss a change, whichever way the value moves: a CPU signal on
//! an adapter with or without native fences (the latter polls: nobody announces its
//! monitored fences' changes), another adapter's signal, or the device's own write. The
//! `WAIT`s sit inside indirect buffers so that the kernel-mode scheduler cannot hold them
//! back: the engine itself waits.

mod common;

use abi::port::{NativeFenceDesc, NativeFenceType, UserQueueMode};
use kernel::{Machine, SystemConfig};
use umd::CommandBuffer;

fn legacy() -> SystemConfig {
    SystemConfig { without_native_fences: true, user_queue_mode: UserQueueMode::KernelOnly, ..SystemConfig::default() }
}

/// Puts `cb` in the client buffer at `off` (an indirect buffer); returns its VA and dwords.
fn place(c: &common::Client, off: u64, cb: &CommandBuffer) -> (u64, u32) {
    c.buf.map().write_u32s(off, cb.words()).unwrap();
    (c.buf.va() + off, cb.len() as u32)
}

/// A kernel-mode submission whose WAIT on a fence sits in an indirect buffer: the scheduler
/// cannot hold it back (it does not look inside IBs), so the engine runs the WAIT and parks.
fn ib_wait_then_cpu_signal(cfg: SystemConfig) {
    let sys = common::sim_with(cfg.clone());
    let c = common::client(&sys);
    let kind = if cfg.without_native_fences { NativeFenceType::LegacyMonitored } else { NativeFenceType::Default };
    let f = c.device.create_fence(0, kind).unwrap();
    let mut ib = CommandBuffer::new();
    ib.wait_fence(&f, 1).write_u32(c.buf.va(), 1);
    let (va, n) = place(&c, 0x8000, &ib);
    let mut q = c.kernel_queue();
    let mut cb = CommandBuffer::new();
    cb.indirect(va, n);
    let v = q.submit(&cb).unwrap();
    sys.settle();
    assert_eq!(c.buf.read_u32(0).unwrap(), 0, "waits for the fence");
    f.signal(1).unwrap();
    sys.settle();
    assert_eq!(c.buf.read_u32(0).unwrap(), 1, "the CPU signal released the GPU wait");
    q.wait(v, common::T).unwrap();
}

/// On an adapter with native fences the CPU signal goes through UpdateCurrentValuesFromCpu,
/// which tells the firmware: the parked WAIT re-checks.
#[test]
fn native_adapter_kernel_queue_ib_wait_wakes_on_cpu_signal() {
    ib_wait_then_cpu_signal(SystemConfig { user_queue_mode: UserQueueMode::KernelOnly, ..SystemConfig::default() });
}

/// Without native fences the scheduler stores the monitored fence from the CPU and tells
/// nobody: the engine's WAIT on it polls (`FenceWaits::Poll`) instead of parking.
#[test]
fn legacy_adapter_kernel_queue_ib_wait_wakes_on_cpu_signal() {
    ib_wait_then_cpu_signal(legacy());
}

/// The same on a machine: the dGPU signals a cross-adapter fence the iGPU (without native
/// fences) opened as a monitored fence; the iGPU's engine sees it by polling.
#[test]
fn legacy_igpu_ib_wait_wakes_on_dgpu_signal() {
    let m = Machine::sim(&[legacy(), SystemConfig::default()]).unwrap();
    let w = common::client_on(m.adapter(0).open_process().unwrap());
    let s = common::client_on(m.adapter(1).open_process().unwrap());
    let fence = s
        .device
        .create_fence_with(&NativeFenceDesc {
            cross_adapter: true,
            ..NativeFenceDesc::new(0, NativeFenceType::Default)
        })
        .unwrap();
    let other = w.device.open_cross_adapter_fence(fence.cross_adapter().unwrap()).unwrap();
    let mut ib = CommandBuffer::new();
    ib.wait_fence(&other, 10).write_u32(w.buf.va(), 1);
    let (va, n) = place(&w, 0x8000, &ib);
    let mut q = w.kernel_queue();
    let mut cb = CommandBuffer::new();
    cb.indirect(va, n);
    q.submit(&cb).unwrap();
    m.settle();
    assert_eq!(w.buf.read_u32(0).unwrap(), 0);
    fence.signal(10).unwrap();
    m.settle();
    assert_eq!(other.value().unwrap(), 10);
    assert_eq!(w.buf.read_u32(0).unwrap(), 1, "the dGPU's signal released the iGPU's GPU wait");
}

/// A WRITE_DATA that stores a native fence's CurrentValue (misuse, but the device's own
/// write) releases a GPU WAIT on it: every writing packet counts as a fence change.
#[test]
fn write_data_to_a_native_fence_releases_a_gpu_wait() {
    let sys = common::sim();
    let c = common::client(&sys);
    let f = c.device.create_fence(0, NativeFenceType::Default).unwrap();
    let mut waiter = c.user_queue();
    let mut cb = CommandBuffer::new();
    cb.wait_fence(&f, 1).write_u32(c.buf.va(), 1);
    waiter.submit(&cb).unwrap();
    sys.settle();
    let mut writer = c.user_queue();
    let mut cb = CommandBuffer::new();
    cb.write_u64(f.va(), 1);
    let v = writer.submit(&cb).unwrap();
    writer.wait(v, common::T).unwrap();
    sys.settle();
    assert_eq!(f.value().unwrap(), 1);
    assert_eq!(c.buf.read_u32(0).unwrap(), 1, "WRITE_DATA stored the fence value; the WAIT did not see it");
}
