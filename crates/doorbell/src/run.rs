//! `doorbell run FILE.dbk`: assemble a compute program, dispatch it on a live system, summarize its
//! buffers.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use abi::EngineKind;
use abi::isa::Op;
use abi::port::KernelPort;
use clap::Args;
use kernel::{System, SystemConfig};
use umd::{Buffer, CommandBuffer, Device, QueueOptions};

use crate::{CliError, num};

/// Arguments of `doorbell run`.
#[derive(Args)]
pub struct RunArgs {
    /// The program source (`.dbk`, see docs/isa.md).
    file: PathBuf,
    /// Workgroups per dimension: X or X,Y or X,Y,Z; each 1 to 4294967295, at most 2^40
    /// workgroups in all (the ISA's DISPATCH limit).
    #[arg(long, value_parser = parse_grid, default_value = "1")]
    grid: [u32; 3],
    /// Threads per workgroup: X or X,Y or X,Y,Z; each at least 1, at most 1024 threads in all
    /// (the ISA's DISPATCH limit).
    #[arg(long, value_parser = parse_group, default_value = "64")]
    group: [u32; 3],
    /// Program arguments, one per 64-bit slot, in order, comma-separated; give exactly as many
    /// as the program reads (`sarg`). Each is an integer from -2^63 to 2^64-1 (`1000`, `-1`,
    /// `0x40`), a float (`f:1.5`, stored as f32 bits), or a buffer `buf:BYTES[:INIT]` (1 byte
    /// to 1 GiB; INIT one of zero (default), iota (u32 0,1,2,…), iotaf (f32 0.0,1.0,…), ones
    /// (u32 1)) — the slot receives its GPU address.
    #[arg(long, value_delimiter = ',', num_args = 0..)]
    args: Vec<String>,
    /// How many leading u32 words of each buffer to print (at most the buffer's words are
    /// printed; asking for more says so).
    #[arg(long, default_value_t = 8, value_parser = num::within(0u32, u32::MAX))]
    show: u32,
    /// Stop after this long if the program has not finished, report it and exit non-zero:
    /// `500ms`, `10s`, `2m`, `1h` (a bare number is seconds). Without it, `run` waits for as long
    /// as the program runs.
    #[arg(long, value_parser = num::parse_duration)]
    timeout: Option<Duration>,
    /// Show the elapsed time and the wave-instructions executed so far on stderr while the
    /// program runs: `auto` only when stderr is a terminal, `always`, or `never`.
    #[arg(long, value_enum, default_value_t = When::Auto)]
    progress: When,
}

/// `--progress`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum When {
    Auto,
    Always,
    Never,
}

/// `--grid`: each dimension a u32 of at least 1, the product within the ISA's limit.
fn parse_grid(s: &str) -> Result<[u32; 3], String> {
    let grid = parse_dims(s, u32::MAX)?;
    abi::isa::check_dims(grid, [1; 3]).map_err(|why| format!("{why} (this grid has {})", product(grid)))?;
    Ok(grid)
}

/// `--group`: each dimension at least 1, the product within the ISA's limit.
fn parse_group(s: &str) -> Result<[u32; 3], String> {
    let group = parse_dims(s, abi::isa::MAX_GROUP_THREADS as u32)?;
    abi::isa::check_dims([1; 3], group).map_err(|why| format!("{why} (this one has {})", product(group)))?;
    Ok(group)
}

fn product(d: [u32; 3]) -> String {
    let n: u128 = d.iter().map(|&x| x as u128).product();
    format!("{} = {n}", d.iter().map(u32::to_string).collect::<Vec<_>>().join(" x "))
}

/// X, X,Y or X,Y,Z, each dimension 1 to `hi`; missing ones are 1.
fn parse_dims(s: &str, hi: u32) -> Result<[u32; 3], String> {
    let parts: Vec<&str> = s.split(',').collect();
    if parts.len() > 3 {
        return Err(format!("{}: expected X, X,Y or X,Y,Z", num::excerpt(s)));
    }
    let mut d = [1u32; 3];
    for (i, p) in parts.iter().enumerate() {
        d[i] = num::parse_in(p, 1, hi).map_err(|e| e.to_string())?;
    }
    Ok(d)
}

enum Slot {
    Value(u64),
    Buffer { bytes: u64, init: String },
}

