//! The tools: typed inputs (JSON Schema via schemars, doc comments written for
//! a model), each mapped onto one or two calls of a [`Backend`].

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine as _;
use futures_util::StreamExt;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, Extensions, Implementation, ServerCapabilities, ServerConfig};
use rmcp::{tool, tool_handler, tool_router, ErrorData, ServerHandler};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};
use strata_api::*;

use crate::backend::{Backend, BackendError, ToolCall};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Default cap on each of stdout and stderr returned by `exec`.
pub const DEFAULT_OUTPUT_BYTES: usize = 32 * 1024;
/// Upper bound a caller may ask `exec` for per stream.
pub const MAX_OUTPUT_BYTES: usize = 1024 * 1024;
/// Default number of bytes `read_file` returns.
pub const DEFAULT_READ_BYTES: usize = 128 * 1024;
/// Largest file `read_file` fetches from the daemon (larger ones: exec `head`, `tail`, `grep`).
pub const MAX_READ_FILE: u64 = 16 * 1024 * 1024;
/// Largest content `write_file` accepts (decoded; its base64 form must still fit
/// in one message: rmcp's stdio line limit and the HTTP body limit are 16 MiB).
pub const MAX_WRITE_BYTES: usize = 8 * 1024 * 1024;
/// Most entries `list_files` and `diff` return.
pub const MAX_ENTRIES: usize = 1000;
/// Default timeout of `exec`.
pub const DEFAULT_EXEC_TIMEOUT: &str = "120s";

const INSTRUCTIONS: &str = "strata runs isolated Linux sandboxes (containers with their own filesystem, processes and limits). \
Typical flow: create_sandbox (from an image such as `busybox` or `debian`, a template, or a checkpoint) -> exec commands and \
read_file/write_file/list_files -> checkpoint before a risky step (restore rolls back to it) -> fork to try several approaches \
in parallel from the same state -> diff to see what changed -> destroy when done (or standby to keep it cheaply and resume later). \
Sandboxes are addressed by id or name. Errors come back as tool errors whose text starts with an error code such as \
`sandbox_not_found`, `invalid_state` or `bad_request`.";

/// The strata MCP tool server.
#[derive(Clone)]
pub struct StrataMcp {
    backend: Arc<dyn Backend>,
    tool_router: ToolRouter<Self>,
}

impl std::fmt::Debug for StrataMcp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StrataMcp").finish_non_exhaustive()
    }
}

/// A tool failure: the text a model reads and the structured error.
#[derive(Debug)]
struct ToolError {
    code: String,
    message: String,
    status: Option<u16>,
    current_state: Option<SandboxState>,
}

impl ToolError {
    fn bad_request(message: impl Into<String>) -> Self {
        ToolError {
            code: ErrorCode::BadRequest.as_str().to_string(),
            message: message.into(),
            status: None,
            current_state: None,
        }
    }

    /// The call's outcome as an HTTP status, for the audit log: the API's,
    /// or 400 for input the tool itself refused.
    fn status(&self) -> u16 {
        match self.status {
            Some(s) => s,
            None if self.code == ErrorCode::BadRequest.as_str() => 400,
            None => 500,
        }
    }

    fn into_result(self) -> CallToolResult {
        let mut text = format!("{}: {}", self.code, self.message);
        if let Some(s) = self.current_state {
            text.push_str(&format!(" (current state: {s})"));
        }
        let mut err = json!({ "code": self.code, "message": self.message });
        if let Some(s) = self.status {
            err["http_status"] = json!(s);
        }
        if let Some(s) = self.current_state {
            err["current_state"] = json!(s);
        }
        let mut r = CallToolResult::error(vec![ContentBlock::text(text)]);
        r.structured_content = Some(json!({ "error": err }));
        r
    }
}

impl From<BackendError> for ToolError {
    fn from(e: BackendError) -> Self {
        let (code, message) = match e {
            BackendError::Api { status, body } => {
                return ToolError {
                    code: body.code.as_str().to_string(),
                    message: body.message,
                    status: Some(status),
                    current_state: body.current_state,
                }
            }
            BackendError::Unreachable(m) => ("daemon_unreachable".to_string(), m),
            BackendError::Failed(m) => (ErrorCode::Internal.as_str().to_string(), m),
        };
        ToolError { code, message, status: None, current_state: None }
    }
}

type ToolResult = Result<Value, ToolError>;

fn finish(r: ToolResult) -> Result<CallToolResult, ErrorData> {
    Ok(match r {
        Ok(v) => CallToolResult::structured(v),
        Err(e) => e.into_result(),
    })
}

// ---- inputs ----

/// Lifecycle of a new sandbox.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LifecycleArg {
    /// Kept until destroyed; goes to standby when idle (default).
    Persistent,
    /// Destroyed automatically when idle or when its TTL expires.
    Ephemeral,
}

impl From<LifecycleArg> for Lifecycle {
    fn from(l: LifecycleArg) -> Self {
        match l {
            LifecycleArg::Persistent => Lifecycle::Persistent,
            LifecycleArg::Ephemeral => Lifecycle::Ephemeral,
        }
    }
}

/// Isolation tier of a new sandbox.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum IsolationArg {
    /// Linux namespaces on the host's kernel (trusted code).
    Namespace,
    /// gVisor's user-space kernel between the code and the host's (untrusted code).
    Gvisor,
    /// A microVM with its own guest kernel (untrusted code, strongest boundary).
    Microvm,
}

impl From<IsolationArg> for strata_api::Isolation {
    fn from(i: IsolationArg) -> Self {
        match i {
            IsolationArg::Namespace => strata_api::Isolation::Namespace,
            IsolationArg::Gvisor => strata_api::Isolation::Gvisor,
            IsolationArg::Microvm => strata_api::Isolation::Microvm,
        }
    }
}

