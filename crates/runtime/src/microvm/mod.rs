//! The microvm tier: every sandbox is a virtual machine with a kernel of its
//! own (QEMU's `microvm` machine), so its code meets a guest kernel, and
//! only QEMU's device models stand between it and the host.
//!
//! * [`probe`]: QEMU (its version), the accelerator (KVM only where a guest
//!   really boots under it: [`Accel`]), the guest kernel ([`assets`]).
//! * [`MicrovmRuntime`]: the tier behind [`crate::Runtime`].
//! * [`assets`]: the guest kernel and the initramfs whose `/init` is
//!   strata-init ([`strata_init::vm`]).
//! * [`disks`]: the read-only ext4 image of a layer chain (shared) and the
//!   sandbox's own disk, joined by overlayfs inside the guest.
//! * [`keeper`]: `strata _vm_keep`, QEMU's parent and the host end of the
//!   VM's line ([`strata_init::mux`]: many streams over one virtio-serial port).
//! * [`qmp`], [`snapshot`]: standby (QEMU's machine saved to a file) and
//!   what a snapshot records of the host that made it.
//!
//! Exec: `strata-init _runsc_exec` on the host takes a stream from the
//! keeper and talks to the guest's pid 1 over it exactly as to a gVisor
//! sandbox's (the token proof, [`strata_init::spawner`]); pid 1 resolves the
//! user, directory and program against its own root. Signals and terminal
//! sizes go the same way.
//!
//! Filesystem state: the sandbox's disk is an ext4 image (`disk.img` in its
//! directory, the namespace tier's format), with the writable layer in
//! `upper/`. Once a guest has had it ([`crate::disk::lend_to_guest`]) the host
//! never mounts it again: its blocks are the guest's to write, and a crafted
//! file system would meet the host kernel's ext4 driver. The guest's pid 1
//! writes the layer out instead ([`Runtime::read_guest_layer`]: its manifest,
//! then an OCI tar of the entries asked for, with the disk frozen in
//! between), which the engine unpacks as untrusted input; a stopped microVM
//! is booted for that. Flush paths are wiped by the guest ([`Runtime::guest_flush`]).
//!
//! Standby: the guest freezes its disk and its processes, QEMU saves the
//! machine to a file ([`qmp`], [`snapshot`]) and exits; a resume loads it
//! (`-incoming`), and the guest reseeds its generator before its processes
//! thaw.
//!
//! Warm checkpoints and forks: the guest's RAM is a memfd its keeper holds
//! (mapped shared); a warm checkpoint saves QEMU's state without it
//! (`x-ignore-shared`) and copies the RAM, the disk and a link to the lower
//! image out while the VM is stopped; a copy maps that RAM file private (its
//! pages shared with every other copy until written), loads the state, and
//! takes its own identity and fresh entropy before its processes thaw
//! ([`Runtime::copy_processes`], [`Runtime::restore_processes`]).
//!
//! Files: the file API is done by the guest's pid 1 ([`Runtime::guest_fs`],
//! [`strata_init::guestfs`]). Network: `--network egress` bridges the
//! sandbox's netns link to a tap QEMU opens. Secrets: a tmpfs in the guest's
//! RAM, put there after boot. QEMU runs confined (seccomp, an empty root, a
//! uid of the sandbox's own).
//!
//! What this tier does not do yet, each refused with why: rebase onto a
//! patched base, previews, and directory watches of the file API.
//! The measured facts behind each choice: docs/microvm.md.

pub mod assets;
pub mod disks;
pub mod keeper;
pub mod qmp;
pub mod snapshot;

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use tracing::{debug, warn};

use crate::cgroup::{self, CgroupVersion, SandboxCgroup};
use crate::namespace::{process_start_time, wait_for_exit, CGROUP_ROOT};
use crate::spec::{ExecSpec, SandboxSpec};
use crate::{InterruptedRestore, NetSockets, ResourceUsage, Runtime, RuntimeError, SandboxHandle};

/// Host memory a VM takes beyond its guest's RAM (QEMU itself, TCG's
/// translation cache, device buffers): added to the sandbox's cgroup limit.
pub const VMM_OVERHEAD_BYTES: u64 = 256 << 20;

/// Host tasks a VM's cgroup may hold (QEMU's threads and the keeper); the
/// sandbox's own process limit is applied inside the guest.
const HOST_TASKS: u64 = 128;

/// TCG's translation cache, in MiB (QEMU's default is 1 GiB per VM).
const TCG_TB_SIZE_MIB: u32 = 64;

/// How long a guest may take to boot and serve (TCG on a busy host is slow).
const BOOT_TIMEOUT: Duration = Duration::from_secs(90);

/// The most a guest's manifest of its writable layer may take (JSON).
const MAX_MANIFEST_BYTES: u64 = 256 << 20;

/// The QEMU fd set the sandbox's disk is handed over in (see [`keeper::DISK_FD_RW`]).
const DISK_FDSET: u32 = 3;

/// The QEMU fd set the standby image's file is handed over in.
const STANDBY_FDSET: u32 = 7;

/// How long a guest may go quiet in the middle of writing out its layer
/// (a large directory walked under TCG on a busy host).
const LAYER_IDLE: Duration = Duration::from_secs(300);

/// The accelerator QEMU runs guests with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// Hardware virtualization through /dev/kvm.
    Kvm,
    /// QEMU's translator: correct everywhere, several times slower.
    Tcg,
}

