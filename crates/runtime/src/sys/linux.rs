//! [`LinuxSys`]: the real calls, through `nix` where it has them and `libc`
//! where it does not (`open_tree`, `move_mount`, the interface ioctls).

use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags};
use nix::sched::CloneFlags;
use nix::sys::stat::{FchmodatFlags, Mode, SFlag};
use nix::unistd::{Gid, Uid};

use super::Sys;

/// `move_mount(2)` flag: the source is the descriptor itself (empty path).
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;

/// The real system calls. Stateless; build one where the calls are made.
#[derive(Debug, Clone, Copy, Default)]
pub struct LinuxSys;

fn c_path(p: &Path) -> nix::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)
}

impl Sys for LinuxSys {
    fn mount(
        &self,
        source: Option<&Path>,
        target: &Path,
        fstype: Option<&str>,
        flags: MsFlags,
        data: Option<&str>,
    ) -> nix::Result<()> {
        nix::mount::mount(source, target, fstype, flags, data)
    }

    fn umount2(&self, target: &Path, flags: MntFlags) -> nix::Result<()> {
        nix::mount::umount2(target, flags)
    }

    fn pivot_root(&self, new_root: &Path, put_old: &Path) -> nix::Result<()> {
        nix::unistd::pivot_root(new_root, put_old)
    }

    fn chdir(&self, path: &Path) -> nix::Result<()> {
        nix::unistd::chdir(path)
    }

    fn unshare(&self, flags: CloneFlags) -> nix::Result<()> {
        nix::sched::unshare(flags)
    }

    fn setns(&self, fd: BorrowedFd<'_>, nstype: CloneFlags) -> nix::Result<()> {
        nix::sched::setns(fd, nstype)
    }

    fn sethostname(&self, name: &str) -> nix::Result<()> {
        nix::unistd::sethostname(name)
    }

    fn mknod(&self, path: &Path, kind: SFlag, perm: Mode, dev: u64) -> nix::Result<()> {
        nix::sys::stat::mknod(path, kind, perm, dev)
    }

    fn chmod(&self, path: &Path, mode: u32) -> nix::Result<()> {
        nix::sys::stat::fchmodat(None, path, Mode::from_bits_truncate(mode), FchmodatFlags::FollowSymlink)
    }

    fn fchown(&self, fd: BorrowedFd<'_>, uid: u32, gid: u32) -> nix::Result<()> {
        nix::unistd::fchown(fd.as_raw_fd(), Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))
    }

    fn open_tree(&self, path: &Path, flags: u32) -> nix::Result<OwnedFd> {
        let path = c_path(path)?;
        // SAFETY: open_tree takes a dirfd, a NUL-terminated path that outlives the call, and flags.
        let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, path.as_ptr(), flags as libc::c_uint) };
        if fd < 0 {
            return Err(Errno::last());
        }
        // SAFETY: fd is a new descriptor owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
    }

    fn move_mount(&self, from: BorrowedFd<'_>, to: &Path) -> nix::Result<()> {
        let to = c_path(to)?;
        // SAFETY: move_mount takes two (dirfd, NUL-terminated path) pairs that outlive the call, and flags.
        let r = unsafe {
            libc::syscall(
                libc::SYS_move_mount,
                from.as_raw_fd(),
                c"".as_ptr(),
                libc::AT_FDCWD,
                to.as_ptr(),
                MOVE_MOUNT_F_EMPTY_PATH,
            )
        };
        Errno::result(r).map(drop)
    }

    fn loopback_up(&self) -> nix::Result<()> {
        // SAFETY: socket() has no memory-safety preconditions; the fd is owned below.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(Errno::last());
        }
        // SAFETY: fd is a new descriptor that nothing else owns; dropping it closes it once.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: ifreq is plain old data; all-zero is a valid value.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
            *dst = *src as libc::c_char;
        }
        // SAFETY: sock is a valid socket and req a valid ifreq for these ioctls.
        let r = unsafe {
            if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) < 0 {
                -1
            } else {
                req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
                libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req)
            }
        };
        // Read before the close (which may set errno).
        let err = Errno::last();
        drop(sock);
        if r < 0 {
            return Err(err);
        }
        Ok(())
    }
}
