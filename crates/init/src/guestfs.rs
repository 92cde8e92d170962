//! The file API inside a microVM guest: pid 1 does what the host's confined
//! file access does on the other tiers (`strata cp`, uploads, downloads,
//! `fs ls|stat|mkdir|rm|mv`), in its own root, which is the sandbox's. The
//! host sends one [`FsOp`] per connection ([`crate::spawner::Request::Fs`]);
//! an answer is JSON, a file's bytes (after their length) or a tar stream, and
//! a failure names its errno ([`FsFailure`]), so the host answers with the
//! same error codes as on the other tiers. Symlinks are never followed at the
//! end of a path (a symlink is stat'ed, removed or renamed as itself), kernel
//! pseudo-filesystems and special files are not served, and the secrets under
//! `/run/secrets` are neither served nor written.

use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Where the secrets are, which the file API neither serves nor writes.
pub const SECRETS_DIR: &str = "/run/secrets";

/// The most entries a listing holds.
pub const MAX_LIST: usize = 100_000;

/// Directories nested deeper than this end a tar download.
const MAX_DEPTH: usize = 256;

/// One file operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum FsOp {
    /// A path's metadata ([`Stat`], JSON).
    Stat {
        /// The path.
        path: String,
    },
    /// A directory's entries ([`Stat`]s, JSON), sorted by name.
    List {
        /// The directory.
        path: String,
    },
    /// Makes a directory (its missing parents with `parents`); no answer.
    Mkdir {
        /// The directory.
        path: String,
        /// Make missing parents too.
        parents: bool,
    },
    /// Removes a path (a directory and what it holds with `recursive`); no answer.
    Remove {
        /// The path.
        path: String,
        /// A directory with its contents.
        recursive: bool,
    },
    /// Renames a path; no answer.
    Rename {
        /// From.
        from: String,
        /// To.
        to: String,
    },
    /// A regular file's bytes: its length (u64 LE), then exactly that many bytes.
    Read {
        /// The file.
        path: String,
    },
    /// A tar of a file or directory (named by its base name, `.` for `/`).
    ReadTar {
        /// Where it starts.
        path: String,
    },
    /// A regular file from the bytes that follow (into a temporary file
    /// beside it, renamed into place once complete).
    Write {
        /// The file.
        path: String,
        /// Its permission bits.
        mode: u32,
    },
    /// Makes the `user.` extended attributes of a file or directory under
    /// `prefix` exactly `values` (keys without the prefix); no answer.
    SetXattrs {
        /// The file or directory.
        path: String,
        /// The prefix (starting with `user.`).
        prefix: String,
        /// The attributes under it.
        values: std::collections::BTreeMap<String, String>,
    },
    /// Extracts the tar that follows under a directory, made if missing
    /// (into a temporary directory beside its entries first; nothing is kept
    /// if an entry is refused or the archive is cut short).
    WriteTar {
        /// The directory.
        path: String,
    },
    /// Applies the OCI layer tar that follows at `/`, through the root as the
    /// sandbox sees it (a rebase's `prefer base`: the new base's versions of
    /// conflicting paths): a `.wh.<name>` entry removes the path (a symlink
    /// as itself, a directory with what it holds), a regular file or symlink
    /// replaces what is there with its mode, owner and modification time.
    /// Every entry's parent must be a directory already (one the sandbox
    /// replaced or removed is refused); directories and other kinds are
    /// refused. Entries are applied in order; a refusal stops there.
    ApplyLayer,
}

/// A path's metadata, as the guest sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stat {
    /// Absolute path.
    pub path: String,
    /// Entry name.
    pub name: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: String,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Modification time, seconds since the epoch.
    pub mtime: i64,
    /// A symlink's target as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_target: Option<String>,
    /// Its `user.` extended attributes, by full name.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub xattrs: std::collections::BTreeMap<String, String>,
}

