//! Change sets of a sandbox's private writable layer (an overlayfs upper
//! directory): what changed since the last checkpoint, as a list (`strata diff`)
//! or as an OCI layer tar (`strata export`, and the layer a checkpoint seals).
//!
//! A [`TreeManifest`] records every entry of the upper directory with the
//! kernel's inode number and ctime, which any content or metadata change bumps
//! and no user can set. Comparing the manifest taken at the last checkpoint with
//! a fresh one yields the entries to carry into the next layer; entries that
//! vanished since become OCI whiteouts. Overlay's own markers are translated:
//! a 0/0 character device (whiteout) becomes `.wh.<name>`, a directory with
//! `trusted.overlay.opaque=y` gets a `.wh..wh..opq` entry.
//!
//! The walk opens every directory relative to its parent with `O_NOFOLLOW`, so a
//! running sandbox that swaps a directory for a symlink cannot make strata read
//! host files into a layer.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{io_err, ImageError};
use crate::sys;

const OPAQUE_XATTR: &CStr = c"trusted.overlay.opaque";
const MAX_DEPTH: usize = 256;

/// Kind of a tree entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link.
    Symlink,
    /// Overlay whiteout (the path is deleted from the layers below).
    Whiteout,
    /// Fifo or other special file.
    Other,
}

/// What identifies one version of an entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryMeta {
    /// Kind.
    pub kind: EntryKind,
    /// Inode number.
    pub ino: u64,
    /// Change time, nanoseconds since the epoch.
    pub ctime_ns: i64,
    /// Size in bytes (files).
    pub size: u64,
    /// Opaque directory (hides everything below it in lower layers).
    #[serde(default)]
    pub opaque: bool,
}

/// Every entry of a tree, by relative path (`a/b`), in path order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TreeManifest {
    /// Entries.
    pub entries: BTreeMap<String, EntryMeta>,
}

/// How a path changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// New since the base.
    Added,
    /// Existed in the base and changed.
    Modified,
    /// Removed since the base.
    Deleted,
}

/// One changed path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathChange {
    /// Absolute path inside the sandbox.
    pub path: String,
    /// How it changed.
    pub change: ChangeKind,
    /// Entry kind now (for deletions: what was deleted, when known).
    pub kind: EntryKind,
    /// Size now (0 for deletions and directories).
    pub size: u64,
}

pub(crate) fn cstr(name: &str) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "NUL in file name"))
}

fn kind_of(st: &libc::stat) -> EntryKind {
    match sys::file_type(st) {
        libc::S_IFREG => EntryKind::File,
        libc::S_IFDIR => EntryKind::Dir,
        libc::S_IFLNK => EntryKind::Symlink,
        libc::S_IFCHR if st.st_rdev == 0 => EntryKind::Whiteout,
        _ => EntryKind::Other,
    }
}

fn is_opaque(dir: BorrowedFd<'_>) -> bool {
    sys::fgetxattr(dir, OPAQUE_XATTR).is_ok_and(|v| v == b"y")
}

/// Records every entry below `root` (not `root` itself), leaving out the
/// relative paths in `exclude` (and everything below them).
pub fn scan(root: &Path, exclude: &[&str]) -> Result<TreeManifest, ImageError> {
    let dir = sys::open_dir_path(root).map_err(io_err(root))?;
    let mut m = TreeManifest::default();
    scan_dir(root, dir.as_fd(), "", 0, &mut m)?;
    m.entries.retain(|p, _| {
        !exclude.iter().any(|x| p == x || (p.starts_with(x) && p.as_bytes().get(x.len()) == Some(&b'/')))
    });
    Ok(m)
}

fn scan_dir(
    root: &Path,
    dir: BorrowedFd<'_>,
    prefix: &str,
    depth: usize,
    m: &mut TreeManifest,
) -> Result<(), ImageError> {
    if depth > MAX_DEPTH {
        return Err(ImageError::TooLarge {
            what: format!("directory nesting under {}", root.display()),
            limit: MAX_DEPTH as u64,
        });
    }
    let at = |rel: &str| io_err(root.join(rel));
    for name in sys::read_dir_names(dir).map_err(at(prefix))? {
        crate::pace::tick();
        let Ok(n) = name.to_str() else { continue }; // non-UTF-8 names are not tracked
        let rel = if prefix.is_empty() { n.to_string() } else { format!("{prefix}/{n}") };
        let Some(st) = sys::stat_at(dir, &name).map_err(at(&rel))? else { continue };
        let kind = kind_of(&st);
        let mut meta = EntryMeta {
            kind,
            ino: st.st_ino,
            ctime_ns: st.st_ctime * 1_000_000_000 + st.st_ctime_nsec,
            size: if kind == EntryKind::File { st.st_size as u64 } else { 0 },
            opaque: false,
        };
        if kind == EntryKind::Dir {
            let sub = sys::open_dir_at(dir, &name).map_err(at(&rel))?;
            meta.opaque = is_opaque(sub.as_fd());
            m.entries.insert(rel.clone(), meta);
            scan_dir(root, sub.as_fd(), &rel, depth + 1, m)?;
        } else {
            m.entries.insert(rel, meta);
        }
    }
    Ok(())
}

