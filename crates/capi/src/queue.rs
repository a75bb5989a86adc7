//! Hardware queues: user-mode (a ring and a doorbell in this process; a submission is memory
//! writes, spec 000's submission loop) or kernel-mode (each submission a kernel call); their
//! progress values, doorbell status, reconnects and status queries.

use std::ffi::c_char;
use std::sync::{Arc, Mutex};

use abi::{DoorbellStatus, Priority, QueueState};
use umd::{QueueOptions, SubmissionKind};

use crate::cmdbuf::db_cmdbuf;
use crate::device::db_context;
use crate::error::{Error, guard};
use crate::fence::db_fence;
use crate::ptr::{Out, arg, destroy, new_handle, opt_arg};
use crate::{lock, timeout};

/// A hardware queue.
pub struct db_queue {
    pub(crate) queue: Mutex<umd::Queue>,
    /// The context it was created on: kept alive while the queue is (the kernel destroys a
    /// context only once its queues are gone).
    _context: Arc<umd::Context>,
}

/// A queue's submission model (`db_queue_options::mode`, `db_queue_submission_mode`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum db_queue_mode {
    /// User-mode submission: a ring and a doorbell; a submission is memory writes, no kernel
    /// call while the doorbell is connected.
    DB_QUEUE_USER_MODE = 0,
    /// Kernel-mode submission: every submission is a kernel call.
    DB_QUEUE_KERNEL_MODE = 1,
    /// User-mode where the engine supports it, kernel-mode otherwise (creation only;
    /// `db_queue_submission_mode` says which the queue got).
    DB_QUEUE_PREFERRED = 2,
}

/// Firmware priority levels (`db_queue_options::priority`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum db_priority {
    /// Low.
    DB_PRIORITY_LOW = 0,
    /// Normal (the default).
    DB_PRIORITY_NORMAL = 1,
    /// Medium.
    DB_PRIORITY_MEDIUM = 2,
    /// High.
    DB_PRIORITY_HIGH = 3,
    /// Realtime.
    DB_PRIORITY_REALTIME = 4,
}

/// A user-mode queue's doorbell status (`db_queue_doorbell_status`), as the kernel writes it
/// in the queue's kernel page (`D3DDDI_DOORBELL_STATUS`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum db_doorbell_status {
    /// Connected: a ring reaches the firmware.
    DB_DOORBELL_CONNECTED = 0,
    /// Connected, and the kernel wants to be told of each submission (`db_queue_submit`
    /// does it).
    DB_DOORBELL_CONNECTED_NOTIFY = 1,
    /// Disconnected (the engine went idle, the doorbell was victimized, the device powered
    /// down): reconnect (`db_queue_reconnect`) and ring again. `db_queue_submit` does both by
    /// itself.
    DB_DOORBELL_DISCONNECTED_RETRY = 2,
    /// Disconnected for good (the queue faulted or was reset, the device was lost): the
    /// queue is lost; destroy it.
    DB_DOORBELL_DISCONNECTED_ABORT = 3,
}

/// A queue's state (`db_queue_status::state`, amdgpu's `AMDGPU_USERQ_STATE_*`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum db_queue_state {
    /// Not on the firmware's run list.
    DB_QUEUE_UNMAPPED = 0,
    /// On the run list.
    DB_QUEUE_MAPPED = 1,
    /// Taken off a hardware slot with its state saved.
    DB_QUEUE_PREEMPTED = 2,
    /// Faulted or hung: it runs no more work.
    DB_QUEUE_HUNG = 3,
    /// Its memory is no longer valid.
    DB_QUEUE_INVALID_VA = 4,
}

/// `db_queue_status::flags`: the queue is hung (reset or faulted).
pub const DB_QUEUE_STATUS_HUNG: u32 = 1 << 0;
/// `db_queue_status::flags`: the adapter was reset since the queue was created and device
/// memory did not survive.
pub const DB_QUEUE_STATUS_VRAM_LOST: u32 = 1 << 1;
// Written as literals for cbindgen (which cannot evaluate another crate's constant, and would
// leave them out of the header); the kernel's flags, passed through as they are.
const _: () = assert!(
    DB_QUEUE_STATUS_HUNG == abi::port::QUEUE_STATUS_HUNG
        && DB_QUEUE_STATUS_VRAM_LOST == abi::port::QUEUE_STATUS_VRAM_LOST
);
/// The size of `db_queue_status::fault`, its terminating NUL included.
pub const DB_FAULT_TEXT_BYTES: usize = 256;

