//! # baseline — CUDA's own submission path, measured
//!
//! doorbell's claim on a real GPU is that a user-mode submission beats the vendor's own launch
//! path by several times and comes within a small factor of the PCIe round trip, and that a
//! high-priority queue starts without waiting for another queue's thread groups to end. These
//! are the vendor path's figures that `doorbell bench --device cuda` prints beside its own, in
//! the same run on the same GPU, so that they read as ratios. The kernels are in
//! `device/baseline.cu`, compiled at run time by NVRTC.
//!
//! What each figure is (all times in nanoseconds, from the CPU's monotonic clock):
//!
//! - `launch_rtt`: the CPU launches a one-thread kernel (`probe_flag`) on an idle,
//!   non-blocking stream and spins until the value the kernel stores into pinned host memory
//!   appears; from just before the `cuLaunchKernel` call to the CPU seeing the value. This is
//!   what one small piece of work costs through CUDA's launch path, round trip.
//! - `launch_call`: the duration of the `cuLaunchKernel` call itself, inside each sample
//!   above: the CPU's share.
//! - `graph_launch_rtt`: the same round trip through a CUDA graph (one kernel node,
//!   captured from a stream and instantiated once; `probe_increment` writes one more each run,
//!   since a graph's arguments are fixed): CUDA's cheaper path for repeated work.
//! - `launches_per_s`: empty kernels launched back to back on one stream (200,000 with the
//!   default sample count), divided by the time until the stream drains.
//! - `pcie_doorbell_rtt`: a persistent one-thread kernel (`doorbell_echo`) polls a doorbell
//!   word in pinned host memory and echoes each new value into an acknowledgement word; the
//!   CPU writes the doorbell and spins on the acknowledgement. This is the floor of any
//!   doorbell whose consumer is on the GPU: one PCIe read that finds the new value, one PCIe
//!   write back.
//! - [`measure_priority_under_load`]: a low-priority stream keeps every SM full with
//!   `spin_blocks` (two blocks of 1024 threads per SM, each spinning for a set time), while a
//!   high-priority stream launches `probe_flag` at random gaps; each sample is the launch
//!   round trip as above. CUDA's priorities order the *blocks waiting* to start, they do not
//!   preempt running ones, so the probe waits for a resident block to finish. (A reference
//!   H200 gave p50 ≈ 704 µs, p99 ≈ 897 µs with 1 ms blocks.)
//!
//! Host-side protocol words live in one [`PinnedBuffer`], each in its own 64-byte line so
//! that the CPU's spinning on one does not disturb the GPU's accesses to another. The CPU
//! reads GPU-written words with `Acquire` loads and writes GPU-read words with `Release`
//! stores: each word is a flag that publishes "everything before me is done", and on x86-64
//! both are plain moves, so the orderings cost nothing in the figures. Every wait on the GPU
//! has a time limit and ends in [`CudaError::Timeout`], never a hang; persistent and load
//! kernels are told to stop, and waited for, on every exit path, error or not.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::driver::{Cuda, CudaError, DeviceBuffer, KernelArgs, Module, PinnedBuffer, Stream};

/// The source of the baseline kernels (`device/baseline.cu`).
pub const BASELINE_SOURCE: &str = include_str!("../device/baseline.cu");

/// The sample count `bench --device cuda` uses.
pub const DEFAULT_SAMPLES: usize = 1000;
/// Unrecorded rounds before the samples (the first launches load code and wake the GPU).
pub const DEFAULT_WARMUP: usize = 100;
/// The block length `bench --device cuda` uses for the load in
/// [`measure_priority_under_load`]: 1 ms.
pub const DEFAULT_BLOCK_NS: u64 = 1_000_000;

/// The longest any single wait on the GPU may take before it is reported as a timeout.
const WAIT: Duration = Duration::from_secs(5);

/// Byte offsets of the protocol words in the control buffer, one 64-byte line each.
const FLAG: usize = 0;
const GRAPH_FLAG: usize = 64;
const DOORBELL: usize = 128;
const ACK: usize = 192;
const QUIT: usize = 256;
const STOP: usize = 320;
const CONTROL_BYTES: usize = 4096;

const ONE: [u32; 3] = [1, 1, 1];

