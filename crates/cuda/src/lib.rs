//! # cuda — doorbell's hardware on an NVIDIA GPU
//!
//! Roadmap item 13: the hardware queue slots and engines of spec 001 as a persistent program
//! on a real GPU, driven by the same `umd`, `kernel` and scheduling firmware as the virtual
//! GPU. The firmware (slot mapping, oversubscription, doorbell watching, preemption requests,
//! hang detection, timers — AMD's MES role) stays Rust on the CPU; what moves to the GPU is
//! what it drives: slots that poll their queue's wptr in the client's memory, fetch and
//! execute packets, and write rptr, progress fences, fence values and fence-log entries
//! themselves. The seam is [`gpu::hw`]: typed commands in, events out.
//!
//! The pieces:
//! - `device/*.cu`: the engine program, written once in portable CUDA C++ (`common.cuh` says
//!   how) — the packet engine (`engine.cu`), the compute ISA interpreter in which a warp is a
//!   wave (`isa.cuh`), the shared layout (`layout.cuh`), and CUDA's own path for comparison
//!   (`baseline.cu`);
//! - [`driver`]: the CUDA driver API and NVRTC, loaded at run time, so this crate builds and
//!   its CPU tests run on machines with neither (every entry point says so with a typed
//!   error);
//! - [`host`]: the host's side of the slot protocol, a [`gpu::hw::Hardware`] over a
//!   [`host::Backing`]: [`nvidia::Nvidia`] (the program compiled by NVRTC and launched as a
//!   persistent kernel) or [`emulated::Emulated`] (the same program compiled for the CPU by
//!   `build.rs` and stepped by the host: how CI tests the GPU's code without a GPU);
//! - [`layout`], [`shared`], [`fault`]: the shared structs, the memory both sides reach, and
//!   the device's fault records turned back into [`abi::queue::FaultKind`];
//! - [`baseline`]: CUDA's launch path and the PCIe floor, measured in the same run as
//!   doorbell's own figures.
//!
//! Invariants: the public API is safe; `unsafe` lives in `driver`, `shared` and `emulated`,
//! each block with its reason; nothing the client writes can make the host or the GPU program
//! touch memory outside the client's own mappings (every address is translated through the
//! page tables the host builds from the kernel's mappings).

pub mod baseline;
pub mod check;
pub mod driver;
pub mod emulated;
pub mod fault;
pub mod host;
pub mod layout;
pub mod nvidia;
pub mod shared;

use std::sync::Arc;

use gpu::hw::{Hardware, HardwareFactory, HwError};

pub use driver::{Cuda, CudaError};

/// A device configuration's hardware ([`gpu::GpuConfig::hardware`]) that runs the engine
/// program emulated on the CPU.
pub fn emulated() -> HardwareFactory {
    HardwareFactory {
        name: "emulated".into(),
        make: Arc::new(|| Ok(Box::new(host::Slots::new(emulated::Emulated::new())?) as Box<dyn Hardware>)),
    }
}

/// The same, with the emulated slots on a thread of their own, running as a GPU's do
/// (asynchronously to the firmware): for tests of the races a GPU has and the deterministic
/// emulator cannot show.
pub fn emulated_threaded() -> HardwareFactory {
    HardwareFactory {
        name: "emulated (threaded)".into(),
        make: Arc::new(|| Ok(Box::new(host::Slots::new(emulated::Emulated::threaded())?) as Box<dyn Hardware>)),
    }
}

/// A device configuration's hardware that runs the engine program on NVIDIA GPU `ordinal`.
/// Fails at once, with the reason, on a machine without a usable GPU or driver.
pub fn nvidia(ordinal: usize) -> Result<HardwareFactory, CudaError> {
    let probe = nvidia::Nvidia::open(ordinal)?;
    let name = probe.cuda().name()?;
    drop(probe);
    Ok(HardwareFactory {
        name: format!("{name} (CUDA)"),
        make: Arc::new(move || {
            let b = nvidia::Nvidia::open(ordinal).map_err(|e| HwError::Failed(e.to_string()))?;
            Ok(Box::new(host::Slots::new(b)?) as Box<dyn Hardware>)
        }),
    })
}
