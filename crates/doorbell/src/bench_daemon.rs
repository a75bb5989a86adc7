//! `doorbell bench submit --daemon`: the submit benchmark from a client process against a
//! daemon this command starts (`doorbell serve` as a child process), beside the embedded
//! figure and the peers a multi-process design is compared with, all measured in this run:
//!
//! - `um_p50_ns`, `um_p99_ns`: submit until the engine starts the first packet (a
//!   `TIMESTAMP` on the device clock, which the client reads from `CLOCK_MONOTONIC` and the
//!   daemon's epoch, no call), from this process to the daemon's engine;
//! - `um_roundtrip_p50_ns`: submit until this process sees the progress fence complete;
//! - `km_p50_ns`: the kernel-mode path, which now crosses the socket;
//! - `um_blocked_wakeup_futex_p50_ns`, `um_blocked_wakeup_socket_p50_ns`: a client thread
//!   blocked in a wait (no spin), from the engine passing the progress fence to the thread
//!   running again, sleeping on its wake word (the default) and reading the socket instead;
//! - `um_throughput_per_s`: tiny command buffers on one queue, until the last completes;
//! - `embedded_um_p50_ns`: `um_p50_ns` of the embedded mode, same run;
//! - `floor_cacheline_rtt_ns`: one cache line bounced between two threads;
//! - peers between two processes (this one and a child, `doorbell bench peer`), one-way
//!   handoff p50 of an 8-byte message: `peer_spsc_ring_p50_ns` (a shared-memory slot with a
//!   spinning consumer: this design's floor), `peer_unix_socket_p50_ns` (a stream socket, the
//!   consumer blocked in `read`), `peer_futex_wake_p50_ns` (the consumer blocked in
//!   `FUTEX_WAIT` on a shared word); and io_uring with a kernel polling thread (`SQPOLL`), the
//!   nearest design in Linux, whose completion is visible only as a round trip:
//!   `peer_io_uring_sqpoll_roundtrip_p50_ns` (a NOP from submission to its completion entry)
//!   and `peer_io_uring_nop_per_s`. Where io_uring is unavailable, those are `null` and
//!   `peer_io_uring_unavailable` says why.
//!
//! Peers run before the daemon starts, so its busy-polling firmware thread does not take
//! their core.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use abi::EngineKind;
use clap::Args;
use umd::{CommandBuffer, Device, QueueOptions};
use wire::client::RemotePort;

use crate::child::DaemonChild;

use crate::CliError;
use crate::measure::{cacheline_rtt_ns, percentiles, progress};

/// Byte offsets in the peers' shared page: each word on its own cache line.
const SEQ: u64 = 0;
const TS: u64 = 128;
const ACK: u64 = 256;
const RESULTS: u64 = 4096;

fn mono_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

fn err(what: &str) -> impl FnOnce(String) -> CliError + '_ {
    move |e| CliError::Check(format!("{what}: {e}"))
}

/// `doorbell bench peer` (hidden): the child side of a peer measurement.
#[derive(Args)]
pub struct PeerArgs {
    /// spsc, socket or futex.
    #[arg(long)]
    kind: String,
    /// The shared page, as a path (`/proc/PID/fd/N`).
    #[arg(long)]
    shm: PathBuf,
    /// Messages.
    #[arg(long)]
    samples: u64,
    /// The socket (kind `socket`).
    #[arg(long)]
    socket: Option<PathBuf>,
}

fn map_shared(path: &Path, samples: u64) -> Result<shm::Mapping, CliError> {
    let f =
        std::fs::OpenOptions::new().read(true).write(true).open(path).map_err(|e| err("shared page")(e.to_string()))?;
    shm::Mapping::new(std::os::fd::AsFd::as_fd(&f), 0, (RESULTS + 8 * samples) as usize, shm::Prot::ReadWrite)
        .map_err(|e| err("shared page")(e.to_string()))
}

