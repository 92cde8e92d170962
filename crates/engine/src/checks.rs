//! Checks at set times: a sandbox whose policy has `check_every` (or a
//! persistent one, when the daemon has `--check-every`) gets the state-hygiene
//! scan of everything its layers add above its image, on that interval, in
//! any state but `archived` (a sandbox in standby or stopped is checked from
//! its filesystem on the host: it is not resumed). Each check is a `checked`
//! event with its findings; its policy's `on_findings` decides what follows
//! (`record`, `quarantine`, `flush`, `stop`). `POST /v1/sandboxes/{id}/check`
//! runs one now.
//!
//! Templates have `check_every` and `on_findings` too ([`check_template`]):
//! their checkpoint is scanned again under the daemon's current rules, and a
//! newer version of their image is a finding (`image.outdated`).
//!
//! Checks run one at a time, on a thread of their own at the lowest CPU and
//! I/O priority (the idle scheduling and I/O classes), and scheduled ones
//! paced ([`BACKGROUND_DUTY`]): a check of a large writable layer must not
//! slow the sandboxes that are working.
//!
//! Quarantine ([`place`], [`lift`], [`list`]; its rules: [`crate::quarantine`]):
//! anyone who may see a sandbox or checkpoint may place one (a check's
//! `on_findings: quarantine` does too); lifting it is the operator's, with a
//! reason, recorded in the events and the audit log. Placing one on a sandbox
//! with egress cuts its network to `none` and keeps the old spec with the
//! quarantine; lifting puts it back (or says why it could not).

use std::time::{Duration, SystemTime};

use strata_api::{
    CheckReport, ErrorCode, Finding, NetworkMode, NetworkSpec, OnFindings, Quarantine, QuarantineEntry, SandboxState,
    Severity, TemplateCheckReport,
};
use strata_store::db::SandboxRecord;
use tracing::{info, warn};

use crate::clock::parse_time;
use crate::error::{EngineError, EngineResult};
use crate::record::now;
use crate::state::Shared;
use crate::tenancy::{find_sandbox_or_checkpoint, NamesFirst, SandboxOrCheckpoint};

/// Longest quarantine reason kept.
const MAX_REASON: usize = 1000;

/// How often the loop looks for checks that fell due.
const TICK: Duration = Duration::from_secs(20);

/// The event every check records.
pub const CHECKED: &str = "checked";

/// Findings named in an event's detail (the rest are counted).
const NAMED: usize = 5;

/// The interval at which `sb` is checked: its policy's, else the daemon's
/// default for persistent sandboxes; `None`: never.
pub fn interval(st: &Shared, rec: &SandboxRecord) -> Option<Duration> {
    if rec.sandbox.tenant == strata_store::db::POOL_TENANT {
        // A warm-pool sandbox has run nothing yet; it is checked once adopted.
        return None;
    }
    match rec.sandbox.policy.check_every.as_deref() {
        Some(v) => strata_core::units::parse_duration(v).ok(),
        None if rec.sandbox.lifecycle == strata_api::Lifecycle::Persistent => st.default_check_every,
        None => None,
    }
}

/// When a check falls due: `every` after the last one, or after the
/// sandbox's creation when it never had one.
pub fn due_at(every: Duration, last: Option<SystemTime>, created: SystemTime) -> SystemTime {
    last.unwrap_or(created) + every
}

/// Share of the time a scheduled check works (it sleeps the rest; see
/// [`strata_image::pace`]): measured on a 2-CPU host, even a `SCHED_IDLE`
/// thread working flat out slows an `exec` into a busy sandbox by ~1.4x,
/// and at a fifth of the time the slowdown is within the 1.1x the checks
/// are held to (docs/benchmarks.md). A requested check runs at full speed:
/// someone is waiting for it.
pub const BACKGROUND_DUTY: f64 = 0.2;

/// How hard a check works.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Pace {
    /// At [`BACKGROUND_DUTY`] (scheduled checks).
    Background,
    /// Flat out, still at the lowest priority (requested checks).
    Full,
}

impl Pace {
    fn of(trigger: &str) -> Pace {
        if trigger == "scheduled" {
            Pace::Background
        } else {
            Pace::Full
        }
    }

    fn duty(self) -> f64 {
        match self {
            Pace::Background => BACKGROUND_DUTY,
            Pace::Full => 1.0,
        }
    }
}

