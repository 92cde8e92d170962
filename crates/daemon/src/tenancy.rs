//! Tenants and API tokens: who a caller is, what it may see, and the token
//! management routes.
//!
//! - **Who**: [`authenticate`] runs outermost on both listeners. A Unix-socket
//!   caller (root-only socket) and a TCP caller with the legacy
//!   `<state>/api-token` are the *operator*; a TCP caller with a token from
//!   `POST /v1/tokens` is that token's *tenant*. The token is looked up on
//!   every request (no cache), so a revoke or an expiry counts from the next
//!   request on. The operator may act as one tenant with the
//!   [`strata_api::TENANT_HEADER`] header (it then creates in and sees only
//!   that tenant); a tenant token may name only its own tenant.
//! - **What**: [`guard`] classifies every route ([`route_policy`]): routes
//!   whose first path parameter names an owned object (a sandbox and all its
//!   sub-routes, a checkpoint, a template, a pipeline run, a cost record, a
//!   lineage/scan target) are resolved here once, and an object of another
//!   tenant answers exactly like an unknown id (404, same body). Routes not in
//!   the table are operator-only, so a new route is closed to tenants until it
//!   is classified. Ids named in request bodies and listings are filtered
//!   through [`visible`] / [`find_sandbox`] / [`find_checkpoint`], which read
//!   the caller from a task-local set by [`authenticate`] (spawned work keeps
//!   it with [`spawn`]).
//! - **Keys resolve exactly, and only among the caller's own objects**: exact
//!   id, exact name, id prefix unique among them ([`strata_core::ids`]), so an
//!   object of another tenant can neither shadow a name or prefix nor make it
//!   ambiguous. A route naming a second object under the first (a lease,
//!   preview or process of a sandbox) looks that one up *within* the first.
//! - **Owned objects** record their tenant: a sandbox the caller's (or, when
//!   made from a checkpoint or template, that source's), a checkpoint its
//!   sandbox's (in SQL, so automatic checkpoints inherit it), a template its
//!   checkpoint's, a pipeline run the caller's. Images are shared read-only.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::extract::{MatchedPath, Path, Query, RawPathParams, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use strata_api::{CreateTokenRequest, CreatedToken, ErrorCode, TokenInfo, TokenQuery, DEFAULT_TENANT, TENANT_HEADER};
use strata_core::{ids, units};
use strata_store::db::SandboxRecord;

use crate::error::{ApiError, ApiResult};
use crate::sandboxes::now;
use crate::state::Shared;

/// Prefix of the secrets `POST /v1/tokens` prints.
pub const SECRET_PREFIX: &str = "strata_";

/// How often `last_used_at` is written at most.
const TOUCH_EVERY: Duration = Duration::from_secs(60);

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// The Unix-socket caller or the holder of `<state>/api-token`: every tenant, token management.
    Operator {
        /// As the audit log names it (`uid:0`, `token:<fingerprint>`).
        actor: String,
    },
    /// The holder of a tenant token: its tenant only.
    Tenant {
        /// The token's tenant.
        tenant: String,
        /// Token id.
        token_id: String,
        /// Token name.
        token_name: String,
    },
}

/// An authenticated caller and the tenant it acts in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// Who.
    pub principal: Principal,
    /// For the operator: the tenant named with `X-Strata-Tenant`, if any.
    pub acting_as: Option<String>,
    /// The approval the request cites (`X-Strata-Approval`), for the Rule of Two.
    pub approval: Option<String>,
}

impl Caller {
    /// The operator, acting in no particular tenant.
    pub fn operator(actor: impl Into<String>) -> Self {
        Caller { principal: Principal::Operator { actor: actor.into() }, acting_as: None, approval: None }
    }

    /// The only tenant this caller sees; `None` means every tenant.
    pub fn scope(&self) -> Option<&str> {
        match &self.principal {
            Principal::Tenant { tenant, .. } => Some(tenant),
            Principal::Operator { .. } => self.acting_as.as_deref(),
        }
    }

    /// Whether the caller may see an object of `tenant`.
    pub fn sees(&self, tenant: &str) -> bool {
        self.scope().is_none_or(|t| t == tenant)
    }

    /// Whether the caller is the operator (token management, host-wide routes).
    pub fn is_operator(&self) -> bool {
        matches!(self.principal, Principal::Operator { .. })
    }

