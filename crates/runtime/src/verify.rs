//! Runs the example programs on a device and checks them against their CPU references.
//!
//! Tests, `doorbell demo` and `doorbell bench compute` all use this one routine, so "verified"
//! means the same thing everywhere: the device's output equals the reference bit for bit
//! (the references use fused multiply-adds in the programs' order, so even f32 results match
//! exactly).

use std::time::Duration;

use program::examples::{self, Example};
use umd::{Buffer, CommandBuffer, Device, Queue, UmdError};

/// A successful check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    /// Example name.
    pub name: &'static str,
    /// Output elements compared.
    pub elements: usize,
    /// `DISPATCH` packets it took.
    pub dispatches: usize,
}

/// Why a check failed.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// Running it failed.
    #[error(transparent)]
    Umd(#[from] UmdError),
    /// The source does not assemble.
    #[error("{name}: does not assemble: {error}")]
    Assemble {
        /// Example.
        name: &'static str,
        /// Why.
        error: String,
    },
    /// The device's output differs from the reference.
    #[error("{name}: element {index} is {got:#x}, the CPU reference says {want:#x}")]
    Mismatch {
        /// Example.
        name: &'static str,
        /// First differing element.
        index: usize,
        /// Device value (bits).
        got: u32,
        /// Reference value (bits).
        want: u32,
    },
}

/// A small deterministic generator (xorshift64*), so runs are reproducible.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as u32
    }
    fn f32(&mut self) -> f32 {
        (self.next() >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
    }
}

const WAIT: Option<Duration> = Some(Duration::from_secs(600));
const GROUP: u32 = 64;

fn upload_u32s(dev: &Device, v: &[u32]) -> Result<Buffer, UmdError> {
    dev.upload(&v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<_>>())
}

fn read_u32s(b: &Buffer, n: usize) -> Result<Vec<u32>, UmdError> {
    (0..n).map(|i| b.read_u32(i as u64 * 4)).collect()
}

fn compare(name: &'static str, got: &[u32], want: &[u32]) -> Result<(), VerifyError> {
    match got.iter().zip(want).position(|(g, w)| g != w) {
        Some(index) => Err(VerifyError::Mismatch { name, index, got: got[index], want: want[index] }),
        None => Ok(()),
    }
}

fn groups(threads: u64) -> [u32; 3] {
    [threads.div_ceil(GROUP as u64).max(1) as u32, 1, 1]
}

