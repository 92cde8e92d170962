//! The gVisor tier's process spawner: pid 1 starts every process asked for
//! through the API, so that those processes survive a `runsc checkpoint`.
//!
//! Why: gVisor never restores a process started with `runsc exec` (its
//! restore kills them, and a checkpoint taken while one holds a host
//! descriptor cannot be restored at all: "no host FD available"). Processes
//! that must come back from standby or live on in warm forks therefore have to
//! be children of the container's init and hold only descriptors of the
//! sentry's own. So:
//!
//! * pid 1 ([`serve`], `_pid1 GRACE --spawner`) listens on an abstract
//!   SOCK_SEQPACKET socket ([`SOCKET_NAME`]) and accepts only uid 0 peers. A
//!   [`Request::Spawn`] gets a child (its own session, the user's credentials,
//!   its directory and environment) whose stdio are pipes inside the sentry;
//!   the other ends go back to the client over SCM_RIGHTS, and pid 1 keeps a
//!   copy of each, so the pipes outlive any client. Pid 1 reaps the child and
//!   sends its exit status to whichever client is attached then (or keeps it
//!   for the next one).
//! * The client ([`client_main`], `_gclient`, started by `runsc exec` from the
//!   host helper `_runsc_exec`) relays between those pipes and its own stdio
//!   (the host's pipes to the daemon) and writes the process's pid and its end
//!   as [`Status`] lines on descriptor 4, which the host helper turns into
//!   exec reports. A [`Request::Attach`] gives a new client the pipes of a
//!   running process (after a restore, or after a copy).
//! * Before a checkpoint, [`detach_main`] (`_gdetach`) asks pid 1 for a
//!   [`Request::Detach`]: every client lets go at once, without a status, and
//!   pid 1 answers once all of them are gone (killing any that lingers): no
//!   process of `runsc exec`, and no host descriptor, is left in the sentry.

use std::collections::HashMap;
use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::socket::{
    accept4, bind, connect, getsockopt, listen, recvmsg, sendmsg, socket, sockopt, AddressFamily, Backlog,
    ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType, UnixAddr,
};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::creds;

/// The spawner's abstract socket name (in the sandbox's own network namespace).
pub const SOCKET_NAME: &[u8] = b"strata-init/spawner";

/// Descriptor on which `_gclient` finds its [`Request`] (a memfd from the host helper).
pub const REQUEST_FD: RawFd = 3;
/// Descriptor on which `_gclient` writes [`Status`] lines (a pipe to the host helper).
pub const STATUS_FD: RawFd = 4;

/// Largest message on the spawner's socket.
const MAX_MESSAGE: usize = 1 << 20;

/// How long pid 1 waits for clients to let go on a [`Request::Detach`] before it kills them.
const DETACH_GRACE: Duration = Duration::from_secs(2);

/// How long a client goes on relaying output after its process ended
/// (background children may hold the pipes open: do not wait for them).
const DRAIN: Duration = Duration::from_millis(150);

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
}

/// What a client asks pid 1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Request {
    /// Start a process; the reply is [`Reply::Started`] with its pipes.
    Spawn {
        /// The process.
        process: Process,
    },
    /// Take over the pipes of a process pid 1 started earlier.
    Attach {
        /// Its pid.
        pid: i32,
        /// Whether the client feeds its stdin.
        stdin: bool,
    },
    /// The attached client's stdin reached its end: close the process's stdin.
    CloseStdin,
    /// Every attached client lets go now; answered with [`Reply::Detached`].
    Detach,
}

/// What pid 1 answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Reply {
    /// The process runs; its pipes come with this message (stdout, stderr,
    /// then stdin when the client feeds it).
    Started {
        /// Its pid.
        pid: i32,
    },
    /// The request failed.
    Failed {
        /// Why.
        message: String,
    },
    /// The process ended.
    Ended {
        /// How.
        status: Status,
    },
    /// Let go now (a checkpoint is coming): exit without a status.
    LetGo,
    /// Every client has let go.
    Detached {
        /// How many there were.
        clients: usize,
    },
}

/// A line `_gclient` writes to the host helper (descriptor [`STATUS_FD`]).
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

// ---- the socket ----

