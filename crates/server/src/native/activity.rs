//! The lease routes (see [`strata_engine::activity`]; which calls count as
//! activity: [`strata_engine::access`]).

use crate::error::ApiResult;
use crate::native::acting::Acting;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::Json;
use strata_api::{Lease, LeaseRequest};

/// Take a keep-alive lease: the sandbox is not idle while it is held.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/leases", tag = "leases", request_body = LeaseRequest,
    params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 201, body = Lease), (status = 400, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn create_lease_handler(
    Acting(engine): Acting,
    Path(id): Path<String>,
    Json(req): Json<LeaseRequest>,
) -> ApiResult<(StatusCode, Json<Lease>)> {
    Ok((StatusCode::CREATED, Json(engine.create_lease(&id, &req).await?)))
}

/// List the leases a sandbox holds.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/leases", tag = "leases", params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = [Lease]), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn list_leases_handler(Acting(engine): Acting, Path(id): Path<String>) -> ApiResult<Json<Vec<Lease>>> {
    Ok(Json(engine.list_leases(&id).await?))
}

/// Renew a held lease: it then expires `for` from now.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/leases/{lease}/renew", tag = "leases", request_body = LeaseRequest,
    params(("id" = String, Path, description = "Sandbox id or name"), ("lease" = String, Path, description = "Lease id")),
    responses((status = 200, body = Lease), (status = 400, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn renew_lease_handler(
    Acting(engine): Acting,
    Path((id, lease)): Path<(String, String)>,
    Json(req): Json<LeaseRequest>,
) -> ApiResult<Json<Lease>> {
    Ok(Json(engine.renew_lease(&id, &lease, &req).await?))
}

/// Release a lease of this sandbox (a lease of another sandbox is a 404 and stays held).
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/leases/{lease}", tag = "leases",
    params(("id" = String, Path, description = "Sandbox id or name"), ("lease" = String, Path, description = "Lease id")),
    responses((status = 204), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn release_lease_handler(
    Acting(engine): Acting,
    Path((id, lease)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    engine.release_lease(&id, &lease).await?;
    Ok(StatusCode::NO_CONTENT)
}
