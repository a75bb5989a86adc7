//! # program — compute programs for the ISA of `abi::isa`
//!
//! What a `DISPATCH` packet runs is a *program*: a [`ProgramHeader`] and instruction words of
//! the compute ISA ([`abi::isa`], the normative definition; `docs/isa.md` is the user's
//! guide). This crate is the tooling on the application's side of that format. It knows no
//! device, no queue and no driver: it depends on `abi` only, and what it produces is bytes
//! that a client uploads (`umd::Device::upload`) and names by GPU VA in
//! `umd::CommandBuffer::dispatch`.
//!
//! - [`ProgramBinary`]: a validated program; [`ProgramBinary::to_bytes`] is exactly what a
//!   `DISPATCH` reads at its program VA (a [`ProgramHeader`] and the instruction words).
//! - [`ProgramBuilder`]: one method per instruction, with registers typed as [`V`] and [`S`]
//!   so they cannot be swapped. Control flow (`if_`/`else_`/`endif`,
//!   `loop_`/`break_`/`endloop`) is written as structure; the builder fills in every branch
//!   target.
//! - [`assemble`]: `.dbk` text to a binary, with errors that carry line, column and reason
//!   ([`AsmError`]). It never panics.
//! - [`disassemble`]: a binary back to text that [`assemble`] accepts and that assembles to
//!   the same words.
//! - [`examples`]: the four example programs of `examples/*.dbk` with their argument layouts
//!   and bit-exact CPU references; [`workloads`]: long deterministic programs and an endless
//!   one, for preemption studies, benchmarks and tests.
//! - [`specialize`]: the specializing compiler, a program plus argument values it may assume
//!   to an equivalent program for exactly those values (what profile-guided specialization,
//!   `runtime::pgo`, compiles in the background).
//!
//! ## Invariants
//!
//! - A [`ProgramBinary`] always passes [`abi::isa::validate`]: every way to make one
//!   (building, assembling, parsing bytes, specializing) checks, so the device never refuses
//!   a binary made here.
//! - Bad input (text that does not assemble, bytes that do not parse, a builder misuse) is a
//!   typed error naming where and why; nothing here panics on it.
//! - `disassemble` then `assemble` gives back the same words (property-tested in
//!   `tests/asm_props.rs`); the example programs' CPU references agree with an independent
//!   reference interpreter of the ISA (`tests/ref_interp.rs`).
//!
//! ```
//! use program::{assemble, disassemble};
//!
//! let p = assemble("sarg s0, 0\nbuiltin v0, %global_id.x\nshl v1, v0, 2\nst.u32 [s0 + v1], v0\n")?;
//! assert_eq!(p.len(), 4);
//! assert_eq!(&p.to_bytes()[..4], b"DBK1");
//! assert_eq!(assemble(&disassemble(&p))?, p);
//! # Ok::<(), program::AsmError>(())
//! ```
#![forbid(unsafe_code)]

mod asm;
mod binary;
mod builder;
mod disasm;
pub mod examples;
mod lex;
pub mod specialize;
pub mod workloads;

pub use abi::isa::{ProgramError, ProgramErrorKind, ProgramHeader};
pub use asm::{AsmError, assemble, assemble_with_lines};
pub use binary::ProgramBinary;
pub use builder::{BuildError, Imm, Operand, ProgramBuilder, S, V};
pub use disasm::disassemble;