/// Entries of `base` that are gone from `now` (not counting whiteouts), at their
/// topmost path: the children of a vanished directory are not listed.
fn gone_since<'a>(base: &'a TreeManifest, now: &TreeManifest) -> Vec<(&'a String, &'a EntryMeta)> {
    let mut out = Vec::new();
    let mut gone_dirs: Vec<&str> = Vec::new();
    for (path, old) in &base.entries {
        if now.entries.contains_key(path) || under_any(path, &gone_dirs) || old.kind == EntryKind::Whiteout {
            continue;
        }
        if old.kind == EntryKind::Dir {
            gone_dirs.push(path);
        }
        out.push((path, old));
    }
    out
}

/// Whether `path` (now `meta`) differs from its version in `base`. A directory
/// counts as changed only when it is new, replaced, or its opaque flag changed
/// (its own times change whenever a child does).
fn changed_since(base: &TreeManifest, path: &str, meta: &EntryMeta) -> bool {
    match base.entries.get(path) {
        None => true,
        Some(old) if meta.kind == EntryKind::Dir => old.kind != EntryKind::Dir || old.opaque != meta.opaque,
        Some(old) => old != meta,
    }
}

/// Whether `rel` is visible in the stack of lower layers (top first): found in a
/// layer before a whiteout for it.
fn in_lowers(lowers_top_first: &[PathBuf], rel: &str) -> Option<EntryKind> {
    for l in lowers_top_first {
        match std::fs::symlink_metadata(l.join(rel)) {
            Ok(md) => {
                use std::os::unix::fs::{FileTypeExt, MetadataExt};
                let ft = md.file_type();
                if ft.is_char_device() && md.rdev() == 0 {
                    return None;
                }
                return Some(if ft.is_dir() {
                    EntryKind::Dir
                } else if ft.is_symlink() {
                    EntryKind::Symlink
                } else if ft.is_file() {
                    EntryKind::File
                } else {
                    EntryKind::Other
                });
            }
            Err(_) => continue,
        }
    }
    None
}

fn under_any(path: &str, dirs: &[&str]) -> bool {
    dirs.iter().any(|d| path.len() > d.len() && path.starts_with(d) && path.as_bytes()[d.len()] == b'/')
}

