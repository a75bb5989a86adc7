//! `doorbell demo`: one live embedded system, two client processes, both submission paths,
//! an engine going idle and waking up, and a fault that stays in its queue; then a live
//! two-adapter machine with a cross-adapter fence.

use std::sync::Arc;
use std::time::{Duration, Instant};

use abi::port::KernelPort;
use abi::{DoorbellStatus, EngineKind, QueueState};
use gpu::GpuConfig;
use kernel::trace::{Ddi, Event, TraceEntry};
use kernel::{System, SystemConfig};
use umd::{CommandBuffer, Device, QueueOptions};

use crate::CliError;

const WAIT: Option<Duration> = Some(Duration::from_secs(5));

fn check(ok: bool, what: impl Into<String>) -> Result<(), CliError> {
    if ok { Ok(()) } else { Err(CliError::Check(what.into())) }
}

pub fn run(quiet: bool) -> Result<(), CliError> {
    let idle = Duration::from_millis(5);
    let sys = System::live(SystemConfig {
        gpu: GpuConfig { idle_period: idle, ..GpuConfig::default() },
        ..SystemConfig::default()
    })?;
    let say = |s: String| {
        if !quiet {
            outln!("{s}");
        }
    };
    let mut checked = 0u32;
    let mut submissions = 0u32;

    say("== doorbell demo: a live embedded system (kernel + virtual GPU in this process) ==".into());
    let port_a: Arc<dyn KernelPort> = sys.open_process()?;
    let port_b: Arc<dyn KernelPort> = sys.open_process()?;
    let a = Device::open(port_a.clone())?;
    let b = Device::open(port_b.clone())?;
    say(format!(
        "processes A ({}) and B ({}) opened; engines: {:?}",
        port_a.process(),
        port_b.process(),
        a.info().engines.iter().map(|e| e.kind).collect::<Vec<_>>()
    ));

    // Process A: a user-mode queue and a kernel-mode queue on the compute engine.
    let compute = a.engine(EngineKind::Compute)?;
    let copy = a.engine(EngineKind::Copy)?;
    let ctx_a = a.create_context(compute)?;
    let mut uq = ctx_a.create_queue(QueueOptions::user_mode())?;
    let mut kq = ctx_a.create_queue(QueueOptions::kernel_mode())?;
    let buf = a.allocate(1 << 20)?;
    say(format!("A: user-mode queue {} and kernel-mode queue {} on {compute}", uq.handle(), kq.handle()));

    for (name, q, base) in [("user-mode", &mut uq, 0u64), ("kernel-mode", &mut kq, 0x8000u64)] {
        let va = buf.va() + base;
        let mut cb = CommandBuffer::new();
        cb.write_u32(va, 0xC0FFEE)
            .write_u64(va + 8, 0x1234_5678_9abc_def0)
            .fill(va + 0x100, 256, 0xA5A5_5A5A)
            .copy(va + 0x100, va + 0x400, 256)
            .timestamp(va + 0x10)
            .signal(va + 0x18, 99)
            .interrupt(7);
        let t0 = Instant::now();
        let v = q.submit(&cb)?;
        q.wait(v, WAIT)?;
        submissions += 1;
        let mut filled = [0u8; 256];
        buf.read(base + 0x400, &mut filled)?;
        let pattern_ok = filled.chunks(4).all(|c| c == 0xA5A5_5A5Au32.to_le_bytes());
        check(buf.read_u32(base)? == 0xC0FFEE, format!("{name}: WRITE_DATA 32"))?;
        check(buf.read_u64(base + 8)? == 0x1234_5678_9abc_def0, format!("{name}: WRITE_DATA 64"))?;
        check(pattern_ok, format!("{name}: FILL then COPY"))?;
        check(buf.read_u64(base + 0x10)? > 0, format!("{name}: TIMESTAMP"))?;
        check(buf.read_u64(base + 0x18)? == 99, format!("{name}: SIGNAL"))?;
        checked += 5;
        say(format!(
            "A: {name:>11} submission {v} done in {:?}: WRITE_DATA, FILL+COPY, TIMESTAMP, SIGNAL checked",
            t0.elapsed()
        ));
    }

    // Process B: a copy-engine queue that waits on A's compute queue, without the CPU.
    let ctx_b = b.create_context(copy)?;
    let mut bq = ctx_b.create_queue(QueueOptions::user_mode())?;
    let bbuf = b.allocate(2 << 20)?;
    let pattern: Vec<u8> = (0..(1u32 << 20)).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    bbuf.write(0, &pattern)?;
    let mut cb = CommandBuffer::new();
    cb.copy(bbuf.va(), bbuf.va() + (1 << 20), 1 << 20);
    let v = bq.submit(&cb)?;
    bq.wait(v, WAIT)?;
    submissions += 1;
    let mut out = vec![0u8; 1 << 20];
    bbuf.read(1 << 20, &mut out)?;
    check(out == pattern, "B: 1 MiB COPY on the copy engine")?;
    checked += 1;
    say(format!("B: 1 MiB COPY on {copy} via {} checked", bq.handle()));

    // Cross-engine: A's compute queue waits for a value that A's copy queue signals.
    let ctx_c = a.create_context(copy)?;
    let mut cq = ctx_c.create_queue(QueueOptions::user_mode())?;
    let flag = buf.va() + 0x9000;
    let mut waiter = CommandBuffer::new();
    waiter.wait(flag, 1).write_u32(buf.va() + 0x9008, 0xD0D0);
    let wv = uq.submit(&waiter)?;
    let mut signaller = CommandBuffer::new();
    signaller.signal(flag, 1);
    let sv = cq.submit(&signaller)?;
    cq.wait(sv, WAIT)?;
    uq.wait(wv, WAIT)?;
    submissions += 2;
    check(buf.read_u32(0x9008)? == 0xD0D0, "compute WAIT released by copy SIGNAL")?;
    checked += 1;
    say("A: compute queue WAITed on a value the copy queue SIGNALed; resumed without the CPU".into());

    // Idle: the engines go to F1 and the kernel disconnects their doorbells.
    let deadline = Instant::now() + Duration::from_secs(5);
    while sys.power(compute) != gpu::PowerState::F1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    check(sys.power(compute) == gpu::PowerState::F1, "compute engine reached F1 when idle")?;
    say(format!(
        "idle for {idle:?}: {compute} is in F1; doorbell status of {} = {:?}",
        uq.handle(),
        uq.doorbell_status()?
    ));
    let mut cb = CommandBuffer::new();
    cb.write_u32(buf.va() + 0xA000, 0xBEEF);
    let before = uq.reconnects();
    let v = uq.submit(&cb)?;
    uq.wait(v, WAIT)?;
    submissions += 1;
    check(buf.read_u32(0xA000)? == 0xBEEF && uq.reconnects() > before, "submission after F1 reconnects and runs")?;
    checked += 1;
    say(format!(
        "submitted in F1: the UMD saw DisconnectedRetry, reconnected (engine back to F0), result checked; status = {:?}",
        uq.doorbell_status()?
    ));

    // Compute: the four example kernels on both paths, against their CPU references, in A.
    for (kind, results) in crate::examples::run_all(&a, 2048)? {
        for (name, r) in results {
            let v = r.map_err(|e| CliError::Check(format!("{name} on the {kind:?} path: {e}")))?;
            submissions += 1;
            checked += 1;
            say(format!(
                "A: compute: {name:<10} on a {:<11} queue: {} elements match the CPU reference ({} DISPATCH)",
                format!("{kind:?}"),
                v.elements,
                v.dispatches
            ));
        }
    }

    // Native fences: B shares a fence with A; A's compute queue waits on it on the GPU, B's
    // copy queue signals it (logged), A's CPU waits for it in the kernel.
    let shared = b.create_fence_with(&abi::port::NativeFenceDesc {
        shareable: true,
        ..abi::port::NativeFenceDesc::new(0, abi::port::NativeFenceType::Default)
    })?;
    let global = shared.global().ok_or_else(|| CliError::Check("a shareable fence has a global handle".into()))?;
    let mut in_a = a.open_fence(global)?;
    in_a.set_spin(0);
    // B's signal is held behind a gate (a memory WAIT) until A's CPU waiter is blocked in the
    // kernel, so the signal always finds a waiter and raises exactly one fence interrupt (a
    // native fence interrupts only for a CPU waiter; without the gate, whether the waiter
    // blocked before the signal landed would be a race between two threads).
    let gate = 0x10_0000u64;
    bbuf.write(gate, &0u64.to_le_bytes())?;
    let before = sys.stats().fence_interrupts;
    let waits_before = sys.census().waits;
    let mut cb = CommandBuffer::new();
    cb.wait_fence_logged(&in_a, 1).write_u32(buf.va() + 0xC000, 0xFE);
    let wv = uq.submit(&cb)?;
    let mut cb = CommandBuffer::new();
    cb.wait(bbuf.va() + gate, 1).signal_fence_logged(&shared, 1);
    bq.submit(&cb)?;
    let gate_map = bbuf.map();
    std::thread::scope(|s| -> Result<(), CliError> {
        s.spawn(|| {
            let deadline = Instant::now() + Duration::from_secs(5);
            while sys.census().waits <= waits_before && Instant::now() < deadline {
                std::thread::sleep(Duration::from_micros(100));
            }
            let _ = gate_map.write_u64(gate, 1);
        });
        in_a.wait(1, WAIT)?;
        Ok(())
    })?;
    uq.wait(wv, WAIT)?;
    submissions += 2;
    let fence_interrupts = sys.stats().fence_interrupts - before;
    check(buf.read_u32(0xC000)? == 0xFE, "GPU wait on a shared fence released by another process's signal")?;
    let log = sys.read_fence_log(port_b.process(), bq.handle(), abi::fence_log::FenceLogType::Signal, 0)?;
    check(log.entries.iter().any(|e| e.fence_value == 1), "the signal is in the queue's fence log")?;
    check(
        fence_interrupts == 1,
        format!("the blocked CPU waiter woke on one fence interrupt, not {fence_interrupts}"),
    )?;
    checked += 3;
    say(format!(
        "fences: {} shared fence {global:#x} with {}; A's GPU waited on it, B's copy queue signalled it once A's \
         CPU waiter was blocked in the kernel, which woke on {fence_interrupts} fence interrupt; B's signal log: {} \
         entry",
        port_b.process(),
        port_a.process(),
        log.entries.len()
    ));

    // A fault stays in its queue.
    let mut bad = ctx_b.create_queue(QueueOptions::user_mode())?;
    let mut cb = CommandBuffer::new();
    cb.raw(&[abi::packet::Header(1 | (0x7f << 16) | (abi::packet::PACKET_VERSION << 24)).0]); // opcode 0x7f: unknown
    let v = bad.submit(&cb)?;
    let lost = bad.wait(v, WAIT);
    let st = bad.status()?;
    check(lost.is_err() && st.state == QueueState::Hung, "bad queue is hung")?;
    say(format!(
        "B: a malformed packet hung {}: {}",
        bad.handle(),
        st.fault.map(|f| f.to_string()).unwrap_or_default()
    ));
    let mut cb = CommandBuffer::new();
    cb.write_u32(bbuf.va(), 0x600D);
    let v = bq.submit(&cb)?;
    bq.wait(v, WAIT)?;
    submissions += 1;
    check(bbuf.read_u32(0)? == 0x600D, "other queue of the same process still runs")?;
    let v = uq.submit(&cb_for(buf.va() + 0xB000, 0x600D))?;
    uq.wait(v, WAIT)?;
    check(buf.read_u32(0xB000)? == 0x600D, "other process still runs")?;
    submissions += 1;
    checked += 3;
    say("the other queues, in both processes, kept running with correct results".into());

    let (lines, n, c) = gpu_work_graph()?;
    for l in lines {
        say(l);
    }
    submissions += n;
    checked += c;

    let (lines, n) = cross_adapter()?;
    for l in lines {
        say(l);
    }
    submissions += n;
    checked += 2;

    let (lines, n) = crate::demo_pgo::run(&sys)?;
    for l in lines {
        say(l);
    }
    checked += n;

    let (trace, _) = sys.trace();
    if !quiet {
        outln!("\n-- kernel trace: doorbell status changes, power, faults --");
        for (i, e) in trace.iter().enumerate().filter(|(_, e)| {
            matches!(
                e.event,
                Event::Status { .. }
                    | Event::Power { .. }
                    | Event::EngineRequest { .. }
                    | Event::QueueFault { .. }
                    | Event::F1Refused { .. }
                    | Event::QueueCreated { .. }
            )
        }) {
            let note = explain(&trace, i).map(|n| format!("  ({n})")).unwrap_or_default();
            outln!("{:>10.3} ms  {}{note}", e.time.as_nanos() as f64 / 1e6, e.event);
        }
    }
    let count = |f: fn(&Event) -> bool| trace.iter().filter(|e| f(&e.event)).count();
    let st = sys.stats();
    outln!("\n-- summary --");
    outln!("queues created:          {}", count(|e| matches!(e, Event::QueueCreated { .. })));
    outln!("submissions:             {submissions} ({} through the kernel-mode path)", st.km_submissions);
    outln!("results checked:         {checked}, all correct");
    outln!("doorbell status changes: {}", count(|e| matches!(e, Event::Status { .. })));
    outln!("engine F1 entries:       {}", count(|e| matches!(e, Event::Power { state: gpu::PowerState::F1, .. })));
    outln!("engine F0 wake-ups:      {}", count(|e| matches!(e, Event::Power { state: gpu::PowerState::F0, .. })));
    outln!("queue faults contained:  {}", st.faults);
    outln!("user interrupts:         {}", st.user_interrupts);
    outln!("fence interrupts:        {} (signals with no CPU waiter raise none)", st.fence_interrupts);
    Ok(())
}

