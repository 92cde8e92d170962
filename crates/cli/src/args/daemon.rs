//! `strata daemon`: where the daemon runs, what it listens on, and the admission defaults
//! and limits it applies to every sandbox (with their value parsers).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;
use strata_engine::admission::DefaultLimit;

#[derive(Debug, Args)]
pub struct DaemonArgs {
    /// State directory.
    #[arg(long, env = "STRATA_STATE_DIR", default_value = "/var/lib/strata")]
    pub state_dir: PathBuf,
    /// Also listen on TCP (bearer token required; it is written to <state-dir>/api-token).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Metadata database: postgres://USER:PASSWORD@HOST:PORT/DBNAME (libpq's
    /// URL; the daemon creates its schema and uses it alone), or a SQLite file
    /// path. Default: <state-dir>/metadata.db (SQLite).
    #[arg(long, env = "STRATA_DATABASE", value_name = "URL|PATH")]
    pub database: Option<String>,
    /// Object store for archives: file:///path or s3://bucket/prefix (credentials,
    /// region and endpoint from the AWS_* variables). Default: <state-dir>/archive.
    #[arg(long, env = "STRATA_ARCHIVE_URL")]
    pub archive_url: Option<String>,
    /// The static strata-init binary run inside sandboxes (default: next to strata,
    /// then target/x86_64-unknown-linux-gnu/release/ of a source tree, then /usr/local/lib/strata).
    #[arg(long, env = "STRATA_INIT_BINARY")]
    pub init_binary: Option<PathBuf>,
    /// Prices for cost accounting, a JSON file (see docs/metrics.md); missing
    /// fields keep the built-in defaults.
    #[arg(long, env = "STRATA_PRICES")]
    pub prices: Option<PathBuf>,
    /// Address pool of egress sandboxes (IPv4 CIDR, /8 to /28; each sandbox takes a /30).
    /// Daemons sharing a host need disjoint pools. Default: 10.213.0.0/16.
    #[arg(long, env = "STRATA_NETWORK_POOL")]
    pub network_pool: Option<String>,
    /// Upstream DNS server of the sandboxes' filtering resolver (IP:PORT).
    /// Default: the first IPv4 nameserver in /etc/resolv.conf.
    #[arg(long, env = "STRATA_DNS_UPSTREAM")]
    pub dns_upstream: Option<std::net::SocketAddr>,
    /// Writable-layer size of sandboxes created without --disk (each gets its
    /// own ext4 filesystem of that size on a loop device); `none`: no default
    /// disk limit. Default: 10g (at most the state filesystem's size).
    #[arg(long, env = "STRATA_DEFAULT_DISK", value_name = "SIZE|none", value_parser = parse_default_size)]
    pub default_disk: Option<DefaultLimit<u64>>,
    /// Memory limit of sandboxes created without --memory (it also caps their
    /// /tmp); `none`: no default memory limit. Default: 2g (at most MemTotal).
    #[arg(long, env = "STRATA_DEFAULT_MEMORY", value_name = "SIZE|none", value_parser = parse_default_size)]
    pub default_memory: Option<DefaultLimit<u64>>,
    /// CPU limit of sandboxes created without --cpus; `none`: no default CPU
    /// limit. Default: 2, or the host's CPUs when it has fewer.
    #[arg(long, env = "STRATA_DEFAULT_CPUS", value_name = "CPUS|none", value_parser = parse_default_cpus)]
    pub default_cpus: Option<DefaultLimit<f64>>,
    /// Process limit of sandboxes created without --pids (a fork bomb stops
    /// there); `none`: no default pids limit. Default: 1024.
    #[arg(long, env = "STRATA_DEFAULT_PIDS", value_name = "N|none", value_parser = parse_default_count)]
    pub default_pids: Option<DefaultLimit<u64>>,
    /// How far the memory limits of sandboxes holding memory (creating, running,
    /// paused) may add up beyond the host's MemTotal, as a ratio; beyond it a
    /// create, start or resume is refused (503). `none`: no bound. Default: 20.
    #[arg(long, env = "STRATA_MEMORY_OVERCOMMIT", value_name = "RATIO|none", value_parser = parse_ratio)]
    pub memory_overcommit: Option<Ratio>,
    /// No sandbox is created, started or resumed while the host's MemAvailable
    /// is below this (503). Default: 256m.
    #[arg(long, env = "STRATA_MEMORY_RESERVE", value_name = "SIZE", value_parser = parse_size)]
    pub memory_reserve: Option<u64>,
    /// How far the nominal disk sizes of all sandboxes may add up beyond the
    /// state filesystem's size, as a ratio (disks are sparse); beyond it a create
    /// is refused (507). `none`: no bound. Default: 64.
    #[arg(long, env = "STRATA_DISK_OVERCOMMIT", value_name = "RATIO|none", value_parser = parse_ratio)]
    pub disk_overcommit: Option<Ratio>,
    /// Free space of the state filesystem no new disk may take: a disk larger
    /// than the free space minus this is refused (507). Default: 2g.
    #[arg(long, env = "STRATA_DISK_RESERVE", value_name = "SIZE", value_parser = parse_size)]
    pub disk_reserve: Option<u64>,
    /// The default quota of every tenant (overridden per tenant with `strata
    /// tenant quota set`): comma-separated KEY=VALUE, keys sandboxes, memory
    /// (sum of running sandboxes' limits), disk (sum of nominal disk sizes),
    /// forks-per-minute; VALUE a count or size, N% (memory: of MemTotal, disk:
    /// of the state filesystem) or `unlimited`. Keys not given keep the default:
    /// sandboxes=100,memory=100%,disk=100%,forks-per-minute=120. The operator
    /// acting in no tenant has no quota.
    #[arg(long, env = "STRATA_TENANT_QUOTA", value_name = "KEY=VALUE,...", value_parser = parse_tenant_quota)]
    pub tenant_quota: Option<strata_engine::admission::TenantQuotaConfig>,
    /// How many disks of the default size the daemon keeps formatted and
    /// mounted ahead of need, so a create or fork child does not wait for one
    /// (each costs a loop device and about 0.2 MiB of disk); 0 makes every
    /// disk on demand.
    #[arg(long, env = "STRATA_DISK_POOL", default_value_t = 8)]
    pub disk_pool: usize,
    /// How long a Rule-of-Two approval waits for an operator before it is
    /// denied, and an approved one for the request to be repeated (e.g. 15m, 1h).
    #[arg(long, env = "STRATA_APPROVAL_TIMEOUT", value_parser = parse_timeout)]
    pub approval_timeout: Option<std::time::Duration>,
    /// Domain of host-based preview URLs: `http://<port>-<sandbox>.<domain>` reaches
    /// the port on the TCP listener (point a wildcard DNS record at the daemon).
    /// Default: preview.localhost.
    #[arg(long, env = "STRATA_PREVIEW_DOMAIN")]
    pub preview_domain: Option<String>,
    /// Isolation tier of sandboxes whose create names none: namespace, gvisor
    /// or microvm. The daemon refuses to start when this host cannot run it.
    #[arg(long, env = "STRATA_DEFAULT_ISOLATION", value_name = "TIER", default_value = "namespace",
        value_parser = super::sandbox::parse_isolation)]
    pub default_isolation: strata_api::Isolation,
    /// Whether namespace-tier sandboxes run in user namespaces of their own
    /// (their root mapped to an unprivileged host range) unless a create
    /// says `userns: false`: `auto` (where the host supports it, see `strata
    /// doctor`), `on` (the daemon refuses to start where it cannot) or `off`
    /// (then only sandboxes that declare untrusted input get one).
    #[arg(long, env = "STRATA_DEFAULT_USERNS", value_name = "auto|on|off", default_value = "auto",
        value_parser = parse_userns_default)]
    pub default_userns: UsernsDefault,
    /// Check persistent sandboxes whose policy names no --check-every this
    /// often (the hygiene scan; at least 1m), e.g. 6h. Default: only those
    /// whose policy asks.
    #[arg(long, env = "STRATA_CHECK_EVERY", value_name = "DUR", value_parser = parse_check_every)]
    pub check_every: Option<std::time::Duration>,
    /// Keep N sandboxes of an image or template booted and unassigned
    /// (repeatable; the environment variable takes a comma-separated list): a
    /// create of that source with the pool's memory and disk, no network and
    /// no secrets adopts one (its name, hostname, CPUs, processes, environment,
    /// labels, policy and TTL applied then) instead of booting, and the pool
    /// refills in the background at a lower priority. `strata pool` shows them.
    #[arg(long, env = "STRATA_WARM_POOL", value_name = "IMAGE_OR_TEMPLATE=N", value_delimiter = ',')]
    pub warm_pool: Vec<strata_engine::state::pool::PoolConfig>,
    /// How a resume from standby brings memory back: `on` (lazily where the
    /// host can: the processes run again at once, pages come in on first
    /// touch and in the background; `strata doctor` says where it cannot)
    /// or `off` (every page before the processes run).
    #[arg(long, env = "STRATA_LAZY_RESTORE", value_name = "on|off", default_value = "on",
        value_parser = parse_on_off)]
    pub lazy_restore: OnOff,
}

