//! `strata _restore`: joins the sandbox's cgroup, mounts its overlay root in a
//! private mount namespace and becomes `criu restore` (see [`super::criu`]).
//! The mount disappears with this helper's namespace once CRIU has built the
//! restored sandbox's own mount tree. Images made with an external network
//! namespace get a new one here, with its loopback up.

use std::os::fd::{AsFd, IntoRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;

use nix::mount::MsFlags;
use nix::sched::CloneFlags;

use super::criu::{restore_args, RestoreConfig, RESTORE_CONFIG_ENV};
use crate::spec::SecretFile;
use crate::sys::{LinuxSys, Sys};

/// Makes a new network namespace with its loopback up and returns an inheritable
/// descriptor of it, staying in the current one (CRIU moves the restored tree in).
pub fn new_network_namespace(sys: &dyn Sys) -> Result<RawFd, String> {
    let current = std::fs::File::open("/proc/self/ns/net").map_err(|e| format!("open /proc/self/ns/net: {e}"))?;
    sys.unshare(CloneFlags::CLONE_NEWNET).map_err(|e| format!("unshare network namespace: {e}"))?;
    super::mounts::loopback_up(sys).map_err(|e| e.to_string())?;
    let new = std::fs::File::open("/proc/self/ns/net").map_err(|e| format!("open the new /proc/self/ns/net: {e}"))?;
    sys.setns(current.as_fd(), CloneFlags::CLONE_NEWNET)
        .map_err(|e| format!("return to the daemon's network namespace: {e}"))?;
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
    let sys = LinuxSys;
    let netns_fd = cfg.external_netns.then(|| match &cfg.netns_path {
        Some(p) => prepared_network_namespace(p).unwrap_or_else(|e| fail(e)),
        None => new_network_namespace(&sys).unwrap_or_else(|e| fail(e)),
    });
    // The secrets' values come on stdin (never in the environment or on disk);
    // read once the mount namespace is private, as before.
    let read_secrets = || -> Result<Vec<SecretFile>, String> {
        let mut raw = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut raw).map_err(|e| format!("read secrets: {e}"))?;
        serde_json::from_slice(&raw).map_err(|e| format!("parse secrets: {e}"))
    };
    if let Err(e) = prepare_root(&sys, &cfg, read_secrets) {
        fail(e);
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
    if let Some(fd) = cfg.lazy_ready_fd {
        // SAFETY: the daemon passed this descriptor (the fill daemon's status
        // pipe) for this helper alone; it is owned and closed here, before CRIU runs.
        let ready = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        if let Err(e) = super::lazy::wait_listening(ready.as_fd()) {
            fail(e);
        }
    }
    let _ = nix::unistd::chdir("/");
    let hook = super::criu::HookConfig { link: cfg.link.clone() };
    let err = std::process::Command::new(&cfg.criu)
        .env_clear()
        .env("PATH", super::criu::PATH)
        .env(super::criu::HOOK_CONFIG_ENV, serde_json::to_string(&hook).expect("HookConfig serializes"))
        .args(restore_args(&cfg, netns_fd))
        .exec();
    fail(format!("exec {}: {err}", cfg.criu.display()))
}

/// Where the restore of a sandbox in a user namespace mounts a tmpfs of its
/// private mount namespace for what CRIU's restored task must open as the
/// sandbox's root (the secrets' mount): outside the state directory, which is
/// closed to the sandbox's ids. The host sees only the empty directory.
pub const SCRATCH: &str = "/run/strata-restore";

/// Prepares what CRIU restores onto, in a new private mount namespace: the
/// overlay root at `cfg.rootfs_dir` (with the identity mount points of a
/// foreign root) and, when the sandbox has secrets, a tmpfs at
/// `cfg.secrets_mount` filled with the ones `secrets` reads. Errors are the
/// messages `_restore` exits with.
pub fn prepare_root(
    sys: &dyn Sys,
    cfg: &RestoreConfig,
    secrets: impl FnOnce() -> Result<Vec<SecretFile>, String>,
) -> Result<(), String> {
    sys.unshare(CloneFlags::CLONE_NEWNS).map_err(|e| format!("unshare mount namespace: {e}"))?;
    sys.mount(None, Path::new("/"), None, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None)
        .map_err(|e| format!("make / private: {e}"))?;
    std::fs::create_dir_all(&cfg.rootfs_dir).map_err(|e| format!("create {}: {e}", cfg.rootfs_dir.display()))?;
    // A sandbox in a user namespace: its layers idmapped through a namespace
    // with its map (only for the mount: CRIU makes the sandbox's own), and
    // everything written from here on (mount points, secrets) written as its root.
    let userns = match cfg.userns {
        Some(u) => Some((
            u,
            sys.user_namespace(u.host_base, u.size).map_err(|e| {
                format!("create a user namespace for the id maps ({} ids from host id {}): {e}", u.size, u.host_base)
            })?,
        )),
        None => None,
    };
    let idmap = userns.as_ref().map(|(u, fd)| super::mounts::Idmap { userns: fd.as_fd(), host_root: u.host_base });
    if let Some(m) = idmap {
        sys.set_fs_ids(m.host_root).map_err(|e| format!("set the file-system ids to the sandbox root's: {e}"))?;
    }
    super::mounts::mount_overlay(sys, &cfg.lower_dirs, &cfg.upper_dir, &cfg.work_dir, &cfg.rootfs_dir, idmap)
        .map_err(|e| format!("mount the overlay root: {e}"))?;
    if cfg.foreign_root {
        super::mounts::ensure_identity_mountpoints(&cfg.rootfs_dir)
            .map_err(|e| format!("mount points in the restored root: {e}"))?;
    }
    if let Some(dir) = &cfg.secrets_mount {
        let secrets = secrets()?;
        if dir.starts_with(SCRATCH) {
            // A tmpfs of this helper's mount namespace only (the host sees an empty directory).
            let scratch = Path::new(SCRATCH);
            std::fs::create_dir_all(scratch).map_err(|e| format!("create {SCRATCH}: {e}"))?;
            let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
            sys.mount(Some(Path::new("tmpfs")), scratch, Some("tmpfs"), flags, Some("mode=0755,size=1m"))
                .map_err(|e| format!("mount a tmpfs on {SCRATCH}: {e}"))?;
        }
        std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let passwd = read_in_root(&cfg.rootfs_dir, "etc/passwd");
        let group = read_in_root(&cfg.rootfs_dir, "etc/group");
        let (uid, gid) = super::mounts::secrets_owner(cfg.secrets_owner.as_deref(), &passwd, &group);
        // Mounted here, on the host's side: the owner in host ids.
        let base = cfg.userns.map_or(0, |u| u.host_base);
        let owner = (base.saturating_add(uid), base.saturating_add(gid));
        super::mounts::fill_secrets(sys, dir, &secrets, owner).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Entry point of `strata _restore_hook`, the action script CRIU runs during
/// a restore of images with an empty network namespace
/// ([`super::criu::EMPTY_NETNS_MARKER`]): at `setup-namespaces` (the
/// namespaces exist, no process is restored yet) it brings the restored
/// namespace's loopback up and plugs the sandbox's link in
/// ([`super::criu::HookConfig`]); every other action is a no-op. A non-zero
/// exit fails the restore. Never returns.
pub fn hook_main() -> ! {
    let action = std::env::var("CRTOOLS_SCRIPT_ACTION").unwrap_or_default();
    if action != "setup-namespaces" {
        std::process::exit(0);
    }
    let run = || -> Result<(), String> {
        let raw = std::env::var(super::criu::HOOK_CONFIG_ENV)
            .map_err(|_| format!("{} is not set", super::criu::HOOK_CONFIG_ENV))?;
        let cfg: super::criu::HookConfig = serde_json::from_str(&raw).map_err(|e| format!("parse config: {e}"))?;
        let pid: i32 = std::env::var("CRTOOLS_INIT_PID")
            .ok()
            .and_then(|p| p.parse().ok())
            .ok_or("CRIU gave no CRTOOLS_INIT_PID")?;
        let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))
            .map_err(|e| format!("open the network namespace of pid {pid}: {e}"))?;
        // This helper is single-threaded: it may move itself, and back.
        let own = std::fs::File::open("/proc/self/ns/net").map_err(|e| format!("open /proc/self/ns/net: {e}"))?;
        let sys = LinuxSys;
        sys.setns(ns.as_fd(), CloneFlags::CLONE_NEWNET)
            .map_err(|e| format!("join the restored network namespace: {e}"))?;
        super::mounts::loopback_up(&sys).map_err(|e| e.to_string())?;
        sys.setns(own.as_fd(), CloneFlags::CLONE_NEWNET)
            .map_err(|e| format!("return to the host's network namespace: {e}"))?;
        if let Some(link) = &cfg.link {
            super::plug_link(pid, link).map_err(|e| e.to_string())?;
        }
        Ok(())
    };
    match run() {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("strata restore hook: {e}");
            std::process::exit(1)
        }
    }
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

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::path::PathBuf;

    use nix::errno::Errno;

    use super::*;
    use crate::sys::{RecordingSys, SysCall};

    fn config(dir: &Path) -> RestoreConfig {
        let d = |n: &str| {
            let p = dir.join(n);
            fs::create_dir_all(&p).unwrap();
            p
        };
        RestoreConfig {
            lower_dirs: vec![d("l1")],
            upper_dir: d("up"),
            work_dir: d("wk"),
            rootfs_dir: dir.join("root"),
            cgroup_join_files: vec![],
            cgroup_roots: vec![],
            images_dir: d("images"),
            criu_work_dir: None,
            tcp_closed: false,
            foreign_root: false,
            helper: PathBuf::from("/usr/lib/strata/strata-init"),
            inherit: vec![],
            pidfile: dir.join("restored.pid"),
            criu: PathBuf::from("/usr/local/sbin/criu"),
            external_netns: false,
            netns_path: None,
            nftables_lock: false,
            secrets_mount: None,
            secrets_owner: None,
            userns: None,
            empty_netns: false,
            hook: None,
            link: None,
            lazy: false,
            lazy_ready_fd: None,
        }
    }

    #[test]
    fn the_restore_root_is_an_overlay_in_a_private_namespace() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(dir.path());
        cfg.foreign_root = true;
        fs::create_dir_all(cfg.upper_dir.join("etc")).unwrap();
        cfg.secrets_mount = Some(dir.path().join("secrets.mnt"));
        let secrets = || Ok(vec![SecretFile { name: "A".into(), data: b"1".to_vec() }]);
        let sys = RecordingSys::new();
        prepare_root(&sys, &cfg, secrets).unwrap();
        let got: Vec<String> = sys.calls().iter().map(|c| c.describe(dir.path())).collect();
        assert_eq!(got[..2], ["unshare NEWNS", "mount - / - PRIVATE|REC -"]);
        assert!(got[2].starts_with("mount overlay $ROOT/root overlay - lowerdir=/proc/self/fd/"), "{got:?}");
        let opts = "mode=0500,uid=0,gid=0,size=12288,nr_inodes=17";
        assert_eq!(
            got[3..],
            [
                format!("mount tmpfs $ROOT/secrets.mnt tmpfs NODEV|NOEXEC|NOSUID {opts}"),
                "fchown $ROOT/secrets.mnt/A 0:0".into(),
                format!("mount - $ROOT/secrets.mnt - NODEV|NOEXEC|NOSUID|RDONLY|REMOUNT {opts}"),
            ]
        );
        // A foreign root gets the identity mount points (in the real tree: nothing is mounted
        // here, so they land in the root directory itself).
        assert!(cfg.rootfs_dir.join("run/strata").is_dir());
        // Secrets are read only when there is somewhere to put them.
        let cfg = config(dir.path());
        let sys = RecordingSys::new();
        prepare_root(&sys, &cfg, || panic!("no secrets to read")).unwrap();
        assert_eq!(sys.names(), ["unshare", "mount", "mount"]);
    }

    #[test]
    fn a_user_namespace_root_is_idmapped_and_written_as_the_sandbox_root() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(dir.path());
        cfg.userns = Some(strata_api::UserNamespace { host_base: 1_000_131_072, size: 65_536 });
        // (The fake mounts nothing: the root's files are the directory's own.)
        fs::create_dir_all(cfg.rootfs_dir.join("etc")).unwrap();
        fs::write(cfg.rootfs_dir.join("etc/passwd"), "root:x:0:0::/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\n")
            .unwrap();
        cfg.secrets_mount = Some(dir.path().join("secrets.mnt"));
        cfg.secrets_owner = Some("app".into());
        let secrets = || Ok(vec![SecretFile { name: "A".into(), data: b"1".to_vec() }]);
        let sys = RecordingSys::new();
        prepare_root(&sys, &cfg, secrets).unwrap();
        let got: Vec<String> = sys.calls().iter().map(|c| c.describe(dir.path())).collect();
        assert_eq!(
            got[..5],
            [
                "unshare NEWNS".to_string(),
                "mount - / - PRIVATE|REC -".into(),
                "user_namespace 1000131072 65536".into(),
                "set_fs_ids 1000131072".into(),
                "open_tree $ROOT/l1 0x80001".into(),
            ]
        );
        assert!(got.iter().any(|l| l.starts_with("mount overlay $ROOT/root overlay")), "{got:#?}");
        // The secrets tmpfs is mounted here, on the host's side: its owner in host ids.
        let tmpfs = got.iter().find(|l| l.starts_with("mount tmpfs $ROOT/secrets.mnt")).unwrap();
        assert!(tmpfs.contains("uid=1000132072,gid=1000132073"), "{tmpfs}");
        assert!(got.contains(&"fchown $ROOT/secrets.mnt/A 1000132072:1000132073".to_string()), "{got:#?}");
    }

    #[test]
    fn restore_setup_failures_carry_their_context() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(dir.path());
        let sys = RecordingSys::new();
        sys.fail_when(|c| c.is_mount_on(Path::new("/")), Errno::EPERM);
        let err = prepare_root(&sys, &cfg, || Ok(vec![])).unwrap_err();
        assert_eq!(err, "make / private: EPERM: Operation not permitted");
        assert_eq!(sys.names(), ["unshare", "mount"]);
        let sys = RecordingSys::new();
        let root = cfg.rootfs_dir.clone();
        sys.fail_when(move |c| c.is_mount_on(&root), Errno::EINVAL);
        let err = prepare_root(&sys, &cfg, || Ok(vec![])).unwrap_err();
        assert_eq!(
            err,
            "mount the overlay root: mount overlay on ".to_string()
                + &format!("{}: EINVAL: Invalid argument", cfg.rootfs_dir.display())
        );
    }

    #[test]
    fn a_new_network_namespace_is_made_then_left() {
        let sys = RecordingSys::new();
        let fd = new_network_namespace(&sys).unwrap();
        // SAFETY: the function handed over this descriptor; it is closed here once.
        drop(unsafe { OwnedFd::from_raw_fd(fd) });
        let calls = sys.calls();
        assert_eq!(sys.names(), ["unshare", "loopback_up", "setns"]);
        assert_eq!(calls[0], SysCall::Unshare { flags: CloneFlags::CLONE_NEWNET });
        let SysCall::Setns { target: Some(ns), nstype } = &calls[2] else { panic!("{calls:?}") };
        assert!(ns.to_string_lossy().starts_with("net:["), "{ns:?}");
        assert_eq!(*nstype, CloneFlags::CLONE_NEWNET);
        // Loopback failing: no way back is needed (the helper exits).
        let sys = RecordingSys::new();
        sys.fail_when(|c| *c == SysCall::LoopbackUp, Errno::EPERM);
        assert_eq!(new_network_namespace(&sys).unwrap_err(), "bring up lo: Operation not permitted (os error 1)");
        assert_eq!(sys.names(), ["unshare", "loopback_up"]);
    }
}
