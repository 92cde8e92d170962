//! Figure 9: the E2B round trip through the official `e2b` Python SDK
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

/// The SDK loop: warm-up rounds, then one elapsed time (ms) per line.
const SCRIPT: &str = r#"
import sys, time
from e2b import Sandbox
warm, n = int(sys.argv[1]), int(sys.argv[2])
for i in range(warm + n):
    t = time.perf_counter()
    sb = Sandbox.create()
    r = sb.commands.run("echo hi")
    sb.kill()
    el = time.perf_counter() - t
    assert r.stdout == "hi\n" and r.exit_code == 0, (r.stdout, r.exit_code)
    if i >= warm:
        print(f"{el * 1000:.3f}", flush=True)
"#;

pub async fn run(b: &mut Bench) -> Result<()> {
    let cfg = b.cfg.clone();
    let Some(listen) = cfg.listen.clone() else { bail!("the e2b figure needs the daemon's TCP listener (--listen)") };
    b.client.get_image(BASE).await.with_context(|| format!("image {BASE:?} is not imported (bench/run.sh imports debian-python.tar.gz as {BASE})"))?;
    let key = std::fs::read_to_string(cfg.state_dir.join("api-token")).context("read the daemon's api-token")?.trim().to_string();
    let n = cfg.cli_runs;
    let url = format!("http://{listen}");
    let out = Command::new(&cfg.e2b_python)
        .args(["-c", SCRIPT, &cfg.warmup.min(5).to_string(), &n.to_string()])
        .env("E2B_API_URL", &url)
        .env("E2B_SANDBOX_URL", &url)
        .env("E2B_API_KEY", &key)
        .output()
        .with_context(|| format!("run {} (the e2b venv: scripts/setup-host.sh)", cfg.e2b_python.display()))?;
    if !out.status.success() {
        bail!("the e2b SDK loop failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let sdk: Vec<Duration> = String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.trim().parse::<f64>().ok()).map(|ms| Duration::from_secs_f64(ms / 1000.0)).collect();
    if sdk.len() != n {
        bail!("the e2b SDK loop printed {} timings, expected {n}", sdk.len());
    }

    // The native round trip over the Unix socket, same image, same count.
    let c = b.client.clone();
    let req = CreateSandboxRequest { source: BASE.into(), lifecycle: Lifecycle::Ephemeral, ..Default::default() };
    let mut native = Vec::with_capacity(n);
    for i in 0..cfg.warmup.min(5) + n {
        let t = Instant::now();
        let sb = c.create_sandbox(&req).await.context("create")?;
        let r = c.exec(&sb.id, &echo_req()).await.context("exec")?;
        c.remove_sandbox(&sb.id, true).await.context("destroy")?;
        let el = t.elapsed();
        check_echo(&r)?;
        if i >= cfg.warmup.min(5) {
            native.push(el);
        }
    }
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
        "9. E2B compatibility: the SDK's round trip".into(),
        format!(
            "The official `e2b` Python SDK (2.63.0, HTTP/2 cleartext as it defaults to) runs `Sandbox.create()` \
             (template `base` = image `{BASE}`, the Debian test image), `commands.run(\"echo hi\")` (stdout checked) \
             and `kill()` {n} times in one Python process against the daemon's TCP listener ({w} warm-up rounds \
             first); each round is timed in Python. Baseline: the same round trip through strata's typed Rust \
             client over the Unix socket (create an ephemeral sandbox of `{BASE}`, exec `echo hi`, destroy), \
             {n} times after the SDK's. The difference is the E2B layer (a translation onto the native API over \
             loopback TCP, the Connect stream of the command) plus the SDK's own client-side cost.",
            w = cfg.warmup.min(5)
        ),
        vec![format!("{:<28} {}", "e2b SDK round trip", se.line()), format!("{:<28} {}", "native API round trip", sn.line())],
    ));
    Ok(())
}
