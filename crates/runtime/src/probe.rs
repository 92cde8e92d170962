//! Host capability probes behind `strata doctor`.

use std::path::Path;
use std::process::Command;

use strata_api::{DoctorReport, FeatureCheck, TierCapability, TierReport};

use crate::cgroup;

fn check(name: &str, available: bool, detail: impl Into<String>, disables: &str) -> FeatureCheck {
    FeatureCheck {
        name: name.into(),
        available,
        detail: detail.into(),
        disables: if available { String::new() } else { disables.into() },
    }
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Parses `criu --version` output ("Version: 4.1.1") into (major, minor).
pub fn parse_criu_version(out: &str) -> Option<(u32, u32)> {
    let v = out.lines().find_map(|l| l.trim().strip_prefix("Version:"))?.trim();
    let mut it = v.split('.');
    Some((it.next()?.parse().ok()?, it.next().unwrap_or("0").parse().ok()?))
}

fn capability_in_effective_set(cap: u32) -> bool {
    read("/proc/self/status")
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        .is_some_and(|mask| mask & (1u64 << cap) != 0)
}

/// What `/dev/kvm` is here: `none`; `pvm` (the `kvm_pvm` module, software
/// nested virtualization: runsc's KVM platform and stock guest kernels hang
/// under it; it shows in /sys/module even on a kernel without /proc/modules);
/// `hardware` (vmx/svm in the CPU flags); `unknown`. Only `hardware` is used
/// (the gVisor tier's platform, the microvm tier's accelerator).
pub fn kvm_kind() -> &'static str {
    let pvm = std::path::Path::new("/sys/module/kvm_pvm").exists()
        || std::fs::read_to_string("/proc/modules").is_ok_and(|m| m.lines().any(|l| l.starts_with("kvm_pvm ")));
    let hw = std::fs::read_to_string("/proc/cpuinfo")
        .is_ok_and(|c| c.lines().any(|l| l.starts_with("flags") && (l.contains(" vmx") || l.contains(" svm"))));
    match (std::path::Path::new("/dev/kvm").exists(), pvm, hw) {
        (false, _, _) => "none",
        (true, true, _) => "pvm",
        (true, false, true) => "hardware",
        (true, false, false) => "unknown",
    }
}

/// An executable by name: on PATH, then in the usual system directories.
pub fn find_tool(name: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .filter(|d| !d.is_empty())
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"])
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file());
    found
}

/// Why per-sandbox disks (an ext4 image on a loop device per sandbox) cannot
/// be made on this host; `None` when they can.
pub fn disk_unavailable() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("not root (loop devices and mounts need root)".into());
    }
    if !read("/proc/filesystems").lines().any(|l| l.trim_end().ends_with("ext4")) {
        return Some("the kernel has no ext4".into());
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("no loop device support (/dev/loop-control missing)".into());
    }
    if find_tool("mkfs.ext4").is_none() {
        return Some("mkfs.ext4 not found (install e2fsprogs; scripts/setup-host.sh does)".into());
    }
    if find_tool("mount").is_none() {
        return Some("mount not found (install mount/util-linux)".into());
    }
    None
}

