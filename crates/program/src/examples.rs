//! The example programs of `examples/*.dbk`, with their argument layouts and CPU references.
//!
//! Every example takes its arguments as 64-bit slots in the argument buffer (slot `k` at
//! argument-buffer VA + 8·`k`), read with `sarg`. Buffers are passed as GPU VAs; a u32
//! argument sits in the low 32 bits of its slot ([`arg_u32`]); an f32 argument is passed as
//! its bits in the low 32 bits ([`arg_f32`]). [`Example::args`] lists the slots, so a test or
//! the CLI can set up buffers from it.
//!
//! All four use a 1-D grid (only `x` matters). Each example's description says how many
//! threads it needs; threads beyond that do nothing, so the grid may overshoot.
//!
//! The CPU references compute bit-identical results: f32 products-plus-sums are fused
//! (`f32::mul_add`, like `ffma`) and in the same order as the program; u32 sums wrap.

use crate::{AsmError, ProgramBinary, assemble};

/// The type of an element of a buffer argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    /// u32.
    U32,
    /// f32.
    F32,
}

/// What the program does with a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Only reads it.
    Read,
    /// Only writes it.
    Write,
    /// Reads and writes it (or updates it atomically).
    ReadWrite,
}

/// What an argument slot holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgKind {
    /// The GPU VA of a buffer.
    Buffer {
        /// Element type.
        elem: Elem,
        /// What the program does with it.
        access: Access,
    },
    /// A u32 in the low 32 bits.
    U32,
    /// An f32's bits in the low 32 bits.
    F32,
}

/// One argument slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArgSlot {
    /// Slot index (`sarg sD, slot`).
    pub slot: u32,
    /// Name, as in the `.dbk` header comment.
    pub name: &'static str,
    /// What it holds.
    pub kind: ArgKind,
    /// Length of a buffer (in elements, in terms of the other arguments) or meaning of a value.
    pub doc: &'static str,
}

/// An example program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Example {
    /// Short name (`saxpy`, ...), also the file stem.
    pub name: &'static str,
    /// Path from the workspace root.
    pub path: &'static str,
    /// The `.dbk` source.
    pub source: &'static str,
    /// What it computes.
    pub summary: &'static str,
    /// Argument slots, in slot order.
    pub args: &'static [ArgSlot],
    /// How many threads (`grid.x * group.x`) it needs, in terms of the arguments.
    pub threads: &'static str,
}

impl Example {
    /// Assembles the source (it always assembles: a test checks it).
    pub fn assemble(&self) -> Result<ProgramBinary, AsmError> {
        assemble(self.source)
    }

    /// The slot named `name`.
    pub fn slot(&self, name: &str) -> Option<&'static ArgSlot> {
        self.args.iter().find(|a| a.name == name)
    }
}

const fn buf(slot: u32, name: &'static str, elem: Elem, access: Access, doc: &'static str) -> ArgSlot {
    ArgSlot { slot, name, kind: ArgKind::Buffer { elem, access }, doc }
}

const fn val(slot: u32, name: &'static str, kind: ArgKind, doc: &'static str) -> ArgSlot {
    ArgSlot { slot, name, kind, doc }
}

/// `saxpy.dbk`: `y[i] = a * x[i] + y[i]` for `i < n`.
pub const SAXPY: Example = Example {
    name: "saxpy",
    path: "examples/saxpy.dbk",
    source: include_str!("../../../examples/saxpy.dbk"),
    summary: "y[i] = a * x[i] + y[i] for i < n (f32, fused multiply-add)",
    args: &[
        buf(0, "x", Elem::F32, Access::Read, "n elements"),
        buf(1, "y", Elem::F32, Access::ReadWrite, "n elements"),
        val(2, "a", ArgKind::F32, "the scale"),
        val(3, "n", ArgKind::U32, "number of elements"),
    ],
    threads: "at least n",
};

