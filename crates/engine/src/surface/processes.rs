//! Processes: run to the end, start in the background, list, logs, wait,
//! signals, stdin, terminals.

use std::sync::Arc;
use std::time::Duration;

use strata_api::{ErrorCode, ExecRequest, ExecResult, ProcessEvent, ProcessInfo, StdinRequest, TtySize};

use super::{Engine, Events};
use crate::access::Use;
use crate::error::{EngineError, EngineResult};
use crate::processes::{self, Proc};

/// The events of `p` from `offset` (`started`: from the process's start, as exec streams them).
fn events_of(
    p: Arc<Proc>,
    offset: u64,
    follow: bool,
    started: bool,
    hold: Option<crate::activity::ActivityGuard>,
) -> Events {
    let (tx, rx) = tokio::sync::mpsc::channel::<ProcessEvent>(32);
    tokio::spawn(processes::follow_events(p, offset, follow, started, tx));
    Events { rx, _hold: hold }
}

/// A process's terminal, attached ([`Engine::attach_tty`]): its output as
/// events, and its input and size. Holds the sandbox awake while it lives.
pub struct Terminal {
    /// Its output (from the offset asked), drops, and its end.
    pub events: Events,
    /// Typing into it and resizing it, as the caller who attached.
    pub input: TerminalInput,
}

/// The input side of an attached [`Terminal`].
#[derive(Clone)]
pub struct TerminalInput {
    engine: Engine,
    sandbox: String,
    pid: u64,
}

impl TerminalInput {
    /// Types `data` into the terminal.
    pub async fn write(&self, data: &[u8]) -> EngineResult<()> {
        let e = &self.engine;
        e.run(processes::write_stdin(&e.st, &self.sandbox, self.pid, data, false)).await
    }

    /// Resizes the terminal.
    pub async fn resize(&self, size: TtySize) -> EngineResult<ProcessInfo> {
        let e = &self.engine;
        e.run(processes::resize_tty(&e.st, &self.sandbox, self.pid, size)).await
    }
}

impl Engine {
    /// Runs a command to its end and returns its output.
    pub async fn exec(&self, key: &str, req: &ExecRequest) -> EngineResult<ExecResult> {
        let sb = self.enter(key, Use::Running).await?;
        let p = self.run(processes::spawn(&self.st, &sb.id, req.clone())).await?;
        Ok(p.result().await)
    }

    /// Runs a command and streams its events while it runs.
    pub async fn exec_streaming(&self, key: &str, req: &ExecRequest) -> EngineResult<Events> {
        let sb = self.enter(key, Use::Running).await?;
        let p = self.run(processes::spawn(&self.st, &sb.id, req.clone())).await?;
        Ok(events_of(p, 0, true, true, sb.hold))
    }

    /// Starts a background process.
    pub async fn start_process(&self, key: &str, req: &ExecRequest) -> EngineResult<ProcessInfo> {
        let sb = self.enter(key, Use::Running).await?;
        Ok(self.run(processes::spawn(&self.st, &sb.id, req.clone())).await?.info())
    }

    /// The processes started through the API.
    pub async fn list_processes(&self, key: &str) -> EngineResult<Vec<ProcessInfo>> {
        let sb = self.enter(key, Use::Contents).await?;
        let rec = self.record_of(&sb).await?;
        Ok(self.st.processes.list(&rec.sandbox.id))
    }

    /// Whether the sandbox is being destroyed or is gone: a process of it that
    /// ended just now was killed with it (an E2B stream then ends as E2B's do).
    pub async fn sandbox_destroyed(&self, key: &str) -> bool {
        match self.get_sandbox(key).await {
            Ok(s) => s.state == strata_api::SandboxState::Destroyed || self.st.processes.is_destroying(&s.id),
            Err(e) => e.code() == strata_api::ErrorCode::SandboxNotFound,
        }
    }

    /// One process.
    pub async fn get_process(&self, key: &str, pid: u64) -> EngineResult<ProcessInfo> {
        let sb = self.enter(key, Use::Contents).await?;
        Ok(self.run(async { processes::get_proc(&self.st, &sb.id, pid) }).await?.info())
    }

    /// A process's events from `offset`, following new ones when `follow` is set.
    pub async fn logs(&self, key: &str, pid: u64, offset: u64, follow: bool) -> EngineResult<Events> {
        let sb = self.enter(key, Use::Contents).await?;
        let p = self.run(async { processes::get_proc(&self.st, &sb.id, pid) }).await?;
        Ok(events_of(p, offset, follow, false, sb.hold))
    }

    /// Waits for a process to exit (at most `limit`) and returns its record.
    pub async fn wait(&self, key: &str, pid: u64, limit: Option<Duration>) -> EngineResult<ProcessInfo> {
        let sb = self.enter(key, Use::Contents).await?;
        let p = self.run(async { processes::get_proc(&self.st, &sb.id, pid) }).await?;
        Ok(p.wait(limit).await)
    }

    /// Sends a signal to a process.
    pub async fn signal(&self, key: &str, pid: u64, signal: &str) -> EngineResult<ProcessInfo> {
        let sb = self.enter(key, Use::Running).await?;
        self.run(processes::signal(&self.st, &sb.id, pid, signal)).await
    }

    /// Resizes the terminal of a process started with `tty`.
    pub async fn resize_tty(&self, key: &str, pid: u64, size: TtySize) -> EngineResult<ProcessInfo> {
        let sb = self.enter(key, Use::Running).await?;
        self.run(processes::resize_tty(&self.st, &sb.id, pid, size)).await
    }

    /// Attaches to the terminal of a process started with `tty`: its output
    /// from `offset` (default: from now on), its input and its size. 409
    /// when it has no terminal or has ended.
    pub async fn attach_tty(&self, key: &str, pid: u64, offset: Option<u64>) -> EngineResult<Terminal> {
        let sb = self.enter(key, Use::Running).await?;
        let p = self.run(async { processes::get_proc(&self.st, &sb.id, pid) }).await?;
        let info = p.info();
        if info.tty.is_none() {
            return Err(EngineError::new(
                ErrorCode::InvalidState,
                format!("process {pid} has no terminal (start it with tty)"),
            ));
        }
        if info.status != strata_api::ProcessStatus::Running {
            return Err(EngineError::new(ErrorCode::InvalidState, format!("process {pid} has ended")));
        }
        let offset = offset.unwrap_or_else(|| p.log_end());
        let input = TerminalInput { engine: self.clone(), sandbox: sb.id.clone(), pid };
        Ok(Terminal { events: events_of(p, offset, true, false, sb.hold), input })
    }

    /// Writes to a process's stdin (and closes it with `close`).
    pub async fn write_stdin(&self, key: &str, pid: u64, req: &StdinRequest) -> EngineResult<()> {
        use base64::Engine;
        let data =
            processes::B64.decode(&req.data_b64).map_err(|e| EngineError::bad_request(format!("data_b64: {e}")))?;
        let sb = self.enter(key, Use::Running).await?;
        self.run(processes::write_stdin(&self.st, &sb.id, pid, &data, req.close)).await
    }
}
