//! Conformance: the same work on the CPU engine and on hardware slots, compared bit for bit.
//!
//! The CPU engine (`gpu`'s virtual engines) is the reference: the spec's semantics as doorbell
//! implements them, tested sequence by sequence. A backend is right when it does what the
//! reference does, so these checks run a workload twice — once on a system with virtual
//! engines, once on one whose slots are `hw` — through the unchanged UMD, kernel and
//! firmware, and compare what each left in memory, and each fault record:
//!
//! - [`random_stream`]: a seeded stream of command buffers mixing every data packet
//!   (`WRITE_DATA`, `FILL`, `COPY` with overlaps and odd alignments, `SIGNAL`, `WAIT`,
//!   `NOP`, `INDIRECT_BUFFER`, `INTERRUPT`, `DISPATCH` of a read-modify-write kernel);
//! - [`bad_streams`]: one malformed or misdirected command buffer per queue, each of which must
//!   fault its queue with the reference's record (kind, fields, rptr, opcode).
//!
//! `TIMESTAMP` is excluded from the comparison by nature (it writes the clock).

use std::time::Duration;

use abi::packet::{DataWidth, Header, Opcode, Packet};
use abi::{EngineKind, Priority};
use gpu::hw::HardwareFactory;
use kernel::{System, SystemConfig};
use umd::{Buffer, CommandBuffer, Device, Queue, QueueOptions};

/// How long any wait of a check may take.
const WAIT: Option<Duration> = Some(Duration::from_secs(30));
/// Bytes of the data buffer the stream writes.
const DATA: u64 = 64 * 1024;
/// Threads (u32 words) the dispatch kernel updates.
const DISPATCH_WORDS: u64 = 1024;

/// Why a check could not run, or where the two runs differ.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// Setting up or running a system failed.
    #[error("{what}: {error}")]
    Run {
        /// What was being done.
        what: String,
        /// The error.
        error: String,
    },
    /// The two runs left different bytes.
    #[error(
        "{what}: byte {offset:#x} differs: reference {reference:#04x}, hardware {hardware:#04x} ({differing} bytes differ)"
    )]
    Differs {
        /// Which buffer.
        what: String,
        /// The first differing offset.
        offset: usize,
        /// Its value on the CPU engine.
        reference: u8,
        /// Its value on the hardware.
        hardware: u8,
        /// How many bytes differ.
        differing: usize,
    },
    /// A malformed stream faulted differently (or not at all) on the hardware.
    #[error("bad stream `{name}`: reference {reference}, hardware {hardware}")]
    FaultDiffers {
        /// The stream.
        name: &'static str,
        /// The reference's queue status.
        reference: String,
        /// The hardware's.
        hardware: String,
    },
}

fn run_err(what: impl Into<String>) -> impl FnOnce(umd::UmdError) -> CheckError {
    let what = what.into();
    move |e| CheckError::Run { what, error: e.to_string() }
}

/// How a check runs a system: deterministic (virtual time, the emulator) or live (a GPU).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Driver {
    /// `System::sim`.
    Sim,
    /// `System::live`.
    Live,
}

fn system(hw: Option<HardwareFactory>, driver: Driver) -> Result<System, CheckError> {
    let mut cfg = SystemConfig::default();
    cfg.gpu.hardware = hw;
    let sys = match driver {
        Driver::Sim => System::sim(cfg),
        Driver::Live => System::live(cfg),
    };
    sys.map_err(|e| CheckError::Run { what: "system".into(), error: e.to_string() })
}

/// A xorshift generator: the stream is a function of its seed alone.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The dispatch of the stream: every thread `t` below `n` does `w[t] = w[t] * 3 + t` (a
/// read-modify-write, so the order of dispatches shows).
const RMW_KERNEL: &str = "
    sarg s0, 0          ; the words
    sarg s1, 1          ; n
    builtin v0, %global_id.x
    vfroms v1, s1
    cmp.lt.u v2, v0, v1
    if v2
      shl v3, v0, 2
      ld.u32 v4, [s0 + v3]
      mul v4, v4, 3
      add v4, v4, v0
      st.u32 [s0 + v3], v4
    endif
";

/// What a stream left behind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamResult {
    /// The data buffer.
    pub data: Vec<u8>,
    /// The dispatch kernel's words.
    pub words: Vec<u8>,
    /// The queue's completed progress value.
    pub completed: u64,
}

