//! Figure 15: the microvm tier (issue 20), labelled with its accelerator.
//! On hosts without hardware virtualization the guests run under TCG, QEMU's
//! translator: the figures are reported there, not judged.
//!
//! * boot: create -> first exec output of a microVM, against the same on the
//!   namespace tier;
//! * exec into a running microVM (API) against the exec helper run directly
//!   against the same VM (`strata-init _runsc_exec` over a stream of its
//!   keeper: the agent with no daemon in the way);
//! * standby and resume -> first exec served of a guest holding ~100 MiB in
//!   its memory (a tmpfs file), with the snapshot's size;
//! * a warm checkpoint of that guest (the VM's memory, devices and disk),
//!   and 16 microVMs forked from it (each restored from the snapshot, its
//!   RAM file mapped private), all serving, with the host memory of each:
//!   QEMU's VmRSS (shared pages counted in full) and PSS (shared pages
//!   divided among the processes that map them).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use strata_api::{CheckpointRequest, CreateSandboxRequest, ForkRequest, Isolation, ResourceLimits};

use super::{check_echo, echo_req, exec_ok};
use crate::report::{Row, Verdict};
use crate::stats::{kib, ms, ratio, secs, summarize};
use crate::Bench;

/// Boots measured (after one warm-up, which also builds the chain's image).
const BOOTS: usize = 3;
/// Execs measured each way.
const EXECS: usize = 30;
/// Children of the fork round.
const CHILDREN: u32 = 16;

fn microvm_req(image: &str, memory_mib: u64) -> CreateSandboxRequest {
    CreateSandboxRequest {
        source: image.to_string(),
        isolation: Some(Isolation::Microvm),
        limits: ResourceLimits { memory_bytes: Some(memory_mib << 20), ..Default::default() },
        ..Default::default()
    }
}

/// The accelerator the daemon's microVMs run under, as doctor reports it.
fn accelerator() -> &'static str {
    strata_runtime::microvm::probe().accel().as_str()
}

/// The `/proc` directory of the QEMU process of sandbox `id`.
fn qemu_proc(id: &str) -> Option<PathBuf> {
    let want = format!("strata-{id}");
    std::fs::read_dir("/proc").ok()?.flatten().map(|e| e.path()).find(|p| {
        let cmdline = std::fs::read(p.join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        cmdline.contains("qemu-system") && cmdline.split('\0').any(|a| a == want)
    })
}

/// The `name:` field (KiB) of a `/proc` file of `Key: N kB` lines.
fn kib_field(text: &str, name: &str) -> Option<u64> {
    text.lines().find(|l| l.starts_with(name))?.split_whitespace().nth(1)?.parse().ok()
}

/// VmRSS (KiB) of the QEMU process of sandbox `id`.
fn qemu_rss_kib(id: &str) -> Option<u64> {
    kib_field(&std::fs::read_to_string(qemu_proc(id)?.join("status")).ok()?, "VmRSS:")
}

/// VmRSS and PSS (KiB) of the QEMU process of sandbox `id`.
fn qemu_memory_kib(id: &str) -> Option<(u64, u64)> {
    let p = qemu_proc(id)?;
    let rss = kib_field(&std::fs::read_to_string(p.join("status")).ok()?, "VmRSS:")?;
    let pss = kib_field(&std::fs::read_to_string(p.join("smaps_rollup")).ok()?, "Pss:")?;
    Some((rss, pss))
}

/// The newest strata-init the daemon pinned (`<state>/bin/strata-init-<hash>`).
fn pinned_init(state_dir: &Path) -> Result<PathBuf> {
    let dir = state_dir.join("bin");
    let mut found: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(&dir)
        .with_context(|| format!("read {}", dir.display()))?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("strata-init-"))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    found.sort();
    found.pop().map(|(_, p)| p).context("the daemon pinned no strata-init")
}

