//! Processes started inside sandboxes: spawning through the runtime's exec
//! helper, buffered (reattachable) output logs, stdin, signals, timeouts,
//! exit status and OOM attribution.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use nix::sys::signal::Signal;
use strata_api::{ErrorCode, ExecRequest, ProcessEvent, ProcessInfo, ProcessStatus, SandboxState, StreamKind, TtySize};
use strata_core::units;
use strata_runtime::spec::{ExecReport, ExecSpec};
use strata_store::db::SandboxRecord;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::pipe::Sender as PipeSender;
use tracing::warn;

use crate::error::{EngineError, EngineResult};
use crate::record;
use crate::record::{handle_of, load, now};
use crate::state::Shared;

pub use crate::state::processes::*;

impl AdoptedProcesses {
    /// The processes run: they join the sandbox's table under their ids and are supervised.
    pub fn commit(self, st: &Shared) {
        let secrets = st.secrets.get_or_empty(&self.sandbox_id);
        let rt = st.runtime_by_id(&self.sandbox_id);
        let oom_before = rt.usage(&self.sandbox_id).oom_kills;
        for (p, ends) in self.pending {
            let id = p.info().id;
            {
                let mut m = st.processes.lock();
                let sp = m.entry(self.sandbox_id.clone()).or_default();
                sp.next_id = sp.next_id.max(id);
                sp.procs.insert(id, p.clone());
            }
            let (reattach_tx, reattach_rx) = tokio::sync::mpsc::unbounded_channel();
            *p.reattach.lock().unwrap_or_else(|e| e.into_inner()) = Some(reattach_tx);
            let opts = SuperviseOpts { timeout: None, oom_before, secrets: secrets.clone(), runtime: rt.clone() };
            tokio::spawn(supervise(st.clone(), p, self.sandbox_id.clone(), ends, opts, reattach_rx));
        }
    }
}

impl ResumePipes {
    /// The processes are back: their supervisors take the new pipes.
    pub fn commit(self) {
        for (p, ends, inodes) in self.pending {
            // The new ends are queued before the suspension is lifted: a
            // supervisor that sees its old pipes end finds them either way.
            if let Some(tx) = p.reattach.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                let _ = tx.send(ends);
            }
            let mut s = p.lock();
            s.pipes = inodes;
            s.suspended = false;
        }
    }

    /// The processes cannot come back: they are recorded as lost.
    pub fn abandon(self) {
        for (p, _, _) in self.pending {
            p.reattach.lock().unwrap_or_else(|e| e.into_inner()).take();
        }
    }
}

/// Builds the runtime's exec spec: image env < sandbox env < secrets exposed
/// as env < request env; cwd and user default to the image's.
fn exec_spec(rec: &SandboxRecord, req: &ExecRequest, secrets: &crate::secrets::SandboxSecrets) -> ExecSpec {
    let mut env = BTreeMap::new();
    for kv in &rec.image_config.env {
        if let Some((k, v)) = kv.split_once('=') {
            env.insert(k.to_string(), v.to_string());
        }
    }
    env.insert("STRATA_SANDBOX_ID".into(), rec.sandbox.id.clone());
    env.insert("STRATA_FORK_GENERATION".into(), rec.sandbox.fork_generation.to_string());
    env.extend(rec.sandbox.env.clone());
    env.extend(secrets.env_vars());
    env.extend(req.env.clone());
    if req.tty.is_some() {
        env.entry("TERM".into()).or_insert_with(|| "xterm".into());
    }
    ExecSpec {
        argv: req.cmd.clone(),
        env,
        cwd: req.cwd.clone().or_else(|| rec.image_config.working_dir.clone().filter(|w| !w.is_empty())),
        user: req.user.clone().or_else(|| rec.image_config.user.clone().filter(|u| !u.is_empty())),
        allow_setuid: rec.sandbox.allow_setuid,
        tty: req.tty.map(|t| strata_runtime::spec::TtySize { cols: t.cols, rows: t.rows }),
    }
}