    /// The tenant new root objects (sandboxes from images, pipeline runs) go to.
    pub fn creating_tenant(&self) -> String {
        self.scope().unwrap_or(DEFAULT_TENANT).to_string()
    }

    /// The audit log's name for the caller.
    pub fn actor(&self) -> String {
        match &self.principal {
            Principal::Operator { actor } => actor.clone(),
            Principal::Tenant { token_id, token_name, .. } => format!("token:{token_id}:{token_name}"),
        }
    }
}

tokio::task_local! {
    static CALLER: Caller;
}

/// The caller of the request this task serves; `None` in the daemon's own
/// background work (policy engine, reapers), which acts for every tenant.
pub fn current() -> Option<Caller> {
    CALLER.try_with(Caller::clone).ok()
}

/// Whether the current caller may see an object of `tenant` (background work sees all).
pub fn visible(tenant: &str) -> bool {
    CALLER.try_with(|c| c.sees(tenant)).unwrap_or(true)
}

/// The only tenant the current caller sees, if it is restricted.
pub fn scope() -> Option<String> {
    CALLER.try_with(|c| c.scope().map(str::to_string)).ok().flatten()
}

/// The tenant new root objects of the current caller go to (`default` in background work).
pub fn creating_tenant() -> String {
    CALLER.try_with(Caller::creating_tenant).unwrap_or_else(|_| DEFAULT_TENANT.to_string())
}

/// Whether the current caller may make the daemon read paths on its host
/// (secret `host_file`, template build `COPY` context): the operator and the
/// daemon's own work, never a tenant token.
pub fn may_read_host_paths() -> bool {
    CALLER.try_with(Caller::is_operator).unwrap_or(true)
}

/// Runs `fut` as `caller` (what [`authenticate`] does for a request).
pub async fn run_as<F: Future>(caller: Caller, fut: F) -> F::Output {
    CALLER.scope(caller, fut).await
}

/// Runs `fut` as the daemon acting in `tenant` (resumed pipeline runs).
pub async fn run_in_tenant<F: Future>(tenant: &str, fut: F) -> F::Output {
    let caller = Caller {
        principal: Principal::Operator { actor: "daemon".into() },
        acting_as: Some(tenant.to_string()),
        approval: None,
    };
    CALLER.scope(caller, fut).await
}

/// `tokio::spawn` that keeps the current caller: work a request starts in the
/// background sees and creates what the request would.
pub fn spawn<F>(fut: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    match current() {
        Some(c) => tokio::spawn(CALLER.scope(c, fut)),
        None => tokio::spawn(fut),
    }
}

/// The sandbox a caller's key names, resolved among the sandboxes the current
/// caller may see (exact id, exact name, unique id prefix: see
/// [`strata_core::ids`]); another tenant's sandbox is never looked at.
pub fn find_sandbox(st: &Shared, key: &str) -> ApiResult<Option<SandboxRecord>> {
    Ok(st.db.find_sandbox(key, scope().as_deref())?)
}

/// The id of the sandbox [`find_sandbox`] resolves `key` to.
pub fn resolve_sandbox_id(st: &Shared, key: &str) -> ApiResult<Option<String>> {
    Ok(st.db.resolve_sandbox_id(key, scope().as_deref())?)
}

/// The checkpoint (with its image config) a caller's key names, resolved among
/// the checkpoints the current caller may see.
pub fn find_checkpoint(st: &Shared, key: &str) -> ApiResult<Option<(strata_api::Checkpoint, strata_api::ImageConfig)>> {
    Ok(st.db.find_checkpoint(key, scope().as_deref())?)
}

/// A sandbox or a checkpoint, as one key of a route that takes either names.
#[derive(Debug, Clone)]
pub enum SandboxOrCheckpoint {
    /// A sandbox.
    Sandbox(Box<SandboxRecord>),
    /// A checkpoint, with its image config.
    Checkpoint(Box<(strata_api::Checkpoint, strata_api::ImageConfig)>),
}

/// Which kind wins when a sandbox and a checkpoint have the same name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NamesFirst {
    /// The sandbox (lineage, scan).
    Sandbox,
    /// The checkpoint (fork and template sources: a saved state over a live one).
    Checkpoint,
}

