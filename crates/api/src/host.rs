//! Host capability report (`strata doctor`) and daemon info.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One probed host feature.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FeatureCheck {
    /// Feature name (`user_namespace`, `overlayfs`, `criu`, ...).
    pub name: String,
    /// Whether it is usable.
    pub available: bool,
    /// What was found (version, mode, path).
    pub detail: String,
    /// What is disabled when it is missing (empty when available).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub disables: String,
}

/// An isolation tier and whether this host can run it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TierReport {
    /// Tier name (`namespace`, `gvisor`, `microvm`).
    pub name: String,
    /// Usable on this host.
    pub available: bool,
    /// Why (or why not).
    pub detail: String,
    /// What a sandbox of this tier can do here, capability by capability
    /// (create, exec, files, egress, limits, disk quota, checkpoint, fork,
    /// standby, warm checkpoint, PTY), each with why (or why not).
    #[serde(default)]
    pub capabilities: Vec<TierCapability>,
}

/// One capability of a tier on this host (a cell of `strata doctor`'s matrix).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TierCapability {
    /// `create`, `exec`, `files`, `egress`, `limits`, `disk_quota`,
    /// `checkpoint`, `fork`, `standby`, `warm_checkpoint` or `pty`.
    pub name: String,
    /// Whether a sandbox of the tier has it on this host.
    pub available: bool,
    /// Why (or why not).
    pub detail: String,
}

/// Response of `GET /v1/doctor` (and `strata doctor` without a daemon).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DoctorReport {
    /// Kernel release.
    pub kernel: String,
    /// `v1`, `v2` or `hybrid`.
    pub cgroup_version: String,
    /// Every probed feature.
    pub features: Vec<FeatureCheck>,
    /// Isolation tiers.
    pub tiers: Vec<TierReport>,
    /// Names in the daemon's metadata that could be read as ids (from before
    /// names like that were refused). Only from a daemon.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names_like_ids: Vec<NameLikeId>,
}

/// Response of `GET /v1/info`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DaemonInfo {
    /// strata version.
    pub version: String,
    /// State directory.
    pub state_dir: String,
    /// Number of sandboxes by state.
    pub sandboxes: std::collections::BTreeMap<String, u64>,
    /// Number of images.
    pub images: u64,
    /// The limits a sandbox gets for every field its create request leaves out
    /// (`strata daemon --default-memory|--default-cpus|--default-pids|--default-disk`;
    /// an absent field has no default limit).
    #[serde(default)]
    pub default_limits: crate::ResourceLimits,
}

/// A user-chosen name that could be read as an id or an id prefix (made only
/// of hex digits). New objects cannot get one; records from before that rule
/// keep theirs and are listed by `strata doctor` (`names_like_ids`). A key
/// resolves by exact id before exact name, so such a name never hides an id;
/// it can still win over an id *prefix* of another object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NameLikeId {
    /// `sandbox`, `checkpoint`, `template` (its checkpoint's id), `pipeline_run`, `token` or `image`.
    pub kind: String,
    /// The object's id.
    pub id: String,
    /// Its name.
    pub name: String,
    /// Its tenant (images are shared: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}
