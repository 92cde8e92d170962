//! The strata daemon: serves the native HTTP API over a Unix socket (and TCP
//! with a bearer token), supervises sandbox processes and applies automatic
//! lifecycle transitions (TTL expiry, init loss, re-adoption after restart,
//! idle/lifetime/retention policy).
//!
//! Modules: [`sandboxes`] (lifecycle), [`policy`] (automatic transitions),
//! [`activity`] (idle detection, leases), [`processes`] (exec and background
//! processes), [`files`] + [`sandboxfs`] (confined file access), [`images`],
//! [`events`], [`openapi`], [`error`], [`tenancy`] (who a caller is, what it
//! may see, API tokens).

pub mod accounting;
pub mod activity;
pub mod admission;
pub mod advisor;
pub mod approvals;
pub mod archive;
pub mod audit;
pub mod checkpoints;
pub mod disk;
pub mod e2b;
pub mod error;
pub mod events;
pub mod fanout;
pub mod files;
pub mod hooks;
pub mod hygiene;
pub mod images;
pub mod initbin;
pub mod metrics;
pub mod ndjson;
pub mod network;
pub mod openapi;
pub mod pipelines;
pub mod policy;
pub mod preview;
pub mod privileges;
pub mod processes;
pub mod quotas;
pub mod sandboxes;
pub mod sandboxfs;
pub mod scan;
pub mod secrets;
pub mod standby;
pub mod state;
pub mod templates;
pub mod tenancy;
pub mod transfer;
pub mod warm;

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use strata_api::{ApiErrorBody, ErrorCode};
use tracing::{info, warn};

use crate::error::ApiError;
use crate::state::{AppState, Shared};

/// Failure injection for crash and error-path tests: `STRATA_FAILPOINTS` (a
/// comma-separated list, read once at start) names the points that fail with
/// the error a full disk gives (ENOSPC); `NAME:crash` aborts the daemon there
/// instead (a kill -9 at that step). Unset in production.
pub fn failpoint(name: &str) -> std::io::Result<()> {
    static POINTS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let points = POINTS.get_or_init(|| {
        std::env::var("STRATA_FAILPOINTS")
            .map(|v| v.split(',').map(|s| s.trim().to_string()).collect())
            .unwrap_or_default()
    });
    if points.iter().any(|p| p == name) {
        tracing::warn!(failpoint = name, "failpoint triggered");
        return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
    }
    if points.iter().any(|p| p.strip_suffix(":crash") == Some(name)) {
        tracing::error!(failpoint = name, "failpoint: crashing the daemon");
        std::process::abort();
    }
    Ok(())
}