/// The changes from `base` (manifest at the last checkpoint, empty for a fresh
/// layer) to `now`. `lowers_top_first` (the read-only layers under the upper
/// directory) tell new paths from modified ones and name what a whiteout hides.
pub fn diff(base: &TreeManifest, now: &TreeManifest, lowers_top_first: &[PathBuf]) -> Vec<PathChange> {
    let mut out = Vec::new();
    for (path, old) in gone_since(base, now) {
        // Gone from the upper layer: deleted unless a lower layer still shows it
        // (then the path reverted to the lower version, which is a modification).
        let change =
            if in_lowers(lowers_top_first, path).is_some() { ChangeKind::Modified } else { ChangeKind::Deleted };
        out.push(PathChange { path: format!("/{path}"), change, kind: old.kind, size: 0 });
    }
    for (path, meta) in &now.entries {
        if !changed_since(base, path, meta) {
            continue;
        }
        let below = in_lowers(lowers_top_first, path);
        // Present at the base (in the upper layer then) counts like present below.
        let in_base = base.entries.get(path.as_str()).is_some_and(|e| e.kind != EntryKind::Whiteout);
        let (change, kind) = match meta.kind {
            EntryKind::Whiteout => match below {
                Some(k) => (ChangeKind::Deleted, k),
                None => continue,
            },
            EntryKind::Dir if below == Some(EntryKind::Dir) && !meta.opaque => continue, // only children changed
            k if below.is_some() || in_base => (ChangeKind::Modified, k),
            k => (ChangeKind::Added, k),
        };
        out.push(PathChange { path: format!("/{path}"), change, kind, size: meta.size });
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// Writes the change set from `base` to `now` of the tree at `root` as an OCI
/// layer tar: changed entries (with their parent directories), `.wh.` entries for
/// deletions and overlay whiteouts, `.wh..wh..opq` for opaque directories. Entry
/// order and headers are deterministic, so equal changes give equal digests.
/// Directories that merely exist in `lowers_top_first` (copied up because
/// something below them changed) are written only as parents of changed entries.
pub fn write_layer_tar(
    root: &Path,
    base: &TreeManifest,
    now: &TreeManifest,
    lowers_top_first: &[PathBuf],
    out: impl Write,
) -> Result<(), ImageError> {
    let top = sys::open_dir_path(root).map_err(io_err(root))?;
    let mut b = tar::Builder::new(out);
    let mut emitted_dirs: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    let items = items_of(base, now, lowers_top_first);
    // The directory of the last entry, kept open: the items are sorted, so
    // siblings come one after another and each directory is walked to once.
    let mut open_parent: Option<(&str, Option<OwnedFd>)> = None;
    for (path, meta) in &items {
        let (parent, name) = match path.rsplit_once('/') {
            Some((p, n)) => (p, n),
            None => ("", path.as_str()),
        };
        emit_parents(&mut b, top.as_fd(), root, parent, &mut emitted_dirs)?;
        let wh = |n: &str| if parent.is_empty() { format!(".wh.{n}") } else { format!("{parent}/.wh.{n}") };
        match meta.map(|m| m.kind) {
            None | Some(EntryKind::Whiteout) => append_empty(&mut b, &wh(name), root)?,
            Some(_) => {
                if open_parent.as_ref().is_none_or(|(p, _)| *p != parent) {
                    let dir = open_rel_dir(top.as_fd(), parent).map_err(io_err(root.join(parent)))?;
                    open_parent = Some((parent, dir));
                }
                let dir = open_parent.as_ref().and_then(|(_, d)| d.as_ref());
                append_entry(&mut b, dir.map_or(top.as_fd(), |d| d.as_fd()), name, path, root, &mut emitted_dirs)?;
                if meta.is_some_and(|m| m.kind == EntryKind::Dir && m.opaque) {
                    append_empty(&mut b, &format!("{path}/.wh..wh..opq"), root)?;
                }
            }
        }
    }
    b.finish().map_err(io_err(root))?;
    Ok(())
}

/// What the layer tar of the change set from `base` to `now` holds
/// ([`write_layer_tar`]): each path with its entry now, `None` for a deletion.
fn items_of<'a>(
    base: &'a TreeManifest,
    now: &'a TreeManifest,
    lowers_top_first: &[PathBuf],
) -> BTreeMap<String, Option<&'a EntryMeta>> {
    // Deletions since the base: whiteouts for the topmost vanished paths.
    let mut items: BTreeMap<String, Option<&EntryMeta>> =
        gone_since(base, now).into_iter().map(|(p, _)| (p.clone(), None)).collect();
    for (path, meta) in &now.entries {
        let changed = changed_since(base, path, meta);
        let only_a_parent =
            meta.kind == EntryKind::Dir && !meta.opaque && in_lowers(lowers_top_first, path) == Some(EntryKind::Dir);
        if changed && !only_a_parent {
            items.insert(path.clone(), Some(meta));
        }
    }
    items
}

/// The entries [`write_layer_tar`] writes for the change set from `base` to
/// `now`, in path order, each with whether it is a deletion (a `.wh.`
/// entry): what a tree that is not on the host (a microVM's) is asked for.
pub fn layer_items(base: &TreeManifest, now: &TreeManifest, lowers_top_first: &[PathBuf]) -> Vec<(String, bool)> {
    items_of(base, now, lowers_top_first).into_iter().map(|(p, m)| (p, m.is_none())).collect()
}

/// Opens `rel` (a directory path below `top`, "" for `top`) without following symlinks.
pub(crate) fn open_rel_dir(top: BorrowedFd<'_>, rel: &str) -> io::Result<Option<OwnedFd>> {
    if rel.is_empty() {
        return Ok(None);
    }
    let mut cur: Option<OwnedFd> = None;
    for comp in rel.split('/') {
        let c = cstr(comp)?;
        let next = sys::open_dir_at(cur.as_ref().map_or(top, |d| d.as_fd()), &c)?;
        cur = Some(next);
    }
    Ok(cur)
}

