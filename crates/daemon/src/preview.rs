//! Preview URLs: a reverse proxy from the daemon's listeners to ports bound on
//! a sandbox's loopback (see docs/preview.md).
//!
//! * **Routing**: [`intercept`] runs before authentication on every listener.
//!   A request whose `Host` is `<port>-<sandbox>.<preview-domain>` (host-based)
//!   or whose path starts with `/preview/<sandbox>/<port>/` (path-based, the
//!   prefix is stripped) is proxied; anything else goes to the API router.
//! * **Access**: a preview's token (header `X-Strata-Preview-Token`, or the
//!   `strata_token` query parameter of a signed URL, which also sets a cookie
//!   scoped to the preview), or a public preview. Tokens are looked up on every
//!   request (only their SHA-256 is stored), so a revoke or an expiry counts
//!   from the next request; a refused one is a 401.
//! * **Reaching the port**: the upstream socket is created by a dedicated
//!   connector thread that has `setns()` into the sandbox's network namespace
//!   (a socket stays in the namespace it was made in; tokio then connects it),
//!   so a port bound on 127.0.0.1 inside the sandbox is reachable in every
//!   network mode, and nothing is published on the host. The thread ends after
//!   10 s without requests, so it does not keep the namespace alive.
//! * **Lifecycle**: a sandbox in standby (or paused) is resumed by the first
//!   request; every proxied request, streamed body and upgraded connection
//!   (WebSocket) holds an [`crate::activity::ActivityGuard`], so the idle
//!   policy never puts a sandbox with open preview connections into standby.
//! * Proxied traffic is counted in metrics (`strata_preview_requests`,
//!   `strata_preview_bytes`), not written to the audit log; creating and
//!   revoking previews are API calls and are audited like any other.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::extract::{ConnectInfo, Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use strata_api::{
    CreatePreviewRequest, CreatedPreview, ErrorCode, Preview, PreviewQuery, SandboxState, PREVIEW_PATH_PREFIX,
    PREVIEW_SECRET_PREFIX, PREVIEW_TOKEN_HEADER, PREVIEW_TOKEN_QUERY,
};
use strata_core::ids;
use strata_store::db::SandboxRecord;
use tracing::{debug, info, warn};

use crate::activity::ActivityGuard;
use crate::error::{ApiError, ApiResult};
use crate::sandboxes::{handle_of, load, now};
use crate::state::Shared;

/// Default preview domain (`*.localhost` resolves to loopback in browsers and most resolvers).
pub const DEFAULT_DOMAIN: &str = "preview.localhost";

/// Name of the cookie a signed URL sets.
pub const COOKIE: &str = "strata_preview";

/// Default lifetime of a preview.
pub const DEFAULT_TTL: Duration = Duration::from_secs(86_400);

/// Longest lifetime of a preview.
pub const MAX_TTL: Duration = Duration::from_secs(30 * 86_400);

/// Idle upstream connections kept per sandbox port.
const POOL_PER_PORT: usize = 16;

/// How long connecting to a sandbox port may take (loopback: refused or accepted at once).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A connector thread ends after this long without requests.
const CONNECTOR_IDLE: Duration = Duration::from_secs(10);

/// Errors of the proxy's upstream side.
#[derive(Debug, thiserror::Error)]
pub enum PreviewError {
    /// The sandbox's network namespace could not be entered.
    #[error("entering the network namespace of sandbox {sandbox}: {source}")]
    Netns {
        /// Sandbox id.
        sandbox: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Nothing accepts connections on the port.
    #[error("nothing accepts connections on 127.0.0.1:{port} inside sandbox {sandbox}: {source}")]
    Connect {
        /// Sandbox id.
        sandbox: String,
        /// The port.
        port: u16,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP exchange with the sandbox's server failed.
    #[error("the server on port {port} of sandbox {sandbox} failed: {source}")]
    Upstream {
        /// Sandbox id.
        sandbox: String,
        /// The port.
        port: u16,
        /// The cause.
        #[source]
        source: hyper::Error,
    },
}

impl From<PreviewError> for ApiError {
    fn from(e: PreviewError) -> Self {
        match &e {
            PreviewError::Netns { .. } => ApiError::internal("preview", &e),
            PreviewError::Connect { .. } | PreviewError::Upstream { .. } => {
                ApiError::new(ErrorCode::UpstreamUnavailable, crate::error::chain(&e))
            }
        }
    }
}

/// Preview settings of the daemon.
#[derive(Debug, Clone)]
pub struct PreviewConfig {
    /// Host-based previews are `<port>-<sandbox>.<domain>` (lowercase, no trailing dot).
    pub domain: String,
}

impl Default for PreviewConfig {
    fn default() -> Self {
        PreviewConfig { domain: DEFAULT_DOMAIN.to_string() }
    }
}

type PoolKey = (String, u16, i32);

/// The proxy's state: settings and idle keep-alive connections to sandbox ports.
#[derive(Default)]
pub struct Previews {
    /// Settings.
    pub config: PreviewConfig,
    /// The TCP listener's address once bound, for the URLs shown (path-based URLs are relative without one).
    pub listen: std::sync::OnceLock<SocketAddr>,
    pool: Mutex<HashMap<PoolKey, Vec<SendRequest<Body>>>>,
    /// Connector threads by (sandbox, init pid, init start time).
    connectors: Mutex<HashMap<(String, i32, u64), Connector>>,
}

impl std::fmt::Debug for Previews {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Previews").field("config", &self.config).finish_non_exhaustive()
    }
}

impl Previews {
    /// A proxy with these settings.
    pub fn new(config: PreviewConfig) -> Self {
        Previews {
            config,
            listen: std::sync::OnceLock::new(),
            pool: Mutex::new(HashMap::new()),
            connectors: Mutex::new(HashMap::new()),
        }
    }

