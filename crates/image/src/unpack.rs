//! Safe unpacking of one layer tarball into a staged layer of the store.
//!
//! The tar stream (uncompressed or gzip, detected by magic bytes) is hashed
//! while it is parsed, so the layer digest is the sha256 of the uncompressed
//! tar exactly as read (the OCI diff id); nothing is buffered beyond one chunk.
//!
//! Every entry is written relative to an open directory file descriptor, one
//! path component at a time, with `O_NOFOLLOW`/`O_DIRECTORY`
//! (`AT_SYMLINK_NOFOLLOW` for metadata): a symlink in the layer can never
//! redirect a write, whatever order the entries come in. In detail:
//!
//! * paths are normalised (`./`, `//` and `.` components dropped); absolute
//!   paths, `..` components, empty names and NUL bytes are rejected;
//! * every parent component must be a real directory of the layer (missing
//!   ones are created `0755 root:root`), never a symlink;
//! * symlinks are created verbatim (their targets are only ever resolved by
//!   the kernel inside the sandbox); a hardlink must point at an existing
//!   regular file of the same layer reached without symlinks;
//! * `.wh.<name>` becomes an overlayfs whiteout (char device 0/0), and
//!   `.wh..wh..opq` the `trusted.overlay.opaque=y` xattr on its directory;
//!   other `.wh..wh.` entries are rejected;
//! * device nodes are dropped (with a warning naming each); fifos are kept;
//! * setuid/setgid bits of non-directories are stripped unless
//!   [`ImportOptions::trusted`]; only `user.*` xattrs (plus
//!   `security.capability` when trusted) are kept;
//! * owner, mode and mtime are preserved (directory modes and mtimes are
//!   applied after the last entry so adding children does not disturb them);
//! * a later entry replaces an earlier one of the same path; a directory over
//!   a directory only updates its metadata;
//! * the unpacked size is capped by [`ImportOptions::max_unpacked_bytes`].
//!
//! On any error the staged directory is dropped, so nothing reaches the store.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::io::{self, BufReader, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::rc::Rc;

use flate2::read::MultiGzDecoder;
use strata_store::layers::StagedLayer;
use strata_store::{LayerStore, UnpackPolicy};
use tar::EntryType;
use tracing::debug;

use crate::error::{io_err, ImageError};
use crate::hash::{CountingReader, HashingReader};
use crate::sys::{self, Timespec};
use crate::{ImportOptions, ImportedLayer, Progress};

/// Deepest accepted entry path, in components.
const MAX_DEPTH: usize = 256;
/// Longest accepted entry path, in bytes (`PATH_MAX`).
const MAX_PATH_BYTES: usize = 4096;
/// Longest accepted path component, in bytes (`NAME_MAX`).
const MAX_NAME_BYTES: usize = 255;
/// Data tolerated after the end-of-archive marker (it is hashed, not used).
const MAX_TRAILING_BYTES: u64 = 16 << 20;
/// Emit a progress event at most once per this many input bytes.
const PROGRESS_STEP: u64 = 1 << 20;
/// Individually named dropped device nodes before summarising.
const MAX_NAMED_DEVICES: usize = 100;

const WHITEOUT_PREFIX: &[u8] = b".wh.";
const WHITEOUT_META_PREFIX: &[u8] = b".wh..wh.";
const WHITEOUT_OPAQUE: &[u8] = b".wh..wh..opq";
const OPAQUE_XATTR: &CStr = c"trusted.overlay.opaque";

/// A layer unpacked into the store's staging area but not yet committed.
///
/// Dropping it discards the staged files. Use it to check the digest (or
/// anything else, such as a compressed blob's digest) before committing.
#[derive(Debug)]
pub struct UnpackedLayer {
    staged: StagedLayer,
    digest: String,
    size: u64,
    policy: UnpackPolicy,
}

impl UnpackedLayer {
    /// `sha256:<hex>` of the uncompressed layer tar (the OCI diff id).
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// Unpacked bytes (sum of regular file sizes).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The staged tree (to inspect before committing).
    pub fn fs_dir(&self) -> PathBuf {
        self.staged.fs_dir()
    }

    /// Commits the layer to the store under its key: its digest and the
    /// unpack policy it was staged with (see [`strata_store::layers::layer_key`]).
    /// `new` is `false` when a layer of the same bytes unpacked with the same
    /// policy was already stored (the staged copy is discarded).
    pub fn commit(self, store: &LayerStore) -> Result<ImportedLayer, ImageError> {
        let (key, new) = store.commit(self.staged, &self.digest, self.policy, self.size)?;
        debug!(digest = %self.digest, %key, size = self.size, new, "committed layer");
        Ok(ImportedLayer { key, digest: self.digest, size: self.size, new })
    }
}