/// Runs `submissions` command buffers drawn from `seed` on `sys`; returns the memory.
fn run_stream(sys: &System, seed: u64, submissions: usize) -> Result<StreamResult, CheckError> {
    let port = sys.open_process().map_err(|e| CheckError::Run { what: "process".into(), error: e.to_string() })?;
    let device = Device::open(port).map_err(run_err("device"))?;
    let engine = device.engine(EngineKind::Compute).map_err(run_err("engine"))?;
    let ctx = device.create_context(engine).map_err(run_err("context"))?;
    let mut q = ctx
        .create_queue(QueueOptions { priority: Priority::Normal, ..QueueOptions::user_mode() })
        .map_err(run_err("queue"))?;
    let data = device.allocate(DATA).map_err(run_err("data"))?;
    let stamps = device.allocate(4096).map_err(run_err("stamps"))?;
    let words = device.allocate(DISPATCH_WORDS * 4).map_err(run_err("words"))?;
    let kernel =
        program::assemble(RMW_KERNEL).map_err(|e| CheckError::Run { what: "assemble".into(), error: e.to_string() })?;
    let kernel = device.upload(&kernel.to_bytes()).map_err(run_err("kernel"))?;
    let args =
        device.upload(&program::examples::args_to_bytes(&[words.va(), DISPATCH_WORDS])).map_err(run_err("args"))?;
    // An indirect buffer: three writes into the last page of the data buffer.
    let mut ib = CommandBuffer::new();
    ib.write_u32(data.va() + DATA - 4096, 0x1b1b_0001).fill(data.va() + DATA - 4000, 100, 0x0102_0304).nop(3);
    let ib_buf =
        device.upload(&ib.words().iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<_>>()).map_err(run_err("ib"))?;
    // A word every WAIT finds passed.
    let gate = device.allocate(4096).map_err(run_err("gate"))?;
    gate.write_u64(0, 1 << 40).map_err(run_err("gate"))?;
    let mut rng = Rng(seed | 1);
    let mut last = 0;
    let area = DATA - 4096; // the stream's own bytes (the IB writes above)
    for n in 0..submissions {
        let mut cb = CommandBuffer::new();
        for _ in 0..1 + rng.below(4) {
            let va = data.va();
            match rng.below(12) {
                0 => {
                    cb.write_u32(va + rng.below(area / 4) * 4, rng.next() as u32);
                }
                1 => {
                    cb.write_u64(va + rng.below(area / 8) * 8, rng.next());
                }
                2 => {
                    let len = rng.below(300);
                    cb.fill(va + rng.below(area - len), len, rng.next() as u32);
                }
                3 | 4 => {
                    // Any alignment, overlapping or not, forward or backward.
                    let len = rng.below(400);
                    let src = rng.below(area - len);
                    let dst = if rng.below(2) == 0 {
                        rng.below(area - len)
                    } else {
                        (src + rng.below(64)).saturating_sub(rng.below(64)).min(area - len)
                    };
                    cb.copy(va + src, va + dst, len);
                }
                5 => {
                    cb.signal(va + rng.below(area / 8) * 8, rng.next());
                }
                6 => {
                    cb.wait(gate.va(), rng.below(1 << 40));
                }
                7 => {
                    cb.nop(1 + rng.below(4) as u16);
                }
                8 => {
                    cb.indirect(ib_buf.va(), ib.len() as u32);
                }
                9 => {
                    cb.interrupt(rng.below(1000) as u32);
                }
                10 => {
                    cb.timestamp(stamps.va() + rng.below(512) * 8);
                }
                _ => {
                    if n % 8 == 0 {
                        let groups = 1 + rng.below(4) as u32;
                        cb.dispatch(kernel.va(), [groups, 1, 1], [64 * (1 + rng.below(4)) as u32, 1, 1], args.va());
                    } else {
                        cb.write_u32(va + rng.below(area / 4) * 4, n as u32);
                    }
                }
            }
        }
        last = q.submit(&cb).map_err(run_err(format!("submission {n}")))?;
    }
    q.wait(last, WAIT).map_err(run_err("the last submission"))?;
    let read = |b: &Buffer| -> Result<Vec<u8>, CheckError> {
        let mut out = vec![0u8; b.len() as usize];
        b.read(0, &mut out).map_err(run_err("read back"))?;
        Ok(out)
    };
    let result = StreamResult { data: read(&data)?, words: read(&words)?, completed: q.completed() };
    drop((kernel, args, ib_buf, gate, stamps));
    Ok(result)
}

