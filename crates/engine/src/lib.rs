//! The strata engine: every sandbox operation, with no HTTP in it.
//!
//! What lives here: the lifecycle of sandboxes (create, start, stop, destroy,
//! pause, standby, resume, archive), checkpoints, forks, warm checkpoints,
//! templates, pipelines and fan-out, processes and files, policy and the
//! automatic transitions, tenancy, approvals (Rule of Two), secrets, egress,
//! previews (records and tokens; the proxy is the server's), audit, metrics,
//! cost accounting and the opening of the daemon's state ([`open`]).
//!
//! What may not: axum, hyper, utoipa or anything else that speaks HTTP. Front
//! ends (`strata-server`: the native API, the E2B API, MCP, the preview proxy)
//! translate requests into calls of this crate and its [`error::EngineError`]
//! into their own answers. Privileged work goes through `strata-runtime`.
//!
//! Modules, in layers (a lower one never names a higher one, and no module
//! cycle spans the engine: `src/tests/layers.rs` checks both on the source):
//! - leaves: [`error`], [`clock`], [`caller`] (who calls; fails closed),
//!   [`audit`], [`admission`] (limits, quotas), [`policy_spec`] (policies as
//!   written), [`transfer`] over [`chunks`], [`sandboxfs`] + [`privileges`],
//!   [`initbin`], [`advisor`];
//! - what the daemon holds: [`state`] (`AppState` and its components: the
//!   activity tracker, process table, secret store, network records, archive
//!   store, preview state, cost samples, metrics);
//! - reading it for a caller: [`tenancy`] (resolvers, tokens),
//!   [`process_image`], then [`record`] (sandbox records, `transition`);
//! - the operations: [`lifecycle`] (one file per operation: create, start,
//!   stop, destroy, pause, standby, resume, resume on access, archive,
//!   unarchive, warm starts, reconcile, the init watcher), [`access`] (what every call on a sandbox
//!   does first, from any front end), [`processes`], [`files`], [`network`],
//!   [`preview`], [`secrets`], [`activity`] (leases), [`hooks`], [`archive`],
//!   [`images`], [`checkpoints`] (checkpoint, restore, fork, diff, export, gc,
//!   lineage), [`scan`] + [`hygiene`], [`approvals`] (Rule of Two),
//!   [`quotas`], [`events`], [`accounting`], [`audit_log`];
//! - above them: [`policy`] (the automatic transitions), [`reaper`] (TTLs,
//!   garbage collection), [`pool`] (the warm pool's refill), [`templates`], [`fanout`], [`pipelines`], [`reach`]
//!   (may a caller reach an object);
//! - the surface: [`surface::Engine`], the engine acting for one explicit
//!   caller, one method per operation. Every front end calls the engine only
//!   through it (the native handlers, the E2B API, the daemon's MCP tools).
//!
//! Per-sandbox disks are `strata_runtime::disk`'s.

pub use surface::Engine;

pub mod access;
pub mod accounting;
pub mod accumulation;
pub mod activity;
pub mod admission;
pub mod advisor;
pub mod approvals;
pub mod archive;
pub mod audit;
pub mod audit_log;
pub mod caller;
pub mod checkpoints;
pub mod checks;
pub mod chunks;
pub mod clock;
pub mod dirwatch;
pub mod error;
pub mod events;
pub mod fanout;
pub mod files;
pub(crate) mod guest_layer;
pub mod hooks;
pub mod hygiene;
pub mod images;
pub mod initbin;
pub mod lifecycle;
pub mod network;
pub mod patching;
pub mod pipelines;
pub mod policy;
pub mod policy_spec;
pub mod pool;
pub mod preview;
pub mod privileges;
pub mod process_image;
pub mod processes;
pub mod quarantine;
pub mod quotas;
pub mod reach;
pub mod reaper;
pub mod record;
pub(crate) mod root_spec;
pub mod sandboxfs;
pub mod scan;
pub mod secrets;
pub mod state;
pub mod surface;
pub mod templates;
pub mod tenancy;
pub mod transfer;
pub mod userns_slots;

#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tracing::{info, warn};

use crate::state::{AppState, Shared};

