//! `docker save` archives: import and a writer for test images.
//!
//! The archive is never extracted: its members are indexed by name (offsets
//! and sizes, found by seeking over the tar), and the few members the import
//! needs (`manifest.json`, the config, the layers) are read in place. Member
//! names are only ever used as lookup keys, never as file system paths.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use flate2::read::MultiGzDecoder;
use serde::{Deserialize, Serialize};
use strata_api::ImageConfig;
use tracing::debug;

use crate::config::{self, MAX_JSON_BYTES};
use crate::error::{io_err, src_err, ImageError};
use crate::hash::{sha256_digest, HashingReader};
use crate::unpack::{normalize_path, sniff_compression, Compression};
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

/// What an archive member is.
enum Member {
    File { offset: u64, size: u64 },
    Symlink(Vec<u8>),
    Hardlink(Vec<u8>),
}

/// Members of a tar archive by normalised name (later members win).
struct ArchiveIndex {
    members: HashMap<String, Member>,
}

const WHAT: &str = "docker archive";

fn key_of(raw: &[u8]) -> Result<String, String> {
    let comps = normalize_path(raw)?;
    let parts: Vec<_> = comps.iter().map(|c| String::from_utf8_lossy(c.to_bytes()).into_owned()).collect();
    Ok(parts.join("/"))
}

impl ArchiveIndex {
    fn build(file: &File) -> Result<Self, ImageError> {
        let corrupt = |source| ImageError::Corrupt { what: WHAT.into(), source };
        let mut members = HashMap::new();
        let mut file = file;
        file.seek(SeekFrom::Start(0)).map_err(io_err(WHAT))?;
        let mut ar = tar::Archive::new(file);
        for entry in ar.entries_with_seek().map_err(corrupt)? {
            let entry = entry.map_err(corrupt)?;
            let raw = entry.path_bytes();
            let key = match key_of(&raw) {
                Ok(k) => k,
                Err(reason) => {
                    debug!(member = %String::from_utf8_lossy(&raw), reason, "ignoring docker archive member");
                    continue;
                }
            };
            let link = || entry.link_name_bytes().map(|l| l.into_owned()).unwrap_or_default();
            let member = match entry.header().entry_type() {
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    Member::File { offset: entry.raw_file_position(), size: entry.size() }
                }
                tar::EntryType::Symlink => Member::Symlink(link()),
                tar::EntryType::Link => Member::Hardlink(link()),
                _ => continue,
            };
            members.insert(key, member);
        }
        debug!(members = members.len(), "indexed docker archive");
        Ok(ArchiveIndex { members })
    }

    /// Finds the data of member `name`, following links inside the archive.
    fn resolve(&self, name: &str) -> Result<(u64, u64), ImageError> {
        let bad = |reason: String| ImageError::archive(WHAT, format!("member {name:?}: {reason}"));
        let mut key = key_of(name.as_bytes()).map_err(bad)?;
        for _ in 0..16 {
            match self.members.get(&key) {
                None => return Err(bad(format!("{key:?} not found in the archive"))),
                Some(Member::File { offset, size }) => return Ok((*offset, *size)),
                Some(Member::Hardlink(target)) => key = key_of(target).map_err(bad)?,
                Some(Member::Symlink(target)) => {
                    // Relative to the link's directory, never above the archive root.
                    if target.starts_with(b"/") {
                        return Err(bad("absolute symlink".into()));
                    }
                    let mut parts: Vec<String> = key.split('/').map(str::to_string).collect();
                    parts.pop();
                    for comp in target.split(|b| *b == b'/') {
                        match comp {
                            b"" | b"." => {}
                            b".." => {
                                parts.pop().ok_or_else(|| bad("symlink points outside the archive".into()))?;
                            }
                            c => parts.push(String::from_utf8_lossy(c).into_owned()),
                        }
                    }
                    key = parts.join("/");
                }
            }
        }
        Err(bad("too many levels of links".into()))
    }

    /// A reader over member `name`'s data, and its size.
    fn open(&self, file: &File, name: &str) -> Result<(io::Take<File>, u64), ImageError> {
        let (offset, size) = self.resolve(name)?;
        let mut f = file.try_clone().map_err(io_err(WHAT))?;
        f.seek(SeekFrom::Start(offset)).map_err(io_err(WHAT))?;
        Ok((f.take(size), size))
    }

    /// Reads a small (JSON) member.
    fn read_small(&self, file: &File, name: &str) -> Result<Vec<u8>, ImageError> {
        let (mut r, size) = self.open(file, name)?;
        if size > MAX_JSON_BYTES {
            return Err(ImageError::archive(WHAT, format!("{name} is larger than {MAX_JSON_BYTES} bytes")));
        }
        let mut bytes = Vec::with_capacity(size as usize);
        r.read_to_end(&mut bytes)
            .map_err(|source| ImageError::Corrupt { what: format!("{WHAT} member {name}"), source })?;
        if bytes.len() as u64 != size {
            return Err(ImageError::archive(WHAT, format!("{name} is truncated")));
        }
        Ok(bytes)
    }
}

