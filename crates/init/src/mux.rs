//! The microvm tier's host <-> guest line: many byte streams over one
//! virtio-serial port.
//!
//! A microVM has no vsock and no shared filesystem here (docs/microvm.md):
//! its only private channel to the host is one virtio-serial port, a single
//! byte stream. The exec channel of [`crate::channel`] wants a connection per
//! process, so both ends of the port run a [`Mux`]: each stream is a unix
//! socket on either side (a socketpair end handed to whoever uses it), and the
//! line carries [`Kind::Data`] of every stream interleaved.
//!
//! * **Line frames** ([`encode`], [`LineReader`]): a kind byte, the stream
//!   id (u32 LE), the payload length (u32 LE), the payload (at most
//!   [`MAX_PAYLOAD`]).
//! * **Opening**: only the host opens streams ([`Kind::Open`]); the guest's
//!   mux makes a socketpair for it at once (bytes that follow the open in the
//!   same read have a place to go) and pid 1 gets the other end as a new
//!   connection ([`Event::Open`]), so [`crate::spawner`] serves
//!   it exactly as a gVisor sandbox's broker connection (the host proves
//!   nothing to the guest; pid 1 proves the token to the host).
//! * **Flow control**: a side sends at most [`WINDOW`] bytes of a stream the
//!   other side has not yet delivered to its socket; the receiver returns
//!   [`Kind::Ack`] as it delivers. A stream whose reader is slow therefore
//!   stops only itself, never the line.
//! * **Closing**: end of a socket (or an error) -> [`Kind::Close`]; the other
//!   side writes what it holds, then shuts its socket down.
//! * **Control** (stream 0): [`Kind::Token`] (host -> guest, first: the
//!   channel token pid 1 proves; a keeper of a restored VM sends it until
//!   answered), [`Kind::Ready`] (guest -> host: pid 1 serves, the answer to
//!   every token; JSON [`GuestInfo`]), [`Kind::Clock`] (host -> guest: the
//!   wall clock), [`Kind::Stop`] (host -> guest: stop with a grace, then
//!   power off).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use serde::{Deserialize, Serialize};

/// Largest payload of one line frame.
pub const MAX_PAYLOAD: usize = 64 << 10;
/// Bytes of a stream in flight (sent, not yet delivered by the other side).
pub const WINDOW: usize = 256 << 10;
/// Bytes queued for the line before streams stop being read.
const MAX_LINE_QUEUE: usize = 1 << 20;
/// Header bytes of a line frame.
const HEADER: usize = 9;

/// The kinds of line frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Host: stream `id` opens.
    Open = 1,
    /// Bytes of stream `id`.
    Data = 2,
    /// Stream `id` ended on the sender's side.
    Close = 3,
    /// The sender delivered this many bytes (u32 LE) of stream `id`.
    Ack = 4,
    /// Host: the channel token (stream 0).
    Token = 5,
    /// Guest: pid 1 serves ([`GuestInfo`] as JSON; stream 0).
    Ready = 6,
    /// Host: stop every process within this many seconds (u32 LE), then power off (stream 0).
    Stop = 7,
    /// Host: the wall clock, nanoseconds since the epoch (u64 LE; stream 0):
    /// the guest steps its clock to it (a VM restored from a snapshot resumes
    /// with the time it was saved at).
    Clock = 8,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Open,
            2 => Kind::Data,
            3 => Kind::Close,
            4 => Kind::Ack,
            5 => Kind::Token,
            6 => Kind::Ready,
            7 => Kind::Stop,
            8 => Kind::Clock,
            _ => return None,
        })
    }
}

/// What the guest tells the host once it serves.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestInfo {
    /// The guest kernel's release (`uname -r`).
    pub kernel: String,
    /// Milliseconds from the kernel's start to pid 1 serving (CLOCK_BOOTTIME).
    pub boot_ms: u64,
}

