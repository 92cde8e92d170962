//! End-to-end tests: archives are built in-test with the `tar` crate.

use std::ffi::CString;
use std::fs::{self, File};
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use flate2::write::GzEncoder;
use strata_api::ImageConfig;
use strata_store::LayerStore;
use tempfile::TempDir;

use crate::hash::sha256_digest;
use crate::*;

const MTIME: u64 = 1_600_000_000;

fn need_root() -> bool {
    if sys::is_root() {
        true
    } else {
        eprintln!("skipped: needs root for mknod/lchown");
        false
    }
}

fn new_store() -> (TempDir, LayerStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = LayerStore::open(dir.path().join("layers")).unwrap();
    (dir, store)
}

fn assert_store_empty(store: &LayerStore) {
    assert_eq!(store.list().unwrap(), Vec::<String>::new(), "store not empty");
    let staging: Vec<_> = fs::read_dir(store.root().join("staging")).unwrap().collect();
    assert!(staging.is_empty(), "staging not empty: {staging:?}");
    let sha: Vec<_> = fs::read_dir(store.root().join("sha256")).unwrap().collect();
    assert!(sha.is_empty(), "sha256/ not empty: {sha:?}");
}

fn opts() -> ImportOptions {
    ImportOptions::default()
}

fn run_import(src: &Path, store: &LayerStore, opts: &ImportOptions) -> Result<Imported, ImageError> {
    import(src, store, opts, &mut |_| {})
}

/// Builds tar archives, including hostile ones: names and link names are
/// written into the header verbatim, bypassing the `tar` crate's checks.
struct Tar {
    b: tar::Builder<Vec<u8>>,
    pax: Vec<(String, Vec<u8>)>,
}

impl Tar {
    fn new() -> Self {
        Tar { b: tar::Builder::new(Vec::new()), pax: Vec::new() }
    }

    fn raw(
        &mut self,
        kind: tar::EntryType,
        name: &str,
        link: Option<&str>,
        mode: u32,
        uid: u64,
        data: &[u8],
    ) -> &mut Self {
        if !self.pax.is_empty() {
            let pax = std::mem::take(&mut self.pax);
            self.b.append_pax_extensions(pax.iter().map(|(k, v)| (k.as_str(), v.as_slice()))).unwrap();
        }
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(uid);
        h.set_gid(uid);
        h.set_mtime(MTIME);
        h.set_size(data.len() as u64);
        let bytes = h.as_mut_bytes();
        assert!(name.len() <= 100);
        bytes[..name.len()].copy_from_slice(name.as_bytes());
        if let Some(link) = link {
            bytes[157..157 + link.len()].copy_from_slice(link.as_bytes());
        }
        h.set_cksum();
        self.b.append(&h, data).unwrap();
        self
    }

    fn dir(&mut self, name: &str, mode: u32) -> &mut Self {
        self.raw(tar::EntryType::Directory, name, None, mode, 0, b"")
    }

    fn file(&mut self, name: &str, mode: u32, data: &[u8]) -> &mut Self {
        self.raw(tar::EntryType::Regular, name, None, mode, 0, data)
    }

    fn symlink(&mut self, name: &str, target: &str) -> &mut Self {
        self.raw(tar::EntryType::Symlink, name, Some(target), 0o777, 0, b"")
    }

    fn hardlink(&mut self, name: &str, target: &str) -> &mut Self {
        self.raw(tar::EntryType::Link, name, Some(target), 0o644, 0, b"")
    }

    fn xattr(&mut self, name: &str, value: &[u8]) -> &mut Self {
        self.pax.push((format!("SCHILY.xattr.{name}"), value.to_vec()));
        self
    }

    fn bytes(&mut self) -> Vec<u8> {
        let b = std::mem::replace(&mut self.b, tar::Builder::new(Vec::new()));
        b.into_inner().unwrap()
    }
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(data).unwrap();
    gz.finish().unwrap()
}

fn write(dir: &Path, name: &str, data: &[u8]) -> PathBuf {
    let p = dir.join(name);
    fs::write(&p, data).unwrap();
    p
}

fn sample_rootfs() -> Vec<u8> {
    Tar::new()
        .dir("./", 0o755)
        .dir("./bin/", 0o755)
        .file("./bin/tool", 0o755, b"#!/bin/sh\necho hi\n")
        .symlink("./bin/sh", "/bin/tool")
        .hardlink("./bin/tool2", "bin/tool")
        .dir("./home/", 0o755)
        .raw(tar::EntryType::Directory, "./home/user/", None, 0o700, 1000, b"")
        .raw(tar::EntryType::Regular, "./home/user/notes", None, 0o600, 1000, b"secret")
        .raw(tar::EntryType::Fifo, "./run.fifo", None, 0o644, 0, b"")
        .bytes()
}

// --- rootfs tarballs -------------------------------------------------------------

#[test]
fn rootfs_tar_imports_with_metadata() {
    if !need_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = sample_rootfs();
    let src = write(tmp.path(), "rootfs.tar", &data);
    let (_d, store) = new_store();
    let mut events = Vec::new();
    let imported = import(&src, &store, &opts(), &mut |p| events.push(format!("{p:?}"))).unwrap();

    assert_eq!(imported.kind, SourceKind::RootfsTar);
    assert_eq!(imported.layers.len(), 1);
    let layer = &imported.layers[0];
    assert_eq!(layer.digest, sha256_digest(&data), "digest is the sha256 of the tar");
    assert!(layer.new);
    assert_eq!(layer.size, 18 + 6);
    assert_eq!(imported.bytes_stored, layer.size);
    assert_eq!(imported.config.env, vec![config::DEFAULT_PATH_ENV.to_string()]);
    assert!(imported.warnings.is_empty(), "{:?}", imported.warnings);
    assert!(events.iter().any(|e| e.starts_with("Layer")));
    assert!(events.last().unwrap().contains(&format!("done: {}", data.len())), "{events:?}");

    let fs_dir = store.fs_dir(&layer.key).unwrap();
    let tool = fs::symlink_metadata(fs_dir.join("bin/tool")).unwrap();
    assert_eq!(tool.permissions().mode() & 0o7777, 0o755);
    assert_eq!(tool.mtime() as u64, MTIME);
    assert_eq!(fs::read(fs_dir.join("bin/tool")).unwrap(), b"#!/bin/sh\necho hi\n");
    assert_eq!(fs::read_link(fs_dir.join("bin/sh")).unwrap(), Path::new("/bin/tool"));
    assert_eq!(fs::symlink_metadata(fs_dir.join("bin/sh")).unwrap().mtime() as u64, MTIME);
    assert_eq!(fs::symlink_metadata(fs_dir.join("bin/tool2")).unwrap().ino(), tool.ino());
    let home = fs::symlink_metadata(fs_dir.join("home/user")).unwrap();
    assert_eq!((home.uid(), home.gid(), home.permissions().mode() & 0o7777), (1000, 1000, 0o700));
    assert_eq!(home.mtime() as u64, MTIME, "directory mtime survives adding children");
    assert_eq!(fs::symlink_metadata(fs_dir.join("home/user/notes")).unwrap().uid(), 1000);
    assert!(fs::symlink_metadata(fs_dir.join("run.fifo")).unwrap().file_type().is_fifo());
    assert_eq!(fs::symlink_metadata(&fs_dir).unwrap().mtime() as u64, MTIME, "root dir metadata from ./");
    assert_eq!(store.meta(&layer.key).unwrap().size, layer.size);
}

#[test]
fn gzip_rootfs_has_the_same_digest_and_reimport_is_deduplicated() {
    if !need_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = sample_rootfs();
    let plain = write(tmp.path(), "rootfs.tar", &data);
    let gz = write(tmp.path(), "rootfs.bin", &gzip(&data)); // no telling extension
    let (_d, store) = new_store();

    assert_eq!(detect(&gz).unwrap(), SourceKind::RootfsTar);
    let first = run_import(&gz, &store, &opts()).unwrap();
    assert_eq!(first.layers[0].digest, sha256_digest(&data), "diff id of the uncompressed tar");
    assert!(first.layers[0].new);
    assert!(first.bytes_stored > 0);

    for src in [&gz, &plain] {
        let again = run_import(src, &store, &opts()).unwrap();
        assert_eq!(again.layers[0].digest, first.layers[0].digest);
        assert!(!again.layers[0].new);
        assert_eq!(again.bytes_stored, 0);
    }
    assert_eq!(store.list().unwrap().len(), 1);
    assert!(fs::read_dir(store.root().join("staging")).unwrap().next().is_none());
}

