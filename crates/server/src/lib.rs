//! The strata daemon's front ends, each a translator onto `strata-engine`:
//! the native HTTP API ([`native`], one handler file per resource, routed in
//! [`router_with_mcp`]), the E2B-compatible API ([`e2b`]), MCP over HTTP
//! (`/mcp`, its tools calling the engine in-process: [`mcp`]; `strata mcp`,
//! a separate process, calls this API over HTTP instead), the preview proxy
//! ([`native::preview`]), the web console ([`ui`], at `/ui` on TCP) and the
//! listeners ([`run`]: a Unix socket for the operator, TCP with bearer tokens).
//!
//! What lives here: routing, extraction of requests, HTTP error bodies
//! ([`error::ApiError`]), streaming bodies, authentication of listeners, the
//! OpenAPI document ([`openapi`]). What may not: business rules — a handler
//! resolves its inputs, calls the engine and shapes the answer.

pub mod e2b;
pub mod error;
pub mod mcp;
pub mod native;
pub mod ndjson;
pub mod openapi;
pub mod ui;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use strata_api::{ApiErrorBody, ErrorCode};
use strata_engine::state::Shared;
pub use strata_engine::{admission, network, DaemonError};
use tracing::{info, warn};

use crate::error::ApiError;
use crate::native::{
    accounting, advisor, approvals, audit, events, fanout, metrics, network as net, patching, pipelines, policy,
    preview, quarantine, quotas, scan, tenancy,
};

/// Daemon configuration: the engine's and the listeners'.
#[derive(Debug, Clone)]
pub struct Config {
    /// What the engine is opened with.
    pub engine: strata_engine::Config,
    /// Unix socket path.
    pub socket: PathBuf,
    /// Optional TCP address (bearer-token auth).
    pub listen: Option<SocketAddr>,
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> DaemonError + 'a {
    move |source| DaemonError::Io { what, path: path.to_path_buf(), source }
}

/// The router of one listener: [`router`] behind [`tenancy::authenticate`]
/// (the operator on the Unix socket; a bearer token on TCP).
pub fn app(st: Shared, listener: tenancy::Listener) -> Router {
    app_with_mcp(st, listener, None, Arc::default())
}

/// [`app`] with the MCP endpoint at `/mcp` (see [`router_with_mcp`]).
/// Preview URLs ([`preview::intercept`]) are served before authentication:
/// they carry a preview token, not an API token; `previews` keeps their idle
/// upstream connections (one pool for every listener of a daemon).
pub fn app_with_mcp(
    st: Shared,
    listener: tenancy::Listener,
    mcp: Option<strata_mcp::StrataMcp>,
    previews: Arc<preview::PreviewPool>,
) -> Router {
    let legacy = match &listener {
        tenancy::Listener::Tcp { legacy } => Some(legacy.clone()),
        tenancy::Listener::Unix => None,
    };
    let app = router_with_mcp(st.clone(), mcp)
        .layer(middleware::from_fn_with_state((st.clone(), listener), tenancy::authenticate));
    // The web console (TCP only: a browser's way in) before authentication; its
    // API calls go to this router (routed anew) with the session's token.
    let app = match legacy {
        Some(legacy) => {
            let console = ui::Console::new(st.clone(), legacy, app.clone());
            app.layer(middleware::from_fn_with_state(console, ui::intercept))
        }
        None => app,
    };
    app.layer(middleware::from_fn_with_state((st, previews), preview::intercept))
}

/// The router with every native route. It expects a [`strata_engine::tenancy::Caller`] in
/// each request (see [`app`]); without one every request is a 401.
pub fn router(st: Shared) -> Router {
    router_with_mcp(st, None)
}

