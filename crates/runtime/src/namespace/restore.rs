//! `strata _restore`: joins the sandbox's cgroup, mounts its overlay root in a
//! private mount namespace and becomes `criu restore` (see [`super::criu`]).
//! The mount disappears with this helper's namespace once CRIU has built the
//! restored sandbox's own mount tree. Images made with an external network
//! namespace get a new one here, with its loopback up.

use std::os::fd::{IntoRawFd, RawFd};
use std::os::unix::process::CommandExt;

use nix::mount::{mount, MsFlags};
use nix::sched::{setns, unshare, CloneFlags};

use super::criu::{restore_args, RestoreConfig, RESTORE_CONFIG_ENV};

/// Makes a new network namespace with its loopback up and returns an inheritable
/// descriptor of it, staying in the current one (CRIU moves the restored tree in).
fn new_network_namespace() -> Result<RawFd, String> {
    let current = std::fs::File::open("/proc/self/ns/net").map_err(|e| format!("open /proc/self/ns/net: {e}"))?;
    unshare(CloneFlags::CLONE_NEWNET).map_err(|e| format!("unshare network namespace: {e}"))?;
    super::mounts::loopback_up()?;
    let new = std::fs::File::open("/proc/self/ns/net").map_err(|e| format!("open the new /proc/self/ns/net: {e}"))?;
    setns(&current, CloneFlags::CLONE_NEWNET).map_err(|e| format!("return to the daemon's network namespace: {e}"))?;
    let fd = new.into_raw_fd();
    // SAFETY: F_SETFD on the descriptor just taken from `new`; it must survive the exec of criu.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } < 0 {
        return Err(format!("clear FD_CLOEXEC: {}", std::io::Error::last_os_error()));
    }
    Ok(fd)
}

fn fail(message: String) -> ! {
    eprintln!("strata restore: {message}");
    std::process::exit(1)
}

/// Entry point of `strata _restore`. Never returns.
pub fn main() -> ! {
    let raw = std::env::var(RESTORE_CONFIG_ENV).unwrap_or_else(|_| fail(format!("{RESTORE_CONFIG_ENV} is not set")));
    let cfg: RestoreConfig = serde_json::from_str(&raw).unwrap_or_else(|e| fail(format!("parse config: {e}")));
    for f in &cfg.cgroup_join_files {
        if let Err(e) = std::fs::write(f, "0") {
            fail(format!("join cgroup {}: {e}", f.display()));
        }
    }
    let netns_fd = cfg.external_netns.then(|| new_network_namespace().unwrap_or_else(|e| fail(e)));
    if let Err(e) = unshare(CloneFlags::CLONE_NEWNS) {
        fail(format!("unshare mount namespace: {e}"));
    }
    if let Err(e) = mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>) {
        fail(format!("make / private: {e}"));
    }
    let (chdir, opts) = super::mounts::overlay_options(&cfg.lower_dirs, &cfg.upper_dir, &cfg.work_dir).unwrap_or_else(|e| fail(e));
    if let Some(d) = &chdir {
        if let Err(e) = nix::unistd::chdir(d) {
            fail(format!("chdir {}: {e}", d.display()));
        }
    }
    if let Err(e) = std::fs::create_dir_all(&cfg.rootfs_dir) {
        fail(format!("create {}: {e}", cfg.rootfs_dir.display()));
    }
    if let Err(e) = mount(Some("overlay"), &cfg.rootfs_dir, Some("overlay"), MsFlags::empty(), Some(opts.as_str())) {
        fail(format!("mount the overlay root on {}: {e}", cfg.rootfs_dir.display()));
    }
    let _ = nix::unistd::chdir("/");
    let err = std::process::Command::new(&cfg.criu).env_clear().env("PATH", super::criu::PATH).args(restore_args(&cfg, netns_fd)).exec();
    fail(format!("exec {}: {err}", cfg.criu.display()))
}
