//! The access middleware: what each sandbox route needs from its sandbox
//! ([`sandbox_use`], the one table), applied through the engine's
//! [`strata_engine::access::enter`] (activity while the call runs, resume on
//! access), the way every other front end applies it.

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use strata_api::ErrorCode;
use strata_engine::access::{enter, Use};
use strata_engine::state::Shared;

use crate::error::ApiError;

/// What the sandbox route `route` (its template as matched) needs from the
/// sandbox its `{id}` names; `None` for routes that name no sandbox. Routes
/// not listed read the record only (inspect, stop, pause, leases, previews,
/// network, ...): they neither count as activity nor resume.
pub fn sandbox_use(method: &Method, route: &str) -> Option<Use> {
    let sub = route.strip_prefix("/v1/sandboxes/{id}")?;
    let post = *method == Method::POST;
    Some(match sub {
        "/exec" | "/processes/{pid}/signal" | "/processes/{pid}/stdin" => Use::Running,
        "/processes" if post => Use::Running,
        "/processes" | "/processes/{pid}" | "/processes/{pid}/logs" | "/processes/{pid}/wait" => Use::Contents,
        "/files" | "/files/stat" | "/files/list" | "/files/mkdir" | "/files/remove" | "/files/move" => Use::Running,
        "/restore" | "/diff" | "/export" => Use::Contents,
        "/checkpoints" if post => Use::Contents,
        _ => Use::Record,
    })
}

/// Middleware: enters the sandbox of a route that uses it ([`sandbox_use`]),
/// keeps the activity hold until the answer is complete (for streamed
/// answers, until the stream ends or the client goes away) and says in
/// `strata-resumed-from` (the former state) and `strata-resume-ms` when the
/// call resumed it. A key that names no sandbox of the caller's goes on to the
/// handler, which answers it (404, or 409 for the caller's destroyed sandbox).
pub async fn enter_sandbox(State(st): State<Shared>, req: Request, next: Next) -> Response {
    let using = req.extensions().get::<MatchedPath>().and_then(|r| sandbox_use(req.method(), r.as_str()));
    let Some(using) = using.filter(|u| *u != Use::Record) else { return next.run(req).await };
    let Some(key) = req.uri().path().strip_prefix("/v1/sandboxes/").and_then(|r| r.split('/').next()) else {
        return next.run(req).await;
    };
    let entered = match enter(&st, key, using).await {
        Ok(e) => e,
        Err(e) if e.body.code == ErrorCode::SandboxNotFound => return next.run(req).await,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let resumed = entered.resumed.clone();
    let hold = entered.into_hold();
    let mut resp = next.run(req).await;
    if let Some(r) = resumed {
        let h = resp.headers_mut();
        if let Ok(v) = HeaderValue::from_str(r.from.as_str()) {
            h.insert("strata-resumed-from", v);
        }
        h.insert("strata-resume-ms", HeaderValue::from(r.duration_ms));
    }
    if axum::body::HttpBody::size_hint(resp.body()).exact().is_some() {
        // Fully produced already (the hold ends here, which counts as activity).
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let stream = futures_util::StreamExt::map(body.into_data_stream(), move |chunk| {
        let _held = &hold;
        chunk
    });
    Response::from_parts(parts, axum::body::Body::from_stream(stream))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_that_need_the_processes_or_files_resume_and_calls_on_contents_count() {
        let (post, get) = (Method::POST, Method::GET);
        assert_eq!(sandbox_use(&post, "/v1/sandboxes/{id}/exec"), Some(Use::Running));
        assert_eq!(sandbox_use(&post, "/v1/sandboxes/{id}/processes"), Some(Use::Running));
        assert_eq!(sandbox_use(&get, "/v1/sandboxes/{id}/processes"), Some(Use::Contents));
        assert_eq!(sandbox_use(&get, "/v1/sandboxes/{id}/processes/{pid}/logs"), Some(Use::Contents));
        assert_eq!(sandbox_use(&post, "/v1/sandboxes/{id}/processes/{pid}/stdin"), Some(Use::Running));
        assert_eq!(sandbox_use(&Method::PUT, "/v1/sandboxes/{id}/files"), Some(Use::Running));
        assert_eq!(sandbox_use(&get, "/v1/sandboxes/{id}/files/stat"), Some(Use::Running));
        assert_eq!(sandbox_use(&post, "/v1/sandboxes/{id}/checkpoints"), Some(Use::Contents));
        assert_eq!(sandbox_use(&get, "/v1/sandboxes/{id}/checkpoints"), Some(Use::Record));
        assert_eq!(sandbox_use(&get, "/v1/sandboxes/{id}"), Some(Use::Record), "inspect is not activity");
        assert_eq!(sandbox_use(&post, "/v1/sandboxes/{id}/standby"), Some(Use::Record));
        assert_eq!(sandbox_use(&post, "/v1/sandboxes/{id}/stop"), Some(Use::Record));
        assert_eq!(sandbox_use(&post, "/v1/sandboxes/{id}/leases"), Some(Use::Record));
        assert_eq!(sandbox_use(&get, "/v1/events"), None);
    }

    #[test]
    fn every_sandbox_route_of_the_router_is_in_the_table_as_it_is_written() {
        // A route the table names must exist, so a renamed route cannot silently drop out of it.
        let spec: serde_json::Value = serde_json::from_str(&crate::openapi::spec_json()).expect("spec");
        let paths: Vec<String> = spec["paths"].as_object().expect("paths").keys().cloned().collect();
        for sub in [
            "/exec",
            "/processes",
            "/processes/{pid}/signal",
            "/processes/{pid}/stdin",
            "/processes/{pid}/logs",
            "/processes/{pid}/wait",
            "/files",
            "/files/stat",
            "/files/list",
            "/files/mkdir",
            "/files/remove",
            "/files/move",
            "/restore",
            "/diff",
            "/export",
            "/checkpoints",
        ] {
            let route = format!("/v1/sandboxes/{{id}}{sub}");
            assert!(paths.contains(&route), "{route} is in the table but not in the API");
        }
    }
}