fn validate(req: &ExecRequest) -> EngineResult<(Option<Duration>, Option<Vec<u8>>)> {
    if req.cmd.is_empty() || req.cmd[0].is_empty() {
        return Err(EngineError::bad_request("cmd must name a program"));
    }
    if req.cmd.iter().any(|a| a.contains('\0'))
        || req.env.iter().any(|(k, v)| k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0'))
    {
        return Err(EngineError::bad_request(
            "arguments and environment must not contain NUL bytes; names must not contain '='",
        ));
    }
    if let Some(why) = req.tty.as_ref().and_then(TtySize::invalid) {
        return Err(EngineError::bad_request(format!("tty: {why}")));
    }
    let timeout = req.timeout.as_deref().map(units::parse_duration).transpose()?;
    let stdin = req
        .stdin_b64
        .as_deref()
        .map(|s| B64.decode(s))
        .transpose()
        .map_err(|e| EngineError::bad_request(format!("stdin_b64: {e}")))?;
    Ok((timeout, stdin))
}

/// Starts a process in a running sandbox and returns immediately.
pub async fn spawn(st: &Shared, sandbox: &str, req: ExecRequest) -> EngineResult<Arc<Proc>> {
    let checked = validate(&req)?;
    let rec = load(st, sandbox)?;
    if rec.sandbox.state != SandboxState::Running {
        return Err(EngineError::invalid_state(
            rec.sandbox.state,
            format!("cannot exec in sandbox {} while it is {}", rec.sandbox.id, rec.sandbox.state),
        ));
    }
    spawn_validated(st, &rec, req, checked).await
}

/// Starts a process in the running sandbox `rec` (whose state the caller checked).
pub async fn spawn_unchecked(st: &Shared, rec: &SandboxRecord, req: ExecRequest) -> EngineResult<Arc<Proc>> {
    let checked = validate(&req)?;
    spawn_validated(st, rec, req, checked).await
}

/// [`spawn_unchecked`] for a request [`validate`] has accepted (its timeout and decoded stdin).
async fn spawn_validated(
    st: &Shared,
    rec: &SandboxRecord,
    req: ExecRequest,
    (timeout, stdin_data): (Option<Duration>, Option<Vec<u8>>),
) -> EngineResult<Arc<Proc>> {
    let handle = handle_of(rec).ok_or_else(|| EngineError::new(ErrorCode::Internal, "running sandbox without init"))?;
    let secrets = st.secrets.get(&rec.sandbox.id)?;
    let spec = exec_spec(rec, &req, &secrets);
    let rt = st.runtime_of(&rec.sandbox);
    let cmd = rt.exec_command(&rec.sandbox.id, &handle, &spec).map_err(|e| {
        EngineError::invalid_state(rec.sandbox.state, format!("sandbox is not runnable: {}", crate::error::chain(&e)))
    })?;
    let (report_r, report_w) = cloexec_pipe()?;
    let (stdout_r, stdout_w) = cloexec_pipe()?;
    let (stderr_r, stderr_w) = cloexec_pipe()?;
    let (stdin_r, stdin_w) = cloexec_pipe()?;
    let pipes = PipeInodes {
        report: inode(&report_r),
        stdout: inode(&stdout_r),
        stderr: inode(&stderr_r),
        stdin: inode(&stdin_r),
    };
    spawn_helper(cmd, report_w, stdout_w, stderr_w, Some(stdin_r))?;
    let oom_before = rt.usage(&rec.sandbox.id).oom_kills;
    let proc_ = st.processes.insert(&rec.sandbox.id, req.cmd.iter().map(|a| secrets.redact_str(a)).collect());
    {
        let mut s = proc_.lock();
        s.pipes = pipes;
        s.info.tty = req.tty;
    }
    let (reattach_tx, reattach_rx) = tokio::sync::mpsc::unbounded_channel();
    *proc_.reattach.lock().unwrap_or_else(|p| p.into_inner()) = Some(reattach_tx);
    // Stdin is in place before the caller learns the process exists (it may write at once).
    // A terminal's input stays open (it has no end of its own).
    attach_stdin(&proc_, stdin_w, stdin_data, req.keep_stdin_open || req.tty.is_some()).await;
    let ends = DaemonEnds { report: report_r, stdout: stdout_r, stderr: stderr_r, stdin: None };
    tokio::spawn(supervise(
        st.clone(),
        proc_.clone(),
        rec.sandbox.id.clone(),
        ends,
        SuperviseOpts { timeout, oom_before, secrets, runtime: rt },
        reattach_rx,
    ));
    Ok(proc_)
}

/// Spawns a runtime's exec (or attach) helper with the process-side pipe ends:
/// stdio, and the report pipe named in `STRATA_REPORT_FD`.
fn spawn_helper(
    helper: strata_runtime::HelperCommand,
    report_w: OwnedFd,
    stdout_w: OwnedFd,
    stderr_w: OwnedFd,
    stdin_r: Option<OwnedFd>,
) -> EngineResult<()> {
    let strata_runtime::HelperCommand { mut cmd, held } = helper;
    cmd.env(strata_runtime::spec::REPORT_FD_ENV, report_w.as_raw_fd().to_string());
    let stdin = stdin_r.map_or_else(Stdio::null, Stdio::from);
    cmd.stdin(stdin).stdout(Stdio::from(stdout_w)).stderr(Stdio::from(stderr_w));
    let mut child = {
        // The write end is inheritable only while the lock is held, so no other
        // spawn can pick it up; without a pre_exec hook std uses posix_spawn.
        let g = strata_runtime::spawn_lock();
        strata_runtime::inherit_in_next_spawn(&g, report_w.as_fd())
            .map_err(|e| EngineError::internal("pass the report pipe to the exec helper", &e))?;
        let spawned = tokio::process::Command::from(cmd).spawn();
        drop(report_w);
        drop(held);
        spawned.map_err(|e| EngineError::internal("spawn exec helper", &e))?
    };
    // The helper's own end says nothing about the process's (its report does).
    tokio::spawn(async move {
        let _ = child.wait().await;
    });
    Ok(())
}

/// Hands restored processes their fresh pipes where the tier reattaches by
/// command ([`strata_runtime::Runtime::attach_command`]): one attach helper
/// each. A tier whose restore took the ends itself needs nothing more.
pub fn attach_restored(
    rt: &dyn strata_runtime::Runtime,
    sandbox_id: &str,
    handle: &strata_runtime::SandboxHandle,
    children: Vec<ChildEnds>,
) -> EngineResult<()> {
    for c in children {
        let Some(pid) = c.ns_pid else { continue };
        let cmd = rt
            .attach_command(sandbox_id, handle, pid, c.stdin.is_some())
            .map_err(|e| EngineError::internal("attach to a restored process", &e))?;
        match cmd {
            Some(cmd) => spawn_helper(cmd.into(), c.report, c.stdout, c.stderr, c.stdin)?,
            None => return Ok(()),
        }
    }
    Ok(())
}

/// The API processes of a running sandbox were detached from their pipes
/// (suspended) and the sandbox runs on (a copy was taken, or a standby
/// failed): they get fresh pipes, through attach helpers where the tier
/// attaches by command; elsewhere their pipes were never touched.
pub fn reattach_running(st: &Shared, sandbox_id: &str, handle: &strata_runtime::SandboxHandle) {
    let rt = st.runtime_by_id(sandbox_id);
    if !rt.attaches_by_command() {
        st.processes.unsuspend(sandbox_id);
        return;
    }
    let reattached = st.processes.resume_pipes(sandbox_id).and_then(|mut pipes| {
        let children = std::mem::take(&mut pipes.children);
        match attach_restored(&*rt, sandbox_id, handle, children) {
            Ok(()) => {
                pipes.commit();
                Ok(())
            }
            Err(e) => {
                pipes.abandon();
                Err(e)
            }
        }
    });
    if let Err(e) = reattached {
        warn!(sandbox = sandbox_id, error = %e.body.message, "reattaching the API processes failed: their output is lost");
    }
}

struct SuperviseOpts {
    timeout: Option<Duration>,
    oom_before: u64,
    /// Values redacted from the output before it is buffered.
    secrets: Arc<crate::secrets::SandboxSecrets>,
    /// The sandbox's tier (resolved once: a sandbox keeps its tier for life).
    runtime: Arc<dyn strata_runtime::Runtime>,
}

/// Follows one process until its shim reports its end: pumps its output into
/// the log, feeds its stdin, enforces its timeout, and, when the sandbox goes
/// to standby (pipes closed while suspended), waits for the pipes of the
/// resumed process.
async fn supervise(
    st: Shared,
    p: Arc<Proc>,
    sandbox_id: String,
    mut ends: DaemonEnds,
    opts: SuperviseOpts,
    mut reattach: tokio::sync::mpsc::UnboundedReceiver<DaemonEnds>,
) {
    let spawned_at = std::time::Instant::now();
    let deadline = opts.timeout.map(|t| tokio::time::Instant::now() + t);
    let mut timed_out = false;
    let report = loop {
        let out_task = tokio::spawn(pump(
            st.clone(),
            sandbox_id.clone(),
            p.clone(),
            ends.stdout,
            StreamKind::Stdout,
            opts.secrets.redactor(),
        ));
        let err_task = tokio::spawn(pump(
            st.clone(),
            sandbox_id.clone(),
            p.clone(),
            ends.stderr,
            StreamKind::Stderr,
            opts.secrets.redactor(),
        ));
        if let Some(fd) = ends.stdin.take() {
            // Reattached after a resume: it was open when the process was suspended.
            attach_stdin(&p, fd, None, true).await;
        }
        let reports = read_reports(p.clone(), ends.report);
        tokio::pin!(reports);
        let report = loop {
            let sleep = async {
                match deadline {
                    Some(d) if !timed_out => tokio::time::sleep_until(d).await,
                    _ => std::future::pending().await,
                }
            };
            tokio::select! {
                r = &mut reports => break r,
                _ = sleep => {
                    timed_out = true;
                    if let Some(pid) = p.info().pid {
                        // The process leads its own session/process group: kill the group.
                        opts.runtime.signal(&sandbox_id, pid, libc::SIGKILL, true);
                    }
                }
            }
        };
        // Let the output readers take everything the process wrote: the
        // helper is the only writer of these pipes and exits right after its
        // report, so they end at once (its own drain bounded what background
        // children may add). Not a short timeout: on a loaded host the readers
        // may not have run yet, and the output would be cut (a fork bench
        // under load lost a whole `ok`). The bound is for a helper that hangs.
        let drain = async {
            let _ = out_task.await;
            let _ = err_task.await;
        };
        if tokio::time::timeout(OUTPUT_DRAIN_LIMIT, drain).await.is_err() {
            warn!(command = ?p.info().cmd, "the exec helper kept its output open after its report");
        }
        if matches!(report, FinalReport::None) {
            // Reattached already (a copy that let go of the pipes for a moment)?
            if let Ok(new) = reattach.try_recv() {
                *p.stdin.lock().await = None;
                ends = new;
                continue;
            }
        }
        if matches!(report, FinalReport::None) && p.lock().suspended {
            // Dumped for standby: the resumed process comes back on new pipes.
            *p.stdin.lock().await = None;
            match reattach.recv().await {
                Some(new) => {
                    ends = new;
                    continue;
                }
                None => break FinalReport::Lost("the sandbox's standby image could not be resumed".into()),
            }
        }
        break report;
    };
    let oom_after = opts.runtime.usage(&sandbox_id).oom_kills;
    {
        let mut s = p.lock();
        s.suspended = false;
        let info = &mut s.info;
        info.status = ProcessStatus::Exited;
        info.finished_at = Some(now());
        info.timed_out = timed_out;
        match report {
            FinalReport::Exited(code) => info.exit_code = Some(code),
            FinalReport::Signaled(sig) => info.signal = Some(sig),
            FinalReport::SpawnError(msg) => info.spawn_error = Some(msg),
            // The shim itself was killed: only SIGKILL of the whole sandbox does that.
            FinalReport::None => info.signal = Some(libc::SIGKILL),
            FinalReport::Lost(msg) => {
                info.signal = Some(libc::SIGKILL);
                info.spawn_error = Some(msg);
            }
            FinalReport::Tampered(why) => {
                info.spawn_error =
                    Some(format!("the process's exit status is unknown: its report channel carried {why}"))
            }
        }
        info.oom_killed = info.signal == Some(libc::SIGKILL) && oom_after > opts.oom_before && !timed_out;
    }
    if oom_after > opts.oom_before {
        if let Ok(Some(rec)) = st.db.sandbox_by_id(&sandbox_id) {
            record::refresh_oom(&st, &rec);
        }
    }
    *p.reattach.lock().unwrap_or_else(|e| e.into_inner()) = None;
    *p.stdin.lock().await = None;
    st.metrics.observe("exec", spawned_at.elapsed());
    // The idle clock starts when the last process ends, not when it was started.
    st.activity.touch(&sandbox_id);
    p.bump();
}

/// Installs a process's stdin pipe. Initial stdin is written while output is
/// already being read (a process that writes before it reads must not deadlock
/// on full pipes); the lock keeps later writes behind it. A process that exits
/// without reading its stdin is not an error.
async fn attach_stdin(p: &Arc<Proc>, fd: OwnedFd, data: Option<Vec<u8>>, keep_open: bool) {
    let Ok(tx) = PipeSender::from_owned_fd(fd) else { return };
    let mut guard = p.stdin.clone().lock_owned().await;
    *guard = Some(tx);
    tokio::spawn(async move {
        if let (Some(data), Some(s)) = (data, guard.as_mut()) {
            let _ = s.write_all(&data).await;
        }
        if !keep_open {
            *guard = None;
        }
    });
}

/// Copies one output pipe into the process's log, redacting secret values
/// (a value split across reads is caught; see [`crate::secrets::Redactor`]).
async fn pump(
    st: Shared,
    sandbox_id: String,
    p: Arc<Proc>,
    fd: OwnedFd,
    stream: StreamKind,
    mut redactor: Option<crate::secrets::Redactor>,
) {
    let Ok(mut r) = tokio::net::unix::pipe::Receiver::from_owned_fd(fd) else { return };
    let mut buf = vec![0u8; 64 * 1024];
    let append = |data: Bytes| {
        if p.append(stream, data) {
            st.processes.enforce_log_budget(&sandbox_id);
        }
    };
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => match redactor.as_mut() {
                Some(red) => {
                    let out = red.feed(&buf[..n]);
                    if !out.is_empty() {
                        append(Bytes::from(out));
                    }
                }
                None => append(Bytes::copy_from_slice(&buf[..n])),
            },
        }
    }
    if let Some(out) = redactor.as_mut().map(|r| r.finish()).filter(|o| !o.is_empty()) {
        append(Bytes::from(out));
    }
    // An exit leaves output behind: hold the sandbox to its budget now too.
    st.processes.enforce_log_budget(&sandbox_id);
}

