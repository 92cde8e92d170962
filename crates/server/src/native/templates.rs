//! HTTP handlers of `templates` (see [`strata_engine::templates`]).

use crate::error::ApiResult;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use strata_api::{BuildEvent, BuildTemplateRequest, CreateTemplateRequest, Template};
use strata_engine::state::Shared;
use strata_engine::templates::*;

/// Promote a checkpoint (or a sandbox, checkpointed first) to a template.
#[utoipa::path(post, path = "/v1/templates", tag = "templates", request_body = CreateTemplateRequest,
    responses((status = 201, body = Template), (status = 404, body = strata_api::ApiErrorBody), (status = 409, description = "name taken, or `scan_findings` with the findings listed", body = strata_api::ApiErrorBody)))]
pub async fn create_handler(
    State(st): State<Shared>,
    actor: Option<axum::Extension<strata_engine::audit::Actor>>,
    Json(req): Json<CreateTemplateRequest>,
) -> ApiResult<(StatusCode, Json<Template>)> {
    let actor = actor.map_or_else(|| "local".to_string(), |a| a.0 .0);
    Ok((StatusCode::CREATED, Json(create(&st, req, &actor).await?)))
}

/// List templates.
#[utoipa::path(get, path = "/v1/templates", tag = "templates", responses((status = 200, body = [Template])))]
pub async fn list_handler(State(st): State<Shared>) -> ApiResult<Json<Vec<Template>>> {
    Ok(Json(list(&st)?))
}

/// Remove a template (its checkpoint stays until deleted or collected).
#[utoipa::path(delete, path = "/v1/templates/{name}", tag = "templates", params(("name" = String, Path, description = "Template name")),
    responses((status = 204), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn delete_handler(State(st): State<Shared>, Path(name): Path<String>) -> ApiResult<StatusCode> {
    delete(&st, &name)?;
    Ok(StatusCode::NO_CONTENT)
}

/// Build a template from a build file; streams NDJSON `BuildEvent`s.
#[utoipa::path(post, path = "/v1/templates/build", tag = "templates", request_body = BuildTemplateRequest,
    responses((status = 200, description = "NDJSON stream of BuildEvent", body = BuildEvent)))]
pub async fn build_handler(
    State(st): State<Shared>,
    actor: Option<axum::Extension<strata_engine::audit::Actor>>,
    Json(req): Json<BuildTemplateRequest>,
) -> ApiResult<Response> {
    let actor = actor.map_or_else(|| "local".to_string(), |a| a.0 .0);
    let (tx, rx) = tokio::sync::mpsc::channel::<BuildEvent>(64);
    // The build creates sandboxes and checkpoints as the caller (its tenant).
    strata_engine::tenancy::spawn(async move {
        if let Err((index, e)) = build(&st, req, &tx, &actor).await {
            let _ = tx.send(BuildEvent::Failed { index, error: e.body }).await;
        }
    });
    Ok(crate::ndjson::response(rx))
}
