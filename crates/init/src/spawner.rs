//! The gVisor tier's process spawner: pid 1 starts every process asked for
//! through the API, so that those processes survive a `runsc checkpoint`.
//!
//! Why: gVisor never restores a process started with `runsc exec` (its
//! restore kills them, and a checkpoint taken while one holds a host
//! descriptor cannot be restored at all: "no host FD available"). Processes
//! that must come back from standby or live on in warm forks therefore have to
//! be children of the container's init and hold only descriptors of the
//! sentry's own. And every `runsc exec` leaves state in the sentry that makes
//! each later checkpoint slower (docs/design/gvisor-tier.md §12), so pid 1 is
//! reached without one: over the exec channel ([`crate::channel`]).
//!
//! * Pid 1 ([`serve`], `_pid1 GRACE --spawner`) reads the sandbox's token
//!   at its start, then keeps
//!   [`channel::SPARES`] connections open to the broker on the host. A host
//!   process that takes one proves it talks to pid 1 ([`channel::Frame::Hello`])
//!   and sends one [`Request`]:
//!   * [`Request::Spawn`]: pid 1 starts the process ([`start`]) with pipes of
//!     the sentry as its stdio, relays its output as frames and the
//!     connection's stdin frames to it, and tells how it ended. Pid 1 keeps
//!     its ends of the pipes, so a process outlives any connection: its
//!     output waits in the pipe until one is attached again.
//!   * [`Request::Attach`]: the same for a process pid 1 started before
//!     (after a restore or a copy; the newest connection wins).
//!   * [`Request::Signal`]: a signal to one of its processes (or its group).
//!   * [`Request::Resize`]: the size of a process's terminal (a process that
//!     runs on one: pid 1 holds the master, its output is the stdout frames,
//!     its input the stdin frames).
//!   * [`Request::Detach`]: before a checkpoint (the broker stopped
//!     listening first): every other connection lets go, pid 1 closes all of
//!     them, and no host descriptor is left in the sentry. It connects again
//!     once the broker listens (after the checkpoint, or in the restored copy).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::channel::{self, Frame, FrameReader};
use crate::creds;

/// How long pid 1 goes on relaying a process's output after it ended
/// (background children may hold the pipes open: do not wait for them).
const DRAIN: Duration = Duration::from_millis(150);

/// How often pid 1 tries again to reach the broker while it has too few connections.
const RECONNECT: Duration = Duration::from_millis(5);

/// Output queued for one connection before pid 1 stops reading its process's
/// pipes, and stdin queued for a process before pid 1 stops reading its connection.
const MAX_QUEUED: usize = 256 << 10;

/// A process to start, resolved by the host helper against the sandbox's files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Process {
    /// argv; `args[0]` is the program's path inside.
    pub args: Vec<String>,
    /// `K=V` pairs.
    pub env: Vec<String>,
    /// Working directory.
    pub cwd: String,
    /// Uid.
    pub uid: u32,
    /// Primary gid.
    pub gid: u32,
    /// Supplementary gids.
    pub groups: Vec<u32>,
    /// Leave `no_new_privs` unset (setuid binaries take effect).
    pub allow_setuid: bool,
    /// Run it on a new pseudo-terminal of this size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tty: Option<crate::pty::TtySize>,
}

/// What a host process asks pid 1 (the payload of [`Frame::Request`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Request {
    /// Start a process and relay it.
    Spawn {
        /// The process.
        process: Process,
    },
    /// Resolve `exec` against pid 1's own root (user, directory, program:
    /// as [`crate::runsc::resolve`] does on the host for a gVisor sandbox),
    /// then start it as [`Request::Spawn`] does. The microvm tier's: its
    /// root is not on the host.
    Run {
        /// The process as the API describes it.
        exec: crate::exec::ExecSpec,
        /// The sandbox's hostname (`HOSTNAME` when `exec` sets none).
        hostname: String,
    },
    /// Relay a process pid 1 started earlier.
    Attach {
        /// Its pid.
        pid: i32,
        /// Whether the connection feeds its stdin.
        stdin: bool,
    },
    /// Send `signal` to process `pid` (with `group`, to its process group).
    Signal {
        /// Its pid.
        pid: i32,
        /// The signal.
        signal: i32,
        /// Its whole process group.
        group: bool,
    },
    /// Resize the terminal of process `pid` (answered with [`Frame::Signaled`]:
    /// 1 when it has one and it was resized, else 0).
    Resize {
        /// Its pid.
        pid: i32,
        /// The new size.
        size: crate::pty::TtySize,
    },
    /// Every other connection lets go, and pid 1 closes them all, port
    /// relays and directory watches included (a checkpoint comes).
    Detach,
    /// Freeze (FIFREEZE) or thaw the file system of the sandbox's disk, so
    /// that the host can read it while the sandbox is frozen (the microvm
    /// tier's; answered with [`Frame::Signaled`]: 1 when done, else 0).
    FreezeDisk {
        /// Freeze (`true`) or thaw.
        frozen: bool,
    },
    /// The entries of the sandbox's writable layer ([`crate::layer::scan`])
    /// as JSON (the microvm tier's: its disk is read by its own guest, never
    /// mounted on the host). The answer is [`Frame::Stdout`] frames, then
    /// [`Frame::Ended`] (or [`Frame::Failed`]).
    LayerManifest,
    /// `items` of the writable layer as an OCI layer tar
    /// ([`crate::layer::write_tar`]); answered as [`Request::LayerManifest`] is.
    LayerTar {
        /// What to put in it.
        items: Vec<crate::layer::Item>,
    },
    /// Wipes flush paths (absolute, `~/` for the home of `user`) in pid 1's
    /// root: a file is removed, a directory emptied, a symlink left alone.
    /// The report's lines are answered as [`Request::LayerManifest`] is.
    Flush {
        /// The paths.
        paths: Vec<String>,
        /// The user whose home `~/` is (name or uid; `None`: root).
        user: Option<String>,
    },
    /// The sandbox's secret files at `/run/secrets` (a read-only tmpfs in
    /// the guest's RAM, owned by `owner`), once after its boot. Answered with
    /// [`Frame::Signaled`] 1, or [`Frame::Failed`].
    Secrets {
        /// The files.
        files: Vec<Secret>,
        /// Who owns them (the image's user; `None`: root).
        owner: Option<String>,
    },
    /// A file operation in pid 1's root ([`crate::guestfs`]): an upload's
    /// bytes follow as [`Frame::Stdin`] frames up to [`Frame::StdinEof`]; the
    /// answer is [`Frame::Stdout`] frames, then [`Frame::Ended`], or
    /// [`Frame::Failed`] with a [`crate::guestfs::FsFailure`] as JSON.
    Fs {
        /// The operation.
        op: crate::guestfs::FsOp,
    },
    /// Freezes (`true`) or thaws every process of the sandbox but pid 1 (a
    /// microVM's cgroup freezer): a VM snapshot is taken with them frozen,
    /// so a restored copy runs none of them before [`Request::Restored`].
    /// Answered with [`Frame::Signaled`]: 1 when done, else 0.
    FreezeWorkload {
        /// Freeze (`true`) or thaw.
        frozen: bool,
    },
    /// A microVM guest restored from a snapshot, its processes still frozen:
    /// the host's fresh entropy is mixed into the kernel's pool and the
    /// generator reseeded (two copies of one snapshot would otherwise read
    /// the same "random" bytes), and a copy takes its own identity.
    /// Answered with [`Frame::Signaled`] 1, or [`Frame::Failed`].
    Restored {
        /// At least 32 bytes from the host's generator.
        entropy: Vec<u8>,
        /// A new identity (a fork of the snapshot); `None`: the same sandbox.
        identity: Option<Identity>,
    },
    /// Connect to `127.0.0.1:port` in the sandbox and relay the connection's
    /// bytes over this stream ([`crate::guestport`]: previews of a microVM
    /// or a gVisor sandbox, whose loopback the host cannot reach).
    /// Answered with [`Frame::Signaled`] 1 once connected (raw bytes both
    /// ways after it), or [`Frame::Failed`] with the reason.
    Connect {
        /// The port.
        port: u16,
    },
    /// Watch directory `path` in pid 1's root ([`crate::guestwatch`]: the
    /// stream carries its events until either side ends it).
    Watch {
        /// The directory.
        path: String,
        /// Every directory under it too.
        recursive: bool,
    },
}

