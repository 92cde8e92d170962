//! Tenants and API tokens: who a caller is ([`Caller`]), what it may see
//! ([`visible`], [`find_sandbox`] and the other resolvers), and tokens
//! ([`tenant_caller`], [`check_token`]). The HTTP side (the `authenticate` and
//! `guard` middleware, `route_policy`, the token routes) is the server's
//! (`strata-server`, `native/tenancy.rs`).
//!
//! - **Who**: the server's `authenticate` runs outermost on both listeners. A Unix-socket
//!   caller (root-only socket) and a TCP caller with the legacy
//!   `<state>/api-token` are the *operator*; a TCP caller with a token from
//!   `POST /v1/tokens` is that token's *tenant*. The token is looked up on
//!   every request (no cache), so a revoke or an expiry counts from the next
//!   request on. The operator may act as one tenant with the
//!   [`strata_api::TENANT_HEADER`] header (it then creates in and sees only
//!   that tenant); a tenant token may name only its own tenant.
//! - **What**: the server's `guard` classifies every route (`route_policy`): routes
//!   whose first path parameter names an owned object (a sandbox and all its
//!   sub-routes, a checkpoint, a template, a pipeline run, a cost record, a
//!   lineage/scan target) are checked with `crate::reach::may_reach`, and an object of another
//!   tenant answers exactly like an unknown id (404, same body). Routes not in
//!   the table are operator-only, so a new route is closed to tenants until it
//!   is classified. Ids named in request bodies and listings are filtered
//!   through [`visible`] / [`find_sandbox`] / [`find_checkpoint`], which read
//!   the caller the surface ([`crate::Engine`]) runs each call as (a
//!   call-scoped task-local; spawned work keeps it with [`spawn`]).
//! - **Keys resolve exactly, and only among the caller's own objects**: exact
//!   id, exact name, id prefix unique among them ([`strata_core::ids`]), so an
//!   object of another tenant can neither shadow a name or prefix nor make it
//!   ambiguous. A route naming a second object under the first (a lease,
//!   preview or process of a sandbox) looks that one up *within* the first.
//! - **Owned objects** record their tenant: a sandbox the caller's (or, when
//!   made from a checkpoint or template, that source's), a checkpoint its
//!   sandbox's (in SQL, so automatic checkpoints inherit it), a template its
//!   checkpoint's, a pipeline run the caller's. Images are shared read-only.

use std::time::{Duration, SystemTime};

use strata_api::{ErrorCode, TokenInfo};
use strata_core::ids;
use strata_store::db::SandboxRecord;

use crate::error::{EngineError, EngineResult};
use crate::state::Shared;

pub use crate::caller::*;

/// Prefix of the secrets `POST /v1/tokens` prints.
pub const SECRET_PREFIX: &str = "strata_";

/// How often `last_used_at` is written at most.
const TOUCH_EVERY: Duration = Duration::from_secs(60);

/// The sandbox a caller's key names, resolved among the sandboxes the current
/// caller may see (exact id, exact name, unique id prefix: see
/// [`strata_core::ids`]); another tenant's sandbox is never looked at.
pub fn find_sandbox(st: &Shared, key: &str) -> EngineResult<Option<SandboxRecord>> {
    Ok(st.db.find_sandbox(key, scope().as_deref())?)
}

/// The id of the sandbox [`find_sandbox`] resolves `key` to.
pub fn resolve_sandbox_id(st: &Shared, key: &str) -> EngineResult<Option<String>> {
    Ok(st.db.resolve_sandbox_id(key, scope().as_deref())?)
}

/// The checkpoint (with its image config) a caller's key names, resolved among
/// the checkpoints the current caller may see.
pub fn find_checkpoint(
    st: &Shared,
    key: &str,
) -> EngineResult<Option<(strata_api::Checkpoint, strata_api::ImageConfig)>> {
    Ok(st.db.find_checkpoint(key, scope().as_deref())?)
}

/// A sandbox or a checkpoint, as one key of a route that takes either names.
#[derive(Debug, Clone)]
pub enum SandboxOrCheckpoint {
    /// A sandbox.
    Sandbox(Box<SandboxRecord>),
    /// A checkpoint, with its image config.
    Checkpoint(Box<(strata_api::Checkpoint, strata_api::ImageConfig)>),
}

