//! Tar uploads, applied entry by entry as the stream is read, and rolled back
//! when any entry is refused or the stream breaks.
//!
//! The archive is read in the tar crate's *raw* mode: GNU long names, long
//! link names and pax headers are read here with bounds ([`MAX_NAME`],
//! [`MAX_PAX`]) instead of into memory of whatever size an archive claims.
//!
//! Every change is journaled so a failed upload leaves the sandbox as it
//! found it: files, symlinks and hardlinks are made under a temp name and
//! renamed into place; a path they replace is first kept under a second
//! name (a hardlink to it) that a rollback renames back; directories the
//! upload made are removed again (when still empty). On success the kept
//! names are removed. The journal is bounded by [`MAX_JOURNAL_BYTES`] of
//! paths. Nothing is ever followed out of the root: parents are opened
//! confined ([`SandboxFs::locate`]), and every call on a final name is one
//! that does not follow a symlink there.

use std::collections::HashMap;
use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, RawFd};

use strata_api::FileKind;

use super::{
    check, fstat, is_mount_root, kind_of, lstat_at, open_entry, openat2, rename_at, special_kind, temp_name, unlink_at,
    FsError, SandboxFs,
};

/// Longest GNU long name or long link name accepted.
pub const MAX_NAME: u64 = 64 * 1024;
/// Largest pax extended header accepted.
pub const MAX_PAX: u64 = 1 << 20;
/// Most bytes of paths the rollback journal of one upload holds (about
/// 300,000 entries of typical paths).
pub const MAX_JOURNAL_BYTES: usize = 32 << 20;

/// One change made by an upload.
enum Op {
    /// A file, symlink or hardlink at a path that was free.
    Created(String),
    /// A directory that did not exist.
    CreatedDir(String),
    /// `target` replaced; what was there is kept as `backup` in the same directory.
    Replaced { target: String, backup: String },
}

struct Untar<'a> {
    fs: &'a SandboxFs,
    base: String,
    journal: Vec<Op>,
    journal_bytes: usize,
    /// Files this upload made, by resolved path: (device, inode), for hardlinks.
    files: HashMap<String, (u64, u64)>,
}

/// Extensions that apply to the next entry.
#[derive(Default)]
struct Pending {
    name: Option<Vec<u8>>,
    link: Option<Vec<u8>>,
    size: Option<u64>,
}

pub(super) fn extract(fs: &SandboxFs, dest: &str, input: impl Read) -> Result<u64, FsError> {
    let base = format!("/{}", fs.resolve(dest, true)?.join("/"));
    let mut u = Untar { fs, base, journal: Vec::new(), journal_bytes: 0, files: HashMap::new() };
    let base = u.base.clone();
    let res = u.mkdirs(&base, None, None).and_then(|_| u.run(input));
    match res {
        Ok(n) => {
            u.commit();
            Ok(n)
        }
        Err(e) => {
            u.rollback();
            Err(e)
        }
    }
}

fn stream_error(e: io::Error, after: u64) -> FsError {
    if e.kind() == io::ErrorKind::ConnectionAborted {
        return FsError::CutOff("tar upload".into());
    }
    FsError::Archive { entry: format!("(after {after} entries)"), reason: format!("malformed tar stream: {e}") }
}

/// An archive name as a path relative to the upload's directory ("" for the directory itself).
fn relative(name: &str, entry: &str) -> Result<String, FsError> {
    if name.starts_with('/') || name.split('/').any(|c| c == "..") {
        return Err(FsError::Escape(entry.to_string()));
    }
    Ok(name.split('/').filter(|c| !c.is_empty() && *c != ".").collect::<Vec<_>>().join("/"))
}

fn utf8(bytes: Vec<u8>, entry: &str) -> Result<String, FsError> {
    String::from_utf8(bytes).map_err(|e| FsError::Archive {
        entry: entry.to_string(),
        reason: format!("{:?} is not UTF-8, which the file API's paths must be", String::from_utf8_lossy(e.as_bytes())),
    })
}