/// Lowers the calling thread to the lowest CPU and I/O priority: the idle
/// scheduling class (any other runnable thread preempts it at once, which a
/// nice value does not guarantee) and the idle I/O class.
fn lower_priority() {
    // SAFETY: gettid has no arguments; sched_setscheduler(0, ..) acts on the calling
    // thread and reads the param struct we pass; setpriority and ioprio_set take
    // integers and act on this thread only (a tid names one thread for `PRIO_PROCESS`).
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        let param = libc::sched_param { sched_priority: 0 };
        if libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) != 0 {
            libc::setpriority(libc::PRIO_PROCESS, tid, 19);
        }
        const IOPRIO_WHO_PROCESS: libc::c_long = 1;
        const IOPRIO_CLASS_IDLE: libc::c_long = 3;
        libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, tid as libc::c_long, IOPRIO_CLASS_IDLE << 13);
    }
}

/// Runs `work` on a thread of its own at the lowest CPU and I/O priority, at `pace`.
async fn on_check_thread<T: Send + 'static>(
    pace: Pace,
    work: impl FnOnce() -> EngineResult<T> + Send + 'static,
) -> EngineResult<T> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("strata-check".into())
        .spawn(move || {
            lower_priority();
            let _ = tx.send(strata_image::pace::paced(pace.duty(), work));
        })
        .map_err(|e| EngineError::internal("start the check thread", &e))?;
    rx.await.map_err(|e| EngineError::internal("check thread", &e))?
}

/// One line about the findings, for events and the quarantine's reason.
fn summary(r: &CheckReport) -> String {
    findings_line(&r.findings, r.changed_paths)
}

fn findings_line(findings: &[strata_api::Finding], changed_paths: u64) -> String {
    if findings.is_empty() {
        return format!("clean ({changed_paths} changed paths)");
    }
    let named: Vec<String> = findings.iter().take(NAMED).map(|f| format!("{} {}", f.rule, f.path)).collect();
    let more = findings.len().saturating_sub(NAMED);
    format!(
        "{} finding(s): {}{}",
        findings.len(),
        named.join(", "),
        if more > 0 { format!(" and {more} more") } else { String::new() }
    )
}

/// Checks the sandbox `id` now (`trigger`: `scheduled` or `requested`),
/// applies its `on_findings` and records the `checked` event.
pub async fn check(st: &Shared, id: &str, trigger: &str) -> EngineResult<CheckReport> {
    let started = std::time::Instant::now();
    let rec = st.db.sandbox_by_id(id)?.ok_or_else(|| EngineError::sandbox_not_found(id))?;
    if !crate::accumulation::layer_on_host(rec.sandbox.state) {
        return Err(EngineError::invalid_state(
            rec.sandbox.state,
            format!(
                "sandbox {} is {}: its filesystem is not on this host to check{}",
                rec.sandbox.name,
                rec.sandbox.state,
                if rec.sandbox.state == SandboxState::Archived { " (unarchive it first)" } else { "" }
            ),
        ));
    }
    let target = crate::scan::target(st, &rec.sandbox.id).await?;
    let (st2, rec2) = (st.clone(), rec.clone());
    // One walk of the writable layer serves the scan and the measure.
    let (scan, accumulation) = on_check_thread(Pace::of(trigger), move || {
        crate::scan::run_walked(target)
            .and_then(|(scan, walked)| Ok((scan, crate::accumulation::measure_walked(&st2, &rec2, walked)?)))
    })
    .await?;
    let mut findings = scan.findings;
    findings.extend(crate::accumulation::over_limits(&accumulation, &rec.sandbox.policy, SystemTime::now()));
    let mut report = CheckReport {
        sandbox_id: rec.sandbox.id.clone(),
        time: now(),
        trigger: trigger.to_string(),
        state: rec.sandbox.state,
        changed_paths: scan.changed_paths,
        findings,
        accumulation,
        action: "none".into(),
        duration_ms: 0,
    };
    if !report.findings.is_empty() {
        report.action = act(st, &rec, &report).await;
    }
    report.duration_ms = started.elapsed().as_millis() as u64;
    let detail = format!("{trigger}: {}; {} ({} ms)", summary(&report), report.action, report.duration_ms);
    match st.db.record_event(&rec.sandbox.id, current_state(st, &rec), CHECKED, Some(&detail), &report.time) {
        Ok(ev) => st.notify_events(ev.seq),
        Err(e) => warn!(sandbox = %rec.sandbox.id, error = %crate::error::chain(&e), "recording a check"),
    }
    info!(sandbox = %rec.sandbox.id, trigger, findings = report.findings.len(), action = %report.action, ms = report.duration_ms, "checked");
    Ok(report)
}

