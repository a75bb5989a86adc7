//! The clients' submissions: an open loop's arrivals, a submission due or a backlog let go
//! (a user-mode queue rings its doorbell; a kernel-mode one enters the kernel, and its
//! command buffer lands when the call returns), each command buffer encoded and submitted
//! through `umd`, and the random draws its workload makes.
//!
//! Invariants: a queue never has more than its `cap` outstanding (the rest waits in its
//! backlog, in arrival order); a client inside a kernel call submits nothing until it
//! returns; a queue that refuses a submission ends (its backlog goes) and submits no more.

use abi::port::KernelPort;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use umd::Queue;

use super::advance::ring;
use super::events::Ev;
use super::outcome::RunError;
use super::state::{Client, Clients, Encoded, Runner, SimQ};
use crate::observe::WaitLook;
use crate::scenario::{Duration as Dist, Load, Plan};

/// A hung kernel: a synthetic dispatch this long (ns) never ends within any run.
pub const HUNG_NS: u64 = u64::MAX / 4;

impl Runner<'_, '_> {
    /// The next arrival of open-loop queue `i`, due at `t`: its command buffers join the
    /// backlog, which drains now.
    pub(super) fn arrival(&mut self, i: usize, t: u64) {
        if self.clock.stopped {
            return;
        }
        let q = &mut self.clients.qs[i];
        let g = &self.plan.groups[q.group];
        let (n, next) = match &g.load {
            Load::Periodic(p) => (1, t + p),
            Load::Poisson(rate) => (1, t + exp_ns(&mut q.rng, 1e9 / rate).max(1)),
            Load::Bursts { size, period } => (*size, t + period),
            _ => (0, u64::MAX),
        };
        for _ in 0..n {
            q.backlog.push_back((t, None));
        }
        self.clock.events.push(next, Ev::Arrival(i));
        self.clock.events.push(t, Ev::Drain(i));
    }

    /// A submission of queue `i` due at `t` (`due`: a closed loop's or a trace row's, with its
    /// synthetic duration; `None`: the backlog drains), at `now`. It joins the backlog's end:
    /// it goes now if the backlog is empty and the ring has room (usually), without passing
    /// through it.
    #[inline(always)]
    pub(super) fn submit_due(
        &mut self,
        i: usize,
        mut due: Option<(u64, Option<u64>)>,
        now: u64,
    ) -> Result<(), RunError> {
        if self.clock.stopped {
            return Ok(());
        }
        let plan = self.plan;
        let q = &mut self.clients.qs[i];
        // A client inside a kernel call acts when the call returns (one retry is scheduled per
        // call); a kernel-mode submission is a kernel call, which lands when the call returns.
        let in_call = q.busy_until > now;
        let kernel_mode = plan.kernel_call > 0 && plan.groups[q.group].kernel_mode;
        if (in_call || kernel_mode || !q.backlog.is_empty())
            && let Some(d) = due.take()
        {
            q.backlog.push_back(d);
        }
        if in_call {
            return Ok(());
        }
        if kernel_mode {
            if q.outstanding.len() < q.cap && !q.backlog.is_empty() {
                q.busy_until = now + plan.kernel_call;
                self.clock.events.push(now + plan.kernel_call, Ev::Enter(i));
            }
            return Ok(());
        }
        // Submit from the backlog while the ring has room and the client is free.
        while self.clients.qs[i].outstanding.len() < self.clients.qs[i].cap
            && !self.clock.stopped
            && self.clients.qs[i].busy_until <= now
        {
            let Some((intended, size)) = due.take().or_else(|| self.clients.qs[i].backlog.pop_front()) else {
                break;
            };
            // Its kernel calls take time (when they do): a reconnect before the ring (which is
            // heard after it), the notification after.
            let call = plan.kernel_call;
            let reconnects = if call > 0 { self.clients.qs[i].q.as_ref().map_or(0, Queue::reconnects) } else { 0 };
            let r = submit_one(plan, &mut self.clients, i, intended, size);
            let q = &mut self.clients.qs[i];
            let mut ring_at = now;
            q.busy_until = now;
            if call > 0 {
                let reconnected = q.q.as_ref().map_or(0, Queue::reconnects) - reconnects;
                let notified = plan.system.notify_on_submit && r.is_some();
                ring_at += reconnected * call;
                q.busy_until = ring_at + notified as u64 * call;
            }
            let heard = ring_at + self.bells.latency;
            ring(&mut self.bells, now, heard, self.stack.fw_of[i]);
            let Some(signals) = r else { break };
            self.accepted(i, signals, now)?;
        }
        let q = &mut self.clients.qs[i];
        // Not submitted (the ring is full): it heads the backlog.
        if let Some(d) = due {
            q.backlog.push_back(d);
        }
        if q.busy_until > now {
            self.clock.events.push(q.busy_until, Ev::Drain(i));
        }
        Ok(())
    }

