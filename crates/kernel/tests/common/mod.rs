//! Shared helpers for the kernel's integration tests.
//!
//! - [`sim`], [`sim_with`], [`client`], [`client_on`]: a deterministic system and a client
//!   (device, compute context, 1 MiB buffer) on it.
//! - [`TapPort`]: a [`KernelPort`] that wraps a process's real port, forwards every call
//!   ([`KernelPort::call`]), and records what it sees: the allocations behind each user-mode queue (so a test can map its
//!   ring and ring-control blocks a second time), the doorbell's CPU page, and a [`Snapshot`]
//!   of the queue's shared memory at the instant of each `connect_doorbell` and
//!   `notify_work_submission` call.
#![allow(dead_code)]

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use abi::port::{
    AdapterInfo, AllocationDesc, AllocationInfo, CreateDoorbell, DoorbellInfo, HwQueueDesc, HwQueueInfo, KernelError,
    KernelPort, Reply, SubmissionMode,
};
use abi::queue::{DOORBELL_STATUS_OFFSET, PROGRESS_COMPLETED_OFFSET, QUEUE_STATE_OFFSET, QueueDescriptor};
use abi::ring::{LAST_QUEUED_OFFSET, RPTR_OFFSET, WPTR_OFFSET};
use abi::{
    AllocationHandle, ContextHandle, DeviceHandle, DoorbellHandle, DoorbellStatus, EngineId, EngineKind, HwQueueHandle,
    ProcessId,
};
use gpu::GpuConfig;
use kernel::trace::{Ddi, Event};
use kernel::{System, SystemConfig};
use shm::{Mapping, Prot, RotatingPage};
use umd::{Buffer, Context, Device, Queue, QueueOptions};

/// A generous timeout for waits on the sim (virtual time: it costs nothing).
pub const T: Option<Duration> = Some(Duration::from_secs(1));

/// A deterministic system with default config.
/// The trace's events from entry `from` on (0: all of them).
pub fn events_from(sys: &System, from: usize) -> Vec<Event> {
    sys.trace().0.into_iter().skip(from).map(|e| e.event).collect()
}

/// The DDI calls in the trace from entry `from` on, in order.
pub fn ddis_from(sys: &System, from: usize) -> Vec<Ddi> {
    events_from(sys, from).into_iter().filter_map(|e| if let Event::Ddi(d) = e { Some(d) } else { None }).collect()
}

pub fn sim() -> System {
    System::sim(SystemConfig::default()).expect("system")
}

/// A deterministic system with a config.
pub fn sim_with(cfg: SystemConfig) -> System {
    System::sim(cfg).expect("system")
}

/// A deterministic system whose logged fence signals raise the optimized interrupt (naming
/// the queue, not the fence).
pub fn optimized() -> System {
    sim_with(SystemConfig {
        gpu: GpuConfig { optimized_fence_interrupts: true, ..GpuConfig::default() },
        ..SystemConfig::default()
    })
}

/// A config whose engines ask for F1 after `idle` without work.
pub fn idle_config(idle: Duration) -> SystemConfig {
    SystemConfig { gpu: GpuConfig { idle_period: idle, ..GpuConfig::default() }, ..SystemConfig::default() }
}

/// A client: device, a context on the compute engine, a 1 MiB buffer.
pub struct Client {
    pub port: Arc<dyn KernelPort>,
    pub device: Device,
    pub ctx: Context,
    pub buf: Buffer,
}

pub fn client(sys: &System) -> Client {
    let port: Arc<dyn KernelPort> = sys.open_process().expect("process");
    client_on(port)
}

/// A new client whose high-priority user-mode queue writes 1 at the start of its buffer;
/// returns once that ran.
pub fn high_priority_write(sys: &System) -> Client {
    let c = client(sys);
    let mut q = c
        .ctx
        .create_queue(umd::QueueOptions { priority: abi::Priority::High, ..umd::QueueOptions::user_mode() })
        .unwrap();
    let mut cb = umd::CommandBuffer::new();
    cb.write_u32(c.buf.va(), 1);
    let v = q.submit(&cb).unwrap();
    q.wait(v, T).unwrap();
    c
}

