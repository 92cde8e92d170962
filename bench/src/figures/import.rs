//! Figure 4: import of a ~200+ MB rootfs tarball (time, bytes stored), a second
//! import of the same content (must store nothing), against `tar -xf`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use strata_api::{ImportImageRequest, ImportReport};

use crate::report::{Row, Verdict};
use crate::stats::{bytes, ratio, secs, summarize};
use crate::sys::{apparent_size, disk_usage, sync_all, timed, warm_cache};
use crate::Bench;

/// Size of the generated rootfs's random payload.
const GEN_BYTES: u64 = 200 * 1000 * 1000;

/// splitmix64: a tiny seeded generator, so the generated rootfs is identical on every run.
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// busybox rootfs + ~200 MB of seeded random files, as a reproducible tarball.
fn generate(images: &Path, work: &Path) -> Result<PathBuf> {
    let dir = work.join("gen-rootfs");
    let tar = work.join("gen-rootfs.tar");
    if tar.exists() {
        return Ok(tar);
    }
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let bb = images.join("busybox-rootfs");
    timed(&["cp", "-a", &format!("{}/.", bb.display()), &dir.to_string_lossy()], None)?;
    let mut rng = SplitMix(0x5354_5241_5441_0001);
    let (mut total, mut i) = (0u64, 0usize);
    let mut buf = Vec::new();
    while total < GEN_BYTES {
        let size = (1024 + rng.next() % (512 * 1024)).min(GEN_BYTES - total).max(1) as usize;
        buf.clear();
        while buf.len() < size {
            buf.extend_from_slice(&rng.next().to_le_bytes());
        }
        buf.truncate(size);
        let d = dir.join(format!("usr/share/bench-data/d{:02}", i % 32));
        std::fs::create_dir_all(&d)?;
        std::fs::File::create(d.join(format!("f{i:05}.bin")))?.write_all(&buf)?;
        total += size as u64;
        i += 1;
    }
    timed(
        &[
            "tar",
            "--numeric-owner",
            "--sort=name",
            "--mtime=@1700000000",
            "--format=posix",
            "-C",
            &dir.to_string_lossy(),
            "-cf",
            &tar.to_string_lossy(),
            ".",
        ],
        None,
    )?;
    std::fs::remove_dir_all(&dir)?;
    Ok(tar)
}

async fn import(b: &Bench, src: &Path, name: &str) -> Result<(Duration, ImportReport)> {
    let req = ImportImageRequest {
        source: src.to_string_lossy().into_owned(),
        name: name.into(),
        trusted: false,
        replace: true,
    };
    sync_all();
    let t = Instant::now();
    let r = b.client.import_image(&req).await.with_context(|| format!("import {} as {name}", src.display()))?;
    Ok((t.elapsed(), r))
}

/// Rounds of (first import, second import, tar -xf); the store is emptied between rounds.
const ROUNDS: usize = 3;

struct Tar {
    extract: Duration,
    sync: Duration,
    unpacked: u64,
    disk: u64,
}

/// Baseline: `tar -xf` into a fresh directory on the same file system, then `sync -f`.
fn tar_x(src: &Path, work: &Path) -> Result<Tar> {
    let x = work.join("tar-x");
    let _ = std::fs::remove_dir_all(&x);
    std::fs::create_dir_all(&x)?;
    let xs = x.to_string_lossy().into_owned();
    sync_all();
    let extract = timed(&["tar", "-xf", &src.to_string_lossy(), "-C", &xs], None)?;
    let sync = timed(&["sync", "-f", &xs], None)?;
    let t = Tar { extract, sync, unpacked: apparent_size(&x)?, disk: disk_usage(&x)? };
    std::fs::remove_dir_all(&x)?;
    sync_all();
    Ok(t)
}

fn med(v: &[Duration]) -> String {
    let s = summarize(v);
    if v.len() == 1 {
        return secs(s.p50);
    }
    format!("{:.2} s ({:.2}-{:.2})", s.p50.as_secs_f64(), s.min.as_secs_f64(), s.max.as_secs_f64())
}

