//! One process inside a sandbox: the shim that a sandbox's exec helper
//! (`_enter`) becomes inside the sandbox, and everything between fork and exec of the
//! process itself (user, working directory, environment, credentials, seccomp).

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, FromRawFd};

use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, ForkResult};
use serde::{Deserialize, Serialize};

use crate::{creds, seccomp, user};

/// Environment variable naming the descriptor the helpers report on.
pub const REPORT_FD_ENV: &str = "STRATA_REPORT_FD";

/// One process to run inside a sandbox.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExecSpec {
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Environment (already merged: image, sandbox, request). PATH, HOME and
    /// HOSTNAME are filled in when absent.
    pub env: BTreeMap<String, String>,
    /// Working directory (default: the user's home if it exists, else `/`).
    pub cwd: Option<String>,
    /// `name`, `uid`, `name:group` or `uid:gid` (default root).
    pub user: Option<String>,
    /// Leave `no_new_privs` unset, so setuid/setgid binaries take effect (the
    /// seccomp filter is installed while CAP_SYS_ADMIN is still held instead).
    #[serde(default)]
    pub allow_setuid: bool,
    /// Run it on a new pseudo-terminal of this size (its controlling terminal
    /// and stdio); the shim relays the terminal to and from its own stdio.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tty: Option<crate::pty::TtySize>,
}

/// Lines the exec helper writes to file descriptor 3, one per line, as JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ExecReport {
    /// Its pid inside the sandbox's pid namespace (it leads its own process group).
    NsPid {
        /// Pid inside.
        pid: i32,
    },
    /// It runs on `/dev/pts/<index>` inside the sandbox (before its pid).
    Tty {
        /// The terminal's number.
        index: u32,
    },
    /// It could not be started.
    SpawnError {
        /// Why.
        message: String,
    },
    /// It exited with a code.
    Exited {
        /// Exit code.
        code: i32,
    },
    /// It was killed by a signal.
    Signaled {
        /// Signal number.
        signal: i32,
    },
}

/// Writes [`ExecReport`] lines to the report descriptor (if there is one).
pub struct Reporter(pub Option<File>);

impl Reporter {
    /// The reporter named by [`REPORT_FD_ENV`], when that descriptor is open.
    pub fn from_env() -> Self {
        let fd: Option<i32> = std::env::var(REPORT_FD_ENV).ok().and_then(|v| v.parse().ok()).filter(|fd| *fd > 2);
        // SAFETY: the spawner hands this descriptor to us for exclusive use; fcntl checks it is open.
        Reporter(fd.and_then(|fd| unsafe { (libc::fcntl(fd, libc::F_GETFD) >= 0).then(|| File::from_raw_fd(fd)) }))
    }

    /// Sends one report line.
    pub fn send(&mut self, r: &ExecReport) {
        if let Some(f) = self.0.as_mut() {
            let mut line = serde_json::to_vec(r).expect("ExecReport serializes");
            line.push(b'\n');
            let _ = f.write_all(&line);
        }
    }
}

/// Closes every descriptor but stdio and `keep`: nothing the spawner had open
/// may stay reachable inside the sandbox (it would also block checkpointing).
fn close_inherited(keep: Option<i32>) {
    let ranges: Vec<(u32, u32)> = match keep {
        Some(k) if k > 3 => vec![(3, k as u32 - 1), (k as u32 + 1, u32::MAX)],
        Some(3) => vec![(4, u32::MAX)],
        _ => vec![(3, u32::MAX)],
    };
    for (lo, hi) in ranges {
        // SAFETY: close_range only closes descriptors; none of them backs a Rust object here.
        unsafe { libc::syscall(libc::SYS_close_range, lo, hi, 0u32) };
    }
}

/// Reports a spawn error and exits with 127.
pub fn die(rep: &mut Reporter, message: String) -> ! {
    rep.send(&ExecReport::SpawnError { message });
    std::process::exit(127)
}

