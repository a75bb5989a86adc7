//! Rules the device breaks on purpose, so that a checker can show it catches each break (the
//! swarm's broken twins, issue 27; `sim::swarm::check::Inject`).
//!
//! Only [`crate::Gpu::break_deliberately`] arms one, and every real device keeps every rule:
//! nothing else in the device knows them. Each twin is one flag read where its rule is kept.

use super::Firmware;

/// A rule of the spec the device breaks on purpose ([`crate::Gpu::break_deliberately`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BrokenTwin {
    /// An engine asks for F1 once its idle period has passed since it last ran, and enters it
    /// when the kernel asks, whatever its queues hold (a queue asleep on a `WAIT`, one waiting
    /// for a slot), where an engine may enter F1 only when every queue on its run list is idle
    /// (spec 000, "Engine F-state transitions").
    F1WithWork,
    /// Every signal of a native fence raises its interrupt, where spec 002 raises it only when
    /// the value written passes the MonitoredValue (a waiter's value is reached).
    SpuriousFenceInterrupts,
}

impl Firmware {
    /// Breaks rule `b` from now on.
    pub(crate) fn break_deliberately(&mut self, b: BrokenTwin) {
        match b {
            BrokenTwin::F1WithWork => self.engines.iter_mut().for_each(|e| e.power.broken = true),
            BrokenTwin::SpuriousFenceInterrupts => self.fences.always_raise = true,
        }
    }

    /// Starts (or stops, dropping what was kept) the record of every native-fence signal
    /// ([`super::FenceSignal`]).
    pub(crate) fn record_fence_signals(&mut self, on: bool) {
        self.fences.signals = on.then(Vec::new);
    }

    /// Moves the fence signals recorded since the last call into `out`.
    pub(crate) fn take_fence_signals(&mut self, out: &mut Vec<super::FenceSignal>) {
        if let Some(s) = self.fences.signals.as_mut() {
            out.append(s);
        }
    }
}
