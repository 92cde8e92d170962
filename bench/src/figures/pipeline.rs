//! Figure 7: the demo's setup reuse and pipeline overhead.
//!
//! (a) **Setup reuse**: redoing the demo's setup — a sandbox of the Debian+python
//! image, the local wheelhouse copied in, a venv with its pinned packages installed
//! with `pip install --no-index` — against starting a sandbox from the template that
//! setup was sealed into, up to its first command. (b) **Pipeline overhead**:
//! examples/demo/pipeline.toml run from that template; per stage, its wall time minus
//! the time its own commands took (the run records both).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use strata_api::{
    CreateSandboxRequest, CreateTemplateRequest, ExecRequest, ImportImageRequest, PipelineState, RunPipelineRequest,
    StageLifecycle,
};

use super::exec_ok;
use crate::report::{Row, Verdict};
use crate::stats::{ms, ratio, secs, summarize};
use crate::sys::timed;
use crate::Bench;

/// Target of the issue: starting from the template is at least this many times faster than redoing setup.
const REUSE_TARGET: f64 = 50.0;
/// Target of issue 18: sealing the setup (checkpoint + scan gate) against `cp -a` + `sync -f` of its writable layer.
const SEAL_TARGET: f64 = 1.5;
/// Sandboxes started from the template (after one warm-up).
const STARTS: usize = 5;
/// The image the demo uses, its template and the pipeline spec.
const IMAGE: &str = "bench-debian-python";
const TEMPLATE: &str = "proj-env";
const SPEC: &str = "examples/demo/pipeline.toml";

fn wheelhouse() -> PathBuf {
    PathBuf::from(std::env::var("STRATA_WHEELHOUSE").unwrap_or_else(|_| "/var/cache/strata/wheelhouse".into()))
}

/// Runs `sh -c script` as `user` in `id`; fails with its output unless it exits 0.
async fn sh(b: &Bench, id: &str, user: Option<&str>, script: &str) -> Result<String> {
    exec_ok(
        &b.client,
        id,
        ExecRequest {
            cmd: vec!["sh".into(), "-c".into(), script.into()],
            user: user.map(str::to_string),
            ..Default::default()
        },
    )
    .await
}

