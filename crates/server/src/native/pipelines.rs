//! HTTP handlers of `pipelines` (see [`strata_engine::pipelines`]).

use crate::error::ApiResult;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::time::Duration;
use strata_api::{
    PipelineCost, PipelineEvent, PipelineQuery, PipelineRun, PipelineState, RunPipelineRequest, StageState,
};
use strata_engine::pipelines::*;
use strata_engine::state::Shared;

/// Streams a run's progress as NDJSON until it ends: the stages that have
/// started (from the database), then every change the driver publishes on
/// `rx` (subscribed by the caller before the run could move), then `finished`.
fn follow(st: &Shared, run_id: String, mut rx: tokio::sync::broadcast::Receiver<PipelineEvent>) -> Response {
    use tokio::sync::broadcast::error::RecvError;
    let (tx, out) = tokio::sync::mpsc::channel::<PipelineEvent>(32);
    let st = st.clone();
    tokio::spawn(async move {
        let Ok(Some(run)) = st.db.pipeline_run_by_id(&run_id) else { return };
        for (i, s) in run.stages.iter().enumerate().filter(|(_, s)| s.state != StageState::Pending) {
            if tx
                .send(PipelineEvent::Stage { run_id: run.id.clone(), index: i as u32, stage: Box::new(s.clone()) })
                .await
                .is_err()
            {
                return;
            }
        }
        if run.state != PipelineState::Running {
            let _ = tx.send(PipelineEvent::Finished { run: Box::new(run) }).await;
            return;
        }
        loop {
            match tokio::time::timeout(Duration::from_secs(1), rx.recv()).await {
                Ok(Ok(ev)) => {
                    let (mine, end) = match &ev {
                        PipelineEvent::Stage { run_id: r, .. } => (*r == run_id, false),
                        PipelineEvent::Finished { run } => (run.id == run_id, true),
                    };
                    if mine && (tx.send(ev).await.is_err() || end) {
                        return;
                    }
                }
                Ok(Err(RecvError::Closed)) => return,
                // Missed events or a quiet second: the database says whether it ended.
                Ok(Err(RecvError::Lagged(_))) | Err(_) => match st.db.pipeline_run_by_id(&run_id) {
                    Ok(Some(run)) if run.state != PipelineState::Running => {
                        let _ = tx.send(PipelineEvent::Finished { run: Box::new(run) }).await;
                        return;
                    }
                    Ok(Some(_)) => {}
                    _ => return,
                },
            }
        }
    });
    crate::ndjson::response(out)
}

/// Start a pipeline run (spec as TOML text or JSON); with `follow=true`, stream
/// NDJSON `PipelineEvent`s until it ends. A bad spec is a 400 naming the stage and field.
#[utoipa::path(post, path = "/v1/pipelines", tag = "pipelines", request_body = RunPipelineRequest, params(PipelineQuery),
    responses((status = 201, body = PipelineRun, description = "The run, started (or an NDJSON stream of PipelineEvent with follow=true)"),
        (status = 400, body = strata_api::ApiErrorBody)))]
pub async fn create_handler(
    State(st): State<Shared>,
    Query(q): Query<PipelineQuery>,
    Json(req): Json<RunPipelineRequest>,
) -> ApiResult<Response> {
    let spec = parse_request(req)?;
    let rx = events().subscribe();
    let run = start(&st, spec).await?;
    if q.follow {
        return Ok(follow(&st, run.id, rx));
    }
    Ok((StatusCode::CREATED, Json(run)).into_response())
}

/// Every pipeline run, newest first.
#[utoipa::path(get, path = "/v1/pipelines", tag = "pipelines", responses((status = 200, body = [PipelineRun])))]
pub async fn list_handler(State(st): State<Shared>) -> ApiResult<Json<Vec<PipelineRun>>> {
    Ok(Json(list_runs(&st)?))
}

/// A run's status (stage by stage); with `follow=true`, an NDJSON stream until it ends.
#[utoipa::path(get, path = "/v1/pipelines/{id}", tag = "pipelines", params(("id" = String, Path, description = "Run id or unique prefix"), PipelineQuery),
    responses((status = 200, body = PipelineRun), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn get_handler(
    State(st): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<PipelineQuery>,
) -> ApiResult<Response> {
    let rx = events().subscribe();
    let run = strata_engine::tenancy::find_pipeline_run(&st, &id)?.ok_or_else(|| not_found(&id))?;
    if q.follow {
        return Ok(follow(&st, run.id, rx));
    }
    Ok(Json(run).into_response())
}

/// Continue a failed or interrupted run from its first unfinished stage (409 when it
/// is running or already succeeded); `follow=true` streams like `POST /v1/pipelines`.
#[utoipa::path(post, path = "/v1/pipelines/{id}/resume", tag = "pipelines", params(("id" = String, Path, description = "Run id or unique prefix"), PipelineQuery),
    responses((status = 200, body = PipelineRun), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn resume_handler(
    State(st): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<PipelineQuery>,
) -> ApiResult<Response> {
    let rx = events().subscribe();
    let run = resume(&st, &id).await?;
    if q.follow {
        return Ok(follow(&st, run.id, rx));
    }
    Ok(Json(run).into_response())
}

/// Pause a running run at its next stage boundary (the current stage finishes);
/// `resume` continues it. 409 when it is not running.
#[utoipa::path(post, path = "/v1/pipelines/{id}/pause", tag = "pipelines", params(("id" = String, Path, description = "Run id or unique prefix")),
    responses((status = 200, body = PipelineRun), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn pause_handler(State(st): State<Shared>, Path(id): Path<String>) -> ApiResult<Json<PipelineRun>> {
    Ok(Json(pause(&st, &id)?))
}

/// Cost of a run, per stage (the stages' sandboxes, destroyed ones included).
#[utoipa::path(get, path = "/v1/pipelines/{id}/cost", tag = "pipelines", params(("id" = String, Path, description = "Run id or unique prefix")),
    responses((status = 200, body = PipelineCost), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn cost_handler(State(st): State<Shared>, Path(id): Path<String>) -> ApiResult<Json<PipelineCost>> {
    Ok(Json(cost(&st, &id)?))
}
