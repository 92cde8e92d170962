//! The Rule of Two's gate and approval queue.
//!
//! Every request that could give a sandbox a capability (create, fork,
//! network change, capability declaration, preview, export) computes the
//! capabilities the sandbox would hold ([`strata_core::rule_of_two`]) and calls
//! [`gate`]. With at most two of them it passes. With all three the request is
//! refused with 403 `approval_required` and becomes a pending [`Approval`],
//! bound by a fingerprint to exactly that action, target and capability set.
//! An operator (a human: tenant tokens cannot decide) approves or denies it;
//! a pending approval not decided within the timeout is denied. The same
//! request, repeated (with or without `X-Strata-Approval`), then goes through
//! once. Requests, decisions, uses and timeouts are in the audit log.

use std::time::SystemTime;

use strata_api::{Approval, ApprovalState, CapabilityGrant, ErrorCode};
use strata_core::lifecycle::approval::{next_approval_state, ApprovalAction};
use strata_core::rule_of_two;
use tracing::{info, warn};

use crate::error::{EngineError, EngineResult};
use crate::state::Shared;

/// Default time a pending approval waits for a decision (and an approved one for its use).
pub use crate::state::DEFAULT_APPROVAL_TIMEOUT as DEFAULT_TIMEOUT;

/// Errors of the approval queue that are not API answers.
#[derive(Debug, thiserror::Error)]
pub enum ApprovalError {
    /// A stored time does not parse.
    #[error("approval {id}: bad time {value:?}")]
    BadTime {
        /// Approval id.
        id: String,
        /// The stored value.
        value: String,
    },
}

