//! File access inside a running sandbox, confined to its root.
//!
//! The sandbox root is reached through `/proc/<init>/root`. Paths are resolved
//! component by component against that root ([`SandboxFs::resolve`]): symlinks
//! are followed the way the sandbox itself would see them (absolute targets
//! restart at the sandbox root), and any `..` that would climb above the root —
//! in the request or in a symlink target — is refused as an escape. The final
//! open uses `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`
//! on the already-resolved path, so a symlink swapped in by the sandbox between
//! resolution and use makes the call fail instead of leaving the root.
//!
//! What is refused besides escapes (see docs/security.md, "File API:
//! privileges and memory bounds"):
//!
//! * **Kernel pseudo-filesystems.** The directory an operation works in, and
//!   the object it opens, are checked with `fstatfs`: anything on proc,
//!   sysfs, devpts, cgroup, debugfs, tracefs, securityfs, bpf, mqueue and the
//!   others of [`PSEUDO_FILESYSTEMS`] is refused ([`FsError::PseudoFs`]).
//!   Walks (tar downloads) leave such mounts out.
//! * **Special files.** Device nodes, FIFOs and sockets are never read or
//!   written ([`FsError::Special`]); their metadata can be listed, and they can
//!   be renamed and removed like any entry of the sandbox.
//!
//! * **Mount points.** Seen from the daemon (another mount namespace) a
//!   sandbox's mount points are plain names: unlinking or renaming one would
//!   detach the mount inside the sandbox (its /tmp, the read-only init binary
//!   every exec starts). Nothing that is the root of a mount is removed,
//!   renamed or replaced ([`FsError::MountPoint`]).
//!
//! Callers run the operations with the sandbox root's capabilities
//! ([`crate::privileges`]), and every read of sandbox-controlled data is
//! bounded: files are streamed, listings and walks have limits
//! ([`MAX_LIST_ENTRIES`], [`MAX_DEPTH`]).

mod tarwalk;
mod untar;

use std::collections::BTreeMap;
use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;

use strata_api::{FileKind, FileStat};
use strata_init::xattr;
use strata_runtime::openat2::{RESOLVE_BENEATH, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS};

pub use tarwalk::TarRoot;

/// Most entries one directory listing returns.
pub const MAX_LIST_ENTRIES: usize = 100_000;
/// Deepest directory nesting a tar download or a recursive remove walks.
pub const MAX_DEPTH: usize = 256;

/// Kernel pseudo-filesystems the file API refuses, by `statfs` magic
/// (`linux/magic.h`): their files are kernel interfaces whose answers depend
/// on who asks, not files of the sandbox.
pub const PSEUDO_FILESYSTEMS: &[(u64, &str)] = &[
    (0x9fa0, "proc"),
    (0x6265_6572, "sysfs"),
    (0x1cd1, "devpts"),
    (0x0027_e0eb, "cgroup"),
    (0x6367_7270, "cgroup2"),
    (0x6462_6720, "debugfs"),
    (0x7472_6163, "tracefs"),
    (0x7363_6673, "securityfs"),
    (0xcafe_4a11, "bpf"),
    (0x1980_0202, "mqueue"),
    (0x6165_676c, "pstore"),
    (0x6265_6570, "configfs"),
    (0x6573_5543, "fusectl"),
    (0xde5e_81e4, "efivarfs"),
    (0x4249_4e4d, "binfmt_misc"),
    (0xf97c_ff8c, "selinuxfs"),
    (0x4341_5d53, "smackfs"),
    (0x5a3c_69f0, "apparmorfs"),
    (0x6e73_6673, "nsfs"),
    (0x6759_6969, "rpc_pipefs"),
    (0x6e66_7364, "nfsd"),
];

