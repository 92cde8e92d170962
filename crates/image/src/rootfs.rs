//! Rootfs sources: a tarball (one layer) or a directory, which is first
//! written as a deterministic tar so that its layer digest is well defined.

use std::collections::HashMap;
use std::ffi::CStr;
use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use strata_api::ImageConfig;
use tracing::debug;

use crate::config;
use crate::detect::IMAGE_METADATA;
use crate::error::{io_err, src_err, ImageError};
use crate::sys;
use crate::{Session, UnpackedLayer};

/// Deepest directory nesting read from a rootfs directory.
const MAX_DIR_DEPTH: usize = 256;

/// Imports a rootfs tarball (plain or gzip) as one layer.
///
/// A tarball with image metadata ([`IMAGE_METADATA`]) at its top level is an
/// image archive that is not a valid one: rejected, not imported as a rootfs.
/// `first_foreign` is the member that made detection call it a rootfs.
pub(crate) fn import_tar(
    src: &Path,
    session: &mut Session<'_>,
    first_foreign: Option<&str>,
) -> Result<ImageConfig, ImageError> {
    let (staged, len) = stage_tar(src, session, "rootfs tarball", src)?;
    if let Some(name) = image_metadata_at_root(&staged.fs_dir()) {
        let detail = match first_foreign {
            Some(member) => format!("it also holds {member:?}, which no image archive has"),
            None => "its members are not those of an image archive".into(),
        };
        return Err(ImageError::UnsupportedSource {
            path: src.to_path_buf(),
            reason: format!(
                "has a top-level {name} like an image archive but is not a valid one ({detail}); \
                 not imported as a rootfs"
            ),
        });
    }
    session.commit(staged, len)?;
    Ok(config::rootfs_config())
}

/// The first of [`IMAGE_METADATA`] at the top of an unpacked tree (whiteouts,
/// character devices, do not count).
fn image_metadata_at_root(fs_dir: &Path) -> Option<&'static str> {
    IMAGE_METADATA
        .into_iter()
        .find(|name| fs::symlink_metadata(fs_dir.join(name)).is_ok_and(|md| !md.file_type().is_char_device()))
}

/// Unpacks the tar at `tar` into staging; returns the staged layer and the
/// input size.
fn stage_tar(
    tar: &Path,
    session: &mut Session<'_>,
    what: &str,
    src: &Path,
) -> Result<(UnpackedLayer, u64), ImageError> {
    let file = File::open(tar).map_err(src_err(src))?;
    let len = file.metadata().map_err(src_err(src))?.len();
    session.set_total(len);
    session.begin_layer(0, 1, "");
    let staged = session.stage(BufReader::with_capacity(256 * 1024, file), None, what)?;
    Ok((staged, len))
}

/// Imports a rootfs directory as one layer, via a deterministic tar written
/// to a temporary directory in the store's staging area.
pub(crate) fn import_dir(src: &Path, session: &mut Session<'_>) -> Result<ImageConfig, ImageError> {
    let staging = session.store.root().join("staging");
    let tmp = tempfile::Builder::new().prefix(".rootfs-").tempdir_in(&staging).map_err(io_err(&staging))?;
    let tar_path = tmp.path().join("rootfs.tar");
    let out = File::create(&tar_path).map_err(io_err(&tar_path))?;
    write_dir_tar(src, out, &tar_path, session.opts.max_unpacked_bytes, &mut session.warnings)?;
    let (staged, len) = stage_tar(&tar_path, session, "rootfs directory", src)?;
    session.commit(staged, len)?;
    Ok(config::rootfs_config())
}

/// Writes the tree at `src` as a tar to `out`: entries sorted by name,
/// mode/uid/gid/mtime (whole seconds) preserved, symlinks stored as links,
/// hardlinked files stored once plus link entries, `user.*` and
/// `security.capability` xattrs as PAX records; no atime/ctime, user or group
/// names, so the same tree always gives the same bytes. Symlinks are never
/// followed (every file is opened relative to its directory with
/// `O_NOFOLLOW`). Sockets are skipped with a warning.
pub(crate) fn write_dir_tar(
    src: &Path,
    out: File,
    out_path: &Path,
    limit: u64,
    warnings: &mut Vec<String>,
) -> Result<(), ImageError> {
    let root = sys::open_dir_path(src).map_err(src_err(src))?;
    let mut w = DirTar {
        builder: tar::Builder::new(BufWriter::with_capacity(256 * 1024, out)),
        src: src.to_path_buf(),
        out_path: out_path.to_path_buf(),
        links: HashMap::new(),
        bytes: 0,
        limit,
        warnings,
    };
    let st = sys::fstat(root.as_fd()).map_err(src_err(src))?;
    let xattrs = w.xattrs(root.as_fd(), b"")?;
    w.append(&st, b"./", None, &xattrs, io::empty())?;
    w.walk(root.as_fd(), b"", 0)?;
    let bytes = w.bytes;
    let out_path = w.out_path.clone();
    let mut buffered = w.builder.into_inner().map_err(io_err(&out_path))?;
    buffered.flush().map_err(io_err(&out_path))?;
    debug!(src = %src.display(), bytes, "wrote rootfs directory tar");
    Ok(())
}

