//! Preview URLs (see docs/preview.md), the engine's half: preview records and
//! their URLs ([`create`], [`list`], [`revoke`], [`Previews::with_urls`]), the
//! token check ([`authorize`], [`check`]), a running sandbox for a request
//! ([`ready_sandbox`]) and connections into a sandbox's network through the
//! runtime ([`Previews::connect`]). The reverse proxy
//! itself (routing, forwarding, WebSocket upgrades, idle upstream connections)
//! is the server's (`strata-server`, `native/preview.rs`).
//!
//! * **Routing**: the server's `intercept` runs before authentication on every listener.
//!   A request whose `Host` is `<port>-<sandbox>.<preview-domain>` (host-based)
//!   or whose path starts with `/preview/<sandbox>/<port>/` (path-based, the
//!   prefix is stripped) is proxied; anything else goes to the API router.
//! * **Access**: a preview's token (header `X-Strata-Preview-Token`, or the
//!   `strata_token` query parameter of a signed URL, which also sets a cookie
//!   scoped to the preview), or a public preview. Tokens are looked up on every
//!   request (only their SHA-256 is stored), so a revoke or an expiry counts
//!   from the next request; a refused one is a 401.
//! * **Reaching the port**: the upstream socket is made inside the sandbox's
//!   network by the runtime ([`strata_runtime::Runtime::net_sockets`]: on the
//!   namespace tier a dedicated thread that has `setns()` into the sandbox's
//!   network namespace; a socket stays in the namespace it was made in, and
//!   tokio then connects it), so a port bound on 127.0.0.1 inside the sandbox
//!   is reachable in every network mode, and nothing is published on the host.
//!   The maker ends after 10 s without requests, so it does not keep the
//!   namespace alive.
//! * **Lifecycle**: a sandbox in standby (or paused) is resumed by the first
//!   request; every proxied request, streamed body and upgraded connection
//!   (WebSocket) holds an [`crate::activity::ActivityGuard`], so the idle
//!   policy never puts a sandbox with open preview connections into standby.
//! * Proxied traffic is counted in metrics (`strata_preview_requests`,
//!   `strata_preview_bytes`), not written to the audit log; creating and
//!   revoking previews are API calls and are audited like any other.

use std::time::{Duration, SystemTime};

use strata_api::{
    CreatePreviewRequest, CreatedPreview, ErrorCode, Preview, SandboxState, PREVIEW_SECRET_PREFIX, PREVIEW_TOKEN_QUERY,
};
use strata_core::ids;
use strata_store::db::SandboxRecord;
use tracing::info;

use crate::error::{EngineError, EngineResult};
use crate::record::{load, now};
use crate::state::Shared;

pub use crate::state::preview::*;

/// Name of the cookie a signed URL sets.
pub const COOKIE: &str = "strata_preview";

/// Default lifetime of a preview.
pub const DEFAULT_TTL: Duration = Duration::from_secs(86_400);

/// Longest lifetime of a preview.
pub const MAX_TTL: Duration = Duration::from_secs(30 * 86_400);

// ---- routing ----

// ---- access ----

/// Why a preview request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No token and no public preview.
    #[error("this preview needs a token (header X-Strata-Preview-Token, or a signed URL's ?strata_token=)")]
    Missing,
    /// The token is unknown, or for another sandbox or port.
    #[error("the preview token is not valid for this sandbox port")]
    Wrong,
    /// The token's preview was revoked.
    #[error("the preview token was revoked")]
    Revoked,
    /// The token's preview expired.
    #[error("the preview token has expired")]
    Expired,
}

/// Whether a stored preview opens `port` of `sandbox_id` at `at`.
pub fn check(p: &Preview, sandbox_id: &str, port: u16, at: SystemTime) -> Result<(), Refusal> {
    if p.sandbox_id != sandbox_id || p.port.is_some_and(|pp| pp != port) {
        return Err(Refusal::Wrong);
    }
    if p.revoked_at.is_some() {
        return Err(Refusal::Revoked);
    }
    // An unreadable expiry is treated as expired (fail closed).
    match humantime::parse_rfc3339_weak(&p.expires_at) {
        Ok(t) if t > at => Ok(()),
        _ => Err(Refusal::Expired),
    }
}

