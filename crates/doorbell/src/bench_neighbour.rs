//! `doorbell bench neighbour`: what another process's bulk copies cost a tiny command buffer
//! on the same engine.
//!
//! Process B submits tiny command buffers (one `TIMESTAMP`) on a user-mode copy queue and
//! measures, as `bench submit` does, from just before its submit call to the engine starting
//! the packet (the `TIMESTAMP`, written with the device clock). It does so twice: with the
//! copy engine otherwise idle (`idle_tiny_p50_ns`, `idle_tiny_p99_ns`), and while process A
//! keeps the same engine saturated with large `FILL`s, four outstanding at all times
//! (`bulk_neighbour_tiny_p50_ns`, `bulk_neighbour_tiny_p99_ns`). `neighbour_bytes_per_s` is
//! what A moved meanwhile. Samples are spread in time (a pseudo-random gap of up to 200 µs
//! before each), so they land at every phase of the neighbour's work rather than in a burst
//! between two of its FILLs.
//!
//! The engine budgets each queue's turn by device time and cuts large `COPY`/`FILL`s at chunk
//! boundaries (`gpu::cost`), so B waits at most about one of A's turns. `--chunk` and
//! `--turn-us` change the two knobs; `--unsliced` sets both so large that a `FILL` runs whole,
//! as engines did before slicing, for a before/after comparison on the same machine.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use abi::EngineKind;
use abi::port::KernelPort;
use clap::Args;
use gpu::{CostModel, GpuConfig};
use kernel::{System, SystemConfig};
use umd::{Buffer, CommandBuffer, Device, Queue, QueueOptions};

use crate::measure::{cacheline_rtt_ns, latencies, percentiles, progress};
use crate::{CliError, num};

#[derive(Args)]
pub struct NeighbourArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Tiny command buffers measured per phase (1 to 1,000,000).
    #[arg(long, default_value_t = 1_000, value_parser = num::within(1u32, 1_000_000))]
    samples: u32,
    /// Bytes of each of the neighbour's FILLs (4096 to 1 GiB).
    #[arg(long, default_value_t = 64 << 20, value_parser = num::within(4096u64, 1 << 30))]
    fill_bytes: u64,
    /// The engine's bulk chunk in bytes (4 to 1 GiB): a COPY/FILL is cut at this boundary.
    #[arg(long, value_parser = num::within(4u64, 1 << 30))]
    chunk: Option<u64>,
    /// The device time one queue may run per turn, in microseconds (1 to 10,000,000).
    #[arg(long, value_parser = num::within(1u64, 10_000_000))]
    turn_us: Option<u64>,
    /// Run FILLs whole (chunk and turn as large as they go): the engine as it was before
    /// slicing, for comparison.
    #[arg(long, conflicts_with_all = ["chunk", "turn_us"])]
    unsliced: bool,
}

/// The engine's cost model as `--unsliced`, `--chunk` and `--turn-us` shape it.
fn cost_model(a: &NeighbourArgs) -> CostModel {
    let mut cost = CostModel::default();
    if a.unsliced {
        cost.bulk_chunk = 1 << 40;
        cost.turn = Duration::from_secs(3600);
    }
    if let Some(c) = a.chunk {
        cost.bulk_chunk = c;
    }
    if let Some(t) = a.turn_us {
        cost.turn = Duration::from_micros(t);
    }
    cost
}

/// The neighbour thread: when joined, the bytes it filled and how long that took.
type Neighbour = JoinHandle<Result<(u64, Duration), CliError>>;

/// The neighbour: a thread keeping four FILLs of `fill_bytes` on `big` outstanding on `bulk`
/// until `stop`; it answers the bytes it filled and how long that took, its last FILL checked.
fn spawn_neighbour(
    mut bulk: Queue,
    big: Buffer,
    fill_bytes: u64,
    stop: Arc<AtomicBool>,
) -> Result<Neighbour, CliError> {
    std::thread::Builder::new()
        .name("bench-neighbour".into())
        .spawn(move || -> Result<(u64, Duration), CliError> {
            // Four FILLs outstanding at all times until told to stop.
            const OUTSTANDING: u64 = 4;
            let start = Instant::now();
            let mut cb = CommandBuffer::new();
            let mut submitted = 0u64;
            let mut last = 0;
            // Acquire: pairs with the release store that ends the run.
            while !stop.load(Ordering::Acquire) {
                if submitted >= OUTSTANDING {
                    bulk.wait(last - OUTSTANDING + 1, Some(Duration::from_secs(60)))?;
                }
                cb.clear();
                cb.fill(big.va(), fill_bytes, submitted as u32);
                last = bulk.submit(&cb)?;
                submitted += 1;
            }
            bulk.wait(last, Some(Duration::from_secs(600)))?;
            let el = start.elapsed();
            if big.read_u32(fill_bytes - 4)? != (submitted - 1) as u32 {
                return Err(CliError::Check("neighbour: the last FILL is not what it wrote".into()));
            }
            Ok((submitted * fill_bytes, el))
        })
        .map_err(|e| CliError::Check(format!("could not start the neighbour thread: {e}")))
}