/// Probes the host.
pub fn doctor() -> DoctorReport {
    let mut f = Vec::new();
    let kernel = read("/proc/sys/kernel/osrelease").trim().to_string();
    for ns in ["user", "pid", "mnt", "uts", "ipc", "net", "cgroup"] {
        let ok = Path::new(&format!("/proc/self/ns/{ns}")).exists();
        f.push(check(&format!("{ns}_namespace"), ok, if ok { "present" } else { "missing" }, "the namespace tier"));
    }
    let root = nix::unistd::geteuid().is_root();
    f.push(check(
        "root",
        root,
        if root { "running as root" } else { "not root" },
        "the namespace tier (needs root to create namespaces, mounts and cgroups)",
    ));
    let cg = cgroup::detect(Path::new(crate::namespace::CGROUP_ROOT));
    let cg_version = match &cg {
        Ok(v) => {
            let hybrid = *v == cgroup::CgroupVersion::V1 && Path::new("/sys/fs/cgroup/unified").exists();
            if hybrid {
                "hybrid".to_string()
            } else {
                v.as_str().to_string()
            }
        }
        Err(_) => "none".to_string(),
    };
    f.push(check("cgroups", cg.is_ok(), format!("cgroup {cg_version}"), "resource limits and OOM reporting"));
    let freezer = Path::new("/sys/fs/cgroup/freezer").exists()
        || Path::new("/sys/fs/cgroup/cgroup.freeze").exists()
        || cg.as_ref().is_ok_and(|v| *v == cgroup::CgroupVersion::V2);
    f.push(check(
        "cgroup_freezer",
        freezer,
        if freezer { "present" } else { "missing" },
        "pause/unpause and consistent checkpoints",
    ));
    let fs = read("/proc/filesystems");
    let overlay = fs.lines().any(|l| l.trim_end().ends_with("overlay"));
    f.push(check(
        "overlayfs",
        overlay,
        if overlay { "in /proc/filesystems" } else { "not in /proc/filesystems (modprobe overlay)" },
        "the namespace tier's copy-on-write root",
    ));
    let seccomp = read("/proc/self/status").lines().any(|l| l.starts_with("Seccomp:"));
    f.push(check(
        "seccomp",
        seccomp,
        if seccomp { "filter mode available" } else { "kernel without CONFIG_SECCOMP" },
        "the syscall filter",
    ));
    let lsm = read("/sys/kernel/security/lsm");
    let landlock = lsm.split(',').any(|m| m.trim() == "landlock");
    f.push(check(
        "landlock",
        landlock,
        if landlock { format!("active LSMs: {}", lsm.trim()) } else { "not an active LSM".into() },
        "optional landlock path rules",
    ));
    let sys_resource = capability_in_effective_set(24);
    f.push(check(
        "cap_sys_resource",
        sys_resource,
        if sys_resource { "present" } else { "absent: hard rlimits are never raised" },
        "raising hard rlimits (strata never needs to)",
    ));
    let (plain, userns) = (crate::namespace::lazy::unsupported(false), crate::namespace::lazy::unsupported(true));
    let lazy_detail = match (&plain, &userns) {
        (None, None) => "on for every sandbox".to_string(),
        (None, Some(why)) => format!("only for sandboxes without a user namespace: {why}"),
        (Some(why), _) => why.clone(),
    };
    f.push(check(
        "lazy_restore",
        plain.is_none() && userns.is_none(),
        lazy_detail,
        "resume from standby before every page is back (userfaultfd); otherwise eagerly",
    ));
    let criu = Command::new("criu")
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    let criu_v = criu.as_deref().and_then(parse_criu_version);
    let criu_ok = criu_v.is_some_and(|(maj, _)| maj >= 4);
    let criu_detail = match criu_v {
        Some((a, b)) if criu_ok => format!("criu {a}.{b}"),
        Some((a, b)) => format!("criu {a}.{b} is too old (need >= 4; run scripts/setup-host.sh)"),
        None => "criu not found (run scripts/setup-host.sh)".to_string(),
    };
    f.push(check(
        "criu",
        criu_ok,
        criu_detail,
        "standby with running processes (process checkpoint/restore); standby degrades to --fs-only",
    ));
    let disk = disk_unavailable();
    f.push(check(
        "disk_quota",
        disk.is_none(),
        disk.clone()
            .unwrap_or_else(|| "per-sandbox ext4 filesystem on a loop device (mkfs.ext4, /dev/loop-control)".into()),
        "per-sandbox disk limits (sandboxes are created without one and record disk_quota: unavailable)",
    ));
    let nft = Command::new("nft").arg("--version").output().is_ok_and(|o| o.status.success());
    f.push(check("nftables", nft, if nft { "nft present" } else { "nft not found" }, "host-enforced egress rules"));
    let vm = crate::microvm::probe();
    f.push(check(
        "kvm",
        vm.kvm == "hardware",
        format!("/dev/kvm: {}", vm.kvm),
        "hardware-accelerated microVMs (TCG emulation still works, slowly)",
    ));
    f.push(check(
        "qemu",
        vm.qemu.is_some(),
        vm.qemu.clone().unwrap_or_else(|| "qemu-system-x86_64 not found".into()),
        "the microvm tier",
    ));

    let userns = userns_unavailable();
    f.push(check(
        "userns",
        userns.is_none(),
        userns.clone().unwrap_or_else(|| "user namespaces with idmapped overlay layers".into()),
        "user namespaces for namespace-tier sandboxes (--userns)",
    ));

    let ns_ok =
        root && overlay && cg.is_ok() && f.iter().filter(|c| c.name.ends_with("_namespace")).all(|c| c.available);
    let gv = crate::gvisor::probe();
    let tiers = vec![
        TierReport {
            name: "namespace".into(),
            available: ns_ok,
            detail: if ns_ok {
                format!("namespaces, overlayfs, cgroup {cg_version}")
            } else {
                "missing: see features".into()
            },
            capabilities: namespace_capabilities(ns_ok, &f),
        },
        TierReport {
            name: "gvisor".into(),
            available: gv.unavailable().is_none(),
            detail: gv.detail(),
            capabilities: gvisor_capabilities(&gv, &f),
        },
        TierReport {
            name: "microvm".into(),
            available: vm.unavailable().is_none(),
            detail: vm.detail(),
            capabilities: microvm_capabilities(&vm, &f),
        },
    ];
    DoctorReport { kernel, cgroup_version: cg_version, features: f, tiers, names_like_ids: Vec::new() }
}

