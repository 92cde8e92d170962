//! OCI image layouts (directories, and tars of them read in place): import, and a writer for test images.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::str::FromStr;

use flate2::write::GzEncoder;
use oci_spec::image::{
    Arch, Descriptor, Digest, DigestAlgorithm, ImageIndex, ImageIndexBuilder, ImageManifest, ImageManifestBuilder,
    MediaType, OciLayout, Os, PlatformBuilder,
};
use strata_api::ImageConfig;
use tracing::debug;

use crate::archive::TarArchive;
use crate::config::{self, MAX_JSON_BYTES};
use crate::error::{io_err, src_err, ImageError};
use crate::hash::{sha256_digest, HashingReader, HashingWriter};
use crate::Session;

const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const DOCKER_MANIFEST_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
const DOCKER_LAYER_TAR: &str = "application/vnd.docker.image.rootfs.diff.tar";
const DOCKER_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
const DOCKER_FOREIGN_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip";
/// Nested indexes followed at most this deep.
const MAX_INDEX_DEPTH: usize = 4;

pub(crate) fn is_manifest(mt: &MediaType) -> bool {
    *mt == MediaType::ImageManifest || mt.as_ref() == DOCKER_MANIFEST
}

pub(crate) fn is_index(mt: &MediaType) -> bool {
    *mt == MediaType::ImageIndex || mt.as_ref() == DOCKER_MANIFEST_LIST
}

/// Accepts uncompressed and gzip layers; names the problem otherwise.
pub(crate) fn check_layer_media_type(mt: &MediaType) -> Result<(), ImageError> {
    let unsupported =
        |reason: &str| ImageError::UnsupportedMediaType { media_type: mt.to_string(), reason: reason.into() };
    match mt {
        MediaType::ImageLayer
        | MediaType::ImageLayerGzip
        | MediaType::ImageLayerNonDistributable
        | MediaType::ImageLayerNonDistributableGzip => Ok(()),
        MediaType::ImageLayerZstd | MediaType::ImageLayerNonDistributableZstd => {
            Err(unsupported("zstd-compressed layers are not supported"))
        }
        MediaType::Other(s)
            if [DOCKER_LAYER_TAR, DOCKER_LAYER_GZIP, DOCKER_FOREIGN_LAYER_GZIP].contains(&s.as_str()) =>
        {
            Ok(())
        }
        MediaType::Other(s) if s.contains("zstd") => Err(unsupported("zstd-compressed layers are not supported")),
        _ => Err(unsupported("not a tar or gzip-compressed tar layer")),
    }
}

