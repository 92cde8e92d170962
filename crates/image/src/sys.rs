//! Thin safe wrappers over the `*at` system calls the unpacker and the
//! directory reader need. Every call that takes a name operates on exactly one
//! path component relative to an open directory and never follows a symlink
//! in that component (the `O_NOFOLLOW` / `AT_SYMLINK_NOFOLLOW` family), so a
//! hostile tree cannot redirect a write or a read outside of it.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// A timestamp with nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timespec {
    pub sec: i64,
    pub nsec: i64,
}

impl Timespec {
    fn to_libc(self) -> libc::timespec {
        libc::timespec { tv_sec: self.sec as libc::time_t, tv_nsec: self.nsec as libc::c_long }
    }
}

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn cvt_size(ret: libc::ssize_t) -> io::Result<usize> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as usize)
    }
}

fn path_cstring(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

fn owned(fd: libc::c_int) -> OwnedFd {
    // SAFETY: `fd` was just returned by a successful open-like call and is
    // owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Opens a directory by path (following symlinks in the path: only used on
/// paths we or the caller chose, never on archive content).
pub(crate) fn open_dir_path(path: &Path) -> io::Result<OwnedFd> {
    let c = path_cstring(path)?;
    // SAFETY: `c` is a valid NUL-terminated string; the returned fd is checked.
    let fd = cvt(unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) })?;
    Ok(owned(fd))
}

/// Opens the subdirectory `name` of `dir`; fails with `ELOOP`/`ENOTDIR` when
/// `name` is a symlink or not a directory.
pub(crate) fn open_dir_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
    // SAFETY: `dir` is a valid open fd, `name` a valid C string; the returned fd is checked.
    let fd = cvt(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    })?;
    Ok(owned(fd))
}

/// Creates the new regular file `name` in `dir` (fails if anything exists there).
pub(crate) fn create_file_at(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<File> {
    // SAFETY: as in `open_dir_at`; O_EXCL|O_NOFOLLOW never opens an existing file or symlink.
    let fd = cvt(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    })?;
    Ok(File::from(owned(fd)))
}

/// Opens `name` in `dir` read-only without following a symlink and without
/// blocking (so a fifo opens immediately).
pub(crate) fn open_read_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<File> {
    // SAFETY: as in `open_dir_at`.
    let fd = cvt(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    })?;
    Ok(File::from(owned(fd)))
}

/// `fstatat(AT_SYMLINK_NOFOLLOW)`; `None` when `name` does not exist.
pub(crate) fn stat_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Option<libc::stat>> {
    // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd, valid C string, `st` is a writable stat buffer.
    let ret = unsafe { libc::fstatat(dir.as_raw_fd(), name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
    match cvt(ret) {
        Ok(_) => Ok(Some(st)),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// `fstat`.
pub(crate) fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd, writable stat buffer.
    cvt(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(st)
}

/// The file type bits of a mode.
pub(crate) fn file_type(st: &libc::stat) -> libc::mode_t {
    st.st_mode & libc::S_IFMT
}

/// `mkdirat`.
pub(crate) fn mkdir_at(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: valid fd and C string.
    cvt(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode as libc::mode_t) }).map(drop)
}

/// `mknodat` (fifos and overlay whiteouts only).
pub(crate) fn mknod_at(dir: BorrowedFd<'_>, name: &CStr, mode: libc::mode_t, dev: libc::dev_t) -> io::Result<()> {
    // SAFETY: valid fd and C string.
    cvt(unsafe { libc::mknodat(dir.as_raw_fd(), name.as_ptr(), mode, dev) }).map(drop)
}

/// `symlinkat`: creates `name` in `dir` pointing at `target` (not interpreted).
pub(crate) fn symlink_at(target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    // SAFETY: valid fd and C strings.
    cvt(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) }).map(drop)
}