/// The router with every native route and, when given, the MCP endpoint at
/// `/mcp` (streamable HTTP; see docs/mcp.md). It sits behind the same layers
/// as the API (authentication, tenancy, audit); in the daemon its tools call
/// the engine in-process ([`mcp::InProcess`]) as the request's caller.
pub fn router_with_mcp(st: Shared, mcp: Option<strata_mcp::StrataMcp>) -> Router {
    use crate::native::{
        activity as a, archive, checkpoints as c, files as f, images as i, processes as p, sandboxes as s, standby,
        templates as t,
    };
    let r = Router::new()
        .route("/openapi.json", get(|| async { ([(header::CONTENT_TYPE, "application/json")], openapi::spec_json()) }))
        .route("/metrics", get(metrics::metrics_handler))
        .route("/v1/cost", get(accounting::list_handler))
        .route("/v1/stats", get(accounting::stats_handler))
        .route("/v1/cost/{id}", get(accounting::get_handler))
        .route("/v1/advise", post(advisor::advise_handler))
        .route("/v1/info", get(events::info_handler))
        .route("/v1/doctor", get(events::doctor_handler))
        .route("/v1/warm-pool", get(events::warm_pool_handler))
        .route("/v1/events", get(events::events_handler))
        .route("/v1/images", get(i::list_handler))
        .route("/v1/images/import", post(i::import_handler))
        .route("/v1/images/pull", post(i::pull_handler))
        .route("/v1/images/{name}", get(i::get_handler).delete(i::remove_handler))
        .route("/v1/images/{name}/versions", get(patching::versions_handler))
        .route("/v1/outdated", get(patching::outdated_handler))
        .route("/v1/sandboxes/{id}/rebase", post(patching::rebase_handler))
        .route("/v1/sandboxes", get(s::list_handler).post(s::create_handler))
        .route("/v1/sandboxes/{id}", get(s::get_handler).delete(s::remove_handler).patch(policy::update_handler))
        .route("/v1/sandboxes/{id}/leases", get(a::list_leases_handler).post(a::create_lease_handler))
        .route("/v1/sandboxes/{id}/leases/{lease}", axum::routing::delete(a::release_lease_handler))
        .route("/v1/sandboxes/{id}/leases/{lease}/renew", post(a::renew_lease_handler))
        .route("/v1/sandboxes/{id}/stop", post(s::stop_handler))
        .route("/v1/sandboxes/{id}/network", get(net::get_handler).put(net::put_handler))
        .route("/v1/sandboxes/{id}/previews", get(preview::list_handler).post(preview::create_handler))
        .route("/v1/sandboxes/{id}/previews/{preview}", axum::routing::delete(preview::revoke_handler))
        .route("/v1/sandboxes/{id}/pause", post(standby::pause_handler))
        .route("/v1/sandboxes/{id}/unpause", post(standby::unpause_handler))
        .route("/v1/sandboxes/{id}/standby", post(standby::standby_handler))
        .route("/v1/sandboxes/{id}/resume", post(standby::resume_handler))
        .route("/v1/sandboxes/{id}/archive", post(archive::archive_handler))
        .route("/v1/sandboxes/{id}/checkpoints", get(c::list_for_sandbox_handler).post(c::create_handler))
        .route("/v1/sandboxes/{id}/restore", post(c::restore_handler))
        .route("/v1/sandboxes/{id}/diff", get(c::diff_handler))
        .route("/v1/sandboxes/{id}/export", get(c::export_handler))
        .route("/v1/checkpoints", get(c::list_handler))
        .route("/v1/checkpoints/{id}", get(c::get_handler).delete(c::delete_handler))
        .route("/v1/fork", post(c::fork_handler))
        .route("/v1/fanout", post(fanout::fanout_handler))
        .route("/v1/pipelines", get(pipelines::list_handler).post(pipelines::create_handler))
        .route("/v1/pipelines/{id}", get(pipelines::get_handler))
        .route("/v1/pipelines/{id}/resume", post(pipelines::resume_handler))
        .route("/v1/pipelines/{id}/pause", post(pipelines::pause_handler))
        .route("/v1/pipelines/{id}/cost", get(pipelines::cost_handler))
        .route("/v1/gc", post(c::gc_handler))
        .route("/v1/lineage/{id}", get(c::lineage_handler))
        .route("/v1/scan/{id}", get(scan::scan_handler))
        .route("/v1/quarantine", get(quarantine::list_handler))
        .route("/v1/quarantine/{id}", post(quarantine::place_handler).delete(quarantine::lift_handler))
        .route("/v1/sandboxes/{id}/check", post(quarantine::check_handler))
        .route("/v1/sandboxes/{id}/accumulation", get(quarantine::accumulation_handler))
        .route("/v1/audit", get(audit::list_handler))
        .route("/v1/audit/verify", get(audit::verify_handler))
        .route("/v1/templates", get(t::list_handler).post(t::create_handler))
        .route("/v1/templates/build", post(t::build_handler))
        .route("/v1/templates/{name}", axum::routing::delete(t::delete_handler).patch(t::policy_handler))
        .route("/v1/templates/{name}/check", post(t::check_handler))
        .route("/v1/templates/{name}/rebuild", post(patching::rebuild_handler))
        .route("/v1/approvals", get(approvals::list_handler))
        .route("/v1/approvals/{id}", get(approvals::get_handler))
        .route("/v1/approvals/{id}/approve", post(approvals::approve_handler))
        .route("/v1/approvals/{id}/deny", post(approvals::deny_handler))
        .route("/v1/tokens", get(tenancy::list_tokens_handler).post(tenancy::create_token_handler))
        .route("/v1/tokens/{id}", axum::routing::delete(tenancy::revoke_token_handler))
        .route(
            "/v1/tenants/{tenant}/quota",
            get(quotas::get_quota_handler).put(quotas::put_quota_handler).delete(quotas::delete_quota_handler),
        )
        .route("/v1/tenants/{tenant}/usage", get(quotas::usage_handler))
        .route("/v1/sandboxes/{id}/start", post(s::start_handler))
        .route("/v1/sandboxes/{id}/exec", post(p::exec_handler))
        .route("/v1/sandboxes/{id}/processes", get(p::list_processes_handler).post(p::start_process_handler))
        .route("/v1/sandboxes/{id}/processes/{pid}", get(p::get_process_handler))
        .route("/v1/sandboxes/{id}/processes/{pid}/logs", get(p::logs_handler))
        .route("/v1/sandboxes/{id}/processes/{pid}/signal", post(p::signal_handler))
        .route("/v1/sandboxes/{id}/processes/{pid}/stdin", post(p::stdin_handler))
        .route("/v1/sandboxes/{id}/processes/{pid}/resize", post(p::resize_handler))
        .route("/v1/sandboxes/{id}/processes/{pid}/tty", get(p::tty_handler))
        .route("/v1/sandboxes/{id}/processes/{pid}/wait", post(p::wait_handler))
        .route("/v1/sandboxes/{id}/files", get(f::download_handler).put(f::upload_handler))
        .route("/v1/sandboxes/{id}/files/stat", get(f::stat_handler))
        .route("/v1/sandboxes/{id}/files/list", get(f::list_handler))
        .route("/v1/sandboxes/{id}/files/watch", get(f::watch_handler))
        .route("/v1/sandboxes/{id}/files/mkdir", post(f::mkdir_handler))
        .route("/v1/sandboxes/{id}/files/remove", post(f::remove_handler))
        .route("/v1/sandboxes/{id}/files/move", post(f::move_handler))
        .fallback(|| async { ApiError::new(ErrorCode::RouteNotFound, "no such route (see /openapi.json)") });
    let r = match mcp {
        Some(server) => r.route_service("/mcp", strata_mcp::http_service(server)),
        None => r,
    };
    r.layer(middleware::from_fn(crate::native::acting::report_resumes))
        // Tenancy of the route, before any handler enters a sandbox: a request
        // for another tenant's sandbox neither counts as activity nor resumes it.
        .layer(middleware::from_fn_with_state(st.clone(), tenancy::guard))
        .layer(middleware::from_fn(json_errors))
        // Outermost: sees the final status (after the JSON error rewrite).
        .layer(middleware::from_fn_with_state(st.clone(), audit::record))
        .with_state(st)
}

