//! Secrets of sandboxes: validation of `--secret`s, their durable store, and
//! redaction of their values from output, logs and events.
//!
//! * **Where values live.** In the daemon's memory, and in one file per
//!   sandbox, `<state>/secrets/<sandbox id>.json` (directory 0700, file 0600,
//!   written temp + fsync + rename), which exists so that a sandbox can be
//!   started or resumed again after a daemon restart. Nothing else holds them:
//!   not the metadata database (the sandbox row has no secrets column; its
//!   `secrets` are names filled in from this store), not events or the audit
//!   log (names only), not the sandbox's directory (so never in an archive),
//!   not any layer (the runtime writes them to a tmpfs at `/run/secrets` that
//!   is outside the overlay, and CRIU treats it as an external mount).
//!   The file is not encrypted: a key would have to sit next to it, readable
//!   by the same root that can read the file (and the sandbox's memory).
//! * **Redaction.** Values of at least `MIN_REDACTED_BYTES` bytes are
//!   replaced by `***` in process output (as it is buffered, so streamed
//!   output, run-to-completion results and logs all see the redacted bytes),
//!   in the argv of process records, and in event details.

use std::collections::HashSet;
use std::path::Path;

use base64::Engine;
use strata_api::{PipelineRun, PipelineState, SecretSpec, MAX_SECRETS, MAX_SECRET_BYTES};

use crate::error::EngineResult;
use crate::state::Shared;

pub use crate::state::secrets::*;

/// Checks the `secrets` of a create request and reads their values (a
/// `host_file` is read here, on the daemon's host). Every problem is a 400
/// naming the secret.
pub fn validate(specs: &[SecretSpec]) -> Result<Vec<Secret>, SecretsError> {
    if specs.len() > MAX_SECRETS {
        return Err(SecretsError::Invalid(format!("too many secrets: {} (at most {MAX_SECRETS})", specs.len())));
    }
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(specs.len());
    for s in specs {
        if !strata_api::valid_secret_name(&s.name) {
            return Err(SecretsError::Invalid(format!(
                "invalid secret name {:?}: names match [A-Za-z_][A-Za-z0-9_]* (at most 128 characters)",
                s.name
            )));
        }
        if !seen.insert(s.name.as_str()) {
            return Err(SecretsError::Invalid(format!("secret {} is given twice", s.name)));
        }
        let value = match (&s.value_b64, &s.host_file) {
            (Some(b), None) => B64
                .decode(b)
                .map_err(|e| SecretsError::Invalid(format!("secret {}: value_b64 is not base64: {e}", s.name)))?,
            (None, Some(_)) if !crate::tenancy::may_read_host_paths() => {
                return Err(SecretsError::Forbidden(format!("secret {}: host_file reads a file on the daemon's host, which a tenant token may not; send value_b64", s.name)));
            }
            (None, Some(path)) => read_host_file(&s.name, Path::new(path))?,
            _ => {
                return Err(SecretsError::Invalid(format!(
                    "secret {}: give exactly one of value_b64 and host_file",
                    s.name
                )))
            }
        };
        if value.is_empty() {
            return Err(SecretsError::Invalid(format!("secret {} is empty", s.name)));
        }
        if value.len() > MAX_SECRET_BYTES {
            return Err(SecretsError::Invalid(format!(
                "secret {} is {} bytes; at most {MAX_SECRET_BYTES}",
                s.name,
                value.len()
            )));
        }
        if s.env && value.contains(&0) {
            return Err(SecretsError::Invalid(format!(
                "secret {} contains a NUL byte and cannot be an environment variable",
                s.name
            )));
        }
        out.push(Secret { name: s.name.clone(), value, env: s.env });
    }
    Ok(out)
}

fn read_host_file(name: &str, path: &Path) -> Result<Vec<u8>, SecretsError> {
    use std::io::Read;
    if !path.is_absolute() {
        return Err(SecretsError::Invalid(format!(
            "secret {name}: host_file {} must be an absolute path",
            path.display()
        )));
    }
    let f = std::fs::File::open(path)
        .map_err(|e| SecretsError::Invalid(format!("secret {name}: cannot read host_file {}: {e}", path.display())))?;
    let mut value = Vec::new();
    f.take(MAX_SECRET_BYTES as u64 + 1)
        .read_to_end(&mut value)
        .map_err(|e| SecretsError::Invalid(format!("secret {name}: reading {}: {e}", path.display())))?;
    Ok(value)
}

// ---- secrets of pipeline stages (kept in the store between stages) ----

/// The store key of stage `idx`'s secrets in pipeline run `run_id`.
pub(crate) fn secret_key(run_id: &str, idx: usize) -> String {
    format!("pipeline-{run_id}-{idx}")
}

/// Store keys of a run's stage secrets (stages without secrets have none).
pub(crate) fn secret_keys(run: &PipelineRun) -> impl Iterator<Item = String> + '_ {
    run.spec.stages.iter().enumerate().filter(|(_, s)| !s.secrets.is_empty()).map(|(i, _)| secret_key(&run.id, i))
}

