//! HTTP handlers of `network` (see [`strata_engine::network`]).

use crate::error::ApiResult;
use axum::extract::{Path, State};
use axum::Json;
use strata_api::{NetworkInfo, NetworkSpec};
use strata_engine::network::*;
use strata_engine::record::load;
use strata_engine::state::Shared;

/// A sandbox's network: mode, rules, address, counters, recent denials.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/network", tag = "sandboxes", params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = NetworkInfo), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn get_handler(State(st): State<Shared>, Path(id): Path<String>) -> ApiResult<Json<NetworkInfo>> {
    let rec = load(&st, &id)?;
    Ok(Json(info(&st, &rec.sandbox.id).await?))
}

/// Replace a sandbox's network mode and rules (applied at once when it runs).
#[utoipa::path(put, path = "/v1/sandboxes/{id}/network", tag = "sandboxes", request_body = NetworkSpec, params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = NetworkInfo), (status = 400, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn put_handler(
    State(st): State<Shared>,
    Path(id): Path<String>,
    Json(req): Json<NetworkSpec>,
) -> ApiResult<Json<NetworkInfo>> {
    Ok(Json(update(&st, &id, req).await?))
}
