//! `doorbell run FILE.dbk`: assemble a kernel, dispatch it on a live system, summarize its
//! buffers.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use abi::EngineKind;
use abi::port::KernelPort;
use clap::Args;
use kernel::{System, SystemConfig};
use umd::{Buffer, CommandBuffer, Device, QueueOptions};

use crate::CliError;

/// Arguments of `doorbell run`.
#[derive(Args)]
pub struct RunArgs {
    /// The kernel source (`.dbk`, see docs/isa.md).
    file: PathBuf,
    /// Workgroups per dimension: X or X,Y or X,Y,Z.
    #[arg(long, value_parser = parse_dims, default_value = "1")]
    grid: [u32; 3],
    /// Threads per workgroup: X or X,Y or X,Y,Z (at most 1024 in all).
    #[arg(long, value_parser = parse_dims, default_value = "64")]
    group: [u32; 3],
    /// Kernel arguments, one per 64-bit slot, in order, comma-separated:
    /// an integer (`1000`, `0x40`), a float (`f:1.5`, stored as f32 bits),
    /// or a buffer `buf:BYTES[:INIT]` with INIT one of zero (default), iota (u32 0,1,2,…),
    /// iotaf (f32 0.0,1.0,…), ones (u32 1) — the slot receives its GPU address.
    #[arg(long, value_delimiter = ',', num_args = 0..)]
    args: Vec<String>,
    /// How many leading u32 words of each buffer to print.
    #[arg(long, default_value_t = 8)]
    show: usize,
}

fn parse_dims(s: &str) -> Result<[u32; 3], String> {
    let parts: Vec<&str> = s.split(',').collect();
    if parts.is_empty() || parts.len() > 3 {
        return Err(format!("`{s}`: expected X, X,Y or X,Y,Z"));
    }
    let mut d = [1u32; 3];
    for (i, p) in parts.iter().enumerate() {
        d[i] = p.trim().parse().map_err(|_| format!("`{p}` is not a whole number"))?;
        if d[i] == 0 {
            return Err("every dimension must be at least 1".into());
        }
    }
    Ok(d)
}

enum Slot {
    Value(u64),
    Buffer { bytes: u64, init: String },
}

fn parse_slot(s: &str) -> Result<Slot, CliError> {
    let bad = |why: &str| CliError::Input(format!("--args `{s}`: {why}"));
    if let Some(rest) = s.strip_prefix("buf:") {
        let mut it = rest.splitn(2, ':');
        let bytes: u64 = it.next().unwrap_or("").parse().map_err(|_| bad("buffer size is not a whole number"))?;
        if bytes == 0 || bytes > 1 << 30 {
            return Err(bad("buffer size must be 1 byte to 1 GiB"));
        }
        let init = it.next().unwrap_or("zero").to_string();
        if !["zero", "iota", "iotaf", "ones"].contains(&init.as_str()) {
            return Err(bad("INIT must be zero, iota, iotaf or ones"));
        }
        Ok(Slot::Buffer { bytes, init })
    } else if let Some(f) = s.strip_prefix("f:") {
        let x: f32 = f.parse().map_err(|_| bad("not a float"))?;
        Ok(Slot::Value(x.to_bits() as u64))
    } else if let Some(h) = s.strip_prefix("0x") {
        Ok(Slot::Value(u64::from_str_radix(h, 16).map_err(|_| bad("not a hex number"))?))
    } else {
        let v: i64 = s.parse().map_err(|_| bad("expected an integer, f:FLOAT or buf:BYTES[:INIT]"))?;
        Ok(Slot::Value(v as u64))
    }
}

fn init_bytes(bytes: u64, init: &str) -> Vec<u8> {
    let words = bytes.div_ceil(4) as u32;
    let mut out: Vec<u8> = match init {
        "iota" => (0..words).flat_map(|i| i.to_le_bytes()).collect(),
        "iotaf" => (0..words).flat_map(|i| (i as f32).to_le_bytes()).collect(),
        "ones" => (0..words).flat_map(|_| 1u32.to_le_bytes()).collect(),
        _ => vec![0; bytes as usize],
    };
    out.truncate(bytes as usize);
    out
}

/// Runs `doorbell run`.
pub fn run(a: RunArgs) -> Result<(), CliError> {
    let src = std::fs::read_to_string(&a.file)
        .map_err(|e| CliError::Input(format!("cannot read {}: {e}", a.file.display())))?;
    let binary = umd::assemble(&src).map_err(|e| CliError::Input(format!("{}:{e}", a.file.display())))?;
    let slots = a.args.iter().filter(|s| !s.is_empty()).map(|s| parse_slot(s)).collect::<Result<Vec<_>, _>>()?;

    let sys = System::live(SystemConfig::default())?;
    let port: Arc<dyn KernelPort> = sys.open_process()?;
    let dev = Device::open(port)?;
    let mut buffers: Vec<(usize, Buffer)> = Vec::new();
    let mut words = Vec::new();
    for (i, s) in slots.iter().enumerate() {
        match s {
            Slot::Value(v) => words.push(*v),
            Slot::Buffer { bytes, init } => {
                let b = dev.upload(&init_bytes(*bytes, init))?;
                words.push(b.va());
                buffers.push((i, b));
            }
        }
    }
    let args_bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let args = dev.upload(&args_bytes)?;
    let kernel = dev.upload(&binary.to_bytes())?;
    let ctx = dev.create_context(dev.engine(EngineKind::Compute)?)?;
    let mut q = ctx.create_queue(QueueOptions::user_mode())?;
    let mut cb = CommandBuffer::new();
    cb.dispatch(kernel.va(), a.grid, a.group, args.va());
    let before = sys.with_gpu(|g| g.compute_stats());
    let t = Instant::now();
    let v = q.submit(&cb)?;
    q.wait(v, Some(Duration::from_secs(600)))?;
    let el = t.elapsed();
    let st = sys.with_gpu(|g| g.compute_stats());
    println!(
        "{}: {} instructions, grid {:?} x group {:?}: {} wave-instructions, {} lane ops in {:?}",
        a.file.display(),
        binary.len(),
        a.grid,
        a.group,
        st.instructions - before.instructions,
        st.lane_ops - before.lane_ops,
        el
    );
    for (slot, b) in &buffers {
        let n = (b.len() / 4) as usize;
        let mut sum = 0u64;
        let mut nonzero = 0usize;
        let mut hash = 0xcbf2_9ce4_8422_2325u64;
        let mut head = Vec::new();
        for i in 0..n {
            let w = b.read_u32(i as u64 * 4)?;
            sum = sum.wrapping_add(w as u64);
            nonzero += (w != 0) as usize;
            hash = (hash ^ w as u64).wrapping_mul(0x100_0000_01b3);
            if i < a.show {
                head.push(format!("{w:#x}"));
            }
        }
        println!(
            "  slot {slot}: buffer of {} bytes: {nonzero} non-zero words, u32 sum {sum}, fnv {hash:016x}\n    first words: [{}]",
            b.len(),
            head.join(", ")
        );
    }
    Ok(())
}
