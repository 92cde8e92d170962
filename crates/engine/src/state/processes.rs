//! The process table: processes started through the API, per sandbox, with
//! their bounded output logs ([`LOG_CAP_BYTES`] each, [`SANDBOX_LOG_BUDGET`]
//! per sandbox), their status, and what standby and resume hand over
//! ([`CapturedProcess`], [`AdoptedProcesses`], [`ResumePipes`]). Spawning,
//! supervising and following them is [`crate::processes`]'s.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use strata_api::{ProcessEvent, ProcessInfo, ProcessStatus, StreamKind};
use tokio::net::unix::pipe::Sender as PipeSender;
use tokio::sync::watch;

use crate::clock::now;
use crate::error::{EngineError, EngineResult};

/// Output kept per process; older output is dropped (and reported as dropped).
pub const LOG_CAP_BYTES: u64 = 8 << 20;

/// Output kept for all API processes of one sandbox together. Over it, the
/// oldest exited processes lose their output first, then running processes
/// their oldest output down to [`LOG_FLOOR_BYTES`] each: a caller starting
/// many processes, or processes writing without end, cannot grow the daemon
/// past a fixed amount per sandbox.
pub const SANDBOX_LOG_BUDGET: u64 = 64 << 20;

/// What a running process keeps of its newest output when its sandbox is over
/// [`SANDBOX_LOG_BUDGET`].
pub const LOG_FLOOR_BYTES: u64 = 256 << 10;

/// The sandbox's budget is checked each time a process's output crosses a
/// multiple of this many bytes.
pub(crate) const BUDGET_CHECK_EVERY: u64 = 1 << 20;

#[derive(Default)]
pub(crate) struct LogBuf {
    pub(crate) chunks: VecDeque<(StreamKind, u64, Bytes)>,
    /// Offset of the first retained byte.
    pub(crate) start: u64,
    /// Offset after the last byte.
    pub(crate) end: u64,
}

impl LogBuf {
    /// Bytes held now.
    pub(crate) fn retained(&self) -> u64 {
        self.end - self.start
    }

    /// Drops the oldest chunks (whole) as long as at least `keep` bytes stay
    /// held; returns the bytes freed.
    pub(crate) fn trim_to(&mut self, keep: u64) -> u64 {
        let before = self.retained();
        while let Some(len) = self.chunks.front().map(|(_, _, d)| d.len() as u64) {
            if self.retained() - len < keep {
                break;
            }
            self.chunks.pop_front();
            self.start += len;
        }
        if self.chunks.is_empty() {
            self.start = self.end;
        }
        before - self.retained()
    }

    pub(crate) fn push(&mut self, stream: StreamKind, data: Bytes) {
        let len = data.len() as u64;
        self.chunks.push_back((stream, self.end, data));
        self.end += len;
        while self.retained() > LOG_CAP_BYTES {
            match self.chunks.pop_front() {
                Some((_, _, d)) => self.start += d.len() as u64,
                None => break,
            }
        }
    }
}

pub(crate) struct ProcState {
    pub(crate) info: ProcessInfo,
    pub(crate) log: LogBuf,
    /// Inodes of the pipes the process holds (report, stdout, stderr, stdin):
    /// a standby image refers to them, and resume hands in fresh pipes for them.
    pub(crate) pipes: PipeInodes,
    /// Set while the sandbox's processes are dumped (standby): the end of its
    /// pipes then means "suspended", not "exited".
    pub(crate) suspended: bool,
    /// Whether the daemon held the process's stdin open when it was suspended.
    pub(crate) stdin_open: bool,
    /// The number of its terminal inside (`/dev/pts/N`), when it runs on one
    /// and its tier reported it.
    pub(crate) tty_index: Option<u32>,
}

/// Inode numbers of a process's pipes to the daemon.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub struct PipeInodes {
    pub(crate) report: u64,
    pub(crate) stdout: u64,
    pub(crate) stderr: u64,
    pub(crate) stdin: u64,
}

/// A running API process as a warm checkpoint records it: a sandbox started
/// from the checkpoint gets it back under the same id, on fresh pipes that
/// replace these inodes.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CapturedProcess {
    /// Its record (id, command, pid, start time).
    pub info: ProcessInfo,
    /// The pipes it held (`stdin` is 0 when its stdin was closed).
    pub pipes: PipeInodes,
    /// The number of its terminal inside, when it runs on one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tty_index: Option<u32>,
}

