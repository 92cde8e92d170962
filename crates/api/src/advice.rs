//! The lifecycle advisor: a stage described by what it must keep, how long it
//! sits idle, what its setup costs and whether its input is trusted, and the
//! lifecycle recommended for it with the priced alternatives.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Something a stage's next turn (or the next stage) needs from this one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Keep {
    /// A cloned repository (setup can clone it again).
    Repository,
    /// Installed packages (setup can install them again).
    Packages,
    /// Files the work produced (setup cannot make them again).
    GeneratedFiles,
    /// Credentials (injected again as secrets; never worth keeping in state).
    Tokens,
    /// Running processes with their memory (a dev server, a REPL, a debugger).
    Processes,
}

impl Keep {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Keep::Repository => "repository",
            Keep::Packages => "packages",
            Keep::GeneratedFiles => "generated_files",
            Keep::Tokens => "tokens",
            Keep::Processes => "processes",
        }
    }

    /// Whether running the stage's setup again brings it back.
    pub fn recreated_by_setup(self) -> bool {
        matches!(self, Keep::Repository | Keep::Packages | Keep::Tokens)
    }
}

/// `POST /v1/advise`: the stage to advise on. Durations are strings like `90s`,
/// `5m`; sizes like `512m`, `2g`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct AdviseRequest {
    /// What must survive to the next turn or stage.
    pub keep: Vec<Keep>,
    /// Time to build the environment from nothing (clone, install, boot). Default `0s`.
    pub setup: Option<String>,
    /// How many times the stage is invoked (agent turns). Default 1.
    pub turns: Option<u32>,
    /// Active time per turn. Default `1m`.
    pub turn: Option<String>,
    /// Idle time between turns. Default `0s`.
    pub idle: Option<String>,
    /// The stage processes untrusted input (uploads, web content, third-party code).
    pub untrusted_input: bool,
    /// Attempts run side by side from the same starting point (fan-out); 0 or 1: none.
    pub fan_out: Option<u32>,
    /// CPUs the sandbox reserves. Default 1.
    pub cpus: Option<f64>,
    /// Memory the sandbox reserves (and roughly what a standby image holds). Default `1g`.
    pub memory: Option<String>,
    /// Size of the state on disk (repository, packages, outputs). Default `1g`.
    pub disk: Option<String>,
}

/// A lifecycle the advisor weighs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// A fresh sandbox per turn, setup repeated every time, nothing kept.
    EphemeralOnly,
    /// Setup once, sealed as a template; every turn starts clean from it.
    TemplateThenEphemeral,
    /// One sandbox kept running through turns and idle time.
    AlwaysOn,
    /// Kept running while active, with a checkpoint after each turn (rollback).
    PersistentWithCheckpoints,
    /// Stopped between turns (files kept, processes not), started on the next call.
    StopBetweenTurns,
    /// Standby between turns: processes and memory on disk, compute released,
    /// resumed on the next call.
    StandbyBetweenTurns,
    /// Setup once, checkpoint, fork one copy-on-write child per attempt.
    ForkFromCheckpoint,
}

impl Strategy {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::EphemeralOnly => "ephemeral_only",
            Strategy::TemplateThenEphemeral => "template_then_ephemeral",
            Strategy::AlwaysOn => "always_on",
            Strategy::PersistentWithCheckpoints => "persistent_with_checkpoints",
            Strategy::StopBetweenTurns => "stop_between_turns",
            Strategy::StandbyBetweenTurns => "standby_between_turns",
            Strategy::ForkFromCheckpoint => "fork_from_checkpoint",
        }
    }
}

/// One priced alternative.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct StrategyCost {
    /// The lifecycle.
    pub strategy: Strategy,
    /// What it means for this stage, in a sentence.
    pub description: String,
    /// Whether it keeps everything the stage asked to keep.
    pub satisfies_keep: bool,
    /// Why not, when it does not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unmet: Option<String>,
    /// How many times setup runs.
    pub setup_runs: u32,
    /// Seconds the agent waits on setup, starts and resumes over all turns.
    pub waiting_seconds: f64,
    /// Priced CPU and memory reservation.
    pub compute_cost: f64,
    /// Priced storage (writable layers, templates, checkpoints, standby images).
    pub storage_cost: f64,
    /// compute + storage.
    pub total_cost: f64,
}

/// `POST /v1/advise` response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Advice {
    /// The recommended lifecycle.
    pub recommendation: Strategy,
    /// The isolation tier recommended from the stage's trust.
    #[serde(default)]
    pub isolation: crate::Isolation,
    /// Why that tier (and, from a daemon, whether it can run there).
    #[serde(default)]
    pub isolation_reason: String,
    /// Why, one fact per line, numbers included.
    pub reasons: Vec<String>,
    /// Things to watch (state kept from untrusted input, tokens kept in state, ...).
    pub warnings: Vec<String>,
    /// Every alternative weighed, cheapest first; always includes ephemeral-only
    /// and always-on for comparison.
    pub alternatives: Vec<StrategyCost>,
    /// Currency of the costs (the daemon's price table).
    pub currency: String,
}
