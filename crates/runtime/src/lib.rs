//! Isolation tiers for strata sandboxes, behind one trait.
//!
//! * [`Runtime`]: what the daemon needs from a tier (start init, build an exec
//!   command, stop, clean up, freeze, read resource counters, dump and restore
//!   processes).
//! * [`namespace`]: the default Linux tier (overlay root, pid/mount/uts/ipc/net/
//!   cgroup namespaces, pivot_root, dropped capabilities, no_new_privs, seccomp,
//!   cgroup v1/v2 limits, CRIU for standby and warm checkpoints).
//! * [`sys`]: the privileged system calls of the namespace tier's setup (mount,
//!   pivot_root, unshare, setns, ...) behind `trait Sys`: `LinuxSys` makes them,
//!   `RecordingSys` records them, so the setup sequences are unit-tested
//!   without root.
//! * [`cgroup`]: cgroup v1/v2 limits, freezer and counters, rooted at a path.
//! * [`disk`]: the per-sandbox disk limit: an ext4 image per sandbox on a loop
//!   device (`LOOP_CONFIGURE`), mounted in-process, and the pool of ready disks.
//! * [`exec_channel`]: the host's side of pid 1's exec channel (the gVisor
//!   and microvm tiers'): the exec helper's command, signals, terminal sizes.
//! * [`gvisor`]: the gVisor tier (runsc: a user-space kernel between the
//!   sandbox and the host) on the same overlay root, keeper and exec shim.
//! * [`microvm`]: the QEMU microvm tier (a guest kernel per sandbox).
//! * [`probe`]: host capability checks behind `strata doctor`.
//! * [`spec`]: what the daemon hands to a tier ([`SandboxSpec`], [`ExecSpec`]).
//! * [`openat2`]: opening paths inside a sandbox's tree without leaving it.
//! * `fake` (cargo feature `fake`): `FakeRuntime`, an in-memory [`Runtime`]
//!   for other crates' unit tests: no processes, no root.
//!
//! What lives here: everything that touches the host to isolate a sandbox
//! (namespaces, mounts, cgroups, seccomp, CRIU) and the probes of what the
//! host offers. What may not: tokio or any async runtime, HTTP (axum, hyper),
//! the store or lifecycle rules. The runtime is synchronous: every call is
//! blocking but short, and long-running work (waiting for processes) is left
//! to the caller.

pub mod cgroup;
pub mod disk;
pub mod exec_channel;
#[cfg(any(test, feature = "fake"))]
pub mod fake;
pub mod gvisor;
pub mod microvm;
pub mod namespace;
/// `openat2(2)` (strata-init's: the host-side exec helper of the gVisor tier uses it too).
pub use strata_init::openat2;
pub mod probe;
pub mod spec;
pub mod sys;

use std::path::PathBuf;
use std::time::Duration;

pub use spec::{ExecSpec, SandboxSpec};

