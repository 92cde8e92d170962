//! The E2B control plane (`/sandboxes`, `/v2/sandboxes`, `/snapshots`),
//! mapped onto strata's sandboxes, policies, standby, checkpoints and forks.
//! JSON shapes follow the `e2b` SDK's API models (`e2b/api/client/models`).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime};

use axum::body::Bytes;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post, put};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use strata_api::{
    CheckpointRequest, CreateSandboxRequest, ForkRequest, Lifecycle, OnIdle, PolicyPatch, Sandbox, SandboxState,
    UpdateSandboxRequest,
};
use strata_engine::error::EngineError;
use tracing::info;

use super::audit::Who;
use super::{access, E2bError, SharedE2b, BASE_TEMPLATE, ENVD_VERSION, TEMPLATE_LABEL};
use strata_engine::Engine;

/// Default sandbox timeout of the SDK (seconds).
const DEFAULT_TIMEOUT: u64 = 300;
/// Largest timeout accepted (E2B's own limit for paid plans: 24 h).
const MAX_TIMEOUT: u64 = 24 * 3600;

/// The control-plane routes.
pub fn router(e2b: SharedE2b) -> Router {
    Router::new()
        .route("/sandboxes", get(list_v1).post(create))
        .route("/v2/sandboxes", get(list_v2).post(create))
        .route("/sandboxes/metrics", get(metrics_many))
        .route("/sandboxes/{id}", get(get_one).delete(kill))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/refreshes", post(refresh))
        .route("/sandboxes/{id}/connect", post(connect))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}/resume", post(resume))
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/fork", post(fork))
        .route("/sandboxes/{id}/snapshots", post(snapshot))
        .route("/sandboxes/{id}/metrics", get(metrics))
        .route("/sandboxes/{id}/logs", get(logs_v1))
        .route("/v2/sandboxes/{id}/logs", get(logs_v2))
        .route("/sandboxes/{id}/network", put(network))
        .route("/snapshots", get(list_snapshots))
        .route("/templates", any(templates))
        .route("/templates/{id}", axum::routing::delete(delete_snapshot).fallback(templates))
        .route("/templates/aliases/{alias}", get(super::templates::alias))
        .route("/templates/tags", post(super::templates::assign_tags).delete(super::templates::remove_tags))
        .route("/templates/{id}/tags", get(super::templates::get_tags))
        .route("/templates/{id}/files/{hash}", get(super::templates::files_link))
        .route("/templates/{id}/builds/{build}/status", get(super::templates::build_status))
        .route("/templates/{id}/{*rest}", any(templates))
        .route("/v2/templates", any(templates))
        .route("/v2/templates/{id}/builds/{build}", post(super::templates::start_build))
        .route("/v2/templates/{id}", any(templates))
        .route("/v2/templates/{id}/{*rest}", any(templates))
        .route("/v3/templates", post(super::templates::request_build).fallback(templates))
        .route("/e2b/template-files/{tenant}/{hash}", axum::routing::put(super::templates::upload_files))
        .route("/volumes", any(volumes))
        .route("/volumes/{*rest}", any(volumes))
        .with_state(e2b)
}

/// A control-plane call: the engine as the request's caller (extracting it
/// answers 401 without a usable key), and the daemon's secret the sandboxes'
/// envd access tokens are derived from ([`super::access`]).
pub(super) struct Control {
    pub(super) engine: Engine,
    secret: std::sync::Arc<String>,
}

impl FromRequestParts<SharedE2b> for Control {
    type Rejection = E2bError;

    async fn from_request_parts(parts: &mut Parts, e: &SharedE2b) -> Result<Self, E2bError> {
        let who = Who(parts.extensions.get::<strata_engine::tenancy::Caller>().cloned());
        let engine = e.native(
            &who,
            &parts.headers,
            "API key: send it in the X-API-Key header (a strata API token, e.g. from `strata token create`)",
        )?;
        Ok(Control { engine, secret: e.operator_token.clone() })
    }
}

/// Maps the engine's answer for an unknown sandbox to E2B's 404 with the E2B wording.
fn sandbox_err(id: &str) -> impl FnOnce(EngineError) -> E2bError + '_ {
    move |e| match e.body.code {
        strata_api::ErrorCode::SandboxNotFound => {
            E2bError::NotFound(format!("sandbox \"{id}\" doesn't exist or you don't have access to it"))
        }
        _ => E2bError::Engine(e),
    }
}

/// E2B template id -> strata image/template/checkpoint name.
fn strata_source(template: &str) -> String {
    if template == "base" {
        BASE_TEMPLATE.to_string()
    } else {
        template.to_string()
    }
}

/// The E2B template id of a sandbox.
fn template_of(s: &Sandbox) -> String {
    s.labels.get(TEMPLATE_LABEL).cloned().unwrap_or_else(|| s.source.clone())
}

/// E2B's two states: `running`, or `paused` for everything parked.
fn e2b_state(s: SandboxState) -> &'static str {
    match s {
        SandboxState::Paused | SandboxState::Standby | SandboxState::Stopped | SandboxState::Archived => "paused",
        _ => "running",
    }
}

/// Whether E2B calls the sandbox paused (strata's parked states).
pub fn is_paused(s: &Sandbox) -> bool {
    e2b_state(s.state) == "paused"
}

/// Whether E2B shows the sandbox at all (destroyed, failed and lost ones are gone).
fn visible(s: &Sandbox) -> bool {
    !matches!(s.state, SandboxState::Destroyed | SandboxState::Error | SandboxState::Lost)
}

fn parse_time(s: &str) -> Option<SystemTime> {
    humantime::parse_rfc3339_weak(s).ok().or_else(|| humantime::parse_rfc3339(s).ok())
}

