//! The socket's place in the file system: the default path, its directory's permissions,
//! and making sure one daemon owns it.
//!
//! Ownership is an `flock` on `doorbell.lock` beside the socket, held for the daemon's life:
//! the kernel drops it when the daemon exits, however it exits (SIGKILL included), so a
//! stale socket file never blocks a restart, and two daemons can never both believe they own
//! the path. With the lock held, a socket file left by a dead daemon is removed and bound
//! anew. The directory is created 0700 and the socket made 0600: only its user connects.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{FlockOperation, Mode, OFlags};

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

pub use wire::default_socket_path;

/// Held while the daemon runs: the lock on the socket's path.
#[derive(Debug)]
pub struct SocketLock {
    _fd: OwnedFd,
}

/// Creates the socket's directory (0700), takes the path's lock (or refuses: another daemon
/// owns it) and removes a stale socket file.
pub fn prepare_socket(path: &Path) -> Result<SocketLock, SocketError> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !dir.exists() {
        std::fs::create_dir_all(dir).map_err(|e| SocketError::Io {
            what: "create directory",
            path: dir.to_owned(),
            errno: e.to_string(),
        })?;
        rustix::fs::chmod(dir, Mode::from_raw_mode(0o700)).map_err(io("chmod", dir))?;
    }
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(".lock");
    let lock = dir.join(name);
    let fd = rustix::fs::open(&lock, OFlags::CREATE | OFlags::RDWR | OFlags::CLOEXEC, Mode::from_raw_mode(0o600))
        .map_err(io("open", &lock))?;
    match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => return Err(SocketError::InUse { path: path.to_owned(), lock }),
        Err(e) => return Err(io("flock", &lock)(e)),
    }
    match std::fs::remove_file(path) {
        Ok(()) => tracing::info!(socket = %path.display(), "removed a stale socket"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(SocketError::Io { what: "remove stale socket", path: path.to_owned(), errno: e.to_string() });
        }
    }
    Ok(SocketLock { _fd: fd })
}

/// Makes the bound socket 0600.
pub fn restrict(path: &Path) -> Result<(), SocketError> {
    rustix::fs::chmod(path, Mode::from_raw_mode(0o600)).map_err(io("chmod", path))
}