#[test]
fn whiteouts_and_opaque_directories_become_overlay_markers() {
    if !need_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = Tar::new()
        .dir("etc/", 0o755)
        .file("etc/.wh.passwd", 0o644, b"")
        .dir("var/", 0o755)
        .file("var/.wh..wh..opq", 0o644, b"")
        .file("var/new", 0o644, b"x")
        .file(".wh.gone", 0o644, b"")
        .bytes();
    let src = write(tmp.path(), "layer.tar", &data);
    let (_d, store) = new_store();
    let imported = run_import(&src, &store, &opts()).unwrap();
    let fs_dir = store.fs_dir(&imported.layers[0].key).unwrap();

    for wh in ["etc/passwd", "gone"] {
        let md = fs::symlink_metadata(fs_dir.join(wh)).unwrap();
        assert!(md.file_type().is_char_device(), "{wh}");
        assert_eq!(md.rdev(), 0, "{wh} is device 0/0");
    }
    assert!(!fs_dir.join("etc/.wh.passwd").exists());
    assert!(!fs_dir.join("var/.wh..wh..opq").exists());
    let var = File::open(fs_dir.join("var")).unwrap();
    let opaque = sys::fgetxattr(var.as_fd(), &CString::new("trusted.overlay.opaque").unwrap()).unwrap();
    assert_eq!(opaque, b"y");
    assert!(fs_dir.join("var/new").is_file());
}

// --- hostile archives ------------------------------------------------------------

fn assert_rejected(data: Vec<u8>, entry: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let src = write(tmp.path(), "evil.tar", &data);
    let (_d, store) = new_store();
    let err = run_import(&src, &store, &opts()).expect_err(entry);
    let msg = err.to_string();
    assert!(msg.contains(entry), "error {msg:?} does not name {entry:?}");
    assert!(matches!(err, ImageError::InvalidEntry { .. }), "{err:?}");
    assert!(err.is_invalid_input());
    assert_store_empty(&store);
    // The escape targets were not touched.
    assert!(!tmp.path().join("escape").exists());
}

#[test]
fn path_escapes_are_rejected() {
    assert_rejected(Tar::new().file("ok", 0o644, b"1").file("../escape", 0o644, b"x").bytes(), "../escape");
    assert_rejected(Tar::new().file("/abs", 0o644, b"x").bytes(), "/abs");
    assert_rejected(Tar::new().file("a/../../escape", 0o644, b"x").bytes(), "a/../../escape");
    assert_rejected(Tar::new().dir("./../", 0o755).bytes(), "./../");
}

#[test]
fn symlink_parent_tricks_are_rejected() {
    // link -> /etc, then link/passwd: must not write /etc/passwd.
    assert_rejected(Tar::new().symlink("link", "/etc").file("link/passwd", 0o644, b"x").bytes(), "link/passwd");
    // A relative symlink to the parent directory.
    assert_rejected(
        Tar::new().dir("d/", 0o755).symlink("d/up", "..").file("d/up/escape", 0o644, b"x").bytes(),
        "d/up/escape",
    );
    // A symlink replacing a directory that later entries use.
    assert_rejected(Tar::new().dir("d/", 0o755).symlink("d", "/tmp").dir("d/sub/", 0o755).bytes(), "d/sub/");
    // ... right after a file was written into it (the unpacker keeps that directory open).
    assert_rejected(
        Tar::new().dir("d/", 0o755).file("d/x", 0o644, b"x").symlink("d", "/tmp").file("d/y", 0o644, b"y").bytes(),
        "d/y",
    );
    // A symlink as the parent of a whiteout or opaque marker.
    assert_rejected(Tar::new().symlink("l", "/etc").file("l/.wh.passwd", 0, b"").bytes(), "l/.wh.passwd");
    assert_rejected(Tar::new().symlink("l", "/etc").file("l/.wh..wh..opq", 0, b"").bytes(), "l/.wh..wh..opq");
}

#[test]
fn bad_hardlinks_are_rejected() {
    assert_rejected(Tar::new().hardlink("h", "/etc/passwd").bytes(), "h");
    assert_rejected(Tar::new().hardlink("h2", "../../etc/passwd").bytes(), "h2");
    // Through a symlinked directory.
    assert_rejected(Tar::new().symlink("l", "/etc").hardlink("hl", "l/passwd").bytes(), "hl");
    // To a symlink.
    assert_rejected(Tar::new().symlink("s", "/etc/passwd").hardlink("hs", "s").bytes(), "hs");
    // To nothing, to a directory, to itself.
    assert_rejected(Tar::new().hardlink("hn", "missing").bytes(), "hn");
    assert_rejected(Tar::new().dir("d/", 0o755).hardlink("hd", "d").bytes(), "hd");
    assert_rejected(Tar::new().file("f", 0o644, b"1").hardlink("f", "f").bytes(), "f");
}

#[test]
fn malformed_entries_are_rejected() {
    assert_rejected(Tar::new().file("x/.wh..wh.plnk", 0o644, b"").bytes(), ".wh..wh.plnk");
    assert_rejected(Tar::new().file(".wh..", 0o644, b"").bytes(), ".wh..");
    assert_rejected(Tar::new().symlink("empty-target", "").bytes(), "empty-target");
    assert_rejected(Tar::new().raw(tar::EntryType::new(b'V'), "volume", None, 0, 0, b"").bytes(), "volume");
    assert_rejected(
        Tar::new().raw(tar::EntryType::Regular, "big-uid", None, 0o644, u64::from(u32::MAX), b"").bytes(),
        "big-uid",
    );

    // Not a tar at all / truncated: rejected as corrupt, store untouched.
    let tmp = tempfile::tempdir().unwrap();
    let mut data = Tar::new().file("f", 0o644, &[7u8; 4000]).bytes();
    data.truncate(2048);
    let src = write(tmp.path(), "trunc.tar", &data);
    let (_d, store) = new_store();
    let err = run_import(&src, &store, &opts()).unwrap_err();
    assert!(err.is_invalid_input(), "{err:?}");
    assert_store_empty(&store);
}

#[test]
fn size_cap_is_enforced() {
    let tmp = tempfile::tempdir().unwrap();
    let src =
        write(tmp.path(), "big.tar", &Tar::new().file("a", 0o644, &[1u8; 600]).file("b", 0o644, &[2u8; 600]).bytes());
    let (_d, store) = new_store();
    let small = ImportOptions { max_unpacked_bytes: 1000, ..opts() };
    let err = run_import(&src, &store, &small).unwrap_err();
    assert!(matches!(err, ImageError::TooLarge { limit: 1000, .. }), "{err:?}");
    assert!(err.is_invalid_input());
    assert_store_empty(&store);

    // The cap covers the whole image: two layers of 600 bytes each fail, and
    // the first one, already committed, is removed again.
    let layout = tmp.path().join("two");
    let layers = vec![
        (Tar::new().file("a", 0o644, &[1u8; 600]).bytes(), true),
        (Tar::new().file("b", 0o644, &[2u8; 600]).bytes(), false),
    ];
    fabricate_oci(&layout, &layers, None);
    let err = run_import(&layout, &store, &small).unwrap_err();
    assert!(matches!(err, ImageError::TooLarge { limit: 1000, .. }), "{err:?}");
    assert!(err.to_string().contains("layer 2/2"), "{err}");
    assert_store_empty(&store);
    assert_eq!(
        run_import(&layout, &store, &ImportOptions { max_unpacked_bytes: 1200, ..opts() }).unwrap().layers.len(),
        2
    );
}

// --- safety adjustments ------------------------------------------------------------

#[test]
fn device_nodes_are_dropped_with_a_warning() {
    if !need_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = Tar::new()
        .dir("dev/", 0o755)
        .raw(tar::EntryType::Char, "dev/mem", None, 0o600, 0, b"")
        .raw(tar::EntryType::Block, "dev/sda", None, 0o600, 0, b"")
        .file("dev/keep", 0o644, b"k")
        .bytes();
    let src = write(tmp.path(), "dev.tar", &data);
    let (_d, store) = new_store();
    let imported = run_import(&src, &store, &opts()).unwrap();
    let fs_dir = store.fs_dir(&imported.layers[0].key).unwrap();
    assert!(fs::symlink_metadata(fs_dir.join("dev/mem")).is_err());
    assert!(fs::symlink_metadata(fs_dir.join("dev/sda")).is_err());
    assert!(fs_dir.join("dev/keep").is_file());
    for name in ["dev/mem", "dev/sda"] {
        assert!(imported.warnings.iter().any(|w| w.contains(name) && w.contains("device")), "{:?}", imported.warnings);
    }
}

