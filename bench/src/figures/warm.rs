//! Figure 11: warm checkpoints. A Python server that warms up before it
//! listens (imports, an in-memory table), in the Debian + python image: how
//! long until N forked children all serve, forked from a checkpoint that kept
//! the running server (warm) against forked from its filesystem and started
//! again in every child (cold: boot + warm-up). Also what keeping the
//! processes adds to the checkpoint itself.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use strata_api::{CheckpointRequest, CreateSandboxRequest, ExecRequest, ForkRequest, Lifecycle};
use strata_client::Client;

use super::exec_ok;
use crate::report::{Row, Verdict};
use crate::stats::{ms, ratio, summarize};
use crate::Bench;

/// The image (bench/run.sh imports debian-python.tar.gz under this name).
const IMAGE: &str = "e2b-base";
/// Children per fork.
const CHILDREN: u32 = 4;
/// Rounds of each kind.
const ROUNDS: usize = 5;
/// Children of the wide warm fork (issue 18: 16 serving within 600 ms).
const WIDE: u32 = 16;
/// Rounds of the wide warm fork.
const WIDE_ROUNDS: usize = 3;
/// Target of the wide warm fork.
const WIDE_TARGET_MS: f64 = 600.0;

/// The server: imports a good part of the standard library and builds a table
/// in memory (the warm-up a dev server pays), then serves HTTP on :8000.
const SERVER: &str =
    "import asyncio, concurrent.futures, csv, decimal, email.mime.multipart, http.server, json, logging.handlers, \
    multiprocessing, sqlite3, ssl, tarfile, unittest, urllib.request, xml.etree.ElementTree, zipfile\n\
table = {i: str(i) * 8 for i in range(400000)}\n\
http.server.ThreadingHTTPServer(('127.0.0.1', 8000), http.server.SimpleHTTPRequestHandler).serve_forever()\n";

/// Waits inside the sandbox until something listens on :8000 (bash's /dev/tcp, no Python start-up).
fn ready_req() -> ExecRequest {
    let script =
        "for i in $(seq 3000); do (exec 3<>/dev/tcp/127.0.0.1/8000) 2>/dev/null && exit 0; sleep 0.005; done; exit 1";
    ExecRequest { cmd: vec!["bash".into(), "-c".into(), script.into()], ..Default::default() }
}

fn server_req() -> ExecRequest {
    ExecRequest { cmd: vec!["python3".into(), "-c".into(), SERVER.into()], ..Default::default() }
}

async fn all_ready(c: &Client, ids: &[String]) -> Result<()> {
    let waits = ids.iter().map(|id| exec_ok(c, id, ready_req()));
    for r in futures_util::future::join_all(waits).await {
        r.context("waiting for the server")?;
    }
    Ok(())
}

async fn remove_all(c: &Client, ids: &[String]) {
    for id in ids {
        let _ = c.remove_sandbox(id, true).await;
    }
}

fn fork_req(source: &str, processes: bool, count: u32) -> ForkRequest {
    ForkRequest {
        source: source.into(),
        count,
        name_prefix: None,
        lifecycle: Lifecycle::Ephemeral,
        ttl: None,
        limits: None,
        network: None,
        processes: Some(processes),
        isolation: None,
    }
}

/// Fork `count` children from the warm checkpoint until every child serves.
async fn warm_round(c: &Client, ckpt: &str, count: u32) -> Result<(Duration, Vec<String>)> {
    let t = Instant::now();
    let r = c.fork(&fork_req(ckpt, true, count)).await.context("warm fork")?;
    all_ready(c, &r.sandboxes).await?;
    Ok((t.elapsed(), r.sandboxes))
}

/// Fork the same filesystem, start the server in every child, until every child serves.
async fn cold_round(c: &Client, ckpt: &str) -> Result<(Duration, Vec<String>)> {
    let t = Instant::now();
    let r = c.fork(&fork_req(ckpt, false, CHILDREN)).await.context("cold fork")?;
    for id in &r.sandboxes {
        c.start_process(id, &server_req()).await.context("start the server")?;
    }
    all_ready(c, &r.sandboxes).await?;
    Ok((t.elapsed(), r.sandboxes))
}

