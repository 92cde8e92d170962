//! Defaults, validation, admission control and tenant quotas: what a new (or
//! restarting) sandbox may ask of the host. See docs/security.md, "Defaults,
//! admission and quotas".
//!
//! - **Defaults** ([`Admission::apply_defaults`]): every limit a create request
//!   leaves out gets the daemon's default (`--default-memory 2g`,
//!   `--default-cpus 2` capped at the host's CPUs, `--default-pids 1024`,
//!   `--default-disk 10g`), recorded on the sandbox. `none` as a daemon
//!   default is the operator's explicit "no limit".
//! - **Validation** ([`Admission::validate`]): limits outside what a sandbox can
//!   run with or the host could ever give are a 400 naming the field and the
//!   bound, before anything exists.
//! - **Admission** and **quotas** ([`Admission::admit`], [`Admission::admit_fork`]):
//!   a new sandbox, a start or a resume must fit the host (disk: its nominal
//!   size within the free space minus a reserve, the sum of nominal sizes
//!   within an over-commit ratio of the filesystem; memory: MemAvailable above
//!   a reserve, the sum of memory limits of sandboxes holding memory within an
//!   over-commit ratio of MemTotal), and, for a caller acting in a tenant, the
//!   tenant's quota (sandboxes, memory, disk, forks per minute). Checking and
//!   reserving happen under one lock: the [`Reservation`] counts until the
//!   sandbox's record shows what it holds, so concurrent requests at the edge
//!   cannot both pass.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use strata_api::{ErrorCode, QuotaLimits, QuotaUsage, ResourceLimits, SandboxState, TenantUsage};
use strata_core::units::format_size;
use strata_store::db::ResourceClaim;

use crate::error::{EngineError, EngineResult};

/// The smallest memory limit: strata-init needs about 0.7 MiB, an exec of a
/// shell 1.8 MiB, a CRIU restore 4.3 MiB at its peak, python3's start 4 MiB
/// (measured on busybox and Debian images); 16 MiB leaves room for the page
/// cache of the binaries and /tmp, which is charged to the same cgroup.
pub const MIN_MEMORY_BYTES: u64 = 16 << 20;
/// The smallest pids limit: init, a shim and a shell take 3; restoring a
/// sandbox with one background process from standby needs 10 (CRIU's helpers
/// run in the sandbox's cgroup; 8 failed with EAGAIN).
pub const MIN_PIDS: u64 = 16;
/// The smallest CPU limit: the CFS quota must be at least 1 ms per 100 ms period.
pub const MIN_CPUS: f64 = 0.01;
/// Built-in `--default-memory`.
pub const DEFAULT_MEMORY_BYTES: u64 = 2 << 30;
/// Built-in `--default-pids`.
pub const DEFAULT_PIDS: u64 = 1024;
/// Built-in `--default-cpus` (capped at the host's CPUs).
pub const DEFAULT_CPUS: f64 = 2.0;
/// Built-in `--memory-overcommit`: the memory limits of sandboxes holding
/// memory may add up to 20 x MemTotal (limits are ceilings: 200 idle default
/// sandboxes, 400 GiB of limits, use under 100 MiB on a 24 GiB host).
pub const DEFAULT_MEMORY_OVERCOMMIT: f64 = 20.0;
/// Built-in `--memory-reserve`: below this much MemAvailable no sandbox starts.
pub const DEFAULT_MEMORY_RESERVE: u64 = 256 << 20;
/// Built-in `--disk-overcommit`: nominal disk sizes may add up to 64 x the
/// state filesystem's size (disks are sparse: 1000 default disks in standby,
/// 10 TiB nominal, take 460 MiB).
pub const DEFAULT_DISK_OVERCOMMIT: f64 = 64.0;
/// Built-in `--disk-reserve`: free space on the state filesystem no new disk may take.
pub const DEFAULT_DISK_RESERVE: u64 = 2 << 30;
/// Built-in `--tenant-quota`.
pub const DEFAULT_TENANT_QUOTA: &str = "sandboxes=100,memory=100%,disk=100%,forks-per-minute=120";
/// The window of the forks-per-minute quota.
pub const FORK_WINDOW: Duration = Duration::from_secs(60);

/// A daemon flag of this module that cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// The value is malformed or out of bounds.
    #[error("{flag}: {message}")]
    Invalid {
        /// The flag, e.g. `--default-memory`.
        flag: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The host facts the bounds come from could not be read.
    #[error("reading {what}: {message}")]
    Host {
        /// What was read.
        what: String,
        /// The cause.
        message: String,
    },
}

/// One entry of the default tenant quota as configured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum QuotaSetting {
    /// At most this many (sandboxes, bytes, forks).
    Limit(u64),
    /// A share of the host: of MemTotal for memory, of the state filesystem for disk.
    HostPercent(f64),
    /// No limit.
    Unlimited,
}

/// The default quota of every tenant (`--tenant-quota`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TenantQuotaConfig {
    /// Live sandboxes.
    pub sandboxes: QuotaSetting,
    /// Sum of memory limits of sandboxes holding memory.
    pub memory_bytes: QuotaSetting,
    /// Sum of nominal disk sizes.
    pub disk_bytes: QuotaSetting,
    /// Fork and fan-out children per minute.
    pub forks_per_minute: QuotaSetting,
}