fn compare(what: &str, reference: &[u8], hardware: &[u8]) -> Result<(), CheckError> {
    let differing = reference.iter().zip(hardware).filter(|(a, b)| a != b).count();
    if let Some(offset) = reference.iter().zip(hardware).position(|(a, b)| a != b) {
        return Err(CheckError::Differs {
            what: what.into(),
            offset,
            reference: reference[offset],
            hardware: hardware[offset],
            differing,
        });
    }
    Ok(())
}

/// What [`random_stream`] compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamReport {
    /// Command buffers submitted on each system.
    pub submissions: usize,
    /// Bytes compared.
    pub bytes: usize,
    /// The progress value both reached.
    pub completed: u64,
}

/// Runs the seeded stream on the CPU engine and on `hw`, and compares everything it wrote.
pub fn random_stream(
    hw: HardwareFactory,
    driver: Driver,
    seed: u64,
    submissions: usize,
) -> Result<StreamReport, CheckError> {
    let reference = run_stream(&system(None, Driver::Sim)?, seed, submissions)?;
    let got = run_stream(&system(Some(hw), driver)?, seed, submissions)?;
    compare("data buffer", &reference.data, &got.data)?;
    compare("dispatch words", &reference.words, &got.words)?;
    if reference.completed != got.completed {
        return Err(CheckError::Run {
            what: "progress".into(),
            error: format!("reference completed {}, hardware {}", reference.completed, got.completed),
        });
    }
    Ok(StreamReport { submissions, bytes: reference.data.len() + reference.words.len(), completed: got.completed })
}

/// One malformed stream: a name, and how to build it from the process's buffers.
struct Bad {
    name: &'static str,
    build: fn(&Buffers, &mut CommandBuffer),
}

/// The buffers a bad stream may aim at.
struct Buffers {
    data: Buffer,
    kernel: Buffer,
    garbage: Buffer,
}

