//! `docker save` archives: import and a writer for test images.
//!
//! The archive is never extracted ([`TarArchive`]): the few members the
//! import needs (`manifest.json`, the config, the layers) are read in place.
//! Flavours: Docker's legacy one (`<id>/layer.tar`, `<hex>.json`), the one
//! podman and skopeo write (`<hex>.tar` layers, `<id>/layer.tar` symlinks to
//! them, read-only members, `manifest.json` last) and Docker >= 25's
//! (an OCI layout whose `manifest.json` names `blobs/sha256/<hex>` members).

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use flate2::read::MultiGzDecoder;
use serde::{Deserialize, Serialize};
use strata_api::ImageConfig;
use tracing::{debug, info};

use crate::archive::{key_of, TarArchive};
use crate::config;
use crate::error::{io_err, src_err, ImageError};
use crate::hash::{sha256_digest, HashingReader};
use crate::unpack::{sniff_compression, Compression};
use crate::Session;

/// One image of a `docker save` `manifest.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ManifestEntry {
    /// Archive path of the image config.
    #[serde(rename = "Config")]
    pub config: String,
    /// `repo:tag` names.
    #[serde(rename = "RepoTags", default)]
    pub repo_tags: Option<Vec<String>>,
    /// Archive paths of the layer tars, bottom first.
    #[serde(rename = "Layers")]
    pub layers: Vec<String>,
}

const WHAT: &str = "docker archive";

/// What a member's name promises about its content.
#[derive(Debug, PartialEq, Eq)]
enum NameDigest {
    /// Nothing (`<id>/layer.tar`: a docker layer id, not a content digest).
    None,
    /// The sha256 of the member's bytes (`<hex>.json`, `blobs/sha256/<hex>`).
    Blob(String),
    /// The sha256 of its bytes or, for a compressed layer, of its
    /// uncompressed tar (`<hex>.tar`, as podman and skopeo write layers).
    BlobOrDiffId(String),
}

/// The sha256 digest a member's name promises, if any.
fn digest_from_name(name: &str) -> NameDigest {
    let Ok(key) = key_of(name.as_bytes()) else { return NameDigest::None };
    let digest = |hex: &str| {
        let digest = format!("sha256:{hex}");
        let valid = strata_store::layers::digest_hex(&digest).is_ok();
        valid.then_some(digest)
    };
    if let Some(d) = key.strip_prefix("blobs/sha256/").or_else(|| key.strip_suffix(".json")).and_then(digest) {
        NameDigest::Blob(d)
    } else if let Some(d) = key.strip_suffix(".tar").and_then(digest) {
        NameDigest::BlobOrDiffId(d)
    } else {
        NameDigest::None
    }
}