/// Why an operation failed: its errno and the path it is about, or (errno
/// 0) the file API's rule that refused it, with a message saying which.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsFailure {
    /// The errno (`ENOENT`, `EEXIST`, ...), or 0.
    pub errno: i32,
    /// The path (empty for a rule's refusal).
    #[serde(default)]
    pub path: String,
    /// What failed.
    pub message: String,
    /// A rule of the file API: `invalid`, `special`, `pseudo_fs`, `secrets`,
    /// `archive`, and a watch's ends `too_large` and `gone` (with errno 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
}

impl FsFailure {
    pub(crate) fn io(path: &str, e: io::Error) -> FsFailure {
        let errno = e.raw_os_error().unwrap_or(libc::EIO);
        FsFailure { errno, path: path.into(), message: format!("{path}: {e}"), rule: None }
    }

    pub(crate) fn rule(rule: &str, message: String) -> FsFailure {
        FsFailure { errno: 0, path: String::new(), message, rule: Some(rule.into()) }
    }
}

type FsResult<T> = Result<T, FsFailure>;

/// Checks a path the host sent: absolute, no NUL, no `..` (it would be
/// resolved against the guest's root anyway; refusing it keeps answers plain).
pub fn check(path: &str) -> FsResult<PathBuf> {
    let p = Path::new(path);
    if !p.is_absolute() || path.contains('\0') || p.components().any(|c| c == Component::ParentDir) {
        return Err(FsFailure::rule(
            "invalid",
            format!("invalid path {path:?}: use an absolute path inside the sandbox"),
        ));
    }
    let clean: PathBuf = p.components().collect();
    if clean.starts_with(SECRETS_DIR) {
        return Err(FsFailure::rule(
            "secrets",
            format!("{path} (the secrets under {SECRETS_DIR} are not served by the file API)"),
        ));
    }
    Ok(clean)
}

/// The kernel pseudo-filesystem `path` is on (`None`: a real one).
pub(crate) fn pseudo_fs(path: &Path) -> Option<&'static str> {
    let st = nix::sys::statfs::statfs(path).ok()?;
    let t = st.filesystem_type().0 as i64;
    Some(match t {
        0x9fa0 => "proc",
        0x6265_6572 => "sysfs",
        0x1cd1 => "devpts",
        0x6367_7270 => "cgroup2",
        0x0027_e0eb => "cgroup",
        0x6462_6720 => "debugfs",
        0x7363_6673 => "securityfs",
        0x7472_6163 => "tracefs",
        0xcafe_4a11 => "bpf",
        _ => return None,
    })
}

fn kind_of(t: fs::FileType) -> &'static str {
    if t.is_symlink() {
        "symlink"
    } else if t.is_dir() {
        "dir"
    } else if t.is_file() {
        "file"
    } else {
        "other"
    }
}

fn stat_of(path: &Path, meta: &fs::Metadata) -> Stat {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "/".into());
    Stat {
        path: path.to_string_lossy().into_owned(),
        name,
        kind: kind_of(meta.file_type()).into(),
        size: meta.len(),
        mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
        mtime: meta.mtime(),
        link_target: meta
            .file_type()
            .is_symlink()
            .then(|| fs::read_link(path).ok().map(|t| t.to_string_lossy().into_owned()))
            .flatten(),
        // A symlink has none of its own (and its target is not its business).
        xattrs: match meta.file_type().is_symlink() {
            true => Default::default(),
            false => opath(path).map(|fd| crate::xattr::read_user(fd.as_raw_fd())).unwrap_or_default(),
        },
    }
}

/// An `O_PATH` descriptor of `path` itself (a symlink is not followed).
fn opath(path: &Path) -> io::Result<fs::File> {
    fs::OpenOptions::new().read(true).custom_flags(libc::O_PATH | libc::O_NOFOLLOW).open(path)
}

