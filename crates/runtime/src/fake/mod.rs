//! [`FakeRuntime`]: an in-memory [`Runtime`] for other crates' unit tests
//! (cargo feature `fake`). It starts nothing, needs no root, and answers at once.
//!
//! What it does:
//! * hands out unique handles: init pids count up from [`FIRST_PID`] (above
//!   the kernel's `PID_MAX_LIMIT`, so no host process has one: a `kill`,
//!   `pidfd_open` or `/proc/<pid>` on it fails instead of reaching a real
//!   process), start times count up from 1;
//! * keeps, per sandbox, whether its init is alive, whether it is frozen,
//!   whether it was stopped, whether its cgroup exists, and its identity
//!   ([`FakeSandbox`]), and enforces the contract the real tier relies on:
//!   `start` of a sandbox whose init is alive, `cleanup` while it is alive,
//!   `set_frozen` without a cgroup, `dump_processes` of a frozen sandbox (CRIU
//!   would stall) and `copy_processes` of a thawed one fail, and every call that
//!   needs a live init fails without one, with the real tier's message;
//! * records every call in order ([`Call`]), so a test can assert e.g.
//!   "dump_processes, then cleanup" ([`FakeRuntime::actions`]);
//! * fails the next call of an operation, for any sandbox or for one, with the
//!   error it is given ([`FakeRuntime::fail_next`], [`FakeRuntime::fail_next_for`]);
//! * lets the init die ([`FakeRuntime::kill`]): `is_alive` answers false;
//! * writes a small marker file ([`IMAGE_FILE`]) into `images_dir` on dump and
//!   copy, and restores only from a directory holding one; the helper path it
//!   returns ([`FakeRuntime::helper_path`]) is an existing file;
//! * answers `process_dump_unsupported` as configured (default: supported);
//! * `exec_command` returns a harmless `/bin/sh` command that writes the
//!   report lines the caller expects on `STRATA_REPORT_FD` (`ns_pid`, then
//!   `exited`/`signaled`, or `spawn_error`) and the output a test scripted
//!   ([`FakeExec`], [`FakeRuntime::set_exec`]).
//!
//! What it does not simulate: the user's command never runs (nothing of
//! `ExecSpec` but its presence is used, unless the [`FakeRuntime::set_exec`]
//! handler looks at it); processes started through `exec_command` are not
//! tracked (the shell ends on its own; `signal` reaches none of them, it only
//! counts: 1 for pid 1 or a pid it handed out while the init is alive, else
//! 0; SIGKILL to pid 1 kills the init); no grace period (`stop` returns at
//! once); no files inside the sandbox (`reidentify` records the identity,
//! the root filesystem is never mounted); no resource accounting
//! (`usage` is what [`FakeRuntime::set_usage`] set, else 1 task while alive);
//! the images hold no process state; and nothing outlives the value (a
//! "daemon restart" is a new `FakeRuntime` plus [`FakeRuntime::adopt`]).

mod exec;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use exec::{FakeExec, FakeExit};

use crate::cgroup::CgroupError;
use crate::spec::{ExecSpec, SandboxSpec};
use crate::{ResourceUsage, Runtime, RuntimeError, SandboxHandle};

/// The first init pid the fake hands out: above `PID_MAX_LIMIT` (2^22).
pub const FIRST_PID: i32 = (1 << 22) + 1;

/// The marker file a fake dump or copy writes into its images directory.
pub const IMAGE_FILE: &str = "fake-processes.json";

/// The helper binary fake images "refer to", in the run directory.
pub const HELPER_FILE: &str = "fake-strata-init";

