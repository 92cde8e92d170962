//! HTTP handlers of `policy` (see [`strata_engine::policy`]).

use crate::error::ApiResult;
use crate::native::acting::Acting;
use axum::extract::Path;
use axum::Json;
use strata_api::{Sandbox, UpdateSandboxRequest};

/// Change a sandbox's lifecycle policy (fields not given are kept).
#[utoipa::path(patch, path = "/v1/sandboxes/{id}", tag = "sandboxes", request_body = UpdateSandboxRequest,
    params(("id" = String, Path, description = "Sandbox id, id prefix or name")),
    responses((status = 200, body = Sandbox), (status = 400, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn update_handler(
    Acting(engine): Acting,
    Path(id): Path<String>,
    Json(req): Json<UpdateSandboxRequest>,
) -> ApiResult<Json<Sandbox>> {
    Ok(Json(engine.update_sandbox(&id, &req).await?))
}
