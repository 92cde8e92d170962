//! Figure 3: host memory per idle running sandbox, against idle
//! `unshare -pmuin --fork sleep infinity` trees.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use strata_api::SandboxState;

use super::create_req;
use crate::report::{Row, Verdict};
use crate::stats::{kib, ms, ratio, secs, summarize};
use crate::sys::{all_pids, children, kill, mem_available_kib, pid_ns, pss_kib, rss_kib};
use crate::Bench;

/// The PSS per idle sandbox to reach (issue 18), KiB.
const PSS_TARGET_KIB: f64 = 64.0;

fn avg(v: &[u64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.iter().sum::<u64>() as f64 / v.len() as f64
}

/// Charged memory of a sandbox's cgroup in KiB (v1 memory controller or v2 memory.current).
fn cgroup_mem_kib(id: &str) -> Option<u64> {
    let candidates = [
        format!("/sys/fs/cgroup/memory/strata/{id}/memory.usage_in_bytes"),
        format!("/sys/fs/cgroup/strata/{id}/memory.current"),
        format!("/sys/fs/cgroup/unified/strata/{id}/memory.current"),
    ];
    candidates.iter().find_map(|p| std::fs::read_to_string(p).ok()?.trim().parse::<u64>().ok()).map(|b| b / 1024)
}

/// Whether any cgroup directory of sandbox `id` still exists.
fn cgroup_exists(id: &str) -> bool {
    let Ok(rd) = std::fs::read_dir("/sys/fs/cgroup") else { return false };
    rd.flatten().any(|c| c.path().join("strata").join(id).exists())
        || std::path::Path::new("/sys/fs/cgroup/strata").join(id).exists()
}

struct Settled {
    daemon_kib: u64,
    avail_kib: u64,
    procs: usize,
}

async fn settle(daemon_pid: i32, wait: Duration) -> Result<Settled> {
    tokio::time::sleep(wait).await;
    Ok(Settled {
        daemon_kib: rss_kib(daemon_pid).with_context(|| format!("read VmRSS of daemon pid {daemon_pid}"))?,
        avail_kib: mem_available_kib()?,
        procs: all_pids().len(),
    })
}

pub async fn run(b: &mut Bench) -> Result<()> {
    let cfg = b.cfg.clone();
    let c = b.client.clone();
    let n = cfg.idle;
    let req = create_req(&cfg.image);

    let before = settle(cfg.daemon_pid, Duration::from_secs(1)).await?;
    let mut ids = Vec::with_capacity(n);
    let mut create_times = Vec::with_capacity(n);
    let t_all = Instant::now();
    let mut created = Ok(());
    for _ in 0..n {
        let t = Instant::now();
        match c.create_sandbox(&req).await {
            Ok(sb) => {
                create_times.push(t.elapsed());
                ids.push(sb.id);
            }
            Err(e) => {
                created = Err(anyhow::Error::new(e).context(format!("create sandbox {} of {n}", ids.len() + 1)));
                break;
            }
        }
    }
    let create_all = t_all.elapsed();
    let measured = match created {
        Ok(()) => measure(b, &ids, &before).await,
        Err(e) => Err(e),
    };

    // Destroy them all, whatever happened.
    let t_rm = Instant::now();
    let mut rm_err = None;
    for id in &ids {
        if let Err(e) = c.remove_sandbox(id, true).await {
            rm_err.get_or_insert(anyhow::Error::new(e).context(format!("remove sandbox {id}")));
        }
    }
    let rm_all = t_rm.elapsed();
    let m = measured?;
    if let Some(e) = rm_err {
        return Err(e);
    }
    // The daemon may release cgroups in the background: wait for them to go.
    let t_cg = Instant::now();
    let mut cg_left = ids.iter().filter(|id| cgroup_exists(id)).count();
    while cg_left > 0 && t_cg.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        cg_left = ids.iter().filter(|id| cgroup_exists(id)).count();
    }
    let cg_wait = t_cg.elapsed();
    let after_rm = settle(cfg.daemon_pid, Duration::from_secs(1)).await?;
    let left = c.list_sandboxes().await?.into_iter().filter(|s| ids.contains(&s.id)).count();

    let base = baseline(n)?;

    // Rows.
    let daemon_per = (m.after.daemon_kib as f64 - before.daemon_kib as f64) / n as f64;
    let total_pss = daemon_per + m.init_pss;
    let rows = &mut b.report.rows;
    // VmRSS counts every shared page of the static init binary in full for
    // each sandbox (issue 18 retired it as a target): shown in the details only.
    rows.push(Row::new(
        format!("idle sandbox host overhead, PSS: daemon delta/{n} + init Pss"),
        format!("{} ({} + {})", kib(total_pss), kib(daemon_per), kib(m.init_pss)),
        format!("{} (sleep Pss)", kib(base.sleep_pss)),
        ratio(total_pss, base.sleep_pss),
        "<= 64 KiB",
        Verdict::of(total_pss <= PSS_TARGET_KIB),
    ));
    rows.push(Row::new(
        format!("host MemAvailable drop / {n} (incl. kernel memory; host-wide, so noisy on a shared host)"),
        kib(m.avail_drop),
        format!("{} (unshare+sleep tree)", kib(base.avail_drop)),
        ratio(m.avail_drop, base.avail_drop),
        "-",
        Verdict::Info,
    ));
    if let Some(cg) = m.cgroup_kib {
        rows.push(Row::new(
            "memory charged to each idle sandbox's cgroup (incl. kernel objects)",
            kib(cg),
            "-",
            "-",
            "-",
            Verdict::Info,
        ));
    }
    rows.push(Row::new(
        format!("host processes per idle sandbox ({n} running)"),
        format!("{:.2}", m.procs_per),
        format!("{:.2} (unshare + sleep)", base.procs_per),
        "-",
        "-",
        Verdict::Info,
    ));

    if left > 0 || cg_left > 0 {
        rows.push(Row::new(
            "leftovers 10 s after destroying every idle sandbox",
            format!("{left} sandbox record(s), {cg_left} cgroup(s)"),
            "-",
            "-",
            "0",
            Verdict::Fail,
        ));
    }

    let cs = summarize(&create_times);
    let mut details = vec![
        format!("sandboxes: {n}; created sequentially in {} (create p50 {} p99 {}), destroyed in {}", secs(create_all), ms(cs.p50), ms(cs.p99), secs(rm_all)),
        format!("first 10 creates mean {}, last 10 creates mean {}", ms(mean(&create_times[..10.min(n)])), ms(mean(&create_times[n.saturating_sub(10)..]))),
        format!("daemon VmRSS: before {} KiB, with {n} sandboxes {} KiB, after destroying them {} KiB", before.daemon_kib, m.after.daemon_kib, after_rm.daemon_kib),
        format!("per-sandbox daemon delta: {}", kib(daemon_per)),
        format!("init (strata-init `_pid1`, pid 1 of each sandbox): VmRSS avg {} (min {} max {} KiB), Pss avg {} (min {} max {} KiB)", kib(m.init_rss), m.rss_min, m.rss_max, kib(m.init_pss), m.pss_min, m.pss_max),
        format!("processes in each sandbox's pid namespace (seen from the host): {}", m.ns_counts),
        format!("host processes: before {}, with sandboxes {}, after destroy {}", before.procs, m.after.procs, after_rm.procs),
        format!("MemAvailable: before {} KiB, with sandboxes {} KiB, after destroy {} KiB", before.avail_kib, m.after.avail_kib, after_rm.avail_kib),
        format!("sandboxes left after destroy: {left}; their cgroups gone {} after the last destroy returned ({cg_left} still present after that)", ms(cg_wait)),
        format!(
            "baseline, {n} idle `unshare -pmuin --fork sleep infinity`: sleep VmRSS {} Pss {}; unshare parent VmRSS {} Pss {}; tree VmRSS {} Pss {}",
            kib(base.sleep_rss),
            kib(base.sleep_pss),
            kib(base.unshare_rss),
            kib(base.unshare_pss),
            kib(base.sleep_rss + base.unshare_rss),
            kib(base.sleep_pss + base.unshare_pss)
        ),
    ];
    if let Some(cg) = m.cgroup_kib {
        details.insert(6, format!("memory charged to each sandbox's cgroup (memory.usage_in_bytes, incl. kernel objects and page cache) avg {}", kib(cg)));
    }
    b.report.sections.push((
        format!("3. {n} idle running sandboxes"),
        format!(
            "{n} sandboxes of image `{img}` are created one after another and left idle. Before creating them and 2 s after the last one, \
             the daemon's VmRSS (/proc/PID/status), the host's MemAvailable and the number of host processes are read. For each sandbox, \
             VmRSS and Pss (/proc/PID/smaps_rollup) of its init (`init_pid`: the static strata-init as `_pid1`, the only strata process \
             per sandbox outside the workload; it runs its loop before the C library starts, crates/init/src/bare_pid1.rs) are read. \
             Per-sandbox overhead = (daemon VmRSS with {n} - before) / {n} + init Pss. Pss divides pages shared between the {n} \
             inits (strata-init's text) among them; VmRSS counts them in full for each. \
             Afterwards all are destroyed. Baseline: {n} idle `unshare -pmuin --fork sleep infinity` trees spawned from the benchmark \
             process, measured the same way (sleep is the tree's pid 1; the unshare parent waits outside, like the daemon does).",
            img = cfg.image
        ),
        details,
    ));
    Ok(())
}

