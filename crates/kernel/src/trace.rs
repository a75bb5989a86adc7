//! The kernel's event log: DDI calls, callbacks and OS actions, in the order they happened.
//!
//! Tests assert the spec's sequences against it (connect = F0 transition, then
//! `DxgkDdiConnectDoorbell`, then the CPU VA rotation, then the status write), and
//! `doorbell demo` prints it. It records control-path events only; the data path never
//! touches it. The log is bounded: past [`TRACE_CAPACITY`] entries the oldest are dropped and
//! counted. What it records of a DDI call ([`Ddi`]) is declared with the DDI in the DDI
//! table (`crate::ddis`), which this module and [`crate::ddi`] both import.

use std::collections::VecDeque;
use std::sync::Arc;

use abi::queue::FaultRecord;
use abi::{DoorbellStatus, EngineId, HwQueueHandle, NativeFenceHandle, PowerState, Time};
use parking_lot::Mutex;

pub use crate::ddis::Ddi;
use crate::ddis::DdiKind;

/// Entries kept.
pub const TRACE_CAPACITY: usize = 1 << 16;

/// Where a doorbell's CPU page points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageTarget {
    /// The doorbell BAR page (connected).
    Bar,
    /// The dummy page (writes have no effect).
    Dummy,
}

/// A callback from the KMD into the OS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Callback {
    /// `DxgkCbDisconnectDoorbell`: the KMD needs this queue's doorbell (victimization).
    DisconnectDoorbell(HwQueueHandle),
}