/// A latency distribution: nearest-rank percentiles of a set of samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Latency {
    /// Median.
    pub p50_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// Smallest sample.
    pub min_ns: u64,
    /// How many samples.
    pub samples: usize,
}

impl Latency {
    /// Sorts `samples` (nanoseconds) and takes nearest-rank percentiles: the p-th percentile
    /// is the smallest sample with at least p% of the samples at or below it. No samples give
    /// all zeros.
    pub fn from_samples(mut samples: Vec<u64>) -> Latency {
        samples.sort_unstable();
        let n = samples.len();
        let Some(&min_ns) = samples.first() else { return Latency::default() };
        let rank = |p: usize| samples[(p * n).div_ceil(100).clamp(1, n) - 1];
        Latency { p50_ns: rank(50), p99_ns: rank(99), min_ns, samples: n }
    }

    /// "p50 / p99 / min" for a table.
    fn cell(&self) -> String {
        format!("{} / {} / {}", self.p50_ns, self.p99_ns, self.min_ns)
    }

    fn json(&self, prefix: &str, out: &mut Vec<String>) {
        out.push(format!("\"{prefix}_p50_ns\":{}", self.p50_ns));
        out.push(format!("\"{prefix}_p99_ns\":{}", self.p99_ns));
        out.push(format!("\"{prefix}_min_ns\":{}", self.min_ns));
        out.push(format!("\"{prefix}_samples\":{}", self.samples));
    }
}

/// CUDA's own submission path on one GPU, measured by [`measure_cuda_path`].
#[derive(Debug, Clone, PartialEq)]
pub struct CudaPath {
    /// The device's name.
    pub device: String,
    /// Its streaming multiprocessors.
    pub sms: u32,
    /// Launch to the kernel's store seen by the CPU.
    pub launch_rtt: Latency,
    /// The `cuLaunchKernel` call alone.
    pub launch_call: Latency,
    /// Graph launch to the kernel's store seen by the CPU.
    pub graph_launch_rtt: Latency,
    /// Empty kernels per second, launched back to back on one stream.
    pub launches_per_s: f64,
    /// Doorbell write to a persistent kernel's acknowledgement seen by the CPU.
    pub pcie_doorbell_rtt: Latency,
}

/// `s` as a JSON string literal.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl CudaPath {
    /// One JSON object: `device`, `sms`, then `launch_rtt_p50_ns`, `launch_rtt_p99_ns`,
    /// `launch_rtt_min_ns`, `launch_rtt_samples` and the same four for `launch_call`,
    /// `graph_launch_rtt` and `pcie_doorbell_rtt`, and `launches_per_s`.
    pub fn to_json(&self) -> String {
        let mut fields = vec![format!("\"device\":{}", json_string(&self.device)), format!("\"sms\":{}", self.sms)];
        self.launch_rtt.json("launch_rtt", &mut fields);
        self.launch_call.json("launch_call", &mut fields);
        self.graph_launch_rtt.json("graph_launch_rtt", &mut fields);
        let rate = if self.launches_per_s.is_finite() { format!("{:.0}", self.launches_per_s) } else { "null".into() };
        fields.push(format!("\"launches_per_s\":{rate}"));
        self.pcie_doorbell_rtt.json("pcie_doorbell_rtt", &mut fields);
        format!("{{{}}}", fields.join(","))
    }

    /// (label, value) rows for a human-readable table; latencies as "p50 / p99 / min" ns.
    pub fn rows(&self) -> Vec<(&'static str, String)> {
        vec![
            ("device", format!("{} ({} SMs)", self.device, self.sms)),
            ("launch round trip, ns (p50 / p99 / min)", self.launch_rtt.cell()),
            ("launch call, ns (p50 / p99 / min)", self.launch_call.cell()),
            ("graph launch round trip, ns (p50 / p99 / min)", self.graph_launch_rtt.cell()),
            ("empty launches per second", format!("{:.0}", self.launches_per_s)),
            ("PCIe doorbell round trip, ns (p50 / p99 / min)", self.pcie_doorbell_rtt.cell()),
        ]
    }
}

