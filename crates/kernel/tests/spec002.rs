//! Spec 002 (native fences): the DDIs and interrupt forms the other fence tests did not reach —
//! the batched `DxgkDdiUpdateMonitoredValues`, a log overrun's trace flag and the traced log
//! that grows to prevent it, `DxgkDdiSetNativeFenceLogBuffer` recreating a log, the optimized
//! interrupt with a NULL
//! queue (rescan that engine's logs), and the NULL fence array with and without
//! `EvaluateLegacyMonitoredFences`. Interrupt forms the virtual device never raises by itself
//! are injected (`System::inject_notification`) after the device's own are dropped
//! (`System::drop_fence_signals`, collapsed interrupts).

mod common;

use std::time::Duration;

use abi::EngineKind;
use abi::fence_log::FenceLogType;
use abi::port::{NativeFenceType, WaitMode};
use kernel::ddi::{Notification, SignaledFences};
use kernel::trace::{Ddi, Event};
use umd::CommandBuffer;

const T: Option<Duration> = Some(Duration::from_millis(50));

#[test]
fn a_null_fence_array_scans_native_waiters_and_legacy_ones_only_when_asked() {
    let sys = common::sim();
    let c = common::client(&sys);
    let pid = c.port.process();
    let native = c.device.create_fence(0, NativeFenceType::Default).unwrap();
    let legacy = c.device.create_fence(0, NativeFenceType::LegacyMonitored).unwrap();
    let wn = sys.begin_fence_wait(pid, &[(native.handle(), 1)], WaitMode::All).unwrap().expect("blocked");
    let wl = sys.begin_fence_wait(pid, &[(legacy.handle(), 1)], WaitMode::All).unwrap().expect("blocked");
    // Both signals raise interrupts (a waiter each); both are collapsed away.
    sys.drop_fence_signals(2);
    let mut q = c.user_queue();
    let mut cb = CommandBuffer::new();
    cb.signal_fence(&native, 1).signal_fence(&legacy, 1);
    let v = q.submit(&cb).unwrap();
    q.wait(v, T).unwrap();
    assert_eq!((native.value().unwrap(), legacy.value().unwrap()), (1, 1));
    assert!(!wn.is_done() && !wl.is_done(), "their interrupts were lost");
    // NULL array, EvaluateLegacyMonitoredFences = 0: only native fence waiters are scanned.
    sys.inject_notification(Notification::NativeFenceSignaled(SignaledFences::AllNative));
    assert!(wn.is_done(), "the native waiter is found by the scan");
    assert!(!wl.is_done(), "legacy monitored fence waiters are not scanned by default");
    // EvaluateLegacyMonitoredFences = 1: every waiter.
    sys.inject_notification(Notification::NativeFenceSignaled(SignaledFences::All));
    assert!(wl.is_done());
    sys.end_fence_wait(pid, &wn).unwrap();
    sys.end_fence_wait(pid, &wl).unwrap();
}