fn fmt_time(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// When the sandbox's timeout ends: creation + `max_lifetime`.
fn end_at(s: &Sandbox) -> String {
    let created = parse_time(&s.created_at).unwrap_or_else(SystemTime::now);
    let life = s
        .policy
        .max_lifetime
        .as_deref()
        .and_then(|m| humantime::parse_duration(m).ok())
        .unwrap_or(Duration::from_secs(MAX_TIMEOUT));
    fmt_time(created + life)
}

fn metadata(s: &Sandbox) -> BTreeMap<String, String> {
    s.labels.iter().filter(|(k, _)| !k.starts_with("e2b.")).map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// The `Sandbox` model (create, connect, resume); `token` is its envd access token.
fn sandbox_json(s: &Sandbox, token: &str) -> Value {
    json!({
        "templateID": template_of(s),
        "sandboxID": s.id,
        "clientID": "strata",
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": token,
        "domain": Value::Null,
    })
}

/// The `SandboxDetail` / `ListedSandbox` model.
fn detail_json(s: &Sandbox, token: Option<&str>) -> Value {
    let mut v = json!({
        "templateID": template_of(s),
        "sandboxID": s.id,
        "alias": template_of(s),
        "clientID": "strata",
        "startedAt": s.created_at,
        "endAt": end_at(s),
        "envdVersion": ENVD_VERSION,
        "cpuCount": s.limits.cpus.map(|c| c.ceil() as u64).unwrap_or(1),
        "memoryMB": s.limits.memory_bytes.map(|m| m / (1024 * 1024)).unwrap_or(0),
        "diskSizeMB": s.limits.disk_bytes.map(|b| b / (1024 * 1024)).unwrap_or(0),
        "state": e2b_state(s.state),
        "metadata": metadata(s),
        "lifecycle": {
            "onTimeout": match s.policy.on_max_lifetime {
                Some(OnIdle::Standby | OnIdle::Stop) => "pause",
                _ => "kill",
            },
            "autoResume": s.policy.resume_on_access,
        },
    });
    if let Some(t) = token {
        v["envdAccessToken"] = json!(t);
    }
    v
}

/// Body of `POST /sandboxes` and `POST /v2/sandboxes` (`NewSandbox`/`NewSandboxV2`).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(default)]
    timeout: Option<u64>,
    #[serde(default)]
    auto_pause: Option<bool>,
    #[serde(default)]
    auto_pause_memory: Option<Value>,
    #[serde(default)]
    auto_resume: Option<Value>,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    env_vars: Option<BTreeMap<String, String>>,
    /// The SDK's model spells this one in snake case.
    #[serde(default, rename = "allow_internet_access", alias = "allowInternetAccess")]
    allow_internet_access: Option<bool>,
    #[serde(default)]
    network: Option<Value>,
    #[serde(default)]
    mcp: Option<Value>,
    #[serde(default)]
    iam: Option<Value>,
    #[serde(default)]
    volume_mounts: Option<Value>,
    #[serde(default)]
    secure: Option<bool>,
}

fn json_body<T: serde::de::DeserializeOwned>(body: &Bytes, what: &str) -> Result<T, E2bError> {
    let body: &[u8] = if body.is_empty() { b"{}" } else { body };
    serde_json::from_slice(body).map_err(|e| E2bError::BadRequest(format!("malformed {what} body: {e}")))
}

fn check_timeout(t: u64) -> Result<u64, E2bError> {
    if t > MAX_TIMEOUT {
        return Err(E2bError::BadRequest(format!("timeout {t}s exceeds the maximum of {MAX_TIMEOUT}s")));
    }
    Ok(t.max(1))
}

/// `POST /sandboxes`, `POST /v2/sandboxes`: create from a template.
async fn create(call: Control, body: Bytes) -> Result<Response, E2bError> {
    let Control { engine: client, secret } = call;
    let req: NewSandbox = json_body(&body, "NewSandbox")?;
    for (given, what) in [
        (req.mcp.as_ref().is_some_and(|v| !v.is_null()), "MCP gateway (mcp)"),
        (req.iam.as_ref().is_some_and(|v| !v.is_null()), "IAM workload tokens (iam)"),
        (req.volume_mounts.as_ref().is_some_and(|v| !v.is_null()), "volume mounts (volumeMounts)"),
        (
            req.auto_pause_memory.as_ref().is_some_and(|v| !v.is_null() && v.as_bool().is_none()),
            "autoPauseMemory other than true or false",
        ),
    ] {
        if given {
            return Err(E2bError::Unsupported(format!("not supported by strata: {what}")));
        }
    }
    let _ = req.secure;
    let network = match (&req.network, req.allow_internet_access) {
        (Some(v), allow) if !v.is_null() => {
            let mut n: E2bNetwork = serde_json::from_value(v.clone())
                .map_err(|err| E2bError::BadRequest(format!("malformed network: {err}")))?;
            if n.allow_internet_access.is_none() {
                n.allow_internet_access = allow;
            }
            Some(strata_network(&n)?)
        }
        // E2B's internet access: every public address (never the host, private
        // ranges or cloud metadata). Without it (not asked for), strata's default: no network.
        (_, Some(true)) => {
            Some(strata_network(&E2bNetwork { allow_internet_access: Some(true), ..Default::default() })?)
        }
        _ => None,
    };
    // autoResume: unset leaves the choice to the API (strata's: resume on access);
    // `{"enabled": false}` keeps a paused sandbox paused until connect().
    let resume_on_access = match req.auto_resume.as_ref().filter(|v| !v.is_null()) {
        None => None,
        Some(v) => Some(v.get("enabled").and_then(Value::as_bool).ok_or_else(|| {
            E2bError::BadRequest(format!("malformed autoResume {v}: expected {{\"enabled\": true|false}}"))
        })?),
    };
    let timeout = check_timeout(req.timeout.unwrap_or(DEFAULT_TIMEOUT))?;
    let auto_pause = req.auto_pause.unwrap_or(false);
    // E2B's pause keeps memory unless autoPauseMemory is false ("filesystem"
    // mode: a cold boot on resume): standby, or a stop, at the timeout.
    let keep_memory = req.auto_pause_memory.as_ref().and_then(Value::as_bool) != Some(false);
    let at_timeout = match (auto_pause, keep_memory) {
        (false, _) => OnIdle::Destroy,
        (true, true) => OnIdle::Standby,
        (true, false) => OnIdle::Stop,
    };
    let mut labels = req.metadata.unwrap_or_default();
    labels.insert(TEMPLATE_LABEL.to_string(), req.template_id.clone());
    let native = CreateSandboxRequest {
        source: strata_source(&req.template_id),
        // autoPause keeps the sandbox when its timeout ends (in standby, or
        // stopped without memory); otherwise the timeout ends it like E2B's kill.
        lifecycle: if auto_pause { Lifecycle::Persistent } else { Lifecycle::Ephemeral },
        env: req.env_vars.unwrap_or_default(),
        labels,
        policy: Some(PolicyPatch {
            on_idle: Some(OnIdle::Keep),
            max_lifetime: Some(format!("{timeout}s")),
            on_max_lifetime: Some(at_timeout),
            resume_on_access,
            ..Default::default()
        }),
        network,
        // E2B's base image has passwordless sudo for `user`, and code written
        // for E2B uses it: setuid binaries must take effect (up to the sandbox's root).
        allow_setuid: true,
        ..Default::default()
    };
    let created = client.create_sandbox(&native).await.map_err(|err| match err.code() {
        strata_api::ErrorCode::ImageNotFound | strata_api::ErrorCode::CheckpointNotFound => {
            E2bError::NotFound(format!(
                "template '{}' not found (strata image, template or checkpoint '{}')",
                req.template_id,
                strata_source(&req.template_id)
            ))
        }
        _ => E2bError::Engine(err),
    })?;
    let s = client.get_sandbox(&created.id).await?;
    info!(sandbox = %s.id, template = %req.template_id, timeout, auto_pause, "e2b create");
    let mut resp = (StatusCode::CREATED, Json(sandbox_json(&s, &access::envd_token(&secret, &s.id)))).into_response();
    // The route names no sandbox: the audit entry takes the one it made from here.
    resp.extensions_mut().insert(super::audit::Created(s.id.clone()));
    Ok(resp)
}

/// Query of the v1 list.
#[derive(Debug, Deserialize)]
struct ListV1Query {
    #[serde(default)]
    metadata: Option<String>,
}

/// Query of the v2 list.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListV2Query {
    #[serde(default)]
    metadata: Option<String>,
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    next_token: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
    #[serde(default)]
    template: Option<String>,
    #[serde(default)]
    order: Option<String>,
    #[serde(default)]
    started_after: Option<String>,
    #[serde(default)]
    started_before: Option<String>,
}

