//! Command buffers: a packet stream built with one function per packet, each the C face of
//! one method of [`umd::CommandBuffer`] (and encoding through it, so the bytes are the Rust
//! driver's own). The progress fence is not part of a command buffer: `db_queue_submit`
//! appends it.
//!
//! | C function | [`umd::CommandBuffer`] |
//! |---|---|
//! | `db_cmdbuf_nop` | `nop` |
//! | `db_cmdbuf_write_u32`, `db_cmdbuf_write_u64` | `write_u32`, `write_u64` (`WRITE_DATA`) |
//! | `db_cmdbuf_copy`, `db_cmdbuf_fill` | `copy`, `fill` |
//! | `db_cmdbuf_timestamp` | `timestamp` |
//! | `db_cmdbuf_indirect` | `indirect` (`INDIRECT_BUFFER`) |
//! | `db_cmdbuf_signal`, `db_cmdbuf_wait` | `signal`, `wait` |
//! | `db_cmdbuf_signal_fence`, `db_cmdbuf_wait_fence` | `signal_fence`, `wait_fence` |
//! | `db_cmdbuf_signal_fence_logged`, `db_cmdbuf_wait_fence_logged` | `signal_fence_logged`, `wait_fence_logged` |
//! | `db_cmdbuf_dispatch` | `dispatch` |
//! | `db_cmdbuf_interrupt`, `db_cmdbuf_synthetic` | `interrupt`, `synthetic` |
//! | `db_cmdbuf_kick` | `kick` (with `db_queue_prepare`) |
//! | `db_cmdbuf_wait_points` | `wait_points` |
//! | `db_cmdbuf_raw` | `raw` |
//! | `db_cmdbuf_words`, `db_cmdbuf_reset` | `words`/`len`, `clear` |
//!
//! `CommandBuffer::packet` (any [`abi::packet::Packet`]) has no function of its own: the
//! typed functions above cover every packet a command buffer carries, and `db_cmdbuf_raw`
//! any other dwords.

use std::sync::Mutex;

use crate::error::{Error, guard};
use crate::fence::db_fence;
use crate::lock;
use crate::ptr::{Out, arg, destroy, new_handle, slice, words_out};
use crate::queue::db_gpu_kick;

/// A command buffer under construction. Not tied to a device: it can be submitted to any
/// queue, as often as wanted.
pub struct db_cmdbuf {
    pub(crate) cb: Mutex<umd::CommandBuffer>,
}

/// A point a `WAIT` packet waits for: until the 64-bit word at `va` is at least `value`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct db_wait_point {
    /// GPU VA of the 64-bit word.
    pub va: u64,
    /// The value to wait for.
    pub value: u64,
}

/// Runs `f` on the command buffer behind `cb`.
///
/// # Safety
///
/// `cb` is NULL or a live command buffer handle.
unsafe fn with_cb(cb: *mut db_cmdbuf, f: impl FnOnce(&mut umd::CommandBuffer)) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let c = unsafe { arg(cb.cast_const(), "cmdbuf")? };
        f(&mut *lock(&c.cb, "cmdbuf")?);
        Ok(())
    })
}

/// Runs `f` on the command buffer behind `cb` and the native fence behind `fence`.
///
/// # Safety
///
/// `cb` is NULL or a live command buffer handle; `fence` is NULL or a live fence handle.
unsafe fn with_cb_fence(
    cb: *mut db_cmdbuf,
    fence: *const db_fence,
    f: impl FnOnce(&mut umd::CommandBuffer, &umd::NativeFence),
) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let (c, fence) = unsafe { (arg(cb.cast_const(), "cmdbuf")?, arg(fence, "fence")?) };
        f(&mut *lock(&c.cb, "cmdbuf")?, &fence.fence);
        Ok(())
    })
}

/// Creates an empty command buffer. On success `*out_cmdbuf` is a new handle, to be
/// destroyed with `db_cmdbuf_destroy`.
///
/// # Safety
///
/// `out_cmdbuf` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_cmdbuf_create(out_cmdbuf: *mut *mut db_cmdbuf) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let out = unsafe { Out::new(out_cmdbuf, "out_cmdbuf")? };
        out.set(new_handle(db_cmdbuf { cb: Mutex::new(umd::CommandBuffer::new()) }));
        Ok(())
    })
}

