//! Packet encoding, version 1.
//!
//! A command stream is a sequence of little-endian 32-bit words (dwords). Every packet starts
//! with a one-dword header:
//!
//! | bits   | field    | meaning                                                        |
//! |--------|----------|----------------------------------------------------------------|
//! | 0..16  | `len`    | packet length in dwords, header included; at least 1           |
//! | 16..24 | `opcode` | an [`Opcode`]                                                   |
//! | 24..28 | `version`| [`PACKET_VERSION`] (1)                                          |
//! | 28..32 | `flags`  | per opcode; 0 unless listed below                               |
//!
//! 64-bit fields are two dwords, low word first, and need only dword alignment. The body of
//! each packet, after the header (`va`, `src`, `dst` are GPU virtual addresses in the
//! executing queue's address space):
//!
//! | opcode | name              | dwords | body                                          |
//! |--------|-------------------|--------|-----------------------------------------------|
//! | 0      | `NOP`             | ≥ 1    | ignored (any length: used to pad to the ring's end) |
//! | 1      | `WRITE_DATA`      | 6      | width (4 or 8 bytes), va:u64, value:u64       |
//! | 2      | `COPY`            | 7      | src:u64, dst:u64, bytes:u64                   |
//! | 3      | `FILL`            | 6      | dst:u64, bytes:u64, pattern:u32               |
//! | 4      | `TIMESTAMP`       | 3      | va:u64 — writes the GPU clock (ns) as u64     |
//! | 5      | `INDIRECT_BUFFER` | 5      | va:u64, dwords:u32, vmid:u32                  |
//! | 6      | `SIGNAL`          | 5      | va:u64, value:u64 — 64-bit store              |
//! | 7      | `WAIT`            | 5      | va:u64, value:u64 — block until `*va >= value`|
//! | 8      | `PROGRESS_FENCE`  | 3      | value:u64 — the queue's own progress fence    |
//! | 9      | `INTERRUPT`       | 2      | id:u32 — raise a user interrupt               |
//! | 10     | `DISPATCH`        | 11     | program:u64, grid x,y,z:u32, group x,y,z:u32, args:u64 |
//!
//! Flags: `SIGNAL` may carry [`FLAG_NATIVE_FENCE`]: `va` is then a native fence's
//! CurrentValue, and after the store the engine makes the conditional-interrupt check against
//! the fence's MonitoredValue (spec 002). That is [`Packet::SignalFence`]. `SIGNAL` and `WAIT`
//! may carry [`FLAG_LOG`]: one more dword, the position in the queue's fence log to write once
//! the operation completes (`crate::fence_log`: the UMD's running count of logged operations;
//! the engine places it in the log); the packet is then 6 dwords ([`Packet::Logged`]).
//! Every other flag bit is reserved and refused.
//!
//! `DISPATCH` runs the program binary at `program` ([`crate::isa`]) over a grid of `grid`
//! workgroups of `group` threads each (every dimension at least 1, at most 1024 threads per
//! group), with `args` the GPU VA of its argument buffer (64-bit slots). It is the one packet
//! that may take many engine steps: the engine runs it in bounded slices, saving its state in
//! the queue's context save area between them, and the queue moves past it when every
//! workgroup has finished.
//!
//! `INDIRECT_BUFFER` executes `dwords` dwords at `va` and then returns to the ring; an indirect
//! buffer may not contain another (depth 1, as on most hardware). Its `vmid` selects the address
//! space of the indirect buffer and is honoured only on a privileged (kernel) queue; a user
//! queue must leave it 0. `PROGRESS_FENCE` writes memory that the queue itself maps read-only:
//! only this packet can advance it.
//!
//! [`Packet::decode`] is total: any dword slice yields a packet or a [`DecodeError`], never a
//! panic, because the words come from memory another actor writes.

use thiserror::Error;

