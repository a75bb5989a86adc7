//! `doorbell bench fences`.

use std::time::Duration;

use abi::port::NativeFenceType;
use gpu::GpuConfig;
use umd::{CommandBuffer, NativeFence, Queue, QueueOptions};

use crate::CliError;
use crate::measure::{Rig, cacheline_rtt_ns, percentiles, progress, rig_with};

const WAIT: Option<Duration> = Some(Duration::from_secs(30));

fn rig() -> Result<Rig, CliError> {
    rig_with(GpuConfig { idle_period: Duration::from_secs(3600), ..GpuConfig::default() })
}

/// Fence interrupts per GPU signal of a fence of `kind`, with no CPU waiter.
fn interrupts_per_signal(r: &Rig, q: &mut Queue, kind: NativeFenceType, signals: u64) -> Result<f64, CliError> {
    let f = r.dev.create_fence(0, kind)?;
    let before = r.sys.stats().fence_interrupts;
    let mut cb = CommandBuffer::new();
    let mut last = 0;
    for v in 1..=signals {
        cb.signal_fence(&f, v);
        if cb.len() > 1000 || v == signals {
            last = q.submit(&cb)?;
            cb.clear();
        }
    }
    q.wait(last, WAIT)?;
    // The queue's progress fence is visible before the firmware thread has handed the step's
    // interrupts to the kernel: let the interrupt line drain before counting.
    let mut seen = r.sys.stats().fence_interrupts;
    loop {
        std::thread::sleep(Duration::from_millis(2));
        let now = r.sys.stats().fence_interrupts;
        if now == seen {
            break;
        }
        seen = now;
    }
    Ok((seen - before) as f64 / signals as f64)
}

/// Latency from the GPU's signal to a CPU thread running after its wait returns; with
/// `spin` the waiting thread spins on memory, otherwise it blocks in the kernel. Also returns
/// fence interrupts per signal over the run.
fn cpu_wake(r: &Rig, q: &mut Queue, samples: usize, spin: bool) -> Result<(Vec<u64>, f64), CliError> {
    let mut f: NativeFence = r.dev.create_fence(0, NativeFenceType::Default)?;
    f.set_spin(if spin { u32::MAX } else { 0 });
    let flag = r.dev.allocate(4096)?;
    let before = r.sys.stats().fence_interrupts;
    let mut out = Vec::with_capacity(samples);
    for i in 1..=samples as u64 {
        if spin {
            // A spinning waiter needs no registration: it watches memory. Submit and spin at
            // once; the engine takes longer to see the ring than this thread takes to start
            // spinning, so the waiter is spinning when the signal lands.
            let mut cb = CommandBuffer::new();
            cb.timestamp(flag.va() + 8).signal_fence(&f, i);
            q.submit(&cb)?;
            f.wait(i, WAIT)?;
            let woke = r.sys.now().as_nanos();
            out.push(woke.saturating_sub(flag.read_u64(8)?));
            continue;
        }
        // A blocked waiter must be in the kernel before the signal: the queue is held until a
        // helper thread releases it.
        let mut cb = CommandBuffer::new();
        cb.wait(flag.va(), i).timestamp(flag.va() + 8).signal_fence(&f, i);
        q.submit(&cb)?;
        let map = flag.map();
        std::thread::scope(|s| -> Result<(), CliError> {
            s.spawn(|| {
                std::thread::sleep(Duration::from_micros(30));
                let _ = map.write_u64(0, i);
            });
            f.wait(i, WAIT)?;
            let woke = r.sys.now().as_nanos();
            out.push(woke.saturating_sub(flag.read_u64(8)?));
            Ok(())
        })?;
    }
    Ok((out, (r.sys.stats().fence_interrupts - before) as f64 / samples as f64))
}

