//! The firmware command table: every command the kernel-mode driver sends the scheduling
//! firmware, declared once (amdgpu's MES API: `mes_add_queue_input`, `mes_remove_queue_input`,
//! `mes_suspend_gang_input`, ...).
//!
//! [`fw_table!`] lists each command with its inputs (documented fields), the time it reaches
//! the device where it carries one (`at now`: a `now` field, which stamps its log entry), what
//! the firmware answers, how the firmware log records each input (`as R`: shared memory is
//! recorded by where it is, never held), and its body, which runs it on the device. Two
//! parts are expanded from it:
//!
//! - `fw_table!(commands)`, in [`crate::cmd`]: a struct per command, and its
//!   [`crate::cmd::Command`] implementation, through which [`crate::Gpu::command`] logs it
//!   and runs it;
//! - `fw_table!(records)`, in the firmware: [`crate::CommandRecord`], what the firmware log
//!   ([`crate::FwEvent::Command`]) keeps of each command.
//!
//! This module imports nothing: the firmware and [`crate::cmd`] both expand it, and neither
//! imports the other for it. Names in the table resolve where it is expanded.

/// The firmware command table (see the module's documentation).
macro_rules! fw_table {
    ($mode:ident) => { crate::fw_table::fw_table! { @$mode
        // ---- address spaces ----

        /// Creates an empty address space (space 0, the kernel's, comes with the device).
        CreateVm {} -> Vmid = |gpu, _| {
            let slot = gpu.vms.iter().position(Option::is_none);
            Ok(match slot {
                Some(i) => {
                    gpu.vms[i] = Some(AddressSpace::default());
                    Vmid(i as u32)
                }
                None => {
                    gpu.vms.push(Some(AddressSpace::default()));
                    Vmid(gpu.vms.len() as u32 - 1)
                }
            })
        };
        /// Destroys an address space. Queues still using it fault at once (each raises
        /// [`Interrupt::QueueFault`]): its vmid goes to the next address space created, and a
        /// queue left to fault at its next access would run there, in another process's memory.
        DestroyVm {
            /// The address space (not 0, the kernel's).
            vmid: Vmid,
        } -> () = |gpu, c| {
            let Gpu { vms, fw, .. } = gpu;
            match vms.get_mut(c.vmid.0 as usize) {
                Some(entry @ Some(_)) if c.vmid.0 != 0 => {
                    *entry = None;
                    let now = fw.last_step();
                    fw.address_space_destroyed(c.vmid, now, vms);
                    fw.address_space_changed(c.vmid, None);
                    Ok(())
                }
                _ => Err(GpuError::BadVmid(c.vmid.0)),
            }
        };
        /// Maps `bytes` of `memory` from `offset` at `va`. Hardware slots, which keep their own
        /// copy of the page table, are given the new one before the command returns.
        Map {
            /// The address space.
            vmid: Vmid,
            /// The GPU VA.
            va: u64,
            /// How many bytes.
            bytes: u64,
            /// The memory.
            memory: Arc<Shm> as MemoryRecord,
            /// Where in it the mapping starts.
            offset: u64,
            /// Whether the GPU may write it.
            writable: bool,
        } -> () = |gpu, c| gpu.vm_mut(c.vmid)?.map(c.va, c.bytes, c.memory, c.offset, c.writable);
        /// Unmaps the mapping at `va`, if there is one (answered with it); hardware slots are
        /// given the new page table.
        Unmap {
            /// The address space.
            vmid: Vmid,
            /// The mapping's first GPU VA.
            va: u64,
        } -> Option<GpuMapping> = |gpu, c| Ok(gpu.vm_mut(c.vmid)?.unmap(c.va));
        /// Takes the mapping at `va` out and puts it back (a migration's page-table update; no
        /// engine runs the address space meanwhile): no translation outlives it, which is the
        /// TLB invalidation.
        Remap {
            /// The address space.
            vmid: Vmid,
            /// The mapping's first GPU VA.
            va: u64,
        } -> () = |gpu, c| {
            let mut vm = gpu.vm_mut(c.vmid)?;
            let why = "nothing is mapped there";
            let m = vm.unmap(c.va).ok_or(GpuError::BadMapping { va: c.va, bytes: 0, why })?;
            vm.map(m.va, m.bytes, m.shm, m.offset, m.writable)
        };

        // ---- queues ----

        /// Adds a queue to the firmware and its engine's run list (MES `ADD_QUEUE`).
        AddQueue {
            /// The queue's descriptor (the engine-specific MQD).
            config: QueueConfig as QueueRecord,
        } -> FwQueueId = |gpu, c| {
            let Gpu { vms, fw, .. } = gpu;
            let vmid = c.config.vmid;
            let vm = vms.get(vmid.0 as usize).and_then(Option::as_ref).ok_or(GpuError::BadVmid(vmid.0))?;
            fw.add_queue(c.config, vm)
        };
        /// Removes a queue (MES `REMOVE_QUEUE`; it must not be running: the firmware stops it
        /// at a packet boundary). Answers its final rptr.
        RemoveQueue {
            /// The queue.
            queue: FwQueueId,
        } -> u64 = |gpu, c| {
            let Gpu { vms, fw, .. } = gpu;
            let now = fw.last_step();
            fw.remove_queue(c.queue, now, vms)
        };
        /// Takes a queue off the run list (context suspend) as a kernel preemption request,
        /// respecting the engine's preemption granularity: answered at once (in the returned
        /// [`Suspension`] and the firmware log) if it holds no slot or may stop where it stands;
        /// otherwise at the next point it may, by an [`Interrupt::Preempted`] with the ticket.
        SuspendQueue {
            /// The queue.
            queue: FwQueueId,
        } at now -> Suspension = |gpu, c| gpu.fw.suspend_queue(c.queue, c.now);
        /// Puts a suspended or preempted queue back on the run list (context resume).
        ResumeQueue {
            /// The queue.
            queue: FwQueueId,
        } -> () = |gpu, c| gpu.fw.resume_queue(c.queue);
        /// Asks the firmware to preempt a queue (spec 003; MES `SUSPEND`): it leaves its slot at
        /// the next point its engine's granularity allows, its state saved, and stays off the
        /// run list until resumed. Answers the request's ticket; the answer is an
        /// [`Interrupt::Preempted`] with it — raised at once when the queue can stop where it
        /// stands, never when it cannot stop (that is for the kernel's TDR timer).
        RequestPreempt {
            /// The queue.
            queue: FwQueueId,
            /// When the kernel asked (`now`: when the request reached the device; the kernel
            /// may have waited for the device lock in between).
            requested_at: Time,
        } at now -> u64 = |gpu, c| gpu.fw.request_preempt(c.queue, c.requested_at, c.now);
        /// Resets one queue (amdgpu's per-queue reset, MES `RESET`): it hangs with `why`, nothing
        /// else is touched. Answers the last progress value the engine accepted from it.
        ResetQueue {
            /// The queue.
            queue: FwQueueId,
            /// The kernel's reason: a preemption it would not answer, or the hang timer.
            why: FaultKind,
        } at now -> u64 = |gpu, c| {
            let Gpu { vms, fw, .. } = gpu;
            fw.reset_queue(c.queue, c.why, c.now, vms)
        };
        /// Resets an engine (`DxgkDdiResetEngine`): queues owing an answer to a preemption
        /// request hang; every other one leaves its slot with its state saved and keeps its work.
        ResetEngine {
            /// The engine.
            engine: EngineId,
        } at now -> EngineReset = |gpu, c| {
            let Gpu { vms, fw, .. } = gpu;
            fw.reset_engine(c.engine, c.now, vms)
        };
        /// Resets the whole adapter (`DxgkDdiResetFromTimeout`): every queue hangs, its state
        /// lost. Answers the queues that hung.
        ResetAdapter {} at now -> Vec<FwQueueId> = |gpu, c| {
            let Gpu { vms, fw, .. } = gpu;
            Ok(fw.reset_adapter(c.now, vms))
        };
        /// Takes back the unstarted work of a held kernel-owned ring: its accepted wptr drops to
        /// `wptr`, no lower than the packet it resumes at (spec 003's resubmission after
        /// preemption). The kernel stores `wptr` in the ring's wptr word first.
        TakeBack {
            /// The queue.
            queue: FwQueueId,
            /// Its new accepted wptr.
            wptr: u64,
        } at now -> () = |gpu, c| gpu.fw.take_back(c.queue, c.wptr, c.now);

        // ---- doorbells ----

        /// Makes the firmware watch doorbell `index` of the BAR for a queue, then checks the
        /// queue's wptr for work published while it was not watched.
        BindDoorbell {
            /// The queue.
            queue: FwQueueId,
            /// The doorbell's index in the BAR.
            index: u32,
        } -> () = |gpu, c| {
            let count = gpu.doorbell_count();
            if c.index >= count {
                return Err(GpuError::BadDoorbell { index: c.index, count });
            }
            gpu.fw.bind_doorbell(c.queue, c.index)
        };
        /// Connects a queue to the global doorbell, as bit `bit` of BAR page `page` (its
        /// process's doorbell page): from then on a ring of that bit makes the firmware re-read
        /// its wptr. Work published while it was disconnected is found at once.
        BindGlobalDoorbell {
            /// The queue.
            queue: FwQueueId,
            /// The BAR page.
            page: u32,
            /// The queue's bit in it.
            bit: u32,
        } -> () = |gpu, c| {
            if c.page >= gpu.bar.pages() {
                let index = c.page.saturating_mul(abi::doorbell::DOORBELLS_PER_PAGE);
                return Err(GpuError::BadDoorbell { index, count: gpu.doorbell_count() });
            }
            gpu.fw.bind_global_doorbell(c.queue, c.page, c.bit)
        };
        /// Stops watching the queue's doorbell, then checks its wptr one last time so a ring
        /// that raced the unbind is not lost.
        UnbindDoorbell {
            /// The queue.
            queue: FwQueueId,
        } -> () = |gpu, c| gpu.fw.unbind_doorbell(c.queue);
        /// Watches BAR page `page` as a process's aggregated doorbell: engine `e` rings word `e`
        /// (any store), and the firmware then polls the wptrs of that engine's queues.
        WatchAggregatedDoorbell {
            /// The BAR page.
            page: u32,
        } -> () = |gpu, c| gpu.fw.watch_aggregated(c.page);
        /// Stops watching an aggregated doorbell page.
        UnwatchAggregatedDoorbell {
            /// The BAR page.
            page: u32,
        } -> () = |gpu, c| {
            gpu.fw.unwatch_aggregated(c.page);
            Ok(())
        };

        // ---- fences ----

        /// `DxgkDdiSetNativeFenceLogBuffer` on the device: the queue's fence log `index` (0
        /// waits, 1 signals) is now `log`; later logged operations write there. Answers `false`
        /// if the queue has no fence logs.
        SetFenceLog {
            /// The queue.
            queue: FwQueueId,
            /// Which log: 0 waits, 1 signals.
            index: usize,
            /// The new log.
            log: Arc<Shm> as MemoryRecord,
        } -> bool = |gpu, c| gpu.fw.set_fence_log(c.queue, c.index, c.log);
        /// Sets the progress value above which the queue's `PROGRESS_FENCE` raises an
        /// interrupt (`u64::MAX`: none).
        SetMonitored {
            /// The queue.
            queue: FwQueueId,
            /// The monitored value.
            value: u64,
        } -> () = |gpu, c| gpu.fw.set_monitored(c.queue, c.value);
        /// `DxgkDdiCreateNativeFence`: a `SIGNAL` with the fence flag that lands on `current`
        /// compares against the MonitoredValue at `monitored` and raises
        /// [`Interrupt::NativeFenceSignaled`] with `id`.
        RegisterFence {
            /// The id its interrupts name.
            id: u64,
            /// Where its CurrentValue lives (a region and an offset in it).
            current: (Arc<Shm>, u64) as MemoryRecord,
            /// Its MonitoredValue.
            monitored: Word as MemoryRecord,
            /// How a `WAIT` on it waits.
            waits: FenceWaits,
        } -> () = |gpu, c| {
            gpu.fw.register_fence((&c.current.0, c.current.1), c.monitored, c.id, c.waits);
            Ok(())
        };
        /// `DxgkDdiDestroyNativeFence`.
        UnregisterFence {
            /// Where its CurrentValue lives.
            current: (Arc<Shm>, u64) as MemoryRecord,
        } -> () = |gpu, c| {
            gpu.fw.unregister_fence((&c.current.0, c.current.1));
            Ok(())
        };
        /// Native fences changed without the engines executing a signal (a CPU update, another
        /// adapter's signal): queues parked in a fence `WAIT` re-check.
        NotifyFences {} -> () = |gpu, _| {
            gpu.fw.notify_fences();
            Ok(())
        };

        // ---- power ----

        /// Wakes an engine to F0.
        RequestF0 {
            /// The engine.
            engine: EngineId,
        } at now -> () = |gpu, c| gpu.fw.request_f0(c.engine, c.now);
        /// Puts an idle engine in F1. Refused (answers `false`, the engine stays in F0) if any
        /// queue on its run list still has work: the kernel must reconnect their doorbells. A
        /// queue held off the run list ([`SuspendQueue`], [`RequestPreempt`]) does not count:
        /// its work is kept, and runs once it is resumed *and* the engine is back in F0
        /// ([`RequestF0`]), so the kernel wakes the engine when it resumes a queue.
        EnterF1 {
            /// The engine.
            engine: EngineId,
        } at now -> bool = |gpu, c| {
            let Gpu { vms, fw, .. } = gpu;
            fw.enter_f1(c.engine, c.now, vms)
        };
    } };

    // What the firmware log keeps of each command (in the firmware).
    (@records $(
        $(#[$doc:meta])*
        $name:ident { $($(#[$fdoc:meta])* $field:ident: $ty:ty $(as $rec:ty)?),* $(,)? }
            $(at $now:ident)? -> $reply:ty = |$gpu:ident, $c:pat_param| $body:expr;
    )*) => {
        /// A firmware command as the firmware log keeps it ([`crate::FwEvent::Command`]): its
        /// inputs, with shared memory recorded by where it is ([`MemoryRecord`]) and a queue's
        /// descriptor by what names it ([`QueueRecord`]); the time it reached the device is the
        /// entry's.
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub enum CommandRecord { $(
            #[doc = concat!("[`crate::cmd::", stringify!($name), "`].")]
            $name { $($(#[$fdoc])* $field: crate::fw_table::fw_table!(@ty $ty $(as $rec)?),)* },
        )* }
    };

    // The command structs and how each is logged and run (in `cmd`).
    (@commands $(
        $(#[$doc:meta])*
        $name:ident { $($(#[$fdoc:meta])* $field:ident: $ty:ty $(as $rec:ty)?),* $(,)? }
            $(at $now:ident)? -> $reply:ty = |$gpu:ident, $c:pat_param| $body:expr;
    )*) => { $(
        $(#[$doc])*
        ///
        #[doc = concat!("Answers `", stringify!($reply), "`.")]
        pub struct $name {
            $($(#[$fdoc])* pub $field: $ty,)*
            $(
                /// When the command reaches the device (its firmware log entry's time).
                pub $now: Time,
            )?
        }

        impl sealed::Apply for $name {
            type Reply = $reply;
            fn record(&self) -> CommandRecord {
                CommandRecord::$name { $($field: crate::fw_table::fw_table!(@record [$($rec)?] &self.$field),)* }
            }
            fn at(&self) -> Option<Time> {
                crate::fw_table::fw_table!(@at self $(.$now)?)
            }
            fn apply(self, $gpu: &mut Gpu) -> Result<$reply, GpuError> {
                let $c = self;
                $body
            }
        }

        impl Command for $name {}
    )* };

    (@ty $ty:ty) => { $ty };
    (@ty $ty:ty as $rec:ty) => { $rec };
    (@record [] $e:expr) => { Clone::clone($e) };
    (@record [$rec:ty] $e:expr) => { <$rec>::from($e) };
    (@at $s:ident) => { None };
    (@at $s:ident.$now:ident) => { Some($s.$now) };
}
pub(crate) use fw_table;
