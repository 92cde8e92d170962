//! Security: the Rule of Two's approval queue (`approvals ...`), the audit log (`audit`),
//! state-hygiene scans (`scan`) and the `--secret` flags of new sandboxes.

use clap::{Args, Subcommand};

use super::JsonOutput;

#[derive(Debug, Subcommand)]
pub enum ApprovalCmd {
    /// List approvals (a tenant sees its own), oldest first.
    Ls {
        /// Only those in this state: pending, approved, denied, used.
        #[arg(long)]
        state: Option<String>,
        #[command(flatten)]
        out: JsonOutput,
    },
    /// Show one approval: what was asked, the capabilities and why, the decision.
    Show {
        #[command(flatten)]
        approval: ApprovalId,
        #[command(flatten)]
        out: JsonOutput,
    },
    /// Approve a pending request (operator only); the caller then repeats it once.
    Approve(DecisionArgs),
    /// Deny a pending request (operator only).
    Deny(DecisionArgs),
    /// Wait until an approval is decided (or times out); exit 0 when approved.
    Wait(ApprovalId),
}

/// The positional approval of `approvals show|approve|deny|wait`.
#[derive(Debug, Args)]
pub struct ApprovalId {
    /// Approval id.
    pub id: String,
}

/// `approvals approve|deny`: the approval and why.
#[derive(Debug, Args)]
pub struct DecisionArgs {
    #[command(flatten)]
    pub approval: ApprovalId,
    /// Why (recorded on the approval and in the audit log).
    #[arg(long)]
    pub reason: Option<String>,
}

/// `strata audit`, or `audit verify`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct AuditArgs {
    #[command(subcommand)]
    pub command: Option<AuditCmd>,
    /// Show the last N entries.
    #[arg(long, default_value_t = 100)]
    pub limit: u32,
    #[command(flatten)]
    pub out: JsonOutput,
}

#[derive(Debug, Subcommand)]
pub enum AuditCmd {
    /// Recompute the hash chain; exit status 1 and the first bad entry when it is broken.
    Verify(JsonOutput),
}

/// `strata check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Sandbox id or name.
    pub id: String,
    /// JSON output (the report).
    #[arg(long)]
    pub json: bool,
}

/// `strata quarantine ...`.
#[derive(Debug, Subcommand)]
pub enum QuarantineCmd {
    /// Quarantine a sandbox or checkpoint: it can still be inspected, diffed,
    /// exported and destroyed, but not forked, promoted to a template,
    /// restored into a new sandbox or given egress (a sandbox loses its egress).
    Add {
        /// Sandbox or checkpoint id or name.
        id: String,
        /// Why (required; recorded in its events).
        #[arg(long)]
        reason: String,
    },
    /// Lift a quarantine (operator only; the reason is recorded). A sandbox
    /// gets its egress back.
    Lift {
        /// Sandbox or checkpoint id or name.
        id: String,
        /// Why (required; recorded in its events).
        #[arg(long)]
        reason: String,
    },
    /// List quarantined sandboxes and checkpoints.
    Ls {
        #[command(flatten)]
        out: JsonOutput,
    },
}

/// `strata scan`.
#[derive(Debug, Args)]
pub struct ScanArgs {
    /// Sandbox or checkpoint id or name.
    pub id: String,
    /// JSON output (the report).
    #[arg(long)]
    pub json: bool,
}

/// Secrets of a new sandbox.
#[derive(Debug, Args, Clone, Default)]
pub struct SecretArgs {
    /// Secret, mounted read-only at /run/secrets/NAME (repeatable): NAME=@FILE
    /// (the file's content), NAME=env:VAR (the CLI's variable VAR) or NAME=env
    /// (the CLI's variable NAME). Never stored in layers, checkpoints, standby
    /// images, forks, templates or archives; redacted from output and events.
    #[arg(long = "secret", value_name = "NAME=@FILE|env:VAR")]
    pub secrets: Vec<String>,
    /// Also expose secret NAME as an environment variable of every process
    /// (repeatable). Such a sandbox cannot keep its processes in standby.
    #[arg(long = "secret-env", value_name = "NAME")]
    pub secret_env: Vec<String>,
}
