//! # doorbell — the command-line front end
//!
//! `doorbell demo` runs a small workload end to end on a live embedded system and prints what
//! happened; `doorbell bench submit` measures the submission paths against the machine's
//! floor. See `--help` on each.

mod bench;
mod demo;

use clap::{Parser, Subcommand};

/// doorbell: the GPU work-submission stack on a virtual GPU.
#[derive(Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a small workload end to end and print what happened: queues created, submissions,
    /// results checked, doorbell status changes, engine F0/F1 transitions, a fault contained.
    Demo {
        /// Print only the summary.
        #[arg(long)]
        quiet: bool,
    },
    /// Benchmarks. Each prints a table, or one JSON object with --json.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo { quiet } => demo::run(quiet),
        Command::Bench(b) => bench::run(b),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("doorbell: error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Errors the CLI reports.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The UMD failed.
    #[error(transparent)]
    Umd(#[from] umd::UmdError),
    /// The kernel failed.
    #[error(transparent)]
    Kernel(#[from] abi::port::KernelError),
    /// A check failed.
    #[error("check failed: {0}")]
    Check(String),
}
