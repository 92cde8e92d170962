//! Authentication and the tenancy guard (the `authenticate` and `guard` middleware, `route_policy`,
//! which classifies every route for tenants) and the token routes; the rules are
//! [`strata_engine::tenancy`]'s.

use crate::error::{ApiError, ApiResult};
use axum::extract::{MatchedPath, Path, Query, RawPathParams, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::sync::Arc;
use strata_api::{CreateTokenRequest, CreatedToken, ErrorCode, TokenInfo, TokenQuery, TENANT_HEADER};
use strata_engine::reach::{may_reach, unknown, Owned};
use strata_engine::state::Shared;
use strata_engine::tenancy::*;

use crate::native::acting::Acting;

/// Which listener a request came in on.
#[derive(Debug, Clone)]
pub enum Listener {
    /// The root-only Unix socket: the operator.
    Unix,
    /// TCP: a bearer token is required; `legacy` is `<state>/api-token` (the operator's).
    Tcp {
        /// The operator's token.
        legacy: Arc<String>,
    },
}

fn unauthorized(message: &str) -> Response {
    let mut r = ApiError::new(ErrorCode::Unauthorized, message).into_response();
    r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}

/// Middleware (outermost): establishes the [`Caller`] of every request, or refuses it with 401/403.
pub async fn authenticate(State((st, listener)): State<(Shared, Listener)>, mut req: Request, next: Next) -> Response {
    let mut caller = match &listener {
        Listener::Unix => Caller::operator(crate::native::audit::actor_of(&req)),
        Listener::Tcp { legacy } => {
            let Some(secret) = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::trim)
            else {
                return unauthorized("missing bearer token (Authorization: Bearer <token>; see `strata token create` or <state-dir>/api-token)");
            };
            match bearer_caller(&st, legacy, secret) {
                Ok(c) => c,
                Err(e) if e.body.code == ErrorCode::Unauthorized => return unauthorized(&e.body.message),
                Err(e) => return ApiError::from(e).into_response(),
            }
        }
    };
    if let Some(v) = req.headers().get(TENANT_HEADER) {
        let t = match v.to_str().map(str::trim) {
            Ok(t) if validate_tenant(t).is_ok() => t.to_string(),
            _ => {
                return ApiError::bad_request(format!(
                    "header {TENANT_HEADER}: {}",
                    validate_tenant(&String::from_utf8_lossy(v.as_bytes())).err().unwrap_or_default()
                ))
                .into_response()
            }
        };
        match &caller.principal {
            Principal::Tenant { tenant, .. } if *tenant != t => {
                return ApiError::new(
                    ErrorCode::Forbidden,
                    format!("a tenant token acts only in its own tenant; {TENANT_HEADER} names another"),
                )
                .into_response();
            }
            Principal::Tenant { .. } => {}
            Principal::Operator { .. } => caller.acting_as = Some(t),
        }
    }
    if let Some(v) = req.headers().get(strata_api::APPROVAL_HEADER) {
        match v.to_str().map(str::trim) {
            Ok(a) if strata_engine::approvals::valid_id(a) => caller.approval = Some(a.to_string()),
            _ => {
                return ApiError::bad_request(format!(
                    "header {}: not an approval id (apr-<hex>)",
                    strata_api::APPROVAL_HEADER
                ))
                .into_response()
            }
        }
    }
    req.extensions_mut().insert(strata_engine::audit::Actor(caller.actor()));
    // The caller goes with the request, explicitly: handlers call the engine
    // through an `Engine` acting for it (`native::acting`), never a task-local.
    req.extensions_mut().insert(caller);
    next.run(req).await
}

/// How a route treats tenant callers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoutePolicy {
    /// Open to tenants; the handler filters what it lists and checks ids in its body.
    Open,
    /// Open to tenants whose tenant owns the object named by the first path parameter.
    Owned(Owned),
    /// The operator only (403 for tenant tokens).
    Operator,
}

/// Routes that are operator-only by design (403 for tenant tokens). Every
/// other route must be classified in [`route_policy`]; a unit test fails for a
/// route of the router that is in neither place, so no route is left to chance.
pub const OPERATOR_ONLY: &[&str] = &[
    "/v1/tokens",
    "/v1/tokens/{id}",
    // Quota overrides are the operator's, like tokens (a tenant reads its usage).
    "/v1/tenants/{tenant}/quota",
    // Reads paths on the daemon's host, changes what every tenant shares.
    "/v1/images/import",
    "/v1/images/pull",
    // Collects across tenants.
    "/v1/gc",
    // Host-wide: capabilities, series labelled with every sandbox id, the whole chain.
    "/v1/doctor",
    // The daemon's own sandboxes, kept for every tenant.
    "/v1/warm-pool",
    "/metrics",
    "/v1/audit/verify",
    // An agent holding a tenant token must not approve its own request.
    "/v1/approvals/{id}/approve",
    "/v1/approvals/{id}/deny",
];

