//! The namespace tier: a sandbox is an init process in fresh pid, mount, uts,
//! ipc, net and cgroup namespaces on an overlay root, inside its own cgroup.
//!
//! Files: [`init`] (`strata _init`, sets up the sandbox and becomes its pid 1,
//! `strata-init _pid1`), [`mounts`], [`criu`] and [`restore`] (`strata
//! _restore`: dump and restore the process tree for standby). From the static
//! `strata-init` crate: [`enter`] (`strata-init _enter`, run on the host, hands
//! one process to a shim inside, its inner child), [`creds`], [`seccomp`], [`user`].
//!
//! The setup steps of `_init` and `_restore` ([`init::enter_namespaces`],
//! [`init::setup_sandbox`], [`restore::prepare_root`] and the [`mounts`]
//! functions) make their privileged calls through a [`crate::sys::Sys`]: the
//! helpers pass [`crate::sys::LinuxSys`], the unit tests a
//! [`crate::sys::RecordingSys`].

pub mod criu;
pub mod init;
pub mod lazy;
pub mod mounts;
pub mod netsock;
pub mod restore;
pub mod userns_image;

pub use strata_init::{creds, enter, seccomp, user};

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tracing::{debug, warn};

use crate::cgroup::{self, CgroupVersion, SandboxCgroup};
use crate::spec::{ExecSpec, SandboxSpec};
use crate::{ResourceUsage, Runtime, RuntimeError, SandboxHandle};

/// Default cgroup root.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The namespace tier.
#[derive(Debug, Clone)]
pub struct NamespaceRuntime {
    helper_exe: PathBuf,
    init_binary: PathBuf,
    cgroup_root: PathBuf,
    cgroup_version: CgroupVersion,
    run_dir: PathBuf,
    stop_grace: Duration,
    /// Whether CRIU can dump processes here, checked once (it runs `criu --version`).
    criu_check: std::sync::Arc<std::sync::OnceLock<Option<String>>>,
    /// Lazy restores whose memory is still coming in (or whose verdict is not collected).
    fills: std::sync::Arc<lazy::Fills>,
}

impl NamespaceRuntime {
    /// A runtime whose setup helpers (`_init`, `_restore`) are subcommands of
    /// `helper_exe` (the strata binary) and whose exec helper (`_enter`) and
    /// in-sandbox binary are the static `init_binary` (`strata-init`), keeping
    /// per-sandbox runtime files under `run_dir`.
    pub fn new(helper_exe: PathBuf, init_binary: PathBuf, run_dir: PathBuf) -> Result<Self, RuntimeError> {
        let cgroup_root = PathBuf::from(CGROUP_ROOT);
        let cgroup_version = cgroup::detect(&cgroup_root)?;
        Ok(NamespaceRuntime {
            helper_exe,
            init_binary,
            cgroup_root,
            cgroup_version,
            run_dir,
            stop_grace: Duration::from_secs(10),
            criu_check: Default::default(),
            fills: Default::default(),
        })
    }

    /// The detected cgroup version.
    pub fn cgroup_version(&self) -> CgroupVersion {
        self.cgroup_version
    }

    fn cgroup(&self, id: &str) -> SandboxCgroup {
        SandboxCgroup::new(&self.cgroup_root, self.cgroup_version, id)
    }
}

/// Kernel start time of a process (field 22 of /proc/PID/stat), or None when it
/// does not exist or is a zombie.
pub fn process_start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    if fields.first() == Some(&"Z") || fields.first() == Some(&"X") {
        return None;
    }
    fields.get(19)?.parse().ok()
}

