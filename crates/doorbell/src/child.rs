//! Child processes this binary starts of itself (a daemon for `demo --daemon` and the daemon
//! benchmark, client roles, benchmark peers), and the promise that none outlives its parent.
//!
//! Every child is started through [`command`], which asks the kernel to send it SIGTERM when
//! the thread that started it ends (`PR_SET_PDEATHSIG`), so a parent killed with SIGKILL
//! leaves no child behind. Children are started from the command's main thread, which lives
//! as long as the process. A daemon child ([`DaemonChild`]) stops cleanly on that SIGTERM:
//! it removes its socket, its lock file and the temporary directory it created for them (its
//! configuration comes on its standard input, so nothing else is in that directory).

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::CliError;

fn err(what: &'static str) -> impl Fn(String) -> CliError {
    move |e| CliError::Input(format!("{what}: {e}"))
}

/// A command that runs this binary with `args`, and that the kernel ends (SIGTERM) if this
/// process dies first.
pub(crate) fn command<I, S>(args: I) -> Result<Command, CliError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let exe = std::env::current_exe().map_err(|e| err("this program's path")(e.to_string()))?;
    let mut cmd = Command::new(exe);
    cmd.args(args);
    let parent = rustix::process::getpid();
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe calls are allowed; it makes two system calls (prctl, getppid) and
    // allocates nothing (the error is a raw OS error, not a formatted one).
    unsafe {
        cmd.pre_exec(move || {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))
                .map_err(|e| std::io::Error::from_raw_os_error(e.raw_os_error()))?;
            // The parent may have died before the request took effect: then no signal comes.
            if rustix::process::getppid() != Some(parent) {
                return Err(std::io::Error::from_raw_os_error(rustix::io::Errno::SRCH.raw_os_error()));
            }
            Ok(())
        });
    }
    Ok(cmd)
}

/// A daemon child process (`doorbell serve`) on a socket of its own in a temporary directory
/// the daemon creates and removes; stopped (SIGTERM) on drop, and by the kernel if this
/// process dies first.
pub(crate) struct DaemonChild {
    pub(crate) child: Child,
    dir: PathBuf,
    pub(crate) socket: PathBuf,
}

impl DaemonChild {
    /// Starts `doorbell serve` with `config` (TOML, passed on its standard input) and waits
    /// until it answers.
    pub(crate) fn start_with(config: &str) -> Result<DaemonChild, CliError> {
        let dir = std::env::temp_dir().join(format!("doorbell-daemon-{}", std::process::id()));
        // Left by an earlier process of this pid that could not clean up (a reboot, say).
        let _ = std::fs::remove_dir_all(&dir);
        let socket = dir.join("doorbell.sock");
        let mut child = command(["serve", "--config", "-", "--socket"])?
            .arg(&socket)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| err("starting doorbell serve")(e.to_string()))?;
        let written = child.stdin.take().map(|mut s| s.write_all(config.as_bytes()));
        let d = DaemonChild { child, dir, socket };
        if let Some(Err(e)) = written {
            return Err(err("sending the daemon its configuration")(e.to_string()));
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut d = d;
        while wire::client::daemon_status(&d.socket).is_err() {
            if let Ok(Some(st)) = d.child.try_wait() {
                return Err(CliError::Check(format!("the daemon exited before it listened ({st})")));
            }
            if Instant::now() > deadline {
                return Err(CliError::Check("the daemon did not start listening".into()));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(d)
    }
}

impl Drop for DaemonChild {
    fn drop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let _ = self.child.wait();
        // The daemon removes it at its stop; this covers a daemon that failed to start.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
