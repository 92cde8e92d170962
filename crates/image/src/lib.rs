//! Image import for strata: container images into the content-addressed
//! layer store, safely.
//!
//! Supported sources, recognised by inspecting their content ([`detect`]):
//!
//! * an OCI image layout directory (`oci-layout` + `index.json` + `blobs/`);
//! * an OCI archive: a tar of such a layout (`oci-archive`, as podman,
//!   buildah, skopeo and `docker buildx --output type=oci` write them),
//!   optionally gzipped, read in place;
//! * a `docker save` archive (a tar holding `manifest.json`: Docker's legacy
//!   flavour, podman's and skopeo's `docker-archive`, Docker >= 25's OCI
//!   flavour), optionally gzipped, read in place;
//! * a rootfs tarball (`.tar` or gzip-compressed): one layer;
//! * a rootfs directory: one layer, written as a deterministic tar first.
//!
//! A source with image metadata at its top (`manifest.json`, `index.json`,
//! `oci-layout`) that is not a valid image is rejected, never imported as a
//! rootfs.
//!
//! Every layer goes through [`unpack_layer`]'s hardened unpacker (see the
//! [`unpack`] module for the rules) into a staging directory of the
//! [`LayerStore`] and is committed under the sha256 of its uncompressed tar
//! and the unpack policy ([`ImportOptions::trusted`]): the same bytes imported
//! trusted and untrusted are two layers.
//! [`import`] is all-or-nothing: when it fails, the layers it added are
//! removed again.
//!
//! [`registry::fetch`] pulls an image from a registry into an OCI layout in
//! the store's staging area, which [`import`] then imports like any other.
//!
//! [`write_oci_layout`] and [`write_docker_archive`] build single-layer test
//! images from a rootfs tarball without any network access.

#![warn(missing_docs)]

use std::fmt;
use std::io::Read;
use std::path::Path;

use strata_api::ImageConfig;
use strata_store::LayerStore;
use tracing::{debug, warn};

mod archive;
pub mod changes;
pub mod chunk_pipe;
mod config;
mod detect;
mod docker;
mod error;
mod hash;
mod oci;
pub mod pace;
pub mod platform;
pub mod rebase;
pub mod registry;
mod rootfs;
pub mod squash;
mod sys;
pub mod unpack;

#[cfg(test)]
mod tests;

pub use detect::detect;
pub use docker::write_docker_archive;
pub use error::ImageError;
pub use oci::write_oci_layout;
pub use unpack::{stage_layer, unpack_layer, UnpackedLayer};

/// What an import source is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SourceKind {
    /// An OCI image layout directory.
    OciLayout,
    /// A tar of an OCI image layout (`oci-archive`).
    OciArchive,
    /// A `docker save` archive.
    DockerArchive,
    /// A rootfs tarball (plain or gzip).
    RootfsTar,
    /// A rootfs directory.
    RootfsDir,
}

impl SourceKind {
    /// The wire name: `oci-layout`, `oci-archive`, `docker-archive`, `rootfs-tar` or `rootfs-dir`.
    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::OciLayout => "oci-layout",
            SourceKind::OciArchive => "oci-archive",
            SourceKind::DockerArchive => "docker-archive",
            SourceKind::RootfsTar => "rootfs-tar",
            SourceKind::RootfsDir => "rootfs-dir",
        }
    }
}

impl fmt::Display for SourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Options of an import.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportOptions {
    /// Keep setuid/setgid bits and `security.capability` xattrs (only for
    /// sources you trust). Otherwise they are stripped with a warning.
    pub trusted: bool,
    /// Upper bound on the unpacked bytes of the whole image (all layers; for
    /// [`unpack_layer`], of that layer), and on a decompressed `docker save`
    /// archive; exceeding it fails the import. Default 64 GiB.
    pub max_unpacked_bytes: u64,
}

impl ImportOptions {
    /// The default size cap: 64 GiB.
    pub const DEFAULT_MAX_UNPACKED_BYTES: u64 = 64 << 30;
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions { trusted: false, max_unpacked_bytes: Self::DEFAULT_MAX_UNPACKED_BYTES }
    }
}

/// Progress of an import, reported through a callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress<'a> {
    /// Layer `index` (0-based) of `count` starts. `digest` is its expected
    /// diff id when the image metadata names it, empty for rootfs sources
    /// (whose digest is only known once unpacked).
    Layer {
        /// 0-based index, bottom layer first.
        index: usize,
        /// Number of layers.
        count: usize,
        /// Expected `sha256:<hex>` diff id, or empty.
        digest: &'a str,
    },
    /// Source bytes processed: for [`import`], layer data (as stored in the
    /// source, i.e. compressed when compressed) across all layers; for
    /// [`unpack_layer`], bytes consumed from its reader.
    Bytes {
        /// Bytes done.
        done: u64,
        /// Bytes in total, when known.
        total: Option<u64>,
    },
}

/// One layer of an import result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportedLayer {
    /// Its key in the store (`sha256:<hex>+<policy>`: the diff id and the
    /// unpack policy), which images, sandboxes and checkpoints reference.
    pub key: String,
    /// `sha256:<hex>` of the uncompressed layer tar (the OCI diff id).
    pub digest: String,
    /// Unpacked bytes (sum of regular file sizes).
    pub size: u64,
    /// `false` when the layer was already in the store (deduplicated: same
    /// bytes, same unpack policy).
    pub new: bool,
}

