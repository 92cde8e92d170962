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
    let Some(bin) = binary() else { return Some("criu is not installed (scripts/setup-host.sh builds CRIU 4.1.1)".into()) };
    let out = match Command::new(&bin).arg("--version").output() {
        Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
        Err(e) => return Some(format!("running {}: {e}", bin.display())),
    };
    match crate::probe::parse_criu_version(&out) {
        Some((maj, _)) if maj >= 4 => None,
        Some((maj, min)) => Some(format!("{} is CRIU {maj}.{min}; standby needs CRIU >= 4 (3.x fails on this kernel's vDSO)", bin.display())),
        None => Some(format!("cannot tell the version of {}", bin.display())),
    }
}

/// The last lines of a CRIU log that carry errors, for error messages.
pub fn log_errors(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let errs: Vec<&str> = text.lines().filter(|l| l.contains("Error") || l.contains("error")).collect();
    let pick = if errs.is_empty() { text.lines().rev().take(3).collect::<Vec<_>>().into_iter().rev().collect() } else { errs };
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
const COMMON: [&str; 4] = ["--tcp-established", "--file-locks", "--ext-unix-sk", "-v2"];

/// Whether `mount_point` is a mount point in the mount namespace (and root) of `pid`.
pub fn has_mount(pid: i32, mount_point: &str) -> bool {
    let info = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
    info.lines().any(|l| l.split(' ').nth(4) == Some(mount_point))
}

/// Dumps the process tree rooted at `init_pid` into `dir` (created) and kills it.
/// On failure the processes keep running (CRIU resumes them). A secrets tmpfs
/// is declared external, so its contents stay out of the images.
pub fn dump(init_pid: i32, dir: &Path) -> Result<std::time::Duration, RuntimeError> {
    let bin = binary().ok_or_else(|| RuntimeError::Unsupported("criu is not installed".into()))?;
    std::fs::create_dir_all(dir).map_err(|e| RuntimeError::sys(format!("create {}", dir.display()), e))?;
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
        .args(if secrets { vec!["--external".to_string(), format!("mnt[{}]:{SECRETS_KEY}", crate::spec::SECRETS_DIR)] } else { Vec::new() })
        .args(COMMON)
        .output()
        .map_err(|source| RuntimeError::Spawn { what: "criu dump", source })?;
    if !out.status.success() {
        return Err(RuntimeError::Setup(format!("criu dump failed ({}): {}", out.status, log_errors(&dir.join(DUMP_LOG)))));
    }
    Ok(t.elapsed())
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
    /// The images directory.
    pub images_dir: PathBuf,
    /// The helper binary to bind where the dumped one was.
    pub helper: PathBuf,
    /// Inherited descriptors and the pipe inode each replaces.
    pub inherit: Vec<(RawFd, u64)>,
    /// Where CRIU writes the restored pid 1's host pid.
    pub pidfile: PathBuf,
    /// The criu binary.
    pub criu: PathBuf,
    /// Where `_restore` mounts a fresh secrets tmpfs (in its private mount
    /// namespace) for CRIU to bind in place of the dumped one; `None` when the
    /// sandbox has no secrets. The values arrive on `_restore`'s stdin.
    #[serde(default)]
    pub secrets_mount: Option<PathBuf>,
    /// Owner of the secret files (see [`crate::spec::SandboxSpec::secrets_owner`]).
    #[serde(default)]
    pub secrets_owner: Option<String>,
}

/// Environment variable carrying the [`RestoreConfig`] JSON.
pub const RESTORE_CONFIG_ENV: &str = "STRATA_RESTORE_CONFIG";

/// The `criu restore` command line for `cfg`.
pub fn restore_args(cfg: &RestoreConfig) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "restore".into(),
        "-D".into(),
        cfg.images_dir.to_string_lossy().into_owned(),
        "-o".into(),
        RESTORE_LOG.into(),
        "--root".into(),
        cfg.rootfs_dir.to_string_lossy().into_owned(),
        "--restore-detached".into(),
        "--pidfile".into(),
        cfg.pidfile.to_string_lossy().into_owned(),
        "--external".into(),
        format!("mnt[{HELPER_KEY}]:{}", cfg.helper.display()),
    ];
    if let Some(dir) = &cfg.secrets_mount {
        a.push("--external".into());
        a.push(format!("mnt[{SECRETS_KEY}]:{}", dir.display()));
    }
    for (fd, ino) in &cfg.inherit {
        a.push("--inherit-fd".into());
        a.push(format!("fd[{fd}]:pipe:[{ino}]"));
    }
    a.extend(COMMON.iter().map(|s| s.to_string()));
    a
}
