//! The gVisor tier: each sandbox runs under `runsc`, a user-space kernel (the
//! sentry) between its processes and the host, on strata's own overlay root.
//!
//! * [`probe`]: is runsc here, which version, which platform
//!   ([`choose_platform`]: KVM on hosts with hardware virtualization,
//!   systrap otherwise).
//! * [`GvisorRuntime`]: the tier behind [`crate::Runtime`].
//! * [`bundle`]: the OCI bundle and the host tree under the sandbox's root.
//! * [`keeper`]: `strata _runsc_keep`, the parent of one sandbox on the host.
//!
//! Exec: `strata-init _runsc_exec` on the host resolves the process against
//! the sandbox's root, takes one of pid 1's connections from the sandbox's
//! broker (in its keeper) and has pid 1 start it over the exec channel, so
//! that it is a process a checkpoint keeps and no `runsc exec` runs (see
//! [`strata_init::channel`], [`strata_init::spawner`]); the exit report stays
//! on the host, out of the sandbox's reach.
//!
//! Standby and warm checkpoints: under the sandbox's exec lock held
//! exclusive (none starts meanwhile) the broker pauses and pid 1 lets every
//! connection go (no host socket may be in a checkpoint), then `runsc
//! checkpoint` saves the sentry (with `--leave-running` for a copy, after
//! which the broker listens again);
//! [`image::ImageHost`] records the runsc, platform and CPU next to it. A
//! restore is `runsc restore` under a keeper, on the same kind of bundle;
//! the daemon's supervisors take their processes back through
//! [`Runtime::attach_command`]. A copy also carries the sandbox's `/tmp`
//! (a host directory here, not part of the sentry's memory).
//! The measured facts behind every choice here: docs/design/gvisor-tier.md.

pub mod bundle;
pub mod image;
pub mod keeper;

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use crate::cgroup::{self, CgroupVersion, SandboxCgroup};
use crate::namespace::{process_start_time, wait_for_exit, CGROUP_ROOT};
use crate::spec::{ExecSpec, SandboxSpec};
use crate::sys::LinuxSys;
use crate::{DetachGuard, InterruptedRestore, NetSockets, ResourceUsage, Runtime, RuntimeError, SandboxHandle};

/// How long a checkpoint waits for exec clients that are starting.
const DETACH_LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a copy's image keeps the sandbox's `/tmp`.
const COPIED_TMP: &str = "tmp";

/// The oldest runsc this tier runs (systrap, checkpoint options; Debian 12's
/// own 20221219 has neither).
pub const MIN_RUNSC_DATE: u32 = 20240729;

/// What the host offers for the gVisor tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GvisorProbe {
    /// Where `runsc` is, when installed.
    pub runsc: Option<PathBuf>,
    /// Its version line (`runsc version 0.0~20240729.0`).
    pub version: Option<String>,
    /// The platform this host would use.
    pub platform: &'static str,
}

/// Looks for `runsc` on `PATH` (and in `/usr/sbin`, `/usr/bin`) and asks its version.
pub fn probe() -> GvisorProbe {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let runsc = std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/bin", "/usr/local/bin"].map(PathBuf::from))
        .map(|d| d.join("runsc"))
        .find(|p| p.is_file());
    let version = runsc.as_ref().and_then(|p| {
        let out = Command::new(p).arg("--version").output().ok().filter(|o| o.status.success())?;
        String::from_utf8_lossy(&out.stdout).lines().next().map(|l| l.trim().to_string())
    });
    GvisorProbe { runsc, version, platform: choose_platform() }
}

/// The release date in a runsc version line (`0.0~20240729.0`, `release-20240729.0`).
pub fn version_date(version: &str) -> Option<u32> {
    version
        .split(|c: char| !c.is_ascii_digit())
        .find(|part| part.len() == 8 && part.starts_with("20"))
        .and_then(|d| d.parse().ok())
}

