//! Error codes and the JSON error body every failing request returns.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::SandboxState;

/// Machine-readable error code. Each maps to exactly one HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The sandbox id or name is unknown (404).
    SandboxNotFound,
    /// The image name or id is unknown (404).
    ImageNotFound,
    /// The checkpoint id or name is unknown (404).
    CheckpointNotFound,
    /// The process id is unknown in this sandbox (404).
    ProcessNotFound,
    /// The path does not exist inside the sandbox (404).
    FileNotFound,
    /// The route does not exist (404).
    RouteNotFound,
    /// The lease id is unknown (or it expired) for this sandbox (404).
    LeaseNotFound,
    /// The pipeline run id is unknown (404).
    PipelineNotFound,
    /// The request is illegal in the sandbox's current state (409).
    InvalidState,
    /// The name is already taken (409).
    NameConflict,
    /// The object is still needed by others (409).
    InUse,
    /// The request body or a parameter is malformed (400).
    BadRequest,
    /// An archive or image was rejected; the message names the offending entry (400).
    InvalidArchive,
    /// A path escapes the sandbox root (400).
    PathEscape,
    /// Missing, wrong, revoked or expired bearer token (401).
    Unauthorized,
    /// The caller is authenticated but may not do this (a tenant token on an operator-only route) (403).
    Forbidden,
    /// The API token id or name is unknown (404).
    TokenNotFound,
    /// The preview id is unknown for this sandbox (404).
    PreviewNotFound,
    /// Nothing answers on the sandbox port a preview request was for (502).
    UpstreamUnavailable,
    /// The host cannot do this (missing kernel feature, tool or capability) (501).
    Unsupported,
    /// An upstream registry failed or could not be reached (502).
    RegistryError,
    /// The operation did not finish in time (504).
    Timeout,
    /// A standby image is missing or fails its checksums; the sandbox is marked `error` (500).
    StandbyImageInvalid,
    /// A state-hygiene scan has findings (listed in `findings`) and they were not accepted (409).
    ScanFindings,
    /// A rebase meets paths that both the sandbox and the new base changed
    /// (listed in `conflicts`) and no `prefer` settles them (409).
    RebaseConflicts,
    /// The sandbox or checkpoint is quarantined: it cannot be forked, promoted
    /// to a template, restored into a new sandbox or given egress (409).
    Quarantined,
    /// The request would give one sandbox all three Rule-of-Two capabilities; it
    /// waits for a human decision (`approval` names it) (403).
    ApprovalRequired,
    /// The approval id is unknown (404).
    ApprovalNotFound,
    /// Anything else; the message carries the cause chain (500).
    Internal,
    /// The path is on a kernel pseudo-filesystem (proc, sysfs, devpts, cgroup,
    /// debugfs, ...), which the file API does not serve; the message names the
    /// path and the filesystem (403).
    PseudoFilesystem,
    /// The path is a device node, FIFO or socket, which the file API does not
    /// read or write; the message names the path and its type (403).
    SpecialFile,
    /// A request body, or what a request would produce, exceeds a fixed limit
    /// of the daemon; the message names the limit (413).
    TooLarge,
    /// The path is a mount point of the sandbox (its /tmp, /dev/shm, the init
    /// binary, ...), which the file API does not remove, rename or replace (403).
    MountPoint,
    /// A tenant quota would be exceeded; the message names the quota, its limit and the usage (429).
    QuotaExceeded,
    /// The host's disk cannot hold the request (its free space minus the reserve); the message says what is available (507).
    InsufficientStorage,
    /// The host's memory cannot take the request (the over-commit limit or the reserve); the message says what is available (503).
    InsufficientMemory,
    /// The metadata database (PostgreSQL) cannot be reached; the message says
    /// why. Nothing of the request was written; retry later (503).
    MetadataUnavailable,
}