/// How to create a queue. Start from `db_queue_options_default`: an all-zero struct asks for
/// a low-priority queue.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct db_queue_options {
    /// The submission model, a `db_queue_mode`.
    pub mode: u32,
    /// The priority, a `db_priority`.
    pub priority: u32,
    /// A user-mode queue's ring size in bytes: a power of two, 4 KiB to 16 MiB; 0 for the
    /// default (64 KiB).
    pub ring_bytes: u64,
    /// 1: a user-mode queue whose doorbell reads `DB_DOORBELL_DISCONNECTED_ABORT` falls back
    /// to a kernel-mode queue on the same context instead of failing the submission (spec
    /// 000); work the lost queue had not completed is lost with it. 0: it does not.
    pub fallback_to_kernel_mode: u32,
}

/// The status of a queue (`db_queue_query_status`, amdgpu's `USERQ QUERY_STATUS`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct db_queue_status {
    /// A `db_queue_state`.
    pub state: u32,
    /// `DB_QUEUE_STATUS_HUNG`, `DB_QUEUE_STATUS_VRAM_LOST`.
    pub flags: u32,
    /// The highest completed progress value.
    pub completed: u64,
    /// The last progress value queued.
    pub last_queued: u64,
    /// Whether the firmware recorded a fault (described in `fault`).
    pub faulted: bool,
    /// Whether the queue caused its own hang (a fault, or it would not yield and was reset),
    /// rather than being lost with its device.
    pub guilty: bool,
    /// The fault, as text (what, where in the ring, which packet); empty without one.
    /// NUL-terminated, cut to fit.
    pub fault: [c_char; DB_FAULT_TEXT_BYTES],
}

/// What another queue writes from the GPU to submit work `db_queue_prepare`d on this one
/// (`db_cmdbuf_kick`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct db_gpu_kick {
    /// GPU VA of the target queue's wptr word.
    pub wptr_va: u64,
    /// GPU VA of the target queue's doorbell.
    pub doorbell_va: u64,
    /// GPU VA of its engine's aggregated doorbell word; meaningful when `has_aggregated` is 1.
    pub aggregated_va: u64,
    /// The wptr that covers the prepared work.
    pub wptr: u64,
    /// The prepared work's progress value (wait for it like any other).
    pub value: u64,
    /// 1 when the device needs the aggregated doorbell rung too, else 0.
    pub has_aggregated: u32,
}

impl db_gpu_kick {
    /// The Rust kick, its flag checked.
    pub(crate) fn to_rust(self) -> Result<umd::GpuKick, Error> {
        let aggregated_va = match self.has_aggregated {
            0 => None,
            1 => Some(self.aggregated_va),
            v => return Err(Error::invalid("kick->has_aggregated", v, "0 or 1")),
        };
        Ok(umd::GpuKick {
            wptr_va: self.wptr_va,
            doorbell_va: self.doorbell_va,
            aggregated_va,
            wptr: self.wptr,
            value: self.value,
        })
    }
}

/// Fills `*out_options` with the defaults: a user-mode queue of normal priority with a
/// 64 KiB ring, no fallback.
///
/// # Safety
///
/// `out_options` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_queue_options_default(out_options: *mut db_queue_options) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let out = unsafe { Out::new(out_options, "out_options")? };
        let d = QueueOptions::default();
        out.set(db_queue_options {
            mode: db_queue_mode::DB_QUEUE_USER_MODE as u32,
            priority: d.priority as u32,
            ring_bytes: d.ring_bytes,
            fallback_to_kernel_mode: 0,
        });
        Ok(())
    })
}

