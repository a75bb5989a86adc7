//! The daemon's client: the kernel port of a client process, [`KernelPort`] over the
//! daemon's socket.
//!
//! `doorbell serve` runs the kernel and the virtual GPU in a daemon; a client process gets a
//! port with [`connect`] (or [`connect_default`]), opens a `umd::Device` on it
//! (`umd::Device::open`) and has the same API as the embedded mode:
//!
//! ```no_run
//! use umd::{CommandBuffer, Device, EngineKind, QueueOptions};
//!
//! let dev = Device::open(wire::client::connect(std::path::Path::new("/tmp/doorbell.sock"))?)?;
//! let ctx = dev.create_context(dev.engine(EngineKind::Compute)?)?;
//! let mut q = ctx.create_queue(QueueOptions::user_mode())?;
//! let buf = dev.allocate(4096)?;
//! let done = q.submit(CommandBuffer::new().write_u32(buf.va(), 7))?;
//! q.wait(done, None)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`RemotePort`] forwards: its [`KernelPort::call`] sends the [`Call`] as it is
//! ([`Request::Call`], this crate's frames) and answers with the kernel's reply, whose typed
//! [`KernelError`] is the one the kernel returned. Shared memory arrives as descriptors with
//! the reply that hands it out, and is mapped here ([`Translate`] from [`Fds`] to [`Local`]),
//! read-only where the daemon sent a read-only descriptor (the queue's kernel page with the
//! progress fence and doorbell status, fence CurrentValue pages): such a mapping cannot be
//! made writable, not even with `mprotect`, because the descriptor is not. The typed methods
//! (`create_device`, ...) are `KernelPort`'s own, unchanged.
//!
//! The data path never comes here: packets, wptr and the doorbell write go to memory this
//! port mapped once, so a submission on a connected queue makes no system call.
//!
//! # Doorbell pages
//!
//! A doorbell's CPU page is a [`RotatingPage`] of this process: it shows a private dummy page
//! until the daemon connects the doorbell, then the memfd page the daemon handed out for that
//! BAR page, and the dummy page again when the doorbell is destroyed. The daemon does not rely
//! on this (it withdraws the page on its side when the process ends, see the `daemon` crate).
//!
//! # Connections
//!
//! The first connection owns the kernel process: closing it without the orderly goodbye (a
//! crash, SIGKILL) ends the process abnormally. A call made while another thread is inside a
//! call (a blocking wait, say) goes over a further connection attached to the same process
//! by its token, so one thread's wait never holds up another's calls.
//!
//! # Blocking waits: a futex, not a read
//!
//! A blocking wait (what the UMD asks for once its memory spin gives up) is sent like any
//! call, but the client does not then block reading the answer. Each connection has a wake
//! word in a page the daemon writes and this process maps read-only ([`Request::WakeWord`],
//! asked once per connection). The daemon bumps it and `FUTEX_WAKE`s it as soon as the kernel
//! decides the wait (from the thread that handled the interrupt or the signal) and again
//! once the answer is sent. The client reads the word, then checks its condition in memory
//! (the progress value or the fences' CurrentValues it maps anyway) and the socket (without
//! blocking), and sleeps on the word only while it still holds what it read:
//! `abi::protocol::read_wake_word`, model-checked with loom. A wait whose condition shows in
//! memory returns without its answer, one thread hop sooner than the answer could arrive; the
//! connection owes that answer, and reads and drops it before its next request. Timeouts,
//! errors and a device in error (AlwaysSignaled) come as the answer. Sleeps are bounded
//! ([`DAEMON_CHECK`]): a daemon that died never bumps its word again, and the next look at
//! the socket reports it gone. The daemon trusts nothing here: the page is read-only to the
//! client, and all a client decides is where it sleeps.
//!
//! # Device lost
//!
//! If the daemon goes away, every call fails with [`KernelError::DeviceLost`] (naming the
//! process's first device) without blocking, and waits in progress end the same way.

use std::borrow::Cow;
use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use abi::port::{self, AdapterInfo, Call, Invalid, KernelError, KernelPort, Local, Translate, WaitMode, WaitOutcome};
use abi::{DeviceHandle, DoorbellHandle, HwQueueHandle, NativeFenceHandle, ProcessId, Time};
use shm::{Mapping, Prot, ReadFutex, ReadWord, RotatingPage, Shm};
use std::sync::Mutex;

