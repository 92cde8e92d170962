//! HTTP handlers of `accounting` (see [`strata_engine::accounting`]).

use crate::error::ApiResult;
use axum::extract::Path as UrlPath;
use axum::Json;
use strata_api::{CostReport, CostSummary};

use crate::native::acting::Acting;

/// Cost of one sandbox (destroyed ones too).
#[utoipa::path(get, path = "/v1/cost/{id}", tag = "cost", params(("id" = String, Path, description = "Sandbox id, id prefix or name (destroyed sandboxes included)")),
    responses((status = 200, body = CostReport), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn get_handler(Acting(engine): Acting, UrlPath(id): UrlPath<String>) -> ApiResult<Json<CostReport>> {
    Ok(Json(engine.cost(&id).await?))
}

/// Live CPU, memory and disk of every running or paused sandbox, as last
/// sampled from its cgroup (every 5 s by default; a sandbox started less
/// than an interval ago is not listed yet).
#[utoipa::path(get, path = "/v1/stats", tag = "cost", responses((status = 200, body = [strata_api::SandboxStats])))]
pub async fn stats_handler(Acting(engine): Acting) -> ApiResult<Json<Vec<strata_api::SandboxStats>>> {
    Ok(Json(engine.live_stats().await?))
}

/// Cost of every sandbox, destroyed ones included, with totals.
#[utoipa::path(get, path = "/v1/cost", tag = "cost", responses((status = 200, body = CostSummary)))]
pub async fn list_handler(Acting(engine): Acting) -> ApiResult<Json<CostSummary>> {
    Ok(Json(engine.cost_summary().await?))
}
