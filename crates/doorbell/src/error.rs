//! The CLI's one error type, [`CliError`]: what every subcommand returns and `main` prints
//! as `doorbell: error: …` before exiting non-zero. Failures of the crates below (the UMD,
//! the kernel, the daemon connection, shared memory, the runtime) convert into it with `?`;
//! the CLI's own refusals name the flag or file and the value ([`CliError::Input`]).
//!
//! It is in a module of its own, below every subcommand module, so that the crate root only
//! dispatches: a root that defined it would be in an import circle with every subcommand.

/// Errors the CLI reports.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The UMD failed.
    #[error(transparent)]
    Umd(#[from] umd::UmdError),
    /// The kernel failed.
    #[error(transparent)]
    Kernel(#[from] abi::port::KernelError),
    /// The daemon could not be reached or refused the connection.
    #[error(transparent)]
    Connect(#[from] wire::ConnectError),
    /// A background processing mode change was refused.
    #[error(transparent)]
    Mode(#[from] runtime::background::ModeError),
    /// A background commit's completion event did not come.
    #[error(transparent)]
    CommitWait(#[from] runtime::pgo::workflow::WaitTimedOut),
    /// Shared memory failed.
    #[error(transparent)]
    Shm(#[from] shm::ShmError),
    /// A check failed.
    #[error("check failed: {0}")]
    Check(String),
    /// Bad input from the command line or a file.
    #[error("{0}")]
    Input(String),
    /// A run passed its `--timeout`.
    #[error("timeout: {0}")]
    TimedOut(String),
    /// The hardware asked for is not there (`--device cuda` without a GPU or its driver).
    #[error("device: {0}")]
    Device(String),
}
