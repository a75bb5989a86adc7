//! Doorbells and their status word.
//!
//! A doorbell is one 64-bit word in the device's doorbell BAR. A client rings it by storing the
//! queue's new wptr; the firmware notices the change and fetches work (spec 001 "Writing to the
//! doorbell wakes the firmware"). The BAR is made of 4 KiB pages of 512 doorbells; each client
//! process owns one page, and a queue's doorbell index lies inside it.
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

/// `D3DDDI_DOORBELL_STATUS`: the value the kernel stores in a doorbell's status word.
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
}