impl Accel {
    /// `kvm` or `tcg`.
    pub fn as_str(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

/// What the host offers for the microvm tier.
#[derive(Debug, Clone)]
pub struct MicrovmProbe {
    /// Where qemu-system-x86_64 is, when installed.
    pub qemu_path: Option<PathBuf>,
    /// Its version line.
    pub qemu: Option<String>,
    /// `/dev/kvm` kind: `none`, `hardware`, `pvm` (software nested
    /// virtualization: guests hang under it) or `unknown`.
    pub kvm: String,
    /// The guest kernel, or why there is none.
    pub kernel: Result<assets::GuestKernel, String>,
}

/// Probes for QEMU, KVM and the guest kernel.
pub fn probe() -> MicrovmProbe {
    let qemu_path = crate::probe::find_tool("qemu-system-x86_64");
    let qemu = qemu_path.as_ref().and_then(|p| {
        let o = Command::new(p).arg("--version").output().ok().filter(|o| o.status.success())?;
        String::from_utf8_lossy(&o.stdout).lines().next().map(|l| l.trim().to_string())
    });
    let kvm = crate::probe::kvm_kind().to_string();
    MicrovmProbe { qemu_path, qemu, kvm, kernel: assets::GuestKernel::find(&assets::assets_dir()) }
}

/// The QEMU major version in its version line (`QEMU emulator version 10.0.2 (...)`).
pub fn qemu_major(version: &str) -> Option<u32> {
    version.split("version ").nth(1)?.split('.').next()?.trim().parse().ok()
}

/// Whether this QEMU (its version line) has `-run-with chroot=,user=` (9.1 and newer):
/// older ones run the guest as root, which `strata doctor` says.
pub fn drops_privileges(version: &str) -> bool {
    qemu_at_least(version, (9, 1))
}

/// Whether a QEMU version line (`QEMU emulator version 10.0.2 (...)`) is at least `(major, minor)`.
fn qemu_at_least(version: &str, min: (u32, u32)) -> bool {
    let mut n = version.split("version ").nth(1).unwrap_or("").split(['.', ' ']).map(|x| x.parse::<u32>().unwrap_or(0));
    (n.next().unwrap_or(0), n.next().unwrap_or(0)) >= min
}

/// The oldest QEMU this tier runs (what HOST-FACTS measured: 7.2 and 10.0.2).
pub const MIN_QEMU_MAJOR: u32 = 7;

impl MicrovmProbe {
    /// Why the tier cannot run on this host (`None`: it can).
    pub fn unavailable(&self) -> Option<String> {
        let Some(path) = &self.qemu_path else {
            return Some(
                "qemu-system-x86_64 is not installed (scripts/setup-host.sh installs it from bookworm-backports)"
                    .into(),
            );
        };
        let Some(version) = &self.qemu else {
            return Some(format!("{} does not run (--version failed)", path.display()));
        };
        match qemu_major(version) {
            Some(m) if m >= MIN_QEMU_MAJOR => {}
            _ => return Some(format!("{version}: the microvm tier needs QEMU {MIN_QEMU_MAJOR} or newer")),
        }
        self.kernel.as_ref().err().cloned()
    }

    /// The accelerator guests get: KVM only on hardware virtualization (a
    /// stock kernel hangs in early boot under PVM's), TCG otherwise.
    /// `STRATA_MICROVM_ACCEL=tcg` forces TCG.
    pub fn accel(&self) -> Accel {
        let forced_tcg = std::env::var("STRATA_MICROVM_ACCEL").is_ok_and(|v| v == "tcg");
        if self.kvm == "hardware" && !forced_tcg {
            Accel::Kvm
        } else {
            Accel::Tcg
        }
    }

    /// One line for `strata doctor`.
    pub fn detail(&self) -> String {
        match (self.unavailable(), &self.qemu, &self.kernel) {
            (None, Some(q), Ok(k)) => format!(
                "{q}; accelerator {} (/dev/kvm: {}); guest kernel {}; QEMU confined: seccomp{}",
                self.accel().as_str(),
                self.kvm,
                if k.version.is_empty() { "(version unknown)" } else { &k.version },
                if drops_privileges(q) {
                    ", an empty root and a uid of its own"
                } else {
                    " only (this QEMU is older than 9.1: no -run-with, it stays root)"
                }
            ),
            (Some(why), _, _) => why,
            _ => "not probed".into(),
        }
    }
}

/// A sandbox's guest MAC address: locally administered, from its id (the
/// same at every boot and resume of it, another for every fork).
pub fn guest_mac(id: &str) -> String {
    // FNV-1a: spread, not secrecy.
    let h = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    let b = h.to_be_bytes();
    format!("02:53:{:02x}:{:02x}:{:02x}:{:02x}", b[0], b[1], b[2], b[3])
}

/// The empty, read-only directory under the run directory that every QEMU
/// chroots into.
const EMPTY_ROOT: &str = "microvm-empty-root";

/// The first of the host uids QEMU processes drop to ([`qemu_uid`]).
pub const QEMU_UID_BASE: u32 = 0x5A00_0000;
/// How many there are.
pub const QEMU_UIDS: u32 = 1 << 24;

/// The unprivileged host uid (and gid) a sandbox's QEMU runs as once its
/// files are open: one of [`QEMU_UIDS`] from [`QEMU_UID_BASE`], picked by the
/// sandbox id, owning nothing on the host, so an escaped QEMU has no file,
/// process or capability of the host's (another sandbox's QEMU shares it
/// only by a 1-in-16-million chance, and is not dumpable to it).
pub fn qemu_uid(id: &str) -> u32 {
    let h = id.bytes().fold(0x811c_9dc5u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193));
    QEMU_UID_BASE + h % QEMU_UIDS
}

/// The guest's RAM in MiB for a memory limit (`None`: 512 MiB; at least 128).
/// QEMU 10.0.2's microvm machine resets before the kernel runs when given
/// exactly 2048 MiB with virtio-mmio disks attached (measured: 2047, 2049,
/// 1024, 3072 and 4096 boot; docs/microvm.md), so that size gets 1 MiB less.
pub fn guest_mib(memory_bytes: Option<u64>) -> u64 {
    match memory_bytes.unwrap_or(512 << 20).div_ceil(1 << 20).max(128) {
        2048 => 2047,
        mib => mib,
    }
}

/// Where a VM restored from a snapshot keeps the lower image it runs on (in
/// its sandbox's directory, beside its disk).
const PINNED_LOWER: &str = "lower.img";

/// Links the lower image the VM in `dir` runs on into a snapshot
/// (`drives/lower.img`): the saved guest's kernel caches its blocks, so a
/// restore must run on the same bytes, whatever became of the chain's cached
/// image (a hard link: free, and it outlives the cache entry; a copy across
/// file systems).
fn keep_lower(dir: &VmDir, images_dir: &Path) -> Result<(), String> {
    let lower = std::fs::read_to_string(dir.lower()).map_err(|e| format!("the VM's lower image: {e}"))?;
    let drives = images_dir.join(snapshot::DRIVES_DIR);
    let link = drives.join(snapshot::LOWER_FILE);
    let _ = std::fs::remove_file(&link);
    std::fs::create_dir_all(&drives)
        .and_then(|()| std::fs::hard_link(&lower, &link))
        .or_else(|_| crate::disk::sparse_copy(Path::new(&lower), &link).map(drop))
        .map_err(|e| format!("keep the lower image {lower}: {e}"))
}

/// The guest's end of the sandbox's link (egress), if it has one.
fn guest_net(spec: &SandboxSpec) -> Option<strata_init::vm::GuestNet> {
    spec.link.filter(|_| spec.netns_path.is_some()).map(|l| strata_init::vm::GuestNet {
        address: l.address,
        prefix: strata_net::pool::LINK_PREFIX,
        gateway: l.gateway,
    })
}

/// The shape of `spec`'s VM (what a copy of a warm checkpoint must match).
fn shape_of(spec: &SandboxSpec, ram_file: bool) -> snapshot::Copy {
    snapshot::Copy {
        guest_mib: guest_mib(spec.limits.memory_bytes),
        vcpus: vcpus(spec),
        net: guest_net(spec).is_some(),
        disk_bytes: spec.limits.disk_bytes.unwrap_or(disks::DEFAULT_DISK_BYTES),
        ram_file,
    }
}

/// A sandbox's vCPUs: its CPU limit rounded up, 1 to 16.
fn vcpus(spec: &SandboxSpec) -> u32 {
    spec.limits.cpus.map(|c| c.ceil() as u32).unwrap_or(1).clamp(1, 16)
}

/// The host's TSC frequency in kHz, measured once against CLOCK_MONOTONIC_RAW
/// over 20 ms (a TCG guest reads the host's TSC). `None` off x86-64.
pub fn host_tsc_khz() -> Option<u64> {
    static KHZ: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *KHZ.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            let now = || {
                let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
                // SAFETY: clock_gettime writes the timespec we own.
                unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_RAW, &mut ts) };
                ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128
            };
            // SAFETY: rdtsc reads a counter; every x86-64 CPU has it.
            let tsc = || unsafe { core::arch::x86_64::_rdtsc() } as u128;
            let (t0, c0) = (now(), tsc());
            std::thread::sleep(Duration::from_millis(20));
            let (t1, c1) = (now(), tsc());
            let ns = t1.saturating_sub(t0);
            let measured = (ns > 0).then(|| ((c1.saturating_sub(c0)) * 1_000_000 / ns) as u64)?;
            // The kernel's own figure (cpuinfo's `cpu MHz`, to the kHz) when it agrees:
            // a 20 ms measurement is off by a few hundred ppm, a clock drift the guest keeps.
            let known = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|c| {
                let mhz = c.lines().find(|l| l.starts_with("cpu MHz"))?.split(':').nth(1)?.trim().to_string();
                let (whole, frac) = mhz.split_once('.').unwrap_or((&mhz, "0"));
                let frac: String = frac.chars().chain(std::iter::repeat('0')).take(3).collect();
                Some(whole.parse::<u64>().ok()? * 1000 + frac.parse::<u64>().ok()?)
            });
            Some(match known {
                Some(k) if k.abs_diff(measured) * 200 < measured => k,
                _ => measured,
            })
        }
        #[cfg(not(target_arch = "x86_64"))]
        None
    })
}

/// The microvm tier.
#[derive(Debug, Clone)]
pub struct MicrovmRuntime {
    qemu: PathBuf,
    qemu_version: String,
    /// Whether this QEMU drops its privileges ([`drops_privileges`]).
    confined: bool,
    accel: Accel,
    kernel: assets::GuestKernel,
    initramfs: PathBuf,
    helper_exe: PathBuf,
    init_binary: PathBuf,
    run_dir: PathBuf,
    cache_dir: PathBuf,
    cgroup_root: PathBuf,
    cgroup_version: CgroupVersion,
    stop_grace: Duration,
}

/// A sandbox's files on the host while it runs (`<run>/microvm/<id>/`).
struct VmDir(PathBuf);

impl VmDir {
    fn agent(&self) -> PathBuf {
        self.0.join("agent.sock")
    }
    fn control(&self) -> PathBuf {
        self.0.join("control.sock")
    }
    fn token(&self) -> PathBuf {
        self.0.join("token")
    }
    fn console(&self) -> PathBuf {
        self.0.join("console.log")
    }
    fn qemu_pid(&self) -> PathBuf {
        self.0.join("qemu.pid")
    }
    fn exec_lock(&self) -> PathBuf {
        self.0.join("exec.lock")
    }
    fn qmp(&self) -> PathBuf {
        self.0.join("qmp.sock")
    }
    fn hostname(&self) -> PathBuf {
        self.0.join("hostname")
    }
    /// Names the sandbox's directory (where its disk is).
    fn sandbox_dir_file(&self) -> PathBuf {
        self.0.join("sandbox-dir")
    }
    fn sandbox_dir(&self) -> Option<PathBuf> {
        std::fs::read_to_string(self.sandbox_dir_file()).ok().map(PathBuf::from)
    }
    /// The shape this VM was booted with (what a copy of it must have).
    fn shape(&self) -> PathBuf {
        self.0.join("shape.json")
    }
    /// Names the lower image this VM runs on.
    fn lower(&self) -> PathBuf {
        self.0.join("lower")
    }
}

