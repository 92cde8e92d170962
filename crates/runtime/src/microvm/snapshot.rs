//! A microVM's snapshot (its standby image): QEMU's saved machine
//! ([`STATE_FILE`], memory and device state, written by `migrate` to a file),
//! the channel token its pid 1 holds ([`TOKEN_FILE`]), and what made it
//! ([`Manifest`], [`MANIFEST_FILE`]): a QEMU, machine, accelerator or CPU
//! model other than the restoring host's cannot load it faithfully, so such a
//! resume is refused with the reason and the snapshot kept.
//!
//! A warm checkpoint's snapshot ([`Copy`]) also starts other sandboxes:
//! the guest's RAM as a file of its own ([`RAM_FILE`], which every copy maps
//! private, sharing its pages until it writes them; QEMU's state then leaves
//! the RAM out: `x-ignore-shared`), and under [`DRIVES_DIR`] the disk as the
//! guest left it and the lower image it ran on, block for block what the
//! saved guest's kernel has cached of them.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// QEMU's saved machine in a snapshot directory.
pub const STATE_FILE: &str = "vm.state";
/// The channel token in a snapshot directory (mode 0600).
pub const TOKEN_FILE: &str = "token";
/// The manifest in a snapshot directory.
pub const MANIFEST_FILE: &str = "vm.json";
/// The guest's RAM in a warm checkpoint's snapshot (sparse).
pub const RAM_FILE: &str = "ram";
/// The directory of a warm checkpoint's disks (not summed with the image's
/// files: the disk is a sparse file of the disk limit, the lower image the
/// layer chain's own).
pub const DRIVES_DIR: &str = "drives";
/// The sandbox's disk under [`DRIVES_DIR`].
pub const DISK_FILE: &str = "disk.img";
/// The lower image under [`DRIVES_DIR`] (a hard link to the chain's).
pub const LOWER_FILE: &str = "lower.img";

/// The shape of a VM a warm checkpoint's snapshot can start copies of: a
/// copy must have the same RAM, vCPUs, network device and disk (QEMU loads
/// device state into the same devices, the guest's kernel knows its disk's size).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Copy {
    /// Guest RAM in MiB.
    pub guest_mib: u64,
    /// vCPUs.
    pub vcpus: u32,
    /// Whether it has a network device.
    pub net: bool,
    /// The disk's size in bytes.
    pub disk_bytes: u64,
    /// Whether the RAM is [`RAM_FILE`] (else it is in the state file: the
    /// VM ran on another snapshot's RAM file, mapped private).
    pub ram_file: bool,
}

impl Copy {
    /// Why a sandbox of `wanted`'s shape cannot start from this snapshot (`None`: it can).
    pub fn mismatch(&self, wanted: &Copy) -> Option<String> {
        let say = |a: String, b: String| {
            Some(format!("the warm checkpoint's VM has {a}, the new sandbox asks for {b}: a copy of a running VM keeps its shape (leave the limit out, or start without processes)"))
        };
        let net = |b: bool| if b { "a network link" } else { "no network" }.to_string();
        match () {
            _ if self.guest_mib != wanted.guest_mib => {
                say(format!("memory {} MiB", self.guest_mib), format!("{} MiB", wanted.guest_mib))
            }
            _ if self.vcpus != wanted.vcpus => say(format!("vCPUs {}", self.vcpus), wanted.vcpus.to_string()),
            _ if self.net != wanted.net => say(net(self.net), net(wanted.net)),
            _ if self.disk_bytes != wanted.disk_bytes => {
                say(format!("a disk of {} bytes", self.disk_bytes), format!("{} bytes", wanted.disk_bytes))
            }
            _ => None,
        }
    }
}

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
    /// The sandbox's processes were frozen in the guest when it was saved
    /// (they run again once the restored guest is reseeded).
    #[serde(default)]
    pub workload_frozen: bool,
    /// A warm checkpoint's: what copies need (`None`: a standby image,
    /// which only its own sandbox resumes from).
    #[serde(default)]
    pub copy: Option<Copy>,
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
            workload_frozen: true,
            copy: None,
        }
    }

    #[test]
    fn a_copy_keeps_its_source_s_shape_and_says_what_differs() {
        let c = Copy { guest_mib: 512, vcpus: 1, net: false, disk_bytes: 1 << 30, ram_file: true };
        assert_eq!(c.mismatch(&c.clone()), None);
        assert!(c.mismatch(&Copy { guest_mib: 1024, ..c.clone() }).unwrap().contains("memory 512 MiB"));
        assert!(c.mismatch(&Copy { vcpus: 2, ..c.clone() }).unwrap().contains("vCPUs 1"));
        assert!(c.mismatch(&Copy { net: true, ..c.clone() }).unwrap().contains("no network"));
        assert!(c.mismatch(&Copy { disk_bytes: 2 << 30, ..c.clone() }).unwrap().contains("disk"));
        // A standby image of an older build has neither field.
        let old = r#"{"sandbox":"s","qemu":"q","machine":"microvm","accel":"tcg","cpu":"qemu64","kernel":"k"}"#;
        let m: Manifest = serde_json::from_str(old).unwrap();
        assert!(!m.workload_frozen && m.copy.is_none());
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
