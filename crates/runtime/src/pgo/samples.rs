//! Example programs whose hot arguments make specialization pay, with a helper that sets up
//! their buffers: the programs of `doorbell bench pgo`, the `doorbell demo` steps and the
//! differential tests.
//!
//! - [`FIR`]: `out[i] = Σ in[i + t]` for `t < taps`: a loop whose trip count is an argument
//!   (a filter size). Bound, the loop unrolls and its compare, break and counter go.
//! - [`ITERATE`]: `x = data[i]`, then `rounds` times `x = op == 0 ? x·0.5 + 0.25 :
//!   min(x·x, 2.0)`, then `data[i] = x`: an argument-bound loop around a branch on another
//!   argument. Bound, each round is one instruction.
//!
//! Both bounds-check their thread index against `n`, so the grid may overshoot.

use program::examples::{arg_u32, args_to_bytes};
use program::{ProgramBinary, assemble};
use umd::{Buffer, Device, UmdError};

/// An example program for the specializer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// Short name.
    pub name: &'static str,
    /// `.dbk` source.
    pub source: &'static str,
    /// What it computes, and its slots.
    pub summary: &'static str,
    /// Names of the two u32 parameters after `n` (slots 3 and 4 for `fir`'s one, see source).
    pub params: [&'static str; 2],
}

/// The argument-bound loop (see the module documentation).
pub const FIR: Sample = Sample {
    name: "fir",
    summary: "out[i] = sum of in[i + t] for t < taps; slots 0 in, 1 out, 2 n, 3 taps",
    params: ["taps", "unused"],
    source: "\
; fir: out[i] = sum(in[i + t], t < taps), f32
;   slot 0 in (n + taps f32), 1 out (n f32), 2 n, 3 taps
    sarg s0, 0
    sarg s1, 1
    sarg s2, 2
    sarg s3, 3
    builtin v0, %global_id.x
    vfroms v1, s2
    cmp.lt.u v2, v0, v1
    if v2
        vfroms v3, s3
        mov v4, 0
        mov v5, 0.0
        shl v6, v0, 2
        loop
            cmp.lt.u v7, v4, v3
            cmp.eq v7, v7, 0
            break v7
            ld.f32 v8, [s0 + v6]
            fadd v5, v5, v8
            add v6, v6, 4
            add v4, v4, 1
        endloop
        shl v9, v0, 2
        st.f32 [s1 + v9], v5
    endif
",
};

/// The argument-bound loop around a branch on an argument (see the module documentation).
pub const ITERATE: Sample = Sample {
    name: "iterate",
    summary: "rounds of x = op == 0 ? x*0.5+0.25 : min(x*x, 2); slots 0 data, 1 n, 2 rounds, 3 op",
    params: ["rounds", "op"],
    source: "\
; iterate: data[i] = f^rounds(data[i]), f = op == 0 ? x*0.5 + 0.25 : min(x*x, 2.0), f32
;   slot 0 data (n f32, read and written), 1 n, 2 rounds, 3 op
    sarg s0, 0
    sarg s1, 1
    sarg s2, 2
    sarg s3, 3
    builtin v0, %global_id.x
    vfroms v1, s1
    cmp.lt.u v2, v0, v1
    if v2
        shl v3, v0, 2
        ld.f32 v4, [s0 + v3]
        vfroms v5, s2
        vfroms v6, s3
        mov v7, 0
        mov v10, 0.5
        mov v11, 0.25
        loop
            cmp.lt.u v8, v7, v5
            cmp.eq v8, v8, 0
            break v8
            cmp.eq v9, v6, 0
            if v9
                ffma v4, v4, v10, v11
            else
                fmul v4, v4, v4
                fmin v4, v4, 2.0
            endif
            add v7, v7, 1
        endloop
        st.f32 [s0 + v3], v4
    endif
",
};

/// Both samples.
pub const ALL: [Sample; 2] = [FIR, ITERATE];

/// Threads per workgroup the helpers dispatch with.
pub const GROUP: u32 = 64;

/// A sample's buffers on a device, ready to dispatch.
pub struct Instance {
    /// The argument buffer.
    pub args: Buffer,
    /// Every buffer the program reads or writes, in slot order.
    pub buffers: Vec<Buffer>,
    /// The grid (1-D).
    pub grid: [u32; 3],
    /// The workgroup.
    pub group: [u32; 3],
    /// Elements of each buffer.
    pub lens: Vec<usize>,
}

impl Instance {
    /// Every buffer's contents, as words (what a differential test compares).
    pub fn memory(&self) -> Result<Vec<Vec<u32>>, UmdError> {
        self.buffers
            .iter()
            .zip(&self.lens)
            .map(|(b, &n)| (0..n).map(|i| b.read_u32(4 * i as u64)).collect::<Result<Vec<u32>, _>>())
            .collect()
    }
}

fn xorshift(seed: &mut u64) -> u32 {
    *seed ^= *seed >> 12;
    *seed ^= *seed << 25;
    *seed ^= *seed >> 27;
    (seed.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as u32
}

impl Sample {
    /// The assembled program.
    pub fn program(&self) -> ProgramBinary {
        // The sources are fixed and tested to assemble.
        assemble(self.source).unwrap_or_else(|e| panic!("sample {} does not assemble: {e}", self.name))
    }

    /// Buffers for `n` elements with parameters `params` (the two after `n`; `fir` uses the
    /// first), inputs drawn from `seed` in `[-1, 1)`.
    pub fn instance(&self, dev: &Device, n: u32, params: [u32; 2], seed: u64) -> Result<Instance, UmdError> {
        let mut s = seed | 1;
        let mut floats = |len: usize| -> Vec<u8> {
            (0..len)
                .flat_map(|_| {
                    ((xorshift(&mut s) >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0).to_bits().to_le_bytes()
                })
                .collect()
        };
        let (buffers, lens, args) = match self.name {
            "fir" => {
                let in_len = n as usize + params[0] as usize;
                let input = dev.upload(&floats(in_len))?;
                let out = dev.upload(&vec![0u8; 4 * n.max(1) as usize])?;
                let args = args_to_bytes(&[input.va(), out.va(), arg_u32(n), arg_u32(params[0])]);
                (vec![input, out], vec![in_len, n as usize], args)
            }
            _ => {
                let data = dev.upload(&floats(n as usize))?;
                let args = args_to_bytes(&[data.va(), arg_u32(n), arg_u32(params[0]), arg_u32(params[1])]);
                (vec![data], vec![n as usize], args)
            }
        };
        let args = dev.upload(&args)?;
        let grid = [n.div_ceil(GROUP).max(1), 1, 1];
        Ok(Instance { args, buffers, grid, group: [GROUP, 1, 1], lens })
    }
}
