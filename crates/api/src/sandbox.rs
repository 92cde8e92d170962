//! Sandbox models: states, create requests, inspect output, lifecycle events.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Lifecycle state of a sandbox (see docs/lifecycle.md for the transition table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    /// Root filesystem and namespaces are being prepared.
    Creating,
    /// The sandbox's init is alive; processes can be executed.
    Running,
    /// Processes frozen by the cgroup freezer; memory kept, no CPU.
    Paused,
    /// Processes and memory dumped to disk; host CPU and RAM released.
    Standby,
    /// Filesystem kept, no processes.
    Stopped,
    /// Layers packed into the object store; local disk freed.
    Archived,
    /// Gone; only the record remains until it is purged.
    Destroyed,
    /// A transition failed; `state_reason` says why.
    Error,
    /// The sandbox's processes disappeared outside strata's control.
    Lost,
}

impl SandboxState {
    /// All states, in declaration order.
    pub const ALL: [SandboxState; 9] = [
        SandboxState::Creating,
        SandboxState::Running,
        SandboxState::Paused,
        SandboxState::Standby,
        SandboxState::Stopped,
        SandboxState::Archived,
        SandboxState::Destroyed,
        SandboxState::Error,
        SandboxState::Lost,
    ];

    /// The snake_case wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Creating => "creating",
            SandboxState::Running => "running",
            SandboxState::Paused => "paused",
            SandboxState::Standby => "standby",
            SandboxState::Stopped => "stopped",
            SandboxState::Archived => "archived",
            SandboxState::Destroyed => "destroyed",
            SandboxState::Error => "error",
            SandboxState::Lost => "lost",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<SandboxState> {
        SandboxState::ALL.into_iter().find(|st| st.as_str() == s)
    }
}

impl std::fmt::Display for SandboxState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What happens to a sandbox when its run ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Lifecycle {
    /// Destroyed when its run ends or its TTL expires; nothing survives unless exported.
    Ephemeral,
    /// Kept until removed; its TTL (if any) stops it instead of destroying it.
    #[default]
    Persistent,
}

/// Resource limits applied through cgroups. In a create request a field left
/// out takes the daemon's default; a sandbox shows the limits it runs with (a
/// field absent there has no limit: the operator's `--default-* none`). Out of
/// bounds is a 400 naming the field (see docs/security.md, "Defaults,
/// admission and quotas").
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ResourceLimits {
    /// Memory limit in bytes (processes beyond it are OOM-killed inside the
    /// sandbox; also the size of its /tmp). 16 MiB to MemTotal. Default: the
    /// daemon's `--default-memory` (2 GiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// CPU quota in cores (e.g. 0.5, 2). 0.01 to the host's CPUs. Default: the
    /// daemon's `--default-cpus` (2, or the host's CPUs when fewer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    /// Maximum number of processes/threads. 16 to pid_max. Default: the
    /// daemon's `--default-pids` (1024).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u64>,
    /// Size of the sandbox's writable layer in bytes (its own filesystem: writes
    /// beyond it fail with ENOSPC). 16 MiB to the state filesystem's size.
    /// Default: the daemon's `--default-disk` (10 GiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_bytes: Option<u64>,
    /// How `disk_bytes` is enforced, set by the daemon (ignored in requests):
    /// `enforced (...)`, `none` (no limit asked) or `unavailable (reason)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_quota: Option<String>,
}

/// An isolation tier: what stands between a sandbox's code and the host.
/// `namespace`: Linux namespaces, cgroups, a reduced capability set and
/// seccomp on the host's kernel; `gvisor`: a user-space kernel (runsc)
/// between the sandbox and the host kernel; `microvm`: a guest kernel of its
/// own in a virtual machine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// Linux namespaces on the host's kernel.
    #[default]
    Namespace,
    /// gVisor's user-space kernel (runsc).
    Gvisor,
    /// A microVM with its own guest kernel (QEMU).
    Microvm,
}

impl Isolation {
    /// Every tier, weakest boundary first.
    pub const ALL: [Isolation; 3] = [Isolation::Namespace, Isolation::Gvisor, Isolation::Microvm];

    /// The tier's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::Namespace => "namespace",
            Isolation::Gvisor => "gvisor",
            Isolation::Microvm => "microvm",
        }
    }

    /// The tier a name means (`None` for an unknown name).
    pub fn parse(s: &str) -> Option<Isolation> {
        Isolation::ALL.into_iter().find(|t| t.as_str() == s)
    }
}

