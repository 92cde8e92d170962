//! The HTTP form of an engine error: its [`ErrorCode`]'s status and the JSON
//! body ([`strata_api::ApiErrorBody`]). Handlers return [`ApiResult`]; an
//! [`EngineError`] converts with `?`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use strata_api::{ErrorCode, SandboxState};
pub use strata_engine::error::chain;
use strata_engine::error::EngineError;

/// An error returned to an API client.
#[derive(Debug, Clone)]
pub struct ApiError(pub EngineError);

/// Result of a handler.
pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    /// An error with a code and message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError(EngineError::new(code, message))
    }

    /// 409: the request is illegal in `state`.
    pub fn invalid_state(state: SandboxState, message: impl Into<String>) -> Self {
        ApiError(EngineError::invalid_state(state, message))
    }

    /// 404 for a sandbox.
    pub fn sandbox_not_found(id: &str) -> Self {
        ApiError(EngineError::sandbox_not_found(id))
    }

    /// 400.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError(EngineError::bad_request(message))
    }

    /// 500 carrying the whole cause chain of `err`.
    pub fn internal(context: &str, err: &(dyn std::error::Error + 'static)) -> Self {
        ApiError(EngineError::internal(context, err))
    }
}

impl std::ops::Deref for ApiError {
    type Target = EngineError;
    fn deref(&self) -> &EngineError {
        &self.0
    }
}

impl std::ops::DerefMut for ApiError {
    fn deref_mut(&mut self) -> &mut EngineError {
        &mut self.0
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        ApiError(e)
    }
}

/// `?` on the engine's other error types in handlers: each converts through
/// [`EngineError`], which knows their codes.
macro_rules! through_engine_error {
    ($($t:ty),* $(,)?) => {$(
        impl From<$t> for ApiError {
            fn from(e: $t) -> Self {
                ApiError(e.into())
            }
        }
    )*};
}

through_engine_error!(
    strata_store::DbError,
    strata_core::InvalidTransition,
    strata_core::units::UnitError,
    strata_core::ids::NameError,
    strata_engine::preview::PreviewError,
    strata_engine::sandboxfs::FsError,
    strata_engine::pipelines::SpecError,
);

/// The HTTP status of an error code (for every front end that answers over HTTP).
pub fn status_of(code: ErrorCode) -> StatusCode {
    StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = self.0.body;
        let status = status_of(body.code);
        if status.is_server_error() {
            tracing::warn!(code = %body.code, message = %body.message, "request failed");
        }
        (status, Json(body)).into_response()
    }
}
