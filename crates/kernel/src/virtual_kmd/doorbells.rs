//! The KMD's doorbell models (spec 000 "Doorbell models"): a physical doorbell per queue
//! index of a process's page, a victimized pool of them, or bits of the device's global
//! doorbell. The OS runs the same connect, disconnect and victimization sequences over all
//! three; which doorbell a queue gets, and which one a pool takes back, is decided here.
//!
//! Invariant: a pooled doorbell is held by exactly one connected queue, through the lease in
//! [`DoorbellPool::connected`]; dropping the lease (disconnect, destroy, victimization)
//! returns it.

use abi::HwQueueHandle;
use abi::port::DeviceRefusal;
use abi::slab::KeyMap;
use gpu::{FwQueueId, Gpu, cmd};

use super::{VirtualKmd, lock_device, refused};
use crate::ddi::{ConnectStep, DdiError, DisconnectCallback};

/// How the KMD hands out doorbells.
pub(super) enum Doorbells {
    /// Dedicated: every queue index of a process's page is its own physical doorbell.
    PerProcess,
    /// Dedicated, virtualized over a limited pool.
    Pool(DoorbellPool),
    /// Global: one doorbell for every queue (spec 000: no victimization needed); each queue
    /// rings its bit of its process's page.
    Global,
}

/// The dedicated-doorbell model with a limited pool (spec 000 "Dedicated doorbells"): a few
/// physical doorbells, each at offset 0 of its own BAR page (a CPU VA rotates a whole page),
/// shared by every user-mode queue by victimizing one as the [`VictimPolicy`] says.
pub(super) struct DoorbellPool {
    pub(super) first_page: u32,
    /// Its physical doorbells (index `j` is BAR page `first_page + j`), each held by a lease
    /// that returns it when dropped.
    free: crate::pool::Pool,
    pub(super) count: u32,
    /// Connected owners and their doorbells, least recently connected first.
    pub(super) connected: std::collections::VecDeque<(HwQueueHandle, crate::pool::Lease)>,
    policy: VictimPolicy,
}

/// Which connected doorbell the pooled model victimizes when a queue connects and every
/// physical doorbell is taken (spec 000: "an older or least recently used hardware queue").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum VictimPolicy {
    /// The doorbell least recently used: connected or rung (as the firmware latched the
    /// ring), whichever came later. A busy queue keeps its doorbell; an idle one is
    /// victimized. The default.
    #[default]
    LeastRecentlyRung,
    /// The doorbell connected longest ago, however often its queue rings it since.
    LeastRecentlyConnected,
}

impl DoorbellPool {
    /// The queue whose doorbell goes, by the pool's policy (`None`: none is connected). Every
    /// bind takes a fresh step of the firmware's sequence, so last uses only tie at 0 (a
    /// doorbell the device reports unbound); ties go to the least recently connected
    /// (`min_by_key` keeps the first minimum).
    fn victim(&self, gpu: &Gpu, fw: &KeyMap<HwQueueHandle, FwQueueId>) -> Option<HwQueueHandle> {
        let mut owners = self.connected.iter().map(|(q, _)| *q);
        match self.policy {
            VictimPolicy::LeastRecentlyConnected => owners.next(),
            VictimPolicy::LeastRecentlyRung => owners.min_by_key(|q| {
                match fw.get(q).and_then(|&id| gpu.doorbell_of(id).ok().flatten()) {
                    Some(gpu::BoundDoorbell::Word { last_used, .. }) => last_used,
                    // Not bound as far as the device knows: the best victim there is.
                    _ => 0,
                }
            }),
        }
    }
}

impl VirtualKmd {
    /// Virtualizes user-mode doorbells over a pool of `count` physical doorbells, kept in the
    /// last BAR pages. A device with a global doorbell has nothing to
    /// virtualize (spec 000: "This mechanism isn't required if a GPU uses global doorbells"),
    /// so there this does nothing and returns `false`. When the pool is full, a connect
    /// victimizes a connected doorbell as `policy` says.
    pub fn set_doorbell_pool(&mut self, count: u32, policy: VictimPolicy) -> bool {
        if let Doorbells::Global = self.doorbells {
            return false;
        }
        let top = self.device().doorbell_count() / abi::doorbell::DOORBELLS_PER_PAGE;
        // Keep page 0 (kernel queues) and at least one process page.
        let count = count.clamp(1, top.saturating_sub(2).max(1));
        self.doorbells = Doorbells::Pool(DoorbellPool {
            first_page: top - count,
            free: crate::pool::Pool::new("pooled physical doorbells", 0..count, None),
            count,
            connected: Default::default(),
            policy,
        });
        true
    }