/// The tenancy policy of a route (its template as matched). Anything not
/// listed is operator-only: a new route is closed to tenants until classified here.
pub fn route_policy(method: &Method, route: &str) -> RoutePolicy {
    use RoutePolicy::*;
    let read = matches!(*method, Method::GET | Method::HEAD);
    if route.starts_with("/v1/sandboxes/{id}") {
        // Every sub-route of a sandbox (exec, files, processes, checkpoints, network, ...).
        return Owned(self::Owned::Sandbox);
    }
    if route.starts_with("/v1/pipelines/{id}") {
        return Owned(self::Owned::Pipeline);
    }
    match route {
        "/openapi.json" | "/v1/info" | "/v1/advise" | "/v1/events" | "/v1/cost" | "/v1/stats" | "/v1/audit" => Open,
        // MCP: its tools call the API with the caller's own token, where tenancy applies.
        "/mcp" => Open,
        "/v1/sandboxes"
        | "/v1/checkpoints"
        | "/v1/fork"
        | "/v1/fanout"
        | "/v1/pipelines"
        | "/v1/templates"
        | "/v1/templates/build" => Open,
        // Images are shared, read-only for tenants.
        "/v1/images" | "/v1/images/{name}" | "/v1/images/{name}/versions" if read => Open,
        // Each caller sees what of its own sits on an old image version.
        "/v1/outdated" => Open,
        "/v1/checkpoints/{id}" => Owned(self::Owned::Checkpoint),
        "/v1/templates/{name}" | "/v1/templates/{name}/rebuild" | "/v1/templates/{name}/check" => {
            Owned(self::Owned::Template)
        }
        "/v1/cost/{id}" => Owned(self::Owned::Usage),
        "/v1/lineage/{id}" | "/v1/scan/{id}" => Owned(self::Owned::SandboxOrCheckpoint),
        // A tenant lists and places quarantines on its own objects; lifting one
        // (DELETE) is the operator's, whose token is the human's.
        "/v1/quarantine" => Open,
        "/v1/quarantine/{id}" if *method == Method::POST => Owned(self::Owned::SandboxOrCheckpoint),
        // Approvals (Rule of Two): a tenant lists and reads its own (to wait for
        // a decision); deciding is for the operator, a human (see OPERATOR_ONLY).
        "/v1/approvals" => Open,
        "/v1/approvals/{id}" => Owned(self::Owned::Approval),
        // A tenant's own usage against its quota (the handler refuses another tenant's).
        "/v1/tenants/{tenant}/usage" if read => Open,
        //
        // Operator-only: tokens, image import/pull/removal, gc, doctor,
        // /metrics (host-wide series), audit verification (needs every entry).
        _ => Operator,
    }
}

/// Middleware (inside [`authenticate`], before any handler enters a sandbox,
/// so another tenant's request neither resumes nor keeps alive a sandbox):
/// applies [`route_policy`], the owned object through [`may_reach`].
pub async fn guard(State(st): State<Shared>, req: Request, next: Next) -> Response {
    let Some(caller) = req.extensions().get::<Caller>().cloned() else {
        return unauthorized("unauthenticated request");
    };
    let Some(route) = req.extensions().get::<MatchedPath>().map(|m| m.as_str().to_string()) else {
        // The fallback (no such route): answered the same for everyone.
        return next.run(req).await;
    };
    let policy = route_policy(req.method(), &route);
    if policy == RoutePolicy::Operator && !caller.is_operator() {
        return ApiError::new(
            ErrorCode::Forbidden,
            format!("{} {route} is for the operator only (a tenant token cannot use it)", req.method()),
        )
        .into_response();
    }
    if let (RoutePolicy::Owned(kind), Some(_)) = (policy, caller.scope()) {
        let (mut parts, body) = req.into_parts();
        let params = <RawPathParams as axum::extract::FromRequestParts<()>>::from_request_parts(&mut parts, &()).await;
        let key = params.ok().and_then(|p| p.iter().next().map(|(_, v)| v.to_string()));
        if let Some(key) = key {
            match run_as(caller.clone(), async { may_reach(&st, kind, &key) }).await {
                Ok(true) => {}
                Ok(false) => return ApiError::from(unknown(kind, &key)).into_response(),
                Err(e) => return ApiError::from(e).into_response(),
            }
        }
        return next.run(Request::from_parts(parts, body)).await;
    }
    next.run(req).await
}