/// The platform runsc should use here: `kvm` when `/dev/kvm` is hardware
/// virtualization ([`crate::probe::kvm_kind`]: runsc's KVM platform hangs on
/// PVM), `systrap` otherwise.
pub fn choose_platform() -> &'static str {
    if crate::probe::kvm_kind() == "hardware" {
        "kvm"
    } else {
        "systrap"
    }
}

impl GvisorProbe {
    /// Why the tier cannot run on this host (`None`: it can).
    pub fn unavailable(&self) -> Option<String> {
        match (&self.runsc, &self.version) {
            (None, _) => {
                Some("runsc is not installed (scripts/setup-host.sh installs it from bookworm-backports)".into())
            }
            (Some(p), None) => Some(format!("{} does not run (runsc --version failed)", p.display())),
            (Some(p), Some(v)) => match version_date(v) {
                Some(d) if d >= MIN_RUNSC_DATE => None,
                _ => Some(format!(
                    "{} is {v}; the gvisor tier needs runsc {MIN_RUNSC_DATE} or newer (systrap, checkpoint options)",
                    p.display()
                )),
            },
        }
    }

    /// One line for `strata doctor`.
    pub fn detail(&self) -> String {
        match (&self.runsc, &self.version, self.unavailable()) {
            (Some(p), Some(v), None) => format!("{v} at {}, platform {}", p.display(), self.platform),
            (_, _, Some(why)) => why,
            _ => "not probed".into(),
        }
    }
}

/// The gVisor tier.
#[derive(Debug, Clone)]
pub struct GvisorRuntime {
    runsc: PathBuf,
    version: String,
    platform: &'static str,
    helper_exe: PathBuf,
    init_binary: PathBuf,
    run_dir: PathBuf,
    cgroup_root: PathBuf,
    cgroup_version: CgroupVersion,
    stop_grace: Duration,
}

impl GvisorRuntime {
    /// The tier, when `probe` says it can run: the keeper is a subcommand of
    /// `helper_exe` (the strata binary), exec goes through the static
    /// `init_binary` (`strata-init`, also the sandbox's pid 1 and shim), runsc's
    /// state and the bundles live under `run_dir`.
    pub fn new(
        probe: &GvisorProbe,
        helper_exe: PathBuf,
        init_binary: PathBuf,
        run_dir: PathBuf,
    ) -> Result<Self, RuntimeError> {
        if let Some(why) = probe.unavailable() {
            return Err(RuntimeError::Unsupported(why));
        }
        let (Some(runsc), Some(version)) = (probe.runsc.clone(), probe.version.clone()) else {
            return Err(RuntimeError::Unsupported("runsc not probed".into()));
        };
        let cgroup_root = PathBuf::from(CGROUP_ROOT);
        let cgroup_version = cgroup::detect(&cgroup_root)?;
        Ok(GvisorRuntime {
            runsc,
            version,
            platform: probe.platform,
            helper_exe,
            init_binary,
            run_dir,
            cgroup_root,
            cgroup_version,
            stop_grace: Duration::from_secs(10),
        })
    }

