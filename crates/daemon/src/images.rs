//! Image import, listing and removal.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use sha2::{Digest, Sha256};
use strata_api::{ErrorCode, Image, ImportEvent, ImportImageRequest, ImportReport, LayerInfo, StreamQuery};
use strata_core::ids;
use tracing::info;

use crate::error::{ApiError, ApiResult};
use crate::sandboxes::now;
use crate::state::Shared;

impl From<strata_image::ImageError> for ApiError {
    fn from(e: strata_image::ImageError) -> Self {
        if e.is_invalid_input() {
            ApiError::new(ErrorCode::InvalidArchive, crate::error::chain(&e))
        } else {
            ApiError::internal("image import", &e)
        }
    }
}

/// Content id of an image: sha256 over its layer digests and config.
fn image_id(layers: &[LayerInfo], config: &strata_api::ImageConfig) -> String {
    let mut h = Sha256::new();
    for l in layers {
        h.update(l.digest.as_bytes());
        h.update(b"\n");
    }
    h.update(serde_json::to_vec(config).expect("config serializes"));
    format!("sha256:{}", hex::encode(h.finalize()))
}

/// Imports an image; `progress` receives events as it goes.
pub async fn import(st: &Shared, req: ImportImageRequest, progress: Option<tokio::sync::mpsc::Sender<ImportEvent>>) -> ApiResult<ImportReport> {
    ids::validate_name(&req.name, true)?;
    let src = PathBuf::from(&req.source);
    if !src.is_absolute() {
        return Err(ApiError::bad_request(format!("source {:?} must be an absolute path on the daemon's host", req.source)));
    }
    if !src.exists() {
        return Err(ApiError::bad_request(format!("source {:?} does not exist", req.source)));
    }
    let _g = st.image_lock.lock().await;
    if !req.replace && st.db.get_image(&req.name)?.is_some_and(|i| i.name == req.name) {
        return Err(ApiError::new(ErrorCode::NameConflict, format!("an image named {:?} exists (use replace)", req.name)));
    }
    let started = Instant::now();
    let layers = st.layers.clone();
    let opts = strata_image::ImportOptions { trusted: req.trusted, ..Default::default() };
    let src2 = src.clone();
    let imported = tokio::task::spawn_blocking(move || {
        let mut last = Instant::now() - Duration::from_secs(1);
        let mut phase = String::from("reading source");
        let mut cb = |p: strata_image::Progress<'_>| {
            let Some(tx) = &progress else { return };
            match p {
                strata_image::Progress::Layer { index, count, digest } => {
                    phase = format!("layer {}/{count} {digest}", index + 1);
                    let _ = tx.blocking_send(ImportEvent::Progress { phase: phase.clone(), done: 0, total: None });
                }
                strata_image::Progress::Bytes { done, total } => {
                    if last.elapsed() >= Duration::from_millis(100) {
                        last = Instant::now();
                        let _ = tx.blocking_send(ImportEvent::Progress { phase: phase.clone(), done, total });
                    }
                }
            }
        };
        strata_image::import(&src2, &layers, &opts, &mut cb)
    })
    .await
    .map_err(|e| ApiError::internal("import task", &e))??;
    let layer_infos: Vec<LayerInfo> = imported.layers.iter().map(|l| LayerInfo { digest: l.digest.clone(), size: l.size }).collect();
    let image = Image {
        id: image_id(&layer_infos, &imported.config),
        name: req.name.clone(),
        source_kind: imported.kind.as_str().to_string(),
        source: req.source.clone(),
        size: layer_infos.iter().map(|l| l.size).sum(),
        layers: layer_infos,
        config: imported.config.clone(),
        created_at: now(),
    };
    st.db.put_image(&image, req.replace)?;
    if req.replace {
        gc_layers(st)?;
    }
    let layers_new = imported.layers.iter().filter(|l| l.new).count();
    info!(image = %image.name, id = %image.id, layers_new, "imported image");
    Ok(ImportReport {
        layers_new,
        layers_reused: imported.layers.len() - layers_new,
        bytes_stored: imported.bytes_stored,
        warnings: imported.warnings,
        duration_ms: started.elapsed().as_millis() as u64,
        image,
    })
}

