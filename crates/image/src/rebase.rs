//! Moving a writable layer (and the layers a sandbox has above its image)
//! onto another base: which paths both sides changed, and writing the new
//! base's version of a path into the writable layer when the base is to win.
//!
//! A writable layer is written by untrusted code: every path in it is walked
//! with `O_NOFOLLOW` and changed through `*at` calls on directory descriptors,
//! so a symlink planted there never leads outside it.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use crate::changes::{cstr, lookup, open_rel_dir, ChangeKind, EntryKind, PathChange};
use crate::error::io_err;
use crate::{sys, ImageError};

/// A path changed by both the sandbox and the base.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// The path (absolute inside the sandbox).
    pub path: String,
    /// The sandbox's change.
    pub sandbox: ChangeKind,
    /// The base's change (between the old base and the new).
    pub base: ChangeKind,
    /// What the new base has there (`None`: nothing, the base deleted it).
    pub base_kind: Option<EntryKind>,
}

/// Whether `path` is below `dir` (not `dir` itself); both absolute, or both relative.
pub fn below(path: &str, dir: &str) -> bool {
    path.len() > dir.len() && path.starts_with(dir) && path.as_bytes()[dir.len()] == b'/'
}

/// The paths both sides changed. Directories changed on both sides only in
/// their contents are no conflict (their entries are compared one by one);
/// a deleted directory conflicts with any change below it on the other side.
pub fn conflicts(sandbox: &[PathChange], base: &[PathChange]) -> Vec<Conflict> {
    let by_path: BTreeMap<&str, &PathChange> = base.iter().map(|c| (c.path.as_str(), c)).collect();
    let deleted_dirs = |changes: &[PathChange]| -> Vec<String> {
        changes
            .iter()
            .filter(|c| c.change == ChangeKind::Deleted && c.kind == EntryKind::Dir)
            .map(|c| c.path.clone())
            .collect()
    };
    let (base_deleted, sandbox_deleted) = (deleted_dirs(base), deleted_dirs(sandbox));
    let mut out = BTreeMap::new();
    for s in sandbox {
        let both_dirs = |b: &PathChange| s.kind == EntryKind::Dir && b.kind == EntryKind::Dir;
        if let Some(b) = by_path.get(s.path.as_str()).filter(|b| !both_dirs(b)) {
            out.insert(s.path.clone(), (s.change, b.change, (b.change != ChangeKind::Deleted).then_some(b.kind)));
        } else if base_deleted.iter().any(|d| below(&s.path, d)) {
            out.insert(s.path.clone(), (s.change, ChangeKind::Deleted, None));
        }
    }
    for b in base {
        if sandbox_deleted.iter().any(|d| below(&b.path, d)) && !out.contains_key(&b.path) {
            out.insert(
                b.path.clone(),
                (ChangeKind::Deleted, b.change, (b.change != ChangeKind::Deleted).then_some(b.kind)),
            );
        }
    }
    out.into_iter().map(|(path, (sandbox, base, base_kind))| Conflict { path, sandbox, base, base_kind }).collect()
}

/// Why the base's version of a path cannot be written into a writable layer.
fn refuse(path: &str, why: &str) -> ImageError {
    ImageError::Io { path: PathBuf::from(path), source: io::Error::new(io::ErrorKind::Unsupported, why.to_string()) }
}

/// Makes the new base's version of `rel` the one the sandbox sees, by
/// writing it into `upper` (the sandbox's writable layer, the top of its
/// stack): the new base's file or symlink copied (bytes, mode, owner,
/// times), or a whiteout where the new base has nothing. Whatever the
/// writable layer had there is removed first. A directory of the new base
/// is refused (it would have to be merged entry by entry).
/// `base_top_first` is the new base's layer stack.
pub fn take_base_version(upper: &Path, base_top_first: &[PathBuf], rel: &str) -> Result<(), ImageError> {
    let rel = rel.trim_start_matches('/');
    let (parent, name) = rel.rsplit_once('/').unwrap_or(("", rel));
    let top = sys::open_dir_path(upper).map_err(io_err(upper))?;
    let dir = ensure_dirs(top.as_fd(), upper, base_top_first, parent)?;
    let at = dir.as_ref().map_or(top.as_fd(), |d| d.as_fd());
    let c = cstr(name).map_err(io_err(upper.join(rel)))?;
    // Never following a symlink the sandbox planted.
    sys::remove_tree_at(at, &c).map_err(io_err(upper.join(rel)))?;
    match lookup(base_top_first, rel)? {
        None => {
            // Nothing in the new base: hide whatever the sandbox's lower layers have there.
            sys::mknod_at(at, &c, libc::S_IFCHR, sys::makedev(0, 0)).map_err(io_err(upper.join(rel)))?;
        }
        Some((_, EntryKind::Dir, _)) => {
            return Err(refuse(rel, "the new base has a directory here: take it by removing the sandbox's version inside the sandbox, or prefer the sandbox"))
        }
        Some((i, _, _)) => copy_entry(&base_top_first[i], rel, at, &c, &upper.join(rel))?,
    }
    Ok(())
}