impl From<ImportedLayer> for strata_api::LayerInfo {
    fn from(l: ImportedLayer) -> Self {
        strata_api::LayerInfo { digest: l.key, size: l.size }
    }
}

/// The result of [`import`].
#[derive(Debug, Clone, PartialEq)]
pub struct Imported {
    /// What the source was.
    pub kind: SourceKind,
    /// The layers, bottom first.
    pub layers: Vec<ImportedLayer>,
    /// Process defaults from the image config (rootfs sources: a default `PATH`).
    pub config: ImageConfig,
    /// Entries changed or dropped for safety, and other notes.
    pub warnings: Vec<String>,
    /// Bytes newly written to the store (unpacked size of the new layers).
    pub bytes_stored: u64,
}

/// Imports the image at `src` into `store`.
///
/// All-or-nothing: on error, every layer this call added to the store is
/// removed again (layers that were already there are left alone), so the
/// caller has nothing to clean up.
pub fn import(
    src: &Path,
    store: &LayerStore,
    opts: &ImportOptions,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Imported, ImageError> {
    let probe = detect::probe(src)?;
    let kind = probe.kind;
    debug!(src = %src.display(), %kind, trusted = opts.trusted, "importing image");
    let mut session = Session::new(store, opts, progress);
    let config = match kind {
        SourceKind::OciLayout => oci::import(src, &mut session)?,
        SourceKind::OciArchive => oci::import_archive(src, &mut session)?,
        SourceKind::DockerArchive => docker::import(src, &mut session)?,
        SourceKind::RootfsTar => rootfs::import_tar(src, &mut session, probe.first_foreign.as_deref())?,
        SourceKind::RootfsDir => rootfs::import_dir(src, &mut session)?,
    };
    Ok(session.finish(kind, config))
}

/// State of one [`import`] call: progress accounting, warnings, and the
/// layers it added (removed again if the session is dropped unfinished).
pub(crate) struct Session<'a> {
    pub(crate) store: &'a LayerStore,
    pub(crate) opts: &'a ImportOptions,
    progress: &'a mut dyn FnMut(Progress<'_>),
    pub(crate) warnings: Vec<String>,
    layers: Vec<ImportedLayer>,
    added: Vec<String>,
    done: u64,
    total: Option<u64>,
    finished: bool,
}

impl<'a> Session<'a> {
    fn new(store: &'a LayerStore, opts: &'a ImportOptions, progress: &'a mut dyn FnMut(Progress<'_>)) -> Self {
        Session {
            store,
            opts,
            progress,
            warnings: Vec::new(),
            layers: Vec::new(),
            added: Vec::new(),
            done: 0,
            total: None,
            finished: false,
        }
    }

    /// Sets the total of the byte progress (sum of the layer inputs).
    pub(crate) fn set_total(&mut self, total: u64) {
        self.total = Some(total);
    }

    /// Reports that layer `index` of `count` starts.
    pub(crate) fn begin_layer(&mut self, index: usize, count: usize, digest: &str) {
        debug!(index, count, digest, "layer");
        (self.progress)(Progress::Layer { index, count, digest });
    }

    /// Unpacks a layer into staging (see [`stage_layer`]), reporting byte
    /// progress relative to the whole import.
    pub(crate) fn stage(
        &mut self,
        reader: impl Read,
        expected_diff_id: Option<&str>,
        what: &str,
    ) -> Result<UnpackedLayer, ImageError> {
        let (base, total) = (self.done, self.total);
        let progress = &mut *self.progress;
        let mut relay = |p: Progress<'_>| match p {
            Progress::Bytes { done, .. } => progress(Progress::Bytes { done: base + done, total }),
            other => progress(other),
        };
        let used = self.layers.iter().map(|l| l.size).sum();
        unpack::stage_layer_as(
            reader,
            self.store,
            self.opts,
            expected_diff_id,
            &mut self.warnings,
            &mut relay,
            what,
            used,
        )
    }

    /// Commits a staged layer; `input_bytes` is the size of its source data
    /// (advances the byte progress).
    pub(crate) fn commit(&mut self, layer: UnpackedLayer, input_bytes: u64) -> Result<(), ImageError> {
        let layer = layer.commit(self.store)?;
        if layer.new {
            self.added.push(layer.key.clone());
        }
        self.layers.push(layer);
        self.done += input_bytes;
        (self.progress)(Progress::Bytes { done: self.done, total: self.total });
        Ok(())
    }

    fn finish(mut self, kind: SourceKind, config: ImageConfig) -> Imported {
        self.finished = true;
        let bytes_stored = self.layers.iter().filter(|l| l.new).map(|l| l.size).sum();
        debug!(%kind, layers = self.layers.len(), bytes_stored, warnings = self.warnings.len(), "image imported");
        Imported {
            kind,
            layers: std::mem::take(&mut self.layers),
            config,
            warnings: std::mem::take(&mut self.warnings),
            bytes_stored,
        }
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        for digest in self.added.iter().rev() {
            debug!(%digest, "import failed: removing layer it added");
            if let Err(e) = self.store.remove(digest) {
                warn!(%digest, error = %e, "could not remove layer of a failed import");
            }
        }
    }
}