fn send(sock: BorrowedFd, msg: &impl Serialize, fds: &[RawFd]) -> nix::Result<()> {
    let bytes = serde_json::to_vec(msg).expect("message serializes");
    let iov = [IoSlice::new(&bytes)];
    let cmsg = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
    sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None).map(|_| ())
}

/// Receives one message and the descriptors that came with it; `None` at the end.
///
/// The buffer is reused and sized by a peek first: in the sentry, touching
/// fresh memory is page faults, and a 1 MiB buffer per message cost ~5 ms each.
fn recv<T: for<'de> Deserialize<'de>>(sock: BorrowedFd) -> nix::Result<Option<(T, Vec<OwnedFd>)>> {
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0u8; 16 << 10]);
    }
    // The size of the next message, without taking it (no descriptors are installed:
    // no control buffer is given).
    let mut one = [0u8; 1];
    let size = {
        let mut iov = [IoSliceMut::new(&mut one)];
        let peek = MsgFlags::MSG_PEEK | MsgFlags::MSG_TRUNC;
        recvmsg::<()>(sock.as_raw_fd(), &mut iov, None, peek)?.bytes
    };
    if size > MAX_MESSAGE {
        return Err(nix::errno::Errno::EMSGSIZE);
    }
    BUF.with(|cell| {
        let mut buf = cell.borrow_mut();
        if buf.len() < size.max(1) {
            buf.resize(size.max(1), 0);
        }
        let mut cmsg = nix::cmsg_space!([RawFd; 4]);
        let (len, fds) = {
            let mut iov = [IoSliceMut::new(&mut buf[..])];
            let msg = recvmsg::<()>(sock.as_raw_fd(), &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC)?;
            let mut fds = Vec::new();
            for c in msg.cmsgs()? {
                if let ControlMessageOwned::ScmRights(got) = c {
                    // SAFETY: descriptors received with SCM_RIGHTS are new and ours.
                    fds.extend(got.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
                }
            }
            (msg.bytes, fds)
        };
        if len == 0 {
            return Ok(None);
        }
        match serde_json::from_slice(&buf[..len]) {
            Ok(m) => Ok(Some((m, fds))),
            Err(_) => Err(nix::errno::Errno::EBADMSG),
        }
    })
}

fn address() -> UnixAddr {
    UnixAddr::new_abstract(SOCKET_NAME).expect("the name fits")
}

/// How long a client waits for pid 1 to listen: runsc reports a sandbox
/// started once its init runs, which is a moment before pid 1 has bound its
/// socket (an exec right after create lands in that moment).
const CONNECT_PATIENCE: Duration = Duration::from_secs(5);

/// Connects to pid 1's spawner (waiting up to [`CONNECT_PATIENCE`] for it to listen).
pub fn connect_spawner() -> nix::Result<OwnedFd> {
    let deadline = Instant::now() + CONNECT_PATIENCE;
    loop {
        let s = socket(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC, None)?;
        match connect(s.as_raw_fd(), &address()) {
            Ok(()) => return Ok(s),
            Err(nix::errno::Errno::ECONNREFUSED) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(2))
            }
            Err(e) => return Err(e),
        }
    }
}

// ---- pid 1 ----

/// A process pid 1 started for a client.
struct Tracked {
    /// Pid 1's copies of the client's ends (stdout, stderr, stdin).
    stdout: OwnedFd,
    stderr: OwnedFd,
    stdin: Option<OwnedFd>,
    /// The client attached now (its index in `clients`' keys).
    client: Option<u64>,
    /// Its end, once reaped, until a client has been told.
    ended: Option<Status>,
}

struct Client {
    sock: OwnedFd,
    peer: i32,
    /// The process it relays.
    attached: Option<i32>,
    /// Told to let go.
    letting_go: bool,
}

struct Detach {
    requester: u64,
    deadline: Instant,
    clients: usize,
    killed: bool,
}

/// Pid 1's state as the spawner.
#[derive(Default)]
struct Spawner {
    clients: HashMap<u64, Client>,
    procs: HashMap<i32, Tracked>,
    next_client: u64,
    detach: Option<Detach>,
}

fn pipe() -> nix::Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
}

fn dup(fd: &OwnedFd) -> nix::Result<OwnedFd> {
    fd.as_fd().try_clone_to_owned().map_err(|e| nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EBADF)))
}