/// Makes the `user.` attributes of `path` under `prefix` exactly `values`.
fn set_xattrs(path: &Path, prefix: &str, values: &std::collections::BTreeMap<String, String>) -> FsResult<()> {
    let shown = path.to_string_lossy();
    let meta = fs::symlink_metadata(path).map_err(|e| FsFailure::io(&shown, e))?;
    if meta.file_type().is_symlink() {
        return Err(FsFailure::rule(
            "invalid",
            format!("{shown}: a symlink has no user attributes of its own (set them on what it points to)"),
        ));
    }
    if !(meta.is_file() || meta.is_dir()) {
        return Err(special(&shown));
    }
    let fd = opath(path).map_err(|e| FsFailure::io(&shown, e))?;
    crate::xattr::replace_user(fd.as_raw_fd(), prefix, values).map_err(|e| match e.kind() {
        io::ErrorKind::InvalidInput => FsFailure::rule("invalid", e.to_string()),
        _ => FsFailure::io(&shown, e),
    })
}

/// `path`'s metadata (the link itself for a symlink).
fn stat(path: &Path) -> FsResult<Stat> {
    let shown = path.to_string_lossy();
    let meta = fs::symlink_metadata(path).map_err(|e| FsFailure::io(&shown, e))?;
    Ok(stat_of(path, &meta))
}

