//! The apply-event step: a scenario's timed event (kill, hang, D3 request, suspend) marked,
//! shown to the observer and applied, and a suspended context's resume.
//!
//! Invariants: a killed process's queues end (their outstanding work is no longer in flight,
//! their backlogs go); an event on a process already dead does nothing; a D3 request the
//! kernel refuses leaves the run going.

use abi::port::KernelPort;
use kernel::Termination;

use super::events::Ev;
use super::outcome::{MAX_MARKS, Mark, RunError};
use super::state::{Runner, with_world};
use crate::scenario::{Action, Plan};

impl Runner<'_, '_> {
    /// Scenario event `k`, due at `t`: marked, shown to the observer (the world as it was),
    /// applied.
    pub(super) fn timed(&mut self, k: usize, t: u64) -> Result<(), RunError> {
        let t0 = self.stack.t0;
        if self.acc.marks.len() < MAX_MARKS {
            self.acc.marks.push(scenario_mark(self.plan, &self.stack.group_first, k, t - t0));
        }
        if let Some(o) = self.observer.as_deref_mut() {
            let action = &self.plan.events[k].1;
            with_world(&self.stack, &self.clients, |world| o.scenario_event(t - t0, action, world));
        }
        self.apply_event(k, t)
    }

    /// Resumes the context of queue `i` (a suspend's end, due at `t`).
    pub(super) fn resume(&mut self, i: usize, t: u64) {
        if self.acc.marks.len() < MAX_MARKS {
            self.acc.marks.push(Mark {
                t: t - self.stack.t0,
                kind: "resume",
                queue: Some(i),
                text: "context resumed".into(),
            });
        }
        let c = &self.clients.procs[self.clients.qs[i].client];
        if c.alive {
            let _ = self.stack.sys.resume_context(c.port.process(), c.ctx.handle());
        }
    }

    fn apply_event(&mut self, k: usize, t: u64) -> Result<(), RunError> {
        let (sys, group_first) = (&self.stack.sys, &self.stack.group_first);
        let clients = &mut self.clients;
        match self.plan.events[k].1 {
            Action::Kill { group, queue } => {
                let i = group_first[group] + queue as usize;
                let c = clients.qs[i].client;
                if clients.procs[c].alive {
                    clients.procs[c].alive = false;
                    clients.procs[c].port.terminate(Termination::Abnormal);
                    for q in clients.qs.iter_mut().filter(|q| q.client == c) {
                        if !q.outstanding.is_empty() || !q.backlog.is_empty() {
                            q.res.ended.get_or_insert_with(|| "process killed".into());
                        }
                        if q.q.take().is_some() {
                            clients.in_flight -= q.outstanding.len() as u64;
                        }
                        q.backlog.clear();
                    }
                }
            }
            Action::Hang { group, queue } => {
                let i = group_first[group] + queue as usize;
                clients.qs[i].hang_next = true;
                // The hung kernel goes out with the queue's next submission; a queue that
                // submits only on completion gets one now.
                self.clock.events.push(t, Ev::Submit(i, Some(0)));
            }
            Action::D3 => {
                // Refused when work is outstanding (the kernel says why): the run goes on.
                let _ = sys.enter_d3();
            }
            Action::Suspend { group, queue, for_ns } => {
                let i = group_first[group] + queue as usize;
                let c = &clients.procs[clients.qs[i].client];
                if c.alive {
                    // A context already suspended by an earlier event stays so, until that
                    // event's resume (a scenario may overlap two suspends of one context).
                    match sys.suspend_context(c.port.process(), c.ctx.handle()) {
                        Err(abi::port::KernelError::InvalidArgument {
                            reason: abi::port::Invalid::AlreadySuspended,
                            ..
                        }) => return Ok(()),
                        r => r?,
                    }
                    if let Some(d) = for_ns {
                        self.clock.events.push(t + d, Ev::Resume(i));
                    }
                }
            }
        }
        Ok(())
    }
}

/// The marker of scenario event `k`, applied at `t`.
fn scenario_mark(plan: &Plan, group_first: &[usize], k: usize, t: u64) -> Mark {
    let at = |group: usize, queue: u32| Some(group_first[group] + queue as usize);
    let name = |group: usize, queue: u32| format!("{}[{queue}]", plan.groups[group].name);
    match plan.events[k].1 {
        Action::Kill { group, queue } => {
            Mark { t, kind: "kill", queue: at(group, queue), text: format!("{}'s process killed", name(group, queue)) }
        }
        Action::Hang { group, queue } => Mark {
            t,
            kind: "hang",
            queue: at(group, queue),
            text: format!("{}'s next kernel never ends", name(group, queue)),
        },
        Action::D3 => Mark { t, kind: "d3 request", queue: None, text: "D3 requested".into() },
        Action::Suspend { group, queue, .. } => Mark {
            t,
            kind: "suspend",
            queue: at(group, queue),
            text: format!("{}'s context suspended", name(group, queue)),
        },
    }
}
