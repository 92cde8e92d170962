//! HTTP handlers of `advisor` (see [`strata_engine::advisor`]).

use crate::error::ApiResult;
use crate::native::acting::Acting;
use axum::Json;
use strata_api::{Advice, AdviseRequest};

/// Recommends a lifecycle for a stage, with its reasons, warnings and the
/// priced alternatives (ephemeral-only and always-on among them).
#[utoipa::path(post, path = "/v1/advise", tag = "cost", request_body = AdviseRequest,
    responses((status = 200, body = Advice), (status = 400, body = strata_api::ApiErrorBody)))]
pub async fn advise_handler(Acting(engine): Acting, Json(req): Json<AdviseRequest>) -> ApiResult<Json<Advice>> {
    Ok(Json(engine.advise(&req).await?))
}
