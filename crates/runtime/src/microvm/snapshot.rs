//! A microVM's snapshot (its standby image): QEMU's saved machine
//! ([`STATE_FILE`], memory and device state, written by `migrate` to a file),
//! the channel token its pid 1 holds ([`TOKEN_FILE`]), and what made it
//! ([`Manifest`], [`MANIFEST_FILE`]): a QEMU, machine, accelerator or CPU
//! model other than the restoring host's cannot load it faithfully, so such a
//! resume is refused with the reason and the snapshot kept.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// QEMU's saved machine in a snapshot directory.
pub const STATE_FILE: &str = "vm.state";
/// The channel token in a snapshot directory (mode 0600).
pub const TOKEN_FILE: &str = "token";
/// The manifest in a snapshot directory.
pub const MANIFEST_FILE: &str = "vm.json";

/// What made a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The sandbox it is of.
    pub sandbox: String,
    /// QEMU's version line.
    pub qemu: String,
    /// The machine type.
    pub machine: String,
    /// `kvm` or `tcg`.
    pub accel: String,
    /// The CPU model.
    pub cpu: String,
    /// The guest kernel's release.
    pub kernel: String,
}

impl Manifest {
    /// Writes it into `dir` (atomically).
    pub fn save(&self, dir: &Path) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(self).expect("serializes");
        super::disks::write_atomically(&dir.join(MANIFEST_FILE), &bytes).map_err(std::io::Error::other)
    }

    /// Reads the manifest of the snapshot in `dir`.
    pub fn load(dir: &Path) -> Result<Manifest, String> {
        let path = dir.join(MANIFEST_FILE);
        let bytes =
            std::fs::read(&path).map_err(|e| format!("the VM snapshot has no manifest ({}: {e})", path.display()))?;
        serde_json::from_slice(&bytes)
            .map_err(|e| format!("the VM snapshot's manifest {} is damaged: {e}", path.display()))
    }

    /// Why a snapshot made as `self` cannot be loaded where `here` holds (`None`: it can).
    pub fn mismatch(&self, here: &Manifest) -> Option<String> {
        let pairs = [
            ("QEMU", &self.qemu, &here.qemu),
            ("machine", &self.machine, &here.machine),
            ("accelerator", &self.accel, &here.accel),
            ("CPU model", &self.cpu, &here.cpu),
            ("guest kernel", &self.kernel, &here.kernel),
        ];
        pairs.iter().find(|(_, a, b)| a != b).map(|(what, a, b)| {
            format!("the VM was saved under {what} {a:?}, this host has {b:?}; it can only resume where that matches")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m() -> Manifest {
        Manifest {
            sandbox: "sb".into(),
            qemu: "QEMU emulator version 10.0.2".into(),
            machine: "microvm".into(),
            accel: "tcg".into(),
            cpu: "qemu64".into(),
            kernel: "6.1.0-57-cloud-amd64".into(),
        }
    }

    #[test]
    fn a_snapshot_resumes_only_where_it_was_made_and_says_why_not() {
        let d = tempfile::tempdir().unwrap();
        m().save(d.path()).unwrap();
        let loaded = Manifest::load(d.path()).unwrap();
        assert_eq!(loaded, m());
        assert_eq!(loaded.mismatch(&m()), None);
        let other = Manifest { qemu: "QEMU emulator version 9.2.0".into(), ..m() };
        assert!(loaded.mismatch(&other).unwrap().contains("QEMU"));
        let kvm = Manifest { accel: "kvm".into(), cpu: "host".into(), ..m() };
        assert!(loaded.mismatch(&kvm).unwrap().contains("accelerator"));
        std::fs::write(d.path().join(MANIFEST_FILE), b"{").unwrap();
        assert!(Manifest::load(d.path()).unwrap_err().contains("damaged"));
        assert!(Manifest::load(&d.path().join("none")).unwrap_err().contains("no manifest"));
    }
}