#[test]
fn setuid_is_stripped_unless_trusted() {
    if !need_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = Tar::new()
        .file("su", 0o4755, b"suid")
        .file("sg", 0o2755, b"sgid")
        .raw(tar::EntryType::Directory, "shared/", None, 0o2775, 0, b"")
        .bytes();
    let src = write(tmp.path(), "suid.tar", &data);

    let (_d, store) = new_store();
    let imported = run_import(&src, &store, &opts()).unwrap();
    let fs_dir = store.fs_dir(&imported.layers[0].key).unwrap();
    let mode = |p: &str| fs::symlink_metadata(fs_dir.join(p)).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode("su"), 0o755);
    assert_eq!(mode("sg"), 0o755);
    assert_eq!(mode("shared"), 0o2775, "setgid directories are kept");
    assert!(imported.warnings.iter().any(|w| w.contains("setuid") && w.contains("2 file")), "{:?}", imported.warnings);

    let (_d2, store2) = new_store();
    let trusted = ImportOptions { trusted: true, ..opts() };
    let imported = run_import(&src, &store2, &trusted).unwrap();
    let fs_dir = store2.fs_dir(&imported.layers[0].key).unwrap();
    assert_eq!(fs::symlink_metadata(fs_dir.join("su")).unwrap().permissions().mode() & 0o7777, 0o4755);
    assert_eq!(fs::symlink_metadata(fs_dir.join("sg")).unwrap().permissions().mode() & 0o7777, 0o2755);
    assert!(imported.warnings.is_empty(), "{:?}", imported.warnings);
}

/// One store, the same bytes imported trusted then untrusted (and again):
/// each policy gets its own layer, an untrusted import never reuses the
/// trusted unpack (nor a legacy layer of unknown policy), and the other way round.
#[test]
fn the_same_bytes_unpack_once_per_policy() {
    if !need_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = Tar::new().file("su", 0o4755, b"suid").bytes();
    let src = write(tmp.path(), "suid.tar", &data);
    let (_d, store) = new_store();
    let trusted_opts = ImportOptions { trusted: true, ..opts() };
    let mode =
        |key: &str| fs::symlink_metadata(store.fs_dir(key).unwrap().join("su")).unwrap().permissions().mode() & 0o7777;

    let trusted = run_import(&src, &store, &trusted_opts).unwrap().layers.remove(0);
    let untrusted = run_import(&src, &store, &opts()).unwrap().layers.remove(0);
    assert!(trusted.new && untrusted.new, "the untrusted import unpacked again");
    assert_eq!(trusted.digest, untrusted.digest, "same diff id");
    assert_eq!(
        (trusted.key.clone(), untrusted.key.clone()),
        (format!("{}+trusted", trusted.digest), format!("{}+untrusted", trusted.digest))
    );
    assert_eq!((mode(&trusted.key), mode(&untrusted.key)), (0o4755, 0o755));
    // Again, each way: deduplicated within its policy only.
    assert!(!run_import(&src, &store, &opts()).unwrap().layers[0].new);
    assert!(!run_import(&src, &store, &trusted_opts).unwrap().layers[0].new);
    assert_eq!(store.list().unwrap().len(), 2);

    // A layer stored before policies were recorded (plain digest, no policy) is never reused.
    let (_d2, store2) = new_store();
    let legacy = store2.layer_dir(&trusted.digest).unwrap();
    fs::create_dir_all(legacy.join("fs")).unwrap();
    fs::write(legacy.join("fs/su"), b"suid").unwrap();
    fs::set_permissions(legacy.join("fs/su"), fs::Permissions::from_mode(0o4755)).unwrap();
    fs::write(legacy.join("layer.json"), format!(r#"{{"digest":"{}","size":4}}"#, trusted.digest)).unwrap();
    assert!(store2.contains(&trusted.digest));
    let fresh = run_import(&src, &store2, &opts()).unwrap().layers.remove(0);
    assert!(fresh.new, "an untrusted import does not reuse a layer of unknown policy");
    let fresh_mode =
        fs::symlink_metadata(store2.fs_dir(&fresh.key).unwrap().join("su")).unwrap().permissions().mode() & 0o7777;
    assert_eq!(fresh_mode, 0o755);
    assert!(run_import(&src, &store2, &trusted_opts).unwrap().layers[0].new, "nor a trusted one");
    assert!(store2.contains(&trusted.digest), "the legacy layer is left for what references it");
}

#[test]
fn only_allowed_xattrs_are_kept() {
    if !need_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // A valid v2 file capability: cap_net_raw (bit 13) permitted + effective.
    let mut cap = vec![0u8; 20];
    cap[..4].copy_from_slice(&0x0200_0001u32.to_le_bytes());
    cap[4..8].copy_from_slice(&(1u32 << 13).to_le_bytes());
    let data = Tar::new()
        .xattr("user.note", b"hello")
        .xattr("trusted.overlay.redirect", b"/etc")
        .xattr("security.capability", &cap)
        .file("ping", 0o755, b"bin")
        .bytes();
    let src = write(tmp.path(), "xattr.tar", &data);
    let name = |s: &str| CString::new(s).unwrap();

    let (_d, store) = new_store();
    let imported = run_import(&src, &store, &opts()).unwrap();
    let f = File::open(store.fs_dir(&imported.layers[0].key).unwrap().join("ping")).unwrap();
    assert_eq!(sys::fgetxattr(f.as_fd(), &name("user.note")).unwrap(), b"hello");
    assert!(sys::fgetxattr(f.as_fd(), &name("trusted.overlay.redirect")).is_err());
    assert!(sys::fgetxattr(f.as_fd(), &name("security.capability")).is_err());
    let w = imported.warnings.join("\n");
    assert!(w.contains("trusted.overlay.redirect") && w.contains("security.capability"), "{w}");

    let (_d2, store2) = new_store();
    let imported = run_import(&src, &store2, &ImportOptions { trusted: true, ..opts() }).unwrap();
    let f = File::open(store2.fs_dir(&imported.layers[0].key).unwrap().join("ping")).unwrap();
    assert_eq!(sys::fgetxattr(f.as_fd(), &name("security.capability")).unwrap(), cap);
    assert!(sys::fgetxattr(f.as_fd(), &name("trusted.overlay.redirect")).is_err());
}

#[test]
fn later_entries_replace_earlier_ones() {
    if !need_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = Tar::new()
        .file("a", 0o644, b"file first")
        .dir("a/", 0o750)
        .file("a/b", 0o644, b"b")
        .dir("a/", 0o755) // metadata update only: a/b stays
        .dir("d/", 0o755)
        .file("d/child", 0o644, b"c")
        .file("d", 0o600, b"now a file")
        .file("s", 0o644, b"old")
        .symlink("s", "target")
        .bytes();
    let src = write(tmp.path(), "replace.tar", &data);
    let (_d, store) = new_store();
    let imported = run_import(&src, &store, &opts()).unwrap();
    let fs_dir = store.fs_dir(&imported.layers[0].key).unwrap();
    assert_eq!(fs::read(fs_dir.join("a/b")).unwrap(), b"b");
    assert_eq!(fs::symlink_metadata(fs_dir.join("a")).unwrap().permissions().mode() & 0o7777, 0o755);
    assert_eq!(fs::read(fs_dir.join("d")).unwrap(), b"now a file");
    assert_eq!(fs::read_link(fs_dir.join("s")).unwrap(), Path::new("target"));
}

#[test]
fn unpack_layer_reports_progress_on_a_plain_reader() {
    if !need_root() {
        return;
    }
    let (_d, store) = new_store();
    let data = gzip(&Tar::new().file("f", 0o644, &vec![3u8; 3 << 20]).bytes());
    let mut warnings = Vec::new();
    let mut done = Vec::new();
    let layer = unpack_layer(&data[..], &store, &opts(), &mut warnings, &mut |p| {
        if let Progress::Bytes { done: d, total } = p {
            assert_eq!(total, None);
            done.push(d);
        }
    })
    .unwrap();
    assert!(layer.new);
    assert_eq!(layer.size, 3 << 20);
    assert_eq!(*done.last().unwrap(), data.len() as u64);
    assert!(done.windows(2).all(|w| w[0] <= w[1]));
    assert!(store.contains(&layer.key));
}

// --- OCI layouts -------------------------------------------------------------------

struct Blob {
    digest: String,
    size: u64,
}

fn put_blob(layout: &Path, bytes: &[u8]) -> Blob {
    let digest = sha256_digest(bytes);
    let dir = layout.join("blobs/sha256");
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join(digest.trim_start_matches("sha256:")), bytes).unwrap();
    Blob { digest, size: bytes.len() as u64 }
}

fn desc(media_type: &str, b: &Blob) -> serde_json::Value {
    serde_json::json!({ "mediaType": media_type, "digest": b.digest, "size": b.size })
}

/// Writes an OCI layout by hand: each layer is (tar bytes, gzip?), returns the diff ids.
fn fabricate_oci(layout: &Path, layers: &[(Vec<u8>, bool)], layer_media_type: Option<&str>) -> Vec<String> {
    fs::create_dir_all(layout).unwrap();
    let mut descs = Vec::new();
    let mut diff_ids = Vec::new();
    for (tar, gz) in layers {
        diff_ids.push(sha256_digest(tar));
        let (bytes, mt) = if *gz {
            (gzip(tar), "application/vnd.oci.image.layer.v1.tar+gzip")
        } else {
            (tar.clone(), "application/vnd.oci.image.layer.v1.tar")
        };
        descs.push(desc(layer_media_type.unwrap_or(mt), &put_blob(layout, &bytes)));
    }
    let config = serde_json::json!({
        "architecture": oci_spec::image::Arch::default().to_string(),
        "os": "linux",
        "config": {
            "Env": ["PATH=/usr/bin:/bin", "LANG=C.UTF-8"],
            "Entrypoint": ["/bin/entry"],
            "Cmd": ["--serve"],
            "WorkingDir": "/srv",
            "User": "1000:1000"
        },
        "rootfs": { "type": "layers", "diff_ids": diff_ids },
        "history": []
    });
    let config = put_blob(layout, config.to_string().as_bytes());
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": desc("application/vnd.oci.image.config.v1+json", &config),
        "layers": descs
    });
    let manifest = put_blob(layout, manifest.to_string().as_bytes());
    let mut mdesc = desc("application/vnd.oci.image.manifest.v1+json", &manifest);
    mdesc["platform"] =
        serde_json::json!({ "architecture": oci_spec::image::Arch::default().to_string(), "os": "linux" });
    let index = serde_json::json!({ "schemaVersion": 2, "manifests": [mdesc] });
    fs::write(layout.join("index.json"), index.to_string()).unwrap();
    fs::write(layout.join("oci-layout"), r#"{"imageLayoutVersion": "1.0.0"}"#).unwrap();
    diff_ids
}