/// An RFC 3339 time with any UTC offset (`Z`, `+02:00`, `-0500`), as the
/// SDKs send it (Python's `isoformat()`); naive times are UTC.
fn parse_time_with_offset(s: &str) -> Option<SystemTime> {
    let s = s.trim();
    let (local, offset_secs) = match s.char_indices().rev().find(|(i, c)| (*c == '+' || *c == '-') && *i > 10) {
        Some((i, sign)) => {
            let digits: String = s[i + 1..].chars().filter(char::is_ascii_digit).collect();
            if digits.len() != 4 {
                return None;
            }
            let h: i64 = digits[..2].parse().ok()?;
            let m: i64 = digits[2..].parse().ok()?;
            let secs = h * 3600 + m * 60;
            (&s[..i], if sign == '+' { secs } else { -secs })
        }
        None => (s.trim_end_matches(['Z', 'z']), 0),
    };
    let t = humantime::parse_rfc3339_weak(local).ok()?;
    // Local time minus its offset is UTC.
    if offset_secs >= 0 {
        t.checked_sub(Duration::from_secs(offset_secs as u64))
    } else {
        t.checked_add(Duration::from_secs(offset_secs.unsigned_abs()))
    }
}

/// Parses E2B's metadata filter: a query string `k1=v1&k2=v2` (itself URL-encoded).
fn metadata_filter(q: Option<&str>) -> Result<HashMap<String, String>, E2bError> {
    let mut out = HashMap::new();
    let Some(q) = q.filter(|q| !q.is_empty()) else { return Ok(out) };
    for pair in q.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| E2bError::BadRequest(format!("metadata filter {pair:?} is not key=value")))?;
        out.insert(url_decode(k), url_decode(v));
    }
    Ok(out)
}

fn url_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                match u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("zz"), 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn matches_metadata(s: &Sandbox, f: &HashMap<String, String>) -> bool {
    f.iter().all(|(k, v)| s.labels.get(k) == Some(v))
}

/// `GET /sandboxes`: running sandboxes (v1).
async fn list_v1(call: Control, Query(q): Query<ListV1Query>) -> Result<Response, E2bError> {
    let client = call.engine;
    let f = metadata_filter(q.metadata.as_deref())?;
    let list: Vec<Value> = client
        .list_sandboxes()
        .await?
        .iter()
        .filter(|s| visible(s) && e2b_state(s.state) == "running" && matches_metadata(s, &f))
        .map(|s| detail_json(s, None))
        .collect();
    Ok(Json(list).into_response())
}

