//! What every object of a device shares: the kernel port, the device's handle and what the
//! kernel said of the adapter when the device was opened. [`crate::Device`], its buffers,
//! contexts, queues and fences each hold an `Arc` of it, so the kernel's device is destroyed
//! when the last of them goes.
//!
//! It is its own module so that the objects built on it (`device`, `queue`, `fence`,
//! `lowlevel`) depend on it and not on each other in a circle.

use std::sync::Arc;

use abi::DeviceHandle;
use abi::port::{AdapterInfo, KernelPort};

/// A device's shared state.
pub(crate) struct DeviceInner {
    pub(crate) port: Arc<dyn KernelPort>,
    pub(crate) handle: DeviceHandle,
    pub(crate) info: AdapterInfo,
    /// The native fence caps, asked once at open ([`KernelPort::native_fence_caps`]).
    pub(crate) fence_caps: abi::port::NativeFenceCaps,
}

impl Drop for DeviceInner {
    fn drop(&mut self) {
        let _ = self.port.destroy_device(self.handle);
    }
}
