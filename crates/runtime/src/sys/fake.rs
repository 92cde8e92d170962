//! [`RecordingSys`]: a [`Sys`] that makes no privileged call. It records each
//! call ([`SysCall`], with its arguments) in order and answers success, except
//! for the calls it was told to fail ([`RecordingSys::fail_when`]).
//!
//! What it does touch, so that the code around it keeps working: `open_tree`
//! opens its path `O_PATH` (a missing path fails as the real call would), and
//! descriptors passed to `setns`, `fchown` and `move_mount` are named by what
//! `/proc/self/fd` says they refer to.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags};
use nix::sched::CloneFlags;
use nix::sys::stat::{Mode, SFlag};

use super::Sys;

/// One call made through a [`RecordingSys`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SysCall {
    /// `mount(2)`.
    Mount {
        /// Source (a path, or a name such as `tmpfs`).
        source: Option<PathBuf>,
        /// Mount point.
        target: PathBuf,
        /// File-system type.
        fstype: Option<String>,
        /// Flags.
        flags: MsFlags,
        /// File-system options.
        data: Option<String>,
    },
    /// `umount2(2)`.
    Umount2 {
        /// Mount point.
        target: PathBuf,
        /// Flags.
        flags: MntFlags,
    },
    /// `pivot_root(2)`.
    PivotRoot {
        /// The new root.
        new_root: PathBuf,
        /// Where the old root goes.
        put_old: PathBuf,
    },
    /// `chdir(2)`.
    Chdir {
        /// The directory.
        path: PathBuf,
    },
    /// `unshare(2)`.
    Unshare {
        /// The namespaces.
        flags: CloneFlags,
    },
    /// `setns(2)`.
    Setns {
        /// What the descriptor refers to (`/proc/self/fd/N`'s link: a file's
        /// path, or `net:[4026531840]` for a namespace).
        target: Option<PathBuf>,
        /// The namespace type.
        nstype: CloneFlags,
    },
    /// `sethostname(2)`.
    Sethostname {
        /// The name.
        name: String,
    },
    /// `mknod(2)`.
    Mknod {
        /// The node.
        path: PathBuf,
        /// `S_IFCHR` or `S_IFBLK`.
        kind: SFlag,
        /// Permissions.
        perm: Mode,
        /// Device number.
        dev: u64,
    },
    /// `chmod(2)`.
    Chmod {
        /// The file.
        path: PathBuf,
        /// The mode.
        mode: u32,
    },
    /// `fchown(2)`.
    Fchown {
        /// The file the descriptor refers to.
        path: Option<PathBuf>,
        /// Owner.
        uid: u32,
        /// Group.
        gid: u32,
    },
    /// `open_tree(2)`.
    OpenTree {
        /// The path.
        path: PathBuf,
        /// Flags.
        flags: u32,
    },
    /// `move_mount(2)`.
    MoveMount {
        /// What the detached mount's descriptor refers to.
        from: Option<PathBuf>,
        /// Where it is attached.
        to: PathBuf,
    },
    /// A user namespace made.
    UserNamespace {
        /// Host id of its root.
        host_base: u32,
        /// Ids mapped.
        size: u32,
    },
    /// A detached mount idmapped.
    IdmapMount {
        /// What the mount's descriptor refers to.
        tree: Option<PathBuf>,
    },
    /// The file-system ids set.
    SetFsIds {
        /// The uid and gid.
        id: u32,
    },
    /// The loopback interface brought up.
    LoopbackUp,
    /// A loop device attached to an image.
    LoopAttach {
        /// The image.
        image: PathBuf,
    },
}

