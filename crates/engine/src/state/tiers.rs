//! The isolation tiers this daemon can run and the default one
//! (`strata daemon --default-isolation`). A create names a tier or gets the
//! default; a tier that cannot run here is refused with why (501), never
//! replaced by another one. A sandbox's runtime is its tier's
//! ([`tier_of`], [`crate::state::AppState::runtime_of`]).

use std::collections::BTreeMap;
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use strata_api::{ErrorCode, Isolation};
use strata_runtime::spec::{ExecSpec, SandboxSpec};
use strata_runtime::{InterruptedRestore, NetSockets, ResourceUsage, Runtime, RuntimeError, SandboxHandle};

use crate::error::{EngineError, EngineResult};

/// Which tiers run here, and the default.
#[derive(Debug, Clone)]
pub struct Tiers {
    default: Isolation,
    /// Why each tier that cannot run here cannot.
    unavailable: BTreeMap<Isolation, String>,
    /// Namespace-tier sandboxes get a user namespace unless asked otherwise (`--default-userns`).
    default_userns: bool,
    /// Why namespace-tier sandboxes cannot have a user namespace here (`None`: they can).
    userns_unavailable: Option<String>,
}

impl Default for Tiers {
    /// The namespace tier only (what a daemon without a probe, e.g. in unit tests, runs).
    fn default() -> Self {
        let why = "not probed on this daemon".to_string();
        Tiers {
            default: Isolation::Namespace,
            unavailable: BTreeMap::from([(Isolation::Gvisor, why.clone()), (Isolation::Microvm, why)]),
            default_userns: false,
            userns_unavailable: strata_runtime::probe::userns_unavailable(),
        }
    }
}

impl Tiers {
    /// Tiers with `unavailable` (each with why) and `default`, which must be available.
    pub fn new(default: Isolation, unavailable: BTreeMap<Isolation, String>) -> Result<Tiers, String> {
        if let Some(why) = unavailable.get(&default) {
            return Err(format!("default isolation {default}: {why}"));
        }
        Ok(Tiers { default, unavailable, ..Tiers::default() })
    }

    /// With `--default-userns`: `None` on where this host can, `Some(true)`
    /// on (refused, with why, when this host cannot), `Some(false)` off.
    pub fn with_default_userns(mut self, on: Option<bool>) -> Result<Tiers, String> {
        self.default_userns = match (on, &self.userns_unavailable) {
            (Some(true), Some(why)) => return Err(format!("default user namespaces: {why}")),
            (Some(on), _) => on,
            (None, why) => {
                if let Some(why) = why {
                    tracing::warn!(why = %why, "sandboxes get no user namespace by default on this host");
                }
                why.is_none()
            }
        };
        Ok(self)
    }

    /// Why namespace-tier sandboxes cannot have a user namespace here (`None`: they can).
    pub fn userns_why_not(&self) -> Option<&str> {
        self.userns_unavailable.as_deref()
    }

    /// Whether namespace-tier sandboxes get a user namespace when nothing asks otherwise.
    pub fn default_userns(&self) -> bool {
        self.default_userns
    }

    /// Overrides the host probe (tests).
    pub fn with_userns_unavailable(mut self, why: Option<String>) -> Tiers {
        self.userns_unavailable = why;
        self
    }

    /// Whether a sandbox on `tier` gets a user namespace: what the request
    /// says, else what its source checkpoint's sandbox had, else the daemon's
    /// default, else yes when it declares untrusted input and this host can
    /// (a default the host cannot meet is skipped, as `strata doctor` says).
    /// `true` asked for on another tier is a 400; asked for or inherited on a
    /// host that cannot is a 501 with why.
    pub fn userns(
        &self,
        tier: Isolation,
        requested: Option<bool>,
        inherited: Option<bool>,
        untrusted: bool,
    ) -> EngineResult<bool> {
        if tier != Isolation::Namespace {
            if requested == Some(true) {
                return Err(EngineError::bad_request(format!(
                    "userns applies to the namespace tier; the {tier} tier has its own boundary"
                )));
            }
            return Ok(false);
        }
        let explicit = requested.or(inherited).or(self.default_userns.then_some(true));
        match (explicit, &self.userns_unavailable) {
            (Some(true), Some(why)) => {
                Err(EngineError::new(ErrorCode::Unsupported, format!("user namespace (userns): {why}")))
            }
            (Some(on), _) => Ok(on),
            (None, why) => Ok(untrusted && why.is_none()),
        }
    }