use crate::{
    Accepted, Channel, ConnectError, Fds, HelloKind, Limits, PROTOCOL_VERSION, Reply, Request, Response, WireError,
    WireMapping, WirePage,
};

/// The longest a blocked wait sleeps on its wake word before it looks at the socket: how long
/// a client may take to notice that its daemon died (nobody will bump a dead daemon's word).
pub const DAEMON_CHECK: Duration = Duration::from_millis(20);

/// One connection to the daemon and what this process keeps about it.
struct Conn {
    chan: Channel,
    /// Its wake word, once asked for.
    wake: Option<ReadFutex>,
    /// Answers of waits that returned from memory first: read and dropped before the next
    /// request.
    owed: u32,
}

impl Conn {
    fn new(chan: Channel) -> Conn {
        Conn { chan, wake: None, owed: 0 }
    }

    /// Reads the answers this connection owes (they are sent, or about to be).
    fn settle(&mut self) -> Result<(), WireError> {
        while self.owed > 0 {
            // Dropped: memory already decided that wait.
            let _answer = self.chan.recv::<Response>("owed wait answer")?;
            self.owed -= 1;
        }
        Ok(())
    }

    /// One request and its answer.
    fn exchange(&mut self, req: &Request<'_>) -> Result<(Response, Vec<OwnedFd>), WireError> {
        self.settle()?;
        self.chan.send(req, &[])?;
        self.chan.recv::<Response>("response")
    }
}

/// What a wait waits for, read from memory this process maps: `Some(outcome)` once decided.
/// `None` forever for what memory cannot tell (then only the answer ends the wait).
type Condition<'a> = &'a dyn Fn() -> Option<WaitOutcome>;

/// A client process's connection to a doorbell daemon.
pub struct RemotePort {
    path: PathBuf,
    primary: Mutex<Conn>,
    /// Attached connections not in use.
    spare: Mutex<Vec<Conn>>,
    /// The process's wake page (read-only), mapped once.
    wake_page: Mutex<Option<Arc<Mapping>>>,
    /// Each user-mode queue's completed progress value, for waits (read-only kernel pages).
    progress: Mutex<HashMap<HwQueueHandle, ReadWord>>,
    /// Each CPU-visible fence's CurrentValue, for waits.
    currents: Mutex<HashMap<NativeFenceHandle, ReadWord>>,
    accepted: Accepted,
    process: ProcessId,
    info: AdapterInfo,
    dummy: Arc<Shm>,
    doorbells: Mutex<HashMap<HwQueueHandle, Arc<RotatingPage>>>,
    doorbell_queues: Mutex<HashMap<DoorbellHandle, HwQueueHandle>>,
    devices: Mutex<Vec<DeviceHandle>>,
    lost: AtomicBool,
    /// Whether blocking waits sleep on the wake word (the default) or read the socket.
    wake_words: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

impl RemotePort {
    /// Connects to the daemon at `path` as a new client process.
    pub fn connect(path: &Path) -> Result<RemotePort, ConnectError> {
        Self::connect_as(path, PROTOCOL_VERSION)
    }

    /// Like [`connect`](Self::connect), speaking protocol `version`: for tests of the
    /// daemon's refusal of another version.
    #[doc(hidden)]
    pub fn connect_as(path: &Path, version: u32) -> Result<RemotePort, ConnectError> {
        let name = std::env::args().next().unwrap_or_default();
        let kind = HelloKind::Open { os_pid: std::process::id(), name };
        let (chan, accepted) = crate::connect(path, kind, version)?;
        let lost = |error| ConnectError::Wire { path: path.display().to_string(), error };
        let process = accepted.process.ok_or(lost(WireError::Closed))?;
        chan.send(&Request::AdapterInfo, &[]).map_err(lost)?;
        let (resp, _) = chan.recv::<Response>("response").map_err(lost)?;
        let info = match resp {
            Ok(Reply::AdapterInfo(i)) => i,
            _ => return Err(lost(WireError::Malformed { what: "adapter info", why: "unexpected reply".into() })),
        };
        let dummy = Shm::new("doorbell-client-dummy", shm::PAGE_SIZE)
            .map_err(|e| lost(WireError::Io { what: "dummy page", errno: e.to_string() }))?;
        Ok(RemotePort {
            path: path.to_owned(),
            primary: Mutex::new(Conn::new(chan)),
            spare: Mutex::new(Vec::new()),
            wake_page: Mutex::new(None),
            progress: Mutex::new(HashMap::new()),
            currents: Mutex::new(HashMap::new()),
            accepted,
            process,
            info,
            dummy,
            doorbells: Mutex::new(HashMap::new()),
            doorbell_queues: Mutex::new(HashMap::new()),
            devices: Mutex::new(Vec::new()),
            lost: AtomicBool::new(false),
            wake_words: AtomicBool::new(true),
        })
    }