/// Unpacks one layer tar stream (uncompressed or gzip) into a staged layer
/// and commits it to `store`.
///
/// Warnings about changed or dropped entries are appended to `warnings`;
/// `progress` receives [`Progress::Bytes`] events counting bytes consumed
/// from `reader` (the total is unknown here).
pub fn unpack_layer(
    reader: impl Read,
    store: &LayerStore,
    opts: &ImportOptions,
    warnings: &mut Vec<String>,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<ImportedLayer, ImageError> {
    stage_layer(reader, store, opts, None, warnings, progress)?.commit(store)
}

/// Like [`unpack_layer`] but stops before committing, and when
/// `expected_diff_id` is given rejects content hashing to anything else
/// ([`ImageError::DigestMismatch`]).
pub fn stage_layer(
    reader: impl Read,
    store: &LayerStore,
    opts: &ImportOptions,
    expected_diff_id: Option<&str>,
    warnings: &mut Vec<String>,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<UnpackedLayer, ImageError> {
    stage_layer_as(reader, store, opts, expected_diff_id, warnings, progress, "layer", 0)
}

/// [`stage_layer`] with `what` naming the layer in error messages, and
/// `used_before` unpacked bytes of earlier layers of the same image counting
/// against [`ImportOptions::max_unpacked_bytes`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn stage_layer_as(
    reader: impl Read,
    store: &LayerStore,
    opts: &ImportOptions,
    expected_diff_id: Option<&str>,
    warnings: &mut Vec<String>,
    progress: &mut dyn FnMut(Progress<'_>),
    what: &str,
    used_before: u64,
) -> Result<UnpackedLayer, ImageError> {
    let corrupt = |source: io::Error| ImageError::Corrupt { what: what.to_string(), source };

    let staged = store.stage()?;
    let fs_dir = staged.fs_dir();
    let root = sys::open_dir_path(&fs_dir).map_err(io_err(&fs_dir))?;
    debug!(staging = %fs_dir.display(), what, "unpacking layer");

    let (mut input, input_count) = CountingReader::new(reader);
    let head = read_head(&mut input, 6).map_err(corrupt)?;
    let input = io::Cursor::new(head.clone()).chain(input);
    let decoded: Box<dyn Read + '_> = match sniff_compression(&head) {
        Compression::None => Box::new(input),
        Compression::Gzip => Box::new(MultiGzDecoder::new(BufReader::with_capacity(256 * 1024, input))),
        Compression::Unsupported(name) => {
            return Err(ImageError::UnsupportedMediaType {
                media_type: format!("{name}-compressed tar"),
                reason: "only uncompressed and gzip-compressed layers are supported".into(),
            })
        }
    };

    let mut archive = tar::Archive::new(HashingReader::new(decoded));
    let mut unpacker = Unpacker {
        root,
        root_path: fs_dir,
        opts,
        what,
        used_before,
        size: 0,
        dirs: Vec::new(),
        warn: Warnings::default(),
        is_root: sys::is_root(),
        progress,
        input_count,
        last_report: 0,
        buf: vec![0u8; 128 * 1024],
        last_dir: RefCell::new(None),
    };
    let mut entries = 0u64;
    for entry in archive.entries().map_err(corrupt)? {
        let mut entry = entry.map_err(corrupt)?;
        unpacker.entry(&mut entry)?;
        unpacker.report(false);
        entries += 1;
    }

    let mut hashing = archive.into_inner();
    let end_of_archive = hashing.count();
    match hashing.drain(MAX_TRAILING_BYTES).map_err(corrupt)? {
        Some(trailing) => debug!(end_of_archive, trailing, "end of layer archive"),
        None => {
            return Err(ImageError::archive(
                what,
                format!("more than {MAX_TRAILING_BYTES} bytes of data after the end-of-archive marker"),
            ))
        }
    }
    let (digest, tar_bytes) = hashing.finish();
    if let Some(expected) = expected_diff_id {
        if expected != digest {
            return Err(ImageError::DigestMismatch {
                what: format!("{what} (uncompressed content vs. diff_id)"),
                expected: expected.to_string(),
                actual: digest,
            });
        }
    }
    unpacker.finish_dirs()?;
    sys::syncfs(unpacker.root.as_fd()).map_err(io_err(&unpacker.root_path))?;
    unpacker.report(true);
    let size = unpacker.size;
    warnings.extend(unpacker.warn.into_messages());
    debug!(%digest, entries, tar_bytes, size, "layer unpacked");
    Ok(UnpackedLayer { staged, digest, size, policy: UnpackPolicy::of(opts.trusted) })
}

/// Reads up to `n` bytes (fewer only at end of stream).
fn read_head(r: &mut impl Read, n: usize) -> io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(n);
    r.take(n as u64).read_to_end(&mut head)?;
    Ok(head)
}

