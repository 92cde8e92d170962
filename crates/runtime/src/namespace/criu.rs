//! Process checkpoint/restore of a sandbox's whole process tree with CRIU
//! (`criu dump` / `criu restore`), used for standby.
//!
//! The tree is everything under the sandbox's pid 1: exec'd processes are
//! reparented to it by their shim (see [`super::enter`]), and pid 1 runs the
//! helper binary from [`super::init::SELF_PATH`], a bind mount CRIU is told to
//! treat as external ([`HELPER_KEY`]). Restore runs in the `_restore` helper
//! ([`super::restore`]), which re-mounts the overlay root in a private mount
//! namespace inside the sandbox's cgroup and then becomes `criu restore`.

use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::RuntimeError;

/// Name under which the helper binary's bind mount is recorded in the images.
pub const HELPER_KEY: &str = "strata-helper";
/// Name under which the secrets tmpfs ([`crate::spec::SECRETS_DIR`]) is
/// recorded in the images: an external mount, so CRIU never dumps its
/// contents (it would otherwise write them into `tmpfs-dev-*.tar.gz`); restore
/// binds a freshly filled tmpfs in its place.
pub const SECRETS_KEY: &str = "strata-secrets";
/// Log files CRIU writes into the images directory.
pub const DUMP_LOG: &str = "criu-dump.log";
/// See [`DUMP_LOG`].
pub const RESTORE_LOG: &str = "criu-restore.log";
/// Where a restore writes the restored pid 1's host pid (in the images directory).
pub const PIDFILE: &str = "restored.pid";

/// The criu binary: `/usr/local/sbin/criu` (what scripts/setup-host.sh builds),
/// else the first `criu` on PATH.
pub fn binary() -> Option<PathBuf> {
    let local = PathBuf::from("/usr/local/sbin/criu");
    if local.is_file() {
        return Some(local);
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path).map(|d| d.join("criu")).find(|p| p.is_file())
}

/// Why processes cannot be dumped on this host (`None`: they can).
pub fn unsupported() -> Option<String> {
    let Some(bin) = binary() else {
        return Some("criu is not installed (scripts/setup-host.sh builds CRIU 4.1.1)".into());
    };
    let out = match Command::new(&bin).arg("--version").output() {
        Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
        Err(e) => return Some(format!("running {}: {e}", bin.display())),
    };
    match crate::probe::parse_criu_version(&out) {
        Some((maj, _)) if maj >= 4 => None,
        Some((maj, min)) => Some(format!(
            "{} is CRIU {maj}.{min}; standby needs CRIU >= 4 (3.x fails on this kernel's vDSO)",
            bin.display()
        )),
        None => Some(format!("cannot tell the version of {}", bin.display())),
    }
}

/// Where CRIU (as built by scripts/setup-host.sh, `RUNDIR`) caches what it probed
/// about the kernel. CRIU keeps that cache only on a tmpfs, so that a reboot drops it.
pub const KDAT_DIR: &str = "/run/strata/criu";

/// Makes [`KDAT_DIR`] a tmpfs when it is not on one (hosts whose /run is a plain
/// directory), so CRIU can keep its kernel probe results instead of redoing them
/// (20-40 ms) on every dump and restore. Returns whether it mounted one.
pub fn prepare_kdat_cache() -> Result<bool, RuntimeError> {
    use nix::mount::{mount, MsFlags};
    use nix::sys::statfs::{statfs, TMPFS_MAGIC};
    std::fs::create_dir_all(KDAT_DIR).map_err(|e| RuntimeError::sys(format!("create {KDAT_DIR}"), e))?;
    let fs = statfs(KDAT_DIR).map_err(|e| RuntimeError::sys(format!("statfs {KDAT_DIR}"), e))?;
    if fs.filesystem_type() == TMPFS_MAGIC {
        return Ok(false);
    }
    mount(
        Some("tmpfs"),
        KDAT_DIR,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("size=1m,mode=0700"),
    )
    .map_err(|e| RuntimeError::sys(format!("mount a tmpfs on {KDAT_DIR}"), e))?;
    Ok(true)
}

