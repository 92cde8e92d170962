//! Pipelines (`/v1/pipelines`): a list of stages, each creating (or resuming) a
//! sandbox from its source, running its commands, and ending by its lifecycle
//! (destroy, checkpoint, checkpoint per command, fan-out and select, standby).
//!
//! The spec is validated completely before anything runs ([`validate`], pure).
//! A run is driven by one task; every stage transition is written to the
//! metadata database in one transaction (run row + stage records), so a run
//! survives a daemon restart: at start, runs still marked `running` become
//! `interrupted` ([`reconcile`]) and `resume` continues from the first stage
//! that has not succeeded (a finished stage's output is its checkpoint, or its
//! standby sandbox). Sandboxes left by an unfinished attempt of a stage are
//! destroyed before the stage runs again.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use strata_api::{
    CheckpointRequest, CreateSandboxRequest, CreateTemplateRequest, ErrorCode, ExecRequest, FanoutRequest, Lifecycle,
    PipelineCost, PipelineEvent, PipelineRun, PipelineSpec, PipelineState, ProcessStatus, RunPipelineRequest,
    StageCost, StageKeep, StageLifecycle, StageResult, StageSpec, StageState, StandbyRequest,
};
use strata_core::lifecycle::pipeline::{next_run_state, RunAction};
use strata_core::{ids, units};
use tracing::{info, warn};

use crate::error::{EngineError, EngineResult};
use crate::record::now;
use crate::secrets::{secret_key, secret_keys};
use crate::state::Shared;

/// Most stages in one pipeline.
pub const MAX_STAGES: usize = 64;

/// A spec that cannot run; the message names the stage and field.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SpecError {
    /// The TOML or JSON does not fit the schema (unknown field, unknown lifecycle, wrong type); TOML errors carry the line.
    #[error("pipeline spec: {0}")]
    Parse(String),
    /// A whole-spec problem (no stages, too many).
    #[error("pipeline spec: {0}")]
    Spec(String),
    /// A problem with one stage's field.
    #[error("pipeline spec: stage {stage:?}: {field}: {message}")]
    Stage {
        /// Stage name (or `#<n>` when it has no usable name).
        stage: String,
        /// Offending field.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
}

impl From<SpecError> for EngineError {
    fn from(e: SpecError) -> Self {
        EngineError::bad_request(e.to_string())
    }
}

/// Where a stage starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceRef {
    /// An image by name.
    Image(String),
    /// A template by name.
    Template(String),
    /// An earlier stage's output.
    Stage(String),
}

/// Parses `image:NAME`, `template:NAME` or `stage:NAME`.
pub fn parse_source(s: &str) -> Result<SourceRef, String> {
    let (kind, name) =
        s.split_once(':').ok_or_else(|| format!("{s:?} must be image:NAME, template:NAME or stage:NAME"))?;
    if name.is_empty() {
        return Err(format!("{s:?} has no name after {kind:?}"));
    }
    match kind {
        "image" => Ok(SourceRef::Image(name.into())),
        "template" => Ok(SourceRef::Template(name.into())),
        "stage" => Ok(SourceRef::Stage(name.into())),
        _ => Err(format!("unknown source kind {kind:?} (image, template or stage)")),
    }
}

/// What a lifecycle keeps for the next stage.
pub fn kept_by(l: StageLifecycle) -> StageKeep {
    match l {
        StageLifecycle::Ephemeral => StageKeep::Nothing,
        StageLifecycle::Persistent | StageLifecycle::PersistentWithCheckpoints | StageLifecycle::Fork => {
            StageKeep::Filesystem
        }
        StageLifecycle::Standby => StageKeep::Processes,
    }
}

/// Parses a request body's spec (TOML text or JSON).
pub fn parse_request(req: RunPipelineRequest) -> Result<PipelineSpec, SpecError> {
    match (req.toml, req.spec) {
        (Some(t), None) => {
            toml::from_str::<PipelineSpec>(&t).map_err(|e| SpecError::Parse(e.to_string().trim().replace('\n', " | ")))
        }
        (None, Some(s)) => Ok(s),
        _ => Err(SpecError::Spec("give exactly one of `toml` (the spec as TOML text) and `spec` (as JSON)".into())),
    }
}

