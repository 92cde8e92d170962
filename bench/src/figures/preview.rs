//! Figure 9: what the preview proxy costs. A server inside a sandbox (bound on
//! the sandbox's 127.0.0.1, loopback only) is asked for the same small file
//! two ways:
//!
//! * **proxied**: through the daemon's TCP listener, path-based preview URL
//!   with the token header (admission: token and sandbox checks, or their
//!   remembered result; an activity guard; a keep-alive connection into the
//!   sandbox, or a new one from a socket made in its network namespace;
//!   HTTP/1.1 forwarding);
//! * **direct**: the bench's own socket, made by a thread that has joined the
//!   sandbox's network namespace with `setns()` — the proxy's own path to the
//!   server, without the proxy.
//!
//! Two servers, two ways of connecting:
//!
//! * **keep-alive** (judged): Node's `http` server in the Debian + python
//!   image, a browser-like client that keeps its connection (to the daemon, or
//!   to the server), so the proxy can keep its upstream connection too;
//! * **fresh connections** (reported): busybox `httpd`, which closes after
//!   every response, and a client that connects for every request: the worst
//!   case, two TCP connections per proxied request against one.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use strata_api::{CreatePreviewRequest, CreateSandboxRequest, ExecRequest};
use strata_client::Client;

use super::{create_req, exec_ok};
use crate::report::{Row, Verdict};
use crate::stats::{ms, ratio, summarize, Summary};
use crate::Bench;

/// Least proxied/direct throughput with keep-alive connections (sequential and concurrent).
const RPS_TARGET: f64 = 0.8;
/// Most the proxy may add to the p99 of one keep-alive request.
const ADDED_P99_TARGET_MS: f64 = 1.0;
/// The served file's size.
const BODY_BYTES: usize = 1024;
/// Concurrent clients of the throughput runs.
const CONCURRENCY: usize = 8;
/// The image with Node (bench/run.sh imports debian-python.tar.gz under this name).
const NODE_IMAGE: &str = "e2b-base";
/// The keep-alive server: Node's http module, a {BODY_BYTES}-byte body with its length.
const NODE_SERVER: &str = "const b = Buffer.alloc(1024, 'x');\n\
require('http').createServer((q, r) => { r.writeHead(200, {'content-type': 'text/html', 'content-length': b.length}); r.end(b); })\n\
  .listen(8000, '127.0.0.1', () => console.log('listening'));\n";

/// How a client connects.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Conn {
    /// A new connection per request (`Connection: close`).
    Fresh,
    /// One connection for all of a client's requests.
    KeepAlive,
}

/// Where requests go.
#[derive(Clone)]
struct Path {
    /// Address to connect to.
    addr: String,
    /// The request head without its `Connection` header and final blank line.
    head: String,
    /// Join this process's network namespace first (direct requests).
    netns_of: Option<i32>,
}

impl Path {
    fn proxied(addr: &str, target: &str, token: &str) -> Path {
        Path {
            addr: addr.to_string(),
            head: format!("GET {target} HTTP/1.1\r\nHost: {addr}\r\nX-Strata-Preview-Token: {token}\r\n"),
            netns_of: None,
        }
    }

    fn relayed(addr: &str, file: &str) -> Path {
        Path {
            addr: addr.to_string(),
            head: format!("GET /{file} HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"),
            netns_of: None,
        }
    }

    fn direct(pid: i32, file: &str) -> Path {
        Path {
            addr: "127.0.0.1:8000".into(),
            head: format!("GET /{file} HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"),
            netns_of: Some(pid),
        }
    }
}

/// A byte relay between loopback and the server, the floor of any two-hop
/// path: a listener on the host's 127.0.0.1 (made before its thread joins the
/// sandbox's network namespace: a socket stays in the namespace it was made
/// in), and per accepted connection one made inside the sandbox to
/// 127.0.0.1:8000, with a thread copying each way. Returns its address.
fn start_relay(pid: i32) -> Result<String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("bind the relay")?;
    let addr = listener.local_addr()?.to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        if let Err(e) = join_netns(pid) {
            let _ = tx.send(Err(e));
            return;
        }
        let _ = tx.send(Ok(()));
        for client in listener.incoming() {
            let Ok(client) = client else { continue };
            let Ok(server) = TcpStream::connect("127.0.0.1:8000") else { continue };
            let _ = (client.set_nodelay(true), server.set_nodelay(true));
            let (Ok(mut c2), Ok(mut s2)) = (client.try_clone(), server.try_clone()) else { continue };
            let (mut c, mut s) = (client, server);
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut c, &mut s);
                let _ = s.shutdown(std::net::Shutdown::Write);
            });
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut s2, &mut c2);
                let _ = c2.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    rx.recv().context("the relay thread")??;
    Ok(addr)
}

