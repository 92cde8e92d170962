//! Archiving (placeholder until the archive implementation lands).

use strata_api::SandboxEvent;

use crate::error::{ApiError, ApiResult};
use crate::state::Shared;

/// Archives a sandbox, recording `reason`. Not available in this build.
pub fn archive(st: &Shared, id: &str, _reason: &str) -> ApiResult<SandboxEvent> {
    let rec = crate::sandboxes::load(st, id)?;
    Err(ApiError::invalid_state(rec.sandbox.state, "archive is not available in this build"))
}