fn list(path: &Path) -> FsResult<Vec<Stat>> {
    let shown = path.to_string_lossy().into_owned();
    if let Some(fs) = pseudo_fs(path) {
        return Err(pseudo(&shown, fs));
    }
    let mut out = Vec::new();
    for e in fs::read_dir(path).map_err(|e| FsFailure::io(&shown, e))? {
        let e = e.map_err(|e| FsFailure::io(&shown, e))?;
        if out.len() >= MAX_LIST {
            return Err(FsFailure::rule("invalid", format!("{shown}: more than {MAX_LIST} entries")));
        }
        let p = path.join(e.file_name());
        if p.starts_with(SECRETS_DIR) {
            continue;
        }
        if let Ok(meta) = fs::symlink_metadata(&p) {
            out.push(stat_of(&p, &meta));
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

pub(crate) fn pseudo(path: &str, fs: &str) -> FsFailure {
    FsFailure::rule(
        "pseudo_fs",
        format!("{path}: on a {fs} pseudo-filesystem, which the file API does not serve (kernel interfaces answer whoever asks; read them from inside the sandbox with exec)"),
    )
}

fn special(path: &str) -> FsFailure {
    FsFailure::rule(
        "special",
        format!("{path}: a special file, which the file API does not read or write (only regular files, directories and symlinks)"),
    )
}

/// Runs `op`, reading what it takes from `input` and writing its answer to `out`.
pub fn run(op: &FsOp, input: &mut dyn Read, out: &mut dyn Write) -> FsResult<()> {
    let json = |out: &mut dyn Write, v: &dyn erased::Json| -> FsResult<()> {
        v.write_to(out).map_err(|e| FsFailure::io("(answer)", e))
    };
    match op {
        FsOp::Stat { path } => json(out, &stat(&check(path)?)?),
        FsOp::List { path } => json(out, &list(&check(path)?)?),
        FsOp::Mkdir { path, parents } => {
            let p = check(path)?;
            let r = if *parents { fs::create_dir_all(&p) } else { fs::create_dir(&p) };
            r.map_err(|e| FsFailure::io(path, e))
        }
        FsOp::Remove { path, recursive } => {
            let p = check(path)?;
            if p == Path::new("/") {
                return Err(FsFailure::rule("invalid", "refusing to remove / (the sandbox's root)".into()));
            }
            let meta = fs::symlink_metadata(&p).map_err(|e| FsFailure::io(path, e))?;
            let r = match (meta.is_dir(), recursive) {
                (true, true) => fs::remove_dir_all(&p),
                (true, false) => fs::remove_dir(&p),
                (false, _) => fs::remove_file(&p),
            };
            r.map_err(|e| FsFailure::io(path, e))
        }
        FsOp::Rename { from, to } => {
            let (f, t) = (check(from)?, check(to)?);
            fs::rename(&f, &t).map_err(|e| FsFailure::io(&format!("{from} -> {to}"), e))
        }
        FsOp::Read { path } => read(&check(path)?, out),
        FsOp::ReadTar { path } => read_tar(&check(path)?, out),
        FsOp::Write { path, mode } => write(&check(path)?, *mode, input),
        FsOp::WriteTar { path } => write_tar(&check(path)?, input),
        FsOp::ApplyLayer => apply_layer(input),
        FsOp::SetXattrs { path, prefix, values } => set_xattrs(&check(path)?, prefix, values),
    }
}

/// JSON answers of several types through one `&dyn`.
mod erased {
    pub trait Json {
        fn write_to(&self, out: &mut dyn std::io::Write) -> std::io::Result<()>;
    }
    impl<T: serde::Serialize> Json for T {
        fn write_to(&self, out: &mut dyn std::io::Write) -> std::io::Result<()> {
            serde_json::to_writer(out, self).map_err(std::io::Error::other)
        }
    }
}

fn read(path: &Path, out: &mut dyn Write) -> FsResult<()> {
    let shown = path.to_string_lossy().into_owned();
    if let Some(fs) = pseudo_fs(path) {
        return Err(pseudo(&shown, fs));
    }
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| FsFailure::io(&shown, e))?;
    let meta = f.metadata().map_err(|e| FsFailure::io(&shown, e))?;
    if meta.is_dir() {
        return Err(FsFailure::io(&shown, io::Error::from_raw_os_error(libc::EISDIR)));
    }
    if !meta.is_file() {
        return Err(special(&shown));
    }
    let len = meta.len();
    out.write_all(&len.to_le_bytes()).map_err(|e| FsFailure::io(&shown, e))?;
    // Exactly `len` bytes: cut if it grew, zeros if it shrank (the length went first).
    let mut body = io::BufReader::with_capacity(1 << 20, f).take(len).chain(io::repeat(0)).take(len);
    io::copy(&mut body, out).map_err(|e| FsFailure::io(&shown, e))?;
    Ok(())
}

fn read_tar(path: &Path, out: &mut dyn Write) -> FsResult<()> {
    let shown = path.to_string_lossy().into_owned();
    let meta = fs::symlink_metadata(path).map_err(|e| FsFailure::io(&shown, e))?;
    if !(meta.is_dir() || meta.is_file() || meta.file_type().is_symlink()) {
        return Err(special(&shown));
    }
    if let Some(fs) = pseudo_fs(path) {
        return Err(pseudo(&shown, fs));
    }
    let name = path.file_name().map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    let mut b = tar::Builder::new(out);
    b.follow_symlinks(false);
    append(&mut b, path, &name, 0)?;
    b.finish().map_err(|e| FsFailure::io(&shown, e))
}

/// Appends `path` as `name` (and, for a directory, what it holds).
fn append(b: &mut tar::Builder<&mut dyn Write>, path: &Path, name: &Path, depth: usize) -> FsResult<()> {
    let shown = path.to_string_lossy().into_owned();
    if depth > MAX_DEPTH || path.starts_with(SECRETS_DIR) {
        return Ok(());
    }
    let Ok(meta) = fs::symlink_metadata(path) else { return Ok(()) }; // gone since it was listed
    let t = meta.file_type();
    let mut h = tar::Header::new_gnu();
    h.set_metadata_in_mode(&meta, tar::HeaderMode::Complete);
    if t.is_dir() {
        if depth > 0 && pseudo_fs(path).is_some() {
            return Ok(());
        }
        h.set_size(0);
        b.append_data(&mut h, name, io::empty()).map_err(|e| FsFailure::io(&shown, e))?;
        let mut names: Vec<_> = match fs::read_dir(path) {
            Ok(rd) => rd.flatten().map(|e| e.file_name()).collect(),
            Err(_) => return Ok(()),
        };
        names.sort();
        for n in names {
            append(b, &path.join(&n), &name.join(&n), depth + 1)?;
        }
    } else if t.is_file() {
        let Ok(f) = fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path)
        else {
            return Ok(());
        };
        let len = meta.len();
        h.set_size(len);
        let body = io::BufReader::with_capacity(1 << 20, f).take(len).chain(io::repeat(0)).take(len);
        b.append_data(&mut h, name, body).map_err(|e| FsFailure::io(&shown, e))?;
    } else if t.is_symlink() {
        let target = fs::read_link(path).map_err(|e| FsFailure::io(&shown, e))?;
        h.set_size(0);
        b.append_link(&mut h, name, &target).map_err(|e| FsFailure::io(&shown, e))?;
    }
    // Devices, fifos and sockets are left out.
    Ok(())
}

/// A name beside `path` for a temporary file or directory, of the form
/// every tier's file API uses ([`crate::guestwatch::is_temp_name`]: watches
/// do not report it).
fn temp_beside(path: &Path) -> PathBuf {
    let mut b = [0u8; 8];
    let _ = crate::channel::random_bytes().map(|r| b.copy_from_slice(&r[..8]));
    let tag: String = b.iter().map(|x| format!("{x:02x}")).collect();
    path.with_file_name(format!(".strata-upload-{tag}"))
}

fn write(path: &Path, mode: u32, input: &mut dyn Read) -> FsResult<()> {
    let shown = path.to_string_lossy().into_owned();
    if fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
        return Err(FsFailure::io(&shown, io::Error::from_raw_os_error(libc::EISDIR)));
    }
    let tmp = temp_beside(path);
    let written = (|| -> io::Result<()> {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode & 0o1777)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        io::copy(input, &mut f)?;
        f.set_permissions(fs::Permissions::from_mode(mode & 0o1777))?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(FsFailure::io(&shown, e));
    }
    Ok(())
}