/// Imports a `docker save` archive (plain or gzip), read in place.
///
/// The image is the one `manifest.json` describes (its first entry when it
/// lists several, with a warning naming them); an `index.json` beside it
/// (Docker >= 25) is ignored.
pub(crate) fn import(src: &Path, session: &mut Session<'_>) -> Result<ImageConfig, ImageError> {
    let staging = session.store.root().join("staging");
    let archive = TarArchive::open(src, &staging, session.opts.max_unpacked_bytes, WHAT)?;
    let manifest_bytes = archive.read_small("manifest.json")?;
    let manifest: Vec<ManifestEntry> = serde_json::from_slice(&manifest_bytes)
        .map_err(|source| ImageError::Json { what: "manifest.json".into(), source })?;
    let entry = match manifest.as_slice() {
        [] => return Err(ImageError::archive("manifest.json", "lists no images")),
        [one] => one,
        [first, ..] => {
            let tags = |e: &ManifestEntry| match e.repo_tags.as_deref() {
                Some(tags) if !tags.is_empty() => tags.join(", "),
                _ => format!("untagged, config {}", e.config),
            };
            let all: Vec<String> = manifest.iter().map(tags).collect();
            let note = format!(
                "archive holds {} images ({}); imported the first ({})",
                manifest.len(),
                all.join("; "),
                tags(first)
            );
            info!(src = %src.display(), "{note}");
            session.warnings.push(note);
            first
        }
    };
    debug!(config = %entry.config, layers = entry.layers.len(), tags = ?entry.repo_tags, "docker manifest");

    let config_bytes = archive.read_small(&entry.config)?;
    if let NameDigest::Blob(expected) | NameDigest::BlobOrDiffId(expected) = digest_from_name(&entry.config) {
        let actual = sha256_digest(&config_bytes);
        if actual != expected {
            return Err(ImageError::DigestMismatch { what: format!("config {}", entry.config), expected, actual });
        }
    }
    let what = format!("config {}", entry.config);
    let image_config = config::parse(&config_bytes, &what)?;
    config::check(&image_config, &what, &mut session.warnings)?;
    let diff_ids = image_config.rootfs().diff_ids();
    if diff_ids.len() != entry.layers.len() {
        return Err(ImageError::archive(
            WHAT,
            format!("manifest lists {} layers but the config has {} diff_ids", entry.layers.len(), diff_ids.len()),
        ));
    }

    let mut total = 0u64;
    for layer in &entry.layers {
        total += archive.resolve(layer)?.1;
    }
    session.set_total(total);
    let count = entry.layers.len();
    for (i, (layer, diff_id)) in entry.layers.iter().zip(diff_ids).enumerate() {
        session.begin_layer(i, count, diff_id);
        let what = format!("layer {}/{count} ({layer})", i + 1);
        let (reader, size) = archive.open_member(layer)?;
        let mut blob = HashingReader::new(reader);
        let staged = session.stage(&mut blob, None, &what)?;
        blob.drain(u64::MAX).map_err(|source| ImageError::Corrupt { what: what.clone(), source })?;
        let (blob_digest, _) = blob.finish();
        match digest_from_name(layer) {
            NameDigest::Blob(expected) if blob_digest != expected => {
                return Err(ImageError::DigestMismatch { what: format!("{what} blob"), expected, actual: blob_digest });
            }
            NameDigest::BlobOrDiffId(expected) if blob_digest != expected && staged.digest() != expected => {
                return Err(ImageError::DigestMismatch {
                    what: format!("{what} (named by its digest)"),
                    expected,
                    actual: blob_digest,
                });
            }
            _ => {}
        }
        if staged.digest() != diff_id {
            return Err(ImageError::DigestMismatch {
                what: format!("{what} (uncompressed content vs. diff_id)"),
                expected: diff_id.clone(),
                actual: staged.digest().to_string(),
            });
        }
        session.commit(staged, size)?;
    }
    Ok(config::map(&image_config))
}

/// Decompresses (if gzip) `rootfs_tar` into `out`; returns the diff id and size.
pub(crate) fn copy_uncompressed(rootfs_tar: &Path, out: &mut impl Write) -> Result<(String, u64), ImageError> {
    let mut file = File::open(rootfs_tar).map_err(src_err(rootfs_tar))?;
    let mut head = Vec::with_capacity(6);
    (&mut file).take(6).read_to_end(&mut head).map_err(src_err(rootfs_tar))?;
    file.seek(SeekFrom::Start(0)).map_err(src_err(rootfs_tar))?;
    let reader: Box<dyn Read> = match sniff_compression(&head) {
        Compression::None => Box::new(BufReader::new(file)),
        Compression::Gzip => Box::new(MultiGzDecoder::new(BufReader::new(file))),
        Compression::Unsupported(name) => {
            return Err(ImageError::UnsupportedSource {
                path: rootfs_tar.to_path_buf(),
                reason: format!("{name}-compressed tarballs are not supported"),
            })
        }
    };
    let mut hashing = HashingReader::new(reader);
    io::copy(&mut hashing, out).map_err(src_err(rootfs_tar))?;
    Ok(hashing.finish())
}

