//! Figure 5: checkpoints and forks on a ~1 GiB rootfs.
//!
//! (a) checkpoint of a running sandbox with N MiB changed (N = 1, 10, 100), against
//! `cp` of the same N MiB file on the host; (b) fork of 16 children from a
//! checkpoint of the 1 GiB image and of the ~2 MB busybox image; (c) disk used by 16
//! forks of the 1 GiB template that each write 1 MiB.

use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use strata_api::{
    Checkpoint, CheckpointRequest, CreateSandboxRequest, ExecRequest, ForkRequest, ImportImageRequest, Lifecycle,
    SandboxState,
};
use strata_client::Client;

use super::import::SplitMix;
use super::{create_req, exec_ok};
use crate::report::{Row, Verdict};
use crate::stats::{bytes, ms, ratio, secs, summarize};
use crate::sys::{disk_usage, sync_all, timed, warm_cache};
use crate::Bench;

const MIB: u64 = 1 << 20;
/// Changed MiB per checkpoint.
const SIZES: [u64; 3] = [1, 10, 100];
/// Checkpoints per size.
const REPS: usize = 3;
/// The change size the checkpoint target is stated for (issue 3); other sizes are reported.
const TARGET_MIB: u64 = 10;
/// Fixed overhead the target allows on top of the copy time.
const CKPT_SLACK_MS: f64 = 50.0;
/// Children per fork.
const FORKS: u32 = 16;
/// Timed fork rounds per image (after one warm-up round each).
const FORK_ROUNDS: usize = 5;
/// Target: all children running within this.
const FORK_TARGET_MS: f64 = 100.0;
/// Target: fork time on the big image over the small one.
const FORK_RATIO_MAX: f64 = 1.2;
/// Name of the generated big image.
const BIG_IMAGE: &str = "bench-ckpt-big";

/// Deterministic pseudo-random bytes.
struct RandReader(SplitMix);

impl Read for RandReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.0.next().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        let n = rest.len();
        rest.copy_from_slice(&self.0.next().to_le_bytes()[..n]);
        Ok(buf.len())
    }
}

/// The busybox rootfs tarball (its entries copied verbatim) plus `mib` MiB of seeded
/// pseudo-random regular files in /opt/bench-big, written straight into one tarball.
fn generate_big(images: &Path, work: &Path, mib: u64) -> Result<(PathBuf, usize)> {
    let out = work.join(format!("ckpt-rootfs-{mib}m.tar"));
    let src = images.join("busybox-rootfs.tar");
    let f = std::fs::File::create(&out).with_context(|| format!("create {}", out.display()))?;
    let mut tb = tar::Builder::new(BufWriter::with_capacity(1 << 20, f));
    let mut a = tar::Archive::new(std::fs::File::open(&src).with_context(|| format!("open {}", src.display()))?);
    for e in a.entries().context("read busybox tar")?.raw(true) {
        let mut e = e.context("busybox tar entry")?;
        let h = e.header().clone();
        tb.append(&h, &mut e).context("copy busybox tar entry")?;
    }
    let header = |path: &str, size: u64, dir: bool| -> Result<tar::Header> {
        let mut h = tar::Header::new_ustar();
        h.set_path(path)?;
        h.set_size(size);
        h.set_mode(if dir { 0o755 } else { 0o644 });
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        h.set_entry_type(if dir { tar::EntryType::Directory } else { tar::EntryType::Regular });
        h.set_cksum();
        Ok(h)
    };
    for d in ["./opt/", "./opt/bench-big/"] {
        tb.append(&header(d, 0, true)?, std::io::empty())?;
    }
    let files = (mib / 64).max(1) as usize;
    let size = mib * MIB / files as u64;
    for i in 0..files {
        let mut r = RandReader(SplitMix(0x5354_5241_5441_1000 + i as u64)).take(size);
        tb.append(&header(&format!("./opt/bench-big/f{i:02}.bin"), size, false)?, &mut r)?;
    }
    let mut w = tb.into_inner().context("finish tar")?;
    w.flush()?;
    Ok((out, files))
}

/// Runs `cmd` in sandbox `id`; fails unless it exits 0; returns stdout.
async fn run_in(c: &Client, id: &str, cmd: &[&str]) -> Result<String> {
    exec_ok(
        c,
        id,
        ExecRequest {
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            timeout: Some("120s".into()),
            ..Default::default()
        },
    )
    .await
}

/// Writes `mib` MiB of fresh random data to `path` inside the sandbox.
async fn write_random(c: &Client, id: &str, path: &str, mib: u64) -> Result<()> {
    run_in(c, id, &["dd", "if=/dev/urandom", &format!("of={path}"), "bs=1M", &format!("count={mib}")]).await.map(|_| ())
}

