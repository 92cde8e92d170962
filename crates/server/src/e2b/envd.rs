//! envd, the in-sandbox API of E2B, served by the daemon for the sandbox named
//! in `E2b-Sandbox-Id`: the Connect services `process.Process` and
//! `filesystem.Filesystem` (JSON codec, as the SDK uses it) and the HTTP routes
//! `/files` and `/health`. Messages follow envd's `process/process.proto` and
//! `filesystem/filesystem.proto` (field names in proto3 JSON form, taken from
//! the descriptors shipped in the `e2b` package); every call is a strata
//! process or file call made with the caller's token.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};
use strata_api::{
    ErrorCode, ExecRequest, FileKind, FileStat, ProcessEvent, ProcessInfo, ProcessStatus, StdinRequest, StreamKind,
    TtySize,
};
use strata_engine::error::{EngineError, ErrorKind};
use tokio::sync::mpsc;
use tracing::debug;

use super::audit::Who;
use super::connect::{self, Code, ConnectError};
use super::multipart::Multipart;
use super::{request_token, SharedE2b};
use strata_engine::Engine;

/// Largest `/files` upload (all its parts together), counted while it streams.
const MAX_UPLOAD: u64 = 512 * 1024 * 1024;
/// Default user of commands and files (E2B's base image convention).
pub const DEFAULT_USER: &str = "user";
/// How often a directory watch polls.
const WATCH_POLL: Duration = Duration::from_millis(200);
/// Most entries a recursive watch or listing walks.
const MAX_WALK: usize = 10_000;

/// How a process was started through envd (strata does not keep tags or the
/// original config).
#[derive(Debug, Clone)]
pub struct ProcMeta {
    /// `ProcessConfig` as given (proto3 JSON).
    pub config: Value,
    /// The tag, if any.
    pub tag: Option<String>,
    /// Runs on a pseudo-terminal (its output is `pty` data, its input `pty` input).
    pub pty: bool,
    /// SHA-256 of the key that started it: only that key's calls see its tag,
    /// config and PTY (the map is looked up before any native call checks access).
    pub owner: String,
}

/// A polling directory watcher (`CreateWatcher`).
#[derive(Debug, Clone)]
pub struct Watcher {
    sandbox: String,
    token: String,
    path: String,
    recursive: bool,
    seen: HashMap<String, (FileKind, u64, i64)>,
}

impl Watcher {
    /// The watched sandbox.
    pub fn sandbox(&self) -> &str {
        &self.sandbox
    }
}

/// The envd routes (reached through [`super::dispatch`]).
pub fn router(e2b: SharedE2b) -> Router {
    Router::new()
        .route("/health", get(|| async { StatusCode::NO_CONTENT }))
        .route("/files", get(download).post(upload))
        .route("/process.Process/{method}", post(process))
        .route("/filesystem.Filesystem/{method}", post(filesystem))
        .fallback(|uri: axum::http::Uri| async move {
            (StatusCode::NOT_FOUND, Json(json!({"code": 404, "message": format!("envd has no route {}", uri.path())})))
        })
        .with_state(e2b)
}

/// Who is calling which sandbox.
struct Ctx {
    client: Engine,
    token: String,
    sandbox: String,
    user: String,
}

impl Ctx {
    /// The owner mark of what this caller records in the E2B layer's own maps.
    fn owner(&self) -> String {
        strata_engine::tenancy::secret_hash(&self.token)
    }

    /// This caller's entry for process `pid` of its sandbox, if it started it.
    fn own_proc(&self, e: &SharedE2b, pid: u64) -> Option<ProcMeta> {
        let owner = self.owner();
        e.lock().procs.get(&(self.sandbox.clone(), pid)).filter(|m| m.owner == owner).cloned()
    }

    fn home(&self) -> String {
        home_of(&self.user)
    }

    /// An absolute path: relative ones and `~` are the user's home.
    fn path(&self, p: &str) -> String {
        path_of(&self.user, p)
    }
}

/// The home directory of `user` (E2B's base image convention).
fn home_of(user: &str) -> String {
    if user == "root" {
        "/root".into()
    } else {
        format!("/home/{user}")
    }
}

/// `p` as an absolute path for `user`: relative ones and `~` are the user's home.
fn path_of(user: &str, p: &str) -> String {
    if p.starts_with('/') {
        p.to_string()
    } else if p == "~" || p.is_empty() {
        home_of(user)
    } else if let Some(rest) = p.strip_prefix("~/") {
        format!("{}/{rest}", home_of(user))
    } else {
        format!("{}/{p}", home_of(user))
    }
}

/// Runs `cmd` in the sandbox as the caller's user (file operations that must
/// create things owned by that user, with that user's permissions).
async fn run_as(c: &Ctx, cmd: &[&str]) -> Result<(), ConnectError> {
    let req = ExecRequest {
        cmd: cmd.iter().map(|s| s.to_string()).collect(),
        user: Some(c.user.clone()),
        cwd: Some("/".into()),
        timeout: Some("60s".into()),
        ..Default::default()
    };
    let r = c.client.exec(&c.sandbox, &req).await.map_err(native)?;
    if r.process.exit_status() == 0 {
        return Ok(());
    }
    let err = base64::engine::general_purpose::STANDARD.decode(&r.stderr_b64).unwrap_or_default();
    let msg = String::from_utf8_lossy(&err).trim().to_string();
    let code = if msg.contains("Permission denied") {
        Code::PermissionDenied
    } else if msg.contains("No such file") {
        Code::NotFound
    } else {
        Code::InvalidArgument
    };
    Err(ConnectError::new(code, format!("{}: {msg}", cmd.join(" "))))
}

/// Gives a file the daemon wrote to the caller's user (files are written by
/// the daemon as root; E2B's files belong to the user who wrote them).
async fn chown_to_user(c: &Ctx, path: &str) -> Result<(), ConnectError> {
    if c.user == "root" {
        return Ok(());
    }
    let req = ExecRequest {
        cmd: vec!["chown".into(), "-h".into(), format!("{0}:{0}", c.user), path.into()],
        user: Some("root".into()),
        cwd: Some("/".into()),
        timeout: Some("60s".into()),
        ..Default::default()
    };
    let r = c.client.exec(&c.sandbox, &req).await.map_err(native)?;
    if r.process.exit_status() != 0 {
        let err = base64::engine::general_purpose::STANDARD.decode(&r.stderr_b64).unwrap_or_default();
        return Err(ConnectError::new(
            Code::Internal,
            format!("chown {path}: {}", String::from_utf8_lossy(&err).trim()),
        ));
    }
    Ok(())
}

