//! Lifecycle policy models: what happens to an idle, old or parked sandbox,
//! and keep-alive leases that hold a sandbox awake.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::Lifecycle;

/// Idle timeout used when none is given: a sandbox with no activity for this
/// long gets its `on_idle` action.
pub const DEFAULT_IDLE_TIMEOUT: &str = "15m";

/// What happens to a running sandbox once it has been idle for its idle timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnIdle {
    /// Dump processes and memory to disk and release CPU and RAM (default for persistent sandboxes).
    Standby,
    /// Stop the processes; the filesystem is kept.
    Stop,
    /// Destroy the sandbox (default for ephemeral sandboxes).
    Destroy,
    /// Never act on idleness.
    Keep,
}

impl OnIdle {
    /// The snake_case wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            OnIdle::Standby => "standby",
            OnIdle::Stop => "stop",
            OnIdle::Destroy => "destroy",
            OnIdle::Keep => "keep",
        }
    }
}

impl std::fmt::Display for OnIdle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The lifecycle policy in force for a sandbox (every field resolved).
/// Durations are strings like "30s", "15m", "2h", "7d".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SandboxPolicy {
    /// Action once the sandbox has been idle for `idle_timeout`.
    pub on_idle: OnIdle,
    /// How long a running sandbox must be idle before `on_idle` applies.
    pub idle_timeout: String,
    /// Hard cap on a sandbox's age (since creation): a run that crosses it gets
    /// `on_max_lifetime`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_lifetime: Option<String>,
    /// What a run crossing `max_lifetime` gets: `stop`, `standby` or `destroy`
    /// (absent: stop when persistent, destroy when ephemeral).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_max_lifetime: Option<OnIdle>,
    /// Archive a sandbox after this long in `stopped`/`standby`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archive_after: Option<String>,
    /// Destroy a sandbox after this long in `stopped`/`standby`/`archived`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_after: Option<String>,
    /// Commands run inside the sandbox at lifecycle transitions.
    #[serde(default, skip_serializing_if = "LifecycleHooks::is_empty")]
    pub hooks: LifecycleHooks,
    /// Flush rules: paths (absolute, or `~/...` for the image user's home) whose
    /// contents are wiped inside the sandbox before every checkpoint (and so
    /// before fork and template creation from the sandbox).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flush: Vec<String>,
    /// Rule-of-Two capabilities declared for the sandbox (or inherited from the
    /// checkpoint it started from). What its configuration implies (secrets,
    /// egress, previews) is added to these; see `Sandbox::capabilities`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<crate::Capability>,
    /// Whether a call that needs the sandbox running (exec, files, previews)
    /// brings it back from `paused`, `standby`, `stopped` or `archived` (the
    /// default). When off, such a call is a 409 with the current state until
    /// an explicit resume or start.
    #[serde(default = "yes")]
    pub resume_on_access: bool,
    /// Run the state check (the hygiene scan, against the filesystem, without
    /// resuming a parked sandbox) this often, e.g. "6h"; at least
    /// [`crate::MIN_CHECK_EVERY`]. Each check is a `checked` event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_every: Option<String>,
    /// What a check with findings leads to (default `record`).
    #[serde(default, skip_serializing_if = "is_record")]
    pub on_findings: crate::OnFindings,
    /// A writable layer larger than this (e.g. "5G") is a check finding (`accumulation.writable`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_writable: Option<String>,
    /// A base (image or checkpoint) older than this (e.g. "30d") is a check finding (`accumulation.age`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<String>,
}

fn is_record(o: &crate::OnFindings) -> bool {
    *o == crate::OnFindings::Record
}

fn yes() -> bool {
    true
}

/// Commands run inside a sandbox around transitions (e.g. to flush a dev
/// server's state before standby). Each is an argv; a hook that fails or
/// outlives its timeout is recorded as an event and does not block the transition.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LifecycleHooks {
    /// Run before standby (the processes are still running).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_standby: Option<Vec<String>>,
    /// Run before a stop (manual or automatic).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_stop: Option<Vec<String>>,
    /// Run after a resume (from standby, paused or stopped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_resume: Option<Vec<String>>,
    /// How long each hook may run (default "30s").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
}

