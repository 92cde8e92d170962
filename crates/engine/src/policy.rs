//! Lifecycle policy: validation and updates of a sandbox's policy, and the
//! engine that applies it automatically.
//!
//! Every second the engine takes a [`Snapshot`] of each sandbox (state, ages,
//! activity, leases) and asks the pure function [`decide`] what, if anything,
//! is due: the `on_idle` action (reason `idle_timeout`), the end of its
//! `max_lifetime` (`max_lifetime`), archiving (`archive_after`) or destroying
//! (`delete_after`). Actions run in their own tasks through the ordinary
//! lifecycle functions, so each is a recorded transition with its reason. The
//! decision is taken again under the sandbox's operation lock before acting.
//! A failed action is logged, recorded as an event (`idle_action_failed` or
//! `policy_action_failed`) and retried with backoff, never sooner than a minute.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant, SystemTime};

use strata_api::{Lifecycle, OnIdle, Sandbox, SandboxEvent, SandboxPolicy, SandboxState, UpdateSandboxRequest};
use strata_core::lifecycle::has_processes;
use strata_core::units;
use strata_store::db::SandboxRecord;
use tracing::{info, warn};

use crate::error::{EngineError, EngineResult};
use crate::lifecycle;
use crate::record::{load, now};
use crate::state::Shared;

pub use crate::policy_spec::*;

/// How often the engine looks at every sandbox.
pub const TICK: Duration = Duration::from_secs(1);
/// Wait before retrying a failed automatic action (doubled after each failure).
pub const RETRY_AFTER: Duration = Duration::from_secs(60);
/// Longest wait between retries of a failed automatic action.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(15 * 60);

/// A policy with its durations parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Action once idle.
    pub on_idle: OnIdle,
    /// Idle time before `on_idle`.
    pub idle_timeout: Duration,
    /// Maximum age.
    pub max_lifetime: Option<Duration>,
    /// Action at `max_lifetime` (`None`: by lifecycle).
    pub on_max_lifetime: Option<OnIdle>,
    /// Time parked before archiving.
    pub archive_after: Option<Duration>,
    /// Time parked before destroying.
    pub delete_after: Option<Duration>,
}

impl Limits {
    /// Parses a stored policy.
    pub fn of(p: &SandboxPolicy) -> Result<Limits, units::UnitError> {
        let opt = |v: &Option<String>| v.as_deref().map(units::parse_duration).transpose();
        Ok(Limits {
            on_idle: p.on_idle,
            idle_timeout: units::parse_duration(&p.idle_timeout)?,
            max_lifetime: opt(&p.max_lifetime)?,
            on_max_lifetime: p.on_max_lifetime,
            archive_after: opt(&p.archive_after)?,
            delete_after: opt(&p.delete_after)?,
        })
    }
}

/// Changes a sandbox's policy; returns the sandbox.
pub fn update(st: &Shared, id: &str, req: &UpdateSandboxRequest) -> EngineResult<Sandbox> {
    let rec = load(st, id)?;
    if let Some(caps) = req.capabilities.as_ref() {
        declare(st, &rec, caps)?;
    }
    if let Some(patch) = req.policy.as_ref().filter(|p| !p.is_empty()) {
        validate(patch)?;
        let policy = st
            .db
            .update_policy(&rec.sandbox.id, |p| apply_patch(p, patch))?
            .ok_or_else(|| EngineError::sandbox_not_found(id))?;
        info!(sandbox = %rec.sandbox.id, on_idle = %policy.on_idle, idle_timeout = %policy.idle_timeout, max_lifetime = ?policy.max_lifetime,
            archive_after = ?policy.archive_after, delete_after = ?policy.delete_after, "policy updated");
        st.policy_changed.notify_one();
    }
    Ok(load(st, &rec.sandbox.id)?.sandbox)
}