/// Latency from one engine's signal to a queue on another engine (waiting on that fence)
/// resuming, with both ends stamped by the device clock.
fn unblock(r: &Rig, waiter: &mut Queue, signaller: &mut Queue, samples: usize) -> Result<Vec<u64>, CliError> {
    let f = r.dev.create_fence(0, NativeFenceType::Default)?;
    let stamps = r.dev.allocate(4096)?;
    let mut out = Vec::with_capacity(samples);
    for i in 1..=samples as u64 {
        let mut cb = CommandBuffer::new();
        cb.wait_fence(&f, i).timestamp(stamps.va());
        let wv = waiter.submit(&cb)?;
        let mut cb = CommandBuffer::new();
        cb.timestamp(stamps.va() + 8).signal_fence(&f, i);
        let sv = signaller.submit(&cb)?;
        signaller.wait(sv, WAIT)?;
        waiter.wait(wv, WAIT)?;
        out.push(stamps.read_u64(0)?.saturating_sub(stamps.read_u64(8)?));
    }
    Ok(out)
}

pub fn run(json: bool, signals: u64, samples: usize) -> Result<(), CliError> {
    progress(json, "measuring the floor: cache-line round trip between two threads");
    let floor = cacheline_rtt_ns();
    let r = rig()?;
    let mut q = r.ctx.create_queue(QueueOptions::user_mode())?;
    q.set_spin(u32::MAX);
    progress(json, "interrupts per signal: native fence with no waiter, legacy monitored fence");
    let no_waiter = interrupts_per_signal(&r, &mut q, NativeFenceType::Default, signals)?;
    let legacy = interrupts_per_signal(&r, &mut q, NativeFenceType::LegacyMonitored, signals)?;
    progress(json, "CPU wake: a waiter blocked in the kernel, then one spinning in the UMD");
    let (blocked, with_waiter) = cpu_wake(&r, &mut q, samples.min(1000), false)?;
    let (spinning, _) = cpu_wake(&r, &mut q, samples.min(1000), true)?;
    progress(json, "a queue waiting on another engine's signal: GPU-side, then CPU-mediated");
    let mut sig = r.copy.create_queue(QueueOptions::user_mode())?;
    sig.set_spin(u32::MAX);
    let gpu = unblock(&r, &mut q, &mut sig, samples)?;
    let mut kq = r.ctx.create_queue(QueueOptions::kernel_mode())?;
    kq.set_spin(0);
    let cpu = unblock(&r, &mut kq, &mut sig, samples.min(1000))?;

    let (wake, _) = percentiles(blocked);
    let (spin, _) = percentiles(spinning);
    let (gpu_p50, _) = percentiles(gpu);
    let (cpu_p50, _) = percentiles(cpu);
    let floor_ns = floor.round() as u64;
    if json {
        let o = serde_json::json!({
            "interrupts_per_signal_no_waiter": no_waiter,
            "interrupts_per_signal_with_waiter": with_waiter,
            "interrupts_per_signal_legacy": legacy,
            "cpu_wake_p50_ns": wake,
            "cpu_spin_wake_p50_ns": spin,
            "gpu_wait_unblock_p50_ns": gpu_p50,
            "cpu_mediated_unblock_p50_ns": cpu_p50,
            "floor_cacheline_rtt_ns": floor_ns,
            "signals": signals,
            "samples": samples,
        });
        outln!("{o}");
    } else {
        outln!("doorbell bench fences ({signals} signals per ratio, {samples} samples)");
        let t = crate::measure::FloorTable::new(44, floor);
        outln!("{:<44} {:>12.3}", "interrupts per signal, no CPU waiter", no_waiter);
        outln!("{:<44} {:>12.3}", "interrupts per signal, a CPU waiter", with_waiter);
        outln!("{:<44} {:>12.3}", "interrupts per signal, legacy monitored", legacy);
        t.ns("GPU signal -> blocked CPU waiter runs", wake);
        t.ns("GPU signal -> spinning CPU waiter runs", spin);
        t.ns("signal -> waiting queue resumes (GPU)", gpu_p50);
        t.ns("signal -> waiting queue resumes (via CPU)", cpu_p50);
        outln!("CPU-mediated / GPU-side = {:.1}", cpu_p50 as f64 / gpu_p50.max(1) as f64);
    }
    Ok(())
}