/// The packet encoding version this crate speaks.
pub const PACKET_VERSION: u32 = 1;
/// Longest packet in dwords (the 16-bit length field).
pub const MAX_PACKET_DWORDS: usize = u16::MAX as usize;
/// `SIGNAL` flag: the address is a native fence's CurrentValue.
pub const FLAG_NATIVE_FENCE: u32 = 1;
/// `SIGNAL`/`WAIT` flag: after the operation, write a fence log entry. The packet grows by one
/// dword, the log position ([`crate::fence_log::locate`] places it; the engine refuses one it
/// cannot).
pub const FLAG_LOG: u32 = 2;

/// Longest fixed-size packet in dwords: a decoder never needs more to decode a non-NOP.
pub const MAX_FIXED_PACKET_DWORDS: usize = 11;

/// Packet opcodes of version 1.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// No operation; any length.
    Nop = 0,
    /// Write a 32- or 64-bit immediate.
    WriteData = 1,
    /// Copy bytes between two virtual addresses.
    Copy = 2,
    /// Fill bytes with a repeated 32-bit pattern.
    Fill = 3,
    /// Write the GPU clock.
    Timestamp = 4,
    /// Execute a command buffer in memory.
    IndirectBuffer = 5,
    /// Write a 64-bit value (a fence signal).
    Signal = 6,
    /// Block the queue until a 64-bit value reaches a threshold.
    Wait = 7,
    /// Write the queue's progress fence.
    ProgressFence = 8,
    /// Raise a user interrupt.
    Interrupt = 9,
    /// Run a compute program.
    Dispatch = 10,
    /// Occupy the engine for a given device time without executing anything (the
    /// simulator's synthetic dispatch: one whose duration is given, not interpreted).
    Synthetic = 11,
}

impl Opcode {
    /// Decodes an opcode byte.
    pub const fn from_u8(v: u8) -> Option<Opcode> {
        Some(match v {
            0 => Opcode::Nop,
            1 => Opcode::WriteData,
            2 => Opcode::Copy,
            3 => Opcode::Fill,
            4 => Opcode::Timestamp,
            5 => Opcode::IndirectBuffer,
            6 => Opcode::Signal,
            7 => Opcode::Wait,
            8 => Opcode::ProgressFence,
            9 => Opcode::Interrupt,
            10 => Opcode::Dispatch,
            11 => Opcode::Synthetic,
            _ => return None,
        })
    }

    /// The fixed length in dwords, or `None` for `NOP` (any length) and reserved opcodes.
    pub const fn fixed_dwords(self) -> Option<usize> {
        match self {
            Opcode::WriteData | Opcode::Fill => Some(6),
            Opcode::Copy => Some(7),
            Opcode::Timestamp | Opcode::ProgressFence | Opcode::Synthetic => Some(3),
            Opcode::IndirectBuffer | Opcode::Signal | Opcode::Wait => Some(5),
            Opcode::Interrupt => Some(2),
            Opcode::Dispatch => Some(11),
            Opcode::Nop => None,
        }
    }

    /// The name used in the spec tables and messages.
    pub const fn name(self) -> &'static str {
        match self {
            Opcode::Nop => "NOP",
            Opcode::WriteData => "WRITE_DATA",
            Opcode::Copy => "COPY",
            Opcode::Fill => "FILL",
            Opcode::Timestamp => "TIMESTAMP",
            Opcode::IndirectBuffer => "INDIRECT_BUFFER",
            Opcode::Signal => "SIGNAL",
            Opcode::Wait => "WAIT",
            Opcode::ProgressFence => "PROGRESS_FENCE",
            Opcode::Interrupt => "INTERRUPT",
            Opcode::Dispatch => "DISPATCH",
            Opcode::Synthetic => "SYNTHETIC",
        }
    }
}

/// A packet header word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header(pub u32);

