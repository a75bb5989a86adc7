//! Doorbells as the firmware sees them (spec 000 "Doorbells", spec 001's doorbell BAR and
//! aggregated doorbell): which BAR word each queue's doorbell is, the global model's bit
//! pages, the aggregated pages, bind and unbind, and latching rings.
//!
//! Each watched BAR word also records when it was last used (bound, or seen rung) as a step
//! of one firmware-wide sequence; the KMD reads it when it must pick a doorbell to victimize
//! (spec 000: "an older or least recently used hardware queue"), so keeping it costs the
//! client nothing on the data path.
//!
//! Invariants: a queue is bound to at most one doorbell (a BAR word, or a bit of a bit page);
//! bind and unbind both re-read the queue's wptr ([`find_published_work`]), so a submission
//! published while the doorbell was disconnected, or whose ring raced the disconnect, is
//! found; a ring of a queue the engine would not hear (no hardware slot, on a device that
//! misses unmapped doorbells) is not latched — the aggregated doorbell tells instead.

use std::sync::atomic::Ordering;

use abi::QueueState;
use abi::doorbell::DoorbellModel;
use abi::protocol;
use abi::slab::Slab;
use shm::Word;

use crate::Time;
use crate::error::GpuError;

use super::queue::{FwQueue, FwQueueId};
use super::schedule::mark_pending;
use super::{Engine, Firmware, Interrupt};

/// Largest rptr/wptr the firmware accepts: far enough from `u64::MAX` that pointer
/// arithmetic (a ring's worth of bytes on top) cannot overflow.
pub(super) const MAX_POINTER: u64 = 1 << 62;

/// Which doorbell a queue answers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Binding {
    /// A dedicated BAR word.
    Word(u32),
    /// Its bit of a global-doorbell bit page.
    Bit {
        /// The BAR page.
        page: u32,
        /// The bit (0..512).
        bit: u32,
    },
}

/// A BAR page of global-doorbell bits (one per process: the page is the unit of protection,
/// so a client can only ever clear bits of its own queues), and which queue each bit names.
pub(super) struct BitPage {
    /// Its words in the BAR.
    pub(super) words: Vec<Word>,
    pub(super) queues: Vec<Option<FwQueueId>>,
    /// Per word, the bits that name a queue.
    pub(super) bound: [u64; BITS_PER_PAGE as usize / 64],
}

/// Bits in a doorbell page.
pub(super) const BITS_PER_PAGE: u32 = abi::doorbell::DOORBELLS_PER_PAGE;

pub(super) struct Watch {
    pub(super) word: Word,
    pub(super) queue: FwQueueId,
    pub(super) last: u64,
    /// When the doorbell was last used: the firmware's use sequence ([`Doorbells::use_seq`]) at
    /// its bind or at the last ring seen, whichever came later. The KMD reads it
    /// ([`Firmware::doorbell_of`]) to victimize the least recently rung doorbell, so the data
    /// path needs no kernel call to keep it.
    pub(super) last_used: u64,
}

/// A disconnected queue's BAR word, watched for rings from the GPU ([`Doorbells::dormant`]).
pub(super) struct Dormant {
    pub(super) index: u32,
    pub(super) word: Word,
    pub(super) queue: FwQueueId,
    pub(super) last: u64,
}

/// The firmware's doorbells beside the engines' watches ([`Engine::watches`]): the BAR and
/// its model, the global model's bit pages, the aggregated pages, the disconnected words
/// watched for rings from the GPU, and the use clock the KMD victimizes by.
pub(super) struct Doorbells {
    /// Spec 000's doorbell model.
    pub(super) model: DoorbellModel,
    /// The global model's bit pages, by BAR page.
    pub(super) bit_pages: std::collections::BTreeMap<u32, BitPage>,
    /// Aggregated doorbell pages being watched (when engines miss unmapped queues' doorbells).
    pub(super) aggregated: Vec<(u32, Vec<Word>)>,
    /// The doorbell BAR the engines watch.
    pub(super) bar: abi::doorbell::DoorbellBar,
    /// Engines drop rings of queues without a hardware slot.
    pub(super) misses_unmapped: bool,
    /// Bumped at every doorbell bind and every ring seen on a watched BAR word: the clock of
    /// each doorbell's `last_used` ([`Watch`]).
    pub(super) use_seq: u64,
    /// BAR doorbell words of queues the kernel disconnected (unbound), still theirs until
    /// another binding takes the word: a change is a ring from the GPU, raised as
    /// [`Interrupt::DisconnectedRing`] ([`Dormant`]).
    pub(super) dormant: Vec<Dormant>,
}

