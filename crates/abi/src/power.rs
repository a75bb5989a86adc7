//! Engine power states and the transitions the firmware asks for (spec 000 "Engine F-state
//! transitions").
//!
//! Shared vocabulary: the device reports them, the kernel-mode driver passes them through its
//! DDIs, the OS decides on them and its trace records them.

/// Engine power states.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PowerState {
    /// Active: doorbells are watched.
    F0,
    /// Idle, powered down: doorbells are not watched.
    F1,
}

/// `DXGK_ENGINE_STATE` transitions the firmware reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EngineState {
    /// The engine has been idle for the idle period and asks to go to F1.
    TransitionToF1,
}