    fn take(&self, key: &PoolKey) -> Option<SendRequest<Body>> {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        let list = pool.get_mut(key)?;
        list.retain(|s| !s.is_closed());
        let i = list.iter().position(SendRequest::is_ready)?;
        Some(list.swap_remove(i))
    }

    fn give_back(&self, key: PoolKey, s: SendRequest<Body>) {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        let list = pool.entry(key).or_default();
        list.retain(|s| !s.is_closed());
        if list.len() < POOL_PER_PORT {
            list.push(s);
        }
    }

    fn forget(&self, sandbox: &str) {
        self.pool.lock().unwrap_or_else(|p| p.into_inner()).retain(|k, _| k.0 != sandbox);
        self.connectors.lock().unwrap_or_else(|p| p.into_inner()).retain(|k, _| k.0 != sandbox);
    }

    /// The listing form of a stored preview (with its URLs).
    pub fn with_urls(&self, mut p: Preview) -> Preview {
        let port = p.port.map_or_else(|| "{port}".to_string(), |p| p.to_string());
        let (host_port, base) = match self.listen.get().copied() {
            Some(a) => (
                if a.port() == 80 { String::new() } else { format!(":{}", a.port()) },
                format!("http://{}", crate::loopback(a)),
            ),
            None => (String::new(), String::new()),
        };
        p.url_host = format!("http://{port}-{}.{}{host_port}/", p.sandbox_id, self.config.domain);
        p.url_path = format!("{base}{PREVIEW_PATH_PREFIX}{}/{port}/", p.sandbox_id);
        p
    }
}

// ---- routing ----

/// Where a preview request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Sandbox id as given (only a full id is served).
    pub key: String,
    /// The port inside the sandbox.
    pub port: u16,
    /// The path (and query) to request upstream, the preview prefix stripped.
    pub upstream: String,
    /// The path the access cookie is scoped to (`/` for host-based previews).
    pub cookie_path: String,
    /// For path-based previews: the stripped prefix (`X-Forwarded-Prefix`).
    pub prefix: Option<String>,
}

/// What a request is for the proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Not a preview request: the API serves it.
    Api,
    /// A preview request.
    Proxy(Target),
    /// `/preview/<sandbox>/<port>` without the trailing slash: redirect there.
    AddSlash(String),
    /// A preview host or path that does not parse.
    Invalid(String),
}

/// The host part of a `Host` header value, lowercase, without port or trailing dot.
fn host_only(host: &str) -> String {
    let h = if host.starts_with('[') {
        host.split(']').next().unwrap_or(host)
    } else {
        host.rsplit_once(':').map_or(host, |(h, p)| if p.bytes().all(|b| b.is_ascii_digit()) { h } else { host })
    };
    h.trim_end_matches('.').to_ascii_lowercase()
}

/// The path and query for upstream without the `strata_token` parameter, and that token.
fn strip_token(path: &str, query: Option<&str>) -> (String, Option<String>) {
    let Some(q) = query else { return (path.to_string(), None) };
    let mut token = None;
    let kept: Vec<&str> = q
        .split('&')
        .filter(|kv| match kv.split_once('=') {
            Some((k, v)) if k == PREVIEW_TOKEN_QUERY => {
                token = Some(v.to_string());
                false
            }
            None if *kv == PREVIEW_TOKEN_QUERY => false,
            _ => true,
        })
        .collect();
    if kept.is_empty() {
        (path.to_string(), token)
    } else {
        (format!("{path}?{}", kept.join("&")), token)
    }
}

