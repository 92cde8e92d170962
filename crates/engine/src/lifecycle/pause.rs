//! Pause and unpause: the cgroup freezer stops every process; memory stays.

use std::time::Instant;

use strata_api::SandboxEvent;
use strata_core::lifecycle::next_state;
use strata_core::Action;
use strata_store::db::SandboxRecord;

use crate::error::{EngineError, EngineResult};
use crate::record;
use crate::record::{handle_of, transition, Change};
use crate::state::Shared;

// ---- pause / unpause ----

/// Freezes every process of a running sandbox.
pub async fn pause(st: &Shared, id: &str) -> EngineResult<SandboxEvent> {
    freeze(st, id, Action::Pause, "user").await
}

/// Thaws a paused sandbox.
pub async fn unpause(st: &Shared, id: &str, reason: &str) -> EngineResult<SandboxEvent> {
    freeze(st, id, Action::Unpause, reason).await
}

pub(crate) async fn freeze(st: &Shared, id: &str, action: Action, reason: &str) -> EngineResult<SandboxEvent> {
    let (_g, rec) = record::lock_and_load(st, id).await?;
    freeze_locked(st, &rec, action, reason).await
}

pub(crate) async fn freeze_locked(
    st: &Shared,
    rec: &SandboxRecord,
    action: Action,
    reason: &str,
) -> EngineResult<SandboxEvent> {
    let started = Instant::now();
    let from = rec.sandbox.state;
    next_state(from, action)?;
    let (rt, sid, frozen) = (st.runtime_of(&rec.sandbox), rec.sandbox.id.clone(), action == Action::Pause);
    tokio::task::spawn_blocking(move || rt.set_frozen(&sid, frozen))
        .await
        .map_err(|e| EngineError::internal("freezer task", &e))?
        .map_err(|e| EngineError::internal(if frozen { "freeze" } else { "thaw" }, &e))?;
    transition(st, &rec.sandbox.id, from, Change::new(action, reason), started, handle_of(rec).as_ref())
}
