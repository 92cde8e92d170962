//! What the daemon holds: [`AppState`] (shared as [`Shared`]) and its
//! components, one file each: the [`activity`] tracker, the [`processes`]
//! table, the [`secrets`] store, per-sandbox [`network`]s, the [`archive`]
//! store, the [`pipelines`] driver's runs and progress, the warm [`pool`]s' book, the isolation [`tiers`], the [`preview`] proxy's state, cost [`accounting`] samples and
//! [`metrics`]. The layer below every operation: nothing here calls one (a
//! unit test checks it, `tests/layers.rs`); the operations that use a
//! component live in the engine module of the same name.

pub mod accounting;
pub mod activity;
pub mod archive;
pub mod metrics;
pub mod network;
pub mod pipelines;
pub mod pool;
pub mod preview;
pub mod processes;
pub mod secrets;
pub mod tiers;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use strata_runtime::Runtime;
use strata_store::{Db, LayerStore};

use self::activity::ActivityTracker;
use self::processes::ProcessTable;

/// Default time a pending Rule-of-Two approval waits for a decision (and an
/// approved one for its use); `--approval-timeout` changes it.
pub const DEFAULT_APPROVAL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// Everything handlers share.
pub struct AppState {
    /// Metadata.
    pub db: Db,
    /// Content-addressed layers.
    pub layers: LayerStore,
    /// The namespace tier's runtime (the default tier's, in unit tests a fake).
    /// A sandbox's own is [`AppState::runtime_of`].
    pub runtime: Arc<dyn Runtime>,
    /// The gVisor tier's runtime, when this daemon runs that tier.
    pub gvisor: Option<Arc<dyn Runtime>>,
    /// The microvm tier's runtime, when this daemon runs that tier.
    pub microvm: Option<Arc<dyn Runtime>>,
    /// `<state>/sandboxes`: per-sandbox upper/work/rootfs directories.
    pub sandboxes_dir: PathBuf,
    /// The state directory.
    pub state_dir: PathBuf,
    /// Processes started through the API, per sandbox.
    pub processes: ProcessTable,
    /// Recent API activity and open connections, per sandbox (for idle detection).
    pub activity: Arc<ActivityTracker>,
    /// Per-sandbox operation locks: one transition at a time per sandbox.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Serializes image imports/removals against each other (layer refcounts).
    pub image_lock: tokio::sync::Mutex<()>,
    /// Wakes `events --follow` streams.
    pub events_tx: tokio::sync::watch::Sender<i64>,
    /// Wakes the policy loop when a policy changed (a new deadline may be sooner than its next tick).
    pub policy_changed: tokio::sync::Notify,
    /// Where archived sandboxes go.
    pub archive: self::archive::ArchiveStore,
    /// Prometheus metrics.
    pub metrics: self::metrics::Metrics,
    /// Cost accounting sampler state.
    pub accounting: self::accounting::Accounting,
    /// Prices for cost reports.
    pub prices: strata_api::Prices,
    /// Secret values of sandboxes (memory + `<state>/secrets/`).
    pub secrets: self::secrets::SecretStore,
    /// Per-sandbox networks (egress entries, DNS filter state).
    pub network: self::network::Network,
    /// How long a Rule-of-Two approval waits for a decision (and then for its use).
    pub approval_timeout: std::time::Duration,
    /// How often persistent sandboxes whose policy names no `check_every` are
    /// checked (`--check-every`; `None`: they are not).
    pub default_check_every: Option<std::time::Duration>,
    /// Resumes from standby ask the tier for lazily restored memory (`--lazy-restore`).
    pub lazy_restore: bool,
    /// Default limits, their bounds, admission control and tenant quotas.
    pub admission: Arc<crate::admission::Admission>,
    /// The preview proxy (settings, idle upstream connections).
    pub previews: self::preview::Previews,
    /// Disk templates and ready disks of the default size (see [`strata_runtime::disk`]).
    pub disks: Arc<strata_runtime::disk::DiskPool>,
    /// Pipeline runs driven by this daemon, pause requests, progress.
    pub pipelines: self::pipelines::Pipelines,
    /// The isolation tiers this daemon runs, and the default one.
    pub tiers: self::tiers::Tiers,
    /// The warm pools (`--warm-pool`): configuration, members, counters.
    pub pools: self::pool::Pools,
}