/// The last lines of a CRIU log that carry errors, for error messages.
pub fn log_errors(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let errs: Vec<&str> = text.lines().filter(|l| l.contains("Error") || l.contains("error")).collect();
    let pick =
        if errs.is_empty() { text.lines().rev().take(3).collect::<Vec<_>>().into_iter().rev().collect() } else { errs };
    let joined = pick.iter().rev().take(4).rev().cloned().collect::<Vec<_>>().join(" | ");
    if joined.is_empty() {
        format!("see {}", log.display())
    } else {
        format!("{joined} (log: {})", log.display())
    }
}

/// PATH for CRIU, which runs iptables-save/-restore and ip for the sandbox's network namespace.
pub const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Arguments shared by dump and restore.
const COMMON: [&str; 3] = ["--file-locks", "--ext-unix-sk", "-v2"];

/// What a dump does to the processes it dumps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DumpMode {
    /// Standby: the processes end once dumped; established TCP connections
    /// are saved and continue on restore (the network is locked meanwhile).
    Standby,
    /// A checkpoint's copy: the processes keep running (frozen by the caller
    /// through the cgroup at `freezer`, and left frozen); established TCP
    /// connections are saved as closed, since several copies cannot all
    /// continue one connection.
    Copy {
        /// The freezer cgroup directory (`--freeze-cgroup`).
        freezer: PathBuf,
    },
}

/// How an image's TCP connections were saved: the restore must say the same.
pub const TCP_CLOSED_MARKER: &str = "strata-tcp.closed";

/// Key under which the sandbox's network namespace is recorded as external: it
/// is not saved in the images, and a restore gets a fresh one from strata (the
/// sandbox's network is strata's to configure, and CRIU then needs no `ip` or
/// `iptables-restore` runs).
pub const NETNS_KEY: &str = "strata-netns";
/// File a dump leaves in the images directory when the network namespace was
/// external ([`NETNS_KEY`]); images without it carry their namespace.
pub const NETNS_MARKER: &str = "strata-netns.external";

/// File a dump leaves in the images directory when the sandbox ran in a user
/// namespace of its own: its network namespace was recorded as one to make
/// empty (`--empty-ns net`), its host device binds as external mounts.
pub const EMPTY_NETNS_MARKER: &str = "strata-netns.empty";

/// Whether process `pid` runs in a user namespace other than this process's.
pub fn in_user_namespace(pid: i32) -> Result<bool, RuntimeError> {
    use std::os::unix::fs::MetadataExt;
    let stat = |p: &str| {
        std::fs::metadata(p).map(|m| (m.dev(), m.ino())).map_err(|e| RuntimeError::sys(format!("stat {p}"), e))
    };
    Ok(stat(&format!("/proc/{pid}/ns/user"))? != stat("/proc/self/ns/user")?)
}