    /// Whether blocking waits sleep on the connection's wake word (`true`, the default) or
    /// block reading the answer from the socket: for `doorbell bench submit --daemon`, which
    /// measures both.
    pub fn set_wake_words(&self, on: bool) {
        // Relaxed: a setting read by later waits of whichever thread; nothing rides on it.
        self.wake_words.store(on, Ordering::Relaxed);
    }

    /// The daemon's per-process limits.
    pub fn limits(&self) -> Limits {
        self.accepted.limits
    }

    /// Device time now, read from this process's clock (no call): what a `TIMESTAMP` packet
    /// executed now would write.
    pub fn device_now(&self) -> Time {
        Time(monotonic_ns().saturating_sub(self.accepted.device_epoch_ns))
    }

    /// Whether the daemon has gone away (every call now fails with device lost).
    pub fn is_lost(&self) -> bool {
        // Relaxed: a sticky flag; each call re-learns it from its own transport error anyway.
        self.lost.load(Ordering::Relaxed)
    }

    fn device_lost(&self) -> KernelError {
        // Relaxed: see `is_lost`.
        self.lost.store(true, Ordering::Relaxed);
        let device = lock(&self.devices).first().copied().unwrap_or(DeviceHandle::new(self.process, 0, 0));
        KernelError::DeviceLost { device }
    }

    /// Runs `f` on a free connection: the primary one, else a spare attached one, else a new
    /// one attached to this process by its token.
    fn with_conn<T>(&self, f: impl FnOnce(&mut Conn) -> Result<T, WireError>) -> Result<T, KernelError> {
        if self.is_lost() {
            return Err(self.device_lost());
        }
        let result = match self.primary.try_lock() {
            Ok(mut conn) => f(&mut conn),
            Err(_) => {
                let spare = lock(&self.spare).pop();
                let mut conn = match spare {
                    Some(c) => c,
                    None => {
                        let kind = HelloKind::Attach { token: self.accepted.token };
                        match crate::connect(&self.path, kind, PROTOCOL_VERSION) {
                            Ok((c, _)) => Conn::new(c),
                            Err(_) => return Err(self.device_lost()),
                        }
                    }
                };
                let r = f(&mut conn);
                if r.is_ok() {
                    lock(&self.spare).push(conn);
                }
                r
            }
        };
        match result {
            Ok(t) => Ok(t),
            Err(WireError::Oversized { len, .. }) => Err(KernelError::InvalidArgument {
                field: "request",
                value: format!("{len} bytes"),
                reason: Invalid::OutOfRange { expected: "at most wire::MAX_FRAME bytes encoded" },
            }),
            Err(_) => Err(self.device_lost()),
        }
    }

    /// A call the daemon answers: sent, and its answer read (see [`Self::receive`]).
    fn exchange(&self, call: &Call<'_>) -> Result<Answer, KernelError> {
        self.with_conn(|c| c.exchange(&Request::Call(Cow::Borrowed(call))))
    }

    /// The reply to `call` in this process's memory: its descriptors mapped
    /// ([`Receive`]), or the kernel's refusal.
    fn receive(&self, call: &Call<'_>, (resp, fds): Answer) -> Result<port::Reply, KernelError> {
        let reply = match resp? {
            Reply::Call(reply) => reply,
            other => return Err(KernelError::UnexpectedReply { call: call.name(), reply: other.name() }),
        };
        reply.translate(&mut Receive { port: self, call, fds: fds.into_iter().map(Some).collect() })
    }

