//! HTTP handlers of `processes` (see [`strata_engine::processes`]).

use crate::error::{ApiError, ApiResult};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use std::sync::Arc;
use strata_api::{
    ExecQuery, ExecRequest, ExecResult, LogsQuery, ProcessEvent, ProcessInfo, SignalRequest, StdinRequest, WaitQuery,
};
use strata_core::units;
use strata_engine::processes::*;
use strata_engine::record::load;
use strata_engine::state::Shared;

/// An NDJSON response streaming a process's events (see [`follow_events`]).
fn event_stream(p: Arc<Proc>, offset: u64, follow: bool, started: bool) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<ProcessEvent>(32);
    tokio::spawn(follow_events(p, offset, follow, started, tx));
    crate::ndjson::response(rx)
}

/// Run a command; by default waits and returns its output, with `?stream=true`
/// streams NDJSON `ProcessEvent`s while it runs.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/exec", tag = "processes", request_body = ExecRequest,
    params(("id" = String, Path, description = "Sandbox id or name"), ExecQuery),
    responses((status = 200, body = ExecResult, description = "Finished process (or an NDJSON stream of ProcessEvent with stream=true)"),
        (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn exec_handler(
    State(st): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<ExecQuery>,
    Json(req): Json<ExecRequest>,
) -> ApiResult<Response> {
    let p = spawn(&st, &id, req).await?;
    if q.stream {
        return Ok(event_stream(p, 0, true, true));
    }
    Ok(Json(p.result().await).into_response())
}

/// Start a background process.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes", tag = "processes", request_body = ExecRequest,
    params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 201, body = ProcessInfo), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn start_process_handler(
    State(st): State<Shared>,
    Path(id): Path<String>,
    Json(req): Json<ExecRequest>,
) -> ApiResult<(StatusCode, Json<ProcessInfo>)> {
    let p = spawn(&st, &id, req).await?;
    Ok((StatusCode::CREATED, Json(p.info())))
}

/// List processes started through the API.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes", tag = "processes", params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = [ProcessInfo]), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn list_processes_handler(
    State(st): State<Shared>,
    Path(id): Path<String>,
) -> ApiResult<Json<Vec<ProcessInfo>>> {
    let rec = load(&st, &id)?;
    Ok(Json(st.processes.list(&rec.sandbox.id)))
}

/// Inspect one process.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes/{pid}", tag = "processes",
    params(("id" = String, Path, description = "Sandbox id or name"), ("pid" = u64, Path, description = "Process id")),
    responses((status = 200, body = ProcessInfo), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn get_process_handler(
    State(st): State<Shared>,
    Path((id, pid)): Path<(String, u64)>,
) -> ApiResult<Json<ProcessInfo>> {
    Ok(Json(get_proc(&st, &id, pid)?.info()))
}

/// Read (and optionally follow) a process's buffered output as NDJSON `ProcessEvent`s.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes/{pid}/logs", tag = "processes",
    params(("id" = String, Path, description = "Sandbox id or name"), ("pid" = u64, Path, description = "Process id"), LogsQuery),
    responses((status = 200, description = "NDJSON stream of ProcessEvent", body = ProcessEvent), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn logs_handler(
    State(st): State<Shared>,
    Path((id, pid)): Path<(String, u64)>,
    Query(q): Query<LogsQuery>,
) -> ApiResult<Response> {
    let p = get_proc(&st, &id, pid)?;
    Ok(event_stream(p, q.offset, q.follow, false))
}

/// Send a signal to a process.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/signal", tag = "processes", request_body = SignalRequest,
    params(("id" = String, Path, description = "Sandbox id or name"), ("pid" = u64, Path, description = "Process id")),
    responses((status = 200, body = ProcessInfo), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn signal_handler(
    State(st): State<Shared>,
    Path((id, pid)): Path<(String, u64)>,
    Json(req): Json<SignalRequest>,
) -> ApiResult<Json<ProcessInfo>> {
    Ok(Json(signal(&st, &id, pid, &req.signal).await?))
}

/// Write to a process's stdin (started with `keep_stdin_open`), optionally closing it.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/stdin", tag = "processes", request_body = StdinRequest,
    params(("id" = String, Path, description = "Sandbox id or name"), ("pid" = u64, Path, description = "Process id")),
    responses((status = 204), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn stdin_handler(
    State(st): State<Shared>,
    Path((id, pid)): Path<(String, u64)>,
    Json(req): Json<StdinRequest>,
) -> ApiResult<StatusCode> {
    let data = B64.decode(&req.data_b64).map_err(|e| ApiError::bad_request(format!("data_b64: {e}")))?;
    write_stdin(&st, &id, pid, &data, req.close).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Wait for a process to exit (or the timeout to pass) and return its record.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/wait", tag = "processes",
    params(("id" = String, Path, description = "Sandbox id or name"), ("pid" = u64, Path, description = "Process id"), WaitQuery),
    responses((status = 200, body = ProcessInfo), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn wait_handler(
    State(st): State<Shared>,
    Path((id, pid)): Path<(String, u64)>,
    Query(q): Query<WaitQuery>,
) -> ApiResult<Json<ProcessInfo>> {
    let limit = q.timeout.as_deref().map(units::parse_duration).transpose()?;
    let p = get_proc(&st, &id, pid)?;
    Ok(Json(p.wait(limit).await))
}