/// `GET /v2/sandboxes`: filter by state, metadata, template and start time
/// (`startedAfter`, inclusive; `startedBefore`, exclusive), sorted by start
/// time (`order`: `desc`, the default, or `asc`), paginated by `nextToken`
/// (the id to start after, in that order) and `limit`; the next token is in
/// the `x-next-token` header.
async fn list_v2(call: Control, Query(q): Query<ListV2Query>) -> Result<Response, E2bError> {
    let client = call.engine;
    let f = metadata_filter(q.metadata.as_deref())?;
    let states: Vec<String> = q
        .state
        .as_deref()
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    for s in &states {
        if s != "running" && s != "paused" {
            return Err(E2bError::BadRequest(format!("unknown state {s:?} (running, paused)")));
        }
    }
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    // Newest first unless asked otherwise, by start time, across every page (E2B's order).
    let newest_first = match q.order.as_deref().map(str::trim).filter(|o| !o.is_empty()) {
        None | Some("desc") => true,
        Some("asc") => false,
        Some(o) => return Err(E2bError::BadRequest(format!("invalid order {o:?} (asc, desc)"))),
    };
    let bound = |v: &Option<String>, what: &str| -> Result<Option<SystemTime>, E2bError> {
        match v.as_deref().map(str::trim).filter(|t| !t.is_empty()) {
            None => Ok(None),
            Some(t) => parse_time_with_offset(t)
                .map(Some)
                .ok_or_else(|| E2bError::BadRequest(format!("invalid {what} {t:?} (an RFC 3339 time)"))),
        }
    };
    let after = bound(&q.started_after, "startedAfter")?;
    let before = bound(&q.started_before, "startedBefore")?;
    let started = |s: &Sandbox| parse_time(&s.created_at).unwrap_or(SystemTime::UNIX_EPOCH);
    let mut all: Vec<Sandbox> = client
        .list_sandboxes()
        .await?
        .into_iter()
        .filter(|s| visible(s) && matches_metadata(s, &f))
        .filter(|s| states.is_empty() || states.iter().any(|st| st == e2b_state(s.state)))
        .filter(|s| q.template.as_deref().is_none_or(|t| template_of(s) == t))
        // startedAfter is inclusive, startedBefore exclusive.
        .filter(|s| after.is_none_or(|a| started(s) >= a) && before.is_none_or(|b| started(s) < b))
        .collect();
    all.sort_by_cached_key(|s| (started(s), s.id.clone()));
    if newest_first {
        all.reverse();
    }
    let start = match q.next_token.as_deref().filter(|t| !t.is_empty()) {
        Some(t) => all
            .iter()
            .position(|s| s.id == t)
            .map(|i| i + 1)
            .ok_or_else(|| E2bError::BadRequest(format!("invalid nextToken {t:?}")))?,
        None => 0,
    };
    let page: Vec<&Sandbox> = all.iter().skip(start).take(limit).collect();
    let more = start + page.len() < all.len();
    let body: Vec<Value> = page.iter().map(|s| detail_json(s, None)).collect();
    let mut resp = Json(body).into_response();
    if more {
        if let Some(last) = page.last() {
            if let Ok(v) = HeaderValue::from_str(&last.id) {
                resp.headers_mut().insert("x-next-token", v);
            }
        }
    }
    Ok(resp)
}

/// `GET /sandboxes/{id}`.
async fn get_one(call: Control, Path(id): Path<String>) -> Result<Response, E2bError> {
    let Control { engine: client, secret } = call;
    let s = client.get_sandbox(&id).await.map_err(sandbox_err(&id))?;
    if !visible(&s) {
        return Err(E2bError::NotFound(format!("sandbox \"{id}\" doesn't exist or you don't have access to it")));
    }
    Ok(Json(detail_json(&s, Some(&access::envd_token(&secret, &s.id)))).into_response())
}

/// `DELETE /sandboxes/{id}`: destroy.
async fn kill(State(e): State<SharedE2b>, call: Control, Path(id): Path<String>) -> Result<Response, E2bError> {
    let client = call.engine;
    let ev = client.remove_sandbox(&id, true).await.map_err(|err| match err.code() {
        // Already destroyed: E2B answers 404 for a sandbox that is gone.
        strata_api::ErrorCode::InvalidState => {
            E2bError::NotFound(format!("sandbox \"{id}\" doesn't exist or you don't have access to it"))
        }
        _ => sandbox_err(&id)(err),
    })?;
    // The E2B layer's maps are keyed by full ids (see super::dispatch): forget the destroyed one's.
    let gone = ev.sandbox_id;
    let mut st = e.lock();
    st.procs.retain(|(sb, _), _| *sb != gone);
    st.watchers.retain(|_, w| w.sandbox() != gone);
    st.port_previews.retain(|(sb, _, _), _| *sb != gone);
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Sets the sandbox's end to `timeout` seconds from now (`max_lifetime` =
/// age + timeout, to the millisecond: the policy loop wakes at that deadline).
/// With [`Extend::OnlyLonger`] an end already later is kept (`connect`).
async fn extend(client: &Engine, id: &str, timeout: u64, how: Extend) -> Result<Sandbox, E2bError> {
    let s = client.get_sandbox(id).await.map_err(sandbox_err(id))?;
    let created = parse_time(&s.created_at).unwrap_or_else(SystemTime::now);
    let age = SystemTime::now().duration_since(created).unwrap_or_default();
    let life = age + Duration::from_secs(timeout);
    let current = s.policy.max_lifetime.as_deref().and_then(|m| humantime::parse_duration(m).ok());
    if how == Extend::OnlyLonger && current.is_some_and(|c| c >= life) {
        return Ok(s);
    }
    let life = Duration::from_millis(life.as_millis() as u64);
    let patch = UpdateSandboxRequest {
        policy: Some(PolicyPatch {
            max_lifetime: Some(humantime::format_duration(life).to_string()),
            ..Default::default()
        }),
        ..Default::default()
    };
    client.update_sandbox(id, &patch).await.map_err(sandbox_err(id))
}

/// Whether [`extend`] may move a sandbox's end earlier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Extend {
    /// `set_timeout`, refreshes: the end is now + timeout, sooner or later.
    Set,
    /// `connect(timeout)`: only ever later (E2B's rule for a running sandbox).
    OnlyLonger,
}

#[derive(Debug, Deserialize)]
struct TimeoutBody {
    timeout: u64,
}