/// Destroys a command buffer; NULL is a no-op. Submissions made from it are unaffected (the
/// queue copied its packets into the ring, or the kernel into its own).
///
/// # Safety
///
/// `cmdbuf` is NULL or a live command buffer handle that no other thread is using; it must
/// not be used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_cmdbuf_destroy(cmdbuf: *mut db_cmdbuf) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        unsafe { destroy(cmdbuf) };
        Ok(())
    })
}

/// Empties the command buffer, keeping its memory, to build the next one.
///
/// # Safety
///
/// `cmdbuf` is NULL or a live command buffer handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_cmdbuf_reset(cmdbuf: *mut db_cmdbuf) -> i32 {
    // SAFETY: the function's contract (above).
    unsafe { with_cb(cmdbuf, |cb| cb.clear()) }
}

/// The encoded stream: `*out_count` receives its length in dwords; if `out_words` is not
/// NULL, the dwords are copied there (`capacity` dwords available; `DB_INVALID_ARGUMENT` if
/// too few). With `out_words` NULL it only counts.
///
/// # Safety
///
/// `cmdbuf` is NULL or a live command buffer handle; `out_words` is NULL or points to
/// `capacity` writable dwords; `out_count` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_cmdbuf_words(
    cmdbuf: *const db_cmdbuf,
    out_words: *mut u32,
    capacity: usize,
    out_count: *mut usize,
) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let (c, count) = unsafe { (arg(cmdbuf, "cmdbuf")?, Out::new(out_count, "out_count")?) };
        let cb = lock(&c.cb, "cmdbuf")?;
        let words = cb.words();
        if !out_words.is_null() {
            if capacity < words.len() {
                return Err(Error::invalid(
                    "capacity",
                    capacity,
                    format!("at least the command buffer's length, {} dwords", words.len()),
                ));
            }
            // SAFETY: the function's contract: `out_words` holds `capacity` writable dwords.
            let out = unsafe { words_out(out_words, words.len(), "out_words")? };
            out.copy_from_slice(words);
        }
        count.set(words.len());
        Ok(())
    })
}

/// `NOP` of `dwords` dwords, header included (0 is taken as 1). At most 65535:
/// `DB_INVALID_ARGUMENT` above.
///
/// # Safety
///
/// `cmdbuf` is NULL or a live command buffer handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_cmdbuf_nop(cmdbuf: *mut db_cmdbuf, dwords: u32) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let c = unsafe { arg(cmdbuf.cast_const(), "cmdbuf")? };
        let dwords = u16::try_from(dwords)
            .map_err(|_| Error::invalid("dwords", dwords, "at most 65535 (a NOP's length field is 16 bits)"))?;
        lock(&c.cb, "cmdbuf")?.nop(dwords);
        Ok(())
    })
}

/// `WRITE_DATA`, 32-bit: the engine stores `value` at `va`.
///
/// # Safety
///
/// `cmdbuf` is NULL or a live command buffer handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_cmdbuf_write_u32(cmdbuf: *mut db_cmdbuf, va: u64, value: u32) -> i32 {
    // SAFETY: the function's contract (above).
    unsafe {
        with_cb(cmdbuf, |cb| {
            cb.write_u32(va, value);
        })
    }
}

/// `WRITE_DATA`, 64-bit: the engine stores `value` at `va`.
///
/// # Safety
///
/// `cmdbuf` is NULL or a live command buffer handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_cmdbuf_write_u64(cmdbuf: *mut db_cmdbuf, va: u64, value: u64) -> i32 {
    // SAFETY: the function's contract (above).
    unsafe {
        with_cb(cmdbuf, |cb| {
            cb.write_u64(va, value);
        })
    }
}

/// `COPY`: `bytes` bytes from `src` to `dst`.
///
/// # Safety
///
/// `cmdbuf` is NULL or a live command buffer handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_cmdbuf_copy(cmdbuf: *mut db_cmdbuf, src: u64, dst: u64, bytes: u64) -> i32 {
    // SAFETY: the function's contract (above).
    unsafe {
        with_cb(cmdbuf, |cb| {
            cb.copy(src, dst, bytes);
        })
    }
}