/// The Rust options, every field checked.
fn queue_options(o: &db_queue_options) -> Result<QueueOptions, Error> {
    let kind = match o.mode {
        0 => SubmissionKind::UserMode,
        1 => SubmissionKind::KernelMode,
        2 => SubmissionKind::Preferred,
        v => {
            return Err(Error::invalid(
                "options->mode",
                v,
                "a db_queue_mode: DB_QUEUE_USER_MODE (0), DB_QUEUE_KERNEL_MODE (1) or DB_QUEUE_PREFERRED (2)",
            ));
        }
    };
    let priority = Priority::from_u32(o.priority).ok_or_else(|| {
        Error::invalid(
            "options->priority",
            o.priority,
            "a db_priority: DB_PRIORITY_LOW (0) to DB_PRIORITY_REALTIME (4)",
        )
    })?;
    let fallback_to_kernel_mode = match o.fallback_to_kernel_mode {
        0 => false,
        1 => true,
        v => return Err(Error::invalid("options->fallback_to_kernel_mode", v, "0 or 1")),
    };
    let default = QueueOptions::default();
    let ring_bytes = if o.ring_bytes == 0 { default.ring_bytes } else { o.ring_bytes };
    Ok(QueueOptions { kind, ring_bytes, priority, fallback_to_kernel_mode, doorbell: None })
}

/// Creates a queue on `context`. `options`: NULL for `db_queue_options_default`'s. A
/// user-mode queue is created with its doorbell connected. On success `*out_queue` is a new
/// handle, to be destroyed with `db_queue_destroy`.
///
/// # Safety
///
/// `context` is NULL or a live context handle; `options` is NULL or readable; `out_queue` is
/// NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_queue_create(
    context: *const db_context,
    options: *const db_queue_options,
    out_queue: *mut *mut db_queue,
) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let (c, options, out) =
            unsafe { (arg(context, "context")?, opt_arg(options), Out::new(out_queue, "out_queue")?) };
        let opts = match options {
            Some(o) => queue_options(o)?,
            None => QueueOptions::default(),
        };
        let queue = c.context.create_queue(opts)?;
        out.set(new_handle(db_queue { queue: Mutex::new(queue), _context: c.context.clone() }));
        Ok(())
    })
}

/// Destroys a queue (its doorbell first); NULL is a no-op. Work it has not completed is
/// abandoned: wait for its last progress value first to keep it.
///
/// # Safety
///
/// `queue` is NULL or a live queue handle that no other thread is using; it must not be used
/// again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_queue_destroy(queue: *mut db_queue) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        unsafe { destroy(queue) };
        Ok(())
    })
}

/// Runs `f` on the queue behind `queue`, holding its lock.
///
/// # Safety
///
/// `queue` is NULL or a live queue handle.
unsafe fn with_queue(queue: *const db_queue, f: impl FnOnce(&mut umd::Queue) -> Result<(), Error>) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let q = unsafe { arg(queue, "queue")? };
        f(&mut *lock(&q.queue, "queue")?)
    })
}

/// Submits a command buffer: on a user-mode queue, spec 000's loop — the next progress
/// value, the last-queued value, the packets and the progress fence into the ring, wptr, the
/// doorbell rung, its status read and acted on (a `DISCONNECTED_RETRY` doorbell is
/// reconnected and rung again; `CONNECTED_NOTIFY` notifies the kernel). `*out_value` receives
/// the submission's progress value: wait for it with `db_queue_wait`. A full ring waits for
/// the engine. `DB_QUEUE_LOST` when the doorbell reads `DISCONNECTED_ABORT`.
///
/// # Safety
///
/// `queue` is NULL or a live queue handle; `cmdbuf` is NULL or a live command buffer handle;
/// `out_value` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_queue_submit(queue: *const db_queue, cmdbuf: *const db_cmdbuf, out_value: *mut u64) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let (q, c, out) = unsafe { (arg(queue, "queue")?, arg(cmdbuf, "cmdbuf")?, Out::new(out_value, "out_value")?) };
        let mut q = lock(&q.queue, "queue")?;
        let cb = lock(&c.cb, "cmdbuf")?;
        out.set(q.submit(&cb)?);
        Ok(())
    })
}

/// Prepares a command buffer for the GPU to submit (spec 001): the packets go in this
/// user-mode queue's ring, but wptr is not published and the doorbell not rung. Another
/// queue's `db_cmdbuf_kick` with `*out_kick` submits it. `DB_WRONG_QUEUE_MODE` for a
/// kernel-mode queue.
///
/// # Safety
///
/// `queue` is NULL or a live queue handle; `cmdbuf` is NULL or a live command buffer handle;
/// `out_kick` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_queue_prepare(
    queue: *const db_queue,
    cmdbuf: *const db_cmdbuf,
    out_kick: *mut db_gpu_kick,
) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let (q, c, out) = unsafe { (arg(queue, "queue")?, arg(cmdbuf, "cmdbuf")?, Out::new(out_kick, "out_kick")?) };
        let mut q = lock(&q.queue, "queue")?;
        let cb = lock(&c.cb, "cmdbuf")?;
        let k = q.prepare(&cb)?;
        out.set(db_gpu_kick {
            wptr_va: k.wptr_va,
            doorbell_va: k.doorbell_va,
            aggregated_va: k.aggregated_va.unwrap_or(0),
            wptr: k.wptr,
            value: k.value,
            has_aggregated: k.aggregated_va.is_some().into(),
        });
        Ok(())
    })
}

