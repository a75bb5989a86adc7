//! Cross-adapter native fences (spec 002 "Cross-adapter native fences"), on a deterministic
//! machine with an iGPU (adapter 0) and a dGPU (adapter 1).
//!
//! Every cell of the spec's tables is run: scenario 1 (both adapters have native fences),
//! 2a (the iGPU has none; it waits, the dGPU signals) and 2b (the iGPU has none; it
//! signals, the dGPU waits), each with the wait from the GPU or the CPU and the signal from
//! the GPU or the CPU. Each asserts the spec's sequence: the signalling adapter hands the
//! signal over (after its `UpdateCurrentValuesFromCpu` for a CPU signal on a native
//! adapter), the OS propagates it, and the waiting adapter either calls
//! `UpdateCurrentValuesFromCpu(NotificationOnly)` (native: the KMD rescans its run list) or
//! scans its monitored-fence waiting lists (no native fences); the wait passes only then.

mod common;

use std::sync::Arc;

use abi::port::{KernelError, KernelPort, NativeFenceDesc, NativeFenceType, UserQueueMode, WaitMode, WaitOutcome};
use kernel::cross::{AdapterId, CrossEvent};
use kernel::trace::{Ddi, Event};
use kernel::{Machine, SystemConfig};
use umd::{CommandBuffer, NativeFence};

const IGPU: usize = 0;
const DGPU: usize = 1;
const VALUE: u64 = 10;

/// An adapter without native fences: kernel-mode queues and monitored fences only.
fn legacy() -> SystemConfig {
    SystemConfig { without_native_fences: true, user_queue_mode: UserQueueMode::KernelOnly, ..SystemConfig::default() }
}

fn machine(igpu_native: bool) -> Machine {
    let igpu = if igpu_native { SystemConfig::default() } else { legacy() };
    Machine::sim(&[igpu, SystemConfig::default()]).expect("machine")
}

fn cross(kind: NativeFenceType) -> NativeFenceDesc {
    NativeFenceDesc { cross_adapter: true, ..NativeFenceDesc::new(0, kind) }
}

#[derive(Clone, Copy, Debug)]
enum From {
    Gpu,
    Cpu,
}

