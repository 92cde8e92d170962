//! A microVM guest's writable layer (its overlayfs upper directory, on the
//! guest's own disk), read by the guest's pid 1 for the host: a manifest of
//! every entry ([`scan`]) and an OCI layer tar of chosen entries
//! ([`write_tar`]).
//!
//! The host parses both as untrusted input, with the conventions of
//! strata-image's `changes` module (its own reader of an upper directory),
//! which this small, self-contained version follows: kernel inode number and
//! ctime per entry, a 0/0 character device is a whiteout (`.wh.<name>` in a
//! tar), a directory with `trusted.overlay.opaque=y` is opaque
//! (`.wh..wh..opq`), parents come first and once, headers depend only on the
//! tree, so equal trees give equal bytes.
//!
//! Every directory is opened relative to its parent with `O_NOFOLLOW` and every
//! entry is looked at with `AT_SYMLINK_NOFOLLOW`: a symlink the sandbox put in
//! place of a directory is never followed. The paths the host asks for are
//! checked to be relative and clean, so none walks outside the layer.

use std::collections::BTreeSet;
use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::Mode;
use serde::{Deserialize, Serialize};

const OPAQUE_XATTR: &CStr = c"trusted.overlay.opaque";
/// Deepest directory nesting read (the root is depth 0).
const MAX_DEPTH: usize = 256;

/// Kind of an entry of a writable layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link.
    Symlink,
    /// Overlay whiteout (a 0/0 character device): the path is deleted from the layers below.
    Whiteout,
    /// Fifo, socket, or a device other than a whiteout.
    Other,
}

/// One entry of the writable layer, as the guest's kernel sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Relative, '/'-separated path, no leading '/' (`etc/passwd`).
    pub path: String,
    /// Kind.
    pub kind: Kind,
    /// Inode number.
    pub ino: u64,
    /// Change time, nanoseconds since the epoch.
    pub ctime_ns: i64,
    /// Size in bytes (regular files; 0 otherwise).
    pub size: u64,
    /// Opaque directory (`trusted.overlay.opaque=y`): hides everything below it in lower layers.
    #[serde(default)]
    pub opaque: bool,
}

/// One entry to put in a layer tar.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Item {
    /// Relative, '/'-separated path, no leading '/', no empty, `.` or `..` component.
    pub path: String,
    /// The path is deleted: write `.wh.<name>` (in its parent directory) whatever is there now.
    #[serde(default)]
    pub deleted: bool,
}

/// `io::Error` of `e` with `path` ("" is the layer's root) in its message.
fn at_path(path: &str, e: impl Into<io::Error>) -> io::Error {
    let e = e.into();
    io::Error::new(e.kind(), format!("{}: {e}", shown(path)))
}

fn shown(path: &str) -> &str {
    if path.is_empty() {
        "."
    } else {
        path
    }
}

fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}/{name}")
    }
}

fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