/// The daemon's ends of a process's pipes.
pub(crate) struct DaemonEnds {
    pub(crate) report: OwnedFd,
    pub(crate) stdout: OwnedFd,
    pub(crate) stderr: OwnedFd,
    pub(crate) stdin: Option<OwnedFd>,
}

/// One process started through the API.
pub struct Proc {
    pub(crate) state: Mutex<ProcState>,
    pub(crate) stdin: Arc<tokio::sync::Mutex<Option<PipeSender>>>,
    pub(crate) changed: watch::Sender<u64>,
    /// Hands new pipes to the process's supervisor after a resume.
    pub(crate) reattach: Mutex<Option<tokio::sync::mpsc::UnboundedSender<DaemonEnds>>>,
}

impl Proc {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, ProcState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The offset of the next byte of output (the end of its log).
    pub fn log_end(&self) -> u64 {
        self.lock().log.end
    }

    /// A snapshot of the process record.
    pub fn info(&self) -> ProcessInfo {
        self.lock().info.clone()
    }

    pub(crate) fn bump(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    /// Appends output; true when the sandbox's [`SANDBOX_LOG_BUDGET`] is due for a check.
    pub(crate) fn append(&self, stream: StreamKind, data: Bytes) -> bool {
        let due = {
            let mut st = self.lock();
            let before = st.log.end;
            st.log.push(stream, data);
            before / BUDGET_CHECK_EVERY != st.log.end / BUDGET_CHECK_EVERY
        };
        self.bump();
        due
    }

    /// Events from `offset` on: output chunks (and a `Dropped` marker if the buffer
    /// no longer holds `offset`), the next offset, and the record when it has exited.
    pub(crate) fn read_from(&self, offset: u64) -> (Vec<ProcessEvent>, u64, Option<ProcessInfo>) {
        let st = self.lock();
        let mut evs = Vec::new();
        let mut off = offset;
        if off < st.log.start {
            evs.push(ProcessEvent::Dropped { bytes: st.log.start - off });
            off = st.log.start;
        }
        for (stream, start, data) in &st.log.chunks {
            let end = start + data.len() as u64;
            if end <= off {
                continue;
            }
            let skip = off.saturating_sub(*start) as usize;
            evs.push(ProcessEvent::Output {
                stream: *stream,
                offset: start + skip as u64,
                data_b64: B64.encode(&data[skip..]),
            });
            off = end;
        }
        let done = (st.info.status == ProcessStatus::Exited).then(|| st.info.clone());
        (evs, off, done)
    }

    /// Captured stdout and stderr (what the buffer still holds) and whether some was dropped.
    pub fn captured_output(&self) -> (Vec<u8>, Vec<u8>, bool) {
        let st = self.lock();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        for (stream, _, d) in &st.log.chunks {
            match stream {
                StreamKind::Stdout => out.extend_from_slice(d),
                StreamKind::Stderr => err.extend_from_slice(d),
            }
        }
        (out, err, st.log.start > 0)
    }

    /// Its pid inside the sandbox once its shim has reported it (waiting at most
    /// `limit` right after a start); `None` when it ended or never started.
    pub async fn pid_when_started(&self, limit: Duration) -> Option<i32> {
        let mut rx = self.changed.subscribe();
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let info = self.info();
            if info.pid.is_some() || info.status == ProcessStatus::Exited {
                return info.pid.filter(|_| info.status == ProcessStatus::Running);
            }
            if !matches!(tokio::time::timeout_at(deadline, rx.changed()).await, Ok(Ok(()))) {
                return None;
            }
        }
    }

    /// Waits until the process has exited (or `limit` passes) and returns its record.
    pub async fn wait(&self, limit: Option<Duration>) -> ProcessInfo {
        self.wait_inner(limit).await
    }

    /// Waits for the process to exit and returns its record with the output it
    /// captured (what a non-streamed exec answers).
    pub async fn result(&self) -> strata_api::ExecResult {
        let process = self.wait(None).await;
        let (out, err, truncated) = self.captured_output();
        strata_api::ExecResult { process, stdout_b64: B64.encode(out), stderr_b64: B64.encode(err), truncated }
    }

    pub(crate) async fn wait_inner(&self, limit: Option<Duration>) -> ProcessInfo {
        let mut rx = self.changed.subscribe();
        let deadline = limit.map(|d| tokio::time::Instant::now() + d);
        loop {
            let info = self.info();
            if info.status == ProcessStatus::Exited {
                return info;
            }
            match deadline {
                Some(dl) => {
                    if tokio::time::timeout_at(dl, rx.changed()).await.is_err() {
                        return self.info();
                    }
                }
                None => {
                    if rx.changed().await.is_err() {
                        return self.info();
                    }
                }
            }
        }
    }
}

