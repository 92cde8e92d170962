//! Figure 9: what the preview proxy costs. The same busybox `httpd` inside a
//! sandbox (bound on the sandbox's 127.0.0.1:8000, loopback only) is asked for
//! the same small file two ways:
//!
//! * **proxied**: through the daemon's TCP listener, path-based preview URL
//!   with the token header (token lookup, sandbox lookup, activity guard, a
//!   socket made in the sandbox's network namespace, HTTP/1.1 forwarding);
//! * **direct**: the bench's own socket, made by a thread that has joined the
//!   sandbox's network namespace with `setns()` and connects to 127.0.0.1:8000
//!   — the same path the proxy takes to the server, without the proxy.
//!
//! Every request is a fresh connection with `Connection: close` both ways
//! (busybox httpd closes after each response, so the proxy cannot reuse
//! upstream connections either): a worst case for the proxy's per-request work.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use strata_api::{CreatePreviewRequest, ExecRequest};

use super::{create_req, exec_ok};
use crate::report::{Row, Verdict};
use crate::stats::{ms, ratio, summarize};
use crate::Bench;

/// Least proxied/direct throughput (sequential requests).
const RPS_TARGET: f64 = 0.5;
/// Most the proxy may add to the p99 of one request.
const ADDED_P99_TARGET_MS: f64 = 2.0;
/// The served file's size.
const BODY_BYTES: usize = 1024;
/// Concurrent clients of the throughput run.
const CONCURRENCY: usize = 8;

/// Where requests go.
#[derive(Clone)]
enum Path {
    /// Through the daemon: its TCP address, the request target, the token.
    Proxied { addr: String, target: String, token: String },
    /// Straight to the server, from inside the sandbox's network namespace.
    Direct,
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

/// One GET on a fresh connection; checks the status and the body's size.
fn request(p: &Path) -> Result<Duration> {
    let t = Instant::now();
    let (mut s, head) = match p {
        Path::Proxied { addr, target, token } => (
            TcpStream::connect(addr.as_str()).context("connect to the daemon")?,
            format!(
                "GET {target} HTTP/1.1\r\nHost: {addr}\r\nX-Strata-Preview-Token: {token}\r\nConnection: close\r\n\r\n"
            ),
        ),
        Path::Direct => (
            TcpStream::connect("127.0.0.1:8000").context("connect to the server")?,
            "GET /index.html HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nConnection: close\r\n\r\n".to_string(),
        ),
    };
    s.set_nodelay(true)?;
    s.write_all(head.as_bytes())?;
    let mut buf = Vec::with_capacity(4096);
    s.read_to_end(&mut buf)?;
    let el = t.elapsed();
    if !buf.starts_with(b"HTTP/1.1 200") || buf.len() < BODY_BYTES {
        bail!("unexpected response: {:?}", String::from_utf8_lossy(&buf[..buf.len().min(300)]));
    }
    Ok(el)
}

/// `n` sequential requests on a thread (in the sandbox's netns for `Direct`): per-request latencies and the wall time.
fn sequential(p: Path, pid: i32, n: usize) -> Result<(Vec<Duration>, Duration)> {
    std::thread::spawn(move || {
        if matches!(p, Path::Direct) {
            join_netns(pid)?;
        }
        let t = Instant::now();
        let lat = (0..n).map(|_| request(&p)).collect::<Result<Vec<_>>>()?;
        Ok((lat, t.elapsed()))
    })
    .join()
    .map_err(|_| anyhow::anyhow!("client thread panicked"))?
}

/// `CONCURRENCY` clients of `n` requests each: requests per second.
fn concurrent(p: &Path, pid: i32, n: usize) -> Result<f64> {
    let t = Instant::now();
    let handles: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let p = p.clone();
            std::thread::spawn(move || -> Result<()> {
                if matches!(p, Path::Direct) {
                    join_netns(pid)?;
                }
                for _ in 0..n {
                    request(&p)?;
                }
                Ok(())
            })
        })
        .collect();
    for h in handles {
        h.join().map_err(|_| anyhow::anyhow!("client thread panicked"))??;
    }
    Ok((CONCURRENCY * n) as f64 / t.elapsed().as_secs_f64())
}

