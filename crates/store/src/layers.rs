//! The content-addressed layer store.
//!
//! Layout under the store root:
//!
//! ```text
//! sha256/<hex>+<policy>/fs          unpacked layer tree (an overlayfs lower directory)
//! sha256/<hex>+<policy>/layer.json  {"digest": "sha256:<hex>", "size": N, "policy": "<policy>"}  (written before the rename)
//! sha256/<hex>/                     a layer committed before unpack policies were recorded (legacy)
//! staging/<random>/                 a layer being unpacked; never referenced by anything
//! ```
//!
//! A layer is keyed by the digest of its tar (the OCI diff id) *and* the
//! [`UnpackPolicy`] it was unpacked with ([`layer_key`]: `sha256:<hex>+trusted`
//! or `sha256:<hex>+untrusted`), because the same bytes unpack differently:
//! an untrusted unpack strips setuid/setgid bits and `security.capability`,
//! a trusted one keeps them. So an untrusted import of bytes first imported
//! trusted never reuses the trusted tree (nor the other way round: a trusted
//! import keeps what `--trusted` asks for). Layers stored before policies
//! were recorded keep their plain `sha256:<hex>` key and keep working for what
//! references them, but their policy is unknown, so no new commit ever reuses
//! one (an import of the same bytes unpacks them again under its own key).
//!
//! A layer becomes visible only by the atomic rename of its finished staging
//! directory to `sha256/<key>`, so a crash mid-import leaves only staging
//! garbage, which [`LayerStore::open`] removes.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::fsutil;

/// Errors of the layer store.
#[derive(Debug, thiserror::Error)]
pub enum LayerStoreError {
    /// A digest string is not `sha256:<64 hex>`.
    #[error("invalid layer digest {0:?}")]
    InvalidDigest(String),
    /// An I/O error on a path.
    #[error("layer store I/O on {path}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> LayerStoreError + '_ {
    move |source| LayerStoreError::Io { path: path.to_path_buf(), source }
}

/// Metadata stored next to each layer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LayerMeta {
    /// `sha256:<hex>` of the uncompressed layer tar.
    pub digest: String,
    /// Unpacked bytes.
    pub size: u64,
    /// How the tar was unpacked; absent in layers stored before policies were recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<UnpackPolicy>,
}

/// How a layer's tar was unpacked: part of the layer's key, so that two
/// unpacks of the same bytes that differ on disk are never shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnpackPolicy {
    /// setuid/setgid bits and `security.capability` stripped (the default for imports).
    Untrusted,
    /// Modes and file capabilities kept (`--trusted` imports; checkpoint layers,
    /// which hold the sandbox's own files as they are).
    Trusted,
}

impl UnpackPolicy {
    /// The policy of an unpack that keeps (`true`) or strips privileges.
    pub fn of(trusted: bool) -> Self {
        if trusted {
            UnpackPolicy::Trusted
        } else {
            UnpackPolicy::Untrusted
        }
    }

    /// Its name in layer keys and `layer.json`.
    pub fn as_str(self) -> &'static str {
        match self {
            UnpackPolicy::Untrusted => "untrusted",
            UnpackPolicy::Trusted => "trusted",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [UnpackPolicy::Untrusted, UnpackPolicy::Trusted].into_iter().find(|p| p.as_str() == s)
    }
}

/// The key of a layer in the store: its diff id and its unpack policy,
/// `sha256:<hex>+<policy>`.
pub fn layer_key(diff_id: &str, policy: UnpackPolicy) -> Result<String, LayerStoreError> {
    Ok(format!("sha256:{}+{}", digest_hex(diff_id)?, policy.as_str()))
}

/// The parts of a layer key: the diff id's hex and the unpack policy (`None`
/// for a key from before policies were recorded, `sha256:<hex>`).
pub fn parse_key(key: &str) -> Result<(&str, Option<UnpackPolicy>), LayerStoreError> {
    let invalid = || LayerStoreError::InvalidDigest(key.to_string());
    match key.split_once('+') {
        None => Ok((digest_hex(key)?, None)),
        Some((digest, policy)) => {
            Ok((digest_hex(digest).map_err(|_| invalid())?, Some(UnpackPolicy::parse(policy).ok_or_else(invalid)?)))
        }
    }
}

/// A layer being unpacked; commit it with [`LayerStore::commit`].
#[derive(Debug)]
pub struct StagedLayer {
    dir: PathBuf,
}

impl StagedLayer {
    /// The directory to unpack the layer's files into.
    pub fn fs_dir(&self) -> PathBuf {
        self.dir.join("fs")
    }
}

impl Drop for StagedLayer {
    fn drop(&mut self) {
        // Only reached for staged layers that were never committed.
        let _ = fsutil::remove_dir_all_if_exists(&self.dir);
    }
}

