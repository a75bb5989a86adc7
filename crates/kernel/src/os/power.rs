//! The device's power state ([`Power`]): whether it is in D3, the contexts the D3 entry
//! suspended, and the D3 idle timer (spec 000 "Engine D-state transitions": D0 to D3 "after a
//! longer idle period").
//!
//! The sequences that cross concerns — D0 → D3 (contexts suspended, doorbells disconnected,
//! rings evicted), the F1 request, a connect out of D3 — are the OS's
//! ([`super::calls`]'s `power`); this owns what they read and change.
//!
//! Invariant: `d3` is true exactly between a completed D3 entry and the next power-up, and
//! `suspended` holds the contexts the D3 entry suspended (and only those), or whose resume was
//! asked for during D3.

use std::time::Duration;

use abi::port::{KernelError, MemoryDomain};
use abi::{AllocationHandle, ContextHandle, EngineId, PowerState, ProcessId, Time};

use super::shared::Shared;
use super::timers::{Timer, TimerTable};
use crate::ddi::Kmd;
use crate::trace::Event;

/// The device's D-state and the D3 idle timer.
#[derive(Default)]
pub(super) struct Power {
    /// The device is in D3 (powered down).
    pub(super) d3: bool,
    /// Contexts the D3 entry suspended (resumed on the way back to D0).
    pub(super) suspended: Vec<(ProcessId, ContextHandle)>,
    /// How long every engine must stay in F1 before the device enters D3 by itself (`None`:
    /// only on request).
    d3_idle: Option<Duration>,
    /// Since when every engine has been in F1 (while the idle timer runs).
    all_f1_since: Option<Time>,
}

impl Power {
    /// Sets the D3 idle period (`None`: D3 only on request).
    pub(super) fn set_d3_idle(&mut self, period: Option<Duration>, timers: &mut TimerTable) {
        self.d3_idle = period;
        self.arm(timers);
    }

    /// The device reports whether every engine is in F1 at `now`: the idle timer runs while
    /// they all are.
    pub(super) fn handle_device_idle(&mut self, all_f1: bool, now: Time, timers: &mut TimerTable) {
        if !all_f1 {
            self.all_f1_since = None;
        } else if self.d3_idle.is_some() && self.all_f1_since.is_none() {
            self.all_f1_since = Some(now);
        }
        self.arm(timers);
    }

    /// The idle timer fired: it starts over (whether D3 is entered or refused).
    pub(super) fn idle_timer_fired(&mut self, timers: &mut TimerTable) {
        self.all_f1_since = None;
        self.arm(timers);
    }

    /// [`Timer::D3Idle`]: the idle period after every engine entered F1.
    fn arm(&self, timers: &mut TimerTable) {
        timers.set(Timer::D3Idle, self.d3_idle.and_then(|period| self.all_f1_since.map(|t| t.plus(period))));
    }

    /// Context `c` of `pid` is to be resumed on the return to D0 (the D3 entry suspended it,
    /// or a resume was asked for during D3).
    pub(super) fn resume_at_d0(&mut self, pid: ProcessId, c: ContextHandle) {
        if !self.suspended.contains(&(pid, c)) {
            self.suspended.push((pid, c));
        }
    }

    /// D0 → D3, step 3: ring allocations leave local memory (contents preserved), now that
    /// no queue is scheduled.
    pub(super) fn evict_rings(cx: &mut Shared, pids: &[ProcessId], now: Time) -> Result<(), KernelError> {
        for &pid in pids {
            let p = cx.proc(pid)?;
            let rings: Vec<AllocationHandle> = p
                .allocations
                .iter()
                .filter(|(_, a)| a.domain == MemoryDomain::Local && !a.pins.is_empty())
                .map(|(h, _)| h)
                .collect();
            for a in rings {
                let obj = cx.proc(pid)?.allocations.get_mut(a)?;
                obj.evicted = true;
                obj.domain = MemoryDomain::System;
                cx.trace.push(now, Event::Residency { allocation: a, resident: false });
            }
        }
        Ok(())
    }

    /// The first half of D3 → D0: the D0 transition, then residency restored. The contexts
    /// are resumed after the doorbell connection (the spec's order). Returns whether the
    /// device was in D3.
    pub(super) fn power_up(&mut self, cx: &mut Shared, now: Time) -> Result<bool, KernelError> {
        if !self.d3 {
            return Ok(false);
        }
        self.d3 = false;
        cx.trace.push(now, Event::DevicePower { d3: false });
        let pids: Vec<ProcessId> = cx.processes.keys().copied().collect();
        for pid in pids {
            let evicted: Vec<AllocationHandle> =
                cx.proc(pid)?.allocations.iter().filter(|(_, a)| a.evicted).map(|(h, _)| h).collect();
            for a in evicted {
                let obj = cx.proc(pid)?.allocations.get_mut(a)?;
                obj.evicted = false;
                obj.domain = MemoryDomain::Local;
                cx.trace.push(now, Event::Residency { allocation: a, resident: true });
            }
        }
        Ok(true)
    }
}

/// An engine in F1 goes back to F0 (spec 000 "Engine F-state transitions"), logged as the DDI
/// call and the state the engine reached.
pub(super) fn wake_engine(cx: &mut Shared, engine: EngineId, now: Time) -> Result<(), KernelError> {
    if cx.ddi.power(engine) == PowerState::F1 {
        let st = cx.ddi.set_power(engine, PowerState::F0, now)?;
        cx.trace.push(now, Event::Power { engine, state: st });
    }
    Ok(())
}
