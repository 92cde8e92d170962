//! The content-addressed layer store.
//!
//! Layout under the store root:
//!
//! ```text
//! sha256/<hex>/fs          unpacked layer tree (an overlayfs lower directory)
//! sha256/<hex>/layer.json  {"digest": "sha256:<hex>", "size": N}  (written before the rename)
//! staging/<random>/        a layer being unpacked; never referenced by anything
//! ```
//!
//! A layer becomes visible only by the atomic rename of its finished staging
//! directory to `sha256/<hex>`, so a crash mid-import leaves only staging
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
    let hex = digest
        .strip_prefix("sha256:")
        .ok_or_else(|| LayerStoreError::InvalidDigest(digest.to_string()))?;
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

    /// Directory of a committed layer (`sha256/<hex>`).
    pub fn layer_dir(&self, digest: &str) -> Result<PathBuf, LayerStoreError> {
        Ok(self.root.join("sha256").join(digest_hex(digest)?))
    }

    /// The unpacked tree of a committed layer, used as an overlay lower directory.
    pub fn fs_dir(&self, digest: &str) -> Result<PathBuf, LayerStoreError> {
        Ok(self.layer_dir(digest)?.join("fs"))
    }

    /// Whether a layer is stored.
    pub fn contains(&self, digest: &str) -> bool {
        self.layer_dir(digest).map(|d| d.join("layer.json").is_file()).unwrap_or(false)
    }

    /// Reads a committed layer's metadata.
    pub fn meta(&self, digest: &str) -> Result<LayerMeta, LayerStoreError> {
        let p = self.layer_dir(digest)?.join("layer.json");
        let bytes = fs::read(&p).map_err(io_err(&p))?;
        serde_json::from_slice(&bytes).map_err(|e| LayerStoreError::Io {
            path: p,
            source: io::Error::new(io::ErrorKind::InvalidData, e),
        })
    }

    /// Starts a new layer: an empty staging directory with an `fs/` subdirectory.
    pub fn stage(&self) -> Result<StagedLayer, LayerStoreError> {
        let dir = self.root.join("staging").join(format!("{:016x}", rand::random::<u64>()));
        let fs_dir = dir.join("fs");
        fs::create_dir_all(&fs_dir).map_err(io_err(&fs_dir))?;
        Ok(StagedLayer { dir })
    }

    /// Commits a staged layer under `digest`. Returns `true` when the layer is
    /// new, `false` when an identical layer was already stored (the staged copy
    /// is then discarded).
    pub fn commit(&self, staged: StagedLayer, digest: &str, size: u64) -> Result<bool, LayerStoreError> {
        let final_dir = self.layer_dir(digest)?;
        if self.contains(digest) {
            return Ok(false); // `staged` is removed by Drop.
        }
        let meta = LayerMeta { digest: digest.to_string(), size };
        let meta_path = staged.dir.join("layer.json");
        let json = serde_json::to_vec(&meta).expect("LayerMeta serializes");
        fsutil::write_atomic(&meta_path, &json, 0o644).map_err(io_err(&meta_path))?;
        // A leftover directory without layer.json is an interrupted removal: clear it.
        fsutil::remove_dir_all_if_exists(&final_dir).map_err(io_err(&final_dir))?;
        fs::rename(&staged.dir, &final_dir).map_err(io_err(&final_dir))?;
        let parent = self.root.join("sha256");
        fsutil::fsync_dir(&parent).map_err(io_err(&parent))?;
        std::mem::forget(staged);
        Ok(true)
    }

    /// Removes a layer. Removing `layer.json` first makes a crash mid-removal
    /// leave a directory that [`LayerStore::contains`] no longer reports.
    pub fn remove(&self, digest: &str) -> Result<(), LayerStoreError> {
        let dir = self.layer_dir(digest)?;
        match fs::remove_file(dir.join("layer.json")) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_err(&dir)(e)),
            _ => {}
        }
        fsutil::remove_dir_all_if_exists(&dir).map_err(io_err(&dir))
    }

    /// Digests of every committed layer.
    pub fn list(&self) -> Result<Vec<String>, LayerStoreError> {
        let dir = self.root.join("sha256");
        let mut out = Vec::new();
        for entry in fs::read_dir(&dir).map_err(io_err(&dir))? {
            let entry = entry.map_err(io_err(&dir))?;
            let digest = format!("sha256:{}", entry.file_name().to_string_lossy());
            if self.contains(&digest) {
                out.push(digest);
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
        assert!(store.commit(s, D, 1).unwrap());
        let s2 = store.stage().unwrap();
        let staged_dir = s2.dir.clone();
        assert!(!store.commit(s2, D, 1).unwrap());
        assert!(!staged_dir.exists());
        assert_eq!(store.list().unwrap(), vec![D.to_string()]);
        assert_eq!(store.meta(D).unwrap().size, 1);
        store.remove(D).unwrap();
        assert!(!store.contains(D));
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
