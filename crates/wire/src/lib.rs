//! # wire — the daemon socket's format and transport
//!
//! In the multi-process mode (roadmap item 6) the kernel and the virtual GPU live in a daemon
//! (crate `daemon`, `doorbell serve`) and every client process reaches it through a Unix
//! socket. This crate is what both ends share: the messages, their encoding, the handshake
//! and the transport, so that neither end knows the other's internals. It also holds the
//! client's end, [`client`]: the [`abi::port::KernelPort`] a client process opens a
//! `umd::Device` on. The driver (`umd`) does not depend on this crate; a client links both.
//!
//! ## What crosses the socket
//!
//! Only the control path (spec 000's "system calls": [`abi::port::KernelPort`]). A system call
//! crosses as the value it already is: [`Request::Call`] carries an [`abi::port::Call`], and
//! the [`Response`] carries its [`abi::port::Reply`] or the typed [`abi::port::KernelError`]
//! exactly as the embedded mode returns it. Nothing here lists the calls again. Besides the
//! calls, a connection has a few messages of its own (the adapter info at connect, status,
//! goodbye, the wake word).
//!
//! Shared memory never crosses as bytes: allocations (rings, ring control), kernel pages,
//! fence pages and doorbell pages cross as file descriptors (`SCM_RIGHTS`) attached to the
//! reply that hands them out. The reply is the kernel's, with its memory carried as [`Fds`]
//! ([`abi::port::Memory`]): each mapping or page is the index of a descriptor in the frame
//! ([`FdRef`]). The daemon translates the kernel's in-process reply into that, and the client
//! translates it back ([`abi::port::Translate`]) and maps the descriptors; from then on the
//! data path (packets, wptr, the doorbell write, reading the progress fence) is memory only.
//!
//! ## Format
//!
//! [`postcard`] (serde, varint integers): compact, no schema negotiation, well kept. Each
//! message is one frame: a 4-byte little-endian length, then that many bytes of postcard. The
//! socket is `SOCK_SEQPACKET`, so a frame is one packet and descriptors arrive with the frame
//! they belong to. A frame longer than [`MAX_FRAME`], a length prefix that disagrees with the
//! packet (truncated or padded), more than [`MAX_FDS`] descriptors or bytes that do not decode
//! are each a typed [`WireError`]; the daemon ends that connection only.
//!
//! ## Versioning and the handshake
//!
//! The first frame a client sends is a [`Hello`]: [`MAGIC`] and [`PROTOCOL_VERSION`] first,
//! as two fixed `u32`s that every version of this format keeps in place, so a daemon can read
//! the version of a client whose messages it could not otherwise decode. A different version
//! is refused with [`HandshakeError::VersionMismatch`] naming both, and the connection closes.
//! Any change to a message's encoding bumps [`PROTOCOL_VERSION`].
//!
//! ## Invariants
//!
//! - Every received length, count and index is checked before use; decoding never panics.
//! - A descriptor received is owned ([`OwnedFd`]) and closed when dropped, so a frame that is
//!   refused leaks nothing.
//! - Handles cross as `(owner, index, generation)`; the daemon checks them against the
//!   caller's object table like any other handle, so a forged or replayed one is refused.
#![forbid(unsafe_code)]

use std::borrow::Cow;
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use abi::ProcessId;
use abi::port::{AdapterInfo, Call, KernelError};
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

pub mod client;
pub mod status;

pub use status::DaemonStatus;

/// The first four bytes of every [`Hello`]: "DBL\x01".
pub const MAGIC: u32 = u32::from_le_bytes(*b"DBL\x01");
/// This format's version. Bumped on any change to a message's encoding.
pub const PROTOCOL_VERSION: u32 = 8;
/// The largest frame payload, in bytes. A `SOCK_SEQPACKET` packet must fit the socket's send
/// buffer (about 208 KiB by default), so frames stay well below it.
pub const MAX_FRAME: usize = 128 << 10;
/// The most descriptors one frame carries.
pub const MAX_FDS: usize = 8;
/// Bytes of the length prefix.
const PREFIX: usize = 4;

