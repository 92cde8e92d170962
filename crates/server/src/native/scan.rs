//! HTTP handlers of `scan` (see [`strata_engine::scan`]).

use crate::error::ApiResult;
use axum::extract::{Path, State};
use axum::Json;
use strata_api::ScanReport;
use strata_engine::scan::*;
use strata_engine::state::Shared;

/// State-hygiene scan of a sandbox (everything above its image) or a checkpoint (its layers above its image).
#[utoipa::path(get, path = "/v1/scan/{id}", tag = "checkpoints", params(("id" = String, Path, description = "Sandbox or checkpoint id or name")),
    responses((status = 200, body = ScanReport), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn scan_handler(State(st): State<Shared>, Path(id): Path<String>) -> ApiResult<Json<ScanReport>> {
    Ok(Json(scan(&st, &id).await?))
}