/// Which kind wins when a sandbox and a checkpoint have the same name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NamesFirst {
    /// The sandbox (lineage, scan).
    Sandbox,
    /// The checkpoint (fork and template sources: a saved state over a live one).
    Checkpoint,
}

/// The sandbox or checkpoint a key names, among those the current caller may
/// see, in the order of [`strata_core::ids`] across both kinds: an exact id
/// (ids are random, so at most one matches), an exact name (`names_first`
/// decides between a sandbox and a checkpoint of the same name), then an id
/// prefix only one of them has.
pub fn find_sandbox_or_checkpoint(
    st: &Shared,
    key: &str,
    names_first: NamesFirst,
) -> EngineResult<Option<SandboxOrCheckpoint>> {
    use SandboxOrCheckpoint::*;
    let sandbox = find_sandbox(st, key)?;
    let checkpoint = find_checkpoint(st, key)?;
    let s = |pick: &dyn Fn(&str, &str) -> bool| {
        sandbox.as_ref().filter(|r| pick(&r.sandbox.id, &r.sandbox.name)).map(|r| Sandbox(Box::new(r.clone())))
    };
    let c = |pick: &dyn Fn(&str, &str) -> bool| {
        checkpoint.as_ref().filter(|(c, _)| pick(&c.id, &c.name)).map(|c| Checkpoint(Box::new(c.clone())))
    };
    let by_id = |id: &str, _: &str| id == key;
    let by_name = |_: &str, name: &str| name == key;
    let named = match names_first {
        NamesFirst::Sandbox => s(&by_name).or_else(|| c(&by_name)),
        NamesFirst::Checkpoint => c(&by_name).or_else(|| s(&by_name)),
    };
    if let Some(found) = s(&by_id).or_else(|| c(&by_id)).or(named) {
        return Ok(Some(found));
    }
    Ok(match (sandbox, checkpoint) {
        (Some(r), None) => Some(Sandbox(Box::new(r))),
        (None, Some(c)) => Some(Checkpoint(Box::new(c))),
        _ => None,
    })
}

/// A template's checkpoint id and creation time, if the current caller may see it
/// (templates are named, never resolved by id or prefix).
pub fn find_template(st: &Shared, name: &str) -> EngineResult<Option<(String, String)>> {
    match st.db.template_tenant(name)? {
        Some(t) if visible(&t) => Ok(st.db.get_template(name)?),
        _ => Ok(None),
    }
}

/// The pipeline run a caller's key names (id, or an id prefix unique among the
/// runs the current caller may see).
pub fn find_pipeline_run(st: &Shared, key: &str) -> EngineResult<Option<strata_api::PipelineRun>> {
    Ok(st.db.find_pipeline_run(key, scope().as_deref())?)
}

/// The usage record a caller's key names (destroyed sandboxes included),
/// resolved among the records the current caller may see.
pub fn find_usage(st: &Shared, key: &str) -> EngineResult<Option<strata_api::UsageRecord>> {
    Ok(st.db.find_usage(key, scope().as_deref())?)
}

// ---- authentication ----

/// sha256 (hex) of a token secret, as stored.
pub fn secret_hash(secret: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(secret.as_bytes()))
}

/// Why a bearer secret was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenRejection {
    /// No token has this secret.
    #[error("unknown bearer token")]
    Unknown,
    /// The token was revoked.
    #[error("this token was revoked")]
    Revoked,
    /// The token's lifetime is over.
    #[error("this token has expired")]
    Expired,
}

/// Whether a token (as stored) is usable at `now`.
pub fn check_token(t: &TokenInfo, now: SystemTime) -> Result<(), TokenRejection> {
    if t.revoked_at.is_some() {
        return Err(TokenRejection::Revoked);
    }
    if let Some(exp) = &t.expires_at {
        // An unreadable expiry is treated as expired (fail closed).
        match humantime::parse_rfc3339_weak(exp) {
            Ok(at) if at > now => {}
            _ => return Err(TokenRejection::Expired),
        }
    }
    Ok(())
}

