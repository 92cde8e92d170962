//! Checkpoints and what starts from them: `checkpoint` (and `checkpoint ls|inspect|rm`),
//! `restore`, `lineage` and `gc`, and the `--processes` / `--no-processes` choice of
//! sandboxes started from a checkpoint.

use clap::{Args, Subcommand};

use super::{JsonOutput, SandboxId};

/// `strata checkpoint [ID]`, or one of its subcommands.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct CheckpointArgs {
    #[command(subcommand)]
    pub command: Option<CheckpointCmd>,
    /// Sandbox to checkpoint.
    #[arg(required = true)]
    pub id: Option<String>,
    /// Checkpoint name.
    #[arg(long)]
    pub name: Option<String>,
    /// Label (repeatable).
    #[arg(long = "label", value_name = "K=V")]
    pub labels: Vec<String>,
    /// Retention: garbage collection deletes it after this long unless something needs it.
    #[arg(long)]
    pub ttl: Option<String>,
    /// Never expire.
    #[arg(long)]
    pub pin: bool,
    /// Also keep the running processes (memory, open files): sandboxes forked or
    /// created from the checkpoint start with them running (needs CRIU; not for
    /// sandboxes with secrets).
    #[arg(long)]
    pub processes: bool,
    /// JSON output (the checkpoint).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum CheckpointCmd {
    /// List checkpoints (of one sandbox, or all).
    Ls {
        /// Sandbox.
        id: Option<String>,
        #[command(flatten)]
        out: JsonOutput,
    },
    /// Show a checkpoint.
    Inspect {
        /// Checkpoint id or name.
        id: String,
        #[command(flatten)]
        out: JsonOutput,
    },
    /// Delete checkpoints (refused while something builds on one, unless --when-unused).
    Rm {
        /// Checkpoint ids or names.
        #[arg(required = true)]
        ids: Vec<String>,
        /// Retire a checkpoint that something still builds on instead of
        /// refusing: it can no longer be used as a source, and its layers go
        /// once the last sandbox, checkpoint or template that needs them does.
        #[arg(long)]
        when_unused: bool,
    },
}

/// `strata restore`.
#[derive(Debug, Args)]
pub struct RestoreArgs {
    #[command(flatten)]
    pub sandbox: SandboxId,
    /// Checkpoint id or name.
    #[arg(long = "to")]
    pub to: String,
    /// Checkpoint the current state first instead of discarding it.
    #[arg(long)]
    pub keep_current: bool,
    #[command(flatten)]
    pub warm: WarmArgs,
    #[command(flatten)]
    pub out: JsonOutput,
}

/// `strata lineage`.
#[derive(Debug, Args)]
pub struct LineageArgs {
    /// Sandbox or checkpoint.
    pub id: String,
    #[command(flatten)]
    pub out: JsonOutput,
}

/// Whether a sandbox starts with the running processes a checkpoint kept.
#[derive(Debug, Clone, Copy, Args)]
pub struct WarmArgs {
    /// Start with the running processes of the source checkpoint (a live fork
    /// source is checkpointed with its processes). Default: when the checkpoint kept them.
    #[arg(long, conflicts_with = "no_processes")]
    pub processes: bool,
    /// Boot the filesystem fresh, even from a checkpoint that kept processes.
    #[arg(long)]
    pub no_processes: bool,
}

impl WarmArgs {
    /// The request field: `Some(true)`, `Some(false)` or the source's default.
    pub fn choice(&self) -> Option<bool> {
        match (self.processes, self.no_processes) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        }
    }
}