/// Store keys of the secrets of runs that may still run a stage (not succeeded),
/// which the daemon's startup sweep keeps.
pub fn live_secret_keys(st: &Shared) -> EngineResult<HashSet<String>> {
    let mut keys = HashSet::new();
    for id in st.db.list_pipeline_run_ids()? {
        let Some(run) = st.db.pipeline_run_by_id(&id)? else { continue };
        if run.state != PipelineState::Succeeded {
            keys.extend(secret_keys(&run));
        }
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_api::SecretRef;

    fn secrets(values: &[&str]) -> SandboxSecrets {
        SandboxSecrets::new(
            values
                .iter()
                .enumerate()
                .map(|(i, v)| Secret { name: format!("S{i}"), value: v.as_bytes().to_vec(), env: false })
                .collect(),
        )
    }

    fn stream(s: &SandboxSecrets, chunks: &[&str]) -> String {
        let mut r = s.redactor().unwrap();
        let mut out = Vec::new();
        for c in chunks {
            out.extend(r.feed(c.as_bytes()));
        }
        out.extend(r.finish());
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn values_are_masked_whole_and_short_ones_are_left() {
        let s = secrets(&["hunter22", "abc"]);
        assert_eq!(s.redact_str("pw=hunter22; x=abc; hunter2"), "pw=***; x=abc; hunter2");
        assert!(secrets(&["abc"]).redactor().is_none());
    }

    #[test]
    fn values_split_across_chunks_are_caught_at_every_split() {
        let s = secrets(&["s3cr3t-value", "other-token"]);
        let text = "a s3cr3t-value b other-token c s3cr3t-valu";
        let expected = "a *** b *** c s3cr3t-valu";
        for cut in 0..=text.len() {
            assert_eq!(stream(&s, &[&text[..cut], &text[cut..]]), expected, "cut at {cut}");
        }
        let bytes: Vec<String> = text.chars().map(|c| c.to_string()).collect();
        let one_by_one: Vec<&str> = bytes.iter().map(String::as_str).collect();
        assert_eq!(stream(&s, &one_by_one), expected);
    }

    #[test]
    fn only_a_possible_prefix_is_held_back() {
        let s = secrets(&["XYZW-secret"]);
        let mut r = s.redactor().unwrap();
        assert_eq!(r.feed(b"hello\n"), b"hello\n");
        assert_eq!(r.feed(b"tail XYZ"), b"tail ");
        assert_eq!(r.feed(b"Q"), b"XYZQ");
        assert_eq!(r.feed(b"XYZW-sec"), b"");
        assert_eq!(r.finish(), b"XYZW-sec");
    }

    #[test]
    fn a_longer_value_wins_over_its_prefix() {
        let s = secrets(&["abcd", "abcdefgh"]);
        assert_eq!(stream(&s, &["xabcdef", "gh abcd!"]), "x*** ***!");
    }

    #[test]
    fn validation_names_the_problem() {
        let spec = |name: &str, v: Option<&str>| SecretSpec {
            name: name.into(),
            value_b64: v.map(|v| B64.encode(v)),
            ..Default::default()
        };
        assert!(validate(&[spec("OK", Some("value"))]).is_ok());
        let err = |specs: &[SecretSpec]| validate(specs).unwrap_err().to_string();
        assert!(err(&[spec("bad-name", Some("v"))]).contains("invalid secret name"));
        assert!(err(&[spec("A", Some("v")), spec("A", Some("w"))]).contains("twice"));
        assert!(err(&[spec("A", None)]).contains("exactly one"));
        assert!(err(&[spec("A", Some(""))]).contains("empty"));
        let big = "x".repeat(MAX_SECRET_BYTES + 1);
        assert!(err(&[spec("A", Some(&big))]).contains("at most"));
        let many: Vec<SecretSpec> = (0..=MAX_SECRETS).map(|i| spec(&format!("S{i}"), Some("v"))).collect();
        assert!(err(&many).contains("too many"));
        let missing =
            SecretSpec { name: "F".into(), host_file: Some("/nonexistent/secret".into()), ..Default::default() };
        // Host files are the operator's (and the daemon's); a task with no caller may not read them.
        assert!(err(std::slice::from_ref(&missing)).contains("may not"));
        let as_daemon = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(crate::tenancy::as_daemon(async { validate(&[missing]).unwrap_err().to_string() }));
        assert!(as_daemon.contains("cannot read host_file"), "{as_daemon}");
    }

    #[test]
    fn the_store_keeps_values_in_one_private_file() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let store = SecretStore::new(d.path());
        store.put("sb1", vec![Secret { name: "T".into(), value: b"tok-123456".to_vec(), env: true }]).unwrap();
        let mode = std::fs::metadata(store.dir().join("sb1.json")).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(std::fs::metadata(store.dir()).unwrap().permissions().mode() & 0o777, 0o700);
        // A fresh store (a restarted daemon) reads it back.
        let again = SecretStore::new(d.path());
        let s = again.get("sb1").unwrap();
        assert_eq!(s.refs(), vec![SecretRef { name: "T".into(), env: true, bytes: 10 }]);
        assert_eq!(s.env_vars().collect::<Vec<_>>(), vec![("T".to_string(), "tok-123456".to_string())]);
        assert!(again.get("other").unwrap().is_empty());
        again.sweep(&HashSet::new());
        assert!(!store.dir().join("sb1.json").exists());
    }
}
