//! The example kernels on a live system, for `doorbell bench compute` and `doorbell demo`.

use std::sync::Arc;

use abi::EngineKind;
use abi::port::KernelPort;
use kernel::{System, SystemConfig};
use runtime::verify::{Verified, VerifyError, verify_all};
use umd::{Device, QueueOptions, SubmissionKind};

use crate::CliError;

/// Each example's outcome on a user-mode and on a kernel-mode queue.
pub type Outcomes = Vec<(SubmissionKind, Vec<(&'static str, Result<Verified, VerifyError>)>)>;

/// Runs every example on both submission paths of `dev`'s compute engine.
pub fn run_all(dev: &Device, size: usize) -> Result<Outcomes, CliError> {
    let ctx = dev.create_context(dev.engine(EngineKind::Compute)?)?;
    let mut out = Vec::new();
    for opts in [QueueOptions::user_mode(), QueueOptions::kernel_mode()] {
        let mut q = ctx.create_queue(opts)?;
        out.push((opts.kind, verify_all(dev, &mut q, size)));
    }
    Ok(out)
}

/// How many examples matched their references on both paths, and how many there are.
pub fn verify_all_live() -> Result<(usize, usize), CliError> {
    let sys = System::live(SystemConfig::default())?;
    let port: Arc<dyn KernelPort> = sys.open_process()?;
    let outcomes = run_all(&Device::open(port)?, 4096)?;
    let total = program::examples::ALL.len();
    let verified = program::examples::ALL
        .iter()
        .filter(|ex| outcomes.iter().all(|(_, rs)| rs.iter().any(|(n, r)| *n == ex.name && r.is_ok())))
        .count();
    for (kind, rs) in &outcomes {
        for (name, r) in rs {
            if let Err(e) = r {
                eprintln!("  ! {name} on the {kind:?} path: {e}");
            }
        }
    }
    Ok((verified, total))
}