fn current_state(st: &Shared, rec: &SandboxRecord) -> SandboxState {
    st.db.sandbox_by_id(&rec.sandbox.id).ok().flatten().map_or(rec.sandbox.state, |r| r.sandbox.state)
}

/// Applies the sandbox's `on_findings`; says what it did.
async fn act(st: &Shared, rec: &SandboxRecord, report: &CheckReport) -> String {
    let policy = rec.sandbox.policy.on_findings;
    let outcome = match policy {
        OnFindings::Record => Ok("recorded".to_string()),
        OnFindings::Quarantine => {
            let reason = format!("a check found {}", summary(report));
            place(st, &rec.sandbox.id, &reason, "check").await.map(|_| "quarantined".to_string())
        }
        OnFindings::Flush if rec.sandbox.policy.flush.is_empty() => {
            Ok("nothing to flush (the policy has no flush rules); recorded".to_string())
        }
        OnFindings::Flush => {
            crate::scan::flush(st, rec).await.map(|_| "flush rules applied (see the flush event)".into())
        }
        OnFindings::Stop if matches!(rec.sandbox.state, SandboxState::Running | SandboxState::Paused) => {
            crate::lifecycle::stop(st, &rec.sandbox.id, "check_findings", crate::lifecycle::STOP_GRACE)
                .await
                .map(|_| "stopped".to_string())
        }
        OnFindings::Stop => Ok(format!("already {}: recorded", rec.sandbox.state)),
    };
    match outcome {
        Ok(what) => format!("on_findings {policy}: {what}"),
        Err(e) => format!("on_findings {policy} failed: {}", e.body.message),
    }
}

/// Runs forever: checks every sandbox whose check fell due, one at a time.
pub async fn run(st: Shared) {
    loop {
        tokio::time::sleep(TICK).await;
        let list = match st.db.list_sandboxes() {
            Ok(l) => l,
            Err(e) => {
                warn!(error = %crate::error::chain(&e), "listing sandboxes for checks");
                continue;
            }
        };
        for rec in list {
            let Some(every) = interval(&st, &rec) else { continue };
            if !crate::accumulation::layer_on_host(rec.sandbox.state) {
                continue;
            }
            let last = match st.db.last_event_time(&rec.sandbox.id, CHECKED) {
                Ok(t) => t.as_deref().and_then(parse_time),
                Err(e) => {
                    warn!(sandbox = %rec.sandbox.id, error = %crate::error::chain(&e), "reading the last check");
                    continue;
                }
            };
            let created = parse_time(&rec.sandbox.created_at).unwrap_or(SystemTime::UNIX_EPOCH);
            if SystemTime::now() < due_at(every, last, created) {
                continue;
            }
            if let Err(e) = check(&st, &rec.sandbox.id, "scheduled").await {
                // Recorded as a check, so that a sandbox that cannot be checked is not retried every tick.
                let detail = format!("scheduled: failed: {}", e.body.message);
                if let Ok(ev) =
                    st.db.record_event(&rec.sandbox.id, current_state(&st, &rec), CHECKED, Some(&detail), &now())
                {
                    st.notify_events(ev.seq);
                }
                warn!(sandbox = %rec.sandbox.id, error = %e.body.message, "scheduled check failed");
            }
        }
        check_due_templates(&st).await;
    }
}

// ---- templates ----

/// The rule of the finding a check of a template on an old image version gives.
pub const IMAGE_OUTDATED: &str = "image.outdated";