/// How a VM's RAM is backed.
enum Ram {
    /// A memfd its keeper holds ([`keeper::RAM_FD`]), mapped shared: a warm
    /// checkpoint copies it while the VM is stopped, and QEMU's saved state
    /// leaves it out.
    Own,
    /// A warm checkpoint's RAM file, mapped private: every copy shares its
    /// pages (the host's page cache) until it writes them.
    Copy(PathBuf),
}

/// What a VM boots from.
enum Launch<'a> {
    /// The kernel, on the sandbox's disks.
    Cold,
    /// The sandbox's own standby image.
    Resume(&'a Path),
    /// A warm checkpoint's snapshot (another sandbox's VM), with its drives.
    Copy(&'a Path, &'a snapshot::Copy),
}

/// The QEMU version from which warm copies work: `memory-backend-file`'s
/// `rom=off` (a file opened read-only and mapped private, writable) came in 8.2.
fn maps_private_ram(version: &str) -> bool {
    qemu_at_least(version, (8, 2))
}

impl MicrovmRuntime {
    /// The tier, when `probe` says it can run: the keeper is a subcommand of
    /// `helper_exe` (the strata binary), `init_binary` (strata-init) is the
    /// guest's `/init` and the host's exec helper, per-sandbox files live
    /// under `run_dir`, layer-chain images and the initramfs under `cache_dir`.
    pub fn new(
        probe: &MicrovmProbe,
        helper_exe: PathBuf,
        init_binary: PathBuf,
        run_dir: PathBuf,
        cache_dir: PathBuf,
    ) -> Result<Self, RuntimeError> {
        if let Some(why) = probe.unavailable() {
            return Err(RuntimeError::Unsupported(why));
        }
        let (Some(qemu), Some(qemu_version), Ok(kernel)) =
            (probe.qemu_path.clone(), probe.qemu.clone(), probe.kernel.clone())
        else {
            return Err(RuntimeError::Unsupported("the microvm tier was not probed".into()));
        };
        std::fs::create_dir_all(&cache_dir)
            .map_err(|e| RuntimeError::sys(format!("create {}", cache_dir.display()), e))?;
        let initramfs = kernel.initramfs(&init_binary, &cache_dir)?;
        let empty_root = run_dir.join(EMPTY_ROOT);
        std::fs::create_dir_all(&empty_root)
            .and_then(|()| std::fs::set_permissions(&empty_root, std::os::unix::fs::PermissionsExt::from_mode(0o555)))
            .map_err(|e| RuntimeError::sys(format!("create {}", empty_root.display()), e))?;
        let cgroup_root = PathBuf::from(CGROUP_ROOT);
        let cgroup_version = cgroup::detect(&cgroup_root)?;
        Ok(MicrovmRuntime {
            qemu,
            confined: drops_privileges(&qemu_version),
            qemu_version,
            accel: probe.accel(),
            kernel,
            initramfs,
            helper_exe,
            init_binary,
            run_dir,
            cache_dir,
            cgroup_root,
            cgroup_version,
            stop_grace: Duration::from_secs(10),
        })
    }

    /// The QEMU version line this tier runs.
    pub fn qemu_version(&self) -> &str {
        &self.qemu_version
    }

    /// The accelerator its guests run under.
    pub fn accel(&self) -> Accel {
        self.accel
    }

    fn vm_dir(&self, id: &str) -> VmDir {
        VmDir(self.run_dir.join("microvm").join(id))
    }

    fn cgroup(&self, id: &str) -> SandboxCgroup {
        SandboxCgroup::new(&self.cgroup_root, self.cgroup_version, id)
    }

