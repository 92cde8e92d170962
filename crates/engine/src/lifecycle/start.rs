//! Start: init booted again on a stopped sandbox's kept filesystem.

use std::time::Duration;

use strata_api::{Sandbox, SandboxState};
use strata_core::lifecycle::next_state;
use strata_core::Action;

use super::{admit_start, boot, kill_processes, stop_locked};
use crate::error::EngineResult;
use crate::record::{load, lock_and_load};
use crate::state::Shared;

/// Starts a stopped (or failed) sandbox again on its kept filesystem.
pub async fn start(st: &Shared, id: &str) -> EngineResult<Sandbox> {
    start_because(st, id, "user").await
}

/// [`start`] recording `reason` on the transition.
pub async fn start_because(st: &Shared, id: &str, reason: &str) -> EngineResult<Sandbox> {
    let (_g, mut rec) = lock_and_load(st, id).await?;
    // Getting processes again takes memory: admitted like a create (429/503), before anything changes.
    let _admitted = admit_start(st, &rec)?;
    if matches!(rec.sandbox.state, SandboxState::Archived | SandboxState::Error)
        && crate::archive::pointer(st, &rec.sandbox.id).is_some()
    {
        // Its files are in the archive (also after a failed restore): never start on an empty layer.
        rec = crate::lifecycle::unarchive_locked(st, &rec, reason).await?;
    }
    if rec.sandbox.state == SandboxState::Standby {
        // Archived from standby: starting it afresh discards the process image
        // (stop_locked drops it).
        stop_locked(st, &rec, reason, Duration::ZERO).await?;
        rec = load(st, &rec.sandbox.id)?;
    }
    next_state(rec.sandbox.state, Action::Start)?;
    if matches!(rec.sandbox.state, SandboxState::Error | SandboxState::Lost) {
        // Leftovers of a crashed run must go before a new init starts.
        kill_processes(st, &rec, Duration::from_secs(1)).await?;
    }
    boot(st, &rec, rec.sandbox.state, Action::Start, reason).await?;
    Ok(load(st, &rec.sandbox.id)?.sandbox)
}