pub(crate) enum Compression {
    None,
    Gzip,
    Unsupported(&'static str),
}

/// Recognises compressed streams by their magic bytes.
pub(crate) fn sniff_compression(head: &[u8]) -> Compression {
    if head.starts_with(&[0x1f, 0x8b]) {
        Compression::Gzip
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Compression::Unsupported("zstd")
    } else if head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0x00]) {
        Compression::Unsupported("xz")
    } else if head.starts_with(b"BZh") {
        Compression::Unsupported("bzip2")
    } else {
        Compression::None
    }
}

/// Normalises an archive path into its components: `.` and empty components
/// are dropped (so `./a//b/` is `a/b`); an empty result is the layer root.
/// Returns the reason for rejection otherwise.
pub(crate) fn normalize_path(raw: &[u8]) -> Result<Vec<CString>, String> {
    if raw.is_empty() {
        return Err("empty path".into());
    }
    if raw.contains(&0) {
        return Err("path contains a NUL byte".into());
    }
    if raw[0] == b'/' {
        return Err("absolute path".into());
    }
    if raw.len() > MAX_PATH_BYTES {
        return Err(format!("path longer than {MAX_PATH_BYTES} bytes"));
    }
    let mut comps = Vec::new();
    for comp in raw.split(|b| *b == b'/') {
        match comp {
            b"" | b"." => continue,
            b".." => return Err("path contains a `..` component".into()),
            c if c.len() > MAX_NAME_BYTES => return Err(format!("path component longer than {MAX_NAME_BYTES} bytes")),
            c => comps.push(CString::new(c).map_err(|_| "path contains a NUL byte".to_string())?),
        }
    }
    if comps.len() > MAX_DEPTH {
        return Err(format!("path deeper than {MAX_DEPTH} components"));
    }
    Ok(comps)
}

fn join_lossy(comps: &[CString]) -> String {
    let parts: Vec<_> = comps.iter().map(|c| String::from_utf8_lossy(c.to_bytes())).collect();
    parts.join("/")
}

/// Metadata of one entry, from its header and PAX records.
struct Meta {
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: Timespec,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

/// Parses a PAX time (`<seconds>[.<fraction>]`, possibly negative).
fn parse_pax_time(v: &[u8]) -> Option<Timespec> {
    let s = std::str::from_utf8(v).ok()?;
    let (neg, s) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let (secs, frac) = s.split_once('.').unwrap_or((s, ""));
    if secs.is_empty() || !secs.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let secs: i64 = secs.parse().ok()?;
    let mut nsec: i64 = 0;
    for (i, b) in frac.bytes().take(9).enumerate() {
        nsec += i64::from(b - b'0') * 10i64.pow(8 - i as u32);
    }
    Some(if neg {
        if nsec == 0 {
            Timespec { sec: -secs, nsec: 0 }
        } else {
            Timespec { sec: -secs - 1, nsec: 1_000_000_000 - nsec }
        }
    } else {
        Timespec { sec: secs, nsec }
    })
}

/// Warnings collected while unpacking, summarised at the end.
#[derive(Default)]
struct Warnings {
    devices: Vec<String>,
    devices_total: usize,
    setid_total: usize,
    setid_examples: Vec<String>,
    xattrs: BTreeMap<String, (usize, String, &'static str)>,
    no_chown: bool,
}

impl Warnings {
    fn device(&mut self, entry: &str, kind: &str, major: Option<u32>, minor: Option<u32>) {
        self.devices_total += 1;
        if self.devices.len() < MAX_NAMED_DEVICES {
            let nums = match (major, minor) {
                (Some(a), Some(b)) => format!(" {a}:{b}"),
                _ => String::new(),
            };
            self.devices.push(format!("dropped {kind} device node {entry}{nums}"));
        }
    }

    fn setid(&mut self, entry: &str) {
        self.setid_total += 1;
        if self.setid_examples.len() < 5 {
            self.setid_examples.push(entry.to_string());
        }
    }

    fn xattr(&mut self, name: &[u8], entry: &str, why: &'static str) {
        let slot = self
            .xattrs
            .entry(String::from_utf8_lossy(name).into_owned())
            .or_insert_with(|| (0, entry.to_string(), why));
        slot.0 += 1;
    }