/// Compiles `device/baseline.cu` for `cuda`'s device and loads it.
pub fn baseline_module(cuda: &Cuda) -> Result<Module, CudaError> {
    let image = cuda.compile("baseline.cu", BASELINE_SOURCE, &[], &[])?;
    cuda.load_module(&image)
}

fn word64(buf: &PinnedBuffer, offset: usize) -> Result<&AtomicU64, CudaError> {
    buf.atomic_u64(offset).ok_or_else(|| CudaError::BadInput { what: format!("no u64 at offset {offset}") })
}

fn word32(buf: &PinnedBuffer, offset: usize) -> Result<&AtomicU32, CudaError> {
    buf.atomic_u32(offset).ok_or_else(|| CudaError::BadInput { what: format!("no u32 at offset {offset}") })
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Spins until `word` holds `want`; returns the moment it was seen. After `limit`, reports
/// the stream's fault if it has one, else a timeout.
fn spin_until(word: &AtomicU64, want: u64, stream: &Stream, limit: Duration, what: &str) -> Result<Instant, CudaError> {
    let start = Instant::now();
    let mut polls: u32 = 0;
    loop {
        // Acquire: the GPU stores the word last (then fences at system scope), so whatever
        // it wrote before is visible once the word is; a plain move on x86-64.
        if word.load(Ordering::Acquire) == want {
            return Ok(Instant::now());
        }
        polls = polls.wrapping_add(1);
        if polls.is_multiple_of(1024) {
            let waited = start.elapsed();
            if waited > limit {
                stream.query()?;
                return Err(CudaError::Timeout {
                    // Relaxed: a diagnostic read; nothing depends on it.
                    what: format!("{what} (wanted {want}, saw {})", word.load(Ordering::Relaxed)),
                    after_ms: waited.as_millis() as u64,
                });
            }
        }
        std::hint::spin_loop();
    }
}

/// Ends GPU work on every exit path: on [`finish`](Settle::finish) or drop it raises `stop`
/// (if any) and waits for each stream, so nothing a kernel uses is freed under it.
struct Settle<'a> {
    stop: Option<&'a AtomicU32>,
    streams: Vec<&'a Stream>,
    limit: Duration,
    done: bool,
}

impl<'a> Settle<'a> {
    fn new(stop: Option<&'a AtomicU32>, streams: Vec<&'a Stream>, limit: Duration) -> Settle<'a> {
        Settle { stop, streams, limit, done: false }
    }

    fn settle(&mut self) -> Result<(), CudaError> {
        self.done = true;
        if let Some(stop) = self.stop {
            // Release: the kernels poll this word; nothing else need be ordered before it,
            // but a release store is free on x86-64 and states the word's role.
            stop.store(1, Ordering::Release);
        }
        let mut first = Ok(());
        for s in &self.streams {
            let r = s.wait(self.limit);
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    fn finish(mut self) -> Result<(), CudaError> {
        self.settle()
    }
}

impl Drop for Settle<'_> {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.settle();
        }
    }
}

/// Measures CUDA's launch path, graph path, launch throughput and the PCIe doorbell floor
/// on `cuda`'s device (see the module docs): `samples` recorded rounds of each after
/// `warmup` unrecorded ones (at least one), and `samples × 200` empty launches (between
/// 1,000 and 200,000) for the throughput.
pub fn measure_cuda_path(cuda: &Cuda, samples: usize, warmup: usize) -> Result<CudaPath, CudaError> {
    if samples == 0 {
        return Err(CudaError::BadInput { what: "0 samples".into() });
    }
    if !cuda.can_map_host_memory()? {
        return Err(CudaError::Unsupported { what: "the device cannot map host memory".into() });
    }
    let warmup = warmup.max(1);
    let device = cuda.name()?;
    let sms = cuda.sm_count()?;
    let module = baseline_module(cuda)?;
    let ctl = PinnedBuffer::new(cuda, CONTROL_BYTES)?;
    let (launch_rtt, launch_call) = measure_launch(cuda, &module, &ctl, samples, warmup)?;
    let graph_launch_rtt = measure_graph(cuda, &module, &ctl, samples, warmup)?;
    let launches_per_s = measure_throughput(cuda, &module, (samples * 200).clamp(1_000, 200_000))?;
    let pcie_doorbell_rtt = measure_doorbell(cuda, &module, &ctl, samples, warmup)?;
    Ok(CudaPath { device, sms, launch_rtt, launch_call, graph_launch_rtt, launches_per_s, pcie_doorbell_rtt })
}