impl Header {
    /// Builds a version-1 header. `dwords` must fit 16 bits and be at least 1.
    pub const fn new(opcode: Opcode, dwords: u16) -> Header {
        Header((dwords as u32) | ((opcode as u32) << 16) | (PACKET_VERSION << 24))
    }
    /// The same header with `flags` set.
    pub const fn with_flags(self, flags: u32) -> Header {
        Header(self.0 | ((flags & 0xf) << 28))
    }
    /// Length in dwords, header included.
    pub const fn dwords(self) -> usize {
        (self.0 & 0xffff) as usize
    }
    /// The raw opcode byte.
    pub const fn opcode_byte(self) -> u8 {
        (self.0 >> 16) as u8
    }
    /// The version nibble.
    pub const fn version(self) -> u32 {
        (self.0 >> 24) & 0xf
    }
    /// The flags nibble.
    pub const fn flags(self) -> u32 {
        self.0 >> 28
    }
    /// Checks version, flags and length, and decodes the opcode.
    #[inline]
    pub const fn check(self) -> Result<Opcode, DecodeError> {
        if self.version() != PACKET_VERSION {
            return Err(DecodeError::BadVersion { header: self.0, version: self.version() });
        }
        let Some(op) = Opcode::from_u8(self.opcode_byte()) else {
            return Err(DecodeError::UnknownOpcode { opcode: self.opcode_byte() });
        };
        let allowed = match op {
            Opcode::Signal => FLAG_NATIVE_FENCE | FLAG_LOG,
            Opcode::Wait => FLAG_LOG,
            _ => 0,
        };
        if self.flags() & !allowed != 0 {
            return Err(DecodeError::ReservedFlags { header: self.0, flags: self.flags() });
        }
        if self.dwords() == 0 {
            return Err(DecodeError::ZeroLength { opcode: op.name() });
        }
        // A logged SIGNAL or WAIT carries one more dword: the log position.
        let extra = (self.flags() & FLAG_LOG != 0) as usize;
        match op.fixed_dwords() {
            Some(n) if n + extra != self.dwords() => {
                Err(DecodeError::BadLength { opcode: op.name(), len: self.dwords(), expected: n + extra })
            }
            _ => Ok(op),
        }
    }
}

/// Width of a `WRITE_DATA`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataWidth {
    /// 32-bit store (the low half of `value`).
    U32,
    /// 64-bit store.
    U64,
}

impl DataWidth {
    /// Bytes written.
    pub const fn bytes(self) -> u64 {
        match self {
            DataWidth::U32 => 4,
            DataWidth::U64 => 8,
        }
    }
}

/// The operation of a [`Packet::Logged`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoggedOp {
    /// A plain `SIGNAL`.
    Signal,
    /// A native-fence `SIGNAL`.
    SignalFence,
    /// A `WAIT`.
    Wait,
}

/// A decoded packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Packet {
    /// `NOP` of `dwords` dwords (header included).
    Nop {
        /// Total length.
        dwords: u16,
    },
    /// `WRITE_DATA`.
    WriteData {
        /// Store width.
        width: DataWidth,
        /// Destination.
        va: u64,
        /// Value (truncated to 32 bits for [`DataWidth::U32`]).
        value: u64,
    },
    /// `COPY`.
    Copy {
        /// Source.
        src: u64,
        /// Destination.
        dst: u64,
        /// Byte count.
        bytes: u64,
    },
    /// `FILL`.
    Fill {
        /// Destination.
        dst: u64,
        /// Byte count.
        bytes: u64,
        /// Repeated little-endian pattern.
        pattern: u32,
    },
    /// `TIMESTAMP`.
    Timestamp {
        /// Destination of the u64 GPU time in ns.
        va: u64,
    },
    /// `INDIRECT_BUFFER`.
    IndirectBuffer {
        /// Command buffer address.
        va: u64,
        /// Its length in dwords.
        dwords: u32,
        /// Address space (privileged queues only; 0 otherwise).
        vmid: u32,
    },
    /// `SIGNAL`.
    Signal {
        /// Destination.
        va: u64,
        /// Value stored.
        value: u64,
    },
    /// `SIGNAL` with [`FLAG_NATIVE_FENCE`]: write a native fence's CurrentValue, then check
    /// its MonitoredValue and interrupt if `value` is above it.
    SignalFence {
        /// The fence's CurrentValue.
        va: u64,
        /// Value stored.
        value: u64,
    },
    /// `SIGNAL` or `WAIT` with [`FLAG_LOG`]: the operation, then a fence log entry.
    Logged {
        /// The operation.
        op: LoggedOp,
        /// GPU VA of the fence value.
        va: u64,
        /// Value signalled or waited for.
        value: u64,
        /// Log position to write (the UMD's progression, [`crate::fence_log`]).
        position: u32,
    },
    /// `WAIT`.
    Wait {
        /// Watched address.
        va: u64,
        /// Threshold: the queue resumes when `*va >= value`.
        value: u64,
    },
    /// `PROGRESS_FENCE`.
    ProgressFence {
        /// The completed progress value.
        value: u64,
    },
    /// `INTERRUPT`.
    Interrupt {
        /// User-chosen id delivered with the interrupt.
        id: u32,
    },
    /// `DISPATCH`.
    Dispatch {
        /// GPU VA of the program binary.
        program: u64,
        /// Workgroups per dimension.
        grid: [u32; 3],
        /// Threads per workgroup per dimension.
        group: [u32; 3],
        /// GPU VA of the argument buffer.
        args: u64,
    },
    /// `SYNTHETIC`: the engine is busy for `ns` nanoseconds of device time and writes no
    /// memory. Resumable like a bulk copy: a turn runs as much of it as the turn has time
    /// for, and a preemption stops it where the engine stops a bulk copy's chunks.
    Synthetic {
        /// Device time the packet occupies its engine (ns).
        ns: u64,
    },
}

