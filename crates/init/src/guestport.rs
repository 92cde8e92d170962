//! Connections into a microVM guest's ports (previews and the E2B port
//! routing): nothing on the host reaches a server on the guest's own
//! loopback (and a guest with `--network none` has no link at all), so pid 1
//! connects to `127.0.0.1:port` inside and relays the bytes over the stream
//! the host opened ([`crate::spawner::Request::Connect`]).
//!
//! Such a stream, and a directory watch's ([`crate::guestwatch`]), lives on
//! in a thread of its own after pid 1 answered, so pid 1 keeps their sockets
//! ([`Cuts`]) to end them when the VM is saved: a snapshot is taken with no
//! stream open on the line (the detach before it cuts them), and their host
//! ends belong to the keeper of the time, which a restored guest no longer
//! has (a restore cuts whatever is left).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::channel::{self, Frame};

/// How long pid 1 waits for a port in the guest to accept.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The sockets of pid 1's long-lived streams, to be cut at a restore.
#[derive(Clone, Default)]
pub struct Cuts(Arc<Mutex<CutsInner>>);

#[derive(Default)]
struct CutsInner {
    next: u64,
    live: HashMap<u64, Vec<OwnedFd>>,
}

/// Holds a stream's sockets in [`Cuts`] until dropped (its thread ended).
pub struct CutGuard {
    cuts: Cuts,
    id: u64,
}

impl Cuts {
    /// Registers the sockets of one long-lived stream (duplicates are kept,
    /// so a cut reaches them whatever their thread holds).
    pub fn register(&self, socks: &[BorrowedFd<'_>]) -> CutGuard {
        let dups: Vec<OwnedFd> = socks.iter().filter_map(|s| s.try_clone_to_owned().ok()).collect();
        let mut inner = self.0.lock().unwrap_or_else(|p| p.into_inner());
        inner.next += 1;
        let id = inner.next;
        inner.live.insert(id, dups);
        CutGuard { cuts: self.clone(), id }
    }

    /// Shuts every registered socket down both ways: their threads see the
    /// end of their streams and finish. How many streams were cut.
    pub fn cut_all(&self) -> usize {
        let inner = self.0.lock().unwrap_or_else(|p| p.into_inner());
        for fd in inner.live.values().flatten() {
            let _ = nix::sys::socket::shutdown(std::os::fd::AsRawFd::as_raw_fd(fd), nix::sys::socket::Shutdown::Both);
        }
        inner.live.len()
    }

    /// [`Cuts::cut_all`], then waits up to `patience` for their threads to
    /// end (each closes its sockets before it leaves the registry): a
    /// checkpoint that follows meets none of them. How many were cut.
    pub fn cut_all_and_wait(&self, patience: Duration) -> usize {
        let cut = self.cut_all();
        let deadline = std::time::Instant::now() + patience;
        while !self.is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        cut
    }

    /// How many long-lived streams are open.
    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).live.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl CutGuard {
    /// Adds a socket to this stream's entry (one made after it was registered).
    pub fn also(&self, sock: BorrowedFd<'_>) {
        if let Ok(dup) = sock.try_clone_to_owned() {
            let mut inner = self.cuts.0.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(fds) = inner.live.get_mut(&self.id) {
                fds.push(dup);
            }
        }
    }
}

impl Drop for CutGuard {
    fn drop(&mut self) {
        self.cuts.0.lock().unwrap_or_else(|p| p.into_inner()).live.remove(&self.id);
    }
}

/// Serves [`crate::spawner::Request::Connect`] on `host` (blocking, in a
/// thread of its own): connects to `127.0.0.1:port`, answers
/// [`Frame::Signaled`] 1 (or [`Frame::Failed`] with the reason), then relays
/// bytes both ways until both directions ended; `early` is what the host sent
/// after its request, before the answer (it goes to the port first).
pub fn relay(host: UnixStream, early: Vec<u8>, port: u16, cuts: &Cuts) {
    // Registered before anything can block: a cut (a save coming) ends it at any step.
    let held = cuts.register(&[host.as_fd()]);
    connect_and_pump(host, early, port, &held);
    // The streams are closed (by the call above) before the registry lets go of them.
    drop(held);
}

/// [`relay`]'s work; consumes (and so closes) its streams before it returns.
fn connect_and_pump(mut host: UnixStream, early: Vec<u8>, port: u16, held: &CutGuard) {
    if host.set_nonblocking(false).is_err() {
        return;
    }
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let tcp = match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
        Ok(t) => t,
        Err(e) => {
            let why = format!("port {port} in the guest: {e}");
            let _ = channel::write_frame(&mut host, Frame::Failed, why.as_bytes());
            return;
        }
    };
    let _ = tcp.set_nodelay(true);
    held.also(tcp.as_fd());
    pump_both(host, tcp, early);
}