/// Joins the network namespace of `pid` (this thread only: network namespaces are per thread).
fn join_netns(pid: i32) -> Result<()> {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/net")).with_context(|| format!("open /proc/{pid}/ns/net"))?;
    // SAFETY: setns on a descriptor we own; it changes only the calling thread's network namespace.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        bail!("setns into the sandbox's network namespace: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// Reads one response (head, then a `Content-Length` body, or to the end
/// without one); checks the status and the body's size.
fn read_response(r: &mut impl BufRead) -> Result<()> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    if !line.starts_with("HTTP/1.1 200") && !line.starts_with("HTTP/1.0 200") {
        let mut rest = Vec::new();
        let _ = r.take(300).read_to_end(&mut rest);
        bail!("unexpected response: {line:?} {:?}", String::from_utf8_lossy(&rest));
    }
    let mut length = None;
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            bail!("the connection ended in the response head");
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = Some(v.trim().parse::<usize>().context("content-length")?);
            }
        }
    }
    let body = match length {
        Some(n) => {
            let mut b = vec![0; n];
            r.read_exact(&mut b)?;
            b.len()
        }
        None => {
            let mut b = Vec::new();
            r.read_to_end(&mut b)?;
            b.len()
        }
    };
    if body < BODY_BYTES {
        bail!("a body of {body} bytes, expected {BODY_BYTES}");
    }
    Ok(())
}

/// One client on its own thread: `n` requests, their latencies (connect, for
/// fresh connections, to the last byte) and the wall time.
fn client(p: Path, conn: Conn, n: usize) -> std::thread::JoinHandle<Result<(Vec<Duration>, Duration)>> {
    std::thread::spawn(move || {
        if let Some(pid) = p.netns_of {
            join_netns(pid)?;
        }
        let connect = || -> Result<BufReader<TcpStream>> {
            let s = TcpStream::connect(p.addr.as_str()).with_context(|| format!("connect to {}", p.addr))?;
            s.set_nodelay(true)?;
            Ok(BufReader::new(s))
        };
        let kept_head = format!("{}\r\n", p.head);
        let close_head = format!("{}Connection: close\r\n\r\n", p.head);
        let mut kept = if conn == Conn::KeepAlive { Some(connect()?) } else { None };
        let t = Instant::now();
        let mut lat = Vec::with_capacity(n);
        for _ in 0..n {
            let t1 = Instant::now();
            match kept.as_mut() {
                Some(r) => {
                    r.get_mut().write_all(kept_head.as_bytes())?;
                    read_response(r)?;
                }
                None => {
                    let mut r = connect()?;
                    r.get_mut().write_all(close_head.as_bytes())?;
                    read_response(&mut r)?;
                }
            }
            lat.push(t1.elapsed());
        }
        Ok((lat, t.elapsed()))
    })
}

fn joined<T>(h: std::thread::JoinHandle<Result<T>>) -> Result<T> {
    h.join().map_err(|_| anyhow::anyhow!("client thread panicked"))?
}

/// Sequential requests through each path in rotating blocks (machine noise hits all alike).
#[derive(Default)]
struct Sequential {
    /// Latencies and wall time: proxied, direct, relayed.
    lat: [Vec<Duration>; 3],
    wall: [Duration; 3],
    /// Daemon CPU (user + system) during the proxied blocks.
    daemon_cpu_ms: u64,
}

fn sequential(paths: &[Path; 3], conn: Conn, n: usize, warm: usize, daemon: i32) -> Result<Sequential> {
    const BLOCK: usize = 100;
    for p in paths {
        joined(client(p.clone(), conn, warm))?;
    }
    let mut s = Sequential::default();
    for i in 0..n.div_ceil(BLOCK) {
        for k in 0..3 {
            let which = (i + k) % 3;
            let before = crate::sys::cpu_ms(daemon).unwrap_or(0);
            let (l, w) = joined(client(paths[which].clone(), conn, BLOCK))?;
            if which == 0 {
                s.daemon_cpu_ms += crate::sys::cpu_ms(daemon).unwrap_or(0).saturating_sub(before);
            }
            s.lat[which].extend(l);
            s.wall[which] += w;
        }
    }
    Ok(s)
}

/// `CONCURRENCY` clients of `n` requests each: requests per second.
fn concurrent(p: &Path, conn: Conn, n: usize) -> Result<f64> {
    let t = Instant::now();
    let clients: Vec<_> = (0..CONCURRENCY).map(|_| client(p.clone(), conn, n)).collect();
    for c in clients {
        joined(c)?;
    }
    Ok((CONCURRENCY * n) as f64 / t.elapsed().as_secs_f64())
}

/// One server's measurements.
struct Measured {
    seq: Sequential,
    /// Concurrent requests/s: proxied, direct; requests per client.
    conc: (f64, f64, usize),
}

