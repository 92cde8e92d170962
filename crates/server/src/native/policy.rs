//! HTTP handlers of `policy` (see [`strata_engine::policy`]).

use crate::error::ApiResult;
use axum::extract::{Path, State};
use axum::Json;
use strata_api::{Sandbox, UpdateSandboxRequest};
use strata_engine::policy::*;
use strata_engine::state::Shared;

/// Change a sandbox's lifecycle policy (fields not given are kept).
#[utoipa::path(patch, path = "/v1/sandboxes/{id}", tag = "sandboxes", request_body = UpdateSandboxRequest,
    params(("id" = String, Path, description = "Sandbox id, id prefix or name")),
    responses((status = 200, body = Sandbox), (status = 400, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn update_handler(
    State(st): State<Shared>,
    Path(id): Path<String>,
    Json(req): Json<UpdateSandboxRequest>,
) -> ApiResult<Json<Sandbox>> {
    Ok(Json(update(&st, &id, &req)?))
}