/// One cell of a table: the waiter on `wait_on`, the signal on the other adapter.
fn cell(igpu_native: bool, wait_on: usize, wait: From, signal: From) {
    let what = format!("iGPU native={igpu_native}, wait on {wait_on} from {wait:?}, signal from {signal:?}");
    let m = machine(igpu_native);
    let signal_on = 1 - wait_on;
    let w = common::client_on(m.adapter(wait_on).open_process().unwrap());
    let s = common::client_on(m.adapter(signal_on).open_process().unwrap());
    let native = |a: usize| a == DGPU || igpu_native;
    // Created on the dGPU, opened on the iGPU (spec: "created on GPU1 and opened on GPU2").
    let (created, create_on) = if signal_on == DGPU { (&s, signal_on) } else { (&w, wait_on) };
    let fence = created.device.create_fence_with(&cross(NativeFenceType::Default)).unwrap();
    assert_eq!(create_on, DGPU);
    let handle = fence.cross_adapter().expect("a cross-adapter handle");
    let opened = if wait_on == IGPU { &w } else { &s };
    let other = opened.device.open_cross_adapter_fence(handle).unwrap();
    let expect_kind = if igpu_native { NativeFenceType::Default } else { NativeFenceType::LegacyMonitored };
    assert_eq!(other.kind(), expect_kind, "{what}: opened on the iGPU as");
    let (wf, sf): (&NativeFence, &NativeFence) = if wait_on == DGPU { (&fence, &other) } else { (&other, &fence) };

    // The wait.
    let queue = |c: &common::Client, a: usize| if native(a) { c.user_queue() } else { c.kernel_queue() };
    let mut wq = queue(&w, wait_on);
    let waiter = match wait {
        From::Gpu => {
            let mut cb = CommandBuffer::new();
            cb.wait_fence(wf, VALUE).write_u32(w.buf.va(), 1);
            wq.submit(&cb).unwrap();
            None
        }
        From::Cpu => {
            let pid = w.port.process();
            let h = m.adapter(wait_on).begin_fence_wait(pid, &[(wf.handle(), VALUE)], WaitMode::All).unwrap();
            Some((pid, h.expect("not yet satisfied")))
        }
    };
    m.settle();
    let passed = || match &waiter {
        None => w.buf.read_u32(0).unwrap() == 1,
        Some((_, h)) => h.is_done(),
    };
    assert!(!passed(), "{what}: the wait passed before the signal");

    // The signal.
    let marks: Vec<usize> = m.adapters().iter().map(|a| a.trace().0.len()).collect();
    let xmark = m.cross_trace().0.len();
    let irqs = m.adapter(signal_on).stats().fence_interrupts;
    match signal {
        From::Gpu => {
            let mut sq = queue(&s, signal_on);
            let mut cb = CommandBuffer::new();
            cb.signal_fence(sf, VALUE);
            let v = sq.submit(&cb).unwrap();
            m.settle();
            assert!(sq.completed() >= v, "{what}");
            // MonitoredValue stays 0 on every adapter: the signal interrupted.
            assert!(m.adapter(signal_on).stats().fence_interrupts > irqs, "{what}: no interrupt");
        }
        From::Cpu => {
            sf.signal(VALUE).unwrap();
            m.settle();
        }
    }
    assert!(passed(), "{what}: the wait did not pass");
    if let Some((pid, h)) = &waiter {
        assert_eq!(m.adapter(wait_on).end_fence_wait(*pid, h).unwrap(), WaitOutcome::Reached(0), "{what}");
    }
    assert_eq!(wf.value().unwrap(), VALUE, "{what}: one CurrentValue, seen from the waiter's side");

    // The signalling adapter: (CPU on a native adapter: UpdateCurrentValuesFromCpu, then) the
    // hand-over.
    let sev = common::events_from(m.adapter(signal_on), marks[signal_on]);
    let handover = Event::CrossAdapterSignal { fence: sf.handle() };
    let at = sev.iter().position(|e| *e == handover).unwrap_or_else(|| panic!("{what}: no hand-over in {sev:#?}"));
    let cpu_ddi = Event::Ddi(Ddi::UpdateCurrentValueFromCpu(sf.handle(), VALUE));
    match (signal, native(signal_on)) {
        (From::Cpu, true) => {
            let ddi = sev.iter().position(|e| *e == cpu_ddi);
            assert!(ddi.is_some_and(|d| d < at), "{what}: the CPU signal's DDI comes first: {sev:#?}");
        }
        // Without native fences the scheduler writes the monitored fence itself; a GPU signal
        // is the engine's.
        _ => assert!(!sev.contains(&cpu_ddi), "{what}: {sev:#?}"),
    }
    // The OS propagates it to the waiting adapter.
    let x: Vec<CrossEvent> = m.cross_trace().0.into_iter().skip(xmark).collect();
    let (from, to) = (AdapterId(signal_on as u32), AdapterId(wait_on as u32));
    let sig = x.iter().position(|e| *e == CrossEvent::Signaled { fence: handle, from });
    let prop = x.iter().position(|e| *e == CrossEvent::Propagated { fence: handle, to });
    assert!(sig.is_some() && prop.is_some() && sig < prop, "{what}: {x:#?}");
    // The waiting adapter: NotificationOnly where it has native fences, a scan where not.
    let wev = common::events_from(m.adapter(wait_on), marks[wait_on]);
    let notified = wev.iter().position(|e| *e == Event::CrossAdapterNotified { fence: wf.handle() });
    let ddi = wev.iter().position(|e| *e == Event::Ddi(Ddi::UpdateCurrentValueNotificationOnly(wf.handle())));
    assert!(notified.is_some(), "{what}: {wev:#?}");
    if native(wait_on) {
        assert!(ddi.is_some_and(|d| Some(d) > notified), "{what}: NotificationOnly after the notice: {wev:#?}");
    } else {
        assert_eq!(ddi, None, "{what}: an adapter without native fences gets no NotificationOnly DDI");
    }
}