/// Errors of the runtime layer.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// A required host feature is missing.
    #[error("unsupported on this host: {0}")]
    Unsupported(String),
    /// The sandbox's init failed during setup; the message comes from inside.
    #[error("sandbox setup failed: {0}")]
    Setup(String),
    /// The image cannot run as a sandbox (its tree has a file or symlink where
    /// strata mounts something): the caller's input, not the host's fault.
    #[error("the image cannot run as a sandbox: {0}")]
    Image(String),
    /// A process image was made where this host cannot bring it back (another
    /// runsc, platform or CPU): the image is kept, the reason said.
    #[error("the process image cannot be restored on this host: {0}")]
    Incompatible(String),
    /// The sandbox asks for settings a process image cannot come back with
    /// (a microVM copy of another memory size, vCPU count, disk or network
    /// than its source): the caller's request, not the host's fault.
    #[error("the sandbox does not fit the process image: {0}")]
    Shape(String),
    /// The sandbox's pid 1 refused a request (a port nothing listens on, a
    /// directory that is not there): its reason, a file operation's as JSON
    /// ([`strata_init::guestfs::FsFailure`]).
    #[error("the sandbox's init refused: {0}")]
    Refused(String),
    /// A cgroup operation failed.
    #[error(transparent)]
    Cgroup(#[from] cgroup::CgroupError),
    /// Spawning a helper process failed.
    #[error("spawning {what}")]
    Spawn {
        /// Which helper.
        what: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A system call failed.
    #[error("{what}")]
    Sys {
        /// What was attempted.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl RuntimeError {
    /// Wraps an errno-style failure with a description.
    pub fn sys(what: impl Into<String>, source: impl Into<std::io::Error>) -> Self {
        RuntimeError::Sys { what: what.into(), source: source.into() }
    }
}

static SPAWN_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Sets the nice value of thread `tid` (0: the calling thread), e.g. to run a
/// boot in the background and to give its init the normal priority back.
pub fn set_nice(tid: i32, nice: i32) -> std::io::Result<()> {
    // SAFETY: setpriority takes plain integers and touches no memory of ours.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Serializes process spawns that hand a child a descriptor by clearing its
/// close-on-exec flag for the duration of the spawn (so that no concurrent spawn
/// inherits it). Every spawn in the daemon takes it; spawns then use
/// `posix_spawn` (no `pre_exec` hook), which avoids copying the daemon's page tables.
pub fn spawn_lock() -> std::sync::MutexGuard<'static, ()> {
    SPAWN_LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Lets the next spawned child inherit `fd` (clears its close-on-exec flag).
/// Call it with [`spawn_lock`] held, and drop the descriptor after the spawn.
pub fn inherit_in_next_spawn(
    _lock: &std::sync::MutexGuard<'static, ()>,
    fd: std::os::fd::BorrowedFd<'_>,
) -> std::io::Result<()> {
    let flags = nix::fcntl::FdFlag::empty();
    nix::fcntl::fcntl(std::os::fd::AsRawFd::as_raw_fd(&fd), nix::fcntl::FcntlArg::F_SETFD(flags))
        .map(drop)
        .map_err(std::io::Error::from)
}

/// A helper process to spawn ([`Runtime::exec_command`]): the command, and a
/// descriptor that must stay open until it was spawned (the program it runs
/// may be that descriptor, as `/proc/self/fd/N`).
#[derive(Debug)]
pub struct HelperCommand {
    /// The command.
    pub cmd: std::process::Command,
    /// Kept open until the command was spawned, then dropped.
    pub held: Option<std::os::fd::OwnedFd>,
}

impl From<std::process::Command> for HelperCommand {
    fn from(cmd: std::process::Command) -> Self {
        HelperCommand { cmd, held: None }
    }
}

/// A started sandbox: enough to find it again after a daemon restart.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SandboxHandle {
    /// Host pid of the sandbox's init (pid 1 inside).
    pub init_pid: i32,
    /// Kernel start time of init (field 22 of /proc/PID/stat), to detect pid reuse.
    pub init_start_time: u64,
}

/// Resource counters of a sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceUsage {
    /// Processes killed by the OOM killer inside the sandbox's memory limit.
    pub oom_kills: u64,
    /// Memory charged to the sandbox now, in bytes.
    pub memory_bytes: u64,
    /// Number of tasks in the sandbox.
    pub pids: u64,
    /// CPU time consumed by the sandbox's tasks since its cgroup was created,
    /// in microseconds (v1 `cpuacct.usage`, v2 `cpu.stat` `usage_usec`).
    pub cpu_usec: u64,
}

/// Failure injection for crash and error-path tests: `STRATA_FAILPOINTS` (a
/// comma-separated list, read once at start) names the points that fail with
/// the error a full disk gives (ENOSPC); `NAME:crash` aborts the daemon there
/// instead (a kill -9 at that step). Unset in production.
pub fn failpoint(name: &str) -> std::io::Result<()> {
    static POINTS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let points = POINTS.get_or_init(|| {
        std::env::var("STRATA_FAILPOINTS")
            .map(|v| v.split(',').map(|s| s.trim().to_string()).collect())
            .unwrap_or_default()
    });
    if points.iter().any(|p| p == name) {
        tracing::warn!(failpoint = name, "failpoint triggered");
        return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
    }
    if points.iter().any(|p| p.strip_suffix(":crash") == Some(name)) {
        tracing::error!(failpoint = name, "failpoint: crashing the daemon");
        std::process::abort();
    }
    Ok(())
}

/// What a restore the daemon did not record left ([`Runtime::interrupted_restore`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InterruptedRestore {
    /// No restore was started from the image.
    None,
    /// One was, and its init runs in the sandbox: the resume completed.
    Running(SandboxHandle),
    /// One was, and nothing of it runs: clean up, the image stays.
    Gone,
}