/// `reduce.dbk`: `*out += sum(in[0..n])` with `atom.add.u32`.
pub const REDUCE: Example = Example {
    name: "reduce",
    path: "examples/reduce.dbk",
    source: include_str!("../../../examples/reduce.dbk"),
    summary: "*out += in[0] + ... + in[n-1] (u32, wrapping); each thread sums a strided chunk, then one atomic add",
    args: &[
        buf(0, "in", Elem::U32, Access::Read, "n elements"),
        val(1, "n", ArgKind::U32, "number of elements"),
        buf(2, "out", Elem::U32, Access::ReadWrite, "1 element, zeroed before the dispatch"),
    ],
    threads: "any number (at most one atomic per thread)",
};

/// `matmul.dbk`: `C = A × B`, row-major f32, 2×2 tile per thread.
pub const MATMUL: Example = Example {
    name: "matmul",
    path: "examples/matmul.dbk",
    source: include_str!("../../../examples/matmul.dbk"),
    summary: "C = A x B for row-major f32 matrices (M x K times K x N); each thread computes a 2x2 tile",
    args: &[
        buf(0, "A", Elem::F32, Access::Read, "M*K elements"),
        buf(1, "B", Elem::F32, Access::Read, "K*N elements"),
        buf(2, "C", Elem::F32, Access::Write, "M*N elements"),
        val(3, "M", ArgKind::U32, "rows of A and C"),
        val(4, "K", ArgKind::U32, "columns of A, rows of B"),
        val(5, "N", ArgKind::U32, "columns of B and C"),
    ],
    threads: "at least ceil(M/2) * ceil(N/2)",
};

/// `prefix_sum.dbk`: one Hillis–Steele pass; see [`prefix_sum_offsets`].
pub const PREFIX_SUM: Example = Example {
    name: "prefix_sum",
    path: "examples/prefix_sum.dbk",
    source: include_str!("../../../examples/prefix_sum.dbk"),
    summary: "one pass of an inclusive u32 scan: out[i] = in[i] + (i >= offset ? in[i-offset] : 0); \
              dispatch once per offset 1, 2, 4, ... < n, ping-ponging two buffers",
    args: &[
        buf(0, "in", Elem::U32, Access::Read, "n elements"),
        buf(1, "out", Elem::U32, Access::Write, "n elements, not overlapping in"),
        val(2, "n", ArgKind::U32, "number of elements"),
        val(3, "offset", ArgKind::U32, "this pass's distance: 1, 2, 4, ..."),
    ],
    threads: "at least n",
};

/// Every example.
pub const ALL: [&Example; 4] = [&SAXPY, &REDUCE, &MATMUL, &PREFIX_SUM];

/// The example named `name`.
pub fn by_name(name: &str) -> Option<&'static Example> {
    ALL.into_iter().find(|e| e.name == name)
}

/// A u32 argument slot.
pub fn arg_u32(x: u32) -> u64 {
    x as u64
}

/// An f32 argument slot: its bits in the low 32 bits.
pub fn arg_f32(x: f32) -> u64 {
    x.to_bits() as u64
}

/// An argument buffer's bytes: the slots, little-endian.
pub fn args_to_bytes(slots: &[u64]) -> Vec<u8> {
    slots.iter().flat_map(|s| s.to_le_bytes()).collect()
}

/// Threads `matmul.dbk` needs: `ceil(m/2) * ceil(n/2)`.
pub fn matmul_threads(m: u32, n: u32) -> u64 {
    m.div_ceil(2) as u64 * n.div_ceil(2) as u64
}

/// The `offset` argument of each `prefix_sum.dbk` pass for `n` elements: 1, 2, 4, ... while
/// less than `n` (none for `n <= 1`).
pub fn prefix_sum_offsets(n: u32) -> Vec<u32> {
    let mut v = Vec::new();
    let mut o = 1u32;
    while o < n {
        v.push(o);
        match o.checked_mul(2) {
            Some(x) => o = x,
            None => break,
        }
    }
    v
}

