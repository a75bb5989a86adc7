//! The device's configuration ([`GpuConfig`]) and its check ([`GpuConfig::validate`]): engines,
//! doorbell BAR, slots, quanta, budgets, the cost model and the hardware the slots are.
//!
//! Invariant: a configuration `validate` accepts builds a device; the firmware itself only
//! clamps, for the tests and tools that build one directly.

use std::time::Duration;

use abi::doorbell::DoorbellModel;
use abi::preempt::PreemptionCaps;
use abi::queue::EngineKind;

use crate::cost::{CostModel, Timing};
#[cfg(doc)]
use crate::{Gpu, cost};
use crate::{compute, hw};

/// Device configuration.
#[derive(Clone, Debug)]
pub struct GpuConfig {
    /// Engines, in id order.
    pub engines: Vec<EngineKind>,
    /// Pages of the doorbell BAR (512 doorbells each). At least 2 (the kernel's and one
    /// process page).
    pub doorbell_pages: u32,
    /// An engine with no work for this long asks for F1.
    pub idle_period: Duration,
    /// Packets one queue may execute per [`Gpu::step`] before the engine moves on (its turn
    /// is also bounded by device time, [`CostModel::turn`]).
    pub packet_budget: u32,
    /// Lanes per wave on compute engines (1..=64).
    pub wave_width: u32,
    /// Kernel wave-instructions a `DISPATCH` may run per [`Gpu::step`] before the engine
    /// saves its state and moves on.
    pub dispatch_budget: u64,
    /// `OptimizedNativeFenceSignaledInterrupt`: a logged fence signal's interrupt names the
    /// queue (the kernel reads its signal log) instead of the fence.
    pub optimized_fence_interrupts: bool,
    /// Hardware queue slots (HQDs) per engine; more queues than slots are time-sliced.
    pub hw_slots: u32,
    /// Time slice between queues of equal priority in different processes.
    pub process_quantum: Duration,
    /// Time slice between queues of equal priority in one process.
    pub gang_quantum: Duration,
    /// Spec 000's doorbell model. Under `Global` every queue of a process rings its bit of
    /// that process's doorbell page (see [`abi::doorbell`]).
    pub doorbell_model: DoorbellModel,
    /// Engines miss doorbells of user queues that hold no hardware slot (amdgpu: "the engine
    /// firmware may miss the request"). The kernel then gives each process an aggregated
    /// doorbell page, which its clients ring too: two BAR pages per process, so the default
    /// 64 pages host 31 processes instead of 63.
    pub misses_unmapped_doorbells: bool,
    /// What executing work costs in device time ([`cost`]): it budgets each queue's turn,
    /// and with [`Timing::Modelled`] it occupies the engine.
    pub cost: CostModel,
    /// Whether modelled costs occupy the engine (the deterministic driver) or only budget
    /// turns (the live driver, where execution takes real time).
    pub timing: Timing,
    /// Where engines may stop a queue's work for a preemption (`D3DKMDT_PREEMPTION_CAPS`,
    /// spec 003): by default the finest levels, an instruction and a chunk.
    pub preemption: PreemptionCaps,
    /// The hardware the engines' slots are ([`hw`]): `None` for the virtual engines on the
    /// firmware's thread; the `cuda` crate makes one for an NVIDIA GPU, or the same program
    /// emulated on the CPU.
    pub hardware: Option<hw::HardwareFactory>,
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            engines: vec![EngineKind::Compute, EngineKind::Copy],
            doorbell_pages: 64,
            idle_period: Duration::from_millis(20),
            packet_budget: 256,
            wave_width: 32,
            dispatch_budget: 16 * 1024,
            optimized_fence_interrupts: false,
            hw_slots: 8,
            process_quantum: Duration::from_millis(10),
            gang_quantum: Duration::from_millis(1),
            doorbell_model: DoorbellModel::Dedicated,
            misses_unmapped_doorbells: false,
            cost: CostModel::default(),
            timing: Timing::Real,
            preemption: PreemptionCaps::default(),
            hardware: None,
        }
    }
}

impl GpuConfig {
    /// The longest a device timer (the idle period, a quantum) may be: one hour.
    pub const MAX_PERIOD: Duration = Duration::from_secs(3600);

    /// Refuses settings of zero or past their bounds, naming the field and the value: a
    /// device with no hardware slot, a turn of no packets or wave-instructions, a wave of no
    /// lanes or more than [`compute::MAX_WAVE`], a zero or hour-plus quantum or idle period.
    /// The kernel's `System` calls it before it builds a device (the firmware itself only
    /// clamps, for the tests and tools that build one directly).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |field, value: String, expected| Err(ConfigError { field, value, expected });
        let period = |field, d: Duration| {
            if d.is_zero() || d > Self::MAX_PERIOD {
                bad(field, format!("{d:?}"), "between 1 ns and 1 hour")
            } else {
                Ok(())
            }
        };
        period("idle_period", self.idle_period)?;
        period("process_quantum", self.process_quantum)?;
        period("gang_quantum", self.gang_quantum)?;
        if self.engines.is_empty() {
            return bad("engines", "[]".into(), "at least one engine");
        }
        if self.hw_slots == 0 {
            return bad("hw_slots", "0".into(), "at least 1");
        }
        if self.packet_budget == 0 {
            return bad("packet_budget", "0".into(), "at least 1");
        }
        if self.dispatch_budget == 0 {
            return bad("dispatch_budget", "0".into(), "at least 1");
        }
        if self.wave_width == 0 || self.wave_width as usize > compute::MAX_WAVE {
            return bad("wave_width", self.wave_width.to_string(), "between 1 and 64");
        }
        Ok(())
    }
}

/// A device setting out of its range ([`GpuConfig::validate`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("device configuration: {field} = {value} is out of range (expected {expected})")]
pub struct ConfigError {
    /// The [`GpuConfig`] field.
    pub field: &'static str,
    /// The value given.
    pub value: String,
    /// The range it must be in.
    pub expected: &'static str,
}