/// Adds declared Rule-of-Two capabilities to a sandbox (the gate decides
/// whether it may then hold all three). Declared ones cannot be dropped: the
/// data that made them true is still in the sandbox.
fn declare(st: &Shared, rec: &strata_store::db::SandboxRecord, caps: &[strata_api::Capability]) -> EngineResult<()> {
    let current = &rec.sandbox.policy.capabilities;
    if let Some(dropped) = current.iter().find(|c| !caps.contains(c)) {
        return Err(EngineError::bad_request(format!(
            "capability {dropped} cannot be dropped (declared capabilities only grow: its data is still in the sandbox; start a new one from a clean template instead)"
        )));
    }
    let mut declared: Vec<strata_api::Capability> = current.iter().chain(caps).copied().collect();
    declared.sort();
    declared.dedup();
    if declared == *current {
        return Ok(());
    }
    let mut view = crate::record::with_secret_names(st, rec.sandbox.clone());
    view.policy.capabilities = declared.clone();
    let facts = crate::record::exposure_facts(st, &view);
    let grants = strata_core::rule_of_two::grants(&crate::record::exposure(&view, &facts));
    crate::approvals::gate(st, &rec.sandbox.tenant, "declare capabilities of", &rec.sandbox.id, &grants)?;
    st.db
        .update_policy(&rec.sandbox.id, |p| p.capabilities = declared.clone())?
        .ok_or_else(|| EngineError::sandbox_not_found(&rec.sandbox.id))?;
    info!(sandbox = %rec.sandbox.id, capabilities = ?declared, "capabilities declared");
    Ok(())
}

/// Everything [`decide`] looks at, taken at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    /// Current state.
    pub state: SandboxState,
    /// Ephemeral or persistent.
    pub lifecycle: Lifecycle,
    /// The policy.
    pub limits: Limits,
    /// Time since creation.
    pub age: Duration,
    /// Time since the last state change (for a running sandbox: since it started).
    pub in_state_for: Duration,
    /// Time since it entered stopped/standby/archived, when it is in one of them.
    pub inactive_for: Option<Duration>,
    /// Time since the last API activity (at most the daemon's uptime).
    pub quiet_for: Duration,
    /// Processes started through the API that are still running.
    pub running_processes: usize,
    /// Activity-tracked requests and streams still open.
    pub open_streams: usize,
    /// Keep-alive leases held.
    pub leases: usize,
}

/// What the engine does to a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyAction {
    /// Standby (processes and memory to disk).
    Standby,
    /// Stop (processes killed, filesystem kept).
    Stop,
    /// Destroy.
    Destroy,
    /// Archive the filesystem.
    Archive,
}

impl PolicyAction {
    /// Lower-case name, as in the lifecycle actions.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyAction::Standby => "standby",
            PolicyAction::Stop => "stop",
            PolicyAction::Destroy => "destroy",
            PolicyAction::Archive => "archive",
        }
    }
}

/// An action that is due and why (the reason code recorded on the transition).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Step {
    /// What to do.
    pub action: PolicyAction,
    /// `idle_timeout`, `max_lifetime`, `archive_after` or `delete_after`.
    pub reason: &'static str,
}

/// Why a running sandbox is not idle, or `None` when it is idle. The
/// processes of a paused sandbox are frozen and do no work: they do not count.
pub fn busy_reason(s: &Snapshot) -> Option<&'static str> {
    if s.running_processes > 0 && s.state != SandboxState::Paused {
        Some("a process is running")
    } else if s.open_streams > 0 {
        Some("a connection is open")
    } else if s.leases > 0 {
        Some("a lease is held")
    } else {
        None
    }
}

/// How long a sandbox has been idle: the shortest of the time since the last
/// activity and the time since it started (or `None` while it is busy).
pub fn idle_for(s: &Snapshot) -> Option<Duration> {
    busy_reason(s).is_none().then(|| s.quiet_for.min(s.in_state_for))
}

