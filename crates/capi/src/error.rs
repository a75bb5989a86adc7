//! Status codes, the thread-local last-error message, and the guard every entry point runs
//! its body in.
//!
//! Every `db_` function returns an `int32_t`: [`db_status::DB_OK`] (0) or a negative
//! [`db_status`]. The text of the error — the Rust error's `Display`, which names the field
//! or argument and the value — is kept per thread and read with [`db_last_error`].
//!
//! `guard` is the one place where a Rust error or panic becomes a status: it runs the body
//! under [`std::panic::catch_unwind`], so no panic unwinds into C (which would be undefined
//! behaviour), and turns both into a status and a message. Invariant: every exported function
//! is `guard(|| ...)` around its whole body, argument checks included.

use std::cell::RefCell;
use std::ffi::{CString, c_char};
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};

use abi::port::KernelError;
use umd::UmdError;

/// What a `db_` function returns: 0 for success, a negative value for an error. The message
/// of the error is `db_last_error()`.
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum db_status {
    /// Success.
    DB_OK = 0,
    /// A required pointer argument was NULL. The message names the argument.
    DB_NULL_ARGUMENT = -1,
    /// A value outside its domain (an enum value, a size, a flag, a progress value that does
    /// not move forward, a malformed command buffer). The message names the field and value.
    DB_INVALID_ARGUMENT = -2,
    /// An offset and length past the end of a buffer.
    DB_OUT_OF_BOUNDS = -3,
    /// A kernel handle the kernel does not know (stale, foreign, destroyed).
    DB_BAD_HANDLE = -4,
    /// The object is still in use by another.
    DB_IN_USE = -5,
    /// The call needs the other submission model (e.g. a doorbell reconnect on a
    /// kernel-mode queue).
    DB_WRONG_QUEUE_MODE = -6,
    /// The device has no engine of the requested kind, or none with that submission model.
    DB_NO_ENGINE = -7,
    /// A command buffer longer than half the queue's ring.
    DB_TOO_LARGE = -8,
    /// A CPU read or wait on a fence without CPU access (`DB_FENCE_INTRA_GPU`).
    DB_NO_CPU_ACCESS = -9,
    /// A wait timed out.
    DB_TIMEOUT = -10,
    /// The queue can run no more work (faulted, destroyed, doorbell `DisconnectedAbort`):
    /// destroy it and create another.
    DB_QUEUE_LOST = -11,
    /// The device, the adapter or the process is lost or terminated.
    DB_DEVICE_LOST = -12,
    /// A kernel pool or a limit ran out (queues, doorbells, memory).
    DB_EXHAUSTED = -13,
    /// The daemon could not be reached, or refused the connection.
    DB_CONNECT = -14,
    /// Shared memory holds a value the kernel never writes.
    DB_CORRUPT = -15,
    /// The operating system or the kernel failed otherwise (the message says how).
    DB_SYSTEM = -16,
    /// A panic inside the library (a bug in doorbell), caught at the boundary. The object the
    /// call used may be unusable afterwards; the message says what panicked.
    DB_PANIC = -17,
}

/// Every status, for [`db_status_name`] and the tests.
const ALL_STATUSES: [db_status; 18] = [
    db_status::DB_OK,
    db_status::DB_NULL_ARGUMENT,
    db_status::DB_INVALID_ARGUMENT,
    db_status::DB_OUT_OF_BOUNDS,
    db_status::DB_BAD_HANDLE,
    db_status::DB_IN_USE,
    db_status::DB_WRONG_QUEUE_MODE,
    db_status::DB_NO_ENGINE,
    db_status::DB_TOO_LARGE,
    db_status::DB_NO_CPU_ACCESS,
    db_status::DB_TIMEOUT,
    db_status::DB_QUEUE_LOST,
    db_status::DB_DEVICE_LOST,
    db_status::DB_EXHAUSTED,
    db_status::DB_CONNECT,
    db_status::DB_CORRUPT,
    db_status::DB_SYSTEM,
    db_status::DB_PANIC,
];