/// Why a dword sequence is not a valid packet.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// Not enough dwords for the header's length.
    #[error("packet truncated: header says {need} dwords, only {have} available")]
    Truncated {
        /// Dwords the header asks for.
        need: usize,
        /// Dwords available.
        have: usize,
    },
    /// The version nibble is not 1.
    #[error("packet header {header:#010x}: version {version}, expected 1")]
    BadVersion {
        /// Raw header.
        header: u32,
        /// Version found.
        version: u32,
    },
    /// Reserved flag bits set.
    #[error("packet header {header:#010x}: reserved flags {flags:#x} set")]
    ReservedFlags {
        /// Raw header.
        header: u32,
        /// Flags found.
        flags: u32,
    },
    /// Unknown opcode.
    #[error("unknown opcode {opcode}")]
    UnknownOpcode {
        /// Opcode byte.
        opcode: u8,
    },
    /// Length field 0.
    #[error("{opcode}: length 0 dwords")]
    ZeroLength {
        /// Opcode name.
        #[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))]
        opcode: crate::StaticStr,
    },
    /// Wrong length for a fixed-size packet.
    #[error("{opcode}: length {len} dwords, expected {expected}")]
    BadLength {
        /// Opcode name.
        #[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))]
        opcode: crate::StaticStr,
        /// Length found.
        len: usize,
        /// Length required.
        expected: usize,
    },
    /// A field holds a value outside its domain.
    #[error("{opcode}: field `{field}` = {value:#x} is invalid")]
    BadField {
        /// Opcode name.
        #[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))]
        opcode: crate::StaticStr,
        /// Field name.
        #[cfg_attr(feature = "serde", serde(deserialize_with = "crate::serde_str::de"))]
        field: crate::StaticStr,
        /// Value found.
        value: u64,
    },
}

#[inline]
fn push_u64(out: &mut Vec<u32>, v: u64) {
    out.push(v as u32);
    out.push((v >> 32) as u32);
}

/// The three dwords of `PROGRESS_FENCE value`, without allocating (the submission hot path).
pub const fn progress_fence_words(value: u64) -> [u32; 3] {
    [Header::new(Opcode::ProgressFence, 3).0, value as u32, (value >> 32) as u32]
}

