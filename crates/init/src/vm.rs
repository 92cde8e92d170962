//! The microvm tier's guest side: strata-init as the guest kernel's first
//! process (`/init` of the initramfs the host builds, run as `/init _vminit`).
//!
//! Boot ([`boot_main`]):
//! 1. `/dev` (devtmpfs), `/proc`, `/sys`; the modules the host put in the
//!    initramfs are loaded in the order of `/lib/modules/order`
//!    (`finit_module`: virtio transports, block, console, overlay ...).
//! 2. The root: the disk labelled [`LOWER_LABEL`] is the image's layer chain
//!    as one read-only ext4 (shared by every sandbox of that chain), the one
//!    labelled [`DISK_LABEL`] the sandbox's own ext4 disk, whose `upper/` is
//!    the writable layer: overlayfs joins them inside the guest. The host
//!    never mounts that disk (its blocks are the guest's to write: a crafted
//!    file system would meet the host kernel's ext4 driver); pid 1 writes the
//!    layer out on request ([`crate::layer`], [`crate::spawner::Request::LayerTar`]),
//!    and the host takes it as untrusted input.
//! 3. The overlay becomes `/` (the initramfs stays underneath, unreachable);
//!    `/proc`, `/sys`, `/dev` move along; `/run` (tmpfs, with the sandbox's
//!    identity under `/run/strata`), `/dev/pts`, `/dev/shm`, `lo` up, the
//!    hostname; the sandbox's processes go into a cgroup of their own with
//!    its pids limit.
//! 4. The line ([`crate::mux`]): the virtio-serial port named
//!    [`PORT_NAME`]. The host sends the channel token first; pid 1 then
//!    serves exec connections ([`crate::spawner`]) that a thread of its own
//!    makes out of the streams the host opens, and tells the host it is
//!    ready.
//!
//! Stop: the host's [`crate::mux::Kind::Stop`] is a SIGTERM to pid 1 (every
//! process gets SIGTERM, the rest SIGKILL after the grace); then pid 1 syncs
//! and restarts the machine, which QEMU (`-no-reboot`) takes as its exit.
//! The settings come from the kernel command line (`strata.hostname=`,
//! `strata.id=`, `strata.machine_id=`, `strata.generation=`, `strata.pids=`,
//! `strata.grace=`): nothing secret travels there.

use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::mount::{mount, MsFlags};

use crate::mux::{self, Event, Kind, Mux};

/// The name of the virtio-serial port the host talks on.
pub const PORT_NAME: &str = "strata.agent";

/// How long the guest waits for its disks and its port to appear.
const DEVICE_PATIENCE: Duration = Duration::from_secs(20);

/// The guest's settings, from the kernel command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GuestConfig {
    /// Hostname.
    pub hostname: String,
    /// Sandbox id.
    pub id: String,
    /// Machine id (32 hex characters).
    pub machine_id: String,
    /// Fork generation.
    pub generation: u32,
    /// Process limit (`None`: none).
    pub pids: Option<u64>,
    /// Seconds between SIGTERM and SIGKILL when the sandbox stops.
    pub grace: u64,
    /// The sandbox's link (egress): the guest's address on it and its
    /// gateway, which is also the DNS server (strata's filter).
    pub net: Option<GuestNet>,
}

/// A guest's end of the sandbox's link (`strata.net=ADDRESS/PREFIX,GATEWAY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GuestNet {
    /// The guest's address.
    pub address: std::net::Ipv4Addr,
    /// Its prefix length.
    pub prefix: u8,
    /// The gateway (the host's end of the link).
    pub gateway: std::net::Ipv4Addr,
}

impl GuestNet {
    fn parse(v: &str) -> Option<GuestNet> {
        let (cidr, gateway) = v.split_once(',')?;
        let (address, prefix) = cidr.split_once('/')?;
        let prefix: u8 = prefix.parse().ok().filter(|p| *p <= 32)?;
        Some(GuestNet { address: address.parse().ok()?, prefix, gateway: gateway.parse().ok()? })
    }
}

/// The name the guest kernel gives the virtio-net device.
pub const GUEST_IFNAME: &str = "eth0";

