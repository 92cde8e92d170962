//! The engine's surface for front ends: an [`Engine`] is the engine acting
//! for one explicit [`Caller`] (made from a request's credentials by the
//! front end), with one method per operation. Each call does what the native
//! route of the same operation does: the sandbox is entered through
//! [`crate::access::enter`] with the same [`Use`] as the native route table
//! gives it (tenancy, activity, resume on access), and the operation runs as
//! the caller (so the Rule of Two, quotas and tenancy apply). The E2B API
//! calls the engine only through it; the native handlers still call the
//! operations' modules with the caller their middleware set, and MCP still
//! goes through the native API. Audit is the front ends' (they know the
//! request).

use std::sync::Arc;

use crate::access::{enter, Entered, Use};
use crate::activity::ActivityGuard;
use crate::caller::{run_as, Caller};
use crate::error::{EngineError, EngineResult};
use crate::state::Shared;
use crate::{files, processes};
use bytes::Bytes;
use strata_api::{
    Checkpoint, CheckpointRequest, CostReport, CreatePreviewRequest, CreateSandboxRequest, CreatedPreview,
    CreatedSandbox, DownloadQuery, ExecRequest, ExecResult, FileChange, FileStat, ForkRequest, ForkResult, NetworkInfo,
    NetworkSpec, ProcessEvent, ProcessInfo, RestoreRequest, RestoreResult, ResumeResult, Sandbox, SandboxEvent,
    StandbyRequest, StdinRequest, UpdateSandboxRequest, UploadQuery,
};

/// The engine, acting for one caller.
#[derive(Clone)]
pub struct Engine {
    st: Shared,
    caller: Caller,
}

/// A process's events as they come, holding the sandbox awake until dropped.
pub struct Events {
    rx: tokio::sync::mpsc::Receiver<ProcessEvent>,
    _hold: Option<ActivityGuard>,
}

impl Events {
    /// The next event; `None` once the process's log ended.
    pub async fn next(&mut self) -> EngineResult<Option<ProcessEvent>> {
        Ok(self.rx.recv().await)
    }
}

/// A file's bytes as they are read, holding the sandbox awake until dropped.
pub struct Download {
    /// The file's length.
    pub len: Option<u64>,
    /// The bytes.
    pub stream: crate::transfer::ByteStream,
    /// Kept with the stream.
    pub hold: Option<ActivityGuard>,
}

impl Engine {
    /// The engine of `st`, acting for `caller`.
    pub fn new(st: Shared, caller: Caller) -> Engine {
        Engine { st, caller }
    }

    /// Who calls.
    pub fn caller(&self) -> &Caller {
        &self.caller
    }

    /// Runs `fut` as the caller.
    async fn run<T>(&self, fut: impl std::future::Future<Output = EngineResult<T>>) -> EngineResult<T> {
        run_as(self.caller.clone(), fut).await
    }

    /// Enters the sandbox `key` names for a call that needs `using` (as the caller).
    async fn enter(&self, key: &str, using: Use) -> EngineResult<Entered> {
        self.run(enter(&self.st, key, using)).await
    }

    // ---- sandboxes ----

    /// Creates and starts a sandbox.
    pub async fn create_sandbox(&self, req: &CreateSandboxRequest) -> EngineResult<CreatedSandbox> {
        let sb = self.run(crate::lifecycle::create(&self.st, req.clone())).await?;
        Ok(CreatedSandbox { id: sb.id, name: sb.name })
    }

    /// The caller's sandboxes.
    pub async fn list_sandboxes(&self) -> EngineResult<Vec<Sandbox>> {
        self.run(async { crate::record::list(&self.st) }).await
    }

    /// The full id of the sandbox `key` names for the caller (404 otherwise):
    /// a lookup only, none of what [`Engine::get_sandbox`] reads live.
    pub async fn sandbox_id(&self, key: &str) -> EngineResult<String> {
        self.run(async {
            crate::tenancy::resolve_sandbox_id(&self.st, key)?.ok_or_else(|| EngineError::sandbox_not_found(key))
        })
        .await
    }

    /// Inspects a sandbox.
    pub async fn get_sandbox(&self, key: &str) -> EngineResult<Sandbox> {
        self.run(async { crate::record::inspect(&self.st, key) }).await
    }

    /// Destroys a sandbox.
    pub async fn remove_sandbox(&self, key: &str, force: bool) -> EngineResult<SandboxEvent> {
        self.run(crate::lifecycle::destroy(&self.st, key, force, "user")).await
    }

