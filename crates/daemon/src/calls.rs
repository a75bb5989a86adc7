//! One request of a client process, answered: the daemon's one dispatch.
//!
//! A [`Request::Call`] is the client's system call as data ([`abi::port::Call`]). The daemon
//! checks it against the process's limits ([`Ledger::admit`](crate::ledger::Ledger::admit)),
//! hands it to the process's `ProcessPort` (with the connection's waker, for a blocking wait),
//! notes what it created or destroyed, and translates the kernel's in-process reply into the
//! socket's ([`ToWire`]): each mapping it hands out becomes a descriptor attached to the
//! answer, and a doorbell page the BAR page's exported memfd (see the crate docs, "Doorbell
//! pages across processes"). The connection's own messages (adapter info, status, goodbye,
//! the wake word) are answered here too.

use std::collections::HashSet;
use std::os::fd::BorrowedFd;
use std::sync::Arc;

use abi::port::{Call, KernelError, KernelPort, Local, Translate};
use abi::{HwQueueHandle, ProcessId};
use shm::{RotatingPage, Shm};
use wire::{Fds, Reply, Request, Response, WireMapping, WirePage};

use crate::{Client, Conn, Export, Shared, status};

/// What a reply's descriptors borrow from.
pub(crate) enum Keep {
    Mapping(shm::Mapping),
    Shm(Arc<Shm>),
}

impl Keep {
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Keep::Mapping(m) => m.fd(),
            Keep::Shm(s) => s.fd(),
        }
    }
}

/// One request of a client process: its answer and the descriptors to attach.
pub(crate) fn handle(
    shared: &Arc<Shared>,
    client: &Arc<Client>,
    conn: &mut Conn,
    req: Request<'_>,
) -> (Response, Vec<Keep>) {
    let mut keep = Vec::new();
    let resp = match req {
        Request::Call(call) => serve(shared, client, conn, &call, &mut keep),
        Request::AdapterInfo => Ok(Reply::AdapterInfo(client.port.adapter_info())),
        Request::Status => Ok(Reply::Status(Box::new(status::collect(shared)))),
        Request::Goodbye => Ok(Reply::Goodbye),
        Request::WakeWord => wake_word(client, conn, &mut keep),
    };
    if resp.is_err() {
        keep.clear();
    }
    (resp, keep)
}

/// A system call: admitted, made, recorded, translated.
fn serve(
    shared: &Arc<Shared>,
    client: &Arc<Client>,
    conn: &Conn,
    call: &Call<'_>,
    keep: &mut Vec<Keep>,
) -> Result<Reply, KernelError> {
    client.ledger.lock().admit(call, &shared.config.limits)?;
    let reply = client.port.call_waking(call, conn.waker())?;
    client.ledger.lock().record(call, &reply);
    let mut out = ToWire { shared, client, call, keep };
    Ok(Reply::Call(reply.translate(&mut out)?))
}

/// The connection's wake word: the process's wake page, read-only, and the word's offset.
fn wake_word(client: &Client, conn: &mut Conn, keep: &mut Vec<Keep>) -> Result<Reply, KernelError> {
    let offset = conn.take_wake_word(client)?;
    let page = client.wake.lock().as_ref().map(|w| w.page.clone()).expect("made by take_wake_word");
    Ok(Reply::WakeWord(wire_mapping(page.map_range(0, shm::PAGE_SIZE, shm::Prot::ReadOnly)?, keep), offset))
}

fn wire_mapping(m: shm::Mapping, keep: &mut Vec<Keep>) -> WireMapping {
    let w = WireMapping {
        fd: keep.len() as u8,
        file_offset: m.file_offset(),
        len: m.len() as u64,
        read_only: m.prot() == shm::Prot::ReadOnly,
    };
    keep.push(Keep::Mapping(m));
    w
}

/// Translates the kernel's reply to `call` into the socket's: each mapping a descriptor to
/// attach, each doorbell page the exported memfd of its BAR page.
struct ToWire<'a, 'c> {
    shared: &'a Shared,
    client: &'a Client,
    /// The call answered (a connect names the queue whose page to export).
    call: &'a Call<'c>,
    keep: &'a mut Vec<Keep>,
}

impl ToWire<'_, '_> {
    /// The exported memfd behind `page`, attached: `None` if it shows no BAR page now.
    fn export(&mut self, page: &RotatingPage) -> Result<Option<WirePage>, KernelError> {
        Ok(export_page(self.shared, self.client.pid, page)?.map(|memfd| {
            self.keep.push(Keep::Shm(memfd));
            WirePage { fd: (self.keep.len() - 1) as u8, file_offset: 0 }
        }))
    }
}

impl Translate<Local, Fds> for ToWire<'_, '_> {
    type Error = KernelError;

    fn mapping(&mut self, m: shm::Mapping) -> Result<WireMapping, KernelError> {
        Ok(wire_mapping(m, self.keep))
    }

    /// The page stays here (the ledger keeps it, for the connects); the client makes its own.
    fn doorbell_page(&mut self, _page: Arc<RotatingPage>) -> Result<(), KernelError> {
        Ok(())
    }

    /// The aggregated page is never rotated while the process lives.
    fn aggregated_page(&mut self, page: Arc<RotatingPage>) -> Result<Option<WirePage>, KernelError> {
        self.export(&page)
    }

    /// The page the connected doorbell shows now, exported; `None` if it was disconnected
    /// again meanwhile.
    fn connected(&mut self, (): ()) -> Result<Option<WirePage>, KernelError> {
        let q: HwQueueHandle = match *self.call {
            Call::ConnectDoorbell(q) => q,
            _ => return Err(KernelError::UnexpectedReply { call: self.call.name(), reply: "connected" }),
        };
        let page = self.client.ledger.lock().queues.get(&q).and_then(|m| m.page.clone());
        let page = page.ok_or_else(|| KernelError::Exhausted {
            what: "doorbell page export",
            detail: format!("{q} has no doorbell page"),
        })?;
        self.export(&page)
    }
}

/// The page a daemon-side doorbell page shows now, exported to `pid`: the memfd that now
/// backs that BAR page.
/// `None` if the page shows the dummy page (the doorbell was disconnected meanwhile).
/// A page's BAR page stays the process's until it ends (the kernel's rule), so its export is
/// withdrawn when the client ends.
fn export_page(shared: &Shared, pid: ProcessId, page: &RotatingPage) -> Result<Option<Arc<Shm>>, KernelError> {
    let (id, page_offset) = page.current();
    if id != shared.bar.id() {
        return Ok(None);
    }
    let mut exports = shared.exports.lock();
    if let Some(e) = exports.get_mut(&page_offset) {
        e.users.insert(pid);
        return Ok(Some(e.alias.source().clone()));
    }
    let memfd = Shm::new(&format!("doorbell-page-{}", page_offset / shm::PAGE_SIZE as u64), shm::PAGE_SIZE)?;
    let alias = shared.bar.alias_page(page_offset, memfd.clone())?;
    exports.insert(page_offset, Export { alias, users: HashSet::from([pid]) });
    Ok(Some(memfd))
}