fn two_layers() -> Vec<(Vec<u8>, bool)> {
    vec![
        (Tar::new().dir("etc/", 0o755).file("etc/base", 0o644, b"base").bytes(), true),
        (Tar::new().dir("etc/", 0o755).file("etc/.wh.base", 0o644, b"").file("etc/top", 0o644, b"top").bytes(), false),
    ]
}

#[test]
fn fabricated_oci_layout_imports_with_config() {
    if !need_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let layout = tmp.path().join("image");
    let diff_ids = fabricate_oci(&layout, &two_layers(), None);
    let (_d, store) = new_store();
    assert_eq!(detect(&layout).unwrap(), SourceKind::OciLayout);
    let mut layer_events = Vec::new();
    let imported = import(&layout, &store, &opts(), &mut |p| {
        if let Progress::Layer { index, count, digest } = p {
            layer_events.push((index, count, digest.to_string()));
        }
    })
    .unwrap();
    assert_eq!(imported.kind, SourceKind::OciLayout);
    let digests: Vec<_> = imported.layers.iter().map(|l| l.digest.clone()).collect();
    assert_eq!(digests, diff_ids);
    assert_eq!(layer_events, vec![(0, 2, diff_ids[0].clone()), (1, 2, diff_ids[1].clone())]);
    assert_eq!(
        imported.config,
        ImageConfig {
            env: vec!["PATH=/usr/bin:/bin".into(), "LANG=C.UTF-8".into()],
            entrypoint: vec!["/bin/entry".into()],
            cmd: vec!["--serve".into()],
            working_dir: Some("/srv".into()),
            user: Some("1000:1000".into()),
        }
    );
    let top = store.fs_dir(&imported.layers[1].key).unwrap();
    assert!(fs::symlink_metadata(top.join("etc/base")).unwrap().file_type().is_char_device());
    assert_eq!(fs::read(store.fs_dir(&imported.layers[0].key).unwrap().join("etc/base")).unwrap(), b"base");
}

#[test]
fn oci_digest_mismatches_are_rejected_and_rolled_back() {
    let tmp = tempfile::tempdir().unwrap();

    // A tampered second layer blob: the first layer was committed, then removed again.
    let layout = tmp.path().join("tampered");
    fabricate_oci(&layout, &two_layers(), None);
    let hex = {
        let idx: serde_json::Value = serde_json::from_slice(&fs::read(layout.join("index.json")).unwrap()).unwrap();
        let m = idx["manifests"][0]["digest"].as_str().unwrap().trim_start_matches("sha256:").to_string();
        let manifest: serde_json::Value =
            serde_json::from_slice(&fs::read(layout.join("blobs/sha256").join(m)).unwrap()).unwrap();
        manifest["layers"][1]["digest"].as_str().unwrap().trim_start_matches("sha256:").to_string()
    };
    let blob = layout.join("blobs/sha256").join(&hex);
    let tampered = Tar::new().dir("etc/", 0o755).file("etc/top", 0o644, b"evil").bytes();
    let mut same_len = tampered.clone();
    same_len.resize(fs::metadata(&blob).unwrap().len() as usize, 0);
    fs::write(&blob, &same_len).unwrap();
    let (_d, store) = new_store();
    let err = run_import(&layout, &store, &opts()).unwrap_err();
    assert!(matches!(err, ImageError::DigestMismatch { .. }), "{err:?}");
    assert!(err.to_string().contains(&hex), "{err}");
    assert!(err.is_invalid_input());
    assert_store_empty(&store);

    // A config whose diff_id does not match the (intact) layer.
    let layout = tmp.path().join("wrong-diff-id");
    let layers = vec![(Tar::new().file("f", 0o644, b"1").bytes(), true)];
    fabricate_oci(&layout, &layers, None);
    // Rewrite the config and manifest with a wrong diff id.
    let wrong = format!("sha256:{}", "0".repeat(64));
    let cfg_text = fs::read_dir(layout.join("blobs/sha256"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find_map(|p| fs::read_to_string(&p).ok().filter(|s| s.contains("diff_ids")))
        .unwrap();
    let cfg_new = cfg_text.replace(&sha256_digest(&layers[0].0), &wrong);
    let cfg_blob = put_blob(&layout, cfg_new.as_bytes());
    let gz_blob = put_blob(&layout, &gzip(&layers[0].0));
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "config": desc("application/vnd.oci.image.config.v1+json", &cfg_blob),
        "layers": [desc("application/vnd.oci.image.layer.v1.tar+gzip", &gz_blob)]
    });
    let m = put_blob(&layout, manifest.to_string().as_bytes());
    let index = serde_json::json!({ "schemaVersion": 2, "manifests": [desc("application/vnd.oci.image.manifest.v1+json", &m)] });
    fs::write(layout.join("index.json"), index.to_string()).unwrap();
    let (_d, store) = new_store();
    let err = run_import(&layout, &store, &opts()).unwrap_err();
    assert!(err.to_string().contains("diff_id"), "{err}");
    assert_store_empty(&store);

    // A tampered config blob.
    let layout = tmp.path().join("bad-config");
    let diff = fabricate_oci(&layout, &layers, None);
    let cfg_path = fs::read_dir(layout.join("blobs/sha256"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| fs::read_to_string(p).is_ok_and(|s| s.contains("diff_ids")))
        .unwrap();
    let text = fs::read_to_string(&cfg_path).unwrap().replace("--serve", "--evil!");
    fs::write(&cfg_path, text).unwrap();
    let (_d, store) = new_store();
    let err = run_import(&layout, &store, &opts()).unwrap_err();
    assert!(matches!(err, ImageError::DigestMismatch { .. }), "{err:?}");
    assert!(!diff.is_empty());
    assert_store_empty(&store);
}

#[test]
fn zstd_layers_are_rejected_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = tmp.path().join("zstd");
    fabricate_oci(
        &layout,
        &[(Tar::new().file("f", 0o644, b"1").bytes(), false)],
        Some("application/vnd.oci.image.layer.v1.tar+zstd"),
    );
    let (_d, store) = new_store();
    let err = run_import(&layout, &store, &opts()).unwrap_err();
    assert!(err.to_string().contains("unsupported layer media type"), "{err}");
    assert!(err.to_string().contains("zstd"), "{err}");
    assert!(err.is_invalid_input());
    assert_store_empty(&store);
}

