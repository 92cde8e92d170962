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

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

use strata_api::{FileKind, FileStat};
use strata_runtime::openat2::{RESOLVE_BENEATH, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS};

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
    fn io(path: &str, source: io::Error) -> Self {
        if source.kind() == io::ErrorKind::NotFound {
            return FsError::NotFound(path.to_string());
        }
        if source.raw_os_error() == Some(libc::EXDEV) || source.raw_os_error() == Some(libc::ELOOP) {
            return FsError::Escape(path.to_string());
        }
        FsError::Io { path: path.to_string(), source }
    }
}

const CONFINED: u64 = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;

fn openat2(dir: RawFd, rel: &str, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    strata_runtime::openat2::openat2(dir, rel, flags, mode, CONFINED)
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
    let c = cstr(if name.is_empty() { "." } else { name })?;
    // SAFETY: zeroed stat is valid; fstatat writes into it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd, NUL-terminated name, valid out-pointer.
    check(unsafe { libc::fstatat(dir, c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW | libc::AT_EMPTY_PATH) })?;
    Ok(st)
}

fn readlink_at(dir: RawFd, name: &str) -> io::Result<String> {
    let c = cstr(name)?;
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: buf is writable for its length.
    let n = unsafe { libc::readlinkat(dir, c.as_ptr(), buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

fn kind_of(mode: u32) -> FileKind {
    match mode & libc::S_IFMT {
        libc::S_IFREG => FileKind::File,
        libc::S_IFDIR => FileKind::Dir,
        libc::S_IFLNK => FileKind::Symlink,
        _ => FileKind::Other,
    }
}

/// A sandbox's root, opened for confined access.
pub struct SandboxFs {
    root: OwnedFd,
}

/// A resolved location: the parent directory (opened) and the final name.
pub struct Resolved {
    /// The parent directory.
    pub parent: OwnedFd,
    /// The last component ("" for the root itself).
    pub name: String,
    /// The resolved absolute path inside the sandbox.
    pub path: String,
}

impl SandboxFs {
    /// Opens the root of the sandbox whose init has host pid `init_pid`.
    pub fn open(init_pid: i32) -> io::Result<Self> {
        let f = File::open(format!("/proc/{init_pid}/root"))?;
        Ok(SandboxFs { root: OwnedFd::from(f) })
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

    /// Resolves `path` and opens its parent directory.
    pub fn locate(&self, path: &str, follow_last: bool) -> Result<Resolved, FsError> {
        let mut comps = self.resolve(path, follow_last)?;
        let name = comps.pop().unwrap_or_default();
        let parent_rel = comps.join("/");
        let parent = openat2(self.root.as_raw_fd(), &parent_rel, libc::O_PATH | libc::O_DIRECTORY, 0).map_err(|e| FsError::io(path, e))?;
        let abs = if name.is_empty() { "/".to_string() } else if parent_rel.is_empty() { format!("/{name}") } else { format!("/{parent_rel}/{name}") };
        Ok(Resolved { parent, name, path: abs })
    }

    /// Opens a file or directory (following symlinks inside the sandbox).
    pub fn open_path(&self, path: &str, flags: i32, mode: u32) -> Result<OwnedFd, FsError> {
        let r = self.locate(path, true)?;
        openat2(r.parent.as_raw_fd(), &r.name, flags, mode).map_err(|e| FsError::io(path, e))
    }

    /// Metadata of a path (a symlink in the last component is described, not followed).
    pub fn stat(&self, path: &str) -> Result<FileStat, FsError> {
        let r = self.locate(path, false)?;
        let st = lstat_at(r.parent.as_raw_fd(), &r.name).map_err(|e| FsError::io(path, e))?;
        let link_target = (kind_of(st.st_mode) == FileKind::Symlink).then(|| readlink_at(r.parent.as_raw_fd(), &r.name).ok()).flatten();
        Ok(stat_of(&r.path, &r.name, &st, link_target))
    }

    /// Entries of a directory, sorted by name.
    pub fn list(&self, path: &str) -> Result<Vec<FileStat>, FsError> {
        let dir = self.open_path(path, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
        let base = self.resolve(path, true)?;
        let base = if base.is_empty() { String::new() } else { format!("/{}", base.join("/")) };
        let mut out = Vec::new();
        for entry in std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd())).map_err(|e| FsError::io(path, e))? {
            let entry = entry.map_err(|e| FsError::io(path, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(st) = lstat_at(dir.as_raw_fd(), &name) else { continue };
            let link = (kind_of(st.st_mode) == FileKind::Symlink).then(|| readlink_at(dir.as_raw_fd(), &name).ok()).flatten();
            out.push(stat_of(&format!("{base}/{name}"), &name, &st, link));
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
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
                            return Err(FsError::Io { path: cur, source: io::Error::from_raw_os_error(libc::ENOTDIR) });
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
            return Err(FsError::Io { path: path.into(), source: io::Error::from_raw_os_error(libc::EEXIST) });
        }
        let dir = openat2(r.parent.as_raw_fd(), "", libc::O_RDONLY | libc::O_DIRECTORY, 0).map_err(|e| FsError::io(path, e))?;
        let c = cstr(&r.name).map_err(|e| FsError::io(path, e))?;
        // SAFETY: valid directory fd and NUL-terminated name.
        check(unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), mode) }).map_err(|e| FsError::Io { path: path.into(), source: e })
    }

    /// Writes a file atomically (temp file + rename in the same directory).
    pub fn write_file(&self, path: &str, data: &[u8], mode: u32) -> Result<(), FsError> {
        let r = self.locate(path, true)?;
        if r.name.is_empty() {
            return Err(FsError::Invalid(path.to_string()));
        }
        let dir = openat2(r.parent.as_raw_fd(), "", libc::O_RDONLY | libc::O_DIRECTORY, 0).map_err(|e| FsError::io(path, e))?;
        let tmp = format!(".strata-upload-{:016x}", rand::random::<u64>());
        let fd = openat2(dir.as_raw_fd(), &tmp, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, mode).map_err(|e| FsError::io(path, e))?;
        let mut f = File::from(fd);
        let res = (|| -> io::Result<()> {
            use std::io::Write;
            use std::os::unix::fs::PermissionsExt;
            f.write_all(data)?;
            f.set_permissions(std::fs::Permissions::from_mode(mode))?;
            let (t, n) = (cstr(&tmp)?, cstr(&r.name)?);
            // SAFETY: valid directory fd and NUL-terminated names.
            check(unsafe { libc::renameat(dir.as_raw_fd(), t.as_ptr(), dir.as_raw_fd(), n.as_ptr()) })
        })();
        if let Err(e) = res {
            if let Ok(t) = cstr(&tmp) {
                // SAFETY: valid directory fd and NUL-terminated name.
                unsafe { libc::unlinkat(dir.as_raw_fd(), t.as_ptr(), 0) };
            }
            return Err(FsError::io(path, e));
        }
        Ok(())
    }

    /// Removes a file, symlink or (with `recursive`) a directory tree.
    pub fn remove(&self, path: &str, recursive: bool) -> Result<(), FsError> {
        let r = self.locate(path, false)?;
        if r.name.is_empty() {
            return Err(FsError::Invalid("/ cannot be removed".into()));
        }
        let dir = openat2(r.parent.as_raw_fd(), "", libc::O_RDONLY | libc::O_DIRECTORY, 0).map_err(|e| FsError::io(path, e))?;
        remove_at(dir.as_raw_fd(), &r.name, recursive).map_err(|e| FsError::io(path, e))
    }

    /// Renames `from` to `to` (neither may leave the root).
    pub fn rename(&self, from: &str, to: &str) -> Result<(), FsError> {
        let a = self.locate(from, false)?;
        let b = self.locate(to, false)?;
        if a.name.is_empty() || b.name.is_empty() {
            return Err(FsError::Invalid("/ cannot be moved".into()));
        }
        let da = openat2(a.parent.as_raw_fd(), "", libc::O_RDONLY | libc::O_DIRECTORY, 0).map_err(|e| FsError::io(from, e))?;
        let db = openat2(b.parent.as_raw_fd(), "", libc::O_RDONLY | libc::O_DIRECTORY, 0).map_err(|e| FsError::io(to, e))?;
        let (na, nb) = (cstr(&a.name).map_err(|e| FsError::io(from, e))?, cstr(&b.name).map_err(|e| FsError::io(to, e))?);
        // SAFETY: valid directory fds and NUL-terminated names.
        check(unsafe { libc::renameat(da.as_raw_fd(), na.as_ptr(), db.as_raw_fd(), nb.as_ptr()) }).map_err(|e| FsError::io(from, e))
    }

    /// Writes `path` (file or directory tree) as a tar stream into `out`. Symlinks are stored as symlinks.
    pub fn tar_to(&self, path: &str, out: impl io::Write) -> Result<(), FsError> {
        let r = self.locate(path, true)?;
        let mut b = tar::Builder::new(out);
        b.follow_symlinks(false);
        let top = if r.name.is_empty() { ".".to_string() } else { r.name.clone() };
        let dir = openat2(r.parent.as_raw_fd(), "", libc::O_RDONLY | libc::O_DIRECTORY, 0).map_err(|e| FsError::io(path, e))?;
        tar_entry(&mut b, dir.as_raw_fd(), if r.name.is_empty() { "" } else { &r.name }, &top).map_err(|e| FsError::io(path, e))?;
        b.finish().map_err(|e| FsError::io(path, e))?;
        Ok(())
    }

    /// Extracts a tar stream under directory `dest` (created if missing). Every
    /// entry is resolved like any other path: entries that would leave the root
    /// are refused, naming the entry. Device nodes are refused.
    pub fn untar_from(&self, dest: &str, input: impl io::Read) -> Result<u64, FsError> {
        self.mkdir(dest, true, 0o755)?;
        let base = self.resolve(dest, true)?;
        let base = format!("/{}", base.join("/"));
        let mut ar = tar::Archive::new(input);
        let mut n = 0;
        for entry in ar.entries().map_err(|e| FsError::io(dest, e))? {
            let mut entry = entry.map_err(|e| FsError::io(dest, e))?;
            let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
            let rel = name.trim_start_matches("./");
            if name.starts_with('/') || rel.split('/').any(|c| c == "..") {
                return Err(FsError::Escape(name));
            }
            if rel.is_empty() {
                continue;
            }
            let target = format!("{}/{}", base.trim_end_matches('/'), rel.trim_end_matches('/'));
            let mode = entry.header().mode().unwrap_or(0o644) & 0o7777 & !0o6000;
            match entry.header().entry_type() {
                tar::EntryType::Directory => self.mkdir(&target, true, mode)?,
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    let mut data = Vec::new();
                    io::Read::read_to_end(&mut entry, &mut data).map_err(|e| FsError::io(&name, e))?;
                    // Parents resolve inside the root; a symlinked parent that leaves it is refused.
                    self.locate(&target, false)?;
                    self.write_file(&target, &data, mode)?;
                }
                tar::EntryType::Symlink => {
                    let link = entry.link_name_bytes().map(|l| String::from_utf8_lossy(&l).into_owned()).unwrap_or_default();
                    let r = self.locate(&target, false)?;
                    let dir = openat2(r.parent.as_raw_fd(), "", libc::O_RDONLY | libc::O_DIRECTORY, 0).map_err(|e| FsError::io(&name, e))?;
                    let (l, nm) = (cstr(&link).map_err(|e| FsError::io(&name, e))?, cstr(&r.name).map_err(|e| FsError::io(&name, e))?);
                    // SAFETY: valid directory fd and NUL-terminated strings.
                    check(unsafe { libc::symlinkat(l.as_ptr(), dir.as_raw_fd(), nm.as_ptr()) }).map_err(|e| FsError::io(&name, e))?;
                }
                other => {
                    return Err(FsError::Io { path: name, source: io::Error::new(io::ErrorKind::InvalidInput, format!("unsupported tar entry type {other:?}")) });
                }
            }
            n += 1;
        }
        Ok(n)
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
    }
}

fn remove_at(dir: RawFd, name: &str, recursive: bool) -> io::Result<()> {
    let st = lstat_at(dir, name)?;
    let c = cstr(name)?;
    if kind_of(st.st_mode) == FileKind::Dir {
        if recursive {
            let sub = openat2(dir, name, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
            let names: Vec<String> = std::fs::read_dir(format!("/proc/self/fd/{}", sub.as_raw_fd()))?.filter_map(Result::ok).map(|e| e.file_name().to_string_lossy().into_owned()).collect();
            for n in names {
                remove_at(sub.as_raw_fd(), &n, true)?;
            }
        }
        // SAFETY: valid fd and NUL-terminated name.
        check(unsafe { libc::unlinkat(dir, c.as_ptr(), libc::AT_REMOVEDIR) })
    } else {
        // SAFETY: valid fd and NUL-terminated name.
        check(unsafe { libc::unlinkat(dir, c.as_ptr(), 0) })
    }
}

fn tar_entry<W: io::Write>(b: &mut tar::Builder<W>, dir: RawFd, name: &str, archive_name: &str) -> io::Result<()> {
    let st = lstat_at(dir, name)?;
    let mut h = tar::Header::new_gnu();
    h.set_mode(st.st_mode & 0o7777);
    h.set_uid(st.st_uid as u64);
    h.set_gid(st.st_gid as u64);
    h.set_mtime(st.st_mtime.max(0) as u64);
    match kind_of(st.st_mode) {
        FileKind::File => {
            // O_NONBLOCK and a re-check: a file swapped for a FIFO must not block the daemon.
            let f = File::from(openat2(dir, name, libc::O_RDONLY | libc::O_NONBLOCK, 0)?);
            if !f.metadata()?.is_file() {
                return Ok(());
            }
            h.set_entry_type(tar::EntryType::Regular);
            h.set_size(st.st_size as u64);
            b.append_data(&mut h, archive_name, f)?;
        }
        FileKind::Symlink => {
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            b.append_link(&mut h, archive_name, readlink_at(dir, name)?)?;
        }
        FileKind::Dir => {
            h.set_entry_type(tar::EntryType::Directory);
            h.set_size(0);
            b.append_data(&mut h, archive_name, io::empty())?;
            let sub = openat2(dir, name, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
            let mut names: Vec<String> = std::fs::read_dir(format!("/proc/self/fd/{}", sub.as_raw_fd()))?
                .filter_map(Result::ok)
                .map(|e| std::ffi::OsStr::from_bytes(e.file_name().as_bytes()).to_string_lossy().into_owned())
                .collect();
            names.sort();
            for n in names {
                tar_entry(b, sub.as_raw_fd(), &n, &format!("{archive_name}/{n}"))?;
            }
        }
        FileKind::Other => {} // devices, fifos and sockets are not exported
    }
    Ok(())
}
