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
//! - Each connection has a thread here, which decodes a [`Request`] and answers it with the
//!   typed result and the descriptors it hands out (`calls.rs`). A system call arrives as
//!   the value it is ([`abi::port::Call`]): checked against the process's limits (its ledger,
//!   `ledger.rs`), passed to the process's `ProcessPort::call_waking` (one dispatch, in the
//!   kernel), and its reply translated for the socket (mappings and doorbell pages become
//!   descriptors). Nothing here lists the calls one by one.
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

use abi::ProcessId;
use abi::port::{KernelError, KernelPort};
use kernel::{ProcessPort, System, Termination};
use parking_lot::Mutex;
use shm::{PageAlias, Shm};
use tracing::{debug, info, warn};
use wire::{
    Channel, HandshakeError, Hello, HelloKind, HelloPrefix, Listener, MAGIC, PROTOCOL_VERSION, Reply, Request,
    Response, Welcome, WireError,
};

use ledger::{Ledger, limit};

mod calls;
mod config;
mod hangup;
mod ledger;
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
            let _ = chan.send(&Response::Ok(Reply::Goodbye), &[]);
            break true;
        }
        let wait = matches!(&req, Request::Call(c) if c.is_wait());
        // This thread reads no socket until the wait is decided: a hang-up meanwhile is the
        // watch's to notice (`hangup.rs`).
        let watched = if wait && primary { shared.hangups.during(chan.fd(), &client) } else { None };
        let (resp, keep) = calls::handle(shared, &client, &mut conn, req);
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

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon").field("socket", &self.shared.socket).finish()
    }
}
