//! The sandbox's mount tree, built by its init inside a private mount namespace.

use std::fs;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};
use nix::sys::stat::{makedev, Mode, SFlag};

use crate::sys::Sys;

/// Why setting up a sandbox's mount tree failed. The message travels back to
/// the daemon over a pipe; the kind says whose fault it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetupError {
    /// The image's own tree makes the sandbox impossible to set up (a symlink
    /// or a file where strata mounts something): the caller's input.
    Image(String),
    /// Anything else (the host, the kernel, strata itself).
    Host(String),
}

impl std::fmt::Display for SetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SetupError::Image(m) | SetupError::Host(m) => f.write_str(m),
        }
    }
}

impl From<String> for SetupError {
    fn from(m: String) -> Self {
        SetupError::Host(m)
    }
}

impl From<&str> for SetupError {
    fn from(m: &str) -> Self {
        SetupError::Host(m.to_string())
    }
}

/// Result of the setup steps.
pub type SetupResult<T> = Result<T, SetupError>;

fn ctx<E: std::fmt::Display>(what: impl std::fmt::Display) -> impl FnOnce(E) -> String {
    move |e| format!("{what}: {e}")
}

/// Largest overlay option string the kernel takes (one page, less slack).
const MAX_OVERLAY_DATA: usize = 4000;

/// The overlay mount options for layers held open as descriptors: each
/// directory is named under `/proc/self/fd/N`, so the options (which the
/// sandbox reads in its mountinfo) carry no host path, and a long chain stays
/// short. `lowers` is topmost first, as overlayfs lists them.
pub fn overlay_data(lowers: &[String], upper: &str, work: &str) -> SetupResult<String> {
    if lowers.is_empty() {
        return Err("a sandbox needs at least one image layer".into());
    }
    let data = format!("lowerdir={},upperdir={upper},workdir={work}", lowers.join(":"));
    if data.len() >= MAX_OVERLAY_DATA {
        return Err(format!("layer chain too deep for one overlay mount ({} layers)", lowers.len()).into());
    }
    Ok(data)
}

/// A sandbox's user namespace while its root is built (see [`mount_overlay`]).
#[derive(Debug, Clone, Copy)]
pub struct Idmap<'a> {
    /// The namespace.
    pub userns: BorrowedFd<'a>,
    /// Host uid and gid of the sandbox's root.
    pub host_root: u32,
}

/// Mounts the overlay of `lower` (bottom first), `upper` and `work` on
/// `target`, naming each directory by a descriptor held for the call (see
/// [`overlay_data`]).
///
/// With an [`Idmap`], each layer is a detached mount idmapped through the
/// sandbox's user namespace (files owned by `n` on disk show as owned by
/// `host_root + n`), the upper and work directories through one such mount of
/// their common parent (overlayfs wants them on one mount), and the caller
/// must have set its file-system ids to `host_root` ([`Sys::set_fs_ids`]):
/// overlayfs creates its work files and copies up as the mounter, so what it
/// writes to the upper layer lands on disk owned by in-sandbox ids. Checkpoints,
/// diffs and templates of the upper layer then read exactly as without a user
/// namespace. Detached mounts as overlay layers need Linux 6.15.
pub fn mount_overlay(
    sys: &dyn Sys,
    lower_bottom_first: &[PathBuf],
    upper: &Path,
    work: &Path,
    target: &Path,
    idmap: Option<Idmap<'_>>,
) -> SetupResult<()> {
    use std::os::fd::AsRawFd;
    let open = |p: &Path| -> SetupResult<std::os::fd::OwnedFd> {
        if let Some(m) = idmap {
            let tree = sys
                .open_tree(p, crate::sys::OPEN_TREE_CLONE | libc::O_CLOEXEC as u32)
                .map_err(ctx(format!("open_tree {}", p.display())))?;
            sys.idmap_mount(tree.as_fd(), m.userns)
                .map_err(|e| format!("idmap {}: {e} (user namespaces need Linux >= 6.15 and a file system that supports idmapped mounts)", p.display()))?;
            return Ok(tree);
        }
        let fd = nix::fcntl::open(
            p,
            nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(ctx(format!("open layer {}", p.display())))?;
        // SAFETY: open returned a new descriptor that nothing else owns.
        Ok(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
    };
    let lowers = lower_bottom_first.iter().rev().map(|p| open(p)).collect::<SetupResult<Vec<_>>>()?;
    let lower_names: Vec<String> = lowers.iter().map(|f| format!("/proc/self/fd/{}", f.as_raw_fd())).collect();
    let (_held, upper_name, work_name) = match idmap {
        None => {
            let (u, w) = (open(upper)?, open(work)?);
            let names = (format!("/proc/self/fd/{}", u.as_raw_fd()), format!("/proc/self/fd/{}", w.as_raw_fd()));
            (vec![u, w], names.0, names.1)
        }
        Some(_) => {
            let (Some(parent), Some(u), Some(w)) = (upper.parent(), upper.file_name(), work.file_name()) else {
                return Err(format!("upper directory {} has no parent", upper.display()).into());
            };
            if work.parent() != Some(parent) {
                return Err(
                    format!("upper {} and work {} must share a directory", upper.display(), work.display()).into()
                );
            }
            let both = open(parent)?;
            let at = format!("/proc/self/fd/{}", both.as_raw_fd());
            let names = (format!("{at}/{}", u.to_string_lossy()), format!("{at}/{}", w.to_string_lossy()));
            (vec![both], names.0, names.1)
        }
    };
    let data = overlay_data(&lower_names, &upper_name, &work_name)?;
    mnt(sys, "overlay", target, Some("overlay"), MsFlags::empty(), Some(&data))
}

/// Makes sure `root/name` is a real directory (creating it), never a symlink
/// planted by the image.
fn mount_point(root: &Path, rel: &str) -> SetupResult<PathBuf> {
    let p = root.join(rel);
    match fs::symlink_metadata(&p) {
        Ok(m) if m.file_type().is_symlink() => {
            Err(SetupError::Image(format!("refusing to mount on /{rel}: it is a symlink in the image")))
        }
        Ok(m) if m.is_dir() => Ok(p),
        Ok(_) => Err(SetupError::Image(format!("refusing to mount on /{rel}: not a directory in the image"))),
        Err(_) => {
            fs::create_dir(&p).map_err(ctx(format!("mkdir /{rel}")))?;
            Ok(p)
        }
    }
}

fn mnt(
    sys: &dyn Sys,
    src: &str,
    target: &Path,
    fstype: Option<&str>,
    flags: MsFlags,
    data: Option<&str>,
) -> SetupResult<()> {
    Ok(sys
        .mount(Some(Path::new(src)), target, fstype, flags, data)
        .map_err(ctx(format!("mount {src} on {}", target.display())))?)
}

const DEVICES: [(&str, u64, u64); 6] =
    [("null", 1, 3), ("zero", 1, 5), ("full", 1, 7), ("random", 1, 8), ("urandom", 1, 9), ("tty", 5, 0)];

/// Paths hidden from the sandbox (bound to /dev/null or an empty read-only
/// tmpfs): runc's and gVisor's defaults, and more kernel state a sandbox has
/// no use for and an exploit has (heap layout, kernel build notes and the
/// vmcore note's physical address, key owners, RAPL energy counters, whose
/// readings leak what other tenants compute).
const MASKED: [&str; 22] = [
    "proc/kcore",
    "proc/keys",
    "proc/key-users",
    "proc/timer_list",
    "proc/timer_stats",
    "proc/sched_debug",
    "proc/latency_stats",
    "proc/slabinfo",
    "proc/vmallocinfo",
    "proc/pagetypeinfo",
    "proc/kpagecount",
    "proc/kpageflags",
    "proc/kpagecgroup",
    "proc/acpi",
    "proc/asound",
    "proc/scsi",
    "sys/firmware",
    "sys/kernel/vmcoreinfo",
    "sys/kernel/notes",
    "sys/kernel/debug",
    "sys/kernel/security",
    "sys/devices/virtual/powercap",
];
/// Paths made read-only.
const READ_ONLY: [&str; 5] = ["proc/bus", "proc/fs", "proc/irq", "proc/sys", "proc/sysrq-trigger"];

/// Size option of the sandbox's /tmp tmpfs: its pages are charged to the
/// sandbox's memory cgroup, and the size caps it at the memory limit (half of
/// the host's RAM, the kernel default, made explicit, without one).
pub fn tmp_size(memory_bytes: Option<u64>) -> String {
    match memory_bytes {
        Some(b) => format!("size={}k", b.div_ceil(1024).max(1024)),
        None => "size=50%".into(),
    }
}

/// Where a sandbox's root overlay comes from when its pid 1 builds the tree.
#[derive(Debug, Clone, Copy)]
pub enum RootSource<'a> {
    /// Pid 1 (host root, reduced later) mounts the overlay of these layers itself.
    Overlay {
        /// Read-only layers, bottom first.
        lower: &'a [PathBuf],
        /// The writable layer.
        upper: &'a Path,
        /// Overlay work directory.
        work: &'a Path,
    },
    /// A sandbox in a user namespace of its own: the host mounted the overlay
    /// (idmapped, [`mount_user_root`]) before the sandbox's namespaces were
    /// made and made it pid 1's working directory, so pid 1 inherits it. It
    /// attaches a copy of it onto itself and enters that (a mount inherited
    /// from a more privileged namespace is locked, and pivot_root refuses
    /// it), through descriptors only (the host path of the root lies in the
    /// state directory, closed to the sandbox's ids), and binds the host's
    /// device nodes into /dev (mknod takes host privileges). The root path
    /// given with it is `.`.
    Inherited,
}

/// For a sandbox in a user namespace: enters a private mount namespace of
/// the host's (the caller's) and mounts the overlay of `lower`, `upper` and
/// `work` on `target` with every layer idmapped through `idmap`, writing as
/// the sandbox's root ([`mount_overlay`]). The sandbox's own mount namespace,
/// made next from inside its user namespace, starts as a copy of this one.
pub fn mount_user_root(
    sys: &dyn Sys,
    lower: &[PathBuf],
    upper: &Path,
    work: &Path,
    target: &Path,
    idmap: Idmap<'_>,
) -> SetupResult<()> {
    sys.unshare(nix::sched::CloneFlags::CLONE_NEWNS).map_err(ctx("unshare the host-side mount namespace"))?;
    sys.mount(None, Path::new("/"), None, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None)
        .map_err(ctx("make / private"))?;
    sys.set_fs_ids(idmap.host_root).map_err(ctx("set the file-system ids to the sandbox root's"))?;
    mount_overlay(sys, lower, upper, work, target, Some(idmap))
}

/// What a sandbox has at `/tmp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TmpMount {
    /// A directory of its root (the writable layer keeps it): the image's,
    /// else a new one, mode 1777.
    Root,
    /// A tmpfs, capped at the memory limit (`None`: half the host's RAM).
    Tmpfs(Option<u64>),
}