/// The shim's work, in a process inside the sandbox that is already
/// non-dumpable (the inner child of `_enter`): forks the
/// process, relays its output, reports its pid and how it ended.
pub fn shim(spec: ExecSpec, mut rep: Reporter) -> ! {
    close_inherited(rep.0.as_ref().map(|f| f.as_raw_fd()));
    // The shim outlives its process to report how it ended: stop signals aimed at
    // everything (pid 1 relays SIGTERM to all on stop) are for the process alone.
    let mut set = nix::sys::signal::SigSet::empty();
    for sig in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP, Signal::SIGQUIT, Signal::SIGPIPE] {
        set.add(sig);
    }
    // The process writes its output into pipes the shim holds and relays to the
    // daemon: when the daemon goes away (a restart), the shim drops the output
    // and the process runs on, with SIGPIPE at its default like anywhere else.
    // On a terminal, the shim relays it instead: its output to our stdout, our stdin to it.
    let tty = spec.tty.map(|size| {
        crate::pty::open_pair(size).unwrap_or_else(|e| die(&mut rep, format!("a terminal for the process: {e}")))
    });
    if let Some(pair) = &tty {
        rep.send(&ExecReport::Tty { index: pair.index });
    }
    let relays: Vec<Relay> =
        if tty.is_some() { Vec::new() } else { [1, 2].into_iter().filter_map(Relay::new).collect() };
    // SAFETY: single-threaded; the child restores the default mask before exec.
    match unsafe { fork() } {
        Err(e) => die(&mut rep, format!("fork: {e}")),
        Ok(ForkResult::Child) => {
            for r in &relays {
                r.install_in_child();
            }
            child(spec, rep, tty.as_ref().map(|p| p.slave.as_raw_fd()))
        }
        Ok(ForkResult::Parent { child }) => {
            let _ = set.thread_block();
            // After the mask: the relay threads inherit it, so no stop signal lands on them.
            let (done_tx, done_rx) = std::sync::mpsc::channel();
            let (ended_r, ended_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
                .unwrap_or_else(|e| die(&mut rep, format!("pipe: {e}")));
            let ended_r = std::sync::Arc::new(ended_r);
            let mut pumps: Vec<std::sync::Arc<Pump>> =
                relays.into_iter().map(|r| r.start(ended_r.clone(), done_tx.clone())).collect();
            if let Some(pair) = tty {
                drop(pair.slave);
                pumps.push(relay_terminal(pair.master, ended_r.clone(), done_tx.clone()));
            }
            let mut wake = Some(ended_w);
            // The shim needs no privilege from here on: drop it before touching
            // anything of the sandbox's (its /dev/null).
            let root = user::ResolvedUser { uid: 0, gid: 0, groups: vec![0], home: "/".into(), name: None };
            let _ = creds::drop_to(&root, &[]);
            let _ = creds::no_new_privs();
            // Stdio belongs to the process now; the shim keeps only its report pipe.
            // SAFETY: open/dup2 on descriptors 0-2, which no Rust object owns here.
            unsafe {
                let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOFOLLOW);
                if null >= 0 {
                    for fd in 0..3 {
                        libc::dup2(null, fd);
                    }
                    libc::close(null);
                }
            }
            loop {
                match waitpid(child, None) {
                    Ok(WaitStatus::Exited(_, code)) => {
                        drain(&pumps, wake.take().expect("once"), &done_rx);
                        rep.send(&ExecReport::Exited { code });
                        std::process::exit(0)
                    }
                    Ok(WaitStatus::Signaled(_, sig, _)) => {
                        drain(&pumps, wake.take().expect("once"), &done_rx);
                        rep.send(&ExecReport::Signaled { signal: sig as i32 });
                        std::process::exit(0)
                    }
                    Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
                    Err(e) => die(&mut rep, format!("wait: {e}")),
                }
            }
        }
    }
}

/// How long an output pump goes on after the process ended while nothing
/// comes (background children may hold its pipe open: do not wait for them).
const IDLE_AFTER_END: std::time::Duration = std::time::Duration::from_millis(150);

/// The most the shim waits for its pumps after the process ended (a daemon
/// that does not read its pipe any more).
const DRAIN_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// One output stream the shim copies to the daemon (a pipe of the process's,
/// or its terminal), shared between its thread and the shim's main thread.
struct Pump {
    input: std::os::fd::OwnedFd,
    /// The read end of a pipe whose write end the shim closes when the
    /// process ended: it wakes the pump (which otherwise waits on `input`).
    ended: std::sync::Arc<std::os::fd::OwnedFd>,
    /// Bytes read so far (taken out of `input`, whether passed on yet or not).
    read: std::sync::atomic::AtomicU64,
    /// Held across a read of `input` and its count in `read`, and across
    /// [`Pump::process_ended`]'s look at both: the bytes of a read in flight
    /// are then either counted or still queued, never neither.
    reading: std::sync::Mutex<()>,
    /// Once the process ended: stop after this many bytes in all (what was
    /// read plus what the stream held at that moment). `u64::MAX`: running.
    stop_at: std::sync::atomic::AtomicU64,
}

