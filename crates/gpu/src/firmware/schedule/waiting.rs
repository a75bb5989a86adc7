//! The waiting set: an engine's queues that want a slot and have none, in the scheduler's
//! waiting order (kernel queues, then priority, then whoever ran longest ago, then run-list
//! order), grouped by [`Class`] so a pass looks at one head per class ([`Waiting::next_head`]).
//!
//! Invariant: `heads` holds exactly one key per non-empty class (its first turn), and `groups`
//! counts the classes of each (privilege, priority) group; every insertion and removal bumps
//! `version`.

use abi::Priority;

use crate::Time;
use crate::memory::Vmid;

use crate::firmware::queue::FwQueueId;

/// What the scheduler compares two waiting queues by, other than when they last ran: kernel
/// queues first (`user` false), then higher priority, and the address space, which decides
/// between the gang and the process quantum. Queues of one class are interchangeable for
/// eviction: whether a holder can be evicted for a waiter depends only on the waiter's class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(in crate::firmware) struct Class {
    pub(in crate::firmware) user: bool,
    pub(in crate::firmware) priority: std::cmp::Reverse<Priority>,
    pub(in crate::firmware) vmid: Vmid,
}

/// A waiting queue's turn within its class: whoever ran longest ago first, then run-list order.
pub(in crate::firmware) type Turn = (Time, u64);

/// An engine's waiting queues (see [`super::Seat::should_wait`]), by class, each class in turn
/// order. Walking the class heads in class order merges them into the scheduler's waiting
/// order `(!privileged, Reverse(priority), last_run, run-list order)`. Empty classes are
/// dropped. `heads` keeps every class's first queue in that order, so a pass finds the first
/// waiting queue without walking every class (one per process, thousands of queues apart).
#[derive(Default)]
pub(in crate::firmware) struct Waiting {
    pub(in crate::firmware) by_class: std::collections::BTreeMap<Class, std::collections::BTreeMap<Turn, FwQueueId>>,
    /// `(user, Reverse(priority), head's turn, class)` of every waiting class.
    heads: std::collections::BTreeSet<HeadKey>,
    /// How many classes wait in each (privilege, priority) group, indexed by
    /// [`Waiting::group`]: whether a class other than a holder's own contends with it is a
    /// count, not a walk.
    groups: [u32; 2 * PRIORITIES],
    /// Bumped by every insertion and removal: the set is the same as when it was last read
    /// while this stands ([`super::pass::Settled`]).
    pub(in crate::firmware) version: u64,
}

/// Priority levels.
const PRIORITIES: usize = Priority::Realtime as usize + 1;

/// Where a class's head stands in waiting order: `(user, Reverse(priority), turn, class)`.
pub(in crate::firmware) type HeadKey = (bool, std::cmp::Reverse<Priority>, Turn, Class);

impl Waiting {
    fn head_key(class: Class, turn: Turn) -> HeadKey {
        (class.user, class.priority, turn, class)
    }

    /// The index of `class`'s (privilege, priority) group in `groups`.
    fn group(class: Class) -> usize {
        class.user as usize * PRIORITIES + class.priority.0 as usize
    }

    /// How many classes of `class`'s (privilege, priority) group wait.
    pub(in crate::firmware) fn classes_in_group(&self, class: Class) -> u32 {
        self.groups[Self::group(class)]
    }

    pub(in crate::firmware) fn insert(&mut self, class: Class, turn: Turn, id: FwQueueId) {
        self.version = self.version.wrapping_add(1);
        let queues = self.by_class.entry(class).or_default();
        if queues.is_empty() {
            self.groups[Self::group(class)] += 1;
        }
        let before = queues.first_key_value().map(|(t, _)| *t);
        let old = queues.insert(turn, id);
        debug_assert!(old.is_none(), "{id} waits twice, or two queues share a turn");
        let after = queues.first_key_value().map(|(t, _)| *t);
        self.move_head(class, before, after);
    }

    pub(in crate::firmware) fn remove(&mut self, class: Class, turn: Turn, id: FwQueueId) {
        self.version = self.version.wrapping_add(1);
        let Some(queues) = self.by_class.get_mut(&class) else {
            debug_assert!(false, "{id} is not waiting");
            return;
        };
        let before = queues.first_key_value().map(|(t, _)| *t);
        let old = queues.remove(&turn);
        debug_assert_eq!(old, Some(id), "{id} waits under another turn");
        let after = queues.first_key_value().map(|(t, _)| *t);
        if queues.is_empty() {
            self.by_class.remove(&class);
            self.groups[Self::group(class)] -= 1;
        }
        self.move_head(class, before, after);
    }

    /// Keeps `heads` right after `class`'s first turn went from `before` to `after`.
    fn move_head(&mut self, class: Class, before: Option<Turn>, after: Option<Turn>) {
        if before == after {
            return;
        }
        if let Some(t) = before {
            self.heads.remove(&Self::head_key(class, t));
        }
        if let Some(t) = after {
            self.heads.insert(Self::head_key(class, t));
        }
    }

    pub(in crate::firmware) fn is_empty(&self) -> bool {
        self.by_class.is_empty()
    }

    /// Panics unless `heads` and `groups` agree with `by_class` (tests).
    #[cfg(test)]
    pub(super) fn check(&self) {
        let mut groups = [0; 2 * PRIORITIES];
        for (&class, queues) in &self.by_class {
            groups[Self::group(class)] += 1;
            let (&turn, _) = queues.first_key_value().expect("no empty class");
            assert!(self.heads.contains(&Self::head_key(class, turn)), "{class:?}'s head");
        }
        assert_eq!(groups, self.groups, "classes per group");
        assert_eq!(self.heads.len(), self.by_class.len(), "one head per class");
    }

    /// The greatest head key a class of `class`'s (privilege, priority) can have: a walk
    /// that resumes after it has passed every class of that group.
    pub(in crate::firmware) fn last_of_group(class: Class) -> HeadKey {
        let last = Class { vmid: Vmid(u32::MAX), ..class };
        (class.user, class.priority, (Time(u64::MAX), u64::MAX), last)
    }

    /// The first class head after `after` (from the start for `None`), with its class and
    /// queue: heads are in (privilege, priority, turn) order, so within the first (privilege,
    /// priority) group that has one, it has the earliest turn. A pass walks the heads with it
    /// once, in order: a class it maps a queue of gets a later head (its next turn), which
    /// the walk meets again further on; a class it leaves alone keeps its head behind the walk.
    pub(in crate::firmware) fn next_head(&self, after: Option<HeadKey>) -> Option<(HeadKey, Class, FwQueueId)> {
        use std::ops::Bound::{Excluded, Unbounded};
        let &key = match after {
            None => self.heads.first(),
            Some(after) => self.heads.range((Excluded(after), Unbounded)).next(),
        }?;
        let (_, _, turn, class) = key;
        let id = *self.by_class.get(&class)?.get(&turn)?;
        Some((key, class, id))
    }
}