/// Grants or refuses access: the preview that admitted the request and the
/// token that did (`None` for a public preview), or why it is refused.
pub fn authorize(
    st: &Shared,
    sandbox_id: &str,
    port: u16,
    tokens: &[String],
) -> EngineResult<Result<(Preview, Option<String>), Refusal>> {
    let at = SystemTime::now();
    let mut worst = Refusal::Missing;
    for t in tokens {
        if !t.starts_with(PREVIEW_SECRET_PREFIX) {
            worst = Refusal::Wrong;
            continue;
        }
        match st.db.preview_by_hash(&crate::tenancy::secret_hash(t))? {
            Some(p) => match check(&p, sandbox_id, port, at) {
                Ok(()) => return Ok(Ok((p, Some(t.clone())))),
                // Report the most telling reason: revoked/expired over wrong.
                Err(r) if worst == Refusal::Missing || worst == Refusal::Wrong => worst = r,
                Err(_) => {}
            },
            None if worst == Refusal::Missing => worst = Refusal::Wrong,
            None => {}
        }
    }
    for p in st.db.public_previews(sandbox_id, port)? {
        if check(&p, sandbox_id, port, at).is_ok() {
            return Ok(Ok((p, None)));
        }
    }
    Ok(Err(worst))
}

// ---- the proxy ----

/// The version of everything an admission depends on: the latest sandbox
/// event (every state change, create, destroy and adoption writes one and
/// calls [`crate::state::AppState::notify_events`]) and the count of preview
/// creations and revocations. The proxy may reuse an admission (token checked,
/// sandbox running, its init) for later requests while this is unchanged and
/// the preview has not expired; any change sends the next request through
/// [`authorize`] and [`ready_sandbox`] again, so a revoke or a standby counts
/// from the next request, as without the reuse. (One daemon's view: a daemon
/// sharing the database with others needs the database's own change counter.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Generation {
    events: i64,
    previews: u64,
}

/// The current [`Generation`].
pub fn generation(st: &Shared) -> Generation {
    Generation { events: *st.events_tx.borrow(), previews: st.previews.changes() }
}

/// A running sandbox for a preview request: resumes one in standby (or paused); 409 otherwise.
pub async fn ready_sandbox(
    st: &Shared,
    rec: SandboxRecord,
) -> EngineResult<(SandboxRecord, Option<strata_api::ResumeResult>)> {
    match rec.sandbox.state {
        SandboxState::Running => Ok((rec, None)),
        SandboxState::Standby | SandboxState::Paused => {
            let resumed = crate::lifecycle::ensure_running(st, &rec.sandbox.id).await?;
            let rec = load(st, &rec.sandbox.id)?;
            if rec.sandbox.state != SandboxState::Running {
                return Err(EngineError::invalid_state(
                    rec.sandbox.state,
                    format!("sandbox {} is {}, not running", rec.sandbox.id, rec.sandbox.state.as_str()),
                ));
            }
            Ok((rec, resumed))
        }
        s => Err(EngineError::invalid_state(
            s,
            format!(
                "sandbox {} is {}: previews reach only a running sandbox (or one in standby, which they resume)",
                rec.sandbox.id,
                s.as_str()
            ),
        )),
    }
}

// ---- API ----

fn preview_not_found(sandbox: &str, preview: &str) -> EngineError {
    EngineError::new(ErrorCode::PreviewNotFound, format!("sandbox {sandbox} has no preview {preview:?}"))
}