enum FinalReport {
    /// The report pipe closed without a final word.
    None,
    /// Lost with the sandbox, with the reason.
    Lost(String),
    Exited(i32),
    Signaled(i32),
    SpawnError(String),
    /// The channel carried something the shim never writes; the process's
    /// status is unknown.
    Tampered(String),
}

/// How long a process's output pipes may stay open after its final report
/// (its exec helper exits right after writing it).
const OUTPUT_DRAIN_LIMIT: Duration = Duration::from_secs(10);

/// Longest report line the shim writes (its spawn errors are short): a longer
/// one did not come from the shim.
const MAX_REPORT_LINE: u64 = 16 * 1024;
/// Most report lines one process's shim writes (its terminal, its pid, a spawn error, its end).
const MAX_REPORT_LINES: usize = 8;

async fn read_reports(p: Arc<Proc>, fd: OwnedFd) -> FinalReport {
    let rx = match tokio::net::unix::pipe::Receiver::from_owned_fd(fd) {
        Ok(rx) => rx,
        Err(e) => {
            warn!(error = %e, "exec report pipe");
            return FinalReport::None;
        }
    };
    let report = parse_reports(BufReader::new(rx), |early| {
        match early {
            Early::Pid(pid) => p.lock().info.pid = Some(pid),
            Early::Tty(index) => p.lock().tty_index = Some(index),
        }
        p.bump();
    })
    .await;
    if let FinalReport::Tampered(why) = &report {
        warn!(command = ?p.info().cmd, why, "exec report channel");
    }
    report
}

