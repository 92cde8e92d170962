//! `strata _restore`: joins the sandbox's cgroup, mounts its overlay root in a
//! private mount namespace and becomes `criu restore` (see [`super::criu`]).
//! The mount disappears with this helper's namespace once CRIU has built the
//! restored sandbox's own mount tree.

use std::os::unix::process::CommandExt;

use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};

use super::criu::{restore_args, RestoreConfig, RESTORE_CONFIG_ENV};

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
    let err = std::process::Command::new(&cfg.criu).env_clear().env("PATH", super::criu::PATH).args(restore_args(&cfg)).exec();
    fail(format!("exec {}: {err}", cfg.criu.display()))
}