/// The tenant caller of a tenant-token secret (looked up now: no cache, so a
/// revoke counts from the next request). Also for other front ends on the TCP
/// listener (e.g. an E2B-compatible API key).
pub fn tenant_caller(st: &Shared, secret: &str) -> Result<Caller, EngineError> {
    let reject = |r: TokenRejection| EngineError::new(ErrorCode::Unauthorized, r.to_string());
    let t = st.db.token_by_hash(&secret_hash(secret))?.ok_or_else(|| reject(TokenRejection::Unknown))?;
    check_token(&t, SystemTime::now()).map_err(reject)?;
    let now_t = SystemTime::now();
    let stale = humantime::format_rfc3339_millis(now_t - TOUCH_EVERY).to_string();
    let now = humantime::format_rfc3339_millis(now_t).to_string();
    if let Err(e) = st.db.touch_token(&t.id, &now, &stale) {
        tracing::warn!(error = %e, token = %t.id, "recording token use");
    }
    Ok(Caller {
        principal: Principal::Tenant { tenant: t.tenant, token_id: t.id, token_name: t.name },
        acting_as: None,
        approval: None,
    })
}

/// The caller a bearer secret names, for every front end on the TCP listener
/// (native API, E2B API keys and access tokens): the holder of the operator's
/// token (`<state>/api-token`, compared in constant time) is the operator, the
/// holder of a tenant token its tenant ([`tenant_caller`]); anything else is
/// `unauthorized`.
pub fn bearer_caller(st: &Shared, operator_token: &str, secret: &str) -> Result<Caller, EngineError> {
    if constant_time_eq(secret.as_bytes(), operator_token.as_bytes()) {
        return Ok(Caller::operator(crate::audit::token_actor(operator_token).0));
    }
    tenant_caller(st, secret)
}

/// Whether two secrets are equal, compared in time that does not depend on
/// where they differ (only on their lengths).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A tenant name: like a sandbox name (letters, digits, `-`, `_`, `.`; at most 63; starts alphanumeric).
pub fn validate_tenant(t: &str) -> Result<(), String> {
    ids::validate_name(t, false).map_err(|_| format!("invalid tenant {t:?}: letters, digits, '-', '_', '.', at most 63 characters, starting with a letter or digit"))
}

// ---- route classification ----

// ---- token management (operator only) ----

/// Creates an API token for a tenant (the caller's own unless `req.tenant`
/// names one); the secret is in the answer only, the store keeps its hash.
pub fn create_token(st: &Shared, req: strata_api::CreateTokenRequest) -> EngineResult<strata_api::CreatedToken> {
    ids::validate_name(&req.name, false).map_err(|_| {
        EngineError::bad_request(format!(
            "invalid token name {:?}: letters, digits, '-', '_', '.', at most 63 characters",
            req.name
        ))
    })?;
    // Tokens are revoked by id or name: a name must not read as an id.
    ids::validate_new_name(&req.name, false)?;
    let tenant = req.tenant.clone().unwrap_or_else(creating_tenant);
    validate_tenant(&tenant).map_err(|e| EngineError::bad_request(format!("tenant: {e}")))?;
    let created = SystemTime::now();
    let expires_at = match &req.expires {
        Some(e) => {
            let d = strata_core::units::parse_duration(e)
                .map_err(|err| EngineError::bad_request(format!("expires: {err}")))?;
            if d.is_zero() {
                return Err(EngineError::bad_request("expires: must be longer than zero"));
            }
            Some(humantime::format_rfc3339_millis(created + d).to_string())
        }
        None => None,
    };
    // Either way 256 random bits in lower-case hex; only the prefix differs.
    let prefix = if req.e2b { strata_api::E2B_SECRET_PREFIX } else { SECRET_PREFIX };
    let secret = format!("{prefix}{}", hex::encode(rand::random::<[u8; 32]>()));
    let token = TokenInfo {
        id: ids::new_id(),
        name: req.name,
        tenant,
        created_at: humantime::format_rfc3339_millis(created).to_string(),
        last_used_at: None,
        expires_at,
        revoked_at: None,
    };
    st.db.insert_token(&token, &secret_hash(&secret)).map_err(|e| match e {
        strata_store::DbError::NameTaken(_) => EngineError::new(
            ErrorCode::NameConflict,
            format!("tenant {:?} already has a live token named {:?}", token.tenant, token.name),
        ),
        e => e.into(),
    })?;
    tracing::info!(token = %token.id, name = %token.name, tenant = %token.tenant, "API token created");
    Ok(strata_api::CreatedToken { token, secret })
}

/// API tokens (never their secrets) of `q.tenant`, or of the caller's tenant, or all.
pub fn list_tokens(st: &Shared, q: &strata_api::TokenQuery) -> EngineResult<Vec<TokenInfo>> {
    let tenant = q.tenant.clone().or_else(scope);
    Ok(st.db.list_tokens(tenant.as_deref(), q.all)?)
}

