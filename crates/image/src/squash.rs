//! Flattening a deep layer chain into one directory (overlayfs stacks a
//! limited number of lower layers: the mount options must fit one page).
//!
//! Layers are applied bottom-up with overlay's semantics: a whiteout (0/0
//! character device) deletes the path, an opaque directory
//! (`trusted.overlay.opaque=y`) drops what lower layers had inside it, anything
//! else replaces what was there. Regular files are hard-linked from the
//! (immutable) layers, so flattening costs metadata operations, not data copies.
//! The result is written to a fresh directory; the caller renames it into place.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::error::{io_err, ImageError};

fn is_whiteout(md: &fs::Metadata) -> bool {
    md.file_type().is_char_device() && md.rdev() == 0
}

fn is_opaque(dir: &Path) -> bool {
    let Ok(c) = CString::new(dir.as_os_str().as_bytes()) else { return false };
    let mut buf = [0u8; 4];
    // SAFETY: valid C strings and a writable buffer of the given size.
    let n =
        unsafe { libc::lgetxattr(c.as_ptr(), c"trusted.overlay.opaque".as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    n == 1 && buf[0] == b'y'
}

fn remove_any(p: &Path) -> io::Result<()> {
    match fs::symlink_metadata(p) {
        Ok(md) if md.is_dir() => fs::remove_dir_all(p),
        Ok(_) => fs::remove_file(p),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

fn copy_dir_meta(src: &fs::Metadata, dst: &Path) -> io::Result<()> {
    fs::set_permissions(dst, fs::Permissions::from_mode(src.mode() & 0o7777))?;
    std::os::unix::fs::lchown(dst, Some(src.uid()), Some(src.gid()))
}

fn apply(layer: &Path, out: &Path, rel: &Path) -> Result<(), ImageError> {
    let src_dir = layer.join(rel);
    for entry in fs::read_dir(&src_dir).map_err(io_err(&src_dir))? {
        let entry = entry.map_err(io_err(&src_dir))?;
        let name = entry.file_name();
        let src = src_dir.join(&name);
        let dst = out.join(rel).join(&name);
        let md = fs::symlink_metadata(&src).map_err(io_err(&src))?;
        if is_whiteout(&md) {
            remove_any(&dst).map_err(io_err(&dst))?;
        } else if md.is_dir() {
            let existing_dir = fs::symlink_metadata(&dst).map(|m| m.is_dir()).unwrap_or(false);
            if existing_dir && is_opaque(&src) {
                remove_any(&dst).map_err(io_err(&dst))?;
            }
            if !fs::symlink_metadata(&dst).map(|m| m.is_dir()).unwrap_or(false) {
                remove_any(&dst).map_err(io_err(&dst))?;
                fs::create_dir(&dst).map_err(io_err(&dst))?;
            }
            copy_dir_meta(&md, &dst).map_err(io_err(&dst))?;
            apply(layer, out, &rel.join(&name))?;
        } else {
            remove_any(&dst).map_err(io_err(&dst))?;
            if md.file_type().is_symlink() {
                let target = fs::read_link(&src).map_err(io_err(&src))?;
                std::os::unix::fs::symlink(&target, &dst).map_err(io_err(&dst))?;
                std::os::unix::fs::lchown(&dst, Some(md.uid()), Some(md.gid())).map_err(io_err(&dst))?;
            } else if md.is_file() {
                fs::hard_link(&src, &dst).map_err(io_err(&dst))?;
            } else {
                // Fifos (the only other kind layers hold): recreate.
                let c = CString::new(dst.as_os_str().as_bytes())
                    .map_err(|_| io_err(&dst)(io::ErrorKind::InvalidInput.into()))?;
                // SAFETY: valid C string; mkfifo creates a node and touches no memory of ours.
                if unsafe { libc::mkfifo(c.as_ptr(), md.mode() & 0o7777) } != 0 {
                    return Err(io_err(&dst)(io::Error::last_os_error()));
                }
            }
        }
    }
    Ok(())
}

/// Writes the merged view of `layers_bottom_first` (each an overlay lower
/// directory) into the empty directory `out`.
pub fn squash(layers_bottom_first: &[PathBuf], out: &Path) -> Result<(), ImageError> {
    for layer in layers_bottom_first {
        apply(layer, out, Path::new(""))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn applies_whiteouts_opaque_dirs_and_replacements_bottom_up() {
        if !crate::sys::is_root() {
            println!("skipped: needs root for whiteout devices and trusted.* xattrs");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let (l1, l2, l3, out) = (t.path().join("l1"), t.path().join("l2"), t.path().join("l3"), t.path().join("out"));
        for d in [&l1, &l2, &l3, &out] {
            fs::create_dir_all(d).unwrap();
        }
        fs::create_dir_all(l1.join("etc/old")).unwrap();
        fs::write(l1.join("etc/old/a"), "a").unwrap();
        fs::write(l1.join("etc/keep"), "1").unwrap();
        fs::write(l1.join("etc/gone"), "x").unwrap();
        // l2: replace keep, delete gone, make old opaque with a new child.
        fs::create_dir_all(l2.join("etc/old")).unwrap();
        fs::write(l2.join("etc/keep"), "2").unwrap();
        fs::write(l2.join("etc/old/b"), "b").unwrap();
        let c = CString::new(l2.join("etc/old").as_os_str().as_bytes()).unwrap();
        assert_eq!(
            // SAFETY: valid C strings and value.
            unsafe { libc::setxattr(c.as_ptr(), c"trusted.overlay.opaque".as_ptr(), b"y".as_ptr().cast(), 1, 0) },
            0
        );
        let w = CString::new(l2.join("etc/gone").as_os_str().as_bytes()).unwrap();
        // SAFETY: valid C string; creates a whiteout device.
        assert_eq!(unsafe { libc::mknod(w.as_ptr(), libc::S_IFCHR | 0o600, 0) }, 0);
        // l3: a symlink where a file was.
        fs::create_dir_all(l3.join("etc")).unwrap();
        std::os::unix::fs::symlink("keep", l3.join("etc/link")).unwrap();
        squash(&[l1, l2, l3], &out).unwrap();
        assert_eq!(fs::read_to_string(out.join("etc/keep")).unwrap(), "2");
        assert!(!out.join("etc/gone").exists());
        assert!(!out.join("etc/old/a").exists(), "opaque dir drops lower content");
        assert_eq!(fs::read_to_string(out.join("etc/old/b")).unwrap(), "b");
        assert_eq!(fs::read_link(out.join("etc/link")).unwrap(), PathBuf::from("keep"));
    }
}