/// Classifies a request by its `Host` and path (pure).
pub fn route(domain: &str, host: Option<&str>, uri: &Uri) -> Route {
    if let Some(host) = host {
        let h = host_only(host);
        if let Some(label) = h.strip_suffix(domain).and_then(|l| l.strip_suffix('.')) {
            let parsed =
                label.split_once('-').and_then(|(p, id)| Some((p.parse::<u16>().ok().filter(|p| *p != 0)?, id)));
            return match parsed {
                Some((port, id)) if !id.is_empty() && !id.contains('.') => {
                    let (upstream, _) = strip_token(uri.path(), uri.query());
                    Route::Proxy(Target { key: id.to_string(), port, upstream, cookie_path: "/".into(), prefix: None })
                }
                _ => Route::Invalid(format!("{h:?} is not a preview host: expected <port>-<sandbox>.{domain}")),
            };
        }
    }
    let Some(rest) = uri.path().strip_prefix(PREVIEW_PATH_PREFIX) else { return Route::Api };
    let mut parts = rest.splitn(3, '/');
    let (key, port, tail) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next());
    let Some(port) = port.parse::<u16>().ok().filter(|p| *p != 0) else {
        return Route::Invalid(format!(
            "{} is not a preview path: expected {PREVIEW_PATH_PREFIX}<sandbox>/<port>/",
            uri.path()
        ));
    };
    if key.is_empty() {
        return Route::Invalid(format!(
            "{} is not a preview path: expected {PREVIEW_PATH_PREFIX}<sandbox>/<port>/",
            uri.path()
        ));
    }
    let prefix = format!("{PREVIEW_PATH_PREFIX}{key}/{port}");
    let Some(tail) = tail else {
        let q = uri.query().map(|q| format!("?{q}")).unwrap_or_default();
        return Route::AddSlash(format!("{prefix}/{q}"));
    };
    let (upstream, _) = strip_token(&format!("/{tail}"), uri.query());
    Route::Proxy(Target {
        key: key.to_string(),
        port,
        upstream,
        cookie_path: format!("{prefix}/"),
        prefix: Some(prefix),
    })
}

// ---- access ----

/// Why a preview request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No token and no public preview.
    #[error("this preview needs a token (header X-Strata-Preview-Token, or a signed URL's ?strata_token=)")]
    Missing,
    /// The token is unknown, or for another sandbox or port.
    #[error("the preview token is not valid for this sandbox port")]
    Wrong,
    /// The token's preview was revoked.
    #[error("the preview token was revoked")]
    Revoked,
    /// The token's preview expired.
    #[error("the preview token has expired")]
    Expired,
}

/// Whether a stored preview opens `port` of `sandbox_id` at `at`.
pub fn check(p: &Preview, sandbox_id: &str, port: u16, at: SystemTime) -> Result<(), Refusal> {
    if p.sandbox_id != sandbox_id || p.port.is_some_and(|pp| pp != port) {
        return Err(Refusal::Wrong);
    }
    if p.revoked_at.is_some() {
        return Err(Refusal::Revoked);
    }
    // An unreadable expiry is treated as expired (fail closed).
    match humantime::parse_rfc3339_weak(&p.expires_at) {
        Ok(t) if t > at => Ok(()),
        _ => Err(Refusal::Expired),
    }
}

/// The token candidates of a request: header, signed-URL query, cookies.
fn presented_tokens(headers: &HeaderMap, uri: &Uri) -> (Vec<String>, Option<String>) {
    let mut out = Vec::new();
    if let Some(v) = headers.get(PREVIEW_TOKEN_HEADER).and_then(|v| v.to_str().ok()) {
        out.push(v.trim().to_string());
    }
    let (_, query_token) = strip_token(uri.path(), uri.query());
    if let Some(t) = &query_token {
        out.push(t.clone());
    }
    for v in headers.get_all(header::COOKIE) {
        let Ok(v) = v.to_str() else { continue };
        for c in v.split(';') {
            if let Some((k, val)) = c.trim().split_once('=') {
                if k == COOKIE {
                    out.push(val.to_string());
                }
            }
        }
    }
    (out, query_token)
}

/// Grants or refuses access: the preview that admitted the request and the
/// token that did (`None` for a public preview), or why it is refused.
fn authorize(
    st: &Shared,
    sandbox_id: &str,
    port: u16,
    tokens: &[String],
) -> ApiResult<Result<(Preview, Option<String>), Refusal>> {
    let at = SystemTime::now();
    let mut worst = Refusal::Missing;
    for t in tokens {
        if !t.starts_with(PREVIEW_SECRET_PREFIX) {
            worst = Refusal::Wrong;
            continue;
        }
        match st.db.preview_by_hash(&crate::tenancy::secret_hash(t))? {
            Some(p) => match check(&p, sandbox_id, port, at) {
                Ok(()) => return Ok(Ok((p, Some(t.clone())))),
                // Report the most telling reason: revoked/expired over wrong.
                Err(r) if worst == Refusal::Missing || worst == Refusal::Wrong => worst = r,
                Err(_) => {}
            },
            None if worst == Refusal::Missing => worst = Refusal::Wrong,
            None => {}
        }
    }
    for p in st.db.public_previews(sandbox_id, port)? {
        if check(&p, sandbox_id, port, at).is_ok() {
            return Ok(Ok((p, None)));
        }
    }
    Ok(Err(worst))
}

// ---- the proxy ----

