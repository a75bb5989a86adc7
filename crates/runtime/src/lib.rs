//! # runtime — background processing and profile-guided specialization (spec 004)
//!
//! What sits above the user-mode driver: in D3D12, the runtime (`d3d12.dll`) owns a pool of
//! low-priority threads onto which the UMD queues optimization work (`QueueProcessingWorkCb`),
//! and the application steers it with `SetBackgroundProcessingMode`. This crate holds both
//! halves and the UMD's use of them; the driver itself (`umd`: devices, queues, the submission
//! loop, waits) knows nothing of them. Dependencies point one way: `runtime` uses `umd` and
//! `program`, never the reverse.
//!
//! - [`Device`]: a `umd::Device` with its [`background::Runtime`] and [`pgo::Profiler`], and
//!   the application's [`Device::set_background_processing_mode`] (the four modes and four
//!   actions, developer-only ones refused by name). It dereferences to `umd::Device`.
//! - [`background`]: the runtime's work queue, a sans-IO state machine deciding order, the
//!   two-at-a-time limit, modes, commits and their completion events, disable and destruction,
//!   with exactly one of callback or cancel called per task; and its driver, a lazily started
//!   pool at `SCHED_IDLE`.
//! - [`pgo`]: profile-guided specialization. A [`pgo::Pipeline`] measures the argument values
//!   its dispatches bind; a background task compiles a variant for the hot ones
//!   (`program::specialize`); a dispatch runs it only when the bound values match.
//! - [`verify`]: the example programs of `program::examples` run on a device and checked
//!   against their CPU references, the one meaning of "verified" for tests, `doorbell demo`
//!   and `doorbell bench compute`.
//!
//! `docs/background.md` has the design, the spec's rules and where each is tested.
//!
//! ```
//! use kernel::{System, SystemConfig};
//! use runtime::background::{MeasurementsAction, Mode};
//!
//! let sys = System::sim(SystemConfig::default())?;
//! let dev = runtime::Device::open(sys.open_process()?)?;
//! assert!(dev.feature_support().background_processing_supported);
//! dev.set_background_processing_mode(Mode::AllowIntrusiveMeasurements, MeasurementsAction::KeepAll, None, None)?;
//! let buf = dev.allocate(4096)?; // the driver's API, through Deref
//! assert_eq!(buf.read_u32(0)?, 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]

pub mod background;
mod device;
pub mod pgo;
pub mod verify;

pub use device::{Device, DeviceOptions, FeatureSupport};