/// A client on an existing port (a [`TapPort`], for instance).
pub fn client_on(port: Arc<dyn KernelPort>) -> Client {
    let device = Device::open(port.clone()).expect("device");
    let engine = device.engine(EngineKind::Compute).expect("engine");
    let ctx = device.create_context(engine).expect("context");
    let buf = device.allocate(1 << 20).expect("buffer");
    Client { port, device, ctx, buf }
}

impl Client {
    pub fn user_queue(&self) -> Queue {
        self.ctx.create_queue(QueueOptions::user_mode()).expect("user queue")
    }
    pub fn kernel_queue(&self) -> Queue {
        self.ctx.create_queue(QueueOptions::kernel_mode()).expect("kernel queue")
    }
    /// A new user-mode queue running a kernel that never ends ([`forever`], one group of 64
    /// threads, its arguments this client's buffer), and the program's buffer, which must
    /// live as long as the queue runs it.
    pub fn endless_queue(&self) -> (Queue, Buffer) {
        let spin = self.device.upload(&forever()).expect("upload");
        let mut q = self.user_queue();
        let mut cb = umd::CommandBuffer::new();
        cb.dispatch(spin.va(), [1, 1, 1], [64, 1, 1], self.buf.va());
        q.submit(&cb).expect("submit");
        (q, spin)
    }
    /// A context on the first engine of `kind`.
    pub fn context(&self, kind: EngineKind) -> Context {
        let e = self.device.engine(kind).expect("engine");
        self.device.create_context(e).expect("context")
    }
}

/// The trace's events, without timestamps.
pub fn events(sys: &System) -> Vec<Event> {
    let (entries, dropped) = sys.trace();
    assert_eq!(dropped, 0, "trace overflowed");
    entries.into_iter().map(|e| e.event).collect()
}

/// Asserts that `want` occurs in `hay` as a contiguous run; returns where it starts.
#[track_caller]
pub fn find_run(hay: &[Event], want: &[Event]) -> usize {
    hay.windows(want.len()).position(|w| w == want).unwrap_or_else(|| {
        let listing: Vec<String> = hay.iter().map(|e| format!("  {e}")).collect();
        panic!("sequence {want:#?}\nnot found contiguously in the trace:\n{}", listing.join("\n"))
    })
}

/// What a user-mode queue's shared memory held at one instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// The ring-control rptr word.
    pub rptr: u64,
    /// The ring-control wptr word.
    pub wptr: u64,
    /// The ring-control last-queued word.
    pub last_queued: u64,
    /// The doorbell word as the client's doorbell CPU page shows it (BAR or dummy page).
    pub doorbell: u64,
    /// The doorbell status word of the queue's kernel page.
    pub status: u64,
}

/// A kernel call the [`TapPort`] saw, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    /// `connect_doorbell`, with the queue's memory just before the kernel acted (`None` before
    /// the doorbell exists).
    Connect(HwQueueHandle, Option<Snapshot>),
    /// `notify_work_submission`, with the queue's memory at the call.
    Notify(HwQueueHandle, Snapshot),
    /// `wait_progress`.
    Wait(HwQueueHandle, u64),
    /// `submit_command`.
    Submit(HwQueueHandle),
    /// Any other call, by name.
    Other(&'static str),
}

/// The memory behind one user-mode queue, mapped a second time through the port.
pub struct TapQueue {
    /// The queue.
    pub handle: HwQueueHandle,
    /// Its descriptor.
    pub desc: QueueDescriptor,
    /// Its doorbell.
    pub doorbell: DoorbellHandle,
    /// The ring allocation.
    pub ring_alloc: AllocationHandle,
    /// The ring-control allocation.
    pub control_alloc: AllocationHandle,
    /// A second CPU mapping of the ring allocation.
    pub ring: Mapping,
    /// Offset of the ring in `ring`.
    pub ring_base: u64,
    /// A second CPU mapping of the ring-control allocation.
    pub control: Mapping,
    /// Offset of the `RingControl` block in `control`.
    pub control_base: u64,
    /// The doorbell's CPU page (shared with the UMD: the kernel rotates it).
    pub doorbell_page: Arc<RotatingPage>,
    /// Offset of the doorbell word in the page.
    pub doorbell_offset: u64,
    /// How the queue rings it.
    pub ring_method: abi::doorbell::RingMethod,
    /// The process's aggregated doorbell, if the device has one.
    pub aggregated: Option<abi::port::AggregatedDoorbell>,
    /// A read-only mapping of the queue's kernel page.
    pub kernel_page: Mapping,
}