/// "If the GPU couldn't determine which subset of fences were signaled, then it should
/// specify a NULL HWQueue handle. When Dxgkrnl sees a NULL HWQueue handle, it falls back to
/// rescan the log buffer of all HWQueues on this engine."
#[test]
fn an_optimized_interrupt_with_a_null_queue_rescans_that_engines_logs() {
    let sys = common::optimized();
    let c = common::client(&sys);
    let pid = c.port.process();
    let f = c.device.create_fence(0, NativeFenceType::Default).unwrap();
    let g = c.device.create_fence(0, NativeFenceType::Default).unwrap();
    let w = sys.begin_fence_wait(pid, &[(f.handle(), 1)], WaitMode::All).unwrap().expect("blocked");
    // g has a waiter too, but its fence is not in any log: the rescan must not settle it.
    let wg = sys.begin_fence_wait(pid, &[(g.handle(), 1)], WaitMode::All).unwrap().expect("blocked");
    sys.drop_fence_signals(2);
    let mut q = c.user_queue();
    let copy = c.context(EngineKind::Copy);
    let cq = copy.create_queue(umd::QueueOptions::user_mode()).unwrap();
    let mut cb = CommandBuffer::new();
    // f logged; g signalled without a log (a raw packet: the UMD would log it on this device).
    // Both interrupts (each naming the queue) are lost.
    cb.signal_fence_logged(&f, 1).packet(abi::Packet::SignalFence { va: g.va(), value: 1 });
    let v = q.submit(&cb).unwrap();
    q.wait(v, T).unwrap();
    assert_eq!(g.value().unwrap(), 1);
    assert!(!w.is_done() && !wg.is_done(), "the interrupts were lost");
    let compute = c.ctx.engine();
    let copy_engine = copy.engine();
    let mark = sys.trace().0.len();
    sys.inject_notification(Notification::NativeFenceSignaled(SignaledFences::EngineLogs(copy_engine)));
    let ev = common::events_from(&sys, mark);
    assert!(!w.is_done(), "the copy engine's logs do not name f");
    assert!(ev.contains(&Event::Ddi(Ddi::UpdateNativeFenceLogs(cq.handle()))), "the copy queue's log is read");
    assert!(!ev.contains(&Event::Ddi(Ddi::UpdateNativeFenceLogs(q.handle()))), "not the compute queue's: {ev:#?}");
    let mark = sys.trace().0.len();
    sys.inject_notification(Notification::NativeFenceSignaled(SignaledFences::EngineLogs(compute)));
    let ev = common::events_from(&sys, mark);
    assert!(w.is_done(), "the compute engine's logs name f");
    assert!(!wg.is_done(), "g is in no log: a rescan of the logs is not a scan of every fence");
    let flush = ev.iter().position(|e| *e == Event::Ddi(Ddi::UpdateNativeFenceLogs(q.handle()))).expect("flushed");
    let settle = ev.iter().position(|e| matches!(e, Event::Ddi(Ddi::UpdateMonitoredValues(h, _)) if *h == f.handle()));
    assert!(settle.is_some_and(|s| flush < s), "flushed before read and settled: {ev:#?}");
    assert_eq!(sys.stats().fence_log_fallbacks, 0);
    sys.end_fence_wait(pid, &w).unwrap();
    sys.end_fence_wait(pid, &wg).unwrap();
}

/// A queue-named interrupt is explained by its log only through the values logged there: an
/// entry (F, v) accounts for it when v passes F's MonitoredValue. F's live value does not:
/// another queue may have moved it. Here the queue signals B unlogged (a raw packet), which
/// raises the interrupt, then logs A at 1, which no waiter wants; a kernel-mode queue then
/// takes A to 2, past its waiter. The log names A, and A's live value is past its
/// MonitoredValue, but the logged 1 is not: the log does not explain the interrupt, so the OS
/// scans and B's waiter wakes.
#[test]
fn a_queue_named_interrupt_is_explained_only_by_a_logged_value_past_the_monitored_one() {
    let sys = common::optimized();
    let c = common::client(&sys);
    let pid = c.port.process();
    let a = c.device.create_fence(0, NativeFenceType::Default).unwrap();
    let b = c.device.create_fence(0, NativeFenceType::Default).unwrap();
    let wa = sys.begin_fence_wait(pid, &[(a.handle(), 2)], WaitMode::All).unwrap().expect("blocked");
    let wb = sys.begin_fence_wait(pid, &[(b.handle(), 1)], WaitMode::All).unwrap().expect("blocked");
    // B's interrupt (naming the queue) and A's (naming the fence) are lost, and the first is
    // injected below, after both signals ran.
    sys.drop_fence_signals(2);
    let mut q = c.user_queue();
    let mut cb = CommandBuffer::new();
    cb.packet(abi::Packet::SignalFence { va: b.va(), value: 1 }).signal_fence_logged(&a, 1);
    let v = q.submit(&cb).unwrap();
    q.wait(v, T).unwrap();
    let mut k = c.kernel_queue();
    let mut cb = CommandBuffer::new();
    cb.signal_fence(&a, 2);
    let v = k.submit(&cb).unwrap();
    k.wait(v, T).unwrap();
    assert_eq!((a.value().unwrap(), b.value().unwrap()), (2, 1));
    assert!(!wa.is_done() && !wb.is_done(), "both interrupts were lost");
    sys.inject_notification(Notification::NativeFenceSignaled(SignaledFences::Queues(vec![q.handle()])));
    assert!(wb.is_done(), "the log (A at 1) does not explain the interrupt: the OS scans and finds B");
    assert!(wa.is_done(), "and A, in the same scan");
    assert_eq!(sys.stats().fence_log_fallbacks, 1);
    sys.end_fence_wait(pid, &wa).unwrap();
    sys.end_fence_wait(pid, &wb).unwrap();
}

