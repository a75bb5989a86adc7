//! Workload programs for preemption studies, benchmarks and tests: long, deterministic compute
//! programs whose results depend on every instruction they run, so that a dispatch cut at any
//! point and resumed can be checked bit for bit, and a program that never ends.

use crate::{ProgramBinary, assemble};

/// `rounds`: each thread runs `n` (argument slot 1, a u32) rounds of `acc = acc * 3 + i`
/// from `acc = 1`, and stores `acc` at `out[global_id.x]` (slot 0, a buffer of u32). Every
/// thread stores [`rounds_result`]`(n)`. About five wave-instructions a round.
pub const ROUNDS: &str = "
    sarg s0, 0
    sarg s1, 1
    vfroms v1, s1
    builtin v0, %global_id.x
    mov v2, 0
    mov v3, 1
    loop
        cmp.le.u v4, v1, v2
        break v4
        mul v3, v3, 3
        add v3, v3, v2
        add v2, v2, 1
    endloop
    shl v5, v0, 2
    st.u32 [s0 + v5], v3
";

/// The `rounds` program, assembled.
pub fn rounds() -> ProgramBinary {
    assemble(ROUNDS).expect("the rounds program assembles")
}

/// What every thread of [`ROUNDS`] stores after `n` rounds.
pub fn rounds_result(n: u32) -> u32 {
    (0..n).fold(1u32, |acc, i| acc.wrapping_mul(3).wrapping_add(i))
}

/// The argument buffer of [`ROUNDS`]: `out`'s GPU VA, then `n`.
pub fn rounds_args(out_va: u64, n: u32) -> Vec<u8> {
    let mut args = out_va.to_le_bytes().to_vec();
    args.extend_from_slice(&(n as u64).to_le_bytes());
    args
}

/// A program that never ends: `loop { r1 += 1 }` (it touches no memory; its argument buffer
/// is not read).
pub fn forever() -> ProgramBinary {
    assemble(
        "
    loop
        add v1, v1, 1
    endloop
",
    )
    .expect("the endless program assembles")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_reference_is_the_recurrence() {
        assert_eq!(super::rounds_result(0), 1);
        assert_eq!(super::rounds_result(1), 3);
        assert_eq!(super::rounds_result(3), ((3 * 3) + 1) * 3 + 2);
    }
}