#[derive(Default)]
pub(crate) struct SandboxProcs {
    pub(crate) next_id: u64,
    pub(crate) procs: BTreeMap<u64, Arc<Proc>>,
}

/// All processes, by sandbox.
#[derive(Default)]
pub struct ProcessTable {
    pub(crate) inner: Mutex<HashMap<String, SandboxProcs>>,
    /// Sandboxes being destroyed: their processes end because of it.
    destroying: Mutex<std::collections::HashSet<String>>,
}

/// Exited processes kept per sandbox for `ps`/logs; older ones are forgotten.
pub(crate) const KEEP_EXITED: usize = 256;

impl ProcessTable {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, SandboxProcs>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn insert(&self, sandbox_id: &str, cmd: Vec<String>) -> Arc<Proc> {
        let mut m = self.lock();
        let sp = m.entry(sandbox_id.to_string()).or_default();
        sp.next_id += 1;
        let id = sp.next_id;
        let exited: Vec<u64> =
            sp.procs.iter().filter(|(_, p)| p.info().status == ProcessStatus::Exited).map(|(k, _)| *k).collect();
        if exited.len() >= KEEP_EXITED {
            for k in &exited[..exited.len() + 1 - KEEP_EXITED] {
                sp.procs.remove(k);
            }
        }
        let p = new_proc(ProcessInfo {
            id,
            sandbox_id: sandbox_id.to_string(),
            cmd,
            status: ProcessStatus::Running,
            pid: None,
            exit_code: None,
            signal: None,
            timed_out: false,
            oom_killed: false,
            tty: None,
            spawn_error: None,
            started_at: now(),
            finished_at: None,
        });
        sp.procs.insert(id, p.clone());
        p
    }

    /// Holds the output of a sandbox's processes to [`SANDBOX_LOG_BUDGET`]:
    /// exited processes lose theirs first (oldest first), then running
    /// processes, largest first, keep [`LOG_FLOOR_BYTES`] each.
    pub fn enforce_log_budget(&self, sandbox_id: &str) {
        let procs: Vec<Arc<Proc>> =
            self.lock().get(sandbox_id).map(|sp| sp.procs.values().cloned().collect()).unwrap_or_default();
        let mut total: u64 = procs.iter().map(|p| p.lock().log.retained()).sum();
        if total <= SANDBOX_LOG_BUDGET {
            return;
        }
        let (exited, mut running): (Vec<_>, Vec<_>) =
            procs.into_iter().partition(|p| p.info().status == ProcessStatus::Exited);
        running.sort_by_key(|p| std::cmp::Reverse(p.lock().log.retained()));
        for (p, keep) in exited.iter().map(|p| (p, 0)).chain(running.iter().map(|p| (p, LOG_FLOOR_BYTES))) {
            if total <= SANDBOX_LOG_BUDGET {
                break;
            }
            let freed = {
                let mut st = p.lock();
                let over = total - SANDBOX_LOG_BUDGET;
                let keep = keep.max(st.log.retained().saturating_sub(over));
                st.log.trim_to(keep)
            };
            total -= freed;
            if freed > 0 {
                p.bump();
            }
        }
    }

    /// The running processes of a sandbox, for a warm checkpoint taken now.
    pub async fn capture(&self, sandbox_id: &str) -> Vec<CapturedProcess> {
        let procs: Vec<Arc<Proc>> =
            self.lock().get(sandbox_id).map(|sp| sp.procs.values().cloned().collect()).unwrap_or_default();
        let mut out = Vec::new();
        for p in procs {
            let stdin_open = p.stdin.lock().await.is_some();
            let s = p.lock();
            if s.info.status != ProcessStatus::Running || s.suspended {
                continue;
            }
            let mut pipes = s.pipes;
            if !stdin_open {
                pipes.stdin = 0;
            }
            out.push(CapturedProcess { info: s.info.clone(), pipes, tty_index: s.tty_index });
        }
        out
    }

