//! What the daemon hands to the runtime (and the runtime to its helpers).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use strata_api::ResourceLimits;

/// Everything needed to start a sandbox's init.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// Sandbox id (names the cgroup).
    pub id: String,
    /// Hostname inside the sandbox.
    pub hostname: String,
    /// Read-only layers, bottom first (overlay lower directories).
    pub lower_dirs: Vec<PathBuf>,
    /// The private writable layer.
    pub upper_dir: PathBuf,
    /// Overlay work directory (same filesystem as `upper_dir`).
    pub work_dir: PathBuf,
    /// Where the overlay is mounted inside init's mount namespace.
    pub rootfs_dir: PathBuf,
    /// Resource limits.
    pub limits: ResourceLimits,
    /// Where init's own diagnostics go before it closes its descriptors.
    pub log_path: PathBuf,
    /// Written to /etc/machine-id (32 hex characters, unique per sandbox).
    pub machine_id: String,
    /// Fork generation, written to /run/strata/generation.
    pub fork_generation: u32,
}

pub use strata_init::exec::{ExecReport, ExecSpec};