impl TmpMount {
    /// The `/tmp` a sandbox of `spec` has.
    pub fn of(spec: &crate::spec::SandboxSpec) -> TmpMount {
        match spec.tmp {
            strata_api::TmpStorage::Disk => TmpMount::Root,
            strata_api::TmpStorage::Tmpfs => TmpMount::Tmpfs(spec.limits.memory_bytes),
        }
    }
}

/// Mounts the sandbox's root (see [`RootSource`]) and the pseudo-filesystems
/// under it, and gives it its `/tmp` ([`TmpMount`]). Must run in a fresh
/// mount (and pid) namespace.
pub fn build_rootfs(sys: &dyn Sys, source: RootSource<'_>, root: &Path, tmp: TmpMount) -> SetupResult<()> {
    sys.mount(None, Path::new("/"), None, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None)
        .map_err(ctx("make / private"))?;
    let inherited = match source {
        RootSource::Overlay { lower, upper, work } => {
            mount_overlay(sys, lower, upper, work, root, None)?;
            false
        }
        RootSource::Inherited => {
            use std::os::fd::AsRawFd;
            let flags = crate::sys::OPEN_TREE_CLONE | crate::sys::AT_RECURSIVE | libc::O_CLOEXEC as u32;
            let copy = sys.open_tree(root, flags).map_err(ctx("copy the inherited root"))?;
            sys.move_mount(copy.as_fd(), root).map_err(ctx("attach the root's copy onto it"))?;
            // The descriptor now names the attached copy: enter it.
            sys.chdir(Path::new(&format!("/proc/self/fd/{}", copy.as_raw_fd())))
                .map_err(ctx("enter the root's copy"))?;
            true
        }
    };

    let nosuid_nodev_noexec = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mnt(sys, "proc", &mount_point(root, "proc")?, Some("proc"), nosuid_nodev_noexec, None)?;

    let dev = mount_point(root, "dev")?;
    mnt(
        sys,
        "tmpfs",
        &dev,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC | MsFlags::MS_STRICTATIME,
        Some("mode=755,size=65536k"),
    )?;
    for (name, major, minor) in DEVICES {
        let p = dev.join(name);
        if inherited {
            // The host's node, bound onto an empty file: the same device, and
            // a file the sandbox's root cannot chmod or chown (host root owns it).
            fs::write(&p, b"").map_err(ctx(format!("create /dev/{name}")))?;
            sys.mount(Some(&Path::new("/dev").join(name)), &p, None, MsFlags::MS_BIND, None)
                .map_err(ctx(format!("bind the host's /dev/{name}")))?;
            continue;
        }
        sys.mknod(&p, SFlag::S_IFCHR, Mode::from_bits_truncate(0o666), makedev(major, minor))
            .map_err(ctx(format!("mknod /dev/{name}")))?;
        // mknod honours the umask; set the mode explicitly.
        sys.chmod(&p, 0o666).map_err(std::io::Error::from).map_err(ctx(format!("chmod /dev/{name}")))?;
    }
    for (link, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
    ] {
        symlink(target, dev.join(link)).map_err(ctx(format!("symlink /dev/{link}")))?;
    }
    for d in ["pts", "shm", "mqueue"] {
        fs::create_dir(dev.join(d)).map_err(ctx(format!("mkdir /dev/{d}")))?;
    }
    mnt(
        sys,
        "devpts",
        &dev.join("pts"),
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
    )?;
    mnt(sys, "shm", &dev.join("shm"), Some("tmpfs"), nosuid_nodev_noexec, Some("mode=1777,size=65536k"))?;
    mnt(sys, "mqueue", &dev.join("mqueue"), Some("mqueue"), nosuid_nodev_noexec, None)?;

    mnt(sys, "sysfs", &mount_point(root, "sys")?, Some("sysfs"), nosuid_nodev_noexec | MsFlags::MS_RDONLY, None)?;
    match tmp {
        TmpMount::Tmpfs(memory_bytes) => mnt(
            sys,
            "tmpfs",
            &mount_point(root, "tmp")?,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(&format!("mode=1777,{}", tmp_size(memory_bytes))),
        )?,
        // The image's /tmp as it is (a symlink or a file included); a missing one is made.
        TmpMount::Root => {
            let p = root.join("tmp");
            if fs::symlink_metadata(&p).is_err() {
                fs::create_dir(&p).map_err(ctx("mkdir /tmp"))?;
                sys.chmod(&p, 0o1777).map_err(ctx("chmod /tmp"))?;
            }
        }
    }

    // Directories are covered by one empty read-only tmpfs, bound to each after
    // the first: CRIU saves (tar + gzip, two processes) and restores the
    // contents of every tmpfs it finds, each costing ~5 ms of a standby and of
    // a resume; binds of one are saved once.
    let mut empty_dir: Option<PathBuf> = None;
    for rel in MASKED {
        let p = root.join(rel);
        let Ok(meta) = fs::symlink_metadata(&p) else { continue };
        if meta.is_dir() {
            match &empty_dir {
                Some(first) => {
                    sys.mount(Some(first), &p, None, MsFlags::MS_BIND, None).map_err(ctx(format!("mask /{rel}")))?
                }
                None => {
                    mnt(sys, "tmpfs", &p, Some("tmpfs"), MsFlags::MS_RDONLY, Some("size=0"))?;
                    empty_dir = Some(p);
                }
            }
        } else {
            sys.mount(Some(&dev.join("null")), &p, None, MsFlags::MS_BIND, None)
                .map_err(ctx(format!("mask /{rel}")))?;
        }
    }
    for rel in READ_ONLY {
        let p = root.join(rel);
        if fs::symlink_metadata(&p).is_err() {
            continue;
        }
        sys.mount(Some(&p), &p, None, MsFlags::MS_BIND | MsFlags::MS_REC, None).map_err(ctx(format!("bind /{rel}")))?;
        sys.mount(
            None,
            &p,
            None,
            MsFlags::MS_BIND
                | MsFlags::MS_REMOUNT
                | MsFlags::MS_RDONLY
                | MsFlags::MS_NOSUID
                | MsFlags::MS_NODEV
                | MsFlags::MS_NOEXEC,
            None,
        )
        .map_err(ctx(format!("read-only /{rel}")))?;
    }
    Ok(())
}

