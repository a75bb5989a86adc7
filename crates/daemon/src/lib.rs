//! # daemon — the kernel and the virtual GPU in a process of their own
//!
//! Roadmap item 6: `doorbell serve` hosts one [`kernel::System`] on the live driver and serves
//! client processes over a Unix socket (format and transport: crate `wire`). This is spec
//! 000's picture with real processes: an application (here a `umd::Device` opened with
//! `wire::client`) reaches the kernel only through "system calls" (the socket), and the
//! GPU only through memory it was given (descriptors passed with `SCM_RIGHTS`).
//!
//! ## Process model
//!
//! - One [`HelloKind::Open`] connection = one client process = one kernel process
//!   (`System::open_process`). The client may open further [`HelloKind::Attach`] connections
//!   to the same process (one per thread that blocks in a wait), proved by a random token.
//! - Each connection has a thread here, which decodes a [`Request`], calls the process's
//!   [`KernelPort`] and answers with the typed result and the descriptors it hands out.
//! - The primary connection closing without [`Request::Goodbye`] (exit, crash, SIGKILL) ends
//!   the process with spec 000's abnormal termination; `Goodbye` gives the normal one. Either
//!   way the kernel gets every slot, doorbell, allocation and fence back, the attached
//!   connections are shut, and the exported doorbell pages are withdrawn.
//! - A malformed, truncated or oversized frame ends that connection only (logged); if it is
//!   a primary, its process ends abnormally, as a crash would.
//!
//! ## Doorbell pages across processes
//!
//! A client cannot be handed the doorbell BAR's descriptor: it holds every process's
//! doorbells. Instead, the first time one of a process's doorbells is connected on a BAR
//! page, the daemon makes that page of its own BAR mapping show a fresh memfd page
//! ([`shm::PageAlias`]) and gives the client that memfd. The firmware reads the same
//! addresses as before, now backed by the client's page. When the process ends, the alias is
//! dropped first: the BAR page shows its own backing again and whatever the client (dead or
//! not) writes into its memfd reaches no engine. This is spec 000's rotation to the dummy
//! page done on the daemon's side, which does not depend on the client's cooperation. While
//! the process lives, a disconnected doorbell reaches no engine because the firmware has
//! unbound it (its writes are ignored until a connect rebinds it, which resets the word).
//! With a doorbell pool, pool pages hold several processes' doorbells; such a page is shared
//! by the processes bound to it (documented limit).
//!
//! ## Wake words
//!
//! A client thread blocked in a wait sleeps on a futex, not in a read of its socket: each
//! connection that asks ([`Request::WakeWord`]) gets a 32-bit word in its process's wake page
//! (one memfd page per client process, sent read-only). The connection's `WakeSlot` is the
//! [`std::task::Waker`] its waits carry into the kernel (`ProcessPort::wait_*_waking`): when
//! the kernel decides the wait, whichever thread acts on the decision bumps the word and
//! `FUTEX_WAKE`s it, and the connection's thread does so again after sending the answer.
//! The client can neither write the page nor make the daemon do more than one wake per wait
//! it asked for. The protocol, and why no wake-up is lost, is in `abi::protocol`.
//!
//! ## Limits
//!
//! Per process ([`wire::Limits`]): live allocations (and native fences), their bytes, and
//! queues. Past them a call is refused with [`KernelError::Exhausted`] naming the limit.
//!
//! ## Invariants
//!
//! - Nothing a client sends can panic the daemon: every frame is checked by `wire`, every
//!   handle by the kernel's object tables (a forged handle is `BadHandle`).
//! - A client's resources return when its primary connection ends, whatever it sent, and
//!   whatever its thread was doing: while that thread is blocked serving a wait, the
//!   connection is watched for a hang-up (`hangup.rs`).
#![forbid(unsafe_code)]