/// Revokes the token `key` names (id, or a name unique among live tokens;
/// `q.tenant` narrows the lookup): refused from the next request on.
pub fn revoke_token(st: &Shared, key: &str, q: &strata_api::TokenQuery) -> EngineResult<TokenInfo> {
    let tenant = q.tenant.clone().or_else(scope);
    let unknown = || EngineError::new(ErrorCode::TokenNotFound, format!("no token with id or name {key:?}"));
    let found = st.db.find_tokens(key, tenant.as_deref())?;
    let t = match found.as_slice() {
        [] => return Err(unknown()),
        [one] => one,
        many => {
            let tenants: Vec<&str> = many.iter().map(|t| t.tenant.as_str()).collect();
            return Err(EngineError::new(
                ErrorCode::NameConflict,
                format!("tokens named {key:?} exist in tenants {tenants:?}: give the id or the tenant"),
            ));
        }
    };
    let revoked = st.db.revoke_token(&t.id, &crate::clock::now())?.ok_or_else(unknown)?;
    tracing::info!(token = %revoked.id, name = %revoked.name, tenant = %revoked.tenant, "API token revoked");
    Ok(revoked)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(t: &str) -> Caller {
        Caller {
            principal: Principal::Tenant { tenant: t.into(), token_id: "abc".into(), token_name: "ci".into() },
            acting_as: None,
            approval: None,
        }
    }

    #[test]
    fn scopes_of_callers() {
        let op = Caller::operator("uid:0");
        assert_eq!(op.scope(), None);
        assert!(op.sees("a") && op.sees("default"));
        assert_eq!(op.creating_tenant(), "default");
        let acting = Caller { acting_as: Some("a".into()), ..op.clone() };
        assert!(acting.sees("a") && !acting.sees("b"));
        assert_eq!(acting.creating_tenant(), "a");
        assert!(acting.is_operator());
        let t = tenant("b");
        assert!(t.sees("b") && !t.sees("a") && !t.sees("default"));
        assert!(!t.is_operator());
        assert_eq!(t.actor(), "token:abc:ci");
    }

    #[test]
    fn revoked_and_expired_tokens_are_refused() {
        let now = SystemTime::now();
        let fmt = |t: SystemTime| humantime::format_rfc3339_millis(t).to_string();
        let t = TokenInfo {
            id: "1".into(),
            name: "n".into(),
            tenant: "a".into(),
            created_at: fmt(now),
            last_used_at: None,
            expires_at: None,
            revoked_at: None,
        };
        assert_eq!(check_token(&t, now), Ok(()));
        let later = TokenInfo { expires_at: Some(fmt(now + Duration::from_secs(60))), ..t.clone() };
        assert_eq!(check_token(&later, now), Ok(()));
        assert_eq!(check_token(&later, now + Duration::from_secs(61)), Err(TokenRejection::Expired));
        let garbled = TokenInfo { expires_at: Some("soon".into()), ..t.clone() };
        assert_eq!(check_token(&garbled, now), Err(TokenRejection::Expired));
        let revoked = TokenInfo { revoked_at: Some(fmt(now)), ..later };
        assert_eq!(check_token(&revoked, now), Err(TokenRejection::Revoked));
    }

    #[tokio::test]
    async fn the_task_local_caller_follows_spawned_work() {
        assert!(!visible("anything"), "a task with no caller sees nothing");
        assert_eq!(scope(), Some(NO_TENANT.to_string()), "and its listings are empty");
        assert!(!may_read_host_paths());
        as_daemon(async {
            assert!(visible("anything"), "the daemon's own work sees every tenant");
            assert_eq!((scope(), creating_tenant()), (None, "default".to_string()));
            let inner = spawn(async { visible("x") }).await.unwrap();
            assert!(inner, "and its spawned work keeps it");
        })
        .await;
        assert!(!tokio::spawn(async { visible("x") }).await.unwrap(), "a plain spawn carries no caller");
        run_as(tenant("a"), async {
            assert!(visible("a") && !visible("b"));
            assert_eq!(creating_tenant(), "a");
            let inner = spawn(async { (visible("a"), visible("b"), scope()) }).await.unwrap();
            assert_eq!(inner, (true, false, Some("a".to_string())));
        })
        .await;
        run_in_tenant("c", async { assert_eq!((creating_tenant(), visible("d")), ("c".to_string(), false)) }).await;
    }
}