    /// What this tier cannot give `spec` yet, said before anything is made.
    fn refuse_unsupported(spec: &SandboxSpec) -> Result<(), RuntimeError> {
        if spec.userns_link.is_some() || (spec.netns_path.is_some() && spec.link.is_none()) {
            return Err(RuntimeError::Unsupported(
                "this network on the microvm tier: a guest gets the link of a network namespace the daemon made (egress without a user namespace)"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The QEMU command line of sandbox `spec` with its disks and files.
    fn qemu_argv(&self, spec: &SandboxSpec, dir: &VmDir, lower: &Path, disk: &Path, ram: &Ram) -> Vec<String> {
        let guest_mib = guest_mib(spec.limits.memory_bytes);
        let vcpus = vcpus(spec);
        let cfg = strata_init::vm::GuestConfig {
            hostname: spec.hostname.clone(),
            id: spec.id.clone(),
            machine_id: spec.machine_id.clone(),
            generation: spec.fork_generation,
            pids: spec.limits.pids,
            grace: self.stop_grace.as_secs(),
            net: guest_net(spec),
        };
        let mut append = vec!["console=ttyS0".to_string(), "quiet".into(), "panic=-1".into(), "rdinit=/init".into()];
        if self.accel == Accel::Tcg {
            // microvm has no HPET or PM timer to calibrate the TSC against: on a busy host
            // the guest's calibration fails and it hangs. Under TCG the guest's TSC is the
            // host's, so its frequency is given (measured once, [`host_tsc_khz`]).
            if let Some(khz) = host_tsc_khz() {
                append.extend([format!("tsc_early_khz={khz}"), "tsc=reliable".into()]);
            }
        }
        append.extend(cfg.to_cmdline());
        append.extend(["--".into(), "_vminit".into()]);
        let p = |p: &Path| p.to_string_lossy().into_owned();
        let accel = match self.accel {
            Accel::Kvm => "kvm".to_string(),
            Accel::Tcg => format!("tcg,tb-size={TCG_TB_SIZE_MIB}"),
        };
        let mut argv = vec![
            p(&self.qemu),
            "-name".into(),
            format!("strata-{}", spec.id),
            // The machine's defaults: its option ROM loads -kernel, the PIT calibrates the TSC,
            // its ACPI tables are how the guest finds the virtio-mmio devices.
            "-M".into(),
            "microvm,memory-backend=microvm.ram".into(),
            "-accel".into(),
            accel,
            // Under TCG QEMU's default CPU model: `max` translates slower.
            "-cpu".into(),
            self.cpu_model().into(),
            "-m".into(),
            format!("{guest_mib}M"),
            // The RAM block keeps the machine's default name, so a standby image of a
            // VM booted before RAM was a file loads into one that is.
            "-object".into(),
            match ram {
                Ram::Own => format!(
                    "memory-backend-file,id=microvm.ram,size={guest_mib}M,mem-path=/proc/self/fd/{},share=on",
                    keeper::RAM_FD
                ),
                Ram::Copy(file) => format!(
                    "memory-backend-file,id=microvm.ram,size={guest_mib}M,mem-path={},share=off,readonly=on,rom=off",
                    p(file)
                ),
            },
            "-smp".into(),
            vcpus.to_string(),
            "-nodefaults".into(),
            "-no-user-config".into(),
            "-nographic".into(),
            "-no-reboot".into(),
            "-kernel".into(),
            p(&self.kernel.vmlinuz),
            "-initrd".into(),
            p(&self.initramfs),
            "-append".into(),
            append.join(" "),
            "-chardev".into(),
            // QEMU's stdout, which the keeper copies into a file of bounded size.
            "stdio,id=console,signal=off".into(),
            "-serial".into(),
            "chardev:console".into(),
            "-drive".into(),
            format!("id=lower,file={},format=raw,if=none,readonly=on", p(lower)),
            "-device".into(),
            "virtio-blk-device,drive=lower".into(),
            "-drive".into(),
            // A QEMU that drops its privileges gets the disk as descriptors (read-write and
            // read-only: it reopens the image read-only when a snapshot is completed, and
            // read-write when a restored VM runs), opened by its keeper while still root.
            // QEMU's own image locks would set the two against each other: off (a boot ends
            // any QEMU of the sandbox left before it starts one).
            match self.confined {
                true => {
                    format!("id=disk,file=/dev/fdset/{DISK_FDSET},format=raw,if=none,cache=writeback,file.locking=off")
                }
                false => format!("id=disk,file={},format=raw,if=none,cache=writeback", p(disk)),
            },
            "-device".into(),
            "virtio-blk-device,drive=disk".into(),
            "-device".into(),
            "virtio-serial-device".into(),
            "-chardev".into(),
            format!("socket,id=agent,path={},server=on,wait=off", p(&dir.agent())),
            "-device".into(),
            format!("virtserialport,chardev=agent,name={}", strata_init::vm::PORT_NAME),
            "-device".into(),
            "virtio-rng-device".into(),
            "-qmp".into(),
            format!("unix:{},server=on,wait=off", p(&dir.qmp())),
        ];
        // Confined: a seccomp filter (no obsolete calls, no spawning, no resource
        // control), and before the guest runs an empty root and a user of the
        // sandbox's own (every file it needs is open by then). The filter is in place
        // before that drop, so it must let QEMU change its ids once (a process that
        // is no longer root cannot get root back); a QEMU that stays root may not.
        if self.confined {
            for fd in [keeper::DISK_FD_RW, keeper::DISK_FD_RO] {
                argv.extend(["-add-fd".into(), format!("fd={fd},set={DISK_FDSET}")]);
            }
        }
        argv.extend([
            "-sandbox".into(),
            format!(
                "on,obsolete=deny,elevateprivileges={},spawn=deny,resourcecontrol=deny",
                if self.confined { "allow" } else { "deny" }
            ),
        ]);
        if self.confined {
            argv.extend([
                "-run-with".into(),
                format!("chroot={},user={uid}:{uid}", p(&self.run_dir.join(EMPTY_ROOT)), uid = qemu_uid(&spec.id)),
            ]);
        }
        if cfg.net.is_some() {
            // The namespace's tap, bridged to its `eth0` (strata_net::link::bridge_for_guest);
            // QEMU runs in that namespace. The MAC is the sandbox's own, the same after a resume.
            argv.extend([
                "-netdev".into(),
                format!("tap,id=net0,ifname={},script=no,downscript=no", strata_net::link::GUEST_TAP),
                "-device".into(),
                format!("virtio-net-device,netdev=net0,mac={}", guest_mac(&spec.id)),
            ]);
        }
        argv
    }

    /// A cold boot, a resume of the sandbox's own VM, or a copy of a warm
    /// checkpoint's (see [`Launch`]).
    fn boot(&self, spec: &SandboxSpec, launch: Launch) -> Result<SandboxHandle, RuntimeError> {
        Self::refuse_unsupported(spec)?;
        let t0 = std::time::Instant::now();
        let dir = self.vm_dir(&spec.id);
        // A VM of this sandbox left by a daemon that died (e.g. one booted to read a
        // stopped sandbox's disk) would share the disk: it goes first.
        self.kill_qemu_by_pid_file(&spec.id);
        let _ = std::fs::remove_dir_all(&dir.0);
        std::fs::create_dir_all(&dir.0).map_err(|e| RuntimeError::sys(format!("create {}", dir.0.display()), e))?;
        let snapshot = match launch {
            Launch::Cold => None,
            Launch::Resume(images) | Launch::Copy(images, _) => Some(images),
        };
        // A restore's pid 1 holds the token saved with its snapshot.
        let token = crate::exec_channel::token(snapshot.map(|s| s.join(snapshot::TOKEN_FILE)).as_deref())?;
        crate::exec_channel::write_token(&dir.token(), &token)?;
        let sandbox_dir = spec.rootfs_dir.parent().unwrap_or(&self.run_dir);
        let disk_bytes = spec.limits.disk_bytes.unwrap_or(disks::DEFAULT_DISK_BYTES);
        let (lower, ram) = match launch {
            // The guest's page cache holds blocks of the lower image it ran on: that one.
            Launch::Resume(images) if images.join(snapshot::DRIVES_DIR).join(snapshot::LOWER_FILE).is_file() => {
                (images.join(snapshot::DRIVES_DIR).join(snapshot::LOWER_FILE), Ram::Own)
            }
            // The saved guest's kernel caches blocks of both drives: a copy runs on
            // the same lower image and on a copy of the disk as it was saved.
            Launch::Copy(images, copy) => {
                let drives = images.join(snapshot::DRIVES_DIR);
                crate::disk::lend_to_guest(sandbox_dir).map_err(RuntimeError::Setup)?;
                let disk = sandbox_dir.join(disks::SANDBOX_DISK);
                let staged = sandbox_dir.join(format!("{}.copy", disks::SANDBOX_DISK));
                let _ = std::fs::remove_file(&staged);
                crate::disk::sparse_copy(&drives.join(snapshot::DISK_FILE), &staged)
                    .and_then(|_| std::fs::rename(&staged, &disk))
                    .map_err(|e| {
                        RuntimeError::sys(format!("copy the warm checkpoint's disk to {}", disk.display()), e)
                    })?;
                let ram = match copy.ram_file {
                    true => Ram::Copy(images.join(snapshot::RAM_FILE)),
                    false => Ram::Own,
                };
                (drives.join(snapshot::LOWER_FILE), ram)
            }
            _ => (disks::lower_image(&self.cache_dir, &spec.lower_dirs)?, Ram::Own),
        };
        // A restored guest's lower image is the snapshot's (a link that goes with the
        // image): linked beside its disk for as long as the VM may be saved again.
        let pinned = sandbox_dir.join(PINNED_LOWER);
        let _ = std::fs::remove_file(&pinned);
        let lower = match snapshot {
            Some(_) => {
                std::fs::hard_link(&lower, &pinned)
                    .or_else(|_| crate::disk::sparse_copy(&lower, &pinned).map(drop))
                    .map_err(|e| RuntimeError::sys(format!("keep {} as {}", lower.display(), pinned.display()), e))?;
                pinned
            }
            None => lower,
        };
        let shape = shape_of(spec, matches!(ram, Ram::Own));
        // Read back by exec (the hostname), after the VM is gone (where its disk is),
        // and by a warm checkpoint (its shape and lower image).
        for (path, bytes) in [
            (dir.hostname(), spec.hostname.as_bytes().to_vec()),
            (dir.sandbox_dir_file(), sandbox_dir.as_os_str().as_encoded_bytes().to_vec()),
            (dir.shape(), serde_json::to_vec(&shape).expect("shape serializes")),
            (dir.lower(), lower.as_os_str().as_encoded_bytes().to_vec()),
        ] {
            std::fs::write(&path, bytes).map_err(|e| RuntimeError::sys(format!("write {}", path.display()), e))?;
        }
        let disk = disks::sandbox_disk(sandbox_dir, disk_bytes)?;
        // The guest is the disk's only writer, and the only reader: the host never mounts it again.
        crate::disk::lend_to_guest(sandbox_dir).map_err(RuntimeError::Setup)?;
        let t_disks = t0.elapsed();
        let cg = self.cgroup(&spec.id);
        let mut host_limits = spec.limits.clone();
        host_limits.memory_bytes = Some((guest_mib(spec.limits.memory_bytes) << 20) + VMM_OVERHEAD_BYTES);
        host_limits.pids = Some(HOST_TASKS);
        cg.create(&host_limits)?;
        if let Some(ns) = &spec.netns_path {
            strata_net::link::bridge_for_guest(ns)
                .map_err(|e| RuntimeError::Setup(format!("the guest's link in its network namespace: {e}")))?;
        }
        let mut qemu = self.qemu_argv(spec, &dir, &lower, &disk, &ram);
        let (incoming_file, ignore_shared) = match launch {
            Launch::Cold => (None, false),
            Launch::Resume(images) => {
                qemu.extend(["-incoming".into(), format!("file:{}", images.join(snapshot::STATE_FILE).display())]);
                (None, false)
            }
            // Deferred: `x-ignore-shared` must be set before QEMU reads the state.
            Launch::Copy(images, copy) => {
                qemu.extend(["-incoming".into(), "defer".into()]);
                (Some(images.join(snapshot::STATE_FILE)), copy.ram_file)
            }
        };
        let cfg = keeper::KeepConfig {
            qemu,
            agent_socket: dir.agent(),
            control_socket: dir.control(),
            token: dir.token(),
            console_log: dir.console(),
            qemu_pid_file: dir.qemu_pid(),
            boot_timeout_ms: BOOT_TIMEOUT.as_millis() as u64,
            cgroup_join: cg.join_files(),
            qmp_socket: dir.qmp(),
            incoming: snapshot.is_some(),
            netns: spec.netns_path.clone().filter(|_| spec.link.is_some()),
            disk: self.confined.then(|| disk.clone()),
            ram_memfd: matches!(ram, Ram::Own),
            incoming_file,
            ignore_shared,
        };
        let log = spec.open_log()?;
        let mut child = {
            let _g = crate::spawn_lock();
            Command::new(&self.helper_exe)
                .arg("_vm_keep")
                .env_clear()
                .env(keeper::CONFIG_ENV, serde_json::to_string(&cfg).expect("KeepConfig serializes"))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(log)
                .spawn()
                .map_err(|source| RuntimeError::Spawn { what: "microvm keeper", source })?
        };
        let keeper_pid = child.id() as i32;
        match keeper::read_report(child.stdout.take().expect("piped stdout")) {
            Some(keeper::KeepReport::Ready { qemu_pid, guest, ready_ms }) => {
                let start = process_start_time(keeper_pid)
                    .ok_or_else(|| RuntimeError::Setup("the microVM exited right after it booted".into()))?;
                debug!(sandbox = %spec.id, keeper = keeper_pid, qemu = qemu_pid, accel = self.accel.as_str(),
                    kernel = %guest.kernel, guest_boot_ms = guest.boot_ms, ready_ms,
                    disks_ms = t_disks.as_millis() as u64, total_ms = t0.elapsed().as_millis() as u64, "microVM serving");
                // The keeper stays our child: the daemon's watch reaps it.
                std::mem::forget(child);
                Ok(SandboxHandle { init_pid: keeper_pid, init_start_time: start })
            }
            other => {
                let _ = child.kill();
                let _ = child.wait();
                let _ = self.kill_qemu_by_pid_file(&spec.id);
                let _ = self.cleanup(&spec.id);
                Err(RuntimeError::Setup(match other {
                    Some(keeper::KeepReport::Failed { message }) => message,
                    _ => format!(
                        "the microVM keeper exited without reporting; console: {}",
                        keeper::console_tail(&dir.console())
                    ),
                }))
            }
        }
    }

    /// `strata-init _runsc_exec` doing `job` in the guest, over a stream of the keeper's.
    fn helper_command(
        &self,
        sandbox_id: &str,
        handle: &SandboxHandle,
        job: strata_init::runsc::Job,
    ) -> Result<Command, RuntimeError> {
        if !self.is_alive(handle) {
            return Err(RuntimeError::Setup("sandbox is not running".into()));
        }
        let dir = self.vm_dir(sandbox_id);
        let hostname = std::fs::read_to_string(dir.hostname()).unwrap_or_default();
        Ok(self.channel(sandbox_id).helper_command(&self.init_binary, None, &hostname, dir.exec_lock(), job))
    }

    /// The host's side of the VM's exec channel (streams of its keeper's line).
    fn channel(&self, sandbox_id: &str) -> crate::exec_channel::Pid1Channel {
        let dir = self.vm_dir(sandbox_id);
        crate::exec_channel::Pid1Channel { control: dir.control(), token: dir.token() }
    }

    /// Has the guest's pid 1 put `secrets` at `/run/secrets` (owned by
    /// `owner`): in the guest's RAM, never on its disk.
    fn put_secrets(
        &self,
        sandbox_id: &str,
        secrets: &[crate::spec::SecretFile],
        owner: Option<&str>,
    ) -> Result<(), RuntimeError> {
        if secrets.is_empty() {
            return Ok(());
        }
        let files = secrets
            .iter()
            .map(|s| strata_init::spawner::Secret { name: s.name.clone(), data: s.data.clone() })
            .collect();
        let req = strata_init::spawner::Request::Secrets { files, owner: owner.map(str::to_string) };
        match self.ask_pid1(sandbox_id, &req) {
            Ok(1) => Ok(()),
            other => Err(RuntimeError::Setup(format!("the guest could not put its secrets in place: {other:?}"))),
        }
    }

    /// One short request to the guest's pid 1; the number it answers.
    fn ask_pid1(&self, sandbox_id: &str, req: &strata_init::spawner::Request) -> Result<u32, String> {
        self.channel(sandbox_id).ask(req, Duration::from_secs(10))
    }

    /// The pid of the VM's QEMU, as its keeper wrote it.
    fn qemu_pid(&self, id: &str) -> Option<i32> {
        let text = std::fs::read_to_string(self.vm_dir(id).qemu_pid()).ok()?;
        text.trim().parse::<i32>().ok().filter(|p| *p > 1)
    }

    /// SIGKILLs the QEMU a failed boot's keeper started (its death would
    /// take QEMU along; this covers a keeper killed before QEMU set that up).
    fn kill_qemu_by_pid_file(&self, id: &str) -> bool {
        let Some(pid) = self.qemu_pid(id) else { return false };
        crate::namespace::signal_if(pid, libc::SIGKILL, || {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&format!("strata-{id}")))
        })
    }

    /// SIGKILLs the VM's QEMU if it is still its keeper's child.
    fn kill_qemu(&self, id: &str, handle: &SandboxHandle) -> bool {
        let Some(pid) = self.qemu_pid(id) else { return false };
        crate::namespace::signal_if(pid, libc::SIGKILL, || {
            crate::namespace::parent_of(pid) == Some(handle.init_pid) && self.is_alive(handle)
        })
    }

    /// What a snapshot made here records of the host (see [`snapshot::Manifest`]).
    fn snapshot_manifest(&self, sandbox_id: &str) -> snapshot::Manifest {
        snapshot::Manifest {
            sandbox: sandbox_id.to_string(),
            qemu: self.qemu_version.clone(),
            machine: "microvm".into(),
            accel: self.accel.as_str().into(),
            cpu: self.cpu_model().into(),
            kernel: self.kernel.version.clone(),
            workload_frozen: false,
            copy: None,
        }
    }

    /// Holds the exec lock (no process starts while the returned file is
    /// open) and has every connection to pid 1 let go, until the keeper has
    /// no stream open: the line holds no process's bytes when the VM is saved.
    fn let_go(&self, sandbox_id: &str) -> Result<std::fs::File, RuntimeError> {
        let dir = self.vm_dir(sandbox_id);
        let lock = crate::exec_channel::lock_execs(&dir.exec_lock(), Duration::from_secs(10))?;
        self.channel(sandbox_id)
            .detach(Duration::from_secs(10))
            .map_err(|e| RuntimeError::Setup(format!("detaching the API processes' connections: {e}")))?;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while keeper::open_streams(&dir.control()).map_err(|e| RuntimeError::sys("ask the VM's keeper", e))? > 0 {
            if std::time::Instant::now() > deadline {
                return Err(RuntimeError::Setup("the VM's streams did not drain within 10 s".into()));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(lock)
    }

    /// Freezes the guest's disk (consistent on the device) and then every
    /// process of the sandbox in it, so that a snapshot runs none of them
    /// until the restored guest has been reseeded ([`Self::after_restore`]).
    fn quiesce(&self, sandbox_id: &str) -> Result<(), RuntimeError> {
        use strata_init::spawner::Request;
        match self.ask_pid1(sandbox_id, &Request::FreezeDisk { frozen: true }) {
            Ok(1) => {}
            other => return Err(RuntimeError::Setup(format!("the guest could not freeze its disk: {other:?}"))),
        }
        match self.ask_pid1(sandbox_id, &Request::FreezeWorkload { frozen: true }) {
            Ok(1) => Ok(()),
            other => {
                let _ = self.ask_pid1(sandbox_id, &Request::FreezeDisk { frozen: false });
                Err(RuntimeError::Setup(format!("the guest could not freeze its processes: {other:?}")))
            }
        }
    }

    /// Undoes [`Self::quiesce`] in a guest that runs on (the snapshot failed, or was a copy).
    fn unquiesce(&self, sandbox_id: &str) {
        use strata_init::spawner::Request;
        for (what, req) in
            [("processes", Request::FreezeWorkload { frozen: false }), ("disk", Request::FreezeDisk { frozen: false })]
        {
            if let Err(e) = self.ask_pid1(sandbox_id, &req) {
                warn!(sandbox = sandbox_id, error = %e, "the guest could not thaw its {what}");
            }
        }
    }

    /// Saves the stopped VM's state into `images_dir` (QMP `migrate` to a
    /// file the daemon opens: QEMU runs unprivileged in an empty root),
    /// leaving out RAM in a shared file when `ignore_shared`.
    fn save_state(&self, q: &mut qmp::Qmp, images_dir: &Path, ignore_shared: bool) -> Result<(), String> {
        let state = images_dir.join(snapshot::STATE_FILE);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&state)
            .map_err(|e| format!("create {}: {e}", state.display()))?;
        qmp::set_ignore_shared(q, ignore_shared)?;
        let r = q
            .add_fd(STANDBY_FDSET, std::os::fd::AsFd::as_fd(&file))
            .and_then(|()| {
                q.execute("migrate", serde_json::json!({ "uri": format!("file:/dev/fdset/{STANDBY_FDSET}") }))
            })
            .and_then(|_| q.wait_migration(Duration::from_secs(300)));
        if ignore_shared {
            let _ = qmp::set_ignore_shared(q, false);
        }
        let _ = q.execute("remove-fd", serde_json::json!({ "fdset-id": STANDBY_FDSET }));
        r?;
        file.sync_all().map_err(|e| format!("sync {}: {e}", state.display()))
    }

    /// A guest restored from a snapshot, its processes still frozen: fresh
    /// entropy from the host and a reseed, the new `identity` of a copy, its
    /// disk thawed, then its processes. A guest that cannot is stopped.
    fn after_restore(
        &self,
        spec: &SandboxSpec,
        handle: &SandboxHandle,
        identity: Option<strata_init::spawner::Identity>,
        workload_frozen: bool,
    ) -> Result<(), RuntimeError> {
        use strata_init::spawner::Request;
        let mut entropy = vec![0u8; 64];
        let got = std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut entropy));
        let steps = || -> Result<(), String> {
            got.map_err(|e| format!("entropy from the host: {e}"))?;
            let copy = identity.is_some();
            match self.ask_pid1(&spec.id, &Request::Restored { entropy, identity }) {
                Ok(1) => {}
                // A standby image of an older build: its pid 1 does not know the request;
                // it is the same sandbox (no copy shares its generator), so it runs on.
                Err(e) if !copy && !workload_frozen => {
                    warn!(sandbox = %spec.id, error = %e, "the restored guest was not reseeded")
                }
                other => return Err(format!("the restored guest could not be reseeded: {other:?}")),
            }
            match self.ask_pid1(&spec.id, &Request::FreezeDisk { frozen: false }) {
                Ok(1) => {}
                other => return Err(format!("the restored guest could not thaw its disk: {other:?}")),
            }
            if workload_frozen {
                match self.ask_pid1(&spec.id, &Request::FreezeWorkload { frozen: false }) {
                    Ok(1) => {}
                    other => return Err(format!("the restored guest could not thaw its processes: {other:?}")),
                }
            }
            Ok(())
        };
        steps().map_err(|e| {
            let _ = self.stop(&spec.id, handle, Duration::ZERO);
            RuntimeError::Setup(e)
        })
    }

    fn cpu_model(&self) -> &'static str {
        match self.accel {
            Accel::Kvm => "host",
            Accel::Tcg => "qemu64",
        }
    }

