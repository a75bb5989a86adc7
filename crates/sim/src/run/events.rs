//! The clients' events ([`Ev`]: a submission due, an arrival, a timed scenario event, a
//! resume, a kernel call's return) and their queue ([`Events`]), in (time, order of
//! scheduling) order.
//!
//! Invariant: two events of one instant come out in the order they were scheduled, whether
//! they went to the in-order list or to the heap, so a run's order is its seed's alone.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Ev {
    /// A submission of queue `q` due (intended time is the key's time); `Some(ns)`: its
    /// synthetic duration (trace rows).
    Submit(usize, Option<u64>),
    /// The next arrival of an open-loop queue.
    Arrival(usize),
    /// Timed event `i`.
    Timed(usize),
    /// Resume the context of queue `q`.
    Resume(usize),
    /// Queue `q`'s client is out of its kernel call: it submits from its backlog again.
    Drain(usize),
    /// Queue `q`'s kernel-mode submission call returns: the oldest command buffer of its
    /// backlog reaches the kernel.
    Enter(usize),
}

/// The clients' events, in (time, order of scheduling) order, each keyed by one number: its
/// time in the high half, its scheduling order in the low half.
///
/// Most events are scheduled in time order (a closed loop's next submission at each
/// completion, and completions come in time order): those go to the back of a queue, and only
/// the others to a heap. The earlier of the two fronts is the next event, so the order is the
/// same as one heap's, at a fraction of its cost.
pub(super) struct Events {
    /// Events scheduled no earlier than every event already in it, in key order, from
    /// `in_order[head]` on (the ones before `head` are gone).
    in_order: Vec<(u128, Ev)>,
    head: usize,
    heap: BinaryHeap<Reverse<Scheduled>>,
    seq: u64,
    /// The key of the next event (`u128::MAX`: none), the earlier of the two fronts.
    next: u128,
}

impl Default for Events {
    fn default() -> Self {
        Events { in_order: Vec::new(), head: 0, heap: BinaryHeap::new(), seq: 0, next: u128::MAX }
    }
}

/// An event in the heap and its key.
struct Scheduled(u128, Ev);

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.cmp(&other.0)
    }
}

impl Events {
    #[inline(always)]
    pub(super) fn push(&mut self, t: u64, e: Ev) {
        self.seq += 1;
        let key = (t as u128) << 64 | self.seq as u128;
        if self.in_order.len() == self.head || self.in_order.last().is_some_and(|&(last, _)| last <= key) {
            self.in_order.push((key, e));
        } else {
            self.heap.push(Reverse(Scheduled(key, e)));
        }
        self.next = self.next.min(key);
    }

    /// The time of the next event.
    pub(super) fn next_time(&self) -> Option<u64> {
        (self.next != u128::MAX).then_some((self.next >> 64) as u64)
    }

    /// The next event, if it is due at `now`.
    pub(super) fn pop_due(&mut self, now: u64) -> Option<(u64, Ev)> {
        let key = self.next;
        if key == u128::MAX || (key >> 64) as u64 > now {
            return None;
        }
        let e = match self.in_order.get(self.head) {
            Some(&(k, e)) if k == key => {
                self.head += 1;
                if self.head == self.in_order.len() {
                    self.in_order.clear();
                    self.head = 0;
                } else if self.head >= 4096 && 2 * self.head >= self.in_order.len() {
                    // Half of it is gone: move the rest down (each event moves about once).
                    self.in_order.drain(..self.head);
                    self.head = 0;
                }
                Some(e)
            }
            _ => self.heap.pop().map(|Reverse(Scheduled(_, e))| e),
        };
        let a = self.in_order.get(self.head).map_or(u128::MAX, |&(k, _)| k);
        let b = self.heap.peek().map_or(u128::MAX, |Reverse(s)| s.0);
        self.next = a.min(b);
        e.map(|e| ((key >> 64) as u64, e))
    }
}
