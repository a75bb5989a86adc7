//! Firmware commands: how the kernel-mode driver drives the scheduling firmware, as typed
//! data (amdgpu's MES API, whose `mes_add_queue_input` and kin each carry one command's
//! inputs; Asahi's `DeviceControlMsg`).
//!
//! Each command is a struct of its inputs ([`AddQueue`], [`BindDoorbell`], [`RequestPreempt`],
//! ...), declared once in the firmware command table (`crate::fw_table`), and
//! [`Gpu::command`] is the one way in: it records the command in the firmware log
//! ([`crate::FwEvent::Command`], at the time it reached the device) before the firmware acts
//! on it, so the log shows each command followed by what it did, and answers the command's
//! reply (each command's documentation says what it answers). What only reads the device's state (a queue's state, an
//! engine's power, the doorbell a queue is bound to) stays a method of [`Gpu`]; so does the
//! sans-IO driving interface (poll the doorbells, step, the timers, the interrupt line).
//!
//! Invariant: every change the kernel makes to the firmware's queues, doorbells, fences,
//! address spaces and engines' power goes through [`Gpu::command`], and so is in the log.

use std::sync::Arc;

use abi::EngineId;
use abi::queue::FaultKind;
use shm::{Shm, Word};

#[cfg(doc)]
use crate::Interrupt;
use crate::memory::AddressSpace;
use crate::{
    CommandRecord, EngineReset, FenceWaits, FwQueueId, Gpu, GpuError, GpuMapping, MemoryRecord, QueueConfig,
    QueueRecord, Suspension, Time, Vmid,
};

/// A firmware command: a struct of its inputs, which [`Gpu::command`] logs and runs.
pub trait Command: sealed::Apply {}

mod sealed {
    use super::*;

    /// How a command is logged and run (only [`Gpu::command`] does either).
    pub trait Apply {
        /// What the firmware answers.
        type Reply;
        /// What the firmware log keeps of it.
        fn record(&self) -> CommandRecord;
        /// When it reaches the device, where it says (otherwise: the device's last step).
        fn at(&self) -> Option<Time>;
        /// Runs it.
        fn apply(self, gpu: &mut Gpu) -> Result<Self::Reply, GpuError>;
    }
}

impl Gpu {
    /// Sends the firmware a command: it is recorded in the firmware log (at its `now`, or for
    /// a command that carries no time at the device's last step), then run; answers its
    /// reply, or the firmware's refusal (which is logged too: the command was sent).
    pub fn command<C: Command>(&mut self, c: C) -> Result<C::Reply, GpuError> {
        let at = c.at().unwrap_or_else(|| self.fw.last_step());
        self.fw.log_command(at, c.record());
        c.apply(self)
    }
}

crate::fw_table::fw_table!(commands);

impl Map {
    /// Maps all of `memory` at `va`.
    pub fn whole(vmid: Vmid, va: u64, memory: Arc<Shm>, writable: bool) -> Map {
        Map { vmid, va, bytes: memory.len() as u64, memory, offset: 0, writable }
    }
}