/// Why a frame could not be sent or received.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The peer closed the connection (end of stream).
    #[error("the peer closed the connection")]
    Closed,
    /// A system call failed.
    #[error("{what}: {errno}")]
    Io {
        /// Which operation.
        what: &'static str,
        /// The error.
        errno: String,
    },
    /// A frame longer than [`MAX_FRAME`] (its length prefix or its packet).
    #[error("frame of {len} bytes exceeds the maximum of {max}")]
    Oversized {
        /// The length seen.
        len: usize,
        /// [`MAX_FRAME`].
        max: usize,
    },
    /// A packet whose length prefix does not match its size, or shorter than the prefix.
    #[error("truncated frame: the prefix says {declared} bytes, the packet holds {got}")]
    Truncated {
        /// What the prefix declared.
        declared: usize,
        /// What arrived after the prefix.
        got: usize,
    },
    /// More descriptors than [`MAX_FDS`], or descriptors cut off by the kernel.
    #[error("frame carries too many descriptors (at most {max})")]
    TooManyFds {
        /// [`MAX_FDS`].
        max: usize,
    },
    /// The payload does not decode as the expected message.
    #[error("malformed {what}: {why}")]
    Malformed {
        /// What was expected.
        what: &'static str,
        /// The decoder's reason.
        why: String,
    },
    /// A message names a descriptor the frame does not carry.
    #[error("{what} names descriptor {index}, but the frame carries {count}")]
    MissingFd {
        /// What named it.
        what: &'static str,
        /// The index named.
        index: u8,
        /// Descriptors carried.
        count: usize,
    },
}

fn io(what: &'static str) -> impl FnOnce(rustix::io::Errno) -> WireError {
    move |e| WireError::Io { what, errno: e.to_string() }
}

/// One end of a connection: a `SOCK_SEQPACKET` Unix socket carrying framed messages.
#[derive(Debug)]
pub struct Channel {
    fd: OwnedFd,
}

impl Channel {
    /// Connects to a daemon listening at `path`.
    pub fn connect(path: &Path) -> Result<Channel, WireError> {
        let fd = rustix::net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
            .map_err(io("socket"))?;
        let addr = SocketAddrUnix::new(path).map_err(io("socket path"))?;
        rustix::net::connect(&fd, &addr).map_err(io("connect"))?;
        Ok(Channel { fd })
    }

    /// A connected pair (tests, and a daemon run in-process).
    pub fn pair() -> Result<(Channel, Channel), WireError> {
        let (a, b) = rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
            .map_err(io("socketpair"))?;
        Ok((Channel { fd: a }, Channel { fd: b }))
    }

    /// Wraps an accepted socket.
    pub fn from_fd(fd: OwnedFd) -> Channel {
        Channel { fd }
    }

    /// The socket.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Bounds how long [`recv`](Self::recv) blocks (`None`: forever); past it, `recv` fails
    /// with [`WireError::Io`].
    pub fn set_recv_timeout(&self, timeout: Option<std::time::Duration>) -> Result<(), WireError> {
        rustix::net::sockopt::set_socket_timeout(&self.fd, rustix::net::sockopt::Timeout::Recv, timeout)
            .map_err(io("SO_RCVTIMEO"))
    }

    /// Shuts both directions down: a thread blocked in [`recv`](Self::recv) on either end
    /// returns [`WireError::Closed`].
    pub fn shutdown(&self) {
        let _ = rustix::net::shutdown(&self.fd, rustix::net::Shutdown::Both);
    }