/// Handle on the layer store directory.
#[derive(Debug, Clone)]
pub struct LayerStore {
    root: PathBuf,
}

/// Validates a `sha256:<hex>` digest and returns the hex part.
pub fn digest_hex(digest: &str) -> Result<&str, LayerStoreError> {
    let hex = digest.strip_prefix("sha256:").ok_or_else(|| LayerStoreError::InvalidDigest(digest.to_string()))?;
    if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err(LayerStoreError::InvalidDigest(digest.to_string()));
    }
    Ok(hex)
}

impl LayerStore {
    /// Opens (creating if needed) the store at `root` and clears stale staging directories.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, LayerStoreError> {
        let root = root.into();
        for sub in ["sha256", "staging"] {
            let p = root.join(sub);
            fs::create_dir_all(&p).map_err(io_err(&p))?;
        }
        let staging = root.join("staging");
        for entry in fs::read_dir(&staging).map_err(io_err(&staging))? {
            let entry = entry.map_err(io_err(&staging))?;
            let p = entry.path();
            fsutil::remove_dir_all_if_exists(&p).map_err(io_err(&p))?;
        }
        Ok(LayerStore { root })
    }

    /// The store root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Directory of a committed layer (`sha256/<hex>+<policy>`, or
    /// `sha256/<hex>` for a legacy key), by its key ([`layer_key`]).
    pub fn layer_dir(&self, key: &str) -> Result<PathBuf, LayerStoreError> {
        let (hex, policy) = parse_key(key)?;
        let name = match policy {
            Some(p) => format!("{hex}+{}", p.as_str()),
            None => hex.to_string(),
        };
        Ok(self.root.join("sha256").join(name))
    }

    /// The unpacked tree of a committed layer, used as an overlay lower directory.
    pub fn fs_dir(&self, key: &str) -> Result<PathBuf, LayerStoreError> {
        Ok(self.layer_dir(key)?.join("fs"))
    }

    /// Whether a layer is stored.
    pub fn contains(&self, key: &str) -> bool {
        self.layer_dir(key).map(|d| d.join("layer.json").is_file()).unwrap_or(false)
    }

    /// Reads a committed layer's metadata.
    pub fn meta(&self, key: &str) -> Result<LayerMeta, LayerStoreError> {
        let p = self.layer_dir(key)?.join("layer.json");
        let bytes = fs::read(&p).map_err(io_err(&p))?;
        serde_json::from_slice(&bytes)
            .map_err(|e| LayerStoreError::Io { path: p, source: io::Error::new(io::ErrorKind::InvalidData, e) })
    }

    /// Starts a new layer: an empty staging directory with an `fs/` subdirectory.
    pub fn stage(&self) -> Result<StagedLayer, LayerStoreError> {
        let dir = self.root.join("staging").join(format!("{:016x}", rand::random::<u64>()));
        let fs_dir = dir.join("fs");
        fs::create_dir_all(&fs_dir).map_err(io_err(&fs_dir))?;
        Ok(StagedLayer { dir })
    }

    /// Commits a staged layer, unpacked from the tar `diff_id` with `policy`,
    /// under its key ([`layer_key`]), which it returns with `true` when the
    /// layer is new, `false` when a layer of the same bytes *and* policy was
    /// already stored (the staged copy is then discarded). Never shares a layer
    /// with another policy's, nor with a legacy layer of unknown policy.
    pub fn commit(
        &self,
        staged: StagedLayer,
        diff_id: &str,
        policy: UnpackPolicy,
        size: u64,
    ) -> Result<(String, bool), LayerStoreError> {
        let key = layer_key(diff_id, policy)?;
        let final_dir = self.layer_dir(&key)?;
        if self.contains(&key) {
            return Ok((key, false)); // `staged` is removed by Drop.
        }
        let meta = LayerMeta { digest: diff_id.to_string(), size, policy: Some(policy) };
        let meta_path = staged.dir.join("layer.json");
        let json = serde_json::to_vec(&meta).expect("LayerMeta serializes");
        fsutil::write_atomic(&meta_path, &json, 0o644).map_err(io_err(&meta_path))?;
        // A leftover directory without layer.json is an interrupted removal: clear it.
        fsutil::remove_dir_all_if_exists(&final_dir).map_err(io_err(&final_dir))?;
        fs::rename(&staged.dir, &final_dir).map_err(io_err(&final_dir))?;
        let parent = self.root.join("sha256");
        fsutil::fsync_dir(&parent).map_err(io_err(&parent))?;
        std::mem::forget(staged);
        Ok((key, true))
    }

    /// Removes a layer (by key). Removing `layer.json` first makes a crash mid-removal
    /// leave a directory that [`LayerStore::contains`] no longer reports.
    pub fn remove(&self, key: &str) -> Result<(), LayerStoreError> {
        let dir = self.layer_dir(key)?;
        match fs::remove_file(dir.join("layer.json")) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_err(&dir)(e)),
            _ => {}
        }
        fsutil::remove_dir_all_if_exists(&dir).map_err(io_err(&dir))
    }

    /// Keys of every committed layer (legacy ones included).
    pub fn list(&self) -> Result<Vec<String>, LayerStoreError> {
        let dir = self.root.join("sha256");
        let mut out = Vec::new();
        for entry in fs::read_dir(&dir).map_err(io_err(&dir))? {
            let entry = entry.map_err(io_err(&dir))?;
            let key = format!("sha256:{}", entry.file_name().to_string_lossy());
            if self.contains(&key) {
                out.push(key);
            }
        }
        out.sort();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000001";

    #[test]
    fn commit_is_deduplicated_and_staging_is_cleaned() {
        let dir = tempfile::tempdir().unwrap();
        let store = LayerStore::open(dir.path()).unwrap();
        let s = store.stage().unwrap();
        fs::write(s.fs_dir().join("a"), b"x").unwrap();
        let (key, new) = store.commit(s, D, UnpackPolicy::Untrusted, 1).unwrap();
        assert!(new);
        assert_eq!(key, format!("{D}+untrusted"));
        let s2 = store.stage().unwrap();
        let staged_dir = s2.dir.clone();
        assert_eq!(store.commit(s2, D, UnpackPolicy::Untrusted, 1).unwrap(), (key.clone(), false));
        assert!(!staged_dir.exists());
        assert_eq!(store.list().unwrap(), vec![key.clone()]);
        let meta = store.meta(&key).unwrap();
        assert_eq!((meta.digest.as_str(), meta.size, meta.policy), (D, 1, Some(UnpackPolicy::Untrusted)));
        store.remove(&key).unwrap();
        assert!(!store.contains(&key));
    }

    #[test]
    fn layers_are_keyed_by_digest_and_unpack_policy() {
        let dir = tempfile::tempdir().unwrap();
        let store = LayerStore::open(dir.path()).unwrap();
        let put = |policy: UnpackPolicy, content: &[u8]| {
            let s = store.stage().unwrap();
            fs::write(s.fs_dir().join("f"), content).unwrap();
            store.commit(s, D, policy, 1).unwrap()
        };
        // A legacy layer (committed before policies were recorded) under the plain digest.
        let legacy = dir.path().join("sha256").join(&D["sha256:".len()..]);
        fs::create_dir_all(legacy.join("fs")).unwrap();
        fs::write(legacy.join("fs/f"), b"legacy").unwrap();
        fs::write(
            legacy.join("layer.json"),
            br#"{"digest":"sha256:0000000000000000000000000000000000000000000000000000000000000001","size":1}"#,
        )
        .unwrap();
        assert!(store.contains(D) && store.meta(D).unwrap().policy.is_none());
        // Neither policy reuses the legacy layer, nor the other policy's.
        let (trusted, new_t) = put(UnpackPolicy::Trusted, b"trusted");
        let (untrusted, new_u) = put(UnpackPolicy::Untrusted, b"untrusted");
        assert!(new_t && new_u);
        assert_eq!(trusted, format!("{D}+trusted"));
        assert_ne!(store.fs_dir(&trusted).unwrap(), store.fs_dir(&untrusted).unwrap());
        assert_eq!(fs::read(store.fs_dir(&trusted).unwrap().join("f")).unwrap(), b"trusted");
        assert_eq!(fs::read(store.fs_dir(&untrusted).unwrap().join("f")).unwrap(), b"untrusted");
        assert_eq!(
            fs::read(store.fs_dir(D).unwrap().join("f")).unwrap(),
            b"legacy",
            "the legacy layer keeps its key and content"
        );
        let mut all = store.list().unwrap();
        all.sort();
        assert_eq!(all, vec![D.to_string(), trusted.clone(), untrusted.clone()]);
        // Removing one leaves the others.
        store.remove(&trusted).unwrap();
        assert!(!store.contains(&trusted) && store.contains(&untrusted) && store.contains(D));
        assert_eq!(parse_key(&untrusted).unwrap(), (&D["sha256:".len()..], Some(UnpackPolicy::Untrusted)));
        assert!(parse_key(&format!("{D}+maybe")).is_err());
        assert!(parse_key("sha256:../x+trusted").is_err());
    }

    #[test]
    fn rejects_bad_digests() {
        assert!(digest_hex("sha256:../../etc").is_err());
        assert!(digest_hex("md5:00").is_err());
    }

    #[test]
    fn uncommitted_staging_is_removed_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let store = LayerStore::open(dir.path()).unwrap();
        let s = store.stage().unwrap();
        let p = s.dir.clone();
        std::mem::forget(s); // simulate a crash
        assert!(p.exists());
        LayerStore::open(dir.path()).unwrap();
        assert!(!p.exists());
    }
}
