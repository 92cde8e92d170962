//! Processes: run to the end, start in the background, list, logs, wait,
//! signals, stdin.

use std::sync::Arc;
use std::time::Duration;

use strata_api::{ExecRequest, ExecResult, ProcessEvent, ProcessInfo, StdinRequest};

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

    /// Writes to a process's stdin (and closes it with `close`).
    pub async fn write_stdin(&self, key: &str, pid: u64, req: &StdinRequest) -> EngineResult<()> {
        use base64::Engine;
        let data =
            processes::B64.decode(&req.data_b64).map_err(|e| EngineError::bad_request(format!("data_b64: {e}")))?;
        let sb = self.enter(key, Use::Running).await?;
        self.run(processes::write_stdin(&self.st, &sb.id, pid, &data, req.close)).await
    }
}
