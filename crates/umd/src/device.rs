//! Devices, memory and contexts.

use std::sync::Arc;

use abi::port::{AdapterInfo, AllocationDesc, AllocationInfo, KernelPort, MemoryDomain};
use abi::{ContextHandle, DeviceHandle, EngineId, EngineKind};

use crate::UmdError;
use crate::fence::{self, NativeFence};
use crate::inner::DeviceInner;

/// A device opened by a process.
#[derive(Clone)]
pub struct Device {
    pub(crate) inner: Arc<DeviceInner>,
}

impl Device {
    /// Opens a device on a kernel port (`D3DKMTCreateDevice`).
    pub fn open(port: Arc<dyn KernelPort>) -> Result<Device, UmdError> {
        let fence_caps = port.native_fence_caps()?;
        let handle = port.create_device()?;
        let info = port.adapter_info();
        Ok(Device { inner: Arc::new(DeviceInner { port, handle, info, fence_caps }) })
    }

    /// The kernel handle.
    pub fn handle(&self) -> DeviceHandle {
        self.inner.handle
    }

    /// The kernel port.
    pub fn port(&self) -> &Arc<dyn KernelPort> {
        &self.inner.port
    }

    /// Adapter capabilities.
    pub fn info(&self) -> &AdapterInfo {
        &self.inner.info
    }

    /// The adapter's native fence caps (spec 002: `DXGK_NATIVE_FENCE_CAPS` and the optimized
    /// signaled interrupt), as the kernel answered them when the device was opened. With
    /// `optimized_interrupt`, user-mode queues log every native fence signal
    /// ([`crate::Queue::submit`]).
    pub fn native_fence_caps(&self) -> abi::port::NativeFenceCaps {
        self.inner.fence_caps
    }

    /// The first engine of a kind.
    pub fn engine(&self, kind: EngineKind) -> Result<EngineId, UmdError> {
        self.inner
            .info
            .engines
            .iter()
            .find(|e| e.kind == kind)
            .map(|e| e.id)
            .ok_or_else(|| UmdError::NoEngine { what: format!("{kind} engine") })
    }

    /// Allocates memory, mapped for the GPU and the CPU.
    pub fn allocate(&self, bytes: u64) -> Result<Buffer, UmdError> {
        self.allocate_with(&AllocationDesc::system(bytes))
    }

    /// Allocates memory with a full description.
    pub fn allocate_with(&self, desc: &AllocationDesc) -> Result<Buffer, UmdError> {
        let info = self.inner.port.allocate(self.inner.handle, desc)?;
        let map = match self.inner.port.map_allocation(info.handle) {
            Ok(m) => m,
            Err(e) => {
                let _ = self.inner.port.free(info.handle);
                return Err(e.into());
            }
        };
        Ok(Buffer { device: self.inner.clone(), info, map: Arc::new(map), domain: desc.domain })
    }

    /// Allocates a buffer holding `bytes` (a program binary, an argument buffer, input data).
    pub fn upload(&self, bytes: &[u8]) -> Result<Buffer, UmdError> {
        let b = self.allocate(bytes.len().max(1) as u64)?;
        b.write(0, bytes)?;
        Ok(b)
    }

    /// Creates a native fence (`D3DKMTCreateNativeFence`).
    pub fn create_fence(&self, initial: u64, kind: abi::port::NativeFenceType) -> Result<NativeFence, UmdError> {
        NativeFence::create(self.inner.clone(), &abi::port::NativeFenceDesc::new(initial, kind))
    }

    /// Creates a native fence with a full description.
    pub fn create_fence_with(&self, desc: &abi::port::NativeFenceDesc) -> Result<NativeFence, UmdError> {
        NativeFence::create(self.inner.clone(), desc)
    }

    /// Opens a cross-adapter fence created on another adapter (by its
    /// [`NativeFence::cross_adapter`] handle). On an adapter without native fences it is
    /// a monitored fence.
    pub fn open_cross_adapter_fence(&self, handle: u64) -> Result<NativeFence, UmdError> {
        NativeFence::open_cross_adapter(self.inner.clone(), handle)
    }

    /// Opens a fence another process shared (by its [`NativeFence::global`] handle).
    pub fn open_fence(&self, global: u64) -> Result<NativeFence, UmdError> {
        NativeFence::open(self.inner.clone(), global)
    }

    /// Waits until every fence (`WaitMode::All`) or any (`WaitMode::Any`) reaches its value;
    /// returns the index of a reached fence for `Any`. Memory first, then the kernel.
    pub fn wait_fences(
        &self,
        conds: &[(&NativeFence, u64)],
        mode: abi::port::WaitMode,
        timeout: Option<std::time::Duration>,
    ) -> Result<usize, UmdError> {
        fence::wait_fences(&self.inner, conds, mode, timeout)
    }