/// Makes TCP sockets inside one sandbox's network, for connections from the
/// host into it (the preview proxy's): each socket is a new, unconnected,
/// non-blocking IPv4 stream socket made in the sandbox's network; the caller
/// connects it (a socket stays in the network it was made in). How is the
/// tier's: the namespace tier keeps one thread in the sandbox's network
/// namespace; a VM tier would forward over its host channel.
pub trait NetSockets: Send + Sync {
    /// Asks for one socket; `reply` gets it, possibly on another thread.
    /// `false` when this maker has ended (idle for its time, or the sandbox's
    /// network is gone): make a new one.
    fn socket(&self, reply: Box<dyn FnOnce(std::io::Result<std::os::fd::OwnedFd>) + Send>) -> bool;
}

/// How a restore brings the processes' memory back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryRestore {
    /// Every page is in place before the processes run again.
    Eager,
    /// Where the tier and the host can ([`Runtime::lazy_restore_unsupported`]):
    /// the processes run again at once, each missing page is filled in when
    /// first touched and the rest in the background ([`Runtime::memory_fill`]
    /// follows it to the last page); elsewhere eager.
    Lazy,
}

/// The background fill of a lazily restored sandbox's memory.
pub trait PageFill: Send + Sync {
    /// Blocks until the fill has ended: `Ok` with the time from the
    /// restore's start until every page was resident, `Err` with why pages
    /// are missing (the restored processes must not run on: what they have
    /// not read yet would read as zeros).
    fn wait(&self) -> Result<Duration, String>;
}

/// Held while the processes of a sandbox are detached from the daemon's pipes
/// for a copy ([`Runtime::detach_processes`]): no new process starts in the
/// sandbox until it is dropped.
pub struct DetachGuard(pub Box<dyn std::any::Any + Send>);

/// An isolation tier.
///
/// Implementations must be cheap to share between threads; every method is
/// blocking but short, except [`Runtime::stop`], which waits up to its grace period.
pub trait Runtime: Send + Sync {
    /// Tier name (`namespace`, `gvisor`, `microvm`).
    fn name(&self) -> &'static str;

    /// Creates cgroups and starts the sandbox's init on its root filesystem.
    /// Returns once init has finished setting up (or failed, with the reason).
    fn start(&self, spec: &SandboxSpec) -> Result<SandboxHandle, RuntimeError>;

    /// Whether the sandbox's init is still the process recorded in `handle`.
    fn is_alive(&self, handle: &SandboxHandle) -> bool;

    /// A command that, when spawned with the caller's stdio, runs `exec` inside the
    /// sandbox. It reports [`spec::ExecReport`] lines on the inherited descriptor
    /// the caller names in `STRATA_REPORT_FD` (spawn it under [`spawn_lock`]).
    fn exec_command(
        &self,
        sandbox_id: &str,
        handle: &SandboxHandle,
        exec: &ExecSpec,
    ) -> Result<HelperCommand, RuntimeError>;

    /// Whether restored (or detached) processes get their pipes back through
    /// [`Runtime::attach_command`] rather than from the restore itself.
    fn attaches_by_command(&self) -> bool {
        false
    }

    /// A command that, spawned as [`Runtime::exec_command`]'s is, takes over
    /// the stdio and the exit report of the sandbox's process `ns_pid`, which
    /// a restore or a copy brought back without its pipes to the daemon
    /// (`stdin`: the caller feeds its stdin). `None`: this tier's restore
    /// reconnects the pipes itself (the `inherit` of [`Runtime::restore_processes`]).
    fn attach_command(
        &self,
        _sandbox_id: &str,
        _handle: &SandboxHandle,
        _ns_pid: i32,
        _stdin: bool,
    ) -> Result<Option<std::process::Command>, RuntimeError> {
        Ok(None)
    }