impl LifecycleHooks {
    /// Whether no hook is set.
    pub fn is_empty(&self) -> bool {
        self == &LifecycleHooks::default()
    }
}

impl SandboxPolicy {
    /// The default policy of a lifecycle. Defaults never lose work: persistent
    /// sandboxes go to standby when idle, ephemeral ones (whose state is not
    /// meant to survive) are destroyed.
    pub fn default_for(lifecycle: Lifecycle) -> Self {
        SandboxPolicy {
            on_idle: match lifecycle {
                Lifecycle::Persistent => OnIdle::Standby,
                Lifecycle::Ephemeral => OnIdle::Destroy,
            },
            idle_timeout: DEFAULT_IDLE_TIMEOUT.to_string(),
            max_lifetime: None,
            on_max_lifetime: None,
            archive_after: None,
            delete_after: None,
            hooks: LifecycleHooks::default(),
            flush: Vec::new(),
            capabilities: Vec::new(),
            resume_on_access: true,
            check_every: None,
            on_findings: crate::OnFindings::Record,
            max_writable: None,
            max_age: None,
        }
    }
}

impl Default for SandboxPolicy {
    fn default() -> Self {
        SandboxPolicy::default_for(Lifecycle::default())
    }
}

/// Policy fields to set. Absent fields keep their current value (at creation:
/// the lifecycle's default). `max_lifetime`, `archive_after` and `delete_after`
/// accept `"none"` to remove the limit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyPatch {
    /// Action once idle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_idle: Option<OnIdle>,
    /// Idle timeout, e.g. "10m".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<String>,
    /// Maximum age, e.g. "24h", or "none".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_lifetime: Option<String>,
    /// Action at `max_lifetime`: `stop`, `standby` or `destroy` (`keep` is refused: use `max_lifetime: "none"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_max_lifetime: Option<OnIdle>,
    /// Time in stopped/standby before archiving, or "none".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archive_after: Option<String>,
    /// Time in stopped/standby/archived before destroying, or "none".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_after: Option<String>,
    /// Lifecycle hooks (replace the current ones as a whole).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hooks: Option<LifecycleHooks>,
    /// Flush rules (replace the current ones as a whole; an empty list removes them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flush: Option<Vec<String>>,
    /// Whether calls that need it running bring a parked sandbox back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_on_access: Option<bool>,
    /// How often its state is checked, e.g. "6h", or "none".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_every: Option<String>,
    /// What a check with findings leads to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_findings: Option<crate::OnFindings>,
    /// Largest writable layer before a check finds it, e.g. "5G", or "none".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_writable: Option<String>,
    /// Oldest base before a check finds it, e.g. "30d", or "none".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<String>,
}

impl PolicyPatch {
    /// Whether the patch sets nothing.
    pub fn is_empty(&self) -> bool {
        self == &PolicyPatch::default()
    }
}

/// Request body of `PATCH /v1/sandboxes/{id}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateSandboxRequest {
    /// Policy fields to change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyPatch>,
    /// Rule-of-Two capabilities to declare in addition to those already declared
    /// (a declared capability cannot be dropped). A declaration that would give
    /// the sandbox all three needs an approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<Vec<crate::Capability>>,
}

/// A keep-alive lease: while it is held (until `expires_at`), the sandbox is
/// not idle and no idle, archive or delete policy applies to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Lease {
    /// Lease id (hex).
    pub id: String,
    /// The sandbox it holds.
    pub sandbox_id: String,
    /// RFC 3339 creation time.
    pub created_at: String,
    /// RFC 3339 time at which it lapses unless renewed.
    pub expires_at: String,
}

/// Request body of `POST /v1/sandboxes/{id}/leases` and `.../leases/{lease}/renew`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LeaseRequest {
    /// How long the lease holds from now, e.g. "10m".
    #[serde(rename = "for")]
    pub duration: String,
}