/// One logged event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A DDI call.
    Ddi(Ddi),
    /// A KMD callback into the OS.
    Callback(Callback),
    /// A queue was created.
    QueueCreated {
        /// Queue.
        queue: HwQueueHandle,
        /// Engine.
        engine: EngineId,
        /// User-mode submission?
        user_mode: bool,
    },
    /// A doorbell's CPU page was rotated.
    Rotate {
        /// Queue.
        queue: HwQueueHandle,
        /// New target.
        to: PageTarget,
    },
    /// A doorbell status word was written.
    Status {
        /// Queue.
        queue: HwQueueHandle,
        /// New status.
        status: DoorbellStatus,
    },
    /// The firmware asked for an engine state change.
    EngineRequest {
        /// Engine.
        engine: EngineId,
        /// Requested transition.
        state: abi::EngineState,
    },
    /// An engine's power state changed.
    Power {
        /// Engine.
        engine: EngineId,
        /// New state.
        state: PowerState,
    },
    /// The device changed D-state (D0 ↔ D3).
    DevicePower {
        /// Entering D3 (`false`: back to D0).
        d3: bool,
    },
    /// An allocation was evicted from local memory, or made resident again.
    Residency {
        /// The allocation.
        allocation: abi::AllocationHandle,
        /// Resident again (`false`: evicted).
        resident: bool,
    },
    /// The firmware refused F1 because work was pending.
    F1Refused {
        /// Engine.
        engine: EngineId,
    },
    /// A queue faulted and was marked hung.
    QueueFault {
        /// Queue.
        queue: HwQueueHandle,
        /// Fault.
        fault: FaultRecord,
    },
    /// This adapter saw a cross-adapter fence signalled and handed it to the OS for
    /// propagation to the other adapters.
    CrossAdapterSignal {
        /// The local handle.
        fence: NativeFenceHandle,
    },
    /// Another adapter's signal of a cross-adapter fence was propagated here.
    CrossAdapterNotified {
        /// The local handle.
        fence: NativeFenceHandle,
    },
    /// A user interrupt arrived.
    UserInterrupt {
        /// Queue.
        queue: HwQueueHandle,
        /// Id from the packet.
        id: u32,
    },
    /// A preemption request was answered (`DXGK_INTERRUPT_DMA_PREEMPTED`).
    Preempted {
        /// Queue.
        queue: HwQueueHandle,
        /// The request's ticket.
        ticket: u64,
        /// From the request to the answer, on the device clock (ns).
        latency_ns: u64,
    },
    /// A preempted kernel-mode queue's unstarted buffers left its hardware queue, to be
    /// resubmitted: paging buffers with these same fence IDs, the others with new ones.
    Unsubmitted {
        /// The queue.
        queue: HwQueueHandle,
        /// Fence IDs of its paging buffers taken back.
        paging: Vec<u64>,
        /// Fence IDs of its other buffers taken back.
        other: Vec<u64>,
    },
    /// A migration failed: the buffer's GPU mapping was taken out, and the queues whose rings
    /// lie in it report `InvalidVa`.
    MappingLost {
        /// The buffer.
        allocation: abi::AllocationHandle,
        /// Its GPU VA.
        va: u64,
        /// What the KMD answered.
        error: String,
    },
    /// A reset DDI took longer than `TdrDdiDelay`: treated as no answer, recovery escalates.
    DdiTimeout {
        /// The DDI.
        ddi: DdiKind,
        /// How long it took (ms).
        took_ms: u64,
    },
    /// The engine watchdog found an engine that made no progress for a `TdrDelay` while a
    /// queue with work waited for a slot: the queues in its slots are asked to preempt.
    EngineStalled {
        /// The engine.
        engine: EngineId,
        /// Its slot holders asked to preempt.
        holders: u32,
        /// Its queues with work waiting for a slot.
        waiting: u32,
    },
    /// A preemption request went unanswered for `TdrDelay`: recovery starts (spec 003).
    TdrTimeout {
        /// The queue that would not yield.
        queue: HwQueueHandle,
        /// Its engine.
        engine: EngineId,
    },
    /// The hang timer found a queue that ran for its limit without its progress fence moving
    /// (it answered the preemption request sent first): a per-queue reset follows.
    HangTimeout {
        /// The queue that made no progress.
        queue: HwQueueHandle,
        /// Its engine.
        engine: EngineId,
        /// How long it ran without progress (ms of device time executing).
        ran_ms: u64,
    },
    /// A recovery finished: an engine reset (`engine` set) or an adapter reset; `count` is
    /// the recoveries within `TdrLimitTime`, this one included.
    Recovered {
        /// The engine reset, or `None` for the adapter.
        engine: Option<EngineId>,
        /// Recoveries within the limit window.
        count: u32,
    },
    /// The KMD reported something impossible (a fence ID outside the submitted range): the
    /// report is refused and recovery escalates.
    DriverBug {
        /// What it reported.
        what: String,
    },
    /// A device was lost: its doorbells disconnected with `DisconnectedAbort`, its queues
    /// stopped, its fences AlwaysSignaled, its CPU waits failed with `DeviceLost`.
    DeviceLost {
        /// The device.
        device: abi::DeviceHandle,
    },
    /// More than `TdrLimitCount` recoveries within `TdrLimitTime`: the adapter is lost for
    /// good and refuses new work.
    AdapterFatal,
    /// A memory event needs a buffer moved (spec 001): its process's queues are being
    /// preempted.
    MigrationStarted {
        /// The allocation.
        allocation: abi::AllocationHandle,
        /// Where it goes.
        to: abi::port::MemoryDomain,
    },
    /// The KMD unbound a victim's physical doorbell, after the OS's `DxgkCbDisconnectDoorbell`
    /// returned (spec 000 "Victimizing doorbell pseudocode": "KMD gets back control and does
    /// the actual victimization/disconnection").
    VictimUnbound {
        /// The victim.
        queue: HwQueueHandle,
    },
    /// A device was marked in error (abnormal termination, step 1): its fences become
    /// AlwaysSignaled.
    DeviceError {
        /// The device.
        device: abi::DeviceHandle,
    },
    /// Normal termination, step 2: the OS starts waiting for the queue's last-queued progress
    /// value (its doorbell already disconnected).
    TerminationWait {
        /// The queue.
        queue: HwQueueHandle,
        /// The last-queued value waited for.
        value: u64,
        /// The completed value when the wait started.
        completed: u64,
    },
    /// The wait ended: the value was reached, or not (the termination turns abnormal).
    TerminationWaitDone {
        /// The queue.
        queue: HwQueueHandle,
        /// Whether the last-queued value was reached.
        reached: bool,
    },
    /// A queue's fence log was overrun: the engine overwrote entries the OS never read (spec
    /// 002 "Log buffer overrun is permitted": the trace flag that events were lost).
    FenceLogOverrun {
        /// The queue.
        queue: HwQueueHandle,
        /// Entries lost.
        lost: u64,
    },
    /// A disconnected queue's doorbell was rung from the GPU: the OS reconnects it.
    DisconnectedRing {
        /// The queue.
        queue: HwQueueHandle,
    },
    /// The OS recreated a queue's fence log (`DxgkDdiSetNativeFenceLogBuffer` follows).
    FenceLogRecreated {
        /// The queue.
        queue: HwQueueHandle,
        /// Which log.
        kind: abi::fence_log::FenceLogType,
        /// Entries the new log holds.
        entries: u32,
    },
    /// The OS turned fence-log tracing on or off (its logs grow while it traces).
    FenceLogTracing {
        /// On or off.
        on: bool,
    },
}