impl Doorbells {
    /// No doorbell bound yet on `bar`, of `model`.
    pub(super) fn new(bar: abi::doorbell::DoorbellBar, model: DoorbellModel, misses_unmapped: bool) -> Doorbells {
        Doorbells {
            model,
            bit_pages: Default::default(),
            aggregated: Vec::new(),
            bar,
            misses_unmapped,
            use_seq: 0,
            dormant: Vec::new(),
        }
    }
}

impl Firmware {
    pub(crate) fn bind_doorbell(&mut self, id: FwQueueId, index: u32) -> Result<(), GpuError> {
        // The word is someone's live doorbell again (or this queue's): no longer dormant.
        self.doorbells.dormant.retain(|d| d.index != index && d.queue != id);
        // Reset the word to the queue's wptr as the firmware last validated it: a ring is a
        // change of the word, and every value a client can write except that one is a
        // change — the next wptr moves forward, and a bad one (backwards, misaligned,
        // `u64::MAX`) is heard and faults the queue. A recycled doorbell thus never carries
        // its previous owner's value, which could equal this queue's next wptr and hide a
        // ring; and work published before the bind is found by the wptr re-read below.
        // Relaxed: the binding is published to the client by the kernel's status store,
        // which comes after.
        let last = self.queue(id)?.ring.wptr;
        let word = self.doorbells.bar.doorbell(index)?;
        word.get().store(last, Ordering::Relaxed);
        self.doorbells.use_seq += 1;
        let last_used = self.doorbells.use_seq;
        let (e, q) = self.engine_and_queue(id)?;
        forget_watch(e, id);
        e.watches.push(Some(Watch { word, queue: id, last, last_used }));
        e.watch_at.insert(id, e.watches.len() - 1);
        e.resched = true;
        q.doorbell = Some(Binding::Word(index));
        // Work published while disconnected rang the dummy page: find it through wptr.
        find_published_work(e, q, id);
        Ok(())
    }

    /// Binds queue `id` to bit `bit` of the global-doorbell bit page `page` (its process's).
    pub(crate) fn bind_global_doorbell(&mut self, id: FwQueueId, page: u32, bit: u32) -> Result<(), GpuError> {
        if self.doorbells.model != DoorbellModel::Global {
            return Err(GpuError::NoGlobalDoorbell { model: self.doorbells.model });
        }
        if bit >= BITS_PER_PAGE {
            return Err(GpuError::NoGlobalDoorbellBit { bit, bits: BITS_PER_PAGE });
        }
        let old = self.queue(id)?.doorbell;
        self.forget_bit(id, old);
        if !self.doorbells.bit_pages.contains_key(&page) {
            let words =
                (0..BITS_PER_PAGE / 64).map(|w| self.doorbells.bar.page_word(page, w)).collect::<Result<_, _>>()?;
            self.doorbells
                .bit_pages
                .insert(page, BitPage { words, queues: vec![None; BITS_PER_PAGE as usize], bound: [0; 8] });
        }
        let bp = self.doorbells.bit_pages.get_mut(&page).expect("inserted above");
        // A queue that held the bit before loses it (the OS hands each index out once).
        if let Some(prev) = bp.queues[bit as usize].replace(id)
            && let Ok(q) = self.queue_mut(prev)
        {
            q.doorbell = None;
        }
        let bp = self.doorbells.bit_pages.get_mut(&page).expect("inserted above");
        bp.bound[bit as usize / 64] |= 1 << (bit % 64);
        // Nothing to reset: a bit a previous owner of this index left set only makes us
        // re-read this queue's wptr once.
        let (e, q) = self.engine_and_queue(id)?;
        e.resched = true;
        q.doorbell = Some(Binding::Bit { page, bit });
        // Work published while disconnected rang the dummy page: find it through wptr.
        find_published_work(e, q, id);
        Ok(())
    }