impl Measured {
    /// Sequential requests/s: proxied, direct, relayed.
    fn rps(&self) -> [f64; 3] {
        [0, 1, 2].map(|i| self.seq.lat[i].len() as f64 / self.seq.wall[i].as_secs_f64())
    }

    /// Latencies: proxied, direct, relayed.
    fn summaries(&self) -> [Summary; 3] {
        [0, 1, 2].map(|i| summarize(&self.seq.lat[i]))
    }

    fn cpu_us_per_request(&self) -> f64 {
        self.seq.daemon_cpu_ms as f64 * 1000.0 / self.seq.lat[0].len().max(1) as f64
    }
}

/// Starts the server (`start`), opens a preview of port 8000 and measures `file` both ways.
async fn measure(b: &Bench, c: &Client, id: &str, start: ExecRequest, file: &str, conn: Conn) -> Result<Measured> {
    exec_ok(c, id, start).await?;
    let pid = c.get_sandbox(id).await?.init_pid.context("the sandbox has no init pid")?;
    let p = c
        .create_preview(id, &CreatePreviewRequest { port: Some(8000), ..Default::default() })
        .await
        .context("create preview")?;
    let url = p
        .preview
        .url_path
        .strip_prefix("http://")
        .context("the daemon has no TCP listener (bench/run.sh starts it with --listen)")?;
    let (addr, path) = url.split_once('/').context("preview URL")?;
    let proxied = Path::proxied(addr, &format!("/{path}{file}"), &p.token);
    let direct = Path::direct(pid, file);
    let relayed = Path::relayed(&start_relay(pid)?, file);
    let n = (b.cfg.runs * 10).max(100);
    let warm = (b.cfg.warmup * 10).max(10);
    let daemon = b.cfg.daemon_pid;
    // Blocking clients on their own threads; nothing else runs on this runtime meanwhile.
    let seq = sequential(&[proxied.clone(), direct.clone(), relayed], conn, n, warm, daemon)?;
    let per = (n / CONCURRENCY).max(10);
    let cp = concurrent(&proxied, conn, per)?;
    let cd = concurrent(&direct, conn, per)?;
    Ok(Measured { seq, conc: (cp, cd, per) })
}

