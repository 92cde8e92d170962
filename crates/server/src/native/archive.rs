//! HTTP handlers of `archive` (see [`strata_engine::archive`]).

use crate::error::ApiResult;
use crate::native::acting::Acting;
use axum::extract::Path as UrlPath;
use axum::Json;
use strata_api::SandboxEvent;

/// Archive a stopped or standby sandbox into the object store, freeing its local copy.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/archive", tag = "sandboxes", params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = SandboxEvent), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn archive_handler(Acting(engine): Acting, UrlPath(id): UrlPath<String>) -> ApiResult<Json<SandboxEvent>> {
    Ok(Json(engine.archive_sandbox(&id).await?))
}
