//! HTTP handlers of `files` (see [`strata_engine::files`]).

use crate::error::ApiResult;
use axum::body::Body;
use axum::extract::Query;
use axum::http::{header, StatusCode};
use axum::response::Response;
use axum::Json;
use strata_api::{
    DownloadQuery, FileStat, MkdirRequest, MoveRequest, PathQuery, RemoveFileRequest, UploadQuery, WatchLine,
    WatchQuery,
};

use crate::native::acting::Acting;

/// Download a file, or a tar stream of a file or directory with `tar=true`.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files", tag = "files", params(("id" = String, Path, description = "Sandbox id or name"), DownloadQuery),
    responses((status = 200, description = "File bytes (with Content-Length) or tar stream, sent as they are read", content_type = "application/octet-stream"), (status = 400, body = strata_api::ApiErrorBody), (status = 403, description = "A pseudo-filesystem or special file (`pseudo_filesystem`, `special_file`)", body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn download_handler(
    Acting(engine): Acting,
    axum::extract::Path(id): axum::extract::Path<String>,
    Query(q): Query<DownloadQuery>,
) -> ApiResult<Response> {
    let strata_engine::surface::Download { len, stream } = engine.download(&id, q).await?;
    let ct = if len.is_none() { "application/x-tar" } else { "application/octet-stream" };
    let mut resp = Response::builder().status(StatusCode::OK).header(header::CONTENT_TYPE, ct);
    if let Some(len) = len {
        resp = resp.header(header::CONTENT_LENGTH, len);
    }
    Ok(resp.body(Body::from_stream(stream)).expect("valid response"))
}

/// Upload a file (streamed into a temp file, renamed into place once complete),
/// or extract a tar stream under a directory with `tar=true` (applied as it
/// streams, rolled back if any entry is refused). At most 4 GiB.
#[utoipa::path(put, path = "/v1/sandboxes/{id}/files", tag = "files", params(("id" = String, Path, description = "Sandbox id or name"), UploadQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 204), (status = 400, body = strata_api::ApiErrorBody), (status = 403, description = "A pseudo-filesystem or special file (`pseudo_filesystem`, `special_file`)", body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody), (status = 413, description = "Larger than 4 GiB, or than the sandbox's disk holds (`too_large`)", body = strata_api::ApiErrorBody)))]
pub async fn upload_handler(
    Acting(engine): Acting,
    axum::extract::Path(id): axum::extract::Path<String>,
    Query(q): Query<UploadQuery>,
    headers: axum::http::HeaderMap,
    body: Body,
) -> ApiResult<StatusCode> {
    let announced = crate::native::transfer::announced_length(&headers);
    // The body is read by a task of its own that goes on reading (and dropping)
    // it when the upload is refused early: a client still sending its body gets
    // the refusal and its reason, not a connection closed under it.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, axum::Error>>(4);
    let reader = tokio::spawn(async move {
        let mut stream = body.into_data_stream();
        let mut dropped = 0u64;
        while let Some(chunk) = futures_util::StreamExt::next(&mut stream).await {
            let len = chunk.as_ref().map_or(0, |c| c.len() as u64);
            if tx.is_closed() {
                dropped += len;
                if dropped > REFUSED_BODY_DRAIN_BYTES {
                    break;
                }
            } else if tx.send(chunk).await.is_err() {
                dropped += len;
            }
        }
    });
    let chunks = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
    let res = engine.upload(&id, q, announced, chunks).await;
    if res.is_err() {
        let _ = tokio::time::timeout(REFUSED_BODY_DRAIN_TIME, reader).await;
    }
    res?;
    Ok(StatusCode::NO_CONTENT)
}

/// How much of a refused upload's body is read (and dropped) before the answer.
const REFUSED_BODY_DRAIN_BYTES: u64 = 16 << 20;
/// How long a refused upload's answer waits for the rest of its body.
const REFUSED_BODY_DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(2);

/// Metadata of a path.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/stat", tag = "files", params(("id" = String, Path, description = "Sandbox id or name"), PathQuery),
    responses((status = 200, body = FileStat), (status = 400, body = strata_api::ApiErrorBody), (status = 403, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn stat_handler(
    Acting(engine): Acting,
    axum::extract::Path(id): axum::extract::Path<String>,
    Query(q): Query<PathQuery>,
) -> ApiResult<Json<FileStat>> {
    Ok(Json(engine.stat(&id, &q.path).await?))
}

/// Entries of a directory (at most 100,000: a larger one is a 413).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/list", tag = "files", params(("id" = String, Path, description = "Sandbox id or name"), PathQuery),
    responses((status = 200, body = [FileStat]), (status = 400, body = strata_api::ApiErrorBody), (status = 403, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody), (status = 413, body = strata_api::ApiErrorBody)))]
pub async fn list_handler(
    Acting(engine): Acting,
    axum::extract::Path(id): axum::extract::Path<String>,
    Query(q): Query<PathQuery>,
) -> ApiResult<Json<Vec<FileStat>>> {
    Ok(Json(engine.list_dir(&id, &q.path).await?))
}

/// Watch a directory: its changes as they happen (inotify on the sandbox's
/// tree: creates, writes, removes, renames, metadata changes; none dropped),
/// one JSON line each, until the client goes away; a last `{"error": ...}`
/// line when the watch ends on its own (the directory removed, the sandbox
/// stopped or in standby, the kernel's queue overflowed).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/watch", tag = "files", params(("id" = String, Path, description = "Sandbox id or name"), WatchQuery),
    responses((status = 200, description = "NDJSON stream of `WatchLine`", content_type = "application/x-ndjson", body = WatchLine), (status = 400, body = strata_api::ApiErrorBody), (status = 403, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody), (status = 413, description = "More directories than one recursive watch marks (`too_large`)", body = strata_api::ApiErrorBody)))]
