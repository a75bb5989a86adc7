//! Thread scheduling classes: the one system call the background runtime needs
//! (`sched_setscheduler` on a thread), behind a safe function.
//!
//! rustix covers `setpriority` but not `sched_setscheduler`, and `SCHED_IDLE` is a policy, not
//! a nice value, so this module calls libc. A thread is named by its kernel thread id
//! ([`current_tid`]); Linux lets a process change the policy of any of its own threads.
//!
//! - [`SchedClass::Idle`]: `SCHED_IDLE`. The thread runs only when a CPU would otherwise be
//!   idle: below every `SCHED_OTHER` thread, even one at nice 19. Any thread may enter it.
//! - [`SchedClass::Low`]: `SCHED_OTHER` at nice 19, the lowest normal priority (what Mesa
//!   uses for its shader-cache threads): it still gets a small share under a saturated CPU.
//! - [`SchedClass::Normal`]: `SCHED_OTHER` at nice 0.
//!
//! Leaving `SCHED_IDLE`, or lowering nice, needs `CAP_SYS_NICE` or a large enough
//! `RLIMIT_NICE`; without them the call fails with `EPERM`, which is returned, never hidden.

use std::io;

/// A thread's scheduling class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SchedClass {
    /// `SCHED_IDLE`.
    Idle,
    /// `SCHED_OTHER`, nice 19.
    Low,
    /// `SCHED_OTHER`, nice 0.
    Normal,
}

/// The calling thread's kernel thread id.
pub fn current_tid() -> i32 {
    rustix::thread::gettid().as_raw_nonzero().get()
}

/// Puts thread `tid` (of this process) into `class`: the policy, then the nice value.
pub fn set_thread_class(tid: i32, class: SchedClass) -> io::Result<()> {
    let (policy, nice) = match class {
        SchedClass::Idle => (libc::SCHED_IDLE, None),
        SchedClass::Low => (libc::SCHED_OTHER, Some(19)),
        SchedClass::Normal => (libc::SCHED_OTHER, Some(0)),
    };
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `sched_setscheduler` reads the `sched_param` we pass by reference for the
    // duration of the call and nothing else; a bad `tid` is an error return (ESRCH), not UB.
    let r = unsafe { libc::sched_setscheduler(tid, policy, &param) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    if let Some(n) = nice {
        let pid = rustix::process::Pid::from_raw(tid);
        rustix::process::setpriority_process(pid, n)?;
    }
    Ok(())
}

/// The scheduling policy of thread `tid` (a `libc::SCHED_*` value).
pub fn thread_policy(tid: i32) -> io::Result<i32> {
    // SAFETY: `sched_getscheduler` takes a thread id by value and touches no memory of ours.
    let r = unsafe { libc::sched_getscheduler(tid) };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r) }
}

/// Whether `policy` (from [`thread_policy`]) is `SCHED_IDLE`.
pub fn is_idle_policy(policy: i32) -> bool {
    policy == libc::SCHED_IDLE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_enters_sched_idle_and_reports_it() {
        // On a thread of its own, so the test harness's thread keeps its class.
        std::thread::spawn(|| {
            let tid = current_tid();
            set_thread_class(tid, SchedClass::Idle).unwrap();
            assert!(is_idle_policy(thread_policy(tid).unwrap()));
            // Leaving idle needs CAP_SYS_NICE or RLIMIT_NICE; either it works or says why.
            match set_thread_class(tid, SchedClass::Low) {
                Ok(()) => assert!(!is_idle_policy(thread_policy(tid).unwrap())),
                Err(e) => assert_eq!(e.kind(), io::ErrorKind::PermissionDenied),
            }
        })
        .join()
        .unwrap();
    }
}
