//! [`LinuxSys`]: the real calls, through `nix` where it has them and `libc`
//! where it does not (`open_tree`, `move_mount`, the interface ioctls).

use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

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

    fn loop_attach(&self, image: &Path) -> nix::Result<(PathBuf, OwnedFd)> {
        loopdev::attach(image)
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

/// Loop devices through their ioctls (linux/loop.h).
mod loopdev {
    use std::os::fd::{AsRawFd, OwnedFd};
    use std::path::{Path, PathBuf};

    const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
    const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
    const LO_FLAGS_AUTOCLEAR: u32 = 4;

    /// `struct loop_info64`.
    #[repr(C)]
    struct LoopInfo64 {
        lo_device: u64,
        lo_inode: u64,
        lo_rdevice: u64,
        lo_offset: u64,
        lo_sizelimit: u64,
        lo_number: u32,
        lo_encrypt_type: u32,
        lo_encrypt_key_size: u32,
        lo_flags: u32,
        lo_file_name: [u8; 64],
        lo_crypt_name: [u8; 64],
        lo_encrypt_key: [u8; 32],
        lo_init: [u64; 2],
    }

    /// `struct loop_config`.
    #[repr(C)]
    struct LoopConfig {
        fd: u32,
        block_size: u32,
        info: LoopInfo64,
        reserved: [u64; 8],
    }

    fn errno(e: std::io::Error) -> nix::errno::Errno {
        nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
    }

    /// Opens read-write (std opens with O_CLOEXEC).
    fn open_rw(path: &Path) -> std::io::Result<OwnedFd> {
        Ok(std::fs::OpenOptions::new().read(true).write(true).open(path)?.into())
    }

    /// A free loop device backed by `image` (auto-clearing), and a descriptor
    /// of it that keeps it alive until something else (a mount) holds it.
    pub fn attach(image: &Path) -> nix::Result<(PathBuf, OwnedFd)> {
        let backing = open_rw(image).map_err(errno)?;
        let ctl = open_rw(Path::new("/dev/loop-control")).map_err(errno)?;
        let mut last = nix::errno::Errno::EBUSY;
        // Another process may take the free device between GET_FREE and CONFIGURE: try again.
        for _ in 0..16 {
            // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number or -1.
            let n = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE as _) };
            if n < 0 {
                return Err(nix::errno::Errno::last());
            }
            let device = PathBuf::from(format!("/dev/loop{n}"));
            let dev = open_rw(&device).map_err(errno)?;
            // SAFETY: all-zero is a valid `loop_config` (plain integers and byte arrays).
            let mut cfg: LoopConfig = unsafe { std::mem::zeroed() };
            cfg.fd = backing.as_raw_fd() as u32;
            cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR;
            let name = image.as_os_str().as_encoded_bytes();
            let k = name.len().min(cfg.info.lo_file_name.len() - 1);
            cfg.info.lo_file_name[..k].copy_from_slice(&name[..k]);
            // SAFETY: LOOP_CONFIGURE reads a `loop_config` that lives across the call.
            if unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE as _, &cfg as *const LoopConfig) } == 0 {
                return Ok((device, dev));
            }
            last = nix::errno::Errno::last();
            if last != nix::errno::Errno::EBUSY {
                return Err(last);
            }
        }
        Err(last)
    }

    // linux/loop.h: sizeof(struct loop_info64) == 232, sizeof(struct loop_config) == 304.
    const _: () = assert!(std::mem::size_of::<LoopInfo64>() == 232);
    const _: () = assert!(std::mem::size_of::<LoopConfig>() == 304);
}