/// `openat(dir, name, flags)` as an owned descriptor.
fn open_at(dir: RawFd, name: &CStr, flags: OFlag) -> nix::Result<OwnedFd> {
    let fd = nix::fcntl::openat(Some(dir), name, flags, Mode::empty())?;
    // SAFETY: `fd` was just returned by a successful openat and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `fstatat(AT_SYMLINK_NOFOLLOW)`; `None` when `name` does not exist.
fn stat_at(dir: RawFd, name: &CStr) -> nix::Result<Option<libc::stat>> {
    match nix::sys::stat::fstatat(Some(dir), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

fn file_type(st: &libc::stat) -> libc::mode_t {
    st.st_mode & libc::S_IFMT
}

fn kind_of(st: &libc::stat) -> Kind {
    match file_type(st) {
        libc::S_IFREG => Kind::File,
        libc::S_IFDIR => Kind::Dir,
        libc::S_IFLNK => Kind::Symlink,
        libc::S_IFCHR if st.st_rdev == 0 => Kind::Whiteout,
        _ => Kind::Other,
    }
}

/// Whether the open directory `fd` is marked opaque (`trusted.overlay.opaque` is exactly `y`).
fn is_opaque(fd: RawFd) -> bool {
    let mut buf = [0u8; 2];
    // SAFETY: `fd` is an open descriptor, the name is NUL-terminated and `buf` is
    // writable for `buf.len()` bytes (a longer value fails with ERANGE).
    let n = unsafe { libc::fgetxattr(fd, OPAQUE_XATTR.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    n == 1 && buf[0] == b'y'
}

/// Every entry below `root` (not root itself), sorted by path (byte order of the path string, like a BTreeMap<String,_>).
pub fn scan(root: BorrowedFd<'_>) -> io::Result<Vec<Entry>> {
    // A new open file description of the root: its own directory offset,
    // whatever the caller's descriptor has read.
    let dir = open_at(root.as_raw_fd(), c".", OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
        .map_err(|e| at_path("", e))?;
    let mut out = Vec::new();
    scan_dir(&dir, "", 0, &mut out)?;
    out.sort_unstable_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// The names in the directory `dir` (without `.` and `..`), in directory order.
fn read_names(dir: &OwnedFd, path: &str) -> io::Result<Vec<CString>> {
    // fdopendir takes its descriptor over: give it a duplicate (sharing the
    // offset, rewound below).
    let dup =
        nix::fcntl::fcntl(dir.as_raw_fd(), nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(0)).map_err(|e| at_path(path, e))?;
    // SAFETY: `dup` is an open directory descriptor nobody else owns; on
    // success the stream owns it.
    let dirp = unsafe { libc::fdopendir(dup) };
    if dirp.is_null() {
        let e = io::Error::last_os_error();
        // SAFETY: fdopendir failed, so `dup` is still ours to close, once.
        unsafe { libc::close(dup) };
        return Err(at_path(path, e));
    }
    // SAFETY: `dirp` is a valid directory stream.
    unsafe { libc::rewinddir(dirp) };
    let mut names = Vec::new();
    let result = loop {
        // readdir returns NULL at the end and on errors alike: errno tells them apart.
        Errno::clear();
        // SAFETY: `dirp` is a valid directory stream.
        let ent = unsafe { libc::readdir(dirp) };
        if ent.is_null() {
            break match Errno::last_raw() {
                0 => Ok(()),
                e => Err(at_path(path, Errno::from_raw(e))),
            };
        }
        // SAFETY: `ent` points to a dirent valid until the next readdir on
        // `dirp`, with a NUL-terminated `d_name`; it is copied out at once.
        let name = unsafe { CStr::from_ptr((*ent).d_name.as_ptr()) };
        if name != c"." && name != c".." {
            names.push(name.to_owned());
        }
    };
    // SAFETY: `dirp` is valid and closed exactly once (closing `dup` with it).
    unsafe { libc::closedir(dirp) };
    result.map(|()| names)
}

fn scan_dir(dir: &OwnedFd, prefix: &str, depth: usize, out: &mut Vec<Entry>) -> io::Result<()> {
    if depth > MAX_DEPTH {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: directories nested deeper than {MAX_DEPTH}", shown(prefix)),
        ));
    }
    let fd = dir.as_raw_fd();
    for name in read_names(dir, prefix)? {
        let Ok(n) = name.to_str() else {
            // Not carried, as the host's own walk of an upper directory does not carry them.
            continue;
        };
        let path = join(prefix, n);
        let Some(st) = stat_at(fd, &name).map_err(|e| at_path(&path, e))? else {
            continue; // gone since the readdir
        };
        let kind = kind_of(&st);
        let mut entry = Entry {
            path,
            kind,
            ino: st.st_ino,
            // Wrapping, like the host's release build: no panic on a clock set far ahead.
            ctime_ns: st.st_ctime.wrapping_mul(1_000_000_000).wrapping_add(st.st_ctime_nsec),
            size: if kind == Kind::File { st.st_size.max(0) as u64 } else { 0 },
            opaque: false,
        };
        if kind != Kind::Dir {
            out.push(entry);
            continue;
        }
        let sub = match open_at(fd, &name, dir_flags()) {
            Ok(sub) => sub,
            Err(Errno::ENOENT) => continue, // gone since the stat
            Err(e) => return Err(at_path(&entry.path, e)),
        };
        entry.opaque = is_opaque(sub.as_raw_fd());
        let path = entry.path.clone();
        out.push(entry);
        scan_dir(&sub, &path, depth + 1, out)?;
    }
    Ok(())
}

/// Refuses an item path that is not relative and clean (it comes from the host
/// and must not walk outside the layer).
fn check_path(path: &str) -> io::Result<()> {
    let clean = path.split('/').all(|c| !c.is_empty() && c != "." && c != ".." && !c.contains('\0'));
    if !clean {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{path:?}: not a relative path of non-empty components other than . and .."),
        ));
    }
    if path.split('/').count() > MAX_DEPTH + 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{path:?}: directories nested deeper than {MAX_DEPTH}"),
        ));
    }
    Ok(())
}