fn mean(v: &[Duration]) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.iter().sum::<Duration>() / v.len() as u32
}

struct Measured {
    after: Settled,
    init_rss: f64,
    init_pss: f64,
    rss_min: u64,
    rss_max: u64,
    pss_min: u64,
    pss_max: u64,
    avail_drop: f64,
    procs_per: f64,
    ns_counts: String,
    cgroup_kib: Option<f64>,
}

async fn measure(b: &Bench, ids: &[String], before: &Settled) -> Result<Measured> {
    let n = ids.len();
    let after = settle(b.cfg.daemon_pid, Duration::from_secs(2)).await?;
    let list = b.client.list_sandboxes().await?;
    let by_id: HashMap<&str, _> = list.iter().map(|s| (s.id.as_str(), s)).collect();
    let (mut rss, mut pss, mut cg, mut inits) = (vec![], vec![], vec![], vec![]);
    for id in ids {
        let s = by_id.get(id.as_str()).with_context(|| format!("sandbox {id} not listed"))?;
        if s.state != SandboxState::Running {
            bail!("sandbox {id} is {} (reason {}), not running", s.state, s.state_reason);
        }
        let pid = s.init_pid.with_context(|| format!("sandbox {id} has no init_pid"))?;
        rss.push(rss_kib(pid).with_context(|| format!("VmRSS of init {pid}"))?);
        pss.push(pss_kib(pid).with_context(|| format!("Pss of init {pid}"))?);
        if let Some(k) = cgroup_mem_kib(id) {
            cg.push(k);
        }
        inits.push(pid);
    }
    // How many host processes live in each sandbox's pid namespace.
    let mut ns_of_init: HashMap<String, usize> = HashMap::new();
    for &p in &inits {
        if let Some(ns) = pid_ns(p) {
            ns_of_init.insert(ns, 0);
        }
    }
    for p in all_pids() {
        if let Some(c) = pid_ns(p).and_then(|ns| ns_of_init.get_mut(&ns)) {
            *c += 1;
        }
    }
    let mut hist: HashMap<usize, usize> = HashMap::new();
    for c in ns_of_init.values() {
        *hist.entry(*c).or_default() += 1;
    }
    let mut hist: Vec<_> = hist.into_iter().collect();
    hist.sort();
    let ns_counts = hist
        .iter()
        .map(|(procs, sbs)| format!("{sbs} sandboxes with {procs} process(es)"))
        .collect::<Vec<_>>()
        .join(", ");
    Ok(Measured {
        init_rss: avg(&rss),
        init_pss: avg(&pss),
        rss_min: *rss.iter().min().unwrap_or(&0),
        rss_max: *rss.iter().max().unwrap_or(&0),
        pss_min: *pss.iter().min().unwrap_or(&0),
        pss_max: *pss.iter().max().unwrap_or(&0),
        avail_drop: (before.avail_kib as f64 - after.avail_kib as f64) / n as f64,
        procs_per: (after.procs as f64 - before.procs as f64) / n as f64,
        ns_counts,
        cgroup_kib: (cg.len() == n).then(|| avg(&cg)),
        after,
    })
}