    /// Drops queue `id`'s bit, if `binding` is one.
    pub(super) fn forget_bit(&mut self, id: FwQueueId, binding: Option<Binding>) {
        let Some(Binding::Bit { page, bit }) = binding else { return };
        let Some(bp) = self.doorbells.bit_pages.get_mut(&page) else { return };
        if bp.queues[bit as usize] == Some(id) {
            bp.queues[bit as usize] = None;
            bp.bound[bit as usize / 64] &= !(1 << (bit % 64));
        }
        if bp.bound.iter().all(|&w| w == 0) {
            self.doorbells.bit_pages.remove(&page);
        }
    }

    /// Starts watching BAR page `page` as an aggregated doorbell (one per process): word `e`
    /// for engine `e`, so any store rings it — a client's OR from the CPU, or a plain write
    /// from the GPU (a queue submitting to another, spec 001) — and no store erases another
    /// engine's ring.
    pub(crate) fn watch_aggregated(&mut self, page: u32) -> Result<(), GpuError> {
        if !self.doorbells.aggregated.iter().any(|(p, _)| *p == page) {
            let words = (0..self.engines.len() as u32)
                .map(|e| self.doorbells.bar.page_word(page, e))
                .collect::<Result<_, _>>()?;
            self.doorbells.aggregated.push((page, words));
        }
        Ok(())
    }

    /// Stops watching it.
    pub(crate) fn unwatch_aggregated(&mut self, page: u32) {
        self.doorbells.aggregated.retain(|(p, _)| *p != page);
    }

    /// Which doorbell queue `id` answers to now, and for a BAR word when it was last used:
    /// a read-only query for the KMD (victim choice, and the OS's doorbell query).
    pub(crate) fn doorbell_of(&self, id: FwQueueId) -> Result<Option<crate::BoundDoorbell>, GpuError> {
        let q = self.queue(id)?;
        Ok(q.doorbell.map(|b| match b {
            Binding::Bit { page, bit } => crate::BoundDoorbell::Bit { page, bit },
            Binding::Word(index) => {
                let e = &self.engines[q.cfg.engine.0 as usize];
                let watch = e.watch_at.get(&id).and_then(|&k| e.watches.get(k)).and_then(Option::as_ref);
                crate::BoundDoorbell::Word { index, last_used: watch.map_or(0, |w| w.last_used) }
            }
        }))
    }

    pub(crate) fn model(&self) -> DoorbellModel {
        self.doorbells.model
    }

    pub(crate) fn misses_unmapped(&self) -> bool {
        self.doorbells.misses_unmapped
    }

    pub(crate) fn unbind_doorbell(&mut self, id: FwQueueId) -> Result<(), GpuError> {
        let binding = self.queue(id)?.doorbell;
        if let Some(Binding::Word(index)) = binding
            && let Ok(word) = self.doorbells.bar.doorbell(index)
        {
            // Relaxed: a snapshot to compare later loads against; the re-read below finds
            // whatever was published before it.
            let last = word.get().load(Ordering::Relaxed);
            self.doorbells.dormant.retain(|d| d.index != index && d.queue != id);
            self.doorbells.dormant.push(Dormant { index, word, queue: id, last });
        }
        self.forget_bit(id, binding);
        let (e, q) = self.engine_and_queue(id)?;
        forget_watch(e, id);
        e.resched = true;
        q.doorbell = None;
        // A ring that raced the disconnect may never be seen on the BAR: re-read wptr.
        find_published_work(e, q, id);
        Ok(())
    }