/// Everything this figure created, removed at the end whatever happened.
#[derive(Default)]
struct Owned {
    sandboxes: Vec<String>,
    /// Oldest first; deleted newest first (children before parents).
    checkpoints: Vec<String>,
    image: bool,
}

impl Owned {
    async fn remove_sandboxes(&mut self, c: &Client, which: &[String]) -> Result<Duration> {
        let t = Instant::now();
        let mut err = None;
        for id in which {
            if let Err(e) = c.remove_sandbox(id, true).await {
                err.get_or_insert(anyhow::Error::new(e).context(format!("remove sandbox {id}")));
            }
        }
        let el = t.elapsed();
        self.sandboxes.retain(|s| !which.contains(s));
        err.map_or(Ok(el), Err)
    }

    async fn remove_checkpoints(&mut self, c: &Client) -> Result<()> {
        let mut err = None;
        while let Some(id) = self.checkpoints.pop() {
            if let Err(e) = c.delete_checkpoint(&id).await {
                err.get_or_insert(anyhow::Error::new(e).context(format!("delete checkpoint {id}")));
            }
        }
        err.map_or(Ok(()), Err)
    }

    async fn cleanup(&mut self, c: &Client) -> Result<()> {
        let all = self.sandboxes.clone();
        let r1 = self.remove_sandboxes(c, &all).await.map(|_| ());
        let r2 = self.remove_checkpoints(c).await;
        let r3 = if std::mem::take(&mut self.image) {
            c.remove_image(BIG_IMAGE).await.context("remove the big image")
        } else {
            Ok(())
        };
        r1.and(r2).and(r3)
    }
}

/// One checkpoint sample.
struct Ck {
    wall: Duration,
    /// Daemon CPU time (user, system) during the call, ms.
    cpu: Option<(u64, u64)>,
    ckpt: Checkpoint,
    cp: Duration,
    cp_sync: Duration,
}

/// Takes a checkpoint, timed; also returns the daemon's CPU time during it.
async fn checkpoint(
    c: &Client,
    o: &mut Owned,
    daemon: i32,
    id: &str,
    name: String,
) -> Result<(Duration, Checkpoint, Option<(u64, u64)>)> {
    sync_all();
    let cpu0 = crate::sys::cpu_split_ms(daemon);
    let t = Instant::now();
    let ck = c
        .checkpoint(id, &CheckpointRequest { name: Some(name.clone()), ..Default::default() })
        .await
        .with_context(|| format!("checkpoint {name} of {id}"))?;
    let el = t.elapsed();
    let cpu =
        cpu0.zip(crate::sys::cpu_split_ms(daemon)).map(|(a, b)| (b.0.saturating_sub(a.0), b.1.saturating_sub(a.1)));
    o.checkpoints.push(ck.id.clone());
    Ok((el, ck, cpu))
}

/// Baseline: `cp` of the file the sandbox wrote (its writable-layer copy on the host) to
/// a new file on the same file system, then a separately timed `sync -f`.
fn host_copy(src: &Path, work: &Path) -> Result<(Duration, Duration)> {
    let dst = work.join("ckpt-cp-baseline");
    let _ = std::fs::remove_file(&dst);
    sync_all();
    let (s, d) = (src.to_string_lossy(), dst.to_string_lossy());
    let cp = timed(&["cp", &s, &d], None)?;
    let sy = timed(&["sync", "-f", &d], None)?;
    std::fs::remove_file(&dst)?;
    sync_all();
    Ok((cp, sy))
}

/// Creates a sandbox of `image` with an empty /work and a first (warm-up) checkpoint.
async fn prepared(
    c: &Client,
    o: &mut Owned,
    daemon: i32,
    image: &str,
    tag: &str,
) -> Result<(String, Duration, Checkpoint)> {
    let sb = c.create_sandbox(&create_req(image)).await.with_context(|| format!("create sandbox of {image}"))?;
    o.sandboxes.push(sb.id.clone());
    run_in(c, &sb.id, &["mkdir", "-p", "/work"]).await?;
    let (d, ck, _) = checkpoint(c, o, daemon, &sb.id, format!("bench-{tag}-warmup")).await?;
    Ok((sb.id, d, ck))
}

