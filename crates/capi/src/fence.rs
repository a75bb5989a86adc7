//! Native fences (spec 002): a 64-bit value the GPU and the CPU signal and wait on. The CPU
//! reads it from memory; signals and blocking waits go through the kernel, which interrupts
//! only when a CPU waits.

use abi::port::{NativeFenceDesc, NativeFenceType, WaitMode};

use crate::device::db_device;
use crate::error::{Error, guard};
use crate::ptr::{Out, arg, destroy, new_handle, opt_arg, slice};
use crate::timeout;

/// A native GPU fence.
pub struct db_fence {
    pub(crate) fence: umd::NativeFence,
}

impl db_fence {
    /// The Rust fence behind the handle (for Rust code given a handle by C, and the tests).
    pub fn native_fence(&self) -> &umd::NativeFence {
        &self.fence
    }
}

/// Where a fence's value lives (`db_fence_create`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum db_fence_type {
    /// System memory the CPU reads: the usual fence.
    DB_FENCE_DEFAULT = 0,
    /// Device memory without CPU access: only the GPU signals and waits on it (CPU reads and
    /// waits fail with `DB_NO_CPU_ACCESS`).
    DB_FENCE_INTRA_GPU = 1,
    /// A legacy monitored fence: every signal interrupts the CPU (for comparison).
    DB_FENCE_LEGACY_MONITORED = 2,
}

/// `db_fence_create` flag: the fence can be shared with another process
/// (`db_fence_global_handle`, `db_fence_open`).
pub const DB_FENCE_SHAREABLE: u32 = 1;

/// How a wait on several fences is satisfied (`db_device_wait_fences`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum db_wait_mode {
    /// Every fence reaches its value.
    DB_WAIT_ALL = 0,
    /// Any one does.
    DB_WAIT_ANY = 1,
}

/// Creates a native fence with value `initial`, of type `fence_type` (a `db_fence_type`), with
/// `flags` (0 or `DB_FENCE_SHAREABLE`). On success `*out_fence` is a new handle, to be
/// destroyed with `db_fence_destroy`.
///
/// # Safety
///
/// `device` is NULL or a live device handle; `out_fence` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_fence_create(
    device: *const db_device,
    initial: u64,
    fence_type: u32,
    flags: u32,
    out_fence: *mut *mut db_fence,
) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let (d, out) = unsafe { (arg(device, "device")?, Out::new(out_fence, "out_fence")?) };
        let kind = match fence_type {
            0 => NativeFenceType::Default,
            1 => NativeFenceType::IntraGpu,
            2 => NativeFenceType::LegacyMonitored,
            v => {
                return Err(Error::invalid(
                    "fence_type",
                    v,
                    "a db_fence_type: DB_FENCE_DEFAULT (0), DB_FENCE_INTRA_GPU (1) or DB_FENCE_LEGACY_MONITORED (2)",
                ));
            }
        };
        if flags & !DB_FENCE_SHAREABLE != 0 {
            return Err(Error::invalid("flags", format!("{flags:#x}"), "0 or DB_FENCE_SHAREABLE (0x1)"));
        }
        let desc =
            NativeFenceDesc { shareable: flags & DB_FENCE_SHAREABLE != 0, ..NativeFenceDesc::new(initial, kind) };
        out.set(new_handle(db_fence { fence: d.device.create_fence_with(&desc)? }));
        Ok(())
    })
}

/// Opens a fence another process created with `DB_FENCE_SHAREABLE`, by the handle its
/// `db_fence_global_handle` gave (both processes clients of the same daemon). On success
/// `*out_fence` is a new handle, to be destroyed with `db_fence_destroy`.
///
/// # Safety
///
/// `device` is NULL or a live device handle; `out_fence` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_fence_open(
    device: *const db_device,
    global_handle: u64,
    out_fence: *mut *mut db_fence,
) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let (d, out) = unsafe { (arg(device, "device")?, Out::new(out_fence, "out_fence")?) };
        out.set(new_handle(db_fence { fence: d.device.open_fence(global_handle)? }));
        Ok(())
    })
}

/// Destroys a fence handle; NULL is a no-op. Packets already encoded with it keep its GPU
/// address: do not submit them afterwards.
///
/// # Safety
///
/// `fence` is NULL or a live fence handle that no other thread is using; it must not be used
/// again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_fence_destroy(fence: *mut db_fence) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        unsafe { destroy(fence) };
        Ok(())
    })
}

