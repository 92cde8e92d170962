//! The engine's error: what went wrong, as an [`ErrorCode`] (which front ends
//! map to their own answers: an HTTP status and JSON body, an E2B error, an
//! MCP tool error) with a message and, where it applies, the current state of
//! what refused, the dependents that block a deletion, the scan findings that
//! block a promotion or the approval a request waits for.

use strata_api::{ApiErrorBody, Checkpoint, ErrorCode, SandboxState};

/// An error of an engine operation.
#[derive(Debug, Clone)]
pub struct EngineError {
    /// The JSON body.
    pub body: ApiErrorBody,
}

/// Result of an engine operation.
pub type EngineResult<T> = Result<T, EngineError>;

/// What kind of failure an error is, for front ends that answer in their own
/// terms (a Connect code, an E2B error, an MCP tool error) rather than with the
/// native API's status of each [`ErrorCode`]. One kind per code, decided by one
/// exhaustive match: a new code does not compile until it is classified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The object named does not exist for the caller (another tenant's included).
    NotFound,
    /// The request is illegal in the object's current state (the error carries it).
    InvalidState,
    /// A name is taken, or the object is still needed by others.
    Conflict,
    /// The request or one of its fields is malformed (the message names it).
    BadRequest,
    /// No usable credentials.
    Unauthorized,
    /// The caller may not do this (or not to this path).
    Forbidden,
    /// The Rule of Two holds it for a human decision (the error names the approval).
    ApprovalRequired,
    /// Larger than a fixed limit of the daemon.
    TooLarge,
    /// A quota, or the host's disk or memory, cannot take it now.
    ResourceExhausted,
    /// This host or tier cannot do it (the message says what is missing).
    Unsupported,
    /// Something the request needs (a registry, a sandbox port) did not answer.
    Unavailable,
    /// It did not finish in time.
    Timeout,
    /// Anything else; the message carries the cause chain.
    Internal,
}

impl ErrorKind {
    /// The kind of `code`.
    pub fn of(code: ErrorCode) -> ErrorKind {
        match code {
            ErrorCode::SandboxNotFound
            | ErrorCode::ImageNotFound
            | ErrorCode::CheckpointNotFound
            | ErrorCode::ProcessNotFound
            | ErrorCode::FileNotFound
            | ErrorCode::RouteNotFound
            | ErrorCode::LeaseNotFound
            | ErrorCode::PipelineNotFound
            | ErrorCode::TokenNotFound
            | ErrorCode::PreviewNotFound
            | ErrorCode::ApprovalNotFound => ErrorKind::NotFound,
            ErrorCode::InvalidState => ErrorKind::InvalidState,
            ErrorCode::NameConflict
            | ErrorCode::InUse
            | ErrorCode::ScanFindings
            | ErrorCode::RebaseConflicts
            | ErrorCode::Quarantined => ErrorKind::Conflict,
            ErrorCode::BadRequest | ErrorCode::InvalidArchive | ErrorCode::PathEscape => ErrorKind::BadRequest,
            ErrorCode::Unauthorized => ErrorKind::Unauthorized,
            ErrorCode::Forbidden | ErrorCode::PseudoFilesystem | ErrorCode::SpecialFile | ErrorCode::MountPoint => {
                ErrorKind::Forbidden
            }
            ErrorCode::ApprovalRequired => ErrorKind::ApprovalRequired,
            ErrorCode::TooLarge => ErrorKind::TooLarge,
            ErrorCode::QuotaExceeded | ErrorCode::InsufficientStorage | ErrorCode::InsufficientMemory => {
                ErrorKind::ResourceExhausted
            }
            ErrorCode::Unsupported => ErrorKind::Unsupported,
            ErrorCode::UpstreamUnavailable | ErrorCode::RegistryError | ErrorCode::MetadataUnavailable => {
                ErrorKind::Unavailable
            }
            ErrorCode::Timeout => ErrorKind::Timeout,
            ErrorCode::Internal | ErrorCode::StandbyImageInvalid => ErrorKind::Internal,
        }
    }
}

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
                conflicts: Vec::new(),
            },
        }
    }

    /// The error's code.
    pub fn code(&self) -> ErrorCode {
        self.body.code
    }

    /// The error's kind.
    pub fn kind(&self) -> ErrorKind {
        ErrorKind::of(self.body.code)
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

    /// 404 for a retired checkpoint used as a source (see [`Checkpoint::RETIRED_LABEL`]).
    pub fn checkpoint_retired(c: &Checkpoint) -> Self {
        EngineError::new(
            ErrorCode::CheckpointNotFound,
            format!(
                "checkpoint {} was deleted (at {}); it is kept only while what was made from it needs it",
                c.id,
                c.retired_at().unwrap_or("?")
            ),
        )
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

pub use strata_core::errors::chain;

impl From<strata_store::DbError> for EngineError {
    fn from(e: strata_store::DbError) -> Self {
        match &e {
            strata_store::DbError::NameTaken(_) => EngineError::new(ErrorCode::NameConflict, e.to_string()),
            strata_store::DbError::UsernsExhausted(_) => EngineError::new(ErrorCode::InUse, e.to_string()),
            strata_store::DbError::Unavailable { .. } => {
                EngineError::new(ErrorCode::MetadataUnavailable, e.to_string())
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_agrees_with_the_native_status_of_its_codes() {
        let codes = [
            ErrorCode::SandboxNotFound,
            ErrorCode::ApprovalNotFound,
            ErrorCode::InvalidState,
            ErrorCode::InUse,
            ErrorCode::ScanFindings,
            ErrorCode::Quarantined,
            ErrorCode::PathEscape,
            ErrorCode::Unauthorized,
            ErrorCode::MountPoint,
            ErrorCode::ApprovalRequired,
            ErrorCode::TooLarge,
            ErrorCode::QuotaExceeded,
            ErrorCode::InsufficientMemory,
            ErrorCode::MetadataUnavailable,
            ErrorCode::Unsupported,
            ErrorCode::RegistryError,
            ErrorCode::Timeout,
            ErrorCode::StandbyImageInvalid,
        ];
        for code in codes {
            let status = code.http_status();
            let expected = match ErrorKind::of(code) {
                ErrorKind::NotFound => vec![404],
                ErrorKind::InvalidState | ErrorKind::Conflict => vec![409],
                ErrorKind::BadRequest => vec![400],
                ErrorKind::Unauthorized => vec![401],
                ErrorKind::Forbidden | ErrorKind::ApprovalRequired => vec![403],
                ErrorKind::TooLarge => vec![413],
                ErrorKind::ResourceExhausted => vec![429, 503, 507],
                ErrorKind::Unsupported => vec![501],
                ErrorKind::Unavailable => vec![502, 503],
                ErrorKind::Timeout => vec![504],
                ErrorKind::Internal => vec![500],
            };
            assert!(expected.contains(&status), "{code:?} is {:?} but answers {status}", ErrorKind::of(code));
        }
        let e = EngineError::invalid_state(SandboxState::Stopped, "no");
        assert_eq!((e.kind(), e.body.current_state), (ErrorKind::InvalidState, Some(SandboxState::Stopped)));
    }
}
