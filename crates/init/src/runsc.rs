//! The gVisor tier's side of strata-init (its exec helper serves the microvm
//! tier too: the same channel, reached through the VM's line).
//!
//! * `_runsc_exec`, run by the daemon on the host: runs one process in a
//!   gVisor sandbox (or a microVM: there pid 1 resolves it, [`Request::Run`]), or takes over one that runs there ([`Job`]), and reports
//!   it ([`ExecReport`] lines on the descriptor named by [`REPORT_FD_ENV`]) as
//!   the namespace tier's shim does. The report channel never enters the
//!   sandbox: this helper resolves the user, working directory, environment
//!   and program against the sandbox's root *on the host* (every path through
//!   `openat2(RESOLVE_IN_ROOT)`, files only if regular), takes one of pid 1's
//!   connections from the sandbox's broker ([`crate::channel`]), checks that
//!   its far end proves the sandbox's token, and has pid 1 start the process
//!   ([`crate::spawner`]: so it survives a checkpoint). It relays the
//!   process's output and its own stdin, and reports the process's pid and its
//!   exact end (exit code or signal). Nothing of the spec (environment values
//!   included) appears on a host command line. The start holds the sandbox's
//!   exec lock shared ([`RunscExec::lock`]) until the process runs: a
//!   checkpoint holds it exclusive, so none starts while one is taken.
//!
//! Signals to a sandbox's processes go over the channel too
//! ([`crate::spawner::Request::Signal`]).

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::channel::{self, Frame};
use crate::exec::{die, ExecReport, ExecSpec, Reporter};
use crate::openat2::{open_regular, openat2, RESOLVE_IN_ROOT, RESOLVE_NO_MAGICLINKS};
use crate::spawner::{Process, Request, Status};
use crate::user;

/// Environment variable carrying the [`RunscExec`] JSON.
pub const CONFIG_ENV: &str = "STRATA_RUNSC_EXEC";

/// Stdin bytes queued for pid 1 before this helper stops reading its own stdin.
const MAX_STDIN_QUEUED: usize = 256 << 10;

/// Largest /etc/passwd or /etc/group read (the rest is ignored).
const MAX_ACCOUNT_FILE: u64 = 4 << 20;

/// The capabilities of root inside a gVisor sandbox (the sentry's, not the
/// host's): the namespace tier's set ([`crate::creds::KEPT`]).
pub fn root_capabilities() -> Vec<String> {
    crate::creds::KEPT.iter().map(|c| c.to_string()).collect()
}

/// What `_runsc_exec` receives.
#[derive(Debug, Serialize, Deserialize)]
pub struct RunscExec {
    /// The sandbox's root as the host sees it (the user, directory and
    /// program are resolved in it). `None` on the microvm tier, whose root
    /// is inside the guest: pid 1 resolves them there ([`Request::Run`]).
    #[serde(default)]
    pub root: Option<PathBuf>,
    /// The sandbox's hostname (`HOSTNAME` when the spec has none).
    pub hostname: String,
    /// The lock file held shared while a process starts (see the module docs).
    pub lock: PathBuf,
    /// The control socket of the sandbox's broker.
    pub broker: PathBuf,
    /// The file holding the sandbox's token (host-only).
    pub token: PathBuf,
    /// What to do.
    pub job: Job,
}

/// What `_runsc_exec` does in the sandbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Job {
    /// Start a process.
    Exec {
        /// The process.
        exec: ExecSpec,
    },
    /// Take over the stdio and the end of a process pid 1 started before
    /// (after a restore or a copy).
    Attach {
        /// Its pid in the sandbox.
        pid: i32,
        /// Whether our stdin feeds its stdin.
        stdin: bool,
    },
}

/// The process as runsc gets it.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// argv, with the program resolved to its path inside.
    pub args: Vec<String>,
    /// `K=V` pairs.
    pub env: Vec<String>,
    /// Working directory.
    pub cwd: String,
    /// The user.
    pub user: user::ResolvedUser,
}

