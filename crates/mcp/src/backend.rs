//! What the tools call: a [`Backend`], one method per operation they use, each
//! made for the caller of one tool call (found in the call's [`Extensions`]).
//!
//! Two implementations: [`ClientBackend`] (here: the daemon's native API over
//! HTTP through [`strata_client::Client`], for `strata mcp` on stdio) and the
//! daemon's in-process one (`strata-server`'s `mcp` module: the engine itself,
//! for the daemon's `/mcp`). Both answer errors in one form, [`BackendError`]:
//! the API's error body and its HTTP status.

use std::pin::Pin;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::{Stream, StreamExt};
pub use rmcp::model::Extensions;
use strata_api::{
    ApiErrorBody, Checkpoint, CheckpointRequest, CreateSandboxRequest, CreatedSandbox, ExecRequest, ExecResult,
    FileChange, FileStat, ForkRequest, ForkResult, RestoreRequest, RestoreResult, ResumeResult, Sandbox, SandboxEvent,
};
use strata_client::{Client, ClientError};

/// Why a backend call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BackendError {
    /// The API refused or failed: its error body and HTTP status (the one the
    /// native API answers, for the in-process backend too).
    #[error("{} ({}, HTTP {status})", body.message, body.code)]
    Api {
        /// HTTP status.
        status: u16,
        /// The error body.
        body: ApiErrorBody,
    },
    /// The daemon could not be reached ([`ClientBackend`]).
    #[error("{0}")]
    Unreachable(String),
    /// Anything else: a broken exchange, an undecodable answer, a failed read.
    #[error("{0}")]
    Failed(String),
}

impl BackendError {
    /// The API error `body`, with its code's HTTP status.
    pub fn api(body: ApiErrorBody) -> Self {
        BackendError::Api { status: body.code.http_status(), body }
    }
}

impl From<ClientError> for BackendError {
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::Api { status, body } => BackendError::Api { status, body },
            ClientError::Connect { .. } => BackendError::Unreachable(e.to_string()),
            other => BackendError::Failed(other.to_string()),
        }
    }
}

/// Result of a backend call.
pub type BackendResult<T> = Result<T, BackendError>;

/// A file's bytes as they are read.
pub struct Download {
    /// The file's length, when known before reading.
    pub len: Option<u64>,
    /// The bytes, chunk by chunk; dropping it stops the transfer.
    pub chunks: Pin<Box<dyn Stream<Item = BackendResult<Bytes>> + Send>>,
}

/// A mutating tool call that finished, for [`Backend::record`].
#[derive(Debug, Clone, Copy)]
pub struct ToolCall<'a> {
    /// The tool's name (`exec`, `destroy`, ...).
    pub tool: &'a str,
    /// What it acted on: the sandbox (or fork source) as the call named it,
    /// or the sandbox it created.
    pub target: Option<&'a str>,
    /// Its outcome as an HTTP status (200 for success).
    pub status: u16,
}

/// The operations the tools use, each for the caller of one tool call: `cx`
/// is the call's extensions (over streamable HTTP they hold the request's
/// [`http::request::Parts`]: its headers and, in the daemon, its
/// authenticated caller). Sandboxes and checkpoints are named by id or name.
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// The caller's sandboxes.
    async fn list_sandboxes(&self, cx: &Extensions) -> BackendResult<Vec<Sandbox>>;
    /// Creates and starts a sandbox.
    async fn create_sandbox(&self, cx: &Extensions, req: &CreateSandboxRequest) -> BackendResult<CreatedSandbox>;
    /// Inspects a sandbox.
    async fn get_sandbox(&self, cx: &Extensions, sandbox: &str) -> BackendResult<Sandbox>;
    /// Destroys a sandbox (forcefully: running processes are killed).
    async fn remove_sandbox(&self, cx: &Extensions, sandbox: &str) -> BackendResult<SandboxEvent>;
    /// Puts a sandbox into standby.
    async fn standby_sandbox(&self, cx: &Extensions, sandbox: &str, fs_only: bool) -> BackendResult<SandboxEvent>;
    /// Resumes a parked sandbox.
    async fn resume_sandbox(&self, cx: &Extensions, sandbox: &str) -> BackendResult<ResumeResult>;
    /// Runs a command to its end.
    async fn exec(&self, cx: &Extensions, sandbox: &str, req: &ExecRequest) -> BackendResult<ExecResult>;
    /// A path's metadata.
    async fn stat(&self, cx: &Extensions, sandbox: &str, path: &str) -> BackendResult<FileStat>;
    /// A directory's entries.
    async fn list_dir(&self, cx: &Extensions, sandbox: &str, path: &str) -> BackendResult<Vec<FileStat>>;
    /// Creates a directory and its missing parents.
    async fn mkdir(&self, cx: &Extensions, sandbox: &str, path: &str) -> BackendResult<()>;
    /// A regular file's bytes.
    async fn download(&self, cx: &Extensions, sandbox: &str, path: &str) -> BackendResult<Download>;
    /// Writes a whole file with permission bits `mode`.
    async fn upload(&self, cx: &Extensions, sandbox: &str, path: &str, data: Bytes, mode: u32) -> BackendResult<()>;
    /// Checkpoints a sandbox.
    async fn checkpoint(&self, cx: &Extensions, sandbox: &str, req: &CheckpointRequest) -> BackendResult<Checkpoint>;
    /// The caller's checkpoints (of one sandbox when `sandbox` names one).
    async fn list_checkpoints(&self, cx: &Extensions, sandbox: Option<&str>) -> BackendResult<Vec<Checkpoint>>;
    /// Rolls a sandbox back to a checkpoint.
    async fn restore(&self, cx: &Extensions, sandbox: &str, req: &RestoreRequest) -> BackendResult<RestoreResult>;
    /// Forks sandboxes from a checkpoint or a live sandbox.
    async fn fork(&self, cx: &Extensions, req: &ForkRequest) -> BackendResult<ForkResult>;
    /// Paths changed since the last checkpoint (or since `against`).
    async fn diff(&self, cx: &Extensions, sandbox: &str, against: Option<&str>) -> BackendResult<Vec<FileChange>>;

    /// Called after each mutating tool call, for the audit log. The default
    /// records nothing: [`ClientBackend`]'s calls are API requests, which the
    /// daemon audits itself.
    fn record(&self, cx: &Extensions, call: &ToolCall<'_>) {
        let _ = (cx, call);
    }
}

