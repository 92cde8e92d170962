//! File transfer and file-system operations inside running sandboxes.

use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::Response;
use axum::Json;
use strata_api::{DownloadQuery, ErrorCode, FileStat, MkdirRequest, MoveRequest, PathQuery, RemoveFileRequest, SandboxState, UploadQuery};

use crate::error::{ApiError, ApiResult};
use crate::sandboxes::load;
use crate::sandboxfs::{FsError, SandboxFs};
use crate::state::Shared;

/// Largest upload accepted in one request.
pub const MAX_UPLOAD_BYTES: usize = 4 << 30;

impl From<FsError> for ApiError {
    fn from(e: FsError) -> Self {
        match &e {
            FsError::Escape(_) => ApiError::new(ErrorCode::PathEscape, e.to_string()),
            FsError::Invalid(_) | FsError::Loop(_) => ApiError::bad_request(e.to_string()),
            FsError::NotFound(_) => ApiError::new(ErrorCode::FileNotFound, e.to_string()),
            FsError::Io { source, .. } => match source.raw_os_error() {
                Some(libc::ENOTDIR | libc::EISDIR | libc::EEXIST | libc::ENOTEMPTY | libc::EINVAL | libc::EROFS | libc::EACCES | libc::EPERM) => {
                    ApiError::bad_request(crate::error::chain(&e))
                }
                _ => ApiError::internal("file operation", &e),
            },
        }
    }
}

/// Runs `f` on the confined root of a running sandbox, off the async threads.
pub(crate) async fn with_fs<T: Send + 'static>(st: &Shared, id: &str, f: impl FnOnce(SandboxFs) -> Result<T, FsError> + Send + 'static) -> ApiResult<T> {
    let rec = load(st, id)?;
    let pid = match (rec.sandbox.state, rec.sandbox.init_pid) {
        (SandboxState::Running | SandboxState::Paused, Some(pid)) => pid,
        (s, _) => return Err(ApiError::invalid_state(s, format!("files of sandbox {} are reachable while it runs; it is {s}", rec.sandbox.id))),
    };
    tokio::task::spawn_blocking(move || {
        let fs = SandboxFs::open(pid).map_err(|e| FsError::Io { path: "/".into(), source: e })?;
        f(fs)
    })
    .await
    .map_err(|e| ApiError::internal("file task", &e))?
    .map_err(ApiError::from)
}

/// Download a file, or a tar stream of a file or directory with `tar=true`.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files", tag = "files", params(("id" = String, Path, description = "Sandbox id or name"), DownloadQuery),
    responses((status = 200, description = "File bytes or tar stream", content_type = "application/octet-stream"), (status = 400, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn download_handler(State(st): State<Shared>, axum::extract::Path(id): axum::extract::Path<String>, Query(q): Query<DownloadQuery>) -> ApiResult<Response> {
    let path = q.path.clone();
    let has_secrets = !st.secrets.get(&load(&st, &id)?.sandbox.id)?.is_empty();
    let data = with_fs(&st, &id, move |fs| {
        // Secrets are never echoed back: /run/secrets is not served, and a tar
        // of a directory above it leaves it out.
        let comps = if has_secrets { fs.resolve(&path, true)? } else { Vec::new() };
        if has_secrets && comps.len() >= 2 && comps[0] == "run" && comps[1] == "secrets" {
            return Err(FsError::Invalid(format!("{path} (the secrets under /run/secrets are not served by the file API)")));
        }
        if q.tar {
            let mut buf = Vec::new();
            fs.tar_to(&path, &mut buf)?;
            // A tar of / or /run names the secrets `[./]run/secrets/...`.
            let above_secrets = matches!(comps.as_slice(), [] | [_]) && comps.first().is_none_or(|c| c == "run");
            if has_secrets && above_secrets {
                buf = without_entries(&buf, "run/secrets").map_err(|e| FsError::Io { path: path.clone(), source: e })?;
            }
            return Ok(buf);
        }
        // O_NONBLOCK: a FIFO planted by the sandbox must not park a daemon thread;
        // only regular files are sent (directories need tar=true).
        let fd = fs.open_path(&path, libc::O_RDONLY | libc::O_NONBLOCK, 0)?;
        let file = std::fs::File::from(fd);
        let meta = file.metadata().map_err(|e| FsError::Io { path: path.clone(), source: e })?;
        if !meta.is_file() {
            let errno = if meta.is_dir() { libc::EISDIR } else { libc::EINVAL };
            return Err(FsError::Io { path: path.clone(), source: std::io::Error::from_raw_os_error(errno) });
        }
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut &file, &mut buf).map_err(|e| FsError::Io { path: path.clone(), source: e })?;
        Ok(buf)
    })
    .await?;
    let ct = if q.tar { "application/x-tar" } else { "application/octet-stream" };
    Ok(Response::builder().status(StatusCode::OK).header(header::CONTENT_TYPE, ct).body(Body::from(data)).expect("valid response"))
}

/// `tar` without the entries at `prefix` and below it (names compared
/// without a leading `./`).
fn without_entries(tar_bytes: &[u8], prefix: &str) -> std::io::Result<Vec<u8>> {
    let mut out = tar::Builder::new(Vec::new());
    out.follow_symlinks(false);
    let mut ar = tar::Archive::new(tar_bytes);
    for entry in ar.entries()? {
        let mut entry = entry?;
        let name = entry.path_bytes().into_owned();
        let mut name: &[u8] = name.strip_suffix(b"/").unwrap_or(&name);
        while let Some(rest) = name.strip_prefix(b"./") {
            name = rest;
        }
        if name == prefix.as_bytes() || name.starts_with(format!("{prefix}/").as_bytes()) {
            continue;
        }
        let mut header = entry.header().clone();
        let link = entry.link_name_bytes().map(|l| l.into_owned());
        let path = entry.path_bytes().into_owned();
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut data)?;
        use std::os::unix::ffi::OsStrExt;
        let path = std::path::Path::new(std::ffi::OsStr::from_bytes(&path));
        match link {
            Some(l) => out.append_link(&mut header, path, std::path::Path::new(std::ffi::OsStr::from_bytes(&l)))?,
            None => out.append_data(&mut header, path, &data[..])?,
        }
    }
    out.into_inner()
}