impl Default for TenantQuotaConfig {
    fn default() -> Self {
        parse_tenant_quota(DEFAULT_TENANT_QUOTA).expect("the built-in tenant quota parses")
    }
}

/// Parses `--tenant-quota`: comma-separated `key=value` over the built-in
/// defaults; keys `sandboxes`, `memory`, `disk`, `forks-per-minute`; values a
/// count or size, `N%` (memory: of MemTotal, disk: of the state filesystem),
/// or `unlimited`.
pub fn parse_tenant_quota(s: &str) -> Result<TenantQuotaConfig, String> {
    let mut q = TenantQuotaConfig {
        sandboxes: QuotaSetting::Limit(100),
        memory_bytes: QuotaSetting::HostPercent(100.0),
        disk_bytes: QuotaSetting::HostPercent(100.0),
        forks_per_minute: QuotaSetting::Limit(120),
    };
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("{part:?} is not key=value (keys: sandboxes, memory, disk, forks-per-minute)"))?;
        let (k, v) = (k.trim(), v.trim());
        let bytes = matches!(k, "memory" | "memory_bytes" | "disk" | "disk_bytes");
        let setting = if v == "unlimited" || v == "none" {
            QuotaSetting::Unlimited
        } else if let Some(p) = v.strip_suffix('%') {
            if !bytes {
                return Err(format!("{k}={v}: a percentage is for memory and disk only"));
            }
            match p.trim().parse::<f64>() {
                Ok(p) if p.is_finite() && p > 0.0 => QuotaSetting::HostPercent(p),
                _ => return Err(format!("{k}={v}: not a positive percentage")),
            }
        } else if bytes {
            QuotaSetting::Limit(strata_core::units::parse_size(v).map_err(|e| format!("{k}={v}: {e}"))?)
        } else {
            QuotaSetting::Limit(v.parse::<u64>().map_err(|_| format!("{k}={v}: not a count (or `unlimited`)"))?)
        };
        match k {
            "sandboxes" => q.sandboxes = setting,
            "memory" | "memory_bytes" => q.memory_bytes = setting,
            "disk" | "disk_bytes" => q.disk_bytes = setting,
            "forks-per-minute" | "forks_per_minute" => q.forks_per_minute = setting,
            _ => return Err(format!("unknown quota {k:?} (keys: sandboxes, memory, disk, forks-per-minute)")),
        }
    }
    Ok(q)
}

/// A default limit as configured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DefaultLimit<T> {
    /// The built-in default (capped at what the host has).
    Builtin,
    /// This value (refused at start when out of bounds).
    Value(T),
    /// No default limit (`none`): the operator's explicit "unlimited".
    NoLimit,
}

impl<T: Copy + PartialOrd> DefaultLimit<T> {
    fn resolve(self, builtin: T, host_max: T) -> Option<T> {
        match self {
            DefaultLimit::Builtin => Some(if builtin > host_max { host_max } else { builtin }),
            DefaultLimit::Value(v) => Some(v),
            DefaultLimit::NoLimit => None,
        }
    }
}

/// The admission settings of the daemon (its flags).
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionConfig {
    /// `--default-memory` (built-in 2 GiB).
    pub default_memory: DefaultLimit<u64>,
    /// `--default-cpus` (built-in 2).
    pub default_cpus: DefaultLimit<f64>,
    /// `--default-pids` (built-in 1024).
    pub default_pids: DefaultLimit<u64>,
    /// `--default-disk` (built-in 10 GiB).
    pub default_disk: DefaultLimit<u64>,
    /// `--memory-overcommit` (`None`: the sum of memory limits is not bounded).
    pub memory_overcommit: Option<f64>,
    /// `--memory-reserve`.
    pub memory_reserve: u64,
    /// `--disk-overcommit` (`None`: the sum of nominal disk sizes is not bounded).
    pub disk_overcommit: Option<f64>,
    /// `--disk-reserve`.
    pub disk_reserve: u64,
    /// `--tenant-quota`.
    pub tenant_quota: TenantQuotaConfig,
}

/// Built-in `--default-disk`.
pub const DEFAULT_DISK_BYTES: u64 = 10 << 30;

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            default_memory: DefaultLimit::Builtin,
            default_cpus: DefaultLimit::Builtin,
            default_pids: DefaultLimit::Builtin,
            default_disk: DefaultLimit::Builtin,
            memory_overcommit: Some(DEFAULT_MEMORY_OVERCOMMIT),
            memory_reserve: DEFAULT_MEMORY_RESERVE,
            disk_overcommit: Some(DEFAULT_DISK_OVERCOMMIT),
            disk_reserve: DEFAULT_DISK_RESERVE,
            tenant_quota: TenantQuotaConfig::default(),
        }
    }
}

/// What bounds limits on this host.
#[derive(Debug, Clone, PartialEq)]
pub struct HostBounds {
    /// MemTotal, bytes.
    pub mem_total: u64,
    /// CPUs the daemon may use.
    pub cpus: f64,
    /// `kernel.pid_max`.
    pub pid_max: u64,
    /// Size of the filesystem holding the state directory, bytes.
    pub fs_bytes: u64,
    /// The state directory (for messages and free-space reads).
    pub state_dir: PathBuf,
}