impl SysCall {
    /// The call's name (`mount`, `pivot_root`, ...), for asserting an order.
    pub fn name(&self) -> &'static str {
        match self {
            SysCall::Mount { .. } => "mount",
            SysCall::Umount2 { .. } => "umount2",
            SysCall::PivotRoot { .. } => "pivot_root",
            SysCall::Chdir { .. } => "chdir",
            SysCall::Unshare { .. } => "unshare",
            SysCall::Setns { .. } => "setns",
            SysCall::Sethostname { .. } => "sethostname",
            SysCall::Mknod { .. } => "mknod",
            SysCall::Chmod { .. } => "chmod",
            SysCall::Fchown { .. } => "fchown",
            SysCall::OpenTree { .. } => "open_tree",
            SysCall::MoveMount { .. } => "move_mount",
            SysCall::UserNamespace { .. } => "user_namespace",
            SysCall::IdmapMount { .. } => "idmap_mount",
            SysCall::SetFsIds { .. } => "set_fs_ids",
            SysCall::LoopbackUp => "loopback_up",
            SysCall::LoopAttach { .. } => "loop_attach",
        }
    }

    /// Whether this is a mount on `target`.
    pub fn is_mount_on(&self, target: &Path) -> bool {
        matches!(self, SysCall::Mount { target: t, .. } if t == target)
    }

    /// One line for reading and comparing: the call's name and arguments,
    /// paths under `root` written `$ROOT/...`, flags by their names (sorted,
    /// without the `MS_`/`MNT_`/`CLONE_` prefix), `-` for an absent argument.
    /// E.g. `mount proc $ROOT/proc proc NODEV|NOEXEC|NOSUID -`.
    pub fn describe(&self, root: &Path) -> String {
        let p = |path: &Path| match path.strip_prefix(root) {
            Ok(rel) if rel.as_os_str().is_empty() => "$ROOT".to_string(),
            Ok(rel) => format!("$ROOT/{}", rel.display()),
            Err(_) => path.display().to_string(),
        };
        let opt_p = |path: &Option<PathBuf>| path.as_deref().map_or("-".to_string(), p);
        let opt_s = |s: &Option<String>| s.clone().unwrap_or_else(|| "-".into());
        match self {
            SysCall::Mount { source, target, fstype, flags, data } => format!(
                "mount {} {} {} {} {}",
                opt_p(source),
                p(target),
                opt_s(fstype),
                names(flags.iter_names().map(|(n, _)| n), "MS_"),
                opt_s(data)
            ),
            SysCall::Umount2 { target, flags } => {
                format!("umount2 {} {}", p(target), names(flags.iter_names().map(|(n, _)| n), "MNT_"))
            }
            SysCall::PivotRoot { new_root, put_old } => format!("pivot_root {} {}", p(new_root), p(put_old)),
            SysCall::Chdir { path } => format!("chdir {}", p(path)),
            SysCall::Unshare { flags } => format!("unshare {}", names(flags.iter_names().map(|(n, _)| n), "CLONE_")),
            SysCall::Setns { target, nstype } => {
                format!("setns {} {}", opt_p(target), names(nstype.iter_names().map(|(n, _)| n), "CLONE_"))
            }
            SysCall::Sethostname { name } => format!("sethostname {name}"),
            SysCall::Mknod { path, kind, perm, dev } => format!(
                "mknod {} {} {:o} {}:{}",
                p(path),
                names(kind.iter_names().map(|(n, _)| n), "S_IF"),
                perm.bits(),
                nix::sys::stat::major(*dev),
                nix::sys::stat::minor(*dev)
            ),
            SysCall::Chmod { path, mode } => format!("chmod {} {mode:o}", p(path)),
            SysCall::Fchown { path, uid, gid } => format!("fchown {} {uid}:{gid}", opt_p(path)),
            SysCall::OpenTree { path, flags } => format!("open_tree {} {flags:#x}", p(path)),
            SysCall::MoveMount { from, to } => format!("move_mount {} {}", opt_p(from), p(to)),
            SysCall::UserNamespace { host_base, size } => format!("user_namespace {host_base} {size}"),
            SysCall::IdmapMount { tree } => format!("idmap_mount {}", opt_p(tree)),
            SysCall::SetFsIds { id } => format!("set_fs_ids {id}"),
            SysCall::LoopbackUp => "loopback_up".into(),
            SysCall::LoopAttach { image } => format!("loop_attach {}", p(image)),
        }
    }
}

/// Flag names without `prefix`, sorted, joined by `|` (`-` for none).
fn names<'a>(it: impl Iterator<Item = &'a str>, prefix: &str) -> String {
    let mut v: Vec<&str> = it.map(|n| n.strip_prefix(prefix).unwrap_or(n)).collect();
    if v.is_empty() {
        return "-".into();
    }
    v.sort_unstable();
    v.join("|")
}