/// Waits until the queue's progress value reaches `value`: memory first, a short spin, then a
/// blocking kernel wait. `timeout_ns`: `DB_TIMEOUT_INFINITE` to wait for ever; `DB_TIMEOUT`
/// when it passes first. `DB_QUEUE_LOST` if the queue can no longer reach it.
///
/// The queue's lock is held meanwhile: other calls on this queue wait for this one. To wait
/// on a queue from one thread while another submits to it, wait on its progress fence
/// (`db_queue_progress_fence`) instead.
///
/// # Safety
///
/// `queue` is NULL or a live queue handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_queue_wait(queue: *const db_queue, value: u64, timeout_ns: u64) -> i32 {
    // SAFETY: the function's contract (above).
    unsafe { with_queue(queue, |q| Ok(q.wait(value, timeout(timeout_ns))?)) }
}

/// Waits for everything submitted so far (`db_queue_wait` on the last progress value).
///
/// # Safety
///
/// `queue` is NULL or a live queue handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_queue_finish(queue: *const db_queue, timeout_ns: u64) -> i32 {
    // SAFETY: the function's contract (above).
    unsafe { with_queue(queue, |q| Ok(q.finish(timeout(timeout_ns))?)) }
}

/// The completed progress value, read from memory (no kernel call).
///
/// # Safety
///
/// `queue` is NULL or a live queue handle; `out_value` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_queue_completed(queue: *const db_queue, out_value: *mut u64) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let (q, out) = unsafe { (arg(queue, "queue")?, Out::new(out_value, "out_value")?) };
        out.set(lock(&q.queue, "queue")?.completed());
        Ok(())
    })
}

/// The last progress value `db_queue_submit` handed out (0 before the first).
///
/// # Safety
///
/// `queue` is NULL or a live queue handle; `out_value` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_queue_last_submitted(queue: *const db_queue, out_value: *mut u64) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let (q, out) = unsafe { (arg(queue, "queue")?, Out::new(out_value, "out_value")?) };
        out.set(lock(&q.queue, "queue")?.last_submitted());
        Ok(())
    })
}

/// GPU VA of the queue's completed progress value (read-only for the GPU): for a `WAIT` on
/// another queue (`db_cmdbuf_wait`), so it runs after this one's work.
///
/// # Safety
///
/// `queue` is NULL or a live queue handle; `out_va` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_queue_progress_va(queue: *const db_queue, out_va: *mut u64) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let (q, out) = unsafe { (arg(queue, "queue")?, Out::new(out_va, "out_va")?) };
        out.set(lock(&q.queue, "queue")?.progress_va());
        Ok(())
    })
}

/// The queue's submission model now, a `db_queue_mode` (user- or kernel-mode; a user-mode
/// queue created with `fallback_to_kernel_mode` becomes kernel-mode when it falls back).
///
/// # Safety
///
/// `queue` is NULL or a live queue handle; `out_mode` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_queue_submission_mode(queue: *const db_queue, out_mode: *mut u32) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let (q, out) = unsafe { (arg(queue, "queue")?, Out::new(out_mode, "out_mode")?) };
        let mode = match lock(&q.queue, "queue")?.kind() {
            SubmissionKind::KernelMode => db_queue_mode::DB_QUEUE_KERNEL_MODE,
            SubmissionKind::UserMode | SubmissionKind::Preferred => db_queue_mode::DB_QUEUE_USER_MODE,
        };
        out.set(mode as u32);
        Ok(())
    })
}

