//! Standard output that ends quietly when its reader goes away.
//!
//! `println!` panics when stdout is a pipe whose reader has exited (`doorbell bench submit |
//! head -3`): Rust ignores `SIGPIPE`, so the write fails with `EPIPE`, and `println!` turns
//! that into a panic. Every line the CLI prints goes through [`outln!`] or [`out!`] instead:
//! a broken pipe ends the process with status 0, as `SIGPIPE` would end a C program (the
//! reader asked for no more), and any other write error is reported on stderr and ends it
//! with status 1. Restoring `SIGPIPE`'s default would do the same for stdout, but would also
//! let a client that closes its socket kill `doorbell serve`.

use std::io::Write;

/// Writes `args` to stdout (see the module docs for what a failed write does).
pub fn write(args: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("doorbell: error: writing to standard output: {e}");
        std::process::exit(1);
    }
}

/// `println!` for the CLI: a closed pipe ends the process quietly ([`write`]).
macro_rules! outln {
    () => { $crate::out::write(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::out::write(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `print!` for the CLI: a closed pipe ends the process quietly ([`write`]).
macro_rules! out {
    ($($arg:tt)*) => { $crate::out::write(format_args!($($arg)*)) };
}
