//! envd, the in-sandbox API of E2B, served by the daemon for the sandbox named
//! in `E2b-Sandbox-Id`: the Connect services `process.Process` and
//! `filesystem.Filesystem` (JSON codec, as the SDK uses it) and the HTTP routes
//! `/files` and `/health`. Messages follow envd's `process/process.proto` and
//! `filesystem/filesystem.proto` (field names in proto3 JSON form, taken from
//! the descriptors shipped in the `e2b` package); every call is a strata
//! process or file call made with the caller's token.

use std::collections::BTreeMap;
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
use std::sync::Arc;
use strata_api::{
    ErrorCode, ExecRequest, FileKind, FileStat, FsEvent, FsOp, ProcessEvent, ProcessInfo, ProcessStatus, StdinRequest,
    StreamKind, TtySize,
};
use strata_engine::error::{EngineError, ErrorKind};
use tokio::sync::mpsc;
use tracing::debug;

use super::audit::Who;
use super::connect::{self, Code, ConnectError};
use super::multipart::Multipart;
use super::{request_token, SharedE2b};
use strata_engine::Engine;

mod files;
mod filesystem;
mod gzip;
mod process;

/// Largest `/files` upload (all its parts together), counted while it streams.
const MAX_UPLOAD: u64 = 512 * 1024 * 1024;
/// Default user of commands and files (E2B's base image convention).
pub const DEFAULT_USER: &str = "user";
/// Where E2B keeps a file's metadata: its extended attributes under this prefix.
const METADATA_XATTR: &str = "user.e2b.";
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

pub use filesystem::Watcher;

/// The envd routes (reached through [`super::dispatch`]).
pub fn router(e2b: SharedE2b) -> Router {
    Router::new()
        .route("/health", get(|| async { StatusCode::NO_CONTENT }))
        .route("/files", get(files::download).post(files::upload))
        .route("/process.Process/{method}", post(process::service))
        .route("/filesystem.Filesystem/{method}", post(filesystem::service))
        .fallback(|uri: axum::http::Uri| async move {
            (StatusCode::NOT_FOUND, Json(json!({"code": 404, "message": format!("envd has no route {}", uri.path())})))
        })
        .with_state(e2b)
}

/// Who is calling which sandbox.
#[derive(Clone)]
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
        .envd_native(who, headers, "access token: send X-Access-Token (the envdAccessToken of the sandbox)")
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

/// The deadline of a Connect call: its `Connect-Timeout-Ms` header, read as
/// connect-go reads it (at most 10 digits; absent: none). envd holds every
/// call to it: a unary call still running then ends with `deadline_exceeded`,
/// a stream ends with it, and a command started by `Start` is killed.
fn call_timeout(headers: &HeaderMap) -> Result<Option<Duration>, ConnectError> {
    let Some(v) = headers.get("connect-timeout-ms") else { return Ok(None) };
    let v = v.to_str().unwrap_or("").trim();
    if v.len() > 10 {
        return Err(ConnectError::new(Code::InvalidArgument, format!("parse timeout: {v:?} has >10 digits")));
    }
    let ms: u64 =
        v.parse().map_err(|e| ConnectError::new(Code::InvalidArgument, format!("parse timeout: {v:?}: {e}")))?;
    Ok((ms > 0).then(|| Duration::from_millis(ms)))
}

/// The client's `Keepalive-Ping-Interval` (seconds) for a stream.
fn keepalive_of(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map(Duration::from_secs)
}

/// The error of a call whose deadline passed.
fn deadline_exceeded(limit: Duration) -> ConnectError {
    ConnectError::new(
        Code::DeadlineExceeded,
        format!("the call's deadline passed (Connect-Timeout-Ms: {})", limit.as_millis()),
    )
}

/// Runs a unary call within its deadline, if it has one.
async fn within<T>(
    limit: Option<Duration>,
    call: impl std::future::Future<Output = Result<T, ConnectError>>,
) -> Result<T, ConnectError> {
    match limit {
        None => call.await,
        Some(d) => tokio::time::timeout(d, call).await.unwrap_or_else(|_| Err(deadline_exceeded(d))),
    }
}

/// Sleeps until `deadline`, or forever without one.
async fn until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// The framing, the caller and the deadline of a Connect call (or the error response).
fn connect_call(
    e: &SharedE2b,
    who: &Who,
    headers: &HeaderMap,
) -> Result<(Framing, Ctx, Option<Duration>), Box<Response>> {
    let f = framing(headers).map_err(|err| Box::new(error_response(Framing::Unary, err)))?;
    let c = ctx(e, who, headers, None).map_err(|err| Box::new(error_response(f, err)))?;
    let limit = call_timeout(headers).map_err(|err| Box::new(error_response(f, err)))?;
    Ok((f, c, limit))
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
        assert_eq!(filesystem::permissions(FileKind::Dir, 0o755), "drwxr-xr-x");
    }

    #[test]
    fn stream_messages_from_garbage_are_errors() {
        assert!(stream_message(b"\x00\x00").is_err());
        assert!(stream_message(&connect::end_stream(None)).is_err());
    }
}