/// Reads the shim's report lines, each at most [`MAX_REPORT_LINE`] bytes and
/// at most [`MAX_REPORT_LINES`] of them, so nothing written into the channel
/// can grow the daemon; anything else ends the channel as [`FinalReport::Tampered`].
/// A report that comes before a process's end.
#[derive(Debug, PartialEq)]
enum Early {
    /// Its pid inside.
    Pid(i32),
    /// Its terminal, `/dev/pts/N` inside.
    Tty(u32),
}

async fn parse_reports<R: tokio::io::AsyncBufRead + Unpin>(mut r: R, mut on_early: impl FnMut(Early)) -> FinalReport {
    let mut last = FinalReport::None;
    for _ in 0..MAX_REPORT_LINES {
        let mut line = Vec::new();
        match (&mut r).take(MAX_REPORT_LINE + 1).read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return last,
            Ok(_) if line.last() != Some(&b'\n') => {
                return if line.len() as u64 > MAX_REPORT_LINE {
                    FinalReport::Tampered(format!(
                        "a report line over {} KiB (the shim writes short lines)",
                        MAX_REPORT_LINE / 1024
                    ))
                } else {
                    last // the channel closed mid-line
                };
            }
            Ok(_) => {}
        }
        match serde_json::from_slice::<ExecReport>(&line) {
            Ok(ExecReport::NsPid { pid }) => on_early(Early::Pid(pid)),
            Ok(ExecReport::Tty { index }) => on_early(Early::Tty(index)),
            Ok(ExecReport::SpawnError { message }) => last = FinalReport::SpawnError(message),
            // A spawn error is followed by the helper reporting its child's exit (127): keep the error.
            // The exit line is the helper's last word: stop there rather than wait for EOF.
            Ok(ExecReport::Exited { code }) => {
                if !matches!(last, FinalReport::SpawnError(_)) {
                    last = FinalReport::Exited(code);
                }
                return last;
            }
            Ok(ExecReport::Signaled { signal }) => {
                if !matches!(last, FinalReport::SpawnError(_)) {
                    last = FinalReport::Signaled(signal);
                }
                return last;
            }
            Err(_) => {
                return FinalReport::Tampered(format!("a report line that is not the shim's ({} bytes)", line.len()))
            }
        }
    }
    FinalReport::Tampered(format!("more than {MAX_REPORT_LINES} report lines (the shim writes at most 3)"))
}