#[test]
fn multi_platform_and_nested_indexes_pick_the_host_platform() {
    if !need_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let layout = tmp.path().join("multi");
    let diff_ids = fabricate_oci(&layout, &[(Tar::new().file("host", 0o644, b"1").bytes(), true)], None);
    let idx: serde_json::Value = serde_json::from_slice(&fs::read(layout.join("index.json")).unwrap()).unwrap();
    let host_desc = idx["manifests"][0].clone();
    // Another platform's manifest (its blob need not even exist) and an attestation.
    let mut other = host_desc.clone();
    other["digest"] = format!("sha256:{}", "1".repeat(64)).into();
    other["platform"] = serde_json::json!({ "architecture": "s390x", "os": "linux" });
    let mut attestation = host_desc.clone();
    attestation["platform"] = serde_json::json!({ "architecture": "unknown", "os": "unknown" });
    let nested = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [other, host_desc, attestation]
    });
    let nested = put_blob(&layout, nested.to_string().as_bytes());
    let outer = serde_json::json!({ "schemaVersion": 2, "manifests": [desc("application/vnd.oci.image.index.v1+json", &nested)] });
    fs::write(layout.join("index.json"), outer.to_string()).unwrap();

    let (_d, store) = new_store();
    let imported = run_import(&layout, &store, &opts()).unwrap();
    assert_eq!(imported.layers[0].digest, diff_ids[0]);
}

#[test]
fn write_oci_layout_roundtrips() {
    if !need_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = sample_rootfs();
    let rootfs = write(tmp.path(), "rootfs.tar.gz", &gzip(&data));
    let config = ImageConfig { env: vec!["A=b".into()], cmd: vec!["/bin/sh".into()], ..ImageConfig::default() };
    let out = tmp.path().join("oci");
    write_oci_layout(&rootfs, &out, &config).unwrap();
    let index1 = fs::read(out.join("index.json")).unwrap();
    write_oci_layout(&rootfs, &out, &config).unwrap();
    assert_eq!(fs::read(out.join("index.json")).unwrap(), index1, "reproducible");

    let (_d, store) = new_store();
    let imported = run_import(&out, &store, &opts()).unwrap();
    assert_eq!(imported.kind, SourceKind::OciLayout);
    assert_eq!(imported.config, config);
    assert_eq!(imported.layers[0].digest, sha256_digest(&data));
}

// --- docker save archives ------------------------------------------------------------

fn docker_archive(layers: &[Vec<u8>], blobs_layout: bool) -> (Vec<u8>, Vec<String>) {
    let diff_ids: Vec<_> = layers.iter().map(|l| sha256_digest(l)).collect();
    let config = serde_json::json!({
        "architecture": oci_spec::image::Arch::default().to_string(),
        "os": "linux",
        "config": { "Env": ["FOO=bar"], "Cmd": ["/bin/sh", "-c", "echo hi"], "WorkingDir": "/work" },
        "container_config": { "Cmd": ["ignored"] },
        "rootfs": { "type": "layers", "diff_ids": diff_ids }
    })
    .to_string();
    let config_hex = sha256_digest(config.as_bytes()).trim_start_matches("sha256:").to_string();
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |name: &str, data: &[u8]| {
        let mut h = tar::Header::new_ustar();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, name, data).unwrap();
    };
    let mut names = Vec::new();
    for (layer, diff) in layers.iter().zip(&diff_ids) {
        let hex = diff.trim_start_matches("sha256:");
        let name = if blobs_layout { format!("blobs/sha256/{hex}") } else { format!("{hex}/layer.tar") };
        add(&name, layer);
        names.push(name);
    }
    let config_name = if blobs_layout { format!("blobs/sha256/{config_hex}") } else { format!("{config_hex}.json") };
    add(&config_name, config.as_bytes());
    let manifest = serde_json::json!([{ "Config": config_name, "RepoTags": ["test:latest"], "Layers": names }]);
    add("manifest.json", manifest.to_string().as_bytes());
    add("repositories", b"{}");
    (b.into_inner().unwrap(), diff_ids)
}

#[test]
fn docker_save_archives_import() {
    if !need_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let layers: Vec<Vec<u8>> = two_layers().into_iter().map(|(t, _)| t).collect();
    for (blobs_layout, gz) in [(false, false), (true, false), (false, true)] {
        let (archive, diff_ids) = docker_archive(&layers, blobs_layout);
        let archive = if gz { gzip(&archive) } else { archive };
        let src = write(tmp.path(), "image.tar", &archive);
        assert_eq!(detect(&src).unwrap(), SourceKind::DockerArchive);
        let (_d, store) = new_store();
        let imported = run_import(&src, &store, &opts()).unwrap();
        assert_eq!(imported.kind, SourceKind::DockerArchive);
        let digests: Vec<_> = imported.layers.iter().map(|l| l.digest.clone()).collect();
        assert_eq!(digests, diff_ids);
        assert_eq!(imported.config.env, vec!["FOO=bar"]);
        assert_eq!(imported.config.cmd, vec!["/bin/sh", "-c", "echo hi"]);
        assert_eq!(imported.config.working_dir.as_deref(), Some("/work"));
        assert!(fs::read_dir(store.root().join("staging")).unwrap().next().is_none());
    }
}

#[test]
fn docker_archive_with_wrong_diff_id_is_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    let layers = vec![Tar::new().file("a", 0o644, b"a").bytes(), Tar::new().file("b", 0o644, b"b").bytes()];
    let (archive, _) = docker_archive(&layers, false);
    // Swap the second layer's content for something else of the same length.
    let evil = Tar::new().file("b", 0o644, b"X").bytes();
    let pos = archive.windows(layers[1].len()).position(|w| w == layers[1].as_slice()).unwrap();
    let mut archive = archive;
    archive[pos..pos + evil.len()].copy_from_slice(&evil);
    let src = write(tmp.path(), "image.tar", &archive);
    let (_d, store) = new_store();
    let err = run_import(&src, &store, &opts()).unwrap_err();
    assert!(matches!(err, ImageError::DigestMismatch { .. }), "{err:?}");
    assert_store_empty(&store);
}

#[test]
fn write_docker_archive_roundtrips() {
    if !need_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = sample_rootfs();
    let rootfs = write(tmp.path(), "rootfs.tar", &data);
    let config =
        ImageConfig { entrypoint: vec!["/bin/tool".into()], user: Some("1000".into()), ..ImageConfig::default() };
    let out = tmp.path().join("docker.tar");
    write_docker_archive(&rootfs, &out, &config, Some("strata/test:1")).unwrap();
    let (_d, store) = new_store();
    let imported = run_import(&out, &store, &opts()).unwrap();
    assert_eq!(imported.kind, SourceKind::DockerArchive);
    assert_eq!(imported.config, config);
    assert_eq!(imported.layers[0].digest, sha256_digest(&data));
}

// --- image archives as real tools write them ---------------------------------------------

/// One member of an archive built by [`members_tar`].
#[derive(Clone)]
enum Member {
    File(String, u32, Vec<u8>),
    Symlink(String, String),
    Dir(String, u32),
}

impl Member {
    fn name(&self) -> &str {
        match self {
            Member::File(n, ..) | Member::Symlink(n, _) | Member::Dir(n, _) => n,
        }
    }
}

/// A tar of `members`, in that order (modes as given: podman and skopeo
/// write read-only members and mode-0 symlinks).
fn members_tar(members: &[Member]) -> Vec<u8> {
    let mut t = Tar::new();
    for m in members {
        match m {
            Member::File(name, mode, data) => t.file(name, *mode, data),
            Member::Symlink(name, target) => t.raw(tar::EntryType::Symlink, name, Some(target), 0, 0, b""),
            Member::Dir(name, mode) => t.dir(name, *mode),
        };
    }
    t.bytes()
}