/// The same burst of logged signals, nobody reading the log until the last one: 91 entries.
/// Returns the overrun flags in the trace, the fallback scans, and the signal log as read
/// afterwards.
fn logged_burst(sys: &kernel::System) -> (Vec<u64>, u64, abi::fence_log::LogRead) {
    let c = common::client(sys);
    let a = c.device.create_fence(0, NativeFenceType::Default).unwrap();
    let b = c.device.create_fence(0, NativeFenceType::Default).unwrap();
    let mut q = c.user_queue();
    let mut cb = CommandBuffer::new();
    cb.wait(c.buf.va(), 1);
    for v in 1..=90 {
        cb.signal_fence_logged(&a, v); // no waiter: no interrupt, nobody reads the log
    }
    cb.signal_fence_logged(&b, 1);
    q.submit(&cb).unwrap();
    c.buf.write_u64(0, 1).unwrap();
    b.wait(1, T).unwrap();
    let flags = common::events(sys)
        .into_iter()
        .filter_map(|e| match e {
            Event::FenceLogOverrun { queue, lost } if queue == q.handle() => Some(lost),
            _ => None,
        })
        .collect();
    let read = sys.read_fence_log(c.port.process(), q.handle(), FenceLogType::Signal, 0).unwrap();
    (flags, sys.stats().fence_log_fallbacks, read)
}

/// Spec 002 "Log buffer overrun is permitted": untraced, a burst longer than the log overruns
/// it — the OS falls back to a scan and flags the lost events in the trace. "When tracing is
/// enabled, the OS first increases the size of the log buffer to prevent overruns in the
/// first place": traced, the same burst loses nothing.
#[test]
fn an_overrun_log_is_flagged_and_a_traced_log_is_large_enough_to_lose_nothing() {
    let (flags, fallbacks, read) = logged_burst(&common::optimized());
    assert_eq!(flags, [8], "one flag, with the events lost");
    assert_eq!(fallbacks, 1, "the overrun log cannot be trusted: scan");
    assert_eq!((read.entries.len(), read.lost, read.total), (83, 8, 91));

    let traced = common::optimized();
    traced.set_fence_log_tracing(true).unwrap();
    let (flags, fallbacks, read) = logged_burst(&traced);
    assert_eq!((flags, fallbacks), (vec![], 0), "no overrun, no fallback");
    assert_eq!((read.entries.len(), read.lost, read.total), (91, 0, 91), "every event kept");
    assert_eq!(read.entries.iter().map(|e| e.fence_value).take(3).collect::<Vec<_>>(), [1, 2, 3]);
    let created = common::events(&traced)
        .into_iter()
        .filter_map(|e| match e {
            Event::FenceLogRecreated { entries, .. } => Some(entries),
            _ => None,
        })
        .count();
    assert_eq!(created, 0, "a queue created while tracing gets large logs at once");
}