    /// Sends `msg` with `fds` attached.
    pub fn send<T: Serialize>(&self, msg: &T, fds: &[BorrowedFd<'_>]) -> Result<(), WireError> {
        let mut buf = vec![0u8; PREFIX];
        let body = postcard::to_extend(msg, Vec::new())
            .map_err(|e| WireError::Malformed { what: "outgoing message", why: e.to_string() })?;
        if body.len() > MAX_FRAME {
            return Err(WireError::Oversized { len: body.len(), max: MAX_FRAME });
        }
        buf[..PREFIX].copy_from_slice(&(body.len() as u32).to_le_bytes());
        buf.extend_from_slice(&body);
        self.send_raw(&buf, fds)
    }

    /// Sends `payload` as one frame (length prefix added) with `fds` attached.
    pub fn send_payload(&self, payload: &[u8], fds: &[BorrowedFd<'_>]) -> Result<(), WireError> {
        if payload.len() > MAX_FRAME {
            return Err(WireError::Oversized { len: payload.len(), max: MAX_FRAME });
        }
        let mut buf = Vec::with_capacity(PREFIX + payload.len());
        buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        buf.extend_from_slice(payload);
        self.send_raw(&buf, fds)
    }

    /// Sends `bytes` as one packet, exactly (no prefix added): for tests that send what a
    /// broken or hostile peer would.
    pub fn send_raw(&self, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> Result<(), WireError> {
        if fds.len() > MAX_FDS {
            return Err(WireError::TooManyFds { max: MAX_FDS });
        }
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
            return Err(WireError::TooManyFds { max: MAX_FDS });
        }
        let flags = SendFlags::NOSIGNAL;
        match rustix::net::sendmsg(&self.fd, &[IoSlice::new(bytes)], &mut control, flags) {
            Ok(_) => Ok(()),
            Err(rustix::io::Errno::PIPE | rustix::io::Errno::CONNRESET) => Err(WireError::Closed),
            Err(e) => Err(io("sendmsg")(e)),
        }
    }

    /// Receives one frame: the decoded message and the descriptors that came with it.
    pub fn recv<T: DeserializeOwned>(&self, what: &'static str) -> Result<(T, Vec<OwnedFd>), WireError> {
        let (bytes, fds) = self.recv_frame()?;
        let msg = postcard::from_bytes(&bytes).map_err(|e| WireError::Malformed { what, why: e.to_string() })?;
        Ok((msg, fds))
    }

    /// [`recv`](Self::recv) without blocking: `None` if no frame is waiting.
    pub fn try_recv<T: DeserializeOwned>(&self, what: &'static str) -> Result<Option<(T, Vec<OwnedFd>)>, WireError> {
        let Some((bytes, fds)) = self.recv_frame_with(RecvFlags::DONTWAIT)? else { return Ok(None) };
        let msg = postcard::from_bytes(&bytes).map_err(|e| WireError::Malformed { what, why: e.to_string() })?;
        Ok(Some((msg, fds)))
    }

    /// Receives one frame's payload (prefix checked and removed) and its descriptors.
    pub fn recv_frame(&self) -> Result<Frame, WireError> {
        self.recv_frame_with(RecvFlags::empty()).map(|f| f.expect("a blocking receive returns a frame"))
    }

    /// [`recv_frame`](Self::recv_frame) with `flags`; `None`: `DONTWAIT` and nothing waiting.
    fn recv_frame_with(&self, flags: RecvFlags) -> Result<Option<Frame>, WireError> {
        // One byte more than the largest frame, so an oversized packet shows as TRUNC or as
        // a length past the maximum.
        let mut buf = vec![0u8; PREFIX + MAX_FRAME + 1];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let got = loop {
            let mut iov = [IoSliceMut::new(&mut buf)];
            match rustix::net::recvmsg(&self.fd, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC | flags) {
                Ok(m) => break m,
                Err(rustix::io::Errno::INTR) => continue,
                Err(rustix::io::Errno::AGAIN) if flags.contains(RecvFlags::DONTWAIT) => return Ok(None),
                Err(rustix::io::Errno::CONNRESET) => return Err(WireError::Closed),
                Err(e) => return Err(io("recvmsg")(e)),
            }
        };
        let mut fds = Vec::new();
        for msg in control.drain() {
            if let RecvAncillaryMessage::ScmRights(rights) = msg {
                fds.extend(rights);
            }
        }
        if got.flags.contains(ReturnFlags::CTRUNC) || fds.len() > MAX_FDS {
            return Err(WireError::TooManyFds { max: MAX_FDS });
        }
        if got.bytes == 0 {
            return Err(WireError::Closed);
        }
        if got.flags.contains(ReturnFlags::TRUNC) || got.bytes > PREFIX + MAX_FRAME {
            return Err(WireError::Oversized { len: got.bytes.saturating_sub(PREFIX), max: MAX_FRAME });
        }
        if got.bytes < PREFIX {
            return Err(WireError::Truncated { declared: PREFIX, got: got.bytes });
        }
        let declared = u32::from_le_bytes(buf[..PREFIX].try_into().expect("4 bytes")) as usize;
        if declared > MAX_FRAME {
            return Err(WireError::Oversized { len: declared, max: MAX_FRAME });
        }
        if declared != got.bytes - PREFIX {
            return Err(WireError::Truncated { declared, got: got.bytes - PREFIX });
        }
        buf.truncate(got.bytes);
        buf.drain(..PREFIX);
        Ok(Some((buf, fds)))
    }
}

/// A received frame: its payload and the descriptors that came with it.
type Frame = (Vec<u8>, Vec<OwnedFd>);

/// A listening socket.
#[derive(Debug)]
pub struct Listener {
    fd: OwnedFd,
}

impl Listener {
    /// Binds and listens at `path` (which must not exist).
    pub fn bind(path: &Path) -> Result<Listener, WireError> {
        let fd = rustix::net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
            .map_err(io("socket"))?;
        let addr = SocketAddrUnix::new(path).map_err(io("socket path"))?;
        rustix::net::bind(&fd, &addr).map_err(io("bind"))?;
        rustix::net::listen(&fd, 64).map_err(io("listen"))?;
        Ok(Listener { fd })
    }

    /// Accepts one connection.
    pub fn accept(&self) -> Result<Channel, WireError> {
        loop {
            match rustix::net::accept_with(&self.fd, SocketFlags::CLOEXEC) {
                Ok(fd) => return Ok(Channel { fd }),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(io("accept")(e)),
            }
        }
    }

    /// The socket (to shut it down from another thread).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Stops accepting: a thread blocked in [`accept`](Self::accept) returns an error.
    pub fn shutdown(&self) {
        let _ = rustix::net::shutdown(&self.fd, rustix::net::Shutdown::Both);
    }
}

/// The version prefix every [`Hello`] starts with, whatever its version: what a daemon can
/// always decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelloPrefix {
    /// [`MAGIC`].
    pub magic: u32,
    /// The client's [`PROTOCOL_VERSION`].
    pub version: u32,
}

impl HelloPrefix {
    /// Reads the prefix of a hello frame's payload: two little-endian `u32`s.
    pub fn parse(payload: &[u8]) -> Option<HelloPrefix> {
        let magic = u32::from_le_bytes(payload.get(0..4)?.try_into().ok()?);
        let version = u32::from_le_bytes(payload.get(4..8)?.try_into().ok()?);
        Some(HelloPrefix { magic, version })
    }
}

/// The first frame of a connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// [`MAGIC`] and the version, as fixed-width integers ([`Hello::encode`]).
    #[serde(skip)]
    pub prefix: Option<HelloPrefix>,
    /// What the connection is for.
    pub kind: HelloKind,
}

