//! The crate's error type.

use std::io;
use std::path::PathBuf;

use strata_store::LayerStoreError;

/// Everything that can go wrong while importing an image.
///
/// [`ImageError::is_invalid_input`] separates the caller's fault (a hostile,
/// malformed or unsupported source: HTTP 400 `invalid_archive`) from ours
/// (I/O on the layer store and the like: HTTP 500).
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The source is none of the supported kinds, or an unsupported flavour of one.
    #[error("unsupported image source {path}: {reason}")]
    UnsupportedSource {
        /// The source path.
        path: PathBuf,
        /// Why it is not supported.
        reason: String,
    },
    /// A layer archive entry was rejected (path escape, symlink trick, bad hardlink, ...).
    #[error("invalid archive entry {entry:?}: {reason}")]
    InvalidEntry {
        /// The entry's path as written in the archive (lossily decoded).
        entry: String,
        /// Why it was rejected.
        reason: String,
    },
    /// The archive or image metadata is malformed (not tied to one layer entry).
    #[error("invalid {what}: {reason}")]
    InvalidArchive {
        /// What was malformed (`index.json`, `manifest.json`, `layer 2/3`, ...).
        what: String,
        /// How.
        reason: String,
    },
    /// A tar or gzip stream could not be parsed (corrupt or truncated data).
    #[error("corrupt or truncated {what}")]
    Corrupt {
        /// The stream.
        what: String,
        /// The parser's error.
        #[source]
        source: io::Error,
    },
    /// A layer uses a compression or media type this importer does not handle.
    #[error("unsupported layer media type {media_type}: {reason}")]
    UnsupportedMediaType {
        /// The media type (or the detected compression).
        media_type: String,
        /// Details.
        reason: String,
    },
    /// Content does not hash to the digest that references it.
    #[error("digest mismatch for {what}: expected {expected}, got {actual}")]
    DigestMismatch {
        /// The checked object (blob, layer, config).
        what: String,
        /// The digest the metadata promised.
        expected: String,
        /// The digest of the content.
        actual: String,
    },
    /// Content does not have the size its descriptor states.
    #[error("size mismatch for {what}: expected {expected} bytes, got {actual}")]
    SizeMismatch {
        /// The checked object.
        what: String,
        /// The size the descriptor promised.
        expected: u64,
        /// The actual size.
        actual: u64,
    },
    /// The unpacked content exceeds [`crate::ImportOptions::max_unpacked_bytes`].
    #[error("{what} exceeds the unpacked size limit of {limit} bytes")]
    TooLarge {
        /// What grew too large.
        what: String,
        /// The limit.
        limit: u64,
    },
    /// JSON metadata could not be parsed.
    #[error("invalid JSON in {what}")]
    Json {
        /// The document.
        what: String,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// OCI metadata could not be parsed or built.
    #[error("invalid OCI {what}")]
    Oci {
        /// The document.
        what: String,
        /// The cause.
        #[source]
        source: oci_spec::OciSpecError,
    },
    /// The source (a path the caller named, or a file inside it) could not be read.
    #[error("cannot read image source {path}")]
    Source {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// An I/O error on our side (layer store, temporary files, output files).
    #[error("I/O error on {path}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The layer store failed.
    #[error("layer store error")]
    Store(#[from] LayerStoreError),
}

impl ImageError {
    /// Whether the error is the caller's fault: a hostile, malformed, unsupported
    /// or unreadable source (HTTP 400 `invalid_archive`) rather than a failure
    /// of ours (HTTP 500).
    pub fn is_invalid_input(&self) -> bool {
        match self {
            ImageError::UnsupportedSource { .. }
            | ImageError::InvalidEntry { .. }
            | ImageError::InvalidArchive { .. }
            | ImageError::Corrupt { .. }
            | ImageError::UnsupportedMediaType { .. }
            | ImageError::DigestMismatch { .. }
            | ImageError::SizeMismatch { .. }
            | ImageError::TooLarge { .. }
            | ImageError::Json { .. }
            | ImageError::Oci { .. }
            | ImageError::Source { .. } => true,
            ImageError::Io { .. } | ImageError::Store(_) => false,
        }
    }

    pub(crate) fn entry(entry: impl Into<String>, reason: impl Into<String>) -> Self {
        ImageError::InvalidEntry { entry: entry.into(), reason: reason.into() }
    }

    pub(crate) fn archive(what: impl Into<String>, reason: impl Into<String>) -> Self {
        ImageError::InvalidArchive { what: what.into(), reason: reason.into() }
    }
}

/// `map_err` helper for our own I/O.
pub(crate) fn io_err(path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> ImageError {
    let path = path.into();
    move |source| ImageError::Io { path, source }
}

/// `map_err` helper for reading the caller's source.
pub(crate) fn src_err(path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> ImageError {
    let path = path.into();
    move |source| ImageError::Source { path, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_entry_names_the_entry() {
        let e = ImageError::entry("../escape", "path contains `..`");
        assert!(e.to_string().contains("../escape"));
        assert!(e.is_invalid_input());
        let io = ImageError::Io { path: "/x".into(), source: io::Error::other("boom") };
        assert!(!io.is_invalid_input());
    }
}