/// Runs `ex` on `q` (any submission path) with inputs of about `size` elements, and compares.
pub fn verify(ex: &Example, dev: &Device, q: &mut Queue, size: usize, seed: u64) -> Result<Verified, VerifyError> {
    let bin = ex.assemble().map_err(|e| VerifyError::Assemble { name: ex.name, error: e.to_string() })?;
    let program = dev.upload(&bin.to_bytes())?;
    let mut rng = Rng(seed | 1);
    let n = size.max(1);
    let mut cb = CommandBuffer::new();
    // Buffers must live until the work is done.
    let mut keep: Vec<Buffer> = Vec::new();
    let (out, want, dispatches) = match ex.name {
        "saxpy" => {
            let a = 1.5f32;
            let x: Vec<f32> = (0..n).map(|_| rng.f32()).collect();
            let y: Vec<f32> = (0..n).map(|_| rng.f32()).collect();
            let xb = upload_u32s(dev, &x.iter().map(|v| v.to_bits()).collect::<Vec<_>>())?;
            let yb = upload_u32s(dev, &y.iter().map(|v| v.to_bits()).collect::<Vec<_>>())?;
            let args = dev.upload(&examples::args_to_bytes(&[
                xb.va(),
                yb.va(),
                examples::arg_f32(a),
                examples::arg_u32(n as u32),
            ]))?;
            cb.dispatch(program.va(), groups(n as u64 + 37), [GROUP, 1, 1], args.va());
            let want: Vec<u32> = examples::saxpy_ref(a, &x, &y).iter().map(|v| v.to_bits()).collect();
            keep.extend([xb, args]);
            (yb, want, 1)
        }
        "reduce" => {
            let v: Vec<u32> = (0..n).map(|_| rng.next()).collect();
            let inb = upload_u32s(dev, &v)?;
            let outb = upload_u32s(dev, &[0])?;
            let args = dev.upload(&examples::args_to_bytes(&[inb.va(), examples::arg_u32(n as u32), outb.va()]))?;
            // Fewer threads than elements: each sums a strided chunk first.
            cb.dispatch(program.va(), groups((n as u64).min(4096)), [GROUP, 1, 1], args.va());
            keep.extend([inb, args]);
            (outb, vec![examples::reduce_ref(&v)], 1)
        }
        "matmul" => {
            // Odd sizes exercise the partial tiles.
            let (m, k, nn) = ((n as f64).sqrt() as usize | 1, 17, (n as f64).sqrt() as usize + 2);
            let a: Vec<f32> = (0..m * k).map(|_| rng.f32()).collect();
            let b: Vec<f32> = (0..k * nn).map(|_| rng.f32()).collect();
            let ab = upload_u32s(dev, &a.iter().map(|v| v.to_bits()).collect::<Vec<_>>())?;
            let bb = upload_u32s(dev, &b.iter().map(|v| v.to_bits()).collect::<Vec<_>>())?;
            let cbuf = dev.allocate((m * nn * 4) as u64)?;
            let args = dev.upload(&examples::args_to_bytes(&[
                ab.va(),
                bb.va(),
                cbuf.va(),
                examples::arg_u32(m as u32),
                examples::arg_u32(k as u32),
                examples::arg_u32(nn as u32),
            ]))?;
            cb.dispatch(program.va(), groups(examples::matmul_threads(m as u32, nn as u32)), [GROUP, 1, 1], args.va());
            let want = examples::matmul_ref(m, k, nn, &a, &b).iter().map(|v| v.to_bits()).collect();
            keep.extend([ab, bb, args]);
            (cbuf, want, 1)
        }
        "prefix_sum" => {
            let v: Vec<u32> = (0..n).map(|_| rng.next() % 1000).collect();
            let offsets = examples::prefix_sum_offsets(n as u32);
            let ping = upload_u32s(dev, &v)?;
            let pong = dev.allocate((n * 4) as u64)?;
            // Every pass is a DISPATCH on the same queue: each completes before the next.
            for (p, &off) in offsets.iter().enumerate() {
                let (src, dst) = if p % 2 == 0 { (&ping, &pong) } else { (&pong, &ping) };
                let args = dev.upload(&examples::args_to_bytes(&[
                    src.va(),
                    dst.va(),
                    examples::arg_u32(n as u32),
                    examples::arg_u32(off),
                ]))?;
                cb.dispatch(program.va(), groups(n as u64), [GROUP, 1, 1], args.va());
                keep.push(args);
            }
            let (last, other) = if offsets.len() % 2 == 1 { (pong, ping) } else { (ping, pong) };
            keep.push(other);
            (last, examples::prefix_sum_ref(&v), offsets.len())
        }
        other => {
            return Err(VerifyError::Assemble {
                name: ex.name,
                error: format!("no device check for example `{other}`"),
            });
        }
    };
    let v = q.submit(&cb)?;
    q.wait(v, WAIT)?;
    let got = read_u32s(&out, want.len())?;
    compare(ex.name, &got, &want)?;
    drop(keep);
    Ok(Verified { name: ex.name, elements: want.len(), dispatches })
}

/// Runs every example on `q`; returns each one's outcome.
pub fn verify_all(dev: &Device, q: &mut Queue, size: usize) -> Vec<(&'static str, Result<Verified, VerifyError>)> {
    examples::ALL.iter().enumerate().map(|(i, ex)| (ex.name, verify(ex, dev, q, size, 0x5eed + i as u64))).collect()
}