/// The sandbox or checkpoint a key names, among those the current caller may
/// see, in the order of [`strata_core::ids`] across both kinds: an exact id
/// (ids are random, so at most one matches), an exact name (`names_first`
/// decides between a sandbox and a checkpoint of the same name), then an id
/// prefix only one of them has.
pub fn find_sandbox_or_checkpoint(
    st: &Shared,
    key: &str,
    names_first: NamesFirst,
) -> ApiResult<Option<SandboxOrCheckpoint>> {
    use SandboxOrCheckpoint::*;
    let sandbox = find_sandbox(st, key)?;
    let checkpoint = find_checkpoint(st, key)?;
    let s = |pick: &dyn Fn(&str, &str) -> bool| {
        sandbox.as_ref().filter(|r| pick(&r.sandbox.id, &r.sandbox.name)).map(|r| Sandbox(Box::new(r.clone())))
    };
    let c = |pick: &dyn Fn(&str, &str) -> bool| {
        checkpoint.as_ref().filter(|(c, _)| pick(&c.id, &c.name)).map(|c| Checkpoint(Box::new(c.clone())))
    };
    let by_id = |id: &str, _: &str| id == key;
    let by_name = |_: &str, name: &str| name == key;
    let named = match names_first {
        NamesFirst::Sandbox => s(&by_name).or_else(|| c(&by_name)),
        NamesFirst::Checkpoint => c(&by_name).or_else(|| s(&by_name)),
    };
    if let Some(found) = s(&by_id).or_else(|| c(&by_id)).or(named) {
        return Ok(Some(found));
    }
    Ok(match (sandbox, checkpoint) {
        (Some(r), None) => Some(Sandbox(Box::new(r))),
        (None, Some(c)) => Some(Checkpoint(Box::new(c))),
        _ => None,
    })
}

/// A template's checkpoint id and creation time, if the current caller may see it
/// (templates are named, never resolved by id or prefix).
pub fn find_template(st: &Shared, name: &str) -> ApiResult<Option<(String, String)>> {
    match st.db.template_tenant(name)? {
        Some(t) if visible(&t) => Ok(st.db.get_template(name)?),
        _ => Ok(None),
    }
}

/// The pipeline run a caller's key names (id, or an id prefix unique among the
/// runs the current caller may see).
pub fn find_pipeline_run(st: &Shared, key: &str) -> ApiResult<Option<strata_api::PipelineRun>> {
    Ok(st.db.find_pipeline_run(key, scope().as_deref())?)
}

/// The usage record a caller's key names (destroyed sandboxes included),
/// resolved among the records the current caller may see.
pub fn find_usage(st: &Shared, key: &str) -> ApiResult<Option<strata_api::UsageRecord>> {
    Ok(st.db.find_usage(key, scope().as_deref())?)
}

// ---- authentication ----

/// Which listener a request came in on.
#[derive(Debug, Clone)]
pub enum Listener {
    /// The root-only Unix socket: the operator.
    Unix,
    /// TCP: a bearer token is required; `legacy` is `<state>/api-token` (the operator's).
    Tcp {
        /// The operator's token.
        legacy: Arc<String>,
    },
}

fn unauthorized(message: &str) -> Response {
    let mut r = ApiError::new(ErrorCode::Unauthorized, message).into_response();
    r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// sha256 (hex) of a token secret, as stored.
pub fn secret_hash(secret: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(secret.as_bytes()))
}

/// Why a bearer secret was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenRejection {
    /// No token has this secret.
    #[error("unknown bearer token")]
    Unknown,
    /// The token was revoked.
    #[error("this token was revoked")]
    Revoked,
    /// The token's lifetime is over.
    #[error("this token has expired")]
    Expired,
}

/// Whether a token (as stored) is usable at `now`.
pub fn check_token(t: &TokenInfo, now: SystemTime) -> Result<(), TokenRejection> {
    if t.revoked_at.is_some() {
        return Err(TokenRejection::Revoked);
    }
    if let Some(exp) = &t.expires_at {
        // An unreadable expiry is treated as expired (fail closed).
        match humantime::parse_rfc3339_weak(exp) {
            Ok(at) if at > now => {}
            _ => return Err(TokenRejection::Expired),
        }
    }
    Ok(())
}

