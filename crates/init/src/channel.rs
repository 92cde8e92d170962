//! The gVisor tier's exec channel: host processes talk to the sandbox's
//! pid 1 over unix stream connections that pid 1 opens to the host, so that
//! an exec needs no `runsc exec` (which costs a runsc process and a second
//! process in the sentry per exec, and leaves state in the sentry that makes
//! every later checkpoint slower: measured, docs/design/gvisor-tier.md §12).
//!
//! * **The broker** ([`serve_broker`], in the sandbox's keeper on the host)
//!   listens on [`BROKER_SOCKET`] in a small host tmpfs bound into the sandbox
//!   at [`CHAN_DIR`] (runsc `--host-uds=open`: the sentry may connect to host
//!   sockets, never create them, so the sandbox's own unix sockets stay the
//!   sentry's). Pid 1 keeps [`SPARES`] idle connections to it. A host process
//!   asks the broker on its private control socket ([`take`]) and gets one of
//!   them, passed with `SCM_RIGHTS`. [`pause`] stops the broker (no listener,
//!   no idle connection: before a checkpoint, which refuses host sockets) and
//!   [`listen`] starts it again.
//! * **Frames** ([`Frame`], [`write_frame`], [`FrameReader`]): a kind byte, a
//!   little-endian u32 length, the payload (at most [`MAX_FRAME`]).
//! * **Proof**: anything in the sandbox can connect to the broker, so a
//!   connection could be an impostor's. The host side opens with
//!   [`Frame::Hello`] (a fresh nonce); pid 1 answers [`Frame::Proof`],
//!   HMAC-SHA256 of the nonce under the sandbox's token, which the host wrote
//!   to [`TOKEN_FILE`] (mode 0600, uid 0, on the read-only channel mount)
//!   before the sandbox started ([`prove`], [`check_proof`]). A process of
//!   another user inside cannot read it, so it cannot pose as pid 1 to the
//!   host; the sandbox's root can, and gains nothing it lacks: it already
//!   rules its own sandbox, and the channel reaches nothing else.

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

/// Where the channel's host directory is bound inside the sandbox.
pub const CHAN_DIR: &str = "/run/strata/chan";
/// The broker's socket, inside the sandbox (`<bundle>/chan/broker.sock` on the host).
pub const BROKER_SOCKET: &str = "/run/strata/chan/broker.sock";
/// The sandbox's token, inside (written by the host before the sandbox starts).
pub const TOKEN_FILE: &str = "/run/strata/chan/token";
/// File name of the broker socket and the token in the channel directory.
pub const BROKER_NAME: &str = "broker.sock";
/// See [`BROKER_NAME`].
pub const TOKEN_NAME: &str = "token";
/// Idle connections pid 1 keeps open to the broker.
pub const SPARES: usize = 2;
/// Idle connections the broker holds at most (the oldest go first).
pub const MAX_IDLE: usize = 16;
/// Largest frame payload.
pub const MAX_FRAME: usize = 1 << 20;
/// Bytes of a token, a nonce and a proof.
pub const TOKEN_LEN: usize = 32;
/// How long [`take`] waits for pid 1 to offer a connection.
pub const TAKE_PATIENCE: Duration = Duration::from_secs(5);

/// The kinds of frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Frame {
    /// Host: a nonce; pid 1 answers [`Frame::Proof`].
    Hello = 1,
    /// Pid 1: HMAC-SHA256(token, nonce).
    Proof = 2,
    /// Host: a [`crate::spawner::Request`] as JSON.
    Request = 3,
    /// Host: bytes for the attached process's stdin.
    Stdin = 4,
    /// Host: the end of its stdin (pid 1 closes the process's).
    StdinEof = 5,
    /// Pid 1: the process runs (its pid, i32 LE).
    Started = 16,
    /// Pid 1: output of the process.
    Stdout = 17,
    /// Pid 1: its error output.
    Stderr = 18,
    /// Pid 1: it ended ([`crate::spawner::Status`] as JSON).
    Ended = 19,
    /// Pid 1: the request failed (the reason, UTF-8).
    Failed = 20,
    /// Pid 1: let go now (another connection took the process, or a checkpoint comes).
    LetGo = 21,
    /// Pid 1: every other connection was let go (their number, u32 LE).
    Detached = 22,
    /// Pid 1: how many processes a signal reached (u32 LE).
    Signaled = 23,
}

