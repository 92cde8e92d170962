//! HTTP handlers of `checkpoints` (see [`strata_engine::checkpoints`]).

use crate::error::ApiResult;
use crate::native::acting::Acting;
use axum::body::Body;
use axum::extract::{Path, Query};
use axum::http::{header, StatusCode};
use axum::response::Response;
use axum::Json;
use strata_api::{
    Checkpoint, CheckpointRequest, DiffQuery, FileChange, ForkRequest, ForkResult, RestoreRequest, RestoreResult,
};

/// Checkpoint a sandbox (running sandboxes are frozen briefly).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/checkpoints", tag = "checkpoints", request_body = CheckpointRequest, params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 201, body = Checkpoint), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn create_handler(
    Acting(engine): Acting,
    Path(id): Path<String>,
    Json(req): Json<CheckpointRequest>,
) -> ApiResult<(StatusCode, Json<Checkpoint>)> {
    Ok((StatusCode::CREATED, Json(engine.checkpoint(&id, &req).await?)))
}

/// Checkpoints of one sandbox.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/checkpoints", tag = "checkpoints", params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = [Checkpoint]), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn list_for_sandbox_handler(
    Acting(engine): Acting,
    Path(id): Path<String>,
) -> ApiResult<Json<Vec<Checkpoint>>> {
    Ok(Json(engine.list_checkpoints(Some(&id)).await?))
}

/// All checkpoints.
#[utoipa::path(get, path = "/v1/checkpoints", tag = "checkpoints", responses((status = 200, body = [Checkpoint])))]
pub async fn list_handler(Acting(engine): Acting) -> ApiResult<Json<Vec<Checkpoint>>> {
    Ok(Json(engine.list_checkpoints(None).await?))
}

/// Inspect a checkpoint.
#[utoipa::path(get, path = "/v1/checkpoints/{id}", tag = "checkpoints", params(("id" = String, Path, description = "Checkpoint id or name")),
    responses((status = 200, body = Checkpoint), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn get_handler(Acting(engine): Acting, Path(id): Path<String>) -> ApiResult<Json<Checkpoint>> {
    Ok(Json(engine.get_checkpoint(&id).await?))
}

/// Delete a checkpoint (409 naming the sandboxes and checkpoints that still
/// build on it), or with `when_unused=true` retire it until nothing needs it.
#[utoipa::path(delete, path = "/v1/checkpoints/{id}", tag = "checkpoints", params(("id" = String, Path, description = "Checkpoint id or name"), strata_api::DeleteCheckpointQuery),
    responses((status = 204), (status = 200, description = "when_unused: deleted now or retired", body = strata_api::CheckpointDeleted), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn delete_handler(
    Acting(engine): Acting,
    Path(id): Path<String>,
    Query(q): Query<strata_api::DeleteCheckpointQuery>,
) -> ApiResult<Response> {
    use axum::response::IntoResponse;
    if q.when_unused {
        return Ok(Json(engine.retire_checkpoint(&id).await?).into_response());
    }
    engine.delete_checkpoint(&id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Fork N sandboxes from a checkpoint or a live sandbox.
#[utoipa::path(post, path = "/v1/fork", tag = "checkpoints", request_body = ForkRequest,
    responses((status = 201, body = ForkResult), (status = 400, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody), (status = 429, description = "a tenant quota would be exceeded (quota_exceeded)", body = strata_api::ApiErrorBody), (status = 503, description = "the host's memory cannot take it (insufficient_memory)", body = strata_api::ApiErrorBody), (status = 507, description = "the host's disk cannot hold it (insufficient_storage)", body = strata_api::ApiErrorBody)))]
pub async fn fork_handler(
    Acting(engine): Acting,
    Json(req): Json<ForkRequest>,
) -> ApiResult<(StatusCode, Json<ForkResult>)> {
    Ok((StatusCode::CREATED, Json(engine.fork(&req).await?)))
}

/// Roll a sandbox back to a checkpoint.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/restore", tag = "checkpoints", request_body = RestoreRequest, params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = RestoreResult), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody), (status = 429, description = "a tenant quota would be exceeded (quota_exceeded)", body = strata_api::ApiErrorBody), (status = 503, description = "the host's memory cannot take it (insufficient_memory)", body = strata_api::ApiErrorBody)))]
pub async fn restore_handler(
    Acting(engine): Acting,
    Path(id): Path<String>,
    Json(req): Json<RestoreRequest>,
) -> ApiResult<Json<RestoreResult>> {
    Ok(Json(engine.restore(&id, &req).await?))
}

/// Paths added, modified and deleted since the last checkpoint.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/diff", tag = "checkpoints", params(("id" = String, Path, description = "Sandbox id or name"), DiffQuery),
    responses((status = 200, body = [FileChange]), (status = 400, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn diff_handler(
    Acting(engine): Acting,
    Path(id): Path<String>,
    Query(q): Query<DiffQuery>,
) -> ApiResult<Json<Vec<FileChange>>> {
    Ok(Json(engine.diff(&id, q.against.as_deref()).await?))
}

/// The same change set as an OCI layer tar (deletions as `.wh.` entries).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/export", tag = "checkpoints", params(("id" = String, Path, description = "Sandbox id or name"), DiffQuery),
    responses((status = 200, description = "tar stream", content_type = "application/x-tar"), (status = 400, body = strata_api::ApiErrorBody), (status = 403, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn export_handler(
    Acting(engine): Acting,
    Path(id): Path<String>,
    Query(q): Query<DiffQuery>,
) -> ApiResult<Response> {
    let body = Body::from_stream(engine.export(&id, q.against.as_deref()).await?);
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/x-tar")
        .body(body)
        .expect("valid response"))
}

/// Delete expired checkpoints nobody needs and unreferenced layers.
#[utoipa::path(post, path = "/v1/gc", tag = "checkpoints", responses((status = 200, body = strata_api::GcReport)))]
pub async fn gc_handler(Acting(engine): Acting) -> ApiResult<Json<strata_api::GcReport>> {
    Ok(Json(engine.gc().await?))
}

/// The tree of images, sandboxes, checkpoints and templates around a sandbox or checkpoint.
#[utoipa::path(get, path = "/v1/lineage/{id}", tag = "checkpoints", params(("id" = String, Path, description = "Sandbox or checkpoint id or name")),
    responses((status = 200, body = strata_api::Lineage), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn lineage_handler(Acting(engine): Acting, Path(id): Path<String>) -> ApiResult<Json<strata_api::Lineage>> {
    Ok(Json(engine.lineage(&id).await?))
}
