//! Events ([`list`], and [`reader`] and [`sandbox_key`] for front ends that
//! follow them) and host facts the engine checks itself: names left from
//! before names that read as ids were refused ([`names_like_ids`]).
//! `/v1/info` and `/v1/doctor` are the server's routes.

use strata_api::SandboxEvent;

use crate::error::EngineResult;
use crate::state::Shared;

/// Most events one listing returns.
pub const LIST_LIMIT: u32 = 10_000;

/// The sandbox id a `sandbox` filter names for the current caller: the id of
/// its own sandbox the key resolves to, or the key as given (a destroyed
/// sandbox's id, whose events are still kept).
pub fn sandbox_key(st: &Shared, key: &str) -> EngineResult<String> {
    Ok(crate::tenancy::find_sandbox(st, key)?.map(|r| r.sandbox.id).unwrap_or_else(|| key.to_string()))
}

/// A reader of events for the current caller: a tenant reads the events of
/// its own sandboxes (live or destroyed) only. The scope is taken now, so the
/// reader can be used from tasks that have no caller (a follower).
pub fn reader() -> impl Fn(&Shared, Option<&str>, i64, u32) -> Result<Vec<SandboxEvent>, strata_store::DbError> {
    let scope = crate::tenancy::scope();
    move |st, sandbox, after, limit| match &scope {
        Some(t) => st.db.events_of_tenant(t, sandbox, after, limit),
        None => st.db.events(sandbox, after, limit),
    }
}

/// Events after `after` (of the sandbox `sandbox` names, when given) that the
/// current caller may see, oldest first (at most [`LIST_LIMIT`]).
pub fn list(st: &Shared, sandbox: Option<&str>, after: i64) -> EngineResult<Vec<SandboxEvent>> {
    let sandbox = sandbox.map(|s| sandbox_key(st, s)).transpose()?;
    Ok(reader()(st, sandbox.as_deref(), after, LIST_LIMIT)?)
}

/// Names in the metadata that could be read as ids (from before such names
/// were refused), each logged as a warning: they still resolve, by id first,
/// but one can win over another object's id *prefix* for whoever sees both.
pub fn names_like_ids(st: &Shared) -> EngineResult<Vec<strata_api::NameLikeId>> {
    let found = st.db.names_like_ids()?;
    for n in &found {
        tracing::warn!(kind = %n.kind, id = %n.id, name = %n.name, tenant = n.tenant.as_deref().unwrap_or("-"), "a name that could be read as an id (made before such names were refused); it resolves by id first, but use ids for it");
    }
    Ok(found)
}
