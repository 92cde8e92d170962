//! Destroy: processes, filesystem, network, secrets and records of a sandbox
//! removed (its usage record and events stay for cost and audit).

use std::time::Instant;

use strata_api::{SandboxEvent, SandboxState};
use strata_core::lifecycle::{has_processes, next_state};
use strata_core::Action;
use strata_store::db::Transition;
use tracing::{info, warn};

use super::kill_only;
use crate::error::{EngineError, EngineResult};
use crate::record::{lock_and_load, now};
use crate::state::Shared;

/// Destroys a sandbox: processes, cgroup, writable layer, record.
pub async fn destroy(st: &Shared, id: &str, force: bool, reason: &str) -> EngineResult<SandboxEvent> {
    let (_g, rec) = lock_and_load(st, id).await?;
    let started = Instant::now();
    let from = rec.sandbox.state;
    let to = next_state(from, Action::Destroy)?;
    if has_processes(from) && !force {
        return Err(EngineError::invalid_state(
            from,
            format!("sandbox {} is {from}; stop it first or remove it with force", rec.sandbox.id),
        ));
    }
    if has_processes(from) {
        crate::accounting::final_sample(st, &rec.sandbox.id);
    }
    let archived = crate::archive::pointer(st, &rec.sandbox.id);
    // Followers of its processes' output learn that they end because of this
    // (until `forget`, or right away when the destroy fails).
    st.processes.set_destroying(&rec.sandbox.id, true);
    let deleted = async {
        // Destroying discards everything, so there is nothing to shut down gracefully.
        kill_only(st, &rec).await?;
        let t =
            Transition { to, reason, detail: None, duration_ms: started.elapsed().as_millis() as u64, time: &now() };
        Ok::<_, EngineError>(st.db.delete_sandbox(&rec.sandbox.id, from, &t)?)
    }
    .await;
    if !matches!(deleted, Ok(Some(_))) {
        st.processes.set_destroying(&rec.sandbox.id, false);
    }
    let Some(ev) = deleted? else {
        // Unreachable while transitions hold the sandbox's lock; a 409 with the
        // state it is in now if one ever does not.
        let current = st.db.sandbox_by_id(&rec.sandbox.id)?.map_or(SandboxState::Destroyed, |r| r.sandbox.state);
        return Err(EngineError::invalid_state(
            current,
            format!("sandbox {} changed state while being destroyed", rec.sandbox.id),
        ));
    };
    st.secrets.remove(&rec.sandbox.id);
    crate::network::forget_later(st, &rec.sandbox.id);
    if let Some(m) = archived {
        let st2 = st.clone();
        tokio::spawn(crate::tenancy::as_daemon(async move { crate::archive::delete_remote(&st2, &m).await }));
    }
    st.processes.forget(&rec.sandbox.id);
    st.metrics.transition(SandboxState::Destroyed, reason);
    st.metrics.observe("destroy", started.elapsed());
    st.notify_events(ev.seq);
    drop(_g);
    st.drop_lock(&rec.sandbox.id);
    // The record is gone and every process is dead: releasing the cgroup and the
    // writable layer can finish in the background (startup sweeps what a crash leaves).
    let (st2, id, rt) = (st.clone(), rec.sandbox.id.clone(), st.runtime_of(&rec.sandbox));
    tokio::task::spawn_blocking(move || release_resources(&st2, rt.as_ref(), &id));
    info!(sandbox = %rec.sandbox.id, reason, "destroyed");
    Ok(ev)
}

/// Removes the cgroup and directory of a sandbox that has no processes and no
/// record; `rt` is its tier's runtime.
pub(crate) fn release_resources(st: &Shared, rt: &dyn strata_runtime::Runtime, id: &str) {
    if let Err(e) = rt.cleanup(id) {
        warn!(sandbox = id, error = %crate::error::chain(&e), "releasing cgroup");
    }
    st.disks.release(&st.sandbox_dir(id));
    if let Err(e) = strata_store::fsutil::remove_dir_all_if_exists(&st.sandbox_dir(id)) {
        warn!(sandbox = id, error = %e, "removing sandbox directory");
    }
}
