//! HTTP handlers of `scan` (see [`strata_engine::scan`]).

use crate::error::ApiResult;
use crate::native::acting::Acting;
use axum::extract::Path;
use axum::Json;
use strata_api::ScanReport;

/// State-hygiene scan of a sandbox (everything above its image) or a checkpoint (its layers above its image).
#[utoipa::path(get, path = "/v1/scan/{id}", tag = "checkpoints", params(("id" = String, Path, description = "Sandbox or checkpoint id or name")),
    responses((status = 200, body = ScanReport), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn scan_handler(Acting(engine): Acting, Path(id): Path<String>) -> ApiResult<Json<ScanReport>> {
    Ok(Json(engine.scan(&id).await?))
}
