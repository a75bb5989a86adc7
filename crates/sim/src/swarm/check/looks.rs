//! The checkers that look at the kernel and the device only when one of the kernel's counts
//! moves: `fault-record` (faults), `cpu-wait` (decided CPU waits) and `f1-idle` (F1 entries).
//! Each asks per queue (a status query, a wait's result, the device's view of a queue), which
//! at every instant would slow every run; a count that did not move means nothing they check
//! can have changed since their last look.

use abi::port::WaitOutcome;

use super::Checker;
use crate::observe::{WaitLook, World};

impl Checker {
    /// `fault-record`: every queue the kernel hung since the last look reports it (a fault
    /// record in `QUERY_STATUS`; a user-mode queue's doorbell reads `DisconnectedAbort`).
    /// Looks only when the kernel's fault count moved (a status query per queue and instant
    /// would slow every run).
    pub(super) fn check_fault_records(&mut self, now: u64, world: &World<'_>, stats: &kernel::os::OsStats) {
        let faults = stats.faults;
        if faults == self.faults_seen {
            return;
        }
        self.faults_seen = faults;
        for i in 0..world.queue_count() {
            let v = world.queue(i);
            let (Some(q), false) = (v.queue, self.queues[i].fault_checked) else { continue };
            let Ok(s) = q.status() else { continue };
            if s.flags & abi::port::QUEUE_STATUS_HUNG == 0 {
                continue;
            }
            let l = &mut self.queues[i];
            l.fault_checked = true;
            l.lost = true;
            l.note(now, format!("found hung: {:?}", s.fault.as_ref().map(|f| &f.kind)));
            if s.fault.is_none() {
                let what = format!("queue {i}: hung, and QUERY_STATUS carries no fault record");
                self.violate("fault-record", now, Some(i), what);
            }
            let bell = q.doorbell_status();
            if !self.group_kernel_mode[v.group] && !matches!(bell, Ok(abi::DoorbellStatus::DisconnectedAbort)) {
                let what = format!("queue {i}: hung, and its doorbell reads {bell:?}, not DisconnectedAbort");
                self.violate("fault-record", now, Some(i), what);
            }
        }
    }

    /// `cpu-wait`: a wait the kernel decided as reached has its fence at its value.
    pub(super) fn check_wait(&mut self, now: u64, look: &WaitLook) {
        let (Some(Ok(WaitOutcome::Reached(_))), Some(fence)) = (&look.result, look.fence) else { return };
        if fence >= look.value {
            return;
        }
        let what = format!(
            "queue {}: a CPU wait for fence value {} returned with the fence at {fence}{}",
            look.queue,
            look.value,
            if look.ended { " (as its client ended it)" } else { "" }
        );
        self.queues[look.queue].note(now, format!("CPU wait for {} woken at fence {fence}", look.value));
        self.violate("cpu-wait", now, Some(look.queue), what);
    }

    /// `cpu-wait` on the waits the clients still hold: the kernel may have decided one since
    /// its client began it (an interrupt, a resample).
    pub(super) fn check_held_waits(&mut self, now: u64, world: &World<'_>, stats: &kernel::os::OsStats) {
        // Only a decision can break it: look when the kernel's count of them moved.
        let decided = stats.waits_decided;
        if decided == self.waits_decided_seen {
            return;
        }
        self.waits_decided_seen = decided;
        for k in 0..self.waiting_queues.len() {
            let i = self.waiting_queues[k];
            let v = world.queue(i);
            let (Some(&(value, _)), Some(signal)) = (v.waits.back(), v.signal) else { continue };
            // The fence rises: a wait below its value is reached, whatever the kernel said.
            let Ok(fence) = signal.value() else { continue };
            if fence >= value {
                continue;
            }
            for (value, w) in v.waits.iter().rev().take_while(|(value, _)| fence < *value) {
                let look = WaitLook { queue: i, value: *value, fence: Some(fence), result: w.result(), ended: false };
                self.check_wait(now, &look);
            }
        }
    }

    /// `f1-idle`: an engine in F1 has no queue on its run list with work, and every queue held
    /// off it whose client still waits for a command buffer keeps that work in its ring.
    /// Looks when the kernel's count of F1 entries moved, at the engines in F1 then: nothing
    /// a client does runs between the entry and this look (clients act after it), so work
    /// seen now was there when the device granted F1.
    pub(super) fn check_f1(&mut self, now: u64, world: &World<'_>, stats: &kernel::os::OsStats) {
        if stats.f1_entries == self.f1_entries_seen {
            return;
        }
        self.f1_entries_seen = stats.f1_entries;
        let sys = world.system();
        for engine in 0..self.engine_queues.len() {
            if sys.power(abi::EngineId(engine as u32)) != abi::PowerState::F1 {
                continue;
            }
            for k in 0..self.engine_queues[engine].len() {
                let i = self.engine_queues[engine][k];
                let v = world.queue(i);
                if !v.live || v.ended.is_some() {
                    continue;
                }
                let Some(handle) = v.handle else { continue };
                let Ok(Some(bits)) = sys.device_queue_id(v.process, handle) else { continue };
                let id = gpu::FwQueueId::from_bits(bits);
                let Ok((state, work)) =
                    sys.inspect_gpu(|g| Ok::<_, gpu::GpuError>((g.queue_state(id)?, g.queue_has_work(id)?)))
                else {
                    continue;
                };
                let waited = v.oldest_outstanding.is_some() && v.completed.is_some_and(|c| c < v.last_submitted);
                let what = match state {
                    abi::QueueState::Mapped if work => format!(
                        "engine {engine} entered F1 with queue {i} on its run list holding work (fence {:?}, last submitted {})",
                        v.completed, v.last_submitted
                    ),
                    abi::QueueState::Preempted | abi::QueueState::Unmapped
                        if !work && waited && !self.group_kernel_mode[v.group] =>
                    {
                        format!(
                            "engine {engine} entered F1 with queue {i} held off its run list ({state:?}) and its work gone (fence {:?}, last submitted {})",
                            v.completed, v.last_submitted
                        )
                    }
                    _ => continue,
                };
                self.queues[i].note(now, format!("engine {engine} in F1, queue {state:?}, work {work}"));
                self.violate("f1-idle", now, Some(i), what);
            }
        }
    }
}