/// Who a microVM guest is ([`Request::Restored`]): what its boot read from
/// the kernel command line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// Hostname.
    pub hostname: String,
    /// Sandbox id.
    pub id: String,
    /// Machine id.
    pub machine_id: String,
    /// Fork generation.
    pub generation: u32,
    /// Its end of the sandbox's link, if it has one.
    pub net: Option<crate::vm::GuestNet>,
}

/// How a process ended (or why it could not start), as pid 1 tells the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Status {
    /// The process's pid in the sandbox.
    Pid {
        /// Pid.
        pid: i32,
    },
    /// It exited with `code`.
    Exited {
        /// Exit code.
        code: i32,
    },
    /// It was killed by `signal`.
    Signaled {
        /// Signal number.
        signal: i32,
    },
    /// It could not be started (or attached to).
    Failed {
        /// Why.
        message: String,
    },
}

/// A process pid 1 started.
struct Tracked {
    /// Pid 1's ends of its pipes (`None` once they reached their end).
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
    stdin: Option<OwnedFd>,
    /// The master of its terminal, when it runs on one (for resizes).
    tty: Option<OwnedFd>,
    /// Bytes for its stdin not written yet.
    pending_in: Vec<u8>,
    /// Close its stdin once `pending_in` is written (the connection's stdin ended).
    close_stdin_after: bool,
    /// The connection relaying it now.
    conn: Option<u64>,
    /// Its end, once reaped (and when), until a connection has been told.
    ended: Option<(Status, Instant)>,
}

/// One connection to the host.
struct Conn {
    stream: UnixStream,
    reader: FrameReader,
    out: Vec<u8>,
    /// It proved us (answered Hello): no longer a spare.
    opened: bool,
    /// The process it relays.
    attached: Option<i32>,
    /// Whether it feeds the process's stdin.
    feeds_stdin: bool,
    /// Close once `out` is written.
    closing: bool,
}

impl Conn {
    fn send(&mut self, kind: Frame, payload: &[u8]) {
        channel::encode(&mut self.out, kind, payload);
    }
}

/// Writes what it is given as [`Frame::Stdout`] frames of up to [`FrameWriter::CHUNK`] bytes.
struct FrameWriter<'a> {
    stream: &'a mut UnixStream,
    buf: Vec<u8>,
}

impl FrameWriter<'_> {
    const CHUNK: usize = 64 << 10;

    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let mut frame = Vec::with_capacity(self.buf.len() + 5);
        channel::encode(&mut frame, Frame::Stdout, &self.buf);
        self.buf.clear();
        self.stream.write_all(&frame)
    }
}

impl Write for FrameWriter<'_> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let n = data.len().min(Self::CHUNK - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == Self::CHUNK {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}

/// What the host sends after a request, as a reader: the payloads of its
/// [`Frame::Stdin`] frames, until [`Frame::StdinEof`] (an end of the stream
/// before it is an error: the upload was cut short).
struct FrameInput {
    stream: UnixStream,
    reader: FrameReader,
    buf: Vec<u8>,
    at: usize,
    ended: bool,
}

impl Read for FrameInput {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.at == self.buf.len() && !self.ended {
            match self.reader.read_from(&mut self.stream)? {
                Some((Frame::Stdin, data)) => (self.buf, self.at) = (data, 0),
                Some((Frame::StdinEof, _)) => self.ended = true,
                Some((other, _)) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("a {other:?} frame in an upload"),
                    ))
                }
                None => return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the upload was cut short")),
            }
        }
        let n = out.len().min(self.buf.len() - self.at);
        out[..n].copy_from_slice(&self.buf[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// Where pid 1's connections to the host come from.
pub enum Source {
    /// It opens them to the broker at [`channel::BROKER_SOCKET`] (the gVisor
    /// tier; the token is in [`channel::TOKEN_FILE`]).
    Broker,
    /// They are handed to it (the microvm tier: streams of the line,
    /// [`crate::vm`]); `wake` reads a byte per connection sent on `conns`;
    /// pid 1 ends with `on_exit` once its processes are gone.
    Offered {
        /// The channel token.
        token: Vec<u8>,
        /// New connections.
        conns: std::sync::mpsc::Receiver<UnixStream>,
        /// Readable when `conns` has one.
        wake: OwnedFd,
        /// Pid 1's end.
        on_exit: fn() -> !,
        /// What only a guest's pid 1 does.
        ops: GuestOps,
    },
}

/// What a microVM guest's pid 1 does beyond starting processes ([`crate::vm`]).
#[derive(Clone, Copy)]
pub struct GuestOps {
    /// Freezes (`true`) or thaws the sandbox's disk ([`Request::FreezeDisk`]).
    pub freeze_disk: fn(bool) -> std::io::Result<()>,
    /// Opens the writable layer's directory on the sandbox's disk
    /// ([`Request::LayerManifest`], [`Request::LayerTar`]).
    pub open_layer: fn() -> std::io::Result<OwnedFd>,
    /// Wipes flush paths ([`Request::Flush`]): one report line per path.
    pub flush: fn(&[String], Option<&str>) -> Vec<String>,
    /// Puts the secrets in place ([`Request::Secrets`]).
    pub secrets: fn(&[Secret], Option<&str>) -> std::io::Result<()>,
    /// Freezes or thaws the sandbox's processes ([`Request::FreezeWorkload`]).
    pub freeze_workload: fn(bool) -> std::io::Result<()>,
    /// Reseeds and, for a copy, takes the new identity ([`Request::Restored`]).
    pub restored: fn(&[u8], Option<&Identity>) -> std::io::Result<()>,
}

/// One secret file for a guest's `/run/secrets` ([`Request::Secrets`]).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Secret {
    /// Its file name.
    pub name: String,
    /// Its value.
    pub data: Vec<u8>,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret({}, {} bytes)", self.name, self.data.len())
    }
}

/// Pid 1's state as the spawner.
struct Spawner {
    source: Source,
    token: Vec<u8>,
    conns: HashMap<u64, Conn>,
    procs: HashMap<i32, Tracked>,
    next: u64,
    last_connect: Option<Instant>,
    /// The streams served from threads of their own, cut at a restore.
    cuts: crate::guestport::Cuts,
}

fn pipe() -> nix::Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
}

fn nonblocking(fd: &OwnedFd) {
    let _ = nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK));
}

impl Spawner {
    fn new(source: Source) -> Spawner {
        let token = match &source {
            Source::Broker => read_token(),
            Source::Offered { token, .. } => token.clone(),
        };
        Spawner::with_source_and_token(source, token)
    }

    fn with_source_and_token(source: Source, token: Vec<u8>) -> Spawner {
        Spawner {
            source,
            token,
            conns: HashMap::new(),
            procs: HashMap::new(),
            next: 0,
            last_connect: None,
            cuts: Default::default(),
        }
    }