/// `FILL`: `bytes` bytes at `dst` with the little-endian 32-bit `pattern`, repeated.
///
/// # Safety
///
/// `cmdbuf` is NULL or a live command buffer handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_cmdbuf_fill(cmdbuf: *mut db_cmdbuf, dst: u64, bytes: u64, pattern: u32) -> i32 {
    // SAFETY: the function's contract (above).
    unsafe {
        with_cb(cmdbuf, |cb| {
            cb.fill(dst, bytes, pattern);
        })
    }
}

/// `TIMESTAMP`: the engine stores the device clock (64-bit, ns) at `va`.
///
/// # Safety
///
/// `cmdbuf` is NULL or a live command buffer handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_cmdbuf_timestamp(cmdbuf: *mut db_cmdbuf, va: u64) -> i32 {
    // SAFETY: the function's contract (above).
    unsafe {
        with_cb(cmdbuf, |cb| {
            cb.timestamp(va);
        })
    }
}

/// `INDIRECT_BUFFER`: the engine runs `dwords` dwords of packets at `va`, then goes on here.
///
/// # Safety
///
/// `cmdbuf` is NULL or a live command buffer handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_cmdbuf_indirect(cmdbuf: *mut db_cmdbuf, va: u64, dwords: u32) -> i32 {
    // SAFETY: the function's contract (above).
    unsafe {
        with_cb(cmdbuf, |cb| {
            cb.indirect(va, dwords);
        })
    }
}

/// `SIGNAL`: the engine stores the 64-bit `value` at `va` once the packets before it are done.
///
/// # Safety
///
/// `cmdbuf` is NULL or a live command buffer handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_cmdbuf_signal(cmdbuf: *mut db_cmdbuf, va: u64, value: u64) -> i32 {
    // SAFETY: the function's contract (above).
    unsafe {
        with_cb(cmdbuf, |cb| {
            cb.signal(va, value);
        })
    }
}

/// `WAIT`: the queue stops here until the 64-bit word at `va` is at least `value` (other
/// queues run meanwhile).
///
/// # Safety
///
/// `cmdbuf` is NULL or a live command buffer handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_cmdbuf_wait(cmdbuf: *mut db_cmdbuf, va: u64, value: u64) -> i32 {
    // SAFETY: the function's contract (above).
    unsafe {
        with_cb(cmdbuf, |cb| {
            cb.wait(va, value);
        })
    }
}

/// `SIGNAL` a native fence to `value`: interrupts the CPU only if a CPU waits for it.
///
/// # Safety
///
/// `cmdbuf` is NULL or a live command buffer handle; `fence` is NULL or a live fence handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_cmdbuf_signal_fence(cmdbuf: *mut db_cmdbuf, fence: *const db_fence, value: u64) -> i32 {
    // SAFETY: the function's contract (above).
    unsafe {
        with_cb_fence(cmdbuf, fence, |cb, f| {
            cb.signal_fence(f, value);
        })
    }
}

/// `WAIT` until a native fence reaches `value`: blocks only this queue, with no CPU involved
/// on a user-mode queue.
///
/// # Safety
///
/// `cmdbuf` is NULL or a live command buffer handle; `fence` is NULL or a live fence handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_cmdbuf_wait_fence(cmdbuf: *mut db_cmdbuf, fence: *const db_fence, value: u64) -> i32 {
    // SAFETY: the function's contract (above).
    unsafe {
        with_cb_fence(cmdbuf, fence, |cb, f| {
            cb.wait_fence(f, value);
        })
    }
}

/// `db_cmdbuf_signal_fence`, then an entry (with the GPU time) in the queue's signal fence
/// log. User-mode queues only: a kernel-mode queue refuses the submission.
///
/// # Safety
///
/// `cmdbuf` is NULL or a live command buffer handle; `fence` is NULL or a live fence handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_cmdbuf_signal_fence_logged(
    cmdbuf: *mut db_cmdbuf,
    fence: *const db_fence,
    value: u64,
) -> i32 {
    // SAFETY: the function's contract (above).
    unsafe {
        with_cb_fence(cmdbuf, fence, |cb, f| {
            cb.signal_fence_logged(f, value);
        })
    }
}