pub async fn run(b: &mut Bench) -> Result<()> {
    let c = b.client.clone();
    // Keep-alive, Node.
    c.get_image(NODE_IMAGE).await.with_context(|| {
        format!("image {NODE_IMAGE:?} is not imported (bench/run.sh imports debian-python.tar.gz as {NODE_IMAGE})")
    })?;
    let sb = c
        .create_sandbox(&CreateSandboxRequest { source: NODE_IMAGE.into(), ..Default::default() })
        .await
        .context("create sandbox")?;
    let start = ExecRequest {
        cmd: vec![
            "sh".into(),
            "-c".into(),
            format!(
                "printf %s \"$0\" > /tmp/server.js && (setsid node /tmp/server.js > /tmp/server.log 2>&1 &) && \
                 for i in $(seq 1000); do grep -q listening /tmp/server.log && exit 0; sleep 0.01; done; cat /tmp/server.log; exit 1"
            ),
            NODE_SERVER.into(),
        ],
        ..Default::default()
    };
    let node = measure(b, &c, &sb.id, start, "index.html", Conn::KeepAlive).await;
    let _ = c.remove_sandbox(&sb.id, true).await;
    let node = node?;

    // Fresh connections, busybox httpd.
    let sb = c.create_sandbox(&create_req(&b.cfg.image)).await.context("create sandbox")?;
    let start = ExecRequest {
        cmd: vec![
            "sh".into(),
            "-c".into(),
            format!("mkdir -p /www && head -c {BODY_BYTES} /dev/zero | tr '\\0' x > /www/index.html && httpd -p 127.0.0.1:8000 -h /www"),
        ],
        ..Default::default()
    };
    let httpd = measure(b, &c, &sb.id, start, "index.html", Conn::Fresh).await;
    let _ = c.remove_sandbox(&sb.id, true).await;
    let httpd = httpd?;

    let [rp, rd, rr] = node.rps();
    let [sp, sd, sr] = node.summaries();
    let added_p99 = (sp.p99.as_secs_f64() - sd.p99.as_secs_f64()) * 1e3;
    let added_p50 = (sp.p50.as_secs_f64() - sd.p50.as_secs_f64()) * 1e3;
    let (cp, cd, per) = node.conc;
    let n = sp.n;
    b.report.rows.push(Row::new(
        format!("preview proxy: requests/s, sequential, keep-alive, Node server (n={n})"),
        format!("{rp:.0} req/s"),
        format!("{rd:.0} req/s (direct)"),
        ratio(rp, rd),
        format!(">= {RPS_TARGET}x"),
        Verdict::of(rp >= rd * RPS_TARGET),
    ));
    b.report.rows.push(Row::new(
        format!("preview proxy vs a byte relay (the floor of two hops), sequential, keep-alive (n={n})"),
        format!("{rp:.0} req/s"),
        format!("{rr:.0} req/s (relay; {} of direct)", ratio(rr, rd)),
        ratio(rp, rr),
        "-",
        Verdict::Info,
    ));
    b.report.rows.push(Row::new(
        format!("preview proxy: requests/s, {CONCURRENCY} concurrent keep-alive clients (n={})", CONCURRENCY * per),
        format!("{cp:.0} req/s"),
        format!("{cd:.0} req/s (direct)"),
        ratio(cp, cd),
        format!(">= {RPS_TARGET}x"),
        Verdict::of(cp >= cd * RPS_TARGET),
    ));
    b.report.rows.push(Row::new(
        format!("preview proxy: latency p99, keep-alive, proxied vs direct (n={n})"),
        ms(sp.p99),
        format!("{} (direct)", ms(sd.p99)),
        format!("+{added_p99:.2} ms (p50 +{added_p50:.2} ms)"),
        format!("<= +{ADDED_P99_TARGET_MS:.0} ms"),
        Verdict::of(added_p99 <= ADDED_P99_TARGET_MS),
    ));
    let [hp, hd, hr] = httpd.rps();
    let [hsp, hsd, hsr] = httpd.summaries();
    let (hcp, hcd, hper) = httpd.conc;
    b.report.rows.push(Row::new(
        format!("preview proxy: requests/s, fresh connections, busybox httpd, sequential / {CONCURRENCY} concurrent (n={} / {})", hsp.n, CONCURRENCY * hper),
        format!("{hp:.0} / {hcp:.0} req/s"),
        format!("{hd:.0} / {hcd:.0} req/s (direct; relay {hr:.0} sequential)"),
        format!("{} / {}", ratio(hp, hd), ratio(hcp, hcd)),
        "-",
        Verdict::Info,
    ));
    b.report.sections.push((
        "9. preview proxy: proxied vs direct".into(),
        format!(
            "A server inside a sandbox (`network: none`, bound on the sandbox's 127.0.0.1:8000) serves a {BODY_BYTES}-byte \
             file. Proxied: `GET /preview/<id>/8000/index.html` on the daemon's TCP listener with the preview token \
             header: the admission (token and sandbox checks in SQLite on the first request; later requests reuse it \
             while no sandbox event and no preview change happened), an activity guard, the upstream connection \
             (kept alive when the server allows; a new one from a socket made ahead in the sandbox's network \
             namespace), HTTP/1.1 forwarding with hop-by-hop headers removed. Direct: the bench's own socket, made by \
             a thread that joined the sandbox's network namespace with setns(), to 127.0.0.1:8000 — the proxy's own \
             path to the server, without the proxy. Relayed: a byte relay in the bench (a host listener, a \
             connection into the sandbox per client connection, a thread copying each way), the floor of any \
             path with two hops and no HTTP work at all. Latency is measured by the client from sending the request (from \
             connecting, for fresh connections) to the last byte.\n\n\
             **Keep-alive (judged)**: Node's `http` server (`{NODE_IMAGE}` image) and clients that keep one \
             connection each, as a browser does: {n} sequential requests each way in alternating blocks of 100, then \
             {CONCURRENCY} concurrent clients of {per} requests each way. Daemon CPU per proxied request (user + \
             system, all its threads, read from /proc during the proxied blocks): {:.0} µs.\n\n\
             **Fresh connections (reported)**: busybox `httpd` closes every connection after one response, so each \
             proxied request costs two TCP connections (client to daemon, daemon to server) against one, and the \
             upstream connection cannot be reused: the worst case. Daemon CPU per proxied request: {:.0} µs.",
            node.cpu_us_per_request(),
            httpd.cpu_us_per_request(),
        ),
        vec![
            format!("{:<36} {}", "keep-alive, proxied", sp.line()),
            format!("{:<36} {}", "keep-alive, direct", sd.line()),
            format!("{:<36} {}", "keep-alive, relayed", sr.line()),
            format!("{:<36} {cp:.0} req/s proxied, {cd:.0} req/s direct", format!("keep-alive, {CONCURRENCY} concurrent")),
            format!("{:<36} {}", "fresh connections, proxied", hsp.line()),
            format!("{:<36} {}", "fresh connections, direct", hsd.line()),
            format!("{:<36} {}", "fresh connections, relayed", hsr.line()),
            format!(
                "{:<36} {hcp:.0} req/s proxied, {hcd:.0} req/s direct",
                format!("fresh connections, {CONCURRENCY} concurrent")
            ),
        ],
    ));
    Ok(())
}
