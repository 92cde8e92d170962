//! Sandbox records: reading them for a caller ([`load`], [`lock_and_load`],
//! [`list`], [`inspect`]) and recording their changes ([`transition`]: every
//! state change asks the core state machine whether it is legal and records it,
//! with its event, in one transaction), and the facts the Rule of Two reads
//! from a sandbox ([`exposure`]). The lowest layer of the lifecycle: the
//! operations ([`crate::lifecycle`]) and every other module build on it; it
//! calls none of them.

use std::time::{Instant, SystemTime};

use strata_api::{ErrorCode, Sandbox, SandboxEvent, SandboxState};
use strata_core::lifecycle::next_state;
use strata_core::{rule_of_two, units, Action};
use strata_runtime::SandboxHandle;
use strata_store::db::{SandboxRecord, Transition};
use tracing::info;

use crate::error::{EngineError, EngineResult};
use crate::state::Shared;

pub use crate::clock::*;

/// Loads a sandbox the current caller may see ([`crate::tenancy`]) or fails with 404.
pub fn load(st: &Shared, id: &str) -> EngineResult<SandboxRecord> {
    crate::tenancy::find_sandbox(st, id)?.ok_or_else(|| EngineError::sandbox_not_found(id))
}

/// Loads a sandbox a transition is asked of: one that was destroyed is a 409
/// with state `destroyed` (the event log remembers its id); an id never seen is a 404.
pub fn load_for_transition(st: &Shared, id: &str) -> EngineResult<SandboxRecord> {
    match crate::tenancy::find_sandbox(st, id)? {
        Some(rec) => Ok(rec),
        None if st.db.sandbox_tenant_by_id(id)?.is_some_and(|t| !crate::tenancy::visible(&t)) => {
            Err(EngineError::sandbox_not_found(id))
        }
        None => match st.db.destroyed_event(id)? {
            Some(ev) => Err(EngineError::invalid_state(
                SandboxState::Destroyed,
                format!("sandbox {id} was destroyed at {} ({})", ev.time, ev.reason),
            )),
            None => Err(EngineError::sandbox_not_found(id)),
        },
    }
}

/// Takes a sandbox's operation lock (one transition at a time) and loads its
/// record as it is under the lock ([`load_for_transition`]). Keep the guard
/// while changing the sandbox.
pub async fn lock_and_load(st: &Shared, id: &str) -> EngineResult<(tokio::sync::OwnedMutexGuard<()>, SandboxRecord)> {
    let rec = load_for_transition(st, id)?;
    let guard = st.lock_for(&rec.sandbox.id).lock_owned().await;
    Ok((guard, load(st, &rec.sandbox.id)?))
}

/// The init handle of a record in a state with processes.
pub fn handle_of(rec: &SandboxRecord) -> Option<SandboxHandle> {
    Some(SandboxHandle { init_pid: rec.sandbox.init_pid?, init_start_time: rec.init_start_time? })
}

/// A requested state change: the action and why.
#[derive(Debug, Clone, Copy)]
pub struct Change<'a> {
    /// What to do.
    pub action: Action,
    /// Reason code recorded in the event.
    pub reason: &'a str,
    /// Optional detail recorded in the event.
    pub detail: Option<&'a str>,
}

impl<'a> Change<'a> {
    /// A change with a reason and no detail.
    pub fn new(action: Action, reason: &'a str) -> Self {
        Change { action, reason, detail: None }
    }

    /// Adds a detail.
    pub fn detail(mut self, detail: &'a str) -> Self {
        self.detail = Some(detail);
        self
    }
}

/// Applies `action` to a sandbox in state `from`: checks the transition table,
/// records the new state and its event atomically, and wakes event followers.
pub fn transition(
    st: &Shared,
    id: &str,
    from: SandboxState,
    change: Change<'_>,
    started: Instant,
    init: Option<&SandboxHandle>,
) -> EngineResult<SandboxEvent> {
    let Change { action, reason, detail } = change;
    let to = next_state(from, action)?;
    // Error messages may quote a process's words: never a secret's value.
    let redacted = detail.map(|d| st.secrets.get_or_empty(id).redact_str(d));
    let detail = redacted.as_deref();
    let t = Transition { to, reason, detail, duration_ms: started.elapsed().as_millis() as u64, time: &now() };
    let ev = st
        .db
        .transition(id, from, &t, init.map(|h| (h.init_pid, h.init_start_time)))?
        .ok_or_else(|| EngineError::new(ErrorCode::InvalidState, format!("sandbox {id} changed state concurrently")))?;
    info!(sandbox = id, from = %from, to = %to, reason, "transition");
    st.metrics.transition(to, reason);
    if let Some(phase) = crate::state::metrics::phase_of(action) {
        st.metrics.observe(phase, started.elapsed());
    }
    crate::state::accounting::on_transition(
        &st.accounting,
        &st.db,
        st.runtime_by_id(id).as_ref(),
        id,
        from,
        to,
        action,
    );
    st.notify_events(ev.seq);
    Ok(ev)
}