/// A directory open on the way from the root to the current item's parent.
struct OpenDir {
    name: String,
    path: String,
    fd: OwnedFd,
    st: libc::stat,
}

/// The directories from the root to the last parent walked to, kept open: items
/// come in path order, so siblings share one walk.
struct Walk<'a> {
    root: BorrowedFd<'a>,
    open: Vec<OpenDir>,
}

impl Walk<'_> {
    /// Walks to `parent` ("" for the root) without following symlinks; false
    /// when a component is missing or not a directory.
    fn to(&mut self, parent: &str) -> io::Result<bool> {
        let comps: Vec<&str> = if parent.is_empty() { Vec::new() } else { parent.split('/').collect() };
        let keep = self.open.iter().zip(&comps).take_while(|(o, c)| o.name == **c).count();
        self.open.truncate(keep);
        for c in &comps[keep..] {
            let path = join(self.open.last().map_or("", |o| o.path.as_str()), c);
            let name = CString::new(*c).map_err(|e| at_path(&path, io::Error::new(io::ErrorKind::InvalidInput, e)))?;
            let fd = match open_at(self.dir(), &name, dir_flags()) {
                Ok(fd) => fd,
                Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => return Ok(false),
                Err(e) => return Err(at_path(&path, e)),
            };
            let st = nix::sys::stat::fstat(fd.as_raw_fd()).map_err(|e| at_path(&path, e))?;
            self.open.push(OpenDir { name: c.to_string(), path, fd, st });
        }
        Ok(true)
    }

    /// The directory walked to last.
    fn dir(&self) -> RawFd {
        self.open.last().map_or(self.root.as_raw_fd(), |o| o.fd.as_raw_fd())
    }
}