/// The user from `Authorization: Basic base64(user:)` or a `username` query.
fn user_of(headers: &HeaderMap, query_user: Option<&str>) -> String {
    if let Some(u) = query_user.filter(|u| !u.is_empty()) {
        return u.to_string();
    }
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b.trim()).ok())
        .and_then(|b| String::from_utf8(b).ok())
        .map(|s| s.split(':').next().unwrap_or("").to_string())
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| DEFAULT_USER.to_string())
}

fn ctx(e: &SharedE2b, who: &Who, headers: &HeaderMap, query_user: Option<&str>) -> Result<Ctx, ConnectError> {
    let sandbox = headers.get("e2b-sandbox-id").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let client = e
        .native(who, headers, "access token: send X-Access-Token (the envdAccessToken of the sandbox)")
        .map_err(|err| ConnectError::new(Code::Unauthenticated, err.message()))?;
    let token = request_token(headers).unwrap_or_default();
    Ok(Ctx { client, token, sandbox, user: user_of(headers, query_user) })
}

/// An engine error as a Connect error.
fn native(e: EngineError) -> ConnectError {
    let code = match e.kind() {
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::BadRequest => Code::InvalidArgument,
        ErrorKind::Forbidden | ErrorKind::ApprovalRequired => Code::PermissionDenied,
        ErrorKind::TooLarge | ErrorKind::ResourceExhausted => Code::ResourceExhausted,
        ErrorKind::Unauthorized => Code::Unauthenticated,
        ErrorKind::InvalidState => Code::FailedPrecondition,
        ErrorKind::Conflict if e.body.code == ErrorCode::NameConflict => Code::AlreadyExists,
        ErrorKind::Conflict => Code::FailedPrecondition,
        ErrorKind::Unsupported => Code::Unimplemented,
        ErrorKind::Timeout => Code::DeadlineExceeded,
        ErrorKind::Unavailable => Code::Unavailable,
        ErrorKind::Internal => Code::Internal,
    };
    ConnectError::new(code, e.body.message)
}

fn parse<T: serde::de::DeserializeOwned>(payload: &[u8], what: &str) -> Result<T, ConnectError> {
    let payload: &[u8] = if payload.is_empty() { b"{}" } else { payload };
    serde_json::from_slice(payload)
        .map_err(|e| ConnectError::new(Code::InvalidArgument, format!("malformed {what}: {e}")))
}

/// How the request is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Unary,
    Stream,
}

fn framing(headers: &HeaderMap) -> Result<Framing, ConnectError> {
    let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let base = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    match base.as_str() {
        "application/json" => Ok(Framing::Unary),
        "application/connect+json" => Ok(Framing::Stream),
        "application/proto" | "application/connect+proto" => Err(ConnectError::new(
            Code::Unimplemented,
            "the binary protobuf codec is not supported by strata's envd: use the JSON codec (as the e2b SDK does)",
        )),
        other => Err(ConnectError::new(
            Code::InvalidArgument,
            format!("unsupported content type {other:?} (application/json or application/connect+json)"),
        )),
    }
}

/// The first message of a streaming request body.
fn stream_message(body: &[u8]) -> Result<Bytes, ConnectError> {
    let frames = connect::decode_all(body)?;
    frames
        .into_iter()
        .find(|(f, _)| f & connect::FLAG_END_STREAM == 0)
        .map(|(_, p)| p)
        .ok_or_else(|| ConnectError::new(Code::InvalidArgument, "streaming request without a message"))
}

fn unary_ok(v: Value) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

/// A streaming response fed by a channel of messages: a closed channel ends
/// the stream cleanly, an `Err` ends it with that error.
fn stream_response(rx: mpsc::Receiver<Result<Value, ConnectError>>) -> Response {
    let body = futures_util::stream::unfold((rx, false), |(mut rx, done)| async move {
        if done {
            return None;
        }
        match rx.recv().await {
            Some(Ok(v)) => Some((Ok::<_, Infallible>(connect::envelope(0, v.to_string().as_bytes())), (rx, false))),
            Some(Err(e)) => Some((Ok(connect::end_stream(Some(&e))), (rx, true))),
            None => Some((Ok(connect::end_stream(None)), (rx, true))),
        }
    });
    ([(header::CONTENT_TYPE, "application/connect+json")], Body::from_stream(body)).into_response()
}

/// A streaming error response (HTTP 200, the error in the end-of-stream envelope).
fn stream_error(err: &ConnectError) -> Response {
    ([(header::CONTENT_TYPE, "application/connect+json")], connect::end_stream(Some(err))).into_response()
}

fn error_response(f: Framing, err: ConnectError) -> Response {
    debug!(code = err.code.as_str(), message = %err.message, "envd error");
    match f {
        Framing::Unary => err.unary_response(),
        Framing::Stream => stream_error(&err),
    }
}

// ---------------------------------------------------------------- process.Process

/// `process.ProcessConfig`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProcessConfig {
    #[serde(default)]
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    envs: BTreeMap<String, String>,
    #[serde(default)]
    cwd: Option<String>,
}

/// `process.StartRequest`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StartRequest {
    #[serde(default)]
    process: Option<ProcessConfig>,
    #[serde(default)]
    pty: Option<Value>,
    #[serde(default)]
    tag: Option<String>,
    #[serde(default)]
    stdin: Option<bool>,
}

/// `process.ProcessSelector` (a oneof: `pid` or `tag`).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Selector {
    #[serde(default)]
    pid: Option<u64>,
    #[serde(default)]
    tag: Option<String>,
}

/// Requests that name a process (`ConnectRequest`, `SendSignalRequest`,
/// `SendInputRequest`, `CloseStdinRequest`, `UpdateRequest`).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProcessRequest {
    #[serde(default)]
    process: Option<Selector>,
    #[serde(default)]
    signal: Option<Value>,
    #[serde(default)]
    input: Option<ProcessInput>,
}

/// `process.UpdateRequest`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct UpdateRequest {
    #[serde(default)]
    process: Option<Selector>,
    #[serde(default)]
    pty: Option<Value>,
}

/// `process.PTY` -> its size, clamped to sane terminal sizes.
fn pty_size(v: &Value) -> TtySize {
    let dim = |k: &str, d: u64| {
        v.get("size").and_then(|s| s.get(k)).and_then(Value::as_u64).unwrap_or(d).clamp(1, 1000) as u16
    };
    TtySize { cols: dim("cols", 80), rows: dim("rows", 24) }
}