/// The RFC 3339 time `ttl` from now (`None` without a TTL).
pub fn expiry(ttl: Option<&str>) -> EngineResult<Option<String>> {
    match ttl {
        None => Ok(None),
        Some(t) => {
            let d = units::parse_duration(t)?;
            Ok(Some(humantime::format_rfc3339_millis(SystemTime::now() + d).to_string()))
        }
    }
}

/// Refreshes the OOM counter of a sandbox from its cgroup; records an `oom`
/// event when it grew. Returns the new count.
pub fn refresh_oom(st: &Shared, rec: &SandboxRecord) -> u64 {
    let n = st.runtime_of(&rec.sandbox).usage(&rec.sandbox.id).oom_kills;
    if n > rec.sandbox.oom_kills {
        let _ = st.db.set_oom_kills(&rec.sandbox.id, n);
        let detail = format!(
            "{} process(es) killed by the OOM killer inside the memory limit of {} bytes",
            n - rec.sandbox.oom_kills,
            rec.sandbox.limits.memory_bytes.unwrap_or(0)
        );
        if let Ok(ev) = st.db.record_event(&rec.sandbox.id, rec.sandbox.state, "oom", Some(&detail), &now()) {
            st.notify_events(ev.seq);
        }
    }
    n.max(rec.sandbox.oom_kills)
}

/// The sandboxes the current caller may see, with their secrets' names.
pub fn list(st: &Shared) -> EngineResult<Vec<Sandbox>> {
    Ok(st
        .db
        .list_sandboxes()?
        .into_iter()
        .filter(|r| crate::tenancy::visible(&r.sandbox.tenant))
        .map(|r| with_secret_names(st, r.sandbox))
        .collect())
}

/// A sandbox as inspected: its record with what is read live (OOM kills of a
/// sandbox with processes, the standby image's description, the names of its
/// secrets).
pub fn inspect(st: &Shared, key: &str) -> EngineResult<Sandbox> {
    let rec = load(st, key)?;
    let mut sb = rec.sandbox.clone();
    if strata_core::lifecycle::has_processes(sb.state) {
        sb.oom_kills = refresh_oom(st, &rec);
    }
    if sb.state == SandboxState::Standby {
        sb.standby = crate::process_image::info(st, &sb.id);
    }
    Ok(with_secret_names(st, sb))
}

/// Fills in a sandbox's secrets (names and sizes; values never leave the store).
pub fn with_secret_names(st: &Shared, mut sb: Sandbox) -> Sandbox {
    sb.secrets = st.secrets.get_or_empty(&sb.id).refs();
    sb.network = st.network.spec_of(&sb.id);
    let facts = exposure_facts(st, &sb);
    sb.capabilities = rule_of_two::grants(&exposure(&sb, &facts));
    sb
}

/// What the Rule of Two looks at besides a sandbox's view: the names of its
/// secrets and the ports of its live previews (0: every port).
#[derive(Debug, Clone, Default)]
pub struct ExposureFacts {
    /// Secret names.
    pub secret_names: Vec<String>,
    /// Ports of previews that are neither revoked nor expired.
    pub preview_ports: Vec<u16>,
}

/// The [`ExposureFacts`] of a sandbox view (its secrets filled in, see [`with_secret_names`]).
pub fn exposure_facts(st: &Shared, sb: &Sandbox) -> ExposureFacts {
    let now = std::time::SystemTime::now();
    let preview_ports = st
        .db
        .list_previews(&sb.id)
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.revoked_at.is_none() && humantime::parse_rfc3339_weak(&p.expires_at).is_ok_and(|e| e > now))
        .map(|p| p.port.unwrap_or(0))
        .collect();
    ExposureFacts { secret_names: sb.secrets.iter().map(|r| r.name.clone()).collect(), preview_ports }
}

/// What a sandbox (its view with secrets and network filled in) exposes, for the Rule of Two.
pub fn exposure<'a>(sb: &'a Sandbox, facts: &'a ExposureFacts) -> rule_of_two::Exposure<'a> {
    rule_of_two::Exposure {
        declared: &sb.policy.capabilities,
        secrets: &facts.secret_names,
        network: Some(&sb.network),
        previews: &facts.preview_ports,
        ..Default::default()
    }
}