    fn into_messages(self) -> Vec<String> {
        let mut out = self.devices;
        if self.devices_total > MAX_NAMED_DEVICES {
            out.push(format!("... and {} more device nodes dropped", self.devices_total - MAX_NAMED_DEVICES));
        }
        if self.setid_total > 0 {
            out.push(format!(
                "stripped setuid/setgid bits from {} file(s) (untrusted import), e.g. {}",
                self.setid_total,
                self.setid_examples.join(", ")
            ));
        }
        for (name, (count, first, why)) in self.xattrs {
            out.push(format!(
                "dropped xattr {name} from {count} entr{} ({why}), e.g. {first}",
                if count == 1 { "y" } else { "ies" }
            ));
        }
        if self.no_chown {
            out.push("not running as root: file ownership was not preserved".into());
        }
        out
    }
}

/// A directory whose mode and mtime are applied after the last entry.
struct DeferredDir {
    comps: Vec<CString>,
    mode: u32,
    mtime: Timespec,
}

struct Unpacker<'a> {
    root: OwnedFd,
    root_path: PathBuf,
    opts: &'a ImportOptions,
    what: &'a str,
    /// Unpacked bytes of earlier layers of the same import.
    used_before: u64,
    /// Unpacked bytes of this layer so far.
    size: u64,
    dirs: Vec<DeferredDir>,
    warn: Warnings,
    is_root: bool,
    progress: &'a mut dyn FnMut(Progress<'_>),
    input_count: Rc<Cell<u64>>,
    last_report: u64,
    buf: Vec<u8>,
    /// The directory the last entry was unpacked into, kept open: entries of
    /// one directory usually come together, so it is walked to once. Forgotten
    /// whenever anything is removed ([`Unpacker::clear`]), the only way a
    /// directory on the way can be replaced.
    last_dir: RefCell<Option<(Vec<CString>, Rc<OwnedFd>)>>,
}

