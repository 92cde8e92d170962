//! Preview URLs: HTTP (and WebSocket) access to a port inside a sandbox
//! through the daemon's reverse proxy. See docs/preview.md.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Request header that carries a preview token.
pub const PREVIEW_TOKEN_HEADER: &str = "x-strata-preview-token";

/// Query parameter of a signed preview URL (stripped before the request goes upstream).
pub const PREVIEW_TOKEN_QUERY: &str = "strata_token";

/// Prefix of path-based preview URLs: `/preview/<sandbox>/<port>/...`.
pub const PREVIEW_PATH_PREFIX: &str = "/preview/";

/// Prefix of the secrets `POST /v1/sandboxes/{id}/previews` prints.
pub const PREVIEW_SECRET_PREFIX: &str = "stp_";

/// Request body of `POST /v1/sandboxes/{id}/previews`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreatePreviewRequest {
    /// The port inside the sandbox (bound on its loopback, 127.0.0.1); omitted: every port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Anyone who can reach the daemon's listener may use it, without a token (an explicit choice).
    #[serde(default)]
    pub public: bool,
    /// Lifetime in seconds (default 86400, one day; at most 30 days).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_secs: Option<u64>,
}

/// A preview as listed (never its token).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Preview {
    /// Id (hex).
    pub id: String,
    /// The sandbox's id.
    pub sandbox_id: String,
    /// The port it opens; `None`: every port.
    #[serde(default)]
    pub port: Option<u16>,
    /// No token needed.
    pub public: bool,
    /// The tenant of the sandbox.
    pub tenant: String,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339 time after which its token (and public access) is refused.
    pub expires_at: String,
    /// RFC 3339 time it was revoked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<String>,
    /// Host-based URL: `http://<port>-<sandbox>.<preview-domain>[:<listen port>]/`
    /// (`{port}` stands for the port of an every-port preview).
    pub url_host: String,
    /// Path-based URL: `[http://<listen address>]/preview/<sandbox>/<port>/`.
    pub url_path: String,
}

/// Response of `POST /v1/sandboxes/{id}/previews`: the only time the token is shown.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CreatedPreview {
    /// The preview.
    #[serde(flatten)]
    pub preview: Preview,
    /// The access token (header `X-Strata-Preview-Token`); only its SHA-256 is stored.
    pub token: String,
    /// `url_path` with the token as `?strata_token=` (sets a cookie scoped to the
    /// preview on first use, so the page's own requests work without it).
    pub signed_url: String,
}

/// Query of `GET /v1/sandboxes/{id}/previews`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::IntoParams)]
pub struct PreviewQuery {
    /// Include revoked and expired previews.
    #[serde(default)]
    pub all: bool,
}
