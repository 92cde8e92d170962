//! Tenants and API tokens.
//!
//! Every sandbox, checkpoint, template and pipeline run belongs to one tenant.
//! A tenant token sees and touches only its tenant's objects; the operator (the
//! Unix-socket caller, or the `<state>/api-token` over TCP) sees all of them and
//! manages tokens. See docs/security.md, "Tenants".

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The tenant the operator creates in unless it names another.
pub const DEFAULT_TENANT: &str = "default";

/// Request header with which the operator acts as one tenant (creates in it,
/// sees only it). A tenant token may send only its own tenant.
pub const TENANT_HEADER: &str = "x-strata-tenant";

/// `"default"`, for serde defaults of records written before tenants existed.
pub fn default_tenant() -> String {
    DEFAULT_TENANT.to_string()
}

/// An API token as listed (never its secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TokenInfo {
    /// Id (hex).
    pub id: String,
    /// Name, unique among the live tokens of its tenant.
    pub name: String,
    /// The tenant it acts in.
    pub tenant: String,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339 time of the last authenticated request (updated at most once a minute).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_used_at: Option<String>,
    /// RFC 3339 time after which it is refused, if it expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// RFC 3339 time it was revoked; refused from then on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<String>,
}

/// Request body of `POST /v1/tokens`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTokenRequest {
    /// Token name (letters, digits, `-`, `_`, `.`; unique among the tenant's live tokens).
    pub name: String,
    /// Tenant (same rules as a name; default `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Lifetime such as `30d` or `12h`; without it the token lives until revoked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
    /// Make the secret in E2B's key form, `e2b_` + hex (E2B SDKs up to 2.45
    /// refuse any other `E2B_API_KEY` before sending a request); it is the
    /// same kind of token, of the same tenant.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub e2b: bool,
}

/// Prefix of a token secret in E2B's key form ([`CreateTokenRequest::e2b`]).
pub const E2B_SECRET_PREFIX: &str = "e2b_";

/// Response of `POST /v1/tokens`: the only time the secret is shown.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CreatedToken {
    /// The token.
    #[serde(flatten)]
    pub token: TokenInfo,
    /// The bearer secret (`Authorization: Bearer <secret>`, or `E2B_API_KEY`). Only its SHA-256 is stored.
    pub secret: String,
}

/// Query of `GET /v1/tokens` and `DELETE /v1/tokens/{id}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::IntoParams)]
pub struct TokenQuery {
    /// Only this tenant's tokens (for a revoke by name: the tenant the name is looked up in).
    #[serde(default)]
    pub tenant: Option<String>,
    /// Include revoked tokens in the listing.
    #[serde(default)]
    pub all: bool,
}