/// `POST /sandboxes/{id}/timeout`.
async fn set_timeout(call: Control, Path(id): Path<String>, body: Bytes) -> Result<Response, E2bError> {
    let client = call.engine;
    let b: TimeoutBody = json_body(&body, "SandboxTimeoutRequest")?;
    extend(&client, &id, check_timeout(b.timeout)?, Extend::Set).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Debug, Deserialize)]
struct RefreshBody {
    #[serde(default)]
    duration: Option<u64>,
}

/// `POST /sandboxes/{id}/refreshes`: keep alive for `duration` seconds more.
async fn refresh(call: Control, Path(id): Path<String>, body: Bytes) -> Result<Response, E2bError> {
    let client = call.engine;
    let b: RefreshBody = json_body(&body, "SandboxRefreshRequest")?;
    extend(&client, &id, check_timeout(b.duration.unwrap_or(DEFAULT_TIMEOUT))?, Extend::Set).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Debug, Deserialize)]
struct ConnectBody {
    #[serde(default)]
    timeout: Option<u64>,
    /// `false` (the JS SDK's `onResume: 'reboot'`): bring a paused sandbox back
    /// from its filesystem alone, its processes started afresh.
    #[serde(default)]
    memory: Option<bool>,
}

/// Resumes a parked sandbox (from its filesystem only when `memory` is
/// false); whether it was parked.
async fn wake(client: &Engine, id: &str, memory: bool) -> Result<(Sandbox, bool), E2bError> {
    let s = client.get_sandbox(id).await.map_err(sandbox_err(id))?;
    if !visible(&s) {
        return Err(E2bError::NotFound(format!("sandbox \"{id}\" doesn't exist or you don't have access to it")));
    }
    if e2b_state(s.state) == "paused" {
        let req = strata_api::ResumeRequest { fs_only: !memory };
        let r = client.resume_sandbox_with(id, &req).await.map_err(sandbox_err(id))?;
        return Ok((r.sandbox, true));
    }
    Ok((s, false))
}

/// `POST /sandboxes/{id}/connect`, `/v2/...`: resume if paused (201), else 200.
/// A `timeout` sets a resumed sandbox's end; a running one's only moves later.
async fn connect(call: Control, Path(id): Path<String>, body: Bytes) -> Result<Response, E2bError> {
    let Control { engine: client, secret } = call;
    let b: ConnectBody = json_body(&body, "ConnectSandbox")?;
    let (mut s, resumed) = wake(&client, &id, b.memory.unwrap_or(true)).await?;
    if let Some(t) = b.timeout {
        let how = if resumed { Extend::Set } else { Extend::OnlyLonger };
        s = extend(&client, &id, check_timeout(t)?, how).await?;
    }
    let status = if resumed { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(sandbox_json(&s, &access::envd_token(&secret, &s.id)))).into_response())
}

/// `POST /sandboxes/{id}/resume` (deprecated in the SDK): like connect, 409 when running.
async fn resume(call: Control, Path(id): Path<String>, body: Bytes) -> Result<Response, E2bError> {
    let Control { engine: client, secret } = call;
    let b: ConnectBody = json_body(&body, "ResumedSandbox")?;
    let (mut s, resumed) = wake(&client, &id, b.memory.unwrap_or(true)).await?;
    if !resumed {
        return Ok((
            StatusCode::CONFLICT,
            Json(json!({"code": 409, "message": format!("sandbox \"{id}\" is already running")})),
        )
            .into_response());
    }
    if let Some(t) = b.timeout {
        s = extend(&client, &id, check_timeout(t)?, Extend::Set).await?;
    }
    Ok((StatusCode::CREATED, Json(sandbox_json(&s, &access::envd_token(&secret, &s.id)))).into_response())
}

/// `POST /sandboxes/{id}/pause`: strata standby (processes and memory dumped,
/// compute released); 409 when already paused.
async fn pause(call: Control, Path(id): Path<String>) -> Result<Response, E2bError> {
    let client = call.engine;
    let s = client.get_sandbox(&id).await.map_err(sandbox_err(&id))?;
    if e2b_state(s.state) == "paused" {
        return Ok((
            StatusCode::CONFLICT,
            Json(json!({"code": 409, "message": format!("sandbox \"{id}\" is already paused")})),
        )
            .into_response());
    }
    client.standby_sandbox(&id, &strata_api::StandbyRequest { fs_only: false }).await.map_err(sandbox_err(&id))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Debug, Deserialize)]
struct ForkBody {
    #[serde(default)]
    timeout: Option<u64>,
    #[serde(default)]
    count: Option<u32>,
}