/// Extracts a tar under `dir` (made if missing): every entry into a
/// temporary directory beside it first (entries that would leave it, devices
/// and links out of it are refused), then each top-level entry moved into
/// place (a directory that exists already is merged into, entry by entry).
/// Nothing is kept of an archive refused or cut short before the moves.
fn write_tar(dir: &Path, input: &mut dyn Read) -> FsResult<()> {
    let shown = dir.to_string_lossy().into_owned();
    let made = match fs::metadata(dir) {
        Ok(m) if m.is_dir() => false,
        Ok(_) => return Err(FsFailure::io(&shown, io::Error::from_raw_os_error(libc::ENOTDIR))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::create_dir_all(dir).map_err(|e| FsFailure::io(&shown, e))?;
            true
        }
        Err(e) => return Err(FsFailure::io(&shown, e)),
    };
    let staging = temp_beside(&dir.join("upload"));
    if let Err(e) = fs::create_dir(&staging) {
        if made {
            let _ = fs::remove_dir(dir);
        }
        return Err(FsFailure::io(&shown, e));
    }
    let res = (|| -> FsResult<()> {
        let mut a = tar::Archive::new(input);
        a.set_preserve_permissions(true);
        a.set_overwrite(true);
        for entry in a.entries().map_err(|e| archive_failure("(archive)", e))? {
            let mut entry = entry.map_err(|e| archive_failure("(archive)", e))?;
            let name = entry.path().map(|p| p.into_owned()).unwrap_or_default();
            let shown_name = name.to_string_lossy().into_owned();
            let kind = entry.header().entry_type();
            if !(kind.is_file() || kind.is_dir() || kind.is_symlink() || kind.is_hard_link()) {
                return Err(FsFailure::rule("archive", format!("tar entry {shown_name:?}: a special file")));
            }
            // unpack_in refuses entries that would land outside the staging directory.
            match entry.unpack_in(&staging) {
                Ok(true) => {}
                Ok(false) => {
                    return Err(FsFailure::rule("archive", format!("tar entry {shown_name:?}: leaves the directory")))
                }
                Err(e) => return Err(archive_failure(&shown_name, e)),
            }
        }
        for e in fs::read_dir(&staging).map_err(|e| FsFailure::io(&shown, e))? {
            let e = e.map_err(|e| FsFailure::io(&shown, e))?;
            merge(&e.path(), &dir.join(e.file_name()))?;
        }
        Ok(())
    })();
    let _ = fs::remove_dir_all(&staging);
    if res.is_err() && made {
        let _ = fs::remove_dir_all(dir);
    }
    res
}