/// Checks a spec completely, before anything runs: names, sources (no forward
/// references, cycles or sources that keep nothing), lifecycle/keep/fanout
/// combinations, flush paths and durations.
pub fn validate(spec: &PipelineSpec) -> Result<(), SpecError> {
    if spec.stages.is_empty() {
        return Err(SpecError::Spec("no stages ([[stage]] tables)".into()));
    }
    if spec.stages.len() > MAX_STAGES {
        return Err(SpecError::Spec(format!("{} stages, at most {MAX_STAGES}", spec.stages.len())));
    }
    if let Some(n) = &spec.name {
        ids::validate_new_name(n, false).map_err(|e| SpecError::Spec(format!("name: {e}")))?;
    }
    for (i, st) in spec.stages.iter().enumerate() {
        let err = |field: &'static str, message: String| SpecError::Stage {
            stage: if st.name.is_empty() { format!("#{}", i + 1) } else { st.name.clone() },
            field,
            message,
        };
        ids::validate_name(&st.name, false).map_err(|e| err("name", e.to_string()))?;
        if spec.stages[..i].iter().any(|o| o.name == st.name) {
            return Err(err("name", "another stage has this name".into()));
        }
        let source = parse_source(&st.source).map_err(|m| err("source", m))?;
        if let SourceRef::Stage(from) = &source {
            if *from == st.name {
                return Err(err("source", "a stage cannot start from itself (cycle)".into()));
            }
            match spec.stages.iter().position(|o| &o.name == from) {
                None => return Err(err("source", format!("no stage named {from:?}"))),
                Some(j) if j > i => {
                    return Err(err(
                        "source",
                        format!("stage {from:?} comes later (forward reference or cycle): stages run in order"),
                    ))
                }
                Some(j) => {
                    if kept_by(spec.stages[j].lifecycle) == StageKeep::Nothing {
                        return Err(err(
                            "source",
                            format!("stage {from:?} is ephemeral and keeps nothing to start from"),
                        ));
                    }
                }
            }
        }
        if let Some(k) = st.keep {
            let can = kept_by(st.lifecycle);
            if k != can {
                return Err(err(
                    "keep",
                    format!("lifecycle {} keeps {:?}, not {:?}", st.lifecycle.as_str(), can, k).to_lowercase(),
                ));
            }
        }
        match (st.lifecycle, &st.fanout) {
            (StageLifecycle::Fork, None) => {
                return Err(err("fanout", "lifecycle fork needs a [stage.fanout] table".into()))
            }
            (StageLifecycle::Fork, Some(plan)) => {
                crate::fanout::expand(plan).map_err(|m| err("fanout", m))?;
                if !st.commands.is_empty() {
                    return Err(err("commands", "a fork stage runs its fanout attempts, not commands".into()));
                }
                for (field, set) in [
                    ("user", st.user.is_some()),
                    ("workdir", st.workdir.is_some()),
                    ("secrets", !st.secrets.is_empty()),
                    ("network", st.network.is_some()),
                    ("capabilities", !st.capabilities.is_empty()),
                    ("isolation", st.isolation.is_some()),
                ] {
                    if set {
                        let why = match field {
                            "secrets" => "a fork stage's children are forked from its source, not created: they have no secrets of their own".to_string(),
                            "network" => "a fork stage's children inherit their source's network".to_string(),
                            "capabilities" => "a fork stage's children inherit their source checkpoint's capabilities".to_string(),
                            "isolation" => "a fork stage's children run on their source checkpoint's tier".to_string(),
                            _ => format!("a fork stage sets {field} in its [stage.fanout] table"),
                        };
                        return Err(err(field, why));
                    }
                }
                if matches!(source, SourceRef::Image(_)) {
                    return Err(err(
                        "source",
                        "a fork stage forks a checkpoint: use template:NAME or stage:NAME".into(),
                    ));
                }
            }
            (_, Some(_)) => {
                return Err(err(
                    "fanout",
                    format!("only lifecycle fork fans out (this stage is {})", st.lifecycle.as_str()),
                ))
            }
            (_, None) => {}
        }
        crate::scan::validate_flush(&st.flush).map_err(|e| err("flush", e.body.message))?;
        if let Some(n) = &st.network {
            crate::network::validate(n).map_err(|e| err("network", e.to_string()))?;
        }
        if let Some(t) = &st.template {
            if kept_by(st.lifecycle) != StageKeep::Filesystem {
                return Err(err(
                    "template",
                    format!("lifecycle {} has no output checkpoint to promote", st.lifecycle.as_str()),
                ));
            }
            ids::validate_new_name(t, true).map_err(|e| err("template", e.to_string()))?;
            if spec.stages[..i].iter().any(|o| o.template.as_deref() == Some(t.as_str())) {
                return Err(err("template", format!("another stage promotes to template {t:?}")));
            }
        } else if st.accept_findings {
            return Err(err("accept_findings", "only meaningful with template".into()));
        }
        for (field, d) in [("ttl", &st.ttl), ("timeout", &st.timeout)] {
            if let Some(d) = d {
                units::parse_duration(d).map_err(|e| err(field, e.to_string()))?;
            }
        }
        // Refused before the run starts, not when the stage's sandboxes are made
        // (e.g. a `check_every` below the minimum).
        if let Some(p) = &st.policy {
            crate::policy_spec::validate(p).map_err(|e| err("policy", e.body.message))?;
        }
        for k in spec.env.keys().chain(st.env.keys()) {
            if k.is_empty() || k.contains('=') || k.contains('\0') {
                return Err(err("env", format!("invalid variable name {k:?}")));
            }
        }
    }
    Ok(())
}

/// Asks a running run to stop at its next stage boundary (the current stage finishes first).
pub fn pause(st: &Shared, id: &str) -> EngineResult<PipelineRun> {
    let run = crate::tenancy::find_pipeline_run(st, id)?.ok_or_else(|| not_found(id))?;
    if run.state != PipelineState::Running || !st.pipelines.is_active(&run.id) {
        return Err(EngineError::new(
            ErrorCode::InvalidState,
            format!("pipeline run {} is {}, not running", run.id, run.state.as_str()),
        ));
    }
    st.pipelines.ask_pause(&run.id);
    info!(run = %run.id, "pipeline run pausing at the next stage boundary");
    Ok(run)
}

