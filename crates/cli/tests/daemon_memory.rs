//! The daemon's memory ceiling: no input from a sandbox or a caller grows it
//! past a fixed bound. Multi-GiB files, tar streams, exports and uploads
//! (streamed from generators, never a buffer in the test) move through the
//! daemon while its peak RSS is measured.
//!
//! How: [`Ceiling::check`] resets the daemon's high-water mark (`5` written to
//! `/proc/<pid>/clear_refs`), runs the case, and compares `VmHWM` with the
//! daemon's `VmRSS` once it was set up ([`Ceiling::new`]). A new case is one
//! [`Ceiling::check`] call around what it measures.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;

use bytes::Bytes;
use common::TestDaemon;
use futures_util::stream::{self, Stream};

/// How far above its RSS once set up the daemon's peak RSS may go during a case.
/// Buffering one of the 2 GiB test files would add at least 2 GiB; streamed,
/// a transfer holds a few MiB (bounded channels of 128 KiB chunks and hyper's
/// buffers). The margin on top absorbs what the allocator keeps for each new
/// thread (glibc arenas, touched as used) and the runtime's own growth, so the
/// bound sits an order of magnitude below any buffered transfer of these
/// sizes and well above run-to-run noise.
const CEILING: u64 = 256 << 20;
/// Size of the big files: sparse inside the sandbox (`truncate`), so making
/// them writes nothing to disk.
const BIG: u64 = 2 << 30;
/// Size of the E2B uploads (E2B's own limit is 512 MiB).
const E2B_UPLOAD: u64 = 400 << 20;

/// A field of `/proc/<pid>/status` in bytes (`VmRSS`, `VmHWM`).
fn status_bytes(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("daemon status");
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{field}:")))
        .unwrap_or_else(|| panic!("{field} missing in /proc/{pid}/status"));
    let kib: u64 = line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("a number of kB");
    kib * 1024
}

/// The daemon's memory ceiling: its RSS once set up, and [`Ceiling::check`]
/// around each case.
pub struct Ceiling {
    pid: u32,
    baseline: u64,
}

impl Ceiling {
    /// Takes the daemon's current RSS as the baseline (call it once the
    /// daemon has its images and sandboxes, before the first case).
    pub fn new(d: &TestDaemon) -> Ceiling {
        let pid = d.pid();
        Ceiling { pid, baseline: status_bytes(pid, "VmRSS") }
    }

    /// The daemon's peak RSS while `f` ran (its high-water mark is reset first).
    pub fn peak<T>(&self, f: impl FnOnce() -> T) -> (u64, T) {
        std::fs::write(format!("/proc/{}/clear_refs", self.pid), "5").expect("reset the daemon's VmHWM");
        let out = f();
        (status_bytes(self.pid, "VmHWM"), out)
    }

    /// Runs `f` and asserts that the daemon's peak RSS meanwhile stayed less
    /// than [`CEILING`] above the baseline (so growth left behind by one case
    /// counts against the next ones too).
    pub fn check<T>(&self, what: &str, f: impl FnOnce() -> T) -> T {
        let before = status_bytes(self.pid, "VmRSS");
        let (peak, out) = self.peak(f);
        let rise = peak.saturating_sub(self.baseline);
        println!(
            "{what}: baseline {} MiB, RSS before {} MiB, peak {} MiB",
            self.baseline >> 20,
            before >> 20,
            peak >> 20
        );
        assert!(
            rise < CEILING,
            "{what}: the daemon's peak RSS was {} MiB above its baseline (ceiling {} MiB)",
            rise >> 20,
            CEILING >> 20
        );
        out
    }
}

static ZEROS: [u8; 1 << 20] = [0; 1 << 20];

/// `total` zero bytes in 1 MiB chunks, made as they are sent.
fn zeros(total: u64) -> impl Stream<Item = std::io::Result<Bytes>> + Send + 'static {
    stream::unfold(total, |left| async move {
        (left > 0).then(|| {
            let n = left.min(ZEROS.len() as u64);
            (Ok(Bytes::from_static(&ZEROS[..n as usize])), left - n)
        })
    })
}