/// Reference for `saxpy.dbk`: `a * x[i] + y[i]` fused, for `i < min(x.len(), y.len())`.
pub fn saxpy_ref(a: f32, x: &[f32], y: &[f32]) -> Vec<f32> {
    x.iter().zip(y).map(|(&x, &y)| a.mul_add(x, y)).collect()
}

/// Reference for `reduce.dbk`: the wrapping sum.
pub fn reduce_ref(v: &[u32]) -> u32 {
    v.iter().fold(0u32, |s, &x| s.wrapping_add(x))
}

/// Reference for `matmul.dbk`: `C[r][c] = fma(A[r][K-1], B[K-1][c], ... fma(A[r][0], B[0][c],
/// 0.0))`, row-major.
///
/// # Panics
/// If `a` or `b` is shorter than `m*k` or `k*n`.
pub fn matmul_ref(m: usize, k: usize, n: usize, a: &[f32], b: &[f32]) -> Vec<f32> {
    let mut c = vec![0.0f32; m * n];
    for r in 0..m {
        for col in 0..n {
            let mut acc = 0.0f32;
            for i in 0..k {
                acc = a[r * k + i].mul_add(b[i * n + col], acc);
            }
            c[r * n + col] = acc;
        }
    }
    c
}

/// Reference for `prefix_sum.dbk` run for every offset of [`prefix_sum_offsets`]: the
/// inclusive wrapping scan.
pub fn prefix_sum_ref(v: &[u32]) -> Vec<u32> {
    v.iter()
        .scan(0u32, |s, &x| {
            *s = s.wrapping_add(x);
            Some(*s)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_example_assembles_and_validates() {
        for e in ALL {
            let k = e.assemble().unwrap_or_else(|err| panic!("{}: {err}", e.path));
            abi::isa::validate(k.instructions()).unwrap();
            assert_eq!(crate::assemble(&crate::disassemble(&k)).unwrap(), k, "{}", e.name);
            assert_eq!(crate::ProgramBinary::from_bytes(&k.to_bytes()).unwrap(), k);
            // The slot table matches the header comment and is dense.
            for (i, a) in e.args.iter().enumerate() {
                assert_eq!(a.slot as usize, i, "{}", e.name);
                let line = format!("slot {}  {}", a.slot, a.name);
                assert!(e.source.contains(&line), "{}: header lacks {line:?}", e.name);
            }
            assert!(e.source.contains("argument buffer"), "{}: no argument convention", e.name);
            assert_eq!(by_name(e.name), Some(e));
            assert!(e.path.ends_with(&format!("{}.dbk", e.name)));
        }
    }

    #[test]
    fn references() {
        assert_eq!(saxpy_ref(2.0, &[1.0, 2.0], &[10.0, 20.0]), vec![12.0, 24.0]);
        assert_eq!(reduce_ref(&[u32::MAX, 2, 3]), 4);
        // [1 2; 3 4] x [5 6; 7 8] = [19 22; 43 50]
        assert_eq!(matmul_ref(2, 2, 2, &[1.0, 2.0, 3.0, 4.0], &[5.0, 6.0, 7.0, 8.0]), vec![19.0, 22.0, 43.0, 50.0]);
        assert_eq!(prefix_sum_ref(&[1, 2, 3, 4]), vec![1, 3, 6, 10]);
        assert_eq!(prefix_sum_offsets(0), Vec::<u32>::new());
        assert_eq!(prefix_sum_offsets(1), Vec::<u32>::new());
        assert_eq!(prefix_sum_offsets(5), vec![1, 2, 4]);
        assert_eq!(prefix_sum_offsets(8), vec![1, 2, 4]);
        assert_eq!(prefix_sum_offsets(u32::MAX).len(), 32);
        assert_eq!(matmul_threads(3, 5), 6);
        assert_eq!(args_to_bytes(&[arg_u32(1), arg_f32(1.0)]), [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x80, 0x3f, 0, 0, 0, 0]);
    }
}
