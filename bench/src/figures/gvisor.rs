//! Figure 12: the gVisor tier against bare runsc on the same rootfs.
//!
//! * exec into a running gVisor sandbox (API) against `runsc exec` into the
//!   same sandbox (same runsc state root and platform as the daemon's);
//! * create -> first exec output -> destroy (API) against the same sequence
//!   with runsc alone (`run -detach`, `exec`, `delete -force`) on an overlay
//!   of the same image, and, for reference, a bare `runsc run` of `true`;
//! * standby and resume of the ~100 MiB workload (figure 4's) against bare
//!   `runsc checkpoint` / `runsc restore` of a sandbox whose init runs it;
//! * 16 forks of a warm checkpoint of a sandbox serving HTTP (busybox httpd)
//!   until all 16 answer, against 16 cold forks that start the server.
//!
//! The bare runs happen under this process as a child subreaper whose reaper
//! thread reaps what runsc leaves (gofer, sandbox, stubs) within a
//! millisecond, as the daemon's keeper does: runsc's `delete` waits until
//! those are reaped.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use strata_api::{CreateSandboxRequest, ExecRequest, Isolation};
use strata_client::Client;

use super::{check_echo, echo_req};
use crate::report::{Row, Verdict};
use crate::stats::{ms, ratio, summarize};
use crate::sys::timed;
use crate::Bench;

/// Reaps the exited orphans runsc left to us as their subreaper (runsc-sandbox,
/// runsc-gofer, the systrap stubs), never a `runsc` this process waits for:
/// runsc's `delete` polls until the sandbox is gone, and a zombie is not.
fn reap_orphans() {
    let me = std::process::id().to_string();
    let Ok(dir) = std::fs::read_dir("/proc") else { return };
    for e in dir.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some((comm, rest)) = stat.split_once(" (").and_then(|(_, r)| r.rsplit_once(") ")) else { continue };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.first() == Some(&"Z") && f.get(1) == Some(&me.as_str()) && comm != "runsc" {
            // SAFETY: waitpid on a zombie child of ours that nobody else waits for.
            unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
        }
    }
}

/// Whether a bare runsc call is under way: the reaper scans `/proc` only
/// then, so that its polling weighs on the bare runs it serves and not on
/// strata's (whose keeper reaps for the daemon).
static BARE_CALL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Marks a bare runsc call under way while it lives.
struct BareCall;

impl BareCall {
    fn begin() -> BareCall {
        BARE_CALL.store(true, std::sync::atomic::Ordering::Relaxed);
        BareCall
    }
}