/// The action due for a sandbox, if any. Pure: the engine's whole policy.
///
/// * Running or paused past `max_lifetime` (a run that began before that
///   deadline): `on_max_lifetime`, by default stop (persistent) or destroy
///   (ephemeral). Leases do not hold this off; a run started by hand after the
///   deadline is left alone.
/// * Running or paused and idle for `idle_timeout`: `on_idle` (nothing for `keep`).
/// * Parked (stopped/standby/archived) for `delete_after`: destroy; parked in
///   stopped/standby for `archive_after`: archive. A held lease holds these off.
pub fn decide(s: &Snapshot) -> Option<Step> {
    let l = &s.limits;
    if has_processes(s.state) {
        if lifetime_left(s).is_some_and(|left| left.is_zero()) {
            let action = match (l.on_max_lifetime, s.lifecycle) {
                (Some(OnIdle::Standby), _) => PolicyAction::Standby,
                (Some(OnIdle::Destroy), _) | (None, Lifecycle::Ephemeral) => PolicyAction::Destroy,
                (Some(OnIdle::Stop | OnIdle::Keep), _) | (None, Lifecycle::Persistent) => PolicyAction::Stop,
            };
            return Some(Step { action, reason: "max_lifetime" });
        }
        let action = match l.on_idle {
            OnIdle::Keep => return None,
            OnIdle::Standby => PolicyAction::Standby,
            OnIdle::Stop => PolicyAction::Stop,
            OnIdle::Destroy => PolicyAction::Destroy,
        };
        return idle_for(s).filter(|d| *d >= l.idle_timeout).map(|_| Step { action, reason: "idle_timeout" });
    }
    let parked = s.inactive_for?;
    if s.leases > 0 {
        return None;
    }
    if l.delete_after.is_some_and(|d| parked >= d) {
        return Some(Step { action: PolicyAction::Destroy, reason: "delete_after" });
    }
    if matches!(s.state, SandboxState::Stopped | SandboxState::Standby) && l.archive_after.is_some_and(|d| parked >= d)
    {
        return Some(Step { action: PolicyAction::Archive, reason: "archive_after" });
    }
    None
}

/// The time left before `max_lifetime` ends the current run (zero: due now),
/// for a sandbox that runs or is paused in a run that began before that
/// deadline (a run started by hand after it is left alone: `None`).
fn lifetime_left(s: &Snapshot) -> Option<Duration> {
    let max = s.limits.max_lifetime?;
    let run_began_before_deadline = s.age.saturating_sub(s.in_state_for) < max;
    (has_processes(s.state) && run_began_before_deadline).then(|| max.saturating_sub(s.age))
}

/// How long until `max_lifetime` falls due for a sandbox for which it is not
/// due yet; `None` when nothing is to come. The policy loop sleeps at most
/// this long, so a lifetime ends on time, not up to a tick later.
pub fn lifetime_due_in(s: &Snapshot) -> Option<Duration> {
    lifetime_left(s).filter(|left| !left.is_zero())
}

fn since(rfc3339: &str, now: SystemTime) -> Duration {
    humantime::parse_rfc3339_weak(rfc3339).ok().and_then(|t| now.duration_since(t).ok()).unwrap_or(Duration::ZERO)
}

/// Takes the snapshot of a sandbox (`None` when its stored policy does not parse).
pub fn snapshot(st: &Shared, rec: &SandboxRecord, leases: usize) -> Option<Snapshot> {
    let sb = &rec.sandbox;
    let limits = match Limits::of(&sb.policy) {
        Ok(l) => l,
        Err(e) => {
            // Policies are validated when written; this is a damaged row (not logged every tick).
            tracing::debug!(sandbox = %sb.id, error = %e, "stored policy does not parse; not applying it");
            return None;
        }
    };
    let now = SystemTime::now();
    let activity = st.activity.view(&sb.id, Instant::now());
    Some(Snapshot {
        state: sb.state,
        lifecycle: sb.lifecycle,
        limits,
        age: since(&sb.created_at, now),
        in_state_for: since(&sb.updated_at, now),
        inactive_for: sb.inactive_since.as_deref().map(|t| since(t, now)),
        quiet_for: activity.quiet_for,
        running_processes: st.processes.running(&sb.id),
        open_streams: activity.open,
        leases,
    })
}

