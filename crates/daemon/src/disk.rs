//! Per-sandbox disk limit: the writable layer (overlay upper and work
//! directories) of a sandbox lives on a filesystem of its own, an ext4 image
//! of `disk_bytes` (sparse: it takes host disk only as it is written) on a loop
//! device, mounted at `sandboxes/<id>/disk` (nosuid, nodev). A sandbox that
//! fills it gets ENOSPC at its limit; the host filesystem and other sandboxes
//! are not affected. The size of a filesystem is a hard limit for everyone
//! (reserved blocks are 0), including writers holding CAP_SYS_RESOURCE, which
//! would bypass an ext4 project quota.
//!
//! Layout of `sandboxes/<id>/` with a disk: `disk.img` (the image), `disk/`
//! (its mount point) holding `upper/` and `work/`. Without one (limit `none`,
//! or the host cannot: see [`unavailable`]), `upper/` and `work/` sit directly
//! in `sandboxes/<id>/` as before. [`upper_dir`] and [`work_dir`] answer for both.
//!
//! The image stays mounted while the sandbox exists (running, stopped, standby:
//! checkpoints, diffs and file transfer read the upper directory, and a CRIU
//! restore re-mounts the overlay on it); a daemon (re)start mounts the images
//! of every sandbox again ([`ensure`] is idempotent); destroy and archive
//! unmount it and delete the image ([`release`]).
//!
//! Why not project quotas (what Docker's overlay2 `size=` uses on xfs/ext4
//! pquota): they need a host filesystem with the project feature mounted with
//! prjquota, and kernel support (CONFIG_QFMT_V2 for ext4, CONFIG_XFS_QUOTA for
//! xfs) that not every host has (the CI kernel has neither); an image per
//! sandbox needs only ext4 and loop devices, and moves with the sandbox.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The image file in a sandbox's directory.
pub const IMAGE: &str = "disk.img";
/// Its mount point in a sandbox's directory.
pub const MOUNT: &str = "disk";
/// The smallest disk a sandbox may ask for (ext4 with its journal needs a few MiB).
pub const MIN_BYTES: u64 = 16 << 20;

/// The overlay upper directory of the sandbox whose directory is `dir`.
pub fn upper_dir(dir: &Path) -> PathBuf {
    if dir.join(IMAGE).exists() { dir.join(MOUNT).join("upper") } else { dir.join("upper") }
}

/// The overlay work directory of the sandbox whose directory is `dir`.
pub fn work_dir(dir: &Path) -> PathBuf {
    if dir.join(IMAGE).exists() { dir.join(MOUNT).join("work") } else { dir.join("work") }
}

fn find_tool(name: &str) -> Option<PathBuf> {
    strata_runtime::probe::find_tool(name)
}

/// Why per-sandbox disks cannot be made on this host (`None` when they can).
pub fn unavailable() -> Option<String> {
    static WHY: OnceLock<Option<String>> = OnceLock::new();
    WHY.get_or_init(|| {
        // Failpoint `disk-unavailable`: behave as on a host without loop devices (tests).
        if crate::failpoint("disk-unavailable").is_err() {
            return Some("disabled by the disk-unavailable failpoint".into());
        }
        strata_runtime::probe::disk_unavailable()
    })
    .clone()
}

/// What is recorded on a sandbox asking for `bytes`.
pub fn describe(bytes: Option<u64>) -> String {
    match (bytes, unavailable()) {
        (None, _) => "none".into(),
        (Some(_), Some(why)) => format!("unavailable ({why})"),
        (Some(b), None) => format!("enforced (ext4 filesystem of {} on a loop device)", strata_core::units::format_size(b)),
    }
}

/// Whether the recorded status says the disk is enforced.
pub fn enforced(status: Option<&str>) -> bool {
    status.is_some_and(|s| s.starts_with("enforced"))
}

fn is_mounted(mount: &Path) -> bool {
    match (std::fs::metadata(mount), mount.parent().map(std::fs::metadata)) {
        (Ok(m), Some(Ok(p))) => m.dev() != p.dev(),
        _ => false,
    }
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// Makes sure the disk of the sandbox in `dir` exists (making it of `bytes`
/// when it does not) and is mounted, with `upper/` and `work/` in it.
pub fn ensure(dir: &Path, bytes: u64) -> Result<(), String> {
    let image = dir.join(IMAGE);
    let mount = dir.join(MOUNT);
    std::fs::create_dir_all(&mount).map_err(|e| format!("{}: {e}", mount.display()))?;
    if !image.exists() {
        // A sandbox that already has a writable layer outside a disk keeps it.
        if std::fs::read_dir(dir.join("upper")).is_ok_and(|mut d| d.next().is_some()) {
            return Err("the sandbox already has a writable layer outside a disk".into());
        }
        let staging = dir.join(format!("{IMAGE}.tmp"));
        let f = std::fs::File::create(&staging).map_err(|e| format!("{}: {e}", staging.display()))?;
        f.set_len(bytes).map_err(|e| format!("sizing {}: {e}", staging.display()))?;
        drop(f);
        let mkfs = find_tool("mkfs.ext4").ok_or("mkfs.ext4 not found")?;
        // No reserved blocks (root would get past the limit), a small journal,
        // root-owned root directory; discarding a fresh sparse file is free and
        // lets mke2fs skip zeroing the inode tables.
        run(Command::new(mkfs).args(["-q", "-F", "-m", "0", "-J", "size=4", "-E", "root_owner=0:0", "-L", "strata-disk"]).arg(&staging))?;
        std::fs::rename(&staging, &image).map_err(|e| format!("{}: {e}", image.display()))?;
        for d in ["upper", "work"] {
            let _ = std::fs::remove_dir(dir.join(d));
        }
    }
    if !is_mounted(&mount) {
        run(Command::new("mount").args(["-t", "ext4", "-o", "loop,nosuid,nodev,noatime"]).arg(&image).arg(&mount))?;
    }
    for d in ["upper", "work"] {
        let p = mount.join(d);
        if !p.is_dir() {
            std::fs::create_dir(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        }
    }
    let _ = std::fs::remove_dir(mount.join("lost+found"));
    Ok(())
}

/// Unmounts the disk of the sandbox in `dir` (lazily: a sandbox still holding
/// its overlay keeps the filesystem alive until it exits) and deletes its image.
pub fn release(dir: &Path) {
    let mount = dir.join(MOUNT);
    if is_mounted(&mount) {
        if let Err(e) = nix::mount::umount2(&mount, nix::mount::MntFlags::MNT_DETACH) {
            tracing::warn!(dir = %dir.display(), error = %e, "unmounting a sandbox disk");
            return;
        }
    }
    let _ = std::fs::remove_dir(&mount);
    let _ = std::fs::remove_file(dir.join(IMAGE));
    let _ = std::fs::remove_file(dir.join(format!("{IMAGE}.tmp")));
}

/// Unmounts the disk of the sandbox in `dir` without deleting it.
pub fn unmount(dir: &Path) {
    let mount = dir.join(MOUNT);
    if is_mounted(&mount) {
        let _ = nix::mount::umount2(&mount, nix::mount::MntFlags::MNT_DETACH);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_follows_the_image() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(upper_dir(d.path()), d.path().join("upper"));
        std::fs::write(d.path().join(IMAGE), b"").unwrap();
        assert_eq!(upper_dir(d.path()), d.path().join("disk/upper"));
        assert_eq!(work_dir(d.path()), d.path().join("disk/work"));
        assert!(enforced(Some("enforced (x)")) && !enforced(Some("unavailable (y)")) && !enforced(None));
    }
}
