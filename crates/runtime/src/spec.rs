//! What the daemon hands to the runtime (and the runtime to its helpers).

use std::collections::BTreeMap;
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

/// One process to run inside a sandbox.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ExecSpec {
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Environment (already merged: image, sandbox, request). PATH, HOME and
    /// HOSTNAME are filled in when absent.
    pub env: BTreeMap<String, String>,
    /// Working directory (default: the user's home if it exists, else `/`).
    pub cwd: Option<String>,
    /// `name`, `uid`, `name:group` or `uid:gid` (default root).
    pub user: Option<String>,
}

/// Lines the exec helper writes to file descriptor 3, one per line, as JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ExecReport {
    /// The process was forked: its host pid (also its process group) and its pid inside the sandbox.
    Started {
        /// Host pid.
        host_pid: i32,
    },
    /// Its pid inside the sandbox's pid namespace.
    NsPid {
        /// Pid inside.
        pid: i32,
    },
    /// It could not be started.
    SpawnError {
        /// Why.
        message: String,
    },
    /// It exited with a code.
    Exited {
        /// Exit code.
        code: i32,
    },
    /// It was killed by a signal.
    Signaled {
        /// Signal number.
        signal: i32,
    },
}
