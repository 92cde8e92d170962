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
    /// Tier name (`namespace`, `microvm`).
    pub name: String,
    /// Usable on this host.
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