/// One checkpoint sample on sandbox `id`: fresh data, then the checkpoint and the host
/// copy in alternating order (by `rep`).
async fn sample(c: &Client, o: &mut Owned, cfg: &crate::Cfg, id: &str, tag: &str, n: u64, rep: usize) -> Result<Ck> {
    let path = format!("/work/blob{n}");
    write_random(c, id, &path, n).await?;
    sync_all();
    let dir = cfg.state_dir.join("sandboxes").join(id);
    let upper = if dir.join("disk.img").exists() { dir.join("disk/upper") } else { dir.join("upper") };
    let host = upper.join(format!("work/blob{n}"));
    let len = std::fs::metadata(&host)
        .with_context(|| format!("the sandbox's file is not at {} in its writable layer", host.display()))?
        .len();
    if len != n * MIB {
        bail!("{} has {len} bytes, expected {}", host.display(), n * MIB);
    }
    let name = format!("bench-{tag}-{n}m-{rep}");
    // Freshly written data is normally in the page cache; hosts that page out idle
    // pages (DAMON) would otherwise make whichever step runs first read it from disk.
    let ((wall, ckpt, cpu), (cp, cp_sync)) = if rep.is_multiple_of(2) {
        warm_cache(&host)?;
        let base = host_copy(&host, &cfg.work)?;
        warm_cache(&host)?;
        (checkpoint(c, o, cfg.daemon_pid, id, name).await?, base)
    } else {
        warm_cache(&host)?;
        let ck = checkpoint(c, o, cfg.daemon_pid, id, name).await?;
        warm_cache(&host)?;
        (ck, host_copy(&host, &cfg.work)?)
    };
    Ok(Ck { wall, cpu, ckpt, cp, cp_sync })
}

/// The checkpoint series: per size, REPS samples on each sandbox of `sbs`
/// (interleaved, the order rotating).
async fn series(c: &Client, o: &mut Owned, cfg: &crate::Cfg, sbs: &[(&str, &str)]) -> Result<Vec<Vec<(u64, Vec<Ck>)>>> {
    let mut out: Vec<Vec<(u64, Vec<Ck>)>> =
        sbs.iter().map(|_| SIZES.iter().map(|&n| (n, Vec::new())).collect()).collect();
    for (si, &n) in SIZES.iter().enumerate() {
        for rep in 0..REPS {
            for k in 0..sbs.len() {
                let j = (k + rep) % sbs.len();
                let (id, tag) = sbs[j];
                let ck = sample(c, o, cfg, id, tag, n, rep).await?;
                out[j][si].1.push(ck);
            }
        }
    }
    Ok(out)
}

/// Medians (ms) at one size: (MiB, checkpoint big, cp, cp + sync -f, checkpoint small).
type Slope = (u64, f64, f64, f64, f64);

fn med(v: impl IntoIterator<Item = Duration>) -> Duration {
    let v: Vec<Duration> = v.into_iter().collect();
    summarize(&v).p50
}

fn med_ms(v: impl IntoIterator<Item = u64>) -> u64 {
    let mut v: Vec<u64> = v.into_iter().collect();
    v.sort_unstable();
    v[(v.len() - 1) / 2]
}

fn fms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One fork round: (wall, server duration_ms, children, per-child boot ms from events).
struct ForkRun {
    wall: Duration,
    server_ms: u64,
    children: Vec<String>,
    boot_ms: Vec<u64>,
    rm: Duration,
}

async fn fork_round(c: &Client, o: &mut Owned, ckpt: &str, prefix: &str, keep: bool) -> Result<ForkRun> {
    let req = ForkRequest {
        source: ckpt.to_string(),
        count: FORKS,
        name_prefix: Some(prefix.to_string()),
        lifecycle: Lifecycle::Persistent,
        ttl: None,
        limits: None,
        network: None,
        processes: None,
        isolation: None,
    };
    sync_all();
    let t = Instant::now();
    let r = match c.fork(&req).await {
        Ok(r) => r,
        Err(e) => {
            // A failed fork can leave a child that did not start behind (in `error`) and
            // returns no ids: find the children by name so the checkpoint can be deleted.
            adopt(c, o, prefix).await;
            return Err(anyhow::Error::new(e).context(format!("fork {FORKS} from {ckpt}")));
        }
    };
    let wall = t.elapsed();
    o.sandboxes.extend(r.sandboxes.iter().cloned());
    if r.sandboxes.len() != FORKS as usize {
        bail!("fork returned {} children, asked for {FORKS}", r.sandboxes.len());
    }
    // Outside the timing: every child is running and runs a command.
    let mut boot_ms = Vec::new();
    for id in &r.sandboxes {
        let sb = c.get_sandbox(id).await.with_context(|| format!("get child {id}"))?;
        if sb.state != SandboxState::Running {
            bail!("fork child {id} is {} (reason {}), not running", sb.state, sb.state_reason);
        }
        let out = run_in(c, id, &["echo", "ok"]).await?;
        if out != "ok\n" {
            bail!("`echo ok` in fork child {id} printed {out:?}");
        }
        let evs = c.events(Some(id), 0).await.with_context(|| format!("events of {id}"))?;
        if let Some(e) = evs.iter().find(|e| e.from == Some(SandboxState::Creating) && e.to == SandboxState::Running) {
            boot_ms.push(e.duration_ms);
        }
    }
    let rm = if keep { Duration::ZERO } else { o.remove_sandboxes(c, &r.sandboxes).await? };
    Ok(ForkRun { wall, server_ms: r.duration_ms, children: r.sandboxes, boot_ms, rm })
}

