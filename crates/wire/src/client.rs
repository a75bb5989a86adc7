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
//! Every control-path call is one request and one reply on the Unix socket (this crate's
//! frames), and the reply's typed [`KernelError`] is the one the kernel returned. Shared memory arrives
//! as descriptors with the reply that hands it out, and is mapped here with
//! [`shm::Mapping::new`], read-only where the daemon sent a read-only descriptor (the queue's
//! kernel page with the progress fence and doorbell status, fence CurrentValue pages): such a
//! mapping cannot be made writable, not even with `mprotect`, because the descriptor is not.
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

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use abi::port::{
    AdapterInfo, AggregatedDoorbell, AllocationDesc, AllocationInfo, CreateDoorbell, DoorbellInfo, HwQueueDesc,
    HwQueueInfo, Invalid, KernelError, KernelPort, NativeFenceDesc, NativeFenceInfo, NativeFenceValues,
    PhysicalDoorbell, QueueStatus, WaitMode, WaitOutcome,
};
use abi::{
    AllocationHandle, ContextHandle, DeviceHandle, DoorbellHandle, EngineId, HwQueueHandle, NativeFenceHandle,
    ProcessId, Time,
};
use shm::{Mapping, Prot, ReadFutex, ReadWord, RotatingPage, Shm};
use std::sync::Mutex;