/// The tenant caller of a tenant-token secret (looked up now: no cache, so a
/// revoke counts from the next request). Also for other front ends on the TCP
/// listener (e.g. an E2B-compatible API key).
pub fn tenant_caller(st: &Shared, secret: &str) -> Result<Caller, ApiError> {
    let reject = |r: TokenRejection| ApiError::new(ErrorCode::Unauthorized, r.to_string());
    let t = st.db.token_by_hash(&secret_hash(secret))?.ok_or_else(|| reject(TokenRejection::Unknown))?;
    check_token(&t, SystemTime::now()).map_err(reject)?;
    let now_t = SystemTime::now();
    let stale = humantime::format_rfc3339_millis(now_t - TOUCH_EVERY).to_string();
    if let Err(e) = st.db.touch_token(&t.id, &now(), &stale) {
        tracing::warn!(error = %e, token = %t.id, "recording token use");
    }
    Ok(Caller {
        principal: Principal::Tenant { tenant: t.tenant, token_id: t.id, token_name: t.name },
        acting_as: None,
        approval: None,
    })
}

/// Middleware (outermost): establishes the [`Caller`] of every request, or refuses it with 401/403.
pub async fn authenticate(State((st, listener)): State<(Shared, Listener)>, mut req: Request, next: Next) -> Response {
    let mut caller = match &listener {
        Listener::Unix => Caller::operator(crate::audit::actor_of(&req)),
        Listener::Tcp { legacy } => {
            let Some(secret) = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::trim)
            else {
                return unauthorized("missing bearer token (Authorization: Bearer <token>; see `strata token create` or <state-dir>/api-token)");
            };
            if constant_time_eq(secret.as_bytes(), legacy.as_bytes()) {
                Caller::operator(crate::audit::token_actor(legacy).0)
            } else {
                match tenant_caller(&st, secret) {
                    Ok(c) => c,
                    Err(e) if e.body.code == ErrorCode::Unauthorized => return unauthorized(&e.body.message),
                    Err(e) => return e.into_response(),
                }
            }
        }
    };
    if let Some(v) = req.headers().get(TENANT_HEADER) {
        let t = match v.to_str().map(str::trim) {
            Ok(t) if validate_tenant(t).is_ok() => t.to_string(),
            _ => {
                return ApiError::bad_request(format!(
                    "header {TENANT_HEADER}: {}",
                    validate_tenant(&String::from_utf8_lossy(v.as_bytes())).err().unwrap_or_default()
                ))
                .into_response()
            }
        };
        match &caller.principal {
            Principal::Tenant { tenant, .. } if *tenant != t => {
                return ApiError::new(
                    ErrorCode::Forbidden,
                    format!("a tenant token acts only in its own tenant; {TENANT_HEADER} names another"),
                )
                .into_response();
            }
            Principal::Tenant { .. } => {}
            Principal::Operator { .. } => caller.acting_as = Some(t),
        }
    }
    if let Some(v) = req.headers().get(strata_api::APPROVAL_HEADER) {
        match v.to_str().map(str::trim) {
            Ok(a) if crate::approvals::valid_id(a) => caller.approval = Some(a.to_string()),
            _ => {
                return ApiError::bad_request(format!(
                    "header {}: not an approval id (apr-<hex>)",
                    strata_api::APPROVAL_HEADER
                ))
                .into_response()
            }
        }
    }
    req.extensions_mut().insert(crate::audit::Actor(caller.actor()));
    req.extensions_mut().insert(caller.clone());
    CALLER.scope(caller, next.run(req)).await
}

/// A tenant name: like a sandbox name (letters, digits, `-`, `_`, `.`; at most 63; starts alphanumeric).
pub fn validate_tenant(t: &str) -> Result<(), String> {
    ids::validate_name(t, false).map_err(|_| format!("invalid tenant {t:?}: letters, digits, '-', '_', '.', at most 63 characters, starting with a letter or digit"))
}

// ---- route classification ----

/// What kind of owned object a route's first path parameter names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owned {
    /// A sandbox by id, name or prefix among the caller's own (destroyed ones by id, via their usage record).
    Sandbox,
    /// A sandbox's cost record (destroyed sandboxes included).
    Usage,
    /// A checkpoint.
    Checkpoint,
    /// A template by name.
    Template,
    /// A pipeline run.
    Pipeline,
    /// A sandbox or else a checkpoint (lineage, scan).
    SandboxOrCheckpoint,
    /// A Rule-of-Two approval.
    Approval,
}

/// How a route treats tenant callers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoutePolicy {
    /// Open to tenants; the handler filters what it lists and checks ids in its body.
    Open,
    /// Open to tenants whose tenant owns the object named by the first path parameter.
    Owned(Owned),
    /// The operator only (403 for tenant tokens).
    Operator,
}