impl GuestConfig {
    /// Reads `strata.*` settings out of a kernel command line.
    pub fn parse(cmdline: &str) -> GuestConfig {
        let mut c = GuestConfig { grace: 10, hostname: "sandbox".into(), ..Default::default() };
        for word in cmdline.split_ascii_whitespace() {
            let Some((k, v)) = word.strip_prefix("strata.").and_then(|w| w.split_once('=')) else { continue };
            match k {
                "hostname" => c.hostname = v.to_string(),
                "id" => c.id = v.to_string(),
                "machine_id" => c.machine_id = v.to_string(),
                "generation" => c.generation = v.parse().unwrap_or(0),
                "pids" => c.pids = v.parse().ok(),
                "grace" => c.grace = v.parse().unwrap_or(10),
                "net" => c.net = GuestNet::parse(v),
                _ => {}
            }
        }
        c
    }

    /// The command-line words that carry this configuration.
    pub fn to_cmdline(&self) -> Vec<String> {
        let mut w = vec![
            format!("strata.hostname={}", self.hostname),
            format!("strata.id={}", self.id),
            format!("strata.machine_id={}", self.machine_id),
            format!("strata.generation={}", self.generation),
            format!("strata.grace={}", self.grace),
        ];
        if let Some(p) = self.pids {
            w.push(format!("strata.pids={p}"));
        }
        if let Some(n) = self.net {
            w.push(format!("strata.net={}/{},{}", n.address, n.prefix, n.gateway));
        }
        w
    }
}

/// A boot step failed: said on the console (the host keeps its tail), then
/// the machine stops.
fn fatal(step: &str, e: impl std::fmt::Display) -> ! {
    eprintln!("strata-init: {step}: {e}");
    power_off()
}

/// Syncs the disks and restarts the machine (QEMU runs with `-no-reboot`,
/// so this ends it).
pub fn power_off() -> ! {
    // SAFETY: sync and reboot take no pointers.
    unsafe {
        libc::sync();
        libc::reboot(libc::RB_AUTOBOOT);
    }
    std::process::exit(1)
}

fn mount_fs(src: &str, target: &str, fstype: &str, flags: MsFlags, data: Option<&str>) {
    let _ = std::fs::create_dir_all(target);
    if let Err(e) = mount(Some(src), target, Some(fstype), flags, data) {
        fatal(&format!("mount {fstype} on {target}"), e);
    }
}

/// Loads the kernel modules the initramfs carries, in their order.
fn load_modules(dir: &Path) {
    let Ok(order) = std::fs::read_to_string(dir.join("order")) else { return };
    for name in order.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let path = dir.join(name);
        let f = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) => fatal(&format!("open module {}", path.display()), e),
        };
        // SAFETY: finit_module takes a descriptor we own and a NUL-terminated empty string.
        let r = unsafe { libc::syscall(libc::SYS_finit_module, f.as_raw_fd(), c"".as_ptr(), 0) };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EEXIST) {
                fatal(&format!("load module {name}"), e);
            }
        }
    }
}

