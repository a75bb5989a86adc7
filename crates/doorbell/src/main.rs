//! # doorbell — the command-line front end
//!
//! `doorbell demo` runs a small workload end to end on a live embedded system and prints what
//! happened; `doorbell run` assembles and dispatches a compute program; `doorbell trace` writes a fence
//! pipeline's timeline; `doorbell bench …` measures the submission paths, compute, fences and
//! oversubscription against the machine's floor. See `--help` on each.
//!
//! Input is checked here, before anything reaches the device, so a refusal names the flag, the
//! value and what is allowed rather than coming back as a lost queue: every numeric flag goes
//! through one parser ([`num`]), dispatch dimensions are checked against the ISA's limits and
//! `run`'s arguments against the slots the program reads.

#[macro_use]
mod out;
mod bench;
mod bench_cuda;
mod bench_daemon;
mod bench_fences;
mod bench_neighbour;
mod bench_oversub;
mod bench_pgo;
mod bench_preempt;
mod child;
mod demo;
mod demo_daemon;
mod demo_pgo;
mod error;
mod examples;
mod load;
mod measure;
mod num;
mod run;
mod serve;
mod sim_cmd;
mod top;
mod top_view;
mod trace;

use clap::{Parser, Subcommand};

// Every subcommand returns it, so it lives below them all, in a module of its own; the
// re-export keeps its path `crate::CliError`.
pub(crate) use error::CliError;

/// doorbell: the GPU work-submission stack on a virtual GPU.
#[derive(Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a small workload end to end on a live system and print what happened.
    ///
    /// Two client processes (A and B): user-mode and kernel-mode queues with checked results, a
    /// cross-engine WAIT/SIGNAL, engines going idle (F1) and waking, the example programs, a
    /// native fence shared between the processes, a fault contained in its queue and a
    /// cross-adapter fence; then the kernel's trace (doorbell status changes, power, faults)
    /// and a summary. Exits non-zero if any result is wrong.
    Demo {
        /// Print only the summary.
        #[arg(long)]
        quiet: bool,
        /// Instead: start a daemon (doorbell serve) and two client processes that share a
        /// native fence across it, with doorbell status in between.
        #[arg(long)]
        daemon: bool,
    },
    /// One client of `demo --daemon` (run as a child process).
    #[command(hide = true)]
    DemoClient(demo_daemon::DemoClientArgs),
    /// Assemble a compute program (.dbk) and run it on the compute engine; print a summary of its
    /// buffers.
    ///
    /// Example: doorbell run examples/saxpy.dbk --grid 4 --group 256 --args
    /// buf:4096:iotaf,buf:4096:iotaf,f:2.0,1000 (saxpy's slots are x, y, a, n: the header of
    /// each example file lists its slots). --grid, --group and --args are checked before the
    /// program runs: against the ISA's DISPATCH limits and the slots the program reads.
    Run(run::RunArgs),
    /// Run a fence pipeline across three queues and two engines and write its timeline as
    /// Chrome/Perfetto trace JSON: one track per queue, a box per signal and wait from when it
    /// was queued (CPU) to when it executed (GPU, from the fence logs).
    Trace(trace::TraceArgs),
    /// Benchmarks. Each prints a table, or one JSON object with --json.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Run the daemon: the kernel and the virtual GPU in this process, serving client
    /// processes over a Unix socket (wire::client::connect, DOORBELL_SOCKET). Stops on SIGINT
    /// or SIGTERM; every client then sees its device lost.
    Serve(serve::ServeArgs),
    /// Ask a running daemon what it holds: adapters, engines (power, slots), processes and
    /// their queues (state, priority, doorbell, completed), doorbell use, faults.
    Status(serve::StatusArgs),
    /// A live view of a running daemon, in the style of nvtop: engines (power, slots, busy
    /// share over time), processes and their queues (state, priority, doorbell, submissions
    /// per second, completed, faults) and recent faults and recoveries. `q` quits; `--once`
    /// prints one frame as text.
    Top(top::TopArgs),
    /// A client of a running daemon that keeps queues busy for a while (to watch with `top`,
    /// or to load a configuration): N user-mode queues submitting checked command buffers
    /// of modelled work at a steady rate.
    Load(load::LoadArgs),
    /// Deterministic simulation: run a scenario file on the real stack in virtual time and
    /// write summary.json, queues.csv, trace.json, plots and report.html; or `sweep`,
    /// `merge`, `calibrate` (see docs/sim.md).
    Sim(sim_cmd::SimArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo { quiet, daemon: false } => demo::run(quiet),
        Command::Demo { quiet, daemon: true } => demo_daemon::run(quiet),
        Command::DemoClient(a) => demo_daemon::client(a),
        Command::Run(a) => run::run(a),
        Command::Trace(a) => trace::run(a),
        Command::Bench(b) => bench::run(b),
        Command::Serve(a) => serve::serve(a),
        Command::Status(a) => serve::status(a),
        Command::Sim(a) => sim_cmd::run(a),
        Command::Top(a) => top::run(a),
        Command::Load(a) => load::run(a),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("doorbell: error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