/// The daemon's native API over HTTP (`strata mcp`): the calls are made as
/// whatever the client is configured as.
#[derive(Debug, Clone)]
pub struct ClientBackend {
    client: Client,
}

impl ClientBackend {
    /// A backend calling the daemon through `client`.
    pub fn new(client: Client) -> Self {
        ClientBackend { client }
    }

    /// The client for one call: the `X-Strata-Tenant` and `X-Strata-Approval`
    /// headers of the HTTP request the call came in (if any) go with it.
    fn client_for(&self, cx: &Extensions) -> Client {
        let parts = cx.get::<http::request::Parts>();
        let header = |name: &str| {
            parts.and_then(|p| p.headers.get(name)).and_then(|v| v.to_str().ok()).map(|v| v.trim().to_string())
        };
        let mut client = self.client.clone();
        if let Some(t) = header(strata_api::TENANT_HEADER) {
            client = client.with_tenant(Some(t));
        }
        if let Some(a) = header(strata_api::APPROVAL_HEADER) {
            client = client.with_approval(Some(a));
        }
        client
    }
}

#[async_trait]
impl Backend for ClientBackend {
    async fn list_sandboxes(&self, cx: &Extensions) -> BackendResult<Vec<Sandbox>> {
        Ok(self.client_for(cx).list_sandboxes().await?)
    }

    async fn create_sandbox(&self, cx: &Extensions, req: &CreateSandboxRequest) -> BackendResult<CreatedSandbox> {
        Ok(self.client_for(cx).create_sandbox(req).await?)
    }

    async fn get_sandbox(&self, cx: &Extensions, sandbox: &str) -> BackendResult<Sandbox> {
        Ok(self.client_for(cx).get_sandbox(sandbox).await?)
    }

    async fn remove_sandbox(&self, cx: &Extensions, sandbox: &str) -> BackendResult<SandboxEvent> {
        Ok(self.client_for(cx).remove_sandbox(sandbox, true).await?)
    }

    async fn standby_sandbox(&self, cx: &Extensions, sandbox: &str, fs_only: bool) -> BackendResult<SandboxEvent> {
        Ok(self.client_for(cx).standby_sandbox(sandbox, fs_only).await?)
    }

    async fn resume_sandbox(&self, cx: &Extensions, sandbox: &str) -> BackendResult<ResumeResult> {
        Ok(self.client_for(cx).resume_sandbox(sandbox).await?)
    }

    async fn exec(&self, cx: &Extensions, sandbox: &str, req: &ExecRequest) -> BackendResult<ExecResult> {
        Ok(self.client_for(cx).exec(sandbox, req).await?)
    }

    async fn stat(&self, cx: &Extensions, sandbox: &str, path: &str) -> BackendResult<FileStat> {
        Ok(self.client_for(cx).stat(sandbox, path).await?)
    }

    async fn list_dir(&self, cx: &Extensions, sandbox: &str, path: &str) -> BackendResult<Vec<FileStat>> {
        Ok(self.client_for(cx).list_dir(sandbox, path).await?)
    }

    async fn mkdir(&self, cx: &Extensions, sandbox: &str, path: &str) -> BackendResult<()> {
        Ok(self.client_for(cx).mkdir(sandbox, path, true).await?)
    }

    async fn download(&self, cx: &Extensions, sandbox: &str, path: &str) -> BackendResult<Download> {
        let stream = self.client_for(cx).download_stream(sandbox, path, false).await?;
        let len = stream.content_length();
        Ok(Download { len, chunks: Box::pin(stream.into_stream().map(|r| r.map_err(BackendError::from))) })
    }

    async fn upload(&self, cx: &Extensions, sandbox: &str, path: &str, data: Bytes, mode: u32) -> BackendResult<()> {
        Ok(self.client_for(cx).upload(sandbox, path, data, Some(mode), false).await?)
    }

    async fn checkpoint(&self, cx: &Extensions, sandbox: &str, req: &CheckpointRequest) -> BackendResult<Checkpoint> {
        Ok(self.client_for(cx).checkpoint(sandbox, req).await?)
    }

    async fn list_checkpoints(&self, cx: &Extensions, sandbox: Option<&str>) -> BackendResult<Vec<Checkpoint>> {
        Ok(self.client_for(cx).list_checkpoints(sandbox).await?)
    }

    async fn restore(&self, cx: &Extensions, sandbox: &str, req: &RestoreRequest) -> BackendResult<RestoreResult> {
        Ok(self.client_for(cx).restore(sandbox, req).await?)
    }

    async fn fork(&self, cx: &Extensions, req: &ForkRequest) -> BackendResult<ForkResult> {
        Ok(self.client_for(cx).fork(req).await?)
    }

    async fn diff(&self, cx: &Extensions, sandbox: &str, against: Option<&str>) -> BackendResult<Vec<FileChange>> {
        Ok(self.client_for(cx).diff(sandbox, against).await?)
    }
}