impl Frame {
    fn of(b: u8) -> Option<Frame> {
        use Frame::*;
        Some(match b {
            1 => Hello,
            2 => Proof,
            3 => Request,
            4 => Stdin,
            5 => StdinEof,
            16 => Started,
            17 => Stdout,
            18 => Stderr,
            19 => Ended,
            20 => Failed,
            21 => LetGo,
            22 => Detached,
            23 => Signaled,
            _ => return None,
        })
    }
}

/// Appends one frame to `out`.
pub fn encode(out: &mut Vec<u8>, kind: Frame, payload: &[u8]) {
    out.push(kind as u8);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(payload);
}

/// Writes one frame (blocking).
pub fn write_frame(w: &mut impl Write, kind: Frame, payload: &[u8]) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(5 + payload.len());
    encode(&mut buf, kind, payload);
    w.write_all(&buf)
}

/// Why a byte stream is not frames.
#[derive(Debug, PartialEq, Eq)]
pub struct BadFrame(pub String);

/// Splits a byte stream into frames as it arrives.
#[derive(Debug, Default)]
pub struct FrameReader {
    buf: Vec<u8>,
}

impl FrameReader {
    /// Adds bytes read from the stream.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole frame, if one has arrived.
    pub fn next_frame(&mut self) -> Result<Option<(Frame, Vec<u8>)>, BadFrame> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let kind = Frame::of(self.buf[0]).ok_or_else(|| BadFrame(format!("unknown frame kind {}", self.buf[0])))?;
        let len = u32::from_le_bytes(self.buf[1..5].try_into().expect("4 bytes")) as usize;
        if len > MAX_FRAME {
            return Err(BadFrame(format!("a frame of {len} bytes (at most {MAX_FRAME})")));
        }
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        let payload = self.buf[5..5 + len].to_vec();
        self.buf.drain(..5 + len);
        Ok(Some((kind, payload)))
    }

    /// Whether no byte of a next frame has arrived.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The bytes that arrived after the last whole frame (the reader is empty after).
    pub fn take_rest(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }

    /// Reads from `r` (blocking) until a whole frame is there; `None` at the end of the stream.
    pub fn read_from(&mut self, r: &mut impl Read) -> std::io::Result<Option<(Frame, Vec<u8>)>> {
        let mut chunk = [0u8; 64 << 10];
        loop {
            if let Some(f) = self.next_frame().map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.0))? {
                return Ok(Some(f));
            }
            match r.read(&mut chunk) {
                Ok(0) => return Ok(None),
                Ok(n) => self.push(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// Reads exactly one frame from `r` (blocking), and no byte after it: what
/// follows on the stream stays there for whoever reads next (a relayed
/// connection's bytes after pid 1's answer). `None` at the end of the stream;
/// a payload longer than `max` is an error.
pub fn read_one_frame(r: &mut impl Read, max: usize) -> std::io::Result<Option<(Frame, Vec<u8>)>> {
    let mut header = [0u8; 5];
    loop {
        match r.read(&mut header[..1]) {
            Ok(0) => return Ok(None),
            Ok(_) => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    r.read_exact(&mut header[1..])?;
    let bad = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidData, why);
    let kind = Frame::of(header[0]).ok_or_else(|| bad(format!("unknown frame kind {}", header[0])))?;
    let len = u32::from_le_bytes(header[1..].try_into().expect("4 bytes")) as usize;
    if len > max.min(MAX_FRAME) {
        return Err(bad(format!("a {kind:?} frame of {len} bytes (at most {})", max.min(MAX_FRAME))));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload)?;
    Ok(Some((kind, payload)))
}

/// Fresh random bytes (a token or a nonce) from the kernel.
pub fn random_bytes() -> std::io::Result<[u8; TOKEN_LEN]> {
    let mut b = [0u8; TOKEN_LEN];
    let mut got = 0;
    while got < b.len() {
        // SAFETY: getrandom writes at most the given length into our buffer.
        let n = unsafe { libc::getrandom(b[got..].as_mut_ptr().cast(), b.len() - got, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        got += n as usize;
    }
    Ok(b)
}

/// Pid 1's answer to `nonce` under `token`.
pub fn prove(token: &[u8], nonce: &[u8]) -> [u8; 32] {
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(token).expect("HMAC takes any key length");
    mac.update(nonce);
    mac.finalize().into_bytes().into()
}

/// Whether `proof` answers `nonce` under `token` (compared in constant time).
pub fn check_proof(token: &[u8], nonce: &[u8], proof: &[u8]) -> bool {
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(token).expect("HMAC takes any key length");
    mac.update(nonce);
    mac.verify_slice(proof).is_ok()
}

/// Opens `conn` from the host's side: sends a nonce and checks pid 1's
/// proof. Returns a reader holding whatever arrived after it.
pub fn open_as_host(conn: &mut std::os::unix::net::UnixStream, token: &[u8]) -> std::io::Result<FrameReader> {
    let nonce = random_bytes()?;
    write_frame(conn, Frame::Hello, &nonce)?;
    let mut reader = FrameReader::default();
    match reader.read_from(conn)? {
        Some((Frame::Proof, p)) if check_proof(token, &nonce, &p) => Ok(reader),
        Some((Frame::Proof, _)) => {
            Err(std::io::Error::other("the connection's far end is not the sandbox's init (wrong proof)"))
        }
        Some((k, _)) => Err(std::io::Error::other(format!("unexpected {k:?} before the proof"))),
        None => Err(std::io::Error::other("the connection closed before the proof")),
    }
}

// ---- the broker ----

/// One command on the broker's control socket (a microVM's keeper answers
/// [`TAKE`] too, and commands of its own).
pub const TAKE: u8 = b't';
const PAUSE: u8 = b'p';
const LISTEN: u8 = b'l';
/// The broker's answers: a connection (with the descriptor), done, or an error line.
const GIVE: u8 = b'G';
const DONE: u8 = b'D';
const ERROR: u8 = b'E';

fn control(control_socket: &Path, cmd: u8) -> std::io::Result<Option<OwnedFd>> {
    command(control_socket, &[cmd])
}

/// Sends `cmd` (its first byte names it) on a control socket and returns
/// the descriptor answered, if any (`Ok(None)`: done; an error answer is an `Err`).
pub fn command(control_socket: &Path, cmd: &[u8]) -> std::io::Result<Option<OwnedFd>> {
    let s = std::os::unix::net::UnixStream::connect(control_socket)?;
    s.set_read_timeout(Some(TAKE_PATIENCE + Duration::from_secs(2)))?;
    (&s).write_all(cmd)?;
    let mut byte = [0u8; 1];
    let mut cmsg = nix::cmsg_space!([RawFd; 1]);
    let (n, fd) = {
        let mut iov = [IoSliceMut::new(&mut byte)];
        let msg = recvmsg::<()>(s.as_raw_fd(), &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC)?;
        let mut fd = None;
        for c in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(got) = c {
                for f in got {
                    // SAFETY: a descriptor received with SCM_RIGHTS is new and ours.
                    let owned = unsafe { OwnedFd::from_raw_fd(f) };
                    fd.get_or_insert(owned);
                }
            }
        }
        (msg.bytes, fd)
    };
    match (n, byte[0]) {
        (1, GIVE) if fd.is_some() => Ok(fd),
        (1, DONE) => Ok(None),
        (1, ERROR) => {
            let mut why = String::new();
            let _ = (&s).take(4096).read_to_string(&mut why);
            Err(std::io::Error::other(why.trim().to_string()))
        }
        _ => Err(std::io::Error::other("the sandbox's broker answered nothing")),
    }
}

/// Asks the broker at `control_socket` for one of pid 1's connections.
pub fn take(control_socket: &Path) -> std::io::Result<std::os::unix::net::UnixStream> {
    match control(control_socket, TAKE)? {
        Some(fd) => Ok(std::os::unix::net::UnixStream::from(fd)),
        None => Err(std::io::Error::other("the broker gave no connection")),
    }
}

/// Takes one of pid 1's connections and stops the broker: no listener, no
/// idle connection left (pid 1 closes the rest when told to detach).
pub fn pause(control_socket: &Path) -> std::io::Result<std::os::unix::net::UnixStream> {
    match control(control_socket, PAUSE)? {
        Some(fd) => Ok(std::os::unix::net::UnixStream::from(fd)),
        None => Err(std::io::Error::other("the broker gave no connection")),
    }
}

/// Starts the broker listening again (after a checkpoint that left the sandbox running).
pub fn listen(control_socket: &Path) -> std::io::Result<()> {
    control(control_socket, LISTEN).map(drop)
}

/// A non-blocking listener at `path` (anything there before is replaced) with `mode`.
pub fn bind_listener(path: &Path, mode: u32) -> std::io::Result<std::os::unix::net::UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::remove_file(path);
    let l = std::os::unix::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// Answers a [`TAKE`] with `conn`.
pub fn hand_over(to: &std::os::unix::net::UnixStream, conn: BorrowedFd<'_>) -> nix::Result<()> {
    give(to.as_fd(), Some(conn), GIVE)
}

/// Answers a command that gives nothing back: done.
pub fn answer_done(to: &std::os::unix::net::UnixStream) -> nix::Result<()> {
    give(to.as_fd(), None, DONE)
}

fn give(to: BorrowedFd<'_>, fd: Option<BorrowedFd<'_>>, answer: u8) -> nix::Result<()> {
    let iov = [IoSlice::new(std::slice::from_ref(&answer))];
    let raw: Vec<RawFd> = fd.iter().map(|f| f.as_raw_fd()).collect();
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let cmsgs: &[ControlMessage] = if raw.is_empty() { &[] } else { &cmsg };
    sendmsg::<()>(to.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None).map(drop)
}

/// Answers a command with an error line.
pub fn refuse(to: &std::os::unix::net::UnixStream, why: &str) {
    let _ = give(to.as_fd(), None, ERROR);
    let _ = (&*to).write_all(why.as_bytes());
}

/// The broker's life (a thread of the sandbox's keeper): listens for pid 1
/// on `broker_socket` and for host processes on `control_socket` (mode 0600,
/// outside the sandbox), hands each `take` the oldest idle connection of
/// pid 1's (waiting up to [`TAKE_PATIENCE`] for one). Returns when the
/// control socket fails.
pub fn serve_broker(broker_socket: &Path, control_socket: &Path) -> std::io::Result<()> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let control_l = bind_listener(control_socket, 0o600)?;
    let mut pid1_l = Some(bind_listener(broker_socket, 0o666)?);
    let mut idle: std::collections::VecDeque<std::os::unix::net::UnixStream> = Default::default();
    // Host processes waiting for a connection: (them, pause after, deadline).
    let mut waiting: std::collections::VecDeque<(std::os::unix::net::UnixStream, bool, Instant)> = Default::default();
    loop {
        // Hand out what there is.
        while !waiting.is_empty() && !idle.is_empty() {
            let (who, then_pause, _) = waiting.pop_front().expect("not empty");
            let conn = idle.pop_front().expect("not empty");
            if then_pause {
                // Paused before the answer: whoever asked may rely on it.
                pid1_l = None;
                let _ = std::fs::remove_file(broker_socket);
                idle.clear();
            }
            let _ = give(who.as_fd(), Some(conn.as_fd()), GIVE);
        }
        let now = Instant::now();
        while waiting.front().is_some_and(|(_, _, d)| *d < now) {
            let (who, _, _) = waiting.pop_front().expect("not empty");
            refuse(&who, "the sandbox's init offered no connection in time (is it running?)");
        }
        let mut fds = vec![PollFd::new(control_l.as_fd(), PollFlags::POLLIN)];
        if let Some(l) = &pid1_l {
            fds.push(PollFd::new(l.as_fd(), PollFlags::POLLIN));
        }
        let idle_at = fds.len();
        fds.extend(idle.iter().map(|c| PollFd::new(c.as_fd(), PollFlags::POLLIN)));
        let timeout = if waiting.is_empty() { 1000u16 } else { 20 };
        if poll(&mut fds, PollTimeout::from(timeout)).is_err() {
            continue;
        }
        let ready: Vec<bool> = fds.iter().map(|f| f.revents().is_some_and(|r| !r.is_empty())).collect();
        drop(fds);
        // An idle connection that reads is one pid 1 (or a stranger) closed: drop it.
        let mut i = idle_at;
        idle.retain(|_| {
            i += 1;
            !ready[i - 1]
        });
        if let (Some(l), true) = (&pid1_l, ready.get(1).copied().unwrap_or(false)) {
            while let Ok((c, _)) = l.accept() {
                let _ = c.set_nonblocking(false);
                idle.push_back(c);
                // Anything inside may connect: keep the newest few (pid 1 reconnects
                // what it loses), never a descriptor per connection it opens.
                if idle.len() > MAX_IDLE {
                    idle.pop_front();
                }
            }
        }
        if ready[0] {
            while let Ok((c, _)) = control_l.accept() {
                let _ = c.set_nonblocking(false);
                let _ = c.set_read_timeout(Some(Duration::from_secs(1)));
                let mut cmd = [0u8; 1];
                if (&c).read_exact(&mut cmd).is_err() {
                    continue;
                }
                match cmd[0] {
                    TAKE | PAUSE if pid1_l.is_none() => refuse(&c, "the sandbox's channel is paused (a checkpoint)"),
                    TAKE => waiting.push_back((c, false, Instant::now() + TAKE_PATIENCE)),
                    PAUSE => waiting.push_back((c, true, Instant::now() + TAKE_PATIENCE)),
                    LISTEN => {
                        if pid1_l.is_none() {
                            match bind_listener(broker_socket, 0o666) {
                                Ok(l) => pid1_l = Some(l),
                                Err(e) => {
                                    refuse(&c, &format!("listen on {}: {e}", broker_socket.display()));
                                    continue;
                                }
                            }
                        }
                        let _ = give(c.as_fd(), None, DONE);
                    }
                    _ => refuse(&c, "unknown command"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_wherever_the_bytes_break() {
        let mut wire = Vec::new();
        encode(&mut wire, Frame::Started, &7i32.to_le_bytes());
        encode(&mut wire, Frame::Stdout, b"hello");
        encode(&mut wire, Frame::StdinEof, b"");
        let mut r = FrameReader::default();
        let mut got = Vec::new();
        for b in &wire {
            r.push(std::slice::from_ref(b));
            while let Some(f) = r.next_frame().unwrap() {
                got.push(f);
            }
        }
        assert_eq!(
            got,
            [
                (Frame::Started, 7i32.to_le_bytes().to_vec()),
                (Frame::Stdout, b"hello".to_vec()),
                (Frame::StdinEof, vec![])
            ]
        );
        let mut bad = FrameReader::default();
        bad.push(&[99, 0, 0, 0, 0]);
        assert!(bad.next_frame().unwrap_err().0.contains("unknown frame kind 99"));
        let mut big = FrameReader::default();
        big.push(&[17, 0xff, 0xff, 0xff, 0x7f]);
        assert!(big.next_frame().unwrap_err().0.contains("at most"));
    }

    #[test]
    fn one_frame_is_read_and_what_follows_stays_on_the_stream() {
        let mut wire = Vec::new();
        encode(&mut wire, Frame::Signaled, &1u32.to_le_bytes());
        wire.extend_from_slice(b"HTTP/1.1 200 OK");
        let mut r = std::io::Cursor::new(wire);
        assert_eq!(read_one_frame(&mut r, 16).unwrap(), Some((Frame::Signaled, 1u32.to_le_bytes().to_vec())));
        let mut rest = String::new();
        r.read_to_string(&mut rest).unwrap();
        assert_eq!(rest, "HTTP/1.1 200 OK", "the relayed bytes are left to the next reader");
        assert_eq!(read_one_frame(&mut std::io::Cursor::new(Vec::new()), 16).unwrap(), None);
        let mut long = Vec::new();
        encode(&mut long, Frame::Failed, &[b'x'; 17]);
        assert!(read_one_frame(&mut std::io::Cursor::new(long), 16).unwrap_err().to_string().contains("at most 16"));
        let cut = vec![Frame::Failed as u8, 4, 0];
        assert!(read_one_frame(&mut std::io::Cursor::new(cut), 16).is_err(), "a header cut short");
    }

    #[test]
    fn only_the_token_s_holder_proves_itself() {
        let token = random_bytes().unwrap();
        let nonce = random_bytes().unwrap();
        let p = prove(&token, &nonce);
        assert!(check_proof(&token, &nonce, &p));
        assert!(!check_proof(&token, &random_bytes().unwrap(), &p), "another nonce");
        assert!(!check_proof(&random_bytes().unwrap(), &nonce, &p), "another token");
        assert!(!check_proof(&token, &nonce, &p[..31]));
    }

    #[test]
    fn the_broker_hands_out_idle_connections_pauses_and_listens_again() {
        let dir = tempfile::tempdir().unwrap();
        let (broker, ctl) = (dir.path().join("broker.sock"), dir.path().join("ctl.sock"));
        let (b2, c2) = (broker.clone(), ctl.clone());
        std::thread::spawn(move || serve_broker(&b2, &c2));
        let wait_for = |p: &Path| {
            let t = Instant::now();
            while !p.exists() {
                assert!(t.elapsed() < Duration::from_secs(5));
                std::thread::sleep(Duration::from_millis(2));
            }
        };
        // The control socket is bound first, the broker's right after.
        wait_for(&ctl);
        wait_for(&broker);
        // "pid 1" offers a connection; a host process takes it: both ends talk.
        let mut offered = std::os::unix::net::UnixStream::connect(&broker).unwrap();
        let mut taken = take(&ctl).unwrap();
        taken.write_all(b"x").unwrap();
        let mut b = [0u8; 1];
        offered.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"x");
        // A take with nothing offered waits for an offer.
        let ctl3 = ctl.clone();
        let t = std::thread::spawn(move || take(&ctl3).map(|_| ()));
        std::thread::sleep(Duration::from_millis(50));
        let _second = std::os::unix::net::UnixStream::connect(&broker).unwrap();
        t.join().unwrap().unwrap();
        // Pause: one connection handed over, the listener gone; takes are refused until listen.
        let _third = std::os::unix::net::UnixStream::connect(&broker).unwrap();
        pause(&ctl).unwrap();
        assert!(!broker.exists(), "no listener while paused");
        assert!(take(&ctl).unwrap_err().to_string().contains("paused"));
        listen(&ctl).unwrap();
        wait_for(&broker);
        let _fourth = std::os::unix::net::UnixStream::connect(&broker).unwrap();
        take(&ctl).unwrap();
    }
}
