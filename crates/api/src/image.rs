//! Images: import requests and image records.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Request body of `POST /v1/images/import`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ImportImageRequest {
    /// Path on the daemon's host: an OCI image layout directory, a `docker save`
    /// archive, a rootfs tarball (.tar, .tar.gz) or a rootfs directory.
    pub source: String,
    /// Name to register the image under.
    pub name: String,
    /// Keep setuid/setgid bits and file capabilities (only for sources you trust).
    #[serde(default)]
    pub trusted: bool,
    /// Import a new version of an existing image name. The name then means
    /// the new version; the old one is kept (by its id, and in
    /// `GET /v1/images/{name}/versions`) for what was made from it, and
    /// `strata outdated` lists what still builds on it.
    #[serde(default)]
    pub replace: bool,
}

/// Request body of `POST /v1/images/pull`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PullImageRequest {
    /// Registry reference, e.g. `127.0.0.1:5000/busybox:latest`.
    pub reference: String,
    /// Name to register the image under (default: the reference).
    #[serde(default)]
    pub name: Option<String>,
    /// Talk plain HTTP to the registry (loopback registries).
    #[serde(default)]
    pub insecure: bool,
}

/// Process defaults an image carries (from its OCI config).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ImageConfig {
    /// `KEY=VALUE` environment entries.
    #[serde(default)]
    pub env: Vec<String>,
    /// Default entrypoint.
    #[serde(default)]
    pub entrypoint: Vec<String>,
    /// Default command.
    #[serde(default)]
    pub cmd: Vec<String>,
    /// Default working directory.
    #[serde(default)]
    pub working_dir: Option<String>,
    /// Default user.
    #[serde(default)]
    pub user: Option<String>,
}

/// One content-addressed layer of an image.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LayerInfo {
    /// The layer's key in the store: `sha256:<hex>` of the uncompressed layer
    /// tar (the OCI diff id) and how it was unpacked, `+untrusted` (setuid/setgid
    /// bits and file capabilities stripped) or `+trusted` (kept); the same bytes
    /// unpacked both ways are two layers. Layers stored before the unpack policy
    /// was recorded have no suffix (never shared with new imports).
    pub digest: String,
    /// Bytes of unpacked content.
    pub size: u64,
}

/// An image record.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Image {
    /// Content id: sha256 over the layer digests and config.
    pub id: String,
    /// Unique name.
    pub name: String,
    /// What it was imported from (`oci-layout`, `docker-archive`, `rootfs-tar`, `rootfs-dir`, `registry`).
    pub source_kind: String,
    /// The source path or reference.
    pub source: String,
    /// Layers, bottom first.
    pub layers: Vec<LayerInfo>,
    /// Process defaults.
    pub config: ImageConfig,
    /// Total unpacked size in bytes.
    pub size: u64,
    /// RFC 3339 import time.
    pub created_at: String,
    /// Version of the name: 1 for its first import, one more for each
    /// import of new content under the same name.
    #[serde(default = "first_version")]
    pub version: u32,
    /// Id of the version this one replaced as the name's newest (its lineage).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<String>,
    /// Whether this version is the newest of its name (what the name resolves to).
    #[serde(default = "newest_default")]
    pub newest: bool,
    /// What the image's files say it is (read from its layers at import).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
}

fn first_version() -> u32 {
    1
}

fn newest_default() -> bool {
    true
}

/// The operating system and machine an image's files are for, read from the
/// files themselves (`/etc/os-release`, the ELF header of its shell): a
/// rootfs tarball says nothing else about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Platform {
    /// `linux` (ELF binaries), or `unknown`.
    pub os: String,
    /// The ELF machine of its shell: `amd64`, `arm64`, `386`, `arm`, `riscv64`, ... or `unknown`.
    pub architecture: String,
    /// The distribution's `ID` (`debian`, `alpine`, `ubuntu`), `busybox`
    /// for a bare busybox root, `unknown` when neither is there.
    pub family: String,
    /// The distribution's `VERSION_ID`, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// Summary of an import, returned by `POST /v1/images/import`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ImportReport {
    /// The registered image.
    pub image: Image,
    /// Layers that were new to the store.
    pub layers_new: usize,
    /// Layers that were already stored (deduplicated).
    pub layers_reused: usize,
    /// Bytes newly written to the layer store.
    pub bytes_stored: u64,
    /// Entries changed or dropped for safety (device nodes, setuid bits, ...).
    #[serde(default)]
    pub warnings: Vec<String>,
    /// Wall time of the import in milliseconds.
    pub duration_ms: u64,
}