/// Routes that are operator-only by design (403 for tenant tokens). Every
/// other route must be classified in [`route_policy`]; a unit test fails for a
/// route of the router that is in neither place, so no route is left to chance.
pub const OPERATOR_ONLY: &[&str] = &[
    "/v1/tokens",
    "/v1/tokens/{id}",
    // Quota overrides are the operator's, like tokens (a tenant reads its usage).
    "/v1/tenants/{tenant}/quota",
    // Reads paths on the daemon's host, changes what every tenant shares.
    "/v1/images/import",
    "/v1/images/pull",
    // Collects across tenants.
    "/v1/gc",
    // Host-wide: capabilities, series labelled with every sandbox id, the whole chain.
    "/v1/doctor",
    "/metrics",
    "/v1/audit/verify",
    // An agent holding a tenant token must not approve its own request.
    "/v1/approvals/{id}/approve",
    "/v1/approvals/{id}/deny",
];

/// The tenancy policy of a route (its template as matched). Anything not
/// listed is operator-only: a new route is closed to tenants until classified here.
pub fn route_policy(method: &Method, route: &str) -> RoutePolicy {
    use RoutePolicy::*;
    let read = matches!(*method, Method::GET | Method::HEAD);
    if route.starts_with("/v1/sandboxes/{id}") {
        // Every sub-route of a sandbox (exec, files, processes, checkpoints, network, ...).
        return Owned(self::Owned::Sandbox);
    }
    if route.starts_with("/v1/pipelines/{id}") {
        return Owned(self::Owned::Pipeline);
    }
    match route {
        "/openapi.json" | "/v1/info" | "/v1/advise" | "/v1/events" | "/v1/cost" | "/v1/audit" => Open,
        // MCP: its tools call the API with the caller's own token, where tenancy applies.
        "/mcp" => Open,
        "/v1/sandboxes"
        | "/v1/checkpoints"
        | "/v1/fork"
        | "/v1/fanout"
        | "/v1/pipelines"
        | "/v1/templates"
        | "/v1/templates/build" => Open,
        // Images are shared, read-only for tenants.
        "/v1/images" | "/v1/images/{name}" if read => Open,
        "/v1/checkpoints/{id}" => Owned(self::Owned::Checkpoint),
        "/v1/templates/{name}" => Owned(self::Owned::Template),
        "/v1/cost/{id}" => Owned(self::Owned::Usage),
        "/v1/lineage/{id}" | "/v1/scan/{id}" => Owned(self::Owned::SandboxOrCheckpoint),
        // Approvals (Rule of Two): a tenant lists and reads its own (to wait for
        // a decision); deciding is for the operator, a human (see OPERATOR_ONLY).
        "/v1/approvals" => Open,
        "/v1/approvals/{id}" => Owned(self::Owned::Approval),
        // A tenant's own usage against its quota (the handler refuses another tenant's).
        "/v1/tenants/{tenant}/usage" if read => Open,
        //
        // Operator-only: tokens, image import/pull/removal, gc, doctor,
        // /metrics (host-wide series), audit verification (needs every entry).
        _ => Operator,
    }
}

/// The 404 an unknown `key` of `kind` gets from its handler; an object of another tenant gets exactly this.
fn not_found(kind: Owned, key: &str) -> ApiError {
    match kind {
        Owned::Sandbox | Owned::Usage => ApiError::sandbox_not_found(key),
        Owned::Checkpoint => crate::checkpoints::not_found(key),
        Owned::Template => crate::templates::not_found(key),
        Owned::Pipeline => crate::pipelines::not_found(key),
        Owned::SandboxOrCheckpoint => {
            ApiError::new(ErrorCode::SandboxNotFound, format!("no sandbox or checkpoint named {key:?}"))
        }
        Owned::Approval => crate::approvals::not_found(key),
    }
}