/// The demo's setup in a new sandbox: wheelhouse in, venv with every package, a project.
/// Returns the sandbox id and the number of packages installed.
async fn setup(b: &Bench, wheels: &Path) -> Result<(String, usize)> {
    let req = CreateSandboxRequest {
        source: IMAGE.into(),
        limits: strata_api::ResourceLimits {
            memory_bytes: Some(4 << 30),
            cpus: Some(2.0),
            pids: Some(1024),
            ..Default::default()
        },
        policy: Some(strata_api::PolicyPatch {
            flush: Some(vec!["/tmp/wheels".into(), "/home/user/.cache".into()]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let id = b.client.create_sandbox(&req).await.context("create the setup sandbox")?.id;
    let strata = b.cfg.strata.to_string_lossy().to_string();
    let socket = b.cfg.socket.to_string_lossy().to_string();
    timed(&[&strata, "--socket", &socket, "cp", &wheels.to_string_lossy(), &format!("{id}:/tmp/wheels")], None)?;
    let out = sh(
        b,
        &id,
        Some("user"),
        "python3 -m venv ~/venv && ~/venv/bin/pip install --quiet --disable-pip-version-check --no-index --find-links /tmp/wheels -r /tmp/wheels/requirements.txt \
         && mkdir -p ~/proj && cd ~/proj && printf 'def add(a, b):\\n    return a + b\\n' > calc.py && ~/venv/bin/pip list --disable-pip-version-check 2>/dev/null | tail -n +3 | wc -l",
    )
    .await?;
    let n = out.trim().parse().with_context(|| format!("package count {out:?}"))?;
    Ok((id, n))
}

pub async fn run(b: &mut Bench) -> Result<()> {
    let wheels = wheelhouse();
    if !wheels.join("requirements.txt").exists() {
        bail!("no wheelhouse at {} (run scripts/build-wheelhouse.sh)", wheels.display());
    }
    let deb = b.cfg.images.join("debian-python.tar.gz");
    if !deb.exists() {
        bail!("{} missing (run scripts/build-test-images.sh --debian)", deb.display());
    }
    if b.client.get_image(IMAGE).await.is_err() {
        let req = ImportImageRequest {
            source: deb.to_string_lossy().into(),
            name: IMAGE.into(),
            trusted: true,
            replace: false,
        };
        b.client.import_image(&req).await.context("import the Debian+python image")?;
    }
    let mut details = Vec::new();

    // (a) Redo setup, seal it, then start from the template.
    let t = Instant::now();
    let (dev, packages) = setup(b, &wheels).await?;
    let setup_time = t.elapsed();
    println!("setup: {packages} packages in {}", secs(setup_time));
    crate::sys::sync_all();
    let t = Instant::now();
    let tpl = b
        .client
        .create_template(&CreateTemplateRequest {
            name: TEMPLATE.into(),
            from: dev.clone(),
            replace: true,
            accept_findings: false,
        })
        .await
        .context("promote the setup to a template (scan gate)")?;
    let seal_time = t.elapsed();
    // The same writable layer copied and synced (the seal's baseline), and the scan gate's scan alone.
    let upper = strata_runtime::disk::upper_dir(&b.cfg.state_dir.join("sandboxes").join(&dev));
    let (files, bytes) = (count_entries(&upper)?, crate::sys::apparent_size(&upper)?);
    let copy_to = b.cfg.work.join("setup-copy");
    let _ = std::fs::remove_dir_all(&copy_to);
    crate::sys::sync_all();
    let t = Instant::now();
    let copied = std::process::Command::new("cp").arg("-a").arg(&upper).arg(&copy_to).status()?;
    let synced = std::process::Command::new("sync").arg("-f").arg(&copy_to).status()?;
    let copy_time = t.elapsed();
    let _ = std::fs::remove_dir_all(&copy_to);
    if !copied.success() || !synced.success() {
        bail!("cp -a / sync -f of {} failed", upper.display());
    }
    let t = Instant::now();
    b.client.scan(&tpl.checkpoint).await.context("scan the template's checkpoint")?;
    let scan_time = t.elapsed();
    b.client.remove_sandbox(&dev, true).await.ok();
    let mut starts = Vec::new();
    for i in 0..=STARTS {
        let t = Instant::now();
        let id =
            b.client.create_sandbox(&CreateSandboxRequest { source: TEMPLATE.into(), ..Default::default() }).await?.id;
        sh(b, &id, Some("user"), "~/venv/bin/python -V >/dev/null").await?;
        let el = t.elapsed();
        if i > 0 {
            starts.push(el);
        }
        b.client.remove_sandbox(&id, true).await.ok();
    }
    let s = summarize(&starts);
    let x = setup_time.as_secs_f64() / s.p50.as_secs_f64();
    b.report.rows.push(Row::new(
        format!("setup reuse: start from the template + first command ({packages} packages)"),
        format!("{} p50", ms(s.p50)),
        format!("{} redo setup", secs(setup_time)),
        format!("{x:.0}x faster"),
        format!(">= {REUSE_TARGET:.0}x"),
        Verdict::of(x >= REUSE_TARGET),
    ));
    details.push(format!(
        "redo setup (create + copy {} + venv + pip install --no-index of {packages} packages): {}",
        wheels.display(),
        secs(setup_time)
    ));
    let seal_ratio = seal_time.as_secs_f64() / copy_time.as_secs_f64();
    b.report.rows.push(Row::new(
        format!(
            "seal the setup into a template (checkpoint + scan gate): its writable layer, {files} entries, {:.0} MiB",
            bytes as f64 / 1048576.0
        ),
        secs(seal_time),
        format!("{} (cp -a + sync -f of that layer)", secs(copy_time)),
        ratio(seal_time.as_secs_f64(), copy_time.as_secs_f64()),
        format!("<= {SEAL_TARGET}x"),
        Verdict::of(seal_ratio <= SEAL_TARGET),
    ));
    b.report.rows.push(Row::new(
        "the scan gate's scan of that checkpoint alone",
        secs(scan_time),
        format!("{} (cp -a + sync -f of that layer)", secs(copy_time)),
        ratio(scan_time.as_secs_f64(), copy_time.as_secs_f64()),
        "(reported)",
        Verdict::Info,
    ));
    details.push(format!(
        "seal into template {TEMPLATE} (checkpoint + state-hygiene scan), paid once: {}; cp -a + sync -f of the same \
         writable layer ({files} entries, {bytes} B): {}; the scan alone: {}",
        secs(seal_time),
        secs(copy_time),
        secs(scan_time)
    ));
    details.push(format!("start from the template + `~/venv/bin/python -V`: {}", s.line()));

    // (b) The demo pipeline from that template: overhead per stage.
    let toml = std::fs::read_to_string(SPEC).with_context(|| format!("read {SPEC}"))?;
    let t = Instant::now();
    let mut run = b
        .client
        .run_pipeline(&RunPipelineRequest { toml: Some(toml), spec: None })
        .await
        .context("start the demo pipeline")?;
    while run.state == PipelineState::Running {
        if t.elapsed() > Duration::from_secs(600) {
            bail!("pipeline run {} did not finish in 10 min", run.id);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        run = b.client.pipeline(&run.id).await?;
    }
    if run.state != PipelineState::Succeeded {
        bail!("pipeline run {} {}: {}", run.id, run.state.as_str(), run.reason.unwrap_or_default());
    }
    let (mut total, mut commands) = (0u64, 0u64);
    for st in &run.stages {
        let overhead = st.duration_ms.saturating_sub(st.commands_ms);
        total += st.duration_ms;
        commands += st.commands_ms;
        let what = match st.lifecycle {
            StageLifecycle::Ephemeral => "create, destroy",
            StageLifecycle::Persistent => "create, checkpoint, stop",
            StageLifecycle::PersistentWithCheckpoints => "create, a checkpoint per command, stop",
            StageLifecycle::Fork => "fork, select, promote, stop/destroy",
            StageLifecycle::Standby => "create, standby",
        };
        b.report.rows.push(Row::new(
            format!("pipeline overhead: stage {} ({})", st.name, st.lifecycle.as_str()),
            format!("{overhead} ms"),
            format!("{} ms commands", st.commands_ms),
            format!("{} ms stage", st.duration_ms),
            "-",
            Verdict::Info,
        ));
        details.push(format!(
            "stage {} ({}; strata's part: {what}): {} ms wall, {} ms in its commands, {overhead} ms overhead",
            st.name,
            st.lifecycle.as_str(),
            st.duration_ms,
            st.commands_ms
        ));
    }
    b.report.rows.push(Row::new(
        "pipeline overhead: whole run (demo spec)",
        format!("{} ms", total.saturating_sub(commands)),
        format!("{commands} ms commands"),
        ratio(total as f64, commands as f64),
        "-",
        Verdict::Info,
    ));
    details.push(format!(
        "run {}: {} stages, {total} ms in stages ({} wall from the request)",
        run.id,
        run.stages.len(),
        ms(t.elapsed())
    ));
    // The run keeps its stopped stage sandboxes (persistent output, fork winner): not needed here.
    for sb in run.stages.iter().flat_map(|s| s.sandboxes.iter()) {
        b.client.remove_sandbox(sb, true).await.ok();
    }

    b.report.sections.push((
        "7. setup reuse and pipeline overhead".into(),
        format!(
            "**Setup reuse:** the demo's setup is redone once: a sandbox of the Debian 12 + python image (`{IMAGE}`, limits 4 GiB / 2 CPUs), the local \
             wheelhouse (scripts/build-wheelhouse.sh: the pinned packages of examples/demo/requirements.txt) copied in with `strata cp`, a venv \
             created and every package installed with `pip install --no-index` ({packages} in the venv, pip and setuptools included); timed from the create call to the end of the install. It is then promoted \
             to the template `{TEMPLATE}` (checkpoint + scan gate, timed apart after a `sync`, paid once); its baseline is `cp -a` of that \
             sandbox's writable layer (its upper directory) to the bench's work directory plus `sync -f` on the copy, timed after a `sync` \
             (target, issue 18: <= {SEAL_TARGET}x), and the scan of the template's checkpoint is timed alone. A sandbox is started from the template and runs \
             `~/venv/bin/python -V` (create call to exec result), one warm-up then {STARTS} times; the ratio is redo-setup time over the median start. \
             Target (issue 6): >= {REUSE_TARGET:.0}x. **Pipeline overhead:** `{SPEC}` (work with a checkpoint per command, fork 4 + select, ephemeral eval) \
             runs from that template; each stage records its wall time and the wall time of its own commands (a fork stage: its longest attempt); the \
             difference is what strata adds (creating, forking, checkpointing, selecting, stopping). No target; reported per stage."
        ),
        details,
    ));
    Ok(())
}

/// Entries (files, directories, links) under `dir`, itself included.
fn count_entries(dir: &Path) -> Result<u64> {
    let out = std::process::Command::new("find").arg(dir).arg("-xdev").output().context("find")?;
    if !out.status.success() {
        bail!("find {} failed", dir.display());
    }
    Ok(out.stdout.iter().filter(|b| **b == b'\n').count() as u64)
}