/// Writes the new base's versions of `paths` as an OCI layer tar (for a
/// writable layer the host does not hold, a microVM's, whose guest applies
/// it): a file or symlink with its mode, owner and modification time, or a
/// `.wh.` whiteout where the new base has nothing. A directory of the new
/// base is refused, as [`take_base_version`] refuses it.
pub fn base_versions_tar(base_top_first: &[PathBuf], paths: &[String], out: impl io::Write) -> Result<(), ImageError> {
    let mut b = tar::Builder::new(out);
    for path in paths {
        let rel = path.trim_start_matches('/');
        let (parent, name) = rel.rsplit_once('/').unwrap_or(("", rel));
        let mut h = tar::Header::new_gnu();
        let shown = PathBuf::from(rel);
        let tar_err = |e: io::Error| ImageError::Io { path: shown.clone(), source: e };
        match lookup(base_top_first, rel)? {
            None => {
                let wh = if parent.is_empty() { format!(".wh.{name}") } else { format!("{parent}/.wh.{name}") };
                h.set_size(0);
                h.set_mode(0o644);
                h.set_uid(0);
                h.set_gid(0);
                h.set_mtime(0);
                b.append_data(&mut h, wh, io::empty()).map_err(tar_err)?;
            }
            Some((_, EntryKind::Dir, _)) => {
                return Err(refuse(rel, "the new base has a directory here: take it by removing the sandbox's version inside the sandbox, or prefer the sandbox"))
            }
            Some((i, _, _)) => {
                let src = LayerEntry::open(&base_top_first[i], rel)?;
                let st = src.stat()?.ok_or_else(|| refuse(rel, "gone from the new base's layer"))?;
                h.set_mode(st.st_mode & 0o7777);
                h.set_uid(u64::from(st.st_uid));
                h.set_gid(u64::from(st.st_gid));
                h.set_mtime(u64::try_from(st.st_mtime).unwrap_or(0));
                match sys::file_type(&st) {
                    libc::S_IFLNK => {
                        let target = sys::readlink_at(src.at(), &src.name).map_err(io_err(&src.shown))?;
                        h.set_entry_type(tar::EntryType::Symlink);
                        h.set_size(0);
                        let target = <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&target);
                        b.append_link(&mut h, rel, target).map_err(tar_err)?;
                    }
                    libc::S_IFREG => {
                        let from = sys::open_read_at(src.at(), &src.name).map_err(io_err(&src.shown))?;
                        h.set_entry_type(tar::EntryType::Regular);
                        h.set_size(u64::try_from(st.st_size).unwrap_or(0));
                        b.append_data(&mut h, rel, from).map_err(tar_err)?;
                    }
                    _ => return Err(refuse(rel, "the new base has a special file here")),
                }
            }
        }
    }
    b.into_inner().map_err(|e| ImageError::Io { path: PathBuf::from("(tar)"), source: e })?;
    Ok(())
}