struct DirTar<'w> {
    builder: tar::Builder<BufWriter<File>>,
    src: PathBuf,
    out_path: PathBuf,
    /// First path of each multiply-linked file, by (dev, ino).
    links: HashMap<(u64, u64), Vec<u8>>,
    bytes: u64,
    limit: u64,
    warnings: &'w mut Vec<String>,
}

impl DirTar<'_> {
    fn src_err(&self, rel: &[u8]) -> impl FnOnce(io::Error) -> ImageError {
        src_err(self.src.join(String::from_utf8_lossy(rel).as_ref()))
    }

    fn walk(&mut self, dir: BorrowedFd<'_>, prefix: &[u8], depth: usize) -> Result<(), ImageError> {
        if depth >= MAX_DIR_DEPTH {
            return Err(ImageError::UnsupportedSource {
                path: self.src.clone(),
                reason: format!("directories nested deeper than {MAX_DIR_DEPTH} levels"),
            });
        }
        let mut names = sys::read_dir_names(dir).map_err(self.src_err(prefix))?;
        names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        for name in names {
            let mut rel = prefix.to_vec();
            rel.extend_from_slice(name.as_bytes());
            self.child(dir, &name, &rel, depth)?;
        }
        Ok(())
    }

    fn child(&mut self, dir: BorrowedFd<'_>, name: &CStr, rel: &[u8], depth: usize) -> Result<(), ImageError> {
        let Some(st) = sys::stat_at(dir, name).map_err(self.src_err(rel))? else {
            return Ok(()); // vanished meanwhile
        };
        match sys::file_type(&st) {
            libc::S_IFDIR => {
                let sub = sys::open_dir_at(dir, name).map_err(self.src_err(rel))?;
                let st = sys::fstat(sub.as_fd()).map_err(self.src_err(rel))?;
                let xattrs = self.xattrs(sub.as_fd(), rel)?;
                let mut path = rel.to_vec();
                path.push(b'/');
                self.append(&st, &path, None, &xattrs, io::empty())?;
                self.walk(sub.as_fd(), &path, depth + 1)
            }
            libc::S_IFREG => {
                let file = sys::open_read_at(dir, name).map_err(self.src_err(rel))?;
                let st = sys::fstat(file.as_fd()).map_err(self.src_err(rel))?;
                if sys::file_type(&st) != libc::S_IFREG {
                    self.warnings.push(format!("skipped {} (changed while reading)", String::from_utf8_lossy(rel)));
                    return Ok(());
                }
                if st.st_nlink > 1 {
                    let key = (st.st_dev, st.st_ino);
                    if let Some(first) = self.links.get(&key).cloned() {
                        return self.append(&st, rel, Some((tar::EntryType::Link, &first)), &[], io::empty());
                    }
                    self.links.insert(key, rel.to_vec());
                }
                let size = st.st_size as u64;
                self.bytes += size;
                if self.bytes > self.limit {
                    return Err(ImageError::TooLarge { what: "rootfs directory".into(), limit: self.limit });
                }
                let xattrs = self.xattrs(file.as_fd(), rel)?;
                let data = ExactReader { inner: file, left: size };
                self.append(&st, rel, None, &xattrs, data)
            }
            libc::S_IFLNK => {
                let target = sys::readlink_at(dir, name).map_err(self.src_err(rel))?;
                self.append(&st, rel, Some((tar::EntryType::Symlink, &target)), &[], io::empty())
            }
            libc::S_IFIFO | libc::S_IFCHR | libc::S_IFBLK => self.append(&st, rel, None, &[], io::empty()),
            _ => {
                self.warnings.push(format!("skipped socket {}", String::from_utf8_lossy(rel)));
                Ok(())
            }
        }
    }

    /// The `user.*` and `security.capability` xattrs of `fd`, sorted.
    fn xattrs(&self, fd: BorrowedFd<'_>, rel: &[u8]) -> Result<Vec<(String, Vec<u8>)>, ImageError> {
        let mut out = Vec::new();
        for name in sys::flistxattr(fd).map_err(self.src_err(rel))? {
            let Ok(s) = name.to_str() else { continue };
            if !(s.starts_with("user.") || s == "security.capability") {
                continue;
            }
            match sys::fgetxattr(fd, &name) {
                Ok(value) => out.push((s.to_string(), value)),
                Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {}
                Err(e) => return Err(self.src_err(rel)(e)),
            }
        }
        out.sort();
        Ok(out)
    }

    /// Appends one entry with a header built from `st`. `link` is the entry
    /// type and target for symlinks and hardlinks. Long names and targets use
    /// GNU long-name records, written verbatim (no path re-normalisation).
    fn append(
        &mut self,
        st: &libc::stat,
        path: &[u8],
        link: Option<(tar::EntryType, &[u8])>,
        xattrs: &[(String, Vec<u8>)],
        data: impl Read,
    ) -> Result<(), ImageError> {
        let mut h = tar::Header::new_gnu();
        let kind = match (link, sys::file_type(st)) {
            (Some((kind, _)), _) => kind,
            (None, libc::S_IFDIR) => tar::EntryType::Directory,
            (None, libc::S_IFIFO) => tar::EntryType::Fifo,
            (None, libc::S_IFCHR) => tar::EntryType::Char,
            (None, libc::S_IFBLK) => tar::EntryType::Block,
            (None, _) => tar::EntryType::Regular,
        };
        h.set_entry_type(kind);
        h.set_mode(st.st_mode & 0o7777);
        h.set_uid(u64::from(st.st_uid));
        h.set_gid(u64::from(st.st_gid));
        h.set_mtime(u64::try_from(st.st_mtime).unwrap_or(0));
        h.set_size(if kind == tar::EntryType::Regular { st.st_size as u64 } else { 0 });
        if matches!(kind, tar::EntryType::Char | tar::EntryType::Block) {
            let dev = st.st_rdev;
            let io = io_err(&self.out_path);
            h.set_device_major(libc::major(dev)).map_err(io)?;
            h.set_device_minor(libc::minor(dev)).map_err(io_err(&self.out_path))?;
        }
        let out_path = self.out_path.clone();
        let b = &mut self.builder;
        let result = (|| -> io::Result<()> {
            if !xattrs.is_empty() {
                let records: Vec<(String, &[u8])> =
                    xattrs.iter().map(|(k, v)| (format!("SCHILY.xattr.{k}"), v.as_slice())).collect();
                b.append_pax_extensions(records.iter().map(|(k, v)| (k.as_str(), *v)))?;
            }
            set_name(b, &mut h, path, tar::EntryType::GNULongName, 0)?;
            if let Some((_, target)) = link {
                set_name(b, &mut h, target, tar::EntryType::GNULongLink, 157)?;
            }
            h.set_cksum();
            b.append(&h, data)
        })();
        result.map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                ImageError::Source { path: self.src.join(String::from_utf8_lossy(path).as_ref()), source: e }
            } else {
                io_err(out_path)(e)
            }
        })
    }
}

