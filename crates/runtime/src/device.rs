//! The runtime's device: a [`umd::Device`] together with what spec 004 puts beside it — the
//! runtime's background work queue and pool ([`Runtime`]) and the UMD's profile-guided
//! specializer ([`Profiler`]) — and the application's `SetBackgroundProcessingMode`.
//!
//! In D3D12 the application's device (`ID3D12Device`) is the runtime's object over the UMD's;
//! here [`Device`] is that object over `umd::Device`, which it dereferences to, so everything
//! the driver does (contexts, queues, memory, fences) is called on it unchanged.
//!
//! Invariant (spec 004): when the last clone of a [`Device`] goes, every task it queued has run
//! or been cancelled, and every running one has finished, before the `umd::Device` (and with
//! it the kernel's device, if this held the last reference) is destroyed.

use std::ops::Deref;
use std::sync::Arc;

use abi::port::KernelPort;
use umd::UmdError;

use crate::background::{
    CompletionEvent, Config as BackgroundConfig, MeasurementsAction, Mode, ModeError, ModeRequest, Runtime,
};
use crate::pgo::Profiler;

/// How to open a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceOptions {
    /// Developer mode: allows `DisableBackgroundWork`, `DisableProfilingBySystem` and
    /// `CommitResultsHighPriority` (spec 004 restricts them to developer machines).
    pub developer_mode: bool,
    /// Whether this UMD uses background processing (profile-guided specialization). Without
    /// it, mode changes are benign no-ops and [`FeatureSupport`] says so.
    pub background_processing: bool,
    /// The runtime's pool: its limits and the progress bound.
    pub background: BackgroundConfig,
    /// Whether pool threads change their scheduling class (`SCHED_IDLE`, nice 19).
    pub thread_priorities: bool,
}

impl Default for DeviceOptions {
    fn default() -> Self {
        DeviceOptions {
            developer_mode: false,
            background_processing: true,
            background: BackgroundConfig::default(),
            thread_priorities: true,
        }
    }
}

/// The answer of [`Device::feature_support`] (`D3D12_FEATURE_DATA_D3D12_OPTIONS6`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FeatureSupport {
    /// `BackgroundProcessingSupported`: the UMD acts on background processing modes.
    pub background_processing_supported: bool,
}

struct Inner {
    device: umd::Device,
    options: DeviceOptions,
    /// The runtime's background work queue and pool (spec 004).
    background: Runtime,
    /// The UMD's profile-guided specializer, the user of `background`.
    pgo: Arc<Profiler>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Spec 004: every queued task runs or is cancelled and every running one finishes
        // before the device is destroyed (the `device` field drops after this).
        self.background.shutdown();
    }
}

/// A device with background processing (see the module documentation). Clones share it.
#[derive(Clone)]
pub struct Device {
    inner: Arc<Inner>,
}

impl Device {
    /// Opens a device on a kernel port with the default options.
    pub fn open(port: Arc<dyn KernelPort>) -> Result<Device, UmdError> {
        Device::open_with(port, DeviceOptions::default())
    }

    /// Opens a device with options (developer mode, background processing).
    pub fn open_with(port: Arc<dyn KernelPort>, options: DeviceOptions) -> Result<Device, UmdError> {
        Ok(Device::new(umd::Device::open(port)?, options))
    }

    /// Adds the runtime's half to a device already open (on any port: embedded, or a daemon's
    /// client). The pool starts lazily, on the first queued task.
    pub fn new(device: umd::Device, options: DeviceOptions) -> Device {
        let background = if options.thread_priorities {
            Runtime::new(options.background)
        } else {
            Runtime::without_priorities(options.background)
        };
        let pgo = Arc::new(Profiler::new());
        Device { inner: Arc::new(Inner { device, options, background, pgo }) }
    }

    /// The driver's device (also reached through `Deref`).
    pub fn device(&self) -> &umd::Device {
        &self.inner.device
    }

    /// The options it was opened with.
    pub fn options(&self) -> &DeviceOptions {
        &self.inner.options
    }

    /// `CheckFeatureSupport(D3D12_FEATURE_D3D12_OPTIONS6)`.
    pub fn feature_support(&self) -> FeatureSupport {
        FeatureSupport { background_processing_supported: self.inner.options.background_processing }
    }

    /// The runtime's background work queue: what the UMD queues work on
    /// (`QueueProcessingWorkCb`), and its statistics and trace.
    pub fn background(&self) -> &Runtime {
        &self.inner.background
    }

    /// The profile-guided specializer (measurements, steady state).
    pub fn pgo(&self) -> &Arc<Profiler> {
        &self.inner.pgo
    }

    /// `SetBackgroundProcessingMode`: checks the request (a typed error naming the field, and
    /// nothing changes), then tells the UMD (which may queue tasks: on a commit they are part
    /// of it), then the mode takes effect. A commit's `completion_event` is signalled once
    /// every task queued when this returns has finished. `further_measurements_desired`
    /// receives whether the specializer would like to see more work (false once a pass finds
    /// nothing new, and always on a UMD without the feature).
    pub fn set_background_processing_mode(
        &self,
        mode: Mode,
        action: MeasurementsAction,
        completion_event: Option<&CompletionEvent>,
        further_measurements_desired: Option<&mut bool>,
    ) -> Result<(), ModeError> {
        let req = ModeRequest::new(mode, action, completion_event.is_some(), self.inner.options.developer_mode)?;
        let further = self.inner.background.set_mode(req, completion_event, || {
            if self.inner.options.background_processing {
                self.inner.pgo.set_mode(&self.inner.background, mode, action)
            } else {
                false
            }
        });
        if let Some(f) = further_measurements_desired {
            *f = further;
        }
        Ok(())
    }

    /// [`Device::set_background_processing_mode`] from raw integers (an API boundary): a mode
    /// or action out of range is refused by name.
    pub fn set_background_processing_mode_raw(
        &self,
        mode: u32,
        action: u32,
        completion_event: Option<&CompletionEvent>,
        further_measurements_desired: Option<&mut bool>,
    ) -> Result<(), ModeError> {
        let mode = Mode::try_from(mode)?;
        let action = MeasurementsAction::try_from(action)?;
        self.set_background_processing_mode(mode, action, completion_event, further_measurements_desired)
    }
}

impl Deref for Device {
    type Target = umd::Device;

    fn deref(&self) -> &umd::Device {
        &self.inner.device
    }
}