/// `process.Process/Update`: resizes a PTY (strata's terminal of the
/// process; right after its start too: the resize waits for it to run).
async fn resize(e: &SharedE2b, c: &Ctx, req: UpdateRequest) -> Result<(), ConnectError> {
    let pid = resolve(e, c, req.process)?;
    let Some(size) = req.pty.as_ref().filter(|p| !p.is_null()) else { return Ok(()) };
    if !c.own_proc(e, pid).is_some_and(|m| m.pty) {
        return Err(ConnectError::new(Code::InvalidArgument, format!("process {pid} has no PTY")));
    }
    match c.client.resize_tty(&c.sandbox, pid, pty_size(size)).await {
        Ok(_) => Ok(()),
        Err(err) if err.body.code == ErrorCode::InvalidState => {
            Err(ConnectError::new(Code::NotFound, format!("process with pid {pid} not found (it has exited)")))
        }
        Err(err) => Err(native(err)),
    }
}

/// `process.ProcessInput` (a oneof: `stdin` or `pty`, base64 bytes).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProcessInput {
    #[serde(default)]
    stdin: Option<String>,
    #[serde(default)]
    pty: Option<String>,
}

/// `process.StreamInputRequest` (a oneof: `start`, `data`, `keepalive`).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StreamInputRequest {
    #[serde(default)]
    start: Option<ProcessRequest>,
    #[serde(default)]
    data: Option<ProcessRequest>,
}

/// The framing and caller of a Connect call, or the Connect error answering it.
fn connect_call(e: &SharedE2b, who: &Who, headers: &HeaderMap) -> Result<(Framing, Ctx), Box<Response>> {
    let f = framing(headers).map_err(|err| Box::new(error_response(Framing::Unary, err)))?;
    let c = ctx(e, who, headers, None).map_err(|err| Box::new(error_response(f, err)))?;
    Ok((f, c))
}

async fn process(
    State(e): State<SharedE2b>,
    who: Who,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (f, c) = match connect_call(&e, &who, &headers) {
        Ok(x) => x,
        Err(r) => return *r,
    };
    let keepalive = headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map(Duration::from_secs);
    let res = match (method.as_str(), f) {
        ("Start", Framing::Stream) => {
            match stream_message(&body).and_then(|m| parse::<StartRequest>(&m, "process.StartRequest")) {
                Ok(req) => return start(e, c, req, keepalive).await.unwrap_or_else(|err| stream_error(&err)),
                Err(err) => Err(err),
            }
        }
        ("Connect", Framing::Stream) => {
            match stream_message(&body).and_then(|m| parse::<ProcessRequest>(&m, "process.ConnectRequest")) {
                Ok(req) => return reconnect(e, c, req, keepalive).await.unwrap_or_else(|err| stream_error(&err)),
                Err(err) => Err(err),
            }
        }
        ("StreamInput", Framing::Stream) => stream_input(&e, &c, &body).await.map(|()| {
            let mut b = connect::envelope(0, b"{}").to_vec();
            b.extend_from_slice(&connect::end_stream(None));
            ([(header::CONTENT_TYPE, "application/connect+json")], b).into_response()
        }),
        ("List", Framing::Unary) => list(&e, &c).await.map(unary_ok),
        ("SendSignal", Framing::Unary) => match parse::<ProcessRequest>(&body, "process.SendSignalRequest") {
            Ok(req) => send_signal(&e, &c, req).await.map(|()| unary_ok(json!({}))),
            Err(err) => Err(err),
        },
        ("SendInput", Framing::Unary) => match parse::<ProcessRequest>(&body, "process.SendInputRequest") {
            Ok(req) => send_input(&e, &c, req.process, req.input).await.map(|()| unary_ok(json!({}))),
            Err(err) => Err(err),
        },
        ("CloseStdin", Framing::Unary) => match parse::<ProcessRequest>(&body, "process.CloseStdinRequest") {
            Ok(req) => close_stdin(&e, &c, req).await.map(|()| unary_ok(json!({}))),
            Err(err) => Err(err),
        },
        ("Update", Framing::Unary) => match parse::<UpdateRequest>(&body, "process.UpdateRequest") {
            Ok(req) => resize(&e, &c, req).await.map(|()| unary_ok(json!({}))),
            Err(err) => Err(err),
        },
        ("Start" | "Connect" | "StreamInput", Framing::Unary)
        | ("List" | "SendSignal" | "SendInput" | "CloseStdin" | "Update", Framing::Stream) => Err(ConnectError::new(
            Code::InvalidArgument,
            format!("process.{method}: wrong content type for this method's streaming kind"),
        )),
        _ => {
            Err(ConnectError::new(Code::Unimplemented, format!("process.{method} is not a method of process.Process")))
        }
    };
    res.unwrap_or_else(|err| error_response(f, err))
}

/// The strata process id a selector names (a tag is looked up among the
/// processes started through envd).
fn resolve(e: &SharedE2b, c: &Ctx, sel: Option<Selector>) -> Result<u64, ConnectError> {
    let sel = sel.ok_or_else(|| ConnectError::new(Code::InvalidArgument, "process selector missing"))?;
    if let Some(pid) = sel.pid {
        return Ok(pid);
    }
    let tag =
        sel.tag.ok_or_else(|| ConnectError::new(Code::InvalidArgument, "process selector has neither pid nor tag"))?;
    let owner = c.owner();
    e.lock()
        .procs
        .iter()
        .find(|((sb, _), m)| sb == &c.sandbox && m.owner == owner && m.tag.as_deref() == Some(tag.as_str()))
        .map(|((_, pid), _)| *pid)
        .ok_or_else(|| ConnectError::new(Code::NotFound, format!("process with tag {tag:?} not found")))
}

fn end_event(p: &ProcessInfo) -> Value {
    let code = p.exit_status();
    let status = match (&p.spawn_error, p.signal) {
        (Some(err), _) => format!("spawn error: {err}"),
        (None, Some(sig)) => format!("signal: {sig}"),
        _ => format!("exit status {code}"),
    };
    let mut end = json!({"exitCode": code, "exited": p.signal.is_none() && p.spawn_error.is_none(), "status": status});
    if let Some(err) = &p.spawn_error {
        end["error"] = json!(err);
    } else if p.timed_out {
        end["error"] = json!("timed out");
    }
    json!({"event": {"end": end}})
}

