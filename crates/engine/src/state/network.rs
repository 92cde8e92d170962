//! Per-sandbox networks, the engine's record of them ([`Network`]: the
//! address pool, each sandbox's spec, slot and resolved rules, DNS counters,
//! the base ruleset), persisted under `<state>/network/`. Preparing,
//! attaching, updating and releasing them is [`crate::network`]'s.

use std::collections::{HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path as FsPath, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use strata_api::{NetworkMode, NetworkSpec};
use strata_net::{NetError, Pool, Rule};
use tracing::warn;

use crate::error::EngineError;

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    /// A spec is malformed (400, naming the rule).
    #[error("{0}")]
    Invalid(String),
    /// Egress cannot work on this host.
    #[error("egress networking is unavailable here: {0}")]
    Unavailable(String),
    /// Plumbing failed.
    #[error(transparent)]
    Net(#[from] NetError),
    /// The store could not be written.
    #[error("network store {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The pool is exhausted.
    #[error("the network pool {0} has no free address left")]
    PoolFull(String),
}

impl From<NetworkError> for EngineError {
    fn from(e: NetworkError) -> Self {
        match e {
            NetworkError::Invalid(m) => EngineError::bad_request(m),
            NetworkError::Unavailable(_) => EngineError::new(strata_api::ErrorCode::Unsupported, e.to_string()),
            other => EngineError::internal("network", &other),
        }
    }
}

/// Daemon settings of the network feature.
#[derive(Debug, Clone, Default)]
pub struct NetworkConfig {
    /// Address pool (default [`strata_net::pool::DEFAULT_POOL`]).
    pub pool: Option<String>,
    /// Upstream DNS server (default: the first IPv4 nameserver of /etc/resolv.conf).
    pub dns_upstream: Option<SocketAddr>,
}

/// What is stored per egress sandbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Entry {
    pub(crate) spec: NetworkSpec,
    pub(crate) slot: u32,
    #[serde(skip)]
    pub(crate) rules: Vec<Rule>,
}

#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct DnsStats {
    pub(crate) answered: u64,
    pub(crate) refused: u64,
}

/// State of the lazily started parts (table, resolver).
pub(crate) struct Base {
    pub(crate) table: String,
}

/// The network feature's state.
pub struct Network {
    pub(crate) pool: Result<Pool, String>,
    pub(crate) upstream: Option<SocketAddr>,
    pub(crate) store_dir: PathBuf,
    pub(crate) netns_dir: PathBuf,
    pub(crate) entries: Mutex<HashMap<String, Entry>>,
    pub(crate) dns: Mutex<HashMap<String, DnsStats>>,
    pub(crate) base: tokio::sync::OnceCell<Result<Base, String>>,
    /// Background removals in flight ([`forget_later`]); shutdown waits for them.
    pub(crate) pending: std::sync::atomic::AtomicUsize,
    /// Last time a denial was logged, per sandbox (rate limit).
    pub(crate) logged: Mutex<HashMap<String, (Option<Instant>, u64)>>,
}

impl Network {
    /// Loads the stored entries.
    pub fn new(state_dir: &FsPath, cfg: &NetworkConfig) -> Self {
        let pool = Pool::parse(cfg.pool.as_deref().unwrap_or(strata_net::pool::DEFAULT_POOL));
        let store_dir = state_dir.join("network");
        let mut entries = HashMap::new();
        if let Ok(rd) = std::fs::read_dir(&store_dir) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(id) = name.strip_suffix(".json") else { continue };
                match std::fs::read(e.path()).ok().and_then(|b| serde_json::from_slice::<Entry>(&b).ok()) {
                    Some(mut entry) => {
                        entry.rules =
                            strata_net::rules::parse_spec(&entry.spec.allow, &entry.spec.deny).unwrap_or_default();
                        entries.insert(id.to_string(), entry);
                    }
                    None => warn!(file = %e.path().display(), "unreadable network entry; ignored"),
                }
            }
        }
        Network {
            pool,
            upstream: cfg.dns_upstream.or_else(upstream_from_resolv_conf),
            store_dir,
            netns_dir: state_dir.join("run").join("netns"),
            entries: Mutex::new(entries),
            dns: Mutex::default(),
            base: tokio::sync::OnceCell::new(),
            logged: Mutex::default(),
            pending: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    pub(crate) fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn pool(&self) -> Result<Pool, NetworkError> {
        self.pool.clone().map_err(NetworkError::Unavailable)
    }

    /// The network spec of a sandbox (`none` when it has no entry).
    pub fn spec_of(&self, id: &str) -> NetworkSpec {
        self.entries().get(id).map(|e| e.spec.clone()).unwrap_or_default()
    }

    pub(crate) fn netns_path(&self, id: &str) -> PathBuf {
        self.netns_dir.join(id)
    }

    pub(crate) fn save(&self, id: &str, entry: &Entry) -> Result<(), NetworkError> {
        std::fs::create_dir_all(&self.store_dir)
            .map_err(|source| NetworkError::Io { path: self.store_dir.clone(), source })?;
        let p = self.store_dir.join(format!("{id}.json"));
        let bytes = serde_json::to_vec_pretty(entry).expect("entry serializes");
        strata_store::fsutil::write_atomic(&p, &bytes, 0o600).map_err(|source| NetworkError::Io { path: p, source })
    }

    pub(crate) fn delete_entry(&self, id: &str) {
        self.entries().remove(id);
        let _ = std::fs::remove_file(self.store_dir.join(format!("{id}.json")));
    }

    /// Records the network of a new sandbox (nothing for `none`).
    pub(crate) fn put(&self, id: &str, spec: NetworkSpec, rules: Vec<Rule>) -> Result<(), NetworkError> {
        if spec.mode == NetworkMode::None {
            self.delete_entry(id);
            return Ok(());
        }
        let pool = self.pool()?;
        let mut entries = self.entries();
        let slot = match entries.get(id) {
            Some(e) => e.slot,
            None => {
                let used: HashSet<u32> = entries.values().map(|e| e.slot).collect();
                pool.first_free(&used).ok_or_else(|| NetworkError::PoolFull(pool.cidr.to_string()))?
            }
        };
        let entry = Entry { spec, slot, rules };
        self.save(id, &entry)?;
        entries.insert(id.to_string(), entry);
        Ok(())
    }

    /// The sandbox whose address is `ip`.
    pub(crate) fn by_address(&self, ip: Ipv4Addr) -> Option<(String, Vec<Rule>)> {
        let pool = self.pool.clone().ok()?;
        self.entries()
            .iter()
            .find(|(_, e)| pool.link(e.slot).is_some_and(|l| l.address == ip))
            .map(|(id, e)| (id.clone(), e.rules.clone()))
    }
}

pub(crate) fn upstream_from_resolv_conf() -> Option<SocketAddr> {
    let text = std::fs::read_to_string("/etc/resolv.conf").ok()?;
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|a| a.trim().parse::<Ipv4Addr>().ok())
        .map(|ip| SocketAddr::from((ip, 53)))
        .next()
}