    pub(crate) fn poll_doorbells(&mut self) -> bool {
        let misses = self.doorbells.misses_unmapped;
        let mut rang = false;
        // Disconnected doorbells rung from the GPU: the kernel reconnects them.
        for d in &mut self.doorbells.dormant {
            // Acquire: as for a watched word.
            let v = d.word.get().load(Ordering::Acquire);
            if v != d.last {
                d.last = v;
                // Polling has no clock: raised now, whenever the driver takes it.
                self.irqs.push_back((Time::ZERO, Interrupt::DisconnectedRing { queue: d.queue }));
                rang = true;
            }
        }
        // Dedicated doorbells: a watched word that changed.
        for e in self.engines.iter_mut().filter(|e| e.power.is_on()) {
            for k in 0..e.watches.len() {
                rang |= check_watch(e, k, &mut self.queues, &mut self.doorbells.use_seq, misses);
            }
        }
        rang | self.poll_shared_doorbells()
    }

    /// [`Firmware::poll_doorbells`] for a driver that knows which queues' clients may have
    /// rung since the last poll (the deterministic driver, whose clients run between its
    /// steps): only those queues' dedicated doorbells are looked at, in the order given, then
    /// every global-doorbell bit page and aggregated doorbell (a few words per process).
    /// Unknown or unbound queues are skipped.
    pub(crate) fn poll_doorbells_of(&mut self, ids: impl IntoIterator<Item = FwQueueId>) -> bool {
        let misses = self.doorbells.misses_unmapped;
        let mut rang = false;
        for id in ids {
            let Ok(q) = self.queues.get(id.0) else { continue };
            let Some(e) = self.engines.get_mut(q.cfg.engine.0 as usize) else { continue };
            if !e.power.is_on() {
                continue;
            }
            if let Some(&k) = e.watch_at.get(&id) {
                rang |= check_watch(e, k, &mut self.queues, &mut self.doorbells.use_seq, misses);
            }
        }
        rang | self.poll_shared_doorbells()
    }

    /// The global-doorbell bit pages and the aggregated doorbells: nothing to look at (and no
    /// call) where every queue has a dedicated doorbell and no aggregated one.
    #[inline]
    fn poll_shared_doorbells(&mut self) -> bool {
        if self.doorbells.bit_pages.is_empty() && self.doorbells.aggregated.is_empty() {
            return false;
        }
        self.poll_shared_pages()
    }

    /// [`Firmware::poll_shared_doorbells`] when there are pages to look at.
    fn poll_shared_pages(&mut self) -> bool {
        let misses = self.doorbells.misses_unmapped;
        let mut rang = false;
        // Global-doorbell bit pages: each set bit names a queue of that page's process. A bit
        // of a queue whose engine is in F1 goes back (the engine is not watching); a bit that
        // names no queue is dropped. Either way a bit only ever makes the firmware re-read one
        // queue's wptr.
        let Firmware { doorbells, queues, engines, .. } = self;
        for bp in doorbells.bit_pages.values() {
            for (w, &bound) in bp.bound.iter().enumerate() {
                if bound == 0 {
                    continue;
                }
                let word = &bp.words[w];
                let mut bits = protocol::take_rings(word);
                let mut back = 0;
                while bits != 0 {
                    let b = bits.trailing_zeros();
                    bits &= bits - 1;
                    let Some(id) = bp.queues[w * 64 + b as usize] else { continue };
                    let Ok(q) = queues.get_mut(id.0) else { continue };
                    let e = &mut engines[q.cfg.engine.0 as usize];
                    if e.power.is_on() {
                        rang |= latch_ring(e, q, id, misses);
                    } else {
                        back |= 1 << b;
                    }
                }
                if back != 0 {
                    // Release, as a client's ring: the wptr stays visible to whoever takes it.
                    word.get().fetch_or(back, Ordering::Release);
                }
            }
        }
        // Aggregated doorbells (one page per process): word `e` set says some queue of engine
        // `e` rang, perhaps one without a slot whose own ring was missed. Poll the wptrs of
        // that engine's queues; a ring of an engine in F1 goes back.
        let Firmware { doorbells, engines, queues, .. } = self;
        for (_, words) in doorbells.aggregated.iter() {
            for (e, word) in engines.iter_mut().zip(words) {
                let rung = protocol::take_rings(word);
                if rung == 0 {
                    continue;
                }
                if !e.power.is_on() {
                    // Release, as a client's ring: the wptrs stay visible to whoever takes it.
                    word.get().fetch_or(rung, Ordering::Release);
                    continue;
                }
                for k in 0..e.run_list.len() {
                    let id = e.run_list[k];
                    let Ok(q) = queues.get_mut(id.0) else { continue };
                    if !q.pending && q.state != QueueState::Hung && q.ring.wptr_moved() {
                        mark_pending(e, q, id);
                        rang = true;
                    }
                }
            }
        }
        rang
    }
}

