//! The engine watchdog (spec 000: the OS "monitors whether a GPU engine is making progress
//! using TDR timeout cadence"; see [`recovery`](super::super::recovery)'s module docs): every
//! `TdrDelay` the OS sums each engine's completed progress values; an engine whose sum has not
//! moved since the last look, with a queue waiting for a slot now, is stalled, and the queues
//! with work in its slots are asked to preempt ([`Cause::Watchdog`]). The answers are
//! [`Os::handle_preempted`]'s; no answer is a TDR of the engine (`tdr.rs`).

use std::collections::BTreeMap;

use abi::{EngineId, HwQueueHandle, Time};

use super::super::Os;
use super::super::recovery::Cause;
use super::hang::Watched;
use crate::ddi::Kmd;
use crate::trace::Event;

/// What one look saw of an engine.
#[derive(Default)]
struct EngineLook {
    /// The sum of its live queues' completed progress values (wrapping: only equality is read).
    progress: u64,
    /// Its queues with work outstanding that the kernel does not hold.
    busy: Vec<HwQueueHandle>,
}

impl Os {
    /// The engine watchdog's look (module docs). Asks the device which queues hold a slot only
    /// of an engine that made no progress since the last look, so a look at a working GPU
    /// reads nothing of it.
    pub(super) fn engine_watch(&mut self, now: Time) {
        let (looks, any) = self.look_at_engines();
        let last = std::mem::take(&mut self.recovery.watched);
        let owing = self.recovery.owing();
        let mut stalled = Vec::new();
        for (&engine, look) in &looks {
            if look.busy.is_empty() {
                continue;
            }
            self.recovery.watched.insert(engine, look.progress);
            if last.get(&engine) != Some(&look.progress) {
                continue;
            }
            let (seated, waiting): (Vec<HwQueueHandle>, Vec<HwQueueHandle>) =
                look.busy.iter().partition(|&&q| self.cx.ddi.queue_in_slot(q));
            let holders: Vec<HwQueueHandle> = seated.into_iter().filter(|q| !owing.contains(q)).collect();
            if !waiting.is_empty() && !holders.is_empty() {
                let waiting = waiting.len() as u32;
                self.cx.trace.push(now, Event::EngineStalled { engine, holders: holders.len() as u32, waiting });
                stalled.push((engine, holders));
            }
        }
        for (engine, holders) in stalled {
            for q in holders {
                // A request the KMD cannot make recovers the engine at once (and the rest
                // of its holders with it).
                if self.request_preemption(q, engine, Cause::Watchdog, now).is_err() {
                    break;
                }
            }
        }
        self.recovery.next_engine_watch(any, now, &mut self.cx.timers);
    }

    /// Each engine's progress and busy queues now, and whether any queue is alive to watch.
    fn look_at_engines(&mut self) -> (BTreeMap<EngineId, EngineLook>, bool) {
        let mut looks: BTreeMap<EngineId, EngineLook> = BTreeMap::new();
        let live = self.live_queues();
        let any = !live.is_empty();
        for Watched { pid, q, submitted, held_off } in live {
            let Ok(qo) = self.queue(pid, q) else { continue };
            let completed = qo.completed();
            let look = looks.entry(qo.engine).or_default();
            look.progress = look.progress.wrapping_add(completed);
            if submitted > completed && !held_off {
                look.busy.push(q);
            }
        }
        (looks, any)
    }
}