/// An operation of [`Runtime`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// [`Runtime::start`].
    Start,
    /// [`Runtime::is_alive`].
    IsAlive,
    /// [`Runtime::exec_command`].
    ExecCommand,
    /// [`Runtime::stop`].
    Stop,
    /// [`Runtime::cleanup`].
    Cleanup,
    /// [`Runtime::set_frozen`].
    SetFrozen,
    /// [`Runtime::usage`].
    Usage,
    /// [`Runtime::set_cpus_and_pids`].
    SetCpusAndPids,
    /// [`Runtime::signal`].
    Signal,
    /// [`Runtime::resize_tty`].
    ResizeTty,
    /// [`Runtime::process_dump_unsupported`].
    ProcessDumpUnsupported,
    /// [`Runtime::dump_processes`].
    DumpProcesses,
    /// [`Runtime::copy_processes`].
    CopyProcesses,
    /// [`Runtime::restore_processes`].
    RestoreProcesses,
    /// [`Runtime::reidentify`].
    Reidentify,
    /// A socket maker for a sandbox's network ([`Runtime::net_sockets`]).
    NetSockets,
}

impl Op {
    /// The method's name (`dump_processes`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Start => "start",
            Op::IsAlive => "is_alive",
            Op::ExecCommand => "exec_command",
            Op::Stop => "stop",
            Op::Cleanup => "cleanup",
            Op::SetFrozen => "set_frozen",
            Op::Usage => "usage",
            Op::SetCpusAndPids => "set_cpus_and_pids",
            Op::Signal => "signal",
            Op::ResizeTty => "resize_tty",
            Op::ProcessDumpUnsupported => "process_dump_unsupported",
            Op::DumpProcesses => "dump_processes",
            Op::CopyProcesses => "copy_processes",
            Op::RestoreProcesses => "restore_processes",
            Op::Reidentify => "reidentify",
            Op::NetSockets => "net_sockets",
        }
    }

    /// Whether the operation only reads (`is_alive`, `usage`,
    /// `process_dump_unsupported`): [`FakeRuntime::actions`] leaves these out.
    pub fn is_query(self) -> bool {
        matches!(self, Op::IsAlive | Op::Usage | Op::ProcessDumpUnsupported)
    }

    /// Whether the operation returns a `Result` (only those can be made to fail).
    pub fn can_fail(self) -> bool {
        !matches!(self, Op::IsAlive | Op::Usage | Op::Signal | Op::ProcessDumpUnsupported)
    }
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One recorded call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The operation.
    pub op: Op,
    /// The sandbox it concerned (for `is_alive`, the one the handle belongs
    /// to, if any; `None` for `process_dump_unsupported`).
    pub sandbox: Option<String>,
    /// The other arguments, for reading (`frozen=true`, `grace=10s`, `argv=["ls"]`).
    pub detail: String,
}

/// The identity a sandbox's processes see (set by start, reidentify, and a
/// restore: the one the images were made with).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FakeIdentity {
    /// Sandbox id.
    pub sandbox_id: String,
    /// Hostname.
    pub hostname: String,
    /// Machine id.
    pub machine_id: String,
    /// Fork generation.
    pub fork_generation: u32,
}

impl FakeIdentity {
    fn of(spec: &SandboxSpec) -> Self {
        FakeIdentity {
            sandbox_id: spec.id.clone(),
            hostname: spec.hostname.clone(),
            machine_id: spec.machine_id.clone(),
            fork_generation: spec.fork_generation,
        }
    }
}

/// What the fake knows about one sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeSandbox {
    /// The handle of its latest init.
    pub handle: SandboxHandle,
    /// Its init runs (false after stop, kill, a standby dump).
    pub alive: bool,
    /// Frozen by `set_frozen(true)`.
    pub frozen: bool,
    /// `stop` succeeded since the latest start or restore.
    pub stopped: bool,
    /// Its cgroup exists (from start or restore until cleanup).
    pub cgroup: bool,
    /// The identity its processes see.
    pub identity: FakeIdentity,
    /// Pids inside handed out by `exec_command` (from 2 up).
    pub exec_pids: Vec<i32>,
    /// What [`Runtime::open_root`] opens: the writable layer (a fake has no
    /// mounts), so files written through it reach checkpoints and diffs.
    pub root: Option<PathBuf>,
}

