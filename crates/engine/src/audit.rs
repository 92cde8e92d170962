//! The audit log's actors ([`Actor`], [`token_actor`]); writing and reading
//! the log is [`crate::audit_log`]'s, the chain lives in the store
//! (`strata_store::db`). What is recorded: every mutating API request (method other than GET, HEAD and
//! OPTIONS), successful or not, is appended to a hash-chained SQLite table in
//! the request path: who (`uid:N` of the Unix-socket peer via SO_PEERCRED,
//! `local` when unknown, `token:<fingerprint>` for the operator's token over
//! TCP, `token:<id>:<name>` for a tenant token) and in which tenant, what (method and
//! route template), the target, the status code and the time. Each entry
//! stores the sha256 of the previous entry's canonical bytes, so editing,
//! removing or reordering entries breaks the chain (`GET /v1/audit/verify`).

/// The caller, as the audit log and recorded overrides name it.
#[derive(Debug, Clone)]
pub struct Actor(pub String);

/// Actor of a TCP caller: a fingerprint of its bearer token (never the token).
pub fn token_actor(token: &str) -> Actor {
    use sha2::Digest;
    Actor(format!("token:{}", &hex::encode(sha2::Sha256::digest(token.as_bytes()))[..12]))
}
