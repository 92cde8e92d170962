//! Command-line arguments: [`Cli`] (the global flags), [`Command`] (one variant per
//! `strata` command, in the order `strata --help` lists them) and the flags several
//! commands share. The arguments of each command live in the file of its group, the
//! same file name as its code under `commands/`.

pub mod checkpoint;
pub mod cost;
pub mod daemon;
pub mod files;
pub mod image;
pub mod lease;
pub mod network;
pub mod pipeline;
pub mod preview;
pub mod process;
pub mod sandbox;
pub mod security;
pub mod template;
pub mod tenant;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// strata: sandboxes for multi-step AI-agent pipelines.
#[derive(Debug, Parser)]
#[command(name = "strata", version, about, propagate_version = true)]
pub struct Cli {
    /// Daemon socket.
    #[arg(long, global = true, env = "STRATA_SOCKET", default_value = "/run/strata/strata.sock")]
    pub socket: PathBuf,
    /// Talk to the daemon over TCP instead (host:port); the token comes from STRATA_TOKEN.
    #[arg(long, global = true, env = "STRATA_HOST")]
    pub host: Option<String>,
    /// Bearer token for --host: a tenant token (`strata token create`) or the operator's <state-dir>/api-token.
    #[arg(long, global = true, env = "STRATA_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Act as this tenant (operator: create in it and see only it; sent as X-Strata-Tenant).
    #[arg(long = "as-tenant", global = true, env = "STRATA_TENANT", value_name = "TENANT")]
    pub as_tenant: Option<String>,
    /// Cite an approved Rule-of-Two approval (sent as X-Strata-Approval) when repeating
    /// a request that was refused with `approval required`.
    #[arg(long, global = true, env = "STRATA_APPROVAL", value_name = "APPROVAL_ID")]
    pub approval: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon.
    Daemon(daemon::DaemonArgs),
    /// Report what this host supports and what each missing piece disables.
    Doctor(JsonOutput),
    /// Show the warm pools (`strata daemon --warm-pool`): members ready, adoptions, misses (operator only).
    Pool(JsonOutput),
    /// Manage images.
    #[command(subcommand)]
    Image(image::ImageCmd),
    /// Manage API tokens (operator only): each belongs to a tenant and sees only its sandboxes,
    /// checkpoints, templates and pipeline runs.
    #[command(subcommand)]
    Token(tenant::TokenCmd),
    /// Tenant quotas (sandboxes, memory, disk, forks per minute) and usage against them.
    #[command(subcommand)]
    Tenant(tenant::TenantCmd),
    /// The Rule of Two's approval queue: requests that would give one sandbox untrusted
    /// input, sensitive access and external communication at once wait here for a human.
    #[command(subcommand, alias = "approval")]
    Approvals(security::ApprovalCmd),
    /// Run pipelines (a TOML spec of stages, each with its own lifecycle) and follow them.
    #[command(subcommand)]
    Pipeline(pipeline::PipelineCmd),
    /// Create and start a sandbox; prints its id.
    Create(sandbox::CreateArgs),
    /// One-shot: create a sandbox, run a command, and (with --rm) destroy it.
    Run(sandbox::RunArgs),
    /// List sandboxes.
    Ps(sandbox::PsArgs),
    /// Show a sandbox in detail.
    Inspect(sandbox::InspectArgs),
    /// Change a sandbox's lifecycle policy (only the flags given change).
    Update(sandbox::UpdateArgs),
    /// Show or change a sandbox's network (mode, allow rules, counters).
    #[command(subcommand)]
    Network(network::NetworkCmd),
    /// Open sandbox ports as preview URLs (HTTP and WebSocket through the daemon's proxy).
    #[command(subcommand)]
    Preview(preview::PreviewCmd),
    /// Keep a sandbox awake with a lease (prints the lease id and expiry), or manage leases.
    Lease(lease::LeaseArgs),
    /// Stop sandboxes (processes killed, filesystem kept).
    Stop(SandboxIds),
    /// Freeze sandboxes' processes (memory kept, no CPU).
    Pause(SandboxIds),
    /// Thaw paused sandboxes.
    Unpause(SandboxIds),
    /// Dump sandboxes' processes and memory to disk, releasing their CPU and RAM.
    Standby(sandbox::StandbyArgs),
    /// Bring sandboxes back from standby (same processes), or thaw / start them.
    Resume(sandbox::ResumeArgs),
    /// Pack stopped or standby sandboxes into the archive store, freeing their local disk
    /// (`resume` or `start` brings them back).
    Archive(SandboxIds),
    /// Start stopped sandboxes.
    Start(SandboxIds),
    /// Destroy sandboxes.
    Rm(sandbox::RmArgs),
    /// Run a command in a running sandbox; exits with its exit code.
    Exec(process::ExecArgs),
    /// Checkpoint a sandbox (prints the checkpoint id), or manage checkpoints.
    Checkpoint(checkpoint::CheckpointArgs),
    /// Delete expired checkpoints nothing needs and layers nothing references.
    Gc(JsonOutput),
    /// Cost of a sandbox (destroyed ones too) or of all: compute, storage by kind,
    /// and the ephemeral-only and always-on counterfactuals.
    Cost(cost::CostArgs),
    /// Recommend a lifecycle for a pipeline stage: from what it must keep, how long it
    /// idles, what its setup costs and whether its input is trusted, the lifecycle,
    /// why, and every alternative priced (ephemeral-only and always-on included).
    Advise(pipeline::AdviseArgs),
    /// The tree of images, checkpoints, forks and templates around a sandbox or checkpoint.
    Lineage(checkpoint::LineageArgs),
    /// Manage templates (warm starting points).
    #[command(subcommand)]
    Template(template::TemplateCmd),
    /// Roll a sandbox back to a checkpoint.
    Restore(checkpoint::RestoreArgs),
    /// Fork N sandboxes from a checkpoint or a live sandbox; prints their ids.
    /// With --run: fan-out and select (one attempt per child, a winner by --select;
    /// prints a table of attempts, exit status 1 when there is no winner).
    Fork(pipeline::ForkArgs),
    /// State-hygiene scan: credentials, setuid files, system-path changes and
    /// persistence hooks that a sandbox (or checkpoint) adds on top of its image.
    /// Exit status 2 when there are findings.
    Scan(security::ScanArgs),
    /// Check a sandbox now as its --check-every would: the scan, then its
    /// --on-findings (a parked sandbox is not resumed). Exit status 2 when
    /// there are findings.
    Check(security::CheckArgs),
    /// Sandboxes, checkpoints and templates on an image version that is no longer
    /// its name's newest (a newer one was imported with `image import --replace`),
    /// how many days behind, and how to move each.
    Outdated(JsonOutput),
    /// Move a stopped or standby sandbox onto another image version (e.g. a patched
    /// re-import), keeping its writable layer; processes start again. Paths changed
    /// both in the sandbox and between the two bases refuse unless --prefer settles
    /// them; the result is scanned.
    Rebase(image::RebaseArgs),
    /// Quarantine sandboxes and checkpoints, lift a quarantine, list them.
    #[command(subcommand)]
    Quarantine(security::QuarantineCmd),
    /// The hash-chained audit log of API actions (mutations), or `audit verify`.
    Audit(security::AuditArgs),
    /// Paths added, modified and deleted since the last checkpoint.
    Diff(files::DiffArgs),
    /// Write the change set since the last checkpoint as a tar (deletions as .wh. entries).
    Export(files::ExportArgs),
    /// Manage background processes of a sandbox.
    #[command(subcommand)]
    Proc(process::ProcCmd),
    /// Copy files: `strata cp LOCAL ID:/path` or `strata cp ID:/path LOCAL`.
    Cp(files::CpArgs),
    /// File operations inside a sandbox.
    #[command(subcommand)]
    Fs(files::FsCmd),
    /// Lifecycle events.
    Events(sandbox::EventsArgs),
    /// Serve strata's sandbox tools to an MCP client (Claude Desktop, IDEs, agent
    /// frameworks) over stdin/stdout; every tool call goes to the daemon (see docs/mcp.md).
    Mcp,
    /// Print the OpenAPI document of the native API.
    #[command(hide = true)]
    Openapi,
}

/// `--json` where its help is plain "JSON output." (a `--json` that says what it
/// prints, e.g. "JSON output (the lease).", stays a field of its command).
#[derive(Debug, Clone, Copy, Args)]
pub struct JsonOutput {
    /// JSON output.
    #[arg(long)]
    pub json: bool,
}

/// The positional sandbox of a command acting on one sandbox.
#[derive(Debug, Clone, Args)]
pub struct SandboxId {
    /// Sandbox id or name.
    pub id: String,
}

/// The positional sandboxes (at least one) of a command acting on each in turn.
#[derive(Debug, Clone, Args)]
pub struct SandboxIds {
    /// Sandbox ids or names.
    #[arg(required = true)]
    pub ids: Vec<String>,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// clap's consistency checks over every command (duplicate flags or ids, the group ids
    /// of the flattened structs, `requires` / `conflicts_with` naming existing args).
    #[test]
    fn cli_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
