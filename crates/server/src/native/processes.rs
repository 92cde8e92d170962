//! HTTP handlers of `processes` (see [`strata_engine::processes`]).

use crate::error::ApiResult;
use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use strata_api::{
    ExecQuery, ExecRequest, ExecResult, LogsQuery, ProcessEvent, ProcessInfo, SignalRequest, StdinRequest, TtyMessage,
    TtyQuery, TtySize, WaitQuery,
};
use strata_core::units;

use crate::native::acting::Acting;

/// Run a command; by default waits and returns its output, with `?stream=true`
/// streams NDJSON `ProcessEvent`s while it runs.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/exec", tag = "processes", request_body = ExecRequest,
    params(("id" = String, Path, description = "Sandbox id or name"), ExecQuery),
    responses((status = 200, body = ExecResult, description = "Finished process (or an NDJSON stream of ProcessEvent with stream=true)"),
        (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn exec_handler(
    Acting(engine): Acting,
    Path(id): Path<String>,
    Query(q): Query<ExecQuery>,
    Json(req): Json<ExecRequest>,
) -> ApiResult<Response> {
    if q.stream {
        return Ok(crate::ndjson::stream(engine.exec_streaming(&id, &req).await?));
    }
    Ok(Json(engine.exec(&id, &req).await?).into_response())
}

/// Start a background process.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes", tag = "processes", request_body = ExecRequest,
    params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 201, body = ProcessInfo), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn start_process_handler(
    Acting(engine): Acting,
    Path(id): Path<String>,
    Json(req): Json<ExecRequest>,
) -> ApiResult<(StatusCode, Json<ProcessInfo>)> {
    Ok((StatusCode::CREATED, Json(engine.start_process(&id, &req).await?)))
}

/// List processes started through the API.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes", tag = "processes", params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 200, body = [ProcessInfo]), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn list_processes_handler(
    Acting(engine): Acting,
    Path(id): Path<String>,
) -> ApiResult<Json<Vec<ProcessInfo>>> {
    Ok(Json(engine.list_processes(&id).await?))
}