pub async fn run(b: &mut Bench) -> Result<()> {
    let c = b.client.clone();
    c.get_image(IMAGE).await.with_context(|| {
        format!("image {IMAGE:?} is not imported (bench/run.sh imports debian-python.tar.gz as {IMAGE})")
    })?;
    let src = c
        .create_sandbox(&CreateSandboxRequest { source: IMAGE.into(), ..Default::default() })
        .await
        .context("create the source")?;
    let res = measure(b, &c, &src.id).await;
    let _ = c.remove_sandbox(&src.id, true).await;
    res
}

async fn measure(b: &mut Bench, c: &Client, src: &str) -> Result<()> {
    // The source: server started and warmed up once.
    let t = Instant::now();
    c.start_process(src, &server_req()).await.context("start the server")?;
    exec_ok(c, src, ready_req()).await.context("the source's server")?;
    let first_warmup = t.elapsed();
    let cold_ck = c.checkpoint(src, &CheckpointRequest::default()).await.context("checkpoint")?;
    let t = Instant::now();
    let warm_ck = c
        .checkpoint(src, &CheckpointRequest { processes: true, ..Default::default() })
        .await
        .context("warm checkpoint")?;
    let warm_ck_time = t.elapsed();
    let Some(image) = warm_ck.processes.clone() else { bail!("the warm checkpoint kept no processes") };

    // A warm-up round of each, then rounds alternating which goes first.
    for warm in [true, false] {
        let (_, ids) =
            if warm { warm_round(c, &warm_ck.id, CHILDREN).await? } else { cold_round(c, &cold_ck.id).await? };
        remove_all(c, &ids).await;
    }
    let (mut ws, mut cs) = (Vec::new(), Vec::new());
    for i in 0..ROUNDS {
        for k in 0..2 {
            let warm = (i + k) % 2 == 0;
            let (el, ids) =
                if warm { warm_round(c, &warm_ck.id, CHILDREN).await? } else { cold_round(c, &cold_ck.id).await? };
            remove_all(c, &ids).await;
            if warm {
                ws.push(el)
            } else {
                cs.push(el)
            }
        }
    }
    // The wide fork: 16 children, and the host memory each takes once serving.
    let source_mem = processes_memory(src).context("the source's memory")?;
    let (mut wide, mut per_child) = (Vec::new(), Vec::new());
    for _ in 0..WIDE_ROUNDS {
        let (el, ids) = warm_round(c, &warm_ck.id, WIDE).await?;
        wide.push(el);
        for id in &ids {
            per_child.push(processes_memory(id).with_context(|| format!("the memory of child {id}"))?);
        }
        remove_all(c, &ids).await;
    }
    let sx = summarize(&wide);
    let n = per_child.len().max(1) as f64;
    let (rss, pss) = (
        per_child.iter().map(|m| m.rss_kib).sum::<u64>() as f64 / n,
        per_child.iter().map(|m| m.pss_kib).sum::<u64>() as f64 / n,
    );
    let (sw, sc) = (summarize(&ws), summarize(&cs));
    b.report.rows.push(Row::new(
        format!("warm fork: {CHILDREN} children serving, from a checkpoint that kept the warmed-up server, median of {ROUNDS}"),
        ms(sw.p50),
        format!("{} (cold: fork {CHILDREN} + start and warm up the server in each)", ms(sc.p50)),
        format!("{:.1}x faster", sc.p50.as_secs_f64() / sw.p50.as_secs_f64()),
        "-",
        Verdict::Info,
    ));
    b.report.rows.push(Row::new(
        format!("warm fork: {WIDE} children serving, from that checkpoint, median of {WIDE_ROUNDS} (min-max)"),
        format!("{} ({}-{})", ms(sx.p50), ms(sx.min), ms(sx.max)),
        format!("{} ({CHILDREN} children, above)", ms(sw.p50)),
        ratio(sx.p50.as_secs_f64(), sw.p50.as_secs_f64()),
        format!("<= {WIDE_TARGET_MS:.0} ms"),
        Verdict::of(sx.p50.as_secs_f64() * 1000.0 <= WIDE_TARGET_MS),
    ));
    b.report.rows.push(Row::new(
        format!("host memory per child of those {WIDE}, serving: RSS / PSS of its processes, avg"),
        format!("{:.1} MiB / {:.1} MiB", rss / 1024.0, pss / 1024.0),
        format!(
            "{:.1} MiB / {:.1} MiB (the source sandbox's, with its server)",
            source_mem.rss_kib as f64 / 1024.0,
            source_mem.pss_kib as f64 / 1024.0
        ),
        format!("{:.2}x (PSS)", pss / (source_mem.pss_kib.max(1) as f64)),
        "(reported)",
        Verdict::Info,
    ));
    b.report.rows.push(Row::new(
        "warm checkpoint of that sandbox: API wall [processes copied in / image size]".to_string(),
        format!("{} [{} ms / {:.1} MiB]", ms(warm_ck_time), image.dump_ms, image.bytes as f64 / 1048576.0),
        format!("{} ms (the same checkpoint without processes)", cold_ck.duration_ms),
        ratio(warm_ck_time.as_secs_f64() * 1000.0, cold_ck.duration_ms.max(1) as f64),
        "-",
        Verdict::Info,
    ));
    b.report.sections.push((
        "11. warm checkpoints: fork with the processes running".into(),
        format!(
            "A sandbox of the Debian 12 + python image (`{IMAGE}`) runs a Python HTTP server that first imports 16 standard-library \
             packages and builds a 400,000-entry table in memory (its warm-up: {} the first time), then listens on 127.0.0.1:8000. \
             It is checkpointed twice: without processes (cold) and with them (`processes: true`, warm). Warm round: `fork` of \
             {CHILDREN} children from the warm checkpoint (each restores the server's processes with CRIU on its own root and takes \
             its own identity), timed until the server answers a TCP connect in every child (bash `/dev/tcp` inside the child, \
             polled every 5 ms). Cold round: `fork` of {CHILDREN} from the cold checkpoint, the server started in each through the \
             API, timed the same way. One warm-up round of each, then {ROUNDS} rounds each, alternating which goes first; children \
             are removed between rounds. Then {WIDE_ROUNDS} warm rounds of {WIDE} children, timed the same way; once all serve, the \
             host memory of each child is read: VmRSS and Pss (/proc/PID/smaps_rollup) summed over the processes of its cgroup \
             (its pid 1, the server's), against the same sums for the source sandbox. Pss splits pages shared between processes \
             (the image's files in the page cache); a CRIU restore gives every child its own copy of the server's memory.",
            ms(first_warmup)
        ),
        vec![
            format!("{:<28} {}", "warm fork until serving", sw.line()),
            format!("{:<28} {}", "cold fork + warm-up", sc.line()),
            format!("{:<28} {}", format!("warm fork of {WIDE}"), sx.line()),
        ],
    ));
    Ok(())
}

/// Host memory of a sandbox's processes (those of its cgroup).
struct ProcessesMemory {
    rss_kib: u64,
    pss_kib: u64,
}

fn processes_memory(id: &str) -> Result<ProcessesMemory> {
    let cg = crate::sys::sandbox_memcg(id).with_context(|| format!("no memory cgroup for sandbox {id}"))?;
    let pids = crate::sys::cgroup_pids(&cg);
    if pids.is_empty() {
        bail!("no processes in {}", cg.display());
    }
    let (mut rss_kib, mut pss_kib) = (0, 0);
    for pid in pids {
        rss_kib += crate::sys::rss_kib(pid).unwrap_or(0);
        pss_kib += crate::sys::pss_kib(pid).unwrap_or(0);
    }
    Ok(ProcessesMemory { rss_kib, pss_kib })
}
