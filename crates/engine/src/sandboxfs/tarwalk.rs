//! Tar downloads: a walk of a sandbox tree written as a tar stream while it
//! is read. Each file is copied in bounded pieces with exactly the size its
//! header announces (a file that grows is cut there, one that shrinks is
//! padded with zeros and logged, like GNU tar), directories are read entry by
//! entry (never collected), nesting is bounded by [`MAX_DEPTH`], and mounts
//! of kernel pseudo-filesystems are left out, like special files.

use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use strata_api::FileKind;

use super::{
    fstat, kind_of, lstat_at_c, open_entry, os, pseudo_fs_of, read_dir_fd, readlink_at_c, special_kind, FsError,
    Resolved, SandboxFs, MAX_DEPTH,
};

/// Where a tar download starts: checked before the first byte is sent.
pub struct TarRoot {
    /// The directory holding the start (the root directory itself for `/`).
    dir: OwnedFd,
    /// The start's name in `dir` (`.` for the root).
    name: CString,
    /// Its name in the archive.
    archive_name: PathBuf,
    /// Its resolved path in the sandbox.
    path: String,
    /// The sandbox's user namespace (owners are written as seen inside).
    userns: Option<strata_api::UserNamespace>,
}

/// Checks the start of a tar download: it must exist, not be a special file
/// and not be on (or be the mount point of) a pseudo-filesystem.
pub(super) fn root(fs: &SandboxFs, path: &str) -> Result<TarRoot, FsError> {
    let r: Resolved = fs.locate(path, true)?;
    let o = fs.object(&r)?;
    if o.kind() == FileKind::Other {
        return Err(FsError::Special { path: r.path, kind: special_kind(o.st.st_mode).unwrap_or("special file") });
    }
    let (name, archive_name) = if r.name.is_empty() {
        (c".".to_owned(), PathBuf::from("."))
    } else {
        (CString::new(r.name.as_bytes()).map_err(|_| FsError::Invalid(path.into()))?, PathBuf::from(&r.name))
    };
    Ok(TarRoot { dir: r.parent, name, archive_name, path: r.path, userns: fs.userns })
}

/// Writes the tree at `root` into `out`, leaving out `exclude` (absolute
/// sandbox paths, with everything under them).
pub(super) fn write(root: TarRoot, out: impl Write, exclude: &[&str]) -> Result<(), FsError> {
    let mut b = tar::Builder::new(out);
    b.follow_symlinks(false);
    let mut w = Walk { b, exclude, userns: root.userns };
    w.entry(root.dir.as_raw_fd(), &root.name, &root.archive_name, &root.path, 0)?;
    w.b.finish().map_err(|e| FsError::io(&root.path, e))?;
    Ok(())
}

struct Walk<'a, W: Write> {
    b: tar::Builder<W>,
    exclude: &'a [&'a str],
    userns: Option<strata_api::UserNamespace>,
}

fn header(st: &libc::stat, kind: tar::EntryType, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_mode(st.st_mode & 0o7777);
    h.set_uid(st.st_uid as u64);
    h.set_gid(st.st_gid as u64);
    h.set_mtime(st.st_mtime.max(0) as u64);
    h.set_entry_type(kind);
    h.set_size(size);
    h
}

/// Whether `path` is one of `exclude` or below one.
fn is_excluded(path: &str, exclude: &[&str]) -> bool {
    exclude.iter().any(|x| path == *x || path.strip_prefix(x).is_some_and(|rest| rest.starts_with('/')))
}

