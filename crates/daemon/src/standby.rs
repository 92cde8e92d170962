//! Standby (placeholder until the standby implementation lands).

use strata_api::SandboxEvent;

use crate::error::{ApiError, ApiResult};
use crate::state::Shared;

/// Puts a sandbox into standby, recording `reason`. Not available in this build.
pub fn standby(st: &Shared, id: &str, _reason: &str) -> ApiResult<SandboxEvent> {
    let rec = crate::sandboxes::load(st, id)?;
    Err(ApiError::invalid_state(rec.sandbox.state, "standby is not available in this build"))
}
