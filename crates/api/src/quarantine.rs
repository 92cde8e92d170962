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

/// What a sandbox has accumulated over time (`GET /v1/sandboxes/{id}/accumulation`,
/// `strata inspect`, `strata ps --wide`, and each check).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Accumulation {
    /// Bytes of the files in its writable layer (everything it changed above
    /// the layers it started from, checkpoints included).
    pub writable_bytes: u64,
    /// Entries (files, directories, links, whiteouts) in its writable layer.
    pub writable_files: u64,
    /// The writable layer's growth per day of the sandbox's life (its bytes
    /// when it is less than a day old).
    pub growth_per_day_bytes: u64,
    /// Bytes of the files added or modified since its last checkpoint (or creation).
    pub since_checkpoint_bytes: u64,
    /// Paths added, modified or deleted since then (what `strata diff` lists).
    pub since_checkpoint_paths: u64,
    /// RFC 3339 time of its last checkpoint, else of its creation.
    pub checkpoint_since: String,
    /// Its checkpoints that still exist.
    pub checkpoints: u64,
    /// The bytes of their layers.
    pub checkpoint_bytes: u64,
    /// What it started from: `image NAME` or `checkpoint NAME` (a template's is a checkpoint).
    pub base: String,
    /// RFC 3339 time its base was made (the image's import, the checkpoint's creation).
    pub base_created_at: String,
    /// Whole days since then.
    pub base_age_days: u64,
    /// Whole days since the sandbox was created.
    pub age_days: u64,
    /// The image version at the bottom of its chain (`name@version`), while registered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The newest version of that image's name, when it is another (`strata rebase` moves onto it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub newer_image: Option<String>,
    /// Whole days between the import of its image version and of its name's newest (0 when on the newest).
    #[serde(default)]
    pub days_behind_newest: u64,
    /// The policy limits it is over (`max_writable`, `max_age`), each with why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub over: Vec<String>,
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
    /// What it has accumulated (its `max_writable` and `max_age` count as findings).
    pub accumulation: Accumulation,
    /// What followed: `none` (no findings) or the policy's `on_findings`
    /// (`record`, `quarantine`, `flush`, `stop`), with what it did.
    pub action: String,
    /// How long the check took.
    pub duration_ms: u64,
}
