//! HTTP handlers of `network` (see [`strata_engine::network`]).

use crate::error::ApiResult;
use crate::native::acting::Acting;
use axum::extract::Path;
use axum::Json;
use strata_api::{NetworkInfo, NetworkSpec};

/// A sandbox's network: mode, rules, address, counters, recent denials.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/network", tag = "sandboxes", params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = NetworkInfo), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn get_handler(Acting(engine): Acting, Path(id): Path<String>) -> ApiResult<Json<NetworkInfo>> {
    Ok(Json(engine.network(&id).await?))
}

/// Replace a sandbox's network mode and rules (applied at once when it runs).
#[utoipa::path(put, path = "/v1/sandboxes/{id}/network", tag = "sandboxes", request_body = NetworkSpec, params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = NetworkInfo), (status = 400, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn put_handler(
    Acting(engine): Acting,
    Path(id): Path<String>,
    Json(req): Json<NetworkSpec>,
) -> ApiResult<Json<NetworkInfo>> {
    Ok(Json(engine.set_network(&id, &req).await?))
}