    /// Before [`Runtime::copy_processes`] of a running sandbox: the processes
    /// started through the API let go of the daemon's pipes (their supervisors
    /// take them back with [`Runtime::attach_command`] afterwards) and no new
    /// one starts until the guard is dropped. `None`: this tier copies
    /// processes together with their pipes.
    fn detach_processes(
        &self,
        _sandbox_id: &str,
        _handle: &SandboxHandle,
    ) -> Result<Option<DetachGuard>, RuntimeError> {
        Ok(None)
    }

    /// Stops every process of the sandbox: SIGTERM, then SIGKILL after `grace`.
    fn stop(&self, sandbox_id: &str, handle: &SandboxHandle, grace: Duration) -> Result<(), RuntimeError>;

    /// Releases host resources (cgroups) of a sandbox with no processes left.
    fn cleanup(&self, sandbox_id: &str) -> Result<(), RuntimeError>;

    /// Freezes (`true`) or thaws every process of the sandbox (memory kept, no CPU).
    fn set_frozen(&self, sandbox_id: &str, frozen: bool) -> Result<(), RuntimeError>;

    /// Current resource counters.
    fn usage(&self, sandbox_id: &str) -> ResourceUsage;

    /// Changes the CPU quota and process limit of a running sandbox (`None`:
    /// no limit), as a warm-pool sandbox gets its adopter's at adoption.
    fn set_cpus_and_pids(&self, sandbox_id: &str, cpus: Option<f64>, pids: Option<u64>) -> Result<(), RuntimeError> {
        let _ = (cpus, pids);
        Err(RuntimeError::Unsupported(format!(
            "the {} tier cannot change the limits of sandbox {sandbox_id} while it runs",
            self.name()
        )))
    }

    /// Directory where the tier keeps per-sandbox runtime files.
    fn run_dir(&self) -> PathBuf;

    /// Sends `signal` to the sandbox's process whose pid inside is `ns_pid`
    /// (with `group`, to every process of the sandbox in its process group, which
    /// it leads). Each target is held by a pidfd and checked to be that process
    /// of this sandbox before it is signalled, so a pid recycled meanwhile is
    /// never hit. Returns how many processes were signalled.
    fn signal(&self, sandbox_id: &str, ns_pid: i32, signal: i32, group: bool) -> usize;

    /// Resizes the pseudo-terminal of the sandbox's process `ns_pid`, which
    /// runs on `/dev/pts/<tty_index>` inside (the index its exec reported,
    /// where the tier reports one). Its foreground process group gets SIGWINCH.
    fn resize_tty(
        &self,
        sandbox_id: &str,
        handle: &SandboxHandle,
        ns_pid: i32,
        tty_index: Option<u32>,
        size: spec::TtySize,
    ) -> Result<(), RuntimeError>;

    /// Why the processes of a sandbox cannot be dumped for standby on this host
    /// (`None`: they can).
    fn process_dump_unsupported(&self) -> Option<String>;

    /// Dumps every process of the sandbox (tree, memory, open files) into
    /// `images_dir` and ends them; on failure they keep running. Returns the
    /// helper binary the images refer to (needed to restore them).
    fn dump_processes(
        &self,
        sandbox_id: &str,
        handle: &SandboxHandle,
        images_dir: &std::path::Path,
    ) -> Result<PathBuf, RuntimeError>;

    /// Copies every process of a sandbox the caller has frozen
    /// ([`Runtime::set_frozen`]) into `images_dir`, leaving them running and
    /// still frozen: the process part of a checkpoint, taken at the instant
    /// its filesystem was read. Established TCP connections are recorded as
    /// closed (a copy cannot continue them). Returns the helper binary the
    /// images refer to.
    fn copy_processes(
        &self,
        sandbox_id: &str,
        handle: &SandboxHandle,
        images_dir: &std::path::Path,
    ) -> Result<PathBuf, RuntimeError>;