fn emit_parents<W: Write>(
    b: &mut tar::Builder<W>,
    top: BorrowedFd<'_>,
    root: &Path,
    parent: &str,
    done: &mut std::collections::BTreeSet<String>,
) -> Result<(), ImageError> {
    if parent.is_empty() || done.contains(parent) {
        return Ok(());
    }
    let mut acc = String::new();
    for comp in parent.split('/') {
        let prev = acc.clone();
        if !acc.is_empty() {
            acc.push('/');
        }
        acc.push_str(comp);
        if done.contains(&acc) {
            continue;
        }
        let dir = open_rel_dir(top, &prev).map_err(io_err(root.join(&prev)))?;
        append_entry(b, dir.as_ref().map_or(top, |d| d.as_fd()), comp, &acc, root, done)?;
    }
    Ok(())
}

fn header(st: &libc::stat, kind: tar::EntryType, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(st.st_mode & 0o7777);
    h.set_uid(st.st_uid as u64);
    h.set_gid(st.st_gid as u64);
    h.set_mtime(st.st_mtime.max(0) as u64);
    h.set_size(size);
    h
}

fn append_empty<W: Write>(b: &mut tar::Builder<W>, path: &str, root: &Path) -> Result<(), ImageError> {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_size(0);
    b.append_data(&mut h, path, io::empty()).map_err(io_err(root.join(path)))
}

/// Appends `name` (in `dir`) as archive path `path`. Directories are entries only
/// (their changed children are appended separately).
fn append_entry<W: Write>(
    b: &mut tar::Builder<W>,
    dir: BorrowedFd<'_>,
    name: &str,
    path: &str,
    root: &Path,
    dirs: &mut std::collections::BTreeSet<String>,
) -> Result<(), ImageError> {
    let at = io_err(root.join(path));
    let c = cstr(name).map_err(io_err(root.join(path)))?;
    let Some(st) = sys::stat_at(dir, &c).map_err(io_err(root.join(path)))? else {
        return Ok(()); // vanished since the scan (only possible while not frozen)
    };
    match sys::file_type(&st) {
        libc::S_IFDIR if dirs.insert(path.to_string()) => {
            let mut h = header(&st, tar::EntryType::Directory, 0);
            b.append_data(&mut h, format!("{path}/"), io::empty()).map_err(at)?;
        }
        libc::S_IFDIR => {}
        libc::S_IFREG => {
            let f: File = sys::open_read_at(dir, &c).map_err(io_err(root.join(path)))?;
            let st = sys::fstat(f.as_fd()).map_err(io_err(root.join(path)))?;
            if sys::file_type(&st) != libc::S_IFREG {
                return Ok(());
            }
            let mut h = header(&st, tar::EntryType::Regular, st.st_size as u64);
            // A large read buffer: tar copies in 8 KiB steps otherwise, one syscall each.
            // Exactly the size in the header: a file that grew is cut there, one that
            // shrank (a running sandbox's, in an export) is padded with zeros, so the
            // archive stays well-formed.
            let size = st.st_size as u64;
            b.append_data(
                &mut h,
                path,
                io::BufReader::with_capacity(1 << 20, f).take(size).chain(io::repeat(0)).take(size),
            )
            .map_err(at)?;
        }
        libc::S_IFLNK => {
            let target = sys::readlink_at(dir, &c).map_err(io_err(root.join(path)))?;
            let mut h = header(&st, tar::EntryType::Symlink, 0);
            b.append_link(&mut h, path, Path::new(std::ffi::OsStr::from_bytes(&target))).map_err(at)?;
        }
        libc::S_IFIFO => {
            let mut h = header(&st, tar::EntryType::Fifo, 0);
            b.append_data(&mut h, path, io::empty()).map_err(at)?;
        }
        _ => {} // sockets and device nodes (other than whiteouts, handled by the caller) are not carried
    }
    Ok(())
}

/// Finds `rel` in a stack of overlay layer directories (top first) the way
/// overlayfs would: a whiteout or a non-directory on the way hides it, an opaque
/// directory stops the search below its layer. Returns the providing layer's
/// index, its kind and size. Directories are opened with `O_NOFOLLOW`, so a
/// symlink planted in a writable layer is never followed.
///
/// For many paths of one stack, a [`StackLookup`] walks each directory once.
pub fn lookup(stack_top_first: &[PathBuf], rel: &str) -> Result<Option<(usize, EntryKind, u64)>, ImageError> {
    StackLookup::new(stack_top_first).find(rel)
}

/// Where the walk to a directory of one layer ended.
enum ParentWalk {
    /// A component is missing and nothing above was opaque: look in the next layer.
    NextLayer,
    /// A non-directory, or a missing component below an opaque directory, hides the path.
    Hidden,
    /// The directory (`None`: the layer's root), and whether an opaque
    /// directory on the way stops the search below this layer.
    Dir { fd: Option<OwnedFd>, stop_below: bool },
}