impl Unpacker<'_> {
    fn report(&mut self, force: bool) {
        let done = self.input_count.get();
        if force || done >= self.last_report + PROGRESS_STEP {
            self.last_report = done;
            (self.progress)(Progress::Bytes { done, total: None });
        }
    }

    fn corrupt(&self, source: io::Error) -> ImageError {
        ImageError::Corrupt { what: self.what.to_string(), source }
    }

    /// Maps an I/O error on the staged path `comps` (ours: HTTP 500).
    fn io(&self, comps: &[CString]) -> impl FnOnce(io::Error) -> ImageError {
        io_err(self.root_path.join(join_lossy(comps)))
    }

    fn entry<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> Result<(), ImageError> {
        let raw = entry.path_bytes().into_owned();
        let name = String::from_utf8_lossy(&raw).into_owned();
        let kind = entry.header().entry_type();
        if kind.is_pax_global_extensions() {
            debug!(entry = %name, "ignoring PAX global header");
            return Ok(());
        }
        let comps = normalize_path(&raw).map_err(|reason| ImageError::entry(&name, reason))?;
        let meta = self.meta(entry, &name)?;

        if let Some((last, parents)) = comps.split_last() {
            if parents.iter().any(|c| c.to_bytes().starts_with(WHITEOUT_PREFIX)) {
                return Err(ImageError::entry(&name, "whiteout name used as a directory"));
            }
            if last.to_bytes().starts_with(WHITEOUT_PREFIX) {
                return self.whiteout(parents, last, &name, kind);
            }
        }

        let dir_by_name = raw.ends_with(b"/");
        match kind {
            EntryType::Directory => self.directory(&comps, &name, &meta),
            EntryType::Regular if dir_by_name => self.directory(&comps, &name, &meta),
            _ if comps.is_empty() => Err(ImageError::entry(&name, "a non-directory entry names the layer root")),
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                self.regular(entry, &comps, &name, &meta, kind == EntryType::GNUSparse)
            }
            EntryType::Symlink => self.symlink(entry, &comps, &name, &meta),
            EntryType::Link => self.hardlink(entry, &comps, &name),
            EntryType::Fifo => self.fifo(&comps, &name, &meta),
            EntryType::Char | EntryType::Block => {
                let h = entry.header();
                let (major, minor) = (h.device_major().ok().flatten(), h.device_minor().ok().flatten());
                let kind = if kind == EntryType::Char { "character" } else { "block" };
                debug!(entry = %name, kind, "dropping device node");
                self.warn.device(&name, kind, major, minor);
                Ok(())
            }
            other => Err(ImageError::entry(
                &name,
                format!("unsupported entry type {:?} ({:?})", other, other.as_byte() as char),
            )),
        }
    }

    fn meta<R: Read>(&self, entry: &mut tar::Entry<'_, R>, name: &str) -> Result<Meta, ImageError> {
        let h = entry.header();
        let bad = |field: &str| ImageError::entry(name, format!("malformed {field} field"));
        let mode = h.mode().map_err(|_| bad("mode"))? & 0o7777;
        let id = |v: u64, field: &str| -> Result<u32, ImageError> {
            // u32::MAX is chown's "leave unchanged"; refuse it too.
            u32::try_from(v)
                .ok()
                .filter(|v| *v != u32::MAX)
                .ok_or_else(|| ImageError::entry(name, format!("{field} {v} out of range")))
        };
        let uid = id(h.uid().map_err(|_| bad("uid"))?, "uid")?;
        let gid = id(h.gid().map_err(|_| bad("gid"))?, "gid")?;
        let secs = h.mtime().map_err(|_| bad("mtime"))?;
        let mut mtime =
            Timespec { sec: i64::try_from(secs).map_err(|_| ImageError::entry(name, "mtime out of range"))?, nsec: 0 };
        let mut xattrs = Vec::new();
        if let Some(exts) = entry.pax_extensions().map_err(|e| self.corrupt(e))? {
            for ext in exts {
                let ext = ext.map_err(|e| self.corrupt(e))?;
                let key = ext.key_bytes();
                if let Some(xattr) = key.strip_prefix(b"SCHILY.xattr.") {
                    xattrs.push((xattr.to_vec(), ext.value_bytes().to_vec()));
                } else if key == b"mtime" {
                    match parse_pax_time(ext.value_bytes()) {
                        Some(t) => mtime = t,
                        None => debug!(entry = name, "ignoring malformed PAX mtime"),
                    }
                }
            }
        }
        Ok(Meta { mode, uid, gid, mtime, xattrs })
    }

    /// Opens directory `comps` of the layer, component by component, never
    /// following a symlink. Missing directories are created (0755) when
    /// `create`; otherwise, and for symlinks and non-directories, the entry
    /// `name` is rejected (`role` prefixes the reason).
    fn walk(&self, comps: &[CString], create: bool, name: &str, role: &str) -> Result<Rc<OwnedFd>, ImageError> {
        if let Some((at, fd)) = &*self.last_dir.borrow() {
            if at.as_slice() == comps {
                return Ok(fd.clone());
            }
        }
        let mut cur = self.root.try_clone().map_err(io_err(&self.root_path))?;
        for (i, comp) in comps.iter().enumerate() {
            let next = match sys::open_dir_at(cur.as_fd(), comp) {
                Ok(fd) => fd,
                Err(e) if create && e.raw_os_error() == Some(libc::ENOENT) => {
                    sys::mkdir_at(cur.as_fd(), comp, 0o755).map_err(self.io(&comps[..=i]))?;
                    let fd = sys::open_dir_at(cur.as_fd(), comp).map_err(self.io(&comps[..=i]))?;
                    sys::fchmod(fd.as_fd(), 0o755).map_err(self.io(&comps[..=i]))?;
                    fd
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ELOOP | libc::ENOTDIR)) => {
                    let prefix = join_lossy(&comps[..=i]);
                    let what = match sys::stat_at(cur.as_fd(), comp).map_err(self.io(&comps[..=i]))? {
                        None => "does not exist",
                        Some(st) if sys::file_type(&st) == libc::S_IFLNK => "is a symlink",
                        Some(_) => "is not a directory",
                    };
                    return Err(ImageError::entry(name, format!("{role}{prefix:?} {what}")));
                }
                Err(e) => return Err(self.io(&comps[..=i])(e)),
            };
            cur = next;
        }
        let cur = Rc::new(cur);
        *self.last_dir.borrow_mut() = Some((comps.to_vec(), cur.clone()));
        Ok(cur)
    }

    /// Opens (creating) the parent directory of `comps`; returns it and the last component.
    fn parent<'c>(&self, comps: &'c [CString], name: &str) -> Result<(Rc<OwnedFd>, &'c CStr), ImageError> {
        let (last, parents) = comps.split_last().ok_or_else(|| ImageError::entry(name, "empty path"))?;
        Ok((self.walk(parents, true, name, "parent ")?, last.as_c_str()))
    }

    /// Removes whatever exists at `leaf` in `dir` (a directory recursively),
    /// except a directory when `keep_dir`. Returns whether a directory was kept.
    fn clear(&self, dir: BorrowedFd<'_>, leaf: &CStr, comps: &[CString], keep_dir: bool) -> Result<bool, ImageError> {
        match sys::stat_at(dir, leaf).map_err(self.io(comps))? {
            None => Ok(false),
            Some(st) if sys::file_type(&st) == libc::S_IFDIR => {
                if keep_dir {
                    return Ok(true);
                }
                self.last_dir.take();
                debug!(path = %join_lossy(comps), "replacing directory");
                sys::remove_tree_at(dir, leaf).map_err(self.io(comps))?;
                Ok(false)
            }
            Some(_) => {
                self.last_dir.take();
                sys::unlink_at(dir, leaf, false).map_err(self.io(comps))?;
                Ok(false)
            }
        }
    }

    fn strip_setid(&mut self, mode: u32, name: &str) -> u32 {
        if !self.opts.trusted && mode & 0o6000 != 0 {
            self.warn.setid(name);
            mode & !0o6000
        } else {
            mode
        }
    }

    fn chown_fd(&mut self, fd: BorrowedFd<'_>, meta: &Meta, comps: &[CString]) -> Result<(), ImageError> {
        if self.is_root {
            sys::fchown(fd, meta.uid, meta.gid).map_err(self.io(comps))
        } else {
            self.warn.no_chown = true;
            Ok(())
        }
    }

    /// Applies the allowed xattrs to `fd`; `fd` is `None` for entry types that
    /// cannot carry them (their xattrs are dropped with a warning).
    fn xattrs(
        &mut self,
        fd: Option<BorrowedFd<'_>>,
        meta: &Meta,
        name: &str,
        comps: &[CString],
    ) -> Result<(), ImageError> {
        for (key, value) in &meta.xattrs {
            let allowed = key.starts_with(b"user.") || (self.opts.trusted && key == b"security.capability");
            if !allowed {
                let why = if key == b"security.capability" { "untrusted import" } else { "namespace not allowed" };
                self.warn.xattr(key, name, why);
                continue;
            }
            let Some(fd) = fd else {
                self.warn.xattr(key, name, "not supported on this entry type");
                continue;
            };
            let ckey =
                CString::new(key.as_slice()).map_err(|_| ImageError::entry(name, "xattr name contains a NUL byte"))?;
            match sys::fsetxattr(fd, &ckey, value) {
                Ok(()) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ERANGE | libc::E2BIG)) => {
                    return Err(ImageError::entry(name, format!("invalid xattr {}: {e}", String::from_utf8_lossy(key))))
                }
                Err(e) => return Err(self.io(comps)(e)),
            }
        }
        Ok(())
    }

    fn regular<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        comps: &[CString],
        name: &str,
        meta: &Meta,
        sparse: bool,
    ) -> Result<(), ImageError> {
        let limit = self.opts.max_unpacked_bytes;
        let used = self.used_before.saturating_add(self.size);
        let what = if self.used_before > 0 {
            format!("{} with the layers below it", self.what)
        } else {
            self.what.to_string()
        };
        let too_large = || ImageError::TooLarge { what: what.clone(), limit };
        let declared = entry.size();
        if used.saturating_add(declared) > limit {
            return Err(too_large());
        }
        let (dir, leaf) = self.parent(comps, name)?;
        // Most paths are new: try that first, and clear the way only when something is there.
        let mut file = match sys::create_file_at(dir.as_fd(), leaf, 0o600) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                self.clear(dir.as_fd(), leaf, comps, false)?;
                sys::create_file_at(dir.as_fd(), leaf, 0o600)
            }
            created => created,
        }
        .map_err(self.io(comps))?;
        let mut buf = std::mem::take(&mut self.buf);
        let mut written = 0u64;
        let copied = loop {
            let n = match entry.read(&mut buf) {
                Ok(0) => break Ok(()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => break Err(self.corrupt(e)),
            };
            written += n as u64;
            if used.saturating_add(written) > limit {
                break Err(too_large());
            }
            if let Err(e) = file.write_all(&buf[..n]) {
                break Err(self.io(comps)(e));
            }
            self.report(false);
        };
        self.buf = buf;
        copied?;
        if !sparse && written != declared {
            return Err(self.corrupt(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("entry {name:?} has {written} of {declared} bytes"),
            )));
        }
        self.size += written;
        let fd = file.as_fd();
        self.chown_fd(fd, meta, comps)?;
        let mode = self.strip_setid(meta.mode, name);
        sys::fchmod(fd, mode).map_err(self.io(comps))?;
        self.xattrs(Some(fd), meta, name, comps)?;
        sys::futimens(fd, meta.mtime).map_err(self.io(comps))?;
        Ok(())
    }

    fn directory(&mut self, comps: &[CString], name: &str, meta: &Meta) -> Result<(), ImageError> {
        let fd = if comps.is_empty() {
            self.root.try_clone().map_err(io_err(&self.root_path))?
        } else {
            let (dir, leaf) = self.parent(comps, name)?;
            if !self.clear(dir.as_fd(), leaf, comps, true)? {
                sys::mkdir_at(dir.as_fd(), leaf, 0o700).map_err(self.io(comps))?;
            }
            sys::open_dir_at(dir.as_fd(), leaf).map_err(self.io(comps))?
        };
        self.chown_fd(fd.as_fd(), meta, comps)?;
        self.xattrs(Some(fd.as_fd()), meta, name, comps)?;
        // Setgid on a directory only makes new files inherit its group: kept.
        self.dirs.push(DeferredDir { comps: comps.to_vec(), mode: meta.mode, mtime: meta.mtime });
        Ok(())
    }

    fn symlink<R: Read>(
        &mut self,
        entry: &tar::Entry<'_, R>,
        comps: &[CString],
        name: &str,
        meta: &Meta,
    ) -> Result<(), ImageError> {
        let target =
            entry.link_name_bytes().ok_or_else(|| ImageError::entry(name, "symlink without a target"))?.into_owned();
        if target.is_empty() {
            return Err(ImageError::entry(name, "symlink with an empty target"));
        }
        if target.len() >= MAX_PATH_BYTES {
            return Err(ImageError::entry(name, format!("symlink target longer than {} bytes", MAX_PATH_BYTES - 1)));
        }
        let target = CString::new(target).map_err(|_| ImageError::entry(name, "symlink target contains a NUL byte"))?;
        let (dir, leaf) = self.parent(comps, name)?;
        self.clear(dir.as_fd(), leaf, comps, false)?;
        sys::symlink_at(&target, dir.as_fd(), leaf).map_err(self.io(comps))?;
        if self.is_root {
            sys::lchown_at(dir.as_fd(), leaf, meta.uid, meta.gid).map_err(self.io(comps))?;
        } else {
            self.warn.no_chown = true;
        }
        self.xattrs(None, meta, name, comps)?;
        sys::lutimens_at(dir.as_fd(), leaf, meta.mtime).map_err(self.io(comps))?;
        Ok(())
    }

    fn hardlink<R: Read>(
        &mut self,
        entry: &tar::Entry<'_, R>,
        comps: &[CString],
        name: &str,
    ) -> Result<(), ImageError> {
        let raw_target =
            entry.link_name_bytes().ok_or_else(|| ImageError::entry(name, "hardlink without a target"))?.into_owned();
        let shown = String::from_utf8_lossy(&raw_target).into_owned();
        let target = normalize_path(&raw_target)
            .map_err(|reason| ImageError::entry(name, format!("hardlink target {shown:?}: {reason}")))?;
        let Some((target_leaf, target_parents)) = target.split_last() else {
            return Err(ImageError::entry(name, "hardlink to the layer root"));
        };
        if target == comps {
            return Err(ImageError::entry(name, "hardlink to itself"));
        }
        let target_dir = self.walk(target_parents, false, name, "hardlink target directory ")?;
        match sys::stat_at(target_dir.as_fd(), target_leaf).map_err(self.io(&target))? {
            None => {
                return Err(ImageError::entry(name, format!("hardlink target {shown:?} does not exist in this layer")))
            }
            Some(st) if sys::file_type(&st) == libc::S_IFLNK => {
                return Err(ImageError::entry(name, format!("hardlink target {shown:?} is a symlink")))
            }
            Some(st) if sys::file_type(&st) != libc::S_IFREG => {
                return Err(ImageError::entry(name, format!("hardlink target {shown:?} is not a regular file")))
            }
            Some(_) => {}
        }
        let (dir, leaf) = self.parent(comps, name)?;
        self.clear(dir.as_fd(), leaf, comps, false)?;
        match sys::link_at(target_dir.as_fd(), target_leaf, dir.as_fd(), leaf) {
            Ok(()) => Ok(()),
            // The target lived below the path this entry replaced.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                Err(ImageError::entry(name, format!("hardlink target {shown:?} was removed by this entry")))
            }
            Err(e) if e.raw_os_error() == Some(libc::EMLINK) => {
                Err(ImageError::entry(name, format!("too many hardlinks to {shown:?}")))
            }
            Err(e) => Err(self.io(comps)(e)),
        }
    }

    fn fifo(&mut self, comps: &[CString], name: &str, meta: &Meta) -> Result<(), ImageError> {
        let (dir, leaf) = self.parent(comps, name)?;
        self.clear(dir.as_fd(), leaf, comps, false)?;
        sys::mknod_at(dir.as_fd(), leaf, libc::S_IFIFO | 0o600, 0).map_err(self.io(comps))?;
        // O_NONBLOCK|O_NOFOLLOW: opening the fifo we just made for reading returns at once.
        let file = sys::open_read_at(dir.as_fd(), leaf).map_err(self.io(comps))?;
        let fd = file.as_fd();
        self.chown_fd(fd, meta, comps)?;
        let mode = self.strip_setid(meta.mode, name);
        sys::fchmod(fd, mode).map_err(self.io(comps))?;
        self.xattrs(None, meta, name, comps)?;
        sys::futimens(fd, meta.mtime).map_err(self.io(comps))?;
        Ok(())
    }

    fn whiteout(&mut self, parents: &[CString], last: &CStr, name: &str, kind: EntryType) -> Result<(), ImageError> {
        let leaf = last.to_bytes();
        if kind == EntryType::Directory {
            return Err(ImageError::entry(name, "a whiteout must not be a directory"));
        }
        if leaf == WHITEOUT_OPAQUE {
            let dir = self.walk(parents, true, name, "parent ")?;
            sys::fsetxattr(dir.as_fd(), OPAQUE_XATTR, b"y").map_err(self.io(parents))?;
            debug!(dir = %join_lossy(parents), "opaque directory");
            return Ok(());
        }
        if leaf.starts_with(WHITEOUT_META_PREFIX) {
            return Err(ImageError::entry(name, "unsupported whiteout special entry"));
        }
        let hidden = &leaf[WHITEOUT_PREFIX.len()..];
        if hidden.is_empty() || hidden == b"." || hidden == b".." {
            return Err(ImageError::entry(name, "whiteout of an invalid name"));
        }
        let hidden = CString::new(hidden).map_err(|_| ImageError::entry(name, "path contains a NUL byte"))?;
        let mut comps = parents.to_vec();
        comps.push(hidden.clone());
        let dir = self.walk(parents, true, name, "parent ")?;
        self.clear(dir.as_fd(), &hidden, &comps, false)?;
        sys::mknod_at(dir.as_fd(), &hidden, libc::S_IFCHR, sys::makedev(0, 0)).map_err(self.io(&comps))?;
        debug!(path = %join_lossy(&comps), "whiteout");
        Ok(())
    }

    /// Applies directory modes and mtimes, now that no more children are added.
    /// Directories replaced by later entries are skipped.
    fn finish_dirs(&mut self) -> Result<(), ImageError> {
        for d in std::mem::take(&mut self.dirs) {
            let mut fd = self.root.try_clone().map_err(io_err(&self.root_path))?;
            let mut gone = false;
            for comp in &d.comps {
                match sys::open_dir_at(fd.as_fd(), comp) {
                    Ok(next) => fd = next,
                    Err(_) => {
                        gone = true;
                        break;
                    }
                }
            }
            if gone {
                debug!(path = %join_lossy(&d.comps), "directory replaced later in the layer");
                continue;
            }
            sys::fchmod(fd.as_fd(), d.mode).map_err(self.io(&d.comps))?;
            sys::futimens(fd.as_fd(), d.mtime).map_err(self.io(&d.comps))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(p: &str) -> Result<String, String> {
        normalize_path(p.as_bytes()).map(|c| join_lossy(&c))
    }

    #[test]
    fn normalizes_and_rejects_paths() {
        assert_eq!(norm("./a//b/./c/").unwrap(), "a/b/c");
        assert_eq!(norm("./").unwrap(), "");
        assert!(norm("/etc/passwd").unwrap_err().contains("absolute"));
        assert!(norm("a/../../b").unwrap_err().contains(".."));
        assert!(norm("..").is_err());
        assert!(norm("").is_err());
        assert!(normalize_path(b"a\0b").is_err());
        assert!(norm(&"a/".repeat(MAX_DEPTH + 1)).is_err());
        assert!(norm(&"x".repeat(256)).is_err());
    }

    #[test]
    fn parses_pax_times() {
        assert_eq!(parse_pax_time(b"1700000000"), Some(Timespec { sec: 1_700_000_000, nsec: 0 }));
        assert_eq!(parse_pax_time(b"1.5"), Some(Timespec { sec: 1, nsec: 500_000_000 }));
        assert_eq!(parse_pax_time(b"-1.25"), Some(Timespec { sec: -2, nsec: 750_000_000 }));
        assert_eq!(parse_pax_time(b"x"), None);
        assert_eq!(parse_pax_time(b""), None);
    }
}