/// Writes a single-layer `docker save` archive (legacy layout:
/// `<id>/layer.tar`, `<config-hex>.json`, `manifest.json`, `repositories`)
/// from a rootfs tarball (plain or gzip), for tests and scripts. `repo_tag`
/// (`name:tag`) goes into `RepoTags`. The output is reproducible and replaced
/// atomically.
pub fn write_docker_archive(
    rootfs_tar: &Path,
    out_tar: &Path,
    config: &ImageConfig,
    repo_tag: Option<&str>,
) -> Result<(), ImageError> {
    let parent = match out_tar.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut layer = tempfile::tempfile_in(&parent).map_err(io_err(&parent))?;
    let (diff_id, layer_size) = {
        let mut w = BufWriter::new(&mut layer);
        let r = copy_uncompressed(rootfs_tar, &mut w)?;
        w.flush().map_err(io_err(&parent))?;
        r
    };
    layer.seek(SeekFrom::Start(0)).map_err(io_err(&parent))?;
    let layer_id = diff_id.trim_start_matches("sha256:").to_string();

    let image_config = config::build(config, &diff_id)?;
    let config_bytes =
        serde_json::to_vec(&image_config).map_err(|source| ImageError::Json { what: "image config".into(), source })?;
    let config_name = format!("{}.json", sha256_digest(&config_bytes).trim_start_matches("sha256:"));
    let layer_name = format!("{layer_id}/layer.tar");
    let manifest = vec![ManifestEntry {
        config: config_name.clone(),
        repo_tags: repo_tag.map(|t| vec![t.to_string()]),
        layers: vec![layer_name.clone()],
    }];
    let manifest_bytes =
        serde_json::to_vec(&manifest).map_err(|source| ImageError::Json { what: "manifest.json".into(), source })?;

    let tmp = tempfile::NamedTempFile::new_in(&parent).map_err(io_err(&parent))?;
    {
        let mut b = tar::Builder::new(BufWriter::new(tmp.as_file()));
        let io = io_err(out_tar);
        let result = (|| -> io::Result<()> {
            let mut dir = header(tar::EntryType::Directory, 0o755, 0);
            b.append_data(&mut dir, format!("{layer_id}/"), io::empty())?;
            b.append_data(&mut header(tar::EntryType::Regular, 0o644, 3), format!("{layer_id}/VERSION"), &b"1.0"[..])?;
            b.append_data(&mut header(tar::EntryType::Regular, 0o644, layer_size), &layer_name, &mut layer)?;
            let n = config_bytes.len() as u64;
            b.append_data(&mut header(tar::EntryType::Regular, 0o644, n), &config_name, &config_bytes[..])?;
            let n = manifest_bytes.len() as u64;
            b.append_data(&mut header(tar::EntryType::Regular, 0o644, n), "manifest.json", &manifest_bytes[..])?;
            if let Some(tag) = repo_tag {
                let (repo, tag) = split_repo_tag(tag);
                let repos = serde_json::json!({ repo: { tag: layer_id } }).to_string();
                let n = repos.len() as u64;
                b.append_data(&mut header(tar::EntryType::Regular, 0o644, n), "repositories", repos.as_bytes())?;
            }
            b.into_inner()?.flush()
        })();
        result.map_err(io)?;
    }
    tmp.as_file().sync_all().map_err(io_err(out_tar))?;
    tmp.persist(out_tar).map_err(|e| io_err(out_tar)(e.error))?;
    debug!(out = %out_tar.display(), %diff_id, "wrote docker archive");
    Ok(())
}

/// A reproducible member header (root-owned, mtime 0).
fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    h
}

/// Splits `repo:tag` (a `:` after the last `/`); the tag defaults to `latest`.
fn split_repo_tag(s: &str) -> (&str, &str) {
    match s.rfind(':') {
        Some(i) if !s[i..].contains('/') => (&s[..i], &s[i + 1..]),
        _ => (s, "latest"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_tags_split() {
        assert_eq!(split_repo_tag("busybox:1.36"), ("busybox", "1.36"));
        assert_eq!(split_repo_tag("localhost:5000/busybox"), ("localhost:5000/busybox", "latest"));
        assert_eq!(split_repo_tag("busybox"), ("busybox", "latest"));
    }

    #[test]
    fn digests_from_member_names() {
        let hex = "ab".repeat(32);
        let d = format!("sha256:{hex}");
        assert_eq!(digest_from_name(&format!("blobs/sha256/{hex}")), NameDigest::Blob(d.clone()));
        assert_eq!(digest_from_name(&format!("./{hex}.json")), NameDigest::Blob(d.clone()));
        assert_eq!(digest_from_name(&format!("{hex}.tar")), NameDigest::BlobOrDiffId(d));
        assert_eq!(digest_from_name(&format!("{hex}/layer.tar")), NameDigest::None);
        assert_eq!(digest_from_name("abc.tar"), NameDigest::None);
    }
}
