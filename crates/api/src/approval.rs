//! The agents' Rule of Two and its approval queue.
//!
//! A sandbox may hold at most two of three capabilities: it processes
//! untrusted input, it reaches sensitive data, it communicates externally. A
//! create or change that would give one sandbox all three is refused with
//! `approval_required` (403) and becomes a pending [`Approval`] that an operator
//! approves or denies (or that times out, which denies it). The caller then
//! repeats the same request with the approval id in [`APPROVAL_HEADER`].
//! See docs/security.md, "Rule of Two".

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// Request header that carries an approved approval's id when a refused request is repeated.
pub const APPROVAL_HEADER: &str = "x-strata-approval";

/// One of the Rule of Two's capabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Capability {
    /// Processes input strata cannot vouch for (user uploads, web pages, issue text, a model's output).
    UntrustedInput,
    /// Reaches sensitive data or systems (secrets, credentials, private repositories).
    SensitiveAccess,
    /// Changes state or communicates outside the sandbox (network egress, previews, exported files).
    ExternalComms,
}

impl Capability {
    /// All three, in a fixed order.
    pub const ALL: [Capability; 3] =
        [Capability::UntrustedInput, Capability::SensitiveAccess, Capability::ExternalComms];

    /// The snake_case wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Capability::UntrustedInput => "untrusted_input",
            Capability::SensitiveAccess => "sensitive_access",
            Capability::ExternalComms => "external_comms",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<Capability> {
        Capability::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

impl std::fmt::Display for Capability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A capability a sandbox holds and why (declared, or derived from its configuration).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
pub struct CapabilityGrant {
    /// The capability.
    pub capability: Capability,
    /// Where it comes from: `declared`, `inherited from checkpoint X`, `secrets: A, B`,
    /// `network egress: allow ...`, `preview of port N`, `export`.
    pub because: String,
}

/// State of an approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalState {
    /// Waiting for an operator; denied when `expires_at` passes.
    Pending,
    /// Approved: the same request, repeated with the approval id before `expires_at`, goes through once.
    Approved,
    /// Denied by an operator, or by the timeout (`decided_by` is `timeout`).
    Denied,
    /// Approved and then used by the request it was asked for.
    Used,
}

impl ApprovalState {
    /// The snake_case wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalState::Pending => "pending",
            ApprovalState::Approved => "approved",
            ApprovalState::Denied => "denied",
            ApprovalState::Used => "used",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<ApprovalState> {
        [ApprovalState::Pending, ApprovalState::Approved, ApprovalState::Denied, ApprovalState::Used]
            .into_iter()
            .find(|c| c.as_str() == s)
    }
}

impl std::fmt::Display for ApprovalState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A request that would give one sandbox all three capabilities, held for a human decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Approval {
    /// Id (`apr-` + hex).
    pub id: String,
    /// The tenant of the request.
    pub tenant: String,
    /// State.
    pub state: ApprovalState,
    /// What was asked: `create sandbox`, `fork`, `update network`, `declare capabilities`, `create preview`, `export`.
    pub action: String,
    /// The sandbox (id) the action changes, or for a create the source and name.
    pub target: String,
    /// The capabilities the sandbox would hold, each with its reason.
    pub capabilities: Vec<CapabilityGrant>,
    /// Who asked (as the audit log names callers).
    pub requested_by: String,
    /// RFC 3339.
    pub requested_at: String,
    /// RFC 3339: a pending approval is denied after this; an approved one must be used before it.
    pub expires_at: String,
    /// Who decided (`timeout` for an expired request).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    /// RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<String>,
    /// The decider's reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// RFC 3339 time the approved request went through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_at: Option<String>,
    /// SHA-256 of the action, target and capability grants: the approval is good
    /// only for a request that asks for exactly this.
    pub fingerprint: String,
}

/// Body of approve and deny.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalDecision {
    /// Why (recorded on the approval and in the audit log).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Filter of the approval list.
#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalQuery {
    /// Only approvals in this state (`pending`, `approved`, `denied`, `used`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}
