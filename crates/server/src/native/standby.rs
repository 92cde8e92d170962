//! Pause, standby and resume routes, and the resume-on-access middleware (`resume_on_access`: which
//! calls wake a sandbox; see [`strata_engine::standby`]).

use crate::error::{ApiError, ApiResult};
use axum::extract::{Path as UrlPath, State};
use axum::Json;
use strata_api::{ResumeResult, SandboxEvent, SandboxState, StandbyRequest};
use strata_engine::sandboxes::{self};
use strata_engine::standby::*;
use strata_engine::state::Shared;

/// Middleware: a call that needs a sandbox's processes or files (exec, starting
/// a process, signals, stdin, file operations) resumes a sandbox in standby,
/// thaws a paused one and starts a stopped one first, then is served. The
/// response says so in `strata-resumed-from` (the former state) and
/// `strata-resume-ms`; the transition's event has reason `resume_on_access`.
pub async fn resume_on_access(
    State(st): State<Shared>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let Some(name) = resumes_sandbox(req.method(), req.uri().path()) else { return next.run(req).await };
    // Resolved like the handler resolves it: among the caller's own sandboxes.
    let Ok(Some(rec)) = strata_engine::tenancy::find_sandbox(&st, name) else { return next.run(req).await };
    if !matches!(
        rec.sandbox.state,
        SandboxState::Standby | SandboxState::Paused | SandboxState::Stopped | SandboxState::Archived
    ) {
        return next.run(req).await;
    }
    let resumed = match ensure_running(&st, &rec.sandbox.id).await {
        Ok(r) => r,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let mut resp = next.run(req).await;
    if let Some(r) = resumed {
        let h = resp.headers_mut();
        if let Ok(v) = axum::http::HeaderValue::from_str(r.from.as_str()) {
            h.insert("strata-resumed-from", v);
        }
        h.insert("strata-resume-ms", axum::http::HeaderValue::from(r.duration_ms));
    }
    resp
}

/// The sandbox a request needs running, for routes that resume on access.
fn resumes_sandbox<'a>(method: &axum::http::Method, path: &'a str) -> Option<&'a str> {
    use axum::http::Method;
    let rest = path.strip_prefix("/v1/sandboxes/")?;
    let (id, sub) = rest.split_once('/')?;
    let parts: Vec<&str> = sub.split('/').collect();
    let resumes = match parts.as_slice() {
        ["exec"] => true,
        ["processes"] => method == Method::POST,
        ["processes", _, "signal" | "stdin"] => true,
        ["files", ..] => true,
        _ => false,
    };
    (resumes && !id.is_empty()).then_some(id)
}

/// Freeze a sandbox's processes (memory kept, no CPU).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/pause", tag = "sandboxes", params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = SandboxEvent), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn pause_handler(State(st): State<Shared>, UrlPath(id): UrlPath<String>) -> ApiResult<Json<SandboxEvent>> {
    Ok(Json(pause(&st, &id).await?))
}

/// Thaw a paused sandbox.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/unpause", tag = "sandboxes", params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = SandboxEvent), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn unpause_handler(State(st): State<Shared>, UrlPath(id): UrlPath<String>) -> ApiResult<Json<SandboxEvent>> {
    Ok(Json(unpause(&st, &id, "user").await?))
}

/// Put a sandbox into standby: processes and memory dumped to disk, CPU and RAM released.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/standby", tag = "sandboxes", request_body = StandbyRequest, params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = SandboxEvent), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody),
        (status = 501, description = "processes cannot be dumped on this host (use fs_only)", body = strata_api::ApiErrorBody)))]
pub async fn standby_handler(
    State(st): State<Shared>,
    UrlPath(id): UrlPath<String>,
    body: Option<Json<StandbyRequest>>,
) -> ApiResult<Json<SandboxEvent>> {
    let req = body.map(|Json(r)| r).unwrap_or_default();
    Ok(Json(standby_with(&st, &id, &req, "user").await?))
}

/// Resume a sandbox from standby (or thaw a paused one, or start a stopped one).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/resume", tag = "sandboxes", params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = ResumeResult), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody), (status = 429, description = "a tenant quota would be exceeded (quota_exceeded)", body = strata_api::ApiErrorBody), (status = 503, description = "the host's memory cannot take it (insufficient_memory)", body = strata_api::ApiErrorBody),
        (status = 500, description = "the standby image is missing or corrupt (code standby_image_invalid); the sandbox is now `error`", body = strata_api::ApiErrorBody)))]
pub async fn resume_handler(State(st): State<Shared>, UrlPath(id): UrlPath<String>) -> ApiResult<Json<ResumeResult>> {
    let rec = sandboxes::load_for_transition(&st, &id)?;
    let retry = rec.sandbox.state == SandboxState::Error && image_dir(&st, &rec.sandbox.id).is_dir();
    if !retry
        && !matches!(
            rec.sandbox.state,
            SandboxState::Standby | SandboxState::Paused | SandboxState::Stopped | SandboxState::Archived
        )
    {
        return Err(ApiError::invalid_state(rec.sandbox.state, format!("sandbox {} is {}; only standby, paused, stopped or archived sandboxes (or one whose standby image failed to restore) resume", rec.sandbox.id, rec.sandbox.state)));
    }
    Ok(Json(resume(&st, &rec.sandbox.id, "user").await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_calls_that_need_the_sandbox_resume_it() {
        use axum::http::Method;
        assert_eq!(resumes_sandbox(&Method::POST, "/v1/sandboxes/web/exec"), Some("web"));
        assert_eq!(resumes_sandbox(&Method::POST, "/v1/sandboxes/web/processes"), Some("web"));
        assert_eq!(resumes_sandbox(&Method::GET, "/v1/sandboxes/web/processes"), None);
        assert_eq!(resumes_sandbox(&Method::GET, "/v1/sandboxes/web/processes/3/logs"), None);
        assert_eq!(resumes_sandbox(&Method::POST, "/v1/sandboxes/web/processes/3/stdin"), Some("web"));
        assert_eq!(resumes_sandbox(&Method::GET, "/v1/sandboxes/web/files/stat"), Some("web"));
        assert_eq!(resumes_sandbox(&Method::GET, "/v1/sandboxes/web"), None);
        assert_eq!(resumes_sandbox(&Method::POST, "/v1/sandboxes/web/standby"), None);
    }
}