const BAD: &[Bad] = &[
    Bad {
        name: "version 2 header",
        build: |_, cb| {
            cb.raw(&[1 | 2 << 24]);
        },
    },
    Bad {
        name: "unknown opcode",
        build: |_, cb| {
            cb.raw(&[1 | 0x7f << 16 | 1 << 24]);
        },
    },
    Bad {
        name: "reserved flag",
        build: |_, cb| {
            cb.raw(&[Header::new(Opcode::Nop, 1).with_flags(4).0]);
        },
    },
    Bad {
        name: "zero length",
        build: |_, cb| {
            cb.raw(&[Header::new(Opcode::WriteData, 0).0]);
        },
    },
    Bad {
        name: "wrong length",
        build: |_, cb| {
            cb.raw(&[Header::new(Opcode::Signal, 3).0, 0, 0]);
        },
    },
    Bad {
        name: "write width 3",
        build: |b, cb| {
            let va = b.data.va();
            cb.raw(&[Header::new(Opcode::WriteData, 6).0, 3, va as u32, (va >> 32) as u32, 0, 0]);
        },
    },
    Bad {
        name: "write outside the mappings",
        build: |b, cb| {
            cb.write_u32(b.data.va() + (1 << 40), 1);
        },
    },
    Bad {
        name: "write past the end of a buffer",
        build: |b, cb| {
            cb.write_u64(b.data.va() + b.data.len() - 4, 1);
        },
    },
    Bad {
        name: "misaligned 64-bit write",
        build: |b, cb| {
            cb.write_u64(b.data.va() + 4, 1);
        },
    },
    Bad {
        name: "copy from outside",
        build: |b, cb| {
            cb.copy(b.data.va() + b.data.len() - 10, b.data.va(), 20);
        },
    },
    Bad {
        name: "fill past the end",
        build: |b, cb| {
            cb.fill(b.data.va() + 8, b.data.len(), 7);
        },
    },
    Bad {
        name: "misaligned wait",
        build: |b, cb| {
            cb.wait(b.data.va() + 4, 0);
        },
    },
    Bad {
        name: "signal outside",
        build: |_, cb| {
            cb.signal(0x10, 1);
        },
    },
    Bad {
        name: "fence signal on plain memory",
        build: |b, cb| {
            cb.packet(Packet::SignalFence { va: b.data.va(), value: 1 });
        },
    },
    Bad {
        name: "nested indirect buffer",
        build: |b, cb| {
            let mut inner = CommandBuffer::new();
            inner.indirect(b.data.va(), 5);
            let words: Vec<u8> = inner.words().iter().flat_map(|w| w.to_le_bytes()).collect();
            b.data.write(256, &words).expect("inside the buffer");
            cb.indirect(b.data.va() + 256, inner.len() as u32);
        },
    },
    Bad {
        name: "indirect buffer with a vmid on a user queue",
        build: |b, cb| {
            cb.packet(Packet::IndirectBuffer { va: b.data.va(), dwords: 1, vmid: 3 });
        },
    },
    Bad {
        name: "indirect buffer outside",
        build: |_, cb| {
            cb.indirect(0x1000, 4);
        },
    },
    Bad {
        name: "truncated packet in an indirect buffer",
        build: |b, cb| {
            b.data.write(512, &Header::new(Opcode::WriteData, 6).0.to_le_bytes()).expect("inside");
            cb.indirect(b.data.va() + 512, 3);
        },
    },
    Bad {
        name: "dispatch of garbage",
        build: |b, cb| {
            cb.dispatch(b.garbage.va(), [1, 1, 1], [32, 1, 1], b.data.va());
        },
    },
    Bad {
        name: "dispatch with an empty grid",
        build: |b, cb| {
            cb.dispatch(b.kernel.va(), [0, 1, 1], [32, 1, 1], b.data.va());
        },
    },
    Bad {
        name: "dispatch of 2048 threads a group",
        build: |b, cb| {
            cb.dispatch(b.kernel.va(), [1, 1, 1], [2048, 1, 1], b.data.va());
        },
    },
    Bad {
        name: "kernel store outside",
        build: |b, cb| {
            // args: words = far outside, n = 64
            b.data.write_u64(1024, b.data.va() + (1 << 41)).expect("inside");
            b.data.write_u64(1032, 64).expect("inside");
            cb.dispatch(b.kernel.va(), [1, 1, 1], [64, 1, 1], b.data.va() + 1024);
        },
    },
    Bad {
        name: "kernel load at a misaligned base",
        build: |b, cb| {
            b.data.write_u64(1024, b.data.va() + 2).expect("inside");
            b.data.write_u64(1032, 64).expect("inside");
            cb.dispatch(b.kernel.va(), [1, 1, 1], [64, 1, 1], b.data.va() + 1024);
        },
    },
    Bad {
        name: "dispatch arguments outside",
        build: |b, cb| {
            cb.dispatch(b.kernel.va(), [1, 1, 1], [32, 1, 1], 0x20);
        },
    },
    Bad {
        name: "good work, then a write-data past it",
        build: |b, cb| {
            cb.write_u32(b.data.va(), 5).fill(b.data.va() + 8, 16, 1);
            cb.packet(Packet::WriteData { width: DataWidth::U64, va: b.data.va() + 3, value: 9 });
        },
    },
];