fn table(igpu_native: bool, wait_on: usize) {
    for wait in [From::Gpu, From::Cpu] {
        for signal in [From::Gpu, From::Cpu] {
            cell(igpu_native, wait_on, wait, signal);
        }
    }
}

#[test]
fn scenario_1_both_native_igpu_waits_dgpu_signals() {
    table(true, IGPU);
}

#[test]
fn scenario_1_both_native_dgpu_waits_igpu_signals() {
    table(true, DGPU);
}

#[test]
fn scenario_2a_igpu_without_native_fences_waits_dgpu_signals() {
    table(false, IGPU);
}

#[test]
fn scenario_2b_igpu_without_native_fences_signals_dgpu_waits() {
    table(false, DGPU);
}

#[test]
fn a_monitored_fence_created_without_native_fences_opens_as_a_native_fence() {
    let m = machine(false);
    let i = common::client_on(m.adapter(IGPU).open_process().unwrap());
    let d = common::client_on(m.adapter(DGPU).open_process().unwrap());
    let f = i.device.create_fence_with(&cross(NativeFenceType::LegacyMonitored)).unwrap();
    let g = d.device.open_cross_adapter_fence(f.cross_adapter().unwrap()).unwrap();
    assert_eq!((f.kind(), g.kind()), (NativeFenceType::LegacyMonitored, NativeFenceType::Default));
    // The dGPU's queue waits on it; the iGPU's CPU signals it.
    let mut q = d.user_queue();
    let mut cb = CommandBuffer::new();
    cb.wait_fence(&g, 3).write_u32(d.buf.va(), 7);
    let v = q.submit(&cb).unwrap();
    m.settle();
    assert!(q.completed() < v);
    f.signal(3).unwrap();
    m.settle();
    assert_eq!(d.buf.read_u32(0).unwrap(), 7);
    assert_eq!(g.value().unwrap(), 3);
}

#[test]
fn every_signal_of_a_cross_adapter_fence_interrupts_even_with_no_waiter() {
    let m = machine(true);
    let d = common::client_on(m.adapter(DGPU).open_process().unwrap());
    let i = common::client_on(m.adapter(IGPU).open_process().unwrap());
    let x = d.device.create_fence_with(&cross(NativeFenceType::Default)).unwrap();
    let _ix = i.device.open_cross_adapter_fence(x.cross_adapter().unwrap()).unwrap();
    let local = d.device.create_fence(0, NativeFenceType::Default).unwrap();
    let mut q = d.user_queue();
    let before = m.adapter(DGPU).stats().fence_interrupts;
    for v in 1..=3 {
        let mut cb = CommandBuffer::new();
        cb.signal_fence(&local, v).signal_fence(&x, v);
        q.submit(&cb).unwrap();
        m.settle();
    }
    // Three signals of the cross-adapter fence, none of the local one (no waiter).
    assert_eq!(m.adapter(DGPU).stats().fence_interrupts - before, 3);
    let propagated = m.cross_trace().0.iter().filter(|e| matches!(e, CrossEvent::Propagated { .. })).count();
    assert_eq!(propagated, 3);
}

