//! Command buffers: one typed method per packet.

use abi::fence_log::FenceLogType;
use abi::packet::{DataWidth, LoggedOp, Packet};

/// A packet stream under construction. The progress fence is not part of it: [`crate::Queue::submit`]
/// appends it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommandBuffer {
    words: Vec<u32>,
    /// Logged fence operations: (dword index of the log-entry field, which log). The queue
    /// fills the entries in at submission, since it owns the log's progression.
    logs: Vec<(usize, FenceLogType)>,
    /// Unlogged native fence signals ([`CommandBuffer::signal_fence`]): the packet's dword
    /// range, the fence's VA and the value. A user-mode queue of a device with the optimized
    /// interrupt logs them at submission ([`CommandBuffer::with_signals_logged`]).
    fence_signals: Vec<(std::ops::Range<usize>, u64, u64)>,
}

impl CommandBuffer {
    /// An empty command buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends any packet.
    pub fn packet(&mut self, p: Packet) -> &mut Self {
        p.encode(&mut self.words);
        self
    }

    /// `NOP` of `dwords` dwords.
    pub fn nop(&mut self, dwords: u16) -> &mut Self {
        self.packet(Packet::Nop { dwords: dwords.max(1) })
    }

    /// `WRITE_DATA`, 32-bit.
    pub fn write_u32(&mut self, va: u64, value: u32) -> &mut Self {
        self.packet(Packet::WriteData { width: DataWidth::U32, va, value: value as u64 })
    }

    /// Submits work another queue of this process prepared ([`crate::Queue::prepare`]), from
    /// the GPU: writes its wptr word, then its doorbell, then (on a device that needs it) its
    /// engine's aggregated doorbell word (spec 001: "the GPU [can] submit work to itself").
    /// The engine runs packets in order, so the firmware that sees a doorbell also sees the
    /// wptr.
    pub fn kick(&mut self, k: &GpuKick) -> &mut Self {
        self.write_u64(k.wptr_va, k.wptr).write_u64(k.doorbell_va, k.wptr);
        if let Some(va) = k.aggregated_va {
            // Any non-zero value rings it; wptr is past the prepared work, so it is non-zero.
            self.write_u64(va, k.wptr.max(1));
        }
        self
    }

    /// A `WAIT` for each point `USERQ_WAIT` answered ([`crate::Queue::userq_wait`]).
    pub fn wait_points(&mut self, points: &[abi::port::WaitPoint]) -> &mut Self {
        for p in points {
            self.wait(p.va, p.value);
        }
        self
    }

    /// `WRITE_DATA`, 64-bit.
    pub fn write_u64(&mut self, va: u64, value: u64) -> &mut Self {
        self.packet(Packet::WriteData { width: DataWidth::U64, va, value })
    }

    /// `COPY`.
    pub fn copy(&mut self, src: u64, dst: u64, bytes: u64) -> &mut Self {
        self.packet(Packet::Copy { src, dst, bytes })
    }

    /// `FILL`.
    pub fn fill(&mut self, dst: u64, bytes: u64, pattern: u32) -> &mut Self {
        self.packet(Packet::Fill { dst, bytes, pattern })
    }

    /// `TIMESTAMP`.
    pub fn timestamp(&mut self, va: u64) -> &mut Self {
        self.packet(Packet::Timestamp { va })
    }

    /// `INDIRECT_BUFFER`: execute `dwords` dwords of packets at `va`.
    pub fn indirect(&mut self, va: u64, dwords: u32) -> &mut Self {
        self.packet(Packet::IndirectBuffer { va, dwords, vmid: 0 })
    }

    /// `SIGNAL`.
    pub fn signal(&mut self, va: u64, value: u64) -> &mut Self {
        self.packet(Packet::Signal { va, value })
    }

    /// `SIGNAL` a native fence: write its CurrentValue, and interrupt only if a CPU waits for
    /// it (CurrentValue > MonitoredValue).
    ///
    /// On a user-mode queue of a device with the optimized signaled interrupt
    /// ([`crate::Device::native_fence_caps`]) it is submitted as [`Self::signal_fence_logged`]:
    /// there the interrupt names the queue and the OS reads which fences were signalled from
    /// the queue's signal log (spec 002), so a signal not logged would cost it a scan of every
    /// fence.
    pub fn signal_fence(&mut self, fence: &crate::NativeFence, value: u64) -> &mut Self {
        let start = self.words.len();
        self.packet(Packet::SignalFence { va: fence.va(), value });
        self.fence_signals.push((start..self.words.len(), fence.va(), value));
        self
    }

    /// `WAIT` until a native fence reaches `value`: blocks only this queue, without the CPU
    /// on a user-mode queue (a kernel-mode queue's scheduler resolves it on the CPU).
    pub fn wait_fence(&mut self, fence: &crate::NativeFence, value: u64) -> &mut Self {
        self.packet(Packet::Wait { va: fence.va(), value })
    }