impl Runtime for NamespaceRuntime {
    fn name(&self) -> &'static str {
        "namespace"
    }

    fn start(&self, spec: &SandboxSpec) -> Result<SandboxHandle, RuntimeError> {
        for d in [&spec.upper_dir, &spec.work_dir, &spec.rootfs_dir] {
            std::fs::create_dir_all(d).map_err(|e| RuntimeError::sys(format!("create {}", d.display()), e))?;
        }
        let t0 = Instant::now();
        let cg = self.cgroup(&spec.id);
        cg.create(&spec.limits)?;
        let t_cgroup = t0.elapsed();
        let config = init::InitConfig {
            spec: spec.clone(),
            cgroup_join_files: cg.join_files(),
            stop_grace_secs: self.stop_grace.as_secs(),
            init_binary: self.init_binary.clone(),
        };
        let log = spec.open_log()?;
        let mut child = {
            let _g = crate::spawn_lock();
            Command::new(&self.helper_exe)
                .arg("_init")
                .env_clear()
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(log)
                .spawn()
                .map_err(|source| RuntimeError::Spawn { what: "sandbox init", source })?
        };
        let json = serde_json::to_vec(&config).expect("InitConfig serializes");
        let mut stdin = child.stdin.take().expect("piped stdin");
        stdin.write_all(&json).map_err(|e| RuntimeError::sys("send init config", e))?;
        drop(stdin);
        let stdout = child.stdout.take().expect("piped stdout");
        // The outer helper reports the pid, pid 1 reports ready or an error; the two
        // writers race, so read until both are known (or the pipe closes).
        let mut pid = None;
        let mut outcome: Option<Result<(), RuntimeError>> = None;
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            match serde_json::from_str::<init::InitReport>(&line) {
                Ok(init::InitReport::Pid { pid: p }) => pid = Some(p),
                Ok(init::InitReport::Ready) => outcome = Some(Ok(())),
                Ok(init::InitReport::Error { message, image: true }) => {
                    outcome = Some(Err(RuntimeError::Image(message)))
                }
                Ok(init::InitReport::Error { message, image: false }) => {
                    outcome = Some(Err(RuntimeError::Setup(message)))
                }
                Err(_) => debug!(line, "unexpected line from init"),
            }
            if pid.is_some() && outcome.is_some() {
                break;
            }
        }
        let outcome = outcome.unwrap_or_else(|| Err(RuntimeError::Setup("init exited without reporting".into())));
        let _ = child.wait();
        debug!(sandbox = %spec.id, cgroup_us = t_cgroup.as_micros() as u64, total_us = t0.elapsed().as_micros() as u64, "init ready");
        let cleanup = |pid: Option<i32>| {
            if let Some(p) = pid {
                let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
            }
            let _ = self.cleanup(&spec.id);
        };
        if let Err(e) = outcome {
            cleanup(pid);
            return Err(e);
        }
        let Some(pid) = pid else {
            cleanup(None);
            return Err(RuntimeError::Setup("init did not report its pid".into()));
        };
        // Egress in a user namespace: the sandbox made its network namespace;
        // its link goes in before anything but pid 1 runs there.
        if let Some(l) = &spec.userns_link {
            if let Err(e) = plug_link(pid, l) {
                cleanup(Some(pid));
                return Err(e);
            }
        }
        // Pid 1 reports ready, then re-executes strata-init from inside the
        // sandbox: until it has, its memory maps the host's strata binary, which
        // a process dump (standby, a warm checkpoint) right after create cannot take.
        if let Err(e) = wait_for_exe(pid, &self.init_binary, Duration::from_secs(5)) {
            cleanup(Some(pid));
            return Err(e);
        }
        let Some(start) = process_start_time(pid) else {
            cleanup(Some(pid));
            return Err(RuntimeError::Setup("init exited right after setup".into()));
        };
        Ok(SandboxHandle { init_pid: pid, init_start_time: start })
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
        // The helper runs from the file pid 1 runs (so its mappings, and the
        // shim's, lie in the sandbox's mount tree): opened through init's
        // /proc directory once its start time matched, never by a path.
        let exe = enter::open_init_exe(handle.init_pid, handle.init_start_time).map_err(RuntimeError::Setup)?;
        let cfg = enter::EnterConfig {
            init_pid: handle.init_pid,
            init_start_time: handle.init_start_time,
            cgroup_join_files: self.cgroup(sandbox_id).join_files(),
            exec: exec.clone(),
        };
        let mut cmd = Command::new(format!("/proc/self/fd/{}", exe.as_raw_fd()));
        std::os::unix::process::CommandExt::arg0(&mut cmd, "strata-init");
        cmd.arg("_enter")
            .env_clear()
            .env(enter::CONFIG_ENV, serde_json::to_string(&cfg).expect("EnterConfig serializes"));
        Ok(crate::HelperCommand { cmd, held: Some(exe) })
    }

    fn stop(&self, sandbox_id: &str, handle: &SandboxHandle, grace: Duration) -> Result<(), RuntimeError> {
        let cg = self.cgroup(sandbox_id);
        let pid = Pid::from_raw(handle.init_pid);
        // Frozen (paused) tasks act on no signal, SIGKILL included: thaw first.
        if let Err(e) = cg.set_frozen(false, Duration::from_secs(5)) {
            debug!(sandbox = sandbox_id, error = %e, "thaw before stop");
        }
        if grace.is_zero() {
            if self.is_alive(handle) {
                let _ = kill(pid, Signal::SIGKILL);
            }
        } else if self.is_alive(handle) {
            let _ = kill(pid, Signal::SIGTERM);
            if !wait_for_exit(handle, grace) {
                warn!(sandbox = sandbox_id, "init ignored SIGTERM for {grace:?}; killing");
                let _ = kill(pid, Signal::SIGKILL);
            }
        }
        if !wait_for_exit(handle, Duration::from_secs(5)) {
            return Err(RuntimeError::Setup(format!("init of sandbox {sandbox_id} survives SIGKILL")));
        }
        // Init's death kills the pid namespace; helpers outside it (exec parents) may linger briefly.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let pids = cg.pids();
            if pids.is_empty() {
                break;
            }
            for p in pids {
                let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
            }
            if Instant::now() > deadline {
                return Err(RuntimeError::Setup(format!("processes of sandbox {sandbox_id} survive SIGKILL")));
            }
            // Usually gone within a millisecond (the kernel finishing the pid
            // namespace's teardown): a destroy waits here on its response path.
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(())
    }

    fn cleanup(&self, sandbox_id: &str) -> Result<(), RuntimeError> {
        self.fills.forget(sandbox_id);
        let cg = self.cgroup(sandbox_id);
        // rmdir fails with EBUSY while the kernel finishes tearing tasks down; retry briefly.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match cg.remove() {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() < deadline => {
                    debug!(sandbox = sandbox_id, error = %e, "cgroup busy, retrying");
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn set_frozen(&self, sandbox_id: &str, frozen: bool) -> Result<(), RuntimeError> {
        Ok(self.cgroup(sandbox_id).set_frozen(frozen, Duration::from_secs(10))?)
    }

    fn usage(&self, sandbox_id: &str) -> ResourceUsage {
        self.cgroup(sandbox_id).usage()
    }

    fn set_cpus_and_pids(&self, sandbox_id: &str, cpus: Option<f64>, pids: Option<u64>) -> Result<(), RuntimeError> {
        Ok(self.cgroup(sandbox_id).set_cpus_and_pids(cpus, pids)?)
    }

    fn run_dir(&self) -> PathBuf {
        self.run_dir.clone()
    }

    fn signal(&self, sandbox_id: &str, ns_pid: i32, signal: i32, group: bool) -> usize {
        let cg = self.cgroup(sandbox_id);
        let Some(leader) = cg.pids().into_iter().find(|p| ns_pid_of(*p) == Some(ns_pid)) else { return 0 };
        let targets: Vec<i32> = if group {
            cg.pids().into_iter().filter(|p| *p == leader || pgid_of(*p) == Some(leader)).collect()
        } else {
            vec![leader]
        };
        let mut sent = 0;
        for pid in targets {
            // Still this sandbox's (in its cgroup, with the same pid inside or in the group)?
            let still = || {
                cg.pids().contains(&pid)
                    && if pid == leader { ns_pid_of(pid) == Some(ns_pid) } else { pgid_of(pid) == Some(leader) }
            };
            if signal_if(pid, signal, still) {
                sent += 1;
            }
        }
        sent
    }

    fn resize_tty(
        &self,
        sandbox_id: &str,
        handle: &SandboxHandle,
        ns_pid: i32,
        tty_index: Option<u32>,
        size: crate::spec::TtySize,
    ) -> Result<(), RuntimeError> {
        use crate::openat2::{openat2, RESOLVE_IN_ROOT, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS};
        let index = tty_index
            .ok_or_else(|| RuntimeError::Setup(format!("process {ns_pid} of {sandbox_id} reported no terminal")))?;
        // The terminal's far end, in the sandbox's own devpts, opened from the
        // host without leaving its root: never a symlink, a FIFO or a file put
        // there by the sandbox (a character device of the pts majors only).
        let root = std::fs::File::open(format!("/proc/{}/root", handle.init_pid))
            .map_err(|e| RuntimeError::sys(format!("the root of sandbox {sandbox_id}"), e))?;
        let fd = openat2(
            std::os::fd::AsRawFd::as_raw_fd(&root),
            &format!("dev/pts/{index}"),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_NONBLOCK | libc::O_CLOEXEC,
            0,
            RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
        )
        .map_err(|e| RuntimeError::sys(format!("open /dev/pts/{index} of sandbox {sandbox_id}"), e))?;
        let st = nix::sys::stat::fstat(std::os::fd::AsRawFd::as_raw_fd(&fd))
            .map_err(|e| RuntimeError::sys("stat the terminal", e))?;
        // UNIX98_PTY_SLAVE_MAJOR (136) and the seven after it.
        let major = libc::major(st.st_rdev);
        if st.st_mode & libc::S_IFMT != libc::S_IFCHR || !(136..=143).contains(&major) {
            return Err(RuntimeError::Setup(format!("/dev/pts/{index} of sandbox {sandbox_id} is not a terminal")));
        }
        strata_init::pty::set_size(std::os::fd::AsRawFd::as_raw_fd(&fd), size)
            .map_err(|e| RuntimeError::sys(format!("resize /dev/pts/{index} of sandbox {sandbox_id}"), e))
    }

    fn process_dump_unsupported(&self) -> Option<String> {
        // Checked at the first standby of this daemon: a CRIU installed later needs a restart.
        self.criu_check
            .get_or_init(|| {
                let why = criu::unsupported();
                if why.is_none() {
                    match criu::prepare_kdat_cache() {
                        Ok(mounted) => debug!(dir = criu::KDAT_DIR, mounted, "CRIU kernel-probe cache ready"),
                        Err(e) => warn!(error = %e, "no CRIU kernel-probe cache: every dump and restore probes the kernel again"),
                    }
                }
                why
            })
            .clone()
    }

    fn dump_processes(
        &self,
        sandbox_id: &str,
        handle: &SandboxHandle,
        images_dir: &std::path::Path,
    ) -> Result<PathBuf, RuntimeError> {
        if !self.is_alive(handle) {
            return Err(RuntimeError::Setup("sandbox init is not running".into()));
        }
        self.fills.wait_to_dump(sandbox_id)?;
        let took = criu::dump(handle.init_pid, images_dir, &criu::DumpMode::Standby)?;
        if !wait_for_exit(handle, Duration::from_secs(5)) {
            return Err(RuntimeError::Setup(format!("init of sandbox {sandbox_id} survived the dump")));
        }
        debug!(sandbox = sandbox_id, ms = took.as_millis() as u64, "processes dumped");
        // Pid 1 was started from this runtime's strata-init (bind-mounted inside);
        // the daemon keeps that binary in place while images refer to it.
        Ok(self.init_binary.clone())
    }

    fn copy_processes(
        &self,
        sandbox_id: &str,
        handle: &SandboxHandle,
        images_dir: &std::path::Path,
    ) -> Result<PathBuf, RuntimeError> {
        if !self.is_alive(handle) {
            return Err(RuntimeError::Setup("sandbox init is not running".into()));
        }
        let freezer = self
            .cgroup(sandbox_id)
            .freezer_dir()
            .ok_or_else(|| RuntimeError::Unsupported("no freezer cgroup for this sandbox".into()))?;
        self.fills.wait_to_dump(sandbox_id)?;
        let took = criu::dump(handle.init_pid, images_dir, &criu::DumpMode::Copy { freezer })?;
        debug!(sandbox = sandbox_id, ms = took.as_millis() as u64, "processes copied");
        Ok(self.init_binary.clone())
    }

    fn reidentify(&self, spec: &SandboxSpec, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        if !self.is_alive(handle) {
            return Err(RuntimeError::Setup("sandbox init is not running".into()));
        }
        mounts::reidentify(
            &crate::sys::LinuxSys,
            handle.init_pid,
            &spec.hostname,
            &spec.id,
            &spec.machine_id,
            spec.fork_generation,
        )
        .map_err(RuntimeError::Setup)
    }

    fn interrupted_restore(&self, sandbox_id: &str, image_dir: &Path) -> crate::InterruptedRestore {
        let Some(pid) =
            std::fs::read_to_string(image_dir.join(criu::PIDFILE)).ok().and_then(|s| s.trim().parse::<i32>().ok())
        else {
            return crate::InterruptedRestore::None;
        };
        // Its own cgroup names the sandbox: a pid reused by another process is not it.
        let in_sandbox = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| c.contains(sandbox_id));
        match process_start_time(pid).filter(|_| in_sandbox) {
            Some(init_start_time) => {
                crate::InterruptedRestore::Running(SandboxHandle { init_pid: pid, init_start_time })
            }
            None => crate::InterruptedRestore::Gone,
        }
    }

    fn lazy_restore_unsupported(&self, userns: bool) -> Option<String> {
        self.process_dump_unsupported().or_else(|| lazy::unsupported(userns))
    }

    fn memory_fill(&self, sandbox_id: &str) -> Option<std::sync::Arc<dyn crate::PageFill>> {
        self.fills.get(sandbox_id).map(|f| f as std::sync::Arc<dyn crate::PageFill>)
    }

    fn adopt_fill(&self, sandbox_id: &str, image_dir: &Path) -> Option<std::sync::Arc<dyn crate::PageFill>> {
        self.fills.adopt(sandbox_id, image_dir).map(|f| f as std::sync::Arc<dyn crate::PageFill>)
    }

    fn restore_leftovers(&self, image_dir: &Path) -> Option<PathBuf> {
        let _ = std::fs::remove_file(image_dir.join(criu::PIDFILE));
        let log = image_dir.join(criu::RESTORE_LOG);
        log.exists().then_some(log)
    }

    fn open_root(&self, _: &str, handle: &SandboxHandle) -> std::io::Result<std::os::fd::OwnedFd> {
        let f = std::fs::File::open(format!("/proc/{}/root", handle.init_pid))?;
        // The pid may have been recycled between the caller's check and the open.
        if !self.is_alive(handle) {
            return Err(std::io::Error::new(std::io::ErrorKind::NotFound, "the sandbox's init is gone"));
        }
        Ok(f.into())
    }

    fn net_sockets(&self, handle: &SandboxHandle, idle: Duration) -> Result<Box<dyn crate::NetSockets>, RuntimeError> {
        if !self.is_alive(handle) {
            return Err(RuntimeError::Setup("sandbox init is not running".into()));
        }
        let ns = std::fs::File::open(format!("/proc/{}/ns/net", handle.init_pid))
            .map_err(|e| RuntimeError::sys("open the sandbox's network namespace", e))?;
        let maker = netsock::spawn(std::sync::Arc::new(crate::sys::LinuxSys), ns, idle)
            .map_err(|e| RuntimeError::sys("start the network namespace's socket thread", e))?;
        Ok(Box::new(maker))
    }

    fn restore_processes(
        &self,
        spec: &SandboxSpec,
        images_dir: &std::path::Path,
        work_dir: &std::path::Path,
        helper: &std::path::Path,
        inherit: &[(std::os::fd::RawFd, u64)],
        memory: crate::MemoryRestore,
    ) -> Result<SandboxHandle, RuntimeError> {
        if let Some(why) = self.process_dump_unsupported() {
            return Err(RuntimeError::Unsupported(why));
        }
        let started = Instant::now();
        let lazy = memory == crate::MemoryRestore::Lazy && lazy::unsupported(spec.userns.is_some()).is_none();
        // A marker an earlier (failed) lazy restore from these images left says nothing about this one.
        let _ = std::fs::remove_file(work_dir.join(lazy::PENDING_MARKER));
        let bin = criu::binary().ok_or_else(|| RuntimeError::Unsupported("criu is not installed".into()))?;
        let cg = self.cgroup(&spec.id);
        cg.create(&spec.limits)?;
        std::fs::create_dir_all(work_dir)
            .map_err(|e| RuntimeError::sys(format!("create {}", work_dir.display()), e))?;
        let pidfile = work_dir.join(criu::PIDFILE);
        let _ = std::fs::remove_file(&pidfile);
        let fail_early = |e: RuntimeError| {
            let _ = self.cleanup(&spec.id);
            Err(e)
        };
        let criu_images = match userns_images(images_dir, work_dir, spec.userns) {
            Ok(dir) => dir,
            Err(e) => return fail_early(e),
        };
        let empty_netns = images_dir.join(criu::EMPTY_NETNS_MARKER).is_file();
        let hook = if empty_netns {
            match write_restore_hook(work_dir, &self.helper_exe) {
                Ok(p) => Some(p),
                Err(e) => return fail_early(e),
            }
        } else {
            None
        };
        let mut cfg = criu::RestoreConfig {
            lower_dirs: spec.lower_dirs.clone(),
            upper_dir: spec.upper_dir.clone(),
            work_dir: spec.work_dir.clone(),
            rootfs_dir: spec.rootfs_dir.clone(),
            cgroup_join_files: cg.join_files(),
            cgroup_roots: cg.criu_roots(),
            criu_work_dir: (work_dir != criu_images).then(|| work_dir.to_path_buf()),
            images_dir: criu_images,
            foreign_root: work_dir != images_dir,
            tcp_closed: images_dir.join(criu::TCP_CLOSED_MARKER).is_file(),
            helper: helper.to_path_buf(),
            inherit: inherit.to_vec(),
            pidfile: pidfile.clone(),
            nftables_lock: criu::nftables_lock(&bin),
            criu: bin,
            external_netns: images_dir.join(criu::NETNS_MARKER).is_file(),
            netns_path: spec.netns_path.clone(),
            // In a user namespace CRIU's restored task opens the secrets' mount as the
            // sandbox's root, for whom the state directory is closed: it goes on a
            // scratch tmpfs of the restore helper's own, at a path everyone may walk.
            secrets_mount: (!spec.secrets.is_empty()).then(|| match spec.userns {
                Some(_) => Path::new(restore::SCRATCH).join("secrets"),
                None => spec.rootfs_dir.with_file_name("secrets.mnt"),
            }),
            secrets_owner: spec.secrets_owner.clone(),
            userns: spec.userns,
            empty_netns,
            hook,
            link: spec.userns_link.clone(),
            lazy,
            lazy_ready_fd: None,
        };
        // The fill daemon starts first; `_restore` waits until it listens
        // (CRIU connects to it) while it prepares the root.
        let (daemon, ready) = if lazy {
            let work = cfg.criu_work_dir.as_deref().unwrap_or(&cfg.images_dir);
            match lazy::Fills::start(&cfg.criu, &cfg.images_dir, work) {
                Ok(s) => (Some(s.daemon), Some(s.ready)),
                Err(e) => return fail_early(e),
            }
        } else {
            (None, None)
        };
        cfg.lazy_ready_fd = ready.as_ref().map(|fd| fd.as_raw_fd());
        let abandon = |daemon: Option<lazy::Listening>| {
            if let Some(d) = daemon {
                lazy::Fills::abandon(d);
            }
        };
        let log = match spec.open_log() {
            Ok(l) => l,
            Err(e) => {
                abandon(daemon);
                return fail_early(e);
            }
        };
        let mut child = {
            let g = crate::spawn_lock();
            if let Some(fd) = &ready {
                if let Err(e) = crate::inherit_in_next_spawn(&g, fd.as_fd()) {
                    drop(g);
                    abandon(daemon);
                    return fail_early(RuntimeError::sys("pass the lazy-pages status pipe", e));
                }
            }
            for (fd, _) in inherit {
                // SAFETY: F_SETFD on descriptors the caller owns; they are inheritable
                // only while the spawn lock is held.
                unsafe { libc::fcntl(*fd, libc::F_SETFD, 0) };
            }
            let spawned = Command::new(&self.helper_exe)
                .arg("_restore")
                .env_clear()
                .env(criu::RESTORE_CONFIG_ENV, serde_json::to_string(&cfg).expect("RestoreConfig serializes"))
                .stdin(if cfg.secrets_mount.is_some() { Stdio::piped() } else { Stdio::null() })
                .stdout(Stdio::null())
                .stderr(log)
                .spawn();
            for (fd, _) in inherit {
                // SAFETY: as above.
                unsafe { libc::fcntl(*fd, libc::F_SETFD, libc::FD_CLOEXEC) };
            }
            // `_restore` has its copy; ours goes while the lock is held.
            drop(ready);
            match spawned {
                Ok(c) => c,
                Err(source) => {
                    abandon(daemon);
                    return fail_early(RuntimeError::Spawn { what: "criu restore", source });
                }
            }
        };
        if let Some(mut stdin) = child.stdin.take() {
            // The secrets, over a pipe (a failed helper closes it: its exit status says why).
            let json = serde_json::to_vec(&spec.secrets).expect("secrets serialize");
            let _ = stdin.write_all(&json);
        }
        let status = child.wait().map_err(|e| RuntimeError::sys("wait for criu restore", e));
        match daemon {
            // The restored tree's pages come from here on.
            Some(d) if matches!(&status, Ok(s) if s.success()) => {
                self.fills.follow(&spec.id, d, started);
            }
            // Whatever the restore got to, the fill daemon has no tree to serve.
            other => abandon(other),
        }
        let status = status?;
        let fail = |msg: String| {
            let _ = self.cleanup(&spec.id);
            Err(RuntimeError::Setup(msg))
        };
        if !status.success() {
            let mut detail = criu::log_errors(&work_dir.join(criu::RESTORE_LOG));
            if lazy {
                let work = cfg.criu_work_dir.as_deref().unwrap_or(&cfg.images_dir);
                detail = format!("{detail}; criu lazy-pages: {}", lazy::log_errors(work));
            }
            // Whatever CRIU left behind dies with the cgroup.
            for p in cg.pids() {
                let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
            }
            return fail(format!("criu restore failed ({status}): {detail}"));
        }
        let pid: i32 = match std::fs::read_to_string(&pidfile).ok().and_then(|s| s.trim().parse().ok()) {
            Some(p) => p,
            None => return fail(format!("criu restore wrote no pid to {}", pidfile.display())),
        };
        let Some(start) = process_start_time(pid) else { return fail("the restored init exited at once".into()) };
        Ok(SandboxHandle { init_pid: pid, init_start_time: start })
    }
}

