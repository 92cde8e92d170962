//! Typed async client for the strata daemon, over its Unix socket or TCP.
//!
//! One HTTP/1.1 connection per request (a Unix-socket connect costs
//! microseconds); streaming endpoints return an [`NdjsonStream`].

use std::path::PathBuf;

use bytes::{Bytes, BytesMut};
use futures_util::Stream;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;
use strata_api::*;

pub use bytes::Bytes as Body;
pub use hyper::Method;

/// Largest error body read from the daemon (its JSON errors are a few hundred bytes).
const MAX_ERROR_BODY: usize = 1 << 20;

/// A request body: whole bytes or a stream of chunks.
pub type RequestBody = UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// A request body streamed from `chunks` (uploads that never sit whole in memory).
pub fn stream_body<S>(chunks: S) -> RequestBody
where
    S: Stream<Item = std::io::Result<Bytes>> + Send + 'static,
{
    let frames = futures_util::StreamExt::map(chunks, |c| {
        c.map(Frame::data).map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)
    });
    BodyExt::boxed_unsync(StreamBody::new(frames))
}

fn full_body(bytes: Bytes) -> RequestBody {
    BodyExt::boxed_unsync(Full::new(bytes).map_err(|never| match never {}))
}

/// Errors of the client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The daemon could not be reached.
    #[error("cannot connect to the strata daemon at {endpoint} (is `strata daemon` running?)")]
    Connect {
        /// Where we tried.
        endpoint: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// HTTP protocol failure.
    #[error("HTTP exchange with the daemon failed")]
    Http(#[from] hyper::Error),
    /// The daemon answered with an error.
    #[error("{} ({}, HTTP {status})", body.message, body.code)]
    Api {
        /// HTTP status.
        status: u16,
        /// The error body.
        body: ApiErrorBody,
    },
    /// The response did not decode.
    #[error("unexpected response from the daemon: {0}")]
    Decode(String),
}

impl ClientError {
    /// The API error code, when the daemon answered with one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Api { body, .. } => Some(body.code),
            _ => None,
        }
    }
}

/// Where the daemon listens.
#[derive(Debug, Clone)]
pub enum Endpoint {
    /// A Unix socket path.
    Unix(PathBuf),
    /// `host:port` with an optional bearer token.
    Tcp {
        /// Address.
        addr: String,
        /// Bearer token.
        token: Option<String>,
    },
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
            Endpoint::Tcp { addr, .. } => write!(f, "tcp:{addr}"),
        }
    }
}

/// The client.
#[derive(Debug, Clone)]
pub struct Client {
    endpoint: Endpoint,
    tenant: Option<String>,
    approval: Option<String>,
}

type Result<T, E = ClientError> = std::result::Result<T, E>;

/// The daemon's error answer `resp` as a [`ClientError::Api`].
async fn api_error(resp: Response<Incoming>) -> ClientError {
    let status = resp.status().as_u16();
    let bytes = match Limited::new(resp.into_body(), MAX_ERROR_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => match e.downcast::<hyper::Error>() {
            Ok(h) => return ClientError::Http(*h),
            Err(other) => Bytes::from(format!("HTTP {status} with an error body that could not be read: {other}")),
        },
    };
    let body = serde_json::from_slice::<ApiErrorBody>(&bytes).unwrap_or_else(|_| ApiErrorBody {
        code: ErrorCode::Internal,
        message: String::from_utf8_lossy(&bytes).into_owned(),
        current_state: None,
        dependents: vec![],
        findings: vec![],
        approval: None,
        conflicts: Vec::new(),
    });
    ClientError::Api { status, body }
}

/// A process's terminal as a WebSocket ([`Client::attach_tty`]): binary
/// messages are its bytes, text messages [`TtyMessage`] JSON.
pub type TtySocket = tokio_tungstenite::WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

/// Percent-encodes a query value.
pub fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// A stream of NDJSON values from a response body.
pub struct NdjsonStream<T> {
    headers: hyper::HeaderMap,
    body: Incoming,
    buf: BytesMut,
    done: bool,
    _t: std::marker::PhantomData<T>,
}

impl<T> NdjsonStream<T> {
    /// A response header (e.g. `strata-resumed-from` when the call resumed the sandbox).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

impl<T: DeserializeOwned> NdjsonStream<T> {
    /// The next value, or `None` at the end of the stream.
    pub async fn next(&mut self) -> Result<Option<T>> {
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let line = self.buf.split_to(pos + 1);
                let line = &line[..line.len() - 1];
                if line.is_empty() {
                    continue;
                }
                return serde_json::from_slice(line).map(Some).map_err(|e| ClientError::Decode(e.to_string()));
            }
            if self.done {
                return Ok(None);
            }
            match self.body.frame().await {
                Some(frame) => {
                    if let Ok(data) = frame?.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
                None => self.done = true,
            }
        }
    }
}

/// A response body read chunk by chunk (file downloads, exports): at most one
/// HTTP frame is held at a time, so a large transfer never sits whole in memory.
pub struct ByteStream {
    headers: hyper::HeaderMap,
    body: Incoming,
}

impl ByteStream {
    /// A response header.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The announced length of the body, when the daemon sent one.
    pub fn content_length(&self) -> Option<u64> {
        self.header("content-length").and_then(|v| v.parse().ok())
    }