    /// [`Self::signal_fence`], then a fence log entry (`SignalExecuted`, with the GPU time) in
    /// the queue's signal log. User-mode queues only: kernel-mode queues have no fence log.
    pub fn signal_fence_logged(&mut self, fence: &crate::NativeFence, value: u64) -> &mut Self {
        self.logged(LoggedOp::SignalFence, fence.va(), value, FenceLogType::Signal)
    }

    /// [`Self::wait_fence`], then a fence log entry (`WaitUnblocked`, with when the engine saw
    /// the wait and when it was released) in the queue's wait log.
    pub fn wait_fence_logged(&mut self, fence: &crate::NativeFence, value: u64) -> &mut Self {
        self.logged(LoggedOp::Wait, fence.va(), value, FenceLogType::Wait)
    }

    fn logged(&mut self, op: LoggedOp, va: u64, value: u64, log: FenceLogType) -> &mut Self {
        self.packet(Packet::Logged { op, va, value, position: 0 });
        self.logs.push((self.words.len() - 1, log));
        self
    }

    /// The logged operations' entry fields (dword index, log).
    pub(crate) fn log_fields(&self) -> &[(usize, FenceLogType)] {
        &self.logs
    }

    /// Whether it holds unlogged native fence signals ([`Self::signal_fence`]).
    pub(crate) fn has_fence_signals(&self) -> bool {
        !self.fence_signals.is_empty()
    }

    /// The stream with every [`Self::signal_fence`] written as a logged signal, into `out`;
    /// `fields` gets every log-entry field of it (the buffer's own logged operations, moved
    /// by the dwords inserted before them, and the new ones), in stream order.
    pub(crate) fn with_signals_logged(&self, out: &mut Vec<u32>, fields: &mut Vec<(usize, FenceLogType)>) {
        out.clear();
        fields.clear();
        let mut logs = self.logs.iter().copied().peekable();
        let mut from = 0;
        // The buffer's own fields in `[from, end)`, moved to where `out` puts those words.
        let mut carry = |out: &Vec<u32>, from: usize, end: usize, fields: &mut Vec<_>| {
            let moved = out.len() - from;
            while let Some((at, log)) = logs.next_if(|&(at, _)| at < end) {
                fields.push((at + moved, log));
            }
        };
        for (range, va, value) in &self.fence_signals {
            carry(out, from, range.start, fields);
            out.extend_from_slice(&self.words[from..range.start]);
            Packet::Logged { op: LoggedOp::SignalFence, va: *va, value: *value, position: 0 }.encode(out);
            fields.push((out.len() - 1, FenceLogType::Signal));
            from = range.end;
        }
        carry(out, from, usize::MAX, fields);
        out.extend_from_slice(&self.words[from..]);
    }

    /// `WAIT` until `*va >= value`.
    pub fn wait(&mut self, va: u64, value: u64) -> &mut Self {
        self.packet(Packet::Wait { va, value })
    }

    /// `DISPATCH`: run the program binary at `program` over `grid` workgroups of `group`
    /// threads, with its argument buffer at `args`.
    pub fn dispatch(&mut self, program: u64, grid: [u32; 3], group: [u32; 3], args: u64) -> &mut Self {
        self.packet(Packet::Dispatch { program, grid, group, args })
    }

    /// `INTERRUPT`.
    pub fn interrupt(&mut self, id: u32) -> &mut Self {
        self.packet(Packet::Interrupt { id })
    }

    /// `SYNTHETIC`: occupies the engine for `ns` nanoseconds of device time, writing nothing
    /// (the simulator's synthetic kernel).
    pub fn synthetic(&mut self, ns: u64) -> &mut Self {
        self.packet(Packet::Synthetic { ns })
    }

    /// Raw dwords, unchecked: for tests that feed the device malformed streams.
    pub fn raw(&mut self, words: &[u32]) -> &mut Self {
        self.words.extend_from_slice(words);
        self
    }

    /// The encoded stream.
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// Length in dwords.
    pub fn len(&self) -> usize {
        self.words.len()
    }

    /// Whether it holds no packets.
    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    /// Empties it, keeping its capacity.
    pub fn clear(&mut self) {
        self.words.clear();
        self.logs.clear();
        self.fence_signals.clear();
    }
}

/// What another queue writes from the GPU to submit work [`crate::Queue::prepare`]d on this one:
/// `wptr` to the wptr word, then `wptr` to the doorbell ([`CommandBuffer::kick`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuKick {
    /// GPU VA of the target queue's wptr word.
    pub wptr_va: u64,
    /// GPU VA of the target queue's doorbell (its process's doorbell page, mapped in its own
    /// address space).
    pub doorbell_va: u64,
    /// GPU VA of its engine's word of the aggregated doorbell, on a device that misses rings
    /// of queues without a hardware slot (spec 001: the UMD "update[s] the doorbell and wptr
    /// as normal and then write[s] to the aggregated doorbell as well").
    pub aggregated_va: Option<u64>,
    /// The wptr that covers the prepared work.
    pub wptr: u64,
    /// The prepared work's progress value (wait for it like any other).
    pub value: u64,
}
