//! Multi-tenancy: API tokens (`token ...`) and tenant quotas and usage (`tenant ...`).

use clap::{Args, Subcommand};

use super::JsonOutput;

#[derive(Debug, Subcommand)]
pub enum TokenCmd {
    /// Create a token; prints its secret (shown only now) for STRATA_TOKEN or E2B_API_KEY.
    Create {
        /// Token name (unique among the tenant's live tokens).
        #[arg(long)]
        name: String,
        /// Tenant the token acts in (default: `default`, or --as-tenant).
        #[arg(long)]
        tenant: Option<String>,
        /// Lifetime, e.g. `30d`, `12h` (default: until revoked).
        #[arg(long)]
        expires: Option<String>,
        /// Print the secret in E2B's key form (`e2b_` + hex), which every E2B SDK
        /// accepts as `E2B_API_KEY` (SDKs up to 2.45 refuse others).
        #[arg(long)]
        e2b: bool,
        /// JSON output (the token and its secret).
        #[arg(long)]
        json: bool,
    },
    /// List tokens (never their secrets).
    Ls {
        /// Only this tenant's tokens.
        #[arg(long)]
        tenant: Option<String>,
        /// Include revoked tokens.
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        out: JsonOutput,
    },
    /// Revoke a token by id or name; refused from the next request on.
    Revoke {
        /// Token id or name.
        id: String,
        /// The tenant a name is looked up in (when several tenants use it).
        #[arg(long)]
        tenant: Option<String>,
        #[command(flatten)]
        out: JsonOutput,
    },
}

#[derive(Debug, Subcommand)]
pub enum TenantCmd {
    /// Show or change a tenant's quota (operator only).
    #[command(subcommand)]
    Quota(QuotaCmd),
    /// A tenant's usage against its quota (a tenant token sees only its own).
    Usage {
        /// Tenant (default: the one --as-tenant names).
        tenant: Option<String>,
        #[command(flatten)]
        out: JsonOutput,
    },
}

#[derive(Debug, Subcommand)]
pub enum QuotaCmd {
    /// The quota in force, the tenant's override and the daemon's defaults.
    Show {
        #[command(flatten)]
        tenant: TenantName,
        #[command(flatten)]
        out: JsonOutput,
    },
    /// Change a tenant's override; only the quotas given change. VALUE: a
    /// number (sizes: 512m, 20g), `unlimited`, or `default` (back to the
    /// daemon's default for that quota).
    Set {
        #[command(flatten)]
        tenant: TenantName,
        /// Live sandboxes.
        #[arg(long, value_name = "VALUE")]
        sandboxes: Option<String>,
        /// Sum of the memory limits of its sandboxes holding memory.
        #[arg(long, value_name = "VALUE")]
        memory: Option<String>,
        /// Sum of the nominal disk sizes of its sandboxes.
        #[arg(long, value_name = "VALUE")]
        disk: Option<String>,
        /// Fork and fan-out children per minute.
        #[arg(long, value_name = "VALUE")]
        forks_per_minute: Option<String>,
        /// JSON output (the quota afterwards).
        #[arg(long)]
        json: bool,
    },
    /// Remove a tenant's override: the daemon's defaults hold again.
    Reset {
        #[command(flatten)]
        tenant: TenantName,
        /// JSON output (the quota afterwards).
        #[arg(long)]
        json: bool,
    },
}

/// The positional tenant of `tenant quota show|set|reset`.
#[derive(Debug, Args)]
pub struct TenantName {
    /// Tenant.
    pub tenant: String,
}
