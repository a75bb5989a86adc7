//! The socket's place in the file system: the default path, its directory's permissions,
//! making sure one daemon owns it, and never harming whatever else is there.
//!
//! Ownership is an `flock` on `NAME.lock` beside the socket, held for the daemon's life: the
//! kernel drops it when the daemon exits, however it exits (SIGKILL included), so a stale
//! socket file never blocks a restart, and two daemons can never both believe they own the
//! path. A clean stop removes the lock file while still holding the lock; a daemon that
//! opened the old file meanwhile sees that the path no longer names the file it locked and
//! tries again, so removing it cannot let two daemons in.
//!
//! The daemon deletes only what it can prove is a stale socket: with the lock held, a socket
//! file nobody listens on (a connect is refused). A regular file, a directory, a symbolic link
//! or a socket someone listens on is refused with the path and what is there, and left
//! untouched. A path longer than a Unix socket address holds is refused before anything is
//! created. The directory is created 0700 (and removed at the stop if the daemon created it
//! and it is empty again); the socket is made 0600: only its user connects.

use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use rustix::fs::{FlockOperation, Mode, OFlags};

/// The longest socket path, in bytes: `sun_path` holds 108 bytes, one of them the terminating
/// NUL that portable clients write.
pub const MAX_SOCKET_PATH_BYTES: usize = 107;

/// Why the socket could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// Another daemon holds the path.
    #[error("another doorbell daemon owns {path} (its lock {lock} is held)")]
    InUse {
        /// The socket.
        path: PathBuf,
        /// The lock file.
        lock: PathBuf,
    },
    /// Something that is not a stale socket is at the path; it was left untouched.
    #[error("{path} is {what}, not a stale doorbell socket: refusing to replace it (left untouched)")]
    Occupied {
        /// The socket path.
        path: PathBuf,
        /// What is there ("a regular file of 12 bytes", "a directory", …).
        what: String,
    },
    /// The path does not fit a Unix socket address.
    #[error(
        "socket path {path} is {bytes} bytes; a Unix socket path holds at most {max} bytes \
         (choose a shorter --socket)"
    )]
    PathTooLong {
        /// The socket path.
        path: PathBuf,
        /// Its length in bytes.
        bytes: usize,
        /// [`MAX_SOCKET_PATH_BYTES`].
        max: usize,
    },
    /// A file-system call failed.
    #[error("{what} {path}: {errno}")]
    Io {
        /// Which call.
        what: &'static str,
        /// On what.
        path: PathBuf,
        /// The error.
        errno: String,
    },
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(rustix::io::Errno) -> SocketError {
    let path = path.to_owned();
    move |e| SocketError::Io { what, path, errno: e.to_string() }
}

fn std_io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> SocketError {
    let path = path.to_owned();
    move |e| SocketError::Io { what, path, errno: e.to_string() }
}

pub use wire::default_socket_path;

/// Held while the daemon runs: the lock on the socket's path. Dropping it removes the lock
/// file (then releases the lock) and the socket's directory if [`prepare_socket`] created it
/// and it is empty.
#[derive(Debug)]
pub struct SocketLock {
    fd: Option<OwnedFd>,
    lock: PathBuf,
    created_dir: Option<PathBuf>,
}