/// The consumer: takes `samples` messages, records each one-way latency, acknowledges each.
pub fn peer(a: PeerArgs) -> Result<(), CliError> {
    let m = map_shared(&a.shm, a.samples)?;
    let (seq, ts, ack) = (m.atomic_u64(SEQ)?, m.atomic_u64(TS)?, m.atomic_u64(ACK)?);
    let fseq = m.atomic_u32(SEQ)?;
    let mut sock = match &a.socket {
        Some(p) => Some(std::os::unix::net::UnixStream::connect(p).map_err(|e| err("socket")(e.to_string()))?),
        None => None,
    };
    for i in 1..=a.samples {
        let sent = match a.kind.as_str() {
            "spsc" => {
                // Acquire: the timestamp stored before the sequence number is visible.
                while seq.load(Ordering::Acquire) != i {
                    std::hint::spin_loop();
                }
                // Relaxed: ordered after the producer's store by the sequence number's
                // Release/Acquire pair.
                ts.load(Ordering::Relaxed)
            }
            "futex" => {
                // Acquire as for spsc; the low 32 bits are the futex word.
                while seq.load(Ordering::Acquire) != i {
                    let _ =
                        rustix::thread::futex::wait(fseq, rustix::thread::futex::Flags::empty(), (i - 1) as u32, None);
                }
                ts.load(Ordering::Relaxed)
            }
            "socket" => {
                let mut b = [0u8; 8];
                sock.as_mut()
                    .ok_or_else(|| CliError::Input("--socket".into()))?
                    .read_exact(&mut b)
                    .map_err(|e| err("read")(e.to_string()))?;
                u64::from_le_bytes(b)
            }
            k => return Err(CliError::Input(format!("--kind {k}: spsc, socket or futex"))),
        };
        let now = mono_ns();
        m.write_u64(RESULTS + 8 * (i - 1), now.saturating_sub(sent))?;
        // Release: the result is written before the acknowledgement.
        ack.store(i, Ordering::Release);
    }
    Ok(())
}

