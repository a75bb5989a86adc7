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
//! - [`kmd`]: the DDI boundary to the device-specific driver, the [`kmd::Kmd`] trait, and
//!   [`kmd::VirtualKmd`], its implementation for the virtual GPU.
//! - [`trace`]: the ordered log of DDI calls and OS actions that tests assert the spec's
//!   sequences against.
//! - [`system`]: an embedded system (kernel and GPU in one process) with its two drivers, live
//!   threads and a deterministic simulation, and the per-process port.
//!
//! Invariants: a handle from another process, or of a destroyed object, is refused; every
//! failure is a [`abi::port::KernelError`] naming the field or handle and its value; one
//! process's bad input changes nothing for any other process.

pub mod cross;
pub mod kmd;
pub mod os;
pub mod system;
mod table;
pub mod trace;

pub use system::{Machine, ProcessPort, System, SystemConfig, Termination};