/// Whether `scope` may reach the object `key` of `kind` names. The key is
/// resolved among `scope`'s own objects only (so another tenant's names and
/// ids neither shadow nor make ambiguous what the caller names); a key that
/// resolves to nothing there passes when it is not the exact id of another
/// tenant's object (the handler answers it: unknown, or for the caller's own
/// destroyed sandbox a 409), and is refused like an unknown key otherwise.
fn owned_by(st: &Shared, kind: Owned, key: &str, scope: &str) -> ApiResult<bool> {
    let s = Some(scope);
    let mine_or_unknown = |tenant: Option<String>| tenant.is_none_or(|t| t == scope);
    // A destroyed sandbox: its usage record remembers the tenant.
    let sandbox = |key: &str| -> ApiResult<bool> {
        Ok(st.db.find_sandbox(key, s)?.is_some() || mine_or_unknown(st.db.sandbox_tenant_by_id(key)?))
    };
    let checkpoint = |key: &str| -> ApiResult<bool> {
        Ok(st.db.find_checkpoint(key, s)?.is_some()
            || mine_or_unknown(st.db.checkpoint_by_id(key)?.map(|(c, _)| c.tenant)))
    };
    Ok(match kind {
        Owned::Sandbox => sandbox(key)?,
        Owned::Usage => {
            st.db.find_usage(key, s)?.is_some() || mine_or_unknown(st.db.usage_by_id(key)?.map(|u| u.tenant))
        }
        Owned::Checkpoint => checkpoint(key)?,
        Owned::Template => st.db.template_tenant(key)?.is_none_or(|t| t == scope),
        Owned::Pipeline => {
            st.db.find_pipeline_run(key, s)?.is_some()
                || mine_or_unknown(st.db.pipeline_run_by_id(key)?.map(|r| r.tenant))
        }
        Owned::Approval => st.db.get_approval(key)?.is_none_or(|a| a.tenant == scope),
        Owned::SandboxOrCheckpoint => sandbox(key)? && checkpoint(key)?,
    })
}

/// Middleware (inside [`authenticate`], outside activity tracking and
/// resume-on-access, so another tenant's request neither resumes nor keeps
/// alive a sandbox): applies [`route_policy`].
pub async fn guard(State(st): State<Shared>, req: Request, next: Next) -> Response {
    let Some(caller) = req.extensions().get::<Caller>().cloned() else {
        return unauthorized("unauthenticated request");
    };
    let Some(route) = req.extensions().get::<MatchedPath>().map(|m| m.as_str().to_string()) else {
        // The fallback (no such route): answered the same for everyone.
        return next.run(req).await;
    };
    let policy = route_policy(req.method(), &route);
    if policy == RoutePolicy::Operator && !caller.is_operator() {
        return ApiError::new(
            ErrorCode::Forbidden,
            format!("{} {route} is for the operator only (a tenant token cannot use it)", req.method()),
        )
        .into_response();
    }
    if let (RoutePolicy::Owned(kind), Some(scope)) = (policy, caller.scope()) {
        let (mut parts, body) = req.into_parts();
        let params = <RawPathParams as axum::extract::FromRequestParts<()>>::from_request_parts(&mut parts, &()).await;
        let key = params.ok().and_then(|p| p.iter().next().map(|(_, v)| v.to_string()));
        if let Some(key) = key {
            match owned_by(&st, kind, &key, scope) {
                Ok(true) => {}
                Ok(false) => return not_found(kind, &key).into_response(),
                Err(e) => return e.into_response(),
            }
        }
        return next.run(Request::from_parts(parts, body)).await;
    }
    next.run(req).await
}

// ---- token management (operator only) ----

fn caller_of(caller: Option<axum::Extension<Caller>>) -> Caller {
    caller.map(|c| c.0).unwrap_or_else(|| Caller::operator("local"))
}

/// Create an API token for a tenant; the secret is in the response only.
#[utoipa::path(post, path = "/v1/tokens", tag = "tokens", request_body = CreateTokenRequest,
    responses((status = 201, body = CreatedToken), (status = 400, body = strata_api::ApiErrorBody), (status = 403, body = strata_api::ApiErrorBody), (status = 409, body = strata_api::ApiErrorBody)))]