/// The images directory CRIU restores from for a sandbox whose user
/// namespace is `userns`: `images_dir` itself when its dumped map is that
/// range (or neither has one), else a view in `work_dir` (a hard link per
/// image, and `userns-N.img` moved to the range: a warm fork restores another
/// sandbox's processes into ids of its own). Images with a user namespace
/// and a sandbox without one (or the reverse) cannot meet: an error.
fn userns_images(
    images_dir: &Path,
    work_dir: &Path,
    userns: Option<strata_api::UserNamespace>,
) -> Result<PathBuf, RuntimeError> {
    use userns_image::{decode, encode, find, moved};
    let bad = |e: String| RuntimeError::Incompatible(e);
    let found = find(images_dir).map_err(|e| RuntimeError::sys(format!("read {}", images_dir.display()), e))?;
    let (u, path) = match (userns, found) {
        (None, None) => return Ok(images_dir.to_path_buf()),
        (Some(u), Some(p)) => (u, p),
        (Some(_), None) => {
            return Err(
                bad("the processes were saved from a sandbox without a user namespace; this one has one".into()),
            )
        }
        (None, Some(_)) => {
            return Err(bad("the processes were saved from a sandbox with a user namespace; this one has none".into()))
        }
    };
    let raw = std::fs::read(&path).map_err(|e| RuntimeError::sys(format!("read {}", path.display()), e))?;
    let maps = decode(&raw).map_err(|e| bad(format!("{}: {e}", path.display())))?;
    let (base, count) = maps.range().map_err(|e| bad(e.to_string()))?;
    if count != u.size {
        return Err(bad(format!("the saved user namespace maps {count} ids, this sandbox's {}", u.size)));
    }
    if base == u.host_base {
        return Ok(images_dir.to_path_buf());
    }
    let view = work_dir.join("criu-images");
    let io = |what: String| move |e: std::io::Error| RuntimeError::sys(what, e);
    if view.exists() {
        std::fs::remove_dir_all(&view).map_err(io(format!("remove {}", view.display())))?;
    }
    std::fs::create_dir_all(&view).map_err(io(format!("create {}", view.display())))?;
    for e in std::fs::read_dir(images_dir).map_err(io(format!("read {}", images_dir.display())))? {
        let e = e.map_err(io(format!("read {}", images_dir.display())))?;
        let (name, from) = (e.file_name(), e.path());
        if from == path || from == view || !e.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        // Hard links (a copy across file systems): CRIU opens some images after it
        // entered the restored root, where a symlink's path would not resolve.
        let to = view.join(&name);
        if std::fs::hard_link(&from, &to).is_err() {
            std::fs::copy(&from, &to).map_err(io(format!("copy {}", from.display())))?;
        }
    }
    let to = moved(&maps, u.host_base).map_err(|e| bad(e.to_string()))?;
    let file = view.join(path.file_name().expect("a file name"));
    std::fs::write(&file, encode(&to)).map_err(io(format!("write {}", file.display())))?;
    Ok(view)
}