/// The doorbell status, a `db_doorbell_status`, read from the queue's kernel page (no kernel
/// call). On a user-mode queue, `DB_DOORBELL_DISCONNECTED_RETRY` means the next ring would
/// not reach the firmware: `db_queue_reconnect` (or `db_queue_submit`, which reconnects by
/// itself).
///
/// # Safety
///
/// `queue` is NULL or a live queue handle; `out_status` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_queue_doorbell_status(queue: *const db_queue, out_status: *mut u32) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let (q, out) = unsafe { (arg(queue, "queue")?, Out::new(out_status, "out_status")?) };
        let status = match lock(&q.queue, "queue")?.doorbell_status()? {
            DoorbellStatus::Connected => db_doorbell_status::DB_DOORBELL_CONNECTED,
            DoorbellStatus::ConnectedNotify => db_doorbell_status::DB_DOORBELL_CONNECTED_NOTIFY,
            DoorbellStatus::DisconnectedRetry => db_doorbell_status::DB_DOORBELL_DISCONNECTED_RETRY,
            DoorbellStatus::DisconnectedAbort => db_doorbell_status::DB_DOORBELL_DISCONNECTED_ABORT,
        };
        out.set(status as u32);
        Ok(())
    })
}

/// Connects a user-mode queue's doorbell again (`D3DKMTConnectDoorbell`), after
/// `DB_DOORBELL_DISCONNECTED_RETRY`: the engine wakes, and the kernel re-reads wptr. A
/// connected doorbell stays as it is. `DB_WRONG_QUEUE_MODE` for a kernel-mode queue.
///
/// # Safety
///
/// `queue` is NULL or a live queue handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_queue_reconnect(queue: *const db_queue) -> i32 {
    // SAFETY: the function's contract (above).
    unsafe { with_queue(queue, |q| Ok(q.reconnect()?)) }
}

/// How many times the queue's doorbell was reconnected (by `db_queue_submit` or
/// `db_queue_reconnect`).
///
/// # Safety
///
/// `queue` is NULL or a live queue handle; `out_count` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_queue_reconnects(queue: *const db_queue, out_count: *mut u64) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let (q, out) = unsafe { (arg(queue, "queue")?, Out::new(out_count, "out_count")?) };
        out.set(lock(&q.queue, "queue")?.reconnects());
        Ok(())
    })
}

/// `USERQ QUERY_STATUS` (a kernel call): state, flags, completed and last-queued values, and
/// the fault that hung the queue, if any.
///
/// # Safety
///
/// `queue` is NULL or a live queue handle; `out_status` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_queue_query_status(queue: *const db_queue, out_status: *mut db_queue_status) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let (q, out) = unsafe { (arg(queue, "queue")?, Out::new(out_status, "out_status")?) };
        let s = lock(&q.queue, "queue")?.status()?;
        let state = match s.state {
            QueueState::Unmapped => db_queue_state::DB_QUEUE_UNMAPPED,
            QueueState::Mapped => db_queue_state::DB_QUEUE_MAPPED,
            QueueState::Preempted => db_queue_state::DB_QUEUE_PREEMPTED,
            QueueState::Hung => db_queue_state::DB_QUEUE_HUNG,
            QueueState::InvalidVa => db_queue_state::DB_QUEUE_INVALID_VA,
        };
        let mut fault = [0 as c_char; DB_FAULT_TEXT_BYTES];
        if let Some(f) = &s.fault {
            let text = f.to_string();
            let mut end = text.len().min(DB_FAULT_TEXT_BYTES - 1);
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            for (d, b) in fault.iter_mut().zip(text[..end].bytes()) {
                *d = b as c_char;
            }
        }
        out.set(db_queue_status {
            state: state as u32,
            flags: s.flags,
            completed: s.completed,
            last_queued: s.last_queued,
            faulted: s.fault.is_some(),
            guilty: s.guilty,
            fault,
        });
        Ok(())
    })
}

/// The queue's progress fence as a native fence (spec 002): its value is the queue's
/// completed progress value, the engine alone signals it. Wait on it (`db_fence_wait`,
/// `db_device_wait_fences`) from any thread without taking the queue's lock, or from another
/// queue's `db_cmdbuf_wait_fence`. On success `*out_fence` is a new handle, to be destroyed
/// with `db_fence_destroy`; it stops advancing once the queue is destroyed.
///
/// # Safety
///
/// `queue` is NULL or a live queue handle; `out_fence` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_queue_progress_fence(queue: *const db_queue, out_fence: *mut *mut db_fence) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let (q, out) = unsafe { (arg(queue, "queue")?, Out::new(out_fence, "out_fence")?) };
        let fence = lock(&q.queue, "queue")?.progress_fence()?;
        out.set(new_handle(db_fence { fence }));
        Ok(())
    })
}
