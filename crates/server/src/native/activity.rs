//! The activity middleware (`track`: which calls count as use of a sandbox) and the lease routes
//! (see [`strata_engine::activity`]).

use crate::error::ApiResult;
use axum::extract::{Path, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use axum::Json;
use strata_api::{Lease, LeaseRequest};
use strata_engine::activity::*;
use strata_engine::state::Shared;

/// Whether a request counts as activity on a sandbox: it returns the sandbox
/// id or name for routes that use the sandbox's contents.
pub fn tracked_sandbox<'a>(method: &Method, path: &'a str) -> Option<&'a str> {
    let rest = path.strip_prefix("/v1/sandboxes/")?;
    let (id, sub) = rest.split_once('/')?;
    let first = sub.split('/').next().unwrap_or("");
    let counts = match first {
        "exec" | "processes" | "files" | "restore" | "diff" | "export" => true,
        "checkpoints" => method == Method::POST,
        _ => false,
    };
    (counts && !id.is_empty()).then_some(id)
}

/// Middleware: records activity for sandbox-scoped calls and keeps an
/// [`ActivityGuard`] alive until the request is answered — for streamed
/// responses, until the stream ends or the client goes away.
pub async fn track(State(st): State<Shared>, req: Request, next: Next) -> Response {
    let Some(name) = tracked_sandbox(req.method(), req.uri().path()) else {
        return next.run(req).await;
    };
    // Resolved like the handler resolves it: among the caller's own sandboxes.
    let Ok(Some(id)) = strata_engine::tenancy::resolve_sandbox_id(&st, name) else {
        return next.run(req).await;
    };
    let guard = st.activity.hold(&id);
    let resp = next.run(req).await;
    if axum::body::HttpBody::size_hint(resp.body()).exact().is_some() {
        // Fully produced already (the guard ends here, which counts as activity).
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let stream = futures_util::StreamExt::map(body.into_data_stream(), move |chunk| {
        let _held = &guard;
        chunk
    });
    Response::from_parts(parts, axum::body::Body::from_stream(stream))
}

/// Take a keep-alive lease: the sandbox is not idle while it is held.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/leases", tag = "leases", request_body = LeaseRequest,
    params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 201, body = Lease), (status = 400, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn create_lease_handler(
    State(st): State<Shared>,
    Path(id): Path<String>,
    Json(req): Json<LeaseRequest>,
) -> ApiResult<(StatusCode, Json<Lease>)> {
    Ok((StatusCode::CREATED, Json(create_lease(&st, &id, &req)?)))
}

/// List the leases a sandbox holds.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/leases", tag = "leases", params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = [Lease]), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn list_leases_handler(State(st): State<Shared>, Path(id): Path<String>) -> ApiResult<Json<Vec<Lease>>> {
    Ok(Json(list_leases(&st, &id)?))
}

/// Renew a held lease: it then expires `for` from now.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/leases/{lease}/renew", tag = "leases", request_body = LeaseRequest,
    params(("id" = String, Path, description = "Sandbox id or name"), ("lease" = String, Path, description = "Lease id")),
    responses((status = 200, body = Lease), (status = 400, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn renew_lease_handler(
    State(st): State<Shared>,
    Path((id, lease)): Path<(String, String)>,
    Json(req): Json<LeaseRequest>,
) -> ApiResult<Json<Lease>> {
    Ok(Json(renew_lease(&st, &id, &lease, &req)?))
}

/// Release a lease of this sandbox (a lease of another sandbox is a 404 and stays held).
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/leases/{lease}", tag = "leases",
    params(("id" = String, Path, description = "Sandbox id or name"), ("lease" = String, Path, description = "Lease id")),
    responses((status = 204), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn release_lease_handler(
    State(st): State<Shared>,
    Path((id, lease)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    release_lease(&st, &id, &lease)?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_calls_that_use_the_sandbox_count() {
        let post = Method::POST;
        let get = Method::GET;
        assert_eq!(tracked_sandbox(&post, "/v1/sandboxes/web/exec"), Some("web"));
        assert_eq!(tracked_sandbox(&get, "/v1/sandboxes/ab12/processes/3/logs"), Some("ab12"));
        assert_eq!(tracked_sandbox(&Method::PUT, "/v1/sandboxes/web/files"), Some("web"));
        assert_eq!(tracked_sandbox(&post, "/v1/sandboxes/web/checkpoints"), Some("web"));
        assert_eq!(tracked_sandbox(&get, "/v1/sandboxes/web/checkpoints"), None);
        assert_eq!(tracked_sandbox(&get, "/v1/sandboxes/web"), None, "inspect is not activity");
        assert_eq!(tracked_sandbox(&post, "/v1/sandboxes/web/stop"), None);
        assert_eq!(tracked_sandbox(&post, "/v1/sandboxes/web/leases"), None);
        assert_eq!(tracked_sandbox(&get, "/v1/events"), None);
    }
}