/// Streams a process's events (`StartResponse`/`ConnectResponse`) from its log.
fn follow(c: Ctx, pid: u64, pty: bool, keepalive: Option<Duration>) -> Response {
    let (tx, rx) = mpsc::channel::<Result<Value, ConnectError>>(64);
    tokio::spawn(async move {
        if tx.send(Ok(json!({"event": {"start": {"pid": pid}}}))).await.is_err() {
            return;
        }
        let mut stream = match c.client.logs(&c.sandbox, pid, 0, true).await {
            Ok(s) => s,
            Err(err) => {
                let _ = tx.send(Err(native(err))).await;
                return;
            }
        };
        let tick = keepalive.unwrap_or(Duration::from_secs(3600));
        loop {
            let next = tokio::select! {
                n = stream.next() => n,
                _ = tokio::time::sleep(tick) => {
                    if tx.send(Ok(json!({"event": {"keepalive": {}}}))).await.is_err() {
                        return;
                    }
                    continue;
                }
                _ = tx.closed() => return,
            };
            let ev = match next {
                Ok(Some(ev)) => ev,
                Ok(None) => {
                    // The log ended without an exit event: report what strata knows.
                    match c.client.get_process(&c.sandbox, pid).await {
                        Ok(p) if p.status == ProcessStatus::Exited => {
                            let _ = tx.send(Ok(end_event(&p))).await;
                        }
                        Ok(_) => {
                            let _ = tx
                                .send(Err(ConnectError::new(
                                    Code::Unavailable,
                                    format!("the output stream of process {pid} ended before it exited"),
                                )))
                                .await;
                        }
                        Err(err) => {
                            let _ = tx.send(Err(native(err))).await;
                        }
                    }
                    return;
                }
                Err(err) => {
                    let _ = tx.send(Err(native(err))).await;
                    return;
                }
            };
            let msg = match ev {
                ProcessEvent::Started { .. } | ProcessEvent::Dropped { .. } => continue,
                ProcessEvent::Output { stream, data_b64, .. } => {
                    let key = match stream {
                        _ if pty => "pty",
                        StreamKind::Stdout => "stdout",
                        StreamKind::Stderr => "stderr",
                    };
                    json!({"event": {"data": {key: data_b64}}})
                }
                ProcessEvent::Exited { process } => {
                    // Killed with its sandbox: E2B's stream breaks and the SDK
                    // raises its not-found error, not an exit code of 137.
                    let end = if c.client.sandbox_destroyed(&c.sandbox).await {
                        Err(ConnectError::new(
                            Code::NotFound,
                            format!("sandbox {} was killed while process {pid} ran", c.sandbox),
                        ))
                    } else {
                        Ok(end_event(&process))
                    };
                    let _ = tx.send(end).await;
                    return;
                }
            };
            if tx.send(Ok(msg)).await.is_err() {
                return;
            }
        }
    });
    stream_response(rx)
}

/// `process.Process/Start`: a strata background process, streamed.
async fn start(e: SharedE2b, c: Ctx, req: StartRequest, keepalive: Option<Duration>) -> Result<Response, ConnectError> {
    let pty = req.pty.as_ref().filter(|p| !p.is_null()).map(pty_size);
    let cfg =
        req.process.ok_or_else(|| ConnectError::new(Code::InvalidArgument, "process.StartRequest without process"))?;
    if cfg.cmd.is_empty() {
        return Err(ConnectError::new(Code::InvalidArgument, "process.cmd is empty"));
    }
    let mut cmd = vec![cfg.cmd.clone()];
    cmd.extend(cfg.args.iter().cloned());
    let cwd = c.path(cfg.cwd.as_deref().unwrap_or(""));
    let mut env = cfg.envs.clone();
    env.entry("HOME".into()).or_insert_with(|| c.home());
    env.entry("USER".into()).or_insert_with(|| c.user.clone());
    if pty.is_some() {
        // envd's terminal type.
        env.entry("TERM".into()).or_insert_with(|| "xterm-256color".into());
    }
    let native_req = ExecRequest {
        cmd,
        env,
        cwd: Some(cwd.clone()),
        user: Some(c.user.clone()),
        keep_stdin_open: req.stdin.unwrap_or(false),
        tty: pty,
        ..Default::default()
    };
    let info = c.client.start_process(&c.sandbox, &native_req).await.map_err(native)?;
    if let Some(err) = &info.spawn_error {
        return Err(ConnectError::new(Code::InvalidArgument, format!("cannot start {:?}: {err}", cfg.cmd)));
    }
    let config = json!({"cmd": cfg.cmd, "args": cfg.args, "envs": cfg.envs, "cwd": cwd});
    e.lock()
        .procs
        .insert((c.sandbox.clone(), info.id), ProcMeta { config, tag: req.tag, pty: pty.is_some(), owner: c.owner() });
    Ok(follow(c, info.id, pty.is_some(), keepalive))
}

/// `process.Process/Connect`: reattach to a process; its output is replayed
/// from the start of strata's buffer, then followed.
async fn reconnect(
    e: SharedE2b,
    c: Ctx,
    req: ProcessRequest,
    keepalive: Option<Duration>,
) -> Result<Response, ConnectError> {
    let pid = resolve(&e, &c, req.process)?;
    let p = c.client.get_process(&c.sandbox, pid).await.map_err(native)?;
    if p.status == ProcessStatus::Exited {
        return Err(ConnectError::new(Code::NotFound, format!("process with pid {pid} not found (it has exited)")));
    }
    let pty = c.own_proc(&e, pid).is_some_and(|m| m.pty);
    Ok(follow(c, pid, pty, keepalive))
}

/// `process.Process/List`: running processes.
async fn list(e: &SharedE2b, c: &Ctx) -> Result<Value, ConnectError> {
    let procs = c.client.list_processes(&c.sandbox).await.map_err(native)?;
    let owner = c.owner();
    let mut st = e.lock();
    // Forget what is no longer running (the map only serves tags and configs of live processes).
    let running: std::collections::HashSet<u64> =
        procs.iter().filter(|p| p.status == ProcessStatus::Running).map(|p| p.id).collect();
    st.procs.retain(|(sb, pid), _| sb != &c.sandbox || running.contains(pid));
    let out: Vec<Value> = procs
        .iter()
        .filter(|p| p.status == ProcessStatus::Running)
        .map(|p| {
            let meta = st.procs.get(&(c.sandbox.clone(), p.id)).filter(|m| m.owner == owner);
            let config = meta.map(|m| m.config.clone()).unwrap_or_else(|| {
                let cmd = p.cmd.first().cloned().unwrap_or_default();
                json!({"cmd": cmd, "args": p.cmd.iter().skip(1).collect::<Vec<_>>(), "envs": {}})
            });
            let mut v = json!({"config": config, "pid": p.id});
            if let Some(tag) = meta.and_then(|m| m.tag.clone()) {
                v["tag"] = json!(tag);
            }
            v
        })
        .collect();
    Ok(json!({"processes": out}))
}