/// Writes the action script CRIU runs during a restore with an empty
/// network namespace (`strata _restore_hook`, see [`restore::hook_main`]).
/// CRIU runs it at every action of the restore; only `setup-namespaces`
/// starts the strata binary (each start of it cost 5-20 ms on the resume path).
fn write_restore_hook(work_dir: &Path, helper_exe: &Path) -> Result<PathBuf, RuntimeError> {
    use std::os::unix::fs::PermissionsExt;
    let path = work_dir.join("restore-hook.sh");
    let quoted = helper_exe.to_string_lossy().replace('\'', "'\\''");
    let io = |e| RuntimeError::sys(format!("write {}", path.display()), e);
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\n[ \"$CRTOOLS_SCRIPT_ACTION\" = setup-namespaces ] || exit 0\nexec '{quoted}' _restore_hook\n"
        ),
    )
    .map_err(io)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).map_err(io)?;
    Ok(path)
}

/// Plugs `link` (a veth pair: the host side named `link.ifname`, `eth0` with
/// the sandbox's address and default route inside) into the network
/// namespace of process `pid`, whose own user namespace owns it.
pub fn plug_link(pid: i32, link: &crate::spec::UsernsLink) -> Result<(), RuntimeError> {
    let ns = PathBuf::from(format!("/proc/{pid}/ns/net"));
    strata_net::link::attach(&ns, &link.ifname, &link.link)
        .map_err(|e| RuntimeError::Setup(format!("plug the sandbox's link {} in: {e}", link.ifname)))
}