/// Makes `root` the root of the mount namespace and detaches the old root
/// (stacked on the new one by `pivot_root(".", ".")`).
pub fn pivot_into(sys: &dyn Sys, root: &Path) -> SetupResult<()> {
    let here = Path::new(".");
    sys.chdir(root).map_err(ctx("chdir to new root"))?;
    sys.pivot_root(here, here).map_err(ctx("pivot_root"))?;
    sys.umount2(here, MntFlags::MNT_DETACH).map_err(ctx("detach old root"))?;
    sys.chdir(Path::new("/")).map_err(ctx("chdir /"))?;
    Ok(())
}

/// Paths (relative to the sandbox root) that strata manages per sandbox: they
/// live on the /run/strata tmpfs (bind-mounted over /etc), are regenerated at
/// every start, and are never captured in diffs, exports or checkpoints.
///
/// `run/secrets` is the mount point of the secrets tmpfs ([`mount_secrets`]):
/// its contents never reach the writable layer, and the empty directory is
/// excluded too.
pub const IDENTITY_PATHS: [&str; 5] = ["etc/hostname", "etc/hosts", "etc/machine-id", "run/strata", "run/secrets"];

/// Gives the sandbox its identity (after pivot_root, so symlinks in the image
/// resolve inside the sandbox): a tmpfs at /run/strata holding sandbox-id,
/// generation, hostname, hosts and machine-id, the last three bind-mounted over
/// /etc/hostname, /etc/hosts and /etc/machine-id. Forks get fresh values here,
/// and nothing of it lands in the writable layer. `root` is the sandbox's root
/// as seen now (`/` after the pivot; see [`Sys::root_after_pivot`]).
pub fn write_identity_files(
    sys: &dyn Sys,
    root: &Path,
    hostname: &str,
    sandbox_id: &str,
    machine_id: &str,
    generation: u32,
) -> SetupResult<()> {
    let run_strata = root.join("run/strata");
    match fs::create_dir_all(&run_strata) {
        Ok(()) => {}
        // A file (or a symlink to one) where /run or /run/strata must be a directory.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTDIR | libc::EEXIST)) => {
            return Err(SetupError::Image(format!("the image has no usable /run directory (mkdir /run/strata: {e}); strata keeps the sandbox's identity files and its init there")));
        }
        Err(e) => return Err(format!("mkdir /run/strata: {e}").into()),
    }
    mnt(
        sys,
        "tmpfs",
        &run_strata,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("mode=755,size=1m"),
    )?;
    let etc = root.join("etc");
    let hosts = etc.is_dir().then(|| fs::read_to_string(etc.join("hosts")).unwrap_or_default());
    for (name, content) in identity_files(hosts.as_deref(), hostname, sandbox_id, machine_id, generation) {
        fs::write(run_strata.join(name), content).map_err(ctx(format!("write /run/strata/{name}")))?;
    }
    bind_boot_id(sys, root, &run_strata)?;
    if hosts.is_none() {
        return Ok(());
    }
    for name in ETC_IDENTITY_FILES {
        let target = etc.join(name);
        match fs::symlink_metadata(&target) {
            Ok(m) if m.is_file() => {}
            Ok(_) => continue, // a symlink or directory in the image: leave it alone
            Err(_) => {
                fs::write(&target, b"").map_err(ctx(format!("create /etc/{name}")))?;
            }
        }
        sys.mount(Some(&run_strata.join(name)), &target, None, MsFlags::MS_BIND, None)
            .map_err(ctx(format!("bind /etc/{name}")))?;
    }
    Ok(())
}

/// Where the kernel shows its boot id (one per host boot, the same in every
/// namespace), relative to the sandbox root.
pub const BOOT_ID: &str = "proc/sys/kernel/random/boot_id";

/// A fresh random boot id (the kernel makes a new UUID at each read of this file).
fn new_boot_id() -> Result<String, String> {
    fs::read_to_string("/proc/sys/kernel/random/uuid").map_err(|e| format!("read /proc/sys/kernel/random/uuid: {e}"))
}

/// Gives the sandbox a boot id of its own: a new one at every start (a
/// filesystem-only resume is a reboot and gets a new one; a process restore
/// brings back the file, and so the id, it had), written to
/// /run/strata/boot_id and bound over the kernel's [`BOOT_ID`] (read-only
/// there, as /proc/sys is).
fn bind_boot_id(sys: &dyn Sys, root: &Path, run_strata: &Path) -> SetupResult<()> {
    let target = root.join(BOOT_ID);
    if !fs::symlink_metadata(&target).is_ok_and(|m| m.is_file()) {
        return Ok(()); // no proc mounted here (unit tests) or a kernel without it
    }
    let file = run_strata.join("boot_id");
    fs::write(&file, new_boot_id()?).map_err(ctx("write /run/strata/boot_id"))?;
    sys.mount(Some(&file), &target, None, MsFlags::MS_BIND, None)
        .map_err(ctx("bind /proc/sys/kernel/random/boot_id"))?;
    Ok(())
}