    /// Brings back processes dumped by [`Runtime::dump_processes`] (or copied
    /// by [`Runtime::copy_processes`]) on a filesystem with the content they
    /// were dumped with: the sandbox's own, or a new sandbox's made from the
    /// same checkpoint. `inherit` are open descriptors of this process that
    /// replace the dumped pipes with the given inodes. CRIU's log and pid file
    /// go to `work_dir` (images shared by several restores are only read).
    fn restore_processes(
        &self,
        spec: &SandboxSpec,
        images_dir: &std::path::Path,
        work_dir: &std::path::Path,
        helper: &std::path::Path,
        inherit: &[(std::os::fd::RawFd, u64)],
        memory: MemoryRestore,
    ) -> Result<SandboxHandle, RuntimeError>;

    /// Why this tier cannot restore the memory of a sandbox (in a user
    /// namespace of its own, or not) lazily on this host (`None`: it can).
    fn lazy_restore_unsupported(&self, userns: bool) -> Option<String> {
        let _ = userns;
        Some(format!("the {} tier restores memory eagerly", self.name()))
    }

    /// The fill of the sandbox's last restore while pages are still coming
    /// in (`None`: its memory is all resident). Dumps of the sandbox wait
    /// for it themselves: a dump taken mid-fill would save only the pages
    /// already filled.
    fn memory_fill(&self, sandbox_id: &str) -> Option<std::sync::Arc<dyn PageFill>> {
        let _ = sandbox_id;
        None
    }

    /// After a daemon restart: the fill of a lazy restore of `sandbox_id`
    /// from `image_dir` that the previous daemon started and did not see end
    /// (its processes may still miss pages), followed on from here, as
    /// [`Runtime::memory_fill`] follows one of this daemon's; `None` when
    /// there is none.
    fn adopt_fill(&self, sandbox_id: &str, image_dir: &std::path::Path) -> Option<std::sync::Arc<dyn PageFill>> {
        let _ = (sandbox_id, image_dir);
        None
    }

    /// Gives restored processes the identity of `spec` (hostname, sandbox id,
    /// machine id, fork generation) where a restore brought back the identity
    /// of the sandbox they were copied from.
    fn reidentify(&self, spec: &SandboxSpec, handle: &SandboxHandle) -> Result<(), RuntimeError>;

    /// After a daemon restart, for a sandbox recorded in standby: what a
    /// [`Runtime::restore_processes`] from `image_dir` that the daemon did not
    /// record (it stopped first) left of the sandbox `sandbox_id`.
    fn interrupted_restore(&self, sandbox_id: &str, image_dir: &std::path::Path) -> InterruptedRestore;

    /// Removes what a restore left in `image_dir` (so the image can be
    /// restored again) and returns where its log went, if it wrote one.
    fn restore_leftovers(&self, image_dir: &std::path::Path) -> Option<PathBuf>;

    /// A maker of sockets inside the network of the sandbox whose init is
    /// `handle`, which ends after `idle` without requests (so it does not pin
    /// the sandbox's network).
    fn net_sockets(&self, handle: &SandboxHandle, idle: Duration) -> Result<Box<dyn NetSockets>, RuntimeError>;

    /// Whether the sandbox's ports are reached through its pid 1
    /// ([`Runtime::pid1_stream`] with [`strata_init::spawner::Request::Connect`]:
    /// a microVM, whose guest's loopback nothing on the host reaches) rather
    /// than by a socket in its network ([`Runtime::net_sockets`]).
    fn ports_through_pid1(&self) -> bool {
        false
    }

    /// The channel to the sandbox's pid 1, on the tiers whose processes pid
    /// 1 starts (gVisor, microvm); `None` where the host reaches them itself.
    fn pid1_channel(&self, sandbox_id: &str) -> Option<exec_channel::Pid1Channel> {
        let _ = sandbox_id;
        None
    }

    /// Opens a stream to the sandbox's pid 1 for `req`, a request whose
    /// stream goes on after pid 1's first answer (a port's relay, a directory
    /// watch in a microVM's guest), waiting up to `patience` for that answer:
    /// the stream (blocking) and the answer's payload. Pid 1's refusal is
    /// [`RuntimeError::Refused`]; a tier without [`Runtime::pid1_channel`]
    /// answers [`RuntimeError::Unsupported`].
    fn pid1_stream(
        &self,
        sandbox_id: &str,
        req: &strata_init::spawner::Request,
        patience: Duration,
    ) -> Result<(std::os::unix::net::UnixStream, Vec<u8>), RuntimeError> {
        match self.pid1_channel(sandbox_id) {
            Some(channel) => channel.runtime_stream(&format!("{} sandbox {sandbox_id}", self.name()), req, patience),
            None => Err(RuntimeError::Unsupported(format!(
                "sandbox {sandbox_id}'s ports and files are reached from the host ({} tier)",
                self.name()
            ))),
        }
    }