/// Runs each malformed stream on a fresh queue of the CPU engine and of `hw`; every one must
/// fault the same way (the queue's status: state, fault record, completed value). Returns how
/// many were compared.
pub fn bad_streams(hw: HardwareFactory, driver: Driver) -> Result<usize, CheckError> {
    let run = |sys: &System| -> Result<Vec<String>, CheckError> {
        let port = sys.open_process().map_err(|e| CheckError::Run { what: "process".into(), error: e.to_string() })?;
        let device = Device::open(port).map_err(run_err("device"))?;
        let engine = device.engine(EngineKind::Compute).map_err(run_err("engine"))?;
        let ctx = device.create_context(engine).map_err(run_err("context"))?;
        let kernel = program::assemble(RMW_KERNEL)
            .map_err(|e| CheckError::Run { what: "assemble".into(), error: e.to_string() })?;
        let b = Buffers {
            data: device.allocate(8192).map_err(run_err("data"))?,
            kernel: device.upload(&kernel.to_bytes()).map_err(run_err("kernel"))?,
            garbage: device.upload(&[0x5a; 64]).map_err(run_err("garbage"))?,
        };
        let mut out = Vec::new();
        for bad in BAD {
            let mut q: Queue = ctx
                .create_queue(QueueOptions { priority: Priority::Normal, ..QueueOptions::user_mode() })
                .map_err(run_err("queue"))?;
            let mut cb = CommandBuffer::new();
            (bad.build)(&b, &mut cb);
            let v = q.submit(&cb).map_err(run_err(bad.name))?;
            // It faults: the wait reports the loss.
            let _ = q.wait(v, WAIT);
            let s = q.status().map_err(run_err(bad.name))?;
            out.push(format!("{:?} fault={:?} completed={}", s.state, s.fault, s.completed));
        }
        Ok(out)
    };
    let reference = run(&system(None, Driver::Sim)?)?;
    let got = run(&system(Some(hw), driver)?)?;
    for ((bad, r), h) in BAD.iter().zip(&reference).zip(&got) {
        if r != h || !r.contains("fault=Some") {
            return Err(CheckError::FaultDiffers { name: bad.name, reference: r.clone(), hardware: h.clone() });
        }
    }
    Ok(BAD.len())
}

/// What [`recovery`] saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveryReport {
    /// The hung queue's fault, as its status reports it.
    pub hung_fault: String,
    /// Command buffers the neighbour completed, all with correct results.
    pub neighbour_completed: u64,
    /// Recoveries the firmware logged (queue, engine and adapter resets).
    pub recoveries: u64,
}

