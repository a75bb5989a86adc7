//! Noticing that a client hung up while its primary connection's thread is blocked serving a
//! wait (issue 27): that thread does not read the socket until the wait is decided, and a
//! wait on a `WAIT` packet that never passes is never decided, so without this a client
//! killed mid-wait kept its process, allocations, queues and hardware slots forever.
//!
//! One thread per daemon waits in `epoll` on the primary connections whose threads are inside
//! a blocking wait. A connection is registered for the wait's duration only
//! ([`HangupWatch::during`]), one-shot, for `EPOLLRDHUP` (and `EPOLLHUP`, always reported).
//! There is no window in which a hang-up can be missed: `epoll_ctl(ADD)` checks readiness as
//! it registers, so a peer that hung up before the registration is reported at once. Outside
//! waits the connection's own thread sees the hang-up in its next read, as before.
//!
//! On a hang-up the watch ends the client abnormally (spec 000 "abnormal termination"), which
//! is what the primary connection ending means ("a client's resources return when its primary
//! connection ends"): the device is marked in error, so the blocked wait returns `DeviceLost`
//! and the connection's thread finds the socket closed and leaves. A client's thread blocked
//! in a wait cannot close its own socket, so a hang-up here is the process's end (or a client
//! that broke the protocol, which ends the same way).

use std::collections::HashMap;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use rustix::event::epoll;
use tracing::info;

use crate::{Client, Shared, end_client};

/// The `epoll` data word of the stop event (registrations count up from 0).
const STOP: u64 = u64::MAX;

/// The registered connections and the thread that watches them.
pub(crate) struct HangupWatch {
    epoll: OwnedFd,
    /// Written once to stop the watching thread.
    stop: OwnedFd,
    /// Registration id → the client it belongs to.
    watched: Mutex<HashMap<u64, Weak<Client>>>,
    next: AtomicU64,
}

/// Deregisters its connection when dropped (after the wait, however it ended).
pub(crate) struct Watched<'a> {
    watch: &'a HangupWatch,
    fd: BorrowedFd<'a>,
    id: u64,
}

impl Drop for Watched<'_> {
    fn drop(&mut self) {
        // Also after the one-shot fired: the registration stays, disabled, until deleted.
        let _ = epoll::delete(&self.watch.epoll, self.fd);
        self.watch.watched.lock().remove(&self.id);
    }
}

impl HangupWatch {
    pub(crate) fn new() -> std::io::Result<HangupWatch> {
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        let stop = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC)?;
        epoll::add(&epoll, &stop, epoll::EventData::new_u64(STOP), epoll::EventFlags::IN)?;
        Ok(HangupWatch { epoll, stop, watched: Mutex::new(HashMap::new()), next: AtomicU64::new(0) })
    }

    /// Watches `fd` (a primary connection of `client`) until the returned guard drops. If the
    /// registration fails (the kernel is out of memory for it), the wait goes on unwatched, as
    /// before this existed; that is logged.
    pub(crate) fn during<'a>(&'a self, fd: BorrowedFd<'a>, client: &Arc<Client>) -> Option<Watched<'a>> {
        // Relaxed: a unique id is all that is needed; the map's lock orders the rest.
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.watched.lock().insert(id, Arc::downgrade(client));
        let flags = epoll::EventFlags::RDHUP | epoll::EventFlags::HUP | epoll::EventFlags::ONESHOT;
        match epoll::add(&self.epoll, fd, epoll::EventData::new_u64(id), flags) {
            Ok(()) => Some(Watched { watch: self, fd, id }),
            Err(e) => {
                self.watched.lock().remove(&id);
                tracing::warn!(pid = %client.pid, error = %e, "cannot watch the connection for a hang-up");
                None
            }
        }
    }

    /// Makes [`run`](Self::run) return.
    pub(crate) fn stop(&self) {
        let _ = rustix::io::write(&self.stop, &1u64.to_ne_bytes());
    }

    /// The watching thread's body: ends each client whose connection hangs up while watched,
    /// until [`stop`](Self::stop) or the daemon is gone.
    pub(crate) fn run(watch: Arc<HangupWatch>, shared: Weak<Shared>) {
        let mut events = Vec::with_capacity(16);
        loop {
            events.clear();
            match epoll::wait(&watch.epoll, rustix::buffer::spare_capacity(&mut events), None) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => {
                    tracing::error!(error = %e, "epoll_wait failed: hang-ups during waits go unnoticed");
                    return;
                }
            }
            let Some(s) = shared.upgrade() else { return };
            for ev in &events {
                let id = ev.data.u64();
                if id == STOP {
                    return;
                }
                let client = watch.watched.lock().get(&id).and_then(Weak::upgrade);
                if let Some(c) = client {
                    info!(pid = %c.pid, os_pid = c.os_pid, "client hung up while blocked in a wait: abnormal termination");
                    end_client(&s, &c, kernel::Termination::Abnormal);
                }
            }
        }
    }
}