async fn send_signal(e: &SharedE2b, c: &Ctx, req: ProcessRequest) -> Result<(), ConnectError> {
    let pid = resolve(e, c, req.process)?;
    let sig = match req.signal.as_ref() {
        Some(Value::String(s)) if s == "SIGNAL_SIGKILL" => "SIGKILL",
        Some(Value::String(s)) if s == "SIGNAL_SIGTERM" => "SIGTERM",
        Some(Value::Number(n)) if n.as_u64() == Some(9) => "SIGKILL",
        Some(Value::Number(n)) if n.as_u64() == Some(15) => "SIGTERM",
        other => {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                format!("unsupported signal {other:?} (SIGNAL_SIGKILL, SIGNAL_SIGTERM)"),
            ))
        }
    };
    // A process that has just started may not have its in-sandbox pid yet
    // (strata answers 409 `not running` for a moment): retry briefly.
    for _ in 0..50 {
        let p = c.client.get_process(&c.sandbox, pid).await.map_err(native)?;
        if p.status == ProcessStatus::Exited {
            return Err(ConnectError::new(Code::NotFound, format!("process with pid {pid} not found (it has exited)")));
        }
        match c.client.signal(&c.sandbox, pid, sig).await {
            Ok(_) => return Ok(()),
            Err(err) if err.code() == ErrorCode::InvalidState => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(err) => return Err(native(err)),
        }
    }
    Err(ConnectError::new(
        Code::Unavailable,
        format!("process {pid} could not be signalled: it stayed between start and running for 1 s"),
    ))
}

async fn send_input(
    e: &SharedE2b,
    c: &Ctx,
    sel: Option<Selector>,
    input: Option<ProcessInput>,
) -> Result<(), ConnectError> {
    let pid = resolve(e, c, sel)?;
    let input = input.unwrap_or_default();
    let data = input.stdin.or(input.pty).unwrap_or_default();
    base64::engine::general_purpose::STANDARD
        .decode(&data)
        .map_err(|err| ConnectError::new(Code::InvalidArgument, format!("stdin is not base64: {err}")))?;
    c.client.write_stdin(&c.sandbox, pid, &StdinRequest { data_b64: data, close: false }).await.map_err(native)
}

async fn close_stdin(e: &SharedE2b, c: &Ctx, req: ProcessRequest) -> Result<(), ConnectError> {
    let pid = resolve(e, c, req.process)?;
    c.client.write_stdin(&c.sandbox, pid, &StdinRequest { data_b64: String::new(), close: true }).await.map_err(native)
}