impl<W: Write> Walk<'_, W> {
    fn excluded(&self, path: &str) -> bool {
        is_excluded(path, self.exclude)
    }

    fn entry(&mut self, dir: RawFd, name: &CStr, archive_name: &Path, path: &str, depth: usize) -> Result<(), FsError> {
        if self.excluded(path) {
            return Ok(());
        }
        let st = match lstat_at_c(dir, name) {
            Ok(st) => super::as_seen_inside(self.userns, st),
            // Removed since the directory was read.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(FsError::io(path, e)),
        };
        let io_err = |e: io::Error| FsError::io(path, e);
        match kind_of(st.st_mode) {
            FileKind::File => {
                let fd = match open_entry(dir, name, libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY) {
                    Ok(fd) => fd,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                    Err(e) => return Err(io_err(e)),
                };
                // What was opened is what gets described: a file swapped for a FIFO
                // or a mount of a pseudo-filesystem since the lstat is left out.
                let st = fstat(fd.as_raw_fd()).map_err(io_err)?;
                if kind_of(st.st_mode) != FileKind::File || pseudo_fs_of(fd.as_raw_fd()).map_err(io_err)?.is_some() {
                    return Ok(());
                }
                let size = st.st_size as u64;
                let mut h = header(&st, tar::EntryType::Regular, size);
                let mut data = Exact { file: File::from(fd), left: size, padded: 0 };
                self.b.append_data(&mut h, archive_name, &mut data).map_err(io_err)?;
                if data.padded > 0 {
                    tracing::warn!(
                        path,
                        bytes = data.padded,
                        "file shrank while it was sent in a tar download; padded with zeros"
                    );
                }
            }
            FileKind::Symlink => {
                let target = match readlink_at_c(dir, name) {
                    Ok(t) => t,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                    Err(e) => return Err(io_err(e)),
                };
                let mut h = header(&st, tar::EntryType::Symlink, 0);
                self.b.append_link(&mut h, archive_name, os(&target)).map_err(io_err)?;
            }
            FileKind::Dir => {
                if depth >= MAX_DEPTH {
                    return Err(FsError::TooLarge(format!(
                        "{path}: directories nested deeper than {MAX_DEPTH} levels, the most a tar download walks"
                    )));
                }
                let sub = match open_entry(dir, name, libc::O_RDONLY | libc::O_DIRECTORY) {
                    Ok(fd) => fd,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                    Err(e) => return Err(io_err(e)),
                };
                if let Some(fs) = pseudo_fs_of(sub.as_raw_fd()).map_err(io_err)? {
                    tracing::debug!(path, fs, "tar download leaves out a pseudo-filesystem");
                    return Ok(());
                }
                let st = fstat(sub.as_raw_fd()).map_err(io_err)?;
                let mut h = header(&st, tar::EntryType::Directory, 0);
                self.b.append_data(&mut h, archive_name, io::empty()).map_err(io_err)?;
                for e in read_dir_fd(sub.as_raw_fd()).map_err(io_err)? {
                    let e = e.map_err(io_err)?;
                    let n = e.file_name();
                    let Ok(c) = CString::new(n.as_bytes()) else { continue };
                    let child = format!("{}/{}", path.trim_end_matches('/'), n.to_string_lossy());
                    self.entry(sub.as_raw_fd(), &c, &archive_name.join(OsStr::new(&n)), &child, depth + 1)?;
                }
            }
            // Devices, FIFOs and sockets are not exported.
            FileKind::Other => {}
        }
        Ok(())
    }
}

/// A file read as exactly `left` bytes: cut where it grew, zero-padded where it shrank.
struct Exact {
    file: File,
    left: u64,
    padded: u64,
}

impl Read for Exact {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = (self.left.min(buf.len() as u64)) as usize;
        if want == 0 {
            return Ok(0);
        }
        let n = if self.padded > 0 { 0 } else { self.file.read(&mut buf[..want])? };
        let n = if n == 0 {
            buf[..want].fill(0);
            self.padded += want as u64;
            want
        } else {
            n
        };
        self.left -= n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exclusion_drops_exactly_the_subtree() {
        let ex = ["/run/secrets"];
        assert!(
            is_excluded("/run/secrets", &ex)
                && is_excluded("/run/secrets/T", &ex)
                && is_excluded("/run/secrets/a/b", &ex)
        );
        assert!(!is_excluded("/run/secretsX", &ex) && !is_excluded("/run", &ex) && !is_excluded("/run/strata/x", &ex));
        assert!(!is_excluded("/run/secrets", &[]));
    }

    #[test]
    fn files_are_sent_with_exactly_their_announced_size() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"0123456789").unwrap();
        let mut grown = Vec::new();
        Exact { file: File::open(&p).unwrap(), left: 4, padded: 0 }.read_to_end(&mut grown).unwrap();
        assert_eq!(grown, b"0123");
        let mut shrunk = Vec::new();
        let mut e = Exact { file: File::open(&p).unwrap(), left: 16, padded: 0 };
        e.read_to_end(&mut shrunk).unwrap();
        assert_eq!(shrunk, [&b"0123456789"[..], &[0u8; 6]].concat());
        assert_eq!(e.padded, 6);
    }
}
