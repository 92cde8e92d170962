//! State hygiene (`strata scan`) and the audit log.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// How serious a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Worth a look (e.g. a changed system file).
    Low,
    /// Likely unwanted state.
    Medium,
    /// Should not be carried into a template (persistence, setuid, credential files).
    High,
    /// Secret material (private keys, tokens).
    Critical,
}

impl Severity {
    /// The snake_case wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Low => "low",
            Severity::Medium => "medium",
            Severity::High => "high",
            Severity::Critical => "critical",
        }
    }
}

impl std::fmt::Display for Severity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One state-hygiene finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Finding {
    /// Absolute path inside the sandbox.
    pub path: String,
    /// Rule id, e.g. `credential.private_key`, `persistence.cron`.
    pub rule: String,
    /// Severity.
    pub severity: Severity,
    /// Short reason (never the secret itself).
    pub reason: String,
}

/// Result of `GET /v1/scan/{id}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ScanReport {
    /// `sandbox` or `checkpoint`.
    pub kind: String,
    /// Sandbox or checkpoint id.
    pub id: String,
    /// Its name.
    pub name: String,
    /// The image it is compared against.
    pub image: String,
    /// Paths added, modified or deleted above the image.
    pub changed_paths: u64,
    /// Findings, most severe first.
    pub findings: Vec<Finding>,
    /// Whether there are no findings (`packaged` ones do not count).
    pub clean: bool,
    /// Credential-pattern matches in files shipped by an installed Python package and
    /// verified byte for byte against its `RECORD` (SHA-256): test fixtures and
    /// documentation, listed for review but not blocking a template. Their reason
    /// names the package.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub packaged: Vec<Finding>,
}

/// A recorded override: a template promoted although its scan had findings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FindingsAcceptance {
    /// Number of findings accepted.
    pub count: usize,
    /// Count per rule, e.g. `{"persistence.cron": 1}`.
    pub rules: std::collections::BTreeMap<String, usize>,
    /// The accepted findings (first 50).
    pub findings: Vec<Finding>,
    /// Who accepted them (the audit actor: `uid:N`, `local` or `token:<fingerprint>`).
    pub accepted_by: String,
    /// RFC 3339 time.
    pub accepted_at: String,
}

/// One entry of the hash-chained audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AuditEntry {
    /// Position in the log (1, 2, ...).
    pub seq: i64,
    /// RFC 3339 time.
    pub time: String,
    /// Who: `uid:N` (Unix socket peer), `local` (peer unknown), `token:<fingerprint>`
    /// (the operator's `<state>/api-token` over TCP) or `token:<id>:<name>` (a tenant token).
    pub actor: String,
    /// The tenant the request acted in: a tenant token's tenant, or the tenant an
    /// operator named with `X-Strata-Tenant`; absent for operator requests without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// HTTP method.
    pub method: String,
    /// Route template, e.g. `/v1/sandboxes/{id}/exec`.
    pub route: String,
    /// Target id or name, when the route names one (or the response created one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// HTTP status of the response.
    pub status: u16,
    /// sha256 (hex) of the previous entry's canonical bytes (64 zeros for the first).
    pub prev_hash: String,
    /// sha256 (hex) of this entry's canonical bytes.
    pub hash: String,
}

/// Query of `GET /v1/audit`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
pub struct AuditQuery {
    /// Only the last N entries (default 100).
    #[serde(default)]
    pub limit: Option<u32>,
}

/// Result of `GET /v1/audit/verify`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AuditVerification {
    /// Whether the whole chain checks out.
    pub ok: bool,
    /// Entries checked.
    pub entries: u64,
    /// The first entry that does not fit the chain (its seq), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_bad: Option<i64>,
    /// Why it does not fit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}