/// Errors of confined file access.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// The path leaves the sandbox root.
    #[error("path {0:?} escapes the sandbox root")]
    Escape(String),
    /// The path is not absolute or contains NUL.
    #[error("invalid path {0:?}: use an absolute path inside the sandbox")]
    Invalid(String),
    /// Nothing at that path.
    #[error("{0}: no such file or directory")]
    NotFound(String),
    /// Too many symlinks.
    #[error("{0}: too many levels of symbolic links")]
    Loop(String),
    /// The path is on a kernel pseudo-filesystem.
    #[error("{path}: on a {fs} pseudo-filesystem, which the file API does not serve (kernel interfaces answer whoever asks; read them from inside the sandbox with exec)")]
    PseudoFs {
        /// The sandbox path.
        path: String,
        /// The filesystem type.
        fs: &'static str,
    },
    /// The path is a device node, FIFO or socket.
    #[error(
        "{path}: a {kind}, which the file API does not read or write (only regular files, directories and symlinks)"
    )]
    Special {
        /// The sandbox path.
        path: String,
        /// What it is.
        kind: &'static str,
    },
    /// The path is a mount point of the sandbox.
    #[error("{0}: a mount point of the sandbox, which the file API does not remove, rename or replace (inside the sandbox that is refused too: EBUSY)")]
    MountPoint(String),
    /// A tar upload entry that is refused (the upload is rolled back).
    #[error("tar entry {entry:?}: {reason}")]
    Archive {
        /// The entry's name as in the archive.
        entry: String,
        /// Why.
        reason: String,
    },
    /// A fixed limit of the file API.
    #[error("{0}")]
    TooLarge(String),
    /// The upload ended before its end (the client went away or the body broke).
    #[error("{0}: the upload was cut off before its end; nothing was kept")]
    CutOff(String),
    /// The thread's privileges could not be lowered.
    #[error(transparent)]
    Privileges(#[from] crate::privileges::PrivilegeError),
    /// Any other error.
    #[error("{path}")]
    Io {
        /// The sandbox path.
        path: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

impl FsError {
    pub(crate) fn io(path: &str, source: io::Error) -> Self {
        if source.kind() == io::ErrorKind::NotFound {
            return FsError::NotFound(path.to_string());
        }
        if source.raw_os_error() == Some(libc::EXDEV) || source.raw_os_error() == Some(libc::ELOOP) {
            return FsError::Escape(path.to_string());
        }
        if source.kind() == io::ErrorKind::ConnectionAborted {
            return FsError::CutOff(path.to_string());
        }
        FsError::Io { path: path.to_string(), source }
    }

    fn errno(path: &str, errno: i32) -> Self {
        FsError::Io { path: path.to_string(), source: io::Error::from_raw_os_error(errno) }
    }
}

const CONFINED: u64 = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;

fn openat2(dir: RawFd, rel: &str, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    strata_runtime::openat2::openat2(dir, rel, flags, mode, CONFINED)
}

/// `openat(dir, name, flags | O_NOFOLLOW | O_CLOEXEC)` for one directory entry
/// read by a walk: a single component cannot leave `dir`, and O_NOFOLLOW keeps
/// a symlink there from being followed.
fn open_entry(dir: RawFd, name: &CStr, flags: i32) -> io::Result<OwnedFd> {
    // SAFETY: valid fd and NUL-terminated name.
    let fd = unsafe { libc::openat(dir, name.as_ptr(), flags | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new descriptor that we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn cstr(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn check(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`.
pub fn lstat_at(dir: RawFd, name: &str) -> io::Result<libc::stat> {
    lstat_at_c(dir, &cstr(if name.is_empty() { "." } else { name })?)
}

fn lstat_at_c(dir: RawFd, name: &CStr) -> io::Result<libc::stat> {
    // SAFETY: zeroed stat is valid; fstatat writes into it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd, NUL-terminated name, valid out-pointer.
    check(unsafe { libc::fstatat(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW | libc::AT_EMPTY_PATH) })?;
    Ok(st)
}

fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: zeroed stat is valid; fstat writes into it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and out-pointer.
    check(unsafe { libc::fstat(fd, &mut st) })?;
    Ok(st)
}

/// The pseudo-filesystem `fd` is on, if it is on one.
fn pseudo_fs_of(fd: RawFd) -> io::Result<Option<&'static str>> {
    // SAFETY: zeroed statfs is valid; fstatfs writes into it.
    let mut sfs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd (O_PATH descriptors included) and out-pointer.
    check(unsafe { libc::fstatfs(fd, &mut sfs) })?;
    let magic = sfs.f_type as u64 & 0xffff_ffff;
    Ok(PSEUDO_FILESYSTEMS.iter().find(|(m, _)| *m == magic).map(|(_, name)| *name))
}

fn refuse_pseudo(fd: RawFd, path: &str) -> Result<(), FsError> {
    match pseudo_fs_of(fd).map_err(|e| FsError::io(path, e))? {
        Some(fs) => Err(FsError::PseudoFs { path: path.to_string(), fs }),
        None => Ok(()),
    }
}

/// Whether `name` in `dir` (`""` for `dir` itself) is the root of a mount:
/// a mount point of the sandbox, seen from the daemon.
fn is_mount_root(dir: RawFd, name: &CStr) -> io::Result<bool> {
    // SAFETY: zeroed statx is valid; statx writes into it.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let flags =
        libc::AT_SYMLINK_NOFOLLOW | libc::AT_NO_AUTOMOUNT | if name.is_empty() { libc::AT_EMPTY_PATH } else { 0 };
    // SAFETY: valid fd, NUL-terminated name, valid out-pointer.
    check(unsafe { libc::statx(dir, name.as_ptr(), flags, libc::STATX_TYPE, &mut stx) })?;
    let bit = libc::STATX_ATTR_MOUNT_ROOT as u64;
    if stx.stx_attributes_mask & bit != 0 {
        return Ok(stx.stx_attributes & bit != 0);
    }
    // Kernels before 5.8 do not report it: another device than the directory's.
    let d = fstat(dir)?;
    Ok(libc::makedev(stx.stx_dev_major, stx.stx_dev_minor) != d.st_dev)
}

fn refuse_mount_root(dir: RawFd, name: &CStr, path: &str) -> Result<(), FsError> {
    match is_mount_root(dir, name) {
        Ok(true) => Err(FsError::MountPoint(path.to_string())),
        Ok(false) => Ok(()),
        Err(e) => Err(FsError::io(path, e)),
    }
}

/// What a special file is, by its mode (`None` for regular files, directories and symlinks).
pub fn special_kind(mode: u32) -> Option<&'static str> {
    match mode & libc::S_IFMT {
        libc::S_IFCHR => Some("character device"),
        libc::S_IFBLK => Some("block device"),
        libc::S_IFIFO => Some("FIFO"),
        libc::S_IFSOCK => Some("socket"),
        _ => None,
    }
}

fn readlink_at(dir: RawFd, name: &str) -> io::Result<String> {
    let c = cstr(name)?;
    readlink_at_c(dir, &c).map(|b| String::from_utf8_lossy(&b).into_owned())
}

fn readlink_at_c(dir: RawFd, name: &CStr) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: buf is writable for its length.
    let n = unsafe { libc::readlinkat(dir, name.as_ptr(), buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

fn kind_of(mode: u32) -> FileKind {
    match mode & libc::S_IFMT {
        libc::S_IFREG => FileKind::File,
        libc::S_IFDIR => FileKind::Dir,
        libc::S_IFLNK => FileKind::Symlink,
        _ => FileKind::Other,
    }
}

/// The entries of directory `dir`, read through a descriptor of their own.
fn read_dir_fd(dir: RawFd) -> io::Result<std::fs::ReadDir> {
    std::fs::read_dir(format!("/proc/self/fd/{dir}"))
}

fn unlink_at(dir: RawFd, name: &str, flags: libc::c_int) -> io::Result<()> {
    let c = cstr(name)?;
    // SAFETY: valid fd and NUL-terminated name.
    check(unsafe { libc::unlinkat(dir, c.as_ptr(), flags) })
}

fn rename_at(from_dir: RawFd, from: &str, to_dir: RawFd, to: &str) -> io::Result<()> {
    let (a, b) = (cstr(from)?, cstr(to)?);
    // SAFETY: valid directory fds and NUL-terminated names.
    check(unsafe { libc::renameat(from_dir, a.as_ptr(), to_dir, b.as_ptr()) })
}

fn link_at(from_dir: RawFd, from: &str, to_dir: RawFd, to: &str) -> io::Result<()> {
    let (a, b) = (cstr(from)?, cstr(to)?);
    // SAFETY: valid directory fds and NUL-terminated names; no AT_SYMLINK_FOLLOW.
    check(unsafe { libc::linkat(from_dir, a.as_ptr(), to_dir, b.as_ptr(), 0) })
}

/// A name for a temp file of the file API in a sandbox directory.
fn temp_name(what: &str) -> String {
    format!(".strata-{what}-{:016x}", rand::random::<u64>())
}

/// Whether `name` is one of the daemon's own temp files ([`temp_name`]): an
/// upload's bytes go there before it is renamed into place (a microVM
/// guest's file API names its own alike).
pub use strata_init::guestwatch::is_temp_name;

/// A sandbox's root, opened for confined access.
pub struct SandboxFs {
    root: OwnedFd,
    /// The sandbox's user namespace: owners are shown as the sandbox sees them.
    userns: Option<strata_api::UserNamespace>,
}

/// Id shown for a host id a sandbox's user namespace does not map (the kernel's overflow id).
pub const OVERFLOW_ID: u32 = 65534;

/// `st` with its owner and group as a sandbox in user namespace `userns`
/// sees them (unchanged without one).
pub fn as_seen_inside(userns: Option<strata_api::UserNamespace>, mut st: libc::stat) -> libc::stat {
    if let Some(u) = userns {
        st.st_uid = u.to_inner(st.st_uid).unwrap_or(OVERFLOW_ID);
        st.st_gid = u.to_inner(st.st_gid).unwrap_or(OVERFLOW_ID);
    }
    st
}

/// A resolved location: the parent directory (opened) and the final name.
pub struct Resolved {
    /// The parent directory (an `O_PATH` descriptor, checked not to be on a pseudo-filesystem).
    pub parent: OwnedFd,
    /// The last component ("" for the root itself).
    pub name: String,
    /// The resolved absolute path inside the sandbox.
    pub path: String,
}

/// What a resolved location names, opened without being followed or read.
struct Object {
    /// An `O_PATH | O_NOFOLLOW` descriptor.
    fd: OwnedFd,
    st: libc::stat,
    /// The root of a mount (a mount point of the sandbox).
    mount_root: bool,
}

impl Object {
    fn kind(&self) -> FileKind {
        kind_of(self.st.st_mode)
    }

    /// Opens the object itself with `flags` (through `/proc/self/fd`, so it
    /// is the same inode that was checked, whatever the sandbox renamed since).
    fn reopen(&self, flags: i32, path: &str) -> Result<File, FsError> {
        let f = std::fs::OpenOptions::new()
            .read(flags & libc::O_ACCMODE == libc::O_RDONLY)
            .custom_flags(flags | libc::O_NOCTTY)
            .open(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
            .map_err(|e| FsError::io(path, e))?;
        let meta = f.metadata().map_err(|e| FsError::io(path, e))?;
        if meta.dev() != self.st.st_dev || meta.ino() != self.st.st_ino {
            return Err(FsError::Escape(path.to_string()));
        }
        Ok(f)
    }
}

use std::os::unix::fs::OpenOptionsExt;

impl SandboxFs {
    /// The sandbox whose root directory is open as `root` (its tier's
    /// [`strata_runtime::Runtime::open_root`]).
    pub fn from_root(root: OwnedFd) -> Self {
        SandboxFs { root, userns: None }
    }

    /// The same, for a sandbox running in user namespace `userns`.
    pub fn with_userns(self, userns: Option<strata_api::UserNamespace>) -> Self {
        SandboxFs { userns, ..self }
    }

    /// Resolves `path` inside the sandbox to a list of symlink-free components.
    /// `follow_last` decides whether a symlink in the last component is followed.
    pub fn resolve(&self, path: &str, follow_last: bool) -> Result<Vec<String>, FsError> {
        if !path.starts_with('/') || path.contains('\0') {
            return Err(FsError::Invalid(path.to_string()));
        }
        let mut todo: Vec<String> = path.split('/').filter(|c| !c.is_empty()).map(str::to_string).rev().collect();
        let mut done: Vec<String> = Vec::new();
        let mut hops = 0;
        while let Some(comp) = todo.pop() {
            match comp.as_str() {
                "." => continue,
                ".." => {
                    if done.pop().is_none() {
                        return Err(FsError::Escape(path.to_string()));
                    }
                    continue;
                }
                _ => {}
            }
            let last = todo.is_empty();
            let rel = if done.is_empty() { comp.clone() } else { format!("{}/{}", done.join("/"), comp) };
            if last && !follow_last {
                done.push(comp);
                break;
            }
            match readlink_at(self.root.as_raw_fd(), &rel) {
                Ok(target) => {
                    hops += 1;
                    if hops > 40 {
                        return Err(FsError::Loop(path.to_string()));
                    }
                    if target.starts_with('/') {
                        done.clear();
                    }
                    todo.extend(target.split('/').filter(|c| !c.is_empty()).map(str::to_string).rev());
                }
                // Not a symlink (EINVAL) or not there yet (ENOENT): take it as is.
                Err(_) => done.push(comp),
            }
        }
        Ok(done)
    }

    /// Resolves `path` and opens its parent directory, refusing a parent on a
    /// kernel pseudo-filesystem.
    pub fn locate(&self, path: &str, follow_last: bool) -> Result<Resolved, FsError> {
        let mut comps = self.resolve(path, follow_last)?;
        let name = comps.pop().unwrap_or_default();
        let parent_rel = comps.join("/");
        let parent = openat2(self.root.as_raw_fd(), &parent_rel, libc::O_PATH | libc::O_DIRECTORY, 0)
            .map_err(|e| FsError::io(path, e))?;
        let abs = if name.is_empty() {
            "/".to_string()
        } else if parent_rel.is_empty() {
            format!("/{name}")
        } else {
            format!("/{parent_rel}/{name}")
        };
        refuse_pseudo(parent.as_raw_fd(), &abs)?;
        Ok(Resolved { parent, name, path: abs })
    }

    /// Opens what `r` names (`O_PATH`, a symlink there is not followed),
    /// refusing anything on a kernel pseudo-filesystem (a mount point of one included).
    fn object(&self, r: &Resolved) -> Result<Object, FsError> {
        let fd = openat2(r.parent.as_raw_fd(), &r.name, libc::O_PATH | libc::O_NOFOLLOW, 0)
            .map_err(|e| FsError::io(&r.path, e))?;
        let st = fstat(fd.as_raw_fd()).map_err(|e| FsError::io(&r.path, e))?;
        refuse_pseudo(fd.as_raw_fd(), &r.path)?;
        let mount_root = is_mount_root(fd.as_raw_fd(), c"").map_err(|e| FsError::io(&r.path, e))?;
        Ok(Object { fd, st, mount_root })
    }

    /// [`SandboxFs::object`], refusing a mount point (for what is removed, renamed or replaced).
    fn movable_object(&self, r: &Resolved) -> Result<Object, FsError> {
        let o = self.object(r)?;
        if o.mount_root {
            return Err(FsError::MountPoint(r.path.clone()));
        }
        Ok(o)
    }

    /// Opens a regular file for reading (following symlinks inside the
    /// sandbox); returns it with its size. Directories, special files and
    /// pseudo-filesystems are refused before anything is opened for reading.
    pub fn open_read(&self, path: &str) -> Result<(File, u64), FsError> {
        let r = self.locate(path, true)?;
        let o = self.object(&r)?;
        match o.kind() {
            FileKind::File => {}
            FileKind::Dir => {
                return Err(FsError::Io {
                    path: r.path,
                    source: io::Error::new(io::ErrorKind::IsADirectory, "a directory (download it with tar=true)"),
                })
            }
            // The resolver followed every symlink: one here was swapped in since.
            FileKind::Symlink => return Err(FsError::Escape(path.to_string())),
            FileKind::Other => {
                return Err(FsError::Special {
                    path: r.path,
                    kind: special_kind(o.st.st_mode).unwrap_or("special file"),
                })
            }
        }
        let f = o.reopen(libc::O_RDONLY | libc::O_NONBLOCK, &r.path)?;
        Ok((f, o.st.st_size as u64))
    }

    /// The whole content of a small regular file (at most `cap` bytes: a
    /// larger one is refused, never read).
    pub fn read_small(&self, path: &str, cap: u64) -> Result<Vec<u8>, FsError> {
        let (f, size) = self.open_read(path)?;
        if size > cap {
            return Err(FsError::TooLarge(format!("{path}: {size} bytes, more than the {cap} read here")));
        }
        let mut out = Vec::with_capacity(size as usize);
        f.take(cap + 1).read_to_end(&mut out).map_err(|e| FsError::io(path, e))?;
        if out.len() as u64 > cap {
            return Err(FsError::TooLarge(format!("{path}: grew past the {cap} bytes read here")));
        }
        Ok(out)
    }

    /// An `O_PATH` descriptor of the directory at `path` (symlinks followed
    /// inside the sandbox), with its resolved path: what a directory watch marks.
    pub fn open_dir_path(&self, path: &str) -> Result<(OwnedFd, String), FsError> {
        let r = self.locate(path, true)?;
        let o = self.object(&r)?;
        if o.kind() != FileKind::Dir {
            return Err(FsError::errno(&r.path, libc::ENOTDIR));
        }
        Ok((o.fd, r.path))
    }

    /// Opens a directory for reading its entries; returns it with its resolved path.
    fn open_dir(&self, path: &str) -> Result<(File, String), FsError> {
        let r = self.locate(path, true)?;
        let o = self.object(&r)?;
        if o.kind() != FileKind::Dir {
            return Err(FsError::errno(&r.path, libc::ENOTDIR));
        }
        let f = o.reopen(libc::O_RDONLY | libc::O_DIRECTORY, &r.path)?;
        Ok((f, r.path))
    }

    /// Metadata of a path (a symlink in the last component is described, not followed).
    pub fn stat(&self, path: &str) -> Result<FileStat, FsError> {
        let r = self.locate(path, false)?;
        let o = self.object(&r)?;
        let mut st = stat_of(&r.path, &r.name, &as_seen_inside(self.userns, o.st), None);
        if o.kind() == FileKind::Symlink {
            st.link_target = readlink_at(r.parent.as_raw_fd(), &r.name).ok();
            st.link_resolved = self.link_end(&r.path);
        }
        st.xattrs = xattr::read_user(o.fd.as_raw_fd());
        Ok(st)
    }

    /// Where the symlink at `path` leads: every symlink followed inside the
    /// sandbox, and what is there (`None` when the resolution fails: a loop,
    /// or a target above the root).
    fn link_end(&self, path: &str) -> Option<strata_api::ResolvedLink> {
        let rel = self.resolve(path, true).ok()?.join("/");
        let there = openat2(self.root.as_raw_fd(), &rel, libc::O_PATH | libc::O_NOFOLLOW, 0)
            .and_then(|fd| fstat(fd.as_raw_fd()))
            .ok();
        Some(strata_api::ResolvedLink {
            path: format!("/{rel}"),
            kind: there.map(|st| kind_of(st.st_mode)),
            mode: there.map(|st| st.st_mode & 0o7777),
        })
    }

    /// Entries of a directory, sorted by name (at most [`MAX_LIST_ENTRIES`]).
    pub fn list(&self, path: &str) -> Result<Vec<FileStat>, FsError> {
        let (dir, base) = self.open_dir(path)?;
        let base = if base == "/" { String::new() } else { base };
        let mut out = Vec::new();
        for entry in read_dir_fd(dir.as_raw_fd()).map_err(|e| FsError::io(path, e))? {
            let entry = entry.map_err(|e| FsError::io(path, e))?;
            if out.len() >= MAX_LIST_ENTRIES {
                return Err(FsError::TooLarge(format!("{path}: more than {MAX_LIST_ENTRIES} entries, the most a listing returns (download it with tar=true, or list it with exec)")));
            }
            let name = entry.file_name();
            let Ok(c) = CString::new(name.as_bytes()) else { continue };
            let Ok(st) = lstat_at_c(dir.as_raw_fd(), &c) else { continue };
            let name = name.to_string_lossy().into_owned();
            let link = (kind_of(st.st_mode) == FileKind::Symlink)
                .then(|| readlink_at_c(dir.as_raw_fd(), &c).ok().map(|b| String::from_utf8_lossy(&b).into_owned()))
                .flatten();
            let mut entry = stat_of(&format!("{base}/{name}"), &name, &as_seen_inside(self.userns, st), link);
            if entry.kind == FileKind::Symlink {
                entry.link_resolved = self.link_end(&entry.path);
            } else if let Ok(fd) = open_entry(dir.as_raw_fd(), &c, libc::O_PATH) {
                entry.xattrs = xattr::read_user(fd.as_raw_fd());
            }
            out.push(entry);
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Makes the `user.` extended attributes of the file or directory at
    /// `path` (symlinks followed) under `prefix` exactly `values` (keys
    /// without the prefix); its other attributes are left alone.
    pub fn set_xattrs(&self, path: &str, prefix: &str, values: &BTreeMap<String, String>) -> Result<(), FsError> {
        let r = self.locate(path, true)?;
        let o = self.object(&r)?;
        match o.kind() {
            FileKind::File | FileKind::Dir => {}
            // The resolver followed every symlink: one here was swapped in since.
            FileKind::Symlink => return Err(FsError::Escape(path.to_string())),
            FileKind::Other => {
                return Err(FsError::Special {
                    path: r.path,
                    kind: special_kind(o.st.st_mode).unwrap_or("special file"),
                })
            }
        }
        xattr::replace_user(o.fd.as_raw_fd(), prefix, values).map_err(|e| FsError::io(&r.path, e))
    }

    /// Creates a directory (and its parents when asked).
    pub fn mkdir(&self, path: &str, parents: bool, mode: u32) -> Result<(), FsError> {
        if parents {
            let comps = self.resolve(path, true)?;
            let mut cur = String::new();
            for c in comps {
                cur.push('/');
                cur.push_str(&c);
                match self.mkdir_one(&cur, mode) {
                    Ok(()) => {}
                    Err(FsError::Io { source, .. }) if source.raw_os_error() == Some(libc::EEXIST) => {
                        if self.stat(&cur)?.kind != FileKind::Dir {
                            return Err(FsError::errno(&cur, libc::ENOTDIR));
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
            Ok(())
        } else {
            self.mkdir_one(path, mode)
        }
    }

    fn mkdir_one(&self, path: &str, mode: u32) -> Result<(), FsError> {
        let r = self.locate(path, false)?;
        if r.name.is_empty() {
            return Err(FsError::errno(path, libc::EEXIST));
        }
        let c = cstr(&r.name).map_err(|e| FsError::io(path, e))?;
        // SAFETY: valid directory fd (O_PATH works for *at calls) and NUL-terminated name.
        check(unsafe { libc::mkdirat(r.parent.as_raw_fd(), c.as_ptr(), mode) })
            .map_err(|e| FsError::Io { path: path.into(), source: e })
    }

    /// Writes a file atomically (temp file + rename in the same directory).
    pub fn write_file(&self, path: &str, data: &[u8], mode: u32) -> Result<(), FsError> {
        self.write_from(path, data, mode).map(drop)
    }

    /// Writes a file from a stream, atomically: the bytes go into a temp
    /// file in the target's directory, renamed over the target only once the
    /// stream has ended; a stream that fails leaves nothing (the temp file is
    /// removed). Returns the number of bytes written. An existing directory,
    /// special file or pseudo-filesystem at the path is refused.
    pub fn write_from(&self, path: &str, mut input: impl Read, mode: u32) -> Result<u64, FsError> {
        let r = self.locate(path, true)?;
        if r.name.is_empty() {
            return Err(FsError::Invalid(path.to_string()));
        }
        // What is there is named first (a device node may also be a mount
        // point: in a user namespace /dev's nodes are binds of the host's).
        match self.object(&r) {
            Ok(o) => match o.kind() {
                FileKind::Other => {
                    return Err(FsError::Special {
                        path: r.path,
                        kind: special_kind(o.st.st_mode).unwrap_or("special file"),
                    })
                }
                _ if o.mount_root => return Err(FsError::MountPoint(r.path)),
                FileKind::Dir => return Err(FsError::errno(&r.path, libc::EISDIR)),
                FileKind::File | FileKind::Symlink => {}
            },
            Err(FsError::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
        let dir = r.parent.as_raw_fd();
        let tmp = temp_name("upload");
        let fd = openat2(dir, &tmp, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW, 0o600)
            .map_err(|e| FsError::io(path, e))?;
        let mut f = File::from(fd);
        let res = (|| -> io::Result<u64> {
            use std::os::unix::fs::PermissionsExt;
            let n = copy_buffered(&mut input, &mut f)?;
            f.set_permissions(std::fs::Permissions::from_mode(mode))?;
            rename_at(dir, &tmp, dir, &r.name)?;
            Ok(n)
        })();
        res.map_err(|e| {
            let _ = unlink_at(dir, &tmp, 0);
            FsError::io(&r.path, e)
        })
    }

    /// Removes a file, symlink or (with `recursive`) a directory tree (at most
    /// [`MAX_DEPTH`] levels; a pseudo-filesystem inside stops the removal there).
    pub fn remove(&self, path: &str, recursive: bool) -> Result<(), FsError> {
        let r = self.locate(path, false)?;
        if r.name.is_empty() {
            return Err(FsError::Invalid("/ cannot be removed".into()));
        }
        self.movable_object(&r)?;
        let c = cstr(&r.name).map_err(|e| FsError::io(path, e))?;
        remove_at(r.parent.as_raw_fd(), &c, recursive, 0, &r.path)
    }

    /// Removes everything inside directory `path` (the directory itself stays);
    /// returns how many entries it held.
    pub fn clear_dir(&self, path: &str) -> Result<usize, FsError> {
        let (dir, abs) = self.open_dir(path)?;
        clear_entries(dir.as_raw_fd(), 0, &abs)
    }

    /// Renames `from` to `to` (neither may leave the root). Across two
    /// filesystems of the sandbox (`/tmp` is a tmpfs of its own), a file or
    /// symlink is copied and the original removed, like mv(1); a directory is refused.
    pub fn rename(&self, from: &str, to: &str) -> Result<(), FsError> {
        let a = self.locate(from, false)?;
        let b = self.locate(to, false)?;
        if a.name.is_empty() || b.name.is_empty() {
            return Err(FsError::Invalid("/ cannot be moved".into()));
        }
        let src = self.movable_object(&a)?;
        match self.movable_object(&b) {
            Ok(_) | Err(FsError::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
        match rename_at(a.parent.as_raw_fd(), &a.name, b.parent.as_raw_fd(), &b.name) {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => self.move_across(&a, &src, &b),
            Err(e) => Err(FsError::Io { path: a.path.clone(), source: e }),
        }
    }

    fn move_across(&self, a: &Resolved, src: &Object, b: &Resolved) -> Result<(), FsError> {
        let dir = b.parent.as_raw_fd();
        let tmp = temp_name("move");
        match src.kind() {
            FileKind::File => {
                let mut input = src.reopen(libc::O_RDONLY | libc::O_NONBLOCK, &a.path)?;
                let fd = openat2(dir, &tmp, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW, 0o600).map_err(|e| FsError::io(&b.path, e))?;
                let mut out = File::from(fd);
                let res = (|| -> io::Result<()> {
                    copy_buffered(&mut input, &mut out)?;
                    // SAFETY: valid fd.
                    check(unsafe { libc::fchown(out.as_raw_fd(), src.st.st_uid, src.st.st_gid) })?;
                    // SAFETY: valid fd.
                    check(unsafe { libc::fchmod(out.as_raw_fd(), src.st.st_mode & 0o7777) })
                })();
                if let Err(e) = res {
                    let _ = unlink_at(dir, &tmp, 0);
                    return Err(FsError::io(&b.path, e));
                }
            }
            FileKind::Symlink => {
                let target = readlink_at_c(a.parent.as_raw_fd(), &cstr(&a.name).map_err(|e| FsError::io(&a.path, e))?).map_err(|e| FsError::io(&a.path, e))?;
                let (t, n) = (CString::new(target).map_err(|_| FsError::Invalid(a.path.clone()))?, cstr(&tmp).map_err(|e| FsError::io(&b.path, e))?);
                // SAFETY: valid fd and NUL-terminated strings.
                check(unsafe { libc::symlinkat(t.as_ptr(), dir, n.as_ptr()) }).map_err(|e| FsError::io(&b.path, e))?;
            }
            _ => return Err(FsError::Io { path: a.path.clone(), source: io::Error::other(format!("moving it to {} crosses filesystems of the sandbox, which the file API does only for files and symlinks", b.path)) }),
        }
        if let Err(e) = rename_at(dir, &tmp, dir, &b.name) {
            let _ = unlink_at(dir, &tmp, 0);
            return Err(FsError::io(&b.path, e));
        }
        unlink_at(a.parent.as_raw_fd(), &a.name, 0).map_err(|e| FsError::io(&a.path, e))
    }

    /// Checks what a tar download of `path` starts from (before anything is sent).
    pub fn tar_root(&self, path: &str) -> Result<TarRoot, FsError> {
        tarwalk::root(self, path)
    }

    /// Writes the tree at `root` as a tar stream into `out` (symlinks as
    /// symlinks; special files, pseudo-filesystems and the paths under
    /// `exclude` left out). Files are read as they are written, in bounded
    /// pieces.
    pub fn write_tar(&self, root: TarRoot, out: impl Write, exclude: &[&str]) -> Result<(), FsError> {
        tarwalk::write(root, out, exclude)
    }

    /// Writes `path` (file or directory tree) as a tar stream into `out`.
    pub fn tar_to(&self, path: &str, out: impl Write) -> Result<(), FsError> {
        let root = self.tar_root(path)?;
        self.write_tar(root, out, &[])
    }

    /// Extracts a tar stream under directory `dest` (created if missing), as
    /// it is read. Entries are resolved like any other path (escapes refused,
    /// naming the entry); hardlinks must point at files of the same upload;
    /// device, FIFO and other special entries are refused. A refused or
    /// broken upload is rolled back: what it added is removed and what it
    /// replaced is put back. Returns the number of entries applied.
    pub fn untar_from(&self, dest: &str, input: impl Read) -> Result<u64, FsError> {
        untar::extract(self, dest, input)
    }
}

/// Copies `input` to `out` through a buffer of the transfer size.
fn copy_buffered(input: &mut impl Read, out: &mut impl Write) -> io::Result<u64> {
    let mut buf = vec![0u8; crate::transfer::CHUNK];
    let mut n = 0u64;
    loop {
        let k = match input.read(&mut buf) {
            Ok(0) => return Ok(n),
            Ok(k) => k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        out.write_all(&buf[..k])?;
        n += k as u64;
    }
}

fn stat_of(path: &str, name: &str, st: &libc::stat, link_target: Option<String>) -> FileStat {
    FileStat {
        path: path.to_string(),
        name: if name.is_empty() { "/".into() } else { name.to_string() },
        kind: kind_of(st.st_mode),
        size: st.st_size as u64,
        mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        mtime: st.st_mtime,
        link_target,
        link_resolved: None,
        xattrs: Default::default(),
    }
}

/// Names read from a directory per pass of a removal (the directory is read
/// again after each pass, so memory stays bounded whatever it holds).
const REMOVE_BATCH: usize = 1024;

fn remove_at(dir: RawFd, name: &CStr, recursive: bool, depth: usize, path: &str) -> Result<(), FsError> {
    let st = lstat_at_c(dir, name).map_err(|e| FsError::io(path, e))?;
    refuse_mount_root(dir, name, path)?;
    if kind_of(st.st_mode) == FileKind::Dir {
        if recursive {
            let sub = open_entry(dir, name, libc::O_RDONLY | libc::O_DIRECTORY).map_err(|e| FsError::io(path, e))?;
            clear_entries(sub.as_raw_fd(), depth, path)?;
        }
        // SAFETY: valid fd and NUL-terminated name.
        check(unsafe { libc::unlinkat(dir, name.as_ptr(), libc::AT_REMOVEDIR) })
            .map_err(|e| FsError::Io { path: path.into(), source: e })
    } else {
        // SAFETY: valid fd and NUL-terminated name.
        check(unsafe { libc::unlinkat(dir, name.as_ptr(), 0) })
            .map_err(|e| FsError::Io { path: path.into(), source: e })
    }
}

/// Removes every entry of the open directory `dir`; returns how many there were.
fn clear_entries(dir: RawFd, depth: usize, path: &str) -> Result<usize, FsError> {
    if depth >= MAX_DEPTH {
        return Err(FsError::TooLarge(format!(
            "{path}: directories nested deeper than {MAX_DEPTH} levels, the most the file API walks"
        )));
    }
    refuse_pseudo(dir, path)?;
    let mut removed = 0;
    loop {
        let batch: Vec<std::ffi::OsString> = read_dir_fd(dir)
            .map_err(|e| FsError::io(path, e))?
            .filter_map(Result::ok)
            .map(|e| e.file_name())
            .take(REMOVE_BATCH)
            .collect();
        if batch.is_empty() {
            return Ok(removed);
        }
        for n in batch {
            let sub_path = format!("{}/{}", path.trim_end_matches('/'), n.to_string_lossy());
            let c = CString::new(n.as_bytes()).map_err(|_| FsError::Invalid(sub_path.clone()))?;
            match remove_at(dir, &c, true, depth + 1, &sub_path) {
                Ok(()) | Err(FsError::NotFound(_)) => removed += 1,
                Err(e) => return Err(e),
            }
        }
    }
}

/// `name` as a path component of a walk (bytes kept as they are).
fn os(name: &[u8]) -> &OsStr {
    OsStr::from_bytes(name)
}