/// Input of `list_sandboxes`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListSandboxesArgs {
    /// Only sandboxes in this state: creating, running, paused, standby, stopped, archived, error, lost.
    /// Destroyed sandboxes are never listed.
    #[serde(default)]
    pub state: Option<String>,
}

/// Input of `create_sandbox`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandboxArgs {
    /// What to start from: an image name or id (e.g. "busybox", "debian"), a template name, or a
    /// checkpoint id or name (the new sandbox starts with that checkpoint's files).
    pub source: String,
    /// Optional unique name; later calls may use it instead of the id.
    #[serde(default)]
    pub name: Option<String>,
    /// Environment variables for every command run in the sandbox.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Memory limit in MiB (processes beyond it are OOM-killed inside the sandbox).
    #[serde(default)]
    pub memory_mb: Option<u64>,
    /// CPU limit in cores, e.g. 0.5 or 2.
    #[serde(default)]
    pub cpus: Option<f64>,
    /// Maximum number of processes/threads.
    #[serde(default)]
    pub pids: Option<u64>,
    /// Time to live, e.g. "30m" or "2h": an ephemeral sandbox is destroyed then, a persistent one stopped.
    #[serde(default)]
    pub ttl: Option<String>,
    /// "persistent" (default: kept until destroyed, standby when idle) or "ephemeral" (destroyed when idle).
    #[serde(default)]
    pub lifecycle: Option<LifecycleArg>,
    /// Isolation tier: "namespace", "gvisor" or "microvm" (default: the daemon's). Use gvisor or
    /// microvm for untrusted code; a tier the host cannot run is an `unsupported` error saying why.
    #[serde(default)]
    pub isolation: Option<IsolationArg>,
}

/// Input of `exec`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecArgs {
    /// Sandbox id or name.
    pub sandbox: String,
    /// A shell command line, run as `sh -c <command>` (pipes, redirects, `&&` work).
    /// Give exactly one of `command` and `argv`.
    #[serde(default)]
    pub command: Option<String>,
    /// Program and arguments, run directly without a shell (no quoting issues).
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    /// Working directory inside the sandbox (default: the image's, else /).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Extra environment variables for this command.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// User name or uid[:gid] to run as (default: the image's user, else root).
    #[serde(default)]
    pub user: Option<String>,
    /// Kill the command after this long, e.g. "30s", "10m" (default "120s").
    #[serde(default)]
    pub timeout: Option<String>,
    /// Text written to the command's stdin (then stdin is closed).
    #[serde(default)]
    pub stdin: Option<String>,
    /// Cap on the bytes returned for each of stdout and stderr (default 32768, max 1048576).
    /// Longer output keeps its beginning and its end with a marker in between.
    #[serde(default)]
    pub max_output_bytes: Option<usize>,
}

/// Input of `read_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFileArgs {
    /// Sandbox id or name.
    pub sandbox: String,
    /// Absolute path of a regular file inside the sandbox.
    pub path: String,
    /// Byte offset to start at (default 0), for reading a large file in pieces.
    #[serde(default)]
    pub offset: Option<u64>,
    /// Most bytes to return (default 131072).
    #[serde(default)]
    pub max_bytes: Option<usize>,
}

/// Encoding of file content.
#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ContentEncoding {
    /// Plain text (default).
    #[default]
    Utf8,
    /// Base64 of arbitrary bytes.
    Base64,
}

/// Input of `write_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFileArgs {
    /// Sandbox id or name.
    pub sandbox: String,
    /// Absolute path inside the sandbox; an existing file is replaced.
    pub path: String,
    /// The whole new content of the file.
    pub content: String,
    /// "utf8" (default) or "base64" for binary content.
    #[serde(default)]
    pub encoding: ContentEncoding,
    /// Permission bits as an octal string, e.g. "755" for a script (default "644").
    #[serde(default)]
    pub mode: Option<String>,
    /// Create missing parent directories (default true).
    #[serde(default)]
    pub create_parents: Option<bool>,
}

/// Input of `list_files`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListFilesArgs {
    /// Sandbox id or name.
    pub sandbox: String,
    /// Absolute path of a directory inside the sandbox (default "/").
    #[serde(default)]
    pub path: Option<String>,
}

/// Input of `checkpoint`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckpointArgs {
    /// Sandbox id or name.
    pub sandbox: String,
    /// Optional unique name for the checkpoint (usable wherever an id is).
    #[serde(default)]
    pub name: Option<String>,
    /// Keep it forever (default: kept per the daemon's retention).
    #[serde(default)]
    pub pinned: bool,
    /// Also keep the running processes (a dev server, a loaded REPL): sandboxes
    /// forked or created from this checkpoint start with them already running.
    #[serde(default)]
    pub processes: bool,
}

/// Input of `restore`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RestoreArgs {
    /// Sandbox id or name.
    pub sandbox: String,
    /// Checkpoint id or name (of this sandbox's history) to roll back to.
    pub checkpoint: String,
    /// Checkpoint the current state first instead of discarding it (default false).
    #[serde(default)]
    pub keep_current: bool,
}

/// Input of `list_checkpoints`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListCheckpointsArgs {
    /// Only checkpoints of this sandbox (id or name).
    #[serde(default)]
    pub sandbox: Option<String>,
}

