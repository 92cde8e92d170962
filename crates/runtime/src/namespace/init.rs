//! `strata _init`: the helper that becomes a sandbox's pid 1.
//!
//! Protocol with [`super::NamespaceRuntime::start`]: the config arrives as JSON
//! on stdin; status lines ([`InitReport`]) go to stdout. The outer process joins
//! the cgroup, unshares the namespaces and forks; the child is pid 1 of the new
//! pid namespace, builds the root filesystem, reports `ready`, closes every
//! inherited descriptor and then only reaps zombies and relays stop requests.

use std::io::{Read, Write};
use std::path::PathBuf;

use nix::sched::{unshare, CloneFlags};
use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};
use serde::{Deserialize, Serialize};

use super::{creds, mounts};
use crate::spec::SandboxSpec;

/// What `_init` receives on stdin.
#[derive(Debug, Serialize, Deserialize)]
pub struct InitConfig {
    /// The sandbox.
    pub spec: SandboxSpec,
    /// Cgroup files to write "0" to (join) before unsharing.
    pub cgroup_join_files: Vec<PathBuf>,
    /// Seconds init waits after relaying SIGTERM before it exits (killing the rest).
    pub stop_grace_secs: u64,
}

/// Status lines `_init` writes on stdout.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum InitReport {
    /// Host pid of the sandbox's pid 1.
    Pid {
        /// The pid.
        pid: i32,
    },
    /// The root filesystem is ready.
    Ready,
    /// Setup failed.
    Error {
        /// Why.
        message: String,
    },
}

fn report(r: &InitReport) {
    let mut line = serde_json::to_vec(r).expect("InitReport serializes");
    line.push(b'\n');
    let _ = std::io::stdout().write_all(&line);
    let _ = std::io::stdout().flush();
}

fn fail(message: String) -> ! {
    eprintln!("strata init: {message}");
    report(&InitReport::Error { message });
    std::process::exit(1)
}

/// Entry point of `strata _init`. Never returns.
pub fn main() -> ! {
    let mut input = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut input) {
        fail(format!("read config: {e}"));
    }
    let cfg: InitConfig = serde_json::from_str(&input).unwrap_or_else(|e| fail(format!("parse config: {e}")));
    // "0" moves the writing (single-threaded) process itself; see SandboxCgroup::join_files.
    for f in &cfg.cgroup_join_files {
        if let Err(e) = std::fs::write(f, "0") {
            fail(format!("join cgroup {}: {e}", f.display()));
        }
    }
    let flags = CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWUTS
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWNET
        | CloneFlags::CLONE_NEWPID
        | CloneFlags::CLONE_NEWCGROUP;
    if let Err(e) = unshare(flags) {
        fail(format!("unshare namespaces: {e}"));
    }
    // SAFETY: this process is single-threaded (a fresh exec of the strata binary
    // that started no threads), so the child may run arbitrary code after fork.
    match unsafe { fork() } {
        Err(e) => fail(format!("fork: {e}")),
        Ok(ForkResult::Parent { child }) => {
            report(&InitReport::Pid { pid: child.as_raw() });
            std::process::exit(0)
        }
        Ok(ForkResult::Child) => pid1(cfg),
    }
}

fn pid1(cfg: InitConfig) -> ! {
    let spec = &cfg.spec;
    let setup = || -> Result<(), String> {
        mounts::build_rootfs(&spec.lower_dirs, &spec.upper_dir, &spec.work_dir, &spec.rootfs_dir)?;
        nix::unistd::sethostname(&spec.hostname).map_err(|e| format!("sethostname: {e}"))?;
        mounts::loopback_up()?;
        mounts::pivot_into(&spec.rootfs_dir)?;
        mounts::write_identity_files(&spec.hostname, &spec.id, &spec.machine_id, spec.fork_generation)?;
        Ok(())
    };
    if let Err(message) = setup() {
        fail(message);
    }
    report(&InitReport::Ready);
    detach_stdio();
    if let Err(e) = nix::unistd::setsid() {
        eprintln!("strata init: setsid: {e}");
    }
    // Sandbox processes (which lack CAP_SYS_PTRACE) may not ptrace init or open /proc/1/exe.
    // SAFETY: prctl(PR_SET_DUMPABLE) takes integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    let root = super::user::ResolvedUser { uid: 0, gid: 0, groups: vec![0], home: "/".into(), name: None };
    let _ = creds::drop_to(&root, &[caps::Capability::CAP_KILL]);
    let _ = creds::no_new_privs();
    reap_loop(cfg.stop_grace_secs)
}

