//! Whether a caller may reach an object a key names, before the operation on
//! it runs: the tenancy check of routes whose first path parameter names an
//! owned object (the server's `guard` applies it from its route table).
//! Above the operations (it names their 404s); nothing below may use it.

use strata_api::ErrorCode;

use crate::error::{EngineError, EngineResult};
use crate::state::Shared;
use crate::tenancy::scope;

/// What kind of owned object a key names, for [`may_reach`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owned {
    /// A sandbox by id, name or prefix among the caller's own (destroyed ones by id, via their usage record).
    Sandbox,
    /// A sandbox's cost record (destroyed sandboxes included).
    Usage,
    /// A checkpoint.
    Checkpoint,
    /// A template by name.
    Template,
    /// A pipeline run.
    Pipeline,
    /// A sandbox or else a checkpoint (lineage, scan).
    SandboxOrCheckpoint,
    /// A Rule-of-Two approval.
    Approval,
}

/// The 404 an unknown `key` of `kind` gets; an object of another tenant gets exactly this.
pub fn unknown(kind: Owned, key: &str) -> EngineError {
    match kind {
        Owned::Sandbox | Owned::Usage => EngineError::sandbox_not_found(key),
        Owned::Checkpoint => crate::checkpoints::not_found(key),
        Owned::Template => crate::templates::not_found(key),
        Owned::Pipeline => crate::pipelines::not_found(key),
        Owned::SandboxOrCheckpoint => {
            EngineError::new(ErrorCode::SandboxNotFound, format!("no sandbox or checkpoint named {key:?}"))
        }
        Owned::Approval => crate::approvals::not_found(key),
    }
}

/// Whether the current caller may reach the object `key` of `kind` names
/// (always, for a caller that sees every tenant). The key is resolved among
/// the caller's own objects only (so another tenant's names and ids neither
/// shadow nor make ambiguous what the caller names); a key that resolves to
/// nothing there is reachable when it is not the exact id of another tenant's
/// object (the operation answers it: unknown, or for the caller's own
/// destroyed sandbox a 409), and is refused like an unknown key otherwise.
pub fn may_reach(st: &Shared, kind: Owned, key: &str) -> EngineResult<bool> {
    let Some(scope) = scope() else { return Ok(true) };
    let s = Some(scope.as_str());
    let mine_or_unknown = |tenant: Option<String>| tenant.is_none_or(|t| t == scope);
    // A destroyed sandbox: its usage record remembers the tenant.
    let sandbox = |key: &str| -> EngineResult<bool> {
        Ok(st.db.find_sandbox(key, s)?.is_some() || mine_or_unknown(st.db.sandbox_tenant_by_id(key)?))
    };
    let checkpoint = |key: &str| -> EngineResult<bool> {
        Ok(st.db.find_checkpoint(key, s)?.is_some()
            || mine_or_unknown(st.db.checkpoint_by_id(key)?.map(|(c, _)| c.tenant)))
    };
    Ok(match kind {
        Owned::Sandbox => sandbox(key)?,
        Owned::Usage => {
            st.db.find_usage(key, s)?.is_some() || mine_or_unknown(st.db.usage_by_id(key)?.map(|u| u.tenant))
        }
        Owned::Checkpoint => checkpoint(key)?,
        Owned::Template => st.db.template_tenant(key)?.is_none_or(|t| t == scope),
        Owned::Pipeline => {
            st.db.find_pipeline_run(key, s)?.is_some()
                || mine_or_unknown(st.db.pipeline_run_by_id(key)?.map(|r| r.tenant))
        }
        Owned::Approval => st.db.get_approval(key)?.is_none_or(|a| a.tenant == scope),
        Owned::SandboxOrCheckpoint => sandbox(key)? && checkpoint(key)?,
    })
}