impl Hello {
    /// The payload: [`MAGIC`] and `version` as little-endian `u32`s, then the postcard body.
    pub fn encode(&self, version: u32) -> Vec<u8> {
        let mut out = Vec::with_capacity(32);
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.extend_from_slice(&version.to_le_bytes());
        postcard::to_extend(&self.kind, out).expect("a hello always encodes")
    }

    /// Decodes a payload made by [`encode`](Self::encode) (the prefix checked by the caller).
    pub fn decode(payload: &[u8]) -> Result<Hello, WireError> {
        let prefix = HelloPrefix::parse(payload).ok_or(WireError::Truncated { declared: 8, got: payload.len() })?;
        let kind = postcard::from_bytes(&payload[8..])
            .map_err(|e| WireError::Malformed { what: "hello", why: e.to_string() })?;
        Ok(Hello { prefix: Some(prefix), kind })
    }
}

/// What a connection is for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum HelloKind {
    /// A new client process: the daemon opens a kernel process for it, ended (abnormally)
    /// when this connection closes without [`Request::Goodbye`].
    Open {
        /// The client's OS process id (for `doorbell status` and logs; not trusted: the
        /// daemon also reads the socket's peer credentials).
        os_pid: u32,
        /// A name for `doorbell status`.
        name: String,
    },
    /// A further connection of a process already open (so a blocking wait on one thread does
    /// not hold up another thread's calls), proved by the token its [`Welcome`] carried.
    Attach {
        /// The token.
        token: [u8; 16],
    },
    /// An observer: `doorbell status` (no kernel process).
    Observe,
}

