//! Pause, standby and resume routes (see [`strata_engine::standby`]; which
//! calls resume a sandbox on access: [`super::access`]).

use crate::error::ApiResult;
use axum::extract::{Path as UrlPath, State};
use axum::Json;
use strata_api::{ResumeResult, SandboxEvent, StandbyRequest};
use strata_engine::lifecycle::*;
use strata_engine::state::Shared;

/// Freeze a sandbox's processes (memory kept, no CPU).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/pause", tag = "sandboxes", params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = SandboxEvent), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn pause_handler(State(st): State<Shared>, UrlPath(id): UrlPath<String>) -> ApiResult<Json<SandboxEvent>> {
    Ok(Json(pause(&st, &id).await?))
}

/// Thaw a paused sandbox.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/unpause", tag = "sandboxes", params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = SandboxEvent), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn unpause_handler(State(st): State<Shared>, UrlPath(id): UrlPath<String>) -> ApiResult<Json<SandboxEvent>> {
    Ok(Json(unpause(&st, &id, "user").await?))
}

/// Put a sandbox into standby: processes and memory dumped to disk, CPU and RAM released.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/standby", tag = "sandboxes", request_body = StandbyRequest, params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = SandboxEvent), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody),
        (status = 501, description = "processes cannot be dumped on this host (use fs_only)", body = strata_api::ApiErrorBody)))]
pub async fn standby_handler(
    State(st): State<Shared>,
    UrlPath(id): UrlPath<String>,
    body: Option<Json<StandbyRequest>>,
) -> ApiResult<Json<SandboxEvent>> {
    let req = body.map(|Json(r)| r).unwrap_or_default();
    Ok(Json(standby_with(&st, &id, &req, "user").await?))
}

/// Resume a sandbox from standby (or thaw a paused one, or start a stopped one).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/resume", tag = "sandboxes", params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = ResumeResult), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody), (status = 429, description = "a tenant quota would be exceeded (quota_exceeded)", body = strata_api::ApiErrorBody), (status = 503, description = "the host's memory cannot take it (insufficient_memory)", body = strata_api::ApiErrorBody),
        (status = 500, description = "the standby image is missing or corrupt (code standby_image_invalid); the sandbox is now `error`", body = strata_api::ApiErrorBody)))]
pub async fn resume_handler(State(st): State<Shared>, UrlPath(id): UrlPath<String>) -> ApiResult<Json<ResumeResult>> {
    Ok(Json(resume_parked(&st, &id, "user").await?))
}