impl Pump {
    fn new(input: std::os::fd::OwnedFd, ended: std::sync::Arc<std::os::fd::OwnedFd>) -> std::sync::Arc<Pump> {
        let _ = nix::fcntl::fcntl(input.as_raw_fd(), nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK));
        std::sync::Arc::new(Pump {
            input,
            ended,
            read: std::sync::atomic::AtomicU64::new(0),
            reading: std::sync::Mutex::new(()),
            stop_at: std::sync::atomic::AtomicU64::new(u64::MAX),
        })
    }

    /// The process ended: what the stream holds now is still its output, and
    /// the pump stops once it has passed that on (or the stream ended, or
    /// nothing came for [`IDLE_AFTER_END`]).
    fn process_ended(&self) {
        use std::sync::atomic::Ordering;
        let _reading = self.reading.lock().unwrap_or_else(|p| p.into_inner());
        let mut queued: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int to a valid pointer; the descriptor is ours.
        if unsafe { libc::ioctl(self.input.as_raw_fd(), libc::FIONREAD, &mut queued) } != 0 {
            queued = 0;
        }
        let target = self.read.load(Ordering::SeqCst) + queued.max(0) as u64;
        self.stop_at.store(target, Ordering::SeqCst);
    }

    /// Copies the stream to `out` until its end, or, once the process ended,
    /// until what it held then has been passed on. A failed write (the daemon
    /// went away) drops the rest; the process runs on.
    fn run(&self, mut out: Option<File>, done: std::sync::mpsc::Sender<()>) {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        use std::sync::atomic::Ordering;
        let mut buf = vec![0u8; 64 * 1024];
        let mut idle_since: Option<std::time::Instant> = None;
        loop {
            let ended = self.stop_at.load(Ordering::SeqCst);
            if self.read.load(Ordering::SeqCst) >= ended {
                break;
            }
            // Until the process ends, wait for output or its end; then in short steps.
            let running = ended == u64::MAX;
            let mut fds = [
                PollFd::new(self.input.as_fd(), PollFlags::POLLIN),
                PollFd::new(self.ended.as_fd(), PollFlags::POLLIN),
            ];
            let (watch, timeout) =
                if running { (&mut fds[..], PollTimeout::NONE) } else { (&mut fds[..1], PollTimeout::from(50u16)) };
            let _ = poll(watch, timeout);
            let ready = fds[0].revents().is_some_and(|r| !r.is_empty());
            // Counted as read before it is passed on: writing to a slow daemon
            // may take long, and the process may end meanwhile.
            let got = {
                let _reading = self.reading.lock().unwrap_or_else(|p| p.into_inner());
                let got = nix::unistd::read(self.input.as_raw_fd(), &mut buf);
                if let Ok(n) = got {
                    self.read.fetch_add(n as u64, Ordering::SeqCst);
                }
                got
            };
            match got {
                // The end of the pipe; EIO: a terminal with no holder of its far end left.
                Ok(0) | Err(nix::errno::Errno::EIO) => break,
                Ok(n) => {
                    idle_since = None;
                    if let Some(o) = out.as_mut() {
                        if o.write_all(&buf[..n]).is_err() {
                            out = None;
                        }
                    }
                }
                Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => {
                    if ended != u64::MAX && !ready {
                        let since = *idle_since.get_or_insert_with(std::time::Instant::now);
                        if since.elapsed() >= IDLE_AFTER_END {
                            break;
                        }
                    }
                }
                Err(_) => break,
            }
        }
        let _ = done.send(());
    }
}

/// After the process ended: every pump passes on what its stream held then
/// (however long the daemon takes to read it, up to [`DRAIN_LIMIT`]).
/// `wake` is the write end of the pumps' `ended` pipe.
fn drain(pumps: &[std::sync::Arc<Pump>], wake: std::os::fd::OwnedFd, done: &std::sync::mpsc::Receiver<()>) {
    for p in pumps {
        p.process_ended();
    }
    drop(wake);
    let deadline = std::time::Instant::now() + DRAIN_LIMIT;
    for _ in pumps {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if done.recv_timeout(left).is_err() {
            return;
        }
    }
}