/// Why a handshake was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum HandshakeError {
    /// The client speaks another version of this protocol.
    #[error("protocol version mismatch: the client speaks version {client}, the daemon version {daemon}")]
    VersionMismatch {
        /// The client's.
        client: u32,
        /// The daemon's.
        daemon: u32,
    },
    /// The first frame does not start with [`MAGIC`].
    #[error("not a doorbell client: magic {found:#010x}, expected {MAGIC:#010x}")]
    BadMagic {
        /// What it started with.
        found: u32,
    },
    /// An attach token that names no open process.
    #[error("attach token names no open process")]
    BadToken,
    /// The daemon could not open a process (its error).
    #[error("the daemon could not open a process: {0}")]
    Kernel(KernelError),
    /// The process already has as many connections as the daemon allows.
    #[error("a client process may hold at most {}", counted(*max as u64, "connection", "connections"))]
    TooManyConnections {
        /// The limit.
        max: usize,
    },
    /// The daemon is at its limit of client processes.
    #[error("the daemon serves at most {}", counted(*max as u64, "client process", "client processes"))]
    TooManyClients {
        /// The limit.
        max: usize,
    },
}

/// The daemon's answer to a [`Hello`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Welcome {
    /// Accepted.
    Accepted {
        /// The kernel process this connection acts as (none for an observer).
        process: Option<ProcessId>,
        /// Proof for [`HelloKind::Attach`] connections of the same process.
        token: [u8; 16],
        /// The daemon's device clock: `CLOCK_MONOTONIC` nanoseconds at device time 0, so a
        /// client can read device time (`TIMESTAMP` packets) with no call.
        device_epoch_ns: u64,
        /// The per-process limits the daemon enforces.
        limits: Limits,
    },
    /// Refused; the daemon closes the connection.
    Refused(HandshakeError),
}

/// Per-process limits (the daemon refuses past them with [`KernelError::Exhausted`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Live allocations (and native fences).
    pub allocations: u32,
    /// Bytes of live allocations.
    pub bytes: u64,
    /// Live hardware queues.
    pub queues: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { allocations: 4096, bytes: 1 << 30, queues: 256 }
    }
}

/// Why a client could not connect.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConnectError {
    /// The socket could not be reached or the handshake frame was bad.
    #[error("daemon socket {path}: {error}")]
    Wire {
        /// The socket.
        path: String,
        /// What failed.
        error: WireError,
    },
    /// The daemon refused the handshake.
    #[error("daemon socket {path}: refused: {error}")]
    Refused {
        /// The socket.
        path: String,
        /// Why.
        error: HandshakeError,
    },
}

/// What an accepted handshake gives a client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Accepted {
    /// The kernel process (none for an observer).
    pub process: Option<ProcessId>,
    /// The attach token.
    pub token: [u8; 16],
    /// `CLOCK_MONOTONIC` nanoseconds at device time 0.
    pub device_epoch_ns: u64,
    /// The daemon's per-process limits.
    pub limits: Limits,
}

/// Connects to `path` and shakes hands as `kind`, speaking protocol `version` (always
/// [`PROTOCOL_VERSION`] except in tests of the refusal).
pub fn connect(path: &Path, kind: HelloKind, version: u32) -> Result<(Channel, Accepted), ConnectError> {
    let name = path.display().to_string();
    let wire = |error| ConnectError::Wire { path: name.clone(), error };
    let chan = Channel::connect(path).map_err(wire)?;
    chan.send_payload(&Hello { prefix: None, kind }.encode(version), &[]).map_err(wire)?;
    let (welcome, _) = chan.recv::<Welcome>("welcome").map_err(wire)?;
    match welcome {
        Welcome::Accepted { process, token, device_epoch_ns, limits } => {
            Ok((chan, Accepted { process, token, device_epoch_ns, limits }))
        }
        Welcome::Refused(error) => Err(ConnectError::Refused { path: name, error }),
    }
}

