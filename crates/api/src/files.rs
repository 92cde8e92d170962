//! File transfer and file-system operations inside a sandbox.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Kind of a directory entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link (not followed).
    Symlink,
    /// Anything else (device, fifo, socket).
    Other,
}

/// Metadata of one path inside the sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FileStat {
    /// Absolute path inside the sandbox.
    pub path: String,
    /// Entry name.
    pub name: String,
    /// Kind.
    pub kind: FileKind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Owner uid.
    pub uid: u32,
    /// Owner gid.
    pub gid: u32,
    /// Modification time, seconds since the epoch.
    pub mtime: i64,
    /// Target, for symlinks, as written in the link.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_target: Option<String>,
    /// For symlinks: where the link leads inside the sandbox, every symlink
    /// on the way followed (absent when that cannot be worked out, e.g. a loop).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_resolved: Option<ResolvedLink>,
    /// The entry's extended attributes of the `user.` namespace, by full name
    /// (`user.e2b.owner`); values that are not UTF-8 are left out.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub xattrs: BTreeMap<String, String>,
}

/// Where a symlink leads inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ResolvedLink {
    /// The absolute path the link resolves to (symlinks followed inside the sandbox).
    pub path: String,
    /// What is there (absent for a dangling link).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<FileKind>,
    /// Its permission bits (absent for a dangling link).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
}

/// Query naming one path (`?path=/etc/hosts`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, utoipa::IntoParams)]
pub struct PathQuery {
    /// Absolute path inside the sandbox.
    pub path: String,
}

/// Query of `PUT /v1/sandboxes/{id}/files`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, utoipa::IntoParams)]
pub struct UploadQuery {
    /// Destination path inside the sandbox (for tar: the directory to extract into).
    pub path: String,
    /// Permission bits for a single file (default 0644).
    #[serde(default)]
    pub mode: Option<u32>,
    /// The body is a tar stream to extract under `path`.
    #[serde(default)]
    pub tar: bool,
}

/// Query of `GET /v1/sandboxes/{id}/files`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, utoipa::IntoParams)]
pub struct DownloadQuery {
    /// Path inside the sandbox.
    pub path: String,
    /// Send a tar stream of the path (required for directories).
    #[serde(default)]
    pub tar: bool,
}

/// Request body of `POST /v1/sandboxes/{id}/files/mkdir`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MkdirRequest {
    /// Directory to create.
    pub path: String,
    /// Create missing parents.
    #[serde(default)]
    pub parents: bool,
}

/// Request body of `POST /v1/sandboxes/{id}/files/remove`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RemoveFileRequest {
    /// Path to remove.
    pub path: String,
    /// Remove directories recursively.
    #[serde(default)]
    pub recursive: bool,
}

/// Request body of `POST /v1/sandboxes/{id}/files/move`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MoveRequest {
    /// Existing path.
    pub from: String,
    /// New path.
    pub to: String,
}

/// What happened to a path under a watched directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FsOp {
    /// Created, or moved in.
    Create,
    /// Its content was written.
    Write,
    /// Removed.
    Remove,
    /// Moved away (renamed).
    Rename,
    /// Its metadata changed (mode, owner, times, extended attributes).
    Chmod,
}

/// One change under a watched directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FsEvent {
    /// What happened.
    pub op: FsOp,
    /// The path, relative to the watched directory (`""`: the directory itself).
    pub name: String,
    /// The absolute path inside the sandbox.
    pub path: String,
    /// The path is a directory.
    pub dir: bool,
}

/// Query of `GET /v1/sandboxes/{id}/files/watch`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, utoipa::IntoParams)]
pub struct WatchQuery {
    /// The directory to watch (absolute, symlinks followed inside the sandbox).
    pub path: String,
    /// Watch every directory under it too (those made later included).
    #[serde(default)]
    pub recursive: bool,
}

/// One line of a directory watch: an event, or why the watch ended (its last line).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum WatchLine {
    /// A change.
    Event(FsEvent),
    /// The watch ended: the directory went away (removed, the sandbox stopped
    /// or went to standby), or the kernel's event queue overflowed.
    Ended {
        /// Why.
        error: crate::ApiErrorBody,
    },
}
