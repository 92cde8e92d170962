//! State over time: quarantine of sandboxes and checkpoints, and the checks a
//! policy runs at set times (`check_every`, `on_findings`).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The shortest `check_every` a policy may ask for.
pub const MIN_CHECK_EVERY: &str = "1m";

/// Why and since when a sandbox or checkpoint is quarantined. A quarantined
/// object can still be inspected, diffed, exported and destroyed, but not
/// forked, promoted to a template, restored into a new sandbox or given egress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Quarantine {
    /// Why (the operator's words, or the check's findings).
    pub reason: String,
    /// RFC 3339 time it was placed.
    pub since: String,
    /// Who placed it: `check` (a scheduled or requested check), `inherited`
    /// (a checkpoint of a quarantined sandbox), or the caller's identity.
    pub by: String,
    /// The network the sandbox had when it was placed (egress is cut while
    /// quarantined; lifting puts this back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_before: Option<crate::NetworkSpec>,
}

/// Body of `POST /v1/quarantine/{id}` (place) and `DELETE /v1/quarantine/{id}` (lift).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuarantineRequest {
    /// Why: required, recorded in the events and the audit log.
    pub reason: String,
}

/// A quarantined object, as listed by `GET /v1/quarantine`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct QuarantineEntry {
    /// `sandbox` or `checkpoint`.
    pub kind: String,
    /// Its id.
    pub id: String,
    /// Its name.
    pub name: String,
    /// Its tenant.
    pub tenant: String,
    /// The quarantine.
    pub quarantine: Quarantine,
}

/// What a check with findings leads to (`on_findings` in a policy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnFindings {
    /// Only the event (the default).
    #[default]
    Record,
    /// Quarantine the sandbox.
    Quarantine,
    /// Run the sandbox's flush rules (when it runs; otherwise recorded only).
    Flush,
    /// Stop the sandbox (its filesystem is kept).
    Stop,
}

impl OnFindings {
    /// The snake_case wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            OnFindings::Record => "record",
            OnFindings::Quarantine => "quarantine",
            OnFindings::Flush => "flush",
            OnFindings::Stop => "stop",
        }
    }
}

impl std::fmt::Display for OnFindings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The result of one check of a sandbox (`POST /v1/sandboxes/{id}/check`,
/// and the detail of each `checked` event).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CheckReport {
    /// The sandbox.
    pub sandbox_id: String,
    /// RFC 3339 time the check ran.
    pub time: String,
    /// `scheduled` (its `check_every`) or `requested`.
    pub trigger: String,
    /// The state the sandbox was in (a sandbox in standby is checked without resuming it).
    pub state: crate::SandboxState,
    /// Paths its layers change above its image.
    pub changed_paths: u64,
    /// Findings that count (credential patterns in verified package files do not).
    pub findings: Vec<crate::Finding>,
    /// What followed: `none` (no findings) or the policy's `on_findings`
    /// (`record`, `quarantine`, `flush`, `stop`), with what it did.
    pub action: String,
    /// How long the check took.
    pub duration_ms: u64,
}
