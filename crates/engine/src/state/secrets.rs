//! The secret store: secret values of sandboxes, in memory and under
//! `<state>/secrets/` (0600, never in checkpoints, standby images, forks or
//! archives), and the redaction of their values from outputs. Validating a
//! request's secrets is [`crate::secrets`]'s.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use base64::Engine;
use serde::{Deserialize, Serialize};
use strata_api::{SecretRef, SecretSpec, MIN_REDACTED_BYTES};
use strata_runtime::spec::SecretFile;
use tracing::{info, warn};

use crate::error::EngineError;

/// What replaces a secret value in output, logs and events.
pub const MASK: &[u8] = b"***";

pub(crate) const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    /// A `secrets` entry of a create request is malformed (400).
    #[error("{0}")]
    Invalid(String),
    /// The caller may not use this kind of secret source (403).
    #[error("{0}")]
    Forbidden(String),
    /// The store could not be read or written.
    #[error("secrets store {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A store file does not parse.
    #[error("secrets store {path} is corrupt: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

impl From<SecretsError> for EngineError {
    fn from(e: SecretsError) -> Self {
        match e {
            SecretsError::Invalid(m) => EngineError::bad_request(m),
            SecretsError::Forbidden(m) => EngineError::new(strata_api::ErrorCode::Forbidden, m),
            other => EngineError::internal("secrets", &other),
        }
    }
}

/// One secret with its value.
#[derive(Clone)]
pub struct Secret {
    /// Its name (file name under /run/secrets, and env var name with `env`).
    pub name: String,
    /// The value.
    pub value: Vec<u8>,
    /// Also exposed as an environment variable of API processes.
    pub env: bool,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secret")
            .field("name", &self.name)
            .field("bytes", &self.value.len())
            .field("env", &self.env)
            .finish()
    }
}

/// The secrets of one sandbox (possibly none).
#[derive(Debug, Default)]
pub struct SandboxSecrets {
    items: Vec<Secret>,
    /// Values to redact, longest first.
    patterns: Vec<Vec<u8>>,
}

impl SandboxSecrets {
    /// Wraps validated secrets.
    pub fn new(items: Vec<Secret>) -> Self {
        let mut patterns: Vec<Vec<u8>> =
            items.iter().filter(|s| s.value.len() >= MIN_REDACTED_BYTES).map(|s| s.value.clone()).collect();
        patterns.sort_by_key(|p| std::cmp::Reverse(p.len()));
        patterns.dedup();
        SandboxSecrets { items, patterns }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The secrets as create-request specs with their values (for a pipeline
    /// stage's sandbox; never serialized anywhere else).
    pub fn specs(&self) -> Vec<SecretSpec> {
        self.items
            .iter()
            .map(|s| SecretSpec {
                name: s.name.clone(),
                value_b64: Some(B64.encode(&s.value)),
                host_file: None,
                env: s.env,
            })
            .collect()
    }

    /// Names, env flags and sizes, for the sandbox's record.
    pub fn refs(&self) -> Vec<SecretRef> {
        self.items.iter().map(|s| SecretRef { name: s.name.clone(), env: s.env, bytes: s.value.len() }).collect()
    }

    /// The files the runtime mounts at /run/secrets.
    pub fn files(&self) -> Vec<SecretFile> {
        self.items.iter().map(|s| SecretFile { name: s.name.clone(), data: s.value.clone() }).collect()
    }

    /// Names of the secrets exposed as environment variables.
    pub fn env_names(&self) -> Vec<&str> {
        self.items.iter().filter(|s| s.env).map(|s| s.name.as_str()).collect()
    }

    /// `NAME=value` pairs of the secrets exposed as environment variables
    /// (values that are not UTF-8 are passed lossily).
    pub fn env_vars(&self) -> impl Iterator<Item = (String, String)> + '_ {
        self.items.iter().filter(|s| s.env).map(|s| (s.name.clone(), String::from_utf8_lossy(&s.value).into_owned()))
    }

    /// A streaming redactor of these values (`None` when nothing is to be redacted).
    pub fn redactor(&self) -> Option<Redactor> {
        (!self.patterns.is_empty()).then(|| Redactor { patterns: self.patterns.clone(), pending: Vec::new() })
    }

    /// `s` with every value replaced by `***`.
    pub fn redact_str(&self, s: &str) -> String {
        if self.patterns.is_empty() {
            return s.to_string();
        }
        String::from_utf8_lossy(&redact_all(&self.patterns, s.as_bytes())).into_owned()
    }
}

/// Replaces every occurrence of `patterns` (longest first at each position) in `data`.
pub(crate) fn redact_all(patterns: &[Vec<u8>], data: &[u8]) -> Vec<u8> {
    let mut r = Redactor { patterns: patterns.to_vec(), pending: Vec::new() };
    let mut out = r.feed(data);
    out.extend(r.finish());
    out
}

/// Redacts secret values from a byte stream that arrives in chunks. A value
/// split across chunks is still caught: bytes at the end of a chunk that could
/// be the beginning of a value are held back until the next chunk (or
/// [`Redactor::finish`]) decides. Only such a possible prefix is held, so
/// ordinary output is never delayed.
#[derive(Debug, Clone)]
pub struct Redactor {
    patterns: Vec<Vec<u8>>,
    pending: Vec<u8>,
}

impl Redactor {
    /// Takes the next chunk; returns what can be released now.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<u8> {
        let mut buf = std::mem::take(&mut self.pending);
        buf.extend_from_slice(chunk);
        let (out, rest) = self.scan(&buf, true);
        self.pending = buf[rest..].to_vec();
        out
    }

