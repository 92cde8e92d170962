//! Processes inside a sandbox: exec requests, process records, output streams.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Request body of `POST /v1/sandboxes/{id}/exec` and `POST /v1/sandboxes/{id}/processes`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// Program and arguments; the program is looked up in the sandbox's PATH.
    pub cmd: Vec<String>,
    /// Extra environment variables (override the sandbox's and the image's).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory inside the sandbox (default: the image's, else `/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// User name or `uid[:gid]` to run as (default: the image's, else root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Kill the process after this long, e.g. "30s".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// Bytes to write to stdin, base64-encoded; stdin is then closed
    /// (unless `keep_stdin_open`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin_b64: Option<String>,
    /// Keep stdin open for `POST .../processes/{pid}/stdin` writes.
    #[serde(default)]
    pub keep_stdin_open: bool,
    /// Run the process on a new pseudo-terminal of this size inside the
    /// sandbox (its controlling terminal; stdin, stdout and stderr are the
    /// terminal, so all output comes as `stdout`; stdin stays open).
    /// Resize it with `POST .../processes/{pid}/resize`; attach to it
    /// interactively with the WebSocket at `GET .../processes/{pid}/tty`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tty: Option<TtySize>,
}

/// A terminal's size in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TtySize {
    /// Columns, 1 to [`TtySize::MAX`].
    pub cols: u16,
    /// Rows, 1 to [`TtySize::MAX`].
    pub rows: u16,
}

impl TtySize {
    /// The largest number of columns or rows accepted.
    pub const MAX: u16 = 4096;

    /// Why this size is not one a terminal can have (`None`: it is fine).
    pub fn invalid(&self) -> Option<String> {
        let ok = |n: u16| (1..=Self::MAX).contains(&n);
        (!ok(self.cols) || !ok(self.rows))
            .then(|| format!("a terminal of {}x{} (columns and rows go from 1 to {})", self.cols, self.rows, Self::MAX))
    }
}

impl Default for TtySize {
    /// 80 columns by 24 rows.
    fn default() -> Self {
        TtySize { cols: 80, rows: 24 }
    }
}

/// Whether a process is still running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProcessStatus {
    /// Still running.
    Running,
    /// Finished (see exit_code / signal).
    Exited,
}

/// A process started through the API.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ProcessInfo {
    /// Process id, unique within the sandbox (not the kernel pid).
    pub id: u64,
    /// Sandbox id.
    pub sandbox_id: String,
    /// Program and arguments.
    pub cmd: Vec<String>,
    /// Running or exited.
    pub status: ProcessStatus,
    /// Kernel pid inside the sandbox's pid namespace, once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<i32>,
    /// Exit code when it exited normally.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Signal number when it was killed by a signal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// True when it was killed because its timeout expired.
    #[serde(default)]
    pub timed_out: bool,
    /// True when the sandbox's OOM killer fired while it ran and it died of SIGKILL.
    #[serde(default)]
    pub oom_killed: bool,
    /// The size of its pseudo-terminal, when it runs on one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tty: Option<TtySize>,
    /// Set when the program could not be started (e.g. not found).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spawn_error: Option<String>,
    /// RFC 3339 start time.
    pub started_at: String,
    /// RFC 3339 end time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
}

impl ProcessInfo {
    /// The shell-style exit status: the exit code, 128+signal, or 127 when it never started.
    pub fn exit_status(&self) -> i32 {
        if self.spawn_error.is_some() {
            return 127;
        }
        match (self.exit_code, self.signal) {
            (Some(code), _) => code,
            (None, Some(sig)) => 128 + sig,
            _ => 0,
        }
    }
}

/// Response of the run-to-completion call `POST /v1/sandboxes/{id}/exec`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ExecResult {
    /// The finished process.
    pub process: ProcessInfo,
    /// Captured stdout, base64 (capped; see `truncated`).
    pub stdout_b64: String,
    /// Captured stderr, base64 (capped; see `truncated`).
    pub stderr_b64: String,
    /// True when output exceeded the buffer and its beginning was dropped.
    pub truncated: bool,
}

/// Which output stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StreamKind {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// One line of the NDJSON stream served by `POST .../exec?stream=true` and
/// `GET .../processes/{pid}/logs`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ProcessEvent {
    /// The process was started.
    Started {
        /// The process record.
        process: ProcessInfo,
    },
    /// A chunk of output.
    Output {
        /// Stream it came from.
        stream: StreamKind,
        /// Byte offset of this chunk in the process's combined log.
        offset: u64,
        /// The bytes, base64.
        data_b64: String,
    },
    /// Earlier output was dropped from the buffer before it could be read.
    Dropped {
        /// Bytes lost.
        bytes: u64,
    },
    /// The process finished.
    Exited {
        /// The final process record.
        process: ProcessInfo,
    },
}

/// Query of `GET .../processes/{pid}/logs`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, utoipa::IntoParams)]
pub struct LogsQuery {
    /// Keep the stream open and follow new output until the process exits.
    #[serde(default)]
    pub follow: bool,
    /// Start at this byte offset of the combined log (default 0: all buffered output).
    #[serde(default)]
    pub offset: u64,
}

/// Query of `POST .../exec`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, utoipa::IntoParams)]
pub struct ExecQuery {
    /// Stream NDJSON `ProcessEvent`s while the command runs instead of waiting.
    #[serde(default)]
    pub stream: bool,
}

/// Request body of `POST .../processes/{pid}/signal`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SignalRequest {
    /// Signal name (`TERM`, `SIGKILL`, ...) or number.
    pub signal: String,
}

/// Request body of `POST .../processes/{pid}/stdin`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct StdinRequest {
    /// Bytes to write, base64.
    #[serde(default)]
    pub data_b64: String,
    /// Close stdin after writing.
    #[serde(default)]
    pub close: bool,
}

/// A message of the terminal WebSocket (`GET .../processes/{pid}/tty`), as
/// JSON in a text frame; the terminal's bytes travel in binary frames (to
/// it: its input; from it: its output).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TtyMessage {
    /// Client: resize the terminal.
    Resize {
        /// Columns.
        cols: u16,
        /// Rows.
        rows: u16,
    },
    /// Server: earlier output was dropped from the buffer before it was sent.
    Dropped {
        /// Bytes lost.
        bytes: u64,
    },
    /// Server: the process ended (the last message before the close).
    Exited {
        /// The final process record.
        process: ProcessInfo,
    },
    /// Server: a message could not be taken (the connection stays open).
    Error {
        /// Why.
        message: String,
    },
}

/// Query of `GET .../processes/{pid}/tty`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, utoipa::IntoParams)]
pub struct TtyQuery {
    /// Send the output from this byte offset of its log first (default: only
    /// what comes after the connection; 0 replays what the buffer holds).
    #[serde(default)]
    pub offset: Option<u64>,
}

/// Query of `POST .../processes/{pid}/wait`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, utoipa::IntoParams)]
pub struct WaitQuery {
    /// Give up after this long (e.g. "30s"); default: wait until it exits.
    #[serde(default)]
    pub timeout: Option<String>,
}
