//! The preview proxy: routes preview URLs (host- and path-based), checks their
//! tokens through the engine and forwards requests, WebSocket upgrades included,
//! to a port inside the sandbox over a connection the engine opens in its
//! network namespace; keeps idle upstream connections per sandbox port.

use crate::error::{ApiError, ApiResult};
use axum::body::Body;
use axum::extract::{ConnectInfo, Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::SystemTime;
use strata_api::{
    CreatePreviewRequest, CreatedPreview, ErrorCode, Preview, PreviewQuery, PREVIEW_PATH_PREFIX, PREVIEW_TOKEN_HEADER,
    PREVIEW_TOKEN_QUERY,
};
use strata_engine::activity::ActivityGuard;
use strata_engine::record::handle_of;
use tracing::{debug, warn};

use crate::native::acting::Acting;
use strata_engine::preview::*;
use strata_engine::state::Shared;

/// Idle upstream connections kept per sandbox port.
const POOL_PER_PORT: usize = 16;

type PoolKey = (String, u16, i32);

/// The proxy's state: idle keep-alive connections to sandbox ports, per
/// (sandbox, port, init pid), and the admissions it may reuse ([`Admission`]).
#[derive(Default)]
pub struct PreviewPool {
    pool: Mutex<HashMap<PoolKey, Vec<SendRequest<Body>>>>,
    admissions: Mutex<HashMap<AdmitKey, Admission>>,
}

impl PreviewPool {
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
        self.admissions.lock().unwrap_or_else(|p| p.into_inner()).retain(|_, a| a.id != sandbox);
    }
}

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

/// Middleware (outermost, before authentication): serves preview requests, passes the rest on.
pub async fn intercept(State((st, pool)): State<(Shared, Arc<PreviewPool>)>, req: Request, next: Next) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| req.uri().authority().map(|a| a.to_string()));
    match route(&st.previews.config.domain, host.as_deref(), req.uri()) {
        Route::Api => next.run(req).await,
        r => answer(&st, &pool, r, req).await,
    }
}

/// Serves `req`, whose path is a preview path (`/preview/<id>/<port>/...`,
/// its token in [`strata_api::PREVIEW_TOKEN_HEADER`]), in-process: what the
/// E2B layer's port routing sends (its Host names no preview).
pub async fn serve_path(st: &Shared, pool: &PreviewPool, req: Request) -> Response {
    match route(&st.previews.config.domain, None, req.uri()) {
        Route::Api => ApiError::new(ErrorCode::RouteNotFound, "not a preview path").into_response(),
        r => answer(st, pool, r, req).await,
    }
}

