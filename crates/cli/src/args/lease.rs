//! `strata lease ...`: leases that keep a sandbox awake.

use clap::{Args, Subcommand};

use super::{JsonOutput, SandboxId};

/// `strata lease ID --for DUR`, or one of its subcommands.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct LeaseArgs {
    #[command(subcommand)]
    pub command: Option<LeaseCmd>,
    /// Sandbox to hold awake.
    #[arg(required = true)]
    pub id: Option<String>,
    /// How long the lease holds (e.g. 10m).
    #[arg(long = "for", value_name = "DUR", required = true)]
    pub duration: Option<String>,
    /// JSON output (the lease).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum LeaseCmd {
    /// Extend a lease to DUR from now.
    Renew {
        #[command(flatten)]
        lease: LeaseRef,
        /// New duration from now (e.g. 10m).
        #[arg(long = "for", value_name = "DUR")]
        duration: String,
        /// JSON output (the lease).
        #[arg(long)]
        json: bool,
    },
    /// Release a lease.
    Release(LeaseRef),
    /// List the leases a sandbox holds.
    Ls {
        #[command(flatten)]
        sandbox: SandboxId,
        #[command(flatten)]
        out: JsonOutput,
    },
}

/// One lease of one sandbox: the positional `ID LEASE`.
#[derive(Debug, Args)]
pub struct LeaseRef {
    #[command(flatten)]
    pub sandbox: SandboxId,
    /// Lease id.
    pub lease: String,
}
