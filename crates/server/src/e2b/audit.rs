//! Who an E2B request is and what it changed: [`authenticate`] makes the
//! caller of a request from its key (`X-API-Key`, `X-Access-Token` or a bearer
//! token) and hands it to the handlers with the request ([`Who`]); [`record`] appends every
//! mutating E2B request to the audit log, as the native API's audit does for
//! its own (the E2B layer calls the engine in-process, so no native request is
//! made that would be recorded instead).

use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use strata_engine::audit::Actor;
use strata_engine::tenancy::{bearer_caller, Caller};

use super::{request_token, SharedE2b};

/// The caller [`authenticate`] found for a request (`None`: no usable key;
/// the handler answers 401 in its own API's shape).
pub struct Who(pub Option<Caller>);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Who {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Who(parts.extensions.get::<Caller>().cloned()))
    }
}

/// Middleware: a request with a key the daemon knows carries its caller (see
/// [`super::E2b::native`]); one without a usable key goes on with none.
pub async fn authenticate(State(e): State<SharedE2b>, mut req: Request, next: Next) -> Response {
    let caller = request_token(req.headers()).and_then(|key| bearer_caller(&e.st, &e.operator_token, &key).ok());
    match caller {
        Some(caller) => {
            req.extensions_mut().insert(Actor(caller.actor()));
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        None => next.run(req).await,
    }
}

/// [`authenticate`] for envd: a sandbox's envd access token is a key there too
/// (see [`super::E2b::envd_caller`]).
pub async fn authenticate_envd(State(e): State<SharedE2b>, mut req: Request, next: Next) -> Response {
    let caller = request_token(req.headers())
        .and_then(|key| bearer_caller(&e.st, &e.operator_token, &key).ok())
        .or_else(|| e.envd_caller(req.headers()));
    if let Some(caller) = caller {
        req.extensions_mut().insert(Actor(caller.actor()));
        req.extensions_mut().insert(caller);
    }
    next.run(req).await
}

/// The audit log's route of an E2B request: `e2b:` and the route as matched,
/// with a Connect method named (`e2b:/process.Process/Start`) when it is a
/// plain identifier.
fn route_of(template: &str, path: &str) -> String {
    match template.strip_suffix("/{method}") {
        Some(service) => {
            let method = path.rsplit('/').next().unwrap_or("");
            if !method.is_empty() && method.len() <= 40 && method.bytes().all(|b| b.is_ascii_alphanumeric()) {
                format!("e2b:{service}/{method}")
            } else {
                format!("e2b:{template}")
            }
        }
        None => format!("e2b:{template}"),
    }
}

/// Middleware (inside [`authenticate`]): records mutating E2B requests of a
/// known caller after they ran, with their final status. The target is the
/// sandbox the request names (its `{id}`, or `E2b-Sandbox-Id` for envd).
pub async fn record(State(e): State<SharedE2b>, req: Request, next: Next) -> Response {
    let Some(caller) = req.extensions().get::<Caller>().cloned() else { return next.run(req).await };
    if matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS) {
        return next.run(req).await;
    }
    let method = req.method().to_string();
    let template = req.extensions().get::<MatchedPath>().map(|m| m.as_str().to_string());
    let path = req.uri().path().to_string();
    let target = match &template {
        Some(t) if t.contains("{id}") => {
            t.split('/').zip(path.split('/')).find(|(t, _)| *t == "{id}").map(|(_, p)| p.to_string())
        }
        _ => req.headers().get("e2b-sandbox-id").and_then(|v| v.to_str().ok()).map(str::to_string),
    };
    let route = template.as_deref().map_or_else(|| "e2b:(no route)".to_string(), |t| route_of(t, &path));
    let resp = next.run(req).await;
    let target = target.or_else(|| resp.extensions().get::<Created>().map(|c| c.0.clone()));
    strata_engine::audit_log::append(
        &e.st,
        &caller.actor(),
        caller.scope(),
        &method,
        &route,
        target.as_deref(),
        resp.status().as_u16(),
    );
    resp
}

/// A response extension naming what a request created (the audit target of a create).
#[derive(Debug, Clone)]
pub struct Created(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_methods_are_named_when_they_are_identifiers() {
        assert_eq!(route_of("/process.Process/{method}", "/process.Process/Start"), "e2b:/process.Process/Start");
        assert_eq!(route_of("/process.Process/{method}", "/process.Process/a%2Fb"), "e2b:/process.Process/{method}");
        assert_eq!(route_of("/sandboxes/{id}", "/sandboxes/abc"), "e2b:/sandboxes/{id}");
    }
}