/// The orders the tests try: as given, reversed, and each member moved to the front.
fn orders(members: &[Member]) -> Vec<Vec<Member>> {
    let mut all = vec![members.to_vec(), members.iter().rev().cloned().collect()];
    for i in 1..members.len() {
        let mut v = members.to_vec();
        let m = v.remove(i);
        v.insert(0, m);
        all.push(v);
    }
    all
}

fn hex(digest: &str) -> &str {
    digest.trim_start_matches("sha256:")
}

/// A docker image config over `diff_ids` with `env`.
fn image_config(diff_ids: &[String], env: &str) -> String {
    serde_json::json!({
        "architecture": oci_spec::image::Arch::default().to_string(),
        "os": "linux",
        "config": { "Env": [env], "Cmd": ["/bin/sh"] },
        "rootfs": { "type": "layers", "diff_ids": diff_ids }
    })
    .to_string()
}

/// A docker-archive as podman and skopeo write it: `<hex>.tar` layers named
/// by their blob digest, `<config-hex>.json`, legacy `<id>/layer.tar`
/// symlinks to the layers with `<id>/VERSION` and `<id>/json`, every member
/// read-only, `manifest.json` and `repositories` last. Layers are (tar,
/// gzip?). `via_symlinks`: `manifest.json` names the `<id>/layer.tar`
/// symlinks (as Docker's own archives name their layers) instead.
fn podman_docker_archive(layers: &[(Vec<u8>, bool)], via_symlinks: bool) -> (Vec<Member>, Vec<String>) {
    let diff_ids: Vec<String> = layers.iter().map(|(t, _)| sha256_digest(t)).collect();
    let config = image_config(&diff_ids, "FOO=podman");
    let config_name = format!("{}.json", hex(&sha256_digest(config.as_bytes())));
    let mut members = Vec::new();
    let mut legacy = Vec::new();
    let mut names = Vec::new();
    for (i, (tar, gz)) in layers.iter().enumerate() {
        let blob = if *gz { gzip(tar) } else { tar.clone() };
        let file = format!("{}.tar", hex(&sha256_digest(&blob)));
        let id = hex(&sha256_digest(format!("layer id {i}").as_bytes())).to_string();
        members.push(Member::File(file.clone(), 0o444, blob));
        legacy.push(Member::Dir(format!("{id}/"), 0o555));
        legacy.push(Member::Symlink(format!("{id}/layer.tar"), format!("../{file}")));
        legacy.push(Member::File(format!("{id}/VERSION"), 0o444, b"1.0".to_vec()));
        legacy.push(Member::File(format!("{id}/json"), 0o444, format!("{{\"id\":\"{id}\"}}").into_bytes()));
        names.push(if via_symlinks { format!("{id}/layer.tar") } else { file });
    }
    members.push(Member::File(config_name.clone(), 0o444, config.into_bytes()));
    members.extend(legacy);
    let manifest =
        serde_json::json!([{ "Config": config_name, "RepoTags": ["localhost/img:latest"], "Layers": names }]);
    members.push(Member::File("manifest.json".into(), 0o444, manifest.to_string().into_bytes()));
    members.push(Member::File("repositories".into(), 0o444, b"{}".to_vec()));
    (members, diff_ids)
}

/// The members of the OCI layout directory at `layout`, read-only, as an archive of it holds them.
fn layout_members(layout: &Path) -> Vec<Member> {
    let mut members = vec![Member::Dir("blobs/".into(), 0o555), Member::Dir("blobs/sha256/".into(), 0o555)];
    let mut blobs: Vec<_> = fs::read_dir(layout.join("blobs/sha256")).unwrap().map(|e| e.unwrap().path()).collect();
    blobs.sort();
    for b in blobs {
        let name = format!("blobs/sha256/{}", b.file_name().unwrap().to_str().unwrap());
        members.push(Member::File(name, 0o444, fs::read(&b).unwrap()));
    }
    for name in ["index.json", "oci-layout"] {
        members.push(Member::File(name.into(), 0o444, fs::read(layout.join(name)).unwrap()));
    }
    members
}

fn assert_imports(src: &Path, kind: SourceKind, diff_ids: &[String], env: &str) -> Imported {
    assert_eq!(detect(src).unwrap(), kind, "{}", src.display());
    let (_d, store) = new_store();
    let imported = run_import(src, &store, &opts()).unwrap_or_else(|e| panic!("{}: {e:?}", src.display()));
    assert_eq!(imported.kind, kind);
    let digests: Vec<_> = imported.layers.iter().map(|l| l.digest.clone()).collect();
    assert_eq!(digests, diff_ids);
    assert_eq!(imported.config.env.first().map(String::as_str), Some(env), "the image's own config");
    for l in &imported.layers {
        assert!(store.contains(&l.key));
    }
    assert!(fs::read_dir(store.root().join("staging")).unwrap().next().is_none(), "nothing left in staging");
    imported
}

#[test]
fn podman_docker_archives_import_in_any_member_order() {
    if !need_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // One uncompressed layer, one gzip layer (named by the digest of its compressed bytes).
    for via_symlinks in [false, true] {
        let (members, diff_ids) = podman_docker_archive(&two_layers(), via_symlinks);
        assert_eq!(members[members.len() - 2].name(), "manifest.json", "manifest.json comes last");
        for (i, order) in orders(&members).into_iter().enumerate() {
            let archive = members_tar(&order);
            let src = write(tmp.path(), "podman.tar", &archive);
            let imported = assert_imports(&src, SourceKind::DockerArchive, &diff_ids, "FOO=podman");
            assert!(imported.warnings.is_empty(), "order {i}: {:?}", imported.warnings);
            if i < 2 {
                let gz = write(tmp.path(), "podman.tar.gz", &gzip(&archive));
                assert_imports(&gz, SourceKind::DockerArchive, &diff_ids, "FOO=podman");
            }
        }
    }
    let top = {
        let (members, _) = podman_docker_archive(&two_layers(), false);
        let src = write(tmp.path(), "top.tar", &members_tar(&members));
        let (_d, store) = new_store();
        let imported = run_import(&src, &store, &opts()).unwrap();
        fs::read(store.fs_dir(&imported.layers[1].key).unwrap().join("etc/top")).unwrap()
    };
    assert_eq!(top, b"top", "the layers' content, not the archive's, is the image");
}

#[test]
fn docker_archive_symlinks_cannot_leave_the_archive() {
    let tmp = tempfile::tempdir().unwrap();
    let layers = vec![(Tar::new().file("f", 0o644, b"1").bytes(), false)];
    for target in ["../../etc/passwd", "/etc/passwd"] {
        let (mut members, _) = podman_docker_archive(&layers, true);
        for m in &mut members {
            if let Member::Symlink(_, t) = m {
                *t = target.into();
            }
        }
        let src = write(tmp.path(), "evil.tar", &members_tar(&members));
        let (_d, store) = new_store();
        let err = run_import(&src, &store, &opts()).unwrap_err();
        assert!(matches!(err, ImageError::InvalidArchive { .. }), "{err:?}");
        assert!(err.to_string().contains("symlink"), "{err}");
        assert_store_empty(&store);
    }
}

#[test]
fn multi_image_docker_archives_import_the_first_and_say_so() {
    if !need_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (mut members, diff_ids) = podman_docker_archive(&two_layers(), false);
    let manifest_at = members.iter().position(|m| m.name() == "manifest.json").unwrap();
    let Member::File(_, _, bytes) = &members[manifest_at] else { unreachable!() };
    let mut manifest: serde_json::Value = serde_json::from_slice(bytes).unwrap();
    let mut second = manifest[0].clone();
    second["RepoTags"] = serde_json::json!(["localhost/other:v2"]);
    manifest.as_array_mut().unwrap().push(second);
    members[manifest_at] = Member::File("manifest.json".into(), 0o444, manifest.to_string().into_bytes());
    let src = write(tmp.path(), "multi.tar", &members_tar(&members));
    let imported = assert_imports(&src, SourceKind::DockerArchive, &diff_ids, "FOO=podman");
    let w = imported.warnings.join("\n");
    assert!(w.contains("2 images") && w.contains("localhost/other:v2") && w.contains("imported the first"), "{w}");
}