impl Packet {
    /// The packet's opcode.
    pub const fn opcode(&self) -> Opcode {
        match self {
            Packet::Nop { .. } => Opcode::Nop,
            Packet::WriteData { .. } => Opcode::WriteData,
            Packet::Copy { .. } => Opcode::Copy,
            Packet::Fill { .. } => Opcode::Fill,
            Packet::Timestamp { .. } => Opcode::Timestamp,
            Packet::IndirectBuffer { .. } => Opcode::IndirectBuffer,
            Packet::Signal { .. } | Packet::SignalFence { .. } => Opcode::Signal,
            Packet::Logged { op: LoggedOp::Wait, .. } => Opcode::Wait,
            Packet::Logged { .. } => Opcode::Signal,
            Packet::Wait { .. } => Opcode::Wait,
            Packet::ProgressFence { .. } => Opcode::ProgressFence,
            Packet::Interrupt { .. } => Opcode::Interrupt,
            Packet::Dispatch { .. } => Opcode::Dispatch,
            Packet::Synthetic { .. } => Opcode::Synthetic,
        }
    }

    /// Encoded length in dwords.
    pub const fn dwords(&self) -> usize {
        match self {
            Packet::Nop { dwords } => *dwords as usize,
            Packet::Logged { .. } => 6,
            p => match p.opcode().fixed_dwords() {
                Some(n) => n,
                None => 1,
            },
        }
    }

    /// Appends the encoding to `out`. A `Nop` of length 0 is encoded as length 1.
    pub fn encode(&self, out: &mut Vec<u32>) {
        let dwords = self.dwords().max(1);
        let fence = matches!(self, Packet::SignalFence { .. } | Packet::Logged { op: LoggedOp::SignalFence, .. });
        let logged = matches!(self, Packet::Logged { .. });
        let flags = if fence { FLAG_NATIVE_FENCE } else { 0 } | if logged { FLAG_LOG } else { 0 };
        out.push(Header::new(self.opcode(), dwords as u16).with_flags(flags).0);
        match *self {
            Packet::Nop { .. } => out.extend(core::iter::repeat_n(0, dwords - 1)),
            Packet::WriteData { width, va, value } => {
                out.push(width.bytes() as u32);
                push_u64(out, va);
                push_u64(out, value);
            }
            Packet::Copy { src, dst, bytes } => {
                push_u64(out, src);
                push_u64(out, dst);
                push_u64(out, bytes);
            }
            Packet::Fill { dst, bytes, pattern } => {
                push_u64(out, dst);
                push_u64(out, bytes);
                out.push(pattern);
            }
            Packet::Timestamp { va } => push_u64(out, va),
            Packet::IndirectBuffer { va, dwords, vmid } => {
                push_u64(out, va);
                out.push(dwords);
                out.push(vmid);
            }
            Packet::Logged { va, value, position, .. } => {
                push_u64(out, va);
                push_u64(out, value);
                out.push(position);
            }
            Packet::Signal { va, value } | Packet::SignalFence { va, value } | Packet::Wait { va, value } => {
                push_u64(out, va);
                push_u64(out, value);
            }
            Packet::ProgressFence { value } => out.extend_from_slice(&progress_fence_words(value)[1..]),
            Packet::Interrupt { id } => out.push(id),
            Packet::Synthetic { ns } => push_u64(out, ns),
            Packet::Dispatch { program, grid, group, args } => {
                push_u64(out, program);
                out.extend_from_slice(&grid);
                out.extend_from_slice(&group);
                push_u64(out, args);
            }
        }
    }

    /// Decodes the packet at the start of `words`. Returns it with its length in dwords.
    pub fn decode(words: &[u32]) -> Result<(Packet, usize), DecodeError> {
        let Some(&first) = words.first() else {
            return Err(DecodeError::Truncated { need: 1, have: 0 });
        };
        let header = Header(first);
        let op = header.check()?;
        Self::decode_checked(header, op, words)
    }

    /// [`Packet::decode`] of a packet whose header was read and checked already
    /// ([`Header::check`] returned `op`): `words` holds the whole packet, and its first word
    /// is not looked at again (a device that fetched the header first decodes what it checked,
    /// whatever shared memory holds by the time it reads the rest).
    #[inline]
    pub fn decode_checked(header: Header, op: Opcode, words: &[u32]) -> Result<(Packet, usize), DecodeError> {
        let n = header.dwords();
        if words.len() < n {
            return Err(DecodeError::Truncated { need: n, have: words.len() });
        }
        if op == Opcode::Nop {
            return Ok((Packet::Nop { dwords: n as u16 }, n));
        }
        // A checked header of any other opcode has its fixed length, at most
        // MAX_FIXED_PACKET_DWORDS.
        let mut w = [0; MAX_FIXED_PACKET_DWORDS];
        let m = n.min(MAX_FIXED_PACKET_DWORDS);
        w[..m].copy_from_slice(&words[..m]);
        Self::decode_fixed(header, op, &w)
    }

