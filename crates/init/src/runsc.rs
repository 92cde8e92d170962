//! The gVisor tier's side of strata-init.
//!
//! * `_runsc_exec`, run by the daemon on the host: runs one process in a
//!   gVisor sandbox, or takes over one that runs there ([`Job`]), and reports
//!   it ([`ExecReport`] lines on the descriptor named by [`REPORT_FD_ENV`]) as
//!   the namespace tier's shim does. The report channel never enters the
//!   sandbox: this helper resolves the user, working directory, environment
//!   and program against the sandbox's root *on the host* (every path through
//!   `openat2(RESOLVE_IN_ROOT)`, files only if regular), writes the request
//!   into a memfd and runs `runsc exec` of `_gclient` with it as descriptor 3
//!   and a status pipe as descriptor 4 (`--pass-fd`). The client has pid 1
//!   start the process ([`crate::spawner`]: so it survives a checkpoint),
//!   relays its stdio, and writes its pid and its exact end (exit code or
//!   signal) on the status pipe; this helper checks each line and reports
//!   it. Nothing of the spec (environment values included) appears on a host
//!   command line. The start of a client holds the sandbox's exec lock
//!   shared ([`RunscExec::lock`]): a checkpoint holds it exclusive, so no
//!   client appears while one is taken.
//! * `_signal SIG TARGET`, run inside a gVisor sandbox through `runsc exec`:
//!   `kill(TARGET, SIG)`, where a negative target is a process group (runsc's
//!   own `kill --pid` reaches one process only).

use std::io::{Read, Seek, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::exec::{die, ExecReport, ExecSpec, Reporter};
use crate::openat2::{open_regular, openat2, RESOLVE_IN_ROOT, RESOLVE_NO_MAGICLINKS};
use crate::spawner::{Process, Request, Status, REQUEST_FD, STATUS_FD};
use crate::user;

/// Environment variable carrying the [`RunscExec`] JSON.
pub const CONFIG_ENV: &str = "STRATA_RUNSC_EXEC";

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
    /// `runsc` and its global flags (`--root`, `--platform`, ...).
    pub runsc: Vec<String>,
    /// The container (sandbox) id.
    pub container: String,
    /// The sandbox's root as the host sees it (the user, directory and
    /// program are resolved in it).
    pub root: PathBuf,
    /// The sandbox's hostname (`HOSTNAME` when the spec has none).
    pub hostname: String,
    /// The lock file held shared while a client starts (see the module docs).
    pub lock: PathBuf,
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
pub fn spawn_request(r: &Resolved, allow_setuid: bool) -> Request {
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
        },
    }
}

/// The OCI process of the client `runsc exec` starts: root without
/// capabilities (pid 1 accepts only uid 0 and gives the process its own).
pub fn client_process() -> serde_json::Value {
    serde_json::json!({
        "terminal": false,
        "user": {"uid": 0, "gid": 0},
        "args": [crate::SELF_PATH, "_gclient"],
        "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"],
        "cwd": "/",
        "capabilities": {"bounding": [], "effective": [], "permitted": []},
        "noNewPrivileges": true,
    })
}

/// The `runsc exec` arguments after the global flags: the client's process
/// file, and the request and status descriptors passed in as 3 and 4.
pub fn exec_args(process_fd: RawFd, request_fd: RawFd, status_fd: RawFd, container: &str) -> Vec<String> {
    vec![
        "exec".into(),
        "--process".into(),
        format!("/proc/self/fd/{process_fd}"),
        "--pass-fd".into(),
        format!("{request_fd}:{REQUEST_FD}"),
        "--pass-fd".into(),
        format!("{status_fd}:{STATUS_FD}"),
        container.to_string(),
    ]
}

/// The report a status line from the client stands for (`None`: not one the
/// client writes; the line is ignored).
pub fn report_of(line: &str) -> Option<ExecReport> {
    Some(match serde_json::from_str::<Status>(line.trim()).ok()? {
        Status::Pid { pid } if pid > 1 => ExecReport::NsPid { pid },
        Status::Pid { .. } => return None,
        Status::Exited { code } => ExecReport::Exited { code },
        Status::Signaled { signal } if (1..=64).contains(&signal) => ExecReport::Signaled { signal },
        Status::Signaled { .. } => return None,
        Status::Failed { message } => ExecReport::SpawnError { message: message.chars().take(2048).collect() },
    })
}