/// A run's progress for a follower: the stages that have started (from the
/// store), then every change the driver publishes on `rx` (subscribed by the
/// caller before the run could move), then `finished`. The channel closes
/// when the run ends or the follower goes away.
pub fn progress(
    st: &Shared,
    run_id: String,
    mut rx: tokio::sync::broadcast::Receiver<PipelineEvent>,
) -> tokio::sync::mpsc::Receiver<PipelineEvent> {
    use tokio::sync::broadcast::error::RecvError;
    let (tx, out) = tokio::sync::mpsc::channel::<PipelineEvent>(32);
    let st = st.clone();
    tokio::spawn(async move {
        let Ok(Some(run)) = st.db.pipeline_run_by_id(&run_id) else { return };
        for (i, s) in run.stages.iter().enumerate().filter(|(_, s)| s.state != StageState::Pending) {
            let ev = PipelineEvent::Stage { run_id: run.id.clone(), index: i as u32, stage: Box::new(s.clone()) };
            if tx.send(ev).await.is_err() {
                return;
            }
        }
        if run.state != PipelineState::Running {
            let _ = tx.send(PipelineEvent::Finished { run: Box::new(run) }).await;
            return;
        }
        loop {
            match tokio::time::timeout(Duration::from_secs(1), rx.recv()).await {
                Ok(Ok(ev)) => {
                    let (mine, end) = match &ev {
                        PipelineEvent::Stage { run_id: r, .. } => (*r == run_id, false),
                        PipelineEvent::Finished { run } => (run.id == run_id, true),
                    };
                    if mine && (tx.send(ev).await.is_err() || end) {
                        return;
                    }
                }
                Ok(Err(RecvError::Closed)) => return,
                // Missed events or a quiet second: the store says whether it ended.
                Ok(Err(RecvError::Lagged(_))) | Err(_) => match st.db.pipeline_run_by_id(&run_id) {
                    Ok(Some(run)) if run.state != PipelineState::Running => {
                        let _ = tx.send(PipelineEvent::Finished { run: Box::new(run) }).await;
                        return;
                    }
                    Ok(Some(_)) => {}
                    _ => return,
                },
            }
        }
    });
    out
}

/// The run `key` names for the current caller (404 otherwise).
pub fn get_run(st: &Shared, key: &str) -> EngineResult<PipelineRun> {
    crate::tenancy::find_pipeline_run(st, key)?.ok_or_else(|| not_found(key))
}

/// 404 for a pipeline run.
pub fn not_found(id: &str) -> EngineError {
    EngineError::new(ErrorCode::PipelineNotFound, format!("no pipeline run {id:?}"))
}

/// Validates a spec, checks its image and template sources exist, records the run and starts it.
pub async fn start(st: &Shared, spec: PipelineSpec) -> EngineResult<PipelineRun> {
    validate(&spec)?;
    for s in &spec.stages {
        // A tier this daemon cannot run fails the run before it starts, not at its stage.
        st.tiers.resolve(s.isolation).map_err(|mut e| {
            e.body.message = format!("stage {:?}: {}", s.name, e.body.message);
            e
        })?;
    }
    for (i, s) in spec.stages.iter().enumerate() {
        // A template an earlier stage of this run promotes to will exist when this stage starts.
        let promoted_earlier = |n: &str| spec.stages[..i].iter().any(|o| o.template.as_deref() == Some(n));
        let missing = match parse_source(&s.source) {
            Ok(SourceRef::Image(n)) => st.db.get_image(&n)?.is_none().then(|| format!("no image named {n:?}")),
            Ok(SourceRef::Template(n)) => (!promoted_earlier(&n) && crate::tenancy::find_template(st, &n)?.is_none())
                .then(|| format!("no template named {n:?} (and no earlier stage promotes to it)")),
            _ => None,
        };
        if let Some(m) = missing {
            return Err(SpecError::Stage { stage: s.name.clone(), field: "source", message: m }.into());
        }
    }
    // Secret values are read now (a missing host file is a 400 before anything runs) and
    // go to the secret store only; the recorded spec keeps their names.
    let mut values = Vec::new();
    for s in &spec.stages {
        values.push(crate::secrets::validate(&s.secrets).map_err(|e| match e {
            crate::secrets::SecretsError::Invalid(message) => {
                EngineError::from(SpecError::Stage { stage: s.name.clone(), field: "secrets", message })
            }
            other => EngineError::from(other),
        })?);
    }
    let mut spec = spec;
    for s in &mut spec.stages {
        for secret in &mut s.secrets {
            secret.value_b64 = None;
        }
    }
    let run_id = ids::new_id();
    for (idx, items) in values.into_iter().enumerate() {
        if !items.is_empty() {
            st.secrets.put(&secret_key(&run_id, idx), items)?;
        }
    }
    let t = now();
    let run = PipelineRun {
        id: run_id,
        tenant: crate::tenancy::creating_tenant(),
        name: spec.name.clone().unwrap_or_else(|| "pipeline".into()),
        state: PipelineState::Running,
        reason: None,
        created_at: t.clone(),
        updated_at: t,
        stages: spec.stages.iter().map(pending).collect(),
        spec,
    };
    st.db.put_pipeline_run(&run)?;
    info!(run = %run.id, name = %run.name, stages = run.stages.len(), "pipeline run started");
    spawn_driver(st, &run);
    Ok(run)
}

/// Forgets a finished run's secret values.
fn drop_secrets(st: &Shared, run: &PipelineRun) {
    for key in secret_keys(run) {
        st.secrets.remove(&key);
    }
}

fn pending(s: &StageSpec) -> StageResult {
    StageResult {
        name: s.name.clone(),
        lifecycle: s.lifecycle,
        state: StageState::Pending,
        attempts: 0,
        started_at: None,
        finished_at: None,
        duration_ms: 0,
        commands_ms: 0,
        template: None,
        sandboxes: vec![],
        checkpoint: None,
        output_sandbox: None,
        state_kept_bytes: 0,
        exit_codes: vec![],
        cost: 0.0,
        fanout: None,
        notes: vec![],
        error: None,
    }
}

