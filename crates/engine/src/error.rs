//! The engine's error: what went wrong, as an [`ErrorCode`] (which front ends
//! map to their own answers: an HTTP status and JSON body, an E2B error, an
//! MCP tool error) with a message and, where it applies, the current state of
//! what refused, the dependents that block a deletion, the scan findings that
//! block a promotion or the approval a request waits for.

use strata_api::{ApiErrorBody, ErrorCode, SandboxState};

/// An error of an engine operation.
#[derive(Debug, Clone)]
pub struct EngineError {
    /// The JSON body.
    pub body: ApiErrorBody,
}

/// Result of an engine operation.
pub type EngineResult<T> = Result<T, EngineError>;

impl EngineError {
    /// An error with a code and message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        EngineError {
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

    /// The error's code.
    pub fn code(&self) -> ErrorCode {
        self.body.code
    }

    /// 409: the request is illegal in `state`.
    pub fn invalid_state(state: SandboxState, message: impl Into<String>) -> Self {
        let mut e = EngineError::new(ErrorCode::InvalidState, message);
        e.body.current_state = Some(state);
        e
    }

    /// 404 for a sandbox.
    pub fn sandbox_not_found(id: &str) -> Self {
        EngineError::new(ErrorCode::SandboxNotFound, format!("no sandbox with id or name {id:?}"))
    }

    /// 400.
    pub fn bad_request(message: impl Into<String>) -> Self {
        EngineError::new(ErrorCode::BadRequest, message)
    }

    /// 500 carrying the whole cause chain of `err`.
    pub fn internal(context: &str, err: &(dyn std::error::Error + 'static)) -> Self {
        EngineError::new(ErrorCode::Internal, format!("{context}: {}", chain(err)))
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

impl From<strata_store::DbError> for EngineError {
    fn from(e: strata_store::DbError) -> Self {
        match &e {
            strata_store::DbError::NameTaken(_) => EngineError::new(ErrorCode::NameConflict, e.to_string()),
            _ => EngineError::internal("metadata", &e),
        }
    }
}

impl From<strata_core::InvalidTransition> for EngineError {
    fn from(e: strata_core::InvalidTransition) -> Self {
        EngineError::invalid_state(e.current, e.to_string())
    }
}

impl From<strata_core::units::UnitError> for EngineError {
    fn from(e: strata_core::units::UnitError) -> Self {
        EngineError::bad_request(e.to_string())
    }
}

impl From<strata_core::ids::NameError> for EngineError {
    fn from(e: strata_core::ids::NameError) -> Self {
        EngineError::bad_request(e.to_string())
    }
}
