//! What one client process holds, as the daemon counts it: for its per-process limits
//! ([`wire::Limits`]) and for `doorbell status`. The ledger reads calls and replies as data:
//! [`Ledger::admit`] refuses a call past a limit before the kernel sees it, and
//! [`Ledger::record`] notes what an answered call created or destroyed.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use abi::port::{Call, KernelError, Reply, SubmissionMode};
use abi::queue::DOORBELL_INDEX_ANY;
use abi::{AllocationHandle, ContextHandle, DeviceHandle, HwQueueHandle};
use shm::RotatingPage;
use wire::Limits;

/// What one client process holds.
#[derive(Default)]
pub(crate) struct Ledger {
    /// Allocation -> (device, bytes).
    pub(crate) allocations: HashMap<AllocationHandle, (DeviceHandle, u64)>,
    /// Native fences (count toward the allocation limit).
    fences: HashMap<abi::NativeFenceHandle, DeviceHandle>,
    /// Context -> device.
    contexts: HashMap<ContextHandle, DeviceHandle>,
    /// Queue -> what status shows.
    pub(crate) queues: HashMap<HwQueueHandle, QueueMeta>,
    /// Devices.
    pub(crate) devices: HashSet<DeviceHandle>,
}

/// One queue, as status shows it.
#[derive(Clone)]
pub(crate) struct QueueMeta {
    context: ContextHandle,
    pub(crate) engine: abi::EngineId,
    /// A user-mode queue (it has a doorbell), not a kernel-mode one.
    pub(crate) user_mode: bool,
    /// Its doorbell's index in its page, once known: the one the descriptor chose, or the
    /// kernel's choice when the doorbell is created.
    pub(crate) doorbell: Option<u32>,
    pub(crate) priority: abi::Priority,
    /// The daemon-side doorbell CPU page (which BAR page the doorbell is on).
    pub(crate) page: Option<Arc<RotatingPage>>,
}

/// Refused past a limit: what, how many the process holds and its limit.
pub(crate) fn limit(what: &'static str, have: u64, limit: u64) -> KernelError {
    KernelError::Exhausted { what, detail: format!("this process holds {have}, its limit is {limit}") }
}

impl Ledger {
    /// Refuses `call` if it would take the process past one of `limits`.
    pub(crate) fn admit(&self, call: &Call<'_>, limits: &Limits) -> Result<(), KernelError> {
        match call {
            Call::Allocate { desc, .. } => {
                let bytes = desc.bytes.div_ceil(shm::PAGE_SIZE as u64).saturating_mul(shm::PAGE_SIZE as u64);
                self.check_objects(limits)?;
                if self.bytes().saturating_add(bytes) > limits.bytes {
                    return Err(limit("allocation bytes (per-process limit)", self.bytes(), limits.bytes));
                }
            }
            Call::CreateHwQueue { .. } if self.queues.len() >= limits.queues as usize => {
                return Err(limit("queues (per-process limit)", self.queues.len() as u64, limits.queues as u64));
            }
            Call::CreateNativeFence { .. } | Call::OpenProgressFence(_) => self.check_objects(limits)?,
            _ => {}
        }
        Ok(())
    }

    /// Notes what `call`, answered with `reply`, created or destroyed.
    pub(crate) fn record(&mut self, call: &Call<'_>, reply: &Reply) {
        match (call, reply) {
            (Call::CreateDevice, Reply::Device(d)) => {
                self.devices.insert(*d);
            }
            (Call::DestroyDevice(d), _) => self.forget_device(*d),
            (Call::Allocate { device, .. }, Reply::Allocation(info)) => {
                self.allocations.insert(info.handle, (*device, info.bytes));
            }
            (Call::Free(a), _) => {
                self.allocations.remove(a);
            }
            (Call::CreateContext { device, .. }, Reply::Context(c)) => {
                self.contexts.insert(*c, *device);
            }
            (Call::DestroyContext(c), _) => self.forget_context(*c),
            (Call::CreateHwQueue { context, desc }, Reply::HwQueue(info)) => {
                let (user_mode, doorbell) = match desc.mode {
                    SubmissionMode::UserMode(d) => (true, Some(d.doorbell_index).filter(|&i| i != DOORBELL_INDEX_ANY)),
                    SubmissionMode::KernelMode => (false, None),
                };
                let (context, engine, priority) = (*context, info.engine, desc.priority);
                let meta = QueueMeta { context, engine, user_mode, doorbell, priority, page: None };
                self.queues.insert(info.handle, meta);
            }
            (Call::DestroyHwQueue(q), _) => {
                self.queues.remove(q);
            }
            (Call::CreateDoorbell(args), Reply::Doorbell(info)) => {
                if let Some(q) = self.queues.get_mut(&args.queue) {
                    q.page = Some(info.cpu_page.clone());
                    q.doorbell = u32::try_from(info.offset / abi::doorbell::DOORBELL_BYTES).ok();
                }
            }
            (
                Call::CreateNativeFence { device, .. }
                | Call::OpenNativeFence { device, .. }
                | Call::OpenCrossAdapterFence { device, .. },
                Reply::NativeFence(info),
            ) => {
                self.fences.insert(info.handle, *device);
            }
            (Call::OpenProgressFence(_), Reply::NativeFence(info)) => {
                if let Some(d) = self.devices.iter().next().copied() {
                    self.fences.insert(info.handle, d);
                }
            }
            (Call::DestroyNativeFence(f), _) => {
                self.fences.remove(f);
            }
            _ => {}
        }
    }

    /// Refuses one more object (allocation or fence) past the process's limit.
    fn check_objects(&self, limits: &Limits) -> Result<(), KernelError> {
        if self.objects() >= limits.allocations as usize {
            return Err(limit("allocations (per-process limit)", self.objects() as u64, limits.allocations as u64));
        }
        Ok(())
    }
    pub(crate) fn bytes(&self) -> u64 {
        self.allocations.values().map(|a| a.1).sum()
    }
    fn objects(&self) -> usize {
        self.allocations.len() + self.fences.len()
    }
    fn forget_context(&mut self, c: ContextHandle) {
        self.contexts.remove(&c);
        self.queues.retain(|_, q| q.context != c);
    }
    fn forget_device(&mut self, d: DeviceHandle) {
        self.devices.remove(&d);
        self.allocations.retain(|_, a| a.0 != d);
        self.fences.retain(|_, f| *f != d);
        let gone: Vec<_> = self.contexts.iter().filter(|(_, dev)| **dev == d).map(|(c, _)| *c).collect();
        for c in gone {
            self.forget_context(c);
        }
    }
}
