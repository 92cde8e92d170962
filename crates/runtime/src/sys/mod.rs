//! The privileged system calls of the namespace tier, behind one trait.
//!
//! Setting up a sandbox (its mount tree, namespaces, hostname, device nodes)
//! is a sequence of calls that need root and change the calling process for
//! good. The setup code takes a `&dyn Sys` and makes those calls through it:
//!
//! * [`LinuxSys`] makes the real calls (the `_init` and `_restore` helpers and
//!   the runtime build one at their entry points; the per-sandbox disks of
//!   [`crate::disk`] are mounted through one);
//! * [`RecordingSys`] makes none: it records every call with its arguments in
//!   order, answers success, and fails the calls it is told to fail, so the
//!   setup logic (which calls, in which order, with which flags and options,
//!   and what an error says) is unit-tested without root.
//!
//! Plain file-system work on the tree being built (creating mount points,
//! symlinks in /dev, writing identity files) is not in the trait: it needs no
//! privilege, and the tests run it for real in a temporary directory.
//!
//! The model is youki's `libcontainer/src/syscall/{syscall,test}.rs`.

mod fake;
mod linux;

use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};
use nix::sched::CloneFlags;
use nix::sys::stat::{Mode, SFlag};

pub use fake::{RecordingSys, SysCall};
pub use linux::LinuxSys;

/// `open_tree(2)` flag: clone the mount instead of opening it in place.
pub const OPEN_TREE_CLONE: u32 = 1;
/// `open_tree(2)` flag: with [`OPEN_TREE_CLONE`], the mounts below too.
pub const AT_RECURSIVE: u32 = 0x8000;

/// The privileged calls the namespace tier makes. Every method is one system
/// call (or, for [`Sys::loopback_up`], one fixed sequence of them) with the
/// same arguments and errno as the call it stands for.
pub trait Sys: Send + Sync {
    /// `mount(2)`.
    fn mount(
        &self,
        source: Option<&Path>,
        target: &Path,
        fstype: Option<&str>,
        flags: MsFlags,
        data: Option<&str>,
    ) -> nix::Result<()>;

    /// `umount2(2)`.
    fn umount2(&self, target: &Path, flags: MntFlags) -> nix::Result<()>;

    /// `pivot_root(2)`.
    fn pivot_root(&self, new_root: &Path, put_old: &Path) -> nix::Result<()>;

    /// `chdir(2)` (part of the pivot: it changes the whole process's directory).
    fn chdir(&self, path: &Path) -> nix::Result<()>;

    /// `unshare(2)`.
    fn unshare(&self, flags: CloneFlags) -> nix::Result<()>;

    /// `setns(2)`: joins the namespace `fd` refers to (of type `nstype`).
    fn setns(&self, fd: BorrowedFd<'_>, nstype: CloneFlags) -> nix::Result<()>;

    /// `sethostname(2)`.
    fn sethostname(&self, name: &str) -> nix::Result<()>;

    /// `mknod(2)`: a device node (`kind` `S_IFCHR` or `S_IFBLK`).
    fn mknod(&self, path: &Path, kind: SFlag, perm: Mode, dev: u64) -> nix::Result<()>;

    /// `chmod(2)` (of a device node just made: mknod honours the umask).
    fn chmod(&self, path: &Path, mode: u32) -> nix::Result<()>;

    /// `fchown(2)` (of a file the setup created for another user).
    fn fchown(&self, fd: BorrowedFd<'_>, uid: u32, gid: u32) -> nix::Result<()>;

    /// `open_tree(2)` of `path` relative to the current directory: a detached
    /// mount (with [`OPEN_TREE_CLONE`]); `flags` may add `O_CLOEXEC`.
    fn open_tree(&self, path: &Path, flags: u32) -> nix::Result<OwnedFd>;

    /// `move_mount(2)` of the detached mount `from` onto `to`
    /// (`MOVE_MOUNT_F_EMPTY_PATH`).
    fn move_mount(&self, from: BorrowedFd<'_>, to: &Path) -> nix::Result<()>;

    /// A new user namespace mapping uids and gids `0..size` onto host ids
    /// `host_base..host_base + size`, made by a short-lived child (which
    /// unshares it and exits once the maps are written); answers a
    /// descriptor of it (`/proc/<child>/ns/user`), which keeps it alive.
    fn user_namespace(&self, host_base: u32, size: u32) -> nix::Result<OwnedFd>;

    /// `mount_setattr(2)` with `MOUNT_ATTR_IDMAP`: the detached mount `tree`
    /// shows its files' owners through the id map of the user namespace `userns`.
    fn idmap_mount(&self, tree: BorrowedFd<'_>, userns: BorrowedFd<'_>) -> nix::Result<()>;

    /// `setfsuid(2)` and `setfsgid(2)` to `id`, keeping the effective
    /// capabilities (the kernel drops the file-system ones when the fsuid
    /// leaves 0; they are raised again from the permitted set).
    fn set_fs_ids(&self, id: u32) -> nix::Result<()>;

    /// Brings the loopback interface of the current network namespace up
    /// (`SIOCGIFFLAGS`, then `SIOCSIFFLAGS` with `IFF_UP | IFF_RUNNING`).
    fn loopback_up(&self) -> nix::Result<()>;

    /// Attaches the file `image` to a free loop device (`LOOP_CTL_GET_FREE`,
    /// then `LOOP_CONFIGURE` with `LO_FLAGS_AUTOCLEAR`): the device's path and
    /// a descriptor of it that keeps it alive until something else (a mount)
    /// holds it. `EINVAL`/`ENOTTY`: the kernel has no `LOOP_CONFIGURE` (< 5.8).
    fn loop_attach(&self, image: &Path) -> nix::Result<(PathBuf, OwnedFd)>;

    /// Where the directory `new_root`, once made the root by
    /// [`Sys::pivot_root`], is reached afterwards: `/` after a real pivot. A
    /// fake that pivots nothing answers `new_root`, so the steps that follow
    /// the pivot work on the same tree as those before it.
    fn root_after_pivot(&self, _new_root: &Path) -> PathBuf {
        PathBuf::from("/")
    }
}