/// Create an API token for a tenant; the secret is in the response only.
#[utoipa::path(post, path = "/v1/tokens", tag = "tokens", request_body = CreateTokenRequest,
    responses((status = 201, body = CreatedToken), (status = 400, body = strata_api::ApiErrorBody), (status = 403, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn create_token_handler(
    Acting(engine): Acting,
    Json(req): Json<CreateTokenRequest>,
) -> ApiResult<(StatusCode, Json<CreatedToken>)> {
    Ok((StatusCode::CREATED, Json(engine.create_token(req).await?)))
}

/// List API tokens (never their secrets).
#[utoipa::path(get, path = "/v1/tokens", tag = "tokens", params(TokenQuery),
    responses((status = 200, body = [TokenInfo]), (status = 403, body = strata_api::ApiErrorBody)))]
pub async fn list_tokens_handler(
    Acting(engine): Acting,
    Query(q): Query<TokenQuery>,
) -> ApiResult<Json<Vec<TokenInfo>>> {
    Ok(Json(engine.list_tokens(&q).await?))
}

/// Revoke an API token by id, or by name (unique among live tokens; `tenant` narrows the lookup).
/// Refused from the next request on.
#[utoipa::path(delete, path = "/v1/tokens/{id}", tag = "tokens", params(("id" = String, Path, description = "Token id or name"), TokenQuery),
    responses((status = 200, body = TokenInfo), (status = 403, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody), (status = 409, description = "the name is used in several tenants", body = strata_api::ApiErrorBody)))]
pub async fn revoke_token_handler(
    Acting(engine): Acting,
    Path(key): Path<String>,
    Query(q): Query<TokenQuery>,
) -> ApiResult<Json<TokenInfo>> {
    Ok(Json(engine.revoke_token(&key, &q).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_are_closed_to_tenants_unless_classified() {
        let (get, post, del) = (Method::GET, Method::POST, Method::DELETE);
        assert_eq!(route_policy(&post, "/v1/sandboxes/{id}/exec"), RoutePolicy::Owned(Owned::Sandbox));
        assert_eq!(route_policy(&get, "/v1/sandboxes/{id}/processes/{pid}/logs"), RoutePolicy::Owned(Owned::Sandbox));
        assert_eq!(route_policy(&del, "/v1/checkpoints/{id}"), RoutePolicy::Owned(Owned::Checkpoint));
        assert_eq!(route_policy(&post, "/v1/pipelines/{id}/resume"), RoutePolicy::Owned(Owned::Pipeline));
        assert_eq!(route_policy(&get, "/v1/images"), RoutePolicy::Open);
        assert_eq!(route_policy(&post, "/v1/images/import"), RoutePolicy::Operator);
        assert_eq!(route_policy(&del, "/v1/images/{name}"), RoutePolicy::Operator);
        for r in [
            "/v1/tokens",
            "/v1/tokens/{id}",
            "/v1/gc",
            "/metrics",
            "/v1/doctor",
            "/v1/audit/verify",
            "/v1/some-future-route",
        ] {
            assert_eq!(route_policy(&get, r), RoutePolicy::Operator, "{r}");
        }
    }

    #[test]
    fn every_route_of_the_router_is_classified() {
        // The routes as written in `router()`: a new one must be classified for
        // tenants (or listed in OPERATOR_ONLY) before this passes.
        let src = include_str!("../lib.rs");
        let routes: Vec<&str> = src.split(".route(\"").skip(1).filter_map(|r| r.split('"').next()).collect();
        assert!(routes.len() > 40, "found only {} routes", routes.len());
        for r in routes {
            let open =
                [Method::GET, Method::POST, Method::DELETE].iter().any(|m| route_policy(m, r) != RoutePolicy::Operator);
            if OPERATOR_ONLY.contains(&r) {
                assert!(
                    [Method::GET, Method::POST, Method::DELETE]
                        .iter()
                        .all(|m| route_policy(m, r) == RoutePolicy::Operator),
                    "{r} is listed operator-only but classified open"
                );
            } else {
                assert!(open, "route {r} is not classified for tenants: add it to tenancy::route_policy (Open/Owned) or to OPERATOR_ONLY");
            }
        }
    }
}