pub async fn run(b: &mut Bench) -> Result<()> {
    let cfg = b.cfg.clone();
    let c = b.client.clone();
    let sb = c.create_sandbox(&create_req(&cfg.image)).await.context("create sandbox")?;
    let id = sb.id.clone();
    let measured = async {
        let setup = format!("mkdir -p /www && head -c {BODY_BYTES} /dev/zero | tr '\\0' x > /www/index.html && httpd -p 127.0.0.1:8000 -h /www");
        exec_ok(&c, &id, ExecRequest { cmd: vec!["sh".into(), "-c".into(), setup], ..Default::default() }).await?;
        let pid = c.get_sandbox(&id).await?.init_pid.context("the sandbox has no init pid")?;
        let p = c.create_preview(&id, &CreatePreviewRequest { port: Some(8000), ..Default::default() }).await.context("create preview")?;
        let url = p.preview.url_path.strip_prefix("http://").context("the daemon has no TCP listener (bench/run.sh starts it with --listen)")?;
        let (addr, path) = url.split_once('/').context("preview URL")?;
        let proxied = Path::Proxied { addr: addr.to_string(), target: format!("/{path}index.html"), token: p.token.clone() };
        let n = (cfg.runs * 10).max(100);
        let block = 100.min(n);
        let warm = (cfg.warmup * 10).max(10);
        // Blocking clients on their own threads; nothing else runs on this runtime meanwhile.
        (|| -> Result<_> {
            sequential(proxied.clone(), pid, warm)?;
            sequential(Path::Direct, pid, warm)?;
            // Alternating blocks, so machine noise hits both alike.
            let (mut lp, mut ld, mut wp, mut wd) = (vec![], vec![], Duration::ZERO, Duration::ZERO);
            for i in 0..n.div_ceil(block) {
                for k in 0..2 {
                    if (i + k) % 2 == 0 {
                        let (l, w) = sequential(proxied.clone(), pid, block)?;
                        lp.extend(l);
                        wp += w;
                    } else {
                        let (l, w) = sequential(Path::Direct, pid, block)?;
                        ld.extend(l);
                        wd += w;
                    }
                }
            }
            let per = (n / CONCURRENCY).max(10);
            let cp = concurrent(&proxied, pid, per)?;
            let cd = concurrent(&Path::Direct, pid, per)?;
            Ok((lp, ld, wp, wd, cp, cd, per))
        })()
    }
    .await;
    let _ = c.remove_sandbox(&id, true).await;
    let (lp, ld, wp, wd, cp, cd, per) = measured?;
    let (sp, sd) = (summarize(&lp), summarize(&ld));
    let (rp, rd) = (lp.len() as f64 / wp.as_secs_f64(), ld.len() as f64 / wd.as_secs_f64());
    let added_p99 = (sp.p99.as_secs_f64() - sd.p99.as_secs_f64()) * 1e3;
    let added_p50 = (sp.p50.as_secs_f64() - sd.p50.as_secs_f64()) * 1e3;
    b.report.rows.push(Row::new(
        format!("preview proxy: requests/s, sequential, fresh connections (n={})", lp.len()),
        format!("{rp:.0} req/s"),
        format!("{rd:.0} req/s (direct)"),
        ratio(rp, rd),
        format!(">= {RPS_TARGET}x"),
        Verdict::of(rp >= rd * RPS_TARGET),
    ));
    b.report.rows.push(Row::new(
        format!("preview proxy: latency p99, proxied vs direct (n={})", lp.len()),
        ms(sp.p99),
        format!("{} (direct)", ms(sd.p99)),
        format!("+{added_p99:.2} ms (p50 +{added_p50:.2} ms)"),
        format!("<= +{ADDED_P99_TARGET_MS:.0} ms"),
        Verdict::of(added_p99 <= ADDED_P99_TARGET_MS),
    ));
    b.report.rows.push(Row::new(
        format!("preview proxy: requests/s, {CONCURRENCY} concurrent clients (n={})", CONCURRENCY * per),
        format!("{cp:.0} req/s"),
        format!("{cd:.0} req/s (direct)"),
        ratio(cp, cd),
        "-",
        Verdict::Info,
    ));
    b.report.sections.push((
        "9. preview proxy: proxied vs direct".into(),
        format!(
            "busybox `httpd` inside a sandbox (`network: none`, bound on the sandbox's 127.0.0.1:8000) serves a \
             {BODY_BYTES}-byte file. Proxied: `GET /preview/<id>/8000/index.html` on the daemon's TCP listener with \
             the preview token header (token and sandbox lookups in SQLite, an activity guard, a socket made by a \
             thread that joined the sandbox's network namespace, HTTP/1.1 forwarding with hop-by-hop headers \
             removed). Direct: the bench's own socket, made by a thread that joined the sandbox's network \
             namespace with setns(), to 127.0.0.1:8000 — the proxy's own path to the server, without the proxy. \
             Every request is a new connection with `Connection: close` (busybox httpd serves one request per \
             connection, so the proxy cannot reuse upstream connections either): {n} sequential requests each way \
             in alternating blocks of 100, then {CONCURRENCY} concurrent clients of {per} requests each way. \
             Latency is measured by the client from connect to the last byte.",
            n = lp.len()
        ),
        vec![
            format!("{:<28} {}", "proxied", sp.line()),
            format!("{:<28} {}", "direct", sd.line()),
            format!("{:<28} {cp:.0} req/s proxied, {cd:.0} req/s direct", format!("{CONCURRENCY} concurrent clients")),
        ],
    ));
    Ok(())
}
