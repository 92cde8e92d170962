//! Secrets: values injected into a sandbox as files on a tmpfs (and optionally
//! as environment variables), never written into its filesystem layers,
//! checkpoints, standby images, archives or exports. See docs/security.md.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Most secrets one sandbox may hold.
pub const MAX_SECRETS: usize = 64;
/// Largest secret value, in bytes.
pub const MAX_SECRET_BYTES: usize = 64 * 1024;
/// Secrets shorter than this are injected but not redacted from output
/// (replacing every occurrence of a 1–3 byte string would mangle it).
pub const MIN_REDACTED_BYTES: usize = 4;

/// One secret of `POST /v1/sandboxes` (`secrets`). Exactly one of `value_b64`
/// and `host_file` gives the value.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretSpec {
    /// Name: `[A-Za-z_][A-Za-z0-9_]*`, at most 128 characters. The file is
    /// `/run/secrets/<name>`; with `env` also the variable's name.
    pub name: String,
    /// The value, base64-encoded (1 byte to 64 KiB decoded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_b64: Option<String>,
    /// A file on the daemon's host whose content is the value (read once, at creation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_file: Option<String>,
    /// Also set it as an environment variable of every process started
    /// through the API. Such a value lives in process memory, so a sandbox
    /// with env secrets is never put into a process (CRIU) standby: an explicit
    /// standby is refused (409), an automatic one keeps only the filesystem.
    #[serde(default)]
    pub env: bool,
}

impl std::fmt::Debug for SecretSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the value.
        f.debug_struct("SecretSpec")
            .field("name", &self.name)
            .field("host_file", &self.host_file)
            .field("env", &self.env)
            .finish_non_exhaustive()
    }
}

/// A secret as shown on a sandbox: its name, never its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SecretRef {
    /// The secret's name (`/run/secrets/<name>` inside).
    pub name: String,
    /// Whether it is also an environment variable of API processes.
    pub env: bool,
    /// Size of the value in bytes.
    pub bytes: usize,
}

/// Whether `name` is a valid secret name (`[A-Za-z_][A-Za-z0-9_]*`, 1–128 characters).
pub fn valid_secret_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_names_are_identifiers() {
        for ok in ["A", "_x", "API_TOKEN", "t0k3n"] {
            assert!(valid_secret_name(ok), "{ok}");
        }
        for bad in ["", "1A", "a-b", "a b", "../x", "a/b", "é", &"x".repeat(129)] {
            assert!(!valid_secret_name(bad), "{bad}");
        }
    }

    #[test]
    fn debug_never_shows_the_value() {
        let s = SecretSpec { name: "T".into(), value_b64: Some("c2VjcmV0LXZhbHVl".into()), ..Default::default() };
        assert!(!format!("{s:?}").contains("c2VjcmV0"));
    }
}