/// Errors that stop the daemon from starting.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// Filesystem problem with the state directory or socket.
    #[error("{what} {}", path.display())]
    Io {
        /// What was attempted.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Another daemon owns the state directory or socket.
    #[error("another strata daemon is already using {0}")]
    AlreadyRunning(PathBuf),
    /// Metadata could not be opened.
    #[error(transparent)]
    Db(#[from] strata_store::DbError),
    /// The layer store could not be opened.
    #[error(transparent)]
    Layers(#[from] strata_store::LayerStoreError),
    /// The runtime is unusable on this host.
    #[error(transparent)]
    Runtime(#[from] strata_runtime::RuntimeError),
    /// The archive store is unusable.
    #[error(transparent)]
    Archive(#[from] archive::ArchiveStoreError),
    /// The in-sandbox binary is missing or unusable.
    #[error(transparent)]
    InitBinary(#[from] initbin::InitBinaryError),
    /// The prices file is unusable.
    #[error("{0}")]
    Prices(String),
    /// Startup reconciliation failed.
    #[error("reconciling sandboxes: {0}")]
    Reconcile(String),
    /// A default limit, reserve, over-commit ratio or tenant quota flag is unusable.
    #[error(transparent)]
    Admission(#[from] admission::ConfigError),
}

/// Daemon configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// State directory (metadata, layers, sandboxes, token).
    pub state_dir: PathBuf,
    /// Unix socket path.
    pub socket: PathBuf,
    /// Optional TCP address (bearer-token auth).
    pub listen: Option<SocketAddr>,
    /// The strata binary, used for the `_init` and `_restore` helpers.
    pub helper_exe: PathBuf,
    /// The static `strata-init` binary (default: looked up, see [`initbin::candidates`]).
    pub init_binary: Option<PathBuf>,
    /// Object store for archives (`file:///path`, `s3://bucket/prefix`; default `<state>/archive`).
    pub archive_url: Option<String>,
    /// Prices for cost accounting (JSON file; default: built-in list prices).
    pub prices: Option<PathBuf>,
    /// Per-sandbox networks: address pool and upstream DNS server.
    pub network: network::NetworkConfig,
    /// How long a Rule-of-Two approval waits for a decision (default 15 minutes).
    pub approval_timeout: Option<std::time::Duration>,
    /// Default limits (disk included), admission control and the default tenant quota.
    pub admission: admission::AdmissionConfig,
    /// How many disks of the default size to keep ready (0: make each on demand).
    pub disk_pool: usize,
    /// Domain of host-based preview URLs (`<port>-<sandbox>.<domain>`; default [`preview::DEFAULT_DOMAIN`]).
    pub preview_domain: Option<String>,
}

/// Name of the token file in the state directory.
pub const TOKEN_FILE: &str = "api-token";

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> DaemonError + 'a {
    move |source| DaemonError::Io { what, path: path.to_path_buf(), source }
}

/// Reads or creates the API token (0600).
pub fn ensure_token(state_dir: &Path) -> Result<String, DaemonError> {
    let p = state_dir.join(TOKEN_FILE);
    match std::fs::read_to_string(&p) {
        Ok(t) if !t.trim().is_empty() => Ok(t.trim().to_string()),
        _ => {
            let token = format!(
                "{:016x}{:016x}{:016x}{:016x}",
                rand::random::<u64>(),
                rand::random::<u64>(),
                rand::random::<u64>(),
                rand::random::<u64>()
            );
            strata_store::fsutil::write_atomic(&p, token.as_bytes(), 0o600).map_err(io_err("write token", &p))?;
            Ok(token)
        }
    }
}

/// The router of one listener: [`router`] behind [`tenancy::authenticate`]
/// (the operator on the Unix socket; a bearer token on TCP).
pub fn app(st: Shared, listener: tenancy::Listener) -> Router {
    app_with_mcp(st, listener, None)
}

/// [`app`] with the MCP endpoint at `/mcp` (see [`router_with_mcp`]).
/// Preview URLs ([`preview::intercept`]) are served before authentication:
/// they carry a preview token, not an API token.
pub fn app_with_mcp(st: Shared, listener: tenancy::Listener, mcp: Option<strata_mcp::StrataMcp>) -> Router {
    router_with_mcp(st.clone(), mcp)
        .layer(middleware::from_fn_with_state((st.clone(), listener), tenancy::authenticate))
        .layer(middleware::from_fn_with_state(st, preview::intercept))
}

/// The router with every native route. It expects a [`tenancy::Caller`] in
/// each request (see [`app`]); without one every request is a 401.
pub fn router(st: Shared) -> Router {
    router_with_mcp(st, None)
}

/// The router with every native route and, when given, the MCP endpoint at
/// `/mcp` (streamable HTTP; see docs/mcp.md). It sits behind the same layers
/// as the API (authentication, tenancy, audit), and its tools call the API
/// itself, with the caller's bearer token when there is one.
pub fn router_with_mcp(st: Shared, mcp: Option<strata_mcp::StrataMcp>) -> Router {
    use crate::{
        activity as a, checkpoints as c, files as f, images as i, processes as p, sandboxes as s, templates as t,
    };
    let r = Router::new()
        .route("/openapi.json", get(|| async { ([(header::CONTENT_TYPE, "application/json")], openapi::spec_json()) }))
        .route("/metrics", get(metrics::metrics_handler))
        .route("/v1/cost", get(accounting::list_handler))
        .route("/v1/cost/{id}", get(accounting::get_handler))
        .route("/v1/advise", post(advisor::advise_handler))
        .route("/v1/info", get(events::info_handler))
        .route("/v1/doctor", get(events::doctor_handler))
        .route("/v1/events", get(events::events_handler))
        .route("/v1/images", get(i::list_handler))
        .route("/v1/images/import", post(i::import_handler))
        .route("/v1/images/pull", post(i::pull_handler))
        .route("/v1/images/{name}", get(i::get_handler).delete(i::remove_handler))
        .route("/v1/sandboxes", get(s::list_handler).post(s::create_handler))
        .route("/v1/sandboxes/{id}", get(s::get_handler).delete(s::remove_handler).patch(policy::update_handler))
        .route("/v1/sandboxes/{id}/leases", get(a::list_leases_handler).post(a::create_lease_handler))
        .route("/v1/sandboxes/{id}/leases/{lease}", axum::routing::delete(a::release_lease_handler))
        .route("/v1/sandboxes/{id}/leases/{lease}/renew", post(a::renew_lease_handler))
        .route("/v1/sandboxes/{id}/stop", post(s::stop_handler))
        .route("/v1/sandboxes/{id}/network", get(network::get_handler).put(network::put_handler))
        .route("/v1/sandboxes/{id}/previews", get(preview::list_handler).post(preview::create_handler))
        .route("/v1/sandboxes/{id}/previews/{preview}", axum::routing::delete(preview::revoke_handler))
        .route("/v1/sandboxes/{id}/pause", post(crate::standby::pause_handler))
        .route("/v1/sandboxes/{id}/unpause", post(crate::standby::unpause_handler))
        .route("/v1/sandboxes/{id}/standby", post(crate::standby::standby_handler))
        .route("/v1/sandboxes/{id}/resume", post(crate::standby::resume_handler))
        .route("/v1/sandboxes/{id}/archive", post(crate::archive::archive_handler))
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
        .route("/v1/audit", get(audit::list_handler))
        .route("/v1/audit/verify", get(audit::verify_handler))
        .route("/v1/templates", get(t::list_handler).post(t::create_handler))
        .route("/v1/templates/build", post(t::build_handler))
        .route("/v1/templates/{name}", axum::routing::delete(t::delete_handler))
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
        .route("/v1/sandboxes/{id}/processes/{pid}/wait", post(p::wait_handler))
        .route("/v1/sandboxes/{id}/files", get(f::download_handler).put(f::upload_handler))
        .route("/v1/sandboxes/{id}/files/stat", get(f::stat_handler))
        .route("/v1/sandboxes/{id}/files/list", get(f::list_handler))
        .route("/v1/sandboxes/{id}/files/mkdir", post(f::mkdir_handler))
        .route("/v1/sandboxes/{id}/files/remove", post(f::remove_handler))
        .route("/v1/sandboxes/{id}/files/move", post(f::move_handler))
        .fallback(|| async { ApiError::new(ErrorCode::RouteNotFound, "no such route (see /openapi.json)") });
    let r = match mcp {
        Some(server) => r.route_service("/mcp", strata_mcp::http_service(server)),
        None => r,
    };
    r.layer(middleware::from_fn_with_state(st.clone(), crate::standby::resume_on_access))
        .layer(middleware::from_fn_with_state(st.clone(), activity::track))
        // Tenancy: outside activity tracking and resume-on-access, so a request
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
    };
    (status, axum::Json(body)).into_response()
}

/// The loopback form of a listening address (`0.0.0.0:p` -> `127.0.0.1:p`, `[::]:p` -> `[::1]:p`).
pub(crate) fn loopback(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), addr.port())
        }
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(std::net::Ipv6Addr::LOCALHOST.into(), addr.port())
        }
        _ => addr,
    }
}