/// Writes `items` (any order; sorted here by path, duplicates once) as an OCI layer tar to `out`, then the tar end marker.
///
/// Each item comes after its parent directories (each written once per
/// archive); an item whose parent is missing or not a directory is left out,
/// as is one that is missing now (unless `deleted`), a socket, or a device
/// other than a whiteout. A path listed twice counts as deleted when either
/// listing says so. Every path is checked before anything is written.
pub fn write_tar(root: BorrowedFd<'_>, items: &[Item], out: impl Write) -> io::Result<()> {
    for item in items {
        check_path(&item.path)?;
    }
    let mut sorted: Vec<&Item> = items.iter().collect();
    sorted.sort_by(|a, b| a.path.cmp(&b.path).then(b.deleted.cmp(&a.deleted)));
    sorted.dedup_by(|later, first| later.path == first.path);

    let mut b = tar::Builder::new(out);
    let mut walk = Walk { root, open: Vec::new() };
    let mut emitted: BTreeSet<String> = BTreeSet::new();
    for item in sorted {
        let path = item.path.as_str();
        let (parent, name) = path.rsplit_once('/').unwrap_or(("", path));
        if !walk.to(parent)? {
            continue;
        }
        for o in &walk.open {
            if !emitted.contains(&o.path) {
                let mut h = header(&o.st, tar::EntryType::Directory, 0);
                b.append_data(&mut h, format!("{}/", o.path), io::empty()).map_err(|e| at_path(&o.path, e))?;
                emitted.insert(o.path.clone());
            }
        }
        let wh = join(parent, &format!(".wh.{name}"));
        if item.deleted {
            append_empty(&mut b, &wh)?;
            continue;
        }
        let dir = walk.dir();
        let cname = CString::new(name).map_err(|e| at_path(path, io::Error::new(io::ErrorKind::InvalidInput, e)))?;
        let Some(st) = stat_at(dir, &cname).map_err(|e| at_path(path, e))? else {
            continue; // missing: nothing to carry
        };
        match kind_of(&st) {
            Kind::Whiteout => append_empty(&mut b, &wh)?,
            Kind::Dir => {
                let fd = match open_at(dir, &cname, dir_flags()) {
                    Ok(fd) => fd,
                    Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP) => continue, // changed since the stat
                    Err(e) => return Err(at_path(path, e)),
                };
                let st = nix::sys::stat::fstat(fd.as_raw_fd()).map_err(|e| at_path(path, e))?;
                if emitted.insert(path.to_string()) {
                    let mut h = header(&st, tar::EntryType::Directory, 0);
                    b.append_data(&mut h, format!("{path}/"), io::empty()).map_err(|e| at_path(path, e))?;
                }
                if is_opaque(fd.as_raw_fd()) {
                    append_empty(&mut b, &format!("{path}/.wh..wh..opq"))?;
                }
            }
            Kind::File => {
                // O_NONBLOCK and O_NOCTTY: a fifo or device swapped in since the
                // stat opens without blocking or side effects (and is skipped below).
                let flags =
                    OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK | OFlag::O_NOCTTY;
                let f = match open_at(dir, &cname, flags) {
                    Ok(fd) => File::from(fd),
                    Err(Errno::ENOENT) => continue,
                    Err(e) => return Err(at_path(path, e)),
                };
                let st = nix::sys::stat::fstat(f.as_raw_fd()).map_err(|e| at_path(path, e))?;
                if file_type(&st) != libc::S_IFREG {
                    continue;
                }
                let size = st.st_size.max(0) as u64;
                let mut h = header(&st, tar::EntryType::Regular, size);
                // Exactly the size in the header: a file that grew is cut there,
                // one that shrank is padded with zeros, so the archive stays
                // well-formed. A large buffer: tar copies in 8 KiB steps otherwise.
                let data = io::BufReader::with_capacity(1 << 20, f).take(size).chain(io::repeat(0)).take(size);
                b.append_data(&mut h, path, data).map_err(|e| at_path(path, e))?;
            }
            Kind::Symlink => {
                let target = match nix::fcntl::readlinkat(Some(dir), cname.as_c_str()) {
                    Ok(t) => t,
                    Err(Errno::ENOENT) => continue,
                    Err(e) => return Err(at_path(path, e)),
                };
                let mut h = header(&st, tar::EntryType::Symlink, 0);
                b.append_link(&mut h, path, Path::new(&target)).map_err(|e| at_path(path, e))?;
            }
            Kind::Other if file_type(&st) == libc::S_IFIFO => {
                let mut h = header(&st, tar::EntryType::Fifo, 0);
                b.append_data(&mut h, path, io::empty()).map_err(|e| at_path(path, e))?;
            }
            Kind::Other => {} // sockets and devices are not carried
        }
    }
    let mut out = b.into_inner().map_err(|e| at_path("", e))?;
    out.flush().map_err(|e| at_path("", e))
}

/// A header of the entry `st` (changes.rs conventions).
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