/// A path inside the sandbox, relative to its root for openat2.
fn rel(path: &str) -> &str {
    let r = path.trim_start_matches('/');
    if r.is_empty() {
        "."
    } else {
        r
    }
}

fn read_account_file(root: RawFd, path: &str) -> String {
    let Ok(f) = open_regular(root, rel(path), libc::O_RDONLY, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS) else {
        return String::new();
    };
    let mut s = String::new();
    let _ = f.take(MAX_ACCOUNT_FILE).read_to_string(&mut s);
    s
}

fn is_dir(root: RawFd, path: &str) -> bool {
    openat2(root, rel(path), libc::O_PATH | libc::O_DIRECTORY, 0, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS).is_ok()
}

/// A regular file with an execute bit, inside the root.
fn is_executable(root: RawFd, path: &str) -> bool {
    let Ok(fd) = openat2(root, rel(path), libc::O_PATH, 0, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS) else {
        return false;
    };
    nix::sys::stat::fstat(fd.as_raw_fd())
        .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_mode & 0o111 != 0)
}

/// Resolves `exec` against the sandbox root open as `root`: as the shim does
/// inside a namespace sandbox (user from its /etc/passwd and /etc/group,
/// `PATH`/`HOME`/`USER`/`HOSTNAME` filled in, the home as the default working
/// directory, the program looked up in `PATH`), with the same messages.
pub fn resolve(root: RawFd, exec: &ExecSpec, hostname: &str) -> Result<Resolved, String> {
    let program = exec.argv.first().ok_or("empty command")?.clone();
    let passwd = read_account_file(root, "/etc/passwd");
    let group = read_account_file(root, "/etc/group");
    let user = user::resolve(exec.user.as_deref(), &passwd, &group)?;
    let env = crate::exec::environment(exec, &user, Some(hostname.to_string()));
    let cwd = match &exec.cwd {
        Some(c) if is_dir(root, c) => c.clone(),
        Some(c) => return Err(format!("working directory {c}: No such file or directory")),
        None if is_dir(root, &user.home) => user.home.clone(),
        None => "/".into(),
    };
    let path = if program.contains('/') {
        program.clone()
    } else {
        env["PATH"]
            .split(':')
            .filter(|d| !d.is_empty())
            .map(|d| format!("{d}/{program}"))
            .find(|p| is_executable(root, p))
            .ok_or_else(|| format!("exec {program}: executable file not found in PATH ({})", env["PATH"]))?
    };
    let mut args = exec.argv.clone();
    args[0] = path;
    Ok(Resolved { args, env: env.iter().map(|(k, v)| format!("{k}={v}")).collect(), cwd, user })
}

/// What pid 1 gets to start `r`.
pub fn spawn_request(r: &Resolved, allow_setuid: bool, tty: Option<crate::pty::TtySize>) -> Request {
    Request::Spawn {
        process: Process {
            args: r.args.clone(),
            env: r.env.clone(),
            cwd: r.cwd.clone(),
            uid: r.user.uid,
            gid: r.user.gid,
            // The supplementary groups include the primary one, as setgroups(2) gets them from the shim.
            groups: r.user.groups.clone(),
            allow_setuid,
            tty,
        },
    }
}

/// The report an end of a process stands for.
pub fn report_of(status: &Status) -> Option<ExecReport> {
    Some(match status {
        Status::Pid { pid } if *pid > 1 => ExecReport::NsPid { pid: *pid },
        Status::Pid { .. } => return None,
        Status::Exited { code } => ExecReport::Exited { code: *code },
        Status::Signaled { signal } if (1..=64).contains(signal) => ExecReport::Signaled { signal: *signal },
        Status::Signaled { .. } => return None,
        Status::Failed { message } => ExecReport::SpawnError { message: message.chars().take(2048).collect() },
    })
}

