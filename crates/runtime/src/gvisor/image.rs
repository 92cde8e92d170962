//! What a gVisor process image needs of the host that restores it: the same
//! runsc (its image format is its own, unversioned), the same platform, and
//! every CPU feature the saving host had (restored code may use any of them).
//! Written next to the image as [`HOST_FILE`] at checkpoint; a restore on a
//! host that does not match is refused with the reason, and the image kept.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// The file in a process image that records its host.
pub const HOST_FILE: &str = "gvisor-host.json";

/// The host a gVisor process image was made on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageHost {
    /// runsc's version line.
    pub runsc: String,
    /// The platform the sentry ran on (`systrap`, `kvm`).
    pub platform: String,
    /// The CPU's feature flags (`/proc/cpuinfo`), sorted.
    pub cpu_flags: Vec<String>,
    /// How host processes reach the image's pid 1 ([`EXEC_CHANNEL`]; 0:
    /// `runsc exec` of a client, before the exec channel).
    #[serde(default)]
    pub exec_channel: u32,
}

/// The exec path images made now have: pid 1 reached over the exec channel
/// (`strata_init::channel`) with the token saved beside the image ([`TOKEN_FILE`]).
pub const EXEC_CHANNEL: u32 = 1;

/// The file in a process image that keeps the sandbox's channel token (its
/// restored pid 1 holds the same one in memory).
pub const TOKEN_FILE: &str = "channel.token";

/// The CPU feature flags of this host (of its first CPU), sorted.
pub fn cpu_flags() -> Vec<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let mut flags: Vec<String> = info
        .lines()
        .find(|l| l.starts_with("flags"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, f)| f.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default();
    flags.sort();
    flags.dedup();
    flags
}

impl ImageHost {
    /// Why an image made on `self` cannot be restored on `here` (`None`: it can).
    pub fn mismatch(&self, here: &ImageHost) -> Option<String> {
        if self.exec_channel != here.exec_channel {
            return Some(format!(
                "its init speaks exec protocol {} and this strata speaks {} (an image of an older strata; it restarts from its filesystem)",
                self.exec_channel, here.exec_channel
            ));
        }
        if self.runsc != here.runsc {
            return Some(format!(
                "it was made by {} and this host has {} (runsc images are not portable between versions)",
                self.runsc, here.runsc
            ));
        }
        if self.platform != here.platform {
            return Some(format!("it was made on the {} platform and this host uses {}", self.platform, here.platform));
        }
        let missing: Vec<&str> =
            self.cpu_flags.iter().filter(|f| here.cpu_flags.binary_search(f).is_err()).map(String::as_str).collect();
        if !missing.is_empty() {
            return Some(format!("this host's CPU lacks features the image's had: {}", missing.join(" ")));
        }
        None
    }

    /// Writes the record into `dir` (synced).
    pub fn save(&self, dir: &Path) -> std::io::Result<()> {
        use std::io::Write;
        let mut f = std::fs::File::create(dir.join(HOST_FILE))?;
        f.write_all(&serde_json::to_vec_pretty(self).expect("serializes"))?;
        f.sync_all()
    }

    /// Reads the record of the image in `dir`.
    pub fn load(dir: &Path) -> Result<ImageHost, String> {
        let bytes = std::fs::read(dir.join(HOST_FILE)).map_err(|e| format!("{HOST_FILE}: {e}"))?;
        serde_json::from_slice(&bytes).map_err(|e| format!("{HOST_FILE}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> ImageHost {
        ImageHost {
            runsc: "runsc version 0.0~20240729.0".into(),
            platform: "systrap".into(),
            cpu_flags: vec!["avx2".into(), "sse4_2".into()],
            exec_channel: EXEC_CHANNEL,
        }
    }

    #[test]
    fn another_runsc_platform_or_cpu_is_refused_with_the_reason() {
        let saved = host();
        assert_eq!(saved.mismatch(&saved), None);
        let more = ImageHost { cpu_flags: vec!["avx2".into(), "avx512f".into(), "sse4_2".into()], ..host() };
        assert_eq!(saved.mismatch(&more), None, "a host with more features restores");
        let fewer = ImageHost { cpu_flags: vec!["sse4_2".into()], ..host() };
        assert!(saved.mismatch(&fewer).unwrap().contains("lacks features the image's had: avx2"));
        let other = ImageHost { runsc: "runsc version release-20250101.0".into(), ..host() };
        assert!(saved.mismatch(&other).unwrap().contains("not portable"));
        let kvm = ImageHost { platform: "kvm".into(), ..host() };
        assert!(saved.mismatch(&kvm).unwrap().contains("systrap platform"));
        // An image of a strata before the exec channel (the field absent) is refused with why.
        let old: ImageHost = serde_json::from_str(
            r#"{"runsc":"runsc version 0.0~20240729.0","platform":"systrap","cpu_flags":["avx2","sse4_2"]}"#,
        )
        .unwrap();
        assert!(old.mismatch(&saved).unwrap().contains("older strata"), "{:?}", old.mismatch(&saved));
    }

    #[test]
    fn the_record_round_trips() {
        let d = tempfile::tempdir().unwrap();
        host().save(d.path()).unwrap();
        assert_eq!(ImageHost::load(d.path()).unwrap(), host());
        assert!(ImageHost::load(&d.path().join("missing")).is_err());
        assert!(!cpu_flags().is_empty(), "this host's flags are read");
    }
}
