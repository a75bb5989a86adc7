//! The DDI table: every DDI between the OS and the kernel-mode driver, declared once.
//!
//! [`ddi_table!`] lists each DDI of spec 000's OS/KMD split with its name, arguments and
//! return type, its documentation, whether it only reads the device (`query`, `&self`) or
//! acts on it (`call`, `&mut self`), a default body where a KMD may leave it out, and how the
//! tracing decorator treats it: what it records in the kernel's trace before the call
//! (`[log ..]`), whether a test can fail it on purpose (`[fails Kind]`, or `[fails_as Kind]`
//! for a second DDI counted with the first), what it does to the answer (`[then ..]`: a
//! misbehaving KMD's reset outcome) or which of the decorator's own methods handles the call
//! (`[via ..]`). A `query` is only forwarded: the table refuses one that asks to be recorded
//! or failed. Everything that used to repeat the list is generated from it:
//!
//! - [`crate::ddi::Kmd`], the trait (`ddi_table!(kmd)`, expanded in `ddi.rs`);
//! - the forwarding of [`crate::ddi::Traced`], the decorator (`ddi_table!(traced)`, there too);
//! - [`DdiKind`], the DDIs a test can fail, and [`Ddi`], what the trace records of a DDI call
//!   (`ddi_table!(kinds)`, here).
//!
//! The trace's records are their own list (`records`): a record may stand for two DDIs (a
//! kernel doorbell's connect is logged as any connect) and the OS logs a few DDIs itself,
//! where it knows names the KMD does not (a fence's process-local handle). This module
//! imports nothing of [`crate::ddi`] or [`crate::trace`]: both import it, so neither imports
//! the other's types back.
//!
//! Names in the `ddis` list resolve where it is expanded (`ddi.rs`); the `records` list's in
//! this module.

use abi::{ContextHandle, EngineId, HwQueueHandle, NativeFenceHandle, PowerState};