impl db_status {
    /// Its name as a NUL-terminated string, as the header spells it.
    const fn name(self) -> &'static std::ffi::CStr {
        match self {
            db_status::DB_OK => c"DB_OK",
            db_status::DB_NULL_ARGUMENT => c"DB_NULL_ARGUMENT",
            db_status::DB_INVALID_ARGUMENT => c"DB_INVALID_ARGUMENT",
            db_status::DB_OUT_OF_BOUNDS => c"DB_OUT_OF_BOUNDS",
            db_status::DB_BAD_HANDLE => c"DB_BAD_HANDLE",
            db_status::DB_IN_USE => c"DB_IN_USE",
            db_status::DB_WRONG_QUEUE_MODE => c"DB_WRONG_QUEUE_MODE",
            db_status::DB_NO_ENGINE => c"DB_NO_ENGINE",
            db_status::DB_TOO_LARGE => c"DB_TOO_LARGE",
            db_status::DB_NO_CPU_ACCESS => c"DB_NO_CPU_ACCESS",
            db_status::DB_TIMEOUT => c"DB_TIMEOUT",
            db_status::DB_QUEUE_LOST => c"DB_QUEUE_LOST",
            db_status::DB_DEVICE_LOST => c"DB_DEVICE_LOST",
            db_status::DB_EXHAUSTED => c"DB_EXHAUSTED",
            db_status::DB_CONNECT => c"DB_CONNECT",
            db_status::DB_CORRUPT => c"DB_CORRUPT",
            db_status::DB_SYSTEM => c"DB_SYSTEM",
            db_status::DB_PANIC => c"DB_PANIC",
        }
    }
}