/// `launch_rtt` and `launch_call`.
fn measure_launch(
    cuda: &Cuda,
    module: &Module,
    ctl: &PinnedBuffer,
    samples: usize,
    warmup: usize,
) -> Result<(Latency, Latency), CudaError> {
    let probe = module.function("probe_flag")?;
    let flag = word64(ctl, FLAG)?;
    // Relaxed: no kernel runs yet, and the launch below is ordered after this store.
    flag.store(0, Ordering::Relaxed);
    let stream = Stream::new(cuda, 0)?;
    let settle = Settle::new(None, vec![&stream], WAIT);
    let mut args = KernelArgs::new();
    let (mut rtt, mut call) = (Vec::with_capacity(samples), Vec::with_capacity(samples));
    for value in 1..=(warmup + samples) as u64 {
        args.clear();
        args.push_ptr(ctl.dev() + FLAG as u64).push_u64(value);
        let t0 = Instant::now();
        cuda.launch(&probe, ONE, ONE, 0, &stream, &args)?;
        let t1 = Instant::now();
        let t2 = spin_until(flag, value, &stream, WAIT, "probe_flag's store")?;
        stream.wait(WAIT)?;
        if value > warmup as u64 {
            rtt.push(nanos(t2 - t0));
            call.push(nanos(t1 - t0));
        }
    }
    settle.finish()?;
    Ok((Latency::from_samples(rtt), Latency::from_samples(call)))
}

/// `graph_launch_rtt`.
fn measure_graph(
    cuda: &Cuda,
    module: &Module,
    ctl: &PinnedBuffer,
    samples: usize,
    warmup: usize,
) -> Result<Latency, CudaError> {
    let probe = module.function("probe_increment")?;
    let flag = word64(ctl, GRAPH_FLAG)?;
    // Relaxed: no kernel runs yet, and the launches below are ordered after this store.
    flag.store(0, Ordering::Relaxed);
    let counter = DeviceBuffer::new(cuda, 8)?;
    counter.memset_u8(0)?;
    let stream = Stream::new(cuda, 0)?;
    let settle = Settle::new(None, vec![&stream], WAIT);
    let mut args = KernelArgs::new();
    args.push_ptr(ctl.dev() + GRAPH_FLAG as u64).push_ptr(counter.dev());
    stream.begin_capture()?;
    let captured = cuda.launch(&probe, ONE, ONE, 0, &stream, &args);
    // End the capture whatever the launch did, so the stream is usable again.
    let graph = stream.end_capture();
    captured?;
    let exec = graph?.instantiate()?;
    let mut rtt = Vec::with_capacity(samples);
    for value in 1..=(warmup + samples) as u64 {
        let t0 = Instant::now();
        exec.launch(&stream)?;
        let t1 = spin_until(flag, value, &stream, WAIT, "probe_increment's store (graph)")?;
        stream.wait(WAIT)?;
        if value > warmup as u64 {
            rtt.push(nanos(t1 - t0));
        }
    }
    settle.finish()?;
    Ok(Latency::from_samples(rtt))
}

/// `launches_per_s` over `n` empty launches.
fn measure_throughput(cuda: &Cuda, module: &Module, n: usize) -> Result<f64, CudaError> {
    let empty = module.function("empty_kernel")?;
    let stream = Stream::new(cuda, 0)?;
    let settle = Settle::new(None, vec![&stream], Duration::from_secs(60));
    let args = KernelArgs::new();
    for _ in 0..100 {
        cuda.launch(&empty, ONE, ONE, 0, &stream, &args)?;
    }
    stream.wait(WAIT)?;
    let t0 = Instant::now();
    for _ in 0..n {
        cuda.launch(&empty, ONE, ONE, 0, &stream, &args)?;
    }
    stream.wait(Duration::from_secs(60))?;
    let secs = t0.elapsed().as_secs_f64();
    settle.finish()?;
    Ok(if secs > 0.0 { n as f64 / secs } else { f64::INFINITY })
}