fn held_leases(st: &Shared, id: &str) -> EngineResult<usize> {
    let at = SystemTime::now();
    Ok(st.db.list_leases(Some(id))?.iter().filter(|l| crate::activity::is_held(l, at)).count())
}

/// Applies `step` if it is still due once the sandbox's operation lock is held.
/// `Ok(None)` when it no longer is (activity arrived, the state changed).
pub async fn apply(st: &Shared, id: &str, step: Step) -> EngineResult<Option<SandboxEvent>> {
    let lock = st.lock_for(id);
    let guard = lock.lock().await;
    let Some(rec) = st.db.sandbox_by_id(id)? else { return Ok(None) };
    let due = snapshot(st, &rec, held_leases(st, id)?).and_then(|s| decide(&s));
    if due != Some(step) {
        return Ok(None);
    }
    info!(sandbox = id, action = step.action.as_str(), reason = step.reason, "applying lifecycle policy");
    crate::failpoint("policy_action").map_err(|e| EngineError::internal("policy action", &e))?;
    let ev = match step.action {
        PolicyAction::Stop => lifecycle::stop_locked(st, &rec, step.reason, lifecycle::STOP_GRACE).await?,
        PolicyAction::Destroy => {
            drop(guard);
            lifecycle::destroy(st, id, true, step.reason).await?
        }
        PolicyAction::Standby => {
            drop(guard);
            crate::lifecycle::standby(st, id, step.reason).await?
        }
        PolicyAction::Archive => {
            drop(guard);
            crate::lifecycle::archive(st, id, step.reason).await?
        }
    };
    Ok(Some(ev))
}

/// A failed action and when it may be tried again.
struct Failure {
    step: Step,
    attempts: u32,
    retry_at: Instant,
}

/// Wait after `attempts` consecutive failures: 1, 2, 4, ... minutes, at most [`MAX_RETRY_AFTER`].
pub fn retry_delay(attempts: u32) -> Duration {
    RETRY_AFTER.saturating_mul(1 << attempts.saturating_sub(1).min(10)).min(MAX_RETRY_AFTER)
}

/// Records a failed automatic action as an event on the sandbox.
fn record_failure(st: &Shared, id: &str, step: Step, err: &EngineError, retry_in: Duration) {
    let reason = if step.reason == "idle_timeout" { "idle_action_failed" } else { "policy_action_failed" };
    warn!(sandbox = id, action = step.action.as_str(), trigger = step.reason, error = %err.body.message, retry_in_s = retry_in.as_secs(), "automatic lifecycle action failed");
    let Ok(Some(rec)) = st.db.sandbox_by_id(id) else { return };
    let detail = format!(
        "{}: {} failed: {} (retrying in {}s)",
        step.reason,
        step.action.as_str(),
        err.body.message,
        retry_in.as_secs()
    );
    match st.db.record_event(id, rec.sandbox.state, reason, Some(&detail), &now()) {
        Ok(ev) => st.notify_events(ev.seq),
        Err(e) => warn!(sandbox = id, error = %crate::error::chain(&e), "recording a failed lifecycle action"),
    }
}