impl AppState {
    /// Builds the state.
    pub fn new(
        db: Db,
        layers: LayerStore,
        runtime: Arc<dyn Runtime>,
        state_dir: PathBuf,
        archive: self::archive::ArchiveStore,
        admission: Arc<crate::admission::Admission>,
    ) -> Self {
        let (events_tx, _) = tokio::sync::watch::channel(0);
        AppState {
            db,
            layers,
            runtime,
            gvisor: None,
            microvm: None,
            sandboxes_dir: state_dir.join("sandboxes"),
            secrets: self::secrets::SecretStore::new(&state_dir),
            network: self::network::Network::new(&state_dir, &Default::default()),
            disks: Arc::new(strata_runtime::disk::DiskPool::disabled(&state_dir)),
            state_dir,
            processes: ProcessTable::default(),
            activity: Arc::new(ActivityTracker::default()),
            locks: Mutex::new(HashMap::new()),
            image_lock: tokio::sync::Mutex::new(()),
            events_tx,
            policy_changed: tokio::sync::Notify::new(),
            archive,
            metrics: self::metrics::Metrics::new(),
            accounting: self::accounting::Accounting::default(),
            prices: strata_api::Prices::default(),
            approval_timeout: DEFAULT_APPROVAL_TIMEOUT,
            default_check_every: None,
            lazy_restore: false,
            admission,
            previews: self::preview::Previews::default(),
            pipelines: self::pipelines::Pipelines::default(),
            tiers: self::tiers::Tiers::default(),
            pools: self::pool::Pools::default(),
        }
    }

    /// The runtime of `tier`; for a tier this daemon does not run, one that
    /// refuses every operation saying why ([`tiers::Missing`]).
    pub fn runtime_for(&self, tier: strata_api::Isolation) -> Arc<dyn Runtime> {
        let missing = |why: &str| -> Arc<dyn Runtime> { Arc::new(tiers::Missing::new(tier, why)) };
        match tier {
            strata_api::Isolation::Namespace => self.runtime.clone(),
            strata_api::Isolation::Gvisor => match &self.gvisor {
                Some(rt) => rt.clone(),
                None => missing(self.tiers.why_not(tier).unwrap_or("not run by this daemon")),
            },
            strata_api::Isolation::Microvm => match &self.microvm {
                Some(rt) => rt.clone(),
                None => missing(self.tiers.why_not(tier).unwrap_or("not run by this daemon")),
            },
        }
    }

    /// The runtime sandbox `sb` runs on (the tier its record names).
    pub fn runtime_of(&self, sb: &strata_api::Sandbox) -> Arc<dyn Runtime> {
        self.runtime_for(tiers::tier_of(sb))
    }

    /// The runtime of the sandbox with id `id` (the namespace tier's when it
    /// is not recorded: nothing of it runs then).
    pub fn runtime_by_id(&self, id: &str) -> Arc<dyn Runtime> {
        match self.db.sandbox_by_id(id) {
            Ok(Some(rec)) => self.runtime_of(&rec.sandbox),
            _ => self.runtime.clone(),
        }
    }

    /// The operation lock of one sandbox.
    pub fn lock_for(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut m = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        m.entry(id.to_string()).or_default().clone()
    }

    /// Forgets the lock of a destroyed sandbox.
    pub fn drop_lock(&self, id: &str) {
        self.locks.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
    }

    /// Directory of one sandbox.
    pub fn sandbox_dir(&self, id: &str) -> PathBuf {
        self.sandboxes_dir.join(id)
    }

    /// The manifest of sandbox `id`'s writable layer at its checkpoint
    /// `checkpoint_id` (what its next checkpoint compares with).
    pub fn checkpoint_manifest(&self, id: &str, checkpoint_id: &str) -> PathBuf {
        self.sandbox_dir(id).join("manifests").join(format!("{checkpoint_id}.json"))
    }

    /// The overlay upper directory (writable layer) of a sandbox (see [`strata_runtime::disk`]).
    pub fn upper_dir(&self, id: &str) -> PathBuf {
        strata_runtime::disk::upper_dir(&self.sandbox_dir(id))
    }

    /// The directories of the layers of `chain` (bottom first, as stored), top first:
    /// the order overlayfs and the walks of [`strata_image::changes`] take them in.
    pub fn layer_dirs(&self, chain: &[String]) -> crate::error::EngineResult<Vec<PathBuf>> {
        chain
            .iter()
            .rev()
            .map(|d| self.layers.fs_dir(d).map_err(|e| crate::error::EngineError::internal("layer", &e)))
            .collect()
    }

    /// Tells event followers that new events exist.
    pub fn notify_events(&self, seq: i64) {
        self.events_tx.send_replace(seq);
    }
}

/// The engine's shared state, as every operation and front end holds it.
pub type Shared = Arc<AppState>;