/// Where an OCI image layout's files are: a directory, or a tar of one (an
/// `oci-archive`) read in place.
enum Layout<'a> {
    /// A layout directory.
    Dir(&'a Path),
    /// A tar of a layout.
    Archive(&'a TarArchive),
}

impl Layout<'_> {
    /// What the layout is, for messages.
    fn what(&self) -> &'static str {
        match self {
            Layout::Dir(_) => "OCI layout",
            Layout::Archive(_) => "OCI archive",
        }
    }

    /// Opens blob `digest` (in a directory: a regular file, not a symlink;
    /// in an archive: a member, links followed inside the archive); returns
    /// it and its size.
    fn open_blob(&self, digest: &Digest) -> Result<(Box<dyn Read + '_>, u64), ImageError> {
        let what = self.what();
        if *digest.algorithm() != DigestAlgorithm::Sha256 {
            return Err(ImageError::archive(
                what,
                format!("blob {digest}: unsupported digest algorithm {}", digest.algorithm()),
            ));
        }
        let missing = || ImageError::archive(what, format!("blob {digest} is missing"));
        match self {
            Layout::Dir(root) => {
                // oci-spec guarantees 64 lowercase hex digits for sha256: a safe file name.
                let path = root.join("blobs").join("sha256").join(digest.digest());
                let file =
                    File::options().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(&path).map_err(
                        |e| match e.raw_os_error() {
                            Some(libc::ENOENT) => missing(),
                            Some(libc::ELOOP) => ImageError::archive(what, format!("blob {digest} is a symlink")),
                            _ => src_err(&path)(e),
                        },
                    )?;
                let md = file.metadata().map_err(src_err(&path))?;
                if !md.is_file() {
                    return Err(ImageError::archive(what, format!("blob {digest} is not a regular file")));
                }
                Ok((Box::new(file), md.len()))
            }
            Layout::Archive(archive) => {
                let name = format!("blobs/sha256/{}", digest.digest());
                if !archive.has(&name) {
                    return Err(missing());
                }
                let (reader, len) = archive.open_member(&name)?;
                Ok((Box::new(reader), len))
            }
        }
    }

    /// Reads a small file of the layout (`oci-layout`, `index.json`).
    fn read_small_file(&self, name: &str) -> Result<Vec<u8>, ImageError> {
        match self {
            Layout::Dir(root) => {
                let path = root.join(name);
                let file = File::open(&path).map_err(src_err(&path))?;
                let mut bytes = Vec::new();
                file.take(MAX_JSON_BYTES + 1).read_to_end(&mut bytes).map_err(src_err(&path))?;
                if bytes.len() as u64 > MAX_JSON_BYTES {
                    return Err(ImageError::archive(
                        path.display().to_string(),
                        format!("larger than {MAX_JSON_BYTES} bytes"),
                    ));
                }
                Ok(bytes)
            }
            Layout::Archive(archive) => archive.read_small(name),
        }
    }

    /// Reads a small blob, checking its size and digest against `desc`.
    fn read_json_blob(&self, desc: &Descriptor, what: &str) -> Result<Vec<u8>, ImageError> {
        if desc.size() > MAX_JSON_BYTES {
            return Err(ImageError::archive(what, format!("larger than {MAX_JSON_BYTES} bytes")));
        }
        let (reader, len) = self.open_blob(desc.digest())?;
        if len != desc.size() {
            return Err(ImageError::SizeMismatch { what: what.to_string(), expected: desc.size(), actual: len });
        }
        let mut bytes = Vec::with_capacity(len as usize);
        reader
            .take(len)
            .read_to_end(&mut bytes)
            .map_err(|source| ImageError::Corrupt { what: what.to_string(), source })?;
        let actual = sha256_digest(&bytes);
        if actual != desc.digest().as_ref() {
            return Err(ImageError::DigestMismatch {
                what: what.to_string(),
                expected: desc.digest().to_string(),
                actual,
            });
        }
        Ok(bytes)
    }
}

pub(crate) fn platform_of(desc: &Descriptor) -> String {
    match desc.platform() {
        Some(p) => match p.variant() {
            Some(v) => format!("{}/{}/{v}", p.os(), p.architecture()),
            None => format!("{}/{}", p.os(), p.architecture()),
        },
        None => "unspecified".into(),
    }
}

/// The `org.opencontainers.image.ref.name` annotation of an index entry (its tag).
fn ref_name(d: &Descriptor) -> Option<&str> {
    d.annotations().as_ref()?.get("org.opencontainers.image.ref.name").map(String::as_str)
}

