//! What the firmware log keeps of each command the kernel sends ([`CommandRecord`], from the
//! firmware command table, `crate::fw_table`): the command's inputs, less the shared memory
//! some of them carry, which the log records by where it is ([`MemoryRecord`]) and never
//! holds, so a logged command keeps no queue's memory alive.

use std::sync::Arc;

use abi::queue::FaultKind;
use abi::{EngineId, Priority, Time};
use shm::{Shm, Word};

use super::{FenceWaits, FwQueueId, QueueConfig};
use crate::memory::Vmid;

/// Shared memory a command names, as the firmware log records it: which region (its
/// process-unique id, [`Shm::id`]; `None` for memory that is not a region of its own) and
/// where in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryRecord {
    /// The region.
    pub region: Option<u64>,
    /// The byte offset in it.
    pub offset: u64,
}

impl From<&Arc<Shm>> for MemoryRecord {
    fn from(s: &Arc<Shm>) -> Self {
        MemoryRecord { region: Some(s.id()), offset: 0 }
    }
}

impl From<&(Arc<Shm>, u64)> for MemoryRecord {
    fn from((s, offset): &(Arc<Shm>, u64)) -> Self {
        MemoryRecord { region: Some(s.id()), offset: *offset }
    }
}

impl From<&Word> for MemoryRecord {
    fn from(w: &Word) -> Self {
        let region = match w.region() {
            shm::Region::Shm(s) => Some(s.id()),
            _ => None,
        };
        MemoryRecord { region, offset: w.offset() }
    }
}

/// A queue's descriptor ([`QueueConfig`]) as the firmware log records an added queue: where
/// and how it runs, not its memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueRecord {
    /// Its address space.
    pub vmid: Vmid,
    /// Its engine.
    pub engine: EngineId,
    /// Its ring's GPU VA.
    pub ring_va: u64,
    /// Its ring's size.
    pub ring_bytes: u64,
    /// A kernel queue.
    pub privileged: bool,
    /// Its priority.
    pub priority: Priority,
}

impl From<&QueueConfig> for QueueRecord {
    fn from(c: &QueueConfig) -> Self {
        QueueRecord {
            vmid: c.vmid,
            engine: c.engine,
            ring_va: c.ring_va,
            ring_bytes: c.ring_bytes,
            privileged: c.privileged,
            priority: c.priority,
        }
    }
}

crate::fw_table::fw_table!(records);
