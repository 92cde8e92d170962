//! Sockets inside a sandbox's network namespace ([`crate::Runtime::net_sockets`]
//! of the namespace tier): a dedicated thread joins the namespace once
//! (`setns` through [`Sys`]), then makes sockets (`socket()` only: the caller
//! connects, and a socket stays in the namespace it was made in), and ends
//! after its idle time without requests so it does not pin the namespace. A
//! dedicated thread, never a pooled one, which would stay in the namespace for
//! whatever it ran next.
//!
//! It keeps [`SPARES`] sockets made ahead: a request takes one at once, on the
//! caller's thread, and the maker makes its replacement afterwards, so a new
//! connection into the sandbox costs no hop to another thread (measured: that
//! hop, a wake-up of the maker and one of the caller, was a tenth of a proxied
//! preview request on a fresh connection). The spares go when the maker ends.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use nix::sched::CloneFlags;
use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};

use crate::sys::Sys;
use crate::NetSockets;

/// One request: where the socket goes.
type Reply = Box<dyn FnOnce(io::Result<OwnedFd>) + Send>;

/// Sockets a maker keeps made ahead.
pub const SPARES: usize = 4;

/// What the maker's thread is asked.
enum Ask {
    /// A socket, for this reply.
    Socket(Reply),
    /// A spare was taken: make its replacement.
    Refill,
}

/// The socket maker of one network namespace.
pub struct NetnsSockets {
    tx: mpsc::Sender<Ask>,
    /// Sockets made ahead (none until the namespace was joined).
    spares: Arc<Mutex<Vec<OwnedFd>>>,
}

impl std::fmt::Debug for NetnsSockets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetnsSockets").finish_non_exhaustive()
    }
}

impl NetSockets for NetnsSockets {
    fn socket(&self, reply: Reply) -> bool {
        let spare = self.spares.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match spare {
            // A maker that has ended took its spares with it: a spare here means it lives.
            Some(fd) => {
                reply(Ok(fd));
                let _ = self.tx.send(Ask::Refill);
                true
            }
            None => self.tx.send(Ask::Socket(reply)).is_ok(),
        }
    }
}

/// A new IPv4 stream socket, non-blocking and close-on-exec, in the calling
/// thread's network namespace.
pub fn tcp_socket() -> io::Result<OwnedFd> {
    socket(AddressFamily::Inet, SockType::Stream, SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC, None)
        .map_err(io::Error::from)
}

/// Starts the maker of the namespace `ns` (an open `/proc/<pid>/ns/net`),
/// joining it with `sys`. A namespace that cannot be joined answers every
/// request with the error, and the maker ends after the first.
pub fn spawn(sys: Arc<dyn Sys>, ns: File, idle: Duration) -> io::Result<NetnsSockets> {
    let (tx, rx) = mpsc::channel::<Ask>();
    let spares: Arc<Mutex<Vec<OwnedFd>>> = Arc::default();
    let kept = spares.clone();
    std::thread::Builder::new().name("netns-sockets".into()).spawn(move || {
        let joined = sys.setns(ns.as_fd(), CloneFlags::CLONE_NEWNET).map_err(io::Error::from);
        drop(ns);
        let refill = || {
            let have = kept.lock().unwrap_or_else(|p| p.into_inner()).len();
            let made: Vec<OwnedFd> = (have..SPARES).map_while(|_| tcp_socket().ok()).collect();
            kept.lock().unwrap_or_else(|p| p.into_inner()).extend(made);
        };
        if joined.is_ok() {
            refill();
        }
        while let Ok(ask) = rx.recv_timeout(idle) {
            match (ask, &joined) {
                (Ask::Socket(reply), Ok(())) => {
                    reply(tcp_socket());
                    refill();
                }
                (Ask::Refill, Ok(())) => refill(),
                (Ask::Socket(reply), Err(e)) => {
                    reply(Err(io::Error::new(e.kind(), format!("joining the sandbox's network namespace: {e}"))));
                    return;
                }
                (Ask::Refill, Err(_)) => return,
            }
        }
        // Idle or forgotten: the spares must not keep the namespace alive.
        kept.lock().unwrap_or_else(|p| p.into_inner()).clear();
    })?;
    Ok(NetnsSockets { tx, spares })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::{RecordingSys, SysCall};

    /// Asks `maker` for a socket and waits for it.
    fn ask(maker: &NetnsSockets) -> Option<io::Result<OwnedFd>> {
        let (tx, rx) = mpsc::channel();
        if !maker.socket(Box::new(move |s| drop(tx.send(s)))) {
            return None;
        }
        rx.recv_timeout(Duration::from_secs(5)).ok()
    }

    #[test]
    fn the_thread_joins_the_namespace_once_and_makes_connectable_sockets() {
        let sys = Arc::new(RecordingSys::new());
        let ns = File::open("/proc/self/ns/net").expect("own netns");
        let maker = spawn(sys.clone(), ns, Duration::from_secs(5)).expect("spawn");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        for _ in 0..3 {
            let fd = ask(&maker).expect("answered").expect("a socket");
            let s = std::net::TcpStream::from(fd);
            s.set_nonblocking(false).expect("blocking");
            // Unconnected: connecting is the caller's.
            assert!(s.peer_addr().is_err());
            let addr = nix::sys::socket::SockaddrIn::from(match listener.local_addr().unwrap() {
                std::net::SocketAddr::V4(a) => a,
                std::net::SocketAddr::V6(_) => unreachable!(),
            });
            nix::sys::socket::connect(std::os::fd::AsRawFd::as_raw_fd(&s), &addr).expect("connect");
            listener.accept().expect("accepted");
        }
        let calls = sys.calls();
        assert_eq!(calls.len(), 1, "one setns for every socket: {calls:?}");
        assert!(
            matches!(&calls[0], SysCall::Setns { nstype, target: Some(t) } if *nstype == CloneFlags::CLONE_NEWNET && t.to_string_lossy().starts_with("net:[")),
            "{calls:?}"
        );
    }

    #[test]
    fn a_namespace_that_cannot_be_joined_answers_the_error_then_ends() {
        let rec = Arc::new(RecordingSys::new());
        rec.fail_when(|c| matches!(c, SysCall::Setns { .. }), nix::errno::Errno::EPERM);
        let ns = File::open("/proc/self/ns/net").expect("own netns");
        let maker = spawn(rec, ns, Duration::from_secs(5)).expect("spawn");
        let err = ask(&maker).expect("answered").expect_err("no socket");
        assert!(err.to_string().contains("network namespace"), "{err}");
        // The thread has ended: the next request is refused or never answered.
        std::thread::sleep(Duration::from_millis(50));
        assert!(ask(&maker).is_none(), "a failed maker is not reused");
    }

    #[test]
    fn an_idle_maker_ends() {
        let ns = File::open("/proc/self/ns/net").expect("own netns");
        let maker = spawn(Arc::new(RecordingSys::new()), ns, Duration::from_millis(20)).expect("spawn");
        std::thread::sleep(Duration::from_millis(200));
        assert!(ask(&maker).is_none(), "ended after its idle time");
    }
}
