//! An E2B-compatible API on the daemon's TCP listener, so programs written for
//! the official `e2b` SDK (tested against `e2b==2.63.0`) run on strata with
//! `E2B_API_URL` and `E2B_SANDBOX_URL` pointing at the daemon.
//!
//! * [`control`]: the control plane (`/sandboxes`, `/v2/sandboxes`,
//!   `/snapshots`, ...), authenticated by `X-API-Key` (a strata API token).
//! * [`envd`]: the in-sandbox API (Connect services `process.Process` and
//!   `filesystem.Filesystem`, `/files`, `/health`), chosen by the
//!   `E2b-Sandbox-Id` header and authenticated by `X-Access-Token`.
//!
//! Both are translators onto the engine, called in-process ([`strata_engine::Engine`])
//! as the caller the request's key names ([`audit::authenticate`]): tenancy,
//! the Rule of Two, quotas, activity and resume on access apply as for a
//! native call ([`strata_engine::access`]), and mutating requests are in the
//! audit log ([`audit::record`]). Port routing goes through the preview proxy,
//! in-process too. The mapping and what is not supported: docs/e2b-compat.md.

pub mod access;
pub mod audit;
pub mod connect;
pub mod control;
pub mod envd;
pub mod multipart;
pub mod templates;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use strata_engine::error::EngineError;
use strata_engine::state::Shared;
use tracing::debug;

use crate::native::preview::PreviewPool;
use strata_engine::Engine;

/// The port envd listens on inside an E2B sandbox (`E2b-Sandbox-Port`).
pub const ENVD_PORT: u16 = 49983;
/// The envd version announced to the SDK (the features strata's envd serves).
pub const ENVD_VERSION: &str = "0.6.4";
/// The strata image or template the E2B template id `base` maps to.
pub const BASE_TEMPLATE: &str = "e2b-base";
/// Label holding the E2B template id a sandbox was created from.
pub const TEMPLATE_LABEL: &str = "e2b.template";

/// Errors of the control plane, answered in E2B's shape `{"code": <status>, "message"}`.
#[derive(Debug, thiserror::Error)]
pub enum E2bError {
    /// No or an unusable API key (401).
    #[error("{0}")]
    Unauthorized(String),
    /// Unknown sandbox, snapshot or template (404).
    #[error("{0}")]
    NotFound(String),
    /// Malformed request (400).
    #[error("{0}")]
    BadRequest(String),
    /// A call or option strata does not implement (501).
    #[error("{0}")]
    Unsupported(String),
    /// The engine refused or failed.
    #[error("{}", .0.body.message)]
    Engine(EngineError),
}

impl From<EngineError> for E2bError {
    fn from(e: EngineError) -> Self {
        E2bError::Engine(e)
    }
}

impl E2bError {
    /// The HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            E2bError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            E2bError::NotFound(_) => StatusCode::NOT_FOUND,
            E2bError::BadRequest(_) => StatusCode::BAD_REQUEST,
            E2bError::Unsupported(_) => StatusCode::NOT_IMPLEMENTED,
            E2bError::Engine(e) => crate::error::status_of(e.body.code),
        }
    }

    /// The message for the client.
    pub fn message(&self) -> String {
        self.to_string()
    }
}

impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        let status = self.status();
        debug!(status = status.as_u16(), message = %self.message(), "e2b error");
        (status, axum::Json(serde_json::json!({"code": status.as_u16(), "message": self.message()}))).into_response()
    }
}

/// What the E2B layer remembers beyond strata's own records (lost on a
/// daemon restart, with documented fallbacks).
#[derive(Debug, Default)]
pub struct E2bState {
    /// Processes started through envd: (sandbox id, pid) -> how they were started.
    pub procs: HashMap<(String, u64), envd::ProcMeta>,
    /// Preview tokens made for port routing: (sandbox id, port, SHA-256 of the
    /// caller's key) -> (token, when to make a new one).
    pub port_previews: HashMap<(String, u16, String), (String, std::time::Instant)>,
    /// Directory watchers (`CreateWatcher`): id -> watcher.
    pub watchers: HashMap<String, envd::Watcher>,
    /// Template builds of the template SDK: build id -> build.
    pub builds: HashMap<String, templates::TemplateBuild>,
}

/// The E2B layer: the engine it translates onto and its own state.
pub struct E2b {
    /// The engine.
    pub st: Shared,
    /// The operator's token (`<state>/api-token`): a key equal to it is the operator.
    pub operator_token: Arc<String>,
    /// The preview proxy's keep-alive pool (port routing).
    pub previews: Arc<PreviewPool>,
    /// Shared state.
    pub state: Mutex<E2bState>,
}

/// Shared handle.
pub type SharedE2b = Arc<E2b>;