    /// Registers the processes of a warm checkpoint in a sandbox being started
    /// from it, with fresh pipes: the ends its restored processes take over
    /// (each with the inode it replaces) and the daemon's ends, handed to
    /// supervisors by [`AdoptedProcesses::commit`].
    pub fn adopt(&self, sandbox_id: &str, captured: &[CapturedProcess]) -> EngineResult<AdoptedProcesses> {
        let mut out =
            AdoptedProcesses { sandbox_id: sandbox_id.to_string(), children: Vec::new(), pending: Vec::new() };
        for c in captured {
            let (child, ends, pipes) = fresh_pipes(c.info.pid, c.pipes, c.pipes.stdin != 0)?;
            out.children.push(child);
            let stdin = ends.stdin;
            let info = ProcessInfo {
                sandbox_id: sandbox_id.to_string(),
                status: ProcessStatus::Running,
                finished_at: None,
                ..c.info.clone()
            };
            let p = new_proc(info);
            p.lock().pipes = pipes;
            p.lock().tty_index = c.tty_index;
            out.pending.push((p, DaemonEnds { stdin, ..ends }));
        }
        Ok(out)
    }

    /// A process of a sandbox.
    pub fn get(&self, sandbox_id: &str, id: u64) -> Option<Arc<Proc>> {
        self.lock().get(sandbox_id)?.procs.get(&id).cloned()
    }

    /// Every known process of a sandbox.
    pub fn list(&self, sandbox_id: &str) -> Vec<ProcessInfo> {
        self.lock().get(sandbox_id).map(|sp| sp.procs.values().map(|p| p.info()).collect()).unwrap_or_default()
    }

    /// Number of running processes of a sandbox.
    pub fn running(&self, sandbox_id: &str) -> usize {
        self.lock()
            .get(sandbox_id)
            .map_or(0, |sp| sp.procs.values().filter(|p| p.lock().info.status == ProcessStatus::Running).count())
    }

    /// Marks every running process of a sandbox as suspended before its
    /// processes are dumped for standby; returns how many there are.
    pub async fn suspend(&self, sandbox_id: &str) -> usize {
        let procs: Vec<Arc<Proc>> =
            self.lock().get(sandbox_id).map(|sp| sp.procs.values().cloned().collect()).unwrap_or_default();
        let mut n = 0;
        for p in procs {
            if p.info().status != ProcessStatus::Running {
                continue;
            }
            let stdin_open = p.stdin.lock().await.is_some();
            let mut s = p.lock();
            s.suspended = true;
            s.stdin_open = stdin_open;
            n += 1;
        }
        n
    }

    /// Clears the suspension (the dump failed and the processes run on).
    pub fn unsuspend(&self, sandbox_id: &str) {
        if let Some(sp) = self.lock().get(sandbox_id) {
            for p in sp.procs.values() {
                p.lock().suspended = false;
            }
        }
    }

    /// Fresh pipes for every suspended process of a sandbox: the ends the
    /// restored processes take over (each with the inode it replaces) and the
    /// daemon's ends, handed to the supervisors by [`ResumePipes::commit`].
    pub fn resume_pipes(&self, sandbox_id: &str) -> EngineResult<ResumePipes> {
        let procs: Vec<Arc<Proc>> =
            self.lock().get(sandbox_id).map(|sp| sp.procs.values().cloned().collect()).unwrap_or_default();
        let mut out = ResumePipes::default();
        for p in procs {
            let (old, stdin_open, pid) = {
                let s = p.lock();
                if !s.suspended {
                    continue;
                }
                (s.pipes, s.stdin_open, s.info.pid)
            };
            let (child, ends, new) = fresh_pipes(pid, old, stdin_open)?;
            out.children.push(child);
            out.pending.push((p, ends, new));
        }
        Ok(out)
    }

    /// Forgets every process of a destroyed sandbox.
    pub fn forget(&self, sandbox_id: &str) {
        self.abandon_suspended(sandbox_id);
        self.lock().remove(sandbox_id);
        self.set_destroying(sandbox_id, false);
    }

    /// Marks a sandbox whose processes are about to be killed because it is
    /// destroyed (`true`), or no longer (`false`: the destroy failed).
    pub(crate) fn set_destroying(&self, sandbox_id: &str, on: bool) {
        let mut d = self.destroying.lock().unwrap_or_else(|p| p.into_inner());
        if on {
            d.insert(sandbox_id.to_string());
        } else {
            d.remove(sandbox_id);
        }
    }

    /// Whether the sandbox is being destroyed (its processes end because of it).
    pub fn is_destroying(&self, sandbox_id: &str) -> bool {
        self.destroying.lock().unwrap_or_else(|p| p.into_inner()).contains(sandbox_id)
    }