pub async fn watch_handler(
    Acting(engine): Acting,
    axum::extract::Path(id): axum::extract::Path<String>,
    Query(q): Query<WatchQuery>,
) -> ApiResult<Response> {
    let watch = engine.watch_dir(&id, &q.path, q.recursive).await?;
    let lines = futures_util::stream::unfold(Some(watch), |w| async move {
        let mut w = w?;
        match w.next().await? {
            Ok(ev) => Some((WatchLine::Event(ev), Some(w))),
            Err(e) => Some((WatchLine::Ended { error: e.body }, None)),
        }
    });
    Ok(crate::ndjson::stream(lines))
}

/// Create a directory.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/mkdir", tag = "files", request_body = MkdirRequest, params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 204), (status = 400, body = strata_api::ApiErrorBody), (status = 403, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn mkdir_handler(
    Acting(engine): Acting,
    axum::extract::Path(id): axum::extract::Path<String>,
    Json(req): Json<MkdirRequest>,
) -> ApiResult<StatusCode> {
    engine.mkdir(&id, &req.path, req.parents).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Remove a file, symlink or directory.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/remove", tag = "files", request_body = RemoveFileRequest, params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 204), (status = 400, body = strata_api::ApiErrorBody), (status = 403, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody), (status = 413, body = strata_api::ApiErrorBody)))]
pub async fn remove_handler(
    Acting(engine): Acting,
    axum::extract::Path(id): axum::extract::Path<String>,
    Json(req): Json<RemoveFileRequest>,
) -> ApiResult<StatusCode> {
    engine.remove_path(&id, &req.path, req.recursive).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Move or rename a path (a file or symlink also across the sandbox's filesystems).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/files/move", tag = "files", request_body = MoveRequest, params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 204), (status = 400, body = strata_api::ApiErrorBody), (status = 403, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn move_handler(
    Acting(engine): Acting,
    axum::extract::Path(id): axum::extract::Path<String>,
    Json(req): Json<MoveRequest>,
) -> ApiResult<StatusCode> {
    engine.move_path(&id, &req.from, &req.to).await?;
    Ok(StatusCode::NO_CONTENT)
}