/// Takes one of pid 1's connections from the broker at `broker` and opens
/// it as the host (pid 1 must prove the token in `token_file`). A
/// connection whose far end proves nothing (a stranger in the sandbox
/// offered it) is dropped and another taken, a few times.
pub fn connect(
    broker: &std::path::Path,
    token_file: &std::path::Path,
) -> Result<(std::os::unix::net::UnixStream, channel::FrameReader), String> {
    let token = std::fs::read(token_file).map_err(|e| format!("the sandbox's token {}: {e}", token_file.display()))?;
    let mut last = String::new();
    for _ in 0..4 {
        let mut conn = channel::take(broker).map_err(|e| format!("reach the sandbox's init: {e}"))?;
        match channel::open_as_host(&mut conn, &token) {
            Ok(reader) => return Ok((conn, reader)),
            Err(e) => last = e.to_string(),
        }
    }
    Err(format!("reach the sandbox's init: {last}"))
}

/// Entry point of `strata-init _runsc_exec`. Never returns.
pub fn exec_main() -> ! {
    let mut rep = Reporter::from_env();
    if let Some(f) = rep.0.as_ref() {
        // The report descriptor stays with this helper.
        // SAFETY: F_SETFD on our own descriptor.
        unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    let raw = std::env::var(CONFIG_ENV).unwrap_or_else(|_| die(&mut rep, format!("{CONFIG_ENV} is not set")));
    let cfg: RunscExec = serde_json::from_str(&raw).unwrap_or_else(|e| die(&mut rep, format!("parse config: {e}")));
    let (request, feeds_stdin) = match &cfg.job {
        Job::Exec { exec } => match &cfg.root {
            Some(root_path) => {
                let root = std::fs::File::open(root_path)
                    .unwrap_or_else(|e| die(&mut rep, format!("the sandbox's root {}: {e}", root_path.display())));
                let resolved = resolve(root.as_raw_fd(), exec, &cfg.hostname).unwrap_or_else(|m| die(&mut rep, m));
                (spawn_request(&resolved, exec.allow_setuid, exec.tty), true)
            }
            None => (Request::Run { exec: exec.clone(), hostname: cfg.hostname.clone() }, true),
        },
        Job::Attach { pid, stdin } => (Request::Attach { pid: *pid, stdin: *stdin }, *stdin),
    };
    // Held shared until the process runs: a checkpoint waits for it.
    let lock = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&cfg.lock)
        .unwrap_or_else(|e| die(&mut rep, format!("the sandbox's exec lock {}: {e}", cfg.lock.display())));
    // SAFETY: flock on our own descriptor.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_SH) } != 0 {
        die(&mut rep, format!("lock {}: {}", cfg.lock.display(), std::io::Error::last_os_error()));
    }
    let (mut conn, mut reader) = connect(&cfg.broker, &cfg.token).unwrap_or_else(|m| die(&mut rep, m));
    let req = serde_json::to_vec(&request).expect("request serializes");
    if let Err(e) = channel::write_frame(&mut conn, Frame::Request, &req) {
        die(&mut rep, format!("send the request to the sandbox's init: {e}"));
    }
    let mut lock = Some(lock);
    relay(conn, &mut reader, feeds_stdin, &mut rep, &mut lock)
}