/// A tar stream with one regular file `name` of `size` zero bytes, made as it is sent.
fn tar_of_zeros(name: &str, size: u64) -> impl Stream<Item = std::io::Result<Bytes>> + Send + 'static {
    let mut h = tar::Header::new_gnu();
    h.set_path(name).unwrap();
    h.set_size(size);
    h.set_mode(0o644);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    let head = stream::iter([Ok(Bytes::copy_from_slice(h.as_bytes()))]);
    let pad = (512 - size % 512) % 512;
    let tail = stream::iter([Ok(Bytes::from_static(&ZEROS[..(pad + 1024) as usize]))]);
    futures_util::StreamExt::chain(futures_util::StreamExt::chain(head, zeros(size)), tail)
}

/// Reads a download to its end, counting its bytes (nothing is kept).
async fn drain(mut s: strata_client::ByteStream) -> u64 {
    let mut n = 0u64;
    while let Some(c) = s.chunk().await.expect("the transfer completes") {
        n += c.len() as u64;
    }
    n
}

fn exec(d: &TestDaemon, id: &str, script: &str) -> String {
    d.cli_ok(&["exec", id, "--", "sh", "-c", script])
}

/// Threads of the daemon that carry a file transfer.
fn transfer_threads(d: &TestDaemon) -> usize {
    std::fs::read_dir(format!("/proc/{}/task", d.pid()))
        .map(|dir| {
            dir.filter_map(Result::ok)
                .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "strata-xfer"))
                .count()
        })
        .unwrap_or(0)
}

/// A raw HTTP/1.1 request to envd on the daemon's TCP listener (as the E2B
/// SDK sends it), the body written by `body`; returns the status, the
/// response headers (lower-cased names) and the connection positioned at the
/// response body.
fn envd(
    addr: &str,
    token: &str,
    sandbox: &str,
    head: &str,
    body: impl FnOnce(&mut TcpStream),
) -> (u16, Vec<(String, String)>, BufReader<TcpStream>) {
    let mut s = TcpStream::connect(addr).expect("connect to the daemon");
    write!(s, "{head}\r\nHost: {addr}\r\nE2b-Sandbox-Id: {sandbox}\r\nE2b-Sandbox-Port: 49983\r\nX-Access-Token: {token}\r\nConnection: close\r\n").unwrap();
    body(&mut s);
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {line:?}"));
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h).unwrap();
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    (status, headers, r)
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// Writes `n` zero bytes in 1 MiB writes.
fn write_zeros(s: &mut TcpStream, mut n: u64) {
    while n > 0 {
        let k = n.min(ZEROS.len() as u64) as usize;
        s.write_all(&ZEROS[..k]).unwrap();
        n -= k as u64;
    }
}