impl Drop for BareCall {
    fn drop(&mut self) {
        BARE_CALL.store(false, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Reaps orphans every millisecond while it lives, during bare runsc calls.
struct Reaper(std::sync::Arc<std::sync::atomic::AtomicBool>, Option<std::thread::JoinHandle<()>>);

impl Reaper {
    fn start() -> Reaper {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let h = std::thread::spawn(move || {
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                if BARE_CALL.load(std::sync::atomic::Ordering::Relaxed) {
                    reap_orphans();
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        Reaper(stop, Some(h))
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(h) = self.1.take() {
            let _ = h.join();
        }
    }
}

/// What `runsc` needs for the bare runs: its binary, a state root of its own, the platform.
struct Bare {
    runsc: String,
    root: PathBuf,
    platform: String,
    bundle: PathBuf,
    rootfs: PathBuf,
}

impl Bare {
    fn args<'a>(&'a self, rest: &[&'a str]) -> Vec<String> {
        let mut v = vec![
            self.runsc.clone(),
            "--root".into(),
            self.root.to_string_lossy().into_owned(),
            format!("--platform={}", self.platform),
            "--overlay2=none".into(),
            "--file-access=shared".into(),
            "--network=none".into(),
        ];
        v.extend(rest.iter().map(|s| s.to_string()));
        v
    }

    /// A runsc call with its output checked (`exec`).
    fn run(&self, rest: &[&str], expect: Option<&str>) -> Result<Duration> {
        let _busy = BareCall::begin();
        let a = self.args(rest);
        let argv: Vec<&str> = a.iter().map(String::as_str).collect();
        let d = timed(&argv, expect);
        reap_orphans();
        d
    }

    /// A runsc call whose stdio the sandbox keeps (`run`, `delete`): never a
    /// pipe read to its end, which the sandbox would hold open for its life.
    fn run_detached(&self, rest: &[&str]) -> Result<Duration> {
        let _busy = BareCall::begin();
        let a = self.args(rest);
        let t = Instant::now();
        let st = std::process::Command::new(&a[0])
            .args(&a[1..])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .with_context(|| format!("spawn {}", a[0]))?;
        let d = t.elapsed();
        reap_orphans();
        if !st.success() {
            bail!("runsc {} failed ({st})", rest.join(" "));
        }
        Ok(d)
    }
}

/// An overlay of the image's rootfs and a bundle whose init sleeps.
fn prepare_bare(work: &Path, images: &Path, platform: &str) -> Result<Bare> {
    let lower = images.join("busybox-rootfs");
    if !lower.is_dir() {
        bail!("{} missing (scripts/build-test-images.sh makes it)", lower.display());
    }
    let dir = work.join("gvisor-bare");
    let (upper, wk, rootfs, bundle) = (dir.join("upper"), dir.join("work"), dir.join("rootfs"), dir.join("bundle"));
    for d in [&upper, &wk, &rootfs, &bundle] {
        std::fs::create_dir_all(d)?;
    }
    let opts = format!("lowerdir={},upperdir={},workdir={}", lower.display(), upper.display(), wk.display());
    let st =
        std::process::Command::new("mount").args(["-t", "overlay", "overlay", "-o", &opts]).arg(&rootfs).status()?;
    if !st.success() {
        bail!("mount the bare rootfs overlay");
    }
    let config = serde_json::json!({
        "ociVersion": "1.0.2",
        "process": {"user": {"uid": 0, "gid": 0}, "args": ["/bin/sleep", "1000000"], "env": ["PATH=/bin:/usr/bin"], "cwd": "/"},
        "root": {"path": rootfs, "readonly": false},
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
        "linux": {"namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}]},
    });
    std::fs::write(bundle.join("config.json"), serde_json::to_vec(&config)?)?;
    Ok(Bare {
        runsc: strata_runtime::gvisor::probe().runsc.context("runsc")?.to_string_lossy().into_owned(),
        root: dir.join("state"),
        platform: platform.to_string(),
        bundle,
        rootfs,
    })
}

pub async fn run(b: &mut Bench) -> Result<()> {
    let probe = strata_runtime::gvisor::probe();
    if let Some(why) = probe.unavailable() {
        b.report.rows.push(Row::new("gvisor tier", "-", "-", "-", "-", Verdict::Info));
        b.report.sections.push(("12. the gVisor tier".into(), format!("not measured: {why}"), vec![]));
        return Ok(());
    }
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let bare = prepare_bare(&b.cfg.work, &b.cfg.images, probe.platform)?;
    let reaper = Reaper::start();
    let mut res = measure(b, &bare).await;
    if res.is_ok() {
        res = measure_processes(b, &bare).await;
    }
    drop(reaper);
    let _ = std::process::Command::new("umount").arg("-l").arg(&bare.rootfs).status();
    res
}

async fn measure(b: &mut Bench, bare: &Bare) -> Result<()> {
    let cfg = b.cfg.clone();
    let c = b.client.clone();
    let req =
        CreateSandboxRequest { source: cfg.image.clone(), isolation: Some(Isolation::Gvisor), ..Default::default() };
    let n = (cfg.runs / 4).max(10);

    // 1. exec into a running sandbox.
    let sb = c.create_sandbox(&req).await.context("create a gvisor sandbox")?;
    let daemon_root = cfg.state_dir.join("run/gvisor/state");
    let root_s = daemon_root.to_string_lossy().into_owned();
    let platform = format!("--platform={}", bare.platform);
    let runsc_exec = [bare.runsc.as_str(), "--root", &root_s, &platform, "exec", &sb.id, "/bin/echo", "hi"];
    let echo = echo_req();
    let api_exec = || async {
        let t = Instant::now();
        let r = c.exec(&sb.id, &echo).await.context("exec")?;
        let el = t.elapsed();
        check_echo(&r)?;
        anyhow::Ok(el)
    };
    for _ in 0..cfg.warmup.min(5) {
        api_exec().await?;
        timed(&runsc_exec, Some("hi\n"))?;
    }
    let (mut s, mut base) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        if i % 2 == 0 {
            s.push(api_exec().await?);
            base.push(timed(&runsc_exec, Some("hi\n"))?);
        } else {
            base.push(timed(&runsc_exec, Some("hi\n"))?);
            s.push(api_exec().await?);
        }
    }
    c.remove_sandbox(&sb.id, true).await.context("remove")?;
    let (es, eb) = (summarize(&s), summarize(&base));
    b.report.rows.push(Row::new(
        format!("gvisor: exec `echo hi` into running sandbox, p50 (API, n={n})"),
        ms(es.p50),
        format!("{} (runsc exec)", ms(eb.p50)),
        ratio(es.p50.as_secs_f64(), eb.p50.as_secs_f64()),
        "<= 1.5x runsc exec",
        Verdict::of(es.p50.as_secs_f64() <= 1.5 * eb.p50.as_secs_f64()),
    ));

    // 2. create -> first exec output -> destroy.
    let m = (n / 2).max(8);
    let api_cycle = || async {
        let t = Instant::now();
        let sb = c.create_sandbox(&req).await.context("create")?;
        let r = c.exec(&sb.id, &echo).await.context("exec")?;
        check_echo(&r)?;
        c.remove_sandbox(&sb.id, true).await.context("remove")?;
        anyhow::Ok(t.elapsed())
    };
    let bundle = bare.bundle.to_string_lossy().into_owned();
    let bare_cycle = |k: usize| -> Result<Duration> {
        let id = format!("bench-bare-{k}");
        let t = Instant::now();
        bare.run_detached(&["run", "-detach", "--bundle", &bundle, &id])?;
        bare.run(&["exec", &id, "/bin/echo", "hi"], Some("hi\n"))?;
        bare.run_detached(&["delete", "-force", &id])?;
        Ok(t.elapsed())
    };
    let bare_true = |k: usize| -> Result<Duration> {
        let id = format!("bench-true-{k}");
        let true_bundle = bare.bundle.parent().unwrap().join("bundle-true");
        std::fs::create_dir_all(&true_bundle)?;
        let mut cfg: serde_json::Value = serde_json::from_slice(&std::fs::read(bare.bundle.join("config.json"))?)?;
        cfg["process"]["args"] = serde_json::json!(["/bin/true"]);
        std::fs::write(true_bundle.join("config.json"), serde_json::to_vec(&cfg)?)?;
        let tb = true_bundle.to_string_lossy().into_owned();
        let d = bare.run_detached(&["run", "--bundle", &tb, &id])?;
        let _ = bare.run_detached(&["delete", "-force", &id]);
        Ok(d)
    };
    api_cycle().await?;
    bare_cycle(0)?;
    let (mut cs, mut cb, mut ct) = (Vec::new(), Vec::new(), Vec::new());
    for k in 1..=m {
        cs.push(api_cycle().await?);
        cb.push(bare_cycle(k)?);
        ct.push(bare_true(k)?);
    }
    let (ss, sb2, st) = (summarize(&cs), summarize(&cb), summarize(&ct));
    b.report.rows.push(Row::new(
        format!("gvisor: create -> first exec -> destroy, p50 (API, n={m})"),
        ms(ss.p50),
        format!("{} (runsc run -d + exec + delete)", ms(sb2.p50)),
        ratio(ss.p50.as_secs_f64(), sb2.p50.as_secs_f64()),
        "<= 1.3x the bare sequence",
        Verdict::of(ss.p50.as_secs_f64() <= 1.3 * sb2.p50.as_secs_f64()),
    ));
    b.report.rows.push(Row::new(
        format!("gvisor: create -> first exec -> destroy vs bare `runsc run true`, p50 (n={m})"),
        ms(ss.p50),
        format!("{} (runsc run true)", ms(st.p50)),
        ratio(ss.p50.as_secs_f64(), st.p50.as_secs_f64()),
        "<= 1.3x runsc run",
        Verdict::of(ss.p50.as_secs_f64() <= 1.3 * st.p50.as_secs_f64()),
    ));
    b.report.sections.push((
        "12. the gVisor tier".into(),
        format!(
            "runsc {ver}, platform {plat}. Exec: one gVisor sandbox of `{img}`; {n} `exec` calls of `echo hi` \
             through the typed client interleaved with {n} `runsc exec` of `/bin/echo hi` into the same sandbox \
             (the daemon's runsc state root). Cycle: {m} times create (isolation gvisor) -> exec `echo hi` -> \
             remove through the API, then the same with runsc alone on an overlay of the same rootfs \
             (`run -detach`, `exec`, `delete -force`, this process reaping runsc's orphans as a subreaper), \
             then a bare `runsc run` of `/bin/true`: the issue's target (<= 1.3x that one runsc call, which \
             boots, runs and tears down a sandbox); the bare three-call sequence is reported beside it. \
             strata destroys without a runsc call (the sentry's host process is killed; runsc's state is \
             removed after the answer).",
            ver = strata_runtime::gvisor::probe().version.unwrap_or_default(),
            plat = bare.platform,
            img = cfg.image
        ),
        vec![
            format!("{:<34} {}", "strata exec (API)", es.line()),
            format!("{:<34} {}", "runsc exec", eb.line()),
            format!("{:<34} {}", "strata create->exec->destroy", ss.line()),
            format!("{:<34} {}", "runsc run -d + exec + delete", sb2.line()),
            format!("{:<34} {}", "runsc run true", st.line()),
        ],
    ));
    Ok(())
}

/// Standby/resume cycles of the workload on each side.
const CYCLES: usize = 6;
/// Children of the warm fork.
const FORKS: u32 = 16;

/// `sh -c` of busybox httpd serving `/` in the foreground.
fn httpd_req() -> ExecRequest {
    ExecRequest {
        cmd: vec![
            "sh".into(),
            "-c".into(),
            "mkdir -p /www && echo ok > /www/index.html && exec httpd -f -p 8000 -h /www".into(),
        ],
        ..Default::default()
    }
}

/// Waits until every sandbox of `ids` answers HTTP on port 8000 inside.
async fn all_serving(c: &Client, ids: &[String]) -> Result<()> {
    let probe = ExecRequest {
        cmd: vec![
            "sh".into(),
            "-c".into(),
            "until wget -qO- http://127.0.0.1:8000/ 2>/dev/null; do sleep 0.02; done".into(),
        ],
        timeout: Some("60s".into()),
        ..Default::default()
    };
    let calls = ids.iter().map(|id| {
        let probe = probe.clone();
        async move {
            let out = super::exec_ok(c, id, probe).await?;
            if out.trim() != "ok" {
                bail!("sandbox {id} answered {out:?}");
            }
            anyhow::Ok(())
        }
    });
    for r in futures_util::future::join_all(calls).await {
        r?;
    }
    Ok(())
}

async fn remove_all(c: &Client, ids: &[String]) {
    for id in ids {
        let _ = c.remove_sandbox(id, true).await;
    }
}

/// Standby/resume of the ~100 MiB workload against bare checkpoint/restore,
/// and 16 warm forks serving against 16 cold ones.
async fn measure_processes(b: &mut Bench, bare: &Bare) -> Result<()> {
    let cfg = b.cfg.clone();
    let c = b.client.clone();
    let req =
        CreateSandboxRequest { source: cfg.image.clone(), isolation: Some(Isolation::Gvisor), ..Default::default() };

    // 3. standby and resume of the workload, interleaved with bare runsc's
    // cycles of the same workload (the host's page cache and disk weigh on
    // both alike: a lone checkpoint of it varies 70..320 ms here).
    let sb = c.create_sandbox(&req).await.context("create a gvisor sandbox")?;
    let w = super::standby::start_workload(&c, &sb.id, Duration::from_millis(200)).await?;
    // The same workload as a bare sandbox's init.
    let wl_bundle = bare.bundle.parent().context("bundle dir")?.join("bundle-workload");
    std::fs::create_dir_all(&wl_bundle)?;
    let mut config: serde_json::Value = serde_json::from_slice(&std::fs::read(bare.bundle.join("config.json"))?)?;
    config["process"]["args"] = serde_json::json!(["/bin/sh", "-c", super::standby::workload_script()]);
    std::fs::write(wl_bundle.join("config.json"), serde_json::to_vec(&config)?)?;
    let wb = wl_bundle.to_string_lossy().into_owned();
    let id = "bench-bare-workload";
    let _ = std::fs::remove_file(bare.rootfs.join("bench.sum0"));
    bare.run_detached(&["run", "-detach", "--bundle", &wb, id])?;
    let t = Instant::now();
    while !bare.rootfs.join("bench.sum0").exists() {
        if t.elapsed() > Duration::from_secs(180) {
            let _ = bare.run_detached(&["delete", "-force", id]);
            bail!("the bare workload did not start");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let images = bare.bundle.parent().context("bundle dir")?.join("images");
    let (mut s_sb, mut s_rs, mut dumps) = (Vec::new(), Vec::new(), Vec::new());
    // runsc's default image (flate) is the baseline; the same flag as strata's (none) is reported beside it.
    let (mut b_ck, mut b_rs, mut n_ck, mut n_rs) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for k in 0..CYCLES {
        // The order rotates: none of the three always follows the same one.
        for side in (0..3).map(|i| (i + k) % 3) {
            match side {
                0 => {
                    let t = Instant::now();
                    c.standby_sandbox(&sb.id, false).await.context("standby")?;
                    s_sb.push(t.elapsed());
                    let info = c.get_sandbox(&sb.id).await.context("inspect")?;
                    dumps.push(info.standby.map(|s| s.image_bytes).unwrap_or(0));
                    let t = Instant::now();
                    c.resume_sandbox(&sb.id).await.context("resume")?;
                    s_rs.push(t.elapsed());
                    super::standby::verify_workload(&c, &sb.id, &w).await?;
                }
                1 => {
                    let (ck, rs) = bare_cycle(bare, id, &wb, &images, None).await?;
                    b_ck.push(ck);
                    b_rs.push(rs);
                }
                _ => {
                    let (ck, rs) = bare_cycle(bare, id, &wb, &images, Some("--compression=none")).await?;
                    n_ck.push(ck);
                    n_rs.push(rs);
                }
            }
        }
    }
    c.remove_sandbox(&sb.id, true).await.context("remove")?;
    let _ = bare.run_detached(&["delete", "-force", id]);
    let _ = std::fs::remove_dir_all(&images);
    let (ss, sr, bc, br) = (summarize(&s_sb), summarize(&s_rs), summarize(&b_ck), summarize(&b_rs));
    let (nc, nr) = (summarize(&n_ck), summarize(&n_rs));
    b.report.rows.push(Row::new(
        format!("gvisor: standby of the ~100 MiB workload, p50 (n={CYCLES})"),
        ms(ss.p50),
        format!("{} (runsc checkpoint)", ms(bc.p50)),
        ratio(ss.p50.as_secs_f64(), bc.p50.as_secs_f64()),
        "<= 1.3x runsc checkpoint",
        Verdict::of(ss.p50.as_secs_f64() <= 1.3 * bc.p50.as_secs_f64()),
    ));
    b.report.rows.push(Row::new(
        format!("gvisor: resume of the ~100 MiB workload, p50 (n={CYCLES})"),
        ms(sr.p50),
        format!("{} (runsc restore)", ms(br.p50)),
        ratio(sr.p50.as_secs_f64(), br.p50.as_secs_f64()),
        "<= 1.3x runsc restore",
        Verdict::of(sr.p50.as_secs_f64() <= 1.3 * br.p50.as_secs_f64()),
    ));
    b.report.rows.push(Row::new(
        format!("gvisor: standby / resume vs bare runsc with strata's --compression=none, p50 (n={CYCLES})"),
        format!("{} / {}", ms(ss.p50), ms(sr.p50)),
        format!("{} / {}", ms(nc.p50), ms(nr.p50)),
        format!(
            "{} / {}",
            ratio(ss.p50.as_secs_f64(), nc.p50.as_secs_f64()),
            ratio(sr.p50.as_secs_f64(), nr.p50.as_secs_f64())
        ),
        "-",
        Verdict::Info,
    ));

    // 4. 16 forks of a warm checkpoint of a serving sandbox.
    let src = c.create_sandbox(&req).await.context("create the fork source")?;
    c.start_process(&src.id, &httpd_req()).await.context("start httpd")?;
    all_serving(&c, std::slice::from_ref(&src.id)).await?;
    let ck = c
        .checkpoint(&src.id, &strata_api::CheckpointRequest { processes: true, ..Default::default() })
        .await
        .context("warm checkpoint")?;
    let fork = |processes: bool| strata_api::ForkRequest {
        source: ck.id.clone(),
        count: FORKS,
        name_prefix: None,
        lifecycle: strata_api::Lifecycle::Ephemeral,
        ttl: None,
        limits: None,
        network: None,
        processes: Some(processes),
        isolation: None,
    };
    let t = Instant::now();
    let warm = c.fork(&fork(true)).await.context("warm fork")?;
    all_serving(&c, &warm.sandboxes).await?;
    let warm_t = t.elapsed();
    let warm_api = Duration::from_millis(warm.duration_ms);
    remove_all(&c, &warm.sandboxes).await;
    let t = Instant::now();
    let cold = c.fork(&fork(false)).await.context("cold fork")?;
    for id in &cold.sandboxes {
        c.start_process(id, &httpd_req()).await.context("start httpd")?;
    }
    all_serving(&c, &cold.sandboxes).await?;
    let cold_t = t.elapsed();
    remove_all(&c, &cold.sandboxes).await;
    c.remove_sandbox(&src.id, true).await.context("remove the fork source")?;
    b.report.rows.push(Row::new(
        format!("gvisor: fork {FORKS} from a warm checkpoint, until all serve"),
        ms(warm_t),
        format!("{} (cold forks + start httpd)", ms(cold_t)),
        ratio(warm_t.as_secs_f64(), cold_t.as_secs_f64()),
        "all 16 serving (info)",
        Verdict::Info,
    ));
    let avg = |v: &[u64]| v.iter().sum::<u64>() / v.len().max(1) as u64;
    b.report.sections.push((
        "12b. the gVisor tier: standby and warm forks".into(),
        format!(
            "Standby/resume: figure 4's workload (a busybox shell holding ~100 MiB of base64 text) in a gVisor \
             sandbox, {CYCLES} cycles of standby -> resume through the API (each verified: same pid, same \
             md5 of the text, polled through the file API: every exited process leaves ~80 KB in the sentry's saved \
             kernel state, measured here, so a sandbox's process history slows each later checkpoint, on bare runsc as \
             on strata; strata saves images uncompressed, `--compression=none`), against {CYCLES} cycles \
             of `runsc checkpoint` (runsc's default flate image; and {CYCLES} more with `--compression=none`, \
             reported beside it) -> `delete` -> `restore -detach` \
             of a bare sandbox whose init runs the same script on the same rootfs (the three kinds of \
             cycle interleaved, their order rotating), verified the same way after each restore (`runsc kill USR1`, the md5 compared: both sentries do the same work between \
             cycles). Standby includes letting the API processes' connections go (the broker paused, pid 1 \
             told over the exec channel) and the image's checks; resume includes the checksum check of the \
             image and reattaching the API process (over the exec channel, off the measured path). Image ~{img}. Forks: a sandbox serving \
             busybox httpd, a warm checkpoint (`processes: true`), then one fork call of {FORKS} children \
             until each answers `wget` inside ({api} ms of it in the fork call), against {FORKS} cold forks \
             (`processes: false`) that start httpd.",
            img = crate::stats::bytes(avg(&dumps)),
            api = warm_api.as_millis(),
        ),
        vec![
            format!("{:<34} {}", "strata standby", ss.line()),
            format!("{:<34} {}", "runsc checkpoint", bc.line()),
            format!("{:<34} {}", "strata resume", sr.line()),
            format!("{:<34} {}", "runsc restore", br.line()),
            format!("{:<34} {}", "runsc checkpoint, compression none", nc.line()),
            format!("{:<34} {}", "runsc restore, compression none", nr.line()),
            format!("{:<34} {}", "warm fork x16 until serving", ms(warm_t)),
            format!("{:<34} {}", "cold fork x16 + httpd", ms(cold_t)),
        ],
    ));
    Ok(())
}

/// One cycle of `runsc checkpoint` (with `compression` when given) ->
/// `delete` -> `restore -detach` of the bare workload sandbox `id`, verified;
/// the checkpoint and restore times.
async fn bare_cycle(
    bare: &Bare,
    id: &str,
    wb: &str,
    images: &std::path::Path,
    compression: Option<&str>,
) -> Result<(Duration, Duration)> {
    let _ = std::fs::remove_dir_all(images);
    std::fs::create_dir_all(images)?;
    let img = images.to_string_lossy().into_owned();
    let mut ck = vec!["checkpoint"];
    ck.extend(compression);
    ck.extend(["--image-path", &img, id]);
    let ck_time = bare.run_detached(&ck)?;
    bare.run_detached(&["delete", "-force", id])?;
    let rs_time = bare.run_detached(&["restore", "--image-path", &img, "--bundle", wb, "-detach", id])?;
    // The same check as strata's cycles make (the shell forks md5sum of its
    // text), so that both sentries have done the same work before the next one.
    let sum = bare.rootfs.join("bench.sum");
    let _ = std::fs::remove_file(&sum);
    bare.run_detached(&["kill", id, "USR1"])?;
    let t = Instant::now();
    while !sum.exists() {
        if t.elapsed() > Duration::from_secs(60) {
            bail!("the bare workload did not answer USR1 after its restore");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if std::fs::read_to_string(&sum)? != std::fs::read_to_string(bare.rootfs.join("bench.sum0"))? {
        bail!("the bare workload's data changed across checkpoint/restore");
    }
    Ok((ck_time, rs_time))
}
