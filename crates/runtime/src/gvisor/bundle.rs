//! A gVisor sandbox's OCI bundle and the host tree under its root.
//!
//! The root runsc serves is strata's own overlay (image layers + the
//! sandbox's writable layer), mounted on the host, with `--overlay2=none`:
//! every write of the sandbox lands in the writable layer at once, so
//! checkpoints, diffs, scans, exports and templates read it as they do on the
//! namespace tier.
//!
//! Beside it, in `<run>/gvisor/<id>/` (the bundle): `config.json`, the
//! identity files bound read-only at `/run/strata` (with strata-init at
//! `/run/strata/init`) and over `/etc/hostname`, `/etc/hosts`,
//! `/etc/machine-id`, an optional `resolv.conf`, and the secrets on a tmpfs of
//! their own (bound read-only at `/run/secrets`: never on disk, never in a
//! process image). `/tmp` is a host directory next to the writable layer (on
//! the sandbox's disk, so its quota counts it) bound both in the spec and on
//! the host tree, so the file API sees what the sandbox sees; it is emptied
//! at every cold start, like the namespace tier's tmpfs.
//!
//! Every host-side mount under the root is placed through a descriptor opened
//! with `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS)`: a symlink in the image
//! never sends a host mount outside the sandbox's tree.

use std::fs;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};
use serde_json::{json, Value};

use crate::namespace::mounts::{self, SetupError, SetupResult};
use crate::spec::{SandboxSpec, SECRETS_DIR};
use crate::sys::Sys;

/// The cgroup path (relative to each hierarchy) runsc puts sandbox `id` in:
/// the namespace tier's, so counters are read the same way.
pub fn cgroups_path(id: &str) -> String {
    format!("/{}/{id}", crate::cgroup::PARENT)
}

/// Memory the sentry itself needs beside the guest's (it is charged to the
/// same memory cgroup; going over the limit kills the whole sandbox).
pub const SENTRY_HEADROOM_BYTES: u64 = 64 << 20;

/// The host's backstop on tasks: the sentry's threads and stubs count there,
/// so the guest's process limit is `RLIMIT_NPROC` inside and this is loose.
pub fn host_pids_limit(guest: Option<u64>) -> u64 {
    guest.map_or(16_384, |p| (p * 4).max(1024))
}

/// Paths of one sandbox's bundle.
#[derive(Debug, Clone)]
pub struct Bundle {
    /// `<run>/gvisor/<id>`.
    pub dir: PathBuf,
}

impl Bundle {
    /// The bundle of sandbox `id` under `gvisor_dir`.
    pub fn new(gvisor_dir: &Path, id: &str) -> Bundle {
        Bundle { dir: gvisor_dir.join(id) }
    }

    /// The identity directory bound at `/run/strata`.
    pub fn identity(&self) -> PathBuf {
        self.dir.join("identity")
    }

    /// The secrets tmpfs.
    pub fn secrets(&self) -> PathBuf {
        self.dir.join("secrets")
    }

    /// A symlink to the sandbox's root on the host (the overlay mount).
    pub fn root_link(&self) -> PathBuf {
        self.dir.join("root")
    }

    /// The lock every exec client holds shared while it starts, and a
    /// checkpoint exclusive.
    pub fn exec_lock(&self) -> PathBuf {
        self.dir.join("exec.lock")
    }

    /// The pid file runsc writes (the runsc-sandbox process).
    pub fn pid_file(&self) -> PathBuf {
        self.dir.join("sandbox.pid")
    }

    /// `resolv.conf`, when the sandbox has strata's.
    pub fn resolv_conf(&self) -> PathBuf {
        self.dir.join("resolv.conf")
    }

    /// The exec channel's directory (a small tmpfs), bound read-only at
    /// [`strata_init::channel::CHAN_DIR`]: the broker's socket, and the token
    /// until pid 1 has read it.
    pub fn chan(&self) -> PathBuf {
        self.dir.join("chan")
    }

    /// The broker's control socket (host only, mode 0600).
    pub fn broker_control(&self) -> PathBuf {
        self.dir.join("broker.ctl")
    }

