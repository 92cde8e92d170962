//! HTTP handlers of `sandboxes` (see [`strata_engine::lifecycle`]).

use crate::error::ApiResult;
use crate::native::acting::Acting;
use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::Json;
use strata_api::{CreateSandboxRequest, CreatedSandbox, RemoveQuery, Sandbox, SandboxEvent};

/// Create and start a sandbox.
#[utoipa::path(post, path = "/v1/sandboxes", tag = "sandboxes", request_body = CreateSandboxRequest,
    responses((status = 201, body = CreatedSandbox), (status = 400, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody), (status = 429, description = "a tenant quota would be exceeded (quota_exceeded)", body = strata_api::ApiErrorBody), (status = 503, description = "the host's memory cannot take it (insufficient_memory)", body = strata_api::ApiErrorBody), (status = 507, description = "the host's disk cannot hold it (insufficient_storage)", body = strata_api::ApiErrorBody)))]
pub async fn create_handler(
    Acting(engine): Acting,
    Json(req): Json<CreateSandboxRequest>,
) -> ApiResult<(StatusCode, Json<CreatedSandbox>)> {
    Ok((StatusCode::CREATED, Json(engine.create_sandbox(&req).await?)))
}

/// List sandboxes.
#[utoipa::path(get, path = "/v1/sandboxes", tag = "sandboxes", responses((status = 200, body = [Sandbox])))]
pub async fn list_handler(Acting(engine): Acting) -> ApiResult<Json<Vec<Sandbox>>> {
    Ok(Json(engine.list_sandboxes().await?))
}

/// Inspect a sandbox.
#[utoipa::path(get, path = "/v1/sandboxes/{id}", tag = "sandboxes", params(("id" = String, Path, description = "Sandbox id, id prefix or name")),
    responses((status = 200, body = Sandbox), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn get_handler(Acting(engine): Acting, Path(id): Path<String>) -> ApiResult<Json<Sandbox>> {
    Ok(Json(engine.get_sandbox(&id).await?))
}

/// Stop a sandbox (processes killed, filesystem kept).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/stop", tag = "sandboxes", params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = SandboxEvent), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn stop_handler(Acting(engine): Acting, Path(id): Path<String>) -> ApiResult<Json<SandboxEvent>> {
    Ok(Json(engine.stop_sandbox(&id).await?))
}

/// Start a stopped sandbox.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/start", tag = "sandboxes", params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = Sandbox), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody), (status = 429, description = "a tenant quota would be exceeded (quota_exceeded)", body = strata_api::ApiErrorBody), (status = 503, description = "the host's memory cannot take it (insufficient_memory)", body = strata_api::ApiErrorBody)))]
pub async fn start_handler(Acting(engine): Acting, Path(id): Path<String>) -> ApiResult<Json<Sandbox>> {
    Ok(Json(engine.start_sandbox(&id).await?))
}

/// Destroy a sandbox.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}", tag = "sandboxes", params(("id" = String, Path, description = "Sandbox id or name"), RemoveQuery),
    responses((status = 200, body = SandboxEvent), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn remove_handler(
    Acting(engine): Acting,
    Path(id): Path<String>,
    Query(q): Query<RemoveQuery>,
) -> ApiResult<Json<SandboxEvent>> {
    Ok(Json(engine.remove_sandbox(&id, q.force).await?))
}