#[test]
fn oci_archives_import_in_place_in_any_member_order() {
    if !need_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let layout = tmp.path().join("layout");
    let diff_ids = fabricate_oci(&layout, &two_layers(), None);
    let members = layout_members(&layout);
    for (i, order) in orders(&members).into_iter().enumerate() {
        let archive = members_tar(&order);
        let src = write(tmp.path(), "image.oci.tar", &archive);
        let imported = assert_imports(&src, SourceKind::OciArchive, &diff_ids, "PATH=/usr/bin:/bin");
        assert!(imported.warnings.is_empty(), "order {i}: {:?}", imported.warnings);
        if i < 2 {
            let gz = write(tmp.path(), "image.oci.tar.gz", &gzip(&archive));
            assert_imports(&gz, SourceKind::OciArchive, &diff_ids, "PATH=/usr/bin:/bin");
        }
    }
    // The import reads the archive in place: nothing is extracted next to it or into the store.
    let names: Vec<_> = fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 3, "{names:?}");
}

#[test]
fn multi_image_oci_archives_import_the_first_for_the_host_and_say_so() {
    if !need_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let layout = tmp.path().join("layout");
    let diff_ids = fabricate_oci(&layout, &two_layers(), None);
    let mut index: serde_json::Value = serde_json::from_slice(&fs::read(layout.join("index.json")).unwrap()).unwrap();
    let mut first = index["manifests"][0].clone();
    first["annotations"] = serde_json::json!({ "org.opencontainers.image.ref.name": "first" });
    let mut second = first.clone();
    second["annotations"] = serde_json::json!({ "org.opencontainers.image.ref.name": "second" });
    index["manifests"] = serde_json::json!([first, second]);
    fs::write(layout.join("index.json"), index.to_string()).unwrap();
    let src = write(tmp.path(), "multi.tar", &members_tar(&layout_members(&layout)));
    let imported = assert_imports(&src, SourceKind::OciArchive, &diff_ids, "PATH=/usr/bin:/bin");
    let w = imported.warnings.join("\n");
    assert!(w.contains("2 images (first, second)") && w.contains("imported first"), "{w}");
}

/// Docker >= 25: `docker save` writes an OCI layout plus a docker-compatible
/// `manifest.json` naming `blobs/sha256/<hex>` members. It is imported
/// through `manifest.json`, whatever the member order; here `index.json`
/// names a different image (another config) to tell which one was used.
#[test]
fn docker_25_archives_import_through_manifest_json() {
    if !need_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let layout = tmp.path().join("layout");
    let layers = two_layers(); // one gzip layer blob, one uncompressed
    let diff_ids = fabricate_oci(&layout, &layers, None);
    let config = put_blob(&layout, image_config(&diff_ids, "FROM=manifest.json").as_bytes());
    let layer_names: Vec<String> = layers
        .iter()
        .map(|(tar, gz)| {
            let blob = if *gz { gzip(tar) } else { tar.clone() };
            format!("blobs/sha256/{}", hex(&sha256_digest(&blob)))
        })
        .collect();
    let manifest = serde_json::json!([{
        "Config": format!("blobs/sha256/{}", hex(&config.digest)),
        "RepoTags": ["busybox:latest"],
        "Layers": layer_names,
        "LayerSources": {}
    }]);
    let mut members = layout_members(&layout);
    members.push(Member::File("manifest.json".into(), 0o644, manifest.to_string().into_bytes()));
    members.push(Member::File("repositories".into(), 0o644, b"{}".to_vec()));
    for order in orders(&members) {
        let src = write(tmp.path(), "docker25.tar", &members_tar(&order));
        assert_imports(&src, SourceKind::DockerArchive, &diff_ids, "FROM=manifest.json");
    }
    // The same layout as a directory is imported through index.json.
    assert_imports(&layout, SourceKind::OciLayout, &diff_ids, "PATH=/usr/bin:/bin");
}

#[test]
fn stray_image_metadata_is_rejected_not_imported_as_a_rootfs() {
    let tmp = tempfile::tempdir().unwrap();
    let rejected = |name: &str, data: &[u8], expect: &[&str]| {
        let src = write(tmp.path(), name, data);
        let (_d, store) = new_store();
        let err = run_import(&src, &store, &opts()).expect_err(name);
        assert!(matches!(err, ImageError::UnsupportedSource { .. }), "{name}: {err:?}");
        assert!(err.is_invalid_input());
        let msg = err.to_string();
        assert!(msg.contains("not imported as a rootfs"), "{name}: {msg}");
        for e in expect {
            assert!(msg.contains(e), "{name}: {msg:?} should name {e:?}");
        }
        assert_store_empty(&store);
    };
    // After the rootfs content (so detection already called it a rootfs): the rootfs import refuses it.
    let late = Tar::new().dir("bin/", 0o755).file("bin/sh", 0o755, b"").file("manifest.json", 0o644, b"{}").bytes();
    rejected("late.tar", &late, &["manifest.json", "\"bin\""]);
    rejected("late.tar.gz", &gzip(&late), &["manifest.json", "\"bin\""]);
    let late_index = Tar::new().file("hello", 0o644, b"hi").file("./index.json", 0o644, b"{}").bytes();
    rejected("late-index.tar", &late_index, &["index.json", "\"hello\""]);
    // Before it.
    let early = Tar::new().file("oci-layout", 0o644, b"{}").dir("etc/", 0o755).file("etc/x", 0o644, b"").bytes();
    rejected("early.tar", &early, &["oci-layout", "\"etc\""]);
    // Only image members, but not a valid image.
    for (name, data, expect) in [
        ("not-docker.tar", Tar::new().file("manifest.json", 0o644, b"{\"not\":\"docker\"}").bytes(), "manifest.json"),
        ("empty-manifest.tar", Tar::new().file("manifest.json", 0o644, b"[]").bytes(), "lists no images"),
        (
            "symlinked-manifest.tar",
            Tar::new().file("real.json", 0o644, b"[]").symlink("manifest.json", "real.json").bytes(),
            "not a regular file",
        ),
        ("index-only.tar", Tar::new().file("index.json", 0o644, b"{}").bytes(), "no oci-layout"),
        ("layout-only.tar", Tar::new().dir("blobs/", 0o755).file("oci-layout", 0o644, b"{}").bytes(), "no index.json"),
        (
            "docker-1.9.tar",
            Tar::new()
                .file(&format!("{}/layer.tar", "a".repeat(64)), 0o644, b"")
                .file("repositories", 0o644, b"{}")
                .bytes(),
            "Docker < 1.10",
        ),
    ] {
        rejected(name, &data, &[expect]);
    }
}

#[test]
fn image_metadata_names_below_the_top_or_whited_out_are_fine() {
    if !need_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    for data in [
        Tar::new()
            .dir("etc/", 0o755)
            .file("etc/manifest.json", 0o644, b"{}")
            .file("etc/index.json", 0o644, b"")
            .bytes(),
        Tar::new().dir("bin/", 0o755).file(".wh.manifest.json", 0o644, b"").file(".wh.oci-layout", 0o644, b"").bytes(),
    ] {
        let src = write(tmp.path(), "rootfs.tar", &data);
        let (_d, store) = new_store();
        assert_eq!(run_import(&src, &store, &opts()).unwrap().kind, SourceKind::RootfsTar);
    }
}

