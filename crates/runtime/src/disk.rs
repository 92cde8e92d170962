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
//! of every sandbox again ([`DiskPool::ensure`] is idempotent); destroy and archive
//! unmount it and delete the image ([`DiskPool::release`]). Loop devices and
//! mounts go through the pool's [`Sys`], so these sequences are unit-tested
//! with [`crate::sys::RecordingSys`].
//!
//! Making a disk is kept off the create path: `mkfs.ext4` runs once per size
//! (a *template* image under `disk-pool/`, with lazy inode tables and no resize
//! inode, so a fresh 10 GiB filesystem allocates about 0.2 MiB); each disk is a
//! sparse copy of its template (only the allocated extents are copied), attached
//! to a loop device and mounted in-process (`LOOP_CONFIGURE` + `mount(2)`, no
//! `mount` process). The [`DiskPool`] keeps a few disks of the default size
//! ready and mounted, so a create or fork child adopts one with a rename and a
//! bind mount. All images made from one template share its filesystem UUID
//! (ext4 allows that; nothing in strata identifies filesystems by UUID).
//!
//! Why not project quotas (what Docker's overlay2 `size=` uses on xfs/ext4
//! pquota): they need a host filesystem with the project feature mounted with
//! prjquota, and kernel support (CONFIG_QFMT_V2 for ext4, CONFIG_XFS_QUOTA for
//! xfs) that not every host has (the CI kernel has neither); an image per
//! sandbox needs only ext4 and loop devices, and moves with the sandbox.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags};
use tracing::{debug, warn};

use crate::sys::{LinuxSys, Sys};

/// The image file in a sandbox's directory.
pub const IMAGE: &str = "disk.img";
/// Its mount point in a sandbox's directory.
pub const MOUNT: &str = "disk";
/// The smallest disk a sandbox may ask for (ext4 with its journal needs a few MiB).
pub const MIN_BYTES: u64 = 16 << 20;
/// How many disks of the default size the pool keeps ready (`--disk-pool`).
pub const DEFAULT_POOL: usize = 8;

/// `mkfs.ext4` options of every template: no reserved blocks (root would get
/// past the limit), a 4 MiB journal, no resize inode (its reserved GDT blocks
/// are most of a fresh filesystem's allocated bytes; strata never grows a
/// disk online), large flex groups, a root-owned root directory, and lazy
/// inode tables and journal (the image is a fresh sparse file: its holes read
/// as zeros already, so nothing needs zeroing; `noinit_itable` at mount keeps
/// the kernel from zeroing them later).
pub(crate) const MKFS_ARGS: [&str; 14] = [
    "-q",
    "-F",
    "-m",
    "0",
    "-J",
    "size=4",
    "-O",
    "^resize_inode",
    "-G",
    "1024",
    "-E",
    "root_owner=0:0,lazy_itable_init=1,lazy_journal_init=1,nodiscard",
    "-L",
    "strata-disk",
];
/// Part of a template's file name: a change to [`MKFS_ARGS`] bumps it, so old templates are not reused.
const TEMPLATE_VERSION: u32 = 2;
/// Mount options of every disk (with MS_NOSUID | MS_NODEV | MS_NOATIME).
const MOUNT_DATA: &str = "noinit_itable";

/// The overlay upper directory of the sandbox whose directory is `dir`.
pub fn upper_dir(dir: &Path) -> PathBuf {
    if dir.join(IMAGE).exists() {
        dir.join(MOUNT).join("upper")
    } else {
        dir.join("upper")
    }
}

/// The overlay work directory of the sandbox whose directory is `dir`.
pub fn work_dir(dir: &Path) -> PathBuf {
    if dir.join(IMAGE).exists() {
        dir.join(MOUNT).join("work")
    } else {
        dir.join("work")
    }
}

fn find_tool(name: &str) -> Option<PathBuf> {
    crate::probe::find_tool(name)
}

/// Why per-sandbox disks cannot be made on this host (`None` when they can).
pub fn unavailable() -> Option<String> {
    static WHY: OnceLock<Option<String>> = OnceLock::new();
    WHY.get_or_init(|| {
        // Failpoint `disk-unavailable`: behave as on a host without loop devices (tests).
        if crate::failpoint("disk-unavailable").is_err() {
            return Some("disabled by the disk-unavailable failpoint".into());
        }
        crate::probe::disk_unavailable()
    })
    .clone()
}