fn meminfo(key: &str) -> Result<u64, ConfigError> {
    let err = |message: String| ConfigError::Host { what: format!("/proc/meminfo {key}"), message };
    let text = std::fs::read_to_string("/proc/meminfo").map_err(|e| err(e.to_string()))?;
    let line = text.lines().find(|l| l.split(':').next() == Some(key)).ok_or_else(|| err("missing".into()))?;
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| err(format!("unreadable line {line:?}")))?;
    Ok(kib * 1024)
}

/// (bytes free for unprivileged writers, total bytes) of the filesystem holding `path`.
fn fs_space(path: &Path) -> Result<(u64, u64), ConfigError> {
    let s = nix::sys::statvfs::statvfs(path).map_err(|e| ConfigError::Host {
        what: format!("the filesystem of {}", path.display()),
        message: e.to_string(),
    })?;
    let frag = s.fragment_size() as u64;
    Ok((s.blocks_available() as u64 * frag, s.blocks() as u64 * frag))
}

impl HostBounds {
    /// Reads MemTotal, the CPU count, pid_max and the state filesystem's size.
    pub fn probe(state_dir: &Path) -> Result<HostBounds, ConfigError> {
        let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(4_194_304);
        let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) as f64;
        Ok(HostBounds {
            mem_total: meminfo("MemTotal")?,
            cpus,
            pid_max,
            fs_bytes: fs_space(state_dir)?.1,
            state_dir: state_dir.to_path_buf(),
        })
    }

    /// The limits a sandbox may have here: 400 naming the field and the bound otherwise.
    pub fn validate(&self, l: &ResourceLimits) -> Result<(), String> {
        if let Some(m) = l.memory_bytes {
            if m < MIN_MEMORY_BYTES {
                return Err(format!("limits.memory_bytes must be at least {} (what strata-init, an exec and the /tmp tmpfs need), got {m} bytes", format_size(MIN_MEMORY_BYTES)));
            }
            if m > self.mem_total {
                return Err(format!(
                    "limits.memory_bytes must be at most the host's memory (MemTotal {}), got {}",
                    format_size(self.mem_total),
                    format_size(m)
                ));
            }
        }
        if let Some(p) = l.pids {
            if p < MIN_PIDS {
                return Err(format!("limits.pids must be at least {MIN_PIDS} (init, a shim, a shell, and CRIU's helpers on resume), got {p}"));
            }
            if p > self.pid_max {
                return Err(format!("limits.pids must be at most the host's pid_max ({}), got {p}", self.pid_max));
            }
        }
        if let Some(c) = l.cpus {
            if !c.is_finite() || c < MIN_CPUS {
                return Err(format!("limits.cpus must be at least {MIN_CPUS} (1 ms of CPU per 100 ms), got {c}"));
            }
            if c > self.cpus {
                return Err(format!("limits.cpus must be at most the host's {} CPUs, got {c}", self.cpus));
            }
        }
        if let Some(b) = l.disk_bytes {
            if b < strata_runtime::disk::MIN_BYTES {
                return Err(format!(
                    "limits.disk_bytes must be at least {} (ext4 with its journal), got {b} bytes",
                    format_size(strata_runtime::disk::MIN_BYTES)
                ));
            }
            if b > self.fs_bytes {
                return Err(format!(
                    "limits.disk_bytes must be at most {} (the size of the filesystem holding {}: a larger disk could never be filled), got {}",
                    format_size(self.fs_bytes),
                    self.state_dir.display(),
                    format_size(b)
                ));
            }
        }
        Ok(())
    }
}

/// Whether a sandbox in `state` holds host memory (its processes exist).
pub fn holds_memory(state: SandboxState) -> bool {
    matches!(state, SandboxState::Creating | SandboxState::Running | SandboxState::Paused)
}

/// What a sandbox counts for, once admitted (the whole sandbox: its record is
/// left out of the sums while its reservation stands).
#[derive(Debug, Clone)]
struct Claim {
    tenant: String,
    memory_bytes: Option<u64>,
    disk_bytes: Option<u64>,
}

/// The forks-per-minute window of one tenant: when each recent child was admitted.
#[derive(Debug, Default)]
pub struct ForkWindow {
    times: VecDeque<Instant>,
}

impl ForkWindow {
    /// Children admitted in the window ending at `now`.
    pub fn used(&mut self, now: Instant) -> u64 {
        while self.times.front().is_some_and(|t| now.duration_since(*t) >= FORK_WINDOW) {
            self.times.pop_front();
        }
        self.times.len() as u64
    }

    /// Admits `count` children at `now` within `limit`, or says how many are in
    /// the window and when enough of them will have left it (`None`: never).
    pub fn admit(&mut self, now: Instant, count: u64, limit: u64) -> Result<(), (u64, Option<Duration>)> {
        self.check(now, count, limit)?;
        self.times.extend(std::iter::repeat_n(now, count as usize));
        Ok(())
    }

