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
    super::mounts::loopback_up().map_err(|e| e.to_string())?;
    let new = std::fs::File::open("/proc/self/ns/net").map_err(|e| format!("open the new /proc/self/ns/net: {e}"))?;
    setns(&current, CloneFlags::CLONE_NEWNET).map_err(|e| format!("return to the daemon's network namespace: {e}"))?;
    let fd = new.into_raw_fd();
    // SAFETY: F_SETFD on the descriptor just taken from `new`; it must survive the exec of criu.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } < 0 {
        return Err(format!("clear FD_CLOEXEC: {}", std::io::Error::last_os_error()));
    }
    Ok(fd)
}

/// An inheritable descriptor of the namespace the daemon prepared at `path`.
fn prepared_network_namespace(path: &std::path::Path) -> Result<RawFd, String> {
    let f = std::fs::File::open(path).map_err(|e| format!("open network namespace {}: {e}", path.display()))?;
    let fd = f.into_raw_fd();
    // SAFETY: F_SETFD on the descriptor just taken from `f`; it must survive the exec of criu.
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
    let netns_fd = cfg.external_netns.then(|| match &cfg.netns_path {
        Some(p) => prepared_network_namespace(p).unwrap_or_else(|e| fail(e)),
        None => new_network_namespace().unwrap_or_else(|e| fail(e)),
    });
    if let Err(e) = unshare(CloneFlags::CLONE_NEWNS) {
        fail(format!("unshare mount namespace: {e}"));
    }
    if let Err(e) = mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>) {
        fail(format!("make / private: {e}"));
    }
    if let Err(e) = std::fs::create_dir_all(&cfg.rootfs_dir) {
        fail(format!("create {}: {e}", cfg.rootfs_dir.display()));
    }
    if let Err(e) = super::mounts::mount_overlay(&cfg.lower_dirs, &cfg.upper_dir, &cfg.work_dir, &cfg.rootfs_dir) {
        fail(format!("mount the overlay root: {e}"));
    }
    if cfg.foreign_root {
        if let Err(e) = super::mounts::ensure_identity_mountpoints(&cfg.rootfs_dir) {
            fail(format!("mount points in the restored root: {e}"));
        }
    }
    if let Some(dir) = &cfg.secrets_mount {
        // The values come on stdin (never in the environment or on disk).
        let mut raw = Vec::new();
        if let Err(e) = std::io::Read::read_to_end(&mut std::io::stdin(), &mut raw) {
            fail(format!("read secrets: {e}"));
        }
        let secrets: Vec<crate::spec::SecretFile> =
            serde_json::from_slice(&raw).unwrap_or_else(|e| fail(format!("parse secrets: {e}")));
        drop(raw);
        if let Err(e) = std::fs::create_dir_all(dir) {
            fail(format!("create {}: {e}", dir.display()));
        }
        let passwd = read_in_root(&cfg.rootfs_dir, "etc/passwd");
        let group = read_in_root(&cfg.rootfs_dir, "etc/group");
        let owner = super::mounts::secrets_owner(cfg.secrets_owner.as_deref(), &passwd, &group);
        if let Err(e) = super::mounts::fill_secrets(dir, &secrets, owner) {
            fail(e.to_string());
        }
    }
    // Nothing of the config pipe reaches CRIU.
    // SAFETY: open returns a new descriptor; dup2 onto 0 and close of the original are plain fd operations.
    unsafe {
        let fd = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd >= 0 {
            libc::dup2(fd, 0);
            libc::close(fd);
        }
    }
    let _ = nix::unistd::chdir("/");
    let err = std::process::Command::new(&cfg.criu)
        .env_clear()
        .env("PATH", super::criu::PATH)
        .args(restore_args(&cfg, netns_fd))
        .exec();
    fail(format!("exec {}: {err}", cfg.criu.display()))
}

/// Reads `rel` inside `root` as the sandbox would see it (symlinks resolved
/// within `root`, never to host files: `RESOLVE_IN_ROOT`), at most 1 MiB of it,
/// and only when it is a regular file (a device node or FIFO planted there is
/// never opened). Empty when it cannot be read.
fn read_in_root(root: &std::path::Path, rel: &str) -> String {
    use crate::openat2::{open_regular, RESOLVE_IN_ROOT, RESOLVE_NO_MAGICLINKS};
    let Ok(root_fd) = std::fs::File::open(root) else { return String::new() };
    let Ok(mut f) = open_regular(
        std::os::fd::AsRawFd::as_raw_fd(&root_fd),
        rel,
        libc::O_RDONLY | libc::O_NONBLOCK,
        RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS,
    ) else {
        return String::new();
    };
    let mut s = String::new();
    let _ = std::io::Read::read_to_string(&mut std::io::Read::take(&mut f, 1 << 20), &mut s);
    s
}
