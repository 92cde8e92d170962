//! The archive store: where archived sandboxes go, an [`object_store`] (a
//! local directory by default, an S3-compatible bucket with the `s3`
//! feature). Archiving and unarchiving are [`crate::archive`]'s.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use object_store::ObjectStore;

pub(crate) const SCHEME_HINT: &str = if cfg!(feature = "s3") {
    " or s3://bucket/prefix"
} else {
    " (this build has no S3 support: build with --features strata-engine/s3)"
};

/// Errors configuring the archive store.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveStoreError {
    /// The URL names a scheme this build cannot use.
    #[error("archive URL {0:?}: use file:///path{hint}", hint = SCHEME_HINT)]
    Scheme(String),
    /// The store could not be set up.
    #[error("archive store {url}: {source}")]
    Store {
        /// The configured URL.
        url: String,
        /// The cause.
        #[source]
        source: object_store::Error,
    },
    /// The local directory could not be created.
    #[error("archive directory {0}: {1}")]
    Dir(PathBuf, std::io::Error),
}

/// Where archives go.
#[derive(Clone)]
pub struct ArchiveStore {
    pub(crate) store: Arc<dyn ObjectStore>,
    /// Human-readable location (`file:///...`, `s3://...`).
    pub url: String,
}

impl std::fmt::Debug for ArchiveStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArchiveStore").field("url", &self.url).finish()
    }
}

impl ArchiveStore {
    /// A store on a local directory (created).
    pub fn local(dir: &Path) -> Result<Self, ArchiveStoreError> {
        std::fs::create_dir_all(dir).map_err(|e| ArchiveStoreError::Dir(dir.to_path_buf(), e))?;
        let url = format!("file://{}", dir.display());
        let store = object_store::local::LocalFileSystem::new_with_prefix(dir)
            .map_err(|source| ArchiveStoreError::Store { url: url.clone(), source })?;
        Ok(ArchiveStore { store: Arc::new(store), url })
    }

    /// The store a URL names: `file:///path`, or `s3://bucket[/prefix]` (with the
    /// `s3` feature; credentials and endpoint from the usual AWS_* variables).
    pub fn from_url(url: &str) -> Result<Self, ArchiveStoreError> {
        if let Some(p) = url.strip_prefix("file://") {
            return Self::local(Path::new(p));
        }
        #[cfg(feature = "s3")]
        if let Some(rest) = url.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            let s3 = object_store::aws::AmazonS3Builder::from_env()
                .with_bucket_name(bucket)
                .build()
                .map_err(|source| ArchiveStoreError::Store { url: url.to_string(), source })?;
            let store: Arc<dyn ObjectStore> = if prefix.is_empty() {
                Arc::new(s3)
            } else {
                Arc::new(object_store::prefix::PrefixStore::new(s3, prefix))
            };
            return Ok(ArchiveStore { store, url: url.to_string() });
        }
        Err(ArchiveStoreError::Scheme(url.to_string()))
    }
}