    fn connected(&self, page: u32) -> ConnectStep {
        ConnectStep { page_offset: page as u64 * abi::doorbell::DOORBELL_PAGE_BYTES, notify: self.notify_on_submit }
    }

    /// Unbinds `q`'s physical doorbell and frees its pool doorbell, if it holds one.
    pub(super) fn unbind(&mut self, q: HwQueueHandle) -> Result<(), DdiError> {
        let fw = self.fw(q)?;
        self.device().command(cmd::UnbindDoorbell { queue: fw }).map_err(refused("queue", q))?;
        self.release_pool_doorbell(q);
        Ok(())
    }

    /// Frees `q`'s pool doorbell, if it holds one.
    pub(super) fn release_pool_doorbell(&mut self, q: HwQueueHandle) {
        if let Doorbells::Pool(pool) = &mut self.doorbells {
            // Dropping its lease returns the doorbell.
            pool.connected.retain(|(x, _)| *x != q);
        }
    }

    /// `DxgkDdiConnectDoorbell` ([`crate::ddi::Kmd::connect_doorbell`]) under the KMD's doorbell model.
    pub(super) fn connect_user_doorbell(
        &mut self,
        queue: HwQueueHandle,
        process_page: u32,
        index: u32,
        callback: &mut dyn DisconnectCallback,
    ) -> Result<ConnectStep, DdiError> {
        let fw = self.fw(queue)?;
        let per_page = abi::doorbell::DOORBELLS_PER_PAGE;
        let page = match &mut self.doorbells {
            Doorbells::Global => {
                // Every queue shares the one doorbell: nothing to victimize.
                lock_device(&self.gpu, &self.attention)
                    .command(cmd::BindGlobalDoorbell { queue: fw, page: process_page, bit: index })
                    .map_err(refused("doorbell index", index))?;
                process_page
            }
            Doorbells::PerProcess => {
                let bar_index = process_page * per_page + index;
                lock_device(&self.gpu, &self.attention)
                    .command(cmd::BindDoorbell { queue: fw, index: bar_index })
                    .map_err(refused("doorbell BAR index", bar_index))?;
                process_page
            }
            Doorbells::Pool(pool) => {
                let lease = match pool.free.take() {
                    Ok(lease) => lease,
                    Err(e) => {
                        // Victimize a doorbell as the policy says: the OS's callback first
                        // (the victim's CPU VA to the dummy page, DisconnectedRetry), then the
                        // physical disconnect, whose wptr re-read loses nothing.
                        let victim = pool.victim(&lock_device(&self.gpu, &self.attention), &self.queues);
                        let victim = victim.ok_or_else(|| DdiError::Refused {
                            field: "doorbell pool",
                            value: e.to_string(),
                            reason: DeviceRefusal::NoDoorbellToVictimize,
                        })?;
                        callback.disconnect_doorbell(victim)?;
                        self.unbind(victim)?;
                        callback.victim_unbound(victim);
                        let Doorbells::Pool(pool) = &self.doorbells else { unreachable!("still a pool") };
                        pool.free.take().map_err(|e| DdiError::Refused {
                            field: "doorbell pool",
                            value: e.to_string(),
                            reason: DeviceRefusal::VictimKeptDoorbell,
                        })?
                    }
                };
                let Doorbells::Pool(pool) = &mut self.doorbells else { unreachable!("still a pool") };
                let page = pool.first_page + lease.index();
                let bar_index = page * per_page;
                lock_device(&self.gpu, &self.attention)
                    .command(cmd::BindDoorbell { queue: fw, index: bar_index })
                    .map_err(refused("doorbell BAR index", bar_index))?;
                pool.connected.push_back((queue, lease));
                page
            }
        };
        Ok(self.connected(page))
    }
}