    /// The next chunk of the body, or `None` at its end. A transfer the daemon
    /// had to cut short (the file vanished, a read failed) is an error here,
    /// never a silently shorter body.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>> {
        loop {
            match self.body.frame().await {
                None => return Ok(None),
                Some(frame) => {
                    if let Ok(data) = frame?.into_data() {
                        if !data.is_empty() {
                            return Ok(Some(data));
                        }
                    }
                }
            }
        }
    }

    /// The body as a stream of chunks.
    pub fn into_stream(self) -> impl Stream<Item = Result<Bytes>> + Send + 'static {
        futures_util::stream::unfold(self, |mut s| async move {
            match s.chunk().await {
                Ok(Some(b)) => Some((Ok(b), s)),
                Ok(None) => None,
                Err(e) => Some((Err(e), s)),
            }
        })
    }

    /// Reads the whole body into memory (for bodies known to be small).
    pub async fn collect(mut self) -> Result<Bytes> {
        let mut buf = BytesMut::new();
        while let Some(c) = self.chunk().await? {
            buf.extend_from_slice(&c);
        }
        Ok(buf.freeze())
    }
}

impl Client {
    /// A client for `endpoint`.
    pub fn new(endpoint: Endpoint) -> Self {
        Client { endpoint, tenant: None, approval: None }
    }

    /// Sends an approved approval's id (the `X-Strata-Approval` header) with
    /// every request: a request refused with `approval_required` goes through
    /// when repeated with it (once, see docs/security.md "Rule of Two").
    pub fn with_approval(mut self, approval: Option<String>) -> Self {
        self.approval = approval;
        self
    }

    /// Acts as one tenant (the `X-Strata-Tenant` header): the operator then
    /// creates in and sees only that tenant; a tenant token may name only its own.
    pub fn with_tenant(mut self, tenant: Option<String>) -> Self {
        self.tenant = tenant;
        self
    }

    /// A client for a Unix socket.
    pub fn unix(path: impl Into<PathBuf>) -> Self {
        Client::new(Endpoint::Unix(path.into()))
    }

