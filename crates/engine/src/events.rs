//! Events ([`list`], [`follow`]) and what the daemon says about itself: its
//! [`info`] and the host's capabilities ([`doctor`], with names left from
//! before names that read as ids were refused: [`names_like_ids`]).

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

/// Lifecycle events after `after` (of one sandbox when `sandbox` names one),
/// as they happen: what is there now, then each new one. The channel closes
/// when the follower goes away.
pub fn follow(
    st: &Shared,
    sandbox: Option<&str>,
    after: i64,
) -> EngineResult<tokio::sync::mpsc::Receiver<SandboxEvent>> {
    let sandbox = sandbox.map(|s| sandbox_key(st, s)).transpose()?;
    let read = reader();
    let (tx, rx) = tokio::sync::mpsc::channel::<SandboxEvent>(64);
    let mut changed = st.events_tx.subscribe();
    let st = st.clone();
    tokio::spawn(async move {
        let mut after = after;
        loop {
            changed.mark_unchanged();
            let Ok(evs) = read(&st, sandbox.as_deref(), after, 1000) else { return };
            for ev in evs {
                after = ev.seq;
                if tx.send(ev).await.is_err() {
                    return;
                }
            }
            // Wake on new events; poll now and then to notice closed followers.
            match tokio::time::timeout(std::time::Duration::from_secs(15), changed.changed()).await {
                Ok(Err(_)) => return,
                Err(_) if tx.is_closed() => return,
                _ => {}
            }
        }
    });
    Ok(rx)
}

/// The daemon's version and counts (of the sandboxes the current caller sees).
pub fn info(st: &Shared) -> EngineResult<strata_api::DaemonInfo> {
    let mut sandboxes = std::collections::BTreeMap::new();
    for r in st.db.list_sandboxes()?.into_iter().filter(|r| crate::tenancy::visible(&r.sandbox.tenant)) {
        *sandboxes.entry(r.sandbox.state.to_string()).or_insert(0) += 1;
    }
    Ok(strata_api::DaemonInfo {
        version: env!("CARGO_PKG_VERSION").to_string(),
        state_dir: st.state_dir.display().to_string(),
        sandboxes,
        images: st.db.list_images()?.len() as u64,
        default_limits: st.admission.defaults().clone(),
    })
}

/// What this host supports (probed on a blocking thread), with the names that read as ids.
pub async fn doctor(st: &Shared) -> EngineResult<strata_api::DoctorReport> {
    let state_dir = st.state_dir.clone();
    let mut report = tokio::task::spawn_blocking(move || {
        let mut r = strata_runtime::probe::doctor();
        r.features.push(strata_runtime::probe::state_fs(&state_dir));
        r
    })
    .await
    .map_err(|e| crate::error::EngineError::internal("doctor", &e))?;
    report.names_like_ids = names_like_ids(st)?;
    Ok(report)
}