use std::collections::{HashMap, HashSet};
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use abi::port::{AllocationDesc, DoorbellInfo, HwQueueInfo, KernelError, KernelPort, NativeFenceInfo, SubmissionMode};
use abi::queue::DOORBELL_INDEX_ANY;
use abi::{AllocationHandle, ContextHandle, DeviceHandle, HwQueueHandle, ProcessId};
use kernel::{ProcessPort, System, Termination};
use parking_lot::Mutex;
use shm::{PageAlias, RotatingPage, Shm};
use tracing::{debug, info, warn};
use wire::{
    Channel, HandshakeError, Hello, HelloKind, HelloPrefix, Limits, Listener, MAGIC, PROTOCOL_VERSION, Reply, Request,
    Response, Welcome, WireDoorbellInfo, WireError, WireHwQueueInfo, WireMapping, WireNativeFenceInfo, WirePage,
};

mod config;
mod hangup;
mod socket;
mod status;

pub use config::{ConfigError, DaemonConfig};
pub use socket::{MAX_SOCKET_PATH_BYTES, SocketError, check_socket_path, default_socket_path, prepare_socket};

/// How long a new connection may take to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Attached connections a client process may hold besides its primary one.
const MAX_ATTACHED: usize = 64;

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The socket.
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// The system.
    #[error("starting the system: {0}")]
    Kernel(#[from] KernelError),
    /// The transport.
    #[error("socket: {0}")]
    Wire(#[from] WireError),
}

/// What one client process holds, as the daemon counts it (for limits and status).
#[derive(Default)]
struct Ledger {
    /// Allocation -> (device, bytes).
    allocations: HashMap<AllocationHandle, (DeviceHandle, u64)>,
    /// Native fences (count toward the allocation limit).
    fences: HashMap<abi::NativeFenceHandle, DeviceHandle>,
    /// Context -> device.
    contexts: HashMap<ContextHandle, DeviceHandle>,
    /// Queue -> what status shows.
    queues: HashMap<HwQueueHandle, QueueMeta>,
    /// Devices.
    devices: HashSet<DeviceHandle>,
}

#[derive(Clone)]
struct QueueMeta {
    context: ContextHandle,
    engine: abi::EngineId,
    /// A user-mode queue (it has a doorbell), not a kernel-mode one.
    user_mode: bool,
    /// Its doorbell's index in its page, once known: the one the descriptor chose, or the
    /// kernel's choice when the doorbell is created.
    doorbell: Option<u32>,
    priority: abi::Priority,
    /// The daemon-side doorbell CPU page (which BAR page the doorbell is on).
    page: Option<Arc<RotatingPage>>,
}

impl Ledger {
    /// Refuses one more object (allocation or fence) past the process's limit.
    fn check_objects(&self, limits: &Limits) -> Result<(), KernelError> {
        if self.objects() >= limits.allocations as usize {
            return Err(limit("allocations (per-process limit)", self.objects() as u64, limits.allocations as u64));
        }
        Ok(())
    }
    fn bytes(&self) -> u64 {
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

/// One client process.
struct Client {
    port: Arc<ProcessPort>,
    pid: ProcessId,
    os_pid: u32,
    name: String,
    token: [u8; 16],
    ledger: Mutex<Ledger>,
    /// Attached connections, shut down when the process ends.
    attached: Mutex<Vec<Arc<Channel>>>,
    ended: AtomicBool,
    /// The process's wake page, made on the first [`Request::WakeWord`].
    wake: Mutex<Option<WakePage>>,
}

/// A client process's wake page: one 32-bit futex word per connection that asked for one
/// ([`Request::WakeWord`]), each on its own 32 bytes; the client maps the page read-only.
struct WakePage {
    page: Arc<Shm>,
    /// Which slots are taken.
    used: u128,
}

/// Bytes between two wake words: 128 slots in a page, for at most `MAX_ATTACHED + 1`
/// connections.
const WAKE_STRIDE: u64 = 32;
const _: () = assert!((MAX_ATTACHED as u64 + 1) * WAKE_STRIDE <= shm::PAGE_SIZE as u64 && MAX_ATTACHED < 128);

/// One connection's wake word: the [`std::task::Waker`] the kernel wakes when a wait of this
/// connection is decided (and the connection's thread once more after the answer is sent).
struct WakeSlot {
    futex: shm::Futex,
}

impl std::task::Wake for WakeSlot {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    /// Bump, then `FUTEX_WAKE` (abi::protocol's wake-word protocol).
    fn wake_by_ref(self: &Arc<Self>) {
        abi::protocol::bump_wake_word(&self.futex);
        self.futex.wake_all();
    }
}

/// What a connection holds besides its socket.
#[derive(Default)]
struct Conn {
    /// Its wake word: slot and waker.
    wake: Option<(u32, std::task::Waker)>,
}

impl Conn {
    fn waker(&self) -> Option<&std::task::Waker> {
        self.wake.as_ref().map(|w| &w.1)
    }

    /// Gives this connection a wake word (once): its slot's byte offset.
    fn take_wake_word(&mut self, client: &Client) -> Result<u64, KernelError> {
        if let Some((slot, _)) = &self.wake {
            return Ok(u64::from(*slot) * WAKE_STRIDE);
        }
        let mut wake = client.wake.lock();
        if wake.is_none() {
            *wake = Some(WakePage { page: Shm::new("doorbell-wake", shm::PAGE_SIZE)?, used: 0 });
        }
        let w = wake.as_mut().expect("made above");
        let slot = (!w.used).trailing_zeros();
        if slot as u64 * WAKE_STRIDE >= shm::PAGE_SIZE as u64 {
            return Err(limit("wake words (connections per process)", w.used.count_ones() as u64, 128));
        }
        let futex = shm::Futex::new(&w.page, u64::from(slot) * WAKE_STRIDE)?;
        w.used |= 1 << slot;
        self.wake = Some((slot, std::task::Waker::from(Arc::new(WakeSlot { futex }))));
        Ok(u64::from(slot) * WAKE_STRIDE)
    }

    /// Gives the slot back (the connection ended).
    fn release(&mut self, client: &Client) {
        if let Some((slot, _)) = self.wake.take()
            && let Some(w) = client.wake.lock().as_mut()
        {
            w.used &= !(1 << slot);
        }
    }
}

/// A BAR page shown to clients through a memfd of its own.
struct Export {
    alias: PageAlias,
    users: HashSet<ProcessId>,
}

struct Shared {
    sys: System,
    config: DaemonConfig,
    socket: PathBuf,
    bar: Arc<Shm>,
    started: Instant,
    device_epoch_ns: u64,
    clients: Mutex<HashMap<ProcessId, Arc<Client>>>,
    exports: Mutex<HashMap<u64, Export>>,
    /// Every live connection (to shut them all down on stop).
    conns: Mutex<Vec<std::sync::Weak<Channel>>>,
    stopping: AtomicBool,
    /// Primary connections blocked in a wait, watched for a hang-up (`hangup.rs`).
    hangups: Arc<hangup::HangupWatch>,
}

/// A running daemon: a bound socket and the system behind it.
pub struct Daemon {
    shared: Arc<Shared>,
    listener: Arc<Listener>,
    _lock: socket::SocketLock,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.shared.hangups.stop();
    }
}

/// Stops a [`Daemon`] from another thread (a signal handler thread, a test).
#[derive(Clone)]
pub struct Stopper {
    shared: Arc<Shared>,
    listener: Arc<Listener>,
}

impl Stopper {
    /// Makes [`Daemon::run`] return after ending every client with device lost.
    pub fn stop(&self) {
        // SeqCst: a plain flag read by the accept loop after accept fails; no data rides on it.
        self.shared.stopping.store(true, Ordering::SeqCst);
        self.listener.shutdown();
    }
}

fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// `CLOCK_MONOTONIC` at device time 0: the device clock read between two monotonic reads, the
/// tightest bracket of a hundred tries (a preemption between the reads would skew it).
fn device_epoch(sys: &System) -> u64 {
    let mut best = (u64::MAX, 0);
    for _ in 0..100 {
        let before = monotonic_ns();
        let device = sys.now().as_nanos();
        let after = monotonic_ns();
        let width = after.saturating_sub(before);
        if width < best.0 {
            best = (width, (before / 2 + after / 2).saturating_sub(device));
        }
    }
    best.1
}

fn random_token() -> [u8; 16] {
    let mut t = [0u8; 16];
    let mut filled = 0;
    while filled < t.len() {
        match rustix::rand::getrandom(&mut t[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => {
                // No entropy source: fall back to the clock and address-space layout, which
                // still differs per process and per call.
                let x = monotonic_ns() ^ (&t as *const _ as u64).rotate_left(17);
                t[..8].copy_from_slice(&x.to_le_bytes());
                t[8..].copy_from_slice(&x.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes());
                break;
            }
        }
    }
    t
}

impl Daemon {
    /// Prepares the socket at `path` (refusing if another daemon owns it, removing a stale
    /// one), starts the system and listens.
    pub fn bind(path: &Path, config: DaemonConfig) -> Result<Daemon, ServeError> {
        let lock = prepare_socket(path)?;
        let sys = System::live(config.system.clone())?;
        let listener = Arc::new(Listener::bind(path)?);
        socket::restrict(path)?;
        let bar = sys.with_gpu(|g| g.bar().clone());
        let device_epoch_ns = device_epoch(&sys);
        info!(socket = %path.display(), "doorbell daemon listening");
        let shared = Arc::new(Shared {
            sys,
            config,
            socket: path.to_owned(),
            bar,
            started: Instant::now(),
            device_epoch_ns,
            clients: Mutex::new(HashMap::new()),
            exports: Mutex::new(HashMap::new()),
            conns: Mutex::new(Vec::new()),
            stopping: AtomicBool::new(false),
            hangups: Arc::new(
                hangup::HangupWatch::new()
                    .map_err(|e| KernelError::Exhausted { what: "epoll", detail: e.to_string() })?,
            ),
        });
        let (watch, weak) = (shared.hangups.clone(), Arc::downgrade(&shared));
        std::thread::Builder::new()
            .name("doorbell-hangups".into())
            .spawn(move || hangup::HangupWatch::run(watch, weak))
            .map_err(|e| KernelError::Exhausted { what: "threads", detail: e.to_string() })?;
        Ok(Daemon { shared, listener, _lock: lock })
    }

    /// A handle that stops [`run`](Self::run).
    pub fn stopper(&self) -> Stopper {
        Stopper { shared: self.shared.clone(), listener: self.listener.clone() }
    }

    /// The hosted system (for in-process tests and tools).
    pub fn system(&self) -> &System {
        &self.shared.sys
    }

    /// Serves until stopped: one thread per connection. On stop every client's devices are
    /// lost (their fences always signalled, doorbells `DisconnectedAbort`), every connection is
    /// shut, every process ends abnormally, and the socket file is removed.
    pub fn run(self) -> Result<(), ServeError> {
        let mut threads = Vec::new();
        loop {
            let chan = match self.listener.accept() {
                Ok(c) => Arc::new(c),
                Err(e) => {
                    // SeqCst: pairs with the store in `Stopper::stop`.
                    if self.shared.stopping.load(Ordering::SeqCst) {
                        break;
                    }
                    warn!(error = %e, "accept failed");
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            let shared = self.shared.clone();
            {
                let mut conns = shared.conns.lock();
                conns.retain(|w| w.strong_count() > 0);
                conns.push(Arc::downgrade(&chan));
            }
            threads.retain(|t: &std::thread::JoinHandle<()>| !t.is_finished());
            let t = std::thread::Builder::new()
                .name("doorbell-conn".into())
                .spawn(move || serve_connection(&shared, chan))
                .map_err(|e| KernelError::Exhausted { what: "threads", detail: e.to_string() })?;
            threads.push(t);
        }
        info!("stopping: every client's device is lost");
        let clients: Vec<_> = self.shared.clients.lock().values().cloned().collect();
        for c in &clients {
            let devices: Vec<_> = c.ledger.lock().devices.iter().copied().collect();
            for d in devices {
                let _ = self.shared.sys.mark_device_error(c.pid, d);
            }
        }
        for w in self.shared.conns.lock().iter() {
            if let Some(c) = w.upgrade() {
                c.shutdown();
            }
        }
        for t in threads {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.shared.socket);
        info!("stopped");
        Ok(())
    }
}

/// Serves one connection until it ends.
fn serve_connection(shared: &Arc<Shared>, chan: Arc<Channel>) {
    let peer = rustix::net::sockopt::socket_peercred(chan.fd()).map(|c| c.pid.as_raw_nonzero().get() as u32);
    let os_pid = peer.unwrap_or(0);
    let (client, primary) = match handshake(shared, &chan, os_pid) {
        Ok(Some(x)) => x,
        Ok(None) => {
            observe(shared, &chan);
            return;
        }
        Err(why) => {
            info!(os_pid, %why, "handshake refused");
            return;
        }
    };
    let pid = client.pid;
    let mut conn = Conn::default();
    let orderly = loop {
        let (req, fds) = match chan.recv::<Request>("request") {
            Ok(x) => x,
            Err(WireError::Closed) => break false,
            Err(e) => {
                warn!(%pid, os_pid, error = %e, "bad frame: ending the connection");
                break false;
            }
        };
        if !fds.is_empty() {
            warn!(%pid, os_pid, "a request carried descriptors: ending the connection");
            break false;
        }
        if req == Request::Goodbye {
            if primary {
                end_client(shared, &client, Termination::Normal);
            }
            let _ = chan.send(&Response::Ok(Reply::Unit), &[]);
            break true;
        }
        let wait = matches!(req, Request::WaitProgress(..) | Request::WaitNativeFences(..));
        // This thread reads no socket until the wait is decided: a hang-up meanwhile is the
        // watch's to notice (`hangup.rs`).
        let watched = if wait && primary { shared.hangups.during(chan.fd(), &client) } else { None };
        let (resp, keep) = handle(shared, &client, &mut conn, req);
        drop(watched);
        let fds: Vec<BorrowedFd<'_>> = keep.iter().map(|k| k.fd()).collect();
        if let Err(e) = chan.send(&resp, &fds) {
            debug!(%pid, error = %e, "reply not delivered");
            break false;
        }
        // A client sleeping on its wake word rather than in a read: the answer is there.
        if wait && let Some(w) = conn.waker() {
            w.wake_by_ref();
        }
    };
    conn.release(&client);
    if primary && !orderly {
        info!(%pid, os_pid, "client gone: abnormal termination");
        end_client(shared, &client, Termination::Abnormal);
    }
}

/// Reads the hello and answers it: `Some((client, primary))`, or `None` for an observer.
fn handshake(shared: &Arc<Shared>, chan: &Arc<Channel>, os_pid: u32) -> Result<Option<(Arc<Client>, bool)>, String> {
    // A peer that connects and says nothing does not keep a thread forever.
    chan.set_recv_timeout(Some(HELLO_TIMEOUT)).map_err(|e| e.to_string())?;
    let (payload, _fds) = chan.recv_frame().map_err(|e| e.to_string())?;
    chan.set_recv_timeout(None).map_err(|e| e.to_string())?;
    let refuse = |e: HandshakeError| {
        let _ = chan.send(&Welcome::Refused(e.clone()), &[]);
        Err(e.to_string())
    };
    let Some(HelloPrefix { magic, version }) = HelloPrefix::parse(&payload) else {
        return refuse(HandshakeError::BadMagic { found: 0 });
    };
    if magic != MAGIC {
        return refuse(HandshakeError::BadMagic { found: magic });
    }
    if version != PROTOCOL_VERSION {
        return refuse(HandshakeError::VersionMismatch { client: version, daemon: PROTOCOL_VERSION });
    }
    let hello = Hello::decode(&payload).map_err(|e| e.to_string())?;
    let welcome = |process, token| Welcome::Accepted {
        process,
        token,
        device_epoch_ns: shared.device_epoch_ns,
        limits: shared.config.limits,
    };
    match hello.kind {
        HelloKind::Observe => {
            chan.send(&welcome(None, [0; 16]), &[]).map_err(|e| e.to_string())?;
            Ok(None)
        }
        HelloKind::Attach { token } => {
            let client = shared.clients.lock().values().find(|c| c.token == token).cloned();
            let Some(client) = client else { return refuse(HandshakeError::BadToken) };
            {
                // Shut when the process ends, so a thread blocked here does not outlive it.
                let mut attached = client.attached.lock();
                attached.retain(|c| Arc::strong_count(c) > 1);
                if attached.len() >= MAX_ATTACHED {
                    drop(attached);
                    return refuse(HandshakeError::TooManyConnections { max: MAX_ATTACHED + 1 });
                }
                attached.push(chan.clone());
            }
            chan.send(&welcome(Some(client.pid), [0; 16]), &[]).map_err(|e| e.to_string())?;
            Ok(Some((client, false)))
        }
        HelloKind::Open { name, .. } => {
            if shared.clients.lock().len() >= shared.config.max_clients {
                return refuse(HandshakeError::TooManyClients { max: shared.config.max_clients });
            }
            let port = match shared.sys.open_process() {
                Ok(p) => p,
                Err(e) => return refuse(HandshakeError::Kernel(e)),
            };
            let pid = port.process();
            let token = random_token();
            let client = Arc::new(Client {
                port,
                pid,
                os_pid,
                name: name.chars().take(64).collect(),
                token,
                ledger: Mutex::new(Ledger::default()),
                attached: Mutex::new(Vec::new()),
                ended: AtomicBool::new(false),
                wake: Mutex::new(None),
            });
            shared.clients.lock().insert(pid, client.clone());
            info!(%pid, os_pid, name = %client.name, "client process opened");
            if let Err(e) = chan.send(&welcome(Some(pid), token), &[]) {
                // Gone during the handshake (killed, say): it still had a process to end.
                end_client(shared, &client, Termination::Abnormal);
                return Err(e.to_string());
            }
            Ok(Some((client, true)))
        }
    }
}

/// An observer connection: status queries only.
fn observe(shared: &Arc<Shared>, chan: &Channel) {
    while let Ok((req, _)) = chan.recv::<Request>("request") {
        let resp = match req {
            Request::Status => Ok(Reply::Status(Box::new(status::collect(shared)))),
            _ => Err(KernelError::ProcessTerminated(ProcessId(0))),
        };
        if chan.send(&resp, &[]).is_err() {
            break;
        }
    }
}

/// Ends a client process: withdraws its doorbell pages, terminates it, shuts its attached
/// connections.
fn end_client(shared: &Arc<Shared>, client: &Arc<Client>, how: Termination) {
    // SeqCst: one winner between the primary's thread and a stop; no data rides on it.
    if client.ended.swap(true, Ordering::SeqCst) {
        return;
    }
    // Withdraw the doorbell pages first: from here the client's writes reach no engine.
    shared.exports.lock().retain(|_, e| {
        e.users.remove(&client.pid);
        !e.users.is_empty()
    });
    client.port.terminate(how);
    for c in client.attached.lock().drain(..) {
        c.shutdown();
    }
    shared.clients.lock().remove(&client.pid);
    info!(pid = %client.pid, ?how, "client process ended");
}

/// The page a daemon-side doorbell page shows now, exported to `pid`: the memfd that now
/// backs that BAR page.
/// `None` if the page shows the dummy page (the doorbell was disconnected meanwhile).
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

/// What a reply's descriptors borrow from.
enum Keep {
    Mapping(shm::Mapping),
    Shm(Arc<Shm>),
}

impl Keep {
    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Keep::Mapping(m) => m.fd(),
            Keep::Shm(s) => s.fd(),
        }
    }
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

fn limit(what: &'static str, have: u64, limit: u64) -> KernelError {
    KernelError::Exhausted { what, detail: format!("this process holds {have}, its limit is {limit}") }
}

fn wire_fence(info: NativeFenceInfo, keep: &mut Vec<Keep>) -> WireNativeFenceInfo {
    WireNativeFenceInfo {
        handle: info.handle,
        va: info.va,
        cpu: info.cpu.map(|m| wire_mapping(m, keep)),
        offset: info.offset,
        global: info.global,
        kind: info.kind,
        cross_adapter: info.cross_adapter,
    }
}

/// One request of a client process.
fn handle(shared: &Arc<Shared>, client: &Arc<Client>, conn: &mut Conn, req: Request) -> (Response, Vec<Keep>) {
    let port = &client.port;
    let limits: Limits = shared.config.limits;
    let timeout = |ns: Option<u64>| ns.map(Duration::from_nanos);
    let mut keep = Vec::new();
    let resp = (|| -> Response {
        Ok(match req {
            Request::AdapterInfo => Reply::AdapterInfo(port.adapter_info()),
            Request::NativeFenceCaps => Reply::NativeFenceCaps(port.native_fence_caps()?),
            // A page's BAR page stays the process's until it ends (the kernel's rule), so its
            // export, like the first page's, is withdrawn when the client ends.
            Request::CreateDoorbellPage(d) => Reply::DoorbellPage(port.create_doorbell_page(d)?),
            Request::DestroyDoorbellPage(p) => {
                port.destroy_doorbell_page(p)?;
                Reply::Unit
            }
            Request::CreateDevice => {
                let d = port.create_device()?;
                client.ledger.lock().devices.insert(d);
                Reply::Device(d)
            }
            Request::DestroyDevice(d) => {
                port.destroy_device(d)?;
                client.ledger.lock().forget_device(d);
                Reply::Unit
            }
            Request::Allocate(d, desc) => {
                let bytes = desc.bytes.div_ceil(shm::PAGE_SIZE as u64).saturating_mul(shm::PAGE_SIZE as u64);
                {
                    let l = client.ledger.lock();
                    l.check_objects(&limits)?;
                    if l.bytes().saturating_add(bytes) > limits.bytes {
                        return Err(limit("allocation bytes (per-process limit)", l.bytes(), limits.bytes));
                    }
                }
                let info = port.allocate(d, &AllocationDesc { ..desc })?;
                client.ledger.lock().allocations.insert(info.handle, (d, info.bytes));
                Reply::Allocation(info)
            }
            Request::MapAllocation(a) => Reply::Mapping(wire_mapping(port.map_allocation(a)?, &mut keep)),
            Request::Free(a) => {
                port.free(a)?;
                client.ledger.lock().allocations.remove(&a);
                Reply::Unit
            }
            Request::CreateContext(d, e) => {
                let c = port.create_context(d, e)?;
                client.ledger.lock().contexts.insert(c, d);
                Reply::Context(c)
            }
            Request::DestroyContext(c) => {
                port.destroy_context(c)?;
                client.ledger.lock().forget_context(c);
                Reply::Unit
            }
            Request::CreateHwQueue(c, desc) => {
                {
                    let l = client.ledger.lock();
                    if l.queues.len() >= limits.queues as usize {
                        return Err(limit("queues (per-process limit)", l.queues.len() as u64, limits.queues as u64));
                    }
                }
                let HwQueueInfo { handle, engine, kernel_page, kernel_page_va } = port.create_hw_queue(c, &desc)?;
                let (user_mode, doorbell) = match desc.mode {
                    SubmissionMode::UserMode(d) => (true, Some(d.doorbell_index).filter(|&i| i != DOORBELL_INDEX_ANY)),
                    SubmissionMode::KernelMode => (false, None),
                };
                let meta = QueueMeta { context: c, engine, user_mode, doorbell, priority: desc.priority, page: None };
                client.ledger.lock().queues.insert(handle, meta);
                Reply::HwQueue(WireHwQueueInfo {
                    handle,
                    engine,
                    kernel_page: wire_mapping(kernel_page, &mut keep),
                    kernel_page_va,
                })
            }
            Request::DestroyHwQueue(q) => {
                port.destroy_hw_queue(q)?;
                client.ledger.lock().queues.remove(&q);
                Reply::Unit
            }
            Request::CreateDoorbell(args) => {
                let DoorbellInfo { handle, cpu_page, offset, ring, aggregated, gpu_va } =
                    port.create_doorbell(&args)?;
                if let Some(q) = client.ledger.lock().queues.get_mut(&args.queue) {
                    q.page = Some(cpu_page);
                    q.doorbell = u32::try_from(offset / abi::doorbell::DOORBELL_BYTES).ok();
                }
                // The aggregated page is never rotated while the process lives.
                let aggregated_gpu_va = aggregated.as_ref().and_then(|a| a.gpu_va);
                let aggregated = match aggregated {
                    Some(a) => match export_page(shared, client.pid, &a.page)? {
                        Some(memfd) => {
                            keep.push(Keep::Shm(memfd));
                            Some((WirePage { fd: (keep.len() - 1) as u8, file_offset: 0 }, a.offset, a.mask))
                        }
                        None => None,
                    },
                    None => None,
                };
                Reply::Doorbell(WireDoorbellInfo { handle, offset, ring, aggregated, gpu_va, aggregated_gpu_va })
            }
            Request::ConnectDoorbell(q) => {
                port.connect_doorbell(q)?;
                let page = client.ledger.lock().queues.get(&q).and_then(|m| m.page.clone());
                let page = page.ok_or_else(|| KernelError::Exhausted {
                    what: "doorbell page export",
                    detail: format!("{q} has no doorbell page"),
                })?;
                match export_page(shared, client.pid, &page)? {
                    Some(memfd) => {
                        keep.push(Keep::Shm(memfd));
                        Reply::Connected(Some(WirePage { fd: 0, file_offset: 0 }))
                    }
                    None => Reply::Connected(None),
                }
            }
            Request::DestroyDoorbell(d) => {
                port.destroy_doorbell(d)?;
                Reply::Unit
            }
            Request::NotifyWorkSubmission(d) => {
                port.notify_work_submission(d)?;
                Reply::Unit
            }
            Request::SubmitCommand(q, words) => {
                port.submit_command(q, &words)?;
                Reply::Unit
            }
            Request::WaitProgress(q, v, t) => Reply::Wait(port.wait_progress_waking(q, v, timeout(t), conn.waker())?),
            Request::QueryQueue(q) => Reply::QueueStatus(port.query_queue(q)?),
            Request::CreateNativeFence(d, desc) => {
                client.ledger.lock().check_objects(&limits)?;
                let info = port.create_native_fence(d, &desc)?;
                client.ledger.lock().fences.insert(info.handle, d);
                Reply::NativeFence(wire_fence(info, &mut keep))
            }
            Request::OpenNativeFence(d, g) => {
                let info = port.open_native_fence(d, g)?;
                client.ledger.lock().fences.insert(info.handle, d);
                Reply::NativeFence(wire_fence(info, &mut keep))
            }
            Request::OpenCrossAdapterFence(d, h) => {
                let info = port.open_cross_adapter_fence(d, h)?;
                client.ledger.lock().fences.insert(info.handle, d);
                Reply::NativeFence(wire_fence(info, &mut keep))
            }
            Request::DestroyNativeFence(f) => {
                port.destroy_native_fence(f)?;
                client.ledger.lock().fences.remove(&f);
                Reply::Unit
            }
            Request::SignalNativeFence(f, v) => {
                port.signal_native_fence(f, v)?;
                Reply::Unit
            }
            Request::WaitNativeFences(fences, mode, t) => {
                Reply::Wait(port.wait_native_fences_waking(&fences, mode, timeout(t), conn.waker())?)
            }
            Request::QueryNativeFence(f) => Reply::FenceValues(port.query_native_fence(f)?),
            Request::QueryPhysicalDoorbell(q) => Reply::PhysicalDoorbell(port.query_physical_doorbell(q)?),
            Request::Status => Reply::Status(Box::new(status::collect(shared))),
            Request::Goodbye => Reply::Unit,
            Request::UserqSignal(q, point, fences) => {
                port.userq_signal(q, point, &fences)?;
                Reply::Unit
            }
            Request::UserqWait(q, objects) => Reply::WaitPoints(port.userq_wait(q, &objects)?),
            Request::OpenProgressFence(q) => {
                client.ledger.lock().check_objects(&limits)?;
                let info = port.open_progress_fence(q)?;
                let device = client.ledger.lock().devices.iter().next().copied();
                if let Some(d) = device {
                    client.ledger.lock().fences.insert(info.handle, d);
                }
                Reply::NativeFence(wire_fence(info, &mut keep))
            }
            Request::WakeWord => {
                let offset = conn.take_wake_word(client)?;
                let page = client.wake.lock().as_ref().map(|w| w.page.clone()).expect("made by take_wake_word");
                Reply::WakeWord(
                    wire_mapping(page.map_range(0, shm::PAGE_SIZE, shm::Prot::ReadOnly)?, &mut keep),
                    offset,
                )
            }
        })
    })();
    if resp.is_err() {
        keep.clear();
    }
    (resp, keep)
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon").field("socket", &self.shared.socket).finish()
    }
}
