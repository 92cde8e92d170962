//! Pipelines: a list of stages, each with its own lifecycle, run by the daemon
//! (`POST /v1/pipelines`). The spec is written in TOML (or sent as JSON); see
//! docs/pipelines.md for the schema and examples.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{FanoutPlan, FanoutResult, PolicyPatch, ResourceLimits};

/// A pipeline spec: stages run in order; a stage may start from an earlier stage's output.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PipelineSpec {
    /// Name of the pipeline (default: `pipeline`); names the runs' sandboxes and checkpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Environment variables for every stage's commands.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// The stages, in order (`[[stage]]` tables in TOML).
    #[serde(rename = "stage", alias = "stages")]
    pub stages: Vec<StageSpec>,
}

/// The lifecycle of one stage: what happens to its sandbox at the stage boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StageLifecycle {
    /// Destroyed at the end of the stage; nothing survives (a later stage cannot use it as a source).
    Ephemeral,
    /// Checkpointed at the end (the stage's output), then stopped (filesystem kept).
    Persistent,
    /// Checkpointed after every command (the last one is the output), then stopped.
    #[serde(alias = "persistent-with-checkpoints")]
    PersistentWithCheckpoints,
    /// Fan-out and select (`fanout` table): N children forked from the source, the
    /// winner's checkpoint is the output; the winner is stopped, losers destroyed or kept.
    Fork,
    /// Put into standby at the end (processes and memory kept when the host can dump
    /// them, else filesystem only, recorded); the next stage with `source = "stage:NAME"`
    /// resumes that same sandbox.
    #[serde(alias = "standby-between-turns", alias = "standby_between_turns")]
    Standby,
}

impl StageLifecycle {
    /// The snake_case wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            StageLifecycle::Ephemeral => "ephemeral",
            StageLifecycle::Persistent => "persistent",
            StageLifecycle::PersistentWithCheckpoints => "persistent_with_checkpoints",
            StageLifecycle::Fork => "fork",
            StageLifecycle::Standby => "standby",
        }
    }
}

/// What of a stage survives to the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StageKeep {
    /// Nothing (only `ephemeral`).
    Nothing,
    /// The filesystem, as a checkpoint (`persistent`, `persistent_with_checkpoints`, `fork`).
    Filesystem,
    /// The running processes and memory with the filesystem (only `standby`).
    Processes,
}

/// One stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StageSpec {
    /// Unique name within the pipeline.
    pub name: String,
    /// `image:NAME`, `template:NAME`, or `stage:NAME` (an earlier stage's output).
    pub source: String,
    /// Lifecycle at the stage boundary.
    pub lifecycle: StageLifecycle,
    /// Shell commands (`sh -c`), run in order; the first non-zero exit fails the run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub commands: Vec<String>,
    /// Fan-out and select (required by, and only allowed with, `lifecycle = "fork"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fanout: Option<FanoutPlan>,
    /// What must survive; default follows the lifecycle. A value the lifecycle cannot
    /// provide is refused (e.g. `processes` with `persistent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep: Option<StageKeep>,
    /// Flush rules: paths (absolute or `~/...`) emptied before every checkpoint of the stage.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flush: Vec<String>,
    /// Environment variables of the stage's commands (over the pipeline's).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Secrets of the stage's sandbox, as in `POST /v1/sandboxes` (`value_b64` or
    /// `host_file`; files under /run/secrets, optionally env vars). Values are read
    /// when the run is created and kept only in the daemon's secret store, never in
    /// the recorded spec (which shows names) nor in any checkpoint or template the
    /// stage makes. Not on fork stages (children are forked, not created).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<crate::SecretSpec>,
    /// Network of the stage's sandbox, as in `POST /v1/sandboxes`: `none` (default)
    /// or `egress` with allow rules. A stage that resumes an earlier stage's standby
    /// sandbox applies it to that sandbox live (its rules are replaced for this stage).
    /// Not on fork stages (children inherit their source's network).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<crate::NetworkSpec>,
    /// Rule-of-Two capabilities the stage declares (e.g. `["untrusted_input"]` for a
    /// stage that reads a user's upload); secrets and egress add the other two. A
    /// stage that would hold all three waits for an operator's approval (a denial or
    /// the approval timeout fails it). Not on fork stages (children inherit their
    /// source checkpoint's capabilities).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<crate::Capability>,
    /// Resource limits of the stage's sandboxes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<ResourceLimits>,
    /// Lifecycle policy of the stage's sandboxes (idle action, idle timeout, ...),
    /// as in `POST /v1/sandboxes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyPatch>,
    /// TTL of the stage's sandboxes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
    /// Timeout of each command, e.g. "10m".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// User (name or uid) the commands run as (default: the image's). A fork stage
    /// sets it in its `fanout` table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Working directory of the commands (default: the image's). A fork stage sets
    /// it in its `fanout` table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// Promote the stage's output checkpoint to a template of this name (re-pointed
    /// when it exists), so later pipelines and sandboxes start from it
    /// (`source = "template:NAME"`). Only for lifecycles that keep the filesystem;
    /// the promotion passes the state-hygiene scan gate like `strata template create`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// Isolation tier of the stage's sandboxes (`namespace`, `gvisor`,
    /// `microvm`; default: the daemon's). A run whose stage asks for a tier the
    /// daemon cannot run is refused before it starts (501). A fork stage's
    /// attempts run on their source checkpoint's tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<crate::Isolation>,
    /// Promote to `template` even when the scan has findings (recorded on the template).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub accept_findings: bool,
}

