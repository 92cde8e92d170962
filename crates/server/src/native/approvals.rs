//! HTTP handlers of `approvals` (see [`strata_engine::approvals`]).

use crate::error::ApiResult;
use crate::native::acting::Acting;
use axum::extract::{Path, Query};
use axum::Json;
use strata_api::{Approval, ApprovalDecision, ApprovalQuery};

/// Approvals, oldest first (a tenant sees its own); `state` filters.
#[utoipa::path(get, path = "/v1/approvals", tag = "approvals", params(ApprovalQuery), responses((status = 200, body = [Approval]), (status = 400, body = strata_api::ApiErrorBody)))]
pub async fn list_handler(Acting(engine): Acting, Query(q): Query<ApprovalQuery>) -> ApiResult<Json<Vec<Approval>>> {
    Ok(Json(engine.list_approvals(q.state.as_deref()).await?))
}

/// One approval.
#[utoipa::path(get, path = "/v1/approvals/{id}", tag = "approvals", params(("id" = String, Path, description = "Approval id")),
    responses((status = 200, body = Approval), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn get_handler(Acting(engine): Acting, Path(id): Path<String>) -> ApiResult<Json<Approval>> {
    Ok(Json(engine.get_approval(&id).await?))
}

/// Approve a pending approval (the operator only): the request it holds may then be repeated once.
#[utoipa::path(post, path = "/v1/approvals/{id}/approve", tag = "approvals", request_body = ApprovalDecision, params(("id" = String, Path, description = "Approval id")),
    responses((status = 200, body = Approval), (status = 403, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn approve_handler(
    Acting(engine): Acting,
    Path(id): Path<String>,
    body: Option<Json<ApprovalDecision>>,
) -> ApiResult<Json<Approval>> {
    Ok(Json(engine.decide_approval(&id, true, body.and_then(|b| b.0.reason)).await?))
}

/// Deny a pending approval (the operator only).
#[utoipa::path(post, path = "/v1/approvals/{id}/deny", tag = "approvals", request_body = ApprovalDecision, params(("id" = String, Path, description = "Approval id")),
    responses((status = 200, body = Approval), (status = 403, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn deny_handler(
    Acting(engine): Acting,
    Path(id): Path<String>,
    body: Option<Json<ApprovalDecision>>,
) -> ApiResult<Json<Approval>> {
    Ok(Json(engine.decide_approval(&id, false, body.and_then(|b| b.0.reason)).await?))
}
