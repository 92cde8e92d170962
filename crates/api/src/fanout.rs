//! Fan-out and select: fork N children from one source, run a different
//! command in each, pick a winner by a rule, promote it, drop (or keep) the losers.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{Checkpoint, Lifecycle, ResourceLimits};

/// Bytes of stdout/stderr kept per attempt in a [`FanoutAttempt`] (the end of the output).
pub const FANOUT_TAIL_BYTES: usize = 4096;

/// How the winner of a fan-out is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SelectRule {
    /// The first attempt to exit 0 wins; the others are killed once it is known.
    #[default]
    FirstSuccess,
    /// Every attempt must exit 0 (else there is no winner); the winner is the
    /// lowest index, or the best score when a score command is given.
    AllSuccess,
    /// Among the attempts that exit 0, the highest score wins (ties: lowest index).
    /// The score command runs in each such child after its attempt; the last line
    /// of its stdout is parsed as a number.
    BestScore,
}

impl SelectRule {
    /// The snake_case wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            SelectRule::FirstSuccess => "first_success",
            SelectRule::AllSuccess => "all_success",
            SelectRule::BestScore => "best_score",
        }
    }
}

/// What happens to the children that did not win.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LoserPolicy {
    /// Destroy them (default).
    #[default]
    Destroy,
    /// Keep them (their attempt's processes are killed, the sandboxes stay running) for debugging.
    Keep,
}

/// One explicit attempt: an argv and extra environment.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AttemptSpec {
    /// Program and arguments.
    pub cmd: Vec<String>,
    /// Extra environment variables.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

/// The attempts and the selection of a fan-out (shared by `POST /v1/fanout` and
/// pipeline stages). Give either `attempts`, or `run` with `args` (one attempt
/// per argument) or `count`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FanoutPlan {
    /// Explicit attempts (argv + env), in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<AttemptSpec>,
    /// A shell command template run with `sh -c` in every child; `{i}` becomes the
    /// attempt's index (1-based), `{arg}` its argument from `args`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// One attempt per argument (with `run`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Number of attempts (with `run` and no `args`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
    /// How the winner is chosen.
    #[serde(default)]
    pub select: SelectRule,
    /// Shell command (`sh -c`) printing a score on its last stdout line; required by `best_score`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score_cmd: Option<String>,
    /// Per-attempt timeout, e.g. "60s": an attempt running longer is killed and fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// What happens to the losers.
    #[serde(default)]
    pub losers: LoserPolicy,
    /// User (name or uid) the attempts and the score command run as (default: the image's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Working directory of the attempts and the score command (default: the image's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
}

/// Request body of `POST /v1/fanout`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct FanoutRequest {
    /// A checkpoint (id or name), or a sandbox (id or name), which is checkpointed first.
    pub source: String,
    /// Attempts and selection (flattened: unknown fields are rejected by the plan).
    #[serde(flatten)]
    pub plan: FanoutPlan,
    /// Checkpoint the winner under this name (a source for `create`, `fork` or a following stage).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promote_as: Option<String>,
    /// Children are named `<prefix>-<n>` (default: the source's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name_prefix: Option<String>,
    /// Lifecycle of the children.
    #[serde(default)]
    pub lifecycle: Lifecycle,
    /// TTL of the children.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
    /// Resource limits of each child (default: the source sandbox's, else none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<ResourceLimits>,
}

/// How one attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    /// Exited 0.
    Passed,
    /// Exited non-zero, was killed by a signal, or could not start.
    Failed,
    /// Killed by its timeout.
    TimedOut,
    /// Killed because another attempt had already won (`first_success`).
    Cancelled,
}

/// The result of one attempt.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FanoutAttempt {
    /// 1-based index (the `{i}` of the template).
    pub index: u32,
    /// The child sandbox's id.
    pub sandbox_id: String,
    /// Its name.
    pub sandbox_name: String,
    /// The command that ran.
    pub cmd: Vec<String>,
    /// How it ended.
    pub outcome: AttemptOutcome,
    /// Shell-style exit status (code, 128+signal, 127 when it never started); absent when cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Wall time of the attempt, in milliseconds.
    pub duration_ms: u64,
    /// The score (`best_score`, or any rule with a score command).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
    /// Why there is no score (the score command failed or printed no number).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score_error: Option<String>,
    /// The end of its stdout (at most [`FANOUT_TAIL_BYTES`], lossy UTF-8).
    pub stdout_tail: String,
    /// The end of its stderr.
    pub stderr_tail: String,
    /// Whether the sandbox still exists (the winner, or a kept loser).
    pub kept: bool,
}

/// Response of `POST /v1/fanout`. A fan-out without a winner is still a 200:
/// `winner` is null and `reason` says why (every attempt failed, one failed under
/// `all_success`, no attempt produced a score); the CLI exits 1.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FanoutResult {
    /// The checkpoint the children were forked from.
    pub checkpoint: String,
    /// The rule applied.
    pub select: SelectRule,
    /// Every attempt, by index.
    pub attempts: Vec<FanoutAttempt>,
    /// Index of the winning attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub winner: Option<u32>,
    /// The winner's sandbox id (kept running).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub winner_sandbox: Option<String>,
    /// The winner's checkpoint, with `promote_as`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promoted: Option<Checkpoint>,
    /// Why there is no winner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Total wall time, in milliseconds.
    pub duration_ms: u64,
}