/// Opens `parent` in the writable layer, creating the directories it lacks
/// (with the mode and owner the new base gives them). A component that is
/// not a directory there (a file, a symlink, a whiteout) refuses.
fn ensure_dirs(
    top: BorrowedFd<'_>,
    upper: &Path,
    base_top_first: &[PathBuf],
    parent: &str,
) -> Result<Option<OwnedFd>, ImageError> {
    let mut cur: Option<OwnedFd> = None;
    let mut so_far = String::new();
    for comp in parent.split('/').filter(|c| !c.is_empty()) {
        if !so_far.is_empty() {
            so_far.push('/');
        }
        so_far.push_str(comp);
        let c = cstr(comp).map_err(io_err(upper.join(&so_far)))?;
        let at = cur.as_ref().map_or(top, |d| d.as_fd());
        match sys::stat_at(at, &c).map_err(io_err(upper.join(&so_far)))? {
            Some(st) if sys::file_type(&st) == libc::S_IFDIR => {}
            Some(_) => return Err(refuse(
                &so_far,
                "the sandbox replaced or deleted this directory: settle it inside the sandbox, or prefer the sandbox",
            )),
            None => {
                // The directory comes from a lower layer: an upper copy merges with it.
                let (mode, uid, gid) = match lookup(base_top_first, &so_far)? {
                    Some((i, EntryKind::Dir, _)) => match LayerEntry::open(&base_top_first[i], &so_far)?.stat()? {
                        Some(st) => (st.st_mode & 0o7777, st.st_uid, st.st_gid),
                        None => (0o755, 0, 0),
                    },
                    _ => (0o755, 0, 0),
                };
                sys::mkdir_at(at, &c, mode).map_err(io_err(upper.join(&so_far)))?;
                sys::lchown_at(at, &c, uid, gid).map_err(io_err(upper.join(&so_far)))?;
            }
        }
        cur = Some(sys::open_dir_at(at, &c).map_err(io_err(upper.join(&so_far)))?);
    }
    Ok(cur)
}

/// An entry of a layer (immutable, but unpacked from an image), reached
/// through directory descriptors from the layer's root.
struct LayerEntry {
    top: OwnedFd,
    dir: Option<OwnedFd>,
    name: std::ffi::CString,
    shown: PathBuf,
}

impl LayerEntry {
    fn open(layer: &Path, rel: &str) -> Result<LayerEntry, ImageError> {
        let top = sys::open_dir_path(layer).map_err(io_err(layer))?;
        let (parent, leaf) = rel.rsplit_once('/').unwrap_or(("", rel));
        let dir = open_rel_dir(top.as_fd(), parent).map_err(io_err(layer.join(parent)))?;
        let shown = layer.join(rel);
        Ok(LayerEntry { top, dir, name: cstr(leaf).map_err(io_err(&shown))?, shown })
    }

    /// The directory holding the entry.
    fn at(&self) -> BorrowedFd<'_> {
        self.dir.as_ref().map_or(self.top.as_fd(), |d| d.as_fd())
    }

    fn stat(&self) -> Result<Option<libc::stat>, ImageError> {
        sys::stat_at(self.at(), &self.name).map_err(io_err(&self.shown))
    }
}

