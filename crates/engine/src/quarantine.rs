//! Quarantine: a sandbox or checkpoint that must not spread. It can still be
//! inspected, diffed, exported and destroyed, but not forked, promoted to a
//! template, restored into a new sandbox or given egress. Anyone who may see
//! the object may place one (a check's `on_findings: quarantine` does too);
//! lifting it is the operator's, with a reason, recorded in the events and
//! the audit log.
//!
//! A checkpoint of a quarantined sandbox is born quarantined (`by: inherited`),
//! so checkpointing is no way around it. Placing one on a sandbox with egress
//! cuts its network to `none` and keeps the old spec with the quarantine;
//! lifting puts it back (or says why it could not).

use strata_api::{Checkpoint, ErrorCode, NetworkMode, NetworkSpec, Quarantine, QuarantineEntry, Sandbox, SandboxState};
use tracing::{info, warn};

use crate::error::{EngineError, EngineResult};
use crate::record::now;
use crate::state::Shared;
use crate::tenancy::{find_sandbox_or_checkpoint, NamesFirst, SandboxOrCheckpoint};

/// Longest reason kept.
const MAX_REASON: usize = 1000;

/// 409 `quarantined`: `what` is refused on `kind` `name` while `q` holds.
fn refused(kind: &str, name: &str, q: &Quarantine, what: &str) -> EngineError {
    EngineError::new(
        ErrorCode::Quarantined,
        format!(
            "{kind} {name} is quarantined (since {}, by {}: {}); it cannot {what} until an operator lifts it (`strata quarantine lift`)",
            q.since, q.by, q.reason
        ),
    )
}

/// Refuses `what` on a quarantined sandbox.
pub fn refuse_sandbox(sb: &Sandbox, what: &str) -> EngineResult<()> {
    match &sb.quarantine {
        Some(q) => Err(refused("sandbox", &sb.name, q, what)),
        None => Ok(()),
    }
}

/// Refuses `what` on a quarantined checkpoint.
pub fn refuse_checkpoint(c: &Checkpoint, what: &str) -> EngineResult<()> {
    match &c.quarantine {
        Some(q) => Err(refused("checkpoint", &c.name, q, what)),
        None => Ok(()),
    }
}

/// The quarantine a new checkpoint of `sb` is born with.
pub fn inherited(sb: &Sandbox) -> Option<Quarantine> {
    sb.quarantine.as_ref().map(|q| inherited_from(&sb.name, q))
}

fn inherited_from(sandbox: &str, q: &Quarantine) -> Quarantine {
    Quarantine {
        reason: format!("taken from quarantined sandbox {sandbox}: {}", q.reason),
        since: now(),
        by: "inherited".into(),
        network_before: None,
    }
}

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
                return Err(crate::checkpoints::not_found(key));
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

    fn q() -> Quarantine {
        Quarantine { reason: "leaked key".into(), since: "t0".into(), by: "check".into(), network_before: None }
    }

    #[test]
    fn refusals_name_the_object_the_reason_and_the_way_out() {
        let e = refused("sandbox", "agent", &q(), "be forked");
        assert_eq!(e.code(), ErrorCode::Quarantined);
        for part in ["sandbox agent", "leaked key", "by check", "be forked", "strata quarantine lift"] {
            assert!(e.body.message.contains(part), "{part:?} in {}", e.body.message);
        }
        let born = inherited_from("agent", &q());
        assert_eq!(born.by, "inherited");
        assert!(born.reason.contains("agent") && born.reason.contains("leaked key"), "{}", born.reason);
    }

    #[test]
    fn reasons_are_required_and_bounded() {
        assert!(checked_reason("  ").is_err());
        assert!(checked_reason(&"x".repeat(MAX_REASON + 1)).is_err());
        assert_eq!(checked_reason(" ok ").unwrap(), "ok");
    }
}