/// `process.Process/StreamInput` (client streaming): the request's messages in
/// order (a `start` naming the process, then `data`).
async fn stream_input(e: &SharedE2b, c: &Ctx, body: &[u8]) -> Result<(), ConnectError> {
    let frames = connect::decode_all(body)?;
    let mut pid = None;
    for (flags, payload) in frames {
        if flags & connect::FLAG_END_STREAM != 0 {
            break;
        }
        let m: StreamInputRequest = parse(&payload, "process.StreamInputRequest")?;
        if let Some(start) = m.start {
            pid = Some(resolve(e, c, start.process)?);
        } else if let Some(data) = m.data {
            let p = pid.ok_or_else(|| ConnectError::new(Code::InvalidArgument, "StreamInput data before start"))?;
            send_input(e, c, Some(Selector { pid: Some(p), tag: None }), data.input).await?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- filesystem.Filesystem

/// Requests of `filesystem.Filesystem` (one struct: every field optional).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct FsRequest {
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    source: Option<String>,
    #[serde(default)]
    destination: Option<String>,
    #[serde(default)]
    depth: Option<u32>,
    #[serde(default)]
    recursive: Option<bool>,
    #[serde(default)]
    watcher_id: Option<String>,
}

fn owner_name(id: u32) -> String {
    match id {
        0 => "root".into(),
        1000 => DEFAULT_USER.into(),
        n => n.to_string(),
    }
}

fn permissions(kind: FileKind, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match kind {
        FileKind::Dir => 'd',
        FileKind::Symlink => 'L',
        _ => '-',
    });
    for shift in [6u32, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

/// `filesystem.EntryInfo` in proto3 JSON (int64 as a string, enums by name).
fn entry_info(f: &FileStat) -> Value {
    let kind = match f.kind {
        FileKind::File => "FILE_TYPE_FILE",
        FileKind::Dir => "FILE_TYPE_DIRECTORY",
        FileKind::Symlink => "FILE_TYPE_SYMLINK",
        FileKind::Other => "FILE_TYPE_UNSPECIFIED",
    };
    let mtime = std::time::UNIX_EPOCH + Duration::from_secs(f.mtime.max(0) as u64);
    let mut v = json!({
        "name": f.name,
        "type": kind,
        "path": f.path,
        "size": f.size.to_string(),
        "mode": f.mode & 0o7777,
        "permissions": permissions(f.kind, f.mode),
        "owner": owner_name(f.uid),
        "group": owner_name(f.gid),
        "modifiedTime": humantime::format_rfc3339_seconds(mtime).to_string(),
        "isSymlink": f.kind == FileKind::Symlink,
    });
    if let Some(t) = &f.link_target {
        v["symlinkTarget"] = json!(t);
    }
    v
}

fn need<'a>(v: &'a Option<String>, what: &str) -> Result<&'a str, ConnectError> {
    v.as_deref().ok_or_else(|| ConnectError::new(Code::InvalidArgument, format!("{what} missing")))
}

async fn filesystem(
    State(e): State<SharedE2b>,
    who: Who,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (f, c) = match connect_call(&e, &who, &headers) {
        Ok(x) => x,
        Err(r) => return *r,
    };
    if method == "WatchDir" {
        if f != Framing::Stream {
            return error_response(
                f,
                ConnectError::new(
                    Code::InvalidArgument,
                    "filesystem.WatchDir is server streaming: use application/connect+json",
                ),
            );
        }
        return match stream_message(&body).and_then(|m| parse::<FsRequest>(&m, "filesystem.WatchDirRequest")) {
            Ok(req) => watch_dir(c, req).await.unwrap_or_else(|err| stream_error(&err)),
            Err(err) => stream_error(&err),
        };
    }
    if f != Framing::Unary {
        return error_response(
            f,
            ConnectError::new(Code::InvalidArgument, format!("filesystem.{method} is unary: use application/json")),
        );
    }
    let req: FsRequest = match parse(&body, &format!("filesystem.{method} request")) {
        Ok(r) => r,
        Err(err) => return error_response(f, err),
    };
    let res = match method.as_str() {
        "Stat" => fs_stat(&c, &req).await,
        "MakeDir" => fs_mkdir(&c, &req).await,
        "Move" => fs_move(&c, &req).await,
        "ListDir" => fs_list(&c, &req).await,
        "Remove" => fs_remove(&c, &req).await,
        "CreateWatcher" => create_watcher(&e, &c, &req).await,
        "GetWatcherEvents" => watcher_events(&e, &c, &req).await,
        "RemoveWatcher" => remove_watcher(&e, &c, &req),
        _ => Err(ConnectError::new(
            Code::Unimplemented,
            format!("filesystem.{method} is not a method of filesystem.Filesystem"),
        )),
    };
    match res {
        Ok(v) => unary_ok(v),
        Err(err) => error_response(f, err),
    }
}

async fn fs_stat(c: &Ctx, req: &FsRequest) -> Result<Value, ConnectError> {
    let path = c.path(need(&req.path, "path")?);
    let st = c.client.stat(&c.sandbox, &path).await.map_err(native)?;
    Ok(json!({"entry": entry_info(&st)}))
}

async fn fs_mkdir(c: &Ctx, req: &FsRequest) -> Result<Value, ConnectError> {
    let path = c.path(need(&req.path, "path")?);
    if let Ok(st) = c.client.stat(&c.sandbox, &path).await {
        let what = if st.kind == FileKind::Dir { "directory" } else { "file" };
        return Err(ConnectError::new(Code::AlreadyExists, format!("{what} {path} already exists")));
    }
    run_as(c, &["mkdir", "-p", "--", &path]).await?;
    let st = c.client.stat(&c.sandbox, &path).await.map_err(native)?;
    Ok(json!({"entry": entry_info(&st)}))
}

async fn fs_move(c: &Ctx, req: &FsRequest) -> Result<Value, ConnectError> {
    let from = c.path(need(&req.source, "source")?);
    let to = c.path(need(&req.destination, "destination")?);
    c.client.move_path(&c.sandbox, &from, &to).await.map_err(native)?;
    let st = c.client.stat(&c.sandbox, &to).await.map_err(native)?;
    Ok(json!({"entry": entry_info(&st)}))
}

/// `filesystem.Filesystem/Remove`: recursive; a path that does not exist is
/// already removed (envd's `os.RemoveAll`: no error).
async fn fs_remove(c: &Ctx, req: &FsRequest) -> Result<Value, ConnectError> {
    let path = c.path(need(&req.path, "path")?);
    match c.client.stat(&c.sandbox, &path).await {
        Err(e) if e.code() == strata_api::ErrorCode::FileNotFound => return Ok(json!({})),
        other => other.map_err(native)?,
    };
    c.client.remove_path(&c.sandbox, &path, true).await.map_err(native)?;
    Ok(json!({}))
}

/// Lists `path` down to `depth` levels (breadth first, at most [`MAX_WALK`] entries).
async fn walk(c: &Ctx, path: &str, depth: u32) -> Result<Vec<FileStat>, ConnectError> {
    let mut out = Vec::new();
    let mut level = vec![path.to_string()];
    for _ in 0..depth.max(1) {
        let mut next = Vec::new();
        for dir in level {
            let entries = c.client.list_dir(&c.sandbox, &dir).await.map_err(native)?;
            for en in entries {
                if en.kind == FileKind::Dir {
                    next.push(en.path.clone());
                }
                out.push(en);
                if out.len() >= MAX_WALK {
                    return Ok(out);
                }
            }
        }
        level = next;
    }
    Ok(out)
}

async fn fs_list(c: &Ctx, req: &FsRequest) -> Result<Value, ConnectError> {
    let path = c.path(need(&req.path, "path")?);
    let st = c.client.stat(&c.sandbox, &path).await.map_err(native)?;
    if st.kind != FileKind::Dir {
        return Err(ConnectError::new(Code::InvalidArgument, format!("path {path} is not a directory")));
    }
    let entries = walk(c, &path, req.depth.unwrap_or(1)).await?;
    Ok(json!({"entries": entries.iter().map(entry_info).collect::<Vec<_>>()}))
}

/// A snapshot of a watched tree: path -> (kind, size, mtime).
async fn snapshot(c: &Ctx, path: &str, recursive: bool) -> Result<HashMap<String, (FileKind, u64, i64)>, ConnectError> {
    let entries = walk(c, path, if recursive { 64 } else { 1 }).await?;
    Ok(entries.into_iter().map(|f| (f.path.clone(), (f.kind, f.size, f.mtime))).collect())
}

/// The `filesystem.FilesystemEvent`s between two snapshots (names relative to `root`).
fn diff(
    root: &str,
    old: &HashMap<String, (FileKind, u64, i64)>,
    new: &HashMap<String, (FileKind, u64, i64)>,
) -> Vec<Value> {
    let rel = |p: &str| p.strip_prefix(root).unwrap_or(p).trim_start_matches('/').to_string();
    let mut out = Vec::new();
    let mut created: Vec<&String> = new.keys().filter(|k| !old.contains_key(*k)).collect();
    created.sort();
    for p in created {
        out.push(json!({"name": rel(p), "type": "EVENT_TYPE_CREATE"}));
        if new[p].0 == FileKind::File && new[p].1 > 0 {
            out.push(json!({"name": rel(p), "type": "EVENT_TYPE_WRITE"}));
        }
    }
    let mut changed: Vec<&String> = new
        .keys()
        .filter(|k| old.get(*k).is_some_and(|o| o.0 == FileKind::File && (o.1, o.2) != (new[*k].1, new[*k].2)))
        .collect();
    changed.sort();
    for p in changed {
        out.push(json!({"name": rel(p), "type": "EVENT_TYPE_WRITE"}));
    }
    let mut removed: Vec<&String> = old.keys().filter(|k| !new.contains_key(*k)).collect();
    removed.sort();
    for p in removed {
        out.push(json!({"name": rel(p), "type": "EVENT_TYPE_REMOVE"}));
    }
    out
}

async fn create_watcher(e: &SharedE2b, c: &Ctx, req: &FsRequest) -> Result<Value, ConnectError> {
    let path = c.path(need(&req.path, "path")?);
    let st = c.client.stat(&c.sandbox, &path).await.map_err(native)?;
    if st.kind != FileKind::Dir {
        return Err(ConnectError::new(Code::InvalidArgument, format!("path {path} is not a directory")));
    }
    let recursive = req.recursive.unwrap_or(false);
    let seen = snapshot(c, &path, recursive).await?;
    let id = format!("w{:016x}", rand::random::<u64>());
    e.lock()
        .watchers
        .insert(id.clone(), Watcher { sandbox: c.sandbox.clone(), token: c.token.clone(), path, recursive, seen });
    Ok(json!({"watcherId": id}))
}

/// The watcher `id` if the caller made it (same key, same sandbox); anyone
/// else gets the answer of an unknown id.
fn own_watcher(e: &SharedE2b, c: &Ctx, id: &str) -> Result<Watcher, ConnectError> {
    e.lock()
        .watchers
        .get(id)
        .filter(|w| w.token == c.token && w.sandbox == c.sandbox)
        .cloned()
        .ok_or_else(|| ConnectError::new(Code::NotFound, format!("watcher {id} not found")))
}

async fn watcher_events(e: &SharedE2b, c: &Ctx, req: &FsRequest) -> Result<Value, ConnectError> {
    let id = need(&req.watcher_id, "watcherId")?.to_string();
    let w = own_watcher(e, c, &id)?;
    let now = snapshot(c, &w.path, w.recursive).await?;
    let events = diff(&w.path, &w.seen, &now);
    if let Some(w) = e.lock().watchers.get_mut(&id) {
        w.seen = now;
    }
    Ok(json!({"events": events}))
}

fn remove_watcher(e: &SharedE2b, c: &Ctx, req: &FsRequest) -> Result<Value, ConnectError> {
    let id = need(&req.watcher_id, "watcherId")?;
    own_watcher(e, c, id)?;
    e.lock().watchers.remove(id);
    Ok(json!({}))
}

/// `filesystem.Filesystem/WatchDir`: a polling watch, streamed.
async fn watch_dir(c: Ctx, req: FsRequest) -> Result<Response, ConnectError> {
    let path = c.path(need(&req.path, "path")?);
    let st = c.client.stat(&c.sandbox, &path).await.map_err(native)?;
    if st.kind != FileKind::Dir {
        return Err(ConnectError::new(Code::InvalidArgument, format!("path {path} is not a directory")));
    }
    let recursive = req.recursive.unwrap_or(false);
    let mut seen = snapshot(&c, &path, recursive).await?;
    let (tx, rx) = mpsc::channel::<Result<Value, ConnectError>>(64);
    tokio::spawn(async move {
        if tx.send(Ok(json!({"start": {}}))).await.is_err() {
            return;
        }
        loop {
            tokio::select! {
                _ = tokio::time::sleep(WATCH_POLL) => {}
                _ = tx.closed() => return,
            }
            let now = match snapshot(&c, &path, recursive).await {
                Ok(n) => n,
                Err(err) => {
                    let _ = tx.send(Err(err)).await;
                    return;
                }
            };
            for ev in diff(&path, &seen, &now) {
                if tx.send(Ok(json!({"filesystem": ev}))).await.is_err() {
                    return;
                }
            }
            seen = now;
        }
    });
    Ok(stream_response(rx))
}

// ---------------------------------------------------------------- /files

/// Query of `/files`.
#[derive(Debug, Deserialize)]
struct FilesQuery {
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    username: Option<String>,
}

/// An envd HTTP error (`{"code": status, "message"}`).
fn http_error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({"code": status.as_u16(), "message": message.into()}))).into_response()
}

