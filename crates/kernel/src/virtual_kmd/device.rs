//! The device lock a DDI holds, and the translation of the device's refusals into the
//! kernel's terms: no `gpu` type crosses the DDI boundary.

use abi::port::DeviceRefusal;
use gpu::Gpu;
use parking_lot::Mutex;

use crate::ddi::DdiError;

/// The device lock held for a DDI, with the attention register raised (`VirtualKmd::device`).
/// Fields drop in order: the lock is released before the attention is lowered.
pub(super) struct Device<'a> {
    gpu: parking_lot::MutexGuard<'a, Gpu>,
    _attention: gpu::AttentionGuard<'a>,
}

/// `VirtualKmd::device`, from the two fields (for callers holding another field mutably).
pub(super) fn lock_device<'a>(gpu: &'a Mutex<Gpu>, attention: &'a gpu::Attention) -> Device<'a> {
    let attention = attention.raise();
    Device { gpu: crate::spin::lock_soon(gpu), _attention: attention }
}

impl std::ops::Deref for Device<'_> {
    type Target = Gpu;
    fn deref(&self) -> &Gpu {
        &self.gpu
    }
}

impl std::ops::DerefMut for Device<'_> {
    fn deref_mut(&mut self) -> &mut Gpu {
        &mut self.gpu
    }
}

/// A device refusal, reported against the argument that caused it and translated into the
/// kernel's terms ([`DeviceRefusal`]): no `gpu` type crosses the DDI boundary.
pub(crate) fn refused(field: &'static str, value: impl ToString) -> impl FnOnce(gpu::GpuError) -> DdiError {
    use DeviceRefusal as R;
    use gpu::GpuError as G;
    move |e| {
        let reason = match e {
            G::StaleQueue(_) => R::UnknownQueue,
            G::BadVmid(_) => R::NoAddressSpace,
            G::BadEngine(n) => R::NoSuchEngine(n),
            G::Overlap { va, bytes } => R::MappingOverlap { va, bytes },
            G::BadMapping { va, bytes, why } => R::BadMapping { va, bytes, why },
            G::QueueMemory(fault) => R::QueueMemory(fault),
            G::BadStartPointer { wptr } => R::BadStartPointer { wptr },
            // (The OS sized or checked the area first: not reached.)
            G::SaveAreaTooSmall { .. } => {
                R::QueueMemory(abi::queue::FaultKind::BadSaveArea { why: "smaller than a queue needs" })
            }
            G::NoGlobalDoorbellBit { bit, bits } => R::NoGlobalDoorbellBit { bit, bits },
            G::TooManyEngines { engines, max } => R::TooManyEngines { engines, max },
            G::NoGlobalDoorbell { model } => R::NoGlobalDoorbell { model },
            G::BadDoorbell { index, count } => R::BadDoorbell { index, count },
            G::Shm(e) => return DdiError::Shm(e),
            G::NotHeld(_) => R::NotHeld,
            G::BadTakeBack { wptr, floor, accepted, .. } => R::BadTakeBack { wptr, floor, accepted },
            G::Hardware(e) => R::Hardware(e.to_string()),
        };
        DdiError::Refused { field, value: value.to_string(), reason }
    }
}
