//! The microvm tier (QEMU `-M microvm`): host probe.
//!
//! The tier itself implements [`crate::Runtime`] beside the namespace tier; this
//! module currently answers whether the host could run it, for `strata doctor`.

use std::path::Path;
use std::process::Command;

/// What the host offers for the microvm tier.
#[derive(Debug, Clone)]
pub struct MicrovmProbe {
    /// Path and version of qemu-system-x86_64, when installed.
    pub qemu: Option<String>,
    /// `/dev/kvm` kind: `none`, `hardware` or `pvm` (software nested virtualization).
    pub kvm: String,
}

/// Probes for QEMU and KVM.
pub fn probe() -> MicrovmProbe {
    let qemu = Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().next().unwrap_or_default().to_string());
    let kvm = if !Path::new("/dev/kvm").exists() {
        "none".to_string()
    } else if std::fs::read_to_string("/proc/modules").is_ok_and(|m| m.lines().any(|l| l.starts_with("kvm_pvm"))) {
        "pvm".to_string()
    } else if std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|c| c.contains(" vmx") || c.contains(" svm")) {
        "hardware".to_string()
    } else {
        "unknown".to_string()
    };
    MicrovmProbe { qemu, kvm }
}