    /// [`ForkWindow::admit`] without counting the children.
    pub fn check(&mut self, now: Instant, count: u64, limit: u64) -> Result<(), (u64, Option<Duration>)> {
        let used = self.used(now);
        if used + count > limit {
            let retry = if count > limit {
                None
            } else {
                let leave = (used + count - limit) as usize;
                self.times.get(leave - 1).map(|t| FORK_WINDOW.saturating_sub(now.duration_since(*t)))
            };
            return Err((used, retry));
        }
        Ok(())
    }
}

#[derive(Debug, Default)]
struct Book {
    /// Admitted sandboxes whose record does not show it yet, by sandbox id.
    claims: HashMap<String, Claim>,
    /// Fork windows by tenant.
    forks: HashMap<String, ForkWindow>,
}

/// What one admission asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// A new sandbox (counts for sandboxes, memory and disk).
    Create,
    /// An existing sandbox getting processes again (start, resume): memory only.
    Start,
}

tokio::task_local! {
    static EXEMPT: bool;
}

/// Runs `fut` without tenant quotas: background work the operator started in
/// no tenant (its pipeline runs execute in the run's tenant, `default`, but are
/// the operator's like its own requests). Host admission still applies.
pub async fn exempt_from_quotas<F: std::future::Future>(fut: F) -> F::Output {
    EXEMPT.scope(true, fut).await
}

/// Defaults, bounds, admission control and tenant quotas of one daemon.
pub struct Admission {
    host: HostBounds,
    defaults: ResourceLimits,
    memory_overcommit: Option<f64>,
    memory_reserve: u64,
    disk_overcommit: Option<f64>,
    disk_reserve: u64,
    tenant_defaults: QuotaLimits,
    book: Mutex<Book>,
}

/// An admitted sandbox: it counts in every later check until dropped (after
/// its record shows the state it was admitted for, or after it failed).
pub struct Reservation {
    admission: Arc<Admission>,
    id: String,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.admission.book().claims.remove(&self.id);
    }
}

/// Sums the claims relevant to one check.
#[derive(Debug, Default, Clone, Copy)]
struct Totals {
    tenant_sandboxes: u64,
    tenant_memory: u64,
    tenant_disk: u64,
    host_memory: u64,
    host_disk: u64,
}

fn quota_exceeded(message: String) -> EngineError {
    EngineError::new(ErrorCode::QuotaExceeded, message)
}

/// `n x b` as a size, for messages about several children.
fn times(n: u64, b: u64) -> String {
    if n == 1 {
        format_size(b)
    } else {
        format!("{n} x {}", format_size(b))
    }
}