/// Timeout detection and recovery, and abnormal termination, on hardware slots (live driver):
/// a queue runs an endless kernel on an engine that cannot stop a dispatch part-way
/// (`Dispatch` granularity), so the per-queue hang timer's preemption request goes unanswered
/// and the queue is reset; another process is killed while its long dispatch runs (its
/// contexts' preemption owed, recovered the same way); a third process's queue, on the same
/// engine throughout, must finish every command buffer with correct results.
pub fn recovery(hw: HardwareFactory) -> Result<RecoveryReport, CheckError> {
    use abi::preempt::{ComputeGranularity, PreemptionCaps};
    let mut cfg = SystemConfig::default();
    cfg.gpu.hardware = Some(hw);
    cfg.gpu.hw_slots = 4;
    cfg.gpu.idle_period = Duration::from_secs(3600);
    cfg.gpu.preemption = PreemptionCaps { compute: ComputeGranularity::Dispatch, ..PreemptionCaps::default() };
    cfg.tdr = kernel::TdrConfig {
        delay: Duration::from_millis(100),
        hang_compute: Some(Duration::from_millis(100)),
        ..kernel::TdrConfig::default()
    };
    let sys = System::live(cfg).map_err(|e| CheckError::Run { what: "system".into(), error: e.to_string() })?;
    let open = |what: &str| -> Result<(abi::ProcessId, Device, umd::Context), CheckError> {
        let port = sys.open_process().map_err(|e| CheckError::Run { what: what.into(), error: e.to_string() })?;
        let pid = abi::port::KernelPort::process(&*port);
        let dev = Device::open(port).map_err(run_err(what))?;
        let ctx = dev.create_context(dev.engine(EngineKind::Compute).map_err(run_err(what))?).map_err(run_err(what))?;
        Ok((pid, dev, ctx))
    };
    let queue = |ctx: &umd::Context, what: &str| ctx.create_queue(QueueOptions::user_mode()).map_err(run_err(what));
    // The neighbour: command buffers of a kernel with a known result.
    let (_, ndev, nctx) = open("neighbour")?;
    let mut nq = queue(&nctx, "neighbour")?;
    let rounds = 2000;
    let out = ndev.allocate(256 * 4).map_err(run_err("neighbour"))?;
    let kernel = ndev.upload(&program::workloads::rounds().to_bytes()).map_err(run_err("neighbour"))?;
    let args = ndev.upload(&program::workloads::rounds_args(out.va(), rounds)).map_err(run_err("neighbour"))?;
    let mut ncb = CommandBuffer::new();
    ncb.dispatch(kernel.va(), [4, 1, 1], [64, 1, 1], args.va());
    // The hung queue: an endless kernel.
    let (_, hdev, hctx) = open("hung")?;
    let mut hq = queue(&hctx, "hung")?;
    let forever = hdev.upload(&program::workloads::forever().to_bytes()).map_err(run_err("hung"))?;
    let mut hcb = CommandBuffer::new();
    hcb.dispatch(forever.va(), [1, 1, 1], [32, 1, 1], forever.va());
    hq.submit(&hcb).map_err(run_err("hung"))?;
    // The doomed process: a very long dispatch, killed while it runs.
    let (dpid, ddev, dctx) = open("killed")?;
    let mut dq = queue(&dctx, "killed")?;
    let dout = ddev.allocate(256 * 4).map_err(run_err("killed"))?;
    let dkernel = ddev.upload(&program::workloads::rounds().to_bytes()).map_err(run_err("killed"))?;
    let dargs = ddev.upload(&program::workloads::rounds_args(dout.va(), 50_000_000)).map_err(run_err("killed"))?;
    let mut dcb = CommandBuffer::new();
    dcb.dispatch(dkernel.va(), [4, 1, 1], [64, 1, 1], dargs.va());
    dq.submit(&dcb).map_err(run_err("killed"))?;
    let mut last = 0;
    for _ in 0..4 {
        last = nq.submit(&ncb).map_err(run_err("neighbour"))?;
    }
    std::thread::sleep(Duration::from_millis(5));
    sys.terminate(dpid, kernel::Termination::Abnormal);
    for _ in 0..4 {
        last = nq.submit(&ncb).map_err(run_err("neighbour"))?;
    }
    nq.wait(last, WAIT).map_err(run_err("the neighbour's last command buffer"))?;
    let want = program::workloads::rounds_result(rounds);
    for i in 0..256u64 {
        let got = out.read_u32(i * 4).map_err(run_err("neighbour"))?;
        if got != want {
            return Err(CheckError::Run { what: "neighbour".into(), error: format!("thread {i}: {got}, want {want}") });
        }
    }
    // The endless queue is reset by the hang timer (if it was not yet: wait for it).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let hung = loop {
        let s = hq.status().map_err(run_err("hung"))?;
        if s.fault.is_some() {
            break s;
        }
        if std::time::Instant::now() > deadline {
            return Err(CheckError::Run { what: "hung".into(), error: "the endless queue was never reset".into() });
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let recoveries = sys.with_gpu(|g| g.firmware_counts().recoveries());
    drop((kernel, args, forever, dkernel, dargs));
    Ok(RecoveryReport { hung_fault: format!("{:?}", hung.fault), neighbour_completed: nq.completed(), recoveries })
}

/// A process keeping a queue busy with dispatches of the rounds kernel (4 workgroups of 64
/// threads, `rounds` rounds each), whose results it checks.
pub struct Spinner {
    pid: abi::ProcessId,
    _dev: Device,
    _ctx: umd::Context,
    q: Queue,
    out: Buffer,
    cb: CommandBuffer,
    last: u64,
    rounds: u32,
    _bufs: (Buffer, Buffer),
}

impl Spinner {
    /// A new process on `sys` with one user-mode queue of `priority`.
    pub fn new(sys: &System, priority: Priority, rounds: u32) -> Result<Spinner, CheckError> {
        let port = sys.open_process().map_err(|e| CheckError::Run { what: "process".into(), error: e.to_string() })?;
        let pid = abi::port::KernelPort::process(&*port);
        let dev = Device::open(port).map_err(run_err("device"))?;
        let ctx = dev
            .create_context(dev.engine(EngineKind::Compute).map_err(run_err("engine"))?)
            .map_err(run_err("context"))?;
        let q = ctx.create_queue(QueueOptions { priority, ..QueueOptions::user_mode() }).map_err(run_err("queue"))?;
        let kernel = dev.upload(&program::workloads::rounds().to_bytes()).map_err(run_err("kernel"))?;
        let out = dev.allocate(256 * 4).map_err(run_err("out"))?;
        let args = dev.upload(&program::workloads::rounds_args(out.va(), rounds)).map_err(run_err("args"))?;
        let mut cb = CommandBuffer::new();
        cb.dispatch(kernel.va(), [4, 1, 1], [64, 1, 1], args.va());
        Ok(Spinner { pid, _dev: dev, _ctx: ctx, q, out, cb, last: 0, rounds, _bufs: (kernel, args) })
    }

    /// Submits `n` command buffers of one dispatch each.
    pub fn submit(&mut self, n: usize) -> Result<(), CheckError> {
        for _ in 0..n {
            self.last = self.q.submit(&self.cb).map_err(run_err("spinner"))?;
        }
        Ok(())
    }

    /// Its process.
    pub fn pid(&self) -> abi::ProcessId {
        self.pid
    }

    /// Its queue.
    pub fn queue(&self) -> &Queue {
        &self.q
    }

    /// Waits for everything submitted, then checks every thread's result.
    pub fn check(&self) -> Result<(), CheckError> {
        self.q.wait(self.last, WAIT).map_err(run_err("spinner's last command buffer"))?;
        let want = program::workloads::rounds_result(self.rounds);
        for i in 0..256u64 {
            let got = self.out.read_u32(i * 4).map_err(run_err("spinner"))?;
            if got != want {
                return Err(CheckError::Run {
                    what: "spinner".into(),
                    error: format!("thread {i}: {got}, want {want}"),
                });
            }
        }
        Ok(())
    }
}

/// What [`preemptions`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreemptReport {
    /// Kernel preemption requests answered (each resumed).
    pub requests: u32,
    /// High-priority submissions that took a busy slot.
    pub high: u32,
    /// States the firmware logged saved (dispatches stopped part-way).
    pub states_saved: u64,
}