    /// [`Packet::decode_checked`] of a packet fetched into a buffer of the longest fixed size
    /// (what a device does): the packet's words start at `w[0]`, the header's place, which is
    /// not looked at. Every field is at a fixed index of the buffer, so none needs a bounds
    /// check. A `NOP` is decoded from its header alone. (Inlined always: a fetch loop then
    /// builds the packet where it goes, not in a result it copies.)
    #[inline(always)]
    pub fn decode_fixed(
        header: Header,
        op: Opcode,
        w: &[u32; MAX_FIXED_PACKET_DWORDS],
    ) -> Result<(Packet, usize), DecodeError> {
        let n = header.dwords();
        let u64_at = |i: usize| (w[i] as u64) | ((w[i + 1] as u64) << 32);
        let p = match op {
            Opcode::Nop => Packet::Nop { dwords: n as u16 },
            Opcode::WriteData => {
                let width = match w[1] {
                    4 => DataWidth::U32,
                    8 => DataWidth::U64,
                    other => {
                        return Err(DecodeError::BadField { opcode: op.name(), field: "width", value: other as u64 });
                    }
                };
                Packet::WriteData { width, va: u64_at(2), value: u64_at(4) }
            }
            Opcode::Copy => Packet::Copy { src: u64_at(1), dst: u64_at(3), bytes: u64_at(5) },
            Opcode::Fill => Packet::Fill { dst: u64_at(1), bytes: u64_at(3), pattern: w[5] },
            Opcode::Timestamp => Packet::Timestamp { va: u64_at(1) },
            Opcode::IndirectBuffer => Packet::IndirectBuffer { va: u64_at(1), dwords: w[3], vmid: w[4] },
            Opcode::Signal | Opcode::Wait if header.flags() & FLAG_LOG != 0 => {
                let lop = match (op, header.flags() & FLAG_NATIVE_FENCE != 0) {
                    (Opcode::Wait, _) => LoggedOp::Wait,
                    (_, true) => LoggedOp::SignalFence,
                    _ => LoggedOp::Signal,
                };
                Packet::Logged { op: lop, va: u64_at(1), value: u64_at(3), position: w[5] }
            }
            Opcode::Signal if header.flags() & FLAG_NATIVE_FENCE != 0 => {
                Packet::SignalFence { va: u64_at(1), value: u64_at(3) }
            }
            Opcode::Signal => Packet::Signal { va: u64_at(1), value: u64_at(3) },
            Opcode::Wait => Packet::Wait { va: u64_at(1), value: u64_at(3) },
            Opcode::ProgressFence => Packet::ProgressFence { value: u64_at(1) },
            Opcode::Interrupt => Packet::Interrupt { id: w[1] },
            Opcode::Synthetic => Packet::Synthetic { ns: u64_at(1) },
            Opcode::Dispatch => Packet::Dispatch {
                program: u64_at(1),
                grid: [w[3], w[4], w[5]],
                group: [w[6], w[7], w[8]],
                args: u64_at(9),
            },
        };
        Ok((p, n))
    }
}