    /// Opens the sandbox's root directory as the host sees it, with every
    /// mount whose files the sandbox shares with the host (what the file API
    /// works on): `/proc/<init>/root` on the namespace tier, the overlay
    /// mount (with its `/tmp`) on the gVisor tier. Needs the daemon's
    /// privileges (a non-dumpable init's root takes CAP_SYS_PTRACE).
    fn open_root(&self, sandbox_id: &str, handle: &SandboxHandle) -> std::io::Result<std::os::fd::OwnedFd>;

    /// Whether a process image of this tier holds the sandbox's secret
    /// files: a microVM's are a tmpfs in its guest's RAM, which its snapshot
    /// saves. Such a sandbox's standby keeps only its filesystem, as one with
    /// secrets in its processes' environment does.
    fn process_image_holds_secrets(&self) -> bool {
        false
    }

    /// A file operation in a running sandbox of a [`Runtime::layer_in_guest`]
    /// tier, done by its guest ([`strata_init::guestfs`]): `input` is what an
    /// upload sends, the answer (at most `limit` bytes) goes to `out`.
    fn guest_fs(
        &self,
        sandbox_id: &str,
        op: &strata_init::guestfs::FsOp,
        input: Option<&mut dyn std::io::Read>,
        out: &mut dyn std::io::Write,
        limit: u64,
    ) -> Result<(), strata_init::guestfs::FsFailure> {
        let _ = (op, input, out, limit);
        Err(strata_init::guestfs::FsFailure {
            errno: libc::ENOSYS,
            path: String::new(),
            message: format!("sandbox {sandbox_id}'s files are on the host ({})", self.name()),
            rule: None,
        })
    }

    /// Whether the host must never read this tier's writable layer where it
    /// lies: a guest kernel writes its disk's blocks (the microvm tier), so
    /// mounting it would put the host's file system driver in reach of the
    /// guest. The engine then reads the layer only through [`Runtime::read_guest_layer`]
    /// and wipes flush paths through [`Runtime::guest_flush`].
    fn layer_in_guest(&self) -> bool {
        false
    }

    /// For a running sandbox of a [`Runtime::layer_in_guest`] tier: with its
    /// guest's disk frozen (every write on the device, writers waiting),
    /// hands the guest's entries of the writable layer to `choose`, which
    /// says which of them to write to `out` as an OCI layer tar (none, when
    /// `out` is `None`); thaws the disk and returns how long it stayed
    /// frozen. `while_frozen` runs after the tar is written, before the
    /// thaw (a warm checkpoint copies the VM there, so its disk matches the
    /// layer). What the guest sends is untrusted: the caller validates the
    /// entries and unpacks the tar with the hardened unpacker.
    fn read_guest_layer(
        &self,
        sandbox_id: &str,
        choose: &mut dyn FnMut(Vec<strata_init::layer::Entry>) -> Vec<strata_init::layer::Item>,
        out: Option<&mut dyn std::io::Write>,
        while_frozen: &mut dyn FnMut(),
    ) -> Result<Duration, RuntimeError> {
        let _ = (choose, out, while_frozen);
        Err(RuntimeError::Unsupported(format!(
            "reading sandbox {sandbox_id}'s layer through its guest ({})",
            self.name()
        )))
    }

    /// For a running sandbox of a [`Runtime::layer_in_guest`] tier: its
    /// guest wipes flush `paths` (`~/` is the home of `user`); a report line per path.
    fn guest_flush(&self, sandbox_id: &str, paths: &[String], user: Option<&str>) -> Result<Vec<String>, RuntimeError> {
        let _ = (paths, user);
        Err(RuntimeError::Unsupported(format!("flushing sandbox {sandbox_id} through its guest ({})", self.name())))
    }
}
