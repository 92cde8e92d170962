//! The warm pool (`strata daemon --warm-pool SOURCE=N`): sandboxes kept booted
//! and unassigned, which a create of their source adopts (see docs/warm-pool.md).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::Isolation;

/// One warm pool: its source, how full it is and what became of its members.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WarmPoolStatus {
    /// The image or template name, as configured.
    pub source: String,
    /// How many members the pool keeps.
    pub size: u64,
    /// Members booted and waiting now.
    pub ready: u64,
    /// The members' tier (once one has booted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<Isolation>,
    /// How many layers the members' chain has (once one has booted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_layers: Option<u64>,
    /// The checkpoint the members start from (a template's), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
    /// Creates that adopted a member.
    pub adopted: u64,
    /// Creates of this source that found the pool empty (they booted a sandbox).
    pub missed_empty: u64,
    /// Creates of this source that no member fits (another memory or disk size,
    /// a network, secrets, ...; they booted a sandbox).
    pub missed_unfit: u64,
    /// Why the last of those did not fit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_unfit: Option<String>,
    /// Members booted since the daemon started.
    pub booted: u64,
    /// Members destroyed unadopted (the source changed or went away, the init ended, a restart).
    pub drained: u64,
    /// Why the last refill failed, while it keeps failing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}