/// Starts `p` with the given stdio; its own session; the user's credentials.
///
/// The child shares pid 1's memory until it executes (`clone` with
/// `CLONE_VM | CLONE_VFORK`, as `posix_spawn` does): under the sentry a
/// `fork` copies the address space and the child then takes a page fault for
/// every page it touches, which cost ~20 ms per process. Everything the child
/// needs is prepared here ([`Prepared`]); the child makes raw system calls
/// only ([`spawn_child`]) and reports a failure on a close-on-exec pipe.
fn start(p: &Process, stdin: OwnedFd, stdout: OwnedFd, stderr: OwnedFd) -> std::io::Result<i32> {
    let prepared = Prepared::new(p, [stdin.as_raw_fd(), stdout.as_raw_fd(), stderr.as_raw_fd()])?;
    let (err_r, err_w) = pipe().map_err(std::io::Error::from)?;
    let mut prepared = prepared;
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
const STEP_NAMES: [&str; 9] =
    ["setsid", "chdir", "setgroups", "setgid", "setuid", "capset", "no_new_privs", "stdio", "exec"];
const STEP_EXEC: u32 = 8;

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

impl Spawner {
    fn reply(&self, client: u64, msg: &Reply, fds: &[RawFd]) {
        if let Some(c) = self.clients.get(&client) {
            let _ = send(c.sock.as_fd(), msg, fds);
        }
    }

    fn handle(&mut self, id: u64, req: Request) {
        match req {
            Request::Spawn { process } => {
                let spawned = (|| -> std::io::Result<(i32, Tracked, [OwnedFd; 3])> {
                    let (in_r, in_w) = pipe()?;
                    let (out_r, out_w) = pipe()?;
                    let (err_r, err_w) = pipe()?;
                    let pid = start(&process, in_r, out_w, err_w)?;
                    let t = Tracked {
                        stdout: dup(&out_r)?,
                        stderr: dup(&err_r)?,
                        stdin: Some(dup(&in_w)?),
                        client: Some(id),
                        ended: None,
                    };
                    Ok((pid, t, [out_r, err_r, in_w]))
                })();
                match spawned {
                    Ok((pid, t, ends)) => {
                        self.procs.insert(pid, t);
                        if let Some(c) = self.clients.get_mut(&id) {
                            c.attached = Some(pid);
                        }
                        let raw: Vec<RawFd> = ends.iter().map(|f| f.as_raw_fd()).collect();
                        self.reply(id, &Reply::Started { pid }, &raw);
                    }
                    Err(e) => self.reply(id, &Reply::Failed { message: spawn_error(&process, &e) }, &[]),
                }
            }
            Request::Attach { pid, stdin } => {
                let Some(t) = self.procs.get_mut(&pid) else {
                    return self.reply(id, &Reply::Failed { message: format!("no process {pid} to attach to") }, &[]);
                };
                // The newest client wins: one still attached lets go.
                if let Some(other) = t.client.filter(|c| *c != id) {
                    if let Some(c) = self.clients.get_mut(&other) {
                        let _ = send(c.sock.as_fd(), &Reply::LetGo, &[]);
                        c.attached = None;
                    }
                }
                let mut ends = vec![dup(&t.stdout), dup(&t.stderr)];
                if stdin {
                    if let Some(s) = &t.stdin {
                        ends.push(dup(s));
                    }
                }
                let Ok(ends) = ends.into_iter().collect::<nix::Result<Vec<OwnedFd>>>() else {
                    return self.reply(id, &Reply::Failed { message: "out of descriptors".into() }, &[]);
                };
                t.client = Some(id);
                let ended = t.ended.clone();
                if let Some(c) = self.clients.get_mut(&id) {
                    c.attached = Some(pid);
                }
                let raw: Vec<RawFd> = ends.iter().map(|f| f.as_raw_fd()).collect();
                self.reply(id, &Reply::Started { pid }, &raw);
                if let Some(status) = ended {
                    self.reply(id, &Reply::Ended { status }, &[]);
                    self.procs.remove(&pid);
                }
            }
            Request::CloseStdin => {
                let pid = self.clients.get(&id).and_then(|c| c.attached);
                if let Some(t) = pid.and_then(|p| self.procs.get_mut(&p)) {
                    t.stdin = None;
                }
            }
            Request::Detach => {
                let mut n = 0;
                for (cid, c) in self.clients.iter_mut() {
                    if *cid != id && c.attached.is_some() {
                        let _ = send(c.sock.as_fd(), &Reply::LetGo, &[]);
                        c.letting_go = true;
                        n += 1;
                    }
                }
                self.detach =
                    Some(Detach { requester: id, deadline: Instant::now() + DETACH_GRACE, clients: n, killed: false });
                self.check_detach();
            }
        }
    }

    /// Answers a pending detach once no client that was told to let go is left
    /// (and kills the ones that outstay [`DETACH_GRACE`]).
    fn check_detach(&mut self) {
        let Some(d) = self.detach.as_mut() else { return };
        let lingering: Vec<i32> = self.clients.values().filter(|c| c.letting_go).map(|c| c.peer).collect();
        if lingering.is_empty() {
            let (requester, clients) = (d.requester, d.clients);
            self.detach = None;
            self.reply(requester, &Reply::Detached { clients }, &[]);
            return;
        }
        if Instant::now() > d.deadline && !d.killed {
            d.killed = true;
            d.deadline = Instant::now() + DETACH_GRACE;
            for pid in lingering {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        } else if Instant::now() > d.deadline {
            let requester = d.requester;
            self.detach = None;
            self.reply(requester, &Reply::Failed { message: "clients did not let go".into() }, &[]);
        }
    }

    fn drop_client(&mut self, id: u64) {
        if let Some(c) = self.clients.remove(&id) {
            if let Some(t) = c.attached.and_then(|p| self.procs.get_mut(&p)) {
                if t.client == Some(id) {
                    t.client = None;
                }
            }
        }
        self.check_detach();
    }

    /// A child of pid 1 ended: its client learns how (or the next one will).
    fn reaped(&mut self, pid: i32, status: Status) {
        let Some(t) = self.procs.get_mut(&pid) else { return };
        t.ended = Some(status.clone());
        if let Some(c) = t.client.filter(|c| self.clients.contains_key(c)) {
            self.reply(c, &Reply::Ended { status }, &[]);
            self.procs.remove(&pid);
        }
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

/// Pid 1's life as the spawner: serve clients, reap every process; on
/// SIGTERM/SIGINT relay SIGTERM to all processes and exit once they are gone
/// or `grace` has passed.
pub fn serve(grace_secs: u64) -> ! {
    let mut set = SigSet::empty();
    for s in [Signal::SIGCHLD, Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP, Signal::SIGALRM] {
        set.add(s);
    }
    let _ = set.thread_block();
    let Ok(sigfd) = SignalFd::with_flags(&set, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK) else {
        crate::pid1::reap_loop(grace_secs)
    };
    let listener = (|| {
        let s = socket(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC, None)?;
        bind(s.as_raw_fd(), &address())?;
        listen(&s, Backlog::new(64)?)?;
        Ok::<_, nix::Error>(s)
    })();
    let Ok(listener) = listener else { crate::pid1::reap_loop(grace_secs) };
    let mut sp = Spawner::default();
    let mut stopping = false;
    loop {
        let ids: Vec<u64> = sp.clients.keys().copied().collect();
        let (sig_ready, listen_ready, ready) = {
            let mut fds =
                vec![PollFd::new(sigfd.as_fd(), PollFlags::POLLIN), PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
            fds.extend(ids.iter().map(|id| PollFd::new(sp.clients[id].sock.as_fd(), PollFlags::POLLIN)));
            let timeout = if stopping || sp.detach.is_some() { 50u16 } else { 1000 };
            if let Err(e) = poll(&mut fds, PollTimeout::from(timeout)) {
                if e != nix::errno::Errno::EINTR {
                    std::thread::sleep(Duration::from_millis(10));
                }
                continue;
            }
            let is = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
            let ready: Vec<u64> = ids.iter().zip(&fds[2..]).filter(|(_, f)| is(f)).map(|(id, _)| *id).collect();
            (is(&fds[0]), is(&fds[1]), ready)
        };
        if sig_ready {
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
        if listen_ready {
            if let Ok(s) = accept4(listener.as_raw_fd(), SockFlag::SOCK_CLOEXEC) {
                // SAFETY: accept4 returned a new descriptor that we own.
                let s = unsafe { OwnedFd::from_raw_fd(s) };
                // Only root inside may start processes as any user.
                match getsockopt(&s, sockopt::PeerCredentials) {
                    Ok(cred) if cred.uid() == 0 => {
                        sp.next_client += 1;
                        sp.clients.insert(
                            sp.next_client,
                            Client { sock: s, peer: cred.pid(), attached: None, letting_go: false },
                        );
                    }
                    _ => drop(s),
                }
            }
        }
        for id in ready {
            let Some(c) = sp.clients.get(&id) else { continue };
            match recv::<Request>(c.sock.as_fd()) {
                Ok(Some((req, _))) => sp.handle(id, req),
                Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => {}
                Ok(None) | Err(_) => sp.drop_client(id),
            }
        }
        sp.check_detach();
        if stopping && crate::pid1::no_other_processes() {
            std::process::exit(0);
        }
    }
}

// ---- the client ----

fn write_status(out: &mut std::fs::File, s: &Status) {
    let mut line = serde_json::to_vec(s).expect("status serializes");
    line.push(b'\n');
    let _ = out.write_all(&line);
}

fn fail(status: &mut std::fs::File, message: &str) -> ! {
    write_status(status, &Status::Failed { message: message.to_string() });
    std::process::exit(1)
}

/// Entry point of `strata-init _gclient` (inside a gVisor sandbox, through
/// `runsc exec`): sends the [`Request`] found on [`REQUEST_FD`] to pid 1 and
/// relays the process's stdio until it ends. Never returns.
pub fn client_main() -> ! {
    // SAFETY: the host helper passes these two descriptors for our exclusive use.
    let (mut request_file, mut status) =
        unsafe { (std::fs::File::from_raw_fd(REQUEST_FD), std::fs::File::from_raw_fd(STATUS_FD)) };
    let mut raw = Vec::new();
    if let Err(e) = (&mut request_file).take(MAX_MESSAGE as u64).read_to_end(&mut raw) {
        fail(&mut status, &format!("read the request: {e}"));
    }
    drop(request_file);
    let request: Request =
        serde_json::from_slice(&raw).unwrap_or_else(|e| fail(&mut status, &format!("parse the request: {e}")));
    let feeds_stdin = match &request {
        Request::Spawn { .. } => true,
        Request::Attach { stdin, .. } => *stdin,
        _ => false,
    };
    let sock = connect_spawner().unwrap_or_else(|e| fail(&mut status, &format!("connect to the sandbox's init: {e}")));
    if let Err(e) = send(sock.as_fd(), &request, &[]) {
        fail(&mut status, &format!("send the request: {e}"));
    }
    let (pid, mut ends) = match recv::<Reply>(sock.as_fd()) {
        Ok(Some((Reply::Started { pid }, fds))) => (pid, fds),
        Ok(Some((Reply::Failed { message }, _))) => fail(&mut status, &message),
        other => fail(&mut status, &format!("unexpected answer from the sandbox's init: {other:?}")),
    };
    write_status(&mut status, &Status::Pid { pid });
    let stdin_end = if feeds_stdin && ends.len() == 3 { ends.pop() } else { None };
    let (Some(stderr), Some(stdout)) = (ends.pop(), ends.pop()) else {
        fail(&mut status, "the sandbox's init sent no pipes")
    };
    relay(sock, stdout, stderr, stdin_end, status)
}

/// Copies the process's output to ours and our stdin to its, until pid 1
/// says it ended (then a short drain, and the status line) or to let go.
fn relay(sock: OwnedFd, stdout: OwnedFd, stderr: OwnedFd, mut stdin: Option<OwnedFd>, mut status: std::fs::File) -> ! {
    let mut outputs: Vec<(OwnedFd, RawFd)> = vec![(stdout, 1), (stderr, 2)];
    let mut host_stdin_open = stdin.is_some();
    let mut pending: Vec<u8> = Vec::new();
    let mut ended: Option<(Status, Instant)> = None;
    let mut buf = vec![0u8; 64 << 10];
    // SAFETY: descriptor 0 is our stdin for the life of this process.
    let host_in = unsafe { BorrowedFd::borrow_raw(0) };
    if let Some(s) = &stdin {
        let _ = nix::fcntl::fcntl(s.as_raw_fd(), nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK));
    }
    loop {
        if let Some((st, at)) = &ended {
            if outputs.is_empty() || at.elapsed() > DRAIN {
                write_status(&mut status, st);
                std::process::exit(0);
            }
        }
        // Read more of our stdin only once what was read has gone to the process.
        let want_in = host_stdin_open && pending.is_empty() && ended.is_none();
        let want_out = stdin.is_some() && !pending.is_empty();
        let mut fds = vec![PollFd::new(sock.as_fd(), PollFlags::POLLIN)];
        fds.extend(outputs.iter().map(|(fd, _)| PollFd::new(fd.as_fd(), PollFlags::POLLIN)));
        let in_at = want_in.then(|| {
            fds.push(PollFd::new(host_in, PollFlags::POLLIN));
            fds.len() - 1
        });
        let out_at = match (&stdin, want_out) {
            (Some(s), true) => {
                fds.push(PollFd::new(s.as_fd(), PollFlags::POLLOUT));
                Some(fds.len() - 1)
            }
            _ => None,
        };
        let timeout = if ended.is_some() { 20u16 } else { 1000 };
        if poll(&mut fds, PollTimeout::from(timeout)).is_err() {
            continue;
        }
        let ready: Vec<bool> = fds.iter().map(|f| f.revents().is_some_and(|r| !r.is_empty())).collect();
        drop(fds);
        if ready[0] {
            match recv::<Reply>(sock.as_fd()) {
                Ok(Some((Reply::Ended { status: st }, _))) => ended = Some((st, Instant::now())),
                // A checkpoint is coming, or pid 1 is gone: leave without a word.
                Ok(Some((Reply::LetGo, _))) | Ok(None) => std::process::exit(0),
                Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) | Ok(Some(_)) => {}
                Err(_) => std::process::exit(0),
            }
        }
        let mut i = 0;
        outputs.retain(|(fd, target)| {
            i += 1;
            if !ready[i] {
                return true;
            }
            match nix::unistd::read(fd.as_raw_fd(), &mut buf) {
                Ok(0) => false,
                Ok(n) => {
                    // SAFETY: `target` is our descriptor 1 or 2, open for our whole life.
                    let mut out = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(*target) });
                    let _ = out.write_all(&buf[..n]);
                    true
                }
                Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => true,
                Err(_) => false,
            }
        });
        if in_at.is_some_and(|i| ready[i]) {
            match nix::unistd::read(0, &mut buf) {
                Ok(n) if n > 0 => pending.extend_from_slice(&buf[..n]),
                Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => {}
                // End of our stdin: the process's ends too (pid 1 holds a copy of its pipe).
                _ => {
                    host_stdin_open = false;
                    stdin = None;
                    let _ = send(sock.as_fd(), &Request::CloseStdin, &[]);
                }
            }
        }
        if let (Some(s), Some(i)) = (&stdin, out_at) {
            if ready[i] {
                match nix::unistd::write(s, &pending) {
                    Ok(n) => {
                        pending.drain(..n);
                    }
                    Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => {}
                    // The process closed its stdin: what is left goes nowhere.
                    Err(_) => {
                        pending.clear();
                        host_stdin_open = false;
                        stdin = None;
                    }
                }
            }
        }
    }
}

/// Entry point of `strata-init _gdetach` (inside, through `runsc exec`): every
/// client of pid 1 lets go; exits 0 once they have, 1 otherwise.
pub fn detach_main() -> ! {
    let result = (|| -> Result<usize, String> {
        let sock = connect_spawner().map_err(|e| format!("connect to the sandbox's init: {e}"))?;
        send(sock.as_fd(), &Request::Detach, &[]).map_err(|e| format!("send: {e}"))?;
        match recv::<Reply>(sock.as_fd()) {
            Ok(Some((Reply::Detached { clients }, _))) => Ok(clients),
            Ok(Some((Reply::Failed { message }, _))) => Err(message),
            other => Err(format!("unexpected answer: {other:?}")),
        }
    })();
    match result {
        Ok(n) => {
            println!("{n}");
            std::process::exit(0)
        }
        Err(e) => {
            eprintln!("strata-init _gdetach: {e}");
            std::process::exit(1)
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
    fn messages_round_trip_with_descriptors() {
        let (a, b) =
            nix::sys::socket::socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
                .unwrap();
        let (r, w) = pipe().unwrap();
        send(a.as_fd(), &Reply::Started { pid: 7 }, &[r.as_raw_fd()]).unwrap();
        let (got, fds) = recv::<Reply>(b.as_fd()).unwrap().unwrap();
        assert_eq!(got, Reply::Started { pid: 7 });
        assert_eq!(fds.len(), 1);
        nix::unistd::write(&w, b"x").unwrap();
        let mut one = [0u8; 1];
        assert_eq!(nix::unistd::read(fds[0].as_raw_fd(), &mut one).unwrap(), 1, "the passed end reads the same pipe");
        drop(a);
        assert!(recv::<Reply>(b.as_fd()).unwrap().is_none(), "end of the peer reads as None");
    }

    #[test]
    fn status_lines_are_tagged_json() {
        let line = serde_json::to_string(&Status::Signaled { signal: 9 }).unwrap();
        assert_eq!(line, r#"{"type":"signaled","signal":9}"#);
        let r: Request = serde_json::from_str(r#"{"type":"attach","pid":5,"stdin":false}"#).unwrap();
        assert_eq!(r, Request::Attach { pid: 5, stdin: false });
    }

    #[test]
    fn a_pid1_child_reports_its_exit_and_keeps_its_pipes() {
        let mut sp = Spawner::default();
        let (a, b) =
            nix::sys::socket::socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
                .unwrap();
        sp.clients.insert(1, Client { sock: a, peer: 0, attached: None, letting_go: false });
        let me = nix::unistd::getuid().as_raw();
        let gid = nix::unistd::getgid().as_raw();
        let p = Process {
            args: vec!["/bin/sh".into(), "-c".into(), "echo out; echo err >&2; exit 3".into()],
            env: vec!["PATH=/bin:/usr/bin".into()],
            cwd: "/".into(),
            uid: me,
            gid,
            groups: vec![gid],
            allow_setuid: true,
        };
        if me != 0 {
            // drop_to needs setgroups: only root runs the spawn part of this test.
            eprintln!("skipped the spawn part: not root");
            return;
        }
        sp.handle(1, Request::Spawn { process: p });
        let (reply, fds) = recv::<Reply>(b.as_fd()).unwrap().unwrap();
        let Reply::Started { pid } = reply else { panic!("{reply:?}") };
        assert_eq!(fds.len(), 3);
        let status = loop {
            match waitpid(Pid::from_raw(pid), None).unwrap() {
                WaitStatus::Exited(_, c) => break Status::Exited { code: c },
                _ => continue,
            }
        };
        sp.reaped(pid, status);
        let (ended, _) = recv::<Reply>(b.as_fd()).unwrap().unwrap();
        assert_eq!(ended, Reply::Ended { status: Status::Exited { code: 3 } });
        let mut out = String::new();
        std::fs::File::from(fds[0].try_clone().unwrap()).read_to_string(&mut out).unwrap();
        assert_eq!(out, "out\n");
        assert!(sp.procs.is_empty(), "told, and forgotten");
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
        };
        let (in_r, _in_w) = pipe().unwrap();
        let (out_r, out_w) = pipe().unwrap();
        let (_err_r, err_w) = pipe().unwrap();
        let pid = start(&p, in_r, out_w, err_w).unwrap();
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
        };
        let e = start(&missing, a.0, b.1, c.1).unwrap_err();
        assert_eq!(spawn_error(&missing, &e), "exec /nonexistent/program: No such file or directory");
        let (a, b, c) = (pipe().unwrap(), pipe().unwrap(), pipe().unwrap());
        let bad_dir = Process { cwd: "/nonexistent".into(), args: vec!["/bin/sh".into()], ..missing };
        let e = start(&bad_dir, a.0, b.1, c.1).unwrap_err();
        assert!(e.to_string().starts_with("chdir: "), "{e}");
    }
}