/// Answers that the port is connected, then copies both ways until both
/// directions ended; consumes (and so closes) both streams.
fn pump_both(mut host: UnixStream, tcp: TcpStream, early: Vec<u8>) {
    if channel::write_frame(&mut host, Frame::Signaled, &1u32.to_le_bytes()).is_err() {
        return;
    }
    let (Ok(mut to_port), Ok(mut from_host)) = (tcp.try_clone(), host.try_clone()) else { return };
    let inbound = std::thread::spawn(move || {
        if to_port.write_all(&early).is_ok() {
            let _ = pump(&mut from_host, &mut to_port);
        }
        let _ = to_port.shutdown(Shutdown::Write);
    });
    let (mut from_port, mut to_host) = (tcp, host);
    let _ = pump(&mut from_port, &mut to_host);
    let _ = to_host.shutdown(Shutdown::Write);
    let _ = inbound.join();
}

/// Copies `from` to `to` until `from` ends (or either fails).
fn pump(from: &mut impl Read, to: &mut impl Write) -> std::io::Result<u64> {
    let mut buf = vec![0u8; 64 << 10];
    let mut total = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&buf[..n])?;
        total += n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_is_relayed_both_ways_with_half_closes_and_the_early_bytes_first() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        // An echo server that upper-cases what it reads until its end, then closes.
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).unwrap();
            s.write_all(&got.to_ascii_uppercase()).unwrap();
        });
        let (mut host, guest) = UnixStream::pair().unwrap();
        let cuts = Cuts::default();
        let c2 = cuts.clone();
        let t = std::thread::spawn(move || relay(guest, b"early ".to_vec(), port, &c2));
        let answer = channel::read_one_frame(&mut host, 64).unwrap();
        assert_eq!(answer, Some((Frame::Signaled, 1u32.to_le_bytes().to_vec())));
        host.write_all(b"bytes").unwrap();
        host.shutdown(Shutdown::Write).unwrap();
        let mut back = String::new();
        host.read_to_string(&mut back).unwrap();
        assert_eq!(back, "EARLY BYTES");
        t.join().unwrap();
        server.join().unwrap();
        assert!(cuts.is_empty(), "an ended relay leaves nothing registered");
    }

    #[test]
    fn a_closed_port_is_refused_with_the_reason_and_a_cut_ends_a_relay() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        let (mut host, guest) = UnixStream::pair().unwrap();
        relay(guest, Vec::new(), port, &Cuts::default());
        match channel::read_one_frame(&mut host, 4096).unwrap() {
            Some((Frame::Failed, why)) => {
                let why = String::from_utf8(why).unwrap();
                assert!(why.contains(&format!("port {port} in the guest")), "{why}");
            }
            other => panic!("{other:?}"),
        }

        // A server that never closes: only a cut ends the relay.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            std::thread::sleep(Duration::from_secs(30));
            drop(s);
        });
        let (mut host, guest) = UnixStream::pair().unwrap();
        let cuts = Cuts::default();
        let c2 = cuts.clone();
        let t = std::thread::spawn(move || relay(guest, Vec::new(), port, &c2));
        assert!(matches!(channel::read_one_frame(&mut host, 64).unwrap(), Some((Frame::Signaled, _))));
        assert_eq!(cuts.cut_all(), 1);
        t.join().unwrap();
        assert!(cuts.is_empty());
        drop(server);
    }
}