/// What the marker file holds.
#[derive(Debug, Serialize, Deserialize)]
struct FakeImage {
    /// `standby` or `copy`.
    mode: String,
    identity: FakeIdentity,
}

type ExecHandler = Arc<dyn Fn(&str, &ExecSpec) -> FakeExec + Send + Sync>;

struct Failure {
    op: Op,
    sandbox: Option<String>,
    error: RuntimeError,
}

struct State {
    next_pid: i32,
    clock: u64,
    sandboxes: HashMap<String, FakeSandbox>,
    calls: Vec<Call>,
    failures: VecDeque<Failure>,
    dump_unsupported: Option<String>,
    usage: HashMap<String, ResourceUsage>,
    exec: ExecHandler,
    /// Restores asking for lazy memory get a fill ([`FakeRuntime::set_lazy_restore`]).
    lazy: bool,
    /// The latest fill of each sandbox, collected or not ([`FakeRuntime::settle_fill`]).
    last_fills: HashMap<String, Arc<crate::namespace::lazy::Fill>>,
}

/// The in-memory runtime (see the module doc).
pub struct FakeRuntime {
    run_dir: PathBuf,
    state: Mutex<State>,
    /// Fills of lazy restores until a dump or cleanup collects them (the
    /// real tier's bookkeeping; outside `state`, since dumps wait on them).
    fills: crate::namespace::lazy::Fills,
}

impl std::fmt::Debug for FakeRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.lock();
        f.debug_struct("FakeRuntime")
            .field("run_dir", &self.run_dir)
            .field("sandboxes", &s.sandboxes)
            .field("calls", &s.calls.len())
            .finish()
    }
}

fn not_running() -> RuntimeError {
    RuntimeError::Setup("sandbox init is not running".into())
}

