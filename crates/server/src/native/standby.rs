//! Pause, standby and resume routes (see [`strata_engine::lifecycle`]; which
//! calls resume a sandbox on access: [`strata_engine::access`]).

use crate::error::ApiResult;
use crate::native::acting::Acting;
use crate::native::OptionalJson;
use axum::extract::Path as UrlPath;
use axum::Json;
use strata_api::{ResumeRequest, ResumeResult, SandboxEvent, StandbyRequest};

/// Freeze a sandbox's processes (memory kept, no CPU).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/pause", tag = "sandboxes", params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = SandboxEvent), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn pause_handler(Acting(engine): Acting, UrlPath(id): UrlPath<String>) -> ApiResult<Json<SandboxEvent>> {
    Ok(Json(engine.pause_sandbox(&id).await?))
}

/// Thaw a paused sandbox.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/unpause", tag = "sandboxes", params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = SandboxEvent), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn unpause_handler(Acting(engine): Acting, UrlPath(id): UrlPath<String>) -> ApiResult<Json<SandboxEvent>> {
    Ok(Json(engine.unpause_sandbox(&id).await?))
}

/// Put a sandbox into standby: processes and memory dumped to disk, CPU and RAM released.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/standby", tag = "sandboxes", request_body = StandbyRequest, params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = SandboxEvent), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody),
        (status = 501, description = "processes cannot be dumped on this host (use fs_only)", body = strata_api::ApiErrorBody)))]
pub async fn standby_handler(
    Acting(engine): Acting,
    UrlPath(id): UrlPath<String>,
    OptionalJson(body): OptionalJson<StandbyRequest>,
) -> ApiResult<Json<SandboxEvent>> {
    let req = body.unwrap_or_default();
    Ok(Json(engine.standby_sandbox(&id, &req).await?))
}

/// Resume a sandbox from standby (or thaw a paused one, or start a stopped one).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/resume", tag = "sandboxes", params(("id" = String, Path, description = "Sandbox id or name")), request_body(content = Option<ResumeRequest>, description = "optional: `fs_only`"),
    responses((status = 200, body = ResumeResult), (status = 404, body = strata_api::ApiErrorBody), (status = 409, description = "not resumable from its state, or its process image cannot be restored on this host (another runsc, platform or CPU; the image is kept)", body = strata_api::ApiErrorBody), (status = 429, description = "a tenant quota would be exceeded (quota_exceeded)", body = strata_api::ApiErrorBody), (status = 503, description = "the host's memory cannot take it (insufficient_memory)", body = strata_api::ApiErrorBody),
        (status = 500, description = "the standby image is missing or corrupt (code standby_image_invalid); the sandbox is now `error`", body = strata_api::ApiErrorBody)))]
pub async fn resume_handler(
    Acting(engine): Acting,
    UrlPath(id): UrlPath<String>,
    OptionalJson(body): OptionalJson<ResumeRequest>,
) -> ApiResult<Json<ResumeResult>> {
    let req = body.unwrap_or_default();
    Ok(Json(engine.resume_sandbox_with(&id, &req).await?))
}
