//! `strata-init _enter`: runs one process inside a running sandbox. The daemon
//! spawns it from the host (the static binary starts in a fraction of the time
//! the strata binary takes).
//!
//! Like `nsenter`: join the cgroup, `setns` into init's namespaces and fork
//! twice, so that the process's parent inside the sandbox is the sandbox's pid 1
//! (the whole tree can then be dumped for standby). The inner child executes
//! `strata-init _shim` from inside the sandbox ([`crate::SELF_PATH`]),
//! which forks the process, resolves the user against the sandbox's own
//! /etc/passwd, drops capabilities, sets no_new_privs, installs the seccomp
//! filter, execs, and reports on the descriptor named by `STRATA_REPORT_FD`
//! ([`ExecReport`] JSON lines) until the process ends.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd};
use std::path::PathBuf;

use nix::sched::{setns, CloneFlags};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, ForkResult};
use serde::{Deserialize, Serialize};
pub use crate::exec::REPORT_FD_ENV;
use crate::exec::{die, ExecSpec, Reporter, SPEC_ENV};

/// Environment variable carrying the [`EnterConfig`] JSON.
pub const CONFIG_ENV: &str = "STRATA_ENTER_CONFIG";

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

/// Entry point of `strata _enter`. Never returns.
pub fn main() -> ! {
    let mut rep = Reporter::from_env();
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
    // Outer (host) -> A (inside the pid namespace) -> B: A exits at once, so B is
    // reparented to the sandbox's pid 1 and the whole process tree lies inside
    // the sandbox (CRIU can dump it for standby). B re-executes as the `_shim`
    // seen from inside the sandbox, which runs the process and reports its exit.
    // B waits until the outer helper has reaped A, so that the sandbox never
    // sees A as a zombie next to the process.
    let (go_r, go_w) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
        Ok(p) => p,
        Err(e) => die(&mut rep, format!("pipe: {e}")),
    };
    // SAFETY: single-threaded process (fresh exec, no threads started), so the
    // child may allocate and run arbitrary code before exec.
    match unsafe { fork() } {
        Err(e) => die(&mut rep, format!("fork: {e}")),
        Ok(ForkResult::Child) => {
            drop(go_w);
            // SAFETY: still single-threaded.
            match unsafe { fork() } {
                Err(e) => die(&mut rep, format!("fork: {e}")),
                Ok(ForkResult::Child) => {
                    let mut byte = [0u8; 1];
                    // EOF (the outer helper died) also lets B go on.
                    let _ = nix::unistd::read(go_r.as_raw_fd(), &mut byte);
                    drop(go_r);
                    exec_shim(&cfg.exec, rep)
                }
                Ok(ForkResult::Parent { .. }) => std::process::exit(0),
            }
        }
        Ok(ForkResult::Parent { child }) => {
            drop(go_r);
            let code = loop {
                match waitpid(child, None) {
                    Ok(WaitStatus::Exited(_, code)) => break code,
                    Ok(WaitStatus::Signaled(..)) => break 127,
                    Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
                    Err(e) => die(&mut rep, format!("wait: {e}")),
                }
            };
            let _ = nix::unistd::write(&go_w, b"g");
            std::process::exit(code)
        }
    }
}

/// B: becomes the shim by executing the helper binary bind-mounted inside the
/// sandbox (its mount point cannot be changed from inside: sandbox processes lack
/// CAP_SYS_ADMIN). The report descriptor and stdio are handed over.
fn exec_shim(exec: &ExecSpec, mut rep: Reporter) -> ! {
    if let Err(e) = nix::unistd::setsid() {
        die(&mut rep, format!("setsid: {e}"));
    }
    let fd = rep.0.as_ref().map(|f| f.as_raw_fd());
    if let Some(fd) = fd {
        // SAFETY: F_SETFD on our own descriptor: it must survive the exec.
        unsafe { libc::fcntl(fd, libc::F_SETFD, 0) };
    }
    let path = CString::new(crate::SELF_PATH).expect("no NUL");
    let argv = [c"strata".to_owned(), c"_shim".to_owned()];
    let json = serde_json::to_string(exec).expect("ExecSpec serializes");
    let mut env = vec![CString::new(format!("{SPEC_ENV}={json}")).unwrap_or_else(|_| die(&mut rep, "command or environment contains a NUL byte".into()))];
    if let Some(fd) = fd {
        env.push(CString::new(format!("{REPORT_FD_ENV}={fd}")).expect("digits"));
    }
    let err = nix::unistd::execve(&path, &argv, &env).unwrap_err();
    die(&mut rep, format!("exec the sandbox's process helper {}: {err} (was the sandbox started by an older strata? restart it)", crate::SELF_PATH))
}

