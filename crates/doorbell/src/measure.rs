//! What the benchmarks (`bench.rs` and every `bench_*.rs`) share, below all of them: the
//! floor every latency is set against ([`cacheline_rtt_ns`]) and the table that prints the
//! ratio to it ([`FloorTable`]), percentiles as the simulator computes them, progress lines,
//! a live system with one client process ([`Rig`]) and the submit-to-first-packet sampler
//! ([`latencies`]), and the `--device` choice ([`DeviceKind`]). It uses no benchmark module, so
//! the benchmarks and their dispatcher in `bench.rs` form no import circle.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use abi::EngineKind;
use abi::port::KernelPort;
use gpu::GpuConfig;
use kernel::{System, SystemConfig};
use umd::{CommandBuffer, Device, Queue};

use crate::CliError;

/// Which hardware the engines' slots are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviceKind {
    /// The virtual GPU (engines on CPU threads).
    Virtual,
    /// An NVIDIA GPU: the engine program runs there (needs a GPU and its driver).
    Cuda,
    /// The engine program emulated on the CPU (a check of the path, not a GPU figure).
    Emulated,
}

/// A progress line on stderr, unless the output is JSON.
pub(crate) fn progress(json: bool, msg: &str) {
    if !json {
        eprintln!("  … {msg}");
    }
}

/// p50 and p99 of a sample set (nearest rank, as the simulator's figures:
/// [`sim::output::percentile`]; 0 for no samples).
pub(crate) fn percentiles(mut v: Vec<u64>) -> (u64, u64) {
    v.sort_unstable();
    (sim::output::percentile(&v, 50.0), sim::output::percentile(&v, 99.0))
}

/// A benchmark's human-readable table: each latency beside its ratio to the cache-line round
/// trip measured in the same run, labels `width` characters wide. Rows that are not latencies
/// (rates, counts, verdicts) are printed by the benchmark, in the same columns.
pub(crate) struct FloorTable {
    width: usize,
    floor: f64,
}

impl FloorTable {
    /// Prints the column heads and the floor's own row (`floor`: ns, as measured).
    pub(crate) fn new(width: usize, floor: f64) -> FloorTable {
        outln!("{:<width$} {:>12} {:>12}", "measure", "value", "x floor");
        outln!("{:<width$} {:>9} ns {:>12}", "floor: cache-line round trip", floor.round() as u64, "1.0");
        FloorTable { width, floor }
    }

    /// A latency row.
    pub(crate) fn ns(&self, label: &str, ns: u64) {
        let width = self.width;
        outln!("{label:<width$} {ns:>9} ns {:>12.1}", ns as f64 / self.floor.max(1.0));
    }
}

/// Median round trip of one cache line between two threads, in ns.
pub(crate) fn cacheline_rtt_ns() -> f64 {
    #[repr(align(128))]
    struct Line(AtomicU64);
    let mut runs = Vec::new();
    for _ in 0..5 {
        let line = Arc::new(Line(AtomicU64::new(0)));
        let n = 100_000u64;
        let other = line.clone();
        let t = std::thread::spawn(move || {
            for i in 0..n {
                // Acquire/Release: a plain hand-off; the ordering is not what is measured.
                while other.0.load(Ordering::Acquire) != 2 * i + 1 {
                    std::hint::spin_loop();
                }
                other.0.store(2 * i + 2, Ordering::Release);
            }
        });
        let start = Instant::now();
        for i in 0..n {
            line.0.store(2 * i + 1, Ordering::Release);
            while line.0.load(Ordering::Acquire) != 2 * i + 2 {
                std::hint::spin_loop();
            }
        }
        let el = start.elapsed();
        let _ = t.join();
        runs.push(el.as_nanos() as f64 / n as f64);
    }
    runs.sort_by(|a, b| a.total_cmp(b));
    runs[runs.len() / 2]
}

/// A live system, one client process with a device, and a context on each engine kind.
pub(crate) struct Rig {
    pub(crate) sys: System,
    _port: Arc<dyn KernelPort>,
    pub(crate) dev: Device,
    pub(crate) ctx: umd::Context,
    pub(crate) copy: umd::Context,
}

/// A [`Rig`] on a device configured by `gpu`.
pub(crate) fn rig_with(gpu: GpuConfig) -> Result<Rig, CliError> {
    let sys = System::live(SystemConfig { gpu, ..Default::default() })?;
    let port: Arc<dyn KernelPort> = sys.open_process()?;
    let dev = Device::open(port.clone())?;
    let ctx = dev.create_context(dev.engine(EngineKind::Compute)?)?;
    let copy = dev.create_context(dev.engine(EngineKind::Copy)?)?;
    Ok(Rig { sys, _port: port, dev, ctx, copy })
}

/// Submit-to-first-packet latencies of `samples` TIMESTAMP command buffers.
pub(crate) fn latencies(
    sys: &System,
    q: &mut Queue,
    buf: &umd::Buffer,
    samples: usize,
    mut before: impl FnMut() -> Result<(), CliError>,
) -> Result<Vec<u64>, CliError> {
    let slots = (buf.len() / 8) as usize;
    let mut out = Vec::with_capacity(samples);
    let mut cb = CommandBuffer::new();
    for i in 0..samples {
        before()?;
        let slot = (i % slots) as u64 * 8;
        cb.clear();
        cb.timestamp(buf.va() + slot);
        let t0 = sys.now();
        let v = q.submit(&cb)?;
        q.wait(v, Some(Duration::from_secs(10)))?;
        let ts = buf.read_u64(slot)?;
        out.push(ts.saturating_sub(t0.as_nanos()));
    }
    Ok(out)
}