/// One line of the NDJSON progress stream of `POST /v1/images/import?stream=true`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ImportEvent {
    /// Progress: bytes of layer data processed so far out of the total (when known).
    Progress {
        /// Human-readable phase (`layer 2/5 sha256:...`).
        phase: String,
        /// Bytes done.
        done: u64,
        /// Bytes total, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        total: Option<u64>,
    },
    /// The import finished.
    Done {
        /// Its report.
        report: Box<ImportReport>,
    },
    /// The import failed; nothing was registered.
    Failed {
        /// The error.
        error: crate::ApiErrorBody,
    },
}

/// Query of `POST /v1/images/import`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, utoipa::IntoParams)]
pub struct StreamQuery {
    /// Stream NDJSON progress events instead of waiting for the result.
    #[serde(default)]
    pub stream: bool,
}

/// One sandbox, checkpoint or template on an image version that is no longer
/// its name's newest (`GET /v1/outdated`, `strata outdated`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct OutdatedEntry {
    /// `sandbox`, `checkpoint` or `template`.
    pub kind: String,
    /// Its id (a template's name).
    pub id: String,
    /// Its name.
    pub name: String,
    /// The image name.
    pub image: String,
    /// The version it is on and that version's id.
    pub version: u32,
    /// Id of the image version it is on.
    pub image_id: String,
    /// The name's newest version.
    pub newest_version: u32,
    /// Id of the newest version.
    pub newest_id: String,
    /// Whole days between the import of its version and of the newest.
    pub days_behind: u64,
    /// How to move it: `strata rebase ...`, `strata template rebuild ...`, or
    /// why it cannot move (a checkpoint is immutable: fork or restore it, then rebase).
    pub how: String,
}

/// Which side wins where a sandbox and its new base both changed a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Prefer {
    /// The sandbox's version stays (it already shadows the base).
    Sandbox,
    /// The new base's version is written over the sandbox's.
    Base,
}

/// Request body of `POST /v1/sandboxes/{id}/rebase`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RebaseRequest {
    /// The image (name: its newest version; or an id) to move onto.
    pub onto: String,
    /// How conflicts are settled; without it, any conflict refuses the rebase (409).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefer: Option<Prefer>,
}

/// A path changed both by the sandbox and between its old base and the new one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RebaseConflict {
    /// The path.
    pub path: String,
    /// What the sandbox did to it: `added`, `modified` or `deleted`.
    pub sandbox: String,
    /// What the new base did to it: `added`, `modified` or `deleted`.
    pub base: String,
}

/// The result of a rebase.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RebaseReport {
    /// The sandbox.
    pub sandbox_id: String,
    /// The image version it was on (`name@version id`).
    pub from_image: String,
    /// The image version it is on now.
    pub onto_image: String,
    /// Its state before (`stopped` or `standby`); after, it is `stopped`:
    /// a rebase keeps the filesystem, processes start again.
    pub state_before: crate::SandboxState,
    /// Paths the two bases differ in.
    pub base_changes: u64,
    /// Entries the sandbox's own layers hold (its writable layer and the
    /// layers above the image: a template's, a build's); only those that meet
    /// a base change are compared entry by entry.
    pub sandbox_paths: u64,
    /// The conflicts, and how they were settled (`prefer`).
    pub conflicts: Vec<RebaseConflict>,
    /// How conflicts were settled, when there were any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefer: Option<Prefer>,
    /// The state-hygiene scan of the result.
    pub scan: crate::ScanReport,
    /// What a rebase does not keep.
    pub note: String,
    /// Wall time in milliseconds.
    pub duration_ms: u64,
    /// Of which comparing the two sides (walking the layers, the conflicts).
    #[serde(default)]
    pub compare_ms: u64,
    /// Of which the scan of the result.
    #[serde(default)]
    pub scan_ms: u64,
}
