//! HTTP handlers of `approvals` (see [`strata_engine::approvals`]).

use crate::error::ApiResult;
use axum::extract::{Path, Query, State};
use axum::Json;
use strata_api::{Approval, ApprovalDecision, ApprovalQuery};
use strata_engine::approvals::*;
use strata_engine::state::Shared;

/// Approvals, oldest first (a tenant sees its own); `state` filters.
#[utoipa::path(get, path = "/v1/approvals", tag = "approvals", params(ApprovalQuery), responses((status = 200, body = [Approval]), (status = 400, body = strata_api::ApiErrorBody)))]
pub async fn list_handler(State(st): State<Shared>, Query(q): Query<ApprovalQuery>) -> ApiResult<Json<Vec<Approval>>> {
    Ok(Json(list(&st, q.state.as_deref())?))
}

/// One approval.
#[utoipa::path(get, path = "/v1/approvals/{id}", tag = "approvals", params(("id" = String, Path, description = "Approval id")),
    responses((status = 200, body = Approval), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn get_handler(State(st): State<Shared>, Path(id): Path<String>) -> ApiResult<Json<Approval>> {
    Ok(Json(get(&st, &id)?))
}

/// Approve a pending approval (the operator only): the request it holds may then be repeated once.
#[utoipa::path(post, path = "/v1/approvals/{id}/approve", tag = "approvals", request_body = ApprovalDecision, params(("id" = String, Path, description = "Approval id")),
    responses((status = 200, body = Approval), (status = 403, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn approve_handler(
    State(st): State<Shared>,
    Path(id): Path<String>,
    body: Option<Json<ApprovalDecision>>,
) -> ApiResult<Json<Approval>> {
    Ok(Json(decide(&st, &id, true, body.and_then(|b| b.0.reason))?))
}

/// Deny a pending approval (the operator only).
#[utoipa::path(post, path = "/v1/approvals/{id}/deny", tag = "approvals", request_body = ApprovalDecision, params(("id" = String, Path, description = "Approval id")),
    responses((status = 200, body = Approval), (status = 403, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn deny_handler(
    State(st): State<Shared>,
    Path(id): Path<String>,
    body: Option<Json<ApprovalDecision>>,
) -> ApiResult<Json<Approval>> {
    Ok(Json(decide(&st, &id, false, body.and_then(|b| b.0.reason))?))
}
