//! Doorbells and their status word.
//!
//! A doorbell is a 64-bit word in the device's doorbell BAR (spec 001 "Writing to the doorbell
//! wakes the firmware"). The BAR is made of 4 KiB pages of 512 doorbells; each client process
//! owns one page (and may allocate one more, spec 001), and a queue's doorbell index lies
//! inside the page its descriptor names. The device implements one of
//! spec 000's two models ([`DoorbellModel`]), and the kernel tells the client how to ring
//! ([`RingMethod`]):
//!
//! - **Dedicated**: each queue has its own word, and a client rings it by storing the queue's
//!   new wptr ([`RingMethod::WriteWptr`]). The firmware notices the change. Physical doorbells
//!   may be fewer than queues; the kernel then virtualizes them (victimization).
//! - **Global**: one doorbell for every queue, the value written naming the queue. Written
//!   memory is not a bus write (a later store could erase an earlier one), so the emulation
//!   gives each process its doorbell page as a page of bits: a queue's ring sets the bit of its
//!   doorbell index ([`RingMethod::SetBit`], an atomic OR, so concurrent rings never overwrite
//!   each other), and a process can only ever clear its own queues' bits. The firmware takes
//!   whole words (swapping them to zero) and re-reads the wptr of each queue named; a bit set
//!   by another queue only makes the firmware re-read that queue's wptr, which is harmless.
//!   Nothing is ever victimized.
//!
//! Either model may add the **aggregated doorbell** (amdgpu, spec 001): on a device whose
//! engines miss doorbells of queues that are not in a hardware slot, the kernel maps a page of
//! aggregated doorbell into each process (for the CPU, and into its GPU address space), and
//! the client also rings its engine's word there after every ring — any non-zero store, so
//! a queue can ring it from the GPU too — which makes the firmware look at the wptrs of that
//! engine's unmapped queues.
//!
//! The kernel maps the doorbell into the client at a CPU virtual address it can *rotate*: while
//! connected the address shows the BAR page, while disconnected it shows a dummy page where
//! writes have no effect (spec 000 "Residency model"). The kernel publishes the connection state
//! in the doorbell status word, which the client reads after every ring (spec 000 work
//! submission pseudocode).

/// Bytes per doorbell.
pub const DOORBELL_BYTES: u64 = 8;
/// Bytes per doorbell page.
pub const DOORBELL_PAGE_BYTES: u64 = 4096;
/// Doorbells per page.
pub const DOORBELLS_PER_PAGE: u32 = (DOORBELL_PAGE_BYTES / DOORBELL_BYTES) as u32;

const _: () = assert!(DOORBELLS_PER_PAGE == 512);

/// The doorbell BAR: pages of [`DOORBELLS_PER_PAGE`] 64-bit doorbells. The one place that
/// turns a doorbell index or a page into an address.
#[derive(Clone, Debug)]
pub struct DoorbellBar {
    shm: std::sync::Arc<shm::Shm>,
}

impl DoorbellBar {
    /// A BAR over `shm` (a whole number of pages).
    pub fn new(shm: std::sync::Arc<shm::Shm>) -> DoorbellBar {
        DoorbellBar { shm }
    }
    /// The memory behind it.
    pub fn shm(&self) -> &std::sync::Arc<shm::Shm> {
        &self.shm
    }
    /// Doorbell pages.
    pub fn pages(&self) -> u32 {
        (self.shm.len() as u64 / DOORBELL_PAGE_BYTES) as u32
    }
    /// Doorbells.
    pub fn doorbells(&self) -> u32 {
        (self.shm.len() as u64 / DOORBELL_BYTES) as u32
    }
    /// Byte offset of page `page` (what a CPU VA rotation maps).
    pub fn page_offset(&self, page: u32) -> u64 {
        page as u64 * DOORBELL_PAGE_BYTES
    }
    /// Doorbell `index` of the BAR (a dedicated doorbell word).
    pub fn doorbell(&self, index: u32) -> Result<shm::Word, shm::ShmError> {
        shm::Word::new(&self.shm, index as u64 * DOORBELL_BYTES)
    }
    /// Word `word` of page `page` (a bit page: global or aggregated doorbells).
    pub fn page_word(&self, page: u32, word: u32) -> Result<shm::Word, shm::ShmError> {
        self.doorbell(page.saturating_mul(DOORBELLS_PER_PAGE).saturating_add(word))
    }
}

/// Spec 000's doorbell models.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DoorbellModel {
    /// One doorbell per queue, from a possibly limited pool (virtualized by victimization).
    #[default]
    Dedicated,
    /// One doorbell for every queue; the value written names the queue.
    Global,
}

impl core::fmt::Display for DoorbellModel {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            DoorbellModel::Dedicated => "dedicated",
            DoorbellModel::Global => "global",
        })
    }
}

/// How a client rings its doorbell word.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RingMethod {
    /// Store the queue's new wptr (dedicated doorbells).
    WriteWptr,
    /// Atomically OR this mask into the word (the global doorbell, and the aggregated one).
    SetBit {
        /// The queue's (or engine's) bit.
        mask: u64,
    },
}

impl RingMethod {
    /// Where queue (or engine) number `id` rings in a bit page: byte offset and method.
    pub const fn bit(id: u32) -> (u64, RingMethod) {
        ((id / 64) as u64 * DOORBELL_BYTES, RingMethod::SetBit { mask: 1 << (id % 64) })
    }
}

/// `D3DDDI_DOORBELL_STATUS`: the value the kernel stores in a doorbell's status word.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u64)]
pub enum DoorbellStatus {
    /// Connected: a ring reaches the firmware.
    Connected = 0,
    /// Connected, but the KMD wants `NotifyWorkSubmission` after each ring.
    ConnectedNotify = 1,
    /// Disconnected (victimized, engine idle, device powered down): reconnect and retry.
    DisconnectedRetry = 2,
    /// Disconnected for good (queue hung, device lost): the queue is lost.
    DisconnectedAbort = 3,
}

impl DoorbellStatus {
    /// Decodes a status word; `None` for a value the kernel never writes.
    pub const fn from_word(w: u64) -> Option<DoorbellStatus> {
        Some(match w {
            0 => DoorbellStatus::Connected,
            1 => DoorbellStatus::ConnectedNotify,
            2 => DoorbellStatus::DisconnectedRetry,
            3 => DoorbellStatus::DisconnectedAbort,
            _ => return None,
        })
    }
    /// Whether a ring reaches the firmware.
    pub const fn is_connected(self) -> bool {
        matches!(self, DoorbellStatus::Connected | DoorbellStatus::ConnectedNotify)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_values_match_the_spec() {
        for (v, s) in [
            (0, DoorbellStatus::Connected),
            (1, DoorbellStatus::ConnectedNotify),
            (2, DoorbellStatus::DisconnectedRetry),
            (3, DoorbellStatus::DisconnectedAbort),
        ] {
            assert_eq!(s as u64, v);
            assert_eq!(DoorbellStatus::from_word(v), Some(s));
        }
        assert_eq!(DoorbellStatus::from_word(4), None);
    }

    #[test]
    fn a_bit_page_names_every_id_once() {
        assert_eq!(RingMethod::bit(0), (0, RingMethod::SetBit { mask: 1 }));
        assert_eq!(RingMethod::bit(63), (0, RingMethod::SetBit { mask: 1 << 63 }));
        assert_eq!(RingMethod::bit(64), (8, RingMethod::SetBit { mask: 1 }));
        let (off, _) = RingMethod::bit(DOORBELLS_PER_PAGE - 1);
        assert_eq!(off, 7 * DOORBELL_BYTES);
    }
}