pub async fn create_token_handler(
    State(st): State<Shared>,
    caller: Option<axum::Extension<Caller>>,
    Json(req): Json<CreateTokenRequest>,
) -> ApiResult<(StatusCode, Json<CreatedToken>)> {
    let caller = caller_of(caller);
    ids::validate_name(&req.name, false).map_err(|_| {
        ApiError::bad_request(format!(
            "invalid token name {:?}: letters, digits, '-', '_', '.', at most 63 characters",
            req.name
        ))
    })?;
    // Tokens are revoked by id or name: a name must not read as an id.
    ids::validate_new_name(&req.name, false)?;
    let tenant = req.tenant.clone().unwrap_or_else(|| caller.creating_tenant());
    validate_tenant(&tenant).map_err(|e| ApiError::bad_request(format!("tenant: {e}")))?;
    let created = SystemTime::now();
    let expires_at = match &req.expires {
        Some(e) => {
            let d = units::parse_duration(e).map_err(|err| ApiError::bad_request(format!("expires: {err}")))?;
            if d.is_zero() {
                return Err(ApiError::bad_request("expires: must be longer than zero"));
            }
            Some(humantime::format_rfc3339_millis(created + d).to_string())
        }
        None => None,
    };
    let secret = format!("{SECRET_PREFIX}{}", hex::encode(rand::random::<[u8; 32]>()));
    let token = TokenInfo {
        id: ids::new_id(),
        name: req.name,
        tenant,
        created_at: humantime::format_rfc3339_millis(created).to_string(),
        last_used_at: None,
        expires_at,
        revoked_at: None,
    };
    st.db.insert_token(&token, &secret_hash(&secret)).map_err(|e| match e {
        strata_store::DbError::NameTaken(_) => ApiError::new(
            ErrorCode::NameConflict,
            format!("tenant {:?} already has a live token named {:?}", token.tenant, token.name),
        ),
        e => e.into(),
    })?;
    tracing::info!(token = %token.id, name = %token.name, tenant = %token.tenant, "API token created");
    Ok((StatusCode::CREATED, Json(CreatedToken { token, secret })))
}

/// List API tokens (never their secrets).
#[utoipa::path(get, path = "/v1/tokens", tag = "tokens", params(TokenQuery),
    responses((status = 200, body = [TokenInfo]), (status = 403, body = strata_api::ApiErrorBody)))]
pub async fn list_tokens_handler(
    State(st): State<Shared>,
    caller: Option<axum::Extension<Caller>>,
    Query(q): Query<TokenQuery>,
) -> ApiResult<Json<Vec<TokenInfo>>> {
    let caller = caller_of(caller);
    let tenant = q.tenant.clone().or_else(|| caller.scope().map(str::to_string));
    Ok(Json(st.db.list_tokens(tenant.as_deref(), q.all)?))
}

/// Revoke an API token by id, or by name (unique among live tokens; `tenant` narrows the lookup).
/// Refused from the next request on.
#[utoipa::path(delete, path = "/v1/tokens/{id}", tag = "tokens", params(("id" = String, Path, description = "Token id or name"), TokenQuery),
    responses((status = 200, body = TokenInfo), (status = 403, body = strata_api::ApiErrorBody), (status = 404, body = strata_api::ApiErrorBody), (status = 409, description = "the name is used in several tenants", body = strata_api::ApiErrorBody)))]
