//! Resume on access: a call that needs a sandbox's processes or files brings a
//! parked sandbox back first (see [`crate::access`]).

use strata_api::{ResumeResult, SandboxState};

use super::resume_locked;
use crate::error::{EngineError, EngineResult};
use crate::record::load;
use crate::state::Shared;

/// Makes a sandbox runnable for a call that needs its processes or files:
/// resumes it from standby, thaws it when paused, starts it when stopped.
/// `None` when it was running already.
pub async fn ensure_running(st: &Shared, id: &str) -> EngineResult<Option<ResumeResult>> {
    let rec = load(st, id)?;
    if rec.sandbox.state == SandboxState::Running {
        return Ok(None);
    }
    let lock = st.lock_for(&rec.sandbox.id);
    let _g = lock.lock().await;
    let rec = load(st, &rec.sandbox.id)?;
    match rec.sandbox.state {
        SandboxState::Standby | SandboxState::Paused | SandboxState::Stopped | SandboxState::Archived
            if !rec.sandbox.policy.resume_on_access =>
        {
            Err(EngineError::invalid_state(
                rec.sandbox.state,
                format!(
                    "sandbox {} is {} and its policy does not resume it on access (resume_on_access: false): resume or start it first",
                    rec.sandbox.id,
                    rec.sandbox.state.as_str()
                ),
            ))
        }
        SandboxState::Standby | SandboxState::Paused | SandboxState::Stopped | SandboxState::Archived => {
            resume_locked(st, &rec, "resume_on_access").await.map(Some)
        }
        _ => Ok(None),
    }
}