    /// A spawner on the broker with `token` (tests: no token file).
    #[cfg(test)]
    fn with_token(token: Vec<u8>) -> Spawner {
        Spawner::with_source_and_token(Source::Broker, token)
    }

    fn add_conn(&mut self, stream: UnixStream) {
        let _ = stream.set_nonblocking(true);
        self.next += 1;
        let conn = Conn {
            stream,
            reader: FrameReader::default(),
            out: Vec::new(),
            opened: false,
            attached: None,
            feeds_stdin: false,
            closing: false,
        };
        self.conns.insert(self.next, conn);
    }

    /// Takes the connections handed over since the last call (microvm).
    fn take_offered(&mut self) {
        let Source::Offered { conns, wake, .. } = &self.source else { return };
        let mut drain = [0u8; 64];
        while nix::unistd::read(wake.as_raw_fd(), &mut drain).is_ok_and(|n| n > 0) {}
        let offered: Vec<UnixStream> = conns.try_iter().collect();
        for stream in offered {
            self.add_conn(stream);
        }
    }

    fn spares(&self) -> usize {
        self.conns.values().filter(|c| !c.opened && !c.closing).count()
    }

    /// Opens spare connections to the broker up to [`channel::SPARES`] (at
    /// most one try per [`RECONNECT`]: no broker listens during a checkpoint).
    fn keep_spares(&mut self) {
        if !matches!(self.source, Source::Broker)
            || self.spares() >= channel::SPARES
            || self.last_connect.is_some_and(|t| t.elapsed() < RECONNECT)
        {
            return;
        }
        self.last_connect = Some(Instant::now());
        while self.spares() < channel::SPARES {
            let Ok(stream) = UnixStream::connect(channel::BROKER_SOCKET) else { return };
            self.add_conn(stream);
        }
    }

    /// Whether it waits for spares it could not open (the broker is paused).
    fn short_of_spares(&self) -> bool {
        matches!(self.source, Source::Broker) && self.spares() < channel::SPARES
    }