/// Opens a port of a sandbox through the proxy.
pub fn create(st: &Shared, sandbox: &str, req: &CreatePreviewRequest) -> EngineResult<CreatedPreview> {
    if req.port == Some(0) {
        return Err(EngineError::bad_request("port: must be 1-65535 (omit it for every port)"));
    }
    let ttl = match req.ttl_secs {
        Some(0) => return Err(EngineError::bad_request("ttl_secs: must be longer than zero")),
        Some(s) if Duration::from_secs(s) > MAX_TTL => {
            return Err(EngineError::bad_request(format!("ttl_secs: at most {} (30 days)", MAX_TTL.as_secs())))
        }
        Some(s) => Duration::from_secs(s),
        None => DEFAULT_TTL,
    };
    let rec = load(st, sandbox)?;
    if rec.sandbox.state == SandboxState::Destroyed {
        return Err(EngineError::sandbox_not_found(sandbox));
    }
    // The Rule of Two: a preview is external communication.
    let view = crate::record::with_secret_names(st, rec.sandbox.clone());
    let mut facts = crate::record::exposure_facts(st, &view);
    facts.preview_ports.push(req.port.unwrap_or(0));
    let grants = strata_core::rule_of_two::grants(&crate::record::exposure(&view, &facts));
    crate::approvals::gate(st, &rec.sandbox.tenant, "create preview of", &rec.sandbox.id, &grants)?;
    let created = SystemTime::now();
    let token = format!("{PREVIEW_SECRET_PREFIX}{}", hex::encode(rand::random::<[u8; 32]>()));
    let p = Preview {
        id: ids::new_id(),
        sandbox_id: rec.sandbox.id.clone(),
        port: req.port,
        public: req.public,
        tenant: rec.sandbox.tenant.clone(),
        created_at: humantime::format_rfc3339_millis(created).to_string(),
        expires_at: humantime::format_rfc3339_millis(created + ttl).to_string(),
        revoked_at: None,
        url_host: String::new(),
        url_path: String::new(),
    };
    st.db.insert_preview(&p, &crate::tenancy::secret_hash(&token))?;
    st.previews.changed();
    let p = st.previews.with_urls(p);
    info!(sandbox = %p.sandbox_id, preview = %p.id, port = ?p.port, public = p.public, expires_at = %p.expires_at, "preview created");
    let signed_url = format!("{}?{PREVIEW_TOKEN_QUERY}={token}", p.url_path);
    Ok(CreatedPreview { preview: p, token, signed_url })
}

/// The previews of a sandbox (live ones; `all`: revoked and expired ones too).
pub fn list(st: &Shared, sandbox: &str, all: bool) -> EngineResult<Vec<Preview>> {
    let rec = load(st, sandbox)?;
    let at = SystemTime::now();
    Ok(st
        .db
        .list_previews(&rec.sandbox.id)?
        .into_iter()
        .filter(|p| all || check(p, &rec.sandbox.id, p.port.unwrap_or(1), at).is_ok())
        .map(|p| st.previews.with_urls(p))
        .collect())
}

/// Revokes a preview: its token (and public access) is refused from the next request on.
pub fn revoke(st: &Shared, sandbox: &str, preview: &str) -> EngineResult<Preview> {
    let rec = load(st, sandbox)?;
    let p = st
        .db
        .revoke_preview(&rec.sandbox.id, preview, &now())?
        .ok_or_else(|| preview_not_found(&rec.sandbox.id, preview))?;
    st.previews.changed();
    info!(sandbox = %p.sandbox_id, preview = %p.id, "preview revoked");
    Ok(st.previews.with_urls(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_open_their_port_until_revoked_or_expired() {
        let now = SystemTime::now();
        let fmt = |t: SystemTime| humantime::format_rfc3339_millis(t).to_string();
        let p = Preview {
            id: "p".into(),
            sandbox_id: "s".into(),
            port: Some(80),
            public: false,
            tenant: "default".into(),
            created_at: fmt(now),
            expires_at: fmt(now + Duration::from_secs(60)),
            revoked_at: None,
            url_host: String::new(),
            url_path: String::new(),
        };
        assert_eq!(check(&p, "s", 80, now), Ok(()));
        assert_eq!(check(&p, "s", 81, now), Err(Refusal::Wrong));
        assert_eq!(check(&p, "t", 80, now), Err(Refusal::Wrong));
        assert_eq!(check(&p, "s", 80, now + Duration::from_secs(61)), Err(Refusal::Expired));
        let all = Preview { port: None, ..p.clone() };
        assert_eq!(check(&all, "s", 8443, now), Ok(()));
        let revoked = Preview { revoked_at: Some(fmt(now)), ..p.clone() };
        assert_eq!(check(&revoked, "s", 80, now), Err(Refusal::Revoked));
        let garbled = Preview { expires_at: "soon".into(), ..p };
        assert_eq!(check(&garbled, "s", 80, now), Err(Refusal::Expired));
    }
}