/// Middleware (outermost, before authentication): serves preview requests, passes the rest on.
pub async fn intercept(State(st): State<Shared>, req: Request, next: Next) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| req.uri().authority().map(|a| a.to_string()));
    match route(&st.previews.config.domain, host.as_deref(), req.uri()) {
        Route::Api => next.run(req).await,
        Route::Invalid(msg) => {
            st.metrics.preview_request("refused");
            ApiError::new(ErrorCode::RouteNotFound, msg).into_response()
        }
        Route::AddSlash(to) => match HeaderValue::from_str(&to) {
            Ok(v) => (StatusCode::PERMANENT_REDIRECT, [(header::LOCATION, v)]).into_response(),
            Err(_) => ApiError::bad_request("invalid preview path").into_response(),
        },
        Route::Proxy(t) => match proxy(&st, t, req).await {
            Ok(r) => r,
            Err(e) => {
                let outcome = match e.body.code {
                    ErrorCode::Unauthorized => "unauthorized",
                    ErrorCode::UpstreamUnavailable => "upstream_error",
                    _ => "refused",
                };
                st.metrics.preview_request(outcome);
                let mut r = e.into_response();
                if r.status() == StatusCode::UNAUTHORIZED {
                    r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("StrataPreview"));
                }
                r
            }
        },
    }
}

/// A running sandbox for a preview request: resumes one in standby (or paused); 409 otherwise.
async fn ready_sandbox(
    st: &Shared,
    rec: SandboxRecord,
) -> ApiResult<(SandboxRecord, Option<strata_api::ResumeResult>)> {
    match rec.sandbox.state {
        SandboxState::Running => Ok((rec, None)),
        SandboxState::Standby | SandboxState::Paused => {
            let resumed = crate::standby::ensure_running(st, &rec.sandbox.id).await?;
            let rec = load(st, &rec.sandbox.id)?;
            if rec.sandbox.state != SandboxState::Running {
                return Err(ApiError::invalid_state(
                    rec.sandbox.state,
                    format!("sandbox {} is {}, not running", rec.sandbox.id, rec.sandbox.state.as_str()),
                ));
            }
            Ok((rec, resumed))
        }
        s => Err(ApiError::invalid_state(
            s,
            format!(
                "sandbox {} is {}: previews reach only a running sandbox (or one in standby, which they resume)",
                rec.sandbox.id,
                s.as_str()
            ),
        )),
    }
}

/// Opens the network namespace of the process `pid`.
fn open_netns(sandbox: &str, pid: i32) -> Result<std::fs::File, PreviewError> {
    std::fs::File::open(format!("/proc/{pid}/ns/net"))
        .map_err(|source| PreviewError::Netns { sandbox: sandbox.to_string(), source })
}

/// What a connector thread answers: a socket made in the sandbox's network namespace.
type SocketReply = tokio::sync::oneshot::Sender<std::io::Result<tokio::net::TcpSocket>>;

/// A connector thread's queue: each message asks for one socket.
type Connector = std::sync::mpsc::Sender<SocketReply>;

/// Starts a connector thread for the network namespace `ns`: it joins the
/// namespace once, then makes sockets on request (`socket()` only; the connect
/// is done by tokio: a socket stays in the namespace it was made in), and ends
/// after [`CONNECTOR_IDLE`] without requests so it does not pin the namespace.
/// A dedicated thread: never a pooled one, which would stay in the namespace.
fn spawn_connector(ns: std::fs::File) -> std::io::Result<Connector> {
    let (tx, rx) = std::sync::mpsc::channel::<SocketReply>();
    std::thread::Builder::new().name("preview-netns".into()).spawn(move || {
        let joined = nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from);
        drop(ns);
        while let Ok(reply) = rx.recv_timeout(CONNECTOR_IDLE) {
            match &joined {
                Ok(()) => {
                    let _ = reply.send(tokio::net::TcpSocket::new_v4());
                }
                Err(e) => {
                    let _ = reply.send(Err(std::io::Error::new(e.kind(), e.to_string())));
                    return;
                }
            }
        }
    })?;
    Ok(tx)
}

