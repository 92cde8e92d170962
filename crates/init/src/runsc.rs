//! The gVisor tier's side of strata-init.
//!
//! * `_runsc_exec`, run by the daemon on the host: runs one process in a
//!   gVisor sandbox and reports it ([`ExecReport`] lines on the descriptor
//!   named by [`REPORT_FD_ENV`]) as the namespace tier's shim does. The
//!   report channel never enters the sandbox: this helper resolves the user,
//!   working directory, environment and program against the sandbox's root
//!   *on the host* (every path through `openat2(RESOLVE_IN_ROOT)`, files only
//!   if regular), writes an OCI process into a memfd, runs `runsc exec
//!   --process /proc/self/fd/N --internal-pid-file /proc/self/fd/M`, reports
//!   the pid runsc writes there, and the exit status runsc returns (a process
//!   killed by signal N exits runsc with 128 + N: reported as that signal, so an
//!   `exit 130` reads as SIGINT, as in a shell). Nothing of the spec
//!   (environment values included) appears on a host command line.
//!   runsc makes every such process a session and process-group leader.
//! * `_signal SIG TARGET`, run inside a gVisor sandbox through `runsc exec`:
//!   `kill(TARGET, SIG)`, where a negative target is a process group (runsc's
//!   own `kill --pid` reaches one process only).

use std::io::{Read, Seek, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::exec::{die, ExecReport, ExecSpec, Reporter};
use crate::openat2::{open_regular, openat2, RESOLVE_IN_ROOT, RESOLVE_NO_MAGICLINKS};
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
    /// The process to run.
    pub exec: ExecSpec,
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

/// The OCI process of `r` (`terminal` when stdin is a tty).
pub fn process(r: &Resolved, allow_setuid: bool, terminal: bool) -> serde_json::Value {
    let caps: Vec<String> = if r.user.uid == 0 { root_capabilities() } else { Vec::new() };
    // The supplementary groups include the primary one, as setgroups(2) gets them from the shim.
    let extra = &r.user.groups;
    serde_json::json!({
        "terminal": terminal,
        "user": {"uid": r.user.uid, "gid": r.user.gid, "additionalGids": extra},
        "args": r.args,
        "env": r.env,
        "cwd": r.cwd,
        "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
        "noNewPrivileges": !allow_setuid,
    })
}

/// The `runsc exec` arguments after the global flags.
pub fn exec_args(process_fd: RawFd, pid_fd: RawFd, container: &str) -> Vec<String> {
    vec![
        "exec".into(),
        "--process".into(),
        format!("/proc/self/fd/{process_fd}"),
        "--internal-pid-file".into(),
        format!("/proc/self/fd/{pid_fd}"),
        container.to_string(),
    ]
}

/// What runsc's exit status says about the process.
pub fn final_report(code: Option<i32>, started: bool) -> ExecReport {
    match code {
        None => ExecReport::SpawnError { message: "runsc exec was killed".into() },
        // runsc's own failure (its message is on the process's stderr).
        Some(128) if !started => {
            ExecReport::SpawnError { message: "runsc could not start the process (its message is on stderr)".into() }
        }
        Some(c) if (129..=128 + 64).contains(&c) => ExecReport::Signaled { signal: c - 128 },
        Some(c) => ExecReport::Exited { code: c },
    }
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

/// The pid in runsc's internal pid file (empty until the process runs).
fn read_pid(f: &mut std::fs::File) -> Option<i32> {
    let mut s = String::new();
    f.rewind().ok()?;
    f.read_to_string(&mut s).ok()?;
    s.trim().parse().ok()
}

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
    let root = std::fs::File::open(&cfg.root)
        .unwrap_or_else(|e| die(&mut rep, format!("the sandbox's root {}: {e}", cfg.root.display())));
    let resolved = resolve(root.as_raw_fd(), &cfg.exec, &cfg.hostname).unwrap_or_else(|m| die(&mut rep, m));
    drop(root);
    // SAFETY: isatty only inspects descriptor 0.
    let terminal = unsafe { libc::isatty(0) } == 1;
    let json = serde_json::to_vec(&process(&resolved, cfg.exec.allow_setuid, terminal)).expect("serializes");
    let mut process_file = memfd(c"process.json").unwrap_or_else(|e| die(&mut rep, format!("memfd: {e}")));
    process_file.write_all(&json).unwrap_or_else(|e| die(&mut rep, format!("write process.json: {e}")));
    let mut pid_file = memfd(c"pid").unwrap_or_else(|e| die(&mut rep, format!("memfd: {e}")));
    let Some((program, globals)) = cfg.runsc.split_first() else { die(&mut rep, "empty runsc command".into()) };
    let mut child = std::process::Command::new(program)
        .args(globals)
        .args(exec_args(process_file.as_raw_fd(), pid_file.as_raw_fd(), &cfg.container))
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .spawn()
        .unwrap_or_else(|e| die(&mut rep, format!("spawn {program}: {e}")));
    drop(process_file);
    // The pid runsc writes once the process runs, reported once.
    let mut started = false;
    let status = loop {
        if let (false, Some(pid)) = (started, read_pid(&mut pid_file)) {
            rep.send(&ExecReport::NsPid { pid });
            started = true;
        }
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started => break child.wait().unwrap_or_else(|e| die(&mut rep, format!("wait: {e}"))),
            Ok(None) => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => die(&mut rep, format!("wait: {e}")),
        }
    };
    // A process that ended before its pid was read still has one.
    if let (false, Some(pid)) = (started, read_pid(&mut pid_file)) {
        rep.send(&ExecReport::NsPid { pid });
        started = true;
    }
    rep.send(&final_report(status.code(), started));
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
        let p = process(&r, false, false);
        assert_eq!(p["user"]["additionalGids"], serde_json::json!([1000, 10]));
        assert_eq!(p["capabilities"]["bounding"], serde_json::json!([]), "no capabilities for a non-root user");
        assert_eq!(p["noNewPrivileges"], true);
        let root_p = process(
            &resolve(f.as_raw_fd(), &ExecSpec { argv: vec!["sh".into()], ..Default::default() }, "b").unwrap(),
            true,
            false,
        );
        assert!(root_p["capabilities"]["bounding"].as_array().unwrap().iter().any(|c| c == "CAP_SETUID"));
        assert_eq!(root_p["noNewPrivileges"], false);
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
    fn runsc_exit_statuses_map_to_reports() {
        assert_eq!(final_report(Some(0), true), ExecReport::Exited { code: 0 });
        assert_eq!(final_report(Some(3), true), ExecReport::Exited { code: 3 });
        assert_eq!(final_report(Some(137), true), ExecReport::Signaled { signal: 9 });
        assert!(matches!(final_report(Some(128), false), ExecReport::SpawnError { .. }));
        assert_eq!(final_report(Some(128), true), ExecReport::Exited { code: 128 });
        assert_eq!(final_report(Some(255), true), ExecReport::Exited { code: 255 });
    }

    #[test]
    fn exec_arguments_name_the_memfds() {
        assert_eq!(
            exec_args(5, 6, "sb1"),
            ["exec", "--process", "/proc/self/fd/5", "--internal-pid-file", "/proc/self/fd/6", "sb1"].map(String::from)
        );
    }
}