/// One of the process's output streams: a pipe whose write end becomes the
/// process's descriptor `target` and whose read end the shim copies to the
/// daemon's pipe (the shim's own `target`).
struct Relay {
    target: i32,
    read: std::os::fd::OwnedFd,
    write: std::os::fd::OwnedFd,
}

impl Relay {
    /// A relay for `target` when it is a pipe (the daemon's); other descriptors
    /// (a file, /dev/null) are handed to the process as they are.
    fn new(target: i32) -> Option<Relay> {
        let st = nix::sys::stat::fstat(target).ok()?;
        if st.st_mode & libc::S_IFMT != libc::S_IFIFO {
            return None;
        }
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).ok()?;
        Some(Relay { target, read, write })
    }

    /// In the child, before exec: the write end becomes `target`.
    fn install_in_child(&self) {
        // SAFETY: dup2 onto a stdio descriptor of this (single-threaded) child; the
        // copy does not have close-on-exec, the original ends close at exec.
        unsafe { libc::dup2(self.write.as_raw_fd(), self.target) };
    }

    /// In the shim: a thread copies the pipe to the daemon's pipe (the
    /// shim's own `target`; see [`Pump::run`]).
    fn start(
        self,
        ended: std::sync::Arc<std::os::fd::OwnedFd>,
        done: std::sync::mpsc::Sender<()>,
    ) -> std::sync::Arc<Pump> {
        drop(self.write);
        // SAFETY: duplicates our own stdio descriptor (the shim points 0-2 at /dev/null next).
        let fd = unsafe { libc::fcntl(self.target, libc::F_DUPFD_CLOEXEC, 3) };
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let out = (fd >= 0).then(|| unsafe { File::from_raw_fd(fd) });
        let pump = Pump::new(self.read, ended);
        let p = pump.clone();
        std::thread::spawn(move || p.run(out, done));
        pump
    }
}

/// Relays a process's terminal: what it writes to our stdout (a copy of
/// it: the shim points 0-2 at /dev/null next), our stdin to it. `done` hears
/// once its output has ended (see [`Pump::run`]).
fn relay_terminal(
    master: std::os::fd::OwnedFd,
    ended: std::sync::Arc<std::os::fd::OwnedFd>,
    done: std::sync::mpsc::Sender<()>,
) -> std::sync::Arc<Pump> {
    use std::io::Read;
    // SAFETY: duplicates our own stdio descriptors; the copies are fresh and ours.
    let (out, input) = unsafe { (libc::fcntl(1, libc::F_DUPFD_CLOEXEC, 3), libc::fcntl(0, libc::F_DUPFD_CLOEXEC, 3)) };
    // SAFETY: a fresh descriptor that nothing else owns.
    let out = (out >= 0).then(|| unsafe { File::from_raw_fd(out) });
    // SAFETY: a fresh descriptor that nothing else owns.
    let input = (input >= 0).then(|| unsafe { File::from_raw_fd(input) });
    // Without a second descriptor of the terminal, nothing is typed into it (its output still flows).
    let typing = master.try_clone().ok().map(File::from).zip(input);
    let pump = Pump::new(master, ended);
    let p = pump.clone();
    std::thread::spawn(move || p.run(out, done));
    if let Some((to_terminal, mut input)) = typing {
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match input.read(&mut buf) {
                    // The end of our stdin leaves the terminal open (it has no end of its own).
                    Ok(0) => return,
                    Ok(n) => {
                        if write_waiting(&to_terminal, &buf[..n]).is_err() {
                            return;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => return,
                }
            }
        });
    }
    pump
}