#[test]
fn closing_on_one_adapter_keeps_the_fence_alive_on_the_other() {
    let m = machine(true);
    let d = common::client_on(m.adapter(DGPU).open_process().unwrap());
    let i = common::client_on(m.adapter(IGPU).open_process().unwrap());
    let x = d.device.create_fence_with(&cross(NativeFenceType::Default)).unwrap();
    let handle = x.cross_adapter().unwrap();
    let ix = i.device.open_cross_adapter_fence(handle).unwrap();
    drop(x);
    ix.signal(5).unwrap();
    assert_eq!(ix.value().unwrap(), 5);
    drop(ix);
    let t = m.cross_trace().0;
    let closes: Vec<&CrossEvent> = t.iter().filter(|e| matches!(e, CrossEvent::Closed { .. })).collect();
    assert_eq!(
        closes,
        [
            &CrossEvent::Closed { fence: handle, adapter: AdapterId(1) },
            &CrossEvent::Closed { fence: handle, adapter: AdapterId(0) }
        ]
    );
    // Gone with its last instance.
    let e = i.device.open_cross_adapter_fence(handle).err().expect("refused");
    assert_eq!(common::umd_refusal(&e), Some(("handle", &abi::port::Invalid::NoSuchFence)), "{e}");
}

#[test]
fn bad_cross_adapter_requests_are_refused_with_typed_errors() {
    let m = machine(false);
    let d: Arc<dyn KernelPort> = m.adapter(DGPU).open_process().unwrap();
    let dev = d.create_device().unwrap();
    let i: Arc<dyn KernelPort> = m.adapter(IGPU).open_process().unwrap();
    let idev = i.create_device().unwrap();
    let field = |r: Result<abi::port::NativeFenceInfo, KernelError>| match r {
        Err(KernelError::InvalidArgument { field, .. }) => field,
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("accepted"),
    };
    // Spec 002: a cross-adapter fence must be of type Default.
    assert_eq!(field(d.create_native_fence(dev, &cross(NativeFenceType::IntraGpu))), "kind");
    // No native fences on the iGPU: only monitored fences.
    assert_eq!(field(i.create_native_fence(idev, &NativeFenceDesc::new(0, NativeFenceType::Default))), "kind");
    assert_eq!(field(i.create_native_fence(idev, &cross(NativeFenceType::Default))), "kind");
    // A handle that names nothing.
    assert_eq!(field(i.open_cross_adapter_fence(idev, 999)), "handle");
    // A single adapter has no cross-adapter fences.
    let sys = common::sim();
    let p: Arc<dyn KernelPort> = sys.open_process().unwrap();
    let pdev = p.create_device().unwrap();
    assert_eq!(field(p.create_native_fence(pdev, &cross(NativeFenceType::Default))), "cross_adapter");
    assert_eq!(field(p.open_cross_adapter_fence(pdev, 1)), "handle");
    // None of that touched the adapters' other work.
    let c = common::client_on(d.clone());
    let mut q = c.user_queue();
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va(), 9);
    q.finish(common::T).unwrap_or_default();
    let v = q.submit(&cb).unwrap();
    q.wait(v, common::T).unwrap();
    assert_eq!(c.buf.read_u32(0).unwrap(), 9);
}

/// An abnormal termination makes the dying process's fences AlwaysSignaled; for a
/// cross-adapter fence, the other adapters' waiters see that too, at once.
#[test]
fn a_killed_processs_cross_adapter_fence_releases_the_other_adapters_waiters() {
    let m = machine(true);
    let d = common::client_on(m.adapter(DGPU).open_process().unwrap());
    let i = common::client_on(m.adapter(IGPU).open_process().unwrap());
    let x = d.device.create_fence_with(&cross(NativeFenceType::Default)).unwrap();
    let ix = i.device.open_cross_adapter_fence(x.cross_adapter().unwrap()).unwrap();
    let pid = i.port.process();
    let w = m.adapter(IGPU).begin_fence_wait(pid, &[(ix.handle(), VALUE)], WaitMode::All).unwrap().unwrap();
    m.settle();
    assert!(!w.is_done());
    m.adapter(DGPU).terminate(d.port.process(), kernel::Termination::Abnormal);
    assert!(w.is_done(), "propagated by the termination itself");
    assert_eq!(m.adapter(IGPU).end_fence_wait(pid, &w).unwrap(), WaitOutcome::Reached(0));
    assert_eq!(ix.value().unwrap(), abi::port::FENCE_ALWAYS_SIGNALED);
}