    /// Queue `i`'s kernel-mode submission call returns at `now`: the oldest command buffer of
    /// its backlog reaches the kernel, and the next one, if any, is the next call.
    pub(super) fn enter(&mut self, i: usize, now: u64) -> Result<(), RunError> {
        let plan = self.plan;
        if self.clock.stopped || self.clients.qs[i].outstanding.len() >= self.clients.qs[i].cap {
            return Ok(());
        }
        let Some((intended, size)) = self.clients.qs[i].backlog.pop_front() else { return Ok(()) };
        let r = submit_one(plan, &mut self.clients, i, intended, size);
        let heard = now + self.bells.latency;
        ring(&mut self.bells, now, heard, self.stack.fw_of[i]);
        let Some(signals) = r else { return Ok(()) };
        self.accepted(i, signals, now)?;
        let q = &mut self.clients.qs[i];
        if !self.clock.stopped && !q.backlog.is_empty() && q.outstanding.len() < q.cap {
            // The next command buffer is the next call.
            q.busy_until = now + plan.kernel_call;
            self.clock.events.push(now + plan.kernel_call, Ev::Enter(i));
        }
        Ok(())
    }

    /// After a submission the ring of queue `i` took at `now` ([`submit_one`]), with
    /// `signals` fence signals: the observer sees it, a CPU waiter starts waiting for the
    /// signal of what was submitted, it is in flight, and the tally counts it (which may end
    /// submission).
    #[inline(always)]
    fn accepted(&mut self, i: usize, signals: u64, now: u64) -> Result<(), RunError> {
        let t0 = self.stack.t0;
        let Clients { procs, qs, tally, in_flight, .. } = &mut self.clients;
        let q = &mut qs[i];
        if let Some(o) = self.observer.as_deref_mut() {
            o.submitted(i, q.outstanding.back().map_or(0, |c| c.0), now - t0);
        }
        if self.plan.groups[q.group].cpu_waiter {
            begin_wait(&self.stack.sys, procs, q)?;
            if let (Some(o), Some(look)) = (self.observer.as_deref_mut(), q.waits.back().map(|w| look(i, q, w, None))) {
                o.cpu_wait(now - t0, &look);
            }
        }
        *in_flight += 1;
        if tally.count(signals, self.plan) {
            self.clock.stop(now);
        }
        Ok(())
    }
}

/// Submits one command buffer on queue `i`; returns the fence signals it carries, or `None`
/// if nothing was submitted: the queue is gone, or it refused the submission, which ends it
/// (lost, its process killed: its backlog goes).
fn submit_one(plan: &Plan, clients: &mut Clients, i: usize, intended: u64, size: Option<u64>) -> Option<u64> {
    let Clients { procs, qs, cb, .. } = clients;
    match encode_and_submit(plan, qs, procs, i, intended, size, cb) {
        Ok(r) => r,
        Err(e) => {
            let q = &mut qs[i];
            q.res.ended.get_or_insert_with(|| e.to_string());
            q.backlog.clear();
            None
        }
    }
}

/// [`submit_one`] until the queue refuses.
#[inline]
fn encode_and_submit(
    plan: &Plan,
    qs: &mut [SimQ],
    clients: &[Client],
    i: usize,
    intended: u64,
    size: Option<u64>,
    encoded: &mut Encoded,
) -> Result<Option<u64>, umd::UmdError> {
    let g = &plan.groups[qs[i].group];
    if qs[i].q.is_none() || !clients[qs[i].client].alive {
        return Ok(None);
    }
    let dur = match (size, g.synthetic) {
        (Some(ns), _) => Some(ns),
        (None, Some(d)) => Some(sample(&mut qs[i].rng, d)),
        (None, None) => None,
    };
    // A command buffer that names nothing of its queue (no scratch memory, fences or hang)
    // is the same for every queue of its group with the same synthetic duration: the last
    // one encoded is submitted again.
    let plain = g.write_data == 0
        && g.fill_bytes == 0
        && g.copy_bytes == 0
        && qs[i].upstream.is_none()
        && qs[i].signal.is_none()
        && !qs[i].hang_next;
    let key = plain.then_some((qs[i].group, dur));
    if key.is_some() && encoded.key == key {
        let np = 1 + dur.is_some() as u32;
        let q = qs[i].q.as_mut().expect("checked above");
        let v = published(q.submit(&encoded.cb), q, &mut qs[i].res.ended)?;
        qs[i].outstanding.push_back((v, intended, np));
        qs[i].res.submitted += 1;
        return Ok(Some(0));
    }
    encoded.key = None;
    let cb = &mut encoded.cb;
    cb.clear();
    let mut np = 1u32; // the progress fence
    if let Some((them, f)) = &qs[i].upstream {
        let v = qs[*them].q.as_ref().map_or(0, Queue::last_submitted);
        if v > 0 {
            cb.wait_fence(f, v);
            np += 1;
        }
    }
    if let Some(buf) = &clients[qs[i].client].scratch {
        let slot = buf.va() + 8 * (qs[i].index as u64 % (buf.len() / 8).max(1));
        for k in 0..g.write_data {
            cb.write_u32(slot, k.wrapping_add(qs[i].res.submitted as u32));
            np += 1;
        }
        let base = buf.va() + (buf.len() - g.fill_bytes - 2 * g.copy_bytes) / 8 * 8;
        let base = base.min(buf.va() + buf.len());
        if g.fill_bytes > 0 {
            cb.fill(base, g.fill_bytes, 0x5a5a_5a5a);
            np += 1;
        }
        if g.copy_bytes > 0 {
            let src = base + g.fill_bytes;
            cb.copy(src, src + g.copy_bytes, g.copy_bytes);
            np += 1;
        }
    }
    if let Some(ns) = dur {
        cb.synthetic(ns);
        np += 1;
    }
    if qs[i].hang_next {
        qs[i].hang_next = false;
        cb.synthetic(HUNG_NS);
        np += 1;
    }
    let mut signals = 0;
    let next_value = qs[i].q.as_ref().map_or(0, Queue::last_submitted) + 1;
    if let Some(f) = &qs[i].signal {
        cb.signal_fence(f, next_value);
        np += 1;
        signals += 1;
    }
    let q = qs[i].q.as_mut().expect("checked above");
    let v = published(q.submit(cb), q, &mut qs[i].res.ended)?;
    encoded.key = key;
    debug_assert_eq!(v, next_value);
    qs[i].outstanding.push_back((v, intended, np));
    qs[i].res.submitted += 1;
    Ok(Some(signals))
}