impl TapQueue {
    pub fn rptr(&self) -> u64 {
        self.control.load_u64(self.control_base + RPTR_OFFSET, Ordering::Acquire).unwrap()
    }
    pub fn wptr(&self) -> u64 {
        self.control.load_u64(self.control_base + WPTR_OFFSET, Ordering::Acquire).unwrap()
    }
    pub fn last_queued(&self) -> u64 {
        self.control.load_u64(self.control_base + LAST_QUEUED_OFFSET, Ordering::Acquire).unwrap()
    }
    pub fn doorbell_word(&self) -> u64 {
        self.doorbell_page.atomic_u64(self.doorbell_offset).unwrap().load(Ordering::SeqCst)
    }
    pub fn status_word(&self) -> u64 {
        self.kernel_page.load_u64(DOORBELL_STATUS_OFFSET, Ordering::SeqCst).unwrap()
    }
    pub fn status(&self) -> DoorbellStatus {
        DoorbellStatus::from_word(self.status_word()).expect("valid status word")
    }
    pub fn state_word(&self) -> u64 {
        self.kernel_page.load_u64(QUEUE_STATE_OFFSET, Ordering::SeqCst).unwrap()
    }
    pub fn completed(&self) -> u64 {
        self.kernel_page.load_u64(PROGRESS_COMPLETED_OFFSET, Ordering::Acquire).unwrap()
    }
    /// Stores the last-queued progress value (release), which a client publishes before the
    /// wptr that makes the work visible (spec 000).
    pub fn set_last_queued(&self, v: u64) {
        self.control.atomic_u64(self.control_base + LAST_QUEUED_OFFSET).unwrap().store(v, Ordering::Release);
    }
    /// Stores the wptr word (release), as a client publishing work does.
    pub fn set_wptr(&self, v: u64) {
        self.control.atomic_u64(self.control_base + WPTR_OFFSET).unwrap().store(v, Ordering::Release);
    }
    /// Writes dwords at ring offset `off` (taken modulo the ring size).
    pub fn write_ring(&self, off: u64, words: &[u32]) {
        let off = off % self.desc.ring_bytes;
        self.ring.write_u32s(self.ring_base + off, words).unwrap();
    }
    /// Reads dwords at ring offset `off`.
    pub fn read_ring(&self, off: u64, n: usize) -> Vec<u32> {
        let mut out = vec![0; n];
        self.ring.read_u32s(self.ring_base + off % self.desc.ring_bytes, &mut out).unwrap();
        out
    }
    /// Rings the doorbell with `v`, through the client's doorbell CPU page.
    pub fn ring_doorbell(&self, v: u64) {
        self.doorbell_page.atomic_u64(self.doorbell_offset).unwrap().store(v, Ordering::Release);
    }
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            rptr: self.rptr(),
            wptr: self.wptr(),
            last_queued: self.last_queued(),
            doorbell: self.doorbell_word(),
            status: self.status_word(),
        }
    }
}

#[derive(Default)]
struct TapState {
    allocs: abi::slab::KeyMap<AllocationHandle, AllocationInfo>,
    descs: abi::slab::KeyMap<HwQueueHandle, (QueueDescriptor, Mapping)>,
    queues: abi::slab::KeyMap<HwQueueHandle, Arc<TapQueue>>,
    calls: Vec<Call>,
}

/// A recording [`KernelPort`] around a real one. See the module docs.
pub struct TapPort {
    inner: Arc<dyn KernelPort>,
    state: Mutex<TapState>,
}

impl TapPort {
    pub fn new(inner: Arc<dyn KernelPort>) -> Arc<TapPort> {
        Arc::new(TapPort { inner, state: Mutex::new(TapState::default()) })
    }
    /// Opens a process on `sys` and wraps its port.
    pub fn open(sys: &System) -> Arc<TapPort> {
        TapPort::new(sys.open_process().expect("process"))
    }
    /// The wrapped port.
    pub fn inner(&self) -> &Arc<dyn KernelPort> {
        &self.inner
    }
    /// The calls seen so far.
    pub fn calls(&self) -> Vec<Call> {
        self.state.lock().unwrap().calls.clone()
    }
    /// Forgets the calls seen so far.
    pub fn clear_calls(&self) {
        self.state.lock().unwrap().calls.clear();
    }
    /// The memory of a user-mode queue created through this port.
    pub fn queue(&self, h: HwQueueHandle) -> Arc<TapQueue> {
        self.state
            .lock()
            .unwrap()
            .queues
            .get(&h)
            .cloned()
            .expect("a user-mode queue with a doorbell, created through the tap")
    }
    fn log(&self, c: Call) {
        self.state.lock().unwrap().calls.push(c);
    }
    fn snap(&self, q: HwQueueHandle) -> Option<Snapshot> {
        let tq = self.state.lock().unwrap().queues.get(&q).cloned();
        tq.map(|t| t.snapshot())
    }
}

