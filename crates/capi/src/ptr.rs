//! Raw pointers in, references out: the conversions every entry point makes of its
//! arguments, each in one place.
//!
//! C hands the library pointers: handles it got from a `_create`/`_open` function, output
//! locations, arrays with a length, strings. Each kind has one function here that checks it
//! for NULL (an [`Error::Null`] naming the argument, never a crash) and turns it into a
//! reference, a slice or an [`Out`]. What cannot be checked — that a non-NULL pointer is live,
//! aligned and of the right type — is the caller's contract, stated in the header for every
//! function ("NULL or a live handle", "NULL or writable"); these functions are `unsafe` for
//! exactly that reason, and their callers' `SAFETY` comments point at the contract.
//!
//! Handles are `Box`es: [`new_handle`] gives C the box's pointer, [`destroy`] takes it back.

use std::ffi::{CStr, OsStr, c_char};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr::NonNull;

use crate::error::Error;

/// A handle argument: the object behind a non-NULL pointer.
///
/// # Safety
///
/// `p` is NULL or points to a live `T` (a handle this library returned and nobody destroyed),
/// which stays alive and is not destroyed for `'a`.
pub(crate) unsafe fn arg<'a, T>(p: *const T, name: &'static str) -> Result<&'a T, Error> {
    // SAFETY: by the function's contract, a non-NULL `p` points to a live `T`.
    unsafe { p.as_ref() }.ok_or(Error::Null(name))
}

/// An optional handle argument: `None` for NULL.
///
/// # Safety
///
/// As [`arg`].
pub(crate) unsafe fn opt_arg<'a, T>(p: *const T) -> Option<&'a T> {
    // SAFETY: by the function's contract, a non-NULL `p` points to a live `T`.
    unsafe { p.as_ref() }
}

/// An output argument: where a result goes. Made once the pointer is known non-NULL, so
/// writing it cannot fail; nothing is read from it (C may pass uninitialized memory).
pub(crate) struct Out<T>(NonNull<T>);

impl<T> Out<T> {
    /// Checks an output pointer.
    ///
    /// # Safety
    ///
    /// `p` is NULL or valid for a write of a `T` (aligned, writable), until [`Out::set`].
    pub(crate) unsafe fn new(p: *mut T, name: &'static str) -> Result<Out<T>, Error> {
        NonNull::new(p).map(Out).ok_or(Error::Null(name))
    }

    /// Writes the result (without reading or dropping what was there).
    pub(crate) fn set(self, value: T) {
        // SAFETY: `Out::new`'s contract: the pointer is valid for a write of a `T`.
        unsafe { self.0.as_ptr().write(value) }
    }
}

/// An input array of `len` elements; NULL is allowed only for an empty one.
///
/// # Safety
///
/// `p` is NULL or points to `len` initialized `T`s that nobody writes for `'a`.
pub(crate) unsafe fn slice<'a, T>(p: *const T, len: usize, name: &'static str) -> Result<&'a [T], Error> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Error::Null(name));
    }
    // SAFETY: by the function's contract, `p` points to `len` initialized `T`s.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// An output byte array of `len` bytes, zeroed first (C may pass uninitialized memory, and a
/// Rust slice must hold initialized bytes); NULL is allowed only for an empty one.
///
/// # Safety
///
/// `p` is NULL or valid for writes of `len` bytes that nobody else reads or writes for `'a`.
pub(crate) unsafe fn bytes_out<'a>(p: *mut u8, len: usize, name: &'static str) -> Result<&'a mut [u8], Error> {
    if len == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(Error::Null(name));
    }
    // SAFETY: by the function's contract, `p` is valid for writes of `len` bytes; once they
    // are zeroed, they are initialized, and nobody else touches them for `'a`.
    unsafe {
        p.write_bytes(0, len);
        Ok(std::slice::from_raw_parts_mut(p, len))
    }
}

/// An output array of `len` `u32`s (zeroed first, as [`bytes_out`]); NULL only for an empty one.
///
/// # Safety
///
/// `p` is NULL or valid for writes of `len` aligned `u32`s that nobody else touches for `'a`.
pub(crate) unsafe fn words_out<'a>(p: *mut u32, len: usize, name: &'static str) -> Result<&'a mut [u32], Error> {
    if len == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(Error::Null(name));
    }
    // SAFETY: by the function's contract, `p` is valid for writes of `len` aligned u32s;
    // zeroed, they are initialized, and nobody else touches them for `'a`.
    unsafe {
        p.write_bytes(0, len);
        Ok(std::slice::from_raw_parts_mut(p, len))
    }
}

/// An optional path argument, as bytes (a Unix path need not be UTF-8): `None` for NULL.
///
/// # Safety
///
/// `p` is NULL or points to a NUL-terminated string that nobody writes for `'a`.
pub(crate) unsafe fn opt_path<'a>(p: *const c_char) -> Option<&'a Path> {
    if p.is_null() {
        return None;
    }
    // SAFETY: by the function's contract, `p` is a NUL-terminated string alive for `'a`.
    let bytes = unsafe { CStr::from_ptr(p) }.to_bytes();
    Some(Path::new(OsStr::from_bytes(bytes)))
}

/// Boxes a handle for C. It is C's to destroy, exactly once, with [`destroy`].
pub(crate) fn new_handle<T>(value: T) -> *mut T {
    Box::into_raw(Box::new(value))
}

/// Destroys a handle [`new_handle`] made; NULL is a no-op.
///
/// # Safety
///
/// `p` is NULL or a handle from [`new_handle`] of the same `T`, not destroyed yet, which no
/// other thread is using; it must not be used again.
pub(crate) unsafe fn destroy<T>(p: *mut T) {
    if !p.is_null() {
        // SAFETY: by the function's contract, `p` came from `Box::into_raw` and is destroyed
        // once, here.
        drop(unsafe { Box::from_raw(p) });
    }
}