/// Relays frames of pid 1's to our stdout and stderr, our stdin to it, and
/// reports the process until it ends, pid 1 lets go, or the channel closes.
fn relay(
    mut conn: std::os::unix::net::UnixStream,
    reader: &mut channel::FrameReader,
    feeds_stdin: bool,
    rep: &mut Reporter,
    lock: &mut Option<std::fs::File>,
) -> ! {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut stdin_open = feeds_stdin;
    let mut started = false;
    // Frames for pid 1 not written yet (the connection does not block).
    let mut outq: Vec<u8> = Vec::new();
    if let Err(e) = conn.set_nonblocking(true) {
        die(rep, format!("the channel to the sandbox's init: {e}"));
    }
    let mut buf = vec![0u8; 64 << 10];
    let (mut out, mut err) = (std::io::stdout().lock(), std::io::stderr().lock());
    loop {
        // Every whole frame first.
        loop {
            let frame = match reader.next_frame() {
                Ok(f) => f,
                Err(e) => die(rep, format!("the sandbox's init sent {}", e.0)),
            };
            let Some((kind, payload)) = frame else { break };
            match kind {
                Frame::Started => {
                    let pid = payload.as_slice().try_into().map(i32::from_le_bytes).unwrap_or(0);
                    if let Some(r) = report_of(&Status::Pid { pid }) {
                        rep.send(&r);
                    }
                    started = true;
                    *lock = None;
                }
                Frame::Stdout => {
                    let _ = out.write_all(&payload).and_then(|_| out.flush());
                }
                Frame::Stderr => {
                    let _ = err.write_all(&payload).and_then(|_| err.flush());
                }
                Frame::Ended => {
                    let status: Option<Status> = serde_json::from_slice(&payload).ok();
                    if let Some(r) = status.as_ref().and_then(report_of) {
                        rep.send(&r);
                    }
                    std::process::exit(0)
                }
                Frame::Failed => {
                    let message = String::from_utf8_lossy(&payload).into_owned();
                    rep.send(&ExecReport::SpawnError { message: message.chars().take(2048).collect() });
                    std::process::exit(0)
                }
                // Another connection took the process, or a checkpoint comes: the daemon knows which.
                Frame::LetGo => std::process::exit(0),
                _ => {}
            }
        }
        let mut conn_ev = PollFlags::POLLIN;
        if !outq.is_empty() {
            conn_ev |= PollFlags::POLLOUT;
        }
        let mut fds = vec![PollFd::new(conn.as_fd(), conn_ev)];
        // SAFETY: descriptor 0 is our stdin for the life of this process.
        let stdin = unsafe { std::os::fd::BorrowedFd::borrow_raw(0) };
        // Stdin is read only while what pid 1 has not taken yet is short: pid 1
        // stops reading while its process has not read its stdin, and we keep
        // reading its output meanwhile (a blocking write here could deadlock).
        if stdin_open && started && outq.len() < MAX_STDIN_QUEUED {
            fds.push(PollFd::new(stdin, PollFlags::POLLIN));
        }
        if poll(&mut fds, PollTimeout::NONE).is_err() {
            continue;
        }
        let revents: Vec<PollFlags> = fds.iter().map(|f| f.revents().unwrap_or(PollFlags::empty())).collect();
        drop(fds);
        if revents[0].contains(PollFlags::POLLOUT) && !outq.is_empty() {
            match conn.write(&outq) {
                Ok(n) => {
                    outq.drain(..n);
                }
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted) => {}
                // The channel is gone: its end (below) says what happened.
                Err(_) => {
                    outq.clear();
                    stdin_open = false;
                }
            }
        }
        if revents[0].intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR) {
            match conn.read(&mut buf) {
                Ok(0) => channel_ended(rep, started),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted) => {}
                Err(_) => channel_ended(rep, started),
                Ok(n) => reader.push(&buf[..n]),
            }
        }
        if revents.get(1).is_some_and(|r| !r.is_empty()) {
            match nix::unistd::read(0, &mut buf) {
                Ok(n) if n > 0 => channel::encode(&mut outq, Frame::Stdin, &buf[..n]),
                Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => {}
                _ => {
                    stdin_open = false;
                    channel::encode(&mut outq, Frame::StdinEof, b"");
                }
            }
        }
    }
}