/// An empty regular file `path` (a whiteout marker), owned by root, mode 0644, mtime 0.
fn append_empty<W: Write>(b: &mut tar::Builder<W>, path: &str) -> io::Result<()> {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_size(0);
    b.append_data(&mut h, path, io::empty()).map_err(|e| at_path(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::fd::AsFd;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
    use std::os::unix::net::UnixListener;

    use nix::sys::stat::{mknod, SFlag};

    /// Whether this runs as root; prints why `what` is skipped when not.
    fn root_for(what: &str) -> bool {
        let root = nix::unistd::geteuid().is_root();
        if !root {
            println!("skipped: {what}: needs root");
        }
        root
    }

    fn char_dev(p: &Path, dev: libc::dev_t) {
        mknod(p, SFlag::S_IFCHR, Mode::from_bits_truncate(0o600), dev).unwrap();
    }

    fn set_opaque(p: &Path, value: &[u8]) {
        let c = CString::new(p.as_os_str().as_bytes()).unwrap();
        // SAFETY: valid NUL-terminated strings; `value` is readable for its length.
        let r = unsafe { libc::setxattr(c.as_ptr(), OPAQUE_XATTR.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
        assert_eq!(r, 0, "setxattr {}: {}", p.display(), io::Error::last_os_error());
    }

    fn mode(p: &Path, m: u32) {
        fs::set_permissions(p, fs::Permissions::from_mode(m)).unwrap();
    }

    fn item(p: &str) -> Item {
        Item { path: p.into(), deleted: false }
    }

    fn deleted(p: &str) -> Item {
        Item { path: p.into(), deleted: true }
    }

    fn scan_path(root: &Path) -> io::Result<Vec<Entry>> {
        scan(File::open(root).unwrap().as_fd())
    }

    fn tar_of(root: &Path, items: &[Item]) -> Vec<u8> {
        let mut out = Vec::new();
        write_tar(File::open(root).unwrap().as_fd(), items, &mut out).unwrap();
        out
    }

    /// One entry read back from a tar.
    #[derive(Debug)]
    struct Got {
        name: String,
        kind: tar::EntryType,
        mode: u32,
        uid: u64,
        gid: u64,
        mtime: u64,
        size: u64,
        link: Option<String>,
        data: Vec<u8>,
    }

    fn read_tar(bytes: &[u8]) -> Vec<Got> {
        let mut a = tar::Archive::new(bytes);
        a.entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let h = e.header().clone();
                let name = e.path().unwrap().display().to_string();
                let link = e.link_name().unwrap().map(|l| l.display().to_string());
                let mut data = Vec::new();
                e.read_to_end(&mut data).unwrap();
                Got {
                    name,
                    kind: h.entry_type(),
                    mode: h.mode().unwrap(),
                    uid: h.uid().unwrap(),
                    gid: h.gid().unwrap(),
                    mtime: h.mtime().unwrap(),
                    size: h.size().unwrap(),
                    link,
                    data,
                }
            })
            .collect()
    }

    fn names(got: &[Got]) -> Vec<&str> {
        got.iter().map(|g| g.name.as_str()).collect()
    }

    fn find<'a>(got: &'a [Got], name: &str) -> &'a Got {
        got.iter().find(|g| g.name == name).unwrap_or_else(|| panic!("{name} in {:?}", names(got)))
    }

    fn assert_whiteout_marker(g: &Got) {
        assert_eq!(
            (g.kind, g.mode, g.uid, g.gid, g.mtime, g.size),
            (tar::EntryType::Regular, 0o644, 0, 0, 0, 0),
            "{}",
            g.name
        );
    }

    #[test]
    fn scan_lists_every_entry_in_path_order_without_following_symlinks() {
        let t = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("secret"), "host data").unwrap();
        let r = t.path();
        fs::create_dir_all(r.join("a/b/d")).unwrap();
        fs::write(r.join("a/b/c.txt"), "hello").unwrap();
        fs::write(r.join("a.txt"), "abc").unwrap();
        symlink("a", r.join("link")).unwrap();
        symlink(outside.path(), r.join("out")).unwrap();
        nix::unistd::mkfifo(&r.join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        fs::create_dir(r.join("z")).unwrap();

        let root = File::open(r).unwrap();
        let entries = scan(root.as_fd()).unwrap();
        let paths: Vec<&str> = entries.iter().map(|e| e.path.as_str()).collect();
        // Byte order of the whole path: "a.txt" ('.' is 0x2e) before "a/b" ('/' is 0x2f).
        assert_eq!(paths, ["a", "a.txt", "a/b", "a/b/c.txt", "a/b/d", "fifo", "link", "out", "z"]);
        let kinds: Vec<(Kind, u64)> = entries.iter().map(|e| (e.kind, e.size)).collect();
        assert_eq!(
            kinds,
            [
                (Kind::Dir, 0),
                (Kind::File, 3),
                (Kind::Dir, 0),
                (Kind::File, 5),
                (Kind::Dir, 0),
                (Kind::Other, 0),
                (Kind::Symlink, 0),
                (Kind::Symlink, 0),
                (Kind::Dir, 0)
            ]
        );
        for e in &entries {
            let md = fs::symlink_metadata(r.join(&e.path)).unwrap();
            assert_eq!(e.ino, md.ino(), "{}", e.path);
            assert_eq!(e.ctime_ns, md.ctime() * 1_000_000_000 + md.ctime_nsec(), "{}", e.path);
            assert!(!e.opaque, "{}", e.path);
        }
        // The caller's descriptor is not consumed: a second scan through it sees the same.
        assert_eq!(scan(root.as_fd()).unwrap(), entries);

        // The wire form the host parses.
        let v = serde_json::to_value(&entries[3]).unwrap();
        assert_eq!(v["kind"], "file");
        assert_eq!(v["path"], "a/b/c.txt");
        let e: Entry = serde_json::from_str(r#"{"path":"x","kind":"whiteout","ino":1,"ctime_ns":2,"size":0}"#).unwrap();
        assert_eq!((e.kind, e.opaque), (Kind::Whiteout, false));
        let i: Item = serde_json::from_str(r#"{"path":"x"}"#).unwrap();
        assert_eq!(i, item("x"));

        let empty = tempfile::tempdir().unwrap();
        assert_eq!(scan_path(empty.path()).unwrap(), []);
    }

    /// A tree with a whiteout (`etc/gone`), a device (`null`) and an opaque directory (`old`).
    fn special_tree() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        fs::create_dir_all(r.join("etc")).unwrap();
        char_dev(&r.join("etc/gone"), 0);
        char_dev(&r.join("null"), nix::sys::stat::makedev(1, 3));
        fs::create_dir(r.join("old")).unwrap();
        set_opaque(&r.join("old"), b"y");
        t
    }

    #[test]
    fn scan_reports_whiteouts_opaque_dirs_and_devices() {
        if !root_for("whiteouts, devices and trusted.overlay.opaque in scan") {
            return;
        }
        let t = special_tree();
        let r = t.path();
        fs::create_dir(r.join("plain")).unwrap();
        set_opaque(&r.join("plain"), b"yes");
        let got: Vec<(String, Kind, bool)> =
            scan_path(r).unwrap().into_iter().map(|e| (e.path, e.kind, e.opaque)).collect();
        assert_eq!(
            got,
            [
                ("etc".into(), Kind::Dir, false),
                ("etc/gone".into(), Kind::Whiteout, false),
                ("null".into(), Kind::Other, false),
                ("old".into(), Kind::Dir, true),
                ("plain".into(), Kind::Dir, false),
            ]
        );
    }

    #[test]
    fn scan_passes_over_non_utf8_names_and_refuses_too_deep_trees() {
        let t = tempfile::tempdir().unwrap();
        fs::create_dir(t.path().join("sub")).unwrap();
        let bad = std::ffi::OsStr::from_bytes(b"bad\xffname");
        fs::write(t.path().join("sub").join(bad), "x").unwrap();
        let names: Vec<String> = scan_path(t.path()).unwrap().into_iter().map(|e| e.path).collect();
        assert_eq!(names, ["sub"], "as the host's walk, names that are not UTF-8 are not carried");

        let t = tempfile::tempdir().unwrap();
        let deepest = t.path().join(["d"; MAX_DEPTH].join("/"));
        fs::create_dir_all(&deepest).unwrap();
        assert_eq!(scan_path(t.path()).unwrap().len(), MAX_DEPTH);
        fs::create_dir(deepest.join("d")).unwrap();
        let e = scan_path(t.path()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    }

    #[test]
    fn write_tar_writes_items_after_their_parents_without_following_symlinks() {
        let t = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("secret.txt"), "host data").unwrap();
        let r = t.path();
        fs::create_dir_all(r.join("app/src")).unwrap();
        fs::create_dir_all(r.join("etc")).unwrap();
        fs::write(r.join("app/src/main.py"), "print(1)\n").unwrap();
        fs::write(r.join("etc/passwd"), "root:x:0:0\n").unwrap();
        fs::write(r.join("etc/hosts"), "127.0.0.1 localhost\n").unwrap();
        mode(&r.join("etc/passwd"), 0o640);
        mode(&r.join("app/src"), 0o750);
        symlink(outside.path(), r.join("app/link")).unwrap();
        let long_target = "t".repeat(200);
        symlink(&long_target, r.join("app/longlink")).unwrap();
        nix::unistd::mkfifo(&r.join("app/fifo"), Mode::from_bits_truncate(0o640)).unwrap();
        let long_name = format!("long/{}.txt", "n".repeat(150));
        fs::create_dir(r.join("long")).unwrap();
        fs::write(r.join(&long_name), "long").unwrap();
        drop(UnixListener::bind(r.join("sock")).unwrap());

        let items = vec![
            item("etc/passwd"),
            item("app/src/main.py"),
            item("etc/hosts"),
            item("app/link"),
            item("app/link/secret.txt"), // parent is a symlink: skipped
            item("etc/passwd"),          // listed twice: written once
            deleted("gone.txt"),
            deleted("etc/old"),
            item("missing"),      // not there, not deleted: skipped
            deleted("nodir/x"),   // parent missing: skipped
            item("etc/passwd/x"), // parent not a directory: skipped
            item("sock"),         // sockets are not carried
            item("app/fifo"),
            item("app/longlink"),
            item(&long_name),
            item("app"),
        ];
        let bytes = tar_of(r, &items);
        let got = read_tar(&bytes);
        assert_eq!(
            names(&got),
            [
                "app/",
                "app/fifo",
                "app/link",
                "app/longlink",
                "app/src/",
                "app/src/main.py",
                "etc/",
                "etc/hosts",
                "etc/.wh.old",
                "etc/passwd",
                ".wh.gone.txt",
                "long/",
                long_name.as_str(),
            ]
        );
        let uid = nix::unistd::geteuid().as_raw() as u64;
        let passwd = find(&got, "etc/passwd");
        let md = fs::metadata(r.join("etc/passwd")).unwrap();
        assert_eq!(
            (passwd.kind, passwd.mode, passwd.uid, passwd.gid, passwd.mtime, passwd.size, &passwd.data[..]),
            (tar::EntryType::Regular, 0o640, uid, md.gid() as u64, md.mtime() as u64, 11, &b"root:x:0:0\n"[..])
        );
        assert_eq!(find(&got, "app/src/main.py").data, b"print(1)\n");
        assert_eq!(find(&got, long_name.as_str()).data, b"long");
        let src = find(&got, "app/src/");
        assert_eq!((src.kind, src.mode, src.size), (tar::EntryType::Directory, 0o750, 0));
        let link = find(&got, "app/link");
        assert_eq!(link.kind, tar::EntryType::Symlink);
        assert_eq!(link.link.as_deref(), Some(outside.path().to_str().unwrap()));
        assert!(!got.iter().any(|g| g.name.contains("secret") || g.data == b"host data"));
        assert_eq!(find(&got, "app/longlink").link.as_deref(), Some(long_target.as_str()));
        assert_eq!(find(&got, "app/fifo").kind, tar::EntryType::Fifo);
        assert_whiteout_marker(find(&got, "etc/.wh.old"));
        assert_whiteout_marker(find(&got, ".wh.gone.txt"));

        // Ends with the end marker; the same tree and items (in any order) give the same bytes.
        assert_eq!(bytes.len() % 512, 0);
        assert!(bytes[bytes.len() - 1024..].iter().all(|&b| b == 0));
        let mut reversed = items.clone();
        reversed.reverse();
        assert_eq!(tar_of(r, &reversed), bytes);
        assert_eq!(tar_of(r, &[]).len(), 1024, "no items: only the end marker");

        // Deleted wins over a listing of the same path as present.
        let got = read_tar(&tar_of(r, &[item("etc/hosts"), deleted("etc/hosts")]));
        assert_eq!(names(&got), ["etc/", "etc/.wh.hosts"]);
    }

    #[test]
    fn write_tar_translates_whiteouts_and_opaque_dirs() {
        if !root_for("whiteouts, devices and trusted.overlay.opaque in write_tar") {
            return;
        }
        let t = special_tree();
        let r = t.path();
        fs::write(r.join("old/new.txt"), "new").unwrap();
        fs::create_dir(r.join("plain")).unwrap();
        let items = [item("plain"), item("old/new.txt"), item("null"), item("old"), item("etc/gone")];
        let got = read_tar(&tar_of(r, &items));
        assert_eq!(names(&got), ["etc/", "etc/.wh.gone", "old/", "old/.wh..wh..opq", "old/new.txt", "plain/"]);
        assert_whiteout_marker(find(&got, "etc/.wh.gone"));
        assert_whiteout_marker(find(&got, "old/.wh..wh..opq"));
        assert_eq!(find(&got, "old/").kind, tar::EntryType::Directory);
    }

    #[test]
    fn write_tar_rejects_unclean_item_paths_before_writing() {
        let t = tempfile::tempdir().unwrap();
        fs::write(t.path().join("ok"), "x").unwrap();
        let too_deep = format!("{}x", "a/".repeat(MAX_DEPTH + 1));
        for bad in ["../x", "a/../../b", "/abs", "a//b", ".", "", "a/", "a/./b", "..", "a\0b", too_deep.as_str()] {
            let mut out = Vec::new();
            let e =
                write_tar(File::open(t.path()).unwrap().as_fd(), &[item("ok"), deleted(bad)], &mut out).expect_err(bad);
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad:?}: {e}");
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
            assert!(out.is_empty(), "{bad:?}: nothing written");
        }
    }
}