pub async fn revoke_token_handler(
    State(st): State<Shared>,
    caller: Option<axum::Extension<Caller>>,
    Path(key): Path<String>,
    Query(q): Query<TokenQuery>,
) -> ApiResult<Json<TokenInfo>> {
    let caller = caller_of(caller);
    let tenant = q.tenant.clone().or_else(|| caller.scope().map(str::to_string));
    let found = st.db.find_tokens(&key, tenant.as_deref())?;
    let t = match found.as_slice() {
        [] => return Err(ApiError::new(ErrorCode::TokenNotFound, format!("no token with id or name {key:?}"))),
        [one] => one,
        many => {
            let tenants: Vec<&str> = many.iter().map(|t| t.tenant.as_str()).collect();
            return Err(ApiError::new(
                ErrorCode::NameConflict,
                format!("tokens named {key:?} exist in tenants {tenants:?}: give the id or the tenant"),
            ));
        }
    };
    let revoked = st
        .db
        .revoke_token(&t.id, &now())?
        .ok_or_else(|| ApiError::new(ErrorCode::TokenNotFound, format!("no token with id or name {key:?}")))?;
    tracing::info!(token = %revoked.id, name = %revoked.name, tenant = %revoked.tenant, "API token revoked");
    Ok(Json(revoked))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(t: &str) -> Caller {
        Caller {
            principal: Principal::Tenant { tenant: t.into(), token_id: "abc".into(), token_name: "ci".into() },
            acting_as: None,
            approval: None,
        }
    }

    #[test]
    fn scopes_of_callers() {
        let op = Caller::operator("uid:0");
        assert_eq!(op.scope(), None);
        assert!(op.sees("a") && op.sees("default"));
        assert_eq!(op.creating_tenant(), "default");
        let acting = Caller { acting_as: Some("a".into()), ..op.clone() };
        assert!(acting.sees("a") && !acting.sees("b"));
        assert_eq!(acting.creating_tenant(), "a");
        assert!(acting.is_operator());
        let t = tenant("b");
        assert!(t.sees("b") && !t.sees("a") && !t.sees("default"));
        assert!(!t.is_operator());
        assert_eq!(t.actor(), "token:abc:ci");
    }

    #[test]
    fn routes_are_closed_to_tenants_unless_classified() {
        let (get, post, del) = (Method::GET, Method::POST, Method::DELETE);
        assert_eq!(route_policy(&post, "/v1/sandboxes/{id}/exec"), RoutePolicy::Owned(Owned::Sandbox));
        assert_eq!(route_policy(&get, "/v1/sandboxes/{id}/processes/{pid}/logs"), RoutePolicy::Owned(Owned::Sandbox));
        assert_eq!(route_policy(&del, "/v1/checkpoints/{id}"), RoutePolicy::Owned(Owned::Checkpoint));
        assert_eq!(route_policy(&post, "/v1/pipelines/{id}/resume"), RoutePolicy::Owned(Owned::Pipeline));
        assert_eq!(route_policy(&get, "/v1/images"), RoutePolicy::Open);
        assert_eq!(route_policy(&post, "/v1/images/import"), RoutePolicy::Operator);
        assert_eq!(route_policy(&del, "/v1/images/{name}"), RoutePolicy::Operator);
        for r in [
            "/v1/tokens",
            "/v1/tokens/{id}",
            "/v1/gc",
            "/metrics",
            "/v1/doctor",
            "/v1/audit/verify",
            "/v1/some-future-route",
        ] {
            assert_eq!(route_policy(&get, r), RoutePolicy::Operator, "{r}");
        }
    }

    #[test]
    fn every_route_of_the_router_is_classified() {
        // The routes as written in `router()`: a new one must be classified for
        // tenants (or listed in OPERATOR_ONLY) before this passes.
        let src = include_str!("lib.rs");
        let routes: Vec<&str> = src.split(".route(\"").skip(1).filter_map(|r| r.split('"').next()).collect();
        assert!(routes.len() > 40, "found only {} routes", routes.len());
        for r in routes {
            let open =
                [Method::GET, Method::POST, Method::DELETE].iter().any(|m| route_policy(m, r) != RoutePolicy::Operator);
            if OPERATOR_ONLY.contains(&r) {
                assert!(
                    [Method::GET, Method::POST, Method::DELETE]
                        .iter()
                        .all(|m| route_policy(m, r) == RoutePolicy::Operator),
                    "{r} is listed operator-only but classified open"
                );
            } else {
                assert!(open, "route {r} is not classified for tenants: add it to tenancy::route_policy (Open/Owned) or to OPERATOR_ONLY");
            }
        }
    }

    #[test]
    fn revoked_and_expired_tokens_are_refused() {
        let now = SystemTime::now();
        let fmt = |t: SystemTime| humantime::format_rfc3339_millis(t).to_string();
        let t = TokenInfo {
            id: "1".into(),
            name: "n".into(),
            tenant: "a".into(),
            created_at: fmt(now),
            last_used_at: None,
            expires_at: None,
            revoked_at: None,
        };
        assert_eq!(check_token(&t, now), Ok(()));
        let later = TokenInfo { expires_at: Some(fmt(now + Duration::from_secs(60))), ..t.clone() };
        assert_eq!(check_token(&later, now), Ok(()));
        assert_eq!(check_token(&later, now + Duration::from_secs(61)), Err(TokenRejection::Expired));
        let garbled = TokenInfo { expires_at: Some("soon".into()), ..t.clone() };
        assert_eq!(check_token(&garbled, now), Err(TokenRejection::Expired));
        let revoked = TokenInfo { revoked_at: Some(fmt(now)), ..later };
        assert_eq!(check_token(&revoked, now), Err(TokenRejection::Revoked));
    }

    #[tokio::test]
    async fn the_task_local_caller_follows_spawned_work() {
        assert!(visible("anything"), "background work sees every tenant");
        assert_eq!(creating_tenant(), "default");
        run_as(tenant("a"), async {
            assert!(visible("a") && !visible("b"));
            assert_eq!(creating_tenant(), "a");
            let inner = spawn(async { (visible("a"), visible("b"), scope()) }).await.unwrap();
            assert_eq!(inner, (true, false, Some("a".to_string())));
        })
        .await;
        run_in_tenant("c", async { assert_eq!((creating_tenant(), visible("d")), ("c".to_string(), false)) }).await;
    }
}