/// Creates, in the root at `root` (not entered: every path is resolved inside
/// it with `openat2(RESOLVE_IN_ROOT)`, so the tree's own symlinks cannot lead
/// out), the mount points of the identity mounts that checkpoints leave out
/// ([`IDENTITY_PATHS`]): `/run/strata`, and `/etc/hostname`, `/etc/hosts` and
/// `/etc/machine-id` when `/etc` exists. A sandbox restored from another
/// sandbox's process image needs them where CRIU re-mounts its tree.
pub fn ensure_identity_mountpoints(root: &Path) -> Result<(), String> {
    use crate::openat2::{openat2, RESOLVE_IN_ROOT, RESOLVE_NO_MAGICLINKS};
    use std::os::fd::AsRawFd;
    let root_fd = fs::File::open(root).map_err(|e| format!("open {}: {e}", root.display()))?;
    let resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
    let dir = |rel: &str| openat2(root_fd.as_raw_fd(), rel, libc::O_PATH | libc::O_DIRECTORY, 0, resolve);
    let run = match dir("run") {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            nix::sys::stat::mkdirat(Some(root_fd.as_raw_fd()), "run", Mode::from_bits_truncate(0o755))
                .map_err(|e| format!("mkdir /run: {e}"))?;
            dir("run").map_err(|e| format!("open /run: {e}"))?
        }
        Err(e) => return Err(format!("open /run: {e}")),
    };
    match nix::sys::stat::mkdirat(Some(run.as_raw_fd()), "strata", Mode::from_bits_truncate(0o755)) {
        Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
        Err(e) => return Err(format!("mkdir /run/strata: {e}")),
    }
    let Ok(etc) = dir("etc") else { return Ok(()) };
    for name in ETC_IDENTITY_FILES {
        let flags = nix::fcntl::OFlag::O_CREAT
            | nix::fcntl::OFlag::O_EXCL
            | nix::fcntl::OFlag::O_WRONLY
            | nix::fcntl::OFlag::O_NOFOLLOW
            | nix::fcntl::OFlag::O_CLOEXEC;
        match nix::fcntl::openat(Some(etc.as_raw_fd()), name, flags, Mode::from_bits_truncate(0o644)) {
            Ok(fd) => {
                let _ = nix::unistd::close(fd);
            }
            Err(nix::errno::Errno::EEXIST) => {}
            Err(e) => return Err(format!("create /etc/{name}: {e}")),
        }
    }
    Ok(())
}

/// The files of /etc that strata binds from the sandbox's /run/strata.
pub const ETC_IDENTITY_FILES: [&str; 3] = ["hostname", "hosts", "machine-id"];

/// The contents of a sandbox's /run/strata identity files, by name:
/// `sandbox-id` and `generation` always; `hosts`, `hostname` and
/// `machine-id` when the image has an /etc (`image_hosts`: its /etc/hosts,
/// empty when missing), to be bound over the image's files.
pub fn identity_files(
    image_hosts: Option<&str>,
    hostname: &str,
    sandbox_id: &str,
    machine_id: &str,
    generation: u32,
) -> Vec<(&'static str, String)> {
    let mut files = vec![("sandbox-id", format!("{sandbox_id}\n")), ("generation", format!("{generation}\n"))];
    if let Some(hosts) = image_hosts {
        let mut new = String::new();
        if !hosts.lines().any(|l| l.split_whitespace().skip(1).any(|n| n == "localhost")) {
            new.push_str("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n");
        }
        new.push_str(&hosts_with(hosts, hostname));
        files.push(("hosts", new));
        files.push(("hostname", format!("{hostname}\n")));
        files.push(("machine-id", format!("{machine_id}\n")));
    }
    files
}

/// The `127.0.1.1 <hostname>` line of `hosts`, replaced (or added).
fn hosts_with(hosts: &str, hostname: &str) -> String {
    let mut new: String = hosts.lines().filter(|l| !l.starts_with("127.0.1.1")).map(|l| format!("{l}\n")).collect();
    new.push_str(&format!("127.0.1.1\t{hostname}\n"));
    new
}

/// After a restore of processes copied from another sandbox: rewrites the
/// identity files in the restored sandbox's /run/strata (in place: the bind
/// mounts over /etc/hostname, /etc/hosts and /etc/machine-id show the new
/// contents) and sets its hostname. The files are reached through
/// `/proc/<init>/root` with `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS)`:
/// whatever the copied workload left there, no write leaves the sandbox.
pub fn reidentify(
    sys: &dyn Sys,
    init_pid: i32,
    hostname: &str,
    sandbox_id: &str,
    machine_id: &str,
    generation: u32,
) -> Result<(), String> {
    use crate::openat2::{open_regular, RESOLVE_IN_ROOT, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS};
    use std::io::{Read, Seek, Write};
    let root = fs::File::open(format!("/proc/{init_pid}/root"))
        .map_err(|e| format!("open the root of pid {init_pid}: {e}"))?;
    let resolve = RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    // Only regular files are opened (checked through an O_PATH descriptor first).
    let open = |name: &str| -> Result<Option<fs::File>, String> {
        match open_regular(
            std::os::fd::AsRawFd::as_raw_fd(&root),
            &format!("run/strata/{name}"),
            libc::O_RDWR | libc::O_NONBLOCK,
            resolve,
        ) {
            Ok(f) => Ok(Some(f)),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(format!("open /run/strata/{name}: {e}")),
        }
    };
    let put = |name: &str, content: &str| -> Result<(), String> {
        if let Some(mut f) = open(name)? {
            f.set_len(0)
                .and_then(|_| f.rewind())
                .and_then(|_| f.write_all(content.as_bytes()))
                .map_err(|e| format!("write /run/strata/{name}: {e}"))?;
        }
        Ok(())
    };
    put("sandbox-id", &format!("{sandbox_id}\n"))?;
    put("generation", &format!("{generation}\n"))?;
    put("hostname", &format!("{hostname}\n"))?;
    put("machine-id", &format!("{machine_id}\n"))?;
    // A copy of a running sandbox is another machine: it gets a boot id of its own.
    put("boot_id", &new_boot_id()?)?;
    if let Some(mut f) = open("hosts")? {
        let mut old = String::new();
        let _ = Read::take(&mut f, 1 << 20).read_to_string(&mut old);
        let new = hosts_with(&old, hostname);
        f.set_len(0)
            .and_then(|_| f.rewind())
            .and_then(|_| f.write_all(new.as_bytes()))
            .map_err(|e| format!("write /run/strata/hosts: {e}"))?;
    }
    // The UTS namespace is per thread: join it from a thread of its own, which then ends.
    let uts = fs::File::open(format!("/proc/{init_pid}/ns/uts"))
        .map_err(|e| format!("open the UTS namespace of pid {init_pid}: {e}"))?;
    std::thread::scope(|s| {
        s.spawn(|| -> Result<(), String> {
            sys.setns(uts.as_fd(), nix::sched::CloneFlags::CLONE_NEWUTS)
                .map_err(|e| format!("join the UTS namespace: {e}"))?;
            sys.sethostname(hostname).map_err(|e| format!("sethostname {hostname}: {e}"))
        })
        .join()
    })
    .map_err(|_| "the hostname thread panicked".to_string())?
}

