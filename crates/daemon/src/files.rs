//! File transfer and file-system operations inside running sandboxes.
//!
//! Every operation runs on a thread of its own with the sandbox root's
//! capabilities ([`crate::privileges`]) over the confined root of
//! [`crate::sandboxfs`]. Transfers stream through bounded buffers
//! ([`crate::transfer`]): downloads are read as they are sent, uploads are
//! written as they arrive (into a temp file renamed into place at the end,
//! or, for tar, applied entry by entry and rolled back if refused), so no
//! transfer ever sits whole in the daemon's memory.

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::Response;
use axum::Json;
use strata_api::{
    DownloadQuery, ErrorCode, FileStat, MkdirRequest, MoveRequest, PathQuery, RemoveFileRequest, SandboxState,
    UploadQuery,
};
use strata_store::db::SandboxRecord;
use tokio::sync::oneshot;

use crate::error::{ApiError, ApiResult};
use crate::privileges::SandboxRootCaps;
use crate::sandboxes::load;
use crate::sandboxfs::{FsError, SandboxFs};
use crate::state::Shared;
use crate::transfer::{self, FeedError};

/// Largest upload accepted in one request (counted while it streams).
pub const MAX_UPLOAD_BYTES: u64 = 4 << 30;
/// Where a sandbox's secrets are mounted (never served, left out of tar downloads).
const SECRETS_DIR: &str = "/run/secrets";

impl From<FsError> for ApiError {
    fn from(e: FsError) -> Self {
        match &e {
            FsError::Escape(_) => ApiError::new(ErrorCode::PathEscape, e.to_string()),
            FsError::Invalid(_) | FsError::Loop(_) | FsError::CutOff(_) => ApiError::bad_request(e.to_string()),
            FsError::NotFound(_) => ApiError::new(ErrorCode::FileNotFound, e.to_string()),
            FsError::PseudoFs { .. } => ApiError::new(ErrorCode::PseudoFilesystem, e.to_string()),
            FsError::Special { .. } => ApiError::new(ErrorCode::SpecialFile, e.to_string()),
            FsError::MountPoint(_) => ApiError::new(ErrorCode::MountPoint, e.to_string()),
            FsError::Archive { .. } => ApiError::new(ErrorCode::InvalidArchive, e.to_string()),
            FsError::TooLarge(_) => ApiError::new(ErrorCode::TooLarge, e.to_string()),
            FsError::Privileges(_) => ApiError::internal("file operation", &e),
            FsError::Io { source, path } => match source.raw_os_error() {
                // Our own errors (a directory where a file was asked for, a move across filesystems).
                None => ApiError::bad_request(format!("{path}: {source}")),
                Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG) => ApiError::new(
                    ErrorCode::TooLarge,
                    format!("{}: the sandbox's disk has no room for it", crate::error::chain(&e)),
                ),
                Some(
                    libc::ENOTDIR
                    | libc::EISDIR
                    | libc::EEXIST
                    | libc::ENOTEMPTY
                    | libc::EINVAL
                    | libc::EROFS
                    | libc::EACCES
                    | libc::EPERM
                    | libc::EBUSY
                    | libc::ENAMETOOLONG
                    | libc::EMLINK
                    | libc::ETXTBSY
                    | libc::ENXIO
                    | libc::EOPNOTSUPP,
                ) => ApiError::bad_request(crate::error::chain(&e)),
                _ => ApiError::internal("file operation", &e),
            },
        }
    }
}

/// The host pid of a running sandbox's init: its files are reachable only then.
fn init_pid(rec: &SandboxRecord) -> ApiResult<i32> {
    match (rec.sandbox.state, rec.sandbox.init_pid) {
        (SandboxState::Running | SandboxState::Paused, Some(pid)) => Ok(pid),
        (s, _) => Err(ApiError::invalid_state(
            s,
            format!("files of sandbox {} are reachable while it runs; it is {s}", rec.sandbox.id),
        )),
    }
}

/// Opens the sandbox's root (with the daemon's privileges: `/proc/<init>/root`
/// of a non-dumpable init takes CAP_SYS_PTRACE), then lowers the calling
/// thread to the sandbox root's capabilities for as long as the guard lives.
fn enter(pid: i32) -> Result<(SandboxFs, SandboxRootCaps), FsError> {
    let fs = SandboxFs::open(pid).map_err(|e| FsError::Io { path: "/".into(), source: e })?;
    let caps = SandboxRootCaps::lower()?;
    Ok((fs, caps))
}

/// Runs `f` on the confined root of a running sandbox, off the async threads,
/// with the sandbox root's capabilities.
pub(crate) async fn with_fs<T: Send + 'static>(
    st: &Shared,
    id: &str,
    f: impl FnOnce(SandboxFs) -> Result<T, FsError> + Send + 'static,
) -> ApiResult<T> {
    let pid = init_pid(&load(st, id)?)?;
    tokio::task::spawn_blocking(move || {
        let (fs, _caps) = enter(pid)?;
        f(fs)
    })
    .await
    .map_err(|e| ApiError::internal("file task", &e))?
    .map_err(ApiError::from)
}