    /// The default tier.
    pub fn default_tier(&self) -> Isolation {
        self.default
    }

    /// Why `tier` cannot run here (`None`: it can).
    pub fn why_not(&self, tier: Isolation) -> Option<&str> {
        self.unavailable.get(&tier).map(String::as_str)
    }

    /// The tier a create gets: the one it asked for, or the default; 501
    /// naming what is missing when that tier cannot run here.
    pub fn resolve(&self, requested: Option<Isolation>) -> EngineResult<Isolation> {
        let tier = requested.unwrap_or(self.default);
        match self.why_not(tier) {
            None => Ok(tier),
            Some(why) => Err(EngineError::new(ErrorCode::Unsupported, format!("isolation {tier}: {why}"))),
        }
    }
}

/// Refuses `what` on a microVM sandbox (501): the microvm tier does not do
/// it in this build (docs/microvm.md says what it does).
pub fn refuse_microvm(sb: &strata_api::Sandbox, what: &str) -> EngineResult<()> {
    if tier_of(sb) != Isolation::Microvm {
        return Ok(());
    }
    Err(EngineError::new(
        ErrorCode::Unsupported,
        format!("{what} of sandbox {}: the microvm tier does not do it in this build (see docs/microvm.md)", sb.id),
    ))
}

/// The tier a sandbox's record names (`runtime`: `gvisor`, `microvm`; any
/// other name, e.g. a test's fake, is the namespace tier's runtime).
pub fn tier_of(sb: &strata_api::Sandbox) -> Isolation {
    match sb.runtime.as_str() {
        "gvisor" => Isolation::Gvisor,
        "microvm" => Isolation::Microvm,
        _ => Isolation::Namespace,
    }
}

/// The runtime of a tier this daemon does not run (a gVisor sandbox recorded
/// by a daemon that had runsc, on one that has not): nothing of it runs here,
/// and every operation that would need the tier fails saying why.
pub struct Missing {
    tier: Isolation,
    why: String,
}

impl Missing {
    /// The stand-in for `tier`, which cannot run because of `why`.
    pub fn new(tier: Isolation, why: &str) -> Missing {
        Missing { tier, why: why.to_string() }
    }

    fn err(&self) -> RuntimeError {
        RuntimeError::Unsupported(format!("isolation {}: {}", self.tier, self.why))
    }
}