/// `db_cmdbuf_wait_fence`, then an entry (when the wait was seen and released) in the
/// queue's wait fence log. User-mode queues only.
///
/// # Safety
///
/// `cmdbuf` is NULL or a live command buffer handle; `fence` is NULL or a live fence handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_cmdbuf_wait_fence_logged(
    cmdbuf: *mut db_cmdbuf,
    fence: *const db_fence,
    value: u64,
) -> i32 {
    // SAFETY: the function's contract (above).
    unsafe {
        with_cb_fence(cmdbuf, fence, |cb, f| {
            cb.wait_fence_logged(f, value);
        })
    }
}

/// `DISPATCH` (compute engines): runs the kernel binary at `kernel` over `grid_x` ×
/// `grid_y` × `grid_z` workgroups of `group_x` × `group_y` × `group_z` threads, with its
/// argument buffer at `args`.
///
/// # Safety
///
/// `cmdbuf` is NULL or a live command buffer handle.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn db_cmdbuf_dispatch(
    cmdbuf: *mut db_cmdbuf,
    kernel: u64,
    grid_x: u32,
    grid_y: u32,
    grid_z: u32,
    group_x: u32,
    group_y: u32,
    group_z: u32,
    args: u64,
) -> i32 {
    // SAFETY: the function's contract (above).
    unsafe {
        with_cb(cmdbuf, |cb| {
            cb.dispatch(kernel, [grid_x, grid_y, grid_z], [group_x, group_y, group_z], args);
        })
    }
}

/// `INTERRUPT`: raises an interrupt carrying `id` to the kernel.
///
/// # Safety
///
/// `cmdbuf` is NULL or a live command buffer handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_cmdbuf_interrupt(cmdbuf: *mut db_cmdbuf, id: u32) -> i32 {
    // SAFETY: the function's contract (above).
    unsafe {
        with_cb(cmdbuf, |cb| {
            cb.interrupt(id);
        })
    }
}

/// `SYNTHETIC`: occupies the engine for `ns` nanoseconds of device time, writing nothing.
///
/// # Safety
///
/// `cmdbuf` is NULL or a live command buffer handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_cmdbuf_synthetic(cmdbuf: *mut db_cmdbuf, ns: u64) -> i32 {
    // SAFETY: the function's contract (above).
    unsafe {
        with_cb(cmdbuf, |cb| {
            cb.synthetic(ns);
        })
    }
}

/// Submits, from the GPU, the work `db_queue_prepare` put in another queue's ring: stores its
/// wptr, rings its doorbell (and the aggregated doorbell where the device has one). `kick` as
/// `db_queue_prepare` filled it in.
///
/// # Safety
///
/// `cmdbuf` is NULL or a live command buffer handle; `kick` is NULL or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_cmdbuf_kick(cmdbuf: *mut db_cmdbuf, kick: *const db_gpu_kick) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let (c, k) = unsafe { (arg(cmdbuf.cast_const(), "cmdbuf")?, arg(kick, "kick")?) };
        let kick = k.to_rust()?;
        lock(&c.cb, "cmdbuf")?.kick(&kick);
        Ok(())
    })
}

/// A `WAIT` for each of `count` points.
///
/// # Safety
///
/// `cmdbuf` is NULL or a live command buffer handle; `points` is NULL or points to `count`
/// readable points.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_cmdbuf_wait_points(
    cmdbuf: *mut db_cmdbuf,
    points: *const db_wait_point,
    count: usize,
) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let (c, points) = unsafe { (arg(cmdbuf.cast_const(), "cmdbuf")?, slice(points, count, "points")?) };
        let points: Vec<_> = points.iter().map(|p| abi::port::WaitPoint { va: p.va, value: p.value }).collect();
        lock(&c.cb, "cmdbuf")?.wait_points(&points);
        Ok(())
    })
}

/// Appends `count` raw dwords, unchecked (a malformed stream faults the queue that runs it,
/// or is refused by the kernel on a kernel-mode queue).
///
/// # Safety
///
/// `cmdbuf` is NULL or a live command buffer handle; `words` is NULL or points to `count`
/// readable dwords.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_cmdbuf_raw(cmdbuf: *mut db_cmdbuf, words: *const u32, count: usize) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let (c, words) = unsafe { (arg(cmdbuf.cast_const(), "cmdbuf")?, slice(words, count, "words")?) };
        lock(&c.cb, "cmdbuf")?.raw(words);
        Ok(())
    })
}
