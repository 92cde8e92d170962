//! The daemon's one error type for HTTP handlers, mapped to status codes.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use strata_api::{ApiErrorBody, ErrorCode, SandboxState};

/// An error returned to an API client.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// The JSON body.
    pub body: ApiErrorBody,
}

/// Result of a handler.
pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    /// An error with a code and message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            body: ApiErrorBody {
                code,
                message: message.into(),
                current_state: None,
                dependents: Vec::new(),
                findings: Vec::new(),
                approval: None,
            },
        }
    }

    /// 409: the request is illegal in `state`.
    pub fn invalid_state(state: SandboxState, message: impl Into<String>) -> Self {
        let mut e = ApiError::new(ErrorCode::InvalidState, message);
        e.body.current_state = Some(state);
        e
    }

    /// 404 for a sandbox.
    pub fn sandbox_not_found(id: &str) -> Self {
        ApiError::new(ErrorCode::SandboxNotFound, format!("no sandbox with id or name {id:?}"))
    }

    /// 400.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(ErrorCode::BadRequest, message)
    }

    /// 500 carrying the whole cause chain of `err`.
    pub fn internal(context: &str, err: &(dyn std::error::Error + 'static)) -> Self {
        ApiError::new(ErrorCode::Internal, format!("{context}: {}", chain(err)))
    }
}

/// Formats an error and its sources as `a: b: c`.
pub fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut s = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let msg = e.to_string();
        if !s.ends_with(&msg) {
            s.push_str(": ");
            s.push_str(&msg);
        }
        cur = e.source();
    }
    s
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.body.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if status.is_server_error() {
            tracing::warn!(code = %self.body.code, message = %self.body.message, "request failed");
        }
        (status, Json(self.body)).into_response()
    }
}

impl From<strata_store::DbError> for ApiError {
    fn from(e: strata_store::DbError) -> Self {
        match &e {
            strata_store::DbError::NameTaken(_) => ApiError::new(ErrorCode::NameConflict, e.to_string()),
            _ => ApiError::internal("metadata", &e),
        }
    }
}

impl From<strata_core::InvalidTransition> for ApiError {
    fn from(e: strata_core::InvalidTransition) -> Self {
        ApiError::invalid_state(e.current, e.to_string())
    }
}

impl From<strata_core::units::UnitError> for ApiError {
    fn from(e: strata_core::units::UnitError) -> Self {
        ApiError::bad_request(e.to_string())
    }
}

impl From<strata_core::ids::NameError> for ApiError {
    fn from(e: strata_core::ids::NameError) -> Self {
        ApiError::bad_request(e.to_string())
    }
}