    /// A blocking wait (see the module docs): sent, then a sleep on the connection's wake
    /// word until `done` shows in memory or the answer arrives.
    fn wait_on_word(&self, req: &Request<'_>, done: Condition<'_>) -> Result<Answer, KernelError> {
        self.with_conn(|c| {
            c.settle()?;
            let Some(word) = self.wake_word(c)? else { return c.exchange(req) };
            c.chan.send(req, &[])?;
            loop {
                // The word first, then memory and the socket (abi::protocol's order).
                match abi::protocol::read_wake_word(&word, done) {
                    Ok(outcome) => {
                        c.owed += 1;
                        return Ok((Ok(Reply::Call(port::Reply::Wait(outcome))), Vec::new()));
                    }
                    Err(seen) => {
                        if let Some(answer) = c.chan.try_recv::<Response>("response")? {
                            return Ok(answer);
                        }
                        word.wait(seen, DAEMON_CHECK);
                    }
                }
            }
        })
    }

    /// The connection's wake word, asked for the first time it waits; `None` if the daemon
    /// has none to give (the wait is then an ordinary call).
    fn wake_word(&self, c: &mut Conn) -> Result<Option<ReadFutex>, WireError> {
        if c.wake.is_none() {
            let (resp, fds) = c.exchange(&Request::WakeWord)?;
            let Ok(Reply::WakeWord(m, offset)) = resp else { return Ok(None) };
            let mut page = lock(&self.wake_page);
            if page.is_none() {
                let mut fds: Vec<_> = fds.into_iter().map(Some).collect();
                let fd = crate::take_fd(&mut fds, m.fd, "wake page")?;
                let map = Mapping::new(fd.as_fd(), m.file_offset, m.len as usize, Prot::ReadOnly)
                    .map_err(|e| WireError::Io { what: "wake page", errno: e.to_string() })?;
                *page = Some(Arc::new(map));
            }
            let region = page.as_ref().expect("mapped above").clone();
            c.wake = ReadFutex::new(region, offset).ok();
        }
        Ok(c.wake.clone())
    }

    /// A read-only word at `offset` of a window onto `m` (no call).
    fn word_in(m: &Mapping, offset: u64) -> Option<ReadWord> {
        ReadWord::new(Arc::new(m.window(0, m.len()).ok()?), offset).ok()
    }

    /// A wait: an ordinary call when it only polls (`timeout` zero), else [`Self::wait_on_word`].
    fn wait(&self, call: &Call<'_>, timeout: Option<Duration>, done: Condition<'_>) -> Result<Answer, KernelError> {
        // Relaxed: see `set_wake_words`.
        if timeout == Some(Duration::ZERO) || !self.wake_words.load(Ordering::Relaxed) {
            return self.exchange(call);
        }
        self.wait_on_word(&Request::Call(Cow::Borrowed(call)), done)
    }

    /// [`Call::WaitProgress`]: done from memory once the queue's completed progress value
    /// (its kernel page, mapped read-only) reaches `value`.
    fn wait_progress(
        &self,
        call: &Call<'_>,
        queue: HwQueueHandle,
        value: u64,
        timeout: Option<Duration>,
    ) -> Result<Answer, KernelError> {
        let word = lock(&self.progress).get(&queue).cloned();
        let done = || {
            // Acquire: pairs with the engine's release of the progress value.
            let done = word.as_ref()?.load(Ordering::Acquire);
            (done >= value).then_some(WaitOutcome::Reached(done))
        };
        self.wait(call, timeout, &done)
    }