/// How an image index's entry was chosen (shared by layout import and registry pull).
pub(crate) enum Choice<'a> {
    /// The index lists no image.
    Empty,
    /// The only image, or the one for linux and the host architecture.
    One(&'a Descriptor),
    /// Several images without platforms: the first (of this many).
    FirstOfUnlabelled(&'a Descriptor, usize),
    /// Several images, none for this host.
    NoMatch {
        /// The host architecture.
        host: Arch,
        /// What the index offers.
        available: Vec<String>,
    },
}

/// Picks the image of an index: the only one, else the one for linux and the
/// host architecture; attestation manifests are ignored.
pub(crate) fn choose_manifest(manifests: &[Descriptor]) -> Choice<'_> {
    let is_attestation = |d: &Descriptor| {
        d.annotations()
            .as_ref()
            .and_then(|a| a.get("vnd.docker.reference.type"))
            .is_some_and(|t| t == "attestation-manifest")
            || d.platform().as_ref().is_some_and(|p| p.os().to_string() == "unknown")
    };
    let candidates: Vec<&Descriptor> = manifests
        .iter()
        .filter(|d| is_manifest(d.media_type()) || is_index(d.media_type()))
        .filter(|d| !is_attestation(d))
        .collect();
    let host = Arch::default();
    match candidates.as_slice() {
        [] => Choice::Empty,
        [one] => Choice::One(one),
        many => {
            if let Some(d) = many
                .iter()
                .find(|d| d.platform().as_ref().is_some_and(|p| *p.os() == Os::Linux && *p.architecture() == host))
            {
                Choice::One(d)
            } else if many.iter().all(|d| d.platform().is_none()) {
                Choice::FirstOfUnlabelled(many[0], many.len())
            } else {
                Choice::NoMatch { host, available: many.iter().map(|d| platform_of(d)).collect() }
            }
        }
    }
}

/// Picks the image manifest to import among `manifests` (following nested
/// indexes): the only one, else the one for linux and the host architecture
/// (linux/amd64 on x86-64). Attestation manifests are ignored.
fn select_manifest(
    src: &Path,
    layout: &Layout<'_>,
    manifests: &[Descriptor],
    warnings: &mut Vec<String>,
    depth: usize,
) -> Result<Descriptor, ImageError> {
    let chosen = match choose_manifest(manifests) {
        Choice::Empty => return Err(ImageError::archive("index", "lists no image manifests")),
        Choice::One(d) => {
            // Several names at the top: several images (platforms of one image share a name or have none).
            let mut names: Vec<&str> = Vec::new();
            for name in manifests.iter().filter_map(ref_name) {
                if !names.contains(&name) {
                    names.push(name);
                }
            }
            if depth == 0 && names.len() > 1 {
                let name = ref_name(d).map_or_else(|| d.digest().to_string(), str::to_string);
                warnings.push(format!(
                    "index lists {} images ({}); imported {name}, the first for linux/{}",
                    names.len(),
                    names.join(", "),
                    Arch::default()
                ));
            }
            d
        }
        Choice::FirstOfUnlabelled(d, n) => {
            let name = ref_name(d).map_or_else(|| d.digest().to_string(), str::to_string);
            warnings.push(format!("index lists {n} images; imported the first ({name})"));
            d
        }
        Choice::NoMatch { host, available } => {
            return Err(ImageError::UnsupportedSource {
                path: src.to_path_buf(),
                reason: format!("no image for linux/{host} (available: {})", available.join(", ")),
            });
        }
    };
    debug!(digest = %chosen.digest(), platform = %platform_of(chosen), depth, "selected manifest");
    if is_index(chosen.media_type()) {
        if depth >= MAX_INDEX_DEPTH {
            return Err(ImageError::archive("index", format!("nested deeper than {MAX_INDEX_DEPTH} levels")));
        }
        let what = format!("index {}", chosen.digest());
        let bytes = layout.read_json_blob(chosen, &what)?;
        let nested = ImageIndex::from_reader(&bytes[..]).map_err(|source| ImageError::Oci { what, source })?;
        return select_manifest(src, layout, nested.manifests(), warnings, depth + 1);
    }
    Ok(chosen.clone())
}

/// Imports an OCI image layout directory.
pub(crate) fn import(src: &Path, session: &mut Session<'_>) -> Result<ImageConfig, ImageError> {
    import_layout(src, &Layout::Dir(src), session)
}

/// Imports a tar of an OCI image layout (`oci-archive`, plain or gzip), read
/// in place like a `docker save` archive.
pub(crate) fn import_archive(src: &Path, session: &mut Session<'_>) -> Result<ImageConfig, ImageError> {
    let staging = session.store.root().join("staging");
    let archive = TarArchive::open(src, &staging, session.opts.max_unpacked_bytes, "OCI archive")?;
    import_layout(src, &Layout::Archive(&archive), session)
}

