//! A microVM guest's network interface as its pid 1 sets it up: the address
//! the host gave the sandbox's link, and a default route through the link's
//! gateway, with the classic `SIOC*` ioctls (the guest has no `ip` of its
//! own to rely on; the images are the user's).

use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use nix::errno::Errno;

fn inet_socket() -> nix::Result<OwnedFd> {
    // SAFETY: socket() has no memory-safety preconditions; the fd is owned below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(Errno::last());
    }
    // SAFETY: fd is a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn ifreq(name: &str) -> nix::Result<libc::ifreq> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        return Err(Errno::EINVAL);
    }
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    Ok(req)
}

fn sockaddr(addr: Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr { s_addr: u32::from(addr).to_be() },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr have the same size on Linux; the bytes are copied.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

fn ioctl(sock: &OwnedFd, request: libc::c_ulong, arg: *mut libc::c_void) -> nix::Result<()> {
    // SAFETY: callers pass a request and a pointer to the structure that request takes.
    if unsafe { libc::ioctl(sock.as_raw_fd(), request as _, arg) } < 0 {
        return Err(Errno::last());
    }
    Ok(())
}

/// Sets `IFF_UP | IFF_RUNNING` on interface `name`.
pub fn up(name: &str) -> nix::Result<()> {
    let sock = inet_socket()?;
    let mut req = ifreq(name)?;
    ioctl(&sock, libc::SIOCGIFFLAGS, (&mut req as *mut libc::ifreq).cast())?;
    // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
    unsafe { req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short };
    ioctl(&sock, libc::SIOCSIFFLAGS, (&mut req as *mut libc::ifreq).cast())
}

/// Gives interface `name` the address `addr/prefix` and brings it up.
pub fn set_ipv4(name: &str, addr: Ipv4Addr, prefix: u8) -> nix::Result<()> {
    if prefix > 32 {
        return Err(Errno::EINVAL);
    }
    let sock = inet_socket()?;
    let mut req = ifreq(name)?;
    req.ifr_ifru.ifru_addr = sockaddr(addr);
    ioctl(&sock, libc::SIOCSIFADDR, (&mut req as *mut libc::ifreq).cast())?;
    let mask = if prefix == 0 { 0 } else { u32::MAX << (32 - prefix) };
    req.ifr_ifru.ifru_netmask = sockaddr(Ipv4Addr::from(mask));
    ioctl(&sock, libc::SIOCSIFNETMASK, (&mut req as *mut libc::ifreq).cast())?;
    up(name)
}

/// Adds the default route through `gateway` (`EEXIST`: there is one: done).
pub fn default_route(gateway: Ipv4Addr) -> nix::Result<()> {
    let sock = inet_socket()?;
    // SAFETY: rtentry is plain old data; all-zero is a valid value.
    let mut rt: libc::rtentry = unsafe { std::mem::zeroed() };
    rt.rt_dst = sockaddr(Ipv4Addr::UNSPECIFIED);
    rt.rt_genmask = sockaddr(Ipv4Addr::UNSPECIFIED);
    rt.rt_gateway = sockaddr(gateway);
    rt.rt_flags = libc::RTF_UP | libc::RTF_GATEWAY;
    match ioctl(&sock, libc::SIOCADDRT, (&mut rt as *mut libc::rtentry).cast()) {
        Err(Errno::EEXIST) => Ok(()),
        r => r,
    }
}

/// Waits up to `patience` for interface `name` to appear (its driver probes
/// the device after the module loads).
pub fn wait_for(name: &str, patience: std::time::Duration) -> bool {
    let t = std::time::Instant::now();
    let path = std::path::Path::new("/sys/class/net").join(name);
    while !path.exists() {
        if t.elapsed() > patience {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_prefixes_are_checked_before_any_ioctl() {
        assert_eq!(ifreq("").err(), Some(Errno::EINVAL));
        assert_eq!(ifreq("a-name-longer-than-15").err(), Some(Errno::EINVAL));
        assert_eq!(set_ipv4("eth0", Ipv4Addr::new(10, 0, 0, 2), 33), Err(Errno::EINVAL));
        let s = sockaddr(Ipv4Addr::new(10, 1, 2, 3));
        assert_eq!(s.sa_family, libc::AF_INET as libc::sa_family_t);
        assert_eq!(&s.sa_data[2..6], &[10, 1, 2, 3].map(|b| b as libc::c_char));
    }
}