fn http_native(e: EngineError) -> Response {
    if e.body.code == ErrorCode::TooLarge {
        return http_error(StatusCode::PAYLOAD_TOO_LARGE, e.body.message);
    }
    let err = native(e);
    http_error(err.code.http_status(), err.message)
}

/// `GET /files?path=&username=`: the file's bytes.
async fn download(State(e): State<SharedE2b>, who: Who, headers: HeaderMap, Query(q): Query<FilesQuery>) -> Response {
    let c = match ctx(&e, &who, &headers, q.username.as_deref()) {
        Ok(c) => c,
        Err(err) => return http_error(err.code.http_status(), err.message),
    };
    let Some(p) = q.path.as_deref() else { return http_error(StatusCode::BAD_REQUEST, "path query parameter missing") };
    let path = c.path(p);
    match c.client.stat(&c.sandbox, &path).await {
        Ok(st) if st.kind == FileKind::Dir => {
            return http_error(StatusCode::BAD_REQUEST, format!("path {path} is a directory"))
        }
        Ok(_) => {}
        Err(err) => return http_native(err),
    }
    // Streamed through: the bytes are passed on as the native download sends them.
    // The sandbox is in use until the last byte is taken (the stream holds it).
    match c.client.download(&c.sandbox, strata_api::DownloadQuery { path: path.clone(), tar: false }).await {
        Ok(data) => {
            let len = data.len;
            let mut resp = Response::new(Body::from_stream(data.stream));
            resp.headers_mut()
                .insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/octet-stream"));
            if let Some(len) = len {
                resp.headers_mut().insert(header::CONTENT_LENGTH, len.into());
            }
            resp
        }
        Err(err) => http_native(err),
    }
}

/// Why an upload's body could not be passed on.
enum BodyError {
    /// More than [`MAX_UPLOAD`] bytes.
    TooLarge,
    /// A malformed or broken body.
    Malformed(String),
}

impl BodyError {
    fn response(self) -> Response {
        match self {
            BodyError::TooLarge => http_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("upload larger than {MAX_UPLOAD} bytes, the most one /files upload may be; nothing was kept"),
            ),
            BodyError::Malformed(m) => http_error(StatusCode::BAD_REQUEST, m),
        }
    }
}