/// "Dxgkrnl can destroy and recreate a log buffer. Each time it does, it calls
/// DxgkDdiSetNativeFenceLogBuffer to inform KMD of the new location." Turning tracing on
/// recreates a running queue's logs larger, in the order `Os::recreate_fence_log` gives: the
/// new log (starting at the old one's next position), the DDI, then the old signal log
/// flushed and read to its end — so a signal still unread in it is not lost — and the UMD's
/// positions go on in the new log.
#[test]
fn tracing_recreates_a_running_queues_logs_larger_in_the_specs_order_and_loses_nothing() {
    let sys = common::optimized();
    let c = common::client(&sys);
    let pid = c.port.process();
    let f = c.device.create_fence(0, NativeFenceType::Default).unwrap();
    let mut q = c.user_queue();
    // At creation: one DxgkDdiSetNativeFenceLogBuffer per log.
    let sets =
        common::events(&sys).iter().filter(|e| **e == Event::Ddi(Ddi::SetNativeFenceLogBuffer(q.handle()))).count();
    assert_eq!(sets, 2, "waits and signals");
    // f = 1, logged; its interrupt is lost, so the entry waits unread in the old log.
    let w = sys.begin_fence_wait(pid, &[(f.handle(), 1)], WaitMode::All).unwrap().expect("blocked");
    sys.drop_fence_signals(1);
    let mut cb = CommandBuffer::new();
    cb.signal_fence_logged(&f, 1);
    let v = q.submit(&cb).unwrap();
    q.wait(v, T).unwrap();
    assert!(!w.is_done(), "its interrupt was lost");

    let mark = sys.trace().0.len();
    sys.set_fence_log_tracing(true).unwrap();
    let ev = common::events_from(&sys, mark);
    assert_eq!(ev.first(), Some(&Event::FenceLogTracing { on: true }));
    let h = q.handle();
    common::find_run(
        &ev,
        &[
            Event::FenceLogRecreated { queue: h, kind: FenceLogType::Wait, entries: 340 },
            Event::Ddi(Ddi::SetNativeFenceLogBuffer(h)),
            Event::FenceLogRecreated { queue: h, kind: FenceLogType::Signal, entries: 340 },
            Event::Ddi(Ddi::SetNativeFenceLogBuffer(h)),
            Event::Ddi(Ddi::UpdateNativeFenceLogs(h)),
        ],
    );
    assert!(w.is_done(), "the old log's unread signal was read before the log was dropped");
    assert_eq!(sys.stats().fence_log_fallbacks, 0, "from the log, not a scan");
    let fresh = sys.read_fence_log(pid, h, FenceLogType::Signal, 1).unwrap();
    assert_eq!((fresh.total, fresh.entries.len()), (1, 0), "the new log starts where the old one stopped");
    // The UMD's next position (1) lands in the new, larger log.
    let mut cb = CommandBuffer::new();
    cb.signal_fence_logged(&f, 2);
    let v = q.submit(&cb).unwrap();
    q.wait(v, T).unwrap();
    let r = sys.read_fence_log(pid, h, FenceLogType::Signal, 1).unwrap();
    assert_eq!((r.total, r.lost), (2, 0));
    assert_eq!(r.entries.iter().map(|e| e.fence_value).collect::<Vec<_>>(), [2]);
    sys.end_fence_wait(pid, &w).unwrap();
    // Off again: logs of the spec's size, positions still going on.
    sys.set_fence_log_tracing(false).unwrap();
    assert_eq!(sys.read_fence_log(pid, h, FenceLogType::Signal, 2).unwrap().total, 2);
    // A kernel-mode queue has no log to recreate.
    let k = c.kernel_queue();
    assert!(sys.recreate_fence_log(pid, k.handle(), FenceLogType::Wait).is_err());
}

