//! Bringing a network namespace's (or a guest's) `lo` up: the namespace
//! tier's setup (strata-runtime's `Sys::loopback_up`) and a microVM's
//! pid 1 ([`crate::vm`]) both do it with these two ioctls.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use nix::errno::Errno;

/// Sets `IFF_UP | IFF_RUNNING` on `lo` (`SIOCGIFFLAGS`, then `SIOCSIFFLAGS`).
pub fn up() -> nix::Result<()> {
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
