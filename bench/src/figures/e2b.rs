//! Figure 10: the E2B round trip through the official `e2b` Python SDK
//! (`Sandbox.create()` + `commands.run("echo hi")` + `kill()`, template `base`)
//! against the same round trip through strata's typed client (create from the
//! same image, exec `echo hi`, destroy).

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use strata_api::{CreateSandboxRequest, Lifecycle};

use super::{check_echo, echo_req};
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
    let url = format!("http://{listen}");
    let mut child = Command::new(&cfg.e2b_python)
        .args(["-c", SCRIPT])
        .env("E2B_API_URL", &url)
        .env("E2B_SANDBOX_URL", &url)
        .env("E2B_API_KEY", &key)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("run {} (the e2b venv: scripts/setup-host.sh)", cfg.e2b_python.display()))?;
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        bail!("no pipes to the SDK process")
    };
    let mut sdk_proc = Sdk { child, stdin, stdout: std::io::BufReader::new(stdout) };

    // The native round trip over the Unix socket, same image.
    let c = b.client.clone();
    let req = CreateSandboxRequest { source: BASE.into(), lifecycle: Lifecycle::Ephemeral, ..Default::default() };
    let native_round = || async {
        let t = Instant::now();
        let sb = c.create_sandbox(&req).await.context("create")?;
        let r = c.exec(&sb.id, &echo_req()).await.context("exec")?;
        c.remove_sandbox(&sb.id, true).await.context("destroy")?;
        let el = t.elapsed();
        check_echo(&r)?;
        anyhow::Ok(el)
    };
    let warm = cfg.warmup.min(5);
    for _ in 0..warm {
        sdk_proc.round()?;
        native_round().await?;
    }
    // Interleaved, alternating order: load from elsewhere hits both alike.
    let (mut sdk, mut native) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        if i % 2 == 0 {
            sdk.push(sdk_proc.round()?);
            native.push(native_round().await?);
        } else {
            native.push(native_round().await?);
            sdk.push(sdk_proc.round()?);
        }
    }
    drop(sdk_proc);
    let (se, sn) = (summarize(&sdk), summarize(&native));
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
    b.report.sections.push((
        "10. E2B compatibility: the SDK's round trip".into(),
        format!(
            "The official `e2b` Python SDK (2.63.0, HTTP/2 cleartext as it defaults to) runs `Sandbox.create()` \
             (template `base` = image `{BASE}`, the Debian test image), `commands.run(\"echo hi\")` (stdout checked) \
             and `kill()` {n} times in one Python process against the daemon's TCP listener, each round timed in \
             Python. Baseline: the same round trip through strata's typed Rust client over the Unix socket \
             (create an ephemeral sandbox of `{BASE}`, exec `echo hi`, destroy). The two are interleaved \
             (alternating order), after {w} warm-up rounds of each. The difference is the E2B layer (a translation onto the native API over \
             loopback TCP, the Connect stream of the command) plus the SDK's own client-side cost.",
            w = warm
        ),
        vec![format!("{:<28} {}", "e2b SDK round trip", se.line()), format!("{:<28} {}", "native API round trip", sn.line())],
    ));
    Ok(())
}