/// Stores `value` in the 100-byte name (`offset` 0) or link name (157) field
/// of `h`, preceded by a GNU long-name record of type `long_kind` when longer.
fn set_name(
    b: &mut tar::Builder<BufWriter<File>>,
    h: &mut tar::Header,
    value: &[u8],
    long_kind: tar::EntryType,
    offset: usize,
) -> io::Result<()> {
    const FIELD: usize = 100;
    if value.len() > FIELD {
        let mut long = tar::Header::new_gnu();
        long.set_entry_type(long_kind);
        long.set_size(value.len() as u64 + 1);
        long.set_mode(0o644);
        long.set_mtime(0);
        long.as_mut_bytes()[..13].copy_from_slice(b"././@LongLink");
        long.set_cksum();
        b.append(&long, value.chain(&[0u8][..]))?;
    }
    let field = &mut h.as_mut_bytes()[offset..offset + FIELD];
    field.fill(0);
    let n = value.len().min(FIELD);
    field[..n].copy_from_slice(&value[..n]);
    Ok(())
}

/// Reads exactly `left` bytes, failing if the file shrinks meanwhile.
struct ExactReader {
    inner: File,
    left: u64,
}

impl Read for ExactReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let max = buf.len().min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..max])?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "file shrank while it was read"));
        }
        self.left -= n as u64;
        Ok(n)
    }
}