/// Copies one file or symlink of a layer into `dir` as `name` (bytes, mode,
/// owner, modification time; never a hard link: the writable layer is
/// written in place, the layer is immutable).
fn copy_entry(
    layer: &Path,
    rel: &str,
    dir: BorrowedFd<'_>,
    name: &std::ffi::CStr,
    shown: &Path,
) -> Result<(), ImageError> {
    let src = LayerEntry::open(layer, rel)?;
    let st = src.stat()?.ok_or_else(|| refuse(rel, "gone from the new base's layer"))?;
    let mtime = sys::Timespec { sec: st.st_mtime, nsec: st.st_mtime_nsec };
    match sys::file_type(&st) {
        libc::S_IFLNK => {
            let target = sys::readlink_at(src.at(), &src.name).map_err(io_err(&src.shown))?;
            let t = std::ffi::CString::new(target).map_err(|_| refuse(rel, "NUL in a link"))?;
            sys::symlink_at(&t, dir, name).map_err(io_err(shown))?;
            sys::lchown_at(dir, name, st.st_uid, st.st_gid).map_err(io_err(shown))?;
            sys::lutimens_at(dir, name, mtime).map_err(io_err(shown))?;
        }
        libc::S_IFREG => {
            let mut from = sys::open_read_at(src.at(), &src.name).map_err(io_err(&src.shown))?;
            let mut to = sys::create_file_at(dir, name, 0o600).map_err(io_err(shown))?;
            io::copy(&mut from, &mut to).map_err(io_err(shown))?;
            sys::fchown(to.as_fd(), st.st_uid, st.st_gid).map_err(io_err(shown))?;
            // After chown, which clears setuid bits.
            sys::fchmod(to.as_fd(), st.st_mode & 0o7777).map_err(io_err(shown))?;
            sys::futimens(to.as_fd(), mtime).map_err(io_err(shown))?;
            to.sync_all().map_err(io_err(shown))?;
        }
        _ => return Err(refuse(rel, "the new base has a special file here")),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn change(path: &str, change: ChangeKind, kind: EntryKind) -> PathChange {
        PathChange { path: path.into(), change, kind, size: 0 }
    }

    #[test]
    fn conflicts_are_paths_both_sides_changed() {
        use ChangeKind::*;
        use EntryKind::*;
        let sandbox = vec![
            change("/etc/motd", Modified, File),
            change("/etc", Modified, Dir),
            change("/app/main.py", Added, File),
            change("/opt/tool/bin", Added, File),
            change("/var/cache", Deleted, Dir),
        ];
        let base = vec![
            change("/etc/motd", Modified, File),
            change("/etc", Modified, Dir),
            change("/etc/ssl/cert.pem", Added, File),
            change("/opt/tool", Deleted, Dir),
            change("/var/cache/apt/pkgcache.bin", Modified, File),
        ];
        let got = conflicts(&sandbox, &base);
        let paths: Vec<&str> = got.iter().map(|c| c.path.as_str()).collect();
        assert_eq!(paths, ["/etc/motd", "/opt/tool/bin", "/var/cache/apt/pkgcache.bin"]);
        assert_eq!(got[1].base_kind, None, "the base deleted the directory");
        assert_eq!((got[2].sandbox, got[2].base), (Deleted, Modified));
    }

    #[test]
    fn the_base_versions_go_into_a_layer_tar_for_a_guest_to_apply() {
        let t = tempfile::tempdir().unwrap();
        let base = t.path().join("base");
        fs::create_dir_all(base.join("etc/ssl")).unwrap();
        fs::write(base.join("etc/motd"), "patched\n").unwrap();
        std::os::unix::fs::symlink("motd", base.join("etc/issue")).unwrap();
        let stack = [base.clone()];
        let paths = ["/etc/motd".to_string(), "/etc/issue".to_string(), "/etc/removed-in-base".to_string()];
        let mut out = Vec::new();
        base_versions_tar(&stack, &paths, &mut out).unwrap();
        let mut a = tar::Archive::new(&out[..]);
        let got: Vec<(String, tar::EntryType, Vec<u8>)> = a
            .entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let name = e.path().unwrap().to_string_lossy().into_owned();
                let kind = e.header().entry_type();
                let mut data = Vec::new();
                io::Read::read_to_end(&mut e, &mut data).unwrap();
                if kind.is_symlink() {
                    data = e.link_name().unwrap().unwrap().to_string_lossy().into_owned().into_bytes();
                }
                (name, kind, data)
            })
            .collect();
        assert_eq!(
            got,
            [
                ("etc/motd".into(), tar::EntryType::Regular, b"patched\n".to_vec()),
                ("etc/issue".into(), tar::EntryType::Symlink, b"motd".to_vec()),
                ("etc/.wh.removed-in-base".into(), tar::EntryType::Regular, Vec::new()),
            ]
        );
        let dir = base_versions_tar(&stack, &["/etc/ssl".to_string()], io::sink()).unwrap_err();
        assert!(format!("{dir:?}").contains("a directory"), "{dir:?}");
    }

    #[test]
    fn the_base_version_is_written_into_the_writable_layer() {
        if !sys::is_root() {
            println!("skipped: needs root for whiteout devices and chown");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let (base, upper) = (t.path().join("base"), t.path().join("upper"));
        fs::create_dir_all(base.join("etc")).unwrap();
        fs::write(base.join("etc/motd"), "patched\n").unwrap();
        std::os::unix::fs::symlink("motd", base.join("etc/issue")).unwrap();
        fs::create_dir_all(upper.join("etc")).unwrap();
        fs::write(upper.join("etc/motd"), "mine\n").unwrap();
        fs::write(upper.join("etc/removed-in-base"), "mine\n").unwrap();
        let stack = [base.clone()];
        take_base_version(&upper, &stack, "/etc/motd").unwrap();
        take_base_version(&upper, &stack, "/etc/issue").unwrap();
        take_base_version(&upper, &stack, "/etc/removed-in-base").unwrap();
        take_base_version(&upper, &stack, "/etc/new/dir/file").unwrap();
        assert_eq!(fs::read_to_string(upper.join("etc/motd")).unwrap(), "patched\n");
        assert_eq!(fs::read_link(upper.join("etc/issue")).unwrap(), Path::new("motd"));
        let md = fs::symlink_metadata(upper.join("etc/removed-in-base")).unwrap();
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        assert!(md.file_type().is_char_device() && md.rdev() == 0, "a whiteout");
        assert!(upper.join("etc/new/dir").is_dir(), "missing parents are made");
        // A symlink the sandbox planted on the way is never followed.
        let outside = t.path().join("outside");
        fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, upper.join("var")).unwrap();
        assert!(take_base_version(&upper, &stack, "/var/x").is_err());
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
    }
}
