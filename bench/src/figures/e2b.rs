//! Figure 10: the E2B round trip (create + run `echo hi` + kill, template
//! `base`), twice:
//! * the E2B layer itself: the E2B wire protocol (`POST /sandboxes`, envd's
//!   Connect `process.Process/Start` stream, `DELETE /sandboxes/{id}`) against
//!   the native API doing the same work, both from one raw HTTP/1.1 client
//!   over kept-alive TCP connections to the daemon's listener;
//! * the official `e2b` Python SDK (`Sandbox.create()` + `commands.run("echo
//!   hi")` + `kill()`) against strata's typed Rust client over the Unix socket
//!   doing the same work (the SDK's own client-side cost included);
//! * the official `e2b` npm SDK (the current pinned version, on node) doing the
//!   same, against the same native round.
//!
//! The command is the one the SDK sends for `commands.run("echo hi")`:
//! `/bin/bash -l -c "echo hi"` as user `user` in `/home/user`, so both sides
//! of each comparison run the same login shell.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use strata_api::{CreateSandboxRequest, ExecRequest, ExecResult, Lifecycle};

use super::check_echo;
use crate::http1::Conn;
use crate::report::{Row, Verdict};
use crate::stats::{ratio, summarize};
use crate::Bench;

/// The strata image the E2B template `base` maps to.
const BASE: &str = "e2b-base";

/// The SDK side: one round per line read from stdin, its elapsed time (ms)
/// printed back, so the rounds interleave with the native ones.
const SCRIPT: &str = r#"
import sys, time
from e2b import Sandbox
for _ in sys.stdin:
    t = time.perf_counter()
    sb = Sandbox.create()
    r = sb.commands.run("echo hi")
    sb.kill()
    el = time.perf_counter() - t
    assert r.stdout == "hi\n" and r.exit_code == 0, (r.stdout, r.exit_code)
    print(f"{el * 1000:.3f}", flush=True)
"#;

/// The npm SDK's side, as [`SCRIPT`] (an ES module read from `-e`, run in the
/// directory the SDK is installed in).
const JS_SCRIPT: &str = r#"
import { Sandbox } from 'e2b'
import { createInterface } from 'node:readline'
for await (const _ of createInterface({ input: process.stdin })) {
  const t = performance.now()
  const sb = await Sandbox.create()
  const r = await sb.commands.run('echo hi')
  await sb.kill()
  const el = performance.now() - t
  if (r.stdout !== 'hi\n' || r.exitCode !== 0) { console.error('unexpected result', r); process.exit(1) }
  console.log(el.toFixed(3))
}
"#;