/// The environment variable naming the daemon's socket for clients.
pub const SOCKET_ENV: &str = "DOORBELL_SOCKET";

/// `$XDG_RUNTIME_DIR/doorbell/doorbell.sock`, else `/tmp/doorbell-$UID/doorbell.sock`: where
/// `doorbell serve` listens and clients look by default.
pub fn default_socket_path() -> std::path::PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(dir) => std::path::PathBuf::from(dir).join("doorbell").join("doorbell.sock"),
        None => std::path::PathBuf::from(format!("/tmp/doorbell-{}", rustix::process::getuid().as_raw()))
            .join("doorbell.sock"),
    }
}

/// `n` and its noun, singular or plural as `n` asks: "1 client process", "2 client processes".
pub fn counted(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// A descriptor carried by the frame, by its index in the frame's list.
pub type FdRef = u8;

/// A CPU mapping handed to the client: map `len` bytes of descriptor `fd` at `file_offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireMapping {
    /// The descriptor (read-only for a read-only mapping: it cannot be mapped writable).
    pub fd: FdRef,
    /// Page-aligned offset in the file.
    pub file_offset: u64,
    /// Bytes.
    pub len: u64,
    /// Map it read-only.
    pub read_only: bool,
}

/// A page of a file (a doorbell page): descriptor and page-aligned offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WirePage {
    /// The descriptor.
    pub fd: FdRef,
    /// Page-aligned offset in the file.
    pub file_offset: u64,
}

/// Shared memory as the socket carries it ([`abi::port::Memory`]): each mapping or page a
/// reply hands out is a descriptor passed beside the frame (`SCM_RIGHTS`), named by its index.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Fds;

impl abi::port::Memory for Fds {
    /// Descriptor, offset, length and protection: the client maps it.
    type Mapping = WireMapping;
    /// Nothing: the client's doorbell page starts on a dummy page of its own, and the daemon
    /// never hands out its BAR (see `daemon`'s "Doorbell pages across processes").
    type DoorbellPage = ();
    /// The memfd page the daemon shows in place of the aggregated doorbell's BAR page.
    type AggregatedPage = WirePage;
    /// The doorbell's page now (the memfd the daemon shows the firmware in place of the BAR
    /// page), or `None` if the doorbell was disconnected again before the reply (an engine
    /// went idle): the client keeps its dummy page, reads `DisconnectedRetry` and connects
    /// again.
    type Connected = Option<WirePage>;
}

/// One message of a client: a system call of its process, or one of the connection's own.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request<'a> {
    /// A system call ([`abi::port::Call`]), answered by [`Reply::Call`]: the client sends it
    /// borrowed, the daemon decodes it owned.
    Call(Cow<'a, Call<'a>>),
    /// The adapter the process's port is opened on ([`abi::port::KernelPort::adapter_info`]),
    /// asked once, at connect.
    AdapterInfo,
    /// What `doorbell status` shows.
    Status,
    /// The orderly close: the process ends with spec 000's normal termination (its queued
    /// work runs out first), then the daemon answers and closes the connection.
    Goodbye,
    /// This connection's wake word (since version 3): the daemon bumps it and wakes its
    /// sleepers (a shared futex) when a wait this connection asks for is decided, and again
    /// once the wait's answer is sent; the client sleeps on it instead of in a read of the
    /// socket. Asked once per connection.
    WakeWord,
}

/// A successful answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// A system call's reply, its shared memory as descriptors of the frame.
    Call(abi::port::Reply<Fds>),
    /// [`Request::AdapterInfo`].
    AdapterInfo(AdapterInfo),
    /// [`Request::Status`].
    Status(Box<DaemonStatus>),
    /// [`Request::Goodbye`]: the process has ended.
    Goodbye,
    /// [`Request::WakeWord`]: the process's wake page (read-only) and the byte offset of this
    /// connection's 32-bit word in it.
    WakeWord(WireMapping, u64),
}

