//! HTTP handlers of `pipelines` (see [`strata_engine::pipelines`]).

use crate::error::ApiResult;
use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use strata_api::{PipelineCost, PipelineQuery, PipelineRun, RunPipelineRequest};

use crate::native::acting::Acting;

/// Start a pipeline run (spec as TOML text or JSON); with `follow=true`, stream
/// NDJSON `PipelineEvent`s until it ends. A bad spec is a 400 naming the stage and field.
#[utoipa::path(post, path = "/v1/pipelines", tag = "pipelines", request_body = RunPipelineRequest, params(PipelineQuery),
    responses((status = 201, body = PipelineRun, description = "The run, started (or an NDJSON stream of PipelineEvent with follow=true)"),
        (status = 400, body = strata_api::ApiErrorBody)))]
pub async fn create_handler(
    Acting(engine): Acting,
    Query(q): Query<PipelineQuery>,
    Json(req): Json<RunPipelineRequest>,
) -> ApiResult<Response> {
    let (run, progress) = engine.start_pipeline(req).await?;
    if q.follow {
        return Ok(crate::ndjson::response(progress.follow()));
    }
    Ok((StatusCode::CREATED, Json(run)).into_response())
}

/// Every pipeline run, newest first.
#[utoipa::path(get, path = "/v1/pipelines", tag = "pipelines", responses((status = 200, body = [PipelineRun])))]
pub async fn list_handler(Acting(engine): Acting) -> ApiResult<Json<Vec<PipelineRun>>> {
    Ok(Json(engine.list_pipelines().await?))
}

/// A run's status (stage by stage); with `follow=true`, an NDJSON stream until it ends.
#[utoipa::path(get, path = "/v1/pipelines/{id}", tag = "pipelines", params(("id" = String, Path, description = "Run id or unique prefix"), PipelineQuery),
    responses((status = 200, body = PipelineRun), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn get_handler(
    Acting(engine): Acting,
    Path(id): Path<String>,
    Query(q): Query<PipelineQuery>,
) -> ApiResult<Response> {
    let (run, progress) = engine.get_pipeline(&id).await?;
    if q.follow {
        return Ok(crate::ndjson::response(progress.follow()));
    }
    Ok(Json(run).into_response())
}

/// Continue a failed or interrupted run from its first unfinished stage (409 when it
/// is running or already succeeded); `follow=true` streams like `POST /v1/pipelines`.
#[utoipa::path(post, path = "/v1/pipelines/{id}/resume", tag = "pipelines", params(("id" = String, Path, description = "Run id or unique prefix"), PipelineQuery),
    responses((status = 200, body = PipelineRun), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn resume_handler(
    Acting(engine): Acting,
    Path(id): Path<String>,
    Query(q): Query<PipelineQuery>,
) -> ApiResult<Response> {
    let (run, progress) = engine.resume_pipeline(&id).await?;
    if q.follow {
        return Ok(crate::ndjson::response(progress.follow()));
    }
    Ok(Json(run).into_response())
}

/// Pause a running run at its next stage boundary (the current stage finishes);
/// `resume` continues it. 409 when it is not running.
#[utoipa::path(post, path = "/v1/pipelines/{id}/pause", tag = "pipelines", params(("id" = String, Path, description = "Run id or unique prefix")),
    responses((status = 200, body = PipelineRun), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn pause_handler(Acting(engine): Acting, Path(id): Path<String>) -> ApiResult<Json<PipelineRun>> {
    Ok(Json(engine.pause_pipeline(&id).await?))
}

/// Cost of a run, per stage (the stages' sandboxes, destroyed ones included).
#[utoipa::path(get, path = "/v1/pipelines/{id}/cost", tag = "pipelines", params(("id" = String, Path, description = "Run id or unique prefix")),
    responses((status = 200, body = PipelineCost), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn cost_handler(Acting(engine): Acting, Path(id): Path<String>) -> ApiResult<Json<PipelineCost>> {
    Ok(Json(engine.pipeline_cost(&id).await?))
}