/// `pcie_doorbell_rtt`.
fn measure_doorbell(
    cuda: &Cuda,
    module: &Module,
    ctl: &PinnedBuffer,
    samples: usize,
    warmup: usize,
) -> Result<Latency, CudaError> {
    let echo = module.function("doorbell_echo")?;
    let (doorbell, ack, quit) = (word64(ctl, DOORBELL)?, word64(ctl, ACK)?, word32(ctl, QUIT)?);
    // Relaxed: no kernel runs yet, and the launch below is ordered after these stores.
    doorbell.store(0, Ordering::Relaxed);
    ack.store(0, Ordering::Relaxed);
    quit.store(0, Ordering::Relaxed);
    let stream = Stream::new(cuda, 0)?;
    let mut args = KernelArgs::new();
    let dev = ctl.dev();
    args.push_ptr(dev + DOORBELL as u64).push_ptr(dev + ACK as u64).push_ptr(dev + QUIT as u64);
    cuda.launch(&echo, ONE, ONE, 0, &stream, &args)?;
    // From here the kernel runs until told to quit: on every exit path, tell it and wait.
    let settle = Settle::new(Some(quit), vec![&stream], WAIT);
    let mut rtt = Vec::with_capacity(samples);
    // Ring 1 (untimed) waits for the kernel to start; then `warmup` untimed rounds.
    for value in 1..=(1 + warmup + samples) as u64 {
        let t0 = Instant::now();
        // Release: a doorbell publishes what was written before it (here nothing, but it
        // is the protocol's rule); a plain move on x86-64.
        doorbell.store(value, Ordering::Release);
        let t1 = spin_until(ack, value, &stream, WAIT, "doorbell_echo's acknowledgement")?;
        if value > 1 + warmup as u64 {
            rtt.push(nanos(t1 - t0));
        }
    }
    settle.finish()?;
    Ok(Latency::from_samples(rtt))
}

/// A xorshift64 generator: the gaps need only be irregular, not good random numbers.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