/// Sends a process's events from `offset` to `tx` (a `Started` first when
/// `started`), following new output until it exits when `follow` is set.
pub async fn follow_events(
    p: Arc<Proc>,
    offset: u64,
    follow: bool,
    started: bool,
    tx: tokio::sync::mpsc::Sender<ProcessEvent>,
) {
    let mut changed = p.changed.subscribe();
    if started && tx.send(ProcessEvent::Started { process: p.info() }).await.is_err() {
        return;
    }
    let mut off = offset;
    loop {
        changed.mark_unchanged();
        let (evs, next, done) = p.read_from(off);
        off = next;
        for ev in evs {
            if tx.send(ev).await.is_err() {
                return;
            }
        }
        if let Some(info) = done {
            // Output that arrives after exit (from background children) is left to later reads.
            let _ = tx.send(ProcessEvent::Exited { process: info }).await;
            return;
        }
        if !follow || changed.changed().await.is_err() {
            return;
        }
    }
}

/// Follows a process from its first byte until it exits.
pub async fn follow(p: Arc<Proc>, tx: tokio::sync::mpsc::Sender<ProcessEvent>) {
    follow_events(p, 0, true, false, tx).await
}

pub fn parse_signal(s: &str) -> EngineResult<Signal> {
    if let Ok(n) = s.parse::<i32>() {
        return Signal::try_from(n).map_err(|_| EngineError::bad_request(format!("unknown signal {s:?}")));
    }
    let upper = s.to_ascii_uppercase();
    let name = if upper.starts_with("SIG") { upper } else { format!("SIG{upper}") };
    name.parse::<Signal>().map_err(|_| EngineError::bad_request(format!("unknown signal {s:?}")))
}