/// Writes all of `data` to `to` (non-blocking: the terminal's descriptor is
/// shared with its pump), waiting while it is full.
fn write_waiting(to: &File, mut data: &[u8]) -> nix::Result<()> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    while !data.is_empty() {
        match nix::unistd::write(to, data) {
            Ok(n) => data = &data[n..],
            Err(nix::errno::Errno::EAGAIN) => {
                let mut fds = [PollFd::new(to.as_fd(), PollFlags::POLLOUT)];
                poll(&mut fds, PollTimeout::from(1000u16))?;
            }
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The process itself: new session (on `tty`, with it as its controlling
/// terminal and stdio), pid report, credentials, exec.
fn child(exec: ExecSpec, mut rep: Reporter, tty: Option<std::os::fd::RawFd>) -> ! {
    // The report descriptor must not survive exec; a failed exec still reports on it.
    if let Some(f) = rep.0.as_ref() {
        // SAFETY: F_SETFD on our own descriptor.
        unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    if let Err(e) = nix::unistd::setsid() {
        die(&mut rep, format!("setsid: {e}"));
    }
    // SAFETY: `slave` is the open far end of the terminal the shim made.
    if tty.is_some_and(|slave| !unsafe { crate::pty::become_controlling(slave) }) {
        die(&mut rep, format!("the terminal as controlling terminal: {}", std::io::Error::last_os_error()));
    }
    rep.send(&ExecReport::NsPid { pid: std::process::id() as i32 });
    // The Rust runtime of the helpers ignores SIGPIPE and an ignored signal
    // survives exec: give the process the default (`yes | head` must end).
    // SAFETY: resetting a signal disposition in a single-threaded child.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    match prepare(&exec) {
        Ok((argv0_candidates, argv, envp)) => {
            let mut last = String::from("empty command");
            for path in argv0_candidates {
                // SAFETY: all pointers are valid NUL-terminated arrays built by `prepare`.
                unsafe { libc::execve(path.as_ptr(), argv.ptrs.as_ptr(), envp.ptrs.as_ptr()) };
                let err = std::io::Error::last_os_error();
                last = format!("exec {}: {err}", path.to_string_lossy());
                if err.raw_os_error() != Some(libc::ENOENT) && err.raw_os_error() != Some(libc::ENOTDIR) {
                    break;
                }
            }
            die(&mut rep, last)
        }
        Err(message) => die(&mut rep, message),
    }
}

/// A NULL-terminated array of C strings.
struct CArray {
    _owned: Vec<CString>,
    ptrs: Vec<*const libc::c_char>,
}

impl CArray {
    fn new(items: impl IntoIterator<Item = String>) -> Result<Self, String> {
        let owned: Vec<CString> = items
            .into_iter()
            .map(|s| CString::new(s).map_err(|_| "argument or environment contains a NUL byte".to_string()))
            .collect::<Result<_, _>>()?;
        let mut ptrs: Vec<*const libc::c_char> = owned.iter().map(|c| c.as_ptr()).collect();
        ptrs.push(std::ptr::null());
        Ok(CArray { _owned: owned, ptrs })
    }
}

/// `PATH` of a process whose environment names none.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Largest /etc/passwd or /etc/group the shim reads (the rest is ignored).
const MAX_ACCOUNT_FILE: u64 = 4 << 20;

/// Reads a regular file of the sandbox (at most [`MAX_ACCOUNT_FILE`] bytes);
/// empty when it is missing, not a regular file, or a symlink.
fn read_account_file(path: &str) -> String {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_NOCTTY)
        .open(path)
    else {
        return String::new();
    };
    if !f.metadata().is_ok_and(|m| m.is_file()) {
        return String::new();
    }
    let mut s = String::new();
    let _ = f.take(MAX_ACCOUNT_FILE).read_to_string(&mut s);
    s
}

/// The process's environment: the spec's, with `PATH`, `HOME`, `USER` (a
/// named user) and `HOSTNAME` filled in where it has none.
pub fn environment(exec: &ExecSpec, user: &user::ResolvedUser, hostname: Option<String>) -> BTreeMap<String, String> {
    let mut env = exec.env.clone();
    env.entry("PATH".into()).or_insert_with(|| DEFAULT_PATH.into());
    env.entry("HOME".into()).or_insert_with(|| user.home.clone());
    if let Some(name) = &user.name {
        env.entry("USER".into()).or_insert_with(|| name.clone());
    }
    if let Some(h) = hostname {
        env.entry("HOSTNAME".into()).or_insert(h);
    }
    env
}

/// Everything between fork and exec, in privilege order: the seccomp filter
/// and the sandbox root's capability set first (the process still holds every
/// host capability when it starts), then what reads the sandbox's files (user,
/// cwd, PATH lookup), then the user, then exec.
fn prepare(exec: &ExecSpec) -> Result<(Vec<CString>, CArray, CArray), String> {
    let program = exec.argv.first().ok_or("empty command")?.clone();
    let filters = seccomp::build_filters()?;
    let sandbox_root = user::ResolvedUser { uid: 0, gid: 0, groups: vec![0], home: "/".into(), name: None };
    if exec.allow_setuid {
        // Without no_new_privs the kernel takes a filter only from a holder of
        // CAP_SYS_ADMIN: install it first, then drop. A setuid binary can then
        // become the sandbox's root, whose capabilities the bounding set limits
        // to creds::KEPT, under the same filter.
        seccomp::apply_privileged(&filters)?;
        creds::drop_to(&sandbox_root, &creds::KEPT)?;
    } else {
        creds::drop_to(&sandbox_root, &creds::KEPT)?;
        creds::no_new_privs()?;
        seccomp::apply(&filters)?;
    }

    let passwd = read_account_file("/etc/passwd");
    let group = read_account_file("/etc/group");
    let user = user::resolve(exec.user.as_deref(), &passwd, &group)?;

    let hostname = nix::unistd::gethostname().ok().map(|h| h.to_string_lossy().into_owned());
    let env = environment(exec, &user, hostname);

    let cwd = match &exec.cwd {
        Some(c) => c.clone(),
        None if std::path::Path::new(&user.home).is_dir() => user.home.clone(),
        None => "/".into(),
    };
    nix::unistd::chdir(cwd.as_str()).map_err(|e| format!("working directory {cwd}: {e}"))?;

    let candidates: Vec<CString> = if program.contains('/') {
        vec![CString::new(program.clone()).map_err(|_| "program contains a NUL byte")?]
    } else {
        let found: Vec<CString> = env["PATH"]
            .split(':')
            .filter(|d| !d.is_empty())
            .map(|d| format!("{d}/{program}"))
            .filter(|p| std::path::Path::new(p).exists())
            .filter_map(|p| CString::new(p).ok())
            .collect();
        if found.is_empty() {
            return Err(format!("exec {program}: executable file not found in PATH ({})", env["PATH"]));
        }
        found
    };
    let argv = CArray::new(exec.argv.iter().cloned())?;
    let envp = CArray::new(env.iter().map(|(k, v)| format!("{k}={v}")))?;

    if exec.tty.is_some() && user.uid != 0 {
        // The user owns its terminal, as after a login.
        nix::unistd::fchown(0, Some(nix::unistd::Uid::from_raw(user.uid)), None)
            .map_err(|e| format!("give the terminal to uid {}: {e}", user.uid))?;
    }
    creds::drop_to(&user, &creds::KEPT)?;
    // A change of user may have made the process dumpable again (fs.suid_dumpable):
    // it holds the report pipe until exec.
    crate::enter::make_undumpable();
    // Every descriptor but stdio closes on exec (the report pipe already is close-on-exec).
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets flags.
    unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) };
    Ok((candidates, argv, envp))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn a_pump_passes_on_all_a_process_left_to_a_slow_reader_and_not_a_background_holder() {
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let (ended_r, ended_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let (daemon_r, daemon_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let pump = Pump::new(r, std::sync::Arc::new(ended_r));
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let p = pump.clone();
        std::thread::spawn(move || p.run(Some(File::from(daemon_w)), done_tx));
        // "The process" writes more than two pipes hold (the daemon's pipe fills, the
        // pump's next chunk waits to be written, the rest stays queued), then ends;
        // `w` stays open, as a background child would keep it.
        let data: Vec<u8> = (0..150_000u32).map(|i| (i % 253) as u8).collect();
        let writer = {
            let (w, data) = (w.try_clone().unwrap(), data.clone());
            std::thread::spawn(move || File::from(w).write_all(&data).unwrap())
        };
        // A daemon that reads late.
        let reader = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(400));
            let mut got = Vec::new();
            File::from(daemon_r).read_to_end(&mut got).unwrap();
            got
        });
        // Its writes are all in before it "ends"; the daemon reads nothing for 400 ms.
        while !writer.is_finished() {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        writer.join().unwrap();
        // The pump is blocked writing a chunk it read: those bytes count as passed on.
        std::thread::sleep(std::time::Duration::from_millis(50));
        drain(std::slice::from_ref(&pump), ended_w, &done_rx);
        drop(pump); // the pump thread ended, and with it its end of the daemon's pipe
        assert_eq!(reader.join().unwrap(), data, "every byte, though the daemon read late");
        drop(w);
    }
}
