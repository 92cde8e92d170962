//! The audit middleware (`record`: every mutating request, after the handler, with its final
//! status, through [`strata_engine::audit_log::append`]) and the audit routes.

use crate::error::ApiResult;
use axum::extract::{ConnectInfo, MatchedPath, Query, Request, State};
use axum::http::{header, Method};
use axum::middleware::Next;
use axum::response::Response;
use axum::serve::IncomingStream;
use axum::Json;
use strata_api::{AuditEntry, AuditQuery, AuditVerification};
use strata_engine::audit::*;
use strata_engine::state::Shared;
use tokio::net::UnixListener;

use crate::native::acting::Acting;

/// Peer of a Unix-socket connection.
#[derive(Debug, Clone, Copy)]
pub struct UdsPeer {
    /// Its uid (SO_PEERCRED), when the kernel told us.
    pub uid: Option<u32>,
}

impl axum::extract::connect_info::Connected<IncomingStream<'_, UnixListener>> for UdsPeer {
    fn connect_info(stream: IncomingStream<'_, UnixListener>) -> Self {
        UdsPeer { uid: stream.io().peer_cred().ok().map(|c| c.uid()) }
    }
}

/// The actor of a request.
pub fn actor_of(req: &Request) -> String {
    if let Some(a) = req.extensions().get::<Actor>() {
        return a.0.clone();
    }
    match req.extensions().get::<ConnectInfo<UdsPeer>>() {
        Some(ConnectInfo(UdsPeer { uid: Some(uid) })) => format!("uid:{uid}"),
        _ => "local".into(),
    }
}

/// The first path parameter of a route (`{id}`, `{name}`): the target.
fn target_of(template: &str, path: &str) -> Option<String> {
    template.split('/').zip(path.split('/')).find(|(t, _)| t.starts_with('{')).map(|(_, p)| p.to_string())
}

/// Middleware: records mutating requests after they ran (their status known).
pub async fn record(State(st): State<Shared>, req: Request, next: Next) -> Response {
    if matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS) {
        return next.run(req).await;
    }
    let method = req.method().to_string();
    let path = req.uri().path().to_string();
    let route = req.extensions().get::<MatchedPath>().map(|m| m.as_str().to_string());
    let actor = actor_of(&req);
    let tenant = req.extensions().get::<strata_engine::tenancy::Caller>().and_then(|c| c.scope().map(str::to_string));
    let mut req = req;
    req.extensions_mut().insert(Actor(actor.clone()));
    let resp = next.run(req).await;
    let mut target = route.as_deref().and_then(|r| target_of(r, &path));
    let status = resp.status();
    // A create names its object only in the response: take the id from a small JSON body.
    let is_json =
        resp.headers().get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    let resp = if target.is_none() && status.is_success() && is_json {
        let (parts, body) = resp.into_parts();
        // Only routes without a path parameter get here (creates, import, fork, gc): small bodies, already complete.
        let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap_or_default();
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) {
            target =
                ["id", "name", "checkpoint"].iter().find_map(|k| v.get(k).and_then(|x| x.as_str()).map(str::to_string));
        }
        Response::from_parts(parts, axum::body::Body::from(bytes))
    } else {
        resp
    };
    let route = route.unwrap_or_else(|| "(no route)".into());
    strata_engine::audit_log::append(
        &st,
        &actor,
        tenant.as_deref(),
        &method,
        &route,
        target.as_deref(),
        status.as_u16(),
    );
    resp
}

/// Audit entries, oldest first (the last `limit`, default 100); a tenant sees its tenant's entries only.
#[utoipa::path(get, path = "/v1/audit", tag = "audit", params(AuditQuery), responses((status = 200, body = [AuditEntry])))]
pub async fn list_handler(Acting(engine): Acting, Query(q): Query<AuditQuery>) -> ApiResult<Json<Vec<AuditEntry>>> {
    Ok(Json(engine.audit_entries(q.limit).await?))
}

/// Recomputes the hash chain and reports the first entry that does not fit.
#[utoipa::path(get, path = "/v1/audit/verify", tag = "audit", responses((status = 200, body = AuditVerification)))]
pub async fn verify_handler(Acting(engine): Acting) -> ApiResult<Json<AuditVerification>> {
    Ok(Json(engine.verify_audit().await?))
}
