//! Sockets inside a sandbox's network namespace ([`crate::Runtime::net_sockets`]
//! of the namespace tier): a dedicated thread joins the namespace once
//! (`setns` through [`Sys`]), then makes sockets on request (`socket()` only:
//! the caller connects, and a socket stays in the namespace it was made in),
//! and ends after its idle time without requests so it does not pin the
//! namespace. A dedicated thread, never a pooled one, which would stay in the
//! namespace for whatever it ran next.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use nix::sched::CloneFlags;
use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};

use crate::sys::Sys;
use crate::NetSockets;

/// One request: where the socket goes.
type Reply = Box<dyn FnOnce(io::Result<OwnedFd>) + Send>;

/// The socket maker of one network namespace.
#[derive(Debug)]
pub struct NetnsSockets {
    tx: mpsc::Sender<Reply>,
}

impl NetSockets for NetnsSockets {
    fn socket(&self, reply: Reply) -> bool {
        self.tx.send(reply).is_ok()
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
    let (tx, rx) = mpsc::channel::<Reply>();
    std::thread::Builder::new().name("netns-sockets".into()).spawn(move || {
        let joined = sys.setns(ns.as_fd(), CloneFlags::CLONE_NEWNET).map_err(io::Error::from);
        drop(ns);
        while let Ok(reply) = rx.recv_timeout(idle) {
            match &joined {
                Ok(()) => reply(tcp_socket()),
                Err(e) => {
                    reply(Err(io::Error::new(e.kind(), format!("joining the sandbox's network namespace: {e}"))));
                    return;
                }
            }
        }
    })?;
    Ok(NetnsSockets { tx })
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