fn parse_slot(s: &str) -> Result<Slot, CliError> {
    let bad = |why: &dyn std::fmt::Display| CliError::Input(format!("--args {}: {why}", num::excerpt(s)));
    if let Some(rest) = s.strip_prefix("buf:") {
        let mut it = rest.splitn(2, ':');
        let bytes = num::parse_in(it.next().unwrap_or(""), 1u64, 1 << 30)
            .map_err(|e| bad(&format_args!("buffer size {e} bytes (1 GiB)")))?;
        let init = it.next().unwrap_or("zero").to_string();
        if !["zero", "iota", "iotaf", "ones"].contains(&init.as_str()) {
            return Err(bad(&"INIT must be zero, iota, iotaf or ones"));
        }
        Ok(Slot::Buffer { bytes, init })
    } else if let Some(f) = s.strip_prefix("f:") {
        let x: f32 = f.parse().map_err(|_| bad(&"not a float"))?;
        Ok(Slot::Value(x.to_bits() as u64))
    } else {
        // A slot holds 64 bits: a signed value is stored as its two's complement.
        match num::parse_in(s, i64::MIN as i128, u64::MAX as i128) {
            Ok(v) => Ok(Slot::Value(v as u64)),
            Err(num::NumError::OutOfRange { lo, hi, .. }) => {
                Err(bad(&format_args!("out of range for a 64-bit slot: expected {lo} to {hi}")))
            }
            Err(num::NumError::NotWhole(_)) => Err(bad(&"expected an integer, f:FLOAT or buf:BYTES[:INIT]")),
        }
    }
}

/// What the program's header comment says of each argument slot: lines like
/// `;   slot 1  n    u32, number of elements` (the examples' convention).
fn documented_slots(src: &str) -> BTreeMap<u32, String> {
    src.lines()
        .filter_map(|l| l.trim_start().strip_prefix(';'))
        .filter_map(|c| c.trim_start().strip_prefix("slot "))
        .filter_map(|rest| {
            let mut words = rest.split_whitespace();
            let n = words.next()?.parse().ok()?;
            let name = words.next()?;
            Some((n, format!("{name}: {}", words.collect::<Vec<_>>().join(" "))))
        })
        .collect()
}