/// The running SDK process.
struct Sdk {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl Sdk {
    fn round(&mut self) -> Result<Duration> {
        use std::io::{BufRead, Write};
        self.stdin.write_all(b"go\n").and_then(|()| self.stdin.flush()).context("write to the SDK process")?;
        let mut line = String::new();
        self.stdout.read_line(&mut line).context("read from the SDK process")?;
        let ms: f64 =
            line.trim().parse().with_context(|| format!("the SDK process printed {line:?} (see its stderr above)"))?;
        Ok(Duration::from_secs_f64(ms / 1000.0))
    }
}

impl Drop for Sdk {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The E2B layer's own cost is at most this times the native API's (same client, same work).
const LAYER_TARGET: f64 = 1.15;

/// What envd runs for `commands.run("echo hi")` (the SDK's login shell, its user and home).
fn sdk_command() -> ExecRequest {
    ExecRequest {
        cmd: vec!["/bin/bash".into(), "-l".into(), "-c".into(), "echo hi".into()],
        user: Some("user".into()),
        cwd: Some("/home/user".into()),
        ..Default::default()
    }
}

/// One E2B round over the wire protocol: create, the Connect `Start` stream to its end, kill.
fn e2b_round(conn: &mut Conn, key: &str) -> Result<Duration> {
    let t = Instant::now();
    let auth = [("X-API-Key", key), ("Content-Type", "application/json")];
    let created = conn.request("POST", "/sandboxes", &auth, br#"{"templateID": "base", "timeout": 300}"#)?;
    if created.status != 201 {
        bail!("e2b create: {} {}", created.status, String::from_utf8_lossy(&created.body));
    }
    let v: serde_json::Value = serde_json::from_slice(&created.body).context("e2b create answer")?;
    let id = v["sandboxID"].as_str().context("no sandboxID")?.to_string();
    let cmd = sdk_command();
    let msg = serde_json::json!({"process": {"cmd": cmd.cmd[0], "args": cmd.cmd[1..], "envs": {}}}).to_string();
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    frame.extend_from_slice(msg.as_bytes());
    let envd = [
        ("X-Access-Token", key),
        ("E2b-Sandbox-Id", id.as_str()),
        ("E2b-Sandbox-Port", "49983"),
        ("Content-Type", "application/connect+json"),
        ("Connect-Protocol-Version", "1"),
        // `user:` — the SDK's default user.
        ("Authorization", "Basic dXNlcjo="),
    ];
    let run = conn.request("POST", "/process.Process/Start", &envd, &frame)?;
    let killed = conn.request("DELETE", &format!("/sandboxes/{id}"), &auth, b"")?;
    let el = t.elapsed();
    // "aGkK" is base64 of "hi\n"; the end event carries exit code 0 (omitted in proto3 JSON).
    let text = String::from_utf8_lossy(&run.body);
    if run.status != 200 || !text.contains("aGkK") || !text.contains("\"end\"") || text.contains("exitCode\":1") {
        bail!("e2b run: {} {text}", run.status);
    }
    if killed.status != 204 {
        bail!("e2b kill: {} {}", killed.status, String::from_utf8_lossy(&killed.body));
    }
    Ok(el)
}

/// The same round over the native API, from the same client: create, exec, destroy.
fn native_tcp_round(conn: &mut Conn, key: &str) -> Result<Duration> {
    let t = Instant::now();
    let bearer = format!("Bearer {key}");
    let h = [("Authorization", bearer.as_str()), ("Content-Type", "application/json")];
    let req = CreateSandboxRequest { source: BASE.into(), lifecycle: Lifecycle::Ephemeral, ..Default::default() };
    let created = conn.request("POST", "/v1/sandboxes", &h, &serde_json::to_vec(&req)?)?;
    if created.status != 201 {
        bail!("native create: {} {}", created.status, String::from_utf8_lossy(&created.body));
    }
    let v: serde_json::Value = serde_json::from_slice(&created.body).context("native create answer")?;
    let id = v["id"].as_str().context("no id")?.to_string();
    let ran = conn.request("POST", &format!("/v1/sandboxes/{id}/exec"), &h, &serde_json::to_vec(&sdk_command())?)?;
    let gone = conn.request("DELETE", &format!("/v1/sandboxes/{id}?force=true"), &h, b"")?;
    let el = t.elapsed();
    let r: ExecResult = serde_json::from_slice(&ran.body).with_context(|| format!("native exec: {}", ran.status))?;
    check_echo(&r)?;
    if gone.status != 200 {
        bail!("native destroy: {} {}", gone.status, String::from_utf8_lossy(&gone.body));
    }
    Ok(el)
}

pub async fn run(b: &mut Bench) -> Result<()> {
    let cfg = b.cfg.clone();
    let Some(listen) = cfg.listen.clone() else { bail!("the e2b figure needs the daemon's TCP listener (--listen)") };
    b.client.get_image(BASE).await.with_context(|| {
        format!("image {BASE:?} is not imported (bench/run.sh imports debian-python.tar.gz as {BASE})")
    })?;
    let key = std::fs::read_to_string(cfg.state_dir.join("api-token"))
        .context("read the daemon's api-token")?
        .trim()
        .to_string();
    let n = cfg.cli_runs;
    let warm = cfg.warmup.min(5);

    // 1. The E2B layer: the same raw client, the same work, E2B wire protocol vs native API.
    let (mut e2b_conn, mut native_conn) = (Conn::open(&listen)?, Conn::open(&listen)?);
    for _ in 0..warm {
        e2b_round(&mut e2b_conn, &key)?;
        native_tcp_round(&mut native_conn, &key)?;
    }
    let (mut wire, mut wire_native) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        if i % 2 == 0 {
            wire.push(e2b_round(&mut e2b_conn, &key)?);
            wire_native.push(native_tcp_round(&mut native_conn, &key)?);
        } else {
            wire_native.push(native_tcp_round(&mut native_conn, &key)?);
            wire.push(e2b_round(&mut e2b_conn, &key)?);
        }
    }
    let (we, wn) = (summarize(&wire), summarize(&wire_native));
    let layer = we.p50.as_secs_f64() / wn.p50.as_secs_f64();
    b.report.rows.push(Row::new(
        format!("E2B layer: wire protocol create + run + kill, p50 (same HTTP/1.1 client, n={n})"),
        crate::stats::ms(we.p50),
        format!("{} (native API)", crate::stats::ms(wn.p50)),
        ratio(we.p50.as_secs_f64(), wn.p50.as_secs_f64()),
        format!("<= {LAYER_TARGET}x"),
        Verdict::of(layer <= LAYER_TARGET),
    ));

    // 2. The official SDKs against the typed Rust client over the Unix socket.
    let url = format!("http://{listen}");
    let spawn = |cmd: &mut Command, what: &str| -> Result<Sdk> {
        let mut child = cmd
            .env("E2B_API_URL", &url)
            .env("E2B_SANDBOX_URL", &url)
            .env("E2B_API_KEY", &key)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .with_context(|| format!("run {what} (scripts/setup-host.sh installs it)"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            bail!("no pipes to the SDK process")
        };
        Ok(Sdk { child, stdin, stdout: std::io::BufReader::new(stdout) })
    };
    let js_version = std::fs::read_to_string(cfg.e2b_js.join("node_modules/e2b/package.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["version"].as_str().map(str::to_string))
        .with_context(|| format!("the npm e2b SDK in {} (scripts/setup-host.sh)", cfg.e2b_js.display()))?;
    let mut sdk_proc = spawn(Command::new(&cfg.e2b_python).args(["-c", SCRIPT]), "the e2b venv's python")?;
    let mut js_proc = spawn(
        Command::new("node").args(["--input-type=module", "-e", JS_SCRIPT]).current_dir(&cfg.e2b_js),
        "node with the npm e2b SDK",
    )?;
    let c = b.client.clone();
    let req = CreateSandboxRequest { source: BASE.into(), lifecycle: Lifecycle::Ephemeral, ..Default::default() };
    let native_round = || async {
        let t = Instant::now();
        let sb = c.create_sandbox(&req).await.context("create")?;
        let r = c.exec(&sb.id, &sdk_command()).await.context("exec")?;
        c.remove_sandbox(&sb.id, true).await.context("destroy")?;
        let el = t.elapsed();
        check_echo(&r)?;
        anyhow::Ok(el)
    };
    for _ in 0..warm {
        sdk_proc.round()?;
        js_proc.round()?;
        native_round().await?;
    }
    // Interleaved, rotating order: load from elsewhere hits all three alike.
    let (mut sdk, mut js, mut native) = (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        match i % 3 {
            0 => {
                sdk.push(sdk_proc.round()?);
                js.push(js_proc.round()?);
                native.push(native_round().await?);
            }
            1 => {
                native.push(native_round().await?);
                sdk.push(sdk_proc.round()?);
                js.push(js_proc.round()?);
            }
            _ => {
                js.push(js_proc.round()?);
                native.push(native_round().await?);
                sdk.push(sdk_proc.round()?);
            }
        }
    }
    drop(sdk_proc);
    drop(js_proc);
    let (se, sn, je) = (summarize(&sdk), summarize(&native), summarize(&js));
    b.report.rows.push(Row::new(
        format!("E2B SDK create + run `echo hi` + kill, p50 (e2b 2.63.0, n={n})"),
        crate::stats::ms(se.p50),
        format!("{} (native API)", crate::stats::ms(sn.p50)),
        ratio(se.p50.as_secs_f64(), sn.p50.as_secs_f64()),
        "-",
        Verdict::Info,
    ));
    b.report.rows.push(Row::new(
        format!("E2B SDK create + run `echo hi` + kill, p99 (e2b 2.63.0, n={n})"),
        crate::stats::ms(se.p99),
        format!("{} (native API)", crate::stats::ms(sn.p99)),
        ratio(se.p99.as_secs_f64(), sn.p99.as_secs_f64()),
        "-",
        Verdict::Info,
    ));
    b.report.rows.push(Row::new(
        format!("E2B JS SDK create + run `echo hi` + kill, p50 (npm e2b {js_version}, node, n={n})"),
        crate::stats::ms(je.p50),
        format!("{} (native API)", crate::stats::ms(sn.p50)),
        ratio(je.p50.as_secs_f64(), sn.p50.as_secs_f64()),
        "-",
        Verdict::Info,
    ));
    b.report.sections.push((
        "10. E2B compatibility: the layer and the SDKs' round trips".into(),
        format!(
            "Every round creates a sandbox of template `base` (image `{BASE}`, the Debian test image), runs what \
             `commands.run(\"echo hi\")` runs (`/bin/bash -l -c \"echo hi\"` as user `user` in `/home/user`: a \
             login shell; stdout checked) and destroys it. **The E2B layer**: the E2B wire protocol (`POST /sandboxes`, \
             envd's Connect `process.Process/Start` stream read to its end event, `DELETE /sandboxes/{{id}}`) against \
             the native API (`POST /v1/sandboxes`, `POST .../exec`, `DELETE`), both sent by the same minimal HTTP/1.1 \
             client over one kept-alive TCP connection each to the daemon's listener: the difference is the E2B \
             layer's own work (it calls the engine in-process). **The SDK**: the official `e2b` Python SDK (2.63.0, \
             HTTP/2 cleartext as it defaults to) runs `Sandbox.create()`, `commands.run(\"echo hi\")` and `kill()` in \
             one Python process, each round timed in Python, against strata's typed Rust client over the Unix socket \
             doing the same work: the difference adds the SDK's own client-side cost (it builds its HTTP clients for \
             every sandbox, speaks Connect over HTTP/2, parses in Python). The npm SDK ({js_version}, on node, \
             Connect over fetch) runs the same round in one node process, interleaved with both. The rounds are \
             interleaved (rotating order), after {warm} warm-up rounds of each.",
        ),
        vec![
            format!("{:<28} {}", "e2b wire protocol", we.line()),
            format!("{:<28} {}", "native API (same client)", wn.line()),
            format!("{:<28} {}", "e2b SDK round trip", se.line()),
            format!("{:<28} {}", "e2b JS SDK round trip", je.line()),
            format!("{:<28} {}", "native API round trip", sn.line()),
        ],
    ));
    Ok(())
}