    fn unsupported(&self, what: &str) -> RuntimeError {
        RuntimeError::Unsupported(format!("{what} on the microvm tier is not implemented in this build"))
    }
}

impl Runtime for MicrovmRuntime {
    fn name(&self) -> &'static str {
        "microvm"
    }

    fn start(&self, spec: &SandboxSpec) -> Result<SandboxHandle, RuntimeError> {
        let handle = self.boot(spec, Launch::Cold)?;
        if let Err(e) = self.put_secrets(&spec.id, &spec.secrets, spec.secrets_owner.as_deref()) {
            let _ = self.stop(&spec.id, &handle, Duration::ZERO);
            return Err(e);
        }
        Ok(handle)
    }

    fn is_alive(&self, handle: &SandboxHandle) -> bool {
        process_start_time(handle.init_pid) == Some(handle.init_start_time)
    }

    fn exec_command(
        &self,
        sandbox_id: &str,
        handle: &SandboxHandle,
        exec: &ExecSpec,
    ) -> Result<crate::HelperCommand, RuntimeError> {
        self.helper_command(sandbox_id, handle, strata_init::runsc::Job::Exec { exec: exec.clone() }).map(Into::into)
    }

    fn attaches_by_command(&self) -> bool {
        true
    }

    /// Before a warm copy: the API processes' connections let go (their
    /// supervisors attach again after it) and no process starts.
    fn detach_processes(
        &self,
        sandbox_id: &str,
        _: &SandboxHandle,
    ) -> Result<Option<crate::DetachGuard>, RuntimeError> {
        Ok(Some(crate::DetachGuard(Box::new(self.let_go(sandbox_id)?))))
    }

    fn attach_command(
        &self,
        sandbox_id: &str,
        handle: &SandboxHandle,
        ns_pid: i32,
        stdin: bool,
    ) -> Result<Option<Command>, RuntimeError> {
        self.helper_command(sandbox_id, handle, strata_init::runsc::Job::Attach { pid: ns_pid, stdin }).map(Some)
    }

    fn stop(&self, sandbox_id: &str, handle: &SandboxHandle, grace: Duration) -> Result<(), RuntimeError> {
        if !grace.is_zero() && self.is_alive(handle) {
            // A frozen VM acts on nothing.
            let _ = self.cgroup(sandbox_id).set_frozen(false, Duration::from_secs(5));
            let mut cmd = vec![keeper::STOP];
            cmd.extend_from_slice(&(grace.as_secs().max(1) as u32).to_le_bytes());
            match strata_init::channel::command(&self.vm_dir(sandbox_id).control(), &cmd) {
                // The guest stops its processes within the grace, then powers off.
                Ok(_) => {
                    if !wait_for_exit(handle, grace + Duration::from_secs(5)) {
                        warn!(sandbox = sandbox_id, "the guest did not power off after {grace:?}; killing");
                    }
                }
                Err(e) => debug!(sandbox = sandbox_id, error = %e, "asking the guest to stop"),
            }
        }
        if self.is_alive(handle) && !self.kill_qemu(sandbox_id, handle) {
            crate::namespace::signal_if(handle.init_pid, libc::SIGKILL, || self.is_alive(handle));
        }
        if !wait_for_exit(handle, Duration::from_secs(10)) {
            return Err(RuntimeError::Setup(format!("microVM {sandbox_id} survives SIGKILL")));
        }
        Ok(())
    }

    fn cleanup(&self, sandbox_id: &str) -> Result<(), RuntimeError> {
        let _ = std::fs::remove_dir_all(&self.vm_dir(sandbox_id).0);
        let cg = self.cgroup(sandbox_id);
        if cg.dirs().iter().any(|d| d.exists()) {
            cg.remove()?;
        }
        Ok(())
    }

    /// Pauses (or lets go on) the whole VM: QEMU's threads in the freezer
    /// (the guest's clock jumps on thaw). Nothing of the guest's disk is read
    /// here: checkpoints read it through the guest ([`Runtime::read_guest_layer`]).
    fn set_frozen(&self, sandbox_id: &str, frozen: bool) -> Result<(), RuntimeError> {
        self.cgroup(sandbox_id).set_frozen(frozen, Duration::from_secs(10)).map_err(Into::into)
    }

    fn usage(&self, sandbox_id: &str) -> ResourceUsage {
        self.cgroup(sandbox_id).usage()
    }

    fn run_dir(&self) -> PathBuf {
        self.run_dir.clone()
    }

    fn signal(&self, sandbox_id: &str, ns_pid: i32, signal: i32, group: bool) -> usize {
        self.channel(sandbox_id).signal(sandbox_id, ns_pid, signal, group)
    }

    fn resize_tty(
        &self,
        sandbox_id: &str,
        _handle: &SandboxHandle,
        ns_pid: i32,
        _tty_index: Option<u32>,
        size: crate::spec::TtySize,
    ) -> Result<(), RuntimeError> {
        self.channel(sandbox_id).resize(sandbox_id, ns_pid, size)
    }

    fn process_dump_unsupported(&self) -> Option<String> {
        None
    }

    /// Standby of a microVM: the guest freezes its disk, QEMU stops the VM
    /// and saves its memory and devices to `images_dir` (QMP `migrate` to a
    /// file), then exits; the disk is mounted read-only on the host (the
    /// guest's file system must come back exactly as it left it).
    fn dump_processes(
        &self,
        sandbox_id: &str,
        handle: &SandboxHandle,
        images_dir: &Path,
    ) -> Result<PathBuf, RuntimeError> {
        std::fs::create_dir_all(images_dir)
            .map_err(|e| RuntimeError::sys(format!("create {}", images_dir.display()), e))?;
        let dir = self.vm_dir(sandbox_id);
        let t = std::time::Instant::now();
        // No process starts from here on (the lock is held until the VM is gone), and every
        // connection lets go: what pid 1 had queued reaches its client before the VM stops,
        // the rest waits in the processes' pipes for the clients after the resume.
        let _execs = self.let_go(sandbox_id)?;
        self.quiesce(sandbox_id)?;
        let thaw = || self.unquiesce(sandbox_id);
        let saved = (|| -> Result<snapshot::Manifest, String> {
            let mut q = qmp::Qmp::connect(&dir.qmp(), Duration::from_secs(5))?;
            q.execute("stop", serde_json::Value::Null)?;
            let saved = (|| -> Result<snapshot::Manifest, String> {
                // Standby keeps the RAM in the state file: its memfd goes with QEMU.
                self.save_state(&mut q, images_dir, false)?;
                keep_lower(&dir, images_dir)?;
                let manifest = snapshot::Manifest { workload_frozen: true, ..self.snapshot_manifest(sandbox_id) };
                manifest.save(images_dir).map_err(|e| format!("write the snapshot's manifest: {e}"))?;
                std::fs::copy(dir.token(), images_dir.join(snapshot::TOKEN_FILE))
                    .map_err(|e| format!("keep the channel token with the snapshot: {e}"))?;
                Ok(manifest)
            })();
            // Saved: QEMU goes. Not saved: the VM runs on (its pid 1 then thaws it).
            let _ = q.execute(if saved.is_ok() { "quit" } else { "cont" }, serde_json::Value::Null);
            saved
        })();
        let manifest = match saved {
            Ok(m) => m,
            Err(e) => {
                thaw();
                return Err(RuntimeError::Setup(e));
            }
        };
        let saved_ms = t.elapsed().as_millis() as u64;
        if !wait_for_exit(handle, Duration::from_secs(10)) {
            self.kill_qemu(sandbox_id, handle);
            if !wait_for_exit(handle, Duration::from_secs(10)) {
                return Err(RuntimeError::Setup(format!("microVM {sandbox_id} outlived its snapshot")));
            }
        }
        debug!(sandbox = sandbox_id, saved_ms, total_ms = t.elapsed().as_millis() as u64, accel = %manifest.accel, "microVM saved");
        Ok(self.init_binary.clone())
    }

    /// A warm checkpoint of a running microVM (its disk already frozen by
    /// the caller's read of its layer): the guest freezes its processes,
    /// QEMU stops the VM and saves its device state (without the RAM:
    /// `x-ignore-shared`), the RAM is copied out of the keeper's memfd and
    /// the disk out of its image (holes kept), the lower image is linked;
    /// then the VM runs on and its processes thaw. The parent's pause is the
    /// copy of its touched RAM and its disk's data.
    fn copy_processes(
        &self,
        sandbox_id: &str,
        handle: &SandboxHandle,
        images_dir: &Path,
    ) -> Result<PathBuf, RuntimeError> {
        if !maps_private_ram(&self.qemu_version) {
            return Err(RuntimeError::Unsupported(format!(
                "warm checkpoints of microVMs with {}: copies map the saved RAM private with memory-backend-file's rom=off (QEMU 8.2 and newer)",
                self.qemu_version
            )));
        }
        let dir = self.vm_dir(sandbox_id);
        let (Some(sandbox_dir), Ok(shape)) = (
            dir.sandbox_dir(),
            std::fs::read(dir.shape())
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice::<snapshot::Copy>(&b).map_err(|e| e.to_string())),
        ) else {
            return Err(RuntimeError::Setup(format!("microVM {sandbox_id} has no record of its boot (restart it)")));
        };
        let drives = images_dir.join(snapshot::DRIVES_DIR);
        std::fs::create_dir_all(&drives).map_err(|e| RuntimeError::sys(format!("create {}", drives.display()), e))?;
        let t = std::time::Instant::now();
        match self.ask_pid1(sandbox_id, &strata_init::spawner::Request::FreezeWorkload { frozen: true }) {
            Ok(1) => {}
            other => return Err(RuntimeError::Setup(format!("the guest could not freeze its processes: {other:?}"))),
        }
        let mut phases = (0u128, 0u64, 0u64);
        let copied = (|| -> Result<(), String> {
            let mut q = qmp::Qmp::connect(&dir.qmp(), Duration::from_secs(5))?;
            q.execute("stop", serde_json::Value::Null)?;
            let saved = (|| -> Result<(), String> {
                // A copy's own RAM is its checkpoint's file mapped private: not shared,
                // so it goes into the state file, and its copies load it from there.
                self.save_state(&mut q, images_dir, shape.ram_file)?;
                phases.0 = t.elapsed().as_millis();
                if shape.ram_file {
                    let memfd = format!("/proc/{}/fd/{}", handle.init_pid, keeper::RAM_FD);
                    phases.1 = crate::disk::sparse_copy(Path::new(&memfd), &images_dir.join(snapshot::RAM_FILE))
                        .map_err(|e| format!("copy the guest's RAM: {e}"))?;
                }
                // QEMU flushed the disk when the migration completed.
                phases.2 =
                    crate::disk::sparse_copy(&sandbox_dir.join(disks::SANDBOX_DISK), &drives.join(snapshot::DISK_FILE))
                        .map_err(|e| format!("copy the guest's disk: {e}"))?;
                keep_lower(&dir, images_dir)?;
                std::fs::copy(dir.token(), images_dir.join(snapshot::TOKEN_FILE))
                    .map_err(|e| format!("keep the channel token with the snapshot: {e}"))?;
                let manifest = snapshot::Manifest {
                    workload_frozen: true,
                    copy: Some(shape.clone()),
                    ..self.snapshot_manifest(sandbox_id)
                };
                manifest.save(images_dir).map_err(|e| format!("write the snapshot's manifest: {e}"))
            })();
            // The VM runs on either way (QEMU takes its disk back on `cont`).
            let resumed = q.execute("cont", serde_json::Value::Null).map(drop);
            saved.and(resumed.map_err(|e| format!("the VM did not run on after its copy: {e}")))
        })();
        if let Err(e) = self.ask_pid1(sandbox_id, &strata_init::spawner::Request::FreezeWorkload { frozen: false }) {
            warn!(sandbox = sandbox_id, error = %e, "the guest could not thaw its processes after a copy");
        }
        copied.map_err(|e| RuntimeError::Setup(format!("the warm copy of microVM {sandbox_id}: {e}")))?;
        debug!(
            sandbox = sandbox_id,
            state_ms = phases.0 as u64,
            ram_bytes = phases.1,
            disk_bytes = phases.2,
            paused_ms = t.elapsed().as_millis() as u64,
            "microVM copied"
        );
        Ok(self.init_binary.clone())
    }

    /// Brings back a VM saved into `images_dir`: the sandbox's own standby
    /// image, or a warm checkpoint's snapshot for another sandbox (a fork
    /// child, a template's sandbox), which must have its shape. Refused when
    /// this host's QEMU, machine, accelerator, CPU model or guest kernel is
    /// not the one that saved it. QEMU loads the VM and lets it run, the
    /// keeper says hello to pid 1 (and the time); the guest, its processes
    /// still frozen, mixes in fresh entropy and reseeds, takes the new
    /// sandbox's identity (a copy), thaws its disk and then its processes.
    fn restore_processes(
        &self,
        spec: &SandboxSpec,
        images_dir: &Path,
        _work_dir: &Path,
        _helper: &Path,
        _inherit: &[(std::os::fd::RawFd, u64)],
        _memory: crate::MemoryRestore,
    ) -> Result<SandboxHandle, RuntimeError> {
        let saved = snapshot::Manifest::load(images_dir).map_err(RuntimeError::Incompatible)?;
        if let Some(why) = saved.mismatch(&self.snapshot_manifest(&spec.id)) {
            return Err(RuntimeError::Incompatible(why));
        }
        let Some(copy) = &saved.copy else {
            if saved.sandbox != spec.id {
                return Err(RuntimeError::Incompatible(format!(
                    "the VM snapshot in {} is sandbox {}'s standby image: only a warm checkpoint's starts other sandboxes",
                    images_dir.display(),
                    saved.sandbox
                )));
            }
            let handle = self.boot(spec, Launch::Resume(images_dir))?;
            self.after_restore(spec, &handle, None, saved.workload_frozen)?;
            return Ok(handle);
        };
        // A warm checkpoint's: a fork child, a template's sandbox, or its own sandbox rolled back.
        if let Some(why) = copy.mismatch(&shape_of(spec, copy.ram_file)) {
            return Err(RuntimeError::Shape(why));
        }
        let handle = self.boot(spec, Launch::Copy(images_dir, copy))?;
        let identity = strata_init::spawner::Identity {
            hostname: spec.hostname.clone(),
            id: spec.id.clone(),
            machine_id: spec.machine_id.clone(),
            generation: spec.fork_generation,
            net: guest_net(spec),
        };
        self.after_restore(spec, &handle, Some(identity), saved.workload_frozen)?;
        Ok(handle)
    }

    /// Nothing left to do: a copy took its identity in [`Runtime::restore_processes`],
    /// before any of its processes ran again.
    fn reidentify(&self, _: &SandboxSpec, _: &SandboxHandle) -> Result<(), RuntimeError> {
        Ok(())
    }

    /// A restore the daemon did not record: whatever it started is ended
    /// (its QEMU only read the snapshot), the snapshot stays for the next try.
    fn interrupted_restore(&self, sandbox_id: &str, _: &Path) -> InterruptedRestore {
        let dir = self.vm_dir(sandbox_id);
        if !dir.0.exists() {
            return InterruptedRestore::None;
        }
        self.kill_qemu_by_pid_file(sandbox_id);
        let _ = std::fs::remove_dir_all(&dir.0);
        InterruptedRestore::Gone
    }

    fn restore_leftovers(&self, _: &Path) -> Option<PathBuf> {
        None
    }

    fn net_sockets(&self, _: &SandboxHandle, _: Duration) -> Result<Box<dyn NetSockets>, RuntimeError> {
        Err(self.unsupported("sockets in the guest's network (its ports are reached through its pid 1)"))
    }

    fn ports_through_pid1(&self) -> bool {
        true
    }

    fn pid1_channel(&self, sandbox_id: &str) -> Option<crate::exec_channel::Pid1Channel> {
        Some(self.channel(sandbox_id))
    }

    fn layer_in_guest(&self) -> bool {
        true
    }

    fn process_image_holds_secrets(&self) -> bool {
        true
    }

    fn guest_fs(
        &self,
        sandbox_id: &str,
        op: &strata_init::guestfs::FsOp,
        input: Option<&mut dyn std::io::Read>,
        out: &mut dyn std::io::Write,
        limit: u64,
    ) -> Result<(), strata_init::guestfs::FsFailure> {
        let req = strata_init::spawner::Request::Fs { op: op.clone() };
        match self.channel(sandbox_id).exchange(&req, input, out, limit, LAYER_IDLE) {
            Ok(_) => Ok(()),
            // Pid 1's refusal says why as JSON; anything else is the channel's.
            Err(e) => Err(serde_json::from_str(&e).unwrap_or(strata_init::guestfs::FsFailure {
                errno: libc::EIO,
                path: String::new(),
                message: format!("the file operation in microVM {sandbox_id}: {e}"),
                rule: None,
            })),
        }
    }

    /// The guest freezes its disk ([`strata_init::spawner::Request::FreezeDisk`]),
    /// tells its entries ([`strata_init::spawner::Request::LayerManifest`]) and
    /// writes the chosen ones ([`strata_init::spawner::Request::LayerTar`]),
    /// then thaws it. At most the guest disk's size (twice, for tar's
    /// headers) is taken from it.
    fn read_guest_layer(
        &self,
        sandbox_id: &str,
        choose: &mut dyn FnMut(Vec<strata_init::layer::Entry>) -> Vec<strata_init::layer::Item>,
        out: Option<&mut dyn std::io::Write>,
        while_frozen: &mut dyn FnMut(),
    ) -> Result<Duration, RuntimeError> {
        use strata_init::spawner::Request;
        let channel = self.channel(sandbox_id);
        let disk_bytes = self
            .vm_dir(sandbox_id)
            .sandbox_dir()
            .and_then(|d| std::fs::metadata(d.join(crate::disk::IMAGE)).ok())
            .map_or(disks::DEFAULT_DISK_BYTES, |m| m.len());
        match self.ask_pid1(sandbox_id, &Request::FreezeDisk { frozen: true }) {
            Ok(1) => {}
            other => return Err(RuntimeError::Setup(format!("the guest could not freeze its disk: {other:?}"))),
        }
        let frozen_at = std::time::Instant::now();
        let read = (|| -> Result<(), String> {
            let mut json = Vec::new();
            channel.fetch(&Request::LayerManifest, &mut json, MAX_MANIFEST_BYTES, LAYER_IDLE)?;
            let entries: Vec<strata_init::layer::Entry> =
                serde_json::from_slice(&json).map_err(|e| format!("the guest's manifest does not parse: {e}"))?;
            let items = choose(entries);
            if let Some(out) = out {
                let limit = disk_bytes.saturating_mul(2) + (64 << 20);
                channel.fetch(&Request::LayerTar { items }, out, limit, LAYER_IDLE)?;
            }
            while_frozen();
            Ok(())
        })();
        let frozen = frozen_at.elapsed();
        let thawed = self.ask_pid1(sandbox_id, &Request::FreezeDisk { frozen: false });
        read.map_err(|e| RuntimeError::Setup(format!("reading the writable layer of microVM {sandbox_id}: {e}")))?;
        match thawed {
            Ok(1) => Ok(frozen),
            other => Err(RuntimeError::Setup(format!("the guest could not thaw its disk: {other:?}"))),
        }
    }

    fn guest_flush(&self, sandbox_id: &str, paths: &[String], user: Option<&str>) -> Result<Vec<String>, RuntimeError> {
        let req = strata_init::spawner::Request::Flush { paths: paths.to_vec(), user: user.map(str::to_string) };
        let mut report = Vec::new();
        self.channel(sandbox_id)
            .fetch(&req, &mut report, 1 << 20, Duration::from_secs(60))
            .map_err(|e| RuntimeError::Setup(format!("the flush in microVM {sandbox_id}: {e}")))?;
        Ok(String::from_utf8_lossy(&report).lines().map(str::to_string).collect())
    }

    fn open_root(&self, sandbox_id: &str, _: &SandboxHandle) -> std::io::Result<std::os::fd::OwnedFd> {
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            format!(
                "the files of microVM {sandbox_id} are on its own disk: the file API does not reach them in this build"
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_memory_follows_the_limit_around_qemu_s_2_gib_reset() {
        assert_eq!(guest_mib(None), 512);
        assert_eq!(guest_mib(Some(64 << 20)), 128);
        assert_eq!(guest_mib(Some(2 << 30)), 2047);
        assert_eq!(guest_mib(Some(3 << 30)), 3072);
    }

    #[test]
    fn a_guest_s_mac_is_its_sandbox_s_own_and_locally_administered() {
        let (a, b) = (guest_mac("sb-1"), guest_mac("sb-2"));
        assert_ne!(a, b);
        assert_eq!(a, guest_mac("sb-1"), "the same at every boot and resume");
        assert!(a.starts_with("02:") && a.len() == 17, "{a}");
    }

    #[test]
    fn qemu_drops_to_a_uid_of_the_sandbox_s_own_from_9_1() {
        assert!(drops_privileges("QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-1~bpo12+1)"));
        assert!(drops_privileges("QEMU emulator version 9.1.0"));
        assert!(!drops_privileges("QEMU emulator version 9.0.2"));
        assert!(!drops_privileges("QEMU emulator version 7.2.15 (Debian 1:7.2+dfsg-7)"));
        let (a, b) = (qemu_uid("sb-a"), qemu_uid("sb-b"));
        assert_ne!(a, b);
        assert!((QEMU_UID_BASE..QEMU_UID_BASE + QEMU_UIDS).contains(&a), "{a}");
        assert_eq!(a, qemu_uid("sb-a"));
    }

    #[test]
    fn qemu_versions_are_read_from_their_line() {
        assert_eq!(qemu_major("QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-1~bpo12+1)"), Some(10));
        assert_eq!(qemu_major("QEMU emulator version 7.2.15"), Some(7));
        assert_eq!(qemu_major("something else"), None);
    }

    #[test]
    fn a_host_without_qemu_or_a_kernel_says_which() {
        let mut p = MicrovmProbe { qemu_path: None, qemu: None, kvm: "pvm".into(), kernel: Err("no kernel".into()) };
        assert!(p.unavailable().unwrap().contains("qemu-system-x86_64 is not installed"));
        p.qemu_path = Some("/usr/bin/qemu-system-x86_64".into());
        p.qemu = Some("QEMU emulator version 6.2.0".into());
        assert!(p.unavailable().unwrap().contains("needs QEMU 7"));
        p.qemu = Some("QEMU emulator version 10.0.2".into());
        assert_eq!(p.unavailable().as_deref(), Some("no kernel"));
        assert_eq!(p.accel(), Accel::Tcg, "PVM's KVM hangs guests: TCG");
    }
}
