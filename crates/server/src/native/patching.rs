//! HTTP handlers of patching: image versions, what is outdated, rebase and
//! template rebuilds (see [`strata_engine::patching`]).

use axum::extract::Path;
use axum::response::Response;
use axum::Json;
use strata_api::{Image, OutdatedEntry, RebaseReport, RebaseRequest, RebuildTemplateRequest};

use crate::error::ApiResult;
use crate::native::acting::Acting;

/// Every version of an image's name, newest first (the newest is what the name means).
#[utoipa::path(get, path = "/v1/images/{name}/versions", tag = "images", params(("name" = String, Path, description = "Image name or id")),
    responses((status = 200, body = [Image]), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn versions_handler(Acting(engine): Acting, Path(name): Path<String>) -> ApiResult<Json<Vec<Image>>> {
    Ok(Json(engine.image_versions(&name).await?))
}

/// Sandboxes, checkpoints and templates on an image version that is no longer
/// its name's newest, with how to move each.
#[utoipa::path(get, path = "/v1/outdated", tag = "images", responses((status = 200, body = [OutdatedEntry])))]
pub async fn outdated_handler(Acting(engine): Acting) -> ApiResult<Json<Vec<OutdatedEntry>>> {
    Ok(Json(engine.outdated().await?))
}

/// Moves a stopped or standby sandbox onto another image version, keeping its
/// writable layer; processes start again (the sandbox ends `stopped`). Paths
/// changed both by the sandbox and between the bases refuse the rebase
/// (409 `rebase_conflicts`, listed) unless `prefer` settles them.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/rebase", tag = "sandboxes", request_body = RebaseRequest,
    params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = RebaseReport),
        (status = 400, body = strata_api::ApiErrorBody, description = "an image of another OS, machine or OS family"),
        (status = 404, body = strata_api::ApiErrorBody),
        (status = 409, body = strata_api::ApiErrorBody, description = "not stopped or standby (`invalid_state`), or `rebase_conflicts`")))]
pub async fn rebase_handler(
    Acting(engine): Acting,
    Path(id): Path<String>,
    Json(req): Json<RebaseRequest>,
) -> ApiResult<Json<RebaseReport>> {
    Ok(Json(engine.rebase(&id, &req).await?))
}

/// Rebuilds a template from the build file it was made by (on `base` when
/// given); streams NDJSON `BuildEvent`s as a build does.
#[utoipa::path(post, path = "/v1/templates/{name}/rebuild", tag = "templates", request_body = RebuildTemplateRequest,
    params(("name" = String, Path, description = "Template name")),
    responses((status = 200, description = "NDJSON stream of BuildEvent", body = strata_api::BuildEvent),
        (status = 404, body = strata_api::ApiErrorBody),
        (status = 409, body = strata_api::ApiErrorBody, description = "promoted from a checkpoint: no build file to rerun")))]
pub async fn rebuild_handler(
    Acting(engine): Acting,
    Path(name): Path<String>,
    Json(req): Json<RebuildTemplateRequest>,
) -> ApiResult<Response> {
    Ok(crate::ndjson::response(engine.rebuild_template(&name, req).await?))
}