impl E2b {
    /// A layer over the engine `st`.
    pub fn new(st: Shared, operator_token: Arc<String>, previews: Arc<PreviewPool>) -> SharedE2b {
        Arc::new(E2b { st, operator_token, previews, state: Mutex::new(E2bState::default()) })
    }

    /// The engine as the caller of this request ([`audit::authenticate`] made
    /// it from the request's key), or why there is none: no key, or a key the
    /// daemon does not take (`what` names where the key goes, for the message).
    pub fn native(&self, who: &audit::Who, headers: &HeaderMap, what: &str) -> Result<Engine, E2bError> {
        if let Some(caller) = &who.0 {
            return Ok(Engine::new(self.st.clone(), caller.clone()));
        }
        match request_token(headers) {
            None => Err(E2bError::Unauthorized(format!("missing {what}"))),
            Some(key) => match strata_engine::tenancy::bearer_caller(&self.st, &self.operator_token, &key) {
                // Authenticated after all (e.g. a token made between the two looks): use it.
                Ok(caller) => Ok(Engine::new(self.st.clone(), caller)),
                Err(e) => Err(E2bError::Unauthorized(e.body.message)),
            },
        }
    }

    /// The caller a sandbox's envd access token stands for ([`access`]): the
    /// sandbox's tenant, when the request's key is the token of the sandbox
    /// its `E2b-Sandbox-Id` names (a full id). Only envd and the sandbox's
    /// ports take it; the control plane does not.
    pub fn envd_caller(&self, headers: &HeaderMap) -> Option<strata_engine::tenancy::Caller> {
        let sandbox = headers.get("e2b-sandbox-id")?.to_str().ok()?;
        let key = request_token(headers)?;
        self.envd_token_caller(sandbox, &key)
    }

    /// The caller of `sandbox`'s envd access token `token`, if it is that.
    pub fn envd_token_caller(&self, sandbox: &str, token: &str) -> Option<strata_engine::tenancy::Caller> {
        if !access::is_envd_token(&self.operator_token, sandbox, token) {
            return None;
        }
        let tenant = self.st.db.sandbox_tenant_by_id(sandbox).ok()??;
        Some(strata_engine::tenancy::Caller {
            principal: strata_engine::caller::Principal::Tenant {
                tenant,
                token_id: format!("envd-{sandbox}"),
                token_name: "envd access token".into(),
            },
            acting_as: None,
            approval: None,
        })
    }

    /// [`E2b::native`] for a call to a sandbox's envd or ports: its envd
    /// access token is taken too.
    pub fn envd_native(&self, who: &audit::Who, headers: &HeaderMap, what: &str) -> Result<Engine, E2bError> {
        match self.native(who, headers, what) {
            Err(err) => match self.envd_caller(headers) {
                Some(caller) => Ok(Engine::new(self.st.clone(), caller)),
                None => Err(err),
            },
            ok => ok,
        }
    }

    /// Locks the state (a poisoned lock is taken over: the maps stay usable).
    pub fn lock(&self) -> std::sync::MutexGuard<'_, E2bState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The token a request carries: `X-API-Key`, `X-Access-Token` or a bearer token.
pub fn request_token(headers: &HeaderMap) -> Option<String> {
    for name in ["x-api-key", "x-access-token"] {
        if let Some(v) = headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim).filter(|v| !v.is_empty()) {
            return Some(v.to_string());
        }
    }
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
}

/// Mounts the E2B API on the daemon's TCP app: the control-plane routes next
/// to the native ones (they do their own authentication), and, in front of
/// everything, [`dispatch`] for requests addressed to a sandbox.
pub fn mount(native: Router, e2b: SharedE2b) -> Router {
    let envd_router = envd::router(e2b.clone())
        .layer(axum::middleware::from_fn_with_state(e2b.clone(), audit::record))
        .layer(axum::middleware::from_fn_with_state(e2b.clone(), audit::authenticate_envd));
    native
        .merge(with_caller(control::router(e2b.clone()), &e2b))
        .layer(axum::middleware::from_fn_with_state((envd_router, e2b), dispatch))
}

/// `router` behind [`audit::authenticate`] and [`audit::record`].
fn with_caller(router: Router, e2b: &SharedE2b) -> Router {
    router
        .layer(axum::middleware::from_fn_with_state(e2b.clone(), audit::record))
        .layer(axum::middleware::from_fn_with_state(e2b.clone(), audit::authenticate))
}