/// The handle another process passes to `db_fence_open`. `DB_INVALID_ARGUMENT` for a fence
/// created without `DB_FENCE_SHAREABLE`.
///
/// # Safety
///
/// `fence` is NULL or a live fence handle; `out_handle` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_fence_global_handle(fence: *const db_fence, out_handle: *mut u64) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let (f, out) = unsafe { (arg(fence, "fence")?, Out::new(out_handle, "out_handle")?) };
        let global = f.fence.global().ok_or_else(|| {
            Error::invalid(
                "fence",
                f.fence.handle(),
                "a fence created with DB_FENCE_SHAREABLE (this one has no global handle)",
            )
        })?;
        out.set(global);
        Ok(())
    })
}

/// The fence value's GPU virtual address (what a `SIGNAL` or `WAIT` packet names; the
/// `db_cmdbuf_*_fence` functions take the fence itself).
///
/// # Safety
///
/// `fence` is NULL or a live fence handle; `out_va` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_fence_va(fence: *const db_fence, out_va: *mut u64) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let (f, out) = unsafe { (arg(fence, "fence")?, Out::new(out_va, "out_va")?) };
        out.set(f.fence.va());
        Ok(())
    })
}

/// The fence's current value, read from memory (no kernel call). `DB_NO_CPU_ACCESS` for a
/// `DB_FENCE_INTRA_GPU` fence.
///
/// # Safety
///
/// `fence` is NULL or a live fence handle; `out_value` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_fence_value(fence: *const db_fence, out_value: *mut u64) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let (f, out) = unsafe { (arg(fence, "fence")?, Out::new(out_value, "out_value")?) };
        out.set(f.fence.value()?);
        Ok(())
    })
}

/// Signals the fence from the CPU (through the kernel): its value becomes `value`, and CPU
/// and GPU waiters for it are released. A value below the current one is refused
/// (`DB_INVALID_ARGUMENT`).
///
/// # Safety
///
/// `fence` is NULL or a live fence handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_fence_signal(fence: *const db_fence, value: u64) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let f = unsafe { arg(fence, "fence")? };
        Ok(f.fence.signal(value)?)
    })
}

/// Waits until the fence reaches `value`: memory first, a short spin, then a blocking kernel
/// wait. `timeout_ns`: `DB_TIMEOUT_INFINITE` to wait for ever; `DB_TIMEOUT` when it passes
/// first.
///
/// # Safety
///
/// `fence` is NULL or a live fence handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_fence_wait(fence: *const db_fence, value: u64, timeout_ns: u64) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let f = unsafe { arg(fence, "fence")? };
        Ok(f.fence.wait(value, timeout(timeout_ns))?)
    })
}

/// Waits until every fence `fences[i]` reaches `values[i]` (`DB_WAIT_ALL`) or any one does
/// (`DB_WAIT_ANY`, a `db_wait_mode`), for `count` fences of `device`. `*out_index` (optional:
/// NULL to ignore) receives the index of a fence that reached its value for `DB_WAIT_ANY`, 0
/// for `DB_WAIT_ALL`. `timeout_ns` as in `db_fence_wait`.
///
/// # Safety
///
/// `device` is NULL or a live device handle; `fences` and `values` are NULL or point to
/// `count` readable elements (each fence NULL or a live fence handle); `out_index` is NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_device_wait_fences(
    device: *const db_device,
    fences: *const *const db_fence,
    values: *const u64,
    count: usize,
    mode: u32,
    timeout_ns: u64,
    out_index: *mut usize,
) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let (d, handles, values) =
            unsafe { (arg(device, "device")?, slice(fences, count, "fences")?, slice(values, count, "values")?) };
        let mode = match mode {
            0 => WaitMode::All,
            1 => WaitMode::Any,
            v => return Err(Error::invalid("mode", v, "a db_wait_mode: DB_WAIT_ALL (0) or DB_WAIT_ANY (1)")),
        };
        let mut conds = Vec::with_capacity(count);
        for (i, (&f, &v)) in handles.iter().zip(values).enumerate() {
            // SAFETY: the function's contract: each element is NULL or a live fence handle.
            match unsafe { opt_arg(f) } {
                Some(f) => conds.push((&f.fence, v)),
                None => return Err(Error::NullElement { array: "fences", index: i }),
            }
        }
        let reached = d.device.wait_fences(&conds, mode, timeout(timeout_ns))?;
        if !out_index.is_null() {
            // SAFETY: the function's contract: a non-NULL `out_index` is writable.
            unsafe { Out::new(out_index, "out_index")? }.set(reached);
        }
        Ok(())
    })
}