/// Holds an exclusive flock on `<state>/daemon.lock` for the daemon's lifetime.
fn lock_state_dir(state_dir: &Path) -> Result<std::fs::File, DaemonError> {
    let p = state_dir.join("daemon.lock");
    let f =
        std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&p).map_err(io_err("open", &p))?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(DaemonError::AlreadyRunning(state_dir.to_path_buf()));
    }
    Ok(f)
}

/// Opens the state, reconciles sandboxes with reality and serves until SIGINT/SIGTERM.
/// Sandboxes keep running when the daemon stops; the next start re-adopts them.
pub async fn run(cfg: Config) -> Result<(), DaemonError> {
    std::fs::create_dir_all(&cfg.state_dir).map_err(io_err("create state directory", &cfg.state_dir))?;
    let s = cfg.state_dir.to_string_lossy();
    if s.contains(',') || s.contains(':') {
        return Err(DaemonError::Io {
            what: "state directory must not contain ',' or ':'",
            path: cfg.state_dir.clone(),
            source: std::io::ErrorKind::InvalidInput.into(),
        });
    }
    let _lock = lock_state_dir(&cfg.state_dir)?;
    // Orphaned sandbox inits are reparented to us, so we can reap them.
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let db = strata_store::Db::open(&cfg.state_dir.join("metadata.db"))?;
    let layers = strata_store::LayerStore::open(cfg.state_dir.join("layers"))?;
    let sandboxes_dir = cfg.state_dir.join("sandboxes");
    std::fs::create_dir_all(&sandboxes_dir).map_err(io_err("create", &sandboxes_dir))?;
    let pinned = initbin::pin(cfg.init_binary.as_deref(), &cfg.helper_exe, &cfg.state_dir)?;
    let init_binary = initbin::serve(&pinned, &cfg.state_dir)?;
    let runtime = strata_runtime::namespace::NamespaceRuntime::new(
        cfg.helper_exe.clone(),
        init_binary,
        cfg.state_dir.join("run"),
    )?;
    let archive = match cfg.archive_url.as_deref() {
        Some(url) => archive::ArchiveStore::from_url(url)?,
        None => archive::ArchiveStore::local(&cfg.state_dir.join("archive"))?,
    };
    let prices = match cfg.prices.as_deref() {
        Some(p) => accounting::load_prices(p).map_err(DaemonError::Prices)?,
        None => strata_api::Prices::default(),
    };
    let admission = Arc::new(admission::Admission::new(&cfg.admission, admission::HostBounds::probe(&cfg.state_dir)?)?);
    let default_disk_bytes = admission.defaults().disk_bytes;
    {
        let (d, q) = (admission.defaults(), admission.tenant_defaults());
        info!(memory = ?d.memory_bytes, cpus = ?d.cpus, pids = ?d.pids, disk = ?d.disk_bytes, tenant_sandboxes = ?q.sandboxes, tenant_memory = ?q.memory_bytes, tenant_disk = ?q.disk_bytes, tenant_forks_per_minute = ?q.forks_per_minute, "default limits and tenant quota");
    }
    let mut app_state = AppState::new(db, layers, Arc::new(runtime), cfg.state_dir.clone(), archive, admission);
    app_state.prices = prices;
    app_state.network = network::Network::new(&cfg.state_dir, &cfg.network);
    app_state.approval_timeout = cfg.approval_timeout.unwrap_or(approvals::DEFAULT_TIMEOUT);
    app_state.disks = Arc::new(disk::DiskPool::new(&cfg.state_dir, default_disk_bytes, cfg.disk_pool));
    if let (Some(_), Some(why)) = (default_disk_bytes, disk::unavailable()) {
        tracing::warn!(
            "per-sandbox disk limits are unavailable on this host: {why}; sandboxes record disk_quota: unavailable"
        );
    }
    let preview_domain =
        cfg.preview_domain.as_deref().unwrap_or(preview::DEFAULT_DOMAIN).trim_end_matches('.').to_ascii_lowercase();
    app_state.previews = preview::Previews::new(preview::PreviewConfig { domain: preview_domain });
    let st: Shared = Arc::new(app_state);
    sandboxes::reconcile(&st).await.map_err(|e| DaemonError::Reconcile(e.body.message))?;
    warm::sweep(&st).map_err(|e| DaemonError::Reconcile(e.body.message))?;
    // Pool leftovers of an earlier daemon go first: their images must not be mounted twice.
    st.disks.sweep();
    sandboxes::mount_disks(&st).await;
    st.disks.clone().start();
    network::reconcile(&st).await;
    pipelines::reconcile(&st).map_err(|e| DaemonError::Reconcile(e.body.message))?;
    // Names from before names that read as ids were refused: warned about (and listed by doctor).
    if let Err(e) = events::names_like_ids(&st) {
        warn!(error = %e.body.message, "checking names that look like ids");
    }
    tokio::spawn(sandboxes::ttl_reaper(st.clone()));
    tokio::spawn(policy::run(st.clone()));
    tokio::spawn(accounting::run(st.clone()));

    // The token exists before any listener does, so a client that sees the socket can read it.
    let token = match cfg.listen {
        Some(_) => Some(Arc::new(ensure_token(&cfg.state_dir)?)),
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
    // The MCP endpoint's tools call this daemon's API: over the Unix socket,
    // or, for a caller that came with a bearer token, over TCP with that token.
    let mut mcp = strata_mcp::StrataMcp::new(strata_client::Client::unix(&cfg.socket));
    if let Some(local) = tcp.as_ref().and_then(|l| l.local_addr().ok()) {
        mcp = mcp.with_token_forwarding(loopback(local).to_string());
    }
    let app = app_with_mcp(st.clone(), tenancy::Listener::Unix, Some(mcp.clone()));
    if let (Some(tcp), Some(token)) = (tcp, token) {
        let addr = tcp.local_addr().map_err(io_err("bind TCP", Path::new("listen address")))?;
        info!(%addr, "listening on TCP (bearer token required)");
        let _ = st.previews.listen.set(addr);
        // The E2B-compatible API (docs/e2b-compat.md) is TCP only: it calls
        // this listener's native API with the caller's own token.
        let e2b_layer = e2b::E2b::new(loopback(addr).to_string());
        let tcp_app =
            e2b::mount(app_with_mcp(st.clone(), tenancy::Listener::Tcp { legacy: token }, Some(mcp)), e2b_layer);
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
    info!(socket = %cfg.socket.display(), state_dir = %cfg.state_dir.display(), "strata daemon ready");
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
    network::shutdown(&st).await;
    st.disks.drain();
    initbin::unserve(&cfg.state_dir);
    let _ = stop_tx.send(());
    // Streams (follow) may hold connections open: do not wait for them forever.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), uds_task).await;
    for t in tasks {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), t).await;
    }
    let _ = std::fs::remove_file(&cfg.socket);
    Ok(())
}