/// [`lookup`] and [`read_entry`] for many paths of one stack: each layer's
/// root is opened once and the last directory walked to in each layer is kept
/// open, so paths taken in sorted order (siblings together) cost one walk per
/// directory, not one per path. Same `O_NOFOLLOW` rules as [`lookup`].
pub struct StackLookup<'a> {
    layers: &'a [PathBuf],
    roots: Vec<Option<OwnedFd>>,
    last: Vec<Option<(String, ParentWalk)>>,
}

impl<'a> StackLookup<'a> {
    /// A lookup over `layers` (top first); nothing is opened yet.
    pub fn new(layers: &'a [PathBuf]) -> Self {
        StackLookup {
            layers,
            roots: layers.iter().map(|_| None).collect(),
            last: layers.iter().map(|_| None).collect(),
        }
    }

    /// The walk to directory `parent` ("" for the root; no leading or doubled
    /// slashes) in layer `i`, from the cache when it was the last one there.
    fn walk(&mut self, i: usize, parent: &str) -> Result<&ParentWalk, ImageError> {
        if !matches!(&self.last[i], Some((p, _)) if p == parent) {
            let walked = self.walk_uncached(i, parent)?;
            self.last[i] = Some((parent.to_string(), walked));
        }
        Ok(&self.last[i].as_ref().expect("just cached").1)
    }

    fn walk_uncached(&mut self, i: usize, parent: &str) -> Result<ParentWalk, ImageError> {
        let layer = &self.layers[i];
        if self.roots[i].is_none() {
            self.roots[i] = Some(sys::open_dir_path(layer).map_err(io_err(layer))?);
        }
        let root = self.roots[i].as_ref().expect("just opened");
        let mut dir: Option<OwnedFd> = None;
        let mut stop_below = false;
        for c in parent.split('/').filter(|c| !c.is_empty()) {
            let name = cstr(c).map_err(io_err(layer.join(parent)))?;
            let cur = dir.as_ref().map_or(root.as_fd(), |d| d.as_fd());
            match sys::stat_at(cur, &name).map_err(io_err(layer.join(parent)))? {
                None if stop_below => return Ok(ParentWalk::Hidden),
                None => return Ok(ParentWalk::NextLayer),
                Some(st) if kind_of(&st) != EntryKind::Dir => return Ok(ParentWalk::Hidden),
                Some(_) => {
                    let sub = sys::open_dir_at(cur, &name).map_err(io_err(layer.join(parent)))?;
                    stop_below |= is_opaque(sub.as_fd());
                    dir = Some(sub);
                }
            }
        }
        Ok(ParentWalk::Dir { fd: dir, stop_below })
    }

    /// The open directory `parent` of layer `i` when the walk reaches it.
    fn dir_fd(&mut self, i: usize, parent: &str) -> Result<Option<BorrowedFd<'_>>, ImageError> {
        self.walk(i, parent)?;
        let root = self.roots[i].as_ref().map(|r| r.as_fd());
        Ok(match &self.last[i] {
            Some((_, ParentWalk::Dir { fd, .. })) => fd.as_ref().map(|d| d.as_fd()).or(root),
            _ => None,
        })
    }

    /// [`lookup`] of `rel` in this stack.
    pub fn find(&mut self, rel: &str) -> Result<Option<(usize, EntryKind, u64)>, ImageError> {
        let (parent, last) = split_rel(rel);
        if last.is_empty() {
            return Ok(None);
        }
        let name = cstr(last).map_err(io_err(rel))?;
        for i in 0..self.layers.len() {
            let stop_below = match self.walk(i, &parent)? {
                ParentWalk::NextLayer => continue,
                ParentWalk::Hidden => return Ok(None),
                ParentWalk::Dir { stop_below, .. } => *stop_below,
            };
            let layer = &self.layers[i];
            let fd = self.dir_fd(i, &parent)?.expect("the walk reached the directory");
            match sys::stat_at(fd, &name).map_err(io_err(layer.join(rel)))? {
                Some(st) if kind_of(&st) == EntryKind::Whiteout => return Ok(None),
                Some(st) => {
                    let kind = kind_of(&st);
                    return Ok(Some((i, kind, if kind == EntryKind::File { st.st_size as u64 } else { 0 })));
                }
                None if stop_below => return Ok(None),
                None => {}
            }
        }
        Ok(None)
    }

    /// [`read_entry`] of `rel` in layer `i` of this stack.
    pub fn read(&mut self, i: usize, rel: &str, cap: u64) -> Result<Option<EntryData>, ImageError> {
        let (parent, last) = split_rel(rel);
        let layer = self.layers[i].clone();
        let name = cstr(last).map_err(io_err(layer.join(rel)))?;
        let Some(fd) = self.dir_fd(i, &parent)? else { return Ok(None) };
        read_at(fd, &name, &layer.join(rel), cap)
    }
}