/// `linkat` without `AT_SYMLINK_FOLLOW`.
pub(crate) fn link_at(
    old_dir: BorrowedFd<'_>,
    old_name: &CStr,
    new_dir: BorrowedFd<'_>,
    new_name: &CStr,
) -> io::Result<()> {
    // SAFETY: valid fds and C strings; flags 0 never follows a symlink.
    cvt(unsafe { libc::linkat(old_dir.as_raw_fd(), old_name.as_ptr(), new_dir.as_raw_fd(), new_name.as_ptr(), 0) })
        .map(drop)
}

/// `unlinkat` (with `AT_REMOVEDIR` for an empty directory).
pub(crate) fn unlink_at(dir: BorrowedFd<'_>, name: &CStr, is_dir: bool) -> io::Result<()> {
    let flags = if is_dir { libc::AT_REMOVEDIR } else { 0 };
    // SAFETY: valid fd and C string.
    cvt(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) }).map(drop)
}

/// `fchownat(AT_SYMLINK_NOFOLLOW)`.
pub(crate) fn lchown_at(dir: BorrowedFd<'_>, name: &CStr, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: valid fd and C string.
    cvt(unsafe { libc::fchownat(dir.as_raw_fd(), name.as_ptr(), uid, gid, libc::AT_SYMLINK_NOFOLLOW) }).map(drop)
}

/// `fchown`.
pub(crate) fn fchown(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: valid fd.
    cvt(unsafe { libc::fchown(fd.as_raw_fd(), uid, gid) }).map(drop)
}

/// `fchmod`.
pub(crate) fn fchmod(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    // SAFETY: valid fd.
    cvt(unsafe { libc::fchmod(fd.as_raw_fd(), mode as libc::mode_t) }).map(drop)
}

/// `futimens`, setting both atime and mtime to `t`.
pub(crate) fn futimens(fd: BorrowedFd<'_>, t: Timespec) -> io::Result<()> {
    let times = [t.to_libc(), t.to_libc()];
    // SAFETY: valid fd; `times` points to two timespecs.
    cvt(unsafe { libc::futimens(fd.as_raw_fd(), times.as_ptr()) }).map(drop)
}

/// `utimensat(AT_SYMLINK_NOFOLLOW)`, setting both atime and mtime to `t`.
pub(crate) fn lutimens_at(dir: BorrowedFd<'_>, name: &CStr, t: Timespec) -> io::Result<()> {
    let times = [t.to_libc(), t.to_libc()];
    // SAFETY: valid fd and C string; `times` points to two timespecs.
    cvt(unsafe { libc::utimensat(dir.as_raw_fd(), name.as_ptr(), times.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) }).map(drop)
}

