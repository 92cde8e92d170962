//! The engine as a handler sees it: [`Acting`] extracts the engine acting for
//! the request's caller (set by `authenticate`; without one, a 401), and
//! [`report_resumes`] says in the answer when a call brought a parked
//! sandbox back (`strata-resumed-from`, `strata-resume-ms`).

use axum::extract::{FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use strata_api::ErrorCode;
use strata_engine::state::Shared;
use strata_engine::surface::ResumeReport;
use strata_engine::tenancy::Caller;
use strata_engine::Engine;

use crate::error::ApiError;

/// The engine acting for the request's caller.
pub struct Acting(pub Engine);

impl FromRequestParts<Shared> for Acting {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, st: &Shared) -> Result<Self, Response> {
        let Some(caller) = parts.extensions.get::<Caller>().cloned() else {
            return Err(ApiError::new(ErrorCode::Unauthorized, "unauthenticated request").into_response());
        };
        let engine = Engine::new(st.clone(), caller);
        Ok(Acting(match parts.extensions.get::<ResumeReport>() {
            Some(report) => engine.reporting_resumes(report.clone()),
            None => engine,
        }))
    }
}

/// Middleware: gives the request's engine a place to report a resume, and
/// says in the answer's headers when one was made (the former state, and how
/// long it took).
pub async fn report_resumes(mut req: Request, next: Next) -> Response {
    let report = ResumeReport::default();
    req.extensions_mut().insert(report.clone());
    let mut resp = next.run(req).await;
    let resumed = report.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(r) = resumed {
        let h = resp.headers_mut();
        if let Ok(v) = HeaderValue::from_str(r.from.as_str()) {
            h.insert("strata-resumed-from", v);
        }
        h.insert("strata-resume-ms", HeaderValue::from(r.duration_ms));
    }
    resp
}
