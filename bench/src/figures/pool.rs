//! Figure 14: the warm pool. A second daemon started with `--warm-pool
//! busybox=N` (its own state directory, socket and network pool): create ->
//! first exec -> destroy when the create adopts a pool member, against bwrap
//! and against the same cycle on the bench's daemon without a pool, all
//! interleaved; the refill after each adoption, and a burst of N creates.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use strata_client::Client;

use super::create_req;
use crate::report::{Row, Verdict};
use crate::stats::{ms, ratio, summarize};
use crate::sys::timed;
use crate::Bench;

/// Members kept booted.
const POOL: u64 = 4;
/// The second daemon's egress address pool (disjoint from the bench daemon's default).
const NETWORK_POOL: &str = "10.214.0.0/24";

/// The pooled daemon: stopped (SIGTERM, then SIGKILL) when dropped.
struct PoolDaemon {
    child: Child,
    client: Client,
}

impl Drop for PoolDaemon {
    fn drop(&mut self) {
        crate::sys::kill(self.child.id() as i32, libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `--init-binary` the bench's daemon was started with (its command line), if any.
fn init_binary_of(pid: i32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<String> = raw.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    args.iter().position(|a| a == "--init-binary").and_then(|i| args.get(i + 1).cloned())
}

fn start(strata: &Path, work: &Path, init: Option<String>) -> Result<PoolDaemon> {
    let dir = work.join("pool-daemon");
    std::fs::create_dir_all(&dir)?;
    let socket: PathBuf = dir.join("s.sock");
    let log = std::fs::File::create(dir.join("daemon.log"))?;
    let mut cmd = Command::new(strata);
    cmd.arg("daemon")
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--socket")
        .arg(&socket)
        .arg("--network-pool")
        .arg(NETWORK_POOL)
        .arg("--warm-pool")
        .arg(format!("busybox={POOL}"));
    if let Some(i) = init {
        cmd.arg("--init-binary").arg(i);
    }
    let child =
        cmd.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log).spawn().context("start the pooled daemon")?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        if Instant::now() > deadline {
            bail!("the pooled daemon did not open {} (log: {})", socket.display(), dir.join("daemon.log").display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(PoolDaemon { child, client: Client::unix(&socket) })
}

/// Members ready now.
async fn ready(c: &Client) -> Result<u64> {
    Ok(c.warm_pools().await?.first().map_or(0, |p| p.ready))
}

/// Waits until the pool is full again; returns how long that took.
async fn refilled(c: &Client) -> Result<Duration> {
    let t = Instant::now();
    while ready(c).await? < POOL {
        if t.elapsed() > Duration::from_secs(60) {
            bail!("the warm pool did not refill within 60 s: {:?}", c.warm_pools().await?);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(t.elapsed())
}

/// create -> exec `echo hi` -> destroy of the image through `c`.
async fn cycle(c: &Client, image: &str) -> Result<super::create::Cycle> {
    super::create::cycle(c, &create_req(image)).await
}

pub async fn run(b: &mut Bench) -> Result<()> {
    let cfg = b.cfg.clone();
    let rootfs = cfg.images.join("busybox-rootfs");
    let rs = rootfs.to_string_lossy().into_owned();
    let bw = super::create::bwrap_echo(&rs);
    let d = start(&cfg.strata, &cfg.work, init_binary_of(cfg.daemon_pid))?;
    let pc = d.client.clone();
    let tar = cfg.images.join("busybox-rootfs.tar");
    let out = Command::new(&cfg.strata)
        .arg("--socket")
        .arg(cfg.work.join("pool-daemon/s.sock"))
        .args(["image", "import"])
        .arg(&tar)
        .args(["--name", "busybox"])
        .output()?;
    if !out.status.success() {
        bail!("importing busybox into the pooled daemon: {}", String::from_utf8_lossy(&out.stderr));
    }
    let fill = refilled(&pc).await.context("first fill")?;

    let c = b.client.clone();
    for _ in 0..cfg.warmup {
        cycle(&pc, "busybox").await?;
        refilled(&pc).await?;
        cycle(&c, &cfg.image).await?;
        timed(&bw, Some("hi\n"))?;
    }
    let before = pc.warm_pools().await?[0].adopted;
    let n = cfg.runs.min(100);
    let (mut pooled, mut cold, mut bwrap, mut refill) = (vec![], vec![], vec![], vec![]);
    let mut phases: [Vec<Duration>; 3] = Default::default();
    for i in 0..n {
        for k in 0..3 {
            match (i + k) % 3 {
                0 => {
                    let r = cycle(&pc, "busybox").await?;
                    pooled.push(r.total);
                    for (v, d) in phases.iter_mut().zip([r.create, r.exec, r.destroy]) {
                        v.push(d);
                    }
                    refill.push(refilled(&pc).await?);
                }
                1 => cold.push(cycle(&c, &cfg.image).await?.total),
                _ => bwrap.push(timed(&bw, Some("hi\n"))?),
            }
        }
    }
    let adopted = pc.warm_pools().await?[0].adopted - before;

    // A burst: the pool's size of creates back to back (all adopt), then one more (empty: a boot).
    let t = Instant::now();
    let mut burst = vec![];
    for _ in 0..=POOL {
        let s = Instant::now();
        burst.push((pc.create_sandbox(&create_req("busybox")).await?.id, s.elapsed()));
    }
    let burst_total = t.elapsed();
    for (id, _) in &burst {
        pc.remove_sandbox(id, true).await?;
    }
    let burst_adopted: Vec<Duration> = burst.iter().take(POOL as usize).map(|b| b.1).collect();
    let burst_miss = burst.last().map(|b| b.1).unwrap_or_default();
    let status = pc.warm_pools().await?.remove(0);
    drop(d);

    let (sp, sc, sb) = (summarize(&pooled), summarize(&cold), summarize(&bwrap));
    let rows = &mut b.report.rows;
    rows.push(Row::new(
        format!("create -> first exec -> destroy with a warm pool (busybox={POOL}), p50 (API, n={n})"),
        ms(sp.p50),
        format!("{} (bwrap)", ms(sb.p50)),
        ratio(sp.p50.as_secs_f64(), sb.p50.as_secs_f64()),
        "<= 1.0x bwrap",
        Verdict::of(sp.p50 <= sb.p50),
    ));
    rows.push(Row::new(
        format!("same cycle without a pool (bench daemon, interleaved), p50 (API, n={n})"),
        ms(sc.p50),
        format!("{} (bwrap)", ms(sb.p50)),
        ratio(sc.p50.as_secs_f64(), sb.p50.as_secs_f64()),
        "<= 2.5x bwrap",
        Verdict::of(sc.p50.as_secs_f64() <= 2.5 * sb.p50.as_secs_f64()),
    ));
    rows.push(Row::new(
        "with the pool: phases p50 create (adopt) / first exec / destroy; p99 cycle",
        format!(
            "{} / {} / {}; {}",
            ms(summarize(&phases[0]).p50),
            ms(summarize(&phases[1]).p50),
            ms(summarize(&phases[2]).p50),
            ms(sp.p99)
        ),
        format!("{} (bwrap p99)", ms(sb.p99)),
        "-",
        "-",
        Verdict::Info,
    ));
    rows.push(Row::new(
        format!("warm pool: creates that adopted a member / refill to {POOL} after each, p50 / p99"),
        format!("{adopted} of {n}; {}", summarize(&refill).p50_p99()),
        format!("first fill of {POOL}: {}", ms(fill)),
        "-",
        format!("{n} of {n}"),
        Verdict::of(adopted == n as u64),
    ));
    rows.push(Row::new(
        format!("warm pool burst: {POOL} creates back to back (adopted), p50 / the next one (pool empty)"),
        format!("{} / {}", ms(summarize(&burst_adopted).p50), ms(burst_miss)),
        format!("{} total", ms(burst_total)),
        "-",
        "-",
        Verdict::Info,
    ));
    let line = |name: &str, s: &crate::stats::Summary| format!("{name:<40} {}", s.line());
    let details = vec![
        line("cycle with the pool", &sp),
        line("  create (adopt)", &summarize(&phases[0])),
        line("  first exec `echo hi`", &summarize(&phases[1])),
        line("  remove_sandbox force", &summarize(&phases[2])),
        line("  refill to full after it (not in the cycle)", &summarize(&refill)),
        line("cycle without a pool (bench daemon)", &sc),
        line("bwrap --unshare-all ... echo hi", &sb),
        format!(
            "pool counters: adopted {}, missed (empty) {}, missed (unfit) {}, booted {}, drained {}",
            status.adopted, status.missed_empty, status.missed_unfit, status.booted, status.drained
        ),
    ];
    b.report.sections.push((
        "14. warm pool".into(),
        format!(
            "A second daemon (own state directory, socket and network pool {NETWORK_POOL}) started with \
             `--warm-pool busybox={POOL}`, the busybox rootfs imported into it. {n} rounds, order rotating: a create -> \
             `echo hi` -> destroy cycle on it (then the bench waits, outside the cycle, until the pool is full again: \
             the refill time is reported), the same cycle on the bench's daemon (no pool), and `{bw}`. \
             {w} warm-up rounds first. Then a burst of {POOL} + 1 creates back to back on the pooled daemon.",
            bw = bw.join(" "),
            w = cfg.warmup,
        ),
        details,
    ));
    Ok(())
}