/// Imports the image of `layout` (read from `src`).
fn import_layout(src: &Path, layout: &Layout<'_>, session: &mut Session<'_>) -> Result<ImageConfig, ImageError> {
    let layout_bytes = layout.read_small_file("oci-layout")?;
    let oci_layout = OciLayout::from_reader(&layout_bytes[..])
        .map_err(|source| ImageError::Oci { what: "oci-layout file".into(), source })?;
    if !oci_layout.image_layout_version().starts_with("1.") {
        return Err(ImageError::archive(
            "oci-layout file",
            format!("unsupported imageLayoutVersion {:?}", oci_layout.image_layout_version()),
        ));
    }
    let index_bytes = layout.read_small_file("index.json")?;
    let index = ImageIndex::from_reader(&index_bytes[..])
        .map_err(|source| ImageError::Oci { what: "index.json".into(), source })?;
    let manifest_desc = select_manifest(src, layout, index.manifests(), &mut session.warnings, 0)?;

    let what = format!("manifest {}", manifest_desc.digest());
    let manifest_bytes = layout.read_json_blob(&manifest_desc, &what)?;
    let manifest = ImageManifest::from_reader(&manifest_bytes[..])
        .map_err(|source| ImageError::Oci { what: what.clone(), source })?;
    if let Some(mt) = manifest.media_type() {
        if !is_manifest(mt) {
            return Err(ImageError::archive(what, format!("unexpected media type {mt}")));
        }
    }
    let config_desc = manifest.config();
    let mt = config_desc.media_type();
    if *mt != MediaType::ImageConfig && mt.as_ref() != DOCKER_CONFIG {
        return Err(ImageError::UnsupportedSource {
            path: src.to_path_buf(),
            reason: format!("not a container image (config media type {mt})"),
        });
    }
    let what = format!("config {}", config_desc.digest());
    let config_bytes = layout.read_json_blob(config_desc, &what)?;
    let image_config = config::parse(&config_bytes, &what)?;
    config::check(&image_config, &what, &mut session.warnings)?;
    let diff_ids = image_config.rootfs().diff_ids();
    let layers = manifest.layers();
    if diff_ids.len() != layers.len() {
        return Err(ImageError::archive(
            "OCI image",
            format!("manifest lists {} layers but the config has {} diff_ids", layers.len(), diff_ids.len()),
        ));
    }
    for layer in layers {
        check_layer_media_type(layer.media_type())?;
    }

    session.set_total(layers.iter().map(|l| l.size()).sum());
    let count = layers.len();
    for (i, (desc, diff_id)) in layers.iter().zip(diff_ids).enumerate() {
        session.begin_layer(i, count, diff_id);
        let what = format!("layer {}/{count} ({})", i + 1, desc.digest());
        let (reader, len) = layout.open_blob(desc.digest())?;
        if len != desc.size() {
            return Err(ImageError::SizeMismatch { what: format!("{what} blob"), expected: desc.size(), actual: len });
        }
        let mut blob = HashingReader::new(io::BufReader::with_capacity(256 * 1024, reader.take(len)));
        let staged = session.stage(&mut blob, None, &what)?;
        blob.drain(u64::MAX).map_err(|source| ImageError::Corrupt { what: what.clone(), source })?;
        let (blob_digest, _) = blob.finish();
        if blob_digest != desc.digest().as_ref() {
            return Err(ImageError::DigestMismatch {
                what: format!("{what} blob"),
                expected: desc.digest().to_string(),
                actual: blob_digest,
            });
        }
        if staged.digest() != diff_id {
            return Err(ImageError::DigestMismatch {
                what: format!("{what} (uncompressed content vs. diff_id)"),
                expected: diff_id.clone(),
                actual: staged.digest().to_string(),
            });
        }
        session.commit(staged, len)?;
    }
    Ok(config::map(&image_config))
}

fn oci_digest(s: &str) -> Result<Digest, ImageError> {
    Digest::from_str(s).map_err(|source| ImageError::Oci { what: format!("digest {s}"), source })
}

