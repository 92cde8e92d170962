//! HTTP handlers of quarantine and checks (see [`strata_engine::quarantine`],
//! [`strata_engine::checks`]).

use axum::extract::Path;
use axum::Json;
use strata_api::{Accumulation, CheckReport, QuarantineEntry, QuarantineRequest};

use crate::error::ApiResult;
use crate::native::acting::Acting;

/// Quarantines a sandbox or checkpoint: it can still be inspected, diffed,
/// exported and destroyed, but not forked, promoted to a template, restored
/// into a new sandbox or given egress (a sandbox with egress loses it).
#[utoipa::path(post, path = "/v1/quarantine/{id}", tag = "checkpoints", request_body = QuarantineRequest,
    params(("id" = String, Path, description = "Sandbox or checkpoint id or name")),
    responses((status = 200, body = QuarantineEntry), (status = 400, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn place_handler(
    Acting(engine): Acting,
    Path(id): Path<String>,
    Json(req): Json<QuarantineRequest>,
) -> ApiResult<Json<QuarantineEntry>> {
    Ok(Json(engine.quarantine(&id, &req).await?))
}

/// Lifts a quarantine (operator only; the reason is recorded). A sandbox gets
/// back the egress it had.
#[utoipa::path(delete, path = "/v1/quarantine/{id}", tag = "checkpoints", request_body = QuarantineRequest,
    params(("id" = String, Path, description = "Sandbox or checkpoint id or name")),
    responses((status = 200, body = QuarantineEntry), (status = 403, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn lift_handler(
    Acting(engine): Acting,
    Path(id): Path<String>,
    Json(req): Json<QuarantineRequest>,
) -> ApiResult<Json<QuarantineEntry>> {
    Ok(Json(engine.lift_quarantine(&id, &req).await?))
}

/// The quarantined sandboxes and checkpoints.
#[utoipa::path(get, path = "/v1/quarantine", tag = "checkpoints",
    responses((status = 200, body = [QuarantineEntry])))]
pub async fn list_handler(Acting(engine): Acting) -> ApiResult<Json<Vec<QuarantineEntry>>> {
    Ok(Json(engine.quarantined().await?))
}

/// Checks a sandbox now, as its `check_every` would: the hygiene scan of its
/// layers above its image (a parked sandbox is not resumed), its
/// `on_findings` applied, a `checked` event recorded.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/check", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = CheckReport), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn check_handler(Acting(engine): Acting, Path(id): Path<String>) -> ApiResult<Json<CheckReport>> {
    Ok(Json(engine.check_sandbox(&id).await?))
}

/// What a sandbox has accumulated: its writable layer's bytes and entries
/// since its last checkpoint, their growth per day, its checkpoints and their
/// storage, its base's age, and the policy limits it is over. The writable
/// layer is walked (a parked sandbox is not resumed).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/accumulation", tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = Accumulation), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn accumulation_handler(Acting(engine): Acting, Path(id): Path<String>) -> ApiResult<Json<Accumulation>> {
    Ok(Json(engine.accumulation(&id).await?))
}