/// `echo hi` through the exec helper alone (what the daemon spawns), against VM `id`.
fn direct_echo(init: &Path, state_dir: &Path, id: &str) -> Result<Duration> {
    let vm = state_dir.join("run/microvm").join(id);
    let cfg = serde_json::json!({
        "root": null,
        "hostname": "bench",
        "lock": vm.join("exec.lock"),
        "broker": vm.join("control.sock"),
        "token": vm.join("token"),
        "job": { "type": "exec", "exec": { "argv": ["echo", "hi"], "env": {} } },
    });
    let t = Instant::now();
    let out = std::process::Command::new(init)
        .arg("_runsc_exec")
        .env_clear()
        .env(strata_init::runsc::CONFIG_ENV, cfg.to_string())
        .stdin(std::process::Stdio::null())
        .output()
        .context("run the exec helper")?;
    let el = t.elapsed();
    if out.stdout != b"hi\n" {
        bail!(
            "the exec helper printed {:?} ({})",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(el)
}

pub async fn run(b: &mut Bench) -> Result<()> {
    if let Some(why) = strata_runtime::microvm::probe().unavailable() {
        b.report.rows.push(Row::new("microvm tier", "-", "-", "-", "-", Verdict::Info));
        b.report.sections.push(("15. the microvm tier".into(), format!("not measured: {why}"), vec![]));
        return Ok(());
    }
    let cfg = b.cfg.clone();
    let c = b.client.clone();
    let accel = accelerator().to_uppercase();
    let mut details = Vec::new();

    // Boot: create -> first exec output, one warm-up, then BOOTS; the namespace tier's the same way.
    let mut boots = Vec::new();
    let mut ns_boots = Vec::new();
    for i in 0..=BOOTS {
        let t = Instant::now();
        let sb = c.create_sandbox(&microvm_req(&cfg.image, 512)).await.context("create a microVM")?;
        let created = t.elapsed();
        check_echo(&c.exec(&sb.id, &echo_req()).await.context("first exec in a microVM")?)?;
        let total = t.elapsed();
        c.remove_sandbox(&sb.id, true).await.context("remove the microVM")?;
        let t = Instant::now();
        let ns = c.create_sandbox(&super::create_req(&cfg.image)).await.context("create a namespace sandbox")?;
        check_echo(&c.exec(&ns.id, &echo_req()).await?)?;
        let ns_total = t.elapsed();
        c.remove_sandbox(&ns.id, true).await.context("remove")?;
        if i > 0 {
            boots.push(total);
            ns_boots.push(ns_total);
            details.push(format!("boot {i}: create {} + first exec {}", ms(created), ms(total - created)));
        }
    }
    let (bs, nss) = (summarize(&boots), summarize(&ns_boots));
    b.report.rows.push(Row::new(
        format!("microVM ({accel}): create -> first exec output, p50 of {BOOTS}"),
        ms(bs.p50),
        format!("{} (namespace tier, same cycle)", ms(nss.p50)),
        ratio(bs.p50.as_secs_f64(), nss.p50.as_secs_f64()),
        "(reported)",
        Verdict::Info,
    ));

    // Exec: through the API, and the helper alone.
    let sb = c.create_sandbox(&microvm_req(&cfg.image, 512)).await.context("create a microVM")?;
    let init = pinned_init(&cfg.state_dir)?;
    let (mut api, mut direct) = (Vec::new(), Vec::new());
    for _ in 0..EXECS {
        let t = Instant::now();
        check_echo(&c.exec(&sb.id, &echo_req()).await?)?;
        api.push(t.elapsed());
        let (init, state, id) = (init.clone(), cfg.state_dir.clone(), sb.id.clone());
        direct.push(tokio::task::spawn_blocking(move || direct_echo(&init, &state, &id)).await??);
    }
    let (a, d) = (summarize(&api), summarize(&direct));
    b.report.rows.push(Row::new(
        format!("microVM ({accel}): exec `echo hi`, p50 (API, n={EXECS})"),
        ms(a.p50),
        format!("{} (the exec helper alone, no daemon)", ms(d.p50)),
        ratio(a.p50.as_secs_f64(), d.p50.as_secs_f64()),
        "(reported)",
        Verdict::Info,
    ));
    let rss_idle = qemu_rss_kib(&sb.id).unwrap_or(0);

    // Standby and resume of a guest holding ~100 MiB.
    exec_ok(
        &c,
        &sb.id,
        strata_api::ExecRequest {
            cmd: vec!["sh".into(), "-c".into(), "head -c 100m /dev/urandom > /dev/shm/held && sync".into()],
            ..Default::default()
        },
    )
    .await?;
    let rss_held = qemu_rss_kib(&sb.id).unwrap_or(0);
    let t = Instant::now();
    c.standby_sandbox(&sb.id, false).await.context("standby of the microVM")?;
    let standby = t.elapsed();
    let image_bytes = c.get_sandbox(&sb.id).await?.standby.map(|s| s.image_bytes).unwrap_or(0);
    let t = Instant::now();
    let out = exec_ok(
        &c,
        &sb.id,
        strata_api::ExecRequest {
            cmd: vec!["sh".into(), "-c".into(), "wc -c < /dev/shm/held".into()],
            ..Default::default()
        },
    )
    .await
    .context("the first exec after standby (resume on access)")?;
    let resumed = t.elapsed();
    if out.trim() != (100u64 << 20).to_string() {
        bail!("the guest's memory came back with {out:?} bytes in /dev/shm/held");
    }
    b.report.rows.push(Row::new(
        format!("microVM ({accel}): standby of a guest holding ~100 MiB [snapshot]"),
        format!("{} [{:.1} MiB]", ms(standby), image_bytes as f64 / 1048576.0),
        format!("QEMU VmRSS before: {} (idle: {})", kib(rss_held as f64), kib(rss_idle as f64)),
        "-",
        "(reported)",
        Verdict::Info,
    ));
    b.report.rows.push(Row::new(
        format!("microVM ({accel}): resume -> first exec served (the 100 MiB intact)"),
        ms(resumed),
        format!("{} (its cold boot, above)", ms(bs.p50)),
        ratio(resumed.as_secs_f64(), bs.p50.as_secs_f64()),
        "(reported)",
        Verdict::Info,
    ));

    // A warm checkpoint of that guest, and 16 microVMs forked from it, all serving.
    let t = Instant::now();
    let ck = c
        .checkpoint(
            &sb.id,
            &CheckpointRequest { name: Some("bench-microvm".into()), processes: true, ..Default::default() },
        )
        .await
        .context("warm checkpoint of the microVM")?;
    let warm_took = t.elapsed();
    let warm_bytes = ck.processes.as_ref().map_or(0, |p| p.bytes);
    c.remove_sandbox(&sb.id, true).await.context("remove the microVM")?;
    let t = Instant::now();
    let forked = c
        .fork(&ForkRequest { source: ck.id.clone(), count: CHILDREN, ..Default::default() })
        .await
        .context("fork microVMs from the warm checkpoint")?;
    for id in &forked.sandboxes {
        let out = exec_ok(
            &c,
            id,
            strata_api::ExecRequest {
                cmd: vec!["stat".into(), "-c".into(), "%s".into(), "/dev/shm/held".into()],
                ..Default::default()
            },
        )
        .await
        .context("exec in a forked microVM")?;
        if out.trim() != (100u64 << 20).to_string() {
            bail!("a warm fork came up with {out:?} bytes in /dev/shm/held");
        }
    }
    let fork_time = t.elapsed();
    let mem: Vec<(u64, u64)> = forked.sandboxes.iter().filter_map(|id| qemu_memory_kib(id)).collect();
    let avg = |f: fn(&(u64, u64)) -> u64| mem.iter().map(f).sum::<u64>() as f64 / mem.len().max(1) as f64;
    let (rss_avg, pss_avg) = (avg(|m| m.0), avg(|m| m.1));
    for id in &forked.sandboxes {
        c.remove_sandbox(id, true).await.context("remove a forked microVM")?;
    }
    let _ = c.delete_checkpoint(&ck.id).await;
    b.report.rows.push(Row::new(
        format!("microVM ({accel}): warm checkpoint of the guest holding ~100 MiB [image]"),
        format!("{} [{:.1} MiB]", ms(warm_took), warm_bytes as f64 / 1048576.0),
        format!("{} (its standby, above)", ms(standby)),
        ratio(warm_took.as_secs_f64(), standby.as_secs_f64()),
        "(reported)",
        Verdict::Info,
    ));
    b.report.rows.push(Row::new(
        format!("microVM ({accel}): fork {CHILDREN} from the warm checkpoint, all serving [host PSS / RSS per child]"),
        format!("{} [{} / {}]", secs(fork_time), kib(pss_avg), kib(rss_avg)),
        format!("{} x {} (16 cold boots, one after another)", ms(bs.p50), CHILDREN),
        ratio(fork_time.as_secs_f64(), bs.p50.as_secs_f64() * CHILDREN as f64),
        "(reported)",
        Verdict::Info,
    ));
    details.push(format!(
        "fork: the API answered in {} ms; per child QEMU VmRSS {} and PSS {} (of {} children found; the guest's QEMU before: {})",
        forked.duration_ms,
        kib(rss_avg),
        kib(pss_avg),
        mem.len(),
        kib(rss_held as f64)
    ));
    b.report.sections.push((
        format!("15. the microvm tier ({accel})"),
        format!(
            "Guests of the busybox image under QEMU's microvm machine, accelerator {accel} (KVM only on hosts with hardware \
             virtualization; under TCG the figures are reported, not judged). **Boot**: create (512 MiB guest) -> the first \
             `echo hi` answered, one warm-up (which builds the chain's lower image) then {BOOTS}, each against the same cycle on \
             the namespace tier. **Exec**: `echo hi` through the API against the exec helper (`strata-init _runsc_exec`) run \
             directly against the same VM ({EXECS} each, interleaved). **Standby**: 100 MiB of random bytes in the guest's \
             /dev/shm (its RAM), then standby (QMP migrate to a file) and the first exec after it (resume on access), which \
             checks the bytes are all there. **Warm fork**: that VM's warm checkpoint (its processes frozen, QEMU's state \
             without the RAM, the RAM and the disk copied out, holes kept), then {CHILDREN} children forked from it (each \
             restored from the snapshot with the RAM file mapped private), timed until every child has answered with the \
             size of the 100 MiB file in its RAM (`stat`: reading it all under TCG takes seconds per child); per child QEMU's VmRSS (shared pages in full) and PSS (shared pages \
             divided among their mappers)."
        ),
        details,
    ));
    Ok(())
}