/// Launch round trips of a high-priority kernel while a low-priority stream keeps the whole
/// GPU busy (see the module docs). The load is `spin_blocks`: 2 × SMs blocks of 1024
/// threads, each spinning `block_ns` nanoseconds, relaunched back to back for the whole test;
/// the probes are `probe_flag` on a stream of the greatest priority, 100–500 µs apart
/// (irregular, so they do not lock to the load's period). `samples` probes are recorded,
/// after 10 unrecorded ones on the idle GPU.
pub fn measure_priority_under_load(cuda: &Cuda, block_ns: u64, samples: usize) -> Result<Latency, CudaError> {
    if block_ns == 0 || samples == 0 {
        return Err(CudaError::BadInput { what: format!("block_ns {block_ns}, samples {samples}: both must be > 0") });
    }
    if !cuda.can_map_host_memory()? {
        return Err(CudaError::Unsupported { what: "the device cannot map host memory".into() });
    }
    let sms = cuda.sm_count()?;
    let module = baseline_module(cuda)?;
    let spin = module.function("spin_blocks")?;
    let probe = module.function("probe_flag")?;
    let max_threads = spin.max_threads()?;
    if max_threads < 1024 {
        return Err(CudaError::Unsupported { what: format!("spin_blocks allows {max_threads} threads per block") });
    }
    let (least, greatest) = cuda.stream_priority_range()?;
    let ctl = PinnedBuffer::new(cuda, CONTROL_BYTES)?;
    let (flag, stop) = (word64(&ctl, FLAG)?, word32(&ctl, STOP)?);
    let low = Stream::new(cuda, least)?;
    let high = Stream::new(cuda, greatest)?;
    // A probe may wait for a whole block of the load to end.
    let limit = WAIT + Duration::from_nanos(block_ns.saturating_mul(2));
    let settle = Settle::new(Some(stop), vec![&low, &high], limit);
    let mut args = KernelArgs::new();
    let mut probe_once = |value: u64| -> Result<u64, CudaError> {
        args.clear();
        args.push_ptr(ctl.dev() + FLAG as u64).push_u64(value);
        let t0 = Instant::now();
        cuda.launch(&probe, ONE, ONE, 0, &high, &args)?;
        let t1 = spin_until(flag, value, &high, limit, "probe_flag's store under load")?;
        high.wait(limit)?;
        Ok(nanos(t1 - t0))
    };
    // Warm up on the idle GPU: the first launches load the code.
    for value in 1..=10 {
        probe_once(value)?;
    }

    // The load. Each kernel lasts at least `block_ns`, so after `elapsed` the GPU has run at
    // most elapsed / block_ns + 1 of them; keeping `lead` more than that enqueued keeps the
    // GPU full for the whole test, however the host's timing drifts.
    let mut spin_args = KernelArgs::new();
    spin_args.push_u64(block_ns).push_ptr(ctl.dev() + STOP as u64);
    let grid = [sms.saturating_mul(2), 1, 1];
    let lead = (20_000_000 / block_ns).clamp(4, 256);
    let start = Instant::now();
    let mut enqueued = 0u64;
    let top_up = |enqueued: &mut u64| -> Result<(), CudaError> {
        let due = nanos(start.elapsed()) / block_ns + 1 + lead;
        while *enqueued < due {
            cuda.launch(&spin, grid, [1024, 1, 1], 0, &low, &spin_args)?;
            *enqueued += 1;
        }
        Ok(())
    };
    top_up(&mut enqueued)?;
    // Let the load fill the GPU before the first probe.
    let fill = Duration::from_nanos(block_ns.saturating_mul(2)).max(Duration::from_millis(1));
    while start.elapsed() < fill {
        top_up(&mut enqueued)?;
        std::hint::spin_loop();
    }

    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    let mut rtt = Vec::with_capacity(samples);
    for i in 0..samples as u64 {
        let gap = Duration::from_micros(100 + rng.next() % 401);
        let gap_start = Instant::now();
        top_up(&mut enqueued)?;
        while gap_start.elapsed() < gap {
            std::hint::spin_loop();
        }
        rtt.push(probe_once(100 + i)?);
    }
    settle.finish()?;
    Ok(Latency::from_samples(rtt))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let l = Latency::from_samples((1..=100).rev().collect());
        assert_eq!((l.p50_ns, l.p99_ns, l.min_ns, l.samples), (50, 99, 1, 100));
        let l = Latency::from_samples(vec![7]);
        assert_eq!((l.p50_ns, l.p99_ns, l.min_ns, l.samples), (7, 7, 7, 1));
        let l = Latency::from_samples(vec![3, 1, 2]);
        assert_eq!((l.p50_ns, l.p99_ns, l.min_ns), (2, 3, 1));
        assert_eq!(Latency::from_samples(Vec::new()), Latency::default());
    }

    #[test]
    fn json_has_every_key_and_escapes_the_name() {
        let lat = Latency { p50_ns: 5, p99_ns: 9, min_ns: 1, samples: 3 };
        let p = CudaPath {
            device: "GPU \"x\"\\".into(),
            sms: 132,
            launch_rtt: lat,
            launch_call: lat,
            graph_launch_rtt: lat,
            launches_per_s: 123456.7,
            pcie_doorbell_rtt: lat,
        };
        let j = p.to_json();
        assert!(j.starts_with("{\"device\":\"GPU \\\"x\\\"\\\\\",\"sms\":132,"), "{j}");
        for prefix in ["launch_rtt", "launch_call", "graph_launch_rtt", "pcie_doorbell_rtt"] {
            for k in ["p50_ns\":5", "p99_ns\":9", "min_ns\":1", "samples\":3"] {
                assert!(j.contains(&format!("\"{prefix}_{k}")), "{prefix}_{k} in {j}");
            }
        }
        assert!(j.contains("\"launches_per_s\":123457"), "{j}");
        assert!(j.ends_with('}'));
        assert_eq!(p.rows().len(), 6);
    }

    #[test]
    fn xorshift_gaps_stay_in_range_and_vary() {
        let mut r = XorShift(0x9E37_79B9_7F4A_7C15);
        let gaps: Vec<u64> = (0..1000).map(|_| 100 + r.next() % 401).collect();
        assert!(gaps.iter().all(|g| (100..=500).contains(g)));
        assert!(gaps.iter().min() < Some(&150) && gaps.iter().max() > Some(&450));
    }
}