pub fn get_proc(st: &Shared, sandbox: &str, pid: u64) -> EngineResult<Arc<Proc>> {
    let rec = load(st, sandbox)?;
    st.processes.get(&rec.sandbox.id, pid).ok_or_else(|| {
        EngineError::new(ErrorCode::ProcessNotFound, format!("no process {pid} in sandbox {}", rec.sandbox.id))
    })
}

/// Sends `signal` (a name like `TERM`/`SIGKILL` or a number) to a process
/// started through the API; a process started a moment ago is given up to 5 s
/// to report its pid. 409 when it is not running.
pub async fn signal(st: &Shared, id: &str, pid: u64, signal: &str) -> EngineResult<ProcessInfo> {
    let sig = parse_signal(signal)?;
    let p = get_proc(st, id, pid)?;
    // A process started a moment ago may not have reported its pid yet.
    let sandbox_id = p.info().sandbox_id;
    match p.pid_when_started(Duration::from_secs(5)).await {
        Some(ns) if st.runtime_by_id(&sandbox_id).signal(&sandbox_id, ns, sig as i32, false) > 0 => Ok(p.info()),
        _ => Err(EngineError::new(ErrorCode::InvalidState, format!("process {pid} is not running"))),
    }
}

/// Resizes the terminal of a process started with `tty`; a process started
/// a moment ago is given up to 5 s to report its pid. 409 when it has no
/// terminal or is not running.
pub async fn resize_tty(st: &Shared, id: &str, pid: u64, size: TtySize) -> EngineResult<ProcessInfo> {
    if let Some(why) = size.invalid() {
        return Err(EngineError::bad_request(why));
    }
    let p = get_proc(st, id, pid)?;
    if p.info().tty.is_none() {
        return Err(EngineError::new(
            ErrorCode::InvalidState,
            format!("process {pid} has no terminal (start it with tty)"),
        ));
    }
    let sandbox_id = p.info().sandbox_id;
    let not_running = || EngineError::new(ErrorCode::InvalidState, format!("process {pid} is not running"));
    let ns_pid = p.pid_when_started(Duration::from_secs(5)).await.ok_or_else(not_running)?;
    let rec = load(st, &sandbox_id)?;
    let handle = handle_of(&rec).ok_or_else(not_running)?;
    let index = p.lock().tty_index;
    let rt = st.runtime_by_id(&sandbox_id);
    let size_rt = strata_runtime::spec::TtySize { cols: size.cols, rows: size.rows };
    let resized = tokio::task::spawn_blocking(move || rt.resize_tty(&sandbox_id, &handle, ns_pid, index, size_rt))
        .await
        .map_err(|e| EngineError::internal("resize a terminal", &e))?;
    match resized {
        Ok(()) => {
            p.lock().info.tty = Some(size);
            p.bump();
            Ok(p.info())
        }
        Err(_) if p.info().status != ProcessStatus::Running => Err(not_running()),
        Err(e) => Err(EngineError::internal("resize a terminal", &e)),
    }
}