/// The capabilities `strata doctor` reports for each tier, in its order.
pub const TIER_CAPABILITIES: [&str; 12] = [
    "create",
    "exec",
    "files",
    "egress",
    "limits",
    "disk_quota",
    "checkpoint",
    "fork",
    "standby",
    "warm_checkpoint",
    "pty",
    "userns",
];

/// The file system holding the state directory `dir`: an ext4 without a
/// journal is reported, because its inode allocator skips inodes freed in the
/// last 60 s (360 s while their inode table block is dirty), so creating many
/// files right after removing many nearby (a checkpoint of a large tree after a
/// `gc` or a deleted checkpoint) runs several times slower for minutes
/// (measured here: the same 60000-file checkpoint 3 s, and 17 s right after a removal).
pub fn state_fs(dir: &Path) -> FeatureCheck {
    let name = "state_fs";
    let disables = "steady checkpoint times for large trees (see the detail)";
    let (fs, meta) = match (nix::sys::statfs::statfs(dir), std::fs::metadata(dir)) {
        (Ok(fs), Ok(meta)) => (fs, meta),
        (Err(e), _) => return check(name, false, format!("{}: {e}", dir.display()), disables),
        (_, Err(e)) => return check(name, false, format!("{}: {e}", dir.display()), disables),
    };
    if fs.filesystem_type() != nix::sys::statfs::EXT4_SUPER_MAGIC {
        return check(
            name,
            true,
            format!("{}: not ext4 (f_type {:#x})", dir.display(), fs.filesystem_type().0),
            disables,
        );
    }
    use std::os::unix::fs::MetadataExt;
    let dev = meta.dev();
    let uevent = read(&format!("/sys/dev/block/{}:{}/uevent", nix::sys::stat::major(dev), nix::sys::stat::minor(dev)));
    let Some(devname) = uevent.lines().find_map(|l| l.strip_prefix("DEVNAME=")) else {
        return check(name, true, format!("{}: ext4 on an unnamed device", dir.display()), disables);
    };
    let journaled = std::fs::read_dir("/proc/fs/jbd2").is_ok_and(|entries| {
        entries.flatten().any(|e| e.file_name().to_string_lossy().starts_with(&format!("{devname}-")))
    });
    if journaled {
        check(name, true, format!("{}: ext4 on {devname}, with a journal", dir.display()), disables)
    } else {
        check(
            name,
            false,
            format!(
                "{}: ext4 on {devname} without a journal: it skips inodes freed in the last minutes, so creating many \
                 files right after removing many (a checkpoint of a large tree after a gc) is several times slower",
                dir.display()
            ),
            disables,
        )
    }
}