    fn send(&mut self, id: u64, kind: Frame, payload: &[u8]) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.send(kind, payload);
        }
    }

    /// Answers a short request with a number ([`Frame::Signaled`]) and ends the connection.
    /// Freezes or thaws `what` with the guest operation `op` picks; whether it was done.
    fn guest_freeze(
        &self,
        what: &str,
        frozen: bool,
        op: impl Fn(&GuestOps) -> fn(bool) -> std::io::Result<()>,
    ) -> bool {
        match &self.source {
            Source::Offered { ops, .. } => {
                op(ops)(frozen).inspect_err(|e| eprintln!("strata-init: freeze {what} ({frozen}): {e}")).is_ok()
            }
            Source::Broker => false,
        }
    }

    fn answer(&mut self, id: u64, n: u32) {
        self.send(id, Frame::Signaled, &n.to_le_bytes());
        if let Some(c) = self.conns.get_mut(&id) {
            c.closing = true;
        }
    }

    fn fail(&mut self, id: u64, why: &str) {
        self.send(id, Frame::Failed, why.as_bytes());
        if let Some(c) = self.conns.get_mut(&id) {
            c.closing = true;
        }
    }

    /// Connection `id` relays process `pid` from now on (the one before lets go).
    fn attach(&mut self, id: u64, pid: i32, feeds_stdin: bool) {
        let Some(t) = self.procs.get_mut(&pid) else { return };
        let before = t.conn.replace(id);
        if let Some(other) = before.filter(|o| *o != id) {
            if let Some(c) = self.conns.get_mut(&other) {
                c.send(Frame::LetGo, &[]);
                c.attached = None;
                c.closing = true;
            }
        }
        if let Some(c) = self.conns.get_mut(&id) {
            c.attached = Some(pid);
            c.feeds_stdin = feeds_stdin;
            c.send(Frame::Started, &pid.to_le_bytes());
        }
    }

    fn handle_frame(&mut self, id: u64, kind: Frame, payload: Vec<u8>) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        match (kind, c.opened) {
            (Frame::Hello, false) => {
                let proof = channel::prove(&self.token, &payload);
                c.opened = true;
                c.send(Frame::Proof, &proof);
            }
            (_, false) => self.fail(id, "the channel opens with a hello"),
            (Frame::Request, true) if c.attached.is_none() => match serde_json::from_slice::<Request>(&payload) {
                Ok(req) => self.handle(id, req),
                Err(e) => self.fail(id, &format!("a request that does not parse: {e}")),
            },
            (Frame::Stdin, true) => {
                let pid = c.attached.filter(|_| c.feeds_stdin);
                if let Some(t) = pid.and_then(|p| self.procs.get_mut(&p)) {
                    if t.stdin.is_some() {
                        t.pending_in.extend_from_slice(&payload);
                    }
                }
            }
            (Frame::StdinEof, true) => {
                let pid = c.attached.filter(|_| c.feeds_stdin);
                if let Some(t) = pid.and_then(|p| self.procs.get_mut(&p)) {
                    // Closed once what is pending has been written.
                    t.close_stdin_after = true;
                    if t.pending_in.is_empty() {
                        t.stdin = None;
                    }
                }
            }
            (k, true) => self.fail(id, &format!("unexpected {k:?} frame")),
        }
    }

    fn handle(&mut self, id: u64, req: Request) {
        match req {
            Request::Run { exec, hostname } => {
                let resolved = std::fs::File::open("/")
                    .map_err(|e| format!("open /: {e}"))
                    .and_then(|root| crate::runsc::resolve(root.as_raw_fd(), &exec, &hostname));
                match resolved {
                    Ok(r) => self.handle(id, crate::runsc::spawn_request(&r, exec.allow_setuid, exec.tty)),
                    Err(why) => self.fail(id, &why),
                }
            }
            Request::Spawn { process } => {
                let spawned = (|| -> std::io::Result<(i32, Tracked)> {
                    if let Some(size) = process.tty {
                        let pair = crate::pty::open_pair(size)?;
                        if process.uid != 0 {
                            // The user owns its terminal, as after a login.
                            nix::unistd::fchown(
                                pair.slave.as_raw_fd(),
                                Some(nix::unistd::Uid::from_raw(process.uid)),
                                None,
                            )?;
                        }
                        let pid = start(&process, [pair.slave.as_raw_fd(); 3], true)?;
                        nonblocking(&pair.master);
                        let t = Tracked {
                            stdout: Some(pair.master.try_clone()?),
                            stderr: None,
                            stdin: Some(pair.master.try_clone()?),
                            tty: Some(pair.master),
                            pending_in: Vec::new(),
                            conn: None,
                            ended: None,
                            close_stdin_after: false,
                        };
                        return Ok((pid, t));
                    }
                    let (in_r, in_w) = pipe()?;
                    let (out_r, out_w) = pipe()?;
                    let (err_r, err_w) = pipe()?;
                    let pid = start(&process, [in_r.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()], false)?;
                    drop((in_r, out_w, err_w));
                    for fd in [&out_r, &err_r, &in_w] {
                        nonblocking(fd);
                    }
                    let t = Tracked {
                        stdout: Some(out_r),
                        stderr: Some(err_r),
                        stdin: Some(in_w),
                        tty: None,
                        pending_in: Vec::new(),
                        conn: None,
                        ended: None,
                        close_stdin_after: false,
                    };
                    Ok((pid, t))
                })();
                match spawned {
                    Ok((pid, t)) => {
                        self.procs.insert(pid, t);
                        self.attach(id, pid, true);
                    }
                    Err(e) => self.fail(id, &spawn_error(&process, &e)),
                }
            }
            Request::Attach { pid, stdin } => {
                if !self.procs.contains_key(&pid) {
                    return self.fail(id, &format!("no process {pid} to attach to"));
                }
                self.attach(id, pid, stdin);
            }
            Request::Signal { pid, signal, group } => {
                let sent = if pid <= 1 || !(1..=64).contains(&signal) {
                    0u32
                } else {
                    let target = if group { -pid } else { pid };
                    // SAFETY: kill takes integer arguments only.
                    u32::from(unsafe { libc::kill(target, signal) } == 0)
                };
                self.answer(id, sent);
            }
            Request::FreezeDisk { frozen } => {
                let done = self.guest_freeze("the disk", frozen, |ops| ops.freeze_disk);
                self.answer(id, u32::from(done));
            }
            Request::FreezeWorkload { frozen } => {
                let done = self.guest_freeze("the workload", frozen, |ops| ops.freeze_workload);
                self.answer(id, u32::from(done));
            }
            Request::Restored { entropy, identity } => {
                let done = match &self.source {
                    Source::Offered { ops, .. } => (ops.restored)(&entropy, identity.as_ref()),
                    Source::Broker => Err(std::io::Error::other("a gVisor sandbox is not restored by its pid 1")),
                };
                // Their host ends were the keeper's before the snapshot's restore
                // (none, normally: a VM is saved after a detach, which cuts them).
                let cut = self.cuts.cut_all();
                if cut > 0 {
                    eprintln!(
                        "strata-init: restored: {cut} relayed connection(s) and watch(es) of the host before ended"
                    );
                }
                match done {
                    Ok(()) => self.answer(id, 1),
                    Err(e) => self.fail(id, &format!("after the restore: {e}")),
                }
            }
            Request::Secrets { files, owner } => {
                let done = match &self.source {
                    Source::Offered { ops, .. } => (ops.secrets)(&files, owner.as_deref()),
                    Source::Broker => Err(std::io::Error::other("this sandbox's secrets are the host's to mount")),
                };
                match done {
                    Ok(()) => self.answer(id, 1),
                    Err(e) => self.fail(id, &format!("the secrets: {e}")),
                }
            }
            Request::LayerManifest | Request::LayerTar { .. } | Request::Flush { .. } | Request::Fs { .. } => {
                self.answer_in_thread(id, req)
            }
            Request::Connect { .. } | Request::Watch { .. } => self.serve_in_thread(id, req),
            Request::Resize { pid, size } => {
                let master = self.procs.get(&pid).and_then(|t| t.tty.as_ref());
                let done = master.is_some_and(|m| crate::pty::set_size(m.as_raw_fd(), size).is_ok());
                self.answer(id, u32::from(done));
            }
            Request::Detach => {
                let mut n = 0u32;
                let others: Vec<u64> = self.conns.keys().copied().filter(|k| *k != id).collect();
                for k in others {
                    if let Some(mut c) = self.conns.remove(&k) {
                        if c.attached.is_some() {
                            n += 1;
                            c.send(Frame::LetGo, &[]);
                            // Best effort: the host side also learns it from the end of the stream.
                            let _ = c.stream.set_nonblocking(false);
                            let _ = c.stream.set_write_timeout(Some(Duration::from_millis(200)));
                            let _ = c.stream.write_all(&c.out);
                        }
                        if let Some(t) = c.attached.and_then(|p| self.procs.get_mut(&p)) {
                            t.conn = None;
                        }
                    }
                }
                // Relays and watches too: a VM is saved only with no stream open on
                // its line, and a gVisor checkpoint refuses open host sockets.
                n += self.cuts.cut_all_and_wait(Duration::from_secs(2)) as u32;
                if let Some(mut c) = self.conns.remove(&id) {
                    c.send(Frame::Detached, &n.to_le_bytes());
                    let _ = c.stream.set_nonblocking(false);
                    let _ = c.stream.set_write_timeout(Some(Duration::from_secs(2)));
                    let _ = c.stream.write_all(&c.out);
                }
                // The broker stopped listening before it asked: the next tries fail
                // until it listens again (after the checkpoint, or in a restored copy).
                self.last_connect = Some(Instant::now());
            }
        }
    }

    /// Answers a request whose answer may be long (a layer's manifest or
    /// tar) from a thread of its own, so pid 1 goes on serving meanwhile:
    /// the connection leaves pid 1's loop and the thread writes to it,
    /// blocking as the host reads.
    fn answer_in_thread(&mut self, id: u64, req: Request) {
        let Source::Offered { ops, .. } = &self.source else {
            return self.fail(id, "this sandbox's writable layer is on the host: ask the host");
        };
        let (open_layer, flush) = (ops.open_layer, ops.flush);
        let Some(mut c) = self.conns.remove(&id) else { return };
        std::thread::spawn(move || {
            if c.stream.set_nonblocking(false).is_err() || c.stream.write_all(&c.out).is_err() {
                return;
            }
            // What the host sends after the request (an upload's bytes) comes as stdin frames.
            let Ok(reading) = c.stream.try_clone() else { return };
            let mut input = FrameInput {
                stream: reading,
                reader: std::mem::take(&mut c.reader),
                buf: Vec::new(),
                at: 0,
                ended: false,
            };
            let mut out = FrameWriter { stream: &mut c.stream, buf: Vec::with_capacity(FrameWriter::CHUNK) };
            // Ok, or the payload of the Failed frame: a file operation's as JSON, the others' as text.
            let done: Result<(), Vec<u8>> = match req {
                Request::Fs { op } => crate::guestfs::run(&op, &mut input, &mut out)
                    .map_err(|f| serde_json::to_vec(&f).expect("serializes")),
                Request::LayerManifest => open_layer()
                    .and_then(|dir| crate::layer::scan(dir.as_fd()))
                    .and_then(|entries| serde_json::to_writer(&mut out, &entries).map_err(std::io::Error::other))
                    .map_err(|e| e.to_string().into_bytes()),
                Request::LayerTar { items } => open_layer()
                    .and_then(|dir| crate::layer::write_tar(dir.as_fd(), &items, &mut out))
                    .map_err(|e| e.to_string().into_bytes()),
                Request::Flush { paths, user } => {
                    let lines = flush(&paths, user.as_deref());
                    out.write_all(lines.join("\n").as_bytes()).map_err(|e| e.to_string().into_bytes())
                }
                _ => Err(b"not a long answer".to_vec()),
            };
            let ended = done.and_then(|()| out.flush().map_err(|e| format!("the answer: {e}").into_bytes()));
            let mut end = Vec::new();
            match ended {
                Ok(()) => {
                    let status = serde_json::to_vec(&Status::Exited { code: 0 }).expect("serializes");
                    channel::encode(&mut end, Frame::Ended, &status);
                }
                Err(why) => channel::encode(&mut end, Frame::Failed, &why),
            }
            let _ = c.stream.write_all(&end);
        });
    }

    /// Serves a request whose stream goes on after its answer (a port's
    /// relay, a directory watch) from a thread of its own: the connection
    /// leaves pid 1's loop, and [`Spawner::cuts`] can end it.
    fn serve_in_thread(&mut self, id: u64, req: Request) {
        // A gVisor sandbox's files are on the host (its watches are the host's); its ports are not.
        if matches!(self.source, Source::Broker) && matches!(req, Request::Watch { .. }) {
            return self.fail(id, "this sandbox's files are watched from the host");
        }
        let Some(mut c) = self.conns.remove(&id) else { return };
        let cuts = self.cuts.clone();
        std::thread::spawn(move || {
            if c.stream.set_nonblocking(false).is_err() || c.stream.write_all(&c.out).is_err() {
                return;
            }
            match req {
                Request::Connect { port } => crate::guestport::relay(c.stream, c.reader.take_rest(), port, &cuts),
                Request::Watch { path, recursive } => {
                    crate::guestwatch::serve(c.stream, c.reader, &path, recursive, &cuts)
                }
                _ => {}
            }
        });
    }

    fn drop_conn(&mut self, id: u64) {
        if let Some(c) = self.conns.remove(&id) {
            if let Some(t) = c.attached.and_then(|p| self.procs.get_mut(&p)) {
                if t.conn == Some(id) {
                    t.conn = None;
                }
            }
        }
    }

    /// A child of pid 1 ended: its output drains, then its connection learns how.
    fn reaped(&mut self, pid: i32, status: Status) {
        if let Some(t) = self.procs.get_mut(&pid) {
            t.ended = Some((status, Instant::now()));
        }
    }

    /// Sends the ends of processes whose output has drained (or waited long
    /// enough) to their connections; forgets those that were told.
    fn report_ends(&mut self) {
        let done: Vec<i32> = self
            .procs
            .iter()
            .filter(|(_, t)| {
                t.conn.is_some()
                    && t.ended
                        .as_ref()
                        .is_some_and(|(_, at)| (t.stdout.is_none() && t.stderr.is_none()) || at.elapsed() > DRAIN)
            })
            .map(|(p, _)| *p)
            .collect();
        let mut buf = vec![0u8; 64 << 10];
        for pid in done {
            // What the pipes hold now goes first (a busy pid 1 may come here
            // late): read until they are empty or ended.
            for err in [false, true] {
                for _ in 0..64 {
                    let open =
                        self.procs.get(&pid).is_some_and(|t| if err { t.stderr.is_some() } else { t.stdout.is_some() });
                    if !open || !self.on_output(pid, err, &mut buf) {
                        break;
                    }
                }
            }
            let Some(t) = self.procs.remove(&pid) else { continue };
            let (status, _) = t.ended.expect("ended");
            if let Some(c) = t.conn.and_then(|id| self.conns.get_mut(&id)) {
                c.send(Frame::Ended, &serde_json::to_vec(&status).expect("status serializes"));
                c.attached = None;
                c.closing = true;
            }
        }
    }
}
/// Starts `p` with the given stdio; its own session; the user's credentials.
///
/// The child shares pid 1's memory until it executes (`clone` with
/// `CLONE_VM | CLONE_VFORK`, as `posix_spawn` does): under the sentry a
/// `fork` copies the address space and the child then takes a page fault for
/// every page it touches, which cost ~20 ms per process. Everything the child
/// needs is prepared here ([`Prepared`]); the child makes raw system calls
/// only ([`spawn_child`]) and reports a failure on a close-on-exec pipe.
fn start(p: &Process, stdio: [RawFd; 3], controlling_tty: bool) -> std::io::Result<i32> {
    let mut prepared = Prepared::new(p, stdio)?;
    prepared.controlling_tty = controlling_tty;
    let (err_r, err_w) = pipe().map_err(std::io::Error::from)?;
    prepared.report = err_w.as_raw_fd();
    let mut stack = vec![0u8; CHILD_STACK];
    // SAFETY: the stack is ours and outlives the child's use of it (CLONE_VFORK:
    // this call returns only once the child has executed or exited); the stack
    // pointer is the top of it, 16-byte aligned; `prepared` lives until then too,
    // and the child only reads it.
    let pid = unsafe {
        let top = stack.as_mut_ptr().add(CHILD_STACK) as usize & !15;
        libc::clone(
            spawn_child,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            &prepared as *const Prepared as *mut libc::c_void,
        )
    };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    drop(err_w);
    drop(stack);
    // Empty: it executed. Eight bytes: the step that failed and its errno.
    let mut report = [0u8; 8];
    let mut got = 0;
    while got < report.len() {
        match nix::unistd::read(err_r.as_raw_fd(), &mut report[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => break,
        }
    }
    if got == 0 {
        return Ok(pid);
    }
    // It exited: reap it here (the SIGCHLD loop then finds nothing of it).
    let _ = waitpid(Pid::from_raw(pid), None);
    let step = u32::from_le_bytes(report[..4].try_into().expect("4 bytes"));
    let errno = i32::from_le_bytes(report[4..].try_into().expect("4 bytes"));
    let e = std::io::Error::from_raw_os_error(errno);
    Err(match step {
        STEP_EXEC => e,
        _ => std::io::Error::new(e.kind(), format!("{}: {e}", STEP_NAMES.get(step as usize).unwrap_or(&"setup"))),
    })
}

/// Stack of a spawned child until it executes (it calls into libc only).
const CHILD_STACK: usize = 64 << 10;

/// The child's steps, as reported when one fails (`STEP_NAMES[step]`).
const STEP_NAMES: [&str; 10] =
    ["setsid", "chdir", "setgroups", "setgid", "setuid", "capset", "no_new_privs", "stdio", "exec", "the terminal"];
const STEP_EXEC: u32 = 8;
const STEP_TTY: u32 = 9;

/// What a spawned child needs, made before it exists (it allocates nothing).
struct Prepared {
    path: std::ffi::CString,
    _argv: Vec<std::ffi::CString>,
    argv: Vec<*const libc::c_char>,
    _envp: Vec<std::ffi::CString>,
    envp: Vec<*const libc::c_char>,
    cwd: std::ffi::CString,
    uid: libc::uid_t,
    gid: libc::gid_t,
    groups: Vec<libc::gid_t>,
    /// Capabilities the process keeps (effective, permitted, inheritable).
    caps: u64,
    /// Capabilities taken out of the bounding set.
    drop_bounding: Vec<libc::c_int>,
    no_new_privs: bool,
    stdio: [RawFd; 3],
    /// `stdio` is a terminal's far end, to become its controlling terminal.
    controlling_tty: bool,
    /// The write end of the failure pipe.
    report: RawFd,
}

impl Prepared {
    fn new(p: &Process, stdio: [RawFd; 3]) -> std::io::Result<Prepared> {
        use std::ffi::CString;
        let c = |s: &str| CString::new(s).map_err(|_| std::io::Error::other(format!("{s:?} holds a NUL byte")));
        let program = p.args.first().ok_or_else(|| std::io::Error::other("empty command"))?;
        let argv_c = p.args.iter().map(|a| c(a)).collect::<std::io::Result<Vec<_>>>()?;
        let envp_c = p.env.iter().filter(|kv| kv.contains('=')).map(|kv| c(kv)).collect::<std::io::Result<Vec<_>>>()?;
        let ptrs = |v: &[CString]| v.iter().map(|s| s.as_ptr()).chain(std::iter::once(std::ptr::null())).collect();
        let keep: &[caps::Capability] = if p.uid == 0 { &creds::KEPT } else { &[] };
        let kept: u64 = keep.iter().map(|c| c.bitmask()).fold(0, |a, b| a | b);
        // Capabilities unknown to the running kernel fail with EINVAL in the child; that is fine.
        let drop_bounding = (0..64).filter(|i| kept & (1u64 << i) == 0).collect();
        Ok(Prepared {
            path: c(program)?,
            argv: ptrs(&argv_c),
            _argv: argv_c,
            envp: ptrs(&envp_c),
            _envp: envp_c,
            cwd: c(&p.cwd)?,
            uid: p.uid,
            gid: p.gid,
            groups: p.groups.clone(),
            caps: kept,
            drop_bounding,
            no_new_privs: !p.allow_setuid,
            stdio,
            controlling_tty: false,
            report: -1,
        })
    }
}

/// The spawned child (see [`start`]): its own session and signal mask,
/// the working directory, the user's credentials and capabilities, its stdio,
/// then the program. Raw system calls only: it runs in pid 1's memory.
extern "C" fn spawn_child(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Prepared` the parent keeps alive until this child
    // has executed or exited (CLONE_VFORK); only system calls follow, on
    // pointers into it (NUL-terminated strings, null-terminated arrays).
    unsafe {
        let p = &*(arg as *const Prepared);
        let fail = |step: u32| -> ! {
            let errno = *libc::__errno_location();
            let mut msg = [0u8; 8];
            msg[..4].copy_from_slice(&step.to_le_bytes());
            msg[4..].copy_from_slice(&errno.to_le_bytes());
            libc::write(p.report, msg.as_ptr().cast(), msg.len());
            libc::_exit(127)
        };
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        // Rust's runtime ignores SIGPIPE; a program starts with the default.
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        if libc::setsid() < 0 {
            fail(0);
        }
        if p.controlling_tty && libc::ioctl(p.stdio[0], libc::TIOCSCTTY, 0) != 0 {
            fail(STEP_TTY);
        }
        if libc::chdir(p.cwd.as_ptr()) != 0 {
            fail(1);
        }
        for cap in &p.drop_bounding {
            libc::prctl(libc::PR_CAPBSET_DROP, *cap as libc::c_ulong, 0, 0, 0);
        }
        if libc::syscall(libc::SYS_setgroups, p.groups.len(), p.groups.as_ptr()) != 0 {
            fail(2);
        }
        if libc::syscall(libc::SYS_setresgid, p.gid, p.gid, p.gid) != 0 {
            fail(3);
        }
        if libc::syscall(libc::SYS_setresuid, p.uid, p.uid, p.uid) != 0 {
            fail(4);
        }
        // The sentry has no ambient capabilities (EINVAL): none to clear is the state wanted.
        libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong, 0, 0, 0);
        #[repr(C)]
        struct Header {
            version: u32,
            pid: libc::c_int,
        }
        #[repr(C)]
        #[derive(Clone, Copy)]
        struct Data {
            effective: u32,
            permitted: u32,
            inheritable: u32,
        }
        let header = Header { version: 0x2008_0522, pid: 0 };
        let (lo, hi) = (p.caps as u32, (p.caps >> 32) as u32);
        let data = [
            Data { effective: lo, permitted: lo, inheritable: lo },
            Data { effective: hi, permitted: hi, inheritable: hi },
        ];
        if libc::syscall(libc::SYS_capset, &header as *const Header, data.as_ptr()) != 0 {
            fail(5);
        }
        if p.no_new_privs && libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            fail(6);
        }
        for (target, fd) in p.stdio.iter().enumerate() {
            if libc::dup2(*fd, target as libc::c_int) < 0 {
                fail(7);
            }
        }
        libc::execve(p.path.as_ptr(), p.argv.as_ptr(), p.envp.as_ptr());
        fail(STEP_EXEC)
    }
}

fn spawn_error(p: &Process, e: &std::io::Error) -> String {
    let program = p.args.first().map(String::as_str).unwrap_or("");
    match e.raw_os_error() {
        Some(libc::ENOENT) => format!("exec {program}: No such file or directory"),
        Some(libc::EACCES) => format!("exec {program}: Permission denied"),
        _ => format!("exec {program}: {e}"),
    }
}

/// Reads the sandbox's token (a root-only file on a read-only mount).
fn read_token() -> Vec<u8> {
    std::fs::read(channel::TOKEN_FILE).unwrap_or_default()
}

/// What one pass of the loop polls, by index.
enum Watch {
    Signals,
    Offered,
    Conn(u64),
    Output(i32, bool),
    Input(i32),
}

/// Pid 1's life as the spawner: keep connections to the broker, serve them,
/// relay processes, reap every process; on SIGTERM/SIGINT relay SIGTERM to
/// all processes and exit once they are gone or `grace` has passed.
pub fn serve(grace_secs: u64) -> ! {
    serve_from(grace_secs, Source::Broker)
}

/// The signals pid 1 takes through its signalfd (blocked in every thread).
pub const PID1_SIGNALS: [Signal; 6] =
    [Signal::SIGCHLD, Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP, Signal::SIGALRM, Signal::SIGPIPE];

/// [`serve`] with connections from `source`.
pub fn serve_from(grace_secs: u64, source: Source) -> ! {
    let mut set = SigSet::empty();
    for s in PID1_SIGNALS {
        set.add(s);
    }
    let _ = set.thread_block();
    if let Source::Offered { on_exit, .. } = &source {
        crate::pid1::finish_with(*on_exit);
    }
    let Ok(sigfd) = SignalFd::with_flags(&set, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK) else {
        crate::pid1::reap_loop(grace_secs)
    };
    let mut sp = Spawner::new(source);
    if sp.token.len() != channel::TOKEN_LEN {
        eprintln!("strata-init: no channel token: the host cannot reach this sandbox");
    }
    let mut stopping = false;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        sp.keep_spares();
        sp.take_offered();
        sp.report_ends();
        // What to poll: signals, every connection, the pipes of processes a
        // connection relays (output only while its queue is short), stdin to write.
        let mut watch = vec![Watch::Signals];
        let mut fds = vec![PollFd::new(sigfd.as_fd(), PollFlags::POLLIN)];
        if let Source::Offered { wake, .. } = &sp.source {
            watch.push(Watch::Offered);
            fds.push(PollFd::new(wake.as_fd(), PollFlags::POLLIN));
        }
        for (id, c) in &sp.conns {
            // Stdin a process has not read yet holds its connection's input back
            // (the host side keeps reading output meanwhile: no deadlock).
            let backlog = c.attached.and_then(|p| sp.procs.get(&p)).is_some_and(|t| t.pending_in.len() >= MAX_QUEUED);
            let mut ev = if backlog { PollFlags::empty() } else { PollFlags::POLLIN };
            if !c.out.is_empty() {
                ev |= PollFlags::POLLOUT;
            }
            watch.push(Watch::Conn(*id));
            fds.push(PollFd::new(c.stream.as_fd(), ev));
        }
        for (pid, t) in &sp.procs {
            let room = t.conn.and_then(|id| sp.conns.get(&id)).is_some_and(|c| c.out.len() < MAX_QUEUED);
            if room {
                for (fd, err) in [(&t.stdout, false), (&t.stderr, true)] {
                    if let Some(fd) = fd {
                        watch.push(Watch::Output(*pid, err));
                        fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
                    }
                }
            }
            if let (Some(fd), false) = (&t.stdin, t.pending_in.is_empty()) {
                watch.push(Watch::Input(*pid));
                fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLOUT));
            }
        }
        let draining = sp.procs.values().any(|t| t.ended.is_some());
        let timeout = if sp.short_of_spares() {
            RECONNECT.as_millis() as u16
        } else if stopping || draining {
            20
        } else {
            1000
        };
        if let Err(e) = poll(&mut fds, PollTimeout::from(timeout)) {
            if e != nix::errno::Errno::EINTR {
                std::thread::sleep(Duration::from_millis(10));
            }
            continue;
        }
        let ready: Vec<(usize, PollFlags)> =
            fds.iter().enumerate().filter_map(|(i, f)| f.revents().filter(|r| !r.is_empty()).map(|r| (i, r))).collect();
        drop(fds);
        for (i, rev) in ready {
            match watch[i] {
                Watch::Signals => {
                    while let Ok(Some(info)) = sigfd.read_signal() {
                        if let Ok(sig) = Signal::try_from(info.ssi_signo as i32) {
                            crate::pid1::on_stop_signal(sig, &mut stopping, grace_secs);
                        }
                    }
                    loop {
                        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG | WaitPidFlag::__WALL)) {
                            Ok(WaitStatus::Exited(pid, code)) => sp.reaped(pid.as_raw(), Status::Exited { code }),
                            Ok(WaitStatus::Signaled(pid, sig, _)) => {
                                sp.reaped(pid.as_raw(), Status::Signaled { signal: sig as i32 })
                            }
                            Ok(WaitStatus::StillAlive) | Err(_) => break,
                            Ok(_) => continue,
                        }
                    }
                }
                Watch::Offered => {}
                Watch::Conn(id) => sp.on_conn(id, rev, &mut buf),
                Watch::Output(pid, err) => {
                    sp.on_output(pid, err, &mut buf);
                }
                Watch::Input(pid) => sp.on_input(pid),
            }
        }
        if stopping && crate::pid1::no_other_processes() {
            crate::pid1::finish();
        }
    }
}

impl Spawner {
    fn on_conn(&mut self, id: u64, rev: PollFlags, buf: &mut [u8]) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        if rev.contains(PollFlags::POLLOUT) && !c.out.is_empty() {
            match c.stream.write(&c.out) {
                Ok(n) => {
                    c.out.drain(..n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => return self.drop_conn(id),
            }
        }
        if c.closing && c.out.is_empty() {
            return self.drop_conn(id);
        }
        if !rev.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR) {
            return;
        }
        match c.stream.read(buf) {
            Ok(0) => return self.drop_conn(id),
            Ok(n) => c.reader.push(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(_) => return self.drop_conn(id),
        }
        loop {
            let Some(c) = self.conns.get_mut(&id) else { return };
            match c.reader.next_frame() {
                Ok(Some((kind, payload))) => self.handle_frame(id, kind, payload),
                Ok(None) => return,
                Err(e) => return self.fail(id, &e.0),
            }
        }
    }

    /// Reads once from a process's stdout or stderr into its connection's
    /// queue; whether bytes came (`false`: nothing there now, or its end).
    fn on_output(&mut self, pid: i32, err: bool, buf: &mut [u8]) -> bool {
        let Some(t) = self.procs.get_mut(&pid) else { return false };
        let slot = if err { &mut t.stderr } else { &mut t.stdout };
        let Some(fd) = slot.as_ref() else { return false };
        match nix::unistd::read(fd.as_raw_fd(), buf) {
            Ok(0) => *slot = None,
            Ok(n) => {
                let kind = if err { Frame::Stderr } else { Frame::Stdout };
                if let Some(c) = t.conn.and_then(|id| self.conns.get_mut(&id)) {
                    c.send(kind, &buf[..n]);
                }
                return true;
            }
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => {}
            Err(_) => *slot = None,
        }
        false
    }

    fn on_input(&mut self, pid: i32) {
        let Some(t) = self.procs.get_mut(&pid) else { return };
        let Some(fd) = t.stdin.as_ref() else { return };
        match nix::unistd::write(fd, &t.pending_in) {
            Ok(n) => {
                t.pending_in.drain(..n);
            }
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => {}
            // The process closed its stdin: what is left goes nowhere.
            Err(_) => {
                t.pending_in.clear();
                t.stdin = None;
            }
        }
        if t.pending_in.is_empty() && t.close_stdin_after {
            t.stdin = None;
        }
    }
}

/// Entry point of `strata-init _hostname NAME` (inside, through `runsc exec`
/// with CAP_SYS_ADMIN): sets the sandbox's hostname (a restored copy takes its own).
pub fn hostname_main() -> ! {
    let Some(name) = std::env::args().nth(2).filter(|n| !n.is_empty() && n.len() <= 64) else {
        eprintln!("usage: strata-init _hostname NAME");
        std::process::exit(2)
    };
    match nix::unistd::sethostname(&name) {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("sethostname {name}: {e}");
            std::process::exit(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_tagged_json() {
        let r: Request = serde_json::from_str(r#"{"type":"attach","pid":5,"stdin":false}"#).unwrap();
        assert_eq!(r, Request::Attach { pid: 5, stdin: false });
        let line = serde_json::to_string(&Status::Signaled { signal: 9 }).unwrap();
        assert_eq!(line, r#"{"type":"signaled","signal":9}"#);
    }

    /// A connection pair standing for one pid 1 holds and the host's end.
    fn conn_pair(sp: &mut Spawner) -> (u64, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        sp.add_conn(a);
        (sp.next, b)
    }

    /// Runs pid 1's side of the connections until `host` has a whole frame.
    fn pump(sp: &mut Spawner, host: &mut UnixStream, r: &mut FrameReader) -> (Frame, Vec<u8>) {
        host.set_nonblocking(true).unwrap();
        let mut buf = vec![0u8; 64 << 10];
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(f) = r.next_frame().unwrap() {
                return f;
            }
            assert!(Instant::now() < deadline, "no frame");
            sp.report_ends();
            let ids: Vec<u64> = sp.conns.keys().copied().collect();
            for id in ids {
                sp.on_conn(id, PollFlags::POLLIN | PollFlags::POLLOUT, &mut buf);
            }
            let pids: Vec<i32> = sp.procs.keys().copied().collect();
            for pid in pids {
                sp.on_output(pid, false, &mut buf);
                sp.on_output(pid, true, &mut buf);
                sp.on_input(pid);
                if let Ok(WaitStatus::Exited(_, code)) = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
                    sp.reaped(pid, Status::Exited { code });
                }
            }
            match host.read(&mut buf) {
                Ok(n) if n > 0 => r.push(&buf[..n]),
                _ => std::thread::sleep(Duration::from_millis(2)),
            }
        }
    }

    #[test]
    fn a_connection_proves_pid1_then_relays_a_process_to_its_end() {
        if !nix::unistd::getuid().is_root() {
            eprintln!("skipped: setgroups needs root");
            return;
        }
        let token = channel::random_bytes().unwrap().to_vec();
        let mut sp = Spawner::with_token(token.clone());
        let (_, mut host) = conn_pair(&mut sp);
        let mut r = FrameReader::default();
        let nonce = channel::random_bytes().unwrap();
        channel::write_frame(&mut host, Frame::Hello, &nonce).unwrap();
        let (kind, proof) = pump(&mut sp, &mut host, &mut r);
        assert_eq!(kind, Frame::Proof);
        assert!(channel::check_proof(&token, &nonce, &proof));
        assert_eq!(sp.spares(), 0, "a proven connection is no spare");
        let p = Process {
            args: vec!["/bin/sh".into(), "-c".into(), "read x; echo out $x; echo err >&2; exit 3".into()],
            env: vec!["PATH=/bin:/usr/bin".into()],
            cwd: "/".into(),
            uid: 0,
            gid: 0,
            groups: vec![0],
            allow_setuid: false,
            tty: None,
        };
        let req = serde_json::to_vec(&Request::Spawn { process: p }).unwrap();
        host.set_nonblocking(false).unwrap();
        channel::write_frame(&mut host, Frame::Request, &req).unwrap();
        channel::write_frame(&mut host, Frame::Stdin, b"in\n").unwrap();
        channel::write_frame(&mut host, Frame::StdinEof, b"").unwrap();
        let (kind, pid) = pump(&mut sp, &mut host, &mut r);
        assert_eq!(kind, Frame::Started);
        assert!(i32::from_le_bytes(pid.try_into().unwrap()) > 1);
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let end = loop {
            match pump(&mut sp, &mut host, &mut r) {
                (Frame::Stdout, b) => out.extend(b),
                (Frame::Stderr, b) => err.extend(b),
                (Frame::Ended, s) => break serde_json::from_slice::<Status>(&s).unwrap(),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(
            (out.as_slice(), err.as_slice(), end),
            (&b"out in\n"[..], &b"err\n"[..], Status::Exited { code: 3 })
        );
        assert!(sp.procs.is_empty(), "told, and forgotten");
    }

    #[test]
    fn a_stranger_without_the_token_cannot_prove_itself_and_requests_need_a_hello() {
        let mut sp = Spawner::with_token(vec![7; 32]);
        let (id, mut host) = conn_pair(&mut sp);
        let mut r = FrameReader::default();
        channel::write_frame(&mut host, Frame::Request, b"{}").unwrap();
        let (kind, why) = pump(&mut sp, &mut host, &mut r);
        assert_eq!((kind, String::from_utf8(why).unwrap().as_str()), (Frame::Failed, "the channel opens with a hello"));
        assert!(sp.conns.get(&id).is_none_or(|c| c.closing));
        // The proof binds the token: another token gives another answer.
        assert_ne!(channel::prove(&[7; 32], b"n"), channel::prove(&[8; 32], b"n"));
    }

    /// Runs `script` with sh through [`start`] as `uid`; its stdout.
    fn run_as(uid: u32, script: &str, allow_setuid: bool) -> String {
        let p = Process {
            args: vec!["/bin/sh".into(), "-c".into(), script.into()],
            env: vec!["PATH=/bin:/usr/bin".into()],
            cwd: "/".into(),
            uid,
            gid: uid,
            groups: vec![uid],
            allow_setuid,
            tty: None,
        };
        let (in_r, _in_w) = pipe().unwrap();
        let (out_r, out_w) = pipe().unwrap();
        let (_err_r, err_w) = pipe().unwrap();
        let pid = start(&p, [in_r.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()], false).unwrap();
        drop((in_r, out_w, err_w));
        assert!(matches!(waitpid(Pid::from_raw(pid), None).unwrap(), WaitStatus::Exited(_, 0)));
        let mut out = String::new();
        std::fs::File::from(out_r).read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn a_spawned_process_gets_its_user_capabilities_and_session_and_failures_say_why() {
        if !nix::unistd::getuid().is_root() {
            eprintln!("skipped: setgroups and capset need root");
            return;
        }
        let field = |out: &str, name: &str| {
            out.lines().find_map(|l| l.strip_prefix(name)).map(|v| v.trim().to_string()).unwrap_or_default()
        };
        let root = run_as(0, "cat /proc/self/status", false);
        let kept = creds::KEPT.iter().map(|c| c.bitmask()).fold(0u64, |a, b| a | b);
        assert_eq!(u64::from_str_radix(&field(&root, "CapEff:"), 16).unwrap(), kept, "{root}");
        assert_eq!(u64::from_str_radix(&field(&root, "CapBnd:"), 16).unwrap(), kept);
        assert_eq!(field(&root, "NoNewPrivs:"), "1");
        let user = run_as(65534, "cat /proc/self/status", true);
        assert!(field(&user, "Uid:").starts_with("65534"), "{user}");
        assert_eq!(u64::from_str_radix(&field(&user, "CapEff:"), 16).unwrap(), 0, "a user holds none");
        assert_eq!(field(&user, "NoNewPrivs:"), "0", "allow_setuid leaves it unset");
        // Its own session: it leads it (the session id is its pid).
        let ids = run_as(0, "echo $$ $(cut -d' ' -f6 /proc/$$/stat)", false);
        let ids: Vec<&str> = ids.split_whitespace().collect();
        assert_eq!(ids.len(), 2);
        assert_eq!(ids[0], ids[1], "the session id is the process's own pid");
        // What cannot start is an error with the reason, and leaves no child behind.
        let (a, b, c) = (pipe().unwrap(), pipe().unwrap(), pipe().unwrap());
        let missing = Process {
            args: vec!["/nonexistent/program".into()],
            env: vec![],
            cwd: "/".into(),
            uid: 0,
            gid: 0,
            groups: vec![0],
            allow_setuid: false,
            tty: None,
        };
        let fds = |a: &(OwnedFd, OwnedFd), b: &(OwnedFd, OwnedFd), c: &(OwnedFd, OwnedFd)| {
            [a.0.as_raw_fd(), b.1.as_raw_fd(), c.1.as_raw_fd()]
        };
        let e = start(&missing, fds(&a, &b, &c), false).unwrap_err();
        assert_eq!(spawn_error(&missing, &e), "exec /nonexistent/program: No such file or directory");
        let (a, b, c) = (pipe().unwrap(), pipe().unwrap(), pipe().unwrap());
        let bad_dir = Process { cwd: "/nonexistent".into(), args: vec!["/bin/sh".into()], ..missing };
        let e = start(&bad_dir, fds(&a, &b, &c), false).unwrap_err();
        assert!(e.to_string().starts_with("chdir: "), "{e}");
    }

    #[test]
    fn a_process_on_a_terminal_has_it_as_controlling_terminal_and_resizes_reach_it() {
        if !nix::unistd::getuid().is_root() {
            eprintln!("skipped: setgroups needs root");
            return;
        }
        let mut sp = Spawner::with_token(vec![1; 32]);
        let (id, mut host) = conn_pair(&mut sp);
        let mut r = FrameReader::default();
        let nonce = channel::random_bytes().unwrap();
        channel::write_frame(&mut host, Frame::Hello, &nonce).unwrap();
        assert_eq!(pump(&mut sp, &mut host, &mut r).0, Frame::Proof);
        let p = Process {
            args: vec!["/bin/sh".into(), "-c".into(), "read x; tty; stty size; echo got $x".into()],
            env: vec!["PATH=/bin:/usr/bin".into()],
            cwd: "/".into(),
            uid: 0,
            gid: 0,
            groups: vec![0],
            allow_setuid: false,
            tty: Some(crate::pty::TtySize { cols: 100, rows: 40 }),
        };
        host.set_nonblocking(false).unwrap();
        channel::write_frame(&mut host, Frame::Request, &serde_json::to_vec(&Request::Spawn { process: p }).unwrap())
            .unwrap();
        let (kind, pid) = pump(&mut sp, &mut host, &mut r);
        assert_eq!(kind, Frame::Started);
        let pid = i32::from_le_bytes(pid.try_into().unwrap());
        // A resize from a second connection, before the process reads its size.
        let (id2, mut host2) = conn_pair(&mut sp);
        let mut r2 = FrameReader::default();
        channel::write_frame(&mut host2, Frame::Hello, &nonce).unwrap();
        assert_eq!(pump(&mut sp, &mut host2, &mut r2).0, Frame::Proof);
        host2.set_nonblocking(false).unwrap();
        let resize = Request::Resize { pid, size: crate::pty::TtySize { cols: 132, rows: 50 } };
        channel::write_frame(&mut host2, Frame::Request, &serde_json::to_vec(&resize).unwrap()).unwrap();
        assert_eq!(pump(&mut sp, &mut host2, &mut r2), (Frame::Signaled, 1u32.to_le_bytes().to_vec()));
        let _ = id2;
        host.set_nonblocking(false).unwrap();
        channel::write_frame(&mut host, Frame::Stdin, b"in\n").unwrap();
        let mut out = Vec::new();
        let end = loop {
            match pump(&mut sp, &mut host, &mut r) {
                (Frame::Stdout, b) => out.extend(b),
                (Frame::Ended, s) => break serde_json::from_slice::<Status>(&s).unwrap(),
                other => panic!("{other:?}"),
            }
        };
        let out = String::from_utf8_lossy(&out).replace('\r', "");
        assert_eq!(end, Status::Exited { code: 0 });
        assert!(out.contains("/dev/pts/") && out.contains("50 132\ngot in\n"), "{out:?}");
        let _ = id;
    }
}