#[test]
fn downloads_and_exports_stream_in_bounded_memory() {
    require_host!();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let d = TestDaemon::start_with(Some(&addr));
    d.import_busybox();
    let token = std::fs::read_to_string(d.state("api-token")).unwrap().trim().to_string();
    let id = d.create(&[]);
    exec(&d, &id, &format!("truncate -s {BIG} /root/big"));
    let secret = common::write_file(d.dir.path(), "token", b"0123456789abcdef0123456789abcdef");
    let with_secret = d.create(&["--secret", &format!("API_TOKEN=@{}", secret.display())]);
    exec(&d, &with_secret, &format!("truncate -s {BIG} /root/big"));
    let c = d.client();
    let rt = common::rt();
    let ceiling = Ceiling::new(&d);

    let n = ceiling.check("GET of a 2 GiB file", || {
        rt.block_on(async { drain(c.download_stream(&id, "/root/big", false).await.unwrap()).await })
    });
    assert_eq!(n, BIG);
    let n = ceiling.check("GET tar=true of a directory holding a 2 GiB file", || {
        rt.block_on(async { drain(c.download_stream(&id, "/root", true).await.unwrap()).await })
    });
    assert!(n > BIG, "the tar holds the file: {n} bytes");
    let n = ceiling.check("export of a writable layer holding a 2 GiB file", || {
        rt.block_on(async { drain(c.export_stream(&id, None).await.unwrap()).await })
    });
    assert!(n > BIG, "the export holds the file: {n} bytes");

    // A tar of / in a sandbox with secrets is filtered (run/secrets left out) on the way.
    let n = ceiling.check("GET tar=true of / (secrets filtered) holding a 2 GiB file", || {
        rt.block_on(async { drain(c.download_stream(&with_secret, "/", true).await.unwrap()).await })
    });
    assert!(n > BIG, "the tar holds the file: {n} bytes");

    // E2B's envd `GET /files`.
    let n = ceiling.check("E2B envd GET /files of a 2 GiB file", || {
        let (status, headers, mut body) =
            envd(&addr, &token, &id, "GET /files?path=/root/big&username=root HTTP/1.1", |s| {
                s.write_all(b"\r\n").unwrap()
            });
        assert_eq!(status, 200, "envd download: {headers:?}");
        assert_eq!(header(&headers, "content-length"), Some(BIG.to_string().as_str()), "{headers:?}");
        std::io::copy(&mut body, &mut std::io::sink()).unwrap()
    });
    assert_eq!(n, BIG);

    // A client that goes away mid-download (its runtime, and with it the
    // connection, is dropped): the transfer stops and its thread ends.
    ceiling.check("a GET of a 2 GiB file abandoned after 16 MiB", || {
        common::rt().block_on(async {
            let mut s = c.download_stream(&id, "/root/big", false).await.unwrap();
            let mut got = 0;
            while got < 16 << 20 {
                got += s.chunk().await.unwrap().expect("more data").len();
            }
        })
    });
    assert!(common::wait_until(20, || transfer_threads(&d) == 0), "a transfer thread outlived its client");
}