    /// The sandbox's channel token (host only, mode 0600).
    pub fn token(&self) -> PathBuf {
        self.dir.join("channel.token")
    }
}

/// The host directory bound at `/tmp`: next to the writable layer.
pub fn tmp_dir(spec: &SandboxSpec) -> PathBuf {
    tmp_dir_beside(&spec.upper_dir)
}

/// The `/tmp` of the sandbox whose writable layer is `upper` (on its disk,
/// when it has one). It is part of a sandbox in standby: an archive takes it.
pub fn tmp_dir_beside(upper: &Path) -> PathBuf {
    upper.parent().unwrap_or(upper).join("gvisor-tmp")
}

/// Whether a sandbox of `spec` has a scratch `/tmp` (a host directory bound
/// there) rather than the directory of its root.
pub fn scratch_tmp(spec: &SandboxSpec) -> bool {
    spec.tmp == strata_api::TmpStorage::Tmpfs
}

/// [`tmp_dir`] of a running sandbox, found from its bundle (the spec's
/// `/tmp` source in its config); `None` when `/tmp` is part of its root
/// (nothing or the root's own directory is bound there).
pub fn tmp_dir_of(bundle: &Bundle) -> Result<Option<PathBuf>, String> {
    let path = bundle.dir.join("config.json");
    let cfg: Value = fs::read(&path)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let own = cfg["root"]["path"].as_str().map(|root| Path::new(root).join("tmp"));
    Ok(cfg["mounts"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["destination"] == "/tmp"))
        .and_then(|m| m["source"].as_str())
        .map(PathBuf::from)
        .filter(|source| Some(source) != own.as_ref()))
}

/// Builds the host side of a cold start: the overlay root (with a scratch
/// `/tmp` bound on it, or its own `/tmp` made when the image lacks one), the
/// identity files, strata's resolv.conf and the secrets tmpfs.
pub fn prepare(sys: &dyn Sys, spec: &SandboxSpec, bundle: &Bundle, fresh_tmp: bool) -> SetupResult<Prepared> {
    let ctx = |what: String| move |e: std::io::Error| SetupError::Host(format!("{what}: {e}"));
    fs::create_dir_all(&bundle.dir).map_err(ctx(format!("create {}", bundle.dir.display())))?;
    for d in [&spec.upper_dir, &spec.work_dir, &spec.rootfs_dir] {
        fs::create_dir_all(d).map_err(ctx(format!("create {}", d.display())))?;
    }
    mounts::mount_overlay(sys, &spec.lower_dirs, &spec.upper_dir, &spec.work_dir, &spec.rootfs_dir, None)?;
    let _ = fs::remove_file(bundle.root_link());
    std::os::unix::fs::symlink(&spec.rootfs_dir, bundle.root_link()).map_err(ctx("link the root".into()))?;

    let root_tmp = if scratch_tmp(spec) {
        let tmp = tmp_dir(spec);
        if fresh_tmp {
            remove_tree(&tmp).map_err(ctx(format!("empty {}", tmp.display())))?;
        }
        fs::create_dir_all(&tmp).map_err(ctx(format!("create {}", tmp.display())))?;
        sys.chmod(&tmp, 0o1777).map_err(|e| SetupError::Host(format!("chmod {}: {e}", tmp.display())))?;
        bind_inside(sys, &tmp, &spec.rootfs_dir, "tmp")?;
        false
    } else {
        make_tmp_in_root(&spec.rootfs_dir)?
    };

    mounts::ensure_identity_mountpoints(&spec.rootfs_dir).map_err(SetupError::Image)?;
    // As on the namespace tier: with an /etc, its hosts file (empty when unreadable) plus strata's lines.
    let has_etc = has_etc(&spec.rootfs_dir);
    let image_hosts = has_etc.then(|| read_in_root(&spec.rootfs_dir, "etc/hosts").unwrap_or_default());
    let id_dir = bundle.identity();
    fs::create_dir_all(&id_dir).map_err(ctx(format!("create {}", id_dir.display())))?;
    let files = mounts::identity_files(
        image_hosts.as_deref(),
        &spec.hostname,
        &spec.id,
        &spec.machine_id,
        spec.fork_generation,
    );
    for (name, content) in files {
        fs::write(id_dir.join(name), content).map_err(ctx(format!("write identity file {name}")))?;
    }
    // The mount point of strata-init inside /run/strata.
    fs::write(id_dir.join("init"), b"").map_err(ctx("create the init mount point".into()))?;
    // The exec channel: a small tmpfs of the host's, read-only to the sandbox (the
    // broker binds and chmods its socket there by path: nothing inside may put a
    // symlink in its place).
    fs::create_dir_all(id_dir.join("chan")).map_err(ctx("create the channel mount point".into()))?;
    let chan = bundle.chan();
    fs::create_dir_all(&chan).map_err(ctx(format!("create {}", chan.display())))?;
    sys.mount(
        Some(Path::new("strata-chan")),
        &chan,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("size=64k,nr_inodes=64,mode=0755"),
    )
    .map_err(|e| SetupError::Host(format!("mount a tmpfs on {}: {e}", chan.display())))?;
    match &spec.resolv_conf {
        Some(conf) => fs::write(bundle.resolv_conf(), conf).map_err(ctx("write resolv.conf".into()))?,
        None => {
            let _ = fs::remove_file(bundle.resolv_conf());
        }
    }
    if !spec.secrets.is_empty() {
        let dir = bundle.secrets();
        fs::create_dir_all(&dir).map_err(ctx(format!("create {}", dir.display())))?;
        let passwd = read_in_root(&spec.rootfs_dir, "etc/passwd").unwrap_or_default();
        let group = read_in_root(&spec.rootfs_dir, "etc/group").unwrap_or_default();
        let owner = mounts::secrets_owner(spec.secrets_owner.as_deref(), &passwd, &group);
        mounts::fill_secrets(sys, &dir, &spec.secrets, owner)?;
    }
    Ok(Prepared { has_etc, root_tmp })
}