/// An event an operator or a researcher looks for on a timeline ([`Event::notable`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Notable {
    /// A queue faulted.
    Fault,
    /// A preemption request timed out (TDR).
    Tdr,
    /// The hang timer found a queue running without progress (it answered its preemption).
    Hang,
    /// An engine or the adapter was reset.
    Reset,
    /// A doorbell was victimized (its physical doorbell taken for another queue).
    Victimized,
    /// A device was marked in error (abnormal termination).
    DeviceError,
    /// A device was lost.
    DeviceLost,
    /// The adapter was lost for good.
    AdapterLost,
    /// A preemption request was answered.
    Preempted,
    /// The device entered D3.
    D3,
}

impl Notable {
    /// A short name: `fault`, `tdr`, `hang timeout`, `reset`, `victimized`, `device error`, `device lost`,
    /// `adapter lost`, `preempted`, `d3`.
    pub fn name(self) -> &'static str {
        match self {
            Notable::Fault => "fault",
            Notable::Tdr => "tdr",
            Notable::Hang => "hang timeout",
            Notable::Reset => "reset",
            Notable::Victimized => "victimized",
            Notable::DeviceError => "device error",
            Notable::DeviceLost => "device lost",
            Notable::AdapterLost => "adapter lost",
            Notable::Preempted => "preempted",
            Notable::D3 => "d3",
        }
    }

    /// Something went wrong (not a routine preemption or power change): what
    /// `doorbell status` and `top` list among the recent events.
    pub fn is_trouble(self) -> bool {
        !matches!(self, Notable::Preempted | Notable::D3)
    }
}

impl Event {
    /// What kind of notable event this is, or `None` for the protocol's routine steps.
    pub fn notable(&self) -> Option<Notable> {
        Some(match self {
            Event::QueueFault { .. } => Notable::Fault,
            Event::TdrTimeout { .. } => Notable::Tdr,
            Event::HangTimeout { .. } => Notable::Hang,
            Event::Recovered { .. } => Notable::Reset,
            Event::VictimUnbound { .. } => Notable::Victimized,
            Event::DeviceError { .. } => Notable::DeviceError,
            Event::DeviceLost { .. } => Notable::DeviceLost,
            Event::AdapterFatal => Notable::AdapterLost,
            Event::Preempted { .. } => Notable::Preempted,
            Event::DevicePower { d3: true } => Notable::D3,
            _ => return None,
        })
    }
}