/// Routes a request carrying `E2b-Sandbox-Id` by its `E2b-Sandbox-Port`: envd's
/// port to strata's envd; any other port through the preview proxy
/// (`route_port`). Requests without the header pass through.
///
/// The header is made exact first: anything but a full id (a name, a prefix)
/// is resolved once with the caller's key and replaced by the id it names for
/// that caller, so the E2B layer's own maps (process tags and configs, port
/// previews, watchers) are only ever keyed by full ids — a prefix that means
/// different sandboxes to different tenants never shares an entry. A header
/// that resolves to nothing is left as it is (the native calls answer 404).
pub async fn dispatch(State((envd_router, e2b)): State<(Router, SharedE2b)>, mut req: Request, next: Next) -> Response {
    if !req.headers().contains_key("e2b-sandbox-id") {
        if let Some(id) = envd_host(req.headers()) {
            // E2B's own addressing, `49983-<id>.<domain>` (an SDK without
            // E2B_SANDBOX_URL, a signed URL opened by a browser): as the headers say it.
            if let Ok(v) = axum::http::HeaderValue::from_str(&id) {
                req.headers_mut().insert("e2b-sandbox-id", v);
                req.headers_mut().insert("e2b-sandbox-port", axum::http::HeaderValue::from(ENVD_PORT));
            }
        }
    }
    let Some(mut sandbox) = req.headers().get("e2b-sandbox-id").and_then(|v| v.to_str().ok()).map(str::to_string)
    else {
        return next.run(req).await;
    };
    // The sandbox as the caller sees it (no activity, no resume): its full id,
    // and whether it is paused (without a key, envd answers 401 itself).
    let who = audit::Who(req.extensions().get::<strata_engine::tenancy::Caller>().cloned());
    let found = match e2b.envd_native(&who, req.headers(), "key") {
        Ok(native) => Some(native.get_sandbox(&sandbox).await),
        Err(_) => None,
    };
    if let Some(Ok(s)) = &found {
        if s.id != sandbox {
            if let Ok(v) = axum::http::HeaderValue::from_str(&s.id) {
                req.headers_mut().insert("e2b-sandbox-id", v);
                sandbox = s.id.clone();
            }
        }
    }
    let port =
        req.headers().get("e2b-sandbox-port").and_then(|v| v.to_str().ok()).map(str::trim).unwrap_or("").to_string();
    let health = req.uri().path() == "/health";
    match port.parse::<u16>() {
        Ok(1..) if let Some(r) = unavailable(&sandbox, found.as_ref(), health) => r,
        Ok(ENVD_PORT) => {
            use tower::ServiceExt;
            match envd_router.oneshot(req).await {
                Ok(r) => r,
                Err(never) => match never {},
            }
        }
        Ok(p) if p > 0 => match route_port(&e2b, &sandbox, p, req).await {
            Ok(r) => r,
            Err(e) => e.into_response(),
        },
        _ => {
            let msg = format!("E2b-Sandbox-Port {port:?} is not a port number");
            (StatusCode::BAD_REQUEST, axum::Json(serde_json::json!({"code": 400, "message": msg}))).into_response()
        }
    }
}

/// The sandbox a `Host: 49983-<id>.<domain>` names (E2B's host for a
/// sandbox's envd; `<id>` a full strata id, 16 hex digits).
fn envd_host(headers: &HeaderMap) -> Option<String> {
    let host = headers.get(axum::http::header::HOST)?.to_str().ok()?;
    let (label, domain) = host.split_once('.')?;
    let id = label.strip_prefix(&format!("{ENVD_PORT}-"))?;
    let full = id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
    (full && !domain.is_empty()).then(|| id.to_string())
}

/// E2B's proxy answer (502, which the SDK reads as "not running") for a call
/// that must not reach the sandbox: a health probe of a paused (parked) or
/// unknown sandbox — a probe never resumes one — and any call to a paused
/// sandbox created with `autoResume: {"enabled": false}`, which stays paused
/// until `connect()`. `None`: the call goes on (resuming the sandbox on access).
fn unavailable(
    sandbox: &str,
    found: Option<&Result<strata_api::Sandbox, EngineError>>,
    health: bool,
) -> Option<Response> {
    let message = match found? {
        Err(e) if health && e.body.code == strata_api::ErrorCode::SandboxNotFound => {
            format!("The sandbox {sandbox} was not found")
        }
        Ok(s) if control::is_paused(s) && health => format!("The sandbox {sandbox} is paused"),
        Ok(s) if control::is_paused(s) && !s.policy.resume_on_access => format!(
            "The sandbox {sandbox} is paused and does not resume on access (autoResume is off): Sandbox.connect() resumes it"
        ),
        _ => return None,
    };
    let body = serde_json::json!({"code": 502, "message": message, "sandboxId": sandbox});
    Some((StatusCode::BAD_GATEWAY, axum::Json(body)).into_response())
}

/// How long a preview made for port routing lives (it is remade before it ends).
const PORT_PREVIEW_TTL: std::time::Duration = std::time::Duration::from_secs(3600);