impl std::fmt::Display for Isolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Request body of `POST /v1/sandboxes`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandboxRequest {
    /// Image name or id to start from.
    pub source: String,
    /// Optional unique name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Ephemeral or persistent.
    #[serde(default)]
    pub lifecycle: Lifecycle,
    /// Time to live, e.g. "10m", "2h". Ephemeral sandboxes are destroyed when it
    /// expires, persistent ones are stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
    /// Resource limits.
    #[serde(default)]
    pub limits: ResourceLimits,
    /// Environment variables added to every process (after the image's).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Hostname inside the sandbox (defaults to the sandbox's short id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// Free-form labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Lifecycle policy; absent fields take the lifecycle's defaults
    /// (persistent: standby after 15m idle; ephemeral: destroy after 15m idle).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<crate::PolicyPatch>,
    /// Secrets, injected as files under `/run/secrets` (never into any layer,
    /// checkpoint, standby image, fork, template or archive); see docs/security.md.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<crate::SecretSpec>,
    /// Network: `none` (loopback only, the default) or `egress` with allow
    /// rules (see docs/network.md). A malformed rule is a 400 naming it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<crate::NetworkSpec>,
    /// Rule-of-Two capabilities the sandbox declares (e.g. `untrusted_input` for
    /// a sandbox that reads user uploads); those its configuration implies are
    /// derived. All three at once need an approval (403 `approval_required`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<crate::Capability>,
    /// Let setuid/setgid binaries (`sudo`, `su`) take effect inside: processes
    /// run without `no_new_privs`. What they can become is still the sandbox's
    /// root, with its reduced capability set and seccomp filter — no more than
    /// a process started as root through the API. Off by default; on for the
    /// E2B API's sandboxes (E2B's base image has passwordless sudo). Forks inherit it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_setuid: bool,
    /// From a checkpoint or template that kept processes: start with them
    /// running (default true); false boots its filesystem fresh.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes: Option<bool>,
    /// Isolation tier (`namespace`, `gvisor`, `microvm`). Default: the daemon's
    /// `--default-isolation` (`namespace`). A tier this host cannot run is a 501
    /// naming what is missing (`strata doctor` lists each tier and why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<Isolation>,
    /// Namespace tier: run the sandbox in a user namespace of its own, its
    /// root mapped to an unprivileged host uid/gid range (a process that
    /// escapes its namespaces is nobody on the host). Default: the source
    /// checkpoint's for forks and templates, else the daemon's
    /// `--default-userns` (on where the host supports it), and on for
    /// sandboxes that declare `untrusted_input`. `true` on another tier is a
    /// 400 (gVisor and microVMs have their own boundary).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub userns: Option<bool>,
    /// Where `/tmp` lives (default `disk`: part of the sandbox's filesystem;
    /// from a checkpoint or template: its sandbox's). A checkpoint that kept
    /// processes starts only with its own (400 otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tmp: Option<TmpStorage>,
}

/// Where a sandbox's `/tmp` lives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TmpStorage {
    /// A directory of its filesystem (the writable layer), as in Docker and
    /// E2B: in checkpoints, forks, templates, diffs, scans, exports and
    /// filesystem-only resumes, on its disk quota; `--flush /tmp` empties it.
    #[default]
    Disk,
    /// Scratch space that is never kept: a tmpfs (charged to the memory
    /// limit) on the namespace tier, a host directory outside the writable
    /// layer on the gVisor tier; emptied at every cold start and left out of
    /// checkpoints, diffs and exports (a standby with processes keeps it).
    Tmpfs,
}

impl TmpStorage {
    /// `disk` or `tmpfs`.
    pub fn as_str(self) -> &'static str {
        match self {
            TmpStorage::Disk => "disk",
            TmpStorage::Tmpfs => "tmpfs",
        }
    }
}

/// The host uid/gid range a sandbox's user namespace maps its ids onto:
/// in-sandbox id `n` is host id `host_base + n`, for `n < size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct UserNamespace {
    /// Host uid (and gid) of the sandbox's root.
    pub host_base: u32,
    /// How many ids are mapped.
    pub size: u32,
}

impl UserNamespace {
    /// The in-sandbox id of host id `host`, if the range maps it.
    pub fn to_inner(&self, host: u32) -> Option<u32> {
        host.checked_sub(self.host_base).filter(|n| *n < self.size)
    }
}

