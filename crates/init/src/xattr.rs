//! Extended attributes of the `user.` namespace, read and written through a
//! descriptor the resolver already checked (`/proc/self/fd/N` of an `O_PATH`
//! descriptor: the same inode, whatever the sandbox renamed since).
//!
//! Only `user.` attributes are served: `trusted.`, `security.` and `system.`
//! ones belong to the kernel, overlayfs and the sandbox's root.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;
use std::os::fd::RawFd;

/// The namespace served.
pub const USER_PREFIX: &str = "user.";

/// The most bytes of names, or of one value, read from one file (the kernel's
/// own limit, XATTR_LIST_MAX and XATTR_SIZE_MAX, is 64 KiB).
const MAX_READ: usize = 64 * 1024;

fn proc_path(fd: RawFd) -> CString {
    CString::new(format!("/proc/self/fd/{fd}")).expect("no NUL in a number")
}

/// Calls `f(buf)` with a buffer of the size `f(empty)` asks for (a size
/// query first, as the xattr calls want), bounded by [`MAX_READ`].
fn sized(f: impl Fn(&mut [u8]) -> isize) -> io::Result<Vec<u8>> {
    for _ in 0..3 {
        let n = f(&mut []);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buf = vec![0u8; (n as usize).min(MAX_READ)];
        let got = f(&mut buf);
        if got >= 0 {
            buf.truncate(got as usize);
            return Ok(buf);
        }
        let err = io::Error::last_os_error();
        // It grew between the two calls: ask again (a few times at most).
        if err.raw_os_error() != Some(libc::ERANGE) || buf.len() == MAX_READ {
            return Err(err);
        }
    }
    Err(io::Error::from_raw_os_error(libc::ERANGE))
}

/// The `user.` attributes of what `fd` names, by full name. Values that are
/// not UTF-8 are left out; a filesystem without xattrs (or an object that
/// cannot have them, like a symlink) has none.
pub fn read_user(fd: RawFd) -> BTreeMap<String, String> {
    let path = proc_path(fd);
    // SAFETY: valid NUL-terminated path; the buffer pointer and length describe writable memory.
    let names = sized(|b| unsafe { libc::listxattr(path.as_ptr(), b.as_mut_ptr().cast(), b.len()) });
    let Ok(names) = names else { return BTreeMap::new() };
    let mut out = BTreeMap::new();
    for name in names.split(|b| *b == 0).filter(|n| n.starts_with(USER_PREFIX.as_bytes())) {
        let (Ok(key), Ok(cname)) = (std::str::from_utf8(name), CString::new(name)) else { continue };
        // SAFETY: valid NUL-terminated path and name; the buffer describes writable memory.
        let value = sized(|b| unsafe { libc::getxattr(path.as_ptr(), cname.as_ptr(), b.as_mut_ptr().cast(), b.len()) });
        if let Ok(Ok(v)) = value.map(String::from_utf8) {
            out.insert(key.to_string(), v);
        }
    }
    out
}

/// Makes the attributes of what `fd` names under `prefix` (which starts with
/// `user.`) exactly `values` (keys without the prefix): others under the
/// prefix are removed, attributes outside it are left alone.
pub fn replace_user(fd: RawFd, prefix: &str, values: &BTreeMap<String, String>) -> io::Result<()> {
    if !prefix.starts_with(USER_PREFIX) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{prefix}: only user. attributes are written"),
        ));
    }
    let path = proc_path(fd);
    for old in read_user(fd).keys() {
        let Some(key) = old.strip_prefix(prefix) else { continue };
        if values.contains_key(key) {
            continue;
        }
        let name = CString::new(old.as_str()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: valid NUL-terminated path and name.
        if unsafe { libc::removexattr(path.as_ptr(), name.as_ptr()) } < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::ENODATA) {
                return Err(err);
            }
        }
    }
    for (key, value) in values {
        let name = CString::new(format!("{prefix}{key}")).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: valid NUL-terminated path and name; value points at value.len() readable bytes.
        let r = unsafe { libc::setxattr(path.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn user_attributes_are_replaced_under_a_prefix_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"x").unwrap();
        let f = std::fs::File::open(&p).unwrap();
        let one = BTreeMap::from([("a".to_string(), "1".to_string()), ("b".to_string(), "2".to_string())]);
        match replace_user(f.as_raw_fd(), "user.e2b.", &one) {
            Ok(()) => {}
            // tmpfs before 6.6 and some test hosts have no user xattrs: nothing to check there.
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                eprintln!("skipped: the temp directory's filesystem has no user xattrs ({e})");
                return;
            }
            Err(e) => panic!("setxattr: {e}"),
        }
        let other = BTreeMap::from([("x".to_string(), "kept".to_string())]);
        replace_user(f.as_raw_fd(), "user.other.", &other).unwrap();
        let two = BTreeMap::from([("b".to_string(), "3".to_string())]);
        replace_user(f.as_raw_fd(), "user.e2b.", &two).unwrap();
        let got = read_user(f.as_raw_fd());
        assert_eq!(
            got,
            BTreeMap::from([
                ("user.e2b.b".to_string(), "3".to_string()),
                ("user.other.x".to_string(), "kept".to_string())
            ])
        );
        assert!(replace_user(f.as_raw_fd(), "trusted.", &two).is_err());
    }
}