struct Baseline {
    sleep_rss: f64,
    sleep_pss: f64,
    unshare_rss: f64,
    unshare_pss: f64,
    avail_drop: f64,
    procs_per: f64,
}

/// `n` idle `unshare -pmuin --fork sleep infinity` trees.
fn baseline(n: usize) -> Result<Baseline> {
    std::thread::sleep(Duration::from_secs(1));
    let avail0 = mem_available_kib()?;
    let procs0 = all_pids().len();
    let mut kids: Vec<Child> = Vec::with_capacity(n);
    let spawned = (|| -> Result<()> {
        for _ in 0..n {
            kids.push(
                Command::new("unshare")
                    .args(["-pmuin", "--fork", "sleep", "infinity"])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .spawn()
                    .context("spawn unshare")?,
            );
        }
        Ok(())
    })();
    let measured = spawned.and_then(|()| {
        std::thread::sleep(Duration::from_secs(2));
        let avail1 = mem_available_kib()?;
        let procs1 = all_pids().len();
        let (mut s_rss, mut s_pss, mut u_rss, mut u_pss) = (vec![], vec![], vec![], vec![]);
        for k in &kids {
            let up = k.id() as i32;
            let sp = *children(up).first().with_context(|| format!("unshare {up} has no child"))?;
            u_rss.push(rss_kib(up).context("unshare VmRSS")?);
            u_pss.push(pss_kib(up).context("unshare Pss")?);
            s_rss.push(rss_kib(sp).context("sleep VmRSS")?);
            s_pss.push(pss_kib(sp).context("sleep Pss")?);
        }
        Ok(Baseline {
            sleep_rss: avg(&s_rss),
            sleep_pss: avg(&s_pss),
            unshare_rss: avg(&u_rss),
            unshare_pss: avg(&u_pss),
            avail_drop: (avail0 as f64 - avail1 as f64) / n as f64,
            procs_per: (procs1 as f64 - procs0 as f64) / n as f64,
        })
    });
    // Kill the unshare parents first (when their child dies of SIGKILL first, util-linux
    // unshare tries to re-raise SIGKILL on itself and complains), then each tree's pid 1.
    let pid1s: Vec<i32> = kids.iter().flat_map(|k| children(k.id() as i32)).collect();
    for k in &mut kids {
        let _ = k.kill();
        let _ = k.wait();
    }
    for p in pid1s {
        kill(p, libc::SIGKILL);
    }
    measured
}