/// Appends one line frame to `out`.
pub fn encode(out: &mut Vec<u8>, kind: Kind, stream: u32, payload: &[u8]) {
    debug_assert!(payload.len() <= MAX_PAYLOAD);
    out.push(kind as u8);
    out.extend_from_slice(&stream.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(payload);
}

/// A line that breaks the protocol (the other side is not a strata mux).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadLine(pub String);

/// Accumulates line bytes and yields whole frames.
#[derive(Debug, Default)]
pub struct LineReader {
    buf: Vec<u8>,
    start: usize,
}

impl LineReader {
    /// Adds bytes read from the line.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole frame: kind, stream, payload.
    pub fn next_frame(&mut self) -> Result<Option<(Kind, u32, Vec<u8>)>, BadLine> {
        let b = &self.buf[self.start..];
        if b.len() < HEADER {
            return Ok(None);
        }
        let kind = Kind::from_u8(b[0]).ok_or_else(|| BadLine(format!("unknown line frame kind {}", b[0])))?;
        let stream = u32::from_le_bytes(b[1..5].try_into().expect("4 bytes"));
        let len = u32::from_le_bytes(b[5..9].try_into().expect("4 bytes")) as usize;
        if len > MAX_PAYLOAD {
            return Err(BadLine(format!("a line frame of {len} bytes (at most {MAX_PAYLOAD})")));
        }
        if b.len() < HEADER + len {
            return Ok(None);
        }
        let payload = b[HEADER..HEADER + len].to_vec();
        self.start += HEADER + len;
        if self.start > (1 << 20) {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        Ok(Some((kind, stream, payload)))
    }
}

/// One stream's local end and its state.
struct Stream {
    sock: UnixStream,
    /// Bytes from the line not yet written to `sock`.
    to_sock: Vec<u8>,
    /// Bytes of ours the other side has not acknowledged.
    in_flight: usize,
    /// Bytes written to `sock` not yet acknowledged to the other side.
    delivered: usize,
    /// The other side closed: shut `sock` down once `to_sock` is written.
    remote_closed: bool,
    /// `sock` ended (or failed): no more reads; [`Kind::Close`] was queued.
    local_closed: bool,
    /// Writing to `sock` failed: bytes for it are dropped (and acknowledged).
    unwritable: bool,
}

/// Something the line said that the mux's owner acts on.
#[derive(Debug)]
pub enum Event {
    /// The host opened a stream (guest side): its bytes come and go through
    /// this socket (the mux holds the other end of the pair).
    Open(UnixStream),
    /// The channel token.
    Token(Vec<u8>),
    /// The guest serves.
    Ready(GuestInfo),
    /// Stop within this many seconds.
    Stop(u32),
    /// The host's wall clock (nanoseconds since the epoch).
    Clock(u64),
    /// The line ended (the far side closed, or the port has no peer now).
    LineClosed,
}

/// Many streams over one line (see the module docs). The owner drives it
/// with [`Mux::step`] and acts on [`Mux::take_events`].
pub struct Mux<L> {
    line: L,
    reader: LineReader,
    /// Bytes for the line not yet written.
    out: Vec<u8>,
    streams: HashMap<u32, Stream>,
    events: Vec<Event>,
    line_closed: bool,
}

fn would_block(e: &std::io::Error) -> bool {
    matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted)
}

impl<L: Read + Write + AsFd> Mux<L> {
    /// A mux over `line`, which must be non-blocking.
    pub fn new(line: L) -> Mux<L> {
        Mux {
            line,
            reader: LineReader::default(),
            out: Vec::new(),
            streams: HashMap::new(),
            events: Vec::new(),
            line_closed: false,
        }
    }

    /// Forgets every stream and whatever was half-read or queued (the far
    /// side went away) and reads the line again.
    pub fn reset(&mut self) {
        self.streams.clear();
        self.out.clear();
        self.reader = LineReader::default();
        self.line_closed = false;
    }

    /// Whether the line ended.
    pub fn line_closed(&self) -> bool {
        self.line_closed
    }

    /// Queues a control frame (stream 0).
    pub fn send_control(&mut self, kind: Kind, payload: &[u8]) {
        encode(&mut self.out, kind, 0, payload);
    }

    /// Relays stream `id` through `sock` (made non-blocking here); with
    /// `announce` (the host side) the other side learns it with [`Kind::Open`].
    pub fn add(&mut self, id: u32, sock: UnixStream, announce: bool) {
        let _ = sock.set_nonblocking(true);
        if announce {
            encode(&mut self.out, Kind::Open, id, &[]);
        }
        let s = Stream {
            sock,
            to_sock: Vec::new(),
            in_flight: 0,
            delivered: 0,
            remote_closed: false,
            local_closed: false,
            unwritable: false,
        };
        self.streams.insert(id, s);
    }

    /// Streams open now.
    pub fn streams(&self) -> usize {
        self.streams.len()
    }

    /// What the line said since the last call.
    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }

    /// Polls the line, every stream and `extra` for up to `timeout_ms` (-1:
    /// no limit), moves what is ready, and returns which of `extra` are ready.
    pub fn step(&mut self, extra: &[BorrowedFd<'_>], timeout_ms: i32) -> Vec<bool> {
        let line_fd = self.line.as_fd().as_raw_fd();
        let mut ids = Vec::with_capacity(self.streams.len());
        let mut raw: Vec<(RawFd, PollFlags)> = Vec::with_capacity(self.streams.len() + extra.len() + 1);
        let mut line_ev = PollFlags::empty();
        if !self.line_closed {
            line_ev |= PollFlags::POLLIN;
            if !self.out.is_empty() {
                line_ev |= PollFlags::POLLOUT;
            }
        }
        raw.push((line_fd, line_ev));
        for (id, s) in &self.streams {
            let mut ev = PollFlags::empty();
            if !s.local_closed && s.in_flight < WINDOW && self.out.len() < MAX_LINE_QUEUE {
                ev |= PollFlags::POLLIN;
            }
            if !s.to_sock.is_empty() {
                ev |= PollFlags::POLLOUT;
            }
            ids.push(*id);
            raw.push((s.sock.as_raw_fd(), ev));
        }
        for e in extra {
            raw.push((e.as_raw_fd(), PollFlags::POLLIN));
        }
        // SAFETY: every descriptor is owned by `self` or borrowed by `extra`
        // for the duration of this call.
        let borrowed: Vec<BorrowedFd<'_>> = raw.iter().map(|(fd, _)| unsafe { BorrowedFd::borrow_raw(*fd) }).collect();
        let mut fds: Vec<PollFd<'_>> = borrowed.iter().zip(&raw).map(|(fd, (_, ev))| PollFd::new(*fd, *ev)).collect();
        let timeout = if timeout_ms < 0 {
            PollTimeout::NONE
        } else {
            PollTimeout::try_from(timeout_ms).unwrap_or(PollTimeout::MAX)
        };
        if poll(&mut fds, timeout).is_err() {
            return vec![false; extra.len()];
        }
        let revents: Vec<PollFlags> = fds.iter().map(|f| f.revents().unwrap_or(PollFlags::empty())).collect();
        drop(fds);
        let ready = |r: PollFlags| r.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR);
        if !self.line_closed {
            if revents[0].contains(PollFlags::POLLOUT) {
                self.flush_line();
            }
            if ready(revents[0]) {
                self.read_line();
            }
        }
        let mut buf = vec![0u8; MAX_PAYLOAD];
        for (i, id) in ids.iter().enumerate() {
            let r = revents[i + 1];
            if r.contains(PollFlags::POLLOUT) || (r.intersects(PollFlags::POLLERR | PollFlags::POLLHUP)) {
                self.write_stream(*id);
            }
            if ready(r) {
                self.read_stream(*id, &mut buf);
            }
        }
        // Streams whose socket has nothing more to give or take are done.
        self.streams.retain(|_, s| !(s.local_closed && s.remote_closed && s.to_sock.is_empty()));
        if !self.out.is_empty() && !self.line_closed {
            self.flush_line();
        }
        revents[1 + ids.len()..].iter().map(|r| ready(*r)).collect()
    }

    fn flush_line(&mut self) {
        while !self.out.is_empty() {
            match self.line.write(&self.out) {
                Ok(0) => break,
                Ok(n) => {
                    self.out.drain(..n);
                }
                Err(e) if would_block(&e) => break,
                Err(_) => {
                    self.close_line();
                    break;
                }
            }
        }
    }

    fn close_line(&mut self) {
        if !self.line_closed {
            self.line_closed = true;
            self.out.clear();
            self.events.push(Event::LineClosed);
        }
    }

    fn read_line(&mut self) {
        let mut buf = vec![0u8; 128 << 10];
        loop {
            match self.line.read(&mut buf) {
                Ok(0) => {
                    self.close_line();
                    return;
                }
                Ok(n) => {
                    self.reader.push(&buf[..n]);
                    if n < buf.len() {
                        break;
                    }
                }
                Err(e) if would_block(&e) => break,
                Err(_) => {
                    self.close_line();
                    return;
                }
            }
        }
        loop {
            match self.reader.next_frame() {
                Ok(Some((kind, id, payload))) => self.on_frame(kind, id, payload),
                Ok(None) => break,
                Err(BadLine(why)) => {
                    report_bad_line(&why);
                    self.reader = LineReader::default();
                    self.close_line();
                    break;
                }
            }
        }
    }

    fn on_frame(&mut self, kind: Kind, id: u32, payload: Vec<u8>) {
        let u32_of = |p: &[u8]| p.try_into().map(u32::from_le_bytes).unwrap_or(0);
        match kind {
            Kind::Open => match UnixStream::pair() {
                Ok((mine, theirs)) => {
                    self.add(id, mine, false);
                    self.events.push(Event::Open(theirs));
                }
                Err(e) => {
                    eprintln!("strata mux: a socketpair for stream {id}: {e}");
                    encode(&mut self.out, Kind::Close, id, &[]);
                }
            },
            Kind::Token => self.events.push(Event::Token(payload)),
            Kind::Ready => self.events.push(Event::Ready(serde_json::from_slice(&payload).unwrap_or_default())),
            Kind::Stop => self.events.push(Event::Stop(u32_of(&payload))),
            Kind::Clock => {
                let ns = payload.as_slice().try_into().map(u64::from_le_bytes).unwrap_or(0);
                self.events.push(Event::Clock(ns))
            }
            Kind::Data => match self.streams.get_mut(&id) {
                Some(s) if !s.remote_closed && !s.unwritable => s.to_sock.extend_from_slice(&payload),
                // A stream this side already let go of: its bytes count as delivered.
                _ => encode(&mut self.out, Kind::Ack, id, &(payload.len() as u32).to_le_bytes()),
            },
            Kind::Close => {
                if let Some(s) = self.streams.get_mut(&id) {
                    s.remote_closed = true;
                    if s.to_sock.is_empty() {
                        let _ = s.sock.shutdown(std::net::Shutdown::Write);
                    }
                }
            }
            Kind::Ack => {
                if let Some(s) = self.streams.get_mut(&id) {
                    s.in_flight = s.in_flight.saturating_sub(u32_of(&payload) as usize);
                }
            }
        }
    }

    fn write_stream(&mut self, id: u32) {
        let Some(s) = self.streams.get_mut(&id) else { return };
        let mut failed = false;
        while !s.to_sock.is_empty() {
            match s.sock.write(&s.to_sock) {
                Ok(n) => {
                    s.to_sock.drain(..n);
                    s.delivered += n;
                }
                Err(e) if would_block(&e) => break,
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        if failed {
            // Nobody reads this stream any more: what is left (and what still
            // comes) counts as delivered. Its socket is still read to its end:
            // what the far side wrote before it closed (a process's last
            // report) must not be lost with the bytes it never read.
            s.delivered += s.to_sock.len();
            s.to_sock.clear();
            s.unwritable = true;
        }
        if s.delivered > 0 && (s.delivered >= WINDOW / 4 || s.to_sock.is_empty()) {
            encode(&mut self.out, Kind::Ack, id, &(s.delivered as u32).to_le_bytes());
            s.delivered = 0;
        }
        if s.remote_closed && s.to_sock.is_empty() {
            let _ = s.sock.shutdown(std::net::Shutdown::Write);
        }
    }

    fn read_stream(&mut self, id: u32, buf: &mut [u8]) {
        let Some(s) = self.streams.get_mut(&id) else { return };
        if s.local_closed {
            return;
        }
        while s.in_flight < WINDOW && self.out.len() < MAX_LINE_QUEUE {
            let room = (WINDOW - s.in_flight).min(buf.len());
            match s.sock.read(&mut buf[..room]) {
                Ok(0) => {
                    s.local_closed = true;
                    encode(&mut self.out, Kind::Close, id, &[]);
                    break;
                }
                Ok(n) => {
                    s.in_flight += n;
                    encode(&mut self.out, Kind::Data, id, &buf[..n]);
                }
                Err(e) if would_block(&e) => break,
                Err(_) => {
                    s.local_closed = true;
                    encode(&mut self.out, Kind::Close, id, &[]);
                    break;
                }
            }
        }
    }
}

/// A line that breaks the protocol is said on stderr (the guest's console,
/// the keeper's log), then the line is dropped.
fn report_bad_line(why: &str) {
    eprintln!("strata mux: {why}; the line is dropped");
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn frames_split_anywhere_and_bad_ones_are_named() {
        let mut wire = Vec::new();
        encode(&mut wire, Kind::Open, 7, b"");
        encode(&mut wire, Kind::Data, 7, b"hello");
        encode(&mut wire, Kind::Ack, 7, &5u32.to_le_bytes());
        let mut r = LineReader::default();
        let mut got = Vec::new();
        for b in &wire {
            r.push(std::slice::from_ref(b));
            while let Some(f) = r.next_frame().unwrap() {
                got.push(f);
            }
        }
        assert_eq!(
            got,
            [(Kind::Open, 7, vec![]), (Kind::Data, 7, b"hello".to_vec()), (Kind::Ack, 7, 5u32.to_le_bytes().to_vec())]
        );
        let mut bad = LineReader::default();
        bad.push(&[42, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert!(bad.next_frame().unwrap_err().0.contains("kind 42"));
        let mut big = LineReader::default();
        big.push(&[2, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f]);
        assert!(big.next_frame().unwrap_err().0.contains("at most"));
    }

    /// A host mux and a guest mux over a socketpair (the "serial port"),
    /// each driven on its own thread until `done`.
    fn pair() -> (UnixStream, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        b.set_nonblocking(true).unwrap();
        (a, b)
    }

    #[test]
    fn streams_carry_bytes_both_ways_with_a_slow_reader_holding_only_itself() {
        let (host_line, guest_line) = pair();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        // Guest: every opened stream echoes what it reads, upper-cased.
        let stop_g = stop.clone();
        let guest = std::thread::spawn(move || {
            let mut mux = Mux::new(guest_line);
            let mut echoers = Vec::new();
            while !stop_g.load(std::sync::atomic::Ordering::Relaxed) {
                mux.step(&[], 10);
                for ev in mux.take_events() {
                    if let Event::Open(theirs) = ev {
                        echoers.push(std::thread::spawn(move || {
                            let mut s = theirs;
                            let mut buf = [0u8; 4096];
                            loop {
                                match s.read(&mut buf) {
                                    Ok(0) | Err(_) => break,
                                    Ok(n) => s.write_all(&buf[..n].to_ascii_uppercase()).unwrap(),
                                }
                            }
                        }));
                    }
                }
            }
        });
        let (host_a, mut user_a) = UnixStream::pair().unwrap();
        let (host_b, mut user_b) = UnixStream::pair().unwrap();
        let stop_h = stop.clone();
        let host = std::thread::spawn(move || {
            let mut mux = Mux::new(host_line);
            mux.add(1, host_a, true);
            mux.add(2, host_b, true);
            while !stop_h.load(std::sync::atomic::Ordering::Relaxed) {
                mux.step(&[], 10);
            }
        });
        // Stream 2 sends a lot and nobody reads its echo for a while: stream 1 still flows.
        let big = vec![b'x'; 3 * WINDOW];
        let writer = {
            let mut w = user_b.try_clone().unwrap();
            let big = big.clone();
            std::thread::spawn(move || {
                let _ = w.write_all(&big);
            })
        };
        user_a.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let t = Instant::now();
        for i in 0..20 {
            let msg = format!("line {i}\n");
            user_a.write_all(msg.as_bytes()).unwrap();
            let mut got = vec![0u8; msg.len()];
            user_a.read_exact(&mut got).unwrap();
            assert_eq!(got, msg.to_uppercase().as_bytes());
        }
        assert!(t.elapsed() < Duration::from_secs(10));
        // Now read stream 2's echo in full: nothing lost, nothing reordered.
        user_b.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut echoed = vec![0u8; big.len()];
        user_b.read_exact(&mut echoed).unwrap();
        assert!(echoed.iter().all(|b| *b == b'X'));
        writer.join().unwrap();
        // Closing a stream on the host ends the guest's socket: its echoer sees EOF.
        drop(user_a);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        host.join().unwrap();
        guest.join().unwrap();
    }

    #[test]
    fn the_last_words_of_a_side_that_closes_unread_are_not_lost() {
        let (host_line, guest_line) = pair();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop_g = stop.clone();
        // Guest: reads one line, answers, and closes with whatever else came unread
        // (as pid 1 ends a connection whose process ended while its stdin still flowed).
        let guest = std::thread::spawn(move || {
            let mut mux = Mux::new(guest_line);
            while !stop_g.load(std::sync::atomic::Ordering::Relaxed) {
                mux.step(&[], 10);
                for ev in mux.take_events() {
                    if let Event::Open(mut s) = ev {
                        std::thread::spawn(move || {
                            let mut b = [0u8; 6];
                            s.read_exact(&mut b).unwrap();
                            std::thread::sleep(Duration::from_millis(50));
                            s.write_all(b"last words").unwrap();
                        });
                    }
                }
            }
        });
        let (host_end, mut user) = UnixStream::pair().unwrap();
        let stop_h = stop.clone();
        let host = std::thread::spawn(move || {
            let mut mux = Mux::new(host_line);
            mux.add(1, host_end, true);
            while !stop_h.load(std::sync::atomic::Ordering::Relaxed) {
                mux.step(&[], 10);
            }
        });
        user.write_all(b"hello\n").unwrap();
        // More that nobody reads, written while the far side answers and closes.
        for _ in 0..50 {
            let _ = user.write_all(&[b'x'; 1000]);
            std::thread::sleep(Duration::from_millis(2));
        }
        user.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut got = Vec::new();
        user.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"last words");
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        host.join().unwrap();
        guest.join().unwrap();
    }

    #[test]
    fn control_frames_become_events_and_a_closed_line_is_said() {
        let (host_line, guest_line) = pair();
        let mut host = Mux::new(host_line);
        host.send_control(Kind::Token, b"secret");
        host.send_control(Kind::Stop, &3u32.to_le_bytes());
        host.step(&[], 0);
        let mut guest = Mux::new(guest_line);
        let t = Instant::now();
        let mut events = Vec::new();
        while events.len() < 2 && t.elapsed() < Duration::from_secs(5) {
            guest.step(&[], 10);
            events.extend(guest.take_events());
        }
        assert!(matches!(&events[..], [Event::Token(t), Event::Stop(3)] if t == b"secret"), "{events:?}");
        let info = GuestInfo { kernel: "6.1".into(), boot_ms: 900 };
        guest.send_control(Kind::Ready, &serde_json::to_vec(&info).unwrap());
        guest.step(&[], 0);
        host.step(&[], 1000);
        assert!(matches!(&host.take_events()[..], [Event::Ready(i)] if *i == info));
        drop(guest);
        host.step(&[], 1000);
        assert!(matches!(host.take_events()[..], [Event::LineClosed]));
        assert!(host.line_closed());
    }
}