/// [`FsOp::ApplyLayer`].
fn apply_layer(input: &mut dyn Read) -> FsResult<()> {
    let mut a = tar::Archive::new(input);
    a.set_preserve_permissions(true);
    a.set_preserve_ownerships(true);
    a.set_preserve_mtime(true);
    for entry in a.entries().map_err(|e| archive_failure("(archive)", e))? {
        let mut entry = entry.map_err(|e| archive_failure("(archive)", e))?;
        let name = entry.path().map_err(|e| archive_failure("(archive)", e))?.to_string_lossy().into_owned();
        let (parent, leaf) = name.trim_end_matches('/').rsplit_once('/').unwrap_or(("", name.as_str()));
        let (removal, leaf) = match leaf.strip_prefix(".wh.") {
            Some(rest) => (true, rest),
            None => (false, leaf),
        };
        let target =
            check(&format!("/{}", if parent.is_empty() { leaf.to_string() } else { format!("{parent}/{leaf}") }))?;
        let shown = target.to_string_lossy().into_owned();
        if leaf.is_empty() || leaf == "." || leaf.starts_with(".wh.") {
            return Err(FsFailure::rule("archive", format!("tar entry {name:?}: not a path a layer changes")));
        }
        let dir = target.parent().unwrap_or(Path::new("/"));
        if !fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) {
            return Err(FsFailure::rule(
                "invalid",
                format!(
                    "{}: not a directory in the sandbox (it replaced or removed it): settle it inside the sandbox",
                    dir.display()
                ),
            ));
        }
        let kind = entry.header().entry_type();
        if !(removal || kind.is_file() || kind.is_symlink()) {
            return Err(FsFailure::rule("archive", format!("tar entry {name:?}: only files, symlinks and whiteouts")));
        }
        match fs::symlink_metadata(&target) {
            Ok(m) if m.is_dir() => fs::remove_dir_all(&target).map_err(|e| FsFailure::io(&shown, e))?,
            Ok(_) => fs::remove_file(&target).map_err(|e| FsFailure::io(&shown, e))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(FsFailure::io(&shown, e)),
        }
        if !removal {
            entry.unpack(&target).map_err(|e| archive_failure(&name, e))?;
        }
    }
    Ok(())
}

fn archive_failure(entry: &str, e: io::Error) -> FsFailure {
    FsFailure::rule("archive", format!("tar entry {entry:?}: {e}"))
}