/// Reads an extension entry whole, refusing one larger than `max`.
fn read_extension(entry: &mut impl Read, size: u64, max: u64, what: &str, after: u64) -> Result<Vec<u8>, FsError> {
    if size > max {
        return Err(FsError::Archive {
            entry: format!("(after {after} entries)"),
            reason: format!("a {what} of {size} bytes (at most {max} are accepted)"),
        });
    }
    let mut data = Vec::with_capacity(size as usize);
    entry.take(size).read_to_end(&mut data).map_err(|e| stream_error(e, after))?;
    if (data.len() as u64) < size {
        return Err(FsError::Archive {
            entry: format!("(after {after} entries)"),
            reason: format!("the stream ended inside a {what}"),
        });
    }
    Ok(data)
}

fn without_nuls(mut v: Vec<u8>) -> Vec<u8> {
    while v.last() == Some(&0) {
        v.pop();
    }
    v
}

impl Untar<'_> {
    fn run(&mut self, input: impl Read) -> Result<u64, FsError> {
        let mut ar = tar::Archive::new(input);
        let entries = ar.entries().map_err(|e| stream_error(e, 0))?.raw(true);
        let mut pending = Pending::default();
        let mut n = 0u64;
        for entry in entries {
            let mut entry = entry.map_err(|e| stream_error(e, n))?;
            let ty = entry.header().entry_type();
            let size = entry.header().entry_size().map_err(|e| stream_error(e, n))?;
            match ty {
                tar::EntryType::GNULongName => {
                    pending.name = Some(without_nuls(read_extension(&mut entry, size, MAX_NAME, "GNU long name", n)?));
                    continue;
                }
                tar::EntryType::GNULongLink => {
                    pending.link =
                        Some(without_nuls(read_extension(&mut entry, size, MAX_NAME, "GNU long link name", n)?));
                    continue;
                }
                tar::EntryType::XHeader => {
                    let data = read_extension(&mut entry, size, MAX_PAX, "pax header", n)?;
                    for ext in tar::PaxExtensions::new(&data) {
                        let ext = ext.map_err(|e| FsError::Archive {
                            entry: format!("(after {n} entries)"),
                            reason: format!("malformed pax header: {e}"),
                        })?;
                        match ext.key_bytes() {
                            b"path" => pending.name = Some(ext.value_bytes().to_vec()),
                            b"linkpath" => pending.link = Some(ext.value_bytes().to_vec()),
                            b"size" => {
                                pending.size = Some(ext.value().ok().and_then(|v| v.parse().ok()).ok_or_else(|| {
                                    FsError::Archive {
                                        entry: format!("(after {n} entries)"),
                                        reason: "a pax size that is not a number".into(),
                                    }
                                })?)
                            }
                            _ => {}
                        }
                    }
                    continue;
                }
                tar::EntryType::XGlobalHeader => continue,
                _ => {}
            }
            let name = utf8(
                pending.name.take().unwrap_or_else(|| entry.path_bytes().into_owned()),
                &format!("(after {n} entries)"),
            )?;
            let link = pending
                .link
                .take()
                .or_else(|| entry.link_name_bytes().map(|l| l.into_owned()))
                .map(|l| utf8(l, &name))
                .transpose()?;
            if let Some(pax) = pending.size.take().filter(|s| *s != size) {
                return Err(FsError::Archive { entry: name, reason: format!("its pax size ({pax}) differs from its header's ({size}); entries of 8 GiB and more are not accepted") });
            }
            let mode = entry.header().mode().unwrap_or(0o644) & 0o7777 & !0o6000;
            self.apply(&mut entry, ty, &name, link.as_deref(), size, mode)?;
            n += 1;
        }
        Ok(n)
    }

    fn record(&mut self, op: Op) -> Result<(), FsError> {
        self.journal_bytes += match &op {
            Op::Created(p) | Op::CreatedDir(p) => p.len() + 16,
            Op::Replaced { target, backup } => target.len() + backup.len() + 16,
        };
        self.journal.push(op);
        if self.journal_bytes > MAX_JOURNAL_BYTES {
            return Err(FsError::TooLarge(format!("tar upload: more entries than one upload may hold (their paths exceed {MAX_JOURNAL_BYTES} bytes); split it")));
        }
        Ok(())
    }

    fn apply(
        &mut self,
        entry: &mut impl Read,
        ty: tar::EntryType,
        name: &str,
        link: Option<&str>,
        size: u64,
        mode: u32,
    ) -> Result<(), FsError> {
        let refuse = |reason: String| Err(FsError::Archive { entry: name.to_string(), reason });
        let rel = relative(name, name)?;
        if rel.is_empty() {
            return Ok(());
        }
        let target = format!("{}/{rel}", self.base.trim_end_matches('/'));
        let special = "device nodes, FIFOs and other special files cannot be uploaded";
        match ty {
            tar::EntryType::Directory => self.mkdirs(&target, Some(mode), Some(name)),
            // Old archives mark directories by a trailing slash only.
            tar::EntryType::Regular | tar::EntryType::Continuous if name.ends_with('/') => {
                self.mkdirs(&target, Some(mode), Some(name))
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                self.parents(&target, name)?;
                self.put(name, &target, |dir, tmp| {
                    let fd = openat2(dir, tmp, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW, 0o600)
                        .map_err(|e| FsError::io(&target, e))?;
                    let mut f = File::from(fd);
                    let written =
                        super::copy_buffered(&mut entry.take(size), &mut f).map_err(|e| FsError::io(&target, e))?;
                    if written < size {
                        return Err(FsError::Archive {
                            entry: name.to_string(),
                            reason: format!("the stream ended inside it ({written} of {size} bytes)"),
                        });
                    }
                    // SAFETY: valid fd.
                    check(unsafe { libc::fchmod(f.as_raw_fd(), mode) }).map_err(|e| FsError::io(&target, e))?;
                    let st = fstat(f.as_raw_fd()).map_err(|e| FsError::io(&target, e))?;
                    Ok(Some((st.st_dev, st.st_ino)))
                })
            }
            tar::EntryType::Symlink => {
                let Some(link) = link.filter(|l| !l.is_empty()) else {
                    return refuse("a symlink without a target".into());
                };
                let l = CString::new(link).map_err(|_| FsError::Archive {
                    entry: name.to_string(),
                    reason: "a symlink target with a NUL byte".into(),
                })?;
                self.parents(&target, name)?;
                self.put(name, &target, |dir, tmp| {
                    let t = CString::new(tmp).map_err(|_| FsError::Invalid(target.clone()))?;
                    // SAFETY: valid fd and NUL-terminated strings.
                    check(unsafe { libc::symlinkat(l.as_ptr(), dir, t.as_ptr()) })
                        .map_err(|e| FsError::io(&target, e))?;
                    Ok(None)
                })
            }
            tar::EntryType::Link => {
                let Some(link) = link.filter(|l| !l.is_empty()) else {
                    return refuse("a hardlink without a target".into());
                };
                let lrel = relative(link, &format!("{name} (a hardlink to {link})"))?;
                let lt = self.fs.locate(&format!("{}/{lrel}", self.base.trim_end_matches('/')), false)?;
                let Some(&(dev, ino)) = self.files.get(&lt.path) else {
                    return refuse(format!("a hardlink to {link:?}, which is not a file of this upload (hardlinks may only point at regular files the same upload brought, earlier in the archive)"));
                };
                self.parents(&target, name)?;
                let from = CString::new(lt.name.as_bytes()).map_err(|_| FsError::Invalid(lt.path.clone()))?;
                self.put(name, &target, |dir, tmp| {
                    let t = CString::new(tmp).map_err(|_| FsError::Invalid(target.clone()))?;
                    // SAFETY: valid fds and NUL-terminated names; no AT_SYMLINK_FOLLOW, so a
                    // symlink swapped in at the target would be linked itself, never followed.
                    check(unsafe { libc::linkat(lt.parent.as_raw_fd(), from.as_ptr(), dir, t.as_ptr(), 0) })
                        .map_err(|e| FsError::io(&target, e))?;
                    let st = lstat_at(dir, tmp).map_err(|e| FsError::io(&target, e))?;
                    if (st.st_dev, st.st_ino) != (dev, ino) {
                        return Err(FsError::Archive {
                            entry: name.to_string(),
                            reason: format!("its target {link:?} was replaced while the upload ran"),
                        });
                    }
                    Ok(Some((dev, ino)))
                })
            }
            tar::EntryType::Char => refuse(format!("a character device (type '3'): {special}")),
            tar::EntryType::Block => refuse(format!("a block device (type '4'): {special}")),
            tar::EntryType::Fifo => refuse(format!("a FIFO (type '6'): {special}")),
            tar::EntryType::GNUSparse => refuse(
                "a GNU sparse file (type 'S'), which uploads do not take: make the archive without --sparse".into(),
            ),
            other => refuse(format!(
                "an entry of type {:?} ('{}'), which uploads do not take",
                other,
                other.as_byte() as char
            )),
        }
    }

    /// Makes the missing parents of `target` (journaled).
    fn parents(&mut self, target: &str, entry: &str) -> Result<(), FsError> {
        match target.rsplit_once('/') {
            Some((parent, _)) if !parent.is_empty() => self.mkdirs(parent, None, Some(entry)),
            _ => Ok(()),
        }
    }

    /// `mkdir -p target` (journaled): missing directories are made (the last
    /// one with `mode`, the others 0755); existing ones are left as they are.
    fn mkdirs(&mut self, target: &str, mode: Option<u32>, entry: Option<&str>) -> Result<(), FsError> {
        let comps = self.fs.resolve(target, true)?;
        let mut cur = String::new();
        for (i, c) in comps.iter().enumerate() {
            cur.push('/');
            cur.push_str(c);
            let r = self.fs.locate(&cur, false)?;
            match lstat_at(r.parent.as_raw_fd(), &r.name) {
                Ok(st) if kind_of(st.st_mode) == FileKind::Dir => continue,
                Ok(_) => {
                    return Err(match entry {
                        Some(e) => FsError::Archive {
                            entry: e.to_string(),
                            reason: format!("{cur} exists and is not a directory"),
                        },
                        None => FsError::errno(&cur, libc::ENOTDIR),
                    })
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(FsError::io(&cur, e)),
            }
            let name = CString::new(r.name.as_bytes()).map_err(|_| FsError::Invalid(cur.clone()))?;
            // SAFETY: valid directory fd and NUL-terminated name.
            check(unsafe { libc::mkdirat(r.parent.as_raw_fd(), name.as_ptr(), 0o700) })
                .map_err(|e| FsError::Io { path: cur.clone(), source: e })?;
            self.record(Op::CreatedDir(cur.clone()))?;
            // The exact mode (mkdir's is masked by the umask), set through a
            // descriptor: a path-based chmod would follow a symlink swapped in.
            let want = if i + 1 == comps.len() { mode.unwrap_or(0o755) } else { 0o755 };
            let fd = open_entry(r.parent.as_raw_fd(), &name, libc::O_RDONLY | libc::O_DIRECTORY)
                .map_err(|e| FsError::io(&cur, e))?;
            // SAFETY: valid fd.
            check(unsafe { libc::fchmod(fd.as_raw_fd(), want) }).map_err(|e| FsError::io(&cur, e))?;
        }
        Ok(())
    }

    /// Puts what `make` creates (under a temp name in the target's directory)
    /// at `target`, keeping what it replaces for a rollback.
    fn put(
        &mut self,
        entry: &str,
        target: &str,
        make: impl FnOnce(RawFd, &str) -> Result<Option<(u64, u64)>, FsError>,
    ) -> Result<(), FsError> {
        let r = self.fs.locate(target, false)?;
        if r.name.is_empty() {
            return Err(FsError::Archive { entry: entry.to_string(), reason: "it would replace the root".into() });
        }
        let dir = r.parent.as_raw_fd();
        let existing = match lstat_at(dir, &r.name) {
            Ok(st) => Some(st),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(FsError::io(&r.path, e)),
        };
        if let Some(st) = &existing {
            let c = CString::new(r.name.as_bytes()).map_err(|_| FsError::Invalid(r.path.clone()))?;
            if is_mount_root(dir, &c).map_err(|e| FsError::io(&r.path, e))? {
                return Err(FsError::Archive {
                    entry: entry.to_string(),
                    reason: format!("{} is a mount point of the sandbox, which uploads do not replace", r.path),
                });
            }
            match kind_of(st.st_mode) {
                FileKind::Dir => {
                    return Err(FsError::Archive {
                        entry: entry.to_string(),
                        reason: format!("{} is a directory, which this entry does not replace", r.path),
                    })
                }
                FileKind::Other => {
                    return Err(FsError::Archive {
                        entry: entry.to_string(),
                        reason: format!(
                            "{} is a {}, which uploads do not replace",
                            r.path,
                            special_kind(st.st_mode).unwrap_or("special file")
                        ),
                    })
                }
                FileKind::File | FileKind::Symlink => {}
            }
        }
        let tmp = temp_name("untar");
        let id = match make(dir, &tmp) {
            Ok(id) => id,
            Err(e) => {
                let _ = unlink_at(dir, &tmp, 0);
                return Err(e);
            }
        };
        let backup = match existing {
            Some(_) => {
                let b = temp_name("untar-old");
                if let Err(e) = super::link_at(dir, &r.name, dir, &b) {
                    let _ = unlink_at(dir, &tmp, 0);
                    return Err(FsError::io(&r.path, e));
                }
                Some(b)
            }
            None => None,
        };
        if let Err(e) = rename_at(dir, &tmp, dir, &r.name) {
            let _ = unlink_at(dir, &tmp, 0);
            if let Some(b) = &backup {
                let _ = unlink_at(dir, b, 0);
            }
            return Err(FsError::io(&r.path, e));
        }
        match id {
            Some(id) => {
                self.files.insert(r.path.clone(), id);
            }
            None => {
                self.files.remove(&r.path);
            }
        }
        self.record(match backup {
            Some(backup) => Op::Replaced { target: r.path, backup },
            None => Op::Created(r.path),
        })
    }

    fn commit(&mut self) {
        for op in std::mem::take(&mut self.journal) {
            if let Op::Replaced { target, backup } = op {
                if let Err(e) = self
                    .fs
                    .locate(&target, false)
                    .and_then(|r| unlink_at(r.parent.as_raw_fd(), &backup, 0).map_err(|e| FsError::io(&target, e)))
                {
                    tracing::warn!(path = %target, error = %e, "tar upload: removing the replaced file's kept copy failed");
                }
            }
        }
    }

    fn rollback(&mut self) {
        for op in std::mem::take(&mut self.journal).into_iter().rev() {
            let res = match &op {
                Op::Created(p) => self
                    .fs
                    .locate(p, false)
                    .and_then(|r| unlink_at(r.parent.as_raw_fd(), &r.name, 0).map_err(|e| FsError::io(p, e))),
                Op::CreatedDir(p) => self.fs.locate(p, false).and_then(|r| {
                    unlink_at(r.parent.as_raw_fd(), &r.name, libc::AT_REMOVEDIR).map_err(|e| FsError::io(p, e))
                }),
                Op::Replaced { target, backup } => self.fs.locate(target, false).and_then(|r| {
                    rename_at(r.parent.as_raw_fd(), backup, r.parent.as_raw_fd(), &r.name)
                        .map_err(|e| FsError::io(target, e))
                }),
            };
            if let Err(e) = res {
                tracing::warn!(error = %e, "tar upload: rolling back a change failed");
            }
        }
    }
}