/// What a trace line means when its text alone misleads: `DisconnectedAbort` is what every
/// destroyed queue's doorbell reads, not only a faulted one's.
fn explain(trace: &[TraceEntry], i: usize) -> Option<&'static str> {
    let Event::Status { queue, status: DoorbellStatus::DisconnectedAbort } = trace[i].event else { return None };
    let faulted = trace[..i].iter().any(|e| matches!(e.event, Event::QueueFault { queue: q, .. } if q == queue));
    // Other threads' events can land between the status write and the destroy: look ahead.
    let destroyed = trace[i + 1..].iter().any(|e| matches!(e.event, Event::Ddi(Ddi::DestroyDoorbell(q)) if q == queue));
    match (faulted, destroyed) {
        (true, _) => Some("after its fault: the queue is dead; its owner destroys it and creates another"),
        (false, true) => Some("the queue was destroyed by its owner: the ordinary end of a queue, not a fault"),
        (false, false) => None,
    }
}

/// Spec 001's "the GPU [can] submit work to itself": a work graph across the compute and copy
/// engines — compute fills, copy copies, compute writes a marker — where each stage submits
/// the next from the GPU (it writes the next queue's wptr and rings its doorbell, mapped in the
/// process's own address space). One CPU submission starts it; no submission reaches the
/// kernel after it. A live system of its own whose engines stay awake, so the run shows the
/// graph alone (a GPU ring on a doorbell disconnected for F1 is heard too, but then the kernel
/// reconnects it). Returns what to say, the CPU submissions it made and the checks.
fn gpu_work_graph() -> Result<(Vec<String>, u32, u32), CliError> {
    let sys = System::live(SystemConfig {
        gpu: GpuConfig { idle_period: Duration::from_secs(3600), ..GpuConfig::default() },
        ..SystemConfig::default()
    })?;
    let port: Arc<dyn KernelPort> = sys.open_process()?;
    let dev = Device::open(port)?;
    let compute = dev.create_context(dev.engine(EngineKind::Compute)?)?;
    let copy = dev.create_context(dev.engine(EngineKind::Copy)?)?;
    let mut first = compute.create_queue(QueueOptions::user_mode())?;
    let mut middle = copy.create_queue(QueueOptions::user_mode())?;
    let mut last = compute.create_queue(QueueOptions::user_mode())?;
    let buf = dev.allocate(1 << 20)?;
    let (src, dst, marker) = (buf.va(), buf.va() + (256 << 10), buf.va() + (512 << 10));
    const BYTES: u64 = 64 << 10;
    // Built back to front: each stage carries the kick of the next.
    let mut cb = CommandBuffer::new();
    cb.write_u32(marker, 0x600D_F00D).timestamp(marker + 8);
    let k_last = last.prepare(&cb)?;
    let mut cb = CommandBuffer::new();
    cb.copy(src, dst, BYTES).kick(&k_last);
    let k_middle = middle.prepare(&cb)?;
    let mut cb = CommandBuffer::new();
    cb.fill(src, BYTES, 0x5EED_5EED).kick(&k_middle);
    let (mark, _) = sys.trace();
    let t0 = Instant::now();
    first.submit(&cb)?; // the one CPU submission
    last.wait(k_last.value, WAIT)?;
    let took = t0.elapsed();
    let mut out = vec![0u8; BYTES as usize];
    buf.read(256 << 10, &mut out)?;
    check(out.chunks(4).all(|c| c == 0x5EED_5EEDu32.to_le_bytes()), "GPU graph: the copy engine copied the fill")?;
    check(buf.read_u32(512 << 10)? == 0x600D_F00D, "GPU graph: the last compute stage ran")?;
    check(middle.completed() == k_middle.value, "GPU graph: the copy stage completed")?;
    let (trace, _) = sys.trace();
    let kernel_submits = trace[mark.len()..]
        .iter()
        .filter(|e| {
            matches!(
                e.event,
                Event::Ddi(Ddi::SubmitCommand { .. } | Ddi::ConnectDoorbell(_) | Ddi::NotifyWorkSubmission(_))
            )
        })
        .count();
    check(kernel_submits == 0, format!("GPU graph: {kernel_submits} submissions reached the kernel"))?;
    Ok((
        vec![format!(
            "GPU work graph: compute {} -> copy {} -> compute {} from one CPU submission; each stage \
             rang the next from the GPU, no kernel call; {} us end to end",
            first.handle(),
            middle.handle(),
            last.handle(),
            took.as_micros()
        )],
        1,
        4,
    ))
}