impl Previews {
    /// Connects to 127.0.0.1:`port` inside the network namespace of the sandbox's init.
    async fn connect(
        &self,
        sandbox: &str,
        init: &strata_runtime::SandboxHandle,
        port: u16,
    ) -> Result<tokio::net::TcpStream, PreviewError> {
        let netns_err = |source| PreviewError::Netns { sandbox: sandbox.to_string(), source };
        let pid = init.init_pid;
        let key = (sandbox.to_string(), pid, init.init_start_time);
        let mut socket = None;
        // A connector that just ended (idle) drops the request: then once more with a new one.
        for _ in 0..2 {
            let existing = self.connectors.lock().unwrap_or_else(|p| p.into_inner()).get(&key).cloned();
            let tx = match existing {
                Some(tx) => tx,
                None => {
                    let tx = spawn_connector(open_netns(sandbox, pid)?).map_err(netns_err)?;
                    self.connectors.lock().unwrap_or_else(|p| p.into_inner()).insert(key.clone(), tx.clone());
                    tx
                }
            };
            let (rtx, rrx) = tokio::sync::oneshot::channel();
            if tx.send(rtx).is_ok() {
                if let Ok(r) = rrx.await {
                    socket = Some(r.map_err(netns_err)?);
                    break;
                }
            }
            self.connectors.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
        }
        let socket =
            socket.ok_or_else(|| netns_err(std::io::Error::other("the namespace's connector thread ended")))?;
        let addr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port));
        let conn_err = |source| PreviewError::Connect { sandbox: sandbox.to_string(), port, source };
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(addr))
            .await
            .map_err(|_| conn_err(std::io::ErrorKind::TimedOut.into()))?
            .map_err(conn_err)?;
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }
}

/// Headers never forwarded (hop-by-hop, RFC 9110 7.6.1), besides those named in `Connection`.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

fn strip_hop_by_hop(h: &mut HeaderMap) {
    let named: Vec<String> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|s| s.trim().to_ascii_lowercase()))
        .collect();
    for n in HOP_BY_HOP.iter().map(|s| s.to_string()).chain(named) {
        if let Ok(name) = HeaderName::from_bytes(n.as_bytes()) {
            h.remove(name);
        }
    }
}

/// Removes the preview cookie from a `Cookie` header (other cookies stay for the app).
fn strip_cookie(h: &mut HeaderMap) {
    let kept: Vec<String> = h
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';').map(|c| c.trim().to_string()))
        .filter(|c| !c.is_empty() && c.split_once('=').map_or(c.as_str(), |(k, _)| k) != COOKIE)
        .collect();
    h.remove(header::COOKIE);
    if !kept.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&kept.join("; ")) {
            h.insert(header::COOKIE, v);
        }
    }
}

fn is_upgrade(h: &HeaderMap) -> Option<HeaderValue> {
    let conn_upgrade = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("upgrade")));
    if conn_upgrade {
        h.get(header::UPGRADE).cloned()
    } else {
        None
    }
}