/// `rel`'s parent directory (components joined by '/', no empty ones) and last component.
fn split_rel(rel: &str) -> (String, &str) {
    let rel = rel.trim_matches('/');
    match rel.rsplit_once('/') {
        Some((p, n)) => (p.split('/').filter(|c| !c.is_empty()).collect::<Vec<_>>().join("/"), n),
        None => (String::new(), rel),
    }
}

/// Opens the parent of `rel` below `root` without following symlinks and
/// returns it with the last component.
fn open_parent(root: &Path, rel: &str) -> Result<(OwnedFd, Option<OwnedFd>, CString), ImageError> {
    let top = sys::open_dir_path(root).map_err(io_err(root))?;
    let (parent, name) = rel.rsplit_once('/').unwrap_or(("", rel));
    let dir = open_rel_dir(top.as_fd(), parent).map_err(io_err(root.join(parent)))?;
    Ok((top, dir, cstr(name).map_err(io_err(root.join(rel)))?))
}

/// What [`read_entry`] returns: `st_mode`, size, and the contents when read.
pub type EntryData = (u32, u64, Option<Vec<u8>>);

/// Mode (type and permission bits), size and, for a regular file of at most
/// `cap` bytes, the contents of `rel` in one layer directory. Directories are
/// opened with `O_NOFOLLOW` and the file itself without following a symlink, so
/// nothing outside the layer is read. `None` when the entry is gone.
pub fn read_entry(layer: &Path, rel: &str, cap: u64) -> Result<Option<EntryData>, ImageError> {
    let (top, dir, name) = open_parent(layer, rel)?;
    read_at(dir.as_ref().map_or(top.as_fd(), |d| d.as_fd()), &name, &layer.join(rel), cap)
}

/// [`read_entry`] of `name` in the open directory `dir` (`shown` names it in errors).
fn read_at(dir: BorrowedFd<'_>, name: &CStr, shown: &Path, cap: u64) -> Result<Option<EntryData>, ImageError> {
    let Some(st) = sys::stat_at(dir, name).map_err(io_err(shown))? else { return Ok(None) };
    let size = st.st_size as u64;
    if sys::file_type(&st) != libc::S_IFREG || size > cap {
        return Ok(Some((st.st_mode, size, None)));
    }
    let f = sys::open_read_at(dir, name).map_err(io_err(shown))?;
    let mut buf = Vec::with_capacity(size as usize);
    f.take(cap).read_to_end(&mut buf).map_err(io_err(shown))?;
    Ok(Some((st.st_mode, size, Some(buf))))
}

/// Whether `rel` is the same version in layer `i` of `a` and layer `j` of `b`:
/// same kind, mode, owner, size and mtime, and the same bytes (files) or target
/// (symlinks).
fn same_entry(
    a: &mut StackLookup<'_>,
    i: usize,
    b: &mut StackLookup<'_>,
    j: usize,
    rel: &str,
) -> Result<bool, ImageError> {
    let (parent, last) = split_rel(rel);
    let (a_root, b_root) = (a.layers[i].join(rel), b.layers[j].join(rel));
    let name = cstr(last).map_err(io_err(&a_root))?;
    let (Some(a_fd), Some(b_fd)) = (a.dir_fd(i, &parent)?, b.dir_fd(j, &parent)?) else { return Ok(false) };
    let (Some(sa), Some(sb)) =
        (sys::stat_at(a_fd, &name).map_err(io_err(&a_root))?, sys::stat_at(b_fd, &name).map_err(io_err(&b_root))?)
    else {
        return Ok(false);
    };
    if (sa.st_mode, sa.st_uid, sa.st_gid, sa.st_size, sa.st_mtime)
        != (sb.st_mode, sb.st_uid, sb.st_gid, sb.st_size, sb.st_mtime)
    {
        return Ok(false);
    }
    match kind_of(&sa) {
        EntryKind::Symlink => Ok(sys::readlink_at(a_fd, &name).ok() == sys::readlink_at(b_fd, &name).ok()),
        EntryKind::File => {
            let mut fa = sys::open_read_at(a_fd, &name).map_err(io_err(&a_root))?;
            let mut fb = sys::open_read_at(b_fd, &name).map_err(io_err(&b_root))?;
            let (mut ba, mut bb) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
            loop {
                let na = read_full(&mut fa, &mut ba).map_err(io_err(&a_root))?;
                let nb = read_full(&mut fb, &mut bb).map_err(io_err(&b_root))?;
                if na != nb || ba[..na] != bb[..nb] {
                    return Ok(false);
                }
                if na == 0 {
                    return Ok(true);
                }
            }
        }
        _ => Ok(true),
    }
}

