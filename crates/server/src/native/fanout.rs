//! HTTP handlers of `fanout` (see [`strata_engine::fanout`]).

use crate::error::ApiResult;
use crate::native::acting::Acting;
use axum::Json;
use strata_api::{FanoutRequest, FanoutResult};

/// Fork one child per attempt, run the attempts concurrently and select a winner.
/// A fan-out without a winner is a 200 with `winner: null` and the `reason`.
#[utoipa::path(post, path = "/v1/fanout", tag = "checkpoints", request_body = FanoutRequest,
    responses((status = 200, body = FanoutResult), (status = 400, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody), (status = 429, description = "a tenant quota would be exceeded (quota_exceeded)", body = strata_api::ApiErrorBody), (status = 503, description = "the host's memory cannot take it (insufficient_memory)", body = strata_api::ApiErrorBody), (status = 507, description = "the host's disk cannot hold it (insufficient_storage)", body = strata_api::ApiErrorBody)))]
pub async fn fanout_handler(Acting(engine): Acting, Json(req): Json<FanoutRequest>) -> ApiResult<Json<FanoutResult>> {
    Ok(Json(engine.fanout(&req).await?))
}