impl TapPort {
    /// Logs `call` as the tests read it, with the queue's memory where they look at it.
    fn log_call(&self, call: &abi::port::Call<'_>) {
        use abi::port::Call as C;
        match call {
            C::ConnectDoorbell(queue) => {
                let snap = self.snap(*queue);
                self.log(Call::Connect(*queue, snap));
            }
            C::NotifyWorkSubmission(doorbell) => {
                let tq = self.state.lock().unwrap().queues.values().find(|q| q.doorbell == *doorbell).cloned();
                let tq = tq.expect("a doorbell created through the tap");
                self.log(Call::Notify(tq.handle, tq.snapshot()));
            }
            C::SubmitCommand { queue, .. } => self.log(Call::Submit(*queue)),
            C::WaitProgress { queue, value, .. } => self.log(Call::Wait(*queue, *value)),
            // Queries, and fences other than cross-adapter ones, are not logged.
            C::NativeFenceCaps
            | C::QueryQueue(_)
            | C::CreateNativeFence { .. }
            | C::OpenNativeFence { .. }
            | C::DestroyNativeFence(_)
            | C::SignalNativeFence { .. }
            | C::WaitNativeFences { .. }
            | C::QueryNativeFence(_)
            | C::QueryPhysicalDoorbell(_)
            | C::UserqSignal { .. }
            | C::UserqWait { .. }
            | C::OpenProgressFence(_) => {}
            other => self.log(Call::Other(other.name())),
        }
    }

    /// Keeps what the tests map a second time: allocations, user-mode queues' descriptors and
    /// kernel pages, and the memory behind each doorbell.
    fn note(&self, call: &abi::port::Call<'_>, reply: &Reply) -> Result<(), KernelError> {
        use abi::port::Call as C;
        match (call, reply) {
            (C::Allocate { .. }, Reply::Allocation(info)) => {
                self.state.lock().unwrap().allocs.insert(info.handle, *info);
            }
            (C::CreateHwQueue { desc, .. }, Reply::HwQueue(info)) => {
                if let SubmissionMode::UserMode(d) = desc.mode {
                    let kp = Mapping::new(info.kernel_page.fd(), info.kernel_page.file_offset(), 4096, Prot::ReadOnly)?;
                    self.state.lock().unwrap().descs.insert(info.handle, (d, kp));
                }
            }
            (C::CreateDoorbell(args), Reply::Doorbell(info)) => self.note_doorbell(args, info)?,
            _ => {}
        }
        Ok(())
    }

    fn note_doorbell(&self, args: &CreateDoorbell, info: &DoorbellInfo) -> Result<(), KernelError> {
        let ring = self.inner.map_allocation(args.ring_buffer)?;
        let control = self.inner.map_allocation(args.ring_control)?;
        let mut s = self.state.lock().unwrap();
        let (desc, kernel_page) = s.descs.remove(&args.queue).expect("queue created through the tap");
        let ring_va = s.allocs[&args.ring_buffer].va;
        let control_va = s.allocs[&args.ring_control].va;
        let tq = TapQueue {
            handle: args.queue,
            desc,
            doorbell: info.handle,
            ring_alloc: args.ring_buffer,
            control_alloc: args.ring_control,
            ring,
            ring_base: desc.ring_va - ring_va,
            control,
            control_base: desc.rptr_va - RPTR_OFFSET - control_va,
            doorbell_page: info.cpu_page.clone(),
            doorbell_offset: info.offset,
            ring_method: info.ring,
            aggregated: info.aggregated.clone(),
            kernel_page,
        };
        s.queues.insert(args.queue, Arc::new(tq));
        Ok(())
    }
}