/// Writes `data` to the stdin of a process started with `keep_stdin_open`,
/// then closes it with `close`. 409 when its stdin is closed.
pub async fn write_stdin(st: &Shared, id: &str, pid: u64, data: &[u8], close: bool) -> EngineResult<()> {
    let p = get_proc(st, id, pid)?;
    let mut guard = p.stdin.lock().await;
    let Some(stdin) = guard.as_mut() else {
        return Err(EngineError::new(
            ErrorCode::InvalidState,
            format!("stdin of process {pid} is closed (start it with keep_stdin_open)"),
        ));
    };
    if !data.is_empty() {
        stdin
            .write_all(data)
            .await
            .map_err(|e| EngineError::new(ErrorCode::InvalidState, format!("stdin of process {pid}: {e}")))?;
        stdin
            .flush()
            .await
            .map_err(|e| EngineError::new(ErrorCode::InvalidState, format!("stdin of process {pid}: {e}")))?;
    }
    if close {
        *guard = None;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_buffer_drops_oldest_and_reports_it() {
        let mut b = LogBuf::default();
        let chunk = Bytes::from(vec![b'x'; (LOG_CAP_BYTES / 2) as usize]);
        b.push(StreamKind::Stdout, chunk.clone());
        b.push(StreamKind::Stderr, chunk.clone());
        assert_eq!(b.start, 0);
        b.push(StreamKind::Stdout, Bytes::from_static(b"y"));
        assert_eq!(b.start, LOG_CAP_BYTES / 2);
        assert_eq!(b.end, LOG_CAP_BYTES + 1);
    }

    fn parse(input: &[u8]) -> (FinalReport, Vec<i32>) {
        let mut pids = Vec::new();
        let r = rt().block_on(parse_reports(input, |e| {
            if let Early::Pid(p) = e {
                pids.push(p)
            }
        }));
        (r, pids)
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().build().unwrap()
    }

    #[test]
    fn reports_are_read_up_to_the_final_line() {
        let (r, pids) = parse(
            b"{\"type\":\"ns_pid\",\"pid\":7}\n{\"type\":\"exited\",\"code\":3}\n{\"type\":\"exited\",\"code\":0}\n",
        );
        assert!(matches!(r, FinalReport::Exited(3)), "the first final line wins");
        assert_eq!(pids, [7]);
        let (r, _) = parse(b"{\"type\":\"spawn_error\",\"message\":\"no\"}\n{\"type\":\"exited\",\"code\":127}\n");
        assert!(matches!(r, FinalReport::SpawnError(m) if m == "no"));
        assert!(matches!(parse(b"").0, FinalReport::None));
        assert!(matches!(parse(b"{\"type\":\"ns_pid\",\"pid\":7}\n{\"type\":\"exi").0, FinalReport::None));
    }

    #[test]
    fn a_report_channel_cannot_grow_the_daemon() {
        // 64 MiB without a newline: read no further than one line's bound.
        struct Endless(u64);
        impl tokio::io::AsyncRead for Endless {
            fn poll_read(
                mut self: std::pin::Pin<&mut Self>,
                _: &mut std::task::Context<'_>,
                buf: &mut tokio::io::ReadBuf<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                let n = buf.remaining().min(64 << 20usize.saturating_sub(self.0 as usize));
                buf.put_slice(&vec![b'x'; n]);
                self.0 += n as u64;
                std::task::Poll::Ready(Ok(()))
            }
        }
        let mut src = Endless(0);
        let r = rt().block_on(parse_reports(tokio::io::BufReader::new(&mut src), |_| {}));
        assert!(matches!(&r, FinalReport::Tampered(w) if w.contains("over 16 KiB")), "a line without end is refused");
        assert!(src.0 <= MAX_REPORT_LINE + 64 * 1024, "read {} bytes of it", src.0);
        // Lines that are not the shim's, and too many lines.
        assert!(matches!(parse(b"hello\n").0, FinalReport::Tampered(_)));
        let many = "{\"type\":\"ns_pid\",\"pid\":7}\n".repeat(100);
        assert!(matches!(parse(many.as_bytes()).0, FinalReport::Tampered(w) if w.contains("more than")));
    }

    #[test]
    fn trimming_keeps_the_newest_output() {
        let mut b = LogBuf::default();
        for i in 0..10u8 {
            b.push(StreamKind::Stdout, Bytes::from(vec![i; 1000]));
        }
        assert_eq!(b.trim_to(2500), 7000, "whole chunks go, oldest first, as long as 2500 bytes stay");
        assert_eq!((b.start, b.end, b.retained()), (7000, 10000, 3000));
        assert_eq!(b.chunks.front().unwrap().2[0], 7);
        assert_eq!(b.trim_to(0), 3000);
        assert_eq!((b.start, b.end), (10000, 10000), "offsets go on where they were");
    }

    #[test]
    fn a_sandbox_keeps_its_processes_output_within_its_budget() {
        let table = ProcessTable::default();
        // Chunks as the pumps read them.
        let chunk = Bytes::from(vec![b'x'; 64 << 10]);
        // 20 exited processes with 8 MiB each, then 20 running ones writing 8 MiB each.
        for i in 0..40 {
            let p = table.insert("sb", vec![format!("p{i}")]);
            for _ in 0..128 {
                if p.append(StreamKind::Stdout, chunk.clone()) {
                    table.enforce_log_budget("sb");
                }
            }
            if i < 20 {
                p.lock().info.status = ProcessStatus::Exited;
            }
            table.enforce_log_budget("sb");
        }
        let procs: Vec<Arc<Proc>> = table.lock()["sb"].procs.values().cloned().collect();
        let total: u64 = procs.iter().map(|p| p.lock().log.retained()).sum();
        assert!(total <= SANDBOX_LOG_BUDGET + chunk.len() as u64, "{} MiB kept", total >> 20);
        // The exited ones gave theirs up first; every running one keeps its newest output.
        assert!(procs[..20].iter().all(|p| p.lock().log.retained() == 0));
        assert!(procs[20..].iter().all(|p| p.lock().log.retained() >= LOG_FLOOR_BYTES));
        let newest = procs.last().unwrap();
        assert_eq!(newest.lock().log.end, 8 << 20, "offsets count everything written");
    }

    #[test]
    fn signals_parse_by_name_and_number() {
        assert_eq!(parse_signal("TERM").unwrap(), Signal::SIGTERM);
        assert_eq!(parse_signal("sigkill").unwrap(), Signal::SIGKILL);
        assert_eq!(parse_signal("2").unwrap(), Signal::SIGINT);
        assert!(parse_signal("NOPE").is_err());
    }
}