/// Checks the template `name` now (`trigger`: `scheduled` or `requested`):
/// its checkpoint is scanned under today's rules, and its image version is
/// compared with its name's newest (an `image.outdated` finding when there
/// is a newer one, saying how to move it). With findings, its `on_findings:
/// quarantine` quarantines the checkpoint (no new sandbox starts from it).
/// The report is kept as the template's `last_check`.
pub async fn check_template(st: &Shared, name: &str, trigger: &str) -> EngineResult<TemplateCheckReport> {
    let started = std::time::Instant::now();
    let (checkpoint, _) = crate::tenancy::find_template(st, name)?.ok_or_else(|| crate::templates::not_found(name))?;
    let (c, _) = st.db.checkpoint_by_id(&checkpoint)?.ok_or_else(|| {
        EngineError::new(ErrorCode::Internal, format!("template {name} points at a missing checkpoint {checkpoint}"))
    })?;
    let checks = crate::templates::checks(st, name)?.ok_or_else(|| crate::templates::not_found(name))?;
    let target = crate::scan::target(st, &checkpoint).await?;
    let scan = on_check_thread(Pace::of(trigger), move || crate::scan::run(target)).await?;
    let mut findings = scan.findings;
    let image = crate::patching::base_image(st, &c.image_id, &c.layers)?;
    let behind = crate::patching::behind(st, &c.image_id)?;
    if let Some((v, n)) = &behind {
        let how = crate::patching::template_how(st, name, &n.name)?;
        findings.push(Finding {
            path: "/".into(),
            rule: IMAGE_OUTDATED.into(),
            severity: Severity::Medium,
            reason: format!(
                "built on {}@{}; version {} was imported {} day(s) later: {how}",
                v.name,
                v.version,
                n.version,
                crate::patching::days_between(v, n)
            ),
        });
    }
    let mut report = TemplateCheckReport {
        template: name.to_string(),
        checkpoint: checkpoint.clone(),
        time: now(),
        trigger: trigger.to_string(),
        changed_paths: scan.changed_paths,
        findings,
        image: image.map(|i| format!("{}@{}", i.name, i.version)),
        newer_image: behind.map(|(_, n)| format!("{}@{}", n.name, n.version)),
        action: "none".into(),
        duration_ms: 0,
    };
    if !report.findings.is_empty() {
        report.action = match checks.on_findings {
            OnFindings::Quarantine => {
                let reason = format!(
                    "a check of template {name} found {}",
                    findings_line(&report.findings, report.changed_paths)
                );
                match place(st, &checkpoint, &reason, "check").await {
                    Ok(_) => "on_findings quarantine: its checkpoint quarantined".into(),
                    Err(e) => format!("on_findings quarantine failed: {}", e.body.message),
                }
            }
            _ => "on_findings record: recorded".into(),
        };
    }
    report.duration_ms = started.elapsed().as_millis() as u64;
    let json = serde_json::to_string(&report).expect("a check report serializes");
    if !st.db.set_template_last_check(name, &checkpoint, &json)? {
        info!(template = name, "template re-pointed during its check: report not kept");
    }
    info!(template = name, trigger, findings = report.findings.len(), action = %report.action, ms = report.duration_ms, "checked template");
    Ok(report)
}

/// Checks every template whose `check_every` fell due (after its last check, or its creation).
async fn check_due_templates(st: &Shared) {
    let list = match st.db.list_templates() {
        Ok(l) => l,
        Err(e) => return warn!(error = %crate::error::chain(&e), "listing templates for checks"),
    };
    for (name, checkpoint, created_at) in list {
        let Ok(Some(checks)) = crate::templates::checks(st, &name) else { continue };
        let Some(every) = checks.check_every.as_deref().and_then(|v| strata_core::units::parse_duration(v).ok()) else {
            continue;
        };
        let created = parse_time(&created_at).unwrap_or(SystemTime::UNIX_EPOCH);
        if SystemTime::now() < due_at(every, checks.last_check.and_then(|l| parse_time(&l.time)), created) {
            continue;
        }
        if let Err(e) = check_template(st, &name, "scheduled").await {
            // Kept as its last check, so that a template that cannot be checked is not retried every tick.
            let failed = TemplateCheckReport {
                template: name.clone(),
                checkpoint: checkpoint.clone(),
                time: now(),
                trigger: "scheduled".into(),
                changed_paths: 0,
                findings: vec![],
                image: None,
                newer_image: None,
                action: format!("failed: {}", e.body.message),
                duration_ms: 0,
            };
            let json = serde_json::to_string(&failed).expect("a check report serializes");
            let _ = st.db.set_template_last_check(&name, &checkpoint, &json);
            warn!(template = %name, error = %e.body.message, "scheduled template check failed");
        }
    }
}

// ---- quarantine ----

fn checked_reason(reason: &str) -> EngineResult<String> {
    let r = reason.trim();
    if r.is_empty() {
        return Err(EngineError::bad_request("a reason is required"));
    }
    if r.len() > MAX_REASON {
        return Err(EngineError::bad_request(format!("the reason is longer than {MAX_REASON} bytes")));
    }
    Ok(r.to_string())
}

fn find(st: &Shared, key: &str) -> EngineResult<SandboxOrCheckpoint> {
    find_sandbox_or_checkpoint(st, key, NamesFirst::Sandbox)?
        .ok_or_else(|| EngineError::new(ErrorCode::SandboxNotFound, format!("no sandbox or checkpoint named {key:?}")))
}