    /// The runsc version line this tier runs.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The platform it runs sandboxes on.
    pub fn platform(&self) -> &'static str {
        self.platform
    }

    fn gvisor_dir(&self) -> PathBuf {
        self.run_dir.join("gvisor")
    }

    fn bundle(&self, id: &str) -> bundle::Bundle {
        bundle::Bundle::new(&self.gvisor_dir(), id)
    }

    /// runsc with the global flags every call shares (its own state root).
    fn global_args(&self) -> Vec<String> {
        vec![
            self.runsc.to_string_lossy().into_owned(),
            "--root".into(),
            self.gvisor_dir().join("state").to_string_lossy().into_owned(),
            format!("--platform={}", self.platform),
            "--overlay2=none".into(),
            // strata's file API writes the root from the host: the sentry must revalidate.
            "--file-access=shared".into(),
        ]
    }

    /// Runs one short runsc command; its stderr on failure.
    fn runsc(&self, args: &[&str]) -> Result<(), String> {
        run_output(&self.global_args(), args).map(|_| ())
    }

    /// Whether runsc's state root has anything of container `id` (state, lock, socket).
    fn runsc_knows(&self, id: &str) -> bool {
        std::fs::read_dir(self.gvisor_dir().join("state"))
            .is_ok_and(|d| d.flatten().any(|e| e.file_name().to_string_lossy().contains(id)))
    }

    /// The host a process image made here records.
    fn image_host(&self) -> image::ImageHost {
        image::ImageHost {
            runsc: self.version.clone(),
            platform: self.platform.into(),
            cpu_flags: image::cpu_flags(),
            exec_channel: image::EXEC_CHANNEL,
        }
    }

    /// Runs `strata-init ARGS` inside the sandbox as root (with `caps`), and
    /// returns its stdout; its stderr on failure.
    fn exec_init(&self, id: &str, caps: &[&str], args: &[&str]) -> Result<String, String> {
        let mut argv = self.global_args();
        argv.truncate(4); // runsc, --root R, --platform: what exec needs
        let mut rest = vec!["exec"];
        for c in caps {
            rest.extend(["--cap", c]);
        }
        rest.extend([id, strata_init::SELF_PATH]);
        rest.extend(args);
        run_output(&argv, &rest)
    }

    /// Takes the sandbox's exec lock exclusive (no process starts while it is
    /// held), pauses its broker and has pid 1 let every connection go.
    fn detach(&self, id: &str) -> Result<Detached, RuntimeError> {
        // Each client holds it shared only until its process runs: a start that
        // hangs (runsc stuck) must not hold a standby forever.
        let lock = crate::exec_channel::lock_execs(&self.bundle(id).exec_lock(), DETACH_LOCK_TIMEOUT)?;
        let b = self.bundle(id);
        // From here on, whatever happens, the broker listens again when the guard goes.
        let guard = Detached { lock, control: b.broker_control() };
        let (clients, ms) = Self::detach_channel(&b)
            .map_err(|e| RuntimeError::Setup(format!("detaching the API processes' connections: {e}")))?;
        debug!(sandbox = id, clients, ms, "connections let go");
        Ok(guard)
    }

    /// Pauses the sandbox's broker and has pid 1 let every connection go;
    /// returns how many relayed a process and how long it took.
    fn detach_channel(b: &bundle::Bundle) -> Result<(u32, u64), String> {
        use strata_init::channel::{self, Frame};
        let t = Instant::now();
        let token = std::fs::read(b.token()).map_err(|e| format!("the sandbox's token: {e}"))?;
        let mut conn = channel::pause(&b.broker_control()).map_err(|e| format!("pause the broker: {e}"))?;
        let mut reader = channel::open_as_host(&mut conn, &token).map_err(|e| e.to_string())?;
        conn.set_read_timeout(Some(Duration::from_secs(5))).map_err(|e| e.to_string())?;
        let req = serde_json::to_vec(&strata_init::spawner::Request::Detach).expect("serializes");
        channel::write_frame(&mut conn, Frame::Request, &req).map_err(|e| format!("ask pid 1: {e}"))?;
        loop {
            match reader.read_from(&mut conn).map_err(|e| format!("pid 1's answer: {e}"))? {
                Some((Frame::Detached, n)) => {
                    let n = n.as_slice().try_into().map(u32::from_le_bytes).unwrap_or(0);
                    return Ok((n, t.elapsed().as_millis() as u64));
                }
                Some(_) => continue,
                None => return Err("pid 1 closed the channel without an answer".into()),
            }
        }
    }

    /// The host's side of the sandbox's exec channel.
    fn channel(&self, sandbox_id: &str) -> crate::exec_channel::Pid1Channel {
        let b = self.bundle(sandbox_id);
        crate::exec_channel::Pid1Channel { control: b.broker_control(), token: b.token() }
    }

    /// Writes the sandbox's channel token: a new one at a cold start (also
    /// where pid 1 reads it first), the image's at a restore (its pid 1 holds
    /// that one already; nothing goes where the sandbox could read it).
    fn write_token(b: &bundle::Bundle, image: Option<&Path>) -> Result<(), RuntimeError> {
        let token = crate::exec_channel::token(image.map(|dir| dir.join(image::TOKEN_FILE)).as_deref())?;
        crate::exec_channel::write_token(&b.token(), &token)?;
        if image.is_none() {
            crate::exec_channel::write_token(&b.chan().join(strata_init::channel::TOKEN_NAME), &token)?;
        }
        Ok(())
    }

    /// Keeps the sandbox's token with its process image (a restore's pid 1 holds it).
    fn save_token(&self, id: &str, images_dir: &Path) -> Result<(), RuntimeError> {
        let (from, to) = (self.bundle(id).token(), images_dir.join(image::TOKEN_FILE));
        std::fs::copy(&from, &to)
            .map(drop)
            .map_err(|e| RuntimeError::sys(format!("keep {} with the image", from.display()), e))
    }

    /// SIGKILLs the sandbox's runsc-sandbox process (the sentry), named by the
    /// pid file runsc wrote, if it is still its keeper's child. Whether it was sent.
    fn kill_sentry(&self, id: &str, handle: &SandboxHandle) -> bool {
        let pid = std::fs::read_to_string(self.bundle(id).pid_file()).ok().and_then(|s| s.trim().parse::<i32>().ok());
        let Some(pid) = pid.filter(|p| *p > 1) else { return false };
        crate::namespace::signal_if(pid, libc::SIGKILL, || {
            crate::namespace::parent_of(pid) == Some(handle.init_pid) && self.is_alive(handle)
        })
    }

    fn cgroup(&self, id: &str) -> SandboxCgroup {
        SandboxCgroup::new(&self.cgroup_root, self.cgroup_version, id)
    }

    /// Starts the sandbox described by `bundle` under a keeper (`run
    /// -detach`, or `restore --image-path IMAGE -detach`).
    fn launch(
        &self,
        spec: &SandboxSpec,
        b: &bundle::Bundle,
        image: Option<&Path>,
    ) -> Result<SandboxHandle, RuntimeError> {
        let mut argv = self.global_args();
        let network = if spec.netns_path.is_some() { "sandbox" } else { "none" };
        argv.push(format!("--network={network}"));
        // A checkpoint closes open TCP connections instead of failing on them
        // (as a warm copy's do on the namespace tier).
        argv.push("--net-disconnect-ok".into());
        // Pid 1 connects to its broker on the host; nothing inside may create host sockets.
        argv.push("--host-uds=open".into());
        match image {
            None => argv.push("run".into()),
            Some(dir) => argv.extend(["restore".into(), "--image-path".into(), dir.to_string_lossy().into_owned()]),
        }
        argv.extend([
            "-detach".into(),
            "--bundle".into(),
            b.dir.to_string_lossy().into_owned(),
            "--pid-file".into(),
            b.pid_file().to_string_lossy().into_owned(),
            spec.id.clone(),
        ]);
        let cfg = keeper::KeepConfig {
            argv,
            pid_file: b.pid_file(),
            mask_proc_sys_net: spec.netns_path.is_some(),
            broker: Some((b.chan().join(strata_init::channel::BROKER_NAME), b.broker_control())),
        };
        let log = spec.open_log()?;
        let mut child = {
            let _g = crate::spawn_lock();
            Command::new(&self.helper_exe)
                .arg("_runsc_keep")
                .env_clear()
                .env(keeper::CONFIG_ENV, serde_json::to_string(&cfg).expect("KeepConfig serializes"))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(log)
                .spawn()
                .map_err(|source| RuntimeError::Spawn { what: "gvisor keeper", source })?
        };
        let keeper_pid = child.id() as i32;
        let report = keeper::read_report(child.stdout.take().expect("piped stdout"));
        match report {
            Some(keeper::KeepReport::Ready { sandbox_pid }) => {
                debug!(sandbox = %spec.id, keeper = keeper_pid, sandbox_pid, "gvisor sandbox running");
                let start = process_start_time(keeper_pid)
                    .ok_or_else(|| RuntimeError::Setup("the sandbox exited right after it started".into()))?;
                // The keeper stays our child: the daemon's watch reaps it.
                std::mem::forget(child);
                Ok(SandboxHandle { init_pid: keeper_pid, init_start_time: start })
            }
            other => {
                let _ = child.kill();
                let _ = child.wait();
                let why = match other {
                    Some(keeper::KeepReport::Failed { message }) => message,
                    _ => "the keeper exited without reporting".into(),
                };
                Err(RuntimeError::Setup(format!("{why}{}", log_tail(&spec.log_path))))
            }
        }
    }

    /// A cold start (`image` `None`) or a restore from a process image, on a
    /// bundle made the same way (a restore keeps `/tmp`: it is the sandbox's own).
    fn boot(&self, spec: &SandboxSpec, image: Option<&Path>) -> Result<SandboxHandle, RuntimeError> {
        let t0 = Instant::now();
        let b = self.bundle(&spec.id);
        // Leftovers of an earlier run of this sandbox (a stop that did not finish, a crash):
        // only then is runsc asked (its CLI costs ~25 ms of a ~390 ms create).
        if self.runsc_knows(&spec.id) {
            let _ = self.runsc(&["delete", "-force", &spec.id]);
        }
        bundle::teardown(&LinuxSys, &b);
        let prepared = bundle::prepare(&LinuxSys, spec, &b, image.is_none()).map_err(|e| {
            bundle::teardown(&LinuxSys, &b);
            match e {
                crate::namespace::mounts::SetupError::Image(m) => RuntimeError::Image(m),
                crate::namespace::mounts::SetupError::Host(m) => RuntimeError::Setup(m),
            }
        })?;
        if let Err(e) = Self::write_token(&b, image) {
            bundle::teardown(&LinuxSys, &b);
            return Err(e);
        }
        let config = bundle::config(&bundle::ConfigInputs {
            spec,
            bundle: &b,
            init_binary: &self.init_binary,
            prepared,
            stop_grace_secs: self.stop_grace.as_secs(),
        });
        let path = b.dir.join("config.json");
        if let Err(e) = std::fs::write(&path, serde_json::to_vec_pretty(&config).expect("config serializes")) {
            bundle::teardown(&LinuxSys, &b);
            return Err(RuntimeError::sys(format!("write {}", path.display()), e));
        }
        let t_prepare = t0.elapsed();
        match self.launch(spec, &b, image) {
            Ok(h) => {
                debug!(sandbox = %spec.id, prepare_us = t_prepare.as_micros() as u64, total_us = t0.elapsed().as_micros() as u64, "gvisor sandbox ready");
                Ok(h)
            }
            Err(e) => {
                let _ = self.cleanup(&spec.id);
                Err(e)
            }
        }
    }

    /// `strata-init _runsc_exec` doing `job` in the sandbox.
    fn helper_command(
        &self,
        sandbox_id: &str,
        handle: &SandboxHandle,
        job: strata_init::runsc::Job,
    ) -> Result<Command, RuntimeError> {
        if !self.is_alive(handle) {
            return Err(RuntimeError::Setup("sandbox is not running".into()));
        }
        let b = self.bundle(sandbox_id);
        let hostname = std::fs::read_to_string(b.identity().join("hostname")).unwrap_or_default();
        Ok(self.channel(sandbox_id).helper_command(
            &self.init_binary,
            Some(b.root_link()),
            &hostname,
            b.exec_lock(),
            job,
        ))
    }

    /// Copies `from` (a directory's content) into `to`, which must be empty:
    /// `cp -a` keeps owners, modes, times, links, sparse files and xattrs.
    fn copy_tree(from: &Path, to: &Path) -> Result<(), RuntimeError> {
        std::fs::create_dir_all(to).map_err(|e| RuntimeError::sys(format!("create {}", to.display()), e))?;
        let out = Command::new("cp")
            .args(["-a", "--reflink=auto", "--"])
            .arg(from.join("."))
            .arg(to)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .output()
            .map_err(|source| RuntimeError::Spawn { what: "cp", source })?;
        if !out.status.success() {
            return Err(RuntimeError::Setup(format!(
                "copy {} to {}: {}",
                from.display(),
                to.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }
}

/// How process images are saved: uncompressed. The sentry compresses on its
/// own CPU share (flate, runsc's default), which made a ~100 MiB standby
/// CPU-bound and slow on a busy host; CRIU's images on the namespace tier are
/// uncompressed too, and a resume then has nothing to inflate.
const CHECKPOINT_COMPRESSION: &str = "--compression=none";

/// A sandbox whose connections let go for a checkpoint: holds its exec lock,
/// and when dropped has its broker listen again (pid 1 reconnects; for a
/// sandbox the checkpoint ended, there is no broker left to ask).
struct Detached {
    #[allow(dead_code)]
    lock: std::fs::File,
    control: PathBuf,
}

impl Drop for Detached {
    fn drop(&mut self) {
        if self.control.exists() {
            if let Err(e) = strata_init::channel::listen(&self.control) {
                debug!(error = %e, "the broker did not listen again");
            }
        }
    }
}

/// Runs `argv` + `args` (a short runsc command, stdin empty) and returns
/// its stdout; its stderr on failure.
fn run_output(argv: &[String], args: &[&str]) -> Result<String, String> {
    let out = Command::new(&argv[0])
        .args(&argv[1..])
        .args(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("spawn runsc: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!("runsc {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// The last lines of a sandbox's log (of its last 4 KiB), for an error message.
fn log_tail(path: &Path) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let mut bytes = Vec::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        if f.seek(SeekFrom::End(-4096)).is_err() {
            let _ = f.rewind();
        }
        let _ = f.take(4096).read_to_end(&mut bytes);
    }
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(3)..].join(" | ");
    if tail.is_empty() {
        String::new()
    } else {
        format!(": {tail}")
    }
}

impl Runtime for GvisorRuntime {
    fn name(&self) -> &'static str {
        "gvisor"
    }

    fn start(&self, spec: &SandboxSpec) -> Result<SandboxHandle, RuntimeError> {
        self.boot(spec, None)
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

    fn attach_command(
        &self,
        sandbox_id: &str,
        handle: &SandboxHandle,
        ns_pid: i32,
        stdin: bool,
    ) -> Result<Option<Command>, RuntimeError> {
        self.helper_command(sandbox_id, handle, strata_init::runsc::Job::Attach { pid: ns_pid, stdin }).map(Some)
    }

    fn detach_processes(&self, sandbox_id: &str, _: &SandboxHandle) -> Result<Option<DetachGuard>, RuntimeError> {
        Ok(Some(DetachGuard(Box::new(self.detach(sandbox_id)?))))
    }

    fn stop(&self, sandbox_id: &str, handle: &SandboxHandle, grace: Duration) -> Result<(), RuntimeError> {
        if !grace.is_zero() && self.is_alive(handle) {
            // A paused sandbox acts on no signal.
            let _ = self.runsc(&["resume", sandbox_id]);
            if let Err(e) = self.runsc(&["kill", sandbox_id, "TERM"]) {
                debug!(sandbox = sandbox_id, error = %e, "SIGTERM to the sandbox");
            }
            if !wait_for_exit(handle, grace) {
                warn!(sandbox = sandbox_id, "init ignored SIGTERM for {grace:?}; killing");
            }
        }
        // Killing needs no runsc call (two of them, ~50 ms): the sentry's host
        // process dies, every process of the sandbox with it, paused or not; the
        // gofer and the stubs follow, the keeper reaps them and exits.
        if self.is_alive(handle) && !self.kill_sentry(sandbox_id, handle) {
            let _ = self.runsc(&["kill", sandbox_id, "KILL"]);
        }
        if !wait_for_exit(handle, Duration::from_secs(10)) {
            return Err(RuntimeError::Setup(format!("sandbox {sandbox_id} survives SIGKILL")));
        }
        Ok(())
    }

    fn cleanup(&self, sandbox_id: &str) -> Result<(), RuntimeError> {
        if let Err(e) = self.runsc(&["delete", "-force", sandbox_id]) {
            debug!(sandbox = sandbox_id, error = %e, "runsc delete");
        }
        bundle::teardown(&LinuxSys, &self.bundle(sandbox_id));
        // runsc removes the cgroups it made; anything left (a crash) goes here.
        let cg = self.cgroup(sandbox_id);
        if cg.dirs().iter().any(|d| d.exists()) {
            cg.remove()?;
        }
        Ok(())
    }

    fn set_frozen(&self, sandbox_id: &str, frozen: bool) -> Result<(), RuntimeError> {
        self.runsc(&[if frozen { "pause" } else { "resume" }, sandbox_id]).map_err(RuntimeError::Setup)
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
        // Pid 1 holds the terminal's master: it resizes it.
        self.channel(sandbox_id).resize(sandbox_id, ns_pid, size)
    }

    fn process_dump_unsupported(&self) -> Option<String> {
        None
    }

    fn dump_processes(
        &self,
        sandbox_id: &str,
        handle: &SandboxHandle,
        images_dir: &Path,
    ) -> Result<PathBuf, RuntimeError> {
        std::fs::create_dir_all(images_dir)
            .map_err(|e| RuntimeError::sys(format!("create {}", images_dir.display()), e))?;
        let t = Instant::now();
        // Held until the sandbox is gone: an exec meanwhile finds it gone.
        let _lock = self.detach(sandbox_id)?;
        let detached = t.elapsed();
        let dir = images_dir.to_string_lossy();
        self.runsc(&["checkpoint", CHECKPOINT_COMPRESSION, "--image-path", &dir, sandbox_id])
            .map_err(RuntimeError::Setup)?;
        let saved = t.elapsed();
        self.image_host().save(images_dir).map_err(|e| RuntimeError::sys("record the image's host", e))?;
        self.save_token(sandbox_id, images_dir)?;
        // The sentry exits once saved; its keeper follows.
        if !wait_for_exit(handle, Duration::from_secs(10)) {
            warn!(sandbox = sandbox_id, "the sandbox's keeper outlives its checkpoint");
        }
        debug!(
            sandbox = sandbox_id,
            detach_ms = detached.as_millis() as u64,
            checkpoint_ms = (saved - detached).as_millis() as u64,
            exit_ms = (t.elapsed() - saved).as_millis() as u64,
            "runsc checkpoint"
        );
        Ok(self.init_binary.clone())
    }

    fn copy_processes(&self, sandbox_id: &str, _: &SandboxHandle, images_dir: &Path) -> Result<PathBuf, RuntimeError> {
        // The clients let go in detach_processes, before the sandbox was paused.
        std::fs::create_dir_all(images_dir)
            .map_err(|e| RuntimeError::sys(format!("create {}", images_dir.display()), e))?;
        let dir = images_dir.to_string_lossy();
        self.runsc(&["checkpoint", CHECKPOINT_COMPRESSION, "--leave-running", "--image-path", &dir, sandbox_id])
            .map_err(RuntimeError::Setup)?;
        // A copy starts in another sandbox, whose scratch /tmp is its own: it takes
        // this one's along (a /tmp of the root is in the checkpoint's filesystem).
        if let Some(tmp) = bundle::tmp_dir_of(&self.bundle(sandbox_id)).map_err(RuntimeError::Setup)? {
            Self::copy_tree(&tmp, &images_dir.join(COPIED_TMP))?;
        }
        self.image_host().save(images_dir).map_err(|e| RuntimeError::sys("record the image's host", e))?;
        self.save_token(sandbox_id, images_dir)?;
        Ok(self.init_binary.clone())
    }

    fn restore_processes(
        &self,
        spec: &SandboxSpec,
        images_dir: &Path,
        _work_dir: &Path,
        _helper: &Path,
        _inherit: &[(std::os::fd::RawFd, u64)],
        _memory: crate::MemoryRestore,
    ) -> Result<SandboxHandle, RuntimeError> {
        let made_on = image::ImageHost::load(images_dir).map_err(RuntimeError::Setup)?;
        if let Some(why) = made_on.mismatch(&self.image_host()) {
            return Err(RuntimeError::Incompatible(why));
        }
        let copied_tmp = images_dir.join(COPIED_TMP);
        if copied_tmp.is_dir() && !bundle::scratch_tmp(spec) {
            // The sentry refers to the /tmp it was saved with: the layout must be the same.
            return Err(RuntimeError::Incompatible(
                "the image was copied from a sandbox with a scratch /tmp, and this sandbox's /tmp is part of its filesystem".into(),
            ));
        }
        if copied_tmp.is_dir() {
            // A copy: its /tmp comes from the image (emptied first, as at a cold start).
            let tmp = bundle::tmp_dir(spec);
            bundle::remove_tree(&tmp).map_err(|e| RuntimeError::sys(format!("empty {}", tmp.display()), e))?;
            Self::copy_tree(&copied_tmp, &tmp)?;
        }
        self.boot(spec, Some(images_dir))
    }

    fn reidentify(&self, spec: &SandboxSpec, _: &SandboxHandle) -> Result<(), RuntimeError> {
        // The files under /run/strata and /etc/hostname are the new sandbox's
        // already (its own bundle); the kernel's hostname is the sentry's, restored.
        self.exec_init(&spec.id, &["CAP_SYS_ADMIN"], &["_hostname", &spec.hostname])
            .map(|_| ())
            .map_err(|e| RuntimeError::Setup(format!("give the restored copy its hostname: {e}")))
    }

    fn interrupted_restore(&self, sandbox_id: &str, _: &Path) -> InterruptedRestore {
        if !self.runsc_knows(sandbox_id) {
            return InterruptedRestore::None;
        }
        // A restore the daemon did not record: its keeper was the old daemon's
        // child. Ending it leaves the image as it was (runsc only reads it).
        let _ = self.runsc(&["delete", "-force", sandbox_id]);
        InterruptedRestore::Gone
    }

    fn restore_leftovers(&self, _: &Path) -> Option<PathBuf> {
        // runsc writes nothing into the image; its log is the sandbox's.
        None
    }

    fn net_sockets(&self, _: &SandboxHandle, _: Duration) -> Result<Box<dyn NetSockets>, RuntimeError> {
        Err(RuntimeError::Unsupported(
            "sockets in a gVisor sandbox's network (its ports are reached through its pid 1)".into(),
        ))
    }

    /// The sentry's network stack is its own: a server on the sandbox's
    /// loopback is reached through pid 1, which relays over its broker connection.
    fn ports_through_pid1(&self) -> bool {
        true
    }

    fn pid1_channel(&self, sandbox_id: &str) -> Option<crate::exec_channel::Pid1Channel> {
        Some(self.channel(sandbox_id))
    }

    fn open_root(&self, sandbox_id: &str, _: &SandboxHandle) -> std::io::Result<OwnedFd> {
        // The bundle's link names the overlay mount on the host (with /tmp on it).
        std::fs::File::open(self.bundle(sandbox_id).root_link()).map(OwnedFd::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_dated_and_old_ones_refused() {
        assert_eq!(version_date("runsc version 0.0~20240729.0"), Some(20240729));
        assert_eq!(version_date("runsc version release-20250512.0"), Some(20250512));
        assert_eq!(version_date("runsc version 0.0~20221219.0"), Some(20221219));
        let old = GvisorProbe {
            runsc: Some("/usr/bin/runsc".into()),
            version: Some("runsc version 0.0~20221219.0".into()),
            platform: "systrap",
        };
        assert!(old.unavailable().unwrap().contains("needs runsc 20240729"), "{:?}", old.unavailable());
        let new = GvisorProbe { version: Some("runsc version 0.0~20240729.0".into()), ..old.clone() };
        assert_eq!(new.unavailable(), None);
        assert!(new.detail().contains("platform systrap"));
        let none = GvisorProbe { runsc: None, version: None, platform: "systrap" };
        assert!(none.unavailable().unwrap().contains("not installed"));
    }
}