impl core::fmt::Display for Event {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Event::Ddi(d) => write!(f, "DDI {d:?}"),
            Event::Callback(c) => write!(f, "callback {c:?}"),
            Event::QueueCreated { queue, engine, user_mode } => {
                write!(
                    f,
                    "{queue} created on {engine} ({})",
                    if *user_mode { "user-mode submission" } else { "kernel-mode submission" }
                )
            }
            Event::Rotate { queue, to } => write!(f, "{queue}: doorbell CPU page -> {to:?} page"),
            Event::Status { queue, status } => write!(f, "{queue}: doorbell status = {status:?}"),
            Event::EngineRequest { engine, state } => write!(f, "{engine}: firmware requests {state:?}"),
            Event::Power { engine, state } => write!(f, "{engine}: now {state:?}"),
            Event::F1Refused { engine } => write!(f, "{engine}: F1 refused, work pending"),
            Event::DevicePower { d3 } => write!(f, "device: now {}", if *d3 { "D3" } else { "D0" }),
            Event::Residency { allocation, resident } => {
                write!(f, "{allocation}: {}", if *resident { "resident again" } else { "evicted to system memory" })
            }
            Event::QueueFault { queue, fault } => write!(f, "{queue}: FAULT {fault}"),
            Event::UserInterrupt { queue, id } => write!(f, "{queue}: user interrupt {id}"),
            Event::CrossAdapterSignal { fence } => write!(f, "{fence}: signalled, propagating to the other adapters"),
            Event::CrossAdapterNotified { fence } => write!(f, "{fence}: signalled on another adapter"),
            Event::Preempted { queue, ticket, latency_ns } => {
                write!(f, "{queue}: preempted (request {ticket}, answered in {latency_ns} ns)")
            }
            Event::Unsubmitted { queue, paging, other } => {
                write!(
                    f,
                    "{queue}: preempted buffers taken back (paging, same fence IDs: {paging:?}; others, new IDs: {other:?})"
                )
            }
            Event::MappingLost { allocation, va, error } => {
                write!(f, "{allocation} at {va:#x}: migration failed ({error}), GPU mapping taken out")
            }
            Event::DdiTimeout { ddi, took_ms } => write!(f, "{ddi:?} took {took_ms} ms, past TdrDdiDelay: escalating"),
            Event::EngineStalled { engine, holders, waiting } => write!(
                f,
                "{engine}: no progress for TdrDelay with {waiting} queue(s) waiting for a slot, \
                 asking its {holders} slot holder(s) to preempt"
            ),
            Event::TdrTimeout { queue, engine } => {
                write!(f, "{queue} on {engine}: TDR timeout, no answer to preemption")
            }
            Event::HangTimeout { queue, engine, ran_ms } => {
                write!(f, "{queue} on {engine}: hang timeout, ran {ran_ms} ms without progress")
            }
            Event::Recovered { engine: Some(e), count } => write!(f, "{e}: engine reset (recovery {count})"),
            Event::Recovered { engine: None, count } => write!(f, "adapter reset and restarted (recovery {count})"),
            Event::DriverBug { what } => write!(f, "KMD BUG refused: {what}"),
            Event::DeviceLost { device } => write!(f, "{device}: DEVICE LOST"),
            Event::AdapterFatal => write!(f, "adapter: too many recoveries, lost for good"),
            Event::MigrationStarted { allocation, to } => {
                write!(f, "{allocation}: migration to {to:?} memory, preempting its process's queues")
            }
            Event::VictimUnbound { queue } => write!(f, "{queue}: physical doorbell unbound by the KMD (victim)"),
            Event::DeviceError { device } => write!(f, "{device}: marked in error"),
            Event::TerminationWait { queue, value, completed } => {
                write!(f, "{queue}: termination waits for progress {value} (completed {completed})")
            }
            Event::FenceLogOverrun { queue, lost } => write!(f, "{queue}: fence log overrun, {lost} events lost"),
            Event::FenceLogRecreated { queue, kind, entries } => {
                write!(f, "{queue}: {kind:?} fence log recreated ({entries} entries)")
            }
            Event::FenceLogTracing { on } => write!(f, "fence-log tracing {}", if *on { "on" } else { "off" }),
            Event::DisconnectedRing { queue } => {
                write!(f, "{queue}: rung from the GPU while disconnected, reconnecting")
            }
            Event::TerminationWaitDone { queue, reached } => {
                write!(f, "{queue}: termination wait {}", if *reached { "satisfied" } else { "failed" })
            }
        }
    }
}

/// A timestamped event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceEntry {
    /// When.
    pub time: Time,
    /// What.
    pub event: Event,
}

/// The bounded log, shared by the OS and the DDI decorator ([`crate::ddi::Traced`]), which
/// both append to it in call order (the OS lock serializes them).
#[derive(Clone, Default)]
pub struct SharedTrace(Arc<Mutex<Trace>>);

impl SharedTrace {
    pub(crate) fn push(&self, time: Time, event: Event) {
        self.0.lock().push(time, event);
    }
    /// The entries so far and how many were dropped.
    pub fn snapshot(&self) -> (Vec<TraceEntry>, u64) {
        self.0.lock().snapshot()
    }
}

#[derive(Default)]
struct Trace {
    entries: VecDeque<TraceEntry>,
    dropped: u64,
}

impl Trace {
    fn push(&mut self, time: Time, event: Event) {
        if self.entries.len() == TRACE_CAPACITY {
            self.entries.pop_front();
            self.dropped += 1;
        }
        self.entries.push_back(TraceEntry { time, event });
    }

    fn snapshot(&self) -> (Vec<TraceEntry>, u64) {
        (self.entries.iter().cloned().collect(), self.dropped)
    }
}