/// Removes layers that no image and no sandbox references.
fn gc_layers(st: &Shared) -> ApiResult<usize> {
    let mut used = std::collections::HashSet::new();
    for img in st.db.list_images()? {
        used.extend(img.layers.into_iter().map(|l| l.digest));
    }
    for sb in st.db.list_sandboxes()? {
        used.extend(sb.layers);
    }
    let mut removed = 0;
    for d in st.layers.list().map_err(|e| ApiError::internal("layer store", &e))? {
        if !used.contains(&d) {
            st.layers.remove(&d).map_err(|e| ApiError::internal("layer store", &e))?;
            removed += 1;
        }
    }
    Ok(removed)
}

fn ndjson(ev: &ImportEvent) -> Bytes {
    let mut v = serde_json::to_vec(ev).expect("event serializes");
    v.push(b'\n');
    Bytes::from(v)
}

// ---- HTTP handlers ----

/// Import an image from a path on the daemon's host (OCI layout, docker-save archive, rootfs tarball or directory).
#[utoipa::path(post, path = "/v1/images/import", tag = "images", request_body = ImportImageRequest, params(StreamQuery),
    responses((status = 201, body = ImportReport, description = "Imported (or an NDJSON stream of ImportEvent with stream=true)"),
        (status = 400, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn import_handler(State(st): State<Shared>, Query(q): Query<StreamQuery>, Json(req): Json<ImportImageRequest>) -> ApiResult<Response> {
    if !q.stream {
        let report = import(&st, req, None).await?;
        return Ok((StatusCode::CREATED, Json(report)).into_response());
    }
    let (tx, mut rx) = tokio::sync::mpsc::channel::<ImportEvent>(64);
    let (out_tx, out_rx) = tokio::sync::mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        let forward_tx = out_tx.clone();
        let fwd = tokio::spawn(async move {
            while let Some(ev) = rx.recv().await {
                if forward_tx.send(ndjson(&ev)).await.is_err() {
                    break;
                }
            }
        });
        let result = import(&st, req, Some(tx)).await;
        let _ = fwd.await;
        let last = match result {
            Ok(report) => ImportEvent::Done { report },
            Err(e) => ImportEvent::Failed { error: e.body },
        };
        let _ = out_tx.send(ndjson(&last)).await;
    });
    let stream = futures_util::stream::unfold(out_rx, |mut rx| async move { rx.recv().await.map(|b| (Ok::<_, std::convert::Infallible>(b), rx)) });
    Ok(Response::builder().status(StatusCode::OK).header(header::CONTENT_TYPE, "application/x-ndjson").body(Body::from_stream(stream)).expect("valid response"))
}

/// List images.
#[utoipa::path(get, path = "/v1/images", tag = "images", responses((status = 200, body = [Image])))]
pub async fn list_handler(State(st): State<Shared>) -> ApiResult<Json<Vec<Image>>> {
    Ok(Json(st.db.list_images()?))
}

/// Inspect an image.
#[utoipa::path(get, path = "/v1/images/{name}", tag = "images", params(("name" = String, Path, description = "Image name or id")),
    responses((status = 200, body = Image), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn get_handler(State(st): State<Shared>, Path(name): Path<String>) -> ApiResult<Json<Image>> {
    st.db.get_image(&name)?.map(Json).ok_or_else(|| ApiError::new(ErrorCode::ImageNotFound, format!("no image named {name:?}")))
}

/// Remove an image; its layers are deleted when nothing else uses them.
#[utoipa::path(delete, path = "/v1/images/{name}", tag = "images", params(("name" = String, Path, description = "Image name or id")),
    responses((status = 204), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn remove_handler(State(st): State<Shared>, Path(name): Path<String>) -> ApiResult<StatusCode> {
    let _g = st.image_lock.lock().await;
    let img = st.db.get_image(&name)?.ok_or_else(|| ApiError::new(ErrorCode::ImageNotFound, format!("no image named {name:?}")))?;
    let users: Vec<String> = st.db.list_sandboxes()?.into_iter().filter(|s| s.sandbox.source == img.name).map(|s| format!("sandbox {}", s.sandbox.id)).collect();
    if !users.is_empty() {
        let mut e = ApiError::new(ErrorCode::InUse, format!("image {:?} is used by {} sandbox(es)", img.name, users.len()));
        e.body.dependents = users;
        return Err(e);
    }
    st.db.delete_image(&img.name)?;
    let removed = gc_layers(&st)?;
    info!(image = %img.name, layers_removed = removed, "removed image");
    Ok(StatusCode::NO_CONTENT)
}
