//! `prepare_socket` never harms its host: it deletes only a stale socket it can prove is one,
//! refuses everything else at the path (left byte for byte as it was), refuses a path too long
//! for a socket address before creating anything, and cleans its lock file (and a directory it
//! created) when the daemon stops.

use std::os::unix::fs::{FileTypeExt, symlink};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use daemon::{MAX_SOCKET_PATH_BYTES, SocketError, prepare_socket};

/// A fresh directory for one test, removed when the test ends.
fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("doorbell-socket-test-{name}-")).tempdir().unwrap()
}

fn lock_of(socket: &Path) -> PathBuf {
    socket.with_file_name(format!("{}.lock", socket.file_name().unwrap().to_str().unwrap()))
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<_> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    v.sort();
    v
}

#[test]
fn a_regular_file_at_the_path_is_refused_and_left_byte_for_byte() {
    let tmp = scratch("file");
    let dir = tmp.path();
    let path = dir.join("doorbell.sock");
    let bytes: Vec<u8> = (0..=255u8).cycle().take(5000).collect();
    std::fs::write(&path, &bytes).unwrap();
    let e = prepare_socket(&path).unwrap_err();
    assert!(
        matches!(&e, SocketError::Occupied { path: p, what } if p == &path && what == "a regular file of 5000 bytes"),
        "{e}"
    );
    let msg = e.to_string();
    assert!(msg.contains(path.to_str().unwrap()) && msg.contains("left untouched"), "{msg}");
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
    assert_eq!(entries(dir), ["doorbell.sock"], "nothing else created (no lock file)");
}

#[test]
fn a_directory_at_the_path_is_refused_and_left_with_its_contents() {
    let tmp = scratch("dir");
    let dir = tmp.path();
    let path = dir.join("doorbell.sock");
    std::fs::create_dir(&path).unwrap();
    std::fs::write(path.join("keep"), b"mine").unwrap();
    let e = prepare_socket(&path).unwrap_err();
    assert!(matches!(&e, SocketError::Occupied { what, .. } if what == "a directory"), "{e}");
    assert_eq!(std::fs::read(path.join("keep")).unwrap(), b"mine");
    assert_eq!(entries(dir), ["doorbell.sock"]);
}

#[test]
fn a_symbolic_link_at_the_path_is_refused_not_followed() {
    let tmp = scratch("link");
    let dir = tmp.path();
    let target = dir.join("target");
    std::fs::write(&target, b"precious").unwrap();
    let path = dir.join("doorbell.sock");
    symlink(&target, &path).unwrap();
    let e = prepare_socket(&path).unwrap_err();
    let SocketError::Occupied { what, .. } = &e else { panic!("{e}") };
    assert_eq!(what, &format!("a symbolic link to {}", target.display()));
    assert!(std::fs::symlink_metadata(&path).unwrap().file_type().is_symlink());
    assert_eq!(std::fs::read(&target).unwrap(), b"precious");
    // A dangling link is refused too.
    std::fs::remove_file(&target).unwrap();
    assert!(matches!(prepare_socket(&path), Err(SocketError::Occupied { .. })));
    assert!(std::fs::symlink_metadata(&path).is_ok());
}

#[test]
fn a_socket_someone_listens_on_is_refused_and_kept() {
    let tmp = scratch("live");
    let dir = tmp.path();
    let path = dir.join("doorbell.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let e = prepare_socket(&path).unwrap_err();
    assert!(matches!(&e, SocketError::Occupied { what, .. } if what.contains("listening")), "{e}");
    assert!(std::fs::symlink_metadata(&path).unwrap().file_type().is_socket());
    // Its owner still serves on it.
    UnixStream::connect(&path).expect("the listener still answers");
    drop(listener);
    assert!(!lock_of(&path).exists(), "the refused attempt's lock file is gone");
}

#[test]
fn a_stale_socket_is_removed_and_the_lock_file_goes_at_the_stop() {
    let tmp = scratch("stale");
    let dir = tmp.path();
    let path = dir.join("doorbell.sock");
    drop(UnixListener::bind(&path).unwrap()); // the file stays; nobody listens
    assert!(path.exists());
    let lock = prepare_socket(&path).unwrap();
    assert!(!path.exists(), "the stale socket was removed");
    assert!(lock_of(&path).exists());
    // While held, a second daemon is refused.
    let e = prepare_socket(&path).unwrap_err();
    assert!(matches!(e, SocketError::InUse { .. }), "{e}");
    drop(lock);
    assert_eq!(entries(dir), Vec::<String>::new(), "the lock file is removed at the stop");
    // And the path can be taken again.
    drop(prepare_socket(&path).unwrap());
}

#[test]
fn a_directory_the_daemon_created_is_removed_at_the_stop_if_empty() {
    let tmp = scratch("created");
    let dir = tmp.path();
    let sub = dir.join("a/b");
    let path = sub.join("doorbell.sock");
    let lock = prepare_socket(&path).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&sub).unwrap().permissions().mode() & 0o777, 0o700);
    drop(lock);
    assert!(!sub.exists(), "created and emptied: removed");
    // A directory that was already there stays.
    let lock = prepare_socket(&path).unwrap();
    std::fs::write(sub.join("someone-elses"), b"x").unwrap();
    drop(lock);
    assert_eq!(entries(&sub), ["someone-elses"]);
}

#[test]
fn a_path_too_long_is_refused_before_anything_is_created() {
    let tmp = scratch("long");
    let dir = tmp.path();
    let sub = dir.join("x".repeat(120));
    let path = sub.join("doorbell.sock");
    let e = prepare_socket(&path).unwrap_err();
    let SocketError::PathTooLong { bytes, max, .. } = &e else { panic!("{e}") };
    assert_eq!((*bytes, *max), (path.as_os_str().len(), MAX_SOCKET_PATH_BYTES));
    let msg = e.to_string();
    assert!(msg.contains(path.to_str().unwrap()) && msg.contains("at most 107 bytes"), "{msg}");
    assert!(!sub.exists(), "no directory created");
    assert_eq!(entries(dir), Vec::<String>::new());
}