type Rule = (Box<dyn Fn(&SysCall) -> bool + Send + Sync>, Errno);

#[derive(Default)]
struct Inner {
    calls: Vec<SysCall>,
    rules: Vec<Rule>,
}

/// A [`Sys`] that records calls instead of making them (see the module doc).
#[derive(Default)]
pub struct RecordingSys {
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for RecordingSys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.lock();
        f.debug_struct("RecordingSys").field("calls", &inner.calls).field("rules", &inner.rules.len()).finish()
    }
}

impl RecordingSys {
    /// A recorder with no calls and no failures.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes every later call that `matches` fail with `errno` (it is still
    /// recorded). Rules are checked in the order they were added.
    pub fn fail_when(&self, matches: impl Fn(&SysCall) -> bool + Send + Sync + 'static, errno: Errno) {
        self.lock().rules.push((Box::new(matches), errno));
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<SysCall> {
        self.lock().calls.clone()
    }

    /// The names of every call so far, in order.
    pub fn names(&self) -> Vec<&'static str> {
        self.lock().calls.iter().map(SysCall::name).collect()
    }

    /// Forgets the calls so far (the failure rules stay).
    pub fn clear(&self) {
        self.lock().calls.clear();
    }

    fn record(&self, call: SysCall) -> nix::Result<()> {
        let mut inner = self.lock();
        let failure = inner.rules.iter().find(|(m, _)| m(&call)).map(|(_, e)| *e);
        inner.calls.push(call);
        match failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// What a descriptor refers to, as `/proc/self/fd` names it.
fn fd_target(fd: BorrowedFd<'_>) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()
}

impl Sys for RecordingSys {
    fn mount(
        &self,
        source: Option<&Path>,
        target: &Path,
        fstype: Option<&str>,
        flags: MsFlags,
        data: Option<&str>,
    ) -> nix::Result<()> {
        self.record(SysCall::Mount {
            source: source.map(Path::to_path_buf),
            target: target.to_path_buf(),
            fstype: fstype.map(str::to_string),
            flags,
            data: data.map(str::to_string),
        })
    }

    fn umount2(&self, target: &Path, flags: MntFlags) -> nix::Result<()> {
        self.record(SysCall::Umount2 { target: target.to_path_buf(), flags })
    }

    fn pivot_root(&self, new_root: &Path, put_old: &Path) -> nix::Result<()> {
        self.record(SysCall::PivotRoot { new_root: new_root.to_path_buf(), put_old: put_old.to_path_buf() })
    }

    fn chdir(&self, path: &Path) -> nix::Result<()> {
        self.record(SysCall::Chdir { path: path.to_path_buf() })
    }

    fn unshare(&self, flags: CloneFlags) -> nix::Result<()> {
        self.record(SysCall::Unshare { flags })
    }

    fn setns(&self, fd: BorrowedFd<'_>, nstype: CloneFlags) -> nix::Result<()> {
        self.record(SysCall::Setns { target: fd_target(fd), nstype })
    }

    fn sethostname(&self, name: &str) -> nix::Result<()> {
        self.record(SysCall::Sethostname { name: name.to_string() })
    }

    fn mknod(&self, path: &Path, kind: SFlag, perm: Mode, dev: u64) -> nix::Result<()> {
        self.record(SysCall::Mknod { path: path.to_path_buf(), kind, perm, dev })
    }

    fn chmod(&self, path: &Path, mode: u32) -> nix::Result<()> {
        self.record(SysCall::Chmod { path: path.to_path_buf(), mode })
    }

    fn fchown(&self, fd: BorrowedFd<'_>, uid: u32, gid: u32) -> nix::Result<()> {
        self.record(SysCall::Fchown { path: fd_target(fd), uid, gid })
    }

    fn open_tree(&self, path: &Path, flags: u32) -> nix::Result<OwnedFd> {
        self.record(SysCall::OpenTree { path: path.to_path_buf(), flags })?;
        // A descriptor of the path itself stands for the detached mount.
        let fd = nix::fcntl::open(path, nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_CLOEXEC, Mode::empty())?;
        // SAFETY: open returned a new descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn move_mount(&self, from: BorrowedFd<'_>, to: &Path) -> nix::Result<()> {
        self.record(SysCall::MoveMount { from: fd_target(from), to: to.to_path_buf() })
    }

    /// Answers a descriptor of the calling process's own user namespace.
    fn user_namespace(&self, host_base: u32, size: u32) -> nix::Result<OwnedFd> {
        self.record(SysCall::UserNamespace { host_base, size })?;
        let fd = nix::fcntl::open(
            "/proc/self/ns/user",
            nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        // SAFETY: open returned a new descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn idmap_mount(&self, tree: BorrowedFd<'_>, _userns: BorrowedFd<'_>) -> nix::Result<()> {
        self.record(SysCall::IdmapMount { tree: fd_target(tree) })
    }

    fn set_fs_ids(&self, id: u32) -> nix::Result<()> {
        self.record(SysCall::SetFsIds { id })
    }

    fn loopback_up(&self) -> nix::Result<()> {
        self.record(SysCall::LoopbackUp)
    }

    /// Answers `/dev/loopN` (N counting the attaches so far) and a descriptor of `/dev/null`.
    fn loop_attach(&self, image: &Path) -> nix::Result<(PathBuf, OwnedFd)> {
        let n = self.lock().calls.iter().filter(|c| matches!(c, SysCall::LoopAttach { .. })).count();
        self.record(SysCall::LoopAttach { image: image.to_path_buf() })?;
        let null = std::fs::File::open("/dev/null").map_err(|_| Errno::EIO)?;
        Ok((PathBuf::from(format!("/dev/loop{n}")), null.into()))
    }

    fn root_after_pivot(&self, new_root: &Path) -> PathBuf {
        new_root.to_path_buf()
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    #[test]
    fn records_calls_in_order_and_fails_only_the_matching_ones() {
        let sys = RecordingSys::new();
        sys.fail_when(|c| c.is_mount_on(Path::new("/b")), Errno::EPERM);
        assert_eq!(
            sys.mount(Some(Path::new("tmpfs")), Path::new("/a"), Some("tmpfs"), MsFlags::MS_NOSUID, None),
            Ok(())
        );
        assert_eq!(sys.mount(None, Path::new("/b"), None, MsFlags::MS_BIND, None), Err(Errno::EPERM));
        assert_eq!(sys.sethostname("h"), Ok(()));
        // The failed call is recorded too: it was made.
        assert_eq!(sys.names(), ["mount", "mount", "sethostname"]);
        let lines: Vec<String> = sys.calls().iter().map(|c| c.describe(Path::new("/a"))).collect();
        assert_eq!(lines, ["mount tmpfs $ROOT tmpfs NOSUID -", "mount - /b - BIND -", "sethostname h"]);
        sys.clear();
        assert!(sys.calls().is_empty());
        // Rules outlive clear().
        assert_eq!(sys.mount(None, Path::new("/b"), None, MsFlags::empty(), None), Err(Errno::EPERM));
        assert_eq!(sys.calls()[0].describe(Path::new("/elsewhere")), "mount - /b - - -");
    }

    #[test]
    fn open_tree_opens_its_path_and_descriptors_are_named() {
        let sys = RecordingSys::new();
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("helper");
        std::fs::write(&exe, b"x").unwrap();
        let fd = sys.open_tree(&exe, super::super::OPEN_TREE_CLONE).unwrap();
        sys.move_mount(fd.as_fd(), Path::new("/run/strata/init")).unwrap();
        sys.fchown(fd.as_fd(), 1, 2).unwrap();
        assert_eq!(
            sys.calls()[1..],
            [
                SysCall::MoveMount { from: Some(exe.clone()), to: PathBuf::from("/run/strata/init") },
                SysCall::Fchown { path: Some(exe.clone()), uid: 1, gid: 2 },
            ]
        );
        // A missing path fails as the real call would (and is still recorded).
        assert_eq!(sys.open_tree(&dir.path().join("missing"), 0).unwrap_err(), Errno::ENOENT);
        assert_eq!(sys.names().last(), Some(&"open_tree"));
    }
}