/// One peer measurement: the child consumes, this process produces; one message in flight.
fn peer_p50(kind: &str, samples: u64) -> Result<u64, CliError> {
    let page = shm::Shm::new("bench-peer", (RESULTS + 8 * samples) as usize)?;
    let path = format!("/proc/{}/fd/{}", std::process::id(), page.fd().as_raw_fd());
    let dir = std::env::temp_dir().join(format!("doorbell-peer-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let sock_path = dir.join("peer.sock");
    let _ = std::fs::remove_file(&sock_path);
    let listener = if kind == "socket" {
        Some(std::os::unix::net::UnixListener::bind(&sock_path).map_err(|e| err("bind")(e.to_string()))?)
    } else {
        None
    };
    let mut cmd =
        crate::child::command(["bench", "peer", "--kind", kind, "--shm", &path, "--samples", &samples.to_string()])?;
    if listener.is_some() {
        cmd.args(["--socket", sock_path.to_str().unwrap_or_default()]);
    }
    let mut child = cmd.stdin(Stdio::null()).spawn().map_err(|e| err("spawn")(e.to_string()))?;
    let mut stream = match &listener {
        Some(l) => Some(l.accept().map_err(|e| err("accept")(e.to_string()))?.0),
        None => None,
    };
    let (seq, ts, ack) = (page.atomic_u64(SEQ)?, page.atomic_u64(TS)?, page.atomic_u64(ACK)?);
    let fseq = page.atomic_u32(SEQ)?;
    let deadline = Instant::now() + Duration::from_secs(120);
    for i in 1..=samples {
        if kind != "spsc" {
            // Give the consumer time to block (in read or FUTEX_WAIT): what is measured is a
            // wake-up, not a consumer still spinning back from the last message.
            let until = Instant::now() + Duration::from_micros(30);
            while Instant::now() < until {
                std::hint::spin_loop();
            }
        }
        let now = mono_ns();
        match kind {
            "socket" => {
                let s = stream.as_mut().ok_or_else(|| CliError::Check("no stream".into()))?;
                s.write_all(&now.to_le_bytes()).map_err(|e| err("write")(e.to_string()))?;
            }
            _ => {
                // Relaxed: published by the Release store of the sequence number below.
                ts.store(now, Ordering::Relaxed);
                // Release: the timestamp is visible before the sequence number.
                seq.store(i, Ordering::Release);
                if kind == "futex" {
                    let _ = rustix::thread::futex::wake(fseq, rustix::thread::futex::Flags::empty(), 1);
                }
            }
        }
        // Acquire: the child's result is visible once its acknowledgement is.
        while ack.load(Ordering::Acquire) != i {
            if Instant::now() > deadline {
                let _ = child.kill();
                return Err(CliError::Check(format!("peer {kind}: no acknowledgement of message {i}")));
            }
            std::hint::spin_loop();
        }
    }
    let st = child.wait().map_err(|e| err("wait")(e.to_string()))?;
    let _ = std::fs::remove_dir_all(&dir);
    if !st.success() {
        return Err(CliError::Check(format!("peer {kind} exited with {st}")));
    }
    let mut v = Vec::with_capacity(samples as usize);
    for i in 0..samples {
        v.push(page.read_u64(RESULTS + 8 * i)?);
    }
    // The first messages pay for page faults and the child's start.
    let warm = (samples / 10) as usize;
    Ok(percentiles(v.split_off(warm)).0)
}

/// io_uring with SQPOLL: NOP round-trip p50 and NOPs per second, or why it is unavailable.
fn io_uring_peer(samples: u64) -> Result<(u64, u64), String> {
    let mut ring: io_uring::IoUring = io_uring::IoUring::builder()
        .setup_sqpoll(2000)
        .build(256)
        .map_err(|e| format!("io_uring_setup with SQPOLL refused: {e}"))?;
    let nop = io_uring::opcode::Nop::new().build();
    let one = |ring: &mut io_uring::IoUring, n: usize| -> Result<(), String> {
        for k in 0..n {
            // SAFETY: a NOP references no memory; the entry is copied into the ring.
            unsafe { ring.submission().push(&nop.clone().user_data(k as u64)) }.map_err(|e| e.to_string())?;
        }
        ring.submit().map_err(|e| e.to_string())?;
        let mut seen = 0;
        let deadline = Instant::now() + Duration::from_secs(10);
        while seen < n {
            seen += ring.completion().count();
            if Instant::now() > deadline {
                return Err("io_uring completions did not arrive".into());
            }
        }
        Ok(())
    };
    let mut lat = Vec::with_capacity(samples as usize);
    for _ in 0..samples {
        let t0 = Instant::now();
        one(&mut ring, 1)?;
        lat.push(t0.elapsed().as_nanos() as u64);
    }
    let warm = (samples / 10) as usize;
    let p50 = percentiles(lat.split_off(warm)).0;
    let batches = 20_000u64;
    let t0 = Instant::now();
    for _ in 0..batches {
        one(&mut ring, 64)?;
    }
    let per_s = (batches * 64) as f64 / t0.elapsed().as_secs_f64();
    Ok((p50, per_s.round() as u64))
}

/// Submit-to-engine-start latencies over the daemon (device time read from this process).
fn remote_latencies(port: &RemotePort, q: &mut umd::Queue, buf: &umd::Buffer, n: usize) -> Result<Vec<u64>, CliError> {
    let slots = (buf.len() / 8) as usize;
    let mut out = Vec::with_capacity(n);
    let mut cb = CommandBuffer::new();
    for i in 0..n {
        let slot = (i % slots) as u64 * 8;
        cb.clear();
        cb.timestamp(buf.va() + slot);
        let t0 = port.device_now();
        let v = q.submit(&cb)?;
        q.wait(v, Some(Duration::from_secs(10)))?;
        out.push(buf.read_u64(slot)?.saturating_sub(t0.as_nanos()));
    }
    Ok(out)
}

/// Wake-up latency of a client thread blocked in a wait (no spin): the queue `WAIT`s on a flag,
/// writes a `TIMESTAMP` and passes its progress fence once this process raises the flag; the
/// waiter reads the device clock as soon as its wait returns. Each sample: from the engine's
/// timestamp just before the fence to the blocked thread running again.
fn blocked_wakeups(port: &RemotePort, q: &mut umd::Queue, buf: &umd::Buffer, n: usize) -> Result<Vec<u64>, CliError> {
    q.set_spin(0);
    let (flag, ts) = (buf.va(), buf.va() + 64);
    let mut out = Vec::with_capacity(n);
    let mut cb = CommandBuffer::new();
    let base = buf.read_u64(0)?;
    for i in 0..n as u64 {
        let k = base + i + 1;
        cb.clear();
        cb.wait(flag, k).timestamp(ts);
        let v = q.submit(&cb)?;
        let q = &*q;
        let woke = std::thread::scope(|s| {
            let waiter = s.spawn(move || -> Result<u64, CliError> {
                q.wait(v, Some(Duration::from_secs(10)))?;
                Ok(port.device_now().as_nanos())
            });
            // Long enough for the waiter to send its wait and fall asleep (in FUTEX_WAIT or in
            // a read of the socket): what is measured is a wake-up. Asleep, not spinning: on
            // two cores the daemon's firmware thread holds one, and the waiter needs the other.
            std::thread::sleep(Duration::from_millis(1));
            // Then keep this core awake for a moment (an idle virtual CPU takes tens of
            // microseconds to wake; the peers' consumers never get that far), and block in the
            // join right after raising the flag, which leaves the core to the waiter.
            let until = Instant::now() + Duration::from_micros(30);
            while Instant::now() < until {
                std::hint::spin_loop();
            }
            buf.write(0, &k.to_le_bytes())?;
            waiter.join().map_err(|_| CliError::Check("the waiting thread panicked".into()))?
        })?;
        out.push(woke.saturating_sub(buf.read_u64(64)?));
    }
    Ok(out)
}

pub struct DaemonSubmitArgs {
    pub json: bool,
    pub samples: u32,
    pub throughput_count: u64,
}

/// The embedded (in-process) user-mode p50 of `samples` submissions, for the same run's
/// ratio: a live system of its own, 1000 warm-up samples dropped.
fn embedded_p50(samples: usize) -> Result<u64, CliError> {
    let r = crate::measure::rig_with(gpu::GpuConfig { idle_period: Duration::from_secs(3600), ..Default::default() })?;
    let buf = r.dev.allocate(1 << 20)?;
    let mut q = r.ctx.create_queue(QueueOptions::user_mode())?;
    q.set_spin(u32::MAX);
    crate::measure::latencies(&r.sys, &mut q, &buf, 1000, || Ok(()))?;
    Ok(percentiles(crate::measure::latencies(&r.sys, &mut q, &buf, samples, || Ok(()))?).0)
}

/// The p50 of `samples` round trips on `uq` (a WRITE_DATA submitted until the client sees
/// the progress fence), after 1000 dropped ones.
fn round_trip_p50(uq: &mut umd::Queue, buf: &umd::Buffer, samples: usize) -> Result<u64, CliError> {
    let mut rt = Vec::with_capacity(samples);
    let mut cb = CommandBuffer::new();
    for i in 0..samples + 1000 {
        cb.clear();
        cb.write_u32(buf.va(), i as u32);
        let t0 = Instant::now();
        let v = uq.submit(&cb)?;
        while uq.completed() < v {
            std::hint::spin_loop();
        }
        if i >= 1000 {
            rt.push(t0.elapsed().as_nanos() as u64);
        }
    }
    Ok(percentiles(rt).0)
}

/// The p50s of a blocked client's wake-up, by the futex on the wake word and then (wake
/// words off) by a read of the socket: a tenth of `samples` each (50 to 2,000), after 50.
fn wakeup_p50s(port: &RemotePort, dev: &Device, ctx: &umd::Context, samples: usize) -> Result<(u64, u64), CliError> {
    let wake_n = (samples / 10).clamp(50, 2_000);
    let mut wq = ctx.create_queue(QueueOptions::user_mode())?;
    let wbuf = dev.allocate(4096)?;
    blocked_wakeups(port, &mut wq, &wbuf, 50)?;
    let wake_futex = percentiles(blocked_wakeups(port, &mut wq, &wbuf, wake_n)?).0;
    port.set_wake_words(false);
    blocked_wakeups(port, &mut wq, &wbuf, 50)?;
    let wake_socket = percentiles(blocked_wakeups(port, &mut wq, &wbuf, wake_n)?).0;
    port.set_wake_words(true);
    drop((wq, wbuf));
    Ok((wake_futex, wake_socket))
}

pub fn submit(a: DaemonSubmitArgs) -> Result<(), CliError> {
    let json = a.json;
    let samples = a.samples as usize;
    progress(json, "floor: cache-line round trip between two threads");
    let floor = cacheline_rtt_ns().round() as u64;
    let peer_n = (a.samples as u64).clamp(100, 20_000);
    progress(json, "peer: shared-memory SPSC handoff between two processes");
    let spsc = peer_p50("spsc", peer_n)?;
    progress(json, "peer: Unix stream socket between two processes");
    let socket = peer_p50("socket", peer_n.min(5_000))?;
    progress(json, "peer: futex wake between two processes");
    let futex = peer_p50("futex", peer_n.min(5_000))?;
    progress(json, "peer: io_uring NOP with SQPOLL");
    let uring = io_uring_peer(peer_n.min(5_000));

    progress(json, "embedded user-mode latency (same run)");
    let embedded = embedded_p50(samples)?;

    progress(json, "starting a daemon (doorbell serve) and connecting as a client process");
    let d = DaemonChild::start_with("idle_period_ms = 3600000\n")?;
    let port = Arc::new(RemotePort::connect(&d.socket)?);
    let dev = Device::open(port.clone())?;
    let ctx = dev.create_context(dev.engine(EngineKind::Compute)?)?;
    let buf = dev.allocate(1 << 20)?;
    let mut uq = ctx.create_queue(QueueOptions::user_mode())?;
    uq.set_spin(u32::MAX);
    progress(json, "user-mode latency over the daemon");
    remote_latencies(&port, &mut uq, &buf, 1000)?;
    let (um_p50, um_p99) = percentiles(remote_latencies(&port, &mut uq, &buf, samples)?);
    progress(json, "user-mode round trip (submit until the client sees the progress fence)");
    let um_rt = round_trip_p50(&mut uq, &buf, samples)?;
    progress(json, "blocked client wake-up: futex on the wake word, then a read of the socket");
    let (wake_futex, wake_socket) = wakeup_p50s(&port, &dev, &ctx, samples)?;
    progress(json, "kernel-mode latency over the socket");
    let mut kq = ctx.create_queue(QueueOptions::kernel_mode())?;
    kq.set_spin(0);
    remote_latencies(&port, &mut kq, &buf, 200)?;
    let (km_p50, _) = percentiles(remote_latencies(&port, &mut kq, &buf, samples.min(5_000))?);
    progress(json, "user-mode throughput over the daemon, tiny command buffers on one queue");
    let tbuf = dev.allocate(4096)?;
    let mut tq = ctx.create_queue(QueueOptions { ring_bytes: 1 << 20, ..QueueOptions::user_mode() })?;
    tq.set_spin(u32::MAX);
    let mut cb = CommandBuffer::new();
    let start = Instant::now();
    let mut last = 0;
    for i in 0..a.throughput_count {
        cb.clear();
        cb.write_u32(tbuf.va(), i as u32);
        last = tq.submit(&cb)?;
    }
    tq.wait(last, Some(Duration::from_secs(60)))?;
    let throughput = (a.throughput_count as f64 / start.elapsed().as_secs_f64()).round() as u64;
    if tbuf.read_u32(0)? != (a.throughput_count - 1) as u32 {
        return Err(CliError::Check("throughput run: last WRITE_DATA not visible".into()));
    }
    drop((uq, kq, tq, buf, tbuf, ctx, dev, port));
    drop(d);

    let (uring_rt, uring_per_s, uring_why) = match &uring {
        Ok((rt, n)) => (Some(*rt), Some(*n), None),
        Err(why) => (None, None, Some(why.clone())),
    };
    if json {
        let o = serde_json::json!({
            "um_p50_ns": um_p50,
            "um_p99_ns": um_p99,
            "um_roundtrip_p50_ns": um_rt,
            "km_p50_ns": km_p50,
            "um_blocked_wakeup_futex_p50_ns": wake_futex,
            "um_blocked_wakeup_socket_p50_ns": wake_socket,
            "um_throughput_per_s": throughput,
            "floor_cacheline_rtt_ns": floor,
            "embedded_um_p50_ns": embedded,
            "peer_spsc_ring_p50_ns": spsc,
            "peer_unix_socket_p50_ns": socket,
            "peer_futex_wake_p50_ns": futex,
            "peer_io_uring_sqpoll_roundtrip_p50_ns": uring_rt,
            "peer_io_uring_nop_per_s": uring_per_s,
            "peer_io_uring_unavailable": uring_why,
            "samples": a.samples,
            "throughput_count": a.throughput_count,
        });
        outln!("{o}");
    } else {
        let opt = |x: Option<u64>| x.map_or("n/a".to_string(), |v| v.to_string());
        outln!("doorbell bench submit --daemon ({} samples, {} command buffers)", a.samples, a.throughput_count);
        outln!("{:<48} {:>12}", "measure", "value");
        outln!("{:<48} {:>9} ns", "floor: cache-line round trip", floor);
        outln!("{:<48} {:>9} ns", "embedded user-mode p50 (ring -> engine)", embedded);
        outln!("{:<48} {:>9} ns", "daemon user-mode p50 (client ring -> engine)", um_p50);
        outln!("{:<48} {:>9} ns", "daemon user-mode p99", um_p99);
        outln!("{:<48} {:>9} ns", "daemon user-mode round trip p50", um_rt);
        outln!("{:<48} {:>9} ns", "daemon kernel-mode p50 (over the socket)", km_p50);
        outln!("{:<48} {:>9} ns", "blocked client wake-up p50, futex", wake_futex);
        outln!("{:<48} {:>9} ns", "blocked client wake-up p50, socket read", wake_socket);
        outln!("{:<48} {:>9} /s", "daemon user-mode throughput", throughput);
        outln!("{:<48} {:>9} ns", "peer: SPSC shared-memory handoff p50", spsc);
        outln!("{:<48} {:>9} ns", "peer: Unix socket p50", socket);
        outln!("{:<48} {:>9} ns", "peer: futex wake p50", futex);
        outln!("{:<48} {:>9} ns", "peer: io_uring SQPOLL NOP round trip p50", opt(uring_rt));
        outln!("{:<48} {:>9} /s", "peer: io_uring NOPs", opt(uring_per_s));
        if let Some(why) = uring_why {
            outln!("io_uring unavailable: {why}");
        }
        outln!(
            "ratios: um/embedded {:.2}, km/um {:.1}, um/spsc {:.2}",
            um_p50 as f64 / embedded.max(1) as f64,
            km_p50 as f64 / um_p50.max(1) as f64,
            um_p50 as f64 / spsc.max(1) as f64
        );
    }
    Ok(())
}