/// Turning tracing on recreates every queue's logs on their own: one whose recreation fails
/// (here the DDI refuses its wait log) keeps its old, working log, and the other process's
/// queue still gets both of its new logs; the failure is reported.
#[test]
fn a_log_that_cannot_be_recreated_costs_no_other_queue_its_new_logs() {
    use kernel::ddi::{DdiFault, DdiKind};
    let sys = common::optimized();
    let (a, b) = (common::client(&sys), common::client(&sys));
    let (mut qa, qb) = (a.user_queue(), b.user_queue());
    let mark = sys.trace().0.len();
    // The first call is the first queue's (process a's) wait log.
    sys.inject_ddi_fault(DdiFault { ddi: DdiKind::SetNativeFenceLogBuffer, call: 1 });
    let e = sys.set_fence_log_tracing(true).unwrap_err();
    assert!(e.to_string().contains("SetNativeFenceLogBuffer"), "{e}");
    let recreated = |q: abi::HwQueueHandle| -> Vec<FenceLogType> {
        common::events_from(&sys, mark)
            .iter()
            .filter_map(|e| match e {
                Event::FenceLogRecreated { queue, kind, entries: 340 } if *queue == q => Some(*kind),
                _ => None,
            })
            .collect()
    };
    assert_eq!(recreated(qb.handle()), [FenceLogType::Wait, FenceLogType::Signal], "b's logs, after a's failure");
    let installed = |q| {
        common::events_from(&sys, mark).iter().filter(|e| **e == Event::Ddi(Ddi::SetNativeFenceLogBuffer(q))).count()
    };
    assert_eq!(installed(qb.handle()), 2, "both of b's new logs were installed");
    assert_eq!(installed(qa.handle()), 2, "a's wait log was tried (and refused), its signal log installed");
    // a's queue still works, logged signals and all.
    let f = a.device.create_fence(0, NativeFenceType::Default).unwrap();
    let mut cb = CommandBuffer::new();
    cb.signal_fence_logged(&f, 1);
    let v = qa.submit(&cb).unwrap();
    qa.wait(v, T).unwrap();
    assert_eq!(f.value().unwrap(), 1);
}

/// The native fence caps reach the UMD through `KernelPort`, and it acts on them: where the
/// signaled interrupt names the queue (`OptimizedNativeFenceSignaledInterrupt`), the OS learns
/// which fences were signalled from the queue's signal log alone, so a user-mode queue logs
/// every native fence signal — in stream order with the ones the buffer logs itself. Without
/// the cap the interrupt names the fence and nothing is logged unasked.
#[test]
fn the_umd_reads_the_native_fence_caps_and_logs_every_signal_where_the_interrupt_names_the_queue() {
    let sys = common::optimized();
    let c = common::client(&sys);
    let pid = c.port.process();
    let caps = c.port.native_fence_caps().unwrap();
    assert_eq!(caps, sys.native_fence_caps(), "what the OS accepted from the KMD");
    assert!(caps.optimized_interrupt && caps.supported);
    assert_eq!(c.device.native_fence_caps(), caps);
    let f = c.device.create_fence(0, NativeFenceType::Default).unwrap();
    let g = c.device.create_fence(0, NativeFenceType::Default).unwrap();
    let mut q = c.user_queue();
    let w = sys.begin_fence_wait(pid, &[(f.handle(), 3)], WaitMode::All).unwrap().expect("blocked");
    let mut cb = CommandBuffer::new();
    cb.signal_fence(&f, 2).signal_fence_logged(&g, 1).write_u32(c.buf.va(), 7).signal_fence(&f, 3);
    let v = q.submit(&cb).unwrap();
    q.wait(v, T).unwrap();
    assert!(w.is_done(), "woken from the log");
    assert_eq!(c.buf.read_u32(0).unwrap(), 7, "the packets around the signals are intact");
    let st = sys.stats();
    assert_eq!((st.fence_interrupts, st.fence_log_fallbacks), (1, 0), "one interrupt, read from the log");
    let log = sys.read_fence_log(pid, q.handle(), FenceLogType::Signal, 0).unwrap();
    let seen: Vec<(u64, u64)> = log.entries.iter().map(|e| (e.fence_handle, e.fence_value)).collect();
    let (fid, gid) = (seen[0].0, seen[1].0);
    assert!(fid != 0 && gid != 0 && fid != gid);
    assert_eq!(seen, [(fid, 2), (gid, 1), (fid, 3)], "every signal logged, in order");
    // A kernel-mode queue (no logs) takes a plain signal as it is.
    let mut k = c.kernel_queue();
    let mut cb = CommandBuffer::new();
    cb.signal_fence(&f, 4);
    let v = k.submit(&cb).unwrap();
    k.wait(v, T).unwrap();
    assert_eq!(f.value().unwrap(), 4);
    sys.end_fence_wait(pid, &w).unwrap();

    // Without the cap: the interrupt names the fence, and nothing is logged unasked.
    let plain = common::sim();
    let c = common::client(&plain);
    assert!(!c.device.native_fence_caps().optimized_interrupt);
    let f = c.device.create_fence(0, NativeFenceType::Default).unwrap();
    let mut q = c.user_queue();
    let w = plain.begin_fence_wait(c.port.process(), &[(f.handle(), 1)], WaitMode::All).unwrap().expect("blocked");
    let mut cb = CommandBuffer::new();
    cb.signal_fence(&f, 1);
    let v = q.submit(&cb).unwrap();
    q.wait(v, T).unwrap();
    assert!(w.is_done());
    assert_eq!(plain.read_fence_log(c.port.process(), q.handle(), FenceLogType::Signal, 0).unwrap().total, 0);
    assert_eq!(plain.stats().fence_log_fallbacks, 0);
    plain.end_fence_wait(c.port.process(), &w).unwrap();
}