/// A submission's result, where a command buffer published but not rung
/// ([`umd::UmdError::NotRung`]: its doorbell's reconnect failed) counts as submitted — it runs
/// once the doorbell is connected and rung — and the client rings again at once
/// ([`Queue::ring`], which reconnects); should that fail too, `ended` says so (the published
/// work is still accounted, and the next submission tries again).
#[inline(always)]
fn published(r: Result<u64, umd::UmdError>, q: &mut Queue, ended: &mut Option<String>) -> Result<u64, umd::UmdError> {
    match r {
        Ok(v) => Ok(v),
        Err(e) => published_not_rung(e, q, ended),
    }
}

/// [`published`]'s error path, off the hot one.
#[cold]
#[inline(never)]
fn published_not_rung(e: umd::UmdError, q: &mut Queue, ended: &mut Option<String>) -> Result<u64, umd::UmdError> {
    let umd::UmdError::NotRung { value, .. } = e else { return Err(e) };
    if let Err(e) = q.ring() {
        ended.get_or_insert_with(|| format!("doorbell not reconnected after command buffer {value}: {e}"));
    }
    Ok(value)
}

/// Starts a CPU wait for the fence signal of queue `q`'s last command buffer (none if the
/// signal already happened, or its device is lost).
fn begin_wait(sys: &kernel::System, clients: &[Client], q: &mut SimQ) -> Result<(), RunError> {
    let (Some(f), Some(queue)) = (&q.signal, &q.q) else { return Ok(()) };
    let v = queue.last_submitted();
    let pid = clients[q.client].port.process();
    match sys.begin_fence_wait(pid, &[(f.handle(), v)], abi::port::WaitMode::All) {
        Ok(Some(w)) => q.waits.push_back((v, w)),
        Ok(None) => {}
        // A device in error (an adapter reset lost it): its fences read as signalled, so the
        // waiter has nothing to wait for, and the run goes on.
        Err(abi::port::KernelError::DeviceLost { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

/// Queue `i`'s CPU wait `w` as the observer sees it: the kernel's result so far, or
/// `ended` (the result its end collected; `None` for one still undecided).
pub(super) fn look(
    i: usize,
    q: &SimQ,
    w: &(u64, kernel::FenceWaitHandle),
    ended: Option<Result<abi::port::WaitOutcome, abi::port::KernelError>>,
) -> WaitLook {
    let fence = q.signal.as_ref().and_then(|f| f.value().ok());
    let (result, ended) = match ended {
        Some(Ok(abi::port::WaitOutcome::TimedOut)) => (None, true),
        Some(r) => (Some(r), true),
        None => (w.1.result(), false),
    };
    WaitLook { queue: i, value: w.0, fence, result, ended }
}

/// An exponential draw with this mean (ns).
pub(super) fn exp_ns(rng: &mut ChaCha8Rng, mean: f64) -> u64 {
    let u: f64 = rng.random::<f64>();
    (-(1.0 - u).ln() * mean).round() as u64
}

/// A duration draw (ns).
fn sample(rng: &mut ChaCha8Rng, d: Dist) -> u64 {
    match d {
        Dist::Constant(v) => v,
        Dist::Uniform(lo, hi) => (lo + (hi - lo) * rng.random::<f64>()).round() as u64,
        Dist::Exponential(mean) => exp_ns(rng, mean),
        Dist::LogNormal(median, sigma) => {
            // Box-Muller for one standard normal.
            let u1: f64 = 1.0 - rng.random::<f64>();
            let u2: f64 = rng.random::<f64>();
            let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
            (median * (sigma * z).exp()).round().min(1e15) as u64
        }
    }
}