/// Moves `from` to `to`; a directory onto an existing directory is merged.
fn merge(from: &Path, to: &Path) -> FsResult<()> {
    let shown = to.to_string_lossy().into_owned();
    let both_dirs =
        fs::symlink_metadata(from).is_ok_and(|m| m.is_dir()) && fs::symlink_metadata(to).is_ok_and(|m| m.is_dir());
    if both_dirs {
        for e in fs::read_dir(from).map_err(|e| FsFailure::io(&shown, e))? {
            let e = e.map_err(|e| FsFailure::io(&shown, e))?;
            merge(&e.path(), &to.join(e.file_name()))?;
        }
        return Ok(());
    }
    if fs::symlink_metadata(to).is_ok_and(|m| m.is_dir()) {
        fs::remove_dir_all(to).map_err(|e| FsFailure::io(&shown, e))?;
    }
    fs::rename(from, to).map_err(|e| FsFailure::io(&shown, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[Stat]) -> Vec<&str> {
        list.iter().map(|s| s.name.as_str()).collect()
    }

    #[test]
    fn a_layer_applied_replaces_and_removes_paths_and_refuses_what_it_cannot_place() {
        let header = || {
            let mut h = tar::Header::new_gnu();
            h.set_uid(u64::from(nix::unistd::getuid().as_raw()));
            h.set_gid(u64::from(nix::unistd::getgid().as_raw()));
            h.set_mtime(0);
            h
        };
        let d = tempfile::tempdir().unwrap();
        let root = d.path().to_string_lossy().trim_start_matches('/').to_string();
        fs::create_dir_all(d.path().join("etc/dir")).unwrap();
        fs::write(d.path().join("etc/motd"), "mine\n").unwrap();
        fs::write(d.path().join("etc/dir/x"), "x").unwrap();
        std::os::unix::fs::symlink("/nowhere", d.path().join("etc/issue")).unwrap();
        let mut b = tar::Builder::new(Vec::new());
        let mut h = header();
        h.set_size(8);
        h.set_mode(0o640);
        h.set_mtime(1_000_000);
        b.append_data(&mut h, format!("{root}/etc/motd"), &b"patched\n"[..]).unwrap();
        let mut h = header();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        b.append_link(&mut h, format!("{root}/etc/issue"), "motd").unwrap();
        let mut h = header();
        h.set_size(0);
        b.append_data(&mut h, format!("{root}/etc/.wh.dir"), &b""[..]).unwrap();
        let tar = b.into_inner().unwrap();
        apply_layer(&mut &tar[..]).unwrap();
        assert_eq!(fs::read_to_string(d.path().join("etc/motd")).unwrap(), "patched\n");
        let meta = fs::metadata(d.path().join("etc/motd")).unwrap();
        assert_eq!((meta.mode() & 0o7777, meta.mtime()), (0o640, 1_000_000));
        assert_eq!(fs::read_link(d.path().join("etc/issue")).unwrap(), Path::new("motd"));
        assert!(!d.path().join("etc/dir").exists(), "the whiteout removed the directory");

        // An entry whose directory is not there, or a directory entry: refused.
        let mut b = tar::Builder::new(Vec::new());
        let mut h = header();
        h.set_size(1);
        b.append_data(&mut h, format!("{root}/gone/f"), &b"f"[..]).unwrap();
        let tar = b.into_inner().unwrap();
        assert_eq!(apply_layer(&mut &tar[..]).unwrap_err().rule.as_deref(), Some("invalid"));
        let mut b = tar::Builder::new(Vec::new());
        let mut h = header();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_size(0);
        b.append_data(&mut h, format!("{root}/etc/newdir"), &b""[..]).unwrap();
        let tar = b.into_inner().unwrap();
        assert_eq!(apply_layer(&mut &tar[..]).unwrap_err().rule.as_deref(), Some("archive"));
    }

    #[test]
    fn paths_are_checked_and_secrets_refused() {
        for bad in ["relative", "/a/../b", "/x\0y"] {
            assert_eq!(check(bad).unwrap_err().rule.as_deref(), Some("invalid"), "{bad:?}");
        }
        assert_eq!(check("/run/secrets/K").unwrap_err().rule.as_deref(), Some("secrets"));
        assert_eq!(check("/run//secrets").unwrap_err().rule.as_deref(), Some("secrets"));
        assert_eq!(check("/a/./b/").unwrap(), PathBuf::from("/a/b"));
    }

    #[test]
    fn files_and_tars_go_both_ways_in_a_directory() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        let file = root.join("f.txt");
        let op = FsOp::Write { path: file.to_string_lossy().into(), mode: 0o640 };
        run(&op, &mut &b"hello"[..], &mut io::sink()).unwrap();
        assert_eq!(fs::read(&file).unwrap(), b"hello");
        assert_eq!(fs::metadata(&file).unwrap().mode() & 0o777, 0o640);
        let mut got = Vec::new();
        run(&FsOp::Read { path: file.to_string_lossy().into() }, &mut io::empty(), &mut got).unwrap();
        assert_eq!(&got[..8], &5u64.to_le_bytes());
        assert_eq!(&got[8..], b"hello");
        // A directory as a tar, extracted elsewhere, merged into what is there.
        fs::create_dir_all(root.join("src/sub")).unwrap();
        fs::write(root.join("src/sub/a"), "a").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("src/link")).unwrap();
        let mut tar = Vec::new();
        run(&FsOp::ReadTar { path: root.join("src").to_string_lossy().into() }, &mut io::empty(), &mut tar).unwrap();
        fs::create_dir_all(root.join("dst/src")).unwrap();
        fs::write(root.join("dst/src/kept"), "k").unwrap();
        run(&FsOp::WriteTar { path: root.join("dst").to_string_lossy().into() }, &mut &tar[..], &mut io::sink())
            .unwrap();
        assert_eq!(fs::read(root.join("dst/src/sub/a")).unwrap(), b"a");
        assert_eq!(fs::read(root.join("dst/src/kept")).unwrap(), b"k", "merged, not replaced");
        assert_eq!(fs::read_link(root.join("dst/src/link")).unwrap(), Path::new("/etc/passwd"));
        let listed = list(&root.join("dst")).unwrap();
        assert_eq!(names(&listed), ["src"], "no staging directory is left");
        // A cut-off archive keeps nothing.
        let err = run(
            &FsOp::WriteTar { path: root.join("dst").to_string_lossy().into() },
            &mut &tar[..tar.len() / 2 + 1],
            &mut io::sink(),
        );
        assert!(err.is_err() || names(&list(&root.join("dst")).unwrap()) == ["src"]);
        assert_eq!(names(&list(&root.join("dst")).unwrap()), ["src"]);
    }

    #[test]
    fn user_attributes_are_set_under_a_prefix_and_shown_in_stats() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("f");
        fs::write(&file, b"x").unwrap();
        let path: String = file.to_string_lossy().into();
        let values = std::collections::BTreeMap::from([("k".to_string(), "v".to_string())]);
        let op = FsOp::SetXattrs { path: path.clone(), prefix: "user.e2b.".into(), values };
        match run(&op, &mut io::empty(), &mut io::sink()) {
            Ok(()) => {}
            Err(e) if e.errno == libc::EOPNOTSUPP => {
                return eprintln!("skipped: the temp directory's filesystem has no user xattrs ({})", e.message)
            }
            Err(e) => panic!("{e:?}"),
        }
        let mut out = Vec::new();
        run(&FsOp::Stat { path: path.clone() }, &mut io::empty(), &mut out).unwrap();
        let st: Stat = serde_json::from_slice(&out).unwrap();
        assert_eq!(st.xattrs.get("user.e2b.k").map(String::as_str), Some("v"), "{st:?}");
        // Only user. attributes; not on a symlink.
        let op = FsOp::SetXattrs { path: path.clone(), prefix: "trusted.".into(), values: Default::default() };
        assert_eq!(run(&op, &mut io::empty(), &mut io::sink()).unwrap_err().rule.as_deref(), Some("invalid"));
        std::os::unix::fs::symlink(&file, d.path().join("l")).unwrap();
        let op = FsOp::SetXattrs {
            path: d.path().join("l").to_string_lossy().into(),
            prefix: "user.".into(),
            values: Default::default(),
        };
        assert_eq!(run(&op, &mut io::empty(), &mut io::sink()).unwrap_err().rule.as_deref(), Some("invalid"));
    }

    #[test]
    fn failures_carry_their_errno() {
        let d = tempfile::tempdir().unwrap();
        let missing = d.path().join("missing");
        let e =
            run(&FsOp::Stat { path: missing.to_string_lossy().into() }, &mut io::empty(), &mut io::sink()).unwrap_err();
        assert_eq!(e.errno, libc::ENOENT);
        assert!(e.message.contains("missing"), "{}", e.message);
        let e = run(&FsOp::Read { path: d.path().to_string_lossy().into() }, &mut io::empty(), &mut io::sink())
            .unwrap_err();
        assert_eq!(e.errno, libc::EISDIR);
        let e =
            run(&FsOp::Remove { path: "/".into(), recursive: true }, &mut io::empty(), &mut io::sink()).unwrap_err();
        assert_eq!(e.rule.as_deref(), Some("invalid"));
    }
}