    /// Sends one request and returns the raw response (errors decoded into [`ClientError::Api`]).
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Bytes,
        content_type: &str,
    ) -> Result<Response<Incoming>> {
        self.send_body(method, path, full_body(body), content_type).await
    }

    /// [`Client::send`] with any request body (e.g. a [`stream_body`]).
    pub async fn send_body(
        &self,
        method: Method,
        path: &str,
        body: RequestBody,
        content_type: &str,
    ) -> Result<Response<Incoming>> {
        let req = self.request(method, path).header(hyper::header::CONTENT_TYPE, content_type);
        let resp = self.connect(false).await?.send_request(req.body(body).expect("valid request")).await?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        Err(api_error(resp).await)
    }

    /// A request to `path` with the headers every request carries (host,
    /// tenant, approval, bearer token).
    fn request(&self, method: Method, path: &str) -> hyper::http::request::Builder {
        let mut req = Request::builder().method(method).uri(path).header(hyper::header::HOST, "strata");
        if let Some(t) = &self.tenant {
            req = req.header(strata_api::TENANT_HEADER, t.as_str());
        }
        if let Some(a) = &self.approval {
            req = req.header(strata_api::APPROVAL_HEADER, a.as_str());
        }
        if let Endpoint::Tcp { token: Some(t), .. } = &self.endpoint {
            req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        req
    }

    /// One new HTTP/1.1 connection to the daemon (`upgrades`: it may turn into a WebSocket).
    async fn connect(&self, upgrades: bool) -> Result<hyper::client::conn::http1::SendRequest<RequestBody>> {
        async fn over<T>(io: T, upgrades: bool) -> Result<hyper::client::conn::http1::SendRequest<RequestBody>>
        where
            T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
        {
            let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
            if upgrades {
                tokio::spawn(conn.with_upgrades());
            } else {
                tokio::spawn(conn);
            }
            Ok(sender)
        }
        let connect_err = |source| ClientError::Connect { endpoint: self.endpoint.to_string(), source };
        match &self.endpoint {
            Endpoint::Unix(p) => over(tokio::net::UnixStream::connect(p).await.map_err(connect_err)?, upgrades).await,
            Endpoint::Tcp { addr, .. } => {
                let stream = tokio::net::TcpStream::connect(addr.as_str()).await.map_err(connect_err)?;
                // Small request writes and streamed lines must not wait for Nagle's algorithm.
                let _ = stream.set_nodelay(true);
                over(stream, upgrades).await
            }
        }
    }

    async fn call<B: Serialize, T: DeserializeOwned>(&self, method: Method, path: &str, body: Option<&B>) -> Result<T> {
        let bytes = body.map(|b| Bytes::from(serde_json::to_vec(b).expect("request serializes"))).unwrap_or_default();
        let resp = self.send(method, path, bytes, "application/json").await?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await?.to_bytes();
        let bytes =
            if status == StatusCode::NO_CONTENT || bytes.is_empty() { Bytes::from_static(b"null") } else { bytes };
        serde_json::from_slice(&bytes)
            .map_err(|e| ClientError::Decode(format!("{e} in {}", String::from_utf8_lossy(&bytes))))
    }

    async fn stream<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<NdjsonStream<T>> {
        let bytes = body.map(|b| Bytes::from(serde_json::to_vec(b).expect("request serializes"))).unwrap_or_default();
        let resp = self.send(method, path, bytes, "application/json").await?;
        let headers = resp.headers().clone();
        Ok(NdjsonStream {
            headers,
            body: resp.into_body(),
            buf: BytesMut::new(),
            done: false,
            _t: std::marker::PhantomData,
        })
    }

    async fn raw(&self, method: Method, path: &str, body: Bytes) -> Result<Bytes> {
        let resp = self.send(method, path, body, "application/octet-stream").await?;
        Ok(resp.into_body().collect().await?.to_bytes())
    }

    async fn bytes_stream(&self, method: Method, path: &str) -> Result<ByteStream> {
        let resp = self.send(method, path, Bytes::new(), "application/octet-stream").await?;
        let headers = resp.headers().clone();
        Ok(ByteStream { headers, body: resp.into_body() })
    }

    // ---- host ----

    /// Daemon info.
    pub async fn info(&self) -> Result<DaemonInfo> {
        self.call::<(), _>(Method::GET, "/v1/info", None).await
    }

    /// The warm pools (operator only).
    pub async fn warm_pools(&self) -> Result<Vec<strata_api::WarmPoolStatus>> {
        self.call::<(), _>(Method::GET, "/v1/warm-pool", None).await
    }

    /// Host capabilities.
    pub async fn doctor(&self) -> Result<DoctorReport> {
        self.call::<(), _>(Method::GET, "/v1/doctor", None).await
    }

    /// The OpenAPI document.
    pub async fn openapi(&self) -> Result<serde_json::Value> {
        self.call::<(), _>(Method::GET, "/openapi.json", None).await
    }

    // ---- images ----

    /// Imports an image, waiting for the result.
    pub async fn import_image(&self, req: &ImportImageRequest) -> Result<ImportReport> {
        self.call(Method::POST, "/v1/images/import", Some(req)).await
    }

    /// Imports an image, streaming progress.
    pub async fn import_image_stream(&self, req: &ImportImageRequest) -> Result<NdjsonStream<ImportEvent>> {
        self.stream(Method::POST, "/v1/images/import?stream=true", Some(req)).await
    }

    /// Pulls an image from a registry, waiting for the result.
    pub async fn pull_image(&self, req: &PullImageRequest) -> Result<ImportReport> {
        self.call(Method::POST, "/v1/images/pull", Some(req)).await
    }

    /// Pulls an image from a registry, streaming progress.
    pub async fn pull_image_stream(&self, req: &PullImageRequest) -> Result<NdjsonStream<ImportEvent>> {
        self.stream(Method::POST, "/v1/images/pull?stream=true", Some(req)).await
    }

    /// Lists images.
    pub async fn list_images(&self) -> Result<Vec<Image>> {
        self.call::<(), _>(Method::GET, "/v1/images", None).await
    }

    /// Inspects an image.
    pub async fn get_image(&self, name: &str) -> Result<Image> {
        self.call::<(), _>(Method::GET, &format!("/v1/images/{}", enc(name)), None).await
    }

    /// Removes an image: by name, every version; by id, that version.
    pub async fn remove_image(&self, name: &str) -> Result<()> {
        self.call::<(), ()>(Method::DELETE, &format!("/v1/images/{}", enc(name)), None).await
    }

    /// Every version of an image's name, newest first.
    pub async fn image_versions(&self, name: &str) -> Result<Vec<Image>> {
        self.call::<(), _>(Method::GET, &format!("/v1/images/{}/versions", enc(name)), None).await
    }

    /// Sandboxes, checkpoints and templates on an image version that is no longer its name's newest.
    pub async fn outdated(&self) -> Result<Vec<strata_api::OutdatedEntry>> {
        self.call::<(), _>(Method::GET, "/v1/outdated", None).await
    }

    /// Moves a stopped or standby sandbox onto another image version.
    pub async fn rebase(&self, id: &str, req: &strata_api::RebaseRequest) -> Result<strata_api::RebaseReport> {
        self.call(Method::POST, &format!("/v1/sandboxes/{}/rebase", enc(id)), Some(req)).await
    }

    // ---- sandboxes ----

    /// Creates and starts a sandbox.
    pub async fn create_sandbox(&self, req: &CreateSandboxRequest) -> Result<CreatedSandbox> {
        self.call(Method::POST, "/v1/sandboxes", Some(req)).await
    }

    /// Lists sandboxes.
    pub async fn list_sandboxes(&self) -> Result<Vec<Sandbox>> {
        self.call::<(), _>(Method::GET, "/v1/sandboxes", None).await
    }

    /// Inspects a sandbox.
    pub async fn get_sandbox(&self, id: &str) -> Result<Sandbox> {
        self.call::<(), _>(Method::GET, &format!("/v1/sandboxes/{}", enc(id)), None).await
    }

    /// Stops a sandbox.
    pub async fn stop_sandbox(&self, id: &str) -> Result<SandboxEvent> {
        self.call::<(), _>(Method::POST, &format!("/v1/sandboxes/{}/stop", enc(id)), None).await
    }

    /// Freezes a sandbox's processes.
    pub async fn pause_sandbox(&self, id: &str) -> Result<SandboxEvent> {
        self.call::<(), _>(Method::POST, &format!("/v1/sandboxes/{}/pause", enc(id)), None).await
    }

    /// Thaws a paused sandbox.
    pub async fn unpause_sandbox(&self, id: &str) -> Result<SandboxEvent> {
        self.call::<(), _>(Method::POST, &format!("/v1/sandboxes/{}/unpause", enc(id)), None).await
    }

    /// Puts a sandbox into standby (`fs_only`: keep only its filesystem).
    pub async fn standby_sandbox(&self, id: &str, fs_only: bool) -> Result<SandboxEvent> {
        self.call(
            Method::POST,
            &format!("/v1/sandboxes/{}/standby", enc(id)),
            Some(&strata_api::StandbyRequest { fs_only }),
        )
        .await
    }

    /// Resumes a sandbox from standby (or thaws / starts it).
    pub async fn resume_sandbox(&self, id: &str) -> Result<strata_api::ResumeResult> {
        self.call::<(), _>(Method::POST, &format!("/v1/sandboxes/{}/resume", enc(id)), None).await
    }

    /// Resumes with options (`fs_only`: from standby, start afresh from the filesystem).
    pub async fn resume_sandbox_with(
        &self,
        id: &str,
        req: &strata_api::ResumeRequest,
    ) -> Result<strata_api::ResumeResult> {
        self.call(Method::POST, &format!("/v1/sandboxes/{}/resume", enc(id)), Some(req)).await
    }

    /// Archives a stopped or standby sandbox.
    pub async fn archive_sandbox(&self, id: &str) -> Result<SandboxEvent> {
        self.call::<(), _>(Method::POST, &format!("/v1/sandboxes/{}/archive", enc(id)), None).await
    }

    /// Starts a stopped sandbox.
    pub async fn start_sandbox(&self, id: &str) -> Result<Sandbox> {
        self.call::<(), _>(Method::POST, &format!("/v1/sandboxes/{}/start", enc(id)), None).await
    }

    /// Destroys a sandbox.
    pub async fn remove_sandbox(&self, id: &str, force: bool) -> Result<SandboxEvent> {
        self.call::<(), _>(Method::DELETE, &format!("/v1/sandboxes/{}?force={force}", enc(id)), None).await
    }

    /// Changes a sandbox's policy; returns the updated sandbox.
    pub async fn update_sandbox(&self, id: &str, req: &UpdateSandboxRequest) -> Result<Sandbox> {
        self.call(Method::PATCH, &format!("/v1/sandboxes/{}", enc(id)), Some(req)).await
    }

    /// A sandbox's network: mode, rules, counters.
    pub async fn get_network(&self, id: &str) -> Result<strata_api::NetworkInfo> {
        self.call::<(), _>(Method::GET, &format!("/v1/sandboxes/{}/network", enc(id)), None).await
    }

    /// Replaces a sandbox's network mode and rules (live when it runs).
    pub async fn set_network(&self, id: &str, spec: &strata_api::NetworkSpec) -> Result<strata_api::NetworkInfo> {
        self.call(Method::PUT, &format!("/v1/sandboxes/{}/network", enc(id)), Some(spec)).await
    }

    // ---- leases ----

    /// Takes a keep-alive lease for `duration` (e.g. "10m").
    pub async fn create_lease(&self, id: &str, duration: &str) -> Result<Lease> {
        self.call(
            Method::POST,
            &format!("/v1/sandboxes/{}/leases", enc(id)),
            Some(&LeaseRequest { duration: duration.into() }),
        )
        .await
    }

    /// Renews a lease: it then expires `duration` from now.
    pub async fn renew_lease(&self, id: &str, lease: &str, duration: &str) -> Result<Lease> {
        self.call(
            Method::POST,
            &format!("/v1/sandboxes/{}/leases/{}/renew", enc(id), enc(lease)),
            Some(&LeaseRequest { duration: duration.into() }),
        )
        .await
    }

    /// Releases a lease.
    pub async fn release_lease(&self, id: &str, lease: &str) -> Result<()> {
        self.call::<(), ()>(Method::DELETE, &format!("/v1/sandboxes/{}/leases/{}", enc(id), enc(lease)), None).await
    }

    /// The leases a sandbox holds.
    pub async fn list_leases(&self, id: &str) -> Result<Vec<Lease>> {
        self.call::<(), _>(Method::GET, &format!("/v1/sandboxes/{}/leases", enc(id)), None).await
    }

    /// Lifecycle events (all, or of one sandbox) after `after`.
    pub async fn events(&self, sandbox: Option<&str>, after: i64) -> Result<Vec<SandboxEvent>> {
        let q = sandbox.map(|s| format!("&sandbox={}", enc(s))).unwrap_or_default();
        self.call::<(), _>(Method::GET, &format!("/v1/events?after={after}{q}"), None).await
    }

    /// Follows lifecycle events.
    pub async fn follow_events(&self, sandbox: Option<&str>, after: i64) -> Result<NdjsonStream<SandboxEvent>> {
        let q = sandbox.map(|s| format!("&sandbox={}", enc(s))).unwrap_or_default();
        self.stream::<(), _>(Method::GET, &format!("/v1/events?follow=true&after={after}{q}"), None).await
    }

    // ---- checkpoints ----

    /// Checkpoints a sandbox.
    pub async fn checkpoint(&self, id: &str, req: &CheckpointRequest) -> Result<Checkpoint> {
        self.call(Method::POST, &format!("/v1/sandboxes/{}/checkpoints", enc(id)), Some(req)).await
    }

    /// Lists checkpoints (of one sandbox, or all).
    pub async fn list_checkpoints(&self, sandbox: Option<&str>) -> Result<Vec<Checkpoint>> {
        let path = match sandbox {
            Some(s) => format!("/v1/sandboxes/{}/checkpoints", enc(s)),
            None => "/v1/checkpoints".to_string(),
        };
        self.call::<(), _>(Method::GET, &path, None).await
    }

    /// Inspects a checkpoint.
    pub async fn get_checkpoint(&self, id: &str) -> Result<Checkpoint> {
        self.call::<(), _>(Method::GET, &format!("/v1/checkpoints/{}", enc(id)), None).await
    }

    /// Deletes a checkpoint.
    pub async fn delete_checkpoint(&self, id: &str) -> Result<()> {
        self.call::<(), ()>(Method::DELETE, &format!("/v1/checkpoints/{}", enc(id)), None).await
    }

    /// Deletes a checkpoint now, or retires it while something still builds
    /// on it (gone as a source; its layers freed once nothing needs them).
    pub async fn retire_checkpoint(&self, id: &str) -> Result<strata_api::CheckpointDeleted> {
        self.call::<(), _>(Method::DELETE, &format!("/v1/checkpoints/{}?when_unused=true", enc(id)), None).await
    }

    /// Forks sandboxes from a checkpoint or a live sandbox.
    pub async fn fork(&self, req: &ForkRequest) -> Result<ForkResult> {
        self.call(Method::POST, "/v1/fork", Some(req)).await
    }

    /// Fan-out and select: forks one child per attempt, runs them, picks the winner.
    pub async fn fanout(&self, req: &FanoutRequest) -> Result<FanoutResult> {
        self.call(Method::POST, "/v1/fanout", Some(req)).await
    }

    /// Rolls a sandbox back to a checkpoint.
    pub async fn restore(&self, id: &str, req: &RestoreRequest) -> Result<RestoreResult> {
        self.call(Method::POST, &format!("/v1/sandboxes/{}/restore", enc(id)), Some(req)).await
    }

    /// Changes since the last checkpoint.
    pub async fn diff(&self, id: &str, against: Option<&str>) -> Result<Vec<FileChange>> {
        let q = against.map(|a| format!("?against={}", enc(a))).unwrap_or_default();
        self.call::<(), _>(Method::GET, &format!("/v1/sandboxes/{}/diff{q}", enc(id)), None).await
    }

    /// The change set as a tar (in memory; see [`Client::export_stream`]).
    pub async fn export(&self, id: &str, against: Option<&str>) -> Result<Bytes> {
        self.export_stream(id, against).await?.collect().await
    }

    /// The change set as a tar stream.
    pub async fn export_stream(&self, id: &str, against: Option<&str>) -> Result<ByteStream> {
        let q = against.map(|a| format!("?against={}", enc(a))).unwrap_or_default();
        self.bytes_stream(Method::GET, &format!("/v1/sandboxes/{}/export{q}", enc(id))).await
    }

    /// Runs garbage collection.
    pub async fn gc(&self) -> Result<GcReport> {
        self.call::<(), _>(Method::POST, "/v1/gc", None).await
    }

    /// The cost of one sandbox (destroyed ones too).
    pub async fn cost(&self, id: &str) -> Result<strata_api::CostReport> {
        self.call::<(), _>(Method::GET, &format!("/v1/cost/{}", enc(id)), None).await
    }

    /// The cost of every sandbox.
    pub async fn cost_summary(&self) -> Result<strata_api::CostSummary> {
        self.call::<(), _>(Method::GET, "/v1/cost", None).await
    }

    /// The lifecycle advisor's recommendation for a stage.
    pub async fn advise(&self, req: &strata_api::AdviseRequest) -> Result<strata_api::Advice> {
        self.call(Method::POST, "/v1/advise", Some(req)).await
    }

    // ---- pipelines ----

    /// Starts a pipeline run (returns at once).
    pub async fn run_pipeline(&self, req: &RunPipelineRequest) -> Result<PipelineRun> {
        self.call(Method::POST, "/v1/pipelines", Some(req)).await
    }

    /// Starts a pipeline run and streams its progress until it ends.
    pub async fn run_pipeline_follow(&self, req: &RunPipelineRequest) -> Result<NdjsonStream<PipelineEvent>> {
        self.stream(Method::POST, "/v1/pipelines?follow=true", Some(req)).await
    }

    /// A pipeline run.
    pub async fn pipeline(&self, id: &str) -> Result<PipelineRun> {
        self.call::<(), _>(Method::GET, &format!("/v1/pipelines/{}", enc(id)), None).await
    }

    /// Streams a pipeline run's progress until it ends.
    pub async fn pipeline_follow(&self, id: &str) -> Result<NdjsonStream<PipelineEvent>> {
        self.stream::<(), _>(Method::GET, &format!("/v1/pipelines/{}?follow=true", enc(id)), None).await
    }

    /// Every pipeline run, newest first.
    pub async fn list_pipelines(&self) -> Result<Vec<PipelineRun>> {
        self.call::<(), _>(Method::GET, "/v1/pipelines", None).await
    }

    /// Resumes a failed or interrupted run (returns at once).
    pub async fn resume_pipeline(&self, id: &str) -> Result<PipelineRun> {
        self.call::<(), _>(Method::POST, &format!("/v1/pipelines/{}/resume", enc(id)), None).await
    }

    /// Resumes a failed or interrupted run and streams its progress until it ends.
    pub async fn resume_pipeline_follow(&self, id: &str) -> Result<NdjsonStream<PipelineEvent>> {
        self.stream::<(), _>(Method::POST, &format!("/v1/pipelines/{}/resume?follow=true", enc(id)), None).await
    }

    /// Asks a running run to pause at its next stage boundary.
    pub async fn pause_pipeline(&self, id: &str) -> Result<PipelineRun> {
        self.call::<(), _>(Method::POST, &format!("/v1/pipelines/{}/pause", enc(id)), None).await
    }

    /// Cost of a pipeline run per stage.
    pub async fn pipeline_cost(&self, id: &str) -> Result<PipelineCost> {
        self.call::<(), _>(Method::GET, &format!("/v1/pipelines/{}/cost", enc(id)), None).await
    }

    /// The Prometheus metrics text.
    pub async fn metrics(&self) -> Result<String> {
        let b = self.raw(Method::GET, "/metrics", Bytes::new()).await?;
        Ok(String::from_utf8_lossy(&b).into_owned())
    }

    /// The lineage tree around a sandbox or checkpoint.
    pub async fn lineage(&self, id: &str) -> Result<Lineage> {
        self.call::<(), _>(Method::GET, &format!("/v1/lineage/{}", enc(id)), None).await
    }

    /// State-hygiene scan of a sandbox or checkpoint.
    pub async fn scan(&self, id: &str) -> Result<ScanReport> {
        self.call::<(), _>(Method::GET, &format!("/v1/scan/{}", enc(id)), None).await
    }

    /// Checks a sandbox now (its `on_findings` applies).
    pub async fn check_sandbox(&self, id: &str) -> Result<strata_api::CheckReport> {
        self.call::<(), _>(Method::POST, &format!("/v1/sandboxes/{}/check", enc(id)), None).await
    }

    /// What a sandbox has accumulated.
    pub async fn accumulation(&self, id: &str) -> Result<strata_api::Accumulation> {
        self.call::<(), _>(Method::GET, &format!("/v1/sandboxes/{}/accumulation", enc(id)), None).await
    }

    /// Quarantines a sandbox or checkpoint.
    pub async fn quarantine(&self, id: &str, reason: &str) -> Result<strata_api::QuarantineEntry> {
        let req = strata_api::QuarantineRequest { reason: reason.to_string() };
        self.call(Method::POST, &format!("/v1/quarantine/{}", enc(id)), Some(&req)).await
    }

    /// Lifts a quarantine (operator only).
    pub async fn lift_quarantine(&self, id: &str, reason: &str) -> Result<strata_api::QuarantineEntry> {
        let req = strata_api::QuarantineRequest { reason: reason.to_string() };
        self.call(Method::DELETE, &format!("/v1/quarantine/{}", enc(id)), Some(&req)).await
    }

    /// The quarantined sandboxes and checkpoints.
    pub async fn quarantined(&self) -> Result<Vec<strata_api::QuarantineEntry>> {
        self.call::<(), _>(Method::GET, "/v1/quarantine", None).await
    }

    /// The last `limit` audit entries (default 100), oldest first.
    pub async fn audit(&self, limit: Option<u32>) -> Result<Vec<AuditEntry>> {
        let q = limit.map(|l| format!("?limit={l}")).unwrap_or_default();
        self.call::<(), _>(Method::GET, &format!("/v1/audit{q}"), None).await
    }

    /// Recomputes the audit log's hash chain.
    pub async fn audit_verify(&self) -> Result<AuditVerification> {
        self.call::<(), _>(Method::GET, "/v1/audit/verify", None).await
    }

    // ---- templates ----

    /// Promotes a checkpoint or sandbox to a template.
    pub async fn create_template(&self, req: &CreateTemplateRequest) -> Result<Template> {
        self.call(Method::POST, "/v1/templates", Some(req)).await
    }

    /// Creates an API token (the response carries its secret, shown only now).
    pub async fn create_token(&self, req: &strata_api::CreateTokenRequest) -> Result<strata_api::CreatedToken> {
        self.call(Method::POST, "/v1/tokens", Some(req)).await
    }

    /// API tokens (of one tenant; revoked ones too with `all`).
    pub async fn list_tokens(&self, tenant: Option<&str>, all: bool) -> Result<Vec<strata_api::TokenInfo>> {
        let mut q = format!("/v1/tokens?all={all}");
        if let Some(t) = tenant {
            q.push_str(&format!("&tenant={}", enc(t)));
        }
        self.call::<(), _>(Method::GET, &q, None).await
    }

    /// Revokes an API token by id or name (`tenant` narrows a name).
    pub async fn revoke_token(&self, id_or_name: &str, tenant: Option<&str>) -> Result<strata_api::TokenInfo> {
        let mut q = format!("/v1/tokens/{}", enc(id_or_name));
        if let Some(t) = tenant {
            q.push_str(&format!("?tenant={}", enc(t)));
        }
        self.call::<(), _>(Method::DELETE, &q, None).await
    }

    /// A tenant's quota: in force, the operator's override and the daemon's defaults (operator only).
    pub async fn tenant_quota(&self, tenant: &str) -> Result<strata_api::TenantQuota> {
        self.call::<(), _>(Method::GET, &format!("/v1/tenants/{}/quota", enc(tenant)), None).await
    }

    /// Replaces a tenant's quota override (operator only).
    pub async fn set_tenant_quota(
        &self,
        tenant: &str,
        quota: &strata_api::QuotaOverride,
    ) -> Result<strata_api::TenantQuota> {
        self.call(Method::PUT, &format!("/v1/tenants/{}/quota", enc(tenant)), Some(quota)).await
    }

    /// Removes a tenant's quota override: the defaults hold again (operator only).
    pub async fn reset_tenant_quota(&self, tenant: &str) -> Result<strata_api::TenantQuota> {
        self.call::<(), _>(Method::DELETE, &format!("/v1/tenants/{}/quota", enc(tenant)), None).await
    }

    /// A tenant's usage against its quota (a tenant sees only its own).
    pub async fn tenant_usage(&self, tenant: &str) -> Result<strata_api::TenantUsage> {
        self.call::<(), _>(Method::GET, &format!("/v1/tenants/{}/usage", enc(tenant)), None).await
    }

    /// Lists approvals (a tenant sees its own), optionally only those in `state`.
    pub async fn list_approvals(&self, state: Option<&str>) -> Result<Vec<strata_api::Approval>> {
        let q = match state {
            Some(s) => format!("/v1/approvals?state={}", enc(s)),
            None => "/v1/approvals".to_string(),
        };
        self.call::<(), _>(Method::GET, &q, None).await
    }

    /// One approval.
    pub async fn get_approval(&self, id: &str) -> Result<strata_api::Approval> {
        self.call::<(), _>(Method::GET, &format!("/v1/approvals/{}", enc(id)), None).await
    }

    /// Approves (`approve = true`) or denies a pending approval (the operator only).
    pub async fn decide_approval(
        &self,
        id: &str,
        approve: bool,
        reason: Option<String>,
    ) -> Result<strata_api::Approval> {
        let verb = if approve { "approve" } else { "deny" };
        self.call(
            Method::POST,
            &format!("/v1/approvals/{}/{verb}", enc(id)),
            Some(&strata_api::ApprovalDecision { reason }),
        )
        .await
    }

    // ---- previews ----

    /// Opens a sandbox port (`None`: every port) as a preview URL; the response carries its token, shown only now.
    pub async fn create_preview(
        &self,
        id: &str,
        req: &strata_api::CreatePreviewRequest,
    ) -> Result<strata_api::CreatedPreview> {
        self.call(Method::POST, &format!("/v1/sandboxes/{}/previews", enc(id)), Some(req)).await
    }

    /// A sandbox's previews (revoked and expired ones too with `all`).
    pub async fn list_previews(&self, id: &str, all: bool) -> Result<Vec<strata_api::Preview>> {
        self.call::<(), _>(Method::GET, &format!("/v1/sandboxes/{}/previews?all={all}", enc(id)), None).await
    }

    /// Revokes a preview: its token is refused from the next request on.
    pub async fn revoke_preview(&self, id: &str, preview: &str) -> Result<strata_api::Preview> {
        self.call::<(), _>(Method::DELETE, &format!("/v1/sandboxes/{}/previews/{}", enc(id), enc(preview)), None).await
    }

    /// Lists templates.
    pub async fn list_templates(&self) -> Result<Vec<Template>> {
        self.call::<(), _>(Method::GET, "/v1/templates", None).await
    }

    /// Removes a template.
    pub async fn delete_template(&self, name: &str) -> Result<()> {
        self.call::<(), ()>(Method::DELETE, &format!("/v1/templates/{}", enc(name)), None).await
    }

    /// Builds a template, streaming its events.
    pub async fn build_template(&self, req: &BuildTemplateRequest) -> Result<NdjsonStream<BuildEvent>> {
        self.stream(Method::POST, "/v1/templates/build", Some(req)).await
    }

    /// Sets a template's checks at set times (`check_every`, `on_findings`).
    pub async fn set_template_policy(&self, name: &str, patch: &strata_api::TemplatePolicyPatch) -> Result<Template> {
        self.call(Method::PATCH, &format!("/v1/templates/{}", enc(name)), Some(patch)).await
    }

    /// Checks a template now (its checkpoint's scan and whether its image has a newer version).
    pub async fn check_template(&self, name: &str) -> Result<strata_api::TemplateCheckReport> {
        self.call::<(), _>(Method::POST, &format!("/v1/templates/{}/check", enc(name)), None).await
    }

    /// Rebuilds a template from its build file (on a new base when given), streaming its events.
    pub async fn rebuild_template(
        &self,
        name: &str,
        req: &strata_api::RebuildTemplateRequest,
    ) -> Result<NdjsonStream<BuildEvent>> {
        self.stream(Method::POST, &format!("/v1/templates/{}/rebuild", enc(name)), Some(req)).await
    }

    // ---- processes ----

    /// Runs a command to completion and returns its output.
    pub async fn exec(&self, id: &str, req: &ExecRequest) -> Result<ExecResult> {
        self.call(Method::POST, &format!("/v1/sandboxes/{}/exec", enc(id)), Some(req)).await
    }

    /// Runs a command, streaming its events.
    pub async fn exec_stream(&self, id: &str, req: &ExecRequest) -> Result<NdjsonStream<ProcessEvent>> {
        self.stream(Method::POST, &format!("/v1/sandboxes/{}/exec?stream=true", enc(id)), Some(req)).await
    }

    /// Starts a background process.
    pub async fn start_process(&self, id: &str, req: &ExecRequest) -> Result<ProcessInfo> {
        self.call(Method::POST, &format!("/v1/sandboxes/{}/processes", enc(id)), Some(req)).await
    }

    /// Lists processes.
    pub async fn list_processes(&self, id: &str) -> Result<Vec<ProcessInfo>> {
        self.call::<(), _>(Method::GET, &format!("/v1/sandboxes/{}/processes", enc(id)), None).await
    }

    /// Inspects a process.
    pub async fn get_process(&self, id: &str, pid: u64) -> Result<ProcessInfo> {
        self.call::<(), _>(Method::GET, &format!("/v1/sandboxes/{}/processes/{pid}", enc(id)), None).await
    }

    /// Reads (and optionally follows) a process's output.
    pub async fn logs(&self, id: &str, pid: u64, offset: u64, follow: bool) -> Result<NdjsonStream<ProcessEvent>> {
        self.stream::<(), _>(
            Method::GET,
            &format!("/v1/sandboxes/{}/processes/{pid}/logs?offset={offset}&follow={follow}", enc(id)),
            None,
        )
        .await
    }

    /// Sends a signal.
    pub async fn signal(&self, id: &str, pid: u64, signal: &str) -> Result<ProcessInfo> {
        self.call(
            Method::POST,
            &format!("/v1/sandboxes/{}/processes/{pid}/signal", enc(id)),
            Some(&SignalRequest { signal: signal.into() }),
        )
        .await
    }

    /// Resizes a process's terminal.
    pub async fn resize_tty(&self, id: &str, pid: u64, size: TtySize) -> Result<ProcessInfo> {
        self.call(Method::POST, &format!("/v1/sandboxes/{}/processes/{pid}/resize", enc(id)), Some(&size)).await
    }

    /// Attaches to a process's terminal (started with `tty`) over a
    /// WebSocket: its output from `offset` (default: from now on).
    pub async fn attach_tty(&self, id: &str, pid: u64, offset: Option<u64>) -> Result<TtySocket> {
        use hyper::header;
        use tokio_tungstenite::tungstenite::handshake::{client::generate_key, derive_accept_key};
        let q = offset.map(|o| format!("?offset={o}")).unwrap_or_default();
        let key = generate_key();
        let req = self
            .request(Method::GET, &format!("/v1/sandboxes/{}/processes/{pid}/tty{q}", enc(id)))
            .header(header::CONNECTION, "Upgrade")
            .header(header::UPGRADE, "websocket")
            .header(header::SEC_WEBSOCKET_VERSION, "13")
            .header(header::SEC_WEBSOCKET_KEY, key.as_str())
            .body(full_body(Bytes::new()))
            .expect("valid request");
        let resp = self.connect(true).await?.send_request(req).await?;
        if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
            return Err(api_error(resp).await);
        }
        let accept = resp.headers().get(header::SEC_WEBSOCKET_ACCEPT).and_then(|v| v.to_str().ok());
        if accept != Some(derive_accept_key(key.as_bytes()).as_str()) {
            return Err(ClientError::Decode("the daemon's WebSocket answer does not match the key".into()));
        }
        let upgraded = hyper::upgrade::on(resp).await?;
        Ok(tokio_tungstenite::WebSocketStream::from_raw_socket(
            TokioIo::new(upgraded),
            tokio_tungstenite::tungstenite::protocol::Role::Client,
            None,
        )
        .await)
    }

    /// Writes to a process's stdin.
    pub async fn write_stdin(&self, id: &str, pid: u64, req: &StdinRequest) -> Result<()> {
        self.call(Method::POST, &format!("/v1/sandboxes/{}/processes/{pid}/stdin", enc(id)), Some(req)).await
    }

    /// Waits for a process.
    pub async fn wait(&self, id: &str, pid: u64, timeout: Option<&str>) -> Result<ProcessInfo> {
        let q = timeout.map(|t| format!("?timeout={}", enc(t))).unwrap_or_default();
        self.call::<(), _>(Method::POST, &format!("/v1/sandboxes/{}/processes/{pid}/wait{q}", enc(id)), None).await
    }

    // ---- files ----

    /// Uploads bytes to a file (or, with `tar`, extracts a tar stream under a directory).
    pub async fn upload(&self, id: &str, path: &str, data: Bytes, mode: Option<u32>, tar: bool) -> Result<()> {
        self.upload_body(id, path, full_body(data), mode, tar).await
    }

    /// [`Client::upload`] from a stream of chunks: the daemon writes them as they
    /// come (into a temp file renamed into place once the stream ends), so the
    /// upload never sits whole in memory on either side. A stream that fails
    /// aborts the upload and leaves nothing behind in the sandbox.
    pub async fn upload_stream<S>(&self, id: &str, path: &str, chunks: S, mode: Option<u32>, tar: bool) -> Result<()>
    where
        S: Stream<Item = std::io::Result<Bytes>> + Send + 'static,
    {
        self.upload_body(id, path, stream_body(chunks), mode, tar).await
    }

    async fn upload_body(&self, id: &str, path: &str, body: RequestBody, mode: Option<u32>, tar: bool) -> Result<()> {
        let m = mode.map(|m| format!("&mode={m}")).unwrap_or_default();
        let resp = self
            .send_body(
                Method::PUT,
                &format!("/v1/sandboxes/{}/files?path={}&tar={tar}{m}", enc(id), enc(path)),
                body,
                "application/octet-stream",
            )
            .await?;
        resp.into_body().collect().await?;
        Ok(())
    }

    /// Downloads a file (or, with `tar`, a tar stream of a path) into memory;
    /// see [`Client::download_stream`] for anything that may be large.
    pub async fn download(&self, id: &str, path: &str, tar: bool) -> Result<Bytes> {
        self.download_stream(id, path, tar).await?.collect().await
    }

    /// Downloads a file (or, with `tar`, a tar stream of a path) chunk by chunk.
    pub async fn download_stream(&self, id: &str, path: &str, tar: bool) -> Result<ByteStream> {
        self.bytes_stream(Method::GET, &format!("/v1/sandboxes/{}/files?path={}&tar={tar}", enc(id), enc(path))).await
    }

    /// Metadata of a path.
    pub async fn stat(&self, id: &str, path: &str) -> Result<FileStat> {
        self.call::<(), _>(Method::GET, &format!("/v1/sandboxes/{}/files/stat?path={}", enc(id), enc(path)), None).await
    }

    /// Lists a directory.
    /// Watches a directory of a sandbox: its changes as they happen, one
    /// [`strata_api::WatchLine`] each (an `Ended` line last when the watch ends on its own).
    pub async fn watch_dir(
        &self,
        id: &str,
        path: &str,
        recursive: bool,
    ) -> Result<NdjsonStream<strata_api::WatchLine>> {
        let q = format!("/v1/sandboxes/{}/files/watch?path={}&recursive={recursive}", enc(id), enc(path));
        self.stream::<(), _>(Method::GET, &q, None).await
    }

    pub async fn list_dir(&self, id: &str, path: &str) -> Result<Vec<FileStat>> {
        self.call::<(), _>(Method::GET, &format!("/v1/sandboxes/{}/files/list?path={}", enc(id), enc(path)), None).await
    }

    /// Creates a directory.
    pub async fn mkdir(&self, id: &str, path: &str, parents: bool) -> Result<()> {
        self.call(
            Method::POST,
            &format!("/v1/sandboxes/{}/files/mkdir", enc(id)),
            Some(&MkdirRequest { path: path.into(), parents }),
        )
        .await
    }

    /// Removes a path.
    pub async fn remove_path(&self, id: &str, path: &str, recursive: bool) -> Result<()> {
        self.call(
            Method::POST,
            &format!("/v1/sandboxes/{}/files/remove", enc(id)),
            Some(&RemoveFileRequest { path: path.into(), recursive }),
        )
        .await
    }

    /// Moves a path.
    pub async fn move_path(&self, id: &str, from: &str, to: &str) -> Result<()> {
        self.call(
            Method::POST,
            &format!("/v1/sandboxes/{}/files/move", enc(id)),
            Some(&MoveRequest { from: from.into(), to: to.into() }),
        )
        .await
    }
}
