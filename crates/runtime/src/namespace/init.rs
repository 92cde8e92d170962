//! `strata _init`: the helper that becomes a sandbox's pid 1.
//!
//! Protocol with [`super::NamespaceRuntime::start`]: the config arrives as JSON
//! on stdin; status lines ([`InitReport`]) go to stdout. The outer process joins
//! the cgroup, unshares the namespaces and forks; the child is pid 1 of the new
//! pid namespace, builds the root filesystem, reports `ready`, closes every
//! inherited descriptor and then only reaps zombies and relays stop requests.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::PathBuf;

use nix::sched::{unshare, CloneFlags};
use nix::unistd::{fork, ForkResult};
use serde::{Deserialize, Serialize};

use super::mounts;
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
    /// The static `strata-init` binary, bind-mounted at [`SELF_PATH`].
    pub init_binary: PathBuf,
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
        /// The image's own tree made it impossible (the caller's input), not the host.
        #[serde(default)]
        image: bool,
    },
}

fn report(r: &InitReport) {
    let mut line = serde_json::to_vec(r).expect("InitReport serializes");
    line.push(b'\n');
    let _ = std::io::stdout().write_all(&line);
    let _ = std::io::stdout().flush();
}

fn fail(message: String) -> ! {
    fail_with(mounts::SetupError::Host(message))
}

fn fail_with(e: mounts::SetupError) -> ! {
    eprintln!("strata init: {e}");
    let image = matches!(e, mounts::SetupError::Image(_));
    report(&InitReport::Error { message: e.to_string(), image });
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
    let mut flags = CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWUTS
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWPID
        | CloneFlags::CLONE_NEWCGROUP;
    match &cfg.spec.netns_path {
        // The daemon's prepared namespace (egress): join it.
        Some(p) => {
            let ns =
                std::fs::File::open(p).unwrap_or_else(|e| fail(format!("open network namespace {}: {e}", p.display())));
            if let Err(e) = nix::sched::setns(&ns, CloneFlags::CLONE_NEWNET) {
                fail(format!("join network namespace {}: {e}", p.display()));
            }
        }
        None => flags |= CloneFlags::CLONE_NEWNET,
    }
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
    // The helper binary, opened before pivot_root hides the host: pid 1 re-executes
    // it from inside the sandbox (see [`SELF_PATH`]).
    let setup = || -> mounts::SetupResult<std::os::fd::OwnedFd> {
        let helper = mounts::clone_helper_mount(&cfg.init_binary)?;
        mounts::build_rootfs(
            &spec.lower_dirs,
            &spec.upper_dir,
            &spec.work_dir,
            &spec.rootfs_dir,
            spec.limits.memory_bytes,
        )?;
        nix::unistd::sethostname(&spec.hostname).map_err(|e| format!("sethostname: {e}"))?;
        mounts::loopback_up()?;
        mounts::pivot_into(&spec.rootfs_dir)?;
        mounts::write_identity_files(&spec.hostname, &spec.id, &spec.machine_id, spec.fork_generation)?;
        if let Some(conf) = &spec.resolv_conf {
            mounts::bind_resolv_conf(conf)?;
        }
        mounts::mount_secrets(&spec.secrets, spec.secrets_owner.as_deref())?;
        mounts::attach_helper(&helper, SELF_PATH)?;
        Ok(helper)
    };
    let helper = setup().unwrap_or_else(|e| fail_with(e));
    report(&InitReport::Ready);
    detach_stdio(helper.as_raw_fd());
    if let Err(e) = nix::unistd::setsid() {
        eprintln!("strata init: setsid: {e}");
    }
    // Pid 1 continues as strata-init seen from inside the sandbox, so that every
    // mapping of the sandbox's processes lies in its own mount tree (which is
    // what lets CRIU dump the tree for standby). It executes the helper mount
    // itself (no path is resolved), which is also the binary every exec helper
    // later executes through `/proc/<pid 1>/exe`.
    let argv = [
        c"strata".to_owned(),
        c"_pid1".to_owned(),
        std::ffi::CString::new(cfg.stop_grace_secs.to_string()).expect("digits"),
    ];
    let err = strata_init::enter::exec_fd(&helper, &argv, &[]);
    eprintln!("strata init: exec {SELF_PATH}: {err}");
    std::process::exit(1)
}

pub use strata_init::SELF_PATH;

/// Closes every inherited descriptor but `keep` (close-on-exec; at least 3:
/// stdio was open when it was made) and points 0, 1, 2 at the sandbox's
/// /dev/null, so nothing of the host stays open inside (which would also block
/// checkpointing).
fn detach_stdio(keep: i32) {
    if keep < 3 {
        fail(format!("the helper descriptor {keep} collides with stdio"));
    }
    // SAFETY: close_range only closes descriptors; none is in use by Rust objects here
    // (stdin was read to the end, stdout/stderr are replaced below; `keep` is skipped).
    unsafe {
        if keep > 3 {
            libc::syscall(libc::SYS_close_range, 3u32, (keep - 1) as u32, 0u32);
        }
        libc::syscall(libc::SYS_close_range, (keep + 1) as u32, u32::MAX, 0u32);
    }
    // SAFETY: open returns a new descriptor; dup2 onto 0-2 replaces the host's stdio.
    unsafe {
        let fd = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        if fd >= 0 {
            for target in 0..3 {
                libc::dup2(fd, target);
            }
            libc::close(fd);
        }
    }
}