/// Spec 002's scenario 2a on a live two-adapter machine: an iGPU without native fences
/// (kernel-mode queues, monitored fences) waits on a cross-adapter fence a dGPU's user-mode
/// queue signals. Returns what to say and how many submissions it made.
fn cross_adapter() -> Result<(Vec<String>, u32), CliError> {
    let igpu = SystemConfig {
        without_native_fences: true,
        user_queue_mode: abi::port::UserQueueMode::KernelOnly,
        ..SystemConfig::default()
    };
    let m = kernel::Machine::live(&[igpu, SystemConfig::default()])?;
    let open = |i: usize| -> Result<_, CliError> {
        let dev = Device::open(m.adapter(i).open_process()? as Arc<dyn KernelPort>)?;
        let ctx = dev.create_context(dev.engine(EngineKind::Compute)?)?;
        Ok((dev, ctx))
    };
    let ((idev, ictx), (ddev, dctx)) = (open(0)?, open(1)?);
    let desc = abi::port::NativeFenceDesc {
        cross_adapter: true,
        ..abi::port::NativeFenceDesc::new(0, abi::port::NativeFenceType::Default)
    };
    let df = ddev.create_fence_with(&desc)?;
    let handle = df.cross_adapter().ok_or_else(|| CliError::Check("a cross-adapter fence has a handle".into()))?;
    let fi = idev.open_cross_adapter_fence(handle)?;
    let buf = idev.allocate(4096)?;
    let mut iq = ictx.create_queue(QueueOptions::kernel_mode())?;
    let mut cb = CommandBuffer::new();
    cb.wait_fence(&fi, 1).write_u32(buf.va(), 0x2A);
    let v = iq.submit(&cb)?;
    let mut dq = dctx.create_queue(QueueOptions::user_mode())?;
    let mut cb = CommandBuffer::new();
    cb.signal_fence(&df, 1);
    dq.submit(&cb)?;
    iq.wait(v, WAIT)?;
    check(buf.read_u32(0)? == 0x2A, "the iGPU's held-back submission ran after the dGPU's signal")?;
    let propagated =
        m.cross_trace().0.iter().filter(|e| matches!(e, kernel::cross::CrossEvent::Propagated { .. })).count();
    check(propagated >= 1, "the OS propagated the dGPU's signal to the iGPU")?;
    Ok((
        vec![format!(
            "cross-adapter: fence {handle} created on a dGPU, opened on an iGPU without native fences as a {:?} \
             fence; the dGPU's user-mode queue signalled it, the OS propagated it ({propagated} time(s)) and the \
             iGPU's scheduler released its held-back kernel-mode submission",
            fi.kind()
        )],
        2,
    ))
}

fn cb_for(va: u64, v: u32) -> CommandBuffer {
    let mut cb = CommandBuffer::new();
    cb.write_u32(va, v);
    cb
}