/// Runs forever: applies every sandbox's lifecycle policy.
pub async fn run(st: Shared) {
    // The first pass runs at once; then every TICK, sooner when a lifetime falls
    // due before that, or when a policy changed.
    let mut next_pass = Duration::ZERO;
    let (done_tx, mut done_rx) =
        tokio::sync::mpsc::unbounded_channel::<(String, Step, EngineResult<Option<SandboxEvent>>)>();
    let mut in_flight: HashSet<String> = HashSet::new();
    let mut failures: HashMap<String, Failure> = HashMap::new();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(next_pass) => {}
            _ = st.policy_changed.notified() => {}
        }
        next_pass = TICK;
        while let Ok((id, step, result)) = done_rx.try_recv() {
            in_flight.remove(&id);
            match result {
                Ok(_) => {
                    failures.remove(&id);
                }
                Err(e) => {
                    let attempts = failures.get(&id).filter(|f| f.step == step).map_or(1, |f| f.attempts + 1);
                    let delay = retry_delay(attempts);
                    record_failure(&st, &id, step, &e, delay);
                    failures.insert(id, Failure { step, attempts, retry_at: Instant::now() + delay });
                }
            }
        }
        crate::approvals::expire_pending(&st);
        let leases = match crate::activity::sweep_leases(&st) {
            Ok(l) => l,
            Err(e) => {
                warn!(error = %e.body.message, "reading leases");
                continue;
            }
        };
        let (ids, list) = match st.db.sandbox_ids().and_then(|ids| Ok((ids, st.db.list_policy_candidates()?))) {
            Ok(l) => l,
            Err(e) => {
                warn!(error = %crate::error::chain(&e), "listing sandboxes");
                continue;
            }
        };
        let known: HashSet<&str> = ids.iter().map(String::as_str).collect();
        st.activity.retain(&known);
        failures.retain(|id, _| known.contains(id.as_str()));
        for rec in &list {
            let id = &rec.sandbox.id;
            if in_flight.contains(id) {
                continue;
            }
            let snap = snapshot(&st, rec, leases.get(id).copied().unwrap_or(0));
            if let Some(due_in) = snap.as_ref().and_then(lifetime_due_in) {
                // A little after the deadline, so that the next pass finds it due.
                next_pass = next_pass.min(due_in + Duration::from_millis(5));
            }
            let due = snap.and_then(|s| decide(&s));
            let Some(step) = due else {
                failures.remove(id);
                continue;
            };
            if failures.get(id).is_some_and(|f| f.step == step && Instant::now() < f.retry_at) {
                continue;
            }
            in_flight.insert(id.clone());
            let (st2, id2, tx) = (st.clone(), id.clone(), done_tx.clone());
            // The policy loop runs as the daemon; so does each transition it starts.
            crate::tenancy::spawn(async move {
                // A panic must not leave the sandbox marked in flight forever.
                let result =
                    futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(apply(&st2, &id2, step)))
                        .await
                        .unwrap_or_else(|_| {
                            Err(EngineError::new(strata_api::ErrorCode::Internal, "the lifecycle action panicked"))
                        });
                let _ = tx.send((id2, step, result));
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_api::PolicyPatch;

    const S: Duration = Duration::from_secs(1);

    fn limits(on_idle: OnIdle) -> Limits {
        Limits {
            on_idle,
            idle_timeout: 60 * S,
            max_lifetime: None,
            on_max_lifetime: None,
            archive_after: None,
            delete_after: None,
        }
    }

    /// A running persistent sandbox, up for an hour and quiet for 10 minutes.
    fn running() -> Snapshot {
        Snapshot {
            state: SandboxState::Running,
            lifecycle: Lifecycle::Persistent,
            limits: limits(OnIdle::Stop),
            age: 3600 * S,
            in_state_for: 3600 * S,
            inactive_for: None,
            quiet_for: 600 * S,
            running_processes: 0,
            open_streams: 0,
            leases: 0,
        }
    }

    fn stopped(for_: Duration) -> Snapshot {
        Snapshot { state: SandboxState::Stopped, in_state_for: for_, inactive_for: Some(for_), ..running() }
    }

    #[test]
    fn idle_past_the_timeout_applies_on_idle() {
        let idle = Some(Step { action: PolicyAction::Stop, reason: "idle_timeout" });
        assert_eq!(decide(&running()), idle);
        for (on_idle, action) in [
            (OnIdle::Standby, Some(PolicyAction::Standby)),
            (OnIdle::Destroy, Some(PolicyAction::Destroy)),
            (OnIdle::Keep, None),
        ] {
            let s = Snapshot { limits: limits(on_idle), ..running() };
            assert_eq!(decide(&s).map(|x| x.action), action, "{on_idle}");
        }
        // Paused counts like running, except that its (frozen) processes do not keep it awake.
        assert_eq!(decide(&Snapshot { state: SandboxState::Paused, ..running() }), idle);
        assert_eq!(decide(&Snapshot { state: SandboxState::Paused, running_processes: 2, ..running() }), idle);
        assert_eq!(decide(&Snapshot { state: SandboxState::Paused, open_streams: 1, ..running() }), None);
        // Not yet: quiet for less than the timeout, or started less than the timeout ago.
        assert_eq!(decide(&Snapshot { quiet_for: 59 * S, ..running() }), None);
        assert_eq!(decide(&Snapshot { in_state_for: 30 * S, ..running() }), None, "a fresh start is activity");
        // Creating, error, lost: no idle action.
        for state in [SandboxState::Creating, SandboxState::Error, SandboxState::Lost] {
            assert_eq!(decide(&Snapshot { state, ..running() }), None, "{state}");
        }
    }

    #[test]
    fn processes_streams_and_leases_keep_it_awake() {
        for s in [
            Snapshot { running_processes: 1, ..running() },
            Snapshot { open_streams: 2, ..running() },
            Snapshot { leases: 1, ..running() },
        ] {
            assert!(busy_reason(&s).is_some());
            assert_eq!(idle_for(&s), None);
            assert_eq!(decide(&s), None, "{s:?}");
        }
        assert_eq!(idle_for(&running()), Some(600 * S));
    }

    #[test]
    fn max_lifetime_ends_a_run_even_when_busy_or_kept() {
        let l = Limits { max_lifetime: Some(1800 * S), ..limits(OnIdle::Keep) };
        let busy = Snapshot { limits: l, leases: 1, running_processes: 3, ..running() };
        assert_eq!(decide(&busy), Some(Step { action: PolicyAction::Stop, reason: "max_lifetime" }));
        let eph = Snapshot { lifecycle: Lifecycle::Ephemeral, ..busy };
        assert_eq!(decide(&eph), Some(Step { action: PolicyAction::Destroy, reason: "max_lifetime" }));
        // Not reached yet.
        assert_eq!(decide(&Snapshot { age: 1799 * S, in_state_for: 1799 * S, ..busy }), None);
        // Started by hand after the deadline: left alone.
        assert_eq!(decide(&Snapshot { in_state_for: 60 * S, ..busy }), None);
        // max_lifetime wins over idleness.
        let idle = Snapshot { limits: Limits { max_lifetime: Some(1800 * S), ..limits(OnIdle::Standby) }, ..running() };
        assert_eq!(decide(&idle).unwrap().reason, "max_lifetime");
        // on_max_lifetime chooses the action, whatever the lifecycle.
        for (on, action) in [
            (OnIdle::Standby, PolicyAction::Standby),
            (OnIdle::Stop, PolicyAction::Stop),
            (OnIdle::Destroy, PolicyAction::Destroy),
        ] {
            let l = Limits { on_max_lifetime: Some(on), ..l };
            assert_eq!(decide(&Snapshot { limits: l, ..busy }), Some(Step { action, reason: "max_lifetime" }));
            assert_eq!(decide(&Snapshot { limits: l, ..eph }), Some(Step { action, reason: "max_lifetime" }));
        }
    }

    #[test]
    fn the_loop_wakes_when_a_lifetime_falls_due() {
        let l = Limits { max_lifetime: Some(1800 * S), ..limits(OnIdle::Keep) };
        let s = Snapshot { limits: l, age: 1799 * S, in_state_for: 1799 * S, ..running() };
        assert_eq!(lifetime_due_in(&s), Some(S));
        assert_eq!(lifetime_due_in(&Snapshot { age: 1800 * S, in_state_for: 1800 * S, ..s }), None, "due: decide acts");
        assert_eq!(lifetime_due_in(&Snapshot { in_state_for: 60 * S, ..s }), Some(S), "a run that began in time");
        assert_eq!(lifetime_due_in(&Snapshot { state: SandboxState::Stopped, ..s }), None, "nothing runs");
        assert_eq!(lifetime_due_in(&running()), None, "no lifetime");
    }

    #[test]
    fn on_max_lifetime_keep_is_refused() {
        let e = validate(&PolicyPatch { on_max_lifetime: Some(OnIdle::Keep), ..Default::default() }).unwrap_err();
        assert!(e.body.message.contains("on_max_lifetime"), "{}", e.body.message);
        let mut p = SandboxPolicy::default_for(Lifecycle::Persistent);
        apply_patch(&mut p, &PolicyPatch { on_max_lifetime: Some(OnIdle::Standby), ..Default::default() });
        assert_eq!(p.on_max_lifetime, Some(OnIdle::Standby));
    }

    #[test]
    fn parked_sandboxes_are_archived_then_deleted() {
        let l = Limits { archive_after: Some(3600 * S), delete_after: Some(7200 * S), ..limits(OnIdle::Stop) };
        assert_eq!(decide(&Snapshot { limits: l, ..stopped(100 * S) }), None);
        let archive = Some(Step { action: PolicyAction::Archive, reason: "archive_after" });
        assert_eq!(decide(&Snapshot { limits: l, ..stopped(3600 * S) }), archive);
        assert_eq!(decide(&Snapshot { limits: l, state: SandboxState::Standby, ..stopped(3600 * S) }), archive);
        // Archived is not archived again, but is deleted in time.
        assert_eq!(decide(&Snapshot { limits: l, state: SandboxState::Archived, ..stopped(3600 * S) }), None);
        let delete = Some(Step { action: PolicyAction::Destroy, reason: "delete_after" });
        assert_eq!(decide(&Snapshot { limits: l, state: SandboxState::Archived, ..stopped(7200 * S) }), delete);
        // Delete wins when both are due.
        assert_eq!(decide(&Snapshot { limits: l, ..stopped(9000 * S) }), delete);
        // A lease holds retention off.
        assert_eq!(decide(&Snapshot { limits: l, leases: 1, ..stopped(9000 * S) }), None);
        // No limits: nothing happens.
        assert_eq!(decide(&stopped(1_000_000 * S)), None);
    }

    #[test]
    fn patches_validate_and_merge() {
        let mut p = SandboxPolicy::default_for(Lifecycle::Persistent);
        assert_eq!(p.on_idle, OnIdle::Standby);
        assert_eq!(SandboxPolicy::default_for(Lifecycle::Ephemeral).on_idle, OnIdle::Destroy);
        let patch = PolicyPatch {
            on_idle: Some(OnIdle::Stop),
            max_lifetime: Some("2h".into()),
            delete_after: Some("7d".into()),
            ..Default::default()
        };
        validate(&patch).unwrap();
        apply_patch(&mut p, &patch);
        assert_eq!(
            (p.on_idle, p.idle_timeout.as_str(), p.max_lifetime.as_deref(), p.delete_after.as_deref()),
            (OnIdle::Stop, "15m", Some("2h"), Some("7d"))
        );
        apply_patch(&mut p, &PolicyPatch { max_lifetime: Some("none".into()), ..Default::default() });
        assert_eq!(p.max_lifetime, None);
        assert_eq!(Limits::of(&p).unwrap().delete_after, Some(7 * 86400 * S));
        assert!(validate(&PolicyPatch { idle_timeout: Some("soon".into()), ..Default::default() }).is_err());
        assert!(validate(&PolicyPatch { idle_timeout: Some("none".into()), ..Default::default() }).is_err());
        assert!(validate(&PolicyPatch { archive_after: Some("0s".into()), ..Default::default() }).is_err());
        assert!(initial(
            Lifecycle::Ephemeral,
            Some(&PolicyPatch { delete_after: Some("x".into()), ..Default::default() })
        )
        .is_err());
    }

    #[test]
    fn retries_back_off_from_a_minute() {
        assert_eq!(retry_delay(1), RETRY_AFTER);
        assert_eq!(retry_delay(2), 2 * RETRY_AFTER);
        assert_eq!(retry_delay(50), MAX_RETRY_AFTER);
        assert!((1..100).all(|n| retry_delay(n) >= Duration::from_secs(60)));
    }
}