async fn proxy(st: &Shared, t: Target, req: Request) -> ApiResult<Response> {
    // The full id only (no names or prefixes): these URLs are reachable without
    // an API token, so an answer must not tell whether a guessable name exists.
    let rec = st.db.sandbox_by_id(&t.key)?.ok_or_else(|| ApiError::sandbox_not_found(&t.key))?;
    let id = rec.sandbox.id.clone();
    let (tokens, query_token) = presented_tokens(req.headers(), req.uri());
    let (preview, admitted_by) =
        authorize(st, &id, t.port, &tokens)?.map_err(|r| ApiError::new(ErrorCode::Unauthorized, r.to_string()))?;
    let (rec, resumed) = ready_sandbox(st, rec).await?;
    let (Some(pid), Some(handle)) = (rec.sandbox.init_pid, handle_of(&rec)) else {
        return Err(ApiError::invalid_state(rec.sandbox.state, format!("sandbox {id} has no running init")));
    };
    // Held for the whole exchange: the request, the streamed response, an upgraded connection.
    let guard = st.activity.hold(&id);

    let (mut parts, body) = req.into_parts();
    let peer = parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip());
    let upgrade = is_upgrade(&parts.headers);
    let client_upgrade = if upgrade.is_some() { parts.extensions.remove::<hyper::upgrade::OnUpgrade>() } else { None };
    let orig_host = parts.headers.get(header::HOST).cloned();
    let mut headers = std::mem::take(&mut parts.headers);
    strip_hop_by_hop(&mut headers);
    strip_cookie(&mut headers);
    headers.remove(PREVIEW_TOKEN_HEADER);
    if let Some(u) = &upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, u.clone());
    }
    if let Ok(v) = HeaderValue::from_str(&format!("127.0.0.1:{}", t.port)) {
        headers.insert(header::HOST, v);
    }
    if let Some(h) = orig_host {
        headers.insert("x-forwarded-host", h);
    }
    headers.insert("x-forwarded-proto", HeaderValue::from_static("http"));
    if let Some(ip) = peer {
        let xff = match headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
            Some(prev) => format!("{prev}, {ip}"),
            None => ip.to_string(),
        };
        if let Ok(v) = HeaderValue::from_str(&xff) {
            headers.insert("x-forwarded-for", v);
        }
    }
    if let Some(p) = &t.prefix {
        if let Ok(v) = HeaderValue::from_str(p) {
            headers.insert("x-forwarded-prefix", v);
        }
    }
    let uri: Uri =
        t.upstream.parse().map_err(|_| ApiError::bad_request(format!("invalid preview path {:?}", t.upstream)))?;
    let mut up = hyper::Request::builder().method(parts.method.clone()).uri(uri).version(hyper::Version::HTTP_11);
    if let Some(h) = up.headers_mut() {
        *h = headers;
    }
    let body = Body::new(Counted { inner: body, st: st.clone(), direction: "to_sandbox", guard: None });
    let up_req = up.body(body).map_err(|e| ApiError::internal("building the upstream request", &e))?;

    // A pooled keep-alive connection when one is idle (never for upgrades: the connection is handed over).
    let key: PoolKey = (id.clone(), t.port, pid);
    let pooled = if upgrade.is_none() { st.previews.take(&key) } else { None };
    let mut sender = match pooled {
        Some(s) => s,
        None => {
            if !st.runtime.is_alive(&handle) {
                st.previews.forget(&id);
                return Err(ApiError::invalid_state(rec.sandbox.state, format!("sandbox {id}'s init is gone")));
            }
            let stream = st.previews.connect(&id, &handle, t.port).await?;
            // Checked again now that a namespace was (maybe) opened by pid: a reused pid must not hand us another one.
            if !st.runtime.is_alive(&handle) {
                st.previews.forget(&id);
                return Err(ApiError::invalid_state(rec.sandbox.state, format!("sandbox {id}'s init is gone")));
            }
            let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|source| PreviewError::Upstream { sandbox: id.clone(), port: t.port, source })?;
            let sid = id.clone();
            tokio::spawn(async move {
                if let Err(e) = conn.with_upgrades().await {
                    debug!(sandbox = %sid, error = %e, "preview upstream connection ended");
                }
            });
            sender
        }
    };
    let mut resp = sender.send_request(up_req).await.map_err(|source| PreviewError::Upstream {
        sandbox: id.clone(),
        port: t.port,
        source,
    })?;
    if upgrade.is_none() {
        st.previews.give_back(key, sender);
    }

    let status = resp.status();
    let mut out_headers = std::mem::take(resp.headers_mut());
    if status == StatusCode::SWITCHING_PROTOCOLS {
        let Some(client_upgrade) = client_upgrade else {
            return Err(ApiError::new(
                ErrorCode::UpstreamUnavailable,
                format!("the server on port {} switched protocols without being asked to", t.port),
            ));
        };
        let upstream_upgrade = hyper::upgrade::on(&mut resp);
        let (st2, sid, port) = (st.clone(), id.clone(), t.port);
        tokio::spawn(async move {
            let _held: ActivityGuard = guard;
            let (client, upstream) = match tokio::try_join!(client_upgrade, upstream_upgrade) {
                Ok(x) => x,
                Err(e) => {
                    warn!(sandbox = %sid, port, error = %e, "preview upgrade failed");
                    return;
                }
            };
            let (mut c, mut u) = (TokioIo::new(client), TokioIo::new(upstream));
            match tokio::io::copy_bidirectional(&mut c, &mut u).await {
                Ok((to, from)) => {
                    st2.metrics.preview_bytes("to_sandbox", to);
                    st2.metrics.preview_bytes("from_sandbox", from);
                    debug!(sandbox = %sid, port, to, from, "preview upgraded connection closed");
                }
                Err(e) => debug!(sandbox = %sid, port, error = %e, "preview upgraded connection ended"),
            }
        });
        st.metrics.preview_request("upgraded");
        let mut r = Response::new(Body::empty());
        *r.status_mut() = status;
        *r.headers_mut() = out_headers;
        return Ok(r);
    }

    strip_hop_by_hop(&mut out_headers);
    // A signed URL's token sets the cookie (only when that token is what admitted the request).
    if let Some(tok) = query_token.filter(|q| admitted_by.as_ref() == Some(q)) {
        let max_age = humantime::parse_rfc3339_weak(&preview.expires_at)
            .ok()
            .and_then(|e| e.duration_since(SystemTime::now()).ok())
            .map_or(0, |d| d.as_secs());
        let cookie = format!("{COOKIE}={tok}; Path={}; Max-Age={max_age}; HttpOnly; SameSite=Lax", t.cookie_path);
        if let Ok(v) = HeaderValue::from_str(&cookie) {
            out_headers.append(header::SET_COOKIE, v);
        }
    }
    if let Some(r) = resumed {
        if let Ok(v) = HeaderValue::from_str(r.from.as_str()) {
            out_headers.insert("strata-resumed-from", v);
        }
        out_headers.insert("strata-resume-ms", HeaderValue::from(r.duration_ms));
    }
    st.metrics.preview_request("proxied");
    let body =
        Body::new(Counted { inner: resp.into_body(), st: st.clone(), direction: "from_sandbox", guard: Some(guard) });
    let mut r = Response::new(body);
    *r.status_mut() = status;
    *r.headers_mut() = out_headers;
    Ok(r)
}

/// A body that counts its bytes into the preview metrics and holds an activity guard until it ends.
struct Counted<B> {
    inner: B,
    st: Shared,
    direction: &'static str,
    guard: Option<ActivityGuard>,
}