/// Refuses paths under the secrets mount (when the sandbox has secrets).
fn refuse_secrets(fs: &SandboxFs, path: &str) -> Result<(), FsError> {
    let comps = fs.resolve(path, true)?;
    if comps.len() >= 2 && comps[0] == "run" && comps[1] == "secrets" {
        return Err(FsError::Invalid(format!(
            "{path} (the secrets under {SECRETS_DIR} are not served by the file API)"
        )));
    }
    Ok(())
}

/// Download a file, or a tar stream of a file or directory with `tar=true`.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files", tag = "files", params(("id" = String, Path, description = "Sandbox id or name"), DownloadQuery),
    responses((status = 200, description = "File bytes (with Content-Length) or tar stream, sent as they are read", content_type = "application/octet-stream"), (status = 400, body = strata_api::ApiErrorBody), (status = 403, description = "A pseudo-filesystem or special file (`pseudo_filesystem`, `special_file`)", body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn download_handler(
    State(st): State<Shared>,
    axum::extract::Path(id): axum::extract::Path<String>,
    Query(q): Query<DownloadQuery>,
) -> ApiResult<Response> {
    let rec = load(&st, &id)?;
    let pid = init_pid(&rec)?;
    let has_secrets = !st.secrets.get(&rec.sandbox.id)?.is_empty();
    let sandbox = rec.sandbox.id.clone();
    // Ok(Some(len)) for a file, Ok(None) for a tar stream, once the transfer is under way.
    let (ready_tx, ready_rx) = oneshot::channel::<Result<Option<u64>, FsError>>();
    let (mut out, body) = transfer::download_channel();
    transfer::spawn(move || {
        let (fs, _caps) = match enter(pid) {
            Ok(x) => x,
            Err(e) => {
                let _ = ready_tx.send(Err(e));
                return;
            }
        };
        let res = if q.tar {
            let root = (|| {
                if has_secrets {
                    refuse_secrets(&fs, &q.path)?;
                }
                fs.tar_root(&q.path)
            })();
            let root = match root {
                Ok(r) => r,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let _ = ready_tx.send(Ok(None));
            // Secrets are never echoed back: a tar of a directory above them leaves them out.
            let exclude: &[&str] = if has_secrets { &[SECRETS_DIR] } else { &[] };
            fs.write_tar(root, &mut out, exclude)
                .map_err(|e| std::io::Error::other(e.to_string()))
                .and_then(|_| std::io::Write::flush(&mut out))
        } else {
            let opened = (|| {
                if has_secrets {
                    refuse_secrets(&fs, &q.path)?;
                }
                fs.open_read(&q.path)
            })();
            let (file, len) = match opened {
                Ok(x) => x,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let _ = ready_tx.send(Ok(Some(len)));
            out.copy_exact(file, len)
        };
        if let Err(e) = res {
            if !out.is_closed() {
                tracing::warn!(sandbox = %sandbox, path = %q.path, error = %e, "file download cut short");
            }
            out.fail(e);
        }
    })
    .map_err(|e| ApiError::internal("file transfer thread", &e))?;
    let len = match ready_rx.await {
        Ok(Ok(len)) => len,
        Ok(Err(e)) => return Err(e.into()),
        Err(_) => {
            return Err(ApiError::new(
                ErrorCode::Internal,
                "file transfer: the transfer thread ended without an answer",
            ))
        }
    };
    let ct = if len.is_none() { "application/x-tar" } else { "application/octet-stream" };
    let mut resp = Response::builder().status(StatusCode::OK).header(header::CONTENT_TYPE, ct);
    if let Some(len) = len {
        resp = resp.header(header::CONTENT_LENGTH, len);
    }
    Ok(resp.body(body).expect("valid response"))
}

/// Upload a file (streamed into a temp file, renamed into place once complete),
/// or extract a tar stream under a directory with `tar=true` (applied as it
/// streams, rolled back if any entry is refused). At most 4 GiB.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/files", tag = "files", params(("id" = String, Path, description = "Sandbox id or name"), UploadQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 204), (status = 400, body = strata_api::ApiErrorBody), (status = 403, description = "A pseudo-filesystem or special file (`pseudo_filesystem`, `special_file`)", body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody), (status = 413, description = "Larger than 4 GiB, or than the sandbox's disk holds (`too_large`)", body = strata_api::ApiErrorBody)))]
pub async fn upload_handler(
    State(st): State<Shared>,
    axum::extract::Path(id): axum::extract::Path<String>,
    Query(q): Query<UploadQuery>,
    headers: axum::http::HeaderMap,
    body: Body,
) -> ApiResult<StatusCode> {
    let pid = init_pid(&load(&st, &id)?)?;
    if transfer::announced_over(&headers, MAX_UPLOAD_BYTES) {
        return Err(feed_error(FeedError::TooLarge(MAX_UPLOAD_BYTES)));
    }
    let mode = q.mode.unwrap_or(0o644) & 0o7777 & !0o6000;
    let (tx, mut reader) = transfer::upload_channel();
    let (done_tx, done_rx) = oneshot::channel::<Result<(), FsError>>();
    transfer::spawn(move || {
        let res = enter(pid).and_then(|(fs, _caps)| {
            if q.tar {
                let n = fs.untar_from(&q.path, &mut reader)?;
                // The archive is complete (and applied): what follows its end marker is padding.
                let _ = reader.drain();
                tracing::debug!(path = %q.path, entries = n, "tar upload applied");
                Ok(())
            } else {
                fs.write_from(&q.path, &mut reader, mode).map(drop)
            }
        });
        let _ = done_tx.send(res);
    })
    .map_err(|e| ApiError::internal("file transfer thread", &e))?;
    match transfer::feed_upload(body, tx, MAX_UPLOAD_BYTES, done_rx).await {
        Ok(Some(Ok(()))) => Ok(StatusCode::NO_CONTENT),
        Ok(Some(Err(e))) => Err(e.into()),
        Ok(None) => {
            Err(ApiError::new(ErrorCode::Internal, "file transfer: the transfer thread ended without an answer"))
        }
        Err(e) => Err(feed_error(e)),
    }
}

/// The answer to an upload body that could not be taken.
pub(crate) fn feed_error(e: FeedError) -> ApiError {
    match e {
        FeedError::TooLarge(limit) => ApiError::new(
            ErrorCode::TooLarge,
            format!("the upload is larger than {limit} bytes, the most one upload may be; nothing was kept"),
        ),
        FeedError::Body(e) => ApiError::bad_request(format!("reading the upload: {e}; nothing was kept")),
    }
}

/// Metadata of a path.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/stat", tag = "files", params(("id" = String, Path, description = "Sandbox id or name"), PathQuery),
    responses((status = 200, body = FileStat), (status = 400, body = strata_api::ApiErrorBody), (status = 403, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn stat_handler(
    State(st): State<Shared>,
    axum::extract::Path(id): axum::extract::Path<String>,
    Query(q): Query<PathQuery>,
) -> ApiResult<Json<FileStat>> {
    Ok(Json(with_fs(&st, &id, move |fs| fs.stat(&q.path)).await?))
}

/// Entries of a directory (at most 100,000: a larger one is a 413).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/list", tag = "files", params(("id" = String, Path, description = "Sandbox id or name"), PathQuery),
    responses((status = 200, body = [FileStat]), (status = 400, body = strata_api::ApiErrorBody), (status = 403, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody), (status = 413, body = strata_api::ApiErrorBody)))]
pub async fn list_handler(
    State(st): State<Shared>,
    axum::extract::Path(id): axum::extract::Path<String>,
    Query(q): Query<PathQuery>,
) -> ApiResult<Json<Vec<FileStat>>> {
    Ok(Json(with_fs(&st, &id, move |fs| fs.list(&q.path)).await?))
}

/// Create a directory.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/mkdir", tag = "files", request_body = MkdirRequest, params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 204), (status = 400, body = strata_api::ApiErrorBody), (status = 403, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn mkdir_handler(
    State(st): State<Shared>,
    axum::extract::Path(id): axum::extract::Path<String>,
    Json(req): Json<MkdirRequest>,
) -> ApiResult<StatusCode> {
    with_fs(&st, &id, move |fs| fs.mkdir(&req.path, req.parents, 0o755)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Remove a file, symlink or directory.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/remove", tag = "files", request_body = RemoveFileRequest, params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 204), (status = 400, body = strata_api::ApiErrorBody), (status = 403, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody), (status = 413, body = strata_api::ApiErrorBody)))]
pub async fn remove_handler(
    State(st): State<Shared>,
    axum::extract::Path(id): axum::extract::Path<String>,
    Json(req): Json<RemoveFileRequest>,
) -> ApiResult<StatusCode> {
    with_fs(&st, &id, move |fs| fs.remove(&req.path, req.recursive)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Move or rename a path (a file or symlink also across the sandbox's filesystems).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/move", tag = "files", request_body = MoveRequest, params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 204), (status = 400, body = strata_api::ApiErrorBody), (status = 403, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn move_handler(
    State(st): State<Shared>,
    axum::extract::Path(id): axum::extract::Path<String>,
    Json(req): Json<MoveRequest>,
) -> ApiResult<StatusCode> {
    with_fs(&st, &id, move |fs| fs.rename(&req.from, &req.to)).await?;
    Ok(StatusCode::NO_CONTENT)
}