/// Input of `fork`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkArgs {
    /// A sandbox (id or name; it is checkpointed first) or a checkpoint (id or name) to copy.
    pub source: String,
    /// How many independent copies to start (1 to 64, default 1).
    #[serde(default)]
    pub count: Option<u32>,
    /// Children are named `<prefix>-<n>` (default: the source's name).
    #[serde(default)]
    pub name_prefix: Option<String>,
    /// Time to live of each child, e.g. "30m".
    #[serde(default)]
    pub ttl: Option<String>,
    /// Lifecycle of the children: "persistent" (default) or "ephemeral".
    #[serde(default)]
    pub lifecycle: Option<LifecycleArg>,
    /// Start the children with the source's running processes (a sandbox
    /// source is then checkpointed with them). Default: a checkpoint source's
    /// own choice; a sandbox source's children boot fresh.
    #[serde(default)]
    pub processes: Option<bool>,
    /// Isolation tier of the children (default: the source's). Children with
    /// the source's processes must stay on its tier.
    #[serde(default)]
    pub isolation: Option<IsolationArg>,
}

/// Input of `diff`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DiffArgs {
    /// Sandbox id or name.
    pub sandbox: String,
    /// Compare against this checkpoint (default: the sandbox's latest checkpoint, else what it was created from).
    #[serde(default)]
    pub against: Option<String>,
}

/// Input of `standby`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StandbyArgs {
    /// Sandbox id or name.
    pub sandbox: String,
    /// Keep only the files and stop the processes (default false: keep running processes and
    /// their memory too, which fails if they cannot be saved).
    #[serde(default)]
    pub fs_only: bool,
}

/// Input of the tools that only name a sandbox.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxArg {
    /// Sandbox id or name.
    pub sandbox: String,
}

// ---- helpers ----

fn sandbox_summary(s: &Sandbox) -> Value {
    let mut v = json!({
        "id": s.id,
        "name": s.name,
        "state": s.state,
        "source": s.source,
        "created_at": s.created_at,
        "lifecycle": s.lifecycle,
    });
    if s.fork_generation > 0 {
        v["fork_generation"] = json!(s.fork_generation);
    }
    if let Some(c) = &s.head_checkpoint {
        v["head_checkpoint"] = json!(c);
    }
    if let Some(e) = &s.expires_at {
        v["expires_at"] = json!(e);
    }
    if s.state_reason != "user" && !s.state_reason.is_empty() {
        v["state_reason"] = json!(s.state_reason);
    }
    if let Some(d) = &s.state_detail {
        v["state_detail"] = json!(d);
    }
    v
}

/// Decodes captured output to text, keeping its head and tail when it exceeds `cap`.
fn clip_output(b64: &str, cap: usize) -> Result<(String, bool), ToolError> {
    let bytes = B64.decode(b64).map_err(|e| ToolError {
        code: ErrorCode::Internal.as_str().into(),
        message: format!("daemon sent undecodable output: {e}"),
        status: None,
        current_state: None,
    })?;
    if bytes.len() <= cap {
        return Ok((String::from_utf8_lossy(&bytes).into_owned(), false));
    }
    let head = cap / 2;
    let tail = cap - head;
    let omitted = bytes.len() - head - tail;
    let text = format!(
        "{}\n[... {omitted} bytes omitted ...]\n{}",
        String::from_utf8_lossy(&bytes[..head]),
        String::from_utf8_lossy(&bytes[bytes.len() - tail..])
    );
    Ok((text, true))
}

fn parse_mode(m: &str) -> Result<u32, ToolError> {
    let digits = m.trim_start_matches("0o");
    match u32::from_str_radix(digits, 8) {
        Ok(v) if v <= 0o7777 && !digits.is_empty() => Ok(v),
        _ => Err(ToolError::bad_request(format!(
            "mode: {m:?} is not an octal permission string such as \"644\" or \"755\""
        ))),
    }
}

fn parent_dir(path: &str) -> Option<&str> {
    let trimmed = path.trim_end_matches('/');
    match trimmed.rfind('/') {
        Some(0) | None => None,
        Some(i) => Some(&trimmed[..i]),
    }
}

fn kind_str(k: FileKind) -> &'static str {
    match k {
        FileKind::File => "file",
        FileKind::Dir => "dir",
        FileKind::Symlink => "symlink",
        FileKind::Other => "other",
    }
}

// ---- the tools ----

#[tool_router]
impl StrataMcp {
    /// A tool server whose calls go to `backend`.
    pub fn new(backend: impl Backend) -> Self {
        StrataMcp { backend: Arc::new(backend), tool_router: Self::tool_router() }
    }

    /// Finishes a mutating tool call: the backend records it (see
    /// [`Backend::record`]) with `target`, else the id of what it created.
    fn finish_recorded(
        &self,
        ext: &Extensions,
        tool: &str,
        target: Option<&str>,
        r: ToolResult,
    ) -> Result<CallToolResult, ErrorData> {
        let created = r.as_ref().ok().and_then(|v| v.get("id")).and_then(Value::as_str);
        let status = r.as_ref().map_or_else(ToolError::status, |_| 200);
        self.backend.record(ext, &ToolCall { tool, target: target.or(created), status });
        finish(r)
    }