    /// Suspended processes that will not be resumed (standby failed, or the
    /// sandbox is stopped or destroyed from standby) are recorded as lost.
    pub fn abandon_suspended(&self, sandbox_id: &str) {
        if let Some(sp) = self.lock().get(sandbox_id) {
            for p in sp.procs.values() {
                if p.lock().suspended {
                    p.reattach.lock().unwrap_or_else(|e| e.into_inner()).take();
                }
            }
        }
    }
}

/// A new process record, running.
pub(crate) fn new_proc(info: ProcessInfo) -> Arc<Proc> {
    let (changed, _) = watch::channel(0);
    Arc::new(Proc {
        state: Mutex::new(ProcState {
            info,
            log: LogBuf::default(),
            pipes: PipeInodes::default(),
            suspended: false,
            stdin_open: false,
            tty_index: None,
        }),
        stdin: Arc::new(tokio::sync::Mutex::new(None)),
        changed,
        reattach: Mutex::new(None),
    })
}

/// The process-side ends of fresh pipes for one restored process: a CRIU
/// restore puts them in place of the pipes it dumped ([`ChildEnds::inherit`]),
/// a tier that reattaches by command hands them to its attach helper.
pub struct ChildEnds {
    /// The process's pid inside its sandbox.
    pub ns_pid: Option<i32>,
    /// Write end of the report pipe.
    pub report: OwnedFd,
    /// Write end of its stdout.
    pub stdout: OwnedFd,
    /// Write end of its stderr.
    pub stderr: OwnedFd,
    /// Read end of its stdin, when the daemon holds it open.
    pub stdin: Option<OwnedFd>,
    /// The pipes these replace.
    replaces: PipeInodes,
}

impl ChildEnds {
    /// Each end with the inode of the pipe it replaces.
    pub fn inherit(&self) -> Vec<(std::os::fd::RawFd, u64)> {
        let mut v = vec![
            (self.report.as_raw_fd(), self.replaces.report),
            (self.stdout.as_raw_fd(), self.replaces.stdout),
            (self.stderr.as_raw_fd(), self.replaces.stderr),
        ];
        if let Some(s) = &self.stdin {
            v.push((s.as_raw_fd(), self.replaces.stdin));
        }
        v
    }
}

/// Fresh pipes for a process that held `old` (`stdin`: the daemon feeds its
/// stdin): its ends, the daemon's ends and the new inodes.
fn fresh_pipes(ns_pid: Option<i32>, old: PipeInodes, stdin: bool) -> EngineResult<(ChildEnds, DaemonEnds, PipeInodes)> {
    let (report_r, report_w) = cloexec_pipe()?;
    let (stdout_r, stdout_w) = cloexec_pipe()?;
    let (stderr_r, stderr_w) = cloexec_pipe()?;
    let mut new = PipeInodes { report: inode(&report_r), stdout: inode(&stdout_r), stderr: inode(&stderr_r), stdin: 0 };
    let (child_in, daemon_in) = if stdin {
        let (r, w) = cloexec_pipe()?;
        new.stdin = inode(&r);
        (Some(r), Some(w))
    } else {
        (None, None)
    };
    Ok((
        ChildEnds { ns_pid, report: report_w, stdout: stdout_w, stderr: stderr_w, stdin: child_in, replaces: old },
        DaemonEnds { report: report_r, stdout: stdout_r, stderr: stderr_r, stdin: daemon_in },
        new,
    ))
}

/// Every end of `children` with the inode it replaces (a CRIU restore's `inherit`).
pub fn inherit_all(children: &[ChildEnds]) -> Vec<(std::os::fd::RawFd, u64)> {
    children.iter().flat_map(ChildEnds::inherit).collect()
}

/// Processes of a warm checkpoint registered in a sandbox started from it
/// (see [`ProcessTable::adopt`]).
pub struct AdoptedProcesses {
    pub(crate) sandbox_id: String,
    /// The restored processes' ends.
    pub children: Vec<ChildEnds>,
    pub(crate) pending: Vec<(Arc<Proc>, DaemonEnds)>,
}

/// New pipes for the processes of a sandbox being resumed (see [`ProcessTable::resume_pipes`]).
#[derive(Default)]
pub struct ResumePipes {
    /// The restored processes' ends.
    pub children: Vec<ChildEnds>,
    pub(crate) pending: Vec<(Arc<Proc>, DaemonEnds, PipeInodes)>,
}

pub const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

pub(crate) fn cloexec_pipe() -> EngineResult<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| EngineError::internal("pipe", &e))
}

pub(crate) fn inode(fd: &OwnedFd) -> u64 {
    nix::sys::stat::fstat(fd.as_raw_fd()).map(|s| s.st_ino).unwrap_or(0)
}
