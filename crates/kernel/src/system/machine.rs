//! Several adapters in one machine, joined by the cross-adapter fence layer.

use std::sync::Arc;

use abi::port::KernelError;

use super::driver::SimWorld;
use super::{System, SystemConfig};

/// Several adapters in one kernel (spec 002 "Cross-adapter native fences"), say an iGPU and
/// a dGPU: each is a [`System`] (its own OS instance, KMD, GPU and driver), joined by the
/// cross-adapter fence layer ([`crate::cross`]). The deterministic machine runs every adapter
/// on one virtual clock, and a step (or a blocked wait) steps them all.
pub struct Machine {
    adapters: Vec<System>,
    cross: Arc<crate::cross::CrossAdapter>,
}

impl Machine {
    /// A deterministic machine with one adapter per config.
    pub fn sim(cfgs: &[SystemConfig]) -> Result<Machine, KernelError> {
        let world = Arc::new(SimWorld::default());
        Self::join(cfgs.iter().map(|c| System::sim_in(c.clone(), world.clone())).collect::<Result<_, _>>()?)
    }

    /// A live machine: each adapter with its own threads.
    pub fn live(cfgs: &[SystemConfig]) -> Result<Machine, KernelError> {
        Self::join(cfgs.iter().map(|c| System::live(c.clone())).collect::<Result<_, _>>()?)
    }

    fn join(adapters: Vec<System>) -> Result<Machine, KernelError> {
        let cross = Arc::new(crate::cross::CrossAdapter::default());
        for (i, a) in adapters.iter().enumerate() {
            let me = crate::cross::AdapterId(i as u32);
            let weak = Arc::downgrade(&a.inner);
            cross.attach(me, weak);
            a.inner.os.lock().attach_cross(cross.clone(), me);
            *a.inner.cross.lock() = Some((cross.clone(), me));
        }
        Ok(Machine { adapters, cross })
    }

    /// Adapter `i` (in config order).
    pub fn adapter(&self, i: usize) -> &System {
        &self.adapters[i]
    }

    /// The adapters.
    pub fn adapters(&self) -> &[System] {
        &self.adapters
    }

    /// Sim: steps every adapter until nothing more happens at the current time.
    pub fn settle(&self) {
        if let Some(a) = self.adapters.first() {
            a.settle();
        }
    }

    /// What the cross-adapter layer did, in order (bounded like [`System::trace`]), and how
    /// many older events were dropped.
    pub fn cross_trace(&self) -> (Vec<crate::cross::CrossEvent>, u64) {
        self.cross.trace()
    }
}
