//! `strata _enter`: runs one process inside a running sandbox.
//!
//! Like `nsenter`: join the cgroup, `setns` into init's namespaces, fork (the
//! child is inside the pid namespace), and in the child resolve the user
//! against the sandbox's own /etc/passwd, drop capabilities, set no_new_privs,
//! install the seccomp filter and exec. The parent stays outside, waits, and
//! reports on the descriptor named by `STRATA_REPORT_FD` ([`ExecReport`] JSON lines).

use std::ffi::CString;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, FromRawFd};
use std::path::PathBuf;

use nix::sched::{setns, CloneFlags};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, ForkResult};
use serde::{Deserialize, Serialize};

use super::{creds, seccomp, user};
use crate::spec::{ExecReport, ExecSpec};

/// Environment variable carrying the [`EnterConfig`] JSON.
pub const CONFIG_ENV: &str = "STRATA_ENTER_CONFIG";
/// Environment variable naming the descriptor the helper reports on.
pub const REPORT_FD_ENV: &str = "STRATA_REPORT_FD";

/// What `_enter` receives.
#[derive(Debug, Serialize, Deserialize)]
pub struct EnterConfig {
    /// Host pid of the sandbox's init.
    pub init_pid: i32,
    /// Cgroup files to write "0" to (join).
    pub cgroup_join_files: Vec<PathBuf>,
    /// The process.
    pub exec: ExecSpec,
}

struct Reporter(Option<File>);

impl Reporter {
    fn send(&mut self, r: &ExecReport) {
        if let Some(f) = self.0.as_mut() {
            let mut line = serde_json::to_vec(r).expect("ExecReport serializes");
            line.push(b'\n');
            let _ = f.write_all(&line);
        }
    }
}

fn die(rep: &mut Reporter, message: String) -> ! {
    rep.send(&ExecReport::SpawnError { message });
    std::process::exit(127)
}

/// Entry point of `strata _enter`. Never returns.
pub fn main() -> ! {
    let report_fd: Option<i32> = std::env::var(REPORT_FD_ENV).ok().and_then(|v| v.parse().ok()).filter(|fd| *fd > 2);
    // SAFETY: the daemon hands this descriptor to us for exclusive use; fcntl checks it is open.
    let report_file = report_fd.and_then(|fd| unsafe { (libc::fcntl(fd, libc::F_GETFD) >= 0).then(|| File::from_raw_fd(fd)) });
    let mut rep = Reporter(report_file);
    let raw = std::env::var(CONFIG_ENV).unwrap_or_else(|_| die(&mut rep, format!("{CONFIG_ENV} is not set")));
    let cfg: EnterConfig = serde_json::from_str(&raw).unwrap_or_else(|e| die(&mut rep, format!("parse config: {e}")));
    // "0" moves the writing (single-threaded) process itself; see SandboxCgroup::join_files.
    for f in &cfg.cgroup_join_files {
        if let Err(e) = std::fs::write(f, "0") {
            die(&mut rep, format!("join cgroup {}: {e}", f.display()));
        }
    }
    // Open every namespace first (the mount namespace changes our view of /proc), then join.
    let order = [
        ("ipc", CloneFlags::CLONE_NEWIPC),
        ("uts", CloneFlags::CLONE_NEWUTS),
        ("net", CloneFlags::CLONE_NEWNET),
        ("cgroup", CloneFlags::CLONE_NEWCGROUP),
        ("pid", CloneFlags::CLONE_NEWPID),
        ("mnt", CloneFlags::CLONE_NEWNS),
    ];
    let mut files = Vec::new();
    for (name, flag) in order {
        let path = format!("/proc/{}/ns/{name}", cfg.init_pid);
        match File::open(&path) {
            Ok(f) => files.push((name, flag, f)),
            Err(e) => die(&mut rep, format!("open {path}: {e} (is the sandbox running?)")),
        }
    }
    for (name, flag, f) in &files {
        if let Err(e) = setns(f.as_fd(), *flag) {
            die(&mut rep, format!("setns {name}: {e}"));
        }
    }
    drop(files);
    // SAFETY: single-threaded process (fresh exec, no threads started), so the
    // child may allocate and run arbitrary code before exec.
    match unsafe { fork() } {
        Err(e) => die(&mut rep, format!("fork: {e}")),
        Ok(ForkResult::Child) => child(cfg.exec, rep),
        Ok(ForkResult::Parent { child }) => {
            rep.send(&ExecReport::Started { host_pid: child.as_raw() });
            loop {
                match waitpid(child, None) {
                    Ok(WaitStatus::Exited(_, code)) => {
                        rep.send(&ExecReport::Exited { code });
                        std::process::exit(code)
                    }
                    Ok(WaitStatus::Signaled(_, sig, _)) => {
                        rep.send(&ExecReport::Signaled { signal: sig as i32 });
                        std::process::exit(128 + sig as i32)
                    }
                    Ok(_) => continue,
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(e) => die(&mut rep, format!("wait: {e}")),
                }
            }
        }
    }
}

fn child(exec: ExecSpec, mut rep: Reporter) -> ! {
    // The report descriptor must not survive exec; a failed exec still reports on it.
    if let Some(f) = rep.0.as_ref() {
        // SAFETY: F_SETFD on our own descriptor.
        unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    if let Err(e) = nix::unistd::setsid() {
        die(&mut rep, format!("setsid: {e}"));
    }
    rep.send(&ExecReport::NsPid { pid: std::process::id() as i32 });
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
        let owned: Vec<CString> = items.into_iter().map(|s| CString::new(s).map_err(|_| "argument or environment contains a NUL byte".to_string())).collect::<Result<_, _>>()?;
        let mut ptrs: Vec<*const libc::c_char> = owned.iter().map(|c| c.as_ptr()).collect();
        ptrs.push(std::ptr::null());
        Ok(CArray { _owned: owned, ptrs })
    }
}

const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Everything between fork and exec: user, cwd, environment, credentials, seccomp.
fn prepare(exec: &ExecSpec) -> Result<(Vec<CString>, CArray, CArray), String> {
    let program = exec.argv.first().ok_or("empty command")?.clone();
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let group = std::fs::read_to_string("/etc/group").unwrap_or_default();
    let user = user::resolve(exec.user.as_deref(), &passwd, &group)?;

    let mut env = exec.env.clone();
    env.entry("PATH".into()).or_insert_with(|| DEFAULT_PATH.into());
    env.entry("HOME".into()).or_insert_with(|| user.home.clone());
    if let Some(name) = &user.name {
        env.entry("USER".into()).or_insert_with(|| name.clone());
    }
    if let Ok(h) = nix::unistd::gethostname() {
        env.entry("HOSTNAME".into()).or_insert_with(|| h.to_string_lossy().into_owned());
    }

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

    let filters = seccomp::build_filters()?;
    creds::drop_to(&user, &creds::KEPT)?;
    creds::no_new_privs()?;
    // Every descriptor but stdio closes on exec (the report pipe already is close-on-exec).
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets flags.
    unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) };
    seccomp::apply(&filters)?;
    Ok((candidates, argv, envp))
}