/// `fsetxattr`.
pub(crate) fn fsetxattr(fd: BorrowedFd<'_>, name: &CStr, value: &[u8]) -> io::Result<()> {
    // SAFETY: valid fd and C string; `value` is a readable buffer of the given length.
    cvt(unsafe { libc::fsetxattr(fd.as_raw_fd(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0) }).map(drop)
}

/// `flistxattr`: the names of the extended attributes of `fd` (empty when the
/// file system does not support them).
pub(crate) fn flistxattr(fd: BorrowedFd<'_>) -> io::Result<Vec<CString>> {
    for _ in 0..4 {
        // SAFETY: a NULL buffer of size 0 asks for the needed size.
        let need = unsafe { libc::flistxattr(fd.as_raw_fd(), std::ptr::null_mut(), 0) };
        let need = match cvt_size(need) {
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        if need == 0 {
            return Ok(Vec::new());
        }
        let mut buf = vec![0u8; need];
        // SAFETY: `buf` is writable for `buf.len()` bytes.
        let got = unsafe { libc::flistxattr(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        match cvt_size(got) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(buf
                    .split(|b| *b == 0)
                    .filter(|s| !s.is_empty())
                    .filter_map(|s| CString::new(s).ok())
                    .collect());
            }
            // The list grew between the two calls: retry.
            Err(e) if e.raw_os_error() == Some(libc::ERANGE) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other("extended attribute list keeps changing"))
}

/// `fgetxattr`.
pub(crate) fn fgetxattr(fd: BorrowedFd<'_>, name: &CStr) -> io::Result<Vec<u8>> {
    for _ in 0..4 {
        // SAFETY: a NULL buffer of size 0 asks for the needed size.
        let need = cvt_size(unsafe { libc::fgetxattr(fd.as_raw_fd(), name.as_ptr(), std::ptr::null_mut(), 0) })?;
        let mut buf = vec![0u8; need];
        // SAFETY: `buf` is writable for `buf.len()` bytes.
        let got = unsafe { libc::fgetxattr(fd.as_raw_fd(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        match cvt_size(got) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(buf);
            }
            Err(e) if e.raw_os_error() == Some(libc::ERANGE) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other("extended attribute keeps changing"))
}

/// `readlinkat`: the raw target of the symlink `name` in `dir`.
pub(crate) fn readlink_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: valid fd and C string; `buf` is writable for `buf.len()` bytes.
    let n = cvt_size(unsafe { libc::readlinkat(dir.as_raw_fd(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })?;
    if n >= buf.len() {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "symlink target too long"));
    }
    buf.truncate(n);
    Ok(buf)
}

/// The entry names of the directory `dir` (without `.` and `..`), unsorted.
pub(crate) fn read_dir_names(dir: BorrowedFd<'_>) -> io::Result<Vec<CString>> {
    // fdopendir takes ownership of its fd, so give it a duplicate.
    // SAFETY: valid fd; F_DUPFD_CLOEXEC returns a new fd or -1.
    let dup = cvt(unsafe { libc::fcntl(dir.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) })?;
    // SAFETY: `dup` is an open directory fd we own; on success the DIR owns it.
    let dirp = unsafe { libc::fdopendir(dup) };
    if dirp.is_null() {
        let e = io::Error::last_os_error();
        // SAFETY: fdopendir failed, so we still own `dup`.
        unsafe { libc::close(dup) };
        return Err(e);
    }
    // SAFETY: `dirp` is a valid DIR stream (the dup shares the offset of `dir`).
    unsafe { libc::rewinddir(dirp) };
    let mut names = Vec::new();
    let result = loop {
        // SAFETY: errno is thread-local; clearing it distinguishes end-of-stream from errors.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: `dirp` is a valid DIR stream.
        let ent = unsafe { libc::readdir(dirp) };
        if ent.is_null() {
            let e = io::Error::last_os_error();
            break if e.raw_os_error().unwrap_or(0) == 0 { Ok(()) } else { Err(e) };
        }
        // SAFETY: `ent` points to a dirent valid until the next readdir call;
        // `d_name` is NUL-terminated. We copy it out immediately.
        let name = unsafe { CStr::from_ptr((*ent).d_name.as_ptr()) };
        let bytes = name.to_bytes();
        if bytes != b"." && bytes != b".." {
            names.push(name.to_owned());
        }
    };
    // SAFETY: `dirp` is valid and closed exactly once (this also closes `dup`).
    unsafe { libc::closedir(dirp) };
    result.map(|()| names)
}

/// Removes `name` from `dir`: a non-directory is unlinked, a directory is
/// removed recursively. Symlinks are removed, never followed.
pub(crate) fn remove_tree_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    let Some(st) = stat_at(dir, name)? else { return Ok(()) };
    if file_type(&st) != libc::S_IFDIR {
        return unlink_at(dir, name, false);
    }
    {
        let sub = open_dir_at(dir, name)?;
        for child in read_dir_names(std::os::fd::AsFd::as_fd(&sub))? {
            remove_tree_at(std::os::fd::AsFd::as_fd(&sub), &child)?;
        }
    }
    unlink_at(dir, name, true)
}

/// `syncfs`: flushes the file system holding `fd`.
pub(crate) fn syncfs(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: valid fd.
    cvt(unsafe { libc::syncfs(fd.as_raw_fd()) }).map(drop)
}

/// Whether we run as root (ownership can be preserved).
pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The `dev_t` of major/minor numbers.
pub(crate) fn makedev(major: u32, minor: u32) -> libc::dev_t {
    libc::makedev(major, minor)
}