    #[tool(
        description = "List sandboxes with their id, name, state (running, paused, standby, stopped, ...), source and creation time. Use it to find a sandbox's id or to check its state.",
        annotations(title = "List sandboxes", read_only_hint = true, open_world_hint = false)
    )]
    async fn list_sandboxes(
        &self,
        Parameters(args): Parameters<ListSandboxesArgs>,
        ext: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        finish(
            async {
                let want = match args.state.as_deref() {
                    None | Some("") => None,
                    Some(s) => Some(
                        SandboxState::parse(s)
                            .ok_or_else(|| ToolError::bad_request(format!("state: unknown state {s:?}")))?,
                    ),
                };
                let list = self.backend.list_sandboxes(&ext).await?;
                let items: Vec<Value> = list
                    .iter()
                    .filter(|s| s.state != SandboxState::Destroyed && want.is_none_or(|w| s.state == w))
                    .map(sandbox_summary)
                    .collect();
                Ok(json!({ "count": items.len(), "sandboxes": items }))
            }
            .await,
        )
    }

    #[tool(
        description = "Create and start a new isolated Linux sandbox and return its id. `source` is an image (e.g. \"busybox\", \"debian\"), a template, or a checkpoint id/name (to start a fresh, independent sandbox from a saved state; to make several copies of a state at once use `fork`). The sandbox is running when this returns; run commands in it with `exec`.",
        annotations(
            title = "Create sandbox",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn create_sandbox(
        &self,
        Parameters(args): Parameters<CreateSandboxArgs>,
        ext: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        self.finish_recorded(
            &ext,
            "create_sandbox",
            None,
            async {
                let limits = ResourceLimits {
                    memory_bytes: args.memory_mb.map(|m| m.saturating_mul(1024 * 1024)),
                    cpus: args.cpus,
                    pids: args.pids,
                    ..Default::default()
                };
                let req = CreateSandboxRequest {
                    source: args.source,
                    name: args.name,
                    lifecycle: args.lifecycle.map(Into::into).unwrap_or_default(),
                    ttl: args.ttl,
                    limits,
                    env: args.env,
                    isolation: args.isolation.map(Into::into),
                    ..Default::default()
                };
                let created = self.backend.create_sandbox(&ext, &req).await?;
                let s = self.backend.get_sandbox(&ext, &created.id).await?;
                Ok(sandbox_summary(&s))
            }
            .await,
        )
    }

    #[tool(
        description = "Run a command inside a sandbox and wait for it to finish. Returns stdout, stderr and exit_code (a non-zero exit_code is a normal result, not a tool error; 127 means the program was not found). Give `command` for a shell line (run with `sh -c`) or `argv` to run a program directly. Each stream is capped at max_output_bytes (default 32 KiB; the middle of longer output is cut and `stdout_truncated`/`stderr_truncated` is set: redirect to a file and use read_file, or filter with grep/head/tail). Commands are killed after `timeout` (default 120s; `timed_out` is then true). Each call is a fresh process: `cd` or `export` do not carry over (use `cwd` and `env`), but files written persist. A sandbox in standby is resumed automatically.",
        annotations(
            title = "Run command",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn exec(&self, Parameters(args): Parameters<ExecArgs>, ext: Extensions) -> Result<CallToolResult, ErrorData> {
        let target = args.sandbox.clone();
        self.finish_recorded(
            &ext,
            "exec",
            Some(&target),
            async {
                let cmd = match (args.command, args.argv) {
                    (Some(c), None) => vec!["sh".to_string(), "-c".to_string(), c],
                    (None, Some(a)) if !a.is_empty() => a,
                    (None, Some(_)) => return Err(ToolError::bad_request("argv: must name a program")),
                    (None, None) => {
                        return Err(ToolError::bad_request(
                            "give `command` (a shell line) or `argv` (program and arguments)",
                        ))
                    }
                    (Some(_), Some(_)) => {
                        return Err(ToolError::bad_request("give either `command` or `argv`, not both"))
                    }
                };
                let cap = args.max_output_bytes.unwrap_or(DEFAULT_OUTPUT_BYTES);
                if cap == 0 || cap > MAX_OUTPUT_BYTES {
                    return Err(ToolError::bad_request(format!(
                        "max_output_bytes: must be between 1 and {MAX_OUTPUT_BYTES}, got {cap}"
                    )));
                }
                let req = ExecRequest {
                    cmd,
                    env: args.env,
                    cwd: args.cwd,
                    user: args.user,
                    timeout: Some(args.timeout.unwrap_or_else(|| DEFAULT_EXEC_TIMEOUT.to_string())),
                    stdin_b64: args.stdin.map(|s| B64.encode(s.as_bytes())),
                    keep_stdin_open: false,
                    tty: None,
                };
                let started = std::time::Instant::now();
                let r = self.backend.exec(&ext, &args.sandbox, &req).await?;
                let (stdout, out_cut) = clip_output(&r.stdout_b64, cap)?;
                let (stderr, err_cut) = clip_output(&r.stderr_b64, cap)?;
                let p = &r.process;
                let mut v = json!({
                    "exit_code": p.exit_status(),
                    "stdout": stdout,
                    "stderr": stderr,
                    "duration_ms": started.elapsed().as_millis() as u64,
                });
                // The daemon's own buffer dropped the beginning of the output.
                if out_cut || r.truncated {
                    v["stdout_truncated"] = json!(true);
                }
                if err_cut || r.truncated {
                    v["stderr_truncated"] = json!(true);
                }
                if p.timed_out {
                    v["timed_out"] = json!(true);
                }
                if let Some(sig) = p.signal {
                    v["signal"] = json!(sig);
                }
                if p.oom_killed {
                    v["oom_killed"] = json!(true);
                }
                if let Some(e) = &p.spawn_error {
                    v["spawn_error"] = json!(e);
                }
                Ok(v)
            }
            .await,
        )
    }

    #[tool(
        description = "Read a file from a sandbox. Text comes back as `content` (encoding \"utf8\"); a file that is not valid UTF-8 comes back base64-encoded (encoding \"base64\"). Returns at most max_bytes (default 128 KiB) starting at `offset`; `truncated` and `size` tell whether more remains. Files over 16 MiB are refused: use exec with head, tail or grep. For directories use list_files.",
        annotations(title = "Read file", read_only_hint = true, open_world_hint = false)
    )]
    async fn read_file(
        &self,
        Parameters(args): Parameters<ReadFileArgs>,
        ext: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        finish(async {
            let st = self.backend.stat(&ext, &args.sandbox, &args.path).await?;
            match st.kind {
                FileKind::File => {}
                FileKind::Dir => return Err(ToolError::bad_request(format!("path: {} is a directory (use list_files)", args.path))),
                k => return Err(ToolError::bad_request(format!("path: {} is a {} , not a regular file", args.path, kind_str(k)))),
            }
            if st.size > MAX_READ_FILE {
                return Err(ToolError::bad_request(format!("path: {} is {} bytes, more than read_file's limit of {MAX_READ_FILE}; use exec with head/tail/grep", args.path, st.size)));
            }
            // Never more than read_file's limit, whatever the file grew to since the stat.
            let max = args.max_bytes.unwrap_or(DEFAULT_READ_BYTES).clamp(1, MAX_READ_FILE as usize);
            // Only the piece asked for is kept: the download is read up to
            // offset + max (+1, to tell whether more remains) and then dropped,
            // which stops the daemon sending the rest.
            let mut download = self.backend.download(&ext, &args.sandbox, &args.path).await?;
            let size = download.len.unwrap_or(st.size);
            let want = args.offset.unwrap_or(0);
            let mut skipped = 0u64;
            let mut data: Vec<u8> = Vec::with_capacity(max.min(1 << 20));
            while data.len() <= max {
                let Some(chunk) = download.chunks.next().await.transpose()? else { break };
                let mut chunk = &chunk[..];
                if skipped < want {
                    let k = (want - skipped).min(chunk.len() as u64) as usize;
                    skipped += k as u64;
                    chunk = &chunk[k..];
                }
                let room = (max + 1 - data.len()).min(chunk.len());
                data.extend_from_slice(&chunk[..room]);
            }
            drop(download);
            let more = data.len() > max;
            data.truncate(max);
            let offset = skipped;
            let mut slice = &data[..];
            // Do not cut a UTF-8 sequence in half when the piece is text.
            let mut text = std::str::from_utf8(slice).ok();
            if text.is_none() && more {
                for back in 1..4.min(slice.len()) {
                    if let Ok(t) = std::str::from_utf8(&slice[..slice.len() - back]) {
                        slice = &slice[..slice.len() - back];
                        text = Some(t);
                        break;
                    }
                }
            }
            let (content, encoding) = match text {
                Some(t) => (t.to_string(), "utf8"),
                None => (B64.encode(slice), "base64"),
            };
            Ok(json!({
                "path": args.path,
                "size": size,
                "offset": offset,
                "bytes": slice.len(),
                "truncated": more || offset + (slice.len() as u64) < size,
                "encoding": encoding,
                "content": content,
            }))
        }.await)
    }

    #[tool(
        description = "Write a file in a sandbox, replacing it if it exists (parent directories are created). `content` is the whole file: plain text, or base64 with encoding \"base64\" for binary data. Use mode \"755\" for scripts you want to execute. At most 8 MiB per call.",
        annotations(
            title = "Write file",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn write_file(
        &self,
        Parameters(args): Parameters<WriteFileArgs>,
        ext: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        let target = args.sandbox.clone();
        self.finish_recorded(
            &ext,
            "write_file",
            Some(&target),
            async {
                let data = match args.encoding {
                    ContentEncoding::Utf8 => args.content.into_bytes(),
                    ContentEncoding::Base64 => B64
                        .decode(args.content.trim())
                        .map_err(|e| ToolError::bad_request(format!("content: not valid base64 ({e})")))?,
                };
                if data.len() > MAX_WRITE_BYTES {
                    return Err(ToolError::bad_request(format!(
                        "content: {} bytes is more than write_file's limit of {MAX_WRITE_BYTES}",
                        data.len()
                    )));
                }
                let mode = args.mode.as_deref().map(parse_mode).transpose()?.unwrap_or(0o644);
                if args.create_parents.unwrap_or(true) {
                    if let Some(parent) = parent_dir(&args.path) {
                        self.backend.mkdir(&ext, &args.sandbox, parent).await?;
                    }
                }
                let len = data.len();
                self.backend.upload(&ext, &args.sandbox, &args.path, data.into(), mode).await?;
                Ok(json!({ "path": args.path, "bytes": len, "mode": format!("{mode:o}") }))
            }
            .await,
        )
    }

    #[tool(
        description = "List a directory in a sandbox: each entry's name, kind (file, dir, symlink, other), size, permission mode (octal) and modification time. Not recursive; for a tree use exec with `find`.",
        annotations(title = "List directory", read_only_hint = true, open_world_hint = false)
    )]
    async fn list_files(
        &self,
        Parameters(args): Parameters<ListFilesArgs>,
        ext: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        finish(async {
            let path = args.path.unwrap_or_else(|| "/".to_string());
            let mut entries = self.backend.list_dir(&ext, &args.sandbox, &path).await?;
            entries.sort_by(|a, b| a.name.cmp(&b.name));
            let total = entries.len();
            let items: Vec<Value> = entries
                .iter()
                .take(MAX_ENTRIES)
                .map(|e| {
                    let mut v = json!({ "name": e.name, "kind": kind_str(e.kind), "size": e.size, "mode": format!("{:o}", e.mode & 0o7777), "mtime": e.mtime });
                    if let Some(t) = &e.link_target {
                        v["link_target"] = json!(t);
                    }
                    v
                })
                .collect();
            Ok(json!({ "path": path, "count": total, "truncated": total > MAX_ENTRIES, "entries": items }))
        }.await)
    }

    #[tool(
        description = "Save a sandbox's filesystem as an immutable checkpoint (cheap: only changes since the last checkpoint are stored) and return its id. Take one before a risky step: `restore` rolls the sandbox back to it, `fork` or `create_sandbox` start new sandboxes from it, `diff` compares against it. The sandbox keeps running. Checkpoints hold files, not running processes (use standby to keep processes).",
        annotations(
            title = "Checkpoint sandbox",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn checkpoint(
        &self,
        Parameters(args): Parameters<CheckpointArgs>,
        ext: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        let target = args.sandbox.clone();
        self.finish_recorded(
            &ext,
            "checkpoint",
            Some(&target),
            async {
                let req = CheckpointRequest {
                    name: args.name,
                    pinned: args.pinned,
                    processes: args.processes,
                    ..Default::default()
                };
                let c = self.backend.checkpoint(&ext, &args.sandbox, &req).await?;
                Ok(json!({
                    "id": c.id,
                    "name": c.name,
                    "sandbox": c.sandbox_id,
                    "parent": c.parent,
                    "changed_paths": c.changed_paths,
                    "layer_bytes": c.layer_size,
                    "frozen_ms": c.frozen_ms,
                    "duration_ms": c.duration_ms,
                    "processes_kept": c.processes.is_some(),
                }))
            }
            .await,
        )
    }

    #[tool(
        description = "Roll a sandbox's filesystem back to one of its checkpoints, discarding the changes since (or saving them first with keep_current). Running processes are restarted. Use it to undo a failed attempt.",
        annotations(
            title = "Restore checkpoint",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn restore(
        &self,
        Parameters(args): Parameters<RestoreArgs>,
        ext: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        let target = args.sandbox.clone();
        self.finish_recorded(
            &ext,
            "restore",
            Some(&target),
            async {
                let req =
                    RestoreRequest { checkpoint: args.checkpoint, keep_current: args.keep_current, processes: None };
                let r = self.backend.restore(&ext, &args.sandbox, &req).await?;
                let mut v = json!({ "sandbox": sandbox_summary(&r.sandbox) });
                if let Some(k) = r.kept {
                    v["kept_checkpoint"] = json!(k.id);
                }
                Ok(v)
            }
            .await,
        )
    }

    #[tool(
        description = "List checkpoints (all, or one sandbox's): id, name, sandbox, parent, creation time and how many paths changed.",
        annotations(title = "List checkpoints", read_only_hint = true, open_world_hint = false)
    )]
    async fn list_checkpoints(
        &self,
        Parameters(args): Parameters<ListCheckpointsArgs>,
        ext: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        finish(async {
            let list = self.backend.list_checkpoints(&ext, args.sandbox.as_deref()).await?;
            let items: Vec<Value> = list
                .iter()
                .map(|c| json!({ "id": c.id, "name": c.name, "sandbox": c.sandbox_id, "parent": c.parent, "created_at": c.created_at, "changed_paths": c.changed_paths, "pinned": c.pinned }))
                .collect();
            Ok(json!({ "count": items.len(), "checkpoints": items }))
        }.await)
    }

    #[tool(
        description = "Copy a sandbox (or a checkpoint) into `count` new, independent, running sandboxes and return their ids. A sandbox source is checkpointed first; its files are copied, and its running processes too with processes=true (a dev server comes up already running in every copy). Use it to explore several approaches in parallel from the same state; the source is left untouched.",
        annotations(
            title = "Fork sandbox",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn fork(&self, Parameters(args): Parameters<ForkArgs>, ext: Extensions) -> Result<CallToolResult, ErrorData> {
        let target = args.source.clone();
        self.finish_recorded(
            &ext,
            "fork",
            Some(&target),
            async {
                let req = ForkRequest {
                    source: args.source,
                    count: args.count.unwrap_or(1),
                    name_prefix: args.name_prefix,
                    lifecycle: args.lifecycle.map(Into::into).unwrap_or_default(),
                    ttl: args.ttl,
                    limits: None,
                    // Children inherit the source's network rules.
                    network: None,
                    processes: args.processes,
                    isolation: args.isolation.map(Into::into),
                };
                let r = self.backend.fork(&ext, &req).await?;
                Ok(json!({ "checkpoint": r.checkpoint, "sandboxes": r.sandboxes, "duration_ms": r.duration_ms }))
            }
            .await,
        )
    }

    #[tool(
        description = "Show which files changed in a sandbox (added, modified, deleted) since its latest checkpoint, or since what it was created from, or since the checkpoint `against`. Lists paths with their change and size, not contents (use read_file for those).",
        annotations(title = "Diff sandbox", read_only_hint = true, open_world_hint = false)
    )]
    async fn diff(&self, Parameters(args): Parameters<DiffArgs>, ext: Extensions) -> Result<CallToolResult, ErrorData> {
        finish(
            async {
                let changes = self.backend.diff(&ext, &args.sandbox, args.against.as_deref()).await?;
                let total = changes.len();
                let items: Vec<Value> = changes
                    .iter()
                    .take(MAX_ENTRIES)
                    .map(|c| json!({ "path": c.path, "change": c.change, "kind": c.kind, "size": c.size }))
                    .collect();
                Ok(json!({ "count": total, "truncated": total > MAX_ENTRIES, "changes": items }))
            }
            .await,
        )
    }

    #[tool(
        description = "Put a sandbox in standby: its running processes, their memory and its files are saved to disk and it stops using CPU and RAM. `resume` (or any exec or file call) brings it back with the same processes where they were. Use it to park a sandbox you will need later; use checkpoint instead to save a point to return to while continuing to work.",
        annotations(
            title = "Standby sandbox",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn standby(
        &self,
        Parameters(args): Parameters<StandbyArgs>,
        ext: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        let target = args.sandbox.clone();
        self.finish_recorded(
            &ext,
            "standby",
            Some(&target),
            async {
                let ev = self.backend.standby_sandbox(&ext, &args.sandbox, args.fs_only).await?;
                let s = self.backend.get_sandbox(&ext, &ev.sandbox_id).await?;
                let mut v = json!({ "id": s.id, "state": s.state, "duration_ms": ev.duration_ms });
                if let Some(info) = s.standby {
                    v["mode"] = json!(info.mode);
                    v["image_bytes"] = json!(info.image_bytes);
                    if let Some(n) = info.note {
                        v["note"] = json!(n);
                    }
                }
                Ok(v)
            }
            .await,
        )
    }

    #[tool(
        description = "Resume a sandbox from standby (or paused/stopped) so it runs again; reports whether its processes came back as they were.",
        annotations(
            title = "Resume sandbox",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn resume(
        &self,
        Parameters(args): Parameters<SandboxArg>,
        ext: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        let target = args.sandbox.clone();
        self.finish_recorded(&ext, "resume", Some(&target), async {
            let r = self.backend.resume_sandbox(&ext, &args.sandbox).await?;
            Ok(json!({ "id": r.sandbox.id, "state": r.sandbox.state, "from": r.from, "processes_restored": r.processes_restored, "duration_ms": r.duration_ms }))
        }.await)
    }

    #[tool(
        description = "Destroy a sandbox: stop its processes and delete its files. Irreversible (checkpoints taken from it are kept). Call it when a sandbox is no longer needed.",
        annotations(
            title = "Destroy sandbox",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn destroy(
        &self,
        Parameters(args): Parameters<SandboxArg>,
        ext: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        let target = args.sandbox.clone();
        self.finish_recorded(
            &ext,
            "destroy",
            Some(&target),
            async {
                let ev = self.backend.remove_sandbox(&ext, &args.sandbox).await?;
                Ok(json!({ "id": ev.sandbox_id, "state": ev.to }))
            }
            .await,
        )
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for StrataMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("strata", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS.to_string())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use async_trait::async_trait;
    use bytes::Bytes;

    use super::*;
    use crate::backend::{BackendResult, Download};

    /// A recorded call: tool, target, status.
    type Recorded = (String, Option<String>, u16);

    /// A backend that knows no sandbox and keeps the calls it is asked to record.
    #[derive(Default)]
    struct Empty {
        recorded: Arc<Mutex<Vec<Recorded>>>,
    }

    fn none<T>() -> BackendResult<T> {
        let body = ApiErrorBody {
            code: ErrorCode::SandboxNotFound,
            message: "no such sandbox".into(),
            current_state: None,
            dependents: vec![],
            findings: vec![],
            approval: None,
            conflicts: Vec::new(),
        };
        Err(BackendError::api(body))
    }

    #[async_trait]
    impl Backend for Empty {
        async fn list_sandboxes(&self, _: &Extensions) -> BackendResult<Vec<Sandbox>> {
            Ok(vec![])
        }
        async fn create_sandbox(&self, _: &Extensions, _: &CreateSandboxRequest) -> BackendResult<CreatedSandbox> {
            none()
        }
        async fn get_sandbox(&self, _: &Extensions, _: &str) -> BackendResult<Sandbox> {
            none()
        }
        async fn remove_sandbox(&self, _: &Extensions, _: &str) -> BackendResult<SandboxEvent> {
            none()
        }
        async fn standby_sandbox(&self, _: &Extensions, _: &str, _: bool) -> BackendResult<SandboxEvent> {
            none()
        }
        async fn resume_sandbox(&self, _: &Extensions, _: &str) -> BackendResult<ResumeResult> {
            none()
        }
        async fn exec(&self, _: &Extensions, _: &str, _: &ExecRequest) -> BackendResult<ExecResult> {
            none()
        }
        async fn stat(&self, _: &Extensions, _: &str, _: &str) -> BackendResult<FileStat> {
            none()
        }
        async fn list_dir(&self, _: &Extensions, _: &str, _: &str) -> BackendResult<Vec<FileStat>> {
            none()
        }
        async fn mkdir(&self, _: &Extensions, _: &str, _: &str) -> BackendResult<()> {
            none()
        }
        async fn download(&self, _: &Extensions, _: &str, _: &str) -> BackendResult<Download> {
            none()
        }
        async fn upload(&self, _: &Extensions, _: &str, _: &str, _: Bytes, _: u32) -> BackendResult<()> {
            none()
        }
        async fn checkpoint(&self, _: &Extensions, _: &str, _: &CheckpointRequest) -> BackendResult<Checkpoint> {
            none()
        }
        async fn list_checkpoints(&self, _: &Extensions, _: Option<&str>) -> BackendResult<Vec<Checkpoint>> {
            Ok(vec![])
        }
        async fn restore(&self, _: &Extensions, _: &str, _: &RestoreRequest) -> BackendResult<RestoreResult> {
            none()
        }
        async fn fork(&self, _: &Extensions, _: &ForkRequest) -> BackendResult<ForkResult> {
            none()
        }
        async fn diff(&self, _: &Extensions, _: &str, _: Option<&str>) -> BackendResult<Vec<FileChange>> {
            none()
        }
        fn record(&self, _: &Extensions, call: &ToolCall<'_>) {
            let entry = (call.tool.to_string(), call.target.map(str::to_string), call.status);
            self.recorded.lock().unwrap().push(entry);
        }
    }

    fn args<T: serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    fn structured(r: Result<CallToolResult, ErrorData>) -> (bool, Value) {
        let r = r.expect("a tool result, not a protocol error");
        (r.is_error == Some(true), r.structured_content.unwrap_or_default())
    }

    /// Every mutating tool call is recorded once with what it named and its
    /// outcome (a backend error's status, 400 for input the tool refused);
    /// read-only ones are not. Backend errors are tool errors with the API's code.
    #[tokio::test]
    async fn mutating_calls_are_recorded_with_their_outcome() {
        let backend = Empty::default();
        let recorded = backend.recorded.clone();
        let mcp = StrataMcp::new(backend);
        let cx = Extensions::new;
        let sb = || SandboxArg { sandbox: "web".into() };

        let (err, v) = structured(mcp.destroy(Parameters(sb()), cx()).await);
        assert!(err);
        assert_eq!(
            v["error"],
            json!({ "code": "sandbox_not_found", "message": "no such sandbox", "http_status": 404 })
        );
        structured(mcp.resume(Parameters(sb()), cx()).await);
        structured(mcp.standby(Parameters(args(json!({ "sandbox": "web" }))), cx()).await);
        structured(mcp.exec(Parameters(args(json!({ "sandbox": "web", "command": "true" }))), cx()).await);
        let (err, v) = structured(mcp.exec(Parameters(args(json!({ "sandbox": "web" }))), cx()).await);
        assert!(err && v["error"]["code"] == "bad_request" && v["error"].get("http_status").is_none(), "{v}");
        structured(
            mcp.write_file(Parameters(args(json!({ "sandbox": "web", "path": "/a/b", "content": "x" }))), cx()).await,
        );
        structured(mcp.checkpoint(Parameters(args(json!({ "sandbox": "web" }))), cx()).await);
        structured(mcp.restore(Parameters(args(json!({ "sandbox": "web", "checkpoint": "c" }))), cx()).await);
        structured(mcp.fork(Parameters(args(json!({ "source": "c" }))), cx()).await);
        structured(mcp.create_sandbox(Parameters(args(json!({ "source": "base" }))), cx()).await);
        let n = recorded.lock().unwrap().len();

        // Read-only tools: nothing recorded.
        let (err, v) = structured(mcp.list_sandboxes(Parameters(ListSandboxesArgs::default()), cx()).await);
        assert_eq!((err, v), (false, json!({ "count": 0, "sandboxes": [] })));
        structured(mcp.list_checkpoints(Parameters(ListCheckpointsArgs::default()), cx()).await);
        structured(mcp.read_file(Parameters(args(json!({ "sandbox": "web", "path": "/a" }))), cx()).await);
        structured(mcp.list_files(Parameters(args(json!({ "sandbox": "web" }))), cx()).await);
        structured(mcp.diff(Parameters(args(json!({ "sandbox": "web" }))), cx()).await);

        let recorded = recorded.lock().unwrap().clone();
        assert_eq!(recorded.len(), n, "read-only calls recorded: {recorded:?}");
        let web = Some("web".to_string());
        let want: Vec<Recorded> = [
            ("destroy", web.clone(), 404),
            ("resume", web.clone(), 404),
            ("standby", web.clone(), 404),
            ("exec", web.clone(), 404),
            ("exec", web.clone(), 400),
            ("write_file", web.clone(), 404),
            ("checkpoint", web.clone(), 404),
            ("restore", web.clone(), 404),
            ("fork", Some("c".to_string()), 404),
            ("create_sandbox", None, 404),
        ]
        .into_iter()
        .map(|(t, target, s)| (t.to_string(), target, s))
        .collect();
        assert_eq!(recorded, want);
    }

    #[test]
    fn output_is_clipped_head_and_tail() {
        let data: Vec<u8> = (0..100u8).map(|i| b'a' + (i % 26)).collect();
        let (t, cut) = clip_output(&B64.encode(&data), 10).unwrap();
        assert!(cut);
        assert!(t.starts_with("abcde\n[... 90 bytes omitted ...]\n"), "{t}");
        assert!(t.ends_with(&String::from_utf8_lossy(&data[95..]).to_string()));
        let (t, cut) = clip_output(&B64.encode(b"hi"), 10).unwrap();
        assert_eq!((t.as_str(), cut), ("hi", false));
    }

    #[test]
    fn modes_and_parents() {
        assert_eq!(parse_mode("755").ok(), Some(0o755));
        assert_eq!(parse_mode("0o600").ok(), Some(0o600));
        assert!(parse_mode("9").is_err());
        assert!(parse_mode("").is_err());
        assert!(parse_mode("77777").is_err());
        assert_eq!(parent_dir("/a/b/c.txt"), Some("/a/b"));
        assert_eq!(parent_dir("/c.txt"), None);
        assert_eq!(parent_dir("rel"), None);
    }

    #[test]
    fn every_tool_has_a_description_and_an_object_schema() {
        let tools = StrataMcp::tool_router().list_all();
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
        for want in [
            "list_sandboxes",
            "create_sandbox",
            "exec",
            "read_file",
            "write_file",
            "list_files",
            "checkpoint",
            "restore",
            "list_checkpoints",
            "fork",
            "diff",
            "standby",
            "resume",
            "destroy",
        ] {
            assert!(names.contains(&want), "{want} missing from {names:?}");
        }
        for t in &tools {
            assert!(t.description.as_deref().is_some_and(|d| d.len() > 40), "{} has no real description", t.name);
            assert_eq!(t.input_schema.get("type").and_then(|v| v.as_str()), Some("object"), "{}", t.name);
        }
    }
}