impl ErrorCode {
    /// The HTTP status this code is returned with.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::SandboxNotFound
            | ErrorCode::ImageNotFound
            | ErrorCode::ProcessNotFound
            | ErrorCode::CheckpointNotFound
            | ErrorCode::FileNotFound
            | ErrorCode::RouteNotFound
            | ErrorCode::LeaseNotFound
            | ErrorCode::PipelineNotFound
            | ErrorCode::TokenNotFound
            | ErrorCode::ApprovalNotFound
            | ErrorCode::PreviewNotFound => 404,
            ErrorCode::InvalidState
            | ErrorCode::NameConflict
            | ErrorCode::InUse
            | ErrorCode::ScanFindings
            | ErrorCode::RebaseConflicts
            | ErrorCode::Quarantined => 409,
            ErrorCode::BadRequest | ErrorCode::InvalidArchive | ErrorCode::PathEscape => 400,
            ErrorCode::Unauthorized => 401,
            ErrorCode::Forbidden
            | ErrorCode::ApprovalRequired
            | ErrorCode::PseudoFilesystem
            | ErrorCode::SpecialFile
            | ErrorCode::MountPoint => 403,
            ErrorCode::TooLarge => 413,
            ErrorCode::Unsupported => 501,
            ErrorCode::RegistryError | ErrorCode::UpstreamUnavailable => 502,
            ErrorCode::Timeout => 504,
            ErrorCode::Internal | ErrorCode::StandbyImageInvalid => 500,
            ErrorCode::QuotaExceeded => 429,
            ErrorCode::InsufficientStorage => 507,
            ErrorCode::InsufficientMemory | ErrorCode::MetadataUnavailable => 503,
        }
    }

    /// The snake_case wire name of the code.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::SandboxNotFound => "sandbox_not_found",
            ErrorCode::ImageNotFound => "image_not_found",
            ErrorCode::ProcessNotFound => "process_not_found",
            ErrorCode::CheckpointNotFound => "checkpoint_not_found",
            ErrorCode::FileNotFound => "file_not_found",
            ErrorCode::RouteNotFound => "route_not_found",
            ErrorCode::LeaseNotFound => "lease_not_found",
            ErrorCode::PipelineNotFound => "pipeline_not_found",
            ErrorCode::InvalidState => "invalid_state",
            ErrorCode::NameConflict => "name_conflict",
            ErrorCode::InUse => "in_use",
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::InvalidArchive => "invalid_archive",
            ErrorCode::PathEscape => "path_escape",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::TokenNotFound => "token_not_found",
            ErrorCode::PreviewNotFound => "preview_not_found",
            ErrorCode::UpstreamUnavailable => "upstream_unavailable",
            ErrorCode::Unsupported => "unsupported",
            ErrorCode::RegistryError => "registry_error",
            ErrorCode::Timeout => "timeout",
            ErrorCode::StandbyImageInvalid => "standby_image_invalid",
            ErrorCode::ScanFindings => "scan_findings",
            ErrorCode::RebaseConflicts => "rebase_conflicts",
            ErrorCode::Quarantined => "quarantined",
            ErrorCode::ApprovalRequired => "approval_required",
            ErrorCode::ApprovalNotFound => "approval_not_found",
            ErrorCode::Internal => "internal",
            ErrorCode::PseudoFilesystem => "pseudo_filesystem",
            ErrorCode::SpecialFile => "special_file",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::MountPoint => "mount_point",
            ErrorCode::QuotaExceeded => "quota_exceeded",
            ErrorCode::InsufficientStorage => "insufficient_storage",
            ErrorCode::InsufficientMemory => "insufficient_memory",
            ErrorCode::MetadataUnavailable => "metadata_unavailable",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The body of every error response.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ApiErrorBody {
    /// Machine-readable code.
    pub code: ErrorCode,
    /// Human-readable message including the cause chain.
    pub message: String,
    /// For `invalid_state`: the sandbox's state when the request was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_state: Option<SandboxState>,
    /// For `in_use`: the objects that still depend on the target.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dependents: Vec<String>,
    /// For `scan_findings`: what the state-hygiene scan found.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<crate::Finding>,
    /// For `approval_required`: the pending (or denied) approval; for `invalid_state`
    /// on an approval: its current record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<Box<crate::Approval>>,
    /// For `rebase_conflicts`: the paths both sides changed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conflicts: Vec<crate::RebaseConflict>,
}