impl Runtime for Missing {
    fn name(&self) -> &'static str {
        self.tier.as_str()
    }
    fn start(&self, _: &SandboxSpec) -> Result<SandboxHandle, RuntimeError> {
        Err(self.err())
    }
    fn is_alive(&self, _: &SandboxHandle) -> bool {
        false
    }
    fn exec_command(
        &self,
        _: &str,
        _: &SandboxHandle,
        _: &ExecSpec,
    ) -> Result<strata_runtime::HelperCommand, RuntimeError> {
        Err(self.err())
    }
    fn stop(&self, _: &str, _: &SandboxHandle, _: Duration) -> Result<(), RuntimeError> {
        Err(self.err())
    }
    fn cleanup(&self, _: &str) -> Result<(), RuntimeError> {
        Err(self.err())
    }
    fn set_frozen(&self, _: &str, _: bool) -> Result<(), RuntimeError> {
        Err(self.err())
    }
    fn usage(&self, _: &str) -> ResourceUsage {
        ResourceUsage::default()
    }
    fn run_dir(&self) -> PathBuf {
        PathBuf::new()
    }
    fn signal(&self, _: &str, _: i32, _: i32, _: bool) -> usize {
        0
    }
    fn resize_tty(
        &self,
        _: &str,
        _: &SandboxHandle,
        _: i32,
        _: Option<u32>,
        _: strata_runtime::spec::TtySize,
    ) -> Result<(), RuntimeError> {
        Err(self.err())
    }
    fn process_dump_unsupported(&self) -> Option<String> {
        Some(self.err().to_string())
    }
    fn dump_processes(&self, _: &str, _: &SandboxHandle, _: &Path) -> Result<PathBuf, RuntimeError> {
        Err(self.err())
    }
    fn copy_processes(&self, _: &str, _: &SandboxHandle, _: &Path) -> Result<PathBuf, RuntimeError> {
        Err(self.err())
    }
    fn restore_processes(
        &self,
        _: &SandboxSpec,
        _: &Path,
        _: &Path,
        _: &Path,
        _: &[(RawFd, u64)],
        _: strata_runtime::MemoryRestore,
    ) -> Result<SandboxHandle, RuntimeError> {
        Err(self.err())
    }
    fn reidentify(&self, _: &SandboxSpec, _: &SandboxHandle) -> Result<(), RuntimeError> {
        Err(self.err())
    }
    fn interrupted_restore(&self, _: &str, _: &Path) -> InterruptedRestore {
        InterruptedRestore::None
    }
    fn restore_leftovers(&self, _: &Path) -> Option<PathBuf> {
        None
    }
    fn net_sockets(&self, _: &SandboxHandle, _: Duration) -> Result<Box<dyn NetSockets>, RuntimeError> {
        Err(self.err())
    }
    fn open_root(&self, _: &str, _: &SandboxHandle) -> std::io::Result<std::os::fd::OwnedFd> {
        Err(std::io::Error::new(std::io::ErrorKind::Unsupported, self.err().to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tier_that_cannot_run_is_refused_with_why_and_never_replaced() {
        let t = Tiers::default();
        assert_eq!(t.resolve(None).unwrap(), Isolation::Namespace);
        assert_eq!(t.resolve(Some(Isolation::Namespace)).unwrap(), Isolation::Namespace);
        let e = t.resolve(Some(Isolation::Gvisor)).unwrap_err();
        assert_eq!(e.body.code, ErrorCode::Unsupported);
        assert!(e.body.message.starts_with("isolation gvisor: "), "{}", e.body.message);
        let why = BTreeMap::from([(Isolation::Gvisor, "runsc not installed".to_string())]);
        let err = Tiers::new(Isolation::Gvisor, why.clone()).unwrap_err();
        assert_eq!(err, "default isolation gvisor: runsc not installed");
        assert_eq!(Tiers::new(Isolation::Namespace, why).unwrap().default_tier(), Isolation::Namespace);
    }

    #[test]
    fn userns_comes_from_the_request_the_source_the_default_or_untrusted_input() {
        use Isolation::*;
        let t = Tiers::default().with_userns_unavailable(None);
        assert!(!t.userns(Namespace, None, None, false).unwrap());
        assert!(t.userns(Namespace, None, None, true).unwrap(), "untrusted input gets one");
        assert!(!t.userns(Namespace, Some(false), None, true).unwrap(), "unless asked otherwise");
        assert!(t.userns(Namespace, None, Some(true), false).unwrap(), "forks keep their source's");
        assert!(!t.userns(Namespace, Some(false), Some(true), false).unwrap());
        let on = t.clone().with_default_userns(Some(true)).unwrap();
        assert!(t.clone().with_default_userns(None).unwrap().default_userns(), "auto: on where the host can");
        assert!(!t.clone().with_default_userns(Some(false)).unwrap().default_userns());
        assert!(on.userns(Namespace, None, None, false).unwrap());
        assert!(!on.userns(Namespace, None, Some(false), false).unwrap(), "a source without one keeps it so");
        // Other tiers: never, and asking is a 400.
        assert!(!on.userns(Gvisor, None, Some(true), true).unwrap());
        let e = t.userns(Gvisor, Some(true), None, false).unwrap_err();
        assert_eq!(e.code().http_status(), 400, "{}", e.body.message);
        // A host that cannot: asked or inherited is a 501 with why; untrusted input goes without.
        let no = Tiers::default().with_userns_unavailable(Some("Linux 6.1 cannot".into()));
        let e = no.userns(Namespace, Some(true), None, false).unwrap_err();
        assert_eq!(
            (e.code().http_status(), e.body.message.as_str()),
            (501, "user namespace (userns): Linux 6.1 cannot")
        );
        assert_eq!(no.userns(Namespace, None, Some(true), false).unwrap_err().code().http_status(), 501);
        assert!(!no.userns(Namespace, None, None, true).unwrap());
        assert!(!no.clone().with_default_userns(None).unwrap().default_userns(), "auto: off where it cannot");
        assert_eq!(no.with_default_userns(Some(true)).unwrap_err(), "default user namespaces: Linux 6.1 cannot");
    }
}
