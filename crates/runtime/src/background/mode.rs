//! The application's controls (spec 004): [`Mode`], [`MeasurementsAction`], and the refusals
//! of [`ModeRequest::new`] ([`ModeError`]).
//!
//! A mode says what PGO may do from now on; an action says what to do with what was measured
//! so far. Both arrive as integers across an API boundary, so each has a `TryFrom<u32>` that
//! names the bad value. Three settings are for developers only (the spec's rule, so no
//! shipped game can turn PGO off or hog the CPU with it): `DisableBackgroundWork`,
//! `DisableProfilingBySystem` and `CommitResultsHighPriority`. A completion event goes only
//! with one of the two commits. [`ModeRequest::new`] checks all of it before anything changes.

use core::fmt;

/// `D3D12_BACKGROUND_PROCESSING_MODE`: what background processing may do from now on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[repr(u32)]
pub enum Mode {
    /// The default: cheap, sampled measurement and low-priority background compiles.
    #[default]
    Allowed = 0,
    /// Measure everything (per-argument histograms on every dispatch): the work now running is
    /// for training, glitches do not matter.
    AllowIntrusiveMeasurements = 1,
    /// No background task runs that was queued after this took effect (those queued before
    /// finish); queuing one calls its cancel at once. Developer mode only.
    DisableBackgroundWork = 2,
    /// [`Mode::DisableBackgroundWork`], and change nothing that could perturb timing: no
    /// measurement, no new variant selected. Developer mode only.
    DisableProfilingBySystem = 3,
}

/// `D3D12_MEASUREMENTS_ACTION`: what to do with the measurements made so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[repr(u32)]
pub enum MeasurementsAction {
    /// Nothing special: keep measuring.
    #[default]
    KeepAll = 0,
    /// What was seen is the whole workload: act on it now (scaling partial histograms up), and
    /// signal the completion event once every task queued by the time the call returns has
    /// finished.
    CommitResults = 1,
    /// [`MeasurementsAction::CommitResults`], run with more threads above idle priority until
    /// the commit's tasks finish. Developer mode only.
    CommitResultsHighPriority = 2,
    /// The workload changed: forget what was measured.
    DiscardPrevious = 3,
}

impl Mode {
    /// Every mode, in code order.
    pub const ALL: [Mode; 4] =
        [Mode::Allowed, Mode::AllowIntrusiveMeasurements, Mode::DisableBackgroundWork, Mode::DisableProfilingBySystem];
    /// Whether only a developer-mode device may set it.
    pub const fn developer_only(self) -> bool {
        matches!(self, Mode::DisableBackgroundWork | Mode::DisableProfilingBySystem)
    }
    /// Whether newly queued tasks are cancelled in this mode.
    pub const fn disables_work(self) -> bool {
        self.developer_only()
    }
    /// Whether the UMD may measure dispatches (and select new variants) in this mode.
    pub const fn measures(self) -> bool {
        !matches!(self, Mode::DisableProfilingBySystem)
    }
    /// The D3D12 name.
    pub const fn d3d12_name(self) -> &'static str {
        match self {
            Mode::Allowed => "D3D12_BACKGROUND_PROCESSING_MODE_ALLOWED",
            Mode::AllowIntrusiveMeasurements => "D3D12_BACKGROUND_PROCESSING_MODE_ALLOW_INTRUSIVE_MEASUREMENTS",
            Mode::DisableBackgroundWork => "D3D12_BACKGROUND_PROCESSING_MODE_DISABLE_BACKGROUND_WORK",
            Mode::DisableProfilingBySystem => "D3D12_BACKGROUND_PROCESSING_MODE_DISABLE_PROFILING_BY_SYSTEM",
        }
    }
}

impl MeasurementsAction {
    /// Every action, in code order.
    pub const ALL: [MeasurementsAction; 4] = [
        MeasurementsAction::KeepAll,
        MeasurementsAction::CommitResults,
        MeasurementsAction::CommitResultsHighPriority,
        MeasurementsAction::DiscardPrevious,
    ];
    /// Whether it is one of the two commits (the only actions that take a completion event).
    pub const fn is_commit(self) -> bool {
        matches!(self, MeasurementsAction::CommitResults | MeasurementsAction::CommitResultsHighPriority)
    }
    /// Whether only a developer-mode device may ask for it.
    pub const fn developer_only(self) -> bool {
        matches!(self, MeasurementsAction::CommitResultsHighPriority)
    }
    /// The D3D12 name.
    pub const fn d3d12_name(self) -> &'static str {
        match self {
            MeasurementsAction::KeepAll => "D3D12_MEASUREMENTS_ACTION_KEEP_ALL",
            MeasurementsAction::CommitResults => "D3D12_MEASUREMENTS_ACTION_COMMIT_RESULTS",
            MeasurementsAction::CommitResultsHighPriority => "D3D12_MEASUREMENTS_ACTION_COMMIT_RESULTS_HIGH_PRIORITY",
            MeasurementsAction::DiscardPrevious => "D3D12_MEASUREMENTS_ACTION_DISCARD_PREVIOUS",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl fmt::Display for MeasurementsAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl TryFrom<u32> for Mode {
    type Error = ModeError;
    fn try_from(v: u32) -> Result<Mode, ModeError> {
        Mode::ALL.get(v as usize).copied().ok_or(ModeError::BadMode { value: v })
    }
}

impl TryFrom<u32> for MeasurementsAction {
    type Error = ModeError;
    fn try_from(v: u32) -> Result<MeasurementsAction, ModeError> {
        MeasurementsAction::ALL.get(v as usize).copied().ok_or(ModeError::BadAction { value: v })
    }
}

/// Why a mode change was refused. Nothing changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ModeError {
    /// `mode` is not one of the four modes.
    #[error("mode = {value} is not a background processing mode (0 ..= 3)")]
    BadMode {
        /// The integer given.
        value: u32,
    },
    /// `action` is not one of the four measurement actions.
    #[error("action = {value} is not a measurements action (0 ..= 3)")]
    BadAction {
        /// The integer given.
        value: u32,
    },
    /// A completion event with an action that never signals one.
    #[error(
        "completion_event is given with action = {action}: only CommitResults and CommitResultsHighPriority take one"
    )]
    EventWithoutCommit {
        /// The action.
        action: MeasurementsAction,
    },
    /// A developer-only mode on a device not created in developer mode.
    #[error("mode = {mode} needs a device created in developer mode")]
    ModeNeedsDeveloperMode {
        /// The mode.
        mode: Mode,
    },
    /// A developer-only action on a device not created in developer mode.
    #[error("action = {action} needs a device created in developer mode")]
    ActionNeedsDeveloperMode {
        /// The action.
        action: MeasurementsAction,
    },
}