/// The sha256 digest a member's name promises (`<hex>.json`, `blobs/sha256/<hex>`), if any.
fn digest_from_name(name: &str) -> Option<String> {
    let key = key_of(name.as_bytes()).ok()?;
    let hex = key.strip_prefix("blobs/sha256/").or_else(|| key.strip_suffix(".json"))?;
    let digest = format!("sha256:{hex}");
    strata_store::layers::digest_hex(&digest).ok()?;
    Some(digest)
}

/// Imports a `docker save` archive (plain or gzip).
pub(crate) fn import(src: &Path, session: &mut Session<'_>) -> Result<ImageConfig, ImageError> {
    let mut file = File::open(src).map_err(src_err(src))?;
    let mut head = Vec::with_capacity(6);
    (&mut file).take(6).read_to_end(&mut head).map_err(src_err(src))?;
    file.seek(SeekFrom::Start(0)).map_err(src_err(src))?;

    // A gzipped archive is decompressed into a temporary file (inside the
    // store's staging directory, cleared on restart) to allow seeking.
    let _tmp;
    if let Compression::Gzip = sniff_compression(&head) {
        let staging = session.store.root().join("staging");
        let dir = tempfile::Builder::new().prefix(".docker-").tempdir_in(&staging).map_err(io_err(&staging))?;
        let path = dir.path().join("archive.tar");
        let mut out = File::options().read(true).write(true).create_new(true).open(&path).map_err(io_err(&path))?;
        let limit = session.opts.max_unpacked_bytes;
        let mut gz = MultiGzDecoder::new(BufReader::new(file)).take(limit.saturating_add(1));
        let n = io::copy(&mut gz, &mut out).map_err(|e| match e.kind() {
            io::ErrorKind::InvalidInput | io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof => {
                ImageError::Corrupt { what: WHAT.into(), source: e }
            }
            _ => io_err(&path)(e),
        })?;
        if n > limit {
            return Err(ImageError::TooLarge { what: "decompressed docker archive".into(), limit });
        }
        debug!(bytes = n, "decompressed docker archive");
        file = out;
        _tmp = dir;
    }

    let index = ArchiveIndex::build(&file)?;
    let manifest_bytes = index.read_small(&file, "manifest.json")?;
    let manifest: Vec<ManifestEntry> = serde_json::from_slice(&manifest_bytes)
        .map_err(|source| ImageError::Json { what: "manifest.json".into(), source })?;
    let entry = match manifest.as_slice() {
        [] => return Err(ImageError::archive("manifest.json", "lists no images")),
        [one] => one,
        [first, ..] => {
            session.warnings.push(format!(
                "archive holds {} images; imported the first ({})",
                manifest.len(),
                first.repo_tags.as_deref().unwrap_or_default().join(", ")
            ));
            first
        }
    };
    debug!(config = %entry.config, layers = entry.layers.len(), tags = ?entry.repo_tags, "docker manifest");

    let config_bytes = index.read_small(&file, &entry.config)?;
    if let Some(expected) = digest_from_name(&entry.config) {
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
        total += index.resolve(layer)?.1;
    }
    session.set_total(total);
    let count = entry.layers.len();
    for (i, (layer, diff_id)) in entry.layers.iter().zip(diff_ids).enumerate() {
        session.begin_layer(i, count, diff_id);
        let what = format!("layer {}/{count} ({layer})", i + 1);
        let (reader, size) = index.open(&file, layer)?;
        let mut blob = HashingReader::new(reader);
        let staged = session.stage(&mut blob, None, &what)?;
        blob.drain(u64::MAX).map_err(|source| ImageError::Corrupt { what: what.clone(), source })?;
        let (blob_digest, _) = blob.finish();
        if let Some(expected) = digest_from_name(layer) {
            if blob_digest != expected {
                return Err(ImageError::DigestMismatch { what: format!("{what} blob"), expected, actual: blob_digest });
            }
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
        assert_eq!(digest_from_name(&format!("blobs/sha256/{hex}")), Some(format!("sha256:{hex}")));
        assert_eq!(digest_from_name(&format!("./{hex}.json")), Some(format!("sha256:{hex}")));
        assert_eq!(digest_from_name(&format!("{hex}/layer.tar")), None);
    }
}