/// Closes every inherited descriptor and points 0, 1, 2 at the sandbox's /dev/null,
/// so nothing of the host stays open inside (which would also block checkpointing).
fn detach_stdio() {
    // SAFETY: close_range only closes descriptors; none is in use by Rust objects here
    // (stdin was read to the end, stdout/stderr are re-opened below).
    unsafe { libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32) };
    // SAFETY: open returns the lowest free descriptor (0 after close_range); dup2 copies it to 1 and 2.
    unsafe {
        let fd = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if fd == 0 {
            libc::dup2(0, 1);
            libc::dup2(0, 2);
        }
    }
}

/// Pid 1's life: reap every child; on SIGTERM/SIGINT relay SIGTERM to all
/// processes of the namespace and exit once they are gone or `grace` has passed
/// (the kernel then kills whatever is left).
fn reap_loop(grace_secs: u64) -> ! {
    let mut set = SigSet::empty();
    for s in [Signal::SIGCHLD, Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP, Signal::SIGALRM] {
        set.add(s);
    }
    let _ = set.thread_block();
    let mut stopping = false;
    loop {
        // While stopping, poll: processes started by `strata exec` are not init's
        // children, so their exit sends no SIGCHLD here.
        let timeout = stopping.then_some(std::time::Duration::from_millis(50));
        let sig = wait_signal(&set, timeout);
        match sig {
            Some(Signal::SIGTERM | Signal::SIGINT) if !stopping => {
                stopping = true;
                let _ = kill(Pid::from_raw(-1), Signal::SIGTERM);
                // SAFETY: alarm() only arms a timer.
                unsafe { libc::alarm(grace_secs.clamp(1, 3600) as u32) };
            }
            Some(Signal::SIGALRM) if stopping => std::process::exit(0),
            _ => {}
        }
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG | WaitPidFlag::__WALL)) {
                Ok(WaitStatus::StillAlive) => break,
                Ok(_) => continue,
                Err(nix::errno::Errno::ECHILD) => {
                    if stopping && no_other_processes() {
                        std::process::exit(0);
                    }
                    break;
                }
                Err(_) => break,
            }
        }
        if stopping && no_other_processes() {
            std::process::exit(0);
        }
    }
}

/// Waits for one of `set` (blocked), up to `timeout`.
fn wait_signal(set: &SigSet, timeout: Option<std::time::Duration>) -> Option<Signal> {
    let Some(t) = timeout else { return set.wait().ok() };
    let ts = libc::timespec { tv_sec: t.as_secs() as libc::time_t, tv_nsec: t.subsec_nanos() as libc::c_long };
    // SAFETY: `set` is a valid sigset_t, the info pointer may be null, `ts` outlives the call.
    let r = unsafe { libc::sigtimedwait(set.as_ref(), std::ptr::null_mut(), &ts) };
    if r > 0 {
        Signal::try_from(r).ok()
    } else {
        None
    }
}

/// True when pid 1 is the only process left in its pid namespace.
fn no_other_processes() -> bool {
    match std::fs::read_dir("/proc") {
        Ok(rd) => !rd.filter_map(Result::ok).any(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()).is_some_and(|p| p != 1)),
        Err(_) => true,
    }
}