/// The device of the virtio-serial port named [`PORT_NAME`].
fn find_port() -> std::path::PathBuf {
    let t = Instant::now();
    loop {
        if let Ok(rd) = std::fs::read_dir("/sys/class/virtio-ports") {
            for e in rd.flatten() {
                let name = std::fs::read_to_string(e.path().join("name")).unwrap_or_default();
                if name.trim() == PORT_NAME {
                    let dev = Path::new("/dev").join(e.file_name());
                    if dev.exists() {
                        return dev;
                    }
                }
            }
        }
        if t.elapsed() > DEVICE_PATIENCE {
            fatal("finding the host's port", format!("no virtio port named {PORT_NAME}"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The label of the ext4 file system on `dev` (`None`: not ext4).
fn ext4_label(dev: &Path) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(dev).ok()?;
    let mut sb = [0u8; 136];
    f.seek(SeekFrom::Start(1024)).ok()?;
    f.read_exact(&mut sb).ok()?;
    if u16::from_le_bytes([sb[0x38], sb[0x39]]) != 0xEF53 {
        return None;
    }
    let name = &sb[0x78..0x88];
    let end = name.iter().position(|b| *b == 0).unwrap_or(name.len());
    Some(String::from_utf8_lossy(&name[..end]).into_owned())
}

/// The virtio disk whose ext4 label is `label` (the order the kernel finds
/// microvm's devices in is not the command line's).
fn find_disk(label: &str) -> std::path::PathBuf {
    let t = Instant::now();
    loop {
        let disks = std::fs::read_dir("/sys/block").into_iter().flatten().flatten();
        for e in disks {
            let name = e.file_name().to_string_lossy().into_owned();
            let dev = Path::new("/dev").join(&name);
            if name.starts_with("vd") && ext4_label(&dev).as_deref() == Some(label) {
                return dev;
            }
        }
        if t.elapsed() > DEVICE_PATIENCE {
            fatal("finding the disks", format!("no virtio disk labelled {label}"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The label of the image of the sandbox's layer chain (the host's `mkfs.ext4 -L`).
pub const LOWER_LABEL: &str = "strata-lower";
/// The directory of the lower image that holds the chain's tree.
pub const LOWER_TREE: &str = "fs";
/// The label of the sandbox's own disk.
pub const DISK_LABEL: &str = "strata-disk";

/// The sandbox's disk's file system (its mount in the initramfs, out of the
/// new root's reach), held for [`freeze_disk`].
static DISK: std::sync::OnceLock<std::fs::File> = std::sync::OnceLock::new();

/// FIFREEZE / FITHAW (`_IOWR('X', 119, int)`, `_IOWR('X', 120, int)`).
const FIFREEZE: libc::c_ulong = 0xC004_5877;
const FITHAW: libc::c_ulong = 0xC004_5878;

/// Freezes the sandbox's disk (everything written is on the device, writers
/// wait) or thaws it; freezing a frozen disk, or thawing a thawed one, is done.
fn freeze_disk(frozen: bool) -> std::io::Result<()> {
    let disk = DISK.get().ok_or_else(|| std::io::Error::other("the disk is not mounted"))?;
    let op = if frozen { FIFREEZE } else { FITHAW };
    // SAFETY: an ioctl on a descriptor we own, with an int argument it does not keep.
    let r = unsafe { libc::ioctl(disk.as_raw_fd(), op as _, 0) };
    match r {
        0 => Ok(()),
        _ => match std::io::Error::last_os_error() {
            // EBUSY: already frozen; EINVAL: not frozen (a thaw twice).
            e if matches!(e.raw_os_error(), Some(libc::EBUSY) if frozen) => Ok(()),
            e if matches!(e.raw_os_error(), Some(libc::EINVAL) if !frozen) => Ok(()),
            e => Err(e),
        },
    }
}

/// Opens the writable layer (`upper/` on the sandbox's disk, out of the
/// sandbox's reach) for [`crate::layer`]: the host reads a microVM's layer
/// only as pid 1 writes it out, never by mounting the disk.
fn open_layer() -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let disk = DISK.get().ok_or_else(|| std::io::Error::other("the disk is not mounted"))?;
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: openat with a directory descriptor we own and a NUL-terminated name.
    let fd = unsafe { libc::openat(disk.as_raw_fd(), c"upper".as_ptr(), flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: openat returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The home directory of `user` (name or uid) in `/etc/passwd` (a regular
/// file of at most 1 MiB), as the host's flush reads it on the other tiers.
fn home_of(user: Option<&str>) -> String {
    use std::io::Read;
    let mut passwd = String::new();
    if std::fs::symlink_metadata("/etc/passwd").is_ok_and(|m| m.is_file()) {
        if let Ok(f) = std::fs::File::open("/etc/passwd") {
            let _ = f.take(1 << 20).read_to_string(&mut passwd);
        }
    }
    crate::user::flush_home(&passwd, user)
}

/// Wipes flush paths in the sandbox's root (pid 1's): a file is removed, a
/// directory emptied (kept), a symlink left alone; one line per path, worded
/// as the host's flush on the other tiers.
fn flush(paths: &[String], user: Option<&str>) -> Vec<String> {
    let home = home_of(user);
    paths
        .iter()
        .map(|p| {
            let path = match p.strip_prefix("~/") {
                Some(rest) => format!("{}/{rest}", home.trim_end_matches('/')),
                None => p.clone(),
            };
            let meta = match std::fs::symlink_metadata(&path) {
                Ok(m) => m,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return format!("{path}: absent"),
                Err(e) => return format!("{path}: {e}"),
            };
            if meta.file_type().is_symlink() {
                return format!("{path}: skipped, a symlink (not followed)");
            }
            if !meta.is_dir() {
                return match std::fs::remove_file(&path) {
                    Ok(()) => format!("{path}: removed (a file)"),
                    Err(e) => format!("{path}: {e}"),
                };
            }
            let (mut removed, mut failed) = (0u64, None);
            for entry in std::fs::read_dir(&path).into_iter().flatten().flatten() {
                // remove_dir_all does not follow symlinks.
                let gone = match entry.file_type() {
                    Ok(t) if t.is_dir() => std::fs::remove_dir_all(entry.path()),
                    _ => std::fs::remove_file(entry.path()),
                };
                match gone {
                    Ok(()) => removed += 1,
                    Err(e) => failed = Some(format!("{}: {e}", entry.path().display())),
                }
            }
            match failed {
                None => format!("{path}: {removed} entries removed"),
                Some(e) => format!("{path}: {removed} entries removed, then {e}"),
            }
        })
        .collect()
}

/// Where the secrets are (a tmpfs in the guest's RAM).
const SECRETS_DIR: &str = "/run/secrets";

/// [`crate::spawner::Request::Secrets`]: a tmpfs at `/run/secrets` (mode
/// 0500, owned by `owner`, the files 0400, read-only once filled), as the
/// other tiers mount it. Once per boot.
fn secrets(files: &[crate::spawner::Secret], owner: Option<&str>) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    for s in files {
        let clean = s.name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !clean || s.name.as_bytes().first().is_none_or(|b| b.is_ascii_digit()) {
            return Err(std::io::Error::other(format!("invalid secret name {:?}", s.name)));
        }
    }
    let dir = Path::new(SECRETS_DIR);
    if std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some()) {
        return Err(std::io::Error::other("the secrets are in place already"));
    }
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let group = std::fs::read_to_string("/etc/group").unwrap_or_default();
    let (uid, gid) = match owner.filter(|o| !o.is_empty()).map(|o| crate::user::resolve(Some(o), &passwd, &group)) {
        Some(Ok(u)) => (u.uid, u.gid),
        _ => (0, 0),
    };
    std::fs::create_dir_all(dir)?;
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let bytes: usize = files.iter().map(|s| s.data.len().div_ceil(4096) * 4096 + 4096).sum::<usize>() + 4096;
    let opts = format!("mode=0500,uid={uid},gid={gid},size={bytes},nr_inodes={}", files.len() + 16);
    mount(Some("tmpfs"), dir, Some("tmpfs"), flags, Some(opts.as_str()))?;
    for s in files {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o400)
            .custom_flags(libc::O_NOFOLLOW)
            .open(dir.join(&s.name))?;
        f.write_all(&s.data)?;
        nix::unistd::fchown(
            f.as_raw_fd(),
            Some(nix::unistd::Uid::from_raw(uid)),
            Some(nix::unistd::Gid::from_raw(gid)),
        )?;
    }
    mount(None::<&str>, dir, None::<&str>, flags | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY, None::<&str>)?;
    Ok(())
}

/// Makes the overlay of the two disks the root and moves into it.
fn switch_root() {
    let ro = MsFlags::MS_RDONLY | MsFlags::MS_NOATIME;
    let (lower, disk) = (find_disk(LOWER_LABEL), find_disk(DISK_LABEL));
    mount_fs(&lower.to_string_lossy(), "/lower", "ext4", ro, Some("noload"));
    mount_fs(&disk.to_string_lossy(), "/disk", "ext4", MsFlags::MS_NOATIME, None);
    match std::fs::File::open("/disk") {
        Ok(f) => {
            let _ = DISK.set(f);
        }
        Err(e) => fatal("open /disk", e),
    }
    for d in ["/disk/upper", "/disk/work"] {
        if let Err(e) = std::fs::create_dir_all(d) {
            fatal(&format!("mkdir {d}"), e);
        }
    }
    // The chain's tree is a directory of its image (see the host's disks.rs).
    let opts = format!("lowerdir=/lower/{LOWER_TREE},upperdir=/disk/upper,workdir=/disk/work");
    mount_fs("overlay", "/newroot", "overlay", MsFlags::empty(), Some(&opts));
    for d in ["/dev", "/proc", "/sys"] {
        let target = format!("/newroot{d}");
        let _ = std::fs::create_dir_all(&target);
        if let Err(e) = mount(Some(d), target.as_str(), None::<&str>, MsFlags::MS_MOVE, None::<&str>) {
            fatal(&format!("move {d}"), e);
        }
    }
    if let Err(e) = std::env::set_current_dir("/newroot") {
        fatal("chdir /newroot", e);
    }
    if let Err(e) = mount(Some("."), "/", None::<&str>, MsFlags::MS_MOVE, None::<&str>) {
        fatal("move the root", e);
    }
    if let Err(e) = nix::unistd::chroot(".") {
        fatal("chroot", e);
    }
    let _ = std::env::set_current_dir("/");
}

/// `/run`, the identity files, `/dev/pts`, `/dev/shm`, the hostname.
fn set_up_root(cfg: &GuestConfig) {
    let nosuid = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    mount_fs("tmpfs", "/run", "tmpfs", nosuid, Some("mode=755"));
    mount_fs("devpts", "/dev/pts", "devpts", MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC, Some("mode=620,ptmxmode=666"));
    mount_fs("tmpfs", "/dev/shm", "tmpfs", nosuid, Some("mode=1777"));
    let _ = std::fs::create_dir_all("/tmp");
    let run = Path::new(RUN_STRATA);
    let _ = std::fs::create_dir_all(run);
    if let Err(e) = write_identity(&cfg.hostname, &cfg.id, &cfg.machine_id, cfg.generation) {
        fatal("write /run/strata", e);
    }
    // Over the image's files, as on the other tiers (a missing one is made empty as
    // the mount point: identity paths are left out of checkpoints and diffs).
    if Path::new("/etc").is_dir() {
        for name in ["hostname", "hosts", "machine-id"] {
            let target = Path::new("/etc").join(name);
            if !target.exists() {
                let _ = std::fs::write(&target, b"");
            }
            let src = run.join(name);
            let _ = mount(Some(&src), &target, None::<&str>, MsFlags::MS_BIND, None::<&str>);
        }
    }
    let _ = nix::unistd::sethostname(&cfg.hostname);
    if let Err(e) = crate::loopback::up() {
        eprintln!("strata-init: lo: {e}");
    }
    if let Some(net) = cfg.net {
        set_up_network(net);
    }
    workload_cgroup(cfg.pids);
    read_only_kernel_files();
}

/// Where the guest keeps the sandbox's identity (a tmpfs, bound over `/etc`'s files).
const RUN_STRATA: &str = "/run/strata";

/// Writes the identity files under [`RUN_STRATA`] (in place: the mounts
/// over `/etc/hostname`, `/etc/hosts` and `/etc/machine-id` show them).
fn write_identity(hostname: &str, id: &str, machine_id: &str, generation: u32) -> std::io::Result<()> {
    let run = Path::new(RUN_STRATA);
    let hosts = format!("127.0.0.1\tlocalhost\n::1\tlocalhost\n127.0.1.1\t{hostname}\n");
    let files = [
        ("sandbox-id", format!("{id}\n")),
        ("generation", format!("{generation}\n")),
        ("hostname", format!("{hostname}\n")),
        ("hosts", hosts),
        ("machine-id", format!("{machine_id}\n")),
    ];
    for (name, content) in &files {
        std::fs::write(run.join(name), content)
            .map_err(|e| std::io::Error::new(e.kind(), format!("write {RUN_STRATA}/{name}: {e}")))?;
    }
    Ok(())
}

/// The `/dev/urandom` ioctls (linux/random.h): add entropy with a credit,
/// and reseed the generator now.
const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
const RNDRESEEDCRNG: libc::c_ulong = 0x5207;

/// After a restore from a snapshot, with the sandbox's processes frozen:
/// mixes the host's `entropy` into the kernel's pool and reseeds its
/// generator (every copy of one snapshot starts with the same generator
/// state), then, for a copy, takes `identity`: the files under
/// [`RUN_STRATA`], the hostname, and its own address on its link.
fn restored(entropy: &[u8], identity: Option<&crate::spawner::Identity>) -> std::io::Result<()> {
    if entropy.len() < 32 {
        return Err(std::io::Error::other(format!("{} bytes of entropy from the host (at least 32)", entropy.len())));
    }
    let urandom = std::fs::OpenOptions::new().write(true).open("/dev/urandom")?;
    // struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
    let mut info = Vec::with_capacity(8 + entropy.len());
    info.extend_from_slice(&((entropy.len() * 8) as i32).to_ne_bytes());
    info.extend_from_slice(&(entropy.len() as i32).to_ne_bytes());
    info.extend_from_slice(entropy);
    // SAFETY: the ioctl reads a rand_pool_info of the size its header says, which `info` holds.
    if unsafe { libc::ioctl(urandom.as_raw_fd(), RNDADDENTROPY, info.as_ptr()) } != 0 {
        return Err(std::io::Error::other(format!("add the host's entropy: {}", std::io::Error::last_os_error())));
    }
    // SAFETY: an ioctl without an argument on a descriptor we own.
    if unsafe { libc::ioctl(urandom.as_raw_fd(), RNDRESEEDCRNG) } != 0 {
        return Err(std::io::Error::other(format!("reseed the generator: {}", std::io::Error::last_os_error())));
    }
    let Some(who) = identity else { return Ok(()) };
    write_identity(&who.hostname, &who.id, &who.machine_id, who.generation)?;
    nix::unistd::sethostname(&who.hostname)?;
    if let Some(net) = who.net {
        // The copy's own address on its own link (the saved one was its source's).
        crate::netif::set_ipv4(GUEST_IFNAME, net.address, net.prefix)?;
        crate::netif::default_route(net.gateway)?;
        std::fs::write(Path::new(RUN_STRATA).join("resolv.conf"), resolv_conf(net.gateway))?;
    }
    Ok(())
}

/// `/etc/resolv.conf` of a guest whose DNS server is `gateway` (strata's filter).
fn resolv_conf(gateway: std::net::Ipv4Addr) -> String {
    format!("# written by strata: DNS goes through strata's filter (see docs/network.md)\nnameserver {gateway}\noptions ndots:1\n")
}

/// The cgroup of the sandbox's processes (in the guest's cgroup2 hierarchy):
/// every process pid 1 starts, and pid 1 itself except while they are frozen
/// ([`freeze_workload`]).
const WORKLOAD_CGROUP: &str = "sandbox";

/// The sandbox's link: the guest's address and default route on its
/// virtio-net device, and strata's DNS filter (the gateway) over
/// `/etc/resolv.conf`, as the other tiers mount it.
fn set_up_network(net: GuestNet) {
    if !crate::netif::wait_for(GUEST_IFNAME, DEVICE_PATIENCE) {
        fatal("the network", format!("no {GUEST_IFNAME} (the virtio-net device)"));
    }
    if let Err(e) = crate::netif::set_ipv4(GUEST_IFNAME, net.address, net.prefix) {
        fatal(&format!("address {}/{} on {GUEST_IFNAME}", net.address, net.prefix), e);
    }
    if let Err(e) = crate::netif::default_route(net.gateway) {
        fatal(&format!("default route via {}", net.gateway), e);
    }
    let src = Path::new("/run/strata/resolv.conf");
    if let Err(e) = std::fs::write(src, resolv_conf(net.gateway)) {
        fatal("write /run/strata/resolv.conf", e);
    }
    if Path::new("/etc").is_dir() {
        let target = Path::new("/etc/resolv.conf");
        // A symlink (e.g. to systemd's stub) is replaced by the mount point, as on the other tiers.
        if std::fs::symlink_metadata(target).is_ok_and(|m| !m.is_file()) {
            let _ = std::fs::remove_file(target);
        }
        if !target.exists() {
            let _ = std::fs::write(target, b"");
        }
        let _ = mount(Some(src), target, None::<&str>, MsFlags::MS_BIND, None::<&str>);
    }
}

/// The guest's cgroup2 hierarchy as pid 1 writes it: a mount detached from
/// every path, reached only through this descriptor, so the workload (root
/// in the guest, with a reduced set of capabilities) sees only the
/// read-only mount at `/sys/fs/cgroup` and can neither leave its cgroup nor
/// thaw or lift its limits.
static CGROUP: std::sync::OnceLock<std::fs::File> = std::sync::OnceLock::new();

/// A file of pid 1's cgroup2 hierarchy, by its path in it.
fn cgroup_file(rel: &str) -> std::io::Result<std::path::PathBuf> {
    let dir = CGROUP.get().ok_or_else(|| std::io::Error::other("the guest has no cgroup2 hierarchy"))?;
    Ok(std::path::PathBuf::from(format!("/proc/self/fd/{}/{rel}", dir.as_raw_fd())))
}

/// Puts pid 1 (and so every process it starts) in [`WORKLOAD_CGROUP`], with
/// `pids.max` when the sandbox has a process limit; the workload sees the
/// hierarchy read-only ([`CGROUP`]).
fn workload_cgroup(limit: Option<u64>) {
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let hidden = Path::new("/run/strata/.cgroup");
    let _ = std::fs::create_dir_all(hidden);
    if mount(Some("cgroup2"), hidden, Some("cgroup2"), flags, None::<&str>).is_err() {
        eprintln!("strata-init: no cgroup2 in this guest kernel: no pids limit, no warm copies");
        return;
    }
    let opened = std::fs::File::open(hidden);
    let _ = nix::mount::umount2(hidden, nix::mount::MntFlags::MNT_DETACH);
    let _ = std::fs::remove_dir(hidden);
    match opened {
        Ok(dir) => {
            let _ = CGROUP.set(dir);
        }
        Err(e) => return eprintln!("strata-init: open the cgroup2 hierarchy: {e}"),
    }
    let step = || -> std::io::Result<()> {
        std::fs::write(cgroup_file("cgroup.subtree_control")?, "+pids")?;
        std::fs::create_dir_all(cgroup_file(WORKLOAD_CGROUP)?)?;
        let max = limit.map_or_else(|| "max".to_string(), |l| l.to_string());
        std::fs::write(cgroup_file(&format!("{WORKLOAD_CGROUP}/pids.max"))?, max)?;
        std::fs::write(cgroup_file(&format!("{WORKLOAD_CGROUP}/cgroup.procs"))?, "1")
    };
    if let Err(e) = step() {
        eprintln!("strata-init: the workload's cgroup: {e}");
    }
    if let Err(e) = mount(Some("cgroup2"), "/sys/fs/cgroup", Some("cgroup2"), flags | MsFlags::MS_RDONLY, None::<&str>)
    {
        eprintln!("strata-init: /sys/fs/cgroup: {e}");
    }
}

/// The kernel's knobs out of the workload's reach, as on the other tiers:
/// `/proc/sys`, `/proc/sysrq-trigger` and `/sys` read-only (the guest's
/// root keeps a reduced set of capabilities, but writes files root owns).
fn read_only_kernel_files() {
    let ro = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    for path in ["/proc/sys", "/proc/sysrq-trigger", "/sys"] {
        let bound = path == "/sys" || mount(Some(path), path, None::<&str>, MsFlags::MS_BIND, None::<&str>).is_ok();
        if !bound || mount(None::<&str>, path, None::<&str>, ro | MsFlags::MS_NOEXEC, None::<&str>).is_err() {
            fatal("make the kernel's files read-only", path);
        }
    }
}

/// Freezes (`true`) or thaws every process of the sandbox but pid 1, which
/// steps out of [`WORKLOAD_CGROUP`] while they are frozen (and starts none:
/// the host holds the exec lock meanwhile).
fn freeze_workload(frozen: bool) -> std::io::Result<()> {
    let file = |name: &str| cgroup_file(&format!("{WORKLOAD_CGROUP}/{name}"));
    if !file("cgroup.freeze")?.exists() {
        return Err(std::io::Error::other("the guest has no cgroup of the sandbox's processes to freeze"));
    }
    if !frozen {
        std::fs::write(file("cgroup.freeze")?, "0")?;
        return std::fs::write(file("cgroup.procs")?, "1");
    }
    std::fs::write(cgroup_file("cgroup.procs")?, "1")?;
    std::fs::write(file("cgroup.freeze")?, "1")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if std::fs::read_to_string(file("cgroup.events")?)?.lines().any(|l| l == "frozen 1") {
            return Ok(());
        }
        if Instant::now() > deadline {
            let _ = freeze_workload(false);
            return Err(std::io::Error::other("the sandbox's processes did not freeze within 10 s"));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn open_port(path: &Path) -> std::fs::File {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)
    {
        Ok(f) => f,
        Err(e) => fatal(&format!("open {}", path.display()), e),
    }
}

/// Milliseconds since the kernel started.
fn boot_ms() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec we own.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) } != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// Entry point of `/init _vminit` in a microVM. Never returns.
pub fn boot_main() -> ! {
    if std::process::id() != 1 {
        eprintln!("strata-init _vminit is a microVM's first process");
        std::process::exit(2)
    }
    mount_fs("devtmpfs", "/dev", "devtmpfs", MsFlags::MS_NOSUID, Some("mode=755"));
    mount_fs("proc", "/proc", "proc", MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC, None);
    mount_fs("sysfs", "/sys", "sysfs", MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC, None);
    let cfg = GuestConfig::parse(&std::fs::read_to_string("/proc/cmdline").unwrap_or_default());
    load_modules(Path::new("/lib/modules"));
    switch_root();
    set_up_root(&cfg);
    let port = find_port();
    serve(&port, &cfg)
}

/// Waits for the host's token on the line, then serves: a thread relays the
/// line, pid 1 runs the spawner on the streams it makes.
fn serve(port: &Path, cfg: &GuestConfig) -> ! {
    // Signals are blocked before the line's thread starts (it inherits the
    // mask): they reach pid 1's signalfd only.
    let mut set = nix::sys::signal::SigSet::empty();
    for s in crate::spawner::PID1_SIGNALS {
        set.add(s);
    }
    let _ = set.thread_block();
    let line = open_port(port);
    let mut m = Mux::new(line.try_clone().unwrap_or_else(|e| fatal("dup the port", e)));
    let token = loop {
        m.step(&[], 100);
        let mut token = None;
        for ev in m.take_events() {
            match ev {
                Event::Token(t) => token = Some(t),
                Event::Clock(ns) => set_clock(ns),
                // No host on the port yet (its reads end at once): wait for one.
                Event::LineClosed => {
                    std::thread::sleep(Duration::from_millis(20));
                    m.reset();
                }
                _ => {}
            }
        }
        if let Some(t) = token {
            break t;
        }
    };
    let (tx, rx) = std::sync::mpsc::channel::<UnixStream>();
    let (wake_r, wake_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)
        .unwrap_or_else(|e| fatal("pipe", e));
    let info = mux::GuestInfo { kernel: kernel_release(), boot_ms: boot_ms() };
    m.send_control(Kind::Ready, &serde_json::to_vec(&info).expect("serializes"));
    std::thread::spawn(move || relay_line(m, tx, wake_w));
    let ops = crate::spawner::GuestOps { freeze_disk, open_layer, flush, secrets, freeze_workload, restored };
    let source = crate::spawner::Source::Offered { token, conns: rx, wake: wake_r, on_exit: power_off, ops };
    crate::spawner::serve_from(cfg.grace, source)
}

/// The line's thread: streams the host opens become connections for pid 1.
fn relay_line(mut m: Mux<std::fs::File>, tx: std::sync::mpsc::Sender<UnixStream>, wake: std::os::fd::OwnedFd) -> ! {
    loop {
        m.step(&[], 1000);
        for ev in m.take_events() {
            match ev {
                Event::Open(conn) => {
                    if tx.send(conn).is_err() {
                        power_off();
                    }
                    let _ = nix::unistd::write(wake.as_fd(), &[1]);
                }
                Event::Stop(grace) => {
                    crate::pid1::set_stop_grace(u64::from(grace));
                    // SAFETY: kill takes integers only; pid 1 is this process.
                    unsafe { libc::kill(1, libc::SIGTERM) };
                }
                // The host went away (its keeper restarts): every stream is gone with it.
                Event::LineClosed => {
                    std::thread::sleep(Duration::from_millis(20));
                    m.reset();
                }
                // A new keeper (after a restore from a snapshot) says hello: pid 1 still serves.
                Event::Token(_) => {
                    let info = mux::GuestInfo { kernel: kernel_release(), boot_ms: boot_ms() };
                    m.send_control(Kind::Ready, &serde_json::to_vec(&info).expect("serializes"));
                }
                Event::Clock(ns) => set_clock(ns),
                Event::Ready(_) => {}
            }
        }
    }
}

/// Steps the guest's wall clock to the host's (`ns` since the epoch).
fn set_clock(ns: u64) {
    if ns == 0 {
        return;
    }
    let ts =
        libc::timespec { tv_sec: (ns / 1_000_000_000) as libc::time_t, tv_nsec: (ns % 1_000_000_000) as libc::c_long };
    // SAFETY: clock_settime reads the timespec we own.
    if unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) } != 0 {
        eprintln!("strata-init: set the clock: {}", std::io::Error::last_os_error());
    }
}

fn kernel_release() -> String {
    nix::sys::utsname::uname().map(|u| u.release().to_string_lossy().into_owned()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_round_trips_through_the_command_line() {
        let c = GuestConfig {
            hostname: "box-1".into(),
            id: "sb-abc".into(),
            machine_id: "0123456789abcdef0123456789abcdef".into(),
            generation: 3,
            pids: Some(512),
            grace: 7,
            net: Some(GuestNet {
                address: "10.200.0.6".parse().unwrap(),
                prefix: 30,
                gateway: "10.200.0.5".parse().unwrap(),
            }),
        };
        let line = format!("console=ttyS0 quiet {} panic=-1", c.to_cmdline().join(" "));
        assert_eq!(GuestConfig::parse(&line), c);
        let defaults = GuestConfig::parse("console=ttyS0 strata.unknown=1 strata.pids=x");
        assert_eq!((defaults.hostname.as_str(), defaults.pids, defaults.grace), ("sandbox", None, 10));
        for bad in ["strata.net=10.0.0.2/33,10.0.0.1", "strata.net=10.0.0.2,10.0.0.1", "strata.net=x/30,10.0.0.1"] {
            assert_eq!(GuestConfig::parse(bad).net, None, "{bad}");
        }
    }
}
