//! A sandbox's network: the `--network` / `--allow-*` flags of new sandboxes and
//! `strata network show|set`.

use clap::{Args, Subcommand, ValueEnum};

use super::{JsonOutput, SandboxId};

/// Network of a sandbox (see docs/network.md).
#[derive(Debug, Args, Clone, Default)]
pub struct NetworkArgs {
    /// `none`: loopback only (the default); `egress`: outbound traffic that an
    /// --allow-host or --allow-cidr rule permits, nothing else. Implied by any --allow-*.
    #[arg(long = "network", value_enum)]
    pub network: Option<NetworkModeArg>,
    /// Allow a domain name (exact, or `*.example.com` for its subdomains), optionally
    /// with ports: pypi.org, *.pythonhosted.org:443 (repeatable).
    #[arg(long = "allow-host", value_name = "HOST[:PORTS]")]
    pub allow_host: Vec<String>,
    /// Allow an IPv4 address or network, optionally with ports: 10.0.0.0/8:443,
    /// 198.51.100.7:8000-8100 (repeatable).
    #[arg(long = "allow-cidr", value_name = "CIDR[:PORTS]")]
    pub allow_cidr: Vec<String>,
    /// Deny an IPv4 address or network (optionally ports) that `--allow-cidr
    /// 0.0.0.0/0` would open: 203.0.113.0/24, 198.51.100.7:25 (repeatable).
    /// Narrower allow rules win over it. Private ranges, the host and cloud
    /// metadata are closed anyway.
    #[arg(long = "deny-cidr", value_name = "CIDR[:PORTS]")]
    pub deny_cidr: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum NetworkModeArg {
    None,
    Egress,
}

#[derive(Debug, Subcommand)]
pub enum NetworkCmd {
    /// Mode, rules, address, flow counters and recently denied destinations.
    Show {
        #[command(flatten)]
        sandbox: SandboxId,
        #[command(flatten)]
        out: JsonOutput,
    },
    /// Replace the mode and rules (live on a running sandbox): e.g.
    /// `strata network set ID --allow-host pypi.org` or `--network none`.
    Set {
        #[command(flatten)]
        sandbox: SandboxId,
        #[command(flatten)]
        network: NetworkArgs,
        #[command(flatten)]
        out: JsonOutput,
    },
}
