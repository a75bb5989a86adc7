//! Spec 004's two application workflows, as functions: what a benchmark and an analysis tool
//! (PIX) do with `SetBackgroundProcessingMode`. `doorbell bench pgo` and `doorbell demo` run
//! them; `tests/pgo.rs` spells them out step by step as the spec writes them.

use std::time::Duration;

use crate::Device;
use crate::background::{CompletionEvent, MeasurementsAction, Mode, ModeError};

/// How a workflow ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Converged {
    /// Passes run.
    pub passes: u32,
    /// Whether `further_measurements_desired` became false (else the pass limit ended it).
    pub steady: bool,
}

/// The benchmark that primes the optimization state: `AllowIntrusiveMeasurements` with
/// `DiscardPrevious`, then `render` and `AllowIntrusiveMeasurements` + `KeepAll` until
/// `further_measurements_desired` is false (or `max_passes`). Background compiles run as the
/// specializer queues them; the real benchmark follows.
pub fn prime<E: From<ModeError>>(
    dev: &Device,
    max_passes: u32,
    mut render: impl FnMut() -> Result<(), E>,
) -> Result<Converged, E> {
    dev.set_background_processing_mode(
        Mode::AllowIntrusiveMeasurements,
        MeasurementsAction::DiscardPrevious,
        None,
        None,
    )?;
    let mut further = true;
    let mut passes = 0;
    while further && passes < max_passes {
        render()?;
        passes += 1;
        dev.set_background_processing_mode(
            Mode::AllowIntrusiveMeasurements,
            MeasurementsAction::KeepAll,
            None,
            Some(&mut further),
        )?;
    }
    Ok(Converged { passes, steady: !further })
}

/// The analysis tool's single-frame loop (developer mode): train with
/// `AllowIntrusiveMeasurements` (`DiscardPrevious` the first time), `playback` the frame, lock
/// everything down with `DisableProfilingBySystem` + `CommitResultsHighPriority` and a
/// completion event, wait for it; until no further measurements are desired or
/// `max_passes`. Afterwards the device stays in `DisableProfilingBySystem`, for stable A/B
/// replays with the committed variants.
pub fn train_and_lock<E: From<ModeError> + From<WaitTimedOut>>(
    dev: &Device,
    max_passes: u32,
    event: &CompletionEvent,
    wait: Duration,
    mut playback: impl FnMut() -> Result<(), E>,
) -> Result<Converged, E> {
    let mut want_more = true;
    let mut passes = 0;
    while want_more && passes < max_passes {
        let action = if passes == 0 { MeasurementsAction::DiscardPrevious } else { MeasurementsAction::KeepAll };
        dev.set_background_processing_mode(Mode::AllowIntrusiveMeasurements, action, None, None)?;
        playback()?;
        dev.set_background_processing_mode(
            Mode::DisableProfilingBySystem,
            MeasurementsAction::CommitResultsHighPriority,
            Some(event),
            Some(&mut want_more),
        )?;
        if !event.wait(wait) {
            return Err(WaitTimedOut { waited: wait }.into());
        }
        passes += 1;
    }
    Ok(Converged { passes, steady: !want_more })
}

/// A commit's completion event was not signalled in time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the commit's completion event was not signalled within {waited:?}")]
pub struct WaitTimedOut {
    /// How long it waited.
    pub waited: Duration,
}