/// Binds `/run/strata/resolv.conf` (holding `content`) over /etc/resolv.conf
/// (created when the image has none; a symlink there is replaced by the
/// file, since it would point at a host-specific resolver anyway). `root` is
/// the sandbox's root as seen now (`/` after the pivot).
pub fn bind_resolv_conf(sys: &dyn Sys, root: &Path, content: &str) -> SetupResult<()> {
    let source = root.join("run/strata/resolv.conf");
    fs::write(&source, content).map_err(ctx("write /run/strata/resolv.conf"))?;
    let etc = root.join("etc");
    let target = etc.join("resolv.conf");
    if !etc.is_dir() {
        return Ok(());
    }
    match fs::symlink_metadata(&target) {
        Ok(m) if m.is_file() => {}
        Ok(m) if m.is_dir() => return Ok(()),
        Ok(_) => {
            fs::remove_file(&target).map_err(ctx("remove the /etc/resolv.conf symlink"))?;
            fs::write(&target, b"").map_err(ctx("create /etc/resolv.conf"))?;
        }
        Err(_) => fs::write(&target, b"").map_err(ctx("create /etc/resolv.conf"))?,
    }
    sys.mount(Some(&source), &target, None, MsFlags::MS_BIND, None).map_err(ctx("bind /etc/resolv.conf"))?;
    Ok(())
}

/// The uid and gid that own a sandbox's secret files: `owner` (the image's
/// default user) resolved against the sandbox's passwd and group files; root
/// when absent or unknown.
pub fn secrets_owner(owner: Option<&str>, passwd: &str, group: &str) -> (u32, u32) {
    match owner.filter(|o| !o.is_empty()).map(|o| crate::namespace::user::resolve(Some(o), passwd, group)) {
        Some(Ok(u)) => (u.uid, u.gid),
        _ => (0, 0),
    }
}

/// Mounts a tmpfs on `dir` holding one file per secret (mode 0400, directory
/// 0500, both owned by `owner`), then makes it read-only. nosuid, nodev,
/// noexec; sized to its contents.
pub fn fill_secrets(
    sys: &dyn Sys,
    dir: &Path,
    secrets: &[crate::spec::SecretFile],
    owner: (u32, u32),
) -> SetupResult<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let bytes: usize = secrets.iter().map(|s| s.data.len().div_ceil(4096) * 4096 + 4096).sum::<usize>() + 4096;
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let opts = format!("mode=0500,uid={},gid={},size={bytes},nr_inodes={}", owner.0, owner.1, secrets.len() + 16);
    mnt(sys, "tmpfs", dir, Some("tmpfs"), flags, Some(&opts))?;
    for s in secrets {
        if !strata_api::valid_secret_name(&s.name) {
            return Err(format!("invalid secret name {:?}", s.name).into());
        }
        let p = dir.join(&s.name);
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o400)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&p)
            .map_err(ctx(format!("create secret {}", s.name)))?;
        f.write_all(&s.data).map_err(ctx(format!("write secret {}", s.name)))?;
        sys.fchown(f.as_fd(), owner.0, owner.1)
            .map_err(std::io::Error::from)
            .map_err(ctx(format!("chown secret {}", s.name)))?;
    }
    sys.mount(None, dir, None, flags | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY, Some(opts.as_str()))
        .map_err(ctx(format!("read-only {}", dir.display())))?;
    Ok(())
}

/// Mounts the secrets tmpfs at [`crate::spec::SECRETS_DIR`] inside the
/// sandbox (after pivot_root; the mount point must be a real directory, never
/// a symlink planted by the image). The owner is resolved against the
/// sandbox's own /etc/passwd and /etc/group. `root` is the sandbox's root as
/// seen now (`/` after the pivot).
pub fn mount_secrets(
    sys: &dyn Sys,
    root: &Path,
    secrets: &[crate::spec::SecretFile],
    owner: Option<&str>,
) -> SetupResult<()> {
    if secrets.is_empty() {
        return Ok(());
    }
    let dir = root.join(crate::spec::SECRETS_DIR.trim_start_matches('/'));
    match fs::symlink_metadata(&dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(SetupError::Image(format!(
                "refusing to mount secrets on {}: not a directory in the image",
                dir.display()
            )))
        }
        Err(_) => {
            let run = root.join("run");
            if fs::symlink_metadata(run).is_ok_and(|m| !m.is_dir()) {
                return Err(SetupError::Image(
                    "refusing to mount secrets: /run is not a directory in the image".into(),
                ));
            }
            fs::create_dir_all(&dir).map_err(ctx(format!("mkdir {}", dir.display())))?;
        }
    }
    let passwd = fs::read_to_string(root.join("etc/passwd")).unwrap_or_default();
    let group = fs::read_to_string(root.join("etc/group")).unwrap_or_default();
    fill_secrets(sys, &dir, secrets, secrets_owner(owner, &passwd, &group))
}

/// A detached bind mount of the `strata-init` binary `exe` (`open_tree`
/// clone), taken before pivot_root hides the host; [`attach_helper`] places it.
pub fn clone_helper_mount(sys: &dyn Sys, exe: &Path) -> SetupResult<std::os::fd::OwnedFd> {
    let flags = crate::sys::OPEN_TREE_CLONE | libc::O_CLOEXEC as u32;
    sys.open_tree(exe, flags).map_err(|e| format!("open_tree {}: {}", exe.display(), std::io::Error::from(e)).into())
}

/// Attaches the detached helper mount on `target` (a file it creates on the
/// /run/strata tmpfs) and makes it read-only; after pivot_root. `tree` stays
/// valid: it then names the attached mount (pid 1 executes it).
pub fn attach_helper(sys: &dyn Sys, tree: &std::os::fd::OwnedFd, target: &Path) -> SetupResult<()> {
    let shown = target.display();
    fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(target)
        .map_err(ctx(format!("create {shown}")))?;
    sys.move_mount(tree.as_fd(), target)
        .map_err(|e| format!("attach the helper on {shown}: {}", std::io::Error::from(e)))?;
    sys.mount(
        None,
        target,
        None,
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        None,
    )
    .map_err(ctx(format!("read-only {shown}")))?;
    Ok(())
}

