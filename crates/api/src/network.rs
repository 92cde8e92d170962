//! Network models: a sandbox's network mode and egress allowlist, and what
//! `GET /v1/sandboxes/{id}/network` reports (see docs/network.md).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// How a sandbox reaches the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NetworkMode {
    /// Its own network namespace with loopback only.
    #[default]
    None,
    /// Its own network namespace with a veth link to the host, which forwards
    /// only what the `allow` rules permit (nftables, default deny).
    Egress,
}

impl NetworkMode {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            NetworkMode::None => "none",
            NetworkMode::Egress => "egress",
        }
    }
}

/// A sandbox's network configuration (create, fork, `PUT .../network`).
///
/// `allow` rules (egress mode only):
/// * `CIDR[:PORTS]` — an IPv4 address or network, e.g. `10.0.0.0/8:443`,
///   `198.51.100.7`, `203.0.113.0/24:8000-8100`; without ports every port
///   (TCP and UDP) is allowed.
/// * `HOST[:PORTS]` — a domain name, exact (`pypi.org`) or with a leading
///   wildcard for its subdomains (`*.pythonhosted.org`); the addresses strata's
///   DNS resolver answers for it are allowed for the answer's TTL.
///
/// `0.0.0.0/0` opens every public address (and lets every name resolve);
/// private, loopback, link-local (cloud metadata), CGNAT and the other
/// reserved ranges, the host and other sandboxes stay closed unless a rule
/// inside them opens them. `deny` rules (`CIDR[:PORTS]`) carve exceptions out
/// of such a `0.0.0.0/0` rule; any narrower allow rule wins over them (E2B's
/// precedence: `allow_out` over `deny_out`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkSpec {
    /// `none` (loopback only, the default) or `egress`.
    #[serde(default)]
    pub mode: NetworkMode,
    /// Allow rules (egress only); everything else is denied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// Deny rules (egress only): addresses a `0.0.0.0/0` allow rule does not open.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
}

/// Packet and byte counts of one direction or verdict.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FlowCounter {
    /// Packets.
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
}

/// Response of `GET /v1/sandboxes/{id}/network` and `PUT /v1/sandboxes/{id}/network`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NetworkInfo {
    /// The sandbox id.
    pub sandbox_id: String,
    /// Mode and rules in force.
    #[serde(flatten)]
    pub spec: NetworkSpec,
    /// The sandbox's IPv4 address (egress).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Its gateway on the host, also its DNS server (egress).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// Whether the host-side plumbing (veth, rules) exists now (it exists while
    /// the sandbox runs, is paused or is in standby).
    pub attached: bool,
    /// Packets sent by the sandbox and let through (new and established flows).
    pub allowed: FlowCounter,
    /// Packets sent by the sandbox and dropped.
    pub denied: FlowCounter,
    /// Packets of allowed flows delivered to the sandbox.
    pub received: FlowCounter,
    /// DNS questions answered (for allowed names).
    pub dns_answered: u64,
    /// DNS questions refused (names no rule allows).
    pub dns_refused: u64,
    /// Destinations of recently denied packets (`ADDR PROTO/PORT`, last minute, at most 64).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recent_denied: Vec<String>,
}

/// Most allow rules one sandbox may have.
pub const MAX_NETWORK_RULES: usize = 64;