/// An `on`/`off` switch.
#[derive(Debug, Clone, Copy)]
pub struct OnOff(pub bool);

fn parse_on_off(s: &str) -> Result<OnOff, String> {
    match s {
        "on" | "true" => Ok(OnOff(true)),
        "off" | "false" => Ok(OnOff(false)),
        _ => Err(format!("{s:?}: on or off")),
    }
}

/// `--check-every`: the policy's own rule (at least [`strata_api::MIN_CHECK_EVERY`]).
fn parse_check_every(s: &str) -> Result<std::time::Duration, String> {
    strata_engine::policy_spec::validate_check_every(s).map_err(|e| e.body.message)
}

/// `--default-userns`: `None` is `auto`.
#[derive(Debug, Clone, Copy)]
pub struct UsernsDefault(pub Option<bool>);

fn parse_userns_default(s: &str) -> Result<UsernsDefault, String> {
    match s {
        "auto" => Ok(UsernsDefault(None)),
        "on" | "true" => Ok(UsernsDefault(Some(true))),
        "off" | "false" => Ok(UsernsDefault(Some(false))),
        _ => Err(format!("{s:?}: auto, on or off")),
    }
}

fn parse_default_size(s: &str) -> Result<DefaultLimit<u64>, String> {
    match s.trim() {
        "none" => Ok(DefaultLimit::NoLimit),
        v => strata_core::units::parse_size(v).map(DefaultLimit::Value).map_err(|e| format!("{e}, or `none`")),
    }
}