/// Inspect one process.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes/{pid}", tag = "processes",
    params(("id" = String, Path, description = "Sandbox id or name"), ("pid" = u64, Path, description = "Process id")),
    responses((status = 200, body = ProcessInfo), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn get_process_handler(
    Acting(engine): Acting,
    Path((id, pid)): Path<(String, u64)>,
) -> ApiResult<Json<ProcessInfo>> {
    Ok(Json(engine.get_process(&id, pid).await?))
}

/// Read (and optionally follow) a process's buffered output as NDJSON `ProcessEvent`s.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes/{pid}/logs", tag = "processes",
    params(("id" = String, Path, description = "Sandbox id or name"), ("pid" = u64, Path, description = "Process id"), LogsQuery),
    responses((status = 200, description = "NDJSON stream of ProcessEvent", body = strata_api::ProcessEvent), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn logs_handler(
    Acting(engine): Acting,
    Path((id, pid)): Path<(String, u64)>,
    Query(q): Query<LogsQuery>,
) -> ApiResult<Response> {
    Ok(crate::ndjson::stream(engine.logs(&id, pid, q.offset, q.follow).await?))
}

/// Send a signal to a process.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/signal", tag = "processes", request_body = SignalRequest,
    params(("id" = String, Path, description = "Sandbox id or name"), ("pid" = u64, Path, description = "Process id")),
    responses((status = 200, body = ProcessInfo), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn signal_handler(
    Acting(engine): Acting,
    Path((id, pid)): Path<(String, u64)>,
    Json(req): Json<SignalRequest>,
) -> ApiResult<Json<ProcessInfo>> {
    Ok(Json(engine.signal(&id, pid, &req.signal).await?))
}

/// Write to a process's stdin (started with `keep_stdin_open`), optionally closing it.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/stdin", tag = "processes", request_body = StdinRequest,
    params(("id" = String, Path, description = "Sandbox id or name"), ("pid" = u64, Path, description = "Process id")),
    responses((status = 204), (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn stdin_handler(
    Acting(engine): Acting,
    Path((id, pid)): Path<(String, u64)>,
    Json(req): Json<StdinRequest>,
) -> ApiResult<StatusCode> {
    engine.write_stdin(&id, pid, &req).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Wait for a process to exit (or the timeout to pass) and return its record.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/wait", tag = "processes",
    params(("id" = String, Path, description = "Sandbox id or name"), ("pid" = u64, Path, description = "Process id"), WaitQuery),
    responses((status = 200, body = ProcessInfo), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn wait_handler(
    Acting(engine): Acting,
    Path((id, pid)): Path<(String, u64)>,
    Query(q): Query<WaitQuery>,
) -> ApiResult<Json<ProcessInfo>> {
    let limit = q.timeout.as_deref().map(units::parse_duration).transpose()?;
    Ok(Json(engine.wait(&id, pid, limit).await?))
}

/// Resize a process's terminal (a process started with `tty`).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/processes/{pid}/resize", tag = "processes", request_body = TtySize,
    params(("id" = String, Path, description = "Sandbox id or name"), ("pid" = u64, Path, description = "Process id")),
    responses((status = 200, body = ProcessInfo), (status = 400, body = strata_api::ApiErrorBody),
        (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody, description = "No terminal, or the process ended")))]
pub async fn resize_handler(
    Acting(engine): Acting,
    Path((id, pid)): Path<(String, u64)>,
    Json(size): Json<TtySize>,
) -> ApiResult<Json<ProcessInfo>> {
    Ok(Json(engine.resize_tty(&id, pid, size).await?))
}

/// Attach to a process's terminal over a WebSocket: binary frames to it are
/// its input, binary frames from it its output; text frames carry
/// `TtyMessage` JSON (`resize` to it; `dropped`, `error` and, last,
/// `exited` from it).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/processes/{pid}/tty", tag = "processes",
    params(("id" = String, Path, description = "Sandbox id or name"), ("pid" = u64, Path, description = "Process id"), TtyQuery),
    responses((status = 101, description = "WebSocket of the terminal (see TtyMessage)", body = TtyMessage),
        (status = 404, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody, description = "No terminal, or the process ended")))]
pub async fn tty_handler(
    Acting(engine): Acting,
    Path((id, pid)): Path<(String, u64)>,
    Query(q): Query<TtyQuery>,
    ws: axum::extract::ws::WebSocketUpgrade,
) -> ApiResult<Response> {
    let term = engine.attach_tty(&id, pid, q.offset).await?;
    Ok(ws.on_upgrade(move |socket| serve_terminal(socket, term)))
}

/// Relays one attached terminal until its process ends or the client goes.
async fn serve_terminal(mut socket: axum::extract::ws::WebSocket, mut term: strata_engine::surface::Terminal) {
    use axum::extract::ws::Message;
    use base64::Engine as _;
    let text = |m: &TtyMessage| Message::Text(serde_json::to_string(m).expect("serializes").into());
    loop {
        tokio::select! {
            msg = socket.recv() => match msg {
                Some(Ok(Message::Binary(data))) => {
                    if let Err(e) = term.input.write(&data).await {
                        let _ = socket.send(text(&TtyMessage::Error { message: e.body.message })).await;
                    }
                }
                Some(Ok(Message::Text(t))) => {
                    let answer = match serde_json::from_str::<TtyMessage>(&t) {
                        Ok(TtyMessage::Resize { cols, rows }) => {
                            term.input.resize(TtySize { cols, rows }).await.err().map(|e| e.body.message)
                        }
                        Ok(_) => Some("a client sends only resize messages".to_string()),
                        Err(e) => Some(format!("not a terminal message: {e}")),
                    };
                    if let Some(message) = answer {
                        let _ = socket.send(text(&TtyMessage::Error { message })).await;
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                Some(Ok(_)) => {} // pings are answered by the socket itself
            },
            ev = futures_util::StreamExt::next(&mut term.events) => {
                let msg = match ev {
                    Some(ProcessEvent::Output { data_b64, .. }) => {
                        match base64::engine::general_purpose::STANDARD.decode(data_b64) {
                            Ok(bytes) => Message::Binary(bytes.into()),
                            Err(_) => continue,
                        }
                    }
                    Some(ProcessEvent::Dropped { bytes }) => text(&TtyMessage::Dropped { bytes }),
                    Some(ProcessEvent::Exited { process }) => {
                        let _ = socket.send(text(&TtyMessage::Exited { process })).await;
                        let _ = socket.send(Message::Close(None)).await;
                        return;
                    }
                    Some(ProcessEvent::Started { .. }) => continue,
                    None => {
                        let _ = socket.send(Message::Close(None)).await;
                        return;
                    }
                };
                if socket.send(msg).await.is_err() {
                    return;
                }
            }
        }
    }
}