/// What is recorded on a sandbox asking for `bytes`.
pub fn describe(bytes: Option<u64>) -> String {
    match (bytes, unavailable()) {
        (None, _) => "none".into(),
        (Some(_), Some(why)) => format!("unavailable ({why})"),
        (Some(b), None) => {
            format!("enforced (ext4 filesystem of {} on a loop device)", strata_core::units::format_size(b))
        }
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

/// Makes sure the disk of the sandbox in `dir` exists (taking one from `pool`,
/// or making one of `bytes`, when it does not) and is mounted, with `upper/`
/// and `work/` in it.
fn ensure(dir: &Path, bytes: u64, pool: &DiskPool) -> Result<(), String> {
    let image = dir.join(IMAGE);
    let mount = dir.join(MOUNT);
    std::fs::create_dir_all(&mount).map_err(|e| format!("{}: {e}", mount.display()))?;
    if !image.exists() {
        // A sandbox that already has a writable layer outside a disk keeps it.
        if std::fs::read_dir(dir.join("upper")).is_ok_and(|mut d| d.next().is_some()) {
            return Err("the sandbox already has a writable layer outside a disk".into());
        }
        for d in ["upper", "work"] {
            let _ = std::fs::remove_dir(dir.join(d));
        }
        if let Some(entry) = pool.take(bytes) {
            match adopt(pool.sys.as_ref(), &entry, dir) {
                Ok(()) => return Ok(()),
                Err(e) => warn!(entry = %entry.display(), error = %e, "adopting a pooled disk"),
            }
        }
        if !image.exists() {
            let staging = dir.join(format!("{IMAGE}.tmp"));
            let _ = std::fs::remove_file(&staging);
            let template = pool.template(bytes)?;
            sparse_copy(&template, &staging)
                .map_err(|e| format!("copying {} to {}: {e}", template.display(), staging.display()))?;
            std::fs::rename(&staging, &image).map_err(|e| format!("{}: {e}", image.display()))?;
        }
    }
    if !is_mounted(&mount) {
        mount_image(pool.sys.as_ref(), &image, &mount)?;
    }
    prepare_layer_dirs(&mount)
}

/// `upper/` and `work/` on a mounted disk (and no `lost+found`, which would show in the sandbox's root).
fn prepare_layer_dirs(mount: &Path) -> Result<(), String> {
    for d in ["upper", "work"] {
        let p = mount.join(d);
        if !p.is_dir() {
            std::fs::create_dir(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        }
    }
    let _ = std::fs::remove_dir(mount.join("lost+found"));
    Ok(())
}

/// Moves a pooled disk (`entry/disk.img`, mounted at `entry/disk`) into the
/// sandbox directory `dir`: the image is renamed, the mounted filesystem is
/// bind-mounted at `dir/disk` and its pool mount point detached.
fn adopt(sys: &dyn Sys, entry: &Path, dir: &Path) -> Result<(), String> {
    let image = dir.join(IMAGE);
    let mount = dir.join(MOUNT);
    std::fs::rename(entry.join(IMAGE), &image).map_err(|e| format!("{}: {e}", image.display()))?;
    let bound = sys.mount(Some(&entry.join(MOUNT)), &mount, None, MsFlags::MS_BIND, None);
    let _ = sys.umount2(&entry.join(MOUNT), MntFlags::MNT_DETACH);
    let _ = std::fs::remove_dir_all(entry);
    // Without the bind, the image is still a complete disk: `ensure` mounts it.
    bound.map_err(|e| format!("bind mount of {}: {e}", mount.display()))
}

/// Copies `[start, end)` of `src` into `dst` at the same offsets, leaving
/// out pages that are all zeros (they stay holes); the bytes written.
fn copy_range(src: &File, dst: &File, start: u64, end: u64) -> std::io::Result<u64> {
    use std::os::unix::fs::FileExt;
    const PAGE: usize = 4096;
    let mut buf = vec![0u8; 1 << 20];
    let (mut at, mut written) = (start, 0u64);
    while at < end {
        let want = buf.len().min((end - at) as usize);
        let n = src.read_at(&mut buf[..want], at)?;
        if n == 0 {
            break;
        }
        for (i, page) in buf[..n].chunks(PAGE).enumerate() {
            if page.iter().any(|b| *b != 0) {
                dst.write_all_at(page, at + (i * PAGE) as u64)?;
                written += page.len() as u64;
            }
        }
        at += n as u64;
    }
    Ok(written)
}

/// Copies the file `from` to a new file `to` (mode 0600) with the same
/// holes: a reflink where the file system shares extents (`FICLONE`), else
/// only the extents that hold data (`SEEK_DATA`/`SEEK_HOLE`, copied with
/// `copy_file_range`), so a sparse disk or a guest's RAM of which little was
/// touched costs what it holds. Synced before it returns; `to` is removed on
/// failure. Returns the bytes of data copied.
pub fn sparse_copy(from: &Path, to: &Path) -> std::io::Result<u64> {
    use nix::unistd::{lseek, Whence};
    use std::os::fd::AsFd;
    use std::os::unix::fs::OpenOptionsExt;
    let src = File::open(from)?;
    let len = src.metadata()?.len();
    let dst = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(to)?;
    let copy = || -> std::io::Result<u64> {
        // SAFETY: FICLONE takes the source descriptor as its argument; both are ours.
        if unsafe { libc::ioctl(dst.as_raw_fd(), libc::FICLONE, src.as_raw_fd()) } == 0 {
            dst.sync_all()?;
            return Ok(len);
        }
        dst.set_len(len)?;
        let mut copied = 0u64;
        let mut at: i64 = 0;
        while (at as u64) < len {
            let data = match lseek(src.as_raw_fd(), at, Whence::SeekData) {
                Ok(o) => o,
                Err(nix::errno::Errno::ENXIO) => break, // only a hole is left
                Err(e) => return Err(e.into()),
            };
            let end = lseek(src.as_raw_fd(), data, Whence::SeekHole)?;
            let (mut off_in, mut off_out) = (data, data);
            while off_in < end {
                let want = (end - off_in) as usize;
                match nix::fcntl::copy_file_range(src.as_fd(), Some(&mut off_in), dst.as_fd(), Some(&mut off_out), want)
                {
                    Ok(0) => return Err(std::io::Error::other(format!("{} ended at {off_in}", from.display()))),
                    Ok(n) => copied += n as u64,
                    // Across file systems (a memfd to a disk): read and write, pages of zeros left out.
                    Err(nix::errno::Errno::EXDEV | nix::errno::Errno::EINVAL | nix::errno::Errno::EOPNOTSUPP) => {
                        copied += copy_range(&src, &dst, off_in as u64, end as u64)?;
                        off_in = end;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            at = end;
        }
        dst.sync_all()?;
        Ok(copied)
    };
    copy().inspect_err(|_| {
        let _ = std::fs::remove_file(to);
    })
}

/// Formats a template image of `bytes` at `path` (staged, then renamed into place).
fn make_template(path: &Path, bytes: u64) -> Result<(), String> {
    let staging = path.with_extension(format!("tmp-{}", strata_core::ids::new_id()));
    let res = (|| {
        let f = File::create(&staging).map_err(|e| format!("{}: {e}", staging.display()))?;
        f.set_len(bytes).map_err(|e| format!("sizing {}: {e}", staging.display()))?;
        drop(f);
        let mkfs = find_tool("mkfs.ext4").ok_or("mkfs.ext4 not found")?;
        run(Command::new(mkfs).args(MKFS_ARGS).arg(&staging))?;
        File::open(&staging).and_then(|f| f.sync_all()).map_err(|e| format!("{}: {e}", staging.display()))?;
        std::fs::rename(&staging, path).map_err(|e| format!("{}: {e}", path.display()))
    })();
    if res.is_err() {
        let _ = std::fs::remove_file(&staging);
    }
    res
}

/// Attaches `image` to a free loop device and mounts its ext4 at `mount`. The
/// loop device clears itself when the filesystem is unmounted.
fn mount_image(sys: &dyn Sys, image: &Path, mount: &Path) -> Result<(), String> {
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOATIME;
    match sys.loop_attach(image) {
        Ok((device, loop_fd)) => {
            let res = sys
                .mount(Some(&device), mount, Some("ext4"), flags, Some(MOUNT_DATA))
                .map_err(|e| format!("mount {} ({}) at {}: {e}", image.display(), device.display(), mount.display()));
            // Closing our descriptor leaves the device to the mount (or, when the mount failed, clears it).
            drop(loop_fd);
            res
        }
        // Kernels before 5.8 lack LOOP_CONFIGURE: util-linux's mount sets the device up.
        Err(e @ (Errno::EINVAL | Errno::ENOTTY)) => {
            debug!(error = %e, "LOOP_CONFIGURE unavailable; using mount -o loop");
            run(Command::new("mount")
                .args(["-t", "ext4", "-o"])
                .arg(format!("loop,nosuid,nodev,noatime,{MOUNT_DATA}"))
                .arg(image)
                .arg(mount))
        }
        Err(e) => Err(format!("loop device for {}: {e}", image.display())),
    }
}

/// Hands the disk of the sandbox in `dir` to a microVM for good: its host
/// mount (if any) is synced and unmounted, so that the guest is the only
/// writer, and the host never mounts it again (its blocks are the guest's to
/// write; the host reads the layer only as the guest writes it out).
///
/// A reader on the host (the daemon's accounting walks every writable layer)
/// can hold the mount for a moment: the unmount is tried again for up to
/// [`LEND_PATIENCE`], then the mount is detached (lazily unmounted: gone from
/// the tree at once, its last reader's descriptors keep the old view). Only
/// readers can be left holding it: the daemon writes a sandbox's layer only
/// while that sandbox is not running.
pub fn lend_to_guest(dir: &Path) -> Result<(), String> {
    let mount = dir.join(MOUNT);
    if !is_mounted(&mount) {
        return Ok(());
    }
    if let Ok(f) = File::open(&mount) {
        // SAFETY: syncfs on a descriptor we own.
        unsafe { libc::syncfs(f.as_raw_fd()) };
    }
    let deadline = std::time::Instant::now() + LEND_PATIENCE;
    loop {
        match LinuxSys.umount2(&mount, MntFlags::empty()) {
            Ok(()) => return Ok(()),
            Err(Errno::EBUSY) if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Err(Errno::EBUSY) => {
                warn!(mount = %mount.display(), "the disk is still read on the host; detaching its mount");
                return LinuxSys
                    .umount2(&mount, MntFlags::MNT_DETACH)
                    .map_err(|e| format!("detach {} from the host: {e}", mount.display()));
            }
            Err(e) => return Err(format!("unmount {} from the host: {e}", mount.display())),
        }
    }
}

/// How long [`lend_to_guest`] waits for the host's readers of a disk.
const LEND_PATIENCE: Duration = Duration::from_secs(2);

/// Unmounts the disk of the sandbox in `dir` (lazily: a sandbox still holding
/// its overlay keeps the filesystem alive until it exits) and deletes its image.
fn release(sys: &dyn Sys, dir: &Path) {
    let mount = dir.join(MOUNT);
    if is_mounted(&mount) {
        if let Err(e) = sys.umount2(&mount, MntFlags::MNT_DETACH) {
            warn!(dir = %dir.display(), error = %e, "unmounting a sandbox disk");
            return;
        }
    }
    let _ = std::fs::remove_dir(&mount);
    let _ = std::fs::remove_file(dir.join(IMAGE));
    let _ = std::fs::remove_file(dir.join(format!("{IMAGE}.tmp")));
}

/// Disks made ahead of need: per size a template image, and for the default
/// size a few ready disks (`disk-pool/<entry>/disk.img`, mounted at
/// `disk-pool/<entry>/disk` with `upper/` and `work/`), refilled in the
/// background by [`DiskPool::start`].
pub struct DiskPool {
    dir: PathBuf,
    /// The size the ready disks have (the daemon's `--default-disk`).
    bytes: Option<u64>,
    /// How many ready disks to keep.
    target: usize,
    ready: Mutex<Vec<PathBuf>>,
    /// Serializes template creation (one `mkfs.ext4` per size).
    templates: Mutex<()>,
    /// Wakes the refill thread when a disk was taken.
    wake: std::sync::Condvar,
    /// Set by [`DiskPool::drain`]: the refill thread makes no more disks.
    stopped: std::sync::atomic::AtomicBool,
    /// Where the loop devices and mounts are made.
    sys: Arc<dyn Sys>,
}

impl DiskPool {
    /// A pool under `<state>/disk-pool` keeping `target` disks of `bytes` ready
    /// (none when `bytes` is `None`, `target` is 0 or the host cannot make disks).
    pub fn new(state_dir: &Path, bytes: Option<u64>, target: usize) -> DiskPool {
        let target = if bytes.is_some() && unavailable().is_none() { target } else { 0 };
        DiskPool::with_sys(state_dir, bytes, target, Arc::new(LinuxSys))
    }

    /// [`DiskPool::new`] making its privileged calls through `sys` (a
    /// [`crate::sys::RecordingSys`] in tests), keeping `target` disks ready.
    pub fn with_sys(state_dir: &Path, bytes: Option<u64>, target: usize, sys: Arc<dyn Sys>) -> DiskPool {
        DiskPool {
            dir: state_dir.join("disk-pool"),
            bytes,
            target,
            ready: Mutex::new(Vec::new()),
            templates: Mutex::new(()),
            wake: std::sync::Condvar::new(),
            stopped: Default::default(),
            sys,
        }
    }

    /// Makes sure the disk of the sandbox in `dir` exists (adopting a ready
    /// one, or making one of `bytes`) and is mounted, with `upper/` and
    /// `work/` in it. Idempotent: a daemon (re)start calls it for every sandbox.
    pub fn ensure(&self, dir: &Path, bytes: u64) -> Result<(), String> {
        ensure(dir, bytes, self)
    }

    /// Unmounts the disk of the sandbox in `dir` (lazily) and deletes its image.
    pub fn release(&self, dir: &Path) {
        release(self.sys.as_ref(), dir)
    }

    /// A pool that keeps nothing ready (templates still go under `<state>/disk-pool`).
    pub fn disabled(state_dir: &Path) -> DiskPool {
        DiskPool::new(state_dir, None, 0)
    }

    fn ready(&self) -> std::sync::MutexGuard<'_, Vec<PathBuf>> {
        self.ready.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many ready disks the pool holds now.
    pub fn len(&self) -> usize {
        self.ready().len()
    }

    /// Whether the pool holds no ready disk.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The template image of `bytes`, made on first use.
    pub fn template(&self, bytes: u64) -> Result<PathBuf, String> {
        let path = self.dir.join(format!("template-v{TEMPLATE_VERSION}-{bytes}.img"));
        if path.is_file() {
            return Ok(path);
        }
        let _g = self.templates.lock().unwrap_or_else(|p| p.into_inner());
        if !path.is_file() {
            std::fs::create_dir_all(&self.dir).map_err(|e| format!("{}: {e}", self.dir.display()))?;
            make_template(&path, bytes)?;
        }
        Ok(path)
    }

    /// A ready disk of `bytes`, if the pool has one (the refill task is woken).
    fn take(&self, bytes: u64) -> Option<PathBuf> {
        if self.bytes != Some(bytes) {
            return None;
        }
        let entry = self.ready().pop();
        self.wake.notify_one();
        entry
    }

    /// Makes one ready disk.
    fn make_entry(&self, bytes: u64) -> Result<PathBuf, String> {
        let template = self.template(bytes)?;
        let entry = self.dir.join(format!("ready-{}", strata_core::ids::new_id()));
        let mount = entry.join(MOUNT);
        let res = (|| {
            std::fs::create_dir_all(&mount).map_err(|e| format!("{}: {e}", mount.display()))?;
            sparse_copy(&template, &entry.join(IMAGE))
                .map_err(|e| format!("copying {} to {}: {e}", template.display(), entry.display()))?;
            mount_image(self.sys.as_ref(), &entry.join(IMAGE), &mount)?;
            prepare_layer_dirs(&mount)
        })();
        match res {
            Ok(()) => Ok(entry),
            Err(e) => {
                remove_entry(self.sys.as_ref(), &entry);
                Err(e)
            }
        }
    }

    /// Removes what an earlier daemon left in the pool (ready disks, staged
    /// templates); templates are kept. Runs before any sandbox disk is mounted.
    pub fn sweep(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("ready-") {
                remove_entry(self.sys.as_ref(), &e.path());
            } else if name.contains(".tmp-") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }

    /// Unmounts and deletes every ready disk and stops refilling (at daemon shutdown).
    pub fn drain(&self) {
        self.stopped.store(true, std::sync::atomic::Ordering::SeqCst);
        for entry in std::mem::take(&mut *self.ready()) {
            remove_entry(self.sys.as_ref(), &entry);
        }
    }

    fn stopped(&self) -> bool {
        self.stopped.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Keeps the pool full, on a thread of its own at the lowest CPU priority
    /// (nice 19), so that refilling never competes with the requests that
    /// take disks: one disk at a time, woken when one is taken.
    pub fn start(self: std::sync::Arc<Self>) {
        let Some(bytes) = self.bytes else { return };
        if self.target == 0 {
            return;
        }
        let spawned = std::thread::Builder::new().name("disk-pool".into()).spawn(move || {
            // SAFETY: setpriority on the calling thread (tid 0 = caller) with a constant.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 19) };
            while !self.stopped() {
                while self.len() < self.target && !self.stopped() {
                    match self.make_entry(bytes) {
                        Ok(entry) if self.stopped() => remove_entry(self.sys.as_ref(), &entry),
                        Ok(entry) => self.ready().push(entry),
                        Err(e) => {
                            warn!(error = %e, "making a disk for the pool; retrying in 10 s");
                            std::thread::sleep(Duration::from_secs(10));
                        }
                    }
                }
                let guard = self.ready();
                if guard.len() >= self.target {
                    let _unused = self.wake.wait(guard);
                }
            }
        });
        if let Err(e) = spawned {
            warn!(error = %e, "starting the disk pool thread; disks are made on demand");
        }
    }
}

/// Unmounts (lazily) and deletes one pool entry.
fn remove_entry(sys: &dyn Sys, entry: &Path) {
    let mount = entry.join(MOUNT);
    if is_mounted(&mount) {
        let _ = sys.umount2(&mount, MntFlags::MNT_DETACH);
    }
    let _ = std::fs::remove_dir_all(entry);
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

    #[test]
    fn sparse_copy_keeps_data_and_holes() {
        use std::io::{Seek, SeekFrom, Write};
        let d = tempfile::tempdir().unwrap();
        let (src, dst) = (d.path().join("src"), d.path().join("dst"));
        let mut f = File::create(&src).unwrap();
        f.set_len(64 << 20).unwrap();
        f.write_all(b"head").unwrap();
        f.seek(SeekFrom::Start(40 << 20)).unwrap();
        f.write_all(&[7u8; 8192]).unwrap();
        drop(f);
        sparse_copy(&src, &dst).unwrap();
        let (a, b) = (std::fs::read(&src).unwrap(), std::fs::read(&dst).unwrap());
        assert_eq!(a.len(), b.len());
        assert!(a == b, "contents differ");
        // Only the written extents take space (a few blocks, not 64 MiB).
        assert!(std::fs::metadata(&dst).unwrap().blocks() * 512 < 1 << 20);
        assert!(sparse_copy(&src, &dst).is_err(), "an existing destination is never overwritten");
    }

    #[test]
    fn sparse_copy_across_file_systems_leaves_pages_of_zeros_out() {
        use std::io::{Seek, SeekFrom, Write};
        use std::os::fd::FromRawFd;
        // A memfd (a guest's RAM) to a file: copy_file_range cannot cross file systems.
        // SAFETY: the name is a NUL-terminated literal; the descriptor becomes the File's.
        let mut ram = unsafe { File::from_raw_fd(libc::memfd_create(c"test-ram".as_ptr(), libc::MFD_CLOEXEC)) };
        ram.set_len(16 << 20).unwrap();
        ram.write_all(&[1u8; 4096]).unwrap();
        // A touched page of zeros (the guest's kernel zeroes pages it hands out).
        ram.seek(SeekFrom::Start(8 << 20)).unwrap();
        ram.write_all(&[0u8; 4096]).unwrap();
        ram.write_all(&[9u8; 100]).unwrap();
        let d = tempfile::tempdir().unwrap();
        let dst = d.path().join("ram");
        let src = format!("/proc/self/fd/{}", ram.as_raw_fd());
        let written = sparse_copy(Path::new(&src), &dst).unwrap();
        assert_eq!(written, 2 * 4096, "the two pages with data, not the page of zeros");
        let mut want = vec![0u8; 16 << 20];
        want[..4096].fill(1);
        want[(8 << 20) + 4096..(8 << 20) + 4196].fill(9);
        assert!(std::fs::read(&dst).unwrap() == want, "contents differ");
        assert!(std::fs::metadata(&dst).unwrap().blocks() * 512 <= 64 << 10);
    }

    /// `mkfs.ext4` is needed to make a template (no privilege: it formats a
    /// file); without it the test says it is skipped, and why.
    fn mkfs() -> bool {
        let found = find_tool("mkfs.ext4").is_some();
        if !found {
            eprintln!("skipped: mkfs.ext4 not found (e2fsprogs)");
        }
        found
    }

    fn recording_pool(state: &Path) -> (Arc<crate::sys::RecordingSys>, DiskPool) {
        let sys = Arc::new(crate::sys::RecordingSys::new());
        let pool = DiskPool::with_sys(state, Some(MIN_BYTES), 0, sys.clone());
        (sys, pool)
    }

    #[test]
    fn a_new_disk_is_a_copy_of_its_template_on_a_loop_device_mounted_nosuid_nodev() {
        if !mkfs() {
            return;
        }
        let state = tempfile::tempdir().unwrap();
        let dir = state.path().join("sb");
        let (sys, pool) = recording_pool(state.path());
        pool.ensure(&dir, MIN_BYTES).expect("ensure");
        let calls: Vec<String> = sys.calls().iter().map(|c| c.describe(&dir)).collect();
        assert_eq!(
            calls,
            ["loop_attach $ROOT/disk.img", "mount /dev/loop0 $ROOT/disk ext4 NOATIME|NODEV|NOSUID noinit_itable"]
        );
        let image = std::fs::metadata(dir.join(IMAGE)).unwrap();
        assert_eq!(image.len(), MIN_BYTES, "the image has the disk's size");
        assert!(image.blocks() * 512 < MIN_BYTES / 2, "and is sparse");
        assert!(upper_dir(&dir).is_dir() && work_dir(&dir).is_dir());

        // Idempotent on the image; a daemon restart mounts it again (nothing is mounted in the fake).
        sys.clear();
        pool.ensure(&dir, MIN_BYTES).expect("ensure again");
        assert_eq!(sys.names(), ["loop_attach", "mount"]);
        // Release: not mounted here, so no unmount; the image goes.
        sys.clear();
        pool.release(&dir);
        assert!(sys.calls().is_empty() && !dir.join(IMAGE).exists());
    }

    #[test]
    fn a_ready_disk_is_adopted_with_a_bind_mount_and_its_pool_mount_detached() {
        let state = tempfile::tempdir().unwrap();
        let dir = state.path().join("sb");
        let (sys, pool) = recording_pool(state.path());
        let entry = state.path().join("disk-pool/ready-1");
        std::fs::create_dir_all(entry.join(MOUNT)).unwrap();
        std::fs::write(entry.join(IMAGE), b"ext4").unwrap();
        pool.ready().push(entry.clone());
        pool.ensure(&dir, MIN_BYTES).expect("adopt");
        let root = state.path();
        let calls: Vec<String> = sys.calls().iter().map(|c| c.describe(root)).collect();
        assert_eq!(
            calls[..2],
            [
                "mount $ROOT/disk-pool/ready-1/disk $ROOT/sb/disk - BIND -",
                "umount2 $ROOT/disk-pool/ready-1/disk DETACH"
            ]
        );
        assert_eq!(std::fs::read(dir.join(IMAGE)).unwrap(), b"ext4", "the image moved into the sandbox");
        assert!(!entry.exists(), "the pool entry is gone");
        assert!(pool.is_empty());
    }

    #[test]
    fn a_failed_mount_says_which_image_device_and_mount_point() {
        if !mkfs() {
            return;
        }
        let state = tempfile::tempdir().unwrap();
        let dir = state.path().join("sb");
        let (sys, pool) = recording_pool(state.path());
        sys.fail_when(|c| c.name() == "mount", Errno::EPERM);
        let err = pool.ensure(&dir, MIN_BYTES).unwrap_err();
        assert!(err.contains("disk.img (/dev/loop0) at") && err.contains("EPERM"), "{err}");
        sys.fail_when(|c| c.name() == "loop_attach", Errno::ENXIO);
        let err = pool.ensure(&dir, MIN_BYTES).unwrap_err();
        assert!(err.starts_with("loop device for") && err.contains("ENXIO"), "{err}");
    }
}