/// Looks at watch `k` of `e`: a word that changed is a ring, latched for its queue.
fn check_watch(e: &mut Engine, k: usize, queues: &mut Slab<FwQueue>, use_seq: &mut u64, misses: bool) -> bool {
    let Some(w) = e.watches[k].as_mut() else { return false };
    // Acquire: pairs with the client's release store of the doorbell, so the wptr it
    // stored before ringing is visible to the wptr load that follows. (With a
    // relaxed load the firmware could see the ring yet read the old wptr, and
    // conclude the queue is idle.)
    let v = w.word.get().load(Ordering::Acquire);
    if v == w.last {
        return false;
    }
    w.last = v;
    *use_seq += 1;
    w.last_used = *use_seq;
    let id = w.queue;
    match queues.get_mut(id.0) {
        Ok(q) => latch_ring(e, q, id, misses),
        Err(_) => false,
    }
}

/// Latches the rings on `e`'s sentinel doorbells ([`Engine::sentinels`]), as
/// [`Firmware::poll_doorbells`] would: a turn was just cut short by one. The queues that rang
/// leave `had_turn` (a ring earns a new turn). Returns whether any rang.
pub(super) fn latch_sentinels(
    e: &mut Engine,
    queues: &mut Slab<FwQueue>,
    use_seq: &mut u64,
    misses: bool,
    had_turn: &mut Vec<FwQueueId>,
) -> bool {
    let mut rang = false;
    for i in 0..e.sentinels.len() {
        let id = e.sentinels[i].queue;
        if let Some(&k) = e.watch_at.get(&id)
            && check_watch(e, k, queues, use_seq, misses)
        {
            had_turn.retain(|&h| h != id);
            rang = true;
        }
    }
    rang
}

/// Drops queue `id`'s watch from `e`, if it has one, keeping the others in order: its place
/// is emptied, and the list is compacted (and the index rebuilt) once half of it is empty,
/// so removing every queue one by one costs linear time, not quadratic.
pub(super) fn forget_watch(e: &mut Engine, id: FwQueueId) {
    let Some(k) = e.watch_at.remove(&id) else { return };
    e.watches[k] = None;
    if e.watch_at.len() * 2 <= e.watches.len() {
        e.watches.retain(Option::is_some);
        e.watch_at.clear();
        for (k, w) in e.watches.iter().enumerate() {
            if let Some(w) = w {
                e.watch_at.insert(w.queue, k);
            }
        }
    }
}

/// Re-reads `q`'s wptr (the fenced re-check of `abi::protocol`) and marks it pending if the
/// client published work no ring announced: what a doorbell bind or unbind and a resume do,
/// so that nothing published while disconnected or suspended is lost.
pub(super) fn find_published_work(e: &mut Engine, q: &mut FwQueue, id: FwQueueId) {
    if q.state != QueueState::Hung && q.ring.has_work() {
        mark_pending(e, q, id);
    }
}

/// A doorbell ring for `q` reached the engine: [`mark_pending`], unless the engine misses
/// doorbells of user queues without a hardware slot and `q` is one (the aggregated doorbell
/// will tell). Returns whether the ring was latched.
pub(super) fn latch_ring(e: &mut Engine, q: &mut FwQueue, id: FwQueueId, misses_unmapped: bool) -> bool {
    // Kernel queues are the KMD's own and always heard (it rings no aggregated doorbell).
    if misses_unmapped && q.state != QueueState::Mapped && !q.cfg.privileged {
        return false;
    }
    // A ring of an idle queue without a slot that published nothing new (a spurious or
    // foreign ring) must not win it a slot: it would only evict a holder to run nothing.
    if q.state != QueueState::Mapped && !q.pending && !q.ring.wptr_moved() {
        return false;
    }
    mark_pending(e, q, id);
    true
}