    /// Creates a context on an engine.
    pub fn create_context(&self, engine: EngineId) -> Result<Context, UmdError> {
        let handle = self.inner.port.create_context(self.inner.handle, engine)?;
        Ok(Context { device: self.inner.clone(), handle, engine })
    }

    /// Allocates a doorbell page for this device's user-mode queues (spec 001: "They would
    /// also allocate a doorbell page for the doorbells used by the user queues"). A queue
    /// takes a doorbell of it through [`crate::QueueOptions::doorbell`].
    pub fn create_doorbell_page(&self) -> Result<DoorbellPage, UmdError> {
        let info = self.inner.port.create_doorbell_page(self.inner.handle)?;
        Ok(DoorbellPage { device: self.inner.clone(), info })
    }
}

/// A doorbell page the application allocated ([`Device::create_doorbell_page`]). Freed on
/// drop (the kernel refuses while a queue still uses it; the device's destruction frees it
/// then).
pub struct DoorbellPage {
    device: Arc<DeviceInner>,
    info: abi::port::DoorbellPageInfo,
}

impl DoorbellPage {
    /// The kernel handle.
    pub fn handle(&self) -> abi::DoorbellPageHandle {
        self.info.handle
    }
    /// Its GPU VA: the name a queue descriptor gives it.
    pub fn va(&self) -> u64 {
        self.info.va
    }
    /// Doorbells in it.
    pub fn doorbells(&self) -> u32 {
        self.info.doorbells
    }
    /// Doorbell `index` of this page, for [`crate::QueueOptions::doorbell`]. The kernel
    /// checks, when the queue is created, that it lies in the queue's engine's range and no
    /// other queue has it.
    pub fn doorbell(&self, index: u32) -> DoorbellChoice {
        DoorbellChoice { page_va: self.info.va, index }
    }
}

impl Drop for DoorbellPage {
    fn drop(&mut self) {
        let _ = self.device.port.destroy_doorbell_page(self.info.handle);
    }
}

/// Which doorbell a user-mode queue asks for: a page the application allocated and an index
/// in it ([`DoorbellPage::doorbell`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DoorbellChoice {
    /// The page's GPU VA ([`abi::QueueDescriptor::doorbell_page_va`]).
    pub page_va: u64,
    /// The index in it ([`abi::QueueDescriptor::doorbell_index`]).
    pub index: u32,
}

/// GPU memory mapped into this process: a GPU VA and a CPU mapping. Freed on drop.
pub struct Buffer {
    device: Arc<DeviceInner>,
    info: AllocationInfo,
    map: Arc<shm::Mapping>,
    domain: MemoryDomain,
}

impl Buffer {
    /// GPU virtual address.
    pub fn va(&self) -> u64 {
        self.info.va
    }
    /// Size in bytes.
    pub fn len(&self) -> u64 {
        self.info.bytes
    }
    /// Whether it is empty (never: allocations are at least a page).
    pub fn is_empty(&self) -> bool {
        self.info.bytes == 0
    }
    /// Its domain.
    pub fn domain(&self) -> MemoryDomain {
        self.domain
    }
    /// The kernel handle.
    pub fn handle(&self) -> abi::AllocationHandle {
        self.info.handle
    }
    /// The CPU mapping.
    pub fn map(&self) -> &shm::Mapping {
        &self.map
    }
    /// The CPU mapping, shared (to build typed views of words in it).
    pub fn mapping(&self) -> &Arc<shm::Mapping> {
        &self.map
    }
    /// Reads a u32 at a byte offset.
    pub fn read_u32(&self, offset: u64) -> Result<u32, UmdError> {
        Ok(self.map.read_u32(offset)?)
    }
    /// Reads a u64 at a byte offset.
    pub fn read_u64(&self, offset: u64) -> Result<u64, UmdError> {
        Ok(self.map.read_u64(offset)?)
    }
    /// Writes bytes at an offset.
    pub fn write(&self, offset: u64, bytes: &[u8]) -> Result<(), UmdError> {
        Ok(self.map.write(offset, bytes)?)
    }
    /// Reads bytes at an offset.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), UmdError> {
        Ok(self.map.read(offset, out)?)
    }
    /// Writes a u64 at a byte offset.
    pub fn write_u64(&self, offset: u64, v: u64) -> Result<(), UmdError> {
        Ok(self.map.write_u64(offset, v)?)
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let _ = self.device.port.free(self.info.handle);
    }
}

/// A hardware context on one engine.
pub struct Context {
    pub(crate) device: Arc<DeviceInner>,
    pub(crate) handle: ContextHandle,
    engine: EngineId,
}

impl Context {
    /// The engine.
    pub fn engine(&self) -> EngineId {
        self.engine
    }
    /// The kernel handle.
    pub fn handle(&self) -> ContextHandle {
        self.handle
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        let _ = self.device.port.destroy_context(self.handle);
    }
}
