//! What `doorbell status` shows: the daemon's answer to [`crate::Request::Status`], the
//! `nvidia-smi` of doorbell. Plain data (serde), printed as a table or as JSON.

use serde::{Deserialize, Serialize};

/// The whole daemon.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DaemonStatus {
    /// The daemon's OS process id.
    pub daemon_pid: u32,
    /// The socket it listens on.
    pub socket: String,
    /// Seconds since it started.
    pub uptime_s: u64,
    /// The protocol version it speaks.
    pub protocol_version: u32,
    /// Its adapters (one today).
    pub adapters: Vec<AdapterStatus>,
    /// Its client processes.
    pub processes: Vec<ProcessStatus>,
}

/// One adapter.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdapterStatus {
    /// Its index.
    pub index: u32,
    /// Spec 000's doorbell model (`dedicated`, `global`).
    pub doorbell_model: String,
    /// Physical doorbells in a pool, when doorbells are virtualized.
    pub doorbell_pool: Option<u32>,
    /// Doorbell BAR pages handed to processes.
    pub doorbell_pages_used: u64,
    /// BAR pages shown to client processes through memfds of their own (withdrawn when
    /// their processes end).
    pub exported_doorbell_pages: u64,
    /// Doorbell objects (connected or not).
    pub doorbells: u64,
    /// Doorbell connects so far.
    pub connects: u64,
    /// Doorbells victimized so far.
    pub victimizations: u64,
    /// Queue faults so far.
    pub faults: u64,
    /// Interrupts serviced so far.
    pub interrupts: u64,
    /// Recoveries (engine or adapter resets after a timeout) in the kernel's trace window.
    pub recoveries: u64,
    /// Preemption requests that timed out (TDR) in the kernel's trace window.
    pub tdr_timeouts: u64,
    /// Queues the per-queue hang timer reset (they ran their limit without progress) in the
    /// kernel's trace window.
    pub hang_timeouts: u64,
    /// Trace entries dropped so far (the window's start).
    pub trace_dropped: u64,
    /// Engines.
    pub engines: Vec<EngineStatus>,
    /// The system calls the firmware thread made on purpose so far: a yield now and then
    /// while idle, a park while every engine is in F1 (the data path makes none).
    pub firmware_thread_calls: u64,
    /// Device time when the status was taken (ns): with [`EngineStatus::busy_ns`] from two
    /// readings, an engine's busy share in between.
    pub device_now_ns: u64,
    /// The latest faults, timeouts, recoveries, victimizations and losses in the kernel's
    /// trace window, oldest first (at most [`RECENT_EVENTS`]).
    pub events: Vec<EventLine>,
}

/// How many recent events [`AdapterStatus::events`] carries.
pub const RECENT_EVENTS: usize = 16;

/// One notable event from the kernel's trace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventLine {
    /// Device time (ns).
    pub time_ns: u64,
    /// What happened: `kernel::trace::Notable::name` of a fault, TDR timeout, hang timeout, reset,
    /// victimization, device error or loss, or adapter loss.
    pub kind: String,
    /// The event, as the kernel's trace prints it.
    pub text: String,
}

/// One engine.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineStatus {
    /// Its id.
    pub id: u32,
    /// `compute` or `copy`.
    pub kind: String,
    /// Power state (`F0`, `F1`).
    pub power: String,
    /// Hardware queue slots.
    pub slots: u32,
    /// Slots holding a queue now.
    pub slots_used: u32,
    /// Device time it has spent executing so far (ns; see [`AdapterStatus::device_now_ns`]).
    pub busy_ns: u64,
}

/// One client process.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessStatus {
    /// The kernel's process id.
    pub pid: u32,
    /// The OS process id (from the socket's peer credentials).
    pub os_pid: u32,
    /// The name the client gave.
    pub name: String,
    /// Live allocations.
    pub allocations: u32,
    /// Bytes of live allocations.
    pub bytes: u64,
    /// Its queues.
    pub queues: Vec<QueueLine>,
}

/// One queue.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueLine {
    /// Its handle, as text.
    pub handle: String,
    /// Its engine.
    pub engine: u32,
    /// `user` or `kernel`.
    pub mode: String,
    /// Its state (`Mapped`, `Unmapped`, `Hung`, ...).
    pub state: String,
    /// Its priority.
    pub priority: String,
    /// Its doorbell index in the process's page, for a user-mode queue.
    pub doorbell: Option<u32>,
    /// Progress values completed.
    pub completed: u64,
    /// Progress values submitted (its last-queued value): with two readings, submissions
    /// per second.
    pub submitted: u64,
    /// The fault that hung it, if any.
    pub fault: Option<String>,
}