    /// Changes a sandbox's policy or labels.
    pub async fn update_sandbox(&self, key: &str, req: &UpdateSandboxRequest) -> EngineResult<Sandbox> {
        self.run(async { crate::policy::update(&self.st, key, req) }).await
    }

    /// Resumes a parked sandbox.
    pub async fn resume_sandbox(&self, key: &str) -> EngineResult<ResumeResult> {
        self.run(crate::lifecycle::resume_parked(&self.st, key, "user")).await
    }

    /// Puts a sandbox into standby.
    pub async fn standby_sandbox(&self, key: &str, fs_only: bool) -> EngineResult<SandboxEvent> {
        self.run(crate::lifecycle::standby_with(&self.st, key, &StandbyRequest { fs_only }, "user")).await
    }

    /// Replaces a sandbox's network mode and rules.
    pub async fn set_network(&self, key: &str, spec: &NetworkSpec) -> EngineResult<NetworkInfo> {
        self.run(crate::network::update(&self.st, key, spec.clone())).await
    }

    /// Makes a preview of a sandbox's port.
    pub async fn create_preview(&self, key: &str, req: &CreatePreviewRequest) -> EngineResult<CreatedPreview> {
        self.run(async { crate::preview::create(&self.st, key, req) }).await
    }

    /// Lifecycle events of a sandbox after `after`.
    pub async fn events(&self, sandbox: Option<&str>, after: i64) -> EngineResult<Vec<SandboxEvent>> {
        self.run(async { crate::events::list(&self.st, sandbox, after) }).await
    }

    /// The cost report of a sandbox (destroyed ones too).
    pub async fn cost(&self, key: &str) -> EngineResult<CostReport> {
        self.run(crate::accounting::report_for(&self.st, key)).await
    }

    // ---- checkpoints ----

    /// Checkpoints a sandbox.
    pub async fn checkpoint(&self, key: &str, req: &CheckpointRequest) -> EngineResult<Checkpoint> {
        let sb = self.enter(key, Use::Contents).await?;
        self.run(crate::checkpoints::checkpoint(&self.st, sb.id(), req.clone())).await
    }

    /// The caller's checkpoints (of one sandbox when `sandbox` names one).
    pub async fn list_checkpoints(&self, sandbox: Option<&str>) -> EngineResult<Vec<Checkpoint>> {
        self.run(async { crate::checkpoints::list(&self.st, sandbox) }).await
    }

    /// Forks sandboxes from a checkpoint or a live sandbox.
    pub async fn fork(&self, req: &ForkRequest) -> EngineResult<ForkResult> {
        self.run(crate::checkpoints::fork(&self.st, req.clone())).await
    }

    /// Inspects a checkpoint.
    pub async fn get_checkpoint(&self, key: &str) -> EngineResult<Checkpoint> {
        self.run(async { crate::checkpoints::get(&self.st, key) }).await
    }

    /// Rolls a sandbox back to a checkpoint.
    pub async fn restore(&self, key: &str, req: &RestoreRequest) -> EngineResult<RestoreResult> {
        let sb = self.enter(key, Use::Contents).await?;
        self.run(crate::checkpoints::restore(&self.st, sb.id(), req.clone())).await
    }

    /// Paths added, modified and deleted since the last checkpoint (or since `against`).
    pub async fn diff(&self, key: &str, against: Option<&str>) -> EngineResult<Vec<FileChange>> {
        let sb = self.enter(key, Use::Contents).await?;
        self.run(crate::checkpoints::diff(&self.st, sb.id(), against)).await
    }

    /// Deletes a checkpoint.
    pub async fn delete_checkpoint(&self, key: &str) -> EngineResult<()> {
        self.run(crate::checkpoints::delete(&self.st, key)).await
    }

    // ---- processes ----

    /// Runs a command to its end and returns its output.
    pub async fn exec(&self, key: &str, req: &ExecRequest) -> EngineResult<ExecResult> {
        let sb = self.enter(key, Use::Running).await?;
        let p = self.run(processes::spawn(&self.st, sb.id(), req.clone())).await?;
        Ok(p.result().await)
    }

    /// Starts a background process.
    pub async fn start_process(&self, key: &str, req: &ExecRequest) -> EngineResult<ProcessInfo> {
        let sb = self.enter(key, Use::Running).await?;
        Ok(self.run(processes::spawn(&self.st, sb.id(), req.clone())).await?.info())
    }

