//! `openat2(2)`, for opening paths inside a tree that is not ours (a sandbox's
//! root) without following its symlinks out of it. The resolve flags say how.

use std::ffi::CString;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

/// Refuse magic links (`/proc/self/fd/N` style).
pub const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
/// Refuse every symlink.
pub const RESOLVE_NO_SYMLINKS: u64 = 0x04;
/// Fail when resolution would leave `dir`.
pub const RESOLVE_BENEATH: u64 = 0x08;
/// Resolve as if `dir` were `/` (absolute symlinks and `..` stay inside it).
pub const RESOLVE_IN_ROOT: u64 = 0x10;

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// Opens `rel` (`""` means `dir` itself) relative to `dir` with `flags` (plus
/// `O_CLOEXEC`), `mode` for created files and the `resolve` flags above.
pub fn openat2(dir: RawFd, rel: &str, flags: i32, mode: u32, resolve: u64) -> io::Result<OwnedFd> {
    let c = CString::new(if rel.is_empty() { "." } else { rel })
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let how = OpenHow { flags: (flags | libc::O_CLOEXEC) as u64, mode: mode as u64, resolve };
    // SAFETY: `c` is NUL-terminated, `how` is a valid open_how of the size passed.
    let fd = unsafe {
        libc::syscall(libc::SYS_openat2, dir, c.as_ptr(), &how as *const OpenHow, std::mem::size_of::<OpenHow>())
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new descriptor that we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Opens `rel` under `dir` (resolved with `resolve`) only if it is a regular
/// file, without ever opening anything else: the path is first opened
/// `O_PATH | O_NOFOLLOW` (which opens no device, FIFO or socket), checked,
/// and only then reopened through `/proc/self/fd` with `flags`. Host code
/// reading or writing a file a sandbox controls uses this, so a device node
/// or FIFO planted there is never opened with the host's privileges.
pub fn open_regular(dir: RawFd, rel: &str, flags: i32, resolve: u64) -> io::Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    let path = openat2(dir, rel, libc::O_PATH | libc::O_NOFOLLOW, 0, resolve)?;
    let st = nix::sys::stat::fstat(path.as_raw_fd()).map_err(io::Error::from)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{rel} is not a regular file")));
    }
    let reopened = std::fs::OpenOptions::new()
        .read(flags & libc::O_ACCMODE != libc::O_WRONLY)
        .write(flags & libc::O_ACCMODE != libc::O_RDONLY)
        .custom_flags((flags & !libc::O_ACCMODE) | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(format!("/proc/self/fd/{}", path.as_raw_fd()))?;
    Ok(reopened)
}
