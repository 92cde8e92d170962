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
    /// Secrets, written as files on a read-only tmpfs at [`SECRETS_DIR`]
    /// (not mounted when empty). They travel to the helpers over pipes only.
    #[serde(default)]
    pub secrets: Vec<SecretFile>,
    /// Owner of the secret files: the image's default user (`name`, `uid[:gid]`),
    /// resolved against the sandbox's /etc/passwd; root when absent or unknown.
    #[serde(default)]
    pub secrets_owner: Option<String>,
    /// A network namespace to join instead of making a new one (egress
    /// sandboxes: the daemon prepared it with a veth link; see strata-net).
    #[serde(default)]
    pub netns_path: Option<PathBuf>,
    /// Contents for the sandbox's /etc/resolv.conf (bound from /run/strata,
    /// never written to a layer); `None` keeps the image's.
    #[serde(default)]
    pub resolv_conf: Option<String>,
    /// Run in a user namespace mapping the sandbox's ids onto this host range
    /// (namespace tier; see [`crate::namespace::mounts::Idmap`]). `None`: the
    /// sandbox's root is host root, with a reduced capability set.
    #[serde(default)]
    pub userns: Option<strata_api::UserNamespace>,
    /// Where its `/tmp` lives (a directory of its root, or scratch space).
    pub tmp: strata_api::TmpStorage,
    /// Egress of a sandbox in a user namespace: it makes its network namespace
    /// itself (one the host does not own could not be joined), and the tier
    /// plugs this link into it once it exists, at start and inside a restore,
    /// before any process of the sandbox runs. `netns_path` is then `None`.
    #[serde(default)]
    pub userns_link: Option<UsernsLink>,
    /// The addresses of an egress sandbox's link (with `netns_path`), for a
    /// tier whose guest takes the sandbox's address itself (the microvm tier
    /// bridges the namespace's `eth0` to the guest's network device).
    #[serde(default)]
    pub link: Option<strata_net::Link>,
}

/// The link of an egress sandbox in a user namespace (see [`SandboxSpec::userns_link`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsernsLink {
    /// The host side's interface name (the daemon's filter rules name it).
    pub ifname: String,
    /// Its addresses.
    pub link: strata_net::Link,
}

impl SandboxSpec {
    /// Opens the sandbox's log for appending (what its helpers write before,
    /// or instead of, the sandbox's own processes).
    pub fn open_log(&self) -> Result<std::fs::File, crate::RuntimeError> {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .map_err(|e| crate::RuntimeError::sys(format!("open {}", self.log_path.display()), e))
    }
}

/// Where a sandbox's secrets are mounted (a tmpfs of its own).
pub const SECRETS_DIR: &str = "/run/secrets";

/// One secret file.
#[derive(Clone, Serialize, Deserialize)]
pub struct SecretFile {
    /// File name under [`SECRETS_DIR`] (validated by the daemon: `[A-Za-z_][A-Za-z0-9_]*`).
    pub name: String,
    /// The value.
    pub data: Vec<u8>,
}

impl std::fmt::Debug for SecretFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the value.
        f.debug_struct("SecretFile").field("name", &self.name).field("bytes", &self.data.len()).finish()
    }
}

pub use strata_init::exec::{ExecReport, ExecSpec};
/// A terminal size, as a process on a pseudo-terminal has one.
pub use strata_init::pty::TtySize;

/// The environment variable naming the descriptor an exec command
/// ([`crate::Runtime::exec_command`]) reports its process on: the caller
/// passes the write end of a pipe under this name.
pub use strata_init::exec::REPORT_FD_ENV;

/// Paths (relative to a sandbox's root) that strata writes to give a sandbox
/// its identity: never part of a checkpoint's or a diff's changes, whatever
/// the tier.
pub use crate::namespace::mounts::IDENTITY_PATHS;