/// Records an event about a sandbox (for a checkpoint: on the sandbox it was taken from).
fn event(st: &Shared, sandbox_id: &str, reason: &str, detail: &str) {
    let state = st.db.sandbox_by_id(sandbox_id).ok().flatten().map_or(SandboxState::Destroyed, |r| r.sandbox.state);
    match st.db.record_event(sandbox_id, state, reason, Some(detail), &now()) {
        Ok(ev) => st.notify_events(ev.seq),
        Err(e) => warn!(sandbox = sandbox_id, error = %crate::error::chain(&e), "recording a quarantine event"),
    }
}

fn entry(found: &SandboxOrCheckpoint, q: Quarantine) -> QuarantineEntry {
    match found {
        SandboxOrCheckpoint::Sandbox(r) => QuarantineEntry {
            kind: "sandbox".into(),
            id: r.sandbox.id.clone(),
            name: r.sandbox.name.clone(),
            tenant: r.sandbox.tenant.clone(),
            quarantine: q,
        },
        SandboxOrCheckpoint::Checkpoint(c) => QuarantineEntry {
            kind: "checkpoint".into(),
            id: c.0.id.clone(),
            name: c.0.name.clone(),
            tenant: c.0.tenant.clone(),
            quarantine: q,
        },
    }
}

/// Quarantines the sandbox or checkpoint `key` (`by`: who). A sandbox with
/// egress loses it (kept in the quarantine for the lift). Placing it again
/// keeps the first one's time and network and takes the new reason.
pub async fn place(st: &Shared, key: &str, reason: &str, by: &str) -> EngineResult<QuarantineEntry> {
    let reason = checked_reason(reason)?;
    let found = find(st, key)?;
    match &found {
        SandboxOrCheckpoint::Sandbox(r) => {
            let id = r.sandbox.id.clone();
            let (q, cut) = {
                let (_g, rec) = crate::record::lock_and_load(st, &id).await?;
                let spec = st.network.spec_of(&id);
                let prior = rec.sandbox.quarantine.clone();
                let network_before = match &prior {
                    Some(p) => p.network_before.clone(),
                    None => (spec.mode == NetworkMode::Egress).then_some(spec.clone()),
                };
                let q = Quarantine {
                    reason: reason.clone(),
                    since: prior.map_or_else(now, |p| p.since),
                    by: by.to_string(),
                    network_before,
                };
                st.db.set_quarantine(false, &id, Some(&q))?;
                (q, spec.mode == NetworkMode::Egress)
            };
            event(st, &id, "quarantined", &format!("by {by}: {reason}"));
            if cut {
                // The flag is set: nothing can give it egress back meanwhile.
                if let Err(e) = crate::network::update(st, &id, NetworkSpec::default()).await {
                    warn!(sandbox = %id, error = %e.body.message, "cutting the egress of a quarantined sandbox");
                    event(st, &id, "quarantine_network_failed", &e.body.message);
                }
            }
            info!(sandbox = %id, by, "quarantined");
            Ok(entry(&found, q))
        }
        SandboxOrCheckpoint::Checkpoint(c) => {
            let c = &c.0;
            let q = Quarantine {
                reason: reason.clone(),
                since: c.quarantine.as_ref().map_or_else(now, |p| p.since.clone()),
                by: by.to_string(),
                network_before: None,
            };
            if !st.db.set_quarantine(true, &c.id, Some(&q))? {
                return Err(EngineError::new(ErrorCode::CheckpointNotFound, format!("checkpoint {key:?} is gone")));
            }
            event(st, &c.sandbox_id, "checkpoint_quarantined", &format!("checkpoint {} by {by}: {reason}", c.name));
            info!(checkpoint = %c.id, by, "quarantined");
            Ok(entry(&found, q))
        }
    }
}

