//! Per-sandbox envd access tokens and signed file URLs, as E2B's envd takes them.
//!
//! A sandbox's `envdAccessToken` is derived, not stored: HMAC-SHA256 of its id
//! under the daemon's secret (`<state>/api-token`), so any request can be
//! checked against it and nothing is kept. It opens that sandbox's envd
//! (commands, files, its ports) as the sandbox's tenant and signs its file
//! URLs; the control plane does not take it, and it is not an API key. A new
//! daemon secret makes new tokens (`Sandbox.connect` hands out the current one).
//!
//! A signed URL (`download_url`/`upload_url` of the SDKs) carries
//! `signature=v1_<base64 of SHA-256 of path:operation:username:token[:expiration]>`
//! and optionally `signature_expiration` (Unix seconds): envd's formula, so
//! the SDKs' own signatures are checked as they are.

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use strata_engine::tenancy::constant_time_eq;

/// The envd access token of `sandbox_id` under the daemon's `secret`.
pub fn envd_token(secret: &str, sandbox_id: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key length");
    mac.update(b"strata e2b envd access token\n");
    mac.update(sandbox_id.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// Whether `given` is `sandbox_id`'s token (compared in constant time).
pub fn is_envd_token(secret: &str, sandbox_id: &str, given: &str) -> bool {
    constant_time_eq(envd_token(secret, sandbox_id).as_bytes(), given.as_bytes())
}

/// The signature of a template build's files upload URL (`PUT
/// /e2b/template-files/{tenant}/{hash}?expires=`), hex HMAC-SHA256 under the
/// daemon's secret: the URL is the credential, as an object store's
/// presigned URL is.
pub fn files_upload_signature(secret: &str, tenant: &str, hash: &str, expires: u64) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key length");
    mac.update(format!("strata e2b template files upload\n{tenant}\n{hash}\n{expires}").as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// Whether `given` is the files upload signature of `tenant`, `hash`, `expires` (constant time).
pub fn is_files_upload_signature(secret: &str, tenant: &str, hash: &str, expires: u64, given: &str) -> bool {
    constant_time_eq(files_upload_signature(secret, tenant, hash, expires).as_bytes(), given.as_bytes())
}

/// Now, in Unix seconds (what signature expiries are compared with).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// What a file URL is signed for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// `GET /files`.
    Read,
    /// `POST /files`.
    Write,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Read => "read",
            Operation::Write => "write",
        }
    }
}

/// The signature of a file URL (E2B's `v1` formula).
pub fn file_signature(path: &str, op: Operation, username: &str, token: &str, expiration: Option<i64>) -> String {
    let mut raw = format!("{path}:{}:{username}:{token}", op.as_str());
    if let Some(exp) = expiration {
        raw.push_str(&format!(":{exp}"));
    }
    let digest = Sha256::digest(raw.as_bytes());
    format!("v1_{}", base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest))
}

/// Why a signed request is refused (envd's messages; each a 401).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// No signature, and no access token either.
    #[error("missing signature query parameter")]
    Missing,
    /// The signature is not the one for this path, operation, user and expiry.
    #[error("invalid signature")]
    Invalid,
    /// It was right, until its expiration.
    #[error("signature is already expired")]
    Expired,
}

/// The query of a signed request.
pub struct Signed<'a> {
    /// `path`, as sent.
    pub path: &'a str,
    /// `username`, as sent (`""` when absent).
    pub username: &'a str,
    /// `signature`.
    pub signature: Option<&'a str>,
    /// `signature_expiration`.
    pub expiration: Option<i64>,
}

/// Checks a signed request against the sandbox's `token` at `now` (Unix
/// seconds): the signature first, then its expiry, as envd does.
pub fn check_signature(q: &Signed<'_>, op: Operation, token: &str, now: i64) -> Result<(), SignatureError> {
    let given = q.signature.ok_or(SignatureError::Missing)?;
    let want = file_signature(q.path, op, q.username, token, q.expiration);
    if !constant_time_eq(want.as_bytes(), given.as_bytes()) {
        return Err(SignatureError::Invalid);
    }
    match q.expiration {
        Some(exp) if exp < now => Err(SignatureError::Expired),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_per_sandbox_and_per_secret() {
        let a = envd_token("secret", "0123456789abcdef");
        assert_eq!(a.len(), 64);
        assert_eq!(a, envd_token("secret", "0123456789abcdef"));
        assert_ne!(a, envd_token("secret", "0123456789abcdee"));
        assert_ne!(a, envd_token("other", "0123456789abcdef"));
        assert!(is_envd_token("secret", "0123456789abcdef", &a));
        assert!(!is_envd_token("secret", "0123456789abcdef", &a[..63]));
    }

    #[test]
    fn signatures_follow_the_sdks_formula_and_expire() {
        // The Python SDK's own: "v1_" + base64(sha256("path:read:user:tok")) without padding.
        let raw = "/home/user/a.txt:read:user:tok";
        let want = format!("v1_{}", base64::engine::general_purpose::STANDARD_NO_PAD.encode(Sha256::digest(raw)));
        assert_eq!(file_signature("/home/user/a.txt", Operation::Read, "user", "tok", None), want);
        let sig = file_signature("/a", Operation::Write, "", "tok", Some(100));
        let q = |s: Option<&'static str>, exp| Signed { path: "/a", username: "", signature: s, expiration: exp };
        let leaked: &'static str = Box::leak(sig.into_boxed_str());
        assert_eq!(check_signature(&q(Some(leaked), Some(100)), Operation::Write, "tok", 99), Ok(()));
        assert_eq!(
            check_signature(&q(Some(leaked), Some(100)), Operation::Write, "tok", 101),
            Err(SignatureError::Expired)
        );
        assert_eq!(
            check_signature(&q(Some(leaked), Some(100)), Operation::Read, "tok", 99),
            Err(SignatureError::Invalid)
        );
        assert_eq!(
            check_signature(&q(Some(leaked), Some(101)), Operation::Write, "tok", 99),
            Err(SignatureError::Invalid)
        );
        assert_eq!(check_signature(&q(None, None), Operation::Write, "tok", 99), Err(SignatureError::Missing));
    }
}