/// Two processes of one adapter open the same cross-adapter fence: one fence object there
/// (the KMD registers it once), two local instances; closing one leaves the other working.
#[test]
fn two_processes_of_one_adapter_share_one_instance_of_a_cross_adapter_fence() {
    let m = machine(true);
    let d = common::client_on(m.adapter(DGPU).open_process().unwrap());
    let i1 = common::client_on(m.adapter(IGPU).open_process().unwrap());
    let i2 = common::client_on(m.adapter(IGPU).open_process().unwrap());
    let x = d.device.create_fence_with(&cross(NativeFenceType::Default)).unwrap();
    let handle = x.cross_adapter().unwrap();
    let f1 = i1.device.open_cross_adapter_fence(handle).unwrap();
    let f2 = i2.device.open_cross_adapter_fence(handle).unwrap();
    let creates = |m: &Machine| {
        common::events_from(m.adapter(IGPU), 0)
            .iter()
            .filter(|e| matches!(e, Event::Ddi(Ddi::CreateNativeFence(_))))
            .count()
    };
    assert_eq!(creates(&m), 1, "the iGPU's KMD knows the fence once");
    // A CPU signal through one instance wakes a waiter on the other, on the same adapter.
    let pid = i1.port.process();
    let w = m.adapter(IGPU).begin_fence_wait(pid, &[(f1.handle(), 2)], WaitMode::All).unwrap().unwrap();
    f2.signal(2).unwrap();
    assert!(w.is_done());
    assert_eq!(m.adapter(IGPU).end_fence_wait(pid, &w).unwrap(), WaitOutcome::Reached(0));
    // Closing the second leaves the first's GPU signal working (and propagating).
    drop(f2);
    let mut q = i1.user_queue();
    let mut cb = CommandBuffer::new();
    cb.signal_fence(&f1, 3);
    let v = q.submit(&cb).unwrap();
    q.wait(v, common::T).unwrap();
    m.settle();
    assert_eq!(x.value().unwrap(), 3);
    assert_ne!(q.status().unwrap().state, abi::QueueState::Hung);
}

/// A fence both shareable and cross-adapter: the instance another process opened by its
/// global handle is a cross-adapter instance too, so it keeps propagating after the creator
/// closed, and the last close on the adapter tells the cross-adapter layer.
#[test]
fn a_shareable_cross_adapter_fence_propagates_from_every_instance() {
    let m = machine(true);
    let d1 = common::client_on(m.adapter(DGPU).open_process().unwrap());
    let d2 = common::client_on(m.adapter(DGPU).open_process().unwrap());
    let i = common::client_on(m.adapter(IGPU).open_process().unwrap());
    let desc = NativeFenceDesc { shareable: true, ..cross(NativeFenceType::Default) };
    let x = d1.device.create_fence_with(&desc).unwrap();
    let handle = x.cross_adapter().unwrap();
    let y = d2.device.open_fence(x.global().unwrap()).unwrap();
    assert_eq!(y.cross_adapter(), Some(handle));
    let ix = i.device.open_cross_adapter_fence(handle).unwrap();
    drop(x);
    let pid = i.port.process();
    let w = m.adapter(IGPU).begin_fence_wait(pid, &[(ix.handle(), 4)], WaitMode::All).unwrap().unwrap();
    y.signal(4).unwrap();
    assert!(w.is_done(), "the opened instance propagated");
    m.adapter(IGPU).end_fence_wait(pid, &w).unwrap();
    drop(y);
    let closed = m.cross_trace().0.contains(&CrossEvent::Closed { fence: handle, adapter: AdapterId(1) });
    assert!(closed, "the dGPU's last instance closed");
}