impl FakeRuntime {
    /// A fake whose [`Runtime::run_dir`] is `run_dir` (created on first use;
    /// the fake helper binary is written there).
    pub fn new(run_dir: impl Into<PathBuf>) -> Self {
        FakeRuntime {
            run_dir: run_dir.into(),
            state: Mutex::new(State {
                next_pid: FIRST_PID,
                clock: 0,
                sandboxes: HashMap::new(),
                calls: Vec::new(),
                failures: VecDeque::new(),
                dump_unsupported: None,
                usage: HashMap::new(),
                exec: Arc::new(|_, _| FakeExec::default()),
                lazy: false,
                last_fills: HashMap::new(),
            }),
            fills: Default::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    // ---- configuration ----

    /// Makes the next call of `op` (for any sandbox) fail with `error`, once.
    /// Panics for an operation that cannot fail ([`Op::can_fail`]).
    pub fn fail_next(&self, op: Op, error: RuntimeError) {
        self.push_failure(op, None, error)
    }

    /// Makes the next call of `op` for `sandbox_id` fail with `error`, once.
    pub fn fail_next_for(&self, sandbox_id: &str, op: Op, error: RuntimeError) {
        self.push_failure(op, Some(sandbox_id.to_string()), error)
    }

    fn push_failure(&self, op: Op, sandbox: Option<String>, error: RuntimeError) {
        assert!(op.can_fail(), "{op} returns no Result and cannot be made to fail");
        self.lock().failures.push_back(Failure { op, sandbox, error });
    }

    /// What [`Runtime::process_dump_unsupported`] answers (`None`: supported,
    /// the default). When set, dump, copy and restore fail with
    /// [`RuntimeError::Unsupported`] too.
    pub fn set_process_dump_unsupported(&self, why: Option<String>) {
        self.lock().dump_unsupported = why;
    }

    /// Whether restores that ask for lazy memory get it (default: no, and
    /// [`Runtime::lazy_restore_unsupported`] says so): each then has a fill
    /// that stays open until [`FakeRuntime::settle_fill`] gives its verdict;
    /// dumps of the sandbox wait for it, as the real tier's do.
    pub fn set_lazy_restore(&self, on: bool) {
        self.lock().lazy = on;
    }

    /// Ends the fill of `sandbox_id`'s latest lazy restore with `verdict`
    /// (also after a cleanup forgot it). Panics when there is none.
    pub fn settle_fill(&self, sandbox_id: &str, verdict: Result<Duration, String>) {
        let fill = self.lock().last_fills.get(sandbox_id).cloned().expect("no lazy restore of this sandbox");
        fill.settle(verdict);
    }

    /// What [`Runtime::usage`] answers for `sandbox_id` from now on.
    pub fn set_usage(&self, sandbox_id: &str, usage: ResourceUsage) {
        self.lock().usage.insert(sandbox_id.to_string(), usage);
    }

    /// What each later `exec_command` does, given the sandbox id and the spec
    /// (default: exit 0, no output).
    pub fn set_exec(&self, handler: impl Fn(&str, &ExecSpec) -> FakeExec + Send + Sync + 'static) {
        self.lock().exec = Arc::new(handler);
    }

    /// Registers `handle` as the live init of `sandbox_id` (its cgroup
    /// existing), as a daemon restarting finds a sandbox another one started.
    /// Its identity is unknown: the sandbox id as hostname, generation 0.
    pub fn adopt(&self, sandbox_id: &str, handle: SandboxHandle) {
        let mut s = self.lock();
        s.next_pid = s.next_pid.max(handle.init_pid.saturating_add(1));
        s.clock = s.clock.max(handle.init_start_time);
        let identity = FakeIdentity {
            sandbox_id: sandbox_id.to_string(),
            hostname: sandbox_id.to_string(),
            machine_id: String::new(),
            fork_generation: 0,
        };
        s.sandboxes.insert(
            sandbox_id.to_string(),
            FakeSandbox {
                handle,
                alive: true,
                frozen: false,
                stopped: false,
                cgroup: true,
                identity,
                exec_pids: vec![],
                root: None,
            },
        );
    }

    /// The init of `sandbox_id` dies (crash, OOM kill): `is_alive` answers
    /// false from now on. Returns whether it was alive.
    pub fn kill(&self, sandbox_id: &str) -> bool {
        let mut s = self.lock();
        match s.sandboxes.get_mut(sandbox_id) {
            Some(sb) => std::mem::replace(&mut sb.alive, false),
            None => false,
        }
    }

    // ---- inspection ----

    /// What the fake knows about `sandbox_id`.
    pub fn sandbox(&self, sandbox_id: &str) -> Option<FakeSandbox> {
        self.lock().sandboxes.get(sandbox_id).cloned()
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    /// The operations called for `sandbox_id`, in order.
    pub fn ops(&self, sandbox_id: &str) -> Vec<Op> {
        self.lock().calls.iter().filter(|c| c.sandbox.as_deref() == Some(sandbox_id)).map(|c| c.op).collect()
    }

    /// [`FakeRuntime::ops`] without the queries ([`Op::is_query`]): what was done to it.
    pub fn actions(&self, sandbox_id: &str) -> Vec<Op> {
        self.ops(sandbox_id).into_iter().filter(|op| !op.is_query()).collect()
    }

    /// Forgets the calls so far (state and configuration stay).
    pub fn clear_calls(&self) {
        self.lock().calls.clear();
    }

    /// The helper binary dumps and copies return (created by the first of them).
    pub fn helper_path(&self) -> PathBuf {
        self.run_dir.join(HELPER_FILE)
    }

    // ---- internals ----

    /// Records the call, then returns the failure queued for it, if any.
    fn begin(&self, s: &mut State, op: Op, sandbox: Option<&str>, detail: String) -> Result<(), RuntimeError> {
        s.calls.push(Call { op, sandbox: sandbox.map(str::to_string), detail });
        let pos =
            s.failures.iter().position(|f| f.op == op && (f.sandbox.is_none() || f.sandbox.as_deref() == sandbox));
        match pos.and_then(|i| s.failures.remove(i)) {
            Some(f) => Err(f.error),
            None => Ok(()),
        }
    }

    fn new_handle(s: &mut State) -> SandboxHandle {
        let pid = s.next_pid;
        s.next_pid += 1;
        s.clock += 1;
        SandboxHandle { init_pid: pid, init_start_time: s.clock }
    }

    fn write_helper(&self) -> Result<PathBuf, RuntimeError> {
        let helper = self.helper_path();
        if !helper.is_file() {
            std::fs::create_dir_all(&self.run_dir)
                .map_err(|e| RuntimeError::sys(format!("create {}", self.run_dir.display()), e))?;
            std::fs::write(&helper, b"fake strata-init\n")
                .map_err(|e| RuntimeError::sys(format!("write {}", helper.display()), e))?;
        }
        Ok(helper)
    }

    /// The checks shared by dump and copy; returns the sandbox's identity.
    fn dumpable(
        s: &State,
        sandbox_id: &str,
        handle: &SandboxHandle,
        want_frozen: bool,
    ) -> Result<FakeIdentity, RuntimeError> {
        let sb = s.sandboxes.get(sandbox_id).filter(|sb| sb.alive && sb.handle == *handle).ok_or_else(not_running)?;
        if let Some(why) = &s.dump_unsupported {
            return Err(RuntimeError::Unsupported(why.clone()));
        }
        match (want_frozen, sb.frozen) {
            (false, true) => Err(RuntimeError::Setup(format!(
                "fake: dumping the processes of frozen sandbox {sandbox_id} (CRIU would stall: thaw it first)"
            ))),
            (true, false) => Err(RuntimeError::Setup(format!(
                "fake: copying the processes of sandbox {sandbox_id}, which the caller has not frozen"
            ))),
            _ => Ok(sb.identity.clone()),
        }
    }

    fn write_image(&self, dir: &Path, mode: &str, identity: FakeIdentity) -> Result<PathBuf, RuntimeError> {
        std::fs::create_dir_all(dir).map_err(|e| RuntimeError::sys(format!("create {}", dir.display()), e))?;
        let image = serde_json::to_vec_pretty(&FakeImage { mode: mode.into(), identity }).expect("image serializes");
        let file = dir.join(IMAGE_FILE);
        std::fs::write(&file, image).map_err(|e| RuntimeError::sys(format!("write {}", file.display()), e))?;
        self.write_helper()
    }
}

impl Runtime for FakeRuntime {
    fn name(&self) -> &'static str {
        "fake"
    }

    fn start(&self, spec: &SandboxSpec) -> Result<SandboxHandle, RuntimeError> {
        let mut s = self.lock();
        self.begin(&mut s, Op::Start, Some(&spec.id), format!("hostname={}", spec.hostname))?;
        if s.sandboxes.get(&spec.id).is_some_and(|sb| sb.alive) {
            return Err(RuntimeError::Setup(format!("fake: sandbox {} already has a live init", spec.id)));
        }
        // Like the namespace tier: the writable layer's directories exist once a
        // sandbox has started (the engine reads them for checkpoints and diffs).
        for d in [&spec.upper_dir, &spec.work_dir, &spec.rootfs_dir] {
            std::fs::create_dir_all(d).map_err(|e| RuntimeError::sys(format!("create {}", d.display()), e))?;
        }
        let handle = Self::new_handle(&mut s);
        let sb = FakeSandbox {
            handle: handle.clone(),
            alive: true,
            frozen: false,
            stopped: false,
            cgroup: true,
            identity: FakeIdentity::of(spec),
            exec_pids: Vec::new(),
            root: Some(spec.upper_dir.clone()),
        };
        s.sandboxes.insert(spec.id.clone(), sb);
        Ok(handle)
    }

    fn is_alive(&self, handle: &SandboxHandle) -> bool {
        let mut s = self.lock();
        let found = s.sandboxes.iter().find(|(_, sb)| sb.handle == *handle).map(|(id, sb)| (id.clone(), sb.alive));
        let detail = format!("init_pid={}", handle.init_pid);
        let _ = self.begin(&mut s, Op::IsAlive, found.as_ref().map(|(id, _)| id.as_str()), detail);
        found.is_some_and(|(_, alive)| alive)
    }

    fn exec_command(
        &self,
        sandbox_id: &str,
        handle: &SandboxHandle,
        exec: &ExecSpec,
    ) -> Result<crate::HelperCommand, RuntimeError> {
        let mut s = self.lock();
        self.begin(&mut s, Op::ExecCommand, Some(sandbox_id), format!("argv={:?}", exec.argv))?;
        let handler = s.exec.clone();
        let sb =
            s.sandboxes.get_mut(sandbox_id).filter(|sb| sb.alive && sb.handle == *handle).ok_or_else(not_running)?;
        let ns_pid = sb.exec_pids.last().map_or(2, |p| p + 1);
        sb.exec_pids.push(ns_pid);
        drop(s);
        Ok(exec::command(ns_pid, &handler(sandbox_id, exec)).into())
    }

    fn stop(&self, sandbox_id: &str, handle: &SandboxHandle, grace: Duration) -> Result<(), RuntimeError> {
        let mut s = self.lock();
        self.begin(&mut s, Op::Stop, Some(sandbox_id), format!("grace={grace:?}"))?;
        if let Some(sb) = s.sandboxes.get_mut(sandbox_id) {
            // An older handle's init is gone already; the current one is stopped.
            if sb.handle == *handle {
                sb.alive = false;
                sb.frozen = false;
                sb.stopped = true;
            }
        }
        Ok(())
    }

    fn cleanup(&self, sandbox_id: &str) -> Result<(), RuntimeError> {
        let mut s = self.lock();
        self.begin(&mut s, Op::Cleanup, Some(sandbox_id), String::new())?;
        self.fills.forget(sandbox_id);
        let run_dir = self.run_dir.clone();
        if let Some(sb) = s.sandboxes.get_mut(sandbox_id) {
            if sb.alive {
                return Err(RuntimeError::Cgroup(CgroupError::Io {
                    path: run_dir.join("cgroup").join(sandbox_id),
                    source: std::io::Error::from_raw_os_error(libc::EBUSY),
                }));
            }
            sb.cgroup = false;
            sb.frozen = false;
        }
        Ok(())
    }

    fn set_frozen(&self, sandbox_id: &str, frozen: bool) -> Result<(), RuntimeError> {
        let mut s = self.lock();
        self.begin(&mut s, Op::SetFrozen, Some(sandbox_id), format!("frozen={frozen}"))?;
        let run_dir = self.run_dir.clone();
        match s.sandboxes.get_mut(sandbox_id).filter(|sb| sb.cgroup) {
            Some(sb) => {
                sb.frozen = frozen;
                Ok(())
            }
            None => Err(RuntimeError::Cgroup(CgroupError::Io {
                path: run_dir.join("cgroup").join(sandbox_id).join("cgroup.freeze"),
                source: std::io::Error::from_raw_os_error(libc::ENOENT),
            })),
        }
    }

    fn usage(&self, sandbox_id: &str) -> ResourceUsage {
        let mut s = self.lock();
        let _ = self.begin(&mut s, Op::Usage, Some(sandbox_id), String::new());
        if let Some(u) = s.usage.get(sandbox_id) {
            return u.clone();
        }
        let alive = s.sandboxes.get(sandbox_id).is_some_and(|sb| sb.alive);
        ResourceUsage { pids: alive as u64, ..Default::default() }
    }

    fn set_cpus_and_pids(&self, sandbox_id: &str, cpus: Option<f64>, pids: Option<u64>) -> Result<(), RuntimeError> {
        let mut s = self.lock();
        self.begin(&mut s, Op::SetCpusAndPids, Some(sandbox_id), format!("cpus={cpus:?} pids={pids:?}"))?;
        match s.sandboxes.get(sandbox_id).filter(|sb| sb.alive) {
            Some(_) => Ok(()),
            None => Err(RuntimeError::Setup(format!("sandbox {sandbox_id} is not running"))),
        }
    }

    fn run_dir(&self) -> PathBuf {
        self.run_dir.clone()
    }

    fn signal(&self, sandbox_id: &str, ns_pid: i32, signal: i32, group: bool) -> usize {
        let mut s = self.lock();
        let detail = format!("ns_pid={ns_pid} signal={signal} group={group}");
        let _ = self.begin(&mut s, Op::Signal, Some(sandbox_id), detail);
        let Some(sb) = s.sandboxes.get_mut(sandbox_id).filter(|sb| sb.alive) else { return 0 };
        if ns_pid == 1 {
            if signal == libc::SIGKILL {
                sb.alive = false;
            }
            return 1;
        }
        usize::from(sb.exec_pids.contains(&ns_pid))
    }

    fn resize_tty(
        &self,
        sandbox_id: &str,
        _handle: &SandboxHandle,
        ns_pid: i32,
        tty_index: Option<u32>,
        size: crate::spec::TtySize,
    ) -> Result<(), RuntimeError> {
        let mut s = self.lock();
        let detail = format!("ns_pid={ns_pid} tty={tty_index:?} {}x{}", size.cols, size.rows);
        self.begin(&mut s, Op::ResizeTty, Some(sandbox_id), detail)?;
        match s.sandboxes.get(sandbox_id).filter(|sb| sb.alive) {
            Some(sb) if sb.exec_pids.contains(&ns_pid) => Ok(()),
            _ => Err(RuntimeError::Setup(format!("no process {ns_pid} in {sandbox_id}"))),
        }
    }

    fn process_dump_unsupported(&self) -> Option<String> {
        let mut s = self.lock();
        let _ = self.begin(&mut s, Op::ProcessDumpUnsupported, None, String::new());
        s.dump_unsupported.clone()
    }

    fn dump_processes(
        &self,
        sandbox_id: &str,
        handle: &SandboxHandle,
        images_dir: &Path,
    ) -> Result<PathBuf, RuntimeError> {
        self.fills.wait_to_dump(sandbox_id)?;
        let mut s = self.lock();
        self.begin(&mut s, Op::DumpProcesses, Some(sandbox_id), format!("images={}", images_dir.display()))?;
        let identity = Self::dumpable(&s, sandbox_id, handle, false)?;
        let helper = self.write_image(images_dir, "standby", identity)?;
        // A standby dump ends the processes.
        if let Some(sb) = s.sandboxes.get_mut(sandbox_id) {
            sb.alive = false;
        }
        Ok(helper)
    }

    fn copy_processes(
        &self,
        sandbox_id: &str,
        handle: &SandboxHandle,
        images_dir: &Path,
    ) -> Result<PathBuf, RuntimeError> {
        self.fills.wait_to_dump(sandbox_id)?;
        let mut s = self.lock();
        self.begin(&mut s, Op::CopyProcesses, Some(sandbox_id), format!("images={}", images_dir.display()))?;
        let identity = Self::dumpable(&s, sandbox_id, handle, true)?;
        self.write_image(images_dir, "copy", identity)
    }

    fn restore_processes(
        &self,
        spec: &SandboxSpec,
        images_dir: &Path,
        work_dir: &Path,
        helper: &Path,
        inherit: &[(std::os::fd::RawFd, u64)],
        memory: crate::MemoryRestore,
    ) -> Result<SandboxHandle, RuntimeError> {
        let mut s = self.lock();
        let detail = format!("images={} work={} inherit={}", images_dir.display(), work_dir.display(), inherit.len());
        self.begin(&mut s, Op::RestoreProcesses, Some(&spec.id), detail)?;
        if let Some(why) = &s.dump_unsupported {
            return Err(RuntimeError::Unsupported(why.clone()));
        }
        if s.sandboxes.get(&spec.id).is_some_and(|sb| sb.alive) {
            return Err(RuntimeError::Setup(format!("fake: sandbox {} already has a live init", spec.id)));
        }
        let file = images_dir.join(IMAGE_FILE);
        let image: FakeImage =
            std::fs::read(&file).ok().and_then(|b| serde_json::from_slice(&b).ok()).ok_or_else(|| {
                RuntimeError::Setup(format!("criu restore failed: no fake process image {}", file.display()))
            })?;
        if !helper.is_file() {
            return Err(RuntimeError::Setup(format!("criu restore failed: no helper binary {}", helper.display())));
        }
        std::fs::create_dir_all(work_dir)
            .map_err(|e| RuntimeError::sys(format!("create {}", work_dir.display()), e))?;
        let handle = Self::new_handle(&mut s);
        let sb = FakeSandbox {
            handle: handle.clone(),
            alive: true,
            frozen: false,
            stopped: false,
            cgroup: true,
            // The processes come back as they were dumped, identity included.
            identity: image.identity,
            exec_pids: Vec::new(),
            root: Some(spec.upper_dir.clone()),
        };
        s.sandboxes.insert(spec.id.clone(), sb);
        if memory == crate::MemoryRestore::Lazy && s.lazy {
            let fill = self.fills.open(&spec.id);
            s.last_fills.insert(spec.id.clone(), fill);
        }
        Ok(handle)
    }

    fn lazy_restore_unsupported(&self, _userns: bool) -> Option<String> {
        (!self.lock().lazy).then(|| "fake: lazy restore is off (FakeRuntime::set_lazy_restore)".to_string())
    }

    fn memory_fill(&self, sandbox_id: &str) -> Option<Arc<dyn crate::PageFill>> {
        self.fills.get(sandbox_id).map(|f| f as Arc<dyn crate::PageFill>)
    }

    fn reidentify(&self, spec: &SandboxSpec, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        let mut s = self.lock();
        self.begin(&mut s, Op::Reidentify, Some(&spec.id), format!("hostname={}", spec.hostname))?;
        let sb = s.sandboxes.get_mut(&spec.id).filter(|sb| sb.alive && sb.handle == *handle).ok_or_else(not_running)?;
        sb.identity = FakeIdentity::of(spec);
        Ok(())
    }

    /// The fake's restores complete at once: none is ever left half done.
    fn interrupted_restore(&self, _sandbox_id: &str, _image_dir: &std::path::Path) -> crate::InterruptedRestore {
        crate::InterruptedRestore::None
    }

    fn restore_leftovers(&self, _image_dir: &std::path::Path) -> Option<std::path::PathBuf> {
        None
    }

    /// The fake has no networks of its own: its sockets are made in the
    /// calling process's network (a test connects them to its own listeners).
    fn net_sockets(
        &self,
        handle: &SandboxHandle,
        _idle: std::time::Duration,
    ) -> Result<Box<dyn crate::NetSockets>, RuntimeError> {
        let mut s = self.lock();
        let id = s.sandboxes.iter().find(|(_, sb)| sb.alive && sb.handle == *handle).map(|(id, _)| id.clone());
        self.begin(&mut s, Op::NetSockets, id.as_deref(), String::new())?;
        id.ok_or_else(not_running)?;
        Ok(Box::new(HostSockets))
    }

    fn open_root(&self, sandbox_id: &str, handle: &SandboxHandle) -> std::io::Result<std::os::fd::OwnedFd> {
        let s = self.lock();
        let sb = s.sandboxes.get(sandbox_id).filter(|sb| sb.alive && sb.handle == *handle);
        let root =
            sb.and_then(|sb| sb.root.clone()).ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))?;
        std::fs::File::open(root).map(Into::into)
    }
}

/// [`FakeRuntime`]'s socket maker: sockets in the calling process's network.
struct HostSockets;

impl crate::NetSockets for HostSockets {
    fn socket(&self, reply: Box<dyn FnOnce(std::io::Result<std::os::fd::OwnedFd>) + Send>) -> bool {
        reply(crate::namespace::netsock::tcp_socket());
        true
    }
}