/// Whether this CRIU can lock the network with nftables in-process (no
/// `iptables-restore` runs); probed once per process.
pub fn nftables_lock(bin: &Path) -> bool {
    static NFT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *NFT.get_or_init(|| {
        Command::new(bin)
            .env_clear()
            .env("PATH", PATH)
            .args(["check", "--feature", "network_lock_nftables"])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// `--network-lock nftables` when `nftables`, else CRIU's default (iptables).
fn network_lock_args(nftables: bool) -> &'static [&'static str] {
    if nftables {
        &["--network-lock", "nftables"]
    } else {
        &[]
    }
}

/// Inode of the network namespace of process `pid`.
fn netns_inode(pid: i32) -> Result<u64, RuntimeError> {
    use std::os::unix::fs::MetadataExt;
    let p = format!("/proc/{pid}/ns/net");
    std::fs::metadata(&p).map(|m| m.ino()).map_err(|e| RuntimeError::sys(format!("stat {p}"), e))
}

/// Whether `mount_point` is a mount point in the mount namespace (and root) of `pid`.
pub fn has_mount(pid: i32, mount_point: &str) -> bool {
    let info = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
    info.lines().any(|l| l.split(' ').nth(4) == Some(mount_point))
}

/// Dumps the process tree rooted at `init_pid` into `dir` (created): for
/// standby it ends the processes, for a copy it leaves them running (see
/// [`DumpMode`]). On failure the processes keep running (CRIU resumes them).
/// A secrets tmpfs is declared external, so its contents stay out of the images.
pub fn dump(init_pid: i32, dir: &Path, mode: &DumpMode) -> Result<std::time::Duration, RuntimeError> {
    let bin = binary().ok_or_else(|| RuntimeError::Unsupported("criu is not installed".into()))?;
    std::fs::create_dir_all(dir).map_err(|e| RuntimeError::sys(format!("create {}", dir.display()), e))?;
    let in_userns = in_user_namespace(init_pid)?;
    // A sandbox in a user namespace owns its network namespace: CRIU records it
    // as one to make empty (the restore's hook plugs loopback and the link in),
    // and the host's device nodes bound into its /dev as external mounts.
    let net_args = if in_userns {
        vec!["--empty-ns".to_string(), "net".into(), "--external".into(), "mnt[]".into()]
    } else {
        vec!["--external".to_string(), format!("net[{}]:{NETNS_KEY}", netns_inode(init_pid)?)]
    };
    let secrets = has_mount(init_pid, crate::spec::SECRETS_DIR);
    let t = Instant::now();
    let out = Command::new(&bin)
        .env_clear()
        .env("PATH", PATH)
        .arg("dump")
        .arg("-t")
        .arg(init_pid.to_string())
        .arg("-D")
        .arg(dir)
        .arg("-o")
        .arg(DUMP_LOG)
        .arg("--external")
        .arg(format!("mnt[{}]:{HELPER_KEY}", super::init::SELF_PATH))
        .args(net_args)
        .args(match mode {
            DumpMode::Standby => {
                let mut a: Vec<String> = network_lock_args(nftables_lock(&bin)).iter().map(|s| s.to_string()).collect();
                a.push("--tcp-established".into());
                a
            }
            DumpMode::Copy { freezer } => vec![
                "--leave-running".into(),
                "--tcp-close".into(),
                "--freeze-cgroup".into(),
                freezer.to_string_lossy().into_owned(),
            ],
        })
        .args(if secrets {
            vec!["--external".to_string(), format!("mnt[{}]:{SECRETS_KEY}", crate::spec::SECRETS_DIR)]
        } else {
            Vec::new()
        })
        .args(COMMON)
        .output()
        .map_err(|source| RuntimeError::Spawn { what: "criu dump", source })?;
    if !out.status.success() {
        return Err(RuntimeError::Setup(format!(
            "criu dump failed ({}): {}",
            out.status,
            log_errors(&dir.join(DUMP_LOG))
        )));
    }
    let took = t.elapsed();
    let marker = if in_userns { EMPTY_NETNS_MARKER } else { NETNS_MARKER };
    std::fs::write(dir.join(marker), b"loopback\n")
        .map_err(|e| RuntimeError::sys(format!("write {}", dir.join(marker).display()), e))?;
    if matches!(mode, DumpMode::Copy { .. }) {
        std::fs::write(dir.join(TCP_CLOSED_MARKER), b"closed\n")
            .map_err(|e| RuntimeError::sys(format!("write {}", dir.join(TCP_CLOSED_MARKER).display()), e))?;
    }
    Ok(took)
}

/// What `_restore` needs (passed as JSON in [`RESTORE_CONFIG_ENV`]).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct RestoreConfig {
    /// Overlay lower directories, bottom first.
    pub lower_dirs: Vec<PathBuf>,
    /// The sandbox's writable layer.
    pub upper_dir: PathBuf,
    /// Overlay work directory.
    pub work_dir: PathBuf,
    /// Where the overlay is mounted for CRIU's `--root`.
    pub rootfs_dir: PathBuf,
    /// Cgroup files to write "0" to (join) first, so restored tasks start inside.
    pub cgroup_join_files: Vec<PathBuf>,
    /// CRIU's `--cgroup-root` values for this sandbox's cgroup ([`crate::cgroup::SandboxCgroup::criu_roots`]).
    #[serde(default)]
    pub cgroup_roots: Vec<String>,
    /// The images directory.
    pub images_dir: PathBuf,
    /// Where CRIU writes its log (`-W`; the images directory when `None`).
    #[serde(default)]
    pub criu_work_dir: Option<PathBuf>,
    /// The images hold established TCP connections as closed ([`TCP_CLOSED_MARKER`]).
    #[serde(default)]
    pub tcp_closed: bool,
    /// The root is not the dumped sandbox's own (a restore from a checkpoint's
    /// copy): create the identity mount points checkpoints leave out first
    /// (see [`super::mounts::ensure_identity_mountpoints`]).
    #[serde(default)]
    pub foreign_root: bool,
    /// The helper binary to bind where the dumped one was.
    pub helper: PathBuf,
    /// Inherited descriptors and the pipe inode each replaces.
    pub inherit: Vec<(RawFd, u64)>,
    /// Where CRIU writes the restored pid 1's host pid.
    pub pidfile: PathBuf,
    /// The criu binary.
    pub criu: PathBuf,
    /// The images hold no network namespace ([`NETNS_MARKER`]): the helper makes a
    /// new one (loopback up) and hands it to CRIU as [`NETNS_KEY`].
    #[serde(default)]
    pub external_netns: bool,
    /// The network namespace to restore into (egress sandboxes: the daemon's
    /// prepared one, with its veth link); `None` with `external_netns`: a new
    /// one with loopback only.
    #[serde(default)]
    pub netns_path: Option<PathBuf>,
    /// Lock the network with nftables ([`nftables_lock`]).
    #[serde(default)]
    pub nftables_lock: bool,
    /// Where `_restore` mounts a fresh secrets tmpfs (in its private mount
    /// namespace) for CRIU to bind in place of the dumped one; `None` when the
    /// sandbox has no secrets. The values arrive on `_restore`'s stdin.
    #[serde(default)]
    pub secrets_mount: Option<PathBuf>,
    /// Owner of the secret files (see [`crate::spec::SandboxSpec::secrets_owner`]).
    #[serde(default)]
    pub secrets_owner: Option<String>,
    /// The sandbox's user namespace: its layers are idmapped through a
    /// namespace with this map while CRIU restores (which makes the
    /// sandbox's own from the images, whose map says the same range:
    /// `images_dir` is a view with a moved map when the dumped one differed).
    #[serde(default)]
    pub userns: Option<strata_api::UserNamespace>,
    /// The images hold a network namespace to make empty
    /// ([`EMPTY_NETNS_MARKER`]): CRIU makes it, and its `setup-namespaces`
    /// action runs `hook`, which brings loopback up and plugs `link` in.
    #[serde(default)]
    pub empty_netns: bool,
    /// The action script CRIU runs (`--action-script`; it runs `strata _restore_hook`).
    #[serde(default)]
    pub hook: Option<PathBuf>,
    /// Egress in a user namespace: the link the hook plugs in.
    #[serde(default)]
    pub link: Option<crate::spec::UsernsLink>,
    /// Restore memory lazily (`--lazy-pages`): a `criu lazy-pages` of the
    /// same images and work directory runs ([`super::lazy`]).
    #[serde(default)]
    pub lazy: bool,
    /// With `lazy`: the inherited status pipe of that daemon; `_restore`
    /// waits on it ([`super::lazy::wait_listening`]) before it runs CRIU.
    #[serde(default)]
    pub lazy_ready_fd: Option<RawFd>,
}

/// Environment variable carrying the [`HookConfig`] JSON to the action script.
pub const HOOK_CONFIG_ENV: &str = "STRATA_RESTORE_HOOK";

/// What the restore's action script (`strata _restore_hook`) needs.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct HookConfig {
    /// The link to plug into the restored network namespace, if any.
    pub link: Option<crate::spec::UsernsLink>,
}