impl Admission {
    /// Resolves `cfg` against this host (CPU cap, percentages) and checks the
    /// defaults against the same bounds as requests.
    pub fn new(cfg: &AdmissionConfig, host: HostBounds) -> Result<Admission, ConfigError> {
        let invalid = |flag: &'static str, message: String| ConfigError::Invalid { flag, message };
        let defaults = ResourceLimits {
            memory_bytes: cfg.default_memory.resolve(DEFAULT_MEMORY_BYTES, host.mem_total),
            cpus: cfg.default_cpus.resolve(DEFAULT_CPUS, host.cpus),
            pids: cfg.default_pids.resolve(DEFAULT_PIDS, host.pid_max),
            disk_bytes: cfg.default_disk.resolve(DEFAULT_DISK_BYTES, host.fs_bytes),
            disk_quota: None,
        };
        for (flag, l) in [
            ("--default-memory", ResourceLimits { memory_bytes: defaults.memory_bytes, ..Default::default() }),
            ("--default-cpus", ResourceLimits { cpus: defaults.cpus, ..Default::default() }),
            ("--default-pids", ResourceLimits { pids: defaults.pids, ..Default::default() }),
            ("--default-disk", ResourceLimits { disk_bytes: defaults.disk_bytes, ..Default::default() }),
        ] {
            host.validate(&l).map_err(|m| invalid(flag, m))?;
        }
        for (flag, r) in [("--memory-overcommit", cfg.memory_overcommit), ("--disk-overcommit", cfg.disk_overcommit)] {
            if r.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
                return Err(invalid(
                    flag,
                    format!("must be a positive ratio or `none`, got {}", r.unwrap_or_default()),
                ));
            }
        }
        let resolve = |s: QuotaSetting, of: u64| match s {
            QuotaSetting::Limit(n) => Some(n),
            QuotaSetting::HostPercent(p) => Some((of as f64 * p / 100.0) as u64),
            QuotaSetting::Unlimited => None,
        };
        let q = &cfg.tenant_quota;
        let tenant_defaults = QuotaLimits {
            sandboxes: resolve(q.sandboxes, 0),
            memory_bytes: resolve(q.memory_bytes, host.mem_total),
            disk_bytes: resolve(q.disk_bytes, host.fs_bytes),
            forks_per_minute: resolve(q.forks_per_minute, 0),
        };
        Ok(Admission {
            host,
            defaults,
            memory_overcommit: cfg.memory_overcommit,
            memory_reserve: cfg.memory_reserve,
            disk_overcommit: cfg.disk_overcommit,
            disk_reserve: cfg.disk_reserve,
            tenant_defaults,
            book: Mutex::new(Book::default()),
        })
    }

    /// The host's bounds.
    pub fn host(&self) -> &HostBounds {
        &self.host
    }

    /// The limits every sandbox gets for the fields its request leaves out.
    pub fn defaults(&self) -> &ResourceLimits {
        &self.defaults
    }

    /// The default quota of every tenant.
    pub fn tenant_defaults(&self) -> QuotaLimits {
        self.tenant_defaults
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Fills the limits `l` leaves out with the daemon's defaults.
    pub fn apply_defaults(&self, l: &mut ResourceLimits) {
        let d = &self.defaults;
        l.memory_bytes = l.memory_bytes.or(d.memory_bytes);
        l.cpus = l.cpus.or(d.cpus);
        l.pids = l.pids.or(d.pids);
        l.disk_bytes = l.disk_bytes.or(d.disk_bytes);
    }

    /// 400 unless `l` is within what a sandbox can run with and this host could give.
    pub fn validate(&self, l: &ResourceLimits) -> EngineResult<()> {
        self.host.validate(l).map_err(EngineError::bad_request)
    }

    /// The quota of `tenant`: the defaults with its override applied.
    pub fn quota_of(&self, db: &strata_store::Db, tenant: &str) -> EngineResult<QuotaLimits> {
        let o = db.tenant_quota(tenant)?;
        Ok(o.map_or(self.tenant_defaults, |(o, _)| self.tenant_defaults.with_override(&o)))
    }

    /// Memory a sandbox with this limit counts for: its limit, or all of the
    /// host's memory without one.
    fn memory_of(&self, limit: Option<u64>) -> u64 {
        limit.unwrap_or(self.host.mem_total)
    }

    /// Disk a sandbox counts for: its nominal size, or the whole filesystem without a limit.
    fn disk_of(&self, limit: Option<u64>) -> u64 {
        limit.unwrap_or(self.host.fs_bytes)
    }

    /// Sums recorded sandboxes (less those with a claim) and claims.
    fn totals(&self, records: &[ResourceClaim], book: &Book, tenant: &str) -> Totals {
        let mut t = Totals::default();
        let mut add = |this_tenant: bool, memory: Option<Option<u64>>, disk: Option<u64>| {
            if let Some(m) = memory {
                let m = self.memory_of(m);
                t.host_memory = t.host_memory.saturating_add(m);
                if this_tenant {
                    t.tenant_memory = t.tenant_memory.saturating_add(m);
                }
            }
            let d = self.disk_of(disk);
            t.host_disk = t.host_disk.saturating_add(d);
            if this_tenant {
                t.tenant_sandboxes += 1;
                t.tenant_disk = t.tenant_disk.saturating_add(d);
            }
        };
        for r in records.iter().filter(|r| !book.claims.contains_key(&r.id)) {
            add(r.tenant == tenant, holds_memory(r.state).then_some(r.memory_bytes), r.disk_bytes);
        }
        for c in book.claims.values() {
            add(c.tenant == tenant, Some(c.memory_bytes), c.disk_bytes);
        }
        t
    }

    /// Whether the current caller is held to tenant quotas: a tenant token, or
    /// the operator acting as a tenant (also the daemon working for one of them,
    /// e.g. a pipeline run's stages); not the operator itself, nor work it
    /// started in no tenant ([`exempt_from_quotas`]).
    pub fn quota_applies() -> bool {
        !EXEMPT.try_with(|e| *e).unwrap_or(false) && crate::caller::scope().is_some()
    }

    /// Checks `count` sandboxes of `limits` for `tenant` (quota when `quota`, then the host).
    fn check(
        &self,
        tenant: &str,
        quota: Option<&QuotaLimits>,
        limits: &ResourceLimits,
        count: u64,
        purpose: Purpose,
        totals: &Totals,
    ) -> EngineResult<()> {
        let memory = self.memory_of(limits.memory_bytes);
        let disk = self.disk_of(limits.disk_bytes);
        let hint = |flag: &str| {
            format!("(see `strata tenant usage {tenant}`; the operator changes it with `strata tenant quota set {tenant} --{flag} ...`)")
        };
        if let Some(q) = quota {
            if purpose == Purpose::Create {
                if let Some(max) = q.sandboxes.filter(|max| totals.tenant_sandboxes + count > *max) {
                    return Err(quota_exceeded(format!(
                        "tenant {tenant:?} is over its sandboxes quota: {} of {max} in use, this request needs {count} more {}",
                        totals.tenant_sandboxes,
                        hint("sandboxes")
                    )));
                }
                if let Some(max) =
                    q.disk_bytes.filter(|max| totals.tenant_disk.saturating_add(disk.saturating_mul(count)) > *max)
                {
                    return Err(quota_exceeded(format!(
                        "tenant {tenant:?} would exceed its disk_bytes quota: {} of {} in nominal disk sizes, this request needs {} more{} {}",
                        format_size(totals.tenant_disk),
                        format_size(max),
                        times(count, disk),
                        if limits.disk_bytes.is_none() { " (a sandbox without a disk limit counts as the whole filesystem)" } else { "" },
                        hint("disk")
                    )));
                }
            }
            if let Some(max) =
                q.memory_bytes.filter(|max| totals.tenant_memory.saturating_add(memory.saturating_mul(count)) > *max)
            {
                return Err(quota_exceeded(format!(
                    "tenant {tenant:?} would exceed its memory_bytes quota: {} of {} committed by its sandboxes holding memory, this request needs {} more{} {}",
                    format_size(totals.tenant_memory),
                    format_size(max),
                    times(count, memory),
                    if limits.memory_bytes.is_none() { " (a sandbox without a memory limit counts as all of MemTotal)" } else { "" },
                    hint("memory")
                )));
            }
        }
        if purpose == Purpose::Create {
            let (free, _) =
                fs_space(&self.host.state_dir).map_err(|e| EngineError::new(ErrorCode::Internal, e.to_string()))?;
            let available = free.saturating_sub(self.disk_reserve);
            let need = limits.disk_bytes.unwrap_or(0);
            if free < self.disk_reserve || need > available {
                return Err(EngineError::new(
                    ErrorCode::InsufficientStorage,
                    format!(
                        "{} on the host: the filesystem of {} has {} free, {} of it kept in reserve (--disk-reserve), so at most {} is available for a new disk",
                        if need > 0 { format!("limits.disk_bytes {} does not fit", format_size(need)) } else { "no new sandbox fits".to_string() },
                        self.host.state_dir.display(),
                        format_size(free),
                        format_size(self.disk_reserve),
                        format_size(available)
                    ),
                ));
            }
            if let Some(ratio) = self.disk_overcommit {
                let cap = (self.host.fs_bytes as f64 * ratio) as u64;
                if totals.host_disk.saturating_add(disk.saturating_mul(count)) > cap {
                    return Err(EngineError::new(
                        ErrorCode::InsufficientStorage,
                        format!(
                            "limits.disk_bytes {}: the sandboxes' nominal disk sizes total {}, and with this request they would exceed the over-commit limit of {} ({ratio} x the {} filesystem; --disk-overcommit)",
                            times(count, disk),
                            format_size(totals.host_disk),
                            format_size(cap),
                            format_size(self.host.fs_bytes)
                        ),
                    ));
                }
            }
        }
        let available = meminfo("MemAvailable").map_err(|e| EngineError::new(ErrorCode::Internal, e.to_string()))?;
        if available < self.memory_reserve {
            return Err(EngineError::new(
                ErrorCode::InsufficientMemory,
                format!(
                    "the host has {} of memory available (MemAvailable), below the {} reserve (--memory-reserve): no sandbox starts until memory is freed",
                    format_size(available),
                    format_size(self.memory_reserve)
                ),
            ));
        }
        if let Some(ratio) = self.memory_overcommit {
            let cap = (self.host.mem_total as f64 * ratio) as u64;
            if totals.host_memory.saturating_add(memory.saturating_mul(count)) > cap {
                return Err(EngineError::new(
                    ErrorCode::InsufficientMemory,
                    format!(
                        "limits.memory_bytes {}: the sandboxes holding memory have limits totalling {}, and with this request they would exceed the over-commit limit of {} ({ratio} x MemTotal {}; --memory-overcommit){}",
                        times(count, memory),
                        format_size(totals.host_memory),
                        format_size(cap),
                        format_size(self.host.mem_total),
                        if limits.memory_bytes.is_none() { "; a sandbox without a memory limit counts as all of MemTotal" } else { "" }
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Admits sandbox `id` of `tenant` with `limits` for `purpose`, or refuses
    /// with 429 (quota), 507 (disk) or 503 (memory). The returned reservation
    /// counts it until dropped; drop it once the record shows the new state.
    pub fn admit(
        self: &Arc<Self>,
        db: &strata_store::Db,
        id: &str,
        tenant: &str,
        limits: &ResourceLimits,
        purpose: Purpose,
    ) -> EngineResult<Reservation> {
        let quota = if Self::quota_applies() { Some(self.quota_of(db, tenant)?) } else { None };
        // The records are read under the lock: a sandbox whose reservation ends
        // meanwhile is then either still reserved or already recorded.
        let mut book = self.book();
        let records = db.resource_claims()?;
        let totals = self.totals(&records, &book, tenant);
        self.check(tenant, quota.as_ref(), limits, 1, purpose, &totals)?;
        book.claims.insert(
            id.to_string(),
            Claim { tenant: tenant.to_string(), memory_bytes: limits.memory_bytes, disk_bytes: limits.disk_bytes },
        );
        Ok(Reservation { admission: self.clone(), id: id.to_string() })
    }

    /// Checks a fork of `count` children of `limits` for `tenant` as a whole
    /// before anything is made and, with `record`, counts them in the tenant's
    /// forks-per-minute window (each child is then admitted as a create).
    pub fn admit_fork(
        &self,
        db: &strata_store::Db,
        tenant: &str,
        limits: &ResourceLimits,
        count: u64,
        record: bool,
    ) -> EngineResult<()> {
        let quota = if Self::quota_applies() { Some(self.quota_of(db, tenant)?) } else { None };
        let mut book = self.book();
        let records = db.resource_claims()?;
        let totals = self.totals(&records, &book, tenant);
        self.check(tenant, quota.as_ref(), limits, count, Purpose::Create, &totals)?;
        if let Some(max) = quota.and_then(|q| q.forks_per_minute) {
            let window = book.forks.entry(tenant.to_string()).or_default();
            let admitted = if record {
                window.admit(Instant::now(), count, max)
            } else {
                window.check(Instant::now(), count, max)
            };
            if let Err((used, retry)) = admitted {
                let when = match retry {
                    Some(d) => format!("retry in {} s", d.as_secs().max(1)),
                    None => format!("a fork of {count} can never fit a quota of {max} per minute"),
                };
                return Err(quota_exceeded(format!(
                    "tenant {tenant:?} would exceed its forks_per_minute quota: {used} of {max} fork children made in the last 60 s, this request makes {count} more ({when}; the operator changes it with `strata tenant quota set {tenant} --forks-per-minute ...`)"
                )));
            }
        }
        Ok(())
    }

    /// A tenant's usage against its quota.
    pub fn usage(&self, db: &strata_store::Db, tenant: &str) -> EngineResult<TenantUsage> {
        let q = self.quota_of(db, tenant)?;
        let mut book = self.book();
        let records = db.resource_claims()?;
        let t = self.totals(&records, &book, tenant);
        let forks = book.forks.get_mut(tenant).map_or(0, |w| w.used(Instant::now()));
        Ok(TenantUsage {
            tenant: tenant.to_string(),
            sandboxes: QuotaUsage { used: t.tenant_sandboxes, limit: q.sandboxes },
            memory_bytes: QuotaUsage { used: t.tenant_memory, limit: q.memory_bytes },
            disk_bytes: QuotaUsage { used: t.tenant_disk, limit: q.disk_bytes },
            forks_per_minute: QuotaUsage { used: forks, limit: q.forks_per_minute },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    fn host() -> HostBounds {
        HostBounds {
            mem_total: 8 * GIB,
            cpus: 2.0,
            pid_max: 32768,
            fs_bytes: 100 * GIB,
            state_dir: "/var/lib/strata".into(),
        }
    }

    #[test]
    fn limits_are_bounded_by_floors_and_the_host() {
        let h = host();
        let ok = |l: ResourceLimits| h.validate(&l);
        assert!(ok(ResourceLimits {
            memory_bytes: Some(16 * MIB),
            pids: Some(16),
            cpus: Some(0.01),
            disk_bytes: Some(16 * MIB),
            disk_quota: None
        })
        .is_ok());
        assert!(ok(ResourceLimits {
            memory_bytes: Some(8 * GIB),
            pids: Some(32768),
            cpus: Some(2.0),
            disk_bytes: Some(100 * GIB),
            disk_quota: None
        })
        .is_ok());
        for (l, words) in [
            (ResourceLimits { memory_bytes: Some(1), ..Default::default() }, ["limits.memory_bytes", "16.0 MiB"]),
            (
                ResourceLimits { memory_bytes: Some(8 * GIB + 1), ..Default::default() },
                ["limits.memory_bytes", "MemTotal 8.0 GiB"],
            ),
            (ResourceLimits { pids: Some(15), ..Default::default() }, ["limits.pids", "at least 16"]),
            (ResourceLimits { pids: Some(32769), ..Default::default() }, ["limits.pids", "pid_max (32768)"]),
            (ResourceLimits { cpus: Some(0.0), ..Default::default() }, ["limits.cpus", "0.01"]),
            (ResourceLimits { cpus: Some(f64::NAN), ..Default::default() }, ["limits.cpus", "0.01"]),
            (ResourceLimits { cpus: Some(2.5), ..Default::default() }, ["limits.cpus", "2 CPUs"]),
            (ResourceLimits { disk_bytes: Some(64 << 40), ..Default::default() }, ["limits.disk_bytes", "100.0 GiB"]),
            (ResourceLimits { disk_bytes: Some(MIB), ..Default::default() }, ["limits.disk_bytes", "16.0 MiB"]),
        ] {
            let e = ok(l.clone()).unwrap_err();
            for w in words {
                assert!(e.contains(w), "{l:?}: {e:?} should name {w:?}");
            }
        }
    }

    #[test]
    fn tenant_quota_flags_parse_over_the_builtin_defaults() {
        let q = TenantQuotaConfig::default();
        assert_eq!(q.sandboxes, QuotaSetting::Limit(100));
        assert_eq!(q.memory_bytes, QuotaSetting::HostPercent(100.0));
        let q = parse_tenant_quota("sandboxes=5, memory=4g,disk=unlimited,forks-per-minute=10").unwrap();
        assert_eq!(
            (q.sandboxes, q.memory_bytes, q.disk_bytes, q.forks_per_minute),
            (QuotaSetting::Limit(5), QuotaSetting::Limit(4 * GIB), QuotaSetting::Unlimited, QuotaSetting::Limit(10))
        );
        let q = parse_tenant_quota("disk=50%").unwrap();
        assert_eq!((q.disk_bytes, q.sandboxes), (QuotaSetting::HostPercent(50.0), QuotaSetting::Limit(100)));
        for bad in ["sandboxes", "sandboxes=lots", "sandboxes=10%", "cpus=2", "memory=-1%", "disk=big"] {
            assert!(parse_tenant_quota(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn defaults_cap_cpus_resolve_percentages_and_are_checked() {
        let cfg =
            AdmissionConfig { tenant_quota: parse_tenant_quota("memory=50%,disk=10%").unwrap(), ..Default::default() };
        let small = HostBounds { cpus: 1.0, mem_total: GIB, fs_bytes: 5 * GIB, ..host() };
        let d = Admission::new(&cfg, small).unwrap().defaults().clone();
        assert_eq!(
            (d.cpus, d.memory_bytes, d.disk_bytes),
            (Some(1.0), Some(GIB), Some(5 * GIB)),
            "built-in defaults are capped at a small host"
        );
        let a = Admission::new(&cfg, host()).unwrap();
        assert_eq!(a.defaults().cpus, Some(2.0));
        assert_eq!((a.tenant_defaults().memory_bytes, a.tenant_defaults().disk_bytes), (Some(4 * GIB), Some(10 * GIB)));
        let mut l = ResourceLimits { pids: Some(50), ..Default::default() };
        a.apply_defaults(&mut l);
        assert_eq!(
            (l.memory_bytes, l.pids, l.cpus, l.disk_bytes),
            (Some(2 * GIB), Some(50), Some(2.0), Some(10 * GIB))
        );
        let given = AdmissionConfig { default_cpus: DefaultLimit::Value(4.0), ..Default::default() };
        assert!(
            matches!(Admission::new(&given, host()), Err(ConfigError::Invalid { flag: "--default-cpus", .. })),
            "a given default above the host is refused"
        );
        let tiny = AdmissionConfig { default_memory: DefaultLimit::Value(1), ..Default::default() };
        assert!(matches!(Admission::new(&tiny, host()), Err(ConfigError::Invalid { flag: "--default-memory", .. })));
        let none = AdmissionConfig {
            default_memory: DefaultLimit::NoLimit,
            default_pids: DefaultLimit::NoLimit,
            default_cpus: DefaultLimit::NoLimit,
            default_disk: DefaultLimit::NoLimit,
            ..Default::default()
        };
        let mut l = ResourceLimits::default();
        Admission::new(&none, host()).unwrap().apply_defaults(&mut l);
        assert_eq!(l, ResourceLimits::default(), "`none` defaults leave the limits out");
    }

    #[test]
    fn the_fork_window_slides() {
        let mut w = ForkWindow::default();
        let t0 = Instant::now();
        assert!(w.check(t0, 3, 3).is_ok() && w.used(t0) == 0, "a check counts nothing");
        assert!(w.admit(t0, 2, 3).is_ok());
        let (used, retry) = w.admit(t0 + Duration::from_secs(10), 2, 3).unwrap_err();
        assert_eq!(
            (used, retry),
            (2, Some(Duration::from_secs(50))),
            "the first child leaves the window 60 s after it was made"
        );
        assert!(w.admit(t0 + Duration::from_secs(10), 1, 3).is_ok());
        assert_eq!(
            w.admit(t0 + Duration::from_secs(20), 4, 3).unwrap_err(),
            (3, None),
            "more than the quota never fits"
        );
        assert_eq!(w.used(t0 + Duration::from_secs(60)), 1, "the two from t0 are out of the window at 60 s");
        assert!(w.admit(t0 + Duration::from_secs(60), 2, 3).is_ok());
        assert_eq!(w.used(t0 + Duration::from_secs(200)), 0);
    }

    #[test]
    fn totals_leave_out_records_that_have_a_claim() {
        let a = Admission::new(&AdmissionConfig::default(), host()).unwrap();
        let rec = |id: &str, tenant: &str, state, m: Option<u64>, d: Option<u64>| ResourceClaim {
            id: id.into(),
            tenant: tenant.into(),
            state,
            memory_bytes: m,
            disk_bytes: d,
        };
        let records = vec![
            rec("a", "acme", SandboxState::Running, Some(GIB), Some(10 * GIB)),
            rec("b", "acme", SandboxState::Stopped, Some(GIB), Some(10 * GIB)),
            rec("c", "globex", SandboxState::Paused, None, None),
        ];
        let mut book = Book::default();
        let t = a.totals(&records, &book, "acme");
        assert_eq!(
            (t.tenant_sandboxes, t.tenant_memory, t.tenant_disk),
            (2, GIB, 20 * GIB),
            "stopped sandboxes hold no memory"
        );
        assert_eq!(
            (t.host_memory, t.host_disk),
            (GIB + 8 * GIB, 20 * GIB + 100 * GIB),
            "no limit counts as the whole host"
        );
        // Starting b: its record is replaced by its claim (counted once).
        book.claims
            .insert("b".into(), Claim { tenant: "acme".into(), memory_bytes: Some(GIB), disk_bytes: Some(10 * GIB) });
        let t = a.totals(&records, &book, "acme");
        assert_eq!((t.tenant_sandboxes, t.tenant_memory, t.tenant_disk), (2, 2 * GIB, 20 * GIB));
    }
}