/// Adds the sandboxes named `<prefix>-*` to the owned list (they are removed at the end).
async fn adopt(c: &Client, o: &mut Owned, prefix: &str) {
    let p = format!("{prefix}-");
    for s in c.list_sandboxes().await.unwrap_or_default() {
        if s.name.starts_with(&p) && !o.sandboxes.contains(&s.id) {
            o.sandboxes.push(s.id);
        }
    }
}

/// Fork calls made and the errors of those that failed.
#[derive(Default)]
struct Attempts {
    calls: usize,
    failures: Vec<String>,
}

/// Tries attempts of a round.
const FORK_TRIES: usize = 3;

/// A fork round; a failed round is recorded in `att` (a FAIL row), its children are
/// removed and it is run again, up to FORK_TRIES times.
async fn fork_retry(
    c: &Client,
    o: &mut Owned,
    att: &mut Attempts,
    ckpt: &str,
    prefix: &str,
    keep: bool,
) -> Result<ForkRun> {
    let mut last = None;
    for k in 0..FORK_TRIES {
        let p = if k == 0 { prefix.to_string() } else { format!("{prefix}r{k}") };
        att.calls += 1;
        match fork_round(c, o, ckpt, &p, keep).await {
            Ok(r) => return Ok(r),
            Err(e) => {
                let msg = format!("{e:#}");
                eprintln!("strata-bench: fork round {p} failed (attempt {} of {FORK_TRIES}): {msg}", k + 1);
                att.failures.push(msg);
                adopt(c, o, &p).await;
                let mine: Vec<String> = {
                    let all = c.list_sandboxes().await.unwrap_or_default();
                    all.into_iter().filter(|s| s.name.starts_with(&format!("{p}-"))).map(|s| s.id).collect()
                };
                o.remove_sandboxes(c, &mine).await?;
                last = Some(e);
            }
        }
    }
    Err(last.expect("at least one attempt"))
}

/// Baseline for a fork: FORKS sequential `create_sandbox` calls from the same checkpoint
/// (timed together), then the children are removed.
async fn sequential_creates(c: &Client, o: &mut Owned, ckpt: &str, prefix: &str) -> Result<Duration> {
    let mut ids = Vec::new();
    sync_all();
    let t = Instant::now();
    for i in 1..=FORKS {
        let req = CreateSandboxRequest {
            source: ckpt.to_string(),
            name: Some(format!("{prefix}-{i}")),
            ..Default::default()
        };
        let sb = match c.create_sandbox(&req).await {
            Ok(sb) => sb,
            Err(e) => {
                adopt(c, o, prefix).await;
                return Err(anyhow::Error::new(e).context(format!("create from {ckpt}")));
            }
        };
        o.sandboxes.push(sb.id.clone());
        ids.push(sb.id);
    }
    let el = t.elapsed();
    run_in(c, &ids[0], &["echo", "ok"]).await?;
    o.remove_sandboxes(c, &ids).await?;
    Ok(el)
}

/// Used bytes of the file system holding `dir` (statvfs).
fn fs_used(dir: &Path) -> Result<u64> {
    let p = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())?;
    // SAFETY: statvfs is plain old data; all zeros is a valid value.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: statvfs writes only into the struct we pass; the path is NUL-terminated.
    if unsafe { libc::statvfs(p.as_ptr(), &mut s) } != 0 {
        bail!("statvfs {}: {}", dir.display(), std::io::Error::last_os_error());
    }
    Ok((s.f_blocks - s.f_bfree) as u64 * s.f_frsize as u64)
}

struct Disk {
    total: u64,
    sandboxes: u64,
    layers: u64,
    fs: u64,
}