/// Lifts the quarantine of `key` (the operator's call; `by`: who). A sandbox
/// gets back the egress it had; when that fails (e.g. a running gVisor
/// sandbox, whose network cannot be switched on while it runs) the lift
/// stands and the event says what to do.
pub async fn lift(st: &Shared, key: &str, reason: &str, by: &str) -> EngineResult<QuarantineEntry> {
    let reason = checked_reason(reason)?;
    let found = find(st, key)?;
    let current = match &found {
        SandboxOrCheckpoint::Sandbox(r) => r.sandbox.quarantine.clone(),
        SandboxOrCheckpoint::Checkpoint(c) => c.0.quarantine.clone(),
    };
    let Some(q) = current else {
        let msg = format!("{key} is not quarantined");
        return Err(match &found {
            SandboxOrCheckpoint::Sandbox(r) => EngineError::invalid_state(r.sandbox.state, msg),
            SandboxOrCheckpoint::Checkpoint(_) => EngineError::new(ErrorCode::InvalidState, msg),
        });
    };
    match &found {
        SandboxOrCheckpoint::Sandbox(r) => {
            let id = r.sandbox.id.clone();
            {
                let _g = crate::record::lock_and_load(st, &id).await?;
                st.db.set_quarantine(false, &id, None)?;
            }
            let mut detail = format!("by {by}: {reason}");
            if let Some(spec) = q.network_before.clone() {
                match crate::network::update(st, &id, spec).await {
                    Ok(_) => detail.push_str("; egress restored"),
                    Err(e) => detail.push_str(&format!(
                        "; its egress could not be restored ({}): set it with `strata network set`",
                        e.body.message
                    )),
                }
            }
            event(st, &id, "quarantine_lifted", &detail);
            info!(sandbox = %id, by, "quarantine lifted");
        }
        SandboxOrCheckpoint::Checkpoint(c) => {
            let c = &c.0;
            st.db.set_quarantine(true, &c.id, None)?;
            event(
                st,
                &c.sandbox_id,
                "checkpoint_quarantine_lifted",
                &format!("checkpoint {} by {by}: {reason}", c.name),
            );
            info!(checkpoint = %c.id, by, "quarantine lifted");
        }
    }
    Ok(entry(&found, q))
}

/// Every quarantined sandbox and checkpoint the caller may see.
pub fn list(st: &Shared) -> EngineResult<Vec<QuarantineEntry>> {
    Ok(st.db.quarantined()?.into_iter().filter(|e| crate::caller::visible(&e.tenant)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_api::{Finding, Severity};

    #[test]
    fn reasons_are_required_and_bounded() {
        assert!(checked_reason("  ").is_err());
        assert!(checked_reason(&"x".repeat(MAX_REASON + 1)).is_err());
        assert_eq!(checked_reason(" ok ").unwrap(), "ok");
    }

    #[test]
    fn a_check_falls_due_an_interval_after_the_last_or_the_creation() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let h = Duration::from_secs(3600);
        assert_eq!(due_at(h, None, t0), t0 + h);
        assert_eq!(due_at(h, Some(t0 + h * 3), t0), t0 + h * 4);
    }

    #[test]
    fn archived_and_vanishing_sandboxes_are_not_checked() {
        use crate::accumulation::layer_on_host;
        for s in [SandboxState::Running, SandboxState::Standby, SandboxState::Stopped, SandboxState::Paused] {
            assert!(layer_on_host(s), "{s}");
        }
        for s in [SandboxState::Archived, SandboxState::Creating, SandboxState::Destroyed] {
            assert!(!layer_on_host(s), "{s}");
        }
    }

    #[test]
    fn summaries_name_the_first_findings_and_count_the_rest() {
        let f = |i: usize| Finding {
            path: format!("/p{i}"),
            rule: "credential.private_key".into(),
            severity: Severity::Critical,
            reason: "key".into(),
        };
        let mut r = CheckReport {
            sandbox_id: "s".into(),
            time: "t".into(),
            trigger: "requested".into(),
            state: SandboxState::Running,
            changed_paths: 9,
            findings: vec![],
            accumulation: strata_api::Accumulation {
                writable_bytes: 0,
                writable_files: 0,
                growth_per_day_bytes: 0,
                since_checkpoint_bytes: 0,
                since_checkpoint_paths: 0,
                checkpoint_since: "t".into(),
                checkpoints: 0,
                checkpoint_bytes: 0,
                base: "image busybox".into(),
                base_created_at: "t".into(),
                base_age_days: 0,
                age_days: 0,
                over: vec![],
                ..Default::default()
            },
            action: "none".into(),
            duration_ms: 1,
        };
        assert_eq!(summary(&r), "clean (9 changed paths)");
        r.findings = (0..7).map(f).collect();
        let s = summary(&r);
        assert!(s.starts_with("7 finding(s): credential.private_key /p0"), "{s}");
        assert!(s.ends_with("and 2 more") && !s.contains("/p5"), "{s}");
    }
}