/// `DxgkDdiUpdateMonitoredValues` takes a batch: one interrupt that settles several fences
/// programs all their MonitoredValues in one call.
#[test]
fn monitored_values_are_updated_in_one_batched_ddi_call() {
    let sys = common::sim();
    let c = common::client(&sys);
    let pid = c.port.process();
    let fences: Vec<_> = (0..3).map(|_| c.device.create_fence(0, NativeFenceType::Default).unwrap()).collect();
    let waits: Vec<_> = fences
        .iter()
        .map(|f| sys.begin_fence_wait(pid, &[(f.handle(), 1)], WaitMode::All).unwrap().expect("blocked"))
        .collect();
    sys.drop_fence_signals(3);
    let mut q = c.user_queue();
    let mut cb = CommandBuffer::new();
    for f in &fences {
        cb.signal_fence(f, 1);
    }
    let v = q.submit(&cb).unwrap();
    q.wait(v, T).unwrap();
    let before = sys.stats();
    sys.inject_notification(Notification::NativeFenceSignaled(SignaledFences::All));
    let after = sys.stats();
    assert!(waits.iter().all(|w| w.is_done()));
    assert_eq!(after.monitored_updates - before.monitored_updates, 1, "one DDI call");
    assert_eq!(after.monitored_values - before.monitored_values, 3, "carrying the three fences");
    for f in &fences {
        let vals = c.port.query_native_fence(f.handle()).unwrap();
        assert_eq!(vals.monitored, u64::MAX, "no waiter left: the KMD stored u64::MAX");
    }
    for w in &waits {
        sys.end_fence_wait(pid, w).unwrap();
    }
}