/// A sandbox as listed by `GET /v1/sandboxes` and inspected by `GET /v1/sandboxes/{id}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Sandbox {
    /// Unique id (hex).
    pub id: String,
    /// The tenant that owns it (see docs/security.md, "Tenants").
    #[serde(default = "crate::tenant::default_tenant")]
    pub tenant: String,
    /// Unique name (defaults to the id).
    pub name: String,
    /// Current lifecycle state.
    pub state: SandboxState,
    /// Reason code of the last transition (e.g. `user`, `ttl_expired`, `init_exited`).
    pub state_reason: String,
    /// Detail for the last transition, when there is one (e.g. an error message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_detail: Option<String>,
    /// The image (name) the sandbox was created from.
    pub source: String,
    /// The resolved image id.
    pub image_id: String,
    /// Isolation tier (`namespace`, `gvisor`, `microvm`: see [`Isolation`]).
    pub runtime: String,
    /// Ephemeral or persistent.
    pub lifecycle: Lifecycle,
    /// RFC 3339 creation time.
    pub created_at: String,
    /// RFC 3339 time of the last state change.
    pub updated_at: String,
    /// RFC 3339 time it entered `stopped`, `standby` or `archived` (kept while it
    /// moves among them); `archive_after` and `delete_after` count from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inactive_since: Option<String>,
    /// Lifecycle policy in force.
    #[serde(default)]
    pub policy: crate::SandboxPolicy,
    /// Time to live of each run (e.g. "10m"); counted from the last start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
    /// RFC 3339 time at which the TTL expires, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// Resource limits.
    pub limits: ResourceLimits,
    /// Environment added to every process.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Hostname inside the sandbox.
    pub hostname: String,
    /// Free-form labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Host pid of the sandbox's init while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_pid: Option<i32>,
    /// Number of processes killed by the OOM killer inside this sandbox's memory limit.
    #[serde(default)]
    pub oom_kills: u64,
    /// The checkpoint it was created from or last restored to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_checkpoint: Option<String>,
    /// Its most recent checkpoint (the parent of the next one; diffs are relative to it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_checkpoint: Option<String>,
    /// Fork generation: 0 for sandboxes created from an image, parent's + 1 for forks.
    /// Readable inside as /run/strata/generation and $STRATA_FORK_GENERATION.
    #[serde(default)]
    pub fork_generation: u32,
    /// What its standby keeps, while it is in standby.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standby: Option<StandbyInfo>,
    /// Its secrets (names and sizes only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<crate::SecretRef>,
    /// Its network mode and allow rules.
    #[serde(default)]
    pub network: crate::NetworkSpec,
    /// The Rule-of-Two capabilities it holds, declared and derived, each with its reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<crate::CapabilityGrant>,
    /// Whether setuid/setgid binaries take effect inside (see `CreateSandboxRequest::allow_setuid`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_setuid: bool,
    /// Its user namespace (namespace tier, `userns: true`); absent: its root is host root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub userns: Option<UserNamespace>,
    /// Where its `/tmp` lives.
    #[serde(default)]
    pub tmp: TmpStorage,
    /// Its quarantine, while it is quarantined (see [`crate::Quarantine`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantine: Option<crate::Quarantine>,
}

/// How a sandbox in standby keeps its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StandbyMode {
    /// Processes, memory and open files were dumped (CRIU); resume brings back the same processes.
    Processes,
    /// Only the filesystem was kept (asked for with `fs_only`); resume starts init afresh.
    FsOnly,
}

/// Request body of `POST /v1/sandboxes/{id}/standby`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StandbyRequest {
    /// Keep only the filesystem: processes are stopped (recorded on the sandbox as
    /// `fs_only`). Without it, standby fails when processes cannot be dumped.
    #[serde(default)]
    pub fs_only: bool,
}

/// Request body of `POST /v1/sandboxes/{id}/resume` (optional).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResumeRequest {
    /// From standby: start the sandbox afresh from its filesystem and drop
    /// its process image (e.g. one this host cannot restore: another runsc
    /// or CPU). Its processes are recorded as lost.
    #[serde(default)]
    pub fs_only: bool,
}

/// The standby image of a sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct StandbyInfo {
    /// What was kept.
    pub mode: StandbyMode,
    /// RFC 3339 time it went to standby.
    pub created_at: String,
    /// Bytes of the process image on disk (0 for `fs_only`).
    pub image_bytes: u64,
    /// Processes started through the API that were suspended with it.
    pub api_processes: usize,
    /// Milliseconds the dump took.
    pub dump_ms: u64,
    /// Why processes were not kept, for `fs_only`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Response of `POST /v1/sandboxes/{id}/resume` (and reported by calls that
/// resumed a sandbox on access, in the `strata-resumed` header).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ResumeResult {
    /// The state it was resumed from (`standby`, `paused` or `stopped`).
    pub from: crate::SandboxState,
    /// Milliseconds the resume took.
    pub duration_ms: u64,
    /// Whether the same processes came back (false: init was started afresh).
    pub processes_restored: bool,
    /// The sandbox afterwards.
    pub sandbox: Sandbox,
}

/// Response of `POST /v1/sandboxes`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CreatedSandbox {
    /// The new sandbox's id.
    pub id: String,
    /// The new sandbox's name.
    pub name: String,
}

/// Query of `DELETE /v1/sandboxes/{id}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, utoipa::IntoParams)]
pub struct RemoveQuery {
    /// Remove even when running (stops it first).
    #[serde(default)]
    pub force: bool,
}

/// A recorded lifecycle transition.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SandboxEvent {
    /// Monotonic event sequence number.
    pub seq: i64,
    /// Sandbox id.
    pub sandbox_id: String,
    /// RFC 3339 time.
    pub time: String,
    /// State before (absent for creation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<SandboxState>,
    /// State after.
    pub to: SandboxState,
    /// Reason code (`user`, `ttl_expired`, `init_exited`, `oom`, `daemon_restart`, ...).
    pub reason: String,
    /// Optional detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Duration of the transition in milliseconds.
    pub duration_ms: u64,
}