/// Brings the loopback interface of the (new) network namespace up.
pub fn loopback_up(sys: &dyn Sys) -> SetupResult<()> {
    sys.loopback_up().map_err(|e| format!("bring up lo: {}", std::io::Error::from(e)).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_get_exactly_one_line_for_the_hostname() {
        let old = "127.0.0.1\tlocalhost\n127.0.1.1\tparent\n10.0.0.1 db\n";
        assert_eq!(hosts_with(old, "child"), "127.0.0.1\tlocalhost\n10.0.0.1 db\n127.0.1.1\tchild\n");
        assert_eq!(hosts_with("", "x"), "127.0.1.1\tx\n");
    }

    #[test]
    fn tmp_is_capped_by_the_memory_limit() {
        assert_eq!(tmp_size(Some(64 << 20)), "size=65536k");
        assert_eq!(tmp_size(Some(1000)), "size=1024k");
        assert_eq!(tmp_size(None), "size=50%");
    }

    #[test]
    fn overlay_data_names_descriptors_only() {
        let fd = |n: i32| format!("/proc/self/fd/{n}");
        assert_eq!(
            overlay_data(&[fd(7), fd(5)], &fd(8), &fd(9)).unwrap(),
            "lowerdir=/proc/self/fd/7:/proc/self/fd/5,upperdir=/proc/self/fd/8,workdir=/proc/self/fd/9"
        );
        assert!(overlay_data(&[], &fd(8), &fd(9)).is_err());
        let deep: Vec<String> = (100..400).map(fd).collect();
        assert!(overlay_data(&deep, &fd(8), &fd(9)).unwrap_err().to_string().contains("too deep"));
    }

    #[test]
    fn secret_files_belong_to_the_image_user_or_root() {
        let passwd = "root:x:0:0::/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\n";
        let group = "root:x:0:\napp:x:1001:\nstaff:x:50:\n";
        assert_eq!(secrets_owner(Some("app"), passwd, group), (1000, 1001));
        assert_eq!(secrets_owner(Some("app:staff"), passwd, group), (1000, 50));
        assert_eq!(secrets_owner(Some("1234"), passwd, group), (1234, 1234));
        assert_eq!(secrets_owner(Some("nobody-here"), passwd, group), (0, 0));
        assert_eq!(secrets_owner(None, passwd, group), (0, 0));
        assert_eq!(secrets_owner(Some(""), passwd, group), (0, 0));
    }

    // ---- the setup sequences, against RecordingSys (no root needed) ----

    use crate::sys::{RecordingSys, SysCall};
    use nix::errno::Errno;

    /// A temporary tree: `l1`, `l2` (bottom first), `up`, `wk` and the root `root`.
    struct Tree {
        _dir: tempfile::TempDir,
        lower: Vec<PathBuf>,
        upper: PathBuf,
        work: PathBuf,
        root: PathBuf,
    }

    fn tree() -> Tree {
        let dir = tempfile::tempdir().unwrap();
        let d = |n: &str| {
            let p = dir.path().join(n);
            fs::create_dir(&p).unwrap();
            p
        };
        let lower = vec![d("l1"), d("l2")];
        let (upper, work, root) = (d("up"), d("wk"), d("root"));
        Tree { _dir: dir, lower, upper, work, root }
    }

    fn described(sys: &RecordingSys, root: &Path) -> Vec<String> {
        sys.calls().iter().map(|c| c.describe(root)).collect()
    }

    #[test]
    fn rootfs_is_built_in_order_with_its_flags_and_options() {
        let t = tree();
        // What the image has under the pseudo-filesystems decides what is masked
        // or made read-only: plant a few (the fake mounts nothing there).
        fs::create_dir_all(t.root.join("proc/acpi")).unwrap();
        fs::create_dir_all(t.root.join("proc/sys")).unwrap();
        fs::create_dir_all(t.root.join("sys/firmware")).unwrap();
        fs::write(t.root.join("proc/kcore"), b"").unwrap();
        fs::write(t.root.join("proc/sysrq-trigger"), b"").unwrap();
        let sys = RecordingSys::new();
        let source = RootSource::Overlay { lower: &t.lower, upper: &t.upper, work: &t.work };
        build_rootfs(&sys, source, &t.root, TmpMount::Tmpfs(Some(64 << 20))).unwrap();
        let got = described(&sys, &t.root);
        let mut want: Vec<String> = vec![
            "mount - / - PRIVATE|REC -".into(),
            "OVERLAY".into(), // checked below: descriptor numbers vary
            "mount proc $ROOT/proc proc NODEV|NOEXEC|NOSUID -".into(),
            "mount tmpfs $ROOT/dev tmpfs NOEXEC|NOSUID|STRICTATIME mode=755,size=65536k".into(),
        ];
        for (name, major, minor) in DEVICES {
            want.push(format!("mknod $ROOT/dev/{name} CHR 666 {major}:{minor}"));
            want.push(format!("chmod $ROOT/dev/{name} 666"));
        }
        want.extend(
            [
                "mount devpts $ROOT/dev/pts devpts NOEXEC|NOSUID newinstance,ptmxmode=0666,mode=0620",
                "mount shm $ROOT/dev/shm tmpfs NODEV|NOEXEC|NOSUID mode=1777,size=65536k",
                "mount mqueue $ROOT/dev/mqueue mqueue NODEV|NOEXEC|NOSUID -",
                "mount sysfs $ROOT/sys sysfs NODEV|NOEXEC|NOSUID|RDONLY -",
                "mount tmpfs $ROOT/tmp tmpfs NODEV|NOSUID mode=1777,size=65536k",
                // Masked, in MASKED's order: a file is covered by /dev/null, a
                // directory by an empty read-only tmpfs (one, bound to the others).
                "mount $ROOT/dev/null $ROOT/proc/kcore - BIND -",
                "mount tmpfs $ROOT/proc/acpi tmpfs RDONLY size=0",
                "mount $ROOT/proc/acpi $ROOT/sys/firmware - BIND -",
                // Read-only: bound onto itself, then remounted.
                "mount $ROOT/proc/sys $ROOT/proc/sys - BIND|REC -",
                "mount - $ROOT/proc/sys - BIND|NODEV|NOEXEC|NOSUID|RDONLY|REMOUNT -",
                "mount $ROOT/proc/sysrq-trigger $ROOT/proc/sysrq-trigger - BIND|REC -",
                "mount - $ROOT/proc/sysrq-trigger - BIND|NODEV|NOEXEC|NOSUID|RDONLY|REMOUNT -",
            ]
            .map(String::from),
        );
        assert_eq!(got.len(), want.len(), "{got:#?}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            if i != 1 {
                assert_eq!(g, w, "call {i}");
            }
        }
        let SysCall::Mount { source, target, fstype, flags, data } = &sys.calls()[1] else { panic!("{got:?}") };
        assert_eq!(
            (source.as_deref(), target, fstype.as_deref(), *flags),
            (Some(Path::new("overlay")), &t.root, Some("overlay"), MsFlags::empty())
        );
        let data = data.as_deref().unwrap();
        let fds = |key: &str| -> Vec<String> {
            let v = data.split(',').find_map(|kv| kv.strip_prefix(key)).unwrap();
            v.split(':').map(str::to_string).collect()
        };
        assert_eq!(fds("lowerdir=").len(), 2, "{data}");
        assert!(fds("lowerdir=")
            .iter()
            .chain(&fds("upperdir="))
            .chain(&fds("workdir="))
            .all(|f| f.strip_prefix("/proc/self/fd/").is_some_and(|n| n.parse::<u32>().is_ok())));
        // What the unprivileged part left in the tree.
        assert_eq!(fs::read_link(t.root.join("dev/fd")).unwrap(), Path::new("/proc/self/fd"));
        assert_eq!(fs::read_link(t.root.join("dev/ptmx")).unwrap(), Path::new("pts/ptmx"));
        assert!(["pts", "shm", "mqueue"].iter().all(|d| t.root.join("dev").join(d).is_dir()));
    }

    #[test]
    fn the_overlay_names_the_top_layer_first() {
        let t = tree();
        let sys = RecordingSys::new();
        // The descriptors are open only during the call: resolve them then.
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let s2 = seen.clone();
        sys.fail_when(
            move |c| {
                if let SysCall::Mount { data: Some(d), .. } = c {
                    let paths = d
                        .split([',', ':', '='])
                        .filter(|x| x.starts_with("/proc/self/fd/"))
                        .map(|x| fs::read_link(x).unwrap())
                        .collect::<Vec<_>>();
                    *s2.lock().unwrap() = paths;
                }
                false
            },
            Errno::EPERM,
        );
        mount_overlay(&sys, &t.lower, &t.upper, &t.work, &t.root, None).unwrap();
        let want = vec![t.lower[1].clone(), t.lower[0].clone(), t.upper.clone(), t.work.clone()];
        assert_eq!(*seen.lock().unwrap(), want);
    }

    #[test]
    fn in_a_user_namespace_the_host_mounts_an_idmapped_root_as_the_sandbox_root() {
        let t = tree();
        let sys = RecordingSys::new();
        let userns = fs::File::open("/proc/self/ns/user").unwrap();
        let idmap = Idmap { userns: userns.as_fd(), host_root: 1_000_065_536 };
        // The options name the upper and work directories inside one mount of their parent.
        let data = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let d2 = data.clone();
        let root = t.root.clone();
        sys.fail_when(
            move |c| {
                if let SysCall::Mount { target, data: Some(d), .. } = c {
                    if *target == root {
                        *d2.lock().unwrap() = d.clone();
                    }
                }
                false
            },
            Errno::EPERM,
        );
        mount_user_root(&sys, &t.lower, &t.upper, &t.work, &t.root, idmap).unwrap();
        let got = described(&sys, &t.root);
        let parent = t.upper.parent().unwrap().display().to_string();
        assert_eq!(
            got[..9],
            [
                "unshare NEWNS".to_string(),
                "mount - / - PRIVATE|REC -".into(),
                "set_fs_ids 1000065536".into(),
                format!("open_tree {} 0x80001", t.lower[1].display()),
                format!("idmap_mount {}", t.lower[1].display()),
                format!("open_tree {} 0x80001", t.lower[0].display()),
                format!("idmap_mount {}", t.lower[0].display()),
                format!("open_tree {parent} 0x80001"),
                format!("idmap_mount {parent}"),
            ]
        );
        assert!(got[9].starts_with("mount overlay $ROOT overlay - lowerdir=/proc/self/fd/"), "{}", got[9]);
        assert_eq!(got.len(), 10, "{got:#?}");
        let data = data.lock().unwrap().clone();
        let upper = data.split(',').find_map(|o| o.strip_prefix("upperdir=")).unwrap();
        let work = data.split(',').find_map(|o| o.strip_prefix("workdir=")).unwrap();
        assert!(upper.ends_with("/up") && work.ends_with("/wk"), "{data}");
        assert_eq!(upper.rsplit_once('/').unwrap().0, work.rsplit_once('/').unwrap().0, "one mount for both: {data}");
        // Upper and work directories that do not share a parent cannot be one mount.
        let sys = RecordingSys::new();
        let elsewhere = t.lower[0].join("wk");
        fs::create_dir(&elsewhere).unwrap();
        let err = mount_overlay(&sys, &t.lower, &t.upper, &elsewhere, &t.root, Some(idmap)).unwrap_err();
        assert!(err.to_string().contains("must share a directory"), "{err}");
    }

    #[test]
    fn an_inherited_root_is_copied_onto_itself_entered_and_gets_the_host_s_device_nodes() {
        let t = tree();
        let sys = RecordingSys::new();
        build_rootfs(&sys, RootSource::Inherited, &t.root, TmpMount::Tmpfs(None)).unwrap();
        let got = described(&sys, &t.root);
        // A recursive copy (OPEN_TREE_CLONE | AT_RECURSIVE | O_CLOEXEC) attached where
        // the root is, then entered through its descriptor: no host path is walked.
        assert_eq!(
            got[..3],
            [
                "mount - / - PRIVATE|REC -".to_string(),
                "open_tree $ROOT 0x88001".into(),
                "move_mount $ROOT $ROOT".into()
            ]
        );
        assert!(got[3].starts_with("chdir /proc/self/fd/"), "{got:#?}");
        assert!(!got.iter().any(|l| l.starts_with("mount overlay") || l.starts_with("mknod")), "{got:#?}");
        for (name, _, _) in DEVICES {
            assert!(got.contains(&format!("mount /dev/{name} $ROOT/dev/{name} - BIND -")), "{name}: {got:#?}");
            assert!(t.root.join("dev").join(name).is_file(), "the bind's mount point");
        }
    }

    #[test]
    fn a_failed_mount_stops_the_setup_with_its_context() {
        let t = tree();
        let sys = RecordingSys::new();
        let proc_dir = t.root.join("proc");
        let target = proc_dir.clone();
        sys.fail_when(move |c| c.is_mount_on(&target), Errno::EPERM);
        let err = build_rootfs(
            &sys,
            RootSource::Overlay { lower: &t.lower, upper: &t.upper, work: &t.work },
            &t.root,
            TmpMount::Root,
        )
        .unwrap_err();
        assert_eq!(
            err,
            SetupError::Host(format!("mount proc on {}: EPERM: Operation not permitted", proc_dir.display()))
        );
        // Nothing after the failed call.
        assert!(sys.calls().last().unwrap().is_mount_on(&proc_dir));
        assert_eq!(sys.names(), ["mount", "mount", "mount"]);
    }

    #[test]
    fn a_failed_chmod_names_the_device() {
        let t = tree();
        let sys = RecordingSys::new();
        sys.fail_when(|c| matches!(c, SysCall::Chmod { path, .. } if path.ends_with("zero")), Errno::EPERM);
        let err = build_rootfs(
            &sys,
            RootSource::Overlay { lower: &t.lower, upper: &t.upper, work: &t.work },
            &t.root,
            TmpMount::Root,
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "chmod /dev/zero: Operation not permitted (os error 1)");
    }

    #[test]
    fn a_symlink_where_proc_goes_is_the_images_fault_and_mounts_nothing_there() {
        let t = tree();
        std::os::unix::fs::symlink("/proc", t.root.join("proc")).unwrap();
        let sys = RecordingSys::new();
        let err = build_rootfs(
            &sys,
            RootSource::Overlay { lower: &t.lower, upper: &t.upper, work: &t.work },
            &t.root,
            TmpMount::Root,
        )
        .unwrap_err();
        assert!(matches!(&err, SetupError::Image(m) if m.contains("/proc: it is a symlink")), "{err:?}");
        // Private propagation and the overlay only.
        assert_eq!(sys.names(), ["mount", "mount"]);
    }

    #[test]
    fn pivot_stacks_the_old_root_and_detaches_it() {
        let t = tree();
        let sys = RecordingSys::new();
        pivot_into(&sys, &t.root).unwrap();
        assert_eq!(described(&sys, &t.root), ["chdir $ROOT", "pivot_root . .", "umount2 . DETACH", "chdir /"]);
        // A failed pivot_root never detaches anything.
        let sys = RecordingSys::new();
        sys.fail_when(|c| matches!(c, SysCall::PivotRoot { .. }), Errno::EINVAL);
        let err = pivot_into(&sys, &t.root).unwrap_err();
        assert_eq!(err.to_string(), "pivot_root: EINVAL: Invalid argument");
        assert_eq!(sys.names(), ["chdir", "pivot_root"]);
    }

    #[test]
    fn identity_files_are_written_on_a_tmpfs_and_bound_over_etc() {
        let t = tree();
        fs::create_dir_all(t.root.join("etc")).unwrap();
        fs::write(t.root.join("etc/hosts"), "10.0.0.1 db\n127.0.1.1 old\n").unwrap();
        // A symlink in the image is left alone (not bound over).
        std::os::unix::fs::symlink("/elsewhere", t.root.join("etc/machine-id")).unwrap();
        let sys = RecordingSys::new();
        write_identity_files(&sys, &t.root, "box", "sb-1", "0123", 7).unwrap();
        assert_eq!(
            described(&sys, &t.root),
            [
                "mount tmpfs $ROOT/run/strata tmpfs NODEV|NOEXEC|NOSUID mode=755,size=1m",
                "mount $ROOT/run/strata/hostname $ROOT/etc/hostname - BIND -",
                "mount $ROOT/run/strata/hosts $ROOT/etc/hosts - BIND -",
            ]
        );
        let read = |rel: &str| fs::read_to_string(t.root.join(rel)).unwrap();
        assert_eq!(read("run/strata/sandbox-id"), "sb-1\n");
        assert_eq!(read("run/strata/generation"), "7\n");
        assert_eq!(read("run/strata/machine-id"), "0123\n");
        assert_eq!(
            read("run/strata/hosts"),
            "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n10.0.0.1 db\n127.0.1.1\tbox\n"
        );
        // The bind target was created empty where the image had none.
        assert_eq!(read("etc/hostname"), "");
    }

    #[test]
    fn a_run_file_in_the_image_is_the_images_fault() {
        let t = tree();
        fs::write(t.root.join("run"), b"").unwrap();
        let sys = RecordingSys::new();
        let err = write_identity_files(&sys, &t.root, "box", "sb-1", "0123", 0).unwrap_err();
        assert!(matches!(err, SetupError::Image(_)), "{err:?}");
        assert!(sys.calls().is_empty());
    }

    #[test]
    fn secrets_are_created_owned_then_made_read_only() {
        use std::os::unix::fs::PermissionsExt;
        let t = tree();
        fs::create_dir_all(t.root.join("etc")).unwrap();
        fs::write(t.root.join("etc/passwd"), "root:x:0:0::/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\n")
            .unwrap();
        let secrets = [
            crate::spec::SecretFile { name: "TOKEN".into(), data: b"s3cret".to_vec() },
            crate::spec::SecretFile { name: "KEY".into(), data: vec![0; 5000] },
        ];
        let sys = RecordingSys::new();
        mount_secrets(&sys, &t.root, &secrets, Some("app")).unwrap();
        let opts = "mode=0500,uid=1000,gid=1001,size=24576,nr_inodes=18";
        assert_eq!(
            described(&sys, &t.root),
            [
                format!("mount tmpfs $ROOT/run/secrets tmpfs NODEV|NOEXEC|NOSUID {opts}"),
                "fchown $ROOT/run/secrets/TOKEN 1000:1001".into(),
                "fchown $ROOT/run/secrets/KEY 1000:1001".into(),
                format!("mount - $ROOT/run/secrets - NODEV|NOEXEC|NOSUID|RDONLY|REMOUNT {opts}"),
            ]
        );
        let token = t.root.join("run/secrets/TOKEN");
        assert_eq!(fs::read(&token).unwrap(), b"s3cret");
        assert_eq!(fs::metadata(&token).unwrap().permissions().mode() & 0o777, 0o400);
        // No secrets: no mount at all.
        let sys = RecordingSys::new();
        mount_secrets(&sys, &t.root, &[], None).unwrap();
        assert!(sys.calls().is_empty());
    }

    #[test]
    fn a_failed_chown_of_a_secret_stops_before_the_read_only_remount() {
        let t = tree();
        let dir = t.root.join("s");
        fs::create_dir(&dir).unwrap();
        let secrets = [crate::spec::SecretFile { name: "A".into(), data: b"1".to_vec() }];
        let sys = RecordingSys::new();
        sys.fail_when(|c| matches!(c, SysCall::Fchown { .. }), Errno::EPERM);
        let err = fill_secrets(&sys, &dir, &secrets, (5, 5)).unwrap_err();
        assert_eq!(err.to_string(), "chown secret A: Operation not permitted (os error 1)");
        assert_eq!(sys.names(), ["mount", "fchown"]);
    }

    #[test]
    fn resolv_conf_replaces_a_symlink_and_is_bound() {
        let t = tree();
        fs::create_dir_all(t.root.join("etc")).unwrap();
        fs::create_dir_all(t.root.join("run/strata")).unwrap();
        std::os::unix::fs::symlink("../run/systemd/resolve/stub-resolv.conf", t.root.join("etc/resolv.conf")).unwrap();
        let sys = RecordingSys::new();
        bind_resolv_conf(&sys, &t.root, "nameserver 10.0.0.53\n").unwrap();
        assert_eq!(described(&sys, &t.root), ["mount $ROOT/run/strata/resolv.conf $ROOT/etc/resolv.conf - BIND -"]);
        assert!(fs::symlink_metadata(t.root.join("etc/resolv.conf")).unwrap().is_file());
        assert_eq!(fs::read_to_string(t.root.join("run/strata/resolv.conf")).unwrap(), "nameserver 10.0.0.53\n");
    }

    #[test]
    fn loopback_failure_keeps_its_message() {
        let sys = RecordingSys::new();
        sys.fail_when(|c| *c == SysCall::LoopbackUp, Errno::EPERM);
        assert_eq!(loopback_up(&sys).unwrap_err().to_string(), "bring up lo: Operation not permitted (os error 1)");
    }

    /// The real calls, in a mount namespace of a thread of its own (root only):
    /// private propagation, then a tmpfs mounted and detached.
    #[test]
    fn linux_sys_mounts_in_a_private_namespace() {
        use crate::sys::LinuxSys;
        if !nix::unistd::geteuid().is_root() {
            println!("skipped: needs root (mount and unshare)");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().to_path_buf();
        let outcome = std::thread::spawn(move || -> Result<bool, String> {
            let sys = LinuxSys;
            // unshare(CLONE_NEWNS) gives this thread alone a copy of the mount tree.
            if let Err(e) = sys.unshare(nix::sched::CloneFlags::CLONE_NEWNS) {
                return Err(format!("unshare: {e}"));
            }
            sys.mount(None, Path::new("/"), None, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None)
                .map_err(|e| format!("make / private: {e}"))?;
            sys.mount(Some(Path::new("tmpfs")), &target, Some("tmpfs"), MsFlags::MS_NOSUID, Some("size=1m"))
                .map_err(|e| format!("mount: {e}"))?;
            let info = fs::read_to_string("/proc/thread-self/mountinfo").unwrap();
            let mounted = info.lines().any(|l| l.split(' ').nth(4) == Some(target.to_str().unwrap()));
            sys.umount2(&target, MntFlags::MNT_DETACH).map_err(|e| format!("umount2: {e}"))?;
            Ok(mounted)
        })
        .join()
        .unwrap();
        match outcome {
            Ok(mounted) => assert!(mounted, "the tmpfs was not in this thread's mountinfo"),
            // Root without CAP_SYS_ADMIN (an unprivileged container).
            Err(e) if e.starts_with("unshare: EPERM") => println!("skipped: {e}"),
            Err(e) => panic!("{e}"),
        }
        // Never visible outside that thread's namespace.
        let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!info.lines().any(|l| l.split(' ').nth(4) == dir.path().to_str()));
    }
}