    /// [`Call::WaitNativeFences`]: done from memory as the kernel would decide it, from the
    /// fences' CurrentValues (mapped read-only).
    fn wait_fences(
        &self,
        call: &Call<'_>,
        fences: &[(NativeFenceHandle, u64)],
        mode: WaitMode,
        timeout: Option<Duration>,
    ) -> Result<Answer, KernelError> {
        let words: Option<Vec<ReadWord>> = {
            let currents = lock(&self.currents);
            fences.iter().map(|(f, _)| currents.get(f).cloned()).collect()
        };
        // The kernel's own evaluation, from memory; AlwaysSignaled (a device in error) is the
        // answer's to report.
        let done = || {
            let words = words.as_ref()?;
            // Acquire: pairs with the signaller's release of CurrentValue.
            let values: Vec<u64> = words.iter().map(|w| w.load(Ordering::Acquire)).collect();
            if values.contains(&abi::port::FENCE_ALWAYS_SIGNALED) {
                return None;
            }
            let mut reached = values.iter().zip(fences).map(|(v, (_, want))| v >= want);
            match mode {
                WaitMode::Any => reached.position(|r| r).map(|i| WaitOutcome::Reached(i as u64)),
                WaitMode::All => reached.all(|r| r).then_some(WaitOutcome::Reached(0)),
            }
        };
        self.wait(call, timeout, &done)
    }

    /// Keeps what this port needs of an answered call: the devices (for device lost), each
    /// queue's progress word and each fence's CurrentValue word (for waits), and each
    /// doorbell's page (rotated to the dummy page when it goes).
    fn note(&self, call: &Call<'_>, reply: &port::Reply) {
        match (call, reply) {
            (Call::CreateDevice, port::Reply::Device(d)) => lock(&self.devices).push(*d),
            (Call::DestroyDevice(device), port::Reply::Unit) => lock(&self.devices).retain(|d| d != device),
            (_, port::Reply::HwQueue(q)) => {
                if let Some(word) = Self::word_in(&q.kernel_page, abi::queue::PROGRESS_COMPLETED_OFFSET) {
                    lock(&self.progress).insert(q.handle, word);
                }
            }
            (Call::DestroyHwQueue(queue), port::Reply::Unit) => {
                lock(&self.progress).remove(queue);
                self.retire_doorbell_page(*queue);
            }
            (Call::CreateDoorbell(args), port::Reply::Doorbell(d)) => {
                lock(&self.doorbells).insert(args.queue, d.cpu_page.clone());
                lock(&self.doorbell_queues).insert(d.handle, args.queue);
            }
            (Call::DestroyDoorbell(doorbell), port::Reply::Unit) => {
                if let Some(q) = lock(&self.doorbell_queues).remove(doorbell) {
                    self.retire_doorbell_page(q);
                }
            }
            (_, port::Reply::NativeFence(f)) => {
                // A window of the same mapping (no call) for this port's waits.
                if let Some(word) = f.cpu.as_ref().and_then(|m| Self::word_in(m, f.offset)) {
                    lock(&self.currents).insert(f.handle, word);
                }
            }
            (Call::DestroyNativeFence(fence), port::Reply::Unit) => {
                lock(&self.currents).remove(fence);
            }
            _ => {}
        }
    }

    /// The queue's doorbell page goes back to the dummy page (its doorbell or queue is gone).
    fn retire_doorbell_page(&self, queue: HwQueueHandle) {
        if let Some(page) = lock(&self.doorbells).remove(&queue) {
            let _ = page.rotate_to(&self.dummy, 0);
        }
    }
}

/// A response and the descriptors that came with it.
type Answer = (Response, Vec<OwnedFd>);

/// Translates a reply received into this process's memory: maps its descriptors, and makes
/// each doorbell page a [`RotatingPage`] of this process.
struct Receive<'a, 'c> {
    port: &'a RemotePort,
    /// The call answered (a connect names the queue whose page to rotate).
    call: &'a Call<'c>,
    /// The frame's descriptors, each taken once.
    fds: Vec<Option<OwnedFd>>,
}

impl Receive<'_, '_> {
    fn fd(&mut self, index: crate::FdRef, what: &'static str) -> Result<OwnedFd, KernelError> {
        // A reply naming a descriptor it does not carry is a daemon of another build: gone.
        crate::take_fd(&mut self.fds, index, what).map_err(|_| self.port.device_lost())
    }
}

impl Translate<Fds, Local> for Receive<'_, '_> {
    type Error = KernelError;

    fn mapping(&mut self, m: WireMapping) -> Result<Mapping, KernelError> {
        let fd = self.fd(m.fd, "mapping")?;
        let prot = if m.read_only { Prot::ReadOnly } else { Prot::ReadWrite };
        Ok(Mapping::new(fd.as_fd(), m.file_offset, m.len as usize, prot)?)
    }