/// Waits until process `pid` runs the file `binary` (the same inode: inside the
/// sandbox it is a bind mount of it), at most `timeout`.
fn wait_for_exe(pid: i32, binary: &std::path::Path, timeout: Duration) -> Result<(), RuntimeError> {
    use std::os::unix::fs::MetadataExt;
    let want = std::fs::metadata(binary).map_err(|e| RuntimeError::sys(format!("stat {}", binary.display()), e))?;
    let deadline = Instant::now() + timeout;
    loop {
        match std::fs::metadata(format!("/proc/{pid}/exe")) {
            Ok(m) if m.ino() == want.ino() && m.dev() == want.dev() => return Ok(()),
            Ok(_) => {}
            Err(_) => return Err(RuntimeError::Setup("init exited before it became strata-init".into())),
        }
        if Instant::now() > deadline {
            return Err(RuntimeError::Setup(format!("init did not execute {} within {timeout:?}", binary.display())));
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// The pid of host process `pid` inside the innermost pid namespace it belongs
/// to, when that is not the host's (the last field of `NSpid:` in its status).
fn ns_pid_of(pid: i32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("NSpid:"))?;
    let fields: Vec<&str> = line.split_whitespace().skip(1).collect();
    if fields.len() < 2 {
        return None;
    }
    fields.last()?.parse().ok()
}

/// The process group of host process `pid` (field 5 of /proc/PID/stat).
fn pgid_of(pid: i32) -> Option<i32> {
    stat_field(pid, 2)
}

/// The parent of host process `pid` (field 4 of /proc/PID/stat).
pub(crate) fn parent_of(pid: i32) -> Option<i32> {
    stat_field(pid, 1)
}

/// Field `n` after the command name of /proc/PID/stat (0: the state).
fn stat_field(pid: i32, n: usize) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.get(stat.rfind(')')? + 2..)?.split_whitespace().nth(n)?.parse().ok()
}

/// Sends `signal` to host process `pid` if `still()` says, once `pid` is held
/// by a pidfd, that it is still the process meant: the pidfd names one process
/// for good, so a pid recycled between the check and the signal is never hit
/// (a process that died meanwhile gets none). Whether it was sent.
pub(crate) fn signal_if(pid: i32, signal: i32, still: impl FnOnce() -> bool) -> bool {
    let Ok(fd) = pidfd_open(pid) else { return false };
    still() && pidfd_signal(fd.as_fd(), signal)
}

/// A pidfd of process `pid`: it names that process for good (a pid recycled
/// later is another process).
pub(crate) fn pidfd_open(pid: i32) -> std::io::Result<std::os::fd::OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a new descriptor that nothing else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// Sends `signal` to the process `pidfd` names; whether it was sent.
pub(crate) fn pidfd_signal(pidfd: std::os::fd::BorrowedFd<'_>, signal: i32) -> bool {
    // SAFETY: pidfd_send_signal takes the pidfd, a signal number, a NULL siginfo and flags.
    let r = unsafe {
        libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), signal, std::ptr::null::<libc::siginfo_t>(), 0)
    };
    r == 0
}

