//! Pseudo-terminals inside a sandbox: a new pair from the sandbox's own
//! devpts instance (`/dev/ptmx`), its size, and making its far end a
//! process's controlling terminal. Used by the namespace tier's shim and
//! the gVisor tier's pid 1; the master stays inside the sandbox, so a
//! checkpoint (CRIU or runsc) keeps the terminal with its processes.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use serde::{Deserialize, Serialize};

/// A terminal's size in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TtySize {
    /// Columns.
    pub cols: u16,
    /// Rows.
    pub rows: u16,
}

/// A new terminal: the master (read its output, write its input, resize it)
/// and the far end a process gets as its stdio.
pub struct Pair {
    /// The master side (close-on-exec).
    pub master: OwnedFd,
    /// The far end (close-on-exec; `dup2` it onto a child's stdio).
    pub slave: OwnedFd,
    /// Its number: `/dev/pts/<index>`.
    pub index: u32,
}

fn check(ret: libc::c_int, what: &str) -> std::io::Result<libc::c_int> {
    if ret < 0 {
        let e = std::io::Error::last_os_error();
        return Err(std::io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    Ok(ret)
}

/// Opens a new pair from `/dev/ptmx` of size `size`.
pub fn open_pair(size: TtySize) -> std::io::Result<Pair> {
    // SAFETY: open of a constant NUL-terminated path; the descriptor is checked.
    let m = check(
        unsafe { libc::open(c"/dev/ptmx".as_ptr(), libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) },
        "open /dev/ptmx",
    )?;
    // SAFETY: `m` is a fresh descriptor that nothing else owns.
    let master = unsafe { OwnedFd::from_raw_fd(m) };
    let unlock: libc::c_int = 0;
    // SAFETY: TIOCSPTLCK reads one int from a valid pointer.
    check(unsafe { libc::ioctl(m, libc::TIOCSPTLCK, &unlock) }, "unlock the terminal")?;
    let mut index: libc::c_uint = 0;
    // SAFETY: TIOCGPTN writes one unsigned int to a valid pointer.
    check(unsafe { libc::ioctl(m, libc::TIOCGPTN, &mut index) }, "the terminal's number")?;
    set_size(master.as_raw_fd(), size)?;
    // The far end through the master (no path lookup); by its path where the
    // kernel lacks TIOCGPTPEER (gVisor).
    // SAFETY: TIOCGPTPEER takes open flags by value and returns a new descriptor.
    let s = unsafe { libc::ioctl(m, libc::TIOCGPTPEER, libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) };
    let s = if s >= 0 {
        s
    } else {
        let path = std::ffi::CString::new(format!("/dev/pts/{index}")).expect("no NUL");
        let flags = libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC | libc::O_NOFOLLOW;
        // SAFETY: open of a NUL-terminated path; the descriptor is checked.
        check(unsafe { libc::open(path.as_ptr(), flags) }, "open the terminal's far end")?
    };
    // SAFETY: `s` is a fresh descriptor that nothing else owns.
    let slave = unsafe { OwnedFd::from_raw_fd(s) };
    Ok(Pair { master, slave, index })
}

/// Sets the size of the terminal `fd` (either end); its foreground process
/// group gets SIGWINCH.
pub fn set_size(fd: RawFd, size: TtySize) -> std::io::Result<()> {
    let ws = libc::winsize { ws_row: size.rows, ws_col: size.cols, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCSWINSZ reads one winsize from a valid pointer.
    check(unsafe { libc::ioctl(fd, libc::TIOCSWINSZ, &ws) }, "set the terminal's size").map(drop)
}

/// Reads the size of the terminal `fd`.
pub fn size(fd: RawFd) -> std::io::Result<TtySize> {
    let mut ws = libc::winsize { ws_row: 0, ws_col: 0, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCGWINSZ writes one winsize to a valid pointer.
    check(unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) }, "read the terminal's size")?;
    Ok(TtySize { cols: ws.ws_col, rows: ws.ws_row })
}

/// In a child that has just called `setsid`: the terminal `slave` becomes its
/// controlling terminal and its stdin, stdout and stderr. Raw system calls
/// only (safe between `clone(CLONE_VM)` and exec); returns false on failure.
///
/// # Safety
/// `slave` must be an open descriptor of the terminal's far end.
pub unsafe fn become_controlling(slave: RawFd) -> bool {
    // SAFETY: per the contract, `slave` is open; TIOCSCTTY takes an int by value.
    if unsafe { libc::ioctl(slave, libc::TIOCSCTTY, 0) } != 0 {
        return false;
    }
    (0..3).all(|target| {
        // SAFETY: dup2 onto a stdio descriptor of this child.
        target == slave || unsafe { libc::dup2(slave, target) } >= 0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_has_the_size_asked_and_carries_bytes_both_ways() {
        let pair = match open_pair(TtySize { cols: 132, rows: 50 }) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("skipped: no pseudo-terminals here ({e})");
                return;
            }
        };
        assert_eq!(size(pair.slave.as_raw_fd()).unwrap(), TtySize { cols: 132, rows: 50 });
        set_size(pair.master.as_raw_fd(), TtySize { cols: 100, rows: 30 }).unwrap();
        assert_eq!(size(pair.slave.as_raw_fd()).unwrap(), TtySize { cols: 100, rows: 30 });
        // Raw mode on the far end, so bytes cross unchanged.
        // SAFETY: termios calls on our own open descriptor with a valid struct.
        unsafe {
            let mut t: libc::termios = std::mem::zeroed();
            assert_eq!(libc::tcgetattr(pair.slave.as_raw_fd(), &mut t), 0);
            libc::cfmakeraw(&mut t);
            assert_eq!(libc::tcsetattr(pair.slave.as_raw_fd(), libc::TCSANOW, &t), 0);
        }
        nix::unistd::write(&pair.master, b"to the process").unwrap();
        let mut buf = [0u8; 64];
        let n = nix::unistd::read(pair.slave.as_raw_fd(), &mut buf).unwrap();
        assert_eq!(&buf[..n], b"to the process");
        nix::unistd::write(&pair.slave, b"from it").unwrap();
        let n = nix::unistd::read(pair.master.as_raw_fd(), &mut buf).unwrap();
        assert_eq!(&buf[..n], b"from it");
    }
}
