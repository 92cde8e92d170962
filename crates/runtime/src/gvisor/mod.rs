//! The gVisor tier (runsc, a user-space kernel between the sandbox and the
//! host): host probe. The tier itself will implement [`crate::Runtime`]
//! beside the namespace tier; this module answers what the host offers for
//! it, for `strata doctor` and for the engine's choice of tiers.

use std::path::PathBuf;
use std::process::Command;

/// What the host offers for the gVisor tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GvisorProbe {
    /// Where `runsc` is, when installed.
    pub runsc: Option<PathBuf>,
    /// Its version line (`runsc version release-20240729.0`).
    pub version: Option<String>,
}

/// Looks for `runsc` on `PATH` (and in `/usr/sbin`, `/usr/bin`) and asks its version.
pub fn probe() -> GvisorProbe {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let runsc = std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/bin", "/usr/local/bin"].map(PathBuf::from))
        .map(|d| d.join("runsc"))
        .find(|p| p.is_file());
    let version = runsc.as_ref().and_then(|p| {
        let out = Command::new(p).arg("--version").output().ok().filter(|o| o.status.success())?;
        String::from_utf8_lossy(&out.stdout).lines().next().map(|l| l.trim().to_string())
    });
    GvisorProbe { runsc, version }
}

impl GvisorProbe {
    /// Why this build cannot run the tier on this host (the tier's runtime
    /// is not part of this build yet; what the host has is said too).
    pub fn unavailable(&self) -> String {
        match (&self.runsc, &self.version) {
            (None, _) => "the gvisor tier is not implemented in this build; runsc is not installed either".into(),
            (Some(p), Some(v)) => {
                format!("the gvisor tier is not implemented in this build ({} found: {v})", p.display())
            }
            (Some(p), None) => {
                format!("the gvisor tier is not implemented in this build ({} does not run)", p.display())
            }
        }
    }
}