impl KernelPort for TapPort {
    fn process(&self) -> ProcessId {
        self.inner.process()
    }
    fn adapter_info(&self) -> AdapterInfo {
        self.inner.adapter_info()
    }
    fn call(&self, call: &abi::port::Call<'_>) -> Result<Reply, KernelError> {
        self.log_call(call);
        let reply = self.inner.call(call)?;
        self.note(call, &reply)?;
        Ok(reply)
    }
}

/// A process driven through the raw port (no UMD): a device, a compute context, and a ring
/// allocation and a ring-control allocation ready for a user-mode queue descriptor.
pub struct RawProc {
    pub port: Arc<kernel::ProcessPort>,
    pub dev: DeviceHandle,
    pub ctx: ContextHandle,
    pub ring: AllocationInfo,
    pub ctl: AllocationInfo,
}

impl RawProc {
    pub fn open(sys: &System) -> RawProc {
        let port = sys.open_process().expect("process");
        let dev = port.create_device().expect("device");
        let ring = port.allocate(dev, &AllocationDesc::system(4096)).expect("ring");
        let ctl = port.allocate(dev, &AllocationDesc::system(4096)).expect("control");
        let ctx = port.create_context(dev, EngineId(0)).expect("context");
        RawProc { port, dev, ctx, ring, ctl }
    }
    /// A valid descriptor over `ring` and `ctl`.
    pub fn desc(&self, doorbell_index: u32) -> QueueDescriptor {
        QueueDescriptor {
            ring_va: self.ring.va,
            ring_bytes: 4096,
            rptr_va: self.ctl.va + RPTR_OFFSET,
            wptr_va: self.ctl.va + WPTR_OFFSET,
            last_queued_va: self.ctl.va + abi::ring::LAST_QUEUED_OFFSET,
            doorbell_index,
            priority: abi::Priority::Normal as u32,
            flags: 0,
            reserved: 0,
            context_save_va: 0,
            doorbell_page_va: 0,
        }
    }
    /// Creates a user-mode queue.
    pub fn create(&self, desc: QueueDescriptor) -> Result<HwQueueInfo, KernelError> {
        self.port.create_hw_queue(
            self.ctx,
            &HwQueueDesc { mode: SubmissionMode::UserMode(desc), priority: abi::Priority::Normal },
        )
    }
    /// Creates a kernel-mode queue.
    pub fn create_kernel(&self) -> Result<HwQueueInfo, KernelError> {
        self.port.create_hw_queue(
            self.ctx,
            &HwQueueDesc { mode: SubmissionMode::KernelMode, priority: abi::Priority::Normal },
        )
    }
    /// Creates a doorbell for `queue` over `ring` and `ctl`.
    pub fn doorbell(&self, queue: HwQueueHandle) -> Result<DoorbellInfo, KernelError> {
        self.port.create_doorbell(&CreateDoorbell {
            queue,
            ring_buffer: self.ring.handle,
            ring_control: self.ctl.handle,
        })
    }
}

/// The field and typed reason of an `InvalidArgument` refusal, if `e` is one.
pub fn refusal(e: &KernelError) -> Option<(&'static str, &abi::port::Invalid)> {
    match e {
        KernelError::InvalidArgument { field, reason, .. } => Some((field, reason)),
        _ => None,
    }
}

/// [`refusal`] of a kernel error the UMD passed on.
pub fn umd_refusal(e: &umd::UmdError) -> Option<(&'static str, &abi::port::Invalid)> {
    match e {
        umd::UmdError::Kernel(k) => refusal(k),
        _ => None,
    }
}

/// A kernel binary: the header, then the instructions.
pub fn binary(p: &[abi::isa::Inst]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for w in abi::isa::ProgramHeader::new(p.len() as u32).to_words() {
        bytes.extend_from_slice(&w.to_le_bytes());
    }
    for i in p {
        bytes.extend_from_slice(&i.encode().to_le_bytes());
    }
    bytes
}

/// A kernel that never ends: `loop { r1 += 1 }`.
pub fn forever() -> Vec<u8> {
    use abi::isa::{FLAG_IMM, Inst, Op};
    binary(&[
        Inst::new(Op::Loop, 0, 0, 0, 0, 2),
        Inst::new(Op::Add, 1, 1, 0, FLAG_IMM, 1),
        Inst::new(Op::EndLoop, 0, 0, 0, 0, 0),
    ])
}