/// The answer to a request routed to previews.
async fn answer(st: &Shared, pool: &PreviewPool, r: Route, req: Request) -> Response {
    match r {
        Route::Api => ApiError::new(ErrorCode::RouteNotFound, "not a preview request").into_response(),
        Route::Invalid(msg) => {
            st.metrics.preview_request("refused");
            ApiError::new(ErrorCode::RouteNotFound, msg).into_response()
        }
        Route::AddSlash(to) => match HeaderValue::from_str(&to) {
            Ok(v) => (StatusCode::PERMANENT_REDIRECT, [(header::LOCATION, v)]).into_response(),
            Err(_) => ApiError::bad_request("invalid preview path").into_response(),
        },
        Route::Proxy(t) => match proxy(st, pool, t, req).await {
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

/// What admitted a request to a sandbox port: the token check, the running
/// sandbox and its init. Reused for later requests with the same token while
/// the engine's [`Generation`] is unchanged and the preview has not expired.
#[derive(Clone)]
struct Admission {
    /// The sandbox's full id.
    id: String,
    /// Its init.
    handle: strata_runtime::SandboxHandle,
    /// The runtime of its tier.
    runtime: Arc<dyn strata_runtime::Runtime>,
    /// When the admitting preview expires (`None`: an unreadable expiry, never reused).
    expires: Option<SystemTime>,
    /// The token that admitted it (`None`: a public preview).
    admitted_by: Option<String>,
    /// What the engine's state was before the checks ran.
    generation: Generation,
}

/// Admissions by (sandbox id as given, port, tokens presented).
type AdmitKey = (String, u16, Vec<String>);

/// Admissions kept at most (all are forgotten when more would be).
const MAX_ADMISSIONS: usize = 4096;

impl PreviewPool {
    fn admitted(&self, key: &AdmitKey, now: Generation, at: SystemTime) -> Option<Admission> {
        let admissions = self.admissions.lock().unwrap_or_else(|p| p.into_inner());
        admissions.get(key).filter(|a| a.generation == now && a.expires.is_some_and(|e| e > at)).cloned()
    }

    fn remember(&self, key: AdmitKey, a: Admission) {
        let mut admissions = self.admissions.lock().unwrap_or_else(|p| p.into_inner());
        if admissions.len() >= MAX_ADMISSIONS {
            admissions.clear();
        }
        admissions.insert(key, a);
    }
}

/// Checks a request's tokens and readies its sandbox (resuming one in
/// standby): from a remembered admission when nothing changed since, else
/// through the engine's checks ([`authorize`], [`ready_sandbox`]).
async fn admit(
    st: &Shared,
    pool: &PreviewPool,
    t: &Target,
    tokens: Vec<String>,
) -> ApiResult<(Admission, Option<strata_api::ResumeResult>)> {
    let generation = generation(st);
    let key: AdmitKey = (t.key.clone(), t.port, tokens);
    if let Some(a) = pool.admitted(&key, generation, SystemTime::now()) {
        return Ok((a, None));
    }
    // The full id only (no names or prefixes): these URLs are reachable without
    // an API token, so an answer must not tell whether a guessable name exists.
    let rec = st.db.sandbox_by_id(&t.key)?.ok_or_else(|| ApiError::sandbox_not_found(&t.key))?;
    let id = rec.sandbox.id.clone();
    let (preview, admitted_by) =
        authorize(st, &id, t.port, &key.2)?.map_err(|r| ApiError::new(ErrorCode::Unauthorized, r.to_string()))?;
    // A preview request has no API caller: once its token admitted it, it acts
    // in the sandbox's tenant (a resume on access sees that sandbox, nothing else).
    let tenant = rec.sandbox.tenant.clone();
    let (rec, resumed) = strata_engine::tenancy::run_in_tenant(&tenant, ready_sandbox(st, rec)).await?;
    let Some(handle) = handle_of(&rec) else {
        return Err(ApiError::invalid_state(rec.sandbox.state, format!("sandbox {id} has no running init")));
    };
    let a = Admission {
        id,
        handle,
        runtime: st.runtime_of(&rec.sandbox),
        expires: humantime::parse_rfc3339_weak(&preview.expires_at).ok(),
        admitted_by,
        generation,
    };
    // A resume changed the generation: nothing to remember until the next request.
    if resumed.is_none() {
        pool.remember(key, a.clone());
    }
    Ok((a, resumed))
}

async fn proxy(st: &Shared, pool: &PreviewPool, t: Target, req: Request) -> ApiResult<Response> {
    let (tokens, query_token) = presented_tokens(req.headers(), req.uri());
    let (adm, resumed) = admit(st, pool, &t, tokens).await?;
    let Admission { id, handle, runtime: rt, expires, admitted_by, .. } = adm;
    let pid = handle.init_pid;
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
    let pooled = if upgrade.is_none() { pool.take(&key) } else { None };
    let mut sender = match pooled {
        Some(s) => s,
        None => {
            if !rt.is_alive(&handle) {
                pool.forget(&id);
                st.previews.forget_connectors(&id);
                return Err(ApiError::invalid_state(
                    strata_api::SandboxState::Running,
                    format!("sandbox {id}'s init is gone"),
                ));
            }
            let stream = st.previews.connect(&rt, &id, &handle, t.port).await?;
            // Checked again now that a namespace was (maybe) opened by pid: a reused pid must not hand us another one.
            if !rt.is_alive(&handle) {
                pool.forget(&id);
                st.previews.forget_connectors(&id);
                return Err(ApiError::invalid_state(
                    strata_api::SandboxState::Running,
                    format!("sandbox {id}'s init is gone"),
                ));
            }
            let (sender, conn) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|source| {
                    PreviewError::Upstream { sandbox: id.clone(), port: t.port, source: source.into() }
                })?;
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
        source: source.into(),
    })?;
    if upgrade.is_none() {
        pool.give_back(key, sender);
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
        let max_age = expires.and_then(|e| e.duration_since(SystemTime::now()).ok()).map_or(0, |d| d.as_secs());
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

/// Open a sandbox port as a preview URL; the token is in the response only.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/previews", tag = "previews", request_body = CreatePreviewRequest,
    params(("id" = String, Path, description = "Sandbox id or name")),
    responses((status = 201, body = CreatedPreview), (status = 400, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn create_handler(
    Acting(engine): Acting,
    Path(id): Path<String>,
    Json(req): Json<CreatePreviewRequest>,
) -> ApiResult<(StatusCode, Json<CreatedPreview>)> {
    Ok((StatusCode::CREATED, Json(engine.create_preview(&id, &req).await?)))
}

/// List a sandbox's previews (never their tokens).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/previews", tag = "previews", params(("id" = String, Path, description = "Sandbox id or name"), PreviewQuery),
    responses((status = 200, body = [Preview]), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn list_handler(
    Acting(engine): Acting,
    Path(id): Path<String>,
    Query(q): Query<PreviewQuery>,
) -> ApiResult<Json<Vec<Preview>>> {
    Ok(Json(engine.list_previews(&id, q.all).await?))
}

/// Revoke a preview: refused (401) from the next request on; open connections are not cut.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/previews/{preview}", tag = "previews",
    params(("id" = String, Path, description = "Sandbox id or name"), ("preview" = String, Path, description = "Preview id")),
    responses((status = 200, body = Preview), (status = 404, body = strata_api::ApiErrorBody)))]
pub async fn revoke_handler(
    Acting(engine): Acting,
    Path((id, preview)): Path<(String, String)>,
) -> ApiResult<Json<Preview>> {
    Ok(Json(engine.revoke_preview(&id, &preview).await?))
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