/// Why sandboxes of the namespace tier cannot run in a user namespace of
/// their own here (`None`: they can). Their layers are idmapped detached
/// mounts given to overlayfs as layers, which Linux accepts from 6.15 on.
pub fn userns_unavailable() -> Option<String> {
    let release = read("/proc/sys/kernel/osrelease");
    let mut it = release.trim().split(|c: char| !c.is_ascii_digit());
    let version = (it.next().and_then(|v| v.parse::<u32>().ok()), it.next().and_then(|v| v.parse::<u32>().ok()));
    match version {
        (Some(major), Some(minor)) if (major, minor) >= (6, 15) => {}
        _ => {
            return Some(format!(
                "Linux {} cannot use idmapped detached mounts as overlay layers (needs >= 6.15)",
                release.trim()
            ))
        }
    }
    if read("/proc/sys/user/max_user_namespaces").trim() == "0" {
        return Some("user namespaces are disabled (user.max_user_namespaces = 0)".into());
    }
    None
}

/// The namespace tier's capabilities on this host, from the features probed.
fn namespace_capabilities(tier_ok: bool, features: &[FeatureCheck]) -> Vec<TierCapability> {
    let feature = |name: &str| features.iter().find(|c| c.name == name);
    let needs = |name: &str| match feature(name) {
        Some(c) if c.available => (true, c.detail.clone()),
        Some(c) => (false, format!("{name}: {}", c.detail)),
        None => (false, format!("{name}: not probed")),
    };
    TIER_CAPABILITIES
        .iter()
        .map(|&cap| {
            let (available, detail) = if !tier_ok {
                (false, "the tier is not available (see its detail)".to_string())
            } else {
                match cap {
                    "create" | "exec" | "files" => (true, "with the tier".to_string()),
                    "pty" => (true, "a terminal of the sandbox's own devpts; the shim holds its master (kept through standby and warm forks by CRIU)".to_string()),
                    "checkpoint" | "fork" => (true, "from the overlay's writable layer".to_string()),
                    "egress" => needs("nftables"),
                    "limits" => needs("cgroups"),
                    "disk_quota" => needs("disk_quota"),
                    "standby" | "warm_checkpoint" => needs("criu"),
                    "userns" => match needs("userns") {
                        (true, _) => (true, "root maps to an unprivileged host range of its own (idmapped layers); standby and warm checkpoints keep the processes (see docs/security.md)".to_string()),
                        no => no,
                    },
                    _ => (false, "unknown capability".to_string()),
                }
            };
            TierCapability { name: cap.to_string(), available, detail }
        })
        .collect()
}

/// The gVisor tier's capabilities on this host.
fn gvisor_capabilities(gv: &crate::gvisor::GvisorProbe, features: &[FeatureCheck]) -> Vec<TierCapability> {
    if let Some(why) = gv.unavailable() {
        return unavailable_capabilities(&why);
    }
    let cgroups = features.iter().find(|c| c.name == "cgroups");
    let disk = features.iter().find(|c| c.name == "disk_quota");
    TIER_CAPABILITIES
        .iter()
        .map(|&cap| {
            let (available, detail) = match cap {
                "create" | "exec" | "files" => (true, format!("runsc, platform {}", gv.platform)),
                "checkpoint" | "fork" => (true, "from the overlay's writable layer (runsc --overlay2=none)".into()),
                "limits" => match cgroups {
                    Some(c) if c.available => (true, "memory and cpu in the cgroup, processes as RLIMIT_NPROC".into()),
                    Some(c) => (false, format!("cgroups: {}", c.detail)),
                    None => (false, "cgroups: not probed".into()),
                },
                "disk_quota" => match disk {
                    Some(c) if c.available => (true, "the writable layer and /tmp on the sandbox's disk".into()),
                    Some(c) => (false, format!("disk_quota: {}", c.detail)),
                    None => (false, "disk_quota: not probed".into()),
                },
                "egress" => match features.iter().find(|c| c.name == "nftables") {
                    Some(c) if c.available => {
                        (true, "runsc --network=sandbox on strata's veth and nftables (#10704 masked)".into())
                    }
                    Some(c) => (false, format!("nftables: {}", c.detail)),
                    None => (false, "nftables: not probed".into()),
                },
                "standby" => (true, "runsc checkpoint/restore of the whole sentry; processes reattached".into()),
                "warm_checkpoint" => (true, "runsc checkpoint --leave-running; each fork is a runsc restore".into()),
                "pty" => (true, "a terminal of the sentry's devpts; pid 1 holds its master (kept through standby and warm forks)".into()),
                "userns" => (false, "not a setting of this tier: its boundary is the gVisor sentry (a user-space kernel between the sandbox and the host)".into()),
                _ => (false, "unknown capability".into()),
            };
            TierCapability { name: cap.to_string(), available, detail }
        })
        .collect()
}