fn read_full(f: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// A change between two layer stacks, with the index (in the newer stack) of
/// the layer that provides the path now.
pub type StackChange = (PathChange, Option<usize>);

/// Changes from the view of `then_top_first` to the view of `now_top_first`,
/// looking only at `touched` paths (everything in the layers the two stacks do
/// not share). Deletions are reported at their topmost path.
pub fn diff_stacks(
    now_top_first: &[PathBuf],
    then_top_first: &[PathBuf],
    touched: &std::collections::BTreeSet<String>,
) -> Result<Vec<StackChange>, ImageError> {
    let mut out: Vec<StackChange> = Vec::new();
    let mut deleted_dirs: Vec<String> = Vec::new();
    let (mut now_stack, mut then_stack) = (StackLookup::new(now_top_first), StackLookup::new(then_top_first));
    for path in touched {
        crate::pace::tick();
        if deleted_dirs.iter().any(|d| path.starts_with(d.as_str()) && path.as_bytes().get(d.len()) == Some(&b'/')) {
            continue;
        }
        let now = now_stack.find(path)?;
        let then = then_stack.find(path)?;
        let change = match (now, then) {
            (None, None) => continue,
            (Some((i, kind, size)), None) => {
                (PathChange { path: format!("/{path}"), change: ChangeKind::Added, kind, size }, Some(i))
            }
            (None, Some((_, kind, _))) => {
                if kind == EntryKind::Dir {
                    deleted_dirs.push(path.clone());
                }
                (PathChange { path: format!("/{path}"), change: ChangeKind::Deleted, kind, size: 0 }, None)
            }
            (Some((i, kind, size)), Some((j, old_kind, _))) => {
                let same_layer = now_top_first[i] == then_top_first[j];
                if (kind == EntryKind::Dir && old_kind == EntryKind::Dir) || (same_layer && kind == old_kind) {
                    continue;
                }
                // Different layers may hold the same version (a checkpoint copies the writable layer).
                if kind == old_kind && same_entry(&mut now_stack, i, &mut then_stack, j, path)? {
                    continue;
                }
                (PathChange { path: format!("/{path}"), change: ChangeKind::Modified, kind, size }, Some(i))
            }
        };
        out.push(change);
    }
    Ok(out)
}

/// Writes [`diff_stacks`] changes as an OCI layer tar: entries from the layer
/// providing them now (with their parent directories), `.wh.` for deletions.
pub fn write_stack_tar(now_top_first: &[PathBuf], changes: &[StackChange], out: impl Write) -> Result<(), ImageError> {
    let mut b = tar::Builder::new(out);
    let mut dirs = std::collections::BTreeSet::new();
    for (c, provider) in changes {
        let rel = c.path.trim_start_matches('/');
        let (parent, name) = rel.rsplit_once('/').unwrap_or(("", rel));
        match provider {
            None => {
                // Parents of a deletion exist in the new view: take them from the layer that has them.
                if !parent.is_empty() {
                    if let Some((pi, _, _)) = lookup(now_top_first, parent)? {
                        let top = sys::open_dir_path(&now_top_first[pi]).map_err(io_err(&now_top_first[pi]))?;
                        emit_parents(&mut b, top.as_fd(), &now_top_first[pi], parent, &mut dirs)?;
                    }
                }
                let wh = if parent.is_empty() { format!(".wh.{name}") } else { format!("{parent}/.wh.{name}") };
                append_empty(&mut b, &wh, Path::new("/"))?;
            }
            Some(i) => {
                let root = &now_top_first[*i];
                let top = sys::open_dir_path(root).map_err(io_err(root))?;
                emit_parents(&mut b, top.as_fd(), root, parent, &mut dirs)?;
                let dir = open_rel_dir(top.as_fd(), parent).map_err(io_err(root.join(parent)))?;
                append_entry(&mut b, dir.as_ref().map_or(top.as_fd(), |d| d.as_fd()), name, rel, root, &mut dirs)?;
            }
        }
    }
    b.finish().map_err(|e| ImageError::Io { path: PathBuf::from("layer tar"), source: e })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn root_or_skip() -> bool {
        if !sys::is_root() {
            println!("skipped: needs root for whiteout devices and trusted.* xattrs");
            return false;
        }
        true
    }

    fn whiteout(p: &Path) {
        let c = CString::new(p.as_os_str().as_bytes()).unwrap();
        // SAFETY: valid C string; creates a 0/0 character device (an overlay whiteout).
        assert_eq!(unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o600, 0) }, 0);
    }

    fn opaque(p: &Path) {
        let c = CString::new(p.as_os_str().as_bytes()).unwrap();
        // SAFETY: valid C strings and value buffer.
        assert_eq!(unsafe { libc::setxattr(c.as_ptr(), OPAQUE_XATTR.as_ptr(), b"y".as_ptr().cast(), 1, 0) }, 0);
    }

    #[test]
    fn diff_and_layer_tar_follow_an_upper_directory_across_checkpoints() {
        if !root_or_skip() {
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let lower = t.path().join("lower");
        let upper = t.path().join("upper");
        fs::create_dir_all(lower.join("etc")).unwrap();
        fs::write(lower.join("etc/os"), "base").unwrap();
        fs::write(lower.join("etc/gone"), "x").unwrap();
        fs::create_dir_all(lower.join("old/deep")).unwrap();
        fs::create_dir_all(upper.join("etc")).unwrap();
        // Changes since the image: modified etc/os, deleted etc/gone, new app/, old/ replaced (opaque).
        fs::write(upper.join("etc/os"), "changed").unwrap();
        whiteout(&upper.join("etc/gone"));
        fs::create_dir_all(upper.join("app/src")).unwrap();
        fs::write(upper.join("app/src/main.py"), "print(1)").unwrap();
        std::os::unix::fs::symlink("src/main.py", upper.join("app/link")).unwrap();
        fs::create_dir(upper.join("old")).unwrap();
        opaque(&upper.join("old"));
        let lowers = vec![lower.clone()];
        let m1 = scan(&upper, &[]).unwrap();
        let d1 = diff(&TreeManifest::default(), &m1, &lowers);
        let summary: Vec<(String, ChangeKind)> = d1.iter().map(|c| (c.path.clone(), c.change)).collect();
        assert!(summary.contains(&("/etc/os".into(), ChangeKind::Modified)), "{summary:?}");
        assert!(summary.contains(&("/etc/gone".into(), ChangeKind::Deleted)), "{summary:?}");
        assert!(summary.contains(&("/app/src/main.py".into(), ChangeKind::Added)), "{summary:?}");
        assert!(
            summary.contains(&("/old".into(), ChangeKind::Modified)),
            "opaque dir replaces the lower one: {summary:?}"
        );
        assert!(!summary.iter().any(|(p, _)| p == "/etc"), "unchanged parent dirs are not reported: {summary:?}");

        let mut tar1 = Vec::new();
        write_layer_tar(&upper, &TreeManifest::default(), &m1, &lowers, &mut tar1).unwrap();
        let names: Vec<String> = tar::Archive::new(&tar1[..])
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        for want in ["etc/", "etc/os", "etc/.wh.gone", "app/src/main.py", "app/link", "old/", "old/.wh..wh..opq"] {
            assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
        }
        let mut again = Vec::new();
        write_layer_tar(&upper, &TreeManifest::default(), &m1, &lowers, &mut again).unwrap();
        assert_eq!(tar1, again, "deterministic");

        // Second checkpoint: only what changed since m1.
        fs::write(upper.join("app/src/main.py"), "print(2)").unwrap();
        fs::remove_file(upper.join("app/link")).unwrap();
        fs::write(upper.join("app/new.txt"), "n").unwrap();
        fs::write(upper.join("etc/skipped"), "managed elsewhere").unwrap();
        let m2 = scan(&upper, &["etc/skipped"]).unwrap();
        let d2 = diff(&m1, &m2, &lowers);
        let summary: Vec<(String, ChangeKind)> = d2.iter().map(|c| (c.path.clone(), c.change)).collect();
        assert_eq!(
            summary,
            vec![
                ("/app/link".into(), ChangeKind::Deleted),
                ("/app/new.txt".into(), ChangeKind::Added),
                ("/app/src/main.py".into(), ChangeKind::Modified)
            ],
            "main.py existed at the first checkpoint (in the upper layer only): a modification"
        );
        let mut tar2 = Vec::new();
        write_layer_tar(&upper, &m1, &m2, &lowers, &mut tar2).unwrap();
        let names: Vec<String> = tar::Archive::new(&tar2[..])
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(names, ["app/", "app/.wh.link", "app/new.txt", "app/src/", "app/src/main.py"]);
        assert!(diff(&m2, &m2, &lowers).is_empty());
    }
}