/// The channel ended without an end of the process.
fn channel_ended(rep: &mut Reporter, started: bool) -> ! {
    if !started {
        rep.send(&ExecReport::SpawnError {
            message: "the sandbox's init closed the channel before the process started".into(),
        });
    }
    // Started, and the channel ended without an end: a checkpoint
    // took the sandbox, or it is gone. The daemon knows which.
    std::process::exit(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn root() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("etc")).unwrap();
        std::fs::create_dir_all(d.path().join("bin")).unwrap();
        std::fs::create_dir_all(d.path().join("home/app")).unwrap();
        std::fs::write(d.path().join("etc/passwd"), "root:x:0:0::/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n")
            .unwrap();
        std::fs::write(d.path().join("etc/group"), "root:x:0:\napp:x:1000:\nwheel:x:10:app\n").unwrap();
        let sh = d.path().join("bin/sh");
        std::fs::write(&sh, "").unwrap();
        std::fs::set_permissions(&sh, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(d.path().join("bin/notexec"), "").unwrap();
        d
    }

    #[test]
    fn the_process_is_resolved_against_the_sandboxs_own_files() {
        let d = root();
        let f = std::fs::File::open(d.path()).unwrap();
        let exec = ExecSpec {
            argv: vec!["sh".into(), "-c".into(), "id".into()],
            user: Some("app".into()),
            ..Default::default()
        };
        let r = resolve(f.as_raw_fd(), &exec, "box").unwrap();
        assert_eq!(r.args, ["/bin/sh", "-c", "id"]);
        assert_eq!((r.user.uid, r.user.gid), (1000, 1000));
        assert_eq!(r.cwd, "/home/app", "the home is the default directory");
        assert!(r.env.contains(&"HOME=/home/app".to_string()) && r.env.contains(&"HOSTNAME=box".to_string()));
        let Request::Spawn { process } = spawn_request(&r, false, None) else { panic!() };
        assert_eq!(process.groups, [1000, 10]);
        assert_eq!((process.uid, process.allow_setuid), (1000, false));
    }

    #[test]
    fn what_cannot_start_is_said_as_the_shim_says_it() {
        let d = root();
        let f = std::fs::File::open(d.path()).unwrap();
        let run = |argv: &[&str], cwd: Option<&str>, user: Option<&str>| {
            let exec = ExecSpec {
                argv: argv.iter().map(|s| s.to_string()).collect(),
                cwd: cwd.map(str::to_string),
                user: user.map(str::to_string),
                ..Default::default()
            };
            resolve(f.as_raw_fd(), &exec, "b").unwrap_err()
        };
        assert!(run(&["nope"], None, None).contains("executable file not found in PATH"));
        assert!(run(&["notexec"], None, None).contains("executable file not found"), "no execute bit");
        assert!(run(&["sh"], Some("/missing"), None).contains("working directory /missing"));
        assert!(run(&["sh"], None, Some("ghost")).contains("unknown user \"ghost\""));
        assert_eq!(run(&[], None, None), "empty command");
    }

    #[test]
    fn symlinks_in_the_image_do_not_reach_host_files() {
        let d = root();
        // /etc/passwd pointing at the host's: resolved inside the root (absent there), so root only.
        std::fs::remove_file(d.path().join("etc/passwd")).unwrap();
        std::os::unix::fs::symlink("/../../../../etc/passwd", d.path().join("etc/passwd")).unwrap();
        let f = std::fs::File::open(d.path()).unwrap();
        let exec = ExecSpec { argv: vec!["sh".into()], user: Some("daemon".into()), ..Default::default() };
        assert!(resolve(f.as_raw_fd(), &exec, "b").unwrap_err().contains("unknown user"));
    }

    #[test]
    fn ends_map_to_reports_and_nothing_else_does() {
        assert_eq!(report_of(&Status::Pid { pid: 7 }), Some(ExecReport::NsPid { pid: 7 }));
        assert_eq!(report_of(&Status::Exited { code: 130 }), Some(ExecReport::Exited { code: 130 }));
        assert_eq!(report_of(&Status::Signaled { signal: 2 }), Some(ExecReport::Signaled { signal: 2 }));
        assert!(matches!(
            report_of(&Status::Failed { message: "exec x: nope".into() }),
            Some(ExecReport::SpawnError { .. })
        ));
        assert_eq!(report_of(&Status::Pid { pid: 1 }), None, "pid 1 is strata's, never a process's");
        assert_eq!(report_of(&Status::Signaled { signal: 99 }), None);
    }
}