    /// The stream ended: releases what was held back (redacted).
    pub fn finish(&mut self) -> Vec<u8> {
        let buf = std::mem::take(&mut self.pending);
        self.scan(&buf, false).0
    }

    /// Redacts `buf`; with `hold`, stops at the first position where a value
    /// may begin but the buffer ends first. Returns the output and where the
    /// held-back part starts.
    fn scan(&self, buf: &[u8], hold: bool) -> (Vec<u8>, usize) {
        let mut out = Vec::with_capacity(buf.len());
        let mut i = 0;
        'outer: while i < buf.len() {
            let rest = &buf[i..];
            if hold && self.patterns.iter().any(|p| p.len() > rest.len() && p.starts_with(rest)) {
                return (out, i);
            }
            for p in &self.patterns {
                if rest.starts_with(p) {
                    out.extend_from_slice(MASK);
                    i += p.len();
                    continue 'outer;
                }
            }
            out.push(buf[i]);
            i += 1;
        }
        (out, buf.len())
    }
}

/// The on-disk form of one sandbox's secrets.
#[derive(Serialize, Deserialize)]
pub(crate) struct StoredFile {
    version: u32,
    secrets: Vec<StoredSecret>,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct StoredSecret {
    name: String,
    value_b64: String,
    env: bool,
}

/// Secrets of every sandbox: an in-memory cache over `<state>/secrets/`.
pub struct SecretStore {
    dir: PathBuf,
    cache: Mutex<HashMap<String, Arc<SandboxSecrets>>>,
}

impl SecretStore {
    /// The store under `state_dir`.
    pub fn new(state_dir: &Path) -> Self {
        SecretStore { dir: state_dir.join("secrets"), cache: Mutex::new(HashMap::new()) }
    }

    /// The store's directory (the only place on disk that holds values).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<SandboxSecrets>>> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records the secrets of a new sandbox durably (nothing is written when there are none).
    pub fn put(&self, id: &str, items: Vec<Secret>) -> Result<(), SecretsError> {
        if !items.is_empty() {
            use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
            let io = |source| SecretsError::Io { path: self.dir.clone(), source };
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&self.dir).map_err(io)?;
            std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o700)).map_err(io)?;
            let file = StoredFile {
                version: 1,
                secrets: items
                    .iter()
                    .map(|s| StoredSecret { name: s.name.clone(), value_b64: B64.encode(&s.value), env: s.env })
                    .collect(),
            };
            let path = self.path(id);
            let bytes = serde_json::to_vec(&file).expect("secrets serialize");
            strata_store::fsutil::write_atomic(&path, &bytes, 0o600)
                .map_err(|source| SecretsError::Io { path, source })?;
        }
        self.cache().insert(id.to_string(), Arc::new(SandboxSecrets::new(items)));
        Ok(())
    }

    /// The secrets of a sandbox (empty when it has none), from memory or its file.
    pub fn get(&self, id: &str) -> Result<Arc<SandboxSecrets>, SecretsError> {
        if let Some(s) = self.cache().get(id) {
            return Ok(s.clone());
        }
        let path = self.path(id);
        let loaded = match std::fs::read(&path) {
            Ok(bytes) => {
                let corrupt = |reason: String| SecretsError::Corrupt { path: path.clone(), reason };
                let file: StoredFile = serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
                let items = file
                    .secrets
                    .into_iter()
                    .map(|s| {
                        Ok(Secret {
                            value: B64.decode(&s.value_b64).map_err(|e| corrupt(format!("secret {}: {e}", s.name)))?,
                            name: s.name,
                            env: s.env,
                        })
                    })
                    .collect::<Result<Vec<_>, SecretsError>>()?;
                SandboxSecrets::new(items)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => SandboxSecrets::default(),
            Err(source) => return Err(SecretsError::Io { path, source }),
        };
        let s = Arc::new(loaded);
        self.cache().insert(id.to_string(), s.clone());
        Ok(s)
    }

    /// The secrets of a sandbox, or none when they cannot be read (logged):
    /// for redaction paths that must not fail.
    pub fn get_or_empty(&self, id: &str) -> Arc<SandboxSecrets> {
        self.get(id).unwrap_or_else(|e| {
            warn!(sandbox = id, error = %crate::error::chain(&e), "reading secrets");
            Arc::new(SandboxSecrets::default())
        })
    }

    /// Forgets a destroyed sandbox's secrets (memory and file).
    pub fn remove(&self, id: &str) {
        self.cache().remove(id);
        match std::fs::remove_file(self.path(id)) {
            Ok(()) => info!(sandbox = id, "secrets removed"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => warn!(sandbox = id, error = %e, "removing secrets"),
        }
    }

    /// Removes the files of sandboxes that no longer exist (a crash between a
    /// destroy and its cleanup).
    pub fn sweep(&self, known: &HashSet<String>) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(id) = name.strip_suffix(".json") {
                if !known.contains(id) {
                    self.remove(id);
                }
            }
        }
    }
}