impl Drop for SocketLock {
    fn drop(&mut self) {
        // Unlinked while still locked: a daemon that opened this file meanwhile finds, once
        // it holds the lock, that the path names another file (or none) and starts over.
        let _ = std::fs::remove_file(&self.lock);
        drop(self.fd.take());
        if let Some(dir) = &self.created_dir {
            // Only if empty: whatever else someone put there stays.
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// What is at `path`, without following a symbolic link: `None` when nothing is.
fn what_is_at(path: &Path) -> Result<Option<std::fs::Metadata>, SocketError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) => Ok(Some(m)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(std_io("inspect", path)(e)),
    }
}

/// Refuses whatever at `path` is not a socket file, naming it.
fn refuse_non_socket(path: &Path, m: &std::fs::Metadata) -> Result<(), SocketError> {
    let t = m.file_type();
    let what = if t.is_socket() {
        return Ok(());
    } else if t.is_file() {
        format!("a regular file of {} bytes", m.len())
    } else if t.is_dir() {
        "a directory".to_owned()
    } else if t.is_symlink() {
        match std::fs::read_link(path) {
            Ok(to) => format!("a symbolic link to {}", to.display()),
            Err(_) => "a symbolic link".to_owned(),
        }
    } else if t.is_fifo() {
        "a named pipe".to_owned()
    } else if t.is_char_device() || t.is_block_device() {
        "a device node".to_owned()
    } else {
        "something other than a socket".to_owned()
    };
    Err(SocketError::Occupied { path: path.to_owned(), what })
}

/// Whether someone accepts connections on the socket file at `path`. Only a refused connect
/// proves the file stale; anything else (accepted, a socket of another type) means it is in use.
fn is_listening(path: &Path) -> Result<bool, SocketError> {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let fd = rustix::net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
        .map_err(io("socket", path))?;
    let addr = SocketAddrUnix::new(path).map_err(io("socket address", path))?;
    match rustix::net::connect(&fd, &addr) {
        Err(rustix::io::Errno::CONNREFUSED | rustix::io::Errno::NOENT) => Ok(false),
        _ => Ok(true),
    }
}

/// Checks `path` before anything is created: it fits a socket address, and what is there (if
/// anything) is a socket file. [`prepare_socket`] calls it first; a CLI can call it to fail
/// before other work.
pub fn check_socket_path(path: &Path) -> Result<(), SocketError> {
    let bytes = path.as_os_str().as_bytes().len();
    if bytes > MAX_SOCKET_PATH_BYTES {
        return Err(SocketError::PathTooLong { path: path.to_owned(), bytes, max: MAX_SOCKET_PATH_BYTES });
    }
    match what_is_at(path)? {
        Some(m) => refuse_non_socket(path, &m),
        None => Ok(()),
    }
}

/// Takes the lock at `lock`, retrying while a stopping daemon removes the file under it.
fn take_lock(path: &Path, lock: &Path) -> Result<OwnedFd, SocketError> {
    loop {
        let fd = rustix::fs::open(lock, OFlags::CREATE | OFlags::RDWR | OFlags::CLOEXEC, Mode::from_raw_mode(0o600))
            .map_err(io("open", lock))?;
        match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => {
                return Err(SocketError::InUse { path: path.to_owned(), lock: lock.to_owned() });
            }
            Err(e) => return Err(io("flock", lock)(e)),
        }
        // The file locked must still be the one the path names (see the module docs).
        let held = rustix::fs::fstat(&fd).map_err(io("fstat", lock))?;
        match rustix::fs::stat(lock) {
            Ok(now) if (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino) => return Ok(fd),
            Ok(_) | Err(rustix::io::Errno::NOENT) => continue,
            Err(e) => return Err(io("stat", lock)(e)),
        }
    }
}

/// Checks the path ([`check_socket_path`]), creates the socket's directory (0700), takes the
/// path's lock (or refuses: another daemon owns it) and removes a stale socket file: one that
/// nobody listens on. Anything else at the path is refused and left as it is.
pub fn prepare_socket(path: &Path) -> Result<SocketLock, SocketError> {
    check_socket_path(path)?;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut created_dir = None;
    if what_is_at(dir)?.is_none() {
        std::fs::create_dir_all(dir).map_err(std_io("create directory", dir))?;
        rustix::fs::chmod(dir, Mode::from_raw_mode(0o700)).map_err(io("chmod", dir))?;
        created_dir = Some(dir.to_owned());
    }
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(".lock");
    let lock = dir.join(name);
    let fd = match take_lock(path, &lock) {
        Ok(fd) => fd,
        Err(e) => {
            if let Some(d) = &created_dir {
                let _ = std::fs::remove_file(&lock);
                let _ = std::fs::remove_dir(d);
            }
            return Err(e);
        }
    };
    let held = SocketLock { fd: Some(fd), lock, created_dir };
    // Looked at again with the lock held: it may have changed since the check.
    if let Some(m) = what_is_at(path)? {
        refuse_non_socket(path, &m)?;
        if is_listening(path)? {
            return Err(SocketError::Occupied {
                path: path.to_owned(),
                what: "a socket another program is listening on".to_owned(),
            });
        }
        std::fs::remove_file(path).map_err(std_io("remove stale socket", path))?;
        tracing::info!(socket = %path.display(), "removed a stale socket (nobody listened on it)");
    }
    Ok(held)
}

/// Makes the bound socket 0600.
pub fn restrict(path: &Path) -> Result<(), SocketError> {
    rustix::fs::chmod(path, Mode::from_raw_mode(0o600)).map_err(io("chmod", path))
}