/// The microvm tier's capabilities on this host (what this build does on it).
fn microvm_capabilities(vm: &crate::microvm::MicrovmProbe, features: &[FeatureCheck]) -> Vec<TierCapability> {
    if let Some(why) = vm.unavailable() {
        return unavailable_capabilities(&why);
    }
    let accel = vm.accel().as_str();
    let not_yet = |what: &str| (false, format!("not in this build: {what}"));
    TIER_CAPABILITIES
        .iter()
        .map(|&cap| {
            let (available, detail) = match cap {
                "create" | "exec" => (true, format!("a guest kernel per sandbox (QEMU microvm, {accel})")),
                "pty" => (true, "a terminal of the guest's devpts; its pid 1 holds the master".into()),
                "limits" => match features.iter().find(|c| c.name == "cgroups") {
                    Some(c) if c.available => {
                        (true, "guest RAM and vCPUs; QEMU in a cgroup; processes limited inside the guest".into())
                    }
                    Some(c) => (false, format!("cgroups: {}", c.detail)),
                    None => (false, "cgroups: not probed".into()),
                },
                "disk_quota" => (true, "the guest's own ext4 disk of the limit's size".into()),
                "files" => not_yet("the file API does not reach the guest's disk"),
                "egress" => not_yet("guests have no network device (--network none only)"),
                "checkpoint" | "fork" => (
                    true,
                    "the guest's disk, read by the host while the guest has it frozen (FIFREEZE) or stopped".into(),
                ),
                "standby" => (
                    true,
                    "the VM's memory and devices saved to a file (QMP migrate); the guest's disk frozen meanwhile"
                        .into(),
                ),
                "warm_checkpoint" => not_yet("forks from a VM memory snapshot"),
                "userns" => (false, "not a setting of this tier: its boundary is the guest kernel".into()),
                _ => (false, "unknown capability".into()),
            };
            TierCapability { name: cap.to_string(), available, detail }
        })
        .collect()
}

/// Every capability of a tier that cannot run here, with `why`.
fn unavailable_capabilities(why: &str) -> Vec<TierCapability> {
    TIER_CAPABILITIES
        .iter()
        .map(|&cap| TierCapability { name: cap.to_string(), available: false, detail: why.to_string() })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_fs_names_what_it_found() {
        let proc = state_fs(Path::new("/proc"));
        assert!(proc.available && proc.detail.contains("not ext4"), "{proc:?}");
        let missing = state_fs(Path::new("/nonexistent/strata-state"));
        assert!(!missing.available && missing.detail.starts_with("/nonexistent/strata-state:"), "{missing:?}");
    }

    #[test]
    fn parses_criu_versions() {
        assert_eq!(parse_criu_version("Version: 4.1.1\n"), Some((4, 1)));
        assert_eq!(parse_criu_version("Version: 3.17\nGitID: v3.17\n"), Some((3, 17)));
        assert_eq!(parse_criu_version("nonsense"), None);
    }

    #[test]
    fn doctor_reports_every_feature_once() {
        let r = doctor();
        let mut names: Vec<_> = r.features.iter().map(|f| f.name.clone()).collect();
        let n = names.len();
        names.dedup();
        assert_eq!(n, names.len());
        assert!(
            r.features.iter().all(|f| f.available || !f.disables.is_empty()),
            "a missing feature says what it disables"
        );
        let names: Vec<&str> = r.tiers.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["namespace", "gvisor", "microvm"]);
        for t in &r.tiers {
            let caps: Vec<&str> = t.capabilities.iter().map(|c| c.name.as_str()).collect();
            assert_eq!(caps, TIER_CAPABILITIES, "{}: every capability, in order", t.name);
            assert!(t.available || t.capabilities.iter().all(|c| !c.available), "{}", t.name);
            assert!(t.capabilities.iter().all(|c| !c.detail.is_empty()), "{}: each cell says why", t.name);
        }
    }
}