/// Upload a file (written atomically), or extract a tar stream under a directory with `tar=true`.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/files", tag = "files", params(("id" = String, Path, description = "Sandbox id or name"), UploadQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 204), (status = 400, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn upload_handler(State(st): State<Shared>, axum::extract::Path(id): axum::extract::Path<String>, Query(q): Query<UploadQuery>, body: Bytes) -> ApiResult<StatusCode> {
    let mode = q.mode.unwrap_or(0o644) & 0o7777 & !0o6000;
    with_fs(&st, &id, move |fs| {
        if q.tar {
            fs.untar_from(&q.path, &body[..]).map(|_| ())
        } else {
            fs.write_file(&q.path, &body, mode)
        }
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Metadata of a path.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/stat", tag = "files", params(("id" = String, Path, description = "Sandbox id or name"), PathQuery),
    responses((status = 200, body = FileStat), (status = 400, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn stat_handler(State(st): State<Shared>, axum::extract::Path(id): axum::extract::Path<String>, Query(q): Query<PathQuery>) -> ApiResult<Json<FileStat>> {
    Ok(Json(with_fs(&st, &id, move |fs| fs.stat(&q.path)).await?))
}

/// Entries of a directory.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/list", tag = "files", params(("id" = String, Path, description = "Sandbox id or name"), PathQuery),
    responses((status = 200, body = [FileStat]), (status = 400, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn list_handler(State(st): State<Shared>, axum::extract::Path(id): axum::extract::Path<String>, Query(q): Query<PathQuery>) -> ApiResult<Json<Vec<FileStat>>> {
    Ok(Json(with_fs(&st, &id, move |fs| fs.list(&q.path)).await?))
}

/// Create a directory.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/mkdir", tag = "files", request_body = MkdirRequest, params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 204), (status = 400, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn mkdir_handler(State(st): State<Shared>, axum::extract::Path(id): axum::extract::Path<String>, Json(req): Json<MkdirRequest>) -> ApiResult<StatusCode> {
    with_fs(&st, &id, move |fs| fs.mkdir(&req.path, req.parents, 0o755)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Remove a file, symlink or directory.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/remove", tag = "files", request_body = RemoveFileRequest, params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 204), (status = 400, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn remove_handler(State(st): State<Shared>, axum::extract::Path(id): axum::extract::Path<String>, Json(req): Json<RemoveFileRequest>) -> ApiResult<StatusCode> {
    with_fs(&st, &id, move |fs| fs.remove(&req.path, req.recursive)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Move or rename a path.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/move", tag = "files", request_body = MoveRequest, params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 204), (status = 400, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn move_handler(State(st): State<Shared>, axum::extract::Path(id): axum::extract::Path<String>, Json(req): Json<MoveRequest>) -> ApiResult<StatusCode> {
    with_fs(&st, &id, move |fs| fs.rename(&req.from, &req.to)).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    #[test]
    fn tar_filter_drops_exactly_the_secrets_subtree() {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in [("run/secrets/T", &b"value"[..]), ("run/secretsX", b"kept"), ("run/strata/x", b"kept")] {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_entry_type(tar::EntryType::Regular);
            h.set_cksum();
            b.append_data(&mut h, name, data).unwrap();
        }
        let mut dir = tar::Header::new_gnu();
        dir.set_entry_type(tar::EntryType::Directory);
        dir.set_mode(0o500);
        dir.set_size(0);
        dir.set_cksum();
        b.append_data(&mut dir, "run/secrets/", &[][..]).unwrap();
        let filtered = super::without_entries(&b.into_inner().unwrap(), "run/secrets").unwrap();
        let mut ar = tar::Archive::new(&filtered[..]);
        let names: Vec<String> = ar.entries().unwrap().map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned()).collect();
        assert_eq!(names, vec!["run/secretsX", "run/strata/x"]);
    }
}
