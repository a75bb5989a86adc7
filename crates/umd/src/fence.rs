//! Native fences in user mode (spec 002).
//!
//! A [`NativeFence`]'s CurrentValue is mapped read-only: [`NativeFence::value`] and the first
//! check of every wait read memory, with no kernel call. Signals from the CPU and blocking
//! waits go through the kernel, which keeps the waiter lists and the MonitoredValue protocol.
//! On the GPU, [`crate::CommandBuffer::signal_fence`] and [`crate::CommandBuffer::wait_fence`]
//! signal and wait without the CPU.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use abi::NativeFenceHandle;
use abi::port::{NativeFenceDesc, NativeFenceInfo, NativeFenceType, WaitMode, WaitOutcome};

use crate::UmdError;
use crate::inner::DeviceInner;

/// A native GPU fence. Destroyed on drop.
pub struct NativeFence {
    device: Arc<DeviceInner>,
    info: NativeFenceInfo,
    /// CurrentValue, through the read-only mapping (`None` for `IntraGpu`).
    current: Option<shm::ReadWord>,
    kind: NativeFenceType,
    spin: u32,
}

impl NativeFence {
    pub(crate) fn create(device: Arc<DeviceInner>, desc: &NativeFenceDesc) -> Result<NativeFence, UmdError> {
        let info = device.port.create_native_fence(device.handle, desc)?;
        Self::opened(device, info)
    }

    pub(crate) fn open(device: Arc<DeviceInner>, global: u64) -> Result<NativeFence, UmdError> {
        let info = device.port.open_native_fence(device.handle, global)?;
        Self::opened(device, info)
    }

    pub(crate) fn open_cross_adapter(device: Arc<DeviceInner>, handle: u64) -> Result<NativeFence, UmdError> {
        let info = device.port.open_cross_adapter_fence(device.handle, handle)?;
        Self::opened(device, info)
    }

    pub(crate) fn progress_of(device: Arc<DeviceInner>, queue: abi::HwQueueHandle) -> Result<NativeFence, UmdError> {
        let info = device.port.open_progress_fence(queue)?;
        Self::opened(device, info)
    }

    fn opened(device: Arc<DeviceInner>, mut info: NativeFenceInfo) -> Result<NativeFence, UmdError> {
        let kind = info.kind;
        let current = match info.cpu.take() {
            Some(map) => Some(shm::ReadWord::new(Arc::new(map), info.offset)?),
            None => None,
        };
        Ok(NativeFence { device, info, current, kind, spin: 2_000 })
    }

    /// For a shareable fence, the global handle to pass to another process
    /// ([`crate::Device::open_fence`]).
    pub fn global(&self) -> Option<u64> {
        self.info.global
    }

    /// For a cross-adapter fence, the handle to pass to a device on another adapter
    /// ([`crate::Device::open_cross_adapter_fence`]).
    pub fn cross_adapter(&self) -> Option<u64> {
        self.info.cross_adapter
    }

    /// The kernel handle.
    pub fn handle(&self) -> NativeFenceHandle {
        self.info.handle
    }
    /// GPU VA of CurrentValue.
    pub fn va(&self) -> u64 {
        self.info.va
    }
    /// Storage type.
    pub fn kind(&self) -> NativeFenceType {
        self.kind
    }
    /// How many times a wait spins on memory before blocking in the kernel.
    pub fn set_spin(&mut self, iterations: u32) {
        self.spin = iterations;
    }

    /// CurrentValue, read from memory. An `IntraGpu` fence has no CPU access.
    pub fn value(&self) -> Result<u64, UmdError> {
        let word = self.current.as_ref().ok_or_else(|| UmdError::NoCpuAccess { fence: self.handle().to_string() })?;
        // Acquire: pairs with the signaller's release, so what it wrote before is visible.
        Ok(word.load(Ordering::Acquire))
    }

    /// Signals from the CPU (through the kernel). A value below the current one is refused.
    pub fn signal(&self, value: u64) -> Result<(), UmdError> {
        Ok(self.device.port.signal_native_fence(self.handle(), value)?)
    }

    /// Waits until CurrentValue reaches `value`: memory first, a short spin, then the kernel.
    pub fn wait(&self, value: u64, timeout: Option<Duration>) -> Result<(), UmdError> {
        wait_fences(&self.device, &[(self, value)], WaitMode::All, timeout).map(|_| ())
    }
}

/// Waits on several fences (all, or any); returns the index of a reached fence for `Any`.
pub(crate) fn wait_fences(
    device: &Arc<DeviceInner>,
    conds: &[(&NativeFence, u64)],
    mode: WaitMode,
    timeout: Option<Duration>,
) -> Result<usize, UmdError> {
    // An empty wait is the kernel's to refuse (spinning would "succeed" vacuously).
    let spin = if conds.is_empty() { 0 } else { conds.iter().map(|(f, _)| f.spin).max().unwrap_or(0) };
    // Memory first, spinning: no allocation and no kernel call on this path.
    for _ in 0..=spin {
        if conds.is_empty() {
            break;
        }
        let (mut all, mut any) = (true, None);
        for (i, (f, v)) in conds.iter().enumerate() {
            let cur = f.value()?;
            if cur == abi::port::FENCE_ALWAYS_SIGNALED {
                // AlwaysSignaled: the device is in error. Let the kernel say so.
                return match device.port.wait_native_fences(&[(f.handle(), *v)], mode, Some(Duration::ZERO)) {
                    Err(e) => Err(e.into()),
                    Ok(_) => Ok(i),
                };
            }
            if cur >= *v {
                any.get_or_insert(i);
            } else {
                all = false;
            }
        }
        match (mode, any) {
            (WaitMode::Any, Some(i)) => return Ok(i),
            (WaitMode::All, _) if all => return Ok(0),
            _ => std::hint::spin_loop(),
        }
    }
    let handles: Vec<_> = conds.iter().map(|(f, v)| (f.handle(), *v)).collect();
    match device.port.wait_native_fences(&handles, mode, timeout)? {
        WaitOutcome::Reached(i) => Ok(i as usize),
        WaitOutcome::TimedOut => Err(UmdError::FenceTimeout { fences: conds.len() }),
    }
}

impl Drop for NativeFence {
    fn drop(&mut self) {
        let _ = self.device.port.destroy_native_fence(self.info.handle);
    }
}