/// Checks `--args` gave exactly the slots the program reads with `sarg` (slot 0 up to the highest
/// one read); the refusal lists what the program expects.
fn check_arity(file: &str, src: &str, binary: &program::ProgramBinary, given: usize) -> Result<(), CliError> {
    let read: BTreeSet<u32> = binary.decode().iter().filter(|i| i.op == Op::SArg).map(|i| i.imm).collect();
    let want = read.last().map_or(0, |&m| m as usize + 1);
    if given == want {
        return Ok(());
    }
    let docs = documented_slots(src);
    let expected: Vec<String> = (0..want as u32)
        .map(|k| match (docs.get(&k), read.contains(&k)) {
            (Some(d), _) => format!("  slot {k}: {d}"),
            (None, true) => format!("  slot {k}"),
            (None, false) => format!("  slot {k} (not read; any value)"),
        })
        .collect();
    let what = if want == 0 {
        "it reads no argument slots: drop --args".to_string()
    } else {
        format!("it reads {want} argument slot(s), one --args value each:\n{}", expected.join("\n"))
    };
    Err(CliError::Input(format!("{file}: --args gave {given} value(s), but {what}")))
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

/// Shows the run's progress on stderr: one line rewritten in place.
struct Progress {
    on: bool,
    shown: bool,
}

impl Progress {
    fn new(when: When) -> Self {
        let on = match when {
            When::Auto => std::io::stderr().is_terminal(),
            When::Always => true,
            When::Never => false,
        };
        Progress { on, shown: false }
    }

    fn tick(&mut self, elapsed: Duration, instructions: u64) {
        if self.on {
            let mut e = std::io::stderr().lock();
            let _ = write!(e, "\r  running: {:.1} s, {instructions} wave-instructions", elapsed.as_secs_f64());
            let _ = e.flush();
            self.shown = true;
        }
    }

    /// Ends the progress line, if one was shown.
    fn done(&mut self) {
        if std::mem::take(&mut self.shown) {
            eprintln!();
        }
    }
}

/// How often the progress line is refreshed (and the timeout looked at).
const TICK: Duration = Duration::from_millis(250);

/// Runs `doorbell run`.
pub fn run(a: RunArgs) -> Result<(), CliError> {
    let file = a.file.display().to_string();
    let src = std::fs::read_to_string(&a.file).map_err(|e| CliError::Input(format!("cannot read {file}: {e}")))?;
    let binary = program::assemble(&src).map_err(|e| CliError::Input(format!("{file}:{e}")))?;
    let slots = a.args.iter().filter(|s| !s.is_empty()).map(|s| parse_slot(s)).collect::<Result<Vec<_>, _>>()?;
    check_arity(&file, &src, &binary, slots.len())?;

    let sys = System::live(SystemConfig::default())?;
    let port: Arc<dyn KernelPort> = sys.open_process()?;
    let dev = Device::open(port)?;
    // (slot, buffer, bytes asked for): an allocation is whole pages, so it can be larger.
    let mut buffers: Vec<(usize, Buffer, u64)> = Vec::new();
    let mut words = Vec::new();
    for (i, s) in slots.iter().enumerate() {
        match s {
            Slot::Value(v) => words.push(*v),
            Slot::Buffer { bytes, init } => {
                let b = dev.upload(&init_bytes(*bytes, init))?;
                words.push(b.va());
                buffers.push((i, b, *bytes));
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
    let mut progress = Progress::new(a.progress);
    loop {
        let slice = a.timeout.map_or(TICK, |limit| TICK.min(limit.saturating_sub(t.elapsed())));
        match q.wait(v, Some(slice)) {
            Ok(()) => break,
            Err(umd::UmdError::Timeout { .. }) => {}
            Err(e) => {
                progress.done();
                return Err(e.into());
            }
        }
        let executed = sys.with_gpu(|g| g.compute_stats()).instructions - before.instructions;
        progress.tick(t.elapsed(), executed);
        if let Some(limit) = a.timeout
            && t.elapsed() >= limit
        {
            progress.done();
            return Err(CliError::TimedOut(format!(
                "{file} was still running after --timeout {limit:?} ({executed} wave-instructions executed); stopped"
            )));
        }
    }
    progress.done();
    let el = t.elapsed();
    let st = sys.with_gpu(|g| g.compute_stats());
    outln!(
        "{file}: {} instructions, grid {:?} x group {:?}: {} wave-instructions, {} lane ops in {:?}",
        binary.len(),
        a.grid,
        a.group,
        st.instructions - before.instructions,
        st.lane_ops - before.lane_ops,
        el
    );
    for (slot, b, bytes) in &buffers {
        let n = bytes.div_ceil(4);
        let mut sum = 0u64;
        let mut nonzero = 0u64;
        let mut hash = 0xcbf2_9ce4_8422_2325u64;
        let mut head = Vec::new();
        for i in 0..n {
            let w = b.read_u32(i * 4)?;
            sum = sum.wrapping_add(w as u64);
            nonzero += (w != 0) as u64;
            hash = (hash ^ w as u64).wrapping_mul(0x100_0000_01b3);
            if i < a.show as u64 {
                head.push(format!("{w:#x}"));
            }
        }
        let alloc = if b.len() != *bytes {
            format!(" (allocated as {} bytes: allocations are whole pages; the summary covers the {bytes})", b.len())
        } else {
            String::new()
        };
        let shown = if a.show as u64 > n {
            format!("all {n} words (--show {} asks for more than the buffer holds)", a.show)
        } else {
            format!("first {} words", a.show)
        };
        outln!(
            "  slot {slot}: buffer of {bytes} bytes{alloc}: {nonzero} non-zero words, u32 sum {sum}, fnv {hash:016x}\n    {shown}: [{}]",
            head.join(", ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dims_are_checked_against_the_isa_limits_naming_the_range() {
        assert_eq!(parse_grid("4,2"), Ok([4, 2, 1]));
        assert!(parse_grid("99999999999").unwrap_err().contains("out of range: expected 1 to 4294967295"));
        let e = parse_grid("4294967295,4294967295").unwrap_err();
        assert!(e.contains("at most 2^40 workgroups") && e.contains("4294967295 x 4294967295 x 1"), "{e}");
        assert!(parse_group("2048").unwrap_err().contains("out of range: expected 1 to 1024"));
        let e = parse_group("64,64").unwrap_err();
        assert!(e.contains("at most 1024 threads") && e.contains("= 4096"), "{e}");
        assert!(parse_group("0").unwrap_err().contains("out of range"));
        assert!(parse_grid("1,2,3,4").unwrap_err().contains("expected X, X,Y or X,Y,Z"));
    }

    #[test]
    fn an_integer_argument_takes_any_64_bit_value() {
        assert!(matches!(parse_slot("18446744073709551615"), Ok(Slot::Value(u64::MAX))));
        assert!(matches!(parse_slot("-1"), Ok(Slot::Value(u64::MAX))));
        assert!(matches!(parse_slot("0x40"), Ok(Slot::Value(0x40))));
        let e = parse_slot("18446744073709551616").err().unwrap().to_string();
        assert!(e.contains("out of range") && e.contains("18446744073709551615") && e.contains("64-bit slot"), "{e}");
        let e = parse_slot("twelve").err().unwrap().to_string();
        assert!(e.contains("expected an integer"), "{e}");
        let e = parse_slot("buf:0").err().unwrap().to_string();
        assert!(e.contains("out of range: expected 1 to 1073741824"), "{e}");
    }

    #[test]
    fn documented_slots_read_the_examples_header() {
        let src = include_str!("../../../examples/reduce.dbk");
        let d = documented_slots(src);
        assert_eq!(d.len(), 3);
        assert_eq!(d[&1], "n: u32, number of elements");
    }
}