/// Request body of `POST /v1/pipelines`: the spec as TOML text or as JSON.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunPipelineRequest {
    /// The spec in TOML (what `strata pipeline run FILE` sends).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toml: Option<String>,
    /// The spec as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<PipelineSpec>,
}

/// State of a pipeline run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PipelineState {
    /// Stages are running.
    Running,
    /// Every stage succeeded.
    Succeeded,
    /// A stage failed (see `reason`); `resume` retries from it.
    Failed,
    /// The daemon stopped while it ran; `resume` continues from the first unfinished stage.
    Interrupted,
    /// Paused at a stage boundary on request (`POST /v1/pipelines/{id}/pause`); `resume` continues it.
    Paused,
}

impl PipelineState {
    /// The snake_case wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            PipelineState::Running => "running",
            PipelineState::Succeeded => "succeeded",
            PipelineState::Failed => "failed",
            PipelineState::Interrupted => "interrupted",
            PipelineState::Paused => "paused",
        }
    }
}

/// State of one stage in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StageState {
    /// Not started.
    Pending,
    /// Running.
    Running,
    /// Finished; its output is recorded.
    Succeeded,
    /// Failed (see `error`).
    Failed,
}

/// What one stage did.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StageResult {
    /// Stage name.
    pub name: String,
    /// Its lifecycle.
    pub lifecycle: StageLifecycle,
    /// Its state.
    pub state: StageState,
    /// How many times it was started (more than 1 after a resume).
    #[serde(default)]
    pub attempts: u32,
    /// RFC 3339 start time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// RFC 3339 end time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// Wall time, in milliseconds.
    #[serde(default)]
    pub duration_ms: u64,
    /// Wall time of the stage's own commands, in milliseconds (a fork stage: its
    /// longest attempt, as they run concurrently). `duration_ms` minus this is
    /// strata's overhead: creating, forking, checkpointing, standby, promotion.
    #[serde(default)]
    pub commands_ms: u64,
    /// The template the stage's output was promoted to (`template`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// Every sandbox the stage created (or resumed), in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sandboxes: Vec<String>,
    /// The output checkpoint (the source of `stage:NAME`), when it keeps the filesystem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
    /// The output sandbox (in standby), when it keeps processes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_sandbox: Option<String>,
    /// Bytes of state the stage kept: the layers of its checkpoints (or its standby image).
    #[serde(default)]
    pub state_kept_bytes: u64,
    /// Exit status of each command, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exit_codes: Vec<i32>,
    /// Cost of the stage's sandboxes when it ended (same currency as `strata cost`).
    #[serde(default)]
    pub cost: f64,
    /// The fan-out result (`fork` stages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fanout: Option<FanoutResult>,
    /// Notes (e.g. standby degraded to filesystem-only and why).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Why it failed: the command and its output's end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A pipeline run (`GET /v1/pipelines/{id}`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PipelineRun {
    /// Run id (hex).
    pub id: String,
    /// The tenant that owns it (and every sandbox and checkpoint it makes).
    #[serde(default = "crate::tenant::default_tenant")]
    pub tenant: String,
    /// Pipeline name.
    pub name: String,
    /// State.
    pub state: PipelineState,
    /// Why it failed or was interrupted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// RFC 3339 creation time.
    pub created_at: String,
    /// RFC 3339 time of the last change.
    pub updated_at: String,
    /// The spec it runs.
    pub spec: PipelineSpec,
    /// One result per stage, in order.
    pub stages: Vec<StageResult>,
}

/// One line of the NDJSON stream of `POST /v1/pipelines?follow=true` and `GET /v1/pipelines/{id}?follow=true`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PipelineEvent {
    /// A stage changed state (started, succeeded, failed).
    Stage {
        /// Run id.
        run_id: String,
        /// 0-based stage index.
        index: u32,
        /// The stage now.
        stage: Box<StageResult>,
    },
    /// The run ended (succeeded, failed or interrupted): the last line.
    Finished {
        /// The run.
        run: Box<PipelineRun>,
    },
}

/// Query of `POST /v1/pipelines`, `GET /v1/pipelines/{id}` and `POST /v1/pipelines/{id}/resume`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, utoipa::IntoParams)]
pub struct PipelineQuery {
    /// Stream NDJSON `PipelineEvent`s until the run ends.
    #[serde(default)]
    pub follow: bool,
}

/// Cost of a pipeline run (`GET /v1/cost/pipeline/{id}`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PipelineCost {
    /// Run id.
    pub run_id: String,
    /// Cost per stage (its sandboxes, priced now), in stage order.
    pub stages: Vec<StageCost>,
    /// Sum of the stages.
    pub total: f64,
}

/// Cost of one stage.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StageCost {
    /// Stage name.
    pub name: String,
    /// Its sandboxes.
    pub sandboxes: Vec<String>,
    /// Their total cost so far.
    pub total: f64,
}
