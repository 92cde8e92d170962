//! Checkpoints, forks, restores and change sets.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{Lifecycle, ResourceLimits};

/// Request body of `POST /v1/sandboxes/{id}/checkpoints`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckpointRequest {
    /// Unique name (default: `<sandbox name>-<short id>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Free-form labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Retention: `strata gc` (and the daemon, periodically) deletes the checkpoint
    /// after this long unless it is pinned or still needed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
    /// Never expire.
    #[serde(default)]
    pub pinned: bool,
    /// Also copy the running processes (memory, open files, pids) at the same
    /// instant as the filesystem: sandboxes started from the checkpoint (fork,
    /// create, template, restore) come up with them running. Needs CRIU; refused
    /// for a sandbox with secrets (their values would be in process memory).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub processes: bool,
}

/// The processes kept with a checkpoint (see `CheckpointRequest::processes`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ProcessImage {
    /// Bytes of the process image (memory, open files) on disk.
    pub bytes: u64,
    /// Processes started through the API among them (re-registered, with their
    /// ids, in each sandbox started from the checkpoint).
    pub api_processes: u32,
    /// How long copying them took (the sandbox stayed frozen meanwhile), in milliseconds.
    pub dump_ms: u64,
}

/// An immutable point in a sandbox's history: its filesystem as a chain of layers.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Checkpoint {
    /// Id (hex).
    pub id: String,
    /// The tenant that owns it (that of the sandbox it was taken from).
    #[serde(default = "crate::tenant::default_tenant")]
    pub tenant: String,
    /// Unique name.
    pub name: String,
    /// The sandbox it was taken from.
    pub sandbox_id: String,
    /// The previous checkpoint in its lineage, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// The layer this checkpoint added (its key: `sha256:<hex>` of its tar, `+trusted`: the sandbox's files as they are); absent when
    /// nothing changed since its parent (the chain is then the parent's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer: Option<String>,
    /// Bytes in that layer.
    pub layer_size: u64,
    /// The whole chain, bottom first (image layers, then checkpoint layers).
    pub layers: Vec<String>,
    /// Name of the image at the bottom of the chain.
    pub image: String,
    /// Its id.
    pub image_id: String,
    /// Paths changed since the parent.
    pub changed_paths: u64,
    /// Free-form labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// RFC 3339 time.
    pub created_at: String,
    /// RFC 3339 time after which garbage collection may delete it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// Kept regardless of retention.
    #[serde(default)]
    pub pinned: bool,
    /// Rule-of-Two capabilities declared by its sandbox when it was taken; a
    /// sandbox started from it (fork, template) inherits them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<crate::Capability>,
    /// How long the sandbox was frozen (0 when it was not running), in milliseconds.
    pub frozen_ms: u64,
    /// Total time to take it, in milliseconds.
    pub duration_ms: u64,
    /// Its processes, when they were kept (a *warm* checkpoint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes: Option<ProcessImage>,
    /// The tier of the sandbox it was taken from: sandboxes started from it
    /// (forks, templates, E2B sandboxes) run there unless the request names
    /// another one, which a checkpoint with processes refuses (400).
    #[serde(default)]
    pub isolation: crate::Isolation,
    /// Its sandbox ran in a user namespace: sandboxes started from it do too
    /// unless the request says `userns: false`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub userns: bool,
    /// Where its sandbox's `/tmp` lived (a `disk` one is in this
    /// checkpoint's filesystem): sandboxes started from it inherit it.
    #[serde(default)]
    pub tmp: crate::TmpStorage,
    /// Its quarantine, while it is quarantined (see [`crate::Quarantine`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantine: Option<crate::Quarantine>,
}

impl Checkpoint {
    /// Label marking a checkpoint deleted while something still built on it
    /// (`DELETE /v1/checkpoints/{id}?when_unused=true`): gone as a source, kept
    /// until nothing needs it. Its value is when it was retired (RFC 3339).
    pub const RETIRED_LABEL: &'static str = "strata.retired";

    /// When the checkpoint was retired, if it was.
    pub fn retired_at(&self) -> Option<&str> {
        self.labels.get(Self::RETIRED_LABEL).map(String::as_str)
    }
}