/// Writes `bytes` as a blob of the layout; returns its descriptor.
fn write_blob(blobs: &Path, media_type: MediaType, bytes: &[u8]) -> Result<Descriptor, ImageError> {
    let digest = sha256_digest(bytes);
    let path = blobs.join(digest.trim_start_matches("sha256:"));
    strata_store::fsutil::write_atomic(&path, bytes, 0o644).map_err(io_err(&path))?;
    Ok(Descriptor::new(media_type, bytes.len() as u64, oci_digest(&digest)?))
}

fn to_json<T: serde::Serialize>(v: &T, what: &str) -> Result<Vec<u8>, ImageError> {
    serde_json::to_vec(v).map_err(|source| ImageError::Json { what: what.into(), source })
}

/// Turns a rootfs tarball (plain or gzip) into a single-layer OCI image
/// layout at `out_dir` (created if needed): a gzip layer blob, the image
/// config (with `config`'s process defaults and the layer's diff id), the
/// manifest, and an `index.json` naming it `latest` for linux and the host
/// architecture. The output is reproducible (no timestamps).
pub fn write_oci_layout(rootfs_tar: &Path, out_dir: &Path, config: &ImageConfig) -> Result<(), ImageError> {
    let blobs = out_dir.join("blobs").join("sha256");
    fs::create_dir_all(&blobs).map_err(io_err(&blobs))?;

    // The layer: gzip the uncompressed tar, hashing both sides.
    let tmp = tempfile::NamedTempFile::new_in(&blobs).map_err(io_err(&blobs))?;
    let mut gz = GzEncoder::new(HashingWriter::new(BufWriter::new(tmp.as_file())), flate2::Compression::default());
    let (diff_id, _) = crate::docker::copy_uncompressed(rootfs_tar, &mut gz)?;
    let hashing = gz.finish().map_err(io_err(tmp.path()))?;
    let (blob_digest, blob_size, mut inner) = hashing.finish();
    inner.flush().map_err(io_err(tmp.path()))?;
    drop(inner);
    tmp.as_file().sync_all().map_err(io_err(tmp.path()))?;
    let blob_path = blobs.join(blob_digest.trim_start_matches("sha256:"));
    tmp.persist(&blob_path).map_err(|e| io_err(&blob_path)(e.error))?;
    let layer = Descriptor::new(MediaType::ImageLayerGzip, blob_size, oci_digest(&blob_digest)?);

    let image_config = config::build(config, &diff_id)?;
    let config_desc = write_blob(&blobs, MediaType::ImageConfig, &to_json(&image_config, "image config")?)?;

    let oci = |what: &str| {
        let what = what.to_string();
        move |source| ImageError::Oci { what, source }
    };
    let manifest = ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .config(config_desc)
        .layers(vec![layer])
        .build()
        .map_err(oci("manifest"))?;
    let mut manifest_desc = write_blob(&blobs, MediaType::ImageManifest, &to_json(&manifest, "manifest")?)?;
    let platform =
        PlatformBuilder::default().architecture(Arch::default()).os(Os::Linux).build().map_err(oci("platform"))?;
    manifest_desc.set_platform(Some(platform));
    manifest_desc.set_annotations(Some(HashMap::from([(
        "org.opencontainers.image.ref.name".to_string(),
        "latest".to_string(),
    )])));

    let index = ImageIndexBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageIndex)
        .manifests(vec![manifest_desc])
        .build()
        .map_err(oci("index"))?;
    let index_path = out_dir.join("index.json");
    strata_store::fsutil::write_atomic(&index_path, &to_json(&index, "index.json")?, 0o644)
        .map_err(io_err(&index_path))?;
    let layout_path = out_dir.join("oci-layout");
    strata_store::fsutil::write_atomic(&layout_path, br#"{"imageLayoutVersion":"1.0.0"}"#, 0o644)
        .map_err(io_err(&layout_path))?;
    debug!(out = %out_dir.display(), %diff_id, %blob_digest, "wrote OCI layout");
    Ok(())
}