/// Whether `s` has the shape of an approval id (`apr-` and 16 hex digits).
pub fn valid_id(s: &str) -> bool {
    s.strip_prefix("apr-").is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The 404 of an unknown approval (and of another tenant's).
pub fn not_found(id: &str) -> EngineError {
    EngineError::new(ErrorCode::ApprovalNotFound, format!("no approval {id:?} (see `strata approvals ls`)"))
}

fn fmt_time(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

fn expired(a: &Approval, now: SystemTime) -> Result<bool, ApprovalError> {
    let at = humantime::parse_rfc3339(&a.expires_at)
        .map_err(|_| ApprovalError::BadTime { id: a.id.clone(), value: a.expires_at.clone() })?;
    Ok(now > at)
}

fn audit(st: &Shared, a: &Approval, what: &str, actor: &str, status: u16) {
    if let Err(e) = st.db.append_audit(&strata_store::db::NewAudit {
        time: &crate::record::now(),
        actor,
        tenant: Some(&a.tenant),
        method: "APPROVAL",
        route: what,
        target: Some(&a.id),
        status,
    }) {
        warn!(error = %e, approval = %a.id, what, "audit log append failed");
    }
}

/// Denies `id` by timeout if it is pending past its expiry; returns the record as it is now.
pub fn settle(st: &Shared, id: &str) -> EngineResult<Option<Approval>> {
    let now = SystemTime::now();
    let mut timed_out = false;
    let r = st.db.update_approval(id, |a| {
        if a.state == ApprovalState::Pending && expired(a, now).unwrap_or(true) {
            let Ok(next) = next_approval_state(a.state, ApprovalAction::Expire) else { return false };
            a.state = next;
            a.decided_by = Some("timeout".into());
            a.decided_at = Some(fmt_time(now));
            a.reason = Some("no decision before the approval timed out".into());
            timed_out = true;
            true
        } else {
            false
        }
    })?;
    if let (Some((a, _)), true) = (&r, timed_out) {
        info!(approval = %a.id, tenant = %a.tenant, "approval timed out: denied");
        audit(st, a, "timed out (denied)", "timeout", 408);
    }
    Ok(r.map(|(a, _)| a))
}

/// Denies every pending approval past its timeout (the policy engine calls this each tick).
pub fn expire_pending(st: &Shared) {
    match st.db.expired_approvals(&fmt_time(SystemTime::now())) {
        Ok(ids) => {
            for id in ids {
                if let Err(e) = settle(st, &id) {
                    warn!(approval = %id, error = %e.body.message, "expiring approval");
                }
            }
        }
        Err(e) => warn!(error = %e, "listing expired approvals"),
    }
}

fn required(a: Approval, message: String) -> EngineError {
    let mut e = EngineError::new(ErrorCode::ApprovalRequired, message);
    e.body.approval = Some(Box::new(a));
    e
}

fn summary(grants: &[CapabilityGrant]) -> String {
    grants.iter().map(|g| format!("{} ({})", g.capability, g.because)).collect::<Vec<_>>().join("; ")
}

/// The Rule of Two's check of one request: `action` on `target` (in `tenant`)
/// would leave the sandbox with `grants`. Passes when they are at most two
/// capabilities, or when an approved approval for exactly this request exists
/// (it is then used up). Otherwise answers 403 `approval_required` with the
/// pending approval (a new one, or the one already waiting for this request),
/// or 403 `forbidden` when the cited approval was denied.
pub fn gate(st: &Shared, tenant: &str, action: &str, target: &str, grants: &[CapabilityGrant]) -> EngineResult<()> {
    if !rule_of_two::holds_all_three(grants) {
        return Ok(());
    }
    let fingerprint = crate::tenancy::secret_hash(&rule_of_two::fingerprint_input(action, target, grants));
    let caller = crate::tenancy::current();
    let actor = caller.as_ref().map_or_else(|| "daemon".to_string(), |c| c.actor());
    let mut note = String::new();
    if let Some(cited) = caller.as_ref().and_then(|c| c.approval.clone()) {
        let a = settle(st, &cited)?.filter(|a| a.tenant == tenant).ok_or_else(|| not_found(&cited))?;
        match a.state {
            ApprovalState::Denied => {
                let mut e = EngineError::new(
                    ErrorCode::Forbidden,
                    format!(
                        "approval {} was denied by {}{}",
                        a.id,
                        a.decided_by.as_deref().unwrap_or("?"),
                        a.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default()
                    ),
                );
                e.body.approval = Some(Box::new(a));
                return Err(e);
            }
            ApprovalState::Pending if a.fingerprint == fingerprint => {
                let msg = format!(
                    "approval {} is still pending (an operator decides with `strata approvals approve|deny {}`)",
                    a.id, a.id
                );
                return Err(required(a, msg));
            }
            _ if a.fingerprint != fingerprint => {
                note = format!(" (approval {} was given for a different request)", a.id)
            }
            ApprovalState::Used => note = format!(" (approval {} was already used)", a.id),
            _ => {}
        }
    }
    let now = SystemTime::now();
    if let Some(open) = st.db.open_approval(tenant, &fingerprint)? {
        let open = settle(st, &open.id)?.unwrap_or(open);
        match open.state {
            ApprovalState::Approved if !expired(&open, now).unwrap_or(true) => {
                let used_at = fmt_time(now);
                let (a, used) = st
                    .db
                    .update_approval(&open.id, |a| {
                        let next = next_approval_state(a.state, ApprovalAction::Use);
                        let ok = next.is_ok();
                        if let Ok(next) = next {
                            a.state = next;
                            a.used_at = Some(used_at.clone());
                        }
                        ok
                    })?
                    .ok_or_else(|| not_found(&open.id))?;
                if used {
                    info!(approval = %a.id, tenant, action, target, "approved request goes through");
                    audit(st, &a, "used", &actor, 200);
                    return Ok(());
                }
            }
            ApprovalState::Approved => note = format!(" (approval {} expired before it was used)", open.id),
            ApprovalState::Pending => {
                let msg = format!(
                    "{action} {target} would hold all three Rule-of-Two capabilities: {}; approval {} is pending",
                    summary(grants),
                    open.id
                );
                return Err(required(open, msg));
            }
            _ => {}
        }
    }
    let timeout = st.approval_timeout;
    let a = Approval {
        id: format!("apr-{}", strata_core::ids::new_id()),
        tenant: tenant.to_string(),
        state: ApprovalState::Pending,
        action: action.to_string(),
        target: target.to_string(),
        capabilities: grants.to_vec(),
        requested_by: actor.clone(),
        requested_at: fmt_time(now),
        expires_at: fmt_time(now + timeout),
        decided_by: None,
        decided_at: None,
        reason: None,
        used_at: None,
        fingerprint,
    };
    st.db.insert_approval(&a)?;
    info!(approval = %a.id, tenant, action, target, capabilities = %summary(grants), "approval required");
    audit(st, &a, "requested", &actor, 403);
    let msg = format!(
        "{action} {target} would hold all three Rule-of-Two capabilities: {}; approval {} is pending{note} (an operator decides with `strata approvals approve|deny {}` within {}; then repeat the request)",
        summary(grants),
        a.id,
        a.id,
        humantime::format_duration(timeout)
    );
    Err(required(a, msg))
}

/// Approves or denies a pending approval as the current caller.
pub fn decide(st: &Shared, id: &str, approve: bool, reason: Option<String>) -> EngineResult<Approval> {
    let a = settle(st, id)?.filter(|a| crate::tenancy::visible(&a.tenant)).ok_or_else(|| not_found(id))?;
    let actor = crate::tenancy::current().map_or_else(|| "daemon".to_string(), |c| c.actor());
    let now = SystemTime::now();
    let timeout = st.approval_timeout;
    let (a, changed) = st
        .db
        .update_approval(&a.id, |a| {
            let action = if approve { ApprovalAction::Approve } else { ApprovalAction::Deny };
            let Ok(next) = next_approval_state(a.state, action) else { return false };
            a.state = next;
            a.decided_by = Some(actor.clone());
            a.decided_at = Some(fmt_time(now));
            a.reason = reason.clone();
            if approve {
                // The approved request must come back within one more timeout.
                a.expires_at = fmt_time(now + timeout);
            }
            true
        })?
        .ok_or_else(|| not_found(id))?;
    if !changed {
        let mut e = EngineError::new(
            ErrorCode::InvalidState,
            format!("approval {} is already {} (decided by {})", a.id, a.state, a.decided_by.as_deref().unwrap_or("?")),
        );
        e.body.approval = Some(Box::new(a));
        return Err(e);
    }
    info!(approval = %a.id, tenant = %a.tenant, state = %a.state, by = %actor, "approval decided");
    Ok(a)
}

/// The approvals of the current caller's tenant (every tenant's for the
/// operator), in state `state` when given (`pending`, `approved`, `denied`,
/// `used`); pending ones past their time are expired first.
pub fn list(st: &Shared, state: Option<&str>) -> EngineResult<Vec<Approval>> {
    let state = match state {
        None => None,
        Some(s) => Some(ApprovalState::parse(s).ok_or_else(|| {
            EngineError::bad_request(format!("unknown approval state {s:?} (pending, approved, denied, used)"))
        })?),
    };
    expire_pending(st);
    Ok(st.db.list_approvals(crate::tenancy::scope().as_deref(), state)?)
}

/// One approval the current caller may see, settled (expired if its time passed).
pub fn get(st: &Shared, id: &str) -> EngineResult<Approval> {
    settle(st, id)?.filter(|a| crate::tenancy::visible(&a.tenant)).ok_or_else(|| not_found(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn approval_ids_have_one_shape() {
        assert!(valid_id("apr-0123456789abcdef"));
        for bad in ["apr-", "apr-0123", "0123456789abcdef", "apr-0123456789abcdeg", "apr-0123456789abcdef0"] {
            assert!(!valid_id(bad), "{bad}");
        }
    }
}