#[test]
fn digest_mismatches_in_archives_are_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    let layers = two_layers();

    // OCI archive: a layer blob whose content does not hash to its name and descriptor.
    let layout = tmp.path().join("layout");
    fabricate_oci(&layout, &layers, None);
    let plain_blob = format!("blobs/sha256/{}", hex(&sha256_digest(&layers[1].0)));
    let mut members = layout_members(&layout);
    for m in &mut members {
        if let Member::File(name, _, data) = m {
            if *name == plain_blob {
                let evil = Tar::new().dir("etc/", 0o755).file("etc/top", 0o644, b"evil").bytes();
                data[..evil.len()].copy_from_slice(&evil);
            }
        }
    }
    let src = write(tmp.path(), "tampered.oci.tar", &members_tar(&members));
    let (_d, store) = new_store();
    let err = run_import(&src, &store, &opts()).unwrap_err();
    assert!(matches!(err, ImageError::DigestMismatch { .. }), "{err:?}");
    assert!(err.to_string().contains(hex(&sha256_digest(&layers[1].0))), "{err}");
    assert_store_empty(&store);

    // OCI archive: a blob shorter than its descriptor says.
    let mut members = layout_members(&layout);
    for m in &mut members {
        if let Member::File(name, _, data) = m {
            if *name == plain_blob {
                data.truncate(data.len() - 512);
            }
        }
    }
    let src = write(tmp.path(), "short.oci.tar", &members_tar(&members));
    let (_d, store) = new_store();
    let err = run_import(&src, &store, &opts()).unwrap_err();
    assert!(matches!(err, ImageError::SizeMismatch { .. }), "{err:?}");
    assert_store_empty(&store);

    // podman-style docker archive: a layer named by a digest its content does not have (diff ids intact).
    let (members, _) = podman_docker_archive(&layers, false);
    let wrong = "0".repeat(64);
    let rename = |s: &str| s.replace(hex(&sha256_digest(&layers[1].0)), &wrong);
    let members: Vec<Member> = members
        .into_iter()
        .map(|m| match m {
            Member::File(name, mode, data) if name == "manifest.json" => {
                Member::File(name, mode, rename(std::str::from_utf8(&data).unwrap()).into_bytes())
            }
            Member::File(name, mode, data) => Member::File(rename(&name), mode, data),
            other => other,
        })
        .collect();
    let src = write(tmp.path(), "misnamed.tar", &members_tar(&members));
    let (_d, store) = new_store();
    let err = run_import(&src, &store, &opts()).unwrap_err();
    assert!(matches!(err, ImageError::DigestMismatch { .. }), "{err:?}");
    assert!(err.to_string().contains(&wrong), "{err}");
    assert_store_empty(&store);

    // Docker >= 25 flavour: a config blob that does not hash to its name.
    let config = image_config(&layers.iter().map(|(t, _)| sha256_digest(t)).collect::<Vec<_>>(), "A=b");
    let name = format!("blobs/sha256/{}", "1".repeat(64));
    let manifest = serde_json::json!([{ "Config": name, "Layers": [] }]);
    let members = vec![
        Member::File(name.clone(), 0o444, config.into_bytes()),
        Member::File("manifest.json".into(), 0o444, manifest.to_string().into_bytes()),
    ];
    let src = write(tmp.path(), "bad-config.tar", &members_tar(&members));
    let (_d, store) = new_store();
    let err = run_import(&src, &store, &opts()).unwrap_err();
    assert!(matches!(err, ImageError::DigestMismatch { .. }), "{err:?}");
    assert_store_empty(&store);
}

// --- rootfs directories ----------------------------------------------------------------

#[test]
fn rootfs_directory_import_is_deterministic_and_does_not_follow_symlinks() {
    if !need_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let outside = tmp.path().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("secret"), b"do not import").unwrap();
    let root = tmp.path().join("rootfs");
    fs::create_dir_all(root.join("bin")).unwrap();
    fs::create_dir_all(root.join("etc/deep/er")).unwrap();
    fs::write(root.join("bin/busybox"), b"ELF...").unwrap();
    fs::set_permissions(root.join("bin/busybox"), fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("busybox", root.join("bin/sh")).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("escape-dir")).unwrap();
    std::os::unix::fs::symlink(outside.join("secret"), root.join("escape-file")).unwrap();
    std::os::unix::fs::symlink("/nonexistent", root.join("dangling")).unwrap();
    fs::hard_link(root.join("bin/busybox"), root.join("bin/ls")).unwrap();
    fs::write(root.join("etc/deep/er/file"), b"x").unwrap();
    std::os::unix::fs::chown(root.join("etc/deep"), Some(1000), Some(1000)).unwrap();
    let long = "n".repeat(150);
    fs::write(root.join("etc").join(&long), b"long name").unwrap();
    std::os::unix::fs::symlink("t".repeat(200), root.join("long-link")).unwrap();

    assert_eq!(detect(&root).unwrap(), SourceKind::RootfsDir);
    let (_d, store) = new_store();
    let first = run_import(&root, &store, &opts()).unwrap();
    assert_eq!(first.kind, SourceKind::RootfsDir);
    assert!(first.layers[0].new);
    let again = run_import(&root, &store, &opts()).unwrap();
    assert_eq!(again.layers[0].digest, first.layers[0].digest, "same digest twice");
    assert!(!again.layers[0].new);
    let (_d2, store2) = new_store();
    assert_eq!(run_import(&root, &store2, &opts()).unwrap().layers[0].digest, first.layers[0].digest);

    let fs_dir = store.fs_dir(&first.layers[0].key).unwrap();
    assert_eq!(fs::read_link(fs_dir.join("escape-dir")).unwrap(), outside);
    assert_eq!(fs::read_link(fs_dir.join("escape-file")).unwrap(), outside.join("secret"));
    assert_eq!(fs::read_link(fs_dir.join("dangling")).unwrap(), Path::new("/nonexistent"));
    assert_eq!(fs::read_link(fs_dir.join("long-link")).unwrap(), Path::new(&"t".repeat(200)));
    assert_eq!(fs::read(fs_dir.join("etc").join(&long)).unwrap(), b"long name");
    let bb = fs::symlink_metadata(fs_dir.join("bin/busybox")).unwrap();
    assert_eq!(bb.permissions().mode() & 0o7777, 0o755);
    assert_eq!(fs::symlink_metadata(fs_dir.join("bin/ls")).unwrap().ino(), bb.ino());
    assert_eq!(fs::symlink_metadata(fs_dir.join("etc/deep")).unwrap().uid(), 1000);
    assert_eq!(
        fs::symlink_metadata(fs_dir.join("etc/deep")).unwrap().mtime(),
        fs::symlink_metadata(root.join("etc/deep")).unwrap().mtime()
    );
    assert!(fs::read_dir(store.root().join("staging")).unwrap().next().is_none());
}

// --- detection -----------------------------------------------------------------------

#[test]
fn detection_inspects_content() {
    let tmp = tempfile::tempdir().unwrap();
    let unsupported = |p: &Path| match detect(p) {
        Err(e @ ImageError::UnsupportedSource { .. }) => {
            assert!(e.is_invalid_input());
            e.to_string()
        }
        other => panic!("{other:?}"),
    };
    let junk = write(tmp.path(), "junk.tar", &[b'x'; 2000]);
    assert!(unsupported(&junk).contains("not a tar"));
    let zstd = write(tmp.path(), "image.tar", &[0x28, 0xb5, 0x2f, 0xfd, 0, 0, 0, 0]);
    assert!(unsupported(&zstd).contains("zstd"));
    let empty = write(tmp.path(), "empty", b"");
    unsupported(&empty);
    // A tar of an OCI layout.
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in [("oci-layout", &b"{}"[..]), ("index.json", b"{}")] {
        let mut h = tar::Header::new_ustar();
        h.set_size(data.len() as u64);
        b.append_data(&mut h, name, data).unwrap();
    }
    let oci_tar = write(tmp.path(), "oci.tar", &b.into_inner().unwrap());
    assert_eq!(detect(&oci_tar).unwrap(), SourceKind::OciArchive);
    assert_eq!(SourceKind::OciArchive.as_str(), "oci-archive");
    // Image metadata that is not a valid image, followed by rootfs content: rejected here.
    let rootfs =
        write(tmp.path(), "r.tar", &Tar::new().file("manifest.json", 0o644, b"{}").file("bin/sh", 0o755, b"").bytes());
    let msg = unsupported(&rootfs);
    assert!(
        msg.contains("manifest.json") && msg.contains("bin/sh") && msg.contains("not imported as a rootfs"),
        "{msg}"
    );
    // A manifest.json below the top level is just a file.
    let nested = write(tmp.path(), "n.tar", &Tar::new().file("etc/manifest.json", 0o644, b"{}").bytes());
    assert_eq!(detect(&nested).unwrap(), SourceKind::RootfsTar);
    let missing = tmp.path().join("missing");
    assert!(matches!(detect(&missing), Err(ImageError::Source { .. })));
    let half = tmp.path().join("half");
    fs::create_dir(&half).unwrap();
    fs::write(half.join("oci-layout"), "{}").unwrap();
    unsupported(&half);
    // A directory with image metadata that is not an OCI layout is not a rootfs either.
    for name in ["index.json", "manifest.json"] {
        let dir = tmp.path().join(format!("dir-{name}"));
        fs::create_dir_all(dir.join("bin")).unwrap();
        fs::write(dir.join(name), "[]").unwrap();
        assert!(unsupported(&dir).contains(name));
    }
    assert_eq!(SourceKind::DockerArchive.as_str(), "docker-archive");
    assert_eq!(SourceKind::OciLayout.to_string(), "oci-layout");
}