/// Sends a request for `port` of `sandbox` through strata's preview proxy: the
/// caller's key makes (once an hour per key, sandbox and port) a token preview
/// of that port — so tenancy, the Rule of Two (a preview is external
/// communication) and the audit log apply — and the request is served, with
/// that token, as `/preview/<id>/<port>/...` by the proxy, in-process.
/// WebSocket upgrades are not passed through this way (use a preview URL).
async fn route_port(e: &SharedE2b, sandbox: &str, port: u16, req: Request) -> Result<Response, E2bError> {
    let key = request_token(req.headers()).ok_or_else(|| {
        E2bError::Unauthorized("missing API key (X-API-Key or X-Access-Token) for sandbox port routing".into())
    })?;
    let not_found = |err: EngineError| match err.body.code {
        strata_api::ErrorCode::SandboxNotFound => E2bError::NotFound(format!("sandbox \"{sandbox}\" not found")),
        _ => E2bError::Engine(err),
    };
    let caller = match strata_engine::tenancy::bearer_caller(&e.st, &e.operator_token, &key) {
        Ok(c) => c,
        // The sandbox's envd access token opens its ports too.
        Err(err) => e.envd_token_caller(sandbox, &key).ok_or(E2bError::Unauthorized(err.body.message))?,
    };
    let client = Engine::new(e.st.clone(), caller);
    let cache_key = (sandbox.to_string(), port, strata_engine::tenancy::secret_hash(&key));
    let cached = e
        .lock()
        .port_previews
        .get(&cache_key)
        .filter(|(_, renew)| *renew > std::time::Instant::now())
        .map(|(t, _)| t.clone());
    let token = match cached {
        // The key is checked again on every request, as a native call would
        // check it: a revoked or expired key (or one that no longer sees the
        // sandbox) is refused now, not when the cached preview ends.
        Some(t) => {
            client.sandbox_id(sandbox).await.map_err(not_found)?;
            t
        }
        None => {
            let made = client
                .create_preview(
                    sandbox,
                    &strata_api::CreatePreviewRequest {
                        port: Some(port),
                        public: false,
                        ttl_secs: Some(PORT_PREVIEW_TTL.as_secs()),
                    },
                )
                .await;
            // The preview is a change the caller made: in the audit log like a native create.
            let status = match &made {
                Ok(_) => StatusCode::CREATED,
                Err(err) => crate::error::status_of(err.body.code),
            };
            let caller = client.caller();
            let route = "e2b:(port routing) /v1/sandboxes/{id}/previews";
            strata_engine::audit_log::append(
                &e.st,
                &caller.actor(),
                caller.scope(),
                "POST",
                route,
                Some(sandbox),
                status.as_u16(),
            );
            let created = made.map_err(not_found)?;
            let renew = std::time::Instant::now() + PORT_PREVIEW_TTL / 2;
            let mut state = e.lock();
            let now = std::time::Instant::now();
            state.port_previews.retain(|_, (_, r)| *r > now);
            state.port_previews.insert(cache_key, (created.token.clone(), renew));
            created.token
        }
    };
    let (mut parts, body) = req.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let uri: axum::http::Uri = format!(
        "/preview/{sandbox}/{port}{}",
        if path.starts_with('/') { path.to_string() } else { format!("/{path}") }
    )
    .parse()
    .map_err(|_| E2bError::BadRequest(format!("invalid path {path:?}")))?;
    for h in ["e2b-sandbox-id", "e2b-sandbox-port", "x-api-key", "x-access-token", "authorization"] {
        parts.headers.remove(h);
    }
    parts.headers.insert(
        strata_api::PREVIEW_TOKEN_HEADER,
        axum::http::HeaderValue::from_str(&token).map_err(|_| E2bError::BadRequest("unusable preview token".into()))?,
    );
    parts.uri = uri;
    Ok(crate::native::preview::serve_path(&e.st, &e.previews, Request::from_parts(parts, body)).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(h: &str) -> Option<String> {
        let mut headers = HeaderMap::new();
        headers.insert(axum::http::header::HOST, h.parse().unwrap());
        envd_host(&headers)
    }

    #[test]
    fn envd_hosts_name_a_full_sandbox_id() {
        assert_eq!(host("49983-0123456789abcdef.sandbox.example").as_deref(), Some("0123456789abcdef"));
        assert_eq!(host("49983-0123456789abcdef.localhost:3000").as_deref(), Some("0123456789abcdef"));
        assert_eq!(host("8080-0123456789abcdef.sandbox.example"), None, "other ports are previews");
        assert_eq!(host("49983-0123456789ABCDEF.x"), None);
        assert_eq!(host("49983-0123.x"), None, "a prefix is not an id");
        assert_eq!(host("49983-0123456789abcdef"), None, "no domain");
        assert_eq!(host("127.0.0.1:8080"), None);
    }
}