/// Failure injection (`STRATA_FAILPOINTS`): see [`strata_runtime::failpoint`].
pub use strata_runtime::failpoint;

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
    /// No share of the host's user-namespace ranges could be claimed.
    #[error(transparent)]
    UsernsSlots(#[from] userns_slots::ClaimError),
    /// The prices file is unusable.
    #[error("{0}")]
    Prices(String),
    /// Startup reconciliation failed.
    #[error("reconciling sandboxes: {0}")]
    Reconcile(String),
    /// A default limit, reserve, over-commit ratio or tenant quota flag is unusable.
    #[error(transparent)]
    Admission(#[from] admission::ConfigError),
    /// The default isolation tier cannot run on this host.
    #[error("{0}")]
    Isolation(String),
}

/// The tiers this daemon runs: the namespace tier (the runtime it opened),
/// the gVisor tier when runsc is here; for the others, why not (what the host
/// has is said, from the probes).
fn probe_tiers(
    default: strata_api::Isolation,
    gvisor: &strata_runtime::gvisor::GvisorProbe,
    microvm: &strata_runtime::microvm::MicrovmProbe,
) -> Result<state::tiers::Tiers, DaemonError> {
    use strata_api::Isolation;
    let mut unavailable = std::collections::BTreeMap::new();
    if let Some(why) = microvm.unavailable() {
        unavailable.insert(Isolation::Microvm, why);
    }
    if let Some(why) = gvisor.unavailable() {
        unavailable.insert(Isolation::Gvisor, why);
    }
    state::tiers::Tiers::new(default, unavailable).map_err(DaemonError::Isolation)
}

/// What the engine is opened with (the listeners are the server's).
#[derive(Debug, Clone)]
pub struct Config {
    /// State directory (metadata, layers, sandboxes, token).
    pub state_dir: PathBuf,
    /// The strata binary, used for the `_init` and `_restore` helpers.
    pub helper_exe: PathBuf,
    /// The static `strata-init` binary (default: looked up, see [`initbin::candidates`]).
    pub init_binary: Option<PathBuf>,
    /// The metadata database (`postgres://...`, or a SQLite file path; default
    /// `<state>/metadata.db`). A PostgreSQL database is this daemon's alone.
    pub database: Option<String>,
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
    /// The tier of sandboxes whose create names none (`--default-isolation`).
    pub default_isolation: strata_api::Isolation,
    /// Namespace-tier sandboxes get a user namespace unless a create says
    /// `userns: false` (`--default-userns`): `None` where the host supports
    /// it, `Some(true)` always (the daemon refuses to start where it cannot),
    /// `Some(false)` only for sandboxes that declare untrusted input.
    pub default_userns: Option<bool>,
    /// How often persistent sandboxes whose policy names no `check_every`
    /// are checked (`--check-every`; at least [`strata_api::MIN_CHECK_EVERY`]).
    pub default_check_every: Option<std::time::Duration>,
    /// Sources to keep booted sandboxes of (`--warm-pool SOURCE=N`).
    pub warm_pools: Vec<state::pool::PoolConfig>,
    /// Resume from standby with lazily restored memory where the tier and
    /// host can (`--lazy-restore`; see [`strata_runtime::MemoryRestore`]).
    pub lazy_restore: bool,
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

/// The loopback form of a listening address (`0.0.0.0:p` -> `127.0.0.1:p`, `[::]:p` -> `[::1]:p`).
pub fn loopback(addr: SocketAddr) -> SocketAddr {
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

/// The opened engine: its shared state and the lock that keeps a second
/// daemon off the state directory (held until this is dropped).
pub struct Opened {
    /// The engine's state.
    pub state: Shared,
    /// The flock on `<state>/daemon.lock`.
    _lock: std::fs::File,
}

/// Opens the state directory, reconciles sandboxes with reality and starts the
/// background work (TTL reaper, policy loop, cost sampler). Sandboxes kept
/// running while no daemon was up are re-adopted.
pub async fn open(cfg: &Config) -> Result<Opened, DaemonError> {
    // A default tier this host cannot run stops the daemon before it touches anything.
    let gvisor_probe = strata_runtime::gvisor::probe();
    let microvm_probe = strata_runtime::microvm::probe();
    let tiers = probe_tiers(cfg.default_isolation, &gvisor_probe, &microvm_probe)?
        .with_default_userns(cfg.default_userns)
        .map_err(DaemonError::Isolation)?;
    std::fs::create_dir_all(&cfg.state_dir).map_err(io_err("create state directory", &cfg.state_dir))?;
    let s = cfg.state_dir.to_string_lossy();
    if s.contains(',') || s.contains(':') {
        return Err(DaemonError::Io {
            what: "state directory must not contain ',' or ':'",
            path: cfg.state_dir.clone(),
            source: std::io::ErrorKind::InvalidInput.into(),
        });
    }
    let lock = lock_state_dir(&cfg.state_dir)?;
    // Orphaned sandbox inits are reparented to us, so we can reap them.
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let db = match &cfg.database {
        Some(url) => strata_store::Db::open_url(url)?,
        None => strata_store::Db::open(&cfg.state_dir.join("metadata.db"))?,
    };
    info!(database = %db.describe(), "metadata database");
    if tiers.userns_why_not().is_none() {
        // This daemon's share of the host's uid ranges, so no two daemons' sandboxes share host ids.
        let slots = userns_slots::claim(&cfg.state_dir, std::path::Path::new(userns_slots::REGISTRY))?;
        info!(first = slots.start, end = slots.end, "user-namespace slots of this daemon");
        db.set_userns_slots(slots);
    }
    let layers = strata_store::LayerStore::open(cfg.state_dir.join("layers"))?;
    let sandboxes_dir = cfg.state_dir.join("sandboxes");
    std::fs::create_dir_all(&sandboxes_dir).map_err(io_err("create", &sandboxes_dir))?;
    let pinned = initbin::pin(cfg.init_binary.as_deref(), &cfg.helper_exe, &cfg.state_dir)?;
    let init_binary = initbin::serve(&pinned, &cfg.state_dir)?;
    let runtime = strata_runtime::namespace::NamespaceRuntime::new(
        cfg.helper_exe.clone(),
        init_binary.clone(),
        cfg.state_dir.join("run"),
    )?;
    let gvisor: Option<Arc<dyn strata_runtime::Runtime>> = match tiers.why_not(strata_api::Isolation::Gvisor) {
        Some(_) => None,
        None => {
            let rt = strata_runtime::gvisor::GvisorRuntime::new(
                &gvisor_probe,
                cfg.helper_exe.clone(),
                init_binary.clone(),
                cfg.state_dir.join("run"),
            )?;
            info!(version = rt.version(), platform = rt.platform(), "gvisor tier ready");
            Some(Arc::new(rt))
        }
    };
    let microvm: Option<Arc<dyn strata_runtime::Runtime>> = match tiers.why_not(strata_api::Isolation::Microvm) {
        Some(_) => None,
        None => {
            let rt = strata_runtime::microvm::MicrovmRuntime::new(
                &microvm_probe,
                cfg.helper_exe.clone(),
                init_binary,
                cfg.state_dir.join("run"),
                cfg.state_dir.join("microvm"),
            )?;
            info!(qemu = rt.qemu_version(), accel = rt.accel().as_str(), "microvm tier ready");
            Some(Arc::new(rt))
        }
    };
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
    app_state.default_check_every = cfg.default_check_every;
    app_state.lazy_restore = cfg.lazy_restore;
    if cfg.lazy_restore {
        let rt = &app_state.runtime;
        match (rt.lazy_restore_unsupported(false), rt.lazy_restore_unsupported(true)) {
            (None, None) => info!("standby resumes restore memory lazily"),
            (None, Some(why)) => {
                tracing::warn!("standby resumes of sandboxes in user namespaces restore memory eagerly: {why}")
            }
            (Some(why), _) => tracing::warn!("standby resumes restore memory eagerly: {why}"),
        }
    }
    app_state.disks = Arc::new(strata_runtime::disk::DiskPool::new(&cfg.state_dir, default_disk_bytes, cfg.disk_pool));
    if let (Some(_), Some(why)) = (default_disk_bytes, strata_runtime::disk::unavailable()) {
        tracing::warn!(
            "per-sandbox disk limits are unavailable on this host: {why}; sandboxes record disk_quota: unavailable"
        );
    }
    let preview_domain =
        cfg.preview_domain.as_deref().unwrap_or(preview::DEFAULT_DOMAIN).trim_end_matches('.').to_ascii_lowercase();
    app_state.previews = preview::Previews::new(preview::PreviewConfig { domain: preview_domain });
    app_state.tiers = tiers;
    app_state.gvisor = gvisor;
    app_state.microvm = microvm;
    app_state.pools = state::pool::Pools::new(cfg.warm_pools.clone());
    let st: Shared = Arc::new(app_state);
    // Everything from here runs as the daemon itself: it acts in every tenant.
    tenancy::as_daemon(reconcile_at_start(&st)).await?;
    tokio::spawn(tenancy::as_daemon(reaper::ttl_reaper(st.clone())));
    tokio::spawn(tenancy::as_daemon(policy::run(st.clone())));
    tokio::spawn(tenancy::as_daemon(accounting::run(st.clone())));
    tokio::spawn(tenancy::as_daemon(checks::run(st.clone())));
    if st.pools.enabled() {
        tokio::spawn(tenancy::as_daemon(pool::run(st.clone())));
    }
    Ok(Opened { state: st, _lock: lock })
}

/// Brings the store and the host back in line after a start: sandboxes
/// (re-adopted, lost, interrupted standbys completed), warm images, disks,
/// networks, pipeline runs.
async fn reconcile_at_start(st: &Shared) -> Result<(), DaemonError> {
    lifecycle::reconcile(st).await.map_err(|e| DaemonError::Reconcile(e.body.message))?;
    lifecycle::warm::sweep(st).map_err(|e| DaemonError::Reconcile(e.body.message))?;
    // Pool leftovers of an earlier daemon go first: their images must not be mounted twice.
    st.disks.sweep();
    lifecycle::mount_disks(st).await;
    st.disks.clone().start();
    network::reconcile(st).await;
    pipelines::reconcile(st).map_err(|e| DaemonError::Reconcile(e.body.message))?;
    // Warm-pool sandboxes of an earlier run (with or without a pool now) go.
    pool::sweep_leftovers(st).await;
    // Names from before names that read as ids were refused: warned about (and listed by doctor).
    if let Err(e) = events::names_like_ids(st) {
        warn!(error = %e.body.message, "checking names that look like ids");
    }
    Ok(())
}

/// Ends what the engine runs on the host beside its sandboxes (DNS filters,
/// the disk pool, the served init binary); sandboxes keep running, except the
/// warm pool's unassigned ones, which nothing would use until a restart.
pub async fn shutdown(st: &Shared) {
    st.pools.close();
    tenancy::as_daemon(pool::sweep_leftovers(st)).await;
    network::shutdown(st).await;
    st.disks.drain();
    initbin::unserve(&st.state_dir);
}