impl<B> http_body::Body for Counted<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, B::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        match &r {
            Poll::Ready(Some(Ok(f))) => {
                if let Some(d) = f.data_ref() {
                    self.st.metrics.preview_bytes(self.direction, d.len() as u64);
                }
            }
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => self.guard = None,
            Poll::Pending => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

// ---- API ----

fn preview_not_found(sandbox: &str, preview: &str) -> ApiError {
    ApiError::new(ErrorCode::PreviewNotFound, format!("sandbox {sandbox} has no preview {preview:?}"))
}

/// Opens a port of a sandbox through the proxy.
pub fn create(st: &Shared, sandbox: &str, req: &CreatePreviewRequest) -> ApiResult<CreatedPreview> {
    if req.port == Some(0) {
        return Err(ApiError::bad_request("port: must be 1-65535 (omit it for every port)"));
    }
    let ttl = match req.ttl_secs {
        Some(0) => return Err(ApiError::bad_request("ttl_secs: must be longer than zero")),
        Some(s) if Duration::from_secs(s) > MAX_TTL => {
            return Err(ApiError::bad_request(format!("ttl_secs: at most {} (30 days)", MAX_TTL.as_secs())))
        }
        Some(s) => Duration::from_secs(s),
        None => DEFAULT_TTL,
    };
    let rec = load(st, sandbox)?;
    if rec.sandbox.state == SandboxState::Destroyed {
        return Err(ApiError::sandbox_not_found(sandbox));
    }
    // The Rule of Two: a preview is external communication.
    let view = crate::sandboxes::with_secret_names(st, rec.sandbox.clone());
    let mut facts = crate::sandboxes::exposure_facts(st, &view);
    facts.preview_ports.push(req.port.unwrap_or(0));
    let grants = strata_core::rule_of_two::grants(&crate::sandboxes::exposure(&view, &facts));
    crate::approvals::gate(st, &rec.sandbox.tenant, "create preview of", &rec.sandbox.id, &grants)?;
    let created = SystemTime::now();
    let token = format!("{PREVIEW_SECRET_PREFIX}{}", hex::encode(rand::random::<[u8; 32]>()));
    let p = Preview {
        id: ids::new_id(),
        sandbox_id: rec.sandbox.id.clone(),
        port: req.port,
        public: req.public,
        tenant: rec.sandbox.tenant.clone(),
        created_at: humantime::format_rfc3339_millis(created).to_string(),
        expires_at: humantime::format_rfc3339_millis(created + ttl).to_string(),
        revoked_at: None,
        url_host: String::new(),
        url_path: String::new(),
    };
    st.db.insert_preview(&p, &crate::tenancy::secret_hash(&token))?;
    let p = st.previews.with_urls(p);
    info!(sandbox = %p.sandbox_id, preview = %p.id, port = ?p.port, public = p.public, expires_at = %p.expires_at, "preview created");
    let signed_url = format!("{}?{PREVIEW_TOKEN_QUERY}={token}", p.url_path);
    Ok(CreatedPreview { preview: p, token, signed_url })
}

/// The previews of a sandbox (live ones; `all`: revoked and expired ones too).
pub fn list(st: &Shared, sandbox: &str, all: bool) -> ApiResult<Vec<Preview>> {
    let rec = load(st, sandbox)?;
    let at = SystemTime::now();
    Ok(st
        .db
        .list_previews(&rec.sandbox.id)?
        .into_iter()
        .filter(|p| all || check(p, &rec.sandbox.id, p.port.unwrap_or(1), at).is_ok())
        .map(|p| st.previews.with_urls(p))
        .collect())
}

/// Revokes a preview: its token (and public access) is refused from the next request on.
pub fn revoke(st: &Shared, sandbox: &str, preview: &str) -> ApiResult<Preview> {
    let rec = load(st, sandbox)?;
    let p = st
        .db
        .revoke_preview(&rec.sandbox.id, preview, &now())?
        .ok_or_else(|| preview_not_found(&rec.sandbox.id, preview))?;
    info!(sandbox = %p.sandbox_id, preview = %p.id, "preview revoked");
    Ok(st.previews.with_urls(p))
}

/// Open a sandbox port as a preview URL; the token is in the response only.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/previews", tag = "previews", request_body = CreatePreviewRequest,
    params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 201, body = CreatedPreview), (status = 400, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn create_handler(
    State(st): State<Shared>,
    Path(id): Path<String>,
    Json(req): Json<CreatePreviewRequest>,
) -> ApiResult<(StatusCode, Json<CreatedPreview>)> {
    Ok((StatusCode::CREATED, Json(create(&st, &id, &req)?)))
}

/// List a sandbox's previews (never their tokens).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/previews", tag = "previews", params(("id" = String, Path, description = "Sandbox id or name"), PreviewQuery),
    responses((status = 200, body = [Preview]), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn list_handler(
    State(st): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<PreviewQuery>,
) -> ApiResult<Json<Vec<Preview>>> {
    Ok(Json(list(&st, &id, q.all)?))
}

/// Revoke a preview: refused (401) from the next request on; open connections are not cut.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/previews/{preview}", tag = "previews",
    params(("id" = String, Path, description = "Sandbox id or name"), ("preview" = String, Path, description = "Preview id")),
    responses((status = 200, body = Preview), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn revoke_handler(
    State(st): State<Shared>,
    Path((id, preview)): Path<(String, String)>,
) -> ApiResult<Json<Preview>> {
    Ok(Json(revoke(&st, &id, &preview)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uri(s: &str) -> Uri {
        s.parse().unwrap()
    }

    #[test]
    fn host_and_path_routes() {
        let d = "preview.localhost";
        assert_eq!(route(d, Some("127.0.0.1:7070"), &uri("/v1/sandboxes")), Route::Api);
        assert_eq!(route(d, None, &uri("/v1/info")), Route::Api);
        match route(d, Some("8000-ab12cd.Preview.Localhost:7070"), &uri("/a/b?x=1&strata_token=stp_1&y=2")) {
            Route::Proxy(t) => {
                assert_eq!(
                    (t.key.as_str(), t.port, t.upstream.as_str(), t.cookie_path.as_str()),
                    ("ab12cd", 8000, "/a/b?x=1&y=2", "/")
                );
                assert_eq!(t.prefix, None);
            }
            r => panic!("{r:?}"),
        }
        match route(d, Some("127.0.0.1"), &uri("/preview/web/3000/static/app.js?strata_token=stp_2")) {
            Route::Proxy(t) => {
                assert_eq!(
                    (t.key.as_str(), t.port, t.upstream.as_str(), t.cookie_path.as_str()),
                    ("web", 3000, "/static/app.js", "/preview/web/3000/")
                );
                assert_eq!(t.prefix.as_deref(), Some("/preview/web/3000"));
            }
            r => panic!("{r:?}"),
        }
        assert_eq!(route(d, None, &uri("/preview/web/3000?a=1")), Route::AddSlash("/preview/web/3000/?a=1".into()));
        assert!(matches!(route(d, None, &uri("/preview/web/http/")), Route::Invalid(_)));
        assert!(matches!(route(d, None, &uri("/preview/web/0/")), Route::Invalid(_)));
        assert!(matches!(route(d, Some("abc.preview.localhost"), &uri("/")), Route::Invalid(_)));
        assert!(matches!(route(d, Some("99999-ab.preview.localhost"), &uri("/")), Route::Invalid(_)));
        assert_eq!(
            route(d, Some("evilpreview.localhost"), &uri("/x")),
            Route::Api,
            "only subdomains of the preview domain"
        );
    }

    #[test]
    fn tokens_open_their_port_until_revoked_or_expired() {
        let now = SystemTime::now();
        let fmt = |t: SystemTime| humantime::format_rfc3339_millis(t).to_string();
        let p = Preview {
            id: "p".into(),
            sandbox_id: "s".into(),
            port: Some(80),
            public: false,
            tenant: "default".into(),
            created_at: fmt(now),
            expires_at: fmt(now + Duration::from_secs(60)),
            revoked_at: None,
            url_host: String::new(),
            url_path: String::new(),
        };
        assert_eq!(check(&p, "s", 80, now), Ok(()));
        assert_eq!(check(&p, "s", 81, now), Err(Refusal::Wrong));
        assert_eq!(check(&p, "t", 80, now), Err(Refusal::Wrong));
        assert_eq!(check(&p, "s", 80, now + Duration::from_secs(61)), Err(Refusal::Expired));
        let all = Preview { port: None, ..p.clone() };
        assert_eq!(check(&all, "s", 8443, now), Ok(()));
        let revoked = Preview { revoked_at: Some(fmt(now)), ..p.clone() };
        assert_eq!(check(&revoked, "s", 80, now), Err(Refusal::Revoked));
        let garbled = Preview { expires_at: "soon".into(), ..p };
        assert_eq!(check(&garbled, "s", 80, now), Err(Refusal::Expired));
    }

    #[test]
    fn hop_by_hop_headers_and_the_preview_cookie_stay_behind() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive, x-private"));
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        h.insert(header::COOKIE, HeaderValue::from_static("a=1; strata_preview=stp_x; b=2"));
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        strip_hop_by_hop(&mut h);
        strip_cookie(&mut h);
        assert!(
            h.get(header::CONNECTION).is_none()
                && h.get("x-private").is_none()
                && h.get(header::TRANSFER_ENCODING).is_none()
        );
        assert_eq!(h.get(header::COOKIE).unwrap(), "a=1; b=2");
        assert_eq!(h.get(header::CONTENT_TYPE).unwrap(), "text/plain");
        let mut only = HeaderMap::new();
        only.insert(header::COOKIE, HeaderValue::from_static("strata_preview=stp_x"));
        strip_cookie(&mut only);
        assert!(only.get(header::COOKIE).is_none());
    }
}