/// Turns axum's plain-text rejections (bad JSON, wrong method, ...) into JSON error bodies.
async fn json_errors(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    let status = resp.status();
    let is_json =
        resp.headers().get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    let bytes = axum::body::to_bytes(resp.into_body(), 64 * 1024).await.unwrap_or_default();
    // A body that parses as JSON but does not fit the model (an unknown enum
    // value, a missing field) is a 400 like any other malformed input.
    let status = if status == StatusCode::UNPROCESSABLE_ENTITY { StatusCode::BAD_REQUEST } else { status };
    let code = match status {
        StatusCode::NOT_FOUND => ErrorCode::RouteNotFound,
        StatusCode::UNAUTHORIZED => ErrorCode::Unauthorized,
        s if s.is_server_error() => ErrorCode::Internal,
        _ => ErrorCode::BadRequest,
    };
    let body = ApiErrorBody {
        code,
        message: String::from_utf8_lossy(&bytes).trim().to_string(),
        current_state: None,
        dependents: vec![],
        findings: vec![],
        approval: None,
        conflicts: Vec::new(),
    };
    (status, axum::Json(body)).into_response()
}

/// Opens the engine, serves its front ends until SIGINT/SIGTERM and shuts the
/// engine down. Sandboxes keep running when the daemon stops; the next start
/// re-adopts them.
pub async fn run(cfg: Config) -> Result<(), DaemonError> {
    let opened = strata_engine::open(&cfg.engine).await?;
    let st = opened.state.clone();
    // The token exists before any listener does, so a client that sees the socket can read it.
    let token = match cfg.listen {
        Some(_) => Some(Arc::new(strata_engine::ensure_token(&cfg.engine.state_dir)?)),
        None => None,
    };
    if let Some(parent) = cfg.socket.parent() {
        std::fs::create_dir_all(parent).map_err(io_err("create socket directory", parent))?;
    }
    if cfg.socket.exists() {
        if std::os::unix::net::UnixStream::connect(&cfg.socket).is_ok() {
            return Err(DaemonError::AlreadyRunning(cfg.socket.clone()));
        }
        std::fs::remove_file(&cfg.socket).map_err(io_err("remove stale socket", &cfg.socket))?;
    }
    let uds = tokio::net::UnixListener::bind(&cfg.socket).map_err(io_err("bind", &cfg.socket))?;
    std::fs::set_permissions(&cfg.socket, std::os::unix::fs::PermissionsExt::from_mode(0o660))
        .map_err(io_err("chmod", &cfg.socket))?;
    let shutdown = async {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {},
            _ = term.recv() => {},
        }
        info!("shutting down (sandboxes keep running)");
    };
    let (stop_tx, _) = tokio::sync::broadcast::channel::<()>(1);
    let mut tasks = Vec::new();
    let tcp = match cfg.listen {
        Some(addr) => {
            Some(tokio::net::TcpListener::bind(addr).await.map_err(io_err("bind TCP", Path::new("listen address")))?)
        }
        None => None,
    };
    // The MCP endpoint's tools call the engine in-process, as the caller
    // each `/mcp` request authenticated as.
    let mcp = strata_mcp::StrataMcp::new(crate::mcp::InProcess::new(st.clone()));
    let previews = Arc::new(preview::PreviewPool::default());
    let app = app_with_mcp(st.clone(), tenancy::Listener::Unix, Some(mcp.clone()), previews.clone());
    if let (Some(tcp), Some(token)) = (tcp, token) {
        let addr = tcp.local_addr().map_err(io_err("bind TCP", Path::new("listen address")))?;
        info!(%addr, "listening on TCP (bearer token required)");
        let _ = st.previews.listen.set(addr);
        // The E2B-compatible API (docs/e2b-compat.md) is TCP only: it calls
        // this listener's native API with the caller's own token.
        let e2b_layer = e2b::E2b::new(st.clone(), token.clone(), previews.clone());
        let tcp_app = e2b::mount(
            app_with_mcp(st.clone(), tenancy::Listener::Tcp { legacy: token }, Some(mcp), previews),
            e2b_layer,
        );
        let mut rx = stop_tx.subscribe();
        tasks.push(tokio::spawn(async move {
            // No Nagle delay: streamed responses (process output, Connect
            // messages, NDJSON) are many small writes.
            let tcp = axum::serve::ListenerExt::tap_io(tcp, |s: &mut tokio::net::TcpStream| {
                let _ = s.set_nodelay(true);
            });
            let _ = axum::serve(tcp, tcp_app.into_make_service_with_connect_info::<SocketAddr>())
                .with_graceful_shutdown(async move {
                    let _ = rx.recv().await;
                })
                .await;
        }));
    }
    info!(socket = %cfg.socket.display(), state_dir = %cfg.engine.state_dir.display(), "strata daemon ready");
    let mut rx = stop_tx.subscribe();
    let uds_task = tokio::spawn(async move {
        if let Err(e) = axum::serve(uds, app.into_make_service_with_connect_info::<audit::UdsPeer>())
            .with_graceful_shutdown(async move {
                let _ = rx.recv().await;
            })
            .await
        {
            warn!(error = %e, "unix socket server failed");
        }
    });
    shutdown.await;
    strata_engine::shutdown(&st).await;
    let _ = stop_tx.send(());
    // Streams (follow) may hold connections open: do not wait for them forever.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), uds_task).await;
    for t in tasks {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), t).await;
    }
    let _ = std::fs::remove_file(&cfg.socket);
    // The state directory's lock goes last.
    drop(opened);
    Ok(())
}
