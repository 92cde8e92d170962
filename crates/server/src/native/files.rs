//! HTTP handlers of `files` (see [`strata_engine::files`]).

use crate::error::ApiResult;
use axum::body::Body;
use axum::extract::Query;
use axum::http::{header, StatusCode};
use axum::response::Response;
use axum::Json;
use strata_api::{DownloadQuery, FileStat, MkdirRequest, MoveRequest, PathQuery, RemoveFileRequest, UploadQuery};

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
    engine.upload(&id, q, announced, body.into_data_stream()).await?;
    Ok(StatusCode::NO_CONTENT)
}

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