use crate::{
    Accepted, Channel, ConnectError, HelloKind, Limits, PROTOCOL_VERSION, Reply, Request, Response, WireError,
    WireMapping,
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
    fn exchange(&mut self, req: &Request) -> Result<(Response, Vec<OwnedFd>), WireError> {
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

    /// One request and its reply, with the descriptors that came with it.
    fn call(&self, req: &Request) -> Result<(Reply, Vec<Option<OwnedFd>>), KernelError> {
        Self::answer(self.with_conn(|c| c.exchange(req))?)
    }

    fn answer((resp, fds): (Response, Vec<OwnedFd>)) -> Result<(Reply, Vec<Option<OwnedFd>>), KernelError> {
        Ok((resp?, fds.into_iter().map(Some).collect()))
    }

    /// A blocking wait (see the module docs): sent, then a sleep on the connection's wake
    /// word until `done` shows in memory or the answer arrives.
    fn wait_on_word(&self, req: &Request, done: Condition<'_>) -> Result<WaitOutcome, KernelError> {
        let (resp, _) = self.with_conn(|c| {
            c.settle()?;
            let Some(word) = self.wake_word(c)? else { return c.exchange(req) };
            c.chan.send(req, &[])?;
            loop {
                // The word first, then memory and the socket (abi::protocol's order).
                match abi::protocol::read_wake_word(&word, done) {
                    Ok(outcome) => {
                        c.owed += 1;
                        return Ok((Ok(Reply::Wait(outcome)), Vec::new()));
                    }
                    Err(seen) => {
                        if let Some(answer) = c.chan.try_recv::<Response>("response")? {
                            return Ok(answer);
                        }
                        word.wait(seen, DAEMON_CHECK);
                    }
                }
            }
        })?;
        match resp? {
            Reply::Wait(w) => Ok(w),
            _ => Err(self.unexpected()),
        }
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

    fn unexpected(&self) -> KernelError {
        // A reply of the wrong kind is a daemon of another build: treat it as gone.
        self.device_lost()
    }

    fn map(&self, m: WireMapping, fds: &mut [Option<OwnedFd>]) -> Result<Mapping, KernelError> {
        let fd = crate::take_fd(fds, m.fd, "mapping").map_err(|_| self.unexpected())?;
        let prot = if m.read_only { Prot::ReadOnly } else { Prot::ReadWrite };
        Ok(Mapping::new(fd.as_fd(), m.file_offset, m.len as usize, prot)?)
    }

    fn unit(&self, req: Request) -> Result<(), KernelError> {
        match self.call(&req)?.0 {
            Reply::Unit => Ok(()),
            _ => Err(self.unexpected()),
        }
    }

    fn fence(&self, req: Request) -> Result<NativeFenceInfo, KernelError> {
        let (reply, mut fds) = self.call(&req)?;
        let Reply::NativeFence(f) = reply else { return Err(self.unexpected()) };
        let cpu = match f.cpu {
            Some(m) => Some(self.map(m, &mut fds)?),
            None => None,
        };
        // A window of the same mapping (no call) for this port's waits.
        if let Some(word) = cpu.as_ref().and_then(|m| Self::word_in(m, f.offset)) {
            lock(&self.currents).insert(f.handle, word);
        }
        Ok(NativeFenceInfo {
            handle: f.handle,
            va: f.va,
            cpu,
            offset: f.offset,
            global: f.global,
            kind: f.kind,
            cross_adapter: f.cross_adapter,
        })
    }

    /// A read-only word at `offset` of a window onto `m` (no call).
    fn word_in(m: &Mapping, offset: u64) -> Option<ReadWord> {
        ReadWord::new(Arc::new(m.window(0, m.len()).ok()?), offset).ok()
    }

    /// A wait: an ordinary call when it only polls (`timeout` zero), else [`Self::wait_on_word`].
    fn wait(&self, req: Request, timeout: Option<Duration>, done: Condition<'_>) -> Result<WaitOutcome, KernelError> {
        // Relaxed: see `set_wake_words`.
        if timeout == Some(Duration::ZERO) || !self.wake_words.load(Ordering::Relaxed) {
            return match self.call(&req)?.0 {
                Reply::Wait(w) => Ok(w),
                _ => Err(self.unexpected()),
            };
        }
        self.wait_on_word(&req, done)
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

fn nanos(t: Option<Duration>) -> Option<u64> {
    t.map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

impl KernelPort for RemotePort {
    fn process(&self) -> ProcessId {
        self.process
    }
    fn native_fence_caps(&self) -> Result<abi::port::NativeFenceCaps, KernelError> {
        let Reply::NativeFenceCaps(c) = self.call(&Request::NativeFenceCaps)?.0 else {
            return Err(self.unexpected());
        };
        Ok(c)
    }
    fn adapter_info(&self) -> AdapterInfo {
        self.info.clone()
    }
    fn create_device(&self) -> Result<DeviceHandle, KernelError> {
        let Reply::Device(d) = self.call(&Request::CreateDevice)?.0 else { return Err(self.unexpected()) };
        lock(&self.devices).push(d);
        Ok(d)
    }
    fn destroy_device(&self, device: DeviceHandle) -> Result<(), KernelError> {
        self.unit(Request::DestroyDevice(device))?;
        lock(&self.devices).retain(|d| *d != device);
        Ok(())
    }
    fn allocate(&self, device: DeviceHandle, desc: &AllocationDesc) -> Result<AllocationInfo, KernelError> {
        let Reply::Allocation(a) = self.call(&Request::Allocate(device, *desc))?.0 else {
            return Err(self.unexpected());
        };
        Ok(a)
    }
    fn map_allocation(&self, allocation: AllocationHandle) -> Result<Mapping, KernelError> {
        let (reply, mut fds) = self.call(&Request::MapAllocation(allocation))?;
        let Reply::Mapping(m) = reply else { return Err(self.unexpected()) };
        self.map(m, &mut fds)
    }
    fn free(&self, allocation: AllocationHandle) -> Result<(), KernelError> {
        self.unit(Request::Free(allocation))
    }
    fn create_context(&self, device: DeviceHandle, engine: EngineId) -> Result<ContextHandle, KernelError> {
        let Reply::Context(c) = self.call(&Request::CreateContext(device, engine))?.0 else {
            return Err(self.unexpected());
        };
        Ok(c)
    }
    fn destroy_context(&self, context: ContextHandle) -> Result<(), KernelError> {
        self.unit(Request::DestroyContext(context))
    }
    fn create_hw_queue(&self, context: ContextHandle, desc: &HwQueueDesc) -> Result<HwQueueInfo, KernelError> {
        let (reply, mut fds) = self.call(&Request::CreateHwQueue(context, *desc))?;
        let Reply::HwQueue(q) = reply else { return Err(self.unexpected()) };
        let kernel_page = self.map(q.kernel_page, &mut fds)?;
        if let Some(word) = Self::word_in(&kernel_page, abi::queue::PROGRESS_COMPLETED_OFFSET) {
            lock(&self.progress).insert(q.handle, word);
        }
        Ok(HwQueueInfo { handle: q.handle, engine: q.engine, kernel_page, kernel_page_va: q.kernel_page_va })
    }
    fn destroy_hw_queue(&self, queue: HwQueueHandle) -> Result<(), KernelError> {
        self.unit(Request::DestroyHwQueue(queue))?;
        lock(&self.progress).remove(&queue);
        if let Some(page) = lock(&self.doorbells).remove(&queue) {
            let _ = page.rotate_to(&self.dummy, 0);
        }
        Ok(())
    }
    fn create_doorbell_page(&self, device: DeviceHandle) -> Result<abi::port::DoorbellPageInfo, KernelError> {
        let Reply::DoorbellPage(p) = self.call(&Request::CreateDoorbellPage(device))?.0 else {
            return Err(self.unexpected());
        };
        Ok(p)
    }
    fn destroy_doorbell_page(&self, page: abi::DoorbellPageHandle) -> Result<(), KernelError> {
        self.unit(Request::DestroyDoorbellPage(page))
    }
    fn create_doorbell(&self, args: &CreateDoorbell) -> Result<DoorbellInfo, KernelError> {
        let (reply, mut fds) = self.call(&Request::CreateDoorbell(*args))?;
        let Reply::Doorbell(d) = reply else { return Err(self.unexpected()) };
        let page = Arc::new(RotatingPage::new(&self.dummy, 0)?);
        let aggregated = match d.aggregated {
            Some((p, offset, mask)) => {
                let fd = crate::take_fd(&mut fds, p.fd, "aggregated doorbell").map_err(|_| self.unexpected())?;
                let agg = Arc::new(RotatingPage::new(&self.dummy, 0)?);
                agg.rotate_to_fd(fd.as_fd(), p.file_offset)?;
                Some(AggregatedDoorbell { page: agg, offset, mask, gpu_va: d.aggregated_gpu_va })
            }
            None => None,
        };
        lock(&self.doorbells).insert(args.queue, page.clone());
        lock(&self.doorbell_queues).insert(d.handle, args.queue);
        Ok(DoorbellInfo {
            handle: d.handle,
            cpu_page: page,
            offset: d.offset,
            ring: d.ring,
            aggregated,
            gpu_va: d.gpu_va,
        })
    }
    fn connect_doorbell(&self, queue: HwQueueHandle) -> Result<(), KernelError> {
        let (reply, mut fds) = self.call(&Request::ConnectDoorbell(queue))?;
        let Reply::Connected(p) = reply else { return Err(self.unexpected()) };
        // `None`: disconnected again already; the dummy page stays and the status says retry.
        if let Some(p) = p {
            let fd = crate::take_fd(&mut fds, p.fd, "doorbell page").map_err(|_| self.unexpected())?;
            if let Some(page) = lock(&self.doorbells).get(&queue) {
                page.rotate_to_fd(fd.as_fd(), p.file_offset)?;
            }
        }
        Ok(())
    }
    fn destroy_doorbell(&self, doorbell: DoorbellHandle) -> Result<(), KernelError> {
        self.unit(Request::DestroyDoorbell(doorbell))?;
        if let Some(q) = lock(&self.doorbell_queues).remove(&doorbell)
            && let Some(page) = lock(&self.doorbells).remove(&q)
        {
            let _ = page.rotate_to(&self.dummy, 0);
        }
        Ok(())
    }
    fn notify_work_submission(&self, doorbell: DoorbellHandle) -> Result<(), KernelError> {
        self.unit(Request::NotifyWorkSubmission(doorbell))
    }
    fn submit_command(&self, queue: HwQueueHandle, words: &[u32]) -> Result<(), KernelError> {
        self.unit(Request::SubmitCommand(queue, words.to_vec()))
    }
    fn wait_progress(
        &self,
        queue: HwQueueHandle,
        value: u64,
        timeout: Option<Duration>,
    ) -> Result<WaitOutcome, KernelError> {
        let word = lock(&self.progress).get(&queue).cloned();
        let done = || {
            // Acquire: pairs with the engine's release of the progress value.
            let done = word.as_ref()?.load(Ordering::Acquire);
            (done >= value).then_some(WaitOutcome::Reached(done))
        };
        self.wait(Request::WaitProgress(queue, value, nanos(timeout)), timeout, &done)
    }
    fn query_queue(&self, queue: HwQueueHandle) -> Result<QueueStatus, KernelError> {
        let Reply::QueueStatus(s) = self.call(&Request::QueryQueue(queue))?.0 else { return Err(self.unexpected()) };
        Ok(s)
    }
    fn create_native_fence(
        &self,
        device: DeviceHandle,
        desc: &NativeFenceDesc,
    ) -> Result<NativeFenceInfo, KernelError> {
        self.fence(Request::CreateNativeFence(device, *desc))
    }
    fn open_native_fence(&self, device: DeviceHandle, global: u64) -> Result<NativeFenceInfo, KernelError> {
        self.fence(Request::OpenNativeFence(device, global))
    }
    fn open_cross_adapter_fence(&self, device: DeviceHandle, handle: u64) -> Result<NativeFenceInfo, KernelError> {
        self.fence(Request::OpenCrossAdapterFence(device, handle))
    }
    fn destroy_native_fence(&self, fence: NativeFenceHandle) -> Result<(), KernelError> {
        self.unit(Request::DestroyNativeFence(fence))?;
        lock(&self.currents).remove(&fence);
        Ok(())
    }
    fn signal_native_fence(&self, fence: NativeFenceHandle, value: u64) -> Result<(), KernelError> {
        self.unit(Request::SignalNativeFence(fence, value))
    }
    fn wait_native_fences(
        &self,
        fences: &[(NativeFenceHandle, u64)],
        mode: WaitMode,
        timeout: Option<Duration>,
    ) -> Result<WaitOutcome, KernelError> {
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
        self.wait(Request::WaitNativeFences(fences.to_vec(), mode, nanos(timeout)), timeout, &done)
    }
    fn query_native_fence(&self, fence: NativeFenceHandle) -> Result<NativeFenceValues, KernelError> {
        let Reply::FenceValues(v) = self.call(&Request::QueryNativeFence(fence))?.0 else {
            return Err(self.unexpected());
        };
        Ok(v)
    }
    fn userq_signal(
        &self,
        queue: HwQueueHandle,
        point: u64,
        fences: &[(NativeFenceHandle, u64)],
    ) -> Result<(), KernelError> {
        self.unit(Request::UserqSignal(queue, point, fences.to_vec()))
    }
    fn userq_wait(
        &self,
        queue: HwQueueHandle,
        objects: &[abi::port::SyncWait],
    ) -> Result<Vec<abi::port::WaitPoint>, KernelError> {
        let Reply::WaitPoints(p) = self.call(&Request::UserqWait(queue, objects.to_vec()))?.0 else {
            return Err(self.unexpected());
        };
        Ok(p)
    }
    fn open_progress_fence(&self, queue: HwQueueHandle) -> Result<NativeFenceInfo, KernelError> {
        self.fence(Request::OpenProgressFence(queue))
    }
    fn query_physical_doorbell(&self, queue: HwQueueHandle) -> Result<Option<PhysicalDoorbell>, KernelError> {
        let Reply::PhysicalDoorbell(p) = self.call(&Request::QueryPhysicalDoorbell(queue))?.0 else {
            return Err(self.unexpected());
        };
        Ok(p)
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
