//! HTTP handlers of `images` (see [`strata_engine::images`]).

use crate::error::ApiResult;
use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use strata_api::{Image, ImportEvent, ImportImageRequest, ImportReport, PullImageRequest, StreamQuery};

use crate::native::acting::Acting;

/// The response of an import or pull: its report (201), or with `stream` an
/// NDJSON stream of [`ImportEvent`]s ending in `done` or `failed`.
async fn respond<F, Fut>(stream: bool, run: F) -> ApiResult<Response>
where
    F: FnOnce(Option<tokio::sync::mpsc::Sender<ImportEvent>>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = strata_engine::error::EngineResult<ImportReport>> + Send + 'static,
{
    if !stream {
        let report = run(None).await?;
        return Ok((StatusCode::CREATED, Json(report)).into_response());
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<ImportEvent>(64);
    tokio::spawn(async move {
        let last = match run(Some(tx.clone())).await {
            Ok(report) => ImportEvent::Done { report: Box::new(report) },
            Err(e) => ImportEvent::Failed { error: e.body },
        };
        let _ = tx.send(last).await;
    });
    Ok(crate::ndjson::response(rx))
}

/// Import an image from a path on the daemon's host (OCI layout, docker-save archive, rootfs tarball or directory).
#[utoipa::path(post, path = "/v1/images/import", tag = "images", request_body = ImportImageRequest, params(StreamQuery),
    responses((status = 201, body = ImportReport, description = "Imported (or an NDJSON stream of ImportEvent with stream=true)"),
        (status = 400, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn import_handler(
    Acting(engine): Acting,
    Query(q): Query<StreamQuery>,
    Json(req): Json<ImportImageRequest>,
) -> ApiResult<Response> {
    respond(q.stream, move |tx| async move { engine.import_image(req, tx).await }).await
}

/// Pull an image from an OCI distribution registry (anonymously; `insecure` for plain HTTP) and import it like a local OCI layout.
/// Pulling again under the same name replaces the image; layers already stored are reused.
#[utoipa::path(post, path = "/v1/images/pull", tag = "images", request_body = PullImageRequest, params(StreamQuery),
    responses((status = 201, body = ImportReport, description = "Pulled; `image.source_kind` is `registry` (or an NDJSON stream of ImportEvent with stream=true)"),
        (status = 400, body = strata_api::ApiErrorBody, description = "Bad reference or name (bad_request), or rejected image content (invalid_archive)"),
        (status = 404, body = strata_api::ApiErrorBody, description = "Unknown repository, tag or digest, or no image for this platform (image_not_found)"),
        (status = 409, body = strata_api::ApiErrorBody, description = "A locally imported image has the name (name_conflict)"),
        (status = 500, body = strata_api::ApiErrorBody, description = "Registry unreachable or failing (internal; the message names the registry)"),
        (status = 501, body = strata_api::ApiErrorBody, description = "The registry requires authentication (unsupported)"),
        (status = 504, body = strata_api::ApiErrorBody, description = "The registry timed out (timeout)")))]
pub async fn pull_handler(
    Acting(engine): Acting,
    Query(q): Query<StreamQuery>,
    Json(req): Json<PullImageRequest>,
) -> ApiResult<Response> {
    respond(q.stream, move |tx| async move { engine.pull_image(req, tx).await }).await
}

/// List images.
#[utoipa::path(get, path = "/v1/images", tag = "images", responses((status = 200, body = [Image])))]
pub async fn list_handler(Acting(engine): Acting) -> ApiResult<Json<Vec<Image>>> {
    Ok(Json(engine.list_images().await?))
}

/// Inspect an image.
#[utoipa::path(get, path = "/v1/images/{name}", tag = "images", params(("name" = String, Path, description = "Image name or id")),
    responses((status = 200, body = Image), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn get_handler(Acting(engine): Acting, Path(name): Path<String>) -> ApiResult<Json<Image>> {
    Ok(Json(engine.get_image(&name).await?))
}

/// Remove an image; its layers are deleted when nothing else uses them.
#[utoipa::path(delete, path = "/v1/images/{name}", tag = "images", params(("name" = String, Path, description = "Image name or id")),
    responses((status = 204), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn remove_handler(Acting(engine): Acting, Path(name): Path<String>) -> ApiResult<StatusCode> {
    engine.remove_image(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}