/// Drives a run in the background, in the run's tenant (its sandboxes,
/// checkpoints and templates are that tenant's, whoever resumed it). Its stages
/// are held to the tenant's quota unless the caller starting (or resuming) the
/// run is not: the operator acting in no tenant.
fn spawn_driver(st: &Shared, run: &PipelineRun) {
    let run_id = run.id.clone();
    if !st.pipelines.claim(&run_id) {
        return;
    }
    let st = st.clone();
    let tenant = run.tenant.clone();
    let exempt = !crate::admission::Admission::quota_applies();
    tokio::spawn(async move {
        let driven = crate::tenancy::run_in_tenant(&tenant, drive(&st, &run_id));
        if exempt {
            crate::admission::exempt_from_quotas(driven).await;
        } else {
            driven.await;
        }
        st.pipelines.release(&run_id);
    });
}

/// Moves a run the driver holds through the pipeline table. The driver only
/// asks for what the table allows from `running`; anything else is a bug,
/// logged loudly, and the run keeps its state.
fn advance(run: &mut PipelineRun, action: RunAction) {
    match next_run_state(run.state, action) {
        Ok(next) => run.state = next,
        Err(e) => tracing::error!(run = %run.id, error = %e, "pipeline driver asked for an illegal transition"),
    }
}

/// Continues a failed or interrupted run from its first unfinished stage.
pub async fn resume(st: &Shared, id: &str) -> EngineResult<PipelineRun> {
    let mut run = crate::tenancy::find_pipeline_run(st, id)?.ok_or_else(|| not_found(id))?;
    if run.state == PipelineState::Running && st.pipelines.is_active(&run.id) {
        return Err(EngineError::new(ErrorCode::InvalidState, format!("pipeline run {} is running", run.id)));
    }
    run.state = next_run_state(run.state, RunAction::Resume)
        .map_err(|e| EngineError::new(ErrorCode::InvalidState, format!("pipeline run {}: {e}", run.id)))?;
    run.reason = None;
    run.updated_at = now();
    st.db.put_pipeline_run(&run)?;
    info!(run = %run.id, "pipeline run resumed");
    spawn_driver(st, &run);
    Ok(run)
}

/// Marks runs left `running` by a previous daemon as `interrupted` (at start).
pub fn reconcile(st: &Shared) -> EngineResult<()> {
    for id in st.db.interrupt_pipeline_runs(
        "the daemon stopped while the run was in progress; `strata pipeline resume` continues it",
        &now(),
    )? {
        warn!(run = %id, "pipeline run interrupted by a daemon restart");
    }
    Ok(())
}

/// Records the run (one transaction) and publishes stage `idx`'s new state, or
/// the end of the run when it is no longer running.
fn save(st: &Shared, run: &mut PipelineRun, idx: Option<usize>) {
    run.updated_at = now();
    if let Err(e) = st.db.put_pipeline_run(run) {
        warn!(run = %run.id, error = %crate::error::chain(&e), "recording pipeline progress failed");
    }
    if let Some(i) = idx {
        let _ = st.pipelines.events().send(PipelineEvent::Stage {
            run_id: run.id.clone(),
            index: i as u32,
            stage: Box::new(run.stages[i].clone()),
        });
    }
    if run.state != PipelineState::Running {
        let _ = st.pipelines.events().send(PipelineEvent::Finished { run: Box::new(run.clone()) });
    }
}

async fn drive(st: &Shared, run_id: &str) {
    let Ok(Some(mut run)) = st.db.pipeline_run_by_id(run_id) else { return };
    for idx in 0..run.stages.len() {
        if run.stages[idx].state == StageState::Succeeded {
            continue;
        }
        if st.pipelines.take_pause(&run.id) {
            advance(&mut run, RunAction::Pause);
            run.reason =
                Some(format!("paused before stage {:?}; `strata pipeline resume` continues", run.stages[idx].name));
            info!(run = %run.id, stage = %run.stages[idx].name, "pipeline run paused");
            save(st, &mut run, None);
            return;
        }
        // Leftovers of an earlier, unfinished attempt of this stage (not another stage's output).
        let outputs: HashSet<String> = run.stages.iter().filter_map(|s| s.output_sandbox.clone()).collect();
        for sb in std::mem::take(&mut run.stages[idx].sandboxes) {
            if !outputs.contains(&sb) && st.db.sandbox_by_id(&sb).ok().flatten().is_some() {
                let _ = crate::lifecycle::destroy(st, &sb, true, "pipeline_retry").await;
            }
        }
        let stage = &mut run.stages[idx];
        *stage = StageResult {
            attempts: stage.attempts + 1,
            state: StageState::Running,
            started_at: Some(now()),
            ..pending(&run.spec.stages[idx])
        };
        save(st, &mut run, Some(idx));
        let started = Instant::now();
        let outcome = run_stage(st, &mut run, idx).await;
        let stage = &mut run.stages[idx];
        stage.duration_ms = started.elapsed().as_millis() as u64;
        stage.finished_at = Some(now());
        stage.cost = stage
            .sandboxes
            .iter()
            .filter_map(|id| st.db.usage_by_id(id).ok().flatten())
            .map(|u| crate::accounting::report(st, u).total)
            .sum();
        match outcome {
            Ok(()) => {
                stage.state = StageState::Succeeded;
                info!(run = %run.id, stage = %stage.name, ms = stage.duration_ms, "pipeline stage succeeded");
                save(st, &mut run, Some(idx));
            }
            Err(msg) => {
                stage.state = StageState::Failed;
                stage.error = Some(msg.clone());
                advance(&mut run, RunAction::Fail);
                run.reason = Some(format!("stage {:?} failed: {msg}", run.stages[idx].name));
                st.pipelines.take_pause(&run.id);
                warn!(run = %run.id, stage = %run.stages[idx].name, error = %msg, "pipeline stage failed");
                save(st, &mut run, Some(idx));
                return;
            }
        }
    }
    st.pipelines.take_pause(&run.id);
    advance(&mut run, RunAction::Succeed);
    info!(run = %run.id, "pipeline run succeeded");
    save(st, &mut run, None);
    // A succeeded run never runs a stage again.
    drop_secrets(st, &run);
}