/// A checked mode change: a mode, an action, and whether a completion event goes with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModeRequest {
    /// The new mode.
    pub mode: Mode,
    /// What to do with the measurements so far.
    pub action: MeasurementsAction,
    /// Whether the caller gave a completion event.
    pub with_event: bool,
}

impl ModeRequest {
    /// Checks a mode change against the spec's rules: a completion event only with a commit,
    /// and the developer-only settings only on a developer-mode device.
    pub fn new(
        mode: Mode,
        action: MeasurementsAction,
        with_event: bool,
        developer_mode: bool,
    ) -> Result<ModeRequest, ModeError> {
        if with_event && !action.is_commit() {
            return Err(ModeError::EventWithoutCommit { action });
        }
        if !developer_mode && mode.developer_only() {
            return Err(ModeError::ModeNeedsDeveloperMode { mode });
        }
        if !developer_mode && action.developer_only() {
            return Err(ModeError::ActionNeedsDeveloperMode { action });
        }
        Ok(ModeRequest { mode, action, with_event })
    }

    /// [`ModeRequest::new`] from raw integers (an API boundary).
    pub fn from_raw(mode: u32, action: u32, with_event: bool, developer_mode: bool) -> Result<ModeRequest, ModeError> {
        ModeRequest::new(Mode::try_from(mode)?, MeasurementsAction::try_from(action)?, with_event, developer_mode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_out_of_range_are_named() {
        assert_eq!(Mode::try_from(4), Err(ModeError::BadMode { value: 4 }));
        assert_eq!(MeasurementsAction::try_from(9), Err(ModeError::BadAction { value: 9 }));
        assert_eq!(ModeRequest::from_raw(7, 0, false, true), Err(ModeError::BadMode { value: 7 }));
        assert_eq!(ModeRequest::from_raw(0, 4, false, true), Err(ModeError::BadAction { value: 4 }));
        assert_eq!(
            ModeError::BadMode { value: 4 }.to_string(),
            "mode = 4 is not a background processing mode (0 ..= 3)"
        );
        for (i, m) in Mode::ALL.iter().enumerate() {
            assert_eq!(Mode::try_from(i as u32), Ok(*m));
            assert_eq!(*m as u32, i as u32);
        }
        for (i, a) in MeasurementsAction::ALL.iter().enumerate() {
            assert_eq!(MeasurementsAction::try_from(i as u32), Ok(*a));
        }
    }

    #[test]
    fn event_only_with_a_commit() {
        for a in MeasurementsAction::ALL {
            let r = ModeRequest::new(Mode::Allowed, a, true, true);
            if a.is_commit() {
                assert!(r.is_ok(), "{a}");
            } else {
                assert_eq!(r, Err(ModeError::EventWithoutCommit { action: a }));
            }
        }
    }

    #[test]
    fn developer_only_settings() {
        for m in Mode::ALL {
            for a in MeasurementsAction::ALL {
                let retail = ModeRequest::new(m, a, false, false);
                let dev = ModeRequest::new(m, a, false, true);
                assert!(dev.is_ok());
                match (m.developer_only(), a.developer_only()) {
                    (true, _) => assert_eq!(retail, Err(ModeError::ModeNeedsDeveloperMode { mode: m })),
                    (false, true) => assert_eq!(retail, Err(ModeError::ActionNeedsDeveloperMode { action: a })),
                    (false, false) => assert!(retail.is_ok()),
                }
            }
        }
        // The spec's list, spelled out.
        assert!(Mode::DisableBackgroundWork.developer_only());
        assert!(Mode::DisableProfilingBySystem.developer_only());
        assert!(MeasurementsAction::CommitResultsHighPriority.developer_only());
        assert!(!Mode::AllowIntrusiveMeasurements.developer_only());
        assert!(!MeasurementsAction::CommitResults.developer_only());
        assert!(!MeasurementsAction::DiscardPrevious.developer_only());
    }
}
