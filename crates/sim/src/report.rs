//! Plots and report.html.
use std::path::Path;
/// x
pub fn write_run_report(
    _p: &crate::Plan,
    _o: &crate::Outcome,
    _s: &serde_json::Value,
    _d: &Path,
) -> Result<(), crate::SimError> {
    Ok(())
}