/// What [`prepare`] found in the root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prepared {
    /// The image has an `/etc` (its identity files get bound).
    pub has_etc: bool,
    /// `/tmp` is part of the root and a real directory there: it is bound
    /// onto itself (runsc mounts a tmpfs of the sentry's own on an empty
    /// `/tmp` nothing is mounted on, which checkpoints would not keep).
    pub root_tmp: bool,
}

/// Removes a directory tree if it exists (never follows symlinks).
pub fn remove_tree(dir: &Path) -> std::io::Result<()> {
    match fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Reads a small file of the image (at most 1 MiB), resolved inside `root`
/// without following symlinks out of it, and only if it is a regular file (a
/// FIFO the sandbox left there is never opened: it would block the daemon);
/// `None` when it is missing, unreadable or not a regular file.
fn read_in_root(root: &Path, rel: &str) -> Option<String> {
    use crate::openat2::{open_regular, RESOLVE_IN_ROOT, RESOLVE_NO_MAGICLINKS};
    use std::io::Read;
    let root_fd = fs::File::open(root).ok()?;
    let f = open_regular(root_fd.as_raw_fd(), rel, libc::O_RDONLY, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS).ok()?;
    let mut s = String::new();
    f.take(1 << 20).read_to_string(&mut s).ok()?;
    Some(s)
}

/// Whether the image has an `/etc` directory (resolved inside `root`).
fn has_etc(root: &Path) -> bool {
    use crate::openat2::{openat2, RESOLVE_IN_ROOT, RESOLVE_NO_MAGICLINKS};
    fs::File::open(root).is_ok_and(|r| {
        openat2(r.as_raw_fd(), "etc", libc::O_PATH | libc::O_DIRECTORY, 0, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
            .is_ok()
    })
}

/// Bind-mounts host directory `source` on `root/rel` (a directory of the
/// image, created when missing; a symlink or a file there is refused).
fn bind_inside(sys: &dyn Sys, source: &Path, root: &Path, rel: &str) -> SetupResult<()> {
    use crate::openat2::{openat2, RESOLVE_IN_ROOT, RESOLVE_NO_SYMLINKS};
    let root_fd = fs::File::open(root).map_err(|e| SetupError::Host(format!("open {}: {e}", root.display())))?;
    let open = || {
        openat2(root_fd.as_raw_fd(), rel, libc::O_PATH | libc::O_DIRECTORY, 0, RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS)
    };
    let target = match open() {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            nix::sys::stat::mkdirat(Some(root_fd.as_raw_fd()), rel, nix::sys::stat::Mode::from_bits_truncate(0o1777))
                .map_err(|e| SetupError::Host(format!("mkdir /{rel}: {e}")))?;
            open().map_err(|e| SetupError::Host(format!("open /{rel}: {e}")))?
        }
        Err(e) => {
            return Err(SetupError::Image(format!(
                "refusing to mount on /{rel}: it is a symlink or not a directory in the image ({e})"
            )))
        }
    };
    let at = PathBuf::from(format!("/proc/self/fd/{}", target.as_raw_fd()));
    sys.mount(Some(source), &at, None, MsFlags::MS_BIND, None)
        .map_err(|e| SetupError::Host(format!("bind {} on /{rel}: {e}", source.display())))
}

/// Makes `/tmp` (mode 1777) in the root when the image has nothing there; an
/// image's own `/tmp`, whatever it is, stays as it is. Returns whether it is
/// a directory (not a symlink or anything else).
fn make_tmp_in_root(root: &Path) -> SetupResult<bool> {
    use std::os::fd::FromRawFd;
    let root_fd = fs::File::open(root).map_err(|e| SetupError::Host(format!("open {}: {e}", root.display())))?;
    match nix::sys::stat::mkdirat(Some(root_fd.as_raw_fd()), "tmp", nix::sys::stat::Mode::from_bits_truncate(0o700)) {
        Ok(()) => {}
        Err(nix::errno::Errno::EEXIST) => {
            let st =
                nix::sys::stat::fstatat(Some(root_fd.as_raw_fd()), "tmp", nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
                    .map_err(|e| SetupError::Host(format!("stat /tmp: {e}")))?;
            return Ok(st.st_mode & libc::S_IFMT == libc::S_IFDIR);
        }
        Err(e) => return Err(SetupError::Host(format!("mkdir /tmp: {e}"))),
    }
    // The new directory, never a link (nothing runs in the sandbox yet): 1777 past the umask.
    let fd = nix::fcntl::openat(
        Some(root_fd.as_raw_fd()),
        "tmp",
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_NOFOLLOW,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| SetupError::Host(format!("open /tmp: {e}")))?;
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    let dir = unsafe { fs::File::from_raw_fd(fd) };
    nix::sys::stat::fchmod(dir.as_raw_fd(), nix::sys::stat::Mode::from_bits_truncate(0o1777))
        .map_err(|e| SetupError::Host(format!("chmod /tmp: {e}")))?;
    Ok(true)
}

/// Undoes [`prepare`]: detaches the root tree and the secrets tmpfs and
/// removes the bundle. Missing pieces are fine (a failed or repeated cleanup).
pub fn teardown(sys: &dyn Sys, bundle: &Bundle) {
    if let Ok(root) = fs::read_link(bundle.root_link()) {
        // The overlay and /tmp on it go in one lazy detach.
        while sys.umount2(&root, MntFlags::MNT_DETACH).is_ok() {}
    }
    let _ = sys.umount2(&bundle.secrets(), MntFlags::MNT_DETACH);
    let _ = sys.umount2(&bundle.chan(), MntFlags::MNT_DETACH);
    let _ = fs::remove_dir_all(&bundle.dir);
}

/// What `config.json` needs beyond the sandbox's spec.
#[derive(Debug, Clone)]
pub struct ConfigInputs<'a> {
    /// The sandbox.
    pub spec: &'a SandboxSpec,
    /// Its bundle.
    pub bundle: &'a Bundle,
    /// The host's strata-init, bound at `/run/strata/init`.
    pub init_binary: &'a Path,
    /// What [`prepare`] found in the root.
    pub prepared: Prepared,
    /// Seconds pid 1 gives processes between SIGTERM and SIGKILL on stop.
    pub stop_grace_secs: u64,
}

fn bind_ro(destination: &str, source: &Path, exec: bool) -> Value {
    let mut options = vec!["rbind", "ro", "nosuid", "nodev"];
    if !exec {
        options.push("noexec");
    }
    json!({"destination": destination, "type": "bind", "source": source, "options": options})
}

/// The OCI runtime configuration of a sandbox (see docs/design/gvisor-tier.md §3).
pub fn config(inp: &ConfigInputs<'_>) -> Value {
    let spec = inp.spec;
    let caps = strata_init::runsc::root_capabilities();
    let id_dir = inp.bundle.identity();
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]}),
        json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}),
        json!({"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]}),
        bind_ro("/run/strata", &id_dir, false),
        bind_ro(strata_init::SELF_PATH, inp.init_binary, true),
        json!({"destination": strata_init::channel::CHAN_DIR, "type": "bind", "source": inp.bundle.chan(), "options": ["rbind", "ro", "nosuid", "nodev", "noexec"]}),
    ];
    // Scratch space outside the writable layer (the namespace tier's tmpfs), or
    // the root's own directory bound onto itself: it stays in the writable
    // layer, and runsc's tmpfs for an empty /tmp is not mounted on it.
    let tmp_source = if scratch_tmp(spec) {
        Some(tmp_dir(spec))
    } else {
        inp.prepared.root_tmp.then(|| spec.rootfs_dir.join("tmp"))
    };
    if let Some(source) = tmp_source {
        mounts.insert(
            5,
            json!({"destination": "/tmp", "type": "bind", "source": source, "options": ["rbind", "rw", "nosuid", "nodev"]}),
        );
    }
    if inp.prepared.has_etc {
        for name in mounts::ETC_IDENTITY_FILES {
            mounts.push(bind_ro(&format!("/etc/{name}"), &id_dir.join(name), false));
        }
        if spec.resolv_conf.is_some() {
            mounts.push(bind_ro("/etc/resolv.conf", &inp.bundle.resolv_conf(), false));
        }
    }
    if !spec.secrets.is_empty() {
        mounts.push(bind_ro(SECRETS_DIR, &inp.bundle.secrets(), false));
    }
    let mut namespaces =
        vec![json!({"type": "pid"}), json!({"type": "ipc"}), json!({"type": "uts"}), json!({"type": "mount"})];
    if let Some(ns) = &spec.netns_path {
        namespaces.push(json!({"type": "network", "path": ns}));
    }
    let mut resources = json!({"pids": {"limit": host_pids_limit(spec.limits.pids)}});
    if let Some(mem) = spec.limits.memory_bytes {
        resources["memory"] = json!({"limit": mem + SENTRY_HEADROOM_BYTES});
    }
    if let Some(cpus) = spec.limits.cpus {
        resources["cpu"] = json!({"quota": (cpus * 100_000.0).round() as i64, "period": 100_000});
    }
    let mut rlimits = vec![];
    if let Some(p) = spec.limits.pids {
        rlimits.push(json!({"type": "RLIMIT_NPROC", "hard": p, "soft": p}));
    }
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": [strata_init::SELF_PATH, "_pid1", inp.stop_grace_secs.to_string(), "--spawner"],
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "cwd": "/",
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
            "noNewPrivileges": false,
            "rlimits": rlimits,
        },
        "root": {"path": spec.rootfs_dir, "readonly": false},
        "hostname": spec.hostname,
        "mounts": mounts,
        "linux": {
            "namespaces": namespaces,
            "resources": resources,
            "cgroupsPath": cgroups_path(&spec.id),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::{RecordingSys, SysCall};
    use std::os::unix::fs::PermissionsExt;

    fn spec(dir: &Path) -> SandboxSpec {
        SandboxSpec {
            id: "sb1".into(),
            hostname: "box".into(),
            lower_dirs: vec![dir.join("layer")],
            upper_dir: dir.join("disk/upper"),
            work_dir: dir.join("disk/work"),
            rootfs_dir: dir.join("rootfs"),
            limits: strata_api::ResourceLimits {
                memory_bytes: Some(256 << 20),
                cpus: Some(0.5),
                pids: Some(64),
                ..Default::default()
            },
            log_path: dir.join("init.log"),
            machine_id: "0".repeat(32),
            fork_generation: 2,
            secrets: vec![],
            secrets_owner: None,
            netns_path: None,
            resolv_conf: None,
            userns: None,
            tmp: strata_api::TmpStorage::Tmpfs,
            userns_link: None,
            link: None,
        }
    }

    #[test]
    fn the_config_limits_the_guest_inside_and_the_host_loosely() {
        let dir = Path::new("/s");
        let s = spec(dir);
        let b = Bundle::new(Path::new("/run/gvisor"), "sb1");
        let c = config(&ConfigInputs {
            spec: &s,
            bundle: &b,
            init_binary: Path::new("/opt/strata-init"),
            prepared: Prepared { has_etc: true, root_tmp: false },
            stop_grace_secs: 10,
        });
        assert_eq!(c["root"]["path"], "/s/rootfs");
        assert_eq!(c["linux"]["cgroupsPath"], "/strata/sb1");
        assert_eq!(c["linux"]["resources"]["memory"]["limit"], (256u64 << 20) + SENTRY_HEADROOM_BYTES);
        assert_eq!(c["linux"]["resources"]["cpu"]["quota"], 50_000);
        assert_eq!(c["linux"]["resources"]["pids"]["limit"], 1024);
        assert_eq!(c["process"]["rlimits"][0], json!({"type": "RLIMIT_NPROC", "hard": 64, "soft": 64}));
        assert_eq!(c["process"]["args"], json!(["/run/strata/init", "_pid1", "10", "--spawner"]));
        let dests: Vec<&str> =
            c["mounts"].as_array().unwrap().iter().map(|m| m["destination"].as_str().unwrap()).collect();
        for d in ["/proc", "/tmp", "/run/strata", "/run/strata/init", "/etc/hostname", "/etc/hosts", "/etc/machine-id"]
        {
            assert!(dests.contains(&d), "{d} in {dests:?}");
        }
        // Only strata-init may be executed from strata's mounts.
        for m in c["mounts"].as_array().unwrap() {
            if m["type"] == "bind" && m["destination"] != "/tmp" {
                let opts = m["options"].as_array().unwrap();
                assert!(opts.contains(&json!("ro")), "{m}");
                assert_eq!(opts.contains(&json!("noexec")), m["destination"] != "/run/strata/init", "{m}");
            }
        }
        assert!(!dests.contains(&"/run/secrets") && !dests.contains(&"/etc/resolv.conf"));
        let ns = c["linux"]["namespaces"].as_array().unwrap();
        assert!(!ns.iter().any(|n| n["type"] == "network"), "no network namespace path: runsc's own");
    }

    #[test]
    fn prepare_mounts_the_root_and_binds_tmp_through_a_descriptor() {
        let dir = tempfile::tempdir().unwrap();
        let s = spec(dir.path());
        std::fs::create_dir_all(dir.path().join("layer")).unwrap();
        let sys = RecordingSys::default();
        let b = Bundle::new(&dir.path().join("gvisor"), "sb1");
        // Nothing is mounted for real: the "root" is the plain rootfs directory.
        let prepared = prepare(&sys, &s, &b, true).unwrap();
        assert_eq!(prepared, Prepared { has_etc: false, root_tmp: false }, "the empty image has no /etc");
        let calls = sys.calls();
        assert!(matches!(&calls[0], SysCall::Mount { fstype: Some(t), .. } if t == "overlay"), "{calls:?}");
        assert!(
            calls.iter().any(|c| matches!(c, SysCall::Mount { target, flags, .. }
                if target.starts_with("/proc/self/fd/") && flags.contains(MsFlags::MS_BIND))),
            "{calls:?}"
        );
        assert!(b.identity().join("sandbox-id").is_file());
        assert_eq!(std::fs::read_link(b.root_link()).unwrap(), s.rootfs_dir);
        assert!(tmp_dir(&s).is_dir());
    }

    #[test]
    fn a_disk_tmp_is_the_root_s_own_directory_bound_onto_itself() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = spec(dir.path());
        s.tmp = strata_api::TmpStorage::Disk;
        std::fs::create_dir_all(dir.path().join("layer")).unwrap();
        let sys = RecordingSys::default();
        let b = Bundle::new(&dir.path().join("gvisor"), "sb1");
        // No /tmp in the image: one is made, world-writable and sticky.
        let prepared = prepare(&sys, &s, &b, true).unwrap();
        assert!(prepared.root_tmp);
        let made = std::fs::symlink_metadata(s.rootfs_dir.join("tmp")).unwrap();
        assert!(made.is_dir());
        assert_eq!(made.permissions().mode() & 0o7777, 0o1777);
        assert!(!tmp_dir(&s).exists(), "no scratch directory");
        assert!(!sys
            .calls()
            .iter()
            .any(|c| matches!(c, SysCall::Mount { flags, .. } if flags.contains(MsFlags::MS_BIND))));
        let inputs = |spec, prepared| ConfigInputs {
            spec,
            bundle: &b,
            init_binary: Path::new("/i"),
            prepared,
            stop_grace_secs: 1,
        };
        let c = config(&inputs(&s, prepared));
        let tmp = c["mounts"].as_array().unwrap().iter().find(|m| m["destination"] == "/tmp").unwrap();
        assert_eq!(tmp["source"], s.rootfs_dir.join("tmp").to_str().unwrap());
        // Nothing of it is copied beside a process image: it is in the filesystem.
        std::fs::write(b.dir.join("config.json"), c.to_string()).unwrap();
        assert_eq!(tmp_dir_of(&b).unwrap(), None);
        let scratch = SandboxSpec { tmp: strata_api::TmpStorage::Tmpfs, ..s.clone() };
        std::fs::write(b.dir.join("config.json"), config(&inputs(&scratch, prepared)).to_string()).unwrap();
        assert_eq!(tmp_dir_of(&b).unwrap(), Some(tmp_dir(&s)), "a scratch one is");
        // An image whose /tmp is a symlink keeps it, and nothing is bound by a path through it.
        std::fs::remove_dir(s.rootfs_dir.join("tmp")).unwrap();
        std::os::unix::fs::symlink("/etc", s.rootfs_dir.join("tmp")).unwrap();
        assert!(!make_tmp_in_root(&s.rootfs_dir).unwrap());
        let c = config(&inputs(&s, Prepared { has_etc: false, root_tmp: false }));
        assert!(!c["mounts"].as_array().unwrap().iter().any(|m| m["destination"] == "/tmp"));
    }

    #[test]
    fn image_files_are_read_only_if_regular_and_inside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::write(root.join("etc/hosts"), "10.0.0.1 db\n").unwrap();
        assert!(has_etc(root));
        assert_eq!(read_in_root(root, "etc/hosts").as_deref(), Some("10.0.0.1 db\n"));
        // A FIFO would block the daemon's open: it is never opened.
        nix::unistd::mkfifo(&root.join("etc/fifo"), nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        assert_eq!(read_in_root(root, "etc/fifo"), None);
        // A symlink out of the root resolves inside it (absent there).
        std::os::unix::fs::symlink("/etc/hostname", root.join("etc/leak")).unwrap();
        assert_eq!(read_in_root(root, "etc/leak"), None);
        assert!(!has_etc(&root.join("etc")), "no etc under etc");
    }

    #[test]
    fn a_symlinked_tmp_in_the_image_is_refused_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let s = spec(dir.path());
        std::fs::create_dir_all(&s.rootfs_dir).unwrap();
        std::os::unix::fs::symlink("/etc", s.rootfs_dir.join("tmp")).unwrap();
        let sys = RecordingSys::default();
        let err = bind_inside(&sys, dir.path(), &s.rootfs_dir, "tmp").unwrap_err();
        assert!(matches!(err, SetupError::Image(_)), "{err}");
        assert!(sys.calls().is_empty());
    }
}