    /// The processes started through the API.
    pub async fn list_processes(&self, key: &str) -> EngineResult<Vec<ProcessInfo>> {
        let sb = self.enter(key, Use::Contents).await?;
        Ok(self.st.processes.list(sb.id()))
    }

    /// One process.
    pub async fn get_process(&self, key: &str, pid: u64) -> EngineResult<ProcessInfo> {
        let sb = self.enter(key, Use::Contents).await?;
        Ok(self.run(async { processes::get_proc(&self.st, sb.id(), pid) }).await?.info())
    }

    /// A process's events from `offset`, following new ones when `follow` is set.
    pub async fn logs(&self, key: &str, pid: u64, offset: u64, follow: bool) -> EngineResult<Events> {
        let sb = self.enter(key, Use::Contents).await?;
        let p = self.run(async { processes::get_proc(&self.st, sb.id(), pid) }).await?;
        let (tx, rx) = tokio::sync::mpsc::channel::<ProcessEvent>(32);
        tokio::spawn(processes::follow_events(Arc::clone(&p), offset, follow, false, tx));
        Ok(Events { rx, _hold: sb.into_hold() })
    }

    /// Sends a signal to a process.
    pub async fn signal(&self, key: &str, pid: u64, signal: &str) -> EngineResult<ProcessInfo> {
        let sb = self.enter(key, Use::Running).await?;
        self.run(processes::signal(&self.st, sb.id(), pid, signal)).await
    }

    /// Writes to a process's stdin (and closes it with `close`).
    pub async fn write_stdin(&self, key: &str, pid: u64, req: &StdinRequest) -> EngineResult<()> {
        use base64::Engine;
        let data =
            processes::B64.decode(&req.data_b64).map_err(|e| EngineError::bad_request(format!("data_b64: {e}")))?;
        let sb = self.enter(key, Use::Running).await?;
        self.run(processes::write_stdin(&self.st, sb.id(), pid, &data, req.close)).await
    }

    // ---- files ----

    /// A path's metadata.
    pub async fn stat(&self, key: &str, path: &str) -> EngineResult<FileStat> {
        let path = path.to_string();
        self.with_fs(key, move |fs| fs.stat(&path)).await
    }

    /// A directory's entries.
    pub async fn list_dir(&self, key: &str, path: &str) -> EngineResult<Vec<FileStat>> {
        let path = path.to_string();
        self.with_fs(key, move |fs| fs.list(&path)).await
    }

    /// Creates a directory (and its missing parents with `parents`).
    pub async fn mkdir(&self, key: &str, path: &str, parents: bool) -> EngineResult<()> {
        let path = path.to_string();
        self.with_fs(key, move |fs| fs.mkdir(&path, parents, 0o755)).await
    }

    /// Removes a path (a directory with `recursive`).
    pub async fn remove_path(&self, key: &str, path: &str, recursive: bool) -> EngineResult<()> {
        let path = path.to_string();
        self.with_fs(key, move |fs| fs.remove(&path, recursive)).await
    }

    /// Renames a path.
    pub async fn move_path(&self, key: &str, from: &str, to: &str) -> EngineResult<()> {
        let (from, to) = (from.to_string(), to.to_string());
        self.with_fs(key, move |fs| fs.rename(&from, &to)).await
    }

    /// A file's bytes, streamed as they are read.
    pub async fn download_stream(&self, key: &str, path: &str) -> EngineResult<Download> {
        let sb = self.enter(key, Use::Running).await?;
        let q = DownloadQuery { path: path.to_string(), tar: false };
        let d = self.run(files::download(&self.st, sb.id(), q)).await?;
        Ok(Download { len: d.len, stream: d.stream, hold: sb.into_hold() })
    }

    /// Writes a file from `chunks` (replaced whole once complete).
    pub async fn upload_stream<S>(&self, key: &str, path: &str, chunks: S) -> EngineResult<()>
    where
        S: futures_util::Stream<Item = std::io::Result<Bytes>>,
    {
        let sb = self.enter(key, Use::Running).await?;
        let q = UploadQuery { path: path.to_string(), mode: None, tar: false };
        self.run(files::upload(&self.st, sb.id(), q, Box::pin(chunks))).await
    }

    async fn with_fs<T: Send + 'static>(
        &self,
        key: &str,
        f: impl FnOnce(crate::sandboxfs::SandboxFs) -> Result<T, crate::sandboxfs::FsError> + Send + 'static,
    ) -> EngineResult<T> {
        let sb = self.enter(key, Use::Running).await?;
        self.run(files::with_fs(&self.st, sb.id(), f)).await
    }
}