/// Environment variable carrying the [`RestoreConfig`] JSON.
pub const RESTORE_CONFIG_ENV: &str = "STRATA_RESTORE_CONFIG";

/// The `criu restore` command line for `cfg`; `netns_fd` is the inheritable
/// descriptor of the network namespace to restore into (external netns images).
pub fn restore_args(cfg: &RestoreConfig, netns_fd: Option<RawFd>) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "restore".into(),
        "-D".into(),
        cfg.images_dir.to_string_lossy().into_owned(),
        "-o".into(),
        RESTORE_LOG.into(),
        if cfg.tcp_closed { "--tcp-close".into() } else { "--tcp-established".into() },
        "--root".into(),
        cfg.rootfs_dir.to_string_lossy().into_owned(),
        "--restore-detached".into(),
        "--pidfile".into(),
        cfg.pidfile.to_string_lossy().into_owned(),
        "--external".into(),
        format!("mnt[{HELPER_KEY}]:{}", cfg.helper.display()),
    ];
    // The restored tasks go into this sandbox's cgroups: by default CRIU puts
    // them back into the cgroups they were dumped in — a warm copy into its
    // source's (under its limits and freezer while it lives, and frozen for
    // good by the dump's --freeze-cgroup once it is gone).
    for root in &cfg.cgroup_roots {
        a.push("--cgroup-root".into());
        a.push(root.clone());
    }
    if let Some(dir) = &cfg.criu_work_dir {
        a.push("-W".into());
        a.push(dir.to_string_lossy().into_owned());
    }
    if let Some(dir) = &cfg.secrets_mount {
        a.push("--external".into());
        a.push(format!("mnt[{SECRETS_KEY}]:{}", dir.display()));
    }
    for (fd, ino) in &cfg.inherit {
        a.push("--inherit-fd".into());
        a.push(format!("fd[{fd}]:pipe:[{ino}]"));
    }
    if cfg.empty_netns {
        a.extend(["--empty-ns", "net", "--external", "mnt[]"].map(String::from));
    }
    if let Some(hook) = &cfg.hook {
        a.push("--action-script".into());
        a.push(hook.to_string_lossy().into_owned());
    }
    if let Some(fd) = netns_fd {
        a.push("--inherit-fd".into());
        a.push(format!("fd[{fd}]:{NETNS_KEY}"));
    }
    if cfg.lazy {
        a.push("--lazy-pages".into());
    }
    a.extend(network_lock_args(cfg.nftables_lock).iter().map(|s| s.to_string()));
    a.extend(COMMON.iter().map(|s| s.to_string()));
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> RestoreConfig {
        RestoreConfig {
            lower_dirs: vec![],
            upper_dir: "/s/upper".into(),
            work_dir: "/s/work".into(),
            rootfs_dir: "/s/rootfs".into(),
            cgroup_join_files: vec![],
            cgroup_roots: vec!["cpu:/strata/x".into()],
            images_dir: "/s/standby".into(),
            criu_work_dir: None,
            tcp_closed: false,
            foreign_root: false,
            helper: "/usr/lib/strata/strata-init".into(),
            inherit: vec![(7, 1234)],
            pidfile: "/s/standby/restored.pid".into(),
            criu: "/usr/local/sbin/criu".into(),
            external_netns: true,
            netns_path: None,
            nftables_lock: true,
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
    fn a_restore_joins_strata_s_network_unless_the_images_hold_an_empty_one() {
        let a = restore_args(&config(), Some(9)).join(" ");
        assert!(a.contains("--inherit-fd fd[7]:pipe:[1234] --inherit-fd fd[9]:strata-netns"), "{a}");
        assert!(!a.contains("--empty-ns") && !a.contains("--action-script") && !a.contains("mnt[]"), "{a}");
        assert!(!a.contains("--lazy-pages"), "{a}");
        let mut lazy = config();
        lazy.lazy = true;
        assert!(restore_args(&lazy, None).contains(&"--lazy-pages".to_string()));
        // A sandbox in a user namespace: CRIU makes the network namespace
        // empty, the hook fills it, and the host's device binds are external.
        let mut cfg = config();
        cfg.external_netns = false;
        cfg.empty_netns = true;
        cfg.hook = Some("/s/standby/restore-hook.sh".into());
        let a = restore_args(&cfg, None).join(" ");
        assert!(a.contains("--empty-ns net --external mnt[] --action-script /s/standby/restore-hook.sh"), "{a}");
        assert!(a.contains("--external mnt[strata-helper]:/usr/lib/strata/strata-init"), "{a}");
        assert!(!a.contains("strata-netns"), "{a}");
    }
}