/// `POST /sandboxes/{id}/fork`: strata fork (copy-on-write children of a
/// checkpoint taken now); a list of `{"sandbox": Sandbox}`.
async fn fork(call: Control, Path(id): Path<String>, body: Bytes) -> Result<Response, E2bError> {
    let Control { engine: client, secret } = call;
    let b: ForkBody = json_body(&body, "SandboxForkRequest")?;
    let count = b.count.unwrap_or(1);
    if count == 0 || count > 64 {
        return Err(E2bError::BadRequest(format!("count {count} is out of range (1..=64)")));
    }
    let parent = client.get_sandbox(&id).await.map_err(sandbox_err(&id))?;
    // E2B's fork copies the running sandbox, processes and memory included.
    let req = ForkRequest {
        source: id.clone(),
        count,
        name_prefix: None,
        lifecycle: Lifecycle::Ephemeral,
        ttl: None,
        limits: None,
        network: None,
        processes: Some(true),
        isolation: None,
    };
    let res = client.fork(&req).await.map_err(sandbox_err(&id))?;
    let timeout = check_timeout(b.timeout.unwrap_or(DEFAULT_TIMEOUT))?;
    let mut out = Vec::new();
    for child in &res.sandboxes {
        let patch = UpdateSandboxRequest {
            policy: Some(PolicyPatch {
                on_idle: Some(OnIdle::Keep),
                max_lifetime: Some(format!("{timeout}s")),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut s = client.update_sandbox(child, &patch).await?;
        // The child keeps the parent's E2B template id.
        if !s.labels.contains_key(TEMPLATE_LABEL) {
            s.labels.insert(TEMPLATE_LABEL.into(), template_of(&parent));
        }
        out.push(json!({"sandbox": sandbox_json(&s, &access::envd_token(&secret, &s.id))}));
    }
    Ok((StatusCode::CREATED, Json(out)).into_response())
}

#[derive(Debug, Deserialize)]
struct SnapshotBody {
    #[serde(default)]
    name: Option<String>,
}

/// `POST /sandboxes/{id}/snapshots`: a strata checkpoint; its id is the
/// snapshot id, usable as a template id to create from.
async fn snapshot(call: Control, Path(id): Path<String>, body: Bytes) -> Result<Response, E2bError> {
    let client = call.engine;
    let b: SnapshotBody = json_body(&body, "SandboxSnapshotRequest")?;
    let mut labels = BTreeMap::new();
    labels.insert("e2b.snapshot".to_string(), "true".to_string());
    // E2B's snapshots keep the running processes and memory: a warm checkpoint.
    let cp = client
        .checkpoint(&id, &CheckpointRequest { name: b.name.clone(), labels, processes: true, ..Default::default() })
        .await
        .map_err(sandbox_err(&id))?;
    Ok((StatusCode::CREATED, Json(json!({"snapshotID": cp.id, "names": [cp.name]}))).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SnapshotsQuery {
    #[serde(default, rename = "sandboxID")]
    sandbox_id: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
    #[serde(default)]
    next_token: Option<String>,
}

/// `GET /snapshots`: the checkpoints taken through the E2B API.
async fn list_snapshots(call: Control, Query(q): Query<SnapshotsQuery>) -> Result<Response, E2bError> {
    let client = call.engine;
    let mut cps: Vec<_> = client
        .list_checkpoints(q.sandbox_id.as_deref())
        .await?
        .into_iter()
        .filter(|c| c.labels.get("e2b.snapshot").is_some_and(|v| v == "true"))
        .filter(|c| c.retired_at().is_none())
        .collect();
    cps.sort_by(|a, b| (a.created_at.as_str(), a.id.as_str()).cmp(&(b.created_at.as_str(), b.id.as_str())));
    let start = match q.next_token.as_deref().filter(|t| !t.is_empty()) {
        Some(t) => cps
            .iter()
            .position(|c| c.id == t)
            .map(|i| i + 1)
            .ok_or_else(|| E2bError::BadRequest(format!("invalid nextToken {t:?}")))?,
        None => 0,
    };
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let page: Vec<_> = cps.iter().skip(start).take(limit).collect();
    let more = start + page.len() < cps.len();
    let body: Vec<Value> = page.iter().map(|c| json!({"snapshotID": c.id, "names": [c.name]})).collect();
    let mut resp = Json(body).into_response();
    if let (true, Some(last)) = (more, page.last()) {
        if let Ok(v) = HeaderValue::from_str(&last.id) {
            resp.headers_mut().insert("x-next-token", v);
        }
    }
    Ok(resp)
}

/// `DELETE /templates/{id}` for a snapshot id (`Sandbox.delete_snapshot`):
/// as in E2B, the snapshot is gone from listings and as a source at once,
/// even while its sandbox runs or sandboxes made from it live; strata keeps
/// the checkpoint's layers (retired) until nothing needs them. 404 for
/// anything that is not a snapshot, or one already deleted.
async fn delete_snapshot(call: Control, Path(id): Path<String>) -> Result<Response, E2bError> {
    let client = call.engine;
    let not_found = || {
        E2bError::NotFound(format!("snapshot '{id}' not found (template deletion is not supported by strata: only snapshots made through the E2B API)"))
    };
    let cp = client.get_checkpoint(&id).await.map_err(|err| match err.code() {
        strata_api::ErrorCode::CheckpointNotFound => not_found(),
        _ => E2bError::Engine(err),
    })?;
    if cp.labels.get("e2b.snapshot").map(String::as_str) != Some("true") || cp.retired_at().is_some() {
        return Err(not_found());
    }
    let r = client.retire_checkpoint(&cp.id).await?;
    if !r.deleted {
        info!(snapshot = %cp.id, kept_by = %r.kept_by.join(", "), "e2b snapshot deleted; its layers stay while these need them");
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Query of `GET /sandboxes/{id}/metrics`: Unix seconds, both optional.
#[derive(Debug, Deserialize)]
struct MetricsQuery {
    #[serde(default)]
    start: Option<u64>,
    #[serde(default)]
    end: Option<u64>,
}

/// `GET /sandboxes/{id}/metrics`: the samples of strata's accounting (one per
/// interval, 5 s by default, the last hour kept; one more taken now while the
/// sandbox runs) within `start`..`end` (default: from the sandbox's start to
/// now), oldest first. CPU is in percent of the sandbox's CPUs.
async fn metrics(call: Control, Path(id): Path<String>, Query(q): Query<MetricsQuery>) -> Result<Response, E2bError> {
    let client = call.engine;
    let s = client.get_sandbox(&id).await.map_err(sandbox_err(&id))?;
    let unix = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_secs();
    let start = q.start.unwrap_or_else(|| parse_time(&s.created_at).map_or(0, unix));
    let end = q.end.unwrap_or_else(|| unix(SystemTime::now()));
    if start > end {
        return Err(E2bError::BadRequest(format!("start {start} is after end {end}")));
    }
    let points = client.metrics_history(&s.id, start, end).await.map_err(sandbox_err(&id))?;
    let cpus = s.limits.cpus.map(|c| c.ceil() as u64).unwrap_or(1).max(1);
    let mem_total = s.limits.memory_bytes.unwrap_or(0);
    let disk_total = s.limits.disk_bytes.unwrap_or(0);
    let samples: Vec<Value> = points
        .iter()
        .map(|p| {
            json!({
                "timestamp": fmt_time(SystemTime::UNIX_EPOCH + Duration::from_secs(p.unix_secs)),
                "timestampUnix": p.unix_secs,
                "cpuCount": cpus,
                "cpuUsedPct": (p.cpu_core_pct / cpus as f64).min(100.0),
                "memUsed": p.memory_bytes,
                "memTotal": mem_total,
                "memCache": 0,
                "diskUsed": p.disk_bytes,
                "diskTotal": disk_total,
            })
        })
        .collect();
    Ok(Json(samples).into_response())
}

/// `GET /sandboxes/metrics`: not supported.
async fn metrics_many() -> E2bError {
    E2bError::Unsupported(
        "not supported by strata: metrics of many sandboxes at once (GET /sandboxes/metrics); ask per sandbox".into(),
    )
}

/// Query of the log routes (v1: `start`, `limit`; v2: `cursor`, `limit`,
/// `direction`, `level`, `search`).
#[derive(Debug, Deserialize)]
struct LogsQuery {
    #[serde(default)]
    start: Option<u64>,
    #[serde(default)]
    cursor: Option<u64>,
    #[serde(default)]
    limit: Option<usize>,
    #[serde(default)]
    direction: Option<String>,
    #[serde(default)]
    level: Option<String>,
    #[serde(default)]
    search: Option<String>,
}

/// A sandbox's log: its lifecycle events from strata's event log (E2B's
/// sandbox logs are envd's own; process output is read per command).
/// Entries: (unix ms, RFC 3339 time, level, message, fields).
async fn log_entries(
    client: &Engine,
    id: &str,
    q: &LogsQuery,
) -> Result<Vec<(u64, String, &'static str, String, Value)>, E2bError> {
    let s = client.get_sandbox(id).await.map_err(sandbox_err(id))?;
    let events = client.events(Some(&s.id), 0).await.map_err(sandbox_err(id))?;
    let from = q.cursor.or(q.start).unwrap_or(0);
    let backward = match q.direction.as_deref() {
        None | Some("forward") => false,
        Some("backward") => true,
        Some(d) => return Err(E2bError::BadRequest(format!("unknown direction {d:?} (forward, backward)"))),
    };
    let levels: &[&str] = match q.level.as_deref() {
        None | Some("debug") | Some("info") => &["info", "warn", "error"],
        Some("warn") => &["warn", "error"],
        Some("error") => &["error"],
        Some(l) => return Err(E2bError::BadRequest(format!("unknown level {l:?} (debug, info, warn, error)"))),
    };
    let mut out: Vec<_> = events
        .into_iter()
        .filter_map(|ev| {
            let t = parse_time(&ev.time)?;
            let ms = t.duration_since(SystemTime::UNIX_EPOCH).ok()?.as_millis() as u64;
            let level = match ev.to {
                SandboxState::Error | SandboxState::Lost => "error",
                _ => "info",
            };
            let from_state = ev.from.map(|f| f.as_str().to_string()).unwrap_or_else(|| "-".into());
            let mut msg = format!("{from_state} -> {} ({})", ev.to, ev.reason);
            if let Some(d) = &ev.detail {
                msg.push_str(": ");
                msg.push_str(d);
            }
            let fields = json!({"from": from_state, "to": ev.to.as_str(), "reason": ev.reason, "duration_ms": ev.duration_ms.to_string()});
            Some((ms, fmt_time(t), level, msg, fields))
        })
        .filter(|(ms, _, level, msg, _)| (if backward { *ms <= from || from == 0 } else { *ms >= from }) && levels.contains(level) && q.search.as_deref().is_none_or(|needle| msg.contains(needle)))
        .collect();
    if backward {
        out.reverse();
    }
    out.truncate(q.limit.unwrap_or(1000).clamp(1, 1000));
    Ok(out)
}

/// `GET /sandboxes/{id}/logs`: `{"logs": [{timestamp, line}], "logEntries": [...]}`.
async fn logs_v1(call: Control, Path(id): Path<String>, Query(q): Query<LogsQuery>) -> Result<Response, E2bError> {
    let entries = log_entries(&call.engine, &id, &q).await?;
    let logs: Vec<Value> = entries.iter().map(|(_, t, _, m, _)| json!({"timestamp": t, "line": m})).collect();
    let log_entries: Vec<Value> =
        entries.iter().map(|(_, t, l, m, f)| json!({"timestamp": t, "level": l, "message": m, "fields": f})).collect();
    Ok(Json(json!({"logs": logs, "logEntries": log_entries})).into_response())
}

/// `GET /v2/sandboxes/{id}/logs`: `{"logs": [{timestamp, level, message, fields}]}`.
async fn logs_v2(call: Control, Path(id): Path<String>, Query(q): Query<LogsQuery>) -> Result<Response, E2bError> {
    let entries = log_entries(&call.engine, &id, &q).await?;
    let logs: Vec<Value> =
        entries.iter().map(|(_, t, l, m, f)| json!({"timestamp": t, "level": l, "message": m, "fields": f})).collect();
    Ok(Json(json!({"logs": logs})).into_response())
}

/// E2B's "all traffic" CIDR.
const ALL_TRAFFIC: &str = "0.0.0.0/0";

/// E2B egress settings (`SandboxNetworkConfig` / `SandboxNetworkUpdateConfig`).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct E2bNetwork {
    #[serde(default)]
    allow_out: Option<Vec<String>>,
    #[serde(default)]
    deny_out: Option<Vec<String>>,
    #[serde(default, rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    #[serde(flatten)]
    other: BTreeMap<String, Value>,
}

/// E2B's egress settings as a strata network. Open internet (E2B's
/// `allow_internet_access`, or `deny_out` without `0.0.0.0/0`) is strata's
/// `0.0.0.0/0` rule: every public address, while the host, private ranges,
/// link-local (cloud metadata) and the other reserved ranges stay closed;
/// `deny_out` entries are exceptions to it, and `allow_out` wins over them
/// (E2B's precedence). "Deny all" (`deny_out` holding `0.0.0.0/0`, or no
/// internet access) leaves `allow_out` only (none: no network at all).
fn strata_network(n: &E2bNetwork) -> Result<strata_api::NetworkSpec, E2bError> {
    if let Some((k, _)) = n.other.iter().find(|(_, v)| !v.is_null()) {
        return Err(E2bError::Unsupported(format!("not supported by strata: network option {k}")));
    }
    let deny = n.deny_out.clone().unwrap_or_default();
    let allow = n.allow_out.clone().unwrap_or_default();
    let deny_all = deny.iter().any(|d| d == ALL_TRAFFIC) || n.allow_internet_access == Some(false);
    let spec = if deny_all {
        // Every other deny entry is already implied.
        let mode = if allow.is_empty() { strata_api::NetworkMode::None } else { strata_api::NetworkMode::Egress };
        strata_api::NetworkSpec { mode, allow, deny: vec![] }
    } else {
        let mut open = vec![ALL_TRAFFIC.to_string()];
        open.extend(allow);
        strata_api::NetworkSpec { mode: strata_api::NetworkMode::Egress, allow: open, deny }
    };
    // Bad entries are checked where every network is: a 400 naming the entry.
    Ok(spec)
}

/// `PUT /sandboxes/{id}/network`: E2B egress rules onto strata's (live).
async fn network(call: Control, Path(id): Path<String>, body: Bytes) -> Result<Response, E2bError> {
    let client = call.engine;
    let n: E2bNetwork = json_body(&body, "SandboxNetworkUpdateConfig")?;
    let spec = strata_network(&n)?;
    client.set_network(&id, &spec).await.map_err(sandbox_err(&id))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `/templates*`: template builds are strata's own (`strata template build`).
async fn templates() -> E2bError {
    E2bError::Unsupported("not supported by strata: this template management call (templates are built with the template SDK's Template.build, or `strata template build`; listed with `strata template ls`; an existing strata image or template name works as templateID)".into())
}

/// `/volumes*`: not supported.
async fn volumes() -> E2bError {
    E2bError::Unsupported("not supported by strata: volumes".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e2b_network_maps_onto_strata_rules() {
        let n = |allow: &[&str], deny: &[&str]| E2bNetwork {
            allow_out: Some(allow.iter().map(|s| s.to_string()).collect()),
            deny_out: Some(deny.iter().map(|s| s.to_string()).collect()),
            ..Default::default()
        };
        let spec = strata_network(&n(&["pypi.org"], &[ALL_TRAFFIC, "1.2.3.4"])).unwrap();
        assert_eq!(spec.mode, strata_api::NetworkMode::Egress);
        assert_eq!((spec.allow, spec.deny), (vec!["pypi.org".to_string()], vec![]));
        assert_eq!(strata_network(&n(&[], &[ALL_TRAFFIC])).unwrap().mode, strata_api::NetworkMode::None);
        // Open internet with exceptions; allow_out wins over deny_out.
        let open = strata_network(&n(&["203.0.113.7"], &["203.0.113.0/24"])).unwrap();
        assert_eq!(open.allow, vec![ALL_TRAFFIC.to_string(), "203.0.113.7".into()]);
        assert_eq!(open.deny, vec!["203.0.113.0/24".to_string()]);
        let internet = strata_network(&E2bNetwork { allow_internet_access: Some(true), ..Default::default() }).unwrap();
        assert_eq!((internet.mode, internet.allow), (strata_api::NetworkMode::Egress, vec![ALL_TRAFFIC.to_string()]));
        let closed = strata_network(&E2bNetwork { allow_internet_access: Some(false), ..Default::default() }).unwrap();
        assert_eq!(closed.mode, strata_api::NetworkMode::None);
        let mut other = n(&[], &[ALL_TRAFFIC]);
        other.other.insert("dnsServers".into(), json!(["1.1.1.1"]));
        assert!(matches!(strata_network(&other), Err(E2bError::Unsupported(m)) if m.contains("dnsServers")));
    }

    #[test]
    fn start_times_parse_with_any_offset() {
        let utc = humantime::parse_rfc3339("2026-12-04T19:00:00Z").unwrap();
        for t in [
            "2026-12-04T19:00:00Z",
            "2026-12-04T19:00:00",
            "2026-12-04T19:00:00+00:00",
            "2026-12-04T21:00:00+02:00",
            "2026-12-04T14:00:00-0500",
        ] {
            assert_eq!(parse_time_with_offset(t), Some(utc), "{t}");
        }
        assert_eq!(
            parse_time_with_offset("2026-12-04T19:00:00.250+00:00"),
            Some(utc + Duration::from_millis(250)),
            "Python's isoformat() with fractions"
        );
        for bad in ["", "yesterday", "2026-12-04T19:00:00+2", "2026-13-04T19:00:00Z"] {
            assert_eq!(parse_time_with_offset(bad), None, "{bad}");
        }
    }

    #[test]
    fn metadata_filter_parses_encoded_pairs() {
        let f = metadata_filter(Some("user=alice&app=a%20b")).unwrap();
        assert_eq!(f.get("user").map(String::as_str), Some("alice"));
        assert_eq!(f.get("app").map(String::as_str), Some("a b"));
        assert!(metadata_filter(Some("novalue")).is_err());
        assert_eq!(url_decode("%"), "%");
        assert_eq!(url_decode("%4"), "%4");
        assert_eq!(url_decode("%zz"), "%zz");
    }
}