/// The DDI table. `ddi_table!(kinds)`, `ddi_table!(kmd)` and `ddi_table!(traced)` expand the
/// parts of it (see the module's documentation).
macro_rules! ddi_table {
    ($mode:ident) => { crate::ddis::ddi_table! { @parse $mode
    records {
        /// `DxgkDdiCreateHwQueue`, on a context (the queue's handle exists once it returns).
        CreateHwQueue(ContextHandle),
        /// `DxgkDdiDestroyHwQueue`.
        DestroyHwQueue(HwQueueHandle),
        /// `DxgkDdiCreateDoorbell` (logged by the OS; the KMD has nothing to do).
        CreateDoorbell(HwQueueHandle),
        /// `DxgkDdiConnectDoorbell`.
        ConnectDoorbell(HwQueueHandle),
        /// `DxgkDdiDisconnectDoorbell`.
        DisconnectDoorbell(HwQueueHandle),
        /// `DxgkDdiDestroyDoorbell` (logged by the OS).
        DestroyDoorbell(HwQueueHandle),
        /// `DxgkDdiNotifyWorkSubmission`.
        NotifyWorkSubmission(HwQueueHandle),
        /// `DxgkDdiUpdateMonitoredValues` (for progress-fence waiters).
        UpdateMonitoredValue(HwQueueHandle, u64),
        /// `DxgkDdiSetPowerComponentFState`.
        SetPowerState(EngineId, PowerState),
        /// `DxgkddiSuspendContext`.
        SuspendContext(ContextHandle),
        /// `DxgkddiResumeContext`.
        ResumeContext(ContextHandle),
        /// `DxgkDdiSubmitCommand` (the kernel-mode path), with the buffer's submission fence ID.
        SubmitCommand {
            /// The kernel-mode queue.
            queue: HwQueueHandle,
            /// Its fence ID (per engine; a resubmitted paging buffer keeps its own).
            fence_id: u64,
        },
        /// `DxgkDdiCreateNativeFence`, with the global id.
        CreateNativeFence(u64),
        /// `DxgkDdiOpenNativeFence`: a process's local handle to a shared fence.
        OpenNativeFence(NativeFenceHandle),
        /// `DxgkDdiCloseNativeFence`.
        CloseNativeFence(NativeFenceHandle),
        /// `DxgkDdiDestroyNativeFence`, with the global id.
        DestroyNativeFence(u64),
        /// `DxgkDdiUpdateMonitoredValues` for a native fence (logged by the OS, which knows
        /// the fence's local handle).
        UpdateMonitoredValues(NativeFenceHandle, u64),
        /// `DxgkDdiSetNativeFenceLogBuffer` (the queue's wait and signal logs).
        SetNativeFenceLogBuffer(HwQueueHandle),
        /// `DxgkDdiUpdateNativeFenceLogs`: flush pending log writes before the OS reads them.
        UpdateNativeFenceLogs(HwQueueHandle),
        /// `DxgkDdiUpdateCurrentValuesFromCpu` (logged by the OS).
        UpdateCurrentValueFromCpu(NativeFenceHandle, u64),
        /// `DxgkDdiUpdateCurrentValuesFromCpu` with `NotificationOnly`: another adapter signalled
        /// a cross-adapter fence; the value is already in the shared storage, and the KMD rescans
        /// its run list for queues waiting on it (logged by the OS).
        UpdateCurrentValueNotificationOnly(NativeFenceHandle),
        /// `DxgkDdiPreemptCommand`: a preemption request for a queue.
        PreemptQueue(HwQueueHandle),
        /// `DxgkDdiResetEngine`.
        ResetEngine(EngineId),
        /// amdgpu's per-queue reset through the scheduling firmware.
        ResetQueue(HwQueueHandle),
        /// A buffer moved (its GPU VA) to a memory domain, page tables updated, TLB invalidated.
        MigrateAllocation {
            /// Its GPU VA.
            va: u64,
            /// Where it went.
            domain: abi::port::MemoryDomain,
        },
        /// `DxgkDdiResetFromTimeout`: the adapter reset.
        ResetFromTimeout,
        /// `DxgkDdiRestartFromTimeout`.
        RestartFromTimeout,
        /// A held kernel-mode queue's unstarted buffers leave its hardware queue
        /// ([`crate::ddi::Kmd::take_back`]).
        TakeBack {
            /// The queue.
            queue: HwQueueHandle,
            /// Its accepted wptr after.
            wptr: u64,
        },
    }
    ddis {
        /// `DxgkDdiQueryAdapterInfo`: engines and doorbell caps.
        query fn adapter_info(self) -> AdapterInfo;
        /// The doorbell BAR (the OS maps pages of it into processes).
        query fn doorbell_bar(self) -> Arc<Shm>;
        /// Creates the GPU address space of a process.
        call fn create_address_space(self, process: ProcessId) -> Result<(), DdiError>
            [fails CreateAddressSpace];
        /// Destroys it (with whatever is still mapped).
        call fn destroy_address_space(self, process: ProcessId) -> Result<(), DdiError>;
        /// Maps `shm` at `va` in a process's address space, until the mapping is dropped.
        call fn map_gpu(self, process: ProcessId, va: u64, bytes: u64, shm: Arc<Shm>, writable: bool)
            -> Result<GpuMapping, DdiError>
            [fails MapGpu];
        /// Whether the GPU could make `access` to `[va, va+bytes)`: inside one mapping, and
        /// writable for a write.
        query fn vm_access(self, process: ProcessId, va: u64, bytes: u64, access: Access) -> Result<(), FaultKind>;
        /// `DxgkDdiCreateHwQueue`: the device adds the queue to its run list. The KMD allocates
        /// what is its own business (the context save area).
        call fn create_hw_queue(self, queue: HwQueueHandle, desc: QueueCreate) -> Result<(), DdiError>
            [log Ddi::CreateHwQueue(desc.context)] [fails CreateHwQueue];
        /// `DxgkDdiDestroyHwQueue`.
        call fn destroy_hw_queue(self, queue: HwQueueHandle) -> Result<(), DdiError>
            [log Ddi::DestroyHwQueue(queue)];
        /// `DxgkDdiConnectDoorbell` for a user-mode queue whose doorbell index in the process's
        /// page `process_page` is `index`. With a limited pool and no free physical doorbell, the
        /// KMD first victimizes one through `callback`.
        call fn connect_doorbell(
            self,
            queue: HwQueueHandle,
            process_page: u32,
            index: u32,
            callback: &mut dyn DisconnectCallback,
        ) -> Result<ConnectStep, DdiError>
            [log Ddi::ConnectDoorbell(queue)] [fails ConnectDoorbell];
        /// Connects a kernel-mode queue's doorbell (kernel doorbell `index` of BAR page 0).
        call fn connect_kernel_doorbell(self, queue: HwQueueHandle, index: u32) -> Result<(), DdiError>
            [log Ddi::ConnectDoorbell(queue)] [fails ConnectKernelDoorbell];
        /// `DxgkDdiSubmitCommand`: the kernel-mode queue's wptr was published as `wptr`; ring its
        /// doorbell.
        call fn submit_command(self, queue: HwQueueHandle, wptr: u64, fence_id: u64) -> Result<(), DdiError>
            [log Ddi::SubmitCommand { queue, fence_id }] [fails SubmitCommand];
        /// Where a user-mode queue with doorbell index `index` rings inside its doorbell CPU page,
        /// and how.
        query fn doorbell_ring(self, index: u32) -> (u64, RingMethod);
        /// Where queues of `engine` ring their process's aggregated doorbell page, when the
        /// device needs one: the engine's word's offset, and what the CPU ORs into it.
        query fn aggregated_doorbell(self, engine: EngineId) -> Option<(u64, u64)>;
        /// The device starts watching BAR page `page` as a process's aggregated doorbell.
        call fn watch_aggregated_page(self, page: u32) -> Result<(), DdiError>;
        /// It stops.
        call fn unwatch_aggregated_page(self, page: u32);
        /// BAR pages not for processes (the KMD's physical doorbell pool).
        query fn reserved_doorbell_pages(self) -> std::ops::Range<u32>;
        /// `DxgkDdiDisconnectDoorbell`.
        call fn disconnect_doorbell(self, queue: HwQueueHandle) -> Result<(), DdiError>
            [log Ddi::DisconnectDoorbell(queue)];
        /// `DxgkDdiNotifyWorkSubmission`.
        call fn notify_work_submission(self, queue: HwQueueHandle) -> Result<(), DdiError>
            [log Ddi::NotifyWorkSubmission(queue)];
        /// `DxgkDdiUpdateMonitoredValues` for a queue's progress fence.
        call fn update_monitored(self, queue: HwQueueHandle, value: u64) -> Result<(), DdiError>
            [log Ddi::UpdateMonitoredValue(queue, value)];
        /// `DxgkDdiSetPowerComponentFState`. Returns the state the engine is in afterwards (the
        /// device refuses F1 while work is pending).
        call fn set_power(self, engine: EngineId, state: PowerState, now: Time) -> Result<PowerState, DdiError>
            [log Ddi::SetPowerState(engine, state)];
        /// `DxgkDdiCreateNativeFence`: where the fence's CurrentValue and MonitoredValue live,
        /// and the id its notifications name.
        call fn create_native_fence(self, id: u64, current: (Arc<Shm>, u64), monitored: Word) -> Result<(), DdiError>
            [log Ddi::CreateNativeFence(id)] [fails CreateNativeFence];
        /// `DxgkDdiDestroyNativeFence`.
        call fn destroy_native_fence(self, id: u64)
            [log Ddi::DestroyNativeFence(id)];
        /// `DxgkDdiUpdateCurrentValuesFromCpu`: store a fence's CurrentValue and have the queues
        /// waiting on it re-check. (Logged by the OS, which knows the fence's local handle.)
        call fn update_current_value(self, id: u64, value: u64) -> Result<(), DdiError>;
        /// `DxgkDdiUpdateCurrentValuesFromCpu` with `NotificationOnly`: a shared CurrentValue
        /// moved on another adapter; queues waiting on fences re-check.
        call fn notify_current_values(self);
        /// `DxgkddiSuspendContext`: take the context's queues off the scheduler's list ("KMD
        /// preempts the context"), each queue by a preemption request: one that holds no slot or
        /// may stop where it stands is answered at once; one that may not (its engine's
        /// preemption granularity) runs on to the next point it may, and its answer is owed, as a
        /// [`Notification::Preempted`], which the OS times out like any other request.
        call fn suspend_context(self, context: ContextHandle, queues: &[HwQueueHandle], now: Time)
            -> Result<Vec<Suspended>, DdiError>
            [log Ddi::SuspendContext(context)];
        /// `DxgkddiResumeContext`: put them back.
        call fn resume_context(self, context: ContextHandle, queues: &[HwQueueHandle]) -> Result<(), DdiError>
            [log Ddi::ResumeContext(context)];
        /// `DxgkDdiUpdateNativeFenceLogs`: make the queue's pending log writes visible.
        call fn flush_fence_logs(self, queue: HwQueueHandle)
            [log Ddi::UpdateNativeFenceLogs(queue)];
        /// The next interrupt the device raised, translated (the ISR drains these).
        call fn poll_notification(self) -> Option<Notification>
            [via poll_with_injections];
        /// Current engine power state.
        query fn power(self, engine: EngineId) -> PowerState;
        /// Whether the queue has work the engine has not finished.
        query fn queue_has_work(self, queue: HwQueueHandle) -> bool;
        /// The device's view of a queue.
        query fn queue_state(self, queue: HwQueueHandle) -> Option<QueueState>;
        /// GPU mappings alive on the device (for leak checks).
        query fn live_mappings(self) -> usize;
        /// The physical doorbell the device has the queue bound to now (read-only, for the OS's
        /// doorbell query).
        query fn physical_doorbell(self, queue: HwQueueHandle) -> Option<abi::port::PhysicalDoorbell>;
        /// `DxgkDdiPreemptCommand` (amdgpu MES `SUSPEND`): asks the engine to take `queue` off its
        /// slot at the next point its preemption granularity allows, state saved, and to keep it
        /// off the run list until resumed. Returns the request's ticket; the answer is a
        /// [`Notification::Preempted`] (raised at once when the queue can stop where it stands).
        call fn preempt_queue(self, queue: HwQueueHandle, now: Time) -> Result<u64, DdiError>
            [log Ddi::PreemptQueue(queue)] [fails PreemptQueue("a failed request starts recovery at once")];
        /// `DxgkDdiResetEngine`: resets one engine. The queues that owe an answer to a preemption
        /// request hang; every other queue there keeps its work.
        call fn reset_engine(self, engine: EngineId, now: Time) -> Result<EngineResetOutcome, DdiError>
            [log Ddi::ResetEngine(engine)]
            [fails ResetEngine("a failed engine reset escalates to an adapter reset")]
            [then misbehave];
        /// amdgpu's per-queue reset (through the scheduling firmware): `queue` hangs with `why`
        /// (the OS's reason: a preemption it would not answer, or the hang timer), its neighbours
        /// are not touched. Returns the last progress value ("fence ID") the reset aborted.
        call fn reset_queue(self, queue: HwQueueHandle, why: FaultKind, now: Time)
            -> Result<QueueResetOutcome, DdiError>
            [log Ddi::ResetQueue(queue)]
            [fails ResetQueue("a failed per-queue reset escalates to an adapter reset")]
            [then misbehave];
        /// The device time `queue` has spent executing its work in a hardware slot, in all (it
        /// only grows): not the time it waited for a slot, was held off one, or only re-checked a
        /// `WAIT` that did not pass. The OS's hang timer takes differences of it. `None`: the
        /// device does not say, and the hang timer catches only a queue that does not answer its
        /// preemption request.
        query fn queue_run_time(self, queue: HwQueueHandle) -> Option<Duration> = { None };
        /// Whether `queue` holds one of its engine's hardware slots now (the OS's engine
        /// watchdog asks only a stalled engine's slot holders to preempt). A device that does
        /// not say answers `true`: every queue with work is asked, and one without a slot
        /// answers at once.
        query fn queue_in_slot(self, queue: HwQueueHandle) -> bool = { true };
        /// Moves the allocation at `[va, va + bytes)` of `process` to `domain`, updates the GPU
        /// page tables and invalidates the TLB (spec 001 migration, step 2; Windows' paging
        /// operation). The caller has preempted every queue of the process.
        call fn migrate_allocation(
            self,
            process: ProcessId,
            va: u64,
            bytes: u64,
            domain: abi::port::MemoryDomain,
        ) -> Result<(), DdiError>
            [log Ddi::MigrateAllocation { va, domain }]
            [fails MigrateAllocation("a failed move leaves the buffer unmapped")];
        /// `DxgkDdiResetFromTimeout`: resets the adapter; every queue's state is lost. Returns the
        /// queues that hung.
        call fn reset_from_timeout(self, now: Time) -> Result<Vec<HwQueueHandle>, DdiError>
            [log Ddi::ResetFromTimeout];
        /// `DxgkDdiRestartFromTimeout`: the adapter runs again after a reset.
        call fn restart_from_timeout(self) -> Result<(), DdiError>
            [log Ddi::RestartFromTimeout];
        /// Where a kernel-mode queue held off its engine (an answered preemption) stands in its
        /// ring: what the preemption interrupt's last completed and preempted fence IDs tell the
        /// OS on Windows.
        query fn held_position(self, queue: HwQueueHandle) -> Result<HeldPosition, DdiError>;
        /// Drops a held kernel-mode queue's unstarted work from its hardware queue, down to
        /// `wptr` (spec 003: the OS resubmits the commands a preemption took out of the hardware
        /// queue).
        call fn take_back(self, queue: HwQueueHandle, wptr: u64, now: Time) -> Result<(), DdiError>
            [log Ddi::TakeBack { queue, wptr }] [fails TakeBack];
        /// `DxgkDdiOpenNativeFence`: process-local handle `local` to the fence with global id `id`
        /// (the creator's own local handle too, for a shared fence). The default keeps nothing.
        call fn open_native_fence(self, id: u64, local: abi::NativeFenceHandle) -> Result<(), DdiError>
            [log Ddi::OpenNativeFence(local)]
            = { Ok(()) };
        /// `DxgkDdiCloseNativeFence`: the local handle is gone (the global fence may live on).
        call fn close_native_fence(self, local: abi::NativeFenceHandle)
            [log Ddi::CloseNativeFence(local)]
            = {};
        /// `DxgkDdiSetNativeFenceLogBuffer`: the queue's log of `kind` is now `log` (set at queue
        /// creation, and again each time the OS recreates a log).
        call fn set_native_fence_log_buffer(
            self,
            queue: HwQueueHandle,
            kind: abi::fence_log::FenceLogType,
            log: Arc<Shm>,
        ) -> Result<(), DdiError>
            [log Ddi::SetNativeFenceLogBuffer(queue)]
            [fails SetNativeFenceLogBuffer("a log that cannot be replaced keeps the old one")]
            = { Err(unsupported("log", "fence log buffer", "native fence logs")) };
        /// `DxgkDdiUpdateMonitoredValues`: a batch of `(fence id, MonitoredValue)`; on return every
        /// CurrentValue a core reads was written by the device after it observed the new values
        /// (`abi::protocol::monitored_barrier`), so the OS resamples. (Logged by the OS, which
        /// knows each fence's local handle.)
        call fn update_monitored_values(self, batch: &[(u64, u64)]) -> Result<(), DdiError>
            = { Err(unsupported("fences", "update monitored values", "native fences")) };
        /// Adapter initialization: the KMD queries the OS's features (`IsFeatureEnabled`,
        /// `QueryFeatureInterface`) before it advertises caps. The default ignores them.
        call fn query_features(self, os: &abi::port::OsFeatures) = {};
        /// `DXGK_NATIVE_FENCE_CAPS` (with the `DXGK_VIDSCHCAPS` bits). The default: supported as
        /// [`AdapterInfo::native_fences`] says, one cache line per fence, nothing optional.
        query fn native_fence_caps(self) -> abi::port::NativeFenceCaps = {
            abi::port::NativeFenceCaps {
                supported: self.adapter_info().native_fences,
                optimized_interrupt: false,
                map_to_gpu_system_process: false,
                current_value_stride: 64,
                monitored_value_stride: 64,
            }
        };
        /// `DxgkDdiCreateNativeFence` with `CurrentValueSystemProcessGpuVa` and
        /// `MonitoredValueSystemProcessGpuVa` (`system`), for a KMD with `MapToGpuSystemProcess`.
        /// The default ignores the VAs.
        call fn create_native_fence_in_system_process(
            self,
            id: u64,
            current: (Arc<Shm>, u64),
            monitored: Word,
            system: (u64, u64),
        ) -> Result<(), DdiError>
            [log Ddi::CreateNativeFence(id)] [fails_as CreateNativeFence]
            = { self.create_native_fence(id, current, monitored) };
        /// Reads a 64-bit word through `process`'s GPU address space (the system process
        /// included), as the device would: for tests and tools. `None` where the device could not.
        query fn read_gpu_u64(self, process: ProcessId, va: u64) -> Option<u64> = { None };
        /// `D3DKMDT_FENCESTORAGESURFACEDATA` (spec 002 "DDI to support placement of native fence
        /// values in local memory"): the memory segments a fence of `kind` keeps its CurrentValue
        /// and MonitoredValue in. The default: system memory for both.
        query fn native_fence_storage(self, kind: abi::port::NativeFenceType)
            -> (abi::port::MemoryDomain, abi::port::MemoryDomain)
            = { (abi::port::MemoryDomain::System, abi::port::MemoryDomain::System) };
        /// Maps the process's doorbell BAR page `page` into its own GPU address space at `va`, so
        /// its queues can ring each other's doorbells from the GPU (spec 001). Refused where a
        /// GPU store cannot ring a doorbell (the default).
        call fn map_doorbell_page(self, process: ProcessId, va: u64, page: u32) -> Result<GpuMapping, DdiError>
            = { Err(unsupported("page", "doorbell page", "doorbells rung from the GPU")) };
        /// Maps the process's aggregated doorbell page (BAR page `page`) into its own GPU address
        /// space at `va` (spec 001: "the kernel driver will map a page of aggregated doorbell space
        /// into each GPUVM space"), so a queue that submits to another from the GPU rings it as
        /// the CPU would. Refused where a GPU store cannot ring it (the default).
        call fn map_aggregated_page(self, process: ProcessId, va: u64, page: u32) -> Result<GpuMapping, DdiError>
            = { Err(unsupported("page", "aggregated doorbell page", "aggregated doorbells rung from the GPU")) };
        /// The device's own number for `queue` (the virtual GPU's firmware queue id), for tools
        /// that observe the device directly (the simulator); `None` if the KMD has none.
        query fn device_queue_id(self, queue: HwQueueHandle) -> Option<u64> = { None };
    }
    } };

    // One grammar, parsed once: each DDI becomes a bracketed row the parts below pick from.
    (@parse $mode:ident records { $($records:tt)* } ddis { $(
        $(#[$doc:meta])*
        $kind:ident fn $name:ident($s:ident $(, $arg:ident: $ty:ty)* $(,)?) $(-> $ret:ty)?
            $([log $log:expr])?
            $([fails $fails:ident $(($why:literal))?])?
            $([fails_as $fails_as:ident])?
            $([then $then:ident])?
            $([via $via:ident])?
            $(= $body:block)?;
    )* }) => {
        crate::ddis::ddi_table! { @$mode [$($records)*] $(
            [$kind $name $s] [$($arg: $ty),*] [$($ret)?] [$(#[$doc])*]
            [$($log)?] [$($fails $(($why))?)?] [$($fails_as)?] [$($then)?] [$($via)?] [$($body)?]
        )* }
    };

    // `DdiKind` and `Ddi` (here).
    (@kinds [$($records:tt)*] $(
        [$kind:ident $name:ident $s:ident] $args:tt $ret:tt $doc:tt
        $log:tt [$($fails:ident $(($why:literal))?)?] $fails_as:tt $then:tt $via:tt $body:tt
    )*) => {
        /// A DDI call from the OS into the KMD, as the kernel's trace records it
        /// ([`crate::trace::Event::Ddi`]).
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub enum Ddi { $($records)* }

        /// The DDIs that can fail on purpose, for fault injection ([`crate::ddi::DdiFault`]).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum DdiKind { $($(
            #[doc = concat!("[`Kmd::", stringify!($name), "`](crate::ddi::Kmd::", stringify!($name), ")"
                $(, " (", $why, ")")?, ".")]
            $fails,
        )?)* }
    };

    // The trait (in `ddi.rs`).
    (@kmd [$($records:tt)*] $(
        [$kind:ident $name:ident $s:ident] [$($arg:ident: $ty:ty),*] [$($ret:ty)?] [$(#[$doc:meta])*]
        $log:tt $fails:tt $fails_as:tt $then:tt $via:tt [$($body:block)?]
    )*) => {
        /// The DDIs the OS calls (declared in `crate::ddis`, the DDI table).
        pub trait Kmd: Send { $(
            crate::ddis::ddi_table! { @method [$kind $s] $(#[$doc])* fn $name($($arg: $ty),*) [$($ret)?] $($body)? }
        )* }
    };
    (@method [query $s:ident] $(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),*) [$($ret:ty)?]) => {
        $(#[$doc])* fn $name(&$s, $($arg: $ty),*) $(-> $ret)?;
    };
    (@method [call $s:ident] $(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),*) [$($ret:ty)?]) => {
        $(#[$doc])* fn $name(&mut $s, $($arg: $ty),*) $(-> $ret)?;
    };
    (@method [query $s:ident] $(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),*) [$($ret:ty)?] $body:block) => {
        $(#[$doc])* #[allow(unused_variables)] fn $name(&$s, $($arg: $ty),*) $(-> $ret)? $body
    };
    (@method [call $s:ident] $(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),*) [$($ret:ty)?] $body:block) => {
        $(#[$doc])* #[allow(unused_variables)] fn $name(&mut $s, $($arg: $ty),*) $(-> $ret)? $body
    };

    // The decorator's forwarding (in `ddi.rs`): record, gate, forward, then or via.
    (@traced [$($records:tt)*] $(
        [$kind:ident $name:ident $s:ident] [$($arg:ident: $ty:ty),*] [$($ret:ty)?] $doc:tt
        $log:tt [$($fails:ident $(($why:literal))?)?] [$($fails_as:ident)?] $then:tt $via:tt $body:tt
    )*) => {
        impl Kmd for Traced { $(
            crate::ddis::ddi_table! {
                @forward [$kind] fn $name($($arg: $ty),*) [$($ret)?] $log [$($fails)? $($fails_as)?] $then $via
            }
        )* }
    };
    (@forward [query] fn $name:ident($($arg:ident: $ty:ty),*) [$($ret:ty)?] [] [] [] []) => {
        fn $name(&self, $($arg: $ty),*) $(-> $ret)? {
            self.inner.$name($($arg),*)
        }
    };
    (@forward [call] fn $name:ident($($arg:ident: $ty:ty),*) [$($ret:ty)?] [$($log:expr)?] [$($gate:ident)?] $then:tt $via:tt) => {
        fn $name(&mut self, $($arg: $ty),*) $(-> $ret)? {
            $(self.log($log);)?
            $(self.gate(DdiKind::$gate)?;)?
            crate::ddis::ddi_table!(@call self.$name($($arg),*) $then $via)
        }
    };
    (@call $self:ident.$name:ident($($arg:ident),*) [] []) => { $self.inner.$name($($arg),*) };
    (@call $self:ident.$name:ident($($arg:ident),*) [$then:ident] []) => {{
        let out = $self.inner.$name($($arg),*);
        $self.$then(out)
    }};
    (@call $self:ident.$name:ident($($arg:ident),*) [] [$via:ident]) => { $self.$via($($arg),*) };
}
pub(crate) use ddi_table;

ddi_table!(kinds);
