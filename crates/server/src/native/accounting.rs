//! HTTP handlers of `accounting` (see [`strata_engine::accounting`]).

use crate::error::{ApiError, ApiResult};
use axum::extract::{Path as UrlPath, State};
use axum::Json;
use strata_api::{CostReport, CostSummary};
use strata_engine::accounting::*;
use strata_engine::state::Shared;

/// Cost of one sandbox (destroyed ones too).
#[utoipa::path(get, path = "/v1/cost/{id}", tag = "cost", params(("id" = String, Path, description = "Sandbox id, id prefix or name (destroyed sandboxes included)")),
    responses((status = 200, body = CostReport), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn get_handler(State(st): State<Shared>, UrlPath(id): UrlPath<String>) -> ApiResult<Json<CostReport>> {
    Ok(Json(report_for(&st, &id).await?))
}

/// Cost of every sandbox, destroyed ones included, with totals.
#[utoipa::path(get, path = "/v1/cost", tag = "cost", responses((status = 200, body = CostSummary)))]
pub async fn list_handler(State(st): State<Shared>) -> ApiResult<Json<CostSummary>> {
    let st2 = st.clone();
    // Captured here: the blocking task does not carry the caller.
    let scope = strata_engine::tenancy::scope();
    tokio::task::spawn_blocking(move || -> ApiResult<Json<CostSummary>> {
        let sandboxes: Vec<CostReport> = st2
            .db
            .list_usage()?
            .into_iter()
            .filter(|u| scope.as_deref().is_none_or(|t| t == u.tenant))
            .map(|u| report(&st2, u))
            .collect();
        Ok(Json(CostSummary {
            total: sandboxes.iter().map(|r| r.total).sum(),
            ephemeral_only_total: sandboxes.iter().map(|r| r.ephemeral_only.total).sum(),
            always_on_total: sandboxes.iter().map(|r| r.always_on.total).sum(),
            sandboxes,
            prices: st2.prices.clone(),
        }))
    })
    .await
    .map_err(|e| ApiError::internal("cost task", &e))?
}
