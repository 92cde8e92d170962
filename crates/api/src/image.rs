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
    /// Replace an existing image of the same name.
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