    /// The doorbell's page starts on this process's dummy page; a connect rotates it.
    fn doorbell_page(&mut self, (): ()) -> Result<Arc<RotatingPage>, KernelError> {
        Ok(Arc::new(RotatingPage::new(&self.port.dummy, 0)?))
    }

    fn aggregated_page(&mut self, p: WirePage) -> Result<Option<Arc<RotatingPage>>, KernelError> {
        let fd = self.fd(p.fd, "aggregated doorbell")?;
        let page = Arc::new(RotatingPage::new(&self.port.dummy, 0)?);
        page.rotate_to_fd(fd.as_fd(), p.file_offset)?;
        Ok(Some(page))
    }

    /// Rotates the queue's doorbell page to the page the daemon handed out. `None`:
    /// disconnected again already; the dummy page stays and the status says retry.
    fn connected(&mut self, page: Option<WirePage>) -> Result<(), KernelError> {
        let Some(p) = page else { return Ok(()) };
        let Call::ConnectDoorbell(queue) = *self.call else {
            return Err(KernelError::UnexpectedReply { call: self.call.name(), reply: "connected" });
        };
        let fd = self.fd(p.fd, "doorbell page")?;
        if let Some(page) = lock(&self.port.doorbells).get(&queue) {
            page.rotate_to_fd(fd.as_fd(), p.file_offset)?;
        }
        Ok(())
    }
}

impl Drop for RemotePort {
    /// The orderly close: spec 000's normal termination of the process (its queued work runs
    /// out), then the connection closes.
    fn drop(&mut self) {
        if !self.is_lost() {
            let conn = self.primary.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner);
            let _ = conn.exchange(&Request::Goodbye);
        }
    }
}

impl KernelPort for RemotePort {
    fn process(&self) -> ProcessId {
        self.process
    }
    /// Asked once, at connect.
    fn adapter_info(&self) -> AdapterInfo {
        self.info.clone()
    }
    /// Sends the call and maps what its reply hands out; a wait may end sooner, from memory
    /// (the module docs).
    fn call(&self, call: &Call<'_>) -> Result<port::Reply, KernelError> {
        let answer = match *call {
            Call::WaitProgress { queue, value, timeout } => self.wait_progress(call, queue, value, timeout)?,
            Call::WaitNativeFences { ref fences, mode, timeout } => self.wait_fences(call, fences, mode, timeout)?,
            _ => self.exchange(call)?,
        };
        let reply = self.receive(call, answer)?;
        self.note(call, &reply);
        Ok(reply)
    }
}

/// Connects to the daemon at `path` as a new client process: the port to open a
/// `umd::Device` on ([`RemotePort::connect`], shared).
pub fn connect(path: &Path) -> Result<Arc<dyn KernelPort>, ConnectError> {
    Ok(Arc::new(RemotePort::connect(path)?))
}

/// [`connect`] to [`socket_path`]: `$DOORBELL_SOCKET`, else the daemon's default socket
/// (`$XDG_RUNTIME_DIR/doorbell/doorbell.sock`, else `/tmp/doorbell-$UID/doorbell.sock`).
pub fn connect_default() -> Result<Arc<dyn KernelPort>, ConnectError> {
    connect(&socket_path())
}

/// The socket a client uses: `$DOORBELL_SOCKET` ([`crate::SOCKET_ENV`]), else
/// [`crate::default_socket_path`].
pub fn socket_path() -> std::path::PathBuf {
    std::env::var_os(crate::SOCKET_ENV).filter(|p| !p.is_empty()).map_or_else(crate::default_socket_path, Into::into)
}

/// Asks the daemon at `path` for its status (an observer connection: no process is opened).
pub fn daemon_status(path: &Path) -> Result<crate::DaemonStatus, ConnectError> {
    let (chan, _) = crate::connect(path, HelloKind::Observe, PROTOCOL_VERSION)?;
    let err = |error| ConnectError::Wire { path: path.display().to_string(), error };
    chan.send(&Request::Status, &[]).map_err(err)?;
    match chan.recv::<Response>("status").map_err(err)?.0 {
        Ok(Reply::Status(s)) => Ok(*s),
        _ => Err(err(WireError::Malformed { what: "status", why: "unexpected reply".into() })),
    }
}