/// Uploads one file of the caller's: its parent is made (as the caller's
/// user) when missing, the bytes `pieces` yields are streamed into a native
/// upload, and a new file is given to the caller's user. `total` counts the
/// bytes of the whole request against [`MAX_UPLOAD`].
async fn upload_one<F>(c: &Ctx, path: &str, total: &mut u64, mut pieces: F) -> Result<Value, Response>
where
    F: AsyncPieces,
{
    if let Some((parent, _)) = path.rsplit_once('/').filter(|(d, _)| !d.is_empty()) {
        if c.client.stat(&c.sandbox, parent).await.is_err() {
            run_as(c, &["mkdir", "-p", "--", parent])
                .await
                .map_err(|err| http_error(err.code.http_status(), err.message))?;
        }
    }
    let existed = c.client.stat(&c.sandbox, path).await.is_ok();
    let (tx, rx) = mpsc::channel::<std::io::Result<Bytes>>(strata_engine::transfer::DEPTH);
    let chunks = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) });
    let q = strata_api::UploadQuery { path: path.to_string(), mode: None, tar: false };
    let upload = c.client.upload(&c.sandbox, q, None, chunks);
    let feed = async {
        let tx = tx;
        loop {
            match pieces.next_piece().await {
                Ok(Some(b)) => {
                    *total += b.len() as u64;
                    if *total > MAX_UPLOAD {
                        let _ = tx.send(Err(std::io::Error::other("over the upload limit"))).await;
                        pieces.linger().await;
                        return Err(BodyError::TooLarge);
                    }
                    if tx.send(Ok(b)).await.is_err() {
                        // The native upload stopped reading: its answer says why.
                        return Ok(());
                    }
                }
                Ok(None) => return Ok(()),
                Err(m) => {
                    let _ = tx.send(Err(std::io::Error::other(m.clone()))).await;
                    return Err(BodyError::Malformed(m));
                }
            }
        }
    };
    let (uploaded, fed) = tokio::join!(upload, feed);
    fed.map_err(BodyError::response)?;
    uploaded.map_err(http_native)?;
    if !existed {
        chown_to_user(c, path).await.map_err(|err| http_error(err.code.http_status(), err.message))?;
    }
    let name = path.rsplit('/').next().unwrap_or("").to_string();
    Ok(json!({"name": name, "type": "file", "path": path}))
}

/// A source of upload pieces (a whole body, or one multipart part).
trait AsyncPieces {
    /// The next piece, `None` at the end.
    async fn next_piece(&mut self) -> Result<Option<Bytes>, String>;
    /// Reads and drops the rest of the request for a little while (it is refused).
    async fn linger(&mut self);
}

/// A whole request body.
struct BodyPieces(axum::body::BodyDataStream);

impl AsyncPieces for BodyPieces {
    async fn next_piece(&mut self) -> Result<Option<Bytes>, String> {
        use futures_util::StreamExt;
        self.0.next().await.transpose().map_err(|e| format!("reading the upload: {e}"))
    }

    async fn linger(&mut self) {
        strata_engine::transfer::linger(&mut self.0).await;
    }
}

/// The current part of a multipart body.
struct PartPieces<'a>(&'a mut Multipart<axum::body::BodyDataStream>);

impl AsyncPieces for PartPieces<'_> {
    async fn next_piece(&mut self) -> Result<Option<Bytes>, String> {
        self.0.next_data().await.map_err(|m| format!("malformed multipart body: {m}"))
    }

    async fn linger(&mut self) {
        self.0.linger().await;
    }
}

/// `POST /files?path=&username=`: upload (octet-stream, or multipart with one
/// or more `file` parts named by their file name); the `WriteInfo` list. The
/// body is streamed into the sandbox as it arrives: a part is written while
/// it is read (into a temp file renamed into place once complete).
async fn upload(
    State(e): State<SharedE2b>,
    who: Who,
    headers: HeaderMap,
    Query(q): Query<FilesQuery>,
    body: Body,
) -> Response {
    let c = match ctx(&e, &who, &headers, q.username.as_deref()) {
        Ok(c) => c,
        Err(err) => return http_error(err.code.http_status(), err.message),
    };
    if headers.get(header::CONTENT_ENCODING).is_some_and(|v| v.as_bytes() != b"identity") {
        return http_error(
            StatusCode::NOT_IMPLEMENTED,
            "compressed uploads (Content-Encoding) are not supported by strata's envd: upload without gzip",
        );
    }
    if crate::native::transfer::announced_over(&headers, MAX_UPLOAD) {
        return BodyError::TooLarge.response();
    }
    let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let mut total = 0u64;
    let mut infos = Vec::new();
    if ct.to_ascii_lowercase().starts_with("multipart/form-data") {
        let mut mp = match Multipart::new(&ct, body.into_data_stream()) {
            Ok(m) => m,
            Err(msg) => return http_error(StatusCode::BAD_REQUEST, format!("malformed multipart body: {msg}")),
        };
        // The first part goes to `path` when the query names one (a single-file
        // write); every other part to its own file name.
        let mut first = true;
        loop {
            let name = match mp.next_part().await {
                Ok(Some(n)) => n,
                Ok(None) => break,
                Err(msg) => return http_error(StatusCode::BAD_REQUEST, format!("malformed multipart body: {msg}")),
            };
            let p = match (first, q.path.as_deref(), name) {
                (true, Some(p), _) => p.to_string(),
                (_, _, Some(n)) if !n.is_empty() => n,
                _ => {
                    return http_error(
                        StatusCode::BAD_REQUEST,
                        "multipart part without a file name and no path query parameter",
                    )
                }
            };
            first = false;
            let path = c.path(&p);
            match upload_one(&c, &path, &mut total, PartPieces(&mut mp)).await {
                Ok(info) => infos.push(info),
                Err(resp) => return resp,
            }
        }
    } else {
        let Some(p) = q.path.as_deref() else {
            return http_error(StatusCode::BAD_REQUEST, "path query parameter missing");
        };
        let path = c.path(p);
        match upload_one(&c, &path, &mut total, BodyPieces(body.into_data_stream())).await {
            Ok(info) => infos.push(info),
            Err(resp) => return resp,
        }
    }
    Json(infos).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_to_the_users_home() {
        assert_eq!(path_of(DEFAULT_USER, "a.txt"), "/home/user/a.txt");
        assert_eq!(path_of(DEFAULT_USER, "~/b"), "/home/user/b");
        assert_eq!(path_of(DEFAULT_USER, "/etc/x"), "/etc/x");
        assert_eq!(path_of("root", ""), "/root");
        assert_eq!(permissions(FileKind::Dir, 0o755), "drwxr-xr-x");
    }

    #[test]
    fn stream_messages_from_garbage_are_errors() {
        assert!(stream_message(b"\x00\x00").is_err());
        assert!(stream_message(&connect::end_stream(None)).is_err());
        let m = connect::envelope(0, b"{\"process\":{\"cmd\":\"ls\"}}");
        let req: StartRequest = parse(&stream_message(&m).unwrap(), "x").unwrap();
        assert_eq!(req.process.unwrap().cmd, "ls");
        assert!(parse::<StartRequest>(b"\xff\xfe", "x").is_err());
    }
}