fn parse_default_cpus(s: &str) -> Result<DefaultLimit<f64>, String> {
    match s.trim() {
        "none" => Ok(DefaultLimit::NoLimit),
        v => strata_core::units::parse_cpus(v).map(DefaultLimit::Value).map_err(|e| format!("{e}, or `none`")),
    }
}

fn parse_default_count(s: &str) -> Result<DefaultLimit<u64>, String> {
    match s.trim() {
        "none" => Ok(DefaultLimit::NoLimit),
        v => v
            .parse::<u64>()
            .map(DefaultLimit::Value)
            .map_err(|_| format!("invalid count {v:?} (expected a number, or `none`)")),
    }
}

/// An over-commit ratio, `None` for `none` (no bound).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ratio(pub Option<f64>);

fn parse_ratio(s: &str) -> Result<Ratio, String> {
    match s.trim() {
        "none" => Ok(Ratio(None)),
        v => match v.parse::<f64>() {
            Ok(r) if r.is_finite() && r > 0.0 => Ok(Ratio(Some(r))),
            _ => Err(format!("invalid ratio {v:?} (expected a positive number, e.g. 1.5, or `none`)")),
        },
    }
}

fn parse_size(s: &str) -> Result<u64, String> {
    strata_core::units::parse_size(s).map_err(|e| e.to_string())
}

fn parse_tenant_quota(s: &str) -> Result<strata_engine::admission::TenantQuotaConfig, String> {
    strata_engine::admission::parse_tenant_quota(s)
}

fn parse_timeout(s: &str) -> Result<std::time::Duration, String> {
    strata_core::units::parse_duration(s).map_err(|e| e.to_string())
}
