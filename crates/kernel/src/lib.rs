//! # kernel — the OS graphics kernel and the kernel-mode driver
//!
//! This crate is the control path of doorbell: everything a client reaches through
//! [`abi::port::KernelPort`] calls, and everything that services the device's interrupts.
//!
//! - [`os`]: the OS part (Dxgkrnl; the amdgpu USERQ ioctls): per-process object tables with
//!   generation-checked handles, validation with typed errors, allocations and the references
//!   doorbells hold on ring memory, doorbell objects with their CPU-VA rotation and status
//!   word, CPU waits on progress fences, engine power policy (F0/F1), the interrupt service
//!   routine, and the traditional kernel-mode submission path (software queues and a scheduler
//!   that feeds kernel-owned rings).
//! - [`ddi`]: the DDI boundary to the device-specific driver, typed in the kernel's own terms:
//!   the [`ddi::Kmd`] trait, its notifications, RAII GPU mappings, and [`ddi::Traced`], the
//!   decorator that logs every DDI call and can fail chosen ones for error-path tests. Each
//!   DDI is declared once, in the DDI table (`ddis`), from which the trait, the decorator's
//!   forwarding, [`ddi::DdiKind`] and the trace's [`trace::Ddi`] are generated.
//! - [`virtual_kmd`]: [`virtual_kmd::VirtualKmd`], the KMD of the virtual GPU — the only
//!   module that names `gpu` types.
//! - [`trace`]: the ordered log of DDI calls and OS actions that tests assert the spec's
//!   sequences against.
//! - [`system`]: an embedded system (kernel and GPU in one process) with its two drivers, live
//!   threads and a deterministic simulation, and the per-process port.
//!
//! Invariants: a handle from another process, or of a destroyed object, is refused; every
//! failure is a [`abi::port::KernelError`] naming the field or handle and its value; one
//! process's bad input changes nothing for any other process.
#![forbid(unsafe_code)]

pub mod cross;
pub mod ddi;
mod ddis;
pub mod os;
mod pool;
mod spin;
pub mod system;
mod table;
pub mod trace;
pub mod virtual_kmd;

pub use os::TdrConfig;
pub use system::{FenceWaitHandle, Machine, ProcessPort, System, SystemConfig, Termination};
pub use virtual_kmd::VictimPolicy;