/// Waits (up to 10 s) until the daemon has released the directories of destroyed
/// sandboxes (it does so in the background), then measures.
async fn disk(c: &Client, state: &Path) -> Result<Disk> {
    let dir = state.join("sandboxes");
    let t = Instant::now();
    loop {
        let live: Vec<String> = c.list_sandboxes().await?.into_iter().map(|s| s.id).collect();
        let stale = std::fs::read_dir(&dir)?
            .flatten()
            .filter(|e| !live.contains(&e.file_name().to_string_lossy().into_owned()))
            .count();
        if stale == 0 {
            break;
        }
        if t.elapsed() > Duration::from_secs(10) {
            eprintln!("strata-bench: {stale} directories of destroyed sandboxes are still in {}", dir.display());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sync_all();
    let du = |d: &Path| -> Result<u64> {
        // A directory being released right now makes du fail: measure again.
        let mut r = disk_usage(d);
        for _ in 0..3 {
            if r.is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
            r = disk_usage(d);
        }
        r
    };
    Ok(Disk { total: du(state)?, sandboxes: du(&dir)?, layers: du(&state.join("layers"))?, fs: fs_used(state)? })
}

fn delta(a: u64, b: u64) -> String {
    let d = b as i64 - a as i64;
    let m = d as f64 / MIB as f64;
    format!("{}{m:.2} MiB", if d >= 0 { "+" } else { "" })
}

pub async fn run(b: &mut Bench) -> Result<()> {
    let c = b.client.clone();
    let mut o = Owned::default();
    let res = measure(b, &mut o).await;
    let clean = o.cleanup(&c).await;
    res?;
    clean
}

async fn measure(b: &mut Bench, o: &mut Owned) -> Result<()> {
    let cfg = b.cfg.clone();
    let c = b.client.clone();
    let small = cfg.image.clone();
    let mut details = Vec::new();

    // The big image.
    println!("generating a ~{} MiB rootfs tarball in {}", cfg.big_mib, cfg.work.display());
    let t = Instant::now();
    let (tar, nfiles) = generate_big(&cfg.images, &cfg.work, cfg.big_mib)?;
    let gen = t.elapsed();
    let tar_len = std::fs::metadata(&tar)?.len();
    sync_all();
    let du0 = disk(&c, &cfg.state_dir).await?.total;
    let t = Instant::now();
    let rep = c
        .import_image(&ImportImageRequest {
            source: tar.to_string_lossy().into_owned(),
            name: BIG_IMAGE.into(),
            trusted: false,
            replace: true,
        })
        .await
        .context("import the big rootfs")?;
    let import = t.elapsed();
    o.image = true;
    std::fs::remove_file(&tar)?;
    sync_all();
    let du1 = disk(&c, &cfg.state_dir).await?.total;
    let small_img = c.get_image(&small).await.with_context(|| format!("image {small}"))?;
    details.push(format!(
        "big image {BIG_IMAGE}: busybox rootfs + {nfiles} x {} of seeded random data; tarball {} (generated in {}); \
         imported in {} (bytes_stored {}, state dir +{}); small image {small}: {}",
        bytes(cfg.big_mib * MIB / nfiles as u64),
        bytes(tar_len),
        secs(gen),
        secs(import),
        bytes(rep.bytes_stored),
        bytes(du1.saturating_sub(du0)),
        bytes(small_img.size),
    ));
    let big_label = if cfg.big_mib.is_multiple_of(1024) {
        format!("{} GiB", cfg.big_mib / 1024)
    } else {
        format!("{} MiB", cfg.big_mib)
    };
    b.report.rows.push(Row::new(
        format!("setup: import of the generated {big_label} rootfs (checkpoint/fork figures)"),
        secs(import),
        "-",
        "-",
        "-",
        Verdict::Info,
    ));

    // (a) Checkpoints on the big and the small image.
    let (big_sb, big_w, big_wck) = prepared(&c, o, cfg.daemon_pid, BIG_IMAGE, "big").await?;
    let (small_sb, small_w, small_wck) = prepared(&c, o, cfg.daemon_pid, &small, "small").await?;
    details.push(format!(
        "warm-up checkpoints (fresh sandbox + mkdir /work): big {} ({} paths, layer {}), small {} ({} paths, layer {})",
        ms(big_w),
        big_wck.changed_paths,
        bytes(big_wck.layer_size),
        ms(small_w),
        small_wck.changed_paths,
        bytes(small_wck.layer_size)
    ));
    if damon_on() {
        details.push("note: DAMON is on (/sys/kernel/mm/damon/admin/kdamonds/*/state): the host pages out idle memory, hence the reads before each timed step".into());
    }
    let mut both = series(&c, o, &cfg, &[(&big_sb, "big"), (&small_sb, "small")]).await?;
    let sml = both.pop().expect("two series");
    let big = both.pop().expect("two series");
    let mut slope = Vec::new();
    for ((n, v), (_, s)) in big.iter().zip(&sml) {
        let wall = med(v.iter().map(|x| x.wall));
        let cp = med(v.iter().map(|x| x.cp));
        let cps = med(v.iter().map(|x| x.cp + x.cp_sync));
        let frozen = med_ms(v.iter().map(|x| x.ckpt.frozen_ms));
        let dur = med_ms(v.iter().map(|x| x.ckpt.duration_ms));
        let limit = CKPT_SLACK_MS + fms(cp);
        let swall = med(s.iter().map(|x| x.wall));
        slope.push((*n, fms(wall), fms(cp), fms(cps), fms(swall)));
        b.report.rows.push(Row::new(
            format!(
                "checkpoint, {n} MiB changed on {big_label} rootfs: API wall, median of {REPS} [daemon frozen / total]"
            ),
            format!("{} [{frozen} / {dur} ms]", ms(wall)),
            format!("{} (cp of the {n} MiB)", ms(cp)),
            ratio(fms(wall), fms(cp)),
            // The issue states the target for 10 MiB changed; 1 and 100 MiB are reported.
            if *n == TARGET_MIB {
                format!("<= 50 ms + cp = {limit:.2} ms")
            } else {
                format!("(reported; 50 ms + cp = {limit:.2} ms)")
            },
            if *n == TARGET_MIB { Verdict::of(fms(wall) <= limit) } else { Verdict::Info },
        ));
        for (tag, xs) in [("big", v), ("small", s)] {
            for (i, x) in xs.iter().enumerate() {
                details.push(format!(
                    "{tag:<5} {n:>3} MiB #{}: checkpoint {} (frozen {} ms, daemon {} ms, daemon CPU user+sys {} ms, layer {}, {} paths); cp {} + sync -f {}",
                    i + 1,
                    ms(x.wall),
                    x.ckpt.frozen_ms,
                    x.ckpt.duration_ms,
                    x.cpu.map_or("?".into(), |(u, k)| format!("{u}+{k}")),
                    bytes(x.ckpt.layer_size),
                    x.ckpt.changed_paths,
                    ms(x.cp),
                    ms(x.cp_sync)
                ));
            }
        }
    }
    let join = |f: &dyn Fn(&Slope) -> String| slope.iter().map(f).collect::<Vec<_>>().join(" / ");
    b.report.rows.push(Row::new(
        "checkpoint vs durable copy (cp + sync -f), 1 / 10 / 100 MiB, medians",
        join(&|x| format!("{:.1}", x.1)) + " ms",
        join(&|x| format!("{:.1}", x.3)) + " ms",
        join(&|x| ratio(x.1, x.3)),
        "-",
        Verdict::Info,
    ));
    b.report.rows.push(Row::new(
        format!(
            "checkpoint: {big_label} rootfs vs {} rootfs ({small}), 1 / 10 / 100 MiB, medians",
            short_size(small_img.size)
        ),
        join(&|x| format!("{:.1}", x.1)) + " ms",
        join(&|x| format!("{:.1}", x.4)) + " ms",
        join(&|x| ratio(x.1, x.4)),
        "-",
        Verdict::Info,
    ));
    if let (Some(f), Some(l)) = (slope.first(), slope.last()) {
        let dn = (l.0 - f.0) as f64;
        details.push(format!(
            "marginal cost per changed MiB ({} -> {} MiB): checkpoint {:.2} ms/MiB (small image {:.2}), cp {:.2} ms/MiB, cp + sync -f {:.2} ms/MiB",
            f.0,
            l.0,
            (l.1 - f.1) / dn,
            (l.4 - f.4) / dn,
            (l.2 - f.2) / dn,
            (l.3 - f.3) / dn
        ));
    }
    // The series' layers would blur the disk figure: drop them now.
    o.remove_sandboxes(&c, &[big_sb, small_sb]).await?;
    o.remove_checkpoints(&c).await?;

    // (b) Fork templates: a fresh sandbox of each image, 1 MiB written, one checkpoint.
    let mut tmpl = Vec::new();
    for (img, tag) in [(BIG_IMAGE, "big"), (small.as_str(), "small")] {
        let sb = c.create_sandbox(&create_req(img)).await.with_context(|| format!("create template of {img}"))?;
        o.sandboxes.push(sb.id.clone());
        run_in(&c, &sb.id, &["mkdir", "-p", "/work"]).await?;
        write_random(&c, &sb.id, "/work/template", 1).await?;
        let (_, ck, _) = checkpoint(&c, o, cfg.daemon_pid, &sb.id, format!("bench-template-{tag}")).await?;
        tmpl.push(ck);
    }
    let (cbig, csmall) = (tmpl[0].id.clone(), tmpl[1].id.clone());
    let mut att = Attempts::default();
    fork_retry(&c, o, &mut att, &cbig, "fk-warm-big", false).await?;
    fork_retry(&c, o, &mut att, &csmall, "fk-warm-small", false).await?;
    let (mut fb, mut fs, mut seq) = (Vec::new(), Vec::new(), Vec::new());
    sequential_creates(&c, o, &cbig, "seq-warm").await?;
    for r in 0..FORK_ROUNDS {
        seq.push(sequential_creates(&c, o, &cbig, &format!("seq-{r}")).await?);
        if r.is_multiple_of(2) {
            fb.push(fork_retry(&c, o, &mut att, &cbig, &format!("fk-big-{r}"), false).await?);
            fs.push(fork_retry(&c, o, &mut att, &csmall, &format!("fk-small-{r}"), false).await?);
        } else {
            fs.push(fork_retry(&c, o, &mut att, &csmall, &format!("fk-small-{r}"), false).await?);
            fb.push(fork_retry(&c, o, &mut att, &cbig, &format!("fk-big-{r}"), false).await?);
        }
    }
    let fwall = |v: &[ForkRun]| med(v.iter().map(|x| x.wall));
    let fsrv = |v: &[ForkRun]| med_ms(v.iter().map(|x| x.server_ms));
    let (wb, ws) = (fwall(&fb), fwall(&fs));
    let range = |v: &[ForkRun]| {
        let s = summarize(&v.iter().map(|x| x.wall).collect::<Vec<_>>());
        format!("{:.1}-{:.1}", fms(s.min), fms(s.max))
    };
    b.report.rows.push(Row::new(
        format!("fork {FORKS} from a checkpoint of the {big_label} image: all running, median of {FORK_ROUNDS} (min-max) [daemon]"),
        format!("{} ({}) [{} ms]", ms(wb), range(&fb), fsrv(&fb)),
        format!("{} ({FORKS} sequential create_sandbox from the checkpoint)", ms(med(seq.iter().copied()))),
        ratio(fms(wb), fms(med(seq.iter().copied()))),
        format!("<= {FORK_TARGET_MS:.0} ms"),
        Verdict::of(fms(wb) <= FORK_TARGET_MS),
    ));
    b.report.rows.push(Row::new(
        format!("fork {FORKS}: {big_label} image vs {} image ({small}), median wall", short_size(small_img.size)),
        ms(wb),
        format!("{} ({}) [{} ms]", ms(ws), range(&fs), fsrv(&fs)),
        ratio(fms(wb), fms(ws)),
        format!("<= {FORK_RATIO_MAX}x"),
        Verdict::of(fms(wb) <= FORK_RATIO_MAX * fms(ws)),
    ));
    for (tag, v) in [("big", &fb), ("small", &fs)] {
        for (i, x) in v.iter().enumerate() {
            let mut bt = x.boot_ms.clone();
            bt.sort_unstable();
            details.push(format!(
                "fork {tag} #{}: wall {}, daemon {} ms; per-child creating->running (ms, sorted): {:?}; {} children ran `echo ok`; removing them took {}",
                i + 1,
                ms(x.wall),
                x.server_ms,
                bt,
                x.children.len(),
                ms(x.rm)
            ));
        }
    }

    details.push(format!("baseline, {FORKS} sequential create_sandbox calls from the big template's checkpoint (after one warm-up batch): {}", seq.iter().map(|d| ms(*d)).collect::<Vec<_>>().join(", ")));

    // (c) Disk: 16 forks of the big template, each writing 1 MiB.
    let before = disk(&c, &cfg.state_dir).await?;
    let fr = fork_retry(&c, o, &mut att, &cbig, "fk-disk", true).await?;
    for id in &fr.children {
        write_random(&c, id, "/work/fork-data", 1).await?;
    }
    let after = disk(&c, &cfg.state_dir).await?;
    o.remove_sandboxes(&c, &fr.children).await?;
    let written = FORKS as u64 * MIB;
    let growth = after.total.saturating_sub(before.total);
    let copies = (FORKS as u64 + 1) * cfg.big_mib * MIB;
    b.report.rows.push(Row::new(
        format!("disk: {FORKS} forks of the {big_label} template, 1 MiB written by each: state dir growth"),
        format!(
            "{} (sandboxes/ {}, layers/ {})",
            bytes(growth),
            delta(before.sandboxes, after.sandboxes),
            delta(before.layers, after.layers)
        ),
        format!("{} written", bytes(written)),
        ratio(growth as f64, written as f64),
        format!("< 2x written ({})", bytes(2 * written)),
        Verdict::of(growth < 2 * written),
    ));
    b.report.rows.push(Row::new(
        format!("disk: state dir total with the {FORKS} forks (images + template + forks)"),
        bytes(after.total),
        format!("{:.1} GiB if every fork copied the rootfs", copies as f64 / (1u64 << 30) as f64),
        ratio(after.total as f64, copies as f64),
        "-",
        Verdict::Info,
    ));
    details.push(format!(
        "disk before the {FORKS} forks: state dir {} (sandboxes/ {}, layers/ {}); after they wrote 1 MiB each: state dir {} (sandboxes/ {}, layers/ {}); \
         file-system used (statvfs, host-wide, noisy) {}",
        bytes(before.total),
        bytes(before.sandboxes),
        bytes(before.layers),
        bytes(after.total),
        bytes(after.sandboxes),
        bytes(after.layers),
        delta(before.fs, after.fs)
    ));

    let nf = att.failures.len();
    b.report.rows.push(Row::new(
        format!("fork {FORKS}: fork calls that failed (each failed round is retried)"),
        match att.failures.first() {
            None => format!("0 of {}", att.calls),
            Some(e) => format!("{nf} of {} (first: {e})", att.calls),
        },
        "-",
        "-",
        "0",
        Verdict::of(nf == 0),
    ));
    for (i, e) in att.failures.iter().enumerate() {
        details.push(format!("failed fork call {}: {e}", i + 1));
    }

    b.report.sections.push((
        "5. checkpoint and fork".into(),
        format!(
            "A {big_label} rootfs is generated (the busybox tarball's entries plus {nfiles} files of seeded pseudo-random data under \
             /opt/bench-big, written straight into an uncompressed tar) and imported as `{BIG_IMAGE}`; the small image is `{small}`. \
             **Checkpoint:** one sandbox per image (after `mkdir -p /work` and a warm-up checkpoint); for N = 1, 10, 100 MiB, {REPS} times on each (the two sandboxes interleaved, order rotating): \
             `dd if=/dev/urandom of=/work/blobN bs=1M count=N` via `exec` (fresh data, overwriting the previous blobN), `sync`, then in \
             alternating order (each preceded by reading the file once, so both find it in the page cache as freshly written \
             data normally is) the timed `checkpoint` API call (wall time; the checkpoint's own `frozen_ms` and `duration_ms` are the \
             daemon's; the daemon's CPU time during the call, from /proc/PID/stat at clock-tick resolution, is in the details) and the baseline: `cp` of the same file, read from the sandbox's writable layer on the host, to a new file on the same \
             file system, followed by a separately timed `sync -f` (the checkpoint makes its layer durable before it returns, so \
             cp + sync -f is the durable comparison). Target (as the issue states it, for 10 MiB changed): checkpoint wall <= 50 ms + cp time (medians); 1 and 100 MiB are reported against the same formula. \
             **Fork:** per image, a template sandbox writes 1 MiB and is checkpointed; `fork` of {FORKS} children from that checkpoint, \
             timed around the API call (it returns when every child is running), one warm-up round per image then {FORK_ROUNDS} rounds \
             alternating which image goes first; outside the timing each child is checked to be `running` and to run `echo ok`, its \
             creating->running event duration is read, and all children are removed. A fork call that fails is counted (its own row), its \
             leftover children are removed and the round is run again (up to {FORK_TRIES} tries). Baseline: {FORKS} sequential `create_sandbox` calls \
             with the big template's checkpoint as the source (one warm-up batch, then one batch before each round), timed together. \
             **Disk:** `du -s -B1 -x` of the state directory (and its sandboxes/ and layers/) after `sync`, before forking {FORKS} children \
             of the big template and after each of them wrote 1 MiB of random data (`dd`); target: growth < 2x the bytes written."
        ),
        details,
    ));
    Ok(())
}

/// Whether a DAMON kdamond (e.g. proactive pageout) is running on the host.
fn damon_on() -> bool {
    std::fs::read_dir("/sys/kernel/mm/damon/admin/kdamonds")
        .map(|rd| rd.flatten().any(|e| std::fs::read_to_string(e.path().join("state")).is_ok_and(|s| s.trim() == "on")))
        .unwrap_or(false)
}

fn short_size(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", b as f64 / MIB as f64)
    }
}