/// Decodes a whole command stream, stopping at the first error, which is returned with the
/// dword offset of the offending packet.
pub fn decode_stream(mut words: &[u32]) -> Result<Vec<Packet>, (usize, DecodeError)> {
    let mut out = Vec::new();
    let mut at = 0;
    while !words.is_empty() {
        let (p, n) = Packet::decode(words).map_err(|e| (at, e))?;
        out.push(p);
        words = &words[n..];
        at += n;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Vec<Packet> {
        vec![
            Packet::Nop { dwords: 1 },
            Packet::Nop { dwords: 4 },
            Packet::WriteData { width: DataWidth::U32, va: 0x1_0000_1000, value: 0xdead_beef },
            Packet::WriteData { width: DataWidth::U64, va: 8, value: u64::MAX },
            Packet::Copy { src: 1, dst: 2, bytes: 3 },
            Packet::Fill { dst: 0x10, bytes: 0x20, pattern: 0xabcd },
            Packet::Timestamp { va: 0x40 },
            Packet::IndirectBuffer { va: 0x1000, dwords: 12, vmid: 0 },
            Packet::Signal { va: 0x50, value: 9 },
            Packet::SignalFence { va: 0x60, value: 10 },
            Packet::Logged { op: LoggedOp::SignalFence, va: 0x60, value: 11, position: 83 },
            Packet::Logged { op: LoggedOp::Signal, va: 0x68, value: 1, position: 0 },
            Packet::Logged { op: LoggedOp::Wait, va: 0x60, value: 11, position: 5 },
            Packet::Wait { va: 0x58, value: 10 },
            Packet::ProgressFence { value: 42 },
            Packet::Interrupt { id: 7 },
            Packet::Dispatch { program: 0x1000, grid: [4, 2, 1], group: [64, 1, 1], args: 0x2000 },
            Packet::Synthetic { ns: 1_234_567_890_123 },
        ]
    }

    #[test]
    fn every_packet_round_trips_and_has_its_documented_length() {
        let mut stream = Vec::new();
        for p in all() {
            let before = stream.len();
            p.encode(&mut stream);
            assert_eq!(stream.len() - before, p.dwords(), "{p:?}");
            let (q, n) = Packet::decode(&stream[before..]).unwrap();
            assert_eq!((q, n), (p, p.dwords()));
        }
        assert_eq!(decode_stream(&stream).unwrap(), all());
    }

    #[test]
    fn malformed_headers_are_typed_errors() {
        assert_eq!(Packet::decode(&[]), Err(DecodeError::Truncated { need: 1, have: 0 }));
        let unknown = Header(1 | (0x7f << 16) | (1 << 24));
        assert_eq!(Packet::decode(&[unknown.0]), Err(DecodeError::UnknownOpcode { opcode: 0x7f }));
        let v2 = Header(1 | (2 << 24));
        assert!(matches!(Packet::decode(&[v2.0]), Err(DecodeError::BadVersion { version: 2, .. })));
        let flags = Header(Header::new(Opcode::Nop, 1).0 | (1 << 28));
        assert!(matches!(Packet::decode(&[flags.0]), Err(DecodeError::ReservedFlags { .. })));
        let short = Header::new(Opcode::Signal, 3);
        assert_eq!(
            Packet::decode(&[short.0, 0, 0]),
            Err(DecodeError::BadLength { opcode: "SIGNAL", len: 3, expected: 5 })
        );
        let trunc = Header::new(Opcode::Signal, 5);
        assert_eq!(Packet::decode(&[trunc.0, 0]), Err(DecodeError::Truncated { need: 5, have: 2 }));
        let zero = Header::new(Opcode::Nop, 0);
        assert_eq!(Packet::decode(&[zero.0]), Err(DecodeError::ZeroLength { opcode: "NOP" }));
        let dispatch = Header::new(Opcode::Dispatch, 8);
        assert_eq!(
            Packet::decode(&[dispatch.0; 8]),
            Err(DecodeError::BadLength { opcode: "DISPATCH", len: 8, expected: 11 })
        );
        let width = [Header::new(Opcode::WriteData, 6).0, 2, 0, 0, 0, 0];
        assert_eq!(
            Packet::decode(&width),
            Err(DecodeError::BadField { opcode: "WRITE_DATA", field: "width", value: 2 })
        );
    }

    #[test]
    fn decode_stream_reports_offset_of_bad_packet() {
        let mut s = Vec::new();
        Packet::Nop { dwords: 2 }.encode(&mut s);
        s.push(0xffff_ffff);
        assert_eq!(decode_stream(&s), Err((2, DecodeError::BadVersion { header: 0xffff_ffff, version: 0xf })));
    }
}