/// Spec 002 "Querying native fence feature enablement in OS": a KMD advertises native fences
/// only if the OS enabled the feature, and the OS fails adapter initialization when a KMD
/// advertises them anyway.
#[test]
fn native_fence_support_is_negotiated_and_a_mismatch_fails_adapter_initialization() {
    use abi::port::{KernelError, UserQueueMode};
    use kernel::SystemConfig;
    // Enabled: the caps come as a structure.
    let sys = common::optimized();
    let caps = sys.native_fence_caps();
    assert!(caps.supported && caps.optimized_interrupt && !caps.map_to_gpu_system_process);
    assert_eq!(
        (caps.current_value_stride, caps.monitored_value_stride),
        (kernel::os::FENCE_STRIDE, kernel::os::FENCE_STRIDE)
    );
    assert!(!common::sim().native_fence_caps().optimized_interrupt, "reported, not assumed");
    // The OS disables the feature; a correct KMD does not advertise it (kernel queues only).
    let cfg = SystemConfig {
        os_disables_native_fences: true,
        user_queue_mode: UserQueueMode::KernelOnly,
        ..SystemConfig::default()
    };
    let sys = kernel::System::sim(cfg.clone()).expect("a correct KMD initializes");
    assert!(!sys.native_fence_caps().supported);
    let c = common::client(&sys);
    let e = c.device.create_fence(0, NativeFenceType::Default).err().expect("no native fences");
    assert!(format!("{e}").contains("Default"), "{e}");
    c.device.create_fence(0, NativeFenceType::LegacyMonitored).expect("monitored fences remain");
    // A KMD that advertises native fences without asking: initialization fails cleanly.
    match kernel::System::sim(SystemConfig { kmd_ignores_feature_query: true, ..cfg }) {
        Err(KernelError::FeatureMismatch { feature, .. }) => assert_eq!(feature, "DXGK_FEATURE_NATIVE_FENCE"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("the OS must refuse a KMD that advertises a feature it did not enable"),
    }
    // Without the OS feature, user-mode queues (which need native fences) are refused.
    let e = kernel::System::sim(SystemConfig { os_disables_native_fences: true, ..SystemConfig::default() })
        .err()
        .expect("refused");
    assert!(matches!(e, KernelError::InvalidArgument { field: "user_queue_mode", .. }), "{e}");
}

/// `MapToGpuSystemProcess`: the OS maps each fence's CurrentValue and MonitoredValue into the
/// GPU system process and passes those VAs to `DxgkDdiCreateNativeFence`; the CMP reads the
/// same words there.
#[test]
fn with_map_to_gpu_system_process_the_cmp_sees_each_fence_in_the_system_process() {
    let sys = common::sim_with(kernel::SystemConfig { map_fences_to_system_process: true, ..Default::default() });
    assert!(sys.native_fence_caps().map_to_gpu_system_process);
    let c = common::client(&sys);
    let pid = c.port.process();
    let packed = c.device.create_fence(5, NativeFenceType::Default).unwrap();
    let packed2 = c.device.create_fence(6, NativeFenceType::Default).unwrap();
    let shared = c
        .device
        .create_fence_with(&abi::port::NativeFenceDesc {
            shareable: true,
            ..abi::port::NativeFenceDesc::new(7, NativeFenceType::Default)
        })
        .unwrap();
    let mut seen = Vec::new();
    for (f, v) in [(&packed, 5), (&packed2, 6), (&shared, 7)] {
        let (cva, mva) = sys.native_fence_system_vas(pid, f.handle()).unwrap().expect("mapped for the CMP");
        assert_ne!(cva, f.va(), "a system-process VA, not the process's");
        assert_eq!(sys.read_system_process_u64(cva), Some(v), "CurrentValue through the system process");
        assert_eq!(sys.read_system_process_u64(mva), Some(u64::MAX), "MonitoredValue: no waiter");
        seen.push((cva, mva));
    }
    assert_eq!(seen[1].0 - seen[0].0, kernel::os::FENCE_STRIDE, "packed at the KMD's stride there too");
    // A CPU waiter moves MonitoredValue; a signal moves CurrentValue: the CMP sees both.
    let w = sys.begin_fence_wait(pid, &[(packed.handle(), 9)], WaitMode::All).unwrap().expect("blocked");
    assert_eq!(sys.read_system_process_u64(seen[0].1), Some(8));
    packed.signal(9).unwrap();
    assert!(w.is_done());
    assert_eq!(sys.read_system_process_u64(seen[0].0), Some(9));
    sys.end_fence_wait(pid, &w).unwrap();
    // Without the cap nothing is mapped there.
    let plain = common::sim();
    let pc = common::client(&plain);
    let f = pc.device.create_fence(0, NativeFenceType::Default).unwrap();
    assert_eq!(plain.native_fence_system_vas(pc.port.process(), f.handle()).unwrap(), None);
}

/// Spec 002 "Indicating a native progress fence for hardware queues": a queue's progress fence
/// is a native fence — a CPU wait on it programs its MonitoredValue and the engine's
/// `PROGRESS_FENCE` raises the native interrupt only for a waiter; another queue's `WAIT`
/// parks on it; the CPU cannot signal it; it goes with its queue.
#[test]
fn a_queues_progress_fence_is_a_native_fence() {
    let sys = common::sim();
    let c = common::client(&sys);
    let pid = c.port.process();
    let mut q = c.user_queue();
    let pf = q.progress_fence().unwrap();
    assert_eq!(pf.va(), q.progress_va(), "the same word the engine writes");
    // No waiter: the engine's progress raises no native interrupt.
    let before = sys.stats().fence_interrupts;
    let mut cb = CommandBuffer::new();
    cb.write_u32(c.buf.va(), 1);
    let v1 = q.submit(&cb).unwrap();
    q.wait(v1, T).unwrap();
    assert_eq!(pf.value().unwrap(), v1);
    assert_eq!(sys.stats().fence_interrupts, before, "no CPU waiter, no interrupt");
    // A CPU waiter: MonitoredValue is (value − 1), and the engine's progress interrupts.
    let gate = c.buf.va() + 0x100;
    let mut cb = CommandBuffer::new();
    cb.wait(gate, 1);
    let v2 = q.submit(&cb).unwrap();
    let w = sys.begin_fence_wait(pid, &[(pf.handle(), v2)], WaitMode::All).unwrap().expect("blocked");
    assert_eq!(c.port.query_native_fence(pf.handle()).unwrap().monitored, v2 - 1);
    // Another queue waits on it from the GPU.
    let copy = c.context(EngineKind::Copy);
    let mut other = copy.create_queue(umd::QueueOptions::user_mode()).unwrap();
    let mut cb = CommandBuffer::new();
    cb.wait_fence(&pf, v2).write_u32(c.buf.va() + 4, 2);
    let ov = other.submit(&cb).unwrap();
    sys.settle();
    assert!(!w.is_done());
    c.buf.write_u64(0x100, 1).unwrap();
    other.wait(ov, T).unwrap();
    assert!(w.is_done(), "woken by the native interrupt");
    assert_eq!(sys.stats().fence_interrupts, before + 1);
    assert_eq!(c.buf.read_u32(4).unwrap(), 2);
    sys.end_fence_wait(pid, &w).unwrap();
    // Only the engine signals it.
    let e = pf.signal(v2 + 1).unwrap_err();
    assert!(matches!(common::umd_refusal(&e), Some(("fence", abi::port::Invalid::Unsupported(_)))), "{e}");
    // It goes with its queue.
    let h = pf.handle();
    drop(q);
    assert!(c.port.query_native_fence(h).is_err(), "destroyed with its queue");
}

/// Spec 002 "DDI to support placement of native fence values in local memory": the OS places a
/// fence's values in the segments the KMD names for its type (`IntraGpu`: local memory), and a
/// cross-adapter fence's CurrentValue always in system memory.
#[test]
fn fence_values_are_placed_where_the_kmd_says() {
    use abi::port::MemoryDomain::{Local, System};
    let sys = common::sim();
    let c = common::client(&sys);
    let pid = c.port.process();
    let d = c.device.create_fence(0, NativeFenceType::Default).unwrap();
    let g = c.device.create_fence(0, NativeFenceType::IntraGpu).unwrap();
    assert_eq!(sys.native_fence_storage(pid, d.handle()).unwrap(), (System, System));
    assert_eq!(sys.native_fence_storage(pid, g.handle()).unwrap(), (Local, Local));
    assert!(g.value().is_err(), "local memory: no CPU access");
}
