//! Per-sandbox networks (see docs/network.md): allow-rule parsing
//! ([`rules`]), the address pool ([`pool`]), nftables rulesets ([`nft`]),
//! the veth plumbing ([`link`]) and DNS messages of the filtering resolver
//! ([`dns`]). The daemon's `network` module drives these.

pub mod dns;
pub mod link;
pub mod nft;
pub mod pool;
pub mod rules;

use std::io::Write;
use std::process::{Command, Stdio};

pub use pool::{Link, Pool};
pub use rules::{parse_rule, parse_rules, Cidr, Rule, RuleError, Target};

/// PATH for the tools run here (`ip`, `nsenter`, `nft`).
pub const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Errors of network setup.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// A tool could not be run.
    #[error("running {what}: {source}")]
    Spawn {
        /// Which.
        what: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A tool failed.
    #[error("{what} failed: {detail}")]
    Command {
        /// Which.
        what: &'static str,
        /// Its error output.
        detail: String,
    },
    /// A file operation failed.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was attempted.
        what: &'static str,
        /// Where.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Anything else.
    #[error("{0}")]
    Setup(String),
}

/// Applies an nftables script as one transaction (`nft -f -`).
pub fn nft_apply(script: &str) -> Result<(), NetError> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .env_clear()
        .env("PATH", PATH)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| NetError::Spawn { what: "nft", source })?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(script.as_bytes())
        .map_err(|source| NetError::Spawn { what: "nft", source })?;
    let out = child.wait_with_output().map_err(|source| NetError::Spawn { what: "nft", source })?;
    if !out.status.success() {
        let detail = String::from_utf8_lossy(&out.stderr).lines().take(6).collect::<Vec<_>>().join(" | ");
        return Err(NetError::Command { what: "nft", detail });
    }
    Ok(())
}

/// Runs `nft -j ARGS` and returns its output ("" when it fails, e.g. no such table).
pub fn nft_json(args: &[&str]) -> String {
    match Command::new("nft").arg("-j").args(args).env_clear().env("PATH", PATH).stderr(Stdio::null()).output() {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        _ => String::new(),
    }
}

/// Why egress networking cannot work on this host (`None`: it can).
pub fn unsupported() -> Option<String> {
    for tool in ["ip", "nft", "nsenter"] {
        if !std::env::split_paths(PATH).any(|d| d.join(tool).is_file()) {
            return Some(format!(
                "`{tool}` is not installed (scripts/setup-host.sh installs iproute2, nftables and util-linux)"
            ));
        }
    }
    None
}