pub fn run(a: NeighbourArgs) -> Result<(), CliError> {
    let json = a.json;
    let cost = cost_model(&a);
    progress(json, "measuring the floor: cache-line round trip between two threads");
    let floor = cacheline_rtt_ns();

    let gpu = GpuConfig { idle_period: Duration::from_secs(3600), cost, ..GpuConfig::default() };
    let sys = System::live(SystemConfig { gpu, ..Default::default() })?;
    let open = |sys: &System| -> Result<(Arc<dyn KernelPort>, Device, umd::Context), CliError> {
        let port: Arc<dyn KernelPort> = sys.open_process()?;
        let dev = Device::open(port.clone())?;
        let ctx = dev.create_context(dev.engine(EngineKind::Copy)?)?;
        Ok((port, dev, ctx))
    };
    let (_pa, dev_a, ctx_a) = open(&sys)?;
    let (_pb, dev_b, ctx_b) = open(&sys)?;
    let buf = dev_b.allocate(1 << 16)?;
    let mut tiny = ctx_b.create_queue(QueueOptions::user_mode())?;
    tiny.set_spin(u32::MAX); // spin on memory: the waiting thread is not what is measured
    let samples = a.samples as usize;

    // A pseudo-random gap before each sample (xorshift; the same sequence every run).
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut gap = move || -> Result<(), CliError> {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let until = Instant::now() + Duration::from_nanos(seed % 200_000);
        while Instant::now() < until {
            std::hint::spin_loop();
        }
        Ok(())
    };

    progress(json, "tiny command buffers, the copy engine otherwise idle");
    latencies(&sys, &mut tiny, &buf, 200, || Ok(()))?; // warm-up
    let (idle_p50, idle_p99) = percentiles(latencies(&sys, &mut tiny, &buf, samples, &mut gap)?);

    progress(json, "tiny command buffers beside another process's bulk FILLs");
    let big = dev_a.allocate(a.fill_bytes)?;
    let mut bulk = ctx_a.create_queue(QueueOptions::user_mode())?;
    bulk.set_spin(0);
    let stop = Arc::new(AtomicBool::new(false));
    let neighbour = spawn_neighbour(bulk, big, a.fill_bytes, stop.clone())?;
    // Let the neighbour get its FILLs going before measuring.
    std::thread::sleep(Duration::from_millis(20));
    let measured = latencies(&sys, &mut tiny, &buf, samples, &mut gap);
    // Release: the neighbour's acquire load sees it and drains its FILLs.
    stop.store(true, Ordering::Release);
    let (bytes, el) = neighbour.join().map_err(|_| CliError::Check("the neighbour thread panicked".into()))??;
    let (bulk_p50, bulk_p99) = percentiles(measured?);
    let bytes_per_s = bytes as f64 / el.as_secs_f64();

    let floor_ns = floor.round() as u64;
    if json {
        let o = serde_json::json!({
            "idle_tiny_p50_ns": idle_p50,
            "idle_tiny_p99_ns": idle_p99,
            "bulk_neighbour_tiny_p50_ns": bulk_p50,
            "bulk_neighbour_tiny_p99_ns": bulk_p99,
            "neighbour_bytes_per_s": bytes_per_s.round() as u64,
            "floor_cacheline_rtt_ns": floor_ns,
            "samples": a.samples,
            "fill_bytes": a.fill_bytes,
            "chunk_bytes": cost.chunk_bytes(),
            "turn_ns": cost.turn.as_nanos() as u64,
        });
        outln!("{o}");
    } else {
        outln!(
            "doorbell bench neighbour ({} samples a phase; neighbour FILLs of {} bytes; chunk {} bytes, turn {:?})",
            a.samples,
            a.fill_bytes,
            cost.chunk_bytes(),
            cost.turn
        );
        let t = crate::measure::FloorTable::new(40, floor);
        t.ns("tiny p50, engine idle", idle_p50);
        t.ns("tiny p99, engine idle", idle_p99);
        t.ns("tiny p50, beside bulk FILLs", bulk_p50);
        t.ns("tiny p99, beside bulk FILLs", bulk_p99);
        outln!("{:<40} {:>9.2} GB/s", "neighbour's FILL rate meanwhile", bytes_per_s / 1e9);
    }
    Ok(())
}