/// Polls `fd` until it is readable (a pidfd: its process exited), at most
/// `timeout`; EINTR polls again.
pub(crate) fn wait_readable(fd: std::os::fd::BorrowedFd<'_>, timeout: Duration) -> std::io::Result<()> {
    let end = Instant::now() + timeout;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: poll on one pollfd we own for the call's duration.
        let r = unsafe { libc::poll(&mut p, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        match r {
            1.. => return Ok(()),
            0 => return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, format!("nothing within {timeout:?}"))),
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
}

/// Waits up to `timeout` for the process behind `handle` to exit (a zombie counts
/// as exited). Uses a pidfd, so it wakes at the exit instead of polling.
pub fn wait_for_exit(handle: &SandboxHandle, timeout: Duration) -> bool {
    wait_for_exit_of(handle.init_pid, handle.init_start_time, timeout)
}

/// [`wait_for_exit`] for process `pid` that started at `start_time` (field 22
/// of /proc/PID/stat): true once it is gone, false when it still runs at `timeout`.
pub(crate) fn wait_for_exit_of(pid: i32, start_time: u64, timeout: Duration) -> bool {
    let Ok(fd) = pidfd_open(pid) else { return true }; // no such process
                                                       // The pid may have been reused before we opened it: then ours is gone.
    if process_start_time(pid) != Some(start_time) {
        return true;
    }
    wait_readable(fd.as_fd(), timeout).is_ok() || process_start_time(pid) != Some(start_time)
}
