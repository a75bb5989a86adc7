//! `doorbell demo --daemon`: two client processes against one daemon.
//!
//! The demo starts `doorbell serve` on a socket of its own, then two clients, each this binary
//! in a hidden `demo-client` role and each its own OS process and kernel process. A creates a
//! shareable native fence; B opens it by its global handle (spec 002) and queues a compute
//! `WAIT` on it followed by a `WRITE_DATA`; the demo prints `doorbell status` (both processes,
//! their queues); A copies 1 MiB on its copy engine, checks it, and signals the fence from the
//! GPU; B's queue resumes and B checks its word. Both leave with the orderly close, and the
//! final status shows no process. Every result is checked; a wrong one fails the demo.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Stdio};
use std::time::Duration;

use abi::EngineKind;
use abi::port::{NativeFenceDesc, NativeFenceType};
use clap::Args;
use umd::{CommandBuffer, Device, QueueOptions};

use crate::CliError;
use crate::child::DaemonChild;

const T: Option<Duration> = Some(Duration::from_secs(30));

#[derive(Args)]
pub struct DemoClientArgs {
    /// `a` or `b`.
    role: String,
    /// B: the fence's global handle.
    #[arg(long)]
    global: Option<u64>,
}

fn say(what: &str) {
    outln!("{what}");
    let _ = std::io::stdout().flush();
}

/// One client's part (run as a child process; `DOORBELL_SOCKET` names the daemon).
pub fn client(a: DemoClientArgs) -> Result<(), CliError> {
    let dev = Device::open(wire::client::connect_default()?)?;
    match a.role.as_str() {
        "a" => {
            let copy = dev.create_context(dev.engine(EngineKind::Copy)?)?;
            let desc = NativeFenceDesc { shareable: true, ..NativeFenceDesc::new(0, NativeFenceType::Default) };
            let fence = dev.create_fence_with(&desc)?;
            let global = fence.global().ok_or_else(|| CliError::Check("no global handle".into()))?;
            say(&format!("global {global}"));
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).map_err(|e| CliError::Input(e.to_string()))?;
            let (src, dst) = (dev.allocate(1 << 20)?, dev.allocate(1 << 20)?);
            let mut q = copy.create_queue(QueueOptions::user_mode())?;
            let mut cb = CommandBuffer::new();
            cb.fill(src.va(), 1 << 20, 0xa5a5_0001).copy(src.va(), dst.va(), 1 << 20).signal_fence(&fence, 1);
            let v = q.submit(&cb)?;
            q.wait(v, T)?;
            for off in (0..1u64 << 20).step_by(4096) {
                if dst.read_u32(off)? != 0xa5a5_0001 {
                    return Err(CliError::Check(format!("A: copy wrong at {off:#x}")));
                }
            }
            say("ok A copied 1 MiB on its copy engine and signalled the shared fence to 1 from the GPU");
        }
        "b" => {
            let global = a.global.ok_or_else(|| CliError::Input("--global".into()))?;
            let compute = dev.create_context(dev.engine(EngineKind::Compute)?)?;
            let fence = dev.open_fence(global)?;
            let buf = dev.allocate(4096)?;
            let mut q = compute.create_queue(QueueOptions::user_mode())?;
            let mut cb = CommandBuffer::new();
            cb.wait_fence(&fence, 1).write_u32(buf.va(), 0xb0b);
            let v = q.submit(&cb)?;
            say("waiting");
            q.wait(v, T)?;
            if buf.read_u32(0)? != 0xb0b {
                return Err(CliError::Check("B: word not written".into()));
            }
            say("ok B's compute queue waited on A's fence (GPU-side, across processes) and then wrote its word");
        }
        r => return Err(CliError::Input(format!("role {r}: a or b"))),
    }
    Ok(())
}

struct Proc {
    child: Child,
    out: BufReader<ChildStdout>,
    stdin: ChildStdin,
}

impl Proc {
    fn spawn(socket: &std::path::Path, args: &[&str]) -> Result<Proc, CliError> {
        let mut child = crate::child::command(["demo-client"])?
            .args(args)
            .env("DOORBELL_SOCKET", socket)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| CliError::Input(e.to_string()))?;
        let out = BufReader::new(child.stdout.take().ok_or_else(|| CliError::Check("stdout".into()))?);
        let stdin = child.stdin.take().ok_or_else(|| CliError::Check("stdin".into()))?;
        Ok(Proc { child, out, stdin })
    }

    fn line(&mut self) -> Result<String, CliError> {
        let mut l = String::new();
        self.out.read_line(&mut l).map_err(|e| CliError::Input(e.to_string()))?;
        if l.is_empty() {
            return Err(CliError::Check("a client ended early".into()));
        }
        Ok(l.trim_end().to_owned())
    }

    fn finish(mut self) -> Result<String, CliError> {
        let l = self.line()?;
        let st = self.child.wait().map_err(|e| CliError::Input(e.to_string()))?;
        if !st.success() || !l.starts_with("ok") {
            return Err(CliError::Check(format!("client failed ({st}): {l}")));
        }
        Ok(l)
    }
}

fn show_status(socket: &std::path::Path) -> Result<(), CliError> {
    let s = wire::client::daemon_status(socket).map_err(|e| CliError::Input(e.to_string()))?;
    for p in &s.processes {
        outln!("  process p{} (os pid {}): {} allocations, {} queues", p.pid, p.os_pid, p.allocations, p.queues.len());
        for q in &p.queues {
            outln!("    {} engine {} {} {} completed {}", q.handle, q.engine, q.mode, q.state, q.completed);
        }
    }
    if s.processes.is_empty() {
        outln!("  no client processes");
    }
    Ok(())
}

pub fn run(quiet: bool) -> Result<(), CliError> {
    let d = DaemonChild::start_with("")?;
    if !quiet {
        outln!("daemon: doorbell serve on {} (pid {})", d.socket.display(), d.child.id());
    }
    let mut a = Proc::spawn(&d.socket, &["a"])?;
    let global = a.line()?;
    let global = global.strip_prefix("global ").ok_or_else(|| CliError::Check(global.clone()))?.to_owned();
    let mut b = Proc::spawn(&d.socket, &["b", "--global", &global])?;
    let w = b.line()?;
    if w != "waiting" {
        return Err(CliError::Check(w));
    }
    if !quiet {
        outln!(
            "client A (os pid {}) shared native fence {global}; client B (os pid {}) opened it",
            a.child.id(),
            b.child.id()
        );
        outln!("doorbell status, both clients connected:");
        show_status(&d.socket)?;
    }
    writeln!(a.stdin, "go").map_err(|e| CliError::Input(e.to_string()))?;
    let la = a.finish()?;
    let lb = b.finish()?;
    outln!("A: {la}");
    outln!("B: {lb}");
    let s = wire::client::daemon_status(&d.socket).map_err(|e| CliError::Input(e.to_string()))?;
    if !s.processes.is_empty() {
        return Err(CliError::Check(format!("{} processes left after both clients closed", s.processes.len())));
    }
    if !quiet {
        outln!("doorbell status after both clients left:");
        show_status(&d.socket)?;
    }
    outln!("daemon demo: two client processes, one daemon, results checked: ok");
    Ok(())
}