/// Everything an entry point can fail with: the C layer's own checks, and the driver's
/// errors passed through.
#[derive(Debug)]
pub(crate) enum Error {
    /// A required pointer argument was NULL.
    Null(&'static str),
    /// An element of an array of handles was NULL.
    NullElement {
        /// The array argument.
        array: &'static str,
        /// The element's index.
        index: usize,
    },
    /// An argument (or a field of a struct argument) outside its domain.
    Invalid {
        /// The argument or field, as the header names it.
        field: String,
        /// Its value, as text.
        value: String,
        /// What it may be.
        expected: String,
    },
    /// `offset + bytes` runs past a buffer's end.
    OutOfBounds {
        /// The offset argument.
        offset: u64,
        /// The length argument.
        bytes: u64,
        /// The buffer's size.
        size: u64,
    },
    /// The driver refused or failed.
    Umd(UmdError),
    /// The daemon could not be reached or refused the connection (`db_device_connect`).
    Connect(wire::ConnectError),
    /// A handle's lock was poisoned by an earlier panic while it was held.
    Poisoned(&'static str),
}

impl Error {
    /// [`Error::Invalid`] from displayable parts.
    pub(crate) fn invalid(field: impl Into<String>, value: impl fmt::Display, expected: impl Into<String>) -> Error {
        Error::Invalid { field: field.into(), value: value.to_string(), expected: expected.into() }
    }

    /// The status this error is reported with.
    pub(crate) fn status(&self) -> db_status {
        use db_status::*;
        match self {
            Error::Null(_) | Error::NullElement { .. } => DB_NULL_ARGUMENT,
            Error::Invalid { .. } => DB_INVALID_ARGUMENT,
            Error::OutOfBounds { .. } => DB_OUT_OF_BOUNDS,
            Error::Poisoned(_) => DB_PANIC,
            Error::Umd(e) => umd_status(e),
            Error::Connect(_) => DB_CONNECT,
        }
    }
}

fn umd_status(e: &UmdError) -> db_status {
    use db_status::*;
    match e {
        UmdError::Kernel(k) => kernel_status(k),
        UmdError::QueueLost { .. } => DB_QUEUE_LOST,
        UmdError::TooLarge { .. } => DB_TOO_LARGE,
        UmdError::Timeout { .. } | UmdError::FenceTimeout { .. } => DB_TIMEOUT,
        UmdError::NoCpuAccess { .. } => DB_NO_CPU_ACCESS,
        UmdError::Corrupt { .. } => DB_CORRUPT,
        UmdError::NoEngine { .. } => DB_NO_ENGINE,
        UmdError::Shm(s) => shm_status(s),
        // The reconnect's own status; db_last_error names the published value.
        UmdError::NotRung { source, .. } => umd_status(source),
    }
}

fn kernel_status(e: &KernelError) -> db_status {
    use db_status::*;
    match e {
        KernelError::BadHandle { .. } => DB_BAD_HANDLE,
        KernelError::InvalidArgument { .. }
        | KernelError::OutsideMappings { .. }
        | KernelError::BadPacket { .. }
        | KernelError::NotIncreasing { .. } => DB_INVALID_ARGUMENT,
        KernelError::InUse { .. } => DB_IN_USE,
        KernelError::QueueLost { .. } => DB_QUEUE_LOST,
        KernelError::WrongQueueMode { .. } => DB_WRONG_QUEUE_MODE,
        KernelError::Exhausted { .. } => DB_EXHAUSTED,
        KernelError::DeviceLost { .. } | KernelError::AdapterLost { .. } | KernelError::ProcessTerminated(_) => {
            DB_DEVICE_LOST
        }
        KernelError::CorruptLog { .. } => DB_CORRUPT,
        KernelError::Shm(s) => shm_status(s),
        KernelError::FeatureMismatch { .. } | KernelError::UnexpectedReply { .. } => DB_SYSTEM,
    }
}

fn shm_status(e: &shm::ShmError) -> db_status {
    use db_status::*;
    match e {
        shm::ShmError::OutOfBounds { .. } => DB_OUT_OF_BOUNDS,
        shm::ShmError::Misaligned { .. } | shm::ShmError::BadSize { .. } => DB_INVALID_ARGUMENT,
        shm::ShmError::Exhausted { .. } => DB_EXHAUSTED,
        _ => DB_SYSTEM,
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Null(arg) => write!(f, "argument `{arg}` is null"),
            Error::NullElement { array, index } => write!(f, "argument `{array}[{index}]` is null"),
            Error::Invalid { field, value, expected } => write!(f, "`{field}` = {value}: expected {expected}"),
            Error::OutOfBounds { offset, bytes, size } => write!(
                f,
                "`offset` = {offset:#x} with `bytes` = {bytes:#x} runs past the end of the buffer ({size:#x} bytes)"
            ),
            Error::Umd(e) => write!(f, "{e}"),
            Error::Connect(e) => write!(f, "{e}"),
            Error::Poisoned(what) => write!(
                f,
                "`{what}` was left in an unknown state by an earlier internal panic (see the DB_PANIC \
                 message that call returned); destroy it"
            ),
        }
    }
}

impl From<UmdError> for Error {
    fn from(e: UmdError) -> Self {
        Error::Umd(e)
    }
}

impl From<wire::ConnectError> for Error {
    fn from(e: wire::ConnectError) -> Self {
        Error::Connect(e)
    }
}

impl From<KernelError> for Error {
    fn from(e: KernelError) -> Self {
        Error::Umd(e.into())
    }
}

thread_local! {
    /// The message of the last failed call on this thread.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `msg` as this thread's last error. An interior NUL (a C string cannot hold one)
/// is written as `\0`. During the thread's teardown, when its thread-locals are gone, the
/// message is dropped: the status still says what happened.
fn set_last_error(msg: String) {
    let msg = CString::new(msg.replace('\0', "\\0")).unwrap_or_default();
    let _ = LAST_ERROR.try_with(|last| *last.borrow_mut() = msg);
}

/// What a panic carried, as text.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

/// Runs an entry point's body: `DB_OK` on success; otherwise the error's status, with its
/// message recorded for [`db_last_error`]. A panic — in the body, or in formatting the error
/// — is caught here and reported as `DB_PANIC`, so none unwinds into C.
///
/// `AssertUnwindSafe`: after a caught panic, an object whose state might be half-updated sits
/// behind a `Mutex` (queues, command buffers), which the panic poisons, and later calls on it
/// report [`Error::Poisoned`]; the other handles (devices, buffers, contexts, fences) hold no
/// state of their own that a call updates: it lives in the kernel, or in shared memory
/// written with single atomic stores.
pub(crate) fn guard(body: impl FnOnce() -> Result<(), Error>) -> i32 {
    let outcome = catch_unwind(AssertUnwindSafe(|| body().map_err(|e| (e.status(), e.to_string()))));
    let (status, msg) = match outcome {
        Ok(Ok(())) => return db_status::DB_OK as i32,
        Ok(Err(failed)) => failed,
        Err(payload) => (
            db_status::DB_PANIC,
            format!("internal panic (a bug in doorbell, please report it): {}", panic_message(&*payload)),
        ),
    };
    set_last_error(msg);
    status as i32
}

/// The message of the last call on this thread that returned an error: the driver's
/// description, which names the argument or field and its value (e.g. "argument `out_queue`
/// is null", "`engine_kind` = 7: expected ..."). An empty string if no call on this thread
/// has failed yet. The pointer stays valid until the next `db_` call on this thread; copy the
/// text to keep it. Never NULL; do not free it.
#[unsafe(no_mangle)]
pub extern "C" fn db_last_error() -> *const c_char {
    catch_unwind(|| LAST_ERROR.try_with(|last| last.borrow().as_ptr()).unwrap_or(c"".as_ptr())).unwrap_or(c"".as_ptr())
}

/// The name of a status code as the header spells it (`"DB_TIMEOUT"`), or
/// `"DB_UNKNOWN_STATUS"` for a value that is none of them. A static string: never NULL, do
/// not free it.
#[unsafe(no_mangle)]
pub extern "C" fn db_status_name(status: i32) -> *const c_char {
    catch_unwind(|| ALL_STATUSES.iter().find(|s| **s as i32 == status).map_or(c"DB_UNKNOWN_STATUS", |s| s.name()))
        .unwrap_or(c"DB_UNKNOWN_STATUS")
        .as_ptr()
}

#[cfg(test)]
mod tests {
    use std::ffi::CStr;

    use super::*;

    fn last() -> String {
        // SAFETY: db_last_error returns a valid NUL-terminated string, alive until the next
        // db_ call on this thread; it is copied at once.
        unsafe { CStr::from_ptr(db_last_error()) }.to_str().unwrap().to_owned()
    }

    #[test]
    fn a_panic_in_a_body_is_caught_and_reported_as_db_panic_with_its_message() {
        let status = guard(|| panic!("the test's own panic, value 42"));
        assert_eq!(status, db_status::DB_PANIC as i32);
        let msg = last();
        assert!(msg.contains("internal panic") && msg.contains("the test's own panic, value 42"), "{msg}");
        // A formatted panic message (a String payload) is kept too.
        let n = 7;
        assert_eq!(guard(|| panic!("formatted {n}")), db_status::DB_PANIC as i32);
        assert!(last().ends_with("formatted 7"), "{}", last());
    }

    #[test]
    fn a_panic_while_formatting_an_error_is_caught_too() {
        struct Bad;
        impl fmt::Display for Bad {
            fn fmt(&self, _: &mut fmt::Formatter<'_>) -> fmt::Result {
                panic!("Display panicked")
            }
        }
        let status = guard(|| Err(Error::invalid("x", Bad, "anything")));
        assert_eq!(status, db_status::DB_PANIC as i32);
        assert!(last().contains("Display panicked"), "{}", last());
    }

    #[test]
    fn errors_keep_their_status_and_message_and_success_leaves_the_last_message() {
        assert_eq!(guard(|| Err(Error::Null("out_queue"))), db_status::DB_NULL_ARGUMENT as i32);
        assert_eq!(last(), "argument `out_queue` is null");
        assert_eq!(guard(|| Ok(())), 0);
        assert_eq!(last(), "argument `out_queue` is null", "errno-like: only a failure replaces it");
        assert_eq!(guard(|| Err(Error::invalid("nul", "a\0b", "text"))), db_status::DB_INVALID_ARGUMENT as i32);
        assert_eq!(last(), "`nul` = a\\0b: expected text");
    }

    #[test]
    fn every_status_has_its_header_name_and_unknown_values_say_so() {
        for s in ALL_STATUSES {
            // SAFETY: db_status_name returns a static NUL-terminated string.
            let name = unsafe { CStr::from_ptr(db_status_name(s as i32)) }.to_str().unwrap();
            assert_eq!(name, format!("{s:?}"));
        }
        // SAFETY: as above.
        let unknown = unsafe { CStr::from_ptr(db_status_name(-1000)) };
        assert_eq!(unknown, c"DB_UNKNOWN_STATUS");
        let values: std::collections::BTreeSet<i32> = ALL_STATUSES.iter().map(|s| *s as i32).collect();
        assert_eq!(values, (-17..=0).collect(), "contiguous, no duplicates");
    }
}
