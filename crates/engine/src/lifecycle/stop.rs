//! Stop: processes killed (SIGTERM, then SIGKILL after a grace period), the
//! filesystem kept.

use std::time::{Duration, Instant};

use strata_api::SandboxEvent;
use strata_core::lifecycle::{has_processes, next_state};
use strata_core::Action;
use strata_store::db::SandboxRecord;

use crate::error::{EngineError, EngineResult};
use crate::record::{handle_of, lock_and_load, transition, Change};
use crate::state::Shared;

/// Grace period between SIGTERM and SIGKILL when stopping.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// Stops a sandbox's processes, keeping its filesystem.
pub async fn stop(st: &Shared, id: &str, reason: &str, grace: Duration) -> EngineResult<SandboxEvent> {
    let (_g, rec) = lock_and_load(st, id).await?;
    stop_locked(st, &rec, reason, grace).await
}

/// Stops a sandbox whose operation lock the caller holds.
pub async fn stop_locked(
    st: &Shared,
    rec: &SandboxRecord,
    reason: &str,
    grace: Duration,
) -> EngineResult<SandboxEvent> {
    let started = Instant::now();
    let from = rec.sandbox.state;
    next_state(from, Action::Stop)?;
    if has_processes(from) {
        crate::hooks::run(st, rec, crate::hooks::Stage::BeforeStop).await;
        crate::accounting::final_sample(st, &rec.sandbox.id);
    }
    kill_processes(st, rec, grace).await?;
    crate::network::release(st, &rec.sandbox.id).await;
    // A stopped sandbox starts afresh: a standby image has nothing left to resume.
    crate::process_image::discard(st, &rec.sandbox.id);
    let ev = transition(st, &rec.sandbox.id, from, Change::new(Action::Stop, reason), started, None)?;
    st.db.set_expires_at(&rec.sandbox.id, None)?;
    Ok(ev)
}

/// Kills every process of a sandbox (if any; SIGTERM, SIGKILL after `grace`)
/// and releases its cgroup.
pub(crate) async fn kill_processes(st: &Shared, rec: &SandboxRecord, grace: Duration) -> EngineResult<()> {
    let id = rec.sandbox.id.clone();
    let handle = handle_of(rec);
    let rt = st.runtime_of(&rec.sandbox);
    tokio::task::spawn_blocking(move || -> Result<(), strata_runtime::RuntimeError> {
        if let Some(h) = handle {
            rt.stop(&id, &h, grace)?;
        }
        rt.cleanup(&id)
    })
    .await
    .map_err(|e| EngineError::internal("stop task", &e))?
    .map_err(|e| EngineError::internal("stop", &e))?;
    Ok(())
}

/// SIGKILLs every process of a sandbox and waits until they are gone.
pub(crate) async fn kill_only(st: &Shared, rec: &SandboxRecord) -> EngineResult<()> {
    let Some(h) = handle_of(rec) else { return Ok(()) };
    let (rt, id) = (st.runtime_of(&rec.sandbox), rec.sandbox.id.clone());
    tokio::task::spawn_blocking(move || rt.stop(&id, &h, Duration::ZERO))
        .await
        .map_err(|e| EngineError::internal("kill task", &e))?
        .map_err(|e| EngineError::internal("kill", &e))?;
    Ok(())
}
