//! Buffers: memory mapped for the GPU (a GPU virtual address packets name) and the CPU (read
//! and written here).

use crate::device::db_device;
use crate::error::{Error, guard};
use crate::ptr::{Out, arg, bytes_out, destroy, new_handle, slice};

/// GPU memory mapped into this process: a GPU VA and a CPU mapping.
pub struct db_buffer {
    pub(crate) buffer: umd::Buffer,
}

impl db_buffer {
    /// Checks that `[offset, offset + bytes)` lies inside the buffer, naming both arguments.
    fn check(&self, offset: u64, bytes: u64) -> Result<(), Error> {
        let size = self.buffer.len();
        match offset.checked_add(bytes) {
            Some(end) if end <= size => Ok(()),
            _ => Err(Error::OutOfBounds { offset, bytes, size }),
        }
    }
}

/// Allocates `bytes` of memory (rounded up to whole 4 KiB pages) in system memory, mapped for
/// the GPU and the CPU, zeroed. On success `*out_buffer` is a new handle, to be destroyed with
/// `db_buffer_destroy`.
///
/// # Safety
///
/// `device` is NULL or a live device handle; `out_buffer` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_buffer_create(
    device: *const db_device,
    bytes: u64,
    out_buffer: *mut *mut db_buffer,
) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let (d, out) = unsafe { (arg(device, "device")?, Out::new(out_buffer, "out_buffer")?) };
        let buffer = d.device.allocate(bytes)?;
        out.set(new_handle(db_buffer { buffer }));
        Ok(())
    })
}

/// Frees a buffer; NULL is a no-op. Work still in flight that reads or writes it faults its
/// queue (the GPU mapping is gone); wait for it first.
///
/// # Safety
///
/// `buffer` is NULL or a live buffer handle that no other thread is using; it must not be
/// used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_buffer_destroy(buffer: *mut db_buffer) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        unsafe { destroy(buffer) };
        Ok(())
    })
}

/// The buffer's GPU virtual address: what packets name.
///
/// # Safety
///
/// `buffer` is NULL or a live buffer handle; `out_va` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_buffer_va(buffer: *const db_buffer, out_va: *mut u64) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let (b, out) = unsafe { (arg(buffer, "buffer")?, Out::new(out_va, "out_va")?) };
        out.set(b.buffer.va());
        Ok(())
    })
}

/// The buffer's size in bytes (whole pages: at least what was asked for).
///
/// # Safety
///
/// `buffer` is NULL or a live buffer handle; `out_bytes` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_buffer_size(buffer: *const db_buffer, out_bytes: *mut u64) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let (b, out) = unsafe { (arg(buffer, "buffer")?, Out::new(out_bytes, "out_bytes")?) };
        out.set(b.buffer.len());
        Ok(())
    })
}

/// Copies `bytes` bytes from `data` into the buffer at byte `offset`. `DB_OUT_OF_BOUNDS` if
/// they run past its end. `data` may be NULL when `bytes` is 0.
///
/// # Safety
///
/// `buffer` is NULL or a live buffer handle; `data` is NULL or points to `bytes` readable
/// bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_buffer_write(
    buffer: *const db_buffer,
    offset: u64,
    data: *const std::ffi::c_void,
    bytes: usize,
) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let (b, data) = unsafe { (arg(buffer, "buffer")?, slice(data.cast::<u8>(), bytes, "data")?) };
        b.check(offset, bytes as u64)?;
        Ok(b.buffer.write(offset, data)?)
    })
}

/// Copies `bytes` bytes of the buffer at byte `offset` into `out_data`. `DB_OUT_OF_BOUNDS` if
/// they run past its end. `out_data` may be NULL when `bytes` is 0.
///
/// # Safety
///
/// `buffer` is NULL or a live buffer handle; `out_data` is NULL or points to `bytes`
/// writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_buffer_read(
    buffer: *const db_buffer,
    offset: u64,
    out_data: *mut std::ffi::c_void,
    bytes: usize,
) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let b = unsafe { arg(buffer, "buffer")? };
        b.check(offset, bytes as u64)?;
        // SAFETY: the function's contract (above).
        let out = unsafe { bytes_out(out_data.cast::<u8>(), bytes, "out_data")? };
        Ok(b.buffer.read(offset, out)?)
    })
}

/// Reads the 32-bit little-endian word at byte `offset`.
///
/// # Safety
///
/// `buffer` is NULL or a live buffer handle; `out_value` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_buffer_read_u32(buffer: *const db_buffer, offset: u64, out_value: *mut u32) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let (b, out) = unsafe { (arg(buffer, "buffer")?, Out::new(out_value, "out_value")?) };
        b.check(offset, 4)?;
        out.set(b.buffer.read_u32(offset)?);
        Ok(())
    })
}

/// Reads the 64-bit little-endian word at byte `offset`.
///
/// # Safety
///
/// `buffer` is NULL or a live buffer handle; `out_value` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_buffer_read_u64(buffer: *const db_buffer, offset: u64, out_value: *mut u64) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let (b, out) = unsafe { (arg(buffer, "buffer")?, Out::new(out_value, "out_value")?) };
        b.check(offset, 8)?;
        out.set(b.buffer.read_u64(offset)?);
        Ok(())
    })
}

/// Writes a 32-bit little-endian word at byte `offset`.
///
/// # Safety
///
/// `buffer` is NULL or a live buffer handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_buffer_write_u32(buffer: *const db_buffer, offset: u64, value: u32) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let b = unsafe { arg(buffer, "buffer")? };
        b.check(offset, 4)?;
        Ok(b.buffer.write(offset, &value.to_le_bytes())?)
    })
}

/// Writes a 64-bit little-endian word at byte `offset`.
///
/// # Safety
///
/// `buffer` is NULL or a live buffer handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn db_buffer_write_u64(buffer: *const db_buffer, offset: u64, value: u64) -> i32 {
    guard(|| {
        // SAFETY: the function's contract (above).
        let b = unsafe { arg(buffer, "buffer")? };
        b.check(offset, 8)?;
        Ok(b.buffer.write_u64(offset, value)?)
    })
}