/// A unique, valid object name for this run, stage and attempt.
fn object_name(run: &PipelineRun, stage: &str, attempt: u32, suffix: &str) -> String {
    let mut base = format!("{}-{}-{}", run.name, &run.id[..8], stage);
    if attempt > 1 {
        base.push_str(&format!("-r{attempt}"));
    }
    base.push_str(suffix);
    if base.len() > 63 || ids::validate_name(&base, false).is_err() {
        return format!("p-{}-{}", &run.id[..8], ids::new_id());
    }
    base
}

fn tail_of(p: &crate::processes::Proc) -> String {
    let (out, err, _) = p.captured_output();
    let pick = if err.iter().any(|b| !b.is_ascii_whitespace()) { err } else { out };
    let s = String::from_utf8_lossy(&pick[pick.len().saturating_sub(512)..]).trim().to_string();
    if s.is_empty() {
        "(no output)".into()
    } else {
        s
    }
}

/// How often a stage waiting for a Rule-of-Two approval looks at it.
const APPROVAL_POLL: Duration = Duration::from_millis(500);

/// Runs `call`; when the Rule of Two holds it for an approval, notes the
/// approval on stage `idx`, waits for the decision and, once approved, runs it
/// again (the approval then lets it through once). A denial or the approval
/// timeout fails the stage with the decider's reason.
async fn with_approval<T, F, Fut>(st: &Shared, run: &mut PipelineRun, idx: usize, mut call: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = EngineResult<T>>,
{
    loop {
        let e = match call().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        let Some(a) = e.body.approval.as_deref().filter(|_| e.body.code == ErrorCode::ApprovalRequired) else {
            return Err(e.body.message);
        };
        let id = a.id.clone();
        info!(run = %run.id, stage = idx, approval = %id, "stage waits for a Rule-of-Two approval");
        run.stages[idx]
            .notes
            .push(format!("waiting for approval {id} (strata approvals approve|deny {id}): {}", e.body.message));
        save(st, run, Some(idx));
        loop {
            tokio::time::sleep(APPROVAL_POLL).await;
            crate::approvals::expire_pending(st);
            let a =
                st.db.get_approval(&id).map_err(|e| e.to_string())?.ok_or_else(|| format!("approval {id} vanished"))?;
            match a.state {
                strata_api::ApprovalState::Pending => continue,
                strata_api::ApprovalState::Approved => {
                    run.stages[idx]
                        .notes
                        .push(format!("approval {id} approved by {}", a.decided_by.as_deref().unwrap_or("?")));
                    break;
                }
                _ => {
                    return Err(format!(
                        "approval {id} {} by {}{}",
                        a.state,
                        a.decided_by.as_deref().unwrap_or("?"),
                        a.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default()
                    ))
                }
            }
        }
    }
}

/// Runs stage `idx`; on error returns the message recorded on the stage.
async fn run_stage(st: &Shared, run: &mut PipelineRun, idx: usize) -> Result<(), String> {
    let spec = run.spec.stages[idx].clone();
    let attempt = run.stages[idx].attempts;
    let api = |e: EngineError| e.body.message;
    let mut env: BTreeMap<String, String> = run.spec.env.clone();
    env.extend(spec.env.clone());
    env.insert("STRATA_PIPELINE_RUN".into(), run.id.clone());
    env.insert("STRATA_PIPELINE_STAGE".into(), spec.name.clone());
    env.insert("STRATA_PIPELINE_ATTEMPT".into(), attempt.to_string());
    let source = parse_source(&spec.source)?;
    // The output of the stage named by `stage:NAME` (validation guarantees it ran before).
    let upstream =
        |name: &str| run.stages.iter().find(|s| s.name == name).cloned().ok_or_else(|| format!("no stage {name:?}"));

    if spec.lifecycle == StageLifecycle::Fork {
        // An earlier stage's output is named by its id (a template's or image's
        // name never stands in for it); a template source by the template's checkpoint.
        let from = match &source {
            SourceRef::Stage(n) => {
                let up = upstream(n)?;
                if let (None, Some(sb)) = (&up.checkpoint, &up.output_sandbox) {
                    // A standby output is forked from its live state (checkpointed first).
                    crate::lifecycle::ensure_running(st, sb).await.map_err(api)?;
                }
                up.checkpoint.or(up.output_sandbox).ok_or_else(|| format!("stage {n:?} has no output"))?
            }
            SourceRef::Template(n) => match crate::tenancy::find_template(st, n).map_err(|e| e.body.message)? {
                Some((ckpt, _)) => ckpt,
                None => n.clone(),
            },
            SourceRef::Image(_) => return Err("a fork stage needs a checkpoint".into()),
        };
        let mut plan = spec.fanout.clone().expect("validated");
        for a in plan.attempts.iter_mut() {
            let mut e = env.clone();
            e.extend(std::mem::take(&mut a.env));
            a.env = e;
        }
        if plan.attempts.is_empty() {
            // Template attempts: the stage environment goes in through explicit attempts.
            let expanded = crate::fanout::expand(&plan)?;
            plan.attempts = expanded
                .into_iter()
                .map(|mut a| {
                    a.env = env.clone();
                    a
                })
                .collect();
            plan.run = None;
            plan.args.clear();
            plan.count = None;
        }
        let promote_as = object_name(run, &spec.name, attempt, "");
        let req = FanoutRequest {
            source: from,
            plan,
            promote_as: Some(promote_as),
            name_prefix: Some(object_name(run, &spec.name, attempt, "")),
            lifecycle: Lifecycle::Persistent,
            ttl: spec.ttl.clone(),
            limits: spec.limits.clone(),
        };
        let r = crate::fanout::fanout(st, req).await.map_err(api)?;
        let stage = &mut run.stages[idx];
        stage.sandboxes = r.attempts.iter().map(|a| a.sandbox_id.clone()).collect();
        stage.exit_codes = r.attempts.iter().map(|a| a.exit_code.unwrap_or(-1)).collect();
        stage.commands_ms = r.attempts.iter().map(|a| a.duration_ms).max().unwrap_or(0);
        stage.fanout = Some(r.clone());
        let Some(winner) = r.winner_sandbox.clone() else {
            return Err(format!("fan-out has no winner: {}", r.reason.as_deref().unwrap_or("unknown")));
        };
        if let Some(c) = &r.promoted {
            stage.checkpoint = Some(c.id.clone());
            stage.state_kept_bytes = c.layer_size;
        }
        stage.notes.push(format!("winner: attempt {} ({winner})", r.winner.unwrap_or(0)));
        // The output is the checkpoint: the winner's compute is released.
        if let Err(e) = crate::lifecycle::stop(st, &winner, "pipeline_stage_end", Duration::ZERO).await {
            stage.notes.push(format!("stopping the winner failed: {}", e.body.message));
        }
        return promote(st, run, idx, &spec).await;
    }

    // Create (or resume) the stage's sandbox.
    let sandbox_id = match &source {
        SourceRef::Stage(n) if upstream(n)?.output_sandbox.is_some() => {
            let id = upstream(n)?.output_sandbox.expect("checked");
            crate::lifecycle::ensure_running(st, &id).await.map_err(api)?;
            if !spec.capabilities.is_empty() {
                let current = crate::record::load(st, &id).map_err(api)?.sandbox.policy.capabilities;
                let req = strata_api::UpdateSandboxRequest {
                    capabilities: Some(current.into_iter().chain(spec.capabilities.iter().copied()).collect()),
                    ..Default::default()
                };
                with_approval(st, run, idx, || async { crate::policy::update(st, &id, &req) })
                    .await
                    .map_err(|e| format!("capabilities: {e}"))?;
            }
            if let Some(net) = &spec.network {
                with_approval(st, run, idx, || crate::network::update(st, &id, net.clone()))
                    .await
                    .map_err(|e| format!("network: {e}"))?;
            }
            id
        }
        _ => {
            let from = match &source {
                SourceRef::Image(n) | SourceRef::Template(n) => n.clone(),
                SourceRef::Stage(n) => {
                    upstream(n)?.checkpoint.ok_or_else(|| format!("stage {n:?} has no output checkpoint"))?
                }
            };
            let mut policy = spec.policy.clone();
            if !spec.flush.is_empty() {
                policy.get_or_insert_with(Default::default).flush = Some(spec.flush.clone());
            }
            let secrets = if spec.secrets.is_empty() {
                vec![]
            } else {
                let stored = st.secrets.get(&secret_key(&run.id, idx)).map_err(|e| format!("secrets: {e}"))?;
                if stored.is_empty() {
                    return Err(
                        "the stage's secret values are gone from the daemon's secret store; start a new run".into()
                    );
                }
                stored.specs()
            };
            let req = CreateSandboxRequest {
                source: from,
                name: Some(object_name(run, &spec.name, attempt, "")),
                secrets,
                network: spec.network.clone(),
                lifecycle: if spec.lifecycle == StageLifecycle::Ephemeral {
                    Lifecycle::Ephemeral
                } else {
                    Lifecycle::Persistent
                },
                ttl: spec.ttl.clone(),
                limits: spec.limits.clone().unwrap_or_default(),
                env: env.clone(),
                policy,
                capabilities: spec.capabilities.clone(),
                isolation: spec.isolation,
                ..Default::default()
            };
            with_approval(st, run, idx, || crate::lifecycle::create(st, req.clone())).await?.id
        }
    };
    run.stages[idx].sandboxes.push(sandbox_id.clone());
    save(st, run, Some(idx));

    let result = run_commands(st, run, idx, &spec, &sandbox_id, &env).await;
    if let Err(msg) = result {
        // A failed ephemeral stage leaves nothing; other lifecycles keep the sandbox for debugging.
        if spec.lifecycle == StageLifecycle::Ephemeral {
            let _ = crate::lifecycle::destroy(st, &sandbox_id, true, "pipeline_stage_failed").await;
        }
        return Err(msg);
    }
    let stage_name = spec.name.clone();
    match spec.lifecycle {
        StageLifecycle::Ephemeral => {
            crate::lifecycle::destroy(st, &sandbox_id, true, "pipeline_stage_end").await.map_err(api)?;
        }
        StageLifecycle::Persistent | StageLifecycle::PersistentWithCheckpoints => {
            if spec.lifecycle == StageLifecycle::Persistent || spec.commands.is_empty() {
                let c = crate::checkpoints::checkpoint(
                    st,
                    &sandbox_id,
                    CheckpointRequest { name: Some(object_name(run, &stage_name, attempt, "")), ..Default::default() },
                )
                .await
                .map_err(api)?;
                let stage = &mut run.stages[idx];
                stage.state_kept_bytes += c.layer_size;
                stage.checkpoint = Some(c.id);
            }
            crate::lifecycle::stop(st, &sandbox_id, "pipeline_stage_end", Duration::ZERO).await.map_err(api)?;
            promote(st, run, idx, &spec).await?;
        }
        StageLifecycle::Standby => {
            let stage = &mut run.stages[idx];
            if let Err(e) = crate::lifecycle::standby_with(
                st,
                &sandbox_id,
                &StandbyRequest { fs_only: false },
                "pipeline_stage_end",
            )
            .await
            {
                if e.body.code != ErrorCode::Unsupported {
                    return Err(e.body.message);
                }
                stage.notes.push(format!("standby degraded to filesystem-only: {}", e.body.message));
                crate::lifecycle::standby_with(
                    st,
                    &sandbox_id,
                    &StandbyRequest { fs_only: true },
                    "pipeline_stage_end",
                )
                .await
                .map_err(api)?;
            }
            stage.state_kept_bytes = crate::process_image::info(st, &sandbox_id).map_or(0, |i| i.image_bytes);
            stage.output_sandbox = Some(sandbox_id.clone());
        }
        StageLifecycle::Fork => unreachable!("handled above"),
    }
    Ok(())
}

/// Promotes a stage's output checkpoint to its `template`, through the scan gate.
async fn promote(st: &Shared, run: &mut PipelineRun, idx: usize, spec: &StageSpec) -> Result<(), String> {
    let (Some(name), Some(ckpt)) = (spec.template.clone(), run.stages[idx].checkpoint.clone()) else { return Ok(()) };
    let req =
        CreateTemplateRequest { name: name.clone(), from: ckpt, replace: true, accept_findings: spec.accept_findings };
    match crate::templates::create(st, req, &format!("pipeline:{}", run.id)).await {
        Ok(_) => {
            run.stages[idx].template = Some(name);
            Ok(())
        }
        Err(e) if !e.body.findings.is_empty() => {
            let list: Vec<String> = e.body.findings.iter().take(5).map(|f| format!("{} {}", f.rule, f.path)).collect();
            Err(format!(
                "promoting to template {name:?}: {} (first: {}); clean up or set accept_findings = true",
                e.body.message,
                list.join(", ")
            ))
        }
        Err(e) => Err(format!("promoting to template {name:?}: {}", e.body.message)),
    }
}

/// Runs a stage's commands in order; a `persistent_with_checkpoints` stage is checkpointed after each.
async fn run_commands(
    st: &Shared,
    run: &mut PipelineRun,
    idx: usize,
    spec: &StageSpec,
    sandbox_id: &str,
    env: &BTreeMap<String, String>,
) -> Result<(), String> {
    let attempt = run.stages[idx].attempts;
    for (ci, cmd) in spec.commands.iter().enumerate() {
        let req = ExecRequest {
            cmd: vec!["sh".into(), "-c".into(), cmd.clone()],
            env: env.clone(),
            timeout: spec.timeout.clone(),
            user: spec.user.clone(),
            cwd: spec.workdir.clone(),
            ..Default::default()
        };
        let started = Instant::now();
        let p = crate::processes::spawn(st, sandbox_id, req)
            .await
            .map_err(|e| format!("command {} ({cmd:?}): {}", ci + 1, e.body.message))?;
        let info = p.wait(None).await;
        run.stages[idx].commands_ms += started.elapsed().as_millis() as u64;
        let code = info.exit_status();
        run.stages[idx].exit_codes.push(code);
        save(st, run, Some(idx));
        if info.status != ProcessStatus::Exited || code != 0 {
            let how = if info.timed_out { "timed out".to_string() } else { format!("exited {code}") };
            return Err(format!("command {} ({cmd:?}) {how}: {}", ci + 1, tail_of(&p)));
        }
        if spec.lifecycle == StageLifecycle::PersistentWithCheckpoints {
            let name = object_name(run, &spec.name, attempt, &format!("-{}", ci + 1));
            let c = crate::checkpoints::checkpoint(
                st,
                sandbox_id,
                CheckpointRequest { name: Some(name), ..Default::default() },
            )
            .await
            .map_err(|e| e.body.message)?;
            let stage = &mut run.stages[idx];
            stage.state_kept_bytes += c.layer_size;
            stage.checkpoint = Some(c.id);
            save(st, run, Some(idx));
        }
    }
    Ok(())
}

/// Cost of a run's stages, priced now.
pub fn cost(st: &Shared, id: &str) -> EngineResult<PipelineCost> {
    let run = crate::tenancy::find_pipeline_run(st, id)?.ok_or_else(|| not_found(id))?;
    let mut stages = Vec::new();
    for s in &run.stages {
        let mut total = 0.0;
        for sb in &s.sandboxes {
            if let Some(u) = st.db.usage_by_id(sb)? {
                total += crate::accounting::report(st, u).total;
            }
        }
        stages.push(StageCost { name: s.name.clone(), sandboxes: s.sandboxes.clone(), total });
    }
    let total = stages.iter().map(|s| s.total).sum();
    Ok(PipelineCost { run_id: run.id, stages, total })
}

/// Every pipeline run the current caller may see, newest first.
pub fn list_runs(st: &Shared) -> EngineResult<Vec<PipelineRun>> {
    let mut out = Vec::new();
    for id in st.db.list_pipeline_run_ids()? {
        if let Some(r) = st.db.pipeline_run_by_id(&id)?.filter(|r| crate::tenancy::visible(&r.tenant)) {
            out.push(r);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
name = "demo"
[[stage]]
name = "setup"
source = "image:busybox"
lifecycle = "persistent"
commands = ["echo hi > /root/f"]
flush = ["/tmp"]

[[stage]]
name = "fix"
source = "stage:setup"
lifecycle = "fork"
[stage.fanout]
run = "test {i} = 2"
count = 3

[[stage]]
name = "eval"
source = "stage:fix"
lifecycle = "ephemeral"
commands = ["cat /root/f"]
"#;

    fn parse(t: &str) -> Result<PipelineSpec, SpecError> {
        let s = parse_request(RunPipelineRequest { toml: Some(t.into()), spec: None })?;
        validate(&s)?;
        Ok(s)
    }

    fn stage_err(t: &str) -> (String, &'static str, String) {
        match parse(t).unwrap_err() {
            SpecError::Stage { stage, field, message } => (stage, field, message),
            other => panic!("{other}"),
        }
    }

    #[test]
    fn a_good_spec_parses_and_validates() {
        let s = parse(GOOD).unwrap();
        assert_eq!(s.stages.len(), 3);
        assert_eq!(s.stages[1].fanout.as_ref().unwrap().count, Some(3));
        assert_eq!(s.stages[2].lifecycle, StageLifecycle::Ephemeral);
        // Kebab-case lifecycles are accepted too.
        let s = parse(&GOOD.replace("\"persistent\"", "\"persistent-with-checkpoints\"")).unwrap();
        assert_eq!(s.stages[0].lifecycle, StageLifecycle::PersistentWithCheckpoints);
    }

    #[test]
    fn bad_specs_name_the_stage_and_field() {
        assert_eq!(stage_err(&GOOD.replace("stage:setup", "stage:nope")).1, "source");
        let (stage, field, m) = stage_err(&GOOD.replace("stage:setup", "stage:eval"));
        assert_eq!((stage.as_str(), field), ("fix", "source"));
        assert!(m.contains("forward reference"), "{m}");
        assert!(stage_err(&GOOD.replace("stage:setup", "stage:fix")).2.contains("cycle"));
        assert!(stage_err(&GOOD.replace("stage:setup", "disk:x")).2.contains("unknown source kind"));
        assert!(stage_err(&GOOD.replace("count = 3", "count = 65")).2.contains("between 1 and 64"));
        assert!(stage_err(&GOOD.replace("count = 3", "count = 0")).2.contains("between 1 and 64"));
        // A stage cannot start from an ephemeral one.
        let t = format!("{GOOD}\n[[stage]]\nname = \"after\"\nsource = \"stage:eval\"\nlifecycle = \"ephemeral\"\n");
        assert!(stage_err(&t).2.contains("keeps nothing"));
        // keep that the lifecycle cannot provide.
        let t = GOOD.replace("flush = [\"/tmp\"]", "keep = \"processes\"");
        assert_eq!(stage_err(&t).1, "keep");
        // An unknown lifecycle or field is a parse error with its line.
        match parse(&GOOD.replace("\"ephemeral\"", "\"sometimes\"")).unwrap_err() {
            SpecError::Parse(m) => assert!(m.contains("line") && m.contains("sometimes"), "{m}"),
            other => panic!("{other}"),
        }
        match parse(&GOOD.replace("flush = [\"/tmp\"]", "flsh = [\"/tmp\"]")).unwrap_err() {
            SpecError::Parse(m) => assert!(m.contains("flsh"), "{m}"),
            other => panic!("{other}"),
        }
        assert!(matches!(parse("name = \"x\"\nstage = []\n").unwrap_err(), SpecError::Spec(_)));
        // A stage's policy is checked before the run: a check interval below the minimum.
        let t = format!("{GOOD}\n[stage.policy]\ncheck_every = \"30s\"\n");
        let (stage, field, m) = stage_err(&t);
        assert_eq!((stage.as_str(), field), ("eval", "policy"));
        assert!(m.contains("minimum"), "{m}");
        assert!(parse(&format!("{GOOD}\n[stage.policy]\ncheck_every = \"6h\"\non_findings = \"quarantine\"\n")).is_ok());
        assert_eq!(
            stage_err(
                &GOOD.replace(
                    "commands = [\"cat /root/f\"]",
                    "commands = [\"x\"]\n[stage.fanout]\nrun = \"x\"\ncount = 1"
                )
            )
            .1,
            "fanout"
        );
    }

    #[test]
    fn a_stage_names_its_tier_and_a_fork_stage_keeps_its_sources() {
        let t = GOOD.replace("commands = [\"cat /root/f\"]", "commands = [\"cat /root/f\"]\nisolation = \"gvisor\"");
        assert_eq!(parse(&t).unwrap().stages[2].isolation, Some(strata_api::Isolation::Gvisor));
        let t = GOOD.replace("lifecycle = \"fork\"", "lifecycle = \"fork\"\nisolation = \"gvisor\"");
        let (stage, field, m) = stage_err(&t);
        assert_eq!((stage.as_str(), field), ("fix", "isolation"));
        assert!(m.contains("source checkpoint's tier"), "{m}");
        match parse(&GOOD.replace("lifecycle = \"ephemeral\"", "lifecycle = \"ephemeral\"\nisolation = \"kata\""))
            .unwrap_err()
        {
            SpecError::Parse(m) => assert!(m.contains("kata"), "{m}"),
            other => panic!("{other}"),
        }
    }

    #[test]
    fn sources_parse() {
        assert_eq!(parse_source("image:busybox"), Ok(SourceRef::Image("busybox".into())));
        assert_eq!(parse_source("stage:a"), Ok(SourceRef::Stage("a".into())));
        assert!(parse_source("busybox").is_err());
        assert!(parse_source("image:").is_err());
    }
}