fn memfd(name: &std::ffi::CStr) -> std::io::Result<std::fs::File> {
    // SAFETY: memfd_create with a NUL-terminated name; the result is a new descriptor we own.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is new and owned here (no close-on-exec: runsc inherits it).
    Ok(std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Longest status line read from the client.
const MAX_STATUS_LINE: u64 = 4096;
/// Most status lines read from one client (it writes two: pid, end); a
/// client that writes more is tampered with and is not listened to further.
const MAX_STATUS_LINES: usize = 8;

/// Entry point of `strata-init _runsc_exec`. Never returns.
pub fn exec_main() -> ! {
    let mut rep = Reporter::from_env();
    if let Some(f) = rep.0.as_ref() {
        // The report descriptor stays with this helper; runsc never gets it.
        // SAFETY: F_SETFD on our own descriptor.
        unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    let raw = std::env::var(CONFIG_ENV).unwrap_or_else(|_| die(&mut rep, format!("{CONFIG_ENV} is not set")));
    let cfg: RunscExec = serde_json::from_str(&raw).unwrap_or_else(|e| die(&mut rep, format!("parse config: {e}")));
    let request = match &cfg.job {
        Job::Exec { exec } => {
            let root = std::fs::File::open(&cfg.root)
                .unwrap_or_else(|e| die(&mut rep, format!("the sandbox's root {}: {e}", cfg.root.display())));
            let resolved = resolve(root.as_raw_fd(), exec, &cfg.hostname).unwrap_or_else(|m| die(&mut rep, m));
            spawn_request(&resolved, exec.allow_setuid)
        }
        Job::Attach { pid, stdin } => Request::Attach { pid: *pid, stdin: *stdin },
    };
    let memfile = |name: &std::ffi::CStr, bytes: &[u8], rep: &mut Reporter| {
        let mut f = memfd(name).unwrap_or_else(|e| die(rep, format!("memfd: {e}")));
        f.write_all(bytes).and_then(|_| f.rewind()).unwrap_or_else(|e| die(rep, format!("write {name:?}: {e}")));
        f
    };
    let process_file = memfile(c"process.json", &serde_json::to_vec(&client_process()).expect("serializes"), &mut rep);
    let request_file = memfile(c"request.json", &serde_json::to_vec(&request).expect("serializes"), &mut rep);
    let (status_r, status_w) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap_or_else(|e| die(&mut rep, format!("pipe: {e}")));
    // Only runsc inherits the write end.
    // SAFETY: F_SETFD on our own descriptor.
    unsafe { libc::fcntl(status_w.as_raw_fd(), libc::F_SETFD, 0) };
    // Held shared until the client has told its pid (or ended): a checkpoint waits for it.
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
    let Some((program, globals)) = cfg.runsc.split_first() else { die(&mut rep, "empty runsc command".into()) };
    let mut child = std::process::Command::new(program)
        .args(globals)
        .args(exec_args(process_file.as_raw_fd(), request_file.as_raw_fd(), status_w.as_raw_fd(), &cfg.container))
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .spawn()
        .unwrap_or_else(|e| die(&mut rep, format!("spawn {program}: {e}")));
    drop((process_file, request_file, status_w));
    let mut lock = Some(lock);
    let mut reader = std::io::BufReader::new(std::fs::File::from(status_r));
    let mut started = false;
    for _ in 0..MAX_STATUS_LINES {
        let mut line = String::new();
        match std::io::BufRead::read_line(&mut (&mut reader).take(MAX_STATUS_LINE), &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let Some(report) = report_of(&line) else { continue };
        let last = !matches!(report, ExecReport::NsPid { .. });
        if !last {
            started = true;
            lock = None;
        }
        rep.send(&report);
        if last {
            let _ = child.wait();
            std::process::exit(0)
        }
    }
    drop(lock);
    let status = child.wait().unwrap_or_else(|e| die(&mut rep, format!("wait: {e}")));
    if !started {
        // runsc's own failure: its message is on the process's stderr.
        rep.send(&ExecReport::SpawnError {
            message: format!("runsc could not start the process ({status}; its message is on stderr)"),
        });
    }
    // Started, and the client left without a word: it was told to let go (a
    // checkpoint), or the sandbox is gone. The daemon knows which.
    std::process::exit(0)
}

/// Entry point of `strata-init _signal SIG TARGET` (inside a sandbox). Exits 0
/// when the signal was sent, 1 when nothing matched, 2 on bad arguments.
pub fn signal_main() -> ! {
    let args: Vec<String> = std::env::args().skip(2).collect();
    let parsed = match args.as_slice() {
        [sig, target] => sig.parse::<i32>().ok().zip(target.parse::<i32>().ok()),
        _ => None,
    };
    let Some((sig, target)) = parsed.filter(|(s, t)| *s > 0 && *t != 0 && *t != -1) else {
        eprintln!("usage: strata-init _signal SIG TARGET (TARGET: pid, or -pgid)");
        std::process::exit(2)
    };
    // SAFETY: kill takes integer arguments only.
    let r = unsafe { libc::kill(target, sig) };
    std::process::exit(if r == 0 { 0 } else { 1 })
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
        let Request::Spawn { process } = spawn_request(&r, false) else { panic!() };
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
    fn status_lines_map_to_reports_and_nothing_else_does() {
        assert_eq!(report_of(r#"{"type":"pid","pid":7}"#), Some(ExecReport::NsPid { pid: 7 }));
        assert_eq!(report_of(r#"{"type":"exited","code":130}"#), Some(ExecReport::Exited { code: 130 }));
        assert_eq!(report_of(r#"{"type":"signaled","signal":2}"#), Some(ExecReport::Signaled { signal: 2 }));
        assert!(matches!(
            report_of(r#"{"type":"failed","message":"exec x: nope"}"#),
            Some(ExecReport::SpawnError { .. })
        ));
        assert_eq!(report_of(r#"{"type":"pid","pid":1}"#), None, "pid 1 is strata's, never a process's");
        assert_eq!(report_of(r#"{"type":"signaled","signal":99}"#), None);
        assert_eq!(report_of("garbage"), None);
    }

    #[test]
    fn exec_arguments_name_the_memfds_and_pass_the_descriptors() {
        assert_eq!(
            exec_args(5, 6, 7, "sb1"),
            ["exec", "--process", "/proc/self/fd/5", "--pass-fd", "6:3", "--pass-fd", "7:4", "sb1"].map(String::from)
        );
        let p = client_process();
        assert_eq!(p["args"], serde_json::json!(["/run/strata/init", "_gclient"]));
        assert_eq!(p["capabilities"]["bounding"], serde_json::json!([]), "the client needs no capability");
    }
}
