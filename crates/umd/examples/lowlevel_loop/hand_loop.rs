//! Spec 000's submission loop written by hand on [`umd::lowlevel::UserQueue`]: what
//! `umd::Queue` does, minus everything a minimal loop does not need. Shared by the
//! `lowlevel_loop` example and `crates/umd/tests/lowlevel.rs`, which checks it in detail.

use std::sync::atomic::Ordering;
use std::time::Duration;

use umd::lowlevel::{UserQueue, progress_fence_words};
use umd::{CommandBuffer, DoorbellStatus, UmdError};

/// How long a full ring waits for the engine to read.
const T: Option<Duration> = Some(Duration::from_secs(1));

/// The loop's state: the queue, its write pointer, its last progress value, and what the
/// doorbell said.
pub struct HandLoop {
    /// The queue's pieces.
    pub q: UserQueue,
    /// Bytes written to the ring so far (the ring offset is this modulo its size).
    pub wptr: u64,
    /// The last progress value submitted.
    pub value: u64,
    /// `DisconnectedRetry` answered with a connect.
    pub reconnects: u32,
    /// `ConnectedNotify` answered with a notify.
    pub notifies: u32,
    /// The doorbell status each ring returned, in order.
    pub seen: Vec<DoorbellStatus>,
}

impl HandLoop {
    /// A loop on a queue that has submitted nothing yet.
    pub fn new(q: UserQueue) -> HandLoop {
        HandLoop { q, wptr: 0, value: 0, reconnects: 0, notifies: 0, seen: Vec::new() }
    }

    /// Submits `cb` followed by its progress fence; returns the progress value to wait for.
    pub fn submit(&mut self, cb: &CommandBuffer) -> Result<u64, UmdError> {
        // 1. The next progress value, as a PROGRESS_FENCE after the packets.
        let value = self.value + 1;
        let fence = progress_fence_words(value);
        let plan = self.q.ring().plan(self.wptr, (cb.len() + fence.len()) as u64)?;
        // Ring space: never overwrite what the engine has not read.
        while plan.new_wptr - self.q.control().rptr().load(Ordering::Acquire) > self.q.ring().bytes() {
            self.q.wait_progress(self.q.completed() + 1, T)?;
        }
        // 2. Last-queued, before the work is visible.
        self.q.control().last_queued().store(value, Ordering::Release);
        // 3. The packets (wptr is published by the ring below).
        self.q.ring().write(self.wptr, &plan, &[cb.words(), &fence])?;
        self.wptr = plan.new_wptr;
        self.value = value;
        // 4 and 5. Ring, then act on the status.
        loop {
            let status = self.q.ring_doorbell(self.wptr)?;
            self.seen.push(status);
            match status {
                DoorbellStatus::Connected => return Ok(value),
                DoorbellStatus::ConnectedNotify => {
                    self.q.notify()?;
                    self.notifies += 1;
                    return Ok(value);
                }
                DoorbellStatus::DisconnectedRetry => {
                    self.q.connect()?;
                    self.reconnects += 1;
                }
                DoorbellStatus::DisconnectedAbort => return Err(self.q.lost()),
            }
        }
    }
}