pub async fn run(b: &mut Bench) -> Result<()> {
    let cfg = b.cfg.clone();
    let deb = cfg.images.join("debian-python.tar.gz");
    let (src, what) = match cfg.import.as_str() {
        "auto" if deb.exists() => (deb, "debian-python.tar.gz (scripts/build-test-images.sh --debian)".to_string()),
        "auto" | "generated" => {
            println!("generating a ~200 MB rootfs tarball in {}", cfg.work.display());
            (
                generate(&cfg.images, &cfg.work)?,
                "generated: busybox rootfs + 200 MB of seeded random files, uncompressed tar".to_string(),
            )
        }
        p => (PathBuf::from(p), format!("{p} (given with --import)")),
    };
    if !src.is_file() {
        bail!("import source {} is not a file", src.display());
    }
    let src_len = std::fs::metadata(&src)?.len();
    // Both strata and tar read the tarball from the page cache.
    warm_cache(&src)?;

    let (mut t1, mut t2, mut tx, mut txs) = (vec![], vec![], vec![], vec![]);
    let (mut r1s, mut r2s, mut tars) = (vec![], vec![], vec![]);
    let mut details = vec![format!("source: {} ({}), {what}", src.display(), bytes(src_len))];
    for round in 0..ROUNDS {
        // Alternate which goes first, so neither always runs on a quieter disk.
        let tar_first = round % 2 == 1;
        if tar_first {
            tars.push(tar_x(&src, &cfg.work)?);
        }
        let du0 = disk_usage(&cfg.state_dir)?;
        let (d1, r1) = import(b, &src, "bench-import").await?;
        sync_all();
        let du1 = disk_usage(&cfg.state_dir)?;
        let (d2, r2) = import(b, &src, "bench-import-again").await?;
        sync_all();
        let du2 = disk_usage(&cfg.state_dir)?;
        // Removing both images garbage-collects the layer: the next round starts empty.
        for n in ["bench-import", "bench-import-again"] {
            b.client.remove_image(n).await.with_context(|| format!("remove image {n}"))?;
        }
        sync_all();
        let du3 = disk_usage(&cfg.state_dir)?;
        if !tar_first {
            tars.push(tar_x(&src, &cfg.work)?);
        }
        let t = tars.last().expect("one tar per round");
        details.push(format!(
            "round {}: 1st import {} (daemon {} ms; layers new {} reused {}; bytes_stored {}; state dir {du0} -> {du1} B; {} warning(s)), \
             2nd import {} (daemon {} ms; layers new {} reused {}; bytes_stored {}; state dir {du1} -> {du2} B), \
             after removing both images {du3} B; tar -xf {} + sync -f {}",
            round + 1,
            secs(d1),
            r1.duration_ms,
            r1.layers_new,
            r1.layers_reused,
            r1.bytes_stored,
            r1.warnings.len(),
            secs(d2),
            r2.duration_ms,
            r2.layers_new,
            r2.layers_reused,
            r2.bytes_stored,
            secs(t.extract),
            secs(t.sync),
        ));
        t1.push(d1);
        t2.push(d2);
        tx.push(t.extract);
        txs.push(t.extract + t.sync);
        r1s.push((r1, du1.saturating_sub(du0)));
        r2s.push((r2, du2.saturating_sub(du1)));
    }
    let t = &tars[0];
    details.insert(
        1,
        format!(
            "unpacked (tar -xf, apparent size): {}; disk used by the extracted tree: {}",
            bytes(t.unpacked),
            bytes(t.disk)
        ),
    );

    let p = |v: &[Duration]| summarize(v).p50.as_secs_f64();
    let mb = t.unpacked as f64 / 1e6;
    let r1_stored = r1s.iter().map(|(r, _)| r.bytes_stored).max().unwrap_or(0);
    let r1_disk = r1s.iter().map(|(_, d)| *d).max().unwrap_or(0);
    let r2_stored = r2s.iter().map(|(r, _)| r.bytes_stored).max().unwrap_or(0);
    let r2_disk = r2s.iter().map(|(_, d)| *d).max().unwrap_or(0);
    let rows = &mut b.report.rows;
    rows.push(Row::new(
        format!("image import, {mb:.0} MB rootfs: time, median of {ROUNDS} (min-max)"),
        med(&t1),
        format!("{} (tar -xf)", med(&tx)),
        ratio(p(&t1), p(&tx)),
        "<= 1.0x tar -xf",
        Verdict::of(p(&t1) <= p(&tx)),
    ));
    rows.push(Row::new(
        "image import time vs durable tar (tar -xf + sync -f), median",
        secs(summarize(&t1).p50),
        format!("{} (tar -xf + sync -f)", secs(summarize(&txs).p50)),
        ratio(p(&t1), p(&txs)),
        "-",
        Verdict::Info,
    ));
    rows.push(Row::new(
        "image import: bytes stored (first import)",
        format!("{} [disk +{}]", bytes(r1_stored), bytes(r1_disk)),
        format!("{} [tar -xf disk use]", bytes(t.disk)),
        ratio(r1_disk as f64, t.disk as f64),
        "-",
        Verdict::Info,
    ));
    rows.push(Row::new(
        format!("second import of the same rootfs: bytes stored (max of {ROUNDS})"),
        format!("{} [disk +{}]", bytes(r2_stored), bytes(r2_disk)),
        "-",
        "-",
        "0 B",
        Verdict::of(r2_stored == 0),
    ));
    rows.push(Row::new(
        format!("second import of the same rootfs: time, median of {ROUNDS}"),
        med(&t2),
        format!("{} (tar -xf)", med(&tx)),
        ratio(p(&t2), p(&tx)),
        "-",
        Verdict::Info,
    ));
    b.report.sections.push((
        "4. image import".into(),
        format!(
            "Source: {what}. The tarball is read once first so strata and tar both read it from the page cache; `sync` runs \
             before every timed step. {ROUNDS} rounds, each: strata `import_image` through the client (wall time of the request; \
             strata syncs the file system before it reports success), a second import of the same file under another name, removal \
             of both images (which garbage-collects the layer, so every round's first import starts from an empty store), and the \
             baseline `tar -xf SRC -C DIR` into a fresh directory on the same file system (as root, so ownership is preserved) \
             followed by a separately timed `sync -f DIR`; the baseline runs after strata in odd rounds and before it in even ones. \
             Times are the median of the rounds. `bytes_stored` is the daemon's report; `disk +` is the growth of the state \
             directory (`du -s -B1 -x`, so it includes metadata-database growth)."
        ),
        details,
    ));
    Ok(())
}