/// Request body of `POST /v1/fork`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// A checkpoint (id or name), or a sandbox (id or name), which is checkpointed first.
    pub source: String,
    /// How many children (1 to the daemon's limit).
    pub count: u32,
    /// Children are named `<prefix>-<n>` (default: the source's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name_prefix: Option<String>,
    /// Lifecycle of the children.
    #[serde(default)]
    pub lifecycle: Lifecycle,
    /// TTL of the children.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
    /// Resource limits of each child (default: the source sandbox's, else none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<ResourceLimits>,
    /// Network of each child (default: the source sandbox's mode and rules, else `none`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<crate::NetworkSpec>,
    /// Whether the children come up with the source's running processes. A
    /// live source is then checkpointed with its processes; a checkpoint
    /// source must have them. Default: what the source checkpoint has (a live
    /// source: no, the children boot fresh).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes: Option<bool>,
    /// The children's isolation tier (default: the source's). Children with
    /// the source's processes must run on its tier (400 otherwise); a tier
    /// this host cannot run is a 501.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<crate::Isolation>,
}

/// Response of `POST /v1/fork`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ForkResult {
    /// The checkpoint the children started from.
    pub checkpoint: String,
    /// The children's ids, in order.
    pub sandboxes: Vec<String>,
    /// Wall time until every child was running, in milliseconds.
    pub duration_ms: u64,
}

/// Request body of `POST /v1/sandboxes/{id}/restore`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RestoreRequest {
    /// Checkpoint id or name to roll back to.
    pub checkpoint: String,
    /// Checkpoint the current state first (else it is discarded).
    #[serde(default)]
    pub keep_current: bool,
    /// With a checkpoint that kept processes: bring them back too (default
    /// true); false boots the rolled-back filesystem fresh.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes: Option<bool>,
}

/// Response of `POST /v1/sandboxes/{id}/restore`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RestoreResult {
    /// The sandbox after the restore.
    pub sandbox: crate::Sandbox,
    /// The checkpoint of the discarded state, with `keep_current`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept: Option<Checkpoint>,
}

/// How a path changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// New.
    Added,
    /// Changed.
    Modified,
    /// Removed.
    Deleted,
}

/// One changed path.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FileChange {
    /// Absolute path inside the sandbox.
    pub path: String,
    /// How it changed.
    pub change: ChangeKind,
    /// Kind of entry (`file`, `dir`, `symlink`, `whiteout`, `other`).
    pub kind: String,
    /// Size now, in bytes.
    pub size: u64,
}

/// Query of `GET /v1/sandboxes/{id}/diff` and `/export`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, utoipa::IntoParams)]
pub struct DiffQuery {
    /// Compare against this checkpoint (default: the sandbox's last checkpoint,
    /// else the image or checkpoint it was created from).
    #[serde(default)]
    pub against: Option<String>,
}

/// Query of `DELETE /v1/checkpoints/{id}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, utoipa::IntoParams)]
pub struct DeleteCheckpointQuery {
    /// When something still builds on the checkpoint, retire it instead of
    /// answering 409: it is gone as a source at once (404 to create, fork,
    /// restore and template), and the retention GC frees its layers once
    /// nothing needs them. The answer is then 200 with a [`CheckpointDeleted`].
    #[serde(default)]
    pub when_unused: bool,
}

/// Answer of `DELETE /v1/checkpoints/{id}?when_unused=true`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CheckpointDeleted {
    /// The checkpoint.
    pub id: String,
    /// Removed now (nothing needed it).
    pub deleted: bool,
    /// What keeps its layers until it goes (sandboxes, checkpoints, templates).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept_by: Vec<String>,
}

/// What `POST /v1/gc` removed.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct GcReport {
    /// Checkpoints deleted because their retention expired.
    pub checkpoints_expired: Vec<String>,
    /// Layers no image, sandbox or checkpoint referenced any more.
    pub layers_removed: usize,
    /// Bytes those layers held.
    pub bytes_freed: u64,
}

/// One node of a lineage tree.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LineageNode {
    /// `image`, `sandbox`, `checkpoint` or `template`.
    pub kind: String,
    /// Id (name for images and templates).
    pub id: String,
    /// Display name.
    pub name: String,
    /// Id of the parent node (absent for the root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// State, sizes, generation: a short human-readable note.
    pub detail: String,
}

/// Response of `GET /v1/lineage/{id}`: the tree of images, checkpoints, forks and
/// templates around a sandbox or checkpoint, parents before children.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Lineage {
    /// The node asked about.
    pub focus: String,
    /// Nodes.
    pub nodes: Vec<LineageNode>,
}