impl Reply {
    /// The reply's kind, for errors.
    pub fn name(&self) -> &'static str {
        match self {
            Reply::Call(r) => r.name(),
            Reply::AdapterInfo(_) => "adapter info",
            Reply::Status(_) => "status",
            Reply::Goodbye => "goodbye",
            Reply::WakeWord(..) => "wake word",
        }
    }
}

/// The answer to a [`Request`]: typed kernel errors, exactly as in embedded mode.
pub type Response = Result<Reply, KernelError>;

/// Takes descriptor `index` out of a received frame's list.
pub fn take_fd(fds: &mut [Option<OwnedFd>], index: FdRef, what: &'static str) -> Result<OwnedFd, WireError> {
    let count = fds.len();
    fds.get_mut(index as usize).and_then(Option::take).ok_or(WireError::MissingFd { what, index, count })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_with_descriptors() {
        let (a, b) = Channel::pair().unwrap();
        let page = shm::Shm::new("t", 4096).unwrap();
        page.write_u64(0, 42).unwrap();
        let query = Request::Call(Cow::Owned(Call::QueryQueue(abi::HwQueueHandle::new(ProcessId(3), 1, 2))));
        a.send(&query, &[page.fd()]).unwrap();
        let (r, fds): (Request, _) = b.recv("request").unwrap();
        assert_eq!(r, query);
        assert_eq!(fds.len(), 1);
        let m = shm::Mapping::new(fds[0].as_fd(), 0, 4096, shm::Prot::ReadOnly).unwrap();
        assert_eq!(m.read_u64(0).unwrap(), 42);
    }

    #[test]
    fn typed_errors_cross_intact() {
        let (a, b) = Channel::pair().unwrap();
        let e = KernelError::InvalidArgument {
            field: "ring_bytes",
            value: "100".into(),
            reason: abi::port::Invalid::RingSize(abi::ring::RingSizeError::NotPowerOfTwo),
        };
        a.send(&Response::Err(e.clone()), &[]).unwrap();
        let (r, _): (Response, _) = b.recv("response").unwrap();
        assert_eq!(r, Err(e.clone()));
        assert_eq!(r.unwrap_err().to_string(), e.to_string());
    }

    #[test]
    fn bad_frames_are_typed_errors() {
        let (a, b) = Channel::pair().unwrap();
        a.send_raw(&[1, 2], &[]).unwrap();
        assert_eq!(b.recv_frame().unwrap_err(), WireError::Truncated { declared: 4, got: 2 });
        a.send_raw(&[10, 0, 0, 0, 1, 2, 3], &[]).unwrap();
        assert_eq!(b.recv_frame().unwrap_err(), WireError::Truncated { declared: 10, got: 3 });
        a.send_raw(&[0xff, 0xff, 0xff, 0x7f], &[]).unwrap();
        assert!(matches!(b.recv_frame().unwrap_err(), WireError::Oversized { .. }));
        a.send_raw(&vec![0u8; PREFIX + MAX_FRAME + 10], &[]).unwrap();
        assert!(matches!(b.recv_frame().unwrap_err(), WireError::Oversized { .. }));
        a.send_raw(&[3, 0, 0, 0, 0xff, 0xff, 0xff], &[]).unwrap();
        assert!(matches!(b.recv::<Request>("request").unwrap_err(), WireError::Malformed { .. }));
        drop(a);
        assert_eq!(b.recv_frame().unwrap_err(), WireError::Closed);
    }

    #[test]
    fn hello_prefix_reads_any_version() {
        let h = Hello { prefix: None, kind: HelloKind::Observe };
        let bytes = h.encode(77);
        assert_eq!(HelloPrefix::parse(&bytes), Some(HelloPrefix { magic: MAGIC, version: 77 }));
        assert_eq!(Hello::decode(&bytes).unwrap().kind, HelloKind::Observe);
    }
}