#[test]
fn uploads_stream_in_bounded_memory() {
    require_host!();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let d = TestDaemon::start_with(Some(&addr));
    d.import_busybox();
    let token = std::fs::read_to_string(d.state("api-token")).unwrap().trim().to_string();
    // The uploads land on the sandbox's /tmp (a tmpfs): no disk traffic.
    let id = d.create(&[]);
    let c = d.client();
    let rt = common::rt();
    let ceiling = Ceiling::new(&d);

    ceiling.check("PUT of a 2 GiB upload", || {
        rt.block_on(c.upload_stream(&id, "/tmp/up", zeros(BIG), None, false)).unwrap()
    });
    assert_eq!(rt.block_on(c.stat(&id, "/tmp/up")).unwrap().size, BIG);
    rt.block_on(c.remove_path(&id, "/tmp/up", false)).unwrap();

    ceiling.check("PUT tar=true of a 2 GiB entry", || {
        rt.block_on(c.upload_stream(&id, "/tmp/untar", tar_of_zeros("big", BIG), None, true)).unwrap()
    });
    assert_eq!(rt.block_on(c.stat(&id, "/tmp/untar/big")).unwrap().size, BIG);
    rt.block_on(c.remove_path(&id, "/tmp/untar", true)).unwrap();

    // E2B's envd `POST /files`: octet-stream and multipart.
    ceiling.check("E2B envd POST /files of 400 MiB (octet-stream)", || {
        let (status, headers, _) =
            envd(&addr, &token, &id, "POST /files?path=/tmp/e2b-raw&username=root HTTP/1.1", |s| {
                write!(s, "Content-Type: application/octet-stream\r\nContent-Length: {E2B_UPLOAD}\r\n\r\n").unwrap();
                write_zeros(s, E2B_UPLOAD);
            });
        assert_eq!(status, 200, "envd upload: {headers:?}");
    });
    assert_eq!(rt.block_on(c.stat(&id, "/tmp/e2b-raw")).unwrap().size, E2B_UPLOAD);
    rt.block_on(c.remove_path(&id, "/tmp/e2b-raw", false)).unwrap();
    ceiling.check("E2B envd POST /files of 400 MiB (multipart)", || {
        let (status, headers, _) = envd(&addr, &token, &id, "POST /files?username=root HTTP/1.1", |s| {
            let head = "--XbOuNdArY\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/tmp/e2b-multipart\"\r\nContent-Type: application/octet-stream\r\n\r\n";
            let tail = "\r\n--XbOuNdArY--\r\n";
            write!(s, "Content-Type: multipart/form-data; boundary=XbOuNdArY\r\nContent-Length: {}\r\n\r\n{head}", head.len() as u64 + E2B_UPLOAD + tail.len() as u64).unwrap();
            write_zeros(s, E2B_UPLOAD);
            s.write_all(tail.as_bytes()).unwrap();
        });
        assert_eq!(status, 200, "envd multipart upload: {headers:?}");
    });
    assert_eq!(rt.block_on(c.stat(&id, "/tmp/e2b-multipart")).unwrap().size, E2B_UPLOAD);
    rt.block_on(c.remove_path(&id, "/tmp/e2b-multipart", false)).unwrap();

    // Over E2B's limit, sent without a length: refused while it streams (413), nothing left behind.
    let over = (512 << 20) + (1 << 20);
    ceiling.check("E2B envd POST /files over its 512 MiB limit", || {
        let (status, headers, mut body) =
            envd(&addr, &token, &id, "POST /files?path=/tmp/e2b-over&username=root HTTP/1.1", |s| {
                write!(s, "Content-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n").unwrap();
                // The daemon answers once it has seen too much: stop when it no longer reads.
                let mut left = over;
                while left > 0 {
                    let k = left.min(ZEROS.len() as u64) as usize;
                    if write!(s, "{k:x}\r\n")
                        .and_then(|_| s.write_all(&ZEROS[..k]))
                        .and_then(|_| s.write_all(b"\r\n"))
                        .is_err()
                    {
                        return;
                    }
                    left -= k as u64;
                }
                let _ = s.write_all(b"0\r\n\r\n");
            });
        let mut text = String::new();
        let _ = body.read_to_string(&mut text);
        assert_eq!(status, 413, "{headers:?} {text}");
    });
    let left_behind = || {
        exec(&d, &id, "ls -a /tmp")
            .lines()
            .filter(|l| l.starts_with(".strata") || *l == "e2b-over" || *l == "cut")
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert!(common::wait_until(20, || left_behind().is_empty()), "a refused upload left {:?}", left_behind());

    // A client that goes away mid-upload: nothing is left in the sandbox.
    let cut =
        futures_util::StreamExt::chain(zeros(64 << 20), stream::iter([Err(std::io::Error::other("client gave up"))]));
    ceiling.check("a PUT abandoned after 64 MiB", || {
        assert!(rt.block_on(c.upload_stream(&id, "/tmp/cut", cut, None, false)).is_err())
    });
    assert!(common::wait_until(20, || left_behind().is_empty()), "an abandoned upload left {:?}", left_behind());
    assert!(common::wait_until(20, || transfer_threads(&d) == 0), "a transfer thread outlived its client");
}

/// Output of processes started through the API: each keeps at most 8 MiB, and
/// a sandbox's processes together at most 64 MiB (older exited processes give
/// theirs up first), so a caller starting many processes that each write a
/// lot cannot grow the daemon without bound. 40 processes of 8 MiB each would
/// hold 320 MiB.
#[test]
fn process_output_is_bounded_per_sandbox() {
    require_host!();
    let d = TestDaemon::start();
    d.import_busybox();
    let id = d.create(&[]);
    let ceiling = Ceiling::new(&d);
    ceiling.check("40 processes writing 8 MiB each", || {
        let procs: Vec<String> = (0..40)
            .map(|_| d.cli_ok(&["exec", "-d", &id, "--", "head", "-c", "8388608", "/dev/zero"]).trim().to_string())
            .collect();
        for p in &procs {
            let out = d.cli(&["proc", "wait", &id, p]);
            assert_eq!(out.status.code(), Some(0), "{}", common::stderr(&out));
        }
    });
    // The newest process still has its output (the budget takes from the oldest first).
    let last =
        d.cli_ok(&["exec", "-d", &id, "--", "sh", "-c", "head -c 1000 /dev/zero | tr '\\0' x"]).trim().to_string();
    let _ = d.cli(&["proc", "wait", &id, &last]);
    assert_eq!(d.cli_ok(&["proc", "logs", &id, &last]).len(), 1000);
}
