//! HTTP handlers of `templates` (see [`strata_engine::templates`]).

use crate::error::ApiResult;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use strata_api::{BuildTemplateRequest, CreateTemplateRequest, Template, TemplateCheckReport, TemplatePolicyPatch};

use crate::native::acting::Acting;

/// Promote a checkpoint (or a sandbox, checkpointed first) to a template.
#[utoipa::path(post, path = "/v1/templates", tag = "templates", request_body = CreateTemplateRequest,
    responses((status = 201, body = Template), (status = 404, body = strata_api::ApiErrorBody), (status = 409, description = "name taken, or `scan_findings` with the findings listed", body = strata_api::ApiErrorBody)))]
pub async fn create_handler(
    Acting(engine): Acting,
    Json(req): Json<CreateTemplateRequest>,
) -> ApiResult<(StatusCode, Json<Template>)> {
    Ok((StatusCode::CREATED, Json(engine.create_template(&req).await?)))
}

/// List templates.
#[utoipa::path(get, path = "/v1/templates", tag = "templates", responses((status = 200, body = [Template])))]
pub async fn list_handler(Acting(engine): Acting) -> ApiResult<Json<Vec<Template>>> {
    Ok(Json(engine.list_templates().await?))
}

/// Remove a template (its checkpoint stays until deleted or collected).
#[utoipa::path(delete, path = "/v1/templates/{name}", tag = "templates", params(("name" = String, Path, description = "Template name")),
    responses((status = 204), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn delete_handler(Acting(engine): Acting, Path(name): Path<String>) -> ApiResult<StatusCode> {
    engine.delete_template(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Set a template's checks at set times (`check_every`, `on_findings`: `record` or `quarantine`).
#[utoipa::path(patch, path = "/v1/templates/{name}", tag = "templates", request_body = TemplatePolicyPatch,
    params(("name" = String, Path, description = "Template name")),
    responses((status = 200, body = Template),
        (status = 400, body = strata_api::ApiErrorBody, description = "an interval below the minimum, or `flush`/`stop`"),
        (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn policy_handler(
    Acting(engine): Acting,
    Path(name): Path<String>,
    Json(patch): Json<TemplatePolicyPatch>,
) -> ApiResult<Json<Template>> {
    Ok(Json(engine.set_template_policy(&name, patch).await?))
}

/// Check a template now: its checkpoint scanned under today's rules, and
/// whether its image has a newer version (`image.outdated`); its
/// `on_findings` applies and the report becomes its `last_check`.
#[utoipa::path(post, path = "/v1/templates/{name}/check", tag = "templates",
    params(("name" = String, Path, description = "Template name")),
    responses((status = 200, body = TemplateCheckReport), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn check_handler(Acting(engine): Acting, Path(name): Path<String>) -> ApiResult<Json<TemplateCheckReport>> {
    Ok(Json(engine.check_template(&name).await?))
}

/// Build a template from a build file; streams NDJSON `BuildEvent`s.
#[utoipa::path(post, path = "/v1/templates/build", tag = "templates", request_body = BuildTemplateRequest,
    responses((status = 200, description = "NDJSON stream of BuildEvent", body = strata_api::BuildEvent)))]
pub async fn build_handler(Acting(engine): Acting, Json(req): Json<BuildTemplateRequest>) -> ApiResult<Response> {
    Ok(crate::ndjson::response(engine.build_template(req)))
}
