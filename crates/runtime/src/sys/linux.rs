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

/// `mount_setattr(2)` attribute: idmap the mount through a user namespace.
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// `struct mount_attr` of `mount_setattr(2)`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

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

    fn user_namespace(&self, host_base: u32, size: u32) -> nix::Result<OwnedFd> {
        userns::create(host_base, size)
    }

    fn idmap_mount(&self, tree: BorrowedFd<'_>, userns: BorrowedFd<'_>) -> nix::Result<()> {
        let attr =
            MountAttr { attr_set: MOUNT_ATTR_IDMAP, attr_clr: 0, propagation: 0, userns_fd: userns.as_raw_fd() as u64 };
        // SAFETY: mount_setattr reads `size_of::<MountAttr>()` bytes of `attr`, which
        // outlives the call; the path is an empty NUL-terminated string (AT_EMPTY_PATH).
        let r = unsafe {
            libc::syscall(
                libc::SYS_mount_setattr,
                tree.as_raw_fd(),
                c"".as_ptr(),
                libc::AT_EMPTY_PATH as libc::c_uint,
                &attr as *const MountAttr,
                std::mem::size_of::<MountAttr>(),
            )
        };
        Errno::result(r).map(drop)
    }

    fn set_fs_ids(&self, id: u32) -> nix::Result<()> {
        // SAFETY: setfsuid/setfsgid take an integer and only change this thread's credentials.
        unsafe {
            libc::setfsuid(id);
            libc::setfsgid(id);
        }
        let permitted = caps::read(None, caps::CapSet::Permitted).map_err(|_| Errno::EPERM)?;
        caps::set(None, caps::CapSet::Effective, &permitted).map_err(|_| Errno::EPERM)
    }

    fn loop_attach(&self, image: &Path) -> nix::Result<(PathBuf, OwnedFd)> {
        loopdev::attach(image)
    }

    fn loopback_up(&self) -> nix::Result<()> {
        strata_init::loopback::up()
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

mod userns {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    use nix::errno::Errno;
    use nix::sys::wait::waitpid;
    use nix::unistd::{fork, ForkResult};

    /// See [`super::Sys::user_namespace`]. The caller must be single-threaded
    /// (the `_init` helper is): the child runs plain system calls only.
    pub fn create(host_base: u32, size: u32) -> nix::Result<OwnedFd> {
        let (ready_r, ready_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let (done_r, done_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        // SAFETY: the child only makes async-signal-safe system calls and exits.
        match unsafe { fork() }? {
            ForkResult::Child => {
                // SAFETY: close, unshare, write, read and _exit are async-signal-safe.
                unsafe {
                    // This copy of the parent's ends: the read below ends at EOF only
                    // once no process holds `done_w`.
                    libc::close(done_w.as_raw_fd());
                    libc::close(ready_r.as_raw_fd());
                    // 0, or the errno (all fit in a byte).
                    let byte: u8 =
                        if libc::unshare(libc::CLONE_NEWUSER) == 0 { 0 } else { *libc::__errno_location() as u8 };
                    libc::write(ready_w.as_raw_fd(), (&byte as *const u8).cast(), 1);
                    let mut b = 0u8;
                    libc::read(done_r.as_raw_fd(), (&mut b as *mut u8).cast(), 1);
                    libc::_exit(0)
                }
            }
            ForkResult::Parent { child } => {
                drop((ready_w, done_r));
                let result = (|| {
                    let mut b = [0u8; 1];
                    match nix::unistd::read(ready_r.as_raw_fd(), &mut b)? {
                        1 if b[0] == 0 => {}
                        1 => return Err(Errno::from_raw(b[0] as i32)),
                        _ => return Err(Errno::ECHILD),
                    }
                    let map = format!("0 {host_base} {size}\n");
                    let write = |file: &str| {
                        std::fs::write(format!("/proc/{child}/{file}"), &map)
                            .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))
                    };
                    write("uid_map")?;
                    write("gid_map")?;
                    let fd = nix::fcntl::open(
                        format!("/proc/{child}/ns/user").as_str(),
                        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
                        nix::sys::stat::Mode::empty(),
                    )?;
                    // SAFETY: open returned a new descriptor that nothing else owns.
                    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
                })();
                drop(done_w);
                let _ = waitpid(child, None);
                result
            }
        }
    }
}