/// Preemption on hardware slots (live driver): kernel preemption requests against a queue in
/// the middle of long dispatches (each answered, then resumed), and a high-priority queue
/// taking one of two busy slots again and again; every low-priority dispatch must finish with
/// its exact results.
pub fn preemptions(hw: HardwareFactory) -> Result<PreemptReport, CheckError> {
    let mut cfg = SystemConfig::default();
    cfg.gpu.hardware = Some(hw);
    cfg.gpu.hw_slots = 2;
    cfg.gpu.idle_period = Duration::from_secs(3600);
    let sys = System::live(cfg).map_err(|e| CheckError::Run { what: "system".into(), error: e.to_string() })?;
    let mut lows = Vec::new();
    for _ in 0..2 {
        let mut s = Spinner::new(&sys, Priority::Low, 20_000)?;
        s.submit(3)?;
        lows.push(s);
    }
    let requests = 20;
    for _ in 0..requests {
        std::thread::sleep(Duration::from_micros(300));
        let ticket = sys
            .preempt_queue(lows[0].pid, lows[0].q.handle())
            .map_err(|e| CheckError::Run { what: "preempt".into(), error: e.to_string() })?;
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while sys.preempt_answer(ticket).is_none() {
            if std::time::Instant::now() > deadline {
                return Err(CheckError::Run { what: "preempt".into(), error: format!("request {ticket} unanswered") });
            }
            std::thread::yield_now();
        }
        sys.resume_queue(lows[0].pid, lows[0].q.handle())
            .map_err(|e| CheckError::Run { what: "resume".into(), error: e.to_string() })?;
    }
    let dev =
        Device::open(sys.open_process().map_err(|e| CheckError::Run { what: "process".into(), error: e.to_string() })?)
            .map_err(run_err("device"))?;
    let ctx =
        dev.create_context(dev.engine(EngineKind::Compute).map_err(run_err("engine"))?).map_err(run_err("context"))?;
    let mut hq = ctx
        .create_queue(QueueOptions { priority: Priority::High, ..QueueOptions::user_mode() })
        .map_err(run_err("queue"))?;
    let buf = dev.allocate(4096).map_err(run_err("buffer"))?;
    let high = 50;
    for i in 0..high {
        let mut cb = CommandBuffer::new();
        cb.write_u32(buf.va(), i);
        let v = hq.submit(&cb).map_err(run_err("high"))?;
        hq.wait(v, WAIT).map_err(run_err("high"))?;
        let got = buf.read_u32(0).map_err(run_err("high"))?;
        if got != i {
            return Err(CheckError::Run { what: "high".into(), error: format!("wrote {i}, read {got}") });
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    for l in &lows {
        l.check()?;
    }
    let states_saved = sys.with_gpu(|g| g.firmware_counts().states_saved);
    Ok(PreemptReport { requests, high, states_saved })
}
